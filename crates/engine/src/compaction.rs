//! Compaction and retention of the archive: a pure policy decides ([`choose`]), a worker
//! carries the choice out ([`Engine::compact`]).
//!
//! - **Drop**: a segment none of whose buckets any namespace still keeps (every namespace
//!   with that tier has let the whole period age out, or no namespace has the tier) goes.
//! - **Merge**: the segments of one period (a base and its deltas) become one base segment,
//!   summed, with whatever a removed tier's cutoff hides left out.
//!
//! Only segments whose every log record is before `wal_start` are merged: recovery never
//! needs their per-period log position again, so the merged segment can carry the largest.
//! Merging days into months is not done yet (see docs/ARCHITECTURE.md).
//!
//! Readers are never blocked: they keep the archive they started with (segments stay
//! readable through their open file even once removed), and the new archive is swapped in
//! under the archive's write lock like a flush's.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

use tally_core::model::Retention;
use tally_core::store::StoreError;

use crate::archive::{Archive, segment_path};
use crate::catalog::Cutoff;
use crate::engine::Engine;
use crate::manifest::{self, Manifest, SegmentEntry};
use crate::segment::{
    DimRecord, KeyRecord, Segment, SegmentError, SegmentKind, SegmentMeta, SegmentWriter,
};

/// What the policy decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Nothing,
    /// Remove these segments (by id): nothing in them is kept any more.
    Drop(Vec<u64>),
    /// Sum these segments (by id), all of one resolution and period, into one.
    Merge(Vec<u64>),
}

/// How long the namespaces keep one tier resolution, as the policy needs it: `None` when no
/// namespace has the tier, else the longest retention among those that do.
pub type Keeps<'a> = dyn Fn(u32) -> Option<Retention> + 'a;

/// Decides the next compaction step: drops first (they free the most for the least work),
/// then merges, oldest period first.
pub fn choose(segments: &[SegmentEntry], wal_start: u64, keeps: &Keeps<'_>, now: i64) -> Choice {
    // A bucket [b, b + r) is kept while b + r > now - retention (Retention::keeps_bucket),
    // so a period's last bucket, and the period, is gone once its end <= now - retention.
    let dead: Vec<u64> = segments
        .iter()
        .filter(|e| match keeps(e.resolution) {
            None => true,
            Some(Retention::Forever) => false,
            Some(Retention::For(d)) => e.period_end <= now.saturating_sub(d.secs_i64()),
        })
        .map(|e| e.id)
        .collect();
    if !dead.is_empty() {
        return Choice::Drop(dead);
    }
    let mut periods: BTreeMap<(i64, u32), Vec<&SegmentEntry>> = BTreeMap::new();
    for e in segments {
        periods
            .entry((e.period_start, e.resolution))
            .or_default()
            .push(e);
    }
    for group in periods.values() {
        if group.len() > 1 && group.iter().all(|e| e.flushed_seq < wal_start) {
            return Choice::Merge(group.iter().map(|e| e.id).collect());
        }
    }
    Choice::Nothing
}

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Segments removed because nothing in them is kept any more.
    pub dropped: usize,
    /// Segments summed into others.
    pub merged: usize,
    /// Segments written by merges.
    pub written: usize,
}

/// Buckets summed by index.
type Sums = BTreeMap<u32, i64>;

/// One key's record while inputs are summed into it.
#[derive(Default)]
struct Acc {
    totals: Sums,
    dims: BTreeMap<String, BTreeMap<String, Sums>>,
}

impl Acc {
    fn add(&mut self, rec: &KeyRecord, (totals, subtotals): (bool, bool)) {
        if totals {
            for (i, n) in &rec.totals {
                *self.totals.entry(*i).or_default() += n;
            }
        }
        if subtotals {
            for d in &rec.dims {
                let dim = self.dims.entry(d.dim.clone()).or_default();
                for (value, buckets) in &d.values {
                    let v = dim.entry(value.clone()).or_default();
                    for (i, n) in buckets {
                        *v.entry(*i).or_default() += n;
                    }
                }
            }
        }
    }

    /// The summed record, zeros left out; `None` if nothing is left.
    fn finish(self) -> Option<KeyRecord> {
        let nonzero =
            |s: Sums| -> Vec<(u32, i64)> { s.into_iter().filter(|(_, n)| *n != 0).collect() };
        let dims: Vec<DimRecord> = self
            .dims
            .into_iter()
            .filter_map(|(dim, values)| {
                let values: Vec<(String, Vec<(u32, i64)>)> = values
                    .into_iter()
                    .map(|(v, s)| (v, nonzero(s)))
                    .filter(|(_, b)| !b.is_empty())
                    .collect();
                (!values.is_empty()).then_some(DimRecord { dim, values })
            })
            .collect();
        let rec = KeyRecord {
            totals: nonzero(self.totals),
            dims,
        };
        (!rec.totals.is_empty() || !rec.dims.is_empty()).then_some(rec)
    }
}

fn seg_err(e: SegmentError) -> StoreError {
    crate::archive::store_error(e)
}

impl Engine {
    /// Compacts the archive until the policy has nothing left to do: segments past every
    /// namespace's retention are dropped, a period's base and deltas are merged.
    pub fn compact(&self) -> Result<CompactReport, StoreError> {
        let _one = self
            .flush_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        let mut report = CompactReport::default();
        // Each step removes at least one segment, so the archive's size bounds the loop.
        let steps = self.core.archive().segments.len();
        for _ in 0..steps {
            let old = Arc::clone(&self.core.archive());
            let keeps = self.retentions();
            let keeps = |r: u32| keeps.get(&r).copied();
            match choose(&old.manifest.segments, old.manifest.wal_start, &keeps, now) {
                Choice::Nothing => break,
                Choice::Drop(ids) => {
                    self.replace(&old, &ids, None)?;
                    report.dropped += ids.len();
                }
                Choice::Merge(ids) => {
                    let merged = self.merge(&old, &ids)?;
                    self.replace(&old, &ids, merged)?;
                    report.merged += ids.len();
                    report.written += 1;
                }
            }
        }
        Ok(report)
    }

    /// Per tier resolution, the longest retention any namespace keeps it for.
    fn retentions(&self) -> BTreeMap<u32, Retention> {
        let cat = self.core.read_cat();
        let mut out: BTreeMap<u32, Retention> = BTreeMap::new();
        for ns in &cat.ns {
            for t in ns.tiers.iter() {
                let r = t.res as u32;
                let longer = match (out.get(&r), t.retention) {
                    (None, x) => x,
                    (Some(Retention::Forever), _) | (_, Retention::Forever) => Retention::Forever,
                    (Some(Retention::For(a)), Retention::For(b)) => Retention::For((*a).max(b)),
                };
                out.insert(r, longer);
            }
        }
        out
    }

    /// Sums segments of one period into a new base segment (written and renamed into place,
    /// not yet published); `None` when nothing is left in them.
    fn merge(
        &self,
        old: &Archive,
        ids: &[u64],
    ) -> Result<Option<(SegmentEntry, Arc<Segment>)>, StoreError> {
        let inputs: Vec<&(SegmentEntry, Arc<Segment>)> = old
            .segments
            .iter()
            .filter(|(e, _)| ids.contains(&e.id))
            .collect();
        let Some((first, _)) = inputs.first() else {
            return Ok(None);
        };
        let cutoffs: BTreeMap<String, Cutoff> = {
            let cat = self.core.read_cat();
            cat.ns
                .iter()
                .map(|n| (n.name.as_str().to_owned(), n.cutoff(first.resolution)))
                .collect()
        };
        let mut acc: BTreeMap<(String, String), Acc> = BTreeMap::new();
        for (entry, seg) in &inputs {
            seg.scan_all(&mut |ns, key, rec| {
                let shows = cutoffs
                    .get(ns)
                    .copied()
                    .unwrap_or_default()
                    .shows(entry.flushed_seq);
                acc.entry((ns.to_owned(), key.to_owned()))
                    .or_default()
                    .add(rec, shows);
                Ok(())
            })
            .map_err(|e| self.core.archive_error(e))?;
        }
        let id = old.manifest.next_segment_id.max(1);
        let entry = SegmentEntry {
            id,
            delta: false,
            resolution: first.resolution,
            period_start: first.period_start,
            period_end: first.period_end,
            flushed_seq: inputs.iter().map(|(e, _)| e.flushed_seq).max().unwrap_or(0),
        };
        let path = segment_path(&self.segments_dir, id);
        let tmp = path.with_extension("tmp");
        let unavailable = |e| StoreError::unavailable("writing a merged segment").because(e);
        self.fs.remove(&tmp).map_err(unavailable)?;
        let meta = SegmentMeta {
            id,
            kind: SegmentKind::Base,
            resolution: entry.resolution,
            period_start: entry.period_start,
            period_end: entry.period_end,
        };
        let mut w = SegmentWriter::create(&tmp, meta).map_err(seg_err)?;
        let mut any = false;
        for ((ns, key), a) in acc {
            if let Some(rec) = a.finish() {
                w.add(&ns, &key, &rec).map_err(seg_err)?;
                any = true;
            }
        }
        w.finish().map_err(seg_err)?;
        if !any {
            self.fs.remove(&tmp).map_err(unavailable)?;
            return Ok(None);
        }
        self.fs.rename(&tmp, &path).map_err(unavailable)?;
        self.fs.sync_dir(&self.segments_dir).map_err(unavailable)?;
        let seg = Segment::open(&path).map_err(seg_err)?;
        Ok(Some((entry, Arc::new(seg))))
    }

    /// Publishes the archive without `remove` and with `add`, swaps it in, then deletes
    /// the removed files.
    fn replace(
        &self,
        old: &Archive,
        remove: &[u64],
        add: Option<(SegmentEntry, Arc<Segment>)>,
    ) -> Result<(), StoreError> {
        let unavailable = |e| StoreError::unavailable("publishing a compaction").because(e);
        let mut segments: Vec<(SegmentEntry, Arc<Segment>)> = old
            .segments
            .iter()
            .filter(|(e, _)| !remove.contains(&e.id))
            .cloned()
            .collect();
        let mut next = old.manifest.next_segment_id;
        if let Some((e, s)) = add {
            next = next.max(e.id + 1);
            segments.push((e, s));
        }
        let cutoffs = {
            let cat = self.core.read_cat();
            cat.ns
                .iter()
                .flat_map(|e| e.cutoffs.iter().map(|(r, c)| (e.name.clone(), *r, *c)))
                .collect()
        };
        let m = Manifest {
            number: old.manifest.number + 1,
            next_segment_id: next,
            segments: segments.iter().map(|(e, _)| *e).collect(),
            cutoffs,
            ..old.manifest.clone()
        };
        manifest::publish(&*self.fs, &self.dir, &m).map_err(unavailable)?;
        *self
            .core
            .archive
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(Archive::with(m.clone(), segments));
        // Best effort from here: what CURRENT no longer names is removed on the next open.
        let _ = self
            .fs
            .remove(&manifest::file_name(&self.dir, old.manifest.number));
        for id in remove {
            let _ = self.fs.remove(&segment_path(&self.segments_dir, *id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_core::model::Duration;

    fn seg(
        id: u64,
        resolution: u32,
        period_start: i64,
        len: i64,
        flushed_seq: u64,
    ) -> SegmentEntry {
        SegmentEntry {
            id,
            delta: id.is_multiple_of(2),
            resolution,
            period_start,
            period_end: period_start + len,
            flushed_seq,
        }
    }

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_795_132_800;

    #[test]
    fn the_policy_drops_then_merges_then_rests() {
        let two_days = Retention::For(Duration::from_secs(2 * DAY as u64).unwrap());
        let keeps = |r: u32| match r {
            60 => Some(two_days),
            3600 => Some(Retention::Forever),
            _ => None,
        };
        let table: Vec<(&str, Vec<SegmentEntry>, u64, Choice)> = vec![
            ("empty", vec![], 10, Choice::Nothing),
            (
                "one base per period: nothing to do",
                vec![
                    seg(1, 3600, NOW - 3 * DAY, DAY, 5),
                    seg(3, 3600, NOW - 2 * DAY, DAY, 6),
                ],
                10,
                Choice::Nothing,
            ),
            (
                "a base and a delta of one period, both before wal_start: merge",
                vec![
                    seg(1, 3600, NOW - 3 * DAY, DAY, 5),
                    seg(2, 3600, NOW - 3 * DAY, DAY, 8),
                ],
                10,
                Choice::Merge(vec![1, 2]),
            ),
            (
                "a delta recovery may still need (flushed at or after wal_start): wait",
                vec![
                    seg(1, 3600, NOW - 3 * DAY, DAY, 5),
                    seg(2, 3600, NOW - 3 * DAY, DAY, 10),
                ],
                10,
                Choice::Nothing,
            ),
            (
                "minute data past two days goes, even beside a merge",
                vec![
                    seg(1, 3600, NOW - 3 * DAY, DAY, 5),
                    seg(2, 3600, NOW - 3 * DAY, DAY, 8),
                    seg(5, 60, NOW - 3 * DAY, 3600, 5),
                    seg(7, 60, NOW - 2 * DAY - 3600, 3600, 5),
                    seg(9, 60, NOW - 2 * DAY - 1800, 3600, 5),
                ],
                10,
                Choice::Drop(vec![5, 7]),
            ),
            (
                "a resolution no namespace keeps any more goes",
                vec![seg(1, 900, NOW - 3 * DAY, 3600, 5)],
                10,
                Choice::Drop(vec![1]),
            ),
        ];
        for (what, segments, wal_start, want) in table {
            assert_eq!(choose(&segments, wal_start, &keeps, NOW), want, "{what}");
        }
    }
}

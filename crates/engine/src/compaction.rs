//! Compaction and retention of the archive: a pure policy decides ([`choose`]), a worker
//! carries the choice out ([`Engine::compact`]).
//!
//! - **Drop**: a segment none of whose buckets any namespace still keeps (every namespace
//!   with that tier has let the whole period age out, or no namespace has the tier) goes.
//! - **Merge**: the segments of one period (a base and its deltas) become one base segment,
//!   summed, with whatever a removed tier's cutoff hides left out.
//! - **Deltas**: [`DELTAS_MERGED_AT`] deltas of one exact period become one delta while
//!   recovery may still need them, so late traffic leaves a few segments a period, not one
//!   a flush.
//!
//! - **Months**: the day segments of an hourly (or coarser) tier in a UTC month over for a
//!   day become one month segment, so a long range reads one segment a month.
//! - **Days**: the hour segments of a finer tier in a UTC day over for an hour become one
//!   day segment: a `15m:1y` tier is then 365 files, not 8 760 (each an open file, with
//!   its index in memory).
//!
//! Only segments whose every log record is before `wal_start` are merged into a base, a day
//! or a month: recovery never needs their per-period log position again, so the merged
//! segment can carry the largest. Deltas of one exact period are the exception: recovery
//! looks up that period's largest position (`Archive::flushed_at`), which their merge keeps.
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

/// How long a compaction merge that failed is passed over before it is tried again, in
/// seconds: a new delta for its period makes it another merge, tried at once.
pub const MERGE_RETRY_SECS: i64 = 600;

/// How many deltas of one period the log still holds records of are summed into one: a
/// flush a minute leaves a delta per period it finds late events for, so without this a day
/// of late traffic would leave 1 440 segments a period for every read of it to open.
pub const DELTAS_MERGED_AT: usize = 4;

/// What the policy decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Nothing,
    /// Remove these segments (by id): nothing in them is kept any more.
    Drop(Vec<u64>),
    /// Sum these segments (by id), all of one resolution, into one segment of `period`:
    /// a period's base and deltas into a base of that period, or the days of a closed UTC
    /// month into one month.
    Merge {
        ids: Vec<u64>,
        period: (i64, i64),
    },
    /// Sum these deltas (by id), all of one resolution and exactly one period, into one
    /// delta of that period, flushed through the largest of theirs.
    MergeDeltas {
        ids: Vec<u64>,
        period: (i64, i64),
    },
}

/// How long the namespaces keep one tier resolution, as the policy needs it: `None` when no
/// namespace has the tier, else the longest retention among those that do.
pub type Keeps<'a> = dyn Fn(u32) -> Option<Retention> + 'a;

/// Decides the next compaction step: drops first (they free the most for the least work),
/// then merges, oldest period first.
pub fn choose(segments: &[SegmentEntry], wal_start: u64, keeps: &Keeps<'_>, now: i64) -> Choice {
    choose_avoiding(segments, wal_start, keeps, now, &|_| false)
}

/// As [`choose`], passing over every merge of exactly the segments `avoid` names (merges
/// that failed: the ones after them still get their turn).
pub fn choose_avoiding(
    segments: &[SegmentEntry],
    wal_start: u64,
    keeps: &Keeps<'_>,
    now: i64,
    avoid: &dyn Fn(&[u64]) -> bool,
) -> Choice {
    let merge = |group: &[&SegmentEntry], period: (i64, i64)| {
        let ids: Vec<u64> = group.iter().map(|e| e.id).collect();
        (group.len() > 1 && !avoid(&ids)).then_some(Choice::Merge { ids, period })
    };
    // A bucket [b, b + r) is kept while b + r > now - retention (Retention::keeps_bucket),
    // so a period's last bucket, and the period, is gone once its end <= now - retention.
    // A segment goes only with every segment of its resolution that overlaps it: a late
    // delta flushed as an hour inside a merged day (or a day inside a month) holds part of
    // buckets whose rest the longer segment holds, and a bucket is kept or dropped whole.
    let reach = |e: &SegmentEntry| {
        segments
            .iter()
            .filter(|o| {
                o.resolution == e.resolution
                    && o.period_start < e.period_end
                    && e.period_start < o.period_end
            })
            .map(|o| o.period_end)
            .fold(e.period_end, i64::max)
    };
    let dead: Vec<u64> = segments
        .iter()
        .filter(|e| match keeps(e.resolution) {
            None => true,
            Some(Retention::Forever) => false,
            // (Its own end first: only the few segments past it pay for the scan.)
            Some(Retention::For(d)) => {
                let cutoff = now.saturating_sub(d.secs_i64());
                e.period_end <= cutoff && reach(e) <= cutoff
            }
        })
        .map(|e| e.id)
        .collect();
    if !dead.is_empty() {
        return Choice::Drop(dead);
    }
    // Only segments whose every record is before wal_start: recovery never needs their
    // per-period log position again.
    let settled = |e: &&SegmentEntry| e.flushed_seq < wal_start;
    let mut periods: BTreeMap<(i64, u32), Vec<&SegmentEntry>> = BTreeMap::new();
    for e in segments.iter().filter(settled) {
        periods
            .entry((e.period_start, e.resolution))
            .or_default()
            .push(e);
    }
    for ((start, _), group) in &periods {
        let end = group.iter().map(|e| e.period_end).max().unwrap_or(*start);
        if let Some(c) = merge(group, (*start, end)) {
            return c;
        }
    }
    // Deltas of one exact period, settled or not: the merged delta carries their largest
    // flushed_seq, which is what recovery looks up for that period (a segment vouches for its
    // own period only, so deltas of other periods, even inside this one, stay apart).
    let mut deltas: BTreeMap<(u32, i64, i64), Vec<&SegmentEntry>> = BTreeMap::new();
    for e in segments.iter().filter(|e| e.delta) {
        deltas
            .entry((e.resolution, e.period_start, e.period_end))
            .or_default()
            .push(e);
    }
    for (&(_, start, end), group) in &deltas {
        let ids: Vec<u64> = group.iter().map(|e| e.id).collect();
        if ids.len() >= DELTAS_MERGED_AT && !avoid(&ids) {
            return Choice::MergeDeltas {
                ids,
                period: (start, end),
            };
        }
    }
    // Days of hourly (or coarser) tiers into months, once the month has been over for a day:
    // a long range then reads one segment a month instead of one a day.
    let mut months: BTreeMap<(i64, u32), Vec<&SegmentEntry>> = BTreeMap::new();
    for e in segments
        .iter()
        .filter(settled)
        .filter(|e| e.resolution >= 3600)
    {
        let (ms, me) = month_of(e.period_start);
        if e.period_end <= me && me + 86_400 <= now {
            months.entry((ms, e.resolution)).or_default().push(e);
        }
    }
    for ((ms, _), group) in &months {
        if let Some(c) = merge(group, month_of(*ms)) {
            return c;
        }
    }
    // Hours of finer tiers into UTC days, once the day has been over for an hour (their
    // flush horizon: late events after it are deltas, merged in turn).
    let mut days: BTreeMap<(i64, u32), Vec<&SegmentEntry>> = BTreeMap::new();
    for e in segments
        .iter()
        .filter(settled)
        .filter(|e| e.resolution < 3600)
    {
        let ds = e.period_start.div_euclid(86_400) * 86_400;
        if e.period_end <= ds + 86_400 && ds + 86_400 + 3600 <= now {
            days.entry((ds, e.resolution)).or_default().push(e);
        }
    }
    for ((ds, _), group) in &days {
        if let Some(c) = merge(group, (*ds, ds + 86_400)) {
            return c;
        }
    }
    Choice::Nothing
}

/// The UTC calendar month `[start, end)` holding instant `t` (unix seconds).
pub fn month_of(t: i64) -> (i64, i64) {
    let (y, m, _) = civil_from_days(t.div_euclid(86_400));
    let start = days_from_civil(y, m, 1) * 86_400;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (start, days_from_civil(ny, nm, 1) * 86_400)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400;
    (if m <= 2 { y + 1 } else { y }, m, d)
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

/// Buckets of several inputs, summed by index: sorted, equal indexes added, zeros left out.
fn summed(mut b: Vec<(u32, i64)>) -> Vec<(u32, i64)> {
    b.sort_unstable_by_key(|&(i, _)| i);
    let mut out: Vec<(u32, i64)> = Vec::with_capacity(b.len());
    for (i, n) in b {
        match out.last_mut() {
            Some(last) if last.0 == i => last.1 = last.1.wrapping_add(n),
            _ => out.push((i, n)),
        }
    }
    out.retain(|&(_, n)| n != 0);
    out
}

/// One key's records from several inputs (each already cut to what its cutoff shows)
/// summed into one, zeros left out; `None` if nothing is left. A key found in one input
/// only is its record as it is; otherwise names are moved, not copied, and buckets are
/// concatenated and sorted once rather than added one map entry at a time.
fn merge_records(mut recs: Vec<KeyRecord>) -> Option<KeyRecord> {
    let rec = if recs.len() == 1 {
        recs.pop()?
    } else {
        let mut totals = Vec::new();
        let mut dims: BTreeMap<String, BTreeMap<String, Vec<(u32, i64)>>> = BTreeMap::new();
        for r in recs {
            totals.extend(r.totals);
            for d in r.dims {
                let values = dims.entry(d.dim).or_default();
                for (value, buckets) in d.values {
                    values.entry(value).or_default().extend(buckets);
                }
            }
        }
        KeyRecord {
            totals: summed(totals),
            dims: dims
                .into_iter()
                .map(|(dim, values)| DimRecord {
                    dim,
                    values: values
                        .into_iter()
                        .map(|(v, b)| (v, summed(b)))
                        .filter(|(_, b)| !b.is_empty())
                        .collect(),
                })
                .filter(|d| !d.values.is_empty())
                .collect(),
        }
    };
    (!rec.totals.is_empty() || !rec.dims.is_empty()).then_some(rec)
}

fn seg_err(e: SegmentError) -> StoreError {
    crate::archive::store_error(e)
}

impl Engine {
    /// Compacts the archive until the policy has nothing left to do: segments past every
    /// namespace's retention are dropped, a period's base and deltas are merged.
    pub fn compact(&self) -> Result<CompactReport, StoreError> {
        let r = self.compact_now();
        if r.is_err() {
            self.failed_compactions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    fn compact_now(&self) -> Result<CompactReport, StoreError> {
        let _one = self
            .flush_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        let mut report = CompactReport::default();
        // A merge that fails is passed over, for this pass and until `MERGE_RETRY_SECS`
        // later (a merge that cannot succeed would read and write its segments every minute
        // in `tally serve`), so one period that cannot be merged holds up no other; the
        // first failure of the pass is reported once it is done.
        let mut failed: Vec<Vec<u64>> = {
            let mut earlier = self
                .failed_merges
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            earlier.retain(|(_, at)| now < at.saturating_add(MERGE_RETRY_SECS));
            earlier.iter().map(|(ids, _)| ids.clone()).collect()
        };
        let mut first_error = None;
        // Each step removes at least one segment or fails a merge of two or more, so the
        // archive's size bounds the loop.
        let steps = self.core.archive().segments.len();
        for _ in 0..2 * steps + 1 {
            // A poisoned log fails every publish (each syncs the log first): stop before
            // the work of another merge.
            if let Some(e) = self.wal.poisoned() {
                return Err(first_error.unwrap_or(e));
            }
            let old = Arc::clone(&self.core.archive());
            let keeps = self.retentions();
            let keeps = |r: u32| keeps.get(&r).copied();
            let avoid = |ids: &[u64]| failed.iter().any(|f| f == ids);
            let choice = choose_avoiding(
                &old.manifest.segments,
                old.manifest.wal_start,
                &keeps,
                now,
                &avoid,
            );
            let delta = matches!(choice, Choice::MergeDeltas { .. });
            match choice {
                Choice::Nothing => break,
                Choice::Drop(ids) => {
                    self.replace(&old, &ids, None)?;
                    report.dropped += ids.len();
                }
                Choice::Merge { ids, period } | Choice::MergeDeltas { ids, period } => {
                    let done = self
                        .merge(&old, &ids, period, delta)
                        .and_then(|merged| self.replace(&old, &ids, merged));
                    match done {
                        Ok(()) => {
                            report.merged += ids.len();
                            report.written += 1;
                        }
                        // Closed under it (the server is stopping): not a failure of the
                        // merge, nor one to pass over next time.
                        Err(e) if self.wal.is_closed() => return Err(e),
                        Err(e) => {
                            tracing::warn!(segments = ?ids, "a compaction merge failed (tried again in {MERGE_RETRY_SECS} s): {e}");
                            first_error.get_or_insert(e);
                            self.failed_merges
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push((ids.clone(), now));
                            failed.push(ids);
                        }
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
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

    /// Sums segments into a new base segment of `period` (written and renamed into place,
    /// not yet published); `None` when nothing is left in them. With `delta`, into a delta,
    /// kept even when nothing is left: its flushed_seq is what recovery looks up for the
    /// period, and without it recovery would add back what the log still holds of the
    /// deltas' increments (their sum is zero, but a cutoff may hide part of it). Keys are merged in order,
    /// one at a time, so memory holds one namespace's key list and one record, not the
    /// segments; each input's blocks are then read in order, once each (its block cache).
    fn merge(
        &self,
        old: &Archive,
        ids: &[u64],
        (period_start, period_end): (i64, i64),
        delta: bool,
    ) -> Result<Option<(SegmentEntry, Arc<Segment>)>, StoreError> {
        let inputs: Vec<&(SegmentEntry, Arc<Segment>)> = old
            .segments
            .iter()
            .filter(|(e, _)| ids.contains(&e.id))
            .collect();
        let Some((first, _)) = inputs.first() else {
            return Ok(None);
        };
        let resolution = first.resolution;
        let namespaces: BTreeMap<String, Cutoff> = {
            let cat = self.core.read_cat();
            cat.by_name
                .iter()
                .map(|(n, id)| {
                    (
                        n.as_str().to_owned(),
                        cat.ns[*id as usize].cutoff(resolution),
                    )
                })
                .collect()
        };
        let id = self.fresh.segment_after(&old.manifest);
        let entry = SegmentEntry {
            id,
            delta,
            resolution,
            period_start,
            period_end,
            flushed_seq: inputs.iter().map(|(e, _)| e.flushed_seq).max().unwrap_or(0),
        };
        let path = segment_path(&self.segments_dir, id);
        let tmp = path.with_extension("tmp");
        let unavailable = |e| StoreError::unavailable("writing a merged segment").because(e);
        self.fs.remove(&tmp).map_err(unavailable)?;
        let meta = SegmentMeta {
            id,
            kind: if delta {
                SegmentKind::Delta
            } else {
                SegmentKind::Base
            },
            resolution,
            period_start,
            period_end,
        };
        let damaged = |e| self.core.archive_error(e);
        // What the merge does not read must be whole too, or its damage leaves with the file.
        for (_, seg) in &inputs {
            seg.verify_frames().map_err(damaged)?;
        }
        let mut w = SegmentWriter::create(&tmp, meta).map_err(seg_err)?;
        let mut any = false;
        // A k-way merge: every input walked once in (namespace, key) order, the smallest
        // head taken with the heads equal to it.
        let mut inputs: Vec<(&SegmentEntry, crate::segment::Records<'_>)> =
            inputs.iter().map(|(e, seg)| (e, seg.records())).collect();
        let mut heads: Vec<Option<(String, String, u64)>> = Vec::new();
        for (_, r) in &mut inputs {
            heads.push(r.next_entry().map_err(damaged)?);
        }
        while let Some((ns, key)) = heads
            .iter()
            .flatten()
            .map(|(ns, key, _)| (ns, key))
            .min()
            .map(|(ns, key)| (ns.clone(), key.clone()))
        {
            let mut recs = Vec::new();
            for (i, (e, r)) in inputs.iter_mut().enumerate() {
                let at = match &heads[i] {
                    Some((n, k, at)) if *n == ns && *k == key => *at,
                    _ => continue,
                };
                heads[i] = r.next_entry().map_err(damaged)?;
                // A namespace the catalog no longer has is dropped, as is what a cutoff
                // hides: neither is decoded (a damaged block there stops nothing).
                let Some(cutoff) = namespaces.get(&ns) else {
                    continue;
                };
                let (totals, subtotals) = cutoff.shows(e.flushed_seq);
                if !totals && !subtotals {
                    continue;
                }
                let mut rec = r.record(at).map_err(damaged)?;
                if !totals {
                    rec.totals.clear();
                }
                if !subtotals {
                    rec.dims.clear();
                }
                recs.push(rec);
            }
            if let Some(rec) = merge_records(recs) {
                w.add_owned(&ns, &key, rec).map_err(seg_err)?;
                any = true;
            }
        }
        w.finish().map_err(seg_err)?;
        if !any && !delta {
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
        old: &Arc<Archive>,
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
        let mut next = self.fresh.segment_after(&old.manifest);
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
            number: self.fresh.number_after(&old.manifest),
            next_segment_id: next,
            segments: segments.iter().map(|(e, _)| *e).collect(),
            cutoffs,
            ..old.manifest.clone()
        };
        // The log first, as a flush does: the manifest's cutoffs, and the drops and merges
        // decided on the catalog, come from schema changes that must not be lost in a crash
        // the manifest survives (the archive would match no prefix of the log).
        self.wal.sync()?;
        self.fresh.use_up(&m);
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
        // A reader that still holds the old archive (or one of its segments) may read a
        // removed segment, whose descriptor may have been closed to stay within the bound
        // on open files: such a file is removed when its last holder drops it instead.
        let archive_held = Arc::strong_count(old) > 1;
        for id in remove {
            match old.all().find(|(e, _)| e.id == *id) {
                Some((_, seg)) if archive_held || Arc::strong_count(seg) > 1 => {
                    seg.remove_when_dropped();
                }
                _ => {
                    let _ = self.fs.remove(&segment_path(&self.segments_dir, *id));
                }
            }
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
                Choice::Merge {
                    ids: vec![1, 2],
                    period: (NOW - 3 * DAY, NOW - 2 * DAY),
                },
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
                // 7 is past retention, but 9 (kept) overlaps it: they share buckets, which
                // go whole, so 7 waits for 9.
                Choice::Drop(vec![5]),
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

    #[test]
    fn deltas_of_one_exact_period_merge_while_recovery_needs_them() {
        let keeps = |_: u32| Some(Retention::Forever);
        let d = NOW - 3 * DAY;
        // A base and three deltas flushed after wal_start (ids even: deltas).
        let mut segments = vec![seg(1, 3600, d, DAY, 5)];
        segments.extend((1..DELTAS_MERGED_AT as u64).map(|i| seg(2 * i, 3600, d, DAY, 10 + i)));
        assert_eq!(choose(&segments, 10, &keeps, NOW), Choice::Nothing);
        // One more: the deltas, not the base, become one delta.
        segments.push(seg(100, 3600, d, DAY, 20));
        let deltas: Vec<u64> = segments.iter().skip(1).map(|e| e.id).collect();
        assert_eq!(
            choose(&segments, 10, &keeps, NOW),
            Choice::MergeDeltas {
                ids: deltas.clone(),
                period: (d, d + DAY)
            }
        );
        let avoided = |ids: &[u64]| ids == deltas.as_slice();
        assert_eq!(
            choose_avoiding(&segments, 10, &keeps, NOW, &avoided),
            Choice::Nothing
        );
        // Once the log is cut past them all, base and deltas become one base instead.
        let mut all: Vec<u64> = vec![1];
        all.extend(&deltas);
        assert_eq!(
            choose(&segments, 21, &keeps, NOW),
            Choice::Merge {
                ids: all,
                period: (d, d + DAY)
            }
        );
        // Deltas of periods of other lengths, even at the same start, are not summed with
        // them: each vouches only for its own period.
        let mixed: Vec<SegmentEntry> = (1..=DELTAS_MERGED_AT as u64)
            .map(|i| seg(2 * i, 900, d, if i % 2 == 0 { DAY } else { 3600 }, 10 + i))
            .collect();
        assert_eq!(choose(&mixed, 10, &keeps, NOW), Choice::Nothing);
    }

    #[test]
    fn a_delta_inside_a_longer_segment_goes_only_with_it() {
        let two_days = Retention::For(Duration::from_secs(2 * DAY as u64).unwrap());
        let keeps = |_: u32| Some(two_days);
        // A day of 15-minute buckets merged into one segment, and a late delta flushed as
        // its last hour: past retention, the hour alone would go and leave its buckets'
        // base in the day.
        let day = NOW - 3 * DAY + 3600;
        let segments = vec![seg(1, 900, day, DAY, 5), seg(2, 900, day + 3600, 3600, 8)];
        assert_eq!(choose(&segments, 10, &keeps, NOW), Choice::Nothing);
        assert_eq!(
            choose(&segments, 10, &keeps, NOW + 3600),
            Choice::Drop(vec![1, 2])
        );
    }

    #[test]
    fn a_merge_to_avoid_is_passed_over_for_the_next() {
        let keeps = |_: u32| Some(Retention::Forever);
        let segments = vec![
            seg(1, 3600, NOW - 3 * DAY, DAY, 5),
            seg(2, 3600, NOW - 3 * DAY, DAY, 8),
            seg(3, 3600, NOW - 2 * DAY, DAY, 5),
            seg(4, 3600, NOW - 2 * DAY, DAY, 8),
        ];
        let first = |ids: &[u64]| ids == [1, 2];
        assert_eq!(
            choose_avoiding(&segments, 10, &keeps, NOW, &first),
            Choice::Merge {
                ids: vec![3, 4],
                period: (NOW - 2 * DAY, NOW - DAY),
            }
        );
        let both = |ids: &[u64]| ids == [1, 2] || ids == [3, 4];
        assert_eq!(
            choose_avoiding(&segments, 10, &keeps, NOW, &both),
            Choice::Nothing
        );
        // Another delta makes it another merge: tried again.
        let mut more = segments.clone();
        more.push(seg(5, 3600, NOW - 3 * DAY, DAY, 9));
        assert_eq!(
            choose_avoiding(&more, 10, &keeps, NOW, &both),
            Choice::Merge {
                ids: vec![1, 2, 5],
                period: (NOW - 3 * DAY, NOW - 2 * DAY),
            }
        );
        // Drops are never avoided.
        let keeps_a_day = |_: u32| Some(Retention::For(Duration::from_secs(DAY as u64).unwrap()));
        assert_eq!(
            choose_avoiding(&segments, 10, &keeps_a_day, NOW, &both),
            Choice::Drop(vec![1, 2, 3, 4])
        );
    }

    #[test]
    fn months_are_utc_calendar_months() {
        // 2026-11-20T00:00Z is in November 2026: 2026-11-01 .. 2026-12-01.
        assert_eq!(month_of(NOW), (1_793_491_200, 1_796_083_200));
        // February of a leap year, and a year's turn.
        assert_eq!(month_of(1_709_251_199), (1_706_745_600, 1_709_251_200));
        assert_eq!(month_of(1_767_225_599), (1_764_547_200, 1_767_225_600));
        assert_eq!(month_of(0), (0, 2_678_400));
        for t in (0..(1i64 << 32)).step_by(7_777_777) {
            let (a, b) = month_of(t);
            assert!(
                a <= t && t < b && (28..=31).contains(&((b - a) / DAY)),
                "{t}"
            );
            assert_eq!(month_of(b).0, b);
        }
    }

    #[test]
    fn the_days_of_a_closed_month_merge_into_it() {
        let keeps = |_: u32| Some(Retention::Forever);
        let (ms, me) = month_of(NOW - 40 * DAY);
        let days: Vec<SegmentEntry> = (0..3)
            .map(|i| seg(2 * i + 1, 3600, ms + i as i64 * DAY, DAY, 5))
            .collect();
        assert_eq!(
            choose(&days, 10, &keeps, NOW),
            Choice::Merge {
                ids: vec![1, 3, 5],
                period: (ms, me)
            }
        );
        // Not while recovery may still need one of them, nor while the month is recent.
        assert_eq!(choose(&days, 5, &keeps, NOW), Choice::Nothing);
        assert_eq!(choose(&days, 10, &keeps, me + 3600), Choice::Nothing);
    }

    #[test]
    fn the_hours_of_a_finer_tier_merge_into_their_day() {
        let keeps = |_: u32| Some(Retention::Forever);
        let d = NOW - 3 * DAY;
        let mut hours: Vec<SegmentEntry> = (0..24)
            .map(|i| seg(2 * i + 1, 900, d + i as i64 * 3600, 3600, 5))
            .collect();
        let all: Vec<u64> = hours.iter().map(|e| e.id).collect();
        assert_eq!(
            choose(&hours, 10, &keeps, NOW),
            Choice::Merge {
                ids: all.clone(),
                period: (d, d + DAY)
            }
        );
        // Not until the day has been over for an hour, nor while recovery needs one.
        assert_eq!(choose(&hours, 10, &keeps, d + DAY + 3599), Choice::Nothing);
        assert_eq!(choose(&hours, 5, &keeps, NOW), Choice::Nothing);
        // Once merged, a late hour's delta joins the day; the day alone rests.
        let day = vec![seg(101, 900, d, DAY, 5)];
        assert_eq!(choose(&day, 10, &keeps, NOW), Choice::Nothing);
        let late = vec![seg(101, 900, d, DAY, 5), seg(102, 900, d + 7200, 3600, 8)];
        assert_eq!(
            choose(&late, 10, &keeps, NOW),
            Choice::Merge {
                ids: vec![101, 102],
                period: (d, d + DAY)
            }
        );
        // Hourly tiers keep their day segments until the month (above).
        hours.iter_mut().for_each(|e| e.resolution = 3600);
        assert_ne!(
            choose(&hours, 10, &keeps, NOW),
            Choice::Merge {
                ids: all,
                period: (d, d + DAY)
            }
        );
    }
}

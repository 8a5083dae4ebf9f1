//! The archive as readers see it: the published segments, opened, with the per-period
//! bookkeeping that recovery needs (up to which log record a period is already archived).
//! An `Archive` value never changes; publishing a flush swaps in a new one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_core::store::StoreError;

use crate::catalog::Cutoff;
use crate::manifest::{Manifest, SegmentEntry};
use crate::names::Names;
use crate::segment::{Exact, KeyRecord, Segment, SegmentError};

/// Which (dimension, value) subtotals a read wants.
pub type Wants<'a> = dyn Fn(&str, &str) -> bool + 'a;

/// Subtotal buckets summed by (dimension, value), then by bucket index.
pub type SubSums = BTreeMap<(String, String), BTreeMap<u32, i64>>;

/// How counters are cut into flushable periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Period of an hourly tier, seconds (default a UTC day).
    pub hourly_period: i64,
    /// Period of a finer tier, seconds (default an hour).
    pub fine_period: i64,
    /// How long after a period ends it is flushed, seconds: late events within it still
    /// land in memory rather than in a delta segment.
    pub grace: i64,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy {
            hourly_period: 86_400,
            fine_period: 3_600,
            grace: 600,
        }
    }
}

impl FlushPolicy {
    /// The period length of a tier of resolution `res` seconds. Every resolution divides an
    /// hour or is one, and both periods are whole hours, so a period holds whole buckets.
    pub fn period_len(&self, res: i64) -> i64 {
        if res >= 3600 {
            self.hourly_period
        } else {
            self.fine_period
        }
    }

    /// The start of the period holding bucket start `b`.
    pub fn period_of(&self, res: i64, b: i64) -> i64 {
        let len = self.period_len(res);
        b.div_euclid(len) * len
    }

    /// Whether both periods are positive multiples of an hour.
    pub fn is_valid(&self) -> bool {
        [self.hourly_period, self.fine_period]
            .iter()
            .all(|p| *p > 0 && p % 3600 == 0)
            && self.grace >= 0
    }
}

/// What [`Archive::held`] answers.
#[derive(Debug, Default)]
pub struct Held(BTreeMap<u32, Vec<(i64, i64)>>);

impl Held {
    /// Of `(resolution, start, end)` periods, in any order, overlapping or not.
    pub fn of(periods: impl Iterator<Item = (u32, i64, i64)>) -> Held {
        let mut by_res: BTreeMap<u32, Vec<(i64, i64)>> = BTreeMap::new();
        for (res, start, end) in periods {
            by_res.entry(res).or_default().push((start, end));
        }
        for ranges in by_res.values_mut() {
            ranges.sort_unstable();
            let mut merged: Vec<(i64, i64)> = Vec::with_capacity(ranges.len());
            for &(start, end) in ranges.iter() {
                match merged.last_mut() {
                    Some(last) if start <= last.1 => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            *ranges = merged;
        }
        Held(by_res)
    }

    /// Whether a segment of `resolution` holds the bucket starting at `b`.
    pub fn holds(&self, resolution: u32, b: i64) -> bool {
        self.0.get(&resolution).is_some_and(|ranges| {
            let i = ranges.partition_point(|&(start, _)| start <= b);
            i > 0 && b < ranges[i - 1].1
        })
    }
}

/// The segment file of id `id`.
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.tls"))
}

/// Opens the segment the manifest entry `e` lists, and checks that the file is that
/// segment: its footer's id, kind, resolution and period must be the entry's. A whole,
/// valid segment under another's name (a mixed-up restore, a file copied from another data
/// directory, two files swapped) would otherwise answer its own counts for the period the
/// manifest expects.
pub fn open_listed(dir: &Path, e: &SegmentEntry) -> Result<Segment, SegmentError> {
    let path = segment_path(dir, e.id);
    let seg = Segment::open(&path)?;
    let m = seg.meta();
    let kind = |delta: bool| if delta { "delta" } else { "base" };
    let found = (m.id, m.kind == crate::segment::SegmentKind::Delta);
    let found = (found, m.resolution, m.period_start, m.period_end);
    if found != ((e.id, e.delta), e.resolution, e.period_start, e.period_end) {
        return Err(SegmentError::Corrupt {
            path,
            why: format!(
                "the manifest lists segment {} ({} s, {}..{}, {}) under this name, but the file \
                 is segment {} ({} s, {}..{}, {}): a file from elsewhere, or renamed",
                e.id,
                e.resolution,
                e.period_start,
                e.period_end,
                kind(e.delta),
                m.id,
                m.resolution,
                m.period_start,
                m.period_end,
                kind(found.0.1),
            ),
        });
    }
    Ok(seg)
}

/// The published archive.
#[derive(Debug, Default)]
pub struct Archive {
    pub manifest: Manifest,
    /// In manifest order, opened.
    pub segments: Vec<(SegmentEntry, Arc<Segment>)>,
    /// `(resolution, period start, period length)` → the last log record whose increments
    /// to that period are archived.
    flushed: HashMap<(u32, i64, i64), u64>,
    /// `(resolution, period start)` of every segment: a new segment there is a delta.
    starts: HashSet<(u32, i64)>,
    /// Per resolution, the period lengths its segments have (usually one or two), so that a
    /// bucket's segments are found whatever flush policy wrote them.
    lens: HashMap<u32, Vec<i64>>,
}

/// A segment failure as the `Store` reports it: `corrupt_data` for damage, unavailable for
/// I/O, the segment error kept as the cause.
pub fn store_error(e: SegmentError) -> StoreError {
    match e {
        SegmentError::Io { .. } => StoreError::unavailable("reading an archive segment").because(e),
        SegmentError::Stopped { why } => StoreError::Timeout { what: why },
        _ => StoreError::corrupt("an archive segment").because(e),
    }
}

/// A segment the manifest listed that opening left out, accepting data loss: missing, or
/// damaged where opening reads (cut short, zeroed, its footer or index, another segment's
/// file).
#[derive(Debug, Clone)]
pub struct LostSegment {
    pub entry: SegmentEntry,
    /// The error that opening it gave.
    pub why: String,
}

/// Whether opening a listed segment failed for damage or absence — what accepting data
/// loss may leave out — rather than for something an operator can put right without losing
/// it (a segment of a newer format, a permission, a failing disk).
fn lost_for_good(e: &SegmentError) -> bool {
    match e {
        SegmentError::Io { err, .. } => err.kind() == std::io::ErrorKind::NotFound,
        SegmentError::BadMagic { .. }
        | SegmentError::Checksum { .. }
        | SegmentError::FrameChecksum { .. }
        | SegmentError::Corrupt { .. }
        | SegmentError::OutOfOrder { .. } => true,
        SegmentError::UnsupportedVersion { .. }
        | SegmentError::Invalid { .. }
        | SegmentError::Poisoned { .. }
        | SegmentError::Stopped { .. } => false,
    }
}

impl Archive {
    /// Opens every segment a manifest lists; a missing or unreadable one is an error.
    pub fn open(dir: &Path, manifest: Manifest) -> Result<Archive, SegmentError> {
        Archive::open_accepting(dir, manifest, false).map(|(archive, _)| archive)
    }

    /// As [`Archive::open`], but with `accept_loss` a listed segment that is missing or
    /// damaged where opening reads ([`lost_for_good`]) is left out instead of stopping it,
    /// and with a lost base every delta of its period: returned, and left out of the
    /// archive's manifest, whose number grows by one — a manifest the caller publishes once
    /// recovery has succeeded (until then, leftovers are judged by the published one).
    /// Anything else still stops it.
    pub fn open_accepting(
        dir: &Path,
        mut manifest: Manifest,
        accept_loss: bool,
    ) -> Result<(Archive, Vec<LostSegment>), SegmentError> {
        let mut segments = Vec::with_capacity(manifest.segments.len());
        let mut lost = Vec::new();
        for e in &manifest.segments {
            match open_listed(dir, e) {
                Ok(seg) => segments.push((*e, Arc::new(seg))),
                Err(err) if accept_loss && lost_for_good(&err) => lost.push(LostSegment {
                    entry: *e,
                    why: format!("{err:#}"),
                }),
                Err(err) => return Err(err),
            }
        }
        // A delta counts from its period's base (a rebuild's holds the difference from what
        // the base held): with the base gone it would read as counts never made, negative
        // ones among them, so it goes with it (set aside too).
        let bases: Vec<SegmentEntry> = lost.iter().map(|l| l.entry).filter(|e| !e.delta).collect();
        segments.retain(|(e, _)| {
            let base = bases.iter().find(|b| {
                e.delta
                    && b.resolution == e.resolution
                    && e.period_start < b.period_end
                    && b.period_start < e.period_end
            });
            if let Some(b) = base {
                lost.push(LostSegment {
                    entry: *e,
                    why: format!("a delta of the period of lost segment {}", b.id),
                });
            }
            base.is_none()
        });
        if !lost.is_empty() {
            manifest
                .segments
                .retain(|e| lost.iter().all(|l| l.entry.id != e.id));
            manifest.number += 1;
        }
        Ok((Archive::with(manifest, segments), lost))
    }

    /// An archive of already opened segments.
    pub fn with(manifest: Manifest, segments: Vec<(SegmentEntry, Arc<Segment>)>) -> Archive {
        let mut flushed: HashMap<(u32, i64, i64), u64> = HashMap::new();
        let mut lens: HashMap<u32, Vec<i64>> = HashMap::new();
        let mut starts = HashSet::new();
        for (e, _) in &segments {
            starts.insert((e.resolution, e.period_start));
            let len = e.period_end - e.period_start;
            let f = flushed
                .entry((e.resolution, e.period_start, len))
                .or_default();
            *f = (*f).max(e.flushed_seq);
            // Only a segment flushed at or after wal_start can hold increments of a record
            // recovery replays; the others (merged months among them) need no lookup.
            if e.flushed_seq >= manifest.wal_start {
                let l = lens.entry(e.resolution).or_default();
                if len > 0 && !l.contains(&len) {
                    l.push(len);
                }
            }
        }
        Archive {
            manifest,
            segments,
            flushed,
            starts,
            lens,
        }
    }

    /// The last log record whose increments to this period (`len` seconds from
    /// `period_start`) are archived (0: none). Periods of several lengths can start at one
    /// time (a day and its first hour, after the flush policy changed): each length is
    /// looked up apart, since a segment vouches only for its own period.
    pub fn flushed_seq(&self, resolution: u32, period_start: i64, len: i64) -> u64 {
        self.flushed
            .get(&(resolution, period_start, len))
            .copied()
            .unwrap_or(0)
    }

    /// The last log record whose increments to bucket `b` of `resolution` are archived (0:
    /// none): the largest over the segments whose period holds `b`. Each such segment holds
    /// every increment to its whole period up to its record, so the largest bounds them all.
    pub fn flushed_at(&self, resolution: u32, b: i64) -> u64 {
        let Some(lens) = self.lens.get(&resolution) else {
            return 0;
        };
        lens.iter()
            .map(|&len| self.flushed_seq(resolution, b.div_euclid(len) * len, len))
            .max()
            .unwrap_or(0)
    }

    /// The time the segments hold, per resolution (bases, deltas, merged months alike):
    /// sorted, disjoint `[start, end)` ranges. A bucket inside one expires only with every
    /// segment holding it ([`crate::compaction::choose`]).
    pub fn held(&self) -> Held {
        Held::of(
            self.segments
                .iter()
                .map(|(e, _)| (e.resolution, e.period_start, e.period_end)),
        )
    }

    /// Whether a base segment exists for this period (a new one is then a delta).
    pub fn has_period(&self, resolution: u32, period_start: i64) -> bool {
        self.starts.contains(&(resolution, period_start))
    }

    /// Segments of one resolution overlapping `[from, to)`, with what a namespace's cutoff
    /// lets each show: (totals, subtotals).
    pub fn overlapping(
        &self,
        resolution: u32,
        from: i64,
        to: i64,
        cutoff: Cutoff,
    ) -> impl Iterator<Item = (&Arc<Segment>, (bool, bool))> + '_ {
        self.segments
            .iter()
            .filter(move |(e, _)| {
                e.resolution == resolution && e.period_start < to && from < e.period_end
            })
            .map(move |(e, s)| (s, cutoff.shows(e.flushed_seq)))
            .filter(|(_, (totals, _))| *totals)
    }

    /// Every segment, for `tally check`.
    pub fn all(&self) -> impl Iterator<Item = (&SegmentEntry, &Arc<Segment>)> + '_ {
        self.segments.iter().map(|(e, s)| (e, s))
    }

    /// Sums one key's archived buckets of one resolution over `[lo, hi)` bucket indexes into
    /// `totals` and, per `(dim, value)` that `want` accepts, into `subs`.
    /// Sums one key's archived buckets over `[from, to)`: totals always, and the subtotals
    /// `want` accepts when `wants_subtotals` (false: the subtotals are not decoded at all).
    #[allow(clippy::too_many_arguments)]
    pub fn add_key(
        &self,
        resolution: u32,
        (from, to): (i64, i64),
        (ns, key): (&str, &str),
        cutoff: Cutoff,
        (wants_subtotals, want): (bool, &Wants<'_>),
        totals: &mut BTreeMap<u32, i64>,
        subs: &mut SubSums,
    ) -> Result<(), SegmentError> {
        let (lo, hi) = index_range(resolution, from, to);
        for (seg, (_, show_subs)) in self.overlapping(resolution, from, to, cutoff) {
            if !(show_subs && wants_subtotals) {
                // Totals alone: the key's subtotals are not even decoded.
                if let Some(t) = seg.get_totals(ns, key)? {
                    for (i, n) in t.iter().filter(|(i, _)| lo <= *i && *i < hi) {
                        add(totals.entry(*i).or_default(), *n);
                    }
                }
            } else if let Some(rec) = seg.get(ns, key)? {
                add_record(&rec, (lo, hi), want, totals, subs);
            }
        }
        Ok(())
    }
}

/// What [`Archive::sum_key`] reads of one key.
pub(crate) struct SumRead<'a> {
    pub resolution: u32,
    pub ns: &'a str,
    pub key: &'a str,
    pub cutoff: Cutoff,
    /// The bucket indexes to count (range and retention).
    pub inside: &'a dyn Fn(u32) -> bool,
    /// The dimensions whose subtotals are summed; the others are skipped.
    pub dim_ok: &'a dyn Fn(&str) -> bool,
    /// Only this value's subtotal (of the dimensions `dim_ok` accepts), if given.
    pub value: Option<&'a str>,
    /// What subtotals are named by: see [`Archive::sum_key`].
    pub names: &'a Names,
}

impl Archive {
    /// One key's archived buckets over `[from, to)` with each subtotal series summed: totals
    /// bucket by bucket into `totals`, one sum per (dimension, value) to `sub`, from every
    /// segment that shows subtotals. Subtotals are named by (dimension, value) ids of
    /// `r.names`, which each segment maps its dictionary to once: no name is hashed per
    /// read.
    pub(crate) fn sum_key(
        &self,
        r: &SumRead<'_>,
        (from, to): (i64, i64),
        totals: &mut BTreeMap<u32, i64>,
        sub: &mut dyn FnMut(u32, u32, i64),
    ) -> Result<(), SegmentError> {
        let (lo, hi) = index_range(r.resolution, from, to);
        for (seg, (_, show_subs)) in self.overlapping(r.resolution, from, to, r.cutoff) {
            // Whole spans, all kept (retention keeps every bucket after a kept one): the
            // subtotals can come from a rollup. Else the range's buckets within the period,
            // all kept: summed once and reused.
            let (first, end) = (seg.meta().first_bucket(), seg.meta().end_bucket());
            let exact = if !(r.inside)(lo.max(first)) {
                None
            } else {
                match seg.spans_within(lo, hi) {
                    Some(s) if !s.is_empty() => Some(Exact::Spans(s.start, s.end)),
                    Some(_) => None,
                    None => {
                        let hi = u64::from(hi).min(end) as u32;
                        Some(Exact::Buckets(lo.max(first), hi))
                    }
                }
            };
            if show_subs {
                // Only a segment that has the key maps its dictionary (all of it, once).
                if !seg.has(r.ns, r.key) {
                    continue;
                }
                let ids = seg.name_ids(r.names)?;
                // The one value wanted, as named here: found only if the segment's
                // dictionary (now mapped) holds it.
                let value = r.value.map(|v| r.names.get(v));
                let dim_ok = |d: &str| (r.dim_ok)(d) && value != Some(None);
                seg.sums_by_id(
                    (r.ns, r.key),
                    exact,
                    r.inside,
                    &dim_ok,
                    &mut |i, n| add(totals.entry(i).or_default(), n),
                    &mut |d, v, n| {
                        if let Some((d, v)) = ids.get(d, v)
                            && value.is_none_or(|w| w == Some(v))
                        {
                            sub(d, v, n);
                        }
                    },
                )?;
            } else if let Some(t) = seg.get_totals(r.ns, r.key)? {
                for &(i, n) in t.iter().filter(|(i, _)| (r.inside)(*i)) {
                    add(totals.entry(i).or_default(), n);
                }
            }
        }
        Ok(())
    }
}

/// The bucket indexes `[lo, hi)` of a resolution that `[from, to)` covers.
pub fn index_range(resolution: u32, from: i64, to: i64) -> (u32, u32) {
    let r = i64::from(resolution.max(1));
    let idx = |t: i64| ((t.max(0) + r - 1).div_euclid(r)).min(i64::from(u32::MAX)) as u32;
    (idx(from), idx(to))
}

fn add_record(
    rec: &KeyRecord,
    (lo, hi): (u32, u32),
    want: &dyn Fn(&str, &str) -> bool,
    totals: &mut BTreeMap<u32, i64>,
    subs: &mut SubSums,
) {
    let inside = |i: &u32| lo <= *i && *i < hi;
    for (i, n) in rec.totals.iter().filter(|(i, _)| inside(i)) {
        add(totals.entry(*i).or_default(), *n);
    }
    for d in &rec.dims {
        for (value, buckets) in &d.values {
            if !want(&d.dim, value) {
                continue;
            }
            let mut within = buckets.iter().filter(|(i, _)| inside(i)).peekable();
            if within.peek().is_none() {
                continue;
            }
            let m = subs.entry((d.dim.clone(), value.clone())).or_default();
            for (i, n) in within {
                add(m.entry(*i).or_default(), *n);
            }
        }
    }
}

/// Adds to a sum of counts: they wrap past 64 bits, as the counters do.
fn add(sum: &mut i64, n: i64) {
    *sum = sum.wrapping_add(n);
}

#[cfg(test)]
mod tests {
    #[test]
    fn held_periods_merge_and_answer_by_resolution() {
        // A day, an hour delta inside it, a later hour, and another resolution.
        let held = super::Held::of(
            [
                (3600, 0, 86_400),
                (3600, 7200, 10_800),
                (3600, 90_000, 93_600),
                (60, 0, 3600),
            ]
            .into_iter(),
        );
        for (res, b, want) in [
            (3600, 0, true),
            (3600, 86_399, true),
            (3600, 86_400, false),
            (3600, 89_999, false),
            (3600, 90_000, true),
            (3600, 93_600, false),
            (3600, -1, false),
            (60, 3540, true),
            (60, 3600, false),
            (900, 0, false),
        ] {
            assert_eq!(held.holds(res, b), want, "{res} {b}");
        }
    }

    use super::*;

    #[test]
    fn periods_hold_whole_buckets() {
        let p = FlushPolicy::default();
        assert!(p.is_valid());
        assert_eq!(p.period_len(3600), 86_400);
        assert_eq!(p.period_len(60), 3600);
        assert_eq!(p.period_of(3600, 1_795_150_800), 1_795_132_800);
        assert_eq!(p.period_of(60, 1_795_150_860), 1_795_150_800);
        assert!(
            !FlushPolicy {
                fine_period: 60,
                ..p
            }
            .is_valid()
        );
    }

    #[test]
    fn index_ranges_round_up() {
        assert_eq!(index_range(3600, 0, 7200), (0, 2));
        assert_eq!(index_range(3600, 1, 7201), (1, 3));
        assert_eq!(index_range(60, -5, 0), (0, 0));
    }
}

//! Flush: closed periods of counters go from memory into immutable archive segments, a new
//! manifest publishes them, and the log is truncated behind them.
//!
//! 1. Choose: periods with counters in memory whose end plus the grace is past.
//! 2. Freeze: under the write gate (no batch between its log append and its apply), note the
//!    last applied log record `S`, forget the chosen periods as dirty and mark them as being
//!    frozen; then, without the gate, shard by shard, move their counters to each shard's
//!    frozen map (still read from there). Writes go on meanwhile, to the marked periods too:
//!    each shard notes the updates to them until its freeze, which takes them back out of
//!    what it freezes and leaves them live, so the frozen counters are the log's through `S`
//!    (`Shard::end_freeze`).
//! 3. Write one segment per (resolution, period) — a delta if the period is already archived —
//!    fsync it, rename it into place, sync the directory.
//! 4. Publish a manifest: the segments, each flushed through `S`; `wal_start` = the first log
//!    record still needed (the smallest first record of a dirty period, computed under the
//!    write gate); schemas as of `wal_start - 1`; the answers files still holding unexpired
//!    answers, plus one new file of the idempotency answers no file holds yet (written and
//!    synced before the manifest); then the files of expired answers, and any a failed
//!    publish left, are removed.
//! 5. Swap the archive in and drop the frozen counters, under the archive's write lock, so a
//!    reader sees them in memory or in the archive, never both or neither.
//! 6. Rotate the log and delete the files that end before `wal_start`.
//!
//! A failure before 5 puts the frozen counters back and the dirty periods with them; the
//! log was not truncated, so nothing is lost, and the next flush tries again.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use tally_core::store::StoreError;

use crate::archive::{Archive, segment_path};
use crate::catalog::{Bits, KeyId, KeyName, SeriesId, TOTAL, is_total, total_of};
use crate::engine::Engine;
use crate::manifest::{self, AnswersEntry, Manifest, SegmentEntry};
use crate::memtable::{Counters, Frozen, split_key};
use crate::segment::{
    Buckets, DimRecord, KeyRecord, Segment, SegmentKind, SegmentMeta, SegmentWriter,
};
use crate::state::Freezing;
use crate::wal::list_files;

/// What has happened since the catalog last forgot the keys and series that have no counter
/// left in memory (a walk over every counter, under the write gate): when to do it again.
#[derive(Debug, Default)]
pub(crate) struct ForgetDebt {
    /// Counters flushes have taken from memory.
    taken: usize,
    /// Counters memory held after the last flush's freeze, frozen ones excluded.
    left: usize,
    /// Flushes that chose a period.
    flushes: u32,
}

/// Flushes after which the catalog forgets whatever else says: counters also leave memory by
/// the retention sweep, a schema change or netting to zero, which the other two rules see
/// only in part.
const FORGET_EVERY_FLUSHES: u32 = 24;

impl ForgetDebt {
    /// Whether a walk is worth it, for a catalog of `series` live series: flushes took an
    /// eighth as many counters as there are series (a day of an hourly tier takes most of
    /// memory; the hourly flush of a minute tier few); or memory holds fewer counters than
    /// seven eighths of the series, so at least an eighth of them has none (a tier the
    /// sweep empties before its flush); or `FORGET_EVERY_FLUSHES` flushes went by.
    fn due(&self, series: usize) -> bool {
        self.taken.saturating_mul(8) >= series
            || self.left.saturating_mul(8) <= series.saturating_mul(7)
            || self.flushes >= FORGET_EVERY_FLUSHES
    }
}

/// Keys whose records a flush builds at once (under the catalog's read lock) before
/// writing them.
const FLUSH_CHUNK_KEYS: usize = 256;

/// Keys a forget decides on under one hold of the catalog's write lock (~1.3 µs a key for
/// keys with a few dozen subtotals: a few ms).
const FORGET_CHUNK_KEYS: usize = 4096;

/// Series (or keys) a flush looks up in the catalog at once, under its read lock, as it
/// lists the keys of a period.
const FLUSH_CHUNK_SERIES: usize = 16_384;

/// Where a period's records go, in strictly increasing (namespace, key) order.
pub(crate) type Sink<'a> = dyn FnMut(&str, &str, KeyRecord) -> Result<(), StoreError> + 'a;

/// Hands a chosen period's records to the sink (none: an empty segment); called from
/// several threads at once when segments are written in parallel.
pub(crate) type Feed<'a> = dyn Fn(&Chosen, &mut Sink<'_>) -> Result<(), StoreError> + Sync + 'a;

/// A segment written: its entry, the open segment, what it holds.
type Written = (SegmentEntry, Arc<Segment>, crate::segment::SegmentStats);

/// What one flush did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    pub segments: usize,
    pub keys: u64,
    pub data_points: u64,
    pub bytes: u64,
    /// The first log record kept.
    pub wal_start: u64,
    pub wal_files_removed: usize,
    /// Keys the catalog forgot: nothing of them is left in memory (the archive keeps them).
    pub forgotten_keys: usize,
}

/// One period to flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chosen {
    /// The memtable slot of its resolution (unused by a bulk install).
    pub(crate) slot: usize,
    pub(crate) res: i64,
    pub(crate) period: i64,
    pub(crate) len: i64,
}

impl Chosen {
    /// The bucket indexes `[lo, hi)` of the period.
    fn index_range(&self) -> (u32, u32) {
        let idx = |t: i64| (t / self.res).clamp(0, i64::from(u32::MAX)) as u32;
        (idx(self.period), idx(self.period + self.len))
    }
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> StoreError {
    move |e| StoreError::unavailable(what).because(e)
}

impl Engine {
    /// Flushes every period closed (plus the grace) at the engine clock's now.
    pub fn flush(&self) -> Result<FlushReport, StoreError> {
        self.flush_closed(self.clock.now())
    }

    /// Counts a failed flush for `/metrics`.
    fn counted(&self, r: Result<FlushReport, StoreError>) -> Result<FlushReport, StoreError> {
        if r.is_err() {
            self.failed_flushes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// Flushes every period that ends (plus the grace) at or before `now`.
    pub fn flush_closed(&self, now: i64) -> Result<FlushReport, StoreError> {
        self.counted(self.flush_until(now, now, false))
    }

    /// After recovery accepted missing records: flushes every period in memory, open ones
    /// too (later events to them become deltas, as late events do), and publishes a
    /// manifest even when memory held nothing, so `wal_start` moves past every gap and the
    /// files before it are removed.
    pub(crate) fn flush_all_after_loss(&self) -> Result<FlushReport, StoreError> {
        self.flush_everything()
    }

    /// Flushes every period in memory, open ones too, and publishes a manifest.
    pub(crate) fn flush_everything(&self) -> Result<FlushReport, StoreError> {
        let now = self.clock.now();
        self.counted(self.flush_until(i64::MAX / 2, now, true))
    }

    /// Flushes the periods that end (plus the grace) at or before `until`; `now` decides
    /// which idempotency answers are still kept. `publish` publishes a manifest and
    /// truncates the log even when there is no period to flush.
    fn flush_until(&self, until: i64, now: i64, publish: bool) -> Result<FlushReport, StoreError> {
        let mut debt = self
            .flush_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = self.wal.poisoned() {
            return Err(e);
        }
        let policy = self.core.flush;
        let chosen: Vec<Chosen> = {
            let slots = self.core.read_cat().slots.clone();
            let dirty = self
                .core
                .dirty
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut c: Vec<Chosen> = dirty
                .keys()
                .filter_map(|&(slot, period)| {
                    let res = slots.get(slot)?.secs_i64();
                    let len = policy.period_len(res);
                    (period + len + policy.grace <= until).then_some(Chosen {
                        slot,
                        res,
                        period,
                        len,
                    })
                })
                .collect();
            c.sort_by_key(|c| (c.res, c.period));
            c
        };
        if chosen.is_empty() && !publish {
            return Ok(FlushReport::default());
        }
        // 2. Freeze: the log position and the periods fixed under the write gate (no batch
        // between its log append and its apply), then each shard in turn without it. Writes
        // go on meanwhile, late ones to the periods being frozen too: a shard notes the
        // updates to them until its freeze, which leaves those live (`Core::start_freeze`,
        // `Shard::end_freeze`), so the frozen counters are exactly the log's up to `seq`.
        let mut by_slot: Freezing = BTreeMap::new();
        for c in &chosen {
            by_slot.entry(c.slot).or_default().push(c.index_range());
        }
        let (seq, taken, freezing) = {
            let _gate = self.gate.write();
            let seq = self.core.last_seq.load(Ordering::SeqCst);
            let mut dirty = self
                .core
                .dirty
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let taken: Vec<((usize, i64), u64)> = chosen
                .iter()
                .filter_map(|c| {
                    let k = (c.slot, c.period);
                    dirty.remove(&k).map(|first| (k, first))
                })
                .collect();
            drop(dirty);
            let freezing = self.core.start_freeze(by_slot.clone());
            (seq, taken, freezing)
        };
        let (mut frozen, mut left) = (0, 0);
        for s in (0..self.core.mem.shards()).rev() {
            let mut shard = self.core.mem.lock(s);
            for (slot, ranges) in &by_slot {
                shard.freeze(*slot, ranges);
            }
            shard.end_freeze();
            frozen += shard.frozen.iter().map(|m| m.len()).sum::<usize>();
            left += shard.maps.iter().map(|m| m.len()).sum::<usize>();
        }
        drop(freezing);
        debt.taken += frozen;
        debt.left = left;
        debt.flushes += 1;
        let feed = |c: &Chosen, sink: &mut Sink<'_>| self.frozen_records(c, sink);
        // One writer: a flush runs beside the server's work.
        match self.write_and_publish(&chosen, seq, now, &feed, 1) {
            Ok(mut report) => {
                if debt.due(self.core.read_cat().live_series()) {
                    report.forgotten_keys = self.forget_archived();
                    *debt = ForgetDebt::default();
                }
                report.wal_files_removed = self.truncate_log(report.wal_start)?;
                Ok(report)
            }
            Err(e) => {
                // Nothing was published: the counters go back to memory, still dirty.
                for s in 0..self.core.mem.shards() {
                    self.core.mem.lock(s).thaw(&is_total);
                }
                let mut dirty = self
                    .core
                    .dirty
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                for (k, first) in taken {
                    let f = dirty.entry(k).or_insert(first);
                    *f = (*f).min(first);
                }
                Err(e)
            }
        }
    }

    /// Writes the segment of one chosen period as `entry` says (a temporary file renamed
    /// into place, not yet synced), its records from `records` — none is a segment too.
    fn write_segment(
        &self,
        c: &Chosen,
        entry: SegmentEntry,
        records: &Feed<'_>,
    ) -> Result<Written, StoreError> {
        let final_path = segment_path(&self.segments_dir, entry.id);
        let tmp = final_path.with_extension("tmp");
        let meta = SegmentMeta {
            id: entry.id,
            kind: if entry.delta {
                SegmentKind::Delta
            } else {
                SegmentKind::Base
            },
            resolution: entry.resolution,
            period_start: entry.period_start,
            period_end: entry.period_end,
        };
        let seg_err = |e| StoreError::unavailable("writing an archive segment").because(e);
        // A period without records still gets a (recordless) segment: it records that the
        // period is archived through the flush's log record, so recovery skips the period's
        // records up to there. Without it, increments that netted to zero before a flush came
        // back half-replayed after a restart (those before `wal_start` skipped, the rest
        // applied).
        self.fs
            .remove(&tmp)
            .map_err(io("removing a stale segment"))?;
        let mut w = SegmentWriter::create(&tmp, meta.clone()).map_err(seg_err)?;
        records(c, &mut |ns, key, rec| {
            w.add_owned(ns, key, rec).map_err(seg_err)
        })?;
        let stats = w.finish().map_err(seg_err)?;
        self.fs
            .rename(&tmp, &final_path)
            .map_err(io("naming an archive segment"))?;
        let seg = Segment::open(&final_path).map_err(seg_err)?;
        Ok((entry, Arc::new(seg), stats))
    }

    /// Writes a segment per chosen period, its records from `records`, and publishes them in
    /// one manifest flushed through `seq`.
    pub(crate) fn write_and_publish(
        &self,
        chosen: &[Chosen],
        seq: u64,
        now: i64,
        records: &Feed<'_>,
        workers: usize,
    ) -> Result<FlushReport, StoreError> {
        let old = Arc::clone(&self.core.archive());
        let mut next_id = self.fresh.segment_after(&old.manifest);
        let mut report = FlushReport::default();
        let mut added: Vec<(SegmentEntry, Arc<Segment>)> = Vec::new();
        let entry = |id: u64, delta: bool, c: &Chosen| SegmentEntry {
            id,
            delta,
            resolution: c.res as u32,
            period_start: c.period,
            period_end: c.period + c.len,
            flushed_seq: seq,
        };
        // Several writers only when no two chosen periods are the same (then which one is
        // the base does not depend on which came first).
        let distinct = chosen.iter().enumerate().all(|(i, c)| {
            !chosen[..i]
                .iter()
                .any(|p| (p.res, p.period) == (c.res, c.period))
        });
        let workers = if distinct {
            workers.clamp(1, chosen.len().max(1))
        } else {
            1
        };
        let mut written: Vec<Written> = Vec::new();
        if workers == 1 {
            for c in chosen {
                let delta = old.has_period(c.res as u32, c.period)
                    || added
                        .iter()
                        .any(|(e, _)| e.resolution == c.res as u32 && e.period_start == c.period);
                let w = self.write_segment(c, entry(next_id, delta, c), records)?;
                next_id += 1;
                added.push((w.0, Arc::clone(&w.1)));
                written.push(w);
            }
        } else {
            // Ids in the chosen order.
            let entries: Vec<SegmentEntry> = chosen
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    entry(
                        next_id + i as u64,
                        old.has_period(c.res as u32, c.period),
                        c,
                    )
                })
                .collect();
            next_id += chosen.len() as u64;
            let next = std::sync::atomic::AtomicUsize::new(0);
            let failed = std::sync::atomic::AtomicBool::new(false);
            let results: Vec<(usize, Result<Written, StoreError>)> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..workers)
                    .map(|_| {
                        scope.spawn(|| {
                            let mut out = Vec::new();
                            loop {
                                if failed.load(Ordering::Relaxed) {
                                    break;
                                }
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let (Some(c), Some(e)) = (chosen.get(i), entries.get(i)) else {
                                    break;
                                };
                                let r = self.write_segment(c, *e, records);
                                if r.is_err() {
                                    failed.store(true, Ordering::Relaxed);
                                }
                                out.push((i, r));
                            }
                            out
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| {
                        h.join().unwrap_or_else(|_| {
                            vec![(
                                usize::MAX,
                                Err(StoreError::internal("a segment writer panicked")),
                            )]
                        })
                    })
                    .collect()
            });
            let mut results = results;
            results.sort_by_key(|(i, _)| *i);
            for (_, r) in results {
                let w = r?;
                added.push((w.0, Arc::clone(&w.1)));
                written.push(w);
            }
        }
        for (_, _, stats) in &written {
            report.segments += 1;
            report.keys += stats.keys;
            report.data_points += stats.data_points;
            report.bytes += stats.bytes;
        }
        self.fs
            .sync_dir(&self.segments_dir)
            .map_err(io("syncing the segment directory"))?;
        // 4. The manifest, with the log position and checkpoint taken under the write gate.
        let (mut m, copied) = {
            let _gate = self.gate.write();
            let wal_start = {
                let dirty = self
                    .core
                    .dirty
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                dirty
                    .values()
                    .copied()
                    .min()
                    .unwrap_or_else(|| self.core.last_seq.load(Ordering::SeqCst) + 1)
            };
            let schemas = self
                .core
                .schemas
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_of(wal_start.saturating_sub(1));
            // Copied under the lock (writes with a key wait on it), made records after:
            // only the answers no published answers file holds yet.
            let copied = self
                .core
                .idem
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .unwritten(now);
            let cutoffs = {
                let cat = self.core.read_cat();
                cat.ns
                    .iter()
                    .flat_map(|e| e.cutoffs.iter().map(|(r, c)| (e.name.clone(), *r, *c)))
                    .collect()
            };
            let m = Manifest {
                cutoffs,
                number: self.fresh.number_after(&old.manifest),
                next_segment_id: next_id,
                wal_start: wal_start.max(old.manifest.wal_start),
                segments: old.manifest.segments.clone(),
                schemas: schemas.into_iter().collect(),
                // Answers a format-1 manifest held are in `copied`, written to a file below.
                idempotency: Vec::new(),
                answers: old
                    .manifest
                    .answers
                    .iter()
                    .filter(|a| a.newest_expiry > now)
                    .copied()
                    .collect(),
            };
            (m, copied)
        };
        m.segments.extend(added.iter().map(|(e, _)| *e));
        // The answers given since the last publish, in a file of their own: each answer is
        // written once, not by every publish while it is remembered.
        let generation = copied.generation;
        let answers = copied.records();
        if !answers.is_empty() {
            let id = m.next_segment_id;
            m.next_segment_id += 1;
            let path = manifest::answers_path(&self.segments_dir, id);
            // A failed flush may have left a file under this id; no manifest names it.
            self.fs
                .remove(&path)
                .map_err(io("writing an answers file"))?;
            self.fs
                .write_new(&path, &manifest::encode_answers(&answers))
                .map_err(io("writing an answers file"))?;
            self.fs
                .sync_dir(&self.segments_dir)
                .map_err(io("syncing the segment directory"))?;
            m.answers.push(AnswersEntry {
                id,
                answers: answers.len() as u64,
                newest_expiry: answers.iter().map(|r| r.expires).max().unwrap_or(now),
            });
        }
        drop(answers);
        // The log first: a manifest says the log held records up to `seq`, and recovery
        // refuses a log that ends before (its newest file lost), so they must be durable.
        self.wal.sync()?;
        self.fresh.use_up(&m);
        manifest::publish(&*self.fs, &self.dir, &m).map_err(io("publishing the manifest"))?;
        report.wal_start = m.wal_start;
        self.core
            .idem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .written(generation);
        // 5. Swap.
        let mut segments: Vec<(SegmentEntry, Arc<Segment>)> = old.segments.clone();
        segments.extend(added);
        let archive = Archive::with(m.clone(), segments);
        {
            let mut g = self
                .core
                .archive
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            *g = Arc::new(archive);
            for s in 0..self.core.mem.shards() {
                self.core.mem.lock(s).drop_frozen();
            }
        }
        self.core
            .schemas
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .advance(m.wal_start.saturating_sub(1));
        if old.manifest.number > 0 {
            // The previous manifest is no longer named by CURRENT, nor are the answers files
            // whose every answer expired.
            let _ = self
                .fs
                .remove(&manifest::file_name(&self.dir, old.manifest.number));
            for a in &old.manifest.answers {
                if !m.answers.contains(a) {
                    let _ = self
                        .fs
                        .remove(&manifest::answers_path(&self.segments_dir, a.id));
                }
            }
        }
        remove_unpublished(
            &self.segments_dir,
            &m,
            old.manifest.next_segment_id..m.next_segment_id,
        );
        Ok(report)
    }

    /// Hands the frozen counters of one period to `sink` as segment records, by (namespace,
    /// key) in byte order. The period's keys are found from the frozen arrays, looked up in
    /// the catalog in parts of [`FLUSH_CHUNK_SERIES`] and sorted by name without its lock;
    /// their records are built [`FLUSH_CHUNK_KEYS`] keys at a time under the catalog's read
    /// lock, then written with the lock released: the flush never holds the whole period as
    /// records (its memory peak is the frozen counters plus one chunk), and batches, which
    /// take the catalog's write lock, wait for one part at a time. Key ids stay meant for the
    /// same keys throughout: only a flush forgets keys, and the caller holds the flush lock.
    fn frozen_records(&self, c: &Chosen, sink: &mut Sink<'_>) -> Result<(), StoreError> {
        let (lo, hi) = c.index_range();
        // Each shard's frozen counters of the slot, shared, not copied: sorted by (series,
        // bucket), so a series' buckets are one run. A key's series are all in its shard's
        // array.
        let frozen: Vec<Arc<Frozen>> = (0..self.core.mem.shards())
            .map(|s| {
                let shard = self.core.mem.lock(s);
                shard.frozen.get(c.slot).cloned().unwrap_or_default()
            })
            .collect();
        let in_period = |k: u64| {
            let idx = split_key(k).1;
            lo <= idx && idx < hi
        };
        // Only the keys whose series have frozen counters in the period: a flush costs what it
        // writes, not what the catalog has ever seen. Per key, whether any of its subtotals
        // has one (a tier without breakdowns never does, and then the key's subtotal list is
        // not walked).
        // Per series with counters in the period, where its run is in its shard's array (a
        // key's subtotals without one are then passed over with one probe): from the frozen
        // arrays alone.
        let mut runs: HashMap<SeriesId, (usize, usize), crate::seeded::State> = HashMap::default();
        for f in &frozen {
            let mut at = 0;
            for run in f.chunk_by(|a, b| split_key(a.0).0 == split_key(b.0).0) {
                let start = at;
                at += run.len();
                if run.iter().any(|&(k, n)| n != 0 && in_period(k)) {
                    runs.insert(split_key(run[0].0).0, (start, at));
                }
            }
        }
        // Their keys, and the names to sort them by, from the catalog a part at a time:
        // writes wait for the catalog at most one part (ids stay put while a flush runs:
        // only a flush forgets). One whole walk under its lock held each batch up to
        // ~0.5 s (`tally-bench flush-latency`).
        let sids: Vec<SeriesId> = runs.keys().copied().collect();
        let mut keys: Vec<(KeyId, bool)> = Vec::with_capacity(sids.len());
        for part in sids.chunks(FLUSH_CHUNK_SERIES) {
            let cat = self.core.read_cat();
            for &sid in part {
                keys.extend(cat.key_of_series(sid).map(|k| (k, cat.is_subtotal(sid))));
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        keys.sort_unstable();
        keys.dedup_by(|later, first| {
            let same = later.0 == first.0;
            if same {
                first.1 |= later.1;
            }
            same
        });
        // In the order segments want: (namespace, key) by bytes. Namespaces by their rank
        // in byte order, keys by their names, copied a part at a time.
        let ns_rank: Vec<u32> = {
            let cat = self.core.read_cat();
            let mut order: Vec<usize> = (0..cat.ns.len()).collect();
            order.sort_unstable_by(|&a, &b| {
                cat.ns[a]
                    .name
                    .as_str()
                    .as_bytes()
                    .cmp(cat.ns[b].name.as_str().as_bytes())
            });
            let mut rank = vec![0; order.len()];
            for (r, i) in order.into_iter().enumerate() {
                rank[i] = r as u32;
            }
            rank
        };
        let mut named: Vec<(u32, KeyName, KeyId, bool)> = Vec::with_capacity(keys.len());
        for part in keys.chunks(FLUSH_CHUNK_SERIES) {
            let cat = self.core.read_cat();
            for &(kid, has_subs) in part {
                if let (Some(k), Some(&ns)) =
                    (cat.keys.get(kid as usize), cat.key_ns.get(kid as usize))
                {
                    let rank = ns_rank.get(ns as usize).copied().unwrap_or(u32::MAX);
                    named.push((rank, k.name.clone(), kid, has_subs));
                }
            }
        }
        named.sort_unstable_by(|a, b| (a.0, a.1.as_bytes()).cmp(&(b.0, b.1.as_bytes())));
        let keys: Vec<(KeyId, bool)> = named.into_iter().map(|(_, _, k, s)| (k, s)).collect();
        let mem = &self.core.mem;
        // A series' buckets in the period, from its key's shard.
        let series = |kid: KeyId, sid: SeriesId| -> Buckets {
            let (Some(f), Some(&(a, b))) = (frozen.get(mem.shard_of(kid)), runs.get(&sid)) else {
                return Buckets::new();
            };
            f[a..b]
                .iter()
                .filter(|&&(k, n)| n != 0 && in_period(k))
                .map(|&(k, n)| (split_key(k).1, n))
                .collect()
        };
        let mut chunk: Vec<(String, String, KeyRecord)> = Vec::new();
        for part in keys.chunks(FLUSH_CHUNK_KEYS) {
            {
                let cat = self.core.read_cat();
                for &(kid, has_subs) in part {
                    let Some(entry) = cat.keys.get(kid as usize) else {
                        continue;
                    };
                    let Some(ns) = cat
                        .key_ns
                        .get(kid as usize)
                        .and_then(|&n| cat.ns.get(n as usize))
                    else {
                        continue;
                    };
                    let mut rec = KeyRecord {
                        totals: series(kid, total_of(kid)),
                        dims: Vec::new(),
                    };
                    let mut dims: BTreeMap<&str, Vec<(String, Buckets)>> = BTreeMap::new();
                    for (d, v, sid) in cat.subs_of(entry).filter(|_| has_subs) {
                        let b = series(kid, sid);
                        if !b.is_empty() {
                            dims.entry(cat.str(d))
                                .or_default()
                                .push((cat.str(v).to_owned(), b));
                        }
                    }
                    for (dim, mut values) in dims {
                        values.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                        rec.dims.push(DimRecord {
                            dim: dim.to_owned(),
                            values,
                        });
                    }
                    if !rec.totals.is_empty() || !rec.dims.is_empty() {
                        chunk.push((
                            ns.name.as_str().to_owned(),
                            entry.name.as_str().to_owned(),
                            rec,
                        ));
                    }
                }
            }
            for (ns, key, rec) in chunk.drain(..) {
                sink(&ns, &key, rec)?;
            }
        }
        Ok(())
    }

    /// Forgets the catalog's keys and series that have no counter left in memory. Returns
    /// the keys forgotten.
    ///
    /// Writes go on meanwhile (the walk over every counter and the forget took ~0.3 s for
    /// 6 M counters under the write gate). Under the gate first, the catalog starts noting
    /// the keys batches resolve: no batch is then between resolving its ids and adding its
    /// counters, so what any earlier batch added is in memory for the walk to see. A batch
    /// after that may add to a shard the walk has passed, but its keys are noted, and the
    /// forget keeps them. It runs in parts of [`FORGET_CHUNK_KEYS`] keys, each under the
    /// catalog's write lock (no reader holds an id, no batch resolves one).
    fn forget_archived(&self) -> usize {
        {
            let _gate = self.gate.write();
            self.core.write_cat().begin_forget();
        }
        // One bit per subtotal series id and per key id (both dense; a total's id names its
        // key): the live series, from every counter in memory, without hashing each one.
        let (mut subs, mut totals) = (Bits::default(), Bits::default());
        for s in 0..self.core.mem.shards() {
            let shard = self.core.mem.lock(s);
            let keys = shard.maps.iter().flat_map(Counters::keys);
            for k in keys.chain(shard.frozen.iter().flat_map(|f| f.iter()).map(|e| e.0)) {
                let sid = split_key(k).0;
                if is_total(sid) {
                    totals.set(sid & !TOTAL, true);
                } else {
                    subs.set(sid, true);
                }
            }
        }
        let is_live = |sid: SeriesId| {
            if is_total(sid) {
                totals.contains(sid & !TOTAL)
            } else {
                subs.contains(sid)
            }
        };
        // Keys made from here on are noted: the walk over those that exist now is enough.
        let end = self.core.read_cat().keys.len();
        let (mut keys, mut series) = (0, 0);
        let mut from = 0;
        loop {
            let mut cat = self.core.write_cat();
            let to = (from + FORGET_CHUNK_KEYS).min(end);
            let (k, s) = cat.forget_keys(&is_live, from..to);
            (keys, series) = (keys + k, series + s);
            if to == end {
                let before = cat.strings_freed;
                cat.end_forget(series > 0);
                if cat.strings_freed != before {
                    self.core.catalog_strings_freed(cat.strings_freed);
                }
                return keys;
            }
            from = to;
        }
    }

    /// Rotates the log, then removes every file whose records all come before `wal_start`.
    fn truncate_log(&self, wal_start: u64) -> Result<usize, StoreError> {
        self.wal.rotate()?;
        let files = list_files(&self.wal_dir).map_err(io("listing the log"))?;
        let mut removed = 0;
        for pair in files.windows(2) {
            let ((_, path), (next_first, _)) = (&pair[0], &pair[1]);
            if *next_first <= wal_start {
                self.fs
                    .remove(path)
                    .map_err(io("removing a flushed log file"))?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.fs
                .sync_dir(&self.wal_dir)
                .map_err(io("syncing the log directory"))?;
        }
        Ok(removed)
    }
}

/// Removes the segment and answers files numbered in `ids` that `m`, just published, does
/// not list: only a publish that failed can have written them (one publisher at a time,
/// under the flush lock, and ids from `Fresh`, so a failed publish's ids are not used
/// again), and `m` supersedes whatever it published. Without this they stayed until the
/// next open, and a publish failing every minute (a full disk) wrote its answers again
/// each time. Best effort: what is left is removed on the next open.
pub(crate) fn remove_unpublished(segments_dir: &Path, m: &Manifest, ids: std::ops::Range<u64>) {
    for id in ids {
        if !m.segments.iter().any(|e| e.id == id) {
            let _ = std::fs::remove_file(segment_path(segments_dir, id));
        }
        if !m.answers.iter().any(|a| a.id == id) {
            let _ = std::fs::remove_file(manifest::answers_path(segments_dir, id));
        }
    }
}

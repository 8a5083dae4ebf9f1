//! Bulk install (`tally load --data`): counters aggregated outside the write path, written
//! straight into archive segments and published in one manifest — no log record, no memtable.
//!
//! [`Bulk`] aggregates validated increments by tier, period, key and bucket (every event of
//! one series and bucket becomes one counter), keeping only the buckets a tier's retention
//! still shows. [`Engine::install`] then flushes whatever memory holds, writes one segment per
//! (resolution, period) — a delta where the period is archived already — flushed through the
//! last log record, and publishes them with the given idempotency answers, atomically: after a
//! crash the directory holds all of an install or none of it.
//!
//! Safe beside writers: the installed segments are marked flushed through the record before
//! the first one memory still holds (read under the write gate), so every record they claim
//! is archived already, and writes still in memory are replayed as usual.
//!
//! [`Engine::rebuild_bulk`] (a rebuild, `tally load --replace`) adds to a [`Bulk`] of the new
//! counts the negation of what the range holds now, read through the store as queries read
//! it, and installs the difference: readers see the old counts or the new, never a mix.

use std::collections::{BTreeMap, HashMap};

use tally_core::model::Schema;
use tally_core::store::{IdemRecord, Increment, StoreError};

use crate::archive::FlushPolicy;
use crate::engine::Engine;
use crate::flush::{Chosen, FlushReport, Records};
use crate::segment::{Buckets, DimRecord, KeyRecord};

type Fast = foldhash::fast::FixedState;
type Map<K, V> = HashMap<K, V, Fast>;

/// One key's counters in one period: totals and subtotals by bucket index.
#[derive(Debug, Default)]
struct Cell {
    totals: Map<u32, i64>,
    /// `dimension \0 value` → bucket → count
    subs: Map<String, Map<u32, i64>>,
}

/// One key's cells, by (resolution, period start).
#[derive(Debug, Default)]
struct KeyAgg {
    parts: Map<(i64, i64), Cell>,
}

/// One stored counter: key `key` of `ns`, the bucket starting at `start` of the tier of `res`
/// seconds, its total (`sub` None) or the subtotal `sub` = (dimension, value).
#[derive(Debug, Clone, Copy)]
pub struct Counter<'a> {
    pub ns: &'a str,
    pub key: &'a str,
    pub res: i64,
    pub start: i64,
    pub sub: Option<(&'a str, &'a str)>,
}

/// Counters to install, by `namespace \0 key` (one lookup per event: neither holds a NUL),
/// then (resolution, period start).
#[derive(Debug, Default)]
pub struct Bulk {
    keys: Map<String, KeyAgg>,
    counters: usize,
    bytes: usize,
    /// Reused to build lookup names without allocating.
    scratch: String,
    sub_scratch: String,
}

/// Heap bytes of one hash-map entry beyond its key and value (control bytes, spare capacity
/// at the usual load, the allocation's rounding), as measured on this workload (see
/// docs/benchmarks.md): an estimate, so `--memory-mb` bounds the aggregate to within a small
/// factor, not exactly.
const ENTRY_OVERHEAD: usize = 24;
/// A key's and a cell's maps' own headers.
const CELL_BYTES: usize = 3 * 48 + 64;

impl Bulk {
    /// Counters held (each one (series, bucket)).
    pub fn counters(&self) -> usize {
        self.counters
    }

    /// Estimated heap bytes held: what `--memory-mb` compares with.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Runs `f` on the key's aggregate, made on first use (a lookup by a reused buffer: no
    /// allocation for a key seen before).
    fn with_key<R>(&mut self, ns: &str, key: &str, f: impl FnOnce(&mut KeyAgg) -> R) -> R {
        self.scratch.clear();
        self.scratch.push_str(ns);
        self.scratch.push('\0');
        self.scratch.push_str(key);
        if let Some(agg) = self.keys.get_mut(self.scratch.as_str()) {
            return f(agg);
        }
        self.bytes += CELL_BYTES + ENTRY_OVERHEAD + self.scratch.len();
        f(self.keys.entry(self.scratch.clone()).or_default())
    }

    /// Adds one increment under `schema` (its namespace's), as the engine's write path would
    /// count it: every tier, subtotals in breakdown tiers, nothing a tier's retention no
    /// longer shows at `now`.
    pub fn add(&mut self, policy: &FlushPolicy, schema: &Schema, inc: &Increment, now: i64) {
        let mut sub_name = std::mem::take(&mut self.sub_scratch);
        let (counters, bytes, sub_name) = self.with_key(inc.ns.as_str(), inc.key.as_str(), |agg| {
            let (mut counters, mut bytes) = (0usize, 0usize);
            for tier in schema.tiers() {
                let res = tier.resolution.secs_i64();
                let bucket = inc.ts.div_euclid(res) * res;
                if !tier.retention.keeps_bucket(bucket, tier.resolution, now) {
                    continue;
                }
                let idx = (bucket / res) as u32;
                let cell = agg
                    .parts
                    .entry((res, policy.period_of(res, bucket)))
                    .or_insert_with(|| {
                        bytes += 48 + ENTRY_OVERHEAD;
                        Cell::default()
                    });
                let t = cell.totals.entry(idx).or_insert_with(|| {
                    counters += 1;
                    bytes += 12 + ENTRY_OVERHEAD;
                    0
                });
                *t += inc.n;
                if schema.is_breakdown(tier.resolution) {
                    for s in &inc.subtotals {
                        sub_name.clear();
                        sub_name.push_str(&s.dim);
                        sub_name.push('\0');
                        sub_name.push_str(&s.value);
                        match cell.subs.get_mut(sub_name.as_str()) {
                            Some(buckets) => {
                                let c = buckets.entry(idx).or_insert_with(|| {
                                    counters += 1;
                                    bytes += 12 + ENTRY_OVERHEAD;
                                    0
                                });
                                *c += inc.n;
                            }
                            None => {
                                counters += 1;
                                bytes += 48 + 2 * ENTRY_OVERHEAD + 12 + sub_name.len();
                                let mut buckets = Map::default();
                                buckets.insert(idx, inc.n);
                                cell.subs.insert(sub_name.clone(), buckets);
                            }
                        }
                    }
                }
            }
            (counters, bytes, sub_name)
        });
        self.sub_scratch = sub_name;
        self.counters += counters;
        self.bytes += bytes;
    }

    /// Adds `n` to one stored counter (see [`Counter`]). For a rebuild, which subtracts what
    /// a range holds: no retention is applied.
    pub fn add_counter(&mut self, policy: &FlushPolicy, at: &Counter<'_>, n: i64) {
        let Counter {
            ns,
            key,
            res,
            start,
            sub,
        } = *at;
        let idx = (start / res) as u32;
        let (counters, bytes) = self.with_key(ns, key, |agg| {
            let (mut counters, mut bytes) = (0usize, 0usize);
            let cell = agg
                .parts
                .entry((res, policy.period_of(res, start)))
                .or_insert_with(|| {
                    bytes += 48 + ENTRY_OVERHEAD;
                    Cell::default()
                });
            let buckets = match sub {
                None => &mut cell.totals,
                Some((dim, value)) => {
                    let name = format!("{dim}\0{value}");
                    if !cell.subs.contains_key(name.as_str()) {
                        bytes += 48 + ENTRY_OVERHEAD + name.len();
                    }
                    cell.subs.entry(name).or_default()
                }
            };
            let c = buckets.entry(idx).or_insert_with(|| {
                counters += 1;
                bytes += 12 + ENTRY_OVERHEAD;
                0
            });
            *c += n;
            (counters, bytes)
        });
        self.counters += counters;
        self.bytes += bytes;
    }

    /// The parts as the periods to write and their records (zero counts left out).
    fn into_parts(self, policy: &FlushPolicy) -> Vec<(Chosen, Records)> {
        let sorted = |m: Map<u32, i64>| {
            let mut b: Vec<(u32, i64)> = m.into_iter().filter(|(_, n)| *n != 0).collect();
            b.sort_unstable();
            b
        };
        let mut by_part: BTreeMap<(i64, i64), Records> = BTreeMap::new();
        for (name, agg) in self.keys {
            let (ns, key) = name.split_once('\0').unwrap_or((name.as_str(), ""));
            for (part, cell) in agg.parts {
                let mut dims: BTreeMap<String, Vec<(String, Buckets)>> = BTreeMap::new();
                for (sub, buckets) in cell.subs {
                    let b = sorted(buckets);
                    if b.is_empty() {
                        continue;
                    }
                    let (dim, value) = sub.split_once('\0').unwrap_or((sub.as_str(), ""));
                    dims.entry(dim.to_owned())
                        .or_default()
                        .push((value.to_owned(), b));
                }
                let dims: Vec<DimRecord> = dims
                    .into_iter()
                    .map(|(dim, mut values)| {
                        values.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                        DimRecord { dim, values }
                    })
                    .collect();
                let rec = KeyRecord {
                    totals: sorted(cell.totals),
                    dims,
                };
                if !rec.totals.is_empty() || !rec.dims.is_empty() {
                    by_part
                        .entry(part)
                        .or_default()
                        .insert((ns.to_owned(), key.to_owned()), rec);
                }
            }
        }
        by_part
            .into_iter()
            .map(|((res, period), records)| {
                let chosen = Chosen {
                    slot: 0,
                    res,
                    period,
                    len: policy.period_len(res),
                };
                (chosen, records)
            })
            .collect()
    }
}

impl Engine {
    /// Replaces what `ns` holds in `[from, to)` with `bulk` (its new counts): the range's
    /// current counters, every tier, totals and subtotals, are subtracted and the difference
    /// installed in one manifest. One rebuild at a time. Answers how many counters the range
    /// held.
    pub fn rebuild_bulk(
        &self,
        ns: &tally_core::model::Namespace,
        from: i64,
        to: i64,
        mut bulk: Bulk,
    ) -> Result<u64, StoreError> {
        use tally_core::store::{KeyList, KeyRead, Store, Want};
        let _one = self
            .rebuild_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(schema) = self.schema(ns)? else {
            return Err(StoreError::internal(format!("namespace {ns} is unknown")));
        };
        let policy = self.core.flush;
        let mut held = 0u64;
        let mut after: Option<String> = None;
        loop {
            let page = self.keys(&KeyList {
                ns,
                prefix: "",
                after: after.as_deref(),
                limit: 1000,
            })?;
            let Some(last) = page.last() else {
                break;
            };
            after = Some(last.to_string());
            for tier in schema.tiers() {
                let want = if schema.is_breakdown(tier.resolution) {
                    Want::All
                } else {
                    Want::Totals
                };
                let reads: Vec<KeyRead<'_>> = page
                    .iter()
                    .map(|key| KeyRead {
                        ns,
                        key,
                        resolution: tier.resolution,
                        from,
                        to,
                        want,
                    })
                    .collect();
                let data = self.read(&reads)?;
                let res = tier.resolution.secs_i64();
                for (key, d) in page.iter().zip(&data) {
                    let at = |start, sub| Counter {
                        ns: ns.as_str(),
                        key: key.as_str(),
                        res,
                        start,
                        sub,
                    };
                    for &(start, n) in &d.totals {
                        if n != 0 {
                            bulk.add_counter(&policy, &at(start, None), -n);
                            held += 1;
                        }
                    }
                    for sub in &d.subtotals {
                        for &(start, n) in &sub.buckets {
                            if n != 0 {
                                bulk.add_counter(
                                    &policy,
                                    &at(start, Some((&sub.dim, &sub.value))),
                                    -n,
                                );
                                held += 1;
                            }
                        }
                    }
                }
            }
            if page.len() < 1000 {
                break;
            }
        }
        self.install(bulk, Vec::new())?;
        Ok(held)
    }

    /// How this engine cuts periods (what [`Bulk::add`] needs).
    pub fn flush_policy(&self) -> FlushPolicy {
        self.core.flush
    }

    /// Installs `bulk` as archive segments, with `answers` (idempotency records) in the same
    /// manifest (see the module's note on concurrent writers).
    pub fn install(&self, bulk: Bulk, answers: Vec<IdemRecord>) -> Result<FlushReport, StoreError> {
        let now = self.clock.now();
        // Memory to the archive first, so the install's segments can be marked flushed
        // through the last log record without hiding anything a replay would need.
        self.flush_everything()?;
        let _one = self
            .flush_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Under the write gate no batch is between its log append and its apply, so every
        // record before the first one memory still holds (`dirty`) is archived: the installed
        // segments may be marked flushed through the one before it. Writes in memory are
        // replayed as usual; a schema change after that point would hide the install's data
        // (its cutoff), so that one is refused.
        let seq = {
            let _gate = self
                .gate
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let first_dirty = self
                .core
                .dirty
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .values()
                .copied()
                .min();
            let seq = match first_dirty {
                Some(f) => f.saturating_sub(1),
                None => self.core.last_seq.load(std::sync::atomic::Ordering::SeqCst),
            };
            let cat = self.core.read_cat();
            let newest_cutoff = cat
                .ns
                .iter()
                .flat_map(|e| e.cutoffs.values())
                .map(|c| c.all.max(c.subtotals))
                .max()
                .unwrap_or(0);
            if newest_cutoff > seq {
                return Err(StoreError::unavailable(
                    "a schema changed during the bulk install; install again",
                ));
            }
            seq
        };
        // The answers go in the manifest the install publishes; if it fails, they come out
        // again (a later flush must not publish answers for counts that are not there).
        let keys: Vec<String> = answers.iter().map(|r| r.key.clone()).collect();
        {
            let mut idem = self
                .core
                .idem
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for r in answers {
                idem.insert(r.key.clone(), r);
            }
        }
        let policy = self.core.flush;
        let mut parts: BTreeMap<(i64, i64), Records> = BTreeMap::new();
        let mut chosen = Vec::new();
        for (c, records) in bulk.into_parts(&policy) {
            parts.insert((c.res, c.period), records);
            chosen.push(c);
        }
        let done = self.write_and_publish(&chosen, seq, now, &mut |c| {
            Ok(parts.remove(&(c.res, c.period)).unwrap_or_default())
        });
        if done.is_err() {
            let mut idem = self
                .core
                .idem
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for k in &keys {
                idem.remove(k);
            }
        }
        done
    }
}

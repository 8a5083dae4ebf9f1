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

use std::collections::HashMap;

use tally_core::model::Schema;
use tally_core::store::{IdemRecord, Increment, StoreError};

use crate::archive::FlushPolicy;
use crate::engine::Engine;
use crate::flush::{Chosen, FlushReport, Sink};
use crate::segment::{DimRecord, KeyRecord};

type Fast = foldhash::fast::FixedState;
type Map<K, V> = HashMap<K, V, Fast>;

/// A key of a [`Bulk`] (`namespace`, `key`), as [`Bulk::key`] numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(u32);

/// A subtotal of a [`Bulk`] (`dimension`, `value`), as [`Bulk::sub`] numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubId(u32);

/// One counter: a key's total (`sub` 0) or subtotal (`sub` = [`SubId`] + 1) in the bucket
/// `idx` (start / resolution) of the tier of `res` seconds. 16 bytes, so an entry of the
/// counts map is 24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Slot {
    res: u32,
    key: u32,
    sub: u32,
    idx: u32,
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

/// Counters to install: keys and subtotals numbered once (`namespace \0 key`, `dimension \0
/// value`: neither part holds a NUL), and one flat map from (resolution, key, subtotal,
/// bucket) to the count — an event costs one lookup per counter it adds to, with no
/// allocation once its key and values have been seen.
#[derive(Debug, Default)]
pub struct Bulk {
    key_ids: Map<Box<str>, u32>,
    keys: Vec<Box<str>>,
    sub_ids: Map<Box<str>, u32>,
    subs: Vec<Box<str>>,
    counts: Map<Slot, i64>,
    /// Bytes of the names above (each held twice).
    name_bytes: usize,
    /// See [`Bulk::set_budget`].
    budget: usize,
    /// Reused to build lookup names without allocating.
    scratch: String,
}

/// Heap bytes per entry of a map beyond its key and value (a control byte and the spare
/// capacity at hashbrown's 7/8 load): an estimate, so `--memory-mb` bounds the aggregate to
/// within a small factor, not exactly.
const NAME_OVERHEAD: usize = 2 * 16 + 8;

impl Bulk {
    /// Counters held (each one (series, bucket)).
    pub fn counters(&self) -> usize {
        self.counts.len()
    }

    /// Bounds the counters' table and the names: [`Bulk::has_room`] answers `false` once
    /// adding would make them grow past `bytes` — counting the moment of growth, when the old
    /// table and the new one (twice as large) are both held. 0: no bound.
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
    }

    /// Whether `more` counters fit within the budget (see [`Bulk::set_budget`]), the names
    /// held counted too.
    pub fn has_room(&self, more: usize) -> bool {
        if self.budget == 0 {
            return true;
        }
        let now = self.table_bytes() + self.name_bytes;
        if self.counts.len() + more <= self.counts.capacity() {
            return now <= self.budget;
        }
        // Growing: hashbrown doubles its buckets (a power of two, filled to 7/8) until the
        // counters fit, holding the old table until the new one is filled.
        let per = std::mem::size_of::<(Slot, i64)>() + 1;
        let need = ((self.counts.len() + more) * 8 / 7 + 1).next_power_of_two() * per;
        now + need <= self.budget
    }

    fn table_bytes(&self) -> usize {
        let per = std::mem::size_of::<(Slot, i64)>() + 1;
        if self.counts.capacity() == 0 {
            return 0;
        }
        (self.counts.capacity() * 8 / 7).next_power_of_two() * per
    }

    /// Estimated heap bytes held (the counters' table at its size, and the names).
    pub fn bytes(&self) -> usize {
        self.table_bytes() + self.name_bytes
    }

    /// Estimated heap bytes of the names (kept by [`Bulk::take`]).
    pub fn name_bytes(&self) -> usize {
        self.name_bytes
    }

    /// Whether no counter is held (the names may be).
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The number of `key` of `ns`, given on first use.
    pub fn key(&mut self, ns: &str, key: &str) -> KeyId {
        let (ids, names) = (&mut self.key_ids, &mut self.keys);
        KeyId(intern(
            ids,
            names,
            &mut self.name_bytes,
            &mut self.scratch,
            ns,
            key,
        ))
    }

    /// The number of the subtotal (`dim`, `value`), given on first use.
    pub fn sub(&mut self, dim: &str, value: &str) -> SubId {
        let (ids, names) = (&mut self.sub_ids, &mut self.subs);
        SubId(intern(
            ids,
            names,
            &mut self.name_bytes,
            &mut self.scratch,
            dim,
            value,
        ))
    }

    /// Adds `n` to `key`'s total (`sub` None) or subtotal in the bucket starting at
    /// `start` (a multiple of `res`) of the tier of `res` seconds.
    #[inline]
    pub fn add_to(&mut self, key: KeyId, sub: Option<SubId>, res: i64, start: i64, n: i64) {
        let slot = Slot {
            res: res as u32,
            key: key.0,
            sub: sub.map_or(0, |s| s.0 + 1),
            idx: (start / res) as u32,
        };
        // (Not `entry`: whether the compiler inlines it into this hot loop varies from build
        // to build, and costs twice the time when it does not; a miss probes twice, in the
        // cache lines the first probe brought in.)
        match self.counts.get_mut(&slot) {
            Some(c) => *c += n,
            None => {
                self.counts.insert(slot, n);
            }
        }
    }

    /// Adds one increment under `schema` (its namespace's), as the engine's write path would
    /// count it: every tier, subtotals in breakdown tiers, nothing a tier's retention no
    /// longer shows at `now`.
    pub fn add(&mut self, schema: &Schema, inc: &Increment, now: i64) {
        let key = self.key(inc.ns.as_str(), inc.key.as_str());
        let subs: Vec<SubId> = inc
            .subtotals
            .iter()
            .map(|s| self.sub(&s.dim, &s.value))
            .collect();
        for tier in schema.tiers() {
            let res = tier.resolution.secs_i64();
            let start = inc.ts.div_euclid(res) * res;
            if !tier.retention.keeps_bucket(start, tier.resolution, now) {
                continue;
            }
            self.add_to(key, None, res, start, inc.n);
            if schema.is_breakdown(tier.resolution) {
                for s in &subs {
                    self.add_to(key, Some(*s), res, start, inc.n);
                }
            }
        }
    }

    /// Adds `n` to one stored counter (see [`Counter`]). For a rebuild, which subtracts what
    /// a range holds: no retention is applied.
    pub fn add_counter(&mut self, at: &Counter<'_>, n: i64) {
        let key = self.key(at.ns, at.key);
        let sub = at.sub.map(|(dim, value)| self.sub(dim, value));
        self.add_to(key, sub, at.res, at.start, n);
    }

    /// Moves the counters out into a new `Bulk` (with a copy of the names), keeping the
    /// names here: the numbers given so far stay valid for what is added next.
    pub fn take(&mut self) -> Bulk {
        Bulk {
            key_ids: self.key_ids.clone(),
            keys: self.keys.clone(),
            sub_ids: self.sub_ids.clone(),
            subs: self.subs.clone(),
            counts: std::mem::take(&mut self.counts),
            name_bytes: self.name_bytes,
            budget: 0,
            scratch: String::new(),
        }
    }

    /// The counters in the order segments are written (zero counts left out), cut into the
    /// periods to write.
    fn into_sorted(self, policy: &FlushPolicy) -> Sorted {
        // Keys and subtotals ranked by their names' bytes: `ns \0 key` sorts as segments
        // want keys, `dim \0 value` as records want dimensions and values.
        let rank = |names: &[Box<str>]| -> (Vec<u32>, Vec<u32>) {
            let mut by_rank: Vec<u32> = (0..names.len() as u32).collect();
            by_rank.sort_unstable_by(|a, b| {
                names[*a as usize]
                    .as_bytes()
                    .cmp(names[*b as usize].as_bytes())
            });
            let mut rank_of = vec![0u32; names.len()];
            for (r, id) in by_rank.iter().enumerate() {
                rank_of[*id as usize] = r as u32;
            }
            (by_rank, rank_of)
        };
        let (keys_by_rank, key_rank) = rank(&self.keys);
        let (subs_by_rank, sub_rank) = rank(&self.subs);
        let mut resolutions: Vec<u32> = Vec::new();
        let mut counts: Vec<Entry> = Vec::with_capacity(self.counts.len());
        for (slot, n) in self.counts {
            if n == 0 {
                continue;
            }
            let r = match resolutions.iter().position(|r| *r == slot.res) {
                Some(r) => r,
                None => {
                    resolutions.push(slot.res);
                    resolutions.len() - 1
                }
            };
            let res = i64::from(slot.res);
            let len = policy.period_len(res);
            let period = policy.period_of(res, i64::from(slot.idx) * res) / len;
            let sub = match slot.sub {
                0 => 0,
                s => u64::from(sub_rank[s as usize - 1]) + 1,
            };
            counts.push(Entry {
                hi: ((r as u64) << 56)
                    | ((period as u64) << 32)
                    | u64::from(key_rank[slot.key as usize]),
                lo: (sub << 32) | u64::from(slot.idx),
                n,
            });
        }
        // Resolutions ranked in order, so parts come out by (resolution, period).
        let mut sorted_res = resolutions.clone();
        sorted_res.sort_unstable();
        let res_rank: Vec<u64> = resolutions
            .iter()
            .map(|r| sorted_res.iter().position(|x| x == r).unwrap_or(0) as u64)
            .collect();
        for e in &mut counts {
            let r = (e.hi >> 56) as usize;
            e.hi = (e.hi & ((1 << 56) - 1)) | (res_rank[r] << 56);
        }
        counts.sort_unstable_by_key(|e| (e.hi, e.lo));
        let mut parts = Vec::new();
        let mut at = 0;
        while let Some(first) = counts.get(at) {
            let part = first.hi >> 32;
            let len = counts[at..]
                .iter()
                .take_while(|e| e.hi >> 32 == part)
                .count();
            let res = i64::from(sorted_res[(part >> 24) as usize]);
            let period_len = policy.period_len(res);
            let chosen = Chosen {
                slot: 0,
                res,
                period: (part & ((1 << 24) - 1)) as i64 * period_len,
                len: period_len,
            };
            parts.push((chosen, at..at + len));
            at += len;
        }
        Sorted {
            counts,
            parts,
            keys: self.keys,
            keys_by_rank,
            subs: self.subs,
            subs_by_rank,
        }
    }
}

/// One counter, packed so that sorting by (`hi`, `lo`) gives segments' order: resolution rank
/// (8 bits), period number (24; period start / period length), key rank (32) | subtotal rank
/// + 1, or 0 for the total (32), bucket index (32).
#[derive(Debug, Clone, Copy)]
struct Entry {
    hi: u64,
    lo: u64,
    n: i64,
}

/// A [`Bulk`]'s counters sorted for writing (see [`Bulk::into_sorted`]).
struct Sorted {
    counts: Vec<Entry>,
    parts: Vec<(Chosen, std::ops::Range<usize>)>,
    keys: Vec<Box<str>>,
    keys_by_rank: Vec<u32>,
    subs: Vec<Box<str>>,
    subs_by_rank: Vec<u32>,
}

impl Sorted {
    /// Hands the records of the part `range` of `counts` to `sink`, keys in order.
    fn feed(&self, range: std::ops::Range<usize>, sink: &mut Sink<'_>) -> Result<(), StoreError> {
        let counts = &self.counts[range];
        let mut at = 0;
        while let Some(first) = counts.get(at) {
            let run = counts[at..].iter().take_while(|e| e.hi == first.hi).count();
            let key_rank = (first.hi & 0xffff_ffff) as usize;
            let name = &self.keys[self.keys_by_rank[key_rank] as usize];
            let (ns, key) = name.split_once('\0').unwrap_or((name, ""));
            let mut rec = KeyRecord::default();
            let mut last_sub = 0u64;
            for e in &counts[at..at + run] {
                let (sub, idx) = (e.lo >> 32, e.lo as u32);
                if sub == 0 {
                    rec.totals.push((idx, e.n));
                    continue;
                }
                if sub != last_sub {
                    last_sub = sub;
                    let name = &self.subs[self.subs_by_rank[sub as usize - 1] as usize];
                    let (dim, value) = name.split_once('\0').unwrap_or((name, ""));
                    match rec.dims.last_mut() {
                        Some(d) if d.dim == dim => d.values.push((value.to_owned(), Vec::new())),
                        _ => rec.dims.push(DimRecord {
                            dim: dim.to_owned(),
                            values: vec![(value.to_owned(), Vec::new())],
                        }),
                    }
                }
                if let Some((_, buckets)) = rec.dims.last_mut().and_then(|d| d.values.last_mut()) {
                    buckets.push((idx, e.n));
                }
            }
            sink(ns, key, rec)?;
            at += run;
        }
        Ok(())
    }
}

/// The number of the name `a \0 b` in (`ids`, `names`), given on first use (built in
/// `scratch`: no allocation for a name seen before).
fn intern(
    ids: &mut Map<Box<str>, u32>,
    names: &mut Vec<Box<str>>,
    bytes: &mut usize,
    scratch: &mut String,
    a: &str,
    b: &str,
) -> u32 {
    scratch.clear();
    scratch.push_str(a);
    scratch.push('\0');
    scratch.push_str(b);
    if let Some(id) = ids.get(scratch.as_str()) {
        return *id;
    }
    let id = names.len() as u32;
    *bytes += 2 * scratch.len() + NAME_OVERHEAD;
    names.push(scratch.as_str().into());
    ids.insert(scratch.as_str().into(), id);
    id
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
                        sum_subtotals: false,
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
                            bulk.add_counter(&at(start, None), -n);
                            held += 1;
                        }
                    }
                    for sub in &d.subtotals {
                        for &(start, n) in &sub.buckets {
                            if n != 0 {
                                bulk.add_counter(&at(start, Some((&sub.dim, &sub.value))), -n);
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
        let sorted = bulk.into_sorted(&policy);
        let chosen: Vec<Chosen> = sorted.parts.iter().map(|(c, _)| *c).collect();
        // An install has the machine to itself: a segment writer per core.
        let workers = std::thread::available_parallelism().map_or(1, usize::from);
        let feed = |c: &Chosen, sink: &mut Sink<'_>| match sorted
            .parts
            .iter()
            .find(|(p, _)| (p.res, p.period) == (c.res, c.period))
        {
            Some((_, range)) => sorted.feed(range.clone(), sink),
            None => Ok(()),
        };
        let done = self.write_and_publish(&chosen, seq, now, &feed, workers);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget stops the table before it doubles past it, counting both tables of the move.
    #[test]
    fn a_budget_stops_the_table_before_it_grows_past_it() {
        let mut b = Bulk::default();
        assert!(b.has_room(1_000_000), "no budget, no bound");
        b.set_budget(1 << 20);
        let k = b.key("ns", "k");
        let mut added = 0u32;
        while b.has_room(1) {
            b.add_to(k, None, 1, i64::from(added), 1);
            added += 1;
        }
        assert!(b.counters() > 10_000, "{}", b.counters());
        let per = std::mem::size_of::<(Slot, i64)>() + 1;
        // Growing now would hold the table and one twice its size.
        assert!(3 * b.bytes() > 1 << 20);
        assert!(b.bytes() <= (1 << 20) * 2 / 3 + per, "{}", b.bytes());
    }

    /// Taken counters keep their names; later additions by name find the same numbers.
    #[test]
    fn taking_keeps_names_and_numbers() {
        let mut b = Bulk::default();
        let k = b.key("ns", "k");
        let s = b.sub("country", "US");
        b.add_to(k, Some(s), 3600, 7200, 2);
        let mut taken = b.take();
        assert!(b.is_empty() && !taken.is_empty());
        assert_eq!(b.key("ns", "k"), k);
        assert_eq!(taken.key("ns", "k"), k);
        assert_eq!(taken.sub("country", "US"), s);
        taken.add_counter(
            &Counter {
                ns: "ns",
                key: "k",
                res: 3600,
                start: 7200,
                sub: Some(("country", "US")),
            },
            -2,
        );
        taken.add_counter(
            &Counter {
                ns: "ns",
                key: "a",
                res: 3600,
                start: 0,
                sub: None,
            },
            5,
        );
        let policy = FlushPolicy::default();
        let sorted = taken.into_sorted(&policy);
        // The zero is left out; one part, one key.
        assert_eq!(sorted.parts.len(), 1);
        let mut got = Vec::new();
        sorted
            .feed(sorted.parts[0].1.clone(), &mut |ns, key, rec| {
                got.push((ns.to_owned(), key.to_owned(), rec));
                Ok(())
            })
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0.as_str(), got[0].1.as_str()), ("ns", "a"));
        assert_eq!(got[0].2.totals, vec![(0, 5)]);
    }

    /// Records come out as segments want them: keys by bytes, dimensions by name, values by
    /// bytes, buckets in order, one part per (resolution, period).
    #[test]
    fn records_come_out_in_segment_order() {
        let mut b = Bulk::default();
        for (key, dim, value, start) in [
            ("b", "referrer", "x.com", 3600),
            ("a", "referrer", "b.com", 0),
            ("a", "country", "US", 3600),
            ("a", "country", "DE", 0),
            ("a", "country", "US", 0),
            ("a\u{e9}", "country", "FR", 0),
        ] {
            let k = b.key("clicks", key);
            let s = b.sub(dim, value);
            b.add_to(k, None, 3600, start, 1);
            b.add_to(k, Some(s), 3600, start, 1);
            b.add_to(k, None, 60, start, 1);
        }
        let policy = FlushPolicy::default();
        let sorted = b.into_sorted(&policy);
        let parts: Vec<(i64, i64)> = sorted
            .parts
            .iter()
            .map(|(c, _)| (c.res, c.period))
            .collect();
        // (Minute buckets in periods of an hour, hourly ones of a day.)
        assert_eq!(parts, vec![(60, 0), (60, 3600), (3600, 0)]);
        let mut got = Vec::new();
        sorted
            .feed(sorted.parts[2].1.clone(), &mut |_, key, rec| {
                got.push((key.to_owned(), rec));
                Ok(())
            })
            .unwrap();
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["a", "a\u{e9}", "b"]);
        let a = &got[0].1;
        assert_eq!(a.totals, vec![(0, 3), (1, 1)]);
        let dims: Vec<String> = a
            .dims
            .iter()
            .map(|d| {
                let values: Vec<String> =
                    d.values.iter().map(|(v, b)| format!("{v}={b:?}")).collect();
                format!("{}: {}", d.dim, values.join(" "))
            })
            .collect();
        assert_eq!(
            dims,
            vec![
                "country: DE=[(0, 1)] US=[(0, 1), (1, 1)]",
                "referrer: b.com=[(0, 1)]"
            ]
        );
    }
}

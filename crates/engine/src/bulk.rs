//! Bulk install (`tally load --data`): counters aggregated outside the write path, written
//! straight into archive segments and published in one manifest — no log record, no memtable.
//!
//! [`Bulk`] gathers validated increments as counter updates, appended to the part — the
//! (resolution, period) a segment will hold — they belong to, keeping only the buckets a
//! tier's retention still shows. Appending is sequential whatever the keys, so adding an
//! event costs no cache miss into a large table; the updates of one counter are merged when a
//! part is sorted: for the install, or earlier when the updates fill the budget
//! ([`Bulk::has_room`] merges in place first). [`Engine::install`] then flushes whatever memory
//! holds, sorts each part and writes it as one segment — a delta where the period is archived
//! already — on every core, flushed through the last log record, and publishes them with the
//! given idempotency answers, atomically: after a crash the directory holds all of an install
//! or none of it.
//!
//! Safe beside writers: the installed segments are marked flushed through the record before
//! the first one memory still holds (read under the write gate), so every record they claim
//! is archived already, and writes still in memory are replayed as usual.
//!
//! [`Engine::rebuild_bulk`] (a rebuild, `tally load --replace`) adds to a [`Bulk`] of the new
//! counts the negation of what the range holds now, read through the store as queries read
//! it, and installs the difference: readers see the old counts or the new, never a mix.

use std::sync::Mutex;

use tally_core::model::Schema;
use tally_core::store::{IdemRecord, Increment, StoreError};

use crate::archive::FlushPolicy;
use crate::engine::Engine;
use crate::flush::{Chosen, FlushReport, Sink};
use crate::segment::{DimRecord, KeyRecord};

use crate::seeded::Map;

/// A key of a [`Bulk`] (`namespace`, `key`), as [`Bulk::key`] numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(u32);

/// A subtotal of a [`Bulk`] (`dimension`, `value`), as [`Bulk::sub`] numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubId(u32);

/// One counter update: `n` to a key's total (`sub` 0) or subtotal (`sub` = [`SubId`] + 1) in
/// the bucket `idx` (start / resolution) of its part's tier. 24 bytes; a part holds it in 16
/// ([`Held`]). For the install, `key` and `sub` become ranks (see [`Bulk::take_parts`]), so
/// sorting by (`key`, `sub`, `idx`) gives a segment's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Update {
    key: u32,
    sub: u32,
    idx: u32,
    n: i64,
}

impl Update {
    /// What identifies its counter within a part, as one sortable number.
    #[inline]
    fn counter(&self) -> (u64, u32) {
        ((u64::from(self.key) << 32) | u64::from(self.sub), self.idx)
    }
}

/// An update as a part holds it: its amount in 32 bits. One whose amount does not fit (an
/// amount or a merged sum past ±2^31: rare) is held aside whole ([`Part::wide`]).
#[derive(Debug, Clone, Copy)]
struct Held {
    key: u32,
    sub: u32,
    idx: u32,
    n: i32,
}

impl Held {
    #[inline]
    fn of(u: &Update) -> Option<Held> {
        Some(Held {
            key: u.key,
            sub: u.sub,
            idx: u.idx,
            n: i32::try_from(u.n).ok()?,
        })
    }

    #[inline]
    fn update(&self) -> Update {
        Update {
            key: self.key,
            sub: self.sub,
            idx: self.idx,
            n: i64::from(self.n),
        }
    }
}

/// Updates per block of a part, at most (64 KiB): a part grows a block at a time, never
/// copying what it holds. Its first blocks are smaller (each as large as the part so far, from
/// [`FIRST_BLOCK`]), so that many small parts — a long backfill touches a part per day — do
/// not each hold a mostly empty 64 KiB.
const BLOCK: usize = 4096;
const FIRST_BLOCK: usize = 16;

/// Bytes of one update, whole and as a part holds it.
const UPDATE: usize = std::mem::size_of::<Update>();
const HELD: usize = std::mem::size_of::<Held>();
/// Bytes a part takes beyond its updates (itself, and its entry in the map of parts).
const PART: usize = std::mem::size_of::<Part>() + 32;

/// The updates of one (resolution, period), in blocks.
#[derive(Debug)]
struct Part {
    res: u32,
    period: i64,
    blocks: Vec<Vec<Held>>,
    /// Updates whose amount needs 64 bits.
    wide: Vec<Update>,
    /// Updates held (in blocks and aside).
    len: usize,
    /// Updates already merged (one per counter, none zero): when all are, merging again
    /// would change nothing.
    merged: usize,
}

impl Part {
    fn new(res: u32, period: i64) -> Part {
        Part {
            res,
            period,
            blocks: Vec::new(),
            wide: Vec::new(),
            len: 0,
            merged: 0,
        }
    }

    /// Appends `u`; answers the bytes it had to allocate (a block, mostly 0).
    #[inline]
    fn push(&mut self, u: Update) -> usize {
        self.len += 1;
        let Some(h) = Held::of(&u) else {
            let before = self.wide.capacity();
            self.wide.push(u);
            return (self.wide.capacity() - before) * UPDATE;
        };
        if let Some(b) = self.blocks.last_mut()
            && b.len() < b.capacity()
        {
            b.push(h);
            return 0;
        }
        let cap = self.len.clamp(FIRST_BLOCK, BLOCK);
        let mut b = Vec::with_capacity(cap);
        b.push(h);
        self.blocks.push(b);
        cap * HELD
    }

    fn bytes(&self) -> usize {
        let blocks: usize = self.blocks.iter().map(|b| b.capacity() * HELD).sum();
        blocks + self.wide.capacity() * UPDATE
    }

    /// Bytes of the block its next update would start (0 while its last block has room).
    #[inline]
    fn next_block(&self) -> usize {
        match self.blocks.last() {
            Some(b) if b.len() < b.capacity() => 0,
            _ => (self.len + 1).clamp(FIRST_BLOCK, BLOCK) * HELD,
        }
    }

    /// Moves every update into `all` (emptied first; blocks freed as they are copied).
    /// Sorting copies a part once: into a buffer reused from part to part, so that memory
    /// freed by one part's blocks is what the next part's blocks reuse, rather than a fresh
    /// vector per part beside it.
    fn take_into(&mut self, all: &mut Vec<Update>) {
        all.clear();
        // (Exactly: a reused buffer grows to the largest part, not to twice it.)
        all.reserve_exact(self.len);
        for b in self.blocks.drain(..) {
            all.extend(b.iter().map(Held::update));
        }
        all.append(&mut self.wide);
        self.wide = Vec::new();
        self.len = 0;
        self.merged = 0;
    }

    /// Merges its updates (through `scratch`): one per counter, sorted, zeros left out.
    fn merge(&mut self, scratch: &mut Vec<Update>) {
        if self.merged == self.len {
            return;
        }
        self.take_into(scratch);
        sort_and_merge(scratch);
        for c in scratch.chunks(BLOCK) {
            let mut b = Vec::with_capacity(c.len());
            for u in c {
                match Held::of(u) {
                    Some(h) => b.push(h),
                    None => self.wide.push(*u),
                }
            }
            self.blocks.push(b);
        }
        self.len = scratch.len();
        self.merged = scratch.len();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sorts `all` by counter and sums each counter's updates into one, leaving out zero sums.
fn sort_and_merge(all: &mut Vec<Update>) {
    all.sort_unstable_by_key(Update::counter);
    let mut w = 0usize;
    for r in 0..all.len() {
        let u = all[r];
        if w > 0 && all[w - 1].counter() == u.counter() {
            all[w - 1].n = all[w - 1].n.wrapping_add(u.n);
        } else {
            all[w] = u;
            w += 1;
        }
    }
    all.truncate(w);
    all.retain(|u| u.n != 0);
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
/// value`: neither part holds a NUL), and per (resolution, period) the updates to its
/// counters — an event costs one append per counter it adds to, with no allocation once its
/// key and values have been seen (beyond a block now and then).
#[derive(Debug, Default)]
pub struct Bulk {
    key_ids: Map<Box<str>, u32>,
    keys: Vec<Box<str>>,
    sub_ids: Map<Box<str>, u32>,
    subs: Vec<Box<str>>,
    /// How periods are cut (the engine's, see [`Bulk::set_policy`]).
    policy: FlushPolicy,
    parts: Vec<Part>,
    part_ids: Map<(u32, i64), u32>,
    /// The part the last update went to: (resolution, period, index).
    last: Option<(u32, i64, u32)>,
    /// Updates held, those not merged yet, the bytes of the parts' blocks, and of the blocks
    /// their next updates would start (see [`Bulk::fits`]).
    updates: usize,
    fresh: usize,
    block_bytes: usize,
    next_bytes: usize,
    /// Bytes of the names above (each held twice).
    name_bytes: usize,
    /// See [`Bulk::set_budget`]: the bound, and how many parts may be sorted at once.
    budget: usize,
    sorters: usize,
    /// Reused to build lookup names without allocating.
    scratch: String,
}

/// Heap bytes per entry of a map beyond its key and value (a control byte and the spare
/// capacity at hashbrown's 7/8 load): an estimate, so `--memory-mb` bounds the aggregate to
/// within a small factor, not exactly.
const NAME_OVERHEAD: usize = 2 * 16 + 8;

impl Bulk {
    /// Counter updates held: at least as many as the counters (each one (series, bucket))
    /// they add to, as many once merged.
    pub fn counters(&self) -> usize {
        self.updates
    }

    /// Cuts parts as `policy` cuts periods: the engine's ([`Engine::flush_policy`]), so an
    /// install writes each part as it is (with another, the install cuts them again).
    pub fn set_policy(&mut self, policy: FlushPolicy) {
        if !self.same_periods(&policy) {
            self.repartition(policy);
        }
    }

    fn same_periods(&self, p: &FlushPolicy) -> bool {
        (self.policy.hourly_period, self.policy.fine_period) == (p.hourly_period, p.fine_period)
    }

    /// Moves every update to the part `policy` puts it in.
    fn repartition(&mut self, policy: FlushPolicy) {
        let old = std::mem::take(&mut self.parts);
        self.policy = policy;
        self.forget_parts();
        for mut part in old {
            let res = part.res;
            let mut all = Vec::new();
            part.take_into(&mut all);
            for u in all {
                self.push(res, u);
            }
        }
    }

    /// Bounds what is held: [`Bulk::has_room`] answers `false` once adding would take the
    /// updates' blocks and the names past `bytes`, keeping room for sorting (see
    /// `fits`: sorting copies a part once, and an install sorts a part per core).
    /// 0: no bound.
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
        self.sorters = std::thread::available_parallelism().map_or(1, usize::from);
    }

    /// Whether `more` updates, which may open up to `parts` new parts (see
    /// [`Bulk::periods_within`]), fit within the budget (see [`Bulk::set_budget`]). When
    /// they do not, the updates held are merged first (one per counter), and they fit if that
    /// left the budget at least half free — so the same updates are not merged over and over.
    pub fn has_room(&mut self, more: usize, parts: usize) -> bool {
        if self.budget == 0 {
            return true;
        }
        if self.fits(more, parts) {
            return true;
        }
        if self.fresh == 0 {
            return false;
        }
        let largest = self.parts.iter().map(|p| p.len).max().unwrap_or(0);
        let mut scratch = Vec::with_capacity(largest);
        for part in &mut self.parts {
            part.merge(&mut scratch);
        }
        drop(scratch);
        self.updates = self.parts.iter().map(|p| p.len).sum();
        self.block_bytes = self.parts.iter().map(Part::bytes).sum();
        self.next_bytes = self.parts.iter().map(Part::next_block).sum();
        self.fresh = 0;
        self.bytes() <= self.budget / 2 && self.fits(more, parts)
    }

    /// How many periods of the tier of `res` seconds the times `from..=to` touch: a bound on
    /// the parts updates between them can open there.
    pub fn periods_within(&self, res: i64, from: i64, to: i64) -> usize {
        let (a, b) = (
            self.policy.period_of(res, from),
            self.policy.period_of(res, to),
        );
        (b.saturating_sub(a) / self.policy.period_len(res)).unsigned_abs() as usize + 1
    }

    /// Whether `more` updates fit beside what is held: their own bytes, a new block for every
    /// part whose last block is full (all of them may get one), and room to sort — a copy of
    /// each of the largest parts, one per core (an install's writers each reuse a buffer as
    /// large as the largest part they sorted), and of `more`; and each of `parts` new parts
    /// with its first block.
    fn fits(&self, more: usize, parts: usize) -> bool {
        let mut lens: Vec<usize> = self.parts.iter().map(|p| p.len).collect();
        let k = self.sorters.clamp(1, lens.len().max(1));
        let largest = if lens.len() > k {
            lens.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            &lens[..k]
        } else {
            &lens[..]
        };
        let sort = (largest.iter().sum::<usize>() + more) * UPDATE;
        let grow = more * HELD + self.next_bytes + parts * (PART + FIRST_BLOCK * HELD);
        self.bytes() + grow + sort <= self.budget
    }

    /// Estimated heap bytes held (the parts and their updates' blocks, and the names).
    pub fn bytes(&self) -> usize {
        self.block_bytes + self.parts.len() * PART + self.name_bytes
    }

    /// Estimated heap bytes of the names (kept by [`Bulk::take`]).
    pub fn name_bytes(&self) -> usize {
        self.name_bytes
    }

    /// Whether no counter update is held (the names may be).
    pub fn is_empty(&self) -> bool {
        self.updates == 0
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
        let u = Update {
            key: key.0,
            sub: sub.map_or(0, |s| s.0 + 1),
            idx: (start / res) as u32,
            n,
        };
        self.push(res as u32, u);
    }

    #[inline]
    fn push(&mut self, res: u32, u: Update) {
        let r = i64::from(res);
        let period = self.policy.period_of(r, i64::from(u.idx) * r);
        let at = match self.last {
            Some((lr, lp, at)) if (lr, lp) == (res, period) => at,
            _ => {
                let at = match self.part_ids.get(&(res, period)) {
                    Some(at) => *at,
                    None => {
                        let at = self.parts.len() as u32;
                        let part = Part::new(res, period);
                        self.next_bytes += part.next_block();
                        self.parts.push(part);
                        self.part_ids.insert((res, period), at);
                        at
                    }
                };
                self.last = Some((res, period, at));
                at
            }
        };
        let part = &mut self.parts[at as usize];
        let next = part.next_block();
        self.block_bytes += part.push(u);
        self.next_bytes = self.next_bytes - next + part.next_block();
        self.updates += 1;
        self.fresh += 1;
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
        let taken = Bulk {
            key_ids: self.key_ids.clone(),
            keys: self.keys.clone(),
            sub_ids: self.sub_ids.clone(),
            subs: self.subs.clone(),
            policy: self.policy,
            parts: std::mem::take(&mut self.parts),
            part_ids: std::mem::take(&mut self.part_ids),
            last: None,
            updates: self.updates,
            fresh: self.fresh,
            block_bytes: self.block_bytes,
            next_bytes: self.next_bytes,
            name_bytes: self.name_bytes,
            budget: 0,
            sorters: 0,
            scratch: String::new(),
        };
        self.forget_parts();
        taken
    }

    /// Drops the parts' bookkeeping (their updates were moved out).
    fn forget_parts(&mut self) {
        self.parts.clear();
        self.part_ids.clear();
        self.last = None;
        self.updates = 0;
        self.fresh = 0;
        self.block_bytes = 0;
        self.next_bytes = 0;
    }

    /// The parts to write (moved out: this keeps its names, and the numbers it gave), in
    /// (resolution, period) order, cut as `policy` cuts periods, with the keys' and
    /// subtotals' ranks (their names' byte order) that their sorting uses.
    ///
    /// The periods of a finer-than-hourly tier in UTC days starting before `days_before`
    /// go in as one part a day: what compaction makes of them once the day has been over
    /// for an hour (`compaction::choose`), written so at once. A backfill of a year of a
    /// `30m:forever` tier otherwise wrote ~8 000 segments of an hour and compacted them 512
    /// at a time, 50 times slower than into `1h:forever` (found by a review).
    fn take_parts(&mut self, policy: &FlushPolicy, days_before: i64) -> Parts<'_> {
        self.set_policy(*policy);
        let mut taken = std::mem::take(&mut self.parts);
        self.forget_parts();
        let day = |p: &Part| p.period.div_euclid(86_400) * 86_400;
        // (Only where a fine period lies within one day.)
        let by_day = policy.fine_period <= 86_400 && 86_400 % policy.fine_period == 0;
        let into_days = |p: &Part| by_day && i64::from(p.res) < 3600 && day(p) < days_before;
        if taken.iter().any(into_days) {
            let mut days: std::collections::BTreeMap<(u32, i64), Part> = Default::default();
            let mut rest = Vec::with_capacity(taken.len());
            for mut p in taken {
                if !into_days(&p) {
                    rest.push(p);
                    continue;
                }
                let whole = days
                    .entry((p.res, day(&p)))
                    .or_insert_with(|| Part::new(p.res, day(&p)));
                whole.blocks.append(&mut p.blocks);
                whole.wide.append(&mut p.wide);
                whole.len += p.len;
                whole.merged = 0;
            }
            rest.extend(days.into_values());
            taken = rest;
        }
        // Keys and subtotals ranked by their names' bytes: `ns \0 key` sorts as segments
        // want keys, `dim \0 value` as records want dimensions and values.
        let (keys_by_rank, key_rank) = rank(&self.keys);
        let (subs_by_rank, sub_rank) = rank(&self.subs);
        taken.sort_unstable_by_key(|p| (p.res, p.period));
        let parts = taken
            .into_iter()
            .filter(|p| p.len > 0)
            .map(|p| {
                let res = i64::from(p.res);
                let len = if into_days(&p) {
                    86_400
                } else {
                    policy.period_len(res)
                };
                let chosen = Chosen {
                    slot: 0,
                    res,
                    period: p.period,
                    len,
                };
                (chosen, Mutex::new(p))
            })
            .collect();
        Parts {
            parts,
            buffers: Mutex::new(Vec::new()),
            keys_by_rank,
            key_rank,
            subs_by_rank,
            sub_rank,
        }
    }
}

/// Names ranked by their bytes (`ns \0 key` sorts as segments want keys, `dim \0 value` as
/// records want dimensions and values): the names by rank, each split in two once here (not
/// once per record), and each number's rank.
fn rank(names: &[Box<str>]) -> (Vec<(&str, &str)>, Vec<u32>) {
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
    let split = by_rank
        .iter()
        .map(|id| {
            let name = &*names[*id as usize];
            name.split_once('\0').unwrap_or((name, ""))
        })
        .collect();
    (split, rank_of)
}

/// A [`Bulk`]'s parts ready for writing (see [`Bulk::take_parts`]).
struct Parts<'a> {
    parts: Vec<(Chosen, Mutex<Part>)>,
    /// Sorting buffers, one per writer at work, reused from part to part.
    buffers: Mutex<Vec<Vec<Update>>>,
    /// Keys by rank, as (namespace, key), and each key number's rank.
    keys_by_rank: Vec<(&'a str, &'a str)>,
    key_rank: Vec<u32>,
    /// Subtotals by rank, as (dimension, value), and each subtotal number's rank.
    subs_by_rank: Vec<(&'a str, &'a str)>,
    sub_rank: Vec<u32>,
}

impl Parts<'_> {
    /// Sorts the part `i` (taking its updates: each part is fed once) and hands its records
    /// to `sink`, keys in order.
    fn feed(&self, i: usize, sink: &mut Sink<'_>) -> Result<(), StoreError> {
        let Some((_, part)) = self.parts.get(i) else {
            return Ok(());
        };
        let mut all = lock(&self.buffers).pop().unwrap_or_default();
        lock(part).take_into(&mut all);
        for u in &mut all {
            u.key = self.key_rank[u.key as usize];
            if u.sub != 0 {
                u.sub = self.sub_rank[u.sub as usize - 1] + 1;
            }
        }
        sort_and_merge(&mut all);
        let mut at = 0;
        while let Some(first) = all.get(at) {
            let run = all[at..].iter().take_while(|u| u.key == first.key).count();
            let (ns, key) = self.keys_by_rank[first.key as usize];
            sink(ns, key, self.record(&all[at..at + run]))?;
            at += run;
        }
        all.clear();
        lock(&self.buffers).push(all);
        Ok(())
    }

    /// One key's record from its merged updates (sorted: totals first, then by subtotal).
    fn record(&self, updates: &[Update]) -> KeyRecord {
        let totals = updates.iter().take_while(|u| u.sub == 0).count();
        let mut rec = KeyRecord {
            totals: updates[..totals].iter().map(|u| (u.idx, u.n)).collect(),
            dims: Vec::new(),
        };
        let mut at = totals;
        while let Some(first) = updates.get(at) {
            let run = updates[at..]
                .iter()
                .take_while(|u| u.sub == first.sub)
                .count();
            let buckets = updates[at..at + run].iter().map(|u| (u.idx, u.n)).collect();
            let (dim, value) = self.subs_by_rank[first.sub as usize - 1];
            match rec.dims.last_mut() {
                Some(d) if d.dim == dim => d.values.push((value.to_owned(), buckets)),
                _ => rec.dims.push(DimRecord {
                    dim: dim.to_owned(),
                    values: vec![(value.to_owned(), buckets)],
                }),
            }
            at += run;
        }
        rec
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
    /// held. Writes to the range meanwhile are replaced or kept on top, key by key, the same
    /// in every tier (see the comment in the loop).
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
            // A page's tiers are read at one point of the log (no batch applies meanwhile):
            // a write to the range during the rebuild is replaced if it came before its
            // key's page was read, kept on top if after — in every tier alike, so minutes
            // and hours still agree. Writers wait for one page's reads at most.
            let _cut = self.gate.write();
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
                        keep: None,
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
            // What the range holds is held in memory until the install: within the
            // budget `bulk` was given (none: no bound), or the rebuild stops, changing
            // nothing.
            if !bulk.has_room(0, 0) {
                return Err(StoreError::TooLarge {
                    what: format!(
                        "the range holds more than the rebuild's memory budget ({} MiB) \
                         after {held} counters: rebuild a shorter range",
                        bulk.budget >> 20
                    ),
                });
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
    pub fn install(
        &self,
        mut bulk: Bulk,
        answers: Vec<IdemRecord>,
    ) -> Result<FlushReport, StoreError> {
        self.install_from(&mut bulk, answers)
    }

    /// As [`Engine::install`], moving the counters out of `bulk`, which keeps its names (the
    /// numbers it gave stay valid for what is added next): the names are not copied.
    pub fn install_from(
        &self,
        bulk: &mut Bulk,
        answers: Vec<IdemRecord>,
    ) -> Result<FlushReport, StoreError> {
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
            let _gate = self.gate.write();
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
        // again (a later flush must not publish answers for counts that are not there), and
        // any answer they replaced comes back.
        let replaced: Vec<(String, Option<IdemRecord>)> = {
            let mut idem = self
                .core
                .idem
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            answers
                .into_iter()
                .map(|r| (r.key.clone(), idem.insert(&r)))
                .collect()
        };
        let policy = self.core.flush;
        // UTC days over for an hour, as compaction merges them (see `take_parts`).
        let parts = bulk.take_parts(&policy, (now - 3600).div_euclid(86_400) * 86_400);
        let chosen: Vec<Chosen> = parts.parts.iter().map(|(c, _)| *c).collect();
        // An install has the machine to itself: a segment writer per core, each sorting the
        // parts it writes.
        let workers = std::thread::available_parallelism().map_or(1, usize::from);
        let feed = |c: &Chosen, sink: &mut Sink<'_>| match parts
            .parts
            .iter()
            .position(|(p, _)| (p.res, p.period) == (c.res, c.period))
        {
            Some(i) => parts.feed(i, sink),
            None => Ok(()),
        };
        let done = self.write_and_publish(&chosen, seq, now, &feed, workers);
        if done.is_err() {
            let mut idem = self
                .core
                .idem
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (k, before) in replaced {
                match before {
                    Some(r) => {
                        idem.insert(&r);
                    }
                    None => idem.remove(&k),
                }
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record of every part, as (resolution, period, ns/key, record).
    fn records(mut b: Bulk, policy: &FlushPolicy) -> Vec<(i64, i64, String, KeyRecord)> {
        let parts = b.take_parts(policy, i64::MIN);
        let mut out = Vec::new();
        for (i, (c, _)) in parts.parts.iter().enumerate() {
            parts
                .feed(i, &mut |ns, key, rec| {
                    out.push((c.res, c.period, format!("{ns}/{key}"), rec));
                    Ok(())
                })
                .unwrap();
        }
        out
    }

    /// Updates fill the budget, get merged in place (one per counter) and keep coming; once
    /// merging leaves less than half the budget free, there is no more room — and what is
    /// held still installs every count.
    #[test]
    fn a_budget_merges_updates_then_stops() {
        let mut b = Bulk::default();
        assert!(b.has_room(1_000_000, 1_000), "no budget, no bound");
        let budget = 4 << 20;
        b.set_budget(budget);
        let keys: Vec<KeyId> = (0..50).map(|i| b.key("ns", &format!("k{i}"))).collect();
        // 50 keys × 40 hours: 2 000 counters, each added to many times.
        let mut added = 0u64;
        let mut merged = false;
        loop {
            let held = b.counters();
            if !b.has_room(1, 1) {
                break;
            }
            merged |= b.counters() < held;
            let i = added as usize;
            b.add_to(keys[i % 50], None, 3600, 3600 * ((i / 50) % 40) as i64, 1);
            added += 1;
            if added > 5_000_000 {
                break;
            }
        }
        assert!(merged, "the updates were never merged");
        assert!(added > 5_000_000, "repeats should keep fitting: {added}");
        assert!(b.bytes() <= budget, "{}", b.bytes());
        let got = records(b, &FlushPolicy::default());
        assert_eq!(got.len(), 2 * 50, "50 keys in two days");
        let total: u64 = got
            .iter()
            .flat_map(|(_, _, _, r)| r.totals.iter().map(|(_, n)| *n as u64))
            .sum();
        assert_eq!(total, added);

        // Distinct counters do not merge away: the budget stops them.
        let mut b = Bulk::default();
        b.set_budget(budget);
        let k = b.key("ns", "k");
        let mut added = 0u32;
        while b.has_room(1, 1) {
            b.add_to(k, None, 1, i64::from(added), 1);
            added += 1;
        }
        assert!(added > 10_000, "{added}");
        assert!(b.bytes() <= budget, "{}", b.bytes());
        let total: i64 = records(b, &FlushPolicy::default())
            .iter()
            .flat_map(|(_, _, _, r)| r.totals.iter().map(|(_, n)| *n))
            .sum();
        assert_eq!(total, i64::from(added));
    }

    /// Parts that fill their blocks together (a backfill sorted by key) would all start a
    /// new block on the next updates: the budget foresees it, so what is held stays within
    /// it, however many parts there are.
    #[test]
    fn the_budget_foresees_every_part_starting_a_block() {
        for days in [40i64, 400, 1300] {
            let budget = 16 << 20;
            let mut b = Bulk::default();
            b.set_budget(budget);
            let mut rounds = 0;
            // (A key per round: no update merges away.)
            while b.has_room(days as usize, days as usize) {
                let k = b.key("ns", &format!("k{rounds}"));
                for d in 0..days {
                    b.add_to(k, None, 3600, d * 86_400, 1);
                }
                rounds += 1;
                assert!(
                    b.bytes() <= budget,
                    "{days} days, round {rounds}: {}",
                    b.bytes()
                );
            }
            assert!(rounds >= 24, "{days} days: only {rounds} rounds");
        }
    }

    /// A sorting buffer reused from part to part grows to the largest part, not past it;
    /// and with many cores, an empty aggregate still takes a batch.
    #[test]
    fn sorting_buffers_are_as_large_as_the_largest_part() {
        let mut b = Bulk::default();
        let k = b.key("ns", "k");
        for (day, n) in [(0i64, 3000u32), (1, 3100)] {
            for i in 0..n {
                b.add_to(k, None, 60, day * 86_400 + i64::from(i) * 60, 1);
            }
        }
        let day = FlushPolicy {
            fine_period: 86_400,
            ..FlushPolicy::default()
        };
        let parts = b.take_parts(&day, i64::MIN);
        for i in 0..parts.parts.len() {
            parts.feed(i, &mut |_, _, _| Ok(())).unwrap();
        }
        let buffers = lock(&parts.buffers);
        assert_eq!(buffers.len(), 1);
        assert!(buffers[0].capacity() <= 3100, "{}", buffers[0].capacity());
        drop(buffers);

        let mut b = Bulk::default();
        b.set_budget(10 << 20);
        b.sorters = 32;
        assert!(b.has_room(30_000, 60), "an empty aggregate refuses a batch");
    }

    /// Updates that each open a new part (a day apart: a cheap way to make many small parts)
    /// are bounded too: the parts' own bytes and first blocks are foreseen.
    #[test]
    fn the_budget_foresees_the_parts_a_batch_opens() {
        let budget = 1 << 20;
        let mut b = Bulk::default();
        b.set_budget(budget);
        let k = b.key("ns", "k");
        let mut day = 0i64;
        let batch = 500;
        loop {
            let parts = b.periods_within(3600, day * 86_400, (day + batch - 1) * 86_400);
            assert_eq!(parts, batch as usize);
            if !b.has_room(batch as usize, parts) {
                break;
            }
            for _ in 0..batch {
                b.add_to(k, None, 3600, day * 86_400, 1);
                day += 1;
            }
            assert!(b.bytes() <= budget, "day {day}: {}", b.bytes());
        }
        assert!(day >= 1500, "only {day} days");
    }

    /// Amounts past 32 bits are held whole, and so are merged sums that outgrow 32 bits;
    /// sums that come back to zero are left out.
    #[test]
    fn amounts_past_32_bits_are_held_whole() {
        let mut b = Bulk::default();
        let k = b.key("ns", "k");
        let s = b.sub("country", "US");
        let big = 1i64 << 40;
        for _ in 0..3 {
            b.add_to(k, None, 3600, 0, i64::from(i32::MAX));
        }
        b.add_to(k, None, 3600, 3600, big);
        b.add_to(k, None, 3600, 3600, 5);
        b.add_to(k, Some(s), 3600, 0, big);
        b.add_to(k, Some(s), 3600, 0, -big);
        b.add_to(k, Some(s), 3600, 7200, i64::from(i32::MIN));
        b.add_to(k, Some(s), 3600, 7200, -1);
        assert_eq!(b.parts[0].wide.len(), 3);
        // Merged: bucket 0's total outgrows 32 bits, the subtotal in bucket 0 cancels out: three
        // counters, each held whole.
        let mut scratch = Vec::new();
        b.parts[0].merge(&mut scratch);
        assert_eq!((b.parts[0].len, b.parts[0].wide.len()), (3, 3));
        let got = records(b, &FlushPolicy::default());
        assert_eq!(got.len(), 1);
        let rec = &got[0].3;
        assert_eq!(rec.totals, vec![(0, 3 * i64::from(i32::MAX)), (1, big + 5)]);
        assert_eq!(rec.dims.len(), 1);
        assert_eq!(
            rec.dims[0].values,
            vec![("US".to_owned(), vec![(2, i64::from(i32::MIN) - 1)])]
        );
    }

    /// Parts cut by one policy are cut again by the install's, with the same records.
    #[test]
    fn another_policy_cuts_the_parts_again() {
        let fill = |b: &mut Bulk| {
            let k = b.key("ns", "k");
            let s = b.sub("country", "US");
            for h in 0..72 {
                b.add_to(k, None, 3600, h * 3600, h + 1);
                b.add_to(k, Some(s), 3600, h * 3600, 1);
                b.add_to(k, None, 60, h * 3600 + 60, 2);
            }
        };
        let day = FlushPolicy::default();
        let week = FlushPolicy {
            hourly_period: 7 * 86_400,
            fine_period: 86_400,
            ..day
        };
        let mut a = Bulk::default();
        fill(&mut a);
        let mut b = Bulk::default();
        b.set_policy(week);
        fill(&mut b);
        let got_a = records(a, &week);
        let got_b = records(b, &week);
        assert_eq!(
            got_a.len(),
            4,
            "one hourly part and three daily minute parts"
        );
        assert_eq!(format!("{got_a:?}"), format!("{got_b:?}"));
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
        let parts = taken.take_parts(&policy, i64::MIN);
        // The zero is left out; one part, one key.
        assert_eq!(parts.parts.len(), 1);
        let mut got = Vec::new();
        parts
            .feed(0, &mut |ns, key, rec| {
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
        let parts = b.take_parts(&policy, i64::MIN);
        let cut: Vec<(i64, i64)> = parts.parts.iter().map(|(c, _)| (c.res, c.period)).collect();
        // (Minute buckets in periods of an hour, hourly ones of a day.)
        assert_eq!(cut, vec![(60, 0), (60, 3600), (3600, 0)]);
        let mut got = Vec::new();
        parts
            .feed(2, &mut |_, key, rec| {
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

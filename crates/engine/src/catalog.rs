//! The catalog: namespaces with their schemas, and every string interned once — keys,
//! dimension names and values — mapped to the dense ids the counters are keyed by.
//!
//! A *series* is one counted quantity of one key: its total, or one (dimension, value)
//! subtotal. Counters live in the memtable under `(series id, bucket index)`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::chunked::Chunked;
use crate::interned::Interned;
use crate::keyindex::KeyIndex;

use tally_core::model::{Duration, Namespace, Retention, Schema};
use tally_core::store::StoreError;

pub type NsId = u32;
pub type KeyId = u32;
pub type SeriesId = u32;
pub type StrId = u32;
/// A (dimension, value) pair of string ids, numbered once in the catalog: what a key's
/// subtotal entries name (see [`Subs`]).
pub type PairId = u32;

use crate::seeded::Map;

/// One tier of a namespace as the memtable needs it.
#[derive(Debug, Clone, Copy)]
pub struct TierPlan {
    /// Index of this resolution in the memtable's per-resolution maps.
    pub slot: usize,
    pub res: i64,
    pub resolution: Duration,
    pub retention: Retention,
    /// The retention the schema of its time gives: `retention` too, except while the log
    /// replays, where `retention` is the one at the log's end and this the one the records
    /// being replayed were written under (see `state::holds_bucket`).
    pub written_with: Retention,
    pub breakdown: bool,
}

/// A key's name as its entry holds it: up to [`INLINE_NAME`] bytes in the entry itself
/// (`tally-bench engine`'s keys are 9 bytes), so that a look-up, which reads the entry
/// anyway, compares with no second cache miss to a string elsewhere and a key costs no
/// allocation; longer ones on the heap.
#[derive(Debug, Clone)]
pub enum KeyName {
    Inline([u8; INLINE_NAME], u8),
    Boxed(Box<str>),
}

/// The longest name a [`KeyName`] holds inline (the enum is then no larger than a
/// `Box<str>` and its tag: 24 bytes).
pub const INLINE_NAME: usize = 22;

impl KeyName {
    pub fn new(name: &str) -> Self {
        if name.len() <= INLINE_NAME {
            let mut b = [0u8; INLINE_NAME];
            b[..name.len()].copy_from_slice(name.as_bytes());
            KeyName::Inline(b, name.len() as u8)
        } else {
            KeyName::Boxed(name.into())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            // Made from a `str`: always UTF-8.
            KeyName::Inline(b, len) => std::str::from_utf8(&b[..*len as usize]).unwrap_or(""),
            KeyName::Boxed(s) => s,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            KeyName::Inline(b, len) => &b[..*len as usize],
            KeyName::Boxed(s) => s.as_bytes(),
        }
    }

    /// Bytes it takes on the heap.
    pub fn heap_bytes(&self) -> usize {
        match self {
            KeyName::Inline(..) => 0,
            KeyName::Boxed(s) => s.len(),
        }
    }
}

impl Default for KeyName {
    fn default() -> Self {
        KeyName::Inline([0; INLINE_NAME], 0)
    }
}

#[derive(Debug)]
pub struct NsEntry {
    pub name: Namespace,
    pub schema: Schema,
    pub tiers: Arc<[TierPlan]>,
    /// Its keys by name, and in byte order for listing (ids alone: names are in the
    /// keys' entries, see [`Catalog::key_name`]).
    pub keys: KeyIndex,
    /// Per tier resolution (seconds): archive segments flushed before these log records
    /// hold data of a tier since removed (or of its subtotals), which reads must not show.
    pub cutoffs: BTreeMap<u32, Cutoff>,
}

/// A set of dense ids, one bit each: what a walk over every counter of a tier tests per
/// counter instead of reading the catalog's entries (a top over today tests ~1 M counters;
/// the bits of 1 M ids fit in 128 KiB, the entries take megabytes).
#[derive(Debug, Default, Clone)]
pub struct Bits(Vec<u64>);

impl Bits {
    pub fn contains(&self, id: u32) -> bool {
        self.0
            .get(id as usize / 64)
            .is_some_and(|w| w >> (id % 64) & 1 == 1)
    }

    pub fn set(&mut self, id: u32, on: bool) {
        let at = id as usize / 64;
        if self.0.len() <= at {
            if !on {
                return;
            }
            self.0.resize(at + 1, 0);
        }
        if on {
            self.0[at] |= 1 << (id % 64);
        } else {
            self.0[at] &= !(1 << (id % 64));
        }
    }
}

/// Log records before which the archive's data of one tier of a namespace is hidden.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cutoff {
    /// Totals and subtotals: the tier was removed at this record.
    pub all: u64,
    /// Subtotals only: the tier stopped keeping breakdowns (or was removed) here.
    pub subtotals: u64,
}

impl Cutoff {
    /// Whether a segment flushed through `flushed_seq` may show (totals, subtotals).
    pub fn shows(&self, flushed_seq: u64) -> (bool, bool) {
        (
            flushed_seq >= self.all,
            flushed_seq >= self.all.max(self.subtotals),
        )
    }
}

impl NsEntry {
    /// The archive cutoff of one tier resolution (seconds).
    pub fn cutoff(&self, res: u32) -> Cutoff {
        self.cutoffs.get(&res).copied().unwrap_or_default()
    }

    pub fn tier(&self, resolution: Duration) -> Option<TierPlan> {
        self.tiers
            .iter()
            .find(|t| t.resolution == resolution)
            .copied()
    }
}

/// A key's subtotal series, found by their (dimension, value) pair's id ([`PairId`]) in the
/// key's own index rather than in one map of every subtotal of every key (that map cost ~34
/// bytes per series). Up to [`LINEAR_SUBS`] entries are a short list searched in turn,
/// exactly as long as it needs; beyond, the entries are an open-addressing table (7/10
/// full after it grows, at most 7/8, probed linearly from the pair's hash), so a look-up
/// reads the entries themselves from its first probe on, a cache line or two at that
/// load. (Tables of a power of two of slots were 1/2 full just after they doubled: the
/// subtotal series took 8.9 B per live counter on `tally-bench engine`, 7.7 B here, for
/// ~1% more of ingest's time in look-ups and ~0.6% more in growing. A list in creation order
/// with a separate table of positions into it took two misses a look-up and ~25 bytes a
/// series, against ~18 here and ~20 at most 3/4 full, which was no faster: the list or
/// table alone, without the 4 bytes of `series_info`; a sorted list with binary search
/// saved more bytes but made ingest ~15% slower on keys with thousands of subtotals. An
/// entry named its dimension and value apart until the catalog numbered the pairs: 12
/// bytes instead of 8.)
#[derive(Debug, Default)]
pub struct Subs {
    /// `(pair, series)`; a free slot has series [`FREE_SUB`]. While short, the first `len`
    /// are the entries and any after them are free.
    slots: Box<[(PairId, SeriesId)]>,
    len: u32,
    /// Whether the table finds home slots through the process's seed ([`sub_home_mixed`])
    /// rather than [`sub_home`]: since an entry was placed [`LONG_RUN`] slots or more from
    /// its home. (In what was padding: a `Subs` takes 24 bytes either way.)
    mixed: bool,
}

/// A run of probes this long, placing an entry, makes its table hash through the
/// process's seed from then on: see [`sub_home`].
const LONG_RUN: usize = 64;

/// Up to this many subtotals a key's entries are a list searched in order, with no hashing.
pub const LINEAR_SUBS: usize = 8;

/// The series of a free slot in [`Subs`]: no subtotal series has it (their ids are below
/// [`TOTAL`]).
const FREE_SUB: SeriesId = u32::MAX;

const NO_SUB: (PairId, SeriesId) = (0, FREE_SUB);

/// The home slot of pair `p` in a table of `size` slots (more than [`LINEAR_SUBS`]): a
/// multiplicative (Fibonacci) hash of the id, which every bit of it moves, scaled to the
/// size by its high bits (a multiply, no division). Ids made one after another spread
/// evenly: look-ups in the tables of keys that see most values probe ~1 slot.
///
/// A client makes pairs in the order it likes, so it could pick ids that this hash sends
/// all to one run of slots (no seed can help one multiply: it shifts them all alike).
/// A table that finds itself placing an entry [`LONG_RUN`] slots from home moves to
/// [`sub_home_mixed`] (test `pairs_crafted_against_the_unseeded_hash_probe_few_slots`).
/// Always mixing cost replay's resolving thread ~5% (`Subs::get` 11.2 → 13.9% of its
/// samples, 3 runs each): random homes probe ~3–4 slots at these tables' loads. Tables of
/// ids not in sequence often move too once they hold a few hundred (random ids at 7/8
/// full leave runs that long), at no cost: under one multiply such ids fall as randomly as
/// under the mix.
fn sub_home(p: PairId, size: usize) -> usize {
    let x = u64::from(p).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((u128::from(x) * size as u128) >> 64) as usize
}

/// A home slot from the id mixed with the process's seed ([`crate::seeded::fold_mix`]).
fn sub_home_mixed(p: PairId, size: usize) -> usize {
    sub_home_seeded(p, crate::seeded::mix(), size)
}

fn sub_home_seeded(p: PairId, seed: u64, size: usize) -> usize {
    let x = crate::seeded::fold_mix(u64::from(p), seed);
    ((u128::from(x) * size as u128) >> 64) as usize
}

/// The slot after `i` in a table of `size` slots.
fn next_slot(i: usize, size: usize) -> usize {
    if i + 1 == size { 0 } else { i + 1 }
}

fn is_entry(e: &&(PairId, SeriesId)) -> bool {
    e.1 != FREE_SUB
}

impl Subs {
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, `(pair, series)`, in no particular order.
    pub fn iter(&self) -> <&Subs as IntoIterator>::IntoIter {
        self.into_iter()
    }

    fn hashed(&self) -> bool {
        self.slots.len() > LINEAR_SUBS
    }

    /// `p`'s home slot in this table of `size` slots.
    #[inline]
    fn home(&self, p: PairId, size: usize) -> usize {
        if self.mixed {
            sub_home_mixed(p, size)
        } else {
            sub_home(p, size)
        }
    }

    /// Bytes the entries take, free slots included.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.slots)
    }

    #[inline]
    pub fn get(&self, p: PairId) -> Option<SeriesId> {
        if !self.hashed() {
            return self.slots[..self.len()]
                .iter()
                .find(|e| e.0 == p)
                .map(|e| e.1);
        }
        let size = self.slots.len();
        let mut i = self.home(p, size);
        loop {
            let e = self.slots[i];
            if e.1 == FREE_SUB {
                return None;
            }
            if e.0 == p {
                return Some(e.1);
            }
            i = next_slot(i, size);
        }
    }

    /// Reads the memory a look-up of `p` reads first (its home slot, or the list's head),
    /// so that a later look-up finds it in cache: see [`Catalog::touch_subs`].
    fn touch(&self, p: PairId) -> u32 {
        let i = if self.hashed() {
            self.home(p, self.slots.len())
        } else {
            0
        };
        self.slots.get(i).map_or(0, |e| e.1)
    }

    /// Adds a subtotal the key does not have yet.
    pub fn push(&mut self, p: PairId, sid: SeriesId) {
        let n = self.len() + 1;
        if !self.hashed() && n <= LINEAR_SUBS {
            if n > self.slots.len() {
                // Exactly as long as it needs: a list grows by one entry at a time (at
                // most LINEAR_SUBS times over a key's life), in one `realloc`. (Moving the
                // entries through a new list took two allocations and two frees a push: the
                // allocator's share of replay's resolving thread, where most keys are new,
                // was ~10% with them and ~8% without.)
                let mut list = std::mem::take(&mut self.slots).into_vec();
                list.reserve_exact(1);
                list.push((p, sid));
                self.slots = list.into_boxed_slice();
            } else {
                self.slots[n - 1] = (p, sid);
            }
        } else {
            if 8 * n > 7 * self.slots.len() {
                self.resize(table_size(n));
            }
            if self.place((p, sid)) >= LONG_RUN && !self.mixed {
                self.mix();
            }
        }
        self.len = n as u32;
    }

    /// Keeps the subtotals `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&(PairId, SeriesId)) -> bool) {
        // `keep` once per entry; the entries copied only once one is dropped (a forget asks
        // every key, and most keep all).
        let mut kept: Option<Vec<_>> = None;
        for (i, e) in self.iter().enumerate() {
            match (&mut kept, keep(e)) {
                (Some(k), true) => k.push(*e),
                (None, false) => kept = Some(self.iter().take(i).copied().collect()),
                _ => {}
            }
        }
        let Some(kept) = kept else {
            return;
        };
        let size = if kept.len() <= LINEAR_SUBS {
            kept.len()
        } else {
            table_size(kept.len())
        };
        self.fill(size, kept);
    }

    /// Moves the entries to `size` slots: a list up to [`LINEAR_SUBS`], else a table.
    fn resize(&mut self, size: usize) {
        let old = std::mem::take(&mut self.slots);
        self.fill(size, old.iter().filter(is_entry).copied());
    }

    fn fill(&mut self, size: usize, entries: impl IntoIterator<Item = (PairId, SeriesId)>) {
        self.slots = vec![NO_SUB; size].into_boxed_slice();
        let mut len = 0;
        let mut longest = 0;
        for e in entries {
            if size <= LINEAR_SUBS {
                self.slots[len] = e;
            } else {
                longest = longest.max(self.place(e));
            }
            len += 1;
        }
        self.len = len as u32;
        if longest >= LONG_RUN && !self.mixed {
            self.mix();
        }
    }

    /// From now on, homes through the process's seed: every entry placed again.
    fn mix(&mut self) {
        self.mixed = true;
        self.resize(self.slots.len());
    }

    /// Puts an entry in the first free slot from its home (a table with room); how many
    /// slots past its home that is.
    fn place(&mut self, e: (PairId, SeriesId)) -> usize {
        let size = self.slots.len();
        let mut i = self.home(e.0, size);
        let mut run = 0;
        while self.slots[i].1 != FREE_SUB {
            i = next_slot(i, size);
            run += 1;
        }
        self.slots[i] = e;
        run
    }
}

/// The slots of a table for `n` entries (more than [`LINEAR_SUBS`]): 7/10 full, so that it
/// takes ~1/4 more entries before it is 7/8 full and grows again.
fn table_size(n: usize) -> usize {
    (n * 10).div_ceil(7).max(LINEAR_SUBS + 1)
}

impl<'a> IntoIterator for &'a Subs {
    type Item = &'a (PairId, SeriesId);
    type IntoIter = std::iter::Filter<
        std::slice::Iter<'a, (PairId, SeriesId)>,
        fn(&&(PairId, SeriesId)) -> bool,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.slots.iter().filter(is_entry as fn(&&_) -> bool)
    }
}

/// A key: its name and its subtotal series. Its namespace is in `Catalog::key_ns`, its
/// total series is [`total_of`] its id.
#[derive(Debug)]
pub struct KeyEntry {
    /// The key itself (the namespace's [`KeyIndex`] holds its id alone).
    pub name: KeyName,
    /// Every subtotal series this key has.
    pub subs: Subs,
}

/// Marks a subtotal series in `series_info`.
pub const SUBTOTAL: u32 = 1 << 31;

/// Marks a total series id: a key's total series is `TOTAL | key id`, so that its key (and
/// that it is a total) is read off the id, with no look-up (a walk over a tier's totals,
/// a top over the open day, reads ~1 M of them). Subtotal series ids are below it.
pub const TOTAL: u32 = 1 << 31;

/// A key's total series.
pub fn total_of(key: KeyId) -> SeriesId {
    TOTAL | key
}

/// Whether a series id is a key's total.
pub fn is_total(sid: SeriesId) -> bool {
    sid & TOTAL != 0
}

/// Bytes the catalog's tables take (see [`Catalog::bytes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatalogBytes {
    /// Keys: their entries, names, the namespaces' maps by name and in order.
    pub keys: usize,
    /// Subtotal series: each key's list and table of them, and their entries by id.
    pub series: usize,
    /// Dimension names and values, interned once.
    pub strings: usize,
}

impl CatalogBytes {
    pub fn total(&self) -> usize {
        self.keys + self.series + self.strings
    }
}

#[derive(Debug, Default)]
pub struct Catalog {
    pub by_name: BTreeMap<Namespace, NsId>,
    pub ns: Vec<NsEntry>,
    pub keys: Chunked<KeyEntry>,
    /// Dimension names and values by their bytes ([`Interned`]), and each one's string by
    /// its id.
    strs: Interned,
    pub str_list: Vec<Arc<str>>,
    /// The (dimension, value) pairs subtotal series name, numbered (see [`Subs`]), and each
    /// pair's strings by its id ([`VACANT_PAIR`] for a freed one).
    pairs: Map<(StrId, StrId), PairId>,
    pair_list: Vec<(StrId, StrId)>,
    /// Per subtotal series: the id of its key, with [`SUBTOTAL`] set. (The key gives the
    /// namespace; a flush finds the keys of the series it writes without a walk over every
    /// key.) Totals are not here: their id names their key ([`TOTAL`]).
    pub series_info: Chunked<u32>,
    /// The namespace of each key id, 4 bytes apart from the rest of its entry: what a walk
    /// over a tier's totals reads per counter. [`FREE_KEY`] for a forgotten key.
    pub key_ns: Chunked<NsId>,
    /// Resolution of each memtable slot.
    pub slots: Vec<Duration>,
    /// How many times [`Catalog::forget`] has forgotten keys: a key id means the same key
    /// for as long as this does not change (a reader that lets the catalog go and looks
    /// ids up again later checks it).
    pub forgets: u64,
    /// How many times [`Catalog::forget`] has freed strings or pairs: a string or pair id
    /// means the same string or pair for as long as this does not change.
    pub strings_freed: u64,
    /// Ids of forgotten keys, subtotal series, strings and pairs, reused before new ones
    /// are taken.
    free_keys: Vec<KeyId>,
    free_series: Vec<SeriesId>,
    free_strs: Vec<StrId>,
    free_pairs: Vec<PairId>,
    /// What `str_list` holds at a freed string's id.
    vacant_str: Arc<str>,
    /// While a forget walks the counters without the write gate (from
    /// [`Catalog::begin_forget`] to [`Catalog::end_forget`]): the keys batches resolved
    /// meanwhile, which it keeps whatever the walk saw.
    resolved_since: Option<Bits>,
}

/// Marks a free slot in `series_info`.
const VACANT: u32 = u32::MAX;

/// `key_ns` of a forgotten key (whose id is free for reuse).
pub const FREE_KEY: NsId = NsId::MAX;

/// What `pair_list` holds at a freed pair's id.
const VACANT_PAIR: (StrId, StrId) = (StrId::MAX, StrId::MAX);

fn full(what: &str) -> StoreError {
    StoreError::internal(format!("the embedded engine ran out of {what} ids (2^31)"))
}

impl Catalog {
    fn slot(&mut self, r: Duration) -> usize {
        match self.slots.iter().position(|s| *s == r) {
            Some(i) => i,
            None => {
                self.slots.push(r);
                self.slots.len() - 1
            }
        }
    }

    fn plan(&mut self, schema: &Schema) -> Arc<[TierPlan]> {
        schema
            .tiers()
            .iter()
            .map(|t| TierPlan {
                slot: self.slot(t.resolution),
                res: t.resolution.secs_i64(),
                resolution: t.resolution,
                retention: t.retention,
                written_with: t.retention,
                breakdown: schema.is_breakdown(t.resolution),
            })
            .collect()
    }

    pub fn ns_id(&self, ns: &str) -> Option<NsId> {
        self.by_name.get(ns).copied()
    }

    /// Creates a namespace, or replaces its schema; returns its id and the slots of tiers
    /// that lost their data or their subtotals.
    pub fn put_schema(
        &mut self,
        name: &Namespace,
        schema: &Schema,
    ) -> Result<(NsId, Vec<usize>, Vec<usize>), StoreError> {
        let tiers = self.plan(schema);
        match self.by_name.get(name) {
            Some(&id) => {
                let entry = &mut self.ns[id as usize];
                let old = std::mem::replace(&mut entry.tiers, tiers.clone());
                let removed = old
                    .iter()
                    .filter(|o| !tiers.iter().any(|t| t.slot == o.slot))
                    .map(|t| t.slot)
                    .collect();
                let unbroken = old
                    .iter()
                    .filter(|o| {
                        o.breakdown && !tiers.iter().any(|t| t.slot == o.slot && t.breakdown)
                    })
                    .map(|t| t.slot)
                    .collect();
                entry.schema = schema.clone();
                Ok((id, removed, unbroken))
            }
            None => {
                let id = u32::try_from(self.ns.len()).map_err(|_| full("namespace"))?;
                self.ns.push(NsEntry {
                    name: name.clone(),
                    schema: schema.clone(),
                    tiers,
                    keys: KeyIndex::default(),
                    cutoffs: BTreeMap::new(),
                });
                self.by_name.insert(name.clone(), id);
                Ok((id, Vec::new(), Vec::new()))
            }
        }
    }

    pub fn str_id(&self, s: &str) -> Option<StrId> {
        self.strs.get(s, &self.str_list)
    }

    fn intern(&mut self, s: &str) -> Result<StrId, StoreError> {
        if let Some(id) = self.strs.get(s, &self.str_list) {
            return Ok(id);
        }
        let a: Arc<str> = s.into();
        let id = match self.free_strs.pop() {
            Some(id) => {
                self.str_list[id as usize] = a.clone();
                id
            }
            None => {
                let id = u32::try_from(self.str_list.len()).map_err(|_| full("string"))?;
                self.str_list.push(a.clone());
                id
            }
        };
        self.strs.insert(&a, id, &self.str_list);
        Ok(id)
    }

    fn new_series(&mut self, info: u32) -> Result<SeriesId, StoreError> {
        if let Some(id) = self.free_series.pop() {
            self.series_info[id as usize] = info;
            return Ok(id);
        }
        let id = u32::try_from(self.series_info.len())
            .ok()
            .filter(|id| *id < SUBTOTAL)
            .ok_or_else(|| full("series"))?;
        self.series_info.push(info);
        Ok(id)
    }

    /// Forgets every key and series with no counter in memory (`live` says which series
    /// have one): what the archive holds of them is found by name, and a key written again
    /// gets new ids. Keeps memory to what the realtime tier holds, not every key ever seen.
    /// The caller holds off writers (the engine's write gate) and readers (the catalog's
    /// write lock); see [`Catalog::forget_keys`] for a forget in parts. Returns the (keys,
    /// series) forgotten.
    pub fn forget(&mut self, live: &dyn Fn(SeriesId) -> bool) -> (usize, usize) {
        let forgotten = self.forget_keys(live, 0..self.keys.len());
        self.end_forget(forgotten.1 > 0);
        forgotten
    }

    /// [`Catalog::forget`] for the keys with ids in `ids` alone, but those noted since
    /// [`Catalog::begin_forget`]: a forget in parts, each under the catalog's write lock
    /// (no reader holds an id, no batch resolves one), `live` computed once without the
    /// write gate after `begin_forget` under it, and [`Catalog::end_forget`] after the last
    /// part. Between parts, batches may make keys and series, reusing ids forgotten in an
    /// earlier part: they are noted, so later parts leave them be.
    pub fn forget_keys(
        &mut self,
        live: &dyn Fn(SeriesId) -> bool,
        ids: std::ops::Range<usize>,
    ) -> (usize, usize) {
        let (mut keys, mut series) = (0, 0);
        let resolved = self.resolved_since.take();
        let noted = |kid: usize| resolved.as_ref().is_some_and(|b| b.contains(kid as KeyId));
        for kid in ids.start..ids.end.min(self.keys.len()) {
            let ns = self.key_ns[kid];
            if ns == FREE_KEY || noted(kid) {
                continue;
            }
            let k = &mut self.keys[kid];
            let mut dropped: Vec<SeriesId> = Vec::new();
            k.subs.retain(|&(_, sid)| {
                let keep = live(sid);
                if !keep {
                    dropped.push(sid);
                }
                keep
            });
            for sid in dropped {
                self.series_info[sid as usize] = VACANT;
                self.free_series.push(sid);
                series += 1;
            }
            if self.keys[kid].subs.is_empty() && !live(total_of(kid as KeyId)) {
                // Out of the index while its name is still there to find it by.
                let names = &self.keys;
                if let Some(e) = self.ns.get_mut(ns as usize) {
                    e.keys
                        .remove(kid as KeyId, |id| names[id as usize].name.as_bytes());
                }
                self.keys[kid].name = KeyName::default();
                self.key_ns[kid] = FREE_KEY;
                self.free_keys.push(kid as KeyId);
                keys += 1;
                series += 1;
            }
        }
        self.resolved_since = resolved;
        if keys > 0 {
            self.forgets += 1;
        }
        (keys, series)
    }

    /// Ends a forget: stops noting resolved keys, gives back the namespaces' spare room,
    /// and, if `series` were forgotten, the strings no series names any more.
    pub fn end_forget(&mut self, series: bool) {
        self.resolved_since = None;
        let names = &self.keys;
        for e in &mut self.ns {
            e.keys.shrink(|id| names[id as usize].name.as_bytes());
        }
        if series {
            self.forget_strings();
        }
    }

    /// Starts noting the keys batches resolve, until [`Catalog::end_forget`]; a forget
    /// keeps them. A forget that walks the counters without the write gate (a batch may
    /// resolve a key after the walk passed its shard, then add to it) calls this under the
    /// gate first, so that any batch that resolved a key before has added its counters.
    pub fn begin_forget(&mut self) {
        self.resolved_since = Some(Bits::default());
    }

    /// Notes keys a batch resolved (see [`Catalog::begin_forget`]); nothing when no forget
    /// is under way.
    pub fn note_resolved(&mut self, keys: &[KeyId]) {
        if let Some(bits) = &mut self.resolved_since {
            for &k in keys {
                bits.set(k, true);
            }
        }
    }

    /// Frees the (dimension, value) pairs, then the dimension names and values, that no
    /// subtotal series names any more (a dimension whose values churn, such as client
    /// addresses, would otherwise hold every value ever seen for the life of the process);
    /// their ids are reused.
    fn forget_strings(&mut self) {
        let mut used_pairs = vec![false; self.pair_list.len()];
        for k in self.keys.iter() {
            for &(p, _) in &k.subs {
                used_pairs[p as usize] = true;
            }
        }
        let mut freed = false;
        let mut used = vec![false; self.str_list.len()];
        for (id, pair_used) in used_pairs.into_iter().enumerate() {
            let pair = self.pair_list[id];
            if pair == VACANT_PAIR {
                continue;
            }
            if pair_used {
                used[pair.0 as usize] = true;
                used[pair.1 as usize] = true;
            } else {
                self.pairs.remove(&pair);
                self.pair_list[id] = VACANT_PAIR;
                self.free_pairs.push(id as PairId);
                freed = true;
            }
        }
        if freed && self.pairs.len() < self.pairs.capacity() / 4 {
            self.pairs.shrink_to_fit();
        }
        for (id, used) in used.into_iter().enumerate() {
            let id = id as StrId;
            if used {
                continue;
            }
            let s = Arc::clone(&self.str_list[id as usize]);
            if !self.strs.remove(&s, id, &self.str_list) {
                continue;
            }
            self.str_list[id as usize] = Arc::clone(&self.vacant_str);
            self.free_strs.push(id);
            freed = true;
        }
        if freed {
            self.strings_freed += 1;
            if self.strs.len() < self.strs.capacity() / 4 {
                self.strs.shrink_to_fit(&self.str_list);
            }
        }
    }

    /// What the catalog's tables take, at their capacity (hash tables with their control
    /// bytes). For `/metrics` and the benchmarks: where memory per live counter goes.
    pub fn bytes(&self) -> CatalogBytes {
        use std::mem::size_of;
        let heap_str = |s: &str| s.len() + 2 * size_of::<usize>();
        let mut keys = self.keys.capacity() * size_of::<KeyEntry>()
            + self.key_ns.capacity() * size_of::<NsId>()
            + self.free_keys.capacity() * size_of::<KeyId>();
        let mut series = self.series_info.capacity() * size_of::<u32>()
            + self.free_series.capacity() * size_of::<SeriesId>();
        for k in self.keys.iter() {
            keys += k.name.heap_bytes();
            series += k.subs.bytes();
        }
        for e in &self.ns {
            keys += e.keys.bytes();
        }
        let strings = self.strs.bytes()
            + self.str_list.capacity() * size_of::<Arc<str>>()
            + self.free_strs.capacity() * size_of::<StrId>()
            + self.pairs.capacity() * (size_of::<((StrId, StrId), PairId)>() + 1)
            + self.pair_list.capacity() * size_of::<(StrId, StrId)>()
            + self.free_pairs.capacity() * size_of::<PairId>()
            + self
                .str_list
                .iter()
                .filter(|s| !Arc::ptr_eq(s, &self.vacant_str))
                .map(|s| heap_str(s))
                .sum::<usize>();
        CatalogBytes {
            keys,
            series,
            strings,
        }
    }

    /// Keys in use (forgotten ones excluded).
    pub fn live_keys(&self) -> usize {
        self.keys.len() - self.free_keys.len()
    }

    /// Series in use, totals and subtotals (forgotten ones excluded).
    pub fn live_series(&self) -> usize {
        self.series_info.len() - self.free_series.len() + self.live_keys()
    }

    pub fn key_id(&self, ns: NsId, key: &str) -> Option<KeyId> {
        let names = &self.keys;
        self.ns
            .get(ns as usize)?
            .keys
            .get(key.as_bytes(), |id| names[id as usize].name.as_bytes())
    }

    /// A key's name ("" for a forgotten or unknown id).
    pub fn key_name(&self, key: KeyId) -> &str {
        self.keys.get(key as usize).map_or("", |k| k.name.as_str())
    }

    /// A key's name as bytes, with no UTF-8 check (for comparisons).
    pub fn key_bytes(&self, key: KeyId) -> &[u8] {
        self.keys
            .get(key as usize)
            .map_or(&[], |k| k.name.as_bytes())
    }

    pub fn key_or_insert(&mut self, ns: NsId, key: &str) -> Result<KeyId, StoreError> {
        if let Some(id) = self.key_id(ns, key) {
            return Ok(id);
        }
        if self.ns.get(ns as usize).is_none() {
            return Err(StoreError::internal("unknown namespace id"));
        }
        let reused = self.free_keys.last().copied();
        let id = match reused {
            Some(id) => id,
            // Below `TOTAL - 1`: `total_of(id)` then stays below `u32::MAX`, which no
            // series id is (free-slot markers use it).
            None => u32::try_from(self.keys.len())
                .ok()
                .filter(|id| *id < TOTAL - 1)
                .ok_or_else(|| full("key"))?,
        };
        // Nothing can fail past this point: the key's series, its entry and its names appear
        // together.
        let entry = KeyEntry {
            name: KeyName::new(key),
            subs: Subs::default(),
        };
        match reused {
            Some(id) => {
                self.free_keys.pop();
                self.keys[id as usize] = entry;
            }
            None => self.keys.push(entry),
        }
        // The entry first: the index reads names through it.
        let names = &self.keys;
        if let Some(e) = self.ns.get_mut(ns as usize) {
            e.keys.insert(id, |k| names[k as usize].name.as_bytes());
        }
        if self.key_ns.len() <= id as usize {
            self.key_ns.grow_to(id as usize + 1, FREE_KEY);
        }
        self.key_ns[id as usize] = ns;
        Ok(id)
    }

    pub fn sub_id(&self, key: KeyId, dim: StrId, value: StrId) -> Option<SeriesId> {
        self.sub_of_pair(key, self.pair_id(dim, value)?)
    }

    pub fn sub_of_pair(&self, key: KeyId, p: PairId) -> Option<SeriesId> {
        self.keys.get(key as usize)?.subs.get(p)
    }

    /// The id of a (dimension, value) pair, if some subtotal series names it.
    pub fn pair_id(&self, dim: StrId, value: StrId) -> Option<PairId> {
        self.pairs.get(&(dim, value)).copied()
    }

    /// The (dimension, value) of a pair.
    pub fn pair(&self, p: PairId) -> (StrId, StrId) {
        self.pair_list
            .get(p as usize)
            .copied()
            .unwrap_or(VACANT_PAIR)
    }

    /// The id of a (dimension, value) pair, numbered if new.
    pub fn pair_or_insert(&mut self, dim: StrId, value: StrId) -> Result<PairId, StoreError> {
        if let Some(&p) = self.pairs.get(&(dim, value)) {
            return Ok(p);
        }
        let p = match self.free_pairs.pop() {
            Some(p) => {
                self.pair_list[p as usize] = (dim, value);
                p
            }
            None => {
                let p = u32::try_from(self.pair_list.len()).map_err(|_| full("pair"))?;
                self.pair_list.push((dim, value));
                p
            }
        };
        self.pairs.insert((dim, value), p);
        Ok(p)
    }

    /// A key's subtotal series with their dimension and value: `(dimension, value,
    /// series)`, in no particular order.
    pub fn subs_of<'a>(
        &'a self,
        entry: &'a KeyEntry,
    ) -> impl Iterator<Item = (StrId, StrId, SeriesId)> + 'a {
        entry.subs.iter().map(|&(p, sid)| {
            let (d, v) = self.pair(p);
            (d, v, sid)
        })
    }

    pub fn sub_or_insert(
        &mut self,
        key: KeyId,
        dim: &str,
        value: &str,
    ) -> Result<SeriesId, StoreError> {
        let (d, v) = (self.intern(dim)?, self.intern(value)?);
        self.sub_ids_or_insert(key, d, v)
    }

    /// Interns a string (for callers that cache ids per batch).
    pub fn intern_str(&mut self, s: &str) -> Result<StrId, StoreError> {
        self.intern(s)
    }

    pub fn sub_ids_or_insert(
        &mut self,
        key: KeyId,
        d: StrId,
        v: StrId,
    ) -> Result<SeriesId, StoreError> {
        let p = self.pair_or_insert(d, v)?;
        self.sub_pair_or_insert(key, p)
    }

    #[inline]
    pub fn sub_pair_or_insert(&mut self, key: KeyId, p: PairId) -> Result<SeriesId, StoreError> {
        let Some(k) = self.keys.get(key as usize) else {
            return Err(StoreError::internal("unknown key id"));
        };
        if let Some(id) = k.subs.get(p) {
            return Ok(id);
        }
        let id = self.new_series(key | SUBTOTAL)?;
        if let Some(k) = self.keys.get_mut(key as usize) {
            k.subs.push(p, id);
        }
        Ok(id)
    }

    /// Reads, ahead of the look-ups, the memory that looking up each `(key, pair)` of
    /// `wanted` will read: each stage of it for all of them in turn, so that the CPU
    /// overlaps their cache misses (each stage's loads are independent of each other)
    /// instead of waiting for each look-up's misses one after the other. Changes nothing;
    /// the look-ups that follow find the lines in cache. Returns a value made of what it
    /// read, so that the reads are not left out.
    pub fn touch_subs(&self, wanted: &[(KeyId, PairId)]) -> u32 {
        let mut acc = 0u32;
        let entry = |k: KeyId| self.keys.get(k as usize);
        for &(k, _) in wanted {
            acc ^= entry(k).map_or(0, |e| e.subs.len() as u32);
        }
        for &(k, p) in wanted {
            acc ^= entry(k).map_or(0, |e| e.subs.touch(p));
        }
        std::hint::black_box(acc)
    }

    /// The key of a series (`None` for a forgotten one).
    pub fn key_of_series(&self, sid: SeriesId) -> Option<KeyId> {
        if is_total(sid) {
            let key = sid & !TOTAL;
            return self
                .key_ns
                .get(key as usize)
                .is_some_and(|&ns| ns != FREE_KEY)
                .then_some(key);
        }
        self.series_info
            .get(sid as usize)
            .filter(|i| **i != VACANT)
            .map(|i| i & !SUBTOTAL)
    }

    /// The namespace of a series.
    pub fn ns_of_series(&self, sid: SeriesId) -> Option<NsId> {
        let key = self.key_of_series(sid)?;
        self.key_ns.get(key as usize).copied()
    }

    /// Whether a series is a subtotal.
    pub fn is_subtotal(&self, sid: SeriesId) -> bool {
        !is_total(sid)
            && self
                .series_info
                .get(sid as usize)
                .is_some_and(|i| *i != VACANT && i & SUBTOTAL != 0)
    }

    pub fn str(&self, id: StrId) -> &str {
        self.str_list.get(id as usize).map_or("", |s| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogs_bytes_count_each_part_and_follow_forgetting() {
        let mut c = Catalog::default();
        let ns = Namespace::new("clicks").unwrap();
        let (id, _, _) = c.put_schema(&ns, &Schema::default()).unwrap();
        let empty = c.bytes();
        let long = "k".repeat(100);
        for k in 0..1000 {
            let key = c.key_or_insert(id, &format!("{long}{k}")).unwrap();
            for v in 0..10 {
                c.sub_or_insert(key, "referrer", &format!("r{}", (k + v) % 50))
                    .unwrap();
            }
        }
        let b = c.bytes();
        // At least what the entries and names hold, and not wildly more.
        let keys_low = 1000 * (std::mem::size_of::<KeyEntry>() + 100);
        assert!((keys_low..4 * keys_low).contains(&b.keys), "{b:?}");
        let series_low = 10_000 * std::mem::size_of::<(StrId, StrId, SeriesId)>();
        assert!((series_low..4 * series_low).contains(&b.series), "{b:?}");
        assert!(b.strings > empty.strings, "51 names interned: {b:?}");
        assert_eq!(b.total(), b.keys + b.series + b.strings);
        // Forgotten keys' names are not counted (their entries stay, for reuse).
        c.forget(&|_| false);
        let after = c.bytes();
        assert!(after.keys < b.keys - 1000 * 100, "{after:?} vs {b:?}");
    }

    /// A dimension whose values churn (a new set each day) holds the catalog's strings to
    /// what live series name: forgotten values are freed and their ids reused.
    #[test]
    fn strings_no_series_names_are_freed_and_their_ids_reused() {
        let mut c = Catalog::default();
        let ns = Namespace::new("clicks").unwrap();
        let (id, _, _) = c.put_schema(&ns, &Schema::default()).unwrap();
        let kept = c.key_or_insert(id, "kept").unwrap();
        let kept_sub = c.sub_or_insert(kept, "ip", "10.0.0.1").unwrap();
        let (mut peak, mut peak_pairs) = (0, 0);
        for day in 0..20 {
            for k in 0..50 {
                let key = c.key_or_insert(id, &format!("k{k}")).unwrap();
                for v in 0..20 {
                    c.sub_or_insert(key, "ip", &format!("{day}.{k}.{v}"))
                        .unwrap();
                }
            }
            if day == 0 {
                (peak, peak_pairs) = (c.str_list.len(), c.pair_list.len());
            }
            let live = total_of(kept);
            c.forget(&|sid| sid == kept_sub || sid == live);
            // "ip" and the kept value stay, with their ids, and their pair alone.
            assert_eq!(c.strs.len(), 2, "day {day}");
            assert_eq!(c.pairs.len(), 1, "day {day}");
            assert_eq!(c.str(c.str_id("10.0.0.1").unwrap()), "10.0.0.1");
            assert_eq!(
                c.sub_id(kept, c.str_id("ip").unwrap(), c.str_id("10.0.0.1").unwrap()),
                Some(kept_sub)
            );
            assert_eq!(c.str_id("0.1.2"), None);
        }
        assert_eq!(
            (c.str_list.len(), c.pair_list.len()),
            (peak, peak_pairs),
            "ids were reused, the lists did not grow"
        );
        assert_eq!(c.strings_freed, 20);
        // A freed id given to a new string names it, and finds its series.
        let key = c.key_or_insert(id, "new").unwrap();
        let sid = c.sub_or_insert(key, "ip", "192.168.0.1").unwrap();
        let v = c.str_id("192.168.0.1").unwrap();
        assert_eq!(c.str(v), "192.168.0.1");
        let ip = c.str_id("ip").unwrap();
        assert_eq!(c.sub_id(key, ip, v), Some(sid));
        // So does a freed pair id.
        let p = c.pair_id(ip, v).unwrap();
        assert!((p as usize) < peak_pairs && c.pair(p) == (ip, v));
        assert_eq!(
            c.subs_of(&c.keys[key as usize]).collect::<Vec<_>>(),
            vec![(ip, v, sid)]
        );
        let b = c.bytes();
        assert!(b.strings < 64 * peak, "{b:?}");
    }

    #[test]
    fn keys_are_found_by_name_inline_or_shared_and_forgotten() {
        let mut c = Catalog::default();
        let ns = Namespace::new("clicks").unwrap();
        let (id, _, _) = c.put_schema(&ns, &Schema::default()).unwrap();
        // Around the inline limit, in bytes: 22 and 23 ASCII, and multi-byte characters
        // on either side of it (a 'é' is two bytes).
        let names: Vec<String> = (0..=30)
            .map(|n| "k".repeat(n))
            .chain([
                "é".repeat(11),
                "é".repeat(12),
                format!("{}é", "a".repeat(21)),
            ])
            .collect();
        let ids: Vec<KeyId> = names
            .iter()
            .map(|n| c.key_or_insert(id, n).unwrap())
            .collect();
        let inline = |c: &Catalog, n: &str| {
            c.key_id(id, n)
                .is_some_and(|k| matches!(c.keys[k as usize].name, KeyName::Inline(..)))
        };
        for (n, &k) in names.iter().zip(&ids) {
            assert_eq!(c.key_id(id, n), Some(k), "{n:?}");
            assert_eq!(c.key_or_insert(id, n).unwrap(), k, "found, not made again");
            assert_eq!(inline(&c, n), n.len() <= INLINE_NAME, "{n:?}");
            assert_eq!(c.key_name(k), n.as_str());
        }
        assert_eq!(c.key_id(id, "k".repeat(31).as_str()), None);
        assert_eq!(
            c.key_id(id, "é"),
            None,
            "a prefix of an inline name is not it"
        );
        // Forget every key but two: the map keeps exactly those.
        let keep = [ids[3], ids[30]];
        let totals: Vec<SeriesId> = keep.iter().map(|&k| total_of(k)).collect();
        c.forget(&|sid| totals.contains(&sid));
        for (n, &k) in names.iter().zip(&ids) {
            let want = keep.contains(&k).then_some(k);
            assert_eq!(c.key_id(id, n), want, "{n:?}");
        }
        assert_eq!(c.ns[id as usize].keys.len(), 2);
    }

    /// Its flag sits in what was padding: a key's entry holds one.
    #[test]
    fn a_keys_subtotals_take_24_bytes() {
        assert_eq!(std::mem::size_of::<Subs>(), 24);
    }

    #[test]
    fn a_keys_subtotals_are_found_short_long_and_after_forgetting() {
        let mut subs = Subs::default();
        // Pairs that collide in a small table and cross the linear limit several times.
        let pairs: Vec<PairId> = (0..300u32).map(|i| i * 7919 % 4096).collect();
        for (n, &p) in pairs.iter().enumerate() {
            assert_eq!(subs.get(p), None, "not there before it is pushed");
            subs.push(p, n as SeriesId + 1000);
            for (m, &p) in pairs[..=n].iter().enumerate() {
                assert_eq!(subs.get(p), Some(m as SeriesId + 1000));
            }
        }
        assert_eq!(subs.len(), 300);
        assert_eq!(subs.get(5_000), None);
        subs.retain(|&(_, sid)| sid % 10 == 0);
        assert_eq!(subs.len(), 30);
        for (m, &p) in pairs.iter().enumerate() {
            let want = (m % 10 == 0).then_some(m as SeriesId + 1000);
            assert_eq!(subs.get(p), want, "pair {m} after the retain");
        }
        subs.retain(|&(_, sid)| sid < 1050);
        assert_eq!((subs.len(), subs.get(pairs[40])), (5, Some(1040)));
        assert_eq!(subs.iter().count(), 5);
        let mut asked = 0;
        subs.retain(|_| {
            asked += 1;
            true
        });
        assert_eq!((asked, subs.len()), (5, 5), "each asked once, all kept");
        // Pushes after a retain: the list of 5 grows to 8, then becomes a table.
        for (n, &p) in pairs.iter().enumerate().skip(50).take(10) {
            subs.push(p, n as SeriesId + 1000);
        }
        assert_eq!(subs.len(), 15);
        for (m, &p) in pairs.iter().enumerate() {
            let want =
                (m < 50 && m % 10 == 0 || (50..60).contains(&m)).then_some(m as SeriesId + 1000);
            assert_eq!(subs.get(p), want, "pair {m} after pushes");
        }
        subs.retain(|_| false);
        assert_eq!((subs.len(), subs.iter().count(), subs.get(0)), (0, 0, None));
        subs.push(7, 1);
        subs.push(8, 2);
        subs.push(9, 3);
        assert_eq!(
            subs.iter().copied().collect::<Vec<_>>(),
            vec![(7, 1), (8, 2), (9, 3)],
            "a list with a free slot after its last entry iterates its entries alone"
        );
    }

    /// A full-grown table's look-ups probe few slots, for ids in sequence and for ids that
    /// differ only in their high bits; ids in sequence keep the one-multiply hash.
    #[test]
    fn a_subtotal_tables_probes_stay_short() {
        // (Strides that keep ~2 300 ids apart in 32 bits: pairs are distinct.)
        for stride in [1u32, 1 << 8, 1 << 16, 1 << 20] {
            let mut subs = Subs::default();
            // ~2 000 entries, then up to the most the table takes before it grows: 7/8.
            let mut i = 0u32;
            while i < 2_000 || 8 * (subs.len() + 1) <= 7 * subs.slots.len() {
                subs.push(i.wrapping_mul(stride), i);
                i += 1;
            }
            let size = subs.slots.len();
            assert_eq!(8 * subs.len() / size, 6, "{} in {size}", subs.len());
            let mean = mean_probes(&subs);
            // Random ids at this load: (1 + 1 / (1 - 7/8)) / 2 = 4.5 (3.7–8.6 in 600
            // tables of the seeded hash); a hash that spread these ids badly shows tens.
            assert!(mean < 16.0, "stride {stride}: {mean:.2} probes a look-up");
            if stride == 1 {
                assert!(!subs.mixed && mean < 2.0, "{mean:.2}, mixed {}", subs.mixed);
            }
        }
    }

    /// Probes a look-up of each entry of a table takes, on average.
    fn mean_probes(subs: &Subs) -> f64 {
        let size = subs.slots.len();
        let probes: usize = (0..size)
            .filter(|&at| subs.slots[at].1 != FREE_SUB)
            .map(|at| (at + size - subs.home(subs.slots[at].0, size)) % size + 1)
            .sum();
        probes as f64 / subs.len() as f64
    }

    /// Pairs picked because the one-multiply hash sends them all to slot 0 of any table of
    /// up to 2^12 slots (a client makes pairs in the order it likes, so it picks their
    /// ids): the table moves to the seeded hash, and they lie a few probes from home.
    #[test]
    fn pairs_crafted_against_the_unseeded_hash_probe_few_slots() {
        let crafted: Vec<PairId> = (0..1u32 << 24)
            .filter(|&p| sub_home(p, 1 << 12) == 0)
            .take(1_000)
            .collect();
        assert_eq!(crafted.len(), 1_000, "enough pairs found to collide");
        let mut subs = Subs::default();
        for (n, &p) in crafted.iter().enumerate() {
            subs.push(p, n as SeriesId);
        }
        let size = subs.slots.len();
        assert!(size <= 1 << 12 && crafted.iter().all(|&p| sub_home(p, size) == 0));
        assert!(subs.mixed);
        let mean = mean_probes(&subs);
        // Random ids: 4.5 at the most the table takes, ~2–4 in 600 runs of this test.
        assert!(mean < 8.0, "{mean:.2} probes a look-up");
        for (n, &p) in crafted.iter().enumerate() {
            assert_eq!(subs.get(p), Some(n as SeriesId));
        }
        // A retain keeps the seeded hash.
        subs.retain(|&(_, sid)| sid % 2 == 0);
        assert!(subs.mixed && subs.len() == 500);
        for (n, &p) in crafted.iter().enumerate() {
            assert_eq!(subs.get(p), (n % 2 == 0).then_some(n as SeriesId));
        }
    }

    /// A catalog with one namespace, `n`, of the default schema.
    fn with_namespace() -> (Catalog, NsId) {
        let mut c = Catalog::default();
        let (ns, _, _) = c
            .put_schema(&Namespace::new("n").unwrap(), &Schema::default())
            .unwrap();
        (c, ns)
    }

    #[test]
    fn forgotten_keys_and_series_free_their_ids_for_reuse() {
        let (mut c, ns) = with_namespace();
        let a = c.key_or_insert(ns, "a").unwrap();
        let b = c.key_or_insert(ns, "b").unwrap();
        let a_us = c.sub_or_insert(a, "country", "US").unwrap();
        let b_total = total_of(b);
        let a_total = total_of(a);
        assert!(is_total(a_total) && is_total(b_total) && !is_total(a_us));
        assert_eq!(
            (a_total, b_total),
            (TOTAL | a, TOTAL | b),
            "a total names its key"
        );
        assert_eq!(
            (c.key_of_series(a_total), c.key_of_series(b_total)),
            (Some(a), Some(b))
        );
        assert!(c.is_subtotal(a_us) && !c.is_subtotal(a_total));
        assert_eq!((c.key_ns[a as usize], c.key_ns[b as usize]), (ns, ns));
        // Only b's total has a counter left.
        let (keys, series) = c.forget(&|sid| sid == b_total);
        assert_eq!((keys, series), (1, 2));
        assert_eq!(c.key_id(ns, "a"), None);
        assert_eq!(c.key_of_series(a_us), None);
        assert_eq!(c.key_id(ns, "b"), Some(b));
        assert_eq!((c.live_keys(), c.live_series()), (1, 1));
        assert_eq!(
            c.key_of_series(a_total),
            None,
            "a forgotten key's total names nothing"
        );
        // New ids come from the free lists, and say what they now are.
        let x = c.key_or_insert(ns, "x").unwrap();
        assert_eq!(x, a);
        let x_total = total_of(x);
        assert_eq!(c.key_of_series(x_total), Some(x));
        let x_de = c.sub_or_insert(x, "country", "DE").unwrap();
        assert!(c.is_subtotal(x_de) && !c.is_subtotal(x_total));
        assert_eq!(c.ns_of_series(x_de), Some(ns));
        assert_eq!((c.live_keys(), c.live_series()), (2, 3));
        assert_eq!(
            (c.series_info.len(), x_de),
            (1, a_us),
            "no subtotal id was taken anew"
        );
        assert_eq!(x_total, a_total, "the reused key's total is its id again");
        assert_eq!(c.key_ns[x as usize], ns);
        let (other, _, _) = c
            .put_schema(&Namespace::new("m").unwrap(), &Schema::default())
            .unwrap();
        let y = c.key_or_insert(other, "y").unwrap();
        assert_eq!(c.key_ns[y as usize], other);
    }

    #[test]
    fn a_forget_in_parts_keeps_the_keys_resolved_meanwhile() {
        let (mut c, ns) = with_namespace();
        let a = c.key_or_insert(ns, "a").unwrap();
        let b = c.key_or_insert(ns, "b").unwrap();
        c.sub_or_insert(b, "country", "US").unwrap();
        c.note_resolved(&[a, b]);
        assert_eq!(
            c.forget(&|_| false),
            (2, 3),
            "no forget began: nothing noted"
        );
        let a = c.key_or_insert(ns, "a").unwrap();
        let b = c.key_or_insert(ns, "b").unwrap();
        let b_us = c.sub_or_insert(b, "country", "US").unwrap();
        // The walk saw no counter at all; b was resolved after the forget began.
        c.begin_forget();
        c.note_resolved(&[b]);
        let (a_ids, b_ids) = (a as usize..a as usize + 1, b as usize..b as usize + 1);
        assert_eq!(
            c.forget_keys(&|_| false, a_ids),
            (1, 1),
            "a, in the first part"
        );
        // Between parts, a batch makes a key, reusing a's id: noted, so kept.
        let e = c.key_or_insert(ns, "e").unwrap();
        assert_eq!(e, a);
        c.note_resolved(&[e]);
        assert_eq!(
            c.forget_keys(&|_| false, b_ids),
            (0, 0),
            "b and its subtotal kept"
        );
        c.end_forget(true);
        assert_eq!((c.key_id(ns, "a"), c.key_id(ns, "e")), (None, Some(e)));
        assert_eq!(c.key_id(ns, "b"), Some(b));
        let (country, us) = (c.intern("country").unwrap(), c.intern("US").unwrap());
        assert_eq!(c.sub_id(b, country, us), Some(b_us), "its strings kept too");
        // Once the forget ended, nothing is noted: the next one forgets them.
        c.note_resolved(&[b]);
        assert_eq!(c.forget(&|_| false), (2, 3));
    }

    #[test]
    fn ids_at_and_above_total_name_nothing_they_should_not() {
        let (mut c, ns) = with_namespace();
        let a = c.key_or_insert(ns, "a").unwrap();
        let a_us = c.sub_or_insert(a, "country", "US").unwrap();
        for sid in [
            VACANT,
            TOTAL,
            TOTAL | 1,
            TOTAL | (TOTAL - 2),
            SUBTOTAL | a_us,
        ] {
            if sid == TOTAL | a {
                continue;
            }
            assert_eq!(c.key_of_series(sid), None, "{sid:#x}");
            assert_eq!(c.ns_of_series(sid), None, "{sid:#x}");
            assert!(!c.is_subtotal(sid), "{sid:#x}");
        }
        assert_eq!(c.key_of_series(TOTAL | a), Some(a));
        assert_eq!(c.key_of_series(a_us), Some(a));
        assert!(!is_total(a_us) && is_total(TOTAL | a));
        // A key forgotten while its subtotal is live stays, total and all.
        let (k, s) = c.forget(&|sid| sid == a_us);
        assert_eq!((k, s), (0, 0));
        assert_eq!(c.key_of_series(TOTAL | a), Some(a));
        // Forgotten: the total names nothing; a new key in another namespace takes the id
        // and the same total, its subtotal the freed subtotal id.
        let (k, s) = c.forget(&|_| false);
        assert_eq!((k, s), (1, 2));
        assert_eq!(
            (c.key_of_series(TOTAL | a), c.key_of_series(a_us)),
            (None, None)
        );
        let (m, _, _) = c
            .put_schema(&Namespace::new("m").unwrap(), &Schema::default())
            .unwrap();
        let b = c.key_or_insert(m, "b").unwrap();
        assert_eq!(b, a);
        assert_eq!(c.ns_of_series(TOTAL | b), Some(m));
        assert_eq!(c.key_ns[b as usize], m);
        assert_eq!(c.key_of_series(a_us), None, "not a subtotal of b's");
        assert_eq!(c.live_series(), 1);
    }

    #[test]
    fn bits_hold_what_is_set() {
        let mut b = Bits::default();
        b.set(200, false);
        assert!(!b.contains(200) && !b.contains(u32::MAX));
        for i in [0, 63, 64, 200] {
            b.set(i, true);
        }
        b.set(63, false);
        let held: Vec<u32> = (0..300).filter(|&i| b.contains(i)).collect();
        assert_eq!(held, vec![0, 64, 200]);
    }
}

#[cfg(test)]
mod model_tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap, HashSet};

    #[test]
    fn subtotal_lists_and_tables_answer_as_a_map_across_their_boundary() {
        let mut next = crate::testutil::rng(0x1234_5678_9abc_def1);
        for _ in 0..300 {
            let mut s = Subs::default();
            let mut m: HashMap<PairId, SeriesId> = HashMap::new();
            let target = (next() % 200) as usize;
            for _ in 0..6 {
                while m.len() < target {
                    let p = (next() % 5000) as PairId;
                    if m.contains_key(&p) {
                        continue;
                    }
                    let sid = m.len() as SeriesId;
                    s.push(p, sid);
                    m.insert(p, sid);
                    assert!(s.iter().count() == m.len() && s.len() == m.len());
                    assert!(s.slots.iter().any(|e| e.1 == FREE_SUB) || !s.hashed());
                    assert_eq!(s.hashed(), m.len() > LINEAR_SUBS);
                }
                for p in 0..5000 {
                    assert_eq!(s.get(p), m.get(&p).copied());
                }
                let cut = next() % 4;
                s.retain(|e| !(e.0 as u64 + cut).is_multiple_of(3));
                m.retain(|&p, _| !(p as u64 + cut).is_multiple_of(3));
                assert_eq!(
                    s.hashed(),
                    m.len() > LINEAR_SUBS,
                    "{} in {}",
                    m.len(),
                    s.slots.len()
                );
                if !s.hashed() {
                    assert_eq!(s.slots.len(), m.len());
                }
                for p in 0..5000 {
                    assert_eq!(s.get(p), m.get(&p).copied());
                }
            }
        }
    }

    #[test]
    fn keys_made_and_forgotten_in_rounds_answer_as_a_model() {
        let mut next = crate::testutil::rng(0xdead_beef_1234_5677);
        let mut c = Catalog::default();
        let nss: Vec<NsId> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                c.put_schema(&Namespace::new(n).unwrap(), &Schema::default())
                    .unwrap()
                    .0
            })
            .collect();
        // model: (ns, name) -> id
        let mut model: BTreeMap<(NsId, String), KeyId> = BTreeMap::new();
        for round in 0..40 {
            for _ in 0..300 {
                let ns = nss[(next() % 3) as usize];
                let name = format!(
                    "{}key\0{:03}",
                    ["", "longlonglonglonglonglong"][(next() % 2) as usize],
                    next() % 400
                );
                let id = c.key_or_insert(ns, &name).unwrap();
                if let Some(&old) = model.get(&(ns, name.clone())) {
                    assert_eq!(old, id);
                }
                model.insert((ns, name), id);
                if next().is_multiple_of(2) {
                    c.sub_or_insert(id, "d", &format!("v{}", next() % 20))
                        .unwrap();
                }
            }
            // Forget about half: the keys not kept, their totals and subtotals not live.
            let keep: HashSet<KeyId> = model
                .values()
                .copied()
                .filter(|_| next().is_multiple_of(2))
                .collect();
            let keep2 = keep.clone();
            let ks: HashMap<SeriesId, KeyId> = model
                .values()
                .flat_map(|&k| {
                    c.keys[k as usize]
                        .subs
                        .iter()
                        .map(move |e| (e.1, k))
                        .collect::<Vec<_>>()
                })
                .collect();
            let live = move |sid: SeriesId| {
                if is_total(sid) {
                    keep2.contains(&(sid & !TOTAL))
                } else {
                    ks.get(&sid).is_some_and(|k| keep2.contains(k))
                }
            };
            if round % 2 == 0 {
                c.forget(&live);
            } else {
                c.begin_forget();
                let n = c.keys.len();
                let mut from = 0;
                while from < n {
                    let to = (from + 7).min(n);
                    c.forget_keys(&live, from..to);
                    from = to;
                }
                c.end_forget(true);
            }
            model.retain(|_, id| keep.contains(id));
            for (&(ns, ref name), &id) in &model {
                assert_eq!(c.key_id(ns, name), Some(id));
                assert_eq!(c.key_name(id), name);
                assert_eq!(c.key_ns[id as usize], ns);
                assert_eq!(c.key_of_series(total_of(id)), Some(id));
                assert_eq!(c.ns_of_series(total_of(id)), Some(ns));
            }
            for ns in &nss {
                let want: Vec<KeyId> = model
                    .iter()
                    .filter(|((n, _), _)| n == ns)
                    .map(|(_, &i)| i)
                    .collect();
                assert_eq!(c.ns[*ns as usize].keys.iter().collect::<Vec<_>>(), want);
                assert_eq!(c.ns[*ns as usize].keys.len(), want.len());
            }
            assert_eq!(c.live_keys(), model.len());
            for kid in 0..c.keys.len() as KeyId {
                let live = model.values().any(|&i| i == kid);
                assert_eq!(c.key_of_series(total_of(kid)).is_some(), live);
                assert_eq!(c.key_ns[kid as usize] == FREE_KEY, !live);
            }
        }
    }
}

//! The realtime tier: counters in memory, sharded by key so that every series of one key —
//! its total and its subtotals — lives under one lock. A batch updates a shard's keys in one
//! critical section and a read of a key holds that same lock, which is what makes an
//! event visible wholly or not at all.
//!
//! A counter is named by `series id << 32 | bucket index` (the bucket start divided by the
//! resolution; timestamps are below 2^32, so it fits), and held in 8 bytes: the series, the
//! bucket as an offset from its map's base, and the count as an `i16`, with counts past
//! that range, and buckets outside the base's window, kept whole in a small map beside it
//! (see [`Counters`]). Two `Counters` per resolution slot, one per [`Lane`]: totals apart
//! from subtotals, so that a walk over a tier's totals (a top of keys over today) does not
//! step over every subtotal, and an event's total lands in the smaller map. Zero counters
//! are removed rather than kept. Counters a flush is writing are *frozen*: moved to a sorted
//! array per slot (16 bytes each, no hash table), read by binary search until their segment
//! is published.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::seeded::State;

use crate::catalog::SeriesId;
use crate::entries::Entries;

/// A counter's name as a map key: its series id and its bucket index's offset from the
/// map's [`Counters::base`], as three `u16`s, so that an entry (with its [`Narrow`] count)
/// takes 8 bytes rather than 16 (see [`Entries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Name([u16; 3]);

impl Name {
    /// The counter key of this name in a map based at `base`.
    fn key(self, base: u32) -> u64 {
        let sid = (u32::from(self.0[0]) << 16) | u32::from(self.0[1]);
        counter_key(sid, base.wrapping_add(u32::from(self.0[2])))
    }
}

/// Bucket indexes a map's entries can name: `base` up to this many after it (a window of
/// 45 days of minutes, 18 hours of seconds, 7 years of hours).
const WINDOW: u32 = 1 << 16;

/// A count as a counter's entry holds it.
type Narrow = i16;

/// What a counter's entry holds when its count does not fit a [`Narrow`]: the count is in
/// [`Counters::wide`].
const WIDE: Narrow = Narrow::MIN;

/// The count of counter `k` whose entry holds `n`: `n`, or its count in `wide`.
fn whole(wide: &HashMap<u64, i64, State>, k: u64, n: Narrow) -> i64 {
    if n == WIDE {
        wide.get(&k).copied().unwrap_or(0)
    } else {
        i64::from(n)
    }
}

/// A count as an entry holds it, if it fits (and is not the [`WIDE`] mark).
fn narrow(n: i64) -> Option<Narrow> {
    Narrow::try_from(n).ok().filter(|&s| s != WIDE)
}

/// One lane's live counters. A count is 64 bits (and wraps past them, as in Redis), but
/// nearly every count is small, and a map's counters are of a few hours or days: each
/// counter is an 8-byte entry naming its series and its bucket as an offset from the map's
/// `base`, whose `i16` is its count, or [`WIDE`] when the count is in `wide`, a map of the
/// few that do not fit (a busy key's hourly total, say: 24 bytes then, the two entries).
/// Events of amount 1 leave the entry only after 32 768 of them, so wide counters are few
/// wherever counters are many. A counter whose bucket lies outside the window from `base`
/// (a late event far back, or time moving on past the window) is *far*: held in `wide`
/// alone. An empty map takes its base from its first counter; a freeze or a sweep moves
/// it when far counters are held or the newest come near the window's end.
///
/// A workload of large amounts (bytes, microseconds) makes most counts wide, and two
/// entries each cost more than one 16-byte entry: once more than [`WHOLE_AT`] of a map's
/// counters are wide, every count moves into `wide` and `narrow` is let go (*whole* mode,
/// one look-up an update); a freeze that leaves at most [`NARROW_AT`] of them too large for
/// an entry moves them back. Each switch, like each move of the base, rebuilds the map
/// under its shard's lock: a pause of that shard's writes once per switch, as long as a
/// rehash of the map takes. (`tally-bench engine amount=1000000`: 47.5 bytes of maps a
/// live counter with two entries each, entries of 10 bytes then, 28.9 whole; at amount 1,
/// 18.7 with 10-byte entries, 15.4 with 8-byte ones.)
#[derive(Debug, Default)]
pub struct Counters {
    narrow: Entries,
    wide: HashMap<u64, i64, State>,
    /// Every count is in `wide`, and `narrow` is empty.
    whole: bool,
    /// The bucket index entries' offsets count from.
    base: u32,
    /// Counters outside the window, held in `wide` alone (0 in whole mode).
    far: usize,
    /// The largest offset an entry has, or more: exact after a `retain` or a rebuild,
    /// raised by each new entry.
    top: u16,
}

/// The share of wide counters (in 1/16ths) past which a map holds every count whole: a
/// wide counter costs both entries (~8 + ~17 bytes a slot), a whole one ~17, so whole
/// mode is the smaller past ~35%.
const WHOLE_AT: usize = 6;

/// The share of counts too large for an entry (in 1/16ths) at or below which a whole map
/// goes back to narrow entries (below [`WHOLE_AT`], so that a map does not switch back and
/// forth).
const NARROW_AT: usize = 3;

/// Maps smaller than this do not switch to whole mode: it would save little.
const SWITCH_MIN: usize = 64;

impl Counters {
    pub fn len(&self) -> usize {
        if self.whole {
            self.wide.len()
        } else {
            self.narrow.len() + self.far
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the maps hold (entries, spare slots, the wide map's control bytes).
    pub fn bytes(&self) -> usize {
        self.narrow.bytes() + self.wide.capacity() * (std::mem::size_of::<(u64, i64)>() + 1)
    }

    /// The name of counter `k` in this map, if its bucket is inside the window.
    fn name(&self, k: u64) -> Option<Name> {
        let (sid, idx) = split_key(k);
        let off = idx.wrapping_sub(self.base);
        // Series `u32::MAX` is the entries' free marker: such a counter is held far.
        (off < WINDOW)
            .then_some(Name([(sid >> 16) as u16, sid as u16, off as u16]))
            .filter(|n| Entries::holds(n.0))
    }

    /// A counter's count, if held.
    pub fn get(&self, k: u64) -> Option<i64> {
        if self.whole {
            return self.wide.get(&k).copied();
        }
        match self.name(k) {
            Some(name) => self.narrow.get(name.0).map(|n| whole(&self.wide, k, n)),
            None => self.wide.get(&k).copied(),
        }
    }

    /// Adds `n` to a counter (made if new; removed when it comes to zero). Counts wrap past
    /// 64 bits. Inlined, with [`Shard::add`], into the batch's update loop: as calls they
    /// took ~14% more instructions on that path (`cachegrind` of `tally-bench replay`,
    /// docs/benchmarks.md).
    #[inline]
    pub fn add(&mut self, k: u64, n: i64) {
        if self.whole {
            add_whole(&mut self.wide, k, n);
            return;
        }
        if self.narrow.is_empty() && self.far == 0 {
            // Empty (so is `wide`): the window starts a little before this counter.
            self.base = split_key(k).1.saturating_sub(WINDOW / 4);
            self.top = 0;
        }
        let Some(name) = self.name(k) else {
            let before = self.wide.len();
            add_whole(&mut self.wide, k, n);
            self.far = (self.far + self.wide.len()) - before;
            self.whole_if_mostly_wide();
            return;
        };
        match self.narrow.position(name.0) {
            Some(at) => {
                let e = self.narrow.count_at(at);
                let was_wide = e == WIDE;
                let sum = whole(&self.wide, k, e).wrapping_add(n);
                match narrow(sum) {
                    Some(0) => self.narrow.remove_at(at),
                    Some(s) => self.narrow.set_at(at, s),
                    None => {
                        self.narrow.set_at(at, WIDE);
                        self.wide.insert(k, sum);
                        self.whole_if_mostly_wide();
                        return;
                    }
                }
                if was_wide {
                    self.wide.remove(&k);
                }
            }
            None => match narrow(n) {
                Some(0) => {}
                Some(s) => {
                    self.narrow.insert(name.0, s);
                    self.top = self.top.max(name.0[2]);
                }
                None => {
                    self.narrow.insert(name.0, WIDE);
                    self.wide.insert(k, n);
                    self.top = self.top.max(name.0[2]);
                    self.whole_if_mostly_wide();
                }
            },
        }
    }

    /// Brings the slot an update of counter `k` reads first into cache.
    #[inline]
    pub fn prefetch(&self, k: u64) {
        if !self.whole
            && let Some(name) = self.name(k)
        {
            self.narrow.prefetch(name.0);
        }
    }

    /// Every counter, `(counter key, count)`, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, i64)> + '_ {
        // The wide ones (and the far ones) from their own map, with no look-up each: they
        // gather in the totals lane, which a top over today walks whole.
        let base = self.base;
        let narrow = self.narrow.iter().filter(|e| e.1 != WIDE);
        narrow
            .map(move |(k, n)| (Name(k).key(base), i64::from(n)))
            .chain(self.wide.iter().map(|(&k, &n)| (k, n)))
    }

    /// Every counter's key, in no order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        // In whole mode `narrow` is empty; else `wide`'s keys inside the window are in
        // `narrow` too.
        let base = self.base;
        let alone = (self.whole || self.far > 0).then_some(&self.wide);
        self.narrow
            .iter()
            .map(move |(k, _)| Name(k).key(base))
            .chain(
                alone
                    .into_iter()
                    .flat_map(|w| w.keys().copied())
                    .filter(move |&k| self.whole || self.name(k).is_none()),
            )
    }

    /// Keeps the counters `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, i64) -> bool) {
        if self.whole {
            self.wide.retain(|&k, n| keep(k, *n));
            return;
        }
        let (wide, base) = (&mut self.wide, self.base);
        let mut top = 0;
        self.narrow.retain(|name, n| {
            let k = Name(name).key(base);
            let kept = keep(k, whole(wide, k, n));
            if !kept && n == WIDE {
                wide.remove(&k);
            }
            if kept {
                top = top.max(name[2]);
            }
            kept
        });
        self.top = top;
        if self.far > 0 {
            let mut far = 0;
            self.wide.retain(|&k, n| {
                // Far: outside the window, or of the series entries cannot name (as
                // `Counters::name` says).
                let (sid, idx) = split_key(k);
                if idx.wrapping_sub(base) < WINDOW && sid != u32::MAX {
                    return true;
                }
                let kept = keep(k, *n);
                far += usize::from(kept);
                kept
            });
            self.far = far;
        }
    }

    /// Moves every count into `wide` once more than [`WHOLE_AT`] sixteenths of them are
    /// wide or far (see [`Counters`]).
    fn whole_if_mostly_wide(&mut self) {
        let (n, w) = (self.len(), self.wide.len());
        if n < SWITCH_MIN || w * 16 <= n * WHOLE_AT {
            return;
        }
        let narrow = std::mem::take(&mut self.narrow);
        self.wide.reserve(narrow.len());
        for (k, c) in narrow.iter() {
            if c != WIDE {
                self.wide.insert(Name(k).key(self.base), i64::from(c));
            }
        }
        (self.whole, self.far) = (true, 0);
    }

    /// Rebuilds the map from `all` counters (every count, none in the maps), with a window
    /// from `base`.
    fn rebuild(&mut self, base: u32, all: impl Iterator<Item = (u64, i64)>) {
        (self.whole, self.base, self.far, self.top) = (false, base, 0, 0);
        for (k, c) in all {
            let name = self.name(k);
            if let Some(name) = name {
                self.top = self.top.max(name.0[2]);
            }
            match (name, narrow(c)) {
                (Some(name), Some(s)) => {
                    self.narrow.insert(name.0, s);
                }
                (Some(name), None) => {
                    self.narrow.insert(name.0, WIDE);
                    self.wide.insert(k, c);
                }
                (None, _) => {
                    self.wide.insert(k, c);
                    self.far += 1;
                }
            }
        }
    }

    /// Where a window over these buckets is best placed: at the start of the stretch of
    /// three quarters of a window that holds the most of them (the latest, of equals), in
    /// blocks of 1/64 of a window, so a quarter is left ahead for the counters to come.
    /// Outliers (a late event far back, one far ahead) stay far.
    fn base_for(buckets: impl Iterator<Item = u32>) -> Option<u32> {
        const BLOCK: u32 = WINDOW / 64;
        const SPAN: u32 = 48;
        let mut blocks: BTreeMap<u32, usize> = BTreeMap::new();
        for i in buckets {
            *blocks.entry(i / BLOCK).or_default() += 1;
        }
        let blocks: Vec<(u32, usize)> = blocks.into_iter().collect();
        let (mut best, mut at, mut sum, mut end) = (0, None, 0, 0);
        for &(start, n) in &blocks {
            while let Some(&(_, m)) = blocks.get(end).filter(|e| e.0 < start + SPAN) {
                (sum, end) = (sum + m, end + 1);
            }
            if sum >= best {
                (best, at) = (sum, Some(start * BLOCK));
            }
            sum -= n;
        }
        at
    }

    /// Moves a whole map back to narrow entries when at most [`NARROW_AT`] sixteenths of its
    /// counts are too large for one (a flush froze the busy period, a sweep dropped it).
    fn narrow_if_mostly_small(&mut self) {
        if !self.whole {
            return;
        }
        let n = self.wide.len();
        let large = self.wide.values().filter(|&&c| narrow(c).is_none()).count();
        if large * 16 > n * NARROW_AT {
            return;
        }
        let all = std::mem::take(&mut self.wide);
        let base = Counters::base_for(all.keys().map(|&k| split_key(k).1)).unwrap_or(0);
        self.narrow.reserve(n);
        self.rebuild(base, all.into_iter());
    }

    /// Moves the window when more than an eighth of the counters are far, or the newest
    /// come within a quarter of its end: to where [`Counters::base_for`] puts it, if that
    /// differs.
    fn move_window(&mut self) {
        if self.whole || self.is_empty() {
            return;
        }
        let base = self.base;
        if self.far * 8 <= self.len() && u32::from(self.top) < WINDOW / 4 * 3 {
            return;
        }
        let Some(to) = Counters::base_for(self.iter().map(|(k, _)| split_key(k).1)) else {
            return;
        };
        if to == base {
            return;
        }
        let all: Vec<(u64, i64)> = self.iter().collect();
        self.narrow = Entries::default();
        self.wide = HashMap::default();
        self.narrow.reserve(all.len());
        self.rebuild(to, all.into_iter());
    }

    /// Gives back spare capacity once a map holds under a quarter of it (a flush empties
    /// most of a map: memory goes back rather than stay at the peak), goes back to narrow
    /// entries where they are now the smaller, and moves the window where time has gone.
    pub fn shrink_if_sparse(&mut self) {
        self.narrow_if_mostly_small();
        self.move_window();
        if self.narrow.len() < self.narrow.capacity() / 4 {
            self.narrow.shrink_to_fit();
        }
        if self.wide.len() < self.wide.capacity() / 4 {
            self.wide.shrink_to_fit();
        }
    }
}

/// Adds `n` to counter `k` of a map of whole counts (removed at zero).
fn add_whole(wide: &mut HashMap<u64, i64, State>, k: u64, n: i64) {
    match wide.entry(k) {
        Entry::Occupied(mut e) => {
            let sum = e.get().wrapping_add(n);
            if sum == 0 {
                e.remove();
            } else {
                *e.get_mut() = sum;
            }
        }
        Entry::Vacant(e) => {
            if n != 0 {
                e.insert(n);
            }
        }
    }
}

/// Frozen counters: `(counter key, count)` sorted by key, keys unique.
pub type Frozen = Vec<(u64, i64)>;

fn frozen_get(f: &Frozen, k: u64) -> i64 {
    f.binary_search_by_key(&k, |e| e.0).map_or(0, |i| f[i].1)
}

/// Keeps a shard's lock on its own cache lines, away from its neighbours'.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// Which map of a slot a series' counters live in (see the module doc). The caller knows:
/// a key's total series is `Total`, each (dimension, value) series `Sub`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Total = 0,
    Sub = 1,
}

impl Lane {
    const ALL: [Lane; 2] = [Lane::Total, Lane::Sub];
}

/// Where the live map of `(slot, lane)` is in `Shard::maps`.
fn at(slot: usize, lane: Lane) -> usize {
    slot * 2 + lane as usize
}

#[derive(Debug, Default)]
pub struct Shard {
    /// Indexed by resolution slot and lane: the map of `(slot, lane)` is at
    /// `slot * 2 + lane`.
    pub maps: Vec<Counters>,
    /// Per slot, the lowest and highest bucket index of the live counters, or wider: grown
    /// by every add, made exact again by each freeze (which walks the map anyway). Reads
    /// clamp their probes to it, so "all time" over recent data costs what the data spans,
    /// and a range the archive alone holds costs nothing here.
    extent: Vec<(u32, u32)>,
    /// Per slot, the same for the frozen counters; emptied with them.
    frozen_extent: Vec<(u32, u32)>,
    /// Per slot, counters a flush is writing to a segment, sorted by counter key, one entry
    /// per key: still read from here until the segment is published, then dropped (or put
    /// back if the flush fails).
    /// Shared with the flush writing them, which reads them without a copy or the lock.
    pub frozen: Vec<Arc<Frozen>>,
    /// From the moment a flush fixes its log position until it freezes this shard
    /// ([`Shard::expect_freeze`] to [`Shard::end_freeze`]): the ranges it will freeze, per
    /// slot, and every update made meanwhile to a counter inside them. Those updates come
    /// after the flush's log position, so the freeze takes them back out of what it
    /// freezes and leaves them live: the frozen counters are exactly the log's up to that
    /// position, and writes, late ones too, never wait for a freeze.
    pending: Option<Arc<FreezeRanges>>,
    since: Vec<(u32, Lane, u64, i64)>,
}

/// Per memtable slot, the `[lo, hi)` bucket index ranges a flush freezes.
pub type FreezeRanges = std::collections::BTreeMap<usize, Vec<(u32, u32)>>;

impl Shard {
    /// The live map of one slot's lane, made (with the slot's others) if new.
    pub fn map(&mut self, slot: usize, lane: Lane) -> &mut Counters {
        if self.maps.len() <= at(slot, Lane::Sub) {
            self.maps
                .resize_with(at(slot, Lane::Sub) + 1, Counters::default);
            self.extent.resize(slot + 1, EMPTY);
        }
        &mut self.maps[at(slot, lane)]
    }

    fn live_map(&self, slot: usize, lane: Lane) -> Option<&Counters> {
        self.maps.get(at(slot, lane))
    }

    /// The resolution slot of the live map at `i` of `maps`.
    pub fn slot_of_map(i: usize) -> usize {
        i / 2
    }

    /// Keeps a slot's live counters (both lanes) that `keep` accepts.
    pub fn retain_live(&mut self, slot: usize, mut keep: impl FnMut(u64) -> bool) {
        for lane in Lane::ALL {
            self.map(slot, lane);
            self.retain_map(at(slot, lane), |k, _| keep(k));
        }
    }

    /// Keeps the live counters of `maps[i]` that `keep` accepts (then gives back spare
    /// room); returns how many went. A counter dropped while a freeze is expected takes the
    /// updates noted for it along (they went with it: the freeze must not take them out of
    /// what it freezes and put them back).
    pub fn retain_map(&mut self, i: usize, mut keep: impl FnMut(u64, i64) -> bool) -> usize {
        let Some(map) = self.maps.get_mut(i) else {
            return 0;
        };
        let noting = self.pending.is_some() && !self.since.is_empty();
        let mut dropped = Vec::new();
        let before = map.len();
        map.retain(|k, n| {
            let kept = keep(k, n);
            if !kept && noting {
                dropped.push(k);
            }
            kept
        });
        let removed = before - map.len();
        if removed > 0 {
            map.shrink_if_sparse();
        }
        if !dropped.is_empty() {
            dropped.sort_unstable();
            let slot = Shard::slot_of_map(i) as u32;
            self.since
                .retain(|e| e.0 != slot || dropped.binary_search(&e.2).is_err());
        }
        removed
    }

    /// The lowest and highest bucket index of a slot's frozen counters (a flush is writing
    /// them to a segment not yet published), or an empty range (`lo > hi`).
    pub fn frozen_bounds(&self, slot: usize) -> (u32, u32) {
        self.frozen_extent.get(slot).copied().unwrap_or(EMPTY)
    }

    /// The `[lo, hi)` bucket indexes of a slot that can hold counters, live or frozen:
    /// every counter of the slot lies inside it.
    pub fn extent(&self, slot: usize) -> (u32, u32) {
        let (live, frozen) = (self.extent.get(slot), self.frozen_extent.get(slot));
        let (lo, hi) = union(
            live.copied().unwrap_or(EMPTY),
            frozen.copied().unwrap_or(EMPTY),
        );
        if lo <= hi {
            (lo, hi.saturating_add(1))
        } else {
            (0, 0)
        }
    }

    #[inline]
    pub fn add(&mut self, slot: usize, lane: Lane, series: SeriesId, bucket_index: u32, n: i64) {
        if n == 0 {
            return;
        }
        if let Some(ranges) = &self.pending {
            let frozen = ranges.get(&slot).is_some_and(|r| {
                r.iter()
                    .any(|&(lo, hi)| lo <= bucket_index && bucket_index < hi)
            });
            if frozen {
                let k = counter_key(series, bucket_index);
                if self.since.len() == self.since.capacity() && self.since.len() >= 4096 {
                    // Full: one entry per counter before it grows, so the notes take at
                    // most about twice what the counters updated need, not one per update.
                    net_updates(&mut self.since);
                }
                self.since.push((slot as u32, lane, k, n));
            }
        }
        self.map(slot, lane);
        let e = &mut self.extent[slot];
        *e = union(*e, (bucket_index, bucket_index));
        self.maps[at(slot, lane)].add(counter_key(series, bucket_index), n);
    }

    /// Brings into cache what [`Shard::add`] of the same counter reads first.
    #[inline]
    pub fn prefetch(&self, slot: usize, lane: Lane, series: SeriesId, bucket_index: u32) {
        if let Some(m) = self.live_map(slot, lane) {
            m.prefetch(counter_key(series, bucket_index));
        }
    }

    /// A counter's value: live plus frozen.
    pub fn get(&self, slot: usize, lane: Lane, series: SeriesId, bucket_index: u32) -> i64 {
        let k = counter_key(series, bucket_index);
        let live = self.live_map(slot, lane).and_then(|m| m.get(k));
        // Counts wrap past 64 bits, their sums too.
        live.unwrap_or(0)
            .wrapping_add(self.frozen.get(slot).map_or(0, |f| frozen_get(f, k)))
    }

    /// Counters held, live and frozen.
    pub fn live(&self) -> usize {
        self.maps.iter().map(Counters::len).sum::<usize>()
            + self.frozen.iter().map(|f| f.len()).sum::<usize>()
    }

    /// How many counters one lane of a slot holds, live, plus the slot's frozen counters
    /// (of both lanes; a key can be live and frozen): what walking them costs.
    pub fn count(&self, slot: usize, lane: Lane) -> usize {
        self.live_map(slot, lane).map_or(0, Counters::len)
            + self.frozen.get(slot).map_or(0, |f| f.len())
    }

    /// Every live counter of one lane of a slot, then the slot's frozen counters of both
    /// lanes (the caller tells them apart by series); a key live and frozen comes twice
    /// (the caller adds them).
    pub fn counters(&self, slot: usize, lane: Lane) -> impl Iterator<Item = (u64, i64)> + '_ {
        let live = self
            .live_map(slot, lane)
            .into_iter()
            .flat_map(Counters::iter);
        live.chain(
            self.frozen
                .get(slot)
                .into_iter()
                .flat_map(|f| f.iter())
                .copied(),
        )
    }

    /// Moves a slot's counters whose bucket index lies in one of `ranges` (`[lo, hi)`) to its
    /// frozen array, in one pass over the slot; the live extent becomes exact again.
    pub fn freeze(&mut self, slot: usize, ranges: &[(u32, u32)]) {
        self.map(slot, Lane::Total);
        if self.frozen.len() <= slot {
            self.frozen.resize_with(slot + 1, Arc::default);
            self.frozen_extent.resize(slot + 1, EMPTY);
        }
        let frozen = Arc::make_mut(&mut self.frozen[slot]);
        let had = frozen.len();
        let (mut kept, mut moved) = (EMPTY, self.frozen_extent[slot]);
        for lane in Lane::ALL {
            let live = &mut self.maps[at(slot, lane)];
            live.retain(|k, n| {
                let i = split_key(k).1;
                if ranges.iter().any(|&(lo, hi)| lo <= i && i < hi) {
                    frozen.push((k, n));
                    moved = union(moved, (i, i));
                    false
                } else {
                    kept = union(kept, (i, i));
                    true
                }
            });
            live.shrink_if_sparse();
        }
        self.extent[slot] = kept;
        self.frozen_extent[slot] = moved;
        frozen.sort_unstable_by_key(|e| e.0);
        if had > 0 {
            // Frozen twice before a publish: one entry per key, summed.
            frozen.dedup_by(|later, first| {
                let same = later.0 == first.0;
                if same {
                    first.1 = first.1.wrapping_add(later.1);
                }
                same
            });
            frozen.retain(|e| e.1 != 0);
        }
    }

    /// Notes that a flush has fixed its log position and will freeze `ranges` here: until
    /// [`Shard::end_freeze`], updates inside them are noted apart (see `Shard::pending`).
    pub fn expect_freeze(&mut self, ranges: Arc<FreezeRanges>) {
        self.pending = Some(ranges);
        self.since.clear();
    }

    /// After [`Shard::freeze`] of every slot the flush takes: the updates noted since
    /// [`Shard::expect_freeze`] leave the frozen counters (which then hold the log's up to
    /// the flush's position) and stay live. Also what a flush that stops before freezing
    /// this shard calls (nothing frozen: the updates are live already).
    pub fn end_freeze(&mut self) {
        if self.pending.take().is_none() {
            return;
        }
        let mut net = std::mem::take(&mut self.since);
        net_updates(&mut net);
        // Slots whose frozen array a note brought a count to zero in.
        let mut zeroed: Vec<usize> = Vec::new();
        for (slot, lane, k, n) in net {
            let slot = slot as usize;
            let Some(frozen) = self.frozen.get_mut(slot) else {
                continue;
            };
            let frozen = Arc::make_mut(frozen);
            match frozen.binary_search_by_key(&k, |e| e.0) {
                Ok(i) => {
                    frozen[i].1 = frozen[i].1.wrapping_sub(n);
                    if frozen[i].1 == 0 && !zeroed.contains(&slot) {
                        zeroed.push(slot);
                    }
                }
                // The counter was 0 when the freeze ran (these updates cancelled what the
                // log held up to the position): the frozen count is what they took away.
                Err(i) => {
                    frozen.insert(i, (k, n.wrapping_neg()));
                    let idx = split_key(k).1;
                    self.frozen_extent[slot] = union(self.frozen_extent[slot], (idx, idx));
                }
            }
            let (series, idx) = split_key(k);
            self.add(slot, lane, series, idx, n);
        }
        for slot in zeroed {
            Arc::make_mut(&mut self.frozen[slot]).retain(|e| e.1 != 0);
        }
    }

    /// Stops noting updates for a freeze that did not reach this shard (the flush stopped
    /// early): they are live, as everything here is.
    pub fn cancel_freeze(&mut self) {
        self.pending = None;
        self.since = Vec::new();
    }

    /// Puts every frozen counter back (a flush failed), each in its lane: `is_total` says
    /// which series are totals.
    pub fn thaw(&mut self, is_total: &dyn Fn(SeriesId) -> bool) {
        let frozen = std::mem::take(&mut self.frozen);
        self.frozen_extent.clear();
        for (slot, map) in frozen.into_iter().enumerate() {
            for &(k, n) in map.iter() {
                let (series, idx) = split_key(k);
                let lane = if is_total(series) {
                    Lane::Total
                } else {
                    Lane::Sub
                };
                self.add(slot, lane, series, idx, n);
            }
        }
    }

    /// Drops every frozen counter (its segment is published).
    pub fn drop_frozen(&mut self) {
        self.frozen.clear();
        self.frozen_extent.clear();
    }
}

/// Noted updates `(slot, lane, counter key, n)` summed into one per counter, sorted, those
/// that sum to zero left out.
fn net_updates(v: &mut Vec<(u32, Lane, u64, i64)>) {
    v.sort_unstable_by_key(|e| (e.0, e.2));
    v.dedup_by(|later, first| {
        let same = (later.0, later.2) == (first.0, first.2);
        if same {
            first.3 = first.3.wrapping_add(later.3);
        }
        same
    });
    v.retain(|e| e.3 != 0);
}

/// An extent holding nothing (`lo > hi`); the identity of [`union`].
const EMPTY: (u32, u32) = (u32::MAX, 0);

/// The smallest inclusive `(lo, hi)` extent holding both.
fn union(a: (u32, u32), b: (u32, u32)) -> (u32, u32) {
    (a.0.min(b.0), a.1.max(b.1))
}

pub fn counter_key(series: SeriesId, bucket_index: u32) -> u64 {
    (u64::from(series) << 32) | u64::from(bucket_index)
}

pub fn split_key(k: u64) -> (SeriesId, u32) {
    ((k >> 32) as u32, k as u32)
}

#[derive(Debug)]
pub struct Memtable {
    shards: Box<[Padded<Mutex<Shard>>]>,
}

impl Memtable {
    pub fn new(shards: usize) -> Self {
        let n = shards.max(1);
        Memtable {
            shards: (0..n)
                .map(|_| Padded(Mutex::new(Shard::default())))
                .collect(),
        }
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    pub fn shard_of(&self, key: u32) -> usize {
        key as usize % self.shards.len()
    }

    /// Locks one shard. A panic while holding it would have left whole counters behind
    /// (every update is a single add), so a poisoned lock is still usable.
    pub fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard % self.shards.len()]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn live(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).live()).sum()
    }

    /// Bytes the counter maps hold (entries, control bytes, spare capacity).
    pub fn bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock(i).maps.iter().map(Counters::bytes).sum::<usize>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::rng;

    #[test]
    fn counters_add_and_vanish_at_zero() {
        let mut s = Shard::default();
        s.add(2, Lane::Total, 7, 100, 5);
        s.add(2, Lane::Total, 7, 100, -5);
        s.add(0, Lane::Total, 7, 100, 0);
        assert_eq!(s.live(), 0);
        s.add(1, Lane::Total, u32::MAX, u32::MAX, -3);
        assert_eq!(s.get(1, Lane::Total, u32::MAX, u32::MAX), -3);
        assert_eq!(split_key(counter_key(u32::MAX, 9)), (u32::MAX, 9));
    }

    /// Updates made between a flush's log position and its freeze of the shard leave the
    /// frozen counters, which hold what the log held up to the position, and stay live;
    /// every read sums to the same in the end. A freeze that does not reach the shard
    /// leaves everything live.
    #[test]
    fn updates_during_a_freeze_stay_live_and_out_of_what_it_freezes() {
        let mut s = Shard::default();
        // Up to the flush's position: bucket 1 of series 7 and 8, bucket 9 of series 7.
        s.add(0, Lane::Total, 7, 1, 5);
        s.add(0, Lane::Sub, 8, 1, 3);
        s.add(0, Lane::Total, 7, 9, 2);
        s.expect_freeze(Arc::new(FreezeRanges::from([(0, vec![(0, 4)])])));
        // After it: to a counter that was there, a new one, one that nets to zero from
        // the position's count, and one outside the ranges.
        s.add(0, Lane::Total, 7, 1, 10);
        s.add(0, Lane::Total, 7, 2, 4);
        s.add(0, Lane::Sub, 8, 1, -3);
        s.add(0, Lane::Total, 7, 9, 1);
        // A counter dropped before the freeze (a removed tier, the sweep) takes its noted
        // updates along: nothing of it is frozen or put back.
        s.add(0, Lane::Total, 6, 3, 2);
        s.add(0, Lane::Total, 6, 3, 5);
        s.retain_live(0, |k| split_key(k).0 != 6);
        s.freeze(0, &[(0, 4)]);
        s.end_freeze();
        assert_eq!(
            *s.frozen[0],
            vec![(counter_key(7, 1), 5), (counter_key(8, 1), 3)]
        );
        assert_eq!(s.get(0, Lane::Total, 6, 3), 0);
        let live = |s: &Shard, lane: Lane| {
            let mut v: Vec<_> = s.live_map(0, lane).unwrap().iter().collect();
            v.sort_unstable();
            v
        };
        assert_eq!(
            live(&s, Lane::Total),
            vec![
                (counter_key(7, 1), 10),
                (counter_key(7, 2), 4),
                (counter_key(7, 9), 3)
            ]
        );
        assert_eq!(live(&s, Lane::Sub), vec![(counter_key(8, 1), -3)]);
        assert_eq!(
            (s.get(0, Lane::Total, 7, 1), s.get(0, Lane::Sub, 8, 1)),
            (15, 0)
        );
        // After the freeze nothing is noted; a freeze that never comes notes nothing.
        s.add(0, Lane::Total, 7, 1, 1);
        s.expect_freeze(Arc::new(FreezeRanges::from([(0, vec![(0, 4)])])));
        s.add(0, Lane::Total, 7, 3, 6);
        s.cancel_freeze();
        s.end_freeze();
        assert_eq!(
            (s.get(0, Lane::Total, 7, 1), s.get(0, Lane::Total, 7, 3)),
            (16, 6)
        );
        assert!(s.since.is_empty() && s.pending.is_none());
    }

    /// Notes of many updates to few counters are summed as they grow: they stay about as
    /// many as the counters, and the freeze still takes out exactly what they added.
    #[test]
    fn notes_of_a_freeze_are_summed_as_they_grow() {
        let mut s = Shard::default();
        s.add(0, Lane::Total, 1, 2, 100);
        s.expect_freeze(Arc::new(FreezeRanges::from([(0, vec![(0, 10)])])));
        for i in 0..50_000u32 {
            s.add(
                0,
                Lane::Total,
                i % 20,
                i % 10,
                if i % 3 == 0 { -1 } else { 2 },
            );
        }
        assert!(s.since.len() <= 2 * 4096, "{} notes", s.since.len());
        let total: i64 = (0..20)
            .flat_map(|sid| (0..10).map(move |b| (sid, b)))
            .map(|(sid, b)| s.get(0, Lane::Total, sid, b))
            .sum();
        s.freeze(0, &[(0, 10)]);
        s.end_freeze();
        assert_eq!(
            *s.frozen[0],
            vec![(counter_key(1, 2), 100)],
            "what the log held"
        );
        let live: i64 = s
            .live_map(0, Lane::Total)
            .unwrap()
            .iter()
            .map(|e| e.1)
            .sum();
        assert_eq!(live + 100, total);
    }

    /// Series `u32::MAX` is the entries' free marker: its counters are far wherever their
    /// bucket lies, and a retain drops them and counts them as such (found by a review).
    #[test]
    fn a_counter_of_the_free_markers_series_is_far_and_retained_as_one() {
        let (mut c, mut model) = (Counters::default(), HashMap::new());
        model_add(&mut c, &mut model, counter_key(5, 1000), 3);
        model_add(&mut c, &mut model, counter_key(u32::MAX, 1001), 4);
        model_add(&mut c, &mut model, counter_key(u32::MAX, 1002), 5);
        assert_same(&c, &model);
        assert_eq!(c.far, 2);
        c.retain(|k, n| split_key(k).0 != u32::MAX || n == 5);
        model.retain(|&k, n| split_key(k).0 != u32::MAX || *n == 5);
        assert_same(&c, &model);
        assert_eq!((c.far, c.len()), (1, 2));
    }

    /// Adds `n` to counter `k` of both the map and its model.
    fn model_add(c: &mut Counters, model: &mut HashMap<u64, i64>, k: u64, n: i64) {
        c.add(k, n);
        let e = model.entry(k).or_insert(0);
        *e = e.wrapping_add(n);
        if *e == 0 {
            model.remove(&k);
        }
    }

    /// The map holds what its model does, by every way of reading it.
    fn assert_same(c: &Counters, model: &HashMap<u64, i64>) {
        assert_eq!(c.len(), model.len());
        for (&k, &n) in model {
            assert_eq!(c.get(k), Some(n), "key {k}");
        }
        assert_eq!(c.get(u64::MAX), None);
        let mut got: Vec<(u64, i64)> = c.iter().collect();
        got.sort_unstable();
        let mut want: Vec<(u64, i64)> = model.iter().map(|(&k, &n)| (k, n)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
        let mut keys: Vec<u64> = c.keys().collect();
        keys.sort_unstable();
        assert_eq!(keys, want.iter().map(|e| e.0).collect::<Vec<_>>());
        // The layout's own rules.
        if c.whole {
            assert!(c.narrow.is_empty() && c.far == 0);
            return;
        }
        let far = c.wide.keys().filter(|&&k| c.name(k).is_none()).count();
        assert_eq!(c.far, far, "far counters counted");
        for &k in c.wide.keys() {
            if let Some(name) = c.name(k) {
                assert_eq!(
                    c.narrow.get(name.0),
                    Some(WIDE),
                    "a wide count has its mark"
                );
            }
        }
        for (name, n) in c.narrow.iter() {
            assert!(
                n != WIDE || c.wide.contains_key(&Name(name).key(c.base)),
                "a mark, its count"
            );
            assert!(name[2] <= c.top, "top bounds every offset");
        }
    }

    /// Random adds (near and far buckets, near 0 and near the top of the bucket range,
    /// small, large and wrapping amounts), retains and freezes' shrinks, against a model.
    #[test]
    fn counters_answer_as_a_model_map_through_random_operations() {
        let centres = [
            0u32,
            5,
            20_000,
            70_000,
            1 << 20,
            u32::MAX - 10,
            u32::MAX / 2,
        ];
        let amounts = [
            1i64,
            -1,
            2,
            40_000,
            -40_000,
            i64::MAX,
            i64::MIN,
            1 << 40,
            32_767,
        ];
        for seed in 1..25u64 {
            let mut next = rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let (mut c, mut model) = (Counters::default(), HashMap::new());
            let home = centres[(next() % centres.len() as u64) as usize];
            for _ in 0..1_000 {
                let r = next();
                match r % 100 {
                    0..=84 => {
                        let centre = if r.is_multiple_of(7) {
                            centres[(r >> 8) as usize % centres.len()]
                        } else {
                            home
                        };
                        let spread = [3u32, 100, 70_000, 200_000][(r >> 20) as usize % 4];
                        let off = ((r >> 24) as u32) % spread;
                        let idx = if (r >> 40) & 1 == 0 {
                            centre.wrapping_add(off)
                        } else {
                            centre.wrapping_sub(off)
                        };
                        let sid = ((r >> 44) % 40) as u32 | (((r >> 50) & 1) as u32) << 31;
                        let n = amounts[(r >> 52) as usize % amounts.len()];
                        model_add(&mut c, &mut model, counter_key(sid, idx), n);
                    }
                    85..=92 => {
                        let keep = |k: u64, n: i64| match (r >> 10) % 5 {
                            0 => !split_key(k).1.is_multiple_of(3),
                            1 => narrow(n).is_some(),
                            2 => split_key(k).0.is_multiple_of(2),
                            3 => false,
                            _ => true,
                        };
                        c.retain(keep);
                        model.retain(|&k, n| keep(k, *n));
                    }
                    _ => c.shrink_if_sparse(),
                }
                assert_same(&c, &model);
            }
        }
    }

    /// Buckets outside a map's window (late events far back, time moving past its end) are
    /// held whole beside the entries; a freeze or sweep moves the window to where the
    /// counters are, after which they are entries again. Throughout, the map answers as a
    /// plain map of counts does (a model), small and large counts alike.
    #[test]
    fn counters_outside_the_window_are_kept_and_the_window_follows_time() {
        let mut c = Counters::default();
        let mut model: HashMap<u64, i64> = HashMap::new();
        let mut next = rng(0x9E37_79B9_7F4A_7C15);
        let now = 30_000_000u32;
        model_add(&mut c, &mut model, counter_key(7, now), 1);
        assert_eq!((c.base, c.far), (now - WINDOW / 4, 0));
        for i in 0..2_000u32 {
            model_add(&mut c, &mut model, counter_key(i % 64, now + i), 1);
        }
        // Series near and far in time, counts small and large, some back to zero.
        for i in 0..20_000u64 {
            let r = next();
            let idx = match i % 8 {
                0 => now - (r % 200_000) as u32,
                1 => now + (r % 100_000) as u32,
                _ => now + (r % 3_000) as u32,
            };
            let n = if r.is_multiple_of(11) {
                1 << 40
            } else {
                1 - (r % 3) as i64
            };
            model_add(
                &mut c,
                &mut model,
                counter_key((r >> 40) as u32 % 64, idx),
                n,
            );
        }
        assert!(
            c.far > 0 && !c.whole,
            "far counters held beside the entries"
        );
        assert_same(&c, &model);
        // A sweep drops the old ones: the window moves to the rest.
        let keep = |k: u64| split_key(k).1 >= now;
        c.retain(|k, _| keep(k));
        model.retain(|&k, _| keep(k));
        assert_same(&c, &model);
        c.shrink_if_sparse();
        // They span more than the window: it holds the busy first 3 000, a few far ahead.
        assert!(c.base <= now && now + 3_000 <= c.base + WINDOW / 4 * 3);
        assert!(
            c.far > 0 && c.far * 8 <= c.len(),
            "{} far of {}",
            c.far,
            c.len()
        );
        assert_same(&c, &model);
        // Time moves past the window's end: new counters are far until a freeze takes the
        // old ones and the window follows.
        let later = now + 3 * WINDOW;
        for i in 0..2_000u32 {
            model_add(&mut c, &mut model, counter_key(i % 50, later + i % 600), 1);
        }
        assert!(c.far >= 600, "{}", c.far);
        assert_same(&c, &model);
        c.retain(|k, _| split_key(k).1 >= later);
        model.retain(|&k, _| split_key(k).1 >= later);
        c.shrink_if_sparse();
        assert_eq!((c.base, c.far), (later / 1024 * 1024, 0));
        assert_eq!(c.narrow.len(), model.len(), "every counter an entry again");
        assert_same(&c, &model);
        // Whole mode and back keeps far counters right too.
        for i in 0..200u32 {
            model_add(&mut c, &mut model, counter_key(i, later + 5), 1 << 50);
            model_add(&mut c, &mut model, counter_key(i, 10), 3);
        }
        assert!(c.whole);
        assert_same(&c, &model);
        c.retain(|k, _| split_key(k).1 != later + 5);
        model.retain(|&k, _| split_key(k).1 != later + 5);
        c.shrink_if_sparse();
        assert!(!c.whole && c.far == 200, "narrow again, the old ones far");
        assert_same(&c, &model);
        // Emptied, a map takes its window from its next counter.
        c.retain(|_, _| false);
        model.clear();
        model_add(&mut c, &mut model, counter_key(1, 5), 1);
        assert_eq!((c.base, c.far, c.narrow.len()), (0, 0, 1));
        assert_same(&c, &model);
    }

    /// A map whose counts are mostly too large for an entry holds them all whole, and goes
    /// back to narrow entries once a freeze leaves few of them; either way it answers as a
    /// plain map of counts does (a model), wrapping past 64 bits.
    #[test]
    fn a_map_of_mostly_large_counts_holds_them_whole_and_goes_back() {
        let mut c = Counters::default();
        let mut model: HashMap<u64, i64> = HashMap::new();
        let mut next = rng(0x2545_F491_4F6C_DD1D);
        let (add, same) = (model_add, assert_same);
        for k in 0..1_000 {
            add(&mut c, &mut model, k, 1);
        }
        assert!(!c.whole, "small counts stay narrow");
        same(&c, &model);
        let amounts = [1_000_000, -1_000_000, 70_000, i64::MAX, i64::MIN, -1, 3];
        for i in 0..6_000 {
            let k = next() % 1_500;
            let n = amounts[i % amounts.len()];
            add(&mut c, &mut model, k, n);
            if i == 3_000 {
                assert!(c.whole, "mostly large counts: whole");
                same(&c, &model);
            }
        }
        assert!(c.whole);
        same(&c, &model);
        // Counts back to zero leave, whole or not.
        let k = *model.keys().next().unwrap();
        let n = model[&k];
        add(&mut c, &mut model, k, n.wrapping_neg());
        assert_eq!(c.get(k), None);
        same(&c, &model);
        // A freeze takes the large counts: narrow entries again.
        c.retain(|_, n| narrow(n).is_some());
        model.retain(|_, n| narrow(*n).is_some());
        c.shrink_if_sparse();
        assert!(!c.whole, "few large counts left: narrow again");
        same(&c, &model);
        for k in 0..50 {
            add(&mut c, &mut model, k, i64::MAX);
        }
        same(&c, &model);
    }

    /// Counts past the entry's 16 bits, the entry's marker value itself, and 64-bit
    /// wrapping: every count reads back whole, through `get`, `iter`, `retain` and a freeze,
    /// and a count that comes back into range (or to zero) leaves no wide entry behind.
    #[test]
    fn counts_past_the_entry_are_kept_whole() {
        let mut c = Counters::default();
        let big = i64::from(Narrow::MAX);
        c.add(1, big);
        c.add(1, 1);
        assert_eq!((c.get(1), c.wide.len()), (Some(big + 1), 1));
        c.add(1, -2);
        assert_eq!((c.get(1), c.wide.len()), (Some(big - 1), 0), "narrow again");
        c.add(2, i64::from(WIDE));
        assert_eq!(
            c.get(2),
            Some(i64::from(Narrow::MIN)),
            "the marker's own value"
        );
        c.add(3, i64::MAX);
        c.add(3, 2);
        assert_eq!(c.get(3), Some(i64::MIN + 1), "wraps past 64 bits");
        c.add(3, i64::MAX);
        assert_eq!(c.get(3), None, "back to zero: gone");
        assert_eq!(c.wide.len(), 1, "key 2's alone: key 3's went with it");
        // A narrow sum that lands on the marker, and a wide count that comes back to it.
        c.add(5, -1);
        c.add(5, i64::from(Narrow::MIN) + 1);
        assert_eq!((c.get(5), c.wide.len()), (Some(i64::from(Narrow::MIN)), 2));
        c.add(6, i64::from(Narrow::MIN) - 1);
        c.add(6, 1);
        assert_eq!((c.get(6), c.wide.len()), (Some(i64::from(Narrow::MIN)), 3));
        c.add(5, 1);
        c.add(6, -i64::from(Narrow::MIN));
        assert_eq!(
            (c.get(5), c.get(6), c.wide.len()),
            (Some(i64::from(Narrow::MIN) + 1), None, 1)
        );
        c.add(4, -5);
        c.add(4, i64::MIN);
        assert_eq!(c.get(4), Some(i64::MAX - 4));
        let mut all: Vec<(u64, i64)> = c.iter().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            vec![
                (1, big - 1),
                (2, i64::from(Narrow::MIN)),
                (4, i64::MAX - 4),
                (5, i64::from(Narrow::MIN) + 1)
            ]
        );
        c.retain(|k, n| k != 2 && n != i64::MAX - 4);
        assert_eq!(
            (c.len(), c.wide.len()),
            (2, 0),
            "retain drops wide entries too"
        );

        let mut s = Shard::default();
        s.add(0, Lane::Sub, 9, 3, i64::MAX);
        s.add(0, Lane::Sub, 9, 4, 7);
        s.freeze(0, &[(0, 4)]);
        assert_eq!(s.frozen[0].as_slice(), &[(counter_key(9, 3), i64::MAX)]);
        assert_eq!(s.get(0, Lane::Sub, 9, 3), i64::MAX);
        s.add(0, Lane::Sub, 9, 3, 1);
        assert_eq!(
            s.get(0, Lane::Sub, 9, 3),
            i64::MIN,
            "live plus frozen wraps"
        );
        s.freeze(0, &[(0, 4)]);
        assert_eq!(
            s.frozen[0].as_slice(),
            &[(counter_key(9, 3), i64::MIN)],
            "frozen twice: summed, wrapping"
        );
        s.thaw(&|_| false);
        assert_eq!((s.get(0, Lane::Sub, 9, 3), s.live()), (i64::MIN, 2));
    }

    #[test]
    fn frozen_counters_stay_readable_and_thaw_back() {
        let mut s = Shard::default();
        s.add(0, Lane::Total, 1, 10, 2);
        s.add(0, Lane::Total, 1, 20, 3);
        s.freeze(0, &[(0, 15)]);
        assert_eq!(
            (s.maps[at(0, Lane::Total)].len(), s.frozen[0].len()),
            (1, 1)
        );
        assert_eq!(
            (s.get(0, Lane::Total, 1, 10), s.get(0, Lane::Total, 1, 20)),
            (2, 3)
        );
        s.add(0, Lane::Total, 1, 10, 4);
        assert_eq!(
            s.get(0, Lane::Total, 1, 10),
            6,
            "a late add lands beside the frozen counter"
        );
        s.thaw(&|_| true);
        assert_eq!(
            (
                s.maps[at(0, Lane::Total)].len(),
                s.get(0, Lane::Total, 1, 10)
            ),
            (2, 6)
        );
        s.freeze(0, &[(0, 100)]);
        s.drop_frozen();
        assert_eq!(s.live(), 0);
    }

    #[test]
    fn the_extent_bounds_every_counter_and_narrows_at_each_freeze() {
        let mut s = Shard::default();
        assert_eq!(s.extent(0), (0, 0), "nothing held");
        s.add(0, Lane::Total, 1, 10, 2);
        s.add(0, Lane::Total, 2, 30, 1);
        s.add(0, Lane::Total, 1, 50, 1);
        assert_eq!(s.extent(0), (10, 51));
        s.freeze(0, &[(0, 40)]);
        assert_eq!(s.extent(0), (10, 51), "frozen counters are still held");
        s.drop_frozen();
        assert_eq!(s.extent(0), (50, 51), "only the live counter at 50 is left");
        s.add(0, Lane::Total, 3, 20, 7);
        assert_eq!(s.extent(0), (20, 51), "a late add widens it again");
        s.freeze(0, &[(0, 40)]);
        s.thaw(&|_| true);
        assert_eq!(s.extent(0), (20, 51), "thawed counters are live again");
        assert_eq!(s.get(0, Lane::Total, 3, 20), 7);
        s.freeze(0, &[(0, 100)]);
        s.drop_frozen();
        assert_eq!(s.extent(0), (0, 0), "everything flushed");
        assert_eq!(s.extent(5), (0, 0), "a slot never used");
    }

    #[test]
    fn frozen_twice_keeps_one_sorted_entry_per_counter() {
        let mut s = Shard::default();
        for (series, idx, n) in [(3, 5, 1), (1, 7, 2), (1, 5, 4), (2, 9, 8)] {
            s.add(0, Lane::Total, series, idx, n);
        }
        s.freeze(0, &[(0, 8)]);
        // Late adds to a frozen counter and to a new one, then a second freeze.
        s.add(0, Lane::Total, 1, 5, 16);
        s.add(0, Lane::Total, 3, 5, -1);
        s.add(0, Lane::Total, 2, 6, 32);
        s.freeze(0, &[(0, 8)]);
        let keys: Vec<(u32, u32, i64)> = s.frozen[0]
            .iter()
            .map(|&(k, n)| (split_key(k).0, split_key(k).1, n))
            .collect();
        assert_eq!(
            keys,
            vec![(1, 5, 20), (1, 7, 2), (2, 6, 32)],
            "summed, netted to zero dropped, sorted by (series, bucket)"
        );
        assert_eq!(
            (
                s.get(0, Lane::Total, 1, 5),
                s.get(0, Lane::Total, 3, 5),
                s.get(0, Lane::Total, 2, 9)
            ),
            (20, 0, 8)
        );
        assert_eq!(s.count(0, Lane::Total), 4);
        let mut all: Vec<(u64, i64)> = s.counters(0, Lane::Total).collect();
        all.sort_unstable();
        assert_eq!(all.len(), 4);
    }

    #[test]
    fn lanes_keep_totals_apart_and_freeze_and_thaw_together() {
        let mut s = Shard::default();
        s.add(0, Lane::Total, 1, 10, 2);
        s.add(0, Lane::Sub, 2, 10, 3);
        s.add(0, Lane::Sub, 2, 20, 5);
        assert_eq!((s.count(0, Lane::Total), s.count(0, Lane::Sub)), (1, 2));
        assert_eq!(
            s.get(0, Lane::Sub, 1, 10),
            0,
            "a total is not in the subtotals' map"
        );
        assert_eq!(
            s.counters(0, Lane::Total).collect::<Vec<_>>(),
            vec![(counter_key(1, 10), 2)]
        );
        s.freeze(0, &[(0, 15)]);
        assert_eq!(
            (s.get(0, Lane::Total, 1, 10), s.get(0, Lane::Sub, 2, 10)),
            (2, 3)
        );
        assert_eq!(
            s.count(0, Lane::Total),
            2,
            "frozen counters of both lanes are walked"
        );
        s.thaw(&|sid| sid == 1);
        assert_eq!(
            (s.count(0, Lane::Total), s.count(0, Lane::Sub)),
            (1, 2),
            "back in their lanes"
        );
        s.retain_live(0, |k| split_key(k).0 != 2);
        assert_eq!((s.live(), s.get(0, Lane::Total, 1, 10)), (1, 2));
        assert_eq!(Shard::slot_of_map(at(3, Lane::Sub)), 3);
    }
}

//! The realtime tier: counters in memory, sharded by key so that every series of one key —
//! its total and its subtotals — lives under one lock. A batch updates a shard's keys in one
//! critical section and a read of a key holds that same lock, which is what makes an
//! event visible wholly or not at all.
//!
//! A counter is one `u64 → i64` entry: `series id << 32 | bucket index` (the bucket start
//! divided by the resolution; timestamps are below 2^32, so it fits). One map per
//! resolution slot. Zero counters are removed rather than kept.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Mutex, MutexGuard, PoisonError};

use foldhash::fast::FixedState;

use crate::catalog::SeriesId;

pub type Counters = HashMap<u64, i64, FixedState>;

/// Keeps a shard's lock on its own cache lines, away from its neighbours'.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Debug, Default)]
pub struct Shard {
    /// Indexed by resolution slot.
    pub maps: Vec<Counters>,
    /// Per slot, the lowest and highest bucket index ever added (never shrunk): reads clamp
    /// their probes to it, so "all time" over recent data costs what the data spans.
    pub extent: Vec<(u32, u32)>,
    /// Per slot, counters a flush is writing to a segment: still read from here until the
    /// segment is published, then dropped (or put back if the flush fails).
    pub frozen: Vec<Counters>,
}

impl Shard {
    pub fn map(&mut self, slot: usize) -> &mut Counters {
        if self.maps.len() <= slot {
            self.maps.resize_with(slot + 1, Counters::default);
            self.extent.resize(slot + 1, (u32::MAX, 0));
        }
        &mut self.maps[slot]
    }

    /// The `[lo, hi)` bucket indexes of a slot that can hold counters.
    pub fn extent(&self, slot: usize) -> (u32, u32) {
        match self.extent.get(slot) {
            Some(&(lo, hi)) if lo <= hi => (lo, hi.saturating_add(1)),
            _ => (0, 0),
        }
    }

    pub fn add(&mut self, slot: usize, series: SeriesId, bucket_index: u32, n: i64) {
        if n == 0 {
            return;
        }
        self.map(slot);
        let e = &mut self.extent[slot];
        *e = (e.0.min(bucket_index), e.1.max(bucket_index));
        match self.maps[slot].entry(counter_key(series, bucket_index)) {
            Entry::Occupied(mut e) => {
                *e.get_mut() += n;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            Entry::Vacant(e) => {
                e.insert(n);
            }
        }
    }

    /// A counter's value: live plus frozen.
    pub fn get(&self, slot: usize, series: SeriesId, bucket_index: u32) -> i64 {
        let k = counter_key(series, bucket_index);
        let of = |maps: &[Counters]| maps.get(slot).and_then(|m| m.get(&k)).copied().unwrap_or(0);
        of(&self.maps) + of(&self.frozen)
    }

    pub fn live(&self) -> usize {
        self.maps.iter().chain(&self.frozen).map(HashMap::len).sum()
    }

    /// Moves a slot's counters whose bucket index lies in one of `ranges` (`[lo, hi)`) to its
    /// frozen map, in one pass over the slot.
    pub fn freeze(&mut self, slot: usize, ranges: &[(u32, u32)]) {
        self.map(slot);
        if self.frozen.len() <= slot {
            self.frozen.resize_with(slot + 1, Counters::default);
        }
        let (live, frozen) = (&mut self.maps[slot], &mut self.frozen[slot]);
        live.retain(|k, n| {
            let i = split_key(*k).1;
            if ranges.iter().any(|&(lo, hi)| lo <= i && i < hi) {
                *frozen.entry(*k).or_default() += *n;
                false
            } else {
                true
            }
        });
        // A flush empties most of a map: give the memory back rather than keep the peak.
        if live.len() < live.capacity() / 4 {
            live.shrink_to_fit();
        }
    }

    /// Puts every frozen counter back (a flush failed).
    pub fn thaw(&mut self) {
        let frozen = std::mem::take(&mut self.frozen);
        for (slot, map) in frozen.into_iter().enumerate() {
            for (k, n) in map {
                let (series, idx) = split_key(k);
                self.add(slot, series, idx, n);
            }
        }
    }

    /// Drops every frozen counter (its segment is published).
    pub fn drop_frozen(&mut self) {
        self.frozen.clear();
    }
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
            .map(|i| {
                self.lock(i)
                    .maps
                    .iter()
                    .map(|m| m.capacity() * (std::mem::size_of::<(u64, i64)>() + 1))
                    .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_and_vanish_at_zero() {
        let mut s = Shard::default();
        s.add(2, 7, 100, 5);
        s.add(2, 7, 100, -5);
        s.add(0, 7, 100, 0);
        assert_eq!(s.live(), 0);
        s.add(1, u32::MAX, u32::MAX, -3);
        assert_eq!(s.get(1, u32::MAX, u32::MAX), -3);
        assert_eq!(split_key(counter_key(u32::MAX, 9)), (u32::MAX, 9));
    }

    #[test]
    fn frozen_counters_stay_readable_and_thaw_back() {
        let mut s = Shard::default();
        s.add(0, 1, 10, 2);
        s.add(0, 1, 20, 3);
        s.freeze(0, &[(0, 15)]);
        assert_eq!((s.maps[0].len(), s.frozen[0].len()), (1, 1));
        assert_eq!((s.get(0, 1, 10), s.get(0, 1, 20)), (2, 3));
        s.add(0, 1, 10, 4);
        assert_eq!(
            s.get(0, 1, 10),
            6,
            "a late add lands beside the frozen counter"
        );
        s.thaw();
        assert_eq!((s.maps[0].len(), s.get(0, 1, 10)), (2, 6));
        s.freeze(0, &[(0, 100)]);
        s.drop_frozen();
        assert_eq!(s.live(), 0);
    }
}

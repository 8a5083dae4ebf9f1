//! Decoded segment dictionaries, bounded per process. A segment's dictionary (its dimension
//! names and values) is decoded when the segment is opened, to check it, and then kept here
//! rather than in the segment: a server holding years of segments, or a loader writing
//! segments whose values are long and all different, held every dictionary for the life of
//! each segment (a review measured 150 MB of them in `tally load --memory-mb 16`: 100 000
//! values of 2 KB). At most [`budget`] bytes of dictionaries stay decoded at once,
//! process-wide: past it the least recently used are dropped, and a read of a dropped one
//! reads its bytes from the file again (checked against the CRC32C taken at open) and
//! decodes them. A dictionary larger than the whole budget is decoded for each read that
//! needs it and never kept (each such read counts as a miss).
//!
//! The budget bounds what is held between reads. A read holds its segment's dictionary
//! while it runs (a scan or a compaction's merge for its whole length, one for each segment
//! it merges), in addition, and a read that misses a dictionary another still holds decodes
//! a copy of its own. One segment's dictionary is decoded whole, however large: the format
//! has no way to read part of it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::codec::Dictionary;

/// The bound unless set otherwise ([`set_budget`]): far more than the dictionaries of a
/// usual archive (a country and a few thousand referrers take tens of KiB a segment).
pub const DEFAULT_BUDGET: usize = 256 << 20;

static BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_BUDGET);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Dictionaries decoded again because they had been dropped (for tests and metrics).
static MISSES: AtomicU64 = AtomicU64::new(0);

struct Cache {
    /// Segment's id → (its dictionary, its weight in bytes, when last used).
    held: BTreeMap<u64, (Arc<Dictionary>, usize, u64)>,
    /// When last used → segment's id: the least recently used first.
    order: BTreeMap<u64, u64>,
    bytes: usize,
    clock: u64,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    held: BTreeMap::new(),
    order: BTreeMap::new(),
    bytes: 0,
    clock: 0,
});

fn cache() -> MutexGuard<'static, Cache> {
    // Every update leaves the maps consistent before it can panic (none of them does).
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bound in force, in bytes.
pub fn budget() -> usize {
    BUDGET.load(Ordering::Relaxed)
}

/// Sets the bound for the whole process (at least 1 byte); dictionaries held past it are
/// dropped now.
pub fn set_budget(bytes: usize) {
    BUDGET.store(bytes.max(1), Ordering::Relaxed);
    cache().shrink(None);
}

/// Bytes of dictionaries held now.
pub fn held_bytes() -> usize {
    cache().bytes
}

/// Dictionaries decoded again since the process started, because they had been dropped.
pub fn misses() -> u64 {
    MISSES.load(Ordering::Relaxed)
}

/// A new segment's id in this cache.
pub(crate) fn new_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Segment `id`'s dictionary if it is held (it becomes the most recently used).
pub(crate) fn get(id: u64) -> Option<Arc<Dictionary>> {
    let mut c = cache();
    c.clock += 1;
    let now = c.clock;
    let (dict, _, used) = c.held.get_mut(&id)?;
    let (dict, before) = (Arc::clone(dict), std::mem::replace(used, now));
    c.order.remove(&before);
    c.order.insert(now, id);
    Some(dict)
}

/// Holds segment `id`'s dictionary, dropping the least recently used others past the
/// budget; one larger than the budget is not held. `again`: it had been dropped before.
pub(crate) fn put(id: u64, dict: &Arc<Dictionary>, again: bool) {
    if again {
        MISSES.fetch_add(1, Ordering::Relaxed);
    }
    let weight = dict.bytes();
    if weight > budget() {
        return;
    }
    let mut c = cache();
    c.clock += 1;
    let now = c.clock;
    if let Some((_, w, used)) = c.held.insert(id, (Arc::clone(dict), weight, now)) {
        c.bytes -= w;
        c.order.remove(&used);
    }
    c.bytes += weight;
    c.order.insert(now, id);
    c.shrink(Some(id));
}

/// Drops segment `id`'s dictionary (the segment is gone).
pub(crate) fn forget(id: u64) {
    let mut c = cache();
    if let Some((_, w, used)) = c.held.remove(&id) {
        c.bytes -= w;
        c.order.remove(&used);
    }
}

impl Cache {
    /// Drops the least recently used dictionaries, but `keep`, until the budget holds.
    fn shrink(&mut self, keep: Option<u64>) {
        let budget = budget();
        while self.bytes > budget {
            let Some((&used, &id)) = self.order.iter().find(|(_, id)| Some(**id) != keep) else {
                break;
            };
            self.order.remove(&used);
            if let Some((_, w, _)) = self.held.remove(&id) {
                self.bytes -= w;
            }
        }
    }
}

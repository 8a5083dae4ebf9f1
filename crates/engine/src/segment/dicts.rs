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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use super::codec::Dictionary;

/// The bound unless set otherwise ([`set_budget`]): far more than the dictionaries of a
/// usual archive (a country and a few thousand referrers take tens of KiB a segment).
pub const DEFAULT_BUDGET: usize = 256 << 20;

static BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_BUDGET);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Microseconds since the cache was first used: when a slot was read last (a read stores
/// it in its own slot, writing no line every thread shares).
fn now() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}
/// Dictionaries decoded again because they had been dropped (for tests and metrics).
static MISSES: AtomicU64 = AtomicU64::new(0);

/// One segment's place in the cache: its dictionary while held. A read takes it under a
/// read lock of its own (no lock every reader shares); only holding and dropping take the
/// cache's lock. Dropping the slot (the segment is gone) forgets it.
#[derive(Debug)]
pub(crate) struct Slot {
    id: u64,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dict: RwLock<Option<Arc<Dictionary>>>,
    /// [`now`] when last read.
    used: AtomicU64,
}

struct Cache {
    /// Every live slot, held or not, by id, with the weight of what it holds (0: nothing).
    slots: HashMap<u64, (Arc<Inner>, usize)>,
    /// The ids of the slots holding a dictionary.
    held: std::collections::HashSet<u64>,
    bytes: usize,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    // Every update leaves the map and the count consistent before it can panic; nothing
    // dropped under this lock takes it again (no `Drop` of `Inner` or `Dictionary` does).
    let mut g: MutexGuard<'_, Option<Cache>> = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(|| Cache {
        slots: HashMap::new(),
        held: std::collections::HashSet::new(),
        bytes: 0,
    }))
}

/// The bound in force, in bytes.
pub fn budget() -> usize {
    BUDGET.load(Ordering::Relaxed)
}

/// Sets the bound for the whole process (at least 1 byte); dictionaries held past it are
/// dropped now.
pub fn set_budget(bytes: usize) {
    BUDGET.store(bytes.max(1), Ordering::Relaxed);
    with_cache(|c| c.shrink(None));
}

/// Bytes of dictionaries held now.
pub fn held_bytes() -> usize {
    with_cache(|c| c.bytes)
}

/// Dictionaries decoded again since the process started, because they had been dropped.
pub fn misses() -> u64 {
    MISSES.load(Ordering::Relaxed)
}

fn write(inner: &Inner) -> std::sync::RwLockWriteGuard<'_, Option<Arc<Dictionary>>> {
    inner.dict.write().unwrap_or_else(PoisonError::into_inner)
}

impl Slot {
    /// A new segment's slot, holding `dict` (just decoded at open) if the budget allows.
    pub(crate) fn new(dict: &Arc<Dictionary>) -> Slot {
        let slot = Slot {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            inner: Arc::new(Inner {
                dict: RwLock::new(None),
                used: AtomicU64::new(0),
            }),
        };
        with_cache(|c| {
            c.slots.insert(slot.id, (Arc::clone(&slot.inner), 0));
        });
        slot.hold(dict, false);
        slot
    }

    /// Its dictionary if held (it becomes the most recently used).
    pub(crate) fn get(&self) -> Option<Arc<Dictionary>> {
        let d = self
            .inner
            .dict
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        self.inner.used.store(now(), Ordering::Relaxed);
        Some(d)
    }

    /// Holds `dict`, dropping the least recently used others past the budget; one larger
    /// than the budget is not held. `again`: it had been dropped before.
    pub(crate) fn hold(&self, dict: &Arc<Dictionary>, again: bool) {
        if again {
            MISSES.fetch_add(1, Ordering::Relaxed);
        }
        let now = now();
        let weight = dict.bytes();
        if weight > budget() {
            return;
        }
        with_cache(|c| {
            let Some(entry) = c.slots.get_mut(&self.id) else {
                return;
            };
            let before = std::mem::replace(&mut entry.1, weight);
            c.bytes = c.bytes - before + weight;
            c.held.insert(self.id);
            *write(&self.inner) = Some(Arc::clone(dict));
            self.inner.used.store(now, Ordering::Relaxed);
            c.shrink(Some(self.id));
        });
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        with_cache(|c| {
            if let Some((_, w)) = c.slots.remove(&self.id) {
                c.bytes -= w;
            }
            c.held.remove(&self.id);
        });
    }
}

impl Cache {
    /// Drops the least recently used dictionaries, but `keep`'s, until the budget holds.
    fn shrink(&mut self, keep: Option<u64>) {
        let budget = budget();
        if self.bytes <= budget {
            return;
        }
        // The held ones, least recently read first: one pass, however many go.
        let mut held: Vec<(u64, u64)> = self
            .held
            .iter()
            .filter(|id| Some(**id) != keep)
            .filter_map(|id| Some((self.slots.get(id)?.0.used.load(Ordering::Relaxed), *id)))
            .collect();
        held.sort_unstable();
        for (_, id) in held {
            if self.bytes <= budget {
                break;
            }
            if let Some((inner, w)) = self.slots.get_mut(&id) {
                *write(inner) = None;
                self.bytes -= std::mem::take(w);
            }
            self.held.remove(&id);
        }
    }
}

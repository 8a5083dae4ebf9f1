//! The memtable's counter entries: an open-addressing table of 8-byte entries (a 6-byte
//! name, a 2-byte count, one `u64`), probed linearly from the name's hash, with no control
//! bytes.
//!
//! A `HashMap` of the same entries keeps a control byte per slot in an array of its own:
//! an update read a line of control bytes, then a line of entries elsewhere, and a slot
//! took 9 bytes (its `capacity()` is 7/8 of its slots, so the memtable's byte count was
//! low by that much). Here a probe compares one word of the entries themselves, and a slot
//! is 8 bytes. The table grows to half full when it passes 13/16 (a `HashMap` doubles at
//! 7/8, to 7/16). Linear probing slows as a table fills: at most 7/8 full and grown to
//! 11/20, `Counters::add` took 21.8% of the samples against the `HashMap`'s 19.2%; at 13/16
//! and 1/2, about as many as the `HashMap` in runs of the same length (`perf record` of
//! `tally-bench replay runs=1`: ~15% fewer with a one-multiply hash, which [`home`] explains
//! why it does not use). The table is a win in memory, not in speed.

/// A counter's name: its series id (two halves) and its bucket's offset.
pub type Key = [u16; 3];

/// What a free slot holds: series `u32::MAX`, which no counter's name has (the caller
/// keeps such counters elsewhere, see [`Entries::holds`]).
const FREE: u64 = 0xFFFF_FFFF_0000;

/// A slot's name bits: the name in the low 48 (series high half, low half, offset), the
/// count in the high 16, so that a probe compares one word.
const NAME: u64 = (1 << 48) - 1;

fn word(k: Key) -> u64 {
    let [a, b, c] = k.map(u64::from);
    (a << 32) | (b << 16) | c
}

fn key_of(s: u64) -> Key {
    [(s >> 32) as u16, (s >> 16) as u16, s as u16]
}

fn count_of(s: u64) -> i16 {
    (s >> 48) as u16 as i16
}

fn slot(name: u64, n: i16) -> u64 {
    name | (u64::from(n as u16) << 48)
}

/// Fewest slots a table with entries has.
const MIN_SLOTS: usize = 16;

#[derive(Debug, Default, Clone)]
pub struct Entries {
    slots: Box<[u64]>,
    len: usize,
}

/// The home slot of name `w` in a table of `size` slots: the name multiplied by a large
/// odd constant to 128 bits, the halves folded and multiplied again, then scaled to the size
/// by its high bits (multiplies, no division). One multiply (Fibonacci hashing) left long
/// runs where many series have one bucket each (an hourly map, the totals of one minute):
/// a step of one series is a step of 2^16 in the name, and its product's high bits move by
/// ~0.48 of the range, so series fell in few places (a review measured 51–59 probes a
/// look-up at 1 M series; ~1.5–3 now, as for random names). The name is first mixed with
/// the process's seed ([`crate::seeded`]), so that a client cannot work out names (series
/// and buckets) that all fall in one run of slots.
fn home(w: u64, size: usize) -> usize {
    home_seeded(w, crate::seeded::mix(), size)
}

fn home_seeded(w: u64, seed: u64, size: usize) -> usize {
    let x = crate::seeded::fold_mix(w, seed);
    ((u128::from(x) * size as u128) >> 64) as usize
}

/// The most of its slots a table fills before it grows, as (numerator, denominator).
const MAX_LOAD: (usize, usize) = (13, 16);

/// Slots for `n` entries: half full.
fn slots_for(n: usize) -> usize {
    (n * 2).max(MIN_SLOTS)
}

impl Entries {
    /// Whether a name can be an entry's (not the free marker's series).
    pub fn holds(k: Key) -> bool {
        word(k) & !0xFFFF != FREE
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the slots take.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.slots)
    }

    /// Slots the table has.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Where name `w` is: `Ok(slot)`, or `Err(slot)`, the free slot it would go in.
    #[inline]
    fn find(&self, w: u64) -> Result<usize, usize> {
        let size = self.slots.len();
        if size == 0 {
            return Err(0);
        }
        let mut i = home(w, size);
        loop {
            let name = self.slots[i] & NAME;
            if name == w {
                return Ok(i);
            }
            if name == FREE {
                return Err(i);
            }
            i = if i + 1 == size { 0 } else { i + 1 };
        }
    }

    /// Asks the CPU to bring `k`'s home slot into cache, ahead of an update to it: the
    /// memtable's adds each miss the cache, and a probe's branch on what it read keeps
    /// the CPU from starting the next add's miss before this one's ends. Asked a few adds
    /// ahead, the misses overlap: `Counters::add` with what it inlines took ~30% fewer of
    /// replay's adding thread's samples (docs/benchmarks.md). A plain read of the slot
    /// instead (`black_box`) gained nothing: it holds up the adds behind it as the miss
    /// does.
    #[inline]
    pub fn prefetch(&self, k: Key) {
        if self.slots.is_empty() {
            return;
        }
        let at = self.slots[home(word(k), self.slots.len())..].as_ptr();
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // Safety: `at` points into `slots`; a prefetch only hints the cache, never faults,
        // and neither reads nor writes anything the program sees.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at;
    }

    /// The slot holding `k`, for [`Entries::count_at`], [`Entries::set_at`] and
    /// [`Entries::remove_at`] (valid until the table next changes otherwise).
    #[inline]
    pub fn position(&self, k: Key) -> Option<usize> {
        self.find(word(k)).ok()
    }

    pub fn count_at(&self, i: usize) -> i16 {
        count_of(self.slots[i])
    }

    pub fn set_at(&mut self, i: usize, n: i16) {
        self.slots[i] = slot(self.slots[i] & NAME, n);
    }

    pub fn get(&self, k: Key) -> Option<i16> {
        self.position(k).map(|i| self.count_at(i))
    }

    /// Sets `k`'s count to `n` (made if new; `n` may be any value, 0 included).
    #[inline]
    pub fn insert(&mut self, k: Key, n: i16) {
        debug_assert!(Entries::holds(k));
        let w = word(k);
        match self.find(w) {
            Ok(i) => self.slots[i] = slot(w, n),
            Err(mut i) => {
                if (self.len + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
                    self.resize(slots_for(self.len + 1));
                    i = self.find(w).err().unwrap_or(0);
                }
                self.slots[i] = slot(w, n);
                self.len += 1;
            }
        }
    }

    /// Takes `k` out; its count, if it was in. (The memtable removes by position.)
    #[cfg(test)]
    pub fn remove(&mut self, k: Key) -> Option<i16> {
        let i = self.position(k)?;
        let n = self.count_at(i);
        self.remove_at(i);
        Some(n)
    }

    /// Frees slot `hole` (an entry's) and moves back the entries after it that its being
    /// taken would cut off from their home (backward-shift deletion: no tombstones).
    pub fn remove_at(&mut self, mut hole: usize) {
        let size = self.slots.len();
        let mut j = hole;
        loop {
            j = if j + 1 == size { 0 } else { j + 1 };
            let s = self.slots[j];
            if s & NAME == FREE {
                break;
            }
            // `s` stays unless its home lies cyclically in (hole, j]: then the hole is on
            // its probe path and it moves back into it.
            let h = home(s & NAME, size);
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !stays {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = FREE;
        self.len -= 1;
    }

    /// Every entry, `(name, count)`, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (Key, i16)> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s & NAME != FREE)
            .map(|&s| (key_of(s), count_of(s)))
    }

    /// Keeps the entries `keep` accepts (asked once each). A few dropped are taken out in
    /// place (a sweep); many (a freeze takes most of a map) rebuild the table from those
    /// kept, as taking each out would move the rest of its run back each time.
    pub fn retain(&mut self, mut keep: impl FnMut(Key, i16) -> bool) {
        let dropped: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                let s = self.slots[i];
                s & NAME != FREE && !keep(key_of(s), count_of(s))
            })
            .collect();
        if dropped.is_empty() {
            return;
        }
        if dropped.len() * 4 <= self.len {
            let names: Vec<u64> = dropped.iter().map(|&i| self.slots[i] & NAME).collect();
            for w in names {
                if let Ok(i) = self.find(w) {
                    self.remove_at(i);
                }
            }
            return;
        }
        // Sized for the kept ones, never larger than it was.
        let size = slots_for(self.len - dropped.len()).min(self.slots.len());
        let old = std::mem::take(&mut self.slots);
        let mut gone = dropped.into_iter().peekable();
        let all = old.iter().enumerate().filter_map(|(i, &s)| {
            if gone.peek() == Some(&i) {
                gone.next();
                return None;
            }
            (s & NAME != FREE).then_some(s)
        });
        self.fill(size, all);
    }

    /// Makes room for `more` entries beyond those it holds.
    pub fn reserve(&mut self, more: usize) {
        let n = self.len + more;
        if n * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.resize(slots_for(n));
        }
    }

    /// Gives back the room beyond what its entries need.
    pub fn shrink_to_fit(&mut self) {
        let size = if self.len == 0 {
            0
        } else {
            slots_for(self.len)
        };
        if size < self.slots.len() {
            self.resize(size);
        }
    }

    fn resize(&mut self, size: usize) {
        let old = std::mem::take(&mut self.slots);
        self.fill(size, old.iter().copied().filter(|&s| s & NAME != FREE));
    }

    /// Makes `size` slots holding the slots `all` (each a name at most once; fewer than
    /// `size` of them, which every caller's size leaves room for).
    fn fill(&mut self, size: usize, all: impl Iterator<Item = u64>) {
        self.slots = vec![FREE; size].into_boxed_slice();
        self.len = 0;
        for s in all {
            // A full table has no free slot to end a probe: `find` would never return.
            assert!(
                self.len + 1 < size,
                "entries overfill a table of {size} slots"
            );
            if let Err(i) = self.find(s & NAME) {
                self.slots[i] = s;
                self.len += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    #[should_panic(expected = "overfill")]
    fn a_fill_past_the_slots_stops_rather_than_probing_forever() {
        let mut t = Entries::default();
        t.fill(4, (0..4u64).map(|i| word([0, 1, i as u16])));
    }

    /// Random inserts, updates, removals, retains and shrinks against a `HashMap`, on names
    /// that collide often (few series, nearby offsets) and far apart; every entry stays
    /// reachable from its home through no free slot.
    #[test]
    fn entries_answer_as_a_map_through_random_operations() {
        let mut next = crate::testutil::rng(0x5eed_1234_abcd_0001);
        for round in 0..6 {
            let mut t = Entries::default();
            let mut model: HashMap<Key, i16> = HashMap::new();
            let spread = [4u64, 64, 1 << 16, 3, 1 << 10, 50][round];
            for step in 0..40_000 {
                let k: Key = [
                    (next() % 2) as u16,
                    (next() % spread) as u16,
                    (next() % spread) as u16,
                ];
                match next() % 16 {
                    0..=8 => {
                        let n = next() as i16;
                        t.insert(k, n);
                        model.insert(k, n);
                    }
                    9..=12 => assert_eq!(t.remove(k), model.remove(&k)),
                    13 if step % 97 == 0 => {
                        // A fifth dropped (taken out in place) or four fifths (rebuilt).
                        let (m, most) = (next() % 5, next().is_multiple_of(2));
                        let keep = |k: Key, n: i16| ((u64::from(k[2]) ^ n as u64) % 5 != m) != most;
                        let (before, mut asked) = (t.len(), 0);
                        t.retain(|k, n| {
                            asked += 1;
                            keep(k, n)
                        });
                        assert_eq!(asked, before, "each entry asked once");
                        model.retain(|&k, &mut n| keep(k, n));
                    }
                    14 if step % 89 == 0 => t.shrink_to_fit(),
                    15 if step % 83 == 0 => t.reserve((next() % 300) as usize),
                    _ => assert_eq!(t.get(k), model.get(&k).copied()),
                }
                assert_eq!(t.len(), model.len());
                if step % 1_999 == 0 {
                    let mut all: Vec<(Key, i16)> = t.iter().collect();
                    all.sort_unstable();
                    let mut want: Vec<(Key, i16)> = model.iter().map(|(&k, &n)| (k, n)).collect();
                    want.sort_unstable();
                    assert_eq!(all, want);
                    let size = t.capacity();
                    assert!(
                        size == 0 || t.len() * MAX_LOAD.1 <= size * MAX_LOAD.0,
                        "{} in {size}",
                        t.len()
                    );
                    for (i, s) in t.slots.iter().enumerate() {
                        if s & NAME == FREE {
                            continue;
                        }
                        // No free slot between its home and where it is.
                        let mut at = home(s & NAME, size);
                        while at != i {
                            assert_ne!(t.slots[at] & NAME, FREE, "{s:x} cut off from home");
                            at = (at + 1) % size;
                        }
                    }
                }
            }
        }
    }

    /// Names of many series at one bucket (an hourly map; key ids a shard apart) spread as
    /// random ones do: look-ups probe few slots, even with the table as full as it gets.
    #[test]
    fn many_series_at_one_bucket_probe_few_slots() {
        for (stride, buckets) in [(1u32, 1u16), (8, 1), (1, 4), (8, 4), (64, 2)] {
            let mut t = Entries::default();
            let mut sid = 5u32 | (1 << 31);
            'fill: loop {
                for off in 0..buckets {
                    // Up to the most it holds before it grows, past 100 000 entries.
                    let full = (t.len() + 1) * MAX_LOAD.1 > t.capacity() * MAX_LOAD.0;
                    if t.len() > 100_000 && full {
                        break 'fill;
                    }
                    t.insert([(sid >> 16) as u16, sid as u16, off], 1);
                }
                sid += stride;
            }
            let size = t.capacity();
            let probes: usize = (0..size)
                .filter(|&i| t.slots[i] & NAME != FREE)
                .map(|i| (i + size - home(t.slots[i] & NAME, size)) % size + 1)
                .sum();
            let mean = probes as f64 / t.len() as f64;
            // Random names: (1 + 1 / (1 - 13/16)) / 2 = 3.17 at this load.
            assert!(
                mean < 4.0,
                "stride {stride} x {buckets}: {mean:.2} probes a look-up"
            );
        }
    }

    /// Names (series and buckets) picked because the hash without a seed sends them all
    /// to slot 0 of any table of up to 2^12 slots: with the process's seed they probe as
    /// few slots as random names do (without it, ~500 a look-up here).
    #[test]
    fn names_crafted_against_the_unseeded_hash_probe_few_slots() {
        let crafted: Vec<u64> = (0..1u64 << 23)
            .map(|i| word([(i >> 32) as u16, (i >> 16) as u16, i as u16]))
            .filter(|&w| home_seeded(w, 0, 1 << 12) == 0)
            .take(1_000)
            .collect();
        assert_eq!(crafted.len(), 1_000, "enough names found to collide");
        let mut t = Entries::default();
        for &w in &crafted {
            t.insert(key_of(w), 1);
        }
        let size = t.capacity();
        assert!(
            crafted.iter().all(|&w| home_seeded(w, 0, size) == 0),
            "unseeded, every one would start at slot 0"
        );
        let probes: usize = (0..size)
            .filter(|&i| t.slots[i] & NAME != FREE)
            .map(|i| (i + size - home(t.slots[i] & NAME, size)) % size + 1)
            .sum();
        let mean = probes as f64 / t.len() as f64;
        assert!(mean < 4.0, "{mean:.2} probes a look-up");
    }

    #[test]
    fn an_empty_table_answers_and_shrinks_to_nothing() {
        let mut t = Entries::default();
        assert_eq!(
            (t.get([0, 0, 0]), t.remove([0, 0, 0]), t.len()),
            (None, None, 0)
        );
        t.insert([0, 1, 2], 5);
        assert!(t.capacity() >= MIN_SLOTS);
        assert_eq!(t.remove([0, 1, 2]), Some(5));
        t.shrink_to_fit();
        assert_eq!((t.capacity(), t.bytes()), (0, 0));
        assert!(!Entries::holds([u16::MAX, u16::MAX, 7]) && Entries::holds([u16::MAX, 0, 7]));
    }
}

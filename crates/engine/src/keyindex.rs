//! A namespace's keys by name, in the catalog: a hash table for look-ups and a sorted list
//! for listing in byte order, both holding only key ids. The names are in the keys'
//! entries ([`crate::catalog::KeyEntry`]), read through a closure the catalog passes in.
//!
//! Before, the table held each name (inline up to 22 bytes: 32-byte slots) and a
//! `BTreeMap` each name again (a shared `Arc<str>`, its own allocation): on
//! `tally-bench engine`'s workload the catalog's keys took 7.3 B per live counter, now
//! 3.7 B (4.1 B since the sorted list keeps 8 bytes of each name). A look-up reads what it
//! read before — the table's slot, then the key's entry, which it needs next for the
//! key's subtotals — only in the other order. Making a key is a binary search over the
//! runs' heads, then over one run's entries, each with 8 bytes of its name after the
//! bytes all names share ([`KeyIndex::shared`]): names are read only where those tie.
//! (Reading a name a step, a cache miss each, took ~9% of replay's resolving thread;
//! `partition_point` and `insert` now take about half what they took.)

use std::ops::Bound;

use hashbrown::HashTable;

use crate::catalog::KeyId;
use crate::seeded::hash_bytes as hash;

/// Most ids in one run of the sorted list: a longer run is split in two. An insert or
/// removal moves up to this many ids; finding a place reads the runs' first bytes, then
/// ~log2(RUN) entries of one run. (512 took ~25% more time in `partition_point` under
/// `tally-bench replay`.)
const RUN: usize = 64;

/// Most leading bytes the index skips as shared by every name (see [`KeyIndex::shared`]).
const MAX_SHARED: usize = 16;

/// Keys (the new one included) past which a name that shares fewer leading bytes than the
/// index skips sets the skip to none at once. Each change of the skip rereads every name,
/// and the skip only shrinks until the index empties: at most [`MAX_SHARED`] partial
/// changes below this size (~1 M names read at worst) and one to none above it, about 17
/// reads per key made since the index was last empty. Once at none, it stays there though
/// the key that lowered it is forgotten: searches then read names wherever keys share
/// their first 8 bytes, as before the skip existed.
const RESKIP_FULLY_PAST: usize = if cfg!(test) { 200 } else { 1 << 16 };

/// A key's name as the index reads it: its bytes (compared and hashed as bytes, with no
/// UTF-8 check per comparison).
pub trait Names<'a>: Fn(KeyId) -> &'a [u8] {}

impl<'a, F: Fn(KeyId) -> &'a [u8]> Names<'a> for F {}

/// An id in the sorted list, with the 8 bytes of its name after the bytes every name
/// shares ([`KeyIndex::place`]), as two halves so that an entry takes 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sorted {
    hi: u32,
    lo: u32,
    id: KeyId,
}

impl Sorted {
    fn new(place: u64, id: KeyId) -> Sorted {
        Sorted {
            hi: (place >> 32) as u32,
            lo: place as u32,
            id,
        }
    }

    fn place(self) -> u64 {
        u64::from(self.hi) << 32 | u64::from(self.lo)
    }
}

#[derive(Debug, Default)]
pub struct KeyIndex {
    table: HashTable<KeyId>,
    /// Every id, sorted by name, in runs of at most [`RUN`]; no run is empty.
    runs: Vec<Vec<Sorted>>,
    /// The first id of each run with its place: a search over the runs reads these, in a
    /// short list that stays in cache.
    heads: Vec<(u64, KeyId)>,
    /// Bytes every name here starts with (up to [`MAX_SHARED`]; the first `shared_len`):
    /// the list orders names by the 8 bytes after them, and reads a name only where those
    /// tie. Keys often share a start (`lnk_`, `user:`), and 8 bytes from their first would
    /// tie across many: a new key's binary search in its run then read a name a step, a
    /// cache miss each (~9% of replay's resolving thread).
    shared: [u8; MAX_SHARED],
    shared_len: usize,
}

/// A name's first 8 bytes, big-endian and padded with zeros: where two names' prefixes
/// differ, they order as the names do.
fn prefix(name: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = name.len().min(8);
    b[..n].copy_from_slice(&name[..n]);
    u64::from_be_bytes(b)
}

/// Whether two names are equal: short ones compared 8 bytes at a time in place, where
/// `==` on slices calls `memcmp`. (In `perf` runs of replay, the look-up with `memcmp`
/// took ~8% fewer of the resolving thread's samples this way: names of ~10 bytes.)
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 32 {
        return a == b;
    }
    let (mut x, mut y) = (a, b);
    while let (Some(p), Some(q)) = (x.first_chunk::<8>(), y.first_chunk::<8>()) {
        if p != q {
            return false;
        }
        (x, y) = (&x[8..], &y[8..]);
    }
    x.iter().zip(y).all(|(p, q)| p == q)
}

/// Where `key` lies against names that all start with `shared`, when it does not.
enum Outside {
    BeforeAll,
    AfterAll,
}

impl KeyIndex {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The id of the key named `key`.
    pub fn get<'a>(&self, key: &[u8], name: impl Names<'a>) -> Option<KeyId> {
        self.table
            .find(hash(key), |&id| same(name(id), key))
            .copied()
    }

    fn shared(&self) -> &[u8] {
        &self.shared[..self.shared_len]
    }

    /// A name's place in the sorted list: its 8 bytes after the shared ones. Among names
    /// that start with the shared bytes, places that differ order as the names do.
    fn place(&self, key: &[u8]) -> u64 {
        prefix(key.get(self.shared_len..).unwrap_or_default())
    }

    /// Whether `key` starts with the shared bytes; if not, where it lies.
    fn outside(&self, key: &[u8]) -> Option<Outside> {
        if key.starts_with(self.shared()) {
            None
        } else if key < self.shared() {
            // A prefix of the shared bytes, or less at the first byte that differs.
            Some(Outside::BeforeAll)
        } else {
            Some(Outside::AfterAll)
        }
    }

    /// Makes the shared bytes the first `len` of those now, and every place again.
    fn reskip<'a>(&mut self, len: usize, name: &impl Names<'a>) {
        self.shared_len = len;
        for (run, head) in self.runs.iter_mut().zip(&mut self.heads) {
            for s in run.iter_mut() {
                let key = name(s.id);
                *s = Sorted::new(prefix(key.get(len..).unwrap_or_default()), s.id);
            }
            *head = (run[0].place(), run[0].id);
        }
    }

    /// Adds `id`, whose name (read through `name`, as every other id's) no id here has.
    pub fn insert<'a>(&mut self, id: KeyId, name: impl Names<'a>) {
        let key = name(id);
        self.table
            .insert_unique(hash(key), id, |&other| hash(name(other)));
        if self.runs.is_empty() {
            let n = key.len().min(MAX_SHARED);
            self.shared[..n].copy_from_slice(&key[..n]);
            self.shared_len = n;
        } else if self.outside(key).is_some() {
            let common = self
                .shared()
                .iter()
                .zip(key)
                .take_while(|(a, b)| a == b)
                .count();
            let len = if self.len() > RESKIP_FULLY_PAST {
                0
            } else {
                common
            };
            self.reskip(len, &name);
        }
        let place = self.place(key);
        let (r, at) = self.position(key, &name);
        let last = r + 1 == self.runs.len();
        let entry = Sorted::new(place, id);
        let Some(run) = self.runs.get_mut(r) else {
            self.runs.push(vec![entry]);
            self.heads.push((place, id));
            return;
        };
        if run.len() < RUN {
            run.insert(at, entry);
            if at == 0 {
                self.heads[r] = (place, id);
            }
        } else if last && at == run.len() {
            // Keys made in order (a counter per new id, a date in the name) fill the last
            // run and start a new one, not leave half-full runs behind.
            self.runs.push(vec![entry]);
            self.heads.push((place, id));
        } else {
            let mut tail = run.split_off(RUN / 2);
            if at <= RUN / 2 {
                run.insert(at, entry);
            } else {
                tail.insert(at - RUN / 2, entry);
            }
            self.heads[r] = (run[0].place(), run[0].id);
            self.heads.insert(r + 1, (tail[0].place(), tail[0].id));
            self.runs.insert(r + 1, tail);
        }
    }

    /// Takes `id` out; its name is still read through `name`. Whether it was here.
    pub fn remove<'a>(&mut self, id: KeyId, name: impl Names<'a>) -> bool {
        let key = name(id);
        let Ok(found) = self.table.find_entry(hash(key), |&other| other == id) else {
            return false;
        };
        found.remove();
        let (r, at) = self.position(key, &name);
        if let Some(run) = self.runs.get_mut(r)
            && run.get(at).map(|s| s.id) == Some(id)
        {
            run.remove(at);
            if let Some(&head) = run.first() {
                self.heads[r] = (head.place(), head.id);
            } else {
                self.runs.remove(r);
                self.heads.remove(r);
            }
        }
        true
    }

    /// Where `key` is or would go: the run (`runs.len()` when there is none, or when it
    /// comes after every name) and the place in it.
    fn position<'a>(&self, key: &[u8], name: &impl Names<'a>) -> (usize, usize) {
        if self.runs.is_empty() {
            return (0, 0);
        }
        match self.outside(key) {
            Some(Outside::BeforeAll) => return (0, 0),
            Some(Outside::AfterAll) => return (self.runs.len(), 0),
            None => {}
        }
        // The last run whose first name is at most `key` (the first run if none is).
        let place = self.place(key);
        let r = self
            .heads
            .partition_point(|&(p, id)| p < place || (p == place && name(id) <= key))
            .saturating_sub(1);
        let at = self.runs[r].partition_point(|s| {
            let p = s.place();
            p < place || (p == place && name(s.id) < key)
        });
        (r, at)
    }

    /// Every id, in its name's byte order.
    pub fn iter(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.runs.iter().flatten().map(|s| s.id)
    }

    /// The ids from `start` on, in their names' byte order.
    pub fn range<'a>(
        &self,
        start: Bound<&[u8]>,
        name: impl Names<'a>,
    ) -> impl Iterator<Item = KeyId> + '_ {
        let (r, mut at) = match start {
            Bound::Unbounded => (0, 0),
            Bound::Included(k) | Bound::Excluded(k) => self.position(k, &name),
        };
        if let Bound::Excluded(k) = start
            && self
                .runs
                .get(r)
                .and_then(|run| run.get(at))
                .map(|s| name(s.id))
                == Some(k)
        {
            at += 1;
        }
        self.runs
            .get(r..)
            .unwrap_or_default()
            .iter()
            .flatten()
            .skip(at)
            .map(|s| s.id)
    }

    /// Gives back room a forget left unused.
    pub fn shrink<'a>(&mut self, name: impl Names<'a>) {
        if self.table.len() < self.table.capacity() / 4 {
            self.table.shrink_to_fit(|&id| hash(name(id)));
        }
        for run in &mut self.runs {
            if run.len() < run.capacity() / 2 {
                run.shrink_to_fit();
            }
        }
        if self.runs.len() < self.runs.capacity() / 2 {
            self.runs.shrink_to_fit();
            self.heads.shrink_to_fit();
        }
    }

    /// Bytes the table and the runs take.
    pub fn bytes(&self) -> usize {
        use std::mem::size_of;
        self.table.capacity() * (size_of::<KeyId>() + 1)
            + self.runs.capacity() * size_of::<Vec<Sorted>>()
            + self.heads.capacity() * size_of::<(u64, KeyId)>()
            + self
                .runs
                .iter()
                .map(|r| r.capacity() * size_of::<Sorted>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// No run is empty or longer than [`RUN`], and `heads` names each run's first id.
    /// Every name starts with the shared bytes, and each entry's place is its name's.
    pub(super) fn assert_runs<'a>(index: &KeyIndex, name: impl Names<'a>) {
        assert!(index.runs.iter().all(|r| !r.is_empty() && r.len() <= RUN));
        let heads: Vec<(u64, KeyId)> = index.runs.iter().map(|r| (r[0].place(), r[0].id)).collect();
        assert_eq!(index.heads, heads);
        for s in index.runs.iter().flatten() {
            let key = name(s.id);
            assert!(
                key.starts_with(index.shared()),
                "{key:?} {:?}",
                index.shared()
            );
            assert_eq!(s.place(), index.place(key), "{key:?}");
        }
    }

    /// Random inserts and removals, against a `BTreeMap` of the same names: look-ups,
    /// order, ranges from every kind of bound, and the runs' invariants.
    #[test]
    fn keys_answer_as_a_sorted_map_through_random_operations() {
        let mut next = crate::testutil::rng(0x2545_f491_4f6c_dd1d);
        for round in 0..4 {
            // Names by id, as the catalog's entries hold them; `None` once removed.
            let mut names: Vec<Option<String>> = Vec::new();
            let mut model: BTreeMap<String, KeyId> = BTreeMap::new();
            let mut index = KeyIndex::default();
            let steps = [3_000, 20_000, 20_000, 5_000][round];
            for step in 0..steps {
                let pick = next();
                let remove = !model.is_empty() && pick % 5 < [1, 2, 0, 4][round];
                if remove {
                    let victim = model.keys().nth((next() % model.len() as u64) as usize);
                    let victim = victim.cloned().unwrap();
                    let id = model.remove(&victim).unwrap();
                    let table = &names;
                    assert!(index.remove(id, |i| table[i as usize].as_deref().unwrap().as_bytes()));
                    names[id as usize] = None;
                } else {
                    // Round 2 makes its keys in order, the others at random; a few names
                    // are prefixes of others.
                    let key = match round {
                        2 => format!("k{step:08}"),
                        _ => format!("k{}", next() % 50_000),
                    };
                    if model.contains_key(&key) {
                        continue;
                    }
                    let id = names.len() as KeyId;
                    names.push(Some(key.clone()));
                    let table = &names;
                    index.insert(id, |i| table[i as usize].as_deref().unwrap().as_bytes());
                    model.insert(key, id);
                }
                if step % 997 == 0 || step + 1 == steps {
                    let table = &names;
                    let name = |i: KeyId| table[i as usize].as_deref().unwrap().as_bytes();
                    assert_eq!(index.len(), model.len());
                    assert_runs(&index, name);
                    let all: Vec<KeyId> = index.iter().collect();
                    assert_eq!(all, model.values().copied().collect::<Vec<_>>());
                    for probe in ["", "k", "k1", "k25000", "k4", "k9999", "l"]
                        .into_iter()
                        .map(String::from)
                        .chain(model.keys().take(3).cloned())
                        .chain(model.keys().last().cloned())
                    {
                        assert_eq!(
                            index.get(probe.as_bytes(), name),
                            model.get(&probe).copied()
                        );
                        for bound in [
                            Bound::Included(probe.as_bytes()),
                            Bound::Excluded(probe.as_bytes()),
                        ] {
                            let got: Vec<KeyId> = index.range(bound, name).take(700).collect();
                            let want: Vec<KeyId> = model
                                .range::<str, _>((
                                    bound.map(|b| std::str::from_utf8(b).unwrap()),
                                    Bound::Unbounded,
                                ))
                                .take(700)
                                .map(|(_, &id)| id)
                                .collect();
                            assert_eq!(got, want, "from {bound:?}");
                        }
                    }
                    let got: Vec<KeyId> = index.range(Bound::Unbounded, name).collect();
                    assert_eq!(got, all);
                }
            }
            if round == 2 {
                // Made in order: every run but the last is full.
                let full = index.runs.iter().rev().skip(1).all(|r| r.len() == RUN);
                assert!(full || model.len() < 2 * RUN, "runs left half full");
            }
        }
    }

    #[test]
    fn names_whose_first_bytes_differ_order_as_their_prefixes() {
        let names: [&[u8]; 9] = [
            b"",
            b"\0",
            b"a",
            b"a\0",
            b"ab",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefgi",
            b"\xff",
        ];
        for a in names {
            for b in names {
                let (pa, pb) = (prefix(a), prefix(b));
                if pa != pb {
                    assert_eq!(pa.cmp(&pb), a.cmp(b), "{a:?} {b:?}");
                }
            }
        }
    }

    /// Keys that share their first bytes are placed by the bytes after them; a key that
    /// shares fewer makes the index skip fewer (none at once past `RESKIP_FULLY_PAST`
    /// keys), and an index emptied starts again from its next key.
    #[test]
    fn the_bytes_every_key_shares_are_skipped_and_given_back() {
        /// The index beside a `BTreeMap` of the same names; names by id.
        #[derive(Default)]
        struct Keys {
            names: Vec<String>,
            model: BTreeMap<String, KeyId>,
            index: KeyIndex,
        }
        impl Keys {
            fn add(&mut self, key: String) {
                if self.model.contains_key(&key) {
                    return;
                }
                let id = self.names.len() as KeyId;
                self.names.push(key.clone());
                let t = &self.names;
                self.index.insert(id, |i| t[i as usize].as_bytes());
                self.model.insert(key, id);
            }

            /// `n` draws of `lnk_` and a number.
            fn add_links(&mut self, n: usize, next: &mut impl FnMut() -> u64) {
                for _ in 0..n {
                    self.add(format!("lnk_{}", next() % 100_000));
                }
            }

            fn check(&self) {
                let name = |i: KeyId| self.names[i as usize].as_bytes();
                assert_runs(&self.index, name);
                assert_eq!(
                    self.index.iter().collect::<Vec<_>>(),
                    self.model.values().copied().collect::<Vec<_>>()
                );
                for probe in [
                    "",
                    "a",
                    "lnk",
                    "lnk_",
                    "lnk_5",
                    "lnk_50000",
                    "lnx",
                    "m",
                    "\u{ff}",
                ] {
                    let got: Vec<KeyId> = self
                        .index
                        .range(Bound::Included(probe.as_bytes()), name)
                        .collect();
                    let want: Vec<KeyId> = self
                        .model
                        .range::<str, _>((Bound::Included(probe), Bound::Unbounded))
                        .map(|(_, &i)| i)
                        .collect();
                    assert_eq!(got, want, "from {probe:?}");
                    assert_eq!(
                        self.index.get(probe.as_bytes(), name),
                        self.model.get(probe).copied()
                    );
                }
            }
        }

        let mut next = crate::testutil::rng(0x51ed_270b_2718_2818);
        let mut k = Keys::default();
        k.add("lnk_12345".into());
        assert_eq!(k.index.shared(), b"lnk_12345");
        k.add_links(100, &mut next);
        assert_eq!(k.index.shared(), b"lnk_");
        k.add("lnx".into());
        assert_eq!(
            k.index.shared(),
            b"ln",
            "a partial skip while the index is small"
        );
        k.add_links(300, &mut next);
        k.check();
        k.add("l".into());
        assert_eq!(
            k.index.shared(),
            b"",
            "none at once past RESKIP_FULLY_PAST keys"
        );
        k.add("a".into());
        k.add("m".into());
        k.check();
        // Emptied, the index takes its next key's bytes.
        let ids: Vec<KeyId> = k.index.iter().collect();
        let t = &k.names;
        for id in ids {
            assert!(k.index.remove(id, |i| t[i as usize].as_bytes()));
        }
        assert!(k.index.is_empty() && k.index.runs.is_empty());
        k.index.insert(0, |i| t[i as usize].as_bytes());
        assert_eq!(k.index.shared(), b"lnk_12345");
    }

    #[test]
    fn names_are_the_same_exactly_when_their_bytes_are() {
        let names: Vec<Vec<u8>> = (0..40)
            .flat_map(|len| {
                let base: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                // The name, and the name with each byte changed in turn.
                let changed = (0..len).map({
                    let base = base.clone();
                    move |i| {
                        let mut c = base.clone();
                        c[i] ^= 0x20;
                        c
                    }
                });
                std::iter::once(base).chain(changed)
            })
            .collect();
        for a in &names {
            for b in &names {
                assert_eq!(same(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn removing_an_absent_id_changes_nothing() {
        let names = ["a", "b", "c"];
        let name = |i: KeyId| names[i as usize].as_bytes();
        let mut index = KeyIndex::default();
        index.insert(0, name);
        index.insert(2, name);
        assert!(!index.remove(1, name));
        assert_eq!(index.iter().collect::<Vec<_>>(), vec![0, 2]);
        assert!(index.remove(0, name));
        assert!(!index.remove(0, name));
        assert_eq!(index.get(b"c", name), Some(2));
        assert_eq!(index.get(b"a", name), None);
        assert!(index.remove(2, name));
        assert!(index.is_empty() && index.runs.is_empty() && index.heads.is_empty());
    }
}

#[cfg(test)]
mod model_tests {
    use super::tests::assert_runs;
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn names_with_shared_prefixes_nuls_and_reused_ids_answer_as_a_sorted_map() {
        let mut next = crate::testutil::rng(0x9e37_79b9_7f4a_7c15);
        let alphabet: [u8; 4] = [0, b'a', b'b', 0xff];
        for round in 0..6 {
            let mut names: Vec<Option<Vec<u8>>> = Vec::new();
            let mut free: Vec<KeyId> = Vec::new();
            let mut model: BTreeMap<Vec<u8>, KeyId> = BTreeMap::new();
            let mut index = KeyIndex::default();
            for step in 0..30_000 {
                let remove = !model.is_empty() && next() % 10 < [3, 5, 1, 6, 4, 5][round];
                if remove {
                    // Runs' heads half the time.
                    let i = if next().is_multiple_of(2) {
                        let all: Vec<KeyId> = index.heads.iter().map(|h| h.1).collect();
                        let id = all[(next() % all.len() as u64) as usize];
                        names[id as usize].clone().unwrap()
                    } else {
                        model
                            .keys()
                            .nth((next() % model.len() as u64) as usize)
                            .cloned()
                            .unwrap()
                    };
                    let id = model.remove(&i).unwrap();
                    let t = &names;
                    assert!(index.remove(id, |k| t[k as usize].as_deref().unwrap()));
                    names[id as usize] = None;
                    free.push(id);
                } else {
                    let len = (next() % 14) as usize;
                    let shared = (next() % 10) as usize;
                    let mut key: Vec<u8> =
                        b"prefix00".iter().copied().take(shared.min(len)).collect();
                    while key.len() < len {
                        key.push(alphabet[(next() % 4) as usize]);
                    }
                    if model.contains_key(&key) {
                        continue;
                    }
                    let id = match free.pop() {
                        Some(id) => {
                            names[id as usize] = Some(key.clone());
                            id
                        }
                        None => {
                            names.push(Some(key.clone()));
                            (names.len() - 1) as KeyId
                        }
                    };
                    let t = &names;
                    index.insert(id, |k| t[k as usize].as_deref().unwrap());
                    model.insert(key, id);
                }
                if step % 499 == 0 {
                    let t = &names;
                    let name = |k: KeyId| t[k as usize].as_deref().unwrap();
                    assert_runs(&index, name);
                    assert_eq!(
                        index.iter().collect::<Vec<_>>(),
                        model.values().copied().collect::<Vec<_>>()
                    );
                    let mut probes: Vec<Vec<u8>> = (0..20)
                        .map(|_| {
                            let len = (next() % 12) as usize;
                            (0..len).map(|_| alphabet[(next() % 4) as usize]).collect()
                        })
                        .collect();
                    probes.extend(model.keys().step_by(37).cloned());
                    for p in &probes {
                        assert_eq!(index.get(p, name), model.get(p).copied());
                        for b in [Bound::Included(&p[..]), Bound::Excluded(&p[..])] {
                            let got: Vec<KeyId> = index.range(b, name).collect();
                            let want: Vec<KeyId> = model
                                .range::<[u8], _>((b, Bound::Unbounded))
                                .map(|(_, &i)| i)
                                .collect();
                            assert_eq!(got, want, "{b:?}");
                        }
                    }
                    index.shrink(name);
                }
            }
        }
    }
}

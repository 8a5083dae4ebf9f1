//! A namespace's keys by name, in the catalog: a hash table for look-ups and a sorted list
//! for listing in byte order, both holding only key ids. The names are in the keys'
//! entries ([`crate::catalog::KeyEntry`]), read through a closure the catalog passes in.
//!
//! Before, the table held each name (inline up to 22 bytes: 32-byte slots) and a
//! `BTreeMap` each name again (a shared `Arc<str>`, its own allocation): on
//! `tally-bench engine`'s workload the catalog's keys took 7.3 B per live counter, now
//! 3.7 B. A look-up reads what it read before — the table's slot, then the key's entry,
//! which it needs next for the key's subtotals — only in the other order. Making a key
//! costs more: a binary search that reads a name (a cache miss) per step, where the
//! B-tree compared a node's names in a scan the CPU overlapped (~1 µs a new key).

use std::hash::BuildHasher;
use std::ops::Bound;

use foldhash::fast::FixedState;
use hashbrown::HashTable;

use crate::catalog::KeyId;

/// Most ids in one run of the sorted list: a longer run is split in two. An insert or
/// removal moves up to this many ids; finding a place reads the runs' first bytes, then
/// ~log2(RUN) names. (512 took ~25% more time in `partition_point` under `tally-bench
/// replay`; the runs' own overhead is ~1 byte a key here.)
const RUN: usize = 64;

/// A key's name as the index reads it: its bytes (compared and hashed as bytes, with no
/// UTF-8 check per comparison).
pub trait Names<'a>: Fn(KeyId) -> &'a [u8] {}

impl<'a, F: Fn(KeyId) -> &'a [u8]> Names<'a> for F {}

#[derive(Debug, Default)]
pub struct KeyIndex {
    table: HashTable<KeyId>,
    /// Every id, sorted by name, in runs of at most [`RUN`]; no run is empty.
    runs: Vec<Vec<KeyId>>,
    /// The first id of each run with its name's first bytes ([`prefix`]): a search over
    /// the runs reads these, in a short list that stays in cache, and reads a name only
    /// where the first bytes tie (most keys differ in their first 8 bytes).
    heads: Vec<(u64, KeyId)>,
}

/// A name's first 8 bytes, big-endian and padded with zeros: where two names' prefixes
/// differ, they order as the names do.
fn prefix(name: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = name.len().min(8);
    b[..n].copy_from_slice(&name[..n]);
    u64::from_be_bytes(b)
}

fn hash(name: &[u8]) -> u64 {
    FixedState::default().hash_one(name)
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
        self.table.find(hash(key), |&id| name(id) == key).copied()
    }

    /// Adds `id`, whose name (read through `name`, as every other id's) no id here has.
    pub fn insert<'a>(&mut self, id: KeyId, name: impl Names<'a>) {
        let key = name(id);
        self.table
            .insert_unique(hash(key), id, |&other| hash(name(other)));
        let (r, at) = self.position(key, &name);
        let last = r + 1 == self.runs.len();
        let Some(run) = self.runs.get_mut(r) else {
            self.runs.push(vec![id]);
            self.heads.push((prefix(key), id));
            return;
        };
        if run.len() < RUN {
            run.insert(at, id);
            if at == 0 {
                self.heads[r] = (prefix(key), id);
            }
        } else if last && at == run.len() {
            // Keys made in order (a counter per new id, a date in the name) fill the last
            // run and start a new one, not leave half-full runs behind.
            self.runs.push(vec![id]);
            self.heads.push((prefix(key), id));
        } else {
            let mut tail = run.split_off(RUN / 2);
            if at <= RUN / 2 {
                run.insert(at, id);
            } else {
                tail.insert(at - RUN / 2, id);
            }
            let head = |ids: &[KeyId]| (prefix(name(ids[0])), ids[0]);
            self.heads[r] = head(run);
            self.heads.insert(r + 1, head(&tail));
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
            && run.get(at) == Some(&id)
        {
            run.remove(at);
            if let Some(&head) = run.first() {
                self.heads[r] = (prefix(name(head)), head);
            } else {
                self.runs.remove(r);
                self.heads.remove(r);
            }
        }
        true
    }

    /// Where `key` is or would go: the run (`runs.len()` when there is none) and the
    /// place in it.
    fn position<'a>(&self, key: &[u8], name: &impl Names<'a>) -> (usize, usize) {
        if self.runs.is_empty() {
            return (0, 0);
        }
        // The last run whose first name is at most `key` (the first run if none is).
        let first = prefix(key);
        let r = self
            .heads
            .partition_point(|&(p, id)| p < first || (p == first && name(id) <= key))
            .saturating_sub(1);
        let at = self.runs[r].partition_point(|&id| name(id) < key);
        (r, at)
    }

    /// Every id, in its name's byte order.
    pub fn iter(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.runs.iter().flatten().copied()
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
                .map(|&id| name(id))
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
            .copied()
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
            + self.runs.capacity() * size_of::<Vec<KeyId>>()
            + self.heads.capacity() * size_of::<(u64, KeyId)>()
            + self
                .runs
                .iter()
                .map(|r| r.capacity() * size_of::<KeyId>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// No run is empty or longer than [`RUN`], and `heads` names each run's first id.
    pub(super) fn assert_runs<'a>(index: &KeyIndex, name: impl Names<'a>) {
        assert!(index.runs.iter().all(|r| !r.is_empty() && r.len() <= RUN));
        let heads: Vec<(u64, KeyId)> = index
            .runs
            .iter()
            .map(|r| (prefix(name(r[0])), r[0]))
            .collect();
        assert_eq!(index.heads, heads);
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

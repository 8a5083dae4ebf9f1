//! The catalog's table of dimension names and values by their bytes: each string's id,
//! with the string itself in place when it is short (most are: country codes, status
//! codes, host names), so that a look-up compares without following a pointer.
//!
//! A `HashMap<Arc<str>, StrId>` compared through the `Arc` (a pointer to the bytes, then
//! `memcmp`): in `perf` runs of `tally-bench replay`, `Catalog::intern` and its `memcmp`
//! took 6–7% of the resolving thread, about half of it in `memcmp` on a miss to the
//! string's bytes; 4–6% with this table (docs/benchmarks.md). An entry here takes the 24
//! bytes one took there.

use std::sync::Arc;

use hashbrown::HashTable;

use crate::catalog::StrId;
use crate::seeded::hash_bytes;

/// Bytes of a string an entry holds in place.
const INLINE: usize = 19;

/// The length an entry notes for a string longer than [`INLINE`]: its first bytes are in
/// place, the rest is compared through the catalog's list.
const LONG: u8 = u8::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    id: StrId,
    /// The string's length, or [`LONG`].
    len: u8,
    /// Its first bytes, zeros after them.
    head: [u8; INLINE],
}

impl Entry {
    fn new(s: &str, id: StrId) -> Entry {
        let b = s.as_bytes();
        let n = b.len().min(INLINE);
        let mut head = [0; INLINE];
        head[..n].copy_from_slice(&b[..n]);
        let len = if b.len() <= INLINE { n as u8 } else { LONG };
        Entry { id, len, head }
    }

    /// Whether this entry is `s`'s, given `probe`, `s`'s own entry (any id).
    fn is(&self, probe: &Entry, s: &str, list: &[Arc<str>]) -> bool {
        self.len == probe.len
            && self.head == probe.head
            && (self.len != LONG || list.get(self.id as usize).is_some_and(|t| **t == *s))
    }

    /// The hash of the entry's string.
    fn hash(&self, list: &[Arc<str>]) -> u64 {
        if self.len == LONG {
            hash(list.get(self.id as usize).map_or("", |s| s))
        } else {
            hash_bytes(&self.head[..self.len as usize])
        }
    }
}

fn hash(s: &str) -> u64 {
    hash_bytes(s.as_bytes())
}

/// Strings by their bytes, each to its id; the strings themselves are the catalog's list,
/// passed in where a long one must be read.
#[derive(Debug, Default)]
pub struct Interned {
    table: HashTable<Entry>,
}

impl Interned {
    pub fn get(&self, s: &str, list: &[Arc<str>]) -> Option<StrId> {
        let probe = Entry::new(s, 0);
        self.table
            .find(hash(s), |e| e.is(&probe, s, list))
            .map(|e| e.id)
    }

    /// Adds `s` under `id`; `s` must not be here. `list` holds every string here at its id
    /// (`s` there or not yet): it is only read to rehash the long ones.
    pub fn insert(&mut self, s: &str, id: StrId, list: &[Arc<str>]) {
        self.table
            .insert_unique(hash(s), Entry::new(s, id), |e| e.hash(list));
    }

    /// Takes `s` out if it is here under `id`; whether it was.
    pub fn remove(&mut self, s: &str, id: StrId, list: &[Arc<str>]) -> bool {
        let probe = Entry::new(s, id);
        match self
            .table
            .find_entry(hash(s), |e| e.id == id && e.is(&probe, s, list))
        {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Bytes the table takes, counted as the catalog counts its other hash tables: an entry
    /// and a control byte per unit of `capacity()` (about 7/8 of its slots, so a little
    /// under what it holds).
    pub fn bytes(&self) -> usize {
        self.capacity() * (std::mem::size_of::<Entry>() + 1)
    }

    pub fn shrink_to_fit(&mut self, list: &[Arc<str>]) {
        self.table.shrink_to_fit(|e| e.hash(list));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// As the catalog uses the table: a forgotten string's id is marked vacant (the empty
    /// string) in the list and reused for a new string; a look-up of the old string then
    /// finds nothing, and the new one its id, through shrinks.
    #[test]
    fn a_forgotten_strings_id_is_reused_for_another() {
        let vacant: Arc<str> = Arc::from("");
        let long = |c: &str, n: usize| c.repeat(n);
        let mut list: Vec<Arc<str>> = Vec::new();
        let mut t = Interned::default();
        let names: Vec<String> = (0..60)
            .map(|n| {
                if n % 2 == 0 {
                    long("q", n)
                } else {
                    long("\0", 1) + &long("q", n)
                }
            })
            .collect();
        for s in &names {
            list.push(Arc::from(s.as_str()));
            t.insert(s, list.len() as StrId - 1, &list);
        }
        for round in 0..3 {
            for (id, s) in names.iter().enumerate().filter(|(i, _)| i % 3 == round) {
                assert!(t.remove(s, id as StrId, &list), "{round} {s:?}");
                assert!(!t.remove(s, id as StrId, &list), "removed twice");
                list[id] = Arc::clone(&vacant);
                assert_eq!(t.get(s, &list), None);
                // The id back, for another string.
                let other = format!("{s}#{round}");
                list[id] = Arc::from(other.as_str());
                t.insert(&other, id as StrId, &list);
                assert_eq!(t.get(&other, &list), Some(id as StrId));
            }
            if t.len() < t.capacity() / 4 || round == 1 {
                t.shrink_to_fit(&list);
            }
            for (id, s) in list.iter().enumerate() {
                assert_eq!(t.get(s, &list), Some(id as StrId), "{round} {s:?}");
            }
        }
    }

    #[test]
    fn an_entry_takes_what_a_map_entry_took() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
        assert_eq!(std::mem::size_of::<(Arc<str>, StrId)>(), 24);
    }

    /// Random inserts and removals of short, exactly-inline, long and look-alike strings
    /// (the same first bytes, NULs, lengths around the inline size) against a `HashMap`,
    /// through the table's growth and shrinking.
    #[test]
    fn strings_are_found_exactly_as_a_map_finds_them() {
        let mut next = crate::testutil::rng(0x5eed_0000_1234_5678);
        let mut names: Vec<String> = Vec::new();
        for n in [0usize, 1, 2, 18, 19, 20, 21, 40] {
            for i in 0..12u32 {
                let mut s = "a".repeat(n);
                if n > 0 {
                    // Differ only in the last byte, or only past the inline bytes.
                    s.pop();
                    s.push(char::from(b'a' + (i % 26) as u8));
                }
                if i % 3 == 0 {
                    s.push('\0');
                }
                names.push(s);
            }
        }
        names.sort();
        names.dedup();
        let mut list: Vec<Arc<str>> = Vec::new();
        let mut t = Interned::default();
        let mut model: HashMap<String, StrId> = HashMap::new();
        for step in 0..5_000 {
            let s = &names[(next() % names.len() as u64) as usize];
            match next() % 4 {
                0..=1 => {
                    if !model.contains_key(s) {
                        let id = list.len() as StrId;
                        list.push(Arc::from(s.as_str()));
                        t.insert(s, id, &list);
                        model.insert(s.clone(), id);
                    }
                }
                2 => {
                    let id = model.get(s).copied().unwrap_or(StrId::MAX);
                    assert_eq!(t.remove(s, id, &list), model.remove(s).is_some(), "{step}");
                }
                _ => {
                    if step % 500 == 0 {
                        t.shrink_to_fit(&list);
                    }
                }
            }
            for name in &names {
                assert_eq!(
                    t.get(name, &list),
                    model.get(name).copied(),
                    "{step} {name:?}"
                );
            }
            assert_eq!(t.len(), model.len());
        }
    }
}

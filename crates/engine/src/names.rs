//! Names: one engine-wide numbering of the dimension names and values that reads meet, so
//! that a read summing one key over many segments adds by integer id rather than by string.
//! Each segment's dictionary has its own ids; a segment maps them to these once (see
//! `Segment::name_ids`) and every later read reuses the map. A breakdown of a key with
//! 2 000 values over 14 segments then hashes 2 000 names, not 28 000.
//!
//! Ids are only ever added. To keep memory bounded, the engine replaces its `Names` with an
//! empty one once it holds [`MAX_NAMES`] names or [`MAX_NAME_BYTES`] bytes of them (see
//! `Core::names`); segments notice by the id of the `Names` they mapped to and map again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::seeded::State;

/// How many names one `Names` holds before the engine starts a new one.
pub const MAX_NAMES: usize = 1 << 20;
/// How many bytes of names (their own bytes, and what holding each costs besides) one
/// `Names` holds before the engine starts a new one: dimension values may be long.
pub const MAX_NAME_BYTES: usize = 64 << 20;
/// What holding one name costs beyond its bytes: its `Arc<str>` (counts and pointer) in
/// the list and in the map's entry.
const NAME_OVERHEAD: usize = 64;
#[derive(Debug, Default)]
struct Inner {
    ids: HashMap<Arc<str>, u32, State>,
    list: Vec<Arc<str>>,
    /// About the heap bytes held (see [`NAME_OVERHEAD`]).
    bytes: usize,
}

/// An append-only interner of names; see the module doc.
#[derive(Debug)]
pub struct Names {
    /// Unique per `Names` in the process: what a segment's cached map was made against.
    id: u64,
    inner: RwLock<Inner>,
}

impl Default for Names {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Names {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            inner: RwLock::default(),
        }
    }
}

impl Names {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn len(&self) -> usize {
        self.read().list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// About the heap bytes its names hold.
    pub fn bytes(&self) -> usize {
        self.read().bytes
    }

    /// Whether it holds [`MAX_NAMES`] names or [`MAX_NAME_BYTES`] of them: the engine then
    /// starts a new one.
    pub fn full(&self) -> bool {
        let g = self.read();
        g.list.len() >= MAX_NAMES || g.bytes >= MAX_NAME_BYTES
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // Every update leaves the maps whole (a name is pushed, then indexed).
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The id of every name of `names`, in order, numbering the new ones (one write lock).
    pub fn intern_all<'a>(&self, names: impl Iterator<Item = &'a str>) -> Vec<u32> {
        let mut g = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *g;
        names
            .map(|s| match inner.ids.get(s) {
                Some(&id) => id,
                None => {
                    // More than 2^32 names would need 2^32 strings held at once: the engine
                    // starts a new `Names` long before (MAX_NAMES).
                    let id = inner.list.len() as u32;
                    let a: Arc<str> = s.into();
                    inner.list.push(a.clone());
                    inner.ids.insert(a, id);
                    inner.bytes += s.len() + NAME_OVERHEAD;
                    id
                }
            })
            .collect()
    }

    /// The id of a name already numbered.
    pub fn get(&self, s: &str) -> Option<u32> {
        self.read().ids.get(s).copied()
    }

    /// Calls `f` with a lookup from ids to names (one read lock for all of them).
    pub fn with<R>(&self, f: impl for<'a> FnOnce(&'a dyn Fn(u32) -> &'a str) -> R) -> R {
        let g = self.read();
        f(&|id| g.list.get(id as usize).map_or("", |s| s))
    }
}

/// One segment dictionary's ids mapped to a [`Names`]: per dimension id, the dimension's
/// name id and its values' name ids.
#[derive(Debug)]
pub struct NameIds {
    pub names: u64,
    dims: Vec<(u32, Box<[u32]>)>,
}

impl NameIds {
    /// Maps `dims` (each dimension's name and its values, at their ids) to `names`.
    pub fn new(names: &Names, dims: &[(String, Vec<String>)]) -> NameIds {
        let all = dims.iter().flat_map(|(d, values)| {
            std::iter::once(d.as_str()).chain(values.iter().map(|v| v.as_str()))
        });
        let ids = names.intern_all(all);
        let mut at = 0;
        let dims = dims
            .iter()
            .map(|(_, values)| {
                let d = ids[at];
                let v = ids[at + 1..at + 1 + values.len()].into();
                at += 1 + values.len();
                (d, v)
            })
            .collect();
        NameIds {
            names: names.id(),
            dims,
        }
    }

    /// The name ids of dimension `d` and its value `v` (ids the segment checked).
    pub fn get(&self, d: u32, v: u32) -> Option<(u32, u32)> {
        let (dim, values) = self.dims.get(d as usize)?;
        Some((*dim, *values.get(v as usize)?))
    }
}

/// Value ids below this are summed in an array (see [`PairSums`]).
const DENSE: u32 = 1 << 14;

/// Array cells all of a [`PairSums`]' arrays may hold together (1 MiB of sums): a key with
/// thousands of dimension names, each with a value id near [`DENSE`], would otherwise
/// allocate an array of ~16 000 sums per dimension.
const DENSE_CELLS: usize = 1 << 17;

/// Sums by (dimension, value) named by ids of one [`Names`]: per dimension an array indexed
/// by value id while ids are small (what a breakdown adds to thousands of times per
/// segment) and the arrays' cells stay within [`DENSE_CELLS`], a hash map beyond. A
/// dimension's array is found through a map, so a read's cost stays linear in the pairs it
/// adds however many dimensions there are. Sums wrap, as every sum.
#[derive(Debug, Default)]
pub struct PairSums {
    dims: Vec<(u32, Vec<i64>)>,
    /// Where each dimension's array is in `dims`.
    at: HashMap<u32, usize, State>,
    cells: usize,
    large: HashMap<(u32, u32), i64, State>,
}

impl PairSums {
    pub fn add(&mut self, d: u32, v: u32, n: i64) {
        let dense = if v < DENSE {
            // A new dimension's array starts empty: it costs cells only as it grows.
            let dims = &mut self.dims;
            let at = *self.at.entry(d).or_insert_with(|| {
                dims.push((d, Vec::new()));
                dims.len() - 1
            });
            let sums = &mut self.dims[at].1;
            let need = v as usize + 1;
            if sums.len() >= need {
                Some(&mut sums[v as usize])
            } else if self.cells + (need - sums.len()) <= DENSE_CELLS {
                self.cells += need - sums.len();
                sums.resize(need, 0);
                Some(&mut sums[v as usize])
            } else {
                None
            }
        } else {
            None
        };
        let s = match dense {
            Some(s) => s,
            None => self.large.entry((d, v)).or_default(),
        };
        *s = s.wrapping_add(n);
    }

    /// Every (dimension id, value id, sum) with a non-zero sum, in no particular order.
    pub fn non_zero(&self) -> impl Iterator<Item = (u32, u32, i64)> + '_ {
        let dense = self.dims.iter().flat_map(|(d, sums)| {
            sums.iter()
                .enumerate()
                .filter(|e| *e.1 != 0)
                .map(move |(v, &n)| (*d, v as u32, n))
        });
        let large = self
            .large
            .iter()
            .filter(|e| *e.1 != 0)
            .map(|(&(d, v), &n)| (d, v, n));
        dense.chain(large)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_fill_a_names_by_their_bytes() {
        let names = Names::default();
        let value = |i: usize| format!("{i:08}{}", "v".repeat(2040));
        names.intern_all(
            (0..100)
                .map(value)
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        );
        assert_eq!(names.bytes(), 100 * (2048 + NAME_OVERHEAD));
        names.intern_all(["00000007"].into_iter());
        names.intern_all([value(7).as_str()].into_iter());
        assert_eq!(names.len(), 101, "a name met again is not held twice");
        assert!(!names.full());
        let more = (100..MAX_NAME_BYTES / 2048).map(value).collect::<Vec<_>>();
        names.intern_all(more.iter().map(String::as_str));
        assert!(names.len() < MAX_NAMES / 8, "{}", names.len());
        assert!(names.full(), "{} bytes", names.bytes());
    }

    #[test]
    fn names_are_numbered_once_and_maps_follow_dictionaries() {
        let names = Names::default();
        assert_eq!(names.intern_all(["country"].into_iter()), vec![0]);
        assert_eq!((names.get("country"), names.get("FR")), (Some(0), None));
        let dims = vec![
            (
                "referrer".to_owned(),
                vec!["a.com".to_owned(), "b.com".to_owned()],
            ),
            ("country".to_owned(), vec!["FR".to_owned()]),
        ];
        let m = NameIds::new(&names, &dims);
        assert_eq!(m.get(0, 1), Some((1, 3)));
        assert_eq!(m.get(1, 0), Some((0, 4)));
        assert_eq!((m.get(1, 1), m.get(2, 0)), (None, None));
        assert_eq!(names.len(), 5);
        names.with(|name| assert_eq!((name(2), name(4), name(9)), ("a.com", "FR", "")));
        assert_ne!(
            Names::default().id(),
            names.id(),
            "each Names is told apart"
        );
    }

    #[test]
    fn pair_sums_add_small_and_large_ids_alike() {
        let mut s = PairSums::default();
        for (d, v, n) in [
            (1, 3, 5),
            (2, 3, 7),
            (1, DENSE + 9, 2),
            (1, 3, -5),
            (1, 0, i64::MAX),
        ] {
            s.add(d, v, n);
        }
        s.add(1, 0, 2);
        s.add(2, DENSE + 9, 1);
        let mut got: Vec<_> = s.non_zero().collect();
        got.sort_unstable();
        assert_eq!(
            got,
            vec![
                (1, 0, i64::MIN + 1),
                (1, DENSE + 9, 2),
                (2, 3, 7),
                (2, DENSE + 9, 1)
            ],
            "a sum netting to zero is left out, sums wrap, dimensions kept apart"
        );
    }

    /// Many dimensions, each with one value of an id near the dense bound: the arrays stay
    /// within their cells (the rest is summed in the map), and every sum is kept.
    #[test]
    fn pair_sums_of_many_dimensions_stay_bounded() {
        let mut s = PairSums::default();
        let dims = 20_000u32;
        for d in 0..dims {
            s.add(d, DENSE - 1 - d % 7, 1);
            s.add(d, DENSE - 1 - d % 7, 2);
        }
        assert!(s.cells <= DENSE_CELLS, "{}", s.cells);
        let got: Vec<_> = s.non_zero().collect();
        assert_eq!(got.len(), dims as usize);
        assert!(got.iter().all(|&(_, _, n)| n == 3));
    }
}

//! A top of keys over several segments that each sum the range by rank (their span and hour
//! frames), found without naming every key: ranks are numbered per segment, so matching
//! every key of one segment to another's would cost a name and an index look-up per key.
//!
//! Instead, thresholds (Cao and Wang's "three-phase uniform threshold", TPUT): with `m`
//! lists of non-negative sums, (1) each list's best `limit` keys are named and summed
//! exactly across every list; the `limit`-th best of those exact sums is `tau`; (2) every key
//! with a sum of at least `tau / m` in some list is named and summed exactly too; (3) the best
//! `limit` of those are the top. A key never named has less than `tau / m` in each list, so
//! less than `tau` in all, below at least `limit` named keys: it cannot be in the top, ties
//! included. Sums that can be negative break the bound; the caller then reads another way.

use std::collections::HashMap;
use std::ops::Range;

use tally_core::store::{Deadline, StoreError};

use crate::segment::{Cover, Segment, SegmentError};

/// One segment's totals over a range, per rank of a namespace's keys.
pub(crate) struct RankSums<'s> {
    pub(crate) seg: &'s Segment,
    pub(crate) ranks: Range<u64>,
    pub(crate) by_rank: Vec<i64>,
}

impl<'s> RankSums<'s> {
    /// Sums `cover`'s frames (added, then taken off) over the ranks of `ns`.
    pub(crate) fn read(
        seg: &'s Segment,
        ns: &str,
        cover: &Cover,
        deadline: &Deadline,
    ) -> Result<RankSums<'s>, SegmentError> {
        let ranks = seg.rank_range(ns)?;
        let mut by_rank = vec![0i64; (ranks.end - ranks.start) as usize];
        for (frames, sign) in [(&cover.add, 1i64), (&cover.sub, -1)] {
            for &f in frames {
                deadline
                    .check()
                    .map_err(|e| SegmentError::Stopped { why: e.detail() })?;
                seg.frame_sums(f, ranks.clone(), &mut |r, n| {
                    let at = &mut by_rank[(r - ranks.start) as usize];
                    *at = at.wrapping_add(n.wrapping_mul(sign));
                })?;
            }
        }
        Ok(RankSums {
            seg,
            ranks,
            by_rank,
        })
    }

    pub(crate) fn non_negative(&self) -> bool {
        self.by_rank.iter().all(|&n| n >= 0)
    }

    /// The sum of `key`, 0 if the segment does not have it.
    fn of(&self, ns: &str, key: &str) -> Result<i64, SegmentError> {
        Ok(match self.seg.rank_of(ns, key)? {
            Some(r) if self.ranks.contains(&r) => self.by_rank[(r - self.ranks.start) as usize],
            _ => 0,
        })
    }

    /// The names of the ranks whose sum `keep` accepts, at most the best `most` of them.
    /// Read a few thousand at a time with the deadline checked between: with flat sums the
    /// second phase names every key.
    fn names(
        &self,
        most: usize,
        keep: impl Fn(i64) -> bool,
        deadline: &Deadline,
    ) -> Result<Vec<String>, TopError> {
        const STEP: usize = 4096;
        let picked = best(
            (self.ranks.start..)
                .zip(self.by_rank.iter().copied())
                .filter(|&(_, n)| keep(n)),
            most,
        );
        let mut ranks: Vec<u64> = picked.into_iter().map(|(r, _)| r).collect();
        ranks.sort_unstable();
        let mut out = Vec::with_capacity(ranks.len());
        for step in ranks.chunks(STEP) {
            deadline.check()?;
            out.extend(self.seg.keys_at(step)?.into_iter().map(|(_, key)| key));
        }
        Ok(out)
    }
}

/// Sums looked up by a key's name: segments read by name, or memory (by key id, through
/// the catalog).
pub(crate) trait ByName {
    /// The sum of every key.
    fn total(&self) -> i64;
    fn is_empty(&self) -> bool;
    /// The sum of `key`, 0 if it has none here.
    fn of(&self, key: &str) -> i64;
    /// The names of the keys whose sum `keep` accepts, at most the best `most` of them.
    fn names(&self, most: usize, keep: &dyn Fn(i64) -> bool) -> Vec<String>;
}

impl ByName for HashMap<String, i64, crate::seeded::State> {
    fn total(&self) -> i64 {
        self.values().fold(0i64, |t, &n| t.wrapping_add(n))
    }

    fn is_empty(&self) -> bool {
        HashMap::is_empty(self)
    }

    fn of(&self, key: &str) -> i64 {
        self.get(key).copied().unwrap_or(0)
    }

    fn names(&self, most: usize, keep: &dyn Fn(i64) -> bool) -> Vec<String> {
        let picked = best(
            self.iter().filter(|(_, n)| keep(**n)).map(|(k, &n)| (k, n)),
            most,
        );
        picked.into_iter().map(|(k, _)| k.clone()).collect()
    }
}

/// The best `limit` keys of `ns` by the sum of `lists` and `by_name` (memory, and segments
/// read by name), and the total of every key. Every sum must be non-negative (see the
/// module doc); `Err` is a segment's failure.
pub(crate) fn top_across(
    ns: &str,
    lists: &[RankSums<'_>],
    by_name: &[&dyn ByName],
    limit: usize,
    deadline: &Deadline,
) -> Result<(Vec<(String, i64)>, i64), TopError> {
    let total = lists
        .iter()
        .flat_map(|l| l.by_rank.iter().copied())
        .chain(by_name.iter().map(|b| b.total()))
        .fold(0i64, i64::wrapping_add);
    if limit == 0 {
        return Ok((Vec::new(), total));
    }
    let m = (lists.len() + by_name.iter().filter(|b| !b.is_empty()).count()) as i128;
    let mut exact: HashMap<String, i64> = HashMap::new();
    let sum_of = |exact: &mut HashMap<String, i64>, names: Vec<String>| -> Result<(), TopError> {
        for name in names {
            if exact.contains_key(&name) {
                continue;
            }
            deadline.check()?;
            let mut n = by_name
                .iter()
                .fold(0i64, |t, b| t.wrapping_add(b.of(&name)));
            for l in lists {
                n = n.wrapping_add(l.of(ns, &name)?);
            }
            exact.insert(name, n);
        }
        Ok(())
    };
    // Phase 1: each list's best `limit`, summed exactly.
    for l in lists {
        sum_of(&mut exact, l.names(limit, |n| n > 0, deadline)?)?;
    }
    for b in by_name {
        sum_of(&mut exact, b.names(limit, &|n| n > 0))?;
    }
    let mut sums: Vec<i64> = exact.values().copied().collect();
    let tau = if sums.len() >= limit {
        *sums.select_nth_unstable_by(limit - 1, |a, b| b.cmp(a)).1
    } else {
        // Fewer keys than `limit` have anything: phase 2 names every one with a sum.
        1
    };
    // Phase 2: every key with at least `tau / m` in one list.
    let keep = |n: i64| n > 0 && i128::from(n) * m >= i128::from(tau);
    for l in lists {
        sum_of(&mut exact, l.names(usize::MAX, keep, deadline)?)?;
    }
    for b in by_name {
        sum_of(&mut exact, b.names(usize::MAX, &keep))?;
    }
    Ok((exact.into_iter().collect(), total))
}

/// The best `most` of `items` by sum (larger first; among equal sums any), in no order.
/// Holds about twice `most` at a time: once that many, it keeps the best `most` and turns
/// away any later sum not above the worst of them.
pub(crate) fn best<T>(items: impl Iterator<Item = (T, i64)>, most: usize) -> Vec<(T, i64)> {
    if most == 0 {
        return Vec::new();
    }
    let cap = most.saturating_mul(2).max(64);
    let mut kept: Vec<(T, i64)> = Vec::new();
    let mut floor: Option<i64> = None;
    let keep_best = |kept: &mut Vec<(T, i64)>| {
        if kept.len() > most {
            kept.select_nth_unstable_by(most - 1, |a, b| b.1.cmp(&a.1));
            kept.truncate(most);
        }
    };
    for (t, n) in items {
        if floor.is_some_and(|f| n <= f) {
            continue;
        }
        kept.push((t, n));
        if kept.len() >= cap {
            keep_best(&mut kept);
            floor = kept.iter().map(|e| e.1).min();
        }
    }
    keep_best(&mut kept);
    kept
}

/// What stops [`top_across`]: a segment's failure, or the deadline.
#[derive(Debug)]
pub(crate) enum TopError {
    Segment(SegmentError),
    Store(StoreError),
}

impl From<SegmentError> for TopError {
    fn from(e: SegmentError) -> Self {
        TopError::Segment(e)
    }
}

impl From<StoreError> for TopError {
    fn from(e: StoreError) -> Self {
        TopError::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_keeps_the_largest_sums_whatever_their_order() {
        let mut x: u64 = 3;
        for len in [0usize, 1, 5, 63, 64, 65, 500, 5000] {
            let items: Vec<(usize, i64)> = (0..len)
                .map(|i| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    (i, ((x >> 40) % 50) as i64)
                })
                .collect();
            for most in [0usize, 1, 3, 10, 64, 100, 10_000] {
                let mut got: Vec<i64> = best(items.iter().copied(), most)
                    .into_iter()
                    .map(|e| e.1)
                    .collect();
                let mut want: Vec<i64> = items.iter().map(|e| e.1).collect();
                want.sort_unstable_by(|a, b| b.cmp(a));
                want.truncate(most);
                got.sort_unstable_by(|a, b| b.cmp(a));
                assert_eq!(got, want, "{len} items, best {most}");
            }
        }
    }
}

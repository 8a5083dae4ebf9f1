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
    fn names(&self, most: usize, keep: impl Fn(i64) -> bool) -> Result<Vec<String>, SegmentError> {
        let mut picked: Vec<(u64, i64)> = (self.ranks.start..)
            .zip(self.by_rank.iter().copied())
            .filter(|&(_, n)| keep(n))
            .collect();
        if picked.len() > most {
            picked.select_nth_unstable_by(most, |a, b| b.1.cmp(&a.1));
            picked.truncate(most);
        }
        let mut ranks: Vec<u64> = picked.into_iter().map(|(r, _)| r).collect();
        ranks.sort_unstable();
        Ok(self
            .seg
            .keys_at(&ranks)?
            .into_iter()
            .map(|(_, key)| key)
            .collect())
    }
}

/// The best `limit` keys of `ns` by the sum of `lists` and `by_name` (memory and segments
/// read by name), and the total of every key. Every sum must be non-negative (see the
/// module doc); `Err` is a segment's failure.
pub(crate) fn top_across(
    ns: &str,
    lists: &[RankSums<'_>],
    by_name: &HashMap<String, i64, foldhash::fast::FixedState>,
    limit: usize,
    deadline: &Deadline,
) -> Result<(Vec<(String, i64)>, i64), TopError> {
    let total = lists
        .iter()
        .flat_map(|l| l.by_rank.iter())
        .chain(by_name.values())
        .fold(0i64, |t, &n| t.wrapping_add(n));
    if limit == 0 {
        return Ok((Vec::new(), total));
    }
    let m = (lists.len() + usize::from(!by_name.is_empty())) as i128;
    let mut exact: HashMap<String, i64> = HashMap::new();
    let sum_of = |exact: &mut HashMap<String, i64>, names: Vec<String>| -> Result<(), TopError> {
        for name in names {
            if exact.contains_key(&name) {
                continue;
            }
            deadline.check()?;
            let mut n = by_name.get(&name).copied().unwrap_or(0);
            for l in lists {
                n = n.wrapping_add(l.of(ns, &name)?);
            }
            exact.insert(name, n);
        }
        Ok(())
    };
    // Phase 1: each list's best `limit`, summed exactly.
    for l in lists {
        sum_of(&mut exact, l.names(limit, |n| n > 0)?)?;
    }
    sum_of(&mut exact, best_by_name(by_name, limit, |n| n > 0))?;
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
        sum_of(&mut exact, l.names(usize::MAX, keep)?)?;
    }
    sum_of(&mut exact, best_by_name(by_name, usize::MAX, keep))?;
    Ok((exact.into_iter().collect(), total))
}

/// Keys of `sums` whose sum `keep` accepts, at most the best `most`.
fn best_by_name(
    sums: &HashMap<String, i64, foldhash::fast::FixedState>,
    most: usize,
    keep: impl Fn(i64) -> bool,
) -> Vec<String> {
    let mut picked: Vec<(&String, i64)> = sums
        .iter()
        .filter(|(_, n)| keep(**n))
        .map(|(k, &n)| (k, n))
        .collect();
    if picked.len() > most {
        picked.select_nth_unstable_by(most, |a, b| b.1.cmp(&a.1));
        picked.truncate(most);
    }
    picked.into_iter().map(|(k, _)| k.clone()).collect()
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

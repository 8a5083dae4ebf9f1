//! The frames a version 2 segment keeps beside its blocks (docs/format.md, "Span sums and
//! key frames"):
//!
//! - a **span frame** per span of the period (a UTC day for the engine's day and month
//!   segments): every key whose totals have a non-zero sum over the span, as (rank, sum),
//!   where a key's rank is its position in the segment's key order. A top of keys over whole
//!   days reads one small frame per day instead of every block.
//! - a **key frame** per block: the block's index keys (namespace, 0, key), front-coded, so
//!   that a rank found in a span frame is turned into a key by decoding one small frame.
//! - a **rollup frame** per block: for each record whose subtotals hold many buckets per
//!   series and span ([`ROLLUP_RATIO`]), every subtotal series summed per span, so that a
//!   breakdown over whole days reads a sum per series and day instead of every bucket.
//!
//! Decoding never trusts a length, as in `codec`: a problem is an `Err(why)`, never a panic.

use super::KeyRecord;
use super::codec::{Cur, put_varint, unzigzag, zigzag};

/// A span frame's payload: varint entry count, varint byte length of the rank stream, the
/// rank stream (the first rank, then each next one's gap minus one) and the sum stream
/// (zigzag varints). `entries` are sorted by rank, ranks unique, sums non-zero.
#[cfg(test)]
pub(crate) fn encode_span(entries: &[(u64, i64)]) -> Vec<u8> {
    let mut span = SpanBuilder::default();
    for &(rank, sum) in entries {
        span.push(rank, sum);
    }
    span.finish()
}

/// A span frame's payload built entry by entry, already varint-coded: a writer holds one per
/// span of its period (a month segment: 31) until the end, so an entry costs its few bytes
/// rather than 16.
#[derive(Debug, Default)]
pub(crate) struct SpanBuilder {
    entries: u64,
    next: u64,
    ranks: Vec<u8>,
    sums: Vec<u8>,
}

impl SpanBuilder {
    /// Adds `(rank, sum)`: ranks strictly increasing, `sum` non-zero.
    pub(crate) fn push(&mut self, rank: u64, sum: i64) {
        debug_assert!(rank >= self.next && sum != 0);
        put_varint(&mut self.ranks, rank - self.next);
        self.next = rank + 1;
        put_varint(&mut self.sums, zigzag(sum));
        self.entries += 1;
    }

    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.ranks.len() + self.sums.len() + 20);
        put_varint(&mut out, self.entries);
        put_varint(&mut out, self.ranks.len() as u64);
        out.extend_from_slice(&self.ranks);
        out.extend_from_slice(&self.sums);
        out
    }
}

/// Visits the entries of a span frame whose rank lies in `[lo, hi)`, in rank order. The
/// frame must hold `count` entries, each rank below `keys`. With `whole`, every entry is
/// decoded and checked and the streams must end exactly (what `verify` asks); without, the
/// walk stops at the first rank past `hi`.
pub(crate) fn decode_span(
    raw: &[u8],
    count: u32,
    keys: u64,
    (lo, hi): (u64, u64),
    whole: bool,
    visit: &mut impl FnMut(u64, i64),
) -> Result<(), String> {
    let mut head = Cur::new(raw, "span frame");
    let n = head.varint()?;
    if n != u64::from(count) {
        return Err(format!(
            "span frame holds {n} entries, its table entry says {count}"
        ));
    }
    let ranks_len = head.varint()?;
    if ranks_len > head.left() as u64 {
        return Err("span frame: rank stream runs past its end".into());
    }
    let split = head.pos() + ranks_len as usize;
    let mut ranks = Cur::new(&raw[..split], "span rank stream").at(head.pos());
    let mut sums = Cur::new(raw, "span sum stream").at(split);
    let mut next = 0u64;
    for _ in 0..n {
        let rank = next
            .checked_add(ranks.varint()?)
            .filter(|&r| r < keys)
            .ok_or_else(|| format!("span frame: a rank past the segment's {keys} keys"))?;
        next = rank + 1;
        if !whole && rank >= hi {
            return Ok(());
        }
        let sum = unzigzag(sums.varint()?);
        if sum == 0 {
            return Err(format!("span frame: rank {rank} has a zero sum"));
        }
        if rank >= lo && rank < hi {
            visit(rank, sum);
        }
    }
    if !ranks.at_end() || !sums.at_end() {
        return Err("span frame: bytes after the last entry".into());
    }
    Ok(())
}

/// A key frame's payload: per key, varint bytes shared with the previous key (0 for the
/// first), varint length of the rest, the rest.
pub(crate) fn encode_keys(keys: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut prev: &[u8] = &[];
    for k in keys {
        let shared = prev.iter().zip(k).take_while(|(a, b)| a == b).count();
        put_varint(&mut out, shared as u64);
        put_varint(&mut out, (k.len() - shared) as u64);
        out.extend_from_slice(&k[shared..]);
        prev = k;
    }
    out
}

/// The `count` keys of a key frame, checked to be strictly increasing; `upto` stops after
/// that many (the frame's tail is then not checked).
pub(crate) fn decode_keys(raw: &[u8], count: u32, upto: u32) -> Result<Vec<Vec<u8>>, String> {
    let mut cur = Cur::new(raw, "key frame");
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(upto.min(count) as usize);
    let mut prev: Vec<u8> = Vec::new();
    for i in 0..count {
        if i >= upto {
            return Ok(out);
        }
        let shared = cur.varint()?;
        if shared > prev.len() as u64 {
            return Err(format!(
                "key frame: key {i} shares more than its predecessor"
            ));
        }
        let rest = cur.count(1)?;
        let mut k = prev[..shared as usize].to_vec();
        k.extend_from_slice(cur.take(rest)?);
        if i > 0 && k <= prev {
            return Err(format!("key frame: key {i} is not after its predecessor"));
        }
        out.push(k.clone());
        prev = k;
    }
    if !cur.at_end() {
        return Err("key frame: bytes after the last key".into());
    }
    Ok(out)
}

/// A record gets a rollup when its subtotals hold at least this many buckets per sum the
/// rollup keeps (series × spans): the rollup then costs at most an eighth of what it saves
/// a reader from decoding.
pub const ROLLUP_RATIO: u64 = 8;

/// One record's subtotal series summed per span: spans `first..first + spans`, every
/// series (in the record's order: dimensions, then their values) `spans` sums in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rollup {
    /// The record's place in its block.
    pub ord: u32,
    pub first: u32,
    pub spans: u32,
    pub series: u32,
    /// `series × spans` sums, series-major; zero where a series has nothing in a span.
    pub sums: Vec<i64>,
}

impl Rollup {
    /// The record's rollup, whatever its size; `None` without subtotals. `span_of` maps a
    /// bucket index to its span.
    pub(crate) fn of(ord: u32, record: &KeyRecord, span_of: &dyn Fn(u32) -> u32) -> Option<Self> {
        let (first, n, series) = Self::shape(record, span_of)?;
        Some(Self::build(ord, record, span_of, (first, n, series)))
    }

    /// The record's rollup if it pays for itself ([`ROLLUP_RATIO`]); decided before any sum
    /// is allocated, so what a rollup holds is at most an eighth of the record's buckets.
    pub(crate) fn worth(
        ord: u32,
        record: &KeyRecord,
        span_of: &dyn Fn(u32) -> u32,
    ) -> Option<Self> {
        let (first, n, series) = Self::shape(record, span_of)?;
        let points: u64 = Self::series(record).map(|(_, b)| b.len() as u64).sum();
        let sums = u64::from(n).saturating_mul(series as u64);
        (sums.saturating_mul(ROLLUP_RATIO) <= points)
            .then(|| Self::build(ord, record, span_of, (first, n, series)))
    }

    fn series(record: &KeyRecord) -> impl Iterator<Item = &(String, super::Buckets)> {
        record.dims.iter().flat_map(|d| d.values.iter())
    }

    /// (first span, spans, series) of the record's subtotals; `None` without any.
    fn shape(record: &KeyRecord, span_of: &dyn Fn(u32) -> u32) -> Option<(u32, u32, usize)> {
        let ends = Self::series(record).flat_map(|(_, b)| b.first().into_iter().chain(b.last()));
        let (first, last) = ends
            .map(|&(i, _)| span_of(i))
            .fold(None, |r: Option<(u32, u32)>, s| {
                Some(r.map_or((s, s), |(a, b)| (a.min(s), b.max(s))))
            })?;
        Some((first, last - first + 1, Self::series(record).count()))
    }

    fn build(
        ord: u32,
        record: &KeyRecord,
        span_of: &dyn Fn(u32) -> u32,
        (first, n, series): (u32, u32, usize),
    ) -> Self {
        let mut sums = vec![0i64; series * n as usize];
        for (si, (_, b)) in Self::series(record).enumerate() {
            for &(i, v) in b {
                let at = &mut sums[si * n as usize + (span_of(i) - first) as usize];
                *at = at.wrapping_add(v);
            }
        }
        Rollup {
            ord,
            first,
            spans: n,
            series: series as u32,
            sums,
        }
    }

    /// Series `si` summed over spans `within` (those outside the rollup's add nothing).
    pub(crate) fn sum(&self, si: usize, within: &std::ops::Range<usize>) -> i64 {
        let (first, n) = (self.first as usize, self.spans as usize);
        let lo = within.start.clamp(first, first + n) - first;
        let hi = within.end.clamp(first, first + n) - first;
        self.sums[si * n..][lo..hi.max(lo)]
            .iter()
            .fold(0i64, |t, &v| t.wrapping_add(v))
    }
}

/// A rollup frame's payload: per rollup, by ascending `ord`: varint `ord` (its gap from the
/// previous one's plus one), varint `first`, varint `spans`, varint `series`, then the sums
/// as zigzag varints, series-major.
pub(crate) fn encode_rollups(rollups: &[Rollup]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for r in rollups {
        put_varint(&mut out, u64::from(r.ord - next));
        next = r.ord + 1;
        put_varint(&mut out, u64::from(r.first));
        put_varint(&mut out, u64::from(r.spans));
        put_varint(&mut out, u64::from(r.series));
        for &v in &r.sums {
            put_varint(&mut out, zigzag(v));
        }
    }
    out
}

/// The rollups of a frame holding `count` of them, for a block of `records` records in a
/// segment of `spans` spans. With `only`, decoding stops at (and keeps only) the rollup of
/// that record, if any; without, every rollup is decoded and the frame must end exactly.
pub(crate) fn decode_rollups(
    raw: &[u8],
    count: u32,
    (records, spans): (u32, u32),
    only: Option<u32>,
) -> Result<Vec<Rollup>, String> {
    let mut cur = Cur::new(raw, "rollup frame");
    let mut out = Vec::new();
    let mut next = 0u64;
    for _ in 0..count {
        let ord = next
            .checked_add(cur.varint()?)
            .filter(|&o| o < u64::from(records))
            .ok_or("rollup frame: a record past the block's")?;
        next = ord + 1;
        if only.is_some_and(|o| u64::from(o) < ord) {
            // Past the record asked for: it has no rollup.
            return Ok(out);
        }
        let first = cur.varint()?;
        let n = cur.varint()?;
        if n == 0 || first.saturating_add(n) > u64::from(spans) {
            return Err(format!(
                "rollup frame: spans {first}+{n} of the segment's {spans}"
            ));
        }
        let series = cur.varint()?;
        // Each sum takes a byte at least: a count the bytes left cannot hold is refused
        // before anything is allocated.
        let len = series
            .checked_mul(n)
            .filter(|&l| l > 0 && l <= cur.left() as u64)
            .ok_or_else(|| format!("rollup frame: {series} series × {n} spans run past its end"))?;
        let wanted = only.is_none_or(|o| u64::from(o) == ord);
        if !wanted {
            cur.skip_varints(len)?;
            continue;
        }
        let mut sums = Vec::with_capacity(len as usize);
        for _ in 0..len {
            sums.push(unzigzag(cur.varint()?));
        }
        out.push(Rollup {
            ord: ord as u32,
            first: first as u32,
            spans: n as u32,
            series: series as u32,
            sums,
        });
        if only.is_some() {
            return Ok(out);
        }
    }
    if only.is_none() && !cur.at_end() {
        return Err("rollup frame: bytes after the last rollup".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_frames_round_trip_and_stop_at_the_range() {
        let entries = vec![(0u64, 5i64), (1, -3), (7, 1 << 40), (300, 2)];
        let raw = encode_span(&entries);
        let mut got = Vec::new();
        decode_span(&raw, 4, 301, (0, u64::MAX), true, &mut |r, n| {
            got.push((r, n))
        })
        .unwrap();
        assert_eq!(got, entries);
        got.clear();
        decode_span(&raw, 4, 301, (1, 8), false, &mut |r, n| got.push((r, n))).unwrap();
        assert_eq!(got, vec![(1, -3), (7, 1 << 40)]);
        // A rank past the keys, a wrong count, a truncated frame: errors, no panic.
        assert!(decode_span(&raw, 4, 300, (0, u64::MAX), true, &mut |_, _| {}).is_err());
        assert!(decode_span(&raw, 3, 301, (0, u64::MAX), true, &mut |_, _| {}).is_err());
        for cut in 0..raw.len() {
            assert!(decode_span(&raw[..cut], 4, 301, (0, u64::MAX), true, &mut |_, _| {}).is_err());
        }
    }

    fn record(series: &[&[(u32, i64)]]) -> KeyRecord {
        KeyRecord {
            totals: vec![(0, 1)],
            dims: vec![super::super::DimRecord {
                dim: "d".into(),
                values: series
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (format!("v{i}"), b.to_vec()))
                    .collect(),
            }],
        }
    }

    #[test]
    fn a_rollup_sums_each_series_per_span_and_only_pays_when_dense() {
        // Spans of 24 buckets: series 0 in spans 1 and 2, series 1 in span 2 only.
        let span_of = |i: u32| i / 24;
        let r = record(&[&[(30, 2), (31, 3), (50, -1)], &[(49, 7)]]);
        let got = Rollup::of(3, &r, &span_of).unwrap();
        assert_eq!(
            got,
            Rollup {
                ord: 3,
                first: 1,
                spans: 2,
                series: 2,
                sums: vec![5, -1, 0, 7],
            }
        );
        assert_eq!(got.sum(0, &(0..3)), 4);
        assert_eq!(got.sum(0, &(2..3)), -1);
        assert_eq!(got.sum(1, &(0..2)), 0);
        assert_eq!(
            got.sum(1, &(5..9)),
            0,
            "spans past the rollup's add nothing"
        );
        assert_eq!(Rollup::worth(3, &r, &span_of), None, "4 buckets for 4 sums");
        let dense: Vec<(u32, i64)> = (24..48).map(|i| (i, 1)).collect();
        let r = record(&[&dense]);
        assert_eq!(Rollup::worth(0, &r, &span_of).unwrap().sums, vec![24]);
        assert_eq!(Rollup::of(0, &record(&[]), &span_of), None, "no subtotals");
    }

    #[test]
    fn rollup_frames_round_trip_and_refuse_what_does_not_fit() {
        let span_of = |i: u32| i / 24;
        let rollups: Vec<Rollup> = [
            (1, record(&[&[(0, 5), (70, -2)], &[(30, 1 << 40)]])),
            (4, record(&[&[(47, 9)]])),
        ]
        .iter()
        .map(|(ord, r)| Rollup::of(*ord, r, &span_of).unwrap())
        .collect();
        let raw = encode_rollups(&rollups);
        assert_eq!(decode_rollups(&raw, 2, (5, 3), None).unwrap(), rollups);
        for (ord, want) in [
            (1, Some(&rollups[0])),
            (4, Some(&rollups[1])),
            (2, None),
            (0, None),
        ] {
            let got = decode_rollups(&raw, 2, (5, 3), Some(ord)).unwrap();
            assert_eq!(got.first(), want, "record {ord}");
        }
        // A record past the block, spans past the segment, a wrong count, a cut frame.
        assert!(decode_rollups(&raw, 2, (4, 3), None).is_err());
        assert!(decode_rollups(&raw, 2, (5, 2), None).is_err());
        assert!(decode_rollups(&raw, 1, (5, 3), None).is_err());
        assert!(decode_rollups(&raw, 3, (5, 3), None).is_err());
        for cut in 0..raw.len() {
            assert!(
                decode_rollups(&raw[..cut], 2, (5, 3), None).is_err(),
                "cut at {cut}"
            );
        }
        // A series count no bytes could hold is refused before anything is allocated.
        let mut huge = Vec::new();
        for v in [0, 0, 1, u64::MAX / 2] {
            put_varint(&mut huge, v);
        }
        assert!(decode_rollups(&huge, 1, (1, 1), None).is_err());
    }

    #[test]
    fn key_frames_round_trip_and_refuse_disorder() {
        let keys: Vec<Vec<u8>> = ["a\0lnk_1", "a\0lnk_10", "a\0lnk_2", "b\0x"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        let raw = encode_keys(&keys);
        assert_eq!(decode_keys(&raw, 4, 4).unwrap(), keys);
        assert_eq!(decode_keys(&raw, 4, 2).unwrap(), keys[..2].to_vec());
        assert!(decode_keys(&raw, 5, 5).is_err());
        assert!(decode_keys(&raw, 3, 3).is_err());
        let mut swapped = keys.clone();
        swapped.swap(1, 2);
        assert!(decode_keys(&encode_keys(&swapped), 4, 4).is_err());
        for cut in 0..raw.len() {
            assert!(decode_keys(&raw[..cut], 4, 4).is_err());
        }
    }
}

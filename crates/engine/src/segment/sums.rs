//! The frames a version 2 segment keeps beside its blocks (docs/format.md, "Span sums and
//! key frames"):
//!
//! - a **span frame** per span of the period (a UTC day for the engine's day and month
//!   segments): every key whose totals have a non-zero sum over the span, as (rank, sum),
//!   where a key's rank is its position in the segment's key order. A top of keys over whole
//!   days reads one small frame per day instead of every block.
//! - a **key frame** per block: the block's index keys (namespace, 0, key), front-coded, so
//!   that a rank found in a span frame is turned into a key by decoding one small frame.
//!
//! Decoding never trusts a length, as in `codec`: a problem is an `Err(why)`, never a panic.

use super::codec::{Cur, put_varint, unzigzag, zigzag};

/// A span frame's payload: varint entry count, varint byte length of the rank stream, the
/// rank stream (the first rank, then each next one's gap minus one) and the sum stream
/// (zigzag varints). `entries` are sorted by rank, ranks unique, sums non-zero.
pub(crate) fn encode_span(entries: &[(u64, i64)]) -> Vec<u8> {
    let mut ranks = Vec::with_capacity(entries.len() * 2);
    let mut sums = Vec::with_capacity(entries.len() * 2);
    let mut next = 0u64;
    for &(rank, sum) in entries {
        put_varint(&mut ranks, rank - next);
        next = rank + 1;
        put_varint(&mut sums, zigzag(sum));
    }
    let mut out = Vec::with_capacity(ranks.len() + sums.len() + 10);
    put_varint(&mut out, entries.len() as u64);
    put_varint(&mut out, ranks.len() as u64);
    out.extend_from_slice(&ranks);
    out.extend_from_slice(&sums);
    out
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
    visit: &mut dyn FnMut(u64, i64),
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

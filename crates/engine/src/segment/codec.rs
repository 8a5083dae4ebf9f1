//! A block's uncompressed payload (docs/format.md, "Block payload"): a dictionary of the
//! dimension names and values its records use, most frequent first, then its records in key
//! order. Bucket indexes are delta-coded varints, counts zigzag varints.
//!
//! Decoding never trusts a length: every count is checked against the bytes left before
//! anything is allocated for it, and every problem is an `Err(why)`, never a panic.

use std::collections::HashMap;

use super::{Buckets, DimRecord, KeyRecord};

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Why `buckets` cannot be stored for a period of bucket indexes `[first, end)`.
pub(crate) fn buckets_problem(buckets: &[(u32, i64)], first: u32, end: u64) -> Option<String> {
    let mut prev: Option<u32> = None;
    for &(i, n) in buckets {
        if u64::from(i) >= end || i < first {
            return Some(format!("bucket index {i} is outside the segment's period"));
        }
        if prev.is_some_and(|p| p >= i) {
            return Some(format!("bucket index {i} is not after the previous one"));
        }
        if n == 0 {
            return Some(format!("bucket {i} has a zero count"));
        }
        prev = Some(i);
    }
    None
}

/// Why `record` cannot be stored, if it cannot.
pub(crate) fn record_problem(record: &KeyRecord, first: u32, end: u64) -> Option<String> {
    if let Some(p) = buckets_problem(&record.totals, first, end) {
        return Some(format!("totals: {p}"));
    }
    for (i, d) in record.dims.iter().enumerate() {
        if i > 0 && record.dims[i - 1].dim.as_bytes() >= d.dim.as_bytes() {
            return Some(format!(
                "dimension {:?} is not after the previous one",
                d.dim
            ));
        }
        for (j, (v, b)) in d.values.iter().enumerate() {
            if j > 0 && d.values[j - 1].0.as_bytes() >= v.as_bytes() {
                return Some(format!(
                    "{}: value {v:?} is not after the previous one",
                    d.dim
                ));
            }
            if let Some(p) = buckets_problem(b, first, end) {
                return Some(format!("{}={v}: {p}", d.dim));
            }
        }
    }
    None
}

/// A rough size of `record` in a block, for cutting blocks near their target.
pub(crate) fn estimate(record: &KeyRecord) -> usize {
    let mut n = 2 + record.totals.len() * 3;
    for d in &record.dims {
        n += 2;
        for (_, b) in &d.values {
            n += 3 + b.len() * 3;
        }
    }
    n
}

/// The payload of a block holding `records` (already validated), bucket indexes relative to
/// `first`.
pub(crate) fn encode_block(records: &[KeyRecord], first: u32) -> Vec<u8> {
    // Most frequent strings get the smallest ids: one-byte varints, and a skewed byte
    // distribution that the compressor codes in few bits.
    let mut freq: HashMap<&str, u64, foldhash::fast::FixedState> = HashMap::default();
    for r in records {
        for d in &r.dims {
            *freq.entry(d.dim.as_str()).or_default() += 1;
            for (v, _) in &d.values {
                *freq.entry(v.as_str()).or_default() += 1;
            }
        }
    }
    let mut dict: Vec<(&str, u64)> = freq.into_iter().collect();
    dict.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let ids: HashMap<&str, u64, foldhash::fast::FixedState> = dict
        .iter()
        .enumerate()
        .map(|(i, (s, _))| (*s, i as u64))
        .collect();

    let mut out = Vec::new();
    put_varint(&mut out, dict.len() as u64);
    for (s, _) in &dict {
        put_varint(&mut out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    let id = |s: &str| ids.get(s).copied().unwrap_or(0);
    for r in records {
        put_buckets(&mut out, &r.totals, first);
        put_varint(&mut out, r.dims.len() as u64);
        for d in &r.dims {
            put_varint(&mut out, id(&d.dim));
            put_varint(&mut out, d.values.len() as u64);
            for (v, b) in &d.values {
                put_varint(&mut out, id(v));
                put_buckets(&mut out, b, first);
            }
        }
    }
    out
}

fn put_buckets(out: &mut Vec<u8>, b: &[(u32, i64)], first: u32) {
    put_varint(out, b.len() as u64);
    let mut next = first;
    for &(i, _) in b {
        put_varint(out, u64::from(i - next));
        next = i.wrapping_add(1);
    }
    for &(_, n) in b {
        put_varint(out, zigzag(n));
    }
}

/// Reads a block payload's records one after the other.
pub(crate) struct BlockReader {
    buf: Vec<u8>,
    pos: usize,
    dict: Vec<String>,
    first: u32,
    end: u64,
}

impl BlockReader {
    /// Reads the dictionary; records follow with [`BlockReader::next_record`].
    pub(crate) fn new(buf: Vec<u8>, first: u32, end: u64) -> Result<Self, String> {
        let mut r = BlockReader {
            buf,
            pos: 0,
            dict: Vec::new(),
            first,
            end,
        };
        let n = r.count(1, "dictionary")?;
        let mut dict = Vec::with_capacity(n);
        for _ in 0..n {
            let len = r.count(1, "dictionary string")?;
            let bytes = r.take(len)?;
            let s = std::str::from_utf8(bytes).map_err(|_| "dictionary string is not UTF-8")?;
            dict.push(s.to_owned());
        }
        r.dict = dict;
        Ok(r)
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    pub(crate) fn next_record(&mut self) -> Result<KeyRecord, String> {
        let totals = self.buckets()?;
        let ndims = self.count(2, "dimensions")?;
        let mut dims: Vec<DimRecord> = Vec::with_capacity(ndims);
        for _ in 0..ndims {
            let dim = self.string()?;
            if dims
                .last()
                .is_some_and(|p| p.dim.as_bytes() >= dim.as_bytes())
            {
                return Err(format!("dimension {dim:?} out of order"));
            }
            let nvalues = self.count(2, "values")?;
            let mut values: Vec<(String, Buckets)> = Vec::with_capacity(nvalues);
            for _ in 0..nvalues {
                let v = self.string()?;
                if values
                    .last()
                    .is_some_and(|p| p.0.as_bytes() >= v.as_bytes())
                {
                    return Err(format!("value {v:?} of {dim:?} out of order"));
                }
                let b = self.buckets()?;
                values.push((v, b));
            }
            dims.push(DimRecord { dim, values });
        }
        Ok(KeyRecord { totals, dims })
    }

    fn string(&mut self) -> Result<String, String> {
        let id = self.varint()?;
        usize::try_from(id)
            .ok()
            .and_then(|i| self.dict.get(i))
            .cloned()
            .ok_or_else(|| format!("dictionary id {id} out of range"))
    }

    fn buckets(&mut self) -> Result<Buckets, String> {
        let n = self.count(2, "buckets")?;
        let mut b = Vec::with_capacity(n);
        let mut next = u64::from(self.first);
        for _ in 0..n {
            let i = next
                .checked_add(self.varint()?)
                .filter(|&i| i < self.end)
                .ok_or("bucket index outside the segment's period")?;
            b.push((i as u32, 0));
            next = i + 1;
        }
        for slot in &mut b {
            let c = unzigzag(self.varint()?);
            if c == 0 {
                return Err(format!("bucket {} has a zero count", slot.0));
            }
            slot.1 = c;
        }
        Ok(b)
    }

    /// A varint count of things that take at least `min_bytes` each, checked against the
    /// bytes left.
    fn count(&mut self, min_bytes: usize, what: &str) -> Result<usize, String> {
        let n = self.varint()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            return Err(format!("{what}: count {n} runs past the end of the block"));
        }
        Ok(n as usize)
    }

    fn take(&mut self, len: usize) -> Result<&[u8], String> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&e| e <= self.buf.len())
            .ok_or("string runs past the end of the block")?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err("block ends inside a varint".into());
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err("varint overflows 64 bits".into());
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips_the_extremes() {
        for v in [0, 1, -1, 2, -2, i64::MAX, i64::MIN, 1 << 40, -(1 << 40)] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }

    #[test]
    fn varints_round_trip_and_overlong_ones_fail() {
        let mut out = Vec::new();
        for v in [0, 127, 128, 300, u64::MAX] {
            put_varint(&mut out, v);
        }
        let mut r = BlockReader {
            buf: out,
            pos: 0,
            dict: vec![],
            first: 0,
            end: 0,
        };
        for v in [0, 127, 128, 300, u64::MAX] {
            assert_eq!(r.varint().unwrap(), v);
        }
        assert!(r.at_end());
        let mut bad = BlockReader {
            buf: vec![0xff; 11],
            pos: 0,
            dict: vec![],
            first: 0,
            end: 0,
        };
        assert!(bad.varint().is_err());
        let mut over = BlockReader {
            buf: vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
            pos: 0,
            dict: vec![],
            first: 0,
            end: 0,
        };
        assert!(over.varint().is_err());
    }

    #[test]
    fn a_block_round_trips_and_its_dictionary_is_by_frequency() {
        let recs = vec![
            KeyRecord {
                totals: vec![(10, 5), (12, -1)],
                dims: vec![DimRecord {
                    dim: "country".into(),
                    values: vec![("DE".into(), vec![(10, 1)]), ("US".into(), vec![(10, 4)])],
                }],
            },
            KeyRecord {
                totals: vec![(11, 1)],
                dims: vec![DimRecord {
                    dim: "country".into(),
                    values: vec![("US".into(), vec![(11, 1)])],
                }],
            },
        ];
        let b = encode_block(&recs, 10);
        // dictionary: 3 strings, "US" and "country" (2 uses each, by bytes) before "DE".
        assert_eq!(&b[..4], b"\x03\x02US");
        assert_eq!(&b[4..12], b"\x07country");
        assert_eq!(&b[12..15], b"\x02DE");
        let mut r = BlockReader::new(b, 10, 34).unwrap();
        assert_eq!(r.next_record().unwrap(), recs[0]);
        assert_eq!(r.next_record().unwrap(), recs[1]);
        assert!(r.at_end());
        // The same bytes read for a period that ends earlier are refused, not misread.
        let b = encode_block(&recs, 10);
        let mut r = BlockReader::new(b, 10, 12).unwrap();
        assert!(r.next_record().is_err());
    }
}

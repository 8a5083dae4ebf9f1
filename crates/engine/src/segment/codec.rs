//! The segment's variable-length parts (docs/format.md, "Dictionary" and "Block payload"):
//! the segment dictionary of dimension names and values, and a block's payload, its records
//! cut into separate streams (shapes, totals buckets, totals counts, value ids, subtotal
//! buckets, subtotal counts) so that the compressor sees similar bytes together.
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

/// A rough size of `record` in a block's payload, for cutting blocks near their target.
pub(crate) fn estimate(record: &KeyRecord, period: &Period) -> usize {
    let series = |n: usize| {
        if period.bitmap() {
            period.bitmap_len()
        } else {
            1 + n
        }
    };
    let mut size = 1 + series(record.totals.len()) + record.totals.len();
    for d in &record.dims {
        size += 2;
        for (_, b) in &d.values {
            size += 2 + b.len();
        }
    }
    size
}

/// An upper bound of `record`'s bytes in a block's payload (counts measured, bucket gaps
/// and ids at their widest); at most 16 times [`estimate`], so only worth working out when
/// that is large.
pub(crate) fn encoded_bound(record: &KeyRecord, period: &Period) -> usize {
    let varint_len = |v: u64| (64 - (v | 1).leading_zeros() as usize).div_ceil(7);
    let series = |b: &[(u32, i64)]| {
        let indexes = if period.bitmap() {
            period.bitmap_len()
        } else {
            10 + 5 * b.len()
        };
        indexes + b.iter().map(|&(_, n)| varint_len(zigzag(n))).sum::<usize>()
    };
    let mut size = 10 + series(&record.totals);
    for d in &record.dims {
        size += 15;
        for (_, b) in &d.values {
            size += 5 + series(b);
        }
    }
    size
}

/// The bucket indexes `[first, end)` of a segment's period, and how a series of them is
/// written: a bitmap when the period has at most 64 buckets, index gaps otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Period {
    pub first: u32,
    pub end: u64,
}

impl Period {
    pub(crate) fn bitmap(&self) -> bool {
        self.end - u64::from(self.first) <= 64
    }

    /// Bytes of a bucket bitmap of the whole period.
    pub(crate) fn bitmap_len(&self) -> usize {
        (self.end - u64::from(self.first)).div_ceil(8) as usize
    }
}

// ---- the dictionary ---------------------------------------------------------------------

/// The writer's dictionary: dimension names and, per dimension, its values, each numbered in
/// the order first met (the segment's first keys meet the common values first, so they get
/// the small, one-byte ids).
#[derive(Debug, Default)]
pub(crate) struct DictBuilder {
    dims: Vec<(String, Vec<String>)>,
    dim_ids: HashMap<String, u32, crate::seeded::State>,
    value_ids: HashMap<(u32, String), u32, crate::seeded::State>,
}

impl DictBuilder {
    fn dim(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.dim_ids.get(name) {
            return id;
        }
        let id = self.dims.len() as u32;
        self.dims.push((name.to_owned(), Vec::new()));
        self.dim_ids.insert(name.to_owned(), id);
        id
    }

    fn value(&mut self, dim: u32, v: &str) -> u32 {
        // Look up without allocating; insert (rarely) with one.
        let key = (dim, v.to_owned());
        if let Some(&id) = self.value_ids.get(&key) {
            return id;
        }
        let values = &mut self.dims[dim as usize].1;
        let id = values.len() as u32;
        values.push(v.to_owned());
        self.value_ids.insert(key, id);
        id
    }

    /// The dictionary's bytes: varint dimension count; per dimension its name, a varint value
    /// count and the values; a string is a varint byte length and UTF-8 bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, self.dims.len() as u64);
        for (name, values) in &self.dims {
            put_str(&mut out, name);
            put_varint(&mut out, values.len() as u64);
            for v in values {
                put_str(&mut out, v);
            }
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// The reader's dictionary.
#[derive(Debug, Default)]
pub(crate) struct Dictionary {
    dims: Vec<(String, Vec<String>)>,
}

impl Dictionary {
    pub(crate) fn decode(buf: &[u8]) -> Result<Self, String> {
        let mut c = Cur::new(buf, "dictionary");
        let n = c.count(2)?;
        let mut dims = Vec::with_capacity(n);
        for _ in 0..n {
            let name = c.string()?;
            let nv = c.count(1)?;
            let mut values = Vec::with_capacity(nv);
            for _ in 0..nv {
                values.push(c.string()?);
            }
            dims.push((name, values));
        }
        if !c.at_end() {
            return Err("dictionary: bytes after its last string".into());
        }
        Ok(Dictionary { dims })
    }

    /// Heap bytes held, about: each string's bytes and its `String`, each dimension's list.
    pub(crate) fn bytes(&self) -> usize {
        const STRING: usize = std::mem::size_of::<String>();
        const DIM: usize = std::mem::size_of::<(String, Vec<String>)>();
        self.dims
            .iter()
            .map(|(d, values)| {
                DIM + d.len() + values.iter().map(|v| STRING + v.len()).sum::<usize>()
            })
            .sum::<usize>()
            + std::mem::size_of::<Dictionary>()
    }

    /// Dimension names and values held.
    pub(crate) fn strings(&self) -> usize {
        self.dims.iter().map(|(_, v)| 1 + v.len()).sum()
    }

    /// Every dimension: its name and its values, each at its id.
    pub(crate) fn dims(&self) -> &[(String, Vec<String>)] {
        &self.dims
    }

    /// The names of dimension `d` and its value `v` (ids a block's records hold, checked
    /// by the block's reads).
    pub(crate) fn names(&self, d: u32, v: u32) -> Option<(&str, &str)> {
        let (dim, values) = self.dims.get(d as usize)?;
        Some((dim, values.get(v as usize)?))
    }

    /// Checks dimension id `d` and returns its name and values.
    fn dim(&self, d: u64) -> Result<(&str, &[String]), String> {
        match usize::try_from(d).ok().and_then(|i| self.dims.get(i)) {
            Some((dim, values)) => Ok((dim, values)),
            None => Err(format!("dimension id {d} is not in the dictionary")),
        }
    }
}

/// Checks value id `v` of dimension `dim` (with values `names`) and returns it as a u32.
fn value_id(v: u64, dim: &str, names: &[String]) -> Result<u32, String> {
    match u32::try_from(v) {
        Ok(id) if (id as usize) < names.len() => Ok(id),
        _ => Err(format!("value id {v} of {dim:?} is not in the dictionary")),
    }
}

// ---- block payload ------------------------------------------------------------------------

/// The streams of a block payload, in the order they are stored.
const SHAPE: usize = 0;
const TBITS: usize = 1;
const TCOUNTS: usize = 2;
const IDS: usize = 3;
const SBITS: usize = 4;
const SCOUNTS: usize = 5;
pub(crate) const STREAMS: usize = 6;

/// Whether `sub` is non-empty and every one of its indexes is in `totals`.
fn subset_of(sub: &[(u32, i64)], totals: &[(u32, i64)]) -> bool {
    let mut t = totals.iter();
    !sub.is_empty() && sub.iter().all(|(i, _)| t.any(|(j, _)| j == i))
}

/// `sub`'s indexes as bits over the positions of `totals` (a subset, at most 64 long).
fn mask_in(sub: &[(u32, i64)], totals: &[(u32, i64)]) -> u64 {
    let mut mask = 0u64;
    let mut pos = 0;
    for (i, _) in sub {
        while totals[pos].0 != *i {
            pos += 1;
        }
        mask |= 1 << pos;
    }
    mask
}

fn put_bits(out: &mut Vec<u8>, mask: u64, len: usize) {
    out.extend_from_slice(&mask.to_le_bytes()[..len]);
}

/// A series' indexes, as a bitmap of the period or as a count and gaps.
fn put_series(out: &mut Vec<u8>, b: &[(u32, i64)], period: &Period) {
    if period.bitmap() {
        let mask = b.iter().fold(0u64, |m, (i, _)| m | 1 << (i - period.first));
        put_bits(out, mask, period.bitmap_len());
    } else {
        put_varint(out, b.len() as u64);
        let mut next = period.first;
        for &(i, _) in b {
            put_varint(out, u64::from(i - next));
            next = i.wrapping_add(1);
        }
    }
}

/// The payload of a block holding `records` (already validated), naming dimensions and
/// values by their ids in `dict`, which grows as needed.
pub(crate) fn encode_block(
    records: &[KeyRecord],
    dict: &mut DictBuilder,
    period: &Period,
) -> Vec<u8> {
    let mut s: [Vec<u8>; STREAMS] = Default::default();
    for r in records {
        let k = r.totals.len();
        let relative = k <= 64
            && r.dims
                .iter()
                .all(|d| d.values.iter().all(|(_, b)| subset_of(b, &r.totals)));
        put_varint(
            &mut s[SHAPE],
            (r.dims.len() as u64) << 1 | u64::from(relative),
        );
        put_series(&mut s[TBITS], &r.totals, period);
        for &(_, n) in &r.totals {
            put_varint(&mut s[TCOUNTS], zigzag(n));
        }
        for d in &r.dims {
            let dim = dict.dim(&d.dim);
            put_varint(&mut s[SHAPE], u64::from(dim));
            put_varint(&mut s[SHAPE], d.values.len() as u64);
            for (v, b) in &d.values {
                put_varint(&mut s[IDS], u64::from(dict.value(dim, v)));
                if !relative {
                    put_series(&mut s[SBITS], b, period);
                } else if k > 1 {
                    put_bits(&mut s[SBITS], mask_in(b, &r.totals), k.div_ceil(8));
                }
                for &(_, n) in b {
                    put_varint(&mut s[SCOUNTS], zigzag(n));
                }
            }
        }
    }
    let mut out = Vec::with_capacity(s.iter().map(Vec::len).sum::<usize>() + 16);
    for stream in &s[..STREAMS - 1] {
        put_varint(&mut out, stream.len() as u64);
    }
    for stream in &s {
        out.extend_from_slice(stream);
    }
    out
}

/// A block payload, parsed: where each record starts in each stream.
#[derive(Debug)]
pub(crate) struct Block {
    raw: Vec<u8>,
    /// Per record, its first byte in each stream.
    starts: Vec<[u32; STREAMS]>,
    /// Where each stream ends.
    ends: [u32; STREAMS],
}

impl Block {
    /// Checks that the payload holds exactly `records` records and notes where each starts.
    pub(crate) fn parse(raw: Vec<u8>, records: u32, period: &Period) -> Result<Block, String> {
        let mut head = Cur::new(&raw, "stream lengths");
        let mut ends = [0u32; STREAMS];
        let mut at = 0u64;
        for end in &mut ends[..STREAMS - 1] {
            at = at.saturating_add(head.varint()?);
            *end = u32::try_from(at).map_err(|_| "stream lengths overflow")?;
        }
        let base = head.pos as u64;
        if base + at > raw.len() as u64 {
            return Err("stream lengths run past the end of the block".into());
        }
        ends = ends.map(|e| e + base as u32);
        ends[STREAMS - 1] = raw.len() as u32;
        let mut c: [Cur; STREAMS] = std::array::from_fn(|i| {
            let start = if i == 0 {
                base as usize
            } else {
                ends[i - 1] as usize
            };
            Cur::new(&raw[..ends[i] as usize], STREAM_NAMES[i]).at(start)
        });
        // A record takes at least one byte of the shape stream.
        if u64::from(records) > u64::from(ends[SHAPE]) - base {
            return Err(format!("{records} records cannot fit the shape stream"));
        }
        let mut starts = Vec::with_capacity(records as usize);
        for _ in 0..records {
            starts.push(c.each_ref().map(|c| c.pos as u32));
            let head = c[SHAPE].varint()?;
            let (ndims, relative) = (head >> 1, head & 1 == 1);
            let k = c[TBITS].skip_series(period)?;
            c[TCOUNTS].skip_varints(k)?;
            if relative && k > 64 {
                return Err(format!("a record of {k} totals has subtotals by position"));
            }
            for _ in 0..ndims {
                c[SHAPE].varint()?;
                let nvalues = c[SHAPE].varint()?;
                c[IDS].skip_varints(nvalues)?;
                for _ in 0..nvalues {
                    let n = if !relative {
                        c[SBITS].skip_series(period)?
                    } else if k > 1 {
                        u64::from(c[SBITS].bits(k as usize)?.count_ones())
                    } else {
                        1
                    };
                    c[SCOUNTS].skip_varints(n)?;
                }
            }
        }
        if let Some(c) = c.iter().find(|c| !c.at_end()) {
            return Err(format!("{}: bytes after the last record", c.what));
        }
        Ok(Block { raw, starts, ends })
    }

    /// A reading position in each stream, at record `j`'s start.
    fn cursors(&self, j: usize) -> Result<[Cur<'_>; STREAMS], String> {
        let Some(starts) = self.starts.get(j) else {
            return Err(format!("no record {j}"));
        };
        Ok(std::array::from_fn(|i| {
            Cur::new(&self.raw[..self.ends[i] as usize], STREAM_NAMES[i]).at(starts[i] as usize)
        }))
    }

    /// Record `j` (< `len()`), its names from `dict`.
    pub(crate) fn record(
        &self,
        j: usize,
        dict: &Dictionary,
        period: &Period,
    ) -> Result<KeyRecord, String> {
        let mut c = self.cursors(j)?;
        let head = c[SHAPE].varint()?;
        let (ndims, relative) = (head >> 1, head & 1 == 1);
        let idx = c[TBITS].series(period)?;
        let totals = c[TCOUNTS].counts(&idx)?;
        let k = totals.len();
        let ndims = usize::try_from(ndims).map_err(|_| "dimension count overflows")?;
        let mut dims: Vec<DimRecord> = Vec::with_capacity(ndims.min(c[SHAPE].left() / 2));
        for _ in 0..ndims {
            let id = c[SHAPE].varint()?;
            let Some((dim, names)) = usize::try_from(id).ok().and_then(|i| dict.dims.get(i)) else {
                return Err(format!("dimension id {id} is not in the dictionary"));
            };
            if dims
                .last()
                .is_some_and(|p| p.dim.as_bytes() >= dim.as_bytes())
            {
                return Err(format!("dimension {dim:?} out of order"));
            }
            let nvalues = c[SHAPE].varint()?;
            let nvalues = usize::try_from(nvalues).map_err(|_| "value count overflows")?;
            let mut values: Vec<(String, Buckets)> = Vec::with_capacity(nvalues.min(c[IDS].left()));
            for _ in 0..nvalues {
                let id = c[IDS].varint()?;
                let Some(v) = usize::try_from(id).ok().and_then(|i| names.get(i)) else {
                    return Err(format!("value id {id} of {dim:?} is not in the dictionary"));
                };
                if values
                    .last()
                    .is_some_and(|p| p.0.as_bytes() >= v.as_bytes())
                {
                    return Err(format!("value {v:?} of {dim:?} out of order"));
                }
                let idx = if !relative {
                    c[SBITS].series(period)?
                } else {
                    let mask = c[SBITS]
                        .position_mask(k)
                        .map_err(|e| format!("value {v:?} of {dim:?}: {e}"))?;
                    (0..k)
                        .filter(|p| mask >> p & 1 == 1)
                        .map(|p| totals[p].0)
                        .collect()
                };
                values.push((v.clone(), c[SCOUNTS].counts(&idx)?));
            }
            dims.push(DimRecord {
                dim: dim.clone(),
                values,
            });
        }
        Ok(KeyRecord { totals, dims })
    }

    /// Record `j` summed rather than decoded: its totals bucket by bucket, those `inside`
    /// accepts, go to `total`; each subtotal series of a dimension `dim_ok` accepts goes to
    /// `sub` as (dimension id, value id in `dict`, sum over the buckets `inside` accepts),
    /// non-zero sums only, ids checked. Other dimensions are skipped without decoding, and
    /// no name is touched: what a breakdown needs of a key with thousands of values over a
    /// month.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sums(
        &self,
        j: usize,
        dict: &Dictionary,
        period: &Period,
        inside: &dyn Fn(u32) -> bool,
        dim_ok: &dyn Fn(&str) -> bool,
        total: &mut dyn FnMut(u32, i64),
        sub: &mut dyn FnMut(u32, u32, i64),
    ) -> Result<(), String> {
        let mut c = self.cursors(j)?;
        let head = c[SHAPE].varint()?;
        let (ndims, relative) = (head >> 1, head & 1 == 1);
        let inside = Inside::new(period, inside);
        let idx = c[TBITS].series(period)?;
        let k = idx.len();
        for &i in &idx {
            match unzigzag(c[TCOUNTS].varint()?) {
                0 => return Err(format!("{}: bucket {i} has a zero count", c[TCOUNTS].what)),
                n if inside.has(i) => total(i, n),
                _ => {}
            }
        }
        let all_inside = idx.iter().all(|&i| inside.has(i));
        for _ in 0..ndims {
            let id = c[SHAPE].varint()?;
            let (dim, names) = dict.dim(id)?;
            // Checked by `dict.dim`: the dictionary's dimensions are counted in a u32.
            let dim_id = id as u32;
            let nvalues = c[SHAPE].varint()?;
            let wanted = dim_ok(dim);
            if !wanted {
                c[IDS].skip_varints(nvalues)?;
            }
            for _ in 0..nvalues {
                let value = if wanted {
                    Some(value_id(c[IDS].varint()?, dim, names)?)
                } else {
                    None
                };
                let mut n = 0i64;
                if !relative {
                    if value.is_none() {
                        let len = c[SBITS].skip_series(period)?;
                        c[SCOUNTS].skip_varints(len)?;
                        continue;
                    }
                    // Indexes and counts are separate streams: read side by side.
                    let (head, tail) = c.split_at_mut(SCOUNTS);
                    let (sbits, scounts) = (&mut head[SBITS], &mut tail[0]);
                    sbits.series_each(period, |i| {
                        let v = unzigzag(scounts.varint()?);
                        if inside.has(i) {
                            n = n.wrapping_add(v);
                        }
                        Ok(())
                    })?;
                } else {
                    let mask = c[SBITS]
                        .position_mask(k)
                        .map_err(|e| format!("a value of {dim:?}: {e}"))?;
                    if value.is_none() {
                        c[SCOUNTS].skip_varints(u64::from(mask.count_ones()))?;
                        continue;
                    }
                    let mut m = mask;
                    while m != 0 {
                        let p = m.trailing_zeros() as usize;
                        m &= m - 1;
                        let v = unzigzag(c[SCOUNTS].varint()?);
                        if all_inside || inside.has(idx[p]) {
                            n = n.wrapping_add(v);
                        }
                    }
                }
                if let Some(v) = value
                    && n != 0
                {
                    sub(dim_id, v, n);
                }
            }
        }
        Ok(())
    }

    /// The subtotal series of record `j`, in order, as (dimension name, dimension id, value
    /// id in `dict`) — from the shape and value-id streams alone, no count decoded, ids
    /// checked. Returns how many there are.
    pub(crate) fn series_ids(
        &self,
        j: usize,
        dict: &Dictionary,
        visit: &mut dyn FnMut(usize, &str, u32, u32),
    ) -> Result<usize, String> {
        let mut c = self.cursors(j)?;
        let ndims = c[SHAPE].varint()? >> 1;
        let mut at = 0usize;
        for _ in 0..ndims {
            let id = c[SHAPE].varint()?;
            let (dim, names) = dict.dim(id)?;
            let nvalues = c[SHAPE].count(0)?;
            for _ in 0..nvalues {
                let v = value_id(c[IDS].varint()?, dim, names)?;
                visit(at, dim, id as u32, v);
                at += 1;
            }
        }
        Ok(at)
    }

    /// Only the totals of record `j`: what a series, a window or a top of keys needs. The
    /// subtotal streams are not touched, so a key with thousands of subtotal values costs
    /// what its totals cost.
    pub(crate) fn totals(&self, j: usize, period: &Period) -> Result<Buckets, String> {
        let Some(starts) = self.starts.get(j) else {
            return Err(format!("no record {j}"));
        };
        let cur = |i: usize| {
            Cur::new(&self.raw[..self.ends[i] as usize], STREAM_NAMES[i]).at(starts[i] as usize)
        };
        cur(SHAPE).varint()?;
        let idx = cur(TBITS).series(period)?;
        cur(TCOUNTS).counts(&idx)
    }
}

/// Which buckets of a period a read takes: asked of the caller's closure once per bucket of
/// the period and kept as bits, when the period is short enough, so that a record with
/// thousands of subtotal buckets does not call it for each.
struct Inside<'f> {
    first: u32,
    bits: Vec<u64>,
    ask: &'f dyn Fn(u32) -> bool,
}

impl<'f> Inside<'f> {
    /// Periods up to this many buckets are kept as bits (a month of hours is 744).
    const MOST: u64 = 4096;

    fn new(period: &Period, ask: &'f dyn Fn(u32) -> bool) -> Self {
        let len = period.end.saturating_sub(u64::from(period.first));
        let mut bits = Vec::new();
        if len <= Self::MOST {
            bits = vec![0u64; (len as usize).div_ceil(64)];
            for b in 0..len as u32 {
                if ask(period.first + b) {
                    bits[b as usize / 64] |= 1 << (b % 64);
                }
            }
        }
        Inside {
            first: period.first,
            bits,
            ask,
        }
    }

    #[inline]
    fn has(&self, i: u32) -> bool {
        if self.bits.is_empty() {
            return (self.ask)(i);
        }
        let b = i.wrapping_sub(self.first) as usize;
        self.bits
            .get(b / 64)
            .is_some_and(|w| w >> (b % 64) & 1 == 1)
    }
}

/// The totals of every record of a block payload, each summed over the buckets `inside`
/// accepts, in record order. Only the shape and totals streams are read: a top of keys over
/// a month segment walks nothing of the subtotals, and notes no record starts.
pub(crate) fn total_sums(
    raw: &[u8],
    records: u32,
    period: &Period,
    inside: &dyn Fn(u32) -> bool,
) -> Result<Vec<i64>, String> {
    let mut head = Cur::new(raw, "stream lengths");
    let mut ends = [0usize; STREAMS - 1];
    let mut at = 0u64;
    for end in &mut ends {
        at = at.saturating_add(head.varint()?);
        *end = usize::try_from(at).map_err(|_| "stream lengths overflow")?;
    }
    let base = head.pos;
    if base as u64 + at > raw.len() as u64 {
        return Err("stream lengths run past the end of the block".into());
    }
    let stream = |i: usize| {
        let start = if i == 0 { base } else { base + ends[i - 1] };
        Cur::new(&raw[..base + ends[i]], STREAM_NAMES[i]).at(start)
    };
    let (mut shape, mut tbits, mut tcounts) = (stream(SHAPE), stream(TBITS), stream(TCOUNTS));
    if u64::from(records) > shape.left() as u64 {
        return Err(format!("{records} records cannot fit the shape stream"));
    }
    // Whether the whole period counts, so that no bucket needs a look of its own: asked of
    // periods the engine writes (a month of hours is 744 buckets), not of any a footer can
    // name (up to 2^32), which the per-bucket path below handles in the time its buckets take.
    let whole = period.end - u64::from(period.first) <= WHOLE_PERIOD_CHECK
        && (period.first..)
            .take_while(|&i| u64::from(i) < period.end)
            .all(inside);
    let mut out = Vec::with_capacity(records as usize);
    for _ in 0..records {
        let ndims = shape.varint()? >> 1;
        shape.skip_varints(ndims.saturating_mul(2))?;
        let mut sum = 0i64;
        if whole {
            let k = tbits.skip_series(period)?;
            for _ in 0..k {
                match unzigzag(tcounts.varint()?) {
                    0 => return Err(format!("{}: a zero count", tcounts.what)),
                    n => sum = sum.wrapping_add(n),
                }
            }
        } else {
            for i in tbits.series(period)? {
                match unzigzag(tcounts.varint()?) {
                    0 => return Err(format!("{}: bucket {i} has a zero count", tcounts.what)),
                    n if inside(i) => sum = sum.wrapping_add(n),
                    _ => {}
                }
            }
        }
        out.push(sum);
    }
    if let Some(c) = [&shape, &tbits, &tcounts].into_iter().find(|c| !c.at_end()) {
        return Err(format!("{}: bytes after the last record", c.what));
    }
    Ok(out)
}

/// The longest period (in buckets) [`total_sums`] asks `inside` about bucket by bucket up
/// front: an hour of seconds.
const WHOLE_PERIOD_CHECK: u64 = 3600;

const STREAM_NAMES: [&str; STREAMS] = [
    "shape stream",
    "totals bucket stream",
    "totals count stream",
    "value id stream",
    "subtotal bucket stream",
    "subtotal count stream",
];

/// A reading position in a byte slice; every read is checked against its end.
#[derive(Debug, Clone)]
pub(crate) struct Cur<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cur<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Cur { buf, pos: 0, what }
    }

    pub(crate) fn at(mut self, pos: usize) -> Self {
        self.pos = pos.min(self.buf.len());
        self
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u64, String> {
        // Most varints of a frame (rank gaps, small sums) are one byte.
        if let Some(&b) = self.buf.get(self.pos)
            && b < 0x80
        {
            self.pos += 1;
            return Ok(u64::from(b));
        }
        self.varint_long()
    }

    fn varint_long(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("{} ends inside a varint", self.what));
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(format!("{}: varint overflows 64 bits", self.what));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("{}: varint longer than 10 bytes", self.what))
    }

    /// Skips `n` varints: past the `n`-th byte without its high bit.
    pub(crate) fn skip_varints(&mut self, n: u64) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        if n > self.left() as u64 {
            return Err(format!("{}: {n} varints run past its end", self.what));
        }
        let mut left = n;
        for (i, &b) in self.buf[self.pos..].iter().enumerate() {
            if b < 0x80 {
                left -= 1;
                if left == 0 {
                    self.pos += i + 1;
                    return Ok(());
                }
            }
        }
        Err(format!("{}: {n} varints run past its end", self.what))
    }

    /// A varint count of things taking at least `min_bytes` each, checked against the bytes
    /// left.
    pub(crate) fn count(&mut self, min_bytes: u64) -> Result<usize, String> {
        let n = self.varint()?;
        if n.saturating_mul(min_bytes) > self.left() as u64 {
            return Err(format!("{}: count {n} runs past its end", self.what));
        }
        Ok(n as usize)
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| format!("{}: {len} bytes run past its end", self.what))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn string(&mut self) -> Result<String, String> {
        let len = self.count(1)?;
        let bytes = self.take(len)?;
        let s = std::str::from_utf8(bytes)
            .map_err(|_| format!("{}: a string is not UTF-8", self.what))?;
        Ok(s.to_owned())
    }

    /// A bitmap of `bits` (at most 64) bits, with no bit set past them.
    pub(crate) fn bits(&mut self, bits: usize) -> Result<u64, String> {
        let b = self.take(bits.div_ceil(8))?;
        let mut a = [0u8; 8];
        a[..b.len()].copy_from_slice(b);
        let mask = u64::from_le_bytes(a);
        if bits < 64 && mask >> bits != 0 {
            return Err(format!(
                "{}: a bit set past the {bits} bits of a bitmap",
                self.what
            ));
        }
        Ok(mask)
    }

    /// A subtotal's buckets stored by position in its record's `k` totals buckets: a bitmap
    /// over them (nothing is stored when `k` is 1). A value without buckets is corrupt.
    pub(crate) fn position_mask(&mut self, k: usize) -> Result<u64, String> {
        let mask = match k {
            0 => return Err("subtotals by position in no totals".into()),
            1 => 1,
            _ => self.bits(k)?,
        };
        if mask == 0 {
            return Err("has no buckets".into());
        }
        Ok(mask)
    }

    /// Skips a series' indexes, returning how many there are.
    pub(crate) fn skip_series(&mut self, period: &Period) -> Result<u64, String> {
        if period.bitmap() {
            let bits = (period.end - u64::from(period.first)) as usize;
            return Ok(u64::from(self.bits(bits)?.count_ones()));
        }
        let n = self.count(1)? as u64;
        self.skip_varints(n)?;
        Ok(n)
    }

    /// A series' indexes, checked to lie in the period, each handed to `each` as it is
    /// read (no list is made).
    #[inline]
    pub(crate) fn series_each(
        &mut self,
        period: &Period,
        mut each: impl FnMut(u32) -> Result<(), String>,
    ) -> Result<(), String> {
        if period.bitmap() {
            let bits = (period.end - u64::from(period.first)) as usize;
            let mut mask = self.bits(bits)?;
            while mask != 0 {
                let b = mask.trailing_zeros();
                mask &= mask - 1;
                each(period.first + b)?;
            }
            return Ok(());
        }
        let n = self.count(1)?;
        let mut next = u64::from(period.first);
        for _ in 0..n {
            let i = next
                .checked_add(self.varint()?)
                .filter(|&i| i < period.end)
                .ok_or_else(|| format!("{}: bucket index outside the period", self.what))?;
            each(i as u32)?;
            next = i + 1;
        }
        Ok(())
    }

    /// A series' indexes, checked to lie in the period.
    pub(crate) fn series(&mut self, period: &Period) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        self.series_each(period, |i| {
            out.push(i);
            Ok(())
        })?;
        Ok(out)
    }

    /// One non-zero zigzag count per index.
    pub(crate) fn counts(&mut self, idx: &[u32]) -> Result<Buckets, String> {
        idx.iter()
            .map(|&i| match unzigzag(self.varint()?) {
                0 => Err(format!("{}: bucket {i} has a zero count", self.what)),
                n => Ok((i, n)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Period = Period { first: 10, end: 34 };

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
        let mut r = Cur::new(&out, "test");
        for v in [0, 127, 128, 300, u64::MAX] {
            assert_eq!(r.varint().unwrap(), v);
        }
        assert!(r.at_end());
        assert!(Cur::new(&[0xff; 11], "test").varint().is_err());
        let over = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(Cur::new(&over, "test").varint().is_err());
    }

    fn recs() -> Vec<KeyRecord> {
        vec![
            KeyRecord {
                totals: vec![(10, 5), (12, -1)],
                dims: vec![DimRecord {
                    dim: "country".into(),
                    values: vec![("DE".into(), vec![(10, 1)]), ("US".into(), vec![(10, 4)])],
                }],
            },
            // A subtotal outside the totals: this record's subtotals are stored by index.
            KeyRecord {
                totals: vec![(11, 1)],
                dims: vec![DimRecord {
                    dim: "country".into(),
                    values: vec![("US".into(), vec![(11, 1), (33, 2)])],
                }],
            },
        ]
    }

    /// The bound a writer measures large records by holds whatever the counts, the gaps and
    /// the period's encoding, and stays within 16 estimates (when it is worth working out).
    #[test]
    fn the_encoded_bound_bounds_a_record_and_its_estimate_bounds_it() {
        let wide = Period {
            first: 10,
            end: 10 + 100_000,
        };
        let mut records = recs();
        for (gap, n) in [(1u32, 1i64), (7, i64::MAX), (30_001, i64::MIN), (3, -300)] {
            let b: Buckets = (0..3u32).map(|i| (10 + i * gap, n)).collect();
            records.push(KeyRecord {
                totals: b.clone(),
                dims: vec![DimRecord {
                    dim: "d".into(),
                    values: (0..300).map(|v| (format!("v{v:03}"), b.clone())).collect(),
                }],
            });
        }
        for period in [DAY, wide] {
            for r in records
                .iter()
                .filter(|r| record_problem(r, period.first, period.end).is_none())
            {
                let actual = encode_block(
                    std::slice::from_ref(r),
                    &mut DictBuilder::default(),
                    &period,
                )
                .len();
                let bound = encoded_bound(r, &period);
                assert!(actual <= bound, "{actual} > {bound}: {r:?}");
                assert!(bound <= 16 * estimate(r, &period), "{bound}: {r:?}");
            }
        }
    }

    #[test]
    fn a_block_round_trips_in_both_period_encodings() {
        for period in [
            DAY,
            Period {
                first: 10,
                end: 1000,
            },
        ] {
            let mut dict = DictBuilder::default();
            let b = encode_block(&recs(), &mut dict, &period);
            let d = Dictionary::decode(&dict.encode()).unwrap();
            assert_eq!(d.strings(), 3);
            let block = Block::parse(b.clone(), 2, &period).unwrap();
            assert!(block.record(2, &d, &period).is_err());
            for (j, r) in recs().iter().enumerate() {
                assert_eq!(&block.record(j, &d, &period).unwrap(), r);
            }
            assert!(Block::parse(b.clone(), 3, &period).is_err());
            assert!(Block::parse(b, 1, &period).is_err());
        }
    }

    #[test]
    fn sums_agree_with_the_decoded_records_in_both_encodings() {
        // Two dimensions, so that skipping one is exercised too.
        let mut rs = recs();
        rs[0].dims.push(DimRecord {
            dim: "device".into(),
            values: vec![("mobile".into(), vec![(12, -1)])],
        });
        for period in [
            DAY,
            Period {
                first: 10,
                end: 1000,
            },
        ] {
            let mut dict = DictBuilder::default();
            let raw = encode_block(&rs, &mut dict, &period);
            let d = Dictionary::decode(&dict.encode()).unwrap();
            let block = Block::parse(raw.clone(), 2, &period).unwrap();
            for (lo, hi) in [(0, u32::MAX), (11, 13), (12, 34), (20, 30)] {
                let inside = |i: u32| lo <= i && i < hi;
                let mut want_sums = Vec::new();
                for (j, r) in rs.iter().enumerate() {
                    let sum = |b: &Buckets| -> i64 {
                        b.iter().filter(|(i, _)| inside(*i)).map(|(_, n)| n).sum()
                    };
                    want_sums.push(sum(&r.totals));
                    for only in ["country", "device"] {
                        let mut totals = Vec::new();
                        let mut subs = Vec::new();
                        block
                            .sums(
                                j,
                                &d,
                                &period,
                                &inside,
                                &|dim| dim == only,
                                &mut |i, n| totals.push((i, n)),
                                &mut |dim, v, n| {
                                    let (dim, v) = d.names(dim, v).unwrap();
                                    subs.push((dim.to_owned(), v.to_owned(), n));
                                },
                            )
                            .unwrap();
                        let expected: Buckets = r
                            .totals
                            .iter()
                            .copied()
                            .filter(|(i, _)| inside(*i))
                            .collect();
                        assert_eq!(totals, expected, "record {j} in {lo}..{hi}");
                        let expected: Vec<(String, String, i64)> = r
                            .dims
                            .iter()
                            .filter(|dr| dr.dim == only)
                            .flat_map(|dr| {
                                dr.values
                                    .iter()
                                    .map(|(v, b)| (dr.dim.clone(), v.clone(), sum(b)))
                            })
                            .filter(|s| s.2 != 0)
                            .collect();
                        assert_eq!(subs, expected, "record {j} in {lo}..{hi}, {only}");
                    }
                }
                assert_eq!(
                    total_sums(&raw, 2, &period, &inside).unwrap(),
                    want_sums,
                    "{lo}..{hi}"
                );
            }
            assert!(total_sums(&raw, 3, &period, &|_| true).is_err());
            assert!(total_sums(&raw, 1, &period, &|_| true).is_err());
        }
    }

    /// A footer may name a period of up to 2^32 buckets (found by the `segment_read` fuzz
    /// target: a resolution of 1 s over a month's seconds): summing a block asks about the
    /// buckets it holds, not about every bucket of the period.
    #[test]
    fn a_huge_period_costs_what_its_buckets_do() {
        let period = Period {
            first: 10,
            end: u64::from(u32::MAX),
        };
        let mut dict = DictBuilder::default();
        let raw = encode_block(&recs(), &mut dict, &period);
        let asked = std::cell::Cell::new(0u64);
        let inside = |_: u32| {
            asked.set(asked.get() + 1);
            true
        };
        let sums = total_sums(&raw, 2, &period, &inside).unwrap();
        let want: Vec<i64> = recs()
            .iter()
            .map(|r| r.totals.iter().map(|(_, n)| n).sum())
            .collect();
        assert_eq!(sums, want);
        let buckets: usize = recs().iter().map(|r| r.totals.len()).sum();
        assert_eq!(asked.get(), buckets as u64);
    }

    #[test]
    fn the_streams_are_as_documented() {
        let mut dict = DictBuilder::default();
        let b = encode_block(&recs(), &mut dict, &DAY);
        // The dictionary: dimension "country" with "DE" then "US", in the order first met.
        assert_eq!(dict.encode(), b"\x01\x07country\x02\x02DE\x02US");
        let want: [&[u8]; STREAMS] = [
            // one dimension, by position | id 0, 2 values | one dimension, by index | id 0, 1
            &[0b11, 0, 2, 0b10, 0, 1],
            // hours 0 and 2 | hour 1, over 24 bits
            &[0b101, 0, 0, 0b10, 0, 0],
            // 5, -1 | 1
            &[10, 1, 2],
            // DE, US | US
            &[0, 1, 1],
            // DE and US at the first of the 2 totals | US at hours 1 and 23
            &[0b01, 0b01, 0b10, 0, 0x80],
            // 1 | 4 | 1, 2
            &[2, 8, 2, 4],
        ];
        let mut expect = Vec::new();
        for s in &want[..STREAMS - 1] {
            put_varint(&mut expect, s.len() as u64);
        }
        expect.extend(want.concat());
        assert_eq!(b, expect);
    }

    #[test]
    fn damaged_payloads_are_errors() {
        let mut dict = DictBuilder::default();
        let b = encode_block(&recs(), &mut dict, &DAY);
        let d = Dictionary::decode(&dict.encode()).unwrap();
        for at in 0..b.len() {
            for bit in 0..8 {
                let mut bad = b.clone();
                bad[at] ^= 1 << bit;
                if let Ok(block) = Block::parse(bad, 2, &DAY) {
                    for j in 0..2 {
                        let _ = block.record(j, &d, &DAY);
                    }
                }
            }
        }
        // Read for a period that ends earlier, the same bytes are refused, not misread.
        let short = Period { first: 10, end: 12 };
        assert!(Block::parse(b, 2, &short).is_err());
    }
}

//! [`Segment`]: an open segment file. Opening reads and checks the footer and the key index
//! and keeps them in memory; blocks are read on demand with positional reads (no seek, no
//! shared cursor), so one `Segment` behind an `Arc` serves any number of threads. No mmap
//! in v1 (the workspace denies `unsafe`; a mapped file that shrinks is undefined behaviour): the index is in memory, blocks come from the page
//! cache, through a descriptor [`super::files`] may close and open again.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use fst::{IntoStreamer, Streamer};

use super::codec::{Block, Dictionary, Period, total_sums};
use super::dicts;
use super::files::Handle;
use super::layout::{
    BLOCK_ENTRY_LEN, BlockEntry, CODEC_NONE, CODEC_ZSTD, DICT_HEADER_LEN, FOOTER_CRC_OFFSET,
    FOOTER_LEN, FOOTER_MAGIC_OFFSET, Footer, HEADER_LEN, MAX_BLOCK_RAW_LEN, MAX_DICT_RAW_LEN,
    MAX_SPANS, MagicProblem, SUMS_HEADER_LEN, SumsHeader, Version, hour_buckets, u32_at,
};
use super::sums::{Rollup, decode_keys, decode_rollups, decode_span};
use super::{Buckets, KeyRecord, SegmentError, SegmentMeta, SegmentStats, index_key};
use crate::names::{NameIds, Names};

/// Where a block is and what it holds, as the block table says.
pub type BlockHandle = BlockEntry;

/// An open, immutable segment file.
#[derive(Debug)]
pub struct Segment {
    path: PathBuf,
    /// The file, open while recently read (at most `files::max_open` at once, process-wide).
    file: Arc<Handle>,
    len: u64,
    meta: SegmentMeta,
    period: Period,
    codec: u8,
    /// The dictionary: held in its slot while [`dicts`] (bounded per process) allows, read
    /// from the file again (`dict_at`, checked against `dict_crc`) when it was dropped.
    dict_slot: dicts::Slot,
    dict_at: (u64, usize),
    dict_crc: u32,
    dict_strings: usize,
    keys: u64,
    data_points: u64,
    /// Index key (namespace, 0, key) → block number << 32 | position in the block.
    index: fst::Map<Vec<u8>>,
    blocks: Vec<BlockEntry>,
    /// The rank (position in key order) of each block's first record.
    first_rank: Vec<u64>,
    version: Version,
    /// Version 2: buckets per span (0 in version 1, which has no span sums), the span
    /// frames and the key frames (one per block).
    span_buckets: u64,
    spans: Vec<BlockEntry>,
    key_frames: Vec<BlockEntry>,
    /// Version 2 with rollups: one rollup frame per block (empty when none of its records
    /// has a rollup); none in files written before rollups.
    rollups: Vec<BlockEntry>,
    /// Version 2 with hour frames: buckets per hour frame (0 without), and one frame per
    /// hour of each span, in time order.
    hour_buckets: u64,
    hours: Vec<BlockEntry>,
    /// The blocks `get` decoded last.
    cache: Mutex<Recent<usize, Arc<Block>>>,
    /// The dictionary's ids mapped to the engine's `Names` (made by the first read that
    /// sums by id).
    name_ids: Mutex<Option<Arc<NameIds>>>,
    /// Records read from their rollups lately (see [`Segment::summed`]).
    summed: Mutex<Recent<SummedAt, Option<Arc<Summed>>>>,
}

/// A frame of totals summed per key by rank (see [`Segment::cover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumFrame {
    /// A span's frame, by span number.
    Span(usize),
    /// An hour's frame, by hour of the period (span × hours per span + hour of the span).
    Hour(usize),
}

/// The totals over a range as frames: the sums of `add` minus those of `sub`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cover {
    pub add: Vec<SumFrame>,
    pub sub: Vec<SumFrame>,
}

impl Cover {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.sub.is_empty()
    }
}

/// What a read's `inside` takes of a segment's period, when it takes exactly that: a record
/// summed over it can be kept and reused (see [`Segment::sums`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exact {
    /// Whole spans `[a, b)` (see [`Segment::spans_within`]): summed from the record's
    /// rollup.
    Spans(usize, usize),
    /// The bucket indexes `[lo, hi)`, within the period: summed bucket by bucket once.
    Buckets(u32, u32),
}

/// A record's subtotal series summed over some whole spans from its rollup, or over a
/// range of buckets, each with its dictionary ids (in the record's order from a rollup;
/// only non-zero sums from buckets).
#[derive(Debug)]
struct Summed {
    series: Vec<(u32, u32)>,
    sums: Vec<i64>,
}

impl Summed {
    fn bytes(&self) -> usize {
        64 + self.series.len() * 16
    }
}

/// What one open segment keeps of [`Summed`] records, in bytes: a busy key's (thousands of
/// values) takes tens of KiB; a record past this is not kept.
pub const SUMMED_CACHE_BYTES: usize = 256 << 10;

/// How many records one open segment keeps, with or without a rollup (found by a walk).
pub const SUMMED_CACHE_RECORDS: usize = 32;

/// (block, record, what it is summed over).
type SummedAt = (usize, usize, Exact);

/// What [`Recent`] counts for a record found to have no rollup, or too heavy to keep summed
/// over a range of buckets.
const NO_ROLLUP_BYTES: usize = 64;

/// How many decoded blocks one open segment keeps for `get`.
pub const CACHED_BLOCKS: usize = 8;
/// The most bytes of decoded blocks one open segment keeps: blocks are ~16 KiB, but one
/// key's record alone may make a block of gigabytes, which is decoded for each read.
const CACHED_BLOCK_BYTES: usize = 64 << 20;

/// The values a segment made lately (decoded blocks, summed records), by key: at most
/// `max_entries` of them weighing at most `max_bytes` in all, least recently used out
/// first; a value heavier than the budget alone is not kept.
struct Recent<K, V> {
    /// (key, value, its weight, when last used)
    entries: Vec<(K, V, usize, u64)>,
    bytes: usize,
    clock: u64,
    max_entries: usize,
    max_bytes: usize,
}

impl<K: PartialEq + Copy, V: Clone> Recent<K, V> {
    fn new(max_entries: usize, max_bytes: usize) -> Self {
        Recent {
            entries: Vec::new(),
            bytes: 0,
            clock: 0,
            max_entries,
            max_bytes,
        }
    }

    fn get(&mut self, k: K) -> Option<V> {
        self.clock += 1;
        let now = self.clock;
        let e = self.entries.iter_mut().find(|e| e.0 == k)?;
        e.3 = now;
        Some(e.1.clone())
    }

    fn put(&mut self, k: K, v: V, weight: usize) {
        if weight > self.max_bytes || self.entries.iter().any(|e| e.0 == k) {
            return;
        }
        while self.bytes + weight > self.max_bytes || self.entries.len() >= self.max_entries {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].3) else {
                break;
            };
            let (_, _, gone, _) = self.entries.swap_remove(oldest);
            self.bytes -= gone;
        }
        self.clock += 1;
        self.bytes += weight;
        self.entries.push((k, v, weight, self.clock));
    }
}

impl<K: std::fmt::Debug, V> std::fmt::Debug for Recent<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recent")
            .field(
                "keys",
                &self.entries.iter().map(|e| &e.0).collect::<Vec<_>>(),
            )
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Segment {
    /// Opens `path`, checking its magic, its footer and its key index (their checksums and
    /// their structure). Blocks are checked when read, or all at once by [`Segment::verify`].
    pub fn open(path: &Path) -> Result<Segment, SegmentError> {
        let file = File::open(path).map_err(|e| SegmentError::io(path, e))?;
        let len = file
            .metadata()
            .map_err(|e| SegmentError::io(path, e))?
            .len();
        let corrupt = |why: String| SegmentError::corrupt(path, why);
        if len < HEADER_LEN as u64 {
            return Err(corrupt(format!("file of {len} bytes is too short")));
        }
        let mut magic = [0u8; HEADER_LEN];
        read_exact_at(&file, path, &mut magic, 0)?;
        let version = check_magic(path, magic)?;
        if len < (HEADER_LEN + FOOTER_LEN) as u64 {
            return Err(corrupt(format!(
                "file of {len} bytes is too short for a footer (truncated or unfinished)"
            )));
        }
        let mut f = [0u8; FOOTER_LEN];
        read_exact_at(&file, path, &mut f, len - FOOTER_LEN as u64)?;
        let mut tail = [0u8; 4];
        tail.copy_from_slice(&f[FOOTER_MAGIC_OFFSET..]);
        if tail != version.magic() {
            return Err(corrupt(
                "no footer at the end of the file (truncated or unfinished)".into(),
            ));
        }
        let expected = u32_at(&f, FOOTER_CRC_OFFSET);
        let got = crc32c::crc32c(&f[..FOOTER_CRC_OFFSET]);
        if expected != got {
            return Err(SegmentError::Checksum {
                path: path.to_path_buf(),
                block: None,
                expected,
                got,
            });
        }
        let footer = Footer::decode(&f, version).map_err(&corrupt)?;

        let index_len = u64::from(footer.blocks)
            .checked_mul(BLOCK_ENTRY_LEN as u64)
            .and_then(|t| t.checked_add(u64::from(footer.fst_len)))
            .and_then(|t| t.checked_add(u64::from(footer.dict_len)));
        let fits = index_len
            .and_then(|l| l.checked_add(footer.index_offset))
            .is_some_and(|end| match version {
                Version::V1 => end == len - FOOTER_LEN as u64,
                Version::V2 => {
                    end.saturating_add(SUMS_HEADER_LEN as u64) <= len - FOOTER_LEN as u64
                }
            });
        if !fits
            || footer.index_offset < HEADER_LEN as u64
            || (footer.dict_len as usize) < DICT_HEADER_LEN
        {
            return Err(corrupt(format!(
                "index at {} ({} bytes of dictionary, {} of key index, {} blocks) does not end \
                 at the footer",
                footer.index_offset, footer.dict_len, footer.fst_len, footer.blocks
            )));
        }
        // Fits in the file, so the file's real length bounds this allocation.
        let index_len = (len - FOOTER_LEN as u64 - footer.index_offset) as usize;
        let mut index = vec![0u8; index_len];
        read_exact_at(&file, path, &mut index, footer.index_offset)?;
        let got = crc32c::crc32c(&index);
        if got != footer.index_crc {
            return Err(SegmentError::Checksum {
                path: path.to_path_buf(),
                block: None,
                expected: footer.index_crc,
                got,
            });
        }
        let fst_and_table = index.split_off(footer.dict_len as usize);
        let dict_crc = crc32c::crc32c(&index);
        let dict = Arc::new(decode_dictionary(&index, footer.codec).map_err(&corrupt)?);
        drop(index);
        let mut index = fst_and_table;
        let mut table = index.split_off(footer.fst_len as usize);
        let sums = table.split_off(footer.blocks as usize * BLOCK_ENTRY_LEN);
        let entries = |table: &[u8]| -> Vec<BlockEntry> {
            table
                .chunks_exact(BLOCK_ENTRY_LEN)
                .map(|c| {
                    let mut e = [0u8; BLOCK_ENTRY_LEN];
                    e.copy_from_slice(c);
                    BlockEntry::decode(&e)
                })
                .collect()
        };
        let blocks = entries(&table);
        let (head, span_buckets, spans, key_frames, rollups, hour_buckets, hours) = match version {
            Version::V1 => (None, 0, Vec::new(), Vec::new(), Vec::new(), 0, Vec::new()),
            Version::V2 => {
                let (h, rest) = sums.split_at(SUMS_HEADER_LEN);
                let head = SumsHeader::decode(h).map_err(&corrupt)?;
                let period = footer.meta.end_bucket() - u64::from(footer.meta.first_bucket());
                if head.spans == 0
                    || head.spans > MAX_SPANS
                    || head.span_buckets.checked_mul(u64::from(head.spans)) != Some(period)
                {
                    return Err(corrupt(format!(
                        "{} spans of {} buckets do not tile the period's {period} buckets",
                        head.spans, head.span_buckets
                    )));
                }
                let per_block = if head.rollups { 2 } else { 1 };
                let hour_buckets = match head.hours {
                    false => 0,
                    true => match hour_buckets(footer.meta.resolution, head.span_buckets) {
                        0 => {
                            return Err(corrupt(format!(
                                "hour frames for spans of {} buckets of {} s",
                                head.span_buckets, footer.meta.resolution
                            )));
                        }
                        per => per,
                    },
                };
                let hours = (head.span_buckets / hour_buckets.max(1)) as usize
                    * head.spans as usize
                    * usize::from(head.hours);
                let want =
                    (head.spans as usize + per_block * blocks.len() + hours) * BLOCK_ENTRY_LEN;
                if rest.len() != want {
                    return Err(corrupt(format!(
                        "the sums tables take {} bytes, {} spans, {} blocks and {hours} hours \
                         take {want}",
                        rest.len(),
                        head.spans,
                        blocks.len()
                    )));
                }
                let (s, rest) = rest.split_at(head.spans as usize * BLOCK_ENTRY_LEN);
                let (k, rest) = rest.split_at(blocks.len() * BLOCK_ENTRY_LEN);
                let (r, h) = rest.split_at(rest.len() - hours * BLOCK_ENTRY_LEN);
                (
                    Some(head),
                    head.span_buckets,
                    entries(s),
                    entries(k),
                    entries(r),
                    hour_buckets,
                    entries(h),
                )
            }
        };
        let ok = |b: &BlockEntry| {
            b.raw_len as usize <= MAX_BLOCK_RAW_LEN
                && (footer.codec != CODEC_NONE || b.stored_len == b.raw_len)
        };
        let mut at = HEADER_LEN as u64;
        let mut keys = 0u64;
        let mut first_rank = Vec::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate() {
            if b.offset != at || !ok(b) || b.keys == 0 {
                return Err(corrupt(format!("block table entry {i} is inconsistent")));
            }
            first_rank.push(keys);
            at += u64::from(b.stored_len);
            keys += u64::from(b.keys);
        }
        if at != head.map_or(footer.index_offset, |h| h.frames_offset) || keys != footer.keys {
            return Err(corrupt(
                "the block table does not cover the blocks or the keys".into(),
            ));
        }
        for (i, s) in spans.iter().enumerate() {
            if s.offset != at || !ok(s) || u64::from(s.keys) > footer.keys {
                return Err(corrupt(format!("span table entry {i} is inconsistent")));
            }
            at += u64::from(s.stored_len);
        }
        for (i, (k, b)) in key_frames.iter().zip(&blocks).enumerate() {
            if k.offset != at || !ok(k) || k.keys != b.keys {
                return Err(corrupt(format!(
                    "key frame table entry {i} is inconsistent"
                )));
            }
            at += u64::from(k.stored_len);
        }
        for (i, (r, b)) in rollups.iter().zip(&blocks).enumerate() {
            let empty = r.keys == 0 && r.stored_len == 0 && r.raw_len == 0;
            if r.offset != at || !ok(r) || r.keys > b.keys || (r.keys == 0 && !empty) {
                return Err(corrupt(format!(
                    "rollup frame table entry {i} is inconsistent"
                )));
            }
            at += u64::from(r.stored_len);
        }
        for (i, h) in hours.iter().enumerate() {
            if h.offset != at || !ok(h) || u64::from(h.keys) > footer.keys {
                return Err(corrupt(format!("hour table entry {i} is inconsistent")));
            }
            at += u64::from(h.stored_len);
        }
        if at != footer.index_offset {
            return Err(corrupt(
                "the span, key, rollup and hour frames do not end where the index starts".into(),
            ));
        }
        let index = fst::Map::new(index).map_err(|e| corrupt(format!("key index: {e}")))?;
        // fst's own checksum, beside the index section's: `fst` walks its bytes trusting
        // their structure, and may panic on a map that passed the section's CRC but was
        // never written by `fst` (a crafted file, or a bug of ours).
        index
            .as_fst()
            .verify()
            .map_err(|e| corrupt(format!("key index: {e}")))?;
        if index.len() as u64 != footer.keys {
            return Err(corrupt(format!(
                "key index holds {} keys, the footer says {}",
                index.len(),
                footer.keys
            )));
        }
        Ok(Segment {
            path: path.to_path_buf(),
            file: Handle::new(path, file),
            len,
            period: Period {
                first: footer.meta.first_bucket(),
                end: footer.meta.end_bucket(),
            },
            meta: footer.meta,
            codec: footer.codec,
            dict_slot: dicts::Slot::new(&dict),
            dict_at: (footer.index_offset, footer.dict_len as usize),
            dict_crc,
            dict_strings: dict.strings(),
            keys: footer.keys,
            data_points: footer.data_points,
            index,
            blocks,
            first_rank,
            version,
            span_buckets,
            spans,
            key_frames,
            rollups,
            hour_buckets,
            hours,
            cache: Mutex::new(Recent::new(CACHED_BLOCKS, CACHED_BLOCK_BYTES)),
            name_ids: Mutex::default(),
            summed: Mutex::new(Recent::new(SUMMED_CACHE_RECORDS, SUMMED_CACHE_BYTES)),
        })
    }

    /// The format version the file is written in.
    pub fn version(&self) -> Version {
        self.version
    }

    pub fn meta(&self) -> &SegmentMeta {
        &self.meta
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the footer says the segment holds (checked by [`Segment::verify`]).
    pub fn stats(&self) -> SegmentStats {
        SegmentStats {
            keys: self.keys,
            data_points: self.data_points,
            bytes: self.len,
        }
    }

    /// The block table.
    pub fn blocks(&self) -> &[BlockHandle] {
        &self.blocks
    }

    /// Bytes of the key index (the fst map) held in memory.
    pub fn index_bytes(&self) -> usize {
        self.index.as_fst().as_bytes().len()
    }

    /// Removes the file once this segment is dropped by its last holder: how compaction
    /// removes a segment a reader may still be reading.
    pub fn remove_when_dropped(&self) {
        self.file.remove_when_dropped();
    }

    /// Block `block`'s uncompressed payload, after its checksum was checked.
    pub fn block_payload(&self, block: usize) -> Result<Vec<u8>, SegmentError> {
        let Some(b) = self.blocks.get(block) else {
            return Err(self.corrupt(format!("no block {block}")));
        };
        self.frame(b, Frame::Block(block))
    }

    /// A frame's stored bytes read, checked against their CRC32C and decompressed.
    fn frame(&self, b: &BlockEntry, what: Frame) -> Result<Vec<u8>, SegmentError> {
        let mut stored = vec![0u8; b.stored_len as usize];
        let file = self
            .file
            .file()
            .map_err(|e| SegmentError::io(&self.path, e))?;
        read_exact_at(&file, &self.path, &mut stored, b.offset)?;
        let got = crc32c::crc32c(&stored);
        if got != b.crc {
            return Err(match what {
                Frame::Block(n) => SegmentError::Checksum {
                    path: self.path.clone(),
                    block: Some(n as u64),
                    expected: b.crc,
                    got,
                },
                _ => SegmentError::FrameChecksum {
                    path: self.path.clone(),
                    frame: what.to_string(),
                    expected: b.crc,
                    got,
                },
            });
        }
        let raw = match self.codec {
            CODEC_ZSTD => decompress(&stored, b.raw_len as usize)
                .map_err(|e| self.corrupt(format!("{what}: zstd: {e}")))?,
            _ => stored,
        };
        if raw.len() != b.raw_len as usize {
            return Err(self.corrupt(format!(
                "{what} holds {} bytes, its table entry says {}",
                raw.len(),
                b.raw_len
            )));
        }
        Ok(raw)
    }

    fn block(&self, block: usize) -> Result<Block, SegmentError> {
        let raw = self.block_payload(block)?;
        let records = self.blocks.get(block).map_or(0, |b| b.keys);
        Block::parse(raw, records, &self.period)
            .map_err(|why| self.corrupt(format!("block {block}: {why}")))
    }

    /// Dimension names and values in the segment's dictionary.
    pub fn dictionary_strings(&self) -> usize {
        self.dict_strings
    }

    /// The segment's dictionary: held in [`dicts`], or read from the file again, checked
    /// against the CRC32C taken at open, and decoded (see that module).
    fn dict(&self) -> Result<Arc<Dictionary>, SegmentError> {
        if let Some(d) = self.dict_slot.get() {
            return Ok(d);
        }
        let (at, len) = self.dict_at;
        let mut stored = vec![0u8; len];
        let file = self
            .file
            .file()
            .map_err(|e| SegmentError::io(&self.path, e))?;
        read_exact_at(&file, &self.path, &mut stored, at)?;
        let got = crc32c::crc32c(&stored);
        if got != self.dict_crc {
            return Err(SegmentError::Checksum {
                path: self.path.clone(),
                block: None,
                expected: self.dict_crc,
                got,
            });
        }
        let dict = Arc::new(
            decode_dictionary(&stored, self.codec)
                .map_err(|why| self.corrupt(format!("dictionary: {why}")))?,
        );
        self.dict_slot.hold(&dict, true);
        Ok(dict)
    }

    fn corrupt(&self, why: String) -> SegmentError {
        SegmentError::corrupt(&self.path, why)
    }

    /// The record of `key` in namespace `ns`, or `None` if the segment has none.
    pub fn get(&self, ns: &str, key: &str) -> Result<Option<KeyRecord>, SegmentError> {
        let Some(v) = self.index.get(index_key(ns, key)) else {
            return Ok(None);
        };
        let (block, ord) = self.locate(v)?;
        self.cached_block(block)?
            .record(ord, &*self.dict()?, &self.period)
            .map(Some)
            .map_err(|why| self.corrupt(format!("block {block}: {why}")))
    }

    /// A key's record summed (see `Block::sums`): totals bucket by bucket to `total`, one
    /// sum per subtotal series of the dimensions `dim_ok` accepts to `sub`, both over the
    /// buckets `inside` accepts. False if the segment does not have the key.
    ///
    /// `exact`, when `inside` accepts exactly what it says of this segment's period: whole
    /// spans (see [`Segment::spans_within`]) — if the key's record has a rollup, each
    /// subtotal series is summed from it, a sum per span, and no subtotal bucket is decoded
    /// — or a range of buckets, summed bucket by bucket once and then reused. Either is
    /// kept while the segment's budget allows.
    pub fn sums(
        &self,
        nskey: (&str, &str),
        exact: Option<Exact>,
        inside: &dyn Fn(u32) -> bool,
        dim_ok: &dyn Fn(&str) -> bool,
        total: &mut dyn FnMut(u32, i64),
        sub: &mut dyn FnMut(&str, &str, i64),
    ) -> Result<bool, SegmentError> {
        let dict = self.dict()?;
        let mut named = |d: u32, v: u32, n: i64| {
            if let Some((d, v)) = dict.names(d, v) {
                sub(d, v, n);
            }
        };
        self.sums_by_id(nskey, exact, inside, dim_ok, total, &mut named)
    }

    /// Whether the segment has a record of `key` in namespace `ns` (one index lookup).
    pub fn has(&self, ns: &str, key: &str) -> bool {
        self.index.get(index_key(ns, key)).is_some()
    }

    /// The dictionary's ids mapped to `names`, made once per `Names` and kept.
    pub fn name_ids(&self, names: &Names) -> Result<Arc<NameIds>, SegmentError> {
        let mut cached = self.name_ids.lock().unwrap_or_else(PoisonError::into_inner);
        match &*cached {
            Some(m) if m.names == names.id() => Ok(Arc::clone(m)),
            _ => {
                let m = Arc::new(NameIds::new(names, self.dict()?.dims()));
                *cached = Some(Arc::clone(&m));
                Ok(m)
            }
        }
    }

    /// [`Segment::sums`] with each subtotal series given to `sub` as (dimension id, value
    /// id) in the segment's dictionary (checked; see [`Segment::name_ids`]) rather than
    /// by name.
    pub fn sums_by_id(
        &self,
        (ns, key): (&str, &str),
        exact: Option<Exact>,
        inside: &dyn Fn(u32) -> bool,
        dim_ok: &dyn Fn(&str) -> bool,
        total: &mut dyn FnMut(u32, i64),
        sub: &mut dyn FnMut(u32, u32, i64),
    ) -> Result<bool, SegmentError> {
        let Some(v) = self.index.get(index_key(ns, key)) else {
            return Ok(false);
        };
        let (block, ord) = self.locate(v)?;
        let dict = self.dict()?;
        let summed = match exact {
            Some(Exact::Spans(a, b)) => self.summed(block, ord, a..b)?,
            Some(Exact::Buckets(lo, hi)) => self.summed_buckets(block, ord, (lo, hi))?,
            None => None,
        };
        let Some(summed) = summed else {
            self.cached_block(block)?
                .sums(ord, &dict, &self.period, inside, dim_ok, total, sub)
                .map_err(|why| self.corrupt(format!("block {block}: {why}")))?;
            return Ok(true);
        };
        let b = self.cached_block(block)?;
        let bad = |why: String| self.corrupt(format!("block {block}: {why}"));
        for (i, n) in b.totals(ord, &self.period).map_err(bad)? {
            if inside(i) {
                total(i, n);
            }
        }
        // Whether each dimension is wanted, asked once per dimension, not per series.
        let mut wanted: Vec<(u32, bool)> = Vec::new();
        for (si, &(d, v)) in summed.series.iter().enumerate() {
            let ok = match wanted.iter().find(|w| w.0 == d) {
                Some(w) => w.1,
                None => {
                    let ok = dict.names(d, v).is_some_and(|(dim, _)| dim_ok(dim));
                    wanted.push((d, ok));
                    ok
                }
            };
            if ok {
                match summed.sums.get(si).copied().unwrap_or(0) {
                    0 => {}
                    n => sub(d, v, n),
                }
            }
        }
        Ok(true)
    }

    /// Record `ord` of `block`'s subtotal series summed over `spans` from its rollup, with
    /// their dictionary ids, if it has a rollup: decoded (and checked against the record)
    /// once, then kept while the segment's budget allows — a dashboard asks for the same
    /// busy keys over the same days again, and a segment the range covers whole is always
    /// asked for all its spans.
    fn summed(
        &self,
        block: usize,
        ord: usize,
        spans: std::ops::Range<usize>,
    ) -> Result<Option<Arc<Summed>>, SegmentError> {
        let at = (block, ord, Exact::Spans(spans.start, spans.end));
        let lock = || self.summed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = lock().get(at) {
            return Ok(hit);
        }
        let Some(rollup) = self.rollup(block, ord)? else {
            lock().put(at, None, NO_ROLLUP_BYTES);
            return Ok(None);
        };
        let b = self.cached_block(block)?;
        let mut series = Vec::with_capacity(rollup.series as usize);
        let n = b
            .series_ids(ord, &*self.dict()?, &mut |_, _, d, v| series.push((d, v)))
            .map_err(|why| self.corrupt(format!("block {block}: {why}")))?;
        if n != rollup.series as usize {
            return Err(self.corrupt(format!(
                "rollup frame {block}: {} series where record {ord} has {n}",
                rollup.series
            )));
        }
        let sums = (0..n).map(|si| rollup.sum(si, &spans)).collect();
        let summed = Arc::new(Summed { series, sums });
        let weight = summed.bytes();
        lock().put(at, Some(Arc::clone(&summed)), weight);
        Ok(Some(summed))
    }

    /// Record `ord` of `block`'s subtotal series summed over buckets `[lo, hi)`, bucket by
    /// bucket, every dimension (so that any later read of the range can use it): made once,
    /// then kept while the segment's budget allows — a dashboard in a zone other than UTC
    /// asks for the same days, cut at the same hours, again. `None` for a record found too
    /// heavy to keep: the caller then sums only what it wants, every time.
    fn summed_buckets(
        &self,
        block: usize,
        ord: usize,
        (lo, hi): (u32, u32),
    ) -> Result<Option<Arc<Summed>>, SegmentError> {
        let at = (block, ord, Exact::Buckets(lo, hi));
        let lock = || self.summed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = lock().get(at) {
            return Ok(hit);
        }
        let (mut series, mut sums) = (Vec::new(), Vec::new());
        self.cached_block(block)?
            .sums(
                ord,
                &*self.dict()?,
                &self.period,
                &|i| lo <= i && i < hi,
                &|_| true,
                &mut |_, _| {},
                &mut |d, v, n| {
                    series.push((d, v));
                    sums.push(n);
                },
            )
            .map_err(|why| self.corrupt(format!("block {block}: {why}")))?;
        series.shrink_to_fit();
        sums.shrink_to_fit();
        let summed = Arc::new(Summed { series, sums });
        let weight = summed.bytes();
        if weight > SUMMED_CACHE_BYTES {
            // Past the budget alone: remembered as too heavy, so that later reads sum only
            // the dimensions they want rather than all of them for nothing.
            lock().put(at, None, NO_ROLLUP_BYTES);
        } else {
            lock().put(at, Some(Arc::clone(&summed)), weight);
        }
        Ok(Some(summed))
    }

    /// The rollup of record `ord` of `block`, if it has one.
    fn rollup(&self, block: usize, ord: usize) -> Result<Option<Rollup>, SegmentError> {
        let (Some(e), Some(b)) = (self.rollups.get(block), self.blocks.get(block)) else {
            return Ok(None);
        };
        if e.keys == 0 {
            return Ok(None);
        }
        let what = Frame::Rollups(block);
        let raw = self.frame(e, what)?;
        let spans = self.spans.len() as u32;
        let mut found = decode_rollups(&raw, e.keys, (b.keys, spans), Some(ord as u32))
            .map_err(|why| self.corrupt(format!("{what}: {why}")))?;
        Ok(found.pop().filter(|r| r.ord as usize == ord))
    }

    /// A key's totals alone (its subtotals are not decoded); `None` if the key is absent.
    pub fn get_totals(&self, ns: &str, key: &str) -> Result<Option<Buckets>, SegmentError> {
        let Some(v) = self.index.get(index_key(ns, key)) else {
            return Ok(None);
        };
        let (block, ord) = self.locate(v)?;
        self.cached_block(block)?
            .totals(ord, &self.period)
            .map(Some)
            .map_err(|why| self.corrupt(format!("block {block}: {why}")))
    }

    /// Every key of `ns` with its totals alone, in key order.
    pub fn scan_totals(
        &self,
        ns: &str,
        visit: &mut dyn FnMut(&str, &Buckets) -> Result<(), SegmentError>,
    ) -> Result<(), SegmentError> {
        self.scan_ns(ns, &mut |seg, cursor, key, v| {
            let totals = cursor.totals(seg, v)?;
            visit(key, &totals)
        })
    }

    /// Every key of `ns` in key order with the sum of its totals over the buckets `inside`
    /// accepts, zero included (so that a caller can check its deadline on every key). Each
    /// block is read once and only its shape and totals streams are walked (see
    /// `codec::total_sums`): what a top of keys needs.
    pub fn scan_total_sums(
        &self,
        ns: &str,
        inside: &dyn Fn(u32) -> bool,
        visit: &mut dyn FnMut(&str, i64) -> Result<(), SegmentError>,
    ) -> Result<(), SegmentError> {
        let mut at: Option<(usize, Vec<i64>)> = None;
        self.scan_ns(ns, &mut |seg, _, key, v| {
            let (block, ord) = seg.locate(v)?;
            let sums = match &at {
                Some((b, sums)) if *b == block => sums,
                _ => {
                    let raw = seg.block_payload(block)?;
                    let records = seg.blocks.get(block).map_or(0, |b| b.keys);
                    let sums = total_sums(&raw, records, &seg.period, inside)
                        .map_err(|why| seg.corrupt(format!("block {block}: {why}")))?;
                    &at.insert((block, sums)).1
                }
            };
            match sums.get(ord) {
                Some(&n) => visit(key, n),
                None => Err(seg.corrupt(format!("block {block} has no record {ord}"))),
            }
        })
    }

    /// The spans (version 2) that bucket indexes `[lo, hi)` cover exactly, once clipped to
    /// the period: `Some(empty)` when they miss it, `None` when a span would be cut (or the
    /// segment has no span sums). A caller then sums whole spans from their frames.
    pub fn spans_within(&self, lo: u32, hi: u32) -> Option<std::ops::Range<usize>> {
        if self.span_buckets == 0 {
            return None;
        }
        let first = u64::from(self.period.first);
        let lo = u64::from(lo).clamp(first, self.period.end);
        let hi = u64::from(hi).clamp(lo, self.period.end);
        let (a, b) = (lo - first, hi - first);
        if a % self.span_buckets != 0 || b % self.span_buckets != 0 {
            return None;
        }
        Some((a / self.span_buckets) as usize..(b / self.span_buckets) as usize)
    }

    /// The ranks (positions in key order) of the keys of `ns`: `[first, end)`.
    pub fn rank_range(&self, ns: &str) -> Result<std::ops::Range<u64>, SegmentError> {
        let mut lo = ns.as_bytes().to_vec();
        lo.push(0);
        let mut hi = ns.as_bytes().to_vec();
        hi.push(1);
        let first = |from: &[u8]| -> Result<u64, SegmentError> {
            match self.index.range().ge(from).into_stream().next() {
                Some((_, v)) => self.rank(v),
                None => Ok(self.keys),
            }
        };
        let (a, b) = (first(&lo)?, first(&hi)?);
        Ok(a..b.max(a))
    }

    /// The rank of the record the index value `v` points at.
    fn rank(&self, v: u64) -> Result<u64, SegmentError> {
        let (block, ord) = self.locate(v)?;
        Ok(self.first_rank[block] + ord as u64)
    }

    /// The rank of `key` of `ns`, if the segment has it.
    pub fn rank_of(&self, ns: &str, key: &str) -> Result<Option<u64>, SegmentError> {
        match self.index.get(index_key(ns, key)) {
            Some(v) => self.rank(v).map(Some),
            None => Ok(None),
        }
    }

    /// Span `span`'s (rank, totals sum) entries with a rank in `ranks`, in rank order: keys
    /// whose totals sum to 0 over the span are not there.
    pub fn span_sums(
        &self,
        span: usize,
        ranks: std::ops::Range<u64>,
        visit: &mut impl FnMut(u64, i64),
    ) -> Result<(), SegmentError> {
        self.frame_sums(SumFrame::Span(span), ranks, visit)
    }

    /// The frames whose sums give every key's totals over bucket indexes `[lo, hi)`, once
    /// clipped to the period: whole spans from span frames, the hours of a span cut by the
    /// range from hour frames (or, when that is fewer entries to decode, the span minus the
    /// hours left out).
    /// `None` when the range cuts an hour, or a span of a segment without hour frames (or
    /// the segment has no span sums).
    pub fn cover(&self, lo: u32, hi: u32) -> Option<Cover> {
        let sb = self.span_buckets;
        if sb == 0 {
            return None;
        }
        let first = u64::from(self.period.first);
        let lo = u64::from(lo).clamp(first, self.period.end);
        let hi = u64::from(hi).clamp(lo, self.period.end);
        let (a, b) = (lo - first, hi - first);
        let mut cover = Cover::default();
        let hb = self.hour_buckets;
        for s in a / sb..b.div_ceil(sb) {
            let (s_lo, s_hi) = (s * sb, (s + 1) * sb);
            let (x, y) = (a.max(s_lo), b.min(s_hi));
            if (x, y) == (s_lo, s_hi) {
                cover.add.push(SumFrame::Span(s as usize));
                continue;
            }
            if hb == 0 || x % hb != 0 || y % hb != 0 {
                return None;
            }
            let (parts, h0) = (sb / hb, s * (sb / hb));
            let (from, to) = (h0 + (x - s_lo) / hb, h0 + (y - s_lo) / hb);
            let hour = |h: u64| SumFrame::Hour(h as usize);
            // What a frame costs to read: its entries, plus a little for the read itself.
            let cost = |e: Option<&BlockEntry>| 64 + e.map_or(0, |e| u64::from(e.keys));
            let hours = |r: std::ops::Range<u64>| -> u64 {
                r.map(|h| cost(self.hours.get(h as usize))).sum()
            };
            let less = cost(self.spans.get(s as usize)) + hours(h0..from) + hours(to..h0 + parts);
            if less < hours(from..to) {
                cover.add.push(SumFrame::Span(s as usize));
                cover.sub.extend((h0..from).chain(to..h0 + parts).map(hour));
            } else {
                cover.add.extend((from..to).map(hour));
            }
        }
        Some(cover)
    }

    /// A span's or an hour's (rank, totals sum) entries with a rank in `ranks`, in rank
    /// order: keys whose totals sum to 0 over it are not there.
    pub fn frame_sums(
        &self,
        frame: SumFrame,
        ranks: std::ops::Range<u64>,
        visit: &mut impl FnMut(u64, i64),
    ) -> Result<(), SegmentError> {
        let (e, what) = match frame {
            SumFrame::Span(i) => (self.spans.get(i), Frame::Span(i)),
            SumFrame::Hour(i) => (self.hours.get(i), Frame::Hour(i)),
        };
        let Some(e) = e else {
            return Err(self.corrupt(format!("no {what}")));
        };
        let raw = self.frame(e, what)?;
        decode_span(
            &raw,
            e.keys,
            self.keys,
            (ranks.start, ranks.end),
            false,
            visit,
        )
        .map_err(|why| self.corrupt(format!("{what}: {why}")))
    }

    /// The (namespace, key) of each rank, from the key frames (each read once); `ranks`
    /// sorted.
    pub fn keys_at(&self, ranks: &[u64]) -> Result<Vec<(String, String)>, SegmentError> {
        let mut out = Vec::with_capacity(ranks.len());
        let mut at: Option<(usize, Vec<Vec<u8>>)> = None;
        for &rank in ranks {
            let block = self
                .first_rank
                .partition_point(|&r| r <= rank)
                .saturating_sub(1);
            let (Some(k), Some(&first)) = (self.key_frames.get(block), self.first_rank.get(block))
            else {
                return Err(self.corrupt(format!("no key frame for rank {rank}")));
            };
            let ord = (rank - first) as usize;
            if ord >= k.keys as usize {
                return Err(self.corrupt(format!("no key of rank {rank}")));
            }
            let keys = match &at {
                Some((b, keys)) if *b == block => keys,
                _ => {
                    let what = Frame::Keys(block);
                    let raw = self.frame(k, what)?;
                    let keys = decode_keys(&raw, k.keys, k.keys)
                        .map_err(|why| self.corrupt(format!("{what}: {why}")))?;
                    &at.insert((block, keys)).1
                }
            };
            let (ns, key) = self.split_key(&keys[ord])?;
            out.push((ns.to_owned(), key.to_owned()));
        }
        Ok(out)
    }

    /// Walks the index entries of `ns` in key order, with a cursor that reads each block
    /// once.
    fn scan_ns(&self, ns: &str, visit: &mut IndexVisit<'_>) -> Result<(), SegmentError> {
        let mut lo = ns.as_bytes().to_vec();
        lo.push(0);
        let mut hi = ns.as_bytes().to_vec();
        hi.push(1);
        let mut stream = self.index.range().ge(&lo).lt(&hi).into_stream();
        let mut cursor = Cursor::default();
        while let Some((k, v)) = stream.next() {
            let key = self.key_str(&k[lo.len()..])?;
            visit(self, &mut cursor, key, v)?;
        }
        Ok(())
    }

    /// A parsed block, from the cache or read and parsed now (and cached).
    fn cached_block(&self, block: usize) -> Result<Arc<Block>, SegmentError> {
        if let Some(b) = self.lock_cache().get(block) {
            return Ok(b);
        }
        let b = Arc::new(self.block(block)?);
        let weight = self.blocks.get(block).map_or(0, |e| e.raw_len as usize);
        self.lock_cache().put(block, Arc::clone(&b), weight);
        Ok(b)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Recent<usize, Arc<Block>>> {
        // The cache is only ever a copy of what the file holds: one a panic left half-updated
        // is still consistent (entries are pushed whole).
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block and position the index value `v` (block << 32 | position) points at.
    fn locate(&self, v: u64) -> Result<(usize, usize), SegmentError> {
        let (block, ord) = ((v >> 32) as usize, v as u32);
        if self.blocks.get(block).is_none_or(|b| ord >= b.keys) {
            return Err(self.corrupt(format!("index points at block {block} record {ord}")));
        }
        Ok((block, ord as usize))
    }

    /// Keys of `ns` in byte order that start with `prefix` and come strictly after `after`,
    /// at most `limit` of them. Answered from the in-memory index alone.
    pub fn keys(
        &self,
        ns: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, SegmentError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let start = index_key(ns, prefix);
        let after = after.map(|a| index_key(ns, a));
        let range = self.index.range();
        let range = match &after {
            Some(a) if a.as_slice() >= start.as_slice() => range.gt(a),
            _ => range.ge(&start),
        };
        let mut stream = range.into_stream();
        let skip = ns.len() + 1;
        while let Some((k, _)) = stream.next() {
            if !k.starts_with(&start) {
                break;
            }
            out.push(self.key_str(&k[skip..])?.to_owned());
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn key_str<'k>(&self, k: &'k [u8]) -> Result<&'k str, SegmentError> {
        std::str::from_utf8(k).map_err(|_| self.corrupt("a key in the index is not UTF-8".into()))
    }

    /// Every key of `ns` with its record, in key order.
    pub fn scan(
        &self,
        ns: &str,
        visit: &mut dyn FnMut(&str, &KeyRecord) -> Result<(), SegmentError>,
    ) -> Result<(), SegmentError> {
        self.scan_ns(ns, &mut |seg, cursor, key, v| {
            let record = cursor.record(seg, v)?;
            visit(key, &record)
        })
    }

    /// Every (namespace, key, record) in order.
    pub fn scan_all(
        &self,
        visit: &mut dyn FnMut(&str, &str, &KeyRecord) -> Result<(), SegmentError>,
    ) -> Result<(), SegmentError> {
        let mut stream = self.index.stream();
        let mut cursor = Cursor::default();
        while let Some((k, v)) = stream.next() {
            let (ns, key) = self.split_key(k)?;
            let record = cursor.record(self, v)?;
            visit(ns, key, &record)?;
        }
        Ok(())
    }

    /// Every (namespace, key) in order with its record, pulled one at a time: a merge walks
    /// several segments side by side, each block decoded once, with no index look-up per key.
    pub fn records(&self) -> Records<'_> {
        Records {
            seg: self,
            stream: self.index.stream(),
            cursor: Cursor::default(),
        }
    }

    fn split_key<'k>(&self, k: &'k [u8]) -> Result<(&'k str, &'k str), SegmentError> {
        let Some(nul) = k.iter().position(|&b| b == 0) else {
            return Err(self.corrupt("an index key has no namespace separator".into()));
        };
        Ok((self.key_str(&k[..nul])?, self.key_str(&k[nul + 1..])?))
    }

    /// Checks the checksum of every frame beside the blocks (span, hour, key and rollup
    /// frames): what a merge of this segment never reads, since it builds its own from the
    /// records, and so would otherwise drop unseen with the file (a black-box review saw
    /// compaction launder such damage). Frames are small next to the blocks.
    pub fn verify_frames(&self) -> Result<(), SegmentError> {
        for (i, e) in self.spans.iter().enumerate() {
            self.frame(e, Frame::Span(i))?;
        }
        for (i, e) in self.hours.iter().enumerate() {
            self.frame(e, Frame::Hour(i))?;
        }
        for (b, e) in self.key_frames.iter().enumerate() {
            self.frame(e, Frame::Keys(b))?;
        }
        for (b, e) in self.rollups.iter().enumerate() {
            if e.keys > 0 {
                self.frame(e, Frame::Rollups(b))?;
            }
        }
        Ok(())
    }

    /// Reads and checks every block and the whole index: each block's checksum and records,
    /// every index entry pointing at the next record, and the footer's counts.
    pub fn verify(&self) -> Result<SegmentStats, SegmentError> {
        self.index
            .as_fst()
            .verify()
            .map_err(|e| self.corrupt(format!("key index: {e}")))?;
        let dict = self.dict()?;
        let mut stream = self.index.stream();
        let mut points = 0u64;
        // Version 2: each span's and hour's (rank, sum) entries as the records say they must
        // be, as a digest: a month holds an entry per key and hour, millions of them.
        let mut spans = vec![Digest::default(); self.spans.len()];
        let mut hours = vec![Digest::default(); self.hours.len()];
        let mut rank = 0u64;
        for (b, entry) in self.blocks.iter().enumerate() {
            let r = self.block(b)?;
            let frame_keys = match self.key_frames.get(b) {
                Some(k) => {
                    let raw = self.frame(k, Frame::Keys(b))?;
                    Some(
                        decode_keys(&raw, k.keys, k.keys)
                            .map_err(|why| self.corrupt(format!("key frame {b}: {why}")))?,
                    )
                }
                None => None,
            };
            let mut rollups = match self.rollups.get(b) {
                Some(e) if e.keys > 0 => {
                    let raw = self.frame(e, Frame::Rollups(b))?;
                    let spans = self.spans.len() as u32;
                    decode_rollups(&raw, e.keys, (entry.keys, spans), None)
                        .map_err(|why| self.corrupt(format!("rollup frame {b}: {why}")))?
                }
                _ => Vec::new(),
            }
            .into_iter()
            .peekable();
            for ord in 0..entry.keys {
                let Some((k, v)) = stream.next() else {
                    return Err(self.corrupt("the key index ends before the blocks".into()));
                };
                if let Some(keys) = &frame_keys
                    && keys[ord as usize] != k
                {
                    return Err(self.corrupt(format!(
                        "key frame {b} names another key than the index at record {ord}"
                    )));
                }
                if v != ((b as u64) << 32 | u64::from(ord)) {
                    return Err(self.corrupt(format!(
                        "index entry {v:#x} where block {b} record {ord} was expected"
                    )));
                }
                self.split_key(k)?;
                let rec = r
                    .record(ord as usize, &dict, &self.period)
                    .map_err(|why| self.corrupt(format!("block {b}: {why}")))?;
                points += rec.data_points();
                if let Some(rollup) = rollups.next_if(|r| r.ord == ord) {
                    let first = self.period.first;
                    let per = self.span_buckets.max(1);
                    let span_of = |i: u32| (u64::from(i - first) / per) as u32;
                    if Rollup::of(ord, &rec, &span_of).as_ref() != Some(&rollup) {
                        return Err(self.corrupt(format!(
                            "rollup frame {b} does not hold the sums of record {ord}'s subtotals"
                        )));
                    }
                }
                // Version 1 has no spans (0 buckets each): nothing to check.
                let first = self.period.first;
                let frames = [
                    (&mut spans, self.span_buckets),
                    (&mut hours, self.hour_buckets),
                ];
                for (lists, per) in frames.into_iter().filter(|(_, per)| *per > 0) {
                    let mut sums: Vec<(usize, i64)> = Vec::new();
                    for &(i, n) in &rec.totals {
                        let at = (u64::from(i - first) / per) as usize;
                        match sums.last_mut() {
                            Some((s, sum)) if *s == at => *sum = sum.wrapping_add(n),
                            _ => sums.push((at, n)),
                        }
                    }
                    for (s, sum) in sums {
                        if sum != 0
                            && let Some(digest) = lists.get_mut(s)
                        {
                            digest.add(rank, sum);
                        }
                    }
                }
                rank += 1;
            }
        }
        let checks = [
            (spans, &self.spans, Frame::Span as fn(usize) -> Frame),
            (hours, &self.hours, Frame::Hour),
        ];
        for (wanted, entries, frame) in checks {
            for (i, (want, e)) in wanted.iter().zip(entries).enumerate() {
                let raw = self.frame(e, frame(i))?;
                let mut got = Digest::default();
                decode_span(&raw, e.keys, self.keys, (0, u64::MAX), true, &mut |r, n| {
                    got.add(r, n)
                })
                .map_err(|why| self.corrupt(format!("{}: {why}", frame(i))))?;
                if &got != want {
                    return Err(self.corrupt(format!(
                        "{} does not hold the sums of the records' totals",
                        frame(i)
                    )));
                }
            }
        }
        if stream.next().is_some() {
            return Err(self.corrupt("the key index has keys past the last block".into()));
        }
        if points != self.data_points {
            return Err(self.corrupt(format!(
                "blocks hold {points} data points, the footer says {}",
                self.data_points
            )));
        }
        Ok(self.stats())
    }
}

/// A list of (rank, sum) entries as [`Segment::verify`] compares a span or hour frame with
/// the records: their number and an order-dependent 64-bit hash of them (splitmix64's
/// finalizer), so that verifying holds a few bytes per frame rather than every entry (a
/// month segment of 100 000 keys held ~130 MB of them). Two lists that differ agree by
/// chance about once in 2^64; damage is found by the checksums before this.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Digest {
    entries: u64,
    hash: u64,
}

impl Digest {
    fn add(&mut self, rank: u64, sum: i64) {
        fn mix(mut z: u64) -> u64 {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        self.entries += 1;
        let h = mix(self.hash ^ rank.wrapping_add(0x9e37_79b9_7f4a_7c15));
        self.hash = mix(h ^ sum as u64);
    }
}

/// Which frame of a segment a read is about, for its errors.
#[derive(Debug, Clone, Copy)]
enum Frame {
    Block(usize),
    Span(usize),
    Keys(usize),
    Rollups(usize),
    Hour(usize),
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Frame::Block(n) => write!(f, "block {n}"),
            Frame::Span(n) => write!(f, "span frame {n}"),
            Frame::Keys(n) => write!(f, "key frame {n}"),
            Frame::Rollups(n) => write!(f, "rollup frame {n}"),
            Frame::Hour(n) => write!(f, "hour frame {n}"),
        }
    }
}

/// What [`Segment::scan_ns`] calls for each index entry: the segment, a cursor over its
/// blocks, the key and the entry's value.
type IndexVisit<'a> = dyn FnMut(&Segment, &mut Cursor, &str, u64) -> Result<(), SegmentError> + 'a;

/// The block last read, for scans that visit its records in order.
#[derive(Default)]
struct Cursor {
    at: Option<(usize, Block)>,
    /// The segment's dictionary, taken at the first record read.
    dict: Option<Arc<Dictionary>>,
}

/// See [`Segment::records`].
pub struct Records<'a> {
    seg: &'a Segment,
    stream: fst::map::Stream<'a>,
    cursor: Cursor,
}

impl Records<'_> {
    /// The next (namespace, key) with where its record is, or `None` after the last. Nothing
    /// is decoded until [`Records::record`] asks: a merge skips what a cutoff hides unread,
    /// damaged or not.
    pub fn next_entry(&mut self) -> Result<Option<(String, String, u64)>, SegmentError> {
        let Some((k, v)) = self.stream.next() else {
            return Ok(None);
        };
        let (ns, key) = self.seg.split_key(k)?;
        Ok(Some((ns.to_owned(), key.to_owned(), v)))
    }

    /// The record of an entry [`Records::next_entry`] gave (its block decoded once for
    /// every record it holds).
    pub fn record(&mut self, at: u64) -> Result<KeyRecord, SegmentError> {
        self.cursor.record(self.seg, at)
    }
}

impl std::fmt::Debug for Records<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("segment", &self.seg.path)
            .finish_non_exhaustive()
    }
}

impl Cursor {
    /// The totals alone of the record the index value `v` points at.
    fn totals(&mut self, seg: &Segment, v: u64) -> Result<Buckets, SegmentError> {
        let (block, ord) = seg.locate(v)?;
        if !matches!(&self.at, Some((b, _)) if *b == block) {
            self.at = Some((block, seg.block(block)?));
        }
        let Some((_, r)) = &self.at else {
            return Err(seg.corrupt("no block".into()));
        };
        r.totals(ord, &seg.period)
            .map_err(|why| seg.corrupt(format!("block {block}: {why}")))
    }

    /// The record the index value `v` (block << 32 | position) points at.
    fn record(&mut self, seg: &Segment, v: u64) -> Result<KeyRecord, SegmentError> {
        let (block, ord) = seg.locate(v)?;
        if !matches!(&self.at, Some((b, _)) if *b == block) {
            self.at = Some((block, seg.block(block)?));
        }
        let Some((_, r)) = &self.at else {
            return Err(seg.corrupt("no block".into()));
        };
        let dict = match &self.dict {
            Some(d) => Arc::clone(d),
            None => Arc::clone(self.dict.insert(seg.dict()?)),
        };
        r.record(ord, &dict, &seg.period)
            .map_err(|why| seg.corrupt(format!("block {block}: {why}")))
    }
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor").finish_non_exhaustive()
    }
}

thread_local! {
    /// One zstd decompression context per thread, kept: creating one for every block read
    /// cost a few percent of a scan over a month segment.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Payloads up to this many bytes are decompressed into a buffer of the length the file
/// states; larger ones into a buffer that grows as the frame really decodes, so a length
/// that lies (a damaged file behind a recomputed checksum) costs only what the frame holds.
const PRESIZED_MAX: usize = 64 << 20;

/// Decompresses one zstd frame of at most `capacity` bytes with this thread's context (a
/// frame over [`PRESIZED_MAX`] with a context of its own).
fn decompress(stored: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    if capacity > PRESIZED_MAX {
        return decompress_growing(stored, capacity);
    }
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        match d.as_mut() {
            Some(d) => d.decompress(stored, capacity),
            None => zstd::bulk::decompress(stored, capacity),
        }
    })
}

/// Decompresses a frame of at most `capacity` bytes into a buffer that grows with what it
/// decodes; a frame holding more than `capacity` is an error.
fn decompress_growing(stored: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(PRESIZED_MAX);
    zstd::stream::read::Decoder::with_buffer(stored)?
        .single_frame()
        .take(capacity as u64 + 1)
        .read_to_end(&mut out)?;
    if out.len() > capacity {
        return Err(std::io::Error::other(format!(
            "the frame holds more than {capacity} bytes"
        )));
    }
    out.shrink_to_fit();
    Ok(out)
}

/// The dictionary section: its uncompressed length (u32), then its bytes as the codec stores
/// them.
fn decode_dictionary(section: &[u8], codec: u8) -> Result<Dictionary, String> {
    let raw_len = u32_at(section, 0) as usize;
    let stored = &section[DICT_HEADER_LEN..];
    if raw_len > MAX_DICT_RAW_LEN || (codec == CODEC_NONE && raw_len != stored.len()) {
        return Err(format!(
            "dictionary of {raw_len} bytes is not what is stored"
        ));
    }
    let raw = match codec {
        CODEC_ZSTD => decompress(stored, raw_len).map_err(|e| format!("dictionary: zstd: {e}"))?,
        _ => stored.to_vec(),
    };
    if raw.len() != raw_len {
        return Err(format!(
            "dictionary holds {} bytes, its header says {raw_len}",
            raw.len()
        ));
    }
    Dictionary::decode(&raw)
}

fn check_magic(path: &Path, magic: [u8; 4]) -> Result<Version, SegmentError> {
    Version::parse(magic).map_err(|p| match p {
        MagicProblem::BadMagic => SegmentError::BadMagic {
            path: path.to_path_buf(),
        },
        MagicProblem::UnsupportedVersion { got } => SegmentError::UnsupportedVersion {
            path: path.to_path_buf(),
            got,
        },
    })
}

/// Reads `buf.len()` bytes at `at`. Every read lies inside the length the segment was
/// checked at when opened, so running out of file means it was cut short since (damage,
/// `corrupt_data`), not a failing disk (I/O, retried by clients).
fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], at: u64) -> Result<(), SegmentError> {
    file.read_exact_at(buf, at).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => SegmentError::Corrupt {
            path: path.to_owned(),
            why: format!(
                "the file ends before byte {} (cut short since it was opened)",
                at + buf.len() as u64
            ),
        },
        _ => SegmentError::io(path, e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summed(series: usize) -> Option<Arc<Summed>> {
        Some(Arc::new(Summed {
            series: vec![(0, 0); series],
            sums: vec![1; series],
        }))
    }

    #[test]
    fn the_summed_cache_keeps_to_its_bytes_and_records_least_recent_out() {
        let mut c = Recent::new(SUMMED_CACHE_RECORDS, SUMMED_CACHE_BYTES);
        // Weighed as `Segment::summed` weighs what it keeps.
        let weight = |s: &Option<Arc<Summed>>| s.as_ref().map_or(NO_ROLLUP_BYTES, |s| s.bytes());
        let put = |c: &mut Recent<SummedAt, Option<Arc<Summed>>>, at, s| {
            let w = weight(&s);
            c.put(at, s, w)
        };
        let big = SUMMED_CACHE_BYTES / 16 / 3 - 8; // under a third of the budget
        for ord in 0..3 {
            put(&mut c, (0, ord, Exact::Spans(0, 1)), summed(big));
        }
        assert!(
            c.get((0, 0, Exact::Spans(0, 1))).is_some(),
            "three thirds fit"
        );
        put(&mut c, (0, 3, Exact::Spans(0, 1)), summed(big));
        assert!(c.bytes <= SUMMED_CACHE_BYTES);
        assert!(
            c.get((0, 1, Exact::Spans(0, 1))).is_none(),
            "the least recently used went"
        );
        assert!(
            c.get((0, 0, Exact::Spans(0, 1))).is_some()
                && c.get((0, 3, Exact::Spans(0, 1))).is_some()
        );
        put(
            &mut c,
            (1, 0, Exact::Spans(0, 1)),
            summed(SUMMED_CACHE_BYTES / 8),
        );
        assert!(
            c.get((1, 0, Exact::Spans(0, 1))).is_none(),
            "one record past the budget is not kept"
        );
        for ord in 0..100 {
            put(&mut c, (2, ord, Exact::Spans(0, 1)), None);
        }
        assert_eq!(c.entries.len(), SUMMED_CACHE_RECORDS);
        assert!(
            matches!(c.get((2, 99, Exact::Spans(0, 1))), Some(None)),
            "a record without a rollup is remembered"
        );
        let held: usize = c.entries.iter().map(|e| weight(&e.1)).sum();
        assert_eq!(held, c.bytes);
        // The block cache's shape: a count, no byte budget.
        let mut blocks = Recent::new(CACHED_BLOCKS, usize::MAX);
        for b in 0..20usize {
            blocks.put(b, b, 0);
        }
        assert_eq!(blocks.entries.len(), CACHED_BLOCKS);
        assert_eq!((blocks.get(19), blocks.get(0)), (Some(19), None));
    }
}

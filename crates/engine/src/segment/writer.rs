//! [`SegmentWriter`]: keys in (namespace, key) order in, a finished segment file out. Records
//! are buffered until a block's estimated payload reaches its target, then the block is
//! encoded, compressed, checksummed and appended; `finish` appends the key index and the
//! footer and fsyncs the file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::codec::{DictBuilder, Period, encode_block, encoded_bound, estimate, record_problem};
use super::layout::{
    BlockEntry, CODEC_NONE, CODEC_ZSTD, DEFAULT_BLOCK_TARGET, DICT_HEADER_LEN, Footer, HEADER_LEN,
    MAX_BLOCK_RAW_LEN, MAX_DICT_RAW_LEN, SumsHeader, Version, hour_buckets,
};
use super::sums::{Rollup, SpanBuilder, encode_keys, encode_rollups};
use super::{KeyRecord, SegmentError, SegmentMeta, SegmentStats, index_key};

/// How block payloads are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// As they are (for tests and measurements).
    None,
    /// One zstd frame per block at this level.
    Zstd { level: i32 },
}

/// Writer settings; [`WriteOptions::default`] is what the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    pub codec: Codec,
    /// A block is cut once its estimated uncompressed payload reaches this many bytes.
    pub block_target: usize,
}

impl Default for WriteOptions {
    /// zstd level 9 and 16 KiB blocks: see docs/format.md, "Compression", for the numbers.
    fn default() -> Self {
        WriteOptions {
            codec: Codec::Zstd { level: 9 },
            block_target: DEFAULT_BLOCK_TARGET,
        }
    }
}

/// Adds `totals` (sorted by bucket index), summed per group of `per` buckets from `first`,
/// to `frames` (one per group) under `rank`; a zero sum is left out.
fn push_sums(frames: &mut [SpanBuilder], per: u64, first: u64, rank: u64, totals: &[(u32, i64)]) {
    let mut at: Option<(usize, i64)> = None;
    for &(i, n) in totals {
        let group = ((u64::from(i) - first) / per) as usize;
        match &mut at {
            Some((g, sum)) if *g == group => *sum = sum.wrapping_add(n),
            _ => {
                if let Some((g, sum)) = at.replace((group, n))
                    && sum != 0
                {
                    frames[g].push(rank, sum);
                }
            }
        }
    }
    if let Some((g, sum)) = at
        && sum != 0
    {
        frames[g].push(rank, sum);
    }
}

/// Writes one segment file. Keys must be added in strictly increasing (namespace, key) byte
/// order. A file whose writer did not `finish` has no footer and never opens.
pub struct SegmentWriter {
    path: PathBuf,
    file: File,
    meta: SegmentMeta,
    opts: WriteOptions,
    period: Period,
    dict: DictBuilder,
    /// Bytes written so far: where the next block starts.
    offset: u64,
    /// Records of the block being filled, and their estimated payload size.
    pending: Vec<KeyRecord>,
    pending_bytes: usize,
    blocks: Vec<BlockEntry>,
    index: fst::MapBuilder<Vec<u8>>,
    /// Buckets per span, and per span every key's non-zero totals sum as (rank, sum),
    /// already coded.
    span_buckets: u64,
    spans: Vec<SpanBuilder>,
    /// The same per hour of each span, when a span has several ([`hour_buckets`]; 0 and
    /// none otherwise).
    hour_buckets: u64,
    hours: Vec<SpanBuilder>,
    /// The index keys of the block being filled, and each written block's key frame as
    /// stored, with its uncompressed length.
    block_keys: Vec<Vec<u8>>,
    key_frames: Vec<(Vec<u8>, u32)>,
    /// The rollups of the block being filled, and each written block's rollup frame as
    /// stored, with its uncompressed length and how many rollups it holds.
    block_rollups: Vec<Rollup>,
    rollup_frames: Vec<(Vec<u8>, u32, u32)>,
    last_key: Option<Vec<u8>>,
    keys: u64,
    data_points: u64,
    poisoned: bool,
}

impl std::fmt::Debug for SegmentWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentWriter")
            .field("path", &self.path)
            .field("meta", &self.meta)
            .field("keys", &self.keys)
            .field("blocks", &self.blocks.len())
            .finish_non_exhaustive()
    }
}

impl SegmentWriter {
    /// Creates (or truncates) `path` and writes the header. The caller gives a temporary
    /// name and renames the file once [`SegmentWriter::finish`] returned.
    pub fn create(path: &Path, meta: SegmentMeta) -> Result<Self, SegmentError> {
        Self::with_options(path, meta, WriteOptions::default())
    }

    pub fn with_options(
        path: &Path,
        meta: SegmentMeta,
        opts: WriteOptions,
    ) -> Result<Self, SegmentError> {
        if let Some(why) = meta.problem() {
            return Err(SegmentError::Invalid {
                path: path.to_path_buf(),
                ns: String::new(),
                key: String::new(),
                why: format!("segment meta: {why}"),
            });
        }
        let mut file = File::create(path).map_err(|e| SegmentError::io(path, e))?;
        file.write_all(&Version::V2.magic())
            .map_err(|e| SegmentError::io(path, e))?;
        let (span_buckets, spans) = SumsHeader::spans_of(&meta);
        let hour_buckets = hour_buckets(meta.resolution, span_buckets);
        let hours = match hour_buckets {
            0 => 0,
            per => span_buckets / per * u64::from(spans),
        };
        Ok(SegmentWriter {
            path: path.to_path_buf(),
            file,
            period: Period {
                first: meta.first_bucket(),
                end: meta.end_bucket(),
            },
            dict: DictBuilder::default(),
            meta,
            opts,
            offset: HEADER_LEN as u64,
            pending: Vec::new(),
            pending_bytes: 0,
            blocks: Vec::new(),
            index: fst::MapBuilder::memory(),
            span_buckets,
            spans: (0..spans).map(|_| SpanBuilder::default()).collect(),
            hour_buckets,
            hours: (0..hours).map(|_| SpanBuilder::default()).collect(),
            block_keys: Vec::new(),
            key_frames: Vec::new(),
            block_rollups: Vec::new(),
            rollup_frames: Vec::new(),
            last_key: None,
            keys: 0,
            data_points: 0,
            poisoned: false,
        })
    }

    /// Adds one key's record. Keys must come in strictly increasing (ns, key) byte order;
    /// buckets must be strictly increasing, non-zero and inside the period; dimensions and
    /// values sorted and unique.
    pub fn add(&mut self, ns: &str, key: &str, record: &KeyRecord) -> Result<(), SegmentError> {
        self.add_owned(ns, key, record.clone())
    }

    /// As [`SegmentWriter::add`], taking the record (held until its block is written).
    pub fn add_owned(
        &mut self,
        ns: &str,
        key: &str,
        record: KeyRecord,
    ) -> Result<(), SegmentError> {
        if self.poisoned {
            return Err(SegmentError::Poisoned {
                path: self.path.clone(),
            });
        }
        // (The path is copied only for an error: this runs once per record.)
        let invalid = |path: &Path, why: String| SegmentError::Invalid {
            path: path.to_path_buf(),
            ns: ns.to_owned(),
            key: key.to_owned(),
            why,
        };
        if ns.is_empty() || ns.as_bytes().contains(&0) {
            return Err(invalid(
                &self.path,
                "a namespace is non-empty and has no NUL byte".into(),
            ));
        }
        if let Some(why) = record_problem(&record, self.period.first, self.period.end) {
            return Err(invalid(&self.path, why));
        }
        let k = index_key(ns, key);
        if let Some(prev) = &self.last_key
            && prev.as_slice() >= k.as_slice()
        {
            return Err(SegmentError::OutOfOrder {
                path: self.path.clone(),
                prev: String::from_utf8_lossy(prev).replace('\0', "/"),
                next: format!("{ns}/{key}"),
            });
        }
        let size = estimate(&record, &self.period);
        // The estimate is rough (a byte a count): a record it finds large is measured, so
        // that one too large for a block is refused here, not after its block is built.
        if size > MAX_BLOCK_RAW_LEN / 16 {
            let bound = encoded_bound(&record, &self.period);
            if bound > MAX_BLOCK_RAW_LEN {
                return Err(invalid(
                    &self.path,
                    format!("record of up to {bound} bytes is larger than a block can hold"),
                ));
            }
        }
        if !self.pending.is_empty() && self.pending_bytes + size > self.opts.block_target {
            self.flush_block()?;
        }
        let value = ((self.blocks.len() as u64) << 32) | self.pending.len() as u64;
        if let Err(e) = self.index.insert(&k, value) {
            self.poisoned = true;
            return Err(invalid(&self.path, format!("key index: {e}")));
        }
        self.add_span_sums(&record);
        let (first, per) = (self.period.first, self.span_buckets);
        let span_of = |i: u32| (u64::from(i - first) / per) as u32;
        if let Some(r) = Rollup::worth(self.pending.len() as u32, &record, &span_of) {
            self.block_rollups.push(r);
        }
        self.keys += 1;
        self.data_points += record.data_points();
        self.pending.push(record);
        self.pending_bytes += size;
        match &mut self.last_key {
            Some(last) => {
                last.clear();
                last.extend_from_slice(&k);
            }
            None => self.last_key = Some(k.clone()),
        }
        self.block_keys.push(k);
        Ok(())
    }

    /// Adds the record's totals, summed per span (and per hour), to the span (and hour)
    /// frames under its rank.
    fn add_span_sums(&mut self, record: &KeyRecord) {
        let (rank, first) = (self.keys, u64::from(self.period.first));
        push_sums(
            &mut self.spans,
            self.span_buckets,
            first,
            rank,
            &record.totals,
        );
        if self.hour_buckets > 0 {
            push_sums(
                &mut self.hours,
                self.hour_buckets,
                first,
                rank,
                &record.totals,
            );
        }
    }

    fn flush_block(&mut self) -> Result<(), SegmentError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let raw = encode_block(&self.pending, &mut self.dict, &self.period);
        let result = self.write_block(&raw);
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn compress(&self, raw: &[u8]) -> Result<Vec<u8>, SegmentError> {
        match self.opts.codec {
            Codec::None => Ok(raw.to_vec()),
            Codec::Zstd { level } => {
                compress(raw, level).map_err(|e| SegmentError::io(&self.path, e))
            }
        }
    }

    fn write_block(&mut self, raw: &[u8]) -> Result<(), SegmentError> {
        let path = self.path.clone();
        if raw.len() > MAX_BLOCK_RAW_LEN {
            return Err(SegmentError::Invalid {
                path,
                ns: String::new(),
                key: String::new(),
                why: format!("block payload of {} bytes is too large", raw.len()),
            });
        }
        let stored = self.compress(raw)?;
        let stored_len = u32::try_from(stored.len()).map_err(|_| SegmentError::Invalid {
            path: path.clone(),
            ns: String::new(),
            key: String::new(),
            why: format!("compressed block of {} bytes is too large", stored.len()),
        })?;
        let keys = encode_keys(&self.block_keys);
        self.key_frames
            .push((self.compress(&keys)?, keys.len() as u32));
        self.block_keys.clear();
        // Rollups are a shortcut a reader can do without: a frame too large to be read back
        // is left empty rather than refused.
        let mut rollups = encode_rollups(&self.block_rollups);
        let mut count = self.block_rollups.len() as u32;
        if rollups.len() > MAX_BLOCK_RAW_LEN / 2 {
            (rollups, count) = (Vec::new(), 0);
        }
        let rollup_frame = if count == 0 {
            Vec::new()
        } else {
            self.compress(&rollups)?
        };
        self.rollup_frames
            .push((rollup_frame, rollups.len() as u32, count));
        self.block_rollups.clear();
        self.file
            .write_all(&stored)
            .map_err(|e| SegmentError::io(&path, e))?;
        self.blocks.push(BlockEntry {
            offset: self.offset,
            stored_len,
            raw_len: raw.len() as u32,
            crc: crc32c::crc32c(&stored),
            keys: self.pending.len() as u32,
        });
        self.offset += u64::from(stored_len);
        self.pending.clear();
        self.pending_bytes = 0;
        Ok(())
    }

    /// Writes the last block, the key index and the footer, and fsyncs the file. The caller
    /// renames it into place and fsyncs the directory.
    pub fn finish(mut self) -> Result<SegmentStats, SegmentError> {
        if self.poisoned {
            return Err(SegmentError::Poisoned { path: self.path });
        }
        self.flush_block()?;
        let path = self.path.clone();
        // The span frames, the key frames, then the rollup frames, after the blocks; their
        // tables go last in the index section.
        let frames_offset = self.offset;
        let mut tables = Vec::new();
        SumsHeader {
            span_buckets: self.span_buckets,
            spans: self.spans.len() as u32,
            rollups: true,
            hours: self.hour_buckets > 0,
            frames_offset,
        }
        .encode(&mut tables);
        let mut frames = Vec::new();
        let mut at = frames_offset;
        let spans = std::mem::take(&mut self.spans);
        let hours = std::mem::take(&mut self.hours);
        let mut add_frame = |frames: &mut Vec<u8>, stored: &[u8], raw_len: usize, n: usize| {
            BlockEntry {
                offset: at,
                stored_len: stored.len() as u32,
                raw_len: raw_len as u32,
                crc: crc32c::crc32c(stored),
                keys: n as u32,
            }
            .encode(&mut tables);
            at += stored.len() as u64;
            frames.extend_from_slice(stored);
        };
        let sums_frame = |span: SpanBuilder, what: &str| {
            let entries = span.entries() as usize;
            let raw = span.finish();
            let stored = match raw.len() <= MAX_BLOCK_RAW_LEN {
                true => Some(self.compress(&raw)?),
                false => None,
            };
            let Some(stored) = stored.filter(|s| u32::try_from(s.len()).is_ok()) else {
                return Err(SegmentError::Invalid {
                    path: path.clone(),
                    ns: String::new(),
                    key: String::new(),
                    why: format!("{what} frame of {} bytes is too large", raw.len()),
                });
            };
            Ok((stored, raw.len(), entries))
        };
        for span in spans {
            let (stored, raw_len, entries) = sums_frame(span, "span")?;
            add_frame(&mut frames, &stored, raw_len, entries);
        }
        for ((stored, raw_len), b) in self.key_frames.iter().zip(&self.blocks) {
            add_frame(&mut frames, stored, *raw_len as usize, b.keys as usize);
        }
        for (stored, raw_len, count) in &self.rollup_frames {
            add_frame(&mut frames, stored, *raw_len as usize, *count as usize);
        }
        for hour in hours {
            let (stored, raw_len, entries) = sums_frame(hour, "hour")?;
            add_frame(&mut frames, &stored, raw_len, entries);
        }
        self.file
            .write_all(&frames)
            .map_err(|e| SegmentError::io(&path, e))?;
        self.offset = at;
        let dict = self.dict.encode();
        let too_large = |what: &str, len: usize| SegmentError::Invalid {
            path: path.clone(),
            ns: String::new(),
            key: String::new(),
            why: format!("{what} of {len} bytes is too large"),
        };
        if dict.len() > MAX_DICT_RAW_LEN {
            return Err(too_large("dictionary", dict.len()));
        }
        let mut index = (dict.len() as u32).to_le_bytes().to_vec();
        index.extend(self.compress(&dict)?);
        let dict_len =
            u32::try_from(index.len()).map_err(|_| too_large("dictionary", dict.len()))?;
        debug_assert!(index.len() >= DICT_HEADER_LEN);
        let fst = self
            .index
            .into_inner()
            .map_err(|e| SegmentError::corrupt(&path, format!("key index: {e}")))?;
        let fst_len = u32::try_from(fst.len()).map_err(|_| too_large("key index", fst.len()))?;
        index.extend(fst);
        for b in &self.blocks {
            b.encode(&mut index);
        }
        index.extend_from_slice(&tables);
        let footer = Footer {
            version: Version::V2,
            meta: self.meta,
            codec: match self.opts.codec {
                Codec::None => CODEC_NONE,
                Codec::Zstd { .. } => CODEC_ZSTD,
            },
            keys: self.keys,
            data_points: self.data_points,
            index_offset: self.offset,
            dict_len,
            fst_len,
            blocks: self.blocks.len() as u32,
            index_crc: crc32c::crc32c(&index),
        };
        index.extend_from_slice(&footer.encode());
        self.file
            .write_all(&index)
            .map_err(|e| SegmentError::io(&path, e))?;
        self.file
            .sync_all()
            .map_err(|e| SegmentError::io(&path, e))?;
        Ok(SegmentStats {
            keys: self.keys,
            data_points: self.data_points,
            bytes: self.offset + index.len() as u64,
        })
    }
}

thread_local! {
    /// One zstd compression context per thread (and level), kept: a flush compresses a
    /// block every 16 KiB, and a context made for each cost its set-up every time.
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Inputs larger than this are compressed with a context of their own, freed after: a
/// kept context keeps the workspace of the largest input it saw, and a span frame of a
/// month segment (hundreds of KiB) would leave each flushing thread holding megabytes.
const KEPT_CONTEXT_MAX_INPUT: usize = 64 << 10;

/// Compresses one block as one zstd frame with this thread's context.
fn compress(raw: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    if raw.len() > KEPT_CONTEXT_MAX_INPUT {
        return zstd::bulk::compress(raw, level);
    }
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        match c.as_mut() {
            Some((_, z)) => z.compress(raw),
            None => zstd::bulk::compress(raw, level),
        }
    })
}

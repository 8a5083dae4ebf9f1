//! The segment's byte layout as named constants (docs/format.md, "Archive segments", whose
//! tables a test holds against these), and the fixed-size parts: header, block table entry,
//! footer.
//!
//! ```text
//! header (4) | block 0 | block 1 | ... | index: dictionary, fst map, block table | footer (80)
//! ```
//!
//! Version 2 adds, between the blocks and the index, one frame per span of the period (a
//! UTC day) with each key's totals summed over it, and one frame per block with the block's
//! keys; the index section ends with their tables (see [`SumsHeader`]):
//!
//! ```text
//! header | blocks | span frames | key frames | index: dictionary, fst, block table, sums | footer
//! ```

use super::{SegmentKind, SegmentMeta};

/// Magic bytes of a segment file, with the format version in the last byte. The file starts
/// and ends with them.
pub const MAGIC_V1: [u8; 4] = *b"TLS\x01";
/// Magic bytes of a version 2 segment: version 1 plus span sums and key frames.
pub const MAGIC_V2: [u8; 4] = *b"TLS\x02";
/// Bytes before the first block: the magic.
pub const HEADER_LEN: usize = 4;

pub const FOOTER_ID_OFFSET: usize = 0;
pub const FOOTER_KIND_OFFSET: usize = 8;
pub const FOOTER_CODEC_OFFSET: usize = 9;
pub const FOOTER_RESERVED_OFFSET: usize = 10;
pub const FOOTER_RESOLUTION_OFFSET: usize = 12;
pub const FOOTER_PERIOD_START_OFFSET: usize = 16;
pub const FOOTER_PERIOD_END_OFFSET: usize = 24;
pub const FOOTER_KEYS_OFFSET: usize = 32;
pub const FOOTER_POINTS_OFFSET: usize = 40;
pub const FOOTER_INDEX_OFFSET_OFFSET: usize = 48;
pub const FOOTER_DICT_LEN_OFFSET: usize = 56;
pub const FOOTER_FST_LEN_OFFSET: usize = 60;
pub const FOOTER_BLOCKS_OFFSET: usize = 64;
pub const FOOTER_INDEX_CRC_OFFSET: usize = 68;
pub const FOOTER_CRC_OFFSET: usize = 72;
pub const FOOTER_MAGIC_OFFSET: usize = 76;
/// Bytes of the footer, the last bytes of the file.
pub const FOOTER_LEN: usize = 80;

pub const BLOCK_OFFSET_OFFSET: usize = 0;
pub const BLOCK_STORED_LEN_OFFSET: usize = 8;
pub const BLOCK_RAW_LEN_OFFSET: usize = 12;
pub const BLOCK_CRC_OFFSET: usize = 16;
pub const BLOCK_KEYS_OFFSET: usize = 20;
/// Bytes of one block table entry.
pub const BLOCK_ENTRY_LEN: usize = 24;

/// Bytes before the dictionary's stored bytes: its uncompressed length (u32).
pub const DICT_HEADER_LEN: usize = 4;
/// The largest uncompressed dictionary: what its u32 length holds.
pub const MAX_DICT_RAW_LEN: usize = u32::MAX as usize;
/// The largest uncompressed block or frame payload: what a table entry's u32 length holds.
/// A key's record of one period is written alone in its block however large it is (one key
/// with a million dimension values over a day of hours is ~100 MiB), up to this; the writer
/// refuses a record estimated at more than half of it.
pub const MAX_BLOCK_RAW_LEN: usize = u32::MAX as usize;
/// The writer's default target for a block's uncompressed payload.
pub const DEFAULT_BLOCK_TARGET: usize = 16 << 10;

/// Block payload codec byte: stored as is.
pub const CODEC_NONE: u8 = 0;
/// Block payload codec byte: one zstd frame.
pub const CODEC_ZSTD: u8 = 1;

/// A segment format version this build reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// What is wrong with a magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MagicProblem {
    BadMagic,
    UnsupportedVersion { got: u8 },
}

impl Version {
    pub fn magic(self) -> [u8; 4] {
        match self {
            Version::V1 => MAGIC_V1,
            Version::V2 => MAGIC_V2,
        }
    }

    pub fn parse(magic: [u8; 4]) -> Result<Self, MagicProblem> {
        match magic {
            MAGIC_V1 => Ok(Version::V1),
            MAGIC_V2 => Ok(Version::V2),
            [b'T', b'L', b'S', got] => Err(MagicProblem::UnsupportedVersion { got }),
            _ => Err(MagicProblem::BadMagic),
        }
    }
}

/// Where a block's stored bytes are and what they should check and decode to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockEntry {
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub crc: u32,
    pub keys: u32,
}

impl BlockEntry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.extend_from_slice(&self.keys.to_le_bytes());
    }

    /// `b` is exactly [`BLOCK_ENTRY_LEN`] bytes.
    pub fn decode(b: &[u8; BLOCK_ENTRY_LEN]) -> Self {
        BlockEntry {
            offset: u64_at(b, BLOCK_OFFSET_OFFSET),
            stored_len: u32_at(b, BLOCK_STORED_LEN_OFFSET),
            raw_len: u32_at(b, BLOCK_RAW_LEN_OFFSET),
            crc: u32_at(b, BLOCK_CRC_OFFSET),
            keys: u32_at(b, BLOCK_KEYS_OFFSET),
        }
    }
}

/// The footer's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// The version its trailing magic names (the same as the header's).
    pub version: Version,
    pub meta: SegmentMeta,
    pub codec: u8,
    pub keys: u64,
    pub data_points: u64,
    pub index_offset: u64,
    /// Stored bytes of the dictionary, the first part of the index section.
    pub dict_len: u32,
    pub fst_len: u32,
    pub blocks: u32,
    pub index_crc: u32,
}

impl Footer {
    pub fn encode(&self) -> [u8; FOOTER_LEN] {
        let mut f = [0u8; FOOTER_LEN];
        put(&mut f, FOOTER_ID_OFFSET, &self.meta.id.to_le_bytes());
        f[FOOTER_KIND_OFFSET] = self.meta.kind.to_byte();
        f[FOOTER_CODEC_OFFSET] = self.codec;
        put(
            &mut f,
            FOOTER_RESOLUTION_OFFSET,
            &self.meta.resolution.to_le_bytes(),
        );
        put(
            &mut f,
            FOOTER_PERIOD_START_OFFSET,
            &self.meta.period_start.to_le_bytes(),
        );
        put(
            &mut f,
            FOOTER_PERIOD_END_OFFSET,
            &self.meta.period_end.to_le_bytes(),
        );
        put(&mut f, FOOTER_KEYS_OFFSET, &self.keys.to_le_bytes());
        put(
            &mut f,
            FOOTER_POINTS_OFFSET,
            &self.data_points.to_le_bytes(),
        );
        put(
            &mut f,
            FOOTER_INDEX_OFFSET_OFFSET,
            &self.index_offset.to_le_bytes(),
        );
        put(&mut f, FOOTER_DICT_LEN_OFFSET, &self.dict_len.to_le_bytes());
        put(&mut f, FOOTER_FST_LEN_OFFSET, &self.fst_len.to_le_bytes());
        put(&mut f, FOOTER_BLOCKS_OFFSET, &self.blocks.to_le_bytes());
        put(
            &mut f,
            FOOTER_INDEX_CRC_OFFSET,
            &self.index_crc.to_le_bytes(),
        );
        let crc = crc32c::crc32c(&f[..FOOTER_CRC_OFFSET]);
        put(&mut f, FOOTER_CRC_OFFSET, &crc.to_le_bytes());
        put(&mut f, FOOTER_MAGIC_OFFSET, &self.version.magic());
        f
    }

    /// The footer's fields, once its magic and checksum were checked. `Err` names a field
    /// whose value cannot be.
    pub fn decode(f: &[u8; FOOTER_LEN], version: Version) -> Result<Self, String> {
        let kind = SegmentKind::from_byte(f[FOOTER_KIND_OFFSET])
            .ok_or_else(|| format!("unknown segment kind {}", f[FOOTER_KIND_OFFSET]))?;
        let codec = f[FOOTER_CODEC_OFFSET];
        if codec != CODEC_NONE && codec != CODEC_ZSTD {
            return Err(format!("unknown block codec {codec}"));
        }
        let meta = SegmentMeta {
            id: u64_at(f, FOOTER_ID_OFFSET),
            kind,
            resolution: u32_at(f, FOOTER_RESOLUTION_OFFSET),
            period_start: u64_at(f, FOOTER_PERIOD_START_OFFSET) as i64,
            period_end: u64_at(f, FOOTER_PERIOD_END_OFFSET) as i64,
        };
        if let Some(why) = meta.problem() {
            return Err(format!("footer meta: {why}"));
        }
        Ok(Footer {
            version,
            meta,
            codec,
            keys: u64_at(f, FOOTER_KEYS_OFFSET),
            data_points: u64_at(f, FOOTER_POINTS_OFFSET),
            index_offset: u64_at(f, FOOTER_INDEX_OFFSET_OFFSET),
            dict_len: u32_at(f, FOOTER_DICT_LEN_OFFSET),
            fst_len: u32_at(f, FOOTER_FST_LEN_OFFSET),
            blocks: u32_at(f, FOOTER_BLOCKS_OFFSET),
            index_crc: u32_at(f, FOOTER_INDEX_CRC_OFFSET),
        })
    }
}

/// Version 2: the last part of the index section, after the block table. Its header, then
/// one [`BlockEntry`] per span frame (`keys` = the frame's entries), one per key frame (one
/// per block, `keys` = the block's records) and, with [`SUMS_FLAG_ROLLUPS`], one per rollup
/// frame (one per block, `keys` = the block's records that have a rollup).
pub const SUMS_SPAN_BUCKETS_OFFSET: usize = 0;
pub const SUMS_SPANS_OFFSET: usize = 8;
pub const SUMS_FLAGS_OFFSET: usize = 12;
pub const SUMS_FRAMES_OFFSET_OFFSET: usize = 16;
/// Bytes of the sums header.
pub const SUMS_HEADER_LEN: usize = 24;
/// The most spans a segment has (a period of more UTC days than this has one span).
pub const MAX_SPANS: u32 = 4096;
/// The length of a span the writer prefers, in seconds: a UTC day.
pub const SPAN_SECS: i64 = 86_400;
/// Sums header flag: the file has rollup frames (and their table).
pub const SUMS_FLAG_ROLLUPS: u32 = 1;
/// Sums header flag: the file has hour frames (and their table), one per hour of each span.
/// The other bits are zero.
pub const SUMS_FLAG_HOURS: u32 = 2;
/// The length of an hour frame's part of a span, in seconds.
pub const HOUR_SECS: i64 = 3600;

/// The sums header (version 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumsHeader {
    /// Buckets per span; the spans tile the period.
    pub span_buckets: u64,
    pub spans: u32,
    /// Whether rollup frames follow the key frames ([`SUMS_FLAG_ROLLUPS`]); files written
    /// before rollups existed have none.
    pub rollups: bool,
    /// Whether hour frames follow ([`SUMS_FLAG_HOURS`]): each span's totals summed per
    /// hour. Only spans of several hours have them.
    pub hours: bool,
    /// Where the first span frame starts: the end of the blocks.
    pub frames_offset: u64,
}

impl SumsHeader {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.span_buckets.to_le_bytes());
        out.extend_from_slice(&self.spans.to_le_bytes());
        let mut flags = if self.rollups { SUMS_FLAG_ROLLUPS } else { 0 };
        if self.hours {
            flags |= SUMS_FLAG_HOURS;
        }
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.frames_offset.to_le_bytes());
    }

    /// `b` is exactly [`SUMS_HEADER_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != SUMS_HEADER_LEN {
            return Err(format!("sums header of {} bytes", b.len()));
        }
        let flags = u32_at(b, SUMS_FLAGS_OFFSET);
        if flags & !(SUMS_FLAG_ROLLUPS | SUMS_FLAG_HOURS) != 0 {
            return Err(format!("sums header: unknown flags {flags:#x}"));
        }
        Ok(SumsHeader {
            span_buckets: u64_at(b, SUMS_SPAN_BUCKETS_OFFSET),
            spans: u32_at(b, SUMS_SPANS_OFFSET),
            rollups: flags & SUMS_FLAG_ROLLUPS != 0,
            hours: flags & SUMS_FLAG_HOURS != 0,
            frames_offset: u64_at(b, SUMS_FRAMES_OFFSET_OFFSET),
        })
    }

    /// How a writer cuts `meta`'s period into spans: UTC days when the period is whole
    /// days of whole buckets (and not too many), else one span of the whole period.
    pub fn spans_of(meta: &SegmentMeta) -> (u64, u32) {
        let res = i64::from(meta.resolution.max(1));
        let len = meta.period_end - meta.period_start;
        let buckets = (len / res) as u64;
        let days = len / SPAN_SECS;
        if SPAN_SECS % res == 0
            && meta.period_start % SPAN_SECS == 0
            && len % SPAN_SECS == 0
            && days <= i64::from(MAX_SPANS)
        {
            ((SPAN_SECS / res) as u64, days as u32)
        } else {
            (buckets, 1)
        }
    }
}

/// Buckets per hour frame for spans of `span_buckets` buckets of `resolution` seconds: the
/// buckets of an hour when a span is several whole hours, else 0 (no hour frames). Writer
/// and reader agree on it, so the file need not store it.
pub fn hour_buckets(resolution: u32, span_buckets: u64) -> u64 {
    let res = u64::from(resolution.max(1));
    let hour = HOUR_SECS as u64;
    if !hour.is_multiple_of(res) {
        return 0;
    }
    let per = hour / res;
    if span_buckets > per && span_buckets.is_multiple_of(per) {
        per
    } else {
        0
    }
}

fn put(f: &mut [u8], at: usize, bytes: &[u8]) {
    f[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The little-endian u32 at `at`; the caller guarantees `at + 4 <= b.len()`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The little-endian u64 at `at`; the caller guarantees `at + 8 <= b.len()`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sums header round-trips with every known flag, and one with a flag this build does
    /// not know (a later format's frames) is refused by name rather than misread.
    #[test]
    fn a_sums_header_with_an_unknown_flag_is_refused() {
        let h = SumsHeader {
            span_buckets: 24,
            spans: 31,
            rollups: true,
            hours: true,
            frames_offset: 4096,
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(SumsHeader::decode(&b), Ok(h));
        let flags = u32_at(&b, SUMS_FLAGS_OFFSET) | 4;
        b[SUMS_FLAGS_OFFSET..SUMS_FLAGS_OFFSET + 4].copy_from_slice(&flags.to_le_bytes());
        let e = SumsHeader::decode(&b).unwrap_err();
        assert!(e.contains("unknown flags 0x7"), "{e}");
        assert!(SumsHeader::decode(&b[1..]).is_err(), "a short header");
    }
}

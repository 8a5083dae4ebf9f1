//! Archive segments: immutable files holding, for one tier resolution and one time period,
//! the counters of every key that had a non-zero count there (docs/format.md, "Archive
//! segments"). Per key, a *total record* (its buckets) and one *subtotal record* per
//! dimension (each value with its buckets), as bitly's Clickatron keeps its archive.
//!
//! - [`layout`]: the byte layout as named constants, the header and footer codecs.
//! - `codec`: varints, the segment dictionary and the block payload (records in streams).
//! - [`writer`]: [`SegmentWriter`] writes keys in order, block by block.
//! - [`reader`]: [`Segment`] keeps the footer and the key index in memory and reads blocks
//!   on demand with positional reads, so one open segment serves many readers at once.
//! - [`files`]: the segment files open at once, bounded per process.
//! - [`dicts`]: the decoded dictionaries held at once, bounded per process.

mod codec;
pub mod dicts;
pub mod files;
pub mod layout;
pub mod reader;
mod sums;
pub mod writer;

use std::io;
use std::path::PathBuf;

pub use layout::Version;
pub use reader::{BlockHandle, Cover, Exact, Records, Segment, SumFrame};
pub use sums::ROLLUP_RATIO;
pub use writer::{Codec, SegmentWriter, WriteOptions};

/// What a segment holds: one tier resolution, one period, and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentMeta {
    /// Given by the caller (the manifest names segments by it).
    pub id: u64,
    pub kind: SegmentKind,
    /// Bucket width in seconds.
    pub resolution: u32,
    /// Unix seconds, inclusive; a multiple of `resolution`.
    pub period_start: i64,
    /// Unix seconds, exclusive; a multiple of `resolution`.
    pub period_end: i64,
}

impl SegmentMeta {
    /// The bucket index of `period_start`: every bucket index in the segment is at least this.
    pub fn first_bucket(&self) -> u32 {
        (self.period_start / i64::from(self.resolution.max(1))) as u32
    }

    /// One past the last bucket index the period holds.
    pub fn end_bucket(&self) -> u64 {
        (self.period_end / i64::from(self.resolution.max(1))) as u64
    }

    /// Why these values cannot describe a segment, if they cannot.
    pub fn problem(&self) -> Option<&'static str> {
        let r = i64::from(self.resolution);
        if r == 0 {
            return Some("resolution is 0");
        }
        if self.period_start < 0 || self.period_end <= self.period_start {
            return Some("period is empty or before 1970");
        }
        if self.period_start % r != 0 || self.period_end % r != 0 {
            return Some("period bounds are not multiples of the resolution");
        }
        if self.period_end / r > i64::from(u32::MAX) + 1 {
            return Some("period ends past the last u32 bucket index");
        }
        None
    }
}

/// A base segment is a flushed period; a delta holds late increments for a period that was
/// already flushed, summed with the base at read time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    Base,
    Delta,
}

impl SegmentKind {
    pub fn to_byte(self) -> u8 {
        match self {
            SegmentKind::Base => 0,
            SegmentKind::Delta => 1,
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(SegmentKind::Base),
            1 => Some(SegmentKind::Delta),
            _ => None,
        }
    }
}

/// Buckets of one series: (bucket index, count), strictly increasing index, no zero counts.
/// A bucket index is the bucket's start (unix s) divided by the resolution.
pub type Buckets = Vec<(u32, i64)>;

/// Everything a segment holds for one key: its total record and its subtotal records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRecord {
    pub totals: Buckets,
    /// Sorted by dimension name, names unique.
    pub dims: Vec<DimRecord>,
}

impl KeyRecord {
    /// Data points: (bucket, count) pairs in the totals and in every subtotal.
    pub fn data_points(&self) -> u64 {
        let subs: usize = self
            .dims
            .iter()
            .flat_map(|d| d.values.iter())
            .map(|(_, b)| b.len())
            .sum();
        (self.totals.len() + subs) as u64
    }
}

/// One dimension's subtotals for a key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DimRecord {
    /// The canonical dimension name (`country`, or `country+device` for a compound).
    pub dim: String,
    /// Sorted by value bytes, values unique.
    pub values: Vec<(String, Buckets)>,
}

/// What a finished or verified segment holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentStats {
    pub keys: u64,
    /// Non-zero totals and subtotals: every (bucket, count) pair.
    pub data_points: u64,
    /// The file's length.
    pub bytes: u64,
}

/// A segment failure: which file, and what is wrong, as a typed value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    /// The I/O error is in the message and is not also the error's `source`, so a chain
    /// printed whole (`{:#}`, `detail`) says it once.
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("{}: not a tally segment (bad magic bytes)", path.display())]
    BadMagic { path: PathBuf },
    #[error(
        "{}: segment format version {got} is not supported by this build (it reads versions 1 and 2)",
        path.display()
    )]
    UnsupportedVersion { path: PathBuf, got: u8 },
    /// `block: None` is the footer or the index section.
    #[error(
        "{}: checksum mismatch in {} (expected {expected:#010x}, got {got:#010x})",
        path.display(),
        match block { Some(b) => format!("block {b}"), None => "the footer or index".to_owned() }
    )]
    Checksum {
        path: PathBuf,
        block: Option<u64>,
        expected: u32,
        got: u32,
    },
    /// A version 2 span frame or key frame whose stored bytes do not match their checksum.
    #[error(
        "{}: checksum mismatch in {frame} (expected {expected:#010x}, got {got:#010x})",
        path.display()
    )]
    FrameChecksum {
        path: PathBuf,
        /// `span frame 3`, `key frame 0`.
        frame: String,
        expected: u32,
        got: u32,
    },
    /// A structural problem found after the checksums passed (or a file too short to have any).
    #[error("{}: corrupt segment: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
    #[error("{}: keys out of order: {next:?} after {prev:?}", path.display())]
    OutOfOrder {
        path: PathBuf,
        prev: String,
        next: String,
    },
    /// The writer was given something the format cannot hold (bad meta, an unsorted record,
    /// a zero count, a bucket outside the period, a namespace with a NUL byte).
    #[error("{}: invalid input for {ns:?}/{key:?}: {why}", path.display())]
    Invalid {
        path: PathBuf,
        ns: String,
        key: String,
        why: String,
    },
    /// A previous write failed; the file is incomplete and must be discarded.
    #[error("{}: the writer failed earlier; discard the file", path.display())]
    Poisoned { path: PathBuf },
    /// A scan's visitor asked to stop (its query ran out of time); nothing is wrong with the file.
    #[error("{why}")]
    Stopped { why: String },
}

impl SegmentError {
    pub(crate) fn corrupt(path: &std::path::Path, why: impl Into<String>) -> Self {
        SegmentError::Corrupt {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: io::Error) -> Self {
        SegmentError::Io {
            path: path.to_path_buf(),
            err: source,
        }
    }
}

/// The index key of a series: namespace bytes, a 0 byte, key bytes. Namespaces never contain
/// a 0 byte, so this sorts exactly as (namespace, key) compared bytewise.
pub fn index_key(ns: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(ns.len() + 1 + key.len());
    k.extend_from_slice(ns.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

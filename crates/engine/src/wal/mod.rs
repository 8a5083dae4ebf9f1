//! The write-ahead log: one framed, checksummed record per accepted batch or schema change,
//! in numbered files (docs/format.md, "Write-ahead log"). [`writer`] appends with group
//! commit on a dedicated thread; [`reader`] scans files on recovery.

pub mod payload;
pub mod reader;
pub mod writer;

use std::path::{Path, PathBuf};

/// Magic bytes of a log file, with the format version in the last byte.
pub const MAGIC_V1: [u8; 4] = *b"TLW\x01";
/// Bytes of the file header: magic (4), first sequence number (8), CRC32C of both (4).
pub const FILE_HEADER_LEN: usize = 16;
pub const FILE_MAGIC_OFFSET: usize = 0;
pub const FILE_FIRST_SEQ_OFFSET: usize = 4;
pub const FILE_HEADER_CRC_OFFSET: usize = 12;

/// Bytes of a frame header: payload length (4), sequence number (8), payload CRC32C (4),
/// CRC32C of the previous 16 bytes (4).
pub const FRAME_HEADER_LEN: usize = 20;
pub const FRAME_LEN_OFFSET: usize = 0;
pub const FRAME_SEQ_OFFSET: usize = 4;
pub const FRAME_PAYLOAD_CRC_OFFSET: usize = 12;
pub const FRAME_HEADER_CRC_OFFSET: usize = 16;
/// The largest payload a frame may carry (a sanity bound checked after the header CRC).
pub const MAX_PAYLOAD_LEN: usize = 1 << 30;

/// Sequence numbers start at 1 and stay below this (2^63): another in a file name, a header
/// or a frame is damage, and the writer can always count on (at a million records a second,
/// the log would reach it in 292 000 years).
pub const MAX_SEQ: u64 = 1 << 63;

/// A log file version this build reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
}

impl Version {
    pub fn parse(magic: [u8; 4]) -> Result<Self, FileProblem> {
        match magic {
            MAGIC_V1 => Ok(Version::V1),
            [b'T', b'L', b'W', got] => Err(FileProblem::UnsupportedVersion { got }),
            _ => Err(FileProblem::BadMagic),
        }
    }
}

/// A log failure found on recovery: which file, and what is wrong with it as a typed value.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    #[error("{}: corrupt record at offset {offset}: {why}", file.display())]
    Corrupt {
        file: PathBuf,
        offset: u64,
        why: Corruption,
    },
    #[error("{}: {why}", file.display())]
    BadFile { file: PathBuf, why: FileProblem },
    /// The log ends before records the archive says it held: its newest files are gone.
    #[error(
        "{}: records {first}..={last} are missing: the archive holds records up to {last}, but the log ends at {} (its newest file was deleted or lost); {ACCEPT_DATA_LOSS}",
        dir.display(),
        .first.saturating_sub(1)
    )]
    MissingTail { dir: PathBuf, first: u64, last: u64 },
    /// The log's newest file ever started (`wal/HEAD`) is gone, and any after it: the
    /// records written since the last publish were in them.
    #[error(
        "{}: records from {first} on are missing: the log's newest file started at record {head} (wal/HEAD says so), but {} (its newest files were deleted or lost); {ACCEPT_DATA_LOSS}",
        dir.display(),
        match newest {
            Some(n) => format!("the newest log file left starts at record {n}"),
            None => "no log file is left".to_owned(),
        }
    )]
    LostNewest {
        dir: PathBuf,
        first: u64,
        head: u64,
        newest: Option<u64>,
    },
    /// The log was closed cleanly after record `last` (`wal/HEAD`), but its end is cut off
    /// or damaged since: not a torn write, which only a crash leaves.
    #[error(
        "{}: records {first}..={last} are missing: the log was closed cleanly after record {last} (wal/HEAD says so), but it now ends at record {} (its end was cut off or damaged since); {ACCEPT_DATA_LOSS}",
        dir.display(),
        .first.saturating_sub(1)
    )]
    CutAfterClose { dir: PathBuf, first: u64, last: u64 },
}

/// What is wrong with a log file as a whole (its header, its place in the sequence).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileProblem {
    #[error("not a tally log file (bad magic bytes)")]
    BadMagic,
    #[error("log format version {got} is not supported by this build (it reads version 1)")]
    UnsupportedVersion { got: u8 },
    #[error("incomplete file header")]
    IncompleteHeader,
    /// The header is zeros but bytes follow it: a file is fsynced with its header before
    /// any record goes in, so this is damage, not a crash while creating it.
    #[error("the file header is zeros but {bytes} bytes of records follow it")]
    ZeroedHeader { bytes: u64 },
    #[error("file header checksum mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderChecksum { expected: u32, got: u32 },
    #[error("file starts at sequence {got}, expected {expected}")]
    FirstSequence { expected: u64, got: u64 },
    #[error("named for sequence {named}, but the log continues at {expected}")]
    NamedSequence { named: u64, expected: u64 },
    #[error(
        "records {needed}..={} are missing: the oldest log file starts at record {found}, but recovery needs every record from {needed} on (a log file was deleted or lost); {ACCEPT_DATA_LOSS}",
        .found.saturating_sub(1)
    )]
    MissingRecords { needed: u64, found: u64 },
    #[error(
        "records {first}..={last} are missing: the log file before this one ends at record {}, this one starts at {} (a log file between them was deleted or lost); {ACCEPT_DATA_LOSS}",
        .first.saturating_sub(1),
        .last.saturating_add(1)
    )]
    Gap { first: u64, last: u64 },
    #[error("sequence number {seq} is outside the numbers a log uses (1 up to 2^63)")]
    SequenceOutOfRange { seq: u64 },
    #[error(
        "damaged: {HEAD_LEN} bytes of magic {HEAD_MAGIC:?}, two record numbers and their CRC32C were expected"
    )]
    DamagedHead,
    #[error("cannot be read: {0}")]
    Unreadable(String),
}

/// What every refusal over missing records tells the operator.
pub const ACCEPT_DATA_LOSS: &str = "to start anyway with the records that are left, and lose \
    these for good, run with --accept-data-loss (TALLY_ACCEPT_DATA_LOSS=1)";

/// What is wrong with a record that is not the log's tail.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    #[error("frame header checksum mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderChecksum { expected: u32, got: u32 },
    #[error("payload checksum mismatch (expected {expected:#010x}, got {got:#010x})")]
    PayloadChecksum { expected: u32, got: u32 },
    /// A number already used (or going backwards): not a gap, never accepted.
    #[error("sequence number {got}, expected {expected}")]
    Sequence { expected: u64, got: u64 },
    /// The numbering jumps forward: the records in between are not in the log.
    #[error(
        "records {first}..={last} are missing: this record is numbered {}, the log continued at {first}; {ACCEPT_DATA_LOSS}",
        .last.saturating_add(1)
    )]
    Missing { first: u64, last: u64 },
    #[error("record runs past the end of a file that is not the last")]
    Truncated,
    #[error("payload length {0} exceeds the maximum")]
    TooLong(u64),
    #[error("undecodable payload: {0}")]
    Payload(payload::PayloadError),
    /// The payload decodes but cannot be applied (a name that breaks the model's rules, a
    /// timestamp out of range): the bytes were damaged before their checksum was computed,
    /// or written by a buggy build.
    #[error("the record does not apply: {0}")]
    Apply(tally_core::store::StoreError),
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The file header for a file whose first record has sequence number `first_seq`.
pub fn file_header(first_seq: u64) -> [u8; FILE_HEADER_LEN] {
    let mut h = [0u8; FILE_HEADER_LEN];
    h[FILE_MAGIC_OFFSET..FILE_MAGIC_OFFSET + 4].copy_from_slice(&MAGIC_V1);
    h[FILE_FIRST_SEQ_OFFSET..FILE_FIRST_SEQ_OFFSET + 8].copy_from_slice(&first_seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[..FILE_HEADER_CRC_OFFSET]);
    h[FILE_HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Appends one frame (header and payload) to `out`.
pub fn put_frame(out: &mut Vec<u8>, seq: u64, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let hcrc = crc32c::crc32c(&out[start..start + FRAME_HEADER_CRC_OFFSET]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(payload);
}

/// `wal/HEAD`: the first record number of the newest log file ever started in this log,
/// rewritten (atomically, synced) each time one is started and at each open. The log only
/// ever removes its oldest files, so a log whose newest file starts before it lost its
/// newest files — and with them the records written since the last publish, which nothing
/// else remembers. A clean close also writes where the log ended, so that an end cut off or
/// damaged since (which recovery would take for a torn write) is refused (docs/format.md,
/// "Write-ahead log").
pub const HEAD: &str = "HEAD";
/// `TLH` and the marker's version.
pub const HEAD_MAGIC: [u8; 4] = *b"TLH\x01";
/// Magic (4), first record number of the newest file (8, little-endian), the record number
/// after the last one at a clean close (8; 0 while the log is open, or after a crash),
/// CRC32C of the 20 bytes before (4).
pub const HEAD_LEN: usize = 24;

/// What `wal/HEAD` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The first record number of the newest log file ever started.
    pub newest: u64,
    /// At a clean close, the number the next record would have had: the log held every
    /// record before it. `None` while the log is open or after a crash.
    pub closed_at: Option<u64>,
}

/// Records `head` in `dir` (see [`HEAD`]): written under a temporary name, synced, renamed
/// over the old one, the directory synced (`io::replace`).
pub fn write_head(dir: &Path, head: Head) -> std::io::Result<()> {
    let mut b = [0u8; HEAD_LEN];
    b[..4].copy_from_slice(&HEAD_MAGIC);
    b[4..12].copy_from_slice(&head.newest.to_le_bytes());
    b[12..20].copy_from_slice(&head.closed_at.unwrap_or(0).to_le_bytes());
    let crc = crc32c::crc32c(&b[..20]);
    b[20..].copy_from_slice(&crc.to_le_bytes());
    crate::io::replace(&crate::io::OsFs, &dir.join(HEAD), &b)
}

/// What `wal/HEAD` records; `None` when there is none (a log written before it existed, or
/// a copy of a log made by a `tally backup` from before backups wrote one).
pub fn read_head(dir: &Path) -> Result<Option<Head>, WalError> {
    let path = dir.join(HEAD);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(WalError::BadFile {
                file: path,
                why: FileProblem::Unreadable(e.to_string()),
            });
        }
    };
    let damaged = || WalError::BadFile {
        file: path.clone(),
        why: FileProblem::DamagedHead,
    };
    if bytes.len() != HEAD_LEN || bytes[..4] != HEAD_MAGIC {
        return Err(damaged());
    }
    if crc32c::crc32c(&bytes[..20]) != read_u32(&bytes, 20) {
        return Err(damaged());
    }
    let (newest, closed_at) = (read_u64(&bytes, 4), read_u64(&bytes, 12));
    // `closed_at` is the number the next record would have had: `MAX_SEQ` after a log
    // whose last record took the last number.
    if newest == 0
        || newest >= MAX_SEQ
        || closed_at > MAX_SEQ
        || (closed_at != 0 && closed_at < newest)
    {
        return Err(damaged());
    }
    Ok(Some(Head {
        newest,
        closed_at: (closed_at != 0).then_some(closed_at),
    }))
}

/// `<dir>/<first_seq, 20 digits>.wal`: names sort in log order.
pub fn file_name(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}.wal"))
}

/// The log files in `dir`, in order, with their first sequence numbers (from the name).
pub fn list_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let seq = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".wal"))
            .filter(|n| n.len() == 20)
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(seq) = seq {
            out.push((seq, path));
        }
    }
    out.sort();
    Ok(out)
}

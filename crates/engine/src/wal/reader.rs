//! Recovery: scans log files in order, checks every header and checksum, and hands each
//! record's payload to the caller. The last file's tail may be torn (a write the crash cut
//! short): it is reported and dropped. Anything else wrong is an error naming the file and
//! the offset — never silently skipped.

use std::path::{Path, PathBuf};

use super::{
    Corruption, FILE_FIRST_SEQ_OFFSET, FILE_HEADER_CRC_OFFSET, FILE_HEADER_LEN,
    FRAME_HEADER_CRC_OFFSET, FRAME_HEADER_LEN, FRAME_LEN_OFFSET, FRAME_PAYLOAD_CRC_OFFSET,
    FRAME_SEQ_OFFSET, FileProblem, MAX_PAYLOAD_LEN, MAX_SEQ, Version, WalError, read_u32, read_u64,
};

/// A torn tail found and dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub file: PathBuf,
    /// Where the valid log ends: the file is cut back to this length.
    pub offset: u64,
    pub dropped_bytes: u64,
}

/// How one file ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEnd {
    /// The length of the valid part.
    pub valid_len: u64,
    /// The next sequence number expected after this file.
    pub next_seq: u64,
    pub records: u64,
    pub torn: Option<TornTail>,
    /// Ranges of sequence numbers the file skips (`first..=last`), when scanned with
    /// [`Gaps::Accept`]; with [`Gaps::Refuse`] a skip is an error instead.
    pub missing: Vec<(u64, u64)>,
}

/// What a scan does when the numbering jumps forward (records missing in between).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gaps {
    /// An error, [`Corruption::Missing`], naming the range.
    Refuse,
    /// Noted in [`FileEnd::missing`], and the scan goes on (`accept_data_loss`).
    Accept,
}

fn corrupt(file: &Path, offset: usize, why: Corruption) -> WalError {
    WalError::Corrupt {
        file: file.to_owned(),
        offset: offset as u64,
        why,
    }
}

/// Receives each valid record's `(seq, payload)`; an `Err` marks the payload undecodable.
pub type Visit<'a> = dyn FnMut(u64, &[u8]) -> Result<(), Corruption> + 'a;

/// Scans one file's bytes. `expected_seq` is the sequence number its first record must
/// carry; `is_last` allows a torn tail. `visit` gets `(seq, payload)` of every valid record
/// and may refuse it (an undecodable payload), which is corruption at that record.
pub fn scan(
    file: &Path,
    bytes: &[u8],
    expected_seq: u64,
    is_last: bool,
    visit: &mut Visit<'_>,
) -> Result<FileEnd, WalError> {
    scan_with(file, bytes, expected_seq, is_last, Gaps::Refuse, visit)
}

/// [`scan`], choosing what a jump forward in the numbering is. A file whose first record
/// is not the one its header names has a gap before that record.
pub fn scan_with(
    file: &Path,
    bytes: &[u8],
    expected_seq: u64,
    is_last: bool,
    gaps: Gaps,
    visit: &mut Visit<'_>,
) -> Result<FileEnd, WalError> {
    let mut missing: Vec<(u64, u64)> = Vec::new();
    let torn_at = |offset: usize, records: u64, next_seq: u64, missing: &Vec<(u64, u64)>| FileEnd {
        valid_len: offset as u64,
        next_seq,
        records,
        missing: missing.clone(),
        torn: Some(TornTail {
            file: file.to_owned(),
            offset: offset as u64,
            dropped_bytes: (bytes.len() - offset) as u64,
        }),
    };
    if bytes.len() < FILE_HEADER_LEN || bytes[..FILE_HEADER_LEN].iter().all(|&b| b == 0) {
        // A crash while the file was being created: nothing in it was ever acknowledged
        // (its header is synced before any record is written, so nothing follows it).
        let after = bytes.get(FILE_HEADER_LEN..).unwrap_or_default();
        if let Some(at) = after.iter().position(|&b| b != 0) {
            return Err(WalError::BadFile {
                file: file.to_owned(),
                why: FileProblem::ZeroedHeader {
                    bytes: (after.len() - at) as u64,
                },
            });
        }
        if is_last {
            return Ok(torn_at(0, 0, expected_seq, &missing));
        }
        return Err(WalError::BadFile {
            file: file.to_owned(),
            why: FileProblem::IncompleteHeader,
        });
    }
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&bytes[..4]);
    Version::parse(magic).map_err(|why| WalError::BadFile {
        file: file.to_owned(),
        why,
    })?;
    let expected = read_u32(bytes, FILE_HEADER_CRC_OFFSET);
    let got = crc32c::crc32c(&bytes[..FILE_HEADER_CRC_OFFSET]);
    if got != expected {
        return Err(WalError::BadFile {
            file: file.to_owned(),
            why: FileProblem::HeaderChecksum { expected, got },
        });
    }
    let first = read_u64(bytes, FILE_FIRST_SEQ_OFFSET);
    if first == 0 || first >= MAX_SEQ {
        return Err(WalError::BadFile {
            file: file.to_owned(),
            why: FileProblem::SequenceOutOfRange { seq: first },
        });
    }
    if first != expected_seq {
        return Err(WalError::BadFile {
            file: file.to_owned(),
            why: FileProblem::FirstSequence {
                expected: expected_seq,
                got: first,
            },
        });
    }
    let mut pos = FILE_HEADER_LEN;
    let mut seq = expected_seq;
    let mut records = 0;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        // Zeros to the end from `at` (relative to this record) are space the file system
        // extended but never wrote: a power loss after a write that was not yet synced can
        // keep the file's new length with only its first pages written, so they can start
        // anywhere in a record's header or payload. Nothing whole follows, and the
        // record's own bytes cannot be recovered: in the last file it is a torn tail.
        let zeros_from = |at: usize| rest.get(at..).is_none_or(|r| r.iter().all(|&b| b == 0));
        if rest.len() < FRAME_HEADER_LEN {
            if is_last {
                return Ok(torn_at(pos, records, seq, &missing));
            }
            return Err(corrupt(file, pos, Corruption::Truncated));
        }
        let expected_h = read_u32(rest, FRAME_HEADER_CRC_OFFSET);
        let got_h = crc32c::crc32c(&rest[..FRAME_HEADER_CRC_OFFSET]);
        if got_h != expected_h {
            if is_last && zeros_from(FRAME_HEADER_LEN) {
                return Ok(torn_at(pos, records, seq, &missing));
            }
            return Err(corrupt(
                file,
                pos,
                Corruption::HeaderChecksum {
                    expected: expected_h,
                    got: got_h,
                },
            ));
        }
        let len = read_u32(rest, FRAME_LEN_OFFSET) as usize;
        if len > MAX_PAYLOAD_LEN {
            return Err(corrupt(file, pos, Corruption::TooLong(len as u64)));
        }
        let got_seq = read_u64(rest, FRAME_SEQ_OFFSET);
        if got_seq >= MAX_SEQ {
            return Err(corrupt(
                file,
                pos,
                Corruption::Sequence {
                    expected: seq,
                    got: got_seq,
                },
            ));
        }
        if got_seq > seq && gaps == Gaps::Refuse {
            return Err(corrupt(
                file,
                pos,
                Corruption::Missing {
                    first: seq,
                    last: got_seq - 1,
                },
            ));
        }
        if got_seq < seq {
            return Err(corrupt(
                file,
                pos,
                Corruption::Sequence {
                    expected: seq,
                    got: got_seq,
                },
            ));
        }
        let end = FRAME_HEADER_LEN + len;
        if rest.len() < end {
            if is_last {
                return Ok(torn_at(pos, records, seq, &missing));
            }
            return Err(corrupt(file, pos, Corruption::Truncated));
        }
        let payload = &rest[FRAME_HEADER_LEN..end];
        let expected_p = read_u32(rest, FRAME_PAYLOAD_CRC_OFFSET);
        let got_p = crc32c::crc32c(payload);
        if got_p != expected_p {
            // Only the very last record of the log can be a torn write (what follows it,
            // if anything, was never written).
            if is_last && zeros_from(end) {
                return Ok(torn_at(pos, records, seq, &missing));
            }
            return Err(corrupt(
                file,
                pos,
                Corruption::PayloadChecksum {
                    expected: expected_p,
                    got: got_p,
                },
            ));
        }
        if got_seq > seq {
            // Accepted (a refusal returned above): only once the record itself is whole.
            missing.push((seq, got_seq - 1));
            seq = got_seq;
        }
        visit(seq, payload).map_err(|why| corrupt(file, pos, why))?;
        records += 1;
        seq += 1;
        pos += end;
    }
    Ok(FileEnd {
        valid_len: pos as u64,
        next_seq: seq,
        records,
        torn: None,
        missing,
    })
}

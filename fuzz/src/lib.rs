//! What the fuzz targets share: turning mutated bytes into log files whose checksums hold,
//! so that the fuzzer reaches the checks behind the CRCs (sequence numbers, lengths, payload
//! decoding) instead of stopping at the first checksum every time, and a scratch directory
//! on tmpfs for the targets that open an engine.

use std::path::PathBuf;

use tally_engine::wal::{
    FILE_FIRST_SEQ_OFFSET, FILE_HEADER_CRC_OFFSET, FILE_HEADER_LEN, FRAME_HEADER_CRC_OFFSET,
    FRAME_HEADER_LEN, FRAME_LEN_OFFSET, FRAME_PAYLOAD_CRC_OFFSET, MAGIC_V1,
};

/// Which checksums [`fix_checksums`] recomputes: bits 0, 1 and 2 of a target's flag byte.
#[derive(Debug, Clone, Copy)]
pub struct Fix {
    pub file_header: bool,
    pub frame_headers: bool,
    pub payloads: bool,
}

impl Fix {
    pub fn from_bits(bits: u8) -> Self {
        Fix {
            file_header: bits & 1 != 0,
            frame_headers: bits & 2 != 0,
            payloads: bits & 4 != 0,
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Walks `bytes` as a log file, frame by frame as their lengths say, and rewrites the
/// chosen checksums so they match; stops at the first frame that runs past the end.
pub fn fix_checksums(bytes: &mut [u8], fix: Fix) {
    if bytes.len() < FILE_HEADER_LEN {
        return;
    }
    if fix.file_header {
        let crc = crc32c::crc32c(&bytes[..FILE_HEADER_CRC_OFFSET]);
        put_u32(bytes, FILE_HEADER_CRC_OFFSET, crc);
    }
    let mut pos = FILE_HEADER_LEN;
    while pos + FRAME_HEADER_LEN <= bytes.len() {
        let len = u32_at(bytes, pos + FRAME_LEN_OFFSET) as usize;
        let end = pos + FRAME_HEADER_LEN + len;
        if fix.payloads && end <= bytes.len() {
            let crc = crc32c::crc32c(&bytes[pos + FRAME_HEADER_LEN..end]);
            put_u32(bytes, pos + FRAME_PAYLOAD_CRC_OFFSET, crc);
        }
        if fix.frame_headers {
            let crc = crc32c::crc32c(&bytes[pos..pos + FRAME_HEADER_CRC_OFFSET]);
            put_u32(bytes, pos + FRAME_HEADER_CRC_OFFSET, crc);
        }
        if end > bytes.len() {
            break;
        }
        pos = end;
    }
}

/// The first sequence number a file header names, if the file is long enough to have one.
pub fn first_seq(bytes: &[u8]) -> Option<u64> {
    let b = bytes.get(FILE_FIRST_SEQ_OFFSET..FILE_FIRST_SEQ_OFFSET + 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// Concatenated log files cut apart at each file magic (`TLW\x01`) after the first byte:
/// one fuzz input can so describe a log of several files.
pub fn split_files(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 1;
    while i + MAGIC_V1.len() <= bytes.len() {
        if bytes[i..i + MAGIC_V1.len()] == MAGIC_V1 {
            out.push(&bytes[start..i]);
            start = i;
        }
        i += 1;
    }
    out.push(&bytes[start..]);
    out
}

/// An empty directory for this process, on tmpfs when there is one (a target that opens an
/// engine per input spends its time in the file system otherwise).
pub fn scratch_dir() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("tally-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

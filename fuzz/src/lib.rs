//! What the fuzz targets share: turning mutated bytes into log files (and segments) whose
//! checksums hold, so that the fuzzer reaches the checks behind the CRCs (sequence numbers,
//! lengths, payload decoding) instead of stopping at the first checksum every time; a
//! scratch directory on tmpfs for the targets that open an engine; and, for those, the
//! engine's settings and the probe write that a restart must keep.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Duration, Key, Namespace, RawEvent};
use tally_core::store::{KeyRead, ManualClock, Store, Want};
use tally_engine::{Config, Engine, FsyncPolicy};

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

/// Rewrites a segment file's checksums so they match after mutation, as far as its footer's
/// offsets are in bounds: every block's CRC32C in the block table (when `blocks`), then the
/// index section's and the footer's (when `index`). `fst`'s own checksum, inside the key
/// index, is left as it is (docs/format.md, "Reading").
pub fn fix_segment_checksums(bytes: &mut [u8], blocks: bool, index: bool) {
    use tally_engine::segment::layout as l;
    let Some(footer_at) = bytes.len().checked_sub(l::FOOTER_LEN) else {
        return;
    };
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let index_at = u64_at(bytes, footer_at + l::FOOTER_INDEX_OFFSET_OFFSET) as usize;
    let dict_len = u32_at(bytes, footer_at + l::FOOTER_DICT_LEN_OFFSET) as usize;
    let fst_len = u32_at(bytes, footer_at + l::FOOTER_FST_LEN_OFFSET) as usize;
    let count = u32_at(bytes, footer_at + l::FOOTER_BLOCKS_OFFSET) as usize;
    if blocks {
        let table = index_at.saturating_add(dict_len).saturating_add(fst_len);
        // Version 2: after the block table, the sums header, then an entry per span frame,
        // per key frame and (with the rollups flag) per rollup frame, checksummed as blocks
        // are.
        let mut entries = count;
        if bytes[bytes.len() - 1] == l::MAGIC_V2[3] {
            let head = table.saturating_add(count.saturating_mul(l::BLOCK_ENTRY_LEN));
            if head.saturating_add(l::SUMS_HEADER_LEN) <= footer_at {
                let spans = u32_at(bytes, head + l::SUMS_SPANS_OFFSET) as usize;
                let flags = u32_at(bytes, head + l::SUMS_FLAGS_OFFSET);
                let per_block = if flags & l::SUMS_FLAG_ROLLUPS != 0 {
                    3
                } else {
                    2
                };
                entries = count.saturating_mul(per_block).saturating_add(spans);
            }
        }
        for b in 0..entries.min(1 << 16) {
            let mut entry = table.saturating_add(b.saturating_mul(l::BLOCK_ENTRY_LEN));
            if b >= count {
                entry = entry.saturating_add(l::SUMS_HEADER_LEN);
            }
            if entry.saturating_add(l::BLOCK_ENTRY_LEN) > footer_at {
                break;
            }
            let at = u64_at(bytes, entry + l::BLOCK_OFFSET_OFFSET) as usize;
            let len = u32_at(bytes, entry + l::BLOCK_STORED_LEN_OFFSET) as usize;
            if let Some(stored) = at.checked_add(len).and_then(|end| bytes.get(at..end)) {
                let crc = crc32c::crc32c(stored);
                put_u32(bytes, entry + l::BLOCK_CRC_OFFSET, crc);
            }
        }
    }
    if index {
        if index_at <= footer_at {
            let crc = crc32c::crc32c(&bytes[index_at..footer_at]);
            put_u32(bytes, footer_at + l::FOOTER_INDEX_CRC_OFFSET, crc);
        }
        let crc = crc32c::crc32c(&bytes[footer_at..footer_at + l::FOOTER_CRC_OFFSET]);
        put_u32(bytes, footer_at + l::FOOTER_CRC_OFFSET, crc);
    }
}

/// 2026-11-20T00:00:00Z, the clock of the engine's fixtures (the seeds come from them).
pub const NOW: i64 = 1_795_132_800;

/// An engine on `dir` at [`NOW`], without fsyncs, one shard, no wait for its lock.
pub fn engine_config(dir: &Path, accept_data_loss: bool) -> Config {
    let mut c = Config::new(dir);
    c.clock = Arc::new(ManualClock::new(NOW));
    c.fsync = FsyncPolicy::Never;
    c.shards = 1;
    c.lock_wait = std::time::Duration::ZERO;
    c.accept_data_loss = accept_data_loss;
    c
}

fn probe_total(e: &Engine) -> i64 {
    let ns = Namespace::new("fuzzprobe").unwrap();
    let key = Key::new("probe").unwrap();
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: Duration::from_secs(3600).unwrap(),
        from: 0,
        to: 1 << 32,
        want: Want::All,
        sum_subtotals: false,
        keep: None,
    };
    let data = e.read(&[read]).unwrap().pop().unwrap();
    data.totals.iter().map(|(_, n)| n).sum()
}

/// Writes a probe event to an opened engine (unless what it opened makes the probe invalid,
/// say a schema with an allow-list for its namespace), closes it, and asserts that the
/// directory opens again, without `accept_data_loss`, with the same total for the probe.
pub fn assert_a_write_survives_a_restart(e: Engine, dir: &Path) {
    let probe = RawEvent {
        ns: "fuzzprobe".into(),
        key: "probe".into(),
        ts: Some(NOW - 60),
        n: Some(3),
        dims: Vec::new(),
    };
    let written = ingest::prepare(&e, &[probe], NOW, &Limits::default(), &Defaults::default())
        .ok()
        .map(|batch| e.apply(&batch).expect("an opened engine takes writes"));
    let before = probe_total(&e);
    drop(e);
    let again = Engine::open(engine_config(dir, false)).unwrap_or_else(|err| {
        panic!("an opened directory opens again (wrote: {written:?}): {err}")
    });
    assert_eq!(
        probe_total(&again),
        before,
        "the probe's total survives a restart"
    );
}

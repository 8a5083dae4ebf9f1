//! One log file's bytes through `wal::reader::scan`, the recovery scan, with every record's
//! payload decoded as recovery does.
//!
//! Input: a flag byte, then the file. Flag bits 0–2 recompute the file header checksum,
//! the frame header checksums and the payload checksums after mutation (see
//! `tally_fuzz::fix_checksums`), so damage reaches the checks behind the CRCs; bit 3 scans
//! it as the log's last file (where a torn tail is allowed); bit 4 expects the sequence
//! number its header names, else 1.
//!
//! Asserts, beyond "no panic": an accepted file's records are numbered on from the
//! expected sequence number without a gap, lie inside the file and account for every byte
//! up to the valid length; a torn tail is reported only in the last file, and exactly
//! covers the bytes after the valid length; and the valid part, scanned again as a file
//! that is not the last, is a clean log with the same records.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tally_engine::wal::payload::decode;
use tally_engine::wal::reader::scan;
use tally_engine::wal::{Corruption, FILE_HEADER_LEN, FRAME_HEADER_LEN};
use tally_fuzz::{Fix, first_seq, fix_checksums};

fn records(
    file: &[u8],
    expected: u64,
    is_last: bool,
) -> (
    Result<tally_engine::wal::reader::FileEnd, tally_engine::wal::WalError>,
    Vec<(u64, usize)>,
) {
    let mut seen = Vec::new();
    let mut visit = |seq: u64, payload: &[u8]| -> Result<(), Corruption> {
        seen.push((seq, payload.len()));
        decode(payload).map(|_| ()).map_err(Corruption::Payload)
    };
    let end = scan(Path::new("fuzz.wal"), file, expected, is_last, &mut visit);
    (end, seen)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut file = rest.to_vec();
    fix_checksums(&mut file, Fix::from_bits(flags));
    let is_last = flags & 8 != 0;
    let expected = if flags & 16 != 0 {
        first_seq(&file).unwrap_or(1)
    } else {
        1
    };
    let (end, seen) = records(&file, expected, is_last);
    let end = match end {
        Ok(end) => end,
        Err(e) => {
            // An error names the file and says what is wrong; printing it cannot fail.
            assert!(e.to_string().starts_with("fuzz.wal: "), "{e}");
            return;
        }
    };
    let valid = end.valid_len as usize;
    assert!(valid <= file.len());
    assert_eq!(end.records as usize, seen.len());
    assert_eq!(end.next_seq, expected + end.records);
    for (i, (seq, _)) in seen.iter().enumerate() {
        assert_eq!(
            *seq,
            expected + i as u64,
            "records are numbered without a gap"
        );
    }
    if valid > 0 {
        let framed: usize = seen.iter().map(|(_, len)| FRAME_HEADER_LEN + len).sum();
        assert_eq!(
            FILE_HEADER_LEN + framed,
            valid,
            "every valid byte is a header or a frame"
        );
    } else {
        assert!(seen.is_empty());
    }
    match &end.torn {
        None => assert_eq!(valid, file.len()),
        Some(t) => {
            assert!(is_last, "a torn tail only in the last file");
            assert_eq!(t.offset, end.valid_len);
            assert_eq!(t.offset + t.dropped_bytes, file.len() as u64);
        }
    }
    if valid >= FILE_HEADER_LEN {
        let (again, seen_again) = records(&file[..valid], expected, false);
        let again = again.expect("the valid part of a log file is a clean log file");
        assert_eq!(again.torn, None);
        assert_eq!(again.valid_len, end.valid_len);
        assert_eq!(seen_again, seen);
    }
});

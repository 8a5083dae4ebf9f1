//! Whole log directories through `Engine::open`: recovery must refuse with an error or
//! recover, never panic — and what it recovers must be a log it can recover again.
//!
//! Input: a flag byte, then one or more log files concatenated (a new file starts at each
//! `TLW\x01` after the first byte). Flag bits 0–2 recompute checksums as in `wal_scan`;
//! bit 3 opens with `accept_data_loss`. Each file is named by the sequence number its
//! header names (a file too short for one is named 1). Asserts, beyond "no panic":
//! - an error prints (the chain a user sees);
//! - once open, a new event is accepted, and the engine opens again — without
//!   `accept_data_loss` — reading the same total for it: recovery leaves a log (torn tail
//!   cut back, an accepted gap closed) that the next start takes as it is.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tally_engine::Engine;
use tally_engine::wal::file_name;
use tally_fuzz::{
    Fix, assert_a_write_survives_a_restart, engine_config, first_seq, fix_checksums, scratch_dir,
    split_files,
};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let root = scratch_dir();
    let dir = root.join("data");
    let wal = dir.join("wal");
    std::fs::create_dir_all(&wal).unwrap();
    for file in split_files(rest).into_iter().take(4) {
        let mut bytes = file.to_vec();
        fix_checksums(&mut bytes, Fix::from_bits(flags));
        let path = file_name(&wal, first_seq(&bytes).unwrap_or(1));
        if !path.exists() {
            std::fs::write(&path, &bytes).unwrap();
        }
    }
    let e = match Engine::open(engine_config(&dir, flags & 8 != 0)) {
        Ok(e) => e,
        Err(err) => {
            assert!(!anyhow_like(&err).is_empty());
            let _ = std::fs::remove_dir_all(&root);
            return;
        }
    };
    assert_a_write_survives_a_restart(e, &dir);
    let _ = std::fs::remove_dir_all(&root);
});

/// The error with its sources, as the CLI prints it with `{:#}`.
fn anyhow_like(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

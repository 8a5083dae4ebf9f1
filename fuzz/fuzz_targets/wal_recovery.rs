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

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Duration, Key, Namespace, RawEvent};
use tally_core::store::{KeyRead, ManualClock, Store, Want};
use tally_engine::wal::file_name;
use tally_engine::{Config, Engine, FsyncPolicy};
use tally_fuzz::{Fix, first_seq, fix_checksums, scratch_dir, split_files};

/// 2026-11-20T00:00:00Z, the clock of the engine's fixtures (the seeds come from them).
const NOW: i64 = 1_795_132_800;

fn config(dir: &Path, accept_data_loss: bool) -> Config {
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
    };
    let data = e.read(&[read]).unwrap().pop().unwrap();
    data.totals.iter().map(|(_, n)| n).sum()
}

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
    let e = match Engine::open(config(&dir, flags & 8 != 0)) {
        Ok(e) => e,
        Err(err) => {
            assert!(!anyhow_like(&err).is_empty());
            let _ = std::fs::remove_dir_all(&root);
            return;
        }
    };
    let probe = RawEvent {
        ns: "fuzzprobe".into(),
        key: "probe".into(),
        ts: Some(NOW - 60),
        n: Some(3),
        dims: Vec::new(),
    };
    // The recovered log may have made the probe invalid (say, a schema with an allow-list
    // for its namespace); then there is nothing to check.
    let written = ingest::prepare(&e, &[probe], NOW, &Limits::default(), &Defaults::default())
        .ok()
        .map(|batch| e.apply(&batch).expect("a recovered engine takes writes"));
    let before = probe_total(&e);
    drop(e);
    let again = Engine::open(config(&dir, false))
        .unwrap_or_else(|err| panic!("a recovered log opens again (wrote: {written:?}): {err}"));
    assert_eq!(
        probe_total(&again),
        before,
        "the probe's total survives a restart"
    );
    drop(again);
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

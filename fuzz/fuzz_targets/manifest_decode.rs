//! One manifest file through `Manifest::decode`, then as the archive of an engine directory
//! through `Engine::open`.
//!
//! Input: a flag byte, then the file. Flag bit 0 rewrites the header's length and checksum
//! to match the payload after mutation, so that damage reaches the payload decoder.
//!
//! Asserts, beyond "no panic": what decodes encodes to bytes that decode to the same
//! manifest, and encoding is deterministic; an engine opened on it either refuses with an
//! error or takes a write that a restart keeps.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Duration, Key, Namespace, RawEvent};
use tally_core::store::{KeyRead, ManualClock, Store, Want};
use tally_engine::manifest::{
    CURRENT, MANIFEST_CRC_OFFSET, MANIFEST_HEADER_LEN, MANIFEST_LEN_OFFSET, Manifest, file_name,
};
use tally_engine::{Config, Engine, FsyncPolicy};
use tally_fuzz::scratch_dir;

/// 2026-11-20T00:00:00Z.
const NOW: i64 = 1_795_132_800;

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.clock = Arc::new(ManualClock::new(NOW));
    c.fsync = FsyncPolicy::Never;
    c.shards = 1;
    c.lock_wait = std::time::Duration::ZERO;
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
    let Some((&flags, file)) = data.split_first() else {
        return;
    };
    let mut bytes = file.to_vec();
    if flags & 1 != 0 && bytes.len() >= MANIFEST_HEADER_LEN {
        let len = (bytes.len() - MANIFEST_HEADER_LEN) as u32;
        let crc = crc32c::crc32c(&bytes[MANIFEST_HEADER_LEN..]);
        bytes[MANIFEST_LEN_OFFSET..][..4].copy_from_slice(&len.to_le_bytes());
        bytes[MANIFEST_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(m) = Manifest::decode(Path::new("fuzz"), &bytes) else {
        return;
    };
    let again = m.encode();
    let back = Manifest::decode(Path::new("fuzz"), &again).expect("an encoded manifest decodes");
    assert_eq!(back, m, "round trip");
    assert_eq!(back.encode(), again, "encoding is deterministic");

    let root = scratch_dir();
    let dir = root.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    let name = file_name(&dir, m.number);
    std::fs::write(&name, &bytes).unwrap();
    let current = format!("{}\n", name.file_name().unwrap().to_string_lossy());
    std::fs::write(dir.join(CURRENT), current).unwrap();
    let Ok(e) = Engine::open(config(&dir)) else {
        let _ = std::fs::remove_dir_all(&root);
        return;
    };
    let probe = RawEvent {
        ns: "fuzzprobe".into(),
        key: "probe".into(),
        ts: Some(NOW - 60),
        n: Some(3),
        dims: Vec::new(),
    };
    // The manifest's schemas may make the probe invalid; then there is nothing to check.
    let written = ingest::prepare(&e, &[probe], NOW, &Limits::default(), &Defaults::default())
        .ok()
        .map(|batch| e.apply(&batch).expect("an opened engine takes writes"));
    let before = probe_total(&e);
    drop(e);
    let again = Engine::open(config(&dir))
        .unwrap_or_else(|err| panic!("an opened archive opens again (wrote: {written:?}): {err}"));
    assert_eq!(probe_total(&again), before, "the probe survives a restart");
    drop(again);
    let _ = std::fs::remove_dir_all(&root);
});

//! What remembered `Idempotency-Key` answers cost the embedded engine: memory per answer, and
//! the time and bytes of a publish (the answers given since the last one go to an answers
//! file; before manifest format 2, each publish rewrote every unexpired answer).
//!
//! ```sh
//! cargo run --release -p tally-bench --features heap -- idempotency answers=1000000
//! ```
//!
//! Each batch is one increment with an answer shaped like the server's: a token-scoped key
//! (`t` + 24 hex digits + `:` + a 36-character UUID-like key), a 24-digit fingerprint and the
//! body `{"accepted":5000}`. The increments fall in a period closed three days ago, so one
//! flush archives them and publishes every answer; a later flush after 1 000 more shows what
//! a publish writes once the answers are on disk.

use std::time::Instant;

use tally_core::model::{Key, Namespace, Schema};
use tally_core::store::{Batch, Clock, IdemRecord, Increment, Store, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};

use crate::heap_bytes;

pub fn bench(args: &[String]) {
    let answers: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("answers="))
        .map_or(1_000_000, |v| v.parse().expect("answers=N"));
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::new(dir.path());
    c.fsync = FsyncPolicy::Never;
    c.max_idempotency_answers = answers + 1_000;
    let engine = Engine::open(c).unwrap();
    let now = SystemClock.now();
    let ns = Namespace::new("bench").unwrap();
    let doc = serde_json::from_str(r#"{"tiers": ["1h:forever"]}"#).unwrap();
    let schema = Schema::from_doc(&doc).unwrap();
    let ts = now - 3 * 86_400;
    let batch = |i: usize| Batch {
        create: if i == 0 {
            vec![(ns.clone(), schema.clone())]
        } else {
            Vec::new()
        },
        increments: vec![Increment {
            ns: ns.clone(),
            key: Key::new("k").unwrap(),
            ts,
            n: 1,
            subtotals: Vec::new(),
        }],
        idempotency: Some(IdemRecord {
            key: format!("t{:024x}:{:08x}-0000-4000-8000-{:012x}", 0x5eed_u128, i, i),
            fingerprint: format!("{:016x}{:08x}", i as u64 * 0x9E37_79B9, i as u32),
            expires: now + 86_400,
            status: 200,
            body: r#"{"accepted":5000}"#.into(),
        }),
    };
    let heap_before = heap_bytes();
    let t = Instant::now();
    for i in 0..answers {
        engine.apply(&batch(i)).unwrap();
    }
    let apply = t.elapsed().as_secs_f64();
    let heap_after = heap_bytes();
    let t = Instant::now();
    let report = engine.flush().unwrap();
    let publish = t.elapsed().as_secs_f64();
    assert!(report.segments > 0, "the closed period was flushed");
    // The manifest, and the answers files beside the segments (format 2).
    let manifest: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("MANIFEST"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
        + std::fs::read_dir(dir.path().join("segments"))
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tla"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum::<u64>();
    let probe = format!("t{:024x}:{:08x}-0000-4000-8000-{:012x}", 0x5eed_u128, 7, 7);
    assert!(
        engine.idempotency(&probe).unwrap().is_some(),
        "an answer is remembered"
    );
    println!("| measurement ({answers} answers) | value |");
    println!("|---|---|");
    println!(
        "| apply, one increment and one answer a batch | {:.0} k batches/s |",
        answers as f64 / apply / 1e3
    );
    if let (Some(a), Some(b)) = (heap_before, heap_after) {
        println!(
            "| heap in use per answer (engine and log buffers included) | {:.0} B |",
            (b.saturating_sub(a)) as f64 / answers as f64
        );
    }
    println!("| flush that publishes every answer | {publish:.2} s |");
    println!(
        "| manifest and answers files, bytes per answer | {:.0} B ({:.1} MB) |",
        manifest as f64 / answers as f64,
        manifest as f64 / 1e6
    );
    // A later publish, with a few new answers: what it writes (files it creates).
    let files = |dir: &std::path::Path| -> Vec<(std::path::PathBuf, u64)> {
        let mut out = Vec::new();
        for d in [dir.to_owned(), dir.join("segments")] {
            for e in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
                let len = e.metadata().map_or(0, |m| m.len());
                out.push((e.path(), len));
            }
        }
        out
    };
    let before = files(dir.path());
    let more = 1_000.min(answers);
    for i in answers..answers + more {
        engine.apply(&batch(i)).unwrap();
    }
    let t = Instant::now();
    engine.flush().unwrap();
    let later = t.elapsed().as_secs_f64();
    let written: u64 = files(dir.path())
        .into_iter()
        .filter(|(p, _)| !before.iter().any(|(b, _)| b == p))
        .map(|(_, len)| len)
        .sum();
    println!(
        "| a later flush, {more} new answers: time, bytes of the files it writes | {later:.3} s, {:.2} MB |",
        written as f64 / 1e6
    );
    let t = Instant::now();
    drop(engine);
    let mut c = Config::new(dir.path());
    c.fsync = FsyncPolicy::Never;
    c.max_idempotency_answers = answers + 1_000;
    let engine = Engine::open(c).unwrap();
    println!(
        "| reopen (manifest with every answer, empty log tail) | {:.2} s |",
        t.elapsed().as_secs_f64()
    );
    assert!(engine.idempotency(&probe).unwrap().is_some());
}

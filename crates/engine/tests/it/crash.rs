//! Crash test: a child process writes batches and prints each one the engine acknowledged;
//! the parent SIGKILLs it at a random moment, reopens the data directory and checks that
//! every acknowledged batch is counted exactly once and every other batch wholly or not at
//! all. Twenty rounds on one directory, so each round also replays all earlier ones.
//!
//! The child is this same test binary, re-run with `TALLY_CRASH_DIR` set and filtered to
//! [`crash_child_process`], which does nothing when that variable is absent.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tally_core::model::Namespace;
use tally_core::store::{KeyList, Store, SystemClock};
use tally_engine::{Config, Engine};

use crate::{raw, read_all, write};

const EVENTS_PER_BATCH: u64 = 8;
const ROUNDS: u64 = 20;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Batch `i` adds `j + 1` to key `b{i}-{j}` for each j, with a country subtotal.
fn batch_events(i: u64) -> Vec<tally_core::model::RawEvent> {
    (0..EVENTS_PER_BATCH)
        .map(|j| {
            raw(
                "crash",
                &format!("b{i}-{j}"),
                now(),
                j as i64 + 1,
                &[("country", &format!("c{}", j % 3))],
            )
        })
        .collect()
}

#[test]
fn crash_child_process() {
    let Ok(dir) = std::env::var("TALLY_CRASH_DIR") else {
        return;
    };
    let base: u64 = std::env::var("TALLY_CRASH_BASE").unwrap().parse().unwrap();
    let writers: u64 = std::env::var("TALLY_CRASH_WRITERS")
        .unwrap()
        .parse()
        .unwrap();
    let mut cfg = Config::new(dir);
    cfg.fsync = std::env::var("TALLY_CRASH_FSYNC").unwrap().parse().unwrap();
    let engine = Arc::new(Engine::open(cfg).unwrap());
    // libtest has already printed "test ... " without a newline: start a line of our own.
    println!("\nTALLY-CRASH-READY");
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut i = base + w;
                loop {
                    write(&*engine, now(), &batch_events(i)).unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {i}").unwrap();
                    out.flush().unwrap();
                    i += writers;
                }
            })
        })
        .collect();
    // The writers run until the parent kills this process.
    drop(threads);
    loop {
        std::thread::park();
    }
}

/// A small deterministic generator, so a failing round can be replayed.
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn acknowledged_batches_survive_sigkill() {
    if std::env::var("TALLY_CRASH_DIR").is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = 0x7a11_u64;
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    for round in 0..ROUNDS {
        let base = round * 1_000_000;
        let writers = 1 + round % 3;
        let fsync = if round % 4 == 3 { "never" } else { "always" };
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash::crash_child_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("TALLY_CRASH_DIR", dir.path())
            .env("TALLY_CRASH_BASE", base.to_string())
            .env("TALLY_CRASH_WRITERS", writers.to_string())
            .env("TALLY_CRASH_FSYNC", fsync)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.ends_with("TALLY-CRASH-READY") {
                    let _ = tx.send(());
                } else if let Some(i) = line.strip_prefix("ack ") {
                    acks.push(i.parse::<u64>().unwrap());
                }
            }
            acks
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the child did not start");
        std::thread::sleep(Duration::from_millis(5 + lcg(&mut rng) % 120));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let round_acks = reader.join().unwrap();
        acked.extend(round_acks.iter().copied());

        let mut cfg = Config::new(dir.path());
        cfg.clock = Arc::new(SystemClock);
        let engine = Engine::open(cfg).unwrap();
        verify(&engine, &acked, round);
        drop(engine);
    }
    assert!(
        acked.len() as u64 >= ROUNDS,
        "too few acknowledged batches to mean anything: {}",
        acked.len()
    );
}

fn verify(engine: &Engine, acked: &BTreeSet<u64>, round: u64) {
    let ns = Namespace::new("crash").unwrap();
    let keys = engine
        .keys(&KeyList {
            ns: &ns,
            prefix: "",
            after: None,
            limit: usize::MAX,
        })
        .unwrap();
    // Group keys by batch: every batch present must be whole and counted once.
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for k in &keys {
        let (i, j) = k.as_str()[1..].split_once('-').unwrap();
        let (i, j): (u64, u64) = (i.parse().unwrap(), j.parse().unwrap());
        let (total, subs) = crate::sums(&read_all(engine, "crash", k.as_str(), 3600));
        assert_eq!(
            total,
            j as i64 + 1,
            "round {round}: key {k} counted {total}"
        );
        assert_eq!(
            subs, total,
            "round {round}: key {k} subtotals {subs} vs total {total}"
        );
        *seen.entry(i).or_default() += 1;
    }
    for (i, n) in &seen {
        assert_eq!(
            *n, EVENTS_PER_BATCH,
            "round {round}: batch {i} is partly present ({n} keys)"
        );
    }
    for i in acked {
        assert!(
            seen.contains_key(i),
            "round {round}: acknowledged batch {i} is missing"
        );
    }
}

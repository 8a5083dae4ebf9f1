//! `tally-bench`: measures the embedded engine on the clickstream workload and prints a
//! Markdown table for docs/benchmarks.md. Run with `--release`:
//!
//! ```sh
//! cargo run --release -p tally-bench -- engine
//! ```
//!
//! Subcommands: `engine`, `replay`, `flush-latency`, `compare`, `http`, `idempotency`, `ratelimit`, `statsd`, `redis-backend`, `archive`, `archive-year`, `export`, `load`, and `soak`
//! and `soak-disk-full` (the crash soak of `scripts/soak.sh`).

// The workspace denies `unsafe`; only the engine has a site that allows it.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod archive;
mod export;
mod floor;
mod flushlat;
mod http;
mod idempotency;
mod ratelimit;
mod redis_backend;
mod redis_peer;
mod soak;
mod statsd;
mod workload;

use std::sync::Arc;
use std::time::Instant;

use tally_core::store::{Batch, Clock, Store, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};

#[cfg(feature = "heap")]
#[global_allocator]
static HEAP: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// Bytes allocated and not yet freed, with `--features heap`.
fn heap_bytes() -> Option<u64> {
    #[cfg(feature = "heap")]
    {
        let s = HEAP.stats();
        Some(s.bytes_allocated.saturating_sub(s.bytes_deallocated) as u64)
    }
    #[cfg(not(feature = "heap"))]
    None
}

/// Anonymous resident memory (heap and stacks, not mapped files), from /proc/self/status.
fn rss_anon_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn open(dir: &std::path::Path, fsync: FsyncPolicy) -> Engine {
    let mut c = Config::new(dir);
    c.fsync = fsync;
    Engine::open(c).unwrap()
}

/// Applies `batches` split over `writers` threads; returns events per second.
fn ingest(engine: &Arc<Engine>, batches: &Arc<Vec<Batch>>, writers: usize) -> f64 {
    let events: usize = batches.iter().map(|b| b.increments.len()).sum();
    let t = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (engine, batches) = (engine.clone(), batches.clone());
            std::thread::spawn(move || {
                for b in batches.iter().skip(w).step_by(writers) {
                    engine.apply(b).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    events as f64 / t.elapsed().as_secs_f64()
}

fn mevents(x: f64) -> String {
    format!("{:.2} M events/s", x / 1e6)
}

/// `tally-bench engine [amount=N] [only=memory]`: `amount` gives every event that amount
/// instead of 1 (a workload of bytes or microseconds, whose counts leave the memtable's
/// narrow entries); `only=memory` skips the apply rates (replay and memory alone).
fn engine_bench(args: &[String]) {
    let memory_only = args.iter().any(|a| a == "only=memory");
    let now = SystemClock.now();
    let shape = workload::Shape::default();
    let nbatches = 2_000;
    let amount: Option<i64> = args
        .iter()
        .find_map(|a| a.strip_prefix("amount="))
        .map(|v| v.parse().expect("amount=N"));
    println!(
        "workload: {} batches x {} events, {} Zipf keys, country ({}) + referrer ({}), tiers 1m:48h + 1h:forever, breakdowns in 1h, amount {}",
        nbatches,
        shape.batch,
        shape.keys,
        shape.countries,
        shape.referrers,
        amount.map_or("1".to_string(), |n| n.to_string())
    );
    let raws = workload::raw_batches(shape, nbatches, now, 42);
    let mut rows: Vec<(String, String)> = Vec::new();

    // Validation alone (core::ingest::prepare), on a scratch engine.
    let scratch = tempfile::tempdir().unwrap();
    let e = open(scratch.path(), FsyncPolicy::Never);
    let t = Instant::now();
    let mut batches = workload::prepare(&e, raws, now);
    let prep = (nbatches * shape.batch) as f64 / t.elapsed().as_secs_f64();
    if let Some(n) = amount {
        for inc in batches.iter_mut().flat_map(|b| b.increments.iter_mut()) {
            inc.n = n;
        }
    }
    let batches = Arc::new(batches);
    rows.push((
        "validate raw events into batches (`ingest::prepare`), 1 thread".into(),
        mevents(prep),
    ));
    drop(e);

    let runs = [
        (FsyncPolicy::Never, 1),
        (FsyncPolicy::Never, 2),
        (FsyncPolicy::Always, 1),
        (FsyncPolicy::Always, 4),
        (FsyncPolicy::Always, 16),
    ];
    for (fsync, writers) in runs.into_iter().filter(|_| !memory_only) {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(open(dir.path(), fsync));
        // Warm the catalog so the figure is steady-state ingest, then measure.
        engine.apply(&batches[0]).unwrap();
        let rate = ingest(&engine, &batches, writers);
        let s = engine.stats();
        rows.push((
            format!(
                "apply, fsync={fsync}, {writers} writer(s) ({} fsyncs)",
                s.wal.fsyncs
            ),
            mevents(rate),
        ));
    }

    // Steady state: the same batches again, so every counter already exists (no map growth).
    for writers in [1, 2].into_iter().filter(|_| !memory_only) {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(open(dir.path(), FsyncPolicy::Never));
        ingest(&engine, &batches, 2);
        let rate = ingest(&engine, &batches, writers);
        rows.push((
            format!("apply again (counters exist: steady state), fsync=never, {writers} writer(s)"),
            mevents(rate),
        ));
    }

    // Replay and memory: load once, reopen, measure.
    let dir = tempfile::tempdir().unwrap();
    let (rss0, heap0) = (rss_bytes(), heap_bytes());
    let engine = Arc::new(open(dir.path(), FsyncPolicy::Never));
    ingest(&engine, &batches, 1);
    let s = engine.stats();
    let (rss1, heap1) = (rss_bytes(), heap_bytes());
    let log_bytes = s.wal.bytes_written;
    drop(engine);
    let t = Instant::now();
    let engine = open(dir.path(), FsyncPolicy::Never);
    let r = engine.recovery().clone();
    let replay = r.events as f64 / t.elapsed().as_secs_f64();
    rows.push((
        format!(
            "replay the log on open ({} events, {:.1} MiB)",
            r.events,
            log_bytes as f64 / (1 << 20) as f64
        ),
        mevents(replay),
    ));
    rows.push((
        "log bytes per event".into(),
        format!("{:.1} B", log_bytes as f64 / r.events as f64),
    ));
    rows.push((
        format!(
            "memory per live counter: counter maps ({} live counters, {} keys, {} series)",
            s.live_counters, s.keys, s.series
        ),
        format!("{:.1} B", s.counter_bytes as f64 / s.live_counters as f64),
    ));
    let per = |b: usize| format!("{:.1} B", b as f64 / s.live_counters as f64);
    let c = s.catalog_bytes;
    rows.push((
        "memory per live counter: catalog (keys / subtotal series / names)".into(),
        format!(
            "{} ({} / {} / {})",
            per(c.total()),
            per(c.keys),
            per(c.series),
            per(c.strings)
        ),
    ));
    rows.push((
        "memory per live counter: whole-process RSS growth (maps + catalog + allocator)".into(),
        format!(
            "{:.1} B",
            rss1.saturating_sub(rss0) as f64 / s.live_counters as f64
        ),
    ));
    if let (Some(h0), Some(h1)) = (heap0, heap1) {
        // Exact where RSS is not (allocator slack, pages the kernel has not handed back).
        rows.push((
            "memory per live counter: heap in use (`--features heap`)".into(),
            format!(
                "{:.1} B",
                h1.saturating_sub(h0) as f64 / s.live_counters as f64
            ),
        ));
    }
    drop(engine);

    println!("\n| measurement | result |\n|---|---|");
    for (what, v) in rows {
        println!("| {what} | {v} |");
    }
}

/// Apply (one writer, fsync=never, fresh engine) and replay on open, each `runs` times on the
/// same 2 000 batches, with the median of each: for comparing two builds, whose single runs
/// differ by more than the change being measured on this shared machine.
///
/// `tally-bench replay [runs=7]`
fn replay_bench(args: &[String]) {
    let runs: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("runs="))
        .map_or(7, |v| v.parse().expect("runs=N"))
        .max(1);
    let now = SystemClock.now();
    let shape = workload::Shape::default();
    let raws = workload::raw_batches(shape, 2_000, now, 42);
    let scratch = tempfile::tempdir().unwrap();
    let batches = {
        let e = open(scratch.path(), FsyncPolicy::Never);
        Arc::new(workload::prepare(&e, raws, now))
    };
    let (mut apply, mut replay) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(open(dir.path(), FsyncPolicy::Never));
        apply.push(ingest(&engine, &batches, 1));
        drop(engine);
        let t = Instant::now();
        let engine = open(dir.path(), FsyncPolicy::Never);
        replay.push(engine.recovery().events as f64 / t.elapsed().as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.2}", x / 1e6))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("| measurement ({runs} runs, 2 000 000 events) | median | every run, M events/s |");
    println!("|---|---|---|");
    let rows = [
        ("apply, fsync=never, 1 writer", &mut apply),
        ("replay the log on open", &mut replay),
    ];
    for (what, v) in rows {
        let all = list(v);
        println!("| {what} | {} | {all} |", mevents(median(v)));
    }
}

/// tally and Redis (the seeds' scheme) on the same batches, same run, same writer count.
fn compare_bench() {
    let now = SystemClock.now();
    let shape = workload::Shape::default();
    let nbatches = 1_000;
    let raws = workload::raw_batches(shape, nbatches, now, 7);
    let scratch = tempfile::tempdir().unwrap();
    let batches = {
        let e = open(scratch.path(), FsyncPolicy::Never);
        Arc::new(workload::prepare(&e, raws, now))
    };
    let events = nbatches * shape.batch;
    println!(
        "workload: {nbatches} batches x {} events (clickstream), 2 writers / 2 connections",
        shape.batch
    );
    println!(
        "\n| durability | tally (embedded) | Redis, seeds' scheme | tally / Redis |\n|---|---|---|---|"
    );
    for (tally_fsync, redis_fsync, label) in [
        (
            FsyncPolicy::Never,
            None,
            "none (tally fsync=never; Redis no AOF)",
        ),
        (
            FsyncPolicy::Always,
            Some("always"),
            "every ack (tally fsync=always; Redis appendfsync always)",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(open(dir.path(), tally_fsync));
        let t = ingest(&engine, &batches, 2);
        let check_key = batches[0].increments[0].key.to_string();
        let tally_total = tally_hour_total(&engine, &check_key);
        drop(engine);
        let server = match redis_peer::Server::start(redis_fsync) {
            Ok(s) => s,
            Err(e) => {
                println!(
                    "| {label} | {} | skipped: {e} (apt-get install redis-server) | |",
                    mevents(t)
                );
                continue;
            }
        };
        let start = Instant::now();
        let threads: Vec<_> = (0..2)
            .map(|w| {
                let batches = batches.clone();
                let port = server.port;
                std::thread::spawn(move || {
                    let mine: Vec<&Batch> = batches.iter().skip(w).step_by(2).collect();
                    redis_peer::run(port, &mine).unwrap()
                })
            })
            .collect();
        let done: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let r = done as f64 / start.elapsed().as_secs_f64();
        assert_eq!(done, events);
        let windows: Vec<i64> = (0..3)
            .map(|i| now / (30 * 86_400) * (30 * 86_400) - i * 30 * 86_400)
            .collect();
        let redis_total =
            redis_peer::hour_total(server.port, "clicks", &check_key, &windows).unwrap();
        assert_eq!(
            tally_total, redis_total,
            "tally and Redis disagree on key {check_key}"
        );
        println!(
            "| {label} | {} | {} | {:.1}x |",
            mevents(t),
            mevents(r),
            t / r
        );
    }
}

/// One key's total over all of the hourly tier.
pub(crate) fn tally_hour_total(engine: &Engine, key: &str) -> i64 {
    use tally_core::model::{Duration, Key, Namespace};
    use tally_core::store::{KeyRead, Want};
    let (ns, key) = (Namespace::new("clicks").unwrap(), Key::new(key).unwrap());
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: Duration::from_secs(3600).unwrap(),
        from: 0,
        to: 1 << 32,
        want: Want::Totals,
        sum_subtotals: false,
        keep: None,
    };
    engine.read(&[read]).unwrap()[0]
        .totals
        .iter()
        .map(|(_, n)| n)
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("engine") | None => engine_bench(rest),
        Some("replay") => replay_bench(rest),
        Some("floor") => floor::bench(rest),
        Some("compare") => compare_bench(),
        Some("http") => http::bench(rest),
        Some("export") => export::bench(rest),
        Some("load") => export::load_bench(rest),
        Some("ratelimit") => ratelimit::bench(rest),
        Some("idempotency") => idempotency::bench(rest),
        Some("statsd") => statsd::bench(),
        Some("redis-backend") => redis_backend::bench(rest),
        Some("archive") => archive::bench(rest),
        Some("archive-year") => archive::year_bench(rest),
        Some("archive-queries") => archive::queries_bench(rest),
        Some("soak") => soak::run(rest),
        Some("flush-latency") => flushlat::bench(rest),
        Some("soak-disk-full") => soak::disk_full(rest),
        Some(other) => {
            eprintln!(
                "unknown benchmark {other:?}; known: engine, replay, floor, flush-latency, compare, http, idempotency, export, load, ratelimit, statsd, redis-backend, archive, archive-year, archive-queries, soak, soak-disk-full"
            );
            std::process::exit(2);
        }
    }
}

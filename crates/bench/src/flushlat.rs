//! How long writes wait while a flush freezes closed periods (each shard's lock is held while
//! its counters of those periods move to the frozen arrays), at a given shard count.
//!
//! ```sh
//! tally-bench flush-latency [events=N] [shards=8,64] [runs=R] [readers=N] [late=1]
//! ```
//!
//! Per shard count and run: a fresh engine (`fsync=never`) takes `events` clickstream
//! events spread over the two UTC days before today (closed, so the flush takes them), then
//! one writer applies batches of 1 000 events of the open hour, one after another, timing
//! each, while the main thread runs one `flush` 300 ms in. Batches that overlapped the flush
//! are reported apart from those that did not. With `readers=N`, N threads also read a
//! key's hourly totals over the three days to now, back to back (each read holds the
//! archive's lock shared while it reads memory, which the flush takes exclusively to swap
//! in the new archive); their count is reported. With `late=1` the writer's events are
//! late ones, for the two days the flush freezes, instead of the open hour's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tally_core::store::{Clock, Store, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};

use crate::workload;

const DAY: i64 = 86_400;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The `q` quantile of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub fn bench(args: &[String]) {
    let events: usize = arg(args, "events").map_or(4_000_000, |v| v.parse().expect("events=N"));
    let runs: usize = arg(args, "runs").map_or(2, |v| v.parse().expect("runs=N"));
    let readers: usize = arg(args, "readers").map_or(0, |v| v.parse().expect("readers=N"));
    // late=1: the writer's events are late ones, for the two days the flush freezes.
    let late = arg(args, "late").is_some_and(|v| v == "1");
    let shard_counts: Vec<usize> = arg(args, "shards")
        .unwrap_or_else(|| "8,64".into())
        .split(',')
        .map(|s| s.parse().expect("shards=A,B"))
        .collect();
    let now = SystemClock.now();
    let today = now - now.rem_euclid(DAY);
    let shape = workload::Shape::default();
    let mut g = workload::Generator::new(shape, 11);
    let fill_raw = g.span(today - 2 * DAY, 2 * DAY, events);
    // The open hour only: events of a period being frozen wait for the freeze (late ones,
    // in service), which is not what this measures.
    let hour = now - now.rem_euclid(3600);
    let live_raw = if late {
        workload::Generator::new(shape, 12).span(today - 2 * DAY, 2 * DAY, 3_000_000)
    } else {
        workload::Generator::new(shape, 12).span(hour, (now - hour).max(1), 3_000_000)
    };
    println!(
        "workload: {events} events over the two UTC days before today (flushed), then batches \
         of {} events of {} applied one at a time while one flush runs; fsync=never",
        shape.batch,
        if late {
            "those two days (late events)"
        } else {
            "the open hour"
        }
    );
    println!(
        "\n| shards | run | flush took | counters frozen (data points) | batches during the flush: n, p50 / p99 / max | batches outside it: n, p50 / p99 / max |\n|---|---|---|---|---|---|"
    );
    for &shards in &shard_counts {
        for run in 1..=runs {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut c = Config::new(dir.path());
            c.fsync = FsyncPolicy::Never;
            c.shards = shards;
            let engine = Arc::new(Engine::open(c).expect("open"));
            for b in workload::prepare(engine.as_ref(), fill_raw.clone(), now) {
                engine.apply(&b).expect("apply");
            }
            let live = Arc::new(workload::prepare(engine.as_ref(), live_raw.clone(), now));
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let (engine, live, stop) = (engine.clone(), live.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut timed = Vec::new();
                    for b in live.iter().cycle() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let t = Instant::now();
                        engine.apply(b).expect("apply");
                        timed.push((t, t.elapsed()));
                    }
                    timed
                })
            };
            let reading: Vec<_> = (0..readers)
                .map(|r| {
                    let (engine, stop) = (engine.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut reads = 0u64;
                        while !stop.load(Ordering::SeqCst) {
                            let key = format!("lnk_{}", (reads as usize * 7 + r) % 1000);
                            read_days(&engine, &key, now);
                            reads += 1;
                        }
                        reads
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(300));
            let t0 = Instant::now();
            let report = engine.flush().expect("flush");
            let t1 = Instant::now();
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::SeqCst);
            let timed = writer.join().expect("writer");
            let reads: u64 = reading.into_iter().map(|t| t.join().expect("reader")).sum();
            if readers > 0 {
                println!("({readers} readers: {reads} reads in all)");
            }
            // FL_DEBUG=MS lists the batches slower than MS (100 when not a number).
            if let Ok(ms) = std::env::var("FL_DEBUG") {
                let ms: u128 = ms.parse().unwrap_or(100);
                let mut slow: Vec<_> = timed.iter().filter(|(_, d)| d.as_millis() > ms).collect();
                slow.sort_by_key(|(s, _)| *s);
                for (st, d) in slow {
                    eprintln!(
                        "slow batch at {:?} after flush start: {:?}",
                        st.saturating_duration_since(t0),
                        d
                    );
                }
                eprintln!("batches {}, flush {:?}", timed.len(), t1 - t0);
            }
            let (mut during, mut outside): (Vec<Duration>, Vec<Duration>) =
                (Vec::new(), Vec::new());
            for (start, took) in timed {
                if start + took >= t0 && start <= t1 {
                    during.push(took);
                } else {
                    outside.push(took);
                }
            }
            during.sort_unstable();
            outside.sort_unstable();
            let row = |v: &[Duration]| {
                format!(
                    "{}, {} / {} / {}",
                    v.len(),
                    ms(quantile(v, 0.5)),
                    ms(quantile(v, 0.99)),
                    ms(v.last().copied().unwrap_or_default())
                )
            };
            println!(
                "| {shards} | {run} | {} | {} | {} | {} |",
                ms(t1 - t0),
                report.data_points,
                row(&during),
                row(&outside)
            );
        }
    }
}

/// One key's hourly totals over the three UTC days to `now`.
fn read_days(engine: &Engine, key: &str, now: i64) {
    use tally_core::model::{Duration, Key, Namespace};
    use tally_core::store::{KeyRead, Want};
    let (ns, key) = (Namespace::new("clicks").unwrap(), Key::new(key).unwrap());
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: Duration::from_secs(3600).unwrap(),
        from: now - now.rem_euclid(DAY) - 2 * DAY,
        to: now + 1,
        want: Want::Totals,
        sum_subtotals: false,
        keep: None,
    };
    engine.read(&[read]).expect("read");
}

//! Issue 10's benchmark: the same clickstream events (a) as the seeds' scheme on Redis
//! directly (`redis_peer`, pipelined per batch), (b) through tally over HTTP with the Redis
//! backend (an in-process server whose store is a `RedisStore` on its own fresh
//! `redis-server`), and (c) through tally over HTTP on the embedded engine. Ingest rate, Redis
//! memory per data point for (a) and (b), and series / breakdown / top latency.
//!
//! A **data point** is one counter of one series and bucket, subtotals included: one
//! (key, minute), one (key, hour) and one (key, hour, dimension, value) for this workload's
//! schema (`1m:48h`, `1h:forever`, breakdowns in `1h`). Both layouts keep each as exactly one
//! hash field, so the harness counts them the same way in both: `SCAN … TYPE hash` over the
//! data hashes and the sum of their `HLEN`s — and checks that against the distinct points the
//! events make.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_core::store::{Batch, Clock, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};

use crate::http::{Conn, Running, RunningStore, ndjson};
use crate::redis_peer::{self, Client};
use crate::workload;

const CONNS: usize = 4;
const BUSY_KEYS: usize = 20;
const QUERIES: usize = 300;
const WARM_QUERIES: usize = 20;
/// A query kind stops early once this much time has gone into it (a `top` scans every key).
const QUERY_BUDGET: Duration = Duration::from_secs(60);

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

fn mrate_row(x: f64) -> String {
    format!("{:.3} M events/s", x / 1e6)
}

/// CPU seconds this process has used (user + system), every thread (in clock ticks of
/// 1/100 s, what Linux reports on the machines tally runs on).
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// `INFO commandstats` as (command, calls, µs), the costliest first.
fn command_stats(info: &str) -> Vec<(String, u64, f64)> {
    let mut out: Vec<(String, u64, f64)> = info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            Some((name.to_string(), field("calls")? as u64, field("usec")?))
        })
        .collect();
    out.sort_by(|a, b| b.2.total_cmp(&a.2));
    out
}

fn mrate(events: usize, d: Duration) -> f64 {
    events as f64 / d.as_secs_f64()
}

/// The distinct data points the batches make (see the module's doc).
fn data_points(batches: &[Batch]) -> usize {
    let mut minutes = HashSet::new();
    let mut hours = HashSet::new();
    let mut subs = HashSet::new();
    for inc in batches.iter().flat_map(|b| &b.increments) {
        let key = inc.key.to_string();
        minutes.insert((key.clone(), inc.ts / 60));
        hours.insert((key.clone(), inc.ts / 3600));
        for s in &inc.subtotals {
            subs.insert((key.clone(), inc.ts / 3600, s.dim.clone(), s.value.clone()));
        }
    }
    minutes.len() + hours.len() + subs.len()
}

/// POSTs `bodies[1..]` over `CONNS` connections (body 0 was the untimed warm-up).
fn post_all(addr: std::net::SocketAddr, bodies: &Arc<Vec<Vec<u8>>>) -> Duration {
    let t = Instant::now();
    let threads: Vec<_> = (0..CONNS)
        .map(|c| {
            let bodies = bodies.clone();
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                for b in bodies.iter().skip(1 + c).step_by(CONNS) {
                    let (st, body) = conn.request("POST", "/v1/events", "application/x-ndjson", b);
                    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
                }
            })
        })
        .collect();
    for th in threads {
        th.join().expect("client");
    }
    t.elapsed()
}

struct Latency {
    p50: Duration,
    p99: Duration,
    n: usize,
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if self.n < QUERIES {
            write!(
                f,
                "{:.2} / {:.2} ms ({} queries)",
                ms(self.p50),
                ms(self.p99),
                self.n
            )
        } else {
            write!(f, "{:.2} / {:.2} ms", ms(self.p50), ms(self.p99))
        }
    }
}

/// Times `run(i)` for `WARM_QUERIES` untimed then up to `QUERIES` timed calls.
fn measure(mut run: impl FnMut(usize)) -> Latency {
    for i in 0..WARM_QUERIES {
        run(i);
    }
    let start = Instant::now();
    let mut lat = Vec::new();
    for i in 0..QUERIES {
        let t = Instant::now();
        run(i);
        lat.push(t.elapsed());
        if start.elapsed() > QUERY_BUDGET {
            break;
        }
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Latency {
        p50: pct(0.5),
        p99: pct(0.99),
        n: lat.len(),
    }
}

/// The three query kinds as HTTP paths, query `i` on busy key `i % BUSY_KEYS`.
struct Queries {
    m0: i64,
    m1: i64,
    h0: i64,
    h1: i64,
}

impl Queries {
    fn series(&self, i: usize) -> String {
        format!(
            "/v1/ns/clicks/keys/lnk_{}/series?from={}&to={}&unit=minute",
            i % BUSY_KEYS,
            self.m0,
            self.m1
        )
    }
    fn breakdown(&self, i: usize) -> String {
        format!(
            "/v1/ns/clicks/keys/lnk_{}/breakdown?dim=referrer&from={}&to={}&limit=10",
            i % BUSY_KEYS,
            self.h0,
            self.h1
        )
    }
    fn top(&self, i: usize) -> String {
        // Alternate between all traffic and one country's, so the answer is not one cached value.
        if i.is_multiple_of(2) {
            format!("/v1/ns/clicks/top?from={}&to={}&limit=10", self.h0, self.h1)
        } else {
            format!(
                "/v1/ns/clicks/top?from={}&to={}&limit=10&dim=country&value=C{}",
                self.h0,
                self.h1,
                i % 5
            )
        }
    }
}

fn http_latency(addr: std::net::SocketAddr, path: impl Fn(usize) -> String) -> (Latency, Vec<u8>) {
    let mut conn = Conn::open(addr);
    let (st, first) = conn.request("GET", &path(0), "text/plain", b"");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&first));
    let lat = measure(|i| {
        let (st, body) = conn.request("GET", &path(i), "text/plain", b"");
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    });
    (lat, first)
}

/// The seeds' scheme's series query: the minute hash of each day the range touches (one
/// pipelined round trip), the fields in range as per-minute counts.
fn peer_series(client: &mut Client, key: &str, from: i64, to: i64) -> Vec<(i64, i64)> {
    const DAY: i64 = 86_400;
    let cmds: Vec<Vec<String>> = (from / DAY..=(to - 1) / DAY)
        .map(|d| vec!["HGETALL".into(), format!("{{clicks|{key}}}:1m:{}", d * DAY)])
        .collect();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for r in client.pipeline(&cmds).expect("redis") {
        for kv in r.items().chunks(2) {
            let (t, n) = (kv[0].int(), kv[1].int());
            if (from..to).contains(&t) {
                out.push((t, n));
            }
        }
    }
    out.sort();
    out
}

struct Memory {
    grown: u64,
    hashes: usize,
    points: u64,
    keys: i64,
}

fn memory(client: &mut Client, before: u64, pattern: &str) -> Memory {
    let after = client.used_memory().expect("INFO");
    let (hashes, points) = client.hash_fields(pattern).expect("SCAN");
    let keys = client.cmd(&["DBSIZE"]).expect("DBSIZE").int();
    Memory {
        grown: after.saturating_sub(before),
        hashes,
        points,
        keys,
    }
}

pub fn bench(args: &[String]) {
    let events = arg(args, "events", 1_000_000);
    let now = SystemClock.now();
    let shape = workload::Shape {
        batch: arg(args, "batch", 1_000).clamp(1, 100_000),
        ..workload::Shape::default()
    };
    let nbatches = events.div_ceil(shape.batch).max(2);
    let raws = workload::raw_batches(shape, nbatches, now, 10);
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(raws.iter().map(|r| ndjson(r)).collect());
    let scratch = tempfile::tempdir().expect("tempdir");
    let batches: Arc<Vec<Batch>> = {
        let e = Engine::open(Config::new(scratch.path())).expect("open");
        Arc::new(workload::prepare(&e, raws, now))
    };
    let events = nbatches * shape.batch;
    let timed = events - batches[0].increments.len();
    let expected_points = data_points(&batches);
    println!(
        "workload: {nbatches} batches x {} clickstream events ({} Zipf keys, country + referrer), \
         timestamps in the hour before now; batch 0 is an untimed warm-up, the other {timed} \
         events are timed; {CONNS} connections for each of (a), (b), (c); {expected_points} \
         distinct data points",
        shape.batch, shape.keys
    );

    // (a) The seeds' scheme on Redis, pipelined per batch.
    let a_server = redis_peer::Server::start(None)
        .unwrap_or_else(|e| panic!("redis-server: {e} (apt-get install redis-server)"));
    let mut a_client = Client::open(a_server.port).expect("redis");
    let before = a_client.used_memory().expect("INFO");
    redis_peer::run(a_server.port, &[&batches[0]]).expect("redis");
    let cpu0 = a_client.cpu_seconds().expect("INFO");
    a_client
        .cmd(&["CONFIG", "RESETSTAT"])
        .expect("CONFIG RESETSTAT");
    let t = Instant::now();
    let threads: Vec<_> = (0..CONNS)
        .map(|w| {
            let (batches, port) = (batches.clone(), a_server.port);
            std::thread::spawn(move || {
                let mine: Vec<&Batch> = batches.iter().skip(1 + w).step_by(CONNS).collect();
                redis_peer::run(port, &mine).expect("redis")
            })
        })
        .collect();
    let done: usize = threads.into_iter().map(|t| t.join().expect("client")).sum();
    assert_eq!(done, timed);
    let a_wall = t.elapsed();
    let a_busy = (a_client.cpu_seconds().expect("INFO") - cpu0) / a_wall.as_secs_f64();
    let a_rate = mrate(timed, a_wall);
    let a_stats = a_client
        .cmd(&["INFO", "commandstats"])
        .expect("INFO")
        .text();
    let a_mem = memory(&mut a_client, before, "*");

    // (b) tally over HTTP on the Redis backend, on its own fresh redis-server.
    let b_server = redis_peer::Server::start(None).expect("redis-server");
    let mut b_client = Client::open(b_server.port).expect("redis");
    let store = tally_redis::RedisStore::connect(&format!("redis://127.0.0.1:{}/0", b_server.port))
        .expect("RedisStore");
    let before = b_client.used_memory().expect("INFO");
    let b = RunningStore::over(Arc::new(store));
    Conn::open(b.addr).request("POST", "/v1/events", "application/x-ndjson", &bodies[0]);
    let cpu0 = b_client.cpu_seconds().expect("INFO");
    b_client
        .cmd(&["CONFIG", "RESETSTAT"])
        .expect("CONFIG RESETSTAT");
    let self0 = process_cpu();
    let b_wall = post_all(b.addr, &bodies);
    let b_busy = (b_client.cpu_seconds().expect("INFO") - cpu0) / b_wall.as_secs_f64();
    let b_self = (process_cpu() - self0) / b_wall.as_secs_f64();
    let b_rate = mrate(timed, b_wall);
    let b_stats = b_client
        .cmd(&["INFO", "commandstats"])
        .expect("INFO")
        .text();
    let b_mem = memory(&mut b_client, before, "tally:w:*");
    if args.iter().any(|a| a == "only=ingest") {
        println!(
            "| ingest | (a) {} | (b) {} | (b)/(a) {:.2}× |\n| CPU, share of one core | (a) redis {:.0}% | (b) redis {:.0}%, tally server and client {:.0}% | |",
            mrate_row(a_rate),
            mrate_row(b_rate),
            b_rate / a_rate,
            a_busy * 100.0,
            b_busy * 100.0,
            b_self * 100.0
        );
        for (side, stats) in [("(a)", &a_stats), ("(b)", &b_stats)] {
            println!(
                "\n{side}'s Redis commands during the ingest (`INFO commandstats`; a script's \
                 time includes the commands it calls), per timed event:"
            );
            for (cmd, calls, usec) in command_stats(stats) {
                println!(
                    "  {cmd:<16} {calls:>9} calls  {:>6.3} µs/event  {:>6.2} calls/event  {:>6.2} µs/call",
                    usec / timed as f64,
                    calls as f64 / timed as f64,
                    usec / calls.max(1) as f64
                );
            }
        }
        return;
    }

    // (c) tally over HTTP on the embedded engine (no fsync, as Redis runs without AOF).
    let c = Running::start(FsyncPolicy::Never);
    Conn::open(c.addr).request("POST", "/v1/events", "application/x-ndjson", &bodies[0]);
    let c_rate = mrate(timed, post_all(c.addr, &bodies));

    // Queries: busy keys (the Zipf head), the last hour.
    let q = Queries {
        m0: (now - 3600) / 60 * 60,
        m1: now / 60 * 60 + 60,
        h0: (now - 3600) / 3600 * 3600,
        h1: now / 3600 * 3600 + 3600,
    };
    let mut answers_agree = Vec::new();
    let mut lat = Vec::new();
    for (kind, path) in [
        ("series", &(|i| q.series(i)) as &dyn Fn(usize) -> String),
        ("breakdown", &|i| q.breakdown(i)),
        ("top", &|i| q.top(i)),
    ] {
        let (lb, ab) = http_latency(b.addr, path);
        let (lc, ac) = http_latency(c.addr, path);
        if ab != ac {
            answers_agree.push(format!(
                "{kind}: (b) and (c) answer differently:\n  (b) {}\n  (c) {}",
                String::from_utf8_lossy(&ab),
                String::from_utf8_lossy(&ac)
            ));
        }
        lat.push((kind, lb, lc));
    }
    // (a) answers the series query from its minute hashes; check it against the events.
    let lnk0: i64 = batches
        .iter()
        .flat_map(|b| &b.increments)
        .filter(|i| i.key.to_string() == "lnk_0" && (q.m0..q.m1).contains(&i.ts))
        .map(|i| i.n)
        .sum();
    let got: i64 = peer_series(&mut a_client, "lnk_0", q.m0, q.m1)
        .iter()
        .map(|p| p.1)
        .sum();
    assert_eq!(got, lnk0, "the seeds' scheme lost events of lnk_0");
    let a_series = measure(|i| {
        let key = format!("lnk_{}", i % BUSY_KEYS);
        std::hint::black_box(peer_series(&mut a_client, &key, q.m0, q.m1));
    });

    let per = |m: &Memory| m.grown as f64 / m.points as f64;
    println!(
        "\n| measurement | (a) Redis, seeds' scheme | (b) tally, Redis backend, HTTP | (c) tally, embedded, HTTP |\n|---|---|---|---|"
    );
    println!(
        "| ingest ({timed} events, {CONNS} connections) | {} | {} | {} |",
        mrate_row(a_rate),
        mrate_row(b_rate),
        mrate_row(c_rate)
    );
    println!(
        "| redis-server CPU during ingest (`INFO cpu`, share of one core) | {:.0}% | {:.0}% | n/a |",
        a_busy * 100.0,
        b_busy * 100.0
    );
    println!(
        "| Redis `used_memory` growth | {:.1} MiB | {:.1} MiB | n/a |",
        a_mem.grown as f64 / (1 << 20) as f64,
        b_mem.grown as f64 / (1 << 20) as f64
    );
    println!(
        "| data points held (hash fields; {expected_points} expected) | {} in {} hashes | {} in {} hashes | n/a |",
        a_mem.points, a_mem.hashes, b_mem.points, b_mem.hashes
    );
    println!(
        "| keys in Redis (`DBSIZE`) | {} | {} | n/a |",
        a_mem.keys, b_mem.keys
    );
    println!(
        "| **Redis memory per data point** | {:.1} B | {:.1} B | n/a |",
        per(&a_mem),
        per(&b_mem)
    );
    for (kind, lb, lc) in &lat {
        let a = if *kind == "series" {
            format!("{a_series} (direct RESP, no HTTP)")
        } else {
            "n/a".to_string()
        };
        println!("| {kind} p50 / p99 | {a} | {lb} | {lc} |");
    }
    println!("\n| target | measured | verdict |\n|---|---|---|");
    let ingest = b_rate / a_rate;
    println!(
        "| (b) ≥ 3× (a) on ingest | {ingest:.2}× | {} |",
        if ingest >= 3.0 { "met" } else { "missed" }
    );
    let mem = per(&b_mem) / per(&a_mem);
    println!(
        "| Redis memory per data point of (b) ≤ ½ of (a)'s | {mem:.2}× | {} |",
        if mem <= 0.5 { "met" } else { "missed" }
    );
    if a_mem.points != expected_points as u64 || b_mem.points != expected_points as u64 {
        println!("\nwarning: data point counts differ from the events' {expected_points}");
    }
    if answers_agree.is_empty() {
        println!("\n(b) and (c) gave byte-identical answers to the first query of each kind.");
    }
    for a in answers_agree {
        println!("\n{a}");
    }
}

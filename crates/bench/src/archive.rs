//! The archive benchmark (issue 8): days of clickstream traffic applied hour by hour under a
//! manual clock, once into an engine that flushes closed periods into archive segments and
//! once into an engine that never flushes (everything in memory, everything in the log).
//! Measures archive bytes per data point by tier, restart time, ingest and replay with
//! flushing on, memory per live counter, and query latency read from the archive against
//! the same queries answered from memory. Every query's answer is checked equal on both
//! engines, so the figures compare the same work.
//!
//! ```sh
//! cargo run --release -p tally-bench -- archive        # 20 M events over 30 days
//! cargo run --release -p tally-bench -- archive-year   # a lighter year: restart vs history
//! ```
//!
//! Both take `events=N days=D keys=K` to scale the run (quick checks).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_core::query::{self, BreakdownQuery, Ctx, SeriesQuery, TopQuery};
use tally_core::store::{Clock, ManualClock, Store};
use tally_engine::segment::Segment;
use tally_engine::{Config, Engine, FlushPolicy, FlushReport, FsyncPolicy};

use crate::http::{Conn, Running};
use crate::workload::{self, Generator, Shape};
use crate::{heap_bytes, mevents, rss_anon_bytes, rss_bytes};

const DAY: i64 = 86_400;
const HOUR: i64 = 3_600;
const TZ: &str = "America/New_York";

/// How much traffic, over how long.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    events: usize,
    days: i64,
    shape: Shape,
    /// First instant of the traffic (a UTC midnight).
    start: i64,
    seed: u64,
}

impl Scenario {
    fn end(&self) -> i64 {
        self.start + self.days * DAY
    }

    /// `key=value` arguments after the subcommand override the defaults.
    fn with_args(mut self, args: &[String]) -> Scenario {
        for a in args
            .iter()
            .filter(|a| !a.starts_with("dir=") && !a.starts_with("only="))
        {
            let (k, v) = a
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {a}"));
            let n: usize = v
                .replace('_', "")
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {a}"));
            match k {
                "events" => self.events = n,
                "days" => self.days = n as i64,
                "keys" => self.shape.keys = n,
                _ => panic!("unknown setting {k:?}; known: events, days, keys"),
            }
        }
        self
    }
}

/// A result row: what, then the flushing engine's figure and the log-only engine's.
type Row = (String, String, String);

fn row(what: impl Into<String>, archive: impl Into<String>, log: impl Into<String>) -> Row {
    (what.into(), archive.into(), log.into())
}

const NA: &str = "—";

fn open(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    let mut c = Config::new(dir);
    c.fsync = FsyncPolicy::Never;
    c.clock = clock.clone();
    c.flush = FlushPolicy::default();
    Engine::open(c).expect("open")
}

/// What feeding the scenario into one engine measured.
#[derive(Debug, Default)]
struct Fed {
    apply: Duration,
    /// Flush and compaction together.
    flush: Duration,
    /// Of which compaction.
    compact: Duration,
    flushes: usize,
    slowest_flush: Duration,
    /// Time in flush, per simulated day: does a flush get slower as the catalog grows?
    flush_by_day: Vec<Duration>,
    flushed: FlushReport,
    sweep: Duration,
    rss_growth: u64,
    anon_growth: u64,
    /// With `--features heap`: live heap bytes added over the feed, and the most the heap
    /// held above its start at any sample.
    heap_growth: Option<u64>,
    heap_peak: Option<u64>,
}

/// Samples the live heap every millisecond on a thread of its own until dropped; keeps the
/// largest sample.
struct HeapPeak {
    peak: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HeapPeak {
    fn start() -> HeapPeak {
        use std::sync::atomic::Ordering::Relaxed;
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = crate::heap_bytes().is_some().then(|| {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    peak.fetch_max(crate::heap_bytes().unwrap_or(0), Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        });
        HeapPeak { peak, stop, thread }
    }

    fn peak(mut self) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        self.stop.store(true, Relaxed);
        let t = self.thread.take()?;
        t.join().ok()?;
        Some(self.peak.load(Relaxed))
    }
}

/// Applies the scenario hour by hour, the clock at each hour's end; with `flush`, flushes and
/// compacts after every hour (what a server's periodic housekeeping does), else sweeps once a
/// day.
fn feed(engine: &Engine, clock: &ManualClock, sc: &Scenario, flush: bool) -> Fed {
    let mut fed = Fed::default();
    let (rss0, anon0, heap0) = (rss_bytes(), rss_anon_bytes(), heap_bytes());
    let sampler = HeapPeak::start();
    let mut generator = Generator::new(sc.shape, sc.seed);
    let hours = (sc.days * 24) as usize;
    for h in 0..hours {
        let t0 = sc.start + h as i64 * HOUR;
        let t1 = t0 + HOUR;
        clock.set(t1);
        // Spread the events evenly over the hours, remainder included.
        let n = sc.events * (h + 1) / hours - sc.events * h / hours;
        let raws = generator.span(t0, HOUR, n);
        let batches = workload::prepare(engine, raws, t1);
        let t = Instant::now();
        for b in &batches {
            engine.apply(b).expect("apply");
        }
        fed.apply += t.elapsed();
        if flush {
            let t = Instant::now();
            let r = engine.flush_closed(t1).expect("flush");
            // What a server does every minute after its flush: merge deltas, merge the days
            // of a month over for a day, drop what retention no longer keeps.
            let c = Instant::now();
            engine.compact().expect("compact");
            fed.compact += c.elapsed();
            let took = t.elapsed();
            fed.flush += took;
            if h % 24 == 0 {
                fed.flush_by_day.push(Duration::ZERO);
            }
            if let Some(d) = fed.flush_by_day.last_mut() {
                *d += took;
            }
            if r.segments > 0 {
                fed.flushes += 1;
                fed.slowest_flush = fed.slowest_flush.max(took);
            }
            fed.flushed.segments += r.segments;
            fed.flushed.keys += r.keys;
            fed.flushed.data_points += r.data_points;
            fed.flushed.bytes += r.bytes;
            fed.flushed.wal_files_removed += r.wal_files_removed;
        } else if h % 24 == 23 {
            let t = Instant::now();
            engine.sweep();
            fed.sweep += t.elapsed();
        }
    }
    fed.rss_growth = rss_bytes().saturating_sub(rss0);
    fed.anon_growth = rss_anon_bytes().saturating_sub(anon0);
    let peak = sampler.peak();
    if let (Some(h0), Some(h1)) = (heap0, heap_bytes()) {
        fed.heap_growth = Some(h1.saturating_sub(h0));
        fed.heap_peak = peak.map(|p| p.saturating_sub(h0));
    }
    fed
}

/// The segment files of one resolution.
#[derive(Debug, Default, Clone, Copy)]
struct TierFiles {
    files: usize,
    bytes: u64,
    index: u64,
    data_points: u64,
    keys: u64,
}

/// Every segment file in `<data>/segments`, summed by resolution (seconds).
fn segment_files(dir: &Path) -> std::collections::BTreeMap<u32, TierFiles> {
    let mut out = std::collections::BTreeMap::<u32, TierFiles>::new();
    for entry in std::fs::read_dir(dir.join("segments")).expect("segments dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "tls") {
            let seg = Segment::open(&path).expect("segment");
            let s = seg.stats();
            let t = out.entry(seg.meta().resolution).or_default();
            t.files += 1;
            t.bytes += std::fs::metadata(&path).expect("metadata").len();
            t.index += seg.index_bytes() as u64;
            t.data_points += s.data_points;
            t.keys += s.keys;
        }
    }
    out
}

/// Where a read of one key from one hourly segment spends its time: the segment of the
/// middle day, every block read and decompressed, and `get` of keys spread over the file.
fn segment_read_costs(dir: &Path, day: i64, keys: usize) -> Row {
    let mut found = None;
    for entry in std::fs::read_dir(dir.join("segments")).expect("segments dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "tls") {
            let seg = Segment::open(&path).expect("segment");
            if seg.meta().resolution == 3600 && seg.meta().period_start == day {
                found = Some(seg);
            }
        }
    }
    let Some(seg) = found else {
        return row("one hourly segment read", "no segment for that day", NA);
    };
    let blocks = seg.blocks();
    let n = blocks.len();
    let raw: u64 = blocks.iter().map(|b| u64::from(b.raw_len)).sum();
    let stored: u64 = blocks.iter().map(|b| u64::from(b.stored_len)).sum();
    let recs: u64 = blocks.iter().map(|b| u64::from(b.keys)).sum();
    let t = Instant::now();
    for i in 0..n {
        std::hint::black_box(seg.block_payload(i).expect("block"));
    }
    let per_block = t.elapsed() / n.max(1) as u32;
    let probes: Vec<String> = (0..200)
        .map(|i| format!("lnk_{}", i * keys / 200))
        .collect();
    let t = Instant::now();
    let mut hits = 0;
    for k in &probes {
        hits += usize::from(seg.get("clicks", k).expect("get").is_some());
    }
    let per_get = t.elapsed() / probes.len() as u32;
    row(
        "one hourly segment (the middle day): block read + checksum + zstd, then `Segment::get`",
        format!(
            "{n} blocks of {:.0} KiB raw / {:.0} KiB stored, {:.0} records each; {per_block:?} per block read; {per_get:?} per `get` ({hits} of 200 keys found)",
            raw as f64 / n.max(1) as f64 / 1024.0,
            stored as f64 / n.max(1) as f64 / 1024.0,
            recs as f64 / n.max(1) as f64,
        ),
        NA,
    )
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Time in flush on the first, middle and last simulated day.
fn flush_days(fed: &Fed) -> String {
    let d = &fed.flush_by_day;
    if d.is_empty() {
        return NA.into();
    }
    [0, d.len() / 2, d.len() - 1]
        .iter()
        .map(|&i| format!("day {}: {:.2} s", i + 1, d[i].as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// Reopens the engine in `dir` (the caller dropped it) and says how long the restart took.
fn restart(dir: &Path, clock: &Arc<ManualClock>) -> (Engine, String) {
    let t = Instant::now();
    let engine = open(dir, clock);
    let wall = t.elapsed();
    let r = engine.recovery().clone();
    let rate = if r.events > 0 {
        format!(", {}", mevents(r.events as f64 / wall.as_secs_f64()))
    } else {
        String::new()
    };
    let text = format!(
        "{} ms ({} segments opened, {} log records / {} events replayed, {} skipped{rate})",
        wall.as_millis(),
        r.segments,
        r.records,
        r.events,
        r.skipped,
    );
    (engine, text)
}

/// Latencies of `f`, after a short warm-up: up to `max` samples or about `budget` of time,
/// at least 20. Returns "p50 …, p99 …" and the last answer (to check both engines agree).
fn latency(max: usize, budget: Duration, mut f: impl FnMut() -> String) -> (String, String) {
    for _ in 0..3 {
        std::hint::black_box(f());
    }
    let mut lat = Vec::new();
    let mut last = String::new();
    let start = Instant::now();
    while lat.len() < max && (lat.len() < 20 || start.elapsed() < budget) {
        let t = Instant::now();
        last = f();
        lat.push(t.elapsed());
    }
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    (
        format!("p50 {:?}, p99 {:?} (n={})", p(0.5), p(0.99), lat.len()),
        last,
    )
}

/// The queries both engines answer, named for the table.
struct Queries {
    busy: String,
    median: String,
    from: i64,
    to: i64,
    /// The day `top` sums.
    day: i64,
    /// The last day, which `archive-queries` leaves in memory (a top over "today").
    last_day: i64,
}

impl Queries {
    fn series(&self, key: &str) -> SeriesQuery {
        SeriesQuery::parse(
            "clicks",
            key,
            &[
                ("from", self.from.to_string().as_str()),
                ("to", self.to.to_string().as_str()),
                ("unit", "day"),
                ("tz", TZ),
            ][..],
        )
        .expect("series query")
    }

    fn breakdown(&self, (from, to): (i64, i64)) -> BreakdownQuery {
        BreakdownQuery::parse(
            "clicks",
            &self.busy,
            &[
                ("dim", "referrer"),
                ("from", from.to_string().as_str()),
                ("to", to.to_string().as_str()),
                ("limit", "10"),
            ][..],
        )
        .expect("breakdown query")
    }

    /// `[from, to)` of the UTC day `day` as a day in [`TZ`] (same date): it cuts two UTC
    /// days on an hour boundary.
    fn zoned(day: i64) -> (i64, i64) {
        let tz = tally_core::time::Tz::get(TZ).expect("bundled zone");
        let local_midnight = |d: i64| d - tz.offset_at(d + DAY / 2);
        (local_midnight(day), local_midnight(day + DAY))
    }

    fn top(&self, (from, to): (i64, i64)) -> TopQuery {
        TopQuery::parse(
            "clicks",
            &[
                ("from", from.to_string().as_str()),
                ("to", to.to_string().as_str()),
                ("limit", "10"),
            ][..],
        )
        .expect("top query")
    }

    fn breakdown_path(&self, (from, to): (i64, i64)) -> String {
        format!(
            "/v1/ns/clicks/keys/{}/breakdown?dim=referrer&from={from}&to={to}&limit=10",
            self.busy
        )
    }

    /// The breakdowns' 30 days, from and to midnights in [`TZ`] (same dates): the first
    /// and last UTC days are cut on an hour boundary.
    fn zoned_days(&self) -> (i64, i64) {
        (Self::zoned(self.from).0, Self::zoned(self.to).0)
    }

    fn top_path(&self, (from, to): (i64, i64)) -> String {
        format!("/v1/ns/clicks/top?from={from}&to={to}&limit=10")
    }

    fn series_path(&self, key: &str) -> String {
        format!(
            "/v1/ns/clicks/keys/{key}/series?from={}&to={}&unit=day&tz={TZ}",
            self.from, self.to
        )
    }

    /// Each query's latency on `engine`, in-process and over HTTP: (row name, figure, answer).
    fn run(&self, engine: &Arc<Engine>, clock: &Arc<ManualClock>) -> Vec<(String, String, String)> {
        let ctx = || Ctx {
            now: clock.now(),
            max_points: 100_000,
            deadline: tally_core::store::Deadline::none(),
        };
        let store: &dyn Store = &**engine;
        let budget = Duration::from_secs(2);
        let mut out = Vec::new();
        for (label, key) in [("busy", &self.busy), ("median", &self.median)] {
            let q = self.series(key);
            let (fig, ans) = latency(3000, budget, || {
                let a = query::series(store, ctx(), &q).expect("series");
                serde_json::to_string(&a).unwrap()
            });
            out.push((
                format!(
                    "series in-process, 30 days → days in {TZ}, {label} key {key} ({} events)",
                    crate::tally_hour_total(engine, key)
                ),
                fig,
                ans,
            ));
        }
        for (what, range) in [
            (String::new(), (self.from, self.to)),
            (format!(" in {TZ}"), self.zoned_days()),
        ] {
            let q = self.breakdown(range);
            let (fig, ans) = latency(3000, budget, || {
                let a = query::breakdown(store, ctx(), &q).expect("breakdown");
                serde_json::to_string(&a).unwrap()
            });
            out.push((
                format!(
                    "breakdown in-process, top 10 referrers of {} over 30 days{what}",
                    self.busy
                ),
                fig,
                ans,
            ));
        }
        let ny = format!("one day in {TZ}");
        for (what, range) in [
            ("one day", (self.day, self.day + DAY)),
            (&ny, Self::zoned(self.day)),
            ("the last day", (self.last_day, self.last_day + DAY)),
            (
                "24 hours, 12 archived and 12 of the last day",
                (self.last_day - DAY / 2, self.last_day + DAY / 2),
            ),
        ] {
            let q = self.top(range);
            let (fig, ans) = latency(1000, budget, || {
                let a = query::top(store, ctx(), &q).expect("top");
                serde_json::to_string(&a).unwrap()
            });
            out.push((format!("top 10 keys over {what}, in-process"), fig, ans));
        }

        let server = Running::over(engine.clone(), clock.clone());
        let mut conn = Conn::open(server.addr);
        for (label, path) in [
            (
                format!("series over HTTP, busy key {}", self.busy),
                self.series_path(&self.busy),
            ),
            (
                format!("breakdown over HTTP, top 10 referrers of {}", self.busy),
                self.breakdown_path((self.from, self.to)),
            ),
            (
                format!(
                    "breakdown over HTTP, top 10 referrers of {} over 30 days in {TZ}",
                    self.busy
                ),
                self.breakdown_path(self.zoned_days()),
            ),
            (
                "top 10 keys over one day, over HTTP".into(),
                self.top_path((self.day, self.day + DAY)),
            ),
            (
                format!("top 10 keys over one day in {TZ}, over HTTP"),
                self.top_path(Self::zoned(self.day)),
            ),
            (
                "top 10 keys over the last day, over HTTP".into(),
                self.top_path((self.last_day, self.last_day + DAY)),
            ),
            (
                "top 10 keys over 24 hours, 12 archived and 12 of the last day, over HTTP".into(),
                self.top_path((self.last_day - DAY / 2, self.last_day + DAY / 2)),
            ),
        ] {
            let (fig, ans) = latency(3000, budget, || {
                let (st, body) = conn.request("GET", &path, "text/plain", b"");
                assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
                String::from_utf8(body).unwrap()
            });
            out.push((label, fig, ans));
        }
        out
    }
}

fn print(title: &str, rows: &[Row]) {
    println!(
        "\n{title}\n\n| measurement | flush on (archive) | log only (no flush) |\n|---|---|---|"
    );
    for (what, a, l) in rows {
        println!("| {what} | {a} | {l} |");
    }
}

/// `archive`: 30 days, both engines, every figure of issue 8 but the year.
pub fn bench(args: &[String]) {
    let sc = Scenario {
        events: 20_000_000,
        days: 30,
        shape: Shape::default(),
        start: 1_792_022_400, // 2026-10-15T00:00Z: the 30 days include New York's DST end
        seed: 8,
    }
    .with_args(args);
    println!(
        "workload: {} clickstream events over {} days from {} (unix), {} per hour, {} Zipf keys, country ({}) + referrer ({}); tiers 1m:48h + 1h:forever, breakdowns in 1h; fsync=never, 1 writer",
        sc.events,
        sc.days,
        sc.start,
        sc.events / (sc.days as usize * 24),
        sc.shape.keys,
        sc.shape.countries,
        sc.shape.referrers
    );
    let root = tempfile::Builder::new()
        .prefix("tally-archive-bench")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let grace = FlushPolicy::default().grace;
    let mut rows: Vec<Row> = Vec::new();

    // 1. The flushing engine.
    let adir = root.path().join("archive");
    let clock = Arc::new(ManualClock::new(sc.start));
    let engine = open(&adir, &clock);
    let fed = feed(&engine, &clock, &sc, true);
    let astats = engine.stats();
    let alog = dir_bytes(&adir.join("wal"));
    drop(engine);
    eprintln!(
        "archive engine fed: {:?} applying, {:?} flushing",
        fed.apply, fed.flush
    );
    let (engine, restart_tail) = restart(&adir, &clock);
    // Close the last day too: the archive then holds everything, the log nothing.
    let t = Instant::now();
    let last = engine.flush_closed(sc.end() + grace).expect("flush");
    engine.compact().expect("compact");
    let last_flush = t.elapsed();
    drop(engine);
    clock.set(sc.end() + grace);
    let (engine, restart_empty) = restart(&adir, &clock);
    let engine = Arc::new(engine);
    let tiers = segment_files(&adir);
    let q = Queries {
        busy: "lnk_0".into(),
        median: format!("lnk_{}", sc.shape.keys / 2 - 1),
        from: sc.start,
        to: sc.end(),
        day: sc.start + (sc.days / 2) * DAY,
        last_day: sc.end() - DAY,
    };
    let aq = q.run(&engine, &clock);
    drop(engine);
    let costs = segment_read_costs(&adir, q.day, sc.shape.keys);

    // 2. The same events into an engine that never flushes.
    let ldir = root.path().join("log");
    let lclock = Arc::new(ManualClock::new(sc.start));
    let engine = open(&ldir, &lclock);
    let lfed = feed(&engine, &lclock, &sc, false);
    let lstats = engine.stats();
    let llog = dir_bytes(&ldir.join("wal"));
    drop(engine);
    lclock.set(sc.end() + grace);
    let (engine, restart_log) = restart(&ldir, &lclock);
    let engine = Arc::new(engine);
    let lq = q.run(&engine, &lclock);
    drop(engine);

    // The table.
    rows.push(row(
        "apply (`Store::apply`, 1 writer, fsync=never), hour by hour",
        mevents(sc.events as f64 / fed.apply.as_secs_f64()),
        mevents(sc.events as f64 / lfed.apply.as_secs_f64()),
    ));
    rows.push(row(
        "apply + flush after every hour (flush time counted)",
        format!(
            "{} ({} flushes writing segments, {:.1} s in flush, slowest {} ms)",
            mevents(sc.events as f64 / (fed.apply + fed.flush).as_secs_f64()),
            fed.flushes,
            fed.flush.as_secs_f64(),
            fed.slowest_flush.as_millis()
        ),
        format!(
            "{} (sweep once a day: {:.1} s)",
            mevents(sc.events as f64 / (lfed.apply + lfed.sweep).as_secs_f64()),
            lfed.sweep.as_secs_f64()
        ),
    ));
    rows.push(row(
        "time in flush per simulated day (24 hourly flushes)",
        flush_days(&fed),
        NA,
    ));
    for (res, t) in &tiers {
        let name = if *res >= 3600 {
            "hourly tier (1h, totals + country + referrer subtotals)"
        } else {
            "minute tier (1m, totals)"
        };
        rows.push(row(
            format!("archive bytes per data point, {name}, index included"),
            format!(
                "**{:.2} B** ({} in {} segments; {} data points; index {:.0}% of bytes)",
                t.bytes as f64 / t.data_points as f64,
                mib(t.bytes),
                t.files,
                t.data_points,
                100.0 * t.index as f64 / t.bytes as f64
            ),
            NA,
        ));
    }
    rows.push(row(
        "flush reports agree with the files (segments, data points)",
        format!(
            "{} segments, {} data points (+ {} / {} in the last flush)",
            fed.flushed.segments, fed.flushed.data_points, last.segments, last.data_points
        ),
        NA,
    ));
    rows.push(row(
        "log on disk after the 30 days",
        format!(
            "{} ({} files removed by flushes)",
            mib(alog),
            fed.flushed.wal_files_removed
        ),
        mib(llog),
    ));
    rows.push(row(
        "restart with the open day's log tail",
        restart_tail,
        NA,
    ));
    rows.push(row(
        format!(
            "restart after the last day is flushed too (flush took {} ms)",
            last_flush.as_millis()
        ),
        restart_empty,
        NA,
    ));
    rows.push(row("restart replaying the whole log", NA, restart_log));
    rows.push(row(
        "live counters / keys / series in memory after the 30 days",
        format!(
            "{} / {} / {}",
            astats.live_counters, astats.keys, astats.series
        ),
        format!(
            "{} / {} / {}",
            lstats.live_counters, lstats.keys, lstats.series
        ),
    ));
    rows.push(row(
        "memory per live counter: counter maps",
        format!(
            "{:.1} B",
            astats.counter_bytes as f64 / astats.live_counters.max(1) as f64
        ),
        format!(
            "{:.1} B",
            lstats.counter_bytes as f64 / lstats.live_counters.max(1) as f64
        ),
    ));
    rows.push(row(
        "memory per live counter: whole-process RSS growth over the feed",
        format!(
            "{:.1} B ({} growth)",
            fed.rss_growth as f64 / astats.live_counters.max(1) as f64,
            mib(fed.rss_growth)
        ),
        format!(
            "not comparable (heap reused after the first engine): {} growth",
            mib(lfed.rss_growth)
        ),
    ));
    let per = |b: u64| b as f64 / astats.live_counters.max(1) as f64;
    rows.push(row(
        "memory per live counter: anonymous RSS growth (heap, not mapped files)",
        format!("{:.1} B ({})", per(fed.anon_growth), mib(fed.anon_growth)),
        NA,
    ));
    rows.push(row(
        "memory per live counter: heap in use at the end / at its peak (`--features heap`)",
        match (fed.heap_growth, fed.heap_peak) {
            (Some(h), Some(p)) => format!(
                "{:.1} B ({}) / {:.1} B ({})",
                per(h),
                mib(h),
                per(p),
                mib(p)
            ),
            _ => "not measured (build without `--features heap`)".into(),
        },
        NA,
    ));
    rows.push(costs);
    for ((what, afig, aans), (_, lfig, lans)) in aq.iter().zip(&lq) {
        assert_eq!(aans, lans, "{what}: archive and memory answer differently");
        rows.push(row(what.clone(), afig.clone(), lfig.clone()));
    }
    print(
        "Archive vs log-only (answers checked equal on both engines):",
        &rows,
    );
}

/// `archive-queries dir=DIR`: the query rows alone, on data kept in `DIR` between runs (fed
/// once, both engines, on the first run), to measure a change to the read path quickly. The
/// flushing engine's last day is left in memory, as a server holds the open day.
pub fn queries_bench(args: &[String]) {
    let sc = Scenario {
        events: 4_000_000,
        days: 30,
        shape: Shape::default(),
        start: 1_792_022_400,
        seed: 8,
    }
    .with_args(args);
    let root = args
        .iter()
        .find_map(|a| a.strip_prefix("dir="))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("archive-queries needs dir=PATH"));
    let grace = FlushPolicy::default().grace;
    let (adir, ldir) = (root.join("archive"), root.join("log"));
    // `only=archive` or `only=log` feeds (the first time) and queries one engine alone.
    let only = args.iter().find_map(|a| a.strip_prefix("only="));
    if !root.join("fed").exists() {
        let _ = std::fs::remove_dir_all(&root);
        if only != Some("log") {
            let clock = Arc::new(ManualClock::new(sc.start));
            let engine = open(&adir, &clock);
            // The last day stays in memory (and in the log), as in a server during the next
            // day's grace: a top over it reads memory.
            let fed = feed(&engine, &clock, &sc, true);
            let stats = engine.stats();
            let per = |b: u64| b as f64 / stats.live_counters.max(1) as f64;
            eprintln!(
                "archive engine fed: {:?} applying, {:?} flushing and compacting (of which {:?} compacting)",
                fed.apply, fed.flush, fed.compact
            );
            eprintln!(
                "memory per live counter ({} counters, {} keys, {} series): RSS growth {:.1} B, anonymous {:.1} B, heap at the end {}, heap peak {}",
                stats.live_counters,
                stats.keys,
                stats.series,
                per(fed.rss_growth),
                per(fed.anon_growth),
                fed.heap_growth
                    .map_or("—".into(), |h| format!("{:.1} B", per(h))),
                fed.heap_peak
                    .map_or("—".into(), |h| format!("{:.1} B", per(h))),
            );
            drop(engine);
        }
        if only != Some("archive") {
            let clock = Arc::new(ManualClock::new(sc.start));
            let engine = open(&ldir, &clock);
            feed(&engine, &clock, &sc, false);
            drop(engine);
        }
        std::fs::write(root.join("fed"), format!("{sc:?}")).expect("mark");
    }
    let clock = Arc::new(ManualClock::new(sc.end() + grace));
    let q = Queries {
        busy: "lnk_0".into(),
        median: format!("lnk_{}", sc.shape.keys / 2 - 1),
        from: sc.start,
        to: sc.end(),
        day: sc.start + (sc.days / 2) * DAY,
        last_day: sc.end() - DAY,
    };
    let run = |dir: &Path, name: &str| {
        if only.is_some_and(|o| o != name) {
            return Vec::new();
        }
        let engine = Arc::new(open(dir, &clock));
        q.run(&engine, &clock)
    };
    let (aq, lq) = (run(&adir, "archive"), run(&ldir, "log"));
    if only.is_some() {
        for (what, fig, _) in aq.iter().chain(&lq) {
            println!("| {what} | {fig} |");
        }
        return;
    }
    let rows: Vec<Row> = aq
        .iter()
        .zip(&lq)
        .map(|((what, afig, aans), (_, lfig, lans))| {
            assert_eq!(aans, lans, "{what}: archive and memory answer differently");
            row(what.clone(), afig.clone(), lfig.clone())
        })
        .collect();
    print("Queries (answers checked equal on both engines):", &rows);
}

/// `archive-year`: a lighter rate over a year, flushing engine only: does restart (and a
/// 30-day read) grow with archive history?
pub fn year_bench(args: &[String]) {
    let sc = Scenario {
        events: 20_000_000,
        days: 365,
        shape: Shape::default(),
        start: 1_763_078_400, // 2025-11-14T00:00Z: the year ends where `archive` ends
        seed: 365,
    }
    .with_args(args);
    println!(
        "workload: {} clickstream events over {} days, {} per hour, {} Zipf keys; flush after every hour",
        sc.events,
        sc.days,
        sc.events / (sc.days as usize * 24),
        sc.shape.keys
    );
    let root = tempfile::Builder::new()
        .prefix("tally-archive-year")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let grace = FlushPolicy::default().grace;
    let dir = root.path().join("archive");
    let clock = Arc::new(ManualClock::new(sc.start));
    let engine = open(&dir, &clock);
    let fed = feed(&engine, &clock, &sc, true);
    drop(engine);
    eprintln!(
        "year engine fed: {:?} applying, {:?} flushing",
        fed.apply, fed.flush
    );
    let (engine, restart_tail) = restart(&dir, &clock);
    engine.flush_closed(sc.end() + grace).expect("flush");
    drop(engine);
    clock.set(sc.end() + grace);
    let (engine, restart_empty) = restart(&dir, &clock);
    let engine = Arc::new(engine);
    let tiers = segment_files(&dir);
    let q = Queries {
        busy: "lnk_0".into(),
        median: format!("lnk_{}", sc.shape.keys / 2 - 1),
        from: sc.end() - 30 * DAY,
        to: sc.end(),
        day: sc.end() - 15 * DAY,
        last_day: sc.end() - DAY,
    };
    let aq = q.run(&engine, &clock);
    drop(engine);

    let mut rows: Vec<Row> = vec![row(
        "apply + flush after every hour (flush time counted)",
        format!(
            "{} apply only; {} with flush ({} flushes, {:.1} s in flush, slowest {} ms)",
            mevents(sc.events as f64 / fed.apply.as_secs_f64()),
            mevents(sc.events as f64 / (fed.apply + fed.flush).as_secs_f64()),
            fed.flushes,
            fed.flush.as_secs_f64(),
            fed.slowest_flush.as_millis()
        ),
        NA,
    )];
    rows.push(row(
        "time in flush per simulated day (24 hourly flushes)",
        flush_days(&fed),
        NA,
    ));
    for (res, t) in &tiers {
        rows.push(row(
            format!("archive, resolution {res} s"),
            format!(
                "{:.2} B per data point ({} in {} segments)",
                t.bytes as f64 / t.data_points as f64,
                mib(t.bytes),
                t.files
            ),
            NA,
        ));
    }
    rows.push(row(
        "restart with the open day's log tail",
        restart_tail,
        NA,
    ));
    rows.push(row("restart, everything flushed", restart_empty, NA));
    for (what, fig, _) in aq {
        rows.push(row(format!("{what} (the last 30 days)"), fig, NA));
    }
    print("A year of archive (flushing engine only):", &rows);
}

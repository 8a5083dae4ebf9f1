//! `tally bench`: a load generator against a running server. `--connections` threads, each
//! with its own keep-alive connection, send a weighted mix of clickstream-like `POST
//! /v1/events` batches (Zipf keys, `country`/`referrer`/`device` dimensions), `incr`s and
//! queries (series, breakdown, top and window over the last hour) for `--duration`, and it
//! prints, per operation, requests/s, events/s, latency percentiles from an HdrHistogram and
//! the error answers by status. An error answer is counted, not fatal; a server that cannot
//! be reached at the start is. With writes in the mix, one is sent before the clock starts
//! (a new namespace exists once written to). The report is printed whatever happened, and
//! the exit status is non-zero if an operation of the mix never succeeded.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::conn::{Conn, write_stdout};
use crate::http::{Client, Route};

/// The bounds: a bench is a measurement, not a way to hold a server down for a day.
const MAX_CONNECTIONS: u32 = 1000;
const MAX_DURATION_SECS: u64 = 3600;
const MAX_BATCH: u32 = 100_000;
const MAX_KEYS: u32 = 1_000_000;
/// A request slower than this is an error (`timeout`), so a stuck server cannot stretch the
/// run far past `--duration`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Latencies are recorded in microseconds, up to this (larger ones are clamped).
const MAX_LATENCY_US: u64 = 60_000_000;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Concurrent connections (one thread each), 1 to 1000.
    #[arg(long, default_value_t = 8)]
    connections: u32,
    /// How long to run: `<integer><unit>` (s, m, h), at most 1h.
    #[arg(long, default_value = "30s")]
    duration: String,
    /// Operations and their weights: `op=weight,…` with ops ingest, incr, series, breakdown,
    /// top, window.
    #[arg(long, default_value = "ingest=70,incr=10,series=10,breakdown=5,top=5", value_parser = Mix::parse)]
    mix: Mix,
    /// Events per `POST /v1/events` batch, 1 to 100000.
    #[arg(long, default_value_t = 100)]
    batch: u32,
    /// Distinct keys, drawn Zipf(1.1), 1 to 1000000.
    #[arg(long, default_value_t = 10_000)]
    keys: u32,
    /// Namespace to write and query (created on first write with the server's defaults).
    #[arg(long, default_value = "bench")]
    ns: String,
    #[command(flatten)]
    conn: Conn,
}

/// One kind of request the bench sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Op {
    Ingest,
    Incr,
    Series,
    Breakdown,
    Top,
    Window,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::Ingest,
        Op::Incr,
        Op::Series,
        Op::Breakdown,
        Op::Top,
        Op::Window,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Ingest => "ingest",
            Op::Incr => "incr",
            Op::Series => "series",
            Op::Breakdown => "breakdown",
            Op::Top => "top",
            Op::Window => "window",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The operations with non-zero weights, in [`Op::ALL`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mix(Vec<(Op, u32)>);

impl Mix {
    fn parse(s: &str) -> Result<Mix, String> {
        let mut weights: BTreeMap<Op, u32> = BTreeMap::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, w) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not op=weight"))?;
            let op = Op::ALL
                .into_iter()
                .find(|o| o.name() == name.trim())
                .ok_or_else(|| {
                    format!(
                        "unknown operation {name:?}: expected one of ingest, incr, series, breakdown, top, window"
                    )
                })?;
            let w: u32 = w
                .trim()
                .parse()
                .ok()
                .filter(|w| *w <= 1_000_000)
                .ok_or_else(|| format!("weight of {op} must be a whole number 0 to 1000000"))?;
            if weights.insert(op, w).is_some() {
                return Err(format!("{op} is given twice"));
            }
        }
        let mix = Mix(weights.into_iter().filter(|(_, w)| *w > 0).collect());
        if mix.0.is_empty() {
            return Err("the mix needs at least one operation with a weight above 0".into());
        }
        Ok(mix)
    }

    /// The operation for a uniform draw `r`.
    fn pick(&self, r: u64) -> Op {
        let total: u64 = self.0.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut x = r % total;
        for (op, w) in &self.0 {
            if x < u64::from(*w) {
                return *op;
            }
            x -= u64::from(*w);
        }
        self.0[0].0
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(o, w)| format!("{o}={w}")).collect();
        f.write_str(&parts.join(","))
    }
}

/// The validated plan: everything is checked before the first request.
#[derive(Debug)]
struct Plan {
    connections: u32,
    duration: Duration,
    mix: Mix,
    batch: u32,
    keys: u32,
    ns: String,
}

impl Plan {
    fn new(a: &BenchArgs) -> anyhow::Result<Plan> {
        if !(1..=MAX_CONNECTIONS).contains(&a.connections) {
            bail!(
                "--connections must be 1 to {MAX_CONNECTIONS}, got {}",
                a.connections
            );
        }
        let secs = tally_core::model::Duration::new(&a.duration)
            .with_context(|| format!("--duration {:?}", a.duration))?
            .secs();
        if secs > MAX_DURATION_SECS {
            bail!(
                "--duration must be at most 1h, got {:?} ({secs} s)",
                a.duration
            );
        }
        if !(1..=MAX_BATCH).contains(&a.batch) {
            bail!("--batch must be 1 to {MAX_BATCH}, got {}", a.batch);
        }
        if !(1..=MAX_KEYS).contains(&a.keys) {
            bail!("--keys must be 1 to {MAX_KEYS}, got {}", a.keys);
        }
        tally_core::model::Namespace::new(&a.ns).with_context(|| format!("--ns {:?}", a.ns))?;
        Ok(Plan {
            connections: a.connections,
            duration: Duration::from_secs(secs),
            mix: a.mix.clone(),
            batch: a.batch,
            keys: a.keys,
            ns: a.ns.clone(),
        })
    }
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let plan = Arc::new(Plan::new(&a)?);
    // A server that is not there is a clear error before any load starts.
    let probe = a.conn.client_with_timeout(Duration::from_secs(10));
    match probe.get_status(&Route::fixed("/healthz")) {
        Ok(200) => {}
        Ok(status) => bail!(
            "the server at {} is not ready: /healthz answered {status}",
            a.conn.server()
        ),
        Err(e) => return Err(crate::http::unreachable(a.conn.server(), e)),
    }
    let workload = Arc::new(Workload::new(&plan));
    let mut tally = Tally::default();
    // A new namespace exists once written to: with writes in the mix, one goes first, so
    // that the first reads do not race it to a 404 (it is counted like any other).
    if let Some(&(write, _)) = plan
        .mix
        .0
        .iter()
        .find(|(op, _)| matches!(op, Op::Ingest | Op::Incr))
    {
        let client = a.conn.client_with_timeout(REQUEST_TIMEOUT);
        let mut rng = Rng::new(now_secs());
        send(&plan, &workload, &client, &mut rng, write, &mut tally);
    }
    let start = Instant::now();
    let deadline = start + plan.duration;
    let threads: Vec<_> = (0..plan.connections)
        .map(|i| {
            let (plan, workload) = (plan.clone(), workload.clone());
            let client = a.conn.client_with_timeout(REQUEST_TIMEOUT);
            std::thread::Builder::new()
                .name(format!("bench-{i}"))
                .spawn(move || worker(&plan, &workload, &client, u64::from(i), deadline))
                .context("starting a client thread")
        })
        .collect::<anyhow::Result<_>>()?;
    for t in threads {
        let part = t
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        tally.merge(part)?;
    }
    let report = Report::new(&plan, a.conn.server(), start.elapsed(), &tally);
    let text = if a.conn.json() {
        let mut t = serde_json::to_string_pretty(&report)?;
        t.push('\n');
        t
    } else {
        report.render()
    };
    write_stdout(&text)?;
    // A run in which nothing succeeded measured nothing: a script must not read it as a
    // result (the report above says what the server answered).
    let answered: u64 = tally.ops.values().map(|o| o.ok).sum();
    if answered == 0 {
        bail!("no request succeeded (the errors column says what the server answered)");
    }
    // Nor did one whose every write (or every top, …) was refused: its rates are not the
    // mix asked for.
    let failed: Vec<&str> = tally
        .ops
        .iter()
        .filter(|(_, o)| o.ok == 0 && !o.errors.is_empty())
        .map(|(op, _)| op.name())
        .collect();
    if !failed.is_empty() {
        bail!(
            "no {} request succeeded (the errors column says what the server answered)",
            failed.join(", no ")
        );
    }
    Ok(())
}

/// What one connection saw, per operation.
#[derive(Debug, Default)]
struct Tally {
    ops: BTreeMap<Op, OpTally>,
}

#[derive(Debug)]
struct OpTally {
    ok: u64,
    /// Events acknowledged (ingest batches and incrs answered 200).
    events: u64,
    /// Error answers by status, and `io`/`timeout` for requests that got none.
    errors: BTreeMap<String, u64>,
    /// Latency of every request, answered or not, in microseconds.
    latency: Histogram<u64>,
}

impl OpTally {
    fn new() -> anyhow::Result<OpTally> {
        Ok(OpTally {
            ok: 0,
            events: 0,
            errors: BTreeMap::new(),
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .context("creating a latency histogram")?,
        })
    }
}

impl Tally {
    fn op(&mut self, op: Op) -> anyhow::Result<&mut OpTally> {
        use std::collections::btree_map::Entry;
        Ok(match self.ops.entry(op) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(OpTally::new()?),
        })
    }

    fn merge(&mut self, other: Tally) -> anyhow::Result<()> {
        for (op, t) in other.ops {
            let mine = self.op(op)?;
            mine.ok += t.ok;
            mine.events += t.events;
            for (k, n) in t.errors {
                *mine.errors.entry(k).or_default() += n;
            }
            mine.latency
                .add(&t.latency)
                .context("merging latency histograms")?;
        }
        Ok(())
    }
}

/// The shared, read-only part of the clickstream: the Zipf tables and the value names.
#[derive(Debug)]
struct Workload {
    keys: Zipf,
    countries: Zipf,
    referrers: Zipf,
}

const COUNTRIES: usize = 60;
const REFERRERS: usize = 200;
const DEVICES: [&str; 3] = ["mobile", "desktop", "tablet"];

impl Workload {
    fn new(plan: &Plan) -> Workload {
        Workload {
            keys: Zipf::new(plan.keys as usize, 1.1),
            countries: Zipf::new(COUNTRIES, 1.3),
            referrers: Zipf::new(REFERRERS, 1.1),
        }
    }

    fn key(&self, rng: &mut Rng) -> String {
        format!("lnk_{}", self.keys.sample(rng))
    }

    /// One NDJSON batch: timestamps within the last 10 minutes, every event with a country,
    /// most with a referrer and a device (so `unset` is exercised too).
    fn ndjson(&self, rng: &mut Rng, ns: &str, batch: u32, now: u64) -> Vec<u8> {
        use std::fmt::Write;
        let mut out = String::with_capacity(batch as usize * 110);
        for _ in 0..batch {
            let key = self.key(rng);
            let ts = now - rng.below(600);
            let _ = write!(
                out,
                r#"{{"ns":"{ns}","key":"{key}","ts":{ts},"dims":{{"country":"C{}""#,
                self.countries.sample(rng)
            );
            if rng.below(10) < 8 {
                let _ = write!(
                    out,
                    r#","referrer":"r{}.example""#,
                    self.referrers.sample(rng)
                );
            }
            if rng.below(10) < 9 {
                let _ = write!(out, r#","device":"{}""#, DEVICES[rng.below(3) as usize]);
            }
            out.push_str("}}\n");
        }
        out.into_bytes()
    }
}

/// One connection's loop until the deadline.
fn worker(plan: &Plan, w: &Workload, client: &Client, id: u64, deadline: Instant) -> Tally {
    let mut rng = Rng::new(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ now_secs());
    let mut tally = Tally::default();
    while Instant::now() < deadline {
        let op = plan.mix.pick(rng.next_u64());
        if !send(plan, w, client, &mut rng, op, &mut tally) {
            break;
        }
    }
    tally
}

/// Sends one request of `op` and counts what came back; false if it could not be counted.
fn send(
    plan: &Plan,
    w: &Workload,
    client: &Client,
    rng: &mut Rng,
    op: Op,
    tally: &mut Tally,
) -> bool {
    let now = now_secs();
    let hour_ago = now.saturating_sub(3600);
    let t = Instant::now();
    let (sent, events) = match op {
        Op::Ingest => {
            let body = w.ndjson(rng, &plan.ns, plan.batch, now);
            let t = Instant::now();
            let s = client.post_status(&Route::fixed("/v1/events"), "application/x-ndjson", &body);
            (s.map(|s| (s, t)), u64::from(plan.batch))
        }
        Op::Incr => {
            let route = Route::key(&plan.ns, &w.key(rng), "incr")
                .param("dim.country", format!("C{}", w.countries.sample(rng)));
            (
                client
                    .post_status(&route, "text/plain", b"")
                    .map(|s| (s, t)),
                1,
            )
        }
        Op::Series => {
            let route = Route::key(&plan.ns, &w.key(rng), "series")
                .param("from", hour_ago)
                .param("to", now)
                .param("unit", "minute");
            (client.get_status(&route).map(|s| (s, t)), 0)
        }
        Op::Breakdown => {
            let route = Route::key(&plan.ns, &w.key(rng), "breakdown")
                .param("dim", "country")
                .param("from", hour_ago)
                .param("to", now)
                .param("unit", "hour")
                .param("limit", 10);
            (client.get_status(&route).map(|s| (s, t)), 0)
        }
        Op::Top => {
            let route = Route::namespace(&plan.ns, "top")
                .param("from", hour_ago)
                .param("to", now)
                .param("unit", "hour")
                .param("limit", 10);
            (client.get_status(&route).map(|s| (s, t)), 0)
        }
        Op::Window => {
            let route = Route::key(&plan.ns, &w.key(rng), "window").param("last", "1h");
            (client.get_status(&route).map(|s| (s, t)), 0)
        }
    };
    // Building the body is not part of the latency; the request is, answered or not.
    let Ok(slot) = tally.op(op) else {
        return false;
    };
    match sent {
        Ok((status, t)) => {
            let _ = slot.latency.record(latency_us(t).min(MAX_LATENCY_US));
            if status == 200 {
                slot.ok += 1;
                slot.events += events;
            } else {
                *slot.errors.entry(status.to_string()).or_default() += 1;
            }
        }
        Err(e) => {
            let _ = slot.latency.record(latency_us(t).min(MAX_LATENCY_US));
            let kind = match e {
                ureq::Error::Timeout(_) => "timeout",
                _ => "io",
            };
            *slot.errors.entry(kind.to_owned()).or_default() += 1;
            // A server that went away refuses at once: don't spin on it.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    true
}

fn latency_us(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What is printed: per operation, and the whole run.
#[derive(Debug, Serialize)]
struct Report {
    server: String,
    ns: String,
    connections: u32,
    mix: String,
    batch: u32,
    keys: u32,
    elapsed_secs: f64,
    /// Events acknowledged over all operations (ingest and incr).
    events: u64,
    events_per_sec: f64,
    ops: BTreeMap<Op, OpReport>,
}

#[derive(Debug, Serialize)]
struct OpReport {
    requests: u64,
    ok: u64,
    requests_per_sec: f64,
    /// Events acknowledged: only ingest and incr write.
    events: u64,
    events_per_sec: f64,
    latency_us: Latency,
    errors: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: u64,
    p90: u64,
    p99: u64,
    #[serde(rename = "p99.9")]
    p99_9: u64,
    max: u64,
}

impl Report {
    fn new(plan: &Plan, server: &str, elapsed: Duration, tally: &Tally) -> Report {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let ops: BTreeMap<Op, OpReport> = tally
            .ops
            .iter()
            .map(|(op, t)| {
                let requests = t.latency.len();
                let h = &t.latency;
                (
                    *op,
                    OpReport {
                        requests,
                        ok: t.ok,
                        requests_per_sec: requests as f64 / secs,
                        events: t.events,
                        events_per_sec: t.events as f64 / secs,
                        latency_us: Latency {
                            p50: h.value_at_quantile(0.5),
                            p90: h.value_at_quantile(0.9),
                            p99: h.value_at_quantile(0.99),
                            p99_9: h.value_at_quantile(0.999),
                            max: h.max(),
                        },
                        errors: t.errors.clone(),
                    },
                )
            })
            .collect();
        let events = ops.values().map(|o| o.events).sum::<u64>();
        Report {
            server: server.to_owned(),
            ns: plan.ns.clone(),
            connections: plan.connections,
            mix: plan.mix.to_string(),
            batch: plan.batch,
            keys: plan.keys,
            elapsed_secs: secs,
            events,
            events_per_sec: events as f64 / secs,
            ops,
        }
    }

    fn render(&self) -> String {
        let mut rows: Vec<Vec<String>> = vec![
            [
                "op", "requests", "req/s", "events/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms",
                "max ms", "errors",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for (op, r) in &self.ops {
            let l = &r.latency_us;
            let errors = if r.errors.is_empty() {
                "-".to_owned()
            } else {
                let parts: Vec<String> = r.errors.iter().map(|(k, n)| format!("{k}×{n}")).collect();
                parts.join(" ")
            };
            rows.push(vec![
                op.to_string(),
                r.requests.to_string(),
                format!("{:.0}", r.requests_per_sec),
                if *op == Op::Ingest || *op == Op::Incr {
                    format!("{:.0}", r.events_per_sec)
                } else {
                    "-".to_owned()
                },
                ms(l.p50),
                ms(l.p90),
                ms(l.p99),
                ms(l.p99_9),
                ms(l.max),
                errors,
            ]);
        }
        let mut out = format!(
            "tally bench: {} connections for {:.1} s against {} (ns {}, mix {}, batch {}, {} keys)\n",
            self.connections,
            self.elapsed_secs,
            self.server,
            self.ns,
            self.mix,
            self.batch,
            self.keys
        );
        out.push_str(&align(&rows));
        out.push_str(&format!(
            "events acknowledged: {} ({:.0} events/s)\n",
            self.events, self.events_per_sec
        ));
        out
    }
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// Columns padded to their widest cell; the first left-aligned, the rest right-aligned but
/// the last (the errors), which is free text.
fn align(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            if c > 0 {
                line.push_str("  ");
            }
            if c == 0 || c + 1 == cols {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            } else {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A small, fast, deterministic generator (splitmix64): the bench needs spread, not secrecy.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`, `n > 0`.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over `n` ranks with exponent `s`, by inverse CDF: rank 0 is the most frequent.
#[derive(Debug)]
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n.max(1));
        let mut acc = 0.0;
        for k in 1..=n.max(1) {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf
            .partition_point(|c| *c < u)
            .min(self.cdf.len().saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_is_op_equals_weight_and_drops_zero_weights() {
        let m = Mix::parse("ingest=80, incr=10,series=10,top=0").unwrap();
        assert_eq!(
            m,
            Mix(vec![(Op::Ingest, 80), (Op::Incr, 10), (Op::Series, 10)])
        );
        assert_eq!(m.to_string(), "ingest=80,incr=10,series=10");
        assert!(
            Mix::parse("ingest=1,fly=2")
                .unwrap_err()
                .contains("unknown operation")
        );
        assert!(Mix::parse("ingest").unwrap_err().contains("op=weight"));
        assert!(Mix::parse("ingest=-1").is_err());
        assert!(
            Mix::parse("ingest=1,ingest=2")
                .unwrap_err()
                .contains("twice")
        );
        assert!(Mix::parse("ingest=0").unwrap_err().contains("at least one"));
    }

    #[test]
    fn picks_follow_the_weights() {
        let m = Mix::parse("ingest=3,top=1").unwrap();
        let picks: Vec<Op> = (0..8).map(|r| m.pick(r)).collect();
        assert_eq!(
            picks,
            [
                Op::Ingest,
                Op::Ingest,
                Op::Ingest,
                Op::Top,
                Op::Ingest,
                Op::Ingest,
                Op::Ingest,
                Op::Top
            ]
        );
    }

    #[test]
    fn zipf_ranks_stay_in_range_and_favour_the_first() {
        let z = Zipf::new(100, 1.1);
        let mut rng = Rng::new(7);
        let mut counts = [0u32; 100];
        for _ in 0..10_000 {
            counts[z.sample(&mut rng)] += 1;
        }
        assert!(
            counts[0] > counts[1] && counts[1] > counts[50],
            "{counts:?}"
        );
        assert_eq!(Zipf::new(1, 1.1).sample(&mut rng), 0);
    }

    #[test]
    fn columns_align_numbers_right_and_errors_left() {
        let rows = vec![
            vec!["op".into(), "n".into(), "errors".into()],
            vec!["ingest".into(), "12".into(), "503×2".into()],
            vec!["top".into(), "3".into(), "-".into()],
        ];
        assert_eq!(
            align(&rows),
            "op       n  errors\ningest  12  503×2\ntop      3  -\n"
        );
    }
}

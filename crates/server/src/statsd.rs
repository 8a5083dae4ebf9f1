//! StatsD / DogStatsD counters over UDP (issue 13): existing apps count into tally without new
//! client code.
//!
//! **Format.** A datagram holds one or more newline-separated lines (a trailing `\r` is
//! ignored, blank lines are skipped), each
//! `<name>:<value>[:<value>…]|<type>[|@<rate>][|#<k:v>,<k:v>…][|T<unix>][|c:<container>]`.
//! Only counters (`|c`) are counted: the metric name is the key, the namespace is
//! `[statsd] namespace` (default `statsd`), each tag `k:v` is a dimension (so it must be a valid
//! dimension name, and in the namespace's allow-list if it has one) and `|T<unix>` is the
//! event's timestamp (default: now). Several values packed in one line (DogStatsD 1.1) add up.
//!
//! **Sample rates.** `|@r` (0 < r ≤ 1) means the client sent one line in 1/r, so the line counts
//! `x = value / r`. Counts are integers, so `x` is rounded *stochastically*: `floor(x)`, plus 1
//! with probability `x − floor(x)`, drawn from a seeded PRNG (splitmix64, seeded per listener
//! from the clock). The expected count is exactly `x`, so totals over many lines are unbiased;
//! a line without a rate and with integer values is counted exactly. The same rounding applies
//! to fractional values (`1.5|c`).
//!
//! **Outcomes.** Every line ends in exactly one outcome, counted in `/metrics` as
//! `tally_statsd_lines_total{outcome=…}`: `accepted`; `malformed` (not the format above);
//! `unsupported_type` (gauges `g`, timers `ms`, histograms `h`, sets `s`, distributions `d`);
//! `invalid` (refused by the HTTP API's own rules — [`ingest::prepare_owned`] — e.g. a key over
//! 256 bytes, a tag outside the allow-list, more than 16 tags); `store_error` (the store refused
//! the batch, e.g. backend unavailable). A dropped line is never partly applied, and is named
//! with its reason in a log line at most once a second.
//!
//! **Bounds.** A datagram is read into a 65,535-byte buffer (the UDP maximum); at most
//! [`MAX_LINES_PER_DATAGRAM`] lines of one datagram are parsed, the rest are `malformed`; a line
//! carries at most 16 tags. Accepted lines are applied in batches of at most [`BATCH_LINES`]
//! lines or [`BATCH_MS`] ms, whichever comes first, through the path `POST /v1/events` takes
//! (validate, then `Store::apply` on the blocking pool), so every backend works unchanged. At
//! most [`QUEUED_BATCHES`] batches wait for the store; past that the listener stops reading,
//! datagrams wait in the socket's receive buffer ([`RECV_BUFFER_BYTES`] asked, capped by the
//! kernel's `net.core.rmem_max`), and past that the kernel drops them, as UDP does.
//!
//! UDP carries no token: the listener writes only its one namespace, and belongs on a trusted
//! network (it listens on the loopback by default in the SPEC's example).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally_core::ingest::{self, Defaults, IngestError, Limits};
use tally_core::model::{AMOUNT_LIMIT, MAX_DIMS_PER_EVENT, RawEvent};
use tally_core::store::{Batch, Store, StoreError};
use tokio::net::UdpSocket;

use crate::app::App;

/// The largest UDP payload, and the receive buffer's size.
pub const MAX_DATAGRAM_BYTES: usize = 65_535;
/// Lines parsed per datagram; the rest are dropped as `malformed`.
pub const MAX_LINES_PER_DATAGRAM: usize = 4096;
/// Tags per line: one dimension each, so the API's limit.
pub const MAX_TAGS_PER_LINE: usize = MAX_DIMS_PER_EVENT;
/// A batch is applied once it holds this many lines …
pub const BATCH_LINES: usize = 2000;
/// … or this many milliseconds after its first line arrived.
pub const BATCH_MS: u64 = 5;
/// Batches waiting for the store at most.
pub const QUEUED_BATCHES: usize = 4;
/// The receive buffer asked of the kernel (capped by `net.core.rmem_max`): datagrams wait
/// there while a batch is applied, so it decides how long a stall the listener rides out
/// without loss — the 208 KiB Linux default holds ~80 ms at 25 k lines/s.
pub const RECV_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// The namespace lines go to unless `[statsd] namespace` says otherwise.
pub const DEFAULT_NAMESPACE: &str = "statsd";

/// How a line ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Malformed,
    UnsupportedType,
    Invalid,
    StoreError,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Accepted,
        Outcome::Malformed,
        Outcome::UnsupportedType,
        Outcome::Invalid,
        Outcome::StoreError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Malformed => "malformed",
            Outcome::UnsupportedType => "unsupported_type",
            Outcome::Invalid => "invalid",
            Outcome::StoreError => "store_error",
        }
    }
}

/// A line that was not counted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub outcome: Outcome,
    pub reason: String,
}

impl Dropped {
    fn malformed(reason: impl Into<String>) -> Dropped {
        Dropped {
            outcome: Outcome::Malformed,
            reason: reason.into(),
        }
    }

    fn invalid(reason: impl Into<String>) -> Dropped {
        Dropped {
            outcome: Outcome::Invalid,
            reason: reason.into(),
        }
    }
}

/// splitmix64: small, fast, and good enough to round sample rates without bias.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The lines' counters for `/metrics`; rendered once a listener has started.
#[derive(Debug, Default)]
pub struct LineCounts {
    enabled: AtomicBool,
    counts: [AtomicU64; 5],
}

impl LineCounts {
    pub fn add(&self, outcome: Outcome, n: u64) {
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == outcome) {
            self.counts[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(&self, outcome: Outcome) -> u64 {
        Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .map_or(0, |i| self.counts[i].load(Ordering::Relaxed))
    }

    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }
}

/// Parses one datagram: each line becomes an event of namespace `ns` in `out`, or is passed to
/// `dropped` with its reason.
pub fn parse_datagram(
    datagram: &[u8],
    ns: &str,
    rng: &mut Rng,
    out: &mut Vec<RawEvent>,
    dropped: &mut dyn FnMut(Dropped),
) {
    let mut parsed = 0;
    for line in datagram.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if parsed == MAX_LINES_PER_DATAGRAM {
            dropped(Dropped::malformed(format!(
                "more than {MAX_LINES_PER_DATAGRAM} lines in one datagram"
            )));
            continue;
        }
        parsed += 1;
        match parse_line(line, ns, rng) {
            Ok(raw) => out.push(raw),
            Err(d) => dropped(d),
        }
    }
}

/// Parses one line (without its newline) into an event of namespace `ns`. Only the format is
/// checked here; the API's rules (key, dimensions, allow-list, timestamp) are [`prepare_lines`]'s.
pub fn parse_line(line: &[u8], ns: &str, rng: &mut Rng) -> Result<RawEvent, Dropped> {
    let line =
        std::str::from_utf8(line).map_err(|_| Dropped::malformed("the line is not UTF-8"))?;
    let (name, rest) = line
        .split_once(':')
        .ok_or_else(|| Dropped::malformed("no ':' after the metric name"))?;
    if name.is_empty() {
        return Err(Dropped::malformed("empty metric name"));
    }
    let mut fields = rest.split('|');
    let values = fields.next().unwrap_or_default();
    let kind = fields
        .next()
        .ok_or_else(|| Dropped::malformed("no '|<type>' after the value"))?;
    match kind {
        "c" => {}
        "g" | "ms" | "h" | "s" | "d" => {
            let what = match kind {
                "g" => "gauge",
                "ms" => "timer",
                "h" => "histogram",
                "s" => "set",
                _ => "distribution",
            };
            return Err(Dropped {
                outcome: Outcome::UnsupportedType,
                reason: format!("{what} lines (|{kind}) are not counted: only counters (|c) are"),
            });
        }
        other => {
            return Err(Dropped::malformed(format!(
                "unknown metric type {:?}",
                clip(other)
            )));
        }
    }
    let mut rate = None;
    let mut tags = None;
    let mut ts = None;
    for field in fields {
        let dup = |what: &str| Dropped::malformed(format!("{what} given twice"));
        if let Some(r) = field.strip_prefix('@') {
            if rate.is_some() {
                return Err(dup("sample rate"));
            }
            let r: f64 = r
                .parse()
                .ok()
                .filter(|r: &f64| *r > 0.0 && *r <= 1.0)
                .ok_or_else(|| {
                    Dropped::malformed(format!(
                        "sample rate {:?} is not a number in (0, 1]",
                        clip(r)
                    ))
                })?;
            rate = Some(r);
        } else if let Some(t) = field.strip_prefix('#') {
            if tags.is_some() {
                return Err(dup("tags"));
            }
            tags = Some(t);
        } else if let Some(t) = field.strip_prefix('T') {
            if ts.is_some() {
                return Err(dup("timestamp"));
            }
            ts = Some(t.parse::<i64>().map_err(|_| {
                Dropped::malformed(format!("timestamp {:?} is not unix seconds", clip(t)))
            })?);
        } else if field.starts_with("c:") || field.starts_with("e:") {
            // DogStatsD's container id and external data: not counted, not an error.
        } else {
            return Err(Dropped::malformed(format!(
                "unknown field {:?}",
                clip(field)
            )));
        }
    }
    let n = count(values, rate.unwrap_or(1.0), rng)?;
    let mut dims = Vec::new();
    if let Some(tags) = tags.filter(|t| !t.is_empty()) {
        let got = tags.split(',').count();
        if got > MAX_TAGS_PER_LINE {
            return Err(Dropped::invalid(format!(
                "an event carries at most {MAX_DIMS_PER_EVENT} dimensions, got {got} tags"
            )));
        }
        for tag in tags.split(',') {
            let (k, v) = tag.split_once(':').ok_or_else(|| {
                Dropped::invalid(format!(
                    "tag {:?} has no value: a dimension is name:value",
                    clip(tag)
                ))
            })?;
            dims.push((k.to_owned(), v.to_owned()));
        }
    }
    Ok(RawEvent {
        ns: ns.to_owned(),
        key: name.to_owned(),
        ts,
        n: Some(n),
        dims,
    })
}

/// The count of a line: the sum of its values over the sample rate, rounded stochastically
/// unless it is a whole number already.
fn count(values: &str, rate: f64, rng: &mut Rng) -> Result<i64, Dropped> {
    let bad = |v: &str| Dropped::malformed(format!("value {:?} is not a number", clip(v)));
    let out_of_range = || Dropped::invalid("the count is out of range: |n| must be below 2^53");
    let mut exact: Option<i64> = Some(0);
    let mut sum = 0.0f64;
    for v in values.split(':') {
        let is_int = !v.is_empty()
            && v.strip_prefix(['-', '+'])
                .unwrap_or(v)
                .bytes()
                .all(|b| b.is_ascii_digit());
        if is_int {
            let i: i64 = v.parse().map_err(|_| out_of_range())?;
            exact = exact.and_then(|e| e.checked_add(i));
            sum += i as f64;
        } else {
            let f: f64 = v.parse().map_err(|_| bad(v))?;
            if !f.is_finite() {
                return Err(bad(v));
            }
            exact = None;
            sum += f;
        }
    }
    if let Some(e) = exact.filter(|_| rate == 1.0) {
        return Ok(e);
    }
    let x = sum / rate;
    if !x.is_finite() || x.abs() >= AMOUNT_LIMIT as f64 {
        return Err(out_of_range());
    }
    let floor = x.floor();
    let up = rng.next_f64() < x - floor;
    Ok(floor as i64 + i64::from(up))
}

/// At most 64 characters of untrusted text, for a reason.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Validates each line alone with the HTTP API's rules ([`ingest::prepare_owned`]), so a bad
/// line is dropped without its neighbours, and returns one batch of the good ones. A store
/// error (reading a schema) fails the whole batch.
pub fn prepare_lines(
    store: &dyn Store,
    lines: Vec<RawEvent>,
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
    dropped: &mut dyn FnMut(Dropped),
) -> Result<Batch, StoreError> {
    let mut batch = Batch::default();
    batch.increments.reserve(lines.len());
    for raw in lines {
        match ingest::prepare_owned(store, vec![raw], now, limits, defaults) {
            Ok(b) => {
                for (ns, schema) in b.create {
                    if !batch.create.iter().any(|(n, _)| *n == ns) {
                        batch.create.push((ns, schema));
                    }
                }
                batch.increments.extend(b.increments);
            }
            Err(IngestError::Store(e)) => return Err(e),
            Err(IngestError::Event { source, .. }) => dropped(Dropped::invalid(source.to_string())),
            Err(IngestError::UnknownNamespace { ns, .. }) => dropped(Dropped::invalid(format!(
                "namespace {ns} does not exist (auto_create is off)"
            ))),
            Err(e) => dropped(Dropped::invalid(e.to_string())),
        }
    }
    Ok(batch)
}

/// Logs dropped lines with their reason, at most once a second, saying how many it skipped.
#[derive(Debug, Default)]
struct DropLog(Mutex<(Option<Instant>, u64)>);

impl DropLog {
    fn note(&self, d: &Dropped) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(
                outcome = d.outcome.as_str(),
                reason = %d.reason,
                also_dropped_since_last_log = s.1,
                "statsd line dropped"
            );
            *s = (Some(Instant::now()), 0);
        } else {
            s.1 += 1;
        }
    }
}

/// Receives StatsD lines on `socket` into `app`'s store until `shutdown` completes, then
/// applies what it holds and returns.
pub async fn serve(socket: UdpSocket, app: App, shutdown: impl Future<Output = ()>) {
    let counts = &app.metrics().statsd;
    counts.enable();
    let ns = app.settings().statsd.namespace.clone();
    let log = Arc::new(DropLog::default());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = Rng::new(seed ^ socket.local_addr().map_or(0, |a| u64::from(a.port())));
    tracing::debug!(
        receive_buffer_bytes = socket2::SockRef::from(&socket)
            .recv_buffer_size()
            .unwrap_or(0),
        "statsd listener started"
    );
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<RawEvent>>(QUEUED_BATCHES);
    let applier = tokio::spawn(apply_batches(app.clone(), rx, log.clone()));
    let mut buf = vec![0u8; MAX_DATAGRAM_BYTES];
    let mut pending: Vec<RawEvent> = Vec::new();
    let mut due: Option<tokio::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let flush = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => true,
            got = socket.recv_from(&mut buf) => match got {
                Ok((len, _from)) => {
                    let datagram = buf.get(..len).unwrap_or_default();
                    parse_datagram(datagram, &ns, &mut rng, &mut pending, &mut |d| {
                        counts.add(d.outcome, 1);
                        log.note(&d);
                    });
                    if !pending.is_empty() && due.is_none() {
                        due = Some(tokio::time::Instant::now() + Duration::from_millis(BATCH_MS));
                    }
                    pending.len() >= BATCH_LINES
                }
                Err(e) => {
                    tracing::warn!(error = %e, "statsd: receiving failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    false
                }
            },
        };
        if flush && !pending.is_empty() {
            due = None;
            if tx.send(std::mem::take(&mut pending)).await.is_err() {
                break;
            }
        }
    }
    if !pending.is_empty() {
        let _ = tx.send(pending).await;
    }
    drop(tx);
    let _ = applier.await;
}

/// Applies the batches the receiver sends, one at a time, on the blocking pool.
async fn apply_batches(
    app: App,
    mut rx: tokio::sync::mpsc::Receiver<Vec<RawEvent>>,
    log: Arc<DropLog>,
) {
    while let Some(lines) = rx.recv().await {
        let n = lines.len() as u64;
        let (a, l) = (app.clone(), log.clone());
        let done = tokio::task::spawn_blocking(move || apply_lines(&a, lines, &l)).await;
        if let Err(e) = done {
            app.metrics().statsd.add(Outcome::StoreError, n);
            log.note(&Dropped {
                outcome: Outcome::StoreError,
                reason: format!("a statsd batch task failed: {e}"),
            });
        }
    }
}

/// Validates and applies one batch, counting every line's outcome.
fn apply_lines(app: &App, lines: Vec<RawEvent>, log: &DropLog) {
    let counts = &app.metrics().statsd;
    let n = lines.len() as u64;
    let settings = app.settings();
    let mut note = |d: Dropped| {
        counts.add(d.outcome, 1);
        log.note(&d);
    };
    let batch = match prepare_lines(
        &**app.store(),
        lines,
        app.now(),
        &settings.limits,
        &settings.defaults,
        &mut note,
    ) {
        Ok(b) => b,
        Err(e) => {
            counts.add(Outcome::StoreError, n);
            log.note(&Dropped {
                outcome: Outcome::StoreError,
                reason: e.detail(),
            });
            return;
        }
    };
    let good = batch.increments.len() as u64;
    if good == 0 {
        return;
    }
    match app.store().apply(&batch) {
        Ok(()) => {
            counts.add(Outcome::Accepted, good);
            app.metrics().events.fetch_add(good, Ordering::Relaxed);
            app.metrics().batches.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            counts.add(Outcome::StoreError, good);
            log.note(&Dropped {
                outcome: Outcome::StoreError,
                reason: e.detail(),
            });
        }
    }
}

/// Binds the StatsD socket (before the engine recovers, so a bad address fails at once), asking
/// for a [`RECV_BUFFER_BYTES`] receive buffer.
pub async fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Best effort: the kernel caps it at net.core.rmem_max, and a smaller buffer still works.
    let _ = socket.set_recv_buffer_size(RECV_BUFFER_BYTES);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use tally_core::model::{Namespace, Schema, SchemaDoc};
    use tally_core::reference::MemStore;
    use tally_core::store::ManualClock;

    use super::*;

    const NOW: i64 = 1_795_176_000;

    fn line(s: &str) -> Result<RawEvent, Dropped> {
        parse_line(s.as_bytes(), "statsd", &mut Rng::new(7))
    }

    fn ev(key: &str, n: i64, ts: Option<i64>, dims: &[(&str, &str)]) -> RawEvent {
        RawEvent {
            ns: "statsd".into(),
            key: key.into(),
            ts,
            n: Some(n),
            dims: dims
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// The counter examples of Datadog's "DogStatsD datagram format" page.
    #[test]
    fn dogstatsd_counter_examples() {
        assert_eq!(line("page.views:1|c"), Ok(ev("page.views", 1, None, &[])));
        assert_eq!(
            line("users.online:1|c|#country:china"),
            Ok(ev("users.online", 1, None, &[("country", "china")]))
        );
        assert_eq!(
            line("users.online:1|c|#country:china|T1656581400"),
            Ok(ev(
                "users.online",
                1,
                Some(1_656_581_400),
                &[("country", "china")]
            ))
        );
        // @0.5: 1 / 0.5 = 2 exactly, whatever the draw.
        assert_eq!(
            line("page.views:1|c|@0.5|#env:prod"),
            Ok(ev("page.views", 2, None, &[("env", "prod")]))
        );
        assert_eq!(
            line("page.views:1|c|@0.5|#env:prod,country:de|T1656581400|c:83c0a99c0a54"),
            Ok(ev(
                "page.views",
                2,
                Some(1_656_581_400),
                &[("env", "prod"), ("country", "de")]
            ))
        );
        // Several values in one line (DogStatsD 1.1) add up; negative counts decrement.
        assert_eq!(
            line("page.views:1:2:3|c"),
            Ok(ev("page.views", 6, None, &[]))
        );
        assert_eq!(
            line("queue.depth:-4|c"),
            Ok(ev("queue.depth", -4, None, &[]))
        );
    }

    #[test]
    fn several_lines_per_datagram() {
        let mut out = Vec::new();
        let mut dropped = Vec::new();
        parse_datagram(
            b"a:1|c\nb:2|c|#k:v\r\n\nc:3|g\nd:4|c\n",
            "statsd",
            &mut Rng::new(1),
            &mut out,
            &mut |d| dropped.push(d.outcome),
        );
        assert_eq!(
            out,
            vec![
                ev("a", 1, None, &[]),
                ev("b", 2, None, &[("k", "v")]),
                ev("d", 4, None, &[])
            ]
        );
        assert_eq!(dropped, vec![Outcome::UnsupportedType]);
    }

    #[test]
    fn other_types_are_unsupported() {
        for l in [
            "temp:21|g",
            "req.time:320|ms",
            "size:5|h",
            "users:alice|s",
            "lat:1.5|d|#env:prod",
        ] {
            let d = line(l).unwrap_err();
            assert_eq!(d.outcome, Outcome::UnsupportedType, "{l}");
            assert!(d.reason.contains("only counters"), "{l}: {}", d.reason);
        }
    }

    #[test]
    fn malformed_lines_each_with_a_reason() {
        for (l, reason) in [
            ("page.views", "no ':'"),
            (":1|c", "empty metric name"),
            ("page.views:1", "no '|<type>'"),
            ("page.views:1|x", "unknown metric type \"x\""),
            ("page.views:abc|c", "value \"abc\" is not a number"),
            ("page.views:|c", "value \"\" is not a number"),
            ("page.views:nan|c", "not a number"),
            ("page.views:inf|c", "not a number"),
            ("page.views:1|c|@0", "sample rate \"0\""),
            ("page.views:1|c|@1.5", "sample rate \"1.5\""),
            ("page.views:1|c|@x", "sample rate \"x\""),
            ("page.views:1|c|@0.5|@0.5", "sample rate given twice"),
            ("page.views:1|c|Tsoon", "timestamp \"soon\""),
            ("page.views:1|c|#a:b|#c:d", "tags given twice"),
            ("page.views:1|c|zz", "unknown field \"zz\""),
        ] {
            let d = line(l).unwrap_err();
            assert_eq!(d.outcome, Outcome::Malformed, "{l}");
            assert!(d.reason.contains(reason), "{l}: {}", d.reason);
        }
        let d = parse_line(b"a\xff:1|c", "statsd", &mut Rng::new(1)).unwrap_err();
        assert_eq!(d, Dropped::malformed("the line is not UTF-8"));
    }

    #[test]
    fn limits_tags_and_lines() {
        let tags: Vec<String> = (0..17).map(|i| format!("t{i}:v")).collect();
        let d = line(&format!("k:1|c|#{}", tags.join(","))).unwrap_err();
        assert_eq!(d.outcome, Outcome::Invalid);
        assert!(d.reason.contains("at most 16"), "{}", d.reason);
        let sixteen = line(&format!("k:1|c|#{}", tags[..16].join(","))).unwrap();
        assert_eq!(sixteen.dims.len(), 16);
        let d = line("k:1|c|#env").unwrap_err();
        assert_eq!(d.outcome, Outcome::Invalid);
        assert!(d.reason.contains("has no value"), "{}", d.reason);
        // 2^53 parses, and the API's rules refuse it (see below); past i64 it cannot parse.
        assert_eq!(line("k:9007199254740992|c").unwrap().n, Some(1 << 53));
        let d = line("k:4503599627370496|c|@0.25").unwrap_err();
        assert!(d.reason.contains("out of range"), "{}", d.reason);
        let d = line("k:99999999999999999999|c").unwrap_err();
        assert!(d.reason.contains("out of range"), "{}", d.reason);

        let datagram = "k:1|c\n".repeat(MAX_LINES_PER_DATAGRAM + 3);
        let (mut out, mut dropped) = (Vec::new(), Vec::new());
        parse_datagram(
            datagram.as_bytes(),
            "statsd",
            &mut Rng::new(1),
            &mut out,
            &mut |d| dropped.push(d),
        );
        assert_eq!(out.len(), MAX_LINES_PER_DATAGRAM);
        assert_eq!(dropped.len(), 3);
        assert!(dropped.iter().all(|d| d.outcome == Outcome::Malformed));
    }

    #[test]
    fn unicode_names_and_tags() {
        assert_eq!(
            line("página.vistas:1|c|#país:España"),
            Ok(ev("página.vistas", 1, None, &[("país", "España")]))
        );
        assert_eq!(line("访问:3|c"), Ok(ev("访问", 3, None, &[])));
    }

    #[test]
    fn sample_rates_are_unbiased_integers() {
        let mut rng = Rng::new(42);
        let mut total = 0i64;
        for _ in 0..100_000 {
            let e = parse_line(b"k:1|c|@0.3", "statsd", &mut rng).unwrap();
            let n = e.n.unwrap();
            assert!(n == 3 || n == 4, "{n}");
            total += n;
        }
        // Expected 333,333.3; the standard deviation of the sum is ~145.
        assert!((total - 333_333).abs() < 1_000, "{total}");
        let mut rng = Rng::new(42);
        let halves: i64 = (0..10_000)
            .map(|_| {
                parse_line(b"k:0.5|c", "statsd", &mut rng)
                    .unwrap()
                    .n
                    .unwrap()
            })
            .sum();
        assert!((halves - 5_000).abs() < 250, "{halves}");
    }

    fn prepare(store: &MemStore, lines: &[&str]) -> (Batch, Vec<Dropped>) {
        let raws = lines.iter().map(|l| line(l).unwrap()).collect::<Vec<_>>();
        let mut dropped = Vec::new();
        let b = prepare_lines(
            store,
            raws,
            NOW,
            &Limits::default(),
            &Defaults::default(),
            &mut |d| dropped.push(d),
        )
        .unwrap();
        (b, dropped)
    }

    #[test]
    fn lines_are_validated_alone_with_the_api_rules() {
        let store = MemStore::new(Arc::new(ManualClock::new(NOW)));
        let ns = Namespace::new("statsd").unwrap();
        let schema = Schema::from_doc(&SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: Some(vec!["country".into()]),
        })
        .unwrap();
        store.put_schema(&ns, &schema).unwrap();
        let long = format!("{}:1|c", "k".repeat(257));
        let (batch, dropped) = prepare(
            &store,
            &[
                "ok:1|c|#country:de",
                "bad:1|c|#env:prod",
                &long,
                "Bad-Dim:1|c|#Env:x",
                "future:1|c|T9999999999",
                "big:9007199254740992|c",
                "ok:2|c",
            ],
        );
        assert_eq!(batch.increments.len(), 2);
        assert!(batch.create.is_empty());
        let reasons: Vec<_> = dropped.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert!(dropped.iter().all(|d| d.outcome == Outcome::Invalid));
        assert!(reasons[0].contains("not in the namespace's allow-list"));
        assert!(reasons[1].contains("invalid key"), "{}", reasons[1]);
        assert!(reasons[2].contains("invalid dimension"), "{}", reasons[2]);
        assert!(reasons[3].contains("timestamp"), "{}", reasons[3]);
        assert!(reasons[4].contains("invalid amount"), "{}", reasons[4]);
    }

    #[test]
    fn a_new_namespace_is_created_once_per_batch() {
        let store = MemStore::new(Arc::new(ManualClock::new(NOW)));
        let (batch, dropped) = prepare(&store, &["a:1|c", "b:1|c", "a:1|c"]);
        assert!(dropped.is_empty());
        assert_eq!(batch.create.len(), 1);
        assert_eq!(batch.increments.len(), 3);
        store.apply(&batch).unwrap();
    }
}

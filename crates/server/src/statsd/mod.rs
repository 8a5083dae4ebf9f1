//! StatsD / DogStatsD counters over UDP and TCP (issue 13): existing apps count into tally
//! without new client code.
//!
//! **Format.** A datagram (or a TCP connection: see [`tcp`]) holds one or more newline-separated
//! lines (a trailing `\r` is ignored, blank lines are skipped), each
//! `<name>:<value>[:<value>…]|<type>[|@<rate>][|#<k:v>,<k:v>…][|T<unix>][|c:<container>]`.
//! Only counters (`|c`) are counted. Where a line goes is [`map`]'s: by default the metric name
//! is the key, the namespace is `[statsd] namespace` (default `statsd`) and each tag `k:v` is a
//! dimension (so it must be a valid dimension name, and in the namespace's allow-list if it
//! has one); `[[statsd.map]]` rules route names by prefix, build keys from the name and tags,
//! and choose which tags become dimensions. `|T<unix>` is the event's timestamp (default:
//! now). Several values packed in one line (DogStatsD 1.1) add up.
//!
//! **Sample rates.** `|@r` (0 < r ≤ 1) means the client sent one line in 1/r, so the line counts
//! `x = value / r`. Counts are integers, so `x` is rounded *stochastically*: `floor(x)`, plus 1
//! with probability `x − floor(x)`, drawn from a seeded PRNG (splitmix64, seeded per receiver
//! from the clock). The expected count is exactly `x`, so totals over many lines are unbiased;
//! a line without a rate and with integer values is counted exactly. The same rounding applies
//! to fractional values (`1.5|c`).
//!
//! **Outcomes.** Every line ends in exactly one outcome, counted in `/metrics` as
//! `tally_statsd_lines_total{outcome=…}`: `accepted`; `malformed` (not the format above);
//! `unsupported_type` (gauges `g`, timers `ms`, histograms `h`, sets `s`, distributions `d`);
//! `invalid` (refused by the HTTP API's own rules — [`tally_core::ingest::prepare_owned`] — e.g. a key over
//! 256 bytes, a tag outside the allow-list, more than 16 dimensions, or a key template's tag
//! missing); `store_error` (the store refused the batch, e.g. backend unavailable). A dropped
//! line is never partly applied, and is named with its reason in a log line at most once a
//! second.
//!
//! **Bounds.** A datagram is read into a 65,535-byte buffer (the UDP maximum), and every line
//! of it is parsed: the bytes bound the work (the shortest counter line, `a:1|c`, and its
//! newline take 6 bytes, so a full datagram carries at most 10,922 events); a line
//! carries at most [`MAX_TAGS_PER_LINE`] tags, and at most 16 of them become dimensions. TCP's
//! bounds (line length, connections, idle time) are [`tcp`]'s. Accepted lines are applied in
//! batches of about [`BATCH_LINES`] lines or [`BATCH_MS`] ms, whichever comes first, through the
//! path `POST /v1/events` takes (validate, then `Store::apply`, here on the blocking pool), so
//! every backend works unchanged. At most [`QUEUED_BATCHES`] batches wait for the store; past that
//! the receivers stop reading: TCP senders are slowed by TCP itself, datagrams wait in the
//! socket's receive buffer ([`RECV_BUFFER_BYTES`] asked, capped by the kernel's
//! `net.core.rmem_max`), and past that the kernel drops them, as UDP does.
//!
//! StatsD carries no token: the listener writes only the namespaces its configuration names,
//! and belongs on a trusted network (it listens on the loopback in the SPEC's example).

pub mod map;
mod parse;
pub mod tcp;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally_core::model::RawEvent;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::app::App;
pub use map::Mapping;
pub use parse::{Rng, parse_datagram, parse_line, prepare_lines};

/// The largest UDP payload, and the receive buffer's size.
pub const MAX_DATAGRAM_BYTES: usize = 65_535;
/// Tags per line (of which at most 16 may become dimensions).
pub const MAX_TAGS_PER_LINE: usize = 64;
/// A batch is applied once it holds this many lines …
pub const BATCH_LINES: usize = 2000;
/// … or this many milliseconds after its first line arrived.
pub const BATCH_MS: u64 = 5;
/// Batches waiting for the store at most.
pub const QUEUED_BATCHES: usize = 4;
/// Receivers' chunks (a datagram's or a TCP read's lines) waiting for the batcher at most.
const QUEUED_CHUNKS: usize = 64;
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

/// The lines' counters for `/metrics`; rendered once a listener has started.
#[derive(Debug, Default)]
pub struct LineCounts {
    enabled: AtomicBool,
    counts: [AtomicU64; 5],
    /// TCP connections open now.
    pub tcp_connections: AtomicU64,
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

/// What every receiver shares: the app, the mapping, the drop log, the seed of its PRNGs.
pub(crate) struct Ctx {
    app: App,
    map: Mapping,
    log: DropLog,
    seed: u64,
}

impl Ctx {
    /// Counts a dropped line and logs it (rate-limited).
    fn drop_line(&self, d: &Dropped) {
        self.app.metrics().statsd.add(d.outcome, 1);
        self.log.note(d);
    }
}

/// The sockets a StatsD listener reads: UDP datagrams, TCP connections, or both.
#[derive(Debug, Default)]
pub struct Sockets {
    pub udp: Option<UdpSocket>,
    pub tcp: Option<TcpListener>,
}

/// Receives StatsD lines on `sockets` into `app`'s store until `shutdown` completes, then
/// reads what has arrived already (the datagrams the kernel holds, what each TCP
/// connection's buffer holds), applies all it holds, and returns.
///
/// Receivers (the UDP socket, each TCP connection) parse lines and send them on to one
/// batcher, which applies them in batches of [`BATCH_LINES`] or [`BATCH_MS`], one batch at a
/// time, with at most [`QUEUED_BATCHES`] waiting: when the store is behind, the receivers wait,
/// and so stop reading.
pub async fn serve(sockets: Sockets, app: App, shutdown: impl Future<Output = ()>) {
    app.metrics().statsd.enable();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let ctx = Arc::new(Ctx {
        map: app.settings().statsd.map.clone(),
        app: app.clone(),
        log: DropLog::default(),
        seed,
    });
    let (tx, rx) = mpsc::channel::<Vec<RawEvent>>(QUEUED_CHUNKS);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut receivers = JoinSet::new();
    if let Some(udp) = sockets.udp {
        receivers.spawn(receive_udp(udp, ctx.clone(), tx.clone(), stop_rx.clone()));
    }
    if let Some(tcp) = sockets.tcp {
        receivers.spawn(tcp::accept(tcp, ctx.clone(), tx.clone(), stop_rx));
    }
    drop(tx);
    let batcher = tokio::spawn(batch(ctx, rx));
    shutdown.await;
    let _ = stop_tx.send(true);
    while receivers.join_next().await.is_some() {}
    let _ = batcher.await;
}

/// Reads datagrams until `stop`.
async fn receive_udp(
    socket: UdpSocket,
    ctx: Arc<Ctx>,
    tx: mpsc::Sender<Vec<RawEvent>>,
    mut stop: watch::Receiver<bool>,
) {
    tracing::debug!(
        receive_buffer_bytes = socket2::SockRef::from(&socket)
            .recv_buffer_size()
            .unwrap_or(0),
        "statsd UDP listener started"
    );
    let mut rng = Rng::new(ctx.seed ^ socket.local_addr().map_or(0, |a| u64::from(a.port())));
    let mut buf = vec![0u8; MAX_DATAGRAM_BYTES];
    loop {
        let got = tokio::select! {
            biased;
            _ = stop.changed() => break,
            got = socket.recv_from(&mut buf) => got,
        };
        match got {
            Ok((len, _from)) => {
                let events = ctx.take(buf.get(..len).unwrap_or_default(), &mut rng);
                if !events.is_empty() && tx.send(events).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "statsd: receiving failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // Datagrams that arrived before the stop are the senders' as much as any: what the
    // kernel holds is counted too (bounded by its receive buffer, and by DRAIN_DATAGRAMS).
    // Straight to the socket: tokio's `try_recv_from` answers "would block" for a socket it
    // has not seen ready yet, whatever the kernel holds.
    let raw = socket2::SockRef::from(&socket);
    for _ in 0..DRAIN_DATAGRAMS {
        let Ok(len) = std::io::Read::read(&mut &*raw, &mut buf) else {
            break;
        };
        let events = ctx.take(buf.get(..len).unwrap_or_default(), &mut rng);
        if !events.is_empty() && tx.send(events).await.is_err() {
            return;
        }
    }
}

/// Datagrams read after a stop at most (the kernel's buffer holds fewer).
const DRAIN_DATAGRAMS: usize = 100_000;

impl Ctx {
    /// A datagram's (or a TCP read's) lines as events; those without a timestamp are
    /// stamped now, as they arrive, not when their batch is applied (a store that is behind
    /// would move them to a later bucket). Bad lines are counted and dropped.
    fn take(&self, datagram: &[u8], rng: &mut Rng) -> Vec<RawEvent> {
        let mut events = Vec::new();
        parse_datagram(datagram, &self.map, rng, &mut events, &mut |d| {
            self.drop_line(&d)
        });
        self.stamp(&mut events);
        events
    }

    /// Gives the events without a timestamp the time now.
    fn stamp(&self, events: &mut [RawEvent]) {
        if events.iter().any(|e| e.ts.is_none()) {
            let now = self.app.now();
            for e in events {
                e.ts.get_or_insert(now);
            }
        }
    }
}

/// Gathers the receivers' lines into batches and hands them to the applier, until every
/// receiver has stopped; then applies what it holds.
async fn batch(ctx: Arc<Ctx>, mut rx: mpsc::Receiver<Vec<RawEvent>>) {
    let (tx, batches) = mpsc::channel::<Vec<RawEvent>>(QUEUED_BATCHES);
    let applier = tokio::spawn(apply_batches(ctx, batches));
    let mut pending: Vec<RawEvent> = Vec::new();
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let (flush, open) = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => (true, true),
            got = rx.recv() => match got {
                Some(mut events) => {
                    if pending.is_empty() {
                        due = Some(tokio::time::Instant::now() + Duration::from_millis(BATCH_MS));
                        pending = std::mem::take(&mut events);
                    } else {
                        pending.append(&mut events);
                    }
                    (pending.len() >= BATCH_LINES, true)
                }
                None => (true, false),
            },
        };
        if flush && !pending.is_empty() {
            due = None;
            if tx.send(std::mem::take(&mut pending)).await.is_err() {
                break;
            }
        }
        if !open {
            break;
        }
    }
    drop(tx);
    let _ = applier.await;
}

/// Applies the batches the receiver sends, one at a time, on the blocking pool.
async fn apply_batches(ctx: Arc<Ctx>, mut rx: mpsc::Receiver<Vec<RawEvent>>) {
    while let Some(lines) = rx.recv().await {
        let n = lines.len() as u64;
        let c = ctx.clone();
        let done = tokio::task::spawn_blocking(move || apply_lines(&c.app, lines, &c.log)).await;
        if let Err(e) = done {
            ctx.app.metrics().statsd.add(Outcome::StoreError, n);
            ctx.log.note(&Dropped {
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
    let mut noted = 0;
    let mut note = |d: Dropped| {
        noted += 1;
        counts.add(d.outcome, 1);
        log.note(&d);
    };
    let prepared = prepare_lines(
        &**app.store(),
        lines,
        app.now(),
        &settings.limits,
        &settings.defaults,
        &mut note,
    );
    // Every line ends in one outcome: those dropped already keep theirs.
    let store_failed = |lines: u64, e: tally_core::store::StoreError| {
        counts.add(Outcome::StoreError, lines);
        log.note(&Dropped {
            outcome: Outcome::StoreError,
            reason: e.detail(),
        });
    };
    let batch = match prepared {
        Ok(b) => b,
        Err(e) => return store_failed(n - noted, e),
    };
    let good = batch.increments.len() as u64;
    if good == 0 {
        return;
    }
    // Namespaces another batch (HTTP, `PUT`) created since this one was prepared can leave
    // some of this batch's own past the limit: their lines are dropped, the others kept.
    let mut batch = batch;
    let _reserved = match app.reserve_creations(&batch) {
        Ok((reserved, over)) => {
            let max = settings.limits.max_namespaces;
            for ns in &over {
                let lines =
                    tally_core::ingest::without_namespaces(&mut batch, std::slice::from_ref(ns));
                counts.add(Outcome::Invalid, lines.len() as u64);
                log.note(&Dropped::invalid(tally_core::ingest::too_many_namespaces(
                    ns.as_str(),
                    max,
                )));
            }
            reserved
        }
        Err(e) => return store_failed(good, e),
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
        Err(e) => store_failed(good, e),
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

/// Binds the StatsD TCP listener (before the engine recovers, like [`bind`]).
pub async fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

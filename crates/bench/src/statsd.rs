//! StatsD ingest (issue 13): lines/s accepted over loopback UDP with zero loss, beside the
//! HTTP NDJSON path on the same clickstream events in the same run.
//!
//! A sender paces datagrams (≤ 1 400 bytes, the usual MTU-safe client size) at a fixed rate
//! for 3 s, waits until the listener has decided every line it will, and compares
//! `tally_statsd_lines_total{outcome="accepted"}` with what it sent; the rate doubles until
//! lines are lost or the listener finishes more than 250 ms after the sender (it is falling
//! behind, riding on its receive buffer). UDP has no flow control, so past the listener's pace
//! the kernel drops datagrams: the highest rate without loss is the figure that counts.
//!
//! TCP has flow control, so it is measured flat out: two connections write every line as fast
//! as the listener reads, and the figure is lines accepted per second until the last one is.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_core::model::RawEvent;
use tally_core::store::{Clock, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};
use tally_server::{App, Settings};

use crate::http::{Conn, ndjson};
use crate::workload;

/// A server with HTTP and StatsD on free loopback ports.
struct Running {
    http: SocketAddr,
    udp: SocketAddr,
    tcp: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(fsync: FsyncPolicy) -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::new(dir.path());
        cfg.fsync = fsync;
        let engine = Arc::new(Engine::open(cfg).expect("open"));
        let app = App::new(engine, Settings::default(), Arc::new(SystemClock));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (atx, arx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let udp = tally_server::statsd::bind("127.0.0.1:0".parse().expect("addr"))
                    .await
                    .expect("bind udp");
                let tcp = tally_server::statsd::bind_tcp("127.0.0.1:0".parse().expect("addr"))
                    .await
                    .expect("bind tcp");
                atx.send((
                    l.local_addr().expect("addr"),
                    udp.local_addr().expect("addr"),
                    tcp.local_addr().expect("addr"),
                ))
                .expect("send");
                let (utx, urx) = tokio::sync::oneshot::channel::<()>();
                let statsd = tokio::spawn(tally_server::statsd::serve(
                    tally_server::statsd::Sockets {
                        udp: Some(udp),
                        tcp: Some(tcp),
                    },
                    app.clone(),
                    async {
                        let _ = urx.await;
                    },
                ));
                let _ = tally_server::serve(l, app, async move {
                    let _ = rx.await;
                })
                .await;
                let _ = utx.send(());
                let _ = statsd.await;
            });
        });
        let (http, udp, tcp) = arx.recv().expect("addr");
        Running {
            http,
            udp,
            tcp,
            stop: Some(tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// `tally_statsd_lines_total` for `outcome`.
    fn lines(&self, outcome: &str) -> u64 {
        let (_, body) = Conn::open(self.http).request("GET", "/metrics", "text/plain", b"");
        let needle = format!("tally_statsd_lines_total{{outcome=\"{outcome}\"}} ");
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix(needle.as_str()))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Lines decided so far (every outcome).
    fn decided(&self) -> u64 {
        [
            "accepted",
            "malformed",
            "unsupported_type",
            "invalid",
            "store_error",
        ]
        .iter()
        .map(|o| self.lines(o))
        .sum()
    }

    /// Waits until `target` lines are decided or the count stops moving for 300 ms; returns
    /// the count and when it got there.
    fn settle(&self, target: u64) -> (u64, Instant) {
        let mut last = self.decided();
        let mut moved = Instant::now();
        loop {
            if last >= target {
                return (last, Instant::now());
            }
            std::thread::sleep(Duration::from_millis(5));
            let now = self.decided();
            if now != last {
                last = now;
                moved = Instant::now();
            } else if moved.elapsed() > Duration::from_millis(300) {
                return (now, moved);
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The events as DogStatsD lines packed into datagrams of at most 1 400 bytes; with the
/// number of lines in each.
fn datagrams(raws: &[RawEvent]) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut n = 0;
    for r in raws {
        let tags: Vec<String> = r.dims.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let line = format!(
            "{}:{}|c|#{}|T{}\n",
            r.key,
            r.n.unwrap_or(1),
            tags.join(","),
            r.ts.unwrap_or_default()
        );
        if cur.len() + line.len() > 1400 {
            out.push((std::mem::take(&mut cur), n));
            n = 0;
        }
        cur.extend_from_slice(line.as_bytes());
        n += 1;
    }
    if n > 0 {
        out.push((cur, n));
    }
    out
}

/// Sends `datagrams` (cycling) at `rate` lines/s for `dur`; returns the lines sent.
fn send_paced(to: SocketAddr, datagrams: &[(Vec<u8>, u64)], rate: f64, dur: Duration) -> u64 {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let start = Instant::now();
    let mut sent = 0u64;
    for (d, n) in datagrams.iter().cycle() {
        let due = start + Duration::from_secs_f64(sent as f64 / rate);
        let now = Instant::now();
        if now.duration_since(start) >= dur {
            break;
        }
        if due > now + Duration::from_millis(1) {
            std::thread::sleep(due - now);
        }
        sock.send_to(d, to).expect("send");
        sent += n;
    }
    sent
}

pub fn bench() {
    let now = SystemClock.now();
    let shape = workload::Shape::default();
    let nbatches = 300;
    let raws = workload::raw_batches(shape, nbatches, now, 13);
    let flat: Vec<RawEvent> = raws.iter().flatten().cloned().collect();
    let grams = datagrams(&flat);
    let per = flat.len() as f64 / grams.len() as f64;
    println!(
        "workload: {} clickstream events; StatsD: {} datagrams of ~{per:.0} lines; NDJSON: {nbatches} bodies of {}",
        flat.len(),
        grams.len(),
        shape.batch
    );
    let mut rows: Vec<(String, String)> = Vec::new();
    for fsync in [FsyncPolicy::Never, FsyncPolicy::Always] {
        // HTTP NDJSON, 2 connections, the same events.
        let server = Running::start(fsync);
        let bodies: Arc<Vec<Vec<u8>>> = Arc::new(raws.iter().map(|r| ndjson(r)).collect());
        Conn::open(server.http).request("POST", "/v1/events", "application/x-ndjson", &bodies[0]);
        let t = Instant::now();
        let threads: Vec<_> = (0..2)
            .map(|c| {
                let (bodies, addr) = (bodies.clone(), server.http);
                std::thread::spawn(move || {
                    let mut conn = Conn::open(addr);
                    for b in bodies.iter().skip(c).step_by(2) {
                        let (st, _) = conn.request("POST", "/v1/events", "application/x-ndjson", b);
                        assert_eq!(st, 200);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().expect("client");
        }
        rows.push((
            format!("NDJSON over HTTP, fsync={fsync}, 2 connections"),
            format!(
                "{:.0} k events/s",
                flat.len() as f64 / t.elapsed().as_secs_f64() / 1e3
            ),
        ));
        drop(server);

        // StatsD over TCP: two connections, flat out.
        let server = Running::start(fsync);
        let stream: Arc<Vec<u8>> = Arc::new(grams.iter().flat_map(|(d, _)| d.clone()).collect());
        let t = Instant::now();
        let senders: Vec<_> = (0..2)
            .map(|_| {
                let (stream, addr) = (stream.clone(), server.tcp);
                std::thread::spawn(move || {
                    use std::io::Write;
                    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
                    conn.write_all(&stream).expect("write");
                })
            })
            .collect();
        for th in senders {
            th.join().expect("sender");
        }
        let total = 2 * flat.len() as u64;
        let (decided, done) = server.settle(total);
        assert_eq!(decided, total, "TCP loses nothing");
        assert_eq!(server.lines("accepted"), total);
        rows.push((
            format!("StatsD over TCP, fsync={fsync}, 2 connections"),
            format!(
                "{:.0} k lines/s",
                total as f64 / (done - t).as_secs_f64() / 1e3
            ),
        ));
        drop(server);

        // StatsD: double the rate until lines are lost or the listener falls behind.
        let server = Running::start(fsync);
        let mut best = None;
        let mut rate = 50_000.0;
        let secs = 3;
        loop {
            let before = server.decided();
            let accepted_before = server.lines("accepted");
            let t = Instant::now();
            let sent = send_paced(server.udp, &grams, rate, Duration::from_secs(secs));
            let stopped = Instant::now();
            let (decided, done) = server.settle(before + sent);
            let decided = decided - before;
            let accepted = server.lines("accepted") - accepted_before;
            let achieved = sent as f64 / (stopped - t).as_secs_f64();
            let lag = done.saturating_duration_since(stopped);
            let lost = sent.saturating_sub(decided);
            println!(
                "fsync={fsync} target {:.0} k lines/s: sent {sent} at {:.0} k/s, accepted {accepted}, lost {lost}, done {} ms after the sender",
                rate / 1e3,
                achieved / 1e3,
                lag.as_millis()
            );
            assert_eq!(accepted, decided, "every line decided is accepted");
            if lost > 0 || lag > Duration::from_millis(250) || achieved < rate * 0.9 {
                rows.push((
                    format!("StatsD over UDP, fsync={fsync}: the next rate"),
                    format!(
                        "{:.0} k lines/s sent: {lost} of {sent} lost ({:.2}%), done {} ms after the sender",
                        achieved / 1e3,
                        lost as f64 * 100.0 / sent as f64,
                        lag.as_millis()
                    ),
                ));
                break;
            }
            best = Some(achieved);
            rate *= 2.0;
        }
        rows.push((
            format!(
                "StatsD over UDP, fsync={fsync}: highest rate with zero loss, keeping up ({secs} s at each rate, doubling)"
            ),
            best.map_or("none".into(), |b| format!("{:.0} k lines/s", b / 1e3)),
        ));
    }
    println!("\n| measurement | result |\n|---|---|");
    for (a, b) in rows {
        println!("| {a} | {b} |");
    }
}

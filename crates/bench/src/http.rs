//! HTTP benchmarks (issue 4, SPEC §6): NDJSON batch ingest, single-event `incr` over many
//! connections, and series-query latency — against an in-process server on loopback over the
//! embedded engine. The client is a minimal keep-alive HTTP/1.1 writer/reader, so the figures
//! measure the server, not a client library. Client and server share the machine's 2 cores.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_core::store::{Batch, Clock, Store, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};
use tally_server::{App, Settings};

use crate::{redis_peer, workload};

/// One keep-alive connection.
pub struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        Conn::try_open(addr).expect("connect")
    }

    /// Connects, or says why not (the soak's server may just have been killed).
    pub fn try_open(addr: SocketAddr) -> std::io::Result<Conn> {
        let w = TcpStream::connect(addr)?;
        w.set_nodelay(true)?;
        // Nothing here should take long: a hung server is an error, not a wait.
        w.set_read_timeout(Some(Duration::from_secs(60)))?;
        let r = BufReader::with_capacity(1 << 16, w.try_clone()?);
        Ok(Conn { w, r })
    }

    /// Sends one request and reads the whole answer; returns the status and body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        ctype: &str,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        self.try_request(method, path, &[], ctype, body)
            .expect("request")
    }

    /// [`Conn::request`] with extra headers, and an error instead of a panic when the
    /// connection fails (a killed server): the caller cannot know whether it was applied.
    pub fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        ctype: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        use std::io::{Error, ErrorKind};
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.w.write_all(head.as_bytes())?;
        self.w.write_all(body)?;
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(Error::new(ErrorKind::UnexpectedEof, "connection closed"));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, format!("status line {line:?}")))?;
        let mut len = 0usize;
        loop {
            line.clear();
            if self.r.read_line(&mut line)? == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "connection closed"));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, v)) = l.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                len = v
                    .trim()
                    .parse()
                    .map_err(|_| Error::new(ErrorKind::InvalidData, format!("header {l:?}")))?;
            }
        }
        let mut out = vec![0; len];
        self.r.read_exact(&mut out)?;
        Ok((status, out))
    }
}

/// A server on a free loopback port, on its own runtime thread.
pub struct Running {
    pub addr: SocketAddr,
    pub engine: Arc<Engine>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: Option<tempfile::TempDir>,
}

impl Running {
    pub fn start(fsync: FsyncPolicy) -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::new(dir.path());
        cfg.fsync = fsync;
        let engine = Arc::new(Engine::open(cfg).expect("open"));
        let mut running = Running::over(engine, Arc::new(SystemClock));
        running._dir = Some(dir);
        running
    }

    /// A server over an engine the caller opened (and keeps the directory of), answering
    /// with `clock`'s time.
    pub fn over(engine: Arc<Engine>, clock: Arc<dyn Clock>) -> Running {
        let (addr, stop, thread) = launch(engine.clone(), clock);
        Running {
            addr,
            engine,
            stop: Some(stop),
            thread: Some(thread),
            _dir: None,
        }
    }
}

type Launched = (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
);

/// Serves an [`App`] over `store` on a free loopback port, on its own runtime thread.
fn launch(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Launched {
    let app = App::new(store, Settings::default(), clock);
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
            atx.send(l.local_addr().expect("addr")).expect("send");
            let _ = tally_server::serve(l, app, async move {
                let _ = rx.await;
            })
            .await;
        });
    });
    let addr = arx.recv().expect("addr");
    (addr, tx, thread)
}

/// A server over any store (the Redis backend), on a free loopback port.
pub struct RunningStore {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningStore {
    pub fn over(store: Arc<dyn Store>) -> RunningStore {
        let (addr, stop, thread) = launch(store, Arc::new(SystemClock));
        RunningStore {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for RunningStore {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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

pub fn ndjson(raws: &[tally_core::model::RawEvent]) -> Vec<u8> {
    let mut out = String::new();
    for r in raws {
        let dims: serde_json::Map<String, serde_json::Value> = r
            .dims
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let e = serde_json::json!({"ns": r.ns, "key": r.key, "ts": r.ts, "dims": dims});
        out.push_str(&e.to_string());
        out.push('\n');
    }
    out.into_bytes()
}

fn rate(n: usize, d: Duration) -> String {
    format!("{:.2} M events/s", n as f64 / d.as_secs_f64() / 1e6)
}

/// `only=ingest` runs the NDJSON ingest rows alone (to profile the write path).
pub fn bench(args: &[String]) {
    let only_ingest = args.iter().any(|a| a == "only=ingest");
    let now = SystemClock.now();
    let shape = workload::Shape::default();
    let nbatches = 600;
    let raws = workload::raw_batches(shape, nbatches, now, 11);
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(raws.iter().map(|r| ndjson(r)).collect());
    let events = nbatches * shape.batch;
    let mut rows: Vec<(String, String)> = Vec::new();
    println!(
        "workload: {nbatches} NDJSON bodies x {} clickstream events ({:.0} KiB each)",
        shape.batch,
        bodies[0].len() as f64 / 1024.0
    );

    // 1. NDJSON batch ingest.
    for (fsync, conns) in [(FsyncPolicy::Never, 2), (FsyncPolicy::Always, 4)] {
        let server = Running::start(fsync);
        // Warm: create the namespace.
        Conn::open(server.addr).request("POST", "/v1/events", "application/x-ndjson", &bodies[0]);
        let t = Instant::now();
        let threads: Vec<_> = (0..conns)
            .map(|c| {
                let (bodies, addr) = (bodies.clone(), server.addr);
                std::thread::spawn(move || {
                    let mut conn = Conn::open(addr);
                    for b in bodies.iter().skip(c).step_by(conns) {
                        let (st, body) =
                            conn.request("POST", "/v1/events", "application/x-ndjson", b);
                        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().expect("client");
        }
        rows.push((
            format!("NDJSON ingest over HTTP, fsync={fsync}, {conns} connections"),
            rate(events, t.elapsed()),
        ));
    }

    if only_ingest {
        print_rows(&rows);
        return;
    }

    // The peer on the same batches: Redis doing the seeds' scheme, no persistence.
    if let Ok(redis) = redis_peer::Server::start(None) {
        let scratch = tempfile::tempdir().expect("tempdir");
        let e = Engine::open(Config::new(scratch.path())).expect("open");
        let batches: Arc<Vec<Batch>> = Arc::new(workload::prepare(&e, raws.clone(), now));
        let t = Instant::now();
        let threads: Vec<_> = (0..2)
            .map(|c| {
                let (batches, port) = (batches.clone(), redis.port);
                std::thread::spawn(move || {
                    let mine: Vec<&Batch> = batches.iter().skip(c).step_by(2).collect();
                    redis_peer::run(port, &mine).expect("redis")
                })
            })
            .collect();
        for th in threads {
            th.join().expect("client");
        }
        rows.push((
            "peer: Redis, seeds' scheme, pipelined per batch, 2 connections, no AOF".into(),
            rate(events, t.elapsed()),
        ));
    }

    // 2. Single-event incr, many connections.
    for (fsync, conns) in [(FsyncPolicy::Never, 32), (FsyncPolicy::Always, 32)] {
        let server = Running::start(fsync);
        Conn::open(server.addr).request("POST", "/v1/ns/api/keys/warm/incr", "text/plain", b"");
        let dur = Duration::from_secs(3);
        let t = Instant::now();
        let threads: Vec<_> = (0..conns)
            .map(|c| {
                let addr = server.addr;
                std::thread::spawn(move || {
                    let mut conn = Conn::open(addr);
                    let mut n = 0usize;
                    let start = Instant::now();
                    while start.elapsed() < dur {
                        let path = format!(
                            "/v1/ns/api/keys/key_{}/incr?dim.status=200",
                            (c * 7919 + n) % 1000
                        );
                        let (st, _) = conn.request("POST", &path, "text/plain", b"");
                        assert_eq!(st, 200);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let total: usize = threads
            .into_iter()
            .map(|th| th.join().expect("client"))
            .sum();
        let fsyncs = server.engine.stats().wal.fsyncs;
        rows.push((
            format!("incr requests, fsync={fsync}, {conns} connections ({fsyncs} fsyncs)"),
            format!("{:.0} requests/s", total as f64 / t.elapsed().as_secs_f64()),
        ));
    }

    // 3. Series latency: 30 days into days in America/New_York, one key with hourly data.
    let server = Running::start(FsyncPolicy::Never);
    let mut conn = Conn::open(server.addr);
    let day = 86_400;
    let start = now / day * day - 30 * day;
    let fill: String = (0..30 * 24)
        .map(|h| {
            format!(
                "{{\"ns\":\"clicks\",\"key\":\"lnk_1\",\"ts\":{},\"n\":{}}}\n",
                start + h * 3600,
                h % 5 + 1
            )
        })
        .collect();
    let (st, _) = conn.request(
        "POST",
        "/v1/events",
        "application/x-ndjson",
        fill.as_bytes(),
    );
    assert_eq!(st, 200);
    let path = format!(
        "/v1/ns/clicks/keys/lnk_1/series?from={start}&to={}&unit=day&tz=America/New_York",
        start + 30 * day
    );
    let mut lat = Vec::new();
    for i in 0..3000 {
        let t = Instant::now();
        let (st, _) = conn.request("GET", &path, "text/plain", b"");
        if i >= 200 {
            lat.push(t.elapsed());
        }
        assert_eq!(st, 200);
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    rows.push((
        "series over HTTP, 30 days → days in America/New_York (one connection, 2800 requests)"
            .into(),
        format!("p50 {:?}, p99 {:?}", pct(0.5), pct(0.99)),
    ));
    // The same query in-process, through the engine and the query layer.
    let q = tally_core::query::SeriesQuery::parse(
        "clicks",
        "lnk_1",
        &[
            ("from", start.to_string().as_str()),
            ("to", (start + 30 * day).to_string().as_str()),
            ("unit", "day"),
            ("tz", "America/New_York"),
        ][..],
    )
    .expect("query");
    let mut lat = Vec::new();
    for i in 0..5000 {
        let t = Instant::now();
        let ctx = tally_core::query::Ctx {
            now: SystemClock.now(),
            max_points: 100_000,
            deadline: tally_core::store::Deadline::none(),
        };
        let a = tally_core::query::series(&*server.engine, ctx, &q).expect("series");
        std::hint::black_box(a);
        if i >= 500 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    rows.push((
        "series in-process (query::series over the engine), same query".into(),
        format!(
            "p50 {:?}, p99 {:?}",
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100]
        ),
    ));

    print_rows(&rows);
}

fn print_rows(rows: &[(String, String)]) {
    println!("\n| measurement | result |\n|---|---|");
    for (a, b) in rows {
        println!("| {a} | {b} |");
    }
}

//! The soak test of issue 9: a real `tally serve` process is SIGKILLed again and again while
//! writes are in flight, on one data directory kept across cycles, and after every restart
//! each key's count over all time must be exactly what was acknowledged — nothing lost,
//! nothing doubled — with each unacknowledged batch wholly present or wholly absent.
//!
//! How it knows: each writer thread owns its keys and sends JSON batches of `n = 1` events
//! with an `Idempotency-Key`; it counts what the server acknowledged per key, and remembers
//! the one batch it had in flight when the connection died. After the restart the driver
//! reads every key's total (`top` over the whole history, hourly tier), checks each writer's
//! difference is zero or exactly its in-flight batch, then retries that batch with the same
//! `Idempotency-Key` — which must be counted once, whether or not it had landed — and checks
//! again. Between cycles `tally check` must find the directory whole.
//!
//! [`disk_full`] is the second round: a server on a small tmpfs, the disk filled under it;
//! writes must be refused with 503 while acknowledged data stays exact, and once space is
//! freed, writes must be accepted again.
//!
//! `scripts/soak.sh` builds the release binaries and runs both.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::http::Conn;
use crate::workload::Rng;

const NS: &str = "soak";
const WRITERS: usize = 8;
const KEYS_PER_WRITER: usize = 16;
const MAX_BATCH: u64 = 8;
/// Event timestamps spread over the last 4 hours, so that every restart's flush moves closed
/// periods into the archive and later events land on them as deltas.
const TS_SPREAD: u64 = 4 * 3600;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// `--name value` pairs.
fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn required(args: &[String], name: &str) -> String {
    flag(args, name).unwrap_or_else(|| {
        eprintln!("soak: {name} is required");
        std::process::exit(2)
    })
}

/// A running `tally serve`, its log drained into memory.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    /// The ready line: recovery's figures.
    ready: String,
}

impl Server {
    fn start(tally: &Path, data: &Path) -> Server {
        let mut child = Command::new(tally)
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .env_remove("TALLY_CONFIG")
            .env_remove("TALLY_BACKEND")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tally serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on http://")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(line.clone());
                }
                let mut l = sink.lock().expect("log");
                l.push(line);
                if l.len() > 400 {
                    l.drain(..200);
                }
            }
        });
        let ready = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().expect("wait");
                panic!(
                    "tally serve did not become ready ({status}); its log:\n{}",
                    log.lock().expect("log").join("\n")
                );
            }
        };
        assert!(
            ready.contains("fsync always"),
            "the soak runs with fsync=always: {ready}"
        );
        let addr = ready
            .split("listening on http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {ready:?}"));
        Server {
            child,
            addr,
            log,
            ready,
        }
    }

    /// `replayed N events in M ms` from the ready line.
    fn replayed(&self) -> (u64, u64) {
        let r = self.ready.split("replayed ").nth(1).unwrap_or("");
        let mut w = r.split_whitespace();
        let events = w.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let ms = w.nth(2).and_then(|n| n.parse().ok()).unwrap_or(0);
        (events, ms)
    }

    fn logged(&self, needle: &str) -> bool {
        self.log
            .lock()
            .expect("log")
            .iter()
            .any(|l| l.contains(needle))
    }

    fn log_tail(&self) -> String {
        let l = self.log.lock().expect("log");
        l[l.len().saturating_sub(40)..].join("\n")
    }

    fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait");
    }

    /// SIGTERM; the exit status, or `None` if it took more than 10 s (then it is killed).
    fn sigterm(mut self) -> Option<ExitStatus> {
        let ok = Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", self.child.id())])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -TERM failed");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.sigkill();
        None
    }
}

/// `tally check --data DIR`: must exit 0. Answers how many torn log tails it reported.
fn check(tally: &Path, data: &Path) -> Result<u64, String> {
    let out = Command::new(tally)
        .args(["check", "--data"])
        .arg(data)
        .output()
        .expect("run tally check");
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "tally check failed: {}\n{said}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(said.lines().filter(|l| l.contains("torn write")).count() as u64)
}

/// Every key's count over the whole history, from `top` on the hourly tier.
fn totals(addr: SocketAddr, since: u64) -> HashMap<String, i64> {
    let mut conn = Conn::try_open(addr).expect("connect for the totals");
    let path = format!(
        "/v1/ns/{NS}/top?from={}&to={}&unit=hour&limit=10000",
        since - 86_400,
        now() + 3600
    );
    let (status, body) = conn
        .try_request("GET", &path, &[], "text/plain", b"")
        .expect("top");
    if status == 404 {
        return HashMap::new(); // nothing written yet: no namespace
    }
    let v: serde_json::Value = serde_json::from_slice(&body).expect("top JSON");
    assert_eq!(status, 200, "top: {v}");
    assert_eq!(v["other"], 0, "more keys than the top's limit: {v}");
    let map: HashMap<String, i64> = v["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().expect("key").to_owned(),
                k["n"].as_i64().expect("n"),
            )
        })
        .collect();
    assert_eq!(
        v["total"].as_i64(),
        Some(map.values().sum()),
        "the namespace total is not the sum of its keys: {v}"
    );
    map
}

/// A batch sent but not (yet) known to be counted.
#[derive(Debug, Clone)]
struct Batch {
    idem: String,
    body: Vec<u8>,
    /// Events per key index of the writer.
    counts: [i64; KEYS_PER_WRITER],
}

impl Batch {
    fn events(&self) -> i64 {
        self.counts.iter().sum()
    }
}

/// What one writer knows: acknowledged counts per key, and the batch it had in flight when
/// its connection died (unknown: applied wholly or not at all).
struct Writer {
    id: usize,
    acked: [i64; KEYS_PER_WRITER],
    in_flight: Option<Batch>,
    seq: u64,
    rng: Rng,
    /// Non-200 answers while the server was up: none are expected.
    refused: Vec<String>,
    /// When the soak started: keys' totals are read from the day before it.
    run: u64,
}

impl Writer {
    fn key(&self, j: usize) -> String {
        format!("w{}_k{j:02}", self.id)
    }

    fn next_batch(&mut self, run: u64) -> Batch {
        let size = 1 + self.rng.next_u64() % MAX_BATCH;
        let t = now();
        let mut counts = [0i64; KEYS_PER_WRITER];
        let events: Vec<serde_json::Value> = (0..size)
            .map(|_| {
                let j = (self.rng.next_u64() % KEYS_PER_WRITER as u64) as usize;
                counts[j] += 1;
                let ts = t - self.rng.next_u64() % TS_SPREAD;
                let shard = format!("s{}", self.rng.next_u64() % 4);
                serde_json::json!({"ns": NS, "key": self.key(j), "ts": ts, "n": 1, "dims": {"shard": shard}})
            })
            .collect();
        self.seq += 1;
        Batch {
            idem: format!("soak-{run}-w{}-{}", self.id, self.seq),
            body: serde_json::to_vec(&events).expect("json"),
            counts,
        }
    }

    /// Sends batches until `stop`, or until the connection fails (the server was killed):
    /// the batch then in flight is kept. Answers the batches acknowledged.
    fn write(&mut self, addr: SocketAddr, run: u64, stop: &AtomicBool) -> u64 {
        let Ok(mut conn) = Conn::try_open(addr) else {
            return 0;
        };
        let mut acked = 0;
        while !stop.load(Ordering::Relaxed) {
            let b = self.next_batch(run);
            match conn.try_request(
                "POST",
                "/v1/events",
                &[("Idempotency-Key", &b.idem)],
                "application/json",
                &b.body,
            ) {
                Ok((200, _)) => {
                    for (a, c) in self.acked.iter_mut().zip(b.counts) {
                        *a += c;
                    }
                    acked += 1;
                }
                Ok((status, body)) => {
                    // The contract: an error answer applied nothing. Checked as in flight.
                    self.refused
                        .push(format!("{status} {}", String::from_utf8_lossy(&body)));
                    self.in_flight = Some(b);
                    break;
                }
                Err(_) => {
                    self.in_flight = Some(b);
                    break;
                }
            }
        }
        acked
    }
}

/// The tally of a whole soak.
#[derive(Debug, Default)]
struct Outcome {
    batches_acked: u64,
    in_flight_landed: u64,
    in_flight_absent: u64,
    lost: i64,
    doubled: i64,
    partial: u64,
    torn_tails: u64,
    max_replayed: (u64, u64),
    violations: Vec<String>,
}

/// After a restart: each writer's keys hold exactly what was acknowledged, plus its in-flight
/// batch wholly or not at all; then the in-flight batches are retried under their
/// `Idempotency-Key` and must be counted exactly once.
fn verify(addr: SocketAddr, since: u64, writers: &mut [Writer], out: &mut Outcome, cycle: u64) {
    let seen = totals(addr, since);
    for w in writers.iter() {
        let diff: Vec<i64> = (0..KEYS_PER_WRITER)
            .map(|j| seen.get(&w.key(j)).copied().unwrap_or(0) - w.acked[j])
            .collect();
        let absent = diff.iter().all(|d| *d == 0);
        match &w.in_flight {
            Some(b) if diff == b.counts => out.in_flight_landed += 1,
            Some(_) | None if absent => {
                if w.in_flight.is_some() {
                    out.in_flight_absent += 1;
                }
            }
            _ => {
                let allowed = w
                    .in_flight
                    .as_ref()
                    .map_or([0; KEYS_PER_WRITER], |b| b.counts);
                for (d, a) in diff.iter().zip(allowed) {
                    if *d < 0 {
                        out.lost += -d;
                    } else if *d > a {
                        out.doubled += d - a;
                    }
                }
                out.partial += 1;
                out.violations.push(format!(
                    "cycle {cycle}, writer {}: counts minus acknowledged {diff:?}, in-flight batch {:?}",
                    w.id,
                    w.in_flight.as_ref().map(|b| b.counts)
                ));
            }
        }
    }
    // Retry what was in flight, under the same Idempotency-Key: once, whatever happened.
    let mut conn = Conn::try_open(addr).expect("connect for the retries");
    let mut retried = false;
    for w in writers.iter_mut() {
        let Some(b) = w.in_flight.take() else {
            continue;
        };
        let (status, body) = conn
            .try_request(
                "POST",
                "/v1/events",
                &[("Idempotency-Key", &b.idem)],
                "application/json",
                &b.body,
            )
            .expect("retry");
        assert_eq!(
            (status, String::from_utf8_lossy(&body).into_owned()),
            (200, format!("{{\"accepted\":{}}}", b.events())),
            "retrying writer {}'s batch",
            w.id
        );
        for (a, c) in w.acked.iter_mut().zip(b.counts) {
            *a += c;
        }
        out.batches_acked += 1;
        retried = true;
    }
    if retried {
        let seen = totals(addr, since);
        for w in writers.iter() {
            for j in 0..KEYS_PER_WRITER {
                let got = seen.get(&w.key(j)).copied().unwrap_or(0);
                if got != w.acked[j] {
                    if got > w.acked[j] {
                        out.doubled += got - w.acked[j];
                    } else {
                        out.lost += w.acked[j] - got;
                    }
                    out.violations.push(format!(
                        "cycle {cycle}, after the retries: {} counts {got}, acknowledged {}",
                        w.key(j),
                        w.acked[j]
                    ));
                }
            }
        }
    }
}

/// `soak --tally BIN --data DIR [--cycles N] [--seed S]`.
pub fn run(args: &[String]) {
    let tally = PathBuf::from(required(args, "--tally"));
    let data = PathBuf::from(required(args, "--data"));
    let cycles: u64 = flag(args, "--cycles").map_or(100, |c| c.parse().expect("--cycles"));
    let seed: u64 = flag(args, "--seed").map_or_else(now, |s| s.parse().expect("--seed"));
    let since = now();
    println!(
        "soak: {cycles} cycles on {} ({WRITERS} writers x {KEYS_PER_WRITER} keys, batches of 1-{MAX_BATCH} events, fsync=always), seed {seed}",
        data.display()
    );
    let mut rng = Rng::new(seed);
    let mut writers: Vec<Writer> = (0..WRITERS)
        .map(|id| Writer {
            id,
            acked: [0; KEYS_PER_WRITER],
            in_flight: None,
            seq: 0,
            rng: Rng::new(seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9)),
            refused: Vec::new(),
            run: since,
        })
        .collect();
    let mut out = Outcome::default();
    let started = Instant::now();
    for cycle in 1..=cycles {
        let server = Server::start(&tally, &data);
        let r = server.replayed();
        if r.0 > out.max_replayed.0 {
            out.max_replayed = r;
        }
        verify(server.addr, since, &mut writers, &mut out, cycle);
        if !out.violations.is_empty() {
            eprintln!("server log:\n{}", server.log_tail());
            break;
        }
        // Write for 1-4 s, then SIGKILL the server under the writers.
        let kill_after = Duration::from_millis(1000 + rng.next_u64() % 3000);
        let stop = AtomicBool::new(false);
        let addr = server.addr;
        let acked: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = writers
                .iter_mut()
                .map(|w| {
                    let stop = &stop;
                    s.spawn(move || w.write(addr, seed, stop))
                })
                .collect();
            std::thread::sleep(kill_after);
            server.sigkill();
            stop.store(true, Ordering::Relaxed);
            handles.into_iter().map(|h| h.join().expect("writer")).sum()
        });
        out.batches_acked += acked;
        let in_flight = writers.iter().filter(|w| w.in_flight.is_some()).count();
        match check(&tally, &data) {
            Ok(torn) => out.torn_tails += torn,
            Err(e) => {
                out.violations.push(format!("cycle {cycle}: {e}"));
                break;
            }
        }
        let refused: Vec<&String> = writers.iter().flat_map(|w| &w.refused).collect();
        if !refused.is_empty() {
            out.violations
                .push(format!("cycle {cycle}: error answers {refused:?}"));
            break;
        }
        println!(
            "cycle {cycle:3}: killed after {:4} ms, {acked:5} batches acknowledged, {in_flight} in flight; recovery replayed {} events in {} ms",
            kill_after.as_millis(),
            r.0,
            r.1
        );
        let _ = std::io::stdout().flush();
    }
    // A last restart verifies the last kill; then a clean stop and a last check.
    if out.violations.is_empty() {
        let server = Server::start(&tally, &data);
        verify(server.addr, since, &mut writers, &mut out, cycles + 1);
        match server.sigterm() {
            Some(s) if s.success() => {}
            other => out.violations.push(format!(
                "the last server did not stop cleanly on SIGTERM: {other:?}"
            )),
        }
        if let Err(e) = check(&tally, &data) {
            out.violations.push(format!("after the clean stop: {e}"));
        }
    }
    let events: i64 = writers.iter().flat_map(|w| w.acked).sum();
    println!(
        "\nsoak result: {cycles} cycles in {:.1} s; {} batches / {events} events acknowledged; \
         in flight at a kill: {} landed whole, {} absent, {} partial; lost {}, doubled {}; \
         torn log tails reported by check: {}; largest recovery: {} events replayed in {} ms",
        started.elapsed().as_secs_f64(),
        out.batches_acked,
        out.in_flight_landed,
        out.in_flight_absent,
        out.partial,
        out.lost,
        out.doubled,
        out.torn_tails,
        out.max_replayed.0,
        out.max_replayed.1,
    );
    if !out.violations.is_empty() {
        for v in &out.violations {
            eprintln!("VIOLATION: {v}");
        }
        std::process::exit(1);
    }
}

/// Fills the file system under `path` with one file, up to ENOSPC. Answers bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("create the filler");
    let mut written = 0u64;
    for chunk in [1 << 20, 4096, 512] {
        let buf = vec![0xA5u8; chunk];
        while f.write_all(&buf).is_ok() {
            written += chunk as u64;
        }
    }
    let _ = f.sync_all();
    written
}

/// One answer to a batch while the disk fills: acknowledged, or refused with 503 (anything
/// else breaks the contract and stops the round).
fn send(w: &mut Writer, conn: &mut Conn, b: &Batch) -> u16 {
    let (status, body) = conn
        .try_request(
            "POST",
            "/v1/events",
            &[("Idempotency-Key", &b.idem)],
            "application/json",
            &b.body,
        )
        .expect("the server answers while the disk is full");
    match status {
        200 => {
            for (a, c) in w.acked.iter_mut().zip(b.counts) {
                *a += c;
            }
        }
        503 => {}
        _ => panic!(
            "expected 200 or 503, got {status}: {}",
            String::from_utf8_lossy(&body)
        ),
    }
    status
}

/// Each writer's keys hold exactly what it had acknowledged. A writer whose keys hold its
/// first refused batch on top (a 503 whose record reached the log whole before the write
/// failed) is reported apart: it loses nothing, but breaks "an error answer applied nothing".
fn exact(
    writers: &[Writer],
    refused: &[Option<Batch>],
    addr: SocketAddr,
    when: &str,
) -> Vec<String> {
    let seen = totals(addr, since_of(writers));
    let mut out = Vec::new();
    for (w, r) in writers.iter().zip(refused) {
        let diff: Vec<i64> = (0..KEYS_PER_WRITER)
            .map(|j| seen.get(&w.key(j)).copied().unwrap_or(0) - w.acked[j])
            .collect();
        if diff.iter().all(|d| *d == 0) {
            continue;
        }
        if r.as_ref().is_some_and(|b| diff == b.counts) {
            out.push(format!(
                "{when}: writer {} holds its first batch answered 503 (applied though refused)",
                w.id
            ));
        } else {
            out.push(format!(
                "{when}: writer {} counts minus acknowledged {diff:?}",
                w.id
            ));
        }
    }
    out
}

/// The `since` every writer of the disk-full round shares (its run id).
fn since_of(writers: &[Writer]) -> u64 {
    writers.first().map_or(0, |w| w.run)
}

/// What one writer of the disk-full round saw.
struct Refusals {
    /// Its first batch answered 503: the one whose record may have reached the log.
    first: Option<Batch>,
    last: Option<Batch>,
    accepted_while_filling: u64,
    refused: u64,
}

/// `soak-disk-full --tally BIN --dir DIR`: DIR is a small file system of its own (the script
/// mounts a 64 MiB tmpfs). The data directory and a filler file live in it. Four writers
/// write while the disk is filled under them, so a group commit can straddle the failure.
pub fn disk_full(args: &[String]) {
    const DF_WRITERS: usize = 4;
    let tally = PathBuf::from(required(args, "--tally"));
    let dir = PathBuf::from(required(args, "--dir"));
    let data = dir.join("data");
    let filler = dir.join("filler");
    let since = now();
    let mut writers: Vec<Writer> = (0..DF_WRITERS)
        .map(|id| Writer {
            id,
            acked: [0; KEYS_PER_WRITER],
            in_flight: None,
            seq: 0,
            rng: Rng::new(since ^ id as u64),
            refused: Vec::new(),
            run: since,
        })
        .collect();
    let mut violations: Vec<String> = Vec::new();
    let report = |s: String| println!("disk-full: {s}");

    let server = Server::start(&tally, &data);
    let addr = server.addr;
    // Writers go on until each has had 5 refusals (or 30 s); the disk fills meanwhile.
    let filling = AtomicBool::new(false);
    let (refused, filled): (Vec<Refusals>, u64) = std::thread::scope(|s| {
        let handles: Vec<_> = writers
            .iter_mut()
            .map(|w| {
                let filling = &filling;
                s.spawn(move || {
                    let mut conn = Conn::try_open(addr).expect("connect");
                    let (mut first, mut last, mut ok_while_filling, mut n) =
                        (None, None, 0u64, 0u64);
                    let t = Instant::now();
                    while n < 5 && t.elapsed() < Duration::from_secs(30) {
                        let b = w.next_batch(since);
                        if send(w, &mut conn, &b) == 200 {
                            ok_while_filling += u64::from(filling.load(Ordering::Relaxed));
                        } else {
                            n += 1;
                            if first.is_none() {
                                first = Some(b.clone());
                            }
                            last = Some(b);
                        }
                    }
                    Refusals {
                        first,
                        last,
                        accepted_while_filling: ok_while_filling,
                        refused: n,
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        filling.store(true, Ordering::Relaxed);
        let filled = fill(&filler);
        (
            handles
                .into_iter()
                .map(|h| h.join().expect("writer"))
                .collect(),
            filled,
        )
    });
    let first_refused: Vec<Option<Batch>> = refused.iter().map(|r| r.first.clone()).collect();
    let before: i64 = writers.iter().flat_map(|w| w.acked).sum();
    report(format!(
        "{DF_WRITERS} writers; the disk filled under them ({:.1} MiB filler); {before} events acknowledged, {} batches accepted while it filled, {} answered 503",
        filled as f64 / (1 << 20) as f64,
        refused
            .iter()
            .map(|r| r.accepted_while_filling)
            .sum::<u64>(),
        refused.iter().map(|r| r.refused).sum::<u64>(),
    ));
    if refused.iter().any(|r| r.refused == 0) {
        violations.push("a writer was never refused on a full disk".into());
    }
    violations.extend(exact(&writers, &first_refused, addr, "while full"));

    // Free the space: do writes resume on the same process?
    std::fs::remove_file(&filler).expect("remove the filler");
    let mut conn = Conn::try_open(addr).expect("connect");
    let t = Instant::now();
    let mut resumed = false;
    while t.elapsed() < Duration::from_secs(3) {
        let b = writers[0].next_batch(since);
        if send(&mut writers[0], &mut conn, &b) == 200 {
            resumed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let server = if resumed {
        report("space freed: writes resumed on the same process".into());
        server
    } else {
        // The log writer poisons itself on a failed write: a restart is the way back.
        let poisoned = server.logged("refusing further writes");
        let stopped = server.sigterm();
        report(format!(
            "space freed: the same process still answers 503 (log writer poisoned: {poisoned}); SIGTERM -> {stopped:?}; restarted"
        ));
        Server::start(&tally, &data)
    };
    let when = if resumed {
        "once space was freed"
    } else {
        "after the restart"
    };
    let after_restart = exact(&writers, &first_refused, server.addr, when);
    let applied_though_refused = after_restart
        .iter()
        .filter(|v| v.contains("applied though refused"))
        .count();
    violations.extend(after_restart);
    // Each writer's last refused batch, retried under its Idempotency-Key: counted once.
    // (When a first refused batch was found applied, acknowledge it so the counts agree.)
    let mut conn = Conn::try_open(server.addr).expect("connect");
    for (w, r) in writers.iter_mut().zip(&refused) {
        if let Some(b) = &r.last {
            assert_eq!(send(w, &mut conn, b), 200, "retrying a refused batch");
            assert_eq!(send(w, &mut conn, b), 200, "replaying it");
            for (a, c) in w.acked.iter_mut().zip(b.counts) {
                *a -= c; // the replay applied nothing
            }
        }
    }
    for _ in 0..100 {
        let b = writers[0].next_batch(since);
        if send(&mut writers[0], &mut conn, &b) != 200 {
            violations.push("a write after space was freed was refused".into());
            break;
        }
    }
    violations.extend(exact(
        &writers,
        &first_refused,
        server.addr,
        "writes resumed",
    ));
    let after: i64 = writers.iter().flat_map(|w| w.acked).sum();
    match server.sigterm() {
        Some(s) if s.success() => {}
        other => violations.push(format!("no clean stop at the end: {other:?}")),
    }
    if let Err(e) = check(&tally, &data) {
        violations.push(e);
    }
    if resumed {
        // The same counts again from the log and the archive alone.
        let server = Server::start(&tally, &data);
        violations.extend(exact(
            &writers,
            &first_refused,
            server.addr,
            "after a restart",
        ));
        if !server.sigterm().is_some_and(|s| s.success()) {
            violations.push("no clean stop after the restart".into());
        }
    }
    report(format!(
        "{after} events acknowledged in all; batches answered 503 yet applied {when}: {applied_though_refused}; violations: {}",
        violations.len()
    ));
    if !violations.is_empty() {
        for v in &violations {
            eprintln!("VIOLATION: {v}");
        }
        std::process::exit(1);
    }
}

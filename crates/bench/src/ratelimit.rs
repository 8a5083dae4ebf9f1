//! Rate limiting (issue 14): tally's atomic `incr?window=1m&max=…` against plain `incr`, and
//! against the seeds' limiter on `redis-server` — the rolling-window Lua script over a sorted
//! set (seed 002: `ZREMRANGEBYSCORE`, `ZCARD`, then `ZADD` + `PEXPIRE` only when under the
//! limit), called with `EVALSHA` — in one run, on the same machine, with the same client
//! concurrency and the same requests.
//!
//! Every connection sends a fixed, deterministic list of requests: API keys drawn from a Zipf
//! distribution over 1,000 keys, one request at a time (no pipelining), so tally over HTTP and
//! Redis over RESP see exactly the same keys in the same order per connection. A whole run fits
//! inside one window, so a working limiter accepts exactly `min(requests, max)` of each key,
//! whatever the interleaving: the bench checks that per key for every limiter (from the
//! clients' answers and from the server's own count afterwards), so every figure comes from a
//! limiter that held.
//!
//! ```sh
//! cargo run --release -p tally-bench -- ratelimit [--requests N] [--conns C]
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tally_engine::FsyncPolicy;

use crate::http::{Conn, Running};
use crate::redis_peer;
use crate::workload::{Rng, Zipf};

const KEYS: usize = 1000;
const ZIPF_S: f64 = 1.0;
const MAX: usize = 100;
const WINDOW_SECS: u64 = 60;
const NS: &str = "api_hits";
const TIERS: &str = r#"{"tiers": ["1s:2h", "1m:48h", "1h:forever"]}"#;
/// A run must end well inside the window for the exact per-key check to hold.
const RUN_LIMIT: Duration = Duration::from_secs(50);

/// The seeds' rolling-window limiter (seed 002's sorted set, made a limiter): drop what left
/// the window, count, and add this request only if it fits. `ARGV`: now (ms), window (ms),
/// max, a member unique to this request. Returns the new count when accepted, or minus the
/// current count when refused.
const LUA: &str = r"
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
if count + 1 > max then
  return -count
end
redis.call('ZADD', key, now, ARGV[4])
redis.call('PEXPIRE', key, window)
return count + 1
";

/// What one run of the clients saw.
struct Outcome {
    secs: f64,
    accepted: usize,
    refused: usize,
    /// Accepted per key rank.
    per_key: Vec<usize>,
    /// Latency per request, sorted.
    lat: Vec<Duration>,
}

impl Outcome {
    fn rps(&self) -> f64 {
        (self.accepted + self.refused) as f64 / self.secs
    }

    fn pct(&self, p: f64) -> Duration {
        self.lat[((self.lat.len() as f64 * p) as usize).min(self.lat.len() - 1)]
    }
}

/// Per connection, the key ranks it sends, in order.
fn plan(conns: usize, requests: usize) -> Arc<Vec<Vec<u16>>> {
    let zipf = Zipf::new(KEYS, ZIPF_S);
    Arc::new(
        (0..conns)
            .map(|c| {
                let mut rng = Rng::new(1400 + c as u64);
                (0..requests)
                    .map(|_| zipf.sample(&mut rng) as u16)
                    .collect()
            })
            .collect(),
    )
}

/// Runs one client thread per connection; `send` answers whether the request was accepted.
fn drive<C>(plan: &Arc<Vec<Vec<u16>>>, connect: C) -> Outcome
where
    C: Fn(usize) -> Box<dyn FnMut(u16, usize) -> bool + Send> + Send + Sync + 'static,
{
    let connect = Arc::new(connect);
    let start = Instant::now();
    let threads: Vec<_> = (0..plan.len())
        .map(|c| {
            let (plan, connect) = (plan.clone(), connect.clone());
            std::thread::spawn(move || {
                let mut send = connect(c);
                let mut per_key = vec![0usize; KEYS];
                let mut lat = Vec::with_capacity(plan[c].len());
                let mut refused = 0;
                for (i, &rank) in plan[c].iter().enumerate() {
                    let t = Instant::now();
                    if send(rank, i) {
                        per_key[rank as usize] += 1;
                    } else {
                        refused += 1;
                    }
                    lat.push(t.elapsed());
                }
                (per_key, refused, lat)
            })
        })
        .collect();
    let mut out = Outcome {
        secs: 0.0,
        accepted: 0,
        refused: 0,
        per_key: vec![0; KEYS],
        lat: Vec::new(),
    };
    for th in threads {
        let (per_key, refused, lat) = th.join().expect("client");
        for (a, b) in out.per_key.iter_mut().zip(per_key) {
            *a += b;
        }
        out.refused += refused;
        out.lat.extend(lat);
    }
    out.secs = start.elapsed().as_secs_f64();
    out.accepted = out.per_key.iter().sum();
    out.lat.sort();
    out
}

/// How many requests each key gets over the whole run.
fn attempts(plan: &[Vec<u16>]) -> Vec<usize> {
    let mut n = vec![0; KEYS];
    for r in plan.iter().flatten() {
        n[*r as usize] += 1;
    }
    n
}

/// The limiter held: inside one window, each key got exactly `min(attempts, max)` through,
/// by the clients' answers and by the server's own count (`counted`, per key).
fn check(label: &str, o: &Outcome, attempts: &[usize], max: usize, counted: &[usize]) {
    assert!(
        o.secs < RUN_LIMIT.as_secs_f64(),
        "{label}: the run took {:.0} s, too close to the {WINDOW_SECS} s window for the exact check; use fewer --requests",
        o.secs
    );
    for k in 0..KEYS {
        let want = attempts[k].min(max);
        assert_eq!(
            o.per_key[k], want,
            "{label}: key_{k} got {} accepted of {} requests, max {max}",
            o.per_key[k], attempts[k]
        );
        assert_eq!(
            counted[k], want,
            "{label}: the server counts {} for key_{k}, the clients saw {want} accepted",
            counted[k]
        );
    }
}

fn tally_run(
    fsync: FsyncPolicy,
    limited: bool,
    plan: &Arc<Vec<Vec<u16>>>,
) -> (Outcome, Vec<usize>, u64) {
    let server = Running::start(fsync);
    let (st, body) = Conn::open(server.addr).request(
        "PUT",
        &format!("/v1/ns/{NS}"),
        "application/json",
        TIERS.as_bytes(),
    );
    assert!(
        st == 200 || st == 201,
        "create namespace: {st} {}",
        String::from_utf8_lossy(&body)
    );
    let addr = server.addr;
    let query = if limited {
        format!("?window=1m&max={MAX}")
    } else {
        String::new()
    };
    let o = drive(plan, move |_| {
        let mut conn = Conn::open(addr);
        let query = query.clone();
        Box::new(move |rank, _| {
            let path = format!("/v1/ns/{NS}/keys/key_{rank}/incr{query}");
            let (st, body) = conn.request("POST", &path, "text/plain", b"");
            match st {
                200 => true,
                429 if limited => false,
                _ => panic!("{path}: {st} {}", String::from_utf8_lossy(&body)),
            }
        })
    });
    let fsyncs = server.engine.stats().wal.fsyncs;
    // The server's own count of the last minute, per key.
    let mut conn = Conn::open(server.addr);
    let counted = (0..KEYS)
        .map(|k| {
            let (st, body) = conn.request(
                "GET",
                &format!("/v1/ns/{NS}/keys/key_{k}/window?last=1m"),
                "text/plain",
                b"",
            );
            assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            v["n"].as_u64().expect("n") as usize
        })
        .collect();
    (o, counted, fsyncs)
}

/// A RESP connection that sends one command and reads one reply line.
struct Resp {
    w: TcpStream,
    r: BufReader<TcpStream>,
    line: String,
}

impl Resp {
    fn open(port: u16) -> Resp {
        let w = TcpStream::connect(("127.0.0.1", port)).expect("connect redis");
        w.set_nodelay(true).expect("nodelay");
        let r = BufReader::new(w.try_clone().expect("clone"));
        Resp {
            w,
            r,
            line: String::new(),
        }
    }

    fn send(&mut self, args: &[&[u8]]) -> &str {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&out).expect("write redis");
        self.line.clear();
        self.r.read_line(&mut self.line).expect("read redis");
        self.line.trim_end()
    }

    /// An integer reply.
    fn int(&mut self, args: &[&[u8]]) -> i64 {
        let l = self.send(args);
        l.strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("redis replied {l:?}"))
    }

    /// A bulk-string reply.
    fn bulk(&mut self, args: &[&[u8]]) -> String {
        let l = self.send(args).to_string();
        assert!(l.starts_with('$'), "redis replied {l:?}");
        self.line.clear();
        self.r.read_line(&mut self.line).expect("read redis");
        self.line.trim_end().to_string()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

fn redis_key(rank: u16) -> String {
    format!("rl:{{{NS}|key_{rank}}}")
}

/// The seeds' limiter on a fresh `redis-server`, or why it could not start.
fn redis_run(
    appendfsync: Option<&str>,
    plan: &Arc<Vec<Vec<u16>>>,
) -> Result<(Outcome, Vec<usize>), String> {
    let server = redis_peer::Server::start(appendfsync).map_err(|e| e.to_string())?;
    let port = server.port;
    let sha = Resp::open(port).bulk(&[b"SCRIPT", b"LOAD", LUA.as_bytes()]);
    let window_ms = (WINDOW_SECS * 1000).to_string();
    let max = MAX.to_string();
    let o = drive(plan, move |c| {
        let mut conn = Resp::open(port);
        let (sha, window_ms, max) = (sha.clone(), window_ms.clone(), max.clone());
        Box::new(move |rank, i| {
            let key = redis_key(rank);
            let now = now_ms().to_string();
            let member = format!("{c}:{i}");
            let r = conn.int(&[
                b"EVALSHA",
                sha.as_bytes(),
                b"1",
                key.as_bytes(),
                now.as_bytes(),
                window_ms.as_bytes(),
                max.as_bytes(),
                member.as_bytes(),
            ]);
            r > 0
        })
    });
    let mut conn = Resp::open(port);
    let counted = (0..KEYS as u16)
        .map(|k| conn.int(&[b"ZCARD", redis_key(k).as_bytes()]) as usize)
        .collect();
    Ok((o, counted))
}

fn row(what: &str, durability: &str, o: &Outcome, extra: &str) {
    let total = o.accepted + o.refused;
    println!(
        "| {what} | {durability} | {:.0} | {} / {} ({:.0}% refused) | {:.2} / {:.2} ms | {extra} |",
        o.rps(),
        o.accepted,
        o.refused,
        100.0 * o.refused as f64 / total as f64,
        o.pct(0.5).as_secs_f64() * 1e3,
        o.pct(0.99).as_secs_f64() * 1e3,
    );
}

pub fn bench(args: &[String]) {
    let mut requests = 3000;
    let mut conns = 32;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().and_then(|v| v.parse().ok());
        match (a.as_str(), v) {
            ("--requests", Some(v)) => requests = v,
            ("--conns", Some(v)) => conns = v,
            _ => {
                eprintln!("usage: ratelimit [--requests N (per connection)] [--conns C]");
                std::process::exit(2);
            }
        }
    }
    let plan = plan(conns, requests);
    let attempts = attempts(&plan);
    let over = attempts.iter().filter(|&&n| n > MAX).count();
    println!(
        "workload: {conns} connections x {requests} requests, one at a time; {KEYS} API keys, Zipf s={ZIPF_S} \
         (hottest {} requests, {over} keys over the limit); limit max={MAX} per 1m window, \
         namespace tiers [\"1s:2h\",\"1m:48h\",\"1h:forever\"]",
        attempts[0]
    );
    println!(
        "\n| limiter | durability | requests/s | accepted / refused | p50 / p99 latency | notes |\n|---|---|---:|---|---|---|"
    );
    let mut ratios = Vec::new();
    for (fsync, appendfsync, redis_label) in [
        (FsyncPolicy::Never, None, "no AOF (default)"),
        (
            FsyncPolicy::Always,
            Some("always"),
            "AOF, appendfsync always",
        ),
    ] {
        let (plain, counted, fsyncs) = tally_run(fsync, false, &plan);
        check("tally plain incr", &plain, &attempts, usize::MAX, &counted);
        row(
            "tally, plain `incr`",
            &format!("fsync={fsync}"),
            &plain,
            &format!("{fsyncs} fsyncs"),
        );
        let (lim, counted, fsyncs) = tally_run(fsync, true, &plan);
        check("tally limited incr", &lim, &attempts, MAX, &counted);
        row(
            &format!("tally, `incr?window=1m&max={MAX}`"),
            &format!("fsync={fsync}"),
            &lim,
            &format!("{fsyncs} fsyncs; per-key check passed"),
        );
        match redis_run(appendfsync, &plan) {
            Ok((red, counted)) => {
                check("redis lua limiter", &red, &attempts, MAX, &counted);
                row(
                    "Redis, seeds' Lua sorted-set limiter (`EVALSHA`)",
                    redis_label,
                    &red,
                    "per-key check passed",
                );
                ratios.push((
                    format!("fsync={fsync} vs Redis {redis_label}"),
                    lim.rps() / plain.rps(),
                    Some(lim.rps() / red.rps()),
                ));
            }
            Err(e) => {
                println!(
                    "| Redis, seeds' Lua sorted-set limiter | {redis_label} | skipped: {e} (apt-get install redis-server) | | | |"
                );
                ratios.push((format!("fsync={fsync}"), lim.rps() / plain.rps(), None));
            }
        }
    }
    println!(
        "\n| durability | tally limited / tally plain | tally limited / Redis Lua |\n|---|---|---|"
    );
    for (what, vs_plain, vs_redis) in ratios {
        println!(
            "| {what} | {vs_plain:.2}x | {} |",
            vs_redis.map_or("n/a".to_string(), |r| format!("{r:.2}x"))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_limiter_refuses_past_max_and_forgets_what_left_the_window() {
        let Ok(server) = redis_peer::Server::start(None) else {
            eprintln!("no redis-server: skipped");
            return;
        };
        let mut conn = Resp::open(server.port);
        let sha = conn.bulk(&[b"SCRIPT", b"LOAD", LUA.as_bytes()]);
        let mut call = |now: u64, member: &str| {
            conn.int(&[
                b"EVALSHA",
                sha.as_bytes(),
                b"1",
                b"k",
                now.to_string().as_bytes(),
                b"60000",
                b"3",
                member.as_bytes(),
            ])
        };
        // Three fit at max=3; the fourth is refused with the count, and added nothing.
        assert_eq!(call(1_000, "a"), 1);
        assert_eq!(call(1_001, "b"), 2);
        assert_eq!(call(30_000, "c"), 3);
        assert_eq!(call(30_001, "d"), -3);
        // At 61 000 the first two are 60 s old, out of the window: two more fit.
        assert_eq!(call(61_001, "e"), 2);
        assert_eq!(call(61_002, "f"), 3);
        assert_eq!(call(61_003, "g"), -3);
        assert_eq!(conn.int(&[b"ZCARD", b"k"]), 3);
    }
}

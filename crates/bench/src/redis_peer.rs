//! The peer: Redis doing the seeds' scheme by hand (ApiAxle's hit counters, SPEC §6): one
//! hash per series, granularity and time window; `HINCRBY` of the bucket's rounded
//! timestamp; `EXPIREAT` on windows of tiers with a retention. For the clickstream workload
//! that is, per event: the minute hash (one per day) with its `EXPIREAT`, the hour hash (one
//! per 30 days), and an hour hash per dimension value — five commands, pipelined per batch.
//! Every key of a series carries the `{ns|key}` hash tag, as a cluster deployment would.
//!
//! The client is a minimal pipelined RESP writer/reader over `TcpStream`: enough to measure
//! the server, with no client-library overhead to argue about.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_core::store::Batch;

/// A `redis-server` on a free loopback port, stopped on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// `appendfsync`: `None` for no persistence, or `always` / `everysec`.
    pub fn start(appendfsync: Option<&str>) -> std::io::Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = tempfile::tempdir()?;
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .arg("--dir")
        .arg(dir.path());
        match appendfsync {
            None => cmd.args(["--appendonly", "no"]),
            Some(p) => cmd.args(["--appendonly", "yes", "--appendfsync", p]),
        };
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
        let server = Server {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(std::io::Error::other("redis-server did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn arg(out: &mut Vec<u8>, a: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(b"\r\n");
}

fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        arg(out, a);
    }
}

/// Encodes one batch as the seeds' commands; returns how many replies to expect.
pub fn encode(batch: &Batch, out: &mut Vec<u8>) -> usize {
    const DAY: i64 = 86_400;
    const HOUR_WINDOW: i64 = 30 * DAY;
    let mut n = 0;
    for inc in &batch.increments {
        let tag = format!("{{{}|{}}}", inc.ns, inc.key);
        let amount = inc.n.to_string();
        let minute = inc.ts / 60 * 60;
        let hour = inc.ts / 3600 * 3600;
        let mkey = format!("{tag}:1m:{}", inc.ts / DAY * DAY);
        command(
            out,
            &[
                b"HINCRBY",
                mkey.as_bytes(),
                minute.to_string().as_bytes(),
                amount.as_bytes(),
            ],
        );
        // Kept 48h past the window's end, as ApiAxle doubles its TTLs.
        let expire = (inc.ts / DAY * DAY + DAY + 2 * DAY).to_string();
        command(out, &[b"EXPIREAT", mkey.as_bytes(), expire.as_bytes()]);
        let window = inc.ts / HOUR_WINDOW * HOUR_WINDOW;
        let hkey = format!("{tag}:1h:{window}");
        let field = hour.to_string();
        command(
            out,
            &[
                b"HINCRBY",
                hkey.as_bytes(),
                field.as_bytes(),
                amount.as_bytes(),
            ],
        );
        for s in &inc.subtotals {
            let skey = format!("{tag}:1h:{window}:{}={}", s.dim, s.value);
            command(
                out,
                &[
                    b"HINCRBY",
                    skey.as_bytes(),
                    field.as_bytes(),
                    amount.as_bytes(),
                ],
            );
        }
        n += 3 + inc.subtotals.len();
    }
    n
}

/// Sends batches over one connection, pipelining each batch; returns events applied.
pub fn run(port: u16, batches: &[&Batch]) -> std::io::Result<usize> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let mut buf = Vec::with_capacity(1 << 20);
    let mut line = Vec::new();
    let mut events = 0;
    for b in batches {
        buf.clear();
        let replies = encode(b, &mut buf);
        writer.write_all(&buf)?;
        for _ in 0..replies {
            line.clear();
            reader.read_until(b'\n', &mut line)?;
            if line.first() != Some(&b':') {
                return Err(std::io::Error::other(format!(
                    "redis replied {:?}",
                    String::from_utf8_lossy(&line)
                )));
            }
        }
        events += b.increments.len();
    }
    Ok(events)
}

/// Reads back one key's total over all hour windows, to check the peer counted right.
pub fn hour_total(port: u16, ns: &str, key: &str, windows: &[i64]) -> std::io::Result<i64> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut total = 0;
    for w in windows {
        let mut buf = Vec::new();
        command(
            &mut buf,
            &[b"HVALS", format!("{{{ns}|{key}}}:1h:{w}").as_bytes()],
        );
        writer.write_all(&buf)?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let count: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
        for _ in 0..count * 2 {
            line.clear();
            reader.read_line(&mut line)?;
            if !line.starts_with('$') {
                total += line.trim().parse::<i64>().unwrap_or(0);
            }
        }
    }
    Ok(total)
}

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

/// One RESP reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    fn bytes(&self) -> &[u8] {
        match self {
            Reply::Status(s) | Reply::Error(s) => s.as_bytes(),
            Reply::Bulk(Some(b)) => b,
            _ => b"",
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }

    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(n) => *n,
            other => other.text().parse().unwrap_or(0),
        }
    }

    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(a) => a,
            _ => &[],
        }
    }
}

/// A plain connection for reading: commands, pipelines, whole replies.
pub struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    pub fn open(port: u16) -> std::io::Result<Client> {
        let w = TcpStream::connect(("127.0.0.1", port))?;
        w.set_nodelay(true)?;
        let r = BufReader::with_capacity(1 << 16, w.try_clone()?);
        Ok(Client { w, r })
    }

    fn read(&mut self) -> std::io::Result<Reply> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        let body =
            String::from_utf8_lossy(line.get(1..line.len().saturating_sub(2)).unwrap_or(&[]))
                .into_owned();
        let bad = || std::io::Error::other(format!("bad reply line {body:?}"));
        Ok(match line.first() {
            Some(b'+') => Reply::Status(body),
            Some(b'-') => Reply::Error(body),
            Some(b':') => Reply::Int(body.parse().map_err(|_| bad())?),
            Some(b'$') => {
                let n: i64 = body.parse().map_err(|_| bad())?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut b = vec![0; n as usize + 2];
                    std::io::Read::read_exact(&mut self.r, &mut b)?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            }
            Some(b'*') => {
                let n: i64 = body.parse().map_err(|_| bad())?;
                let mut items = Vec::with_capacity(n.max(0) as usize);
                for _ in 0..n.max(0) {
                    items.push(self.read()?);
                }
                Reply::Array(items)
            }
            _ => return Err(bad()),
        })
    }

    /// Sends every command at once, then reads every reply.
    pub fn pipeline(&mut self, cmds: &[Vec<String>]) -> std::io::Result<Vec<Reply>> {
        let mut buf = Vec::new();
        for c in cmds {
            let args: Vec<&[u8]> = c.iter().map(|a| a.as_bytes()).collect();
            command(&mut buf, &args);
        }
        self.w.write_all(&buf)?;
        cmds.iter().map(|_| self.read()).collect()
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        let c: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Ok(self.pipeline(&[c])?.remove(0))
    }

    /// `INFO memory`'s `used_memory`.
    pub fn used_memory(&mut self) -> std::io::Result<u64> {
        let info = self.cmd(&["INFO", "memory"])?.text();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| std::io::Error::other("no used_memory in INFO memory"))
    }

    /// `INFO cpu`'s `used_cpu_user` + `used_cpu_sys`: the server's CPU seconds so far.
    pub fn cpu_seconds(&mut self) -> std::io::Result<f64> {
        let info = self.cmd(&["INFO", "cpu"])?.text();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        match (field("used_cpu_user:"), field("used_cpu_sys:")) {
            (Some(u), Some(s)) => Ok(u + s),
            _ => Err(std::io::Error::other("no used_cpu_* in INFO cpu")),
        }
    }

    /// The hashes whose names match `pattern` (`SCAN … TYPE hash`), and their fields in all.
    pub fn hash_fields(&mut self, pattern: &str) -> std::io::Result<(usize, u64)> {
        let mut cursor = "0".to_string();
        let (mut hashes, mut fields) = (0, 0);
        loop {
            let r = self.cmd(&[
                "SCAN", &cursor, "MATCH", pattern, "COUNT", "1000", "TYPE", "hash",
            ])?;
            let items = r.items();
            cursor = items.first().map(Reply::text).unwrap_or_default();
            let keys: Vec<Vec<String>> = items
                .get(1)
                .map(Reply::items)
                .unwrap_or_default()
                .iter()
                .map(|k| vec!["HLEN".to_string(), k.text()])
                .collect();
            hashes += keys.len();
            for n in self.pipeline(&keys)? {
                fields += n.int() as u64;
            }
            if cursor == "0" {
                return Ok((hashes, fields));
            }
        }
    }
}

//! Test support (feature `test-support`): a `redis-server` on a free port, or a 3-master
//! Redis Cluster, each in a temporary directory with persistence off, stopped on drop. For
//! this crate's tests and the server's. Without `redis-server` installed these panic with a
//! message saying how to install it — a test that needs Redis never passes silently.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MISSING: &str = "redis-server is not installed: run `apt-get install -y redis-server` \
     (scripts/test.sh installs it when missing)";

fn free_port(cluster: bool) -> u16 {
    for _ in 0..200 {
        let Ok(l) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = l.local_addr() else { continue };
        let port = addr.port();
        // A cluster node also listens on port + 10000 (its bus).
        if cluster && (port > 55_000 || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err()) {
            continue;
        }
        return port;
    }
    panic!("no free port for redis-server");
}

fn spawn(port: u16, dir: &Path, extra: &[&str]) -> Child {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{MISSING}"),
        Err(e) => panic!("starting redis-server: {e}"),
    }
}

fn wait_listening(port: u16, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("redis-server on port {port} exited at start: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "redis-server on port {port} did not start within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `redis-cli` with `args`, answering its standard output.
pub fn redis_cli(args: &[&str]) -> String {
    let out = match Command::new("redis-cli").args(args).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{MISSING}"),
        Err(e) => panic!("running redis-cli: {e}"),
    };
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One `redis-server` on a free loopback port.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(free_port(false), &[])
    }

    /// With more `redis-server` arguments (`["--appendonly", "yes"]` to keep data across a
    /// restart).
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_with(free_port(false), extra)
    }

    fn start_with(port: u16, extra: &[&str]) -> RedisServer {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("a temporary directory for redis-server: {e}"),
        };
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.restart();
        s
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/0`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Stops the server (SIGKILL: a crash). Its data is gone (persistence is off).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (after [`RedisServer::stop`]).
    pub fn restart(&mut self) {
        self.stop();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let mut child = spawn(self.port, self.dir.path(), &extra);
        wait_listening(self.port, &mut child);
        self.child = Some(child);
    }

    /// A replica of this server (`--replicaof`), once it has synced.
    pub fn start_replica(&self) -> RedisServer {
        let port = self.port.to_string();
        let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .cli(&["info", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                Instant::now() < deadline,
                "the replica on port {} did not sync within 10 s",
                replica.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }

    /// Stops the process without closing its connections (`SIGSTOP`), as a server that
    /// hangs; [`RedisServer::resume`] wakes it.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Wakes a server [`RedisServer::pause`] stopped (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let Some(child) = &self.child else {
            panic!("redis-server on port {} is not running", self.port)
        };
        let status = Command::new("kill")
            .args([which, &child.id().to_string()])
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!("kill {which} redis-server: {other:?}"),
        }
    }

    /// Whether it runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `redis-cli -p <port> <args>`
    pub fn cli(&self, args: &[&str]) -> String {
        let port = self.port.to_string();
        let mut all = vec!["-p", &port];
        all.extend_from_slice(args);
        redis_cli(&all)
    }

    /// Its working directory (cluster nodes keep `nodes.conf` there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of three masters and no replicas.
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let mut nodes: Vec<RedisServer> = Vec::new();
        for _ in 0..3 {
            let mut port = free_port(true);
            while nodes.iter().any(|n| n.port == port) {
                port = free_port(true);
            }
            nodes.push(RedisServer::start_with(
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    // A dead master fails its own slots only (docs/redis.md recommends it).
                    "--cluster-require-full-coverage",
                    "no",
                ],
            ));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli").args(&args).output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{MISSING}"),
            Err(e) => panic!("running redis-cli: {e}"),
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every live node says `cluster_state:ok`.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:a,127.0.0.1:b,127.0.0.1:c`
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// The node serving a key's slot.
    pub fn node_of(&self, key: &str) -> usize {
        let live = self.nodes.iter().find(|n| n.is_running());
        let Some(live) = live else {
            panic!("no cluster node runs");
        };
        let slot: u16 = live
            .cli(&["cluster", "keyslot", key])
            .trim()
            .parse()
            .unwrap_or(0);
        // `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges>…`
        for line in live.cli(&["cluster", "nodes"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(port) = fields
                .get(1)
                .and_then(|a| a.split('@').next())
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
            else {
                continue;
            };
            let serves = fields.iter().skip(8).any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            });
            if serves && let Some(i) = self.nodes.iter().position(|n| n.port == port) {
                return i;
            }
        }
        panic!("no node serves slot {slot} of {key}");
    }
}

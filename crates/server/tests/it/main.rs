//! tally-server's integration tests over real HTTP, in one binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod api;
mod concurrency;
mod connections;
mod dashboard;
mod dry_run;
mod errors;
mod export;
mod idempotency;
mod limits;
mod ratelimit;
mod rebuild;
mod statsd;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use serde_json::Value;
use tally_core::model::{Key, Namespace, Schema};
use tally_core::store::{
    Batch, Clock, Decision, Gauge, IdemRecord, KeyData, KeyList, KeyRead, ManualClock, Scan, Store,
    StoreError,
};
use tally_engine::{Config, Engine, FlushPolicy, FsyncPolicy};
use tally_server::{App, Settings};

/// 2026-11-20T12:00:00Z.
pub const NOW: i64 = 1_795_176_000;

/// The backend the whole suite runs on, from `TALLY_TEST_BACKEND`: `embedded` (the
/// default), `redis` (a `redis-server` per test server) or `cluster` (a 3-master Redis
/// Cluster per test server). `scripts/test.sh` runs the suite once on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Redis,
    Cluster,
}

pub fn backend() -> Backend {
    match std::env::var("TALLY_TEST_BACKEND").as_deref() {
        Ok("redis") => Backend::Redis,
        Ok("cluster") => Backend::Cluster,
        Ok("embedded") | Err(_) => Backend::Embedded,
        Ok(other) => panic!("TALLY_TEST_BACKEND={other}: embedded, redis or cluster"),
    }
}

/// Whether the suite runs on the embedded engine (engine-only tests check this).
pub fn embedded() -> bool {
    backend() == Backend::Embedded
}

/// The Redis a test server's store talks to; kept across [`Server::restart`].
#[derive(Debug)]
pub enum RedisHost {
    Single(tally_redis::testing::RedisServer),
    Cluster(tally_redis::testing::RedisCluster),
}

impl RedisHost {
    fn start(backend: Backend) -> Option<Arc<RedisHost>> {
        match backend {
            Backend::Embedded => None,
            Backend::Redis => Some(Arc::new(RedisHost::Single(
                tally_redis::testing::RedisServer::start(),
            ))),
            Backend::Cluster => Some(Arc::new(RedisHost::Cluster(
                tally_redis::testing::RedisCluster::start(),
            ))),
        }
    }

    fn url(&self) -> String {
        match self {
            RedisHost::Single(s) => s.url(),
            RedisHost::Cluster(c) => c.url(),
        }
    }
}

/// A store that can hold `apply` calls at a gate, to keep a request in flight, and that
/// flushes the engine's closed hours into the archive after every batch.
pub struct Gated {
    inner: Arc<dyn Store>,
    /// The embedded engine, when the suite runs on it.
    engine: Option<Arc<Engine>>,
    gate: Mutex<bool>,
    cv: Condvar,
    pub waiting: Mutex<usize>,
    /// While set, a scan (a `top`) waits, checking its deadline as the engine does.
    pub hold_scans: Mutex<bool>,
    /// Scans waiting at that hold now.
    pub scans_held: Mutex<usize>,
    /// How each held scan ended, when its deadline stopped it.
    pub scans_stopped: Mutex<Vec<String>>,
    /// Pages of keys listed (an export lists a page at a time), and a pause before each.
    pub keys_calls: std::sync::atomic::AtomicUsize,
    pub slow_keys: Mutex<std::time::Duration>,
    /// While set, a health check waits; how many wait now, and the most that ever did.
    pub hold_health: std::sync::atomic::AtomicBool,
    pub health_inside: std::sync::atomic::AtomicUsize,
    pub health_most: std::sync::atomic::AtomicUsize,
    /// While set, limited increments run under a lock of this harness and apply through the
    /// gate, so one can be held in its key's lock while others queue behind it.
    pub gate_limited: std::sync::atomic::AtomicBool,
    limited_lock: Mutex<()>,
    /// Limited increments waiting for that lock now.
    pub limited_waiting: std::sync::atomic::AtomicUsize,
    /// While set, every `read` fails as a damaged segment makes it fail.
    pub fail_reads: std::sync::atomic::AtomicBool,
    /// While set, every `read` panics (a bug in a store).
    pub panic_reads: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gated").finish_non_exhaustive()
    }
}

impl Gated {
    pub fn close(&self) {
        *self.gate.lock().unwrap() = true;
    }

    pub fn open(&self) {
        *self.gate.lock().unwrap() = false;
        self.cv.notify_all();
    }
}

impl Store for Gated {
    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        self.inner.namespaces()
    }
    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
        self.inner.schema(ns)
    }
    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        self.inner.put_schema(ns, schema)
    }
    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut closed = self.gate.lock().unwrap();
        *self.waiting.lock().unwrap() += 1;
        while *closed {
            closed = self.cv.wait(closed).unwrap();
        }
        *self.waiting.lock().unwrap() -= 1;
        drop(closed);
        self.inner.apply(batch)?;
        // Every closed hour goes to the archive right away, so each test's reads also go
        // through segments, the manifest and a truncated log.
        match &self.engine {
            Some(e) => e.flush().map(|_| ()),
            None => Ok(()),
        }
    }
    fn apply_if(
        &self,
        batch: &Batch,
        window: &KeyRead<'_>,
        decide: &mut dyn FnMut(&tally_core::store::Buckets) -> Result<Decision, StoreError>,
    ) -> Result<bool, StoreError> {
        if self.gate_limited.load(std::sync::atomic::Ordering::SeqCst) {
            use std::sync::atomic::Ordering::SeqCst;
            self.limited_waiting.fetch_add(1, SeqCst);
            let _held = self.limited_lock.lock().unwrap();
            self.limited_waiting.fetch_sub(1, SeqCst);
            return tally_core::store::decide_and_apply(self, batch, window, decide, &mut |b| {
                self.apply(b)
            });
        }
        self.inner.apply_if(batch, window, decide)
    }
    fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError> {
        if self.panic_reads.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("a store's bug (the harness's panic_reads)");
        }
        if self.fail_reads.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::corrupt(
                "segment 7.tls block 0 (a test's damage)",
            ));
        }
        self.inner.read(reads)
    }
    fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        self.keys_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(*self.slow_keys.lock().unwrap());
        self.inner.keys(list)
    }
    fn scan(&self, scan: &Scan<'_>, visit: &mut dyn FnMut(&Key, i64)) -> Result<(), StoreError> {
        *self.scans_held.lock().unwrap() += 1;
        let held = loop {
            if !*self.hold_scans.lock().unwrap() {
                break Ok(());
            }
            if let Err(e) = scan.deadline.check() {
                self.scans_stopped.lock().unwrap().push(e.detail());
                break Err(e);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        *self.scans_held.lock().unwrap() -= 1;
        held?;
        self.inner.scan(scan, visit)
    }
    fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        self.inner.idempotency(key)
    }
    fn rebuild(
        &self,
        ns: &Namespace,
        from: i64,
        to: i64,
        batch: &Batch,
    ) -> Result<u64, StoreError> {
        self.inner.rebuild(ns, from, to, batch)
    }
    fn health(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let inside = self.health_inside.fetch_add(1, SeqCst) + 1;
        self.health_most.fetch_max(inside, SeqCst);
        while self.hold_health.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.health_inside.fetch_sub(1, SeqCst);
        self.inner.health()
    }
    fn writable(&self) -> Result<(), StoreError> {
        self.inner.writable()
    }
    fn gauges(&self) -> Vec<Gauge> {
        self.inner.gauges()
    }
}

/// A running server over an engine in a temporary directory.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    pub store: Arc<Gated>,
    pub clock: Arc<ManualClock>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub dir: Arc<tempfile::TempDir>,
    settings: Settings,
    tls: bool,
    redis: Option<Arc<RedisHost>>,
}

impl Server {
    pub fn start(settings: Settings) -> Server {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        Server::start_in(dir, Arc::new(ManualClock::new(NOW)), settings, None)
    }

    /// The suite's backend's name, for messages.
    pub fn backend(&self) -> &'static str {
        match (&self.redis, self.redis.as_deref()) {
            (None, _) => "embedded",
            (_, Some(RedisHost::Single(_))) => "redis",
            _ => "cluster",
        }
    }

    /// A server that answers over TLS with `tls`.
    pub fn start_tls(settings: Settings, tls: tally_server::tls::Tls) -> Server {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let mut s = Server::start_in(dir, Arc::new(ManualClock::new(NOW)), settings, Some(tls));
        s.tls = true;
        s
    }

    /// A server whose engine's disk can be made to fail (embedded engine only).
    pub fn with_faults(faults: Arc<tally_engine::io::Faults>) -> Server {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        Server::start_on(
            dir,
            Arc::new(ManualClock::new(NOW)),
            Settings::default(),
            Some(faults),
            None,
            None,
        )
    }

    pub fn with_config(toml: &str) -> Server {
        Server::start(Settings::from_toml(toml).unwrap())
    }

    fn start_in(
        dir: Arc<tempfile::TempDir>,
        clock: Arc<ManualClock>,
        settings: Settings,
        tls: Option<tally_server::tls::Tls>,
    ) -> Server {
        let redis = RedisHost::start(backend());
        Server::start_on(dir, clock, settings, None, tls, redis)
    }

    /// A server on the embedded engine in `dir`, or on `redis` when given.
    fn start_on(
        dir: Arc<tempfile::TempDir>,
        clock: Arc<ManualClock>,
        settings: Settings,
        faults: Option<Arc<tally_engine::io::Faults>>,
        tls: Option<tally_server::tls::Tls>,
        redis: Option<Arc<RedisHost>>,
    ) -> Server {
        let (inner, engine): (Arc<dyn Store>, Option<Arc<Engine>>) = match &redis {
            Some(host) => {
                let store = tally_redis::RedisStore::connect_with_clock(&host.url(), clock.clone())
                    .unwrap_or_else(|e| panic!("{}", e.detail()));
                (Arc::new(store), None)
            }
            None => {
                let engine = Arc::new(open_engine(dir.path(), &clock, faults));
                (engine.clone(), Some(engine))
            }
        };
        let store = Arc::new(Gated {
            inner,
            engine,
            gate: Mutex::new(false),
            cv: Condvar::new(),
            waiting: Mutex::new(0),
            hold_scans: Mutex::new(false),
            scans_held: Mutex::new(0),
            scans_stopped: Mutex::new(Vec::new()),
            keys_calls: Default::default(),
            slow_keys: Mutex::new(std::time::Duration::ZERO),
            hold_health: Default::default(),
            health_inside: Default::default(),
            health_most: Default::default(),
            gate_limited: Default::default(),
            limited_lock: Mutex::new(()),
            limited_waiting: Default::default(),
            fail_reads: Default::default(),
            panic_reads: Default::default(),
        });
        let app = App::new(store.clone(), settings.clone(), clock.clone());
        app.apply_config_namespaces().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let stop = async move {
                    let _ = rx.await;
                };
                match tls {
                    None => tally_server::serve(listener, app, stop).await.unwrap(),
                    Some(tls) => {
                        let limits = app.settings().server;
                        let routes = tally_server::Routes::recovering();
                        routes.ready(&app);
                        tally_server::serve_with(listener, limits, routes, Some(tls), stop)
                            .await
                            .unwrap();
                    }
                }
            });
        });
        let addr = addr_rx.recv().unwrap();
        Server {
            addr,
            store,
            clock,
            stop: Some(tx),
            thread: Some(thread),
            dir,
            settings,
            tls: false,
            redis,
        }
    }

    /// Stops the server, closes the engine, and starts both again on the same data.
    /// Stops the server and starts another on the same data: the engine reopened on its
    /// directory, or a new store connected to the same Redis.
    pub fn restart(mut self) -> Server {
        let (dir, clock, settings) = (self.dir.clone(), self.clock.clone(), self.settings.clone());
        let redis = self.redis.clone();
        self.shutdown();
        drop(self);
        Server::start_on(dir, clock, settings, None, None, redis)
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        if let Some(e) = &self.store.engine {
            e.close();
        }
    }

    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, path)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.req("GET", path, None, &[])
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.req("POST", path, Some(body), &[])
    }

    /// Any request; `headers` are (name, value).
    pub fn req(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let (status, text) = self.raw(method, path, body, headers);
        let v = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
        (status, v)
    }

    pub fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let url = self.url(path);
        let resp = match method {
            "GET" => {
                let mut r = agent.get(&url);
                for (k, v) in headers {
                    r = r.header(*k, *v);
                }
                r.call()
            }
            m => {
                let mut r = match m {
                    "PUT" => agent.put(&url),
                    _ => agent.post(&url),
                };
                for (k, v) in headers {
                    r = r.header(*k, *v);
                }
                match body {
                    Some(b) => r.send(b),
                    None => r.send_empty(),
                }
            }
        };
        let mut resp = resp.unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().unwrap())
    }

    /// Everything a write could change, to prove a refused request changed nothing.
    pub fn state(&self) -> Value {
        self.state_with(&[])
    }

    /// [`Server::state`] read with `headers` (a token that may read every namespace).
    pub fn state_with(&self, headers: &[(&str, &str)]) -> Value {
        let get = |path: &str| self.req("GET", path, None, headers);
        let (_, ns) = get("/v1/ns");
        let mut out = vec![ns.clone()];
        for n in ns["namespaces"].as_array().unwrap() {
            let name = n["name"].as_str().unwrap();
            out.push(get(&format!("/v1/ns/{name}/keys?limit=10000")).1);
            for tier in n["tiers"].as_array().unwrap() {
                let res = tier.as_str().unwrap().split(':').next().unwrap();
                let (from, to) = (NOW - 86_400 * 2, NOW + 3600);
                let unit = if res.ends_with('s') {
                    "second"
                } else if res.ends_with('m') {
                    "minute"
                } else {
                    "hour"
                };
                let (from, to) = if unit == "second" {
                    (NOW - 3600, NOW + 3600)
                } else {
                    (from, to)
                };
                out.push(
                    get(&format!(
                        "/v1/ns/{name}/top?from={from}&to={to}&unit={unit}&limit=10000"
                    ))
                    .1,
                );
            }
        }
        Value::Array(out)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.store.open();
        self.shutdown();
    }
}

fn open_engine(
    dir: &Path,
    clock: &Arc<ManualClock>,
    faults: Option<Arc<tally_engine::io::Faults>>,
) -> Engine {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.faults = faults;
    c.fsync = FsyncPolicy::Always;
    c.flush = FlushPolicy {
        hourly_period: 3600,
        fine_period: 3600,
        grace: 0,
    };
    assert_eq!(clock.now(), clock.now());
    Engine::open(c).unwrap()
}

/// Asserts an error answer's status and code.
#[track_caller]
pub fn err(got: (u16, Value), status: u16, code: &str) -> Value {
    assert_eq!(
        (got.0, got.1["error"]["code"].as_str()),
        (status, Some(code)),
        "answer: {}",
        got.1
    );
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    got.1
}

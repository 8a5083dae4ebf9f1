//! tally's Redis and Redis Cluster backend: a [`Store`] on the seeds' own scheme done right —
//! a hash per series, tier and time window holding its totals and subtotals (`HINCRBY` of
//! the bucket's fields, `EXPIREAT` at the window's end plus the retention), every key of a
//! series in one slot through its time-free `{ns|key}` hash tag, one Lua script call per slot per batch,
//! pipelined. tally servers on it hold no state. The layout is `docs/redis.md`.
//!
//! - [`layout`]: key names, windows, the stored schema record (pure).
//! - [`scripts`]: the Lua scripts.
//! - `conn`: single server or cluster, and Redis errors as [`StoreError`]s.
//! - `write`: a batch, aggregated, as script calls per slot.
//! - `read`: reads, key listing, scans.
//!
//! [`Store`] is synchronous (the server calls it from tokio's blocking pool): the store owns a
//! small runtime of its own and blocks on it, which works from any thread that is not itself
//! driving async tasks.

pub mod layout;
pub mod scripts;
#[cfg(feature = "test-support")]
pub mod testing;

mod conn;
mod read;
mod retention;
mod write;

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::RedisError;
use tally_core::model::{Key, Namespace, Schema};
use tally_core::store::{
    Batch, Clock, Decision, Gauge, IdemRecord, KeyData, KeyList, KeyRead, Scan, Store, StoreError,
    SystemClock,
};

pub use conn::Target;
use conn::{Conn, store_error, transient};
use layout::{LAYOUT_KEY, LAYOUT_VERSION, SCHEMAS_KEY, SchemaRecord, Stored, UPGRADES_FROM};

/// How often a call that failed transiently is sent (the first time included), and the
/// first pause between tries (tripled each time).
const ATTEMPTS: u32 = 3;
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// A limited increment's lock lives this long at most (a holder that died frees it then),
/// and a waiter gives up after `LOCK_WAIT`.
const LOCK_MS: u64 = 10_000;
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long a write of new dimension codes waits for the schemas node's replicas.
const REPLICA_WAIT: Duration = Duration::from_millis(200);
/// After the replicas did not acknowledge new codes in time, writes of that namespace spell
/// their subtotals out for this long before they wait for the replicas again.
const CONFIRM_BACKOFF: Duration = Duration::from_secs(1);

/// A [`Store`] on Redis ≥ 7 or Redis Cluster.
pub struct RedisStore {
    runtime: OwnRuntime,
    conn: Conn,
    /// A second connection, for the compare-and-set of new codes and its `WAIT`: a `WAIT`
    /// blocks its connection, and `conn` carries every other call.
    side: Conn,
    /// Per namespace, when a write may next try to confirm pending codes after the replicas
    /// did not acknowledge them: until then its subtotals are spelled out without waiting.
    confirm_after: Mutex<BTreeMap<Namespace, std::time::Instant>>,
    /// `redis at host:port`, for messages.
    label: String,
    clock: Arc<dyn Clock>,
    batch_ids: BatchIds,
    /// The schemas last read, used only when Redis cannot be asked (a cluster node holding
    /// the schemas is down): reads and writes of series on live nodes go on.
    known: Mutex<BTreeMap<Namespace, Stored>>,
    /// Limited increments of one key in this process queue here before they ask Redis for
    /// the key's lock, so they wait in turn instead of polling Redis.
    conditional: Vec<Mutex<()>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.label)
            .finish_non_exhaustive()
    }
}

/// The store's runtime: shut down without blocking when the store is dropped, so dropping
/// it is fine anywhere, even inside another runtime.
struct OwnRuntime(Option<tokio::runtime::Runtime>, tokio::runtime::Handle);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Batch ids: 64 random bits per store, then a counter. Unique across stores and restarts
/// with overwhelming probability; a retry inside one `apply` reuses its id.
struct BatchIds {
    seed: u64,
    next: AtomicU64,
}

impl BatchIds {
    fn new() -> Self {
        let seed = RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()));
        BatchIds {
            seed,
            next: AtomicU64::new(0),
        }
    }

    fn fresh(&self) -> String {
        format!(
            "{:016x}{:x}",
            self.seed,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

impl RedisStore {
    /// Connects to `redis://host:port/db` or `redis+cluster://host:port,host:port,…`,
    /// checks (or, on an empty Redis, writes) the layout version, and loads the scripts.
    pub fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with_clock(url, Arc::new(SystemClock))
    }

    /// [`RedisStore::connect`] with a clock for retention and expiry (tests move it; Redis'
    /// own expiries only collect garbage the store already hides).
    pub fn connect_with_clock(url: &str, clock: Arc<dyn Clock>) -> Result<RedisStore, StoreError> {
        let target = Target::parse(url)?;
        let label = target.describe();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tally-redis")
            .enable_all()
            .build()
            .map_err(|e| StoreError::internal("starting the Redis client's runtime").because(e))?;
        let handle = rt.handle().clone();
        let runtime = OwnRuntime(Some(rt), handle);
        let (conn, side) = runtime
            .1
            .block_on(async { Ok((Conn::open(&target).await?, Conn::open(&target).await?)) })
            .map_err(|e| store_error(&label, e))?;
        let store = RedisStore {
            runtime,
            conn,
            side,
            confirm_after: Mutex::new(BTreeMap::new()),
            label,
            clock,
            batch_ids: BatchIds::new(),
            known: Mutex::new(BTreeMap::new()),
            conditional: (0..256).map(|_| Mutex::new(())).collect(),
        };
        store.block_on(store.check_layout())?;
        if let Err(e) = store.block_on(store.resume_extends()) {
            tracing::warn!(
                error = %e.detail(),
                "could not read the schemas to finish extending expiries; the next server \
                 to connect, or the next schema change, tries again"
            );
        }
        Ok(store)
    }

    /// Applies a batch under a caller-chosen batch id: applying it again under the same id
    /// (a retry after a lost answer) changes nothing where the first one arrived. `apply`
    /// uses the batch's idempotency key, else a fresh random id.
    pub fn apply_with_batch_id(&self, batch: &Batch, id: &str) -> Result<(), StoreError> {
        self.block_on(self.apply_async(batch, Some(id)))
    }

    /// Whether this store talks to a cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.1.block_on(f)
    }

    fn now(&self) -> i64 {
        self.clock.now()
    }

    fn err(&self, e: RedisError) -> StoreError {
        store_error(&self.label, e)
    }

    /// Runs `call` on a fresh handle of the connection, again after a pause if it failed
    /// transiently (only for calls that may be repeated: reads, and writes guarded by a
    /// batch marker or idempotent by construction).
    async fn retry<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            match call(self.conn.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) if transient(&e) && attempt < ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "redis call failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause *= 3;
                    attempt += 1;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// Takes the series' lock (`layout::lock_key`) for `token`, waiting up to
    /// `LOCK_WAIT` for another holder (another tally server) to release it.
    async fn lock(&self, name: &str, token: &str) -> Result<(), StoreError> {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let got: Option<String> = self
                .retry(|mut c| async move {
                    redis::cmd("SET")
                        .arg(name)
                        .arg(token)
                        .arg("NX")
                        .arg("PX")
                        .arg(LOCK_MS)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            if got.is_some() {
                return Ok(());
            }
            if start.elapsed() > LOCK_WAIT {
                return Err(StoreError::unavailable(format!(
                    "{}: the lock {name} of a limited increment stayed taken for {} ms",
                    self.label,
                    LOCK_WAIT.as_millis()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Releases the lock if `token` still holds it (it may have expired and been taken).
    async fn unlock(&self, name: &str, token: &str) -> Result<(), StoreError> {
        const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
             return redis.call('DEL', KEYS[1]) else return 0 end";
        self.retry(|mut c| async move {
            redis::cmd("EVAL")
                .arg(RELEASE)
                .arg(1)
                .arg(name)
                .arg(token)
                .exec_async(&mut c)
                .await
        })
        .await
    }

    async fn check_layout(&self) -> Result<(), StoreError> {
        let stored: Option<String> = self
            .retry(|mut c| async move {
                redis::cmd("SET")
                    .arg(LAYOUT_KEY)
                    .arg(LAYOUT_VERSION)
                    .arg("NX")
                    .exec_async(&mut c)
                    .await?;
                redis::cmd("GET").arg(LAYOUT_KEY).query_async(&mut c).await
            })
            .await?;
        match stored.as_deref() {
            // A server of an older layout still running may have created records since.
            Some(v) if v == LAYOUT_VERSION.to_string() => self.rewrite_records().await,
            Some(v) if UPGRADES_FROM.iter().any(|u| u.to_string() == v) => {
                // Every key of the older layout means the same in this one: mark the
                // database as this layout, so builds of the older one refuse it from now on.
                self.retry(|mut c| async move {
                    redis::cmd("SET")
                        .arg(LAYOUT_KEY)
                        .arg(LAYOUT_VERSION)
                        .arg("XX")
                        .exec_async(&mut c)
                        .await
                })
                .await?;
                self.rewrite_records().await?;
                tracing::info!(
                    from = v,
                    to = LAYOUT_VERSION,
                    "upgraded the tally key layout"
                );
                Ok(())
            }
            other => Err(StoreError::corrupt(format!(
                "{} holds tally key layout version {}; this build reads and writes version \
                 {LAYOUT_VERSION} (docs/redis.md): use another Redis database or migrate it",
                self.label,
                other.unwrap_or("(none)")
            ))),
        }
    }

    /// The stored schemas of `nss` (those that exist).
    async fn load_schemas(
        &self,
        nss: &[&Namespace],
    ) -> Result<BTreeMap<Namespace, Stored>, StoreError> {
        if nss.is_empty() {
            return Ok(BTreeMap::new());
        }
        let names: Vec<&str> = nss.iter().map(|n| n.as_str()).collect();
        let got: Result<Vec<Option<Vec<u8>>>, StoreError> = self
            .retry(|mut c| {
                let names = &names;
                async move {
                    redis::cmd("HMGET")
                        .arg(SCHEMAS_KEY)
                        .arg(names)
                        .query_async(&mut c)
                        .await
                }
            })
            .await;
        let got = match got {
            Ok(g) => g,
            Err(e @ StoreError::Unavailable { .. }) => {
                // The node holding the schemas is out of reach: the last schemas read serve
                // the series on other nodes; a namespace never read fails as before.
                let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
                if nss.iter().all(|n| known.contains_key(*n)) {
                    tracing::warn!(error = %e.detail(), "using the schemas last read");
                    return Ok(nss
                        .iter()
                        .filter_map(|n| {
                            let mut s = known.get(*n)?.clone();
                            s.cached = true;
                            Some(((*n).clone(), s))
                        })
                        .collect());
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let mut out = BTreeMap::new();
        for (ns, text) in nss.iter().zip(got) {
            if let Some(text) = text {
                out.insert((*ns).clone(), SchemaRecord::decode(ns.as_str(), &text)?);
            }
        }
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        for (ns, s) in &out {
            known.insert(ns.clone(), s.clone());
        }
        Ok(out)
    }

    async fn all_schemas(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        let all: Vec<(String, Vec<u8>)> = self
            .retry(|mut c| async move {
                redis::cmd("HGETALL")
                    .arg(SCHEMAS_KEY)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let mut out = Vec::with_capacity(all.len());
        for (name, text) in all {
            let ns = Namespace::new(&name).map_err(|e| {
                StoreError::corrupt(format!("{SCHEMAS_KEY} holds an invalid namespace name"))
                    .because(e)
            })?;
            let stored = SchemaRecord::decode(&name, &text)?;
            out.push((ns, stored.schema));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Stores the schema; if a tier's retention grew, extends its expiries before answering
    /// (`retention`).
    async fn put_schema_async(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        let stored = self
            .update_record(ns, |previous| Some(SchemaRecord::next(previous, schema)))
            .await?;
        if stored.is_some_and(|s| !s.record.extend.is_empty()) {
            self.extend_expiries(ns, true).await.map_err(|e| {
                StoreError::unavailable(format!(
                    "{}: the schema of {ns} is stored, but extending the expiries of its \
                     tiers whose retention grew failed ({}); send it again to finish, before \
                     their data expires under the shorter retention",
                    self.label,
                    e.detail()
                ))
            })?;
        }
        Ok(())
    }

    /// A namespace's schema record as stored now: its text (empty if none) and decoded.
    async fn read_record(&self, ns: &Namespace) -> Result<(Vec<u8>, Option<Stored>), StoreError> {
        let current: Option<Vec<u8>> = self
            .retry(|mut c| async move {
                redis::cmd("HGET")
                    .arg(SCHEMAS_KEY)
                    .arg(ns.as_str())
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let decoded = match &current {
            Some(text) => Some(SchemaRecord::decode(ns.as_str(), text)?),
            None => None,
        };
        Ok((current.unwrap_or_default(), decoded))
    }

    /// Replaces a namespace's record `current` (its text, empty for none) by `text` if it is
    /// still `current` (the `PUT_SCHEMA` compare-and-set): whether it was replaced, and
    /// remembers it if so.
    async fn swap_record(
        &self,
        ns: &Namespace,
        current: &[u8],
        text: &str,
    ) -> Result<Option<Stored>, StoreError> {
        let done: i64 = self
            .retry(|mut c| async move {
                scripts::PUT_SCHEMA
                    .key(SCHEMAS_KEY)
                    .arg(ns.as_str())
                    .arg(current)
                    .arg(text)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        if done != 1 {
            return Ok(None);
        }
        let stored = SchemaRecord::decode(ns.as_str(), text.as_bytes())?;
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.insert(ns.clone(), stored.clone());
        Ok(Some(stored))
    }

    /// Replaces a namespace's schema record by `change(current)` with a compare-and-set (a
    /// concurrent change makes us read again, a few times at most); `None` from `change`
    /// leaves it as it is. Answers the record stored now, if any.
    async fn update_record(
        &self,
        ns: &Namespace,
        change: impl Fn(Option<&SchemaRecord>) -> Option<SchemaRecord>,
    ) -> Result<Option<Stored>, StoreError> {
        for _ in 0..16 {
            let (current, previous) = self.read_record(ns).await?;
            let Some(record) = change(previous.as_ref().map(|p| &p.record)) else {
                return Ok(previous);
            };
            if let Some(stored) = self.swap_record(ns, &current, &record.encode()?).await? {
                return Ok(Some(stored));
            }
        }
        Err(self.kept_changing(ns))
    }

    fn kept_changing(&self, ns: &Namespace) -> StoreError {
        StoreError::unavailable(format!(
            "{}: the schema of {ns} kept changing under us; try again",
            self.label
        ))
    }

    /// Gives the `(resolution, dimension)` pairs that have none a code and confirms the
    /// pending codes among them, so that writes may use them: the record holding them pending
    /// is written (or, if another server gave them, written again unchanged), then every
    /// replica of the schemas hash's node must acknowledge that write (`WAIT`) before a
    /// second compare-and-set confirms them. A failover can then lose a confirmation but not
    /// a code some field uses. If the replicas do not answer in time, the codes stay pending
    /// and this batch writes spelled-out fields. Answers the record stored now, if any.
    async fn secure_codes(
        &self,
        ns: &Namespace,
        pairs: &[(u64, &str)],
    ) -> Result<Option<Stored>, StoreError> {
        let backing_off = {
            let after = self
                .confirm_after
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            after
                .get(ns)
                .is_some_and(|t| std::time::Instant::now() < *t)
        };
        if backing_off {
            return Ok(None);
        }
        let mut replicas = None;
        for _ in 0..16 {
            let (current, previous) = self.read_record(ns).await?;
            let Some(previous) = previous else {
                return Ok(None);
            };
            let given = previous.record.with_codes(pairs);
            let pending = given.as_ref().unwrap_or(&previous.record);
            if !pending.has_pending(pairs) {
                return Ok(Some(previous));
            }
            let replicas = match replicas {
                Some(n) => n,
                None => *replicas.insert(self.schema_replicas().await?),
            };
            let confirmed = pending.confirmed(pairs).unwrap_or_else(|| pending.clone());
            if replicas == Some(0) {
                // No replica that a failover could promote without this write.
                if let Some(stored) = self.swap_record(ns, &current, &confirmed.encode()?).await? {
                    return Ok(Some(stored));
                }
                continue;
            }
            let text = pending.encode()?;
            // Replicas not known: wait for one, and keep the codes pending anyway.
            let wanted = replicas.unwrap_or(1).max(1);
            let (swapped, acked) = self.swap_and_wait(ns, &current, &text, wanted).await?;
            if !swapped {
                continue;
            }
            if replicas.is_none() || acked < wanted {
                tracing::warn!(
                    %ns,
                    acked,
                    replicas = ?replicas,
                    "the schemas node's replicas did not acknowledge new dimension codes in \
                     time (or could not be counted): they stay pending, and subtotals are \
                     spelled out meanwhile"
                );
                self.confirm_after
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(ns.clone(), std::time::Instant::now() + CONFIRM_BACKOFF);
                return Ok(Some(SchemaRecord::decode(ns.as_str(), text.as_bytes())?));
            }
            if let Some(stored) = self
                .swap_record(ns, text.as_bytes(), &confirmed.encode()?)
                .await?
            {
                return Ok(Some(stored));
            }
        }
        Err(self.kept_changing(ns))
    }

    /// How many replicas the node holding the schemas hash has, `None` if its answer does
    /// not say. In a cluster, every replica the cluster knows of that master (`CLUSTER
    /// NODES`), connected or not, since a failover may promote one whose link is down; on a
    /// single server, the connected ones (`INFO replication`).
    async fn schema_replicas(&self) -> Result<Option<i64>, StoreError> {
        let cluster = self.is_cluster();
        let answer = self
            .retry(|c| {
                let cmd = if cluster {
                    let mut nodes = redis::cmd("CLUSTER");
                    nodes.arg("NODES");
                    nodes
                } else {
                    let mut info = redis::cmd("INFO");
                    info.arg("replication");
                    info
                };
                c.on_node_of(SCHEMAS_KEY, cmd)
            })
            .await?;
        let mut texts = Vec::new();
        collect_text(&answer, &mut texts);
        let text = texts.join("\n");
        Ok(if cluster {
            layout::replicas_of_myself(&text)
        } else {
            text.lines()
                .find_map(|l| l.strip_prefix("connected_slaves:"))
                .and_then(|n| n.trim().parse().ok())
        })
    }

    /// [`RedisStore::swap_record`] and, on the same connection right after it, `WAIT` for
    /// `replicas` replicas (at most `REPLICA_WAIT`): whether it swapped, and how many
    /// replicas acknowledged every write of this connection up to it. Not retried: a
    /// reconnection between the two would make the `WAIT` answer for another connection.
    async fn swap_and_wait(
        &self,
        ns: &Namespace,
        current: &[u8],
        text: &str,
        replicas: i64,
    ) -> Result<(bool, i64), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(scripts::PUT_SCHEMA_LUA)
            .arg(1)
            .arg(SCHEMAS_KEY)
            .arg(ns.as_str())
            .arg(current)
            .arg(text)
            .cmd("WAIT")
            .arg(replicas)
            .arg(REPLICA_WAIT.as_millis() as u64);
        let mut c = self.side.clone();
        let (done, acked): (i64, i64) = pipe.query_async(&mut c).await.map_err(|e| self.err(e))?;
        if done == 1 {
            let stored = SchemaRecord::decode(ns.as_str(), text.as_bytes())?;
            let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            known.insert(ns.clone(), stored);
        }
        Ok((done == 1, acked))
    }

    /// After the layout version is marked, rewrites every schema record that is not in this
    /// layout's form, so that builds of older layouts still running cannot decode them (and
    /// fail loudly) instead of rewriting them without what they do not know.
    async fn rewrite_records(&self) -> Result<(), StoreError> {
        let all: Vec<(String, Vec<u8>)> = self
            .retry(|mut c| async move {
                redis::cmd("HGETALL")
                    .arg(SCHEMAS_KEY)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        for (name, _) in all {
            let ns = Namespace::new(&name).map_err(|e| {
                StoreError::corrupt(format!("{SCHEMAS_KEY} holds an invalid namespace name"))
                    .because(e)
            })?;
            self.update_record(&ns, |current| {
                let current = current?;
                (current.layout != LAYOUT_VERSION).then(|| current.clone())
            })
            .await?;
        }
        Ok(())
    }

    async fn idempotency_async(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        let name = layout::idem_key(key);
        let text: Option<Vec<u8>> = self
            .retry(|mut c| {
                let name = &name;
                async move { redis::cmd("GET").arg(name).query_async(&mut c).await }
            })
            .await?;
        let Some(text) = text else { return Ok(None) };
        let doc: write::IdemDoc = serde_json::from_slice(&text).map_err(|e| {
            StoreError::corrupt(format!("the idempotency record {name} does not decode")).because(e)
        })?;
        let rec = doc.into_record();
        Ok((rec.expires > self.now()).then_some(rec))
    }

    async fn used_memory(&self) -> Result<f64, StoreError> {
        let info: Vec<redis::Value> = self
            .retry(|c| {
                let mut info = redis::cmd("INFO");
                info.arg("memory");
                c.on_every_master(info)
            })
            .await?;
        // A cluster answers one INFO per master: sum them.
        let mut texts = Vec::new();
        info.iter().for_each(|v| collect_text(v, &mut texts));
        Ok(texts
            .iter()
            .flat_map(|t| t.lines())
            .filter_map(|l| l.strip_prefix("used_memory:"))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum())
    }
}

fn collect_text(v: &redis::Value, out: &mut Vec<String>) {
    match v {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        redis::Value::VerbatimString { text, .. } => out.push(text.clone()),
        redis::Value::SimpleString(s) => out.push(s.clone()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|i| collect_text(i, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            collect_text(k, out);
            collect_text(v, out);
        }),
        _ => {}
    }
}

impl Store for RedisStore {
    /// Serialised per key across every tally server on this Redis by a lock in the
    /// series' slot (`tally:lock:{ns|key}`, `SET NX PX`): read, decide and apply happen while
    /// it is held. Within one server, callers first queue on a local stripe.
    fn apply_if(
        &self,
        batch: &Batch,
        window: &KeyRead<'_>,
        decide: &mut dyn FnMut(&tally_core::store::Buckets) -> Result<Decision, StoreError>,
    ) -> Result<bool, StoreError> {
        let local = tally_core::store::stripe(&self.conditional, window.ns, window.key);
        let _queued = local.lock().unwrap_or_else(PoisonError::into_inner);
        let name = layout::lock_key(&layout::series_tag(window.ns, window.key.as_str()));
        let token = self.batch_ids.fresh();
        self.block_on(self.lock(&name, &token))?;
        let unused = Mutex::new(());
        let outcome = tally_core::store::apply_if_locked(self, &unused, batch, window, decide);
        let released = self.block_on(self.unlock(&name, &token));
        let applied = outcome?;
        released?;
        Ok(applied)
    }

    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        self.block_on(self.all_schemas())
    }

    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
        let got = self.block_on(async {
            let got: Option<Vec<u8>> = self
                .retry(|mut c| async move {
                    redis::cmd("HGET")
                        .arg(SCHEMAS_KEY)
                        .arg(ns.as_str())
                        .query_async(&mut c)
                        .await
                })
                .await?;
            Ok::<_, StoreError>(got)
        })?;
        got.map(|text| SchemaRecord::decode(ns.as_str(), &text).map(|s| s.schema))
            .transpose()
    }

    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        self.block_on(self.put_schema_async(ns, schema))
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        self.block_on(self.apply_async(batch, None))
    }

    fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError> {
        self.block_on(self.read_async(reads))
    }

    fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        self.block_on(self.keys_async(list))
    }

    fn scan(&self, scan: &Scan<'_>, visit: &mut dyn FnMut(&Key, i64)) -> Result<(), StoreError> {
        self.block_on(self.scan_async(scan, visit))
    }

    fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        self.block_on(self.idempotency_async(key))
    }

    fn health(&self) -> Result<(), StoreError> {
        self.block_on(self.retry(|c| c.on_every_master(redis::cmd("PING"))))
            .map(|_| ())
    }

    fn gauges(&self) -> Vec<Gauge> {
        match self.block_on(self.used_memory()) {
            Ok(bytes) => vec![Gauge {
                name: "tally_redis_used_memory_bytes",
                help: "Memory Redis reports in use (INFO used_memory; summed over a cluster's masters)",
                kind: "gauge",
                value: bytes,
            }],
            Err(_) => Vec::new(),
        }
    }
}

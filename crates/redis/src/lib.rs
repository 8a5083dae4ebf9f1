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
//! - `schemas`: the schema records: reads (and the cache used while their node is down),
//!   compare-and-set, dimension codes given and confirmed, rewrites on upgrade.
//! - `retention`: extending expiries when a tier's retention grows.
//!
//! [`Store`] is synchronous (the server calls it from tokio's blocking pool, or from a worker
//! given up for the call with `block_in_place`): the store owns a
//! small runtime of its own and blocks on it, which works from any thread that is not itself
//! driving async tasks.

// The workspace denies `unsafe`; only the engine has a site that allows it.
#![forbid(unsafe_code)]

pub mod layout;
pub mod scripts;
#[cfg(feature = "test-support")]
pub mod testing;

mod conn;
mod read;
mod retention;
mod schemas;
mod write;

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::RedisError;
use tally_core::model::{Key, Namespace, Schema};
use tally_core::store::{
    Batch, Clock, Decision, Gauge, IdemRecord, KeyData, KeyList, KeyRead, Scan, Store, StoreError,
    SystemClock,
};

use conn::{Conn, store_error, transient};
pub use conn::{Target, redact};
use layout::{LAYOUT_KEY, LAYOUT_VERSION, Stored, UPGRADES_FROM};

/// How often a call that failed transiently is sent (the first time included), and the
/// first pause between tries (tripled each time).
const ATTEMPTS: u32 = 3;
/// Idempotency answers stored a day, all scopes together, unless told otherwise
/// ([`RedisStore::with_answer_bounds`]): the embedded engine's default.
const DEFAULT_MAX_ANSWERS: usize = 1_000_000;
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// A limited increment's lock lives this long at most (a holder that died frees it then),
/// and a waiter gives up after `LOCK_WAIT`.
const LOCK_MS: u64 = 10_000;
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// A [`Store`] on Redis ≥ 7 or Redis Cluster.
pub struct RedisStore {
    runtime: OwnRuntime,
    /// The connections, opened anew when a call times out ([`RedisStore::suspect`]).
    conns: Arc<Conns>,
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
    /// Keys a page of the key index holds at most: Redis' `zset-max-listpack-entries`, so
    /// that pages stay listpacks (read at connect; see [`index_page_size`]).
    index_page: usize,
    /// Keys this store listed in the key index (a batch leaves them out of its index update).
    listed: write::Listed,
    /// `[limits] max_future_secs`, for `Schema::replacing`.
    max_future_secs: i64,
    /// `[limits] max_idempotency_keys` and `max_idempotency_keys_per_token` (with tokens):
    /// new idempotency answers a day, all together and of one scope (see
    /// `write::count_answer`).
    answer_bounds: (usize, Option<usize>),
    /// How long a write may take in all ([`write::WRITE_DEADLINE`] by default).
    write_deadline: Duration,
    /// What `connect` checked of Redis, checked again now and then ([`RedisStore::vet`]).
    vetted: Mutex<Vetted>,
}

/// When [`RedisStore::vet`] last checked Redis, and the refusals it found, if any: each
/// check's own, kept until that check answers again.
struct Vetted {
    at: Instant,
    every: Duration,
    eviction: Option<StoreError>,
    layout: Option<StoreError>,
    info: Option<StoreError>,
}

impl Vetted {
    fn refusal(&self) -> Option<StoreError> {
        self.info
            .clone()
            .or_else(|| self.eviction.clone())
            .or_else(|| self.layout.clone())
    }
}

/// How often writes and `/healthz` check again what `connect` checked: a Redis restarted or
/// reconfigured under a running store may now evict keys or hold another layout, and the
/// store's connections open anew without a word. While a check refuses, it is made again
/// every [`VET_RETRY`].
const VET_EVERY: Duration = Duration::from_secs(10);
const VET_RETRY: Duration = Duration::from_secs(1);

/// How long a health check waits for Redis.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`RedisStore::vet`]'s checks may take.
const VET_TIMEOUT: Duration = Duration::from_secs(2);

/// The store's two connections: `main` carries every call but one, `side` the
/// compare-and-set of new codes and its `WAIT` (a `WAIT` blocks its connection). Both are
/// replaced whole when calls stall: after a cluster master failed over, the cluster client
/// was seen to stop sending anything, every call waiting out its timeout for good, until
/// the process restarted (found by an independent review); a fresh connection serves at once.
struct Conns {
    target: Target,
    main: RwLock<Conn>,
    side: RwLock<Conn>,
    /// When the connections were last opened anew (at most once per [`RENEW_EVERY`]).
    renewed: Mutex<Option<Instant>>,
    /// How many times they were.
    renewals: AtomicU64,
}

/// A handle of the connection in place now.
fn handle(conn: &RwLock<Conn>) -> Conn {
    conn.read().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The connections are opened anew at most once per this long.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Opening both connections anew gives up after this long.
const RENEW_TIMEOUT: Duration = Duration::from_secs(15);

/// A key index page's size when Redis does not say its `zset-max-listpack-entries` (its
/// default), and the bounds of a size it does say: pages of a few keys make a deep
/// directory, and a page far larger than a listpack is a skiplist anyway and costs a long
/// copy at each split.
const INDEX_PAGE_DEFAULT: usize = 128;
const INDEX_PAGE_MIN: usize = 4;
const INDEX_PAGE_MAX: usize = 1024;

/// A node's `maxmemory` and `maxmemory-policy` from its `INFO memory` text, if it says both.
fn eviction_of(text: &str) -> Option<(String, String)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    Some((field("maxmemory:")?, field("maxmemory_policy:")?))
}

/// The key index's page size for a `zset-max-listpack-entries` of `configured` (`None`: not
/// readable, e.g. `CONFIG` renamed away on a managed Redis).
fn index_page_size(configured: Option<usize>) -> usize {
    configured
        .unwrap_or(INDEX_PAGE_DEFAULT)
        .clamp(INDEX_PAGE_MIN, INDEX_PAGE_MAX)
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
        let conns = Arc::new(Conns {
            target,
            main: RwLock::new(conn),
            side: RwLock::new(side),
            renewed: Mutex::new(None),
            renewals: AtomicU64::new(0),
        });
        let mut store = RedisStore {
            runtime,
            conns,
            confirm_after: Mutex::new(BTreeMap::new()),
            label,
            clock,
            batch_ids: BatchIds::new(),
            known: Mutex::new(BTreeMap::new()),
            conditional: (0..256).map(|_| Mutex::new(())).collect(),
            index_page: INDEX_PAGE_DEFAULT,
            listed: write::Listed::default(),
            max_future_secs: tally_core::ingest::Limits::default().max_future_secs,
            answer_bounds: (DEFAULT_MAX_ANSWERS, None),
            write_deadline: write::WRITE_DEADLINE,
            vetted: Mutex::new(Vetted {
                at: Instant::now(),
                every: VET_EVERY,
                eviction: None,
                info: None,
                layout: None,
            }),
        };
        store.index_page = index_page_size(store.block_on(store.listpack_entries()));
        // (INFO first: a user that may not run it would otherwise be warned about first
        // that its eviction policy cannot be read.)
        // A cluster node named as a single server answers its first keyed command with a
        // redirection: say which URL it wants.
        let single = matches!(store.conns.target, Target::Single(_));
        let hint = |e: StoreError| {
            // The client's rendering of a MOVED reply: `Moved: <slot> <host:port>`.
            if single && e.detail().contains("Moved: ") {
                e.noted(
                    ": this Redis is a cluster node; name the cluster as \
                     redis+cluster://host:port,host:port,…",
                )
            } else {
                e
            }
        };
        store.block_on(store.check_info()).map_err(hint)?;
        store.block_on(store.check_eviction()).map_err(hint)?;
        store.block_on(store.check_layout()).map_err(hint)?;
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
        self.block_on(self.apply_async(batch, Some(id), None))
    }

    /// How far in the future the events it is given may be dated (`[limits]
    /// max_future_secs`; the default's otherwise): a schema change's additions count every
    /// event from that long after it.
    pub fn with_max_future_secs(mut self, secs: i64) -> Self {
        self.max_future_secs = secs;
        self
    }

    /// How many idempotency answers may be stored in a day, all together and (`Some`) of one
    /// scope: a token's keys, `t<digest>:<key>` (`[limits] max_idempotency_keys` and
    /// `max_idempotency_keys_per_token`). A batch with a key past either is refused
    /// `Unavailable` and applies nothing. 1 000 000 and none by default.
    pub fn with_answer_bounds(mut self, all: usize, per_scope: Option<usize>) -> Self {
        self.answer_bounds = (all, per_scope);
        self
    }

    /// How long a write may take in all, its calls' retries included, before it answers
    /// `Unavailable` (30 s by default; tests make it short).
    pub fn with_write_deadline(mut self, deadline: Duration) -> Self {
        self.write_deadline = deadline;
        self
    }

    /// How often writes and `/healthz` check Redis again ([`VET_EVERY`] by default; tests
    /// make it short).
    pub fn with_vet_every(self, every: Duration) -> Self {
        self.vetted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .every = every;
        self
    }

    /// Checks again, at most every [`VET_EVERY`], what `connect` checked: that the user may
    /// run `INFO`, that no node may evict keys and that Redis holds this build's layout (an
    /// emptied Redis gets it marked again, as at connect). A refusal found is kept, and
    /// answered to every write and health check until a check finds it gone. A check Redis
    /// does not answer within [`VET_TIMEOUT`] changes nothing: the last answer stands.
    pub(crate) async fn vet(&self) -> Result<(), StoreError> {
        {
            let mut v = self.vetted.lock().unwrap_or_else(PoisonError::into_inner);
            let due = match v.refusal() {
                Some(_) => v.every.min(VET_RETRY),
                None => v.every,
            };
            if v.at.elapsed() < due {
                return v.refusal().map_or(Ok(()), Err);
            }
            // This caller checks; the others meanwhile take the last answer.
            v.at = Instant::now();
        }
        // Each check within `VET_TIMEOUT`, and each answer alone: a check Redis does not
        // answer (slow, gone, or full: a full Redis still answers reads) leaves its last
        // answer as it was, and a write waits that much at most.
        let eviction = async {
            let texts = self.memory_info().await.ok()?;
            Some(self.eviction_refusal(&texts))
        };
        let (eviction, layout, info) = futures_util::future::join3(
            tokio::time::timeout(VET_TIMEOUT, eviction),
            tokio::time::timeout(VET_TIMEOUT, self.layout_refusal()),
            tokio::time::timeout(VET_TIMEOUT, self.info_refusal()),
        )
        .await;
        let mut v = self.vetted.lock().unwrap_or_else(PoisonError::into_inner);
        let before = v.refusal();
        if let Ok(Some(answer)) = eviction {
            v.eviction = answer;
        }
        if let Ok(Some(answer)) = layout {
            v.layout = answer;
        }
        if let Ok(Some(answer)) = info {
            v.info = answer;
        }
        let after = v.refusal();
        match (&before, &after) {
            (None, Some(r)) => {
                tracing::error!(error = %r.detail(), "Redis changed under this server: refusing writes")
            }
            (Some(_), None) => {
                tracing::info!(redis = %self.label, "Redis is fit again: writes resume")
            }
            _ => {}
        }
        after.map_or(Ok(()), Err)
    }

    /// What [`RedisStore::check_layout`] would refuse, read now: another layout version
    /// (an absent one is marked again, as at connect: an emptied Redis). `None` when Redis
    /// did not say.
    async fn layout_refusal(&self) -> Option<Option<StoreError>> {
        let stored = self.marked_layout().await.ok()?;
        Some(match stored {
            // An older layout this build upgrades (Redis restored from an older snapshot):
            // only at connect, where the upgrade is done whole.
            Some(v) if UPGRADES_FROM.iter().any(|u| u.to_string() == v) => {
                Some(StoreError::corrupt(format!(
                    "{} now holds tally key layout version {v}, which this build upgrades \
                     when it connects: restart this server to upgrade it",
                    self.label
                )))
            }
            Some(v) if v != LAYOUT_VERSION.to_string() => Some(self.foreign_layout(Some(&v))),
            _ => None,
        })
    }

    fn foreign_layout(&self, stored: Option<&str>) -> StoreError {
        StoreError::corrupt(format!(
            "{} holds tally key layout version {}; this build reads and writes version \
             {LAYOUT_VERSION} (docs/redis.md): use another Redis database or migrate it",
            self.label,
            stored.unwrap_or("(none)")
        ))
    }

    /// Whether this store talks to a cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn().is_cluster()
    }

    /// How many times the store opened its connections anew after a call timed out.
    pub fn renewals(&self) -> u64 {
        self.conns.renewals.load(Ordering::Relaxed)
    }

    /// A handle of the main connection (the one in place now).
    fn conn(&self) -> Conn {
        handle(&self.conns.main)
    }

    /// A handle of the side connection.
    fn side(&self) -> Conn {
        handle(&self.conns.side)
    }

    /// A call timed out: opens both connections anew in the background and puts them in place
    /// of the old ones (calls in flight finish on those), unless that was done less than
    /// [`RENEW_EVERY`] ago.
    fn suspect(&self, why: &'static str) {
        {
            let mut renewed = self
                .conns
                .renewed
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if renewed.is_some_and(|at| at.elapsed() < RENEW_EVERY) {
                return;
            }
            *renewed = Some(Instant::now());
        }
        let (conns, label) = (self.conns.clone(), self.label.clone());
        self.runtime.1.spawn(async move {
            let open = async {
                Ok::<_, RedisError>((
                    Conn::open(&conns.target).await?,
                    Conn::open(&conns.target).await?,
                ))
            };
            match tokio::time::timeout(RENEW_TIMEOUT, open).await {
                Ok(Ok((main, side))) => {
                    *conns.main.write().unwrap_or_else(PoisonError::into_inner) = main;
                    *conns.side.write().unwrap_or_else(PoisonError::into_inner) = side;
                    conns.renewals.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(redis = %label, why, "connected anew");
                }
                Ok(Err(e)) => tracing::warn!(
                    redis = %label, error = %e,
                    why, "connecting anew failed; the next time out tries again"
                ),
                Err(_) => tracing::warn!(
                    redis = %label,
                    why, "connecting anew timed out too; the next time out tries again"
                ),
            }
        });
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
            let result = call(self.conn()).await;
            if let Err(e) = &result
                && e.is_timeout()
            {
                self.suspect("a call timed out");
            }
            match result {
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
            // `GET`: the holder before, if any. A try whose answer was lost and that took the
            // lock makes its retry find this token: taken all the same.
            let before: Option<String> = self
                .retry(|mut c| async move {
                    redis::cmd("SET")
                        .arg(name)
                        .arg(token)
                        .arg("NX")
                        .arg("PX")
                        .arg(LOCK_MS)
                        .arg("GET")
                        .query_async(&mut c)
                        .await
                })
                .await?;
            if before.as_deref().is_none_or(|b| b == token) {
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

    /// Redis' `zset-max-listpack-entries`, if it says.
    async fn listpack_entries(&self) -> Option<usize> {
        let reply: Result<Vec<String>, StoreError> = self
            .retry(|mut c| async move {
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("zset-max-listpack-entries")
                    .query_async(&mut c)
                    .await
            })
            .await;
        reply.ok()?.get(1)?.parse().ok()
    }

    /// Moves every namespace's key index of layout 4 (or older), if any is left, into the
    /// paged index of this layout, a chunk per script call, before the store serves
    /// anything: its scripts read and write pages only (naming the old set too would make
    /// every one of them fail while a cluster migrates the namespace's slot, the old set
    /// being gone). A move interrupted makes the connection fail; the next one goes on.
    async fn migrate_index(&self) -> Result<(), StoreError> {
        const CHUNK: usize = 1000;
        let names: Vec<String> = self
            .retry(|mut c| async move {
                redis::cmd("HKEYS")
                    .arg(layout::SCHEMAS_KEY)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let moved = join_all(names.iter().filter_map(|n| Namespace::new(n).ok()).map(
            |ns| async move {
                let (dir, old, pfx) = (
                    layout::key_dir_key(&ns),
                    layout::old_keys_key(&ns),
                    layout::key_page_prefix(&ns),
                );
                let mut total = 0;
                loop {
                    let n: usize = self
                        .retry(|mut c| {
                            let (dir, old, pfx) = (&dir, &old, &pfx);
                            async move {
                                scripts::MIGRATE_INDEX
                                    .key(dir)
                                    .key(old)
                                    .arg(pfx)
                                    .arg(self.index_page)
                                    .arg(CHUNK)
                                    .invoke_async(&mut c)
                                    .await
                            }
                        })
                        .await?;
                    total += n;
                    if n < CHUNK {
                        return Ok::<_, StoreError>(total);
                    }
                }
            },
        ))
        .await;
        let moved = moved.into_iter().sum::<Result<usize, StoreError>>()?;
        if moved > 0 {
            tracing::info!(keys = moved, "moved the key index into pages (layout 5)");
        }
        Ok(())
    }

    /// The layout version Redis holds, this build's marked first if it holds none (an empty
    /// or emptied Redis). Read first, written only when absent: a full Redis refuses even a
    /// `SET NX` of a key it holds, and reads go on.
    async fn marked_layout(&self) -> Result<Option<String>, StoreError> {
        self.retry(|mut c| async move {
            let held: Option<String> = redis::cmd("GET")
                .arg(LAYOUT_KEY)
                .query_async(&mut c)
                .await?;
            if held.is_some() {
                return Ok(held);
            }
            redis::cmd("SET")
                .arg(LAYOUT_KEY)
                .arg(LAYOUT_VERSION)
                .arg("NX")
                .exec_async(&mut c)
                .await?;
            redis::cmd("GET").arg(LAYOUT_KEY).query_async(&mut c).await
        })
        .await
    }

    async fn check_layout(&self) -> Result<(), StoreError> {
        let stored = self.marked_layout().await?;
        match stored.as_deref() {
            // A server of an older layout still running may have created records since.
            Some(v) if v == LAYOUT_VERSION.to_string() => {
                self.rewrite_records().await?;
                self.migrate_index().await
            }
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
                self.migrate_index().await?;
                tracing::info!(
                    from = v,
                    to = LAYOUT_VERSION,
                    "upgraded the tally key layout"
                );
                Ok(())
            }
            other => Err(self.foreign_layout(other)),
        }
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

    /// Refuses a Redis that may evict keys (a `maxmemory` and a `maxmemory-policy` other
    /// than `noeviction`, on the server or any master): an evicted key loses counts, a schema, a key index page
    /// or an idempotency answer with no error anywhere (found by an independent review:
    /// every write answered 200 and a series read 0). A Redis whose `INFO` does not say is
    /// taken as it is, with a warning.
    async fn check_eviction(&self) -> Result<(), StoreError> {
        let texts = match self.memory_info().await {
            Ok(texts) => texts,
            Err(e) => {
                tracing::warn!(error = %e.detail(), "could not read maxmemory-policy: make sure it is noeviction");
                return Ok(());
            }
        };
        if let Some(refusal) = self.eviction_refusal(&texts) {
            return Err(refusal);
        }
        if texts.is_empty() || texts.iter().any(|t| eviction_of(t).is_none()) {
            tracing::warn!(
                redis = %self.label,
                "INFO does not say maxmemory and maxmemory-policy of every node: make sure no \
                 node may evict (noeviction)"
            );
        }
        Ok(())
    }

    /// The refusal of a Redis one of whose nodes (`INFO memory` texts) may evict keys.
    fn eviction_refusal(&self, texts: &[String]) -> Option<StoreError> {
        // Per node: a node with no maxmemory (0) never evicts, whatever its policy.
        texts
            .iter()
            .filter_map(|t| eviction_of(t))
            .find_map(|(max, policy)| {
                (max != "0" && policy != "noeviction").then(|| {
                    StoreError::unavailable(format!(
                        "{}: maxmemory-policy is {policy} with a maxmemory of {max} bytes; tally \
                     needs noeviction, since a key Redis evicts loses counts, schemas or \
                     idempotency answers without an error (CONFIG SET maxmemory-policy \
                     noeviction on every node and in its config file, or on a managed Redis \
                     in its parameter group); past maxmemory, writes are then refused with 503",
                        self.label
                    ))
                })
            })
    }

    /// Refuses a Redis user that may not run `INFO`: `APPLY` runs it for the key index's
    /// epoch (`scripts.rs`), so every write would fail as an internal error (found by a
    /// black-box review with an ACL user given `-info`).
    async fn check_info(&self) -> Result<(), StoreError> {
        match self.info_refusal().await {
            Some(Some(refused)) => Err(refused),
            _ => Ok(()),
        }
    }

    /// Whether the user may run `INFO`, asked now: `Some(None)` if it may, `Some(Some(_))`
    /// the refusal if not (an ACL changed under a running store is found by
    /// [`RedisStore::vet`]), `None` when Redis did not say.
    async fn info_refusal(&self) -> Option<Option<StoreError>> {
        use redis::{ErrorKind, ServerErrorKind};
        let mut c = self.conn();
        let info: Result<redis::Value, RedisError> =
            redis::cmd("INFO").arg("server").query_async(&mut c).await;
        match info {
            Ok(_) => Some(None),
            // Refused by the user's ACL, or renamed away (`rename-command INFO ""`).
            Err(e)
                if matches!(e.kind(), ErrorKind::Server(ServerErrorKind::NoPerm))
                    || (matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ResponseError))
                        && e.to_string().contains("unknown command")) =>
            {
                Some(Some(StoreError::unavailable(format!(
                    "{}: this Redis user may not run INFO, which tally's write script runs; \
                     grant it (ACL SETUSER <user> +info, and no rename-command of INFO)",
                    self.label
                ))))
            }
            Err(_) => None,
        }
    }

    /// `INFO memory` of the server, or of every master of a cluster: one text a node.
    async fn memory_info(&self) -> Result<Vec<String>, StoreError> {
        let info: Vec<redis::Value> = self
            .retry(|c| {
                let mut info = redis::cmd("INFO");
                info.arg("memory");
                c.on_every_master(info)
            })
            .await?;
        let mut texts = Vec::new();
        info.iter().for_each(|v| collect_text(v, &mut texts));
        Ok(texts)
    }

    async fn used_memory(&self) -> Result<f64, StoreError> {
        // A cluster answers one INFO per master: sum them.
        Ok(self
            .memory_info()
            .await?
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
    /// it is held, and the apply checks, atomically with it, that it still is (a lease of
    /// `LOCK_MS`). Within one server, callers first queue on a local stripe.
    fn apply_if(
        &self,
        batch: &Batch,
        window: &KeyRead<'_>,
        decide: &mut dyn FnMut(&tally_core::store::Buckets) -> Result<Decision, StoreError>,
    ) -> Result<bool, StoreError> {
        let local = tally_core::store::stripe(&self.conditional, window.ns, window.key);
        let _queued = local.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked before the lock is taken: a check that waits on a slow Redis must not eat
        // into the lock's lease (the write checks again only when due).
        self.block_on(self.vet())?;
        let name = layout::lock_key(&layout::series_tag(window.ns, window.key.as_str()));
        let token = self.batch_ids.fresh();
        self.block_on(self.lock(&name, &token))?;
        // The lock is a lease: if this server or Redis stalls past it, another server may
        // take it and decide on the same count. The apply is fenced by the token, so it
        // then changes nothing.
        let fence = write::Fence {
            lock: name.clone(),
            token: token.clone(),
        };
        let outcome = tally_core::store::decide_and_apply(self, batch, window, decide, &mut |b| {
            self.block_on(self.apply_async(b, None, Some(&fence)))
        });
        // A lock not released frees itself after `LOCK_MS`: an answer already decided (and
        // applied) stands, rather than a 503 that a client would retry into a second count.
        if let Err(e) = self.block_on(self.unlock(&name, &token)) {
            tracing::warn!(error = %e.detail(), lock = %name, "a limited increment's lock was not released");
        }
        outcome
    }

    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        self.block_on(self.all_schemas())
    }

    /// `HLEN` of the schemas hash: one field per namespace, no record decoded.
    fn namespace_count(&self) -> Result<usize, StoreError> {
        self.block_on(self.retry(|mut c| async move {
            redis::cmd("HLEN")
                .arg(layout::SCHEMAS_KEY)
                .query_async(&mut c)
                .await
        }))
    }

    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
        // As writes and reads load them: with the schemas' node out of reach, the record
        // last read stands in (docs/redis.md "Cluster operation"), so that a namespace
        // whose series live elsewhere is still validated and queried.
        let mut stored = self.block_on(self.load_schemas(&[ns]))?;
        Ok(stored.remove(ns).map(|s| s.schema_at(self.clock.now())))
    }

    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        self.block_on(self.put_schema_async(ns, schema))
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        self.block_on(self.apply_async(batch, None, None))
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

    /// A `PING` to the server or every master, and [`RedisStore::vet`]'s checks, within
    /// [`HEALTH_TIMEOUT`]: a Redis that does not answer (stopped, or paused) is unhealthy
    /// then, not after every call's retries have timed out (30 s, found by a black-box
    /// review: longer than load balancers wait).
    fn writable(&self) -> Result<(), StoreError> {
        self.block_on(self.vet())
    }

    fn health(&self) -> Result<(), StoreError> {
        self.block_on(async {
            let check = async {
                self.retry(|c| c.on_every_master(redis::cmd("PING")))
                    .await?;
                self.vet().await
            };
            tokio::time::timeout(HEALTH_TIMEOUT, check)
                .await
                .unwrap_or_else(|_| {
                    // As a call that timed out would: a stuck client is replaced, even when
                    // nothing but health checks reach this server.
                    self.suspect("a health check timed out");
                    Err(StoreError::unavailable(format!(
                        "{}: no answer within {} s",
                        self.label,
                        HEALTH_TIMEOUT.as_secs()
                    )))
                })
        })
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

#[cfg(all(test, feature = "test-support"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A `SET NX` whose answer was lost after it took the lock is sent again: the retry
    /// must find the lock its own, not wait on itself until `LOCK_WAIT`.
    #[test]
    fn a_retried_take_of_a_lock_it_took_holds_it() {
        let server = testing::RedisServer::start();
        let store = RedisStore::connect(&server.url()).unwrap();
        let name = layout::lock_key("{t|k}");
        let started = std::time::Instant::now();
        store.block_on(store.lock(&name, "mine")).unwrap();
        store.block_on(store.lock(&name, "mine")).unwrap();
        assert!(started.elapsed() < LOCK_WAIT / 2);
        assert_eq!(server.cli(&["GET", &name]).trim(), "mine");
        store.block_on(store.unlock(&name, "mine")).unwrap();
        assert_eq!(server.cli(&["EXISTS", &name]).trim(), "0");
    }
}

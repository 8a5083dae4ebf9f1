//! The state every request shares: the store, the settings, the clock, the server's metrics,
//! the idempotency keys in flight and the rendered OpenAPI document — and the one way a
//! handler reaches the store, [`App::blocking`].
//!
//! Store calls block (the embedded engine waits for fsync), so none runs as async work:
//! [`App::blocking`] runs one where tokio has given up the thread as an async worker for its
//! time (`block_in_place`; writes, schema calls, health checks, the few small reads handlers
//! make), [`App::query`] a query on the blocking pool under its time limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tally_core::model::Namespace;
use tally_core::query::Ctx;
use tally_core::store::{Batch, Clock, Deadline, Store, StoreError};
use tally_core::{ErrorCode, ingest};

use crate::config::Settings;
use crate::error::ApiError;
use crate::idempotency::InFlight;
use crate::metrics::Metrics;

/// Namespaces reserved by [`App::reserve_creations`], given back when dropped (once the
/// batch is applied, or failed: the store then holds them, or not).
pub(crate) struct Reservation<'a> {
    app: &'a App,
    names: Vec<Namespace>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.names.is_empty() {
            let mut pending = self.app.creation_lock();
            for ns in &self.names {
                if let Some(holders) = pending.get_mut(ns) {
                    *holders -= 1;
                    if *holders == 0 {
                        pending.remove(ns);
                    }
                }
            }
        }
    }
}

/// Everything a request needs.
#[derive(Clone)]
pub struct App(Arc<Inner>);

/// Bodies up to this many bytes are parsed on the async worker that read them (about a
/// millisecond's work at most); larger ones as blocking work ([`App::blocking`]).
const INLINE_PARSE_BYTES: usize = 256 * 1024;

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

struct Inner {
    store: Arc<dyn Store>,
    settings: Settings,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    in_flight: InFlight,
    /// Set once, by the router that serves this app.
    openapi: OnceLock<String>,
    /// Exports streaming now, at most `max_concurrent_queries`: an export outlives its
    /// handler (and so its admission permit), so it holds one of these instead.
    exports: Arc<tokio::sync::Semaphore>,
    /// `/healthz` and `/metrics` asking the backend now, at most [`crate::ops::OPS_PROBES`]:
    /// they need no token and take no admission permit, so a flood of them must not fill
    /// the threads every write and query needs (a slow Redis holds each for seconds).
    probes: tokio::sync::Semaphore,
    /// Namespaces this server's batches are creating now, each with how many batches hold
    /// it (see [`App::reserve_creations`]).
    creating: std::sync::Mutex<HashMap<Namespace, usize>>,
    /// Store calls and reads running now, in place or on the blocking pool (see
    /// [`App::blocking`]).
    blocking_now: Arc<AtomicUsize>,
}

/// [`App::blocking`] runs a call in place only while fewer than this many store calls and
/// reads run: each call in place has tokio move its worker's tasks to a thread of the
/// blocking pool, and a pool with no thread left (512) would stall them; past this, calls
/// go to the pool and wait there, as every call did before.
const IN_PLACE_BELOW: usize = 64;

/// Counts one call running until dropped.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn start(count: &Arc<AtomicUsize>) -> (Running, usize) {
        let before = count.fetch_add(1, Ordering::SeqCst);
        (Running(Arc::clone(count)), before)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl App {
    pub fn new(store: Arc<dyn Store>, settings: Settings, clock: Arc<dyn Clock>) -> App {
        App(Arc::new(Inner {
            store,
            clock,
            metrics: Metrics::default(),
            in_flight: InFlight::default(),
            openapi: OnceLock::new(),
            exports: Arc::new(tokio::sync::Semaphore::new(
                settings.server.max_concurrent_queries,
            )),
            probes: tokio::sync::Semaphore::new(crate::ops::OPS_PROBES),
            creating: std::sync::Mutex::new(HashMap::new()),
            blocking_now: Arc::new(AtomicUsize::new(0)),
            settings,
        }))
    }

    /// Waits for a turn to ask the backend for `/healthz` or `/metrics` (waiting holds no
    /// thread).
    pub(crate) async fn probe_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.0.probes.acquire().await.ok()
    }

    /// The permits of exports in flight.
    pub(crate) fn exports(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.0.exports
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.0.store
    }

    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    /// Creates or updates the namespaces the configuration file declares (whatever `[limits]
    /// max_namespaces` says), and warns when there are as many namespaces as it allows or
    /// more: no write will make a new one.
    pub fn apply_config_namespaces(&self) -> Result<(), StoreError> {
        for (ns, schema) in &self.0.settings.namespaces {
            let stored = self.0.store.schema(ns)?;
            let changed = stored.as_ref().filter(|s| !s.declares_same(schema));
            if stored.is_none() || changed.is_some() {
                self.0.store.put_schema(ns, schema)?;
            }
            if let Some(before) = changed {
                // Servers sharing a Redis with different config files rewrite each other's
                // namespaces at every start: say so (found by a black-box review).
                let doc = |s: &tally_core::model::Schema| {
                    serde_json::to_string(&s.to_doc()).unwrap_or_default()
                };
                tracing::warn!(
                    namespace = %ns,
                    before = %doc(before),
                    after = %doc(schema),
                    "the config file's [namespaces] changed this namespace's schema"
                );
            }
        }
        let (count, max) = (
            self.0.store.namespace_count()?,
            self.0.settings.limits.max_namespaces,
        );
        if count >= max {
            tracing::warn!(
                namespaces = count,
                max_namespaces = max,
                "as many namespaces as [limits] max_namespaces allows, or more: writes and \
                 PUT of a new one are refused (422 too_many_namespaces) until it is raised"
            );
        }
        Ok(())
    }

    /// Holds a batch's creations to `[limits] max_namespaces` once more, against the store as
    /// it is now and the creations of this server's other batches checked and not yet applied
    /// (batches prepared at once each saw room for their own): the new namespaces that fit
    /// are reserved until the returned guard drops (after the apply), and those past the
    /// limit are answered for the caller to refuse or leave out. No wait for a batch that
    /// creates none. Servers sharing one Redis each hold the limit alone: together they may
    /// pass it by the creations they run at the same moment.
    pub(crate) fn reserve_creations(
        &self,
        batch: &Batch,
    ) -> Result<(Reservation<'_>, Vec<Namespace>), StoreError> {
        let mut reserved = Reservation {
            app: self,
            names: Vec::new(),
        };
        if batch.create.is_empty() {
            return Ok((reserved, Vec::new()));
        }
        let mut pending = self.creation_lock();
        let sorted =
            ingest::sort_creations(&**self.store(), batch, &pending, &self.settings().limits)?;
        // A name another batch creates too is held by both: it keeps its place until the
        // last gives it back.
        reserved.names = sorted.new;
        reserved.names.extend(sorted.shared);
        for ns in &reserved.names {
            *pending.entry(ns.clone()).or_insert(0) += 1;
        }
        Ok((reserved, sorted.over))
    }

    /// The namespaces being created now, with their holders (see
    /// [`App::reserve_creations`]).
    fn creation_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Namespace, usize>> {
        self.0
            .creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> i64 {
        self.0.clock.now()
    }

    /// What a query needs to know of the server: the time, the point budget, the deadline.
    pub(crate) fn ctx(&self, deadline: &Deadline) -> Ctx {
        Ctx {
            now: self.now(),
            max_points: self.0.settings.limits.max_points,
            deadline: deadline.clone(),
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub(crate) fn in_flight(&self) -> &InFlight {
        &self.0.in_flight
    }

    /// Keeps the OpenAPI document `/openapi.json` serves; the first one set stays.
    pub(crate) fn set_openapi(&self, json: String) {
        let _ = self.0.openapi.set(json);
    }

    pub(crate) fn openapi(&self) -> Option<&str> {
        self.0.openapi.get().map(String::as_str)
    }

    /// Runs a read on the blocking pool under `[limits] query_timeout_ms`. The read checks its
    /// [`Deadline`] as it goes and stops once the time is past — or once this future is
    /// dropped, which is what hyper does when the client goes away — so an abandoned or
    /// runaway query gives its thread back. If the read does not notice in time, the answer
    /// is `503 query_timeout` all the same.
    pub(crate) async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&App, &Deadline) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let ms = self.0.settings.server.query_timeout_ms;
        // What is left of it once the query waited for its turn (admission's); a query
        // run outside admission has it whole.
        let waited = crate::admission::QUEUED_AT
            .try_with(|at| at.elapsed())
            .unwrap_or_default();
        let limit = std::time::Duration::from_millis(ms).saturating_sub(waited);
        if limit.is_zero() {
            return Err(ApiError::new(
                ErrorCode::QueryTimeout,
                format!(
                    "the query waited {} ms for its turn and ran past {ms} ms ([limits] \
                     query_timeout_ms)",
                    waited.as_millis()
                ),
            ));
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(Arc::clone(&cancelled));
        let deadline = Deadline::new(limit, cancelled);
        let app = self.clone();
        let (running, _) = Running::start(&self.0.blocking_now);
        let task = tokio::task::spawn_blocking(move || {
            let _running = running;
            f(&app, &deadline)
        });
        // A little grace so the read's own check, with its clearer message, usually wins.
        let grace = limit + std::time::Duration::from_millis(50);
        match tokio::time::timeout(grace, task).await {
            Ok(joined) => joined.map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("a query task failed: {e}"))
            })?,
            Err(_) => Err(ApiError::new(
                ErrorCode::QueryTimeout,
                format!("the query ran past {ms} ms ([limits] query_timeout_ms)"),
            )),
        }
    }

    /// Parses a request body of `len` bytes with `f`: here when it is small, on the blocking
    /// pool when it is not. A body of max_body_bytes takes tens of milliseconds to parse,
    /// which an async worker (one per core) must not spend while others wait; a typical
    /// batch parses in less time than the hop to the pool costs.
    pub(crate) async fn parse<T: Send + 'static>(
        &self,
        len: usize,
        f: impl FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        if len <= INLINE_PARSE_BYTES {
            f(self)
        } else {
            self.blocking(f).await
        }
    }

    /// Runs a store call where it may block: on this very thread, which tokio gives up as
    /// an async worker meanwhile (`block_in_place`: the request's own path makes no hop to
    /// another thread and back, which costs a wake-up on each side), or on the blocking pool
    /// — on a current-thread runtime (some tests), and while [`IN_PLACE_BELOW`] or more
    /// calls and reads run. Either way the call runs to its end even if the request is
    /// dropped meanwhile (a client gone mid-write still has its batch applied whole), and a
    /// panic in it is a 500 naming it, not a lost connection task.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let (running, before) = Running::start(&self.0.blocking_now);
        if before < IN_PLACE_BELOW
            && tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::MultiThread
        {
            let run = std::panic::AssertUnwindSafe(|| f(self));
            let done = tokio::task::block_in_place(|| std::panic::catch_unwind(run));
            drop(running);
            return done.map_err(|p| {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                ApiError::new(ErrorCode::Internal, format!("a request task failed: {why}"))
            })?;
        }
        let app = self.clone();
        tokio::task::spawn_blocking(move || {
            let _running = running;
            f(&app)
        })
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("a request task failed: {e}")))?
    }
}

/// Sets the flag when dropped: the request is over, one way or another.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tally_core::model::{RawEvent, Schema};
    use tally_core::reference::MemStore;
    use tally_core::store::ManualClock;

    use super::*;

    fn creating(app: &App, nss: &[&str]) -> Batch {
        let raws: Vec<RawEvent> = nss
            .iter()
            .map(|ns| RawEvent {
                ns: (*ns).into(),
                key: "k".into(),
                ts: Some(1000),
                n: Some(1),
                dims: Vec::new(),
            })
            .collect();
        let s = app.settings();
        ingest::prepare(&**app.store(), &raws, 1000, &s.limits, &s.defaults).unwrap()
    }

    /// A namespace two batches create at once keeps its place until both give it back: the
    /// first giving it back unmade does not free room a third could take (the limit would be
    /// passed when the second makes it). Found by a review.
    #[test]
    fn a_namespace_two_batches_create_keeps_its_place_until_both_are_done() {
        let clock = Arc::new(ManualClock::new(1000));
        let store = Arc::new(MemStore::new(clock.clone()));
        store
            .put_schema(&Namespace::new("a").unwrap(), &Schema::default())
            .unwrap();
        let settings = Settings::from_toml("[limits]\nmax_namespaces = 2").unwrap();
        let app = App::new(store.clone(), settings, clock);
        let (x1, x2, y) = (
            creating(&app, &["x"]),
            creating(&app, &["x"]),
            creating(&app, &["y"]),
        );
        let (first, over) = app.reserve_creations(&x1).unwrap();
        assert!(over.is_empty());
        let (second, over) = app.reserve_creations(&x2).unwrap();
        assert!(over.is_empty());
        drop(first);
        let (_third, over) = app.reserve_creations(&y).unwrap();
        assert_eq!(over, [Namespace::new("y").unwrap()]);
        store.apply(&x2).unwrap();
        drop(second);
        assert!(app.creation_lock().is_empty());
        assert_eq!(store.namespace_count().unwrap(), 2);
    }

    /// An app over an empty reference store with the default settings.
    fn memory_app() -> App {
        let clock = Arc::new(ManualClock::new(1000));
        let store = Arc::new(MemStore::new(clock.clone()));
        App::new(store, Settings::default(), clock)
    }

    /// A store call that panics answers 500 naming the panic, on either kind of runtime
    /// (`block_in_place` on a multi-thread one, the blocking pool on a current-thread one),
    /// and the server goes on: the next call runs.
    #[test]
    fn a_blocking_call_that_panics_is_an_internal_error() {
        let app = memory_app();
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for rt in [multi, current] {
            // In a task, as a handler runs: on a worker thread of the multi-thread runtime.
            let a = app.clone();
            let e = rt
                .block_on(rt.spawn(async move {
                    a.blocking(|_| -> Result<(), ApiError> { panic!("boom") })
                        .await
                }))
                .unwrap()
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::Internal);
            assert!(e.message.contains("boom"), "{}", e.message);
            let n = rt.block_on(app.blocking(|app| Ok(app.store().namespace_count()?)));
            assert_eq!(n.unwrap(), 0);
        }
        assert_eq!(app.0.blocking_now.load(Ordering::SeqCst), 0);
    }

    /// Past [`IN_PLACE_BELOW`] calls at once, calls wait on the blocking pool rather than
    /// run in place: with more calls in place than the pool has threads, the runtime's own
    /// timers stalled until a call ended (a review's reproduction; here, without the bound,
    /// this timer of 100 ms fired after 1.5 s).
    #[test]
    fn many_slow_calls_at_once_leave_the_async_workers_running() {
        let app = memory_app();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(IN_PLACE_BELOW + 8)
            .enable_time()
            .build()
            .unwrap();
        let late = rt.block_on(async {
            let calls: Vec<_> = (0..IN_PLACE_BELOW + 24)
                .map(|_| {
                    let app = app.clone();
                    tokio::spawn(async move {
                        app.blocking(|_| {
                            std::thread::sleep(std::time::Duration::from_millis(1500));
                            Ok(())
                        })
                        .await
                    })
                })
                .collect();
            // A timer of the runtime's own (the `block_on` future, as `tally serve`'s
            // accept loop): it was the one to stall.
            let t = std::time::Instant::now();
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let late = t.elapsed();
            for c in calls {
                c.await.unwrap().unwrap();
            }
            late
        });
        assert!(late < std::time::Duration::from_millis(1000), "{late:?}");
        assert_eq!(app.0.blocking_now.load(Ordering::SeqCst), 0);
    }
}

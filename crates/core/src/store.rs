//! The `Store` trait: the minimum a backend offers the query layer, and the batch it applies.
//!
//! Designed for two very different backends: the embedded engine (in-memory shards, log,
//! segments) and Redis (a hash per series and window, round trips are the cost). So every
//! read is *bulk*: one call returns all the buckets of one key's totals and subtotals over a
//! range (one pipeline per key for Redis), and a batch of reads is one call. A backend
//! applies a [`Batch`] so that a read of one key sees each event wholly or not at all.

pub use crate::durability::{FsyncPolicy, InvalidFsync};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::ErrorCode;
use crate::model::{Duration, Key, Namespace, Schema, Subtotal};

/// One schema-resolved increment: the event's totals plus the subtotals it adds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Increment {
    pub ns: Namespace,
    pub key: Key,
    pub ts: i64,
    pub n: i64,
    /// Canonical dimension name and (escaped) value; sorted, unique by dimension.
    pub subtotals: Vec<Subtotal>,
}

/// A validated batch, applied all or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Namespaces this batch creates (auto-creation on first write), with their schemas.
    pub create: Vec<(Namespace, Schema)>,
    pub increments: Vec<Increment>,
    /// The answer to remember under an `Idempotency-Key`, stored atomically with the batch so
    /// a retry after a crash can never apply it twice.
    pub idempotency: Option<IdemRecord>,
}

/// A remembered answer (IETF httpapi idempotency-key draft): the request's fingerprint and
/// the answer first sent, until `expires` (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRecord {
    pub key: String,
    pub fingerprint: String,
    pub expires: i64,
    pub status: u16,
    pub body: String,
}

/// What to read of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want<'a> {
    /// The totals.
    Totals,
    /// Totals and the subtotals of one value of one dimension.
    Value { dim: &'a str, value: &'a str },
    /// Totals and the subtotals of every value of one dimension.
    Dim { dim: &'a str },
    /// Totals and every subtotal (dashboards).
    All,
}

/// A read of one key's buckets of one tier over `[from, to)` (bucket-aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRead<'a> {
    pub ns: &'a Namespace,
    pub key: &'a Key,
    pub resolution: Duration,
    pub from: i64,
    pub to: i64,
    pub want: Want<'a>,
    /// The caller only sums each subtotal series over the range (a breakdown, a dashboard's
    /// breakdowns): a store may then answer each with one bucket, at `from`, holding its
    /// sum, instead of all of them. Totals are always answered bucket by bucket.
    pub sum_subtotals: bool,
    /// With `sum_subtotals`: the caller answers only the `keep` largest sums of each
    /// dimension (largest first, ties by value in byte order; sums of 0 never), and the
    /// others only as their sum. A store may then answer only those values, and each
    /// dimension's others summed in [`KeyData::rest`], so that a key of millions of values
    /// costs the read no more than the answer. `None`: every value.
    pub keep: Option<usize>,
}

/// Sparse buckets: `(bucket start, count)`, sorted by start, zero buckets may be left out.
pub type Buckets = Vec<(i64, i64)>;

/// The buckets of one subtotal series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtotalBuckets {
    pub dim: String,
    pub value: String,
    pub buckets: Buckets,
}

/// The answer to a [`KeyRead`], read at one moment: totals and subtotals agree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyData {
    pub totals: Buckets,
    pub subtotals: Vec<SubtotalBuckets>,
    /// Per dimension, the sum of the values a read's [`KeyRead::keep`] left out of
    /// `subtotals` (a dimension with none left out may be missing).
    pub rest: Vec<(String, i64)>,
}

/// A scan of every key of a namespace for `top`: the sum of each key's totals (or of one
/// subtotal) over `[from, to)` in one tier.
#[derive(Debug, Clone, Copy)]
pub struct Scan<'a> {
    pub ns: &'a Namespace,
    pub resolution: Duration,
    pub from: i64,
    pub to: i64,
    pub value: Option<(&'a str, &'a str)>,
    /// A scan visits every key: the backend checks this every few thousand keys and stops.
    pub deadline: &'a Deadline,
}

/// What [`Store::top`] answers: the keys with the largest non-zero sums, largest first (ties
/// in key byte order), and the sum over every key the scan covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopKeys {
    pub keys: Vec<(Key, i64)>,
    pub total: i64,
}

impl TopKeys {
    /// The `limit` first of `keys` (every non-zero sum the scan found) in top order.
    pub fn select(mut keys: Vec<(Key, i64)>, limit: usize) -> TopKeys {
        keys.retain(|(_, n)| *n != 0);
        let total = keys.iter().fold(0i64, |t, (_, n)| t.wrapping_add(*n));
        if keys.len() > limit {
            keys.select_nth_unstable_by(limit, top_order);
            keys.truncate(limit);
        }
        keys.sort_by(top_order);
        TopKeys { keys, total }
    }
}

/// The order of a top: larger sums first, then keys in byte order.
pub fn top_order(a: &(Key, i64), b: &(Key, i64)) -> std::cmp::Ordering {
    b.1.cmp(&a.1)
        .then_with(|| a.0.as_str().as_bytes().cmp(b.0.as_str().as_bytes()))
}

/// When a read must stop: past its time (`[limits] query_timeout_ms`) or once the client
/// that asked has gone. Long loops call [`Deadline::check`] every few thousand steps; the
/// default never stops.
#[derive(Debug, Clone, Default)]
pub struct Deadline {
    at: Option<Instant>,
    cancelled: Option<Arc<AtomicBool>>,
}

impl Deadline {
    /// No limit: tools and tests.
    pub fn none() -> Deadline {
        Deadline::default()
    }

    /// Stops `after` from now, or once `cancelled` is set (the server sets it when the
    /// request's future is dropped: the client went away).
    pub fn new(after: std::time::Duration, cancelled: Arc<AtomicBool>) -> Deadline {
        Deadline {
            at: Instant::now().checked_add(after),
            cancelled: Some(cancelled),
        }
    }

    /// `Err(Timeout)` once the read should stop.
    pub fn check(&self) -> Result<(), StoreError> {
        if self
            .cancelled
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            return Err(StoreError::Timeout {
                what: "the query was cancelled: its client went away".into(),
            });
        }
        if self.at.is_some_and(|at| Instant::now() >= at) {
            return Err(StoreError::Timeout {
                what: "the query ran past [limits] query_timeout_ms".into(),
            });
        }
        Ok(())
    }
}

/// A page of a namespace's keys in byte order: those starting with `prefix`, strictly after
/// `after`, at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyList<'a> {
    pub ns: &'a Namespace,
    pub prefix: &'a str,
    pub after: Option<&'a str>,
    pub limit: usize,
}

/// The underlying error a backend failure keeps: an `io::Error`, a decoder's error, a Redis
/// client's error. Shared, so the error stays `Clone` (a poisoned writer hands the same
/// cause to every later caller).
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A backend failure. The query layer passes it through; the server maps its code. The
/// message says what failed; the cause, when there is one, is the error's `source`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend cannot serve now (its log writer stopped, Redis is down).
    #[error("backend unavailable: {what}")]
    Unavailable {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Stored bytes do not decode, or break an invariant.
    #[error("corrupt data: {what}")]
    Corrupt {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
    /// A write or fsync failed earlier; nothing more is acknowledged.
    #[error("the writer is poisoned after an I/O failure and accepts no writes: {what}")]
    Poisoned {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
    /// A read ran past its deadline, or its client went away.
    #[error("{what}")]
    Timeout { what: String },
    /// A bug: a state the backend should never reach.
    #[error("internal error: {what}")]
    Internal { what: String },
    /// The backend does not offer this operation (a rebuild on Redis).
    #[error("{what}")]
    Unsupported { what: String },
    /// A different request used the batch's idempotency key (seen by a backend several
    /// tally servers share, when the server's own look-up did not): nothing was applied.
    #[error("{what}")]
    Claimed { what: String },
    /// The request needs more than a bound allows (a rebuild's range holding more than its
    /// memory budget): asking again will not help; nothing was changed.
    #[error("{what}")]
    TooLarge { what: String },
}

impl StoreError {
    pub fn unavailable(what: impl Into<String>) -> Self {
        StoreError::Unavailable {
            what: what.into(),
            cause: None,
        }
    }

    pub fn corrupt(what: impl Into<String>) -> Self {
        StoreError::Corrupt {
            what: what.into(),
            cause: None,
        }
    }

    pub fn poisoned(what: impl Into<String>, cause: Option<Cause>) -> Self {
        StoreError::Poisoned {
            what: what.into(),
            cause,
        }
    }

    pub fn internal(what: impl Into<String>) -> Self {
        StoreError::Internal { what: what.into() }
    }

    /// The same failure, caused by `cause`.
    pub fn because(self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        let cause: Option<Cause> = Some(Arc::new(cause));
        match self {
            StoreError::Unavailable { what, .. } => StoreError::Unavailable { what, cause },
            StoreError::Corrupt { what, .. } => StoreError::Corrupt { what, cause },
            StoreError::Poisoned { what, .. } => StoreError::Poisoned { what, cause },
            StoreError::Timeout { what } => StoreError::Timeout { what },
            StoreError::Internal { what } => StoreError::Internal { what },
            StoreError::Unsupported { what } => StoreError::Unsupported { what },
            StoreError::Claimed { what } => StoreError::Claimed { what },
            StoreError::TooLarge { what } => StoreError::TooLarge { what },
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Unavailable { .. } | StoreError::Poisoned { .. } => {
                ErrorCode::BackendUnavailable
            }
            StoreError::Corrupt { .. } => ErrorCode::CorruptData,
            StoreError::Timeout { .. } => ErrorCode::QueryTimeout,
            StoreError::Internal { .. } => ErrorCode::Internal,
            StoreError::Unsupported { .. } => ErrorCode::NotFound,
            StoreError::Claimed { .. } => ErrorCode::IdempotencyKeyReused,
            StoreError::TooLarge { .. } => ErrorCode::TooManyPoints,
        }
    }

    /// The message followed by each cause, `: `-joined, on one line: what an HTTP answer or
    /// a log line shows. A cause whose text the line holds already (some errors show their
    /// source in their own message) is not repeated.
    pub fn detail(&self) -> String {
        with_causes(self.to_string(), std::error::Error::source(self))
    }

    /// An `Unavailable` with `note` after all it says, its causes included (what its caller
    /// knows of the failure that the backend's own message cannot); anything else as it is.
    pub fn noted(self, note: &str) -> StoreError {
        match self {
            StoreError::Unavailable { what, cause } => {
                let source = cause
                    .as_deref()
                    .map(|c| c as &(dyn std::error::Error + 'static));
                StoreError::unavailable(format!("{}{note}", with_causes(what, source)))
            }
            other => other,
        }
    }
}

/// `out` followed by each cause in the chain from `cause`, `: `-joined, but one whose text
/// `out` holds already (some errors show their source in their own message).
fn with_causes(mut out: String, mut cause: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// What a backend offers. Time-based retention is the backend's: it applies an increment to
/// every tier whose retention still covers it (subtotals only in breakdown tiers) and stops
/// showing buckets a tier no longer keeps.
pub trait Store: Send + Sync {
    /// Every namespace with its schema, by name.
    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError>;

    /// How many namespaces exist (what `[limits] max_namespaces` is held to).
    fn namespace_count(&self) -> Result<usize, StoreError> {
        Ok(self.namespaces()?.len())
    }

    /// The schema of one namespace, `None` if it does not exist.
    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError>;

    /// Creates or replaces a namespace's schema. A removed tier loses its data; a new tier
    /// starts empty.
    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError>;

    /// Applies a batch, durably per the backend's policy, all or nothing.
    fn apply(&self, batch: &Batch) -> Result<(), StoreError>;

    /// A conditional write (SPEC §3 `incr?window=…&max=…`): reads `window` (one key's
    /// totals), asks `decide` what to do with those buckets, and applies `batch` — with the
    /// decision's idempotency record — only if it says so; when it does not, only the record
    /// (if any) is stored, so a retry replays the refusal. Read, decision and apply are one
    /// atomic step with respect to every other conditional write of that key: two of them
    /// never decide on the same count. Answers whether `batch` was applied.
    fn apply_if(
        &self,
        batch: &Batch,
        window: &KeyRead<'_>,
        decide: &mut dyn FnMut(&Buckets) -> Result<Decision, StoreError>,
    ) -> Result<bool, StoreError>;

    /// Reads many keys at once; answers in the order asked.
    fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError>;

    /// A page of a namespace's keys in byte order.
    fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError>;

    /// Calls `visit` once per key with a non-zero sum over the scan's range.
    fn scan(&self, scan: &Scan<'_>, visit: &mut dyn FnMut(&Key, i64)) -> Result<(), StoreError>;

    /// The `limit` keys with the largest sums of a [`Scan`], and the sum over all of them.
    /// By default a whole scan, selected; a store that keeps sums ready overrides it.
    fn top(&self, scan: &Scan<'_>, limit: usize) -> Result<TopKeys, StoreError> {
        let mut keys = Vec::new();
        self.scan(scan, &mut |k, n| {
            if n != 0 {
                keys.push((k.clone(), n));
            }
        })?;
        Ok(TopKeys::select(keys, limit))
    }

    /// The answer remembered under an idempotency key, if it has not expired.
    fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError>;

    /// Replaces what namespace `ns` holds in `[from, to)` (whole hours, closed) with what
    /// `batch`'s increments (all inside the range) count, atomically for readers: a read sees
    /// the old counts or the new, never a mix. A write to the range meanwhile is replaced if
    /// it came before the rebuild read its key, else kept on top, the same in every tier.
    /// Answers how many counters the range held before. Backends without it refuse.
    fn rebuild(
        &self,
        ns: &Namespace,
        from: i64,
        to: i64,
        batch: &Batch,
    ) -> Result<u64, StoreError> {
        let _ = (ns, from, to, batch);
        Err(StoreError::Unsupported {
            what: "this backend cannot rebuild a range (the embedded engine can)".into(),
        })
    }

    /// Whether the backend can take writes (an engine whose log failed cannot).
    fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// The refusal a write would get now for the state of the backend itself (a log that
    /// failed; a Redis that may evict keys), cheaply: what a dry run answers beside its
    /// checks of the batch, since it applies nothing.
    fn writable(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Backend figures for `/metrics`, as Prometheus gauges or counters.
    fn gauges(&self) -> Vec<Gauge> {
        Vec::new()
    }

    /// Does now the housekeeping the backend otherwise does on its own schedule (the
    /// embedded engine: flush closed periods into the archive, then compact it). A backend
    /// with none answers a zero report.
    fn maintain(&self) -> Result<Maintenance, StoreError> {
        Ok(Maintenance::default())
    }
}

/// What a conditional write does, decided from the buckets it read ([`Store::apply_if`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Apply the batch (else apply nothing of it).
    pub apply: bool,
    /// The answer to remember under the request's idempotency key, either way.
    pub idempotency: Option<IdemRecord>,
}

/// [`Store::apply_if`] for a backend whose writes to one key are serialised by `lock`: the
/// read, the decision and the apply happen under it. Backends call this with a lock chosen
/// by the key (stripes, so unrelated keys rarely wait on each other).
pub fn apply_if_locked(
    store: &dyn Store,
    lock: &std::sync::Mutex<()>,
    batch: &Batch,
    window: &KeyRead<'_>,
    decide: &mut dyn FnMut(&Buckets) -> Result<Decision, StoreError>,
) -> Result<bool, StoreError> {
    let _held = lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    decide_and_apply(store, batch, window, decide, &mut |b| store.apply(b))
}

/// The body of a conditional write, for a caller that holds the key's lock: reads the
/// window, decides, and applies through `apply` the batch (with the decision's idempotency
/// answer) or, when refused, the answer alone. A backend whose lock can be lost while held
/// (a lease) passes an `apply` that refuses once it is.
pub fn decide_and_apply(
    store: &dyn Store,
    batch: &Batch,
    window: &KeyRead<'_>,
    decide: &mut dyn FnMut(&Buckets) -> Result<Decision, StoreError>,
    apply: &mut dyn FnMut(&Batch) -> Result<(), StoreError>,
) -> Result<bool, StoreError> {
    let data = store
        .read(std::slice::from_ref(window))?
        .pop()
        .ok_or_else(|| StoreError::internal("a read returned no answer"))?;
    let decision = decide(&data.totals)?;
    if decision.apply {
        let mut batch = batch.clone();
        batch.idempotency = decision.idempotency;
        apply(&batch)?;
    } else if let Some(record) = decision.idempotency {
        // Nothing counted; the refusal alone is remembered.
        apply(&Batch {
            create: Vec::new(),
            increments: Vec::new(),
            idempotency: Some(record),
        })?;
    }
    Ok(decision.apply)
}

/// The stripe of `locks` a key's conditional writes take.
pub fn stripe<'l>(
    locks: &'l [std::sync::Mutex<()>],
    ns: &Namespace,
    key: &Key,
) -> &'l std::sync::Mutex<()> {
    // FNV-1a: stable and cheap; the stripes only spread contention.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ns.as_str().bytes().chain([0]).chain(key.as_str().bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    &locks[(h % locks.len().max(1) as u64) as usize]
}

/// What one round of housekeeping did (`POST /v1/admin/compact`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Maintenance {
    /// Archive segments written by the flush.
    pub flushed_segments: u64,
    /// Data points they hold.
    pub flushed_points: u64,
    /// Log files removed behind the flush.
    pub log_files_removed: u64,
    /// Segments merged into others, and segments the merges wrote.
    pub merged: u64,
    pub written: u64,
    /// Segments dropped past retention.
    pub dropped: u64,
}

/// One figure a backend reports for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    /// The full metric name, `tally_` prefixed.
    pub name: &'static str,
    pub help: &'static str,
    /// `"gauge"` or `"counter"`.
    pub kind: &'static str,
    pub value: f64,
}

/// A source of "now" in unix seconds, so tests can move time.
pub trait Clock: Send + Sync {
    fn now(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}

/// A clock that stands still until moved.
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicI64);

impl ManualClock {
    pub fn new(now: i64) -> Self {
        ManualClock(std::sync::atomic::AtomicI64::new(now))
    }

    pub fn set(&self, now: i64) {
        self.0.store(now, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> i64 {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that shows its source in its own message, as the Redis client's do.
    #[derive(Debug)]
    struct Echo(Option<Box<Echo>>);

    impl std::fmt::Display for Echo {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Moved: 13705 127.0.0.1:7603")
        }
    }

    impl std::error::Error for Echo {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.0.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn a_detail_says_a_repeated_cause_once() {
        let e = StoreError::unavailable("redis at x").because(Echo(Some(Box::new(Echo(None)))));
        assert_eq!(
            e.detail(),
            "backend unavailable: redis at x: Moved: 13705 127.0.0.1:7603"
        );
        // A note goes after the causes, the kind said once.
        assert_eq!(
            e.noted("; see there").detail(),
            "backend unavailable: redis at x: Moved: 13705 127.0.0.1:7603; see there"
        );
        let other = StoreError::Timeout {
            what: "late".into(),
        }
        .noted("; see there");
        assert_eq!(other.detail(), "late");
    }
}

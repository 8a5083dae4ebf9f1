//! The embedded engine: opens a data directory, replays its log into memory, then serves
//! the `Store` trait — every batch logged first (group commit), applied to memory second.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLockReadGuard};

use crate::fair::FairRwLock;
use std::time::{Duration as StdDuration, Instant};

use tally_core::model::{Key, Namespace, Schema};
use tally_core::store::{
    Batch, Buckets, Clock, Decision, FsyncPolicy, Gauge, IdemRecord, KeyData, KeyList, KeyRead,
    Maintenance, Scan, Store, StoreError, SystemClock, TopKeys,
};

use crate::archive::{Archive, FlushPolicy};
use crate::io::Faults;
use crate::io::{Fs, OsFs};
use crate::manifest::{self, Manifest, ManifestError};
use crate::recovery::{self, Recovery};
use crate::segment::SegmentError;
use crate::state::Core;
use crate::wal::WalError;
use crate::wal::payload::{self, BatchView};
use crate::wal::writer::{Start, WalStats, Writer};

/// How to open an engine.
#[derive(Clone)]
pub struct Config {
    pub dir: PathBuf,
    pub fsync: FsyncPolicy,
    /// A log file is closed and a new one started past this size.
    pub max_wal_file_bytes: u64,
    /// Memtable shards (each a lock over its keys' counters): by default four per core, at
    /// least 8 and at most 256 (see [`default_shards`]).
    pub shards: usize,
    pub clock: Arc<dyn Clock>,
    /// Fault injection for tests; `None` in production.
    pub faults: Option<Arc<Faults>>,
    /// How long to wait for the data directory's lock before giving up. A lock is an
    /// `flock`, which a process that is exiting — or a child forked by another thread, until
    /// it execs — can hold for a moment after its owner closed it.
    pub lock_wait: StdDuration,
    /// How counters are cut into periods, and when a closed period is flushed.
    pub flush: FlushPolicy,
    /// The file system archive publication goes through (tests crash it).
    pub fs: Arc<dyn Fs>,
    /// Start even when log records are missing (a deleted or lost log file, a gap in the
    /// numbering): the missing range is logged as an error and lost for good. Without it
    /// (the default) such a log stops recovery with an error naming the range.
    pub accept_data_loss: bool,
    /// Idempotency answers remembered at once (each for 24 h, in memory and once in an
    /// answers file): a batch with a new key past it is refused, nothing logged.
    pub max_idempotency_answers: usize,
    /// Idempotency answers one scope may hold (a stored key's part before its first `:`:
    /// one token's keys, as a server stores them), so that one client cannot take every
    /// answer the bound allows and refuse everyone else's keys for a day; `None`: no bound
    /// but `max_idempotency_answers`.
    pub max_idempotency_answers_per_scope: Option<usize>,
    /// How far in the future the events it is given may be dated (`[limits]
    /// max_future_secs`): a schema change's additions count every event from that long after
    /// it (`Schema::replacing`).
    pub max_future_secs: i64,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .field("max_wal_file_bytes", &self.max_wal_file_bytes)
            .field("shards", &self.shards)
            .field("flush", &self.flush)
            .field("accept_data_loss", &self.accept_data_loss)
            .field("max_idempotency_answers", &self.max_idempotency_answers)
            .field(
                "max_idempotency_answers_per_scope",
                &self.max_idempotency_answers_per_scope,
            )
            .field("max_future_secs", &self.max_future_secs)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Defaults: fsync `always`, 64 MiB log files, [`default_shards`], the system clock.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Config {
            dir: dir.into(),
            fsync: FsyncPolicy::Always,
            max_wal_file_bytes: 64 << 20,
            shards: default_shards(),
            clock: Arc::new(SystemClock),
            faults: None,
            lock_wait: StdDuration::from_millis(500),
            flush: FlushPolicy::default(),
            fs: Arc::new(OsFs),
            accept_data_loss: false,
            max_idempotency_answers: 1_000_000,
            max_idempotency_answers_per_scope: None,
            max_future_secs: tally_core::ingest::Limits::default().max_future_secs,
        }
    }
}

/// Memtable shards by default: four per core the process may run on, from 8 to 256. A
/// batch takes each of its shards' locks in turn, so more shards than writers can use cost
/// a lock and a smaller, colder set of maps each: on 2 cores, 8 shards applied ~5-10%
/// more than 64 with one writer and with two (`tally-bench engine`, docs/benchmarks.md).
pub fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    cores.saturating_mul(4).clamp(8, 256)
}

/// Why a data directory could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The cause is the `source`, printed after the path in an error chain (`{:#}`).
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is in use by another tally process", path.display())]
    Locked { path: PathBuf },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error("archiving what was left after accepting data loss")]
    AfterDataLoss { source: StoreError },
    #[error("flush periods must be positive multiples of an hour and the grace 0 or more: {0:?}")]
    BadFlushPolicy(FlushPolicy),
}

pub(crate) fn io_at(path: &Path) -> impl Fn(std::io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Counters for `/metrics` and benchmarks.
#[derive(Debug, Clone, Copy)]
pub struct EngineStats {
    pub live_counters: usize,
    pub counter_bytes: usize,
    /// What the catalog's tables take (keys, subtotal series, names).
    pub catalog_bytes: crate::catalog::CatalogBytes,
    pub keys: usize,
    pub series: usize,
    pub wal: WalStats,
}

/// The embedded engine.
pub struct Engine {
    pub(crate) core: Core,
    pub(crate) wal: Writer,
    /// Batches hold it shared from log append to memory apply; a schema change, and the
    /// moments a flush fixes its log position, hold it exclusively, so memory sees batches
    /// and schema changes in log order.
    pub(crate) gate: FairRwLock<()>,
    pub(crate) clock: Arc<dyn Clock>,
    recovery: Recovery,
    pub(crate) dir: PathBuf,
    pub(crate) wal_dir: PathBuf,
    pub(crate) segments_dir: PathBuf,
    pub(crate) fs: Arc<dyn Fs>,
    /// One flush (or compaction, or install) at a time. Holds what decides when the catalog
    /// next forgets what memory no longer holds.
    pub(crate) flush_lock: Mutex<crate::flush::ForgetDebt>,
    /// Manifest numbers and segment ids no publish has used yet.
    pub(crate) fresh: Fresh,
    max_idempotency_answers: usize,
    max_idempotency_answers_per_scope: Option<usize>,
    max_future_secs: i64,
    /// Compaction merges that failed, by their segments, with when (engine clock, seconds):
    /// passed over until `compaction::MERGE_RETRY_SECS` later.
    pub(crate) failed_merges: Mutex<Vec<(Vec<u64>, i64)>>,
    /// One rebuild at a time: its read of what a range holds and its install are one step.
    pub(crate) rebuild_lock: Mutex<()>,
    /// Conditional writes (`apply_if`) of one key serialise on its stripe.
    conditional: Vec<Mutex<()>>,
    /// Flushes and compactions that failed since open (`/metrics`): a flush failing for good
    /// (out of descriptors, a full disk) lets memory and the log grow, though writes go on.
    pub(crate) failed_flushes: std::sync::atomic::AtomicU64,
    pub(crate) failed_compactions: std::sync::atomic::AtomicU64,
    /// The id of the segment [`Engine::scrub_next`] verified last (0: none yet).
    scrubbed: std::sync::atomic::AtomicU64,
    _lock: File,
}

/// The next manifest number and segment id no publish has used. A publish that failed may
/// have made its manifest current all the same (its error came after `CURRENT` was renamed,
/// from the directory's sync), while the engine goes on from the manifest before it: so what
/// a publish used is never used again, and a later publish never overwrites the files a
/// current manifest may name.
#[derive(Debug, Default)]
pub(crate) struct Fresh {
    manifest: AtomicU64,
    segment: AtomicU64,
}

impl Fresh {
    /// The number of the manifest to publish after `old`.
    pub(crate) fn number_after(&self, old: &Manifest) -> u64 {
        (old.number + 1).max(self.manifest.load(Ordering::SeqCst))
    }

    /// The first segment id to use after `old`.
    pub(crate) fn segment_after(&self, old: &Manifest) -> u64 {
        old.next_segment_id
            .max(1)
            .max(self.segment.load(Ordering::SeqCst))
    }

    /// Marks `m`'s number and segment ids as used: called before it is published.
    pub(crate) fn use_up(&self, m: &Manifest) {
        self.manifest.fetch_max(m.number + 1, Ordering::SeqCst);
        self.segment.fetch_max(m.next_segment_id, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Creates `dir` if it is missing; a file in its place is named as such (`create_dir_all`
/// on a file says only "File exists").
fn make_dir(dir: &Path) -> Result<(), OpenError> {
    if dir.exists() && !dir.is_dir() {
        return Err(OpenError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    std::fs::create_dir_all(dir).map_err(io_at(dir))
}

impl Engine {
    /// Refuses, before anything is logged, a batch that replay could not apply — an
    /// increment with a timestamp outside `0..MAX_TS`, or naming a namespace that neither exists
    /// nor is created by the batch (the API checks both long before; a `Batch` made by hand
    /// is checked here): whatever is logged is replayed, and such a record would stop
    /// recovery. Also a batch with a new idempotency key once `max_idempotency_answers` are
    /// remembered.
    fn check_before_logging(&self, view: &BatchView<'_>) -> Result<(), StoreError> {
        if let Some(inc) = view
            .incs
            .iter()
            .find(|inc| !(0..tally_core::model::MAX_TS).contains(&inc.ts))
        {
            return Err(StoreError::internal(format!(
                "timestamp {} of key {} is out of range (0 to {} s)",
                inc.ts,
                view.str(inc.key),
                tally_core::model::MAX_TS - 1
            )));
        }
        if let Some(r) = &view.idempotency {
            let idem = self
                .core
                .idem
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if idem.len() >= self.max_idempotency_answers && !idem.contains(&r.key) {
                return Err(StoreError::unavailable(format!(
                    "{} idempotency answers are remembered, the most [limits] \
                     max_idempotency_keys allows; each is kept 24 h: retry later, or send \
                     without an Idempotency-Key",
                    idem.len()
                )));
            }
            let scope = crate::answers::scope_of(r.key.as_bytes());
            if let Some(max) = self.max_idempotency_answers_per_scope
                && idem.scope_len(scope) >= max
                && !idem.contains(&r.key)
            {
                return Err(StoreError::unavailable(format!(
                    "this token's {} idempotency answers are the most [limits] \
                     max_idempotency_keys_per_token allows; each is kept 24 h: retry later, \
                     or send without an Idempotency-Key",
                    idem.scope_len(scope)
                )));
            }
        }
        // Each namespace string of the batch's table once (a batch may create tens of
        // thousands, one per event), compared by index: no string compare per event.
        let mut known = vec![false; view.strings.len()];
        for &(ns, _) in &view.creates {
            known[ns as usize] = true;
        }
        for inc in &view.incs {
            if known[inc.ns as usize] {
                continue;
            }
            let name = view.str(inc.ns);
            if self.core.read_cat().ns_id(name).is_none() {
                return Err(StoreError::internal(format!(
                    "namespace {name} is unknown and the batch does not create it"
                )));
            }
            known[inc.ns as usize] = true;
        }
        Ok(())
    }

    /// Opens (creating if needed) a data directory and recovers it from its log.
    pub fn open(config: Config) -> Result<Engine, OpenError> {
        let started = Instant::now();
        let dir = config.dir.clone();
        if let Some(marker) = crate::backup::unfinished(&dir) {
            return Err(io_at(&dir)(crate::backup::unfinished_error(&marker)));
        }
        make_dir(&dir)?;
        let lock_path = dir.join("LOCK");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_at(&lock_path))?;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if started.elapsed() < config.lock_wait => {
                    std::thread::sleep(StdDuration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => return Err(OpenError::Locked { path: dir }),
                Err(TryLockError::Error(e)) => return Err(io_at(&lock_path)(e)),
            }
        }
        if !config.flush.is_valid() {
            return Err(OpenError::BadFlushPolicy(config.flush));
        }
        let wal_dir = dir.join("wal");
        make_dir(&wal_dir)?;
        let segments_dir = dir.join("segments");
        make_dir(&segments_dir)?;
        let published = manifest::load(&dir)?;
        if let Some(m) = &published {
            no_archive_missing(&segments_dir, m)?;
        }
        let (archive, wal_start, lost_segments) = match published.clone() {
            Some(m) => {
                let wal_start = m.wal_start;
                let (archive, lost) =
                    Archive::open_accepting(&segments_dir, m, config.accept_data_loss)?;
                (archive, wal_start, lost)
            }
            None => (Archive::default(), 1, Vec::new()),
        };
        // Leftovers as the published manifest says: a manifest leaving out lost segments is
        // published only once recovery has succeeded.
        let current = published.unwrap_or_default();
        recovery::remove_leftovers(&dir, &segments_dir, &current).map_err(io_at(&dir))?;
        let written = manifest::load_answers(&segments_dir, &archive.manifest)?;
        let core = Core::new(config.shards, config.flush, Archive::default());
        core.restore_checkpoint(&archive.manifest, &written)
            .map_err(|e| OpenError::Manifest(ManifestError::Checkpoint { source: e }))?;
        let (file, next_seq, mut recovery) = recovery::replay(
            &wal_dir,
            &core,
            config.clock.now(),
            config.faults.clone(),
            wal_start,
            &archive,
            config.accept_data_loss,
        )?;
        if !lost_segments.is_empty() {
            drop_lost_segments(
                config.fs.as_ref(),
                &dir,
                &segments_dir,
                &archive,
                &lost_segments,
            )?;
        }
        recovery.segments = archive.segments.len();
        recovery.lost_segments = lost_segments;
        *core.archive.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(archive);
        let wal = Writer::start(Start {
            dir: wal_dir.clone(),
            file,
            next_seq,
            policy: config.fsync,
            max_file_bytes: config.max_wal_file_bytes,
            faults: config.faults.clone(),
        })
        .map_err(io_at(&wal_dir))?;
        recovery.elapsed = started.elapsed();
        tracing::info!(
            records = recovery.records,
            events = recovery.events,
            elapsed_ms = recovery.elapsed.as_millis() as u64,
            "recovered the write-ahead log"
        );
        if !recovery.lost.is_empty() {
            // New records are numbered after the highest one seen, the log's or the archive's.
            core.last_seq.fetch_max(next_seq - 1, Ordering::SeqCst);
        }
        let engine = Engine {
            core,
            wal,
            gate: FairRwLock::default(),
            clock: config.clock,
            recovery,
            dir,
            wal_dir,
            segments_dir,
            fs: config.fs,
            flush_lock: Mutex::new(Default::default()),
            fresh: Fresh::default(),
            max_idempotency_answers: config.max_idempotency_answers,
            max_idempotency_answers_per_scope: config.max_idempotency_answers_per_scope,
            max_future_secs: config.max_future_secs,
            failed_merges: Mutex::new(Vec::new()),
            rebuild_lock: Mutex::new(()),
            conditional: (0..CONDITIONAL_STRIPES).map(|_| Mutex::new(())).collect(),
            failed_flushes: Default::default(),
            failed_compactions: Default::default(),
            scrubbed: Default::default(),
            _lock: lock,
        };
        if !engine.recovery.lost.is_empty() {
            // Close the gap for good: archive everything in memory and restart the log past
            // it, so the next start needs no flag and finds no gap.
            engine
                .flush_all_after_loss()
                .map_err(|source| OpenError::AfterDataLoss { source })?;
        }
        Ok(engine)
    }

    /// What recovery found when this engine opened.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Frees counters past their tier's retention; returns how many.
    pub fn sweep(&self) -> usize {
        self.core.sweep(self.clock.now())
    }

    /// Makes everything logged so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.wal.sync()
    }

    /// Verifies one archive segment — every block and frame against its checksum, the index
    /// against the records (what `tally check` does) — the one after the segment verified by
    /// the previous call, in id order, wrapping around: called now and then (see
    /// [`ScrubPace`]), it reads the whole archive in turn, so that damage no query has met
    /// yet still shows in `/healthz`. Answers the file verified (`None` for an empty
    /// archive); damage is an error remembered for `/healthz` as a query meeting it is.
    pub fn scrub_next(&self) -> Result<Option<PathBuf>, StoreError> {
        use std::sync::atomic::Ordering;
        let archive = Arc::clone(&self.core.archive());
        let last = self.scrubbed.load(Ordering::Relaxed);
        let next = archive
            .segments
            .iter()
            .filter(|(e, _)| e.id > last)
            .min_by_key(|(e, _)| e.id)
            .or_else(|| archive.segments.iter().min_by_key(|(e, _)| e.id));
        let Some((entry, seg)) = next else {
            return Ok(None);
        };
        self.scrubbed.store(entry.id, Ordering::Relaxed);
        seg.verify().map_err(|e| self.core.archive_error(e))?;
        Ok(Some(seg.path().to_path_buf()))
    }

    /// Waits for the log's records in flight, syncs it and records its end; later writes
    /// fail.
    pub fn close(&self) {
        self.wal.close();
    }

    /// Whether [`Engine::close`] has run.
    pub fn is_closed(&self) -> bool {
        self.wal.is_closed()
    }

    /// The first I/O failure, once the log writer is poisoned.
    pub fn poisoned(&self) -> Option<StoreError> {
        self.wal.poisoned()
    }

    pub fn stats(&self) -> EngineStats {
        let (keys, series, catalog_bytes) = {
            let cat = self.core.read_cat();
            (cat.live_keys(), cat.live_series(), cat.bytes())
        };
        EngineStats {
            live_counters: self.core.mem.live(),
            counter_bytes: self.core.mem.bytes(),
            catalog_bytes,
            keys,
            series,
            wal: self.wal.stats(),
        }
    }

    fn gate_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }
}

/// Lock stripes for conditional writes: two keys share one by chance, rarely.
const CONDITIONAL_STRIPES: usize = 1024;

impl Store for Engine {
    /// Under the key's stripe lock, held through the apply (its log append and fsync), so
    /// the next conditional write of the key decides on a count that includes this one.
    /// Plain writes do not take it: they count whatever the decision was.
    fn apply_if(
        &self,
        batch: &Batch,
        window: &KeyRead<'_>,
        decide: &mut dyn FnMut(&Buckets) -> Result<Decision, StoreError>,
    ) -> Result<bool, StoreError> {
        let lock = tally_core::store::stripe(&self.conditional, window.ns, window.key);
        tally_core::store::apply_if_locked(self, lock, batch, window, decide)
    }

    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        let cat = self.core.read_cat();
        Ok(cat
            .by_name
            .iter()
            .map(|(n, id)| (n.clone(), cat.ns[*id as usize].schema.clone()))
            .collect())
    }

    fn namespace_count(&self) -> Result<usize, StoreError> {
        Ok(self.core.read_cat().by_name.len())
    }

    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
        let cat = self.core.read_cat();
        Ok(cat
            .ns_id(ns.as_str())
            .map(|id| cat.ns[id as usize].schema.clone()))
    }

    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        let retention_changed = {
            let _gate = self.gate.write();
            let before = self.schema(ns)?;
            let schema =
                &schema
                    .clone()
                    .replacing(before.as_ref(), self.clock.now(), self.max_future_secs);
            let mut bytes = Vec::new();
            payload::encode_schema(ns, schema, &mut bytes);
            let seq = self.wal.append(bytes)?;
            self.core.apply_schema(ns, schema, seq)?;
            before.is_some_and(|b| {
                b.tiers().iter().any(|old| {
                    schema.tiers().iter().any(|new| {
                        new.resolution == old.resolution && new.retention != old.retention
                    })
                })
            })
        };
        if retention_changed {
            // What a retention keeps depends on when it changed, which the log does not
            // say: replayed, a retention that shrank and grew back would show again counts
            // the sweep had freed, and one that grew would show counts that had expired
            // before. So memory, swept by the new retention, becomes the archive now, and
            // the log is truncated past the change: a restart starts from this state. (If
            // the flush fails, replay checks increments against the retention at the end of
            // the log: see `recovery::final_schemas`.)
            self.sweep();
            if let Err(e) = self.flush_everything() {
                tracing::warn!(
                    error = %e.detail(),
                    %ns,
                    "could not archive memory after a retention change; until the periods \
                     open now are flushed, a restart may show counts the change had hidden"
                );
            }
        }
        Ok(())
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let _gate = self.gate_shared();
        let mut view = BatchView::from_batch(batch);
        self.check_before_logging(&view)?;
        let now = self.clock.now();
        view.at = Some(now);
        let mut bytes = Vec::with_capacity(64 + 16 * batch.increments.len());
        view.encode(&mut bytes);
        let seq = self.wal.append(bytes)?;
        self.core.apply_view(&view, now, seq, None)
    }

    fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError> {
        let now = self.clock.now();
        reads.iter().map(|r| self.core.read(r, now)).collect()
    }

    fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        self.core.keys(list)
    }

    fn scan(&self, scan: &Scan<'_>, visit: &mut dyn FnMut(&Key, i64)) -> Result<(), StoreError> {
        self.core.scan(scan, self.clock.now(), visit)
    }

    fn top(&self, scan: &Scan<'_>, limit: usize) -> Result<TopKeys, StoreError> {
        self.core.top(scan, limit, self.clock.now())
    }

    fn writable(&self) -> Result<(), StoreError> {
        self.wal.poisoned().map_or(Ok(()), Err)
    }

    fn health(&self) -> Result<(), StoreError> {
        if let Some(e) = self.wal.poisoned() {
            return Err(e);
        }
        match &*self
            .core
            .damaged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn gauges(&self) -> Vec<Gauge> {
        let s = self.stats();
        let archive = Arc::clone(&self.core.archive());
        vec![
            Gauge {
                name: "tally_live_counters",
                help: "Counters held in memory.",
                kind: "gauge",
                value: s.live_counters as f64,
            },
            Gauge {
                name: "tally_archive_segments",
                help: "Archive segments published.",
                kind: "gauge",
                value: archive.segments.len() as f64,
            },
            Gauge {
                name: "tally_archive_bytes",
                help: "Bytes of the published archive segments.",
                kind: "gauge",
                value: archive
                    .segments
                    .iter()
                    .map(|(_, s)| s.stats().bytes)
                    .sum::<u64>() as f64,
            },
            Gauge {
                name: "tally_keys",
                help: "Keys known to the engine.",
                kind: "gauge",
                value: s.keys as f64,
            },
            Gauge {
                name: "tally_counter_bytes",
                help: "Bytes the counters in memory take (their maps at capacity).",
                kind: "gauge",
                value: s.counter_bytes as f64,
            },
            Gauge {
                name: "tally_catalog_bytes",
                help: "Bytes the catalog takes: keys, subtotal series and names (tables at capacity).",
                kind: "gauge",
                value: s.catalog_bytes.total() as f64,
            },
            Gauge {
                name: "tally_dictionary_cache_bytes",
                help: "Bytes of decoded segment dictionaries held in memory, process-wide (at most [limits] dictionary_cache_bytes).",
                kind: "gauge",
                value: crate::segment::dicts::held_bytes() as f64,
            },
            Gauge {
                name: "tally_dictionary_cache_misses_total",
                help: "Segment dictionaries read from their files again because the cache had dropped them.",
                kind: "counter",
                value: crate::segment::dicts::misses() as f64,
            },
            Gauge {
                name: "tally_log_bytes_written_total",
                help: "Bytes appended to the write-ahead log since start.",
                kind: "counter",
                value: s.wal.bytes_written as f64,
            },
            Gauge {
                name: "tally_log_records_total",
                help: "Records appended to the write-ahead log since start.",
                kind: "counter",
                value: s.wal.records as f64,
            },
            Gauge {
                name: "tally_flush_failures_total",
                help: "Flushes of closed periods into the archive that failed since start (each is retried; while they fail, memory and the log grow).",
                kind: "counter",
                value: self
                    .failed_flushes
                    .load(std::sync::atomic::Ordering::Relaxed) as f64,
            },
            Gauge {
                name: "tally_compaction_failures_total",
                help: "Compactions of the archive that failed since start (each is retried).",
                kind: "counter",
                value: self
                    .failed_compactions
                    .load(std::sync::atomic::Ordering::Relaxed) as f64,
            },
            Gauge {
                name: "tally_log_full_disk_refusals_total",
                help: "Log rounds (group commits) refused because the disk was full, nothing of them logged or applied (each request 503; writes resume once space is freed), and log rotations refused for it (the records go on into the current file).",
                kind: "counter",
                value: s.wal.full_disk_refusals as f64,
            },
            Gauge {
                name: "tally_log_fsyncs_total",
                help: "fsyncs of the write-ahead log since start.",
                kind: "counter",
                value: s.wal.fsyncs as f64,
            },
            Gauge {
                name: "tally_log_fsync_seconds_total",
                help: "Time spent in fsync of the write-ahead log.",
                kind: "counter",
                value: s.wal.fsync_nanos as f64 / 1e9,
            },
        ]
    }

    fn maintain(&self) -> Result<Maintenance, StoreError> {
        let f = self.flush()?;
        let c = self.compact()?;
        Ok(Maintenance {
            flushed_segments: f.segments as u64,
            flushed_points: f.data_points,
            log_files_removed: f.wal_files_removed as u64,
            merged: c.merged as u64,
            written: c.written as u64,
            dropped: c.dropped as u64,
        })
    }

    fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        let now = self.clock.now();
        let idem = self
            .core
            .idem
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(idem.get(key).filter(|r| r.expires > now))
    }

    fn rebuild(
        &self,
        ns: &Namespace,
        from: i64,
        to: i64,
        batch: &Batch,
    ) -> Result<u64, StoreError> {
        let schema = self
            .schema(ns)?
            .ok_or_else(|| StoreError::internal(format!("namespace {ns} is unknown")))?;
        let now = self.clock.now();
        let mut bulk = crate::bulk::Bulk::default();
        bulk.set_budget(REBUILD_BUDGET);
        for inc in &batch.increments {
            bulk.add(&schema, inc, now);
        }
        self.rebuild_bulk(ns, from, to, bulk)
    }
}

/// Memory a rebuild through the API may hold (the new counts, bounded by the request's
/// size, and what the range held, subtracted): past it the rebuild stops, changing nothing.
const REBUILD_BUDGET: usize = 1 << 30;

/// When `tally serve`'s minutely housekeeping verifies the next archive segment
/// ([`Engine::scrub_next`]): at most at every tick, and after a segment that took `t`, not
/// before `t × 100 / percent` has passed since the tick it ran at, so that the scrub takes at
/// most `percent` % of one core (and of the disk's reads) on average whatever the segments'
/// sizes (a month's segment of a busy namespace takes seconds). Never with `percent` 0.
#[derive(Debug, Clone, Copy)]
pub struct ScrubPace {
    percent: u8,
    next: Option<Instant>,
}

impl ScrubPace {
    /// Due at the first tick (at or after `start`), unless `percent` is 0.
    pub fn new(percent: u8, start: Instant) -> Self {
        ScrubPace {
            percent: percent.min(100),
            next: (percent > 0).then_some(start),
        }
    }

    /// Whether the housekeeping of the tick scheduled at `tick` scrubs.
    pub fn due(&self, tick: Instant) -> bool {
        self.next.is_some_and(|next| tick >= next)
    }

    /// The scrub of the tick scheduled at `tick` took `took`. (Measured from the tick, not
    /// from when it ended: a small segment is due at the very next tick.)
    pub fn ran(&mut self, tick: Instant, took: StdDuration) {
        if self.percent == 0 {
            self.next = None;
            return;
        }
        // (At most a day: a scrub that took absurdly long still comes round again.)
        let rest = (took.saturating_mul(100) / u32::from(self.percent))
            .min(StdDuration::from_secs(86_400));
        self.next = Some(tick.checked_add(rest).unwrap_or(tick));
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.wal.close();
    }
}

/// Refuses an archive whose every file is gone — a manifest listing segments beside a
/// `segments/` holding none (a restore that left it out, a volume not mounted) — whatever
/// `accept_data_loss` says: that is no damage to accept but an archive to put back, and
/// accepting it would publish an empty one.
fn no_archive_missing(segments_dir: &Path, m: &Manifest) -> Result<(), OpenError> {
    if m.segments.is_empty() {
        return Ok(());
    }
    let any = std::fs::read_dir(segments_dir)
        .map_err(io_at(segments_dir))?
        .filter_map(Result::ok)
        .any(|e| e.path().extension().is_some_and(|x| x == "tls"));
    if any {
        return Ok(());
    }
    Err(OpenError::Segment(SegmentError::Corrupt {
        path: segments_dir.to_path_buf(),
        why: format!(
            "the manifest lists {} segment(s) and this directory holds none: the archive's \
             files are missing (a restore without them, a volume not mounted?); put them back \
             (--accept-data-loss does not start without a whole archive)",
            m.segments.len()
        ),
    }))
}

/// Accepting data loss: renames each lost segment's file, where there is one, to
/// `….tls.damaged`, which nothing removes or reads, then publishes `archive`'s manifest,
/// which no longer lists them, so that the next start needs no flag. Called once recovery
/// has succeeded, so a failed one changes nothing. Set aside first: a crash in between
/// leaves the old manifest listing files now missing, which the flag leaves out again,
/// and every damaged file kept.
fn drop_lost_segments(
    fs: &dyn Fs,
    dir: &Path,
    segments_dir: &Path,
    archive: &Archive,
    lost: &[crate::archive::LostSegment],
) -> Result<(), OpenError> {
    for l in lost {
        tracing::error!(
            segment = l.entry.id,
            resolution = l.entry.resolution,
            period_start = l.entry.period_start,
            period_end = l.entry.period_end,
            why = %l.why,
            "accepting data loss: a segment the manifest lists is missing or damaged (or a \
             delta of its lost base's period); its counts are lost, and the archive goes on \
             without it"
        );
        let path = crate::archive::segment_path(segments_dir, l.entry.id);
        let mut aside = path.clone().into_os_string();
        aside.push(".damaged");
        match fs.rename(&path, Path::new(&aside)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&path)(e)),
        }
    }
    fs.sync_dir(segments_dir).map_err(io_at(segments_dir))?;
    manifest::publish(fs, dir, &archive.manifest).map_err(io_at(dir))
}

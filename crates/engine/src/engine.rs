//! The embedded engine: opens a data directory, replays its log into memory, then serves
//! the `Store` trait — every batch logged first (group commit), applied to memory second.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration as StdDuration, Instant};

use tally_core::model::Key;
use tally_core::model::{MAX_TS, Namespace, Retention, Schema};
use tally_core::store::{
    Batch, Clock, Gauge, IdemRecord, KeyData, KeyList, KeyRead, Scan, Store, StoreError,
    SubtotalBuckets, SystemClock, Want,
};

use crate::catalog::{Catalog, KeyId, NsId, SUBTOTAL, SeriesId, TierPlan};
use crate::io::{Faults, LogFile};
use crate::memtable::{Memtable, Shard, split_key};
use crate::wal::payload::{self, BatchView, Payload};
use crate::wal::reader::{self, TornTail};
use crate::wal::writer::{self, Start, WalStats, Writer};
use crate::wal::{Corruption, FILE_HEADER_LEN, FileProblem, WalError, file_name, list_files};
use tally_core::store::FsyncPolicy;

/// How to open an engine.
#[derive(Clone)]
pub struct Config {
    pub dir: PathBuf,
    pub fsync: FsyncPolicy,
    /// A log file is closed and a new one started past this size.
    pub max_wal_file_bytes: u64,
    pub shards: usize,
    pub clock: Arc<dyn Clock>,
    /// Fault injection for tests; `None` in production.
    pub faults: Option<Arc<Faults>>,
    /// How long to wait for the data directory's lock before giving up. A lock is an
    /// `flock`, which a process that is exiting — or a child forked by another thread, until
    /// it execs — can hold for a moment after its owner closed it.
    pub lock_wait: StdDuration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .field("max_wal_file_bytes", &self.max_wal_file_bytes)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Defaults: fsync `always`, 64 MiB log files, 64 shards, the system clock.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Config {
            dir: dir.into(),
            fsync: FsyncPolicy::Always,
            max_wal_file_bytes: 64 << 20,
            shards: 64,
            clock: Arc::new(SystemClock),
            faults: None,
            lock_wait: StdDuration::from_millis(500),
        }
    }
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
    #[error(transparent)]
    Wal(#[from] WalError),
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What recovery found.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    pub files: usize,
    pub records: u64,
    pub events: u64,
    pub log_bytes: u64,
    pub torn: Option<TornTail>,
    pub elapsed: StdDuration,
}

/// Counters for `/metrics` and benchmarks.
#[derive(Debug, Clone, Copy)]
pub struct EngineStats {
    pub live_counters: usize,
    pub counter_bytes: usize,
    pub keys: usize,
    pub series: usize,
    pub wal: WalStats,
}

/// Memory state: the catalog and the counters. Live writes and replay share it.
#[derive(Debug)]
struct Core {
    catalog: RwLock<Catalog>,
    mem: Memtable,
    /// Remembered answers by idempotency key (restored by replay, freed by sweep).
    idem: Mutex<HashMap<String, IdemRecord>>,
}

/// One increment resolved to ids.
struct Resolved {
    shard: usize,
    ns: NsId,
    ts: i64,
    n: i64,
    total: SeriesId,
    subs: (usize, usize),
}

impl Core {
    fn read_cat(&self) -> RwLockReadGuard<'_, Catalog> {
        // Catalog updates are completed before they are published; a panic cannot leave it
        // half-changed in a way a reader could misuse.
        self.catalog.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_cat(&self) -> RwLockWriteGuard<'_, Catalog> {
        self.catalog.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a batch to memory. The one path for live writes and for replay.
    fn apply_view(&self, view: &BatchView<'_>, now: i64) -> Result<(), StoreError> {
        let mut resolved = Vec::with_capacity(view.incs.len());
        let mut sids: Vec<SeriesId> = Vec::with_capacity(view.subs.len());
        let mut plans: Vec<(NsId, Arc<[TierPlan]>)> = Vec::new();
        {
            let mut cat = self.write_cat();
            for (ns, schema) in &view.creates {
                let name = Namespace::new(view.str(*ns))
                    .map_err(|e| StoreError::corrupt("a logged namespace name").because(e))?;
                if cat.ns_id(name.as_str()).is_none() {
                    cat.put_schema(&name, schema)?;
                }
            }
            let mut ns_cache: Vec<Option<NsId>> = vec![None; view.strings.len()];
            let mut key_cache: Vec<Option<(NsId, KeyId)>> = vec![None; view.strings.len()];
            let mut str_cache: Vec<Option<u32>> = vec![None; view.strings.len()];
            for inc in &view.incs {
                if !(0..MAX_TS).contains(&inc.ts) {
                    return Err(StoreError::corrupt(format!(
                        "timestamp {} out of range",
                        inc.ts
                    )));
                }
                let ns = match ns_cache.get(inc.ns as usize).copied().flatten() {
                    Some(id) => id,
                    None => {
                        let name = view.str(inc.ns);
                        let id = cat.ns_id(name).ok_or_else(|| {
                            StoreError::internal(format!("namespace {name} is unknown"))
                        })?;
                        if let Some(slot) = ns_cache.get_mut(inc.ns as usize) {
                            *slot = Some(id);
                        }
                        if !plans.iter().any(|(n, _)| *n == id) {
                            plans.push((id, cat.ns[id as usize].tiers.clone()));
                        }
                        id
                    }
                };
                // Zipf traffic repeats keys and values within a batch: resolve each string of
                // the record's table once.
                let key = match key_cache.get(inc.key as usize).copied().flatten() {
                    Some((n, k)) if n == ns => k,
                    _ => {
                        let k = cat.key_or_insert(ns, view.str(inc.key))?;
                        if let Some(slot) = key_cache.get_mut(inc.key as usize) {
                            *slot = Some((ns, k));
                        }
                        k
                    }
                };
                let start = sids.len();
                for &(d, v) in view.subs_of(inc) {
                    let mut id = |i: u32, cat: &mut Catalog| -> Result<u32, StoreError> {
                        match str_cache.get(i as usize).copied().flatten() {
                            Some(id) => Ok(id),
                            None => {
                                let id = cat.intern_str(view.str(i))?;
                                if let Some(slot) = str_cache.get_mut(i as usize) {
                                    *slot = Some(id);
                                }
                                Ok(id)
                            }
                        }
                    };
                    let (d, v) = (id(d, &mut cat)?, id(v, &mut cat)?);
                    sids.push(cat.sub_ids_or_insert(key, d, v)?);
                }
                let total = cat.keys[key as usize].total;
                let shard = self.mem.shard_of(key);
                resolved.push(Resolved {
                    shard,
                    ns,
                    ts: inc.ts,
                    n: inc.n,
                    total,
                    subs: (start, sids.len()),
                });
            }
        }
        if let Some(rec) = &view.idempotency {
            self.idem
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(rec.key.clone(), rec.clone());
        }
        // One critical section per shard: a key's whole share of the batch appears at once.
        resolved.sort_by_key(|r| r.shard);
        for group in resolved.chunk_by(|a, b| a.shard == b.shard) {
            let mut shard = self.mem.lock(group[0].shard);
            for r in group {
                let Some((_, tiers)) = plans.iter().find(|(n, _)| *n == r.ns) else {
                    continue;
                };
                for t in tiers.iter() {
                    let b = r.ts.div_euclid(t.res) * t.res;
                    if !t.retention.keeps_bucket(b, t.resolution, now) {
                        continue;
                    }
                    let idx = (b / t.res) as u32;
                    shard.add(t.slot, r.total, idx, r.n);
                    if t.breakdown {
                        for &sid in &sids[r.subs.0..r.subs.1] {
                            shard.add(t.slot, sid, idx, r.n);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets a schema; a removed tier's counters, and the subtotals of a tier that stops
    /// keeping breakdowns, are dropped.
    fn apply_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        let mut cat = self.write_cat();
        let (id, removed, unbroken) = cat.put_schema(ns, schema)?;
        if removed.is_empty() && unbroken.is_empty() {
            return Ok(());
        }
        for s in 0..self.mem.shards() {
            let mut shard = self.mem.lock(s);
            for &slot in removed.iter().chain(&unbroken) {
                let whole = removed.contains(&slot);
                shard.map(slot).retain(|k, _| {
                    let info = cat
                        .series_info
                        .get(split_key(*k).0 as usize)
                        .copied()
                        .unwrap_or(0);
                    let mine = info & !SUBTOTAL == id;
                    !(mine && (whole || info & SUBTOTAL != 0))
                });
            }
        }
        Ok(())
    }

    fn read(&self, r: &KeyRead<'_>, now: i64) -> KeyData {
        let cat = self.read_cat();
        let Some(ns) = cat.ns_id(r.ns.as_str()) else {
            return KeyData::default();
        };
        let Some(tier) = cat.ns[ns as usize].tier(r.resolution) else {
            return KeyData::default();
        };
        let Some(key) = cat.key_id(ns, r.key.as_str()) else {
            return KeyData::default();
        };
        let entry = &cat.keys[key as usize];
        let subs: Vec<(u32, u32, SeriesId)> = if !tier.breakdown {
            Vec::new()
        } else {
            match r.want {
                Want::Totals => Vec::new(),
                Want::Value { dim, value } => match (cat.str_id(dim), cat.str_id(value)) {
                    (Some(d), Some(v)) => cat
                        .sub_id(key, d, v)
                        .map(|s| (d, v, s))
                        .into_iter()
                        .collect(),
                    _ => Vec::new(),
                },
                Want::Dim { dim } => match cat.str_id(dim) {
                    Some(d) => entry.subs.iter().filter(|s| s.0 == d).copied().collect(),
                    None => Vec::new(),
                },
                Want::All => entry.subs.clone(),
            }
        };
        let shard = self.mem.lock(self.mem.shard_of(key));
        let window = Window::new(&tier, r.from, r.to, now);
        let totals = window.collect(&shard, entry.total);
        let subtotals = subs
            .into_iter()
            .map(|(d, v, sid)| SubtotalBuckets {
                dim: cat.str(d).to_owned(),
                value: cat.str(v).to_owned(),
                buckets: window.collect(&shard, sid),
            })
            .filter(|s| !s.buckets.is_empty())
            .collect();
        KeyData { totals, subtotals }
    }

    fn sweep(&self, now: i64) -> usize {
        self.idem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, r| r.expires > now);
        let cat = self.read_cat();
        // Per namespace and slot: the first bucket index still kept (None: keep all).
        let cutoffs: Vec<Vec<Option<Option<u32>>>> = cat
            .ns
            .iter()
            .map(|ns| {
                (0..cat.slots.len())
                    .map(|slot| {
                        ns.tiers
                            .iter()
                            .find(|t| t.slot == slot)
                            .map(|t| match t.retention {
                                Retention::Forever => None,
                                Retention::For(d) => {
                                    let first = (now - d.secs_i64() - t.res).div_euclid(t.res) + 1;
                                    Some(first.clamp(0, i64::from(u32::MAX)) as u32)
                                }
                            })
                    })
                    .collect()
            })
            .collect();
        let mut removed = 0;
        for s in 0..self.mem.shards() {
            let mut shard = self.mem.lock(s);
            for (slot, map) in shard.maps.iter_mut().enumerate() {
                let before = map.len();
                map.retain(|k, _| {
                    let (sid, idx) = split_key(*k);
                    let ns = cat
                        .series_info
                        .get(sid as usize)
                        .map_or(u32::MAX, |i| i & !SUBTOTAL);
                    match cutoffs.get(ns as usize).and_then(|c| c.get(slot)) {
                        Some(Some(Some(first))) => idx >= *first,
                        Some(Some(None)) => true,
                        _ => false,
                    }
                });
                removed += before - map.len();
            }
        }
        removed
    }
}

/// The buckets of one tier that a read covers.
struct Window {
    slot: usize,
    res: i64,
    lo: u32,
    hi: u32,
    tier: TierPlan,
    now: i64,
}

impl Window {
    fn new(tier: &TierPlan, from: i64, to: i64, now: i64) -> Self {
        let idx = |t: i64| {
            (t.max(0) + tier.res - 1)
                .div_euclid(tier.res)
                .min(i64::from(u32::MAX)) as u32
        };
        Window {
            slot: tier.slot,
            res: tier.res,
            lo: idx(from),
            hi: idx(to),
            tier: *tier,
            now,
        }
    }

    fn collect(&self, shard: &Shard, sid: SeriesId) -> Vec<(i64, i64)> {
        let keep = |idx: u32| {
            let b = i64::from(idx) * self.res;
            self.tier
                .retention
                .keeps_bucket(b, self.tier.resolution, self.now)
        };
        let (min, max) = shard.extent(self.slot);
        let (lo, hi) = (self.lo.max(min), self.hi.min(max));
        if lo >= hi {
            return Vec::new();
        }
        let Some(map) = shard.maps.get(self.slot) else {
            return Vec::new();
        };
        if ((hi - lo) as usize) <= map.len() {
            (lo..hi)
                .filter(|&i| keep(i))
                .filter_map(|i| match shard.get(self.slot, sid, i) {
                    0 => None,
                    n => Some((i64::from(i) * self.res, n)),
                })
                .collect()
        } else {
            // A range longer than the map: scanning the map is cheaper than probing.
            let mut out: Vec<(i64, i64)> = map
                .iter()
                .filter_map(|(k, n)| {
                    let (s, i) = split_key(*k);
                    (s == sid && i >= lo && i < hi && keep(i))
                        .then_some((i64::from(i) * self.res, *n))
                })
                .collect();
            out.sort_unstable();
            out
        }
    }
}

/// The embedded engine.
pub struct Engine {
    core: Core,
    wal: Writer,
    /// Batches hold it shared from log append to memory apply; a schema change holds it
    /// exclusively, so memory sees batches and schema changes in log order.
    gate: RwLock<()>,
    clock: Arc<dyn Clock>,
    recovery: Recovery,
    dir: PathBuf,
    _lock: File,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Opens (creating if needed) a data directory and recovers it from its log.
    pub fn open(config: Config) -> Result<Engine, OpenError> {
        let started = Instant::now();
        let dir = config.dir.clone();
        std::fs::create_dir_all(&dir).map_err(io_at(&dir))?;
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
        let wal_dir = dir.join("wal");
        std::fs::create_dir_all(&wal_dir).map_err(io_at(&wal_dir))?;
        let files = list_files(&wal_dir).map_err(io_at(&wal_dir))?;
        let core = Core {
            catalog: RwLock::new(Catalog::default()),
            mem: Memtable::new(config.shards),
            idem: Mutex::new(HashMap::new()),
        };
        let now = config.clock.now();
        let mut recovery = Recovery {
            files: files.len(),
            ..Recovery::default()
        };
        let mut next_seq = files.first().map_or(1, |(s, _)| *s);
        let mut last_end = None;
        for (i, (named_seq, path)) in files.iter().enumerate() {
            if *named_seq != next_seq {
                return Err(WalError::BadFile {
                    file: path.clone(),
                    why: FileProblem::NamedSequence {
                        named: *named_seq,
                        expected: next_seq,
                    },
                }
                .into());
            }
            let bytes = std::fs::read(path).map_err(io_at(path))?;
            recovery.log_bytes += bytes.len() as u64;
            let is_last = i + 1 == files.len();
            let mut visit = |_seq: u64, bytes: &[u8]| -> Result<(), Corruption> {
                match payload::decode(bytes).map_err(Corruption::Payload)? {
                    Payload::Batch(view) => {
                        recovery.events += view.incs.len() as u64;
                        core.apply_view(&view, now).map_err(Corruption::Apply)
                    }
                    Payload::Schema(ns, schema) => {
                        core.apply_schema(&ns, &schema).map_err(Corruption::Apply)
                    }
                }
            };
            let end = reader::scan(path, &bytes, next_seq, is_last, &mut visit)?;
            recovery.records += end.records;
            next_seq = end.next_seq;
            if let Some(torn) = &end.torn {
                tracing::warn!(
                    file = %torn.file.display(),
                    offset = torn.offset,
                    dropped_bytes = torn.dropped_bytes,
                    "dropped a torn write at the end of the log"
                );
                recovery.torn = Some(torn.clone());
            }
            last_end = Some((path.clone(), end.valid_len));
        }
        let file = match last_end {
            Some((path, len)) if len >= FILE_HEADER_LEN as u64 => {
                LogFile::reopen(&path, len, config.faults.clone()).map_err(io_at(&path))?
            }
            Some((path, _)) => {
                // The last file never got a whole header: nothing in it was acknowledged.
                std::fs::remove_file(&path).map_err(io_at(&path))?;
                let path = file_name(&wal_dir, next_seq);
                LogFile::create(
                    &path,
                    &crate::wal::file_header(next_seq),
                    config.faults.clone(),
                )
                .map_err(io_at(&path))?
            }
            None => {
                writer::create_first(&wal_dir, config.faults.clone()).map_err(io_at(&wal_dir))?
            }
        };
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
        Ok(Engine {
            core,
            wal,
            gate: RwLock::new(()),
            clock: config.clock,
            recovery,
            dir,
            _lock: lock,
        })
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

    /// Syncs the log and stops its thread; later writes fail.
    pub fn close(&self) {
        self.wal.close();
    }

    /// The first I/O failure, once the log writer is poisoned.
    pub fn poisoned(&self) -> Option<StoreError> {
        self.wal.poisoned()
    }

    pub fn stats(&self) -> EngineStats {
        let (keys, series) = {
            let cat = self.core.read_cat();
            (cat.keys.len(), cat.series_info.len())
        };
        EngineStats {
            live_counters: self.core.mem.live(),
            counter_bytes: self.core.mem.bytes(),
            keys,
            series,
            wal: self.wal.stats(),
        }
    }

    fn gate_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for Engine {
    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        let cat = self.core.read_cat();
        Ok(cat
            .by_name
            .iter()
            .map(|(n, id)| (n.clone(), cat.ns[*id as usize].schema.clone()))
            .collect())
    }

    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
        let cat = self.core.read_cat();
        Ok(cat
            .ns_id(ns.as_str())
            .map(|id| cat.ns[id as usize].schema.clone()))
    }

    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let mut bytes = Vec::new();
        payload::encode_schema(ns, schema, &mut bytes);
        self.wal.append(bytes)?;
        self.core.apply_schema(ns, schema)
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let _gate = self.gate_shared();
        let view = BatchView::from_batch(batch);
        let mut bytes = Vec::with_capacity(64 + 16 * batch.increments.len());
        view.encode(&mut bytes);
        self.wal.append(bytes)?;
        self.core.apply_view(&view, self.clock.now())
    }

    fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError> {
        let now = self.clock.now();
        Ok(reads.iter().map(|r| self.core.read(r, now)).collect())
    }

    fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        use std::ops::Bound;
        let cat = self.core.read_cat();
        let Some(id) = cat.ns_id(list.ns.as_str()) else {
            return Ok(Vec::new());
        };
        let prefix = list.prefix;
        let start: Bound<&str> = match list.after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        cat.ns[id as usize]
            .ordered
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(list.limit)
            .map(|(k, _)| Key::new(k).map_err(|e| StoreError::corrupt("a stored key").because(e)))
            .collect()
    }

    fn scan(&self, scan: &Scan<'_>, visit: &mut dyn FnMut(&Key, i64)) -> Result<(), StoreError> {
        let now = self.clock.now();
        let cat = self.core.read_cat();
        let Some(ns) = cat.ns_id(scan.ns.as_str()) else {
            return Ok(());
        };
        let Some(tier) = cat.ns[ns as usize].tier(scan.resolution) else {
            return Ok(());
        };
        let value = match scan.value {
            None => None,
            Some(_) if !tier.breakdown => return Ok(()),
            Some((d, v)) => match (cat.str_id(d), cat.str_id(v)) {
                (Some(d), Some(v)) => Some((d, v)),
                _ => return Ok(()),
            },
        };
        let window = Window::new(&tier, scan.from, scan.to, now);
        for (name, &key) in &cat.ns[ns as usize].ordered {
            let sid = match value {
                None => cat.keys[key as usize].total,
                Some((d, v)) => match cat.sub_id(key, d, v) {
                    Some(s) => s,
                    None => continue,
                },
            };
            let sum: i64 = {
                let shard = self.core.mem.lock(self.core.mem.shard_of(key));
                window.collect(&shard, sid).iter().map(|(_, n)| n).sum()
            };
            if sum != 0 {
                let key =
                    Key::new(name).map_err(|e| StoreError::corrupt("a stored key").because(e))?;
                visit(&key, sum);
            }
        }
        Ok(())
    }

    fn health(&self) -> Result<(), StoreError> {
        match self.wal.poisoned() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn gauges(&self) -> Vec<Gauge> {
        let s = self.stats();
        vec![
            Gauge {
                name: "tally_live_counters",
                help: "Counters held in memory.",
                kind: "gauge",
                value: s.live_counters as f64,
            },
            Gauge {
                name: "tally_keys",
                help: "Keys known to the engine.",
                kind: "gauge",
                value: s.keys as f64,
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

    fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        let now = self.clock.now();
        let idem = self
            .core
            .idem
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(idem.get(key).filter(|r| r.expires > now).cloned())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.wal.close();
    }
}

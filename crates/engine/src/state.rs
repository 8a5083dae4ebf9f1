//! The engine's memory state: the catalog, the counters and the remembered answers. The
//! one apply path that live writes and replay share, reads of one key, and the retention
//! sweep.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tally_core::model::{Namespace, Retention, Schema};
use tally_core::store::StoreError;

/// Timestamps a logged increment may carry: every one the API ever took (`MAX_TS` was
/// 2^32 until 2026-11-27).
const LOGGED_TS_END: i64 = 1 << 32;

/// How many counter updates ahead of the one being made the adder asks for its slot.
const PREFETCH_AHEAD: usize = 8;

use crate::answers::Answers;
use crate::archive::{Archive, FlushPolicy, Held, store_error};
use crate::catalog::{Catalog, KeyId, NsId, PairId, SeriesId, StrId, TierPlan, total_of};
use crate::fair::FairRwLock;
use crate::memtable::{Lane, Memtable, Shard, split_key};
use crate::names::Names;
use crate::segment::SegmentError;
use crate::wal::payload::BatchView;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // These small locks guard plain data that every update leaves whole.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Schemas over log positions: what the checkpoint of a manifest needs (every namespace's
/// schema as of the record before its `wal_start`).
#[derive(Debug, Default)]
pub(crate) struct SchemaLog {
    /// Schemas as of the last published checkpoint.
    pub(crate) base: BTreeMap<Namespace, Schema>,
    /// Changes since, with the log record that made each.
    pub(crate) changes: Vec<(u64, Namespace, Schema)>,
}

impl SchemaLog {
    /// Every namespace's schema as of log record `seq` (inclusive).
    pub(crate) fn as_of(&self, seq: u64) -> BTreeMap<Namespace, Schema> {
        let mut out = self.base.clone();
        for (s, ns, schema) in &self.changes {
            if *s <= seq {
                out.insert(ns.clone(), schema.clone());
            }
        }
        out
    }

    /// Moves the base to `seq`, dropping the changes it now holds.
    pub(crate) fn advance(&mut self, seq: u64) {
        self.base = self.as_of(seq);
        self.changes.retain(|(s, _, _)| *s > seq);
    }
}

/// Per memtable slot, the `[lo, hi)` bucket index ranges a flush freezes.
pub(crate) type Freezing = crate::memtable::FreezeRanges;

/// A freeze in progress (see [`Core::start_freeze`]): dropped, it stops every shard the
/// freeze did not reach from noting updates (a flush that stopped early, or panicked).
pub(crate) struct FreezeGuard<'a>(&'a Core);

impl Drop for FreezeGuard<'_> {
    fn drop(&mut self) {
        for s in 0..self.0.mem.shards() {
            self.0.mem.lock(s).cancel_freeze();
        }
    }
}

/// Memory state: the catalog and the counters. Live writes and replay share it.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) catalog: FairRwLock<Catalog>,
    pub(crate) mem: Memtable,
    /// Remembered answers by idempotency key (restored by replay, freed by sweep).
    pub(crate) idem: Mutex<Answers>,
    pub(crate) flush: FlushPolicy,
    /// The published archive. Readers hold it shared while they read memory (so what they
    /// see frozen in a shard and what they see archived never overlap); a flush swaps it.
    pub(crate) archive: RwLock<Arc<Archive>>,
    /// `(memtable slot, period start)` of every period with counters in memory that are not
    /// archived, with the first log record that added to it since: the log must be kept
    /// from the smallest of them.
    pub(crate) dirty: Mutex<HashMap<(usize, i64), u64>>,
    pub(crate) schemas: Mutex<SchemaLog>,
    /// The highest log record applied to memory.
    pub(crate) last_seq: AtomicU64,
    /// The first damage a read found in the archive: `/healthz` reports it until restart.
    pub(crate) damaged: Mutex<Option<StoreError>>,
    /// While the log replays: the schema of each namespace a record from `wal_start` on
    /// changed, as the log leaves it. Replay checks increments against these retentions
    /// (see `recovery::final_schemas`); empty otherwise.
    replay_retentions: Mutex<HashMap<String, Schema>>,
    /// Whether `replay_retentions` holds any: live writes then skip its lock.
    replaying: std::sync::atomic::AtomicBool,
    /// What reads that sum over segments name subtotals by (see [`Core::names`]).
    names: Mutex<Arc<Names>>,
    /// The id in `names` of each catalog string met by such a read, `u32::MAX` for one not
    /// met yet: see [`Core::catalog_names_number`].
    catalog_names: Mutex<CatalogNames>,
}

/// Catalog string ids numbered in a [`Names`].
#[derive(Debug, Default)]
struct CatalogNames {
    /// The id of the `Names` they are numbered in.
    of: u64,
    /// [`Catalog::strings_freed`] they were taken under: string ids mean the same strings
    /// only while it holds.
    strings_freed: u64,
    ids: Vec<u32>,
}

/// A batch resolved to ids: what [`Core::add_resolved`] adds.
#[derive(Debug)]
pub(crate) struct ResolvedBatch {
    seq: u64,
    /// When its record was written, if the record says (see [`holds_bucket`]).
    at: Option<i64>,
    resolved: Vec<Resolved>,
    /// The subtotal series of every increment (each names its range).
    sids: Vec<SeriesId>,
    /// The tiers of each namespace the batch writes to.
    plans: Plans,
}

/// The tiers of each namespace a batch writes to: usually one or two, found by a scan; a
/// batch may name tens of thousands (one per event), found then through a map — a scan per
/// increment made such a batch cost the square of its size.
#[derive(Debug, Default)]
struct Plans {
    list: Vec<(NsId, Arc<[TierPlan]>)>,
    at: HashMap<NsId, usize>,
}

impl Plans {
    /// Namespaces past which look-ups go through the map.
    const SCANNED: usize = 8;

    #[inline]
    fn get(&self, ns: NsId) -> Option<&[TierPlan]> {
        let i = if self.list.len() <= Self::SCANNED {
            self.list.iter().position(|(n, _)| *n == ns)?
        } else {
            *self.at.get(&ns)?
        };
        Some(&self.list[i].1)
    }

    /// Adds the plan of `ns` made by `plan`, unless it is there.
    fn add(&mut self, ns: NsId, plan: impl FnOnce() -> Arc<[TierPlan]>) {
        if self.get(ns).is_none() {
            self.at.insert(ns, self.list.len());
            self.list.push((ns, plan()));
        }
    }
}

/// What replay adds a log record against: the archive it opened with, and the time its
/// segments hold ([`Archive::held`], worked out once).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replayed<'a> {
    pub archive: &'a Archive,
    pub held: &'a Held,
}

/// Whether memory holds an increment to bucket `b` of tier `t` at `now`: whether the tier
/// keeps the bucket, and in replay (`held`, the time the archive holds) also a bucket it no
/// longer keeps whose period the archive holds, if the tier kept it when the record was
/// written (at `at`, which records of format 1 lack, under the retention of that time,
/// `written_with`: the running engine counted with both). The running engine holds such a count:
/// [`Core::sweep`] keeps an expired counter of an archived period until a flush writes it as
/// a delta, so that a retention that grows later shows no bucket in part. Replay dropping
/// it did show one (found by a review).
fn holds_bucket(t: &TierPlan, b: i64, now: i64, at: Option<i64>, held: Option<&Held>) -> bool {
    t.retention.keeps_bucket(b, t.resolution, now)
        || held.is_some_and(|h| h.holds(t.res as u32, b))
            && at.is_some_and(|at| t.written_with.keeps_bucket(b, t.resolution, at))
}

/// Whether record `seq`'s increment to bucket `b` of tier `t` adds to a counter: memory
/// holds the bucket ([`holds_bucket`]) and, in replay, no flush after the record holds it.
/// What [`Core::add_resolved`] adds, and (with the buckets kept at `now`) what makes
/// [`Core::resolve`] make a key.
fn adds_to(
    t: &TierPlan,
    b: i64,
    now: i64,
    (seq, at): (u64, Option<i64>),
    replay: Option<Replayed<'_>>,
) -> bool {
    holds_bucket(t, b, now, at, replay.map(|r| r.held))
        && replay.is_none_or(|r| r.archive.flushed_at(t.res as u32, b) < seq)
}

/// One counter update of a batch: what [`Core::add_resolved`] works out before it locks.
#[derive(Debug, Clone, Copy)]
struct Add {
    /// Shard and slot counts are small (a shard per core, a slot per resolution): 32
    /// bytes an update rather than 40.
    shard: u32,
    slot: u32,
    lane: Lane,
    sid: SeriesId,
    idx: u32,
    n: i64,
}

/// One increment resolved to ids.
#[derive(Debug)]
struct Resolved {
    shard: usize,
    ns: NsId,
    ts: i64,
    n: i64,
    total: SeriesId,
    subs: (usize, usize),
}

impl Core {
    pub(crate) fn read_cat(&self) -> RwLockReadGuard<'_, Catalog> {
        // Catalog updates are completed before they are published; a panic cannot leave it
        // half-changed in a way a reader could misuse.
        self.catalog.read()
    }

    pub(crate) fn write_cat(&self) -> RwLockWriteGuard<'_, Catalog> {
        self.catalog.write()
    }

    pub(crate) fn new(shards: usize, flush: FlushPolicy, archive: Archive) -> Core {
        Core {
            catalog: FairRwLock::new(Catalog::default()),
            mem: Memtable::new(shards),
            idem: Mutex::new(Answers::default()),
            flush,
            archive: RwLock::new(Arc::new(archive)),
            dirty: Mutex::new(HashMap::new()),
            schemas: Mutex::new(SchemaLog::default()),
            last_seq: AtomicU64::new(0),
            damaged: Mutex::new(None),
            replay_retentions: Mutex::default(),
            replaying: Default::default(),
            names: Mutex::default(),
            catalog_names: Mutex::default(),
        }
    }

    /// The ids in `names` of catalog strings `strs` that earlier reads numbered, `None` for
    /// the others (see [`Core::catalog_names_number`]). Catalog strings keep their ids until
    /// the catalog frees them, so that memory's share of a read hashes no name it hashed
    /// before. Only looks: it is called under the catalog's lock (`strings_freed` is the
    /// catalog's).
    pub(crate) fn catalog_names_known(
        &self,
        names: &Names,
        strings_freed: u64,
        strs: &[StrId],
    ) -> Vec<Option<u32>> {
        let g = lock(&self.catalog_names);
        let valid = g.of == names.id() && g.strings_freed == strings_freed;
        strs.iter()
            .map(|&s| {
                let id = g.ids.get(s as usize).copied().filter(|&id| id != u32::MAX);
                id.filter(|_| valid)
            })
            .collect()
    }

    /// Numbers catalog strings (id and text) in `names` and remembers them, unless the
    /// catalog freed strings since the caller took their ids under its lock
    /// (`strings_freed`, as [`Core::catalog_names_known`] was given): an id may name another
    /// string by now. Returns their ids in order. Called with no lock of the catalog or the
    /// archive held: numbering may wait for a segment's dictionary being mapped.
    pub(crate) fn catalog_names_number(
        &self,
        names: &Names,
        strings_freed: u64,
        strs: &[(StrId, Arc<str>)],
    ) -> Vec<u32> {
        let found = names.intern_all(strs.iter().map(|(_, s)| &**s));
        let mut g = lock(&self.catalog_names);
        if g.strings_freed != strings_freed {
            return found;
        }
        if g.of != names.id() {
            g.of = names.id();
            g.ids.clear();
        }
        for (&(s, _), &id) in strs.iter().zip(&found) {
            if g.ids.len() <= s as usize {
                g.ids.resize(s as usize + 1, u32::MAX);
            }
            g.ids[s as usize] = id;
        }
        found
    }

    /// Forgets what reads numbered once the catalog freed strings (called under the
    /// catalog's write lock, with its new `strings_freed`).
    pub(crate) fn catalog_strings_freed(&self, strings_freed: u64) {
        let mut g = lock(&self.catalog_names);
        g.strings_freed = strings_freed;
        g.ids = Vec::new();
    }

    /// The engine's [`Names`]; a fresh one once it is full ([`Names::full`]), so that the names of dropped segments and past reads do not pile
    /// up for the life of the process.
    pub(crate) fn names(&self) -> Arc<Names> {
        let mut names = lock(&self.names);
        if names.full() {
            *names = Arc::default();
        }
        Arc::clone(&names)
    }

    /// Loads a manifest's checkpoint: the schemas as of its `wal_start` and the remembered
    /// answers, the manifest's own and `written` (read from the answers files it lists).
    /// Runs before replay.
    pub(crate) fn restore_checkpoint(
        &self,
        m: &crate::manifest::Manifest,
        written: &[tally_core::store::IdemRecord],
    ) -> Result<(), StoreError> {
        let mut cat = self.write_cat();
        for (ns, schema) in &m.schemas {
            cat.put_schema(ns, schema)?;
        }
        for (ns, res, cutoff) in &m.cutoffs {
            if let Some(id) = cat.ns_id(ns.as_str()) {
                cat.ns[id as usize].cutoffs.insert(*res, *cutoff);
            }
        }
        lock(&self.schemas).base = m.schemas.iter().cloned().collect();
        let mut idem = lock(&self.idem);
        for r in written {
            idem.insert_written(r);
        }
        // A format-1 manifest's answers: the next publish writes them to a file.
        for r in &m.idempotency {
            idem.insert(r);
        }
        self.last_seq
            .fetch_max(m.wal_start.saturating_sub(1), Ordering::SeqCst);
        Ok(())
    }

    /// A segment failure as the `Store` reports it; damage (not I/O) is remembered for
    /// `/healthz`, naming the file and block.
    pub(crate) fn archive_error(&self, e: SegmentError) -> StoreError {
        let err = store_error(e);
        if err.code() == tally_core::ErrorCode::CorruptData {
            tracing::error!(error = %err.detail(), "damaged archive segment");
            lock(&self.damaged).get_or_insert_with(|| err.clone());
        }
        err
    }

    /// The archive, held shared: see [`Core::archive`].
    pub(crate) fn archive(&self) -> RwLockReadGuard<'_, Arc<Archive>> {
        self.archive.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies log record `seq` (a batch) to memory. The one path for live writes and for
    /// replay; in replay, `archived` skips the increments of periods the archive already
    /// holds up to that record.
    pub(crate) fn apply_view(
        &self,
        view: &BatchView<'_>,
        now: i64,
        seq: u64,
        archived: Option<Replayed<'_>>,
    ) -> Result<(), StoreError> {
        let batch = self.resolve(view, seq, now, archived)?;
        self.add_resolved(batch, now, archived);
        Ok(())
    }

    pub(crate) fn set_replay_retentions(&self, last: HashMap<String, Schema>) {
        self.replaying.store(!last.is_empty(), Ordering::SeqCst);
        *lock(&self.replay_retentions) = last;
    }

    /// The tiers of namespace `id` as a batch is added with: while the log replays, with the
    /// retention each has at the end of the log (see `recovery::final_schemas`).
    fn replay_plan(&self, cat: &Catalog, id: NsId) -> Arc<[TierPlan]> {
        let entry = &cat.ns[id as usize];
        if !self.replaying.load(Ordering::SeqCst) {
            return entry.tiers.clone();
        }
        let last = lock(&self.replay_retentions);
        let Some(schema) = last.get(entry.name.as_str()) else {
            return entry.tiers.clone();
        };
        entry
            .tiers
            .iter()
            .map(|t| {
                let mut t = *t;
                if let Some(at_end) = schema.tiers().iter().find(|e| e.resolution == t.resolution) {
                    t.retention = at_end.retention;
                }
                t
            })
            .collect()
    }

    /// The first half of [`Core::apply_view`]: the batch's strings resolved to ids in the
    /// catalog (keys and series made as needed), its remembered answer kept. Replay runs it
    /// on one thread while another adds the batch before (see `recovery`).
    ///
    /// An increment that adds to no counter at `now` (`Schema::counts`: an amount of 0, or
    /// a time every tier has let go) is left out, so it makes no key: `keys` would list it
    /// only until a flush forgot it (and again after a restart), and an offline load, which
    /// holds only counts, never lists it.
    pub(crate) fn resolve(
        &self,
        view: &BatchView<'_>,
        seq: u64,
        now: i64,
        replay: Option<Replayed<'_>>,
    ) -> Result<ResolvedBatch, StoreError> {
        let mut resolved = Vec::with_capacity(view.incs.len());
        let mut sids: Vec<SeriesId> = Vec::with_capacity(view.subs.len());
        let mut plans = Plans::default();
        {
            let mut cat = self.write_cat();
            for (ns, schema) in &view.creates {
                let name = Namespace::new(view.str(*ns))
                    .map_err(|e| StoreError::corrupt("a logged namespace name").because(e))?;
                if cat.ns_id(name.as_str()).is_none() {
                    cat.put_schema(&name, schema)?;
                    lock(&self.schemas)
                        .changes
                        .push((seq, name.clone(), schema.clone()));
                }
            }
            let mut ns_cache: Vec<Option<NsId>> = vec![None; view.strings.len()];
            let mut key_cache: Vec<Option<(NsId, KeyId)>> = vec![None; view.strings.len()];
            let mut str_cache: Vec<Option<u32>> = vec![None; view.strings.len()];
            // First every increment's namespace; then the batch's keys, each (namespace,
            // string) once, looked up in a tight loop of their own (independent look-ups, so
            // the CPU overlaps their cache misses); then every increment's key (made if new)
            // and names; then (touched ahead in one pass, see `Catalog::touch_subs`) its
            // subtotal series.
            let mut nss: Vec<NsId> = Vec::with_capacity(view.incs.len());
            let mut incs = Vec::with_capacity(view.incs.len());
            let mut todo: Vec<(u32, NsId)> = Vec::new();
            for inc in &view.incs {
                // Logs written before `MAX_TS` came down from 2^32 may hold later seconds:
                // they still open (bucket indexes fit up to 2^32).
                if !(0..LOGGED_TS_END).contains(&inc.ts) {
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
                        plans.add(id, || self.replay_plan(&cat, id));
                        id
                    }
                };
                // `Schema::counts`, on the plan's retentions (in replay, those at the log's
                // end, as `add_resolved` uses), with replay's expired buckets of archived
                // periods ([`holds_bucket`]) that `add_resolved` will add to: not those a
                // flush after this record holds (a key is made only for a counter).
                let counts = inc.n != 0
                    && plans.get(ns).is_some_and(|tiers| {
                        tiers.iter().any(|t| {
                            let b = inc.ts.div_euclid(t.res) * t.res;
                            t.retention.keeps_bucket(b, t.resolution, now)
                                || adds_to(t, b, now, (seq, view.at), replay)
                        })
                    });
                if !counts {
                    continue;
                }
                incs.push(inc);
                nss.push(ns);
                if let Some(slot @ None) = key_cache.get_mut(inc.key as usize) {
                    *slot = Some((ns, KeyId::MAX));
                    todo.push((inc.key, ns));
                }
            }
            for (s, ns) in todo {
                key_cache[s as usize] = cat.key_id(ns, view.str(s)).map(|k| (ns, k));
            }
            let mut keys: Vec<KeyId> = Vec::with_capacity(incs.len());
            let mut wanted: Vec<(KeyId, PairId)> = Vec::with_capacity(view.subs.len());
            // Per value string of the record's table: the dimension string it came with last
            // and their pair (a value nearly always comes with one dimension).
            let mut pair_cache: Vec<Option<(u32, PairId)>> = vec![None; view.strings.len()];
            for (&inc, &ns) in incs.iter().zip(&nss) {
                // Zipf traffic repeats keys and values within a batch: resolve each string of
                // the record's table once.
                let key = match key_cache.get(inc.key as usize).copied().flatten() {
                    Some((n, k)) if n == ns && k != KeyId::MAX => k,
                    _ => {
                        let k = cat.key_or_insert(ns, view.str(inc.key))?;
                        if let Some(slot) = key_cache.get_mut(inc.key as usize) {
                            *slot = Some((ns, k));
                        }
                        k
                    }
                };
                keys.push(key);
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
                    let pair = match pair_cache.get(v as usize).copied().flatten() {
                        Some((dim, p)) if dim == d => p,
                        _ => {
                            let (d_id, v_id) = (id(d, &mut cat)?, id(v, &mut cat)?);
                            let p = cat.pair_or_insert(d_id, v_id)?;
                            if let Some(slot) = pair_cache.get_mut(v as usize) {
                                *slot = Some((d, p));
                            }
                            p
                        }
                    };
                    wanted.push((key, pair));
                }
                resolved.push(Resolved {
                    shard: self.mem.shard_of(key),
                    ns,
                    ts: inc.ts,
                    n: inc.n,
                    total: 0,
                    subs: (0, 0),
                });
            }
            cat.touch_subs(&wanted);
            let mut at = wanted.iter();
            for ((&inc, r), &key) in incs.iter().zip(&mut resolved).zip(&keys) {
                let start = sids.len();
                for &(k, p) in at.by_ref().take(view.subs_of(inc).len()) {
                    sids.push(cat.sub_pair_or_insert(k, p)?);
                }
                r.total = total_of(key);
                r.subs = (start, sids.len());
            }
            debug_assert!(
                at.next().is_none(),
                "every subtotal resolved to its increment"
            );
            cat.note_resolved(&keys);
        }
        if let Some(rec) = &view.idempotency {
            self.idem
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(rec);
        }
        Ok(ResolvedBatch {
            seq,
            at: view.at,
            resolved,
            sids,
            plans,
        })
    }

    /// The second half of [`Core::apply_view`]: adds a resolved batch to the counters, one
    /// critical section per shard, and notes the periods it added to.
    pub(crate) fn add_resolved(
        &self,
        batch: ResolvedBatch,
        now: i64,
        archived: Option<Replayed<'_>>,
    ) {
        let ResolvedBatch {
            seq,
            at,
            resolved,
            sids,
            plans,
        } = batch;
        // One critical section per shard: a key's whole share of the batch appears at once.
        // The increments in shard order, by a counting sort of their positions (a sort of
        // the increments themselves took ~5% of replay's adding thread).
        let order = {
            let mut next = vec![0usize; self.mem.shards() + 1];
            for r in &resolved {
                next[r.shard + 1] += 1;
            }
            for s in 1..next.len() {
                next[s] += next[s - 1];
            }
            let mut order = vec![0u32; resolved.len()];
            for (i, r) in resolved.iter().enumerate() {
                order[next[r.shard]] = i as u32;
                next[r.shard] += 1;
            }
            order
        };
        // The periods this record adds to: few per batch, so a short list.
        let mut touched: Vec<(usize, i64)> = Vec::new();
        // Every counter update of the batch, worked out before any lock is taken and in
        // shard order; the updates then run in a tight loop, where the CPU overlaps their
        // cache misses (each is a probe into a map of millions of counters) instead of
        // waiting for each in turn between the checks below.
        let mut adds: Vec<Add> = Vec::with_capacity(resolved.len() * 4);
        for r in order.iter().map(|&i| &resolved[i as usize]) {
            let Some(tiers) = plans.get(r.ns) else {
                continue;
            };
            for t in tiers.iter() {
                let q = r.ts.div_euclid(t.res);
                let b = q * t.res;
                if !adds_to(t, b, now, (seq, at), archived) {
                    continue;
                }
                let period = self.flush.period_of(t.res, b);
                if !touched.contains(&(t.slot, period)) {
                    touched.push((t.slot, period));
                }
                let idx = q as u32;
                let add = |lane, sid| Add {
                    shard: r.shard as u32,
                    slot: t.slot as u32,
                    lane,
                    sid,
                    idx,
                    n: r.n,
                };
                adds.push(add(Lane::Total, r.total));
                if t.breakdown {
                    for &sid in &sids[r.subs.0..r.subs.1] {
                        adds.push(add(Lane::Sub, sid));
                    }
                }
            }
        }
        for group in adds.chunk_by(|a, b| a.shard == b.shard) {
            let mut shard = self.mem.lock(group[0].shard as usize);
            for b in group.iter().take(PREFETCH_AHEAD) {
                shard.prefetch(b.slot as usize, b.lane, b.sid, b.idx);
            }
            for (i, a) in group.iter().enumerate() {
                if let Some(b) = group.get(i + PREFETCH_AHEAD) {
                    shard.prefetch(b.slot as usize, b.lane, b.sid, b.idx);
                }
                shard.add(a.slot as usize, a.lane, a.sid, a.idx, a.n);
            }
        }
        if !touched.is_empty() {
            let mut dirty = lock(&self.dirty);
            for k in touched {
                let first = dirty.entry(k).or_insert(seq);
                *first = (*first).min(seq);
            }
        }
        self.last_seq.fetch_max(seq, Ordering::SeqCst);
    }

    /// Has every shard note the updates to `ranges`, which a flush is about to freeze
    /// (`Shard::expect_freeze`), until it freezes the shard; the guard stops the notes of
    /// shards it did not reach. Called under the write gate, so that the updates noted are
    /// exactly those after the flush's log position.
    pub(crate) fn start_freeze(&self, ranges: Freezing) -> FreezeGuard<'_> {
        let ranges = Arc::new(ranges);
        for s in 0..self.mem.shards() {
            self.mem.lock(s).expect_freeze(Arc::clone(&ranges));
        }
        FreezeGuard(self)
    }

    /// Sets a schema; a removed tier's counters, and the subtotals of a tier that stops
    /// keeping breakdowns, are dropped.
    pub(crate) fn apply_schema(
        &self,
        ns: &Namespace,
        schema: &Schema,
        seq: u64,
    ) -> Result<(), StoreError> {
        let mut cat = self.write_cat();
        let (id, removed, unbroken) = cat.put_schema(ns, schema)?;
        lock(&self.schemas)
            .changes
            .push((seq, ns.clone(), schema.clone()));
        self.last_seq.fetch_max(seq, Ordering::SeqCst);
        if removed.is_empty() && unbroken.is_empty() {
            return Ok(());
        }
        // The archive keeps what the dropped tier held; reads hide segments flushed before
        // this record for it, so a tier added back starts empty.
        for &slot in removed.iter().chain(&unbroken) {
            if let Some(r) = cat.slots.get(slot).map(|r| r.secs() as u32) {
                let c = cat.ns[id as usize].cutoffs.entry(r).or_default();
                if removed.contains(&slot) {
                    c.all = c.all.max(seq);
                }
                c.subtotals = c.subtotals.max(seq);
            }
        }
        for s in 0..self.mem.shards() {
            let mut shard = self.mem.lock(s);
            for &slot in removed.iter().chain(&unbroken) {
                let whole = removed.contains(&slot);
                let dropped = |k: &u64| {
                    let sid = split_key(*k).0;
                    let mine = cat.ns_of_series(sid) == Some(id);
                    mine && (whole || cat.is_subtotal(sid))
                };
                shard.retain_live(slot, |k| !dropped(&k));
                // Copied only if it holds something to drop (a flush may share it).
                if let Some(f) = shard.frozen.get_mut(slot)
                    && f.iter().any(|(k, _)| dropped(k))
                {
                    std::sync::Arc::make_mut(f).retain(|(k, _)| !dropped(k));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn sweep(&self, now: i64) -> usize {
        self.idem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sweep(now);
        let cat = self.read_cat();
        // An expired counter of a period the archive holds (or a flush is writing) stays
        // until a flush writes it as a delta: the archive drops a period's buckets only with
        // its whole segment, and memory must not drop part of a bucket the archive keeps, or
        // a retention that grows later would show that bucket's archived part alone.
        // (Taken from the archive as it is now, not under its lock held through the walk,
        // which would hold up a flush's publication and the reads queued behind it. A
        // flush published during the walk could see a late, expired delta to its period
        // freed: the minute's housekeeping flushes after its sweep, and the other flushes
        // — a retention change's, an install's, `POST /v1/admin/compact` — would have to
        // meet a late delta expiring in the same moment.)
        let held = self.archive().held();
        let archived = |res: u32, b: i64| held.holds(res, b);
        let slot_res: Vec<u32> = cat.slots.iter().map(|d| d.secs() as u32).collect();
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
            let frozen: Vec<(u32, u32)> = (0..slot_res.len())
                .map(|slot| shard.frozen_bounds(slot))
                .collect();
            for i in 0..shard.maps.len() {
                let slot = Shard::slot_of_map(i);
                let res = slot_res.get(slot).copied().unwrap_or(0);
                let (lo, hi) = frozen.get(slot).copied().unwrap_or((1, 0));
                let frozen = |idx: u32| lo <= idx && idx <= hi;
                removed += shard.retain_map(i, |k, _| {
                    let (sid, idx) = split_key(k);
                    let ns = cat.ns_of_series(sid).unwrap_or(u32::MAX);
                    let expired = match cutoffs.get(ns as usize).and_then(|c| c.get(slot)) {
                        Some(Some(Some(first))) => idx < *first,
                        Some(Some(None)) => false,
                        _ => return false,
                    };
                    !expired || frozen(idx) || archived(res, i64::from(idx) * i64::from(res))
                });
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_strings_are_named_once_per_names_and_again_for_a_new_one() {
        let core = Core::new(1, FlushPolicy::default(), Archive::default());
        let mut cat = Catalog::default();
        let ids: Vec<StrId> = ["referrer", "a.com", "b.com"]
            .iter()
            .map(|s| cat.intern_str(s).unwrap())
            .collect();
        let text = |i: usize| (ids[i], Arc::<str>::from(cat.str(ids[i])));
        let names = Names::default();
        names.intern_all(["x"].into_iter());
        assert_eq!(core.catalog_names_known(&names, 0, &ids), vec![None; 3]);
        assert_eq!(
            core.catalog_names_number(&names, 0, &[text(2), text(0)]),
            vec![1, 2]
        );
        assert_eq!(
            core.catalog_names_known(&names, 0, &[ids[0], ids[1], ids[2]]),
            vec![Some(2), None, Some(1)]
        );
        assert_eq!(core.catalog_names_number(&names, 0, &[text(1)]), vec![3]);
        assert_eq!(names.len(), 4, "each string numbered once");
        let fresh = Names::default();
        assert_eq!(
            core.catalog_names_known(&fresh, 0, &ids),
            vec![None; 3],
            "a new Names is not answered from the old one"
        );
        assert_eq!(
            core.catalog_names_number(&fresh, 0, &[text(1), text(0)]),
            vec![0, 1]
        );
        assert_eq!(
            core.catalog_names_known(&names, 0, &[ids[1]]),
            vec![None],
            "nor the old from the new"
        );
        fresh.with(|name| assert_eq!((name(0), name(1)), ("a.com", "referrer")));
        // Once the catalog frees strings, nothing numbered before is answered, and a read
        // that took its ids before the freeing remembers nothing (an id may name another
        // string by now).
        core.catalog_strings_freed(1);
        assert_eq!(core.catalog_names_known(&fresh, 1, &ids), vec![None; 3]);
        assert_eq!(core.catalog_names_number(&fresh, 0, &[text(2)]), vec![2]);
        assert_eq!(core.catalog_names_known(&fresh, 1, &ids), vec![None; 3]);
        assert_eq!(core.catalog_names_number(&fresh, 1, &[text(2)]), vec![2]);
        assert_eq!(
            core.catalog_names_known(&fresh, 1, &ids),
            vec![None, None, Some(2)]
        );
    }
}

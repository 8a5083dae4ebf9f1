//! The engine's memory state: the catalog, the counters and the remembered answers. The
//! one apply path that live writes and replay share, reads of one key, and the retention
//! sweep.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tally_core::model::{MAX_TS, Namespace, Retention, Schema};
use tally_core::store::{IdemRecord, KeyData, KeyRead, StoreError, SubtotalBuckets, Want};

use crate::catalog::{Catalog, KeyId, NsId, SUBTOTAL, SeriesId, TierPlan};
use crate::memtable::{Memtable, Shard, split_key};
use crate::wal::payload::BatchView;

/// Memory state: the catalog and the counters. Live writes and replay share it.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) catalog: RwLock<Catalog>,
    pub(crate) mem: Memtable,
    /// Remembered answers by idempotency key (restored by replay, freed by sweep).
    pub(crate) idem: Mutex<HashMap<String, IdemRecord>>,
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
    pub(crate) fn read_cat(&self) -> RwLockReadGuard<'_, Catalog> {
        // Catalog updates are completed before they are published; a panic cannot leave it
        // half-changed in a way a reader could misuse.
        self.catalog.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write_cat(&self) -> RwLockWriteGuard<'_, Catalog> {
        self.catalog.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a batch to memory. The one path for live writes and for replay.
    pub(crate) fn apply_view(&self, view: &BatchView<'_>, now: i64) -> Result<(), StoreError> {
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
    pub(crate) fn apply_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
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

    pub(crate) fn read(&self, r: &KeyRead<'_>, now: i64) -> KeyData {
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

    pub(crate) fn sweep(&self, now: i64) -> usize {
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
pub(crate) struct Window {
    slot: usize,
    res: i64,
    lo: u32,
    hi: u32,
    tier: TierPlan,
    now: i64,
}

impl Window {
    pub(crate) fn new(tier: &TierPlan, from: i64, to: i64, now: i64) -> Self {
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

    pub(crate) fn collect(&self, shard: &Shard, sid: SeriesId) -> Vec<(i64, i64)> {
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

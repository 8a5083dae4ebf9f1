//! The catalog: namespaces with their schemas, and every string interned once — keys,
//! dimension names and values — mapped to the dense ids the counters are keyed by.
//!
//! A *series* is one counted quantity of one key: its total, or one (dimension, value)
//! subtotal. Counters live in the memtable under `(series id, bucket index)`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use foldhash::fast::FixedState;
use tally_core::model::{Duration, Namespace, Retention, Schema};
use tally_core::store::StoreError;

pub type NsId = u32;
pub type KeyId = u32;
pub type SeriesId = u32;
pub type StrId = u32;

type Map<K, V> = HashMap<K, V, FixedState>;

/// One tier of a namespace as the memtable needs it.
#[derive(Debug, Clone, Copy)]
pub struct TierPlan {
    /// Index of this resolution in the memtable's per-resolution maps.
    pub slot: usize,
    pub res: i64,
    pub resolution: Duration,
    pub retention: Retention,
    pub breakdown: bool,
}

#[derive(Debug)]
pub struct NsEntry {
    pub name: Namespace,
    pub schema: Schema,
    pub tiers: Arc<[TierPlan]>,
    pub keys: Map<Arc<str>, KeyId>,
    /// The same keys in byte order, for listing.
    pub ordered: BTreeMap<Arc<str>, KeyId>,
    /// Per tier resolution (seconds): archive segments flushed before these log records
    /// hold data of a tier since removed (or of its subtotals), which reads must not show.
    pub cutoffs: BTreeMap<u32, Cutoff>,
}

/// Log records before which the archive's data of one tier of a namespace is hidden.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cutoff {
    /// Totals and subtotals: the tier was removed at this record.
    pub all: u64,
    /// Subtotals only: the tier stopped keeping breakdowns (or was removed) here.
    pub subtotals: u64,
}

impl Cutoff {
    /// Whether a segment flushed through `flushed_seq` may show (totals, subtotals).
    pub fn shows(&self, flushed_seq: u64) -> (bool, bool) {
        (
            flushed_seq >= self.all,
            flushed_seq >= self.all.max(self.subtotals),
        )
    }
}

impl NsEntry {
    /// The archive cutoff of one tier resolution (seconds).
    pub fn cutoff(&self, res: u32) -> Cutoff {
        self.cutoffs.get(&res).copied().unwrap_or_default()
    }

    pub fn tier(&self, resolution: Duration) -> Option<TierPlan> {
        self.tiers
            .iter()
            .find(|t| t.resolution == resolution)
            .copied()
    }
}

#[derive(Debug)]
pub struct KeyEntry {
    pub ns: NsId,
    /// The key itself (shared with the namespace's maps).
    pub name: Arc<str>,
    pub total: SeriesId,
    /// (dimension, value, series) of every subtotal this key has had.
    pub subs: Vec<(StrId, StrId, SeriesId)>,
}

/// Marks a subtotal series in `series_info`.
pub const SUBTOTAL: u32 = 1 << 31;

#[derive(Debug, Default)]
pub struct Catalog {
    pub by_name: BTreeMap<Namespace, NsId>,
    pub ns: Vec<NsEntry>,
    pub keys: Vec<KeyEntry>,
    strs: Map<Arc<str>, StrId>,
    pub str_list: Vec<Arc<str>>,
    subs: Map<(KeyId, StrId, StrId), SeriesId>,
    /// Per series: the id of its key, with [`SUBTOTAL`] set for subtotals. (The key gives
    /// the namespace; a flush finds the keys of the series it writes without a walk over
    /// every key.)
    pub series_info: Vec<u32>,
    /// Resolution of each memtable slot.
    pub slots: Vec<Duration>,
}

fn full(what: &str) -> StoreError {
    StoreError::internal(format!("the embedded engine ran out of {what} ids (2^31)"))
}

impl Catalog {
    fn slot(&mut self, r: Duration) -> usize {
        match self.slots.iter().position(|s| *s == r) {
            Some(i) => i,
            None => {
                self.slots.push(r);
                self.slots.len() - 1
            }
        }
    }

    fn plan(&mut self, schema: &Schema) -> Arc<[TierPlan]> {
        schema
            .tiers()
            .iter()
            .map(|t| TierPlan {
                slot: self.slot(t.resolution),
                res: t.resolution.secs_i64(),
                resolution: t.resolution,
                retention: t.retention,
                breakdown: schema.is_breakdown(t.resolution),
            })
            .collect()
    }

    pub fn ns_id(&self, ns: &str) -> Option<NsId> {
        self.by_name.get(ns).copied()
    }

    /// Creates a namespace, or replaces its schema; returns its id and the slots of tiers
    /// that lost their data or their subtotals.
    pub fn put_schema(
        &mut self,
        name: &Namespace,
        schema: &Schema,
    ) -> Result<(NsId, Vec<usize>, Vec<usize>), StoreError> {
        let tiers = self.plan(schema);
        match self.by_name.get(name) {
            Some(&id) => {
                let entry = &mut self.ns[id as usize];
                let old = std::mem::replace(&mut entry.tiers, tiers.clone());
                let removed = old
                    .iter()
                    .filter(|o| !tiers.iter().any(|t| t.slot == o.slot))
                    .map(|t| t.slot)
                    .collect();
                let unbroken = old
                    .iter()
                    .filter(|o| {
                        o.breakdown && !tiers.iter().any(|t| t.slot == o.slot && t.breakdown)
                    })
                    .map(|t| t.slot)
                    .collect();
                entry.schema = schema.clone();
                Ok((id, removed, unbroken))
            }
            None => {
                let id = u32::try_from(self.ns.len()).map_err(|_| full("namespace"))?;
                self.ns.push(NsEntry {
                    name: name.clone(),
                    schema: schema.clone(),
                    tiers,
                    keys: Map::default(),
                    ordered: BTreeMap::new(),
                    cutoffs: BTreeMap::new(),
                });
                self.by_name.insert(name.clone(), id);
                Ok((id, Vec::new(), Vec::new()))
            }
        }
    }

    pub fn str_id(&self, s: &str) -> Option<StrId> {
        self.strs.get(s).copied()
    }

    fn intern(&mut self, s: &str) -> Result<StrId, StoreError> {
        if let Some(&id) = self.strs.get(s) {
            return Ok(id);
        }
        let id = u32::try_from(self.str_list.len()).map_err(|_| full("string"))?;
        let a: Arc<str> = s.into();
        self.str_list.push(a.clone());
        self.strs.insert(a, id);
        Ok(id)
    }

    fn new_series(&mut self, info: u32) -> Result<SeriesId, StoreError> {
        let id = u32::try_from(self.series_info.len())
            .ok()
            .filter(|id| *id < SUBTOTAL)
            .ok_or_else(|| full("series"))?;
        self.series_info.push(info);
        Ok(id)
    }

    pub fn key_id(&self, ns: NsId, key: &str) -> Option<KeyId> {
        self.ns.get(ns as usize)?.keys.get(key).copied()
    }

    pub fn key_or_insert(&mut self, ns: NsId, key: &str) -> Result<KeyId, StoreError> {
        if let Some(id) = self.key_id(ns, key) {
            return Ok(id);
        }
        let id = u32::try_from(self.keys.len())
            .ok()
            .filter(|id| *id < SUBTOTAL)
            .ok_or_else(|| full("key"))?;
        if self.ns.get(ns as usize).is_none() {
            return Err(StoreError::internal("unknown namespace id"));
        }
        // Nothing can fail past this point: the key's series, its entry and its names appear
        // together.
        let total = self.new_series(id)?;
        let name: Arc<str> = key.into();
        if let Some(entry) = self.ns.get_mut(ns as usize) {
            entry.keys.insert(name.clone(), id);
            entry.ordered.insert(name.clone(), id);
        }
        self.keys.push(KeyEntry {
            ns,
            name,
            total,
            subs: Vec::new(),
        });
        Ok(id)
    }

    pub fn sub_id(&self, key: KeyId, dim: StrId, value: StrId) -> Option<SeriesId> {
        self.subs.get(&(key, dim, value)).copied()
    }

    pub fn sub_or_insert(
        &mut self,
        key: KeyId,
        dim: &str,
        value: &str,
    ) -> Result<SeriesId, StoreError> {
        let (d, v) = (self.intern(dim)?, self.intern(value)?);
        self.sub_ids_or_insert(key, d, v)
    }

    /// Interns a string (for callers that cache ids per batch).
    pub fn intern_str(&mut self, s: &str) -> Result<StrId, StoreError> {
        self.intern(s)
    }

    pub fn sub_ids_or_insert(
        &mut self,
        key: KeyId,
        d: StrId,
        v: StrId,
    ) -> Result<SeriesId, StoreError> {
        if let Some(id) = self.sub_id(key, d, v) {
            return Ok(id);
        }
        if self.keys.get(key as usize).is_none() {
            return Err(StoreError::internal("unknown key id"));
        }
        let id = self.new_series(key | SUBTOTAL)?;
        self.subs.insert((key, d, v), id);
        if let Some(k) = self.keys.get_mut(key as usize) {
            k.subs.push((d, v, id));
        }
        Ok(id)
    }

    /// The key of a series.
    pub fn key_of_series(&self, sid: SeriesId) -> Option<KeyId> {
        self.series_info.get(sid as usize).map(|i| i & !SUBTOTAL)
    }

    /// The namespace of a series.
    pub fn ns_of_series(&self, sid: SeriesId) -> Option<NsId> {
        let key = self.key_of_series(sid)?;
        self.keys.get(key as usize).map(|k| k.ns)
    }

    /// Whether a series is a subtotal.
    pub fn is_subtotal(&self, sid: SeriesId) -> bool {
        self.series_info
            .get(sid as usize)
            .is_some_and(|i| i & SUBTOTAL != 0)
    }

    pub fn str(&self, id: StrId) -> &str {
        self.str_list.get(id as usize).map_or("", |s| s)
    }
}

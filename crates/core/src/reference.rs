//! A deliberately simple [`Store`]: one mutex over `BTreeMap`s. It is the reference the
//! real backends are tested against, so it favours obviousness over speed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::model::{Duration, Key, Namespace, Schema};
use crate::store::{
    Batch, Buckets, Clock, Decision, IdemRecord, KeyData, KeyList, KeyRead, Scan, Store,
    StoreError, SubtotalBuckets, Want,
};
use crate::time::bucket_start;

/// (resolution, bucket start) → count.
type Counts = BTreeMap<(Duration, i64), i64>;

#[derive(Debug, Default)]
struct Series {
    totals: Counts,
    /// (dimension, value) → counts.
    subtotals: BTreeMap<(String, String), Counts>,
}

#[derive(Debug, Default)]
struct Inner {
    schemas: BTreeMap<Namespace, Schema>,
    data: BTreeMap<(Namespace, Key), Series>,
    idempotency: BTreeMap<String, IdemRecord>,
}

/// The reference store.
pub struct MemStore {
    inner: Mutex<Inner>,
    clock: Arc<dyn Clock>,
    /// Serialises conditional writes ([`Store::apply_if`]).
    conditional: Mutex<()>,
    /// How far in the future an event may be dated, for [`Schema::replacing`].
    max_future_secs: i64,
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore").finish_non_exhaustive()
    }
}

impl MemStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemStore {
            inner: Mutex::new(Inner::default()),
            clock,
            conditional: Mutex::new(()),
            max_future_secs: crate::ingest::Limits::default().max_future_secs,
        }
    }

    /// How far in the future the events it is given may be dated (`[limits]
    /// max_future_secs`; the default's otherwise): a schema change's additions count every
    /// event from that long after it.
    pub fn with_max_future_secs(mut self, secs: i64) -> Self {
        self.max_future_secs = secs;
        self
    }

    /// Whether `ns` holds a count (total or subtotal, zero too: the sum of several writes) of
    /// the tier of `resolution` in a bucket starting in `[from, to)`, shown or not: what a
    /// retention that grows would show again (tests use it to keep to what every backend
    /// answers alike).
    #[doc(hidden)]
    pub fn holds_between(&self, ns: &Namespace, resolution: Duration, from: i64, to: i64) -> bool {
        let Ok(inner) = self.lock() else { return false };
        inner
            .data
            .iter()
            .filter(|((n, _), _)| n == ns)
            .any(|(_, s)| {
                std::iter::once(&s.totals)
                    .chain(s.subtotals.values())
                    .any(|c| {
                        c.range((resolution, from)..(resolution, to))
                            .next()
                            .is_some()
                    })
            })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError::internal("reference store lock poisoned"))
    }
}

fn slice(counts: &Counts, schema: &Schema, r: Duration, from: i64, to: i64, now: i64) -> Buckets {
    let Some(tier) = schema.tiers().iter().find(|t| t.resolution == r) else {
        return Vec::new();
    };
    counts
        .range((r, from)..(r, to))
        .filter(|&(&(_, b), &n)| n != 0 && tier.retention.keeps_bucket(b, r, now))
        .map(|(&(_, b), &n)| (b, n))
        .collect()
}

/// Adds increments to the reference's counts, in every tier whose retention keeps them,
/// under the caller's lock.
fn add(
    inner: &mut Inner,
    increments: &[crate::store::Increment],
    now: i64,
) -> Result<(), StoreError> {
    for inc in increments {
        let Some(schema) = inner.schemas.get(&inc.ns).cloned() else {
            return Err(StoreError::internal(format!(
                "namespace {} vanished",
                inc.ns
            )));
        };
        if !schema.counts(inc.ts, inc.n, now) {
            continue;
        }
        let series = inner
            .data
            .entry((inc.ns.clone(), inc.key.clone()))
            .or_default();
        for tier in schema.tiers() {
            let r = tier.resolution;
            let b = bucket_start(inc.ts, r.secs_i64());
            if !tier.retention.keeps_bucket(b, r, now) {
                continue;
            }
            let t = series.totals.entry((r, b)).or_default();
            *t = t.wrapping_add(inc.n);
            if schema.is_breakdown(r) {
                for s in &inc.subtotals {
                    let counts = series
                        .subtotals
                        .entry((s.dim.clone(), s.value.clone()))
                        .or_default();
                    let c = counts.entry((r, b)).or_default();
                    *c = c.wrapping_add(inc.n);
                }
            }
        }
    }
    Ok(())
}

impl Store for MemStore {
    fn apply_if(
        &self,
        batch: &Batch,
        window: &KeyRead<'_>,
        decide: &mut dyn FnMut(&Buckets) -> Result<Decision, StoreError>,
    ) -> Result<bool, StoreError> {
        crate::store::apply_if_locked(self, &self.conditional, batch, window, decide)
    }

    fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        Ok(self
            .lock()?
            .schemas
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect())
    }

    fn namespace_count(&self) -> Result<usize, StoreError> {
        Ok(self.lock()?.schemas.len())
    }

    fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
        Ok(self.lock()?.schemas.get(ns).cloned())
    }

    fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        let now = self.clock.now();
        let schema = &schema
            .clone()
            .replacing(inner.schemas.get(ns), now, self.max_future_secs);
        let kept: Vec<Duration> = schema.tiers().iter().map(|t| t.resolution).collect();
        // A removed tier loses its data, and so do subtotals of tiers no longer breakdown.
        for ((n, _), series) in inner.data.iter_mut() {
            if n == ns {
                series.totals.retain(|(r, _), _| kept.contains(r));
                for counts in series.subtotals.values_mut() {
                    counts.retain(|(r, _), _| schema.is_breakdown(*r));
                }
            }
        }
        inner.schemas.insert(ns.clone(), schema.clone());
        Ok(())
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut inner = self.lock()?;
        for (ns, schema) in &batch.create {
            inner
                .schemas
                .entry(ns.clone())
                .or_insert_with(|| schema.clone());
        }
        // Remembered with the batch, as the engine does (atomically, under the same lock).
        if let Some(rec) = &batch.idempotency {
            inner.idempotency.insert(rec.key.clone(), rec.clone());
        }
        add(&mut inner, &batch.increments, now)
    }

    fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError> {
        let now = self.clock.now();
        let inner = self.lock()?;
        let mut out = Vec::with_capacity(reads.len());
        for read in reads {
            let (Some(schema), Some(series)) = (
                inner.schemas.get(read.ns),
                inner.data.get(&(read.ns.clone(), read.key.clone())),
            ) else {
                out.push(KeyData::default());
                continue;
            };
            let cut = |c: &Counts| slice(c, schema, read.resolution, read.from, read.to, now);
            let wanted = |dim: &str, value: &str| match read.want {
                Want::Totals => false,
                Want::Value { dim: d, value: v } => d == dim && v == value,
                Want::Dim { dim: d } => d == dim,
                Want::All => true,
            };
            let subtotals = series
                .subtotals
                .iter()
                .filter(|((d, v), _)| wanted(d, v))
                .map(|((d, v), c)| SubtotalBuckets {
                    dim: d.clone(),
                    value: v.clone(),
                    buckets: cut(c),
                })
                .filter(|s| !s.buckets.is_empty())
                .collect();
            out.push(KeyData {
                totals: cut(&series.totals),
                subtotals,
                rest: Vec::new(),
            });
        }
        Ok(out)
    }

    fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        let inner = self.lock()?;
        Ok(inner
            .data
            .keys()
            .filter(|(n, k)| {
                *n == *list.ns
                    && k.as_str().starts_with(list.prefix)
                    && list
                        .after
                        .is_none_or(|a| k.as_str().as_bytes() > a.as_bytes())
            })
            .map(|(_, k)| k.clone())
            .take(list.limit)
            .collect())
    }

    fn scan(&self, scan: &Scan<'_>, visit: &mut dyn FnMut(&Key, i64)) -> Result<(), StoreError> {
        let now = self.clock.now();
        let inner = self.lock()?;
        let Some(schema) = inner.schemas.get(scan.ns) else {
            return Ok(());
        };
        for ((n, k), series) in &inner.data {
            if n != scan.ns {
                continue;
            }
            let counts = match scan.value {
                None => Some(&series.totals),
                Some((d, v)) => series.subtotals.get(&(d.to_owned(), v.to_owned())),
            };
            let Some(counts) = counts else { continue };
            let slice = slice(counts, schema, scan.resolution, scan.from, scan.to, now);
            let sum = crate::query::wrapping_sum(slice.iter().map(|(_, n)| *n));
            if sum != 0 {
                visit(k, sum);
            }
        }
        Ok(())
    }

    /// Every shown count of the range, every tier, totals and subtotals, removed; then the
    /// batch applied as a write.
    fn rebuild(
        &self,
        ns: &Namespace,
        from: i64,
        to: i64,
        batch: &Batch,
    ) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut held = 0u64;
        // One critical section, as the engine's rebuild is one publication: a reader sees
        // the old counts or the new, never the range emptied.
        let mut inner = self.lock()?;
        {
            let Some(schema) = inner.schemas.get(ns).cloned() else {
                return Err(StoreError::internal(format!("namespace {ns} is unknown")));
            };
            let shown = |r: Duration, b: i64| {
                (from..to).contains(&b)
                    && schema
                        .tiers()
                        .iter()
                        .find(|t| t.resolution == r)
                        .is_some_and(|t| t.retention.keeps_bucket(b, r, now))
            };
            for ((n, _), series) in inner.data.iter_mut() {
                if n != ns {
                    continue;
                }
                series.totals.retain(|&(r, b), v| {
                    let gone = shown(r, b);
                    held += u64::from(gone && *v != 0);
                    !gone
                });
                for counts in series.subtotals.values_mut() {
                    counts.retain(|&(r, b), v| {
                        let gone = shown(r, b) && schema.is_breakdown(r);
                        held += u64::from(gone && *v != 0);
                        !gone
                    });
                }
            }
        }
        add(&mut inner, &batch.increments, now)?;
        Ok(held)
    }

    fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        let now = self.clock.now();
        Ok(self
            .lock()?
            .idempotency
            .get(key)
            .filter(|r| r.expires > now)
            .cloned())
    }
}

//! Applying a batch: namespaces it creates first, then the increments aggregated (every
//! event of one series and bucket becomes one `HINCRBY`), then one `APPLY` script call per
//! slot, all in flight at once.
//!
//! On a single server the whole batch is one script call: all or nothing. In a cluster a
//! call per slot is atomic, so a series is never half-applied, and the batch's marker in each
//! slot makes a retry (same batch id: the idempotency key, or a random id reused by our own
//! retries) skip the slots it already reached. Order in a cluster: the namespaces' key
//! indexes, then the series, then the idempotency record — so a key with data is always
//! listed, and a remembered answer always means the whole batch is in.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use tally_core::model::{Key, Namespace};
use tally_core::store::{Batch, Clock, IdemRecord, StoreError, SystemClock};
use tally_core::time::bucket_start;

use crate::layout::{self, SCHEMAS_KEY, SchemaRecord, Stored};
use crate::{RedisStore, scripts};

/// How long a random batch id's markers live: longer than any retry of one `apply`.
const MARKER_SECS: i64 = 600;

/// An idempotency record as stored (JSON).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct IdemDoc {
    key: String,
    fingerprint: String,
    expires: i64,
    status: u16,
    body: String,
}

impl IdemDoc {
    fn of(r: &IdemRecord) -> IdemDoc {
        IdemDoc {
            key: r.key.clone(),
            fingerprint: r.fingerprint.clone(),
            expires: r.expires,
            status: r.status,
            body: r.body.clone(),
        }
    }

    pub fn into_record(self) -> IdemRecord {
        IdemRecord {
            key: self.key,
            fingerprint: self.fingerprint,
            expires: self.expires,
            status: self.status,
            body: self.body,
        }
    }
}

/// When something may go: an instant, or never. Orders `At(_) < Never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Until {
    At(i64),
    Never,
}

impl Until {
    fn of(t: Option<i64>) -> Until {
        t.map_or(Until::Never, Until::At)
    }
}

/// One hash's increments and its expiry.
#[derive(Debug, Default)]
struct HashPlan {
    expire_at: Option<i64>,
    fields: BTreeMap<String, i64>,
}

/// One series' share of the batch.
#[derive(Debug)]
struct SeriesPlan {
    tag: String,
    hashes: BTreeMap<String, HashPlan>,
    /// When its last bucket stops being shown; `None` if no tier kept any of its events.
    until: Option<Until>,
}

/// A script call under construction: its keys and arguments.
#[derive(Debug, Default)]
struct Call {
    keys: Vec<String>,
    args: Vec<String>,
    /// Seconds from the store's clock to Redis' (`EXPIREAT` is in Redis' time): 0 in
    /// service, where both are the system clock; a test's manual clock sets it so keys do
    /// not expire in Redis before the store stops showing them.
    skew: i64,
}

impl Call {
    fn new(marker: Option<(String, i64)>) -> Call {
        let mut c = Call::default();
        match marker {
            Some((key, secs)) => {
                c.keys.push(key);
                c.args.push(secs.to_string());
            }
            None => c.args.push("0".into()),
        }
        c
    }

    fn key(&mut self, k: &str) -> String {
        self.keys.push(k.to_owned());
        self.keys.len().to_string()
    }

    fn is_empty(&self) -> bool {
        self.args.len() <= 1
    }

    fn index(&mut self, ns: &Namespace, members: &[(&Key, Until)], page: usize) {
        if members.is_empty() {
            return;
        }
        let dir = self.key(&layout::key_dir_key(ns));
        let exp = self.key(&layout::expiry_key(ns));
        self.args.extend([
            "i".into(),
            dir,
            exp,
            layout::key_page_prefix(ns),
            page.to_string(),
            members.len().to_string(),
        ]);
        for (k, until) in members {
            self.args.push(k.as_str().to_owned());
            self.args.push(match until {
                Until::At(t) => t.to_string(),
                Until::Never => "inf".into(),
            });
        }
    }

    fn series(&mut self, s: &SeriesPlan) {
        for (name, h) in &s.hashes {
            let k = self.key(name);
            self.args.extend([
                "h".into(),
                k,
                h.expire_at
                    .map_or("0".into(), |t| (t + self.skew).to_string()),
                h.fields.len().to_string(),
            ]);
            for (f, n) in &h.fields {
                self.args.push(f.clone());
                self.args.push(n.to_string());
            }
        }
    }

    fn record(&mut self, r: &IdemRecord) -> Result<(), StoreError> {
        let k = self.key(&layout::idem_key(&r.key));
        let doc = serde_json::to_string(&IdemDoc::of(r))
            .map_err(|e| StoreError::internal("encoding an idempotency record").because(e))?;
        self.args
            .extend(["r".into(), k, doc, (r.expires + self.skew).to_string()]);
        Ok(())
    }
}

/// Aggregates a batch's increments per series, hash and field.
fn plan(
    batch: &Batch,
    schemas: &BTreeMap<Namespace, Stored>,
    now: i64,
) -> Result<BTreeMap<(Namespace, Key), SeriesPlan>, StoreError> {
    let mut series: BTreeMap<(Namespace, Key), SeriesPlan> = BTreeMap::new();
    for inc in &batch.increments {
        let Some(st) = schemas.get(&inc.ns) else {
            return Err(StoreError::internal(format!(
                "namespace {} vanished",
                inc.ns
            )));
        };
        let plan = series
            .entry((inc.ns.clone(), inc.key.clone()))
            .or_insert_with(|| SeriesPlan {
                tag: layout::series_tag(&inc.ns, inc.key.as_str()),
                hashes: BTreeMap::new(),
                until: None,
            });
        for tier in st.schema.tiers() {
            let r = tier.resolution.secs_i64();
            let b = bucket_start(inc.ts, r);
            if !tier.retention.keeps_bucket(b, tier.resolution, now) {
                continue;
            }
            let Some(gen_) = st.generation(tier.resolution) else {
                continue;
            };
            let w = layout::window_of(b, r);
            let off = layout::offset_of(b, w, r);
            let expire_at = layout::window_expiry(w, r, tier.retention);
            let until = Until::of(layout::bucket_expiry(b, r, tier.retention));
            plan.until = Some(plan.until.map_or(until, |u| u.max(until)));
            let h = plan
                .hashes
                .entry(layout::window_key(&plan.tag, gen_, r, w))
                .or_default();
            h.expire_at = expire_at;
            *h.fields.entry(off.to_string()).or_default() += inc.n;
            if let Some(sgen) = st.breakdown_generation(tier.resolution) {
                for s in &inc.subtotals {
                    let field = match st.write_code(tier.resolution, &s.dim) {
                        Some(code) => layout::coded_field(off, code, &s.value),
                        None => layout::subtotal_field(off, sgen, &s.dim, &s.value),
                    };
                    *h.fields.entry(field).or_default() += inc.n;
                }
            }
        }
    }
    // Events that net to zero change nothing.
    for s in series.values_mut() {
        for h in s.hashes.values_mut() {
            h.fields.retain(|_, n| *n != 0);
        }
        s.hashes.retain(|_, h| !h.fields.is_empty());
    }
    Ok(series)
}

impl RedisStore {
    /// `id`: the batch's id; `None` for its idempotency key, else a fresh random one.
    pub(crate) async fn apply_async(
        &self,
        batch: &Batch,
        id: Option<&str>,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let id = match (id, &batch.idempotency) {
            (Some(id), _) => format!("id:{id}"),
            (None, Some(r)) => format!("idem:{}", r.key),
            (None, None) => self.batch_ids.fresh(),
        };
        let marker_secs = match &batch.idempotency {
            Some(r) => (r.expires - now).max(MARKER_SECS),
            None => MARKER_SECS,
        };
        let mut schemas = self.create_and_load(batch).await?;
        self.give_codes(batch, &mut schemas, now).await?;
        let series = plan(batch, &schemas, now)?;
        let skew = match SystemClock.now() - now {
            // The same clock read twice: the same time.
            s if s.abs() <= 2 => 0,
            s => s,
        };
        let new_call = |marker| Call {
            skew,
            ..Call::new(marker)
        };

        // The key index, per namespace: every key some tier kept an event of.
        let mut index: BTreeMap<&Namespace, Vec<(&Key, Until)>> = BTreeMap::new();
        for ((ns, key), s) in &series {
            if let Some(until) = s.until {
                index.entry(ns).or_default().push((key, until));
            }
        }
        let with_data = || series.values().filter(|s| !s.hashes.is_empty());

        if !self.is_cluster() {
            let marker = with_data()
                .next()
                .map(|s| (layout::marker_key(&s.tag, &id), marker_secs));
            let mut call = new_call(marker);
            for (ns, members) in &index {
                call.index(ns, members, self.index_page);
            }
            with_data().for_each(|s| call.series(s));
            if let Some(r) = &batch.idempotency {
                call.record(r)?;
            }
            return self.run(vec![call]).await;
        }

        let indexes = index
            .iter()
            .map(|(ns, members)| {
                let mut c = new_call(None);
                c.index(ns, members, self.index_page);
                c
            })
            .collect();
        self.run(indexes).await?;
        // Redis hashes only the tag, so the tag's slot is that of every key of the series.
        let mut slots: HashMap<Slot, Call> = HashMap::new();
        for s in with_data() {
            let slot = Slot::for_key(&s.tag);
            slots
                .entry(slot)
                .or_insert_with(|| new_call(Some((layout::marker_key(&s.tag, &id), marker_secs))))
                .series(s);
        }
        self.run(slots.into_values().collect()).await?;
        if let Some(r) = &batch.idempotency {
            let mut c = new_call(None);
            c.record(r)?;
            self.run(vec![c]).await?;
        }
        Ok(())
    }

    /// Creates the batch's namespaces (those not there yet) and reads the schemas of every
    /// namespace it writes: one pipeline to the schemas hash.
    async fn create_and_load(
        &self,
        batch: &Batch,
    ) -> Result<BTreeMap<Namespace, Stored>, StoreError> {
        if !batch.create.is_empty() {
            let mut pipe = redis::pipe();
            for (ns, schema) in &batch.create {
                let record = SchemaRecord::next(None, schema).encode()?;
                pipe.cmd("HSETNX")
                    .arg(SCHEMAS_KEY)
                    .arg(ns.as_str())
                    .arg(record)
                    .ignore();
            }
            self.retry(|mut c| {
                let pipe = &pipe;
                async move { pipe.exec_async(&mut c).await }
            })
            .await?;
        }
        let nss: BTreeSet<&Namespace> = batch.increments.iter().map(|i| &i.ns).collect();
        let nss: Vec<&Namespace> = nss.into_iter().collect();
        self.load_schemas(&nss).await
    }

    /// Gives codes to the dimensions the batch writes in breakdown tiers where they have none
    /// yet, and confirms pending ones (`secure_codes`, per namespace), so that its subtotals
    /// take the short field. Codes are given before any field uses them, so a reader that
    /// meets a code it does not know knows its record is older than the data. If the
    /// schemas hash is out of reach, or its replicas lag, the subtotals keep the spelled-out
    /// field, which every read also looks for.
    async fn give_codes(
        &self,
        batch: &Batch,
        schemas: &mut BTreeMap<Namespace, Stored>,
        now: i64,
    ) -> Result<(), StoreError> {
        let mut wanted: BTreeMap<Namespace, BTreeSet<(u64, String)>> = BTreeMap::new();
        for inc in &batch.increments {
            let Some(st) = schemas.get(&inc.ns) else {
                continue;
            };
            for &res in st.schema.breakdown_resolutions() {
                // A tier that does not keep the event writes no field: no code for it.
                let kept = st.tier(res).is_some_and(|t| {
                    let b = bucket_start(inc.ts, res.secs_i64());
                    t.retention.keeps_bucket(b, res, now)
                });
                if !kept {
                    continue;
                }
                for s in &inc.subtotals {
                    if st.may_get_code(res, &s.dim) || st.is_pending(res, &s.dim) {
                        wanted
                            .entry(inc.ns.clone())
                            .or_default()
                            .insert((res.secs(), s.dim.clone()));
                    }
                }
            }
        }
        for (ns, pairs) in wanted {
            let pairs: Vec<(u64, &str)> = pairs.iter().map(|(r, d)| (*r, d.as_str())).collect();
            let updated = self.secure_codes(&ns, &pairs).await;
            match updated {
                Ok(Some(stored)) => {
                    schemas.insert(ns, stored);
                }
                Ok(None) => {}
                Err(e @ StoreError::Unavailable { .. }) => {
                    tracing::warn!(error = %e.detail(), %ns, "no dimension codes given");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends script calls, all at once, each retried on its own; the first failure wins.
    async fn run(&self, calls: Vec<Call>) -> Result<(), StoreError> {
        let calls: Vec<Call> = calls.into_iter().filter(|c| !c.is_empty()).collect();
        let results = join_all(calls.iter().map(|call| {
            self.retry(move |mut c| async move {
                let mut inv = scripts::APPLY.prepare_invoke();
                for k in &call.keys {
                    inv.key(k);
                }
                for a in &call.args {
                    inv.arg(a);
                }
                inv.invoke_async::<i64>(&mut c).await
            })
        }))
        .await;
        results.into_iter().try_for_each(|r| r.map(|_| ()))
    }
}

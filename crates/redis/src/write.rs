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
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use tally_core::model::{Key, Namespace};
use tally_core::store::{Batch, Clock, IdemRecord, StoreError, SystemClock};
use tally_core::time::bucket_start;

use crate::layout::{self, SCHEMAS_KEY, SchemaRecord, Stored};
use crate::{RedisStore, scripts};

/// How long a random batch id's markers live: longer than any retry of one `apply`.
const MARKER_SECS: i64 = 600;

/// How long a cluster's markers of a batch under an idempotency key are kept once its
/// record is written ([`RedisStore::tidy_markers`]).
const MARKER_AFTER_SECS: i64 = 120;

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
pub(crate) enum Until {
    At(i64),
    Never,
}

impl Until {
    fn of(t: Option<i64>) -> Until {
        t.map_or(Until::Never, Until::At)
    }
}

/// Keys this store listed in the key index, per namespace, with the expiry it gave each
/// and the index's epoch then (`docs/redis.md`, "Key index"): a batch leaves out of its index
/// operation the keys the index is known to hold already with an expiry at least as late, so
/// that a busy key costs the index nothing batch after batch (each key sent costs two calls
/// in the script: its page's look-up and `ZADD NX`). Nothing takes a key out of the index
/// but pruning, which takes only keys whose expiry has passed, and an expiry only grows: a
/// key listed without expiry (a `forever` tier) stays, and one listed until `t` stays until
/// `t` — trusted only while `t` is an hour or more away, for tally servers whose clocks
/// differ. What could undo a listing otherwise — Redis losing acknowledged writes (a restart
/// from an older snapshot, a failover to a replica behind) or emptied — changes the epoch,
/// which `APPLY` checks before it changes anything: then the store forgets what it
/// remembered and sends the batch again with every key. Entries are trusted for
/// [`LISTED_TTL`] (what the epoch cannot see: index keys deleted by hand), at most
/// [`LISTED_MAX`] of them, all namespaces together (when full, entries past the TTL go,
/// then, if that is not enough, all of them).
#[derive(Debug, Default)]
pub(crate) struct Listed(Mutex<ListedKeys>);

#[derive(Debug, Default)]
struct ListedKeys {
    by_ns: HashMap<Namespace, NsListed>,
    len: usize,
}

#[derive(Debug, Default)]
struct NsListed {
    /// The index's epoch when these keys were listed.
    epoch: String,
    keys: HashMap<Key, (Until, Instant)>,
}

/// How long an entry of [`Listed`] is trusted, and how many it holds at most.
const LISTED_TTL: std::time::Duration = std::time::Duration::from_secs(600);
const LISTED_MAX: usize = 100_000;
/// How far ahead a finite expiry must be for [`Listed`] to trust it.
const LISTED_MARGIN: i64 = 3600;

impl Listed {
    fn lock(&self) -> std::sync::MutexGuard<'_, ListedKeys> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the index surely holds `key` with an expiry of `until` or later, if its
    /// epoch is still `epoch` (what [`Listed::epoch`] said when the batch was planned: the
    /// memory may move to another epoch meanwhile, and must not be trusted under one the
    /// call does not check).
    fn covers(&self, ns: &Namespace, key: &Key, until: Until, now: i64, epoch: &str) -> bool {
        let keys = self.lock();
        let Some(&(listed, at)) = keys
            .by_ns
            .get(ns.as_str())
            .filter(|m| m.epoch == epoch)
            .and_then(|m| m.keys.get(key.as_str()))
        else {
            return false;
        };
        at.elapsed() < LISTED_TTL
            && match listed {
                Until::Never => true,
                Until::At(t) => until <= listed && t > now + LISTED_MARGIN,
            }
    }

    /// The epoch of the namespace's index when its remembered keys were listed.
    fn epoch(&self, ns: &Namespace) -> Option<String> {
        self.lock().by_ns.get(ns.as_str()).map(|m| m.epoch.clone())
    }

    /// Notes keys the index of `ns` now holds (their index operation succeeded) at `epoch`;
    /// what was remembered at another epoch is forgotten.
    fn note<'a>(
        &self,
        ns: &Namespace,
        epoch: &str,
        members: impl Iterator<Item = (&'a Key, Until)>,
    ) {
        let mut keys = self.lock();
        let at = Instant::now();
        let ListedKeys { by_ns, len } = &mut *keys;
        let of_ns = by_ns.entry(ns.clone()).or_default();
        if of_ns.epoch != epoch {
            *len -= of_ns.keys.len();
            *of_ns = NsListed {
                epoch: epoch.to_owned(),
                keys: HashMap::new(),
            };
        }
        for (key, until) in members {
            if *len >= LISTED_MAX {
                // Full: what is too old to be trusted goes first, else everything.
                for m in by_ns.values_mut() {
                    m.keys.retain(|_, e| e.1.elapsed() < LISTED_TTL);
                }
                *len = by_ns.values().map(|m| m.keys.len()).sum();
                if *len >= LISTED_MAX {
                    by_ns.values_mut().for_each(|m| m.keys.clear());
                    *len = 0;
                }
            }
            let Some(of_ns) = by_ns.get_mut(ns.as_str()) else {
                continue;
            };
            match of_ns.keys.get_mut(key.as_str()) {
                Some(e) => *e = (e.0.max(until), at),
                None => {
                    of_ns.keys.insert(key.clone(), (until, at));
                    *len += 1;
                }
            }
        }
    }

    /// Forgets every key (an epoch was not the one expected).
    fn forget(&self) {
        *self.lock() = ListedKeys::default();
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
    /// When its last bucket stops being shown; `None` if no tier kept any of its events
    /// with an amount other than 0 (then the key is not indexed for it).
    until: Option<Until>,
}

/// A script call under construction: its keys and arguments.
#[derive(Debug, Default)]
struct Call {
    keys: Vec<String>,
    /// The marker's lifetime (`ARGV[1]`), the request's token (`ARGV[2]`), and the
    /// marker's end and now by the store's clock (`ARGV[3]`, `ARGV[4]`).
    head: String,
    token: String,
    ends: String,
    now: String,
    /// The fence (`ARGV[5]`, `ARGV[6]`): the index in `keys` of a lock that must still hold
    /// the token, or `0` for none, and the token.
    fence: (String, String),
    /// Key index epoch checks, three arguments each (`APPLY`'s doc), and their namespaces
    /// with the keys sent to their index.
    checks: Vec<String>,
    sent: Vec<(Namespace, Vec<(Key, Until)>)>,
    /// The operations.
    args: Vec<String>,
    /// Seconds from the store's clock to Redis' (`EXPIREAT` is in Redis' time): 0 in
    /// service, where both are the system clock; a test's manual clock sets it so keys do
    /// not expire in Redis before the store stops showing them.
    skew: i64,
}

impl Call {
    fn new(marker: Option<Marker>) -> Call {
        let mut c = Call {
            fence: ("0".into(), String::new()),
            token: "-".into(),
            ends: "0".into(),
            now: "0".into(),
            ..Call::default()
        };
        match marker {
            Some(m) => {
                c.keys.push(m.key);
                c.head = m.secs.to_string();
                c.token = m.token;
                c.ends = (m.now + m.secs).to_string();
                c.now = m.now.to_string();
            }
            None => c.head = "0".into(),
        }
        c
    }

    /// Makes the call change nothing unless `fence`'s lock still holds its token.
    fn fenced(&mut self, fence: &Fence) {
        let at = self.key(&fence.lock);
        self.fence = (at, fence.token.clone());
    }

    fn key(&mut self, k: &str) -> String {
        self.keys.push(k.to_owned());
        self.keys.len().to_string()
    }

    fn is_empty(&self) -> bool {
        self.args.is_empty() && self.checks.is_empty() && self.head == "0"
    }

    /// The namespace's index operation: its epoch checked against `expected` (`-`: no key
    /// was left out, any epoch will do) and the keys `members` listed, if any.
    fn index(
        &mut self,
        ns: &Namespace,
        members: &[(&Key, Until)],
        (page, now): (usize, i64),
        (fresh, expected): (String, String),
    ) {
        let token = self.key(&layout::key_token_key(ns));
        self.checks.extend([token, fresh, expected]);
        self.sent.push((
            ns.clone(),
            members.iter().map(|&(k, u)| (k.clone(), u)).collect(),
        ));
        if members.is_empty() {
            return;
        }
        let dir = self.key(&layout::key_dir_key(ns));
        let exp = self.key(&layout::expiry_key(ns));
        // Keys whose data all expired leave the index as new ones come in (at least as
        // many as come, when there are), so the index follows the live keys even if nobody
        // lists them (listing and `top` prune too).
        let prune = (members.len() + 8).min(256);
        self.args.extend([
            "i".into(),
            dir,
            exp,
            layout::key_page_prefix(ns),
            page.to_string(),
            now.to_string(),
            prune.to_string(),
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

    /// Widens the namespace's extent to the batch's (`layout::extent_key`).
    fn extent(&mut self, ns: &Namespace, ranges: Option<&BTreeMap<i64, (i64, i64)>>) {
        let Some(ranges) = ranges.filter(|r| !r.is_empty()) else {
            return;
        };
        let k = self.key(&layout::extent_key(ns));
        self.args.extend(["x".into(), k, ranges.len().to_string()]);
        for (res, (lo, hi)) in ranges {
            self.args
                .extend([res.to_string(), lo.to_string(), hi.to_string()]);
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

/// Per namespace, per resolution (seconds): the first and last bucket start a batch puts
/// data in (`layout::extent_key`).
type Extents = BTreeMap<Namespace, BTreeMap<i64, (i64, i64)>>;

/// A batch's series by namespace and key.
type Series = BTreeMap<(Namespace, Key), SeriesPlan>;

/// Aggregates a batch's increments per series, hash and field, and notes the buckets'
/// extents.
fn plan(
    batch: &Batch,
    schemas: &BTreeMap<Namespace, Stored>,
    now: i64,
) -> Result<(Series, Extents), StoreError> {
    let mut series = Series::new();
    let mut extents = Extents::new();
    for inc in &batch.increments {
        let Some(st) = schemas.get(&inc.ns) else {
            return Err(StoreError::internal(format!(
                "namespace {} vanished",
                inc.ns
            )));
        };
        // An increment that adds to no counter makes no key (`Schema::counts`): its series
        // still names the batch's marker, but it indexes nothing.
        let counts = st.schema.counts(inc.ts, inc.n, now);
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
            let e = extents
                .entry(inc.ns.clone())
                .or_default()
                .entry(r)
                .or_insert((b, b));
            *e = (e.0.min(b), e.1.max(b));
            let w = layout::window_of(b, r);
            let off = layout::offset_of(b, w, r);
            let expire_at = layout::window_expiry(w, r, tier.retention);
            if counts {
                let until = Until::of(layout::bucket_expiry(b, r, tier.retention));
                plan.until = Some(plan.until.map_or(until, |u| u.max(until)));
            }
            let h = plan
                .hashes
                .entry(layout::window_key(&plan.tag, gen_, r, w))
                .or_default();
            h.expire_at = expire_at;
            // Counters wrap past 64 bits, as the engine's do (and the script's `HINCRBY`).
            let total = h.fields.entry(off.to_string()).or_default();
            *total = total.wrapping_add(inc.n);
            if let Some(sgen) = st.breakdown_generation(tier.resolution) {
                for s in &inc.subtotals {
                    let field = match st.write_code(tier.resolution, &s.dim) {
                        Some(code) => layout::coded_field(off, code, &s.value),
                        None => layout::subtotal_field(off, sgen, &s.dim, &s.value),
                    };
                    let sub = h.fields.entry(field).or_default();
                    *sub = sub.wrapping_add(inc.n);
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
    Ok((series, extents))
}

impl RedisStore {
    /// `id`: the batch's id; `None` for its idempotency key, else a fresh random one.
    /// `fence`: a lock the batch's series must still be held under when they are applied
    /// (their slot's); else nothing is applied and the answer is `unavailable`.
    /// Applies `batch` (see [`RedisStore::apply_inner`]) within [`WRITE_DEADLINE`] (unless
    /// told otherwise, [`RedisStore::with_write_deadline`]): each of
    /// a write's calls is retried up to three times with a 10 s timeout, and on a Redis that
    /// stopped answering they added up to ~90 s before a `503` (found by a review).
    pub(crate) async fn apply_async(
        &self,
        batch: &Batch,
        id: Option<&str>,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        let deadline = self.write_deadline;
        match tokio::time::timeout(deadline, self.apply_inner(batch, id, fence)).await {
            Ok(done) => done,
            Err(_) => Err(maybe_applied(StoreError::unavailable(format!(
                "{}: the write got no answer within {} s",
                self.label,
                deadline.as_secs_f64()
            )))),
        }
    }

    async fn apply_inner(
        &self,
        batch: &Batch,
        id: Option<&str>,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        self.vet().await?;
        let now = self.now();
        if let Some(r) = &batch.idempotency {
            self.count_answer(r, now).await?;
        }
        // Under its idempotency key, a batch's marker says which request applied it: the
        // request's fingerprint, so a different request under the key is told apart (and
        // the same one, retried on any server, finishes what is left). Under a caller's or
        // a random id, any marker is this batch's.
        let (id, claim, after) = match (id, &batch.idempotency) {
            (Some(id), _) => (format!("id:{id}"), None, Tidy::Keep),
            (None, Some(r)) => (
                format!("idem:{}", r.key),
                Some(r.fingerprint.as_str()),
                Tidy::Shorten,
            ),
            (None, None) => (self.batch_ids.fresh(), None, Tidy::Delete),
        };
        let marker_secs = match &batch.idempotency {
            Some(r) => (r.expires - now).max(MARKER_SECS),
            None => MARKER_SECS,
        };
        let mut schemas = self.create_and_load(batch).await?;
        self.give_codes(batch, &mut schemas, now).await?;
        let (series, extents) = plan(batch, &schemas, now)?;
        let skew = match SystemClock.now() - now {
            // The same clock read twice: the same time.
            s if s.abs() <= 2 => 0,
            s => s,
        };
        let new_call = |marker| Call {
            skew,
            ..Call::new(marker)
        };

        // Keys the index surely holds are left out (`Listed`), unless an epoch check failed:
        // then every key goes, once more.
        let mut trust = true;
        loop {
            let calls = self.index_and_series(
                (&series, &extents),
                batch,
                &id,
                (marker_secs, claim),
                &new_call,
                trust,
                now,
                fence,
            )?;
            // A cluster's batch markers, one per slot, and a single server's marker of a
            // random batch id: see `tidy_markers`.
            let markers: Vec<String> = match self.is_cluster() || after == Tidy::Delete {
                true => calls
                    .iter()
                    .flatten()
                    .filter(|c| c.head != "0" && c.token == "-")
                    .filter_map(|c| c.keys.first().cloned())
                    .collect(),
                false => Vec::new(),
            };
            let record = match (&batch.idempotency, claim, self.is_cluster()) {
                (Some(r), Some(_), true) => Some(layout::idem_key(&r.key)),
                _ => None,
            };
            match self.run_apply(calls, record).await? {
                Outcome::Stale if trust => {
                    self.listed.forget();
                    trust = false;
                }
                Outcome::Stale => {
                    self.release_claim(batch, claim).await;
                    return Err(StoreError::unavailable(format!(
                        "{}: the key index's epoch changed twice during one write; try again",
                        self.label
                    )));
                }
                Outcome::Applied => {
                    self.tidy_markers(markers, after).await;
                    return Ok(());
                }
                Outcome::Claimed => {
                    return Err(StoreError::Claimed {
                        what: "this Idempotency-Key was used for a different request".into(),
                    });
                }
                Outcome::Fenced => {
                    self.release_claim(batch, claim).await;
                    return Err(StoreError::unavailable(format!(
                        "{}: the lock of a limited increment expired before it was \
                         applied (Redis or this server stalled); nothing was applied, try again",
                        self.label
                    )));
                }
            }
        }
    }

    /// The script calls of a batch, in the order they run: on a single server one call; in
    /// a cluster the namespaces' key indexes (one call each), then the series (one call per
    /// slot), then the idempotency record — so a key with data is always listed, and a
    /// remembered answer means the whole batch is in.
    #[allow(clippy::too_many_arguments)]
    fn index_and_series(
        &self,
        (series, extents): (&Series, &Extents),
        batch: &Batch,
        id: &str,
        (marker_secs, claim): (i64, Option<&str>),
        new_call: &dyn Fn(Option<Marker>) -> Call,
        trust: bool,
        now: i64,
        fence: Option<&Fence>,
    ) -> Result<Vec<Vec<Call>>, StoreError> {
        // The key index, per namespace: every key some tier kept an event of, but those it
        // surely holds. Each namespace's epoch is read once: keys are left out only if
        // remembered under it, and the call checks that one.
        let mut index: BTreeMap<&Namespace, Vec<(&Key, Until)>> = BTreeMap::new();
        let mut epochs: BTreeMap<&Namespace, Option<String>> = BTreeMap::new();
        let mut left_out: BTreeSet<&Namespace> = BTreeSet::new();
        for ((ns, key), s) in series {
            let Some(until) = s.until else { continue };
            let members = index.entry(ns).or_default();
            let epoch = epochs
                .entry(ns)
                .or_insert_with(|| trust.then(|| self.listed.epoch(ns)).flatten());
            if let Some(epoch) = epoch
                && self.listed.covers(ns, key, until, now, epoch)
            {
                left_out.insert(ns);
            } else {
                members.push((key, until));
            }
        }
        let check = |ns: &Namespace| {
            let expected = match epochs.get(ns) {
                Some(Some(epoch)) if left_out.contains(ns) => epoch.clone(),
                _ => "-".into(),
            };
            (self.batch_ids.fresh(), expected)
        };
        let with_data = || series.values().filter(|s| !s.hashes.is_empty());
        // A marker is named after the first series of the batch (of its slot, in a
        // cluster) whether or not a tier keeps its events now: a retry later, when one
        // fewer series has data, must find the marker the first try set.

        if !self.is_cluster() {
            // One call, all or nothing. Under an idempotency key its marker is the key's
            // claim (whatever the batch writes: another request under the key may write
            // other series, or nothing, as a refusal): set by another request, `claimed`.
            let marker = match (&batch.idempotency, claim) {
                (Some(r), Some(fingerprint)) => Some(Marker {
                    key: layout::claim_key(&r.key),
                    secs: marker_secs,
                    token: fingerprint.to_owned(),
                    now,
                }),
                _ => series
                    .values()
                    .next()
                    .filter(|_| with_data().next().is_some())
                    .map(|s| Marker {
                        key: layout::marker_key(&s.tag, id),
                        secs: marker_secs,
                        token: "-".into(),
                        now,
                    }),
            };
            let mut call = new_call(marker);
            if let Some(f) = fence {
                call.fenced(f);
            }
            for (ns, members) in &index {
                call.index(ns, members, (self.index_page, now), check(ns));
                call.extent(ns, extents.get(*ns));
            }
            with_data().for_each(|s| call.series(s));
            if let Some(r) = &batch.idempotency {
                call.record(r)?;
            }
            return Ok(vec![vec![call]]);
        }

        let indexes = index
            .iter()
            .map(|(ns, members)| {
                let mut c = new_call(None);
                c.index(ns, members, (self.index_page, now), check(ns));
                c.extent(ns, extents.get(*ns));
                c
            })
            .collect();
        // Redis hashes only the tag, so the tag's slot is that of every key of the series.
        let mut first: HashMap<Slot, &str> = HashMap::new();
        for s in series.values() {
            first.entry(Slot::for_key(&s.tag)).or_insert(&s.tag);
        }
        let mut slots: HashMap<Slot, Call> = HashMap::new();
        for s in with_data() {
            let slot = Slot::for_key(&s.tag);
            slots
                .entry(slot)
                .or_insert_with(|| {
                    // Any apply's marker means done here: the claim (below) decided whose
                    // the batch is, and a holder that died may have applied some slots.
                    let mut c = new_call(Some(Marker {
                        key: layout::marker_key(first.get(&slot).copied().unwrap_or(&s.tag), id),
                        secs: marker_secs,
                        token: "-".into(),
                        now,
                    }));
                    // The lock is in the slot of the series it guards (`layout::lock_key`).
                    if let Some(f) = fence.filter(|f| Slot::for_key(&f.lock) == slot) {
                        c.fenced(f);
                    }
                    c
                })
                .series(s);
        }
        let mut steps = vec![indexes, slots.into_values().collect()];
        // First of all, a batch under an idempotency key claims it for its request, as long
        // as the answer is kept: a different request under the key (on any tally server,
        // now or after a failure part-way) is `claimed` before it changes anything.
        if let (Some(r), Some(fingerprint)) = (&batch.idempotency, claim) {
            steps.insert(
                0,
                vec![new_call(Some(Marker {
                    key: layout::claim_key(&r.key),
                    secs: marker_secs,
                    token: fingerprint.to_owned(),
                    now,
                }))],
            );
        }
        if let Some(r) = &batch.idempotency {
            let mut c = new_call(None);
            c.record(r)?;
            steps.push(vec![c]);
        }
        Ok(steps)
    }

    /// In a cluster, gives up the claim of an idempotency key (if this request still holds
    /// it) after a failure that applied no series — a stale epoch, a lost lock — so that
    /// the key is free again, as on a single server, where nothing was set. Best effort: a
    /// claim left makes a different request under the key `claimed` until it ends.
    /// Counts the answer `r` will store against `[limits] max_idempotency_keys` (and, with
    /// tokens, `max_idempotency_keys_per_token`), or refuses the batch before anything is
    /// applied once a bound is reached. Redis holds the answers until they expire, so
    /// without a bound a client sending a fresh key with every request would fill it.
    ///
    /// Counted by the hour an answer is stored in, over the last 25 hours: an answer lives
    /// 24 h, so the count is never below what Redis holds (it may be above by an hour's
    /// answers, and by answers of requests that then failed). A key is counted once
    /// (`layout::counted_key`, in its scope's slot, or the whole count's without tokens):
    /// a retry of a failed request under the same key, which must be able to finish what
    /// the first attempt left, is never refused for it. Servers sharing a Redis share the
    /// count.
    async fn count_answer(&self, r: &IdemRecord, now: i64) -> Result<(), StoreError> {
        const UNCOUNT: &str = "if redis.call('DEL', KEYS[2]) == 1 then \
             redis.call('HINCRBY', KEYS[1], ARGV[1], -1) end return 0";
        let (all, per_scope) = self.answer_bounds;
        let hour = now.div_euclid(3600);
        let hash_expires = (hour + 26) * 3600;
        let count = |answers: String, max: usize, mark: bool| {
            let counted = layout::counted_key(&answers, &r.key);
            async move {
                let got: i64 = self
                    .retry(|mut c| {
                        let mut call = scripts::COUNT_ANSWER.key(&answers);
                        if mark {
                            call.key(&counted);
                        }
                        call.arg(hour)
                            .arg(max)
                            .arg(hash_expires)
                            .arg(r.expires.max(now + 1));
                        async move { call.invoke_async(&mut c).await }
                    })
                    .await?;
                Ok::<i64, StoreError>(got)
            }
        };
        let full = |held: i64, what: &str, key: &str| {
            StoreError::unavailable(format!(
                "{what}{held} idempotency answers were stored in the last day, the most \
                 [limits] {key} allows; each is kept 24 h: retry later, or send without an \
                 Idempotency-Key"
            ))
        };
        if let Some(max) = per_scope {
            let scope = r.key.split_once(':').map_or("", |(s, _)| s);
            match count(layout::answers_key(Some(scope)), max, true).await? {
                -2 => return Ok(()),
                -1 => {}
                held => {
                    return Err(full(
                        held,
                        "this token's ",
                        "max_idempotency_keys_per_token",
                    ));
                }
            }
            match count(layout::answers_key(None), all, false).await? {
                held if held >= 0 => {
                    // Not counted after all: a retry under the key is checked again.
                    let answers = layout::answers_key(Some(scope));
                    let counted = layout::counted_key(&answers, &r.key);
                    let undone: Result<(), StoreError> = self
                        .retry(|mut c| {
                            let (answers, counted) = (&answers, &counted);
                            async move {
                                redis::cmd("EVAL")
                                    .arg(UNCOUNT)
                                    .arg(2)
                                    .arg(answers)
                                    .arg(counted)
                                    .arg(hour)
                                    .exec_async(&mut c)
                                    .await
                            }
                        })
                        .await;
                    if let Err(e) = undone {
                        tracing::warn!(error = %e.detail(), "an idempotency answer refused was left counted for its token");
                    }
                    Err(full(held, "", "max_idempotency_keys"))
                }
                _ => Ok(()),
            }
        } else {
            match count(layout::answers_key(None), all, true).await? {
                held if held >= 0 => Err(full(held, "", "max_idempotency_keys")),
                _ => Ok(()),
            }
        }
    }

    async fn release_claim(&self, batch: &Batch, claim: Option<&str>) {
        const RELEASE: &str = "local v = redis.call('GET', KEYS[1]) \
             if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '@' then \
             return redis.call('DEL', KEYS[1]) end return 0";
        let (Some(r), Some(fingerprint), true) = (&batch.idempotency, claim, self.is_cluster())
        else {
            return;
        };
        let key = layout::claim_key(&r.key);
        let done: Result<(), StoreError> = self
            .retry(|mut c| {
                let key = &key;
                async move {
                    redis::cmd("EVAL")
                        .arg(RELEASE)
                        .arg(1)
                        .arg(key)
                        .arg(fingerprint)
                        .exec_async(&mut c)
                        .await
                }
            })
            .await;
        if let Err(e) = done {
            tracing::warn!(error = %e.detail(), "an idempotency claim was not given up");
        }
    }

    /// In a cluster a batch leaves a marker in every slot it wrote (thousands for a large
    /// batch), kept for its retries: once it is applied whole they are let go ([`Tidy`]), or
    /// Redis would hold millions of them at a steady ingest. A single server's batch of a
    /// random id leaves one, deleted too: a limited `incr` is a batch of one event, and at
    /// 10 000 a second their markers held ~1.5 GB for their 600 s (found by an independent
    /// review). Best effort: a marker left still expires.
    async fn tidy_markers(&self, markers: Vec<String>, after: Tidy) {
        let done = join_all(markers.iter().map(|m| {
            let mut conn = self.conn();
            async move {
                let mut cmd = match after {
                    Tidy::Keep => return Ok(()),
                    Tidy::Delete => redis::cmd("UNLINK"),
                    Tidy::Shorten => redis::cmd("EXPIRE"),
                };
                cmd.arg(m);
                if after == Tidy::Shorten {
                    cmd.arg(MARKER_AFTER_SECS).arg("LT");
                }
                cmd.exec_async(&mut conn).await
            }
        }))
        .await;
        if let Some(Err(e)) = done.into_iter().find(Result::is_err) {
            tracing::debug!(error = %e, "batch markers not let go; they expire on their own");
        }
    }

    /// Runs the calls of [`RedisStore::index_and_series`], a step at a time (each step's
    /// calls all in flight at once), and notes the keys each index operation listed. Stops
    /// at a step where an epoch check failed (that call changed nothing).
    ///
    /// `record`: in a cluster, the idempotency record a batch under a key writes last. When
    /// the first step (the claim) finds the key claimed by this same request, the record is
    /// looked for: there, the batch was applied whole (by a retry racing this one, on
    /// another tally server, whose markers may be gone by now) and nothing more is done.
    async fn run_apply(
        &self,
        steps: Vec<Vec<Call>>,
        record: Option<String>,
    ) -> Result<Outcome, StoreError> {
        for (step, calls) in steps.into_iter().enumerate() {
            let calls: Vec<Call> = calls.into_iter().filter(|c| !c.is_empty()).collect();
            let replies = self.run(&calls).await.map_err(maybe_applied)?;
            let (mut stale, mut fenced, mut claimed) = (false, false, false);
            if step == 0
                && let Some(record) = &record
                && replies.iter().any(|(status, _)| status == "done")
            {
                let whole: bool = self
                    .retry(|mut c| async move {
                        redis::cmd("EXISTS").arg(record).query_async(&mut c).await
                    })
                    .await?;
                if whole {
                    return Ok(Outcome::Applied);
                }
            }
            for (call, reply) in calls.iter().zip(replies) {
                let (status, epochs) = reply;
                stale |= status == "stale";
                fenced |= status == "fenced";
                claimed |= status == "claimed";
                // Only a call that ran its index operations listed keys: `done` (its marker
                // was there) may be another batch under a reused id.
                if status != "applied" {
                    continue;
                }
                for ((ns, members), epoch) in call.sent.iter().zip(&epochs) {
                    self.listed
                        .note(ns, epoch, members.iter().map(|(k, u)| (k, *u)));
                }
            }
            if claimed {
                return Ok(Outcome::Claimed);
            }
            if fenced {
                return Ok(Outcome::Fenced);
            }
            if stale {
                return Ok(Outcome::Stale);
            }
        }
        Ok(Outcome::Applied)
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
    /// Each answers its status and the key index epochs it checked (`APPLY`).
    async fn run(&self, calls: &[Call]) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let results = join_all(calls.iter().map(|call| {
            self.retry(move |mut c| async move {
                let mut inv = scripts::APPLY.prepare_invoke();
                for k in &call.keys {
                    inv.key(k);
                }
                inv.arg(&call.head)
                    .arg(&call.token)
                    .arg(&call.ends)
                    .arg(&call.now)
                    .arg(&call.fence.0)
                    .arg(&call.fence.1)
                    .arg(call.checks.len() / 3);
                for a in call.checks.iter().chain(&call.args) {
                    inv.arg(a);
                }
                inv.invoke_async::<Vec<String>>(&mut c).await
            })
        }))
        .await;
        results
            .into_iter()
            .map(|r| {
                let mut reply = r?.into_iter();
                let status = reply.next().unwrap_or_default();
                Ok((status, reply.collect()))
            })
            .collect()
    }
}

/// A failure of a batch's script calls: some may have run (other nodes' calls, or one whose
/// answer was lost to a timeout), so the client is told what a retry must carry, rather
/// than left to retry without a key and count the applied part twice.
/// How long a write may take in all (its calls and their retries) before it gives up.
pub(crate) const WRITE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

fn maybe_applied(e: StoreError) -> StoreError {
    e.noted(
        "; the batch may have been applied in part or whole: only a retry with the same \
         Idempotency-Key counts it exactly once",
    )
}

/// What becomes of a cluster batch's markers once it is applied whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tidy {
    /// A random id: no retry of it can come any more. Deleted.
    Delete,
    /// An idempotency key: its record now answers a retry, but the same request may be
    /// being applied by another tally server right now (its look-up raced the record):
    /// kept `MARKER_AFTER_SECS` more.
    Shorten,
    /// A caller's id ([`RedisStore::apply_with_batch_id`]): the caller may send it again,
    /// having lost the answer. Kept their whole life.
    Keep,
}

/// How a batch's calls went.
enum Outcome {
    Applied,
    /// A key index's epoch was not the one expected: nothing was applied.
    Stale,
    /// A different request used the batch's idempotency key: nothing was applied.
    Claimed,
    /// The batch's lock had changed hands: its series were not applied (only key index
    /// entries, harmless, may have been).
    Fenced,
}

/// A batch marker (`layout::marker_key`) or idempotency claim (`layout::claim_key`): the key,
/// its lifetime in seconds, and the token it is set to: the request's fingerprint, or `-`
/// (any marker is this batch's).
#[derive(Debug)]
struct Marker {
    key: String,
    secs: i64,
    token: String,
    /// Now by the store's clock: the marker ends `secs` later by it.
    now: i64,
}

/// A lock (`layout::lock_key`) and the token its holder set: a write under it is applied
/// only if the lock still holds the token (a lease that expired may have been taken).
#[derive(Debug)]
pub(crate) struct Fence {
    pub lock: String,
    pub token: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_keys_are_trusted_only_as_far_as_the_index_keeps_them() {
        let listed = Listed::default();
        let (ns, other) = (Namespace::new("m").unwrap(), Namespace::new("n").unwrap());
        let (a, b) = (Key::new("a").unwrap(), Key::new("b").unwrap());
        let now = 1_000_000;
        let later = Until::At(now + 2 * LISTED_MARGIN);
        let covers =
            |ns: &Namespace, k: &Key, u: Until, now: i64| listed.covers(ns, k, u, now, "e1");
        assert!(!covers(&ns, &a, later, now), "never listed");
        assert_eq!(listed.epoch(&ns), None);
        listed.note(&ns, "e1", [(&a, later), (&b, Until::Never)].into_iter());
        assert_eq!(listed.epoch(&ns).as_deref(), Some("e1"));
        assert!(covers(&ns, &a, later, now));
        assert!(covers(&ns, &a, Until::At(now), now), "an earlier expiry");
        assert!(
            !covers(&ns, &a, Until::At(now + 3 * LISTED_MARGIN), now),
            "a later expiry is sent, to grow the index's"
        );
        assert!(!covers(&ns, &a, Until::Never, now));
        assert!(
            !covers(&ns, &a, later, now + LISTED_MARGIN),
            "an expiry within the margin may be pruned by a server whose clock is ahead"
        );
        assert!(covers(&ns, &b, later, now + 100 * LISTED_MARGIN));
        assert!(covers(&ns, &b, Until::Never, now));
        assert!(!covers(&other, &a, later, now), "per namespace");
        assert!(
            !listed.covers(&ns, &a, later, now, "e0"),
            "not trusted under an epoch the call would not check"
        );
        // Noting an earlier expiry keeps the later one the index holds.
        listed.note(&ns, "e1", [(&a, Until::At(now))].into_iter());
        assert!(covers(&ns, &a, later, now));
        // Another epoch: what was listed before is forgotten.
        listed.note(&ns, "e2", [(&a, later)].into_iter());
        assert!(listed.covers(&ns, &a, later, now, "e2"));
        assert!(!listed.covers(&ns, &b, later, now, "e2"));
        assert!(!covers(&ns, &a, later, now));
        listed.forget();
        assert!(!listed.covers(&ns, &a, later, now, "e2"));
        assert_eq!(listed.epoch(&ns), None);
    }

    #[test]
    fn listed_keys_are_bounded_across_namespaces() {
        let listed = Listed::default();
        let (ns, other) = (Namespace::new("m").unwrap(), Namespace::new("n").unwrap());
        let keys: Vec<Key> = (0..LISTED_MAX + 10)
            .map(|i| Key::new(&format!("k{i}")).unwrap())
            .collect();
        listed.note(&other, "e", keys[..10].iter().map(|k| (k, Until::Never)));
        listed.note(&ns, "e", keys.iter().map(|k| (k, Until::Never)));
        let held = listed.lock().len;
        assert!(held <= LISTED_MAX, "{held}");
        assert_eq!(
            held,
            listed
                .lock()
                .by_ns
                .values()
                .map(|m| m.keys.len())
                .sum::<usize>()
        );
        assert!(listed.covers(&ns, keys.last().unwrap(), Until::Never, 0, "e"));
        assert!(
            !listed.covers(&ns, &keys[0], Until::Never, 0, "e"),
            "forgotten when full"
        );
        assert!(
            !listed.covers(&other, &keys[0], Until::Never, 0, "e"),
            "every namespace's, when none is too old"
        );
    }
}

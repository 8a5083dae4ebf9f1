//! From raw events to a validated [`Batch`]: every rule of SPEC §1, the allow-lists, the
//! `[limits]`, and auto-creation of namespaces from `[defaults]`. All or nothing: the first
//! bad event fails the whole batch and is named by its index.

use std::collections::BTreeMap;

use crate::error::ErrorCode;
use crate::model::{Event, ModelError, Namespace, RawEvent, Schema};
use crate::store::{Batch, Increment, Store, StoreError};

/// `[limits]` of the config file, with the SPEC's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_batch_events: usize,
    pub max_points: usize,
    pub max_future_secs: i64,
    /// Namespaces in all, the config file's included: a write or `PUT` that would make one
    /// more is `too_many_namespaces` (the config file's are made whatever it says).
    pub max_namespaces: usize,
    /// Counter updates one batch may make: an event makes one per tier of its namespace and
    /// one per subtotal in each breakdown tier, so a schema of many tiers and compounds
    /// makes a batch of small events cost far more than its bytes say.
    pub max_batch_updates: usize,
    /// Bytes of dimension values one answer (or one `POST /v1/query`'s answers together)
    /// may hold: `max_points` counts values, and a value may be 2 KB.
    pub max_answer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 * 1024 * 1024,
            max_batch_events: 100_000,
            max_points: 100_000,
            max_future_secs: 3600,
            max_namespaces: 10_000,
            max_batch_updates: 4_000_000,
            max_answer_bytes: 64 * 1024 * 1024,
        }
    }
}

/// `[defaults]`: the schema of namespaces created on first write, and whether they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub schema: Schema,
    pub auto_create: bool,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            schema: Schema::default(),
            auto_create: true,
        }
    }
}

/// Why a batch was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    #[error("event {index}: {source}")]
    Event { index: usize, source: ModelError },
    #[error("event {index}: namespace {ns} does not exist (auto_create is off)")]
    UnknownNamespace { index: usize, ns: String },
    #[error("event {index}: {}", too_many_namespaces(ns, *max))]
    TooManyNamespaces {
        index: usize,
        ns: String,
        max: usize,
    },
    #[error("a batch holds at most {max} events, got {got}")]
    BatchTooLarge { got: usize, max: usize },
    #[error(
        "event {index}: the batch makes more than {max} counter updates by here (an event makes \
         one per tier of its namespace, and one per subtotal in each breakdown tier): send \
         fewer events a batch ([limits] max_batch_updates)"
    )]
    TooManyUpdates { index: usize, max: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IngestError {
    pub fn code(&self) -> ErrorCode {
        match self {
            IngestError::Event { source, .. } => source.code(),
            IngestError::UnknownNamespace { .. } => ErrorCode::UnknownNamespace,
            IngestError::TooManyNamespaces { .. } => ErrorCode::TooManyNamespaces,
            IngestError::BatchTooLarge { .. } | IngestError::TooManyUpdates { .. } => {
                ErrorCode::BatchTooLarge
            }
            IngestError::Store(e) => e.code(),
        }
    }

    /// The 0-based index of the event at fault.
    pub fn index(&self) -> Option<usize> {
        match self {
            IngestError::Event { index, .. }
            | IngestError::UnknownNamespace { index, .. }
            | IngestError::TooManyNamespaces { index, .. }
            | IngestError::TooManyUpdates { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// Why namespace `ns` is not created: there are `max` namespaces already.
pub fn too_many_namespaces(ns: &str, max: usize) -> String {
    format!("namespace {ns} would be one too many: [limits] max_namespaces allows {max}")
}

/// Validates `raws` against the namespaces in `store` (creating missing ones per
/// `defaults`, in the batch itself so a refused batch creates nothing).
pub fn prepare(
    store: &dyn Store,
    raws: &[RawEvent],
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
) -> Result<Batch, IngestError> {
    prepare_owned(store, raws.to_vec(), now, limits, defaults)
}

/// As [`prepare`], taking the events by value so their strings move into the batch.
pub fn prepare_owned(
    store: &dyn Store,
    raws: Vec<RawEvent>,
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
) -> Result<Batch, IngestError> {
    if raws.len() > limits.max_batch_events {
        return Err(IngestError::BatchTooLarge {
            got: raws.len(),
            max: limits.max_batch_events,
        });
    }
    let mut p = Preparer::new(store, now, limits, defaults, raws.len());
    for (index, raw) in raws.into_iter().enumerate() {
        p.one(index, raw)?;
    }
    Ok(p.batch)
}

/// As [`prepare_owned`], but each event on its own: one that breaks a rule is handed to
/// `bad` and left out, and the batch holds the others (StatsD's lines). Each namespace's
/// schema is read once for the whole list. Only a store failure fails it all.
pub fn prepare_each(
    store: &dyn Store,
    raws: Vec<RawEvent>,
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
    bad: &mut dyn FnMut(usize, IngestError),
) -> Result<Batch, StoreError> {
    let mut p = Preparer::new(store, now, limits, defaults, raws.len());
    for (index, raw) in raws.into_iter().enumerate() {
        match p.one(index, raw) {
            Ok(()) => {}
            Err(IngestError::Store(e)) => return Err(e),
            Err(e) => bad(index, e),
        }
    }
    Ok(p.batch)
}

/// A prepared batch's namespaces to create, held to `[limits] max_namespaces` against the
/// store as it is now and the creations `pending` elsewhere (batches checked and not yet
/// applied, each name with how many hold it): see [`sort_creations`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Creations {
    /// New now, and within the limit: the caller reserves them until they are applied.
    pub new: Vec<Namespace>,
    /// Being created by another batch too: the caller holds them as well, so that they keep
    /// their place if that batch gives them back unmade.
    pub shared: Vec<Namespace>,
    /// New now, and past the limit, in the batch's order.
    pub over: Vec<Namespace>,
}

/// Sorts a prepared batch's creations (see [`Creations`]): a namespace that exists now is
/// none of them. A server calls it in its one turn to create namespaces, since batches
/// prepared at once each saw room for their own. A few names with none pending are looked
/// up one by one; else every namespace is read at once. A pending name may be in the store
/// already (applied, not yet given back): it counts once.
pub fn sort_creations(
    store: &dyn Store,
    batch: &Batch,
    pending: &std::collections::HashMap<Namespace, usize>,
    limits: &Limits,
) -> Result<Creations, StoreError> {
    let mut out = Creations::default();
    if batch.create.is_empty() {
        return Ok(out);
    }
    // With creations pending, one read of every namespace: a snapshot. Looked up one by
    // one, a pending batch could store its names between the count and their look-up
    // (applies run outside the turn) and they would count zero times: a race test let
    // three batches of two namespaces in under a limit of four on Redis.
    let all: Option<std::collections::HashSet<Namespace>> =
        match batch.create.len() <= 32 && pending.is_empty() {
            true => None,
            false => Some(store.namespaces()?.into_iter().map(|(ns, _)| ns).collect()),
        };
    let stored = |ns: &Namespace| -> Result<bool, StoreError> {
        match &all {
            Some(all) => Ok(all.contains(ns)),
            None => Ok(store.schema(ns)?.is_some()),
        }
    };
    let mut count = match &all {
        Some(all) => all.len(),
        None => store.namespace_count()?,
    };
    for ns in pending.keys() {
        if !stored(ns)? {
            count += 1;
        }
    }
    for (ns, _) in &batch.create {
        if stored(ns)? {
            continue;
        }
        if pending.contains_key(ns) {
            out.shared.push(ns.clone());
        } else if count >= limits.max_namespaces {
            out.over.push(ns.clone());
        } else {
            count += 1;
            out.new.push(ns.clone());
        }
    }
    Ok(out)
}

/// The refusal of a batch that would create `ns` past `max`, naming its first event.
pub fn refuse_creation(batch: &Batch, ns: &Namespace, max: usize) -> IngestError {
    IngestError::TooManyNamespaces {
        index: batch
            .increments
            .iter()
            .position(|i| &i.ns == ns)
            .unwrap_or(0),
        ns: ns.to_string(),
        max,
    }
}

/// Takes out of `batch` what it would write to the namespaces of `over` (and their
/// creation): the increments taken, in order.
pub fn without_namespaces(batch: &mut Batch, over: &[Namespace]) -> Vec<Increment> {
    batch.create.retain(|(ns, _)| !over.contains(ns));
    let (out, keep) = std::mem::take(&mut batch.increments)
        .into_iter()
        .partition(|i| over.contains(&i.ns));
    batch.increments = keep;
    out
}

/// A batch being validated: the schemas read so far (`None`: the namespace does not exist
/// and is not created), the namespaces to create once one of their events passes, and the
/// batch (with the namespaces it creates). How many namespaces exist is asked once, when
/// the batch first creates one.
struct Preparer<'a> {
    store: &'a dyn Store,
    now: i64,
    limits: &'a Limits,
    defaults: &'a Defaults,
    schemas: BTreeMap<Namespace, Option<Schema>>,
    to_create: std::collections::BTreeSet<Namespace>,
    existing: Option<usize>,
    /// Counter updates the batch's events make so far (see [`Limits::max_batch_updates`]).
    updates: usize,
    batch: Batch,
}

impl<'a> Preparer<'a> {
    fn new(
        store: &'a dyn Store,
        now: i64,
        limits: &'a Limits,
        defaults: &'a Defaults,
        events: usize,
    ) -> Self {
        let mut batch = Batch::default();
        batch.increments.reserve(events);
        Preparer {
            store,
            now,
            limits,
            defaults,
            schemas: BTreeMap::new(),
            to_create: Default::default(),
            existing: None,
            updates: 0,
            batch,
        }
    }

    /// Validates one event and adds it to the batch (else changes nothing).
    fn one(&mut self, index: usize, raw: RawEvent) -> Result<(), IngestError> {
        let at = |source| IngestError::Event { index, source };
        let event =
            Event::validate_owned(raw, self.now, self.limits.max_future_secs).map_err(at)?;
        if !self.schemas.contains_key(&event.ns) {
            let schema = match self.store.schema(&event.ns)? {
                Some(s) => Some(s),
                None if self.defaults.auto_create => {
                    self.to_create.insert(event.ns.clone());
                    Some(self.defaults.schema.clone())
                }
                None => None,
            };
            self.schemas.insert(event.ns.clone(), schema);
        }
        let (subtotals, updates) = match self.schemas.get(&event.ns) {
            Some(Some(schema)) => {
                let subtotals = schema.subtotals_owned(event.dims).map_err(at)?;
                let updates =
                    schema.tiers().len() + schema.breakdown_resolutions().len() * subtotals.len();
                (subtotals, updates)
            }
            _ => {
                return Err(IngestError::UnknownNamespace {
                    index,
                    ns: event.ns.to_string(),
                });
            }
        };
        let max = self.limits.max_batch_updates;
        if self.updates.saturating_add(updates) > max {
            return Err(IngestError::TooManyUpdates { index, max });
        }
        // A namespace is created by the batch only with an event of it that passed, and
        // only within `max_namespaces` (each later event of a refused one is refused too).
        if self.to_create.contains(&event.ns) {
            let existing = match self.existing {
                Some(n) => n,
                None => *self.existing.insert(self.store.namespace_count()?),
            };
            let max = self.limits.max_namespaces;
            if existing.saturating_add(self.batch.create.len()) >= max {
                return Err(IngestError::TooManyNamespaces {
                    index,
                    ns: event.ns.to_string(),
                    max,
                });
            }
            self.to_create.remove(&event.ns);
            self.batch
                .create
                .push((event.ns.clone(), self.defaults.schema.clone()));
        }
        self.updates += updates;
        self.batch.increments.push(Increment {
            ns: event.ns,
            key: event.key,
            ts: event.ts,
            n: event.n,
            subtotals,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::reference::MemStore;
    use crate::store::{IdemRecord, KeyData, KeyList, KeyRead, Scan};

    /// A store that counts schema reads, and fails them for namespace `down`.
    struct Counting {
        inner: MemStore,
        reads: AtomicUsize,
    }

    impl Store for Counting {
        fn namespaces(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
            self.inner.namespaces()
        }
        fn schema(&self, ns: &Namespace) -> Result<Option<Schema>, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if ns.as_str() == "down" {
                return Err(StoreError::unavailable("down"));
            }
            self.inner.schema(ns)
        }
        fn put_schema(&self, ns: &Namespace, schema: &Schema) -> Result<(), StoreError> {
            self.inner.put_schema(ns, schema)
        }
        fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
            self.inner.apply(batch)
        }
        fn apply_if(
            &self,
            batch: &Batch,
            window: &KeyRead<'_>,
            decide: &mut dyn FnMut(
                &crate::store::Buckets,
            ) -> Result<crate::store::Decision, StoreError>,
        ) -> Result<bool, StoreError> {
            self.inner.apply_if(batch, window, decide)
        }
        fn read(&self, reads: &[KeyRead<'_>]) -> Result<Vec<KeyData>, StoreError> {
            self.inner.read(reads)
        }
        fn keys(&self, list: &KeyList<'_>) -> Result<Vec<crate::model::Key>, StoreError> {
            self.inner.keys(list)
        }
        fn scan(
            &self,
            scan: &Scan<'_>,
            visit: &mut dyn FnMut(&crate::model::Key, i64),
        ) -> Result<(), StoreError> {
            self.inner.scan(scan, visit)
        }
        fn idempotency(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
            self.inner.idempotency(key)
        }
    }

    fn raw(ns: &str, key: &str) -> RawEvent {
        RawEvent {
            ns: ns.into(),
            key: key.into(),
            ts: Some(1000),
            n: Some(1),
            dims: Default::default(),
        }
    }

    /// StatsD validates each line alone: a namespace's schema is still read once per batch
    /// (on Redis each read is a round trip), a missing one included.
    #[test]
    fn each_event_alone_reads_each_schema_once() {
        let store = Counting {
            inner: MemStore::new(std::sync::Arc::new(crate::store::SystemClock)),
            reads: AtomicUsize::new(0),
        };
        let mut raws: Vec<RawEvent> = (0..2000).map(|i| raw("s", &format!("k{i}"))).collect();
        raws.push(raw("Bad Name", "k"));
        raws.extend((0..100).map(|_| raw("t", "k")));
        let off = Defaults {
            auto_create: false,
            ..Defaults::default()
        };
        let mut bad = Vec::new();
        let b = prepare_each(
            &store,
            raws.clone(),
            1000,
            &Limits::default(),
            &off,
            &mut |i, e| bad.push((i, e.code())),
        )
        .unwrap();
        assert_eq!(store.reads.load(Ordering::SeqCst), 2);
        assert!(b.increments.is_empty());
        assert_eq!(bad.len(), 2101);
        assert_eq!(bad[2000], (2000, ErrorCode::InvalidName));
        assert_eq!(bad[2001].1, ErrorCode::UnknownNamespace);
        // Created by the batch: read once, created once, every good event kept; a namespace
        // none of whose events passed is not created.
        raws.push(RawEvent {
            dims: vec![("device".into(), "x".into())],
            ..raw("u", "k")
        });
        // Namespaces made with an allow-list of dimensions: `u`'s one event is refused.
        let strict = Defaults {
            schema: Schema::from_doc(&crate::model::SchemaDoc {
                tiers: vec!["1h:forever".into()],
                breakdown_tiers: None,
                dimensions: Some(vec!["country".into()]),
            })
            .unwrap(),
            ..Defaults::default()
        };
        store.reads.store(0, Ordering::SeqCst);
        let b = prepare_each(
            &store,
            raws,
            1000,
            &Limits::default(),
            &strict,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(store.reads.load(Ordering::SeqCst), 3);
        assert_eq!(b.create.len(), 2, "{:?}", b.create);
        assert_eq!(b.increments.len(), 2100);
        // A store failure fails the whole list.
        let e = prepare_each(
            &store,
            vec![raw("down", "k")],
            1000,
            &Limits::default(),
            &Defaults::default(),
            &mut |_, _| {},
        );
        assert!(matches!(e, Err(StoreError::Unavailable { .. })));
    }

    /// A batch creates namespaces only up to `max_namespaces`: the event that would make one
    /// too many is named, a refused namespace's later events are refused too, and writes to
    /// namespaces that exist go on. `sort_creations` holds a batch prepared earlier to the
    /// store as it is now.
    #[test]
    fn namespaces_are_created_up_to_the_limit() {
        let store = MemStore::new(std::sync::Arc::new(crate::store::SystemClock));
        let limits = Limits {
            max_namespaces: 2,
            ..Limits::default()
        };
        let d = Defaults::default();
        let b = prepare(&store, &[raw("a", "k"), raw("a", "j")], 1000, &limits, &d).unwrap();
        store.apply(&b).unwrap();
        let e = prepare(
            &store,
            &[raw("a", "k"), raw("b", "k"), raw("a", "k"), raw("c", "k")],
            1000,
            &limits,
            &d,
        )
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::TooManyNamespaces);
        assert_eq!(e.index(), Some(3));
        assert!(e.to_string().contains("namespace c"), "{e}");
        assert!(e.to_string().contains("max_namespaces"), "{e}");
        // Each line alone: `c`'s events are dropped, the others kept.
        let mut bad = Vec::new();
        let b = prepare_each(
            &store,
            vec![raw("c", "k"), raw("b", "k"), raw("c", "j"), raw("a", "k")],
            1000,
            &limits,
            &d,
            &mut |i, e| bad.push((i, e.code())),
        )
        .unwrap();
        assert_eq!(
            bad,
            [(1, ErrorCode::TooManyNamespaces)],
            "the first new namespace takes the last place"
        );
        assert_eq!(b.increments.len(), 3);
        assert_eq!(b.create.len(), 1);
        // Prepared in room, then another batch took the room first.
        let none = std::collections::HashMap::new();
        let late = prepare(&store, &[raw("a", "k"), raw("d", "k")], 1000, &limits, &d).unwrap();
        let sorted = sort_creations(&store, &late, &none, &limits).unwrap();
        assert_eq!(sorted.new, [Namespace::new("d").unwrap()]);
        store.apply(&b).unwrap();
        let sorted = sort_creations(&store, &late, &none, &limits).unwrap();
        assert_eq!((sorted.new.len(), sorted.over.len()), (0, 1));
        let e = refuse_creation(&late, &sorted.over[0], limits.max_namespaces);
        assert_eq!(
            (e.code(), e.index()),
            (ErrorCode::TooManyNamespaces, Some(1))
        );
        let mut trimmed = late.clone();
        let taken = without_namespaces(&mut trimmed, &sorted.over);
        assert_eq!((taken.len(), trimmed.increments.len()), (1, 1));
        assert!(trimmed.create.is_empty());
        // A batch prepared to create what another has created since is not held back, nor
        // one creating what another is creating now; a pending creation takes room.
        let again = Batch {
            create: vec![(Namespace::new("c").unwrap(), Schema::default())],
            ..Batch::default()
        };
        assert_eq!(
            sort_creations(&store, &again, &none, &limits).unwrap(),
            Creations::default()
        );
        let roomy = Limits {
            max_namespaces: 3,
            ..limits
        };
        let other = Batch {
            create: vec![(Namespace::new("b").unwrap(), Schema::default())],
            ..Batch::default()
        };
        let pending = |name: &str| -> std::collections::HashMap<Namespace, usize> {
            [(Namespace::new(name).unwrap(), 1)].into()
        };
        // Another batch creating `b` now: this one holds it too, whatever the room.
        let tight = Limits {
            max_namespaces: 2,
            ..limits
        };
        assert_eq!(
            sort_creations(&store, &other, &pending("b"), &tight).unwrap(),
            Creations {
                shared: vec![Namespace::new("b").unwrap()],
                ..Creations::default()
            }
        );
        let e_pending = pending("e");
        let sorted = sort_creations(&store, &other, &e_pending, &roomy).unwrap();
        assert_eq!(sorted.over, [Namespace::new("b").unwrap()]);
        // A pending creation already in the store (applied, not yet given back) is counted
        // once.
        let sorted = sort_creations(&store, &other, &pending("c"), &roomy).unwrap();
        assert_eq!(sorted.new, [Namespace::new("b").unwrap()]);
        // Many creations are sorted from one read of every namespace, alike.
        let many: Vec<RawEvent> = (0..40).map(|i| raw(&format!("n{i}"), "k")).collect();
        let many = prepare(&store, &many, 1000, &Limits::default(), &d).unwrap();
        let sorted = sort_creations(&store, &many, &e_pending, &roomy).unwrap();
        assert_eq!((sorted.new.len(), sorted.over.len()), (0, 40));
        let sorted = sort_creations(&store, &many, &none, &Limits::default()).unwrap();
        assert_eq!((sorted.new.len(), sorted.over.len()), (40, 0));
        assert!(prepare(&store, &[raw("c", "z")], 1000, &limits, &d).is_ok());
    }

    /// A batch is held to `max_batch_updates` counter updates: an event makes one per tier
    /// and one per subtotal in each breakdown tier. The event that passes it is named, and
    /// the store is not touched.
    #[test]
    fn a_batch_is_held_to_its_counter_updates() {
        let store = MemStore::new(std::sync::Arc::new(crate::store::SystemClock));
        let d = Defaults {
            // Three tiers, two keeping breakdowns.
            schema: Schema::from_doc(&crate::model::SchemaDoc {
                tiers: vec!["1m:2d".into(), "15m:30d".into(), "1h:forever".into()],
                breakdown_tiers: Some(vec!["15m".into(), "1h".into()]),
                dimensions: None,
            })
            .unwrap(),
            auto_create: true,
        };
        let event = |key: &str| RawEvent {
            dims: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
            ..raw("x", key)
        };
        // 3 + 2 x 2 = 7 updates an event: two fit in 20, a third does not.
        let limits = Limits {
            max_batch_updates: 20,
            ..Limits::default()
        };
        let two = prepare(&store, &[event("a"), event("b")], 1000, &limits, &d);
        assert_eq!(two.unwrap().increments.len(), 2);
        let e = prepare(
            &store,
            &[event("a"), event("b"), event("c")],
            1000,
            &limits,
            &d,
        )
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::BatchTooLarge);
        assert_eq!(e.index(), Some(2));
        assert!(e.to_string().contains("max_batch_updates"), "{e}");
        // An event without dimensions makes 3: it still fits after two.
        let small = prepare(
            &store,
            &[event("a"), event("b"), raw("x", "c")],
            1000,
            &limits,
            &d,
        );
        assert_eq!(small.unwrap().increments.len(), 3);
        assert!(store.namespaces().unwrap().is_empty());
    }

    #[test]
    fn default_schema_is_the_spec_default() {
        let d = Defaults::default();
        assert!(d.auto_create);
        assert_eq!(
            d.schema.to_doc().tiers,
            vec!["1m:2d".to_owned(), "1h:forever".to_owned()]
        );
    }
}

//! tally-redis' integration tests, in one binary. Each test starts its own `redis-server`
//! (or 3-master cluster) on free ports, through `tally_redis::testing`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod codes;
mod contexts;
mod equivalence;
mod extent;
mod faults;
mod idempotency;
mod index;
mod limited;
mod overflow;
mod retention;

use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Key, Namespace, RawEvent, Schema, SchemaDoc};
use tally_core::store::{Batch, KeyData, KeyRead, Store, Want};

/// Now, by the system clock.
pub fn real_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub fn raw(ns: &str, key: &str, ts: i64, n: i64, dims: &[(&str, &str)]) -> RawEvent {
    RawEvent {
        ns: ns.into(),
        key: key.into(),
        ts: Some(ts),
        n: Some(n),
        dims: dims
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
    }
}

pub fn schema(tiers: &[&str], breakdown: Option<&[&str]>) -> Schema {
    Schema::from_doc(&SchemaDoc {
        tiers: tiers.iter().map(|s| s.to_string()).collect(),
        breakdown_tiers: breakdown.map(|b| b.iter().map(|s| s.to_string()).collect()),
        dimensions: None,
    })
    .unwrap()
}

/// A validated batch of `raws`, as the server would prepare it against `store`.
pub fn batch(store: &dyn Store, now: i64, raws: &[RawEvent], defaults: &Defaults) -> Batch {
    ingest::prepare(store, raws, now, &Limits::default(), defaults).unwrap()
}

/// A Redis store on `url` and the reference store, sharing one clock stopped at now.
pub fn with_reference(
    url: &str,
) -> (
    tally_redis::RedisStore,
    tally_core::reference::MemStore,
    i64,
) {
    let now = real_now();
    let clock = std::sync::Arc::new(tally_core::store::ManualClock::new(now));
    let redis = tally_redis::RedisStore::connect_with_clock(url, clock.clone()).unwrap();
    (redis, tally_core::reference::MemStore::new(clock), now)
}

/// What a scan (a `top`) of `store` visits, sorted: a scan visits keys in no promised
/// order.
pub fn scanned(store: &dyn Store, scan: &tally_core::store::Scan<'_>) -> Vec<(Key, i64)> {
    let mut v = Vec::new();
    store
        .scan(scan, &mut |k, n| v.push((k.clone(), n)))
        .unwrap();
    v.sort();
    v
}

/// A store on `url` whose namespace `api` keeps `1m:48h` and `1h:forever`.
pub fn api_store(url: &str) -> tally_redis::RedisStore {
    let store = tally_redis::RedisStore::connect(url).unwrap();
    store
        .put_schema(
            &Namespace::new("api").unwrap(),
            &schema(&["1m:48h", "1h:forever"], None),
        )
        .unwrap();
    store
}

/// A key's minutes over the last hour: a limited increment's window.
pub fn last_hour<'a>(ns: &'a Namespace, key: &'a Key, now: i64) -> KeyRead<'a> {
    KeyRead {
        ns,
        key,
        resolution: tally_core::model::Duration::from_secs(60).unwrap(),
        from: now - 3600,
        to: now + 60,
        want: Want::Totals,
        sum_subtotals: false,
        keep: None,
    }
}

/// Every bucket of a key at one resolution, totals and all subtotals, sorted.
pub fn read_all(
    store: &dyn Store,
    ns: &str,
    key: &str,
    res_secs: u64,
) -> Result<KeyData, tally_core::store::StoreError> {
    let ns = Namespace::new(ns).unwrap();
    let key = Key::new(key).unwrap();
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: tally_core::model::Duration::from_secs(res_secs).unwrap(),
        from: 0,
        to: 1 << 33,
        want: Want::All,
        sum_subtotals: false,
        keep: None,
    };
    let mut d = store.read(&[read])?.pop().unwrap();
    d.subtotals
        .sort_by(|a, b| (&a.dim, &a.value).cmp(&(&b.dim, &b.value)));
    Ok(d)
}

/// The sum of a key's totals at one resolution.
pub fn total(store: &dyn Store, ns: &str, key: &str, res_secs: u64) -> i64 {
    read_all(store, ns, key, res_secs)
        .unwrap()
        .totals
        .iter()
        .map(|(_, n)| n)
        .sum()
}

//! Limited increments (`Store::apply_if`, issue 14) on Redis: two tally servers (two stores)
//! on one Redis, or on a cluster, hammering one key never get past the limit together.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tally_core::ingest::Defaults;
use tally_core::model::{Duration, Namespace};
use tally_core::query::{Limited, incr_limited};
use tally_core::store::Store;
use tally_redis::RedisStore;
use tally_redis::testing::{RedisCluster, RedisServer};

use crate::{api_store, batch, last_hour, raw, real_now, schema};

fn hammer(url: &str) {
    let stores: Vec<Arc<RedisStore>> = (0..2)
        .map(|_| Arc::new(RedisStore::connect(url).unwrap()))
        .collect();
    let ns = Namespace::new("api").unwrap();
    stores[0]
        .put_schema(&ns, &schema(&["1s:2h", "1m:48h", "1h:forever"], None))
        .unwrap();
    let (accepted, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = stores[t % 2].clone();
            let (accepted, refused) = (accepted.clone(), refused.clone());
            std::thread::spawn(move || {
                for _ in 0..40 {
                    let now = real_now();
                    let b = batch(
                        &*store,
                        now,
                        &[raw("api", "k", now, 1, &[])],
                        &Defaults::default(),
                    );
                    let last = Duration::from_secs(3600).unwrap();
                    match incr_limited(&*store, (now, false), &real_now, &b, last, 100, &mut |_| {
                        Ok(None)
                    })
                    .unwrap()
                    {
                        Some(Limited::Accepted(_)) => accepted.fetch_add(1, Ordering::SeqCst),
                        Some(Limited::Refused { .. }) => refused.fetch_add(1, Ordering::SeqCst),
                        // An hour's window on a 1m tier: never past the increment's bucket
                        // in the seconds a lock wait takes.
                        None => panic!("the window moved past the increment"),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        (
            accepted.load(Ordering::SeqCst),
            refused.load(Ordering::SeqCst)
        ),
        (100, 220)
    );
    let key = tally_core::model::Key::new("k").unwrap();
    let now = real_now();
    let read = tally_core::store::KeyRead {
        ns: &ns,
        key: &key,
        resolution: Duration::from_secs(1).unwrap(),
        from: now - 3600,
        to: now + 60,
        want: tally_core::store::Want::Totals,
        sum_subtotals: false,
        keep: None,
    };
    let total: i64 = stores[1].read(&[read]).unwrap()[0]
        .totals
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(total, 100);
}

#[test]
fn two_stores_on_one_redis_never_pass_the_limit_together() {
    let server = RedisServer::start();
    hammer(&server.url());
}

#[test]
fn two_stores_on_a_cluster_never_pass_the_limit_together() {
    let cluster = RedisCluster::start();
    hammer(&cluster.url());
}

/// The lock is a lease: if it expired while its holder stalled and another server took it,
/// the first holder's apply must change nothing (it decided on a count the other may change).
fn a_lost_lease_applies_nothing(url: &str, take: &dyn Fn(&str, &str)) {
    let store = api_store(url);
    let ns = Namespace::new("api").unwrap();
    let now = real_now();
    let b = batch(
        &store,
        now,
        &[raw("api", "k", now, 1, &[])],
        &Defaults::default(),
    );
    let key = tally_core::model::Key::new("k").unwrap();
    let window = last_hour(&ns, &key, now);
    let lock = tally_redis::layout::lock_key(&tally_redis::layout::series_tag(&ns, "k"));
    let decision = tally_core::store::Decision {
        apply: true,
        idempotency: None,
    };
    // Held throughout: applied.
    assert!(
        store
            .apply_if(&b, &window, &mut |_| Ok(decision.clone()))
            .unwrap()
    );
    // Taken by another holder between the decision and the apply.
    let err = store
        .apply_if(&b, &window, &mut |_| {
            take(&lock, "another-server");
            Ok(decision.clone())
        })
        .unwrap_err();
    assert!(
        matches!(err, tally_core::store::StoreError::Unavailable { .. }),
        "{err:?}"
    );
    assert_eq!(crate::total(&store, "api", "k", 60), 1);
    assert_eq!(crate::total(&store, "api", "k", 3600), 1);
    // The other holder's lock is left alone, and once it is gone writes go on.
    take(&lock, "");
    assert!(
        store
            .apply_if(&b, &window, &mut |_| Ok(decision.clone()))
            .unwrap()
    );
    assert_eq!(crate::total(&store, "api", "k", 60), 2);
}

#[test]
fn a_lost_lease_applies_nothing_on_one_redis() {
    let server = RedisServer::start();
    a_lost_lease_applies_nothing(&server.url(), &|lock, token| {
        let out = if token.is_empty() {
            server.cli(&["DEL", lock])
        } else {
            server.cli(&["SET", lock, token])
        };
        assert!(!out.contains("ERR"), "{out}");
    });
}

#[test]
fn a_lost_lease_applies_nothing_on_a_cluster() {
    let cluster = RedisCluster::start();
    a_lost_lease_applies_nothing(&cluster.url(), &|lock, token| {
        let out = if token.is_empty() {
            cluster.nodes[cluster.node_of(lock)].cli(&["DEL", lock])
        } else {
            cluster.nodes[cluster.node_of(lock)].cli(&["SET", lock, token])
        };
        assert!(!out.contains("ERR"), "{out}");
    });
}

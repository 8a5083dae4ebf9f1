//! One idempotency key on two tally servers (two stores) sharing one Redis or cluster: a
//! different request under the key applies nothing and is told so (`Claimed`, the server's
//! `422 idempotency_key_reused`), not answered as if its own batch were applied; the same
//! request again applies nothing twice.

use tally_core::ingest::Defaults;
use tally_core::model::Namespace;
use tally_core::store::{Batch, IdemRecord, Store, StoreError};
use tally_redis::RedisStore;
use tally_redis::testing::{RedisCluster, RedisServer};

use crate::{api_store, batch, last_hour, raw, real_now, schema, total};

/// A batch of `n` events to `a` and `n` to `b` (two slots in a cluster), under `key`.
fn under_key(store: &RedisStore, now: i64, key: &str, n: i64, body: &str) -> Batch {
    let mut b = batch(
        store,
        now,
        &[raw("api", "a", now, n, &[]), raw("api", "b", now, n, &[])],
        &Defaults::default(),
    );
    b.idempotency = Some(IdemRecord {
        key: key.into(),
        fingerprint: body.into(),
        expires: now + 86_400,
        status: 200,
        body: body.into(),
    });
    b
}

/// The batch markers every node of a cluster holds: (node, key).
fn batch_markers(cluster: &RedisCluster) -> Vec<(usize, String)> {
    let mut all = Vec::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let found = node.cli(&["--scan", "--pattern", "tally:batch:*"]);
        all.extend(
            found
                .lines()
                .filter(|l| !l.is_empty())
                .map(|m| (i, m.to_owned())),
        );
    }
    all
}

fn second_request_is_refused(url: &str) {
    let (one, two) = (api_store(url), RedisStore::connect(url).unwrap());
    let now = real_now();
    one.apply(&under_key(&one, now, "k1", 1, "first")).unwrap();
    // Another request under the same key, with another body, on another server.
    let err = two
        .apply(&under_key(&two, now, "k1", 5, "second"))
        .unwrap_err();
    assert!(matches!(err, StoreError::Claimed { .. }), "{err:?}");
    assert_eq!(err.code().as_str(), "idempotency_key_reused");
    for key in ["a", "b"] {
        assert_eq!(total(&one, "api", key, 60), 1, "{key}");
        assert_eq!(total(&one, "api", key, 3600), 1, "{key}");
    }
    assert_eq!(two.idempotency("k1").unwrap().unwrap().body, "first");
    // The same request, sent again to the other server (its look-up raced the first):
    // nothing applied twice.
    two.apply(&under_key(&two, now, "k1", 1, "first")).unwrap();
    assert_eq!(total(&one, "api", "a", 60), 1);
    // A different request under the key that writes other series only: refused too.
    let mut other = batch(
        &two,
        now,
        &[raw("api", "z", now, 4, &[])],
        &Defaults::default(),
    );
    other.idempotency = under_key(&two, now, "k1", 1, "third").idempotency;
    let err = two.apply(&other).unwrap_err();
    assert!(matches!(err, StoreError::Claimed { .. }), "{err:?}");
    assert_eq!(total(&one, "api", "z", 60), 0);
    // Other keys, and batches without one, go on.
    two.apply(&under_key(&two, now, "k2", 5, "other")).unwrap();
    assert_eq!(total(&one, "api", "a", 60), 6);
}

#[test]
fn a_second_request_under_a_key_applies_nothing_on_one_redis() {
    let server = RedisServer::start();
    second_request_is_refused(&server.url());
}

#[test]
fn a_second_request_under_a_key_applies_nothing_on_a_cluster() {
    let cluster = RedisCluster::start();
    second_request_is_refused(&cluster.url());
}

/// A cluster apply whose server failed part-way (here: after its series, before its
/// record): the same request sent again, to another server, finishes the batch without
/// applying again the slots that were; a different one under the key is refused.
#[test]
fn a_retry_after_a_failure_part_way_applies_each_slot_once() {
    let cluster = RedisCluster::start();
    let (one, two) = (
        api_store(&cluster.url()),
        RedisStore::connect(&cluster.url()).unwrap(),
    );
    let now = real_now();
    one.apply(&under_key(&one, now, "k", 2, "body")).unwrap();
    // The record never written.
    let name = tally_redis::layout::idem_key("k");
    let node = &cluster.nodes[cluster.node_of(&name)];
    assert_eq!(node.cli(&["DEL", &name]).trim(), "1");
    let err = two
        .apply(&under_key(&two, now, "k", 7, "other"))
        .unwrap_err();
    assert!(matches!(err, StoreError::Claimed { .. }), "{err:?}");
    two.apply(&under_key(&two, now, "k", 2, "body")).unwrap();
    for key in ["a", "b"] {
        assert_eq!(total(&two, "api", key, 60), 2, "{key}");
    }
    assert_eq!(one.idempotency("k").unwrap().unwrap().body, "body");
}

/// A batch's marker in a slot is named after the slot's first series of the batch, kept or
/// not: a retry after one series' buckets left retention finds the first try's marker.
#[test]
fn a_retry_finds_its_marker_when_a_series_left_retention() {
    use std::sync::Arc;
    use tally_core::store::ManualClock;
    let cluster = RedisCluster::start();
    let t0 = 1_790_645_400;
    let clock = Arc::new(ManualClock::new(t0));
    let store = RedisStore::connect_with_clock(&cluster.url(), clock.clone()).unwrap();
    store
        .put_schema(&Namespace::new("h").unwrap(), &schema(&["1h:2h"], None))
        .unwrap();
    // `a`, two and a half hours old (its bucket kept until t0 + 1800), and a key of the same slot, now.
    let ns = Namespace::new("h").unwrap();
    let slot = |key: &str| {
        redis::cluster_routing::Slot::for_key(tally_redis::layout::series_tag(&ns, key))
    };
    let b = (0..100_000)
        .map(|i| format!("b{i}"))
        .find(|k| slot(k) == slot("a"))
        .unwrap();
    let mk = |store: &RedisStore, now| {
        let mut b = batch(
            store,
            now,
            &[raw("h", "a", t0 - 9000, 1, &[]), raw("h", &b, t0, 1, &[])],
            &Defaults::default(),
        );
        b.idempotency = Some(IdemRecord {
            key: "r".into(),
            fingerprint: "fp".into(),
            expires: now + 86_400,
            status: 200,
            body: "{}".into(),
        });
        b
    };
    store.apply(&mk(&store, t0)).unwrap();
    let name = tally_redis::layout::idem_key("r");
    let node = &cluster.nodes[cluster.node_of(&name)];
    assert_eq!(node.cli(&["DEL", &name]).trim(), "1");
    clock.set(t0 + 1801);
    store.apply(&mk(&store, t0 + 1801)).unwrap();
    assert_eq!(total(&store, "h", &b, 3600), 1);
}

/// A batch leaves a marker in every slot it writes: once it is applied whole they go (under
/// a random id) or are kept only a short while (under an idempotency key), else a steady
/// ingest would keep millions of them in Redis.
#[test]
fn a_cluster_lets_go_of_a_batch_markers_once_it_is_applied() {
    let cluster = RedisCluster::start();
    let store = api_store(&cluster.url());
    let now = real_now();
    let raws: Vec<_> = (0..300)
        .map(|i| raw("api", &format!("k{i}"), now, 1, &[]))
        .collect();
    let markers = || -> Vec<(String, i64)> {
        batch_markers(&cluster)
            .into_iter()
            .map(|(i, m)| {
                let ttl: i64 = cluster.nodes[i].cli(&["TTL", &m]).trim().parse().unwrap();
                (m, ttl)
            })
            .collect()
    };
    store
        .apply(&batch(&store, now, &raws, &Defaults::default()))
        .unwrap();
    assert_eq!(markers(), vec![]);
    let mut b = batch(&store, now, &raws, &Defaults::default());
    b.idempotency = Some(IdemRecord {
        key: "load-1".into(),
        fingerprint: "fp".into(),
        expires: now + 86_400,
        status: 200,
        body: "{}".into(),
    });
    store.apply(&b).unwrap();
    let left = markers();
    assert!(left.len() > 100, "{}", left.len());
    assert!(
        left.iter().all(|(_, ttl)| (1..=120).contains(ttl)),
        "{left:?}"
    );
    assert_eq!(total(&store, "api", "k7", 60), 2);
}

/// Found by an independent review: on one server every batch of a random id left its
/// marker for 600 s (a limited `incr` is a batch of one event: at 10 000 a second, ~1.5 GB
/// of markers). Once applied, its marker goes, as a cluster's do; one under an idempotency
/// key keeps its claim (the marker there), as long as its record.
#[test]
fn a_single_server_lets_go_of_a_batch_marker_once_it_is_applied() {
    let server = RedisServer::start();
    let store = api_store(&server.url());
    let now = real_now();
    let count = |pattern: &str| -> i64 {
        let script = format!("return #redis.call('KEYS', '{pattern}')");
        server.cli(&["EVAL", &script, "0"]).trim().parse().unwrap()
    };
    for i in 0..200 {
        let raws = [raw("api", &format!("client-{}", i % 20), now, 1, &[])];
        store
            .apply(&batch(&store, now, &raws, &Defaults::default()))
            .unwrap();
    }
    assert_eq!(count("tally:batch:*"), 0);
    store
        .apply(&under_key(&store, now, "k", 3, "body"))
        .unwrap();
    assert_eq!(count("tally:claim:*"), 1);
    assert_eq!(total(&store, "api", "client-7", 60), 10);
}

/// The same request racing itself on two servers: once one has applied it whole (its
/// record written, its markers let go), the other applies nothing again.
#[test]
fn a_request_applied_whole_is_not_applied_again_once_its_markers_are_gone() {
    let cluster = RedisCluster::start();
    let (one, two) = (
        api_store(&cluster.url()),
        RedisStore::connect(&cluster.url()).unwrap(),
    );
    let now = real_now();
    one.apply(&under_key(&one, now, "k", 3, "body")).unwrap();
    for (i, m) in batch_markers(&cluster) {
        cluster.nodes[i].cli(&["DEL", &m]);
    }
    two.apply(&under_key(&two, now, "k", 3, "body")).unwrap();
    for key in ["a", "b"] {
        assert_eq!(total(&two, "api", key, 60), 3, "{key}");
    }
}

/// A request under a key that failed with nothing applied (its limited increment's lock
/// lost) leaves the key free, as on one server: a different request under it is taken.
#[test]
fn a_claim_is_given_up_when_nothing_was_applied() {
    let cluster = RedisCluster::start();
    let store = api_store(&cluster.url());
    let ns = Namespace::new("api").unwrap();
    let now = real_now();
    let b = batch(
        &store,
        now,
        &[raw("api", "a", now, 1, &[])],
        &Defaults::default(),
    );
    let key = tally_core::model::Key::new("a").unwrap();
    let window = last_hour(&ns, &key, now);
    let lock = tally_redis::layout::lock_key(&tally_redis::layout::series_tag(&ns, "a"));
    let node = &cluster.nodes[cluster.node_of(&lock)];
    let err = store
        .apply_if(&b, &window, &mut |_| {
            node.cli(&["SET", &lock, "another-server"]);
            Ok(tally_core::store::Decision {
                apply: true,
                idempotency: under_key(&store, now, "k", 1, "first").idempotency,
            })
        })
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    node.cli(&["DEL", &lock]);
    store
        .apply(&under_key(&store, now, "k", 2, "second"))
        .unwrap();
    assert_eq!(total(&store, "api", "a", 60), 2);
    assert_eq!(store.idempotency("k").unwrap().unwrap().body, "second");
}

/// `[limits] max_idempotency_keys` and `max_idempotency_keys_per_token` on Redis: answers
/// live 24 h in Redis, so without a bound a client sending a fresh key with each request
/// fills it. Past a bound a batch with a new key is `Unavailable` and applies nothing; a key
/// counted already (a retry, which must be able to finish what a failed attempt left) is
/// never refused; two servers share the count.
fn answers_are_bounded(url: &str) {
    let now = real_now();
    let one = api_store(url).with_answer_bounds(5, Some(2));
    let two = RedisStore::connect(url)
        .unwrap()
        .with_answer_bounds(5, Some(2));
    let full = |e: StoreError, what: &str| {
        assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
        assert!(e.detail().contains(what), "{}", e.detail());
    };
    // Token A's share: two keys, whichever server stores them.
    one.apply(&under_key(&one, now, "tA:1", 1, "a1")).unwrap();
    two.apply(&under_key(&two, now, "tA:2", 1, "a2")).unwrap();
    full(
        one.apply(&under_key(&one, now, "tA:3", 1, "a3"))
            .unwrap_err(),
        "max_idempotency_keys_per_token",
    );
    assert_eq!(
        total(&one, "api", "a", 60),
        2,
        "the refused batch applied nothing"
    );
    // A key counted already is taken again (here: the same request, applied once).
    two.apply(&under_key(&two, now, "tA:1", 1, "a1")).unwrap();
    assert_eq!(total(&one, "api", "a", 60), 2);
    // Other tokens have their own shares, up to the whole bound of 5.
    for key in ["tB:1", "tB:2", "tC:1"] {
        one.apply(&under_key(&one, now, key, 1, key)).unwrap();
    }
    assert_eq!(total(&one, "api", "a", 60), 5);
    full(
        two.apply(&under_key(&two, now, "tD:1", 1, "d1"))
            .unwrap_err(),
        "max_idempotency_keys allows",
    );
    assert_eq!(total(&one, "api", "a", 60), 5);
    // Refused by the whole bound, the key was not left counted for its token: sent again it
    // is refused again (not waved through as counted), and once there is room (a larger
    // bound here) it is taken.
    full(
        one.apply(&under_key(&one, now, "tD:1", 1, "d1"))
            .unwrap_err(),
        "max_idempotency_keys allows",
    );
    let three = RedisStore::connect(url)
        .unwrap()
        .with_answer_bounds(6, Some(1));
    three
        .apply(&under_key(&three, now, "tD:1", 1, "d1"))
        .unwrap();
    assert_eq!(total(&one, "api", "a", 60), 6);
    // Batches without a key are not counted.
    one.apply(&batch(
        &one,
        now,
        &[raw("api", "a", now, 1, &[])],
        &Defaults::default(),
    ))
    .unwrap();
    assert_eq!(total(&one, "api", "a", 60), 7);
    // Without per-token bounds (no tokens), only the whole one: 6 counted of 6.
    let open = RedisStore::connect(url)
        .unwrap()
        .with_answer_bounds(6, None);
    full(
        open.apply(&under_key(&open, now, "free", 1, "f"))
            .unwrap_err(),
        "max_idempotency_keys allows",
    );
}

#[test]
fn answers_are_bounded_on_one_redis() {
    let server = RedisServer::start();
    answers_are_bounded(&server.url());
}

#[test]
fn answers_are_bounded_on_a_cluster() {
    let cluster = RedisCluster::start();
    answers_are_bounded(&cluster.url());
}

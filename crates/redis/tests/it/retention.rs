//! Retention changes: a tier whose retention grows keeps, for the longer retention, what
//! the shorter one still held — its window hashes' expiries and the key index follow the
//! new retention, as the reference store (which never forgets) shows.

use std::sync::Arc;

use tally_core::ingest::Defaults;
use tally_core::model::{Key, Namespace};
use tally_core::reference::MemStore;
use tally_core::store::{KeyList, ManualClock, Store};
use tally_redis::RedisStore;
use tally_redis::layout;
use tally_redis::testing::{RedisCluster, RedisServer};

use crate::{batch, raw, read_all, real_now, schema};

/// Seconds until a key expires (`TTL`): -1 without an expiry, -2 if it does not exist.
fn ttl(cli: &dyn Fn(&[&str]) -> String, key: &str) -> i64 {
    cli(&["ttl", key]).trim().parse().unwrap()
}

fn grows(url: &str, cli: &dyn Fn(&[&str]) -> String) {
    let t = real_now();
    let clock = Arc::new(ManualClock::new(t));
    let redis = RedisStore::connect_with_clock(url, clock.clone()).unwrap();
    let reference = MemStore::new(clock.clone());
    let ns = Namespace::new("m").unwrap();
    let keys: Vec<String> = (0..40).map(|k| format!("k{k}")).collect();
    let stores: [&dyn Store; 2] = [&redis, &reference];
    for s in stores {
        s.put_schema(&ns, &schema(&["1m:2h", "1h:1d"], Some(&["1h"])))
            .unwrap();
        let raws: Vec<_> = keys
            .iter()
            .map(|k| raw("m", k, t - 3 * 3600, 2, &[("country", "US")]))
            .collect();
        s.apply(&batch(s, t, &raws, &Defaults::default())).unwrap();
    }
    let hour = t - 3 * 3600 - (t - 3 * 3600).rem_euclid(3600);
    let window = layout::window_of(hour, 3600);
    let gen_of = |key: &str| {
        let text = cli(&["hget", layout::SCHEMAS_KEY, "m"]);
        let doc: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let g = doc["generation"]["3600"].as_u64().unwrap();
        format!("tally:w:{{m|{key}}}:{g}:3600:{window}")
    };
    let before = ttl(cli, &gen_of("k0"));
    assert!((0..=6 * 86_400).contains(&before), "{before}");
    let list = KeyList {
        ns: &ns,
        prefix: "",
        after: None,
        limit: 100,
    };
    let listed = |s: &dyn Store| s.keys(&list).unwrap();
    // Two days on, the shorter retention holds nothing: the index prunes every key, though
    // its window hashes are still there.
    clock.set(t + 2 * 86_400);
    assert_eq!(listed(&redis), Vec::<Key>::new());

    for s in stores {
        s.put_schema(&ns, &schema(&["1m:2h", "1h:30d"], Some(&["1h"])))
            .unwrap();
    }
    for k in &keys {
        let after = ttl(cli, &gen_of(k));
        assert!(after > 29 * 86_400, "{k}: {after}");
    }
    // Listed again, as the reference (which never forgets) lists them.
    assert_eq!(listed(&redis), listed(&reference));
    assert_eq!(listed(&redis).len(), keys.len());
    clock.set(t + 3 * 86_400);
    assert_eq!(listed(&redis), listed(&reference));
    assert_eq!(listed(&redis).len(), keys.len());
    assert_eq!(
        read_all(&redis, "m", "k7", 3600).unwrap(),
        read_all(&reference, "m", "k7", 3600).unwrap()
    );
    assert_eq!(read_all(&redis, "m", "k7", 3600).unwrap().totals[0].1, 2);

    for s in stores {
        s.put_schema(&ns, &schema(&["1m:2h", "1h:forever"], Some(&["1h"])))
            .unwrap();
    }
    for k in &keys {
        assert_eq!(ttl(cli, &gen_of(k)), -1, "{k}");
    }
    clock.set(t + 90 * 86_400);
    assert_eq!(listed(&redis), listed(&reference));
    assert!(listed(&redis).contains(&Key::new("k39").unwrap()));
    // Nothing is left to do: the record says so.
    let text = cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(!text.contains("extend"), "{text}");
}

/// A server stopped before it extended the expiries leaves the mark in the record: the
/// next one to connect does it.
#[test]
fn an_unfinished_extension_is_finished_by_the_next_server() {
    let server = RedisServer::start();
    let t = real_now();
    let redis = RedisStore::connect(&server.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis
        .put_schema(&ns, &schema(&["1h:1d"], Some(&[])))
        .unwrap();
    let raws = [raw("m", "k", t - 3600, 1, &[])];
    redis
        .apply(&batch(&redis, t, &raws, &Defaults::default()))
        .unwrap();
    drop(redis);
    // What a server stopped right after storing a longer retention leaves.
    let text = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    let mut doc: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    doc["schema"]["tiers"] = serde_json::json!(["1h:30d"]);
    doc["extend"] = serde_json::json!({"3600": 99});
    server.cli(&["hset", layout::SCHEMAS_KEY, "m", &doc.to_string()]);
    let name = server.cli(&["--scan", "--pattern", "tally:w:*"]);
    let name = name.trim();
    assert!(ttl(&|a| server.cli(a), name) < 7 * 86_400);

    let _ = RedisStore::connect(&server.url()).unwrap();
    assert!(ttl(&|a| server.cli(a), name) > 29 * 86_400);
    let text = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(!text.contains("extend"), "{text}");
}

#[test]
fn a_retention_that_grows_keeps_what_it_held() {
    let server = RedisServer::start();
    grows(&server.url(), &|args| server.cli(args));
}

#[test]
fn a_retention_that_grows_keeps_what_it_held_on_a_cluster() {
    let cluster = RedisCluster::start();
    // `redis-cli -c` follows redirections to the node holding each key.
    let port = cluster.nodes[0].port().to_string();
    grows(&cluster.url(), &|args| {
        let mut all = vec!["-c", "-p", &port];
        all.extend_from_slice(args);
        tally_redis::testing::redis_cli(&all)
    });
}

/// A batch prepared under a shorter retention than the one its window hashes were given
/// (one in flight across a change, say) does not shorten their expiry, nor give one to a
/// hash kept forever: `APPLY` only raises expiries.
#[test]
fn a_write_never_shortens_an_expiry() {
    let server = RedisServer::start();
    let t = real_now();
    let redis = RedisStore::connect(&server.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    let write = |key: &str| {
        let raws = [raw("m", key, t - 3600, 1, &[])];
        redis
            .apply(&batch(&redis, t, &raws, &Defaults::default()))
            .unwrap();
    };
    let name = |key: &str| {
        let found = server.cli(&["--scan", "--pattern", &format!("tally:w:{{m|{key}}}:*")]);
        found.trim().to_owned()
    };
    let cli = |a: &[&str]| server.cli(a);
    // What a server that read the schema before a change writes with: the stored record
    // set back to the older retention, by hand.
    let shorten = |tiers: serde_json::Value| {
        let text = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
        let mut doc: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        doc["schema"]["tiers"] = tiers;
        server.cli(&["hset", layout::SCHEMAS_KEY, "m", &doc.to_string()]);
    };
    redis
        .put_schema(&ns, &schema(&["1h:30d"], Some(&[])))
        .unwrap();
    write("a");
    assert!(ttl(&cli, &name("a")) > 29 * 86_400);
    shorten(serde_json::json!(["1h:1d"]));
    write("a");
    assert!(ttl(&cli, &name("a")) > 29 * 86_400, "shortened");
    // A new hash gets the retention its writer knows.
    write("b");
    assert!(ttl(&cli, &name("b")) < 7 * 86_400);

    redis
        .put_schema(&ns, &schema(&["1h:forever"], Some(&[])))
        .unwrap();
    write("c");
    assert_eq!(ttl(&cli, &name("c")), -1);
    shorten(serde_json::json!(["1h:1d"]));
    write("c");
    assert_eq!(ttl(&cli, &name("c")), -1, "given an expiry");
}

/// A walk that fails after the schema is stored (here: `SCAN` disabled on the server)
/// answers an error saying so, and leaves the mark that lets a later PUT or server finish.
#[test]
fn a_walk_that_fails_says_the_schema_is_stored_and_keeps_its_mark() {
    let server = RedisServer::start_with_args(&["--rename-command", "SCAN", ""]);
    let redis = RedisStore::connect(&server.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis
        .put_schema(&ns, &schema(&["1h:1d"], Some(&[])))
        .unwrap();
    let e = redis
        .put_schema(&ns, &schema(&["1h:30d"], Some(&[])))
        .unwrap_err();
    assert!(
        matches!(e, tally_core::store::StoreError::Unavailable { .. }),
        "{e:?}"
    );
    assert!(e.detail().contains("is stored"), "{}", e.detail());
    assert!(e.detail().contains("send it again"), "{}", e.detail());
    let stored = redis.schema(&ns).unwrap().unwrap();
    assert_eq!(stored.tiers()[0].to_string(), "1h:30d");
    let text = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(text.contains(r#""extend":{"3600":"#), "{text}");
}

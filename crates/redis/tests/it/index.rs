//! The paged key index of layout 5: keys listed and walked across pages that split, pages
//! kept within Redis' listpack size, expired keys leaving their pages, and the index of
//! layout 4 moved into pages on upgrade (and read meanwhile).

use std::sync::Arc;

use tally_core::ingest::Defaults;
use tally_core::model::{Key, Namespace};
use tally_core::reference::MemStore;
use tally_core::store::{KeyList, ManualClock, Store};
use tally_redis::RedisStore;
use tally_redis::layout;
use tally_redis::testing::RedisServer;

use crate::{batch, raw, real_now, schema};

/// Keys listed from `after` (or the start) with `prefix`, at most `limit`.
fn listed(
    s: &dyn Store,
    ns: &Namespace,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Vec<String> {
    s.keys(&KeyList {
        ns,
        prefix,
        after,
        limit,
    })
    .unwrap()
    .into_iter()
    .map(Key::into_string)
    .collect()
}

/// Every key, walked a page of `limit` at a time as a client would.
fn walked(s: &dyn Store, ns: &Namespace, prefix: &str, limit: usize) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    loop {
        let page = listed(s, ns, prefix, all.last().map(String::as_str), limit);
        let done = page.len() < limit;
        all.extend(page);
        if done {
            return all;
        }
    }
}

/// The namespace's pages as stored: (fence, keys in order, encoding), the first page first.
fn pages(server: &RedisServer, ns: &Namespace) -> Vec<(String, Vec<String>, String)> {
    let dir = server.cli(&["zrange", &layout::key_dir_key(ns), "0", "-1"]);
    let fences = std::iter::once("").chain(dir.lines().filter(|f| !f.is_empty()));
    fences
        .map(|f| {
            let name = format!("{}{f}", layout::key_page_prefix(ns));
            let keys = server.cli(&["zrange", &name, "0", "-1"]);
            let encoding = server.cli(&["object", "encoding", &name]);
            (
                f.to_owned(),
                // `redis-cli` prints an empty list as an empty line; no key is empty.
                keys.lines()
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned)
                    .collect(),
                encoding.trim().to_owned(),
            )
        })
        .collect()
}

/// Checks the pages' invariants: each holds at most `size` keys, none is empty but the
/// first, each key lies between its page's fence and the next, and together they hold
/// `expected` (sorted), each once.
fn check_pages(server: &RedisServer, ns: &Namespace, size: usize, expected: &[String]) {
    let pages = pages(server, ns);
    let mut all: Vec<String> = Vec::new();
    for (i, (fence, keys, _)) in pages.iter().enumerate() {
        assert!(
            keys.len() <= size,
            "page {fence:?} holds {} keys",
            keys.len()
        );
        assert!(i == 0 || !keys.is_empty(), "page {fence:?} is empty");
        let next = pages.get(i + 1).map(|p| p.0.as_bytes());
        for k in keys {
            assert!(
                k.as_bytes() >= fence.as_bytes(),
                "{k:?} before fence {fence:?}"
            );
            assert!(
                next.is_none_or(|n| k.as_bytes() < n),
                "{k:?} past the next fence"
            );
        }
        all.extend(keys.iter().cloned());
    }
    assert_eq!(all, expected, "the pages in order hold every key once");
}

/// A store on `server` (at the real time) and namespace `m` with one `forever` tier.
fn forever(server: &RedisServer) -> (RedisStore, Namespace) {
    let redis = RedisStore::connect(&server.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis
        .put_schema(&ns, &schema(&["1h:forever"], None))
        .unwrap();
    (redis, ns)
}

/// A deterministic shuffle (a linear congruential generator; no rand in these tests).
fn shuffled(mut v: Vec<String>, mut seed: u64) -> Vec<String> {
    for i in (1..v.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (seed >> 33) as usize % (i + 1));
    }
    v
}

/// Writes one event for each key, in batches of uneven sizes, to both stores.
fn write_keys(stores: &[&dyn Store], keys: &[String], now: i64) {
    let mut at = 0;
    let mut size = 1;
    while at < keys.len() {
        let end = (at + size).min(keys.len());
        let raws: Vec<_> = keys[at..end]
            .iter()
            .map(|k| raw("m", k, now, 1, &[]))
            .collect();
        for s in stores {
            s.apply(&batch(*s, now, &raws, &Defaults::default()))
                .unwrap();
        }
        at = end;
        size = size * 3 % 61 + 1;
    }
}

#[test]
fn keys_are_listed_across_pages_that_split() {
    // Pages of 4 keys: the store sizes them by Redis' listpack limit.
    let server = RedisServer::start_with_args(&["--zset-max-listpack-entries", "4"]);
    let now = real_now();
    let clock = Arc::new(ManualClock::new(now));
    let redis = RedisStore::connect_with_clock(&server.url(), clock.clone()).unwrap();
    let reference = MemStore::new(clock);
    let ns = Namespace::new("m").unwrap();
    let stores: [&dyn Store; 2] = [&redis, &reference];
    for s in stores {
        s.put_schema(&ns, &schema(&["1m:2h", "1h:forever"], None))
            .unwrap();
    }
    let mut keys: Vec<String> = (0..300)
        .map(|i| match i % 4 {
            0 => format!("k{i}"),
            1 => format!("a/{i}"),
            2 => format!("é{i}"),
            _ => format!("k1{i}"),
        })
        .collect();
    write_keys(&stores, &shuffled(keys.clone(), 7), now);
    keys.sort();

    assert_eq!(listed(&redis, &ns, "", None, 1000), keys);
    for s in stores {
        assert_eq!(walked(s, &ns, "", 7), keys, "a walk 7 keys at a time");
        let k1: Vec<String> = keys
            .iter()
            .filter(|k| k.starts_with("k1"))
            .cloned()
            .collect();
        assert_eq!(walked(s, &ns, "k1", 5), k1);
    }
    for (prefix, after, limit) in [
        ("k1", None, 1000),
        ("a/", Some("a/2"), 9),
        ("é", Some("é99"), 3),
        ("", Some("k150"), 10),
        ("", Some("zzz"), 10),
        ("k", Some("a/"), 4),
        ("k19", None, 2),
        ("x", None, 10),
    ] {
        assert_eq!(
            listed(&redis, &ns, prefix, after, limit),
            listed(&reference, &ns, prefix, after, limit),
            "prefix {prefix:?} after {after:?} limit {limit}"
        );
    }
    check_pages(&server, &ns, 4, &keys);
    assert!(pages(&server, &ns).len() >= 300 / 4);

    // Writing them again lists nothing twice and splits nothing more.
    let before = pages(&server, &ns).len();
    write_keys(&stores, &keys, now);
    assert_eq!(pages(&server, &ns).len(), before);
    check_pages(&server, &ns, 4, &keys);
}

#[test]
fn pages_stay_listpacks_of_redis_default_size() {
    let server = RedisServer::start();
    let now = real_now();
    let (redis, ns) = forever(&server);
    let mut keys: Vec<String> = (0..2000).map(|i| format!("lnk_{i}")).collect();
    write_keys(&[&redis], &shuffled(keys.clone(), 11), now);
    keys.sort();
    check_pages(&server, &ns, 128, &keys);
    let pages = pages(&server, &ns);
    assert!(pages.len() >= 2000 / 128, "{} pages", pages.len());
    for (fence, _, encoding) in &pages {
        assert_eq!(encoding, "listpack", "page {fence:?}");
    }
    assert_eq!(walked(&redis, &ns, "", 1000), keys);
}

#[test]
fn expired_keys_leave_their_pages() {
    let server = RedisServer::start_with_args(&["--zset-max-listpack-entries", "4"]);
    let t = real_now();
    let clock = Arc::new(ManualClock::new(t));
    let redis = RedisStore::connect_with_clock(&server.url(), clock.clone()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis.put_schema(&ns, &schema(&["1m:10m"], None)).unwrap();
    let keys: Vec<String> = (0..50).map(|i| format!("k{i:02}")).collect();
    write_keys(&[&redis], &keys, t);
    assert_eq!(listed(&redis, &ns, "", None, 100), keys);
    // Half of them written again later: they stay when the first writes expire.
    clock.set(t + 3600);
    write_keys(&[&redis], &keys[25..], t + 3600);
    clock.set(t + 3600 + 300);
    assert_eq!(listed(&redis, &ns, "", None, 100), &keys[25..]);
    check_pages(&server, &ns, 4, &keys[25..]);
    clock.set(t + 2 * 86_400);
    assert_eq!(listed(&redis, &ns, "", None, 100), Vec::<String>::new());
    let left = server.cli(&["--scan", "--pattern", "tally:k[dp]:*"]);
    assert_eq!(left.trim(), "", "every page and the directory are gone");
    // And the index fills again.
    write_keys(&[&redis], &keys[..10], t + 2 * 86_400);
    assert_eq!(listed(&redis, &ns, "", None, 100), &keys[..10]);
}

/// Keys whose data all expired leave the index as new keys are written, even if nobody
/// lists keys (a rate-limit namespace keyed by client address would otherwise grow without
/// bound).
#[test]
fn writes_of_new_keys_take_expired_ones_out_of_the_index() {
    let server = RedisServer::start();
    let t = real_now();
    let clock = Arc::new(ManualClock::new(t));
    let redis = RedisStore::connect_with_clock(&server.url(), clock.clone()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis.put_schema(&ns, &schema(&["1m:10m"], None)).unwrap();
    let old: Vec<String> = (0..50).map(|i| format!("old{i:02}")).collect();
    write_keys(&[&redis], &old, t);
    let expiring = || -> usize {
        server
            .cli(&["zcard", &layout::expiry_key(&ns)])
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(expiring(), 50);
    clock.set(t + 3600);
    for i in 0..5 {
        write_keys(&[&redis], &[format!("new{i}")], t + 3600);
    }
    // Each write of one new key takes out up to nine expired ones.
    assert_eq!(expiring(), 5 + 50 - 5 * 9);
    for i in 5..10 {
        write_keys(&[&redis], &[format!("new{i}")], t + 3600);
    }
    assert_eq!(expiring(), 10);
    let new: Vec<String> = (0..10).map(|i| format!("new{i}")).collect();
    assert_eq!(listed(&redis, &ns, "", None, 100), new);
}

/// A database of layout 4 keeps every key in one sorted set: connecting moves them into
/// pages; keys a server of layout 4 still running lists the old way meanwhile are moved by
/// the next connection.
#[test]
fn a_layout_4_index_moves_into_pages() {
    let server = RedisServer::start();
    let now = real_now();
    let ns = Namespace::new("m").unwrap();
    let mut keys: Vec<String> = (0..700).map(|i| format!("k{i}")).collect();
    {
        let redis = RedisStore::connect(&server.url()).unwrap();
        redis
            .put_schema(&ns, &schema(&["1h:forever"], None))
            .unwrap();
        write_keys(&[&redis], &keys, now);
    }
    keys.sort();
    // Back to layout 4: the pages' keys in `tally:keys:{m}`, the record marked 4.
    let old = layout::old_keys_key(&ns);
    for (fence, page, _) in pages(&server, &ns) {
        let mut args = vec!["zadd".to_owned(), old.clone()];
        for k in page {
            args.extend(["0".to_owned(), k]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.cli(&args);
        server.cli(&["del", &format!("{}{fence}", layout::key_page_prefix(&ns))]);
    }
    server.cli(&["del", &layout::key_dir_key(&ns)]);
    let record = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    let record = record
        .trim()
        .replace(
            &format!("\"layout\":{}", layout::LAYOUT_VERSION),
            "\"layout\":4",
        )
        .replace(",\"extents\":true", "");
    assert!(record.contains("\"layout\":4"), "{record}");
    server.cli(&["hset", layout::SCHEMAS_KEY, "m", &record]);
    server.cli(&["set", layout::LAYOUT_KEY, "4"]);
    assert_eq!(server.cli(&["zcard", &old]).trim(), "700");

    let redis = RedisStore::connect(&server.url()).unwrap();
    assert_eq!(
        server.cli(&["get", layout::LAYOUT_KEY]).trim(),
        layout::LAYOUT_VERSION.to_string()
    );
    assert_eq!(server.cli(&["exists", &old]).trim(), "0", "moved whole");
    check_pages(&server, &ns, 128, &keys);
    assert_eq!(walked(&redis, &ns, "", 100), keys);

    // A server of layout 4 still running lists two keys the old way; one is written again
    // through this layout meanwhile.
    server.cli(&["zadd", &old, "0", "k35x", "0", "zz"]);
    write_keys(&[&redis], &["zz".to_owned()], now);
    drop(redis);
    let redis = RedisStore::connect(&server.url()).unwrap();
    assert_eq!(server.cli(&["exists", &old]).trim(), "0");
    let mut more = keys.clone();
    more.extend(["k35x".to_owned(), "zz".to_owned()]);
    more.sort();
    check_pages(&server, &ns, 128, &more);
    assert_eq!(walked(&redis, &ns, "", 1000), more);
    assert_eq!(
        listed(&redis, &ns, "k35", None, 100),
        [
            "k35", "k350", "k351", "k352", "k353", "k354", "k355", "k356", "k357", "k358", "k359",
            "k35x"
        ]
    );
}

/// A split stopped part-way (a cluster migrating the slot fails the script between its
/// steps) leaves a page holding keys past the next fence, copies of the next page's: reads
/// never look past a page's next fence, and the page's next split drops them.
#[test]
fn keys_past_a_fence_are_read_once_and_dropped_by_the_next_split() {
    let server = RedisServer::start_with_args(&["--zset-max-listpack-entries", "4"]);
    let now = real_now();
    let (redis, ns) = forever(&server);
    let mut keys: Vec<String> = (0..12).map(|i| format!("k{i:02}")).collect();
    write_keys(&[&redis], &keys, now);
    let before = pages(&server, &ns);
    assert!(before.len() >= 3, "{before:?}");
    // The first page also holds every key of the second, as if its split had stopped
    // after writing the fences.
    let first = layout::key_page_prefix(&ns);
    for k in &before[1].1 {
        server.cli(&["zadd", &first, "0", k]);
    }
    assert_eq!(listed(&redis, &ns, "", None, 100), keys);
    assert_eq!(walked(&redis, &ns, "", 3), keys);
    // A new key in the first page's range: the page has room for it once the strays
    // are gone, which they are.
    write_keys(&[&redis], &["a0".to_owned()], now);
    keys.push("a0".to_owned());
    keys.sort();
    check_pages(&server, &ns, 4, &keys);
    // Strays again, and more keys than the page holds: its split leaves them out.
    for k in &before[1].1 {
        server.cli(&["zadd", &first, "0", k]);
    }
    let more: Vec<String> = (1..4).map(|i| format!("a{i}")).collect();
    write_keys(&[&redis], &more, now);
    keys.extend(more);
    keys.sort();
    check_pages(&server, &ns, 4, &keys);
    assert_eq!(walked(&redis, &ns, "", 5), keys);
}

/// Redis losing writes it had acknowledged (a restart from an older snapshot, a failover
/// to a replica behind) must not leave a key with data unlisted: the next write of the key
/// lists it again.
#[test]
fn a_key_written_after_redis_lost_its_listing_is_listed() {
    let mut server = RedisServer::start();
    let now = real_now();
    let (redis, ns) = forever(&server);
    write_keys(&[&redis], &["a".to_owned()], now);
    server.cli(&["save"]);
    write_keys(&[&redis], &["b".to_owned()], now);
    assert_eq!(listed(&redis, &ns, "", None, 10), ["a", "b"]);
    // Killed, and back from the snapshot that has "a" only.
    server.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while redis.health().is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the store did not reconnect"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    write_keys(&[&redis], &["b".to_owned()], now);
    assert_eq!(crate::total(&redis, "m", "b", 3600), 1);
    assert_eq!(listed(&redis, &ns, "", None, 10), ["a", "b"]);
}

/// While a cluster migrates the slot of a namespace's index (`CLUSTER SETSLOT … MIGRATING`
/// / `IMPORTING`, before any key has moved), listing and writing go on: the scripts name no
/// key that is absent (a multi-key call naming one answers `TRYAGAIN` then).
#[test]
fn the_index_serves_while_its_slot_is_migrating() {
    let cluster = tally_redis::testing::RedisCluster::start();
    let now = real_now();
    let redis = RedisStore::connect(&cluster.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis
        .put_schema(&ns, &schema(&["1m:2h", "1h:30d"], None))
        .unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    write_keys(&[&redis], &keys, now);
    let dir = layout::key_dir_key(&ns);
    let src = cluster.node_of(&dir);
    let dst = (src + 1) % cluster.nodes.len();
    let id = |n: usize| cluster.nodes[n].cli(&["cluster", "myid"]).trim().to_owned();
    let slot = cluster.nodes[src].cli(&["cluster", "keyslot", &dir]);
    let slot = slot.trim();
    cluster.nodes[dst].cli(&["cluster", "setslot", slot, "importing", &id(src)]);
    cluster.nodes[src].cli(&["cluster", "setslot", slot, "migrating", &id(dst)]);
    assert_eq!(listed(&redis, &ns, "", None, 100), keys);
    write_keys(&[&redis], &keys[..3], now);
    assert_eq!(listed(&redis, &ns, "k", None, 100), keys);
    assert_eq!(crate::total(&redis, "m", "k1", 3600), 2);
}

/// How many calls of a command Redis has run (`INFO commandstats`).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A store sends the index only keys it has not listed yet; once Redis is emptied under it
/// (the index's epoch changes), it sends them all again.
#[test]
fn keys_listed_already_are_not_sent_again_until_the_epoch_changes() {
    let server = RedisServer::start();
    let now = real_now();
    let (redis, ns) = forever(&server);
    let keys: Vec<String> = (0..50).map(|i| format!("k{i:02}")).collect();
    write_keys(&[&redis], &keys, now);
    let before = calls(&server, "zadd");
    write_keys(&[&redis], &keys, now);
    assert_eq!(
        calls(&server, "zadd"),
        before,
        "no key sent to the index again"
    );
    assert_eq!(crate::total(&redis, "m", "k07", 3600), 2);

    server.cli(&["flushall"]);
    redis
        .put_schema(&ns, &schema(&["1h:forever"], None))
        .unwrap();
    write_keys(&[&redis], &keys[..5], now);
    assert_eq!(listed(&redis, &ns, "", None, 100), &keys[..5]);
    assert_eq!(crate::total(&redis, "m", "k03", 3600), 1);
}

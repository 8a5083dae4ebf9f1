//! Dimension codes (layouts 3 and 4): subtotals are written `<offset>.<code>:<value>` while
//! their tier has a confirmed code, spelled out past the cap or while a code is pending, and
//! every read adds both forms; databases of layouts 2 and 3 are read as they are, marked
//! layout 4 and their schema records rewritten; a record last read (its node down) serves
//! no read that could miss coded subtotals.

use std::sync::Arc;

use tally_core::ingest::Defaults;
use tally_core::model::{Duration, Key, Namespace};
use tally_core::reference::MemStore;
use tally_core::store::StoreError;
use tally_core::store::{Deadline, KeyData, KeyRead, ManualClock, Scan, Store, Want};
use tally_redis::testing::{RedisCluster, RedisServer};
use tally_redis::{RedisStore, layout};

use crate::{batch, raw, read_all, real_now, schema};

fn sorted(mut d: KeyData) -> KeyData {
    d.subtotals
        .sort_by(|a, b| (&a.dim, &a.value).cmp(&(&b.dim, &b.value)));
    d
}

/// The fields of every window hash of a namespace.
fn fields(server: &RedisServer, ns: &str) -> Vec<String> {
    let keys = server.cli(&["--scan", "--pattern", &format!("tally:w:{{{ns}|*")]);
    keys.lines()
        .flat_map(|k| {
            server
                .cli(&["hkeys", k])
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// More dimensions than a tier gives codes to: the first ones are coded, the rest spelled
/// out, and reads of every kind answer as the reference does.
#[test]
fn dimensions_past_the_code_cap_keep_spelled_out_fields() {
    let server = RedisServer::start();
    let now = real_now();
    let clock = Arc::new(ManualClock::new(now));
    let redis = RedisStore::connect_with_clock(&server.url(), clock.clone()).unwrap();
    let reference = MemStore::new(clock);
    let ns = Namespace::new("m").unwrap();
    let hourly = schema(&["1h:forever"], Some(&["1h"]));
    let dims: Vec<String> = (0..layout::CODES_PER_TIER + 8)
        .map(|i| format!("d{i:02}"))
        .collect();
    let stores: [&dyn Store; 2] = [&redis, &reference];
    for s in stores {
        s.put_schema(&ns, &hourly).unwrap();
        // 10 dimensions per event, each dimension in several batches.
        for round in 0..3 {
            for chunk in dims.chunks(10) {
                let pairs: Vec<(&str, &str)> = chunk
                    .iter()
                    .map(|d| (d.as_str(), if round == 1 { "v:1" } else { "v2" }))
                    .collect();
                let raws = [raw("m", "k", now - round * 60, 1 + round, &pairs)];
                s.apply(&batch(s, now, &raws, &Defaults::default()))
                    .unwrap();
            }
        }
        // Past 128 fields, so reads of one value name the fields they want (`HMGET`).
        for d in [&dims[0], &dims[dims.len() - 1]] {
            let raws: Vec<_> = (0..60)
                .map(|i| raw("m", "k", now, 1, &[(d.as_str(), &format!("f{i}"))]))
                .collect();
            s.apply(&batch(s, now, &raws, &Defaults::default()))
                .unwrap();
        }
    }
    let all = fields(&server, "m");
    let coded = all.iter().filter(|f| f.contains('.')).count();
    let spelled = all.iter().filter(|f| f.matches(':').count() >= 3).count();
    assert!(coded > 0 && spelled > 0, "{all:?}");
    assert!(all.len() > 128, "{}", all.len());
    assert_eq!(sorted(read_all(&redis, "m", "k", 3600).unwrap()), {
        sorted(read_all(&reference, "m", "k", 3600).unwrap())
    });
    assert_eq!(
        read_all(&redis, "m", "k", 3600).unwrap().subtotals.len(),
        dims.len() * 2 + 120
    );
    let key = Key::new("k").unwrap();
    let hour = Duration::from_secs(3600).unwrap();
    let (from, to) = (now - 86_400, now + 86_400);
    for d in [&dims[0], &dims[dims.len() - 1]] {
        for want in [
            Want::Dim { dim: d },
            Want::Value {
                dim: d,
                value: "v:1",
            },
            Want::Value {
                dim: d,
                value: "v2",
            },
        ] {
            let read = KeyRead {
                ns: &ns,
                key: &key,
                resolution: hour,
                from,
                to,
                want,
                sum_subtotals: false,
                keep: None,
            };
            let got = sorted(redis.read(&[read]).unwrap().pop().unwrap());
            let expected = sorted(reference.read(&[read]).unwrap().pop().unwrap());
            assert_eq!(got, expected, "{want:?}");
            assert!(!got.subtotals.is_empty(), "{want:?}");
        }
        let scan = Scan {
            ns: &ns,
            resolution: hour,
            from,
            to,
            value: Some((d, "v2")),
            deadline: &Deadline::none(),
        };
        let collect = |s: &dyn Store| {
            let mut seen = Vec::new();
            s.scan(&scan, &mut |k, n| seen.push((k.clone(), n)))
                .unwrap();
            seen
        };
        assert_eq!(collect(&redis), collect(&reference), "{d}");
        assert_eq!(collect(&redis), vec![(key.clone(), 4)]);
    }
}

/// A database written by layout 2 (schema records without codes, subtotals spelled out)
/// is opened as it is: its data reads back, new writes take codes and add to it, the
/// database is marked with this layout so that older builds refuse it, and its schema
/// records are rewritten in a form older builds cannot decode (`fresh` for `next`).
#[test]
fn a_layout_2_database_is_read_and_upgraded() {
    let server = RedisServer::start();
    let now = real_now();
    let hour = now.div_euclid(3600) * 3600;
    let window = layout::window_of(hour, 3600);
    let offset = layout::offset_of(hour, window, 3600).to_string();
    server.cli(&["set", layout::LAYOUT_KEY, "2"]);
    let record = r#"{"schema":{"tiers":["1h:forever"],"breakdown_tiers":["1h"],"dimensions":null},"generation":{"3600":1},"breakdown_generation":{"3600":2},"next":3}"#;
    server.cli(&["hset", layout::SCHEMAS_KEY, "m", record]);
    let hash = format!("tally:w:{{m|k}}:1:3600:{window}");
    let spelled = format!("{offset}:2:country:US");
    server.cli(&["hset", &hash, &offset, "5", &spelled, "3"]);
    server.cli(&["zadd", "tally:keys:{m}", "0", "k"]);

    let redis = RedisStore::connect(&server.url()).unwrap();
    let version = layout::LAYOUT_VERSION.to_string();
    assert_eq!(server.cli(&["get", layout::LAYOUT_KEY]).trim(), version);
    let rewritten = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    let doc: serde_json::Value = serde_json::from_str(rewritten.trim()).unwrap();
    assert!(doc.get("next").is_none(), "{rewritten}");
    assert_eq!(doc["fresh"], 3, "{rewritten}");
    assert_eq!(doc["layout"], layout::LAYOUT_VERSION, "{rewritten}");
    let before = read_all(&redis, "m", "k", 3600).unwrap();
    assert_eq!(before.totals, vec![(hour, 5)]);
    assert_eq!(before.subtotals.len(), 1);
    assert_eq!(before.subtotals[0].buckets, vec![(hour, 3)]);

    let raws = [raw("m", "k", now, 1, &[("country", "US")])];
    redis
        .apply(&batch(&redis, now, &raws, &Defaults::default()))
        .unwrap();
    let after = read_all(&redis, "m", "k", 3600).unwrap();
    assert_eq!(after.totals, vec![(hour, 6)]);
    assert_eq!(after.subtotals[0].dim, "country");
    assert_eq!(after.subtotals[0].buckets, vec![(hour, 4)]);
    // The new event went to a coded field beside the spelled-out one.
    let fields = server.cli(&["hkeys", &hash]);
    assert_eq!(fields.lines().count(), 3, "{fields}");
    assert!(fields.lines().any(|f| f.starts_with(&format!("{offset}."))));
}

/// A database of layout 3 (codes given in one step) is upgraded the same way, its codes
/// kept and used.
#[test]
fn a_layout_3_database_keeps_its_codes() {
    let server = RedisServer::start();
    let now = real_now();
    let hour = now.div_euclid(3600) * 3600;
    let window = layout::window_of(hour, 3600);
    let offset = layout::offset_of(hour, window, 3600);
    server.cli(&["set", layout::LAYOUT_KEY, "3"]);
    let record = r#"{"schema":{"tiers":["1h:forever"],"breakdown_tiers":["1h"],"dimensions":null},"generation":{"3600":1},"breakdown_generation":{"3600":2},"codes":{"3600":{"country":3}},"next":4}"#;
    server.cli(&["hset", layout::SCHEMAS_KEY, "m", record]);
    let hash = format!("tally:w:{{m|k}}:1:3600:{window}");
    let coded = layout::coded_field(offset, 3, "US");
    server.cli(&["hset", &hash, &offset.to_string(), "5", &coded, "5"]);
    server.cli(&["zadd", "tally:keys:{m}", "0", "k"]);

    let redis = RedisStore::connect(&server.url()).unwrap();
    // Given with no wait for replicas: pending until a write confirms it.
    let rewritten = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(
        rewritten.contains(r#""pending":{"3600":{"country":3}}"#),
        "{rewritten}"
    );
    assert!(!rewritten.contains(r#""next""#), "{rewritten}");
    let raws = [raw("m", "k", now, 2, &[("country", "US")])];
    redis
        .apply(&batch(&redis, now, &raws, &Defaults::default()))
        .unwrap();
    let after = read_all(&redis, "m", "k", 3600).unwrap();
    assert_eq!(after.totals, vec![(hour, 7)]);
    assert_eq!(after.subtotals[0].buckets, vec![(hour, 7)]);
    let fields = server.cli(&["hkeys", &hash]);
    assert_eq!(fields.lines().count(), 2, "the code was used: {fields}");
    let confirmed = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(
        confirmed.contains(r#""codes":{"3600":{"country":3}}"#),
        "{confirmed}"
    );

    // A record a server of layout 3 still running creates afterwards is rewritten by the
    // next server to connect.
    server.cli(&["hset", layout::SCHEMAS_KEY, "n", record]);
    let _ = RedisStore::connect(&server.url()).unwrap();
    let rewritten = server.cli(&["hget", layout::SCHEMAS_KEY, "n"]);
    assert!(rewritten.contains(r#""fresh":4"#), "{rewritten}");
}

/// A code stays pending, and writes spell the dimension out, until every replica of the
/// schemas' node has the record that gave it; then a write confirms it and uses it. Reads
/// add both forms throughout.
#[test]
fn a_code_is_used_only_once_the_replicas_have_it() {
    let primary = RedisServer::start();
    let replica = primary.start_replica();
    let now = real_now();
    let clock = Arc::new(ManualClock::new(now));
    let redis = RedisStore::connect_with_clock(&primary.url(), clock.clone()).unwrap();
    let reference = MemStore::new(clock);
    let ns = Namespace::new("m").unwrap();
    let hourly = schema(&["1h:forever"], Some(&["1h"]));
    let stores: [&dyn Store; 2] = [&redis, &reference];
    let write = |value: &str| {
        for s in stores {
            let raws = [raw("m", "k", now, 1, &[("country", value)])];
            s.apply(&batch(s, now, &raws, &Defaults::default()))
                .unwrap();
        }
    };
    let record = || primary.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    for s in stores {
        s.put_schema(&ns, &hourly).unwrap();
    }

    replica.pause();
    write("US");
    assert!(
        record().contains(r#""pending":{"3600":{"country""#),
        "{}",
        record()
    );
    assert!(!record().contains(r#""codes""#), "{}", record());
    let spelled_only = fields(&primary, "m");
    assert!(
        spelled_only.iter().all(|f| !f.contains('.')),
        "{spelled_only:?}"
    );
    assert_eq!(read_all(&redis, "m", "k", 3600).unwrap(), {
        read_all(&reference, "m", "k", 3600).unwrap()
    });

    // For a while after the replicas did not answer, writes spell out without waiting
    // again; then one waits, and confirms the code.
    replica.resume();
    write("US");
    assert!(record().contains(r#""pending""#), "{}", record());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    write("US");
    write("FR");
    assert!(
        record().contains(r#""codes":{"3600":{"country""#),
        "{}",
        record()
    );
    assert!(!record().contains(r#""pending""#), "{}", record());
    assert!(fields(&primary, "m").iter().any(|f| f.contains('.')));
    assert_eq!(read_all(&redis, "m", "k", 3600).unwrap(), {
        read_all(&reference, "m", "k", 3600).unwrap()
    });
    let got = read_all(&redis, "m", "k", 3600).unwrap();
    let us = got.subtotals.iter().find(|s| s.value == "US").unwrap();
    assert_eq!(us.buckets[0].1, 3, "spelled out and coded add up");
}

/// A failover that loses a confirmation leaves a used code pending: reads still find its
/// fields, by every route, and the next write confirms it again.
#[test]
fn fields_of_a_pending_code_are_read() {
    let server = RedisServer::start();
    let now = real_now();
    let hour = now.div_euclid(3600) * 3600;
    let window = layout::window_of(hour, 3600);
    let offset = layout::offset_of(hour, window, 3600);
    let _ = RedisStore::connect(&server.url()).unwrap();
    let record = format!(
        r#"{{"schema":{{"tiers":["1h:forever"],"breakdown_tiers":["1h"],"dimensions":null}},"generation":{{"3600":1}},"breakdown_generation":{{"3600":2}},"pending":{{"3600":{{"country":3}}}},"fresh":4,"layout":{}}}"#,
        layout::LAYOUT_VERSION
    );
    server.cli(&["hset", layout::SCHEMAS_KEY, "m", &record]);
    let hash = format!("tally:w:{{m|k}}:1:3600:{window}");
    let coded = layout::coded_field(offset, 3, "US");
    let spelled = layout::subtotal_field(offset, 2, "country", "US");
    server.cli(&[
        "hset",
        &hash,
        &offset.to_string(),
        "5",
        &coded,
        "3",
        &spelled,
        "2",
    ]);
    server.cli(&["zadd", "tally:keys:{m}", "0", "k"]);
    let redis = RedisStore::connect(&server.url()).unwrap();

    let got = read_all(&redis, "m", "k", 3600).unwrap();
    assert_eq!(got.subtotals.len(), 1);
    assert_eq!(got.subtotals[0].buckets, vec![(hour, 5)]);
    let ns = Namespace::new("m").unwrap();
    let key = Key::new("k").unwrap();
    let hour_res = Duration::from_secs(3600).unwrap();
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: hour_res,
        from: now - 86_400,
        to: now + 86_400,
        want: Want::Value {
            dim: "country",
            value: "US",
        },
        sum_subtotals: false,
        keep: None,
    };
    let value = redis.read(&[read]).unwrap().pop().unwrap();
    assert_eq!(value.subtotals[0].buckets, vec![(hour, 5)]);
    let scan = Scan {
        ns: &ns,
        resolution: hour_res,
        from: now - 86_400,
        to: now + 86_400,
        value: Some(("country", "US")),
        deadline: &Deadline::none(),
    };
    let mut seen = Vec::new();
    redis
        .scan(&scan, &mut |k, n| seen.push((k.clone(), n)))
        .unwrap();
    assert_eq!(seen, vec![(key.clone(), 5)]);

    // No replica: the next write confirms the code and uses it.
    let raws = [raw("m", "k", now, 1, &[("country", "US")])];
    redis
        .apply(&batch(&redis, now, &raws, &Defaults::default()))
        .unwrap();
    let after = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(
        after.contains(r#""codes":{"3600":{"country":3}}"#),
        "{after}"
    );
    assert_eq!(server.cli(&["hget", &hash, &coded]).trim(), "4");
}

/// In a cluster whose schemas node is down, a server answers from the schema records it
/// read last; a read those could make miss coded subtotals (a dimension given a code since)
/// fails with `unavailable` instead of answering too little, and reads that cannot miss any
/// still answer.
#[test]
fn a_stale_schema_record_serves_no_read_that_could_miss_codes() {
    let mut cluster = RedisCluster::start();
    let url = cluster.url();
    let schemas_node = cluster.node_of(layout::SCHEMAS_KEY);
    // A namespace and key whose index and series live elsewhere than the schemas.
    let ns = (0..64)
        .map(|i| format!("m{i}"))
        .find(|n| {
            let nsn = Namespace::new(n).unwrap();
            cluster.node_of(&layout::key_dir_key(&nsn)) != schemas_node
                && cluster.node_of(&layout::expiry_key(&nsn)) != schemas_node
        })
        .unwrap();
    let nsn = Namespace::new(&ns).unwrap();
    let key = (0..64)
        .map(|i| format!("k{i}"))
        .find(|k| cluster.node_of(&layout::series_tag(&nsn, k)) != schemas_node)
        .unwrap();
    let now = real_now();
    let stale = RedisStore::connect(&url).unwrap();
    let writer = RedisStore::connect(&url).unwrap();
    writer
        .put_schema(&nsn, &schema(&["1h:forever"], Some(&["1h"])))
        .unwrap();
    let first = [raw(&ns, &key, now, 1, &[("country", "US")])];
    writer
        .apply(&batch(&writer, now, &first, &Defaults::default()))
        .unwrap();
    // `stale` reads the record now: `country` has a code, `referrer` none yet.
    assert_eq!(
        read_all(&stale, &ns, &key, 3600).unwrap().subtotals.len(),
        1
    );
    let second = [raw(&ns, &key, now, 1, &[("referrer", "x")])];
    writer
        .apply(&batch(&writer, now, &second, &Defaults::default()))
        .unwrap();
    cluster.nodes[schemas_node].stop();

    let hour = Duration::from_secs(3600).unwrap();
    let keyn = Key::new(&key).unwrap();
    let read = |want| KeyRead {
        ns: &nsn,
        key: &keyn,
        resolution: hour,
        from: now - 86_400,
        to: now + 86_400,
        want,
        sum_subtotals: false,
        keep: None,
    };
    let refused = |r: Result<Vec<KeyData>, StoreError>| match r {
        Err(e @ StoreError::Unavailable { .. }) => {
            assert!(e.detail().contains("may miss subtotals"), "{}", e.detail());
        }
        other => panic!("expected unavailable, got {other:?}"),
    };
    // The referrer's fields are coded under a code `stale` does not know.
    refused(stale.read(&[read(Want::Value {
        dim: "referrer",
        value: "x",
    })]));
    refused(stale.read(&[read(Want::All)]));
    let scan = Scan {
        ns: &nsn,
        resolution: hour,
        from: now - 86_400,
        to: now + 86_400,
        value: Some(("referrer", "x")),
        deadline: &Deadline::none(),
    };
    let e = stale.scan(&scan, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    // What the record it has cannot get wrong still answers.
    let totals = stale.read(&[read(Want::Totals)]).unwrap().pop().unwrap();
    assert_eq!(totals.totals.iter().map(|(_, n)| n).sum::<i64>(), 2);
    let us = stale
        .read(&[read(Want::Value {
            dim: "country",
            value: "US",
        })])
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(us.subtotals[0].buckets[0].1, 1);
    // Validation and tier choice read the schema through `Store::schema`: it is the
    // record last read too, so writes to live nodes go on (a review saw every request of
    // every namespace refused while the schemas' node was down).
    assert!(stale.schema(&nsn).unwrap().is_some());
    let third = [raw(&ns, &key, now, 1, &[("country", "US")])];
    stale
        .apply(&batch(&stale, now, &third, &Defaults::default()))
        .unwrap();
    let totals = stale.read(&[read(Want::Totals)]).unwrap().pop().unwrap();
    assert_eq!(totals.totals.iter().map(|(_, n)| n).sum::<i64>(), 3);
    // A namespace never read is refused as before.
    let never = Namespace::new("never_read").unwrap();
    let e = stale.schema(&never).unwrap_err();
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
}

/// An event no breakdown tier keeps (too old for it) writes no subtotal, so it gives its
/// dimensions no code: codes are few, and not spent on nothing.
#[test]
fn events_no_breakdown_tier_keeps_give_no_code() {
    let server = RedisServer::start();
    let now = real_now();
    let redis = RedisStore::connect(&server.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    redis
        .put_schema(&ns, &schema(&["1m:2h", "1h:forever"], Some(&["1m"])))
        .unwrap();
    let old = [raw("m", "k", now - 3 * 3600, 1, &[("country", "US")])];
    redis
        .apply(&batch(&redis, now, &old, &Defaults::default()))
        .unwrap();
    let record = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(!record.contains("country"), "{record}");
    let recent = [raw("m", "k", now, 1, &[("country", "US")])];
    redis
        .apply(&batch(&redis, now, &recent, &Defaults::default()))
        .unwrap();
    let record = server.cli(&["hget", layout::SCHEMAS_KEY, "m"]);
    assert!(record.contains(r#""codes":{"60":{"country""#), "{record}");
}

//! Dimension codes (layout 3): subtotals are written `<offset>.<code>:<value>` while their
//! tier has a code to give, spelled out past the cap, and every read adds both forms; a
//! database of layout 2 (spelled-out fields only) is read as it is and marked layout 3.

use std::sync::Arc;

use tally_core::ingest::Defaults;
use tally_core::model::{Duration, Key, Namespace};
use tally_core::reference::MemStore;
use tally_core::store::{Deadline, KeyData, KeyRead, ManualClock, Scan, Store, Want};
use tally_redis::testing::RedisServer;
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
/// is opened as it is: its data reads back, new writes take codes and add to it, and the
/// database is marked layout 3 so that older builds refuse it.
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
    assert_eq!(server.cli(&["get", layout::LAYOUT_KEY]).trim(), "3");
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

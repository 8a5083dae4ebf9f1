//! Long reads are clipped to where the namespace has data (`layout::extent_key`): a read of
//! "all time" names the windows data spans, not one per window since 1970 (with a `1m`
//! tier kept forever, over a million), which would hold Redis for minutes.

use tally_core::ingest::Defaults;
use tally_core::model::{Duration, Key, Namespace};
use tally_core::store::{Deadline, KeyRead, Scan, Store, Want};
use tally_redis::RedisStore;
use tally_redis::testing::RedisServer;

use crate::{batch, raw, real_now, scanned, schema, with_reference};

/// Hash reads Redis ran since the last `CONFIG RESETSTAT` (scripts' calls included).
fn hash_reads(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| {
            ["cmdstat_hlen:", "cmdstat_hgetall:", "cmdstat_hmget:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[test]
fn reads_of_all_time_name_only_the_windows_data_spans() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let ns = Namespace::new("m").unwrap();
    store
        .put_schema(&ns, &schema(&["1m:forever", "1h:forever"], None))
        .unwrap();
    let now = real_now();
    let b = batch(
        &store,
        now,
        &[
            raw("m", "k", now, 2, &[]),
            raw("m", "k", now - 86_400, 3, &[]),
        ],
        &Defaults::default(),
    );
    store.apply(&b).unwrap();
    let key = Key::new("k").unwrap();
    let minute = Duration::from_secs(60).unwrap();
    let all_time = |want| KeyRead {
        ns: &ns,
        key: &key,
        resolution: minute,
        from: 0,
        to: 1 << 32,
        want,
        sum_subtotals: false,
        keep: None,
    };
    server.cli(&["CONFIG", "RESETSTAT"]);
    let d = store
        .read(&[all_time(Want::Totals)])
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(d.totals.iter().map(|(_, n)| n).sum::<i64>(), 5);
    let reads = hash_reads(&server);
    assert!(reads < 100, "{reads} hash reads for two buckets");

    // A top of all time, the same.
    server.cli(&["CONFIG", "RESETSTAT"]);
    let mut seen = Vec::new();
    let none = Deadline::none();
    let scan = Scan {
        ns: &ns,
        resolution: minute,
        from: 0,
        to: 1 << 32,
        value: None,
        deadline: &none,
    };
    store
        .scan(&scan, &mut |k, n| seen.push((k.to_string(), n)))
        .unwrap();
    assert_eq!(seen, vec![("k".to_owned(), 5)]);
    let reads = hash_reads(&server);
    assert!(reads < 100, "{reads} hash reads for two buckets");

    // Data written before the extent (a backfill) widens it, and is read.
    let old = 946_684_800;
    let b = batch(
        &store,
        now,
        &[raw("m", "k", old, 7, &[])],
        &Defaults::default(),
    );
    store.apply(&b).unwrap();
    let d = store
        .read(&[all_time(Want::Totals)])
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(d.totals.iter().map(|(_, n)| n).sum::<i64>(), 12);
    assert_eq!(d.totals.first(), Some(&(old, 7)));
    // A short read is not clipped, and agrees.
    let short = KeyRead {
        from: now - 2 * 86_400,
        to: now + 60,
        ..all_time(Want::Totals)
    };
    let d = store.read(&[short]).unwrap().pop().unwrap();
    assert_eq!(d.totals.iter().map(|(_, n)| n).sum::<i64>(), 5);
}

/// A scan (a `top`) over 14 years of an hourly tier: each series names ~1 000 windows,
/// 120 000–245 000 hash fields, read in runs of calls of at most `GROUP_WORK` fields each
/// (one call per series named them all, holding Redis for long), a few keys a page. It
/// answers as the reference store does, by total and by value.
#[test]
fn a_scan_over_years_is_read_in_runs_and_answers_like_the_reference() {
    let server = RedisServer::start();
    let (redis, reference, now) = with_reference(&server.url());
    let ns = Namespace::new("m").unwrap();
    let span = 14 * 365 * 86_400;
    let raws: Vec<_> = (0..30)
        .flat_map(|k| {
            (0..40).map(move |i| {
                let ts = now - span + ((k * 7_919 + i * 104_729) % 4_000) * (span / 4_000);
                let country = ["c1", "c2", "c3"][(k + i) as usize % 3];
                (format!("k{k:02}"), ts, 1 + (k + i) % 5, country)
            })
        })
        .map(|(key, ts, n, country)| raw("m", &key, ts, n, &[("country", country)]))
        .collect();
    let stores: [&dyn Store; 2] = [&redis, &reference];
    for s in stores {
        s.put_schema(&ns, &schema(&["1h:forever"], Some(&["1h"])))
            .unwrap();
        s.apply(&batch(s, now, &raws, &Defaults::default()))
            .unwrap();
    }
    for value in [None, Some(("country", "c1"))] {
        let scan = Scan {
            ns: &ns,
            resolution: Duration::from_secs(3600).unwrap(),
            from: (now - span - 3600).div_euclid(3600) * 3600,
            to: (now + 3600).div_euclid(3600) * 3600,
            value,
            deadline: &Deadline::none(),
        };
        let want = scanned(&reference, &scan);
        assert_eq!(want.len(), 30, "{value:?}: {want:?}");
        assert_eq!(scanned(&redis, &scan), want, "{value:?}");
    }
}

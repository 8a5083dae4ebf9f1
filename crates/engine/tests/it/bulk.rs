//! Bulk install: the same events aggregated and installed as segments read exactly as when
//! applied through the write path — with live data in memory before, deltas over archived
//! periods, restarts, retention, and the idempotency answers published with them.

use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Namespace, Schema, SchemaDoc};
use tally_core::store::{IdemRecord, KeyList, Store};
use tally_engine::{Bulk, FsyncPolicy};

use crate::{NOW, clock, open, raw, read_all};

fn schema() -> Schema {
    Schema::from_doc(&SchemaDoc {
        tiers: vec!["1m:2d".into(), "1h:forever".into()],
        breakdown_tiers: Some(vec!["1h".into()]),
        dimensions: None,
    })
    .unwrap()
}

/// Events over ten days (the minute tier keeps the last two), on a few keys.
fn events(seed: u64) -> Vec<tally_core::model::RawEvent> {
    let mut x = seed;
    (0..3000)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = format!("k{}", (x >> 33) % 7);
            let ts = NOW - 10 * 86_400 + ((x >> 8) % (10 * 86_400)) as i64;
            let c = format!("C{}", (x >> 20) % 3);
            if i % 4 == 0 {
                raw("clicks", &key, ts, 1 + (i % 3) as i64, &[])
            } else {
                raw("clicks", &key, ts, 1, &[("country", &c), ("device", "m")])
            }
        })
        .collect()
}

#[test]
fn installed_segments_read_like_the_write_path() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let c = clock(NOW);
    let a = open(a_dir.path(), &c, FsyncPolicy::Never);
    let b = open(b_dir.path(), &c, FsyncPolicy::Never);
    let ns = Namespace::new("clicks").unwrap();
    for e in [&a, &b] {
        e.put_schema(&ns, &schema()).unwrap();
    }
    let live = events(1);
    let history = events(2);
    // Both hold some live events in memory first.
    for e in [&a, &b] {
        let batch =
            ingest::prepare(e, &live, NOW, &Limits::default(), &Defaults::default()).unwrap();
        e.apply(&batch).unwrap();
    }
    // A: the history through the write path. B: aggregated and installed, in two installs
    // (the second's periods are archived already, so it writes deltas).
    let batch =
        ingest::prepare(&a, &history, NOW, &Limits::default(), &Defaults::default()).unwrap();
    a.apply(&batch).unwrap();
    let batch =
        ingest::prepare(&b, &history, NOW, &Limits::default(), &Defaults::default()).unwrap();
    let (first, second) = batch.increments.split_at(1000);
    let mut bulk = Bulk::default();
    for inc in first {
        bulk.add(&schema(), inc, NOW);
    }
    assert!(bulk.counters() > 0);
    let answer = IdemRecord {
        key: "load-1".into(),
        fingerprint: "load-1".into(),
        expires: NOW + 86_400,
        status: 200,
        body: "{}".into(),
    };
    let report = b.install(bulk, vec![answer.clone()]).unwrap();
    assert!(report.segments > 0);
    let mut bulk = Bulk::default();
    for inc in second {
        bulk.add(&schema(), inc, NOW);
    }
    b.install(bulk, Vec::new()).unwrap();
    assert_eq!(b.idempotency("load-1").unwrap(), Some(answer.clone()));

    let check = |a: &dyn Store, b: &dyn Store| {
        for k in 0..7 {
            let key = format!("k{k}");
            for res in [60, 3600] {
                assert_eq!(
                    read_all(a, "clicks", &key, res),
                    read_all(b, "clicks", &key, res),
                    "{key} at {res}s"
                );
            }
        }
        let list = |s: &dyn Store| {
            s.keys(&KeyList {
                ns: &ns,
                prefix: "",
                after: None,
                limit: 100,
            })
            .unwrap()
        };
        assert_eq!(list(a), list(b));
    };
    check(&a, &b);
    // The minute tier keeps two days: an install writes nothing older.
    assert!(
        read_all(&b, "clicks", "k1", 60)
            .totals
            .iter()
            .all(|(t, _)| *t >= NOW - 2 * 86_400 - 60)
    );
    // After a restart, the same, and the answer is still there.
    drop(b);
    let b = open(b_dir.path(), &c, FsyncPolicy::Never);
    check(&a, &b);
    assert_eq!(b.idempotency("load-1").unwrap(), Some(answer));
    // Later writes land on top as usual.
    for e in [&a, &b] {
        let batch =
            ingest::prepare(e, &live, NOW, &Limits::default(), &Defaults::default()).unwrap();
        e.apply(&batch).unwrap();
    }
    check(&a, &b);
}

/// Writes beside an install land on top of it, and survive a restart: nothing is marked
/// archived that the archive does not hold.
#[test]
fn writes_during_an_install_are_kept() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let c = clock(NOW);
    let e = Arc::new(open(dir.path(), &c, FsyncPolicy::Never));
    let ns = Namespace::new("clicks").unwrap();
    e.put_schema(&ns, &schema()).unwrap();
    let history = events(5);
    let batch =
        ingest::prepare(&*e, &history, NOW, &Limits::default(), &Defaults::default()).unwrap();
    let want_history: i64 = batch.increments.iter().map(|i| i.n).sum();
    let writer = {
        let e = e.clone();
        std::thread::spawn(move || {
            for i in 0..300 {
                crate::write(&*e, NOW, &[raw("clicks", "live", NOW - 5 - i % 50, 1, &[])]).unwrap();
            }
        })
    };
    let mut installed = 0;
    while installed < 3 {
        let mut bulk = Bulk::default();
        for inc in &batch.increments {
            bulk.add(&schema(), inc, NOW);
        }
        e.install(bulk, Vec::new()).unwrap();
        installed += 1;
    }
    writer.join().unwrap();
    let sum_of = |e: &dyn Store| -> i64 {
        (0..7)
            .map(|k| crate::total(e, "clicks", &format!("k{k}"), 3600))
            .sum()
    };
    assert_eq!(sum_of(&*e), 3 * want_history);
    assert_eq!(crate::total(&*e, "clicks", "live", 3600), 300);
    let e = Arc::try_unwrap(e).ok().unwrap();
    drop(e);
    let e = open(dir.path(), &c, FsyncPolicy::Never);
    assert_eq!(sum_of(&e), 3 * want_history);
    assert_eq!(crate::total(&e, "clicks", "live", 3600), 300);
}

/// A rebuild replaces a range atomically for readers: a query running meanwhile — one key's
/// read, or a scan of every key (`top`) — sees the range's old counts or its new ones, never
/// a mix; the rest of history is untouched.
#[test]
fn readers_see_the_old_range_or_the_new_during_a_rebuild() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tally_core::store::{Deadline, Scan};
    let dir = tempfile::tempdir().unwrap();
    let c = clock(NOW);
    let e = Arc::new(open(dir.path(), &c, FsyncPolicy::Never));
    let ns = Namespace::new("clicks").unwrap();
    e.put_schema(&ns, &schema()).unwrap();
    crate::write(&*e, NOW, &events(9)).unwrap();
    let (from, to) = (NOW - 5 * 86_400, NOW - 4 * 86_400);
    let key_total = move |e: &dyn Store, k: usize| -> i64 {
        crate::read_all(e, "clicks", &format!("k{k}"), 3600)
            .totals
            .iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|(_, n)| n)
            .sum()
    };
    let scan_total = move |e: &dyn Store| -> i64 {
        let ns = Namespace::new("clicks").unwrap();
        let mut sum = 0;
        e.scan(
            &Scan {
                ns: &ns,
                resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
                from,
                to,
                value: None,
                deadline: &Deadline::none(),
            },
            &mut |_, n| sum += n,
        )
        .unwrap();
        sum
    };
    let everything = |e: &dyn Store| -> i64 {
        (0..7)
            .map(|k| crate::total(e, "clicks", &format!("k{k}"), 3600))
            .sum()
    };
    let old: Vec<i64> = (0..7).map(|k| key_total(&*e, k)).collect();
    let old_sum: i64 = old.iter().sum();
    assert!(old_sum > 0);
    assert_eq!(scan_total(&*e), old_sum);
    let rest = everything(&*e) - old_sum;
    // The new range: 50 events of 7 on k1, nothing on the other keys.
    let new_events: Vec<_> = (0..50)
        .map(|i| raw("clicks", "k1", from + 60 * i, 7, &[("country", "NEW")]))
        .collect();
    let new: Vec<i64> = (0..7).map(|k| if k == 1 { 350 } else { 0 }).collect();
    let batch = ingest::prepare(
        &*e,
        &new_events,
        NOW,
        &Limits::default(),
        &Defaults::default(),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (e, stop, old, new) = (e.clone(), stop.clone(), old.clone(), new.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::SeqCst) {
                for k in 0..7 {
                    let t = key_total(&*e, k);
                    assert!(
                        t == old[k] || t == new[k],
                        "k{k}: {t} (old {}, new {})",
                        old[k],
                        new[k]
                    );
                }
                let t = scan_total(&*e);
                assert!(
                    t == old_sum || t == 350,
                    "scan: {t} (old {old_sum}, new 350)"
                );
                reads += 1;
            }
            reads
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let held = e.rebuild(&ns, from, to, &batch).unwrap();
    assert!(held > 0);
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    assert_eq!((0..7).map(|k| key_total(&*e, k)).collect::<Vec<_>>(), new);
    assert_eq!(scan_total(&*e), 350);
    assert_eq!(
        everything(&*e) - 350,
        rest,
        "the rest of history is untouched"
    );
    let subs = crate::read_all(&*e, "clicks", "k1", 3600);
    let new_sub: i64 = subs
        .subtotals
        .iter()
        .filter(|s| s.value == "NEW")
        .flat_map(|s| s.buckets.iter().map(|(_, n)| n))
        .sum();
    assert_eq!(new_sub, 350);
    // Again: nothing changes.
    e.rebuild(&ns, from, to, &batch).unwrap();
    assert_eq!(scan_total(&*e), 350);
    assert_eq!(everything(&*e) - 350, rest);
}

#[test]
fn a_rebuild_under_concurrent_writes_leaves_every_tier_agreeing() {
    // A rebuild reads what the range holds, tier by tier, and installs the difference;
    // writes to the range meanwhile are either replaced (before the rebuild read their key)
    // or kept on top (after) — in every tier alike, so minutes and hours still agree.
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let e = std::sync::Arc::new(crate::open(
        dir.path(),
        &clock,
        tally_engine::FsyncPolicy::Never,
    ));
    let keys: Vec<String> = (0..300).map(|i| format!("k{i:03}")).collect();
    let day = NOW - 86_400;
    let events: Vec<_> = keys
        .iter()
        .map(|k| crate::raw("clicks", k, day + 60, 2, &[]))
        .collect();
    crate::write(&*e, NOW, &events).unwrap();
    let ns = tally_core::model::Namespace::new("clicks").unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (e, keys, done) = (e.clone(), keys.clone(), done.clone());
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let k = &keys[i % keys.len()];
                crate::write(&*e, NOW, &[crate::raw("clicks", k, day + 120, 1, &[])]).unwrap();
                i += 1;
            }
        })
    };
    for _ in 0..5 {
        e.rebuild_bulk(&ns, day, day + 3600, tally_engine::Bulk::default())
            .unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    for k in &keys {
        assert_eq!(
            crate::total(&*e, "clicks", k, 60),
            crate::total(&*e, "clicks", k, 3600),
            "{k}: minutes and hours disagree"
        );
    }
}

#[test]
fn a_rebuild_past_its_memory_budget_stops_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let e = crate::open(dir.path(), &clock, tally_engine::FsyncPolicy::Never);
    let day = NOW - 86_400;
    let events: Vec<_> = (0..3000)
        .map(|i| crate::raw("clicks", &format!("k{i:04}"), day + 60 + i, 1, &[]))
        .collect();
    crate::write(&e, NOW, &events).unwrap();
    let ns = tally_core::model::Namespace::new("clicks").unwrap();
    let mut bulk = tally_engine::Bulk::default();
    bulk.set_budget(64 << 10);
    let err = e.rebuild_bulk(&ns, day, day + 3600, bulk).unwrap_err();
    assert!(err.detail().contains("memory budget"), "{err:?}");
    // A bound, not an outage: no "backend unavailable", and a 4xx code.
    assert!(!err.detail().contains("unavailable"), "{err:?}");
    assert_eq!(err.code(), tally_core::ErrorCode::TooManyPoints);
    for k in ["k0000", "k2999"] {
        assert_eq!(crate::total(&e, "clicks", k, 3600), 1, "{k}");
    }
    // With room, the same rebuild (to nothing) goes through.
    let mut bulk = tally_engine::Bulk::default();
    bulk.set_budget(256 << 20);
    assert_eq!(e.rebuild_bulk(&ns, day, day + 3600, bulk).unwrap(), 6000);
    assert_eq!(crate::total(&e, "clicks", "k0000", 3600), 0);
}

/// A tier finer than an hour kept long (`30m:forever`, for a half-hour time zone) is
/// installed a UTC day a segment for the days over for an hour — what compaction makes of
/// them — not an hour a segment: a backfill of a year wrote ~8 000 segments and compacted
/// them 512 at a time, 50 times slower than into `1h:forever` (found by a review). What it
/// reads is what the write path gives, before and after a restart, and a second install
/// over the same days (deltas) and late writes land on top.
#[test]
fn a_long_fine_tier_is_installed_a_day_a_segment() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // An hour past midnight (NOW): the day before is over for an hour, today is not.
    let now = NOW + 3600;
    let c = clock(now);
    let a = open(a_dir.path(), &c, FsyncPolicy::Never);
    let b = open(b_dir.path(), &c, FsyncPolicy::Never);
    let ns = Namespace::new("clicks").unwrap();
    let half = Schema::from_doc(&SchemaDoc {
        tiers: vec!["30m:forever".into()],
        breakdown_tiers: None,
        dimensions: None,
    })
    .unwrap();
    for e in [&a, &b] {
        e.put_schema(&ns, &half).unwrap();
    }
    // Ten days before NOW, and today's first hour.
    let history: Vec<_> = events(3)
        .into_iter()
        .chain((0..100).map(|i| raw("clicks", "k1", NOW + 30 * i, 1, &[])))
        .collect();
    let batch =
        ingest::prepare(&a, &history, now, &Limits::default(), &Defaults::default()).unwrap();
    a.apply(&batch).unwrap();
    let batch =
        ingest::prepare(&b, &history, now, &Limits::default(), &Defaults::default()).unwrap();
    let install = |incs: &[tally_core::store::Increment]| {
        let mut bulk = Bulk::default();
        for inc in incs {
            bulk.add(&half, inc, now);
        }
        b.install(bulk, Vec::new()).unwrap()
    };
    let (first, second) = batch.increments.split_at(2000);
    // At most ten whole days (of half-hours, 48 a day), then as many deltas and today's
    // hour: an hour a segment made up to 240 each time.
    let report = install(first);
    assert!(report.segments <= 10, "{report:?}");
    let report = install(second);
    assert!(report.segments <= 11, "{report:?}");
    let check = |b: &dyn Store| {
        for k in 0..7 {
            let key = format!("k{k}");
            assert_eq!(
                read_all(&a, "clicks", &key, 1800),
                read_all(b, "clicks", &key, 1800),
                "{key}"
            );
        }
    };
    check(&b);
    drop(b);
    let b = open(b_dir.path(), &c, FsyncPolicy::Never);
    check(&b);
    let late = [raw("clicks", "k2", NOW - 5 * 86_400 + 100, 4, &[])];
    for e in [&a, &b] {
        let batch =
            ingest::prepare(e, &late, now, &Limits::default(), &Defaults::default()).unwrap();
        e.apply(&batch).unwrap();
    }
    b.flush().unwrap();
    check(&b);
}

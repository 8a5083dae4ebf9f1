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
    let policy = b.flush_policy();
    let (first, second) = batch.increments.split_at(1000);
    let mut bulk = Bulk::default();
    for inc in first {
        bulk.add(&policy, &schema(), inc, NOW);
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
        bulk.add(&policy, &schema(), inc, NOW);
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
    let policy = e.flush_policy();
    let mut installed = 0;
    while installed < 3 {
        let mut bulk = Bulk::default();
        for inc in &batch.increments {
            bulk.add(&policy, &schema(), inc, NOW);
        }
        match e.install(bulk, Vec::new()) {
            Ok(_) => installed += 1,
            // A write between the flush and the install's snapshot: try again.
            Err(err) => assert!(err.detail().contains("install again"), "{err:?}"),
        }
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

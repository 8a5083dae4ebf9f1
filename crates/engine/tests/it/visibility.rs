//! Per-key atomic visibility: while writers add events that each carry a dimension, a
//! reader of the key must always see the subtotals sum exactly to the total — flushes,
//! compactions and schema changes running beside them included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tally_core::model::{Key, Namespace, Schema};
use tally_core::store::{KeyRead, Scan, Store, Want};
use tally_engine::FsyncPolicy;

use crate::{NOW, clock, open, raw, write};

#[test]
fn a_reader_never_sees_half_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let c = clock(NOW);
    let engine = Arc::new(open(dir.path(), &c, FsyncPolicy::Never));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    let country = format!("c{}", (i + w) % 5);
                    let raws: Vec<_> = (0..20)
                        .map(|j| {
                            raw(
                                "v",
                                if j % 2 == 0 { "hot" } else { "other" },
                                NOW - j,
                                (i % 7) + 1,
                                &[("country", &country)],
                            )
                        })
                        .collect();
                    write(&*engine, NOW, &raws).unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let engine = engine.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ns = Namespace::new("v").unwrap();
            let key = Key::new("hot").unwrap();
            let mut checks = 0u64;
            while !stop.load(Ordering::SeqCst) || checks == 0 {
                let read = KeyRead {
                    ns: &ns,
                    key: &key,
                    resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
                    from: 0,
                    to: 1 << 32,
                    want: Want::Dim { dim: "country" },
                    sum_subtotals: false,
                    keep: None,
                };
                let d = engine.read(&[read]).unwrap().pop().unwrap();
                let (total, subs) = crate::sums(&d);
                assert_eq!(
                    subs, total,
                    "a read saw an event's total without its subtotal"
                );
                checks += 1;
            }
            checks
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    let expected: i64 = (0..2)
        .map(|_| (0..300).map(|i| 10 * ((i % 7) + 1)).sum::<i64>())
        .sum();
    assert_eq!(crate::total(&*engine, "v", "hot", 3600), expected);
}

/// The same while flushes move counters into the archive under the readers: a count is seen
/// in memory or in the archive, never both and never neither, and nothing is lost or doubled.
#[test]
fn flushes_under_readers_and_writers_neither_hide_nor_double_a_count() {
    let dir = tempfile::tempdir().unwrap();
    let c = clock(NOW);
    let engine = Arc::new(crate::archive::open_with(
        dir.path(),
        &c,
        crate::archive::HOURLY,
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let flushed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Events spread over the last 20 hours: every flush finds closed hours, and later
    // writes keep landing in hours already archived (delta segments).
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let engine = engine.clone();
            let flushed = flushed.clone();
            std::thread::spawn(move || {
                for i in 0..200i64 {
                    if i == 100 {
                        // Halfway, wait until a flush has archived something, so the second
                        // half is written while the archive is in use (bounded wait).
                        let t = std::time::Instant::now();
                        while flushed.load(Ordering::SeqCst) == 0
                            && t.elapsed() < std::time::Duration::from_secs(10)
                        {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                    let country = format!("c{}", (i + w) % 5);
                    let raws: Vec<_> = (0..10)
                        .map(|j| {
                            raw(
                                "v",
                                "hot",
                                NOW - 1 - (i * 10 + j) * 360 % 72_000,
                                1,
                                &[("country", &country)],
                            )
                        })
                        .collect();
                    write(&*engine, NOW, &raws).unwrap();
                }
            })
        })
        .collect();
    let flusher = {
        let engine = engine.clone();
        let stop = stop.clone();
        let flushed = flushed.clone();
        std::thread::spawn(move || {
            let mut segments = 0;
            while !stop.load(Ordering::SeqCst) {
                let n = engine.flush().unwrap().segments;
                flushed.fetch_add(n, Ordering::SeqCst);
                segments += n;
                engine.compact().unwrap();
            }
            segments
        })
    };
    let reader = {
        let engine = engine.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ns = Namespace::new("v").unwrap();
            let key = Key::new("hot").unwrap();
            let (mut checks, mut last) = (0u64, 0i64);
            while !stop.load(Ordering::SeqCst) || checks == 0 {
                let read = KeyRead {
                    ns: &ns,
                    key: &key,
                    resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
                    from: 0,
                    to: 1 << 32,
                    want: Want::Dim { dim: "country" },
                    sum_subtotals: false,
                    keep: None,
                };
                let d = engine.read(&[read]).unwrap().pop().unwrap();
                let (total, subs) = crate::sums(&d);
                assert_eq!(subs, total, "subtotals and total disagree mid-flush");
                assert!(total >= last, "a count vanished: {total} after {last}");
                last = total;
                checks += 1;
            }
            checks
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    let segments = flusher.join().unwrap();
    assert!(segments > 0, "no flush happened under the test");
    engine.flush().unwrap();
    assert_eq!(crate::total(&*engine, "v", "hot", 3600), 2 * 200 * 10);
    drop(engine);
    let engine = open(dir.path(), &c, FsyncPolicy::Never);
    assert_eq!(crate::total(&engine, "v", "hot", 3600), 2 * 200 * 10);
}

/// Keys the stress below spreads its events over.
const MANY_KEYS: i64 = 5000;

fn many_keys_event(w: i64, i: i64, j: i64) -> (String, i64, String) {
    let key = format!("k{:05}", (i * 97 + j * 13 + w * 7) % MANY_KEYS);
    let ts = NOW - 1 - ((i * 40 + j) * 977 + w * 31) % 10_800;
    let country = format!("c{}", (i + j + w) % 7);
    (key, ts, country)
}

/// Flushes and compactions over many keys, back to back, beside two writers, a reader of
/// keys and scans, and another namespace's schema flipping (which drops frozen counters a
/// flush may be sharing): the reader always sees subtotals summing to the total and scans
/// never shrink, and every count is exact after, after a last flush and after a restart.
/// (From an independent review of the chunked flush; that a flush of more keys than one
/// chunk writes them all is `archive::a_flush_of_more_keys_than_one_chunk_writes_every_key`.)
#[test]
fn flushes_of_many_keys_beside_writers_readers_and_schema_changes_count_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let c = clock(NOW);
    let engine = Arc::new(crate::archive::open_with(
        dir.path(),
        &c,
        crate::archive::HOURLY,
    ));
    // Another namespace whose schema flips, so apply_schema drops frozen counters.
    write(
        &*engine,
        NOW,
        &[raw("other", "x", NOW - 7200, 1, &[("d", "v")])],
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    const BATCHES: i64 = 400;
    const PER: i64 = 40;
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..BATCHES {
                    let raws: Vec<_> = (0..PER)
                        .map(|j| {
                            let (k, ts, country) = many_keys_event(w, i, j);
                            raw("v", &k, ts, 1, &[("country", &country)])
                        })
                        .collect();
                    write(&*engine, NOW, &raws).unwrap();
                    let o: Vec<_> = (0..20)
                        .map(|j| {
                            raw(
                                "other",
                                &format!("o{j}"),
                                NOW - 1 - j * 3600,
                                1,
                                &[("d", "v")],
                            )
                        })
                        .collect();
                    write(&*engine, NOW, &o).unwrap();
                }
            })
        })
        .collect();
    let flusher = {
        let engine = engine.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            std::thread::sleep(std::time::Duration::from_millis(60));
            while !stop.load(Ordering::SeqCst) {
                n += engine.flush().unwrap().segments;
                engine.compact().unwrap();
            }
            n
        })
    };
    let schemer = {
        let engine = engine.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ns = Namespace::new("other").unwrap();
            let minute_only = crate::minute_only();
            let mut flips = 0;
            while !stop.load(Ordering::SeqCst) {
                let s = if flips % 2 == 0 {
                    &minute_only
                } else {
                    &Schema::default()
                };
                engine.put_schema(&ns, s).unwrap();
                flips += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            flips
        })
    };
    let reader = {
        let engine = engine.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ns = Namespace::new("v").unwrap();
            let (mut checks, mut last) = (0u64, 0i64);
            while !stop.load(Ordering::SeqCst) || checks == 0 {
                for k in (0..MANY_KEYS).step_by(397) {
                    let key = Key::new(&format!("k{k:05}")).unwrap();
                    let read = KeyRead {
                        ns: &ns,
                        key: &key,
                        resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
                        from: 0,
                        to: 1 << 32,
                        want: Want::Dim { dim: "country" },
                        sum_subtotals: false,
                        keep: None,
                    };
                    let d = engine.read(&[read]).unwrap().pop().unwrap();
                    let (total, subs) = crate::sums(&d);
                    assert_eq!(subs, total, "subtotals and total disagree mid-flush ({k})");
                }
                let scan = Scan {
                    ns: &ns,
                    resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
                    from: NOW - 2 * 86_400,
                    to: NOW + 3600,
                    value: None,
                    deadline: &tally_core::store::Deadline::none(),
                };
                let mut sum = 0i64;
                engine.scan(&scan, &mut |_, n| sum += n).unwrap();
                assert!(sum >= last, "a scan lost counts: {sum} after {last}");
                last = sum;
                checks += 1;
            }
            checks
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let checks = reader.join().unwrap();
    let segs = flusher.join().unwrap();
    let flips = schemer.join().unwrap();
    assert!(
        checks > 0 && segs > 0 && flips > 0,
        "{checks} {segs} {flips}"
    );
    let mut expected = std::collections::BTreeMap::<String, i64>::new();
    for w in 0..2 {
        for i in 0..BATCHES {
            for j in 0..PER {
                *expected.entry(many_keys_event(w, i, j).0).or_default() += 1;
            }
        }
    }
    let verify = |e: &dyn Store| {
        for k in 0..MANY_KEYS {
            let key = format!("k{k:05}");
            let want = expected.get(&key).copied().unwrap_or(0);
            let d = crate::read_all(e, "v", &key, 3600);
            let (t, s) = crate::sums(&d);
            assert_eq!((t, s), (want, want), "{key} hourly");
            assert_eq!(crate::total(e, "v", &key, 60), want, "{key} minutes");
        }
    };
    verify(&*engine);
    engine.flush().unwrap();
    verify(&*engine);
    drop(engine);
    let engine = open(dir.path(), &c, FsyncPolicy::Never);
    verify(&engine);
}

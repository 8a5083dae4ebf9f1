//! Per-key atomic visibility: while writers add events that each carry a dimension, a
//! reader of the key must always see the subtotals sum exactly to the total.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tally_core::model::{Key, Namespace};
use tally_core::store::{KeyRead, Store, Want};
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
        tally_engine::FlushPolicy {
            hourly_period: 3600,
            fine_period: 3600,
            grace: 0,
        },
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

//! Totals and subtotals in their lanes through the memtable's harder moves — a failed flush
//! (counters thawed), a schema change while counters are frozen, keys forgotten and their
//! ids reused in another namespace (a key's total series id is `TOTAL | key id`), the
//! retention sweep — each checked on every read kind against the reference store.
//! (From an independent review of that id change.)

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use tally_core::model::{Duration, Key, Namespace, RawEvent, Schema, SchemaDoc};
use tally_core::reference::MemStore;
use tally_core::store::{Deadline, KeyList, KeyRead, ManualClock, Scan, Store, Want};
use tally_engine::io::{Fs, OsFs};
use tally_engine::{Config, Engine, FlushPolicy, FsyncPolicy};

use crate::{NOW, raw, read_all, write};

const DAY: i64 = 86_400;

/// An `Fs` whose next `remove` (the first step of writing a segment, after the flush froze
/// its counters and built its first records) can wait for the test, and whose `rename` can
/// fail (the flush then thaws its frozen counters).
#[derive(Debug)]
struct PauseFs {
    pause: AtomicBool,
    fail: AtomicBool,
    reached: Barrier,
    go: Barrier,
}

impl PauseFs {
    fn new() -> Self {
        PauseFs {
            pause: AtomicBool::new(false),
            fail: AtomicBool::new(false),
            reached: Barrier::new(2),
            go: Barrier::new(2),
        }
    }
}

impl Fs for PauseFs {
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        OsFs.write_new(path, bytes)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("a test's rename fails"));
        }
        OsFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        OsFs.sync_dir(dir)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        if self.pause.swap(false, Ordering::SeqCst) {
            self.reached.wait();
            self.go.wait();
        }
        OsFs.remove(path)
    }
}

fn open(dir: &Path, clock: &Arc<ManualClock>, fs: Arc<dyn Fs>) -> Engine {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.fsync = FsyncPolicy::Never;
    c.shards = 4;
    c.flush = FlushPolicy::default();
    c.fs = fs;
    Engine::open(c).unwrap()
}

/// A fresh engine over `fs` in a directory of its own, and the reference store, on one
/// clock at `NOW`.
struct Pair {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    r: MemStore,
    e: Engine,
}

fn pair(fs: Arc<dyn Fs>) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let r = MemStore::new(clock.clone());
    let e = open(dir.path(), &clock, fs);
    Pair { dir, clock, r, e }
}

fn both(e: &Engine, r: &MemStore, now: i64, raws: &[RawEvent]) {
    write(e, now, raws).unwrap();
    write(r, now, raws).unwrap();
}

/// Everything of `ns` a user sees, for `keys`, from both stores: key lists, reads at 60 s
/// and 3600 s (buckets and summed subtotals), scans and tops (by totals and by a value)
/// over several ranges and limits.
fn same(e: &Engine, r: &MemStore, now: i64, ns: &str, keys: &[String], what: &str) {
    let nsn = Namespace::new(ns).unwrap();
    let list = KeyList {
        ns: &nsn,
        prefix: "",
        after: None,
        limit: 100_000,
    };
    assert_eq!(
        e.keys(&list).unwrap(),
        r.keys(&list).unwrap(),
        "{what}: keys of {ns}"
    );
    let has_tier = |res: u64| {
        r.schema(&nsn)
            .unwrap()
            .is_some_and(|s| s.tiers().iter().any(|t| t.resolution.secs() == res))
    };
    for res in [60u64, 3600] {
        if !has_tier(res) {
            continue;
        }
        for k in keys {
            assert_eq!(
                read_all(e, ns, k, res),
                read_all(r, ns, k, res),
                "{what}: read {ns}/{k} at {res}s"
            );
            let key = Key::new(k.as_str()).unwrap();
            let read = KeyRead {
                ns: &nsn,
                key: &key,
                resolution: Duration::from_secs(res).unwrap(),
                from: now - 4 * DAY,
                to: now + DAY,
                want: Want::Dim { dim: "country" },
                sum_subtotals: true,
                keep: None,
            };
            assert_eq!(
                crate::folded(e, read),
                crate::folded(r, read),
                "{what}: summed read {ns}/{k} at {res}s"
            );
        }
        let hour = now / 3600 * 3600;
        let today = now / DAY * DAY;
        let ranges = [
            (hour - 3600, hour + 3600),
            (today, now + 3600),
            (today - DAY, today),
            (today - DAY + 5 * 3600, now + 3600),
            (now - 4 * DAY, now + DAY),
        ];
        for (from, to) in ranges {
            for value in [None, Some(("country", "US"))] {
                let deadline = Deadline::none();
                let scan = Scan {
                    ns: &nsn,
                    resolution: Duration::from_secs(res).unwrap(),
                    from,
                    to,
                    value,
                    deadline: &deadline,
                };
                let collect = |s: &dyn Store| {
                    let mut v = Vec::new();
                    s.scan(&scan, &mut |k, n| v.push((k.clone(), n))).unwrap();
                    v.sort();
                    v
                };
                assert_eq!(
                    collect(e),
                    collect(r),
                    "{what}: scan {ns} {value:?} at {res}s over {from}..{to}"
                );
                for limit in [0, 1, 5, 1000] {
                    assert_eq!(
                        e.top(&scan, limit).unwrap(),
                        r.top(&scan, limit).unwrap(),
                        "{what}: top {limit} {ns} {value:?} at {res}s over {from}..{to}"
                    );
                }
            }
        }
    }
}

/// Events over the last three days and the open hour: every key, two dimensions.
fn events(ns: &str, keys: &[String], now: i64, salt: i64) -> Vec<RawEvent> {
    let mut out = Vec::new();
    for h in 0..73 {
        for (i, k) in keys.iter().enumerate() {
            if (h + i as i64 + salt) % 3 == 0 {
                continue;
            }
            let ts = now - 3 * DAY + h * 3600 + 60 * (i as i64 % 50);
            if ts > now {
                continue;
            }
            let country = ["US", "DE", "JP"][(h as usize + i) % 3];
            out.push(raw(
                ns,
                k,
                ts,
                1 + (h + salt + i as i64) % 5,
                &[("country", country), ("referrer", "news")],
            ));
        }
    }
    out
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// A failed flush puts every frozen counter back in its lane: totals (ids >= 2^31) in the
/// totals map, where a top over memory walks and a read probes, subtotals in theirs.
#[test]
fn a_failed_flush_puts_totals_back_where_reads_and_tops_find_them() {
    let fs = Arc::new(PauseFs::new());
    let Pair { dir, clock, r, e } = pair(fs.clone());
    let keys = names("k", 40);
    both(&e, &r, NOW, &events("clicks", &keys, NOW, 0));
    same(&e, &r, NOW, "clicks", &keys, "before");
    let live = e.stats().live_counters;
    let failures = |e: &tally_engine::Engine| {
        use tally_core::store::Store;
        e.gauges()
            .iter()
            .find(|g| g.name == "tally_flush_failures_total")
            .map(|g| g.value)
    };
    assert_eq!(failures(&e), Some(0.0));
    fs.fail.store(true, Ordering::SeqCst);
    assert!(e.flush().is_err());
    assert_eq!(failures(&e), Some(1.0), "a failed flush shows in /metrics");
    assert_eq!(e.stats().live_counters, live, "every counter thawed");
    same(&e, &r, NOW, "clicks", &keys, "after a failed flush");
    // Late adds to thawed counters, then the flush succeeds.
    both(&e, &r, NOW, &events("clicks", &keys, NOW, 1));
    same(&e, &r, NOW, "clicks", &keys, "late adds after a thaw");
    fs.fail.store(false, Ordering::SeqCst);
    let report = e.flush().unwrap();
    assert!(report.segments > 0, "{report:?}");
    same(&e, &r, NOW, "clicks", &keys, "after the flush");
    drop(e);
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    same(&e, &r, NOW, "clicks", &keys, "reopened");
}

fn no_breakdowns() -> Schema {
    Schema::from_doc(&SchemaDoc {
        tiers: vec!["1m:2d".into(), "1h:forever".into()],
        breakdown_tiers: Some(vec![]),
        dimensions: None,
    })
    .unwrap()
}

/// A schema change while a flush has counters frozen drops the removed tier's counters
/// (totals too) or only the subtotals of a tier that stops keeping breakdowns; the flush
/// then fails (what is left thaws back to its lanes) or succeeds.
#[test]
fn a_schema_change_during_a_flush_drops_the_right_lanes() {
    for (schema, fail) in [
        (crate::minute_only(), true),
        (crate::minute_only(), false),
        (no_breakdowns(), true),
        (no_breakdowns(), false),
    ] {
        let what = format!("{:?} fail {fail}", schema.tiers().len());
        let fs = Arc::new(PauseFs::new());
        let Pair { dir, clock, r, e } = pair(fs.clone());
        let keys = names("k", 30);
        let others = names("o", 10);
        both(&e, &r, NOW, &events("clicks", &keys, NOW, 0));
        both(&e, &r, NOW, &events("other", &others, NOW, 2));
        fs.pause.store(true, Ordering::SeqCst);
        fs.fail.store(fail, Ordering::SeqCst);
        let ns = Namespace::new("clicks").unwrap();
        std::thread::scope(|s| {
            let flush = s.spawn(|| e.flush());
            fs.reached.wait();
            e.put_schema(&ns, &schema).unwrap();
            r.put_schema(&ns, &schema).unwrap();
            fs.go.wait();
            assert_eq!(flush.join().unwrap().is_err(), fail, "{what}");
        });
        // Both namespaces, the changed one and the other, after each step.
        let check = |e: &Engine, step: &str| {
            same(e, &r, NOW, "clicks", &keys, &format!("{what}: {step}"));
            same(
                e,
                &r,
                NOW,
                "other",
                &others,
                &format!("{what}: other {step}"),
            );
        };
        check(&e, "changed");
        fs.fail.store(false, Ordering::SeqCst);
        both(&e, &r, NOW, &events("clicks", &keys, NOW, 1));
        e.flush().unwrap();
        check(&e, "flushed");
        drop(e);
        let e = open(dir.path(), &clock, Arc::new(OsFs));
        check(&e, "reopened");
    }
}

/// Keys forgotten after a flush free their ids; new keys (in another namespace, and some
/// of the old names again) take them, and with them the same total series ids. Nothing of
/// the old keys may show under the new ones, in memory or through the archive.
#[test]
fn reused_key_ids_see_nothing_of_the_keys_that_had_them() {
    let Pair { dir, clock, r, e } = pair(Arc::new(OsFs));
    let day = NOW / DAY * DAY;
    // Day -2 only: a flush a day and more later archives every counter of these keys.
    let old = names("old", 300);
    let ev: Vec<RawEvent> = old
        .iter()
        .enumerate()
        .flat_map(|(i, k)| {
            let ts = day - 2 * DAY + (i as i64 % 23) * 3600 + 60;
            [
                raw("a", k, ts, 1 + i as i64 % 7, &[("country", "US")]),
                raw("a", k, ts + 3600, 2, &[("country", "DE")]),
            ]
        })
        .collect();
    both(&e, &r, NOW, &ev);
    let a_keys: Vec<String> = old.clone();
    same(&e, &r, NOW, "a", &a_keys, "written");
    let report = e.flush().unwrap();
    assert_eq!(report.forgotten_keys, 300, "{report:?}");
    assert_eq!(e.stats().keys, 0);
    same(&e, &r, NOW, "a", &a_keys, "forgotten");
    // New keys take the freed ids: in namespace b, and in a again (some old names, some
    // new), in the open hour and the day before.
    let b_keys = names("b", 200);
    let mut a_again: Vec<String> = old.iter().step_by(3).cloned().collect();
    a_again.extend(names("new", 50));
    both(&e, &r, NOW, &events("b", &b_keys, NOW, 0));
    both(&e, &r, NOW, &events("a", &a_again, NOW, 1));
    assert_eq!(e.stats().keys, 350);
    let mut a_all = a_keys.clone();
    a_all.extend(names("new", 50));
    same(&e, &r, NOW, "a", &a_all, "ids reused");
    same(&e, &r, NOW, "b", &b_keys, "ids reused");
    // Flush again (forgets what is now archived), write once more, reopen.
    clock.advance(DAY);
    let now = NOW + DAY;
    e.flush().unwrap();
    both(&e, &r, now, &events("b", &names("c", 100), now, 2));
    let mut b_all = b_keys.clone();
    b_all.extend(names("c", 100));
    same(&e, &r, now, "a", &a_all, "second flush");
    same(&e, &r, now, "b", &b_all, "second flush");
    drop(e);
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    same(&e, &r, now, "a", &a_all, "reopened");
    same(&e, &r, now, "b", &b_all, "reopened");
}

/// The retention sweep keeps totals and subtotals within retention and drops the rest, for
/// keys whose ids were reused.
#[test]
fn the_sweep_drops_and_keeps_totals_as_before() {
    let Pair {
        dir: _dir,
        clock,
        r,
        e,
    } = pair(Arc::new(OsFs));
    let ns = Namespace::new("rl").unwrap();
    let schema = Schema::from_doc(&SchemaDoc {
        tiers: vec!["1m:30m".into(), "1h:1d".into()],
        breakdown_tiers: Some(vec!["1m".into(), "1h".into()]),
        dimensions: None,
    })
    .unwrap();
    e.put_schema(&ns, &schema).unwrap();
    r.put_schema(&ns, &schema).unwrap();
    let keys = names("u", 50);
    let ev = |now: i64| -> Vec<RawEvent> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| raw("rl", k, now - 60 * (i as i64 % 40), 1, &[("country", "US")]))
            .collect()
    };
    both(&e, &r, NOW, &ev(NOW));
    e.sweep();
    same(&e, &r, NOW, "rl", &keys, "swept at once");
    clock.advance(20 * 60);
    e.sweep();
    same(&e, &r, NOW + 20 * 60, "rl", &keys, "swept 20 min later");
    clock.advance(2 * DAY);
    let now = NOW + 20 * 60 + 2 * DAY;
    e.sweep();
    e.flush().unwrap();
    both(&e, &r, now, &ev(now));
    same(&e, &r, now, "rl", &keys, "written again");
}

/// The last second the API takes, in a `1s` tier kept forever (with `1m` and `1h`): read
/// back at every resolution, flushed, and read again after a restart. With the limit at
/// 2^32 the last second's hour ended past the last u32 bucket index, so every flush failed
/// (the log grew for good) and a `1s` read left the second out.
#[test]
fn the_last_second_of_time_is_kept_flushed_and_read() {
    use tally_core::model::{MAX_TS, Namespace, Schema, SchemaDoc};
    let dir = tempfile::tempdir().unwrap();
    let last = MAX_TS - 1;
    let clock = crate::clock(last);
    let e = crate::open(dir.path(), &clock, tally_engine::FsyncPolicy::Never);
    let ns = Namespace::new("t").unwrap();
    let schema = Schema::from_doc(&SchemaDoc {
        tiers: vec![
            "1s:forever".into(),
            "1m:forever".into(),
            "1h:forever".into(),
        ],
        breakdown_tiers: None,
        dimensions: None,
    })
    .unwrap();
    e.put_schema(&ns, &schema).unwrap();
    let events = [
        crate::raw("t", "k", last, 5, &[("d", "v")]),
        crate::raw("t", "k", last - 100_000, 2, &[]),
    ];
    crate::write(&e, last, &events).unwrap();
    let totals = |e: &tally_engine::Engine| [1, 60, 3600].map(|res| crate::total(e, "t", "k", res));
    assert_eq!(totals(&e), [7, 7, 7]);
    let report = e.flush_closed(MAX_TS + 86_400).unwrap();
    assert!(report.segments >= 3, "{report:?}");
    assert_eq!(totals(&e), [7, 7, 7]);
    drop(e);
    let e = crate::open(dir.path(), &clock, tally_engine::FsyncPolicy::Never);
    assert_eq!(totals(&e), [7, 7, 7]);
    // One second later is refused, by the API's checks.
    let late = [crate::raw("t", "k", MAX_TS, 1, &[])];
    let refused =
        tally_core::ingest::prepare(&e, &late, MAX_TS, &Default::default(), &Default::default());
    assert!(refused.is_err());
}

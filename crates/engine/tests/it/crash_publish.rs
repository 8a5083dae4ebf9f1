//! Crash consistency of archive publication: the engine's `Fs` is made to fail at its n-th
//! operation (a file write + fsync, a rename, a directory sync, a removal), for every n a
//! flush — a second flush of late events, and a compaction — or a bulk install (segments
//! written by several threads) performs; then the machine "loses power":
//! every name created, renamed or removed since its directory was last synced is undone.
//! Reopened, the engine must find a consistent archive and exactly the acknowledged counts.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tally_core::reference::MemStore;
use tally_engine::compaction::DELTAS_MERGED_AT;
use tally_engine::io::{Fs, OsFs};
use tally_engine::{Config, Engine, FlushPolicy, FsyncPolicy};

use crate::archive::same;
use crate::{NOW, raw, write};

/// What a power loss would undo.
#[derive(Debug)]
enum Undo {
    Created(PathBuf),
    Renamed {
        from: PathBuf,
        to: PathBuf,
        old_to: Option<Vec<u8>>,
    },
    Removed {
        path: PathBuf,
        bytes: Vec<u8>,
    },
}

impl Undo {
    fn dir(&self) -> Option<&Path> {
        match self {
            Undo::Created(p) | Undo::Renamed { to: p, .. } | Undo::Removed { path: p, .. } => {
                p.parent()
            }
        }
    }
}

#[derive(Debug)]
struct CrashFs {
    ops: AtomicUsize,
    crash_at: AtomicUsize,
    crashed: AtomicBool,
    /// An operation that fails alone (a transient error: the ones after it succeed).
    fail_once: AtomicUsize,
    unsynced: Mutex<Vec<Undo>>,
}

impl CrashFs {
    fn new(crash_at: usize) -> Self {
        CrashFs {
            ops: AtomicUsize::new(0),
            crash_at: AtomicUsize::new(crash_at),
            crashed: AtomicBool::new(false),
            fail_once: AtomicUsize::new(usize::MAX),
            unsynced: Mutex::new(Vec::new()),
        }
    }

    /// Crashes at the `n`-th operation from now (the ones before only count).
    fn arm(&self, n: usize) {
        self.crash_at
            .store(self.ops.load(Ordering::SeqCst) + n, Ordering::SeqCst);
    }

    /// Counts an operation; fails it (and every later one) once the crash point is reached.
    fn step(&self) -> io::Result<usize> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst);
        if n == self.crash_at.load(Ordering::SeqCst) {
            self.crashed.store(true, Ordering::SeqCst);
        }
        if self.crashed.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!(
                "simulated crash at operation {n}"
            )));
        }
        Ok(n)
    }

    /// Whether operation `n` (as `step` numbered it) is the one to report a failure after
    /// it happened: as a failed fsync whose effect reached the disk all the same.
    fn fails_after(&self, n: usize) -> io::Result<()> {
        if n == self.fail_once.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!(
                "simulated failure reported by operation {n}, which took effect"
            )));
        }
        Ok(())
    }

    /// The power loss: directory entries not yet synced are undone, newest first.
    fn lose_unsynced(&self) {
        let mut undo = self.unsynced.lock().unwrap();
        while let Some(u) = undo.pop() {
            match u {
                Undo::Created(p) => {
                    let _ = std::fs::remove_file(p);
                }
                Undo::Renamed { from, to, old_to } => {
                    std::fs::rename(&to, &from).unwrap();
                    if let Some(bytes) = old_to {
                        std::fs::write(&to, bytes).unwrap();
                    }
                }
                Undo::Removed { path, bytes } => std::fs::write(path, bytes).unwrap(),
            }
        }
    }
}

impl Fs for CrashFs {
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let n = self.step()?;
        OsFs.write_new(path, bytes)?;
        self.unsynced
            .lock()
            .unwrap()
            .push(Undo::Created(path.to_owned()));
        self.fails_after(n)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let n = self.step()?;
        let old_to = std::fs::read(to).ok();
        OsFs.rename(from, to)?;
        self.unsynced.lock().unwrap().push(Undo::Renamed {
            from: from.to_owned(),
            to: to.to_owned(),
            old_to,
        });
        self.fails_after(n)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let n = self.step()?;
        OsFs.sync_dir(dir)?;
        self.unsynced
            .lock()
            .unwrap()
            .retain(|u| u.dir() != Some(dir));
        self.fails_after(n)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let n = self.step()?;
        let Ok(bytes) = std::fs::read(path) else {
            return self.fails_after(n);
        };
        OsFs.remove(path)?;
        self.unsynced.lock().unwrap().push(Undo::Removed {
            path: path.to_owned(),
            bytes,
        });
        self.fails_after(n)
    }
}

fn open(dir: &Path, clock: &Arc<tally_core::store::ManualClock>, fs: Arc<dyn Fs>) -> Engine {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.fsync = FsyncPolicy::Always;
    c.shards = 4;
    c.flush = FlushPolicy::default();
    c.fs = fs;
    Engine::open(c).unwrap()
}

/// Three days of hourly events over three keys, each with a country and a referrer.
fn three_days() -> Vec<tally_core::model::RawEvent> {
    let mut events = Vec::new();
    for h in 0..72 {
        for (i, k) in ["lnk_1", "lnk_2", "é/x"].iter().enumerate() {
            let country = ["US", "DE", "JP"][(h as usize + i) % 3];
            events.push(raw(
                "clicks",
                k,
                NOW - 3 * 86_400 + h * 3600 + i as i64,
                1 + h % 4,
                &[("country", country), ("referrer", "news")],
            ));
        }
    }
    events
}

/// Runs the scenario with a crash at operation `crash_at`; returns whether it crashed.
fn run(crash_at: usize) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let reference = MemStore::new(clock.clone());
    let fs = Arc::new(CrashFs::new(crash_at));
    let e = open(dir.path(), &clock, fs.clone());
    let events = three_days();
    write(&e, NOW, &events).unwrap();
    write(&reference, NOW, &events).unwrap();
    // Remembered answers: one kept for days, one that expires before the last flush (its
    // answers file is then dropped), one given between the flushes.
    let keyed = |key: &str, expires: i64, at: i64| {
        let event = [raw("clicks", "keyed", at, 1, &[])];
        let mut batch = crate::prepared(&e, NOW, &event);
        batch.idempotency = Some(answer(key, expires));
        tally_core::store::Store::apply(&e, &batch).unwrap();
        write(&reference, NOW, &event).unwrap();
    };
    keyed("keep", NOW + 30 * 86_400, NOW - 2 * 86_400);
    keyed("short", NOW + 3600, NOW - 3600);
    let mut crashed = e.flush().is_err();
    let mut late_given = false;
    if !crashed {
        let late = [
            raw(
                "clicks",
                "lnk_2",
                NOW - 2 * 86_400 + 5,
                7,
                &[("country", "FR")],
            ),
            raw("clicks", "new", NOW - 3600, 2, &[]),
        ];
        write(&e, NOW, &late).unwrap();
        write(&reference, NOW, &late).unwrap();
        keyed("late", NOW + 30 * 86_400, NOW - 2 * 86_400 + 9);
        late_given = true;
        clock.advance(86_400);
        crashed = e.flush().is_err();
    }
    if !crashed {
        // An event of the open day holds the log; then late events a flush at a time, whose
        // deltas of one period merge while the log still holds their records.
        let now = tally_core::store::Clock::now(&*clock);
        let mut events = vec![raw("clicks", "open", now, 1, &[])];
        for i in 0..DELTAS_MERGED_AT as i64 {
            events.push(raw(
                "clicks",
                "lnk_3",
                NOW - 2 * 86_400 + 60 * i,
                1 + i,
                &[],
            ));
        }
        for (i, event) in events.chunks(1).enumerate() {
            write(&e, now, event).unwrap();
            write(&reference, now, event).unwrap();
            crashed = i > 0 && e.flush().is_err();
            if crashed {
                break;
            }
        }
        if !crashed {
            match e.compact() {
                Ok(r) => assert!(r.merged >= DELTAS_MERGED_AT, "{r:?}"),
                Err(_) => crashed = true,
            }
        }
    }
    if !crashed {
        // A day on, the deltas merge and expired minute segments go.
        clock.advance(86_400);
        let now = tally_core::store::Clock::now(&*clock);
        let tick = [raw("clicks", "lnk_1", now, 1, &[])];
        write(&e, now, &tick).unwrap();
        write(&reference, now, &tick).unwrap();
        crashed = e.flush().is_err() || e.compact().is_err();
    }
    let now = tally_core::store::Clock::now(&*clock);
    if !crashed {
        same(&e, &reference, now);
    }
    drop(e);
    fs.lose_unsynced();
    let answers = |e: &Engine| {
        let known = |k: &str| {
            tally_core::store::Store::idempotency(e, k)
                .unwrap()
                .is_some()
        };
        assert!(known("keep"), "crash at {crash_at}");
        assert_eq!(known("short"), now < NOW + 3600, "crash at {crash_at}");
        assert_eq!(known("late"), late_given, "crash at {crash_at}");
    };
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    same(&e, &reference, now);
    answers(&e);
    // The recovered engine flushes and compacts on: its archive is whole.
    e.flush().unwrap();
    e.compact().unwrap();
    same(&e, &reference, now);
    drop(e);
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    same(&e, &reference, now);
    answers(&e);
    assert!(tally_engine::check::check(dir.path()).unwrap().is_whole());
    crashed
}

fn answer(key: &str, expires: i64) -> tally_core::store::IdemRecord {
    tally_core::store::IdemRecord {
        key: key.into(),
        fingerprint: format!("fp-{key}"),
        expires,
        status: 200,
        body: "{\"accepted\":1}".into(),
    }
}

#[test]
fn a_crash_at_any_step_of_a_flush_or_compaction_loses_nothing_and_doubles_nothing() {
    let mut crash_at = 0;
    while run(crash_at) {
        crash_at += 1;
        assert!(
            crash_at < 500,
            "the scenario never finished without a crash"
        );
    }
    // Two flushes take several steps each: segments, their directory, the manifest,
    // CURRENT, old manifest and log removals.
    assert!(crash_at >= 10, "only {crash_at} steps were tried");
    eprintln!("crash points tried: {crash_at}");
}

/// `events` (of the namespace `clicks`, which `e` has) checked as the API does and held in
/// a `Bulk`, ready to install.
fn bulk_of(e: &Engine, events: &[tally_core::model::RawEvent]) -> tally_engine::Bulk {
    let batch = crate::prepared(e, NOW, events);
    let schema =
        tally_core::store::Store::schema(e, &tally_core::model::Namespace::new("clicks").unwrap())
            .unwrap()
            .unwrap();
    let mut bulk = tally_engine::Bulk::default();
    for inc in &batch.increments {
        bulk.add(&schema, inc, NOW);
    }
    bulk
}

/// A bulk install (several segments, written by several threads, bases and deltas) with a
/// crash at operation `crash_at` of it; returns whether it crashed. After the power loss the
/// directory holds all of the install — its counts and its idempotency answer — or none.
fn run_install(crash_at: usize) -> bool {
    use tally_core::store::IdemRecord;

    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let before = MemStore::new(clock.clone());
    let after = MemStore::new(clock.clone());
    let fs = Arc::new(CrashFs::new(usize::MAX));
    let e = open(dir.path(), &clock, fs.clone());
    // Archived already: the first day (so the install writes deltas there, bases elsewhere).
    let early: Vec<_> = (0..24)
        .map(|h| {
            raw(
                "clicks",
                "lnk_1",
                NOW - 3 * 86_400 + h * 3600,
                2,
                &[("country", "US")],
            )
        })
        .collect();
    for s in [&e as &dyn tally_core::store::Store, &before, &after] {
        write(s, NOW, &early).unwrap();
    }
    e.flush().unwrap();
    let history = three_days();
    write(&after, NOW, &history).unwrap();
    let bulk = bulk_of(&e, &history);
    let answer = IdemRecord {
        key: "load-1".into(),
        fingerprint: "load-1".into(),
        expires: NOW + 86_400,
        status: 200,
        body: "{}".into(),
    };
    fs.arm(crash_at);
    let crashed = e.install(bulk, vec![answer]).is_err();
    drop(e);
    fs.lose_unsynced();
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    let installed = tally_core::store::Store::idempotency(&e, "load-1")
        .unwrap()
        .is_some();
    assert!(crashed || installed, "a finished install kept its answer");
    same(&e, if installed { &after } else { &before }, NOW);
    // The recovered engine flushes and compacts on.
    e.flush().unwrap();
    e.compact().unwrap();
    same(&e, if installed { &after } else { &before }, NOW);
    crashed
}

#[test]
fn a_crash_at_any_step_of_an_install_leaves_all_of_it_or_none() {
    let mut crash_at = 0;
    while run_install(crash_at) {
        crash_at += 1;
        assert!(crash_at < 400, "the install never finished without a crash");
    }
    // Segments (written in parallel), their directory, the manifest, CURRENT.
    assert!(crash_at >= 10, "only {crash_at} steps were tried");
    eprintln!("crash points tried: {crash_at}");
}

/// A flush whose operation `fail` (counted from the flush's start) fails alone — the last
/// steps of a publish among them, after `CURRENT` may already name the new manifest — then
/// late events to an archived day, and a second flush that crashes at its operation
/// `crash_at`. Returns whether the second flush crashed. Whatever failed, the reopened
/// directory counts exactly what was acknowledged: a failed publish must not let a later
/// one reuse the segment ids or the manifest number the failed one may have published.
fn run_after_a_failed_publish(fail: usize, crash_at: usize) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let reference = MemStore::new(clock.clone());
    let fs = Arc::new(CrashFs::new(usize::MAX));
    let e = open(dir.path(), &clock, fs.clone());
    let events = a_few_hours();
    write(&e, NOW, &events).unwrap();
    write(&reference, NOW, &events).unwrap();
    let keyed = [raw("clicks", "keyed", NOW - 2 * 86_400, 1, &[])];
    let mut batch = crate::prepared(&e, NOW, &keyed);
    batch.idempotency = Some(answer("k1", NOW + 86_400));
    tally_core::store::Store::apply(&e, &batch).unwrap();
    write(&reference, NOW, &keyed).unwrap();
    fs.fail_once
        .store(fs.ops.load(Ordering::SeqCst) + fail, Ordering::SeqCst);
    let _ = e.flush();
    let late = [raw(
        "clicks",
        "lnk_2",
        NOW - 3 * 86_400 + 5,
        7,
        &[("country", "FR")],
    )];
    write(&e, NOW, &late).unwrap();
    write(&reference, NOW, &late).unwrap();
    fs.arm(crash_at);
    let crashed = e.flush().is_err();
    if !crashed {
        // What the failed publish wrote and no manifest lists is gone.
        let m = tally_engine::manifest::load(dir.path()).unwrap().unwrap();
        let listed: Vec<u64> = m
            .segments
            .iter()
            .map(|s| s.id)
            .chain(m.answers.iter().map(|a| a.id))
            .collect();
        for f in std::fs::read_dir(dir.path().join("segments")).unwrap() {
            let p = f.unwrap().path();
            let id: u64 = p.file_stem().unwrap().to_str().unwrap().parse().unwrap();
            assert!(
                listed.contains(&id),
                "failing at {fail}: {p:?} is left over"
            );
        }
    }
    drop(e);
    fs.lose_unsynced();
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    same(&e, &reference, NOW);
    assert!(
        tally_core::store::Store::idempotency(&e, "k1")
            .unwrap()
            .is_some()
    );
    e.flush().unwrap();
    e.compact().unwrap();
    same(&e, &reference, NOW);
    crashed
}

/// Events in two hours of two archived days, and one in the open hour (which keeps the
/// log from being truncated past them).
fn a_few_hours() -> Vec<tally_core::model::RawEvent> {
    let mut events: Vec<_> = [NOW - 2 * 86_400 + 60, NOW - 86_400 + 3600]
        .into_iter()
        .map(|t| raw("clicks", "lnk_1", t, 3, &[("country", "US")]))
        .collect();
    events.push(raw("clicks", "lnk_3", NOW - 60, 1, &[]));
    events
}

#[test]
fn a_publish_that_failed_part_way_is_never_overwritten_by_the_next() {
    // How many operations the first flush takes, from a run where nothing fails.
    let ops = {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::clock(NOW);
        let fs = Arc::new(CrashFs::new(usize::MAX));
        let e = open(dir.path(), &clock, fs.clone());
        write(&e, NOW, &a_few_hours()).unwrap();
        let before = fs.ops.load(Ordering::SeqCst);
        e.flush().unwrap();
        fs.ops.load(Ordering::SeqCst) - before
    };
    for fail in 0..ops {
        let mut crash_at = 0;
        while run_after_a_failed_publish(fail, crash_at) {
            crash_at += 1;
            assert!(crash_at < 200, "the second flush never finished");
        }
    }
}

/// An install carrying an answer under a key memory already holds, failing at its
/// operation `fail_at`: whether it failed. A failed install must give back the answer it
/// replaced, not leave the key without one.
fn install_over_an_answer(fail_at: usize) -> bool {
    use tally_core::store::{IdemRecord, Store};

    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let fs = Arc::new(CrashFs::new(usize::MAX));
    let e = open(dir.path(), &clock, fs.clone());
    let answer = |body: &str| IdemRecord {
        key: "k".into(),
        fingerprint: "f".into(),
        expires: NOW + 86_400,
        status: 200,
        body: body.into(),
    };
    let events = three_days();
    let mut batch = crate::prepared(&e, NOW, &events[..1]);
    batch.idempotency = Some(answer("first"));
    e.apply(&batch).unwrap();
    let bulk = bulk_of(&e, &events);
    fs.arm(fail_at);
    let failed = e.install(bulk, vec![answer("second")]).is_err();
    let want = if failed { "first" } else { "second" };
    assert_eq!(
        e.idempotency("k").unwrap(),
        Some(answer(want)),
        "failing at {fail_at}"
    );
    failed
}

#[test]
fn a_failed_install_gives_back_the_answer_it_replaced() {
    let mut fail_at = 0;
    while install_over_an_answer(fail_at) {
        fail_at += 1;
        assert!(fail_at < 400, "the install never finished");
    }
}

/// Found by a review: replay judged whether a tier kept an expired bucket of an archived
/// period when the record came by the retention at the log's end, not the one of that time.
/// A late count, kept under a retention that a later change shrank, was then lost if that
/// change's flush did not publish (a crash): the running engine held it (the sweep keeps an
/// expired counter of an archived period), so a retention grown afterwards showed the
/// bucket's archived part alone.
#[test]
fn a_late_count_survives_a_shrink_whose_flush_crashed() {
    use tally_core::model::Namespace;
    use tally_core::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let ns = Namespace::new("clicks").unwrap();
    let tier = crate::archive::one_tier;
    let fs = Arc::new(CrashFs::new(usize::MAX));
    let e = open(dir.path(), &clock, fs.clone());
    e.put_schema(&ns, &tier("1s:15m")).unwrap();
    let ts = NOW - 580;
    write(&e, NOW, &[raw("clicks", "k", ts, 2, &[])]).unwrap();
    // A change of retention archives memory (the 2) and truncates the log.
    e.put_schema(&ns, &tier("1s:14m")).unwrap();
    // A late delta to that archived second, kept under 14m.
    write(&e, NOW, &[raw("clicks", "k", ts, 4, &[])]).unwrap();
    // Shrunk to 5m: the sweep keeps the 4 (its period is archived); its flush crashes.
    fs.arm(0);
    e.put_schema(&ns, &tier("1s:5m")).unwrap();
    drop(e);
    fs.lose_unsynced();
    let e = open(dir.path(), &clock, Arc::new(OsFs));
    e.put_schema(&ns, &tier("1s:20m")).unwrap();
    assert_eq!(
        crate::read_all(&e, "clicks", "k", 1).totals,
        vec![(ts, 6)],
        "the second whole"
    );
}

//! The bound on open segment files (`segment::files`). A test binary of its own: the bound
//! is process-wide, and these tests set it small.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Key, Namespace, RawEvent, Schema, SchemaDoc};
use tally_core::store::{KeyRead, ManualClock, Store, Want};
use tally_engine::segment::files;
use tally_engine::{Config, Engine, FsyncPolicy};

/// 2026-11-20T00:00:00Z.
const NOW: i64 = 1_795_132_800;
const DAY: i64 = 86_400;
const DAYS: i64 = 40;

/// One test at a time: each sets the process-wide bound.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn bound(n: usize) -> std::sync::MutexGuard<'static, ()> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    files::set_max_open(n);
    one
}

fn engine(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.fsync = FsyncPolicy::Never;
    Engine::open(c).unwrap()
}

/// Hourly counts forever: each UTC day a segment of its own once flushed.
fn setup(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    let e = engine(dir, clock);
    fill(&e, "1h:forever");
    e
}

/// `DAYS` days of one hourly tier (`tier`) flushed: a segment a day.
fn fill(e: &Engine, tier: &str) {
    let schema = Schema::from_doc(&SchemaDoc {
        tiers: vec![tier.into()],
        breakdown_tiers: None,
        dimensions: None,
    })
    .unwrap();
    e.put_schema(&Namespace::new("clicks").unwrap(), &schema)
        .unwrap();
    let raws: Vec<RawEvent> = (1..=DAYS)
        .map(|d| RawEvent {
            ns: "clicks".into(),
            key: "k".into(),
            ts: Some(NOW - (d + 1) * DAY),
            n: Some(d),
            dims: vec![("country".into(), "NZ".into())],
        })
        .collect();
    let b = ingest::prepare(e, &raws, NOW, &Limits::default(), &Defaults::default()).unwrap();
    e.apply(&b).unwrap();
    let report = e.flush().unwrap();
    assert_eq!(report.segments, DAYS as usize, "{report:?}");
}

/// The segment files of [`setup`]'s archive in `dir`, by name; no engine left open.
fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    drop(setup(dir, &Arc::new(ManualClock::new(NOW))));
    let mut paths: Vec<_> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
}

fn total(e: &Engine) -> i64 {
    let (ns, key) = (Namespace::new("clicks").unwrap(), Key::new("k").unwrap());
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
        from: 0,
        to: NOW,
        want: Want::All,
        sum_subtotals: false,
        keep: None,
    };
    let d = e.read(&[read]).unwrap().pop().unwrap();
    d.totals.iter().map(|(_, n)| n).sum()
}

/// Descriptors of this process open on files under `dir`.
fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|p| p.starts_with(dir))
        .count()
}

/// More segments than the bound: reads of all of them give every count, and no more than
/// the bound of their files are open at once, after a restart too. Then compaction merges
/// the days into months while readers read: the files it removes stay readable for the
/// readers that still hold them (pinned), so no read fails.
#[test]
fn segments_past_the_bound_on_open_files_read_right_and_stay_within_it() {
    let _one = bound(4);
    let want: i64 = (1..=DAYS).sum();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let e = setup(dir.path(), &clock);
    let segments = dir.path().join("segments");
    for _ in 0..3 {
        assert_eq!(total(&e), want);
        assert!(files::open_now() <= 4, "{} open", files::open_now());
        assert!(descriptors_under(&segments) <= 4);
    }
    drop(e);
    let e = Arc::new(engine(dir.path(), &clock));
    assert!(descriptors_under(&segments) <= 4, "opening the archive");
    assert_eq!(total(&e), want);
    assert!(descriptors_under(&segments) <= 4);

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) || reads == 0 {
                    assert_eq!(total(&e), want);
                    reads += 1;
                }
            })
        })
        .collect();
    let report = e.compact().unwrap();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert!(report.merged > 1 && report.written > 0, "{report:?}");
    assert_eq!(total(&e), want);
    assert!(descriptors_under(&segments) <= 4);
}

/// A segment marked by compaction keeps its file while a holder reads it, whatever the
/// bound (its descriptor closed and opened again), and the file goes with its last holder.
#[test]
fn a_segment_marked_for_removal_reads_until_its_last_holder_drops_it() {
    use tally_engine::segment::Segment;
    let _one = bound(4);
    let dir = tempfile::tempdir().unwrap();
    let paths = segment_files(dir.path());
    let segs: Vec<Segment> = paths[..10]
        .iter()
        .map(|p| Segment::open(p).unwrap())
        .collect();
    segs[0].remove_when_dropped();
    for _ in 0..2 {
        for s in &segs {
            s.block_payload(0).unwrap();
        }
    }
    assert!(descriptors_under(&dir.path().join("segments")) <= 4);
    assert!(paths[0].exists(), "held: still there");
    drop(segs);
    assert!(!paths[0].exists(), "removed with its last holder");
    assert!(paths[1].exists(), "only the marked one");
}

/// Closing files to stay within the bound sorts them by when they were read last, while
/// other threads read (found by a review: a sort by keys that change under it panicked,
/// "user-provided comparison function does not correctly implement a total order").
#[test]
fn making_room_while_others_read_does_not_panic() {
    use tally_engine::segment::Segment;
    let _one = bound(64);
    let dir = tempfile::tempdir().unwrap();
    let path = segment_files(dir.path()).swap_remove(0);
    let segs: Arc<Vec<Segment>> =
        Arc::new((0..256).map(|_| Segment::open(&path).unwrap()).collect());
    let started = std::time::Instant::now();
    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let segs = segs.clone();
            std::thread::spawn(move || {
                let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
                while started.elapsed() < std::time::Duration::from_secs(4) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    segs[(x % segs.len() as u64) as usize]
                        .block_payload(0)
                        .unwrap();
                }
            })
        })
        .collect();
    for r in readers {
        r.join().expect("a reader panicked");
    }
}

/// Notes, at each removal of a segment file, how many descriptors are open on segment files.
#[derive(Debug)]
struct Watching {
    segments: std::path::PathBuf,
    most: std::sync::atomic::AtomicUsize,
}

impl tally_engine::io::Fs for Watching {
    fn write_new(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        tally_engine::io::OsFs.write_new(path, bytes)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        tally_engine::io::OsFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        tally_engine::io::OsFs.sync_dir(dir)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        if path.starts_with(&self.segments) {
            self.most
                .fetch_max(descriptors_under(&self.segments), Ordering::SeqCst);
        }
        tally_engine::io::OsFs.remove(path)
    }
}

/// A retention drop of more segments than the bound stays within it (found by a review: the
/// drop opened every segment it removed, all at once, to keep them readable).
#[test]
fn a_retention_drop_stays_within_the_bound() {
    let _one = bound(4);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let fs = Arc::new(Watching {
        segments: dir.path().join("segments"),
        most: Default::default(),
    });
    let mut c = Config::new(dir.path());
    c.clock = clock.clone();
    c.fsync = FsyncPolicy::Never;
    c.fs = fs.clone();
    let e = Engine::open(c).unwrap();
    fill(&e, "1h:60d");
    clock.set(NOW + 365 * DAY);
    let report = e.compact().unwrap();
    assert_eq!(report.dropped, DAYS as usize, "{report:?}");
    let most = fs.most.load(Ordering::SeqCst);
    assert!(most <= 4, "{most} segment files open during the drop");
}

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

fn engine(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.fsync = FsyncPolicy::Never;
    Engine::open(c).unwrap()
}

/// Hourly counts forever: each UTC day a segment of its own once flushed.
fn setup(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    let e = engine(dir, clock);
    let schema = Schema::from_doc(&SchemaDoc {
        tiers: vec!["1h:forever".into()],
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
    let b = ingest::prepare(&e, &raws, NOW, &Limits::default(), &Defaults::default()).unwrap();
    e.apply(&b).unwrap();
    let report = e.flush().unwrap();
    assert_eq!(report.segments, DAYS as usize, "{report:?}");
    e
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
    files::set_max_open(4);
    let want: i64 = (1..=DAYS).sum();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let e = setup(dir.path(), &clock);
    let segments = dir.path().join("segments");
    for _ in 0..3 {
        assert_eq!(total(&e), want);
        // (The other test of this binary may hold one pinned.)
        assert!(files::open_now() <= 5, "{} open", files::open_now());
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

/// A pinned segment stays open past the bound, so it reads after its file is removed (what
/// compaction does to the segments it merged, while readers may hold them); one that was
/// closed to stay within the bound cannot open its removed file again.
#[test]
fn a_pinned_segment_reads_after_its_file_is_removed() {
    use tally_engine::segment::Segment;
    files::set_max_open(4);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    drop(setup(dir.path(), &clock));
    let mut paths: Vec<_> = std::fs::read_dir(dir.path().join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let segs: Vec<Segment> = paths[..10]
        .iter()
        .map(|p| Segment::open(p).unwrap())
        .collect();
    segs[0].pin().unwrap();
    std::fs::remove_file(&paths[0]).unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    for s in &segs[2..] {
        s.block_payload(0).unwrap();
    }
    assert!(files::open_now() <= 5, "{} open", files::open_now());
    segs[0].block_payload(0).expect("pinned: still open");
    assert!(
        segs[1].block_payload(0).is_err(),
        "closed, and its file is gone"
    );
}

//! Frozen fixtures: log files written by format version 1, committed as they are, must keep
//! opening with the same contents in every later build. (`TALLY_WRITE_FIXTURES=1` rewrites
//! them — only ever for a new format version, in a new directory.)

use std::path::{Path, PathBuf};

use tally_core::model::{Namespace, Schema, SchemaDoc};
use tally_core::store::{IdemRecord, Store};
use tally_engine::{Config, Engine, FsyncPolicy};

use crate::{NOW, clock, raw, read_all, total, write};

fn fixture_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/wal-v1"
    ))
}

/// What the v1 fixture holds: a batch with subtotals and an idempotency record, a schema
/// change, and enough records to rotate into a second file.
fn write_fixture(dir: &Path) {
    let mut cfg = Config::new(dir);
    cfg.clock = clock(NOW);
    cfg.fsync = FsyncPolicy::Always;
    cfg.max_wal_file_bytes = 400;
    let e = Engine::open(cfg).unwrap();
    let mut b = tally_core::ingest::prepare(
        &e,
        &[
            raw(
                "clicks",
                "lnk_1",
                NOW - 3600,
                3,
                &[("country", "US"), ("referrer", "hn")],
            ),
            raw("clicks", "lnk_1", NOW - 60, -1, &[("country", "DE")]),
            raw("clicks", "a/b é", NOW - 60, 5, &[]),
        ],
        NOW,
        &Default::default(),
        &Default::default(),
    )
    .unwrap();
    b.idempotency = Some(IdemRecord {
        key: "fixture-1".into(),
        fingerprint: "f".into(),
        expires: i64::MAX / 2,
        status: 200,
        body: "{\"accepted\":3}".into(),
    });
    e.apply(&b).unwrap();
    let doc = SchemaDoc {
        tiers: vec!["1h:forever".into()],
        breakdown_tiers: None,
        dimensions: Some(vec!["status".into()]),
    };
    e.put_schema(
        &Namespace::new("api").unwrap(),
        &Schema::from_doc(&doc).unwrap(),
    )
    .unwrap();
    for i in 0..6 {
        write(
            &e,
            NOW,
            &[raw("api", "k", NOW - 7200, i + 1, &[("status", "200")])],
        )
        .unwrap();
    }
}

#[test]
fn format_v1_fixture_still_opens() {
    let dir = fixture_dir();
    if std::env::var("TALLY_WRITE_FIXTURES").is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
        write_fixture(&dir);
        let _ = std::fs::remove_file(dir.join("LOCK"));
    }
    // Open a copy: the committed files stay untouched.
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("wal")).unwrap();
    let mut files = 0;
    for f in std::fs::read_dir(dir.join("wal")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join("wal").join(f.file_name().unwrap())).unwrap();
        files += 1;
    }
    assert!(files >= 2, "the fixture should span a rotation");
    let mut cfg = Config::new(copy.path());
    cfg.clock = clock(NOW);
    let e = Engine::open(cfg).unwrap();
    assert_eq!(e.recovery().records, 8);
    assert_eq!(e.recovery().torn, None);
    assert_eq!(total(&e, "clicks", "lnk_1", 3600), 2);
    assert_eq!(total(&e, "clicks", "lnk_1", 60), 2);
    assert_eq!(total(&e, "clicks", "a/b é", 3600), 5);
    let subs: Vec<(String, String, i64)> = read_all(&e, "clicks", "lnk_1", 3600)
        .subtotals
        .into_iter()
        .map(|s| (s.dim, s.value, s.buckets.iter().map(|(_, n)| n).sum()))
        .collect();
    assert_eq!(
        subs,
        vec![
            ("country".into(), "DE".into(), -1),
            ("country".into(), "US".into(), 3),
            ("referrer".into(), "hn".into(), 3)
        ]
    );
    assert_eq!(total(&e, "api", "k", 3600), 21);
    assert_eq!(
        e.schema(&Namespace::new("api").unwrap())
            .unwrap()
            .unwrap()
            .to_doc()
            .dimensions,
        Some(vec!["status".to_owned()])
    );
    assert_eq!(
        e.idempotency("fixture-1").unwrap().map(|r| r.body),
        Some("{\"accepted\":3}".to_owned())
    );
}

fn archive_fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name)
}

/// A whole data directory as this build writes it (`archive-v1`, frozen, was written by
/// manifest format 1 and segment format 1; `archive-v2` by manifest format 2, which keeps the
/// answer in an answers file, and segment format 2): three days of events
/// flushed into base segments, a late event flushed into a delta, a schema and a remembered
/// answer known only from the manifest's checkpoint (their log records are truncated), and
/// a log tail not yet flushed.
fn write_archive_fixture(dir: &Path) {
    let c = clock(NOW);
    let mut cfg = Config::new(dir);
    cfg.clock = c.clone();
    cfg.fsync = FsyncPolicy::Always;
    let e = Engine::open(cfg).unwrap();
    let doc = SchemaDoc {
        tiers: vec!["1h:forever".into()],
        breakdown_tiers: None,
        dimensions: Some(vec!["status".into()]),
    };
    e.put_schema(
        &Namespace::new("api").unwrap(),
        &Schema::from_doc(&doc).unwrap(),
    )
    .unwrap();
    let mut b = tally_core::ingest::prepare(
        &e,
        &[raw("api", "k", NOW - 2 * 86_400, 4, &[("status", "200")])],
        NOW,
        &Default::default(),
        &Default::default(),
    )
    .unwrap();
    b.idempotency = Some(IdemRecord {
        key: "archive-1".into(),
        fingerprint: "f".into(),
        expires: i64::MAX / 2,
        status: 200,
        body: "{\"accepted\":1}".into(),
    });
    e.apply(&b).unwrap();
    for h in 0..72 {
        let country = ["US", "DE", "JP"][h as usize % 3];
        write(
            &e,
            NOW,
            &[raw(
                "clicks",
                "lnk_1",
                NOW - 3 * 86_400 + h * 3600,
                1 + h % 4,
                &[("country", country)],
            )],
        )
        .unwrap();
    }
    c.advance(3600);
    e.flush().unwrap();
    write(
        &e,
        NOW,
        &[raw(
            "clicks",
            "lnk_1",
            NOW - 2 * 86_400 + 7,
            10,
            &[("country", "FR")],
        )],
    )
    .unwrap();
    c.advance(3600);
    e.flush().unwrap();
    write(&e, NOW, &[raw("clicks", "lnk_1", NOW + 60, 2, &[])]).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

#[test]
fn archive_v1_fixture_still_opens() {
    // Frozen: no build writes format 1 any more.
    let dir = archive_fixture_dir("archive-v1");
    let bytes = std::fs::read(dir.join("MANIFEST-00000000000000000002")).unwrap();
    assert_eq!(&bytes[..4], b"TLM\x01");
    opens_archive_fixture(&dir);
    // Its answer, held in the manifest, moves to an answers file at the next publish, and
    // stays remembered.
    let copy = tempfile::tempdir().unwrap();
    copy_tree(&dir, copy.path());
    let c = clock(NOW + 3 * 86_400);
    let mut cfg = Config::new(copy.path());
    cfg.clock = c.clone();
    let e = Engine::open(cfg).unwrap();
    e.flush().unwrap();
    drop(e);
    let m = tally_engine::manifest::load(copy.path()).unwrap().unwrap();
    assert!(m.idempotency.is_empty(), "{m:?}");
    assert_eq!(m.answers.len(), 1, "{m:?}");
    assert!(tally_engine::check::check(copy.path()).unwrap().is_whole());
    let mut cfg = Config::new(copy.path());
    cfg.clock = c;
    let e = Engine::open(cfg).unwrap();
    assert_eq!(
        e.idempotency("archive-1").unwrap().map(|r| r.body),
        Some("{\"accepted\":1}".to_owned())
    );
}

#[test]
fn archive_v2_fixture_still_opens() {
    let dir = archive_fixture_dir("archive-v2");
    if std::env::var("TALLY_WRITE_FIXTURES").is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
        write_archive_fixture(&dir);
        let _ = std::fs::remove_file(dir.join("LOCK"));
    }
    let m = tally_engine::manifest::load(&dir).unwrap().unwrap();
    assert!(m.idempotency.is_empty() && m.answers.len() == 1, "{m:?}");
    opens_archive_fixture(&dir);
}

fn opens_archive_fixture(dir: &Path) {
    assert!(tally_engine::check::check(dir).unwrap().is_whole());
    let copy = tempfile::tempdir().unwrap();
    copy_tree(dir, copy.path());
    let mut cfg = Config::new(copy.path());
    cfg.clock = clock(NOW + 7200);
    let e = Engine::open(cfg).unwrap();
    assert!(e.recovery().segments >= 4, "{:?}", e.recovery());
    let expected: i64 = (0..72).map(|h| 1 + h % 4).sum::<i64>() + 10 + 2;
    assert_eq!(total(&e, "clicks", "lnk_1", 3600), expected);
    let fr: i64 = read_all(&e, "clicks", "lnk_1", 3600)
        .subtotals
        .iter()
        .filter(|s| s.value == "FR")
        .flat_map(|s| s.buckets.iter().map(|(_, n)| n))
        .sum();
    assert_eq!(fr, 10);
    assert_eq!(total(&e, "api", "k", 3600), 4);
    assert_eq!(
        e.schema(&Namespace::new("api").unwrap())
            .unwrap()
            .unwrap()
            .to_doc()
            .dimensions,
        Some(vec!["status".to_owned()])
    );
    assert_eq!(
        e.idempotency("archive-1").unwrap().map(|r| r.body),
        Some("{\"accepted\":1}".to_owned())
    );
}

//! The bound on decoded segment dictionaries (`segment::dicts`). A test binary of its own:
//! the bound is process-wide, and these tests set it small.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use tally_engine::segment::{
    Buckets, DimRecord, KeyRecord, Segment, SegmentError, SegmentKind, SegmentMeta, SegmentWriter,
    WriteOptions, dicts, layout,
};

/// One test at a time: each sets the process-wide bound.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn bound(bytes: usize) -> std::sync::MutexGuard<'static, ()> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    dicts::set_budget(bytes);
    one
}

const FIRST: u32 = 498_648;

fn meta(id: u64) -> SegmentMeta {
    SegmentMeta {
        id,
        kind: SegmentKind::Base,
        resolution: 3600,
        period_start: i64::from(FIRST) * 3600,
        period_end: i64::from(FIRST + 24) * 3600,
    }
}

/// Segment `s`'s records: 20 keys, each with a `referrer` value of ~1 KB of its own (so its
/// dictionary holds ~20 KB) and a shared `country`.
fn records(s: u64) -> BTreeMap<String, KeyRecord> {
    (0..20u32)
        .map(|i| {
            let b: Buckets = vec![(FIRST + i % 24, i64::from(i) + 1)];
            let long = format!("{s}-{i}-{}", "r".repeat(1000));
            let r = KeyRecord {
                totals: b.clone(),
                dims: vec![
                    DimRecord {
                        dim: "country".into(),
                        values: vec![("DE".into(), b.clone())],
                    },
                    DimRecord {
                        dim: "referrer".into(),
                        values: vec![(long, b)],
                    },
                ],
            };
            (format!("k{i:02}"), r)
        })
        .collect()
}

fn write(dir: &Path, s: u64) -> std::path::PathBuf {
    let path = dir.join(format!("{s}.seg"));
    let mut w = SegmentWriter::with_options(&path, meta(s), WriteOptions::default()).unwrap();
    for (key, r) in records(s) {
        w.add("clicks", &key, &r).unwrap();
    }
    w.finish().unwrap();
    path
}

/// Every record of every segment, read by key and by scan.
fn check_all(segs: &[Segment]) {
    for (s, seg) in segs.iter().enumerate() {
        let want = records(s as u64);
        for (key, r) in &want {
            assert_eq!(
                seg.get("clicks", key).unwrap().as_ref(),
                Some(r),
                "{s}/{key}"
            );
        }
        let mut seen = BTreeMap::new();
        seg.scan_all(&mut |_, key, r| {
            seen.insert(key.to_owned(), r.clone());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, want, "segment {s} scanned");
        seg.verify().unwrap();
    }
}

#[test]
fn dictionaries_past_the_bound_are_dropped_and_read_again_right() {
    let dir = tempfile::tempdir().unwrap();
    // Room for about two of the ten ~20 KB dictionaries.
    let _one = bound(50_000);
    let segs: Vec<Segment> = (0..10)
        .map(|s| Segment::open(&write(dir.path(), s)).unwrap())
        .collect();
    assert!(dicts::held_bytes() <= 50_000, "{}", dicts::held_bytes());
    assert!(dicts::held_bytes() > 0, "the last opened are held");
    let misses = dicts::misses();
    check_all(&segs);
    check_all(&segs);
    assert!(
        dicts::misses() >= misses + 10,
        "each segment's dictionary was read again ({} misses)",
        dicts::misses() - misses
    );
    assert!(dicts::held_bytes() <= 50_000, "{}", dicts::held_bytes());
    drop(segs);
    assert_eq!(
        dicts::held_bytes(),
        0,
        "a dropped segment's dictionary goes with it"
    );

    // With room for all, a second pass reads none again.
    dicts::set_budget(dicts::DEFAULT_BUDGET);
    let segs: Vec<Segment> = (0..10)
        .map(|s| Segment::open(&dir.path().join(format!("{s}.seg"))).unwrap())
        .collect();
    let misses = dicts::misses();
    check_all(&segs);
    assert_eq!(dicts::misses(), misses, "every dictionary stayed held");
}

#[test]
fn a_dictionary_larger_than_the_bound_is_decoded_for_each_read() {
    let dir = tempfile::tempdir().unwrap();
    let _one = bound(1000);
    let seg = Segment::open(&write(dir.path(), 0)).unwrap();
    assert_eq!(dicts::held_bytes(), 0);
    let misses = dicts::misses();
    check_all(std::slice::from_ref(&seg));
    assert!(dicts::misses() > misses);
    assert_eq!(dicts::held_bytes(), 0);
}

#[test]
fn a_dictionary_damaged_after_open_fails_its_reads_never_names_them_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let _one = bound(1000);
    let path = write(dir.path(), 3);
    let seg = Segment::open(&path).unwrap();
    assert_eq!(seg.get("clicks", "k01").unwrap(), records(3).remove("k01"));
    // Flip a byte inside the dictionary: the first byte of the index section past its
    // length word (docs/format.md: the footer's index offset).
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let len = f.metadata().unwrap().len();
    let mut footer = [0u8; 80];
    f.seek(SeekFrom::Start(len - 80)).unwrap();
    f.read_exact(&mut footer).unwrap();
    let at = layout::FOOTER_INDEX_OFFSET_OFFSET;
    let index_offset = u64::from_le_bytes(footer[at..at + 8].try_into().unwrap());
    let at = index_offset + 6;
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut byte).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[byte[0] ^ 0x20]).unwrap();
    drop(f);
    for key in ["k01", "k07"] {
        match seg.get("clicks", key) {
            Err(SegmentError::Checksum { block: None, .. }) => {}
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(seg.verify().is_err());
}

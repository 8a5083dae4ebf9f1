//! The frozen segment-v1 fixture: a segment written by format version 1, committed as bytes,
//! must keep opening with the same contents in every later build. The ignored test below
//! wrote it once (`TALLY_WRITE_FIXTURES=1 cargo test -p tally-engine --test it
//! write_segment_v1_fixture -- --ignored`); rewrite it only for a new format version, in a
//! new directory.

use std::path::PathBuf;

use tally_engine::segment::{
    Codec, KeyRecord, Segment, SegmentKind, SegmentMeta, SegmentWriter, WriteOptions,
};

use crate::segment::{FIRST, Input, rec};

fn fixture() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/segment-v1/base.seg"
    ))
}

fn meta() -> SegmentMeta {
    SegmentMeta {
        id: 20_261_120,
        kind: SegmentKind::Base,
        resolution: 3600,
        period_start: i64::from(FIRST) * 3600,
        period_end: i64::from(FIRST + 24) * 3600,
    }
}

/// 40 keys over two namespaces: unicode keys, negative and large counts, two dimensions
/// with a compound value and a long one.
fn contents() -> Input {
    let long = "x".repeat(300);
    let mut m = Input::new();
    for i in 0..40u32 {
        let (ns, key) = if i < 10 {
            ("api", format!("/v1/ping/{i}"))
        } else {
            ("clicks", format!("lnk_{i:02}_é字"))
        };
        let (n, h) = (i64::from(i) + 1, i % 22);
        let r = rec(
            &[(h, n), (h + 1, 1 << 40), (23, -n)],
            &[
                (
                    "country+device",
                    &[("DE|mobile", &[(23, -n)]), ("US|desktop", &[(h, n)])],
                ),
                ("referrer", &[(long.as_str(), &[(h, 2)])]),
            ],
        );
        m.insert((ns.to_owned(), key), r);
    }
    m
}

#[test]
#[ignore = "writes the frozen fixture: only for a new format version"]
fn write_segment_v1_fixture() {
    // Also behind the variable, so that `cargo test -- --ignored` cannot rewrite it.
    if std::env::var_os("TALLY_WRITE_FIXTURES").is_none() {
        return;
    }
    let path = fixture();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let opts = WriteOptions {
        codec: Codec::Zstd { level: 3 },
        block_target: 330,
    };
    let mut w = SegmentWriter::with_options(&path, meta(), opts).unwrap();
    for ((ns, key), r) in &contents() {
        w.add(ns, key, r).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn the_segment_v1_fixture_opens_and_reads_its_known_values() {
    let seg = Segment::open(&fixture()).unwrap();
    assert_eq!(seg.meta(), &meta());
    let stats = seg.verify().unwrap();
    assert_eq!(stats.keys, 40);
    assert_eq!(stats.bytes, std::fs::metadata(fixture()).unwrap().len());
    assert_eq!(seg.blocks().len(), 3);
    // Literal values, independent of the generator above.
    let r = seg.get("clicks", "lnk_30_é字").unwrap().unwrap();
    assert_eq!(
        r.totals,
        vec![(FIRST + 8, 31), (FIRST + 9, 1 << 40), (FIRST + 23, -31)]
    );
    assert_eq!(r.dims.len(), 2);
    assert_eq!(r.dims[0].dim, "country+device");
    assert_eq!(
        r.dims[0].values,
        vec![
            ("DE|mobile".to_owned(), vec![(FIRST + 23, -31)]),
            ("US|desktop".to_owned(), vec![(FIRST + 8, 31)]),
        ]
    );
    assert_eq!(r.dims[1].values[0].0.len(), 300);
    assert_eq!(r.dims[1].values[0].1, vec![(FIRST + 8, 2)]);
    assert_eq!(seg.get("clicks", "lnk_30").unwrap(), None);
    assert_eq!(
        seg.keys("api", "/v1/ping/", Some("/v1/ping/3"), 2).unwrap(),
        vec!["/v1/ping/4", "/v1/ping/5"]
    );
    // Everything equals what the generator makes.
    let mut all = Input::new();
    seg.scan_all(&mut |ns, key, r| {
        all.insert((ns.to_owned(), key.to_owned()), r.clone());
        Ok(())
    })
    .unwrap();
    assert_eq!(all, contents());
    assert_eq!(
        stats.data_points,
        all.values().map(KeyRecord::data_points).sum::<u64>()
    );
}

//! The frozen segment fixtures: segments written by format versions 1 and 2, committed as
//! bytes, must keep opening with the same contents in every later build. Version 1's was
//! written by the version-1 writer (`85a5fb5`), which no longer exists: today's writer
//! writes version 2, so nothing here can rewrite it. Version 2's was written by the ignored
//! test below (`TALLY_WRITE_FIXTURES=1 cargo test -p tally-engine --test it
//! write_segment_v2_fixture -- --ignored`) before rollup frames existed; a later fixture
//! goes in a new directory, never over this one.

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
    contents_over(|_| 0)
}

/// [`contents`] with key `i`'s first two buckets moved `day(i)` days later.
fn contents_over(day: impl Fn(u32) -> u32) -> Input {
    let long = "x".repeat(300);
    let mut m = Input::new();
    for i in 0..40u32 {
        let (ns, key) = if i < 10 {
            ("api", format!("/v1/ping/{i}"))
        } else {
            ("clicks", format!("lnk_{i:02}_é字"))
        };
        let (n, h) = (i64::from(i) + 1, i % 22 + 24 * day(i));
        let mut totals = vec![(h, n), (h + 1, 1 << 40), (23, -n)];
        totals.sort();
        let r = rec(
            &totals,
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

/// Writes a fixture, only when `TALLY_WRITE_FIXTURES` is set (so that `cargo test --
/// --ignored` cannot rewrite one).
fn write_fixture(path: &std::path::Path, meta: SegmentMeta, contents: &Input) {
    if std::env::var_os("TALLY_WRITE_FIXTURES").is_none() {
        return;
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let opts = WriteOptions {
        codec: Codec::Zstd { level: 3 },
        block_target: 330,
    };
    let mut w = SegmentWriter::with_options(path, meta, opts).unwrap();
    for ((ns, key), r) in contents {
        w.add(ns, key, r).unwrap();
    }
    w.finish().unwrap();
}

/// Every record of a segment.
fn all_records(seg: &Segment) -> Input {
    let mut all = Input::new();
    seg.scan_all(&mut |ns, key, r| {
        all.insert((ns.to_owned(), key.to_owned()), r.clone());
        Ok(())
    })
    .unwrap();
    all
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
    let all = all_records(&seg);
    assert_eq!(all, contents());
    assert_eq!(
        stats.data_points,
        all.values().map(KeyRecord::data_points).sum::<u64>()
    );
}

fn fixture_v2() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/segment-v2/base.seg"
    ))
}

/// Three UTC days of hours: three spans.
fn meta_v2() -> SegmentMeta {
    SegmentMeta {
        period_end: i64::from(FIRST + 72) * 3600,
        ..meta()
    }
}

/// As [`contents`], with key `i`'s first two buckets moved to day `i % 3`: each key has
/// traffic on one or two of the three days.
fn contents_v2() -> Input {
    contents_over(|i| i % 3)
}

#[test]
#[ignore = "writes the frozen fixture: only for a new format version"]
fn write_segment_v2_fixture() {
    write_fixture(&fixture_v2(), meta_v2(), &contents_v2());
}

#[test]
fn the_segment_v2_fixture_opens_and_reads_its_known_values() {
    use tally_engine::segment::Version;
    let seg = Segment::open(&fixture_v2()).unwrap();
    assert_eq!(seg.version(), Version::V2);
    assert_eq!(seg.meta(), &meta_v2());
    let stats = seg.verify().unwrap();
    assert_eq!(stats.keys, 40);
    assert_eq!(stats.bytes, std::fs::metadata(fixture_v2()).unwrap().len());
    let all = all_records(&seg);
    assert_eq!(all, contents_v2());
    // Literal values, independent of the generator above. Ranks: api's 10 keys, then
    // clicks' 30, key `lnk_i` at rank i.
    assert_eq!(seg.rank_range("api").unwrap(), 0..10);
    assert_eq!(seg.rank_range("clicks").unwrap(), 10..40);
    assert_eq!(seg.rank_range("nope").unwrap(), 40..40);
    assert_eq!(seg.rank_of("clicks", "lnk_13_é字").unwrap(), Some(13));
    assert_eq!(seg.spans_within(FIRST, FIRST + 72), Some(0..3));
    assert_eq!(seg.spans_within(FIRST + 24, FIRST + 48), Some(1..2));
    assert_eq!(seg.spans_within(FIRST + 1, FIRST + 48), None);
    let span = |s: usize| {
        let mut v = Vec::new();
        seg.span_sums(s, 13..16, &mut |r, n| v.push((r, n)))
            .unwrap();
        v
    };
    // lnk_13 (13 % 3 = 1): -14 on day 0, 14 + 2^40 on day 1; lnk_14: both on day 2 but -15
    // on day 0; lnk_15: everything on day 0, summing to 2^40.
    assert_eq!(span(0), vec![(13, -14), (14, -15), (15, 1 << 40)]);
    assert_eq!(span(1), vec![(13, 14 + (1 << 40))]);
    assert_eq!(span(2), vec![(14, 15 + (1 << 40))]);
    assert_eq!(
        seg.keys_at(&[9, 13, 39]).unwrap(),
        vec![
            ("api".to_owned(), "/v1/ping/9".to_owned()),
            ("clicks".to_owned(), "lnk_13_é字".to_owned()),
            ("clicks".to_owned(), "lnk_39_é字".to_owned()),
        ]
    );
}

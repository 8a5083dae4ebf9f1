//! Archive segments: what is written reads back exactly (against a `BTreeMap` reference), and
//! a damaged, truncated or foreign file is refused with an error naming what is wrong —
//! never a panic, never wrong numbers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use tally_engine::names::Names;
use tally_engine::segment::{
    Buckets, Codec, DimRecord, Exact, KeyRecord, Segment, SegmentError, SegmentKind, SegmentMeta,
    SegmentStats, SegmentWriter, WriteOptions,
};

/// An hourly segment for one day; its first bucket index is `FIRST`.
pub const FIRST: u32 = 498_648;
pub const HOURS: u32 = 24;

pub fn day_meta(kind: SegmentKind) -> SegmentMeta {
    SegmentMeta {
        id: 7,
        kind,
        resolution: 3600,
        period_start: i64::from(FIRST) * 3600,
        period_end: i64::from(FIRST + HOURS) * 3600,
    }
}

pub type Input = BTreeMap<(String, String), KeyRecord>;

pub fn write_with(path: &Path, input: &Input, opts: WriteOptions) -> SegmentStats {
    let mut w = SegmentWriter::with_options(path, day_meta(SegmentKind::Base), opts).unwrap();
    for ((ns, key), r) in input {
        w.add(ns, key, r).unwrap();
    }
    w.finish().unwrap()
}

fn all(seg: &Segment) -> Input {
    let mut out = Input::new();
    seg.scan_all(&mut |ns, key, r| {
        out.insert((ns.to_owned(), key.to_owned()), r.clone());
        Ok(())
    })
    .unwrap();
    out
}

fn b(pairs: Hours) -> Buckets {
    pairs.iter().map(|&(h, n)| (FIRST + h, n)).collect()
}

/// (hour, count) pairs, hours counted from `FIRST`.
type Hours<'a> = &'a [(u32, i64)];

pub fn rec(totals: Hours, dims: &[(&str, &[(&str, Hours)])]) -> KeyRecord {
    KeyRecord {
        totals: b(totals),
        dims: dims
            .iter()
            .map(|(d, vs)| DimRecord {
                dim: d.to_string(),
                values: vs.iter().map(|(v, bs)| (v.to_string(), b(bs))).collect(),
            })
            .collect(),
    }
}

/// A few hundred keys over two namespaces, cut into many small blocks.
fn sample() -> Input {
    let mut m = Input::new();
    for i in 0..300u32 {
        let ns = if i % 3 == 0 { "api" } else { "clicks" };
        let key = format!("k{i:04}/é");
        let r = rec(
            &[(i % 23, i64::from(i) + 1), (23, -2)],
            &[
                ("country", &[("DE", &[(i % 23, 1)]), ("US", &[(23, -2)])]),
                ("referrer", &[("news.ycombinator.com", &[(i % 23, 3)])]),
            ],
        );
        m.insert((ns.to_owned(), key), r);
    }
    m
}

fn small_blocks() -> WriteOptions {
    WriteOptions {
        codec: Codec::Zstd { level: 3 },
        block_target: 512,
    }
}

#[test]
fn a_sample_round_trips_through_many_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.seg");
    let input = sample();
    let stats = write_with(&path, &input, small_blocks());
    assert_eq!(stats.keys, 300);
    assert_eq!(stats.data_points, 300 * 5);
    assert_eq!(stats.bytes, std::fs::metadata(&path).unwrap().len());
    let seg = Segment::open(&path).unwrap();
    assert!(seg.blocks().len() > 5, "{} blocks", seg.blocks().len());
    assert_eq!(seg.meta(), &day_meta(SegmentKind::Base));
    assert_eq!(seg.verify().unwrap(), stats);
    for ((ns, key), r) in &input {
        assert_eq!(seg.get(ns, key).unwrap().as_ref(), Some(r), "{ns}/{key}");
        assert_eq!(
            seg.get_totals(ns, key).unwrap().as_ref(),
            Some(&r.totals),
            "{ns}/{key}"
        );
    }
    assert_eq!(seg.get("api", "nope").unwrap(), None);
    assert_eq!(seg.get("apj", "k0000/é").unwrap(), None);
    assert_eq!(all(&seg), input);
    let mut n = 0;
    seg.scan("api", &mut |k, r| {
        assert_eq!(input.get(&("api".to_owned(), k.to_owned())), Some(r));
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 100);
    let mut m = 0;
    seg.scan_totals("api", &mut |k, t| {
        let r = input.get(&("api".to_owned(), k.to_owned()));
        assert_eq!(r.map(|r| &r.totals), Some(t), "{k}");
        m += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(m, 100);
    assert_eq!(
        seg.keys("clicks", "k001", Some("k0011/é"), 3).unwrap(),
        vec!["k0013/é", "k0014/é", "k0016/é"]
    );
}

#[test]
fn an_empty_segment_opens_and_has_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.seg");
    let stats = write_with(&path, &Input::new(), WriteOptions::default());
    assert_eq!((stats.keys, stats.data_points), (0, 0));
    let seg = Segment::open(&path).unwrap();
    assert_eq!(seg.verify().unwrap(), stats);
    assert_eq!(seg.get("a", "b").unwrap(), None);
    assert!(seg.keys("a", "", None, 10).unwrap().is_empty());
    assert!(all(&seg).is_empty());
}

#[test]
fn the_writer_refuses_what_the_format_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.seg");
    let mut w = SegmentWriter::create(&path, day_meta(SegmentKind::Delta)).unwrap();
    let ok = rec(&[(0, 1)], &[]);
    w.add("b", "k", &ok).unwrap();
    for (ns, key) in [("b", "k"), ("b", "a"), ("a", "z")] {
        let e = w.add(ns, key, &ok).unwrap_err();
        assert!(matches!(e, SegmentError::OutOfOrder { .. }), "{e}");
    }
    let bad = [
        rec(&[(0, 0)], &[]),
        rec(&[(3, 1), (3, 1)], &[]),
        rec(&[(3, 1), (2, 1)], &[]),
        rec(&[(24, 1)], &[]),
        KeyRecord {
            totals: vec![(FIRST - 1, 1)],
            dims: vec![],
        },
        rec(&[], &[("b", &[]), ("a", &[])]),
        rec(&[], &[("a", &[("y", &[(0, 1)]), ("x", &[(0, 1)])])]),
        rec(&[], &[("a", &[("x", &[(0, 0)])])]),
    ];
    for r in &bad {
        let e = w.add("c", "k", r).unwrap_err();
        assert!(matches!(e, SegmentError::Invalid { .. }), "{r:?}: {e}");
    }
    let e = w.add("c\0d", "k", &ok).unwrap_err();
    assert!(matches!(e, SegmentError::Invalid { .. }), "{e}");
    w.add("c", "k", &ok).unwrap();
    let stats = w.finish().unwrap();
    assert_eq!(stats.keys, 2);
    let seg = Segment::open(&path).unwrap();
    assert_eq!(seg.meta().kind, SegmentKind::Delta);

    let mut meta = day_meta(SegmentKind::Base);
    meta.period_start += 1;
    let e = SegmentWriter::create(&path, meta).unwrap_err();
    assert!(matches!(e, SegmentError::Invalid { .. }), "{e}");
}

/// One key's record of a day can be far larger than a block's target (a million dimension
/// values over a day of hours is ~100 MiB): it is written alone in its block and reads back
/// whole. Blocks over 64 MiB were refused until 2026-11-26, and a flush holding such a key
/// then failed every time (the log and memory grew for good).
#[test]
fn a_record_larger_than_64_mib_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.seg");
    // Counts zstd cannot shrink, 8 bytes each: 400 000 values × 24 hours ≈ 77 MiB.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut count = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 9) as i64 | 1 << 54
    };
    let values: Vec<(String, Buckets)> = (0..400_000)
        .map(|i| {
            (
                format!("v{i:06}"),
                (0..HOURS).map(|h| (FIRST + h, count())).collect(),
            )
        })
        .collect();
    let big = KeyRecord {
        totals: (0..HOURS).map(|h| (FIRST + h, 1)).collect(),
        dims: vec![DimRecord {
            dim: "ip".into(),
            values,
        }],
    };
    let small = rec(&[(3, 5)], &[("country", &[("DE", &[(3, 5)])])]);
    let mut w = SegmentWriter::create(&path, day_meta(SegmentKind::Base)).unwrap();
    w.add("clicks", "a", &small).unwrap();
    w.add("clicks", "big", &big).unwrap();
    w.add("clicks", "c", &small).unwrap();
    w.finish().unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() > 64 << 20);

    let seg = Segment::open(&path).unwrap();
    seg.verify().unwrap();
    assert_eq!(seg.get("clicks", "big").unwrap().as_ref(), Some(&big));
    assert_eq!(seg.get("clicks", "c").unwrap(), Some(small));
}

#[test]
fn many_readers_share_one_open_segment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.seg");
    let input = Arc::new(sample());
    write_with(&path, &input, small_blocks());
    let seg = Arc::new(Segment::open(&path).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (seg, input) = (seg.clone(), input.clone());
            std::thread::spawn(move || {
                for ((ns, key), r) in input.iter().skip(t).step_by(2) {
                    assert_eq!(seg.get(ns, key).unwrap().as_ref(), Some(r));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

// ---- damage -------------------------------------------------------------------------------

fn written_sample(dir: &Path) -> (std::path::PathBuf, Vec<u8>, Input) {
    let path = dir.join("s.seg");
    let input = sample();
    write_with(&path, &input, small_blocks());
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes, input)
}

/// Everything a reader can be asked, run to the end: either an error, or exactly the input.
fn read_everything(path: &Path, input: &Input) -> Result<(), SegmentError> {
    let seg = Segment::open(path)?;
    seg.verify()?;
    for ((ns, key), r) in input {
        assert_eq!(seg.get(ns, key)?.as_ref(), Some(r));
    }
    let mut seen = Input::new();
    seg.scan_all(&mut |ns, key, r| {
        seen.insert((ns.to_owned(), key.to_owned()), r.clone());
        Ok(())
    })?;
    assert_eq!(&seen, input);
    Ok(())
}

#[test]
fn a_flipped_byte_in_a_block_is_a_checksum_error_naming_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, input) = written_sample(dir.path());
    let blocks = Segment::open(&path).unwrap().blocks().to_vec();
    // Which block each key is in: the index says block << 32 | position.
    let keys: Vec<_> = input.keys().cloned().collect();
    let mut first_key_of = Vec::new();
    let mut at = 0usize;
    for b in &blocks {
        first_key_of.push(keys[at].clone());
        at += b.keys as usize;
    }
    for (i, b) in blocks.iter().enumerate() {
        let mut damaged = bytes.clone();
        damaged[(b.offset + u64::from(b.stored_len / 2)) as usize] ^= 0x10;
        std::fs::write(&path, &damaged).unwrap();
        let seg = Segment::open(&path).unwrap();
        let (ns, key) = &first_key_of[i];
        let e = seg.get(ns, key).unwrap_err();
        assert!(
            matches!(e, SegmentError::Checksum { block: Some(n), expected, got, .. }
                if n == i as u64 && expected == b.crc && got != expected),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("block {i}")), "{e}");
        let e = seg.verify().unwrap_err();
        assert!(
            matches!(e, SegmentError::Checksum { block: Some(n), .. } if n == i as u64),
            "{e}"
        );
        // The other blocks still read right.
        let (ns, key) = &first_key_of[(i + 1) % blocks.len()];
        assert_eq!(
            seg.get(ns, key).unwrap().as_ref(),
            input.get(&(ns.clone(), key.clone()))
        );
    }
}

#[test]
fn a_flipped_byte_in_the_index_or_footer_fails_open_with_a_checksum_error() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, _) = written_sample(dir.path());
    use tally_engine::segment::layout as l;
    let footer_start = bytes.len() - l::FOOTER_LEN;
    let index_start = u64::from_le_bytes(
        bytes[footer_start + l::FOOTER_INDEX_OFFSET_OFFSET..][..8]
            .try_into()
            .unwrap(),
    );
    let positions = [
        index_start as usize,
        index_start as usize + 1,
        footer_start - 1,
        footer_start,
        footer_start + 8,
        footer_start + 40,
        footer_start + 72,
    ];
    for at in positions {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        let e = Segment::open(&path).unwrap_err();
        assert!(
            matches!(e, SegmentError::Checksum { block: None, expected, got, .. } if expected != got),
            "byte {at}: {e}"
        );
    }
}

/// A key index damaged behind a recomputed section checksum (a crafted file, or a bug of
/// ours) is refused at open by `fst`'s own checksum, before `fst` walks it.
#[test]
fn a_key_index_damaged_behind_a_valid_section_checksum_fails_open() {
    use tally_engine::segment::layout as l;
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, _) = written_sample(dir.path());
    let footer = bytes.len() - l::FOOTER_LEN;
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let index_at = u64::from_le_bytes(
        bytes[footer + l::FOOTER_INDEX_OFFSET_OFFSET..][..8]
            .try_into()
            .unwrap(),
    ) as usize;
    let fst_at = index_at + u32_at(footer + l::FOOTER_DICT_LEN_OFFSET);
    let fst_len = u32_at(footer + l::FOOTER_FST_LEN_OFFSET);
    for at in [fst_at + 8, fst_at + fst_len / 2, fst_at + fst_len - 12] {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x01;
        let crc = crc32c::crc32c(&damaged[index_at..footer]);
        damaged[footer + l::FOOTER_INDEX_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32c::crc32c(&damaged[footer..footer + l::FOOTER_CRC_OFFSET]);
        damaged[footer + l::FOOTER_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &damaged).unwrap();
        let e = Segment::open(&path).unwrap_err();
        assert!(
            matches!(e, SegmentError::Corrupt { .. }) && e.to_string().contains("key index"),
            "byte {at}: {e}"
        );
    }
}

#[test]
fn every_single_byte_flip_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.seg");
    let mut input = Input::new();
    for i in 0..12u32 {
        input.insert(
            ("ns".into(), format!("key{i}")),
            rec(&[(i, 1), (i + 1, -5)], &[("d", &[("v", &[(i, 1)])])]),
        );
    }
    write_with(
        &path,
        &input,
        WriteOptions {
            codec: Codec::Zstd { level: 3 },
            block_target: 40,
        },
    );
    let bytes = std::fs::read(&path).unwrap();
    let flipped = path.with_extension("bad");
    for at in 0..bytes.len() {
        for bit in [0x01, 0x80] {
            let mut damaged = bytes.clone();
            damaged[at] ^= bit;
            std::fs::write(&flipped, &damaged).unwrap();
            assert!(
                read_everything(&flipped, &input).is_err(),
                "flip {bit:#x} at byte {at} of {} went unnoticed",
                bytes.len()
            );
        }
    }
}

#[test]
fn a_truncated_or_extended_file_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, _) = written_sample(dir.path());
    let cut = path.with_extension("cut");
    for len in (0..bytes.len())
        .rev()
        .step_by(7)
        .chain([bytes.len() - 1, 0, 3, 4])
    {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let e = Segment::open(&cut).unwrap_err();
        assert!(
            matches!(
                e,
                SegmentError::Corrupt { .. } | SegmentError::Checksum { block: None, .. }
            ),
            "{len}: {e}"
        );
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(b"garbage");
    std::fs::write(&cut, &longer).unwrap();
    assert!(Segment::open(&cut).is_err());
    let mut longer = bytes.clone();
    let tail = longer.split_off(bytes.len() - 4);
    longer.extend_from_slice(b"xx");
    longer.extend_from_slice(&tail);
    std::fs::write(&cut, &longer).unwrap();
    assert!(Segment::open(&cut).is_err());
}

#[test]
fn an_unknown_version_or_foreign_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, _) = written_sample(dir.path());
    let mut v3 = bytes.clone();
    v3[3] = 3;
    std::fs::write(&path, &v3).unwrap();
    let e = Segment::open(&path).unwrap_err();
    assert!(
        matches!(e, SegmentError::UnsupportedVersion { got: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("version 3"), "{e}");
    let mut wal = bytes.clone();
    wal[..4].copy_from_slice(b"TLW\x01");
    std::fs::write(&path, &wal).unwrap();
    let e = Segment::open(&path).unwrap_err();
    assert!(matches!(e, SegmentError::BadMagic { .. }), "{e}");
    let e = Segment::open(&dir.path().join("missing.seg")).unwrap_err();
    assert!(matches!(e, SegmentError::Io { .. }), "{e}");
}

// ---- properties ---------------------------------------------------------------------------

fn count() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 1i64..4,
        2 => -3i64..0,
        1 => any::<i64>().prop_filter("non-zero", |n| *n != 0),
    ]
}

/// Mostly a few buckets; sometimes most of the day's, so that records get rollups. The
/// hours are a chosen subset, in order: drawing 12 to 24 distinct hours of 24 one at a time
/// (a `btree_map` of them) rejected so many repeats that runs of 20 000 cases gave up.
fn buckets() -> impl Strategy<Value = Buckets> {
    let hours: Vec<u32> = (FIRST..FIRST + HOURS).collect();
    prop_oneof![
        4 => prop::sample::subsequence(hours.clone(), 0..5),
        1 => prop::sample::subsequence(hours, 12..=HOURS as usize),
    ]
    .prop_flat_map(|hours| {
        let n = hours.len();
        (Just(hours), prop::collection::vec(count(), n))
    })
    .prop_map(|(hours, counts)| hours.into_iter().zip(counts).collect())
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9|]{0,4}",
        3 => "\\PC{0,8}",
        1 => "[a-z]{1500,2048}",
    ]
}

fn record() -> impl Strategy<Value = KeyRecord> {
    let dims = prop::collection::btree_map(
        "[a-z+]{1,8}",
        prop::collection::btree_map(text(), buckets(), 0..6),
        0..4,
    );
    (buckets(), dims).prop_map(|(totals, dims)| KeyRecord {
        totals,
        dims: dims
            .into_iter()
            .map(|(dim, values)| DimRecord {
                dim,
                values: values.into_iter().collect(),
            })
            .collect(),
    })
}

fn input() -> impl Strategy<Value = Input> {
    prop::collection::btree_map(("[a-c][a-z0-9_.-]{0,2}", "\\PC{0,10}"), record(), 0..40)
}

fn options() -> impl Strategy<Value = WriteOptions> {
    (
        prop_oneof![Just(Codec::None), Just(Codec::Zstd { level: 1 })],
        prop_oneof![Just(1usize), Just(200), Just(32 << 10)],
    )
        .prop_map(|(codec, block_target)| WriteOptions {
            codec,
            block_target,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn what_is_written_reads_back(
        input in input(),
        opts in options(),
        absent in prop::collection::vec(("[a-c][a-z0-9]{0,2}", "\\PC{0,10}"), 0..10),
        queries in prop::collection::vec(
            ("[a-c][a-z0-9]{0,2}", "\\PC{0,2}", prop::option::of("\\PC{0,10}"), 0usize..8),
            0..20,
        ),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.seg");
        let stats = write_with(&path, &input, opts);
        let seg = Segment::open(&path).unwrap();
        prop_assert_eq!(seg.verify().unwrap(), stats);
        prop_assert_eq!(stats.keys, input.len() as u64);
        prop_assert_eq!(
            stats.data_points,
            input.values().map(KeyRecord::data_points).sum::<u64>()
        );
        for ((ns, key), r) in &input {
            prop_assert_eq!(seg.get(ns, key).unwrap(), Some(r.clone()));
            // The whole day as spans (a rollup, when the record has one) sums as the
            // buckets do, for every dimension and for the first alone.
            let first_dim = r.dims.first().map(|d| d.dim.clone());
            for only_first in [false, true] {
                let dim_ok = |d: &str| !only_first || first_dim.as_deref() == Some(d);
                let (mut totals, mut subs) = (Vec::new(), BTreeMap::new());
                let found = seg
                    .sums(
                        (ns, key),
                        Some(Exact::Spans(0, 1)),
                        &|_| true,
                        &dim_ok,
                        &mut |i, n| totals.push((i, n)),
                        &mut |d, v, n| {
                            subs.insert((d.to_owned(), v.to_owned()), n);
                        },
                    )
                    .unwrap();
                prop_assert!(found);
                prop_assert_eq!(&totals, &r.totals);
                let want: BTreeMap<(String, String), i64> = r
                    .dims
                    .iter()
                    .filter(|d| dim_ok(&d.dim))
                    .flat_map(|d| {
                        d.values.iter().map(move |(v, b)| {
                            let sum = b.iter().fold(0i64, |t, (_, n)| t.wrapping_add(*n));
                            ((d.dim.clone(), v.clone()), sum)
                        })
                    })
                    .filter(|(_, n)| *n != 0)
                    .collect();
                prop_assert_eq!(&subs, &want);
                // The same by id, each id named through the engine's numbering.
                let names = Names::default();
                let ids = seg.name_ids(&names).unwrap();
                let mut by_id = BTreeMap::new();
                seg.sums_by_id((ns, key), Some(Exact::Spans(0, 1)), &|_| true, &dim_ok, &mut |_, _| {}, &mut |d, v, n| {
                    let (d, v) = ids.get(d, v).unwrap();
                    names.with(|name| by_id.insert((name(d).to_owned(), name(v).to_owned()), n));
                })
                .unwrap();
                prop_assert_eq!(by_id, want);
                prop_assert!(Arc::ptr_eq(&ids, &seg.name_ids(&names).unwrap()), "mapped once per Names");
                let other = Names::default();
                prop_assert_eq!(seg.name_ids(&other).unwrap().names, other.id(), "mapped again for a new one");
            }
        }
        for (ns, key) in &absent {
            if !input.contains_key(&(ns.clone(), key.clone())) {
                prop_assert_eq!(seg.get(ns, key).unwrap(), None);
            }
        }
        prop_assert_eq!(&all(&seg), &input);
        // Namespaces present and absent, prefixes, cursors, limits against the reference.
        let namespaces: std::collections::BTreeSet<&String> = input.keys().map(|(n, _)| n).collect();
        let mut qs = queries.clone();
        for ns in namespaces {
            qs.push((ns.clone(), String::new(), None, usize::MAX));
            if let Some((_, k)) = input.keys().find(|(n, _)| n == ns) {
                let p: String = k.chars().take(1).collect();
                qs.push((ns.clone(), p, Some(k.clone()), 3));
            }
            let mut scanned = Vec::new();
            seg.scan(ns, &mut |k, r| { scanned.push((k.to_owned(), r.clone())); Ok(()) }).unwrap();
            let want: Vec<_> = input.iter().filter(|((n, _), _)| n == ns)
                .map(|((_, k), r)| (k.clone(), r.clone())).collect();
            prop_assert_eq!(scanned, want);
        }
        for (ns, prefix, after, limit) in qs {
            let want: Vec<String> = input
                .keys()
                .filter(|(n, k)| *n == ns && k.starts_with(&prefix)
                    && after.as_ref().is_none_or(|a| k > a))
                .map(|(_, k)| k.clone())
                .take(limit)
                .collect();
            prop_assert_eq!(seg.keys(&ns, &prefix, after.as_deref(), limit).unwrap(), want);
        }
    }

    #[test]
    fn random_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        magic in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.seg");
        let mut bytes = bytes;
        if magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(b"TLS\x01");
            let n = bytes.len();
            bytes[n - 4..].copy_from_slice(b"TLS\x01");
        }
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(seg) = Segment::open(&path) {
            let _ = seg.verify();
            let _ = seg.get("a", "b");
            let _ = seg.scan_all(&mut |_, _, _| Ok(()));
        }
    }

    #[test]
    fn random_damage_is_an_error_or_reads_right(
        hits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes, input) = written_sample(dir.path());
        for (at, v) in hits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        std::fs::write(&path, &bytes).unwrap();
        // Either the damage is reported, or (a byte set to its own value) everything reads right.
        let _ = read_everything(&path, &input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The frames [`Segment::cover`] names for any range of hours, spans and hours added and
    /// hours taken off, sum to every key's totals over that range as the records hold them;
    /// a range that cuts an hour has no cover.
    #[test]
    fn covers_sum_to_the_totals_of_any_range_of_hours(
        keys in prop::collection::btree_map(
            "[a-z]{1,4}",
            prop::collection::btree_map(0u32..72, -3i64..20, 0..30),
            1..40,
        ),
        ranges in prop::collection::vec((0u32..80, 0u32..80), 1..12),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("days.seg");
        // Three days of hours: three spans of 24 hour frames each.
        let meta = SegmentMeta {
            period_end: i64::from(FIRST + 72) * 3600,
            ..day_meta(SegmentKind::Base)
        };
        let mut w =
            SegmentWriter::with_options(&path, meta.clone(), WriteOptions::default()).unwrap();
        let mut want_all = Vec::new();
        for (key, hours) in &keys {
            let totals: Buckets = hours
                .iter()
                .filter(|(_, n)| **n != 0)
                .map(|(&h, &n)| (FIRST + h, n))
                .collect();
            let r = KeyRecord { totals, dims: Vec::new() };
            w.add("ns", key, &r).unwrap();
            want_all.push(r.totals);
        }
        w.finish().unwrap();
        let seg = Segment::open(&path).unwrap();
        seg.verify().unwrap();
        let ranks = seg.rank_range("ns").unwrap();
        prop_assert_eq!(ranks.clone(), 0..keys.len() as u64);
        for (a, b) in ranges {
            let (lo, hi) = (FIRST - 4 + a.min(b), FIRST - 4 + a.max(b));
            let cover = seg.cover(lo, hi).unwrap();
            let mut got = vec![0i64; keys.len()];
            for (frames, sign) in [(&cover.add, 1i64), (&cover.sub, -1)] {
                for &f in frames {
                    seg.frame_sums(f, ranks.clone(), &mut |r, n| got[r as usize] += sign * n)
                        .unwrap();
                }
            }
            let want: Vec<i64> = want_all
                .iter()
                .map(|t| t.iter().filter(|(i, _)| lo <= *i && *i < hi).map(|(_, n)| n).sum())
                .collect();
            prop_assert_eq!(got, want, "hours [{}, {})", lo, hi);
            prop_assert!(cover.add.len() + cover.sub.len() <= 3 * 24, "{:?}", cover);
        }
        // A minute segment of one hour has one span and no hour frames: a range that cuts
        // the hour has no cover.
        let path = dir.path().join("hour.seg");
        let meta = SegmentMeta { resolution: 60, period_start: 3600 * 100, period_end: 3600 * 101, ..meta };
        let mut w = SegmentWriter::with_options(&path, meta, WriteOptions::default()).unwrap();
        let r = KeyRecord { totals: vec![(6000, 1), (6030, 2)], dims: Vec::new() };
        w.add("ns", "k", &r).unwrap();
        w.finish().unwrap();
        let seg = Segment::open(&path).unwrap();
        prop_assert_eq!(seg.cover(6000, 6030), None);
        prop_assert!(seg.cover(0, 7000).is_some_and(|c| c.add.len() == 1 && c.sub.is_empty()));
    }
}

/// A record over `hours` hours from `FIRST`: totals, and per dimension a few values whose
/// buckets lie among the totals' (as a writer's records always do).
fn record_over(hours: u32) -> impl Strategy<Value = KeyRecord> {
    let totals = prop_oneof![
        2 => prop::collection::btree_map(FIRST..FIRST + hours, 1i64..9, 1..8),
        1 => prop::collection::btree_map(FIRST..FIRST + hours, 1i64..9, 40..200),
    ];
    (totals, 0usize..3, any::<u64>()).prop_map(move |(totals, ndims, seed)| {
        let totals: Buckets = totals.into_iter().collect();
        let mut x = seed | 1;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let dims = (0..ndims)
            .map(|d| DimRecord {
                dim: format!("d{d}"),
                values: (0..1 + next(6))
                    .map(|v| {
                        let mut b: Buckets = Vec::new();
                        for &(i, _) in &totals {
                            if next(3) == 0 {
                                b.push((i, 1 + next(4) as i64));
                            }
                        }
                        (format!("v{v}"), b)
                    })
                    .filter(|(_, b)| !b.is_empty())
                    .collect(),
            })
            .collect();
        KeyRecord { totals, dims }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A record summed over any buckets a read takes (a range that cuts the period's days,
    /// or a scattered set), bucket by bucket: the same sums as the record's own buckets, in
    /// a day's segment (bucket bitmaps) and in a month's (bucket gaps), whatever the
    /// subtotals' coding.
    #[test]
    fn a_record_sums_over_any_buckets_as_its_buckets_do(
        month in any::<bool>(),
        recs in prop::collection::vec(record_over(24 * 31), 1..6),
        ranges in prop::collection::vec((0u32..800, 0u32..800, 0u32..3), 1..8),
    ) {
        let hours = if month { 24 * 31 } else { HOURS };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.seg");
        let meta = SegmentMeta {
            period_end: i64::from(FIRST + hours) * 3600,
            ..day_meta(SegmentKind::Base)
        };
        let clip = |b: &Buckets| -> Buckets {
            b.iter().copied().filter(|&(i, _)| i < FIRST + hours).collect()
        };
        let recs: Vec<KeyRecord> = recs
            .iter()
            .map(|r| KeyRecord {
                totals: clip(&r.totals),
                dims: r
                    .dims
                    .iter()
                    .map(|d| DimRecord {
                        dim: d.dim.clone(),
                        values: d
                            .values
                            .iter()
                            .map(|(v, b)| (v.clone(), clip(b)))
                            .filter(|(_, b)| !b.is_empty())
                            .collect(),
                    })
                    .collect(),
            })
            .filter(|r| !r.totals.is_empty())
            .collect();
        let mut w = SegmentWriter::with_options(&path, meta, WriteOptions::default()).unwrap();
        for (k, r) in recs.iter().enumerate() {
            w.add("ns", &format!("k{k}"), r).unwrap();
        }
        w.finish().unwrap();
        let seg = Segment::open(&path).unwrap();
        for (a, b, every) in ranges {
            let (lo, hi) = (FIRST + a.min(b), FIRST + a.max(b));
            // A range, or every second or third bucket of it.
            let takes = |i: u32| lo <= i && i < hi && (every == 0 || i.is_multiple_of(every + 1));
            for (k, r) in recs.iter().enumerate() {
                let (mut totals, mut subs) = (Vec::new(), BTreeMap::new());
                seg.sums(
                    ("ns", &format!("k{k}")),
                    None,
                    &takes,
                    &|_| true,
                    &mut |i, n| totals.push((i, n)),
                    &mut |d, v, n| {
                        subs.insert((d.to_owned(), v.to_owned()), n);
                    },
                )
                .unwrap();
                let want_totals: Buckets =
                    r.totals.iter().copied().filter(|&(i, _)| takes(i)).collect();
                prop_assert_eq!(&totals, &want_totals);
                let want: BTreeMap<(String, String), i64> = r
                    .dims
                    .iter()
                    .flat_map(|d| {
                        d.values.iter().map(move |(v, b)| {
                            let sum = b.iter().filter(|(i, _)| takes(*i)).map(|(_, n)| n).sum();
                            ((d.dim.clone(), v.clone()), sum)
                        })
                    })
                    .filter(|(_, n): &(_, i64)| *n != 0)
                    .collect();
                prop_assert_eq!(&subs, &want, "[{}, {}) every {}", lo, hi, every + 1);
                if every == 0 {
                    // Told that the read takes exactly that range (clipped to the period):
                    // the same sums, made once and then kept (the second read).
                    let exact = Exact::Buckets(lo, hi.min(FIRST + hours));
                    for _ in 0..2 {
                        let mut again = BTreeMap::new();
                        seg.sums(
                            ("ns", &format!("k{k}")),
                            Some(exact),
                            &takes,
                            &|_| true,
                            &mut |_, _| {},
                            &mut |d, v, n| {
                                again.insert((d.to_owned(), v.to_owned()), n);
                            },
                        )
                        .unwrap();
                        prop_assert_eq!(&again, &want, "{:?}", exact);
                    }
                }
            }
        }
    }
}

/// A record whose sums over a range of buckets weigh more than a segment keeps (here
/// 17 000 values): summed over every dimension once, remembered as too heavy, and from then
/// on summed over the wanted dimension alone — the same answers each time.
#[test]
fn a_record_too_heavy_to_keep_summed_over_buckets_is_summed_as_asked_each_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heavy.seg");
    let totals: Buckets = (0..HOURS).map(|h| (FIRST + h, 1000)).collect();
    let urls: Vec<(String, Buckets)> = (0..17_000u32)
        .map(|v| (format!("u{v:05}"), vec![(FIRST + v % HOURS, 1)]))
        .collect();
    let r = KeyRecord {
        totals: totals.clone(),
        dims: vec![
            DimRecord {
                dim: "country".into(),
                values: vec![("US".into(), totals)],
            },
            DimRecord {
                dim: "url".into(),
                values: urls,
            },
        ],
    };
    let mut w =
        SegmentWriter::with_options(&path, day_meta(SegmentKind::Base), WriteOptions::default())
            .unwrap();
    w.add("ns", "k", &r).unwrap();
    w.finish().unwrap();
    let seg = Segment::open(&path).unwrap();
    let (lo, hi) = (FIRST + 5, FIRST + HOURS);
    let takes = |i: u32| lo <= i && i < hi;
    let sum = |dim: Option<&str>| {
        let mut subs = BTreeMap::new();
        seg.sums(
            ("ns", "k"),
            Some(Exact::Buckets(lo, hi)),
            &takes,
            &|d| dim.is_none_or(|w| w == d),
            &mut |_, _| {},
            &mut |d, v, n| {
                subs.insert((d.to_owned(), v.to_owned()), n);
            },
        )
        .unwrap();
        subs
    };
    let want = |dim: Option<&str>| -> BTreeMap<(String, String), i64> {
        r.dims
            .iter()
            .filter(|d| dim.is_none_or(|w| w == d.dim))
            .flat_map(|d| {
                d.values.iter().map(move |(v, b)| {
                    let n = b.iter().filter(|(i, _)| takes(*i)).map(|(_, n)| n).sum();
                    ((d.dim.clone(), v.clone()), n)
                })
            })
            .filter(|(_, n): &(_, i64)| *n != 0)
            .collect()
    };
    for _ in 0..2 {
        assert_eq!(sum(Some("country")), want(Some("country")));
        assert_eq!(sum(None).len(), want(None).len());
        assert_eq!(sum(None), want(None));
    }
}

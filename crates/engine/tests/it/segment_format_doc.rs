//! docs/format.md's "Archive segments" tables must describe the bytes the code writes: they
//! are parsed here and held against the code's constants and against a file really written.

use tally_engine::segment::layout::*;
use tally_engine::segment::{Codec, Exact, Segment, SegmentKind, WriteOptions};

use crate::format_doc::{crc32c_of, doc, table};
use crate::segment::{FIRST, Input, day_meta, rec, write_with};

/// A byte table whose every size is a number: (offset, size) of each row.
fn layout(rows: &[Vec<String>]) -> Vec<(usize, usize)> {
    crate::format_doc::layout(rows)
        .into_iter()
        .zip(rows)
        .map(|((off, size), r)| (off, size.unwrap_or_else(|| panic!("row {r:?} has no size"))))
        .collect()
}

#[test]
fn segment_header_table_matches_the_code() {
    let l = layout(&table(&doc(), "### Segment header"));
    assert_eq!(l, vec![(0, 4)]);
    assert_eq!(HEADER_LEN, 4);
    assert_eq!(&MAGIC_V1[..3], b"TLS");
    assert_eq!(MAGIC_V1[3], 1);
    assert_eq!(&MAGIC_V2[..3], b"TLS");
    assert_eq!(MAGIC_V2[3], 2);
}

#[test]
fn sums_header_table_matches_the_code() {
    let l = layout(&table(&doc(), "### Sums header"));
    assert_eq!(
        l,
        vec![
            (SUMS_SPAN_BUCKETS_OFFSET, 8),
            (SUMS_SPANS_OFFSET, 4),
            (SUMS_FLAGS_OFFSET, 4),
            (SUMS_FRAMES_OFFSET_OFFSET, 8),
        ]
    );
    assert_eq!(l.iter().map(|(_, s)| s).sum::<usize>(), SUMS_HEADER_LEN);
}

#[test]
fn segment_footer_table_matches_the_code() {
    let l = layout(&table(&doc(), "### Segment footer"));
    assert_eq!(
        l,
        vec![
            (FOOTER_ID_OFFSET, 8),
            (FOOTER_KIND_OFFSET, 1),
            (FOOTER_CODEC_OFFSET, 1),
            (FOOTER_RESERVED_OFFSET, 2),
            (FOOTER_RESOLUTION_OFFSET, 4),
            (FOOTER_PERIOD_START_OFFSET, 8),
            (FOOTER_PERIOD_END_OFFSET, 8),
            (FOOTER_KEYS_OFFSET, 8),
            (FOOTER_POINTS_OFFSET, 8),
            (FOOTER_INDEX_OFFSET_OFFSET, 8),
            (FOOTER_DICT_LEN_OFFSET, 4),
            (FOOTER_FST_LEN_OFFSET, 4),
            (FOOTER_BLOCKS_OFFSET, 4),
            (FOOTER_INDEX_CRC_OFFSET, 4),
            (FOOTER_CRC_OFFSET, 4),
            (FOOTER_MAGIC_OFFSET, 4),
        ]
    );
    assert_eq!(l.iter().map(|(_, s)| s).sum::<usize>(), FOOTER_LEN);
}

#[test]
fn block_table_entry_matches_the_code() {
    let l = layout(&table(&doc(), "### Block table entry"));
    assert_eq!(
        l,
        vec![
            (BLOCK_OFFSET_OFFSET, 8),
            (BLOCK_STORED_LEN_OFFSET, 4),
            (BLOCK_RAW_LEN_OFFSET, 4),
            (BLOCK_CRC_OFFSET, 4),
            (BLOCK_KEYS_OFFSET, 4),
        ]
    );
    assert_eq!(l.iter().map(|(_, s)| s).sum::<usize>(), BLOCK_ENTRY_LEN);
}

#[test]
fn segment_constants_table_matches_the_code() {
    let rows = table(&doc(), "### Segment constants");
    let want = [
        ("`HEADER_LEN`", HEADER_LEN),
        ("`FOOTER_LEN`", FOOTER_LEN),
        ("`BLOCK_ENTRY_LEN`", BLOCK_ENTRY_LEN),
        ("`MAX_BLOCK_RAW_LEN`", MAX_BLOCK_RAW_LEN),
        ("`DICT_HEADER_LEN`", DICT_HEADER_LEN),
        ("`MAX_DICT_RAW_LEN`", MAX_DICT_RAW_LEN),
        ("`DEFAULT_BLOCK_TARGET`", DEFAULT_BLOCK_TARGET),
        ("`SUMS_HEADER_LEN`", SUMS_HEADER_LEN),
        ("`MAX_SPANS`", MAX_SPANS as usize),
        ("`SPAN_SECS`", SPAN_SECS as usize),
        ("`SUMS_FLAG_ROLLUPS`", SUMS_FLAG_ROLLUPS as usize),
        ("`SUMS_FLAG_HOURS`", SUMS_FLAG_HOURS as usize),
        ("`HOUR_SECS`", HOUR_SECS as usize),
        (
            "`ROLLUP_RATIO`",
            tally_engine::segment::ROLLUP_RATIO as usize,
        ),
    ];
    assert_eq!(rows.len(), want.len());
    for (name, value) in want {
        let row = rows
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("{name} not documented"));
        assert_eq!(row[1].parse::<usize>().unwrap(), value, "{name}");
    }
    assert_eq!((CODEC_NONE, CODEC_ZSTD), (0, 1));
}

/// A record with eight subtotal buckets in one series and one span has a rollup: its
/// frame holds the documented bytes, and its table entry is the last before the hour
/// frames' (24: the period is a day of hours).
#[test]
fn a_rollup_frame_has_the_documented_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.seg");
    let hours: Vec<(u32, i64)> = (0..8).map(|h| (h, 1 + i64::from(h % 2))).collect();
    let mut input = Input::new();
    input.insert(
        ("clicks".into(), "k".into()),
        rec(&hours, &[("country", &[("US", &hours)])]),
    );
    let opts = WriteOptions {
        codec: Codec::None,
        block_target: 1 << 10,
    };
    write_with(&path, &input, opts);
    let b = std::fs::read(&path).unwrap();
    let r_at = b.len() - FOOTER_LEN - 25 * BLOCK_ENTRY_LEN;
    let r = &b[r_at..r_at + BLOCK_ENTRY_LEN];
    // Record 0 (gap 0), spans from 0, 1 span, 1 series, the sum 12 (zigzag 24).
    let frame = [0, 0, 1, 1, 24];
    let at = u64_at(r, 0) as usize;
    assert_eq!(&b[at..at + frame.len()], &frame[..]);
    assert_eq!(u32_at(r, 8) as usize, frame.len());
    assert_eq!(u32_at(r, 12) as usize, frame.len());
    assert_eq!(u32_at(r, 16), crc32c_of(&frame));
    assert_eq!(u32_at(r, 20), 1, "rollups");
    let seg = Segment::open(&path).unwrap();
    seg.verify().unwrap();
    let us = |seg: &Segment| {
        let mut got = Vec::new();
        seg.sums(
            ("clicks", "k"),
            Some(Exact::Spans(0, 1)),
            &|_| true,
            &|_| true,
            &mut |_, _| {},
            &mut |d, v, n| got.push((d.to_owned(), v.to_owned(), n)),
        )
        .unwrap();
        got
    };
    assert_eq!(us(&seg), vec![("country".into(), "US".into(), 12)]);
    drop(seg);

    // The sum changed to 13 behind recomputed checksums (frame, index section, footer): the
    // file opens and a read trusts the frame, but `verify` (`tally check`) names it.
    std::fs::write(&path, forge(&b, r_at, at + 4, 26)).unwrap();
    let seg = Segment::open(&path).unwrap();
    assert_eq!(us(&seg), vec![("country".into(), "US".into(), 13)]);
    let err = seg.verify().unwrap_err().to_string();
    assert!(err.contains("rollup frame 0"), "{err}");
}

/// `b` with byte `at` of the frame whose table entry starts at `entry` set to `to`, behind
/// recomputed checksums (the frame's, the index section's and the footer's): a file that
/// opens and reads, which only `verify` can find wrong.
fn forge(b: &[u8], entry: usize, at: usize, to: u8) -> Vec<u8> {
    let mut forged = b.to_vec();
    let start = u64_at(&b[entry..], 0) as usize;
    let len = u32_at(&b[entry..], 8) as usize;
    assert!(
        (start..start + len).contains(&at),
        "byte {at} is in the frame"
    );
    forged[at] = to;
    let crc = crc32c_of(&forged[start..start + len]);
    forged[entry + 16..entry + 20].copy_from_slice(&crc.to_le_bytes());
    let footer = forged.len() - FOOTER_LEN;
    let index_at = u64_at(&forged[footer..], 48) as usize;
    let crc = crc32c_of(&forged[index_at..footer]);
    forged[footer + 68..footer + 72].copy_from_slice(&crc.to_le_bytes());
    let crc = crc32c_of(&forged[footer..footer + 72]);
    forged[footer + 72..footer + 76].copy_from_slice(&crc.to_le_bytes());
    forged
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn a_real_segment_file_has_the_documented_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.seg");
    let mut input = Input::new();
    input.insert(
        ("clicks".into(), "k".into()),
        rec(&[(2, 3), (5, -1)], &[("country", &[("US", &[(2, 3)])])]),
    );
    let stats = write_with(
        &path,
        &input,
        WriteOptions {
            codec: Codec::None,
            block_target: 1 << 10,
        },
    );
    let b = std::fs::read(&path).unwrap();
    assert_eq!(stats.bytes, b.len() as u64);
    assert_eq!(&b[..4], b"TLS\x02");
    let f = &b[b.len() - FOOTER_LEN..];
    assert_eq!(&f[76..], b"TLS\x02");
    assert_eq!(u64_at(f, 0), 7);
    assert_eq!(f[8], 0, "base");
    assert_eq!(f[9], 0, "stored");
    assert_eq!(&f[10..12], &[0, 0]);
    let meta = day_meta(SegmentKind::Base);
    assert_eq!(u32_at(f, 12), meta.resolution);
    assert_eq!(u64_at(f, 16) as i64, meta.period_start);
    assert_eq!(u64_at(f, 24) as i64, meta.period_end);
    assert_eq!(u64_at(f, 32), 1, "keys");
    assert_eq!(u64_at(f, 40), 3, "data points");
    let index_at = u64_at(f, 48) as usize;
    let dict_len = u32_at(f, 56) as usize;
    let fst_len = u32_at(f, 60) as usize;
    assert_eq!(u32_at(f, 64), 1, "blocks");
    let index = &b[index_at..b.len() - FOOTER_LEN];
    // Dictionary, key index, one block entry, the sums header, one span entry, one key
    // frame entry, one rollup frame entry and 24 hour frame entries.
    assert_eq!(
        index.len(),
        dict_len + fst_len + BLOCK_ENTRY_LEN + SUMS_HEADER_LEN + 27 * BLOCK_ENTRY_LEN
    );
    assert_eq!(u32_at(f, 68), crc32c_of(index));
    assert_eq!(u32_at(f, 72), crc32c_of(&f[..72]));

    // The dictionary, stored as is: its length, one dimension "country" with one value "US".
    let mut dict = vec![13, 0, 0, 0, 1, 7];
    dict.extend_from_slice(b"country");
    dict.extend_from_slice(&[1, 2]);
    dict.extend_from_slice(b"US");
    assert_eq!(&index[..dict_len], &dict[..]);

    // The one block: at 4, stored as is, checksummed, one record.
    let e = &index[dict_len + fst_len..];
    assert_eq!(u64_at(e, 0), 4);
    let len = u32_at(e, 8) as usize;
    assert_eq!(u32_at(e, 12) as usize, len);
    assert_eq!(u32_at(e, 16), crc32c_of(&b[4..4 + len]));
    assert_eq!(u32_at(e, 20), 1);
    // Five stream lengths, then the streams:
    #[rustfmt::skip]
    let want = [
        3, 3, 2, 1, 1,
        // shape: 1 dimension, subtotals by position (1 << 1 | 1); dimension id 0, 1 value
        3, 0, 1,
        // totals buckets: hours 2 and 5 of the 24 as a 3-byte bitmap
        0b10_0100, 0, 0,
        // totals counts: zigzag 3 -> 6, -1 -> 1
        6, 1,
        // value ids: "US" is value 0 of "country"
        0,
        // subtotal buckets: the first of the 2 totals buckets
        0b01,
        // subtotal counts: 6
        6,
    ];
    assert_eq!(&b[4..4 + len], &want[..]);

    // The sums header: a day of hours is one span of 24 buckets; frames start after the block.
    let h = &e[BLOCK_ENTRY_LEN..];
    assert_eq!(u64_at(h, 0), 24);
    assert_eq!(u32_at(h, 8), 1);
    assert_eq!(
        u32_at(h, 12),
        SUMS_FLAG_ROLLUPS | SUMS_FLAG_HOURS,
        "rollup frames and hour frames follow"
    );
    let frames_at = 4 + len;
    assert_eq!(u64_at(h, 16) as usize, frames_at);
    // The span frame: one entry, a rank stream of one byte (rank 0), the sum 3 - 1 = 2
    // (zigzag 4).
    let span = [1, 1, 0, 4];
    let s = &h[SUMS_HEADER_LEN..];
    assert_eq!(u64_at(s, 0) as usize, frames_at);
    assert_eq!(u32_at(s, 8) as usize, span.len());
    assert_eq!(u32_at(s, 12) as usize, span.len());
    assert_eq!(u32_at(s, 16), crc32c_of(&span));
    assert_eq!(u32_at(s, 20), 1, "entries");
    assert_eq!(&b[frames_at..frames_at + span.len()], &span[..]);
    // The key frame of the block: "clicks\0k", nothing shared.
    let mut keys = vec![0, 8];
    keys.extend_from_slice(b"clicks\0k");
    let k = &s[BLOCK_ENTRY_LEN..];
    let keys_at = frames_at + span.len();
    assert_eq!(u64_at(k, 0) as usize, keys_at);
    assert_eq!(u32_at(k, 8) as usize, keys.len());
    assert_eq!(u32_at(k, 16), crc32c_of(&keys));
    assert_eq!(u32_at(k, 20), 1, "keys");
    assert_eq!(&b[keys_at..keys_at + keys.len()], &keys[..]);
    // The record's one subtotal bucket is too few for a rollup: the block's rollup frame is
    // empty.
    let r = &k[BLOCK_ENTRY_LEN..];
    assert_eq!(u64_at(r, 0) as usize, keys_at + keys.len());
    assert_eq!(&r[8..BLOCK_ENTRY_LEN], &[0; 16]);
    // The hour frames, one per hour of the day: hour 2 holds rank 0's 3 (zigzag 6), hour 5
    // its -1 (zigzag 1), every other hour no entry (a count and a rank stream length of 0).
    let mut at = keys_at + keys.len();
    for hour in 0..24 {
        let e = &r[(1 + hour) * BLOCK_ENTRY_LEN..];
        let frame: &[u8] = match hour {
            2 => &[1, 1, 0, 6],
            5 => &[1, 1, 0, 1],
            _ => &[0, 0],
        };
        assert_eq!(u64_at(e, 0) as usize, at, "hour {hour}");
        assert_eq!(u32_at(e, 8) as usize, frame.len());
        assert_eq!(u32_at(e, 12) as usize, frame.len());
        assert_eq!(u32_at(e, 16), crc32c_of(frame));
        assert_eq!(u32_at(e, 20), u32::from(frame[0]), "entries");
        assert_eq!(&b[at..at + frame.len()], frame);
        at += frame.len();
    }
    assert_eq!(at, index_at);
    // The key index maps "clicks\0k" to block 0, position 0.
    let seg = Segment::open(&path).unwrap();
    assert_eq!(seg.index_bytes(), fst_len);
    assert_eq!(seg.dictionary_strings(), 2);
    assert_eq!(
        seg.get("clicks", "k").unwrap(),
        input.values().next().cloned()
    );
    assert_eq!(seg.meta().first_bucket(), FIRST);
    assert_eq!(seg.version(), Version::V2);
    seg.verify().unwrap();
    drop(seg);

    // A span frame and an hour frame whose sums differ from the records' behind recomputed
    // checksums: the file opens, `verify` names the frame (it compares each with a digest
    // of what the records say, not a list of every entry).
    let span_entry = index_at + dict_len + fst_len + BLOCK_ENTRY_LEN + SUMS_HEADER_LEN;
    let hour_entry = |hour: usize| span_entry + (3 + hour) * BLOCK_ENTRY_LEN;
    let hour_2_at = u64_at(&b[hour_entry(2)..], 0) as usize;
    for (forged, frame) in [
        (forge(&b, span_entry, frames_at + 3, 6), "span frame 0"),
        (forge(&b, hour_entry(2), hour_2_at + 3, 8), "hour frame 2"),
    ] {
        std::fs::write(&path, &forged).unwrap();
        let err = Segment::open(&path)
            .unwrap()
            .verify()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{frame} does not hold the sums")),
            "{err}"
        );
    }
}

//! docs/format.md must describe the bytes the code writes: its tables are parsed here and
//! held against the code's constants and against a file the engine really wrote.

use tally_engine::wal::{
    FILE_FIRST_SEQ_OFFSET, FILE_HEADER_CRC_OFFSET, FILE_HEADER_LEN, FILE_MAGIC_OFFSET,
    FRAME_HEADER_CRC_OFFSET, FRAME_HEADER_LEN, FRAME_LEN_OFFSET, FRAME_PAYLOAD_CRC_OFFSET,
    FRAME_SEQ_OFFSET, MAGIC_V1, MAX_PAYLOAD_LEN,
};

pub fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/format.md")).unwrap()
}

/// The rows of the first table after `heading`, as cells.
pub fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// Checks a byte table is contiguous from 0 and returns (offset, size) of each row.
pub fn layout(rows: &[Vec<String>]) -> Vec<(usize, Option<usize>)> {
    let mut at = 0;
    rows.iter()
        .map(|r| {
            let off: usize = r[0].parse().unwrap();
            assert_eq!(off, at, "row {r:?} does not follow the previous one");
            let size = r[1].parse().ok();
            at += size.unwrap_or(0);
            (off, size)
        })
        .collect()
}

#[test]
fn file_header_table_matches_the_code() {
    let rows = table(&doc(), "### File header");
    let l = layout(&rows);
    assert_eq!(
        l,
        vec![
            (FILE_MAGIC_OFFSET, Some(4)),
            (FILE_FIRST_SEQ_OFFSET, Some(8)),
            (FILE_HEADER_CRC_OFFSET, Some(4))
        ]
    );
    assert_eq!(
        l.iter().map(|(_, s)| s.unwrap()).sum::<usize>(),
        FILE_HEADER_LEN
    );
    assert_eq!(&MAGIC_V1[..3], b"TLW");
    assert_eq!(MAGIC_V1[3], 1);
}

#[test]
fn frame_table_matches_the_code() {
    let rows = table(&doc(), "### Frame");
    let l = layout(&rows);
    assert_eq!(
        l,
        vec![
            (FRAME_LEN_OFFSET, Some(4)),
            (FRAME_SEQ_OFFSET, Some(8)),
            (FRAME_PAYLOAD_CRC_OFFSET, Some(4)),
            (FRAME_HEADER_CRC_OFFSET, Some(4)),
            (FRAME_HEADER_LEN, None),
        ]
    );
}

#[test]
fn constants_table_matches_the_code() {
    let rows = table(&doc(), "### Constants");
    let want = [
        ("`FILE_HEADER_LEN`", FILE_HEADER_LEN),
        ("`FRAME_HEADER_LEN`", FRAME_HEADER_LEN),
        ("`MAX_PAYLOAD_LEN`", MAX_PAYLOAD_LEN),
    ];
    assert_eq!(rows.len(), want.len());
    for (name, value) in want {
        let row = rows
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("{name} not documented"));
        assert_eq!(row[1].parse::<usize>().unwrap(), value, "{name}");
    }
}

#[test]
fn a_real_log_file_has_the_documented_layout() {
    use crate::{NOW, clock, open, raw, write};
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), &clock(NOW), tally_engine::FsyncPolicy::Always);
    write(&e, NOW, &[raw("clicks", "k", NOW, 3, &[("country", "US")])]).unwrap();
    drop(e);
    let files = tally_engine::wal::list_files(&dir.path().join("wal")).unwrap();
    assert_eq!(
        files[0].1.file_name().unwrap().to_str().unwrap(),
        "00000000000000000001.wal"
    );
    let b = std::fs::read(&files[0].1).unwrap();
    assert_eq!(&b[..4], b"TLW\x01");
    assert_eq!(u64::from_le_bytes(b[4..12].try_into().unwrap()), 1);
    assert_eq!(
        u32::from_le_bytes(b[12..16].try_into().unwrap()),
        crc32c_of(&b[..12])
    );
    let f = &b[FILE_HEADER_LEN..];
    let len = u32::from_le_bytes(f[..4].try_into().unwrap()) as usize;
    assert_eq!(
        f.len(),
        FRAME_HEADER_LEN + len,
        "one frame fills the rest of the file"
    );
    assert_eq!(u64::from_le_bytes(f[4..12].try_into().unwrap()), 1);
    assert_eq!(
        u32::from_le_bytes(f[12..16].try_into().unwrap()),
        crc32c_of(&f[20..])
    );
    assert_eq!(
        u32::from_le_bytes(f[16..20].try_into().unwrap()),
        crc32c_of(&f[..16])
    );
    // Kind 3: the time it was written (a varint of NOW), then as kind 1: a string table of
    // [clicks, k, country, US], one namespace created.
    let p = &f[20..];
    assert_eq!(p[0], 3);
    let mut at = 0u64;
    let mut i = 1;
    loop {
        at |= u64::from(p[i] & 0x7f) << (7 * (i - 1));
        i += 1;
        if p[i - 1] & 0x80 == 0 {
            break;
        }
    }
    assert_eq!(at, NOW as u64);
    assert_eq!(&p[i..i + 2], &[4, 6]);
    assert_eq!(&p[i + 2..i + 8], b"clicks");
}

/// A schema change that adds a tier is logged as kind 4, its schema's flags byte saying a
/// coverage follows, laid out as the "Schema" and "Coverage" tables say.
#[test]
fn a_real_schema_change_with_a_coverage_has_the_documented_layout() {
    use tally_core::model::{Namespace, Schema, SchemaDoc};
    use tally_core::store::Store;
    let doc = doc();
    let fields: Vec<String> = table(&doc, "**Coverage**")
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(fields, ["totals", "subtotals", "dimensions", "others"]);
    let flags: Vec<(String, String)> = table(&doc, "then a flags byte")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    assert_eq!(flags[0].0, "`0x01`");
    assert_eq!(flags[1].0, "`0x02`");
    assert!(doc.contains("| kind | byte `2`, or `4` when the schema carries a coverage |"));

    let dir = tempfile::tempdir().unwrap();
    let e = crate::open(
        dir.path(),
        &crate::clock(crate::NOW),
        tally_engine::FsyncPolicy::Always,
    );
    let ns = Namespace::new("clicks").unwrap();
    let schema = |tiers: &[&str]| {
        Schema::from_doc(&SchemaDoc {
            tiers: tiers.iter().map(|t| t.to_string()).collect(),
            breakdown_tiers: Some(vec!["1h".into()]),
            dimensions: None,
        })
        .unwrap()
    };
    e.put_schema(&ns, &schema(&["1h:forever"])).unwrap();
    e.put_schema(&ns, &schema(&["1m:2h", "1h:forever"]))
        .unwrap();
    drop(e);
    let files = tally_engine::wal::list_files(&dir.path().join("wal")).unwrap();
    let b = std::fs::read(&files[0].1).unwrap();
    let mut frames = Vec::new();
    let mut f = &b[FILE_HEADER_LEN..];
    while !f.is_empty() {
        let len = u32::from_le_bytes(f[..4].try_into().unwrap()) as usize;
        frames.push(&f[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len]);
        f = &f[FRAME_HEADER_LEN + len..];
    }
    assert_eq!(frames.len(), 2);
    assert_eq!(
        frames[0][0], 2,
        "a new namespace's schema has no coverage: kind 2"
    );
    let mut want = vec![4u8, 6];
    want.extend_from_slice(b"clicks");
    want.push(2);
    for t in ["1m:2h", "1h:forever"] {
        want.push(t.len() as u8);
        want.extend_from_slice(t.as_bytes());
    }
    want.extend_from_slice(&[1, 2]);
    want.extend_from_slice(b"1h");
    // Flags: a coverage follows, no allow-list.
    want.push(0x02);
    // totals: one, the minute tier, whole from NOW + max_future_secs (3600) + 1, zigzagged.
    want.extend_from_slice(&[1, 60]);
    varint(&mut want, ((crate::NOW + 3601) as u64) << 1);
    // subtotals, dimensions: none; others: none.
    want.extend_from_slice(&[0, 0, 0]);
    assert_eq!(frames[1], &want[..]);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn crc32c_of(b: &[u8]) -> u32 {
    // CRC32C by the textbook bitwise definition, independent of the crate the code uses.
    let mut crc = !0u32;
    for &byte in b {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn manifest_header_table_matches_the_code() {
    use tally_engine::manifest::{
        MANIFEST_CRC_OFFSET, MANIFEST_HEADER_LEN, MANIFEST_LEN_OFFSET, MANIFEST_MAGIC_OFFSET,
        MANIFEST_MAGIC_V1, MANIFEST_MAGIC_V2, MANIFEST_MAGIC_V3,
    };
    let rows = table(&doc(), "### Manifest header");
    let l = layout(&rows);
    assert_eq!(
        l,
        vec![
            (MANIFEST_MAGIC_OFFSET, Some(4)),
            (MANIFEST_LEN_OFFSET, Some(4)),
            (MANIFEST_CRC_OFFSET, Some(4)),
            (MANIFEST_HEADER_LEN, None),
        ]
    );
    assert!(rows[0][2].contains("`TLM`") && MANIFEST_MAGIC_V2.starts_with(b"TLM"));
    assert!(rows[0][2].contains(
        "(`0x03` when a schema in it carries a coverage, else `0x02`; `0x01` is still read)"
    ));
    assert_eq!(
        (
            MANIFEST_MAGIC_V1[3],
            MANIFEST_MAGIC_V2[3],
            MANIFEST_MAGIC_V3[3]
        ),
        (1, 2, 3)
    );
}

#[test]
fn a_real_answers_file_has_the_documented_layout() {
    use tally_core::store::IdemRecord;
    use tally_engine::manifest::{ANSWERS_MAGIC_V1, encode_answers};
    let doc = doc();
    assert!(doc.contains("magic `TLA` then the version byte `0x01`"));
    let r = IdemRecord {
        key: "k".into(),
        fingerprint: "f".into(),
        expires: 300,
        status: 200,
        body: "{}".into(),
    };
    let b = encode_answers(std::slice::from_ref(&r));
    assert_eq!(b[..4], ANSWERS_MAGIC_V1);
    assert_eq!(&ANSWERS_MAGIC_V1, b"TLA\x01");
    let payload = &b[12..];
    assert_eq!(
        u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize,
        payload.len()
    );
    assert_eq!(
        u32::from_le_bytes(b[8..12].try_into().unwrap()),
        crc32c_of(payload)
    );
    // count 1; "k"; "f"; expiry 300 (varint ac 02); status 200 (c8 01); "{}".
    assert_eq!(
        payload,
        [1, 1, b'k', 1, b'f', 0xac, 0x02, 0xc8, 0x01, 2, b'{', b'}']
    );
}

//! The manifest: which archive segments make up the archive, from which log record recovery
//! must replay, and the checkpoint of what truncated log records carried (schemas as of that
//! record, and the answers files holding the unexpired idempotency answers). A new manifest is published by writing a new
//! numbered file and then atomically replacing `CURRENT`, the one-line file that names it
//! (docs/format.md, "Manifest"). Whatever `CURRENT` names is the archive; every other
//! segment or manifest file is left over from a crash or a compaction and may be removed.

use std::path::{Path, PathBuf};

use tally_core::model::{Namespace, Schema};
use tally_core::store::IdemRecord;

use crate::catalog::Cutoff;
use crate::io::Fs;
use crate::wal::payload::{PayloadError, Reader, put_bytes, put_schema, put_varint};

/// Magic bytes of a manifest file, with the format version in the last byte. Format 1 kept
/// every remembered idempotency answer in the manifest itself; format 2 keeps them in
/// answers files the manifest lists, each written once.
pub const MANIFEST_MAGIC_V1: [u8; 4] = *b"TLM\x01";
pub const MANIFEST_MAGIC_V2: [u8; 4] = *b"TLM\x02";
/// Format 3: as format 2, and a schema may carry its coverage (written only when one does,
/// so that a build from before refuses the manifest rather than misread it).
pub const MANIFEST_MAGIC_V3: [u8; 4] = *b"TLM\x03";
/// Magic bytes of an answers file (format 1), then the same header as a manifest's.
pub const ANSWERS_MAGIC_V1: [u8; 4] = *b"TLA\x01";
/// Bytes before the payload: magic (4), payload length (4), CRC32C of the payload (4).
pub const MANIFEST_HEADER_LEN: usize = 12;
pub const MANIFEST_MAGIC_OFFSET: usize = 0;
pub const MANIFEST_LEN_OFFSET: usize = 4;
pub const MANIFEST_CRC_OFFSET: usize = 8;
/// The pointer file.
pub const CURRENT: &str = "CURRENT";

/// One published segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEntry {
    pub id: u64,
    /// A delta holds late increments to a period that already has a segment; reads add it.
    pub delta: bool,
    /// Tier resolution in seconds.
    pub resolution: u32,
    pub period_start: i64,
    pub period_end: i64,
    /// Every increment to this period from log records up to this sequence number is in
    /// this segment or in an earlier one of the same period; replay skips them.
    pub flushed_seq: u64,
}

/// One published answers file: idempotency answers written once, by the publish after the
/// batches that gave them, so that a publish writes only the answers new since the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswersEntry {
    /// Shares the segments' numbering (`next_segment_id`); the file is `<id>.tla` beside them.
    pub id: u64,
    pub answers: u64,
    /// The latest expiry of any answer in the file: once past, the file is dropped whole.
    pub newest_expiry: i64,
}

/// A published archive state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Grows by one per publication; names the file.
    pub number: u64,
    pub next_segment_id: u64,
    /// The first log record recovery replays; whole files before it may be deleted.
    pub wal_start: u64,
    pub segments: Vec<SegmentEntry>,
    /// Every namespace's schema as of record `wal_start - 1`.
    pub schemas: Vec<(Namespace, Schema)>,
    /// Idempotency answers held in the manifest itself: all of them in format 1; in format
    /// 2 only those a format-1 manifest carried until a flush writes them to a file.
    pub idempotency: Vec<IdemRecord>,
    /// The answers files (format 2) holding the other remembered answers.
    pub answers: Vec<AnswersEntry>,
    /// Per namespace and tier resolution, the log records before which archived data is
    /// hidden (the tier, or its subtotals, was removed then).
    pub cutoffs: Vec<(Namespace, u32, Cutoff)>,
}

/// Why the manifest could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a tally manifest (bad magic bytes)", path.display())]
    BadMagic { path: PathBuf },
    #[error("{}: manifest format version {got} is not supported by this build (it reads versions 1 to 3)", path.display())]
    UnsupportedVersion { path: PathBuf, got: u8 },
    #[error("{}: manifest checksum mismatch (expected {expected:#010x}, got {got:#010x})", path.display())]
    Checksum {
        path: PathBuf,
        expected: u32,
        got: u32,
    },
    #[error("{}: damaged manifest: {why}", path.display())]
    Framing { path: PathBuf, why: String },
    #[error("{}: undecodable manifest: {why}", path.display())]
    Corrupt { path: PathBuf, why: PayloadError },
    #[error("{}: {why}", path.display())]
    BadCurrent { path: PathBuf, why: &'static str },
    /// `CURRENT` is gone after a publish: manifests are there and the log was truncated
    /// past what they archived, so starting as a directory that never flushed would lose
    /// the archive (and its leftover clean-up would delete it).
    #[error(
        "{}: missing, but the directory holds {newest} and {log}: \
         without CURRENT, which names the manifest in use, the archive cannot be found. Restore \
         it from a backup, or write the newest manifest's name into it \
         (`printf '{newest}\\n' > CURRENT`) and run `tally check`; tally does not start \
         without it (--accept-data-loss does not change this)",
        path.display()
    )]
    MissingCurrent {
        path: PathBuf,
        newest: String,
        /// What the log looks like: "its log starts at record 3, …", "its log has no file …".
        log: String,
    },
    /// An answers file the manifest lists is damaged.
    #[error("{}: damaged idempotency answers file: {why}", path.display())]
    Answers { path: PathBuf, why: String },
    /// The checkpoint does not apply (a schema the catalog refuses).
    #[error("the manifest's checkpoint does not apply")]
    Checkpoint {
        #[source]
        source: tally_core::store::StoreError,
    },
}

/// The file name of manifest `number`: `MANIFEST-` and 20 digits.
pub fn file_name(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("MANIFEST-{number:020}"))
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::new();
        put_varint(&mut p, self.number);
        put_varint(&mut p, self.next_segment_id);
        put_varint(&mut p, self.wal_start);
        put_varint(&mut p, self.segments.len() as u64);
        for s in &self.segments {
            put_varint(&mut p, s.id);
            p.push(u8::from(s.delta));
            put_varint(&mut p, u64::from(s.resolution));
            put_varint(&mut p, s.period_start as u64);
            put_varint(&mut p, s.period_end as u64);
            put_varint(&mut p, s.flushed_seq);
        }
        put_varint(&mut p, self.schemas.len() as u64);
        for (ns, schema) in &self.schemas {
            put_bytes(&mut p, ns.as_str().as_bytes());
            put_schema(&mut p, schema);
        }
        put_varint(&mut p, self.idempotency.len() as u64);
        for r in &self.idempotency {
            put_answer(&mut p, r);
        }
        put_varint(&mut p, self.cutoffs.len() as u64);
        for (ns, res, c) in &self.cutoffs {
            put_bytes(&mut p, ns.as_str().as_bytes());
            put_varint(&mut p, u64::from(*res));
            put_varint(&mut p, c.all);
            put_varint(&mut p, c.subtotals);
        }
        put_varint(&mut p, self.answers.len() as u64);
        for a in &self.answers {
            put_varint(&mut p, a.id);
            put_varint(&mut p, a.answers);
            put_varint(&mut p, a.newest_expiry as u64);
        }
        let covered = self.schemas.iter().any(|(_, s)| !s.coverage().is_empty());
        framed(
            if covered {
                MANIFEST_MAGIC_V3
            } else {
                MANIFEST_MAGIC_V2
            },
            &p,
        )
    }

    /// Decodes a manifest file's bytes; never panics, whatever the bytes.
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let path = || path.to_owned();
        if bytes.len() < MANIFEST_HEADER_LEN {
            return Err(ManifestError::Corrupt {
                path: path(),
                why: PayloadError::Truncated,
            });
        }
        let version = match bytes[..4] {
            [b'T', b'L', b'M', v @ (1..=3)] => v,
            [b'T', b'L', b'M', got] => {
                return Err(ManifestError::UnsupportedVersion { path: path(), got });
            }
            _ => return Err(ManifestError::BadMagic { path: path() }),
        };
        let payload = checked_payload(bytes).map_err(|why| match why {
            Frame::Checksum { expected, got } => ManifestError::Checksum {
                path: path(),
                expected,
                got,
            },
            Frame::Length { .. } => ManifestError::Framing {
                path: path(),
                why: why.describe(),
            },
        })?;
        Self::decode_payload(payload, version)
            .map_err(|why| ManifestError::Corrupt { path: path(), why })
    }

    fn decode_payload(payload: &[u8], version: u8) -> Result<Manifest, PayloadError> {
        let mut r = Reader::new(payload);
        let mut m = Manifest {
            number: r.varint()?,
            next_segment_id: r.varint()?,
            wal_start: r.varint()?,
            ..Manifest::default()
        };
        for _ in 0..r.len()? {
            let id = r.varint()?;
            let delta = r.u8()? != 0;
            let resolution = u32::try_from(r.varint()?).map_err(|_| PayloadError::BadVarint)?;
            m.segments.push(SegmentEntry {
                id,
                delta,
                resolution,
                period_start: r.varint()? as i64,
                period_end: r.varint()? as i64,
                flushed_seq: r.varint()?,
            });
        }
        for _ in 0..r.len()? {
            let name = r.str()?;
            let ns = Namespace::new(name).map_err(|e| PayloadError::Schema(e.to_string()))?;
            m.schemas.push((ns, r.schema()?));
        }
        for _ in 0..r.len()? {
            m.idempotency.push(read_answer(&mut r)?);
        }
        for _ in 0..r.len()? {
            let name = r.str()?;
            let ns = Namespace::new(name).map_err(|e| PayloadError::Schema(e.to_string()))?;
            let res = u32::try_from(r.varint()?).map_err(|_| PayloadError::BadVarint)?;
            let c = Cutoff {
                all: r.varint()?,
                subtotals: r.varint()?,
            };
            m.cutoffs.push((ns, res, c));
        }
        if version >= 2 {
            for _ in 0..r.len()? {
                m.answers.push(AnswersEntry {
                    id: r.varint()?,
                    answers: r.varint()?,
                    newest_expiry: r.varint()? as i64,
                });
            }
        }
        match r.left() {
            0 => Ok(m),
            n => Err(PayloadError::Trailing(n)),
        }
    }
}

/// Magic, payload length, CRC32C of the payload, then the payload: the frame of manifests
/// and answers files.
fn framed(magic: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MANIFEST_HEADER_LEN + payload.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Why a framed file's payload is refused.
enum Frame {
    /// The header's payload length is not what the file holds.
    Length {
        said: usize,
        holds: usize,
    },
    Checksum {
        expected: u32,
        got: u32,
    },
}

impl Frame {
    fn describe(&self) -> String {
        match self {
            Frame::Length { said, holds } => format!(
                "the header gives a payload of {said} bytes, the file holds {holds} (cut short or \
                 damaged)"
            ),
            Frame::Checksum { expected, got } => {
                format!("checksum mismatch (expected {expected:#010x}, got {got:#010x})")
            }
        }
    }
}

/// The payload of a frame at least `MANIFEST_HEADER_LEN` long, if its length and checksum
/// hold; else which of them does not.
fn checked_payload(bytes: &[u8]) -> Result<&[u8], Frame> {
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let len = u32_at(MANIFEST_LEN_OFFSET) as usize;
    let expected = u32_at(MANIFEST_CRC_OFFSET);
    let payload = &bytes[MANIFEST_HEADER_LEN..];
    if payload.len() != len {
        return Err(Frame::Length {
            said: len,
            holds: payload.len(),
        });
    }
    let got = crc32c::crc32c(payload);
    if got != expected {
        return Err(Frame::Checksum { expected, got });
    }
    Ok(payload)
}

fn put_answer(p: &mut Vec<u8>, r: &IdemRecord) {
    put_bytes(p, r.key.as_bytes());
    put_bytes(p, r.fingerprint.as_bytes());
    put_varint(p, r.expires as u64);
    put_varint(p, u64::from(r.status));
    put_bytes(p, r.body.as_bytes());
}

fn read_answer(r: &mut Reader<'_>) -> Result<IdemRecord, PayloadError> {
    Ok(IdemRecord {
        key: r.str()?.to_owned(),
        fingerprint: r.str()?.to_owned(),
        expires: r.varint()? as i64,
        status: u16::try_from(r.varint()?).map_err(|_| PayloadError::BadVarint)?,
        body: r.str()?.to_owned(),
    })
}

/// The path of answers file `id`: 20 digits and `.tla`, in the segments directory.
pub fn answers_path(segments_dir: &Path, id: u64) -> PathBuf {
    segments_dir.join(format!("{id:020}.tla"))
}

/// The bytes of an answers file holding `answers` (docs/format.md, "Answers files").
pub fn encode_answers(answers: &[IdemRecord]) -> Vec<u8> {
    let mut p = Vec::new();
    put_varint(&mut p, answers.len() as u64);
    for r in answers {
        put_answer(&mut p, r);
    }
    framed(ANSWERS_MAGIC_V1, &p)
}

/// Decodes an answers file's bytes; never panics, whatever the bytes.
pub fn decode_answers(path: &Path, bytes: &[u8]) -> Result<Vec<IdemRecord>, ManifestError> {
    let bad = |why: String| ManifestError::Answers {
        path: path.to_owned(),
        why,
    };
    if bytes.len() < MANIFEST_HEADER_LEN {
        return Err(bad("truncated".into()));
    }
    match bytes[..4] {
        [b'T', b'L', b'A', 1] => {}
        [b'T', b'L', b'A', v] => {
            return Err(bad(format!(
                "format version {v} is not supported by this build (it reads version 1)"
            )));
        }
        _ => return Err(bad("not a tally answers file (bad magic bytes)".into())),
    }
    let payload = checked_payload(bytes).map_err(|why| bad(why.describe()))?;
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    let decoded = (|| {
        for _ in 0..r.len()? {
            out.push(read_answer(&mut r)?);
        }
        match r.left() {
            0 => Ok(()),
            n => Err(PayloadError::Trailing(n)),
        }
    })();
    decoded.map_err(|why| bad(why.to_string()))?;
    Ok(out)
}

/// Reads every answers file `m` lists, checked whole.
pub fn load_answers(segments_dir: &Path, m: &Manifest) -> Result<Vec<IdemRecord>, ManifestError> {
    let mut out = Vec::new();
    for a in &m.answers {
        out.extend(read_answers(segments_dir, a)?);
    }
    Ok(out)
}

/// Reads the answers file `a` names, checked whole and against the count the manifest
/// gives (recovery and `check` both).
pub fn read_answers(
    segments_dir: &Path,
    a: &AnswersEntry,
) -> Result<Vec<IdemRecord>, ManifestError> {
    let path = answers_path(segments_dir, a.id);
    let bytes = std::fs::read(&path).map_err(|source| ManifestError::Io {
        path: path.clone(),
        source,
    })?;
    let got = decode_answers(&path, &bytes)?;
    if got.len() as u64 != a.answers {
        return Err(ManifestError::Answers {
            path,
            why: format!(
                "holds {} answers, the manifest says {}",
                got.len(),
                a.answers
            ),
        });
    }
    Ok(got)
}

/// Reads the manifest `CURRENT` names; `None` when there is no `CURRENT` (a directory that
/// has never flushed). A `CURRENT` naming a missing or damaged manifest is an error: the
/// archive it describes cannot be found, and starting without it would lose data.
pub fn load(dir: &Path) -> Result<Option<Manifest>, ManifestError> {
    let current = dir.join(CURRENT);
    let text = match std::fs::read_to_string(&current) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match lost_current(dir) {
                // A first publish may have renamed CURRENT into place and truncated the
                // log since it was looked for (a backup or `check` beside a live server):
                // then it is read as usual.
                Some(_) if current.exists() => load(dir),
                Some(err) => Err(err),
                None => Ok(None),
            };
        }
        Err(source) => {
            return Err(ManifestError::Io {
                path: current,
                source,
            });
        }
    };
    let name = text.strip_suffix('\n').unwrap_or(&text);
    let number = name
        .strip_prefix("MANIFEST-")
        .filter(|n| n.len() == 20)
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or(ManifestError::BadCurrent {
            path: current.clone(),
            why: "does not name a manifest (expected MANIFEST-<20 digits>)",
        })?;
    let path = file_name(dir, number);
    let bytes = std::fs::read(&path).map_err(|source| ManifestError::Io {
        path: path.clone(),
        source,
    })?;
    let m = Manifest::decode(&path, &bytes)?;
    if m.number != number {
        return Err(ManifestError::BadCurrent {
            path,
            why: "the manifest's number differs from its file name",
        });
    }
    Ok(Some(m))
}

/// Without `CURRENT`, a directory that never flushed — or one whose first publish crashed
/// before `CURRENT` was written, leaving a manifest but a log that still starts at record 1
/// (the log is truncated only after a publish) — opens as new. Manifests beside a log that
/// starts later (or is empty) mean `CURRENT` was lost: that error.
fn lost_current(dir: &Path) -> Option<ManifestError> {
    let newest = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("MANIFEST-")
                .is_some_and(|d| d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .max()?;
    let log = match crate::wal::list_files(&dir.join("wal")) {
        Ok(files) => match files.first() {
            Some((1, _)) => return None,
            Some((first, _)) => {
                format!("its log starts at record {first}, truncated after a publish")
            }
            None => "its log has no file (truncation never removes the last one: log files \
                     were lost too)"
                .to_owned(),
        },
        // Unreadable: the log's own open names that; do not guess here.
        Err(_) => return None,
    };
    Some(ManifestError::MissingCurrent {
        path: dir.join(CURRENT),
        newest,
        log,
    })
}

/// Publishes `m` durably: the manifest file (fsynced), its directory, then `CURRENT`
/// replaced by rename and the directory synced again. A crash at any point leaves `CURRENT`
/// naming either the previous manifest or this one, each whole.
pub fn publish(fs: &dyn Fs, dir: &Path, m: &Manifest) -> std::io::Result<()> {
    let path = file_name(dir, m.number);
    fs.remove(&path)?;
    fs.write_new(&path, &m.encode())?;
    fs.sync_dir(dir)?;
    let name = format!("MANIFEST-{:020}\n", m.number);
    crate::io::replace(fs, &dir.join(CURRENT), name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsFs;

    fn sample() -> Manifest {
        Manifest {
            number: 7,
            next_segment_id: 12,
            wal_start: 4242,
            segments: vec![SegmentEntry {
                id: 11,
                delta: true,
                resolution: 3600,
                period_start: 1_795_132_800,
                period_end: 1_795_219_200,
                flushed_seq: 4000,
            }],
            schemas: vec![(Namespace::new("clicks").unwrap(), Schema::default())],
            idempotency: vec![IdemRecord {
                key: "k".into(),
                fingerprint: "f".into(),
                expires: 1_795_300_000,
                status: 200,
                body: "{\"accepted\":1}".into(),
            }],
            cutoffs: vec![(
                Namespace::new("clicks").unwrap(),
                60,
                Cutoff {
                    all: 3,
                    subtotals: 9,
                },
            )],
            answers: vec![AnswersEntry {
                id: 10,
                answers: 2,
                newest_expiry: 1_795_400_000,
            }],
        }
    }

    #[test]
    fn manifests_round_trip_through_current() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let m = sample();
        publish(&OsFs, dir.path(), &m).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(m.clone()));
        let next = Manifest { number: 8, ..m };
        publish(&OsFs, dir.path(), &next).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(next));
    }

    #[test]
    fn damage_is_refused_never_guessed() {
        let p = Path::new("MANIFEST-x");
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(
                Manifest::decode(p, &b).is_err(),
                "flip at {i} went unnoticed"
            );
        }
        for cut in 0..bytes.len() {
            assert!(Manifest::decode(p, &bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Each is named for what it is: a length that is not the file's, a checksum that
        // is not the payload's (the two once read "expected 0x…, got" the same value).
        let mut b = bytes.clone();
        b[MANIFEST_LEN_OFFSET] ^= 0x01;
        let err = Manifest::decode(p, &b).unwrap_err().to_string();
        assert!(err.contains("header gives a payload of"), "{err}");
        let mut b = bytes.clone();
        *b.last_mut().unwrap() ^= 0x01;
        let err = Manifest::decode(p, &b).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        let mut b = encode_answers(&sample().idempotency);
        b[MANIFEST_LEN_OFFSET] ^= 0x01;
        let err = decode_answers(p, &b).unwrap_err().to_string();
        assert!(err.contains("header gives a payload of"), "{err}");
        let mut v4 = bytes.clone();
        v4[3] = 4;
        assert!(matches!(
            Manifest::decode(p, &v4),
            Err(ManifestError::UnsupportedVersion { got: 4, .. })
        ));
    }

    /// A schema with a coverage makes the manifest format 3 (a build from before refuses
    /// it); without one it stays format 2, byte for byte as before.
    #[test]
    fn a_schema_s_coverage_makes_format_3() {
        let plain = sample();
        assert_eq!(plain.encode()[..4], MANIFEST_MAGIC_V2);
        let mut covered = sample();
        let (_, schema) = covered.schemas[0].clone();
        let before = Schema::from_doc(&tally_core::model::SchemaDoc {
            tiers: vec!["1m:2h".into()],
            breakdown_tiers: Some(vec![]),
            dimensions: None,
        })
        .unwrap();
        covered.schemas[0].1 = schema.replacing(Some(&before), 1_790_000_000, 3600);
        assert!(!covered.schemas[0].1.coverage().is_empty());
        let bytes = covered.encode();
        assert_eq!(bytes[..4], MANIFEST_MAGIC_V3);
        assert_eq!(Manifest::decode(Path::new("m"), &bytes).unwrap(), covered);
    }

    /// A format-1 manifest (answers inline, no answers files) still decodes: the payload of
    /// format 2 without its last section.
    #[test]
    fn format_1_manifests_still_decode() {
        let m = Manifest {
            answers: Vec::new(),
            ..sample()
        };
        let v2 = m.encode();
        // Drop the answers-files count (one zero byte) and frame it as format 1.
        let payload = &v2[MANIFEST_HEADER_LEN..v2.len() - 1];
        let v1 = framed(MANIFEST_MAGIC_V1, payload);
        assert_eq!(Manifest::decode(Path::new("m"), &v1).unwrap(), m);
        // Format 1 with a trailing answers section is refused, not half read.
        let v1_long = framed(MANIFEST_MAGIC_V1, &v2[MANIFEST_HEADER_LEN..]);
        assert!(Manifest::decode(Path::new("m"), &v1_long).is_err());
    }

    #[test]
    fn answers_files_round_trip_and_refuse_damage() {
        let p = Path::new("x.tla");
        let answers = sample().idempotency;
        let bytes = encode_answers(&answers);
        assert_eq!(decode_answers(p, &bytes).unwrap(), answers);
        assert_eq!(decode_answers(p, &encode_answers(&[])).unwrap(), []);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode_answers(p, &b).is_err(), "flip at {i} went unnoticed");
        }
        for cut in 0..bytes.len() {
            assert!(decode_answers(p, &bytes[..cut]).is_err(), "cut at {cut}");
        }
        let err = decode_answers(p, &sample().encode()).unwrap_err();
        assert!(err.to_string().contains("bad magic"), "{err}");
    }

    #[test]
    fn a_listed_answers_file_that_is_missing_or_short_stops_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let m = sample();
        assert!(matches!(
            load_answers(dir.path(), &m),
            Err(ManifestError::Io { .. })
        ));
        // The manifest says 2; the file holds 1.
        std::fs::write(answers_path(dir.path(), 10), encode_answers(&m.idempotency)).unwrap();
        let err = load_answers(dir.path(), &m).unwrap_err();
        assert!(err.to_string().contains("holds 1 answers"), "{err}");
        let two = [m.idempotency.clone(), m.idempotency.clone()].concat();
        std::fs::write(answers_path(dir.path(), 10), encode_answers(&two)).unwrap();
        assert_eq!(load_answers(dir.path(), &m).unwrap(), two);
    }

    #[test]
    fn a_current_naming_a_missing_manifest_stops_recovery() {
        let dir = tempfile::tempdir().unwrap();
        publish(&OsFs, dir.path(), &sample()).unwrap();
        std::fs::remove_file(file_name(dir.path(), 7)).unwrap();
        assert!(matches!(load(dir.path()), Err(ManifestError::Io { .. })));
        std::fs::write(dir.path().join(CURRENT), "garbage\n").unwrap();
        assert!(matches!(
            load(dir.path()),
            Err(ManifestError::BadCurrent { .. })
        ));
    }
}

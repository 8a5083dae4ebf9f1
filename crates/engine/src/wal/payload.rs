//! What one log record says: a batch (with the namespaces it creates) or a schema change,
//! as bytes (docs/format.md, "Record payloads"). A batch is kept as a [`BatchView`]: its
//! strings once in a table, its increments as indexes into it. Live writes and replay both
//! apply a `BatchView`, so the two paths cannot drift.

use std::collections::HashMap;

use tally_core::model::{Coverage, Duration, Namespace, Schema, SchemaDoc};
use tally_core::store::{Batch, IdemRecord};

/// Payload kind: a batch of increments.
pub const KIND_BATCH: u8 = 1;
/// Payload kind: a namespace's schema set.
pub const KIND_SCHEMA: u8 = 2;
/// Payload kind: a namespace's schema set, with the coverage the change left (as
/// [`KIND_SCHEMA`]; a schema with a coverage is written as this kind only, so that a build
/// from before refuses the log rather than misread it).
pub const KIND_SCHEMA_COVERED: u8 = 4;
/// Payload kind: a batch of increments with the time it was written (a varint of unix
/// seconds after the kind byte, then as [`KIND_BATCH`]). Replay needs that time to tell an
/// increment its tier kept when it came from one it did not (see `state::holds_bucket`).
pub const KIND_BATCH_AT: u8 = 3;

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    #[error("payload ends early")]
    Truncated,
    #[error("unknown payload kind {0}")]
    UnknownKind(u8),
    #[error("string index {0} out of range")]
    BadIndex(u64),
    #[error("string is not UTF-8")]
    NotUtf8,
    #[error("a varint is longer than 10 bytes")]
    BadVarint,
    #[error("{0} trailing bytes")]
    Trailing(usize),
    #[error("invalid schema: {0}")]
    Schema(String),
}

/// One increment of a [`BatchView`]; `subs` is a range of `BatchView::subs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncView {
    pub ns: u32,
    pub key: u32,
    pub ts: i64,
    pub n: i64,
    pub subs: (u32, u32),
}

/// A batch with its strings interned in a table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchView<'a> {
    pub strings: Vec<&'a str>,
    /// (namespace string index, schema).
    pub creates: Vec<(u32, Schema)>,
    pub incs: Vec<IncView>,
    /// (dimension string index, value string index).
    pub subs: Vec<(u32, u32)>,
    /// The answer remembered under an idempotency key, with the batch.
    pub idempotency: Option<IdemRecord>,
    /// When the batch was written (unix seconds): every record since [`KIND_BATCH_AT`]
    /// says; older ones do not.
    pub at: Option<i64>,
}

impl<'a> BatchView<'a> {
    pub fn from_batch(batch: &'a Batch) -> Self {
        let mut view = BatchView::default();
        // Sized for a key and two values an increment, so that the map is not grown and
        // rehashed a dozen times a batch.
        let strings = batch.increments.len() * 3;
        let mut index: HashMap<&'a str, u32, crate::seeded::State> =
            HashMap::with_capacity_and_hasher(strings, crate::seeded::State::default());
        view.strings.reserve(strings);
        view.subs.reserve(batch.increments.len() * 2);
        let mut intern = |s: &'a str, strings: &mut Vec<&'a str>| -> u32 {
            *index.entry(s).or_insert_with(|| {
                strings.push(s);
                (strings.len() - 1) as u32
            })
        };
        for (ns, schema) in &batch.create {
            let i = intern(ns.as_str(), &mut view.strings);
            view.creates.push((i, schema.clone()));
        }
        view.incs.reserve(batch.increments.len());
        // A batch's increments nearly always share their namespace, and their dimensions
        // come in the same order (sorted by name): each is compared with the string of the
        // increment before, at the same place, before it is hashed.
        let mut last_ns: Option<(&'a str, u32)> = None;
        let mut last_dims: [Option<(&'a str, u32)>; 4] = [None; 4];
        for inc in &batch.increments {
            let ns = match last_ns {
                Some((s, i)) if s == inc.ns.as_str() => i,
                _ => {
                    let i = intern(inc.ns.as_str(), &mut view.strings);
                    last_ns = Some((inc.ns.as_str(), i));
                    i
                }
            };
            let key = intern(inc.key.as_str(), &mut view.strings);
            let start = view.subs.len() as u32;
            for (j, s) in inc.subtotals.iter().enumerate() {
                let d = match last_dims.get(j).copied().flatten() {
                    Some((dim, i)) if dim == s.dim => i,
                    _ => {
                        let i = intern(&s.dim, &mut view.strings);
                        if let Some(slot) = last_dims.get_mut(j) {
                            *slot = Some((&s.dim, i));
                        }
                        i
                    }
                };
                let v = intern(&s.value, &mut view.strings);
                view.subs.push((d, v));
            }
            let subs = (start, view.subs.len() as u32);
            view.incs.push(IncView {
                ns,
                key,
                ts: inc.ts,
                n: inc.n,
                subs,
            });
        }
        view.idempotency = batch.idempotency.clone();
        view
    }

    pub fn str(&self, i: u32) -> &'a str {
        self.strings.get(i as usize).copied().unwrap_or("")
    }

    pub fn subs_of(&self, inc: &IncView) -> &[(u32, u32)] {
        self.subs
            .get(inc.subs.0 as usize..inc.subs.1 as usize)
            .unwrap_or(&[])
    }

    /// Appends the batch payload: [`KIND_BATCH_AT`] when it says when it was written.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self.at {
            Some(at) => {
                out.push(KIND_BATCH_AT);
                put_varint(out, at as u64);
            }
            None => out.push(KIND_BATCH),
        }
        put_varint(out, self.strings.len() as u64);
        for s in &self.strings {
            put_bytes(out, s.as_bytes());
        }
        put_varint(out, self.creates.len() as u64);
        for (ns, schema) in &self.creates {
            put_varint(out, u64::from(*ns));
            put_schema(out, schema);
        }
        put_varint(out, self.incs.len() as u64);
        for inc in &self.incs {
            put_varint(out, u64::from(inc.ns));
            put_varint(out, u64::from(inc.key));
            put_varint(out, inc.ts as u64);
            put_varint(out, zigzag(inc.n));
            let subs = self.subs_of(inc);
            put_varint(out, subs.len() as u64);
            for (d, v) in subs {
                put_varint(out, u64::from(*d));
                put_varint(out, u64::from(*v));
            }
        }
        match &self.idempotency {
            None => out.push(0),
            Some(r) => {
                out.push(1);
                put_bytes(out, r.key.as_bytes());
                put_bytes(out, r.fingerprint.as_bytes());
                put_varint(out, r.expires as u64);
                put_varint(out, u64::from(r.status));
                put_bytes(out, r.body.as_bytes());
            }
        }
    }
}

/// A decoded record payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload<'a> {
    Batch(BatchView<'a>),
    Schema(Namespace, Schema),
}

/// Appends a schema-change payload.
pub fn encode_schema(ns: &Namespace, schema: &Schema, out: &mut Vec<u8>) {
    out.push(if schema.coverage().is_empty() {
        KIND_SCHEMA
    } else {
        KIND_SCHEMA_COVERED
    });
    put_bytes(out, ns.as_str().as_bytes());
    put_schema(out, schema);
}

/// Decodes one payload; never panics, whatever the bytes.
pub fn decode(bytes: &[u8]) -> Result<Payload<'_>, PayloadError> {
    let mut r = Reader { bytes, pos: 0 };
    let payload = match r.u8()? {
        kind @ (KIND_BATCH | KIND_BATCH_AT) => {
            let mut view = BatchView::default();
            if kind == KIND_BATCH_AT {
                view.at = Some(r.varint()? as i64);
            }
            view.strings = r.string_table()?;
            let nstr = view.strings.len() as u64;
            let idx = |v: u64| {
                if v < nstr {
                    Ok(v as u32)
                } else {
                    Err(PayloadError::BadIndex(v))
                }
            };
            for _ in 0..r.len()? {
                let ns = idx(r.varint()?)?;
                let schema = r.schema()?;
                view.creates.push((ns, schema));
            }
            let n = r.len()?;
            view.incs.reserve(n);
            for _ in 0..n {
                let ns = idx(r.varint()?)?;
                let key = idx(r.varint()?)?;
                let ts = r.varint()? as i64;
                let n = unzigzag(r.varint()?);
                let start = view.subs.len() as u32;
                for _ in 0..r.len()? {
                    let d = idx(r.varint()?)?;
                    let v = idx(r.varint()?)?;
                    view.subs.push((d, v));
                }
                let subs = (start, view.subs.len() as u32);
                view.incs.push(IncView {
                    ns,
                    key,
                    ts,
                    n,
                    subs,
                });
            }
            view.idempotency = match r.u8()? {
                0 => None,
                _ => Some(IdemRecord {
                    key: r.str()?.to_owned(),
                    fingerprint: r.str()?.to_owned(),
                    expires: r.varint()? as i64,
                    status: u16::try_from(r.varint()?).map_err(|_| PayloadError::BadVarint)?,
                    body: r.str()?.to_owned(),
                }),
            };
            Payload::Batch(view)
        }
        KIND_SCHEMA | KIND_SCHEMA_COVERED => {
            let name = r.str()?;
            let ns = Namespace::new(name).map_err(|e| PayloadError::Schema(e.to_string()))?;
            Payload::Schema(ns, r.schema()?)
        }
        other => return Err(PayloadError::UnknownKind(other)),
    };
    match bytes.len() - r.pos {
        0 => Ok(payload),
        n => Err(PayloadError::Trailing(n)),
    }
}

pub(crate) fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) fn put_strings(out: &mut Vec<u8>, list: &[String]) {
    put_varint(out, list.len() as u64);
    for s in list {
        put_bytes(out, s.as_bytes());
    }
}

/// Schema flag: an allow-list of dimensions follows.
const SCHEMA_DIMENSIONS: u8 = 1;
/// Schema flag: a coverage follows (docs/format.md, "Schemas").
const SCHEMA_COVERAGE: u8 = 2;

/// A schema as its canonical wire strings (re-validated when read back), then its
/// coverage when it has one. One without is written as builds before coverage wrote it.
pub(crate) fn put_schema(out: &mut Vec<u8>, schema: &Schema) {
    let doc = schema.to_doc();
    put_strings(out, &doc.tiers);
    put_strings(out, &doc.breakdown_tiers.unwrap_or_default());
    let c = schema.coverage();
    let mut flags = 0;
    if doc.dimensions.is_some() {
        flags |= SCHEMA_DIMENSIONS;
    }
    if !c.is_empty() {
        flags |= SCHEMA_COVERAGE;
    }
    out.push(flags);
    if let Some(d) = &doc.dimensions {
        put_strings(out, d);
    }
    if c.is_empty() {
        return;
    }
    for marks in [&c.totals, &c.subtotals] {
        put_varint(out, marks.len() as u64);
        for (r, since) in marks {
            put_varint(out, r.secs());
            put_varint(out, zigzag(*since));
        }
    }
    put_varint(out, c.dims.len() as u64);
    for (d, since) in &c.dims {
        put_bytes(out, d.as_bytes());
        put_varint(out, zigzag(*since));
    }
    match c.others {
        None => out.push(0),
        Some(since) => {
            out.push(1);
            put_varint(out, zigzag(since));
        }
    }
}

/// A bounded reader over encoded bytes (log payloads, the manifest): every length is
/// checked against the bytes left, and nothing it reads can panic.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn u8(&mut self) -> Result<u8, PayloadError> {
        let b = *self.bytes.get(self.pos).ok_or(PayloadError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, PayloadError> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(PayloadError::BadVarint);
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(PayloadError::BadVarint)
    }

    /// A count, bounded by the bytes left so a corrupt count cannot reserve huge memory.
    pub(crate) fn len(&mut self) -> Result<usize, PayloadError> {
        let n = self.varint()?;
        if n > (self.bytes.len() - self.pos) as u64 {
            return Err(PayloadError::Truncated);
        }
        Ok(n as usize)
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, PayloadError> {
        let n = self.len()?;
        let b = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        std::str::from_utf8(b).map_err(|_| PayloadError::NotUtf8)
    }

    /// A count, then that many strings, as a batch's string table holds them. The table's
    /// bytes are checked as UTF-8 once, where its lengths allow (each is one byte, below
    /// 128, so the table is valid UTF-8 where its strings are), and each string is then a
    /// slice of it; a table with a longer string checks each string on its own. (A check
    /// per string: ~5% of replay's resolving thread, and `decode` with what it calls took
    /// ~40% fewer samples without it.)
    pub(crate) fn string_table(&mut self) -> Result<Vec<&'a str>, PayloadError> {
        let n = self.len()?;
        let start = self.pos;
        let mut short = true;
        for _ in 0..n {
            let len = self.len()?;
            short &= len < 0x80;
            self.pos += len;
        }
        let mut strings = Vec::with_capacity(n);
        if short && let Ok(table) = std::str::from_utf8(&self.bytes[start..self.pos]) {
            // Every length is one byte, and its string follows it.
            let mut at = 0;
            for _ in 0..n {
                let len = table.as_bytes().get(at).map_or(0, |&b| usize::from(b));
                let s = table.get(at + 1..at + 1 + len);
                strings.push(s.ok_or(PayloadError::NotUtf8)?);
                at += 1 + len;
            }
            return Ok(strings);
        }
        // A length of more bytes (a string of 128 or more), or bytes that are not UTF-8.
        self.pos = start;
        for _ in 0..n {
            strings.push(self.str()?);
        }
        Ok(strings)
    }

    pub(crate) fn strings(&mut self) -> Result<Vec<String>, PayloadError> {
        (0..self.len()?)
            .map(|_| self.str().map(str::to_owned))
            .collect()
    }

    pub(crate) fn schema(&mut self) -> Result<Schema, PayloadError> {
        let tiers = self.strings()?;
        let breakdown_tiers = Some(self.strings()?);
        let flags = self.u8()?;
        if flags & !(SCHEMA_DIMENSIONS | SCHEMA_COVERAGE) != 0 {
            return Err(PayloadError::Schema(format!(
                "unknown schema flags {flags:#04x}"
            )));
        }
        let dimensions = match flags & SCHEMA_DIMENSIONS {
            0 => None,
            _ => Some(self.strings()?),
        };
        let schema = Schema::from_doc(&SchemaDoc {
            tiers,
            breakdown_tiers,
            dimensions,
        })
        .map_err(|e| PayloadError::Schema(e.to_string()))?;
        if flags & SCHEMA_COVERAGE == 0 {
            return Ok(schema);
        }
        let mut c = Coverage::default();
        for marks in [&mut c.totals, &mut c.subtotals] {
            for _ in 0..self.len()? {
                let r = Duration::from_secs(self.varint()?)
                    .ok_or_else(|| PayloadError::Schema("a coverage of a 0s tier".into()))?;
                marks.insert(r, unzigzag(self.varint()?));
            }
        }
        for _ in 0..self.len()? {
            let d = self.str()?.to_owned();
            c.dims.insert(d, unzigzag(self.varint()?));
        }
        c.others = match self.u8()? {
            0 => None,
            _ => Some(unzigzag(self.varint()?)),
        };
        Ok(schema.with_coverage(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tally_core::model::{Key, Subtotal};
    use tally_core::store::Increment;

    type Inc<'a> = (&'a str, &'a str, i64, i64, &'a [(&'a str, &'a str)]);

    fn batch(incs: &[Inc]) -> Batch {
        Batch {
            create: vec![(Namespace::new("clicks").unwrap(), Schema::default())],
            increments: incs
                .iter()
                .map(|(ns, key, ts, n, subs)| Increment {
                    ns: Namespace::new(ns).unwrap(),
                    key: Key::new(key).unwrap(),
                    ts: *ts,
                    n: *n,
                    subtotals: subs
                        .iter()
                        .map(|(d, v)| Subtotal {
                            dim: d.to_string(),
                            value: v.to_string(),
                        })
                        .collect(),
                })
                .collect(),
            idempotency: None,
        }
    }

    /// Namespaces and dimensions are compared with the increment before's first: where
    /// they change from one increment to the next, each still names its own string.
    #[test]
    fn each_increment_names_its_own_namespace_and_dimensions() {
        let b = batch(&[
            ("clicks", "a", 1, 1, &[("country", "US"), ("referrer", "x")]),
            ("other", "a", 2, 1, &[("referrer", "x")]),
            ("clicks", "b", 3, 1, &[("browser", "x"), ("country", "US")]),
            (
                "other",
                "b",
                4,
                1,
                &[("a", "b"), ("c", "d"), ("e", "f"), ("g", "h"), ("i", "j")],
            ),
            (
                "other",
                "c",
                5,
                1,
                &[("a", "b"), ("c", "d"), ("e", "f"), ("g", "h"), ("k", "j")],
            ),
        ]);
        let view = BatchView::from_batch(&b);
        for (inc, want) in view.incs.iter().zip(&b.increments) {
            assert_eq!(view.str(inc.ns), want.ns.as_str());
            assert_eq!(view.str(inc.key), want.key.as_str());
            let subs: Vec<(&str, &str)> = view
                .subs_of(inc)
                .iter()
                .map(|&(d, v)| (view.str(d), view.str(v)))
                .collect();
            let want: Vec<(&str, &str)> = want
                .subtotals
                .iter()
                .map(|s| (s.dim.as_str(), s.value.as_str()))
                .collect();
            assert_eq!(subs, want);
        }
        // Each string once in the table.
        let mut unique = view.strings.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), view.strings.len());
    }

    #[test]
    fn batch_round_trips_with_shared_strings() {
        let mut b = batch(&[
            ("clicks", "a", 100, 1, &[("country", "US")]),
            (
                "clicks",
                "a",
                4_000_000_000,
                -7,
                &[("country", "US"), ("referrer", "x")],
            ),
            ("other", "US", 0, 0, &[]),
        ]);
        b.idempotency = Some(IdemRecord {
            key: "retry-1".into(),
            fingerprint: "abc".into(),
            expires: 1_800_000_000,
            status: 200,
            body: "{\"accepted\":3}".into(),
        });
        let view = BatchView::from_batch(&b);
        assert_eq!(
            view.strings,
            vec!["clicks", "a", "country", "US", "referrer", "x", "other"]
        );
        let mut bytes = Vec::new();
        view.encode(&mut bytes);
        assert_eq!(bytes[0], KIND_BATCH, "no time: format 1's kind");
        assert_eq!(decode(&bytes).unwrap(), Payload::Batch(view.clone()));
        // With the time it was written: kind 3, the time, then the same bytes.
        let mut timed = view.clone();
        timed.at = Some(1_795_132_800);
        let mut with_at = Vec::new();
        timed.encode(&mut with_at);
        assert_eq!(with_at[0], KIND_BATCH_AT);
        let mut at = Vec::new();
        put_varint(&mut at, 1_795_132_800);
        assert_eq!(&with_at[1..1 + at.len()], &at[..]);
        assert_eq!(&with_at[1 + at.len()..], &bytes[1..]);
        assert_eq!(decode(&with_at).unwrap(), Payload::Batch(timed));
        assert_eq!(decode(&with_at[..3]), Err(PayloadError::Truncated));
    }

    #[test]
    fn schema_round_trips() {
        let ns = Namespace::new("api").unwrap();
        let schema = Schema::from_doc(&SchemaDoc {
            tiers: vec!["1s:2h".into(), "1h:forever".into()],
            breakdown_tiers: Some(vec!["1s".into()]),
            dimensions: Some(vec!["a".into(), "a+b".into()]),
        })
        .unwrap();
        let mut bytes = Vec::new();
        encode_schema(&ns, &schema, &mut bytes);
        assert_eq!(bytes[0], KIND_SCHEMA, "no coverage: written as before");
        assert_eq!(
            decode(&bytes).unwrap(),
            Payload::Schema(ns.clone(), schema.clone())
        );
        // With the coverage a change leaves (every part of it), as kind 4.
        let before = Schema::from_doc(&SchemaDoc {
            tiers: vec!["1s:1h".into(), "1m:2h".into()],
            breakdown_tiers: Some(vec![]),
            dimensions: Some(vec!["a".into(), "b+c".into()]),
        })
        .unwrap();
        let changed = schema.replacing(Some(&before), 1_790_000_000, 3600);
        let c = changed.coverage();
        assert!(!c.totals.is_empty() && !c.subtotals.is_empty() && !c.dims.is_empty());
        let mut covered = Vec::new();
        encode_schema(&ns, &changed, &mut covered);
        assert_eq!(covered[0], KIND_SCHEMA_COVERED);
        assert_eq!(
            decode(&covered).unwrap(),
            Payload::Schema(ns.clone(), changed.clone())
        );
        let open = Schema::from_doc(&SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: None,
        })
        .unwrap()
        .replacing(Some(&before), 1_790_000_000, 0);
        assert!(open.coverage().others.is_some());
        let mut bytes = Vec::new();
        encode_schema(&ns, &open, &mut bytes);
        assert_eq!(decode(&bytes).unwrap(), Payload::Schema(ns.clone(), open));
        for cut in 1..covered.len() {
            assert!(decode(&covered[..cut]).is_err(), "cut at {cut}");
        }
        // Flags this build does not know are refused, not guessed.
        let flags_at = covered.len() - bytes_after_flags(&changed) - 1;
        let mut unknown = covered.clone();
        unknown[flags_at] |= 4;
        assert!(matches!(decode(&unknown), Err(PayloadError::Schema(_))));
    }

    /// How many bytes follow a schema's flag byte when it is encoded.
    fn bytes_after_flags(schema: &Schema) -> usize {
        let doc = schema.to_doc();
        let mut head = Vec::new();
        put_strings(&mut head, &doc.tiers);
        put_strings(&mut head, &doc.breakdown_tiers.unwrap_or_default());
        let mut all = Vec::new();
        put_schema(&mut all, schema);
        all.len() - head.len() - 1
    }

    #[test]
    fn refuses_bad_payloads() {
        assert_eq!(decode(&[]), Err(PayloadError::Truncated));
        assert_eq!(decode(&[9]), Err(PayloadError::UnknownKind(9)));
        // One string, then an increment naming string 5.
        let bad = [KIND_BATCH, 1, 1, b'a', 0, 1, 5, 0, 0, 0, 0, 0];
        assert_eq!(decode(&bad), Err(PayloadError::BadIndex(5)));
        let trailing = [KIND_BATCH, 0, 0, 0, 0, 0xff];
        assert_eq!(decode(&trailing), Err(PayloadError::Trailing(1)));
        let huge_count = [KIND_BATCH, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert_eq!(decode(&huge_count), Err(PayloadError::Truncated));
    }

    proptest! {
        #[test]
        fn zigzag_round_trips(n in any::<i64>()) {
            prop_assert_eq!(unzigzag(zigzag(n)), n);
        }

        /// The string table read whole answers as reading each string on its own: the
        /// same strings and the same bytes read, or an error from both. Tables of short and long
        /// strings, text and not, with their counts and lengths damaged.
        #[test]
        fn a_string_table_reads_as_each_string_on_its_own(
            strings in prop::collection::vec(
                prop_oneof![
                    "[a-zé€😀]{0,6}".prop_map(String::into_bytes),
                    "[a-z]{120,140}".prop_map(String::into_bytes),
                    prop::collection::vec(any::<u8>(), 0..6),
                ],
                0..8,
            ),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            let mut bytes = Vec::new();
            put_varint(&mut bytes, strings.len() as u64);
            for s in &strings {
                put_bytes(&mut bytes, s);
            }
            for (at, v) in &edits {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] = *v;
                }
            }
            let mut whole = Reader::new(&bytes);
            let mut each = Reader::new(&bytes);
            let expected: Result<Vec<&str>, PayloadError> =
                each.len().and_then(|n| (0..n).map(|_| each.str()).collect());
            // (Where both fail, the reasons may differ: the table is walked whole first,
            // so a short table is seen before a string that is not UTF-8.)
            match (whole.string_table(), expected) {
                (Ok(got), Ok(expected)) => {
                    prop_assert_eq!(got, expected);
                    prop_assert_eq!(whole.left(), each.left());
                }
                (got, expected) => prop_assert!(got.is_err() && expected.is_err(),
                    "whole {:?}, each {:?}", got, expected),
            }
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }

        /// Valid payloads with bytes overwritten, cut short or extended: decoding answers
        /// Ok or Err, never panics, and what it accepts re-encodes to a decodable payload.
        #[test]
        fn damaged_payloads_never_panic(
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
            extend in prop::collection::vec(any::<u8>(), 0..4),
        ) {
            let b = batch(&[
                ("clicks", "a", 100, 1, &[("country", "US")]),
                ("clicks", "b", 4_000_000, -7, &[("country", "US"), ("referrer", "x")]),
            ]);
            let mut bytes = Vec::new();
            BatchView::from_batch(&b).encode(&mut bytes);
            for (at, v) in &edits {
                let i = at.index(bytes.len());
                bytes[i] = *v;
            }
            let len = cut.index(bytes.len() + 1);
            bytes.truncate(len);
            bytes.extend_from_slice(&extend);
            if let Ok(Payload::Batch(view)) = decode(&bytes) {
                let mut again = Vec::new();
                view.encode(&mut again);
                prop_assert!(decode(&again).is_ok());
            }
        }
    }
}

//! Remembered idempotency answers (SPEC §3, kept 24 h), in memory. There can be a million
//! of them (`[limits] max_idempotency_keys`), so each is one allocation holding its key,
//! fingerprint, expiry, status and body, found by key in a set of those allocations: ~170
//! bytes an answer where a map of [`IdemRecord`]s (the key twice, three strings) took ~400
//! (`tally-bench idempotency`).
//!
//! Bytes of one answer: expiry (8, little-endian `i64`), status (2), key length (4),
//! fingerprint length (4), then the key, the fingerprint and the body. In memory only; the
//! log and the manifest keep their own encodings (docs/format.md).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use foldhash::fast::FixedState;
use tally_core::store::IdemRecord;

const EXPIRES: usize = 0;
const STATUS: usize = 8;
const KEY_LEN: usize = 10;
const FP_LEN: usize = 14;
const HEAD: usize = 18;

/// One answer's bytes (see the module doc).
#[derive(Clone)]
struct Packed(Box<[u8]>);

impl Packed {
    fn new(r: &IdemRecord) -> Self {
        let mut b = Vec::with_capacity(HEAD + r.key.len() + r.fingerprint.len() + r.body.len());
        b.extend_from_slice(&r.expires.to_le_bytes());
        b.extend_from_slice(&r.status.to_le_bytes());
        // Keys and fingerprints are bounded far below 4 GiB (the server takes keys of at most
        // 256 bytes; a log record is at most a few MiB).
        b.extend_from_slice(&(r.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&(r.fingerprint.len() as u32).to_le_bytes());
        b.extend_from_slice(r.key.as_bytes());
        b.extend_from_slice(r.fingerprint.as_bytes());
        b.extend_from_slice(r.body.as_bytes());
        Packed(b.into_boxed_slice())
    }

    fn u32_at(&self, at: usize) -> usize {
        let mut w = [0u8; 4];
        w.copy_from_slice(&self.0[at..at + 4]);
        u32::from_le_bytes(w) as usize
    }

    fn expires(&self) -> i64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[EXPIRES..EXPIRES + 8]);
        i64::from_le_bytes(w)
    }

    fn key(&self) -> &[u8] {
        &self.0[HEAD..HEAD + self.u32_at(KEY_LEN)]
    }

    fn record(&self) -> IdemRecord {
        let (k, f) = (self.u32_at(KEY_LEN), self.u32_at(FP_LEN));
        // Every part was copied whole from a `String`, so each is UTF-8.
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        IdemRecord {
            key: text(&self.0[HEAD..HEAD + k]),
            fingerprint: text(&self.0[HEAD + k..HEAD + k + f]),
            expires: self.expires(),
            status: u16::from_le_bytes([self.0[STATUS], self.0[STATUS + 1]]),
            body: text(&self.0[HEAD + k + f..]),
        }
    }
}

/// Equal, hashed and borrowed as the key alone: the set is a map by key.
impl Hash for Packed {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Packed {}

impl Borrow<[u8]> for Packed {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

/// The remembered answers, by key.
#[derive(Default)]
pub(crate) struct Answers(HashSet<Packed, FixedState>);

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Answers({} remembered)", self.0.len())
    }
}

/// Answers copied out under the lock, to be made records after it is released (a publish
/// takes a million of them: one copy of bytes each, not three strings).
pub(crate) struct Copied(Vec<Packed>);

impl Copied {
    pub(crate) fn records(self) -> Vec<IdemRecord> {
        self.0.iter().map(Packed::record).collect()
    }
}

impl Answers {
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.0.contains(key.as_bytes())
    }

    /// The answer under `key`, expired or not.
    pub(crate) fn get(&self, key: &str) -> Option<IdemRecord> {
        self.0.get(key.as_bytes()).map(Packed::record)
    }

    /// Remembers `r` under its key; returns the answer it replaced.
    pub(crate) fn insert(&mut self, r: &IdemRecord) -> Option<IdemRecord> {
        self.0.replace(Packed::new(r)).map(|p| p.record())
    }

    pub(crate) fn remove(&mut self, key: &str) {
        self.0.remove(key.as_bytes());
    }

    /// Forgets every answer expired at `now`.
    pub(crate) fn sweep(&mut self, now: i64) {
        self.0.retain(|p| p.expires() > now);
        // A day's peak need not stay allocated once its answers expired.
        if self.0.len() < self.0.capacity() / 4 {
            self.0.shrink_to_fit();
        }
    }

    /// The answers not expired at `now`, in no particular order.
    pub(crate) fn unexpired(&self, now: i64) -> Copied {
        Copied(
            self.0
                .iter()
                .filter(|p| p.expires() > now)
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &str, expires: i64, body: &str) -> IdemRecord {
        IdemRecord {
            key: key.into(),
            fingerprint: format!("fp-{key}"),
            expires,
            status: 429,
            body: body.into(),
        }
    }

    #[test]
    fn an_answer_comes_back_as_it_went_in() {
        let mut a = Answers::default();
        let r = rec("tabc:é-key", -5, r#"{"error":{"code":"limit_exceeded"}}"#);
        assert_eq!(a.insert(&r), None);
        assert_eq!(a.get("tabc:é-key"), Some(r.clone()));
        assert!(a.contains("tabc:é-key"));
        assert!(!a.contains("tabc:é-ke"));
        let empty = IdemRecord {
            key: String::new(),
            fingerprint: String::new(),
            expires: i64::MAX,
            status: 200,
            body: String::new(),
        };
        a.insert(&empty);
        assert_eq!(a.get(""), Some(empty));
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn insert_replaces_and_returns_the_old_answer() {
        let mut a = Answers::default();
        let (old, new) = (rec("k", 10, "old"), rec("k", 20, "new"));
        a.insert(&old);
        assert_eq!(a.insert(&new), Some(old));
        assert_eq!(a.get("k"), Some(new));
        assert_eq!(a.len(), 1);
        a.remove("k");
        assert_eq!(a.get("k"), None);
    }

    #[test]
    fn sweep_and_unexpired_keep_answers_that_expire_after_now() {
        let mut a = Answers::default();
        for (k, e) in [("a", 99), ("b", 100), ("c", 101)] {
            a.insert(&rec(k, e, "{}"));
        }
        let mut kept: Vec<String> = a
            .unexpired(100)
            .records()
            .into_iter()
            .map(|r| r.key)
            .collect();
        kept.sort();
        assert_eq!(kept, ["c"]);
        assert_eq!(a.len(), 3, "copying out forgets nothing");
        a.sweep(99);
        assert_eq!(a.len(), 2);
        assert!(a.contains("b") && a.contains("c"));
    }
}

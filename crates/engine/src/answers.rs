//! Remembered idempotency answers (SPEC §3, kept 24 h), in memory. There can be a million
//! of them (`[limits] max_idempotency_keys`), so each is one allocation holding its key,
//! fingerprint, expiry, status and body, found by key in a set of those allocations: ~170
//! bytes an answer where a map of [`IdemRecord`]s (the key twice, three strings) took ~400
//! (`tally-bench idempotency`).
//!
//! Bytes of one answer: expiry (8, little-endian `i64`), status (2), key length (4),
//! fingerprint length (4), generation (8, little-endian `u64`: see [`Answers::unwritten`]),
//! then the key, the fingerprint and the body. In memory only; the log and the answers files
//! keep their own encodings (docs/format.md).

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use tally_core::store::IdemRecord;

const EXPIRES: usize = 0;
const STATUS: usize = 8;
const KEY_LEN: usize = 10;
const FP_LEN: usize = 14;
const GEN: usize = 18;
const HEAD: usize = 26;

/// One answer's bytes (see the module doc).
#[derive(Clone)]
struct Packed(Box<[u8]>);

impl Packed {
    fn new(r: &IdemRecord, generation: u64) -> Self {
        let mut b = Vec::with_capacity(HEAD + r.key.len() + r.fingerprint.len() + r.body.len());
        b.extend_from_slice(&r.expires.to_le_bytes());
        b.extend_from_slice(&r.status.to_le_bytes());
        // Keys and fingerprints are bounded far below 4 GiB (the server takes keys of at most
        // 256 bytes; a log record is at most a few MiB).
        b.extend_from_slice(&(r.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&(r.fingerprint.len() as u32).to_le_bytes());
        b.extend_from_slice(&generation.to_le_bytes());
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

    fn generation(&self) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[GEN..GEN + 8]);
        u64::from_le_bytes(w)
    }

    /// Whether both hold the same answer (their generations aside).
    fn same_answer(&self, other: &Packed) -> bool {
        self.0[..GEN] == other.0[..GEN] && self.0[HEAD..] == other.0[HEAD..]
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

/// The remembered answers, by key, each tagged with the generation it was inserted in, so
/// that a publish writes only the answers no answers file holds yet.
pub(crate) struct Answers {
    set: HashSet<Packed, crate::seeded::State>,
    /// How many answers each scope holds ([`scope_of`]): one token's share of the set.
    scopes: HashMap<Box<[u8]>, usize>,
    /// The generation new answers are tagged with; each [`Answers::unwritten`] starts a new one.
    generation: u64,
    /// Answers of an older generation are in a published answers file (or were loaded
    /// from one).
    written_below: u64,
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            set: HashSet::default(),
            scopes: HashMap::new(),
            generation: 1,
            written_below: 1,
        }
    }
}

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Answers({} remembered)", self.set.len())
    }
}

/// Answers copied out under the lock, to be made records after it is released (a publish
/// can take a million of them: one copy of bytes each, not three strings).
pub(crate) struct Copied {
    answers: Vec<Packed>,
    /// The generation the copy closed (see [`Answers::written`]).
    pub(crate) generation: u64,
}

impl Copied {
    pub(crate) fn records(self) -> Vec<IdemRecord> {
        self.answers.iter().map(Packed::record).collect()
    }
}

/// The scope of a stored key: what comes before its first `:` (a server stores a token's
/// keys as `t<digest of the token>:<key>`), or nothing for a key without one.
pub(crate) fn scope_of(key: &[u8]) -> &[u8] {
    key.iter()
        .position(|&b| b == b':')
        .map_or(&[][..], |at| &key[..at])
}

impl Answers {
    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }

    /// How many answers keys of this scope hold.
    pub(crate) fn scope_len(&self, scope: &[u8]) -> usize {
        self.scopes.get(scope).copied().unwrap_or(0)
    }

    fn counted(&mut self, key: &[u8], added: bool) {
        let scope = scope_of(key);
        if added {
            *self.scopes.entry(scope.into()).or_default() += 1;
        } else if let Some(n) = self.scopes.get_mut(scope) {
            *n -= 1;
            if *n == 0 {
                self.scopes.remove(scope);
            }
        }
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.set.contains(key.as_bytes())
    }

    /// The answer under `key`, expired or not.
    pub(crate) fn get(&self, key: &str) -> Option<IdemRecord> {
        self.set.get(key.as_bytes()).map(Packed::record)
    }

    /// Remembers `r` under its key, for the next publish to write — unless the same answer
    /// is already remembered (replay meets, in the log's tail, answers an answers file
    /// already holds: they keep their generation, so a restart writes none of them again);
    /// returns the answer it replaced.
    pub(crate) fn insert(&mut self, r: &IdemRecord) -> Option<IdemRecord> {
        let mut p = Packed::new(r, self.generation);
        if let Some(old) = self.set.get(r.key.as_bytes())
            && old.same_answer(&p)
        {
            p.0[GEN..GEN + 8].copy_from_slice(&old.generation().to_le_bytes());
        }
        let replaced = self.set.replace(p).map(|p| p.record());
        if replaced.is_none() {
            self.counted(r.key.as_bytes(), true);
        }
        replaced
    }

    /// Remembers `r`, read from a published answers file: no publish writes it again.
    pub(crate) fn insert_written(&mut self, r: &IdemRecord) {
        if self
            .set
            .replace(Packed::new(r, self.written_below - 1))
            .is_none()
        {
            self.counted(r.key.as_bytes(), true);
        }
    }

    pub(crate) fn remove(&mut self, key: &str) {
        if self.set.remove(key.as_bytes()) {
            self.counted(key.as_bytes(), false);
        }
    }

    /// Forgets every answer expired at `now`.
    pub(crate) fn sweep(&mut self, now: i64) {
        let scopes = &mut self.scopes;
        self.set.retain(|p| {
            let kept = p.expires() > now;
            if !kept && let Some(n) = scopes.get_mut(scope_of(p.key())) {
                *n -= 1;
                if *n == 0 {
                    scopes.remove(scope_of(p.key()));
                }
            }
            kept
        });
        // A day's peak need not stay allocated once its answers expired.
        if self.set.len() < self.set.capacity() / 4 {
            self.set.shrink_to_fit();
        }
    }

    /// The answers not expired at `now` that no published answers file holds, in no
    /// particular order; closes the current generation, so answers inserted from now on
    /// are left for the next copy. Until [`Answers::written`] says the copy was published,
    /// every later copy includes these answers again.
    pub(crate) fn unwritten(&mut self, now: i64) -> Copied {
        let closed = self.generation;
        self.generation += 1;
        let from = self.written_below;
        Copied {
            answers: self
                .set
                .iter()
                .filter(|p| p.expires() > now && p.generation() >= from)
                .cloned()
                .collect(),
            generation: closed,
        }
    }

    /// The answers of `copy` (and every earlier one) are in a published answers file.
    pub(crate) fn written(&mut self, generation: u64) {
        self.written_below = self.written_below.max(generation + 1);
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

    /// Each scope's count follows its answers in and out, however they come and go.
    #[test]
    fn answers_are_counted_by_scope() {
        let mut a = Answers::default();
        a.insert(&rec("tA:1", 10, "x"));
        a.insert(&rec("tA:2", 20, "x"));
        a.insert(&rec("tA:2", 30, "y")); // replaced: still two
        a.insert_written(&rec("tB:1", 10, "x"));
        a.insert_written(&rec("tB:1", 10, "x"));
        a.insert(&rec("plain", 10, "x"));
        assert_eq!(
            (a.scope_len(b"tA"), a.scope_len(b"tB"), a.scope_len(b"")),
            (2, 1, 1)
        );
        a.remove("tA:1");
        a.remove("tA:1"); // gone already: no change
        assert_eq!(a.scope_len(b"tA"), 1);
        a.sweep(15);
        assert_eq!(
            (a.scope_len(b"tA"), a.scope_len(b"tB"), a.scope_len(b"")),
            (1, 0, 0)
        );
        assert_eq!(a.len(), 1);
        assert_eq!(scope_of(b"t1:k:x"), b"t1");
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
    fn sweep_and_unwritten_keep_answers_that_expire_after_now() {
        let mut a = Answers::default();
        for (k, e) in [("a", 99), ("b", 100), ("c", 101)] {
            a.insert(&rec(k, e, "{}"));
        }
        assert_eq!(keys(a.unwritten(100)), ["c"]);
        assert_eq!(a.len(), 3, "copying out forgets nothing");
        a.sweep(99);
        assert_eq!(a.len(), 2);
        assert!(a.contains("b") && a.contains("c"));
    }

    fn keys(c: Copied) -> Vec<String> {
        let mut k: Vec<String> = c.records().into_iter().map(|r| r.key).collect();
        k.sort();
        k
    }

    #[test]
    fn a_copy_holds_what_no_published_copy_held() {
        let mut a = Answers::default();
        a.insert(&rec("a", 500, "{}"));
        a.insert_written(&rec("loaded", 500, "{}"));
        let first = a.unwritten(0);
        a.insert(&rec("b", 500, "{}"));
        // The first copy was not published (a failed flush): the next one holds it again.
        assert_eq!(keys(a.unwritten(0)), ["a", "b"]);
        let second = a.unwritten(0);
        assert_eq!(keys(second), ["a", "b"]);
        a.written(first.generation);
        assert_eq!(keys(a.unwritten(0)), ["b"]);
        a.insert(&rec("c", 500, "{}"));
        // Replacing an answer makes it unwritten again.
        a.insert(&rec("a", 600, "{}"));
        let third = a.unwritten(0);
        a.written(third.generation);
        assert_eq!(keys(a.unwritten(0)), Vec::<String>::new());
        // An older generation published late moves nothing back.
        a.written(first.generation);
        assert_eq!(keys(a.unwritten(0)), Vec::<String>::new());
        assert_eq!(a.len(), 4);
        // The same answer again (replay of a record a file holds) stays written; another
        // answer under a written key does not.
        a.insert(&rec("loaded", 500, "{}"));
        a.insert(&rec("b", 500, "{}"));
        assert_eq!(keys(a.unwritten(0)), Vec::<String>::new());
        a.insert(&rec("b", 500, "other"));
        assert_eq!(keys(a.unwritten(0)), ["b"]);
    }
}

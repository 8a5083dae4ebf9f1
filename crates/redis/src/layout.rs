//! The key layout (docs/redis.md, byte by byte): key names, hash tags, time windows, bucket
//! fields, and the stored schema record with its tier generations. Pure functions, no I/O;
//! `docs/redis.md`'s examples are checked against them by this module's tests.

use std::collections::BTreeMap;

use tally_core::model::{Coverage, Duration, Namespace, Retention, Schema, SchemaDoc, Tier};
use tally_core::store::StoreError;

/// The layout this build reads and writes, stored in [`LAYOUT_KEY`].
pub const LAYOUT_VERSION: u32 = 7;
/// Older layouts this build opens, marks as [`LAYOUT_VERSION`] and then rewrites the schema
/// records of: every key of layouts 2 to 4 means the same in layout 5 but the key index,
/// whose keys move into pages at connect (`RedisStore::migrate_index`). Layout 3 added
/// coded subtotal fields; layout 4 gives codes in two steps (`pending`, then `codes`) and
/// writes records that builds of older layouts cannot decode (`fresh` for `next`), so that
/// one of them still running fails loudly instead of dropping what it does not know; layout
/// 5 keeps the key index in pages, and builds of layout 4 refuse its records. Layout 6
/// keeps each namespace's extent ([`extent_key`]) with every write and clips long reads to
/// it in namespaces it kept it for from the start ([`SchemaRecord::extents`]); builds of
/// layout 5, which write without it, refuse its records. Layout 7 records say since when
/// what a schema change added counts every event ([`SchemaRecord::whole_from`]); builds of
/// layout 6, which would answer from such a tier as if it held everything and drop it on
/// their next change, refuse its records.
pub const UPGRADES_FROM: &[u32] = &[2, 3, 4, 5, 6];
/// A string: the layout version, decimal.
pub const LAYOUT_KEY: &str = "tally:layout";
/// A hash: namespace → schema record (JSON, [`SchemaRecord`]).
pub const SCHEMAS_KEY: &str = "tally:schemas";
/// Buckets per time window: a window's hash holds at most this many totals, which keeps the
/// hash of a series without breakdowns under Redis' `hash-max-listpack-entries` (128), in
/// the compact encoding.
pub const WINDOW_BUCKETS: i64 = 120;

/// Escapes a name for use inside a `{…}` hash tag: `\` → `\\`, `}` → `\]`. Injective, and
/// the result holds no `}`, so the tag ends exactly where the layout says.
pub fn escape_tag(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '}' => out.push_str("\\]"),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape_tag`]; `None` for text it never gives.
pub fn unescape_tag(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '\\' => out.push('\\'),
                ']' => out.push('}'),
                _ => return None,
            },
            '}' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// A `SCAN MATCH` pattern for every window hash of one tier generation of a namespace.
pub fn windows_pattern(ns: &Namespace, gen_: u64, res: i64) -> String {
    let mut glob = String::new();
    for c in escape_tag(ns.as_str()).chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    format!("tally:w:{{{glob}|*}}:{gen_}:{res}:*")
}

/// The key and window of a window hash's name of namespace `ns`, tier generation `gen_`
/// and resolution `res` ([`window_key`]); `None` for any other name.
pub fn parse_window_key(name: &str, ns: &Namespace, gen_: u64, res: i64) -> Option<(String, i64)> {
    let rest = name
        .strip_prefix("tally:w:{")?
        .strip_prefix(escape_tag(ns.as_str()).as_str())?
        .strip_prefix('|')?;
    let (key, rest) = rest.split_once('}')?;
    let window = rest
        .strip_prefix(&format!(":{gen_}:{res}:"))?
        .parse()
        .ok()?;
    Some((unescape_tag(key)?, window))
}

/// Whether retention `new` keeps longer than `old`.
pub fn grown(old: Retention, new: Retention) -> bool {
    match (old, new) {
        (Retention::For(a), Retention::For(b)) => b.secs() > a.secs(),
        (Retention::For(_), Retention::Forever) => true,
        (Retention::Forever, _) => false,
    }
}

/// The hash tag of a series: `{ns|key}`, time-free, so every key of the series shares a slot.
pub fn series_tag(ns: &Namespace, key: &str) -> String {
    format!("{{{}|{}}}", ns.as_str(), escape_tag(key))
}

/// The hash of one series, tier generation, resolution and window, holding the window's
/// totals and the tier's subtotals: `tally:w:{ns|key}:<gen>:<res secs>:<window start>`.
/// One hash per tier and window (not one per dimension too) is what keeps an event's
/// increments to one Redis key per tier.
pub fn window_key(tag: &str, gen_: u64, res: i64, window: i64) -> String {
    format!("tally:w:{tag}:{gen_}:{res}:{window}")
}

/// The lock of a series' limited increments (`Store::apply_if`), in the series' own slot,
/// held by every tally server alike: `tally:lock:{ns|key}`, its value the holder's token,
/// with an expiry so a crashed holder cannot keep it.
pub fn lock_key(tag: &str) -> String {
    format!("tally:lock:{tag}")
}

/// A batch's marker in one slot: `tally:batch:{ns|key}:<batch id>`.
pub fn marker_key(tag: &str, batch: &str) -> String {
    format!("tally:batch:{tag}:{batch}")
}

/// The directory of a namespace's paged key index: a sorted set of the fences of its pages
/// but the first (every score 0, read by lex range).
pub fn key_dir_key(ns: &Namespace) -> String {
    format!("tally:kd:{{{}}}", ns.as_str())
}

/// The name of a key index page less its fence: the page of fence `f` is this followed by
/// `f`, the first page (fence empty) this alone. In the namespace's slot, as its directory.
pub fn key_page_prefix(ns: &Namespace) -> String {
    format!("tally:kp:{{{}}}:", ns.as_str())
}

/// The token of a namespace's key index (a string): with the node's `run_id`, the index's
/// epoch, which tally servers check before trusting what they remember having listed.
pub fn key_token_key(ns: &Namespace) -> String {
    format!("tally:ke:{{{}}}", ns.as_str())
}

/// The key index of layouts 2 to 4 (a sorted set of every key, every score 0), moved into
/// the paged index when a store connects.
pub fn old_keys_key(ns: &Namespace) -> String {
    format!("tally:keys:{{{}}}", ns.as_str())
}

/// A namespace's key expiries (a sorted set: key → the instant its last bucket expires). A
/// key some `forever` tier holds is not in it: it never expires.
pub fn expiry_key(ns: &Namespace) -> String {
    format!("tally:exp:{{{}}}", ns.as_str())
}

/// A namespace's extent: a hash, resolution (seconds) → `<lo>:<hi>`, the first and last
/// bucket start any write put data in at that resolution (never narrowed: retention hides
/// what it no longer keeps). In the namespace's slot, as its key index.
pub fn extent_key(ns: &Namespace) -> String {
    format!("tally:ext:{{{}}}", ns.as_str())
}

/// An idempotency record: `tally:idem:{<key>}`.
pub fn idem_key(key: &str) -> String {
    format!("tally:idem:{{{}}}", escape_tag(key))
}

/// The idempotency answers stored per hour (a hash: field the hour since the epoch, value
/// how many), of one scope (`[limits] max_idempotency_keys_per_token`: the part of the key
/// before its first `:`, a token's digest) or, with `None`, of all of them
/// (`max_idempotency_keys`): `tally:answers:{<scope>}`, `tally:answers:{*}`.
pub fn answers_key(scope: Option<&str>) -> String {
    match scope {
        Some(s) => format!("tally:answers:{{{}}}", escape_tag(s)),
        None => "tally:answers:{*}".to_owned(),
    }
}

/// That an idempotency key's answer is counted in [`answers_key`]'s hash (so a retry under
/// the key is not counted again), in the hash's slot: `tally:counted:{<scope or *>}:<key>`.
pub fn counted_key(answers: &str, key: &str) -> String {
    let tag = &answers["tally:answers:".len()..];
    format!("tally:counted:{tag}:{key}")
}

/// A cluster apply's claim of an idempotency key for its request (`APPLY`'s marker, set to
/// the request's fingerprint): `tally:claim:{<key>}`, in the record's slot.
pub fn claim_key(key: &str) -> String {
    format!("tally:claim:{{{}}}", escape_tag(key))
}

/// The window a bucket falls in: windows are `WINDOW_BUCKETS` buckets, epoch-aligned.
pub fn window_of(bucket: i64, res: i64) -> i64 {
    bucket.div_euclid(res * WINDOW_BUCKETS) * res * WINDOW_BUCKETS
}

/// A bucket's field in its window's hash: its index in the window, decimal (`0`…`119`).
pub fn offset_of(bucket: i64, window: i64, res: i64) -> i64 {
    (bucket - window) / res
}

/// A subtotal's field in its window's hash: `<offset>:<sgen>:<dim>:<value>`, where `sgen`
/// is the tier's subtotal generation. Offsets, generations and dimension names never hold
/// `:`; a value may, so a field splits at its first three.
pub fn subtotal_field(offset: i64, sgen: u64, dim: &str, value: &str) -> String {
    format!("{offset}{}", subtotal_suffix(sgen, dim, value))
}

/// What follows the offset in a subtotal's field, `:<sgen>:<dim>:<value>`: the scripts append
/// it to each offset of a range.
pub fn subtotal_suffix(sgen: u64, dim: &str, value: &str) -> String {
    format!(":{sgen}:{dim}:{value}")
}

/// A subtotal's field when its tier gives the dimension a code: `<offset>.<code>:<value>`.
/// The code stands for the dimension and the tier's subtotal generation together (see
/// [`SchemaRecord::codes`]), so the field is 8–10 bytes shorter than [`subtotal_field`]'s.
pub fn coded_field(offset: i64, code: u64, value: &str) -> String {
    format!("{offset}{}", coded_suffix(code, value))
}

/// What follows the offset in a coded subtotal's field: `.<code>:<value>`.
pub fn coded_suffix(code: u64, value: &str) -> String {
    format!(".{code}:{value}")
}

/// What a field of a window's hash holds, the inverse of `offset.to_string()`,
/// [`subtotal_field`] and [`coded_field`]: `None` for a field this layout never writes.
#[derive(Debug, PartialEq, Eq)]
pub enum Field<'a> {
    Total {
        offset: i64,
    },
    Subtotal {
        offset: i64,
        sgen: u64,
        dim: &'a str,
        value: &'a str,
    },
    Coded {
        offset: i64,
        code: u64,
        value: &'a str,
    },
}

impl<'a> Field<'a> {
    pub fn parse(field: &'a str) -> Option<Field<'a>> {
        let end = field
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(field.len());
        let offset = field[..end].parse().ok()?;
        let rest = &field[end..];
        if rest.is_empty() {
            return Some(Field::Total { offset });
        }
        if let Some(coded) = rest.strip_prefix('.') {
            let (code, value) = coded.split_once(':')?;
            return Some(Field::Coded {
                offset,
                code: code.parse().ok()?,
                value,
            });
        }
        let mut parts = rest.strip_prefix(':')?.splitn(3, ':');
        Some(Field::Subtotal {
            offset,
            sgen: parts.next()?.parse().ok()?,
            dim: parts.next()?,
            value: parts.next()?,
        })
    }
}

/// When a window's hash may go: the end of its last bucket plus the retention (`None` for
/// `forever`). By then [`Retention::keeps_bucket`] hides every bucket of it.
pub fn window_expiry(window: i64, res: i64, retention: Retention) -> Option<i64> {
    match retention {
        Retention::Forever => None,
        Retention::For(d) => Some(window + res * WINDOW_BUCKETS + d.secs_i64()),
    }
}

/// When a bucket stops being shown: `None` for `forever`.
pub fn bucket_expiry(bucket: i64, res: i64, retention: Retention) -> Option<i64> {
    match retention {
        Retention::Forever => None,
        Retention::For(d) => Some(bucket + res + d.secs_i64()),
    }
}

/// The first bucket start ≥ `from` (aligned to `res`) that a tier still keeps at `now`.
pub fn first_kept(from: i64, tier: &Tier, now: i64) -> i64 {
    let res = tier.resolution.secs_i64();
    let from = from.div_euclid(res) * res + if from.rem_euclid(res) == 0 { 0 } else { res };
    match tier.retention {
        Retention::Forever => from,
        Retention::For(d) => {
            // keeps_bucket(b) ⇔ b + res > now - d ⇔ b > now - d - res.
            let edge = now.saturating_sub(d.secs_i64()).saturating_sub(res);
            let first = (edge.div_euclid(res) + 1) * res;
            from.max(first)
        }
    }
}

/// From a node's `CLUSTER NODES` answer, how many replicas the cluster knows of that node
/// (lines whose master field is its id, whatever their link state); `None` if no line is
/// marked `myself`.
pub fn replicas_of_myself(nodes: &str) -> Option<i64> {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let me = lines.iter().find_map(|f| {
        let myself = f.get(2)?.split(',').any(|x| x == "myself");
        if myself { f.first().copied() } else { None }
    })?;
    Some(lines.iter().filter(|f| f.get(3) == Some(&me)).count() as i64)
}

/// A namespace's stored schema: the schema's wire form plus a generation per tier (and per
/// breakdown tier, for its subtotals), so that a removed and re-added tier, or a tier that
/// stops and restarts keeping breakdowns, starts empty: its data lives under a new generation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchemaRecord {
    pub schema: SchemaDoc,
    /// Resolution (seconds) → generation of its totals.
    pub generation: BTreeMap<u64, u64>,
    /// Resolution (seconds) → generation of its subtotals; breakdown tiers only.
    pub breakdown_generation: BTreeMap<u64, u64>,
    /// Resolution (seconds) → dimension → its code in that breakdown tier's subtotal fields
    /// ([`coded_field`]). A code is handed out like a generation (from `next`), so it is
    /// never reused: it names the dimension under the tier's current subtotal generation,
    /// and a tier whose subtotals start over starts with no codes. At most
    /// [`CODES_PER_TIER`] per tier, for names of at most [`CODED_NAME_BYTES`]; other
    /// dimensions keep the spelled-out field ([`subtotal_field`]), which is always valid.
    ///
    /// Writes use these codes only: a code is here once the record that gave it (in
    /// [`SchemaRecord::pending`]) was seen on every replica of the schemas hash's node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub codes: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Codes given but not yet known to be on the replicas: a failover could lose them, and
    /// the same number could then be given to another dimension. Writes do not use them
    /// (they write the spelled-out field); reads look for them as for [`SchemaRecord::codes`],
    /// since a failover that loses the later confirmation leaves a used code here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pending: BTreeMap<u64, BTreeMap<String, u64>>,
    /// The next generation (or code) to hand out. Stored as `fresh` since layout 4 (`next`
    /// before, still read), so that builds of older layouts cannot decode a record whose
    /// `pending` codes they would drop.
    #[serde(rename = "fresh", alias = "next")]
    pub next: u64,
    /// Resolutions (seconds) of tiers whose retention grew while they kept their data: the
    /// expiries of their window hashes, and the key index's, were set for the shorter one
    /// and must be extended. Each mark is a fresh number (from `next`), so that a sweep
    /// clears only the mark it did, not one a later change set. Cleared once done.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extend: BTreeMap<u64, u64>,
    /// Per tier marked in `extend` (layout 7): the retention (seconds) its expiries were set
    /// for. Until the mark clears, windows still expire under it, so the tier is whole only
    /// as far back as it keeps ([`SchemaRecord::hold_growth`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extend_from: BTreeMap<u64, u64>,
    /// The layout version that wrote the record (0 before layout 4). A build refuses a record
    /// of a newer layout than its own rather than rewrite it without what it does not know.
    #[serde(default)]
    pub layout: u32,
    /// Whether every write since the namespace was made kept its extent ([`extent_key`]):
    /// records made by layout 6 and later. Only then may a read clip its range to the
    /// extent (an older namespace has data the extent never saw).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub extents: bool,
    /// The schema's coverage ([`tally_core::model::Coverage`]): since when what a schema
    /// change added counts every event. Absent when empty (and in records before layout 7).
    #[serde(default, skip_serializing_if = "WholeFrom::is_empty")]
    pub whole_from: WholeFrom,
}

/// A [`tally_core::model::Coverage`] as JSON: resolutions in seconds, instants in unix
/// seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WholeFrom {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub totals: BTreeMap<u64, i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subtotals: BTreeMap<u64, i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dims: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others: Option<i64>,
}

impl WholeFrom {
    pub fn is_empty(&self) -> bool {
        *self == WholeFrom::default()
    }

    pub fn of(c: &Coverage) -> WholeFrom {
        let secs = |m: &BTreeMap<Duration, i64>| m.iter().map(|(r, s)| (r.secs(), *s)).collect();
        WholeFrom {
            totals: secs(&c.totals),
            subtotals: secs(&c.subtotals),
            dims: c.dims.clone(),
            others: c.others,
        }
    }

    /// The coverage; `None` if a resolution is 0.
    pub fn coverage(&self) -> Option<Coverage> {
        let res = |m: &BTreeMap<u64, i64>| {
            m.iter()
                .map(|(r, s)| Some((Duration::from_secs(*r)?, *s)))
                .collect::<Option<BTreeMap<_, _>>>()
        };
        Some(Coverage {
            totals: res(&self.totals)?,
            subtotals: res(&self.subtotals)?,
            dims: self.dims.clone(),
            others: self.others,
        })
    }
}

/// Dimension codes one breakdown tier holds at most: the schema record is read by every
/// operation, and names are unbounded when a schema allows any dimension.
pub const CODES_PER_TIER: usize = 32;
/// The longest dimension name (a compound's included) given a code.
pub const CODED_NAME_BYTES: usize = 64;

/// A decoded schema record: the validated schema and its generations.
#[derive(Debug, Clone)]
pub struct Stored {
    pub schema: Schema,
    pub record: SchemaRecord,
    /// Whether this is the record last read rather than the one stored now (the node holding
    /// the schemas is out of reach): it may lack codes given since.
    pub cached: bool,
}

impl Stored {
    /// The schema as queries see it at `now`: a tier whose retention grew and whose
    /// expiries are still to be extended holds only what the retention they were set for
    /// keeps (its windows go on expiring under it), so its coverage mark is at least `now`
    /// less that retention ([`SchemaRecord::extend_from`]).
    pub fn schema_at(&self, now: i64) -> Schema {
        let pending = self
            .record
            .extend_from
            .iter()
            .filter(|(r, _)| self.record.extend.contains_key(r));
        let mut coverage = self.schema.coverage().clone();
        let mut held = false;
        for (&r, &a) in pending {
            let Some(res) = Duration::from_secs(r) else {
                continue;
            };
            let from = now.saturating_sub(i64::try_from(a).unwrap_or(i64::MAX));
            let mark = coverage.totals.entry(res).or_insert(from);
            *mark = (*mark).max(from);
            held = true;
        }
        if held {
            self.schema.clone().with_coverage(coverage)
        } else {
            self.schema.clone()
        }
    }

    /// The generation of a tier's totals, `None` if the schema has no such tier.
    pub fn generation(&self, res: Duration) -> Option<u64> {
        self.record.generation.get(&res.secs()).copied()
    }

    /// The generation of a tier's subtotals, `None` unless it is a breakdown tier.
    pub fn breakdown_generation(&self, res: Duration) -> Option<u64> {
        if !self.schema.is_breakdown(res) {
            return None;
        }
        self.record.breakdown_generation.get(&res.secs()).copied()
    }

    /// The code of a dimension in a breakdown tier's subtotal fields, as reads look for it:
    /// confirmed or pending. A cached record's pending codes are not trusted: a failover
    /// since may have lost one and given its number to another dimension.
    pub fn code(&self, res: Duration, dim: &str) -> Option<u64> {
        let r = res.secs();
        let of = |m: &BTreeMap<u64, BTreeMap<String, u64>>| m.get(&r)?.get(dim).copied();
        of(&self.record.codes).or_else(|| of(self.readable_pending()))
    }

    fn readable_pending(&self) -> &BTreeMap<u64, BTreeMap<String, u64>> {
        static NONE: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
        if self.cached {
            &NONE
        } else {
            &self.record.pending
        }
    }

    /// The code writes use for a dimension: confirmed ones only.
    pub fn write_code(&self, res: Duration, dim: &str) -> Option<u64> {
        self.record.codes.get(&res.secs())?.get(dim).copied()
    }

    /// Whether a dimension's code in a breakdown tier is given but not confirmed yet.
    pub fn is_pending(&self, res: Duration, dim: &str) -> bool {
        self.record
            .pending
            .get(&res.secs())
            .is_some_and(|p| p.contains_key(dim))
    }

    /// A breakdown tier's codes as reads look for them (see [`Stored::code`]), code →
    /// dimension.
    pub fn dims_by_code(&self, res: Duration) -> BTreeMap<u64, String> {
        let r = res.secs();
        [&self.record.codes, self.readable_pending()]
            .into_iter()
            .filter_map(|m| m.get(&r))
            .flat_map(|c| c.iter().map(|(d, c)| (*c, d.clone())))
            .collect()
    }

    /// Whether a dimension without a code in a breakdown tier may still get one: then a read
    /// that found none must look again after reading (a writer may have given it one and
    /// written coded fields meanwhile).
    pub fn may_get_code(&self, res: Duration, dim: &str) -> bool {
        self.breakdown_generation(res).is_some()
            && self.code(res, dim).is_none()
            && (self.is_pending(res, dim)
                || (dim.len() <= CODED_NAME_BYTES
                    && self.record.codes_in(res.secs()) < CODES_PER_TIER))
    }

    pub fn tier(&self, res: Duration) -> Option<&Tier> {
        self.schema.tiers().iter().find(|t| t.resolution == res)
    }
}

impl SchemaRecord {
    /// A tier whose expiries are still to be extended holds, at `now`, only what the
    /// retention they were set for keeps: its mark in `whole_from` is at least `now` less
    /// that retention. Clearing a mark (`RedisStore::extend_expiries`) stores this, at the
    /// time the expiries were extended; until then reads apply it ([`Stored::schema_at`]).
    pub fn hold_growth(&mut self, r: u64, now: i64) {
        if let Some(&a) = self.extend_from.get(&r) {
            let from = now.saturating_sub(i64::try_from(a).unwrap_or(i64::MAX));
            let mark = self.whole_from.totals.entry(r).or_insert(from);
            *mark = (*mark).max(from);
        }
    }

    /// The record of `schema`, given the one stored before (if any): kept tiers keep their
    /// generations, new ones (and breakdowns newly kept) get fresh ones.
    pub fn next(previous: Option<&SchemaRecord>, schema: &Schema) -> SchemaRecord {
        let mut next = previous.map_or(1, |p| p.next);
        let mut generation = BTreeMap::new();
        let mut breakdown_generation = BTreeMap::new();
        let mut codes = BTreeMap::new();
        let mut pending = BTreeMap::new();
        let mut extend = BTreeMap::new();
        let mut extend_from = BTreeMap::new();
        let before = previous.and_then(|p| Schema::from_doc(&p.schema).ok());
        for tier in schema.tiers() {
            let r = tier.resolution.secs();
            let kept = previous.is_some_and(|p| p.generation.contains_key(&r));
            let old = before.as_ref().and_then(|b| {
                let t = b.tiers().iter().find(|t| t.resolution == tier.resolution)?;
                Some(t.retention)
            });
            let mut fresh = || {
                next += 1;
                next - 1
            };
            let unfinished = previous.and_then(|p| p.extend.get(&r).copied());
            // The retention the expiries were set for: the one before this growth, or
            // before the growth still unfinished.
            let set_for = previous
                .filter(|_| unfinished.is_some())
                .and_then(|p| p.extend_from.get(&r).copied());
            if let (true, Some(Retention::For(a))) = (kept, old)
                && grown(Retention::For(a), tier.retention)
            {
                extend.insert(r, fresh());
                extend_from.insert(r, set_for.unwrap_or(a.secs()));
            } else if let (true, Some(mark)) = (kept, unfinished) {
                extend.insert(r, mark);
                if let Some(a) = set_for {
                    extend_from.insert(r, a);
                }
            }
            let g = previous
                .and_then(|p| p.generation.get(&r).copied())
                .unwrap_or_else(&mut fresh);
            generation.insert(r, g);
            if schema.is_breakdown(tier.resolution) {
                // The previous record holds a breakdown generation only for tiers that kept
                // breakdowns then: anything else starts over.
                let kept = previous.and_then(|p| p.breakdown_generation.get(&r).copied());
                if let (Some(_), Some(p)) = (kept, previous) {
                    // The subtotals go on: so do their codes.
                    if let Some(c) = p.codes.get(&r) {
                        codes.insert(r, c.clone());
                    }
                    if let Some(c) = p.pending.get(&r) {
                        pending.insert(r, c.clone());
                    }
                }
                breakdown_generation.insert(r, kept.unwrap_or_else(&mut fresh));
            }
        }
        let mut record = SchemaRecord {
            schema: schema.to_doc(),
            generation,
            breakdown_generation,
            codes,
            pending,
            next,
            extend,
            extend_from,
            layout: LAYOUT_VERSION,
            extents: previous.is_none_or(|p| p.extents),
            whole_from: WholeFrom::of(schema.coverage()),
        };
        // Declared dimensions get their codes now (pending, like any: the first write
        // confirms them).
        if let Some(dims) = schema.dimensions() {
            let wanted: Vec<(u64, &str)> = record
                .breakdown_generation
                .keys()
                .flat_map(|r| dims.iter().map(move |d| (*r, d.name())))
                .collect();
            if let Some(with) = record.with_codes(&wanted) {
                record = with;
            }
        }
        record
    }

    /// Codes a breakdown tier holds, confirmed and pending.
    fn codes_in(&self, r: u64) -> usize {
        [&self.codes, &self.pending]
            .into_iter()
            .filter_map(|m| m.get(&r))
            .map(BTreeMap::len)
            .sum()
    }

    /// This record with pending codes for the `(resolution, dimension)` pairs that have none
    /// yet, as far as [`CODES_PER_TIER`] and [`CODED_NAME_BYTES`] allow and only in
    /// breakdown tiers; `None` if that gives no new code.
    pub fn with_codes(&self, wanted: &[(u64, &str)]) -> Option<SchemaRecord> {
        let mut out = self.clone();
        let mut changed = false;
        for &(r, dim) in wanted {
            if !out.breakdown_generation.contains_key(&r) || dim.len() > CODED_NAME_BYTES {
                continue;
            }
            let coded = [&out.codes, &out.pending]
                .into_iter()
                .any(|m| m.get(&r).is_some_and(|t| t.contains_key(dim)));
            if coded || out.codes_in(r) >= CODES_PER_TIER {
                continue;
            }
            out.pending
                .entry(r)
                .or_default()
                .insert(dim.to_owned(), out.next);
            out.next += 1;
            changed = true;
        }
        changed.then_some(out)
    }

    /// This record with the pending codes of the `(resolution, dimension)` pairs confirmed;
    /// `None` if none of them is pending.
    pub fn confirmed(&self, wanted: &[(u64, &str)]) -> Option<SchemaRecord> {
        let mut out = self.clone();
        let mut changed = false;
        for &(r, dim) in wanted {
            let Some(code) = out.pending.get_mut(&r).and_then(|p| p.remove(dim)) else {
                continue;
            };
            out.codes.entry(r).or_default().insert(dim.to_owned(), code);
            changed = true;
        }
        out.pending.retain(|_, c| !c.is_empty());
        changed.then_some(out)
    }

    /// Whether any of the `(resolution, dimension)` pairs has a pending code.
    pub fn has_pending(&self, wanted: &[(u64, &str)]) -> bool {
        wanted
            .iter()
            .any(|(r, d)| self.pending.get(r).is_some_and(|p| p.contains_key(*d)))
    }

    /// The stored text, marked as written by this layout.
    pub fn encode(&self) -> Result<String, StoreError> {
        let mut record = self.clone();
        record.layout = LAYOUT_VERSION;
        serde_json::to_string(&record)
            .map_err(|e| StoreError::internal("encoding a schema record").because(e))
    }

    /// The schema a record holds, with its coverage.
    pub fn decode_schema(ns: &str, record: &SchemaRecord) -> Result<Schema, StoreError> {
        let schema = Schema::from_doc(&record.schema).map_err(|e| {
            StoreError::corrupt(format!("the stored schema of namespace {ns} is invalid"))
                .because(e)
        })?;
        let coverage = record.whole_from.coverage().ok_or_else(|| {
            StoreError::corrupt(format!(
                "the schema record of namespace {ns} has a coverage of a 0s tier"
            ))
        })?;
        Ok(schema.with_coverage(coverage))
    }

    pub fn decode(ns: &str, text: &[u8]) -> Result<Stored, StoreError> {
        let mut record: SchemaRecord = serde_json::from_slice(text).map_err(|e| {
            StoreError::corrupt(format!(
                "the schema record of namespace {ns} does not decode"
            ))
            .because(e)
        })?;
        if record.layout > LAYOUT_VERSION {
            return Err(StoreError::corrupt(format!(
                "the schema record of namespace {ns} was written by tally key layout version \
                 {}; this build reads and writes version {LAYOUT_VERSION}",
                record.layout
            )));
        }
        if record.layout < 4 {
            // Layout 3 gave codes in one step, with no wait for the replicas: they are
            // pending until a write of layout 4 or later confirms them.
            for (r, codes) in std::mem::take(&mut record.codes) {
                record.pending.entry(r).or_default().extend(codes);
            }
        }
        let schema = Self::decode_schema(ns, &record)?;
        for t in schema.tiers() {
            if !record.generation.contains_key(&t.resolution.secs()) {
                return Err(StoreError::corrupt(format!(
                    "the schema record of namespace {ns} has no generation for tier {}",
                    t.resolution
                )));
            }
        }
        Ok(Stored {
            schema,
            record,
            cached: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(tiers: &[&str], breakdown: Option<&[&str]>) -> Schema {
        Schema::from_doc(&SchemaDoc {
            tiers: tiers.iter().map(|s| s.to_string()).collect(),
            breakdown_tiers: breakdown.map(|b| b.iter().map(|s| s.to_string()).collect()),
            dimensions: None,
        })
        .unwrap()
    }

    /// A schema's coverage is stored in its record (`whole_from`) and read back with it;
    /// a record without one (any before layout 7) reads as none.
    #[test]
    fn a_coverage_round_trips_through_the_record() {
        let before = schema(&["1m:2h"], Some(&[]));
        let after = schema(&["1m:2d", "1h:forever"], Some(&["1h"])).replacing(
            Some(&before),
            1_790_000_000,
            3600,
        );
        assert!(!after.coverage().is_empty());
        let record = SchemaRecord::next(None, &after);
        let text = record.encode().unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            doc["whole_from"],
            serde_json::json!({"totals": {"60": 1_790_000_000 - 7200, "3600": 1_790_003_601}, "subtotals": {"3600": 1_790_003_601}})
        );
        let stored = SchemaRecord::decode("clicks", text.as_bytes()).unwrap();
        assert_eq!(stored.schema, after);
        let plain = SchemaRecord::next(None, &before).encode().unwrap();
        assert!(!plain.contains("whole_from"), "{plain}");
        let stored = SchemaRecord::decode("clicks", plain.as_bytes()).unwrap();
        assert!(stored.schema.coverage().is_empty());
        // A retention that grows: until the expiries are extended, the tier is whole only as
        // far back as the retention they were set for keeps — also through a second growth
        // before the first is done.
        let short = SchemaRecord::next(None, &before);
        let mut grown = SchemaRecord::next(Some(&short), &schema(&["1m:2d"], Some(&[])));
        assert_eq!(grown.extend_from, BTreeMap::from([(60, 7200)]));
        grown.hold_growth(60, 1_790_000_000);
        assert_eq!(grown.whole_from.totals[&60], 1_790_000_000 - 7200);
        let again = SchemaRecord::next(Some(&grown), &schema(&["1m:7d"], Some(&[])));
        assert_eq!(again.extend_from, BTreeMap::from([(60, 7200)]));
        assert_ne!(again.extend, grown.extend, "marked afresh");
        // Read while the mark stands, the tier's mark moves with the clock.
        let pending = SchemaRecord::decode("clicks", again.encode().unwrap().as_bytes()).unwrap();
        let minute = Duration::from_secs(60).unwrap();
        for now in [1_790_000_000, 1_790_100_000] {
            assert_eq!(
                pending
                    .schema_at(now)
                    .whole_from(minute, tally_core::model::Reads::Totals),
                Some(now - 7200)
            );
        }
        let mut done = again.clone();
        done.hold_growth(60, 1_790_000_600);
        assert_eq!(done.whole_from.totals[&60], 1_790_000_600 - 7200);
        let kept = SchemaRecord::next(Some(&again), &schema(&["1m:7d"], Some(&[])));
        assert_eq!(
            (kept.extend, kept.extend_from),
            (again.extend, again.extend_from)
        );
        done.extend.clear();
        done.extend_from.clear();
        let finished = SchemaRecord::decode("clicks", done.encode().unwrap().as_bytes()).unwrap();
        assert_eq!(
            finished
                .schema_at(1_790_100_000)
                .whole_from(minute, tally_core::model::Reads::Totals),
            Some(1_790_000_600 - 7200),
            "once extended, the mark stays where the extension left it"
        );
        let zero = text.replace("\"3600\":1790003601}", "\"0\":1}");
        assert!(SchemaRecord::decode("clicks", zero.as_bytes()).is_err());
    }

    #[test]
    fn names_match_the_doc() {
        let ns = Namespace::new("clicks").unwrap();
        let tag = series_tag(&ns, "lnk_1");
        assert_eq!(tag, "{clicks|lnk_1}");
        assert_eq!(
            window_key(&tag, 2, 3600, window_of(1_790_665_200, 3600)),
            "tally:w:{clicks|lnk_1}:2:3600:1790640000"
        );
        assert_eq!(subtotal_field(7, 3, "country", "US"), "7:3:country:US");
        assert_eq!(coded_field(7, 5, "US"), "7.5:US");
        assert_eq!(series_tag(&ns, "a}b\\c"), "{clicks|a\\]b\\\\c}");
        assert_eq!(key_dir_key(&ns), "tally:kd:{clicks}");
        assert_eq!(key_page_prefix(&ns), "tally:kp:{clicks}:");
        assert_eq!(old_keys_key(&ns), "tally:keys:{clicks}");
        assert_eq!(key_token_key(&ns), "tally:ke:{clicks}");
        assert_eq!(expiry_key(&ns), "tally:exp:{clicks}");
        assert_eq!(idem_key("k}"), "tally:idem:{k\\]}");
        assert_eq!(marker_key(&tag, "ab"), "tally:batch:{clicks|lnk_1}:ab");
    }

    #[test]
    fn fields_parse_back() {
        assert_eq!(Field::parse("7"), Some(Field::Total { offset: 7 }));
        let f = subtotal_field(119, 12, "country+referrer", "US:a\\+b");
        assert_eq!(
            Field::parse(&f),
            Some(Field::Subtotal {
                offset: 119,
                sgen: 12,
                dim: "country+referrer",
                value: "US:a\\+b"
            })
        );
        assert_eq!(coded_field(7, 12, "US:a"), "7.12:US:a");
        assert_eq!(
            Field::parse("7.12:US:a"),
            Some(Field::Coded {
                offset: 7,
                code: 12,
                value: "US:a"
            })
        );
        for bad in [
            "", "x", "1:", "1:x:d:v", "1:2:d", "1.", "1.:v", "1.x:v", "1.2", "1x",
        ] {
            assert_eq!(Field::parse(bad), None, "{bad}");
        }
    }

    fn dims_schema(dims: Option<&[&str]>) -> Schema {
        Schema::from_doc(&SchemaDoc {
            tiers: vec!["1m:2h".into(), "1h:forever".into()],
            breakdown_tiers: Some(vec!["1h".into()]),
            dimensions: dims.map(|d| d.iter().map(|s| s.to_string()).collect()),
        })
        .unwrap()
    }

    #[test]
    fn codes_are_fresh_capped_and_follow_the_subtotal_generation() {
        let hour = Duration::new("1h").unwrap();
        // Declared dimensions get codes with the record, pending, in breakdown tiers only.
        let declared = SchemaRecord::next(None, &dims_schema(Some(&["country", "a+b"])));
        assert!(declared.codes.is_empty(), "nothing confirmed yet");
        let codes = &declared.pending[&3600];
        assert_eq!(codes.len(), 2);
        assert!(!declared.pending.contains_key(&60));
        assert!(codes.values().all(|c| *c < declared.next));
        let used: Vec<u64> = declared
            .generation
            .values()
            .chain(declared.breakdown_generation.values())
            .chain(codes.values())
            .copied()
            .collect();
        let mut unique = used.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), used.len(), "a code reuses a generation");

        // Any dimension allowed: codes come on demand, up to the cap, short names only.
        let open = SchemaRecord::next(None, &dims_schema(None));
        assert!(open.codes.is_empty() && open.pending.is_empty());
        assert_eq!(
            open.with_codes(&[(60, "country")]),
            None,
            "not a breakdown tier"
        );
        let long = "x".repeat(CODED_NAME_BYTES + 1);
        assert_eq!(open.with_codes(&[(3600, &long)]), None);
        let names: Vec<String> = (0..CODES_PER_TIER + 5).map(|i| format!("d{i}")).collect();
        let wanted: Vec<(u64, &str)> = names.iter().map(|n| (3600, n.as_str())).collect();
        let given = open.with_codes(&wanted).unwrap();
        assert_eq!(given.pending[&3600].len(), CODES_PER_TIER);
        assert_eq!(given.with_codes(&wanted), None, "full, or coded already");
        assert!(given.has_pending(&wanted[..1]));

        // A pending code is read but not written; once confirmed, it is both.
        let stored = SchemaRecord::decode("m", given.encode().unwrap().as_bytes()).unwrap();
        assert!(stored.code(hour, "d0").is_some());
        assert_eq!(stored.write_code(hour, "d0"), None);
        assert!(stored.is_pending(hour, "d0"));
        assert!(!stored.may_get_code(hour, "d0"), "has one");
        assert!(!stored.may_get_code(hour, "zz"), "the tier is full");
        assert_eq!(stored.dims_by_code(hour).len(), CODES_PER_TIER);
        let full = given.confirmed(&wanted[..3]).unwrap();
        assert_eq!(full.codes[&3600].len(), 3);
        assert_eq!(full.pending[&3600].len(), CODES_PER_TIER - 3);
        assert_eq!(full.confirmed(&wanted[..3]), None, "confirmed already");
        assert_eq!(full.with_codes(&wanted), None, "confirmed ones count too");
        let stored = SchemaRecord::decode("m", full.encode().unwrap().as_bytes()).unwrap();
        assert_eq!(
            stored.write_code(hour, "d0"),
            given.pending[&3600].get("d0").copied()
        );
        assert_eq!(stored.code(hour, "d0"), stored.write_code(hour, "d0"));
        assert!(!stored.is_pending(hour, "d0"));
        assert_eq!(stored.dims_by_code(hour).len(), CODES_PER_TIER);
        let one = SchemaRecord::decode("m", open.encode().unwrap().as_bytes()).unwrap();
        assert!(one.may_get_code(hour, "zz"));
        assert!(!one.may_get_code(Duration::new("1m").unwrap(), "zz"));
        assert!(!one.may_get_code(hour, &long));

        // The codes go on with the subtotals, and start over with them.
        let same = SchemaRecord::next(Some(&full), &dims_schema(None));
        assert_eq!((&same.codes, &same.pending), (&full.codes, &full.pending));
        let without = schema(&["1m:2h", "1h:forever"], Some(&["1m"]));
        let stopped = SchemaRecord::next(Some(&full), &without);
        assert!(!stopped.codes.contains_key(&3600) && !stopped.pending.contains_key(&3600));
        let restarted = SchemaRecord::next(Some(&stopped), &dims_schema(None));
        assert!(restarted.codes.is_empty() && restarted.pending.is_empty());
        let again = restarted.with_codes(&[(3600, "d0")]).unwrap();
        assert!(
            again.pending[&3600]["d0"] >= full.next,
            "a code is never reused"
        );

        // Records of layouts 2 and 3 (`next`, no `pending`) still decode.
        let text = br#"{"schema":{"tiers":["1h:forever"],"breakdown_tiers":["1h"],"dimensions":null},"generation":{"3600":1},"breakdown_generation":{"3600":2},"next":3}"#;
        let old = SchemaRecord::decode("m", text).unwrap().record;
        assert!(old.codes.is_empty() && old.pending.is_empty());
        assert_eq!((old.next, old.layout), (3, 0));
        let text = br#"{"schema":{"tiers":["1h:forever"],"breakdown_tiers":["1h"],"dimensions":null},"generation":{"3600":1},"breakdown_generation":{"3600":2},"codes":{"3600":{"country":3}},"next":4}"#;
        let three = SchemaRecord::decode("m", text).unwrap();
        assert_eq!(
            three.write_code(hour, "country"),
            None,
            "given with no wait"
        );
        assert_eq!(three.code(hour, "country"), Some(3));
        assert!(three.is_pending(hour, "country"));
        // A cached record does not trust its pending codes.
        let cached = Stored {
            cached: true,
            ..three
        };
        assert_eq!(cached.code(hour, "country"), None);
        assert!(cached.dims_by_code(hour).is_empty());
        assert!(cached.may_get_code(hour, "country"));
    }

    /// Builds of older layouts cannot decode what this one writes (they would drop `pending`),
    /// and this one refuses a record of a newer layout.
    #[test]
    fn records_are_kept_from_other_layouts() {
        let record = SchemaRecord::next(None, &dims_schema(Some(&["country"])));
        let text = record.encode().unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(doc.get("next").is_none(), "layouts 2 and 3 require `next`");
        assert_eq!(doc["fresh"], record.next);
        assert_eq!(doc["layout"], LAYOUT_VERSION);
        let newer = text.replace(
            &format!("\"layout\":{LAYOUT_VERSION}"),
            &format!("\"layout\":{}", LAYOUT_VERSION + 1),
        );
        assert_ne!(newer, text);
        let err = SchemaRecord::decode("m", newer.as_bytes()).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("layout version"), "{err}");
    }

    #[test]
    fn window_names_parse_back_and_match_their_pattern() {
        let ns = Namespace::new("clicks").unwrap();
        for key in ["lnk_1", "a}b\\c", "x|y:1:3600:5", "*?[x]"] {
            let name = window_key(&series_tag(&ns, key), 3, 3600, 7200);
            assert_eq!(
                parse_window_key(&name, &ns, 3, 3600),
                Some((key.to_owned(), 7200)),
                "{name}"
            );
            assert_eq!(parse_window_key(&name, &ns, 4, 3600), None);
            assert_eq!(parse_window_key(&name, &ns, 3, 60), None);
            assert_eq!(unescape_tag(&escape_tag(key)).as_deref(), Some(key));
        }
        let other = Namespace::new("click").unwrap();
        let name = window_key(&series_tag(&ns, "k"), 3, 3600, 0);
        assert_eq!(parse_window_key(&name, &other, 3, 3600), None);
        assert_eq!(unescape_tag("a\\x"), None);
        assert_eq!(unescape_tag("a}"), None);
        assert_eq!(windows_pattern(&ns, 3, 3600), "tally:w:{clicks|*}:3:3600:*");
    }

    #[test]
    fn a_retention_that_grows_marks_its_tier() {
        let r1 = SchemaRecord::next(None, &schema(&["1m:2h", "1h:1d"], None));
        assert!(r1.extend.is_empty());
        let r2 = SchemaRecord::next(Some(&r1), &schema(&["1m:1h", "1h:30d"], None));
        assert_eq!(
            r2.extend.keys().collect::<Vec<_>>(),
            vec![&3600],
            "1m shrank, 1h grew"
        );
        assert!(r2.extend[&3600] < r2.next, "a fresh mark");
        // Unfinished, it stays marked through another change; a shorter one marks nothing.
        let r3 = SchemaRecord::next(Some(&r2), &schema(&["1m:1h", "1h:7d"], None));
        assert_eq!(r3.extend, r2.extend);
        // Growing again marks it afresh: the first sweep will not clear this one.
        let r4 = SchemaRecord::next(Some(&r3), &schema(&["1m:1h", "1h:30d"], None));
        assert!(r4.extend[&3600] > r3.extend[&3600]);
        let mut done = r2.clone();
        done.extend.clear();
        assert!(
            SchemaRecord::next(Some(&done), &schema(&["1m:1h", "1h:7d"], None))
                .extend
                .is_empty()
        );
        let forever = SchemaRecord::next(Some(&done), &schema(&["1m:2h", "1h:forever"], None));
        assert_eq!(forever.extend.keys().collect::<Vec<_>>(), vec![&60, &3600]);
        // A tier added anew starts empty: nothing to extend.
        let removed = SchemaRecord::next(Some(&done), &schema(&["1h:30d"], None));
        let added = SchemaRecord::next(Some(&removed), &schema(&["1m:2d", "1h:30d"], None));
        assert!(added.extend.is_empty());
        assert!(grown(
            Retention::For(Duration::new("1d").unwrap()),
            Retention::Forever
        ));
        assert!(!grown(Retention::Forever, Retention::Forever));
    }

    #[test]
    fn replicas_are_counted_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7003@17003 slave a1 0 0 1 connected
d4 127.0.0.1:7004@17004 slave,fail a1 0 0 1 disconnected
e5 127.0.0.1:7005@17005 slave b2 0 0 2 connected
";
        assert_eq!(
            replicas_of_myself(nodes),
            Some(2),
            "a failed link counts too"
        );
        assert_eq!(replicas_of_myself(&nodes.replace("myself,", "")), None);
        assert_eq!(
            replicas_of_myself("a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383"),
            Some(0)
        );
    }

    #[test]
    fn escaping_is_injective_and_closes_the_tag() {
        let pairs = [("a}", "a\\]"), ("a\\]", "a\\\\]")];
        for (a, b) in pairs {
            assert_ne!(escape_tag(a), escape_tag(b));
            assert!(!escape_tag(a).contains('}'));
        }
    }

    #[test]
    fn windows_and_offsets() {
        assert_eq!(window_of(7199, 60), 0);
        assert_eq!(window_of(7200, 60), 7200);
        assert_eq!(window_of(-60, 60), -7200);
        assert_eq!(offset_of(7260, 7200, 60), 1);
        assert_eq!(window_expiry(7200, 60, Retention::Forever), None);
    }

    #[test]
    fn first_kept_agrees_with_keeps_bucket() {
        for tier in ["1m:2h", "1s:1m", "15m:1d", "1h:forever"] {
            let tier = Tier::new(tier).unwrap();
            let res = tier.resolution.secs_i64();
            for now in [0i64, 7199, 7200, 86_399, 1_000_000] {
                for from in [-7200i64, 0, 13, 3600, 90_000] {
                    let first = first_kept(from, &tier, now);
                    assert_eq!(first.rem_euclid(res), 0);
                    assert!(first >= from);
                    let kept = tier.retention.keeps_bucket(first, tier.resolution, now);
                    assert!(kept, "{tier:?} {now} {from}");
                    let before = first - res;
                    assert!(
                        before < from || !tier.retention.keeps_bucket(before, tier.resolution, now)
                    );
                }
            }
        }
    }

    #[test]
    fn generations_follow_tiers() {
        let a = schema(&["1m:2h", "1h:forever"], Some(&["1m", "1h"]));
        let r1 = SchemaRecord::next(None, &a);
        assert_eq!(r1.generation.len(), 2);
        // Same schema again: nothing changes.
        assert_eq!(SchemaRecord::next(Some(&r1), &a).generation, r1.generation);
        // Drop 1m, then re-add it: a new generation.
        let b = schema(&["1h:forever"], None);
        let r2 = SchemaRecord::next(Some(&r1), &b);
        let r3 = SchemaRecord::next(Some(&r2), &a);
        assert_eq!(r3.generation[&3600], r1.generation[&3600]);
        assert_ne!(r3.generation[&60], r1.generation[&60]);
        assert_eq!(
            r3.breakdown_generation[&3600],
            r1.breakdown_generation[&3600]
        );
        // 1h stops keeping breakdowns, then keeps them again: its subtotals start over.
        let c = schema(&["1m:2h", "1h:forever"], Some(&["1m"]));
        let r4 = SchemaRecord::next(Some(&r3), &c);
        assert!(!r4.breakdown_generation.contains_key(&3600));
        let r5 = SchemaRecord::next(Some(&r4), &a);
        assert_ne!(
            r5.breakdown_generation[&3600],
            r1.breakdown_generation[&3600]
        );
        assert_eq!(r5.generation, r3.generation);
        let r3 = r5;
        let all: Vec<u64> = r3
            .generation
            .values()
            .chain(r3.breakdown_generation.values())
            .copied()
            .collect();
        assert!(all.iter().all(|g| *g < r3.next));
        let decoded = SchemaRecord::decode("m", r3.encode().unwrap().as_bytes()).unwrap();
        assert_eq!(decoded.record, r3);
        assert!(matches!(
            SchemaRecord::decode("m", b"{"),
            Err(StoreError::Corrupt { .. })
        ));
    }
}

//! The validated vocabulary of SPEC §1: namespace names, keys, dimension names and values,
//! compound dimensions, durations, tiers, schemas and events. A value of any of these types
//! has passed every rule of the SPEC; constructing one is the only place the rules are checked.

use std::fmt;
use std::str::FromStr;

use crate::error::ErrorCode;

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest dimension value, in bytes.
pub const MAX_DIM_VALUE_BYTES: usize = 2048;
/// Longest namespace or dimension name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Most dimensions one event may carry.
pub const MAX_DIMS_PER_EVENT: usize = 16;
/// `|n|` must stay below 2^53 so every amount survives a trip through a JSON double.
pub const AMOUNT_LIMIT: i64 = 1 << 53;
/// Earliest accepted timestamp: 1970-01-01T00:00:00Z.
pub const MIN_TS: i64 = 0;
/// Latest accepted timestamp (exclusive): 2^32 s, 2106-02-07T06:28:16Z. Bucket indexes then
/// fit in 32 bits at every resolution (the engine packs them beside a series id), and every
/// calendar step stays far from the calendar library's year-9999 edge.
pub const MAX_TS: i64 = 1 << 32;

/// A violation of one rule of the data model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("invalid namespace name {got:?}: {why}")]
    InvalidName { got: String, why: &'static str },
    #[error("invalid key: {why}")]
    InvalidKey { why: &'static str },
    #[error("invalid dimension {what}: {why}")]
    InvalidDimension { what: String, why: String },
    #[error("dimension {name:?} is not in the namespace's allow-list")]
    UnknownDimension { name: String },
    #[error("an event carries at most {MAX_DIMS_PER_EVENT} dimensions, got {got}")]
    TooManyDimensions { got: usize },
    #[error("invalid timestamp {got:?}: {why}")]
    InvalidTimestamp { got: String, why: &'static str },
    #[error("timestamp {ts} is more than {max_future_secs} s in the future")]
    TimestampInFuture { ts: i64, max_future_secs: i64 },
    #[error("invalid amount {got}: |n| must be below 2^53")]
    InvalidAmount { got: String },
    #[error("invalid duration {got:?}: {why}")]
    InvalidDuration { got: String, why: &'static str },
    #[error("invalid schema: {why}")]
    InvalidSchema { why: String },
}

impl ModelError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ModelError::InvalidName { .. } => ErrorCode::InvalidName,
            ModelError::InvalidKey { .. } => ErrorCode::InvalidKey,
            ModelError::InvalidDimension { .. } => ErrorCode::InvalidDimension,
            ModelError::UnknownDimension { .. } => ErrorCode::UnknownDimension,
            ModelError::TooManyDimensions { .. } => ErrorCode::TooManyDimensions,
            ModelError::InvalidTimestamp { .. } => ErrorCode::InvalidTimestamp,
            ModelError::TimestampInFuture { .. } => ErrorCode::TimestampInFuture,
            ModelError::InvalidAmount { .. } => ErrorCode::InvalidAmount,
            ModelError::InvalidDuration { .. } => ErrorCode::InvalidDuration,
            ModelError::InvalidSchema { .. } => ErrorCode::InvalidSchema,
        }
    }
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

macro_rules! string_from_str {
    ($name:ident) => {
        impl FromStr for $name {
            type Err = ModelError;
            fn from_str(s: &str) -> Result<Self, ModelError> {
                Self::new(s)
            }
        }
    };
}

macro_rules! string_newtype {
    ($name:ident) => {
        impl $name {
            pub fn new(s: &str) -> Result<Self, ModelError> {
                Self::check(s)?;
                Ok($name(s.to_owned()))
            }

            /// Validates and keeps the string (no copy).
            pub fn from_string(s: String) -> Result<Self, ModelError> {
                Self::check(&s)?;
                Ok($name(s))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        // Ord and Hash are derived from the one String field, so they agree with str's.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        string_from_str!($name);
    };
}

/// A namespace name: `[a-z0-9][a-z0-9_.-]{0,63}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(String);
string_newtype!(Namespace);

impl Namespace {
    fn check(s: &str) -> Result<(), ModelError> {
        let err = |why| ModelError::InvalidName {
            got: s.to_owned(),
            why,
        };
        let bytes = s.as_bytes();
        let Some(first) = bytes.first() else {
            return Err(err("it is empty"));
        };
        if bytes.len() > MAX_NAME_BYTES {
            return Err(err("it is longer than 64 bytes"));
        }
        if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
            return Err(err("it must start with a-z or 0-9"));
        }
        let ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(b);
        if !bytes.iter().all(ok) {
            return Err(err("only a-z, 0-9, '_', '.' and '-' are allowed"));
        }
        Ok(())
    }
}

/// The entity being counted: UTF-8, 1–256 bytes, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);
string_newtype!(Key);

impl Key {
    fn check(s: &str) -> Result<(), ModelError> {
        if s.is_empty() {
            return Err(ModelError::InvalidKey { why: "it is empty" });
        }
        if s.len() > MAX_KEY_BYTES {
            return Err(ModelError::InvalidKey {
                why: "it is longer than 256 bytes",
            });
        }
        if has_control(s) {
            return Err(ModelError::InvalidKey {
                why: "it contains a control character",
            });
        }
        Ok(())
    }
}

/// A simple dimension name: `[a-z0-9_]{1,64}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DimName(String);
string_newtype!(DimName);

impl DimName {
    fn check(s: &str) -> Result<(), ModelError> {
        let err = |why: &str| ModelError::InvalidDimension {
            what: format!("name {s:?}"),
            why: why.to_owned(),
        };
        if s.is_empty() || s.len() > MAX_NAME_BYTES {
            return Err(err("a name is 1 to 64 bytes"));
        }
        let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
        if !s.bytes().all(ok) {
            return Err(err("only a-z, 0-9 and '_' are allowed"));
        }
        Ok(())
    }
}

/// A dimension value: UTF-8, 1–2048 bytes, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DimValue(String);
string_newtype!(DimValue);

impl DimValue {
    fn check(s: &str) -> Result<(), ModelError> {
        let err = |why: &str| ModelError::InvalidDimension {
            what: "value".to_owned(),
            why: why.to_owned(),
        };
        if s.is_empty() || s.len() > MAX_DIM_VALUE_BYTES {
            return Err(err("a value is 1 to 2048 bytes"));
        }
        if has_control(s) {
            return Err(err("it contains a control character"));
        }
        Ok(())
    }
}

/// A dimension declared in a schema: one name, or a compound `a+b` of at least two.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dimension {
    parts: Vec<DimName>,
    /// The canonical name: the parts joined by `+`.
    name: String,
}

impl Dimension {
    pub fn new(s: &str) -> Result<Self, ModelError> {
        let parts = s
            .split('+')
            .map(DimName::new)
            .collect::<Result<Vec<_>, _>>()?;
        if parts.len() > MAX_DIMS_PER_EVENT {
            return Err(ModelError::InvalidDimension {
                what: format!("{s:?}"),
                why: format!("a compound has at most {MAX_DIMS_PER_EVENT} parts"),
            });
        }
        for (i, p) in parts.iter().enumerate() {
            if parts[..i].contains(p) {
                return Err(ModelError::InvalidDimension {
                    what: format!("{s:?}"),
                    why: format!("{p} appears twice"),
                });
            }
        }
        Ok(Dimension {
            name: s.to_owned(),
            parts,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn parts(&self) -> &[DimName] {
        &self.parts
    }

    pub fn is_compound(&self) -> bool {
        self.parts.len() > 1
    }

    /// The value this dimension takes for an event's dimensions (sorted by name), or `None`
    /// when the event lacks a part (the event then counts toward `unset`).
    pub fn value_of(&self, dims: &[(DimName, DimValue)]) -> Option<String> {
        let find = |p: &DimName| {
            dims.binary_search_by(|(n, _)| n.cmp(p))
                .ok()
                .map(|i| dims[i].1.as_str())
        };
        if let [single] = self.parts.as_slice() {
            return find(single).map(str::to_owned);
        }
        let mut out = String::new();
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            escape_part(find(p)?, &mut out);
        }
        Some(out)
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Appends one part of a compound value, escaping `|` and `\` with `\`.
pub fn escape_part(part: &str, out: &mut String) {
    for c in part.chars() {
        if c == '|' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
}

/// A positive whole number of seconds written `<integer><unit>` with unit `s m h d w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(u64);

const UNITS: [(char, u64); 5] = [
    ('w', 604_800),
    ('d', 86_400),
    ('h', 3_600),
    ('m', 60),
    ('s', 1),
];

impl Duration {
    pub fn from_secs(secs: u64) -> Option<Self> {
        (secs > 0).then_some(Duration(secs))
    }

    pub fn secs(self) -> u64 {
        self.0
    }

    /// Seconds as an `i64`; parsing caps durations far below `i64::MAX`.
    pub fn secs_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    pub fn new(s: &str) -> Result<Self, ModelError> {
        let err = |why| ModelError::InvalidDuration {
            got: s.to_owned(),
            why,
        };
        let Some(unit) = s.chars().last() else {
            return Err(err("it is empty"));
        };
        let Some(&(_, mult)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(err("it must end in one of s, m, h, d, w"));
        };
        let digits = &s[..s.len() - 1];
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(
                "it must be a whole number followed by a unit, like 48h",
            ));
        }
        let n: u64 = digits.parse().map_err(|_| err("the number is too large"))?;
        if n == 0 {
            return Err(err("it must be greater than zero"));
        }
        // Capped at ~1000 years so every sum with a timestamp stays far from overflow.
        match n.checked_mul(mult) {
            Some(secs) if secs <= 1000 * 366 * 86_400 => Ok(Duration(secs)),
            _ => Err(err("it is longer than 1000 years")),
        }
    }
}

string_from_str!(Duration);

/// Canonical form: the largest unit that divides the duration (`60m` → `1h`, `48h` → `2d`).
impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, mult) = UNITS
            .iter()
            .find(|(_, m)| self.0.is_multiple_of(*m))
            .copied()
            .unwrap_or(('s', 1));
        write!(f, "{}{}", self.0 / mult, unit)
    }
}

/// How long a tier keeps its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retention {
    Forever,
    For(Duration),
}

impl Retention {
    /// Whether data at instant `from` and later is still kept at time `now`.
    pub fn holds_from(self, from: i64, now: i64) -> bool {
        match self {
            Retention::Forever => true,
            Retention::For(d) => from >= now.saturating_sub(d.secs_i64()),
        }
    }

    /// Whether a bucket `[start, start + resolution)` is still (partly) kept at `now`.
    pub fn keeps_bucket(self, start: i64, resolution: Duration, now: i64) -> bool {
        match self {
            Retention::Forever => true,
            Retention::For(d) => start + resolution.secs_i64() > now.saturating_sub(d.secs_i64()),
        }
    }

    /// Whether this retention is at least `d` long.
    pub fn at_least(self, d: Duration) -> bool {
        match self {
            Retention::Forever => true,
            Retention::For(r) => r >= d,
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retention::Forever => f.write_str("forever"),
            Retention::For(d) => d.fmt(f),
        }
    }
}

/// A resolution with a retention, written `1m:48h` or `1h:forever`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tier {
    pub resolution: Duration,
    pub retention: Retention,
}

impl Tier {
    pub fn new(s: &str) -> Result<Self, ModelError> {
        let err = |why: String| ModelError::InvalidSchema {
            why: format!("tier {s:?}: {why}"),
        };
        let (res, ret) = s
            .split_once(':')
            .ok_or_else(|| err("a tier is <resolution>:<retention>, like 1m:48h".into()))?;
        let resolution = Duration::new(res).map_err(|e| err(e.to_string()))?;
        if 3600 % resolution.secs() != 0 {
            return Err(err(format!(
                "the resolution {resolution} does not divide 1h"
            )));
        }
        let retention = if ret == "forever" {
            Retention::Forever
        } else {
            Retention::For(Duration::new(ret).map_err(|e| err(e.to_string()))?)
        };
        if !retention.at_least(resolution) {
            return Err(err("the retention is shorter than the resolution".into()));
        }
        Ok(Tier {
            resolution,
            retention,
        })
    }
}

string_from_str!(Tier);

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.resolution, self.retention)
    }
}

/// The schema of a namespace: its tiers, which of them keep breakdowns, and an optional
/// allow-list of dimensions (`None` = any simple dimension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// Sorted finest first; resolutions are unique.
    tiers: Vec<Tier>,
    /// Resolutions of the tiers that keep subtotals, sorted finest first.
    breakdown: Vec<Duration>,
    dimensions: Option<Vec<Dimension>>,
}

/// The SPEC's `[defaults]` schema: `1m:48h` and `1h:forever`, breakdowns in `1h`.
impl Default for Schema {
    fn default() -> Self {
        Schema {
            tiers: vec![
                Tier {
                    resolution: Duration(60),
                    retention: Retention::For(Duration(172_800)),
                },
                Tier {
                    resolution: Duration(3600),
                    retention: Retention::Forever,
                },
            ],
            breakdown: vec![Duration(3600)],
            dimensions: None,
        }
    }
}

/// The wire form of a schema (`PUT /v1/ns/{ns}`, the config file): strings to validate.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaDoc {
    pub tiers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown_tiers: Option<Vec<String>>,
    #[serde(default)]
    pub dimensions: Option<Vec<String>>,
}

impl Schema {
    pub fn new(
        mut tiers: Vec<Tier>,
        breakdown: Option<Vec<Duration>>,
        dimensions: Option<Vec<Dimension>>,
    ) -> Result<Self, ModelError> {
        let err = |why: String| ModelError::InvalidSchema { why };
        if tiers.is_empty() {
            return Err(err("a namespace needs at least one tier".into()));
        }
        tiers.sort_by_key(|t| t.resolution);
        if let Some(w) = tiers
            .windows(2)
            .find(|w| w[0].resolution == w[1].resolution)
        {
            return Err(err(format!(
                "two tiers have the resolution {}",
                w[0].resolution
            )));
        }
        let mut breakdown = match breakdown {
            Some(b) => b,
            None => tiers.last().map(|t| t.resolution).into_iter().collect(),
        };
        breakdown.sort();
        breakdown.dedup();
        if let Some(b) = breakdown
            .iter()
            .find(|b| !tiers.iter().any(|t| t.resolution == **b))
        {
            return Err(err(format!("breakdown tier {b} is not one of the tiers")));
        }
        if let Some(dims) = &dimensions {
            for (i, d) in dims.iter().enumerate() {
                if dims[..i].iter().any(|e| e.name() == d.name()) {
                    return Err(err(format!("dimension {d} is listed twice")));
                }
            }
        }
        Ok(Schema {
            tiers,
            breakdown,
            dimensions,
        })
    }

    /// Validates the wire form.
    pub fn from_doc(doc: &SchemaDoc) -> Result<Self, ModelError> {
        let tiers = doc
            .tiers
            .iter()
            .map(|t| Tier::new(t))
            .collect::<Result<Vec<_>, _>>()?;
        let breakdown = match &doc.breakdown_tiers {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|s| {
                        Duration::new(s).map_err(|e| ModelError::InvalidSchema {
                            why: format!("breakdown tier: {e}"),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let dimensions = match &doc.dimensions {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|s| {
                        Dimension::new(s)
                            .map_err(|e| ModelError::InvalidSchema { why: e.to_string() })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Schema::new(tiers, breakdown, dimensions)
    }

    /// The canonical wire form: durations in canonical units, breakdown tiers explicit.
    pub fn to_doc(&self) -> SchemaDoc {
        SchemaDoc {
            tiers: self.tiers.iter().map(Tier::to_string).collect(),
            breakdown_tiers: Some(self.breakdown.iter().map(Duration::to_string).collect()),
            dimensions: self
                .dimensions
                .as_ref()
                .map(|d| d.iter().map(|d| d.name().to_owned()).collect()),
        }
    }

    /// The tiers, finest first.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// The resolutions that keep subtotals, finest first.
    pub fn breakdown_resolutions(&self) -> &[Duration] {
        &self.breakdown
    }

    pub fn is_breakdown(&self, resolution: Duration) -> bool {
        self.breakdown.contains(&resolution)
    }

    /// The tiers that keep subtotals, finest first.
    pub fn breakdown_tiers(&self) -> impl Iterator<Item = &Tier> {
        self.tiers
            .iter()
            .filter(|t| self.breakdown.contains(&t.resolution))
    }

    pub fn dimensions(&self) -> Option<&[Dimension]> {
        self.dimensions.as_deref()
    }

    /// Whether `name` (simple or compound, canonical) may be queried in this namespace.
    pub fn knows_dimension(&self, name: &str) -> bool {
        match &self.dimensions {
            None => !name.contains('+') && DimName::new(name).is_ok(),
            Some(dims) => dims.iter().any(|d| d.name() == name),
        }
    }

    /// As [`Schema::subtotals`], moving the event's dimensions when there is no allow-list.
    pub fn subtotals_owned(
        &self,
        dims: Vec<(DimName, DimValue)>,
    ) -> Result<Vec<Subtotal>, ModelError> {
        match &self.dimensions {
            None => Ok(dims
                .into_iter()
                .map(|(n, v)| Subtotal {
                    dim: n.into_string(),
                    value: v.into_string(),
                })
                .collect()),
            Some(_) => self.subtotals(&dims),
        }
    }

    /// The subtotals one event adds to: `(dimension, value)` for every counted dimension it
    /// carries. Fails with `unknown_dimension` for a dimension outside the allow-list.
    pub fn subtotals(&self, dims: &[(DimName, DimValue)]) -> Result<Vec<Subtotal>, ModelError> {
        match &self.dimensions {
            None => Ok(dims
                .iter()
                .map(|(n, v)| Subtotal {
                    dim: n.as_str().to_owned(),
                    value: v.as_str().to_owned(),
                })
                .collect()),
            Some(allowed) => {
                for (n, _) in dims {
                    if !allowed.iter().any(|d| d.parts().contains(n)) {
                        return Err(ModelError::UnknownDimension {
                            name: n.as_str().to_owned(),
                        });
                    }
                }
                Ok(allowed
                    .iter()
                    .filter_map(|d| {
                        d.value_of(dims).map(|value| Subtotal {
                            dim: d.name().to_owned(),
                            value,
                        })
                    })
                    .collect())
            }
        }
    }
}

/// One subtotal an event adds to: a dimension's canonical name and the (escaped) value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subtotal {
    pub dim: String,
    pub value: String,
}

/// An amount as given: checked for `|n| < 2^53`.
pub fn amount(n: i64) -> Result<i64, ModelError> {
    if n.checked_abs().is_some_and(|a| a < AMOUNT_LIMIT) {
        Ok(n)
    } else {
        Err(ModelError::InvalidAmount { got: n.to_string() })
    }
}

/// Checks a unix-seconds timestamp against the accepted range.
pub fn timestamp(ts: i64) -> Result<i64, ModelError> {
    if (MIN_TS..MAX_TS).contains(&ts) {
        Ok(ts)
    } else {
        Err(ModelError::InvalidTimestamp {
            got: ts.to_string(),
            why: "outside 1970-01-01T00:00:00Z .. 2106-02-07T06:28:16Z",
        })
    }
}

/// Parses unix seconds (`1790827200`) or RFC 3339 (`2026-10-01T00:00:00-04:00`; a fraction
/// of a second is floored).
pub fn parse_timestamp(s: &str) -> Result<i64, ModelError> {
    let s = s.trim();
    if !s.is_empty()
        && s.bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
    {
        let ts: i64 = s.parse().map_err(|_| ModelError::InvalidTimestamp {
            got: s.to_owned(),
            why: "the number is too large",
        })?;
        return timestamp(ts);
    }
    let parsed: jiff::Timestamp = s.parse().map_err(|_| ModelError::InvalidTimestamp {
        got: s.to_owned(),
        why: "expected unix seconds or RFC 3339 like 2026-10-01T00:00:00Z",
    })?;
    timestamp(parsed.as_second())
}

/// An increment as a client sends it, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawEvent {
    pub ns: String,
    pub key: String,
    /// `None` = now.
    pub ts: Option<i64>,
    /// `None` = 1.
    pub n: Option<i64>,
    pub dims: Vec<(String, String)>,
}

/// A validated event: `(ns, key, ts, n, dims)` with dims sorted by name and unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub ns: Namespace,
    pub key: Key,
    pub ts: i64,
    pub n: i64,
    pub dims: Vec<(DimName, DimValue)>,
}

impl Event {
    /// As [`Event::validate`], moving the raw event's strings instead of copying them.
    pub fn validate_owned(
        raw: RawEvent,
        now: i64,
        max_future_secs: i64,
    ) -> Result<Self, ModelError> {
        let ns = Namespace::from_string(raw.ns)?;
        let key = Key::from_string(raw.key)?;
        let ts = timestamp(raw.ts.unwrap_or(now))?;
        if ts > now.saturating_add(max_future_secs) {
            return Err(ModelError::TimestampInFuture {
                ts,
                max_future_secs,
            });
        }
        let n = amount(raw.n.unwrap_or(1))?;
        if raw.dims.len() > MAX_DIMS_PER_EVENT {
            return Err(ModelError::TooManyDimensions {
                got: raw.dims.len(),
            });
        }
        let mut dims = raw
            .dims
            .into_iter()
            .map(|(n, v)| Ok((DimName::from_string(n)?, DimValue::from_string(v)?)))
            .collect::<Result<Vec<_>, ModelError>>()?;
        dims.sort_unstable();
        if let Some(w) = dims.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(ModelError::InvalidDimension {
                what: format!("name {:?}", w[0].0.as_str()),
                why: "it is given twice".into(),
            });
        }
        Ok(Event {
            ns,
            key,
            ts,
            n,
            dims,
        })
    }

    /// Validates every field of a raw event; `now` fills a missing `ts` and bounds the future.
    pub fn validate(raw: &RawEvent, now: i64, max_future_secs: i64) -> Result<Self, ModelError> {
        Event::validate_owned(raw.clone(), now, max_future_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_rules() {
        for ok in ["clicks", "api_hits", "a", "0.x-y_z", &"a".repeat(64)] {
            assert!(Namespace::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Clicks", "_a", ".a", "a b", "a/b", "é", &"a".repeat(65)] {
            let e = Namespace::new(bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidName, "{bad}");
        }
    }

    #[test]
    fn key_rules() {
        assert!(Key::new("lnk_1").is_ok());
        assert!(Key::new("a/b c?é").is_ok());
        assert!(Key::new(&"k".repeat(256)).is_ok());
        for bad in ["", "a\nb", "\u{7f}", &"k".repeat(257)] {
            assert_eq!(Key::new(bad).unwrap_err().code(), ErrorCode::InvalidKey);
        }
    }

    #[test]
    fn dimension_rules() {
        assert!(DimName::new("country").is_ok());
        for bad in ["", "Country", "a+b", "a-b", &"d".repeat(65)] {
            assert_eq!(
                DimName::new(bad).unwrap_err().code(),
                ErrorCode::InvalidDimension
            );
        }
        assert!(DimValue::new(&"v".repeat(2048)).is_ok());
        for bad in ["", "a\tb", &"v".repeat(2049)] {
            assert_eq!(
                DimValue::new(bad).unwrap_err().code(),
                ErrorCode::InvalidDimension
            );
        }
        let c = Dimension::new("country+device").unwrap();
        assert!(c.is_compound());
        assert_eq!(
            Dimension::new("a+a").unwrap_err().code(),
            ErrorCode::InvalidDimension
        );
        assert_eq!(
            Dimension::new("a+").unwrap_err().code(),
            ErrorCode::InvalidDimension
        );
    }

    #[test]
    fn compound_values_escape_parts() {
        let c = Dimension::new("country+device").unwrap();
        let dims = |pairs: &[(&str, &str)]| {
            let mut v: Vec<_> = pairs
                .iter()
                .map(|(n, v)| (DimName::new(n).unwrap(), DimValue::new(v).unwrap()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            c.value_of(&dims(&[("device", "mobile"), ("country", "US")]))
                .unwrap(),
            "US|mobile"
        );
        assert_eq!(
            c.value_of(&dims(&[("device", "a|b"), ("country", "x\\y")]))
                .unwrap(),
            "x\\\\y|a\\|b"
        );
        assert_eq!(c.value_of(&dims(&[("country", "US")])), None);
    }

    #[test]
    fn durations_parse_and_print_canonically() {
        for (s, secs, canon) in [
            ("1s", 1, "1s"),
            ("60m", 3600, "1h"),
            ("48h", 172_800, "2d"),
            ("90s", 90, "90s"),
            ("14d", 1_209_600, "2w"),
            ("25h", 90_000, "25h"),
        ] {
            let d = Duration::new(s).unwrap();
            assert_eq!(d.secs(), secs);
            assert_eq!(d.to_string(), canon);
        }
        for bad in [
            "",
            "0s",
            "5",
            "h",
            "1.5h",
            "-1h",
            "1y",
            "1 h",
            "99999999999999999999w",
        ] {
            assert_eq!(
                Duration::new(bad).unwrap_err().code(),
                ErrorCode::InvalidDuration,
                "{bad}"
            );
        }
    }

    #[test]
    fn tier_rules() {
        let t = Tier::new("1m:48h").unwrap();
        assert_eq!(t.to_string(), "1m:2d");
        assert_eq!(
            Tier::new("1h:forever").unwrap().retention,
            Retention::Forever
        );
        assert!(Tier::new("15m:1h").is_ok());
        assert!(Tier::new("45s:1h").is_ok());
        for bad in [
            "1d:forever",
            "7m:1h",
            "1m",
            "1h:30m",
            "1h:never",
            "2h:forever",
        ] {
            assert_eq!(
                Tier::new(bad).unwrap_err().code(),
                ErrorCode::InvalidSchema,
                "{bad}"
            );
        }
    }

    #[test]
    fn schema_defaults_and_checks() {
        let doc = SchemaDoc {
            tiers: vec!["1h:forever".into(), "1s:2h".into(), "1m:48h".into()],
            breakdown_tiers: None,
            dimensions: None,
        };
        let s = Schema::from_doc(&doc).unwrap();
        assert_eq!(
            s.to_doc(),
            SchemaDoc {
                tiers: vec!["1s:2h".into(), "1m:2d".into(), "1h:forever".into()],
                breakdown_tiers: Some(vec!["1h".into()]),
                dimensions: None,
            }
        );
        let bad = |tiers: &[&str], bd: Option<&[&str]>, dims: Option<&[&str]>| {
            let doc = SchemaDoc {
                tiers: tiers.iter().map(|s| s.to_string()).collect(),
                breakdown_tiers: bd.map(|b| b.iter().map(|s| s.to_string()).collect()),
                dimensions: dims.map(|b| b.iter().map(|s| s.to_string()).collect()),
            };
            Schema::from_doc(&doc).unwrap_err().code()
        };
        assert_eq!(bad(&[], None, None), ErrorCode::InvalidSchema);
        assert_eq!(
            bad(&["1h:forever", "60m:1d"], None, None),
            ErrorCode::InvalidSchema
        );
        assert_eq!(
            bad(&["1h:forever"], Some(&["1m"]), None),
            ErrorCode::InvalidSchema
        );
        assert_eq!(
            bad(&["1h:forever"], None, Some(&["a", "a"])),
            ErrorCode::InvalidSchema
        );
        assert_eq!(
            bad(&["1h:forever"], None, Some(&["A"])),
            ErrorCode::InvalidSchema
        );
    }

    #[test]
    fn subtotals_follow_the_allow_list() {
        let doc = SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: Some(vec!["status".into(), "status+outcome".into()]),
        };
        let s = Schema::from_doc(&doc).unwrap();
        let raw = RawEvent {
            ns: "api".into(),
            key: "k".into(),
            dims: vec![
                ("status".into(), "200".into()),
                ("outcome".into(), "ok".into()),
            ],
            ..RawEvent::default()
        };
        let e = Event::validate(&raw, 1000, 3600).unwrap();
        let subs = s.subtotals(&e.dims).unwrap();
        assert_eq!(
            subs,
            vec![
                Subtotal {
                    dim: "status".into(),
                    value: "200".into()
                },
                Subtotal {
                    dim: "status+outcome".into(),
                    value: "200|ok".into()
                },
            ]
        );
        let raw = RawEvent {
            dims: vec![("country".into(), "US".into())],
            ..raw
        };
        let e = Event::validate(&raw, 1000, 3600).unwrap();
        assert_eq!(
            s.subtotals(&e.dims).unwrap_err().code(),
            ErrorCode::UnknownDimension
        );
    }

    #[test]
    fn event_validation() {
        let base = RawEvent {
            ns: "clicks".into(),
            key: "k".into(),
            ..RawEvent::default()
        };
        let e = Event::validate(&base, 5000, 3600).unwrap();
        assert_eq!((e.ts, e.n), (5000, 1));
        let code = |raw: RawEvent| Event::validate(&raw, 5000, 3600).unwrap_err().code();
        assert_eq!(
            code(RawEvent {
                ts: Some(8601),
                ..base.clone()
            }),
            ErrorCode::TimestampInFuture
        );
        assert!(
            Event::validate(
                &RawEvent {
                    ts: Some(8600),
                    ..base.clone()
                },
                5000,
                3600
            )
            .is_ok()
        );
        assert_eq!(
            code(RawEvent {
                ts: Some(-1),
                ..base.clone()
            }),
            ErrorCode::InvalidTimestamp
        );
        assert_eq!(
            code(RawEvent {
                n: Some(1 << 53),
                ..base.clone()
            }),
            ErrorCode::InvalidAmount
        );
        assert_eq!(
            code(RawEvent {
                n: Some(i64::MIN),
                ..base.clone()
            }),
            ErrorCode::InvalidAmount
        );
        assert!(
            Event::validate(
                &RawEvent {
                    n: Some(-(1 << 53) + 1),
                    ..base.clone()
                },
                5000,
                0
            )
            .is_ok()
        );
        assert!(
            Event::validate(
                &RawEvent {
                    n: Some(0),
                    ..base.clone()
                },
                5000,
                0
            )
            .is_ok()
        );
        let many = (0..17).map(|i| (format!("d{i}"), "v".to_owned())).collect();
        assert_eq!(
            code(RawEvent {
                dims: many,
                ..base.clone()
            }),
            ErrorCode::TooManyDimensions
        );
        let twice = vec![("a".into(), "1".into()), ("a".into(), "2".into())];
        assert_eq!(
            code(RawEvent {
                dims: twice,
                ..base.clone()
            }),
            ErrorCode::InvalidDimension
        );
        assert_eq!(
            code(RawEvent {
                ns: "A".into(),
                ..base.clone()
            }),
            ErrorCode::InvalidName
        );
        assert_eq!(
            code(RawEvent {
                key: "".into(),
                ..base
            }),
            ErrorCode::InvalidKey
        );
    }

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_timestamp("1790827200").unwrap(), 1_790_827_200);
        assert_eq!(
            parse_timestamp("2026-10-01T00:00:00-04:00").unwrap(),
            1_790_827_200
        );
        assert_eq!(
            parse_timestamp("2026-10-01T04:00:00.9Z").unwrap(),
            1_790_827_200
        );
        for bad in [
            "",
            "yesterday",
            "2026-10-01",
            "-5",
            "1e9",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_timestamp(bad).unwrap_err().code(),
                ErrorCode::InvalidTimestamp,
                "{bad}"
            );
        }
    }
}

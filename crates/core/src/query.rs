//! The queries of SPEC §2 — series, breakdown, window, dashboard, top, keys — exact, and
//! generic over [`Store`]. Each has a typed request, a parser from the named string
//! parameters that `GET` routes and `POST /v1/query` entries share, and a serialisable answer.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::ErrorCode;
use crate::model::{self, Dimension, Duration, Key, ModelError, Namespace, Schema};
use crate::store::{Buckets, KeyRead, Scan, Store, StoreError, Want};
use crate::tier::{self, NoTier, Purpose};
use crate::time::{Calendar, TimeError, Tz, Unit, bucket_start};

/// Default and bounds of `limit` (SPEC §2).
pub const DEFAULT_LIMIT: usize = 10;
pub const DEFAULT_KEYS_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
/// Default of `[limits] max_points`.
pub const DEFAULT_MAX_POINTS: usize = 100_000;

/// A query failure; `code()` gives the SPEC's error code, `field()` the parameter at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    #[error("{field}: {source}")]
    Model {
        field: &'static str,
        source: ModelError,
    },
    #[error("{field}: {source}")]
    Time {
        field: &'static str,
        source: TimeError,
    },
    #[error("missing parameter {field}")]
    MissingParameter { field: &'static str },
    #[error("{field}: {why}")]
    InvalidParameter { field: &'static str, why: String },
    #[error("limit must be a whole number from 1 to {MAX_LIMIT}, got {got:?}")]
    InvalidLimit { got: String },
    #[error("namespace {ns} does not exist")]
    UnknownNamespace { ns: String },
    #[error(transparent)]
    NoTier(#[from] NoTier),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl QueryError {
    pub fn code(&self) -> ErrorCode {
        match self {
            QueryError::Model { source, .. } => source.code(),
            QueryError::Time { source, .. } => source.code(),
            QueryError::MissingParameter { .. } => ErrorCode::MissingParameter,
            QueryError::InvalidParameter { .. } => ErrorCode::InvalidParameter,
            QueryError::InvalidLimit { .. } => ErrorCode::InvalidLimit,
            QueryError::UnknownNamespace { .. } => ErrorCode::UnknownNamespace,
            QueryError::NoTier(_) => ErrorCode::NoTierForRange,
            QueryError::Store(e) => e.code(),
        }
    }

    /// The parameter at fault, if one is.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            QueryError::Model { field, .. }
            | QueryError::Time { field, .. }
            | QueryError::MissingParameter { field }
            | QueryError::InvalidParameter { field, .. } => Some(field),
            QueryError::InvalidLimit { .. } => Some("limit"),
            _ => None,
        }
    }
}

fn model(field: &'static str) -> impl Fn(ModelError) -> QueryError {
    move |source| QueryError::Model { field, source }
}

fn time(field: &'static str) -> impl Fn(TimeError) -> QueryError {
    move |source| QueryError::Time { field, source }
}

/// What every query needs besides its parameters.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub now: i64,
    pub max_points: usize,
}

// ---------------------------------------------------------------------------------------
// Parameters

/// Named string parameters (a query string, or one entry of `POST /v1/query`).
pub trait Params {
    fn get(&self, name: &str) -> Option<&str>;
}

impl Params for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<&str> {
        BTreeMap::get(self, name).map(String::as_str)
    }
}

impl Params for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }
}

fn required<'p>(p: &'p (impl Params + ?Sized), field: &'static str) -> Result<&'p str, QueryError> {
    p.get(field).ok_or(QueryError::MissingParameter { field })
}

fn instant(p: &(impl Params + ?Sized), field: &'static str) -> Result<i64, QueryError> {
    model::parse_timestamp(required(p, field)?).map_err(model(field))
}

fn tz(p: &(impl Params + ?Sized)) -> Result<Tz, QueryError> {
    Tz::get(p.get("tz").unwrap_or("UTC")).map_err(time("tz"))
}

/// `unit`, `every` and `tz` as a calendar; `None` when `unit` is absent.
fn calendar(p: &(impl Params + ?Sized), tz: &Tz) -> Result<Option<Calendar>, QueryError> {
    let Some(unit) = p.get("unit") else {
        if p.get("every").is_some() {
            return Err(QueryError::MissingParameter { field: "unit" });
        }
        return Ok(None);
    };
    let unit = Unit::parse(unit).map_err(time("unit"))?;
    let every = match p.get("every") {
        None => None,
        Some(e) => Some(e.parse::<u32>().map_err(|_| QueryError::Time {
            field: "every",
            source: TimeError::InvalidUnit {
                got: format!("every={e}"),
                why: "every is a whole number".into(),
            },
        })?),
    };
    Calendar::new(unit, every, tz.clone())
        .map(Some)
        .map_err(time("every"))
}

fn limit(p: &(impl Params + ?Sized), default: usize) -> Result<usize, QueryError> {
    match p.get("limit") {
        None => Ok(default),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(QueryError::InvalidLimit { got: s.to_owned() }),
        },
    }
}

/// A dimension as named in a query: simple or compound. A `+` decoded from a query string
/// arrives as a space, and no dimension name has a space, so both spellings are accepted.
fn dimension(s: &str) -> Result<Dimension, QueryError> {
    Dimension::new(&s.replace(' ', "+")).map_err(model("dim"))
}

/// `dim` and `value`, given together or not at all.
fn filter(p: &(impl Params + ?Sized)) -> Result<Option<(Dimension, String)>, QueryError> {
    match (p.get("dim"), p.get("value")) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(QueryError::MissingParameter { field: "value" }),
        (None, Some(_)) => Err(QueryError::MissingParameter { field: "dim" }),
        (Some(d), Some(v)) => {
            let dim = dimension(d)?;
            if v.is_empty() || v.chars().any(char::is_control) {
                return Err(QueryError::Model {
                    field: "value",
                    source: ModelError::InvalidDimension {
                        what: "value".into(),
                        why: "a value is non-empty, with no control characters".into(),
                    },
                });
            }
            Ok(Some((dim, v.to_owned())))
        }
    }
}

fn ns_key(ns: &str, key: &str) -> Result<(Namespace, Key), QueryError> {
    Ok((
        Namespace::new(ns).map_err(model("ns"))?,
        Key::new(key).map_err(model("key"))?,
    ))
}

/// `series`: `from`, `to`, `unit` (required), `every`, `tz`, `dim` + `value`.
#[derive(Debug, Clone)]
pub struct SeriesQuery {
    pub ns: Namespace,
    pub key: Key,
    pub from: i64,
    pub to: i64,
    pub cal: Calendar,
    pub filter: Option<(Dimension, String)>,
}

impl SeriesQuery {
    pub fn parse(ns: &str, key: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let (ns, key) = ns_key(ns, key)?;
        let (from, to) = (instant(p, "from")?, instant(p, "to")?);
        let tz = tz(p)?;
        let cal = calendar(p, &tz)?.ok_or(QueryError::MissingParameter { field: "unit" })?;
        Ok(SeriesQuery {
            ns,
            key,
            from,
            to,
            cal,
            filter: filter(p)?,
        })
    }
}

/// `breakdown`: `dim` (required), `from`, `to`, `unit`?, `every`?, `tz`, `limit`.
#[derive(Debug, Clone)]
pub struct BreakdownQuery {
    pub ns: Namespace,
    pub key: Key,
    pub dim: Dimension,
    pub from: i64,
    pub to: i64,
    pub cal: Option<Calendar>,
    pub tz: Tz,
    pub limit: usize,
}

impl BreakdownQuery {
    pub fn parse(ns: &str, key: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let (ns, key) = ns_key(ns, key)?;
        let dim = dimension(required(p, "dim")?)?;
        let (from, to) = (instant(p, "from")?, instant(p, "to")?);
        let tz = tz(p)?;
        let cal = calendar(p, &tz)?;
        Ok(BreakdownQuery {
            ns,
            key,
            dim,
            from,
            to,
            cal,
            tz,
            limit: limit(p, DEFAULT_LIMIT)?,
        })
    }
}

/// `window`: `last`.
#[derive(Debug, Clone)]
pub struct WindowQuery {
    pub ns: Namespace,
    pub key: Key,
    pub last: Duration,
}

impl WindowQuery {
    pub fn parse(ns: &str, key: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let (ns, key) = ns_key(ns, key)?;
        let last = Duration::new(required(p, "last")?).map_err(model("last"))?;
        Ok(WindowQuery { ns, key, last })
    }
}

/// `dashboard`: `from`, `to`, `unit` (required), `every`, `tz`, `limit`.
#[derive(Debug, Clone)]
pub struct DashboardQuery {
    pub ns: Namespace,
    pub key: Key,
    pub from: i64,
    pub to: i64,
    pub cal: Calendar,
    pub limit: usize,
}

impl DashboardQuery {
    pub fn parse(ns: &str, key: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let (ns, key) = ns_key(ns, key)?;
        let (from, to) = (instant(p, "from")?, instant(p, "to")?);
        let tz = tz(p)?;
        let cal = calendar(p, &tz)?.ok_or(QueryError::MissingParameter { field: "unit" })?;
        Ok(DashboardQuery {
            ns,
            key,
            from,
            to,
            cal,
            limit: limit(p, DEFAULT_LIMIT)?,
        })
    }
}

/// `top`: `from`, `to`, `unit`?, `every`?, `tz`, `limit`, `dim` + `value`.
#[derive(Debug, Clone)]
pub struct TopQuery {
    pub ns: Namespace,
    pub from: i64,
    pub to: i64,
    pub cal: Option<Calendar>,
    pub tz: Tz,
    pub limit: usize,
    pub filter: Option<(Dimension, String)>,
}

impl TopQuery {
    pub fn parse(ns: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let ns = Namespace::new(ns).map_err(model("ns"))?;
        let (from, to) = (instant(p, "from")?, instant(p, "to")?);
        let tz = tz(p)?;
        let cal = calendar(p, &tz)?;
        Ok(TopQuery {
            ns,
            from,
            to,
            cal,
            tz,
            limit: limit(p, DEFAULT_LIMIT)?,
            filter: filter(p)?,
        })
    }
}

/// `keys`: `prefix`, `after`, `limit` (default 100).
#[derive(Debug, Clone)]
pub struct KeysQuery {
    pub ns: Namespace,
    pub prefix: String,
    pub after: Option<String>,
    pub limit: usize,
}

impl KeysQuery {
    pub fn parse(ns: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        Ok(KeysQuery {
            ns: Namespace::new(ns).map_err(model("ns"))?,
            prefix: p.get("prefix").unwrap_or("").to_owned(),
            after: p.get("after").map(str::to_owned),
            limit: limit(p, DEFAULT_KEYS_LIMIT)?,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Answers

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Point {
    pub ts: i64,
    pub t: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesAnswer {
    pub ns: String,
    pub key: String,
    pub unit: &'static str,
    pub every: u32,
    pub tz: String,
    pub resolution: String,
    pub dim: Option<String>,
    pub value: Option<String>,
    pub from: i64,
    pub from_t: String,
    pub to: i64,
    pub to_t: String,
    pub total: i64,
    pub points: Vec<Point>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValueCount {
    pub value: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakdownAnswer {
    pub ns: String,
    pub key: String,
    pub dim: String,
    pub resolution: String,
    pub from: i64,
    pub from_t: String,
    pub to: i64,
    pub to_t: String,
    pub total: i64,
    pub values: Vec<ValueCount>,
    pub other: i64,
    pub unset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowAnswer {
    pub ns: String,
    pub key: String,
    pub last: String,
    pub resolution: String,
    pub from: i64,
    pub from_t: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DashboardAnswer {
    pub ns: String,
    pub key: String,
    pub unit: &'static str,
    pub every: u32,
    pub tz: String,
    pub resolution: String,
    pub dim: Option<String>,
    pub value: Option<String>,
    pub from: i64,
    pub from_t: String,
    pub to: i64,
    pub to_t: String,
    pub total: i64,
    pub timeline: Vec<Point>,
    pub breakdowns: BTreeMap<String, BreakdownAnswer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyCount {
    pub key: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopAnswer {
    pub ns: String,
    pub dim: Option<String>,
    pub value: Option<String>,
    pub resolution: String,
    pub from: i64,
    pub from_t: String,
    pub to: i64,
    pub to_t: String,
    pub total: i64,
    pub keys: Vec<KeyCount>,
    pub other: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeysAnswer {
    pub ns: String,
    pub keys: Vec<String>,
    pub next: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Execution

fn schema_of(store: &dyn Store, ns: &Namespace) -> Result<Schema, QueryError> {
    store
        .schema(ns)?
        .ok_or_else(|| QueryError::UnknownNamespace { ns: ns.to_string() })
}

fn check_dim(schema: &Schema, dim: &Dimension) -> Result<(), QueryError> {
    if schema.knows_dimension(dim.name()) {
        Ok(())
    } else {
        Err(QueryError::Model {
            field: "dim",
            source: ModelError::UnknownDimension {
                name: dim.name().to_owned(),
            },
        })
    }
}

/// How a calendar's boundaries are named in a `no_tier_for_range` message.
fn what(cal: &Calendar) -> String {
    match cal.every() {
        1 => format!("{} {}", cal.tz().name(), cal.unit()),
        n => format!("{} {n}-{}", cal.tz().name(), cal.unit()),
    }
}

/// Sums sorted sparse buckets into the buckets between consecutive `boundaries`.
pub fn rollup(buckets: &[(i64, i64)], boundaries: &[i64]) -> Vec<i64> {
    let n = boundaries.len().saturating_sub(1);
    let mut out = vec![0i64; n];
    let mut i = 0;
    for &(start, count) in buckets {
        if n == 0 || start < boundaries[0] {
            continue;
        }
        while i < n && start >= boundaries[i + 1] {
            i += 1;
        }
        if i == n {
            break;
        }
        out[i] += count;
    }
    out
}

fn points(boundaries: &[i64], counts: &[i64], tz: &Tz) -> Vec<Point> {
    boundaries
        .iter()
        .zip(counts)
        .map(|(&ts, &n)| Point {
            ts,
            t: tz.rfc3339(ts),
            n,
        })
        .collect()
}

fn sum(buckets: &Buckets) -> i64 {
    buckets.iter().map(|(_, n)| n).sum()
}

fn read_one(store: &dyn Store, read: KeyRead<'_>) -> Result<crate::store::KeyData, QueryError> {
    let mut data = store.read(&[read])?;
    data.pop()
        .ok_or_else(|| StoreError::Internal("a read returned no answer".into()).into())
}

/// The exact, unit-less range `[from, to)` of breakdown and top, or the floored/ceiled one.
fn plain_range(from: i64, to: i64, cal: Option<&Calendar>) -> Result<(i64, i64), QueryError> {
    match cal {
        Some(c) => c.range(from, to).map_err(time("from")),
        None if from > to => Err(QueryError::Time {
            field: "from",
            source: TimeError::InvalidRange { from, to },
        }),
        None => Ok((from, to)),
    }
}

fn ends(from: i64, to: i64) -> Vec<i64> {
    if from < to {
        vec![from, to]
    } else {
        Vec::new()
    }
}

/// Values of one dimension summed, sorted by count (desc) then value bytes, zeros left out.
fn breakdown_of(
    head: BreakdownHead<'_>,
    total: i64,
    mut values: Vec<ValueCount>,
    limit: usize,
) -> BreakdownAnswer {
    values.retain(|v| v.n != 0);
    let all: i64 = values.iter().map(|v| v.n).sum();
    values.sort_by(|a, b| {
        b.n.cmp(&a.n)
            .then_with(|| a.value.as_bytes().cmp(b.value.as_bytes()))
    });
    let rest: i64 = values.iter().skip(limit).map(|v| v.n).sum();
    values.truncate(limit);
    BreakdownAnswer {
        ns: head.ns.to_string(),
        key: head.key.to_string(),
        dim: head.dim.to_owned(),
        resolution: head.resolution.to_string(),
        from: head.from,
        from_t: head.tz.rfc3339(head.from),
        to: head.to,
        to_t: head.tz.rfc3339(head.to),
        total,
        values,
        other: rest,
        unset: total - all,
    }
}

#[derive(Clone, Copy)]
struct BreakdownHead<'a> {
    ns: &'a Namespace,
    key: &'a Key,
    dim: &'a str,
    resolution: Duration,
    from: i64,
    to: i64,
    tz: &'a Tz,
}

pub fn series(store: &dyn Store, ctx: Ctx, q: &SeriesQuery) -> Result<SeriesAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    if let Some((dim, _)) = &q.filter {
        check_dim(&schema, dim)?;
    }
    let (from, to) = q.cal.range(q.from, q.to).map_err(time("from"))?;
    let bounds = q
        .cal
        .boundaries(from, to, ctx.max_points)
        .map_err(time("to"))?;
    let purpose = if q.filter.is_some() {
        Purpose::Breakdown
    } else {
        Purpose::Totals
    };
    let tier = tier::choose(&q.ns, &schema, purpose, &bounds, &what(&q.cal), ctx.now)?;
    let want = match &q.filter {
        None => Want::Totals,
        Some((d, v)) => Want::Value {
            dim: d.name(),
            value: v,
        },
    };
    let counts = if bounds.is_empty() {
        Vec::new()
    } else {
        let read = KeyRead {
            ns: &q.ns,
            key: &q.key,
            resolution: tier.resolution,
            from,
            to,
            want,
        };
        let data = read_one(store, read)?;
        let buckets = match &q.filter {
            None => data.totals,
            Some((d, v)) => data
                .subtotals
                .into_iter()
                .find(|s| s.dim == d.name() && s.value == *v)
                .map(|s| s.buckets)
                .unwrap_or_default(),
        };
        rollup(&buckets, &bounds)
    };
    let tz = q.cal.tz();
    Ok(SeriesAnswer {
        ns: q.ns.to_string(),
        key: q.key.to_string(),
        unit: q.cal.unit().as_str(),
        every: q.cal.every(),
        tz: tz.name().to_owned(),
        resolution: tier.resolution.to_string(),
        dim: q.filter.as_ref().map(|(d, _)| d.name().to_owned()),
        value: q.filter.as_ref().map(|(_, v)| v.clone()),
        from,
        from_t: tz.rfc3339(from),
        to,
        to_t: tz.rfc3339(to),
        total: counts.iter().sum(),
        points: points(&bounds, &counts, tz),
    })
}

pub fn breakdown(
    store: &dyn Store,
    ctx: Ctx,
    q: &BreakdownQuery,
) -> Result<BreakdownAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    check_dim(&schema, &q.dim)?;
    let (from, to) = plain_range(q.from, q.to, q.cal.as_ref())?;
    let label = q.cal.as_ref().map_or_else(|| "range".to_owned(), what);
    let tier = tier::choose(
        &q.ns,
        &schema,
        Purpose::Breakdown,
        &ends(from, to),
        &label,
        ctx.now,
    )?;
    let read = KeyRead {
        ns: &q.ns,
        key: &q.key,
        resolution: tier.resolution,
        from,
        to,
        want: Want::Dim { dim: q.dim.name() },
    };
    let data = if from < to {
        read_one(store, read)?
    } else {
        Default::default()
    };
    let values = data
        .subtotals
        .iter()
        .filter(|s| s.dim == q.dim.name())
        .map(|s| ValueCount {
            value: s.value.clone(),
            n: sum(&s.buckets),
        })
        .collect();
    let head = BreakdownHead {
        ns: &q.ns,
        key: &q.key,
        dim: q.dim.name(),
        resolution: tier.resolution,
        from,
        to,
        tz: &q.tz,
    };
    Ok(breakdown_of(head, sum(&data.totals), values, q.limit))
}

/// Which buckets a window sums: `[from, to)` of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPlan {
    pub resolution: Duration,
    pub from: i64,
    pub to: i64,
}

impl WindowPlan {
    /// Whether an event at `ts` counts in this window.
    pub fn covers(&self, ts: i64) -> bool {
        let b = bucket_start(ts, self.resolution.secs_i64());
        self.from <= b && b < self.to
    }
}

/// The window's tier and buckets for a schema at `now`: the `ceil(last / r)` most recent
/// buckets of the finest tier whose retention is at least `last`.
pub fn window_plan(
    ns: &Namespace,
    schema: &Schema,
    last: Duration,
    now: i64,
) -> Result<WindowPlan, QueryError> {
    let Some(tier) = schema.tiers().iter().find(|t| t.retention.at_least(last)) else {
        let longest = schema
            .tiers()
            .iter()
            .map(|t| t.retention.to_string())
            .next_back();
        return Err(NoTier {
            message: format!(
                "namespace {ns} keeps no tier for {last} (the longest retention is {})",
                longest.unwrap_or_default()
            ),
        }
        .into());
    };
    let r = tier.resolution.secs_i64();
    let count = (last.secs_i64() + r - 1) / r;
    let current = bucket_start(now, r);
    Ok(WindowPlan {
        resolution: tier.resolution,
        from: current - (count - 1) * r,
        to: current + r,
    })
}

/// The window answer for a plan and a count.
pub fn window_answer(
    ns: &Namespace,
    key: &Key,
    last: Duration,
    plan: WindowPlan,
    n: i64,
) -> WindowAnswer {
    WindowAnswer {
        ns: ns.to_string(),
        key: key.to_string(),
        last: last.to_string(),
        resolution: plan.resolution.to_string(),
        from: plan.from,
        from_t: Tz::utc().rfc3339(plan.from),
        n,
    }
}

pub fn window(store: &dyn Store, ctx: Ctx, q: &WindowQuery) -> Result<WindowAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    let plan = window_plan(&q.ns, &schema, q.last, ctx.now)?;
    let read = KeyRead {
        ns: &q.ns,
        key: &q.key,
        resolution: plan.resolution,
        from: plan.from,
        to: plan.to,
        want: Want::Totals,
    };
    let data = read_one(store, read)?;
    Ok(window_answer(
        &q.ns,
        &q.key,
        q.last,
        plan,
        sum(&data.totals),
    ))
}

pub fn dashboard(
    store: &dyn Store,
    ctx: Ctx,
    q: &DashboardQuery,
) -> Result<DashboardAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    let (from, to) = q.cal.range(q.from, q.to).map_err(time("from"))?;
    let bounds = q
        .cal
        .boundaries(from, to, ctx.max_points)
        .map_err(time("to"))?;
    let tier = tier::choose(
        &q.ns,
        &schema,
        Purpose::Breakdown,
        &bounds,
        &what(&q.cal),
        ctx.now,
    )?;
    let read = KeyRead {
        ns: &q.ns,
        key: &q.key,
        resolution: tier.resolution,
        from,
        to,
        want: Want::All,
    };
    let data = if bounds.is_empty() {
        Default::default()
    } else {
        read_one(store, read)?
    };
    let counts = rollup(&data.totals, &bounds);
    let total = sum(&data.totals);
    let tz = q.cal.tz();
    let mut by_dim: BTreeMap<&str, Vec<ValueCount>> = BTreeMap::new();
    for s in &data.subtotals {
        let n = sum(&s.buckets);
        if n != 0 {
            by_dim.entry(&s.dim).or_default().push(ValueCount {
                value: s.value.clone(),
                n,
            });
        }
    }
    let breakdowns = by_dim
        .into_iter()
        .map(|(dim, values)| {
            let head = BreakdownHead {
                ns: &q.ns,
                key: &q.key,
                dim,
                resolution: tier.resolution,
                from,
                to,
                tz,
            };
            (dim.to_owned(), breakdown_of(head, total, values, q.limit))
        })
        .collect();
    Ok(DashboardAnswer {
        ns: q.ns.to_string(),
        key: q.key.to_string(),
        unit: q.cal.unit().as_str(),
        every: q.cal.every(),
        tz: tz.name().to_owned(),
        resolution: tier.resolution.to_string(),
        dim: None,
        value: None,
        from,
        from_t: tz.rfc3339(from),
        to,
        to_t: tz.rfc3339(to),
        total,
        timeline: points(&bounds, &counts, tz),
        breakdowns,
    })
}

pub fn top(store: &dyn Store, ctx: Ctx, q: &TopQuery) -> Result<TopAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    if let Some((dim, _)) = &q.filter {
        check_dim(&schema, dim)?;
    }
    let (from, to) = plain_range(q.from, q.to, q.cal.as_ref())?;
    let label = q.cal.as_ref().map_or_else(|| "range".to_owned(), what);
    let purpose = if q.filter.is_some() {
        Purpose::Breakdown
    } else {
        Purpose::Totals
    };
    let tier = tier::choose(&q.ns, &schema, purpose, &ends(from, to), &label, ctx.now)?;
    let mut keys: Vec<KeyCount> = Vec::new();
    if from < to {
        let scan = Scan {
            ns: &q.ns,
            resolution: tier.resolution,
            from,
            to,
            value: q.filter.as_ref().map(|(d, v)| (d.name(), v.as_str())),
        };
        store.scan(&scan, &mut |k, n| {
            if n != 0 {
                keys.push(KeyCount {
                    key: k.to_string(),
                    n,
                });
            }
        })?;
    }
    let total: i64 = keys.iter().map(|k| k.n).sum();
    let order = |a: &KeyCount, b: &KeyCount| {
        b.n.cmp(&a.n)
            .then_with(|| a.key.as_bytes().cmp(b.key.as_bytes()))
    };
    if keys.len() > q.limit {
        keys.select_nth_unstable_by(q.limit, order);
        keys.truncate(q.limit);
    }
    keys.sort_by(order);
    let shown: i64 = keys.iter().map(|k| k.n).sum();
    Ok(TopAnswer {
        ns: q.ns.to_string(),
        dim: q.filter.as_ref().map(|(d, _)| d.name().to_owned()),
        value: q.filter.as_ref().map(|(_, v)| v.clone()),
        resolution: tier.resolution.to_string(),
        from,
        from_t: q.tz.rfc3339(from),
        to,
        to_t: q.tz.rfc3339(to),
        total,
        keys,
        other: total - shown,
    })
}

pub fn keys(store: &dyn Store, q: &KeysQuery) -> Result<KeysAnswer, QueryError> {
    schema_of(store, &q.ns)?;
    let mut page = store.keys(&q.ns, &q.prefix, q.after.as_deref(), q.limit + 1)?;
    let more = page.len() > q.limit;
    page.truncate(q.limit);
    let next = if more {
        page.last().map(|k| k.to_string())
    } else {
        None
    };
    Ok(KeysAnswer {
        ns: q.ns.to_string(),
        keys: page.into_iter().map(|k| k.to_string()).collect(),
        next,
    })
}

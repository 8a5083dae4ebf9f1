//! Parameters: named strings (a query string, or one entry of `POST /v1/query`) parsed into
//! typed requests. Every bad parameter is a [`QueryError`] naming its field.

use std::collections::BTreeMap;

use super::{DEFAULT_KEYS_LIMIT, DEFAULT_LIMIT, MAX_LIMIT, QueryError, model, time};
use crate::model::{self as m, Dimension, Duration, Key, ModelError, Namespace};
use crate::time::{Calendar, TimeError, Tz, Unit};

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

pub(super) fn required<'p>(
    p: &'p (impl Params + ?Sized),
    field: &'static str,
) -> Result<&'p str, QueryError> {
    p.get(field).ok_or(QueryError::MissingParameter { field })
}

/// A `+` decoded from a query string arrives as a space (form encoding): an offset like
/// `+05:30` in `from`, or the `+` of `Etc/GMT+5` in `tz`, as written in an answer's `_t`
/// fields and in the tz database. No timestamp or zone name has a space, so a space is read
/// back as the `+` it was.
pub fn plus(s: &str) -> std::borrow::Cow<'_, str> {
    match s.contains(' ') {
        true => s.replace(' ', "+").into(),
        false => s.into(),
    }
}

/// `parse` of a query-string value with its spaces read back as `+` ([`plus`]). When that
/// does not make it valid either, the error is the one for the value as sent, which quotes
/// it as the user wrote it (a review saw `"2026-11-20+00:00:00Z"` for a space typed).
fn parse_plus<T, E>(sent: &str, parse: impl Fn(&str) -> Result<T, E>) -> Result<T, E> {
    parse(&plus(sent)).or_else(|e| match sent.contains(' ') {
        true => parse(sent),
        false => Err(e),
    })
}

/// A timestamp from a query string ([`parse_plus`]).
pub fn timestamp_plus(sent: &str) -> Result<i64, ModelError> {
    parse_plus(sent, m::parse_timestamp)
}

/// An instant (whole seconds and nanoseconds, [`m::parse_instant`]) from a query string.
pub fn instant_plus(sent: &str) -> Result<(i64, u32), ModelError> {
    parse_plus(sent, m::parse_instant)
}

/// The range's ends in whole seconds (SPEC §2: `[from, to)`, half-open), meaning for
/// events, counted by the whole second, what the instants sent mean: the second `s` is in
/// `[from, to)` exactly when `ceil(from)` ≤ `s` < `ceil(to)`. So without a unit (`rounded`
/// false) both ends are ceiled. With one (`rounded`: a unit, or an export's resolution,
/// floors `from` and ceils `to` to its boundaries, which are whole seconds) `from` is floored
/// and `to` ceiled, giving the buckets the instants themselves give. Equal instants stay
/// equal (no points), and `from` after `to` stays after it (`ceil(from)`, `floor(to)`),
/// fractions included, for the query's own check to refuse with `invalid_range` in its turn,
/// after the namespace, unit, zone and dimension (a review found `…01:00:00.5Z` read as
/// `…01:00:00Z`).
pub(super) fn span(p: &(impl Params + ?Sized), rounded: bool) -> Result<(i64, i64), QueryError> {
    let end = |field| instant_plus(required(p, field)?).map_err(model(field));
    Ok(whole_seconds(end("from")?, end("to")?, rounded))
}

/// The ends of [`span`] from two instants (whole seconds, nanoseconds): also how `tally
/// export --data` reads its `--from` and `--to`.
pub fn whole_seconds(from: (i64, u32), to: (i64, u32), rounded: bool) -> (i64, i64) {
    let ceil = |(secs, nanos): (i64, u32)| secs + i64::from(nanos > 0);
    if from > to {
        return (ceil(from), to.0);
    }
    if from == to {
        return (from.0, from.0);
    }
    (if rounded { from.0 } else { ceil(from) }, ceil(to))
}

fn tz(p: &(impl Params + ?Sized)) -> Result<Tz, QueryError> {
    parse_plus(p.get("tz").unwrap_or("UTC"), Tz::get).map_err(time("tz"))
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
        // Digits only: `parse` would also take a sign (`+6`).
        Some(e) => Some(
            digits(e)
                .and_then(|e| e.parse::<u32>().ok())
                .ok_or_else(|| QueryError::Time {
                    field: "every",
                    source: TimeError::InvalidUnit {
                        got: format!("every={e}"),
                        why: "every is a whole number".into(),
                    },
                })?,
        ),
    };
    Calendar::new(unit, every, tz.clone())
        .map(Some)
        .map_err(time("every"))
}

/// `s` if it is a whole number in digits alone (no sign, no space).
fn digits(s: &str) -> Option<&str> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then_some(s)
}

fn limit(p: &(impl Params + ?Sized), default: usize) -> Result<usize, QueryError> {
    match p.get("limit") {
        None => Ok(default),
        Some(s) => match digits(s).and_then(|d| d.parse::<usize>().ok()) {
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
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
        let (from, to) = span(p, true)?;
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
        let (from, to) = span(p, p.get("unit").is_some())?;
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
    /// `last` as given (`24h`), which the answer echoes (SPEC §3), where `last` itself
    /// prints in its shortest form (`1d`).
    pub spelled: String,
}

impl WindowQuery {
    pub fn parse(ns: &str, key: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let (ns, key) = ns_key(ns, key)?;
        let spelled = required(p, "last")?;
        let last = Duration::new(spelled).map_err(model("last"))?;
        Ok(WindowQuery {
            ns,
            key,
            last,
            spelled: spelled.to_owned(),
        })
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
        let (from, to) = span(p, true)?;
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
        let (from, to) = span(p, p.get("unit").is_some())?;
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

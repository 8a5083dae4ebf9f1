//! Reads: the GET query routes and `POST /v1/query`, one dispatcher for both so a batch entry
//! and a GET with the same parameters give the same answer.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tally_core::ErrorCode;
use tally_core::query;
use tally_core::store::Deadline;

use crate::app::App;
use crate::auth;
use crate::body::read_body;
use crate::config::Action;
use crate::error::ApiError;
use crate::params;

/// Most entries in one `POST /v1/query`.
const MAX_BATCH_QUERIES: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Series,
    Breakdown,
    Window,
    Dashboard,
    Top,
    Keys,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "series" => Kind::Series,
            "breakdown" => Kind::Breakdown,
            "window" => Kind::Window,
            "dashboard" => Kind::Dashboard,
            "top" => Kind::Top,
            "keys" => Kind::Keys,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Series => "series",
            Kind::Breakdown => "breakdown",
            Kind::Window => "window",
            Kind::Dashboard => "dashboard",
            Kind::Top => "top",
            Kind::Keys => "keys",
        }
    }

    fn keyed(self) -> bool {
        !matches!(self, Kind::Top | Kind::Keys)
    }

    fn params(self) -> &'static [&'static str] {
        match self {
            Kind::Series => &["from", "to", "unit", "every", "tz", "dim", "value"],
            Kind::Breakdown => &["dim", "from", "to", "unit", "every", "tz", "limit"],
            Kind::Window => &["last"],
            Kind::Dashboard => &["from", "to", "unit", "every", "tz", "limit"],
            Kind::Top => &["from", "to", "unit", "every", "tz", "limit", "dim", "value"],
            Kind::Keys => &["prefix", "after", "limit"],
        }
    }
}

fn check_params(kind: Kind, p: &BTreeMap<String, String>) -> Result<(), ApiError> {
    match p.keys().find(|k| !kind.params().contains(&k.as_str())) {
        Some(k) => Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!(
                "unknown parameter {k:?}; {} takes {}",
                kind.name(),
                kind.params().join(", ")
            ),
        )
        .field(k.clone())),
        None => Ok(()),
    }
}

/// One answer, serialised on the blocking pool (a large answer never ties up an async
/// worker), and the number of points it holds.
struct Answer {
    json: Vec<u8>,
    points: usize,
}

impl Answer {
    fn of<T: serde::Serialize>(answer: &T, points: usize) -> Result<Answer, ApiError> {
        let json = serde_json::to_vec(answer).map_err(|e| {
            ApiError::new(ErrorCode::Internal, format!("serialising an answer: {e}"))
        })?;
        Ok(Answer { json, points })
    }
}

/// An answer already serialised: sent as it is.
fn json_response(json: Vec<u8>) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json,
    )
        .into_response()
}

/// Runs one query (on the blocking pool's thread) and serialises the answer. Its points:
/// buckets of a series or timeline, values of a breakdown, keys of a top or a page.
fn run(
    app: &App,
    kind: Kind,
    ns: &str,
    key: &str,
    p: &BTreeMap<String, String>,
    deadline: &Deadline,
) -> Result<Answer, ApiError> {
    check_params(kind, p)?;
    deadline.check()?;
    let store = &**app.store();
    let ctx = app.ctx(deadline);
    let t = Instant::now();
    let none = std::iter::empty;
    let answer = (|| match kind {
        Kind::Series => {
            let a = query::series(store, ctx, &query::SeriesQuery::parse(ns, key, p)?)?;
            bounded(app, kind, &a, a.points.len(), none())
        }
        Kind::Breakdown => {
            let a = query::breakdown(store, ctx, &query::BreakdownQuery::parse(ns, key, p)?)?;
            let values = a.values.iter().map(|v| v.value.len());
            bounded(app, kind, &a, a.values.len(), values)
        }
        Kind::Window => {
            let a = query::window(store, ctx, &query::WindowQuery::parse(ns, key, p)?)?;
            bounded(app, kind, &a, 1, none())
        }
        Kind::Dashboard => {
            let a = query::dashboard(store, ctx, &query::DashboardQuery::parse(ns, key, p)?)?;
            let all = a.breakdowns.values().flat_map(|b| &b.values);
            let points = a.timeline.len() + all.clone().count();
            bounded(app, kind, &a, points, all.map(|v| v.value.len()))
        }
        Kind::Top => {
            let a = query::top(store, ctx, &query::TopQuery::parse(ns, p)?)?;
            bounded(app, kind, &a, a.keys.len(), none())
        }
        Kind::Keys => {
            let a = query::keys(store, &query::KeysQuery::parse(ns, p)?)?;
            bounded(app, kind, &a, a.keys.len(), none())
        }
    })();
    app.metrics().query(kind.name(), t.elapsed());
    answer
}

/// Serialises an answer holding `points` points and dimension values of `values` bytes
/// each, once it is known to be within `[limits]`: a series is refused before it is read,
/// but a breakdown, dashboard or top is known only once answered (its values are the
/// data's), so it is refused here, before serialising, the same alone or in a batch. A page
/// of keys is bounded by its own `limit`.
fn bounded<T: serde::Serialize>(
    app: &App,
    kind: Kind,
    answer: &T,
    points: usize,
    values: impl Iterator<Item = usize>,
) -> Result<Answer, ApiError> {
    let max_points = app.settings().limits.max_points;
    if points > max_points && !matches!(kind, Kind::Keys) {
        return Err(ApiError::new(
            ErrorCode::TooManyPoints,
            format!(
                "the answer holds {points} points, more than {max_points} ([limits] \
                 max_points); narrow it (a smaller limit, range or unit)"
            ),
        ));
    }
    within_bytes(app, values)?;
    Answer::of(answer, points)
}

/// Refuses an answer whose dimension values would pass `[limits] max_answer_bytes`, before
/// it is serialised (a breakdown or dashboard of long values is within `max_points` and can
/// still be hundreds of megabytes).
fn within_bytes(app: &App, values: impl Iterator<Item = usize>) -> Result<(), ApiError> {
    let max = app.settings().limits.max_answer_bytes;
    // A value's own bytes and its JSON around it (`{"value":"","n":…},`).
    let bytes: usize = values.map(|len| len + 32).sum();
    if bytes > max {
        return Err(too_many_bytes(bytes, max));
    }
    Ok(())
}

fn too_many_bytes(bytes: usize, max: usize) -> ApiError {
    ApiError::new(
        ErrorCode::TooManyPoints,
        format!(
            "the answer would hold about {bytes} bytes, more than {max} ([limits] \
             max_answer_bytes); narrow it (a smaller limit, range or request)"
        ),
    )
}

async fn get(
    app: App,
    headers: HeaderMap,
    kind: Kind,
    ns: String,
    key: String,
    q: Option<String>,
) -> Result<Response, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Read, &ns)?;
    let p = params::unique(q.as_deref())?;
    app.query(move |app, deadline| run(app, kind, &ns, &key, &p, deadline))
        .await
        .map(|a| json_response(a.json))
}

/// A key's counts per calendar bucket.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys/{key}/series", tag = "queries",
    description = "Zero-filled points for every bucket of [from, to) in `unit` (× `every`) of zone `tz`, and their total; optionally for one `dim`/`value`.",
    params(("ns" = String, Path), ("key" = String, Path), ("from" = String, Query), ("to" = String, Query), ("unit" = String, Query),
        ("every" = Option<u32>, Query), ("tz" = Option<String>, Query), ("dim" = Option<String>, Query), ("value" = Option<String>, Query)),
    responses((status = 200, description = "series answer"), (status = 400, description = "invalid parameters"), (status = 422, description = "no_tier_for_range, too_many_points")))]
pub async fn series(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    get(app, headers, Kind::Series, ns, key, q).await
}

/// A key's top values of one dimension.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys/{key}/breakdown", tag = "queries",
    params(("ns" = String, Path), ("key" = String, Path), ("dim" = String, Query), ("from" = String, Query), ("to" = String, Query),
        ("unit" = Option<String>, Query), ("every" = Option<u32>, Query), ("tz" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "breakdown answer: values, other, unset, total"), (status = 422, description = "no_tier_for_range, too_many_points (more values than [limits] max_points, or values of more bytes than [limits] max_answer_bytes)")))]
pub async fn breakdown(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    get(app, headers, Kind::Breakdown, ns, key, q).await
}

/// A key's rolling count over the last `last`.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys/{key}/window", tag = "queries",
    params(("ns" = String, Path), ("key" = String, Path), ("last" = String, Query, description = "a duration: 60s, 24h")),
    responses((status = 200, description = "window answer")))]
pub async fn window(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    get(app, headers, Kind::Window, ns, key, q).await
}

/// A key's timeline and the breakdown of every dimension the schema counts and that is
/// whole over the range (one a schema change began counting later is left out).
#[utoipa::path(get, path = "/v1/ns/{ns}/keys/{key}/dashboard", tag = "queries",
    params(("ns" = String, Path), ("key" = String, Path), ("from" = String, Query), ("to" = String, Query), ("unit" = String, Query),
        ("every" = Option<u32>, Query), ("tz" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "dashboard answer"), (status = 422, description = "no_tier_for_range, too_many_points (more values than [limits] max_points, or values of more bytes than [limits] max_answer_bytes)")))]
pub async fn dashboard(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    get(app, headers, Kind::Dashboard, ns, key, q).await
}

/// The exact top keys of a namespace.
#[utoipa::path(get, path = "/v1/ns/{ns}/top", tag = "queries",
    params(("ns" = String, Path), ("from" = String, Query), ("to" = String, Query), ("unit" = Option<String>, Query), ("every" = Option<u32>, Query),
        ("tz" = Option<String>, Query), ("limit" = Option<u32>, Query), ("dim" = Option<String>, Query), ("value" = Option<String>, Query)),
    responses((status = 200, description = "top answer"), (status = 422, description = "no_tier_for_range, too_many_points (more values than [limits] max_points)")))]
pub async fn top(
    State(app): State<App>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    get(app, headers, Kind::Top, ns, String::new(), q).await
}

/// Keys of a namespace in byte order.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys", tag = "queries",
    description = "Keys with a counted event (an amount other than 0, at a time some tier keeps) whose data some tier still holds. A key whose counts all net to 0 may stay listed for a while: until a later flush of the embedded engine forgets keys without counts, or until its last bucket's retention ends on the Redis backend (docs/ARCHITECTURE.md).",
    params(("ns" = String, Path), ("prefix" = Option<String>, Query), ("after" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "`{\"ns\", \"keys\", \"next\"}`")))]
pub async fn keys(
    State(app): State<App>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    get(app, headers, Kind::Keys, ns, String::new(), q).await
}

/// Many queries in one request; each succeeds or fails on its own.
#[utoipa::path(post, path = "/v1/query", tag = "queries",
    description = "`{\"queries\": [{\"kind\": \"series\", \"ns\": …, \"key\": …, <the GET parameters>}, …]}`, at most 1000; a parameter is a string or a number, and null means not given (as answers print one).",
    request_body(content = String, content_type = "application/json"),
    responses((status = 200, description = "`{\"results\": [<answer or {\"error\": …}>, …]}`"), (status = 413, description = "batch_too_large"), (status = 422, description = "too_many_points: the answers together hold more than [limits] max_points points, or values of more than max_answer_bytes bytes")))]
pub async fn batch(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(body, app.settings().limits.max_body_bytes).await?;
    let list = app
        .parse(bytes.len(), move |_| batch_queries(&bytes))
        .await?;
    // Parse and authorise every entry up front; each entry's failure is its own.
    let entries: Vec<Result<Entry, ApiError>> = list
        .iter()
        .map(|e| match e {
            Some(e) => entry(&app, &headers, e),
            None => Err(ApiError::new(
                ErrorCode::MalformedBody,
                format!("a query is an object of at most {QUERY_VALUES} JSON values"),
            )),
        })
        .collect();
    let max_points = app.settings().limits.max_points;
    let max_bytes = app.settings().limits.max_answer_bytes;
    app.query(move |app, deadline| {
        let mut out = Vec::from(&b"{\"results\":["[..]);
        let mut points = 0usize;
        for (i, e) in entries.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match e.and_then(|(kind, ns, key, p)| run(app, kind, &ns, &key, &p, deadline)) {
                Ok(a) => {
                    points += a.points;
                    // Each answer is within max_points on its own; their sum is bounded too,
                    // so a small request cannot build a huge answer.
                    if points > max_points {
                        return Err(ApiError::new(
                            ErrorCode::TooManyPoints,
                            format!(
                                "the answers hold more than {max_points} points in all \
                                 ([limits] max_points); split the request"
                            ),
                        ));
                    }
                    out.extend_from_slice(&a.json);
                    if out.len() > max_bytes {
                        return Err(too_many_bytes(out.len(), max_bytes));
                    }
                }
                // Out of time is the whole request's failure, not one entry's.
                Err(e) if e.code == ErrorCode::QueryTimeout => return Err(e),
                Err(e) => out.extend_from_slice(e.to_json().to_string().as_bytes()),
            }
        }
        out.extend_from_slice(b"]}");
        Ok(json_response(out))
    })
    .await
}

/// The most JSON values one entry of `POST /v1/query` is built from (an entry is an object
/// of a dozen members or so): a body cannot make a value tree many times its size.
const QUERY_VALUES: usize = 64;

/// The entries of a `POST /v1/query` body, `{"queries": [...]}`: at most
/// [`MAX_BATCH_QUERIES`] of them (more are counted, not built), each `None` if it holds more
/// than [`QUERY_VALUES`] values.
fn batch_queries(bytes: &[u8]) -> Result<Vec<Option<Value>>, ApiError> {
    use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
    use std::cell::Cell;
    /// What the reading saw: the body an object, its list an array, its shape wrong.
    #[derive(Default)]
    struct Seen {
        list: Cell<bool>,
        bad_shape: Cell<bool>,
    }
    struct Body<'s>(&'s Seen);
    struct List<'s>(&'s Seen);
    impl<'de> Visitor<'de> for Body<'_> {
        type Value = (usize, Vec<Option<Value>>);
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("{\"queries\": [...]}")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut list = None;
            while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if name != "queries" || list.is_some() {
                    self.0.bad_shape.set(true);
                    return Err(A::Error::custom("not the shape"));
                }
                list = Some(map.next_value_seed(List(self.0))?);
            }
            list.ok_or_else(|| {
                self.0.bad_shape.set(true);
                A::Error::custom("not the shape")
            })
        }
    }
    impl<'de> DeserializeSeed<'de> for List<'_> {
        type Value = (usize, Vec<Option<Value>>);
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for List<'_> {
        type Value = (usize, Vec<Option<Value>>);
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array of queries")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            self.0.list.set(true);
            let mut out = Vec::new();
            let n = crate::json::take_then_check(seq, MAX_BATCH_QUERIES, |seq| {
                let left = Cell::new(QUERY_VALUES);
                let v = seq.next_element_seed(crate::json::Budgeted(&left))?;
                Ok(v.map(|v| out.push(v)).map(|()| true))
            })?;
            Ok((n, out))
        }
    }
    let malformed = |m: String| ApiError::new(ErrorCode::MalformedBody, m);
    let seen = Seen::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let read = serde::Deserializer::deserialize_any(&mut de, Body(&seen))
        .and_then(|r| de.end().map(|()| r));
    match read {
        Ok((n, _)) if n > MAX_BATCH_QUERIES => Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!("at most {MAX_BATCH_QUERIES} queries, got {n}"),
        )),
        Ok((_, list)) => Ok(list),
        // Inside the list: not JSON (or a member named twice in an entry).
        Err(e) if seen.list.get() && !seen.bad_shape.get() => {
            Err(malformed(format!("the body is not JSON: {e}")))
        }
        // Otherwise JSON of another shape, or not JSON at all (said as such).
        Err(_) => match crate::json::check(bytes) {
            Err(e) => Err(malformed(format!("the body is not JSON: {e}"))),
            Ok(_) => Err(malformed("the body is {\"queries\": [...]}".into())),
        },
    }
}

/// One parsed batch entry: kind, namespace, key, parameters.
type Entry = (Kind, String, String, BTreeMap<String, String>);

fn entry(app: &App, headers: &HeaderMap, e: &Value) -> Result<Entry, ApiError> {
    let malformed = |m: String| ApiError::new(ErrorCode::MalformedBody, m);
    let obj = e
        .as_object()
        .ok_or_else(|| malformed("each query is a JSON object".into()))?;
    let text = |name: &'static str| -> Result<Option<String>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(ApiError::new(
                ErrorCode::InvalidParameter,
                format!("{name} must be a string or a number"),
            )
            .field(name)),
        }
    };
    let kind_s = text("kind")?.ok_or_else(|| {
        ApiError::new(ErrorCode::MissingParameter, "kind is required").field("kind")
    })?;
    let kind = Kind::parse(&kind_s).ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!("unknown kind {kind_s:?}: series, breakdown, window, dashboard, top or keys"),
        )
        .field("kind")
    })?;
    let ns = text("ns")?
        .ok_or_else(|| ApiError::new(ErrorCode::MissingParameter, "ns is required").field("ns"))?;
    let key = if kind.keyed() {
        text("key")?.ok_or_else(|| {
            ApiError::new(ErrorCode::MissingParameter, "key is required").field("key")
        })?
    } else {
        String::new()
    };
    auth::authorize(&app.settings().tokens, headers, Action::Read, &ns)?;
    let mut p = BTreeMap::new();
    for (k, v) in obj {
        if matches!(k.as_str(), "kind" | "ns" | "key") {
            continue;
        }
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            // As answers print a parameter not given (`"dim": null`): not given.
            Value::Null => continue,
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("{k} must be a string or a number"),
                )
                .field(k.clone()));
            }
        };
        p.insert(k.clone(), v);
    }
    Ok((kind, ns, key, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> (ErrorCode, String) {
        let e = batch_queries(body.as_bytes()).unwrap_err();
        (e.code, e.message)
    }

    /// Shape, syntax and count errors say what they said when the body was one value tree;
    /// an entry is built within its budget, and entries past the limit are only counted.
    #[test]
    fn a_batch_body_is_read_within_its_bounds() {
        let shape = "the body is {\"queries\": [...]}";
        for body in [
            "[]",
            "5",
            r#"{"queries": 5}"#,
            r#"{"queries": [], "x": 1}"#,
            r#"{"x": 1}"#,
            "{}",
            r#"{"queries": [], "queries": []}"#,
        ] {
            assert_eq!(
                refused(body),
                (ErrorCode::MalformedBody, shape.into()),
                "{body}"
            );
        }
        for body in [
            "{",
            r#"{"queries": [{}, oops]}"#,
            r#"{"x": 1,"#,
            r#"{"queries": []} trailing"#,
            r#"{"queries": [{"ns": "a", "ns": "b"}]}"#,
        ] {
            let (code, message) = refused(body);
            assert_eq!(code, ErrorCode::MalformedBody, "{body}");
            assert!(
                message.starts_with("the body is not JSON: "),
                "{body}: {message}"
            );
        }
        let list =
            batch_queries(br#"{"queries": [{"kind": "keys", "ns": "a"}, {"a": [1, 2]}]}"#).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1], Some(serde_json::json!({"a": [1, 2]})));
        let big = format!(
            r#"{{"queries": [{{"a": [{}]}}]}}"#,
            vec!["0"; 100].join(",")
        );
        assert_eq!(batch_queries(big.as_bytes()).unwrap(), vec![None]);
        let many = format!(r#"{{"queries": [{}]}}"#, vec!["{}"; 300_000].join(","));
        assert_eq!(
            refused(&many),
            (
                ErrorCode::BatchTooLarge,
                "at most 1000 queries, got 300000".into()
            )
        );
    }
}

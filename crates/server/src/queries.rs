//! Reads: the GET query routes and `POST /v1/query`, one dispatcher for both so a batch entry
//! and a GET with the same parameters give the same answer.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use serde_json::Value;
use tally_core::ErrorCode;
use tally_core::query;

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

/// Runs one query (on the blocking pool's thread) and serialises the answer.
fn run(
    app: &App,
    kind: Kind,
    ns: &str,
    key: &str,
    p: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    check_params(kind, p)?;
    let store = &**app.store();
    let ctx = app.ctx();
    let t = Instant::now();
    let v = match kind {
        Kind::Series => serde_json::to_value(query::series(
            store,
            ctx,
            &query::SeriesQuery::parse(ns, key, p)?,
        )?),
        Kind::Breakdown => serde_json::to_value(query::breakdown(
            store,
            ctx,
            &query::BreakdownQuery::parse(ns, key, p)?,
        )?),
        Kind::Window => serde_json::to_value(query::window(
            store,
            ctx,
            &query::WindowQuery::parse(ns, key, p)?,
        )?),
        Kind::Dashboard => serde_json::to_value(query::dashboard(
            store,
            ctx,
            &query::DashboardQuery::parse(ns, key, p)?,
        )?),
        Kind::Top => serde_json::to_value(query::top(store, ctx, &query::TopQuery::parse(ns, p)?)?),
        Kind::Keys => serde_json::to_value(query::keys(store, &query::KeysQuery::parse(ns, p)?)?),
    };
    app.metrics().query(kind.name(), t.elapsed());
    v.map_err(|e| ApiError::new(ErrorCode::Internal, format!("serialising an answer: {e}")))
}

async fn get(
    app: App,
    headers: HeaderMap,
    kind: Kind,
    ns: String,
    key: String,
    q: Option<String>,
) -> Result<Json<Value>, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Read, &ns)?;
    let p = params::unique(q.as_deref())?;
    app.blocking(move |app| run(app, kind, &ns, &key, &p))
        .await
        .map(Json)
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
) -> Result<Json<Value>, ApiError> {
    get(app, headers, Kind::Series, ns, key, q).await
}

/// A key's top values of one dimension.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys/{key}/breakdown", tag = "queries",
    params(("ns" = String, Path), ("key" = String, Path), ("dim" = String, Query), ("from" = String, Query), ("to" = String, Query),
        ("unit" = Option<String>, Query), ("every" = Option<u32>, Query), ("tz" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "breakdown answer: values, other, unset, total")))]
pub async fn breakdown(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
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
) -> Result<Json<Value>, ApiError> {
    get(app, headers, Kind::Window, ns, key, q).await
}

/// A key's timeline and the breakdown of every dimension.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys/{key}/dashboard", tag = "queries",
    params(("ns" = String, Path), ("key" = String, Path), ("from" = String, Query), ("to" = String, Query), ("unit" = String, Query),
        ("every" = Option<u32>, Query), ("tz" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "dashboard answer")))]
pub async fn dashboard(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    get(app, headers, Kind::Dashboard, ns, key, q).await
}

/// The exact top keys of a namespace.
#[utoipa::path(get, path = "/v1/ns/{ns}/top", tag = "queries",
    params(("ns" = String, Path), ("from" = String, Query), ("to" = String, Query), ("unit" = Option<String>, Query), ("every" = Option<u32>, Query),
        ("tz" = Option<String>, Query), ("limit" = Option<u32>, Query), ("dim" = Option<String>, Query), ("value" = Option<String>, Query)),
    responses((status = 200, description = "top answer")))]
pub async fn top(
    State(app): State<App>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    get(app, headers, Kind::Top, ns, String::new(), q).await
}

/// Keys of a namespace in byte order.
#[utoipa::path(get, path = "/v1/ns/{ns}/keys", tag = "queries",
    params(("ns" = String, Path), ("prefix" = Option<String>, Query), ("after" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "`{\"ns\", \"keys\", \"next\"}`")))]
pub async fn keys(
    State(app): State<App>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    get(app, headers, Kind::Keys, ns, String::new(), q).await
}

/// Many queries in one request; each succeeds or fails on its own.
#[utoipa::path(post, path = "/v1/query", tag = "queries",
    description = "`{\"queries\": [{\"kind\": \"series\", \"ns\": …, \"key\": …, <the GET parameters>}, …]}`, at most 1000.",
    request_body(content = String, content_type = "application/json"),
    responses((status = 200, description = "`{\"results\": [<answer or {\"error\": …}>, …]}`"), (status = 413, description = "batch_too_large")))]
pub async fn batch(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = read_body(body, app.settings().limits.max_body_bytes).await?;
    let malformed = |m: &str| ApiError::new(ErrorCode::MalformedBody, m);
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| malformed(&format!("the body is not JSON: {e}")))?;
    let list = v
        .get("queries")
        .and_then(Value::as_array)
        .filter(|_| v.as_object().is_some_and(|o| o.len() == 1))
        .ok_or_else(|| malformed("the body is {\"queries\": [...]}"))?;
    if list.len() > MAX_BATCH_QUERIES {
        return Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!("at most {MAX_BATCH_QUERIES} queries, got {}", list.len()),
        ));
    }
    // Parse and authorise every entry up front; each entry's failure is its own.
    let entries: Vec<Result<Entry, ApiError>> =
        list.iter().map(|e| entry(&app, &headers, e)).collect();
    let results = app
        .blocking(move |app| {
            Ok(entries
                .into_iter()
                .map(
                    |e| match e.and_then(|(kind, ns, key, p)| run(app, kind, &ns, &key, &p)) {
                        Ok(v) => v,
                        Err(e) => e.to_json(),
                    },
                )
                .collect::<Vec<_>>())
        })
        .await?;
    Ok(Json(serde_json::json!({ "results": results })))
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
            None => Ok(None),
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

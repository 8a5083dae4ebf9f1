//! `POST /v1/ns/{ns}/rebuild?from=…&to=…`: replace what a namespace holds in a closed range
//! with what the body's events count (Clickatron's rebuild; `tally load --replace --server`),
//! atomically for readers (`Store::rebuild`). Needs `admin:<ns>`.
//!
//! The body is the shape of `POST /v1/events` (JSON array or NDJSON), under the same limits;
//! every event must be of the namespace and inside `[from, to)`, which are whole hours and
//! end no later than now. An empty body empties the range. Backends without rebuilds answer
//! `404 not_found`.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use serde_json::{Value, json};
use tally_core::ErrorCode;
use tally_core::ingest;
use tally_core::model::Namespace;

use crate::app::App;
use crate::auth;
use crate::body::read_body;
use crate::config::Action;
use crate::error::ApiError;
use crate::events::{is_ndjson, parse};
use crate::params;

/// Replaces a closed range of a namespace with the body's events.
#[utoipa::path(post, path = "/v1/ns/{ns}/rebuild", tag = "operations",
    description = "Replaces what the namespace holds in [from, to) — whole hours, ending no later than now — with what the body's events (the shape of POST /v1/events, all of this namespace and inside the range) count, every tier, totals and breakdowns, atomically: a query sees the old counts or the new, never a mix. Needs admin on the namespace. No Idempotency-Key is used: the same rebuild run again changes nothing. The embedded engine only (404 elsewhere).",
    params(("ns" = String, Path), ("from" = String, Query), ("to" = String, Query)),
    request_body(content = String, content_type = "application/json"),
    responses(
        (status = 200, description = "`{\"ns\", \"from\", \"to\", \"events\", \"held_before\"}`"),
        (status = 400, description = "malformed_body, invalid_parameter, invalid_range, invalid_timestamp, …"),
        (status = 401, description = "unauthorized"), (status = 403, description = "forbidden: admin on the namespace is needed"),
        (status = 404, description = "unknown_namespace, or not_found: this backend does not rebuild"),
        (status = 413, description = "body_too_large, batch_too_large"),
        (status = 422, description = "too_many_points: what the range holds does not fit the rebuild's memory (1 GiB); nothing changed"),
        (status = 503, description = "backend_unavailable"),
    ))]
pub async fn rebuild(
    State(app): State<App>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Admin, &ns)?;
    let ns = Namespace::new(&ns).map_err(|e| ApiError::from(e).field("ns"))?;
    let p = params::unique(q.as_deref())?;
    if let Some(k) = p.keys().find(|k| !["from", "to"].contains(&k.as_str())) {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!("unknown parameter {k:?}; rebuild takes from, to"),
        )
        .field(k.clone()));
    }
    let at = |field: &'static str| -> Result<(i64, u32), ApiError> {
        let v = p.get(field).ok_or_else(|| {
            ApiError::new(
                ErrorCode::MissingParameter,
                format!("missing parameter {field}"),
            )
            .field(field)
        })?;
        tally_core::query::instant_plus(v).map_err(|e| ApiError::from(e).field(field))
    };
    let ((from, from_nanos), (to, to_nanos)) = (at("from")?, at("to")?);
    let now = app.now();
    let bad = |why: String| ApiError::new(ErrorCode::InvalidRange, why).field("from");
    if (from, from_nanos) >= (to, to_nanos) {
        return Err(bad(format!("from ({from}) must be before to ({to})")));
    }
    if from % 3600 != 0 || to % 3600 != 0 || from_nanos != 0 || to_nanos != 0 {
        return Err(bad(
            "from and to of a rebuild are whole hours (every tier's buckets then lie wholly inside or outside)".into(),
        ));
    }
    if to > now {
        return Err(ApiError::new(
            ErrorCode::InvalidRange,
            format!("a rebuild replaces a closed range: to ({to}) is after now ({now})"),
        )
        .field("to"));
    }
    let bytes = read_body(body, app.settings().limits.max_body_bytes).await?;
    let raws = parse::parse_body(
        &bytes,
        is_ndjson(&headers),
        app.settings().limits.max_batch_events,
    )?;
    for (i, r) in raws.iter().enumerate() {
        if r.ns != ns.as_str() {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                format!(
                    "event {i}: namespace {:?} is not the rebuilt one ({ns})",
                    r.ns
                ),
            )
            .field("ns")
            .index(i));
        }
        let Some(ts) = r.ts else {
            return Err(ApiError::new(
                ErrorCode::InvalidTimestamp,
                format!(
                    "event {i}: it has no ts: a rebuild's events need one, inside the rebuilt \
                     range [{from}, {to}) (without one an event is dated now, after the range)"
                ),
            )
            .field("ts")
            .index(i));
        };
        if !(from..to).contains(&ts) {
            return Err(ApiError::new(
                ErrorCode::InvalidTimestamp,
                format!("event {i}: ts {ts} is outside the rebuilt range [{from}, {to})"),
            )
            .field("ts")
            .index(i));
        }
    }
    let events = raws.len();
    let name = ns.to_string();
    let held = app
        .blocking(move |app| {
            let store = &**app.store();
            if store.schema(&ns)?.is_none() {
                return Err(ApiError::new(
                    ErrorCode::UnknownNamespace,
                    format!("namespace {ns} does not exist"),
                ));
            }
            let settings = app.settings();
            let defaults = ingest::Defaults {
                auto_create: false,
                ..settings.defaults.clone()
            };
            let batch = ingest::prepare_owned(store, raws, now, &settings.limits, &defaults)?;
            Ok(store.rebuild(&ns, from, to, &batch)?)
        })
        .await?;
    Ok(Json(json!({
        "ns": name,
        "from": from,
        "to": to,
        "events": events,
        "held_before": held,
    })))
}

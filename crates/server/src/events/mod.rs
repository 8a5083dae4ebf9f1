//! Writes: `POST /v1/events` (JSON array or NDJSON) and `POST /v1/ns/{ns}/keys/{key}/incr`,
//! both all-or-nothing, both honouring `Idempotency-Key`. The body's parsing is in [`parse`].

pub(crate) mod parse;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use tally_core::ErrorCode;
use tally_core::ingest;
use tally_core::model::{self, Duration, RawEvent};
use tally_core::query::{self, Accepted};

use crate::app::App;
use crate::auth;
use crate::body::read_body;
use crate::config::Action;
use crate::error::ApiError;
use crate::idempotency::{self, Held, Idem, Ticket};
use crate::params;

/// Validates, remembers the answer if asked to, and applies — on the blocking pool.
fn apply(
    app: &App,
    raws: Vec<RawEvent>,
    idem: Option<Ticket>,
    answer: impl FnOnce(&App, &tally_core::store::Batch) -> Result<Accepted, ApiError>,
) -> Result<Accepted, ApiError> {
    let now = app.now();
    let events = raws.len() as u64;
    let mut batch = ingest::prepare_owned(
        &**app.store(),
        raws,
        now,
        &app.settings().limits,
        &app.settings().defaults,
    )?;
    let body = answer(app, &batch)?;
    if let Some(ticket) = idem {
        batch.idempotency = Some(ticket.record(now, &body)?);
    }
    app.store().apply(&batch)?;
    app.metrics().events.fetch_add(events, Ordering::Relaxed);
    app.metrics().batches.fetch_add(1, Ordering::Relaxed);
    Ok(body)
}

/// Ingest a batch of events.
#[utoipa::path(post, path = "/v1/events", tag = "events",
    description = "A JSON array of events `{\"ns\", \"key\", \"ts\"?, \"n\"?, \"dims\"?}`, or NDJSON with `Content-Type: application/x-ndjson`. All or nothing: one bad event rejects the batch, naming its 0-based index. Answers once the batch is durable under the fsync policy.",
    params(("Idempotency-Key" = Option<String>, Header, description = "Remember the answer for 24 h; a retry with the same body applies nothing.")),
    request_body(content = String, content_type = "application/json"),
    responses(
        (status = 200, description = "`{\"accepted\": N}`"),
        (status = 400, description = "malformed_body, invalid_name, invalid_key, invalid_dimension, unknown_dimension, too_many_dimensions, invalid_timestamp, timestamp_in_future, invalid_amount"),
        (status = 401, description = "unauthorized"), (status = 403, description = "forbidden"),
        (status = 404, description = "unknown_namespace (auto_create off)"),
        (status = 409, description = "idempotency_in_progress"),
        (status = 413, description = "body_too_large, batch_too_large"),
        (status = 422, description = "idempotency_key_reused"),
        (status = 503, description = "backend_unavailable"),
    ))]
pub async fn post_events(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let bytes = read_body(body, app.settings().limits.max_body_bytes).await?;
    let ndjson = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-ndjson"));
    let raws = parse::parse_body(&bytes, ndjson, app.settings().limits.max_batch_events)?;
    // Once per namespace, at its first event: that event's index is the one a refusal names.
    let mut checked: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (i, r) in raws.iter().enumerate() {
        if checked.insert(r.ns.as_str()) {
            auth::authorize(&app.settings().tokens, &headers, Action::Write, &r.ns)
                .map_err(|e| e.index(i))?;
        }
    }
    let fp = if idempotency::requested(&headers) {
        idempotency::fingerprint(&[b"POST /v1/events", &[u8::from(ndjson)], &bytes])
    } else {
        String::new()
    };
    let held = match idempotency::begin(&app, &headers, fp).await? {
        Idem::Replay(answer) => return Ok(answer),
        Idem::Proceed(held) => held,
    };
    let idem = held.as_ref().map(Held::ticket);
    let n = raws.len() as u64;
    let body = app
        .blocking(move |app| {
            apply(app, raws, idem, |_, _| {
                Ok(Accepted {
                    accepted: n,
                    window: None,
                })
            })
        })
        .await?;
    drop(held);
    Ok(Json(body).into_response())
}

/// Increment one key from query parameters.
#[utoipa::path(post, path = "/v1/ns/{ns}/keys/{key}/incr", tag = "events",
    description = "One event from query parameters `n` (default 1), `ts` (default now), `dim.<name>=<value>`. `window=<duration>` adds the rolling count after the increment.",
    params(
        ("ns" = String, Path), ("key" = String, Path, description = "percent-encoded"),
        ("n" = Option<i64>, Query), ("ts" = Option<String>, Query), ("window" = Option<String>, Query),
        ("Idempotency-Key" = Option<String>, Header),
    ),
    responses((status = 200, description = "`{\"accepted\": 1}` or `{\"accepted\": 1, \"window\": {...}}`"), (status = 400, description = "invalid input")))]
pub async fn incr(
    State(app): State<App>,
    Path((ns, key)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    auth::authorize(&app.settings().tokens, &headers, Action::Write, &ns)?;
    let query = query.unwrap_or_default();
    let pairs = params::pairs(&query)?;
    let mut raw = RawEvent {
        ns: ns.clone(),
        key: key.clone(),
        ..RawEvent::default()
    };
    let mut window = None;
    // A repeat is refused where it appears, so a bad value before it is named first.
    let mut seen = BTreeSet::new();
    for (k, v) in &pairs {
        if !seen.insert(k.as_str()) {
            return Err(params::given_twice(k.clone()));
        }
        match k.as_str() {
            "n" => {
                raw.n = Some(v.parse().map_err(|_| {
                    ApiError::new(
                        ErrorCode::InvalidAmount,
                        format!("n {v:?} is not an integer"),
                    )
                    .field("n")
                })?)
            }
            "ts" => {
                raw.ts = Some(model::parse_timestamp(v).map_err(|e| ApiError::from(e).field("ts"))?)
            }
            "window" => {
                window = Some(Duration::new(v).map_err(|e| ApiError::from(e).field("window"))?)
            }
            _ => match k.strip_prefix("dim.") {
                Some(d) => raw.dims.push((d.to_owned(), v.clone())),
                None => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidParameter,
                        format!("unknown parameter {k:?} (incr takes n, ts, window, dim.<name>)"),
                    )
                    .field(k.clone()));
                }
            },
        }
    }
    let fp = idempotency::fingerprint(&[
        b"POST incr ",
        ns.as_bytes(),
        b"/",
        key.as_bytes(),
        b"?",
        query.as_bytes(),
    ]);
    let held = match idempotency::begin(&app, &headers, fp).await? {
        Idem::Replay(answer) => return Ok(answer),
        Idem::Proceed(held) => held,
    };
    let idem = held.as_ref().map(Held::ticket);
    let body = app
        .blocking(move |app| {
            apply(app, vec![raw], idem, |app, batch| {
                let window = match window {
                    Some(last) => Some(query::window_after(
                        app.store().as_ref(),
                        app.now(),
                        batch,
                        last,
                    )?),
                    None => None,
                };
                Ok(Accepted {
                    accepted: 1,
                    window,
                })
            })
        })
        .await?;
    drop(held);
    Ok(Json(body).into_response())
}

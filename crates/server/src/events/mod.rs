//! Writes: `POST /v1/events` (JSON array or NDJSON) and `POST /v1/ns/{ns}/keys/{key}/incr`,
//! both all-or-nothing, both honouring `Idempotency-Key`. The body's parsing is in [`parse`].
//! `POST /v1/events?dry_run=true` runs every check of a real write and applies nothing, so a
//! client (`tally load`) can learn what the server would refuse before it sends anything real.

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

/// Validates, remembers the answer if asked to, and applies — as blocking work. A
/// refusal of the events is told by `refused` (a batch names the event's index, `incr` the
/// parameter).
fn apply(
    app: &App,
    raws: Vec<RawEvent>,
    idem: Option<Ticket>,
    refused: fn(ingest::IngestError) -> ApiError,
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
    )
    .map_err(refused)?;
    let body = answer(app, &batch)?;
    if let Some(ticket) = idem {
        batch.idempotency = Some(ticket.record(now, &body)?);
    }
    let (_reserved, over) = app.reserve_creations(&batch)?;
    if let Some(ns) = over.first() {
        let max = app.settings().limits.max_namespaces;
        return Err(refused(ingest::refuse_creation(&batch, ns, max)));
    }
    app.store().apply(&batch)?;
    app.metrics().events.fetch_add(events, Ordering::Relaxed);
    app.metrics().batches.fetch_add(1, Ordering::Relaxed);
    Ok(body)
}

/// `dry_run` of `POST /v1/events`: `true` or `false` (the default), given at most once.
/// It is the route's only parameter: another is refused, not ignored (`?dryrun=true` must
/// not apply the batch its sender meant to check).
fn dry_run(query: Option<&str>) -> Result<bool, ApiError> {
    let mut value = None;
    for (k, v) in params::pairs(query.unwrap_or(""))? {
        if k != "dry_run" {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                format!("unknown parameter {k:?}; POST /v1/events takes dry_run"),
            )
            .field(k));
        }
        if value.is_some() {
            return Err(params::given_twice(k));
        }
        value = Some(match v.as_str() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("dry_run {v:?} is not true or false"),
                )
                .field("dry_run"));
            }
        });
    }
    Ok(value.unwrap_or(false))
}

/// Ingest a batch of events.
#[utoipa::path(post, path = "/v1/events", tag = "events",
    description = "A JSON array of events `{\"ns\", \"key\", \"ts\"?, \"n\"?, \"dims\"?}`, or NDJSON with `Content-Type: application/x-ndjson`. All or nothing: one bad event rejects the batch, naming its 0-based index. Answers once the batch is durable under the fsync policy. With `dry_run=true` the batch is checked exactly as it would be applied (token scopes, limits, namespaces and their allow-lists, timestamps by the server's clock) and nothing is applied, created or remembered. Any other query parameter is refused (`400 invalid_parameter`), so a misspelt `dry_run` applies nothing.",
    params(
        ("dry_run" = Option<bool>, Query, description = "`true`: check the batch as a real request would and apply nothing — no namespace created, no idempotency answer stored (an `Idempotency-Key` is ignored); the answer is `{\"accepted\": N, \"dry_run\": true}` or the error the real request would get. Default `false`."),
        ("Idempotency-Key" = Option<String>, Header, description = "Remember the answer for 24 h; a retry with the same body applies nothing."),
    ),
    request_body(content = String, content_type = "application/json"),
    responses(
        (status = 200, description = "`{\"accepted\": N}`; a dry run `{\"accepted\": N, \"dry_run\": true}`"),
        (status = 400, description = "malformed_body, invalid_name, invalid_key, invalid_dimension, unknown_dimension, too_many_dimensions, invalid_timestamp, timestamp_in_future, invalid_amount, invalid_parameter (dry_run)"),
        (status = 401, description = "unauthorized"), (status = 403, description = "forbidden"),
        (status = 404, description = "unknown_namespace (auto_create off)"),
        (status = 409, description = "idempotency_in_progress"),
        (status = 413, description = "body_too_large, batch_too_large"),
        (status = 422, description = "idempotency_key_reused, too_many_namespaces (a namespace created past `[limits] max_namespaces`)"),
        (status = 503, description = "backend_unavailable"),
    ))]
pub async fn post_events(
    State(app): State<App>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let dry_run = dry_run(query.as_deref())?;
    let bytes = read_body(body, app.settings().limits.max_body_bytes).await?;
    let ndjson = is_ndjson(&headers);
    let raws = {
        let bytes = bytes.clone();
        app.parse(bytes.len(), move |app| {
            parse::parse_body(&bytes, ndjson, app.settings().limits.max_batch_events)
        })
        .await?
    };
    // Once per namespace, at its first event: that event's index is the one a refusal names.
    let mut checked: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (i, r) in raws.iter().enumerate() {
        if checked.insert(r.ns.as_str()) {
            auth::authorize(&app.settings().tokens, &headers, Action::Write, &r.ns)
                .map_err(|e| e.index(i))?;
        }
    }
    if dry_run {
        // The checks of `apply`, with the same clock, limits and defaults; the batch is
        // dropped. Idempotency is left out: a dry run neither replays nor stores an answer
        // (a malformed key is refused all the same).
        idempotency::header_key(&headers)?;
        let n = raws.len() as u64;
        app.blocking(move |app| {
            let s = app.settings();
            ingest::prepare_owned(&**app.store(), raws, app.now(), &s.limits, &s.defaults)?;
            // What the backend itself would answer the write (a failed log, a Redis that
            // may evict keys), as the real request would get it.
            app.store().writable()?;
            Ok(())
        })
        .await?;
        let m = app.metrics();
        m.dry_run_batches.fetch_add(1, Ordering::Relaxed);
        m.dry_run_events.fetch_add(n, Ordering::Relaxed);
        return Ok(Json(serde_json::json!({"accepted": n, "dry_run": true})).into_response());
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
            // The key stays claimed until the store is done, even if the client hangs up
            // and this handler is dropped: a retry meanwhile gets 409, not a second apply.
            let _held = held;
            apply(app, raws, idem, ApiError::from, |_, _| {
                Ok(Accepted {
                    accepted: n,
                    window: None,
                })
            })
        })
        .await?;
    Ok(Json(body).into_response())
}

/// `max` of a limited `incr`: a whole number from 0 to 2^53 − 1.
fn parse_max(v: &str) -> Result<i64, ApiError> {
    v.parse::<i64>()
        .ok()
        .filter(|m| (0..model::AMOUNT_LIMIT).contains(m) && !v.starts_with('+'))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParameter,
                format!("max {v:?} is not a whole number from 0 to 2^53 - 1"),
            )
            .field("max")
        })
}

/// Tries of a limited increment whose window moves past it while it waits for its key's
/// lock (each wait would have to span a bucket edge) before `503`.
const LIMITED_TRIES: u32 = 4;

/// A limited increment (`incr?window=…&max=…`): validated, then applied only if the window
/// stays within `max`, atomically with the key's other limited increments; on refusal
/// `429 limit_exceeded` with the count, the limit and `retry_after` (also as a
/// `Retry-After` header), and nothing counted. Either answer is remembered under the
/// request's idempotency key, so a retry cannot slip past the limit.
fn apply_limited(
    app: &App,
    raw: RawEvent,
    idem: Option<Ticket>,
    (last, spelled): (Duration, &str),
    max: i64,
) -> Result<axum::response::Response, ApiError> {
    let clock = || app.now();
    // Each try stamps the increment afresh: one that waited for the key's lock while a
    // bucket edge passed comes back undecided (counted in its old bucket it would escape
    // the limit) and is prepared again.
    let mut tries = 0;
    let outcome = loop {
        let now = app.now();
        let batch = ingest::prepare_owned(
            &**app.store(),
            vec![raw.clone()],
            now,
            &app.settings().limits,
            &app.settings().defaults,
        )
        .map_err(incr_refused)?;
        let (_reserved, over) = app.reserve_creations(&batch)?;
        if let Some(ns) = over.first() {
            let max = app.settings().limits.max_namespaces;
            return Err(incr_refused(ingest::refuse_creation(&batch, ns, max)));
        }
        let stamped = (now, raw.ts.is_none());
        // The same request sent to two servers sharing a Redis at once: each waits for the
        // key's lock, and the second would find the first's increment in the window and
        // answer `429`, though its request was counted (found by a review). So, holding the
        // lock, a request under a key first looks for the key's answer: found, it decides
        // nothing (the error stops the step before anything is applied) and answers that.
        let mut answered: Option<Result<tally_core::store::IdemRecord, ApiError>> = None;
        let decided = query::incr_limited(
            &**app.store(),
            stamped,
            &clock,
            &batch,
            last,
            max,
            &mut |o| {
                let Some(ticket) = &idem else {
                    return Ok(None);
                };
                if let found @ (Ok(Some(_)) | Err(_)) = ticket.stored(&**app.store()) {
                    answered = found.transpose();
                    return Err(tally_core::store::StoreError::internal(
                        "answered before: nothing decided",
                    ));
                }
                let (status, body) = limited_answer(o, spelled);
                Ok(Some(ticket.clone().record_raw(
                    now,
                    status,
                    body.to_string(),
                )))
            },
        );
        if let Some(r) = answered {
            let r = r?;
            let mut resp = idempotency::replay(r.status, r.body);
            resp.headers_mut().insert(
                "idempotent-replayed",
                axum::http::HeaderValue::from_static("true"),
            );
            return Ok(resp);
        }
        let decided = decided?;
        if let Some(outcome) = decided {
            break outcome;
        }
        tries += 1;
        if tries == LIMITED_TRIES {
            return Err(ApiError::new(
                ErrorCode::BackendUnavailable,
                format!(
                    "the window moved on {LIMITED_TRIES} times while this increment waited for \
                     the key's other limited increments; nothing was counted, try again"
                ),
            ));
        }
    };
    let (status, body) = limited_answer(&outcome, spelled);
    // The same request sent to two servers sharing a Redis at once: each waits for the
    // key's lock and decides, and the second finds the first's increment in the window —
    // refused, though its request was counted (the first's answer is the one stored, and
    // its apply, under the key, changed nothing). The stored answer is the request's.
    if let Some(ticket) = &idem
        && let Some(r) = ticket.stored(&**app.store())?
        && (r.status, r.body.as_str()) != (status, body.to_string().as_str())
    {
        let mut resp = idempotency::replay(r.status, r.body);
        resp.headers_mut().insert(
            "idempotent-replayed",
            axum::http::HeaderValue::from_static("true"),
        );
        return Ok(resp);
    }
    if let query::Limited::Accepted(_) = outcome {
        app.metrics().events.fetch_add(1, Ordering::Relaxed);
        app.metrics().batches.fetch_add(1, Ordering::Relaxed);
    }
    Ok(idempotency::replay(status, body.to_string()))
}

/// The status and body of a limited increment's outcome; the window's `last` as the
/// request spelled it.
fn limited_answer(outcome: &query::Limited, spelled: &str) -> (u16, serde_json::Value) {
    match outcome {
        query::Limited::Accepted(window) => {
            let window = spelled_as(window, spelled);
            (200, serde_json::json!({"accepted": 1, "window": window}))
        }
        query::Limited::Refused {
            window,
            max,
            retry_after,
        } => {
            let window = &spelled_as(window, spelled);
            let when = match retry_after {
                Some(s) => format!("retry in {s} s"),
                None => "this increment alone is over the limit".to_owned(),
            };
            (
                429,
                serde_json::json!({"error": {
                    "code": ErrorCode::LimitExceeded.as_str(),
                    "message": format!(
                        "{} of {max} in the last {} already; {when}",
                        window.n, window.last
                    ),
                    "count": window.n,
                    "max": max,
                    "retry_after": retry_after,
                    "window": window,
                }}),
            )
        }
    }
}

/// A window count whose `last` is as the request spelled it (`24h`, not `1d`: SPEC §3).
fn spelled_as(window: &query::WindowCount, spelled: &str) -> query::WindowCount {
    query::WindowCount {
        last: spelled.to_owned(),
        ..window.clone()
    }
}

/// Whether the body is NDJSON: `Content-Type: application/x-ndjson`, the media type matched
/// without regard to case and its parameters (`; charset=utf-8`) ignored, as RFC 9110 says.
pub(crate) fn is_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/x-ndjson"))
}

/// `incr`'s event refused: named by the parameter at fault, as a bad `n=abc` is, not as
/// "event 0" of a batch (found by a review: `n=2^53` answered `index: 0`).
fn incr_refused(e: ingest::IngestError) -> ApiError {
    use tally_core::model::ModelError as M;
    let ingest::IngestError::Event { source, .. } = e else {
        return match e {
            ingest::IngestError::UnknownNamespace { ns, .. } => ApiError::new(
                ErrorCode::UnknownNamespace,
                format!("namespace {ns} does not exist (auto_create is off)"),
            ),
            ingest::IngestError::TooManyNamespaces { ns, max, .. } => ApiError::new(
                ErrorCode::TooManyNamespaces,
                ingest::too_many_namespaces(&ns, max),
            )
            .field("ns"),
            other => other.into(),
        };
    };
    let field = match &source {
        M::InvalidAmount { .. } => Some("n".to_owned()),
        M::InvalidTimestamp { .. } | M::TimestampInFuture { .. } => Some("ts".to_owned()),
        M::UnknownDimension { name } => Some(format!("dim.{name}")),
        M::InvalidName { .. } => Some("ns".to_owned()),
        M::InvalidKey { .. } => Some("key".to_owned()),
        // The `dim.<name>` parameters together.
        M::TooManyDimensions { .. } => Some("dim".to_owned()),
        _ => None,
    };
    let a = ApiError::from(source);
    match field {
        Some(f) => a.field(f),
        None => a,
    }
}

/// Increment one key from query parameters.
#[utoipa::path(post, path = "/v1/ns/{ns}/keys/{key}/incr", tag = "events",
    description = "One event from query parameters `n` (default 1), `ts` (default now), `dim.<name>=<value>`. `window=<duration>` adds the rolling count after the increment; with `max=<n>` too, the increment happens only if that count stays at most `max`, atomically, else `429 limit_exceeded` (count, max, retry_after and a Retry-After header) and nothing is counted; a limited increment's `ts` must fall inside the window (else `400 invalid_parameter`).",
    params(
        ("ns" = String, Path), ("key" = String, Path, description = "percent-encoded"),
        ("n" = Option<i64>, Query), ("ts" = Option<String>, Query), ("window" = Option<String>, Query),
        ("max" = Option<i64>, Query, description = "with window: count only if the window stays at most max, else 429 limit_exceeded; ts, if given, must fall inside the window"),
        ("Idempotency-Key" = Option<String>, Header),
    ),
    responses((status = 200, description = "`{\"accepted\": 1}` or `{\"accepted\": 1, \"window\": {...}}`"), (status = 400, description = "invalid input"),
        (status = 422, description = "idempotency_key_reused, too_many_namespaces (a namespace created past `[limits] max_namespaces`)"),
        (status = 429, description = "limit_exceeded: with max, the window would pass it; nothing counted"),
        (status = 503, description = "backend_unavailable, or with max: the window moved on while the increment waited for its key's other limited increments, four times; nothing counted")))]
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
    let mut max = None;
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
                raw.ts = Some(query::timestamp_plus(v).map_err(|e| ApiError::from(e).field("ts"))?)
            }
            "window" => {
                window = Some((
                    Duration::new(v).map_err(|e| ApiError::from(e).field("window"))?,
                    v.clone(),
                ))
            }
            "max" => max = Some(parse_max(v)?),
            _ => match k.strip_prefix("dim.") {
                Some(d) => {
                    // Checked as it is read, so that a bad name or value is named by its
                    // parameter (the strings the event takes are the ones checked).
                    let named = |e| ApiError::from(e).field(k.clone());
                    let name = model::DimName::from_string(d.to_owned()).map_err(named)?;
                    let value = model::DimValue::from_string(v.clone()).map_err(named)?;
                    raw.dims.push((name.into_string(), value.into_string()));
                }
                None => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidParameter,
                        format!(
                            "unknown parameter {k:?} (incr takes n, ts, window, max, dim.<name>)"
                        ),
                    )
                    .field(k.clone()));
                }
            },
        }
    }
    let limited = match (max, &window) {
        (Some(max), Some(last)) => Some((last.clone(), max)),
        (Some(_), None) => {
            return Err(ApiError::new(
                ErrorCode::MissingParameter,
                "max limits the count over a window: give window too (e.g. window=1m&max=100)",
            )
            .field("window"));
        }
        (None, _) => None,
    };
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
    // The key stays claimed until the store is done (see `post_events`).
    if let Some((last, max)) = limited {
        return app
            .blocking(move |app| {
                let _held = held;
                apply_limited(app, raw, idem, (last.0, &last.1), max)
            })
            .await;
    }
    let body = app
        .blocking(move |app| {
            let _held = held;
            apply(app, vec![raw], idem, incr_refused, |app, batch| {
                let window = match &window {
                    Some((last, spelled)) => Some(spelled_as(
                        &query::window_after(app.store().as_ref(), app.now(), batch, *last)?,
                        spelled,
                    )),
                    None => None,
                };
                Ok(Accepted {
                    accepted: 1,
                    window,
                })
            })
        })
        .await?;
    Ok(Json(body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Found by a review: the same request under one `Idempotency-Key`, sent to two servers
    /// sharing a Redis at once, was decided by both; the second saw the first's increment
    /// in the window and answered `429`, though its request had been counted. Here the
    /// second decision runs after the first under the same ticket (as on the second
    /// server): it answers the stored `200`, marked replayed, and counts nothing more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_decided_twice_answers_what_was_stored_first() {
        const NOW: i64 = 1_795_176_000;
        let clock = Arc::new(tally_core::store::ManualClock::new(NOW));
        let store = Arc::new(tally_core::reference::MemStore::new(clock.clone()));
        let app = App::new(store, crate::config::Settings::default(), clock);
        let mut headers = HeaderMap::new();
        headers.insert(idempotency::HEADER, "rk1".parse().unwrap());
        let Idem::Proceed(Some(held)) = idempotency::begin(&app, &headers, "fp".into())
            .await
            .unwrap()
        else {
            panic!("a first use proceeds");
        };
        let raw = RawEvent {
            ns: "rl".into(),
            key: "k".into(),
            ts: None,
            n: Some(1),
            dims: Vec::new(),
        };
        let hour = Duration::new("1h").unwrap();
        let decide = |app: App, ticket: Ticket, raw: RawEvent| {
            tokio::task::spawn_blocking(move || {
                apply_limited(&app, raw, Some(ticket), (hour, "1h"), 1).map(|r| {
                    (
                        r.status().as_u16(),
                        r.headers().contains_key("idempotent-replayed"),
                    )
                })
            })
        };
        let first = decide(app.clone(), held.ticket(), raw.clone())
            .await
            .unwrap();
        assert_eq!(first.unwrap(), (200, false));
        let second = decide(app.clone(), held.ticket(), raw).await.unwrap();
        assert_eq!(second.unwrap(), (200, true), "the stored answer, not 429");
    }

    #[test]
    fn dry_run_is_true_or_false_once() {
        assert_eq!(dry_run(None), Ok(false));
        assert_eq!(dry_run(Some("")), Ok(false));
        assert_eq!(dry_run(Some("dry_run=true")), Ok(true));
        // Another parameter, or dry_run not given once as true or false.
        for bad in [
            "other=1&dry_run=false",
            "dryrun=true",
            "dry-run=true",
            "n=1",
            "dry_run",
            "dry_run=",
            "dry_run=1",
            "dry_run=TRUE",
            "dry_run=yes",
            "dry_run=true&dry_run=true",
            "dry_run=%zz",
        ] {
            let e = dry_run(Some(bad)).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParameter, "{bad}");
        }
        assert_eq!(
            dry_run(Some("dry_run=maybe")).unwrap_err().field.as_deref(),
            Some("dry_run")
        );
    }

    #[test]
    fn the_ndjson_media_type_is_matched_without_case_or_parameters() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(axum::http::header::CONTENT_TYPE, v.parse().unwrap());
            is_ndjson(&h)
        };
        for yes in [
            "application/x-ndjson",
            "Application/X-NDJSON",
            "application/x-ndjson; charset=utf-8",
            " application/x-ndjson ;charset=UTF-8",
        ] {
            assert!(with(yes), "{yes}");
        }
        for no in ["application/json", "application/x-ndjsonx", "text/plain"] {
            assert!(!with(no), "{no}");
        }
        assert!(!is_ndjson(&HeaderMap::new()));
    }
}

//! Writes: `POST /v1/events` (JSON array or NDJSON) and `POST /v1/ns/{ns}/keys/{key}/incr`,
//! both all-or-nothing, both honouring `Idempotency-Key`.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use serde_json::Value;
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

fn malformed(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::MalformedBody, msg)
}

/// One event object of a request body.
fn raw_event(v: &Value) -> Result<RawEvent, ApiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| malformed("each event is a JSON object"))?;
    if let Some(k) = obj
        .keys()
        .find(|k| !["ns", "key", "ts", "n", "dims"].contains(&k.as_str()))
    {
        return Err(malformed(format!(
            "unknown field {k:?} (an event has ns, key, ts, n, dims)"
        ))
        .field(k.clone()));
    }
    let string = |name: &str| match obj.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(malformed(format!("{name} must be a string")).field(name)),
        None => Err(malformed(format!("{name} is required")).field(name)),
    };
    let ts = match obj.get("ts") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            Some(model::parse_timestamp(s).map_err(|e| ApiError::from(e).field("ts"))?)
        }
        Some(Value::Number(n)) => Some(n.as_i64().ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidTimestamp,
                format!("ts {n} is not whole unix seconds"),
            )
            .field("ts")
        })?),
        Some(_) => {
            return Err(malformed("ts must be unix seconds or an RFC 3339 string").field("ts"));
        }
    };
    let n = match obj.get("n") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_i64().ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidAmount,
                format!("n {n} is not an integer with |n| < 2^53"),
            )
            .field("n")
        })?),
        Some(_) => {
            return Err(
                ApiError::new(ErrorCode::InvalidAmount, "n must be a JSON integer").field("n"),
            );
        }
    };
    let dims = match obj.get("dims") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(ApiError::new(
                    ErrorCode::InvalidDimension,
                    format!("dimension {k:?}: a value is a string"),
                )
                .field("dims")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(malformed("dims must be an object of strings").field("dims")),
    };
    Ok(RawEvent {
        ns: string("ns")?,
        key: string("key")?,
        ts,
        n,
        dims,
    })
}

/// An event as well-formed bodies send it, deserialised straight from the bytes: no JSON
/// value tree, strings borrowed where they have no escapes. Anything this does not accept
/// goes to the [`raw_event`] path, which names the exact error.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FastEvent<'a> {
    #[serde(borrow)]
    ns: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    key: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    ts: Option<FastTs<'a>>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default, borrow)]
    dims: Option<FastDims<'a>>,
}

enum FastTs<'a> {
    Secs(i64),
    Text(std::borrow::Cow<'a, str>),
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for FastTs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastTs<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("unix seconds or an RFC 3339 string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(FastTs::Secs(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(FastTs::Secs)
                    .map_err(|_| E::custom("out of range"))
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(FastTs::Text(v.into()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FastTs::Text(v.to_owned().into()))
            }
        }
        d.deserialize_any(V)
    }
}

struct FastDims<'a>(Vec<(std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for FastDims<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastDims<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(2));
                while let Some(kv) = m.next_entry()? {
                    out.push(kv);
                }
                Ok(FastDims(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl FastEvent<'_> {
    fn into_raw(self) -> Result<RawEvent, ApiError> {
        let ts = match self.ts {
            None => None,
            Some(FastTs::Secs(s)) => Some(s),
            Some(FastTs::Text(t)) => {
                Some(model::parse_timestamp(&t).map_err(|e| ApiError::from(e).field("ts"))?)
            }
        };
        Ok(RawEvent {
            ns: self.ns.into_owned(),
            key: self.key.into_owned(),
            ts,
            n: self.n,
            dims: self
                .dims
                .map(|d| {
                    d.0.into_iter()
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// The fast path over a whole body; `None` sends the body to the exact-error path.
fn parse_fast(body: &[u8], ndjson: bool) -> Option<Vec<Result<RawEvent, ApiError>>> {
    if ndjson {
        let text = std::str::from_utf8(body).ok()?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<FastEvent<'_>>(l)
                    .ok()
                    .map(FastEvent::into_raw)
            })
            .collect()
    } else {
        let events: Vec<FastEvent<'_>> = serde_json::from_slice(body).ok()?;
        Some(events.into_iter().map(FastEvent::into_raw).collect())
    }
}

/// The events of a body: a JSON array, or NDJSON (blank lines ignored).
fn parse_body(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
    if let Some(events) = parse_fast(body, ndjson) {
        if events.len() > max {
            return Err(ApiError::new(
                ErrorCode::BatchTooLarge,
                format!("a batch holds at most {max} events, got {}", events.len()),
            ));
        }
        return events
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.map_err(|e| e.index(i)))
            .collect();
    }
    parse_slow(body, ndjson, max)
}

/// The exact-error path: every event through a JSON value, checked field by field.
fn parse_slow(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
    let too_many = |n: usize| {
        ApiError::new(
            ErrorCode::BatchTooLarge,
            format!("a batch holds at most {max} events, got {n}"),
        )
    };
    if ndjson {
        let text = std::str::from_utf8(body).map_err(|_| malformed("the body is not UTF-8"))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.len() > max {
            return Err(too_many(lines.len()));
        }
        return lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let v: Value = serde_json::from_str(l)
                    .map_err(|e| malformed(format!("line is not JSON: {e}")).index(i))?;
                raw_event(&v).map_err(|e| e.index(i))
            })
            .collect();
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| malformed(format!("the body is not JSON: {e}")))?;
    let items = v.as_array().ok_or_else(|| malformed("the body is a JSON array of events (or NDJSON with Content-Type: application/x-ndjson)"))?;
    if items.len() > max {
        return Err(too_many(items.len()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| raw_event(v).map_err(|e| e.index(i)))
        .collect()
}

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
    let raws = parse_body(&bytes, ndjson, app.settings().limits.max_batch_events)?;
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

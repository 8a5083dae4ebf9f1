//! Admission: what a request must pass before a handler sees it, cheapest first, so that a
//! request that will be refused costs little and a slow client holds nothing scarce.
//!
//! 1. **Size of the head**, after authentication for `/v1` routes (3. below: a request
//!    without a known token is 401 before anything else is looked at): a request target
//!    over [`MAX_URI_BYTES`] is `414 uri_too_long`;
//!    more than [`MAX_HEADER_FIELDS`] header fields or [`MAX_HEADER_BYTES`] of them is
//!    `431 headers_too_large` — JSON, like every error. (Heads hyper refuses itself — past
//!    64 KiB of target, its ~400 KiB read buffer or 1,024 fields, or not HTTP/1.1 at all —
//!    never reach us: `bare::JsonBare` gives its empty answers the same JSON.) Then, for
//!    `/v1` routes, the head's form: a malformed percent-escape in the path is
//!    `400 invalid_parameter` (axum would read it as text), and a `Content-Encoding` other
//!    than `identity`, or a `Transfer-Encoding` other than `chunked`, is
//!    `400 malformed_body` (no coding is taken).
//! 2. Routes outside `/v1` (`/healthz`, `/metrics`, `/openapi.json`, the dashboard) go
//!    straight on: they read no body and take no permit, so a flood of `/v1` traffic
//!    cannot hide the server's health.
//! 3. **Authentication** of `/v1` routes when tokens are configured: a request without a
//!    known token is `401 unauthorized` before its body is read (SPEC §3).
//! 4. **The body** is read here, whole: at most `max_body_bytes` (a larger
//!    `Content-Length` is refused before buffering, a longer stream as soon as it passes the
//!    limit: `413 body_too_large`; what is left of it is read and thrown away, up to four times
//!    the limit (64 MiB to 1 GiB) within `body_timeout_ms`, so that the client, still
//!    sending, reads the answer; a client waiting for `100 Continue` whose declared length is
//!    already too long is answered at once, unread), within
//!    `body_timeout_ms` (`408 request_timeout`); a body
//!    cut off mid-way is `400 malformed_body`. Every byte is charged, as it arrives, to a
//!    budget of `max_body_bytes_in_flight` shared by all requests and released when the
//!    answer is ready; a request that would pass it is `503 backend_unavailable` with
//!    `Retry-After: 1` — the server is short of memory for the moment, the body is not at
//!    fault, so not 413 — and what is left of it is thrown away as for a 413, so that its
//!    client reads the answer. A stalled upload thus holds only the bytes it sent.
//! 5. Only then a **permit of its route class**: writes (`POST /v1/events`, `incr`) share
//!    `max_concurrent_writes`, queries (series, breakdown, window, dashboard, top, keys,
//!    export, `POST /v1/query`) `max_concurrent_queries`, the other `/v1` routes (schemas,
//!    admin) [`OTHER_V1_PERMITS`]. A request waits for its permit holding its body but no
//!    socket read, and one class's flood cannot starve another. A query's
//!    `query_timeout_ms` counts from here, its wait for a permit included ([`QUEUED_AT`]):
//!    one still waiting when it passes is `503 query_timeout`, and one that gets its permit
//!    runs for what is left of it.
//!
//! 6. **A query's answer**, once built, is charged to a budget of
//!    `max_answer_bytes_in_flight` shared by all queries and released when its client has
//!    taken it (or gone): a client that reads nothing holds its answer until
//!    `idle_timeout_ms` cuts it off, so without the budget every connection could hold
//!    one. An answer that would pass it is `503 backend_unavailable` with `Retry-After: 1`
//!    (one larger than the whole budget takes all of it). Only queries: a write's answer
//!    is small and its work done, so it is never turned into a 503 a client would retry.
//!    Streamed answers (exports) have their own bounds. What hyper has taken into its
//!    write buffer is not charged: at most 16 frames of [`crate::body::CHUNK`] bytes a
//!    connection.
//!
//! The handler gets the buffered body; its own `read_body` then costs no I/O.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tally_core::ErrorCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::app::App;
use crate::auth;
use crate::error::ApiError;

/// The longest request target (path and query) taken.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// The most header bytes (names, values and their separators) taken.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// The most header fields taken.
pub const MAX_HEADER_FIELDS: usize = 256;
/// `/v1` requests that are neither writes nor queries (schemas, admin) served at once.
pub const OTHER_V1_PERMITS: usize = 16;

/// The shared state of admission: the permits of each route class and the body budget.
#[derive(Debug)]
pub(crate) struct Admission {
    app: App,
    writes: Arc<Semaphore>,
    queries: Arc<Semaphore>,
    other: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    answers: Arc<Semaphore>,
    /// The permits `answers` has in all.
    answer_budget: usize,
}

/// Which permits a route takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Write,
    Query,
    OtherV1,
    /// Outside `/v1`: no authentication, no body, no permit.
    Free,
}

tokio::task_local! {
    /// When the request being handled began to wait for its permit: a query's
    /// `query_timeout_ms` counts from here ([`crate::app::App::query`]).
    pub(crate) static QUEUED_AT: tokio::time::Instant;
}

impl Admission {
    pub(crate) fn new(app: App) -> Admission {
        let l = app.settings().server;
        Admission {
            writes: Arc::new(Semaphore::new(l.max_concurrent_writes)),
            queries: Arc::new(Semaphore::new(l.max_concurrent_queries)),
            other: Arc::new(Semaphore::new(OTHER_V1_PERMITS)),
            bytes: Arc::new(Semaphore::new(
                l.max_body_bytes_in_flight.min(Semaphore::MAX_PERMITS),
            )),
            answers: Arc::new(Semaphore::new(answer_budget(&l))),
            answer_budget: answer_budget(&l),
            app,
        }
    }

    async fn admit(&self, req: Request, next: Next) -> Result<Response, ApiError> {
        let class = class(req.method(), req.uri().path());
        // A /v1 request without a known token is 401 before anything else is looked at
        // (SPEC §3), its head's size included: the look-up reads one header hyper parsed.
        if class != Class::Free {
            auth::caller(&self.app.settings().tokens, req.headers())?;
        }
        check_head(&req)?;
        if class == Class::Free {
            return Ok(next.run(req).await);
        }
        let (parts, body) = req.into_parts();
        let (bytes, held) = self.read(&parts.headers, body).await?;
        let pool = match class {
            Class::Write => &self.writes,
            Class::Query => &self.queries,
            Class::OtherV1 | Class::Free => &self.other,
        };
        let closed =
            |_| ApiError::new(ErrorCode::BackendUnavailable, "the server is shutting down");
        let queued_at = tokio::time::Instant::now();
        let permit = match class {
            Class::Query => {
                let ms = self.app.settings().server.query_timeout_ms;
                let wait = Duration::from_millis(ms);
                match tokio::time::timeout(wait, pool.clone().acquire_owned()).await {
                    Ok(permit) => permit.map_err(closed)?,
                    Err(_) => {
                        return Err(ApiError::new(
                            ErrorCode::QueryTimeout,
                            format!(
                                "the query waited {ms} ms for its turn ([limits] \
                                 max_concurrent_queries run at once) and ran past \
                                 [limits] query_timeout_ms"
                            ),
                        ));
                    }
                }
            }
            _ => pool.clone().acquire_owned().await.map_err(closed)?,
        };
        let run = next.run(Request::from_parts(parts, Body::from(bytes)));
        // Only a query's time counts its wait (a write's must never turn into a timeout
        // after it was applied).
        let resp = match class {
            Class::Query => QUEUED_AT.scope(queued_at, run).await,
            _ => run.await,
        };
        drop((permit, held));
        // Only a query's answer: a write's, a schema change's or an admin answer's is small,
        // and its work is done — it must not become a 503 its client would retry.
        match class {
            Class::Query => self.charge(resp),
            _ => Ok(resp),
        }
    }

    /// Charges a built answer's bytes to the `max_answer_bytes_in_flight` budget until its
    /// client has taken it (or gone): one that would pass it is `503`, its bytes dropped.
    /// Streamed answers (an export: no exact size) are bounded by their own rules.
    fn charge(&self, resp: Response) -> Result<Response, ApiError> {
        let Some(len) = axum::body::HttpBody::size_hint(resp.body()).exact() else {
            return Ok(resp);
        };
        if len == 0 {
            return Ok(resp);
        }
        // An answer larger than the whole budget takes all of it: it goes out when nothing
        // else waits, rather than never.
        let n = len.min(self.answer_budget as u64);
        let held = u32::try_from(n)
            .ok()
            .and_then(|n| self.answers.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::BackendUnavailable,
                    format!(
                        "answers not yet taken by their clients hold the server's memory for \
                         them ([limits] max_answer_bytes_in_flight); this one ({len} bytes) \
                         waits for none: try again shortly"
                    ),
                )
            })?;
        let (parts, body) = resp.into_parts();
        Ok(Response::from_parts(
            parts,
            Body::new(crate::body::Holding::chunked(body, held)),
        ))
    }

    /// The whole body, and its charge to the budget.
    async fn read(
        &self,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<(Bytes, Option<OwnedSemaphorePermit>), ApiError> {
        let limit = self.app.settings().limits.max_body_bytes;
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let ms = self.app.settings().server.body_timeout_ms;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
        // A client that waits for `100 Continue` sends nothing before an answer: it gets the
        // 413 at once (reading its body would ask for it). Others are drained, up to a cap.
        let cap = limit
            .saturating_mul(4)
            .clamp(DRAIN_MIN_BYTES, DRAIN_MAX_BYTES);
        let drains = !headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if declared.is_some_and(|n| n > limit as u64) {
            if drains && declared.is_some_and(|n| n <= cap as u64) {
                drain(body, cap, deadline).await;
            }
            return Err(too_large(limit));
        }
        match tokio::time::timeout_at(deadline, self.collect(body, limit)).await {
            Ok(Ok(Collected::Whole(bytes, held))) => Ok((bytes, held)),
            // Reading the body has asked a client waiting for `100 Continue` to send it (hyper
            // answers `100` at the first read): from here on every client is drained.
            Ok(Ok(Collected::Over(rest))) => {
                drain(rest, cap, deadline).await;
                Err(too_large(limit))
            }
            // The budget is memory: what is left is read and thrown away (holding none), so
            // a client still sending reads the 503 and its `Retry-After` rather than a reset.
            Ok(Ok(Collected::Busy(rest))) => {
                drain(rest, cap, deadline).await;
                Err(ApiError::new(
                    ErrorCode::BackendUnavailable,
                    "the server holds as many request bodies as it may \
                     ([limits] max_body_bytes_in_flight); try again shortly",
                ))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ApiError::new(
                ErrorCode::RequestTimeout,
                format!("the body did not arrive within {ms} ms ([limits] body_timeout_ms)"),
            )),
        }
    }

    async fn collect(&self, mut body: Body, limit: usize) -> Result<Collected, ApiError> {
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut total = 0usize;
        let mut held: Option<OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(cut_off)?.into_data() else {
                continue; // trailers
            };
            if data.is_empty() {
                continue;
            }
            total += data.len();
            if total > limit {
                return Ok(Collected::Over(body));
            }
            let Some(charge) = u32::try_from(data.len())
                .ok()
                .and_then(|n| self.bytes.clone().try_acquire_many_owned(n).ok())
            else {
                // What this body charged goes back as it is dropped, here.
                return Ok(Collected::Busy(body));
            };
            match &mut held {
                Some(h) => h.merge(charge),
                None => held = Some(charge),
            }
            chunks.push(data);
        }
        let bytes = match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.swap_remove(0),
            _ => {
                let mut all = Vec::with_capacity(total);
                for c in &chunks {
                    all.extend_from_slice(c);
                }
                Bytes::from(all)
            }
        };
        Ok(Collected::Whole(bytes, held))
    }
}

/// A body read whole (and its charge to the budget), or the rest of one past the limit, or
/// of one past `max_body_bytes_in_flight`.
enum Collected {
    Whole(Bytes, Option<OwnedSemaphorePermit>),
    Over(Body),
    Busy(Body),
}

/// Bytes of a refused body read and thrown away at most, so that its client, still
/// sending, reads the `413` instead of losing it to a reset connection (a review found
/// `tally load` saying "cannot reach the server: Broken pipe" for a body too large): four
/// times `max_body_bytes`, within these bounds. A longer body is cut off as before.
const DRAIN_MIN_BYTES: usize = 64 << 20;
const DRAIN_MAX_BYTES: usize = 1 << 30;

/// Reads what is left of a refused body and throws it away, until it ends, passes `cap`
/// bytes or `deadline` (the body's own timeout) passes. Holds no memory.
async fn drain(mut body: Body, cap: usize, deadline: tokio::time::Instant) {
    let rest = async {
        let mut total = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            total += frame.data_ref().map_or(0, Bytes::len);
            if total > cap {
                break;
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline, rest).await;
}

/// The permits of the answer budget: `max_answer_bytes_in_flight`, within what one
/// `try_acquire_many` can take at once.
fn answer_budget(l: &crate::config::ServerLimits) -> usize {
    l.max_answer_bytes_in_flight
        .min(Semaphore::MAX_PERMITS)
        .min(u32::MAX as usize)
}

/// The middleware: see the module doc. Refusals that leave a body unread close the
/// connection, so no byte of it is taken for the next request.
pub(crate) async fn admit(admission: Arc<Admission>, req: Request, next: Next) -> Response {
    match admission.admit(req, next).await {
        Ok(r) => r,
        Err(e) => {
            let retry = e.code == ErrorCode::BackendUnavailable;
            let mut r = e.into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            if retry {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            r
        }
    }
}

fn check_head(req: &Request) -> Result<(), ApiError> {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return Err(ApiError::new(
            ErrorCode::UriTooLong,
            format!("the request target is {target} bytes; at most {MAX_URI_BYTES} are taken"),
        ));
    }
    let fields = req.headers().len();
    let bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if fields > MAX_HEADER_FIELDS || bytes > MAX_HEADER_BYTES {
        return Err(ApiError::new(
            ErrorCode::HeadersTooLarge,
            format!(
                "the request has {fields} header fields in {bytes} bytes; at most \
                 {MAX_HEADER_FIELDS} fields in {MAX_HEADER_BYTES} bytes are taken"
            ),
        ));
    }
    // The API's own checks: routes outside `/v1` keep only the size bounds above.
    let path = req.uri().path().as_bytes();
    if !(path.starts_with(b"/v1/") || path == b"/v1") {
        return Ok(());
    }
    // Axum decodes a malformed escape (`%G1`) as the text it is, so `%G1` and `%25G1` would
    // name one key; a query string's is refused, and so is a path's.
    if let Some(at) = path.iter().enumerate().position(|(i, &b)| {
        b == b'%'
            && !path
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    }) {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!(
                "the path has a malformed percent-escape at byte {at}: a % is followed by two hex digits (%25 for a % itself)"
            ),
        ));
    }
    // A compressed body would be read as the bytes it is (a gzip body as "not JSON", a
    // `br` label on plain JSON accepted): no coding is taken, so one is refused by name. The
    // same for a transfer coding: hyper takes the `chunked` framing off and hands over what
    // is under it, compressed or not.
    for (name, said, plain, hint) in [
        (header::CONTENT_ENCODING, "Content-Encoding", "identity", ""),
        (
            header::TRANSFER_ENCODING,
            "Transfer-Encoding",
            "chunked",
            " (chunked alone is fine)",
        ),
    ] {
        if let Some(coding) = req
            .headers()
            .get_all(&name)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(str::trim)
            .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(plain))
        {
            return Err(ApiError::new(
                ErrorCode::MalformedBody,
                format!("{said} {coding:?} is not taken: send the body uncompressed{hint}"),
            ));
        }
    }
    Ok(())
}

fn class(method: &Method, path: &str) -> Class {
    let Some(rest) = path.strip_prefix("/v1/") else {
        return if path == "/v1" {
            Class::OtherV1
        } else {
            Class::Free
        };
    };
    let read = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        ["events"] | ["ns", _, "keys", _, "incr"] if post => Class::Write,
        ["query"] if post => Class::Query,
        [
            "ns",
            _,
            "keys",
            _,
            "series" | "breakdown" | "window" | "dashboard",
        ]
        | ["ns", _, "top" | "keys" | "export"]
            if read =>
        {
            Class::Query
        }
        _ => Class::OtherV1,
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("the body is larger than {limit} bytes ([limits] max_body_bytes)"),
    )
}

/// A body that ended early: the client closed the connection, or broke the chunking.
fn cut_off(e: axum::Error) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
        {
            return ApiError::new(
                ErrorCode::MalformedBody,
                "the connection closed mid-body: the body ended before its Content-Length",
            );
        }
        source = s.source();
    }
    ApiError::new(
        ErrorCode::MalformedBody,
        format!("the body could not be read: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_fall_into_their_class() {
        let (get, post, put) = (Method::GET, Method::POST, Method::PUT);
        for (m, p, c) in [
            (&post, "/v1/events", Class::Write),
            (&post, "/v1/ns/c/keys/a%2Fb/incr", Class::Write),
            (&get, "/v1/ns/c/keys/k/series", Class::Query),
            (&get, "/v1/ns/c/keys/k/dashboard", Class::Query),
            (&get, "/v1/ns/c/top", Class::Query),
            (&get, "/v1/ns/c/keys", Class::Query),
            (&post, "/v1/query", Class::Query),
            (&get, "/v1/ns", Class::OtherV1),
            (&put, "/v1/ns/c", Class::OtherV1),
            (&post, "/v1/admin/compact", Class::OtherV1),
            (&get, "/v1/events", Class::OtherV1),
            (&get, "/healthz", Class::Free),
            (&get, "/metrics", Class::Free),
            (&get, "/", Class::Free),
            (&get, "/ui/app.js", Class::Free),
            (&get, "/v1x", Class::Free),
        ] {
            assert_eq!(class(m, p), c, "{m} {p}");
        }
    }
}

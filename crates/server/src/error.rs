//! Every failure becomes `{"error": {"code", "message", "field"?, "index"?}}` with the status
//! SPEC §3 gives its code — in this one place.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tally_core::ErrorCode;
use tally_core::ingest::IngestError;
use tally_core::model::ModelError;
use tally_core::query::QueryError;
use tally_core::store::StoreError;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub field: Option<String>,
    pub index: Option<usize>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            field: None,
            index: None,
        }
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn index(mut self, index: usize) -> Self {
        self.index = Some(index);
        self
    }

    pub fn status(&self) -> StatusCode {
        status_of(self.code)
    }

    /// The `{"error": {...}}` value.
    pub fn to_json(&self) -> serde_json::Value {
        let mut e = serde_json::json!({ "code": self.code.as_str(), "message": self.message });
        if let Some(f) = &self.field {
            e["field"] = f.clone().into();
        }
        if let Some(i) = self.index {
            e["index"] = i.into();
        }
        serde_json::json!({ "error": e })
    }
}

/// The HTTP status SPEC §3 gives each code: the one table of them.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::MalformedBody
        | ErrorCode::MalformedRequest
        | ErrorCode::MissingParameter
        | ErrorCode::InvalidParameter
        | ErrorCode::InvalidName
        | ErrorCode::InvalidKey
        | ErrorCode::InvalidDimension
        | ErrorCode::UnknownDimension
        | ErrorCode::TooManyDimensions
        | ErrorCode::InvalidTimestamp
        | ErrorCode::TimestampInFuture
        | ErrorCode::InvalidAmount
        | ErrorCode::InvalidTimezone
        | ErrorCode::InvalidUnit
        | ErrorCode::InvalidRange
        | ErrorCode::InvalidDuration
        | ErrorCode::InvalidLimit
        | ErrorCode::InvalidSchema => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::UnknownNamespace | ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::IdempotencyInProgress => StatusCode::CONFLICT,
        ErrorCode::BodyTooLarge | ErrorCode::BatchTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::NoTierForRange
        | ErrorCode::TooManyPoints
        | ErrorCode::IdempotencyKeyReused
        | ErrorCode::TooManyNamespaces => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::BackendUnavailable | ErrorCode::QueryTimeout => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::CorruptData | ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorCode::UriTooLong => StatusCode::URI_TOO_LONG,
        ErrorCode::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ErrorCode::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// How often one kind of failure is logged at most: a failure that refuses every request (a
/// full disk, Redis gone) would otherwise write a line per request, as fast as clients
/// retry (found by a black-box review). The count left out is told at the kind's next line
/// (none if it never fails again).
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The kinds of failure [`Quiet`] tells apart at once; past this, the longest quiet is
/// forgotten.
const QUIET_KINDS: usize = 64;

/// Per kind of failure (its code and the start of its message, up to the first `:` — a
/// poisoned log and a failed request task are both `internal`), when it was last logged
/// and how many since were not.
#[derive(Debug, Default)]
struct Quiet(Vec<(ErrorCode, String, std::time::Instant, u64)>);

fn kind_of(message: &str) -> &str {
    let head = message.split_once(':').map_or(message, |(head, _)| head);
    let mut end = head.len().min(64);
    while !head.is_char_boundary(end) {
        end -= 1;
    }
    &head[..end]
}

impl Quiet {
    /// Whether a failure with `code` and `message` at `now` is logged, and if so how many
    /// of its kind were left out since its last line.
    fn admit(&mut self, code: ErrorCode, message: &str, now: std::time::Instant) -> Option<u64> {
        let kind = kind_of(message);
        match self
            .0
            .iter_mut()
            .find(|(c, k, _, _)| *c == code && k == kind)
        {
            Some((_, _, at, left_out)) if now.duration_since(*at) < LOG_EVERY => {
                *left_out += 1;
                None
            }
            Some((_, _, at, left_out)) => {
                *at = now;
                Some(std::mem::take(left_out))
            }
            None => {
                if self.0.len() >= QUIET_KINDS
                    && let Some(oldest) = (0..self.0.len()).min_by_key(|&i| self.0[i].2)
                {
                    self.0.swap_remove(oldest);
                }
                self.0.push((code, kind.to_owned(), now, 0));
                Some(0)
            }
        }
    }
}

fn log_failure(e: &ApiError) {
    // One for the process: servers in one process (tests) share it.
    static QUIET: std::sync::Mutex<Quiet> = std::sync::Mutex::new(Quiet(Vec::new()));
    let admitted = QUIET
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .admit(e.code, &e.message, std::time::Instant::now());
    match admitted {
        Some(0) => tracing::error!(code = %e.code, message = %e.message, "request failed"),
        Some(left_out) => tracing::error!(
            code = %e.code,
            message = %e.message,
            left_out,
            "request failed (and {left_out} more like it since the last line)"
        ),
        None => {}
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            log_failure(&self);
        }
        let mut response = (self.status(), Json(self.to_json())).into_response();
        if self.code == ErrorCode::Unauthorized {
            // RFC 9110 §11.6.1: a 401 names the scheme that would be accepted.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if self.code == ErrorCode::BackendUnavailable {
            // The store is down or short of room (Redis unreachable, a failed disk, answers
            // past max_idempotency_keys): the client may try again, not at once
            // (RFC 9110 §10.2.3), as admission's own 503s say.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        let message = match &e {
            QueryError::Store(s) => s.detail(),
            _ => e.to_string(),
        };
        let a = ApiError::new(e.code(), message);
        match e.field() {
            Some(f) => a.field(f),
            None => a,
        }
    }
}

impl From<ModelError> for ApiError {
    fn from(e: ModelError) -> Self {
        let a = ApiError::new(e.code(), e.to_string());
        match e.field() {
            Some(f) => a.field(f),
            None => a,
        }
    }
}

/// A backend failure's message carries its cause (the OS error of a failed fsync, the
/// damaged block of a segment), so an operator reading the answer or the log sees why.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::new(e.code(), e.detail())
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        let message = match &e {
            IngestError::Store(s) => s.detail(),
            _ => e.to_string(),
        };
        let mut a = ApiError::new(e.code(), message);
        if let Some(f) = event_field(&e) {
            a = a.field(f);
        }
        match e.index() {
            Some(i) => a.index(i),
            None => a,
        }
    }
}

/// The field of a batch's event at fault, as `error.field` names it (with `index`, the
/// event). `incr` names its query parameters instead (`events::incr_refused`).
fn event_field(e: &IngestError) -> Option<&'static str> {
    use ModelError as M;
    match e {
        IngestError::Event { source, .. } => match source {
            M::InvalidName { .. } => Some("ns"),
            M::InvalidKey { .. } => Some("key"),
            M::InvalidTimestamp { .. } | M::TimestampInFuture { .. } => Some("ts"),
            M::InvalidAmount { .. } => Some("n"),
            M::InvalidDimension { .. }
            | M::UnknownDimension { .. }
            | M::TooManyDimensions { .. } => Some("dims"),
            _ => None,
        },
        IngestError::UnknownNamespace { .. } | IngestError::TooManyNamespaces { .. } => Some("ns"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_kind_is_logged_once_a_second_with_the_count_left_out() {
        let mut q = Quiet::default();
        let t0 = std::time::Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let (unavailable, poisoned) = (
            ErrorCode::BackendUnavailable,
            "the write-ahead log is poisoned: No space left on device (os error 28)",
        );
        assert_eq!(q.admit(unavailable, poisoned, at(0)), Some(0));
        for ms in 1..500 {
            assert_eq!(q.admit(unavailable, poisoned, at(ms)), None);
        }
        // Another code, or another failure of the same code, has its own second.
        assert_eq!(q.admit(ErrorCode::Internal, poisoned, at(10)), Some(0));
        assert_eq!(
            q.admit(unavailable, "redis at 127.0.0.1:1: timed out", at(20)),
            Some(0)
        );
        assert_eq!(q.admit(unavailable, poisoned, at(1_000)), Some(499));
        assert_eq!(q.admit(unavailable, poisoned, at(2_500)), Some(0));
        // Kinds past QUIET_KINDS forget the quietest: the table stays small.
        for i in 0..200 {
            q.admit(ErrorCode::Internal, &format!("failure {i}"), at(3_000));
        }
        assert!(q.0.len() <= QUIET_KINDS);
    }

    #[test]
    fn every_code_has_an_error_status() {
        for code in ErrorCode::ALL {
            let s = status_of(code);
            assert!(s.is_client_error() || s.is_server_error(), "{code}: {s}");
        }
        assert_eq!(
            status_of(ErrorCode::NoTierForRange),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            status_of(ErrorCode::BackendUnavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}

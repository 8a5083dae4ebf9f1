//! The stable error codes of SPEC §3. Every error type in the core maps to exactly one code;
//! the server turns a code into an HTTP status (its `error` module), the CLI prints the message.

use std::fmt;

/// A stable, documented error code (`error.code` in an HTTP answer).
/// Deliberately exhaustive: the SPEC's codes are a closed set, and a new one must make the
/// server's status table (`tally_server`'s `error` module) fail to compile until it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    MalformedBody,
    /// A request whose head is not HTTP/1.1 (its request line or a header): 400.
    MalformedRequest,
    MissingParameter,
    InvalidParameter,
    InvalidName,
    InvalidKey,
    InvalidDimension,
    UnknownDimension,
    TooManyDimensions,
    InvalidTimestamp,
    TimestampInFuture,
    InvalidAmount,
    InvalidTimezone,
    InvalidUnit,
    InvalidRange,
    InvalidDuration,
    InvalidLimit,
    InvalidSchema,
    Unauthorized,
    Forbidden,
    UnknownNamespace,
    NotFound,
    IdempotencyInProgress,
    BodyTooLarge,
    BatchTooLarge,
    NoTierForRange,
    TooManyPoints,
    IdempotencyKeyReused,
    BackendUnavailable,
    CorruptData,
    Internal,
    MethodNotAllowed,
    QueryTimeout,
    /// A request body that did not arrive within `[limits] body_timeout_ms`: 408.
    RequestTimeout,
    /// A request target longer than the server takes: 414.
    UriTooLong,
    /// Request headers larger than the server takes: 431.
    HeadersTooLarge,
    /// A limited increment refused: its window is full (429).
    LimitExceeded,
    /// A write or `PUT` that would create a namespace past `[limits] max_namespaces`: 422.
    TooManyNamespaces,
}

impl ErrorCode {
    /// Every code, for tests and documentation.
    pub const ALL: [ErrorCode; 38] = [
        ErrorCode::MalformedBody,
        ErrorCode::MalformedRequest,
        ErrorCode::MissingParameter,
        ErrorCode::InvalidParameter,
        ErrorCode::InvalidName,
        ErrorCode::InvalidKey,
        ErrorCode::InvalidDimension,
        ErrorCode::UnknownDimension,
        ErrorCode::TooManyDimensions,
        ErrorCode::InvalidTimestamp,
        ErrorCode::TimestampInFuture,
        ErrorCode::InvalidAmount,
        ErrorCode::InvalidTimezone,
        ErrorCode::InvalidUnit,
        ErrorCode::InvalidRange,
        ErrorCode::InvalidDuration,
        ErrorCode::InvalidLimit,
        ErrorCode::InvalidSchema,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::UnknownNamespace,
        ErrorCode::NotFound,
        ErrorCode::IdempotencyInProgress,
        ErrorCode::BodyTooLarge,
        ErrorCode::BatchTooLarge,
        ErrorCode::NoTierForRange,
        ErrorCode::TooManyPoints,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::BackendUnavailable,
        ErrorCode::CorruptData,
        ErrorCode::Internal,
        ErrorCode::MethodNotAllowed,
        ErrorCode::QueryTimeout,
        ErrorCode::RequestTimeout,
        ErrorCode::UriTooLong,
        ErrorCode::HeadersTooLarge,
        ErrorCode::LimitExceeded,
        ErrorCode::TooManyNamespaces,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedBody => "malformed_body",
            ErrorCode::MalformedRequest => "malformed_request",
            ErrorCode::MissingParameter => "missing_parameter",
            ErrorCode::InvalidParameter => "invalid_parameter",
            ErrorCode::InvalidName => "invalid_name",
            ErrorCode::InvalidKey => "invalid_key",
            ErrorCode::InvalidDimension => "invalid_dimension",
            ErrorCode::UnknownDimension => "unknown_dimension",
            ErrorCode::TooManyDimensions => "too_many_dimensions",
            ErrorCode::InvalidTimestamp => "invalid_timestamp",
            ErrorCode::TimestampInFuture => "timestamp_in_future",
            ErrorCode::InvalidAmount => "invalid_amount",
            ErrorCode::InvalidTimezone => "invalid_timezone",
            ErrorCode::InvalidUnit => "invalid_unit",
            ErrorCode::InvalidRange => "invalid_range",
            ErrorCode::InvalidDuration => "invalid_duration",
            ErrorCode::InvalidLimit => "invalid_limit",
            ErrorCode::InvalidSchema => "invalid_schema",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::UnknownNamespace => "unknown_namespace",
            ErrorCode::NotFound => "not_found",
            ErrorCode::IdempotencyInProgress => "idempotency_in_progress",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::NoTierForRange => "no_tier_for_range",
            ErrorCode::TooManyPoints => "too_many_points",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::BackendUnavailable => "backend_unavailable",
            ErrorCode::CorruptData => "corrupt_data",
            ErrorCode::Internal => "internal",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::QueryTimeout => "query_timeout",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::TooManyNamespaces => "too_many_namespaces",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "duplicate code {s}");
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
        }
    }
}

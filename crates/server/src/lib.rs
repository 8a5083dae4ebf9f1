//! tally's HTTP API (SPEC §3) over any [`Store`](tally_core::store::Store): routes,
//! authentication, errors mapped to statuses in one place, idempotency keys, metrics and the
//! OpenAPI document — which is generated from the route handlers themselves, so it cannot
//! drift from them.
//!
//! This file only names the modules and the public API; each module says what it owns.

// The workspace denies `unsafe`; only the engine has a site that allows it.
#![forbid(unsafe_code)]

mod admission;
mod app;
mod auth;
mod bare;
mod body;
pub mod config;
mod dashboard;
mod error;
mod events;
mod export;
mod idempotency;
mod json;
mod listen;
mod metrics;
mod openapi;
mod ops;
mod params;
mod queries;
mod rebuild;
mod router;
mod schemas;
pub mod statsd;
pub mod tls;

pub use admission::{MAX_HEADER_BYTES, MAX_HEADER_FIELDS, MAX_URI_BYTES, OTHER_V1_PERMITS};
/// `POST /v1/events`' body parser (a JSON array, or NDJSON), as the route runs it, with at
/// most `max` events: `tally load` reads NDJSON lines with it, so a line loads exactly when
/// the route would take it.
pub fn parse_events(
    body: &[u8],
    ndjson: bool,
    max: usize,
) -> Result<Vec<tally_core::model::RawEvent>, ApiError> {
    events::parse::parse_body(body, ndjson, max)
}

/// Entry points for the fuzz targets in `fuzz/`: thin wrappers over private parsers, so
/// the fuzzers test the code the routes run. Not an API: it may change at any time.
#[doc(hidden)]
pub mod fuzzing {
    use std::collections::BTreeMap;

    use tally_core::model::RawEvent;

    use crate::error::ApiError;
    use crate::{events, params};

    /// `POST /v1/events`'s body parser: what the route answers.
    pub fn parse_events(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
        events::parse::parse_body(body, ndjson, max)
    }

    /// Its fast path alone: `None` when it cannot read the body, `Some(Err(n))` for a body
    /// of `n` events, more than `max`.
    pub fn parse_events_fast(
        body: &[u8],
        ndjson: bool,
        max: usize,
    ) -> Option<Result<Vec<Result<RawEvent, ApiError>>, usize>> {
        events::parse::parse_fast(body, ndjson, max)
    }

    /// Its exact-error path alone.
    pub fn parse_events_slow(
        body: &[u8],
        ndjson: bool,
        max: usize,
    ) -> Result<Vec<RawEvent>, ApiError> {
        events::parse::parse_slow(body, ndjson, max)
    }

    /// A query string's pairs, in order, decoded.
    pub fn query_pairs(q: &str) -> Result<Vec<(String, String)>, ApiError> {
        params::pairs(q)
    }

    /// A query string's parameters by name, each given at most once.
    pub fn query_unique(q: Option<&str>) -> Result<BTreeMap<String, String>, ApiError> {
        params::unique(q)
    }
}

pub use app::App;

/// The most bytes `tally` reads of a configuration file, a certificate or a key: far more
/// than any holds, so that a wrong path (`/dev/zero`, a log) is an error, not gigabytes.
pub const MAX_SETTINGS_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Reads a settings file whole, refusing one past [`MAX_SETTINGS_FILE_BYTES`] (read no
/// further than that).
pub fn read_settings_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_SETTINGS_FILE_BYTES + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > MAX_SETTINGS_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_SETTINGS_FILE_BYTES} bytes: not a settings file"),
        ));
    }
    Ok(out)
}
pub use config::{Action, ConfigError, Scope, ServerLimits, Settings, StatsdSettings, Token};
pub use error::ApiError;
pub use listen::{ACCEPT_BACKOFF, Routes, serve, serve_with};
pub use ops::OPS_PROBES;
pub use router::router;

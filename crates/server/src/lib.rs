//! tally's HTTP API (SPEC §3) over any [`Store`](tally_core::store::Store): routes,
//! authentication, errors mapped to statuses in one place, idempotency keys, metrics and the
//! OpenAPI document — which is generated from the route handlers themselves, so it cannot
//! drift from them.
//!
//! This file only names the modules and the public API; each module says what it owns.

mod admission;
mod app;
mod auth;
mod body;
pub mod config;
mod error;
mod events;
mod idempotency;
mod json;
mod listen;
mod metrics;
mod openapi;
mod ops;
mod params;
mod queries;
mod router;
mod schemas;
pub mod tls;

pub use admission::{MAX_HEADER_BYTES, MAX_HEADER_FIELDS, MAX_URI_BYTES, OTHER_V1_PERMITS};
pub use app::App;
pub use config::{Action, ConfigError, Scope, ServerLimits, Settings, Token};
pub use error::ApiError;
pub use listen::{ACCEPT_BACKOFF, Routes, serve, serve_with};
pub use router::router;

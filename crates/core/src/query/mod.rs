//! The queries of SPEC §2 — series, breakdown, window, dashboard, top, keys — exact, and
//! generic over [`Store`]. Each has a typed request, a parser from the named string
//! parameters that `GET` routes and `POST /v1/query` entries share, and a serialisable answer.

mod answer;
mod exec;
mod export;
mod params;
mod window;

pub use answer::{
    Accepted, BreakdownAnswer, DashboardAnswer, KeyCount, KeysAnswer, Point, SeriesAnswer, Span,
    TopAnswer, ValueCount, WindowAnswer, WindowCount,
};
pub(crate) use exec::wrapping_sum;
pub use exec::{breakdown, dashboard, keys, rollup, series, top};
pub use export::{EXPORT_PAGE_KEYS, ExportPlan, ExportQuery, Row, csv_field, export, export_plan};
pub use params::{
    BreakdownQuery, DashboardQuery, KeysQuery, Params, SeriesQuery, TopQuery, WindowQuery,
    instant_plus, plus, timestamp_plus, whole_seconds,
};
pub use window::{
    Limited, WindowPlan, incr_limited, retry_after, window, window_after, window_plan,
};

use crate::error::ErrorCode;
use crate::model::ModelError;
use crate::store::{Deadline, StoreError};
use crate::tier::NoTier;
use crate::time::TimeError;

/// Default and bounds of `limit` (SPEC §2).
pub const DEFAULT_LIMIT: usize = 10;
pub const DEFAULT_KEYS_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
/// Default of `[limits] max_points`.
pub const DEFAULT_MAX_POINTS: usize = 100_000;

/// A query failure; `code()` gives the SPEC's error code, `field()` the parameter at fault.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    #[error("{field}: {source}")]
    Model {
        field: &'static str,
        source: ModelError,
    },
    #[error("{field}: {source}")]
    Time {
        field: &'static str,
        source: TimeError,
    },
    #[error("missing parameter {field}")]
    MissingParameter { field: &'static str },
    #[error("{field}: {why}")]
    InvalidParameter { field: &'static str, why: String },
    #[error("limit must be a whole number from 1 to {MAX_LIMIT}, got {got:?}")]
    InvalidLimit { got: String },
    #[error("namespace {ns} does not exist")]
    UnknownNamespace { ns: String },
    #[error(transparent)]
    NoTier(#[from] NoTier),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl QueryError {
    pub fn code(&self) -> ErrorCode {
        match self {
            QueryError::Model { source, .. } => source.code(),
            QueryError::Time { source, .. } => source.code(),
            QueryError::MissingParameter { .. } => ErrorCode::MissingParameter,
            QueryError::InvalidParameter { .. } => ErrorCode::InvalidParameter,
            QueryError::InvalidLimit { .. } => ErrorCode::InvalidLimit,
            QueryError::UnknownNamespace { .. } => ErrorCode::UnknownNamespace,
            QueryError::NoTier(_) => ErrorCode::NoTierForRange,
            QueryError::Store(e) => e.code(),
        }
    }

    /// The parameter at fault, if one is.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            QueryError::Model { field, .. }
            | QueryError::Time { field, .. }
            | QueryError::MissingParameter { field }
            | QueryError::InvalidParameter { field, .. } => Some(field),
            QueryError::InvalidLimit { .. } => Some("limit"),
            _ => None,
        }
    }
}

/// Maps a model error to the parameter it came from.
fn model(field: &'static str) -> impl Fn(ModelError) -> QueryError {
    move |source| QueryError::Model { field, source }
}

/// Maps a time error to the parameter it came from.
fn time(field: &'static str) -> impl Fn(TimeError) -> QueryError {
    move |source| QueryError::Time { field, source }
}

/// What every query needs besides its parameters.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub now: i64,
    pub max_points: usize,
    /// When to give up (`Deadline::none()` for no limit).
    pub deadline: Deadline,
}

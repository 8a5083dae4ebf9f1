//! The validated vocabulary of SPEC §1: namespace names, keys, dimension names and values,
//! compound dimensions, durations, tiers, schemas and events. A value of any of these types
//! has passed every rule of the SPEC; constructing one is the only place the rules are checked.

/// `FromStr` through the type's validating `new`.
macro_rules! string_from_str {
    ($name:ident) => {
        impl FromStr for $name {
            type Err = ModelError;
            fn from_str(s: &str) -> Result<Self, ModelError> {
                Self::new(s)
            }
        }
    };
}

mod duration;
mod event;
mod names;
mod schema;

pub use duration::{Duration, Retention, Tier};
pub use event::{Event, RawEvent, amount, parse_instant, parse_timestamp, timestamp};
pub use names::{DimName, DimValue, Dimension, Key, Namespace, escape_part};
pub use schema::{Coverage, Reads, Schema, SchemaDoc, Subtotal};

use crate::error::ErrorCode;

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest dimension value, in bytes.
pub const MAX_DIM_VALUE_BYTES: usize = 2048;
/// Longest namespace or dimension name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Most dimensions one event may carry.
pub const MAX_DIMS_PER_EVENT: usize = 16;
/// Most tiers a schema may have.
pub const MAX_TIERS: usize = 16;
/// Most names a schema's dimension allow-list may hold, compounds included.
pub const MAX_SCHEMA_DIMENSIONS: usize = 256;
/// Most compound dimensions a schema may declare: each event counts one subtotal per
/// compound whose parts it carries, beside one per dimension it carries.
pub const MAX_COMPOUNDS: usize = 16;
/// `|n|` must stay below 2^53 so every amount survives a trip through a JSON double.
pub const AMOUNT_LIMIT: i64 = 1 << 53;
/// Earliest accepted timestamp: 1970-01-01T00:00:00Z.
pub const MIN_TS: i64 = 0;
/// Latest accepted timestamp (exclusive): 2106-02-07T00:00:00Z, the last UTC day that ends
/// before 2^32 s. Bucket indexes then fit in 32 bits at every resolution (the engine packs
/// them beside a series id), and so does the end of every period the engine writes as a
/// segment (an hour, or up to a day, of a `1s` tier: with 2^32 itself, the last second's
/// period ended past it, so no flush could ever write it, and reads of that second left it
/// out); every calendar step stays far from the calendar library's year-9999 edge.
pub const MAX_TS: i64 = 4_294_944_000;

/// A violation of one rule of the data model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("invalid namespace name {got:?}: {why}")]
    InvalidName { got: String, why: &'static str },
    #[error("invalid key: {why}")]
    InvalidKey { why: &'static str },
    #[error("invalid dimension {what}: {why}")]
    InvalidDimension { what: String, why: String },
    #[error("dimension {name:?} is not in the namespace's allow-list")]
    UnknownDimension { name: String },
    #[error(
        "dimension {name:?} is a compound, counted only where a namespace's allow-list \
         declares it, and this namespace has no allow-list"
    )]
    UndeclaredCompound { name: String },
    #[error("an event carries at most {MAX_DIMS_PER_EVENT} dimensions, got {got}")]
    TooManyDimensions { got: usize },
    #[error("invalid timestamp {got:?}: {why}")]
    InvalidTimestamp { got: String, why: &'static str },
    #[error("timestamp {ts} is more than {max_future_secs} s in the future")]
    TimestampInFuture { ts: i64, max_future_secs: i64 },
    #[error("invalid amount {got}: |n| must be below 2^53")]
    InvalidAmount { got: String },
    #[error("invalid duration {got:?}: {why}")]
    InvalidDuration { got: String, why: &'static str },
    /// `field`: the part of the schema at fault, `tiers`, `breakdown_tiers` or
    /// `dimensions` (what the API's `error.field` names).
    #[error("invalid schema: {why}")]
    InvalidSchema { why: String, field: &'static str },
}

impl ModelError {
    /// The part of the input at fault, where the error itself knows it (a schema's).
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ModelError::InvalidSchema { field, .. } => Some(field),
            _ => None,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ModelError::InvalidName { .. } => ErrorCode::InvalidName,
            ModelError::InvalidKey { .. } => ErrorCode::InvalidKey,
            ModelError::InvalidDimension { .. } => ErrorCode::InvalidDimension,
            ModelError::UnknownDimension { .. } | ModelError::UndeclaredCompound { .. } => {
                ErrorCode::UnknownDimension
            }
            ModelError::TooManyDimensions { .. } => ErrorCode::TooManyDimensions,
            ModelError::InvalidTimestamp { .. } => ErrorCode::InvalidTimestamp,
            ModelError::TimestampInFuture { .. } => ErrorCode::TimestampInFuture,
            ModelError::InvalidAmount { .. } => ErrorCode::InvalidAmount,
            ModelError::InvalidDuration { .. } => ErrorCode::InvalidDuration,
            ModelError::InvalidSchema { .. } => ErrorCode::InvalidSchema,
        }
    }
}

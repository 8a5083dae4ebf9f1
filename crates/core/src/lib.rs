//! tally's core: what a counter database means, with no I/O.
//!
//! - [`model`]: validated names, keys, dimensions, durations, tiers, schemas, events.
//! - [`time`]: epoch-aligned buckets and calendar units in any IANA zone.
//! - [`tier`]: which tier answers a range, or why none can.
//! - [`store`]: the `Store` trait every backend implements, and the batch it applies.
//! - [`ingest`]: raw events to a validated batch (limits, allow-lists, auto-creation).
//! - [`query`]: series, breakdown, window, dashboard, top and keys, generic over `Store`.
//! - [`reference`]: a simple `BTreeMap` store the real backends are tested against.

// The workspace denies `unsafe`; only the engine has a site that allows it.
#![forbid(unsafe_code)]

mod durability;
pub mod error;
pub mod ingest;
pub mod model;
pub mod query;
pub mod reference;
pub mod store;
pub mod tier;
pub mod time;

pub use error::ErrorCode;

//! tally's embedded engine: the default backend.
//!
//! - [`engine`]: open a data directory, recover, serve the `Store` trait.
//! - [`catalog`]: namespaces, schemas, and interned keys, dimensions and values.
//! - [`memtable`]: sharded in-memory counters (the realtime tier).
//! - [`wal`]: the write-ahead log: format, group-commit writer, recovery scan.
//! - [`io`]: the small file layer tests inject faults into.

pub mod catalog;
pub mod engine;
pub mod io;
pub mod memtable;
pub mod wal;

pub use engine::{Config, Engine, EngineStats, OpenError, Recovery};
pub use tally_core::store::FsyncPolicy;

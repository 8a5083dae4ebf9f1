//! tally's embedded engine: the default backend.
//!
//! - [`engine`]: open a data directory, recover, serve the `Store` trait.
//! - `recovery`: replay the log into memory; `state`: the memory state and its one apply path.
//! - [`catalog`]: namespaces, schemas, and interned keys, dimensions and values.
//! - [`memtable`]: sharded in-memory counters (the realtime tier).
//! - [`wal`]: the write-ahead log: format, group-commit writer, recovery scan.
//! - [`io`]: the small file layer tests inject faults into.

mod answers;
pub mod archive;
pub mod backup;
pub mod bulk;
pub mod catalog;
pub mod check;
mod chunked;
pub mod compaction;
pub mod engine;
mod entries;
mod fair;
mod flush;
mod interned;
pub mod io;
mod keyindex;
pub mod manifest;
pub mod memtable;
pub mod names;
mod read;
mod recovery;
mod seeded;
pub mod segment;
mod state;
mod top;
pub mod wal;

pub use archive::FlushPolicy;
pub use bulk::{Bulk, Counter, KeyId, SubId};
pub use compaction::CompactReport;
pub use engine::{Config, Engine, EngineStats, OpenError, ScrubPace};
pub use flush::FlushReport;
pub use recovery::Recovery;
pub use tally_core::store::FsyncPolicy;

/// Helpers for the unit tests of several modules.
#[cfg(test)]
mod testutil {
    /// A xorshift generator: deterministic pseudo-random numbers from a seed (not 0).
    pub fn rng(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }
}

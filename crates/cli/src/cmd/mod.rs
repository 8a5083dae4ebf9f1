//! The subcommands, one module each; what the client commands share is in `conn`.

pub mod backup;
pub mod bench;
pub mod check;
pub mod compact;
pub mod export;
pub mod incr;
pub mod keys;
pub mod load;
pub mod query;
pub mod serve;

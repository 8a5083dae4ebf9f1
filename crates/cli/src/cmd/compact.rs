//! `tally compact`: flush every closed period into the archive and compact it, now.
//! - `--data DIR`, on a stopped server's directory: flushes with no grace, truncates the
//!   log, merges deltas and drops segments past retention. A directory a server holds is
//!   refused (its lock).
//! - `--server URL`: asks a running server to do its minute's housekeeping now
//!   (`POST /v1/admin/compact`, which needs an `admin:*` token when tokens are configured).
//!
//! It prints what was done; with `--json`, as the server's answer to that request is shaped.

use std::path::PathBuf;

use anyhow::Context;
use tally_core::store::{Maintenance, Store};
use tally_engine::{Config, Engine, FlushPolicy};

use crate::conn::{write_json, write_stdout};
use crate::http::{Client, Route};
use crate::table::Render;

#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    /// Data directory (of a stopped server).
    #[arg(long, env = "TALLY_DATA", default_value = "tally-data")]
    pub data: PathBuf,
    /// Ask this running server instead.
    #[arg(long, conflicts_with = "data", value_parser = crate::http::server_url)]
    pub server: Option<String>,
    /// Bearer token for --server (needs the admin:* scope).
    #[arg(
        long,
        env = "TALLY_TOKEN",
        hide_env_values = true,
        requires = "server",
        value_parser = crate::http::token
    )]
    pub token: Option<String>,
    /// Print what was done as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CompactArgs) -> anyhow::Result<()> {
    if let Some(server) = &args.server {
        let answer = Client::new(server, args.token.as_deref())
            .post::<Maintenance>(&Route::admin("compact"))?;
        return if args.json {
            write_json(answer.json())
        } else {
            write_stdout(&answer.typed()?.render())
        };
    }
    super::existing_data_dir(&args.data)?;
    let mut cfg = Config::new(&args.data);
    cfg.flush = FlushPolicy {
        grace: 0,
        ..FlushPolicy::default()
    };
    let engine = Engine::open(cfg)
        .with_context(|| format!("opening data directory {}", args.data.display()))?;
    let done = engine
        .maintain()
        .map_err(|e| anyhow::anyhow!("{}", e.detail()))
        .context("compacting")?;
    engine
        .sync()
        .map_err(|e| anyhow::anyhow!("{}", e.detail()))?;
    if args.json {
        write_json(&done)
    } else {
        write_stdout(&done.render())
    }
}

//! `tally compact --data DIR`: on a stopped server's data directory, flushes every closed
//! period into the archive now (no grace), truncates the log behind it, then compacts the
//! archive (deltas merged, segments past retention dropped). A running server holds the
//! directory's lock, so this refuses to touch it (a running server compacts every minute).

use std::path::PathBuf;

use anyhow::Context;
use tally_engine::{Config, Engine, FlushPolicy};

#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    /// Data directory (of a stopped server).
    #[arg(long, env = "TALLY_DATA", default_value = "tally-data")]
    pub data: PathBuf,
}

pub fn run(args: CompactArgs) -> anyhow::Result<()> {
    let mut cfg = Config::new(&args.data);
    cfg.flush = FlushPolicy {
        grace: 0,
        ..FlushPolicy::default()
    };
    let engine = Engine::open(cfg)
        .with_context(|| format!("opening data directory {}", args.data.display()))?;
    let r = engine
        .flush()
        .map_err(|e| anyhow::anyhow!("{}", e.detail()))
        .context("flushing")?;
    println!(
        "flushed {} segment(s): {} keys, {} data points, {} bytes; {} log file(s) removed; the log is kept from record {}",
        r.segments, r.keys, r.data_points, r.bytes, r.wal_files_removed, r.wal_start
    );
    let c = engine
        .compact()
        .map_err(|e| anyhow::anyhow!("{}", e.detail()))
        .context("compacting")?;
    engine
        .sync()
        .map_err(|e| anyhow::anyhow!("{}", e.detail()))?;
    println!(
        "compacted: {} segment(s) merged into {}, {} past retention dropped",
        c.merged, c.written, c.dropped
    );
    Ok(())
}

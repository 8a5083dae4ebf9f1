//! `tally check --data DIR`: verifies every checksum of a data directory (manifest, every
//! segment block and index, every log record) and names each damaged file and block. Exits
//! non-zero on damage. It only reads, so it may run beside a server.

use std::path::PathBuf;

use anyhow::{Context, bail};
use tally_engine::check::{Finding, check};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Data directory to check.
    #[arg(long, env = "TALLY_DATA", default_value = "tally-data")]
    pub data: PathBuf,
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    super::existing_data_dir(&args.data)?;
    let report = check(&args.data).with_context(|| format!("reading {}", args.data.display()))?;
    for f in &report.findings {
        match f {
            Finding::Manifest {
                path,
                segments,
                wal_start,
            } => println!(
                "ok   {} ({segments} segments, log needed from record {wal_start})",
                path.display()
            ),
            Finding::Segment { path, stats } => println!(
                "ok   {} ({} keys, {} data points, {} bytes)",
                path.display(),
                stats.keys,
                stats.data_points,
                stats.bytes
            ),
            Finding::Log {
                path,
                records,
                torn,
            } => match torn {
                None => println!("ok   {} ({records} records)", path.display()),
                Some(t) => println!(
                    "ok   {} ({records} records; a torn write of {} bytes at offset {} is dropped on open)",
                    path.display(),
                    t.dropped_bytes,
                    t.offset
                ),
            },
        }
    }
    for d in &report.damage {
        println!("BAD  {}", chain(d));
    }
    if !report.is_whole() {
        bail!(
            "{} damaged or missing file(s) in {}",
            report.damage.len(),
            args.data.display()
        );
    }
    Ok(())
}

/// An error with its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

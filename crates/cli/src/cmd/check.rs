//! `tally check --data DIR`: verifies every checksum of a data directory (manifest, every
//! segment block and index, every log record) and names each damaged file and block. Exits
//! non-zero on damage. It only reads, so it may run beside a server. `--json` prints the same
//! report as one object: `{"whole", "files": [{"kind", "path", …}], "damage": [message…]}`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tally_engine::check::{CheckReport, Finding, check};

use crate::conn::{write_json, write_stdout};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Data directory to check.
    #[arg(long, env = "TALLY_DATA", default_value = "tally-data")]
    pub data: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    super::existing_data_dir(&args.data)?;
    let report = check(&args.data).with_context(|| format!("reading {}", args.data.display()))?;
    // Damage decides the exit status even when the report could not be written (a reader
    // that closed stdout early makes that a success otherwise).
    let written = if args.json {
        write_json(&as_json(&report))
    } else {
        write_stdout(&table(&report))
    };
    if !report.is_whole() {
        bail!(
            "{} damaged or missing file(s) in {}",
            report.damage.len(),
            args.data.display()
        );
    }
    written
}

/// The report as lines of text: `ok` per whole file, `BAD` per damage.
fn table(report: &CheckReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for f in &report.findings {
        let _ = match f {
            Finding::Manifest {
                path,
                segments,
                wal_start,
            } => writeln!(
                out,
                "ok   {} ({segments} segments, log needed from record {wal_start})",
                path.display()
            ),
            Finding::Segment { path, stats } => writeln!(
                out,
                "ok   {} ({} keys, {} data points, {} bytes)",
                path.display(),
                stats.keys,
                stats.data_points,
                stats.bytes
            ),
            Finding::Answers { path, answers } => writeln!(
                out,
                "ok   {} ({answers} idempotency answers)",
                path.display()
            ),
            Finding::Log {
                path,
                records,
                torn,
            } => match torn {
                None => writeln!(out, "ok   {} ({records} records)", path.display()),
                Some(t) => writeln!(
                    out,
                    "ok   {} ({records} records; a torn write of {} bytes at offset {} is dropped on open)",
                    path.display(),
                    t.dropped_bytes,
                    t.offset
                ),
            },
        };
    }
    for d in &report.damage {
        let _ = writeln!(out, "BAD  {}", chain(d));
    }
    out
}

fn as_json(report: &CheckReport) -> Value {
    let files: Vec<Value> = report
        .findings
        .iter()
        .map(|f| match f {
            Finding::Manifest {
                path,
                segments,
                wal_start,
            } => json!({
                "kind": "manifest",
                "path": path.display().to_string(),
                "segments": segments,
                "wal_start": wal_start,
            }),
            Finding::Segment { path, stats } => json!({
                "kind": "segment",
                "path": path.display().to_string(),
                "keys": stats.keys,
                "data_points": stats.data_points,
                "bytes": stats.bytes,
            }),
            Finding::Answers { path, answers } => json!({
                "kind": "answers",
                "path": path.display().to_string(),
                "answers": answers,
            }),
            Finding::Log {
                path,
                records,
                torn,
            } => json!({
                "kind": "log",
                "path": path.display().to_string(),
                "records": records,
                "torn": torn.as_ref().map(|t| json!({
                    "offset": t.offset,
                    "dropped_bytes": t.dropped_bytes,
                })),
            }),
        })
        .collect();
    let damage: Vec<String> = report.damage.iter().map(|d| chain(d)).collect();
    json!({"whole": report.is_whole(), "files": files, "damage": damage})
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

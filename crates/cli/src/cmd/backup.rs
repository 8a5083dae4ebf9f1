//! `tally backup [--data DIR] DEST`: a consistent copy of a data directory, safe while a
//! server runs on it: the archive's segments hard-linked (or copied), the manifest, and the
//! log from where recovery needs it. Open the copy with `tally serve --data DEST`.

use std::path::PathBuf;

use anyhow::Context;
use tally_engine::backup::backup;

use crate::conn::{write_json, write_stdout};

#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Data directory to copy.
    #[arg(long, env = "TALLY_DATA", default_value = "tally-data")]
    pub data: PathBuf,
    /// Where to put the copy (created; must be empty or absent, and outside --data).
    pub dest: PathBuf,
    /// Print what was copied as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BackupArgs) -> anyhow::Result<()> {
    super::existing_data_dir(&args.data)?;
    let r = backup(&args.data, &args.dest).with_context(|| {
        format!(
            "backing up {} to {}",
            args.data.display(),
            args.dest.display()
        )
    })?;
    if args.json {
        return write_json(&serde_json::json!({
            "data": args.data.display().to_string(),
            "dest": args.dest.display().to_string(),
            "segments": r.segments,
            "segments_copied": r.segments_copied,
            "answers_files": r.answers_files,
            "log_files": r.log_files,
            "bytes_copied": r.bytes_copied,
            "attempts": r.attempts,
        }));
    }
    let answers = match r.answers_files {
        0 => String::new(),
        n => format!(", {n} idempotency answers file(s)"),
    };
    let attempts = match r.attempts {
        0 | 1 => String::new(),
        n => format!(" (in {n} attempts: the archive changed under the copy)"),
    };
    write_stdout(&format!(
        "backed up {} to {}: {} segment(s) ({} copied, the rest hard-linked){answers}, {} log file(s), {} bytes copied{attempts}\n",
        args.data.display(),
        args.dest.display(),
        r.segments,
        r.segments_copied,
        r.log_files,
        r.bytes_copied
    ))
}

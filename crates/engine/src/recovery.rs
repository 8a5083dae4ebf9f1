//! Recovery: replays every log file, in order, through the same apply path as live writes,
//! drops a torn tail (logged), refuses any other damage with the file and offset, and
//! hands the writer the file to append to.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::archive::{Archive, segment_path};
use crate::engine::{OpenError, io_at};
use crate::io::{Faults, LogFile};
use crate::manifest::{self, Manifest};
use crate::state::Core;
use crate::wal::payload::{self, Payload};
use crate::wal::reader::{self, TornTail};
use crate::wal::writer;
use crate::wal::{Corruption, FILE_HEADER_LEN, FileProblem, WalError, file_name, list_files};

/// What recovery found.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    pub files: usize,
    pub records: u64,
    pub events: u64,
    pub log_bytes: u64,
    pub torn: Option<TornTail>,
    pub elapsed: Duration,
    /// Archive segments opened.
    pub segments: usize,
    /// Log records skipped because the archive holds them.
    pub skipped: u64,
}

/// Removes what a crash or a compaction left behind: segment files (and temporary ones) the
/// manifest does not list, manifests other than the current one, a half-written `CURRENT`.
/// Only names this engine writes are touched.
pub(crate) fn remove_leftovers(
    dir: &Path,
    segments_dir: &Path,
    current: &Manifest,
) -> std::io::Result<()> {
    let listed: std::collections::HashSet<PathBuf> = current
        .segments
        .iter()
        .map(|e| segment_path(segments_dir, e.id))
        .collect();
    for entry in std::fs::read_dir(segments_dir)? {
        let path = entry?.path();
        let ours = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("tls" | "tmp")
        );
        if ours && !listed.contains(&path) {
            tracing::info!(file = %path.display(), "removing a segment no manifest lists");
            std::fs::remove_file(&path)?;
        }
    }
    let keep = manifest::file_name(dir, current.number);
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if (name.starts_with("MANIFEST-") && path != keep) || name == "CURRENT.tmp" {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Replays the log in `wal_dir` into `core` from record `wal_start` on (the archive holds
/// what came before); increments to periods the archive holds up to their record are
/// skipped. Returns the file to append to, the next sequence number, and what was found
/// (`elapsed` left for the caller to fill).
pub(crate) fn replay(
    wal_dir: &Path,
    core: &Core,
    now: i64,
    faults: Option<Arc<Faults>>,
    wal_start: u64,
    archive: &Archive,
) -> Result<(LogFile, u64, Recovery), OpenError> {
    let files = list_files(wal_dir).map_err(io_at(wal_dir))?;
    let mut recovery = Recovery {
        files: files.len(),
        ..Recovery::default()
    };
    if let Some((first, path)) = files.first()
        && *first > wal_start
    {
        // Records the archive does not hold are gone: starting anyway would lose them.
        return Err(WalError::BadFile {
            file: path.clone(),
            why: FileProblem::MissingRecords {
                needed: wal_start,
                found: *first,
            },
        }
        .into());
    }
    let mut next_seq = files.first().map_or(wal_start, |(s, _)| *s);
    let mut last_end = None;
    for (i, (named_seq, path)) in files.iter().enumerate() {
        if *named_seq != next_seq {
            return Err(WalError::BadFile {
                file: path.clone(),
                why: FileProblem::NamedSequence {
                    named: *named_seq,
                    expected: next_seq,
                },
            }
            .into());
        }
        let bytes = std::fs::read(path).map_err(io_at(path))?;
        recovery.log_bytes += bytes.len() as u64;
        let is_last = i + 1 == files.len();
        let mut visit = |seq: u64, bytes: &[u8]| -> Result<(), Corruption> {
            let payload = payload::decode(bytes).map_err(Corruption::Payload)?;
            if seq < wal_start {
                // Archived, with the schemas of its time in the manifest's checkpoint.
                recovery.skipped += 1;
                return Ok(());
            }
            match payload {
                Payload::Batch(view) => {
                    recovery.events += view.incs.len() as u64;
                    core.apply_view(&view, now, seq, Some(archive))
                        .map_err(Corruption::Apply)
                }
                Payload::Schema(ns, schema) => core
                    .apply_schema(&ns, &schema, seq)
                    .map_err(Corruption::Apply),
            }
        };
        let end = reader::scan(path, &bytes, next_seq, is_last, &mut visit)?;
        recovery.records += end.records;
        next_seq = end.next_seq;
        if let Some(torn) = &end.torn {
            tracing::warn!(
                file = %torn.file.display(),
                offset = torn.offset,
                dropped_bytes = torn.dropped_bytes,
                "dropped a torn write at the end of the log"
            );
            recovery.torn = Some(torn.clone());
        }
        last_end = Some((path.clone(), end.valid_len));
    }
    let file = match last_end {
        Some((path, len)) if len >= FILE_HEADER_LEN as u64 => {
            LogFile::reopen(&path, len, faults.clone()).map_err(io_at(&path))?
        }
        Some((path, _)) => {
            // The last file never got a whole header: nothing in it was acknowledged.
            std::fs::remove_file(&path).map_err(io_at(&path))?;
            let path = file_name(wal_dir, next_seq);
            LogFile::create(&path, &crate::wal::file_header(next_seq), faults.clone())
                .map_err(io_at(&path))?
        }
        None => writer::create_first(wal_dir, next_seq, faults.clone()).map_err(io_at(wal_dir))?,
    };
    Ok((file, next_seq, recovery))
}

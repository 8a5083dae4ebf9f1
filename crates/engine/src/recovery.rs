//! Recovery: replays every log file, in order, through the same apply path as live writes,
//! drops a torn tail (logged), refuses any other damage with the file and offset, and
//! hands the writer the file to append to.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{OpenError, io_at};
use crate::io::{Faults, LogFile};
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
}

/// Replays the log in `wal_dir` into `core`; returns the file to append to, the next
/// sequence number, and what was found (`elapsed` left for the caller to fill).
pub(crate) fn replay(
    wal_dir: &Path,
    core: &Core,
    now: i64,
    faults: Option<Arc<Faults>>,
) -> Result<(LogFile, u64, Recovery), OpenError> {
    let files = list_files(wal_dir).map_err(io_at(wal_dir))?;
    let mut recovery = Recovery {
        files: files.len(),
        ..Recovery::default()
    };
    let mut next_seq = files.first().map_or(1, |(s, _)| *s);
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
        let mut visit = |_seq: u64, bytes: &[u8]| -> Result<(), Corruption> {
            match payload::decode(bytes).map_err(Corruption::Payload)? {
                Payload::Batch(view) => {
                    recovery.events += view.incs.len() as u64;
                    core.apply_view(&view, now).map_err(Corruption::Apply)
                }
                Payload::Schema(ns, schema) => {
                    core.apply_schema(&ns, &schema).map_err(Corruption::Apply)
                }
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
        None => writer::create_first(wal_dir, faults.clone()).map_err(io_at(wal_dir))?,
    };
    Ok((file, next_seq, recovery))
}

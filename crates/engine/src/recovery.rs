//! Recovery: replays every log file, in order, through the same apply path as live writes,
//! drops a torn tail (logged), refuses any other damage with the file and offset, and
//! hands the writer the file to append to.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::archive::{Archive, segment_path};
use crate::engine::{OpenError, io_at};
use crate::io::{Faults, LogFile};
use crate::manifest::{self, Manifest};
use crate::state::Core;
use crate::wal::payload::{self, BatchView, Payload};
use crate::wal::reader::{self, Gaps, TornTail};
use crate::wal::{
    Corruption, FILE_HEADER_LEN, FileProblem, MAX_SEQ, WalError, file_name, list_files,
};
use tally_core::model::Schema;

/// Resolved batches replay lets wait for the adder thread.
const REPLAY_QUEUE: usize = 8;

/// What the replaying thread hands the adder.
enum ToAdder {
    Batch(crate::state::ResolvedBatch),
    /// Answer once every batch before is added.
    Barrier(std::sync::mpsc::SyncSender<()>),
}

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
    /// Ranges of records (`first..=last`) that were missing and accepted as lost
    /// (`Config::accept_data_loss`); recovery refuses to start over any of them otherwise.
    pub lost: Vec<(u64, u64)>,
    /// Segments the manifest listed that were missing or damaged, left out accepting data
    /// loss (their counts are gone; a damaged file is kept beside the others, renamed
    /// `….tls.damaged`).
    pub lost_segments: Vec<crate::archive::LostSegment>,
}

/// Removes what a crash or a compaction left behind: segment and answers files (and
/// temporary ones) the manifest does not list, manifests other than the current one, a half-written `CURRENT`.
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
        .chain(
            current
                .answers
                .iter()
                .map(|a| manifest::answers_path(segments_dir, a.id)),
        )
        .collect();
    for entry in std::fs::read_dir(segments_dir)? {
        let path = entry?.path();
        let ours = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("tls" | "tla" | "tmp")
        );
        if ours && !listed.contains(&path) {
            tracing::info!(file = %path.display(), "removing a file no manifest lists");
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

/// A gap `first..=last` in the log: the refusal, or — accepting data loss — the range
/// noted as lost.
fn gap(
    accept_data_loss: bool,
    lost: &mut Vec<(u64, u64)>,
    first: u64,
    last: u64,
    refusal: WalError,
) -> Result<(), OpenError> {
    if !accept_data_loss {
        return Err(refusal.into());
    }
    note_loss(lost, first, last);
    Ok(())
}

/// Logs an accepted loss as loudly as the logger can, and notes it.
fn note_loss(lost: &mut Vec<(u64, u64)>, first: u64, last: u64) {
    tracing::error!(
        first,
        last,
        "DATA LOSS ACCEPTED: log records {first}..={last} are missing and their events are \
         lost for good; starting with the records that are left (--accept-data-loss)"
    );
    lost.push((first, last));
}

/// Once records were accepted as missing: a namespace created in one of them is created
/// again, with the default schema, by the first later batch that counts in it (its own
/// schema is lost with the record that set it). Without this, every later record of it
/// would stop recovery. Before any loss, an unknown namespace stays damage.
fn recreate_lost_namespaces(core: &Core, view: &mut BatchView<'_>) {
    let cat = core.read_cat();
    let mut recreate: Vec<u32> = Vec::new();
    // Sets: a record may create a namespace per event.
    let mut known: HashSet<u32> = view.creates.iter().map(|&(ns, _)| ns).collect();
    for inc in &view.incs {
        if !known.contains(&inc.ns) && cat.ns_id(view.str(inc.ns)).is_none() {
            known.insert(inc.ns);
            recreate.push(inc.ns);
        }
    }
    drop(cat);
    for ns in recreate {
        tracing::error!(
            namespace = view.str(ns),
            "DATA LOSS ACCEPTED: the record that created this namespace is missing; it is \
             created again with the default schema"
        );
        view.creates.push((ns, Schema::default()));
    }
}

/// The schema each namespace has at the end of the log, for those a record from
/// `wal_start` on changed: a first pass over the log that decodes schema records only. A
/// damaged file ends its pass quietly (the replay that follows reports it).
///
/// Replay checks each increment against the retention its tier has at the end of the log,
/// not at the increment's record: a retention that grew after an increment keeps it, as the
/// running engine did (it swept by the grown retention from then on). Checked against the
/// retention of its time, an increment older than that was dropped again at every restart.
fn final_schemas(files: &[(u64, PathBuf)], wal_start: u64) -> HashMap<String, Schema> {
    let mut last = HashMap::new();
    let mut next_seq = files.first().map_or(wal_start, |(s, _)| *s);
    for (i, (named, path)) in files.iter().enumerate() {
        next_seq = next_seq.max(*named);
        let Ok(bytes) = std::fs::read(path) else {
            break;
        };
        let mut visit = |seq: u64, p: &[u8]| -> Result<(), Corruption> {
            if seq >= wal_start
                && matches!(
                    p.first(),
                    Some(&(payload::KIND_SCHEMA | payload::KIND_SCHEMA_COVERED))
                )
                && let Ok(Payload::Schema(ns, schema)) = payload::decode(p)
            {
                last.insert(ns.as_str().to_owned(), schema);
            }
            Ok(())
        };
        let gaps = Gaps::Accept;
        match reader::scan_with(
            path,
            &bytes,
            next_seq,
            i + 1 == files.len(),
            gaps,
            &mut visit,
        ) {
            Ok(end) => next_seq = end.next_seq,
            Err(_) => break,
        }
    }
    last
}

/// Replays the log in `wal_dir` into `core` from record `wal_start` on (the archive holds
/// what came before); increments to periods the archive holds up to their record are
/// skipped. Returns the file to append to, the next sequence number, and what was found
/// (`elapsed` left for the caller to fill).
///
/// The log must hold every record from `wal_start` on, numbered without a gap — before
/// its first file, between two files, inside a file — and at least up to the last record
/// the archive holds (the log is made durable before a flush publishes, so a log ending
/// earlier lost its newest file). A gap is an error naming the missing range, unless
/// `accept_data_loss`: then it is logged loudly, kept in [`Recovery::lost`], and recovery
/// goes on with what is left, numbering new records after the highest one seen (in the
/// log or the archive), so no number is used twice.
pub(crate) fn replay(
    wal_dir: &Path,
    core: &Core,
    now: i64,
    faults: Option<Arc<Faults>>,
    wal_start: u64,
    archive: &Archive,
    accept_data_loss: bool,
) -> Result<(LogFile, u64, Recovery), OpenError> {
    // Records are numbered from 1: a manifest naming 0 (which tally never writes) means the
    // log starts at its beginning, and must not start a log numbered 0 that the next open
    // refuses.
    let wal_start = wal_start.max(1);
    if wal_start >= MAX_SEQ {
        return Err(WalError::BadFile {
            file: wal_dir.to_owned(),
            why: FileProblem::SequenceOutOfRange { seq: wal_start },
        }
        .into());
    }
    // Read before the files are listed, as `check` does (here nothing writes meanwhile).
    let head = match crate::wal::read_head(wal_dir) {
        Ok(h) => h,
        Err(e) if accept_data_loss => {
            tracing::error!(error = %e, "DATA LOSS ACCEPTED: ignoring the log's damaged HEAD");
            None
        }
        Err(e) => return Err(e.into()),
    };
    let files = list_files(wal_dir).map_err(io_at(wal_dir))?;
    if let Some((seq, path)) = files.iter().find(|(s, _)| *s == 0 || *s >= MAX_SEQ) {
        return Err(WalError::BadFile {
            file: path.clone(),
            why: FileProblem::SequenceOutOfRange { seq: *seq },
        }
        .into());
    }
    let mut recovery = Recovery {
        files: files.len(),
        ..Recovery::default()
    };
    let mut lost = Vec::new();
    if let Some((first, path)) = files.first()
        && *first > wal_start
    {
        // Records the archive does not hold are gone: starting anyway would lose them.
        gap(
            accept_data_loss,
            &mut lost,
            wal_start,
            first - 1,
            WalError::BadFile {
                file: path.clone(),
                why: FileProblem::MissingRecords {
                    needed: wal_start,
                    found: *first,
                },
            },
        )?;
    }
    core.set_replay_retentions(final_schemas(&files, wal_start));
    let mut next_seq = files.first().map_or(wal_start, |(s, _)| *s);
    let mut last_end = None;
    // Two threads: this one reads, decodes and resolves each batch to ids (the catalog's
    // work), the adder adds the batch before it to the counters, so replay uses both halves
    // of the apply path at once. A schema change waits until the adder has caught up.
    let held = archive.held();
    let replayed_against = crate::state::Replayed {
        archive,
        held: &held,
    };
    let replayed = std::thread::scope(|scope| -> Result<(), OpenError> {
        let (to_adder, inbox) = std::sync::mpsc::sync_channel::<ToAdder>(REPLAY_QUEUE);
        scope.spawn(move || {
            for m in inbox {
                match m {
                    ToAdder::Batch(b) => core.add_resolved(b, now, Some(replayed_against)),
                    ToAdder::Barrier(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        let caught_up = || {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            // The adder only stops when this side drops its sender: it answers.
            let _ = to_adder.send(ToAdder::Barrier(done));
            let _ = wait.recv();
        };
        for (i, (named_seq, path)) in files.iter().enumerate() {
            // Only records from `wal_start` on are needed: a gap wholly before it (a
            // truncation interrupted by a crash may leave an older file whose removal was
            // not made durable while a newer one's was) loses nothing.
            let needed = next_seq.max(wal_start);
            if *named_seq > needed {
                gap(
                    accept_data_loss,
                    &mut lost,
                    needed,
                    named_seq - 1,
                    WalError::BadFile {
                        file: path.clone(),
                        why: FileProblem::Gap {
                            first: needed,
                            last: named_seq - 1,
                        },
                    },
                )?;
            }
            if *named_seq > next_seq {
                next_seq = *named_seq;
            }
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
            // Whether records are missing before the one visited (gaps inside this file are
            // seen as a jump in the numbers the visitor gets).
            let mut after_loss = !lost.is_empty();
            let mut expected = next_seq;
            let mut visit = |seq: u64, bytes: &[u8]| -> Result<(), Corruption> {
                after_loss |= seq != expected;
                expected = seq + 1;
                let payload = payload::decode(bytes).map_err(Corruption::Payload)?;
                if seq < wal_start {
                    // Archived, with the schemas of its time in the manifest's checkpoint.
                    recovery.skipped += 1;
                    return Ok(());
                }
                match payload {
                    Payload::Batch(mut view) => {
                        if after_loss {
                            recreate_lost_namespaces(core, &mut view);
                        }
                        recovery.events += view.incs.len() as u64;
                        let batch = core
                            .resolve(&view, seq, now, Some(replayed_against))
                            .map_err(Corruption::Apply)?;
                        if let Err(std::sync::mpsc::SendError(ToAdder::Batch(batch))) =
                            to_adder.send(ToAdder::Batch(batch))
                        {
                            // The adder is gone (it panicked): add here.
                            core.add_resolved(batch, now, Some(replayed_against));
                        }
                        Ok(())
                    }
                    Payload::Schema(ns, schema) => {
                        caught_up();
                        core.apply_schema(&ns, &schema, seq)
                            .map_err(Corruption::Apply)
                    }
                }
            };
            let gaps = if accept_data_loss {
                Gaps::Accept
            } else {
                Gaps::Refuse
            };
            let end = reader::scan_with(path, &bytes, next_seq, is_last, gaps, &mut visit)?;
            // Only `Gaps::Accept` notes a gap; `Refuse` returned it as an error.
            for &(first, last) in &end.missing {
                note_loss(&mut lost, first, last);
            }
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
        // Dropping the sender ends the adder; the scope waits for it.
        drop(to_adder);
        Ok(())
    });
    // Live writes check the retention of their time.
    core.set_replay_retentions(HashMap::new());
    replayed?;
    // The archive holds records up to the largest flushed_seq, so the log reached it.
    let archived = archive
        .manifest
        .segments
        .iter()
        .map(|s| s.flushed_seq)
        .max()
        .unwrap_or(0);
    if archived >= MAX_SEQ {
        return Err(WalError::BadFile {
            file: wal_dir.to_owned(),
            why: FileProblem::SequenceOutOfRange { seq: archived },
        }
        .into());
    }
    // Where the log's own numbering goes on; a missing tail moves `next_seq` past it.
    let log_next = next_seq;
    // Every publish synced the log through `wal_start - 1` first, so the log reached that
    // too, even once retention dropped the segments that said so: a log ending before it
    // lost acknowledged records (its newest files), and numbering new ones below
    // `wal_start` would have the next recovery skip them.
    let reached = archived.max(wal_start.saturating_sub(1));
    // (Numbers start at 1: a log that ends at 0 misses nothing.)
    let tail_missing = reached >= next_seq.max(1);
    if tail_missing {
        let dir = wal_dir.to_owned();
        gap(
            accept_data_loss,
            &mut lost,
            next_seq,
            reached,
            WalError::MissingTail {
                dir,
                first: next_seq,
                last: reached,
            },
        )?;
        next_seq = reached + 1;
    }
    // The newest file the log ever started must still be there (or a later one): the log
    // removes only its oldest files. Without it, the records written since the last publish
    // are gone, and nothing else would tell.
    let newest = files.last().map(|f| f.0);
    let closed_at = head.and_then(|h| h.closed_at);
    let head = head.map(|h| h.newest);
    if let Some(head) = head
        && newest.is_none_or(|n| n < head)
    {
        // (A log ending before what the archive holds was refused, or accepted, above: the
        // lost range is then known; only the numbering is held past the lost files here.)
        if tail_missing {
            next_seq = next_seq.max(head + 1);
        } else {
            gap(
                accept_data_loss,
                &mut lost,
                next_seq.min(head),
                head,
                WalError::LostNewest {
                    dir: wal_dir.to_owned(),
                    first: next_seq.min(head),
                    head,
                    newest,
                },
            )?;
            // New records are numbered past the lost file's first one, so the file they go in
            // is named apart from the lost one. (The lost records are gone, and no segment
            // claims them: the archive's claims were checked above.)
            next_seq = next_seq.max(head + 1);
        }
    } else if let Some(closed) = closed_at
        && log_next < closed
    {
        // Closed cleanly with every record before `closed`: a shorter log lost its end since
        // (cut off, zeroed, damaged), which recovery would otherwise take for a torn write.
        if !tail_missing {
            gap(
                accept_data_loss,
                &mut lost,
                log_next,
                closed - 1,
                WalError::CutAfterClose {
                    dir: wal_dir.to_owned(),
                    first: log_next,
                    last: closed - 1,
                },
            )?;
        }
        next_seq = next_seq.max(closed);
    }
    recovery.lost = lost;
    // A new file is named for its first record: past the last number a log may use, the
    // next recovery would refuse it (a log that took the last number goes on in its file).
    let out_of_numbers = || -> OpenError {
        WalError::BadFile {
            file: wal_dir.to_owned(),
            why: FileProblem::SequenceOutOfRange { seq: next_seq },
        }
        .into()
    };
    let new_file = |path: &Path| -> Result<LogFile, OpenError> {
        if next_seq >= MAX_SEQ {
            return Err(out_of_numbers());
        }
        LogFile::create(path, &crate::wal::file_header(next_seq), faults.clone())
            .map_err(io_at(path))
    };
    // The file appended to from here on, and its first record number.
    let (file, appending) = match last_end {
        Some((path, len)) if len >= FILE_HEADER_LEN as u64 && next_seq == log_next => (
            LogFile::reopen(&path, len, faults.clone()).map_err(io_at(&path))?,
            files.last().map_or(next_seq, |f| f.0),
        ),
        Some((path, len)) if len >= FILE_HEADER_LEN as u64 => {
            // Numbering jumps past a missing tail: cut the last file back to its last whole
            // record, and append in a new file named for the next number (a record appended
            // to the old one would not be the number its name and records give).
            drop(LogFile::reopen(&path, len, faults.clone()).map_err(io_at(&path))?);
            (new_file(&file_name(wal_dir, next_seq))?, next_seq)
        }
        Some((path, _)) => {
            // The last file never got a whole header: nothing in it was acknowledged.
            std::fs::remove_file(&path).map_err(io_at(&path))?;
            (new_file(&file_name(wal_dir, next_seq))?, next_seq)
        }
        None => (new_file(&file_name(wal_dir, next_seq))?, next_seq),
    };
    // That file is the newest one (a log from before HEAD existed gets one now).
    // Open again: not closed until the writer closes it.
    let head = crate::wal::Head {
        newest: appending,
        closed_at: None,
    };
    crate::wal::write_head(wal_dir, head).map_err(io_at(wal_dir))?;
    Ok((file, next_seq, recovery))
}

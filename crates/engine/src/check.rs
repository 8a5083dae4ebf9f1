//! `tally check`: reads every byte of a data directory that carries a checksum — the
//! manifest, every block and index of every archive segment it lists, every answers file, every record of every
//! log file — and says, per file, whether it is whole. It changes nothing, so it can run
//! beside a server (the last log file may then end in a write in progress: a torn tail,
//! reported but not counted as damage).

use std::path::{Path, PathBuf};

use crate::archive::{open_listed, segment_path};
use crate::manifest::{self, ManifestError};
use crate::segment::{SegmentError, SegmentStats};
use crate::wal::payload;
use crate::wal::reader::{self, TornTail};
use crate::wal::{Corruption, FileProblem, WalError, list_files};

/// What was found in one file.
#[derive(Debug)]
pub enum Finding {
    Manifest {
        path: PathBuf,
        segments: usize,
        wal_start: u64,
    },
    Segment {
        path: PathBuf,
        stats: SegmentStats,
    },
    /// An idempotency answers file.
    Answers {
        path: PathBuf,
        answers: usize,
    },
    Log {
        path: PathBuf,
        records: u64,
        torn: Option<TornTail>,
    },
}

/// A damaged or missing file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Damage {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error(transparent)]
    Log(#[from] WalError),
    /// The I/O error is in the message, not also its `source` (a chain says it once).
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
}

/// Everything `check` looked at.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub findings: Vec<Finding>,
    pub damage: Vec<Damage>,
}

impl CheckReport {
    pub fn is_whole(&self) -> bool {
        self.damage.is_empty()
    }
}

/// Checks a data directory. Only a directory that cannot be read at all is an `Err`.
///
/// Beside a running server, a compaction or a flush may replace the manifest and remove a
/// file while it is read; a check that finds a file missing under a manifest that has since
/// been replaced is not damage: a segment the current manifest no longer lists, or a log
/// file before its `wal_start`, is skipped, and a manifest that vanished under the check
/// makes it start over (a few times).
pub fn check(dir: &Path) -> Result<CheckReport, std::io::Error> {
    std::fs::metadata(dir)?;
    let mut report = check_once(dir)?;
    for _ in 0..5 {
        if report.is_whole() || !manifest_changed(dir, &report) {
            break;
        }
        report = check_once(dir)?;
    }
    Ok(report)
}

/// Whether `CURRENT` now names another manifest than the one `report` read.
fn manifest_changed(dir: &Path, report: &CheckReport) -> bool {
    let read = report.findings.iter().find_map(|f| match f {
        Finding::Manifest { path, .. } => Some(path.clone()),
        _ => None,
    });
    let now = manifest::load(dir)
        .ok()
        .flatten()
        .map(|m| manifest::file_name(dir, m.number));
    read != now
}

/// The manifest `CURRENT` names now, if it can be read.
fn current(dir: &Path) -> Option<manifest::Manifest> {
    manifest::load(dir).ok().flatten()
}

fn not_found(e: &SegmentError) -> bool {
    matches!(e, SegmentError::Io { err, .. } if err.kind() == std::io::ErrorKind::NotFound)
}

fn check_once(dir: &Path) -> Result<CheckReport, std::io::Error> {
    let mut report = CheckReport::default();
    if let Some(marker) = crate::backup::unfinished(dir) {
        report.damage.push(Damage::Io {
            path: dir.to_owned(),
            err: crate::backup::unfinished_error(&marker),
        });
    }
    // The log is listed before the manifest is read: a flush in between only raises
    // wal_start, so the files listed still cover what the manifest read needs.
    let wal_dir = dir.join("wal");
    // The newest log file ever started, read before the files are listed: a running
    // server only starts files after it, so the listing holds it or a later one.
    let head = match crate::wal::read_head(&wal_dir) {
        Ok(h) => h,
        Err(e) => {
            report.damage.push(e.into());
            None
        }
    };
    let files = match list_files(&wal_dir) {
        Ok(f) => f,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => {
            report.damage.push(Damage::Io {
                path: wal_dir,
                err: source,
            });
            return Ok(report);
        }
    };
    let mut wal_start = 1;
    // The last log record the archive says the log reached (recovery's rule: every publish
    // synced the log through it).
    let mut reached = 0;
    match manifest::load(dir) {
        Ok(None) => {}
        Ok(Some(m)) => {
            wal_start = m.wal_start;
            reached = m
                .segments
                .iter()
                .map(|s| s.flushed_seq)
                .max()
                .unwrap_or(0)
                .max(wal_start.saturating_sub(1));
            report.findings.push(Finding::Manifest {
                path: manifest::file_name(dir, m.number),
                segments: m.segments.len(),
                wal_start,
            });
            for e in &m.segments {
                let path = segment_path(&dir.join("segments"), e.id);
                match open_listed(&dir.join("segments"), e).and_then(|s| s.verify()) {
                    Ok(stats) => report.findings.push(Finding::Segment { path, stats }),
                    // Compacted away since the manifest was read: not damage.
                    Err(err)
                        if not_found(&err)
                            && current(dir)
                                .is_some_and(|now| !now.segments.iter().any(|s| s.id == e.id)) => {}
                    Err(err) => report.damage.push(err.into()),
                }
            }
            for a in &m.answers {
                match manifest::read_answers(&dir.join("segments"), a) {
                    Ok(got) => report.findings.push(Finding::Answers {
                        path: manifest::answers_path(&dir.join("segments"), a.id),
                        answers: got.len(),
                    }),
                    // Dropped since the manifest was read (its answers expired): not damage.
                    Err(ManifestError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound
                            && current(dir).is_some_and(|now| !now.answers.contains(a)) => {}
                    Err(err) => report.damage.push(err.into()),
                }
            }
        }
        Err(e @ ManifestError::MissingCurrent { .. }) => {
            // The log was truncated after a publish: its start is the manifest's business,
            // which the damage names, not a gap of its own.
            wal_start = files.first().map_or(1, |(first, _)| *first);
            report.damage.push(e.into());
        }
        Err(e) => report.damage.push(e.into()),
    }
    if let Some((first, path)) = files.first()
        && *first > wal_start
    {
        report.damage.push(
            WalError::BadFile {
                file: path.clone(),
                why: FileProblem::MissingRecords {
                    needed: wal_start,
                    found: *first,
                },
            }
            .into(),
        );
    }
    let mut next_seq = files.first().map_or(wal_start, |(s, _)| *s);
    for (i, (named, path)) in files.iter().enumerate() {
        if *named != next_seq {
            // Records recovery needs (from wal_start on) are missing: it refuses to open the
            // directory. A gap wholly before wal_start loses nothing (a truncation cut
            // short by a crash can leave one). Either way the file is checked on its own
            // terms.
            let needed = next_seq.max(wal_start);
            if *named > needed {
                report.damage.push(
                    WalError::BadFile {
                        file: path.clone(),
                        why: FileProblem::Gap {
                            first: needed,
                            last: named - 1,
                        },
                    }
                    .into(),
                );
            }
            next_seq = *named;
        }
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            // Truncated by a flush since the log was listed: not damage.
            Err(source)
                if source.kind() == std::io::ErrorKind::NotFound
                    && current(dir).is_some_and(|m| m.wal_start > *named) =>
            {
                continue;
            }
            Err(source) => {
                report.damage.push(Damage::Io {
                    path: path.clone(),
                    err: source,
                });
                continue;
            }
        };
        let is_last = i + 1 == files.len();
        let mut visit = |_seq: u64, p: &[u8]| -> Result<(), Corruption> {
            payload::decode(p).map(|_| ()).map_err(Corruption::Payload)
        };
        match reader::scan(path, &bytes, next_seq, is_last, &mut visit) {
            Ok(end) => {
                next_seq = end.next_seq;
                report.findings.push(Finding::Log {
                    path: path.clone(),
                    records: end.records,
                    torn: end.torn,
                });
            }
            Err(e) => report.damage.push(e.into()),
        }
    }
    // The log ends before records the archive says it held: its newest files are gone, and
    // recovery refuses the directory. Unless the log grew since it was listed (a running
    // server's new file, holding what a publish since then flushed).
    let mut tail_missing = false;
    if reached >= next_seq.max(1) {
        let grew = list_files(&wal_dir)
            .is_ok_and(|now| now.last().map(|f| f.0) > files.last().map(|f| f.0));
        if !grew {
            tail_missing = true;
            report.damage.push(
                WalError::MissingTail {
                    dir: wal_dir.clone(),
                    first: next_seq,
                    last: reached,
                }
                .into(),
            );
        }
    }
    // The log's newest file ever started is gone (and any after it): recovery refuses.
    let newest = files.last().map(|f| f.0);
    // (Reported once: a log ending before what the archive holds was reported above.)
    if let Some(head) = head
        && !tail_missing
    {
        if newest.is_none_or(|n| n < head.newest) {
            report.damage.push(
                WalError::LostNewest {
                    dir: wal_dir.clone(),
                    first: next_seq.min(head.newest),
                    head: head.newest,
                    newest,
                }
                .into(),
            );
        } else if let Some(closed) = head.closed_at
            && next_seq < closed
        {
            // Closed cleanly after record `closed - 1`: a shorter log was cut since (a server
            // started meanwhile only appends).
            report.damage.push(
                WalError::CutAfterClose {
                    dir: wal_dir.clone(),
                    first: next_seq,
                    last: closed - 1,
                }
                .into(),
            );
        }
    }
    Ok(report)
}

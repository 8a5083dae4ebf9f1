//! `tally backup`: a consistent copy of a data directory, taken while a server may be
//! writing to it. The archive is immutable, so the segments and answers files the live
//! manifest names are hard-linked (copied across file systems); the log files from the manifest's `wal_start` on
//! are copied, oldest first — a log only grows at its end, so what is copied is a prefix of
//! it, and a record cut short at the very end is a torn tail recovery drops. If a flush or a
//! compaction publishes a new manifest meanwhile and removes a file the copy needs, the copy
//! starts over (a few times at most).

use std::path::{Path, PathBuf};

use crate::archive::segment_path;
use crate::io::sync_dir;
use crate::manifest::{self, CURRENT, Manifest, ManifestError, answers_path};
use crate::wal::list_files;

/// What a backup copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupReport {
    pub manifest: Option<u64>,
    pub segments: usize,
    /// Segments that could not be hard-linked and were copied.
    pub segments_copied: usize,
    /// Idempotency answers files (hard-linked or copied as segments are).
    pub answers_files: usize,
    pub log_files: usize,
    pub bytes_copied: u64,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    #[error("{} exists and is not an empty directory", path.display())]
    DestinationNotEmpty { path: PathBuf },
    #[error(
        "{} is inside the data directory {}: a backup must live apart from what it copies",
        dest.display(),
        data.display()
    )]
    DestinationInside { dest: PathBuf, data: PathBuf },
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("the archive kept changing under the copy ({attempts} attempts); try again")]
    Unstable { attempts: usize },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_owned(),
        source,
    }
}

const ATTEMPTS: usize = 5;

/// `path` with every link and `..` resolved, as far as it exists; the part that does not
/// exist yet is appended as given.
fn resolved(path: &Path) -> std::io::Result<PathBuf> {
    let mut rest = Vec::new();
    let mut at = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    loop {
        match at.canonicalize() {
            Ok(mut real) => {
                real.extend(rest.iter().rev());
                return Ok(real);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(name), Some(parent)) = (at.file_name(), at.parent()) else {
                    return Err(e);
                };
                rest.push(name.to_owned());
                at = parent.to_owned();
            }
            Err(e) => return Err(e),
        }
    }
}

/// Copies the data directory `src` to `dest` (created; must not hold anything yet, nor
/// lie inside `src`: the server would find the copy among its own files).
pub fn backup(src: &Path, dest: &Path) -> Result<BackupReport, BackupError> {
    let data = resolved(src).map_err(io(src))?;
    if resolved(dest).map_err(io(dest))?.starts_with(&data) {
        return Err(BackupError::DestinationInside {
            dest: dest.to_owned(),
            data: src.to_owned(),
        });
    }
    if let Ok(mut entries) = std::fs::read_dir(dest)
        && entries.next().is_some()
    {
        return Err(BackupError::DestinationNotEmpty {
            path: dest.to_owned(),
        });
    }
    for attempt in 1..=ATTEMPTS {
        let _ = std::fs::remove_dir_all(dest);
        match try_once(src, dest) {
            Ok(Some(report)) => return Ok(report),
            Ok(None) => {}
            Err(e) => {
                // A failed backup leaves nothing behind: run again, it finds an empty place.
                let _ = std::fs::remove_dir_all(dest);
                return Err(e);
            }
        }
        tracing::info!(
            attempt,
            "the archive changed during the backup; starting over"
        );
    }
    let _ = std::fs::remove_dir_all(dest);
    Err(BackupError::Unstable { attempts: ATTEMPTS })
}

/// What [`link_or_copy`] did.
enum Placed {
    Linked,
    /// Copied, this many bytes (across file systems).
    Copied(u64),
    /// The source is gone.
    Gone,
}

/// Hard-links `from` to `to`, else copies it.
fn link_or_copy(from: &Path, to: &Path) -> Result<Placed, BackupError> {
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(Placed::Linked);
    }
    match std::fs::copy(from, to) {
        Ok(n) => Ok(Placed::Copied(n)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Placed::Gone),
        Err(e) => Err(io(from)(e)),
    }
}

/// One attempt; `None` when the source changed in a way that spoils it.
fn try_once(src: &Path, dest: &Path) -> Result<Option<BackupReport>, BackupError> {
    let (dest_wal, dest_segs) = (dest.join("wal"), dest.join("segments"));
    for d in [dest, &dest_wal, &dest_segs] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let current = |src: &Path| std::fs::read(src.join(CURRENT)).ok();
    let named = current(src);
    let m: Option<Manifest> = match manifest::load(src) {
        Ok(m) => m,
        // A flush or a compaction published a new manifest between the reads of `CURRENT`
        // and of the manifest it named, and removed that one: start over. (A `CURRENT`
        // that still names a missing manifest is damage, reported.)
        Err(ManifestError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound && current(src) != named =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let mut report = BackupReport {
        manifest: m.as_ref().map(|m| m.number),
        ..BackupReport::default()
    };
    let wal_start = m.as_ref().map_or(1, |m| m.wal_start);
    // Segments and answers files, immutable both: hard-linked, else copied. One the
    // manifest names may be gone since it was read (compacted away, or all its answers
    // expired): start over.
    let src_segs = src.join("segments");
    for e in m.iter().flat_map(|m| &m.segments) {
        let (from, to) = (
            segment_path(&src_segs, e.id),
            segment_path(&dest_segs, e.id),
        );
        match link_or_copy(&from, &to)? {
            Placed::Gone => return Ok(None),
            Placed::Linked => {}
            Placed::Copied(n) => {
                report.segments_copied += 1;
                report.bytes_copied += n;
            }
        }
        report.segments += 1;
    }
    for a in m.iter().flat_map(|m| &m.answers) {
        let (from, to) = (
            answers_path(&src_segs, a.id),
            answers_path(&dest_segs, a.id),
        );
        match link_or_copy(&from, &to)? {
            Placed::Gone => return Ok(None),
            Placed::Linked => {}
            Placed::Copied(n) => report.bytes_copied += n,
        }
        report.answers_files += 1;
    }
    let files = list_files(&src.join("wal")).map_err(io(&src.join("wal")))?;
    let needed: Vec<&(u64, PathBuf)> = files
        .iter()
        .enumerate()
        .filter(|(i, _)| files.get(i + 1).is_none_or(|(next, _)| *next > wal_start))
        .map(|(_, f)| f)
        .collect();
    if needed.first().is_some_and(|(first, _)| *first > wal_start) {
        return Ok(None);
    }
    for (_, path) in &needed {
        let Some(name) = path.file_name() else {
            continue;
        };
        match std::fs::copy(path, dest_wal.join(name)) {
            Ok(n) => report.bytes_copied += n,
            // Truncated away by a flush that published a newer manifest: start over.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(path)(e)),
        }
        report.log_files += 1;
    }
    if let Some(m) = &m {
        let name = manifest::file_name(src, m.number);
        let to = manifest::file_name(dest, m.number);
        match std::fs::copy(&name, &to) {
            Ok(n) => report.bytes_copied += n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&name)(e)),
        }
        let current = dest.join(CURRENT);
        std::fs::write(&current, format!("MANIFEST-{:020}\n", m.number)).map_err(io(&current))?;
    }
    // Make the copy durable before saying it exists.
    for d in [&dest_segs, &dest_wal] {
        for entry in std::fs::read_dir(d).map_err(io(d))? {
            let p = entry.map_err(io(d))?.path();
            std::fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(io(&p))?;
        }
        sync_dir(d).map_err(io(d))?;
    }
    for p in std::fs::read_dir(dest).map_err(io(dest))? {
        let p = p.map_err(io(dest))?.path();
        if p.is_file() {
            std::fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(io(&p))?;
        }
    }
    sync_dir(dest).map_err(io(dest))?;
    Ok(Some(report))
}

//! `tally backup`: a consistent copy of a data directory, taken while a server may be
//! writing to it. The archive is immutable, so the segments and answers files the live
//! manifest names are hard-linked (copied across file systems); the log files from the manifest's `wal_start` on
//! are copied, oldest first — a log only grows at its end, so what is copied is a prefix of
//! it, and a record cut short at the very end is a torn tail recovery drops. If a flush or a
//! compaction publishes a new manifest meanwhile and removes a file the copy needs, the copy
//! starts over (a few times at most), keeping what it already placed that is still needed
//! (segments and answers files never change; a log file that has not grown is the same), so
//! that each attempt copies only what changed and a large copy converges under a live
//! server's flushes.
//!
//! A backup cut short must never pass for a data directory: [`UNFINISHED`] is written into
//! the destination first and removed last, once every file is synced, and everything that
//! opens a data directory refuses one holding it.

use std::collections::{HashMap, HashSet};
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
    /// Bytes of the copy not shared with the source through hard links: what this attempt
    /// or an earlier one copied.
    pub bytes_copied: u64,
    /// Attempts made: more than one when a flush or a compaction changed the archive under
    /// the copy (each keeps what the ones before placed).
    pub attempts: usize,
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
    #[error("copying {} to {}", from.display(), to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
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

/// The file a backup in progress keeps in its destination (see the module's docs).
pub const UNFINISHED: &str = "BACKUP-UNFINISHED";

/// The marker of an unfinished backup in `dir`, if it holds one.
pub fn unfinished(dir: &Path) -> Option<PathBuf> {
    let marker = dir.join(UNFINISHED);
    std::fs::symlink_metadata(&marker).is_ok().then_some(marker)
}

/// The error for a directory holding an unfinished backup's marker.
pub fn unfinished_error(marker: &Path) -> std::io::Error {
    std::io::Error::other(format!(
        "{} is there: this directory is a backup that did not finish and may lack files; take \
         the backup again",
        marker.display()
    ))
}

/// Whether `path` (existing or not) lies inside directory `dir`, links and `..` resolved:
/// what a backup refuses for its destination, and an export for its output.
pub fn is_inside(path: &Path, dir: &Path) -> std::io::Result<bool> {
    Ok(resolved(path)?.starts_with(resolved(dir)?))
}

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
    // A backup of an unfinished backup would lack what it lacks, without its marker.
    if let Some(marker) = unfinished(src) {
        return Err(BackupError::Io {
            path: src.to_owned(),
            source: unfinished_error(&marker),
        });
    }
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
    // (A destination made here is removed with a failed copy; one the user made stays.)
    let created = std::fs::symlink_metadata(dest).is_err();
    let fail = |e| {
        // A failed backup leaves nothing behind: run again, it finds an empty place.
        remove_copy(dest, created);
        e
    };
    std::fs::create_dir_all(dest).map_err(io(dest))?;
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent).map_err(io(parent))?;
    }
    // Made by this backup alone: of two backups into one empty place, the second stops here
    // and leaves the first's copy alone.
    let marker = dest.join(UNFINISHED);
    match std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(&marker)
    {
        Ok(mut f) => {
            use std::io::Write;
            f.write_all(b"a backup in progress\n")
                .and_then(|()| f.sync_all())
                .and_then(|()| sync_dir(dest))
                .map_err(io(&marker))
                .map_err(fail)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(BackupError::DestinationNotEmpty {
                path: dest.to_owned(),
            });
        }
        // Not this backup's marker: nothing here is this backup's but the directory.
        Err(e) => {
            if created {
                let _ = std::fs::remove_dir(dest);
            }
            return Err(io(&marker)(e));
        }
    }
    // Something else arrived between the check that the place was empty and the marker (a
    // whole backup, in that moment): leave it alone.
    if std::fs::read_dir(dest).map_err(io(dest))?.count() > 1 {
        let _ = std::fs::remove_file(&marker);
        return Err(BackupError::DestinationNotEmpty {
            path: dest.to_owned(),
        });
    }
    let mut logs = HashMap::new();
    for attempt in 1..=ATTEMPTS {
        match try_once(src, dest, &mut logs) {
            Ok(Some(mut report)) => {
                report.attempts = attempt;
                // Every file is synced: only now is the copy a data directory.
                std::fs::remove_file(&marker)
                    .map_err(io(&marker))
                    .map_err(fail)?;
                // (Whole now: a failure to sync its directory is said, the copy kept.)
                sync_dir(dest).map_err(io(dest))?;
                return Ok(report);
            }
            Ok(None) => {}
            Err(e) => return Err(fail(e)),
        }
        tracing::info!(
            attempt,
            "the archive changed during the backup; starting over"
        );
    }
    remove_copy(dest, created);
    Err(BackupError::Unstable { attempts: ATTEMPTS })
}

/// Removes a failed backup's copy: what a backup makes (`segments/`, `wal/`, `CURRENT`,
/// `MANIFEST-*`) first, synced, and only then — if that left nothing but the
/// [`UNFINISHED`] marker — the marker, and the directory if this backup made it. A crash on
/// the way, or a file that would not go, never leaves copied files without the marker (a
/// removal in the order the directory lists its files may take the marker first: found by
/// a black-box review on ext4 without `dir_index`).
fn remove_copy(dest: &Path, created: bool) {
    let ours =
        |name: &str| matches!(name, "segments" | "wal" | CURRENT) || name.starts_with("MANIFEST-");
    let Ok(entries) = std::fs::read_dir(dest) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !ours(&name.to_string_lossy()) {
            continue;
        }
        let p = entry.path();
        let _ = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
            _ => std::fs::remove_file(&p),
        };
    }
    let left: Vec<_> = match std::fs::read_dir(dest) {
        Ok(entries) => entries.flatten().map(|e| e.file_name()).collect(),
        Err(_) => return,
    };
    if sync_dir(dest).is_err() || left.iter().any(|n| n != UNFINISHED) {
        tracing::warn!(
            dest = %dest.display(),
            "a failed backup's copy could not be removed whole; its BACKUP-UNFINISHED stays"
        );
        return;
    }
    let _ = std::fs::remove_file(dest.join(UNFINISHED));
    if created {
        let _ = std::fs::remove_dir(dest);
    }
}

/// What [`link_or_copy`] did.
enum Placed {
    Linked,
    /// Copied, this many bytes (across file systems).
    Copied(u64),
    /// The source is gone.
    Gone,
}

/// What tells a file's bytes unchanged since it was copied: its identity (device and inode),
/// its length and its last change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    file: (u64, u64),
    len: u64,
    modified: Option<std::time::SystemTime>,
    /// The inode's last change (s, ns): finer than some file systems' modification times.
    changed: (i64, i64),
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let (file, changed) = {
        use std::os::unix::fs::MetadataExt;
        ((m.dev(), m.ino()), (m.ctime(), m.ctime_nsec()))
    };
    #[cfg(not(unix))]
    let (file, changed) = ((0, 0), (0, 0));
    Some(Stamp {
        file,
        len: m.len(),
        modified: m.modified().ok(),
        changed,
    })
}

/// Hard-links `from` to `to`, else copies it; kept as it is when an earlier attempt placed
/// it already (`to` of `from`'s length: the files this places never change), and then told
/// as what that attempt did.
fn link_or_copy(from: &Path, to: &Path) -> Result<Placed, BackupError> {
    if same_length(from, to) {
        return Ok(match (stamp(from), stamp(to)) {
            (Some(f), Some(t)) if f.file == t.file => Placed::Linked,
            (_, t) => Placed::Copied(t.map_or(0, |t| t.len)),
        });
    }
    let _ = std::fs::remove_file(to);
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(Placed::Linked);
    }
    copy(from, to).map(|n| n.map_or(Placed::Gone, Placed::Copied))
}

/// Whether `to` exists with `from`'s length.
fn same_length(from: &Path, to: &Path) -> bool {
    match (std::fs::metadata(from), std::fs::metadata(to)) {
        (Ok(f), Ok(t)) => f.len() == t.len(),
        _ => false,
    }
}

/// Copies `from` to `to`: the bytes copied, `None` when `from` is gone.
fn copy(from: &Path, to: &Path) -> Result<Option<u64>, BackupError> {
    match std::fs::copy(from, to) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !from.exists() => Ok(None),
        Err(source) => Err(BackupError::Copy {
            from: from.to_owned(),
            to: to.to_owned(),
            source,
        }),
    }
}

/// Removes from `dir` every file not in `keep` (what earlier attempts placed and this one
/// does not need).
fn remove_others(dir: &Path, keep: &[PathBuf]) -> Result<(), BackupError> {
    let keep: HashSet<&PathBuf> = keep.iter().collect();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let p = entry.map_err(io(dir))?.path();
        if !keep.contains(&p) {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// One attempt; `None` when the source changed in a way that spoils it. `logs` holds, from
/// attempt to attempt, each log file copied and its source's [`Stamp`] just before.
fn try_once(
    src: &Path,
    dest: &Path,
    logs: &mut HashMap<PathBuf, Stamp>,
) -> Result<Option<BackupReport>, BackupError> {
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
    let mut placed_segs = Vec::new();
    let files = m.iter().flat_map(|m| {
        let segs = m.segments.iter().map(|e| {
            (
                segment_path(&src_segs, e.id),
                segment_path(&dest_segs, e.id),
                true,
            )
        });
        let answers = m.answers.iter().map(|a| {
            (
                answers_path(&src_segs, a.id),
                answers_path(&dest_segs, a.id),
                false,
            )
        });
        segs.chain(answers)
    });
    for (from, to, segment) in files {
        match link_or_copy(&from, &to)? {
            Placed::Gone => return Ok(None),
            Placed::Linked => {}
            Placed::Copied(n) => {
                report.segments_copied += usize::from(segment);
                report.bytes_copied += n;
            }
        }
        if segment {
            report.segments += 1;
        } else {
            report.answers_files += 1;
        }
        placed_segs.push(to);
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
    let mut placed_wal = Vec::new();
    for (_, path) in &needed {
        let Some(name) = path.file_name() else {
            continue;
        };
        let to = dest_wal.join(name);
        // A log file copied by an earlier attempt is kept if it has not changed since (a
        // log mostly grows at its end, but a restart may cut a torn tail and write again
        // over it, to the same length).
        let now = stamp(path);
        match now {
            Some(now) if logs.get(path) == Some(&now) && to.exists() => {
                report.bytes_copied += now.len;
            }
            _ => {
                match copy(path, &to)? {
                    Some(n) => report.bytes_copied += n,
                    // Truncated away by a flush that published a newer manifest: start over.
                    None => return Ok(None),
                }
                if let Some(now) = now {
                    logs.insert(path.clone(), now);
                }
            }
        }
        report.log_files += 1;
        placed_wal.push(to);
    }
    // The newest log file copied, recorded as `wal/HEAD` records it (open: the copy ends
    // where a crash would have cut it), so that losing it from the backup is found.
    if let Some(&&(newest, _)) = needed.last() {
        crate::wal::write_head(
            &dest_wal,
            crate::wal::Head {
                newest,
                closed_at: None,
            },
        )
        .map_err(io(&dest_wal))?;
        placed_wal.push(dest_wal.join(crate::wal::HEAD));
    }
    // What earlier attempts placed and this one does not need goes.
    remove_others(&dest_segs, &placed_segs)?;
    remove_others(&dest_wal, &placed_wal)?;
    if let Some(m) = &m {
        let name = manifest::file_name(src, m.number);
        let to = manifest::file_name(dest, m.number);
        match copy(&name, &to)? {
            Some(n) => report.bytes_copied += n,
            None => return Ok(None),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A log file an earlier attempt copied is kept only while its source is unchanged: one
    /// rewritten to the same length (a restart cutting a torn tail and writing over it) is
    /// copied again (found by a review: the length alone kept the stale bytes).
    #[test]
    fn a_log_file_is_copied_again_once_it_changed() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("wal")).unwrap();
        let log = crate::wal::file_name(&src.path().join("wal"), 1);
        std::fs::write(&log, b"first bytes").unwrap();
        let mut logs = HashMap::new();
        let copy = crate::wal::file_name(&dest.path().join("wal"), 1);
        // The copy's bytes, and its stamp (a file written again gets a new one).
        let copied = |logs: &mut HashMap<PathBuf, Stamp>| {
            let r = try_once(src.path(), dest.path(), logs).unwrap().unwrap();
            assert_eq!(r.bytes_copied, 11);
            (std::fs::read(&copy).unwrap(), stamp(&copy).unwrap())
        };
        let (bytes, first) = copied(&mut logs);
        assert_eq!(bytes, b"first bytes");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (bytes, kept) = copied(&mut logs);
        assert_eq!(bytes, b"first bytes");
        assert_eq!(kept, first, "unchanged: kept, not written again");
        std::fs::write(&log, b"other bytes").unwrap();
        let (bytes, again) = copied(&mut logs);
        assert_eq!(bytes, b"other bytes", "changed: copied again");
        assert_ne!(again, first);
        // Its HEAD names it, open.
        let head = crate::wal::read_head(&dest.path().join("wal"))
            .unwrap()
            .unwrap();
        assert_eq!((head.newest, head.closed_at), (1, None));
    }

    /// A failed copy goes with its marker last, and only what a backup makes: a file of the
    /// user's keeps the marker (and itself) in place; a directory the user made stays.
    #[test]
    fn a_failed_copy_is_removed_with_its_marker_last() {
        let place = tempfile::tempdir().unwrap();
        let dest = place.path().join("copy");
        let fill = |extra: bool| {
            std::fs::create_dir_all(dest.join("segments")).unwrap();
            std::fs::create_dir_all(dest.join("wal")).unwrap();
            std::fs::write(dest.join("wal").join("x.wal"), b"x").unwrap();
            std::fs::write(dest.join(CURRENT), b"MANIFEST-1\n").unwrap();
            std::fs::write(dest.join("MANIFEST-00000000000000000001"), b"m").unwrap();
            std::fs::write(dest.join(UNFINISHED), b"").unwrap();
            if extra {
                std::fs::write(dest.join("notes.txt"), b"mine").unwrap();
            }
        };
        fill(true);
        remove_copy(&dest, true);
        let mut left: Vec<_> = std::fs::read_dir(&dest)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [UNFINISHED, "notes.txt"]);
        std::fs::remove_file(dest.join("notes.txt")).unwrap();
        fill(false);
        remove_copy(&dest, false);
        assert_eq!(
            std::fs::read_dir(&dest).unwrap().count(),
            0,
            "the user's directory stays"
        );
        fill(false);
        remove_copy(&dest, true);
        assert!(!dest.exists(), "a directory the backup made goes");
    }
}

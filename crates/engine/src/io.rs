//! The engine's file I/O, small enough to fault-inject: tests flip a [`Faults`] switch to
//! make the next write or fsync fail, and check that the writer poisons itself — or, for a
//! full disk, that it refuses what it could not write and goes on once there is space.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Switches that make log I/O fail, for tests. Production passes none.
#[derive(Debug, Default)]
pub struct Faults {
    pub fail_writes: AtomicBool,
    pub fail_syncs: AtomicBool,
    /// Writes put their bytes in the file, then report failure: what a write cut short by a
    /// full disk does to the records it wrote whole before the cut.
    pub fail_after_writes: AtomicBool,
    /// Writes panic before writing anything: a bug in the middle of a log round.
    pub panic_writes: AtomicBool,
    /// `0`: off. `n`: the `n`-th write from now finds the disk full, and so does every
    /// write after it until this is set to `0` again (space freed): it writes half its
    /// bytes, then fails with [`io::ErrorKind::StorageFull`], as a write cut short by a
    /// full disk does.
    pub full_disk_at: AtomicU64,
    /// Creating a log file finds the disk full (its header half written), while writes to
    /// an existing one still fit: what running out of inodes, or of the last free block,
    /// does.
    pub no_space_for_new_files: AtomicBool,
}

impl Faults {
    fn check(flag: &AtomicBool, what: &str) -> io::Result<()> {
        if flag.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("injected {what} failure")));
        }
        Ok(())
    }

    /// Whether this write finds the disk full (see [`Faults::full_disk_at`]).
    fn disk_full_now(&self) -> bool {
        let at = &self.full_disk_at;
        match at.load(Ordering::SeqCst) {
            0 => false,
            1 => true,
            n => {
                at.store(n - 1, Ordering::SeqCst);
                false
            }
        }
    }
}

/// Whether an I/O error says the file system has no space (or quota) left: a condition
/// that passes once space is freed, unlike a failing disk.
pub fn is_full_disk(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// An append-only file that knows its length.
#[derive(Debug)]
pub struct LogFile {
    file: File,
    len: u64,
    faults: Option<Arc<Faults>>,
}

impl LogFile {
    /// Creates a new file holding `header`, durably (file and directory fsynced).
    pub fn create(path: &Path, header: &[u8], faults: Option<Arc<Faults>>) -> io::Result<Self> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        let mut f = LogFile {
            file,
            len: 0,
            faults,
        };
        if let Some(faults) = &f.faults
            && faults.no_space_for_new_files.load(Ordering::SeqCst)
        {
            f.file.write_all(&header[..header.len() / 2])?;
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected full disk creating a file",
            ));
        }
        f.write_all(header)?;
        f.sync()?;
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        Ok(f)
    }

    /// Opens an existing file for appending after its first `valid_len` bytes, cutting off
    /// anything after them (a torn tail) durably.
    pub fn reopen(path: &Path, valid_len: u64, faults: Option<Arc<Faults>>) -> io::Result<Self> {
        let file = OpenOptions::new().append(true).open(path)?;
        if file.metadata()?.len() != valid_len {
            file.set_len(valid_len)?;
            file.sync_all()?;
        }
        Ok(LogFile {
            file,
            len: valid_len,
            faults,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(f) = &self.faults {
            Faults::check(&f.fail_writes, "write")?;
            assert!(
                !f.panic_writes.load(Ordering::SeqCst),
                "injected panic in a log write"
            );
            if f.fail_after_writes.load(Ordering::SeqCst) {
                self.file.write_all(buf)?;
                return Err(io::Error::other(
                    "injected write failure after the bytes reached the file",
                ));
            }
            if f.disk_full_now() {
                self.file.write_all(&buf[..buf.len() / 2])?;
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "injected full disk (half the bytes written)",
                ));
            }
        }
        self.file.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Cuts the file back to `len` — the length it knows, after a failed
    /// [`LogFile::write_all`]; the length before a round whose fsync failed — and puts the
    /// write position there, so that the file could take appends again (a file made by
    /// [`LogFile::create`] writes at its position, which a failed write moved past the cut:
    /// the next write would leave a hole), then fsyncs. The fsync also makes every earlier
    /// write durable; if it fails, what the disk holds is uncertain.
    pub fn cut_to(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.len = len;
        self.file.seek(SeekFrom::Start(len))?;
        self.sync()
    }

    /// fdatasync: the data and the length, which is all a log needs.
    pub fn sync(&mut self) -> io::Result<()> {
        if let Some(f) = &self.faults {
            Faults::check(&f.fail_syncs, "fsync")?;
        }
        self.file.sync_data()
    }
}

/// fsyncs a directory so a created or removed name in it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The file-system operations that publish archive state (segments, manifests, `CURRENT`),
/// behind a trait so tests can crash the engine at any of them and check that what is left
/// on disk is a consistent state (see `tests/it/crash_publish.rs`).
pub trait Fs: Send + Sync + std::fmt::Debug {
    /// Creates `path` (which must not exist) holding `bytes`, and fsyncs the file. Its name
    /// is durable only once its directory is synced.
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Renames atomically, replacing `to`; durable once the directory is synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the names created, renamed or removed in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Removes a file; a missing one is not an error.
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// Replaces `path` with a file holding `bytes`, atomically and durably: written as
/// `<path>.tmp` (a leftover one removed first) and fsynced, renamed over `path`, the
/// directory synced. A crash leaves `path` whole, old or new.
pub fn replace(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    fs.remove(&tmp)?;
    fs.write_new(&tmp, bytes)?;
    fs.rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => fs.sync_dir(dir),
        None => Ok(()),
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsFs;

impl Fs for OsFs {
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        sync_dir(dir)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

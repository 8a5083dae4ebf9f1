//! The engine's file I/O, small enough to fault-inject: tests flip a [`Faults`] switch to
//! make the next write or fsync fail, and check that the writer poisons itself.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Switches that make log I/O fail, for tests. Production passes none.
#[derive(Debug, Default)]
pub struct Faults {
    pub fail_writes: AtomicBool,
    pub fail_syncs: AtomicBool,
}

impl Faults {
    fn check(flag: &AtomicBool, what: &str) -> io::Result<()> {
        if flag.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("injected {what} failure")));
        }
        Ok(())
    }
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
        }
        self.file.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(())
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

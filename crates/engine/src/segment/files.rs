//! Open segment files, bounded per process. A segment keeps its footer and key index in
//! memory, and reads blocks through a descriptor of its file; a year of backfilled days is
//! hundreds of segments (a `15m:forever` tier's history, thousands), so holding one
//! descriptor each ran a server out of them (a review: 1 100 segments under the common
//! limit of 1 024 open files made every flush fail). So at most [`max_open`] segment files
//! are open at once, process-wide (descriptors are the process's): opening one more closes
//! the one read least recently, and a read of a closed one opens it again (a few
//! microseconds: nothing but the descriptor is lost).
//!
//! A segment whose file is about to be removed (compaction merged or dropped it, and a
//! reader may still hold the archive that names it) is *pinned*: kept open, outside the
//! bound, until its last holder drops it, so its reads never meet a missing file.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

/// At most this many segment files open at once when the limit on open files is unknown or
/// very large; a quarter of the limit when that is smaller (connections and the log need
/// the rest), and never fewer than [`MIN_OPEN`].
const MAX_OPEN: usize = 4096;
const MIN_OPEN: usize = 16;

/// Set by [`set_max_open`]; 0: from the limit on open files.
static MAX_SET: AtomicUsize = AtomicUsize::new(0);
/// Ticks at every read: when a handle was read last.
static CLOCK: AtomicU64 = AtomicU64::new(0);
/// Segment files open now, pinned ones included.
static OPEN_COUNT: AtomicUsize = AtomicUsize::new(0);
static OPEN: OnceLock<Open> = OnceLock::new();

/// The bound in force.
pub fn max_open() -> usize {
    match MAX_SET.load(Ordering::Relaxed) {
        0 => {
            static FROM_LIMIT: OnceLock<usize> = OnceLock::new();
            *FROM_LIMIT.get_or_init(|| {
                rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(MAX_OPEN, |(soft, _)| {
                    usize::try_from(soft / 4)
                        .unwrap_or(MAX_OPEN)
                        .clamp(MIN_OPEN, MAX_OPEN)
                })
            })
        }
        n => n,
    }
}

/// Sets the bound for the whole process (at least 1); files open past it are closed as
/// segments are next opened.
pub fn set_max_open(n: usize) {
    MAX_SET.store(n.max(1), Ordering::Relaxed);
}

/// Segment files open now (pinned ones included).
pub fn open_now() -> usize {
    OPEN_COUNT.load(Ordering::Relaxed)
}

#[derive(Default)]
struct Open {
    next_id: AtomicU64,
    /// Every live handle, open or closed, by id.
    handles: Mutex<HashMap<u64, Weak<Handle>>>,
}

fn open() -> &'static Open {
    OPEN.get_or_init(Open::default)
}

/// One segment's file: its path, and its descriptor while open.
#[derive(Debug)]
pub(crate) struct Handle {
    id: u64,
    path: PathBuf,
    file: Mutex<Option<Arc<File>>>,
    last_read: AtomicU64,
    pinned: AtomicBool,
}

impl Handle {
    /// A handle for `file`, open at `path`; closes others if that passes the bound.
    pub(crate) fn new(path: &Path, file: File) -> Arc<Handle> {
        let o = open();
        let h = Arc::new(Handle {
            id: o.next_id.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            file: Mutex::new(Some(Arc::new(file))),
            last_read: AtomicU64::new(CLOCK.fetch_add(1, Ordering::Relaxed)),
            pinned: AtomicBool::new(false),
        });
        OPEN_COUNT.fetch_add(1, Ordering::Relaxed);
        o.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(h.id, Arc::downgrade(&h));
        h.make_room();
        h
    }

    fn is_open(&self) -> bool {
        self.file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The file, opened again if it was closed.
    pub(crate) fn file(&self) -> io::Result<Arc<File>> {
        self.last_read
            .store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        if let Some(f) = &*self.file.lock().unwrap_or_else(PoisonError::into_inner) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(&self.path)?);
        let got = {
            let mut slot = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            // Another reader may have opened it meanwhile: keep one.
            if slot.is_none() {
                OPEN_COUNT.fetch_add(1, Ordering::Relaxed);
            }
            slot.get_or_insert(f).clone()
        };
        self.make_room();
        Ok(got)
    }

    /// Keeps the file open until the handle is dropped, whatever the bound: its file is about
    /// to be removed while readers may still hold the segment.
    pub(crate) fn pin(&self) -> io::Result<()> {
        self.file()?;
        self.pinned.store(true, Ordering::Relaxed);
        // Closed between the two steps: open it again, now pinned.
        self.file().map(drop)
    }

    /// Closes its file if open; says whether it was.
    fn close(&self) -> bool {
        let was = self
            .file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some();
        if was {
            OPEN_COUNT.fetch_sub(1, Ordering::Relaxed);
        }
        was
    }

    /// Past [`max_open`] open files, closes the least recently read unpinned ones (never
    /// this one) down to 7/8 of it, so that the walk over every handle this takes comes
    /// once per eighth of the bound reopened, not at every reopen.
    fn make_room(&self) {
        let max = max_open();
        if OPEN_COUNT.load(Ordering::Relaxed) <= max {
            return;
        }
        let target = max - max / 8;
        let handles: Vec<Arc<Handle>> = open()
            .handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let mut candidates: Vec<&Arc<Handle>> = handles
            .iter()
            .filter(|h| h.is_open() && !h.pinned.load(Ordering::Relaxed))
            .collect();
        let pinned = handles
            .iter()
            .filter(|h| h.is_open() && h.pinned.load(Ordering::Relaxed))
            .count();
        let excess = (candidates.len() + pinned).saturating_sub(target);
        if excess == 0 {
            return;
        }
        candidates.retain(|h| h.id != self.id);
        candidates.sort_by_key(|h| h.last_read.load(Ordering::Relaxed));
        for h in candidates.into_iter().take(excess) {
            // A reader holding the file keeps it until done; the descriptor closes then.
            h.close();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.close();
        open()
            .handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

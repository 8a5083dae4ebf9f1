//! Open segment files, bounded per process. A segment keeps its footer and key index in
//! memory, and reads blocks through a descriptor of its file; a year of backfilled days is
//! hundreds of segments (a `15m:forever` tier's history, thousands), so holding one
//! descriptor each ran a server out of them (a review: 1 100 segments under the common
//! limit of 1 024 open files made every flush fail). So at most [`max_open`] segment files
//! are open at once, process-wide (descriptors are the process's): past it the least
//! recently read are closed, and a read of a closed one opens it again (only the descriptor
//! was lost: the segment's index stays in memory).
//!
//! A segment whose file compaction removes while a reader may still hold the archive that
//! names it is marked instead: its file is removed when the segment's last holder drops it,
//! so a read never meets a missing file, and no descriptor is held meanwhile (a retention
//! drop of a thousand segments must not open them all). A crash before that leaves the
//! file to the next open, which removes what the manifest does not name.

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
/// Segment files open now.
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

/// Segment files open now.
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
    /// Remove the file when the handle is dropped (compaction no longer lists it).
    remove_on_drop: AtomicBool,
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
            remove_on_drop: AtomicBool::new(false),
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

    /// Removes the file when the handle is dropped.
    pub(crate) fn remove_when_dropped(&self) {
        self.remove_on_drop.store(true, Ordering::Relaxed);
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

    /// Past [`max_open`] open files, closes the least recently read ones (never this one)
    /// down to 7/8 of it, so that the walk over every handle this takes comes
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
        // When each was read last, taken once: reads go on meanwhile, and a sort whose keys
        // change under it may panic (the standard sort checks its order).
        let mut candidates: Vec<(u64, &Arc<Handle>)> = handles
            .iter()
            .filter(|h| h.is_open())
            .map(|h| (h.last_read.load(Ordering::Relaxed), h))
            .collect();
        let excess = candidates.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        candidates.retain(|(_, h)| h.id != self.id);
        candidates.sort_unstable_by_key(|(at, h)| (*at, h.id));
        for (_, h) in candidates.into_iter().take(excess) {
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
        if self.remove_on_drop.load(Ordering::Relaxed)
            && let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(
                file = %self.path.display(),
                error = %e,
                "could not remove a compacted segment; the next open removes it"
            );
        }
    }
}

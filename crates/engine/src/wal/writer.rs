//! The log writer: a dedicated thread that takes records from any number of writers,
//! writes everything waiting in one `write`, fsyncs once for all of them (group commit)
//! per the policy, and only then answers. An I/O failure poisons it: every later append
//! fails with the first error (its `io::Error` kept as the cause), because after a failed
//! fsync nothing written can be assumed durable.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use tally_core::store::{FsyncPolicy, StoreError};

use super::{FILE_HEADER_LEN, file_header, file_name, put_frame};
use crate::io::{Faults, LogFile};

type Reply<T> = SyncSender<Result<T, StoreError>>;

enum Req {
    Append(Vec<u8>, Reply<u64>),
    Sync(Reply<()>),
    /// Close the current file (if it holds records) and start the next one.
    Rotate(Reply<()>),
}

/// Where the writer starts: the file to append to and the next sequence number.
#[derive(Debug)]
pub struct Start {
    pub dir: PathBuf,
    pub file: LogFile,
    pub next_seq: u64,
    pub policy: FsyncPolicy,
    pub max_file_bytes: u64,
    pub faults: Option<Arc<Faults>>,
}

/// Statistics for `/metrics` and benchmarks.
#[derive(Debug, Default, Clone, Copy)]
pub struct WalStats {
    pub bytes_written: u64,
    pub records: u64,
    pub fsyncs: u64,
    pub fsync_nanos: u64,
}

/// The handle writers use; cheap to share.
#[derive(Debug)]
pub struct Writer {
    tx: Mutex<Option<Sender<Req>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    poisoned: Arc<Mutex<Option<StoreError>>>,
    stats: Arc<Mutex<WalStats>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding these small locks leaves consistent data behind.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Writer {
    pub fn start(start: Start) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let poisoned = Arc::new(Mutex::new(None));
        let stats = Arc::new(Mutex::new(WalStats::default()));
        let state = State {
            dir: start.dir,
            file: start.file,
            next_seq: start.next_seq,
            policy: start.policy,
            max_file_bytes: start.max_file_bytes,
            faults: start.faults,
            poisoned: poisoned.clone(),
            stats: stats.clone(),
            dirty: false,
            last_sync: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name("tally-wal".into())
            .spawn(move || state.run(rx))?;
        Ok(Writer {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            poisoned,
            stats,
        })
    }

    fn send<T>(&self, make: impl FnOnce(Reply<T>) -> Req) -> Result<T, StoreError> {
        if let Some(p) = lock(&self.poisoned).as_ref() {
            return Err(p.clone());
        }
        let (reply, done) = mpsc::sync_channel(1);
        match lock(&self.tx).as_ref() {
            Some(tx) => tx
                .send(make(reply))
                .map_err(|_| StoreError::unavailable("the log writer has stopped"))?,
            None => return Err(StoreError::unavailable("the log is closed")),
        }
        done.recv()
            .map_err(|_| StoreError::unavailable("the log writer has stopped"))?
    }

    /// Appends one record payload; returns its sequence number once the policy is met. A
    /// payload longer than a record holds (`MAX_PAYLOAD_LEN`, which recovery refuses) is
    /// refused before anything is written.
    pub fn append(&self, payload: Vec<u8>) -> Result<u64, StoreError> {
        if payload.len() > super::MAX_PAYLOAD_LEN {
            return Err(StoreError::internal(format!(
                "a log record of {} bytes is longer than a record holds ({} bytes)",
                payload.len(),
                super::MAX_PAYLOAD_LEN
            )));
        }
        self.send(|reply| Req::Append(payload, reply))
    }

    /// Makes everything written so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.send(Req::Sync)
    }

    /// Starts a new file once everything sent before is written, so that the records
    /// before it can later be removed as a whole file.
    pub fn rotate(&self) -> Result<(), StoreError> {
        self.send(Req::Rotate)
    }

    /// The first I/O failure, if the writer is poisoned.
    pub fn poisoned(&self) -> Option<StoreError> {
        lock(&self.poisoned).clone()
    }

    pub fn stats(&self) -> WalStats {
        *lock(&self.stats)
    }

    /// Whether [`Writer::close`] has run: nothing more can be logged or published.
    pub fn is_closed(&self) -> bool {
        lock(&self.tx).is_none()
    }

    /// Stops the thread after it has written and fsynced everything sent before.
    pub fn close(&self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

struct State {
    dir: PathBuf,
    file: LogFile,
    next_seq: u64,
    policy: FsyncPolicy,
    max_file_bytes: u64,
    faults: Option<Arc<Faults>>,
    poisoned: Arc<Mutex<Option<StoreError>>>,
    stats: Arc<Mutex<WalStats>>,
    /// Written since the last fsync.
    dirty: bool,
    last_sync: Instant,
}

impl State {
    fn run(mut self, rx: Receiver<Req>) {
        let mut buf = Vec::with_capacity(1 << 20);
        let mut reqs = Vec::new();
        loop {
            let first = match self.policy {
                FsyncPolicy::Interval(every) if self.dirty => {
                    match rx.recv_timeout(every.saturating_sub(self.last_sync.elapsed())) {
                        Ok(r) => Some(r),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                _ => match rx.recv() {
                    Ok(r) => Some(r),
                    Err(_) => break,
                },
            };
            reqs.extend(first);
            while reqs.len() < 4096 {
                match rx.try_recv() {
                    Ok(r) => reqs.push(r),
                    Err(_) => break,
                }
            }
            self.round(&mut reqs, &mut buf);
        }
        // Shutdown: make the log durable.
        if self.dirty
            && self.poisoned().is_none()
            && let Err(e) = self.sync()
        {
            self.poison("fsync on close", e);
        }
        // A whole log, closed: say where it ends, so that an end cut off later is not taken
        // for a torn write (see `super::HEAD`).
        if self.poisoned().is_none()
            && let Ok(Some(head)) = super::read_head(&self.dir)
        {
            let closed = super::Head {
                closed_at: Some(self.next_seq),
                ..head
            };
            if let Err(e) = super::write_head(&self.dir, closed) {
                tracing::warn!(error = %e, "could not record the log's end at close");
            }
        }
    }

    fn poisoned(&self) -> Option<StoreError> {
        lock(&self.poisoned).clone()
    }

    /// Records the first I/O failure (later ones are consequences) and returns it.
    fn poison(&self, during: &str, e: std::io::Error) -> StoreError {
        let mut p = lock(&self.poisoned);
        p.get_or_insert_with(|| {
            tracing::error!(error = %e, during, "write-ahead log failed; refusing further writes");
            StoreError::poisoned(during, Some(Arc::new(e)))
        })
        .clone()
    }

    fn sync(&mut self) -> std::io::Result<()> {
        let t = Instant::now();
        self.file.sync()?;
        self.dirty = false;
        self.last_sync = Instant::now();
        let mut s = lock(&self.stats);
        s.fsyncs += 1;
        s.fsync_nanos += t.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// One group commit: write every waiting record, fsync per policy, answer everyone.
    fn round(&mut self, reqs: &mut Vec<Req>, buf: &mut Vec<u8>) {
        buf.clear();
        let mut seqs = Vec::with_capacity(reqs.len());
        let mut want_sync = false;
        let mut want_rotate = false;
        for r in reqs.iter() {
            match r {
                Req::Append(payload, _) => {
                    seqs.push(self.next_seq);
                    put_frame(buf, self.next_seq, payload);
                    self.next_seq += 1;
                }
                Req::Sync(_) => want_sync = true,
                Req::Rotate(_) => want_rotate = true,
            }
        }
        let outcome = self.commit(buf, seqs.len() as u64, want_sync);
        // A failed rotation poisons the writer for later records, but the records of this
        // round are already written (and synced per the policy): their answers stand.
        let full = self.file.len() >= self.max_file_bytes;
        let has_records = self.file.len() > FILE_HEADER_LEN as u64;
        let mut rotated = Ok(());
        if outcome.is_ok()
            && (full || want_rotate)
            && has_records
            && let Err(e) = self.rotate()
        {
            rotated = Err(self.poison("rotating the log", e));
        }
        let mut seqs = seqs.into_iter();
        for r in reqs.drain(..) {
            match r {
                Req::Append(_, reply) => {
                    let seq = seqs.next().unwrap_or(0);
                    let _ = reply.send(outcome.clone().map(|()| seq));
                }
                Req::Sync(reply) => {
                    let _ = reply.send(outcome.clone());
                }
                Req::Rotate(reply) => {
                    let _ = reply.send(outcome.clone().and(rotated.clone()));
                }
            }
        }
    }

    fn commit(&mut self, buf: &[u8], records: u64, want_sync: bool) -> Result<(), StoreError> {
        if let Some(p) = self.poisoned() {
            return Err(p);
        }
        let start = self.file.len();
        if !buf.is_empty() {
            if let Err(e) = self.file.write_all(buf) {
                // None of this round's records is acknowledged, so none may come back on
                // replay; but a full disk fails a write after writing whole records of it.
                // The soak's disk-full round found such a batch, answered 503, counted after
                // the restart.
                if let Err(cut) = self.file.cut_failed_write() {
                    tracing::error!(error = %cut, "could not cut a failed write off the log");
                }
                return Err(self.poison("writing the log", e));
            }
            self.dirty = true;
            let mut s = lock(&self.stats);
            s.bytes_written += buf.len() as u64;
            s.records += records;
        }
        let due = match self.policy {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval(every) => self.last_sync.elapsed() >= every,
            FsyncPolicy::Never => false,
        };
        if self.dirty
            && (want_sync || due)
            && let Err(e) = self.sync()
        {
            // This round's records are refused, so cut them off as a failed write is: what a
            // failed fsync left on disk is uncertain, and a replay must not count a batch
            // answered 503. Earlier rounds (acknowledged under `interval:`) are kept.
            if let Err(cut) = self.file.cut_to(start) {
                tracing::error!(error = %cut, "could not cut an unsynced round off the log");
            }
            return Err(self.poison("fsync of the log", e));
        }
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        if self.dirty {
            self.sync()?;
        }
        let path = file_name(&self.dir, self.next_seq);
        self.file = LogFile::create(&path, &file_header(self.next_seq), self.faults.clone())?;
        super::write_head(
            &self.dir,
            super::Head {
                newest: self.next_seq,
                closed_at: None,
            },
        )?;
        tracing::debug!(file = %path.display(), "rotated the write-ahead log");
        Ok(())
    }
}

/// Creates the first log file of an empty log, starting at record `first_seq`.
pub fn create_first(
    dir: &Path,
    first_seq: u64,
    faults: Option<Arc<Faults>>,
) -> std::io::Result<LogFile> {
    LogFile::create(&file_name(dir, first_seq), &file_header(first_seq), faults)
}

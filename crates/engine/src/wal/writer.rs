//! The log writer: records from any number of writers go to the log in groups. The first
//! writer to arrive while nobody writes becomes the *leader*: it writes everything waiting
//! in one `write`, fsyncs once for all of them (group commit) per the policy, and answers
//! them, and again for those who arrived meanwhile (a few rounds, a few ms at most); then it
//! hands the queue to the first writer still waiting, which leads next, and returns to its
//! caller. A writer alone thus writes its own record with no thread in between (a
//! hand-over to a log thread and back cost ~100 µs a batch on this machine, a tenth of
//! applying 1 000 events); concurrent writers share fsyncs as before. With `interval`, a
//! thread syncs what is left unsynced once the interval has passed. An I/O failure poisons
//! the writer: every later append fails with the first error (its `io::Error` kept as the
//! cause), because after a failed fsync nothing written can be assumed durable. A full disk
//! does not: a write (or a new file) that finds no space is cut off the log, durably, its
//! round refused with `503` and its record numbers given to the next round, and the writer
//! goes on as soon as a write finds space again.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tally_core::store::{FsyncPolicy, StoreError};

use super::{FILE_HEADER_LEN, MAX_SEQ, file_header, file_name, put_frame};
use crate::io::{Faults, LogFile, is_full_disk};

/// What a waiting writer is told: its request's outcome, or that it leads the next round.
enum Answer {
    Lead,
    Appended(Result<u64, StoreError>),
    Done(Result<(), StoreError>),
}

enum Kind {
    Append(Vec<u8>),
    Sync,
    /// Close the current file (if it holds records) and start the next one.
    Rotate,
}

struct Req {
    kind: Kind,
    reply: SyncSender<Answer>,
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
    /// Rounds refused because the disk was full (nothing of them logged), and rotations
    /// refused for it (their records went on into the current file).
    pub full_disk_refusals: u64,
}

/// How long after a rotation refused for a full disk the next one is tried for a full
/// file (one asked for, by a flush, is always tried).
const ROTATE_RETRY: Duration = Duration::from_secs(1);

/// Why a round's records are not in the log.
enum Failure {
    /// The disk was full: nothing of the round is in the file, its numbers are free again,
    /// and the writer goes on.
    Refused(StoreError),
    /// The writer is poisoned.
    Poisoned(StoreError),
}

/// The requests waiting for a round, and whether a round is being led.
#[derive(Default)]
struct Queue {
    reqs: Vec<Req>,
    leading: bool,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a leader stops with nothing queued: what `close` waits for.
    idle: Condvar,
    /// Signalled when the writer closes: what the interval thread waits for.
    closing: Condvar,
    /// The log file and its numbering: held by the leader of a round, the interval thread
    /// or `close`.
    state: Mutex<State>,
    poisoned: Arc<Mutex<Option<StoreError>>>,
    stats: Arc<Mutex<WalStats>>,
    /// [`ROUNDS_PER_LEADER`]; tests hand over after every round.
    rounds_per_leader: usize,
}

/// The handle writers use; cheap to share.
pub struct Writer {
    shared: Arc<Shared>,
    syncer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding these small locks leaves consistent data behind.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn stopped() -> StoreError {
    StoreError::unavailable("the log writer has stopped")
}

impl Writer {
    pub fn start(start: Start) -> std::io::Result<Self> {
        Self::start_with(start, ROUNDS_PER_LEADER)
    }

    fn start_with(start: Start, rounds_per_leader: usize) -> std::io::Result<Self> {
        let poisoned = Arc::new(Mutex::new(None));
        let stats = Arc::new(Mutex::new(WalStats::default()));
        let policy = start.policy;
        let state = State {
            dir: start.dir,
            file: start.file,
            next_seq: start.next_seq,
            policy,
            max_file_bytes: start.max_file_bytes,
            faults: start.faults,
            poisoned: poisoned.clone(),
            stats: stats.clone(),
            dirty: false,
            last_sync: Instant::now(),
            buf: Vec::with_capacity(1 << 20),
            finished: false,
            full_since: None,
            rotate_after: None,
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            idle: Condvar::new(),
            closing: Condvar::new(),
            state: Mutex::new(state),
            poisoned,
            stats,
            rounds_per_leader: rounds_per_leader.max(1),
        });
        let syncer = match policy {
            FsyncPolicy::Interval(every) => {
                let shared = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("tally-wal-sync".into())
                        .spawn(move || shared.sync_every(every))?,
                )
            }
            FsyncPolicy::Always | FsyncPolicy::Never => None,
        };
        Ok(Writer {
            shared,
            syncer: Mutex::new(syncer),
        })
    }

    fn send(&self, kind: Kind) -> Result<Answer, StoreError> {
        if let Some(p) = lock(&self.shared.poisoned).as_ref() {
            return Err(p.clone());
        }
        let (reply, answer) = mpsc::sync_channel(1);
        let leads = {
            let mut q = lock(&self.shared.queue);
            if q.closed {
                return Err(StoreError::unavailable("the log is closed"));
            }
            q.reqs.push(Req { kind, reply });
            !std::mem::replace(&mut q.leading, true)
        };
        if !leads {
            match answer.recv().map_err(|_| stopped())? {
                Answer::Lead => {}
                done => return Ok(done),
            }
        }
        self.shared.lead();
        // The round just led answered this request (it was queued before it began).
        answer.recv().map_err(|_| stopped())
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
        match self.send(Kind::Append(payload))? {
            Answer::Appended(r) => r,
            _ => Err(stopped()),
        }
    }

    /// Makes everything written so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        match self.send(Kind::Sync)? {
            Answer::Done(r) => r,
            _ => Err(stopped()),
        }
    }

    /// Starts a new file once everything sent before is written, so that the records
    /// before it can later be removed as a whole file.
    pub fn rotate(&self) -> Result<(), StoreError> {
        match self.send(Kind::Rotate)? {
            Answer::Done(r) => r,
            _ => Err(stopped()),
        }
    }

    /// The first I/O failure, if the writer is poisoned.
    pub fn poisoned(&self) -> Option<StoreError> {
        lock(&self.shared.poisoned).clone()
    }

    pub fn stats(&self) -> WalStats {
        *lock(&self.shared.stats)
    }

    /// Whether [`Writer::close`] has run: nothing more can be logged or published.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.queue).closed
    }

    /// Refuses new records, waits for those sent before to be written, then fsyncs and
    /// records where the log ends.
    pub fn close(&self) {
        {
            let mut q = lock(&self.shared.queue);
            q.closed = true;
            self.shared.closing.notify_all();
            while q.leading || !q.reqs.is_empty() {
                q = self
                    .shared
                    .idle
                    .wait(q)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        if let Some(t) = lock(&self.syncer).take() {
            let _ = t.join();
        }
        lock(&self.shared.state).finish();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

/// The most rounds one leader runs back to back while writers keep arriving, before it
/// hands the queue over and returns to its caller. Each hand-over costs the next leader's
/// wake-up (~50-100 µs on this machine), each extra round its caller's wait. Measured
/// (docs/benchmarks.md, "The log written by its writers"): with 32 concurrent `incr`
/// requests under `fsync=always` (a round ~0.35 ms here), at 4 rounds a leader they were
/// ~5% slower than with a log thread, at 16 the same.
const ROUNDS_PER_LEADER: usize = 16;

/// A leader starts no further round once it has led this long: where an fsync is slow (a
/// real disk's few ms), a hand-over's wake-up is cheap beside it, and its caller should not
/// wait 16 of them.
const LEAD_AT_MOST: Duration = Duration::from_millis(2);

impl Shared {
    /// Leads rounds: everything queued (the leader's own request among it, in the first) is
    /// written and answered, again while writers keep arriving, up to [`ROUNDS_PER_LEADER`]
    /// rounds or [`LEAD_AT_MOST`]; then the queue goes to the first writer still waiting,
    /// if any. The hand-over happens even if a round panicked, so no writer waits forever.
    fn lead(&self) {
        struct HandOver<'a>(&'a Shared);
        impl Drop for HandOver<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    // The round may have numbered records it never wrote: nothing more may
                    // be logged after them (a gap would stop recovery).
                    lock(&self.0.poisoned).get_or_insert_with(|| {
                        tracing::error!("the log writer panicked; refusing further writes");
                        StoreError::poisoned("a round of the log writer (it panicked)", None)
                    });
                }
                let mut q = lock(&self.0.queue);
                // The first waiting writer leads next. Its answer channel is empty (it
                // waits on it), so this does not block; if it is gone, the next one.
                while let Some(first) = q.reqs.first() {
                    if first.reply.try_send(Answer::Lead).is_ok() {
                        return;
                    }
                    q.reqs.remove(0);
                }
                q.leading = false;
                self.0.idle.notify_all();
            }
        }
        let _hand_over = HandOver(self);
        let started = Instant::now();
        for round in 0..self.rounds_per_leader {
            if round > 0 && started.elapsed() >= LEAD_AT_MOST {
                break;
            }
            let mut reqs = std::mem::take(&mut lock(&self.queue).reqs);
            if reqs.is_empty() {
                break;
            }
            lock(&self.state).round(&mut reqs);
        }
    }

    /// With `interval`: fsyncs what is written and unsynced once the interval has passed
    /// since the last fsync, until the writer closes. A clean log sleeps a whole interval
    /// (a record written meanwhile is then synced at the next wake-up, within an interval
    /// of its write).
    fn sync_every(&self, every: Duration) {
        let mut wait = every;
        loop {
            {
                let q = lock(&self.queue);
                if q.closed {
                    return;
                }
                let (q, _) = self
                    .closing
                    .wait_timeout(q, wait)
                    .unwrap_or_else(PoisonError::into_inner);
                if q.closed {
                    return;
                }
            }
            let mut state = lock(&self.state);
            let since = state.last_sync.elapsed();
            wait = every;
            if !state.dirty || state.poisoned().is_some() {
                continue;
            }
            if since >= every {
                if let Err(e) = state.sync() {
                    state.poison("fsync of the log", e);
                }
            } else {
                wait = (every - since).max(Duration::from_millis(1));
            }
        }
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
    /// A round's frames, reused.
    buf: Vec<u8>,
    /// `finish` has run.
    finished: bool,
    /// While writes find the disk full: the refusals counted before it turned full.
    full_since: Option<u64>,
    /// After a rotation refused for a full disk: when a full file may try again.
    rotate_after: Option<Instant>,
}

impl State {
    /// At close: makes the log durable and records where it ends, so that an end cut off
    /// later is not taken for a torn write (see `super::HEAD`). Once.
    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        if self.dirty
            && self.poisoned().is_none()
            && let Err(e) = self.sync()
        {
            self.poison("fsync on close", e);
        }
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

    /// What a round whose write found the disk full answers (nothing of it is in the log):
    /// a `503` to retry later. Logged when the disk turns full, not per refusal.
    fn refuse_full(&mut self, during: &str, e: &std::io::Error) -> StoreError {
        let refusals = {
            let mut s = lock(&self.stats);
            s.full_disk_refusals += 1;
            s.full_disk_refusals
        };
        if self.full_since.is_none() {
            self.full_since = Some(refusals - 1);
            tracing::warn!(
                error = %e,
                during,
                "the disk is full: refusing writes to the log until space is freed"
            );
        }
        StoreError::unavailable(format!(
            "the disk is full ({during}: {e}): nothing of this request was logged or applied; \
             writes are taken again once space is freed"
        ))
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
    fn round(&mut self, reqs: &mut Vec<Req>) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        // Per append, its number, or none once every number is used (`MAX_SEQ`: a record
        // numbered past it would stop the next recovery).
        let mut seqs: Vec<Option<u64>> = Vec::with_capacity(reqs.len());
        let mut want_sync = false;
        let mut want_rotate = false;
        for r in reqs.iter() {
            match &r.kind {
                Kind::Append(_) if self.next_seq >= MAX_SEQ => seqs.push(None),
                Kind::Append(payload) => {
                    seqs.push(Some(self.next_seq));
                    put_frame(&mut buf, self.next_seq, payload);
                    self.next_seq += 1;
                }
                Kind::Sync => want_sync = true,
                Kind::Rotate => want_rotate = true,
            }
        }
        let written = seqs.iter().flatten().count() as u64;
        let outcome = match self.commit(&buf, written, want_sync) {
            Ok(()) => Ok(()),
            Err(Failure::Refused(e)) => {
                // Nothing of this round is in the log, so its numbers go to the next round
                // (a number skipped would be a gap that recovery refuses).
                if let Some(first) = seqs.iter().flatten().next() {
                    self.next_seq = *first;
                }
                Err(e)
            }
            Err(Failure::Poisoned(e)) => Err(e),
        };
        self.buf = buf;
        // A failed rotation poisons the writer for later records (a full disk only refuses
        // it: the records go on into this file, and a full file tries again after
        // `ROTATE_RETRY`), but the records of this round are already written (and synced
        // per the policy): their answers stand.
        let full = self.file.len() >= self.max_file_bytes
            && self.rotate_after.is_none_or(|t| Instant::now() >= t);
        let has_records = self.file.len() > FILE_HEADER_LEN as u64;
        let mut rotated = Ok(());
        if outcome.is_ok() && (full || want_rotate) && has_records {
            if self.next_seq >= MAX_SEQ {
                // A file is named for its first record: one past the last number would
                // stop the next recovery. Nothing is lost; the caller (a flush) fails.
                rotated = Err(numbers_used_up());
            } else {
                rotated = self.rotate();
            }
        }
        let mut seqs = seqs.into_iter();
        for r in reqs.drain(..) {
            // Each channel holds one message and its writer waits on it: never blocks.
            let _ = r.reply.try_send(match r.kind {
                Kind::Append(_) => match seqs.next().flatten() {
                    Some(seq) => Answer::Appended(outcome.clone().map(|()| seq)),
                    None => Answer::Appended(Err(numbers_used_up())),
                },
                Kind::Sync => Answer::Done(outcome.clone()),
                Kind::Rotate => Answer::Done(outcome.clone().and(rotated.clone())),
            });
        }
    }

    fn commit(&mut self, buf: &[u8], records: u64, want_sync: bool) -> Result<(), Failure> {
        if let Some(p) = self.poisoned() {
            return Err(Failure::Poisoned(p));
        }
        let start = self.file.len();
        if !buf.is_empty() {
            if let Err(e) = self.file.write_all(buf) {
                // None of this round's records is acknowledged, so none may come back on
                // replay; but a full disk fails a write after writing whole records of it.
                // The soak's disk-full round found such a batch, answered 503, counted after
                // the restart. Once the cut is durable the log holds exactly what was
                // acknowledged, and after a full disk the next round can write again.
                let cut = self.file.cut_to(start);
                return Err(match (is_full_disk(&e), cut) {
                    (true, Ok(())) => {
                        self.dirty = false;
                        Failure::Refused(self.refuse_full("writing the log", &e))
                    }
                    (true, Err(cut)) => Failure::Poisoned(
                        self.poison("cutting a write the full disk refused off the log", cut),
                    ),
                    (false, cut) => {
                        if let Err(cut) = cut {
                            tracing::error!(error = %cut, "could not cut a failed write off the log");
                        }
                        Failure::Poisoned(self.poison("writing the log", e))
                    }
                });
            }
            self.dirty = true;
            let mut s = lock(&self.stats);
            s.bytes_written += buf.len() as u64;
            s.records += records;
            if let Some(before) = self.full_since.take() {
                tracing::warn!(
                    refused = s.full_disk_refusals - before,
                    "the log found space again: writes resumed"
                );
            }
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
            return Err(Failure::Poisoned(self.poison("fsync of the log", e)));
        }
        Ok(())
    }

    /// Starts the next file. Poisons the writer on an I/O failure, but where the disk is
    /// full — making the new file, or `wal/HEAD`'s new copy, which replaces it by a rename
    /// after — the new file is removed (durably) and the log goes on in the current one.
    fn rotate(&mut self) -> Result<(), StoreError> {
        const DURING: &str = "rotating the log";
        if self.dirty
            && let Err(e) = self.sync()
        {
            return Err(self.poison(DURING, e));
        }
        let path = file_name(&self.dir, self.next_seq);
        let file = match LogFile::create(&path, &file_header(self.next_seq), self.faults.clone()) {
            Ok(file) => file,
            Err(e) if is_full_disk(&e) && discard(&self.dir, &path).is_ok() => {
                return Err(self.refuse_rotation(&e));
            }
            Err(e) => return Err(self.poison(DURING, e)),
        };
        let head = super::Head {
            newest: self.next_seq,
            closed_at: None,
        };
        if let Err(e) = super::write_head(&self.dir, head) {
            let old_head_stands = is_full_disk(&e)
                && matches!(super::read_head(&self.dir), Ok(Some(h)) if h.newest != head.newest);
            if old_head_stands && discard(&self.dir, &path).is_ok() {
                return Err(self.refuse_rotation(&e));
            }
            return Err(self.poison(DURING, e));
        }
        self.file = file;
        if self.rotate_after.take().is_some() {
            tracing::warn!("the log found space for a new file again");
        }
        tracing::debug!(file = %path.display(), "rotated the write-ahead log");
        Ok(())
    }

    /// What a rotation that found the disk full answers: the records go on into the
    /// current file, and a full file tries again after [`ROTATE_RETRY`]. Logged once while
    /// it lasts.
    fn refuse_rotation(&mut self, e: &std::io::Error) -> StoreError {
        lock(&self.stats).full_disk_refusals += 1;
        if self
            .rotate_after
            .replace(Instant::now() + ROTATE_RETRY)
            .is_none()
        {
            tracing::warn!(
                error = %e,
                "the disk is full: no new log file can be started; records go on into the \
                 current one"
            );
        }
        StoreError::unavailable(format!(
            "the disk is full (starting a new log file: {e}); the log goes on in its current \
             file, and a new one is tried again"
        ))
    }
}

/// Removes a log file that could not be made whole, durably: no record is in it.
fn discard(dir: &Path, path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    crate::io::sync_dir(dir)
}

/// What an append, or a rotation, past the last record number a log may use answers.
fn numbers_used_up() -> StoreError {
    StoreError::unavailable(
        "the write-ahead log has used every record number (up to 2^63 - 1); nothing more \
         can be logged in this data directory (copy its data out with `tally export`)",
    )
}

/// Creates the first log file of an empty log, starting at record `first_seq`.
pub fn create_first(
    dir: &Path,
    first_seq: u64,
    faults: Option<Arc<Faults>>,
) -> std::io::Result<LogFile> {
    LogFile::create(&file_name(dir, first_seq), &file_header(first_seq), faults)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc::RecvTimeoutError;

    use super::*;

    /// A writer whose leaders hand over after every round, so that hand-overs happen often.
    fn writer(dir: &Path, policy: FsyncPolicy, faults: Option<Arc<Faults>>) -> Writer {
        writer_with(dir, policy, faults, 1)
    }

    fn writer_with(
        dir: &Path,
        policy: FsyncPolicy,
        faults: Option<Arc<Faults>>,
        rounds_per_leader: usize,
    ) -> Writer {
        writer_sized(dir, policy, faults, rounds_per_leader, 64 << 20)
    }

    /// A writer whose files are closed past `max_file_bytes`.
    fn writer_sized(
        dir: &Path,
        policy: FsyncPolicy,
        faults: Option<Arc<Faults>>,
        rounds_per_leader: usize,
        max_file_bytes: u64,
    ) -> Writer {
        let open = super::super::Head {
            newest: 1,
            closed_at: None,
        };
        super::super::write_head(dir, open).unwrap();
        Writer::start_with(
            Start {
                dir: dir.to_owned(),
                file: create_first(dir, 1, faults.clone()).unwrap(),
                next_seq: 1,
                policy,
                max_file_bytes,
                faults,
            },
            rounds_per_leader,
        )
        .unwrap()
    }

    /// Every `(seq, payload)` of the log's one file, in order.
    fn records(dir: &Path) -> Vec<(u64, Vec<u8>)> {
        let path = file_name(dir, 1);
        let bytes = std::fs::read(&path).unwrap();
        let mut out = Vec::new();
        super::super::reader::scan(&path, &bytes, 1, true, &mut |seq, p: &[u8]| {
            out.push((seq, p.to_vec()));
            Ok(())
        })
        .unwrap();
        out
    }

    /// The acknowledged `(seq, payload)`s, sorted, are numbered 1 to n with none given twice
    /// or skipped, and the log holds exactly them: each answer names the record that holds
    /// its payload.
    #[track_caller]
    fn holds_exactly(dir: &Path, acked: &[(u64, Vec<u8>)], what: &str) {
        assert_eq!(
            acked.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
            (1..=acked.len() as u64).collect::<Vec<_>>(),
            "{what}: every number given once, none skipped"
        );
        assert_eq!(records(dir), acked, "{what}: the file holds them all");
    }

    /// Runs `f` on a thread and fails the test if it has not returned within a minute
    /// (a writer left waiting for a round nobody leads would hang the test otherwise).
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(v) => v,
            Err(RecvTimeoutError::Timeout) => panic!("a writer is still waiting after a minute"),
            Err(RecvTimeoutError::Disconnected) => panic!("the writing thread panicked"),
        }
    }

    /// A log that reaches the last record number logs that record, then refuses the next
    /// (and a rotation) with a clear error, unpoisoned; its clean close records the end as
    /// the number after it, which reads back.
    #[test]
    fn the_last_record_number_is_used_and_no_number_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let last = MAX_SEQ - 1;
        let open = super::super::Head {
            newest: last,
            closed_at: None,
        };
        super::super::write_head(dir.path(), open).unwrap();
        let w = Writer::start_with(
            Start {
                dir: dir.path().to_owned(),
                file: create_first(dir.path(), last, None).unwrap(),
                next_seq: last,
                policy: FsyncPolicy::Always,
                max_file_bytes: 64 << 20,
                faults: None,
            },
            1,
        )
        .unwrap();
        assert_eq!(w.append(b"last".to_vec()).unwrap(), last);
        for refused in [
            w.append(b"past".to_vec()).unwrap_err(),
            w.rotate().unwrap_err(),
        ] {
            assert!(
                refused.detail().contains("used every record number"),
                "{}",
                refused.detail()
            );
        }
        assert!(w.poisoned().is_none());
        w.close();
        let head = super::super::read_head(dir.path()).unwrap().unwrap();
        assert_eq!(head.closed_at, Some(MAX_SEQ));
        let path = file_name(dir.path(), last);
        let bytes = std::fs::read(&path).unwrap();
        let mut got = Vec::new();
        super::super::reader::scan(&path, &bytes, last, true, &mut |seq, p: &[u8]| {
            got.push((seq, p.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(last, b"last".to_vec())]);
    }

    #[test]
    fn concurrent_writers_each_get_their_own_number_and_the_log_holds_every_record() {
        let settings = [FsyncPolicy::Never, FsyncPolicy::Always]
            .into_iter()
            .flat_map(|p| [(p, 1), (p, ROUNDS_PER_LEADER)]);
        for (policy, rounds) in settings {
            let dir = tempfile::tempdir().unwrap();
            let w = Arc::new(writer_with(dir.path(), policy, None, rounds));
            let (threads, each) = (8u64, 300u64);
            let got = within_a_minute({
                let w = w.clone();
                move || {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let w = w.clone();
                            std::thread::spawn(move || {
                                (0..each)
                                    .map(|i| {
                                        let payload = format!("{t}/{i}").into_bytes();
                                        (w.append(payload.clone()).unwrap(), payload)
                                    })
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    let mut all: Vec<(u64, Vec<u8>)> = handles
                        .into_iter()
                        .flat_map(|h| h.join().unwrap())
                        .collect();
                    all.sort();
                    all
                }
            });
            w.close();
            let n = threads * each;
            assert_eq!(got.len() as u64, n);
            holds_exactly(
                dir.path(),
                &got,
                &format!("{policy:?}, {rounds} rounds a leader"),
            );
            if policy == FsyncPolicy::Always {
                let s = w.stats();
                assert!(s.fsyncs >= 1 && s.fsyncs <= n, "{s:?}");
            }
        }
    }

    /// A full disk refuses the round that found it (half its bytes had reached the file)
    /// and a rotation, without poisoning: the log holds exactly what was acknowledged, the
    /// refused records' numbers go to the next ones, no half-made file is left, and once
    /// space is freed appends and rotations go on in the same process.
    #[test]
    fn a_full_disk_refuses_writes_until_space_is_freed_and_the_log_goes_on() {
        for policy in [FsyncPolicy::Never, FsyncPolicy::Always] {
            let dir = tempfile::tempdir().unwrap();
            let faults = Arc::new(Faults::default());
            let w = writer(dir.path(), policy, Some(faults.clone()));
            assert_eq!(w.append(b"a".to_vec()).unwrap(), 1);
            faults.full_disk_at.store(1, Ordering::SeqCst);
            for _ in 0..3 {
                let err = w.append(b"refused".to_vec()).unwrap_err();
                assert_eq!(err.code(), tally_core::ErrorCode::BackendUnavailable);
                assert!(
                    err.detail().contains("the disk is full"),
                    "{}",
                    err.detail()
                );
            }
            // A rotation while full: its new file is refused and removed.
            let err = w.rotate().unwrap_err();
            assert!(
                err.detail().contains("starting a new log file"),
                "{}",
                err.detail()
            );
            assert!(
                !file_name(dir.path(), 2).exists(),
                "a half-made file is left"
            );
            assert!(w.poisoned().is_none(), "{policy:?}");
            assert_eq!(w.stats().full_disk_refusals, 4);
            // Space freed.
            faults.full_disk_at.store(0, Ordering::SeqCst);
            assert_eq!(w.append(b"b".to_vec()).unwrap(), 2);
            assert_eq!(w.append(b"c".to_vec()).unwrap(), 3);
            w.rotate().unwrap();
            assert_eq!(w.append(b"d".to_vec()).unwrap(), 4);
            w.close();
            assert!(w.poisoned().is_none());
            holds_exactly(
                dir.path(),
                &[(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())],
                &format!("{policy:?}: the first file"),
            );
            let second = file_name(dir.path(), 4);
            let bytes = std::fs::read(&second).unwrap();
            let mut got = Vec::new();
            super::super::reader::scan(&second, &bytes, 4, true, &mut |seq, p: &[u8]| {
                got.push((seq, p.to_vec()));
                Ok(())
            })
            .unwrap();
            assert_eq!(got, [(4, b"d".to_vec())], "{policy:?}: the second file");
        }
    }

    /// A full file whose next one finds no space goes on taking records; it tries again
    /// a second later (not every round: each try costs fsyncs), or when a rotation is asked
    /// for, and once there is space the log rotates as usual.
    #[test]
    fn a_full_file_that_cannot_rotate_goes_on_and_tries_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let w = writer_sized(dir.path(), FsyncPolicy::Never, Some(faults.clone()), 1, 64);
        faults.no_space_for_new_files.store(true, Ordering::SeqCst);
        let record = vec![7u8; 100];
        assert_eq!(w.append(record.clone()).unwrap(), 1, "its answer stands");
        assert_eq!(w.stats().full_disk_refusals, 1, "the rotation after it");
        assert!(
            !file_name(dir.path(), 2).exists(),
            "a half-made file is left"
        );
        for seq in 2..=4 {
            assert_eq!(w.append(record.clone()).unwrap(), seq);
        }
        assert_eq!(w.stats().full_disk_refusals, 1, "not tried again so soon");
        let err = w.rotate().unwrap_err();
        assert!(
            err.detail().contains("the disk is full"),
            "{}",
            err.detail()
        );
        assert_eq!(w.stats().full_disk_refusals, 2, "one asked for is tried");
        faults.no_space_for_new_files.store(false, Ordering::SeqCst);
        std::thread::sleep(ROTATE_RETRY + Duration::from_millis(100));
        assert_eq!(w.append(record.clone()).unwrap(), 5);
        assert_eq!(w.append(record.clone()).unwrap(), 6);
        w.close();
        assert!(w.poisoned().is_none());
        let acked: Vec<(u64, Vec<u8>)> = (1..=5).map(|s| (s, record.clone())).collect();
        holds_exactly(dir.path(), &acked, "the full file");
        assert!(
            file_name(dir.path(), 6).exists(),
            "rotated once there was space"
        );
    }

    /// A full disk whose cut cannot be made durable poisons the writer: what the disk holds
    /// is uncertain.
    #[test]
    fn a_full_disk_whose_cut_fails_to_sync_poisons_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let w = writer(dir.path(), FsyncPolicy::Never, Some(faults.clone()));
        assert_eq!(w.append(b"a".to_vec()).unwrap(), 1);
        faults.full_disk_at.store(1, Ordering::SeqCst);
        faults.fail_syncs.store(true, Ordering::SeqCst);
        assert!(matches!(
            w.append(b"b".to_vec()),
            Err(StoreError::Poisoned { .. })
        ));
        faults.full_disk_at.store(0, Ordering::SeqCst);
        faults.fail_syncs.store(false, Ordering::SeqCst);
        assert!(w.poisoned().is_some());
        assert!(w.append(b"c".to_vec()).is_err(), "poisoned stays poisoned");
        w.close();
    }

    #[test]
    fn a_closed_writer_refuses_records_and_has_written_those_sent_before() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(dir.path(), FsyncPolicy::Never, None);
        assert_eq!(w.append(b"a".to_vec()).unwrap(), 1);
        assert!(!w.is_closed());
        w.close();
        assert!(w.is_closed());
        let err = w.append(b"b".to_vec()).unwrap_err();
        assert!(err.to_string().contains("closed"), "{err}");
        assert_eq!(records(dir.path()), vec![(1, b"a".to_vec())]);
        // Closing again changes nothing.
        w.close();
        assert_eq!(
            super::super::read_head(dir.path())
                .unwrap()
                .and_then(|h| h.closed_at),
            Some(2),
            "the log's end is recorded at close"
        );
    }

    #[test]
    fn a_failed_write_fails_every_waiting_writer_and_leaves_none_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let w = Arc::new(writer(
            dir.path(),
            FsyncPolicy::Always,
            Some(faults.clone()),
        ));
        assert_eq!(w.append(b"kept".to_vec()).unwrap(), 1);
        faults.fail_writes.store(true, Ordering::SeqCst);
        let outcomes = within_a_minute({
            let w = w.clone();
            move || {
                let handles: Vec<_> = (0..8)
                    .map(|_| {
                        let w = w.clone();
                        std::thread::spawn(move || {
                            (0..50)
                                .map(|_| w.append(b"lost".to_vec()).is_ok())
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            }
        });
        assert!(outcomes.iter().all(|ok| !ok), "no record is acknowledged");
        assert!(w.poisoned().is_some());
        w.close();
        assert_eq!(records(dir.path()), vec![(1, b"kept".to_vec())]);
    }

    #[test]
    fn with_interval_a_lone_record_is_synced_without_another_write() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(
            dir.path(),
            FsyncPolicy::Interval(Duration::from_millis(20)),
            None,
        );
        w.append(b"a".to_vec()).unwrap();
        within_a_minute({
            let stats = w.shared.stats.clone();
            move || {
                while lock(&stats).fsyncs == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        w.close();
    }

    #[test]
    fn a_close_racing_writers_leaves_exactly_the_acknowledged_records() {
        for policy in [
            FsyncPolicy::Always,
            FsyncPolicy::Interval(Duration::from_millis(1)),
        ] {
            for _ in 0..20 {
                let dir = tempfile::tempdir().unwrap();
                let w = Arc::new(writer(dir.path(), policy, None));
                let (acked, refusals) = within_a_minute({
                    let w = w.clone();
                    move || {
                        let writers: Vec<_> = (0..6u64)
                            .map(|t| {
                                let w = w.clone();
                                std::thread::spawn(move || {
                                    let (mut acked, mut refused) = (Vec::new(), Vec::new());
                                    for i in 0.. {
                                        if i % 7 == 0 && w.sync().is_err() {
                                            break;
                                        }
                                        let payload = format!("{t}/{i}").into_bytes();
                                        match w.append(payload.clone()) {
                                            Ok(seq) => acked.push((seq, payload)),
                                            Err(e) => {
                                                refused.push(e.to_string());
                                                break;
                                            }
                                        }
                                    }
                                    (acked, refused)
                                })
                            })
                            .collect();
                        std::thread::sleep(Duration::from_millis(5));
                        let closers: Vec<_> = (0..2)
                            .map(|_| {
                                let w = w.clone();
                                std::thread::spawn(move || w.close())
                            })
                            .collect();
                        closers.into_iter().for_each(|c| c.join().unwrap());
                        let (mut acked, mut refused) = (Vec::new(), Vec::new());
                        for h in writers {
                            let (a, r) = h.join().unwrap();
                            acked.extend(a);
                            refused.extend(r);
                        }
                        acked.sort();
                        (acked, refused)
                    }
                });
                let n = acked.len() as u64;
                holds_exactly(dir.path(), &acked, &format!("{policy:?}"));
                assert!(
                    refusals.iter().all(|e| e.contains("closed")),
                    "{refusals:?}"
                );
                let head = super::super::read_head(dir.path()).unwrap().unwrap();
                assert_eq!(head.closed_at, Some(n + 1), "{policy:?}");
            }
        }
    }

    #[test]
    fn a_round_that_panics_poisons_the_writer_and_leaves_none_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let w = Arc::new(writer(dir.path(), FsyncPolicy::Never, Some(faults.clone())));
        assert_eq!(w.append(b"kept".to_vec()).unwrap(), 1);
        faults.panic_writes.store(true, Ordering::SeqCst);
        let outcomes = within_a_minute({
            let w = w.clone();
            move || {
                let handles: Vec<_> = (0..4)
                    .map(|_| {
                        let w = w.clone();
                        std::thread::spawn(move || w.append(b"lost".to_vec()).is_ok())
                    })
                    .collect();
                // A leader's own call panics with its round; the others are refused.
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(false))
                    .collect::<Vec<_>>()
            }
        });
        assert!(outcomes.iter().all(|ok| !ok), "{outcomes:?}");
        faults.panic_writes.store(false, Ordering::SeqCst);
        let e = w.append(b"after".to_vec()).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert!(w.poisoned().is_some());
        w.close();
        assert_eq!(records(dir.path()), vec![(1, b"kept".to_vec())]);
    }

    /// How many times the thread named `name` in this process has gone to sleep.
    #[cfg(target_os = "linux")]
    fn sleeps_of(name: &str) -> u64 {
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                let status = std::fs::read_to_string(task.join("status")).unwrap();
                return status
                    .lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap();
            }
        }
        panic!("no thread named {name}");
    }

    /// A clean log's interval thread sleeps whole intervals (a review found it waking
    /// every millisecond once the log had been synced).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_interval_thread_of_a_quiet_log_sleeps() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(
            dir.path(),
            FsyncPolicy::Interval(Duration::from_millis(50)),
            None,
        );
        w.append(b"a".to_vec()).unwrap();
        let stats = w.shared.stats.clone();
        within_a_minute(move || {
            while lock(&stats).fsyncs == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let before = sleeps_of("tally-wal-sync");
        std::thread::sleep(Duration::from_millis(500));
        let woke = sleeps_of("tally-wal-sync") - before;
        // About ten intervals; a thread polling every millisecond sleeps ~500 times.
        assert!(woke <= 40, "the thread slept {woke} times in 500 ms");
        w.close();
    }
}

//! A log that misses records stops recovery with an error naming the missing range — a
//! deleted oldest or middle file, a lost newest one, a jump in the numbering inside a file —
//! and `accept_data_loss` starts anyway with what is left, after which new writes work and
//! the next start needs no flag.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_core::store::ManualClock;
use tally_engine::wal::{
    Corruption, FileProblem, WalError, file_header, file_name, list_files, put_frame,
};
use tally_engine::{Config, Engine, FsyncPolicy, OpenError};

use crate::{NOW, clock, raw, total, write};

const DAY: i64 = 86_400;

fn config(dir: &Path, clock: &Arc<ManualClock>, accept_data_loss: bool) -> Config {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.fsync = FsyncPolicy::Never;
    c.shards = 4;
    c.max_wal_file_bytes = 200;
    c.accept_data_loss = accept_data_loss;
    c
}

/// Batch `i` adds 1 to key `k{i}` at `ts`: one record each, so record numbers map to keys.
fn fill(e: &Engine, keys: std::ops::Range<usize>, ts: i64) {
    for i in keys {
        write(e, NOW, &[raw("clicks", &format!("k{i}"), ts, 1, &[])]).unwrap();
    }
}

fn files(dir: &Path) -> Vec<(u64, PathBuf)> {
    list_files(&dir.join("wal")).unwrap()
}

/// The error's text as `tally serve` prints it.
fn says(err: &OpenError) -> String {
    let text = err.to_string();
    assert!(text.contains("--accept-data-loss"), "{text}");
    text
}

/// A log of `batches` batches of today (in memory, nothing flushed), the engine closed.
fn unflushed_log(dir: &Path, clock: &Arc<ManualClock>, batches: usize) {
    let e = Engine::open(config(dir, clock, false)).unwrap();
    fill(&e, 0..batches, NOW - 60);
    drop(e);
}

/// A log of 30 batches in several files, with the first 10 (two days back) archived.
fn flushed_log(dir: &Path, clock: &Arc<ManualClock>) -> u64 {
    let e = Engine::open(config(dir, clock, false)).unwrap();
    fill(&e, 0..10, NOW - 2 * DAY);
    let report = e.flush().unwrap();
    assert!(
        report.segments > 0 && report.wal_files_removed > 0,
        "{report:?}"
    );
    fill(&e, 10..30, NOW - 60);
    drop(e);
    assert!(files(dir).len() >= 3);
    report.wal_start
}

#[test]
fn a_deleted_oldest_file_after_a_flush_is_refused_naming_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let wal_start = flushed_log(dir.path(), &clock);
    let log = files(dir.path());
    assert_eq!(
        log[0].0, wal_start,
        "the flush truncated the log up to wal_start"
    );
    std::fs::remove_file(&log[0].1).unwrap();
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    let found = log[1].0;
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::BadFile {
                why: FileProblem::MissingRecords { needed, found: f },
                ..
            }) if *needed == wal_start && *f == found
        ),
        "{err:?}"
    );
    assert!(
        says(&err).contains(&format!("records {wal_start}..={} are missing", found - 1)),
        "{err}"
    );
}

#[test]
fn a_deleted_middle_file_is_refused_naming_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    flushed_log(dir.path(), &clock);
    let log = files(dir.path());
    std::fs::remove_file(&log[1].1).unwrap();
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    let (first, last) = (log[1].0, log[2].0 - 1);
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::BadFile {
                file,
                why: FileProblem::Gap { first: f, last: l },
            }) if *f == first && *l == last && *file == log[2].1
        ),
        "{err:?}"
    );
    assert!(
        says(&err).contains(&format!("records {first}..={last} are missing")),
        "{err}"
    );
}

/// Found by an independent review: a gap between log files wholly before `wal_start` (what
/// a truncation interrupted by a crash can leave: it removes oldest first, and without a
/// sync between removals a newer one may persist while an older one does not) was refused
/// although the archive holds every record in it.
#[test]
fn a_gap_wholly_before_wal_start_loses_nothing_and_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    fill(&e, 0..10, NOW - 2 * DAY);
    e.sync().unwrap();
    let old = files(dir.path());
    assert!(old.len() >= 3, "{old:?}");
    for (_, f) in &old {
        std::fs::copy(f, saved.path().join(f.file_name().unwrap())).unwrap();
    }
    let report = e.flush().unwrap();
    fill(&e, 10..20, NOW - 60);
    drop(e);
    // Every file the flush removed comes back but the second.
    for (_, f) in old.iter().filter(|(seq, _)| *seq < report.wal_start) {
        if *f != old[1].1 {
            let name = f.file_name().unwrap();
            std::fs::copy(saved.path().join(name), f).unwrap();
        }
    }
    let log = files(dir.path());
    assert!(log[0].0 < old[1].0 && log[1].0 > old[1].0, "{log:?}");
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    for i in 0..20 {
        assert_eq!(total(&e, "clicks", &format!("k{i}"), 3600), 1, "k{i}");
    }
    // A gap reaching past `wal_start` is still refused, naming only the records needed.
    drop(e);
    let log = files(dir.path());
    let at = log
        .iter()
        .position(|(seq, _)| *seq >= report.wal_start)
        .unwrap();
    std::fs::remove_file(&log[at].1).unwrap();
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    let (first, last) = (report.wal_start, log[at + 1].0 - 1);
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::BadFile {
                why: FileProblem::Gap { first: f, last: l },
                ..
            }) if *f == first && *l == last
        ),
        "{err:?}"
    );
}

#[test]
fn a_lost_newest_file_is_refused_when_the_archive_went_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    // Record 1 stays in memory (today), so the flush keeps the log from record 1 on.
    fill(&e, 0..1, NOW - 60);
    fill(&e, 1..10, NOW - 2 * DAY);
    let report = e.flush().unwrap();
    assert_eq!(report.wal_start, 1);
    drop(e);
    for (_, f) in files(dir.path()) {
        std::fs::remove_file(f).unwrap();
    }
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::MissingTail {
                first: 1,
                last: 10,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(says(&err).contains("records 1..=10 are missing"), "{err}");
}

/// Found by an independent review: the newest files lost while the manifest survived, and
/// the segments that went past them since dropped by retention (only `wal_start` says how
/// far the log reached). Recovery started numbering below `wal_start`, so a write
/// acknowledged then was skipped by the next recovery.
#[test]
fn a_log_ending_before_wal_start_is_refused_and_accepted_loses_no_new_write() {
    let dir = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    fill(&e, 0..6, NOW - 2 * DAY);
    e.sync().unwrap();
    for (_, f) in files(dir.path()) {
        std::fs::copy(&f, saved.path().join(f.file_name().unwrap())).unwrap();
    }
    fill(&e, 6..10, NOW - 2 * DAY);
    let report = e.flush().unwrap();
    assert_eq!(report.wal_start, 11);
    drop(e);
    // The log as it was at record 6; the manifest without its segments.
    for (_, f) in files(dir.path()) {
        std::fs::remove_file(f).unwrap();
    }
    for f in std::fs::read_dir(saved.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join("wal").join(f.file_name().unwrap())).unwrap();
    }
    let mut m = tally_engine::manifest::load(dir.path()).unwrap().unwrap();
    m.segments.clear();
    m.number += 1;
    tally_engine::manifest::publish(&tally_engine::io::OsFs, dir.path(), &m).unwrap();

    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::MissingTail {
                first: 7,
                last: 10,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(says(&err).contains("records 7..=10 are missing"), "{err}");
    // Accepted: a write acknowledged now survives the next start.
    let e = Engine::open(config(dir.path(), &clock, true)).unwrap();
    write(&e, NOW, &[raw("clicks", "acked", NOW - 60, 5, &[])]).unwrap();
    e.sync().unwrap();
    drop(e);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    assert_eq!(total(&e, "clicks", "acked", 3600), 5);
}

/// A file written by hand: its header names `first`, its records carry `seqs`.
fn hand_written(dir: &Path, first: u64, seqs: &[u64]) {
    let wal = dir.join("wal");
    std::fs::create_dir_all(&wal).unwrap();
    let mut bytes = file_header(first).to_vec();
    // An empty batch: no strings, no namespaces, no increments, no idempotency answer.
    for &s in seqs {
        put_frame(&mut bytes, s, &[1, 0, 0, 0, 0]);
    }
    std::fs::write(file_name(&wal, first), bytes).unwrap();
}

#[test]
fn a_jump_in_the_numbering_inside_a_file_is_refused_naming_the_range() {
    let clock = clock(NOW);
    for (seqs, first, last) in [
        // Between two records.
        (&[1, 2, 5, 6][..], 3, 4),
        // Before the file's first record: not the number its name and header give.
        (&[4, 5][..], 1, 3),
    ] {
        let dir = tempfile::tempdir().unwrap();
        hand_written(dir.path(), 1, seqs);
        let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
        assert!(
            matches!(
                &err,
                OpenError::Wal(WalError::Corrupt {
                    why: Corruption::Missing { first: f, last: l },
                    ..
                }) if *f == first && *l == last
            ),
            "{seqs:?}: {err:?}"
        );
        assert!(
            says(&err).contains(&format!("records {first}..={last} are missing")),
            "{err}"
        );
        // Accepted: the records that are there, and numbering goes on after the last.
        let e = Engine::open(config(dir.path(), &clock, true)).unwrap();
        assert_eq!(e.recovery().lost, [(first, last)]);
        write(&e, NOW, &[raw("clicks", "after", NOW - 60, 1, &[])]).unwrap();
        drop(e);
        let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
        assert_eq!(total(&e, "clicks", "after", 3600), 1);
        assert!(files(dir.path())[0].0 > *seqs.last().unwrap());
    }
}

/// Accepting the loss of the records of `gone`: what is left is there, new writes work,
/// and the next start — without the flag — finds no gap.
fn accepted(dir: &Path, clock: &Arc<ManualClock>, gone: (u64, u64)) {
    let e = Engine::open(config(dir, clock, true)).unwrap();
    assert_eq!(e.recovery().lost, [gone]);
    // Batch i is record i + 1.
    let present = |i: usize| !(gone.0..=gone.1).contains(&(i as u64 + 1));
    let check = |e: &Engine| {
        for i in 0..30 {
            let want = i64::from(present(i));
            assert_eq!(total(e, "clicks", &format!("k{i}"), 3600), want, "k{i}");
        }
    };
    check(&e);
    write(&e, NOW, &[raw("clicks", "after", NOW - 60, 5, &[])]).unwrap();
    drop(e);
    let e = Engine::open(config(dir, clock, false)).unwrap();
    assert!(e.recovery().lost.is_empty());
    check(&e);
    assert_eq!(total(&e, "clicks", "after", 3600), 5);
    // Numbers are never reused: the log now starts after the 30 records seen before.
    assert_eq!(files(dir)[0].0, 31, "{:?}", files(dir));
    drop(e);
    let e = Engine::open(config(dir, clock, false)).unwrap();
    check(&e);
    assert_eq!(total(&e, "clicks", "after", 3600), 5);
}

#[test]
fn accept_data_loss_starts_without_the_oldest_file() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let wal_start = flushed_log(dir.path(), &clock);
    let log = files(dir.path());
    std::fs::remove_file(&log[0].1).unwrap();
    accepted(dir.path(), &clock, (wal_start, log[1].0 - 1));
}

#[test]
fn accept_data_loss_starts_without_a_middle_file() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    flushed_log(dir.path(), &clock);
    let log = files(dir.path());
    std::fs::remove_file(&log[1].1).unwrap();
    accepted(dir.path(), &clock, (log[1].0, log[2].0 - 1));
}

#[test]
fn accept_data_loss_recreates_a_namespace_whose_creation_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    // Record 1 creates the namespace; nothing is flushed.
    unflushed_log(dir.path(), &clock, 30);
    let log = files(dir.path());
    std::fs::remove_file(&log[0].1).unwrap();
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(says(&err).contains(&format!("records 1..={} are missing", log[1].0 - 1)));
    accepted(dir.path(), &clock, (1, log[1].0 - 1));
}

#[test]
fn a_sequence_number_of_0_or_past_2_63_is_refused_even_accepting_data_loss() {
    // Found by fuzz/wal_scan and fuzz/wal_recovery: a record or file numbered u64::MAX
    // overflowed the next number (a panic in debug builds, a wrap to 0 in release).
    let clock = clock(NOW);
    let dir = tempfile::tempdir().unwrap();
    hand_written(dir.path(), 1, &[1, u64::MAX]);
    for accept in [false, true] {
        let err = Engine::open(config(dir.path(), &clock, accept)).unwrap_err();
        assert!(
            matches!(
                &err,
                OpenError::Wal(WalError::Corrupt {
                    why: Corruption::Sequence {
                        expected: 2,
                        got: u64::MAX
                    },
                    ..
                })
            ),
            "{err:?}"
        );
    }
    // Found by fuzz/wal_recovery: numbers start at 1, and a record numbered 0 (in a file
    // named 0) was appended, then skipped on the next start as if archived.
    for first in [0, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        hand_written(dir.path(), first, &[]);
        for accept in [false, true] {
            let err = Engine::open(config(dir.path(), &clock, accept)).unwrap_err();
            assert!(
                matches!(
                    &err,
                    OpenError::Wal(WalError::BadFile {
                        why: FileProblem::SequenceOutOfRange { seq },
                        ..
                    }) if *seq == first
                ),
                "{err:?}"
            );
        }
    }
}

/// A batch payload of one increment to key `k` of namespace `ns` a minute ago, creating the
/// namespace (default schema) if `create`.
fn one_increment(ns: &str, create: bool) -> Vec<u8> {
    use tally_core::model::Schema;
    use tally_engine::wal::payload::{BatchView, IncView};
    let view = BatchView {
        strings: vec![ns, "k"],
        creates: if create {
            vec![(0, Schema::default())]
        } else {
            vec![]
        },
        incs: vec![IncView {
            ns: 0,
            key: 1,
            ts: NOW - 60,
            n: 1,
            subs: (0, 0),
        }],
        ..BatchView::default()
    };
    let mut payload = Vec::new();
    view.encode(&mut payload);
    payload
}

#[test]
fn accepting_data_loss_without_a_gap_still_refuses_an_unknown_namespace() {
    // Found by fuzz/wal_recovery: with the flag but no gap, a batch counting in a namespace
    // nothing created was taken (the namespace made up), and the next start refused it.
    let clock = clock(NOW);
    let dir = tempfile::tempdir().unwrap();
    let payload = one_increment("hn", false);
    let wal = dir.path().join("wal");
    std::fs::create_dir_all(&wal).unwrap();
    let mut bytes = file_header(1).to_vec();
    put_frame(&mut bytes, 1, &payload);
    std::fs::write(file_name(&wal, 1), bytes).unwrap();
    for accept in [false, true] {
        let err = Engine::open(config(dir.path(), &clock, accept)).unwrap_err();
        assert!(
            matches!(
                &err,
                OpenError::Wal(WalError::Corrupt {
                    why: Corruption::Apply(_),
                    ..
                })
            ),
            "{err:?}"
        );
    }
}

#[test]
fn accepting_a_lost_tail_appends_in_a_file_named_for_the_next_number() {
    // Found by fuzz/wal_recovery: accepting a missing tail moved the numbering on, but an
    // empty last file was kept for appending (the writer rotates only a file with
    // records), so the next record's number was not its file's and the next start refused.
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    fill(&e, 0..1, NOW - 60);
    fill(&e, 1..10, NOW - 2 * DAY);
    e.flush().unwrap();
    drop(e);
    // Only an empty file named 1 is left: records 1..=10 are gone.
    for (_, f) in files(dir.path()) {
        std::fs::remove_file(f).unwrap();
    }
    hand_written(dir.path(), 1, &[]);
    let e = Engine::open(config(dir.path(), &clock, true)).unwrap();
    assert_eq!(e.recovery().lost, [(1, 10)]);
    write(&e, NOW, &[raw("clicks", "after", NOW - 60, 1, &[])]).unwrap();
    drop(e);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    assert_eq!(total(&e, "clicks", "after", 3600), 1);
    for i in 1..10 {
        assert_eq!(
            total(&e, "clicks", &format!("k{i}"), 3600),
            1,
            "archived k{i}"
        );
    }
    // Numbered past 11, the first record of the newest file the log had started (wal/HEAD),
    // which the lost files may have held: no number is used twice.
    assert_eq!(files(dir.path())[0].0, 12);
}

#[test]
fn a_record_longer_than_recovery_reads_is_refused_before_it_is_written() {
    use tally_engine::wal::MAX_PAYLOAD_LEN;
    use tally_engine::wal::writer::{Start, Writer, create_first};
    let dir = tempfile::tempdir().unwrap();
    let file = create_first(dir.path(), 1, None).unwrap();
    let w = Writer::start(Start {
        dir: dir.path().to_owned(),
        file,
        next_seq: 1,
        policy: FsyncPolicy::Always,
        max_file_bytes: 64 << 20,
        faults: None,
    })
    .unwrap();
    // Zeroed pages the allocator maps lazily: the refusal reads none of them.
    let err = w.append(vec![0u8; MAX_PAYLOAD_LEN + 1]).unwrap_err();
    assert!(
        err.detail().contains("longer than a record holds"),
        "{err:?}"
    );
    assert_eq!(
        w.append(b"fits".to_vec()).unwrap(),
        1,
        "nothing was numbered"
    );
    assert_eq!(w.stats().records, 1);
}

/// What `check` finds wrong with the log: each damage's text.
fn damage(dir: &Path) -> Vec<String> {
    let report = tally_engine::check::check(dir).unwrap();
    report.damage.iter().map(ToString::to_string).collect()
}

/// Found by a black-box review: the log's newest file deleted after a publish, with the
/// records written since only in it. Nothing else remembered them, so recovery started
/// without them and `check` said the directory was whole. `wal/HEAD` names the newest file
/// the log started: a log whose newest file starts before it lost its newest files.
#[test]
fn a_lost_newest_file_after_a_publish_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    fill(&e, 0..10, NOW - 2 * DAY);
    e.flush().unwrap();
    // Written after the publish: only the log holds them.
    fill(&e, 10..13, NOW - 2 * DAY);
    drop(e);
    let log = files(dir.path());
    let newest = log.last().unwrap().clone();
    for (_, f) in &log {
        std::fs::remove_file(f).unwrap();
    }
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::LostNewest { head, newest: None, .. }) if *head == newest.0
        ),
        "{err:?}"
    );
    assert!(says(&err).contains("no log file is left"), "{err}");
    let found = damage(dir.path());
    assert!(
        found.len() == 1 && found[0].contains("(wal/HEAD says so)"),
        "{found:?}"
    );

    // Accepted: what the archive holds stays, the lost writes are gone, new ones count and
    // the next start needs no flag.
    let e = Engine::open(config(dir.path(), &clock, true)).unwrap();
    assert!(!e.recovery().lost.is_empty());
    write(&e, NOW, &[raw("clicks", "after", NOW - 60, 1, &[])]).unwrap();
    drop(e);
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    assert_eq!(total(&e, "clicks", "after", 3600), 1);
    assert_eq!(total(&e, "clicks", "k3", 3600), 1, "archived");
    assert_eq!(
        total(&e, "clicks", "k11", 3600),
        0,
        "lost with the newest file"
    );
    assert!(files(dir.path())[0].0 > newest.0, "no number used twice");
    drop(e);
    assert!(damage(dir.path()).is_empty());
}

/// The newest file deleted while older ones stay (nothing flushed: the whole log is
/// needed). The log then ends at a record boundary before what was written, which no
/// manifest knows of.
#[test]
fn a_lost_newest_file_with_older_ones_left_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    // Today's records stay in memory; 200-byte files rotate every few records.
    unflushed_log(dir.path(), &clock, 20);
    let log = files(dir.path());
    assert!(log.len() >= 3, "{log:?}");
    let (head, path) = log.last().unwrap().clone();
    std::fs::remove_file(&path).unwrap();
    let left = log[log.len() - 2].0;
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::LostNewest { head: h, newest: Some(n), .. })
                if *h == head && *n == left
        ),
        "{err:?}"
    );
    assert!(
        says(&err).contains(&format!("the newest log file left starts at record {left}")),
        "{err}"
    );
    assert_eq!(damage(dir.path()).len(), 1);
    // A log left whole opens as before.
    let whole = tempfile::tempdir().unwrap();
    unflushed_log(whole.path(), &clock, 20);
    let e = Engine::open(config(whole.path(), &clock, false)).unwrap();
    assert_eq!(total(&e, "clicks", "k19", 3600), 1);
}

/// A damaged `wal/HEAD` is named, not trusted and not ignored; accepting data loss starts
/// without it. A log without one (written before it existed) opens and gets one.
#[test]
fn a_damaged_head_is_refused_and_a_missing_one_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock(NOW);
    unflushed_log(dir.path(), &clock, 3);
    let head = dir.path().join("wal").join(tally_engine::wal::HEAD);
    let mut bytes = std::fs::read(&head).unwrap();
    bytes[5] ^= 1;
    std::fs::write(&head, &bytes).unwrap();
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::BadFile { why: FileProblem::DamagedHead, file })
                if file == &head
        ),
        "{err:?}"
    );
    assert_eq!(damage(dir.path()).len(), 1);
    let e = Engine::open(config(dir.path(), &clock, true)).unwrap();
    assert_eq!(total(&e, "clicks", "k2", 3600), 1);
    drop(e);
    // Rewritten at that open, and at the close after it with where the log ended; gone, it
    // is written again at the next open.
    let written = tally_engine::wal::read_head(&dir.path().join("wal"))
        .unwrap()
        .unwrap();
    assert_eq!(written.newest, files(dir.path()).last().unwrap().0);
    assert_eq!(
        written.closed_at,
        Some(4),
        "three records, closed after record 3"
    );
    std::fs::remove_file(&head).unwrap();
    let e = Engine::open(config(dir.path(), &clock, false)).unwrap();
    assert_eq!(total(&e, "clicks", "k2", 3600), 1);
    drop(e);
    assert!(head.exists());
    // One that cannot be read (a directory in its place) is named with the reason.
    std::fs::remove_file(&head).unwrap();
    std::fs::create_dir(&head).unwrap();
    let err = Engine::open(config(dir.path(), &clock, false)).unwrap_err();
    assert!(
        matches!(
            &err,
            OpenError::Wal(WalError::BadFile { why: FileProblem::Unreadable(_), file })
                if file == &head
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("cannot be read"), "{err}");
}

#[test]
fn a_record_that_does_not_apply_is_named_by_its_own_offset_though_more_follow() {
    // The error names the record that failed, by its offset, and not one after it: replay
    // stops there though good records follow (a decoding that ran ahead, on a thread of
    // its own, was tried and measured no faster; it would have to keep this so).
    use tally_engine::wal::FILE_HEADER_LEN;
    let clock = clock(NOW);
    let dir = tempfile::tempdir().unwrap();
    let batch = one_increment;
    let wal = dir.path().join("wal");
    std::fs::create_dir_all(&wal).unwrap();
    let mut bytes = file_header(1).to_vec();
    put_frame(&mut bytes, 1, &batch("hn", true));
    let bad_at = bytes.len();
    assert!(bad_at > FILE_HEADER_LEN);
    // Record 2 counts in a namespace nothing created; 40 good ones follow it.
    put_frame(&mut bytes, 2, &batch("nowhere", false));
    for seq in 3..43 {
        put_frame(&mut bytes, seq, &batch("hn", false));
    }
    std::fs::write(file_name(&wal, 1), bytes).unwrap();
    let mut c = config(dir.path(), &clock, false);
    c.max_wal_file_bytes = 1 << 20;
    let err = Engine::open(c).unwrap_err();
    match &err {
        OpenError::Wal(WalError::Corrupt {
            offset,
            why: Corruption::Apply(e),
            ..
        }) => {
            assert_eq!(*offset, bad_at as u64, "{err}");
            assert!(e.to_string().contains("nowhere"), "{err}");
        }
        _ => panic!("{err:?}"),
    }
}

//! tally-engine's integration tests, in one binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod archive;
mod bulk;
mod crash;
mod crash_publish;
mod fixtures;
mod format_doc;
mod log_gaps;
mod model;
mod recovery;
mod segment;
mod segment_fixture;
mod segment_format_doc;
mod segment_measure;
mod tops;
mod totals;
mod visibility;

use std::path::Path;
use std::sync::Arc;

use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Key, Namespace, RawEvent};
use tally_core::store::{Clock, KeyData, KeyRead, ManualClock, Store, Want};
use tally_engine::{Config, Engine, FsyncPolicy};

/// 2026-11-20T00:00:00Z.
pub const NOW: i64 = 1_795_132_800;

pub fn open(dir: &Path, clock: &Arc<ManualClock>, fsync: FsyncPolicy) -> Engine {
    let mut c = Config::new(dir);
    c.clock = clock.clone();
    c.fsync = fsync;
    c.shards = 8;
    Engine::open(c).unwrap()
}

/// Makes the log in `dir` look as a crash leaves it: its `wal/HEAD` without the end a clean
/// close records (tests that damage the end of a log cleanly closed stand for the torn
/// write of a crash; after a clean close the same damage is refused).
pub fn as_after_a_crash(dir: &Path) {
    let wal = dir.join("wal");
    if let Some(head) = tally_engine::wal::read_head(&wal).unwrap() {
        let open = tally_engine::wal::Head {
            closed_at: None,
            ..head
        };
        tally_engine::wal::write_head(&wal, open).unwrap();
    }
}

pub fn raw(ns: &str, key: &str, ts: i64, n: i64, dims: &[(&str, &str)]) -> RawEvent {
    RawEvent {
        ns: ns.into(),
        key: key.into(),
        ts: Some(ts),
        n: Some(n),
        dims: dims
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
    }
}

/// `raws` checked as the API does, at `now`, into a batch (not applied).
pub fn prepared(store: &dyn Store, now: i64, raws: &[RawEvent]) -> tally_core::store::Batch {
    ingest::prepare(store, raws, now, &Limits::default(), &Defaults::default()).unwrap()
}

pub fn write(
    store: &dyn Store,
    now: i64,
    raws: &[RawEvent],
) -> Result<(), tally_core::store::StoreError> {
    store.apply(&prepared(store, now, raws))
}

/// Writes `raws` at `now` in batches of `per` events.
pub fn write_in_batches(store: &dyn Store, now: i64, raws: &[RawEvent], per: usize) {
    for batch in raws.chunks(per) {
        write(store, now, batch).unwrap();
    }
}

/// Every bucket of a key at one resolution, totals and all subtotals.
pub fn read_all(store: &dyn Store, ns: &str, key: &str, res_secs: u64) -> KeyData {
    let ns = Namespace::new(ns).unwrap();
    let key = Key::new(key).unwrap();
    let read = KeyRead {
        ns: &ns,
        key: &key,
        resolution: tally_core::model::Duration::from_secs(res_secs).unwrap(),
        from: 0,
        to: 1 << 32,
        want: Want::All,
        sum_subtotals: false,
        keep: None,
    };
    let mut d = store.read(&[read]).unwrap().pop().unwrap();
    d.subtotals
        .sort_by(|a, b| (&a.dim, &a.value).cmp(&(&b.dim, &b.value)));
    d
}

pub fn total(store: &dyn Store, ns: &str, key: &str, res_secs: u64) -> i64 {
    sums(&read_all(store, ns, key, res_secs)).0
}

/// (sum of the totals, sum of every subtotal) of a read.
pub fn sums(d: &KeyData) -> (i64, i64) {
    let total = d.totals.iter().map(|(_, n)| n).sum();
    let subs = d
        .subtotals
        .iter()
        .flat_map(|s| s.buckets.iter())
        .map(|(_, n)| n)
        .sum();
    (total, subs)
}

/// A schema of one minute tier kept two days: the defaults without their hourly tier.
/// A read with summed subtotals (`sum_subtotals` set), as compared between stores: its
/// totals, and each (dimension, value) with its sum, zero sums left out, sorted.
pub type Folded = (Vec<(i64, i64)>, Vec<(String, String, i64)>);

pub fn folded(store: &dyn Store, read: KeyRead<'_>) -> Folded {
    fold(&store.read(&[read]).unwrap().pop().unwrap())
}

fn fold(d: &KeyData) -> Folded {
    let mut subs: Vec<(String, String, i64)> = d
        .subtotals
        .iter()
        .map(|s| {
            (
                s.dim.clone(),
                s.value.clone(),
                s.buckets.iter().map(|b| b.1).sum(),
            )
        })
        .filter(|s| s.2 != 0)
        .collect();
    subs.sort();
    (d.totals.clone(), subs)
}

/// A summed read with [`KeyRead::keep`], as compared between stores: [`folded`]'s, with
/// the sum of each dimension's values left out (sorted by dimension).
pub type Kept = (Folded, Vec<(String, i64)>);

pub fn kept(store: &dyn Store, read: KeyRead<'_>) -> Kept {
    let d = store.read(&[read]).unwrap().pop().unwrap();
    let mut rest = d.rest.clone();
    rest.sort();
    (fold(&d), rest)
}

/// What a read keeping `keep` values a dimension answers, from the whole answer `f`: each
/// dimension's `keep` largest sums (ties by value in byte order), the others summed.
pub fn trimmed((totals, subs): Folded, keep: usize) -> Kept {
    let mut by_dim: std::collections::BTreeMap<String, Vec<(String, i64)>> = Default::default();
    for (d, v, n) in subs {
        by_dim.entry(d).or_default().push((v, n));
    }
    let (mut kept, mut rest) = (Vec::new(), Vec::new());
    for (d, mut values) in by_dim {
        values.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
        });
        if values.len() > keep {
            let left: i64 = values[keep..].iter().map(|v| v.1).sum();
            rest.push((d.clone(), left));
        }
        kept.extend(
            values
                .into_iter()
                .take(keep)
                .map(|(v, n)| (d.clone(), v, n)),
        );
    }
    kept.sort();
    ((totals, kept), rest)
}

pub fn minute_only() -> tally_core::model::Schema {
    tally_core::model::Schema::from_doc(&tally_core::model::SchemaDoc {
        tiers: vec!["1m:2d".into()],
        breakdown_tiers: None,
        dimensions: None,
    })
    .unwrap()
}

pub fn clock(now: i64) -> Arc<ManualClock> {
    let c = Arc::new(ManualClock::new(now));
    assert_eq!(c.now(), now);
    c
}

/// What [`FailFs`] may fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsOp {
    Write,
    Rename,
}

/// A file system that, once armed, fails the writes and renames `pick` chooses — every one,
/// or only the next when `once` — and passes everything else to the real one.
#[derive(Debug)]
pub struct FailFs {
    pub armed: std::sync::atomic::AtomicBool,
    pick: fn(FsOp, &Path) -> bool,
    once: bool,
}

impl FailFs {
    pub fn new(pick: fn(FsOp, &Path) -> bool, once: bool) -> Self {
        FailFs {
            armed: Default::default(),
            pick,
            once,
        }
    }

    fn fail(&self, op: FsOp, path: &Path) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let hit = (self.pick)(op, path)
            && if self.once {
                self.armed.swap(false, SeqCst)
            } else {
                self.armed.load(SeqCst)
            };
        if hit {
            return Err(std::io::Error::other(format!("injected {op:?} failure")));
        }
        Ok(())
    }
}

impl tally_engine::io::Fs for FailFs {
    fn write_new(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        self.fail(FsOp::Write, path)?;
        tally_engine::io::OsFs.write_new(path, bytes)
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.fail(FsOp::Rename, from)?;
        tally_engine::io::OsFs.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        tally_engine::io::OsFs.sync_dir(dir)
    }

    fn remove(&self, path: &Path) -> std::io::Result<()> {
        tally_engine::io::OsFs.remove(path)
    }
}

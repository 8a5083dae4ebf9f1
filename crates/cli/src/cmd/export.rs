//! `tally export`: one namespace's totals and subtotals of one tier over a range, as
//! Hive-style partitioned Parquet or CSV files (`parts`), for DuckDB, Athena and Spark.
//!
//! The rows come from a running server (`--server URL`: `GET /v1/ns/{ns}/export`, streamed) or
//! from a stopped server's data directory (`--data DIR`: the same `query::export`, in
//! process). Memory stays bounded either way: the rows stream from the source into the
//! partition writers, which bound what they hold.
//!
//! The files are written under a staging directory ([`Stage`]) beside `<out>` and renamed to
//! `<out>/ns=<ns>` once every file is complete and synced, so a reader of `<out>` never sees
//! half an export, nor one a killed run left; an existing `<out>/ns=<ns>` is refused rather
//! than mixed with. An export that fails removes its staging directory, and the next export
//! into the same place removes those of runs that were killed.

use std::fs::{File, TryLockError};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use tally_core::query::{self, ExportQuery};
use tally_core::store::Deadline;
use tally_engine::{Config, Engine};

use crate::http::{Client, Route, ServerError};
use crate::parts::{Format, Parts, Row};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["data", "server"])))]
pub struct ExportArgs {
    /// The namespace.
    #[arg(long)]
    ns: String,
    /// Start of the range (unix seconds or RFC 3339), widened to a whole bucket.
    #[arg(long)]
    from: String,
    /// End of the range (exclusive), widened to a whole bucket.
    #[arg(long)]
    to: String,
    /// The tier to export, e.g. 1h (one of the namespace's tiers).
    #[arg(long)]
    resolution: String,
    /// File format.
    #[arg(long, value_enum, default_value = "parquet")]
    format: Format,
    /// Directory to write `ns=<ns>/date=<YYYY-MM-DD>/part-<N>.<ext>` under.
    #[arg(long)]
    out: PathBuf,
    /// Read a stopped server's data directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Read from this running server.
    #[arg(long, value_parser = crate::http::server_url)]
    server: Option<String>,
    /// Bearer token for --server (needs read on the namespace).
    #[arg(
        long,
        env = "TALLY_TOKEN",
        hide_env_values = true,
        requires = "server",
        value_parser = crate::http::token
    )]
    token: Option<String>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Print the summary as JSON on stdout (instead of a line on stderr).
    #[arg(long)]
    json: bool,
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    // (As a backup's destination: files of its own in a data directory are none of the
    // server's, and a tree there would go wherever the data directory goes.)
    if a.server.is_none() {
        let data = a.data.as_deref().unwrap_or(Path::new("tally-data"));
        if tally_engine::backup::is_inside(&a.out, data).unwrap_or(false) {
            bail!(
                "{} is inside the data directory {}: an export must live apart from the data \
                 it reads",
                a.out.display(),
                data.display()
            );
        }
    }
    let done = a.out.join(format!("ns={}", a.ns));
    if done.exists() {
        bail!(
            "{} already exists: remove it, or export to another --out",
            done.display()
        );
    }
    // A failed export leaves no `<out>` it made (an empty directory looked like an export
    // of nothing). Only an empty one is removed: another export may have put its tree there.
    let made_out = !a.out.exists();
    let forget_out = |e: anyhow::Error| {
        if made_out {
            let _ = std::fs::remove_dir(&a.out);
        }
        e
    };
    // (Removed when it goes out of scope, whatever happens; by then the tree is in place, or
    // the export failed.)
    let stage = Stage::new(&a.out).map_err(forget_out)?;
    let partial = stage.dir.join(format!("ns={}", a.ns));
    let progress = Progress::new(a.quiet);
    let written = std::fs::create_dir_all(&partial)
        .with_context(|| format!("creating {}", partial.display()))
        .and_then(|()| {
            let mut parts = Parts::new(&partial, a.format);
            match &a.server {
                Some(server) => from_server(&a, server, &mut parts, &progress),
                None => from_data(&a, &mut parts, &progress),
            }
            .and_then(|()| parts.finish())
        })
        .and_then(|w| {
            // Nothing to export: no tree (an empty `ns=…` would fail a reader's glob, and a
            // later export of another range into this `<out>`).
            if w.1 == 0 {
                return Ok(w);
            }
            // Another export into the same new `<out>` that failed may have removed it
            // meanwhile (it was empty): make it again.
            let renamed = std::fs::rename(&partial, &done).or_else(|_| {
                std::fs::create_dir_all(&a.out)?;
                std::fs::rename(&partial, &done)
            });
            renamed
                .with_context(|| format!("renaming {} to {}", partial.display(), done.display()))
                .map(|()| w)
        });
    let (rows, files) = match written {
        Ok(w) => w,
        Err(e) => {
            drop(stage);
            return Err(forget_out(e));
        }
    };
    drop(stage);
    if files == 0 {
        let _ = forget_out(anyhow::anyhow!("nothing exported"));
        progress.finish();
        if a.json {
            return crate::conn::write_json(&serde_json::json!({
                "rows": 0,
                "files": 0,
                "dir": null,
                "seconds": progress.start.elapsed().as_secs_f64(),
            }));
        }
        eprintln!("exported nothing: the range holds no counts; nothing was written");
        return Ok(());
    }
    if let Ok(dir) = std::fs::File::open(&a.out) {
        let _ = dir.sync_all();
    }
    progress.finish();
    let secs = progress.start.elapsed().as_secs_f64();
    if a.json {
        return crate::conn::write_json(&serde_json::json!({
            "rows": rows,
            "files": files,
            "dir": done.display().to_string(),
            "seconds": secs,
        }));
    }
    eprintln!(
        "exported {rows} rows into {files} files under {} in {secs:.1} s",
        done.display(),
    );
    Ok(())
}

/// Where an export is written before it is complete: `<parent>/.<name>.tally-partial-<pid>/`
/// beside `<out>` (`<parent>/<name>`), not inside it. Inside, no name hides a tree from
/// every reader: Hive, Spark and Athena skip names starting with `_` or `.`, but DuckDB's
/// `**` glob descends every directory (its local file system lists all but `.` and `..`),
/// so `read_parquet('<out>/**/*.parquet', hive_partitioning = true)` would count a partial
/// tree's rows, while it is written or after the run was killed, a second time. Beside
/// `<out>` it shares its file system, so one rename moves it in; when it cannot (`<out>` is a
/// mount point, or its parent is not writable) it goes inside `<out>` as `.tally-partial-<pid>`,
/// hidden from Hive-style readers only.
///
/// The run holds a lock on `lock` in it; a staging directory whose lock is free belongs to a
/// run that is over (a killed process's locks go with it), and is removed by the next export
/// into the same place. Dropping the `Stage` removes its directory.
#[derive(Debug)]
struct Stage {
    dir: PathBuf,
    lock: Option<File>,
}

impl Stage {
    fn new(out: &Path) -> anyhow::Result<Stage> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let out =
            std::fs::canonicalize(out).with_context(|| format!("opening {}", out.display()))?;
        let beside = out
            .parent()
            .zip(out.file_name())
            .filter(|(parent, _)| same_file_system(parent, &out))
            .map(|(parent, name)| {
                let prefix = format!(".{}.tally-partial-", name.to_string_lossy());
                (parent.to_owned(), prefix)
            });
        let inside = (out.clone(), ".tally-partial-".to_owned());
        let mut failed = None;
        for (parent, prefix) in beside.into_iter().chain([inside]) {
            remove_stale(&parent, &prefix);
            let dir = parent.join(format!("{prefix}{}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let mut stage = Stage { dir, lock: None };
                    stage.lock = Some(stage.lock()?);
                    return Ok(stage);
                }
                Err(e) => failed = Some((dir, e)),
            }
        }
        match failed {
            Some((dir, e)) => Err(e).with_context(|| format!("creating {}", dir.display())),
            None => bail!(
                "no place to write the export's files beside or in {}",
                out.display()
            ),
        }
    }

    /// Makes `lock` and locks it: locked under another name first, then renamed, so that no
    /// other run ever finds it unlocked while this one lives.
    fn lock(&self) -> anyhow::Result<File> {
        let new = self.dir.join("lock.new");
        let lock = File::options()
            .create_new(true)
            .write(true)
            .open(&new)
            .with_context(|| format!("creating {}", new.display()))?;
        lock.try_lock()
            .map_err(|e| match e {
                TryLockError::Error(e) => e,
                TryLockError::WouldBlock => std::io::Error::other("locked by another process"),
            })
            .with_context(|| format!("locking {}", new.display()))?;
        let path = self.dir.join("lock");
        std::fs::rename(&new, &path).with_context(|| format!("creating {}", path.display()))?;
        Ok(lock)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        drop(self.lock.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes the staging directories in `parent` named `prefix…` whose runs are over (their
/// lock free).
fn remove_stale(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let dir = entry.path();
        // No lock yet: a run that is starting (or died starting); left alone.
        let Ok(lock) = File::options().write(true).open(dir.join("lock")) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            drop(lock);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Whether `a` and `b` are on one file system (so a rename moves from one to the other).
#[cfg(unix)]
fn same_file_system(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// (Elsewhere, assumed: a rename that crosses file systems fails the export, saying so.)
#[cfg(not(unix))]
fn same_file_system(_: &Path, _: &Path) -> bool {
    true
}

/// Days one request (or in-process pass) covers at most: rows come key by key, each key's
/// days in turn, so a window of fewer days than `parts::MAX_OPEN` keeps every date's file
/// open and writes one file per date, never one per key and date.
const WINDOW_DAYS: i64 = 60;

/// Where the window that starts at `a` ends (at most `to`): one request's worth of buckets of
/// `res` seconds, at most `max_points` of them (a server refuses more: `[limits]
/// max_points`). Cut at a UTC midnight (a tier's resolution divides an hour, so a midnight
/// starts a bucket), at most [`WINDOW_DAYS`] days on, when a day of buckets fits; else at a multiple of `max_points` buckets (a multiple of `res`: a bucket
/// is never in two windows, as each request widens its range to whole buckets). Either way
/// the window's buckets, widened, lie between two cuts, so they number at most `max_points`.
fn window_end(a: i64, to: i64, res: i64, max_points: usize) -> i64 {
    const DAY: i64 = 86_400;
    let res = res.max(1);
    let points = i64::try_from(max_points).unwrap_or(i64::MAX).max(1);
    let span = points.saturating_mul(res);
    let b = if span >= DAY {
        let days = (span / DAY).min(WINDOW_DAYS);
        (a.div_euclid(DAY) + days) * DAY
    } else {
        (a.div_euclid(span) + 1) * span
    };
    b.min(to)
}

/// `[from, to)` cut into windows (see [`window_end`]).
fn windows(from: i64, to: i64, res: i64, max_points: usize) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut a = from;
    while a < to {
        let b = window_end(a, to, res, max_points);
        out.push((a, b));
        a = b;
    }
    out
}

/// The export's range as unix seconds, and its resolution in seconds.
fn range(a: &ExportArgs) -> anyhow::Result<(i64, i64, i64)> {
    let at = |what: &str, t: &str| {
        tally_core::model::parse_instant(t).map_err(|e| anyhow::anyhow!("--{what}: {e}"))
    };
    let (from, to) = (at("from", &a.from)?, at("to", &a.to)?);
    if from > to {
        bail!("--from ({}) is after --to ({})", a.from, a.to);
    }
    // As the server's export: `from` floored, `to` ceiled to whole seconds (the resolution
    // then floors and ceils them to its buckets), equal instants kept equal.
    let (from, to) = tally_core::query::whole_seconds(from, to, true);
    let res = tally_core::model::Duration::new(&a.resolution)
        .map_err(|e| anyhow::anyhow!("--resolution: {e}"))?;
    Ok((from, to, res.secs_i64()))
}

/// Streams `GET /v1/ns/{ns}/export` and reads it as CSV.
fn from_server(
    a: &ExportArgs,
    server: &str,
    parts: &mut Parts,
    progress: &Progress,
) -> anyhow::Result<()> {
    let client = Client::new(server, a.token.as_deref());
    let (from, to, res) = range(a)?;
    // The server's cap is its own ([limits] max_points): the default first, halved while the
    // server says a window holds too many points (nothing of that window was written).
    let mut max_points = query::DEFAULT_MAX_POINTS;
    let mut wf = from;
    while wf < to {
        let wt = window_end(wf, to, res, max_points);
        let route = Route::namespace(&a.ns, "export")
            .param("from", wf)
            .param("to", wt)
            .param("resolution", &a.resolution);
        let mut resp = client.get_raw(&route)?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let json = serde_json::from_str(&text).unwrap_or_default();
            let e = ServerError::new(status, json);
            if e.code == "too_many_points" && max_points > 1 {
                max_points /= 2;
                continue;
            }
            return Err(e.into());
        }
        let body = BufReader::with_capacity(256 * 1024, resp.into_body().into_reader());
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(body);
        let header = csv
            .headers()
            .context("reading the export's header")?
            .clone();
        if header.iter().collect::<Vec<_>>()
            != ["ns", "key", "ts", "resolution", "dim", "value", "n"]
        {
            bail!("the server's export has an unexpected header: {header:?}");
        }
        let mut record = csv::StringRecord::new();
        while csv.read_record(&mut record).context(
            "reading the server's export (cut off: the server failed mid-way, or the connection broke)",
        )? {
            let field = |i: usize| record.get(i).unwrap_or_default();
            let number = |i: usize| -> anyhow::Result<i64> {
                field(i)
                    .parse()
                    .with_context(|| format!("row {}: bad number {:?}", parts.rows + 1, field(i)))
            };
            let row = Row {
                key: field(1),
                ts: number(2)?,
                resolution: field(3),
                dim: field(4),
                value: field(5),
                n: number(6)?,
            };
            parts.write(&row)?;
            progress.tick(parts.rows);
        }
        parts.close_all()?;
        wf = wt;
    }
    Ok(())
}

/// Runs the export in process on a stopped server's data directory.
fn from_data(a: &ExportArgs, parts: &mut Parts, progress: &Progress) -> anyhow::Result<()> {
    let dir = a.data.as_deref().unwrap_or(Path::new("tally-data"));
    super::existing_data_dir(dir)?;
    let engine = Engine::open(Config::new(dir))
        .with_context(|| format!("opening data directory {}", dir.display()))?;
    let (from, to, res) = range(a)?;
    let mut failed = None;
    // No point cap offline (below): windows of whole days, for the files' sake.
    for (wf, wt) in windows(from, to, res, usize::MAX) {
        let (wf, wt) = (wf.to_string(), wt.to_string());
        let params: [(&str, &str); 3] = [("from", &wf), ("to", &wt), ("resolution", &a.resolution)];
        let q = ExportQuery::parse(&a.ns, &params[..]).map_err(|e| anyhow::anyhow!("{e}"))?;
        // No per-query point cap offline: the rows stream to disk, memory stays bounded.
        let now = tally_core::store::Clock::now(&tally_core::store::SystemClock);
        let plan = query::export_plan(&engine, &q, usize::MAX, now).map_err(anyhow::Error::from)?;
        let res = plan.resolution.to_string();
        query::export(&engine, &plan, &Deadline::none, &mut |r| {
            let row = Row {
                key: r.key,
                ts: r.ts,
                resolution: &res,
                dim: r.dim,
                value: r.value,
                n: r.n,
            };
            match parts.write(&row) {
                Ok(()) => {
                    progress.tick(parts.rows);
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })
        // Whole, causes included: a damaged segment names its file and block.
        .map_err(anyhow::Error::from)?;
        if failed.is_some() {
            break;
        }
        parts.close_all()?;
    }
    engine.close();
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A progress line on stderr (rows, rows/s), hidden when stderr is not a terminal or with
/// `--quiet`.
struct Progress {
    bar: indicatif::ProgressBar,
    start: Instant,
}

impl Progress {
    fn new(quiet: bool) -> Progress {
        let bar = if quiet {
            indicatif::ProgressBar::hidden()
        } else {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {human_pos} rows, {per_sec}, {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b
        };
        Progress {
            bar,
            start: Instant::now(),
        }
    }

    fn tick(&self, rows: u64) {
        if rows.is_multiple_of(4096) {
            self.bar.set_position(rows);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The staging tree lies beside `<out>`, never in it: nothing under `<out>` but finished
    /// exports, whatever happens to the run.
    #[test]
    fn the_partial_tree_is_written_beside_out_not_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let stage = Stage::new(&out).unwrap();
        let out = std::fs::canonicalize(&out).unwrap();
        assert!(!stage.dir.starts_with(&out), "{}", stage.dir.display());
        assert_eq!(stage.dir.parent(), out.parent());
        let name = stage
            .dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with(".out.tally-partial-"), "{name}");
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        let dir = stage.dir.clone();
        drop(stage);
        assert!(!dir.exists());
    }

    /// A staging directory whose run is over (its lock free) is removed by the next export
    /// into the same place; a live run's is kept.
    #[test]
    fn staging_directories_of_runs_that_are_over_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let stale = tmp.path().join(".out.tally-partial-4000000001");
        let live = tmp.path().join(".out.tally-partial-4000000002");
        let other = tmp.path().join(".elsewhere.tally-partial-4000000003");
        for d in [&stale, &live, &other] {
            std::fs::create_dir_all(d.join("ns=clicks/date=2026-11-19")).unwrap();
            std::fs::write(d.join("lock"), "").unwrap();
        }
        let held = File::options().write(true).open(live.join("lock")).unwrap();
        held.try_lock().unwrap();
        let stage = Stage::new(&out).unwrap();
        assert!(!stale.exists());
        assert!(live.exists());
        assert!(
            other.exists(),
            "another --out's staging directory is not ours to judge"
        );
        // Ours is locked from the moment it has a lock: another run's scan leaves it alone.
        remove_stale(tmp.path(), ".out.tally-partial-");
        assert!(stage.dir.join("lock").exists());
    }

    #[test]
    fn ranges_are_cut_at_midnights_into_windows_of_sixty_days() {
        let day = 86_400;
        let from = 100 * day + 3600;
        let to = 250 * day + 7200;
        let w = windows(from, to, 3600, query::DEFAULT_MAX_POINTS);
        assert_eq!(w.first().map(|x| x.0), Some(from));
        assert_eq!(w.last().map(|x| x.1), Some(to));
        for pair in w.windows(2) {
            assert_eq!(pair[0].1, pair[1].0);
            assert_eq!(pair[0].1 % day, 0);
        }
        assert!(w.iter().all(|(a, b)| b - a <= WINDOW_DAYS * day && a < b));
        assert_eq!(w.len(), 3);
        assert!(windows(5, 5, 3600, 100).is_empty());
    }

    /// Each window holds at most `max_points` buckets, widened to whole buckets as the server
    /// widens them, and no bucket is in two windows: 10 s over 30 days is cut into 11-day
    /// windows (the first cut asked for all 30 days, 259 200 points, and got 422
    /// too_many_points), 1 s under a cap of 10 000 into pieces of a day.
    #[test]
    fn windows_hold_at_most_the_point_cap() {
        let day = 86_400;
        let w = windows(day * 20_000, day * 20_030, 10, query::DEFAULT_MAX_POINTS);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], (day * 20_000, day * 20_011));
        for (res, max) in [
            (10, 100_000),
            (1, 100_000),
            (1, 10_000),
            (60, 1000),
            (3600, 20),
            (3600, 1),
            (1, usize::MAX),
        ] {
            for (from, to) in [
                (day * 20_000, day * 20_030),
                (day * 20_000 + 7, day * 20_003 + 5),
                (-day - 13, day + 1),
            ] {
                let w = windows(from, to, res, max);
                let what = format!("{res} s, cap {max}, [{from}, {to})");
                assert_eq!(w.first().map(|x| x.0), Some(from), "{what}");
                assert_eq!(w.last().map(|x| x.1), Some(to), "{what}");
                for pair in w.windows(2) {
                    assert_eq!(pair[0].1, pair[1].0, "{what}");
                    assert_eq!(pair[0].1 % res, 0, "{what}: a cut inside a bucket");
                }
                for (a, b) in &w {
                    let (wa, wb) = (a.div_euclid(res) * res, (b + res - 1).div_euclid(res) * res);
                    let buckets = usize::try_from((wb - wa) / res).unwrap();
                    assert!(a < b && buckets <= max, "{what}: [{a}, {b}) {buckets}");
                    assert!(b - a <= WINDOW_DAYS * day, "{what}");
                }
            }
        }
    }
}

//! Export throughput (issue 11): `tally export` of a month of clickstream history, offline
//! from the data directory and through a running server, as Parquet and as CSV — the
//! release binary end to end (reading, partitioning, encoding, compressing, syncing).
//!
//! Needs `target/release/tally` beside this binary: `cargo build --release -p tally` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use tally_core::store::{Clock, Store, SystemClock};
use tally_engine::{Config, Engine, FsyncPolicy};

use crate::workload;

fn tally_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe.with_file_name("tally");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --release -p tally first",
        bin.display()
    );
    bin
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let m = e.metadata().expect("metadata");
        total += if m.is_dir() {
            dir_bytes(&e.path())
        } else {
            m.len()
        };
    }
    total
}

/// Runs one export; (rows, seconds, bytes written).
fn run_export(args: &[&str], out: &Path) -> (u64, f64, u64) {
    let t = Instant::now();
    let o = Command::new(tally_bin())
        .arg("export")
        .args(args)
        .args(["--quiet", "--out", out.to_str().expect("utf-8")])
        .output()
        .expect("tally export");
    let secs = t.elapsed().as_secs_f64();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{said}");
    let rows = said
        .split("exported ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("rows in the summary");
    (rows, secs, dir_bytes(out))
}

pub fn bench(args: &[String]) {
    let events: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("events="))
        .map_or(2_000_000, |n| n.parse().expect("events=N"));
    let days = 30;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let now = SystemClock.now();
    let start = (now - days * 86_400).div_euclid(86_400) * 86_400;
    {
        let mut cfg = Config::new(&data);
        cfg.fsync = FsyncPolicy::Never;
        let engine = Arc::new(Engine::open(cfg).expect("open"));
        let mut g = workload::Generator::new(workload::Shape::default(), 11);
        let raws = g.span(start, days * 86_400, events);
        for b in workload::prepare(&*engine, raws, now) {
            engine.apply(&b).expect("apply");
        }
        engine.maintain().expect("flush");
        engine.sync().expect("sync");
        engine.close();
    }
    let (from, to) = (start.to_string(), (start + days * 86_400).to_string());
    let range = [
        "--ns",
        "clicks",
        "--from",
        &from,
        "--to",
        &to,
        "--resolution",
        "1h",
    ];
    println!(
        "workload: {events} clickstream events over {days} days (100 000 Zipf keys, country + referrer), exported at 1h"
    );
    let mut rows_out = Vec::new();
    for format in ["parquet", "csv"] {
        let out = dir.path().join(format!("offline-{format}"));
        let (rows, secs, bytes) = run_export(
            &[
                &range[..],
                &["--data", data.to_str().expect("utf-8"), "--format", format],
            ]
            .concat(),
            &out,
        );
        rows_out.push((format!("offline (--data), {format}"), rows, secs, bytes));
    }
    // Through a running server.
    let (mut child, url) = serve(&data);
    for format in ["parquet", "csv"] {
        let out = dir.path().join(format!("server-{format}"));
        let (rows, secs, bytes) = run_export(
            &[&range[..], &["--server", &url, "--format", format]].concat(),
            &out,
        );
        rows_out.push((
            format!("through the server (--server), {format}"),
            rows,
            secs,
            bytes,
        ));
    }
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "\n| export | rows | seconds | rows/s | bytes written | bytes/row |\n|---|---|---|---|---|---|"
    );
    for (what, rows, secs, bytes) in rows_out {
        println!(
            "| {what} | {rows} | {secs:.2} | {:.0} k | {bytes} | {:.1} |",
            rows as f64 / secs / 1e3,
            bytes as f64 / rows as f64
        );
    }
}

/// `tally serve` on `data` and a free port; the child and its URL.
fn serve(data: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(tally_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            data.to_str().expect("utf-8"),
        ])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("serve");
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let url = loop {
        let line = lines.next().expect("serve exited").expect("log line");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().expect("url").to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// Peak resident memory (VmHWM) of a child, polled until it exits; (seconds, peak bytes).
fn run_measured(cmd: &mut Command) -> (f64, u64, String) {
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let mut peak = 0u64;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        let hwm = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            });
        peak = peak.max(hwm.unwrap_or(0) * 1024);
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let secs = t.elapsed().as_secs_f64();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "{err}");
    (secs, peak, err)
}

/// Bulk load (issue 11): `tally load --data` of a CSV of clickstream events against DuckDB
/// loading the same CSV into rollup tables (hourly totals, hourly per country, hourly per
/// referrer) — `events=N` (default 5 000 000); DuckDB is `$TALLY_DUCKDB_PYTHON` or
/// `target/duckdb-venv/bin/python` (scripts/test.sh installs it). With `online=1`, also
/// `tally load --server` into a fresh `tally serve` (the load's peak memory; the server's
/// is its own).
pub fn load_bench(args: &[String]) {
    use std::io::Write;
    let events: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("events="))
        .map_or(5_000_000, |n| n.parse().expect("events=N"));
    let days = 30;
    let dir = tempfile::tempdir().expect("tempdir");
    // `csv=PATH` keeps the generated CSV there (and reuses it when it exists: the same events
    // for several runs, as long as the clock has not moved by days).
    let kept = args
        .iter()
        .find_map(|a| a.strip_prefix("csv="))
        .map(PathBuf::from);
    let csv = kept
        .clone()
        .unwrap_or_else(|| dir.path().join("clicks.csv"));
    let now = SystemClock.now();
    let start = (now - days * 86_400).div_euclid(86_400) * 86_400;
    if kept.is_none() || !csv.is_file() {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&csv).expect("csv"));
        writeln!(f, "ns,key,ts,n,country,referrer").expect("write");
        let mut g = workload::Generator::new(workload::Shape::default(), 21);
        let mut left = events;
        while left > 0 {
            let n = left.min(100_000);
            for batch in g.span(start, days * 86_400, n) {
                for e in batch {
                    let dim = |d: &str| {
                        e.dims
                            .iter()
                            .find(|(k, _)| k == d)
                            .map_or("", |(_, v)| v.as_str())
                            .to_owned()
                    };
                    writeln!(
                        f,
                        "clicks,{},{},1,{},{}",
                        e.key,
                        e.ts.unwrap_or_default(),
                        dim("country"),
                        dim("referrer")
                    )
                    .expect("write");
                }
            }
            left -= n;
        }
    }
    let csv_bytes = std::fs::metadata(&csv).expect("csv").len();
    println!(
        "workload: {events} clickstream events over {days} days in a {csv_bytes}-byte CSV (100 000 Zipf keys, country + referrer)"
    );
    // `mem=512,2048`: a tally run per --memory-mb (default: the flag's default, 512).
    let mems: Vec<String> = args
        .iter()
        .find_map(|a| a.strip_prefix("mem="))
        .unwrap_or("512")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut rows = Vec::new();
    for mem in &mems {
        let data = dir.path().join(format!("data-{mem}"));
        let (secs, peak, said) = run_measured(
            Command::new(tally_bin())
                .args([
                    "load",
                    csv.to_str().expect("utf-8"),
                    "--quiet",
                    "--batch",
                    "20000",
                    "--memory-mb",
                    mem,
                ])
                .args(["--data", data.to_str().expect("utf-8"), "--create"]),
        );
        let segments = dir_bytes(&data.join("segments"));
        let all = dir_bytes(&data);
        println!("tally --memory-mb {mem}: {}", said.trim());
        let passes = if said.contains("two passes") {
            "two passes"
        } else {
            "one pass"
        };
        rows.push((
            format!("tally load --data --memory-mb {mem} ({passes})"),
            secs,
            peak,
            format!("segments {segments} B, data directory {all} B"),
        ));
        std::fs::remove_dir_all(&data).expect("remove the data directory");
    }
    if args.iter().any(|a| a == "online=1") {
        let data = dir.path().join("data-online");
        let (mut server, url) = serve(&data);
        let (secs, peak, said) = run_measured(Command::new(tally_bin()).args([
            "load",
            csv.to_str().expect("utf-8"),
            "--quiet",
            "--server",
            &url,
        ]));
        println!("tally load --server: {}", said.trim());
        let _ = server.kill();
        let _ = server.wait();
        rows.push((
            "tally load --server (a fresh tally serve, --batch 5000)".to_owned(),
            secs,
            peak,
            format!("data directory {} B", dir_bytes(&data)),
        ));
        std::fs::remove_dir_all(&data).expect("remove the data directory");
    }
    let py = std::env::var_os("TALLY_DUCKDB_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .expect("exe")
                .parent()
                .and_then(Path::parent)
                .expect("target dir")
                .join("duckdb-venv/bin/python")
        });
    if py.is_file() {
        let db = dir.path().join("rollups.duckdb");
        let sql = format!(
            "create table events as select * from read_csv('{c}', header = true, \
             columns = {{'ns': 'VARCHAR', 'key': 'VARCHAR', 'ts': 'BIGINT', 'n': 'BIGINT', 'country': 'VARCHAR', 'referrer': 'VARCHAR'}}); \
             create table hourly as select ns, key, ts // 3600 * 3600 as hour, sum(n) as n from events group by all; \
             create table hourly_country as select ns, key, ts // 3600 * 3600 as hour, country, sum(n) as n from events where country is not null group by all; \
             create table hourly_referrer as select ns, key, ts // 3600 * 3600 as hour, referrer, sum(n) as n from events where referrer is not null group by all; \
             drop table events; checkpoint;",
            c = csv.display()
        );
        let script = format!(
            "import duckdb; con = duckdb.connect('{}'); con.execute(\"{}\"); con.close()",
            db.display(),
            sql.replace('"', "\\\"")
        );
        let (secs, peak, _) = run_measured(Command::new(&py).args(["-c", &script]));
        rows.push((
            "DuckDB: the CSV into hourly rollup tables (totals, per country, per referrer)"
                .to_owned(),
            secs,
            peak,
            format!(
                "database file {} B",
                std::fs::metadata(&db).map_or(0, |m| m.len())
            ),
        ));
    } else {
        println!("(no DuckDB at {}: its row is left out)", py.display());
    }
    // chDB (ClickHouse in a Python process): the same rollups as SummingMergeTree tables.
    let venv = |env: &str, dir: &str| {
        std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
            std::env::current_exe()
                .expect("exe")
                .parent()
                .and_then(Path::parent)
                .expect("target dir")
                .join(dir)
        })
    };
    let chdb = venv("TALLY_CHDB_PYTHON", "chdb-venv/bin/python");
    if chdb.is_file() {
        let db = dir.path().join("chdb");
        let cols = "ns String, key String, ts Int64, n Int64, country String, referrer String";
        let rollup = |table: &str, dim: &str| {
            let (col, filter) = if dim.is_empty() {
                (String::new(), String::new())
            } else {
                (format!(", {dim}"), format!(" WHERE {dim} != ''"))
            };
            format!(
                "s.query(\"CREATE TABLE db.{table} (ns String, key String, hour Int64{coldef}, n Int64) ENGINE = SummingMergeTree ORDER BY (ns, key, hour{col})\"); \
                 s.query(\"INSERT INTO db.{table} SELECT ns, key, intDiv(ts, 3600) * 3600 AS hour{col}, sum(n) FROM db.events{filter} GROUP BY ns, key, hour{col}\"); ",
                coldef = if dim.is_empty() {
                    String::new()
                } else {
                    format!(", {dim} String")
                },
            )
        };
        let script = format!(
            "from chdb import session; s = session.Session('{db}'); \
             s.query('CREATE DATABASE IF NOT EXISTS db ENGINE = Atomic'); \
             s.query(\"CREATE TABLE db.events ({cols}) ENGINE = Memory\"); \
             s.query(\"INSERT INTO db.events SELECT * FROM file('{csv}', 'CSVWithNames', '{cols}')\"); \
             {} {} {} s.query('DROP TABLE db.events'); s.close()",
            rollup("hourly", ""),
            rollup("hourly_country", "country"),
            rollup("hourly_referrer", "referrer"),
            db = db.display(),
            csv = csv.display(),
        );
        let (secs, peak, said) = run_measured(Command::new(&chdb).args(["-c", &script]));
        assert!(!said.contains("Traceback"), "chDB: {said}");
        rows.push((
            "chDB: the CSV into hourly SummingMergeTree rollups (totals, per country, per referrer)"
                .to_owned(),
            secs,
            peak,
            format!("database directory {} B", dir_bytes(&db)),
        ));
    } else {
        println!("(no chDB at {}: its row is left out)", chdb.display());
    }
    println!("\n| load | seconds | events/s | peak memory | on disk |\n|---|---|---|---|---|");
    for (what, secs, peak, disk) in rows {
        println!(
            "| {what} | {secs:.1} | {:.0} k | {:.0} MiB | {disk} |",
            events as f64 / secs / 1e3,
            peak as f64 / 1_048_576.0
        );
    }
}

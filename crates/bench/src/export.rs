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
    let url = {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let url = loop {
            let line = lines.next().expect("serve exited").expect("log line");
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().expect("url").to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        url
    };
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

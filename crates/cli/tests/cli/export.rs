//! `tally export` end to end: a server's namespace exported from the server and from its
//! stopped data directory, as Parquet and CSV, read back by DuckDB itself — sums per key and
//! day match the server's own series answers, partitions prune, and bad exports are refused.
//!
//! DuckDB is the `duckdb` Python package: `$TALLY_DUCKDB_PYTHON`, else
//! `target/duckdb-venv/bin/python` (`scripts/test.sh` installs it there). Without it the
//! DuckDB checks say so and are skipped, unless `TALLY_REQUIRE_DUCKDB` is set (the script
//! sets it), so CI cannot skip them silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::{run, serve_cmd, sigterm_and_wait, tally};

/// 2026-11-17T00:00:00Z: three whole days of events follow.
const DAY0: i64 = 1_794_873_600;

const CONFIG: &str = r#"
[namespaces.clicks]
tiers = ["1m:2d", "1h:forever"]
breakdown_tiers = ["1h"]
dimensions = ["country"]
"#;

fn duckdb_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TALLY_DUCKDB_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/duckdb-venv/bin/python");
    let ok = Command::new(&p)
        .args(["-c", "import duckdb"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

/// Runs `sql` in DuckDB; the rows as JSON arrays.
fn duckdb(python: &Path, sql: &str) -> Result<Vec<Value>, String> {
    let script = r#"
import duckdb, json, sys
rows = duckdb.sql(sys.argv[1]).fetchall()
print(json.dumps([[str(c) if not isinstance(c, (int, float, type(None))) else c for c in r] for r in rows]))
"#;
    let out = Command::new(python)
        .args(["-c", script, sql])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

fn events() -> Value {
    let mut ev = Vec::new();
    let mut x: u64 = 7;
    for i in 0..3000i64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = if i % 10 == 0 {
            "a,\"quoted\" key".to_owned()
        } else {
            format!("lnk_{}", (x >> 33) % 40)
        };
        let country = ["de", "fr", "us", "jp"][((x >> 20) % 4) as usize];
        let ts = DAY0 + ((x >> 8) % (3 * 86_400)) as i64;
        let mut e = json!({"ns": "clicks", "key": key, "ts": ts, "n": 1 + (i % 3)});
        if i % 7 != 0 {
            e["dims"] = json!({"country": country});
        }
        ev.push(e);
    }
    Value::Array(ev)
}

fn export(args: &[&str]) -> std::process::Output {
    tally()
        .arg("export")
        .args(args)
        .arg("--quiet")
        .output()
        .unwrap()
}

#[test]
fn exports_read_back_by_duckdb_match_the_series_answers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tally.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let data = dir.path().join("data");
    let s = serve_cmd(
        tally().env("TALLY_DATA", &data),
        &["--config", cfg.to_str().unwrap()],
    );
    let base = s.url.trim_end_matches('/').to_owned();
    let agent = super::http_agent();
    let resp = agent
        .post(format!("{base}/v1/events"))
        .header("Content-Type", "application/json")
        .send(events().to_string())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    let (from, to) = (DAY0.to_string(), (DAY0 + 3 * 86_400).to_string());
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
    let out_dir = |name: &str| dir.path().join(name);
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    for (name, format) in [("pq", "parquet"), ("csv", "csv")] {
        let o = export(
            &[
                &range[..],
                &[
                    "--server",
                    &base,
                    "--format",
                    format,
                    "--out",
                    &path(&out_dir(name)),
                ],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let said = String::from_utf8_lossy(&o.stderr);
        assert!(said.contains("into 3 files"), "{said}");
    }
    // The data directory is the running server's: refused.
    let o = export(
        &[
            &range[..],
            &["--data", &path(&data), "--out", &path(&out_dir("x"))],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(!out_dir("x").join("ns=clicks").exists());
    // Refusals: an export already there, a tier the namespace lacks, no such namespace.
    let o = export(
        &[
            &range[..],
            &["--server", &base, "--out", &path(&out_dir("pq"))],
        ]
        .concat(),
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    let mut bad = range.to_vec();
    bad[7] = "15m";
    let o = export(
        &[
            &bad[..],
            &["--server", &base, "--out", &path(&out_dir("bad"))],
        ]
        .concat(),
    );
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("no 15m tier"),
        "{said}"
    );
    // Nothing left behind: not even the --out it made.
    assert!(!out_dir("bad").exists(), "partial left behind");
    // Nor beside them: the staging directories (`.<out>.tally-partial-<pid>`) went.
    let staged: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tally-partial"))
        .collect();
    assert!(staged.is_empty(), "{staged:?}");

    // The server's own answers: per key, per UTC day.
    let (_, keys) = {
        let mut r = agent
            .get(format!("{base}/v1/ns/clicks/keys?limit=1000"))
            .call()
            .unwrap();
        (
            (),
            serde_json::from_str::<Value>(&r.body_mut().read_to_string().unwrap()).unwrap(),
        )
    };
    let mut want: BTreeMap<(String, String), i64> = BTreeMap::new();
    for k in keys["keys"].as_array().unwrap() {
        let k = k.as_str().unwrap();
        let enc: String = k
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let mut r = agent
            .get(format!(
                "{base}/v1/ns/clicks/keys/{enc}/series?from={from}&to={to}&unit=day"
            ))
            .call()
            .unwrap();
        let a: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        for p in a["points"].as_array().unwrap() {
            let n = p["n"].as_i64().unwrap();
            if n != 0 {
                let day = p["t"].as_str().unwrap()[..10].to_owned();
                want.insert((k.to_owned(), day), n);
            }
        }
    }
    assert_eq!(want.values().sum::<i64>(), 6000);
    sigterm_and_wait(s);

    // Offline, from the stopped server's directory: the same rows.
    let o = export(
        &[
            &range[..],
            &["--data", &path(&data), "--out", &path(&out_dir("offline"))],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let Some(py) = duckdb_python() else {
        assert!(
            std::env::var_os("TALLY_REQUIRE_DUCKDB").is_none(),
            "TALLY_REQUIRE_DUCKDB is set but no duckdb is found (scripts/test.sh installs it)"
        );
        eprintln!("SKIPPED the DuckDB checks: no duckdb (pip install duckdb, or scripts/test.sh)");
        return;
    };
    let per_day = |glob: &str, reader: &str| {
        let rows = duckdb(
            &py,
            &format!(
                "select key, cast(date as varchar), sum(n) from {reader}('{glob}', hive_partitioning = true) \
                 where coalesce(dim, '') = '' and ns = 'clicks' group by all order by all"
            ),
        )
        .unwrap();
        rows.iter()
            .map(|r| {
                (
                    (
                        r[0].as_str().unwrap().to_owned(),
                        r[1].as_str().unwrap().to_owned(),
                    ),
                    r[2].as_i64().unwrap(),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    let pq = path(&out_dir("pq"));
    assert_eq!(per_day(&format!("{pq}/**/*.parquet"), "read_parquet"), want);
    assert_eq!(
        per_day(
            &format!("{}/**/*.parquet", path(&out_dir("offline"))),
            "read_parquet"
        ),
        want
    );
    assert_eq!(
        per_day(&format!("{}/**/*.csv", path(&out_dir("csv"))), "read_csv"),
        want
    );
    // Subtotals sum to at most their totals, per key and day (some events had no country).
    let sub = duckdb(
        &py,
        &format!(
            "select sum(n) from read_parquet('{pq}/**/*.parquet', hive_partitioning = true) where dim = 'country'"
        ),
    )
    .unwrap();
    let with_country: i64 = events()
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e.get("dims").is_some())
        .map(|e| e["n"].as_i64().unwrap())
        .sum();
    assert_eq!(sub[0][0].as_i64(), Some(with_country));

    // Partitions prune: with one day's file ruined (not the first, which DuckDB reads for the
    // schema), a query of another day still reads.
    let ruined = out_dir("pq").join("ns=clicks/date=2026-11-19/part-0.parquet");
    std::fs::write(&ruined, b"not parquet").unwrap();
    let one_day = duckdb(
        &py,
        &format!(
            "select sum(n) from read_parquet('{pq}/**/*.parquet', hive_partitioning = true) \
             where date = '2026-11-18' and dim = ''"
        ),
    )
    .unwrap();
    let day2: i64 = want
        .iter()
        .filter(|((_, d), _)| d == "2026-11-18")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(one_day[0][0].as_i64(), Some(day2));
    assert!(
        duckdb(
            &py,
            &format!(
                "select sum(n) from read_parquet('{pq}/**/*.parquet', hive_partitioning = true)"
            )
        )
        .is_err(),
        "the ruined file is read when the query needs it"
    );
    let _ = run;
}

/// Every data row of the CSV files under `dir`, with its partition, sorted.
fn csv_rows(dir: &Path) -> Vec<String> {
    let mut rows = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
                continue;
            }
            let part = p.parent().unwrap().strip_prefix(dir).unwrap().to_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            for line in text.lines().skip(1) {
                rows.push(format!("{}: {line}", part.display()));
            }
        }
    }
    rows.sort();
    rows
}

/// A failed export leaves nothing behind: no `--out` it made, no staging directory (the
/// first cut left an empty `--out`, which looked like an export of nothing).
#[test]
fn a_failed_export_leaves_no_directory_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let missing = dir.path().join("nowhere");
    let run = || {
        export(&[
            "--ns",
            "clicks",
            "--from",
            "0",
            "--to",
            "3600",
            "--resolution",
            "1h",
            "--out",
            out.to_str().unwrap(),
            "--data",
            missing.to_str().unwrap(),
        ])
    };
    let o = run();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("is not a tally data directory"),
        "{said}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // An --out that was there stays, as it was.
    std::fs::create_dir(&out).unwrap();
    let o = run();
    assert!(!o.status.success());
    assert!(out.is_dir());
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

/// A server whose `[limits] max_points` holds less than a day of the tier: the export cuts
/// its requests to fit (the first cut asked for 60 days whatever the resolution, and got
/// 422 too_many_points), and writes the rows an export without the cap writes.
#[test]
fn an_export_cuts_its_requests_to_the_server_s_point_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tally.toml");
    std::fs::write(&cfg, format!("{CONFIG}\n[limits]\nmax_points = 20\n")).unwrap();
    let data = dir.path().join("data");
    let s = serve_cmd(
        tally().env("TALLY_DATA", &data),
        &["--config", cfg.to_str().unwrap()],
    );
    let base = s.url.trim_end_matches('/').to_owned();
    let resp = super::http_agent()
        .post(format!("{base}/v1/events"))
        .header("Content-Type", "application/json")
        .send(events().to_string())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (from, to) = (DAY0.to_string(), (DAY0 + 3 * 86_400).to_string());
    let range_from_to = |from: &str, to: &str| -> Vec<String> {
        [
            "--ns",
            "clicks",
            "--from",
            from,
            "--to",
            to,
            "--resolution",
            "1h",
            "--format",
            "csv",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let range = range_from_to(&from, &to);
    let range: Vec<&str> = range.iter().map(String::as_str).collect();
    let online = dir.path().join("online");
    let o = export(
        &[
            &range[..],
            &["--server", &base, "--out", online.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    sigterm_and_wait(s);
    let offline = dir.path().join("offline");
    let o = export(
        &[
            &range[..],
            &[
                "--data",
                data.to_str().unwrap(),
                "--out",
                offline.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = csv_rows(&offline);
    assert!(want.len() > 1000, "{}", want.len());
    assert_eq!(csv_rows(&online), want);
    // Ends with a fraction of a second take the hours they fall in: the last hour starts
    // before `--to` (it was floored to 23:00:00, and left out).
    let fractions = dir.path().join("fractions");
    let range = range_from_to("2026-11-17T00:00:00.5Z", "2026-11-19T23:00:00.5Z");
    let mut args: Vec<&str> = range.iter().map(String::as_str).collect();
    args.extend([
        "--data",
        data.to_str().unwrap(),
        "--out",
        fractions.to_str().unwrap(),
    ]);
    let o = export(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(csv_rows(&fractions), want);
}

/// An export of a range that holds nothing writes nothing: no `ns=…` directory, which left
/// empty made a reader's glob fail ("No files found") and refused a later export into the
/// same `--out` (found by a review).
#[test]
fn an_export_of_nothing_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("one.csv");
    std::fs::write(&csv, "ns,key,ts,n\nclicks,k,1795132800,1\n").unwrap();
    let data = dir.path().join("d");
    let o = tally()
        .args(["load", csv.to_str().unwrap(), "--data"])
        .arg(&data)
        .args(["--create", "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("out");
    let run = |json: bool| {
        let mut args = vec![
            "--ns",
            "clicks",
            "--from",
            "0",
            "--to",
            "3600",
            "--resolution",
            "1h",
            "--out",
            out.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ];
        if json {
            args.push("--json");
        }
        export(&args)
    };
    let o = run(false);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && said.contains("exported nothing"),
        "{said}"
    );
    assert!(!out.exists(), "an --out it made is not left");
    std::fs::create_dir(&out).unwrap();
    let o = run(true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((&v["rows"], &v["dir"]), (&json!(0), &Value::Null), "{v}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    // An --out inside the data directory read is refused, as a backup's destination is,
    // and nothing is written there (it was taken: found by a review).
    for inside in [data.join("segments"), data.join("exports/x")] {
        let o = export(&[
            "--ns",
            "clicks",
            "--from",
            "1795132800",
            "--to",
            "1795136400",
            "--resolution",
            "1h",
            "--out",
            inside.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ]);
        let said = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && said.contains("is inside the data directory"),
            "{said}"
        );
        assert!(!inside.join("ns=clicks").exists());
    }
    assert!(!data.join("exports").exists());
}

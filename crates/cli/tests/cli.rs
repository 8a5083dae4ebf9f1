//! The `tally` binary end to end: refusals exit non-zero with one clear line; `serve` logs one
//! ready line, answers the client commands, and on SIGTERM exits 0 with its log durable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Kept under `tests/cli/` so it is a module of this test binary, not one more binary.
#[path = "cli/dashboard.rs"]
mod dashboard;
#[path = "cli/export.rs"]
mod export;
#[path = "cli/load.rs"]
mod load;

fn tally() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tally"));
    c.env_remove("TALLY_DATA")
        .env_remove("TALLY_LISTEN")
        .env_remove("TALLY_CONFIG")
        .env_remove("TALLY_BACKEND")
        .env_remove("TALLY_TLS_CERT")
        .env_remove("TALLY_TLS_KEY")
        .env_remove("TALLY_ACCEPT_DATA_LOSS");
    c
}

/// An HTTP client that takes error statuses as answers.
fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

fn run(args: &[&str]) -> Output {
    tally().args(args).output().unwrap()
}

#[track_caller]
fn refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success: {err}"
    );
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
}

#[test]
fn serve_refuses_bad_flags_configs_and_data_dirs() {
    let dir = tempfile::tempdir().unwrap();
    refused(
        &run(&["serve", "--listen", "not-an-address"]),
        "invalid value",
    );
    refused(&run(&["serve", "--bogus"]), "unexpected argument");
    let missing = dir.path().join("nope.toml");
    refused(
        &run(&["serve", "--config", missing.to_str().unwrap()]),
        "reading config",
    );
    // A path that is no settings file: refused after 16 MiB read, not read without end.
    refused(
        &run(&["serve", "--config", "/dev/zero"]),
        "larger than 16777216 bytes",
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "fsync = \"sometimes\"").unwrap();
    let out = run(&[
        "serve",
        "--data",
        dir.path().join("d").to_str().unwrap(),
        "--config",
        bad.to_str().unwrap(),
    ]);
    refused(&out, "fsync must be");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().count(),
        1,
        "one clear line"
    );
    std::fs::write(&bad, "[limits]\nmax_points = 0").unwrap();
    refused(
        &run(&["serve", "--config", bad.to_str().unwrap()]),
        "max_points",
    );
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    refused(
        &run(&[
            "serve",
            "--data",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ]),
        "a-file is not a directory",
    );
    refused(
        &run(&[
            "serve",
            "--backend",
            "memcached://127.0.0.1:11211",
            "--listen",
            "127.0.0.1:0",
        ]),
        "not one this build knows",
    );
    // A Redis nobody listens on: refused at start, naming it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    refused(
        &run(&[
            "serve",
            "--backend",
            &format!("redis://127.0.0.1:{port}/0"),
            "--listen",
            "127.0.0.1:0",
        ]),
        &format!("redis at 127.0.0.1:{port}/0: connection refused"),
    );
    // The environment variables are read too.
    let out = tally()
        .args(["serve"])
        .env("TALLY_LISTEN", "nowhere")
        .output()
        .unwrap();
    refused(&out, "invalid value");
}

#[test]
fn serve_refuses_a_bad_or_busy_statsd_address() {
    refused(
        &run(&["serve", "--listen", "127.0.0.1:0", "--statsd", "8125"]),
        "invalid value",
    );
    let out = tally()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("TALLY_STATSD", "nowhere")
        .output()
        .unwrap();
    refused(&out, "invalid value");
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = run(&[
        "serve",
        "--data",
        dir.path().join("d").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--statsd",
        &addr,
    ]);
    refused(&out, &format!("listening for StatsD on udp {addr}"));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = run(&[
        "serve",
        "--data",
        dir.path().join("d").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--statsd-tcp",
        &addr,
    ]);
    refused(&out, &format!("listening for StatsD on tcp {addr}"));
    refused(
        &run(&["serve", "--listen", "127.0.0.1:0", "--statsd-tcp", "x"]),
        "invalid value",
    );
}

#[test]
fn serve_refuses_half_or_bad_tls_flags_and_says_https_when_ready() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM").unwrap();
    let (cert, key, garbage) = (
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        garbage.to_str().unwrap(),
    );
    refused(&run(&["serve", "--tls-cert", cert]), "--tls-key");
    refused(&run(&["serve", "--tls-key", key]), "--tls-cert");
    refused(
        &run(&["serve", "--tls-cert", garbage, "--tls-key", key]),
        "garbage.pem: no PEM certificate",
    );
    refused(
        &run(&[
            "serve",
            "--tls-cert",
            cert,
            "--tls-key",
            "/nonexistent/key.pem",
        ]),
        "reading /nonexistent/key.pem",
    );
    refused(
        &run(&["serve", "--tls-cert", "/dev/zero", "--tls-key", key]),
        "larger than 16777216 bytes",
    );
    let mut child = tally()
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert", cert])
        .env("TALLY_TLS_KEY", key)
        .env("TALLY_DATA", dir.path().join("d"))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("serve exited early").unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    // The client commands speak https (found by a review: built without TLS, they could
    // not): trusting the server's self-signed certificate with --ca-cert, and refusing it
    // without, saying why.
    let url = url.trim_end_matches('/').to_owned();
    let o = run(&["incr", "clicks", "k", "--server", &url, "--ca-cert", cert]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = tally()
        .args(["keys", "clicks", "--server", &url, "--json"])
        .env("TALLY_CA_CERT", cert)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && said.contains("\"k\""), "{said}");
    refused(
        &run(&["keys", "clicks", "--server", &url]),
        "cannot reach the server",
    );
    // http:// to an https server: the message says which scheme it likely wants (found by
    // a review: "http parse fail: invalid HTTP version" alone).
    refused(
        &run(&[
            "keys",
            "clicks",
            "--server",
            &url.replacen("https://", "http://", 1),
        ]),
        "use an https:// URL",
    );
    refused(
        &run(&["keys", "clicks", "--server", &url, "--ca-cert", garbage]),
        "--ca-cert",
    );
    // A file far larger than any certificate bundle is refused unread.
    let huge = dir.path().join("huge.pem");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    refused(
        &run(&[
            "keys",
            "clicks",
            "--server",
            &url,
            "--ca-cert",
            huge.to_str().unwrap(),
        ]),
        "not a certificate file",
    );
    sigterm_and_wait(Serving {
        child,
        url,
        before_ready: Vec::new(),
    });
}

struct Serving {
    child: Child,
    url: String,
    /// What it logged before it was ready.
    before_ready: Vec<String>,
}

/// A test that fails before `sigterm_and_wait` must not leave its server running.
impl Drop for Serving {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn serve(data: &Path) -> Serving {
    serve_with(data, &[])
}

fn serve_with(data: &Path, args: &[&str]) -> Serving {
    serve_cmd(tally().env("TALLY_DATA", data), args)
}

/// `tally serve` on a free port from `cmd` (its environment set), with `args` after `serve`.
fn serve_cmd(cmd: &mut Command, args: &[&str]) -> Serving {
    let mut child = cmd
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut before_ready = Vec::new();
    let url = loop {
        let line = lines
            .next()
            .expect("serve exited before it was ready")
            .unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
        before_ready.push(line);
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Serving {
        child,
        url,
        before_ready,
    }
}

/// A backend URL's password, and a token given in the environment, are never printed: not
/// in a refusal, not by `--help` (found by reviews: a refused `rediss://` URL and clap's
/// `[env: …]` showed them).
#[test]
fn secrets_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = tally()
        .args(["serve", "--backend", "rediss://u:s3cret@h:1", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    refused(&out, "is not one this build knows");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("s3cret"));
    for (args, var, value) in [
        (
            vec!["serve", "--help"],
            "TALLY_BACKEND",
            "redis://u:s3cret@h:1/0",
        ),
        (vec!["keys", "--help"], "TALLY_TOKEN", "s3cret"),
        (vec!["load", "--help"], "TALLY_TOKEN", "s3cret"),
        (vec!["export", "--help"], "TALLY_TOKEN", "s3cret"),
        (vec!["compact", "--help"], "TALLY_TOKEN", "s3cret"),
    ] {
        let out = tally().args(&args).env(var, value).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains(var), "{args:?}: {said}");
        assert!(!said.contains("s3cret"), "{args:?}: {said}");
    }
}

/// A config file's `[namespaces]` that changes a stored schema says so at start (servers
/// sharing a Redis with different files rewrite each other's namespaces; found by a
/// black-box review, where nothing was logged); one that matches says nothing.
#[test]
fn a_config_that_changes_a_namespace_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = |tiers: &str| {
        let path = dir.path().join(format!("{}.toml", tiers.len()));
        std::fs::write(&path, format!("[namespaces.cfg]\ntiers = [{tiers}]\n")).unwrap();
        path
    };
    let (two, one) = (
        config(r#""1m:2d", "1h:forever""#),
        config(r#""1h:forever""#),
    );
    let said = |path: &Path| {
        let s = serve_with(&data, &["--config", path.to_str().unwrap()]);
        let lines = s.before_ready.join("\n");
        sigterm_and_wait(s);
        lines
    };
    let changed = "the config file's [namespaces] changed this namespace's schema";
    assert!(
        !said(&two).contains(changed),
        "a new namespace is no change"
    );
    assert!(
        !said(&two).contains(changed),
        "the same schema is no change"
    );
    let lines = said(&one);
    assert!(
        lines.contains(changed) && lines.contains("namespace=cfg") && lines.contains("1m:2d"),
        "{lines}"
    );
}

fn sigterm_and_wait(mut s: Serving) {
    let pid = s.child.id().to_string();
    assert!(
        // The shell's builtin kill: present wherever `sh` is, unlike a kill binary.
        Command::new("sh")
            .args(["-c", &format!("kill -TERM {pid}")])
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "serve exited with {status}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "serve did not exit within 10 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client(url: &str, args: &[&str]) -> Output {
    tally().args(args).args(["--server", url]).output().unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn serve_answers_the_client_and_stops_cleanly_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    let out = stdout(&client(
        &s.url,
        &[
            "incr",
            "clicks",
            "lnk/1",
            "--n",
            "3",
            "--dim",
            "country=US",
            "--window",
            "1h",
        ],
    ));
    assert!(out.starts_with("accepted 1\nlast 1h: 3 "), "{out}");
    let out = stdout(&client(&s.url, &["incr", "clicks", "lnk/1", "-n", "-1"]));
    assert_eq!(out, "accepted 1\n");
    // A limited increment: accepted while the window has room (exit 0), refused with exit 3
    // and the reason once it is full, counting nothing.
    let limited = ["incr", "api", "lim", "--window", "1h", "--max", "1"];
    assert!(stdout(&client(&s.url, &limited)).starts_with("accepted 1\nlast 1h: 1 "));
    let full = client(&s.url, &limited);
    assert_eq!(full.status.code(), Some(3), "{full:?}");
    let err = String::from_utf8_lossy(&full.stderr);
    assert!(
        err.contains("limit_exceeded: 1 of 1 in the last 1h"),
        "{err}"
    );
    // With --json, the refusal's JSON as the server sent it, on stdout (found by a review:
    // nothing was printed), and still exit 3 with the line on stderr.
    let full = client(&s.url, &[&limited[..], &["--json"]].concat());
    assert_eq!(full.status.code(), Some(3), "{full:?}");
    let refusal: serde_json::Value = serde_json::from_slice(&full.stdout).unwrap();
    assert_eq!(refusal["error"]["code"], "limit_exceeded", "{refusal}");
    assert_eq!(refusal["error"]["max"], 1, "{refusal}");
    assert!(String::from_utf8_lossy(&full.stderr).contains("limit_exceeded"));
    let no_window = client(&s.url, &["incr", "api", "lim", "--max", "1"]);
    assert_eq!(
        no_window.status.code(),
        Some(2),
        "clap refuses --max without --window"
    );
    let out = stdout(&client(
        &s.url,
        &[
            "query", "window", "clicks", "lnk/1", "--last", "1h", "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["n"], 2);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (from, to) = ((now - 7200).to_string(), (now + 60).to_string());
    let out = stdout(&client(
        &s.url,
        &[
            "query",
            "breakdown",
            "clicks",
            "lnk/1",
            "--dim",
            "country",
            "--from",
            &from,
            "--to",
            &to,
            "--unit",
            "hour",
        ],
    ));
    assert!(
        out.contains("US ")
            && out.contains("(unset)")
            && out.lines().last().unwrap().ends_with(" 2"),
        "{out}"
    );
    let out = stdout(&client(
        &s.url,
        &[
            "query", "top", "clicks", "--from", &from, "--to", &to, "--unit", "hour",
        ],
    ));
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("lnk/1 ") && l.ends_with(" 2")),
        "{out}"
    );
    let out = stdout(&client(
        &s.url,
        &[
            "query",
            "dashboard",
            "clicks",
            "lnk/1",
            "--from",
            &from,
            "--to",
            &to,
            "--unit",
            "hour",
            "--tz",
            "America/New_York",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["total"].as_i64(), v["tz"].as_str()),
        (Some(2), Some("America/New_York"))
    );
    assert_eq!(v["breakdowns"]["country"]["values"][0]["value"], "US");
    let out = stdout(&client(&s.url, &["keys", "clicks"]));
    assert_eq!(out, "lnk/1\n");
    // A running server compacts on request.
    let out = stdout(&client(&s.url, &["compact"]));
    assert!(
        out.starts_with("flushed ") && out.contains("\ncompacted: "),
        "{out}"
    );
    // A server-side refusal is one line and a non-zero exit.
    let bad = client(
        &s.url,
        &[
            "query",
            "series",
            "clicks",
            "lnk/1",
            "--from",
            &from,
            "--to",
            &to,
            "--unit",
            "fortnight",
        ],
    );
    refused(&bad, "invalid_unit");
    assert_eq!(String::from_utf8_lossy(&bad.stderr).lines().count(), 1);
    sigterm_and_wait(s);
    // Everything acknowledged is there after a restart.
    let s = serve(data.path());
    let out = stdout(&client(
        &s.url,
        &[
            "query", "series", "clicks", "lnk/1", "--from", &from, "--to", &to, "--unit", "hour",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 2);
    sigterm_and_wait(s);
    // No server: a clear error.
    refused(
        &client("http://127.0.0.1:9", &["keys", "clicks"]),
        "cannot reach the server",
    );
}

#[test]
fn serve_on_redis_two_servers_agree_and_a_restart_loses_nothing() {
    let redis = tally_redis::testing::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // No data directory is used: point it somewhere unusable to prove it.
    let unusable = dir.path().join("a-file");
    std::fs::write(&unusable, "x").unwrap();
    let start = || {
        serve_cmd(
            tally()
                .env("TALLY_BACKEND", redis.url())
                .env("TALLY_DATA", &unusable),
            &[],
        )
    };
    let (a, b) = (start(), start());
    for _ in 0..3 {
        stdout(&client(
            &a.url,
            &["incr", "clicks", "lnk/1", "--dim", "country=US"],
        ));
    }
    stdout(&client(
        &b.url,
        &["incr", "clicks", "lnk/1", "--dim", "country=FR"],
    ));
    let window = |url: &str| {
        let out = stdout(&client(
            url,
            &[
                "query", "window", "clicks", "lnk/1", "--last", "1h", "--json",
            ],
        ));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["n"].clone()
    };
    assert_eq!(window(&a.url), 4);
    assert_eq!(window(&b.url), 4);
    sigterm_and_wait(a);
    let c = start();
    assert_eq!(window(&c.url), 4);
    let keys = stdout(&client(&c.url, &["keys", "clicks"]));
    assert!(keys.contains("lnk/1"), "{keys}");
    sigterm_and_wait(b);
    sigterm_and_wait(c);
}

#[test]
fn a_closed_stdout_is_success() {
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    stdout(&client(&s.url, &["incr", "clicks", "k"]));
    // 5000 hourly points: far more than a pipe buffer, so writing must meet the closed end.
    let mut child = tally()
        .args([
            "query", "series", "clicks", "k", "--from", "0", "--to", "18000000", "--unit", "hour",
            "--server", &s.url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    sigterm_and_wait(s);
}

/// A data directory with three days of hourly events, written by the engine directly.
fn data_with_history(dir: &Path) {
    use tally_core::ingest::{Defaults, Limits, prepare};
    use tally_core::model::RawEvent;
    use tally_core::store::{Clock, Store, SystemClock};
    let engine = tally_engine::Engine::open(tally_engine::Config::new(dir)).unwrap();
    let now = SystemClock.now();
    let raws: Vec<RawEvent> = (0..72)
        .map(|h| RawEvent {
            ns: "clicks".into(),
            key: format!("k{}", h % 5),
            ts: Some(now - 4 * 86_400 + h * 3600),
            n: Some(2),
            dims: vec![("country".into(), "US".into())],
        })
        .collect();
    let batch = prepare(
        &engine,
        &raws,
        now,
        &Limits::default(),
        &Defaults::default(),
    )
    .unwrap();
    engine.apply(&batch).unwrap();
}

/// Flips a byte in the first block of one archive segment of `data`; answers its path.
fn damage_a_segment(data: &Path) -> std::path::PathBuf {
    let seg = std::fs::read_dir(data.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "tls"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[6] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
    seg
}

#[test]
fn compact_archives_history_and_check_names_damage() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    data_with_history(&data);
    let d = data.to_str().unwrap();

    let out = run(&["compact", "--data", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("flushed ") && !said.starts_with("flushed 0 "),
        "{said}"
    );
    assert!(said.contains("\ncompacted: "), "{said}");

    let out = run(&["check", "--data", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("MANIFEST-") && said.contains(".tls") && said.contains(".wal"),
        "{said}"
    );
    assert!(!said.contains("BAD"), "{said}");

    // A backup is a directory check finds whole.
    let copy = dir.path().join("copy");
    let out = run(&["backup", "--data", d, copy.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("backed up "));
    let out = run(&["check", "--data", copy.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    refused(
        &run(&["backup", "--data", d, copy.to_str().unwrap()]),
        "is not an empty directory",
    );
    // A backup cut short keeps its marker: check and every command that opens it refuse.
    let marker = copy.join("BACKUP-UNFINISHED");
    std::fs::write(&marker, b"").unwrap();
    refused(
        &run(&["check", "--data", copy.to_str().unwrap()]),
        "1 damaged or missing file(s)",
    );
    refused(
        &run(&["compact", "--data", copy.to_str().unwrap()]),
        "a backup that did not finish",
    );
    std::fs::remove_file(&marker).unwrap();
    let inside = data.join("backups").join("today");
    refused(
        &run(&["backup", "--data", d, inside.to_str().unwrap()]),
        "is inside the data directory",
    );
    assert!(!data.join("backups").exists());

    // Damage one block of one segment: check names it and fails.
    let seg = damage_a_segment(&data);
    let out = run(&["check", "--data", d]);
    refused(&out, "1 damaged or missing file(s)");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.lines().any(|l| l.starts_with("BAD")
            && l.contains(seg.to_str().unwrap())
            && l.contains("block")),
        "{said}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    // An offline export over it fails naming the file and block, not only "an archive
    // segment" (its causes were dropped).
    let now = tally_core::store::Clock::now(&tally_core::store::SystemClock);
    let (from, to) = ((now - 6 * 86_400).to_string(), now.to_string());
    let out = run(&[
        "export",
        "--data",
        d,
        "--ns",
        "clicks",
        "--from",
        &from,
        "--to",
        &to,
        "--resolution",
        "1h",
        "--format",
        "csv",
        "--out",
        dir.path().join("x").to_str().unwrap(),
    ]);
    refused(&out, seg.to_str().unwrap());
    refused(&out, "checksum mismatch in block");
    // A missing segment is named with its error said once (it was said twice: in the
    // message and again as its cause).
    std::fs::remove_file(&seg).unwrap();
    let out = run(&["check", "--data", d]);
    let said = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = said.lines().filter(|l| l.starts_with("BAD")).collect();
    assert!(
        bad.len() == 1 && bad[0].matches("No such file").count() == 1,
        "{said}"
    );

    // A directory in use by an engine is refused by compact.
    let _held =
        tally_engine::Engine::open(tally_engine::Config::new(dir.path().join("e"))).unwrap();
    refused(
        &run(&["compact", "--data", dir.path().join("e").to_str().unwrap()]),
        "in use by another tally process",
    );
    refused(
        &run(&["check", "--data", dir.path().join("nope").to_str().unwrap()]),
        "is not a tally data directory",
    );
}

#[test]
fn bench_loads_a_server_and_every_acknowledged_event_is_counted() {
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    // The human table: a header line, one row per operation of the mix, the events line.
    let out = stdout(&client(
        &s.url,
        &[
            "bench",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--batch",
            "50",
        ],
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("tally bench: 2 connections"), "{out}");
    assert!(
        lines[1].starts_with("op ")
            && lines[1].contains("p99.9 ms")
            && lines[1].ends_with("errors"),
        "{out}"
    );
    for op in ["ingest", "incr", "series", "breakdown", "top"] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{op} "))),
            "no {op} row: {out}"
        );
    }
    let table_events: u64 = lines
        .last()
        .unwrap()
        .strip_prefix("events acknowledged: ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no events line: {out}"));
    assert!(table_events > 0, "{out}");

    // --json, for scripts; an ingest-only mix.
    let out = stdout(&client(
        &s.url,
        &[
            "bench",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--mix",
            "ingest=1",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ingest = &v["ops"]["ingest"];
    assert_eq!(v["ops"].as_object().unwrap().len(), 1, "{out}");
    assert!(ingest["requests"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(
        ingest["ok"], ingest["requests"],
        "no errors expected: {out}"
    );
    assert_eq!(ingest["errors"], serde_json::json!({}));
    let lat = &ingest["latency_us"];
    assert!(
        lat["p50"].as_u64().unwrap() <= lat["p99"].as_u64().unwrap()
            && lat["p99"].as_u64().unwrap() <= lat["max"].as_u64().unwrap(),
        "{out}"
    );
    let json_events = v["events"].as_u64().unwrap();
    assert_eq!(json_events, ingest["requests"].as_u64().unwrap() * 100);

    // The server counted exactly what the bench saw acknowledged.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (from, to) = ((now - 7200).to_string(), (now + 3600).to_string());
    let out = stdout(&client(
        &s.url,
        &[
            "query", "top", "bench", "--from", &from, "--to", &to, "--unit", "hour", "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["total"].as_u64(),
        Some(table_events + json_events),
        "{out}"
    );

    // A namespace the run creates: its first reads do not race the first write to a 404
    // (found by a review: they did in 7 runs of 8).
    let out = stdout(&client(
        &s.url,
        &[
            "bench",
            "--duration",
            "1s",
            "--connections",
            "8",
            "--ns",
            "fresh",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for (op, o) in v["ops"].as_object().unwrap() {
        assert_eq!(o["errors"], serde_json::json!({}), "{op}: {out}");
    }

    // Silly values and a missing server are clear errors.
    refused(
        &client(&s.url, &["bench", "--connections", "100000"]),
        "--connections must be 1 to 1000",
    );
    refused(
        &client(&s.url, &["bench", "--duration", "1w"]),
        "--duration must be at most 1h",
    );
    // A run in which every request failed (a namespace that does not exist: 404) prints
    // its report and exits non-zero (found by a review: it exited 0).
    let o = client(
        &s.url,
        &[
            "bench",
            "--duration",
            "1s",
            "--mix",
            "window=1",
            "--ns",
            "nothing_here",
        ],
    );
    refused(&o, "no request succeeded");
    assert!(String::from_utf8_lossy(&o.stdout).contains("404"));
    sigterm_and_wait(s);
    refused(
        &client("http://127.0.0.1:9", &["bench", "--duration", "1s"]),
        "cannot reach the server",
    );
}

#[test]
fn a_bench_whose_every_write_is_refused_fails() {
    // Found by a review: writes all refused (403, 413), reads answered, exit 0.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tally.toml");
    std::fs::write(&config, "[limits]\nmax_batch_events = 3\n").unwrap();
    let s = serve_with(
        &dir.path().join("d"),
        &["--config", config.to_str().unwrap()],
    );
    stdout(&client(&s.url, &["incr", "bench", "k"]));
    let o = client(
        &s.url,
        &[
            "bench",
            "--duration",
            "1s",
            "--mix",
            "ingest=1,window=1",
            "--batch",
            "10",
        ],
    );
    refused(&o, "no ingest request succeeded");
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(
        report.contains("window "),
        "the report is printed: {report}"
    );
    sigterm_and_wait(s);
}

#[test]
fn client_urls_and_tokens_are_checked_before_anything_is_sent() {
    // Found by a review: each was reported as "cannot reach the server".
    for server in ["127.0.0.1:7070", "ftp://127.0.0.1", "http://", "https:///x"] {
        let o = client(server, &["keys", "clicks"]);
        assert_eq!(o.status.code(), Some(2), "{server}: {o:?}");
        refused(&o, "is not a server URL");
    }
    refused(
        &run(&["load", "x.csv", "--server", "localhost:7070"]),
        "is not a server URL",
    );
    for token in ["two\nlines", " leading", "trailing "] {
        let o = run(&["keys", "clicks", "--token", token]);
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        refused(&o, "printable ASCII");
    }
    let o = tally()
        .args(["keys", "clicks"])
        .env("TALLY_TOKEN", "tökén")
        .output()
        .unwrap();
    refused(&o, "printable ASCII");
    // https:// to a plain http server.
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    refused(
        &client(
            &s.url.replacen("http://", "https://", 1),
            &["keys", "clicks"],
        ),
        "use an http:// URL",
    );
    sigterm_and_wait(s);
}

#[test]
fn serve_refuses_a_log_with_a_missing_file_unless_told_to_accept_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    {
        use tally_core::ingest::{Defaults, Limits, prepare};
        use tally_core::model::RawEvent;
        use tally_core::store::{Clock, Store, SystemClock};
        let mut cfg = tally_engine::Config::new(&data);
        cfg.max_wal_file_bytes = 200;
        let engine = tally_engine::Engine::open(cfg).unwrap();
        let now = SystemClock.now();
        for i in 0..10 {
            let raw = RawEvent {
                ns: "clicks".into(),
                key: format!("k{i}"),
                ts: Some(now),
                n: Some(1),
                dims: Vec::new(),
            };
            let batch = prepare(
                &engine,
                &[raw],
                now,
                &Limits::default(),
                &Defaults::default(),
            );
            engine.apply(&batch.unwrap()).unwrap();
        }
    }
    let log = tally_engine::wal::list_files(&data.join("wal")).unwrap();
    assert!(log.len() >= 3, "{log:?}");
    std::fs::remove_file(&log[0].1).unwrap();
    let d = data.to_str().unwrap();
    let out = run(&["serve", "--data", d, "--listen", "127.0.0.1:0"]);
    refused(&out, &format!("records 1..={} are missing", log[1].0 - 1));
    refused(&out, "--accept-data-loss");
    // With the flag it starts with the events of the files left (batch i was record i + 1);
    // the loss is then behind it, and a plain start works again.
    let left = |url: &str| {
        let keys = stdout(&client(url, &["keys", "clicks"]));
        (0..10)
            .filter(|i| keys.lines().any(|l| l.trim() == format!("k{i}")))
            .collect::<Vec<u64>>()
    };
    let kept: Vec<u64> = (log[1].0 - 1..10).collect();
    let s = serve_with(&data, &["--accept-data-loss"]);
    assert_eq!(left(&s.url), kept);
    sigterm_and_wait(s);
    let s = serve(&data);
    assert_eq!(left(&s.url), kept);
    sigterm_and_wait(s);
}

/// The commands that read or maintain a data directory refuse a path that is not one, and
/// create nothing there (found by a review: `export` and `compact` made a fresh directory,
/// `check` of an empty one passed, and a failed `backup` left a partial copy behind; a later
/// one: `load` made one where a path was mistyped).
#[test]
fn data_commands_refuse_a_path_that_is_not_a_data_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("typo");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for dir in [&missing, &empty] {
        let d = dir.to_str().unwrap();
        let dest = tmp.path().join("copy");
        let out_dir = tmp.path().join("out");
        // A load and a rebuild (`load --replace --data`) too: a load makes a new directory
        // only with --create.
        let csv = tmp.path().join("r.csv");
        std::fs::write(&csv, "ns,key,ts,n\nclicks,k,10,1\n").unwrap();
        let range = ["--from", "0", "--to", "3600"];
        let runs: [Vec<&str>; 6] = [
            vec!["load", csv.to_str().unwrap(), "--data", d, "--quiet"],
            vec!["check", "--data", d],
            vec!["compact", "--data", d],
            [
                &[
                    "export",
                    "--ns",
                    "clicks",
                    "--resolution",
                    "1h",
                    "--data",
                    d,
                ][..],
                &range,
                &["--out", out_dir.to_str().unwrap()],
            ]
            .concat(),
            vec!["backup", dest.to_str().unwrap(), "--data", d],
            [
                &["load", csv.to_str().unwrap(), "--data", d, "--quiet"][..],
                &["--replace", "--ns", "clicks"],
                &range,
            ]
            .concat(),
        ];
        for args in runs {
            let o = run(&args);
            refused(&o, "is not a tally data directory");
            assert!(!dest.exists(), "{args:?} left a copy");
            assert!(!dir.join("wal").exists() && !dir.join("LOCK").exists());
        }
        // A bad TALLY_CA_CERT does not stop the commands that ask no server.
        let o = tally()
            .args(["check", "--data", d])
            .env("TALLY_CA_CERT", tmp.path().join("no-such.pem"))
            .output()
            .unwrap();
        refused(&o, "is not a tally data directory");
    }
    assert!(!missing.exists(), "a mistyped path was created");
}

/// `tally serve` on a free port over `data`, started by `sh` after `ulimit <limit>`, logging
/// at `info` to a piped stderr.
fn serve_under_ulimit(limit: &str, data: &std::path::Path) -> std::process::Child {
    let bin = env!("CARGO_BIN_EXE_tally");
    Command::new("sh")
        .args([
            "-c",
            &format!(
                "ulimit {limit} && exec '{bin}' serve --listen 127.0.0.1:0 --data '{}'",
                data.display()
            ),
        ])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// With its file descriptors exhausted, `tally serve` neither hangs nor stays silent: each
/// failed accept is counted, logged (at most once a second) and backed off, and the server
/// serves again once descriptors are free.
#[test]
fn serve_out_of_file_descriptors_logs_counts_and_recovers() {
    use std::io::{Read, Write};
    let data = tempfile::tempdir().unwrap();
    let mut child = serve_under_ulimit("-n 48", data.path());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve did not get ready");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Far more connections than descriptors: the server runs out.
    let held: Vec<_> = (0..80)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    let logged = (0..100).any(|_| {
        rx.recv_timeout(Duration::from_millis(100))
            .is_ok_and(|l| l.contains("accepting a connection failed"))
    });
    assert!(logged, "no log line about the failed accepts");
    drop(held);
    // Descriptors free again: the server answers, and counted what it refused.
    let metrics = (0..50)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            let mut c = std::net::TcpStream::connect(&addr).ok()?;
            c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .ok()?;
            let mut out = String::new();
            c.read_to_string(&mut out).ok()?;
            out.starts_with("HTTP/1.1 200").then_some(out)
        })
        .expect("the server did not recover once descriptors were free");
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tally_connections_refused_total{reason=\"accept_error\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused >= 1, "{metrics}");
    let _ = child.kill();
    let _ = child.wait();
}

/// A soft limit on open files below the hard one is raised to it: each archive segment holds
/// a descriptor, and a backfill over three years of days (1 100 segments) made every flush
/// fail under the common default of 1 024. The server logs the limit it runs with.
#[test]
fn serve_raises_the_soft_open_files_limit_to_the_hard_one() {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let hard: u64 = match limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
    {
        Some(h) if h > 300 => h,
        // Nothing to raise to on this machine.
        _ => return,
    };
    let data = tempfile::tempdir().unwrap();
    let mut child = serve_under_ulimit("-Sn 256", data.path());
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut logged = None;
    for line in stderr.lines().map_while(Result::ok) {
        if line.contains("open files allowed") {
            logged = Some(line.clone());
        }
        if line.contains("listening on") {
            break;
        }
    }
    let running = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let logged = logged.expect("the server logs its limit on open files");
    assert!(logged.contains(&format!("limit={hard}")), "{logged}");
    let soft: u64 = running
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(soft, hard, "{running}");
}

/// With tokens configured, one token's idempotency keys hold at most
/// `max_idempotency_keys_per_token` answers: a client that fills its share gets `503` for a
/// new key, and another token's new keys are still taken (a review filled the whole pool
/// from one client in ~100 s, refusing every other client's keys for a day). On the
/// embedded engine and on Redis, which held any number before.
#[test]
fn one_token_holds_at_most_its_share_of_idempotency_keys() {
    let redis = tally_redis::testing::RedisServer::start();
    for backend in [None, Some(redis.url())] {
        one_token_share(backend.as_deref());
    }
}

fn one_token_share(backend: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tally.toml");
    std::fs::write(
        &config,
        "[limits]\nmax_idempotency_keys_per_token = 2\n\n\
         [[tokens]]\ntoken = \"a\"\nscopes = [\"write:*\"]\n\n\
         [[tokens]]\ntoken = \"b\"\nscopes = [\"write:*\"]\n",
    )
    .unwrap();
    let mut args = vec!["--config", config.to_str().unwrap()];
    if let Some(url) = backend {
        args.extend(["--backend", url]);
    }
    let s = serve_with(&dir.path().join("d"), &args);
    let post = |token: &str, key: &str| {
        let resp = http_agent()
            .post(&format!("{}/v1/events", s.url.trim_end_matches('/')))
            .header("Authorization", &format!("Bearer {token}"))
            .header("Idempotency-Key", key)
            .send(r#"[{"ns": "clicks", "key": "k"}]"#)
            .unwrap();
        resp.status().as_u16()
    };
    assert_eq!(post("a", "1"), 200);
    assert_eq!(post("a", "2"), 200);
    assert_eq!(post("a", "3"), 503);
    assert_eq!(post("a", "1"), 200, "a key it holds is answered again");
    assert_eq!(post("b", "1"), 200);
}

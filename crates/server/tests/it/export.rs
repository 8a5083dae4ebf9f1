//! `GET /v1/ns/{ns}/export`: streaming CSV of one tier, checked against the query answers.

use std::time::Duration;

use serde_json::json;
use tally_server::Settings;

use crate::{NOW, Server, err};

fn seed(s: &Server) {
    let body = json!([
        {"ns": "clicks", "key": "lnk_1", "ts": NOW - 7200, "dims": {"country": "US", "referrer": "news, \"hn\""}},
        {"ns": "clicks", "key": "lnk_1", "ts": NOW - 3600, "n": 2, "dims": {"country": "DE"}},
        {"ns": "clicks", "key": "a,b", "ts": NOW - 3590, "n": 5},
        {"ns": "clicks", "key": "a,b", "ts": NOW - 3500, "n": -5},
        {"ns": "clicks", "key": "zero", "ts": NOW - 60, "n": 0},
    ]);
    assert_eq!(
        s.post("/v1/events", &body.to_string()),
        (200, json!({"accepted": 5}))
    );
}

#[test]
fn an_export_holds_every_total_and_subtotal_of_the_tier() {
    let s = Server::start(Settings::default());
    seed(&s);
    let (from, to) = (NOW - 86_400, NOW);
    let (st, csv) = s.raw(
        "GET",
        &format!("/v1/ns/clicks/export?from={from}&to={to}&resolution=1h"),
        None,
        &[],
    );
    assert_eq!(st, 200, "{csv}");
    let (h1, h2) = (NOW - 7200, NOW - 3600);
    // Keys in byte order; a key's totals, then its subtotals by dimension and value; zero
    // counts (a,b's +5 −5 hour; zero's 0) are left out; commas and quotes are quoted.
    assert_eq!(
        csv,
        format!(
            "ns,key,ts,resolution,dim,value,n\n\
             clicks,lnk_1,{h1},1h,,,1\n\
             clicks,lnk_1,{h2},1h,,,2\n\
             clicks,lnk_1,{h2},1h,country,DE,2\n\
             clicks,lnk_1,{h1},1h,country,US,1\n\
             clicks,lnk_1,{h1},1h,referrer,\"news, \"\"hn\"\"\",1\n"
        )
    );
    // The minute tier keeps no subtotals; the range is widened to whole buckets.
    let (st, csv) = s.raw(
        "GET",
        &format!(
            "/v1/ns/clicks/export?from={}&to={}&resolution=1m",
            NOW - 7199,
            NOW - 3599
        ),
        None,
        &[],
    );
    assert_eq!(st, 200);
    assert_eq!(
        csv,
        format!(
            "ns,key,ts,resolution,dim,value,n\n\
             clicks,\"a,b\",{},1m,,,5\n\
             clicks,lnk_1,{},1m,,,1\n\
             clicks,lnk_1,{},1m,,,2\n",
            NOW - 3600,
            NOW - 7200,
            NOW - 3600
        )
    );
    // `from == to` gives no rows, also inside a bucket that has some (SPEC §2).
    for at in [NOW - 3600, NOW - 3599] {
        let (st, csv) = s.raw(
            "GET",
            &format!("/v1/ns/clicks/export?from={at}&to={at}&resolution=1h"),
            None,
            &[],
        );
        assert_eq!(
            (st, csv.as_str()),
            (200, "ns,key,ts,resolution,dim,value,n\n")
        );
    }
    // Sums agree with the series answer.
    let (_, series) = s.get(&format!(
        "/v1/ns/clicks/keys/lnk_1/series?from={from}&to={to}&unit=day"
    ));
    assert_eq!(series["total"], 3);
}

#[test]
fn many_keys_come_page_by_page_in_order() {
    let s = Server::start(Settings::default());
    let n = tally_core::query::EXPORT_PAGE_KEYS * 2 + 7;
    let body: Vec<_> = (0..n)
        .map(|i| json!({"ns": "big", "key": format!("k{i:05}"), "ts": NOW - 100, "n": i + 1}))
        .collect();
    assert_eq!(s.post("/v1/events", &json!(body).to_string()).0, 200);
    let (st, csv) = s.raw(
        "GET",
        &format!(
            "/v1/ns/big/export?from={}&to={NOW}&resolution=1h",
            NOW - 3600
        ),
        None,
        &[],
    );
    assert_eq!(st, 200);
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), n);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(*r, format!("big,k{i:05},{},1h,,,{}", NOW - 3600, i + 1));
    }
}

#[test]
fn bad_exports_are_refused_before_the_answer_starts() {
    let s = Server::start(Settings::default());
    seed(&s);
    let q = |rest: &str| s.get(&format!("/v1/ns/clicks/export?{rest}"));
    let (from, to) = (NOW - 3600, NOW);
    err(
        s.get(&format!(
            "/v1/ns/nope/export?from={from}&to={to}&resolution=1h"
        )),
        404,
        "unknown_namespace",
    );
    let e = err(
        q(&format!("from={from}&to={to}&resolution=15m")),
        400,
        "invalid_parameter",
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("1m, 1h"),
        "{e}"
    );
    err(
        q(&format!("to={to}&resolution=1h")),
        400,
        "missing_parameter",
    );
    err(
        q(&format!("from={from}&to={to}&resolution=1h&tz=UTC")),
        400,
        "invalid_parameter",
    );
    err(
        q(&format!("from={to}&to={from}&resolution=1h")),
        400,
        "invalid_range",
    );
    // A year of minutes is more than max_points buckets per key.
    err(
        q(&format!("from={}&to={to}&resolution=1m", to - 366 * 86_400)),
        422,
        "too_many_points",
    );
    // Minutes are kept 2 days: three days of them would silently start a day late.
    let e = err(
        q(&format!("from={}&to={to}&resolution=1m", to - 3 * 86_400)),
        422,
        "no_tier_for_range",
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("kept for 2d"),
        "{e}"
    );
    let (st, _) = q(&format!("from={}&to={to}&resolution=1m", to - 86_400));
    assert_eq!(st, 200);
}

/// A read that fails before the export found any row (a damaged segment) is answered as any
/// query's failure is, with its code; the first cut sent nothing at all (an empty reply).
#[test]
fn an_export_failing_before_its_first_row_answers_with_the_error() {
    let s = Server::start(Settings::default());
    seed(&s);
    s.store
        .fail_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let path = format!(
        "/v1/ns/clicks/export?from={}&to={NOW}&resolution=1h",
        NOW - 86_400
    );
    let got = err(s.get(&path), 500, "corrupt_data");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a test's damage"),
        "{got}"
    );
    // The same export answers whole once reads work again.
    s.store
        .fail_reads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let (st, csv) = s.raw("GET", &path, None, &[]);
    assert_eq!(st, 200, "{csv}");
    assert_eq!(csv.lines().count(), 6, "{csv}");
}

#[test]
fn an_export_needs_a_read_token() {
    let s = Server::with_config(
        r#"
[[tokens]]
token = "w"
scopes = ["write:*"]

[[tokens]]
token = "r"
scopes = ["read:clicks"]
"#,
    );
    let body = json!([{"ns": "clicks", "key": "k", "ts": NOW - 10}]).to_string();
    let auth = |t: &str| format!("Bearer {t}");
    assert_eq!(
        s.req(
            "POST",
            "/v1/events",
            Some(&body),
            &[("Authorization", &auth("w"))]
        )
        .0,
        200
    );
    let path = format!(
        "/v1/ns/clicks/export?from={}&to={NOW}&resolution=1h",
        NOW - 3600
    );
    err(s.get(&path), 401, "unauthorized");
    err(
        s.req("GET", &path, None, &[("Authorization", &auth("w"))]),
        403,
        "forbidden",
    );
    let (st, csv) = s.raw("GET", &path, None, &[("Authorization", &auth("r"))]);
    assert_eq!((st, csv.lines().count()), (200, 2), "{csv}");
}

/// An export whose client stops reading holds its export permit only until
/// `body_timeout_ms` passes, then ends; meanwhile another is refused with 503. (250 000 rows,
/// ~8 MB: more than the loopback's socket buffers hold, so the export really stalls. The
/// engine only: loading that many events into Redis would take minutes.)
#[test]
fn a_stalled_export_is_cut_off_and_frees_its_permit() {
    use std::io::{Read, Write};
    if !crate::embedded() {
        return;
    }
    let s = Server::with_config(
        "[limits]\nmax_concurrent_queries = 1\nbody_timeout_ms = 300\nmax_batch_events = 125000\nmax_body_bytes = 33554432",
    );
    for part in 0..2 {
        let body: String = (0..125_000)
            .map(|i| {
                format!(
                    "{{\"ns\":\"big\",\"key\":\"k{part}{i:06}\",\"ts\":{}}}\n",
                    NOW - 100
                )
            })
            .collect();
        let (st, _) = s.req(
            "POST",
            "/v1/events",
            Some(&body),
            &[("Content-Type", "application/x-ndjson")],
        );
        assert_eq!(st, 200);
    }
    let path = format!(
        "/v1/ns/big/export?from={}&to={NOW}&resolution=1h",
        NOW - 3600
    );
    let addr = s.url("").trim_start_matches("http://").to_owned();
    let mut stalled = std::net::TcpStream::connect(&addr).unwrap();
    write!(stalled, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = [0u8; 64];
    stalled.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    // Busy: the one permit is the stalled export's.
    let (st, busy) = s.raw("GET", &path, None, &[]);
    assert_eq!(st, 503, "{}", &busy[..busy.len().min(200)]);
    assert!(busy.contains("exports are streaming already"), "{busy}");
    // Cut off after ~300 ms of nothing taken: the next export runs, whole.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (st, csv) = s.raw("GET", &path, None, &[]);
        if st == 200 {
            assert_eq!(csv.lines().count(), 250_001);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stalled export kept its permit"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(stalled);
}

/// Writes 2 560 keys of namespace `big` (ten pages of an export) and makes listing each page
/// take `slow`; answers an export of a range before the data, which holds no rows.
fn pages_without_rows(s: &Server, slow: Duration) -> String {
    let body: String = (0..2560)
        .map(|i| {
            format!(
                "{{\"ns\":\"big\",\"key\":\"k{i:05}\",\"ts\":{}}}\n",
                NOW - 100
            )
        })
        .collect();
    let ndjson = [("Content-Type", "application/x-ndjson")];
    assert_eq!(s.req("POST", "/v1/events", Some(&body), &ndjson).0, 200);
    *s.store.slow_keys.lock().unwrap() = slow;
    format!(
        "/v1/ns/big/export?from={}&to={}&resolution=1h",
        NOW - 10 * 3600,
        NOW - 5 * 3600
    )
}

/// An export whose range holds no rows sends nothing until it ends: a client that leaves
/// meanwhile must stop its scan at once (it holds an export permit and a blocking thread,
/// and would hold up a shutdown), not at a chunk it never reaches.
#[test]
fn an_export_with_no_rows_stops_when_its_client_leaves() {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    let s = Server::with_config("[limits]\nmax_concurrent_queries = 1");
    let path = pages_without_rows(&s, Duration::from_millis(200));
    let addr = s.url("").trim_start_matches("http://").to_owned();
    let mut client = std::net::TcpStream::connect(&addr).unwrap();
    write!(client, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(client);
    std::thread::sleep(Duration::from_millis(500));
    let listed = s.store.keys_calls.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        s.store.keys_calls.load(Ordering::SeqCst),
        listed,
        "the export went on listing keys after its client left"
    );
    assert!(listed < 10, "{listed}");
    // Its permit is free: the next export is answered.
    *s.store.slow_keys.lock().unwrap() = Duration::ZERO;
    let (st, csv) = s.raw("GET", &path, None, &[]);
    assert_eq!(st, 200, "{csv}");
    assert_eq!(csv, "ns,key,ts,resolution,dim,value,n\n");
}

/// An export answers (its head, 200) once its first page of keys is read, even if that page
/// holds no row: the handler waits for it holding one of the `max_concurrent_queries`
/// permits, so it must not hold it for a whole scan of pages without rows (found by a
/// review: a handler waiting for the first row held up every query meanwhile).
#[test]
fn an_export_without_rows_yet_holds_no_query_permit_past_its_first_page() {
    use std::sync::atomic::Ordering;
    let s = Server::with_config("[limits]\nmax_concurrent_queries = 1");
    let path = pages_without_rows(&s, Duration::from_millis(300));
    std::thread::scope(|scope| {
        let export = scope.spawn(|| s.raw("GET", &path, None, &[]));
        while s.store.keys_calls.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(10));
        }
        // A query while the export still scans: answered, not queued behind it.
        let (st, v) = s.get(&format!(
            "/v1/ns/big/keys/k00001/series?from={}&to={NOW}&unit=hour",
            NOW - 3600
        ));
        assert_eq!(st, 200, "{v}");
        let listed = s.store.keys_calls.load(Ordering::SeqCst);
        assert!(
            listed < 10,
            "the query waited for the export's scan ({listed} pages)"
        );
        let (st, csv) = export.join().unwrap();
        assert_eq!(
            (st, csv.as_str()),
            (200, "ns,key,ts,resolution,dim,value,n\n")
        );
    });
}

/// An export whose first page outlasts `query_timeout_ms` inside one store call (a page
/// checks its deadline only between calls) is `503 query_timeout` once that time is up; and
/// one whose scan panics is `500 internal`, its connection free. Found by a review: the
/// handler waited for the page however long it took, and a panic left the answer open for
/// good (a watcher held the body's sender).
#[test]
fn an_export_s_first_page_is_bounded_and_a_panic_ends_it() {
    let s = Server::with_config("[limits]\nquery_timeout_ms = 300");
    seed(&s);
    let path = format!(
        "/v1/ns/clicks/export?from={}&to={NOW}&resolution=1h",
        NOW - 86_400
    );
    *s.store.slow_keys.lock().unwrap() = Duration::from_secs(3);
    let started = std::time::Instant::now();
    err(s.get(&path), 503, "query_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered after {:?}",
        started.elapsed()
    );
    // (A server of its own: on a loaded machine the scan may take 300 ms before it panics.)
    let s = Server::start(Settings::default());
    seed(&s);
    s.store
        .panic_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    err(s.get(&path), 500, "internal");
    s.store
        .panic_reads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let (st, csv) = s.raw("GET", &path, None, &[]);
    assert_eq!(st, 200, "{csv}");
}

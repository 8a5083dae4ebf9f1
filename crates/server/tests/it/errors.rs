//! Every 400/401/403/404/409/413/422 code of SPEC §3: the bad request, its status and
//! `error.code`, and proof that nothing was applied (the whole visible state is unchanged).

use serde_json::json;
use tally_server::Settings;

use crate::{NOW, Server, err};

const CONFIG: &str = r#"
[namespaces.strict]
tiers = ["1h:forever"]
dimensions = ["country"]

[namespaces.short]
tiers = ["1m:1h"]

[namespaces.pairs]
tiers = ["1h:forever"]
dimensions = ["a", "b", "a+b"]

[limits]
max_body_bytes = 4096
max_batch_events = 3
max_points = 50
"#;

fn server() -> Server {
    let s = Server::with_config(CONFIG);
    let seed = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60, "dims": {"country": "US"}}]);
    assert_eq!(s.post("/v1/events", &seed.to_string()).0, 200);
    s
}

fn event(fields: serde_json::Value) -> String {
    let mut e = json!({"ns": "clicks", "key": "k", "ts": NOW - 60});
    for (k, v) in fields.as_object().unwrap() {
        e[k] = v.clone();
    }
    json!([{"ns": "clicks", "key": "ok", "ts": NOW - 60}, e]).to_string()
}

#[test]
fn bad_events_are_refused_whole_and_name_their_index() {
    let s = server();
    let before = s.state();
    // Each with the field `error.field` names (the event's, beside its `index`).
    let cases: Vec<(String, u16, &str, Option<&str>)> = vec![
        ("not json".into(), 400, "malformed_body", None),
        (
            json!({"ns": "clicks"}).to_string(),
            400,
            "malformed_body",
            None,
        ),
        (
            event(json!({"colour": "red"})),
            400,
            "malformed_body",
            Some("colour"),
        ),
        (event(json!({"key": 5})), 400, "malformed_body", Some("key")),
        (
            event(json!({"ns": "Bad!"})),
            400,
            "invalid_name",
            Some("ns"),
        ),
        (event(json!({"key": ""})), 400, "invalid_key", Some("key")),
        (
            event(json!({"dims": {"Country": "US"}})),
            400,
            "invalid_dimension",
            Some("dims"),
        ),
        (
            event(json!({"dims": {"country": 5}})),
            400,
            "invalid_dimension",
            Some("dims"),
        ),
        (
            event(json!({"dims": {"country": null}})),
            400,
            "invalid_dimension",
            Some("dims"),
        ),
        (
            event(json!({"ns": "strict", "dims": {"device": "ios"}})),
            400,
            "unknown_dimension",
            Some("dims"),
        ),
        // Each part a valid value, their compound's value one byte too long.
        (
            event(json!({"ns": "pairs", "dims": {"a": "x".repeat(1024), "b": "y".repeat(1024)}})),
            400,
            "invalid_dimension",
            Some("dims"),
        ),
        (
            event(
                json!({"dims": (0..17).map(|i| (format!("d{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
            ),
            400,
            "too_many_dimensions",
            Some("dims"),
        ),
        (
            event(json!({"ts": "yesterday"})),
            400,
            "invalid_timestamp",
            Some("ts"),
        ),
        (
            event(json!({"ts": 1.5})),
            400,
            "invalid_timestamp",
            Some("ts"),
        ),
        (
            event(json!({"ts": 99_999_999_999i64})),
            400,
            "invalid_timestamp",
            Some("ts"),
        ),
        (
            event(json!({"ts": NOW + 7200})),
            400,
            "timestamp_in_future",
            Some("ts"),
        ),
        (event(json!({"n": 1.5})), 400, "invalid_amount", Some("n")),
        (
            event(json!({"n": 9007199254740992i64})),
            400,
            "invalid_amount",
            Some("n"),
        ),
        (event(json!({"n": "3"})), 400, "invalid_amount", Some("n")),
    ];
    for (body, status, code, field) in cases {
        let v = err(s.post("/v1/events", &body), status, code);
        if body.starts_with("[{") {
            assert_eq!(v["error"]["index"], 1, "{body}: {v}");
        }
        assert_eq!(v["error"]["field"].as_str(), field, "{body}: {v}");
        assert_eq!(s.state(), before, "{code} changed something");
    }
    // NDJSON counts the index among non-blank lines.
    let nd = format!(
        "{{\"ns\":\"clicks\",\"key\":\"a\",\"ts\":{}}}\n\n{{\"ns\":\"clicks\"}}\n",
        NOW
    );
    let v = err(
        s.req(
            "POST",
            "/v1/events",
            Some(&nd),
            &[("Content-Type", "application/x-ndjson")],
        ),
        400,
        "malformed_body",
    );
    assert_eq!(v["error"]["index"], 1);
    assert_eq!(s.state(), before);
}

#[test]
fn bad_incr_parameters() {
    let s = server();
    let before = s.state();
    // Each names its parameter where one is at fault, as a batch's refusal names its event
    // (found by a review: `n=2^53` and a future `ts` answered "event 0: …" with `index: 0`).
    let seventeen: String = (0..17)
        .map(|i| format!("dim.d{i}=v"))
        .collect::<Vec<_>>()
        .join("&");
    for (q, code, field) in [
        ("n=1.5", "invalid_amount", Some("n")),
        ("n=9007199254740992", "invalid_amount", Some("n")),
        ("ts=later", "invalid_timestamp", Some("ts")),
        ("ts=4000000000", "timestamp_in_future", Some("ts")),
        ("window=0s", "invalid_duration", Some("window")),
        ("window=5y", "invalid_duration", Some("window")),
        ("dim.Bad=x", "invalid_dimension", Some("dim.Bad")),
        ("dim.=x", "invalid_dimension", Some("dim.")),
        ("dim.country=%01", "invalid_dimension", Some("dim.country")),
        ("colour=red", "invalid_parameter", Some("colour")),
        ("n=1&n=2", "invalid_parameter", Some("n")),
        (seventeen.as_str(), "too_many_dimensions", Some("dim")),
    ] {
        let got = s.post(&format!("/v1/ns/clicks/keys/k/incr?{q}"), "");
        let e = &err(got, 400, code)["error"];
        assert_eq!(e["field"].as_str(), field, "{q}: {e}");
        assert!(e.get("index").is_none(), "{q}: {e}");
        assert!(
            !e["message"].as_str().unwrap().contains("event 0"),
            "{q}: {e}"
        );
        assert_eq!(s.state(), before, "{q}");
    }
    // `short` keeps one hour of minutes: a 2h window has no tier. The increment is not applied.
    err(
        s.post("/v1/ns/short/keys/k/incr?window=2h", ""),
        422,
        "no_tier_for_range",
    );
    assert_eq!(
        s.state(),
        before,
        "a refused window must not leave the increment behind"
    );
}

#[test]
fn bad_query_parameters() {
    let s = server();
    let before = s.state();
    let r = format!("from={}&to={}", NOW - 86_400, NOW);
    for (path, status, code) in [
        (
            format!("/v1/ns/clicks/keys/k/series?{r}"),
            400,
            "missing_parameter",
        ),
        (
            format!("/v1/ns/clicks/keys/k/series?{r}&unit=hour&form=1"),
            400,
            "invalid_parameter",
        ),
        (
            format!("/v1/ns/clicks/keys/k/series?{r}&unit=hour&tz=Mars/Base"),
            400,
            "invalid_timezone",
        ),
        (
            format!("/v1/ns/clicks/keys/k/series?{r}&unit=fortnight"),
            400,
            "invalid_unit",
        ),
        (
            format!("/v1/ns/clicks/keys/k/series?{r}&unit=hour&every=7"),
            400,
            "invalid_unit",
        ),
        // A sign is no digit (a review found `%2B6` and `+5` taken).
        (
            format!("/v1/ns/clicks/keys/k/series?{r}&unit=hour&every=%2B6"),
            400,
            "invalid_unit",
        ),
        (
            format!("/v1/ns/clicks/keys/k/breakdown?{r}&dim=country&limit=%2B5"),
            400,
            "invalid_limit",
        ),
        (
            format!(
                "/v1/ns/clicks/keys/k/series?from={NOW}&to={}&unit=hour",
                NOW - 60
            ),
            400,
            "invalid_range",
        ),
        (
            format!("/v1/ns/clicks/keys/k/series?from=noon&to={NOW}&unit=hour"),
            400,
            "invalid_timestamp",
        ),
        (
            format!("/v1/ns/Clicks/keys/k/series?{r}&unit=hour"),
            400,
            "invalid_name",
        ),
        (
            format!("/v1/ns/clicks/keys/k/breakdown?{r}&dim=Country"),
            400,
            "invalid_dimension",
        ),
        (
            format!("/v1/ns/strict/keys/k/breakdown?{r}&dim=device"),
            400,
            "unknown_dimension",
        ),
        (
            format!("/v1/ns/clicks/keys/k/breakdown?{r}&dim=country&limit=0"),
            400,
            "invalid_limit",
        ),
        (
            "/v1/ns/clicks/keys/k/window?last=soon".to_owned(),
            400,
            "invalid_duration",
        ),
        (
            "/v1/ns/clicks/keys?limit=10001".to_owned(),
            400,
            "invalid_limit",
        ),
        (
            format!("/v1/ns/nope/keys/k/series?{r}&unit=hour"),
            404,
            "unknown_namespace",
        ),
        ("/v1/ns/nope".to_owned(), 404, "unknown_namespace"),
        ("/v1/nothing/here".to_owned(), 404, "not_found"),
        (
            format!(
                "/v1/ns/clicks/keys/k/series?from={}&to={NOW}&unit=day&tz=Asia/Kolkata",
                NOW - 5 * 86_400
            ),
            422,
            "no_tier_for_range",
        ),
        (
            format!("/v1/ns/clicks/keys/k/series?{r}&unit=minute"),
            422,
            "too_many_points",
        ),
    ] {
        err(s.get(&path), status, code);
        assert_eq!(s.state(), before);
    }
    let kolkata = err(
        s.get(&format!(
            "/v1/ns/strict/keys/k/series?{r}&unit=day&tz=Asia/Kolkata"
        )),
        422,
        "no_tier_for_range",
    );
    assert_eq!(
        kolkata["error"]["message"],
        "namespace strict keeps hourly data; Asia/Kolkata day boundaries fall 30 minutes past the hour — add a 30m or finer tier"
    );
}

/// A range may end where time ends (2106-02-07T00:00:00Z): an answer whose unit ceils its
/// end there says so, and that end reads back. A fraction past it, or an event at it, is
/// refused (a black-box review found the answer's own `to` refused).
#[test]
fn a_range_may_end_where_time_ends() {
    let s = server();
    let series = |to: &str| {
        s.get(&format!(
            "/v1/ns/clicks/keys/k/series?from=2106-02-06T00:00:00Z&to={to}&unit=hour"
        ))
    };
    let (status, ceiled) = series("2106-02-06T23:30:00Z");
    assert_eq!(status, 200, "{ceiled}");
    assert_eq!(ceiled["to_t"], "2106-02-07T00:00:00+00:00");
    let (status, back) = series(ceiled["to"].as_i64().unwrap().to_string().as_str());
    assert_eq!((status, &back), (200, &ceiled));
    assert_eq!(back["points"].as_array().map(Vec::len), Some(24));
    let (status, empty) = s.get(
        "/v1/ns/clicks/keys/k/breakdown?from=2106-02-07T00:00:00Z&to=2106-02-07T00:00:00Z&dim=country",
    );
    assert_eq!((status, &empty["total"]), (200, &json!(0)), "{empty}");
    let before = s.state();
    let past = err(series("2106-02-07T00:00:00.5Z"), 400, "invalid_timestamp");
    assert_eq!(past["error"]["field"], "to");
    let at_end = err(
        s.post("/v1/events", &event(json!({"ts": 4_294_944_000i64}))),
        400,
        "invalid_timestamp",
    );
    assert_eq!(at_end["error"]["field"], "ts");
    assert_eq!(s.state(), before);
}

#[test]
fn bad_schemas() {
    let s = server();
    let before = s.state();
    // Each with the part of the schema `error.field` names.
    for (body, code, field) in [
        (
            json!({"tiers": ["7m:1h"]}).to_string(),
            "invalid_schema",
            Some("tiers"),
        ),
        (json!({"tiers": []}).to_string(), "invalid_schema", Some("tiers")),
        (
            json!({"tiers": ["1h:forever", "60m:2d"]}).to_string(),
            "invalid_schema",
            Some("tiers"),
        ),
        (
            json!({"tiers": ["1h:forever"], "breakdown_tiers": ["1m"]}).to_string(),
            "invalid_schema",
            Some("breakdown_tiers"),
        ),
        (
            json!({"tiers": ["1h:forever"], "breakdown_tiers": ["1x"]}).to_string(),
            "invalid_schema",
            Some("breakdown_tiers"),
        ),
        (
            json!({"tiers": ["1h:forever"], "dimensions": ["a", "a"]}).to_string(),
            "invalid_schema",
            Some("dimensions"),
        ),
        (
            json!({"tiers": ["1h:forever"], "dimensions": ["Bad"]}).to_string(),
            "invalid_schema",
            Some("dimensions"),
        ),
        // Past the bounds on a schema's size: 257 names, 17 compounds, 17 tiers.
        (
            json!({"tiers": ["1h:forever"], "dimensions": (0..257).map(|i| format!("d{i}")).collect::<Vec<_>>()}).to_string(),
            "invalid_schema",
            Some("dimensions"),
        ),
        (
            json!({"tiers": ["1h:forever"], "dimensions": (0..17).map(|i| format!("a+b{i}")).collect::<Vec<_>>()}).to_string(),
            "invalid_schema",
            Some("dimensions"),
        ),
        (
            json!({"tiers": (0..17).map(|i| format!("{}s:1d", [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60, 120, 180, 240, 300, 600][i])).collect::<Vec<_>>()}).to_string(),
            "invalid_schema",
            Some("tiers"),
        ),
        (
            json!({"tiers": ["1h:forever"], "extra": 1}).to_string(),
            "malformed_body",
            None,
        ),
        ("{".to_owned(), "malformed_body", None),
    ] {
        let e = err(s.req("PUT", "/v1/ns/clicks", Some(&body), &[]), 400, code);
        assert_eq!(e["error"]["field"].as_str(), field, "{body}: {e}");
        assert_eq!(s.state(), before, "{body}");
    }
    err(
        s.req(
            "PUT",
            "/v1/ns/Bad",
            Some(&json!({"tiers": ["1h:forever"]}).to_string()),
            &[],
        ),
        400,
        "invalid_name",
    );
    assert_eq!(s.state(), before);
}

#[test]
fn limits_give_413() {
    let s = server();
    let before = s.state();
    let big = format!(
        "[{}]",
        vec![json!({"ns": "clicks", "key": "x".repeat(200)}).to_string(); 30].join(",")
    );
    assert!(big.len() > 4096);
    err(s.post("/v1/events", &big), 413, "body_too_large");
    // A GET is held to the same bound: admission reads any /v1 request's body.
    let answer = raw_http(
        s.addr,
        &format!(
            "GET /v1/ns/clicks/keys HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{big}",
            big.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"body_too_large\""), "{answer}");
    // Megabytes past the limit, declared or chunked: the client, still sending, reads the
    // 413 (what is left is read and thrown away) instead of a reset connection, which
    // `tally load` took for an unreachable server (found by a review).
    let huge = format!(
        "[{}]",
        vec![json!({"ns": "clicks", "key": "x".repeat(200)}).to_string(); 15_000].join(",")
    );
    assert!(huge.len() > 3_000_000);
    for _ in 0..3 {
        err(s.post("/v1/events", &huge), 413, "body_too_large");
    }
    let mut chunked = String::from(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    for piece in huge.as_bytes().chunks(65_536) {
        chunked.push_str(&format!("{:x}\r\n", piece.len()));
        chunked.push_str(std::str::from_utf8(piece).unwrap());
        chunked.push_str("\r\n");
    }
    chunked.push_str("0\r\n\r\n");
    let answer = raw_http(s.addr, &chunked);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A client waiting for `100 Continue` before it sends is answered 413 at once (reading
    // its body would ask it to send 100 MB first).
    let answer = raw_http(
        s.addr,
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Expect: 100-continue\r\nContent-Length: 104857600\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let four = json!([{"ns": "clicks", "key": "a"}, {"ns": "clicks", "key": "b"}, {"ns": "clicks", "key": "c"}, {"ns": "clicks", "key": "d"}]);
    err(
        s.post("/v1/events", &four.to_string()),
        413,
        "batch_too_large",
    );
    let nd = "{\"ns\":\"clicks\",\"key\":\"a\"}\n".repeat(4);
    err(
        s.req(
            "POST",
            "/v1/events",
            Some(&nd),
            &[("Content-Type", "application/x-ndjson")],
        ),
        413,
        "batch_too_large",
    );
    assert_eq!(s.state(), before);
    let q = json!({"queries": vec![json!({"kind": "keys", "ns": "clicks"}); 1001]});
    let s2 = Server::start(Settings::default());
    err(s2.post("/v1/query", &q.to_string()), 413, "batch_too_large");
    err(s2.post("/v1/query", "[]"), 400, "malformed_body");
}

#[test]
fn unknown_namespace_when_auto_create_is_off() {
    let s = Server::with_config("[defaults]\nauto_create = false");
    let before = s.state();
    let v = err(
        s.post(
            "/v1/events",
            &json!([{"ns": "clicks", "key": "k"}]).to_string(),
        ),
        404,
        "unknown_namespace",
    );
    assert_eq!(v["error"]["index"], 0);
    err(
        s.post("/v1/ns/clicks/keys/k/incr", ""),
        404,
        "unknown_namespace",
    );
    assert_eq!(s.state(), before);
}

#[test]
fn tokens_give_401_and_403() {
    let s = Server::with_config(
        r#"
[[tokens]]
token = "writer"
scopes = ["write:clicks", "read:clicks"]

[[tokens]]
token = "admin"
scopes = ["admin:*", "read:*", "write:*"]
"#,
    );
    let w = [("Authorization", "Bearer writer")];
    let a = [("Authorization", "Bearer admin")];
    let e = json!([{"ns": "clicks", "key": "k", "ts": NOW - 10}]).to_string();
    assert_eq!(s.req("POST", "/v1/events", Some(&e), &w).0, 200);
    assert_eq!(
        s.req(
            "PUT",
            "/v1/ns/other",
            Some(&json!({"tiers": ["1h:forever"]}).to_string()),
            &a
        )
        .0,
        200
    );
    let state = |s: &Server| s.req("GET", "/v1/ns/clicks/keys", None, &a).1;
    let before = state(&s);
    err(s.post("/v1/events", &e), 401, "unauthorized");
    // RFC 9110 §11.6.1: a 401 names the scheme it wants (found by a review: it did not).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    for token in [None, Some("Bearer nobody")] {
        let mut req = agent.get(s.url("/v1/ns/clicks/keys"));
        if let Some(t) = token {
            req = req.header("Authorization", t);
        }
        let resp = req.call().unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        assert_eq!(
            resp.headers().get("www-authenticate").map(|v| v.as_bytes()),
            Some(&b"Bearer"[..])
        );
    }
    err(
        s.req(
            "POST",
            "/v1/events",
            Some(&e),
            &[("Authorization", "Bearer nope")],
        ),
        401,
        "unauthorized",
    );
    err(
        s.req("GET", "/v1/ns/clicks/keys", None, &[]),
        401,
        "unauthorized",
    );
    let other = json!([{"ns": "clicks", "key": "k2"}, {"ns": "other", "key": "k"}]).to_string();
    let v = err(
        s.req("POST", "/v1/events", Some(&other), &w),
        403,
        "forbidden",
    );
    assert_eq!(v["error"]["index"], 1);
    err(
        s.req("POST", "/v1/ns/other/keys/k/incr", None, &w),
        403,
        "forbidden",
    );
    err(
        s.req("GET", "/v1/ns/other/keys", None, &w),
        403,
        "forbidden",
    );
    err(
        s.req(
            "PUT",
            "/v1/ns/clicks",
            Some(&json!({"tiers": ["1h:forever"]}).to_string()),
            &w,
        ),
        403,
        "forbidden",
    );
    // Compacting the archive is for admin:* alone.
    err(
        s.req("POST", "/v1/admin/compact", None, &w),
        403,
        "forbidden",
    );
    err(
        s.req("POST", "/v1/admin/compact", None, &[]),
        401,
        "unauthorized",
    );
    assert_eq!(state(&s), before);
    let (st, report) = s.req("POST", "/v1/admin/compact", None, &a);
    assert_eq!(st, 200, "{report}");
    assert!(
        report["flushed_segments"].is_u64() && report["dropped"].is_u64(),
        "{report}"
    );
    assert_eq!(state(&s), before);
    // GET /v1/ns lists only readable namespaces; each batch entry is authorised on its own.
    let listed = s.req("GET", "/v1/ns", None, &w).1;
    assert_eq!(
        listed["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["clicks"]
    );
    let q = json!({"queries": [{"kind": "keys", "ns": "clicks"}, {"kind": "keys", "ns": "other"}]})
        .to_string();
    let (st, r) = s.req("POST", "/v1/query", Some(&q), &w);
    assert_eq!(st, 200);
    assert_eq!(r["results"][0]["keys"], json!(["k"]));
    assert_eq!(r["results"][1]["error"]["code"], "forbidden");
    // Operational routes need no token.
    assert_eq!(s.get("/healthz").0, 200);
    // Without a known token a request is 401 whole, before anything else is looked at:
    // a malformed body, a bad parameter or a whole POST /v1/query (no per-entry answers).
    for bearer in [None, Some("Bearer nope")] {
        let h: Vec<(&str, &str)> = bearer.map(|b| ("Authorization", b)).into_iter().collect();
        err(
            s.req("POST", "/v1/events", Some("{not json"), &h),
            401,
            "unauthorized",
        );
        err(
            s.req("POST", "/v1/query", Some(&q), &h),
            401,
            "unauthorized",
        );
        err(
            s.req("POST", "/v1/query", Some("[]"), &h),
            401,
            "unauthorized",
        );
        err(
            s.req("GET", "/v1/ns/Bad!/keys/k/series?from=x", None, &h),
            401,
            "unauthorized",
        );
        err(
            s.req("PUT", "/v1/ns/clicks", Some("{"), &h),
            401,
            "unauthorized",
        );
    }
    assert_eq!(state(&s), before);
}

/// The line of `/metrics` that gives metric `name` (unlabelled).
fn metric(s: &Server, name: &str) -> String {
    let (_, text) = s.raw("GET", "/metrics", None, &[]);
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in /metrics"))
        .to_owned()
}

#[test]
fn a_failed_disk_gives_503_and_unhealthy() {
    if !crate::embedded() {
        // The disk faults are the embedded engine's; Redis faults are tally-redis' tests.
        return;
    }
    let faults = std::sync::Arc::new(tally_engine::io::Faults::default());
    let s = Server::with_faults(faults.clone());
    let e = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    assert_eq!(s.post("/v1/events", &e).0, 200);
    let before = s.state();
    let healthy = |s: &Server| metric(s, "tally_backend_healthy");
    assert_eq!(healthy(&s), "tally_backend_healthy 1");
    faults
        .fail_syncs
        .store(true, std::sync::atomic::Ordering::SeqCst);
    err(s.post("/v1/events", &e), 503, "backend_unavailable");
    faults
        .fail_syncs
        .store(false, std::sync::atomic::Ordering::SeqCst);
    // Poisoned: still refused after the disk recovers, and /healthz says so.
    err(
        s.post("/v1/ns/clicks/keys/k/incr", ""),
        503,
        "backend_unavailable",
    );
    err(s.get("/healthz"), 503, "backend_unavailable");
    // A dry run answers what the write would get.
    err(
        s.post("/v1/events?dry_run=true", &e),
        503,
        "backend_unavailable",
    );
    // Each such 503 says when to try again, as admission's own do.
    let answer = raw_http(
        s.addr,
        "POST /v1/ns/clicks/keys/k/incr HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 1\r\n"),
        "{answer}"
    );
    // ... and so does a metric an alert can watch.
    assert_eq!(healthy(&s), "tally_backend_healthy 0");
    assert_eq!(s.state(), before, "nothing unacknowledged became visible");
}

/// A full disk is not a failed disk: writes are refused (`503`, nothing applied) while it
/// lasts, `/healthz` stays healthy (reads are served), the refusals are counted, and the
/// same server takes writes again once space is freed.
#[test]
fn a_full_disk_refuses_writes_until_space_is_freed() {
    if !crate::embedded() {
        return;
    }
    let faults = std::sync::Arc::new(tally_engine::io::Faults::default());
    let s = Server::with_faults(faults.clone());
    let e = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    assert_eq!(s.post("/v1/events", &e).0, 200);
    let before = s.state();
    faults
        .full_disk_at
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let refused = err(s.post("/v1/events", &e), 503, "backend_unavailable");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("the disk is full"), "{message}");
    err(
        s.post("/v1/ns/clicks/keys/k/incr", ""),
        503,
        "backend_unavailable",
    );
    assert_eq!(s.state(), before, "nothing refused was applied");
    assert_eq!(s.get("/healthz").0, 200);
    assert_eq!(
        metric(&s, "tally_backend_healthy"),
        "tally_backend_healthy 1"
    );
    assert_eq!(
        metric(&s, "tally_log_full_disk_refusals_total"),
        "tally_log_full_disk_refusals_total 2"
    );
    // Space freed: the same server goes on.
    faults
        .full_disk_at
        .store(0, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(s.post("/v1/events", &e).0, 200);
    assert_eq!(s.post("/v1/ns/clicks/keys/k/incr", "").0, 200);
    let (status, body) = s.get(&format!(
        "/v1/ns/clicks/keys/k/series?from={}&to={}&unit=hour",
        NOW - 7200,
        NOW + 3600
    ));
    assert_eq!(status, 200, "{body}");
    let sum: i64 = body["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["n"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, 3, "{body}");
}

#[test]
fn errors_axum_answers_itself_are_json_too() {
    let s = server();
    let before = s.state();
    err(
        s.req("PUT", "/v1/events", Some("[]"), &[]),
        405,
        "method_not_allowed",
    );
    // Any method a route does not take, TRACE included, is 405 with Allow; an unknown path
    // is 404 whatever the method.
    for (method, path, status, allow) in [
        ("TRACE", "/v1/events", 405, Some("POST")),
        ("DELETE", "/v1/ns/clicks", 405, Some("GET,HEAD,PUT")),
        ("PATCH", "/healthz", 405, Some("GET,HEAD")),
        ("TRACE", "/nowhere", 404, None),
        // The dashboard's static routes are no exception.
        ("POST", "/", 405, Some("GET,HEAD")),
        ("DELETE", "/ui/app.js", 405, Some("GET,HEAD")),
        ("GET", "/ui/", 404, None),
    ] {
        let answer = raw_http(
            s.addr,
            &format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        );
        let head = answer
            .split("\r\n\r\n")
            .next()
            .unwrap()
            .to_ascii_lowercase();
        assert!(
            head.starts_with(&format!("http/1.1 {status}")),
            "{method} {path}: {answer}"
        );
        assert!(head.contains("content-type: application/json"), "{answer}");
        match allow {
            Some(a) => assert!(
                head.contains(&format!("allow: {}", a.to_ascii_lowercase())),
                "{answer}"
            ),
            None => assert!(!head.contains("allow:"), "{answer}"),
        }
    }
    let (st, raw) = s.raw(
        "GET",
        "/v1/ns/clicks/keys/%FF/series?from=1&to=2&unit=day",
        None,
        &[],
    );
    assert_eq!(st, 400);
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["error"]["code"], "invalid_key", "{v}");
    assert_eq!(s.state(), before);
}

/// Sends `request` as it is and reads the whole answer (the request asks to close).
pub fn raw_http(addr: std::net::SocketAddr, request: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Draining a refused body is bounded: a declared length past four times the limit (and
/// 64 MiB) is answered at once, and a body that stops coming is answered when
/// `body_timeout_ms` runs out, neither waiting for bytes that may never come.
#[test]
fn draining_a_refused_body_is_bounded() {
    let s = Server::with_config("[limits]\nmax_body_bytes = 4096\nbody_timeout_ms = 2000");
    let head = |len: u64| {
        format!(
            "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n"
        )
    };
    for (len, at_once) in [(10_000_000_000, true), (5_000, false)] {
        let t = std::time::Instant::now();
        let answer = raw_http(s.addr, &head(len));
        assert!(answer.starts_with("HTTP/1.1 413"), "{len}: {answer}");
        let took = t.elapsed().as_millis();
        match at_once {
            true => assert!(took < 1_000, "{len}: answered after {took} ms"),
            false => assert!(
                (1_900..4_500).contains(&took),
                "{len}: answered after {took} ms"
            ),
        }
    }
}

/// The cheap attack on the parsers, through the API: megabytes of the smallest entries
/// JSON has. Counted, not built, and refused with the count (these bodies are parsed on
/// the blocking pool); nothing changes.
#[test]
fn megabytes_of_tiny_entries_are_counted_and_refused() {
    let s = Server::start(tally_server::Settings::default());
    let before = s.state();
    let zeros = format!("[{}]", vec!["0"; 1_000_000].join(","));
    let got = err(s.post("/v1/events", &zeros), 413, "batch_too_large");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("got 1000000"),
        "{got}"
    );
    let queries = format!(r#"{{"queries": [{}]}}"#, vec!["{}"; 1_000_000].join(","));
    let got = err(s.post("/v1/query", &queries), 413, "batch_too_large");
    assert_eq!(got["error"]["message"], "at most 1000 queries, got 1000000");
    assert_eq!(s.state(), before);
}

/// Found by a review: a `Content-Encoding` was ignored, so `br` on plain JSON was accepted
/// and a real gzip body was "not JSON". No coding is taken: any but `identity` is refused by
/// name, and nothing is applied.
#[test]
fn a_content_encoding_is_refused_by_name() {
    let s = server();
    let before = s.state();
    let e = json!([{"ns": "clicks", "key": "k", "ts": NOW - 10}]).to_string();
    for coding in ["gzip", "br", "identity, gzip"] {
        let got = s.req(
            "POST",
            "/v1/events",
            Some(&e),
            &[("Content-Encoding", coding)],
        );
        let v = err(got, 400, "malformed_body");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Content-Encoding"),
            "{v}"
        );
        assert_eq!(s.state(), before, "{coding}");
    }
    let got = s.req(
        "POST",
        "/v1/events",
        Some(&e),
        &[("Content-Encoding", "identity")],
    );
    assert_eq!(got.0, 200, "{}", got.1);
    // Only the API's routes: a probe's stray header does not fail a health check.
    let got = s.req("GET", "/healthz", None, &[("Content-Encoding", "gzip")]);
    assert_eq!(got.0, 200, "{}", got.1);
    // A transfer coding under `chunked` too (it was answered "not JSON"); `chunked` alone
    // is how a body of unknown length comes.
    let chunked = |coding: &str| {
        format!(
            "POST /v1/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: {coding}\r\n\r\n\
             {:x}\r\n{e}\r\n0\r\n\r\n",
            e.len()
        )
    };
    let before = s.state();
    for coding in ["gzip, chunked", "deflate,chunked"] {
        let answer = raw_http(s.addr, &chunked(coding));
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("\"malformed_body\""), "{answer}");
        assert!(answer.contains("Transfer-Encoding"), "{answer}");
        assert_eq!(s.state(), before, "{coding}");
    }
    let answer = raw_http(s.addr, &chunked("chunked"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Found by a review: a path's malformed escape was read as text (`%G1` the same key as
/// `%25G1`), where a query string's was refused.
#[test]
fn a_malformed_escape_in_a_path_is_refused() {
    let s = server();
    let before = s.state();
    for path in [
        "/v1/ns/clicks/keys/%G1/incr",
        "/v1/ns/clicks/keys/k%2/incr",
        "/v1/ns/clicks/keys/k%/incr",
    ] {
        err(s.post(path, ""), 400, "invalid_parameter");
    }
    err(
        s.get("/v1/ns/clicks/keys/%G1/series?from=0&to=3600"),
        400,
        "invalid_parameter",
    );
    assert_eq!(s.state(), before);
    assert_eq!(s.post("/v1/ns/clicks/keys/%25G1/incr", "").0, 200);
}

/// Refusals say what is wrong in the case at hand (a review found these misleading): a
/// compound asked of a namespace with no allow-list, a timestamp written as a float.
#[test]
fn refusals_say_what_is_wrong() {
    let s = server();
    let r = format!("from={}&to={NOW}", NOW - 3600);
    let message = |got: (u16, serde_json::Value), status, code| {
        err(got, status, code)["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let m = message(
        s.get(&format!("/v1/ns/clicks/keys/k/breakdown?{r}&dim=a%2Bb")),
        400,
        "unknown_dimension",
    );
    assert!(
        m.contains("is a compound") && m.contains("no allow-list"),
        "{m}"
    );
    let m = message(
        s.get(&format!(
            "/v1/ns/strict/keys/k/breakdown?{r}&dim=country%2Bdevice"
        )),
        400,
        "unknown_dimension",
    );
    assert!(m.contains("not in the namespace's allow-list"), "{m}");
    for (ts, says) in [
        ("1e26", "is out of range"),
        ("1e9", "must be written as an integer"),
        ("1.5", "is not whole unix seconds"),
    ] {
        let body = format!(r#"[{{"ns": "clicks", "key": "k", "ts": {ts}}}]"#);
        let m = message(s.post("/v1/events", &body), 400, "invalid_timestamp");
        assert!(m.contains(says), "{ts}: {m}");
    }
}

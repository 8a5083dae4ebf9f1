//! Every route and answer shape of SPEC §3.

use serde_json::{Value, json};
use tally_server::Settings;

use crate::{NOW, Server, err};

fn keys_of(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

fn seed(s: &Server) {
    let body = json!([
        {"ns": "clicks", "key": "lnk_1", "ts": NOW - 7200, "dims": {"country": "US", "referrer": "hn"}},
        {"ns": "clicks", "key": "lnk_1", "ts": NOW - 3600, "n": 2, "dims": {"country": "DE"}},
        {"ns": "clicks", "key": "lnk_2", "ts": "2026-11-20T11:30:00Z", "n": 5},
    ]);
    assert_eq!(
        s.post("/v1/events", &body.to_string()),
        (200, json!({"accepted": 3}))
    );
}

#[test]
fn events_then_series_breakdown_dashboard_top_keys() {
    let s = Server::start(Settings::default());
    seed(&s);
    let from = NOW - 86_400;
    let (st, a) = s.get(&format!(
        "/v1/ns/clicks/keys/lnk_1/series?from={from}&to={NOW}&unit=hour&every=6&tz=America/New_York"
    ));
    assert_eq!(st, 200);
    assert_eq!(
        keys_of(&a),
        [
            "ns",
            "key",
            "unit",
            "every",
            "tz",
            "resolution",
            "dim",
            "value",
            "from",
            "from_t",
            "to",
            "to_t",
            "total",
            "points"
        ]
    );
    assert_eq!(
        (
            a["total"].as_i64(),
            a["resolution"].as_str(),
            a["every"].as_i64()
        ),
        (Some(3), Some("1h"), Some(6))
    );
    assert_eq!(keys_of(&a["points"][0]), ["ts", "t", "n"]);
    assert!(a["from_t"].as_str().unwrap().ends_with("-05:00"));

    let (st, b) = s.get(&format!(
        "/v1/ns/clicks/keys/lnk_1/breakdown?dim=country&from={from}&to={NOW}&unit=hour"
    ));
    assert_eq!(st, 200);
    assert_eq!(
        keys_of(&b),
        [
            "ns",
            "key",
            "dim",
            "resolution",
            "from",
            "from_t",
            "to",
            "to_t",
            "total",
            "values",
            "other",
            "unset"
        ]
    );
    assert_eq!(
        b["values"],
        json!([{"value": "DE", "n": 2}, {"value": "US", "n": 1}])
    );

    let (st, d) = s.get(&format!(
        "/v1/ns/clicks/keys/lnk_1/dashboard?from={from}&to={NOW}&unit=day"
    ));
    assert_eq!(st, 200);
    assert!(d.get("timeline").is_some() && d.get("points").is_none());
    assert_eq!(
        d["breakdowns"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["country", "referrer"]
    );
    assert_eq!(d["breakdowns"]["referrer"]["unset"], 2);

    let (st, t) = s.get(&format!("/v1/ns/clicks/top?from={from}&to={NOW}&unit=hour"));
    assert_eq!(st, 200);
    assert_eq!(
        keys_of(&t),
        [
            "ns",
            "dim",
            "value",
            "resolution",
            "from",
            "from_t",
            "to",
            "to_t",
            "total",
            "keys",
            "other"
        ]
    );
    assert_eq!(
        t["keys"],
        json!([{"key": "lnk_2", "n": 5}, {"key": "lnk_1", "n": 3}])
    );

    let (st, k) = s.get("/v1/ns/clicks/keys?limit=1");
    assert_eq!(
        (st, k),
        (
            200,
            json!({"ns": "clicks", "keys": ["lnk_1"], "next": "lnk_1"})
        )
    );
    assert_eq!(
        s.get("/v1/ns/clicks/keys?after=lnk_1").1,
        json!({"ns": "clicks", "keys": ["lnk_2"], "next": null})
    );
}

#[test]
fn ndjson_incr_and_window() {
    let s = Server::start(Settings::default());
    let nd = format!(
        "{{\"ns\":\"api\",\"key\":\"k1\",\"ts\":{}}}\n\n{{\"ns\":\"api\",\"key\":\"k1\",\"n\":4}}\n",
        NOW - 30
    );
    let (st, v) = s.req(
        "POST",
        "/v1/events",
        Some(&nd),
        &[("Content-Type", "application/x-ndjson")],
    );
    assert_eq!((st, v), (200, json!({"accepted": 2})));
    assert_eq!(
        s.post("/v1/ns/api/keys/k1/incr?n=3&dim.status=200", "").1,
        json!({"accepted": 1})
    );
    let (st, v) = s.post("/v1/ns/api/keys/k1/incr?window=1h", "");
    assert_eq!(st, 200);
    assert_eq!(v["window"]["n"], 9);
    assert_eq!(v["window"]["last"], "1h");
    let (st, w) = s.get("/v1/ns/api/keys/k1/window?last=1h");
    assert_eq!(st, 200);
    assert_eq!(
        keys_of(&w),
        ["ns", "key", "last", "resolution", "from", "from_t", "n"]
    );
    assert_eq!(
        (w["n"].as_i64(), w["resolution"].as_str()),
        (Some(9), Some("1m"))
    );
    // `last` is echoed as spelled (SPEC §3's example: `"last": "24h"`), not as `1d`; so is
    // incr's `window`, limited or not, and a window entry of `POST /v1/query`.
    let (_, w) = s.get("/v1/ns/api/keys/k1/window?last=24h");
    assert_eq!(
        (w["last"].as_str(), w["n"].as_i64()),
        (Some("24h"), Some(9))
    );
    let (_, v) = s.post("/v1/ns/api/keys/k1/incr?window=3600s", "");
    assert_eq!(v["window"]["last"], "3600s");
    let (st, v) = s.post("/v1/ns/api/keys/k1/incr?window=60m&max=100", "");
    assert_eq!(
        (st, v["window"]["last"].as_str()),
        (200, Some("60m")),
        "{v}"
    );
    let (st, v) = s.post("/v1/ns/api/keys/k1/incr?window=60m&max=1", "");
    assert_eq!(
        (st, v["error"]["window"]["last"].as_str()),
        (429, Some("60m")),
        "{v}"
    );
    let q = json!({"queries": [{"kind": "window", "ns": "api", "key": "k1", "last": "24h"}]});
    let (_, v) = s.post("/v1/query", &q.to_string());
    assert_eq!(v["results"][0]["last"], "24h", "{v}");
    // A key with a slash, through a percent-encoded path segment.
    assert_eq!(s.post("/v1/ns/api/keys/a%2Fb/incr", "").0, 200);
    assert_eq!(s.get("/v1/ns/api/keys?prefix=a").1["keys"], json!(["a/b"]));
    // A key never written answers zeros, not 404.
    let (st, z) = s.get(&format!(
        "/v1/ns/api/keys/nobody/series?from={}&to={NOW}&unit=hour",
        NOW - 7200
    ));
    assert_eq!((st, z["total"].as_i64()), (200, Some(0)));
}

/// Found by an independent review: a `+` in a query string is a space (form encoding), so
/// an offset as the answers' `_t` fields write it (`+05:30`), or the `+` of `Etc/GMT+5`,
/// pasted into a URL was refused. A space is read back as the `+` it was, in `from`/`to`
/// (series and export), `tz` and `incr`'s `ts`; `%2B` works as before.
#[test]
fn a_plus_in_a_timestamp_or_zone_of_a_query_string_is_a_plus() {
    let s = Server::start(Settings::default());
    seed(&s);
    let series = |from: &str, tz: &str| {
        let (st, v) = s.get(&format!(
            "/v1/ns/clicks/keys/lnk_1/series?from={from}&to={NOW}&unit=hour&tz={tz}"
        ));
        assert_eq!(st, 200, "{from} {tz}: {v}");
        (v["from"].clone(), v["total"].clone(), v["tz"].clone())
    };
    // NOW is 2026-11-20T12:00:00Z: three hours before, in India and in UTC-5.
    let want = series(&(NOW - 3 * 3600).to_string(), "UTC");
    assert_eq!(want.1, 3);
    assert_eq!(series("2026-11-20T14:30:00+05:30", "UTC").0, want.0);
    assert_eq!(series("2026-11-20T14:30:00%2B05:30", "UTC").0, want.0);
    let gmt5 = series(&(NOW - 3 * 3600).to_string(), "Etc/GMT+5");
    assert_eq!((gmt5.1, gmt5.2), (json!(3), json!("Etc/GMT+5")));
    let (st, v) = s.post(
        "/v1/ns/clicks/keys/lnk_3/incr?ts=2026-11-20T17:29:00+05:30",
        "",
    );
    assert_eq!(st, 200, "{v}");
    let (st, csv) = s.raw(
        "GET",
        "/v1/ns/clicks/export?from=2026-11-20T16:30:00+05:30&to=2026-11-20T17:30:00+05:30&resolution=1h",
        None,
        &[],
    );
    assert_eq!(st, 200, "{csv}");
    assert!(csv.contains("\nclicks,lnk_3,1795172400,1h,,,1\n"), "{csv}");
    // A space that is no `+` (the repair leaves it invalid) is quoted as it was sent, not
    // as the repair made it (found by a review: `"2026-11-20+00:00:00Z"`).
    for (query, quoted) in [
        (
            "from=2026-11-20%2000:00:00Z&to=2026-11-21T00:00:00Z",
            "\"2026-11-20 00:00:00Z\"",
        ),
        (
            "from=2026-11-20T00:00:00Z&to=2026-11-21T00:00:00Z&tz=New%20York",
            "New York",
        ),
    ] {
        let (st, v) = s.get(&format!(
            "/v1/ns/clicks/keys/lnk_1/series?{query}&unit=hour"
        ));
        let said = v["error"]["message"].as_str().unwrap_or_default();
        assert!(st == 400 && said.contains(quoted), "{query}: {st} {v}");
    }
}

#[test]
fn batch_queries_succeed_or_fail_each_on_their_own() {
    let s = Server::start(Settings::default());
    seed(&s);
    let body = json!({"queries": [
        {"kind": "series", "ns": "clicks", "key": "lnk_1", "from": NOW - 86_400, "to": NOW, "unit": "day"},
        {"kind": "window", "ns": "clicks", "key": "lnk_1", "last": "nonsense"},
        {"kind": "keys", "ns": "clicks"},
        {"kind": "fly", "ns": "clicks"},
    ]});
    let (st, v) = s.post("/v1/query", &body.to_string());
    assert_eq!(st, 200);
    let r = v["results"].as_array().unwrap();
    assert_eq!(r.len(), 4);
    assert_eq!(r[0]["total"], 3);
    assert_eq!(r[1]["error"]["code"], "invalid_duration");
    assert_eq!(r[2]["keys"], json!(["lnk_1", "lnk_2"]));
    assert_eq!(r[3]["error"]["code"], "invalid_parameter");
    // The same parameters over GET give the same answer.
    let (_, g) = s.get(&format!(
        "/v1/ns/clicks/keys/lnk_1/series?from={}&to={NOW}&unit=day",
        NOW - 86_400
    ));
    assert_eq!(g, r[0]);
    // A parameter given as null, as answers print one not given (`"dim": null`), is not
    // given: an answer's fields sent back as a query ask the same question (a review
    // found it refused).
    let mut again = r[0].clone();
    again["kind"] = json!("series");
    for answer_only in ["total", "points", "from_t", "to_t", "resolution"] {
        again.as_object_mut().unwrap().remove(answer_only);
    }
    assert_eq!(
        (again["dim"].clone(), again["value"].clone()),
        (json!(null), json!(null))
    );
    let (st, v) = s.post("/v1/query", &json!({"queries": [again]}).to_string());
    assert_eq!((st, &v["results"][0]), (200, &r[0]), "{v}");
}

#[test]
fn namespaces_get_put_list() {
    let s = Server::start(Settings::default());
    let schema = json!({"tiers": ["60m:forever", "1m:48h"], "breakdown_tiers": ["1h"], "dimensions": ["status", "status+outcome"]});
    let (st, v) = s.req("PUT", "/v1/ns/api_hits", Some(&schema.to_string()), &[]);
    assert_eq!(st, 200);
    assert_eq!(
        v,
        json!({"name": "api_hits", "tiers": ["1m:2d", "1h:forever"], "breakdown_tiers": ["1h"], "dimensions": ["status", "status+outcome"]})
    );
    assert_eq!(s.get("/v1/ns/api_hits"), (200, v.clone()));
    assert_eq!(s.get("/v1/ns"), (200, json!({"namespaces": [v]})));
    // Auto-created namespaces take [defaults].
    s.post("/v1/ns/fresh/keys/k/incr", "");
    assert_eq!(
        s.get("/v1/ns/fresh").1["tiers"],
        json!(["1m:2d", "1h:forever"])
    );
}

#[test]
fn config_namespaces_and_allow_lists() {
    let s = Server::with_config(
        r#"
[namespaces.api_hits]
tiers = ["1s:2h", "1m:48h", "1h:forever"]
breakdown_tiers = ["1m", "1h"]
dimensions = ["status", "outcome", "status+outcome"]
"#,
    );
    assert_eq!(
        s.get("/v1/ns/api_hits").1["tiers"],
        json!(["1s:2h", "1m:2d", "1h:forever"])
    );
    let e = json!([{"ns": "api_hits", "key": "k", "ts": NOW - 5, "dims": {"status": "429", "outcome": "deny"}}]);
    assert_eq!(s.post("/v1/events", &e.to_string()).0, 200);
    let (st, b) = s.get(&format!(
        "/v1/ns/api_hits/keys/k/breakdown?dim=status%2Boutcome&from={}&to={}",
        NOW - 60,
        NOW
    ));
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["values"], json!([{"value": "429|deny", "n": 1}]));
    let (st, w) = s.get("/v1/ns/api_hits/keys/k/window?last=60s");
    assert_eq!(
        (st, w["resolution"].as_str(), w["n"].as_i64()),
        (200, Some("1s"), Some(1))
    );
}

#[test]
fn health_metrics_openapi() {
    let s = Server::start(Settings::default());
    seed(&s);
    s.get(&format!(
        "/v1/ns/clicks/keys/lnk_1/series?from={}&to={NOW}&unit=hour",
        NOW - 3600
    ));
    assert_eq!(s.get("/healthz"), (200, json!({"status": "ok"})));
    let (st, m) = s.raw("GET", "/metrics", None, &[]);
    assert_eq!(st, 200);
    let mut needles = vec![
        "tally_events_accepted_total 3",
        "tally_batches_accepted_total 1",
        "tally_query_duration_seconds_count{kind=\"series\"} 1",
        "tally_http_responses_total{status=\"200\"}",
        "tally_backend_healthy 1",
    ];
    // Each backend's own figures.
    if crate::embedded() {
        needles.extend([
            "tally_live_counters ",
            "tally_counter_bytes ",
            "tally_catalog_bytes ",
            "tally_dictionary_cache_bytes ",
            "tally_log_bytes_written_total ",
            "tally_log_fsync_seconds_total ",
        ]);
    } else {
        needles.push("tally_redis_used_memory_bytes ");
    }
    for needle in needles {
        assert!(m.contains(needle), "missing {needle:?} in:\n{m}");
    }
    // The seeded hours closed before NOW: the harness flushed them into the archive.
    let segments: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("tally_archive_segments "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    if crate::embedded() {
        assert!(segments >= 1.0, "no archive segment in:\n{m}");
    }
    let (st, doc) = s.get("/openapi.json");
    assert_eq!(st, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/events", "post"),
        ("/v1/ns/{ns}/keys/{key}/incr", "post"),
        ("/v1/ns/{ns}/keys/{key}/series", "get"),
        ("/v1/ns/{ns}/keys/{key}/breakdown", "get"),
        ("/v1/ns/{ns}/keys/{key}/window", "get"),
        ("/v1/ns/{ns}/keys/{key}/dashboard", "get"),
        ("/v1/ns/{ns}/top", "get"),
        ("/v1/ns/{ns}/keys", "get"),
        ("/v1/ns/{ns}/export", "get"),
        ("/v1/query", "post"),
        ("/v1/ns", "get"),
        ("/v1/ns/{ns}", "get"),
        ("/v1/ns/{ns}", "put"),
        ("/healthz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/v1/admin/compact", "post"),
        ("/v1/ns/{ns}/rebuild", "post"),
        ("/", "get"),
        ("/ui/app.js", "get"),
        ("/ui/style.css", "get"),
    ] {
        let op = paths.get(path).and_then(|p| p.get(method));
        assert!(
            op.is_some(),
            "{method} {path} missing from the OpenAPI document"
        );
        // Every refusal is documented, with the one error shape.
        let responses = &op.unwrap()["responses"];
        let mut statuses = vec!["503"];
        if path.starts_with("/v1/") {
            // 408 and 413: a body is read (and bounded) whatever the method.
            statuses.extend(["400", "401", "403", "404", "408", "413", "422"]);
        }
        for status in statuses {
            assert_eq!(
                responses[status]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/Error",
                "{method} {path} {status}"
            );
        }
        assert_eq!(
            responses["503"]["headers"]["Retry-After"]["schema"]["type"], "integer",
            "{method} {path}: a 503 says when to try again"
        );
    }
    // Parameters carry the server's own rules.
    let param = |path: &str, method: &str, name: &str| {
        paths[path][method]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["schema"]
            .clone()
    };
    let limit = param("/v1/ns/{ns}/top", "get", "limit");
    assert_eq!(
        (limit["minimum"].as_i64(), limit["maximum"].as_i64()),
        (Some(1), Some(10_000))
    );
    let ns = param("/v1/ns/{ns}/keys/{key}/series", "get", "ns");
    assert_eq!(ns["pattern"], "^[a-z0-9][a-z0-9_.-]{0,63}$");
    let unit = param("/v1/ns/{ns}/keys/{key}/series", "get", "unit");
    assert_eq!(unit["enum"].as_array().unwrap().len(), 9);
    assert!(param("/v1/ns/{ns}/keys/{key}/window", "get", "last")["pattern"].is_string());
    // A schema's dimensions are in a JSON body: `+` joins a compound, a space is refused.
    assert_eq!(
        doc["components"]["schemas"]["Schema"]["properties"]["dimensions"]["items"]["pattern"],
        "^[a-z0-9_]{1,64}(\\+[a-z0-9_]{1,64}){0,15}$"
    );
    assert_eq!(
        param("/v1/ns/{ns}/keys/{key}/breakdown", "get", "dim")["pattern"],
        "^[a-z0-9_]{1,64}([+ ][a-z0-9_]{1,64}){0,15}$"
    );
    assert_eq!(
        paths["/v1/events"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Events"
    );
    assert_eq!(
        doc["components"]["schemas"]["Event"]["additionalProperties"],
        false
    );
    assert_eq!(
        paths.len(),
        20,
        "a route in the document that the test does not know: {:?}",
        paths.keys().collect::<Vec<_>>()
    );
}

/// `/healthz` and `/metrics` need no token and take no admission permit: a flood of them
/// asks the backend a few at a time (a slow Redis held a blocking thread for each, and
/// every write and query needs that pool too), the others waiting their turn.
#[test]
fn a_flood_of_health_checks_asks_the_backend_a_few_at_a_time() {
    use std::sync::atomic::Ordering::SeqCst;
    let s = Server::start(Settings::default());
    s.store.hold_health.store(true, SeqCst);
    let asks: Vec<_> = (0..24)
        .map(|i| {
            let url = s.url(if i % 2 == 0 { "/healthz" } else { "/metrics" });
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                agent
                    .get(&url)
                    .call()
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            })
        })
        .collect();
    let waited = std::time::Instant::now();
    while s.store.health_inside.load(SeqCst) < tally_server::OPS_PROBES {
        assert!(
            waited.elapsed().as_secs() < 20,
            "the checks never reached the backend"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let most = s.store.health_most.load(SeqCst);
    // Writes carry on meanwhile.
    seed(&s);
    s.store.hold_health.store(false, SeqCst);
    for a in asks {
        assert_eq!(a.join().unwrap(), 200);
    }
    assert_eq!(most, tally_server::OPS_PROBES);
    assert_eq!(s.store.health_most.load(SeqCst), tally_server::OPS_PROBES);
}

/// A tier a schema change adds holds nothing from before the change (SPEC §1): a query
/// that would read it there goes to a tier that holds the range whole, or is refused with
/// `no_tier_for_range` — never answered with a silent 0. So for breakdowns a tier starts
/// keeping. The marks survive a restart, and the schema's API form does not show them.
#[test]
fn a_tier_added_later_never_answers_for_time_before_it() {
    let s = Server::start(Settings::default());
    let put = |schema: Value| {
        let (st, v) = s.req("PUT", "/v1/ns/clicks", Some(&schema.to_string()), &[]);
        assert_eq!(st, 200, "{v}");
        v
    };
    put(json!({"tiers": ["1m:2d"], "breakdown_tiers": ["1m"]}));
    let e = json!([
        {"ns": "clicks", "key": "k", "ts": NOW - 3 * 3600, "n": 2, "dims": {"country": "us"}},
        {"ns": "clicks", "key": "k", "ts": NOW - 1800, "n": 3, "dims": {"country": "fr"}},
    ]);
    assert_eq!(s.post("/v1/events", &e.to_string()).0, 200);
    let shown = put(json!({"tiers": ["1m:2d", "1h:forever"], "breakdown_tiers": ["1m", "1h"]}));
    assert_eq!(
        shown,
        json!({"name": "clicks", "tiers": ["1m:2d", "1h:forever"], "breakdown_tiers": ["1m", "1h"], "dimensions": null})
    );
    let series = |s: &Server, from: i64, to: i64| {
        s.get(&format!(
            "/v1/ns/clicks/keys/k/series?unit=hour&from={from}&to={to}"
        ))
    };
    let breakdown = |s: &Server, from: i64, to: i64| {
        s.get(&format!(
            "/v1/ns/clicks/keys/k/breakdown?dim=country&from={from}&to={to}"
        ))
    };
    let check = |s: &Server| {
        // Hours before the change: the minute tier holds them, the new hourly one not.
        let (st, v) = series(s, NOW - 4 * 3600, NOW);
        assert_eq!(
            (st, &v["total"], &v["resolution"]),
            (200, &json!(5), &json!("1m")),
            "{v}"
        );
        let (st, v) = breakdown(s, NOW - 4 * 3600, NOW);
        assert_eq!(
            (st, &v["total"], &v["resolution"]),
            (200, &json!(5), &json!("1m")),
            "{v}"
        );
        assert_eq!(
            v["values"],
            json!([{"value": "fr", "n": 3}, {"value": "us", "n": 2}])
        );
        // Older than the minute tier keeps: nothing holds it whole.
        let v = err(series(s, NOW - 3 * 86_400, NOW), 422, "no_tier_for_range");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("hourly data is whole only from 2026-11-20T13:00:01Z"),
            "{message}"
        );
    };
    check(&s);
    // Past the change and the future an event may be dated in (max_future_secs, 1h): the
    // hourly tier serves what it holds whole.
    s.clock.advance(3 * 3600);
    let e = json!([{"ns": "clicks", "key": "k", "ts": NOW + 2 * 3600 + 5, "n": 7, "dims": {"country": "us"}}]);
    assert_eq!(s.post("/v1/events", &e.to_string()).0, 200);
    let (st, v) = series(&s, NOW + 2 * 3600, NOW + 3 * 3600);
    assert_eq!(
        (st, &v["total"], &v["resolution"]),
        (200, &json!(7), &json!("1h")),
        "{v}"
    );
    let s = s.restart();
    check(&s);
    let (st, v) = breakdown(&s, NOW + 2 * 3600, NOW + 3 * 3600);
    assert_eq!(
        (st, &v["total"], &v["resolution"]),
        (200, &json!(7), &json!("1h")),
        "{v}"
    );
}

//! `POST /v1/ns/{ns}/rebuild`: a closed range replaced by the body's events, every tier and
//! breakdown; refusals change nothing; backends without rebuilds say 404.

use serde_json::json;
use tally_server::Settings;

use crate::{NOW, Server, embedded, err};

/// 2026-11-20T10:00Z … 11:00Z: a whole, closed hour before NOW (12:00Z).
const FROM: i64 = NOW - 2 * 3600;
const TO: i64 = NOW - 3600;

fn seed(s: &Server) {
    let body = json!([
        {"ns": "clicks", "key": "a", "ts": FROM + 60, "n": 5, "dims": {"country": "US"}},
        {"ns": "clicks", "key": "b", "ts": FROM + 120, "n": 3},
        {"ns": "clicks", "key": "a", "ts": TO + 60, "n": 7, "dims": {"country": "DE"}},
    ]);
    assert_eq!(s.post("/v1/events", &body.to_string()).0, 200);
}

fn total(s: &Server, key: &str, from: i64, to: i64) -> i64 {
    let (st, v) = s.get(&format!(
        "/v1/ns/clicks/keys/{key}/series?from={from}&to={to}&unit=minute"
    ));
    assert_eq!(st, 200, "{v}");
    v["total"].as_i64().unwrap()
}

#[test]
fn a_rebuild_replaces_the_range_and_nothing_else() {
    let s = Server::start(Settings::default());
    seed(&s);
    let path = format!("/v1/ns/clicks/rebuild?from={FROM}&to={TO}");
    let body = json!([
        {"ns": "clicks", "key": "a", "ts": FROM + 600, "n": 2, "dims": {"country": "FR"}},
        {"ns": "clicks", "key": "c", "ts": FROM + 900, "n": 4},
    ])
    .to_string();
    let (st, v) = s.post(&path, &body);
    if !embedded() {
        err((st, v), 404, "not_found");
        return;
    }
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["events"], 2);
    assert_eq!(v["held_before"].as_i64().map(|n| n > 0), Some(true), "{v}");
    assert_eq!(total(&s, "a", FROM, TO), 2);
    assert_eq!(total(&s, "b", FROM, TO), 0);
    assert_eq!(total(&s, "c", FROM, TO), 4);
    assert_eq!(total(&s, "a", TO, NOW), 7, "outside the range: untouched");
    let (_, b) = s.get(&format!(
        "/v1/ns/clicks/keys/a/breakdown?dim=country&from={FROM}&to={NOW}"
    ));
    assert_eq!(
        b["values"],
        json!([{"value": "DE", "n": 7}, {"value": "FR", "n": 2}]),
        "{b}"
    );
    // Again: nothing changes. An empty body empties the range.
    assert_eq!(s.post(&path, &body).0, 200);
    assert_eq!(total(&s, "a", FROM, TO), 2);
    assert_eq!(s.post(&path, "[]").0, 200);
    assert_eq!(total(&s, "a", FROM, TO) + total(&s, "c", FROM, TO), 0);
    assert_eq!(total(&s, "a", TO, NOW), 7);
}

#[test]
fn bad_rebuilds_are_refused_and_change_nothing() {
    let s = Server::start(Settings::default());
    seed(&s);
    let before = s.state();
    let ok = json!([{"ns": "clicks", "key": "a", "ts": FROM + 1}]).to_string();
    let post = |q: &str, body: &str| s.post(&format!("/v1/ns/clicks/rebuild?{q}"), body);
    let range = format!("from={FROM}&to={TO}");
    let e = err(
        post(
            &range,
            &json!([{"ns": "clicks", "key": "a", "ts": TO}]).to_string(),
        ),
        400,
        "invalid_timestamp",
    );
    assert_eq!(
        (&e["error"]["index"], &e["error"]["field"]),
        (&json!(0), &json!("ts"))
    );
    // An event without `ts` is dated now, after the range: said as such (it was "ts
    // <now> is outside the rebuilt range", a time the client never sent).
    let e = err(
        post(
            &range,
            &json!([{"ns": "clicks", "key": "a", "ts": FROM}, {"ns": "clicks", "key": "a"}])
                .to_string(),
        ),
        400,
        "invalid_timestamp",
    );
    assert_eq!(e["error"]["index"], 1, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("event 1: it has no ts: a rebuild's events need one"),
        "{e}"
    );
    let e = err(
        post(
            &range,
            &json!([{"ns": "other", "key": "a", "ts": FROM}]).to_string(),
        ),
        400,
        "invalid_parameter",
    );
    assert_eq!(
        (&e["error"]["index"], &e["error"]["field"]),
        (&json!(0), &json!("ns"))
    );
    err(
        post(&format!("from={}&to={TO}", FROM + 60), &ok),
        400,
        "invalid_range",
    );
    err(
        post(&format!("from={TO}&to={FROM}"), &ok),
        400,
        "invalid_range",
    );
    // Half a second past a whole hour is not one (it was floored to the hour).
    assert_eq!(
        tally_core::model::parse_timestamp("2026-11-20T10:00:00Z").unwrap(),
        FROM
    );
    err(
        post(&format!("from=2026-11-20T10:00:00.5Z&to={TO}"), &ok),
        400,
        "invalid_range",
    );
    // A range still open: `to` is at fault, and named.
    let e = err(
        post(&format!("from={FROM}&to={}", NOW + 3600), &ok),
        400,
        "invalid_range",
    );
    assert_eq!(e["error"]["field"], "to", "{e}");
    err(post(&format!("to={TO}"), &ok), 400, "missing_parameter");
    err(
        post(&format!("{range}&tz=UTC"), &ok),
        400,
        "invalid_parameter",
    );
    err(post(&range, "not json"), 400, "malformed_body");
    err(
        s.post(&format!("/v1/ns/nope/rebuild?{range}"), "[]"),
        404,
        "unknown_namespace",
    );
    assert_eq!(s.state(), before);
}

#[test]
fn a_rebuild_needs_admin_on_the_namespace() {
    let s = Server::with_config(
        r#"
[[tokens]]
token = "w"
scopes = ["write:*", "read:*"]

[[tokens]]
token = "a"
scopes = ["admin:clicks", "write:clicks"]
"#,
    );
    let auth = |t: &str| [("Authorization", format!("Bearer {t}"))];
    let h = |t: &str| auth(t);
    let body = json!([{"ns": "clicks", "key": "a", "ts": FROM}]).to_string();
    let hw = h("w");
    let hw: Vec<(&str, &str)> = hw.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(s.req("POST", "/v1/events", Some(&body), &hw).0, 200);
    let path = format!("/v1/ns/clicks/rebuild?from={FROM}&to={TO}");
    err(s.post(&path, "[]"), 401, "unauthorized");
    err(s.req("POST", &path, Some("[]"), &hw), 403, "forbidden");
    let ha = h("a");
    let ha: Vec<(&str, &str)> = ha.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (st, _) = s.req("POST", &path, Some("[]"), &ha);
    assert_eq!(st, if embedded() { 200 } else { 404 });
}

//! `POST /v1/events?dry_run=true`: a good batch is accepted and changes nothing — no count,
//! no namespace, no idempotency answer; a bad one gets exactly the answer the real request
//! gets (status, code, message, index), under the server's own config, tokens and clock.

use serde_json::{Value, json};
use tally_core::model::Namespace;
use tally_core::store::Store;
use tally_server::Settings;

use crate::{NOW, Server, err};

fn total(s: &Server, ns: &str, key: &str) -> i64 {
    let (_, v) = s.get(&format!(
        "/v1/ns/{ns}/keys/{key}/series?from={}&to={}&unit=hour",
        NOW - 7200,
        NOW + 3600
    ));
    v["total"].as_i64().unwrap_or(0)
}

#[test]
fn a_dry_run_of_a_good_batch_changes_nothing() {
    let s = Server::start(Settings::default());
    let seed = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    assert_eq!(s.post("/v1/events", &seed).0, 200);
    let before = s.state();
    // One event of a namespace that exists, one of a namespace it would create.
    let body = json!([
        {"ns": "clicks", "key": "k", "ts": NOW - 60, "n": 5},
        {"ns": "fresh", "key": "k", "dims": {"d": "x"}},
    ])
    .to_string();
    let key = [("Idempotency-Key", "batch-1")];
    assert_eq!(
        s.req("POST", "/v1/events?dry_run=true", Some(&body), &key),
        (200, json!({"accepted": 2, "dry_run": true}))
    );
    // A misspelt dry run is refused, not applied.
    for path in [
        "/v1/events?dryrun=true",
        "/v1/events?dry-run=true",
        "/v1/events?x=1&dry_run=true",
    ] {
        err(
            s.req("POST", path, Some(&body), &key),
            400,
            "invalid_parameter",
        );
    }
    let nd = "{\"ns\": \"fresh\", \"key\": \"a\"}\n\n{\"ns\": \"fresh\", \"key\": \"b\"}\n";
    assert_eq!(
        s.req(
            "POST",
            "/v1/events?dry_run=true",
            Some(nd),
            &[("Content-Type", "application/x-ndjson")]
        ),
        (200, json!({"accepted": 2, "dry_run": true}))
    );
    assert_eq!(s.state(), before, "a dry run applied or created something");
    // Counted apart from writes: two dry runs of two events passed, one batch was written.
    let (_, m) = s.raw("GET", "/metrics", None, &[]);
    for line in [
        "tally_dry_run_batches_total 2",
        "tally_dry_run_events_total 4",
        "tally_batches_accepted_total 1",
    ] {
        assert!(m.lines().any(|l| l == line), "{line} not in:\n{m}");
    }
    assert_eq!(
        s.store.schema(&Namespace::new("fresh").unwrap()).unwrap(),
        None
    );
    // No answer was stored under the key: a real request with another body is a first
    // request (a stored answer would make it 422 idempotency_key_reused).
    let other = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    assert_eq!(
        s.req("POST", "/v1/events", Some(&other), &key),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(total(&s, "clicks", "k"), 2);
    // Nor is a stored answer replayed: a dry run under a used key still only checks.
    assert_eq!(
        s.req("POST", "/v1/events?dry_run=true", Some(&other), &key),
        (200, json!({"accepted": 1, "dry_run": true}))
    );
    assert_eq!(total(&s, "clicks", "k"), 2);
    // dry_run=false is a real request.
    assert_eq!(
        s.post("/v1/events?dry_run=false", &other),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(total(&s, "clicks", "k"), 3);
}

#[test]
fn a_dry_run_of_a_bad_batch_gets_the_real_answer() {
    let s = Server::with_config(
        r#"
[defaults]
auto_create = false

[namespaces.clicks]
tiers = ["1m:48h", "1h:forever"]

[namespaces.strict]
tiers = ["1h:forever"]
dimensions = ["country"]

[limits]
max_body_bytes = 4096
max_batch_events = 3
max_future_secs = 600

[[tokens]]
token = "w"
scopes = ["write:clicks", "write:strict", "write:fresh"]

[[tokens]]
token = "admin"
scopes = ["admin:*", "read:*", "write:*"]
"#,
    );
    let w = [("Authorization", "Bearer w")];
    let admin = [("Authorization", "Bearer admin")];
    let ok = json!({"ns": "clicks", "key": "ok", "ts": NOW - 60});
    let two = |bad: Value| json!([ok, bad]).to_string();
    let before = s.state_with(&admin);
    let cases: Vec<(String, u16, &str, Option<u64>)> = vec![
        (
            two(json!({"ns": "strict", "key": "k", "dims": {"device": "ios"}})),
            400,
            "unknown_dimension",
            Some(1),
        ),
        // 20 minutes ahead: the server's max_future_secs (10 min), not the default hour.
        (
            two(json!({"ns": "clicks", "key": "k", "ts": NOW + 1200})),
            400,
            "timestamp_in_future",
            Some(1),
        ),
        (
            two(json!({"ns": "fresh", "key": "k"})),
            404,
            "unknown_namespace",
            Some(1),
        ),
        (
            two(json!({"ns": "other", "key": "k"})),
            403,
            "forbidden",
            Some(1),
        ),
        (
            two(json!({"ns": "clicks", "key": 5})),
            400,
            "malformed_body",
            Some(1),
        ),
        (
            json!([ok, ok, ok, ok]).to_string(),
            413,
            "batch_too_large",
            None,
        ),
        (
            two(json!({"ns": "clicks", "key": "x".repeat(5000)})),
            413,
            "body_too_large",
            None,
        ),
    ];
    for (body, status, code, index) in cases {
        let dry = s.req("POST", "/v1/events?dry_run=true", Some(&body), &w);
        let real = s.req("POST", "/v1/events", Some(&body), &w);
        let v = err(dry.clone(), status, code);
        assert_eq!(v["error"]["index"].as_u64(), index, "{code}: {v}");
        assert_eq!(dry, real, "{code}: the dry run's answer is the real one's");
        assert_eq!(s.state_with(&admin), before, "{code} changed something");
    }
    // A malformed Idempotency-Key is refused as by a real request (found by schemathesis).
    let good = two(json!({"ns": "strict", "key": "k", "dims": {"country": "US"}}));
    let bad_key = [("Authorization", "Bearer w"), ("Idempotency-Key", " ")];
    let dry = s.req("POST", "/v1/events?dry_run=true", Some(&good), &bad_key);
    let v = err(dry.clone(), 400, "invalid_parameter");
    assert_eq!(v["error"]["field"], "Idempotency-Key", "{v}");
    assert_eq!(dry, s.req("POST", "/v1/events", Some(&good), &bad_key));
    assert_eq!(s.state_with(&admin), before);
    // Two keys, or two tokens, make no promise: which would hold? Refused, not the first
    // taken.
    let two_keys = [
        ("Authorization", "Bearer w"),
        ("Idempotency-Key", "a"),
        ("Idempotency-Key", "b"),
    ];
    let two_tokens = [
        ("Authorization", "Bearer w"),
        ("Authorization", "Bearer nope"),
    ];
    for path in ["/v1/events?dry_run=true", "/v1/events"] {
        for (headers, status, code, says) in [
            (
                &two_keys[..],
                400,
                "invalid_parameter",
                "one Idempotency-Key",
            ),
            (&two_tokens[..], 401, "unauthorized", "one Authorization"),
        ] {
            let v = err(s.req("POST", path, Some(&good), headers), status, code);
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{path}: {v}");
        }
    }
    assert_eq!(s.state_with(&admin), before);
    // A token is needed as for a real request.
    err(
        s.req("POST", "/v1/events?dry_run=true", Some(&good), &[]),
        401,
        "unauthorized",
    );
    // Timestamps are judged by the server's clock: once it has moved on, the same event passes.
    let ahead = two(json!({"ns": "clicks", "key": "k", "ts": NOW + 1200}));
    s.clock.advance(900);
    assert_eq!(
        s.req("POST", "/v1/events?dry_run=true", Some(&ahead), &w),
        (200, json!({"accepted": 2, "dry_run": true}))
    );
    assert_eq!(
        s.req("POST", "/v1/events?dry_run=true", Some(&good), &w),
        (200, json!({"accepted": 2, "dry_run": true}))
    );
    // Any other value of dry_run is refused, and nothing is applied.
    for q in ["dry_run=yes", "dry_run=", "dry_run=true&dry_run=false"] {
        let v = err(
            s.req("POST", &format!("/v1/events?{q}"), Some(&good), &w),
            400,
            "invalid_parameter",
        );
        assert_eq!(v["error"]["field"], "dry_run", "{q}: {v}");
    }
    assert_eq!(s.state_with(&admin), before);
}

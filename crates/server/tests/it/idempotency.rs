//! `Idempotency-Key`: a replay answers the first answer and applies nothing — also after a
//! restart; a different request under the same key is 422; a concurrent one is 409.

use serde_json::json;
use tally_server::Settings;

use crate::{NOW, Server, err};

fn total(s: &Server, key: &str) -> i64 {
    let (_, v) = s.get(&format!(
        "/v1/ns/clicks/keys/{key}/series?from={}&to={}&unit=hour",
        NOW - 7200,
        NOW + 3600
    ));
    v["total"].as_i64().unwrap()
}

#[test]
fn replays_before_and_after_a_restart() {
    let s = Server::start(Settings::default());
    let body = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60, "n": 5}]).to_string();
    let h = [("Idempotency-Key", "order-42")];
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body), &h),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body), &h),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(total(&s, "k"), 5);
    // A replay says so in a header; a first answer does not.
    let post = |key: &str, body: &str| {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let resp = agent
            .post(&s.url("/v1/events"))
            .header("Idempotency-Key", key)
            .send(body)
            .unwrap();
        resp.headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(post("order-42", &body).as_deref(), Some("true"));
    let other = json!([{"ns": "clicks", "key": "other", "ts": NOW - 60}]).to_string();
    assert_eq!(post("order-43", &other), None);
    assert_eq!(total(&s, "k"), 5);
    // incr with a window: the replay answers the first window count, applying nothing.
    let ih = [("Idempotency-Key", "incr-1")];
    let first = s.req("POST", "/v1/ns/clicks/keys/k/incr?n=2&window=1h", None, &ih);
    assert_eq!(first.1["window"]["n"], 7);
    s.post("/v1/ns/clicks/keys/k/incr", "");
    assert_eq!(
        s.req("POST", "/v1/ns/clicks/keys/k/incr?n=2&window=1h", None, &ih),
        first
    );
    assert_eq!(total(&s, "k"), 8);

    let s = s.restart();
    assert_eq!(total(&s, "k"), 8);
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body), &h),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(
        s.req("POST", "/v1/ns/clicks/keys/k/incr?n=2&window=1h", None, &ih),
        first
    );
    assert_eq!(
        total(&s, "k"),
        8,
        "a replay after restart applied something"
    );
    // Remembered for 24 h, then the key is free again.
    s.clock.advance(24 * 3600 + 1);
    let fresh = json!([{"ns": "clicks", "key": "k", "ts": NOW + 24 * 3600, "n": 1}]).to_string();
    assert_eq!(s.req("POST", "/v1/events", Some(&fresh), &h).0, 200);
}

#[test]
fn a_reused_key_with_another_request_is_422() {
    let s = Server::start(Settings::default());
    let h = [("Idempotency-Key", "abc")];
    let a = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    let b = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60, "n": 9}]).to_string();
    assert_eq!(s.req("POST", "/v1/events", Some(&a), &h).0, 200);
    let before = s.state();
    err(
        s.req("POST", "/v1/events", Some(&b), &h),
        422,
        "idempotency_key_reused",
    );
    assert_eq!(s.state(), before);
    assert_eq!(
        s.req(
            "POST",
            "/v1/ns/clicks/keys/k/incr?n=1",
            None,
            &[("Idempotency-Key", "i")]
        )
        .0,
        200
    );
    let before = s.state();
    err(
        s.req(
            "POST",
            "/v1/ns/clicks/keys/k/incr?n=2",
            None,
            &[("Idempotency-Key", "i")],
        ),
        422,
        "idempotency_key_reused",
    );
    assert_eq!(s.state(), before);
    // A failed request is not remembered: the same key can then succeed.
    let bad = json!([{"ns": "clicks", "key": ""}]).to_string();
    err(
        s.req(
            "POST",
            "/v1/events",
            Some(&bad),
            &[("Idempotency-Key", "x")],
        ),
        400,
        "invalid_key",
    );
    assert_eq!(
        s.req("POST", "/v1/events", Some(&a), &[("Idempotency-Key", "x")])
            .0,
        200
    );
}

/// `POST /v1/events` of `body` under idempotency key `key`, on a thread of its own.
fn post_in_background(
    s: &std::sync::Arc<Server>,
    body: &str,
    key: &str,
) -> std::thread::JoinHandle<(u16, serde_json::Value)> {
    let (s, body, key) = (s.clone(), body.to_owned(), key.to_owned());
    std::thread::spawn(move || {
        s.req(
            "POST",
            "/v1/events",
            Some(&body),
            &[("Idempotency-Key", &key)],
        )
    })
}

/// Waits until a write is held at the store's closed gate.
fn wait_until_held(s: &Server) {
    while *s.store.waiting.lock().unwrap() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_concurrent_request_with_the_same_key_is_409() {
    let s = std::sync::Arc::new(Server::start(Settings::default()));
    let body = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    // Create the namespace first, then hold the next write at the store's gate.
    assert_eq!(s.post("/v1/events", &body).0, 200);
    s.store.close();
    let first = post_in_background(&s, &body, "slow");
    wait_until_held(&s);
    err(
        s.req(
            "POST",
            "/v1/events",
            Some(&body),
            &[("Idempotency-Key", "slow")],
        ),
        409,
        "idempotency_in_progress",
    );
    s.store.open();
    assert_eq!(first.join().unwrap().0, 200);
    assert_eq!(total(&s, "k"), 2);
    assert_eq!(
        s.req(
            "POST",
            "/v1/events",
            Some(&body),
            &[("Idempotency-Key", "slow")]
        )
        .0,
        200
    );
    assert_eq!(total(&s, "k"), 2);
}

/// Two clients with their own tokens may pick the same key: neither replays, blocks nor
/// learns of the other's request (a 422 would tell B that A used the key).
#[test]
fn each_token_has_its_own_keys() {
    let s = Server::with_config(
        r#"
[[tokens]]
token = "alpha"
scopes = ["write:clicks", "read:clicks"]

[[tokens]]
token = "beta"
scopes = ["write:clicks", "read:clicks"]
"#,
    );
    let a = [
        ("Authorization", "Bearer alpha"),
        ("Idempotency-Key", "same"),
    ];
    let b = [
        ("Authorization", "Bearer beta"),
        ("Idempotency-Key", "same"),
    ];
    let body_a = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60, "n": 5}]).to_string();
    let body_b = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60, "n": 7}, {"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body_a), &a),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body_b), &b),
        (200, json!({"accepted": 2}))
    );
    // Each replays its own answer and applies nothing.
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body_a), &a),
        (200, json!({"accepted": 1}))
    );
    assert_eq!(
        s.req("POST", "/v1/events", Some(&body_b), &b),
        (200, json!({"accepted": 2}))
    );
    // Reused by the same token for a different request: still refused.
    err(
        s.req("POST", "/v1/events", Some(&body_b), &a),
        422,
        "idempotency_key_reused",
    );
    let (_, v) = s.req(
        "GET",
        &format!(
            "/v1/ns/clicks/keys/k/series?from={}&to={}&unit=hour",
            NOW - 7200,
            NOW + 3600
        ),
        None,
        &[("Authorization", "Bearer alpha")],
    );
    assert_eq!(v["total"], 13);
}

/// A client that gives up on its request (a timeout: the connection closed) and retries
/// with the same key while the first is still being applied gets 409, not a second apply:
/// the key stays claimed until the store is done with the first, wherever its client went.
#[test]
fn a_retry_after_the_client_hung_up_waits_for_the_first_request() {
    use std::io::Write;
    let s = std::sync::Arc::new(Server::start(Settings::default()));
    let body = json!([{"ns": "clicks", "key": "k", "ts": NOW - 60}]).to_string();
    assert_eq!(s.post("/v1/events", &body).0, 200);
    s.store.close();
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Idempotency-Key: gone\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_until_held(&s);
    drop(c);
    // Time for the server to see the connection closed and drop the request's handler.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let retry = post_in_background(&s, &body, "gone");
    // Answered at once; had the key been let go, the retry would wait at the store's gate
    // to be applied a second time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !retry.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let answered = retry.is_finished();
    s.store.open();
    assert!(
        answered,
        "the retry went on to the store while the first was applied"
    );
    err(retry.join().unwrap(), 409, "idempotency_in_progress");
    // Once the first is applied, the retry replays its answer.
    let mut tries = 0;
    loop {
        let (status, _) = s.req(
            "POST",
            "/v1/events",
            Some(&body),
            &[("Idempotency-Key", "gone")],
        );
        if status == 200 {
            break;
        }
        tries += 1;
        assert!(tries < 200, "still {status}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(total(&s, "k"), 2, "the events were counted once");
}

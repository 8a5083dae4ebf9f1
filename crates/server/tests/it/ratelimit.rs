//! Rate limiting (issue 14): `incr?window=…&max=…` counts only while the window stays within
//! `max`, atomically under concurrency; a refusal is `429 limit_exceeded` with the count, the
//! limit and `retry_after`, counts nothing, and is remembered under an Idempotency-Key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tally_server::Settings;

use crate::{Server, err};

fn window_total(s: &Server, key: &str) -> i64 {
    let (st, v) = s.get(&format!("/v1/ns/api/keys/{key}/window?last=1h"));
    assert_eq!(st, 200, "{v}");
    v["n"].as_i64().unwrap()
}

#[test]
fn concurrent_clients_never_get_past_the_limit() {
    let s = Arc::new(Server::start(Settings::default()));
    let (accepted, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let (s, accepted, refused, next) =
                (s.clone(), accepted.clone(), refused.clone(), next.clone());
            std::thread::spawn(move || {
                while next.fetch_add(1, Ordering::SeqCst) < 5000 {
                    let (st, v) = s.post("/v1/ns/api/keys/k/incr?window=1h&max=1000", "");
                    match st {
                        200 => accepted.fetch_add(1, Ordering::SeqCst),
                        429 => refused.fetch_add(1, Ordering::SeqCst),
                        _ => panic!("{st} {v}"),
                    };
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(
        (
            accepted.load(Ordering::SeqCst),
            refused.load(Ordering::SeqCst)
        ),
        (1000, 4000)
    );
    assert_eq!(window_total(&s, "k"), 1000);
}

#[test]
fn a_refusal_says_how_full_the_window_is_and_when_to_retry() {
    let s = Server::start(Settings::default());
    // The 1m tier serves a 1h window: 60 one-minute buckets, the current one NOW's.
    for _ in 0..2 {
        let (st, v) = s.post("/v1/ns/api/keys/k/incr?window=1h&max=2", "");
        assert_eq!(st, 200, "{v}");
    }
    // At the limit: refused, whatever n.
    assert_eq!(s.post("/v1/ns/api/keys/k/incr?window=1h&max=2", "").0, 429);
    let (st, v) = s.post("/v1/ns/api/keys/k/incr?window=1h&max=3&n=1", "");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["window"]["n"], 3, "{v}");
    let answer = s.raw("POST", "/v1/ns/api/keys/k/incr?window=1h&max=3", None, &[]);
    assert_eq!(answer.0, 429);
    let v: serde_json::Value = serde_json::from_str(&answer.1).unwrap();
    let e = &v["error"];
    assert_eq!(e["code"], "limit_exceeded");
    assert_eq!((e["count"].as_i64(), e["max"].as_i64()), (Some(3), Some(3)));
    // All three are in NOW's minute, which leaves the window an hour later.
    assert_eq!(e["retry_after"].as_i64(), Some(3600));
    assert_eq!(e["window"]["last"], "1h");
    assert!(e["message"].as_str().unwrap().contains("3 of 3"), "{v}");
    assert_eq!(window_total(&s, "k"), 3, "a refusal counted something");
    // The Retry-After header says the same.
    let head = crate::errors::raw_http(
        s.addr,
        "POST /v1/ns/api/keys/k/incr?window=1h&max=3 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 3600"),
        "{head}"
    );
    // An increment over the limit on its own never fits.
    let (st, v) = s.post("/v1/ns/api/keys/other/incr?window=1h&max=3&n=4", "");
    assert_eq!(st, 429);
    assert_eq!(v["error"]["retry_after"], serde_json::Value::Null);
    // A decrement always fits.
    let (st, v) = s.post("/v1/ns/api/keys/k/incr?window=1h&max=3&n=-1", "");
    assert_eq!((st, v["window"]["n"].as_i64()), (200, Some(2)));
    // Time passes: the minute of the first three leaves the window.
    s.clock.advance(3600);
    let (st, v) = s.post("/v1/ns/api/keys/k/incr?window=1h&max=3", "");
    assert_eq!((st, v["window"]["n"].as_i64()), (200, Some(1)), "{v}");
}

#[test]
fn a_refusal_is_replayed_under_its_idempotency_key() {
    let s = Server::start(Settings::default());
    let h = [("Idempotency-Key", "req-1")];
    assert_eq!(s.post("/v1/ns/api/keys/k/incr?window=1h&max=1", "").0, 200);
    let first = s.req("POST", "/v1/ns/api/keys/k/incr?window=1h&max=1", None, &h);
    assert_eq!(first.0, 429);
    // Even once the window has room, the retry gets the refusal, not a second chance.
    s.clock.advance(3600);
    assert_eq!(
        s.req("POST", "/v1/ns/api/keys/k/incr?window=1h&max=1", None, &h),
        first
    );
    assert_eq!(window_total(&s, "k"), 0);
    // An accepted one replays as accepted, counting once — also after a restart.
    let h2 = [("Idempotency-Key", "req-2")];
    let ok = s.req("POST", "/v1/ns/api/keys/k/incr?window=1h&max=1", None, &h2);
    assert_eq!(ok.0, 200);
    let s = s.restart();
    assert_eq!(
        s.req("POST", "/v1/ns/api/keys/k/incr?window=1h&max=1", None, &h2),
        ok
    );
    assert_eq!(
        s.req("POST", "/v1/ns/api/keys/k/incr?window=1h&max=1", None, &h),
        first
    );
    assert_eq!(window_total(&s, "k"), 1);
}

#[test]
fn bad_limits_are_refused() {
    let s = Server::start(Settings::default());
    let before = s.state();
    err(
        s.post("/v1/ns/api/keys/k/incr?max=10", ""),
        400,
        "missing_parameter",
    );
    for bad in ["-1", "ten", "9007199254740992", "+5", ""] {
        let e = err(
            s.post(&format!("/v1/ns/api/keys/k/incr?window=1m&max={bad}"), ""),
            400,
            "invalid_parameter",
        );
        assert_eq!(e["error"]["field"], "max", "{bad}");
    }
    err(
        s.post("/v1/ns/api/keys/k/incr?window=1m&max=1&max=2", ""),
        400,
        "invalid_parameter",
    );
    // An increment outside the window the limit checks would be counted unchecked (a
    // future one then overfills its window): refused, naming ts.
    for ts in [crate::NOW + 1800, crate::NOW - 7200] {
        let e = err(
            s.post(
                &format!("/v1/ns/api/keys/k/incr?window=1m&max=5&ts={ts}"),
                "",
            ),
            400,
            "invalid_parameter",
        );
        assert_eq!(e["error"]["field"], "ts", "{ts}");
    }
    assert_eq!(s.state(), before);
    // Inside the window it counts as any other.
    let (st, v) = s.post(
        &format!("/v1/ns/api/keys/k/incr?window=1m&max=5&ts={}", crate::NOW),
        "",
    );
    assert_eq!(st, 200, "{v}");
}

/// Found by an independent review: a limited increment that waited for its key's lock while
/// a second ended was written into the second it was stamped in, though the window it was
/// checked against had moved on (2 in one second for `max=1` per second). Now it is stamped
/// again and counted in the second it lands in.
#[test]
fn an_increment_queued_across_a_second_edge_counts_in_the_new_second() {
    let s = Arc::new(Server::with_config(
        "[namespaces.rl]\ntiers = [\"1s:2h\", \"1m:48h\"]\n",
    ));
    s.store
        .gate_limited
        .store(true, std::sync::atomic::Ordering::SeqCst);
    s.store.close();
    let incr = |s: Arc<Server>| {
        std::thread::spawn(move || s.post("/v1/ns/rl/keys/k/incr?window=1s&max=1", ""))
    };
    // A holds the key's lock, applying; B waits for it.
    let a = incr(s.clone());
    while *s.store.waiting.lock().unwrap() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let b = incr(s.clone());
    // B has stamped its increment and waits for the key's lock.
    while s
        .store
        .limited_waiting
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.clock.advance(1);
    s.store.open();
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((a.0, a.1["window"]["n"].as_i64()), (200, Some(1)), "{a:?}");
    assert_eq!((b.0, b.1["window"]["n"].as_i64()), (200, Some(1)), "{b:?}");
    let second = |at: i64| {
        s.clock.set(at);
        let (st, v) = s.get("/v1/ns/rl/keys/k/window?last=1s");
        assert_eq!(st, 200, "{v}");
        v["n"].as_i64().unwrap()
    };
    assert_eq!((second(crate::NOW), second(crate::NOW + 1)), (1, 1));
}

//! Query strings through the server's decoder (`pairs`, `unique`) and then through every
//! query's parameter parser in core (series, breakdown, window, dashboard, top, keys).
//!
//! Input: the query string (`a=1&b=%20`), bytes that are not UTF-8 skipped. Asserts, beyond
//! "no panic":
//! - the decoder refuses only with `400 invalid_parameter`, and what it decodes, encoded
//!   again, decodes to the same pairs;
//! - `unique` takes exactly the strings whose decoded names are all different, giving the
//!   same pairs;
//! - every parser answers a typed query or a 4xx error; an accepted query has instants in
//!   the accepted range, a limit in 1..=10000, a non-empty filter value, a positive window.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use tally_core::ErrorCode;
use tally_core::model::{MAX_TS, MIN_TS};
use tally_core::query::{
    BreakdownQuery, DashboardQuery, KeysQuery, SeriesQuery, TopQuery, WindowQuery,
};
use tally_server::ApiError;
use tally_server::fuzzing::{query_pairs, query_unique};

/// Form encoding: unreserved bytes as they are, a space as `+`, the rest `%XX`.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn instant_ok(t: i64) {
    assert!((MIN_TS..MAX_TS).contains(&t), "instant {t}");
}

fn limit_ok(n: usize) {
    assert!((1..=10_000).contains(&n), "limit {n}");
}

fn refused(e: tally_core::query::QueryError) {
    let e = ApiError::from(e);
    assert!(e.status().is_client_error(), "{e:?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(q) = std::str::from_utf8(data) else {
        return;
    };
    let pairs = match query_pairs(q) {
        Ok(p) => p,
        Err(e) => {
            assert_eq!(e.code, ErrorCode::InvalidParameter, "{e:?}");
            assert!(e.status().is_client_error());
            assert!(query_unique(Some(q)).is_err());
            return;
        }
    };
    let again: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    assert_eq!(query_pairs(&again.join("&")).as_ref(), Ok(&pairs));

    let mut by_name = BTreeMap::new();
    let mut repeated = false;
    for (k, v) in &pairs {
        repeated |= by_name.insert(k.clone(), v.clone()).is_some();
    }
    let p = match query_unique(Some(q)) {
        Ok(p) => {
            assert!(!repeated);
            assert_eq!(p, by_name);
            p
        }
        Err(e) => {
            assert!(repeated, "{e:?}");
            assert_eq!(e.code, ErrorCode::InvalidParameter);
            return;
        }
    };

    let ns = p.get("ns").map_or("clicks", String::as_str);
    let key = p.get("key").map_or("lnk_1", String::as_str);
    match SeriesQuery::parse(ns, key, &p) {
        Ok(s) => {
            instant_ok(s.from);
            instant_ok(s.to);
            assert!(s.cal.every() >= 1);
            if let Some((_, v)) = &s.filter {
                assert!(!v.is_empty());
            }
        }
        Err(e) => refused(e),
    }
    match BreakdownQuery::parse(ns, key, &p) {
        Ok(b) => {
            instant_ok(b.from);
            instant_ok(b.to);
            limit_ok(b.limit);
        }
        Err(e) => refused(e),
    }
    match WindowQuery::parse(ns, key, &p) {
        Ok(w) => assert!(w.last.secs() > 0),
        Err(e) => refused(e),
    }
    match DashboardQuery::parse(ns, key, &p) {
        Ok(d) => {
            instant_ok(d.from);
            instant_ok(d.to);
            limit_ok(d.limit);
        }
        Err(e) => refused(e),
    }
    match TopQuery::parse(ns, &p) {
        Ok(t) => {
            instant_ok(t.from);
            instant_ok(t.to);
            limit_ok(t.limit);
            if let Some((_, v)) = &t.filter {
                assert!(!v.is_empty());
            }
        }
        Err(e) => refused(e),
    }
    match KeysQuery::parse(ns, &p) {
        Ok(k) => limit_ok(k.limit),
        Err(e) => refused(e),
    }
});

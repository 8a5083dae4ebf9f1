//! `POST /v1/events` bodies, JSON array or NDJSON, through the route's parser.
//!
//! Input: a flag byte (bit 0: NDJSON; bits 1–2: the batch limit, 1000, 1, 2 or 3), then the
//! body. Asserts, beyond "no panic":
//! - every refusal is a 4xx error, its index (if any) names one of the body's events, and
//!   `batch_too_large` only when there are more events than the limit;
//! - the fast and the exact-error path agree: when the fast path takes the body, the answer
//!   is its events and the slow path takes the same events (up to a dimension named twice,
//!   where the slow path's JSON object keeps the last value); when either refuses, the
//!   answer is the slow path's refusal, word for word;
//! - NDJSON: one event per non-blank line (the line splitter drops exactly the blank ones);
//! - accepted events round-trip: written back as a JSON array and as NDJSON, they parse to
//!   the same events.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tally_core::ErrorCode;
use tally_core::model::RawEvent;
use tally_server::ApiError;
use tally_server::fuzzing::{parse_events, parse_events_fast, parse_events_slow};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let ndjson = flags & 1 != 0;
    let max = [1000, 1, 2, 3][usize::from((flags >> 1) & 3)];
    check(body, ndjson, max);
});

/// The non-blank lines of an NDJSON body, by the SPEC's rule (`\n` or `\r\n` ends a line; a
/// line of whitespace is blank), written independently of the parser's splitter.
fn ndjson_lines(text: &str) -> usize {
    text.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// How many events the body holds, if it has that shape at all.
fn event_count(body: &[u8], ndjson: bool) -> Option<usize> {
    if ndjson {
        std::str::from_utf8(body).ok().map(ndjson_lines)
    } else {
        match serde_json::from_slice::<Value>(body).ok()? {
            Value::Array(items) => Some(items.len()),
            _ => None,
        }
    }
}

fn check_refusal(e: &ApiError, body: &[u8], ndjson: bool, max: usize) {
    assert!(e.status().is_client_error(), "a refusal is a 4xx: {e:?}");
    let count = event_count(body, ndjson);
    if let Some(i) = e.index {
        let n = count.expect("an error naming an index comes from a body of events");
        assert!(i < n, "index {i} of {n} events: {e:?}");
        assert!(n <= max, "events are checked only once the batch fits");
    }
    if e.code == ErrorCode::BatchTooLarge {
        let n = count.expect("only a body of events is too large");
        assert!(n > max, "{n} events refused as more than {max}");
    }
}

/// A JSON object keeps one entry per name, where it first appears, with its last value.
fn last_value_per_name(mut e: RawEvent) -> RawEvent {
    let mut dims: Vec<(String, String)> = Vec::new();
    for (k, v) in e.dims {
        match dims.iter_mut().find(|(seen, _)| *seen == k) {
            Some(d) => d.1 = v,
            None => dims.push((k, v)),
        }
    }
    e.dims = dims;
    e
}

/// An event as JSON, every field present that the event has.
fn render(e: &RawEvent) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap();
    let mut out = format!("{{\"ns\": {}, \"key\": {}", q(&e.ns), q(&e.key));
    if let Some(ts) = e.ts {
        out.push_str(&format!(", \"ts\": {ts}"));
    }
    if let Some(n) = e.n {
        out.push_str(&format!(", \"n\": {n}"));
    }
    // Written by hand: a dimension named twice stays twice, as the fast path read it.
    let dims: Vec<String> = e
        .dims
        .iter()
        .map(|(k, v)| format!("{}: {}", q(k), q(v)))
        .collect();
    out.push_str(&format!(", \"dims\": {{{}}}}}", dims.join(", ")));
    out
}

fn check(body: &[u8], ndjson: bool, max: usize) {
    let public = parse_events(body, ndjson, max);
    let slow = parse_events_slow(body, ndjson, max);
    if let Err(e) = &public {
        check_refusal(e, body, ndjson, max);
    }
    if let Err(e) = &slow {
        check_refusal(e, body, ndjson, max);
    }
    match parse_events_fast(body, ndjson, max) {
        Some(Ok(fast)) if fast.len() <= max && fast.iter().all(Result::is_ok) => {
            let fast: Vec<RawEvent> = fast.into_iter().flatten().collect();
            assert_eq!(public.as_ref().ok(), Some(&fast));
            let expected: Vec<RawEvent> = fast.into_iter().map(last_value_per_name).collect();
            assert_eq!(
                slow,
                Ok(expected),
                "the slow path refused what the fast path took"
            );
        }
        Some(_) => {
            let (Err(p), Err(s)) = (&public, &slow) else {
                panic!("the fast path refused; public {public:?}, slow {slow:?}");
            };
            assert_eq!(p, s);
        }
        None => assert_eq!(public, slow),
    }
    let Ok(events) = public else {
        return;
    };
    assert!(events.len() <= max);
    if ndjson {
        let text = std::str::from_utf8(body).expect("accepted NDJSON is UTF-8");
        assert_eq!(
            events.len(),
            ndjson_lines(text),
            "one event per non-blank line"
        );
    }
    let rendered: Vec<String> = events.iter().map(render).collect();
    let array = format!("[{}]", rendered.join(",\n"));
    assert_eq!(
        parse_events(array.as_bytes(), false, max).as_ref(),
        Ok(&events),
        "{array}"
    );
    let lines = rendered.join("\r\n\n");
    assert_eq!(
        parse_events(lines.as_bytes(), true, max).as_ref(),
        Ok(&events),
        "{lines}"
    );
}

//! The events of a `POST /v1/events` body, a JSON array or NDJSON (blank lines ignored),
//! into `RawEvent`s — or the exact error code and 0-based index of the first bad event.
//!
//! Two parsers, combined in [`parse_body`]: the fast one deserialises well-formed events
//! straight from the bytes into borrowed strings, with no JSON value tree; a body it cannot
//! take goes to the slow one, which walks a JSON value field by field to name the exact
//! error. So a bad body is parsed twice and a good one once.

use std::borrow::Cow;

use serde_json::Value;
use tally_core::ErrorCode;
use tally_core::model::{self, RawEvent};

use crate::error::ApiError;

fn malformed(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::MalformedBody, msg)
}

/// One event object of a request body.
fn raw_event(v: &Value) -> Result<RawEvent, ApiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| malformed("each event is a JSON object"))?;
    if let Some(k) = obj
        .keys()
        .find(|k| !["ns", "key", "ts", "n", "dims"].contains(&k.as_str()))
    {
        return Err(malformed(format!(
            "unknown field {k:?} (an event has ns, key, ts, n, dims)"
        ))
        .field(k.clone()));
    }
    let string = |name: &str| match obj.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(malformed(format!("{name} must be a string")).field(name)),
        None => Err(malformed(format!("{name} is required")).field(name)),
    };
    let ts = match obj.get("ts") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            Some(model::parse_timestamp(s).map_err(|e| ApiError::from(e).field("ts"))?)
        }
        Some(Value::Number(n)) => Some(n.as_i64().ok_or_else(|| {
            let why = match n.as_f64() {
                Some(f) if f.fract() == 0.0 && (0.0..model::MAX_TS as f64).contains(&f) => {
                    "must be written as an integer (unix seconds)".to_owned()
                }
                Some(f) if f.fract() == 0.0 || f.is_infinite() => format!(
                    "is out of range: unix seconds from 0 to {}",
                    model::MAX_TS - 1
                ),
                _ => "is not whole unix seconds".to_owned(),
            };
            ApiError::new(ErrorCode::InvalidTimestamp, format!("ts {n} {why}")).field("ts")
        })?),
        Some(_) => {
            return Err(malformed("ts must be unix seconds or an RFC 3339 string").field("ts"));
        }
    };
    let n = match obj.get("n") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_i64().ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidAmount,
                format!("n {n} is not an integer with |n| < 2^53"),
            )
            .field("n")
        })?),
        Some(_) => {
            return Err(
                ApiError::new(ErrorCode::InvalidAmount, "n must be a JSON integer").field("n"),
            );
        }
    };
    let dims = match obj.get("dims") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(ApiError::new(
                    ErrorCode::InvalidDimension,
                    format!(
                        "dimension {k:?}: its value must be a string, got {}",
                        json_kind(other)
                    ),
                )
                .field("dims")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(malformed("dims must be an object of strings").field("dims")),
    };
    Ok(RawEvent {
        ns: string("ns")?,
        key: string("key")?,
        ts,
        n,
        dims,
    })
}

/// An event as well-formed bodies send it, deserialised straight from the bytes: no JSON
/// value tree, strings borrowed where they have no escapes. Anything this does not accept
/// goes to the [`raw_event`] path, which names the exact error.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FastEvent<'a> {
    #[serde(borrow)]
    ns: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    key: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    ts: Option<FastTs<'a>>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default, borrow)]
    dims: Option<FastDims<'a>>,
}

/// An event object and nothing else: serde's derive reads a struct from a JSON array too
/// (`["clicks", "k"]` as ns and key), which the slow path rightly refuses.
struct FastObject<'a>(FastEvent<'a>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for FastObject<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastEvent<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                m: M,
            ) -> Result<Self::Value, M::Error> {
                serde::Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(m))
            }
        }
        d.deserialize_map(V).map(FastObject)
    }
}

enum FastTs<'a> {
    Secs(i64),
    Text(std::borrow::Cow<'a, str>),
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for FastTs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastTs<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("unix seconds or an RFC 3339 string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(FastTs::Secs(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(FastTs::Secs)
                    .map_err(|_| E::custom("out of range"))
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(FastTs::Text(v.into()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FastTs::Text(v.to_owned().into()))
            }
        }
        d.deserialize_any(V)
    }
}

struct FastDims<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for FastDims<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastDims<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out: Vec<(Cow<'de, str>, Cow<'de, str>)> =
                    Vec::with_capacity(m.size_hint().unwrap_or(2));
                while let Some((k, v)) = m.next_entry::<Cow<'de, str>, Cow<'de, str>>()? {
                    // More than an event may have: the slow path says why (and the search
                    // for a name given twice below stays short).
                    if out.len() == model::MAX_DIMS_PER_EVENT {
                        return Err(serde::de::Error::custom("too many dimensions"));
                    }
                    // A name given twice: the slow path refuses the body and says so.
                    if out.iter().any(|(seen, _)| *seen == k) {
                        return Err(serde::de::Error::custom("a dimension named twice"));
                    }
                    out.push((k, v));
                }
                Ok(FastDims(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl FastEvent<'_> {
    fn into_raw(self) -> Result<RawEvent, ApiError> {
        let ts = match self.ts {
            None => None,
            Some(FastTs::Secs(s)) => Some(s),
            Some(FastTs::Text(t)) => {
                Some(model::parse_timestamp(&t).map_err(|e| ApiError::from(e).field("ts"))?)
            }
        };
        Ok(RawEvent {
            ns: self.ns.into_owned(),
            key: self.key.into_owned(),
            ts,
            n: self.n,
            dims: self
                .dims
                .map(|d| {
                    d.0.into_iter()
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// The most JSON values the exact-error path builds for one event (each scalar, array and
/// object counts one): an event is an object of at most five members, one of them an object
/// of at most 16 strings, so this leaves room for the errors worth naming (too many
/// dimensions) while a body cannot make a value tree many times its size.
pub(crate) const EVENT_VALUES: usize = 256;

/// A body of more than `max` events, `n` of them.
fn too_many(max: usize, n: usize) -> ApiError {
    ApiError::new(
        ErrorCode::BatchTooLarge,
        format!("a batch holds at most {max} events, got {n}"),
    )
}

/// An event of more JSON values than [`EVENT_VALUES`].
fn too_big() -> ApiError {
    malformed(format!(
        "an event is an object of at most {EVENT_VALUES} JSON values in all (ns, key, ts, n \
         and up to {} dimensions)",
        model::MAX_DIMS_PER_EVENT
    ))
}

/// What the fast path made of a body: its events (each read or refused), or `Err(n)` for a
/// body of `n` events, more than the batch takes (counted, not read).
pub(crate) type Fast = Result<Vec<Result<RawEvent, ApiError>>, usize>;

/// The fast path over a whole body; `None` sends the body to the exact-error path. At most
/// `max` events are read: past them the body is only counted.
pub(crate) fn parse_fast(body: &[u8], ndjson: bool, max: usize) -> Option<Fast> {
    if ndjson {
        let text = std::str::from_utf8(body).ok()?;
        let lines = text.lines().filter(|l| !l.trim().is_empty());
        let n = lines.clone().count();
        if n > max {
            return Some(Err(n));
        }
        lines
            .map(|l| {
                serde_json::from_str::<FastObject<'_>>(l)
                    .ok()
                    .map(|e| e.0.into_raw())
            })
            .collect::<Option<Vec<_>>>()
            .map(Ok)
    } else {
        struct Seq(usize);
        impl<'de> serde::de::Visitor<'de> for Seq {
            type Value = (usize, Vec<FastEvent<'de>>);
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of events")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.0));
                let n = crate::json::take_then_check(seq, self.0, |seq| {
                    Ok(seq
                        .next_element::<FastObject<'de>>()?
                        .map(|e| out.push(e.0))
                        .map(|()| true))
                })?;
                Ok((n, out))
            }
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let (n, events) = serde::Deserializer::deserialize_seq(&mut de, Seq(max)).ok()?;
        de.end().ok()?;
        if n > max {
            return Some(Err(n));
        }
        Some(Ok(events.into_iter().map(FastEvent::into_raw).collect()))
    }
}

/// The events of a body: a JSON array, or NDJSON (blank lines ignored).
pub(crate) fn parse_body(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
    match parse_fast(body, ndjson, max) {
        Some(Err(n)) => Err(too_many(max, n)),
        Some(Ok(events)) => events
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.map_err(|e| e.index(i)))
            .collect(),
        None => parse_slow(body, ndjson, max),
    }
}

/// The exact-error path: every event through a JSON value, checked field by field. At most
/// `max` events and [`EVENT_VALUES`] values an event are built; the rest of the body is
/// only checked to be JSON, and counted.
pub(crate) fn parse_slow(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
    if ndjson {
        let text = std::str::from_utf8(body).map_err(|_| malformed("the body is not UTF-8"))?;
        let lines = text.lines().filter(|l| !l.trim().is_empty());
        let n = lines.clone().count();
        if n > max {
            return Err(too_many(max, n));
        }
        return lines
            .enumerate()
            .map(|(i, l)| {
                let v = crate::json::from_str_within(l, EVENT_VALUES)
                    .map_err(|e| malformed(format!("line is not JSON: {e}")).index(i))?
                    .ok_or_else(|| too_big().index(i))?;
                raw_event(&v).map_err(|e| e.index(i))
            })
            .collect();
    }
    /// The body's elements: how many, and the events of the first `max` up to the first
    /// refused one.
    struct Elements<'f> {
        max: usize,
        array: &'f std::cell::Cell<bool>,
    }
    impl<'de> serde::de::Visitor<'de> for Elements<'_> {
        type Value = (usize, Result<Vec<RawEvent>, ApiError>);
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array of events")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            self.array.set(true);
            let mut out = Ok(Vec::new());
            // Events are built up to the first refused one.
            let n = crate::json::take_then_check(seq, self.max, |seq| {
                let left = std::cell::Cell::new(EVENT_VALUES);
                let Some(v) = seq.next_element_seed(crate::json::Budgeted(&left))? else {
                    return Ok(None);
                };
                let read = v.ok_or_else(too_big).and_then(|v| raw_event(&v));
                Ok(Some(match (&mut out, read) {
                    (Ok(events), Ok(e)) => {
                        events.push(e);
                        true
                    }
                    (Ok(events), Err(e)) => {
                        out = Err(e.index(events.len()));
                        false
                    }
                    (Err(_), _) => false,
                }))
            })?;
            Ok((n, out))
        }
    }
    let array = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = serde::Deserializer::deserialize_any(&mut de, Elements { max, array: &array })
        .and_then(|r| de.end().map(|()| r));
    match read {
        Ok((n, _)) if n > max => Err(too_many(max, n)),
        Ok((_, events)) => events,
        Err(e) if array.get() => Err(malformed(format!("the body is not JSON: {e}"))),
        // Not an array: JSON of another shape, or not JSON at all (said as such).
        Err(_) => match crate::json::check(body) {
            Err(e) => Err(malformed(format!("the body is not JSON: {e}"))),
            Ok(_) => Err(malformed(
                "the body is a JSON array of events (or NDJSON with Content-Type: application/x-ndjson)",
            )),
        },
    }
}

/// What kind of JSON value `v` is, for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ns: &str, key: &str, ts: Option<i64>, n: Option<i64>, dims: &[(&str, &str)]) -> RawEvent {
        RawEvent {
            ns: ns.into(),
            key: key.into(),
            ts,
            n,
            dims: dims
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    /// The answer of the public function, checked against the slow path's on the way.
    fn parse(body: &str, ndjson: bool) -> Result<Vec<RawEvent>, ApiError> {
        let got = parse_body(body.as_bytes(), ndjson, 1000);
        if got.is_err() {
            assert_eq!(got, parse_slow(body.as_bytes(), ndjson, 1000), "{body}");
        }
        got
    }

    fn refusal(body: &str, ndjson: bool) -> (ErrorCode, Option<usize>, Option<String>) {
        let e = parse(body, ndjson).unwrap_err();
        (e.code, e.index, e.field)
    }

    #[test]
    fn well_formed_events_take_the_fast_path() {
        let body = r#"[{"ns": "clicks", "key": "a\"b\u00e9", "ts": 1795176000, "n": -2,
            "dims": {"country": "US", "device": "ios"}},
            {"key": "k", "ns": "c", "ts": "2026-11-20T12:00:00Z", "dims": null, "n": null},
            {"ns": "c", "key": "k", "ts": null}]"#;
        assert!(matches!(
            parse_fast(body.as_bytes(), false, 1000),
            Some(Ok(_))
        ));
        assert_eq!(
            parse(body, false).unwrap(),
            [
                ev(
                    "clicks",
                    "a\"bé",
                    Some(1_795_176_000),
                    Some(-2),
                    &[("country", "US"), ("device", "ios")]
                ),
                ev("c", "k", Some(1_795_176_000), None, &[]),
                ev("c", "k", None, None, &[]),
            ]
        );
        assert_eq!(parse("[]", false).unwrap(), []);
    }

    #[test]
    fn ndjson_skips_blank_lines_and_counts_the_others() {
        let body = "\n{\"ns\": \"a\", \"key\": \"1\"}\r\n \t\n\n{\"ns\": \"a\", \"key\": \"2\"}";
        assert_eq!(
            parse(body, true).unwrap(),
            [ev("a", "1", None, None, &[]), ev("a", "2", None, None, &[])]
        );
        let bad = "{\"ns\": \"a\", \"key\": \"1\"}\n\n\n{\"ns\": \"a\", \"key\": 2}\n";
        assert_eq!(
            refusal(bad, true),
            (ErrorCode::MalformedBody, Some(1), Some("key".into()))
        );
        assert_eq!(
            refusal("{\"ns\": \"a\", \"key\": \"1\"}\n{oops}", true),
            (ErrorCode::MalformedBody, Some(1), None)
        );
        let not_utf8 = parse_body(b"{\"ns\": \"a\", \"key\": \"\xff\"}", true, 1000);
        assert_eq!(not_utf8.unwrap_err().message, "the body is not UTF-8");
    }

    #[test]
    fn each_bad_field_has_its_code_field_and_index() {
        let cases: &[(&str, ErrorCode, &str)] = &[
            (r#"{"key": "k"}"#, ErrorCode::MalformedBody, "ns"),
            (r#"{"ns": 5, "key": "k"}"#, ErrorCode::MalformedBody, "ns"),
            (
                r#"{"ns": "a", "key": "k", "extra": 1}"#,
                ErrorCode::MalformedBody,
                "extra",
            ),
            (
                r#"{"ns": "a", "key": "k", "ts": "yesterday"}"#,
                ErrorCode::InvalidTimestamp,
                "ts",
            ),
            (
                r#"{"ns": "a", "key": "k", "ts": 1.5}"#,
                ErrorCode::InvalidTimestamp,
                "ts",
            ),
            (
                r#"{"ns": "a", "key": "k", "ts": true}"#,
                ErrorCode::MalformedBody,
                "ts",
            ),
            (
                r#"{"ns": "a", "key": "k", "n": 1.5}"#,
                ErrorCode::InvalidAmount,
                "n",
            ),
            (
                r#"{"ns": "a", "key": "k", "n": "1"}"#,
                ErrorCode::InvalidAmount,
                "n",
            ),
            (
                r#"{"ns": "a", "key": "k", "dims": {"d": 5}}"#,
                ErrorCode::InvalidDimension,
                "dims",
            ),
            (
                r#"{"ns": "a", "key": "k", "dims": ["d"]}"#,
                ErrorCode::MalformedBody,
                "dims",
            ),
        ];
        for (bad, code, field) in cases {
            let body = format!(r#"[{{"ns": "a", "key": "ok"}}, {bad}]"#);
            assert_eq!(
                refusal(&body, false),
                (*code, Some(1), Some((*field).into())),
                "{body}"
            );
            let lines = format!("{{\"ns\": \"a\", \"key\": \"ok\"}}\n{bad}");
            assert_eq!(
                refusal(&lines, true),
                (*code, Some(1), Some((*field).into())),
                "{lines}"
            );
        }
    }

    #[test]
    fn a_dimension_value_not_a_string_is_named_with_its_kind() {
        for (value, kind) in [("5", "a number"), ("null", "null"), ("[\"x\"]", "an array")] {
            let body = format!(r#"[{{"ns": "a", "key": "k", "dims": {{"c": {value}}}}}]"#);
            let e = parse(&body, false).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidDimension, "{body}");
            assert_eq!(
                e.message,
                format!("dimension \"c\": its value must be a string, got {kind}"),
                "{body}"
            );
        }
    }

    #[test]
    fn a_body_of_the_wrong_shape_has_no_index() {
        for body in ["", "{}", "null", "[", "[{}] x", "{\"events\": []}"] {
            let e = parse(body, false).unwrap_err();
            assert_eq!(
                (e.code, e.index),
                (ErrorCode::MalformedBody, None),
                "{body}"
            );
        }
        assert_eq!(
            refusal("[5]", false),
            (ErrorCode::MalformedBody, Some(0), None)
        );
    }

    #[test]
    fn an_array_is_not_an_event() {
        // Found by fuzz/events_body: the fast path took `["ns", "key"]` as an event.
        for (body, ndjson) in [
            (r#"[["clicks", "k"]]"#, false),
            (r#"[": s5" ,"n[[f"]"#, true),
        ] {
            assert!(
                parse_fast(body.as_bytes(), ndjson, 1000).is_none(),
                "{body}"
            );
            assert_eq!(
                refusal(body, ndjson),
                (ErrorCode::MalformedBody, Some(0), None),
                "{body}"
            );
        }
    }

    /// A small body cannot make a large value tree, nor a long search: what an event can be
    /// bounds what is built of it, and the events past `max` are only counted.
    #[test]
    fn what_a_body_builds_is_bounded_by_what_an_event_can_be() {
        let values = |n: usize| vec!["0"; n].join(",");
        // An event that is one huge array, alone or inside a field.
        for body in [
            format!("[[{}]]", values(200_000)),
            format!(r#"[{{"ns": "a", "key": [{}]}}]"#, values(200_000)),
        ] {
            let e = parse_body(body.as_bytes(), false, 1000).unwrap_err();
            assert_eq!(
                (e.code, e.index),
                (ErrorCode::MalformedBody, Some(0)),
                "{e:?}"
            );
            assert!(
                e.message.contains("at most 256 JSON values"),
                "{}",
                e.message
            );
        }
        // 200 000 dimensions: the fast path stops at 16, the slow one at 256 values.
        let dims: Vec<String> = (0..200_000).map(|i| format!(r#""d{i}": "v""#)).collect();
        let body = format!(
            r#"{{"ns": "a", "key": "k", "dims": {{{}}}}}"#,
            dims.join(", ")
        );
        for ndjson in [false, true] {
            let body = if ndjson {
                body.clone()
            } else {
                format!("[{body}]")
            };
            assert!(parse_fast(body.as_bytes(), ndjson, 1000).is_none());
            let e = parse_body(body.as_bytes(), ndjson, 1000).unwrap_err();
            assert_eq!(
                (e.code, e.index),
                (ErrorCode::MalformedBody, Some(0)),
                "{e:?}"
            );
        }
        // Seventeen dimensions are read (validation names the error), as before.
        let dims: Vec<String> = (0..17).map(|i| format!(r#""d{i}": "v""#)).collect();
        let body = format!(
            r#"[{{"ns": "a", "key": "k", "dims": {{{}}}}}]"#,
            dims.join(", ")
        );
        assert_eq!(
            parse_body(body.as_bytes(), false, 1000).unwrap()[0]
                .dims
                .len(),
            17
        );
        // 300 000 events where 2 are taken: counted, not read, by either path.
        for body in [
            format!("[{}]", values(300_000)),
            format!("[{}]", vec!["{}"; 300_000].join(",")),
        ] {
            assert!(matches!(
                parse_fast(body.as_bytes(), false, 2),
                Some(Err(300_000)) | None
            ));
            for e in [
                parse_body(body.as_bytes(), false, 2),
                parse_slow(body.as_bytes(), false, 2),
            ] {
                let e = e.unwrap_err();
                assert_eq!(e.message, "a batch holds at most 2 events, got 300000");
            }
        }
    }

    /// Found by fuzz/events_body: once an event is refused, the rest of the body is still
    /// read as a value tree would read it (serde's `IgnoredAny` let invalid UTF-8 through),
    /// so a body that is not JSON is said to be so, not refused for its first event.
    #[test]
    fn the_rest_of_a_body_after_a_bad_event_is_still_checked() {
        let mut body =
            br#"[{"ns":"c","key":"k","ts":"202w-11-20T17:30:00Z"},{"ns":"c","ke"#.to_vec();
        body.extend_from_slice(b"\xdd\xc5\"");
        body.extend_from_slice(br#":null}]"#);
        for e in [
            parse_body(&body, false, 1000),
            parse_slow(&body, false, 1000),
        ] {
            let e = e.unwrap_err();
            assert_eq!((e.code, e.index), (ErrorCode::MalformedBody, None), "{e:?}");
            assert!(
                e.message.starts_with("the body is not JSON"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn too_many_events_are_counted_before_any_is_checked() {
        let body = r#"[{"ns": "a", "key": "k"}, {"ns": "a", "key": "k", "ts": "no"}, 5]"#;
        for (body, ndjson) in [(body, false), ("{}\n\n{}\n{}", true)] {
            let e = parse_body(body.as_bytes(), ndjson, 2).unwrap_err();
            assert_eq!((e.code, e.index), (ErrorCode::BatchTooLarge, None));
            assert_eq!(e.message, "a batch holds at most 2 events, got 3");
        }
    }

    #[test]
    fn a_repeated_name_is_never_last_wins() {
        // A repeated field or dimension: the fast path cannot read the body, and the slow
        // path refuses it, naming the name (and, in NDJSON, the line's index).
        for (event, name) in [
            (r#"{"ns": "a", "key": "k", "ns": "b"}"#, "ns"),
            (
                r#"{"ns": "a", "key": "k", "dims": {"d": "1", "e": "x", "d": "2"}}"#,
                "d",
            ),
        ] {
            for ndjson in [false, true] {
                let body = if ndjson {
                    format!("{{\"ns\": \"a\", \"key\": \"k\"}}\n{event}")
                } else {
                    format!("[{{\"ns\": \"a\", \"key\": \"k\"}}, {event}]")
                };
                assert!(parse_fast(body.as_bytes(), ndjson, 1000).is_none());
                let e = parse(&body, ndjson).unwrap_err();
                assert_eq!(e.code, ErrorCode::MalformedBody);
                let twice = format!("{name:?} appears twice");
                assert!(e.message.contains(&twice), "{}", e.message);
                assert_eq!(e.index, ndjson.then_some(1));
            }
        }
    }
}

/// The fast and the slow path against each other, on generated bodies.
///
/// [`parse_body`] takes the fast path's answer whenever that path can read the whole body,
/// and the slow path's otherwise. So the property is:
/// - when the fast path accepts (every event read, none refused, not too many), the public
///   answer is its events, and the slow path accepts the same events;
/// - when the fast path reads the body but refuses it (a timestamp it cannot parse, too many
///   events), the slow path refuses it too, and the public error is the slow path's: same
///   code, index, field and message;
/// - when the fast path cannot read the body, the public answer is the slow path's, whatever
///   it is.
///
/// So whenever either path refuses, the public error is the one the slow path names.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    /// Timestamps the fast path must read as text and `parse_timestamp` accepts.
    const GOOD_TS: [&str; 5] = [
        "2026-11-20T12:00:00Z",
        "2026-11-20T17:30:00+05:30",
        "1795176000",
        "0",
        "2106-02-06T23:59:59Z",
    ];

    /// Timestamp strings that are JSON strings but no timestamp.
    const BAD_TS: [&str; 9] = [
        r#""yesterday""#,
        r#""""#,
        r#""99999999999999999999""#,
        r#""-1""#,
        r#""2106-02-07T00:00:00Z""#,
        r#""2026-11-20 12:00""#,
        r#""\u0031\u0032x""#,
        r#"" 0 ""#,
        r#""2026-11-20T12:00:00+24:00""#,
    ];

    /// JSON values that are wrong for some field, or right for one and wrong for others.
    const ODD_VALUES: [&str; 28] = [
        "5",
        "-0",
        "1.5",
        "1e3",
        "18446744073709551615",
        "9223372036854775808",
        "-9223372036854775809",
        "null",
        "true",
        r#""yesterday""#,
        r#""""#,
        r#""99999999999999999999""#,
        r#"" 12 ""#,
        r#""2026-11-20T12:00:00Z""#,
        r#""\u00e9""#,
        "[]",
        r#"["a"]"#,
        "{}",
        r#"{"a": 5}"#,
        r#"{"a": null}"#,
        r#"{"a": "x", "a": "y"}"#,
        r#"{"a": "x", "b": "y"}"#,
        r#"{"a": ["x"]}"#,
        r#""\ud800""#,
        "tru",
        r#""unterminated"#,
        r#"{"a": "x""#,
        "01",
    ];

    /// Whole events that are not an event object.
    const NOT_EVENTS: [&str; 7] = ["5", r#""x""#, "null", "[]", "[{}]", "{}", r#"{"ns": "a""#];

    const FIELDS: [&str; 5] = ["ns", "key", "ts", "n", "dims"];

    /// A JSON string literal for `s`: plain, or every character as a `\u` escape, so that
    /// the fast path meets both borrowed and owned strings.
    fn quote(s: &str, escape: bool) -> String {
        if !escape {
            return serde_json::to_string(s).unwrap();
        }
        let mut out = String::from("\"");
        for u in s.encode_utf16() {
            out.push_str(&format!("\\u{u:04x}"));
        }
        out.push('"');
        out
    }

    /// A name or value: short, sometimes with quotes, backslashes, controls, non-ASCII.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z][a-z0-9_]{0,5}",
            "[ -~]{0,4}",
            "[\\x00-\\x1f\"\\\\/é€😀 ]{0,3}",
        ]
    }

    /// An event as `(field name literal, value literal)` pieces, and what it means.
    #[derive(Debug, Clone)]
    struct Event {
        pieces: Vec<(String, String)>,
        means: RawEvent,
    }

    impl Event {
        fn render(&self) -> String {
            let fields: Vec<String> = self
                .pieces
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
    }

    fn good_ts() -> impl Strategy<Value = Option<(String, Option<i64>)>> {
        prop_oneof![
            Just(None),
            Just(Some(("null".to_owned(), None))),
            any::<i64>().prop_map(|t| Some((t.to_string(), Some(t)))),
            (prop::sample::select(&GOOD_TS[..]), any::<bool>()).prop_map(|(t, e)| {
                Some((quote(t, e), Some(model::parse_timestamp(t).unwrap())))
            }),
        ]
    }

    fn good_n() -> impl Strategy<Value = Option<(String, Option<i64>)>> {
        prop_oneof![
            Just(None),
            Just(Some(("null".to_owned(), None))),
            any::<i64>().prop_map(|n| Some((n.to_string(), Some(n)))),
        ]
    }

    fn good_dims() -> impl Strategy<Value = Option<(String, Vec<(String, String)>)>> {
        let map = prop::collection::btree_map(text(), (text(), any::<bool>()), 0..4);
        prop_oneof![
            Just(None),
            Just(Some(("null".to_owned(), Vec::new()))),
            (map, any::<bool>()).prop_map(|(m, escape_names)| {
                let lit: Vec<String> = m
                    .iter()
                    .map(|(k, (v, e))| format!("{}: {}", quote(k, escape_names), quote(v, *e)))
                    .collect();
                let dims = m.into_iter().map(|(k, (v, _))| (k, v)).collect();
                Some((format!("{{{}}}", lit.join(", ")), dims))
            }),
        ]
    }

    /// A well-formed event in any field order, field names sometimes escaped.
    fn good_event() -> impl Strategy<Value = Event> {
        (
            (text(), any::<bool>()),
            (text(), any::<bool>()),
            good_ts(),
            good_n(),
            good_dims(),
            any::<bool>(),
        )
            .prop_flat_map(|((ns, ens), (key, ekey), ts, n, dims, escape_names)| {
                let name = |f: &str| quote(f, escape_names);
                let mut pieces = vec![
                    (name("ns"), quote(&ns, ens)),
                    (name("key"), quote(&key, ekey)),
                ];
                let mut means = RawEvent {
                    ns,
                    key,
                    ..RawEvent::default()
                };
                if let Some((lit, t)) = ts {
                    pieces.push((name("ts"), lit));
                    means.ts = t;
                }
                if let Some((lit, n)) = n {
                    pieces.push((name("n"), lit));
                    means.n = n;
                }
                if let Some((lit, d)) = dims {
                    pieces.push((name("dims"), lit));
                    means.dims = d;
                }
                Just(pieces).prop_shuffle().prop_map(move |pieces| Event {
                    pieces,
                    means: means.clone(),
                })
            })
    }

    /// What turns a good event into a near-valid or invalid one.
    #[derive(Debug, Clone)]
    enum Change {
        /// A field (added if absent) takes an odd value.
        Set(&'static str, &'static str),
        Remove(&'static str),
        /// A timestamp string the fast path reads and `parse_timestamp` refuses.
        BadTs(&'static str),
        /// A field the event does not have.
        Unknown(&'static str),
        /// A field given a second time.
        Repeat(&'static str, &'static str),
        /// A dimension named twice.
        RepeatDim,
        NotAnEvent(&'static str),
    }

    fn change() -> impl Strategy<Value = Change> {
        let field = || prop::sample::select(&FIELDS[..]);
        let odd = || prop::sample::select(&ODD_VALUES[..]);
        prop_oneof![
            4 => (field(), odd()).prop_map(|(f, v)| Change::Set(f, v)),
            2 => prop::sample::select(&BAD_TS[..]).prop_map(Change::BadTs),
            1 => field().prop_map(Change::Remove),
            1 => prop::sample::select(&[r#""extra""#, r#""NS""#, r#""dims ""#, r#""""#][..])
                .prop_map(Change::Unknown),
            1 => (field(), odd()).prop_map(|(f, v)| Change::Repeat(f, v)),
            1 => Just(Change::RepeatDim),
            1 => prop::sample::select(&NOT_EVENTS[..]).prop_map(Change::NotAnEvent),
        ]
    }

    fn changed(mut e: Event, c: &Change) -> String {
        let is = |k: &str, f: &str| serde_json::from_str::<String>(k).is_ok_and(|k| k == f);
        match c {
            Change::Set(f, v) => match e.pieces.iter_mut().find(|(k, _)| is(k, f)) {
                Some(p) => p.1 = (*v).to_owned(),
                None => e.pieces.push((quote(f, false), (*v).to_owned())),
            },
            Change::BadTs(t) => return changed(e, &Change::Set("ts", t)),
            Change::Remove(f) => e.pieces.retain(|(k, _)| !is(k, f)),
            Change::Unknown(k) => e.pieces.insert(0, ((*k).to_owned(), "1".to_owned())),
            Change::Repeat(f, v) => e.pieces.push((quote(f, false), (*v).to_owned())),
            Change::RepeatDim => e.pieces.push((
                quote("dims", false),
                r#"{"d": "1", "e": "x", "d": "2"}"#.to_owned(),
            )),
            Change::NotAnEvent(t) => return (*t).to_owned(),
        }
        e.render()
    }

    /// Good events, some of them changed: at any index, one or several.
    fn events() -> impl Strategy<Value = Vec<String>> {
        (
            prop::collection::vec(good_event(), 1..6),
            prop::collection::vec((any::<prop::sample::Index>(), change()), 0..3),
        )
            .prop_map(|(good, changes)| {
                let mut out: Vec<String> = good.iter().map(Event::render).collect();
                if !good.is_empty() {
                    for (i, c) in changes {
                        let i = i.index(good.len());
                        out[i] = changed(good[i].clone(), &c);
                    }
                }
                out
            })
    }

    /// What may happen to a whole body.
    #[derive(Debug, Clone)]
    enum Damage {
        None,
        /// Cut at this fraction of its length (in 1/256ths).
        Truncate(u8),
        /// A byte that cannot appear in UTF-8, at this fraction.
        NotUtf8(u8),
        Append(&'static str),
        /// The events in an object, not an array (JSON only).
        Wrapped,
        Replaced(&'static str),
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            12 => Just(Damage::None),
            1 => any::<u8>().prop_map(Damage::Truncate),
            1 => any::<u8>().prop_map(Damage::NotUtf8),
            1 => prop::sample::select(&[" x", "]", "\n{}", "\n\n", "\n  ", ",{}"][..])
                .prop_map(Damage::Append),
            1 => Just(Damage::Wrapped),
            1 => prop::sample::select(&["", " ", "null", "{}", "[", "]", "\n"][..])
                .prop_map(Damage::Replaced),
        ]
    }

    /// NDJSON line breaks, with blank and whitespace-only lines among them.
    const BREAKS: [&str; 5] = ["\n", "\r\n", "\n\n", "\n \t\n", "\r\n\r\n"];

    fn assemble(events: &[String], ndjson: bool, breaks: &[usize], d: &Damage) -> Vec<u8> {
        let mut body = if ndjson {
            let mut s = String::new();
            for (i, e) in events.iter().enumerate() {
                s.push_str(e);
                s.push_str(BREAKS[breaks[i % breaks.len()]]);
            }
            s
        } else {
            let sep = if breaks[0].is_multiple_of(2) {
                ","
            } else {
                ",\n "
            };
            format!("[{}]", events.join(sep))
        };
        let at = |f: u8, len: usize| len * usize::from(f) / 256;
        match d {
            Damage::None => {}
            Damage::Truncate(f) => {
                let mut cut = at(*f, body.len());
                while !body.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.truncate(cut);
            }
            Damage::NotUtf8(f) => {
                let mut bytes = body.into_bytes();
                bytes.insert(at(*f, bytes.len()), 0xff);
                return bytes;
            }
            Damage::Append(t) => body.push_str(t),
            Damage::Wrapped if !ndjson => body = format!(r#"{{"events": {body}}}"#),
            Damage::Wrapped => {}
            Damage::Replaced(t) => body = (*t).to_owned(),
        }
        body.into_bytes()
    }

    /// Whether an event names a dimension twice (neither path reads such a body).
    fn repeats_a_dimension(e: &RawEvent) -> bool {
        e.dims
            .iter()
            .enumerate()
            .any(|(i, (k, _))| e.dims[..i].iter().any(|(seen, _)| seen == k))
    }

    fn check(body: &[u8], ndjson: bool, max: usize) -> Result<(), TestCaseError> {
        let public = parse_body(body, ndjson, max);
        let slow = parse_slow(body, ndjson, max);
        match parse_fast(body, ndjson, max) {
            Some(Ok(fast)) if fast.iter().all(Result::is_ok) => {
                let fast: Vec<RawEvent> = fast.into_iter().flatten().collect();
                prop_assert_eq!(public.as_ref().ok(), Some(&fast));
                prop_assert!(!fast.iter().any(repeats_a_dimension));
                prop_assert_eq!(
                    slow,
                    Ok(fast),
                    "the slow path refused what the fast path took"
                );
            }
            Some(_) => {
                // Read, but refused: an event's timestamp, or too many events.
                let (Err(p), Err(s)) = (&public, &slow) else {
                    return Err(TestCaseError::fail(format!(
                        "the fast path refused; public {public:?}, slow {slow:?}"
                    )));
                };
                prop_assert_eq!((p.code, p.index), (s.code, s.index));
                prop_assert_eq!(p, s);
            }
            // Not read: the slow path's answer, refusal or not, is the answer.
            None => prop_assert_eq!(public, slow),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn fast_and_slow_paths_agree(
            events in events(),
            ndjson in any::<bool>(),
            breaks in prop::collection::vec(0..BREAKS.len(), 1..4),
            damage in damage(),
            max in prop_oneof![3 => Just(1000usize), 1 => 1usize..5],
        ) {
            check(&assemble(&events, ndjson, &breaks, &damage), ndjson, max)?;
        }

        #[test]
        fn good_bodies_give_their_events_by_both_paths(
            events in prop::collection::vec(good_event(), 0..6),
            ndjson in any::<bool>(),
            breaks in prop::collection::vec(0..BREAKS.len(), 1..4),
        ) {
            let text: Vec<String> = events.iter().map(Event::render).collect();
            let body = assemble(&text, ndjson, &breaks, &Damage::None);
            let means: Vec<RawEvent> = events.into_iter().map(|e| e.means).collect();
            prop_assert!(matches!(parse_fast(&body, ndjson, 1000), Some(Ok(_))), "the fast path could not read it");
            prop_assert_eq!(parse_body(&body, ndjson, 1000), Ok(means.clone()));
            prop_assert_eq!(parse_slow(&body, ndjson, 1000), Ok(means));
        }
    }
}

//! The events of a `POST /v1/events` body, a JSON array or NDJSON (blank lines ignored),
//! into `RawEvent`s — or the exact error code and 0-based index of the first bad event.
//!
//! Two parsers, combined in [`parse_body`]: the fast one deserialises well-formed events
//! straight from the bytes into borrowed strings, with no JSON value tree; a body it cannot
//! take goes to the slow one, which walks a JSON value field by field to name the exact
//! error. So a bad body is parsed twice and a good one once.

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
            ApiError::new(
                ErrorCode::InvalidTimestamp,
                format!("ts {n} is not whole unix seconds"),
            )
            .field("ts")
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
                _ => Err(ApiError::new(
                    ErrorCode::InvalidDimension,
                    format!("dimension {k:?}: a value is a string"),
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

struct FastDims<'a>(Vec<(std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>)>);

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
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(2));
                while let Some(kv) = m.next_entry()? {
                    out.push(kv);
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

/// The fast path over a whole body; `None` sends the body to the exact-error path.
fn parse_fast(body: &[u8], ndjson: bool) -> Option<Vec<Result<RawEvent, ApiError>>> {
    if ndjson {
        let text = std::str::from_utf8(body).ok()?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<FastEvent<'_>>(l)
                    .ok()
                    .map(FastEvent::into_raw)
            })
            .collect()
    } else {
        let events: Vec<FastEvent<'_>> = serde_json::from_slice(body).ok()?;
        Some(events.into_iter().map(FastEvent::into_raw).collect())
    }
}

/// The events of a body: a JSON array, or NDJSON (blank lines ignored).
pub(super) fn parse_body(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
    if let Some(events) = parse_fast(body, ndjson) {
        if events.len() > max {
            return Err(ApiError::new(
                ErrorCode::BatchTooLarge,
                format!("a batch holds at most {max} events, got {}", events.len()),
            ));
        }
        return events
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.map_err(|e| e.index(i)))
            .collect();
    }
    parse_slow(body, ndjson, max)
}

/// The exact-error path: every event through a JSON value, checked field by field.
fn parse_slow(body: &[u8], ndjson: bool, max: usize) -> Result<Vec<RawEvent>, ApiError> {
    let too_many = |n: usize| {
        ApiError::new(
            ErrorCode::BatchTooLarge,
            format!("a batch holds at most {max} events, got {n}"),
        )
    };
    if ndjson {
        let text = std::str::from_utf8(body).map_err(|_| malformed("the body is not UTF-8"))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.len() > max {
            return Err(too_many(lines.len()));
        }
        return lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let v: Value = serde_json::from_str(l)
                    .map_err(|e| malformed(format!("line is not JSON: {e}")).index(i))?;
                raw_event(&v).map_err(|e| e.index(i))
            })
            .collect();
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| malformed(format!("the body is not JSON: {e}")))?;
    let items = v.as_array().ok_or_else(|| malformed("the body is a JSON array of events (or NDJSON with Content-Type: application/x-ndjson)"))?;
    if items.len() > max {
        return Err(too_many(items.len()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| raw_event(v).map_err(|e| e.index(i)))
        .collect()
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
        assert!(parse_fast(body.as_bytes(), false).is_some());
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
    fn too_many_events_are_counted_before_any_is_checked() {
        let body = r#"[{"ns": "a", "key": "k"}, {"ns": "a", "key": "k", "ts": "no"}, 5]"#;
        for (body, ndjson) in [(body, false), ("{}\n\n{}\n{}", true)] {
            let e = parse_body(body.as_bytes(), ndjson, 2).unwrap_err();
            assert_eq!((e.code, e.index), (ErrorCode::BatchTooLarge, None));
            assert_eq!(e.message, "a batch holds at most 2 events, got 3");
        }
    }

    #[test]
    fn repeated_names_part_the_two_paths() {
        // A repeated dimension: the fast path keeps both (ingest then refuses the event), the
        // slow path's JSON object keeps the last value. A repeated field: the fast path
        // refuses, so the slow path answers, keeping the last value.
        let dims = r#"[{"ns": "a", "key": "k", "dims": {"d": "1", "d": "2"}}]"#;
        assert_eq!(
            parse(dims, false).unwrap(),
            [ev("a", "k", None, None, &[("d", "1"), ("d", "2")])]
        );
        assert_eq!(
            parse_slow(dims.as_bytes(), false, 1000).unwrap(),
            [ev("a", "k", None, None, &[("d", "2")])]
        );
        let field = r#"[{"ns": "a", "key": "k", "ns": "b"}]"#;
        assert!(parse_fast(field.as_bytes(), false).is_none());
        assert_eq!(
            parse(field, false).unwrap(),
            [ev("b", "k", None, None, &[])]
        );
    }
}

//! The answers of SPEC §3: serialisable (the server's wire form) and deserialisable (what
//! clients such as the CLI read back). Field order is the wire order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::Tz;

/// The effective range every calendar answer carries: each end as unix seconds and as
/// RFC 3339 in the query's zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub from: i64,
    pub from_t: String,
    pub to: i64,
    pub to_t: String,
}

impl Span {
    pub fn new(from: i64, to: i64, tz: &Tz) -> Span {
        Span {
            from,
            from_t: tz.rfc3339(from),
            to,
            to_t: tz.rfc3339(to),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub ts: i64,
    pub t: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesAnswer {
    pub ns: String,
    pub key: String,
    pub unit: String,
    pub every: u32,
    pub tz: String,
    pub resolution: String,
    pub dim: Option<String>,
    pub value: Option<String>,
    #[serde(flatten)]
    pub span: Span,
    pub total: i64,
    pub points: Vec<Point>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueCount {
    pub value: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakdownAnswer {
    pub ns: String,
    pub key: String,
    pub dim: String,
    pub resolution: String,
    #[serde(flatten)]
    pub span: Span,
    pub total: i64,
    pub values: Vec<ValueCount>,
    pub other: i64,
    pub unset: i64,
}

/// A rolling window's count: the body of a `window` answer, and the `window` of an `incr`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCount {
    pub last: String,
    pub resolution: String,
    pub from: i64,
    pub from_t: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowAnswer {
    pub ns: String,
    pub key: String,
    #[serde(flatten)]
    pub window: WindowCount,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DashboardAnswer {
    pub ns: String,
    pub key: String,
    pub unit: String,
    pub every: u32,
    pub tz: String,
    pub resolution: String,
    pub dim: Option<String>,
    pub value: Option<String>,
    #[serde(flatten)]
    pub span: Span,
    pub total: i64,
    pub timeline: Vec<Point>,
    pub breakdowns: BTreeMap<String, BreakdownAnswer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCount {
    pub key: String,
    pub n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopAnswer {
    pub ns: String,
    pub dim: Option<String>,
    pub value: Option<String>,
    pub resolution: String,
    #[serde(flatten)]
    pub span: Span,
    pub total: i64,
    pub keys: Vec<KeyCount>,
    pub other: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysAnswer {
    pub ns: String,
    pub keys: Vec<String>,
    pub next: Option<String>,
}

/// `POST /v1/events` and `incr`: how many events were accepted, and for `incr?window=` the
/// window after the increment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub accepted: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowCount>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire order is part of the format (SPEC §3 shows it); flattening keeps it.
    #[test]
    fn answers_keep_the_wire_order_and_read_back() {
        let a = BreakdownAnswer {
            ns: "clicks".into(),
            key: "k".into(),
            dim: "country".into(),
            resolution: "1h".into(),
            span: Span::new(0, 3600, &Tz::utc()),
            total: 3,
            values: vec![ValueCount {
                value: "US".into(),
                n: 2,
            }],
            other: 0,
            unset: 1,
        };
        let json = serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(
            json,
            r#"{"ns":"clicks","key":"k","dim":"country","resolution":"1h","from":0,"from_t":"1970-01-01T00:00:00+00:00","to":3600,"to_t":"1970-01-01T01:00:00+00:00","total":3,"values":[{"value":"US","n":2}],"other":0,"unset":1}"#
        );
        let back: BreakdownAnswer = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, a);

        let w = Accepted {
            accepted: 1,
            window: None,
        };
        assert_eq!(
            serde_json::to_string(&w).unwrap_or_default(),
            r#"{"accepted":1}"#
        );
    }
}

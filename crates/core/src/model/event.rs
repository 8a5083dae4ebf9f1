//! Events: amounts, timestamps (unix seconds or RFC 3339) and the raw → validated event.

use super::{
    AMOUNT_LIMIT, DimName, DimValue, Key, MAX_DIMS_PER_EVENT, MAX_TS, MIN_TS, ModelError, Namespace,
};

/// An amount as given: checked for `|n| < 2^53`.
pub fn amount(n: i64) -> Result<i64, ModelError> {
    if n.checked_abs().is_some_and(|a| a < AMOUNT_LIMIT) {
        Ok(n)
    } else {
        Err(ModelError::InvalidAmount { got: n.to_string() })
    }
}

/// Checks a unix-seconds timestamp against the accepted range.
pub fn timestamp(ts: i64) -> Result<i64, ModelError> {
    if (MIN_TS..MAX_TS).contains(&ts) {
        Ok(ts)
    } else {
        Err(ModelError::InvalidTimestamp {
            got: ts.to_string(),
            why: "outside 1970-01-01T00:00:00Z .. 2106-02-07T06:28:16Z",
        })
    }
}

/// Parses unix seconds (`1790827200`) or RFC 3339 (`2026-10-01T00:00:00-04:00`; a fraction
/// of a second is floored).
pub fn parse_timestamp(s: &str) -> Result<i64, ModelError> {
    let s = s.trim();
    if !s.is_empty()
        && s.bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
    {
        let ts: i64 = s.parse().map_err(|_| ModelError::InvalidTimestamp {
            got: s.to_owned(),
            why: "the number is too large",
        })?;
        return timestamp(ts);
    }
    let parsed: jiff::Timestamp = s.parse().map_err(|_| ModelError::InvalidTimestamp {
        got: s.to_owned(),
        why: "expected unix seconds or RFC 3339 like 2026-10-01T00:00:00Z",
    })?;
    timestamp(parsed.as_second())
}

/// An increment as a client sends it, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawEvent {
    pub ns: String,
    pub key: String,
    /// `None` = now.
    pub ts: Option<i64>,
    /// `None` = 1.
    pub n: Option<i64>,
    pub dims: Vec<(String, String)>,
}

/// A validated event: `(ns, key, ts, n, dims)` with dims sorted by name and unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub ns: Namespace,
    pub key: Key,
    pub ts: i64,
    pub n: i64,
    pub dims: Vec<(DimName, DimValue)>,
}

impl Event {
    /// As [`Event::validate`], moving the raw event's strings instead of copying them.
    pub fn validate_owned(
        raw: RawEvent,
        now: i64,
        max_future_secs: i64,
    ) -> Result<Self, ModelError> {
        let ns = Namespace::from_string(raw.ns)?;
        let key = Key::from_string(raw.key)?;
        let ts = timestamp(raw.ts.unwrap_or(now))?;
        if ts > now.saturating_add(max_future_secs) {
            return Err(ModelError::TimestampInFuture {
                ts,
                max_future_secs,
            });
        }
        let n = amount(raw.n.unwrap_or(1))?;
        if raw.dims.len() > MAX_DIMS_PER_EVENT {
            return Err(ModelError::TooManyDimensions {
                got: raw.dims.len(),
            });
        }
        let mut dims = raw
            .dims
            .into_iter()
            .map(|(n, v)| Ok((DimName::from_string(n)?, DimValue::from_string(v)?)))
            .collect::<Result<Vec<_>, ModelError>>()?;
        dims.sort_unstable();
        if let Some(w) = dims.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(ModelError::InvalidDimension {
                what: format!("name {:?}", w[0].0.as_str()),
                why: "it is given twice".into(),
            });
        }
        Ok(Event {
            ns,
            key,
            ts,
            n,
            dims,
        })
    }

    /// Validates every field of a raw event; `now` fills a missing `ts` and bounds the future.
    pub fn validate(raw: &RawEvent, now: i64, max_future_secs: i64) -> Result<Self, ModelError> {
        Event::validate_owned(raw.clone(), now, max_future_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn event_validation() {
        let base = RawEvent {
            ns: "clicks".into(),
            key: "k".into(),
            ..RawEvent::default()
        };
        let e = Event::validate(&base, 5000, 3600).unwrap();
        assert_eq!((e.ts, e.n), (5000, 1));
        let code = |raw: RawEvent| Event::validate(&raw, 5000, 3600).unwrap_err().code();
        assert_eq!(
            code(RawEvent {
                ts: Some(8601),
                ..base.clone()
            }),
            ErrorCode::TimestampInFuture
        );
        assert!(
            Event::validate(
                &RawEvent {
                    ts: Some(8600),
                    ..base.clone()
                },
                5000,
                3600
            )
            .is_ok()
        );
        assert_eq!(
            code(RawEvent {
                ts: Some(-1),
                ..base.clone()
            }),
            ErrorCode::InvalidTimestamp
        );
        assert_eq!(
            code(RawEvent {
                n: Some(1 << 53),
                ..base.clone()
            }),
            ErrorCode::InvalidAmount
        );
        assert_eq!(
            code(RawEvent {
                n: Some(i64::MIN),
                ..base.clone()
            }),
            ErrorCode::InvalidAmount
        );
        assert!(
            Event::validate(
                &RawEvent {
                    n: Some(-(1 << 53) + 1),
                    ..base.clone()
                },
                5000,
                0
            )
            .is_ok()
        );
        assert!(
            Event::validate(
                &RawEvent {
                    n: Some(0),
                    ..base.clone()
                },
                5000,
                0
            )
            .is_ok()
        );
        let many = (0..17).map(|i| (format!("d{i}"), "v".to_owned())).collect();
        assert_eq!(
            code(RawEvent {
                dims: many,
                ..base.clone()
            }),
            ErrorCode::TooManyDimensions
        );
        let twice = vec![("a".into(), "1".into()), ("a".into(), "2".into())];
        assert_eq!(
            code(RawEvent {
                dims: twice,
                ..base.clone()
            }),
            ErrorCode::InvalidDimension
        );
        assert_eq!(
            code(RawEvent {
                ns: "A".into(),
                ..base.clone()
            }),
            ErrorCode::InvalidName
        );
        assert_eq!(
            code(RawEvent {
                key: "".into(),
                ..base
            }),
            ErrorCode::InvalidKey
        );
    }

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_timestamp("1790827200").unwrap(), 1_790_827_200);
        assert_eq!(
            parse_timestamp("2026-10-01T00:00:00-04:00").unwrap(),
            1_790_827_200
        );
        assert_eq!(
            parse_timestamp("2026-10-01T04:00:00.9Z").unwrap(),
            1_790_827_200
        );
        for bad in [
            "",
            "yesterday",
            "2026-10-01",
            "-5",
            "1e9",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_timestamp(bad).unwrap_err().code(),
                ErrorCode::InvalidTimestamp,
                "{bad}"
            );
        }
    }
}

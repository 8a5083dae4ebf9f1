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

/// Why an event's time is refused: outside the accepted range.
const EVENT_RANGE: &str =
    "outside 1970-01-01T00:00:00Z .. 2106-02-07T00:00:00Z (an event's time is before the end)";

/// Why a range's end is refused. A range may end where time does (it is half-open): an
/// answer whose unit ceils its end can say `2106-02-07T00:00:00Z`, and that must read back.
const END_RANGE: &str =
    "outside 1970-01-01T00:00:00Z .. 2106-02-07T00:00:00Z (a range may end at the end)";

/// Checks a unix-seconds timestamp against the accepted range.
pub fn timestamp(ts: i64) -> Result<i64, ModelError> {
    if (MIN_TS..MAX_TS).contains(&ts) {
        Ok(ts)
    } else {
        Err(ModelError::InvalidTimestamp {
            got: ts.to_string(),
            why: EVENT_RANGE,
        })
    }
}

/// Parses unix seconds (`1790827200`) or RFC 3339 (`2026-10-01T00:00:00-04:00`; a fraction
/// of a second is floored: an event is counted in its second).
pub fn parse_timestamp(s: &str) -> Result<i64, ModelError> {
    let out_of_range = || ModelError::InvalidTimestamp {
        got: s.to_owned(),
        why: EVENT_RANGE,
    };
    match parse_instant(s) {
        // The end of time ends a range; no event is counted in it.
        Ok((MAX_TS, _)) => Err(out_of_range()),
        Ok((secs, _)) => Ok(secs),
        // Past the end or before the start: said as an event's rule, not a range's.
        Err(ModelError::InvalidTimestamp { why: END_RANGE, .. }) => Err(out_of_range()),
        Err(e) => Err(e),
    }
}

/// As [`parse_timestamp`], for a range's end (the end of accepted time accepted too: a range
/// is half-open), with the fraction of a second kept: the whole seconds (floored) and the
/// nanoseconds past them. A range's ends need it: events are counted by the whole
/// second, so `[from, to)` holds the second `s` exactly when `from` ≤ `s` < `to`, which a
/// fraction floored away would change.
pub fn parse_instant(s: &str) -> Result<(i64, u32), ModelError> {
    if !s.is_empty()
        && s.bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
    {
        let ts: i64 = s.parse().map_err(|_| ModelError::InvalidTimestamp {
            got: s.to_owned(),
            why: "the number is too large",
        })?;
        return Ok((range_end(ts, 0)?, 0));
    }
    let bad = |why| ModelError::InvalidTimestamp {
        got: s.to_owned(),
        why,
    };
    rfc3339_shape(s.as_bytes()).map_err(bad)?;
    let parsed: jiff::Timestamp = s
        .parse()
        .map_err(|_| bad("not a date and time of the calendar (RFC 3339)"))?;
    // Whole seconds floored (jiff truncates toward zero: -0.5 s has -500 000 000 ns).
    let (mut secs, mut nanos) = (parsed.as_second(), parsed.subsec_nanosecond());
    if nanos < 0 {
        secs -= 1;
        nanos += 1_000_000_000;
    }
    // Out of range, the error quotes what was written, not the seconds it means.
    let nanos = nanos.unsigned_abs();
    let secs = range_end(secs, nanos).map_err(|e| match e {
        ModelError::InvalidTimestamp { why, .. } => bad(why),
        other => other,
    })?;
    Ok((secs, nanos))
}

/// Checks the whole seconds and nanoseconds of a range's end: inside the accepted range,
/// or the end of it exactly.
fn range_end(secs: i64, nanos: u32) -> Result<i64, ModelError> {
    if (MIN_TS..MAX_TS).contains(&secs) || (secs == MAX_TS && nanos == 0) {
        Ok(secs)
    } else {
        Err(ModelError::InvalidTimestamp {
            got: secs.to_string(),
            why: END_RANGE,
        })
    }
}

/// Checks that `s` has exactly RFC 3339's `date-time` shape (§5.6) before a calendar parser
/// sees it: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, `T` and `Z` in either case, a
/// fraction of 1 to 9 digits, an offset's hour at most 23 and its minute at most 59. What a
/// laxer parser would also take — an expanded year (`+002026-…`), an offset of `+24:00` or
/// with seconds, a space for the `T`, a bracketed zone — is refused, so every accepted
/// text means one instant to every RFC 3339 reader.
fn rfc3339_shape(s: &[u8]) -> Result<(), &'static str> {
    const SHAPE: &str = "expected unix seconds or RFC 3339 like 2026-10-01T00:00:00Z";
    let digits = |at: usize, n: usize| {
        s.get(at..at + n)
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    };
    let byte = |at: usize, b: &[u8]| s.get(at).is_some_and(|c| b.contains(c));
    // YYYY-MM-DDTHH:MM:SS is 19 bytes.
    let head = digits(0, 4)
        && byte(4, b"-")
        && digits(5, 2)
        && byte(7, b"-")
        && digits(8, 2)
        && byte(10, b"Tt")
        && digits(11, 2)
        && byte(13, b":")
        && digits(14, 2)
        && byte(16, b":")
        && digits(17, 2);
    if !head {
        return Err(SHAPE);
    }
    let mut at = 19;
    if byte(at, b".") {
        let n = s[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if !(1..=9).contains(&n) {
            return Err("a fraction of a second has 1 to 9 digits");
        }
        at += 1 + n;
    }
    match s.get(at..) {
        Some([b'Z' | b'z']) => Ok(()),
        Some([b'+' | b'-', h1, h2, b':', m1, m2])
            if [*h1, *h2, *m1, *m2].iter().all(u8::is_ascii_digit) =>
        {
            let hour = (h1 - b'0') * 10 + (h2 - b'0');
            let minute = (m1 - b'0') * 10 + (m2 - b'0');
            if hour > 23 || minute > 59 {
                Err("an offset is at most ±23:59")
            } else {
                Ok(())
            }
        }
        _ => Err("RFC 3339 ends with Z or an offset like +05:30"),
    }
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

    /// A range may end where time ends (an answer can say so); no event lies there, and
    /// nothing past it is either.
    #[test]
    fn the_end_of_time_ends_a_range_and_holds_no_event() {
        for end in [
            "4294944000",
            "2106-02-07T00:00:00Z",
            "2106-02-06T19:00:00-05:00",
        ] {
            assert_eq!(parse_instant(end), Ok((MAX_TS, 0)), "{end}");
            let e = parse_timestamp(end).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidTimestamp, "{end}");
            assert!(e.to_string().contains(end), "{e}");
            assert!(e.to_string().contains("before the end"), "{e}");
        }
        for past in ["4294944001", "2106-02-07T00:00:00.5Z", "-1"] {
            let e = parse_instant(past).unwrap_err();
            assert!(e.to_string().contains("may end at the end"), "{past}: {e}");
            let e = parse_timestamp(past).unwrap_err();
            assert!(e.to_string().contains("before the end"), "{past}: {e}");
            assert!(e.to_string().contains(past), "{past}: {e}");
        }
        assert_eq!(parse_timestamp("4294943999"), Ok(MAX_TS - 1));
    }

    #[test]
    fn instants_keep_their_fraction() {
        assert_eq!(parse_instant("1790827200").unwrap(), (1_790_827_200, 0));
        assert_eq!(
            parse_instant("2026-10-01T04:00:00.25Z").unwrap(),
            (1_790_827_200, 250_000_000)
        );
        assert_eq!(
            parse_instant("2026-10-01T09:30:00.000000001+05:30").unwrap(),
            (1_790_827_200, 1)
        );
        assert_eq!(
            parse_instant("1970-01-01T00:00:00.5Z").unwrap(),
            (0, 500_000_000)
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
        // T and Z in either case; a fraction up to nanoseconds; offsets to ±23:59.
        for (ok, ts) in [
            ("2026-10-01t04:00:00z", 1_790_827_200),
            ("2026-10-01T04:00:00.123456789Z", 1_790_827_200),
            ("2026-10-01T09:30:00+05:30", 1_790_827_200),
            ("2026-10-02T03:59:00+23:59", 1_790_827_200),
            ("2026-10-01T04:00:00-00:00", 1_790_827_200),
        ] {
            assert_eq!(parse_timestamp(ok).unwrap(), ts, "{ok}");
        }
        for bad in [
            "",
            "yesterday",
            "2026-10-01",
            "-5",
            "1e9",
            "99999999999999999999",
            // What a lax ISO 8601 parser takes, RFC 3339 does not.
            "2026-10-01T00:00:00+24:00",
            "2026-10-01T00:00:00+05:60",
            "+002026-10-01T00:00:00Z",
            "2026-10-01 00:00:00Z",
            "2026-10-01T00:00:00+05:30:00",
            "2026-10-01T00:00:00+0530",
            "2026-10-01T00:00:00Z[UTC]",
            "2026-10-01T00:00:00",
            "2026-10-01T00:00Z",
            "2026-10-01T00:00:00.Z",
            "2026-10-01T00:00:00.1234567890Z",
            "2026-10-01T00:00:00,5Z",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-10-01T24:00:00Z",
            "２０２６-10-01T00:00:00Z",
            "1969-12-31T23:00:00Z",
            // Half a second before 1970: its second is -1, not 0.
            "1969-12-31T23:59:59.5Z",
        ] {
            assert_eq!(
                parse_timestamp(bad).unwrap_err().code(),
                ErrorCode::InvalidTimestamp,
                "{bad}"
            );
        }
        // A date out of range is quoted as written, not as the seconds it means.
        let e = parse_timestamp("1969-12-31T23:00:00Z")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("invalid timestamp \"1969-12-31T23:00:00Z\": outside"),
            "{e}"
        );
    }
}

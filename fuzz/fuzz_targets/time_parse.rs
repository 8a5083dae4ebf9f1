//! Timestamps (unix seconds, RFC 3339), durations, tiers, units and zone names from text,
//! and the calendar arithmetic at every instant that parses.
//!
//! Input: the text, bytes that are not UTF-8 skipped. Asserts, beyond "no panic":
//! - a parsed timestamp is in the accepted range and reads back from its unix seconds and
//!   from its RFC 3339 form in UTC and in zones with odd offsets and transitions;
//! - a duration is positive, at most 1000 years, and its printed (canonical) form parses
//!   back to it and prints the same; likewise a tier; a unit parses only from its own name;
//! - at a parsed instant `t`, for every unit in those zones: `floor(t) <= t <
//!   next(floor(t)) == next(t)`, `floor` is idempotent, and `ceil(t)` is `t` on a boundary
//!   and `next(t)` otherwise.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tally_core::ErrorCode;
use tally_core::model::{Duration, MAX_TS, MIN_TS, Tier, parse_timestamp};
use tally_core::time::{Calendar, Tz, Unit};

/// UTC; a 30-minute DST change; a skipped date; a +05:45 offset; a negative DST.
const ZONES: [&str; 5] = [
    "UTC",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Kathmandu",
    "Europe/Dublin",
];

fn zones() -> &'static [Tz] {
    static Z: OnceLock<Vec<Tz>> = OnceLock::new();
    Z.get_or_init(|| ZONES.iter().map(|z| Tz::get(z).unwrap()).collect())
}

fn calendar_laws(t: i64) {
    for tz in zones() {
        let printed = tz.rfc3339(t);
        assert_eq!(
            parse_timestamp(&printed),
            Ok(t),
            "{printed} in {}",
            tz.name()
        );
        for unit in Unit::ALL {
            let everies: &[u32] = match unit {
                Unit::Second | Unit::Minute => &[1, 15],
                Unit::Hour => &[1, 6],
                _ => &[1],
            };
            for &every in everies {
                let cal = Calendar::new(unit, Some(every), tz.clone()).unwrap();
                let f = cal.floor(t);
                let n = cal.next(t);
                let ctx = format!(
                    "{unit}/{every} in {} at {t}: floor {f}, next {n}",
                    tz.name()
                );
                assert!(f <= t && t < n, "{ctx}");
                assert_eq!(cal.floor(f), f, "{ctx}");
                assert_eq!(cal.next(f), n, "no boundary between floor(t) and t: {ctx}");
                let c = cal.ceil(t);
                assert_eq!(c, if f == t { t } else { n }, "ceil: {ctx}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match parse_timestamp(s) {
        Ok(t) => {
            assert!((MIN_TS..MAX_TS).contains(&t), "{s:?} -> {t}");
            assert_eq!(parse_timestamp(&t.to_string()), Ok(t));
            calendar_laws(t);
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::InvalidTimestamp, "{e}"),
    }
    match Duration::new(s) {
        Ok(d) => {
            assert!(d.secs() > 0 && d.secs() <= 1000 * 366 * 86_400, "{s:?}");
            let printed = d.to_string();
            assert_eq!(Duration::new(&printed), Ok(d), "{s:?} printed {printed}");
            assert_eq!(Duration::new(&printed).map(|d| d.to_string()), Ok(printed));
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::InvalidDuration, "{e}"),
    }
    match Tier::new(s) {
        Ok(t) => {
            let printed = t.to_string();
            assert_eq!(Tier::new(&printed), Ok(t), "{s:?} printed {printed}");
            assert_eq!(3600 % t.resolution.secs(), 0);
            assert!(t.retention.at_least(t.resolution));
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::InvalidSchema, "{e}"),
    }
    if let Ok(u) = Unit::parse(s) {
        assert_eq!(u.as_str(), s);
    }
    // Zone names reach the file system (the tz database): short ones only, to stay fast.
    if s.len() <= 64
        && let Ok(tz) = Tz::get(s)
    {
        assert!(!tz.name().is_empty());
        let printed = tz.rfc3339(1_795_132_800);
        assert_eq!(
            parse_timestamp(&printed),
            Ok(1_795_132_800),
            "{printed} in {s}"
        );
    }
});

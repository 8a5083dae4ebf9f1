//! Calendar boundaries against a brute-force reference that walks every 15 minutes and
//! applies SPEC §2's rules literally, in nine zones over 1990–2040 (Havana
//! because its fall-back folds over midnight, so a day can start before a transition).
//!
//! The walk is exact because, in these zones and years, every UTC offset and every
//! transition instant is a multiple of 15 minutes; the reference asserts that as it goes.

use jiff::Timestamp;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use tally_core::time::{Calendar, Tz, Unit};

/// The shared zones, plus the synthetic one.
const ZONES: [&str; 10] = {
    let mut z = ["Test/FoldOverMidnight"; 10];
    let mut i = 0;
    while i < crate::ZONES.len() {
        z[i] = crate::ZONES[i];
        i += 1;
    }
    z
};
const Y1990: i64 = 631_152_000;
const Y2040: i64 = 2_208_988_800;
const STEP: i64 = 900;

fn offset(tz: &TimeZone, t: i64) -> i64 {
    i64::from(tz.to_offset(Timestamp::from_second(t).unwrap()).seconds())
}

/// The label of the period holding a local date, by jiff's own date arithmetic.
fn period(unit: Unit, d: jiff::civil::Date) -> jiff::civil::Date {
    match unit {
        Unit::Day => d,
        Unit::Week => d - jiff::Span::new().days(d.weekday().to_sunday_zero_offset()),
        Unit::MWeek => d - jiff::Span::new().days(d.weekday().to_monday_zero_offset()),
        Unit::Month => d.first_of_month(),
        Unit::Quarter => jiff::civil::date(d.year(), (d.month() - 1) / 3 * 3 + 1, 1),
        Unit::Year => d.first_of_year(),
        _ => unreachable!(),
    }
}

/// Every boundary in `[from, to)`, found by walking `[from - lead, to)` in 15-minute steps.
fn reference(tz: &TimeZone, unit: Unit, every: u32, from: i64, to: i64) -> Vec<i64> {
    let lead = 3 * 86_400;
    let mut out = Vec::new();
    let start = (from - lead).div_euclid(STEP) * STEP;
    let mut max_label: Option<jiff::civil::Date> = None;
    let mut t = start;
    while t < to {
        let off = offset(tz, t);
        assert_eq!(off % STEP, 0, "offset not a multiple of 15 minutes at {t}");
        let before = offset(tz, t - 1);
        assert_eq!(
            before,
            offset(tz, t - STEP + 1),
            "transition inside a step before {t}"
        );
        let is_boundary = match unit {
            Unit::Second | Unit::Minute | Unit::Hour => {
                let len = match unit {
                    Unit::Second => 1,
                    Unit::Minute => 60,
                    _ => 3600,
                } * i64::from(every);
                let shows_aligned = (t + off).rem_euclid(len) == 0;
                // A forward jump that skips an aligned clock time makes its instant a boundary.
                let skips = before < off
                    && ((t + before)..(t + off))
                        .step_by(60)
                        .any(|c| c.rem_euclid(len) == 0);
                shows_aligned || skips
            }
            _ => {
                let date = Timestamp::from_second(t)
                    .unwrap()
                    .to_zoned(tz.clone())
                    .date();
                let label = period(unit, date);
                // A period starts at the first instant showing a date of it or later.
                let new = max_label.is_none_or(|m| label > m);
                if new {
                    max_label = Some(label);
                }
                new && t != start
            }
        };
        if is_boundary && t >= from {
            out.push(t);
        }
        t += STEP;
    }
    out
}

fn window_days(unit: Unit) -> i64 {
    match unit {
        Unit::Second | Unit::Minute | Unit::Hour => 3,
        Unit::Day => 6,
        Unit::Week | Unit::MWeek => 30,
        Unit::Month => 95,
        Unit::Quarter => 280,
        _ => 800,
    }
}

fn unit_every() -> impl Strategy<Value = (Unit, u32)> {
    prop_oneof![
        prop::sample::select(vec![1u32, 2, 3, 4, 6, 8, 12, 24]).prop_map(|e| (Unit::Hour, e)),
        prop::sample::select(vec![15u32, 30]).prop_map(|e| (Unit::Minute, e)),
        Just((Unit::Day, 1)),
        Just((Unit::Week, 1)),
        Just((Unit::MWeek, 1)),
        Just((Unit::Month, 1)),
        Just((Unit::Quarter, 1)),
        Just((Unit::Year, 1)),
    ]
}

/// A random instant in 1990–2040, leaving room for the longest window.
fn instant() -> impl Strategy<Value = i64> {
    Y1990..Y2040 - 900 * 86_400
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn boundaries_match_the_reference(zone in 0..ZONES.len(), (unit, every) in unit_every(), start in instant(), near_transition in any::<bool>()) {
        let tz = match ZONES[zone] {
            "Test/FoldOverMidnight" => crate::fold_over_midnight(),
            name => TimeZone::get(name).unwrap(),
        };
        // Half of the cases start just before one of the zone's transitions.
        let start = if near_transition {
            tz.following(Timestamp::from_second(start).unwrap()).next()
                .map_or(start, |tr| tr.timestamp().as_second() - 86_400)
                .min(Y2040 - 900 * 86_400)
        } else {
            start
        };
        let from = start;
        let to = start + window_days(unit) * 86_400;
        let want = reference(&tz, unit, every, from, to);
        let cal = Calendar::new(unit, Some(every), Tz::from_jiff(ZONES[zone], tz.clone())).unwrap();
        let mut got = Vec::new();
        let mut b = cal.ceil(from);
        while b < to {
            got.push(b);
            b = cal.next(b);
        }
        prop_assert_eq!(&got, &want);
        // floor and ceil of any second between the first and last reference boundary.
        if want.len() >= 2 {
            for k in 0..want.len() - 1 {
                let (lo, hi) = (want[k], want[k + 1]);
                for t in [lo, lo + 1, (lo + hi) / 2, hi - 1] {
                    prop_assert_eq!(cal.floor(t), lo, "floor({})", t);
                    prop_assert_eq!(cal.ceil(t), if t == lo { lo } else { hi }, "ceil({})", t);
                }
            }
        }
    }
}

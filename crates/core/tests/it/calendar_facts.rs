//! Named facts about real zones that the calendar must get right.

use tally_core::model::parse_timestamp;
use tally_core::time::{Calendar, Tz, Unit};

fn cal(unit: Unit, every: Option<u32>, zone: &str) -> Calendar {
    Calendar::new(unit, every, Tz::get(zone).unwrap()).unwrap()
}

fn ts(s: &str) -> i64 {
    parse_timestamp(s).unwrap()
}

/// The buckets of one local day as (start in RFC 3339, length in seconds).
fn buckets(unit: Unit, every: Option<u32>, zone: &str, from: &str, to: &str) -> Vec<(String, i64)> {
    let c = cal(unit, every, zone);
    let (from, to) = c.range(ts(from), ts(to)).unwrap();
    let b = c.boundaries(from, to, 100_000).unwrap();
    b.windows(2)
        .map(|w| (c.tz().rfc3339(w[0]), w[1] - w[0]))
        .collect()
}

#[test]
fn new_york_spring_forward_day_has_23_hourly_buckets() {
    let b = buckets(
        Unit::Hour,
        None,
        "America/New_York",
        "2026-03-08T00:00:00-05:00",
        "2026-03-09T00:00:00-04:00",
    );
    assert_eq!(b.len(), 23);
    assert_eq!(b[1], ("2026-03-08T01:00:00-05:00".to_owned(), 3600));
    assert_eq!(b[2], ("2026-03-08T03:00:00-04:00".to_owned(), 3600));
    assert!(
        b.iter().all(|(t, _)| !t.contains("T02:")),
        "02:00 does not exist: {b:?}"
    );
}

#[test]
fn new_york_fall_back_day_has_25_hourly_buckets_two_at_one() {
    let b = buckets(
        Unit::Hour,
        None,
        "America/New_York",
        "2026-11-01T00:00:00-04:00",
        "2026-11-02T00:00:00-05:00",
    );
    assert_eq!(b.len(), 25);
    assert_eq!(b[1], ("2026-11-01T01:00:00-04:00".to_owned(), 3600));
    assert_eq!(b[2], ("2026-11-01T01:00:00-05:00".to_owned(), 3600));
    assert_eq!(b[3], ("2026-11-01T02:00:00-05:00".to_owned(), 3600));
    // ... while the day itself starts once.
    let d = buckets(
        Unit::Day,
        None,
        "America/New_York",
        "2026-11-01T00:00:00-04:00",
        "2026-11-02T00:00:00-05:00",
    );
    assert_eq!(d, vec![("2026-11-01T00:00:00-04:00".to_owned(), 25 * 3600)]);
}

#[test]
fn kolkata_day_starts_at_1830_utc() {
    let c = cal(Unit::Day, None, "Asia/Kolkata");
    assert_eq!(
        c.floor(ts("2026-06-15T12:00:00Z")),
        ts("2026-06-14T18:30:00Z")
    );
    assert_eq!(
        c.ceil(ts("2026-06-15T12:00:00Z")),
        ts("2026-06-15T18:30:00Z")
    );
    assert_eq!(
        c.tz().rfc3339(ts("2026-06-14T18:30:00Z")),
        "2026-06-15T00:00:00+05:30"
    );
}

#[test]
fn kathmandu_day_starts_at_1815_utc() {
    let c = cal(Unit::Day, None, "Asia/Kathmandu");
    assert_eq!(
        c.floor(ts("2026-06-15T12:00:00Z")),
        ts("2026-06-14T18:15:00Z")
    );
}

#[test]
fn lord_howe_springs_forward_by_30_minutes() {
    // 2026-10-04 02:00 +10:30 jumps to 02:30 +11:00: the jump is a boundary.
    let b = buckets(
        Unit::Hour,
        None,
        "Australia/Lord_Howe",
        "2026-10-04T00:00:00+10:30",
        "2026-10-05T00:00:00+11:00",
    );
    assert_eq!(b.len(), 24);
    assert_eq!(b[1], ("2026-10-04T01:00:00+10:30".to_owned(), 3600));
    assert_eq!(b[2], ("2026-10-04T02:30:00+11:00".to_owned(), 1800));
    assert_eq!(b[3], ("2026-10-04T03:00:00+11:00".to_owned(), 3600));
    assert_eq!(b.iter().map(|(_, len)| len).sum::<i64>(), 23 * 3600 + 1800);
}

#[test]
fn lord_howe_falls_back_by_30_minutes() {
    // 2026-04-05 02:00 +11:00 falls back to 01:30 +10:30: 02:00 +11 is never shown, so the
    // 01:00 bucket lasts 90 minutes; with 30-minute buckets, 01:30 is a boundary twice.
    let b = buckets(
        Unit::Hour,
        None,
        "Australia/Lord_Howe",
        "2026-04-05T00:00:00+11:00",
        "2026-04-06T00:00:00+10:30",
    );
    assert_eq!(b.len(), 24);
    assert_eq!(b[1], ("2026-04-05T01:00:00+11:00".to_owned(), 5400));
    assert_eq!(b[2], ("2026-04-05T02:00:00+10:30".to_owned(), 3600));
    let half = buckets(
        Unit::Minute,
        Some(30),
        "Australia/Lord_Howe",
        "2026-04-05T00:00:00+11:00",
        "2026-04-06T00:00:00+10:30",
    );
    assert_eq!(half.len(), 49);
    assert_eq!(half[3], ("2026-04-05T01:30:00+11:00".to_owned(), 1800));
    assert_eq!(half[4], ("2026-04-05T01:30:00+10:30".to_owned(), 1800));
}

#[test]
fn apia_has_no_2011_12_30() {
    let b = buckets(
        Unit::Day,
        None,
        "Pacific/Apia",
        "2011-12-29T00:00:00-10:00",
        "2012-01-01T00:00:00+14:00",
    );
    assert_eq!(
        b,
        vec![
            ("2011-12-29T00:00:00-10:00".to_owned(), 86_400),
            ("2011-12-31T00:00:00+14:00".to_owned(), 86_400),
        ]
    );
    // A week holding the skipped Friday is a day short.
    let w = buckets(
        Unit::Week,
        None,
        "Pacific/Apia",
        "2011-12-26T00:00:00-10:00",
        "2011-12-27T00:00:00-10:00",
    );
    assert_eq!(
        w,
        vec![("2011-12-25T00:00:00-10:00".to_owned(), 6 * 86_400)]
    );
}

#[test]
fn santiago_days_that_start_at_one_and_last_25_hours() {
    // Clocks skip 2026-09-06 00:00 (to 01:00 -03): the day starts at the jump.
    let c = cal(Unit::Day, None, "America/Santiago");
    let start = c.floor(ts("2026-09-06T12:00:00-03:00"));
    assert_eq!(c.tz().rfc3339(start), "2026-09-06T01:00:00-03:00");
    // Clocks fall back from 2026-04-05 00:00 -03 to 2026-04-04 23:00 -04: April 4 lasts 25 h.
    let b = buckets(
        Unit::Day,
        None,
        "America/Santiago",
        "2026-04-04T00:00:00-03:00",
        "2026-04-05T12:00:00-04:00",
    );
    assert_eq!(
        b,
        vec![
            ("2026-04-04T00:00:00-03:00".to_owned(), 25 * 3600),
            ("2026-04-05T00:00:00-04:00".to_owned(), 24 * 3600),
        ]
    );
}

#[test]
fn week_starts_sunday_and_mweek_monday() {
    // 2026-11-25 is a Wednesday.
    let t = ts("2026-11-25T15:00:00Z");
    assert_eq!(
        cal(Unit::Week, None, "UTC").floor(t),
        ts("2026-11-22T00:00:00Z")
    );
    assert_eq!(
        cal(Unit::MWeek, None, "UTC").floor(t),
        ts("2026-11-23T00:00:00Z")
    );
    // A Sunday is the first day of its week and the last of its mweek.
    let sunday = ts("2026-11-22T10:00:00-05:00");
    let ny_week = cal(Unit::Week, None, "America/New_York");
    let ny_mweek = cal(Unit::MWeek, None, "America/New_York");
    assert_eq!(
        ny_week.tz().rfc3339(ny_week.floor(sunday)),
        "2026-11-22T00:00:00-05:00"
    );
    assert_eq!(
        ny_mweek.tz().rfc3339(ny_mweek.floor(sunday)),
        "2026-11-16T00:00:00-05:00"
    );
}

#[test]
fn months_quarters_years_in_a_zone() {
    let c = cal(Unit::Month, None, "America/New_York");
    let t = ts("2026-11-15T00:00:00Z");
    assert_eq!(c.tz().rfc3339(c.floor(t)), "2026-11-01T00:00:00-04:00");
    assert_eq!(c.tz().rfc3339(c.next(t)), "2026-12-01T00:00:00-05:00");
    let q = cal(Unit::Quarter, None, "Europe/London");
    assert_eq!(
        q.tz().rfc3339(q.floor(ts("2026-05-20T00:00:00Z"))),
        "2026-04-01T00:00:00+01:00"
    );
    let y = cal(Unit::Year, None, "Asia/Kolkata");
    assert_eq!(
        y.floor(ts("2026-05-20T00:00:00Z")),
        ts("2025-12-31T18:30:00Z")
    );
}

#[test]
fn range_floors_from_and_ceils_to() {
    let c = cal(Unit::Day, None, "America/New_York");
    let (f, t) = c
        .range(ts("2026-10-01T12:00:00Z"), ts("2026-10-03T12:00:00Z"))
        .unwrap();
    assert_eq!(c.tz().rfc3339(f), "2026-10-01T00:00:00-04:00");
    assert_eq!(c.tz().rfc3339(t), "2026-10-04T00:00:00-04:00");
    // Already on boundaries: unchanged. Equal: echoed. Reversed: invalid_range.
    assert_eq!(c.range(f, t).unwrap(), (f, t));
    assert_eq!(c.range(f + 7, f + 7).unwrap(), (f + 7, f + 7));
    assert_eq!(
        c.range(t, f).unwrap_err().code(),
        tally_core::ErrorCode::InvalidRange
    );
}

#[test]
fn too_many_points_is_refused() {
    let c = cal(Unit::Second, None, "UTC");
    let e = c.boundaries(0, 1_000_000, 100_000).unwrap_err();
    assert_eq!(e.code(), tally_core::ErrorCode::TooManyPoints);
    assert_eq!(c.boundaries(0, 100_000, 100_000).unwrap().len(), 100_001);
}

#[test]
fn havana_midnight_is_shown_twice_and_the_day_starts_at_the_first() {
    // 2026-11-01 01:00 -04 falls back to 00:00 -05: midnight is shown twice.
    let c = cal(Unit::Day, None, "America/Havana");
    let start = c.floor(ts("2026-11-01T12:00:00-05:00"));
    assert_eq!(c.tz().rfc3339(start), "2026-11-01T00:00:00-04:00");
    let b = buckets(
        Unit::Day,
        None,
        "America/Havana",
        "2026-11-01T00:30:00-05:00",
        "2026-11-01T12:00:00-05:00",
    );
    assert_eq!(b, vec![("2026-11-01T00:00:00-04:00".to_owned(), 25 * 3600)]);
    let h = buckets(
        Unit::Hour,
        None,
        "America/Havana",
        "2026-11-01T00:00:00-04:00",
        "2026-11-01T02:00:00-05:00",
    );
    let starts: Vec<&str> = h.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        starts,
        vec![
            "2026-11-01T00:00:00-04:00",
            "2026-11-01T00:00:00-05:00",
            "2026-11-01T01:00:00-05:00"
        ]
    );
}

#[test]
fn a_fall_back_across_midnight_keeps_the_day_already_started() {
    // 2026-11-01 00:30 -02 falls back to 2026-10-31 23:30 -03.
    let c = Calendar::new(
        Unit::Day,
        None,
        Tz::from_jiff("Test/Fold", crate::fold_over_midnight()),
    )
    .unwrap();
    let nov1 = ts("2026-11-01T00:00:00-02:00");
    // Shows 2026-10-31 23:45, yet November 1 has already begun.
    let t = ts("2026-10-31T23:45:00-03:00");
    assert!(t > nov1);
    assert_eq!(c.floor(t), nov1);
    assert_eq!(c.next(t), ts("2026-11-02T00:00:00-03:00"));
    let m = Calendar::new(
        Unit::Month,
        None,
        Tz::from_jiff("Test/Fold", crate::fold_over_midnight()),
    )
    .unwrap();
    assert_eq!(m.floor(t), nov1);
}

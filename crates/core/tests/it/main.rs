//! tally-core's integration tests, in one binary (see STYLE.md: few test binaries).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod calendar_facts;
mod calendar_props;
mod queries;
mod query_props;

/// The zones the property tests walk: the SPEC's list, Havana (its fall-back folds over
/// midnight), and UTC.
pub const ZONES: [&str; 9] = [
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "America/Santiago",
    "Pacific/Apia",
    "America/Havana",
    "UTC",
];

/// A synthetic zone (UTC-3, DST UTC-2) whose spring-forward skips midnight and whose
/// fall-back goes from 00:30 back to 23:30 of the previous day, so the local date moves
/// backwards across a period start: no real zone in the tests does that since 1990.
pub fn fold_over_midnight() -> jiff::tz::TimeZone {
    jiff::tz::TimeZone::posix("AAA3BBB,M3.2.0/0,M11.1.0/0:30").unwrap()
}

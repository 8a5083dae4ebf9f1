//! Time: epoch-aligned buckets, IANA time zones, and calendar units in a zone (SPEC §2).
//!
//! A calendar unit is a set of *boundary instants*. For `second`/`minute`/`hour` (with
//! `every`), a boundary is every instant at which the local clock shows a multiple of the
//! unit, plus the instant of a forward jump that skips such a time; a time shown twice after
//! a fall-back is a boundary twice. For `day` and longer, the period starting on local date
//! `d` starts at the first instant whose local date is `d` or later, so a skipped midnight
//! starts the day at the jump and a skipped date (Apia, 2011-12-30) has no bucket at all.
//!
//! The zone is consulted through offset *spans* (the interval between two transitions, with
//! one UTC offset): inside a span civil time is `t + offset`, so most steps are arithmetic and
//! a [`Cursor`] caches the current span so walking a year of days costs a few tz look-ups.

use std::fmt;
use std::sync::Arc;

use jiff::Timestamp;
use jiff::tz::{AmbiguousOffset, TimeZone};

use crate::error::ErrorCode;

const DAY: i64 = 86_400;

/// The start of the epoch-aligned bucket of resolution `res` seconds holding `ts`.
pub fn bucket_start(ts: i64, res: i64) -> i64 {
    ts.div_euclid(res) * res
}

/// A calendar error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimeError {
    #[error("unknown time zone {name:?}: expected an IANA name like America/New_York")]
    InvalidTimezone { name: String },
    #[error("invalid unit {got:?}: {why}")]
    InvalidUnit { got: String, why: String },
    #[error("invalid range: from ({from}) is after to ({to})")]
    InvalidRange { from: i64, to: i64 },
    #[error("the range has more than {max} points")]
    TooManyPoints { max: usize },
}

impl TimeError {
    pub fn code(&self) -> ErrorCode {
        match self {
            TimeError::InvalidTimezone { .. } => ErrorCode::InvalidTimezone,
            TimeError::InvalidUnit { .. } => ErrorCode::InvalidUnit,
            TimeError::InvalidRange { .. } => ErrorCode::InvalidRange,
            TimeError::TooManyPoints { .. } => ErrorCode::TooManyPoints,
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `(year, month, day)` of a day number (days since 1970-01-01).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    // Both fit in u32 by construction (1..=31 and 1..=12).
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// An IANA time zone, by name.
#[derive(Clone)]
pub struct Tz {
    name: Arc<str>,
    tz: TimeZone,
}

impl fmt::Debug for Tz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tz").field(&self.name).finish()
    }
}

impl Tz {
    /// Looks a zone up in the system tz database, else the bundled copy.
    ///
    /// `localtime` (the machine's own zone, so answers would depend on where the server
    /// runs) and `posixrules` (a file of the database, not a zone) are refused though the
    /// system database has files of those names.
    pub fn get(name: &str) -> Result<Self, TimeError> {
        let invalid = || TimeError::InvalidTimezone {
            name: name.to_owned(),
        };
        if ["localtime", "posixrules"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            return Err(invalid());
        }
        let tz = TimeZone::get(name).map_err(|_| invalid())?;
        let name = tz.iana_name().unwrap_or(name);
        Ok(Tz {
            name: name.into(),
            tz,
        })
    }

    /// A zone from a given jiff zone (tests pin the bundled database this way).
    pub fn from_jiff(name: &str, tz: TimeZone) -> Self {
        Tz {
            name: name.into(),
            tz,
        }
    }

    pub fn utc() -> Self {
        Tz {
            name: "UTC".into(),
            tz: TimeZone::UTC,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The UTC offset in seconds in effect at instant `t`.
    pub fn offset_at(&self, t: i64) -> i64 {
        match Timestamp::from_second(t) {
            Ok(ts) => i64::from(self.tz.to_offset(ts).seconds()),
            Err(_) => 0,
        }
    }

    /// The offset span holding `t`.
    fn span_at(&self, t: i64) -> Span {
        let Ok(ts) = Timestamp::from_second(t) else {
            return Span {
                start: i64::MIN,
                end: i64::MAX,
                off: 0,
                prev_off: 0,
            };
        };
        let off = i64::from(self.tz.to_offset(ts).seconds());
        // `preceding` is strictly before its argument, `following` strictly after.
        let start = Timestamp::from_second(t + 1)
            .ok()
            .and_then(|next| self.tz.preceding(next).next())
            .map(|tr| tr.timestamp().as_second());
        let (start, prev_off) = match start {
            Some(s) => (s, self.offset_at(s - 1)),
            None => (i64::MIN, off),
        };
        let end = self
            .tz
            .following(ts)
            .next()
            .map_or(i64::MAX, |tr| tr.timestamp().as_second());
        Span {
            start,
            end,
            off,
            prev_off,
        }
    }

    /// The first instant whose local civil time is `c` (seconds since the civil epoch) or
    /// later: `c` itself when shown once, its first showing in a fold, the jump in a gap.
    fn first_at_or_after(&self, c: i64) -> i64 {
        let days = c.div_euclid(DAY);
        let sod = c.rem_euclid(DAY);
        let (y, m, d) = civil_from_days(days);
        let dt = jiff::civil::DateTime::new(
            y as i16,
            m as i8,
            d as i8,
            (sod / 3600) as i8,
            (sod / 60 % 60) as i8,
            (sod % 60) as i8,
            0,
        );
        let Ok(dt) = dt else {
            // Outside jiff's years; timestamps are validated far inside them.
            return c;
        };
        match self.tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => c - i64::from(offset.seconds()),
            AmbiguousOffset::Fold { before, after } => {
                (c - i64::from(before.seconds())).min(c - i64::from(after.seconds()))
            }
            AmbiguousOffset::Gap { before, after } => {
                // The jump T satisfies c - after < T <= c - before.
                let lo = c - i64::from(after.seconds());
                Timestamp::from_second(lo)
                    .ok()
                    .and_then(|lo| self.tz.following(lo).next())
                    .map_or(c - i64::from(before.seconds()), |tr| {
                        tr.timestamp().as_second()
                    })
            }
        }
    }

    /// `t` in RFC 3339 with this zone's offset at `t` (`2026-10-01T00:00:00-04:00`).
    pub fn rfc3339(&self, t: i64) -> String {
        let off = self.offset_at(t);
        // RFC 3339 offsets have no seconds; the few local-mean-time offsets print in UTC.
        let off = if off % 60 == 0 { off } else { 0 };
        let c = t + off;
        let (y, m, d) = civil_from_days(c.div_euclid(DAY));
        let sod = c.rem_euclid(DAY);
        let sign = if off < 0 { '-' } else { '+' };
        let a = off.abs();
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{sign}{:02}:{:02}",
            sod / 3600,
            sod / 60 % 60,
            sod % 60,
            a / 3600,
            a / 60 % 60
        )
    }
}

/// An interval `[start, end)` of instants with one UTC offset; `prev_off` is the offset just
/// before `start`. `start`/`end` are `i64::MIN`/`MAX` where the zone has no transition.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: i64,
    end: i64,
    off: i64,
    prev_off: i64,
}

impl Span {
    fn contains(&self, t: i64) -> bool {
        self.start <= t && t < self.end
    }
}

/// A calendar unit of SPEC §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    /// Starts on Sunday.
    Week,
    /// Starts on Monday.
    MWeek,
    Month,
    Quarter,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 9] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::MWeek,
        Unit::Month,
        Unit::Quarter,
        Unit::Year,
    ];

    pub fn parse(s: &str) -> Result<Self, TimeError> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str() == s)
            .ok_or_else(|| TimeError::InvalidUnit {
                got: s.to_owned(),
                why: "expected one of second, minute, hour, day, week, mweek, month, quarter, year"
                    .into(),
            })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::MWeek => "mweek",
            Unit::Month => "month",
            Unit::Quarter => "quarter",
            Unit::Year => "year",
        }
    }

    /// Seconds in one unit for the clock units; `None` for day and longer.
    fn clock_secs(self) -> Option<i64> {
        match self {
            Unit::Second => Some(1),
            Unit::Minute => Some(60),
            Unit::Hour => Some(3600),
            _ => None,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit with its `every` in a time zone: the rule that says which instants are boundaries.
#[derive(Debug, Clone)]
pub struct Calendar {
    unit: Unit,
    every: u32,
    tz: Tz,
    /// For clock units: the bucket length in local seconds (`every` × unit).
    len: Option<i64>,
}

impl Calendar {
    /// `every` defaults to 1; for clock units it must divide 60 (seconds, minutes) or 24
    /// (hours); day and longer units take no `every` other than 1.
    pub fn new(unit: Unit, every: Option<u32>, tz: Tz) -> Result<Self, TimeError> {
        let every = every.unwrap_or(1);
        let bad = |why: String| TimeError::InvalidUnit {
            got: format!("every={every}"),
            why,
        };
        let len = match unit.clock_secs() {
            Some(secs) => {
                let cycle = if unit == Unit::Hour { 24 } else { 60 };
                if every == 0 || cycle % every != 0 {
                    return Err(bad(format!("for {unit}, every must divide {cycle}")));
                }
                Some(secs * i64::from(every))
            }
            None if every != 1 => return Err(bad(format!("{unit} takes no every"))),
            None => None,
        };
        Ok(Calendar {
            unit,
            every,
            tz,
            len,
        })
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    pub fn every(&self) -> u32 {
        self.every
    }

    pub fn tz(&self) -> &Tz {
        &self.tz
    }

    /// A cursor for many look-ups in increasing time (caches the offset span).
    pub fn cursor(&self) -> Cursor<'_> {
        Cursor {
            cal: self,
            span: None,
        }
    }

    /// The latest boundary at or before `t`.
    pub fn floor(&self, t: i64) -> i64 {
        self.cursor().floor(t)
    }

    /// The earliest boundary strictly after `t`.
    pub fn next(&self, t: i64) -> i64 {
        self.cursor().next(t)
    }

    /// The earliest boundary at or after `t`.
    pub fn ceil(&self, t: i64) -> i64 {
        self.cursor().ceil(t)
    }

    /// The effective range of SPEC §2: `from` floored and `to` ceiled; `from == to` is kept
    /// as given (no points), `from > to` is `invalid_range`.
    pub fn range(&self, from: i64, to: i64) -> Result<(i64, i64), TimeError> {
        if from > to {
            return Err(TimeError::InvalidRange { from, to });
        }
        if from == to {
            return Ok((from, to));
        }
        let mut c = self.cursor();
        Ok((c.floor(from), c.ceil(to)))
    }

    /// Every boundary of `[from, to]` (both ends included, so `n + 1` instants for `n`
    /// buckets), where both ends are boundaries. Fails past `max_points` buckets.
    pub fn boundaries(&self, from: i64, to: i64, max_points: usize) -> Result<Vec<i64>, TimeError> {
        if from >= to {
            return Ok(Vec::new());
        }
        let mut c = self.cursor();
        let mut out = vec![from];
        let mut b = from;
        while b < to {
            if out.len() > max_points {
                return Err(TimeError::TooManyPoints { max: max_points });
            }
            b = c.next(b).min(to);
            out.push(b);
        }
        Ok(out)
    }
}

/// Walks a [`Calendar`], caching the zone's current offset span.
#[derive(Debug)]
pub struct Cursor<'a> {
    cal: &'a Calendar,
    span: Option<Span>,
}

impl Cursor<'_> {
    fn span(&mut self, t: i64) -> Span {
        match self.span {
            Some(s) if s.contains(t) => s,
            _ => {
                let s = self.cal.tz.span_at(t);
                self.span = Some(s);
                s
            }
        }
    }

    pub fn floor(&mut self, t: i64) -> i64 {
        match self.cal.len {
            Some(len) => self.clock_floor(t, len),
            None => self.date_floor(t),
        }
    }

    pub fn next(&mut self, t: i64) -> i64 {
        match self.cal.len {
            Some(len) => self.clock_next(t, len),
            None => self.date_next(t),
        }
    }

    pub fn ceil(&mut self, t: i64) -> i64 {
        let f = self.floor(t);
        if f == t { t } else { self.next(t) }
    }

    /// Whether a forward jump from civil `a` to civil `b` skips an aligned time.
    fn skips_aligned(a: i64, b: i64, len: i64) -> bool {
        a < b && (a.div_euclid(len) + i64::from(a.rem_euclid(len) != 0)) * len < b
    }

    fn clock_floor(&mut self, t: i64, len: i64) -> i64 {
        let mut s = t;
        loop {
            let sp = self.span(s);
            let c = (s + sp.off).div_euclid(len) * len - sp.off;
            if c >= sp.start {
                return c;
            }
            // No aligned time shown in [start, s]; the transition itself may be a boundary.
            let p = sp.start;
            if Self::skips_aligned(p + sp.prev_off, p + sp.off, len) {
                return p;
            }
            s = p - 1;
        }
    }

    fn clock_next(&mut self, t: i64, len: i64) -> i64 {
        let mut s = t;
        loop {
            let sp = self.span(s);
            let c = ((s + sp.off).div_euclid(len) + 1) * len - sp.off;
            if c < sp.end {
                return c;
            }
            let p = sp.end;
            let after = self.span(p);
            if (p + after.off).rem_euclid(len) == 0
                || Self::skips_aligned(p + sp.off, p + after.off, len)
            {
                return p;
            }
            s = p;
        }
    }

    /// The local day number of instant `t`.
    fn local_day(&mut self, t: i64) -> i64 {
        (t + self.span(t).off).div_euclid(DAY)
    }

    /// The first instant whose local date is `day` or later.
    fn day_start(&mut self, day: i64) -> i64 {
        let c = day * DAY;
        if let Some(sp) = self.span {
            let x = c - sp.off;
            // Shown in the cached span, and not already shown before it (a fold at its start).
            if sp.contains(x) && c >= sp.start.saturating_add(sp.prev_off) {
                return x;
            }
        }
        self.cal.tz.first_at_or_after(c)
    }

    fn period_start(&self, day: i64) -> i64 {
        match self.cal.unit {
            Unit::Week => day - (day + 4).rem_euclid(7),
            Unit::MWeek => day - (day + 3).rem_euclid(7),
            Unit::Month => {
                let (y, m, _) = civil_from_days(day);
                days_from_civil(y, m, 1)
            }
            Unit::Quarter => {
                let (y, m, _) = civil_from_days(day);
                days_from_civil(y, (m - 1) / 3 * 3 + 1, 1)
            }
            Unit::Year => days_from_civil(civil_from_days(day).0, 1, 1),
            _ => day,
        }
    }

    fn next_period(&self, start: i64) -> i64 {
        let months = |n: u32| {
            let (y, m, _) = civil_from_days(start);
            let m0 = m - 1 + n;
            days_from_civil(y + i64::from(m0 / 12), m0 % 12 + 1, 1)
        };
        match self.cal.unit {
            Unit::Week | Unit::MWeek => start + 7,
            Unit::Month => months(1),
            Unit::Quarter => months(3),
            Unit::Year => months(12),
            _ => start + 1,
        }
    }

    fn date_floor(&mut self, t: i64) -> i64 {
        let day = self.local_day(t);
        let mut p = self.period_start(day);
        let mut b = self.day_start(p);
        // After a fall-back the local date can lag a start already passed.
        loop {
            let q = self.next_period(p);
            let bq = self.day_start(q);
            if bq > t {
                return b;
            }
            (p, b) = (q, bq);
        }
    }

    fn date_next(&mut self, t: i64) -> i64 {
        let day = self.local_day(t);
        let mut p = self.period_start(day);
        loop {
            p = self.next_period(p);
            let b = self.day_start(p);
            if b > t {
                return b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip() {
        for z in [-800_000, -1, 0, 1, 59, 60, 365, 10_957, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn bucket_start_floors() {
        assert_eq!(bucket_start(3599, 3600), 0);
        assert_eq!(bucket_start(3600, 3600), 3600);
        assert_eq!(bucket_start(-1, 60), -60);
    }

    #[test]
    fn every_rules() {
        let utc = Tz::utc;
        assert!(Calendar::new(Unit::Hour, Some(6), utc()).is_ok());
        assert!(Calendar::new(Unit::Minute, Some(15), utc()).is_ok());
        for (u, e) in [
            (Unit::Hour, 5),
            (Unit::Minute, 7),
            (Unit::Second, 0),
            (Unit::Day, 2),
        ] {
            let err = Calendar::new(u, Some(e), utc()).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidUnit);
        }
        assert_eq!(
            Unit::parse("fortnight").unwrap_err().code(),
            ErrorCode::InvalidUnit
        );
        // Names of the database's files that are no zone of their own (a review found
        // `localtime` answering in the server machine's zone).
        for name in ["Mars/Olympus", "localtime", "LocalTime", "posixrules"] {
            assert_eq!(
                Tz::get(name).unwrap_err().code(),
                ErrorCode::InvalidTimezone,
                "{name}"
            );
        }
    }

    #[test]
    fn rfc3339_uses_the_zone_offset() {
        let ny = Tz::get("America/New_York").unwrap();
        assert_eq!(ny.rfc3339(1_790_827_200), "2026-10-01T00:00:00-04:00");
        assert_eq!(Tz::utc().rfc3339(0), "1970-01-01T00:00:00+00:00");
        let kathmandu = Tz::get("Asia/Kathmandu").unwrap();
        assert_eq!(
            kathmandu.rfc3339(1_790_827_200),
            "2026-10-01T09:45:00+05:45"
        );
    }
}

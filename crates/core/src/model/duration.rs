//! Durations (`<integer><unit>`, printed in the largest unit that divides them), retentions
//! and tiers (`1m:48h`, `1h:forever`).

use std::fmt;
use std::str::FromStr;

use super::ModelError;

/// A positive whole number of seconds written `<integer><unit>` with unit `s m h d w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub(super) u64);

const UNITS: [(char, u64); 5] = [
    ('w', 604_800),
    ('d', 86_400),
    ('h', 3_600),
    ('m', 60),
    ('s', 1),
];

impl Duration {
    pub fn from_secs(secs: u64) -> Option<Self> {
        (secs > 0).then_some(Duration(secs))
    }

    pub fn secs(self) -> u64 {
        self.0
    }

    /// Seconds as an `i64`; parsing caps durations far below `i64::MAX`.
    pub fn secs_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    pub fn new(s: &str) -> Result<Self, ModelError> {
        let err = |why| ModelError::InvalidDuration {
            got: s.to_owned(),
            why,
        };
        let Some(unit) = s.chars().last() else {
            return Err(err("it is empty"));
        };
        let Some(&(_, mult)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(err("it must end in one of s, m, h, d, w"));
        };
        let digits = &s[..s.len() - 1];
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(
                "it must be a whole number followed by a unit, like 48h",
            ));
        }
        let n: u64 = digits.parse().map_err(|_| err("the number is too large"))?;
        if n == 0 {
            return Err(err("it must be greater than zero"));
        }
        // Capped at ~1000 years so every sum with a timestamp stays far from overflow.
        match n.checked_mul(mult) {
            Some(secs) if secs <= 1000 * 366 * 86_400 => Ok(Duration(secs)),
            _ => Err(err("it is longer than 1000 years")),
        }
    }
}

string_from_str!(Duration);

/// Canonical form: the largest unit that divides the duration (`60m` → `1h`, `48h` → `2d`).
impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, mult) = UNITS
            .iter()
            .find(|(_, m)| self.0.is_multiple_of(*m))
            .copied()
            .unwrap_or(('s', 1));
        write!(f, "{}{}", self.0 / mult, unit)
    }
}

/// How long a tier keeps its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retention {
    Forever,
    For(Duration),
}

impl Retention {
    /// Whether data at instant `from` and later is still kept at time `now`.
    pub fn holds_from(self, from: i64, now: i64) -> bool {
        match self {
            Retention::Forever => true,
            Retention::For(d) => from >= now.saturating_sub(d.secs_i64()),
        }
    }

    /// Whether a bucket `[start, start + resolution)` is still (partly) kept at `now`.
    pub fn keeps_bucket(self, start: i64, resolution: Duration, now: i64) -> bool {
        match self {
            Retention::Forever => true,
            Retention::For(d) => start + resolution.secs_i64() > now.saturating_sub(d.secs_i64()),
        }
    }

    /// Whether the bucket of `resolution` holding instant `ts` is still (partly) kept at
    /// `now`.
    pub fn keeps_time(self, ts: i64, resolution: Duration, now: i64) -> bool {
        let r = resolution.secs_i64();
        self.keeps_bucket(ts.div_euclid(r) * r, resolution, now)
    }

    /// Whether this retention is at least `d` long.
    pub fn at_least(self, d: Duration) -> bool {
        match self {
            Retention::Forever => true,
            Retention::For(r) => r >= d,
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retention::Forever => f.write_str("forever"),
            Retention::For(d) => d.fmt(f),
        }
    }
}

/// A resolution with a retention, written `1m:48h` or `1h:forever`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tier {
    pub resolution: Duration,
    pub retention: Retention,
}

impl Tier {
    pub fn new(s: &str) -> Result<Self, ModelError> {
        let err = |why: String| ModelError::InvalidSchema {
            why: format!("tier {s:?}: {why}"),
            field: "tiers",
        };
        let (res, ret) = s
            .split_once(':')
            .ok_or_else(|| err("a tier is <resolution>:<retention>, like 1m:48h".into()))?;
        let resolution = Duration::new(res).map_err(|e| err(e.to_string()))?;
        if 3600 % resolution.secs() != 0 {
            return Err(err(format!(
                "the resolution {resolution} does not divide 1h"
            )));
        }
        let retention = if ret == "forever" {
            Retention::Forever
        } else {
            Retention::For(Duration::new(ret).map_err(|e| err(e.to_string()))?)
        };
        if !retention.at_least(resolution) {
            return Err(err("the retention is shorter than the resolution".into()));
        }
        Ok(Tier {
            resolution,
            retention,
        })
    }
}

string_from_str!(Tier);

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.resolution, self.retention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn durations_parse_and_print_canonically() {
        for (s, secs, canon) in [
            ("1s", 1, "1s"),
            ("60m", 3600, "1h"),
            ("48h", 172_800, "2d"),
            ("90s", 90, "90s"),
            ("14d", 1_209_600, "2w"),
            ("25h", 90_000, "25h"),
        ] {
            let d = Duration::new(s).unwrap();
            assert_eq!(d.secs(), secs);
            assert_eq!(d.to_string(), canon);
        }
        for bad in [
            "",
            "0s",
            "5",
            "h",
            "1.5h",
            "-1h",
            "1y",
            "1 h",
            "99999999999999999999w",
        ] {
            assert_eq!(
                Duration::new(bad).unwrap_err().code(),
                ErrorCode::InvalidDuration,
                "{bad}"
            );
        }
    }

    #[test]
    fn tier_rules() {
        let t = Tier::new("1m:48h").unwrap();
        assert_eq!(t.to_string(), "1m:2d");
        assert_eq!(
            Tier::new("1h:forever").unwrap().retention,
            Retention::Forever
        );
        assert!(Tier::new("15m:1h").is_ok());
        assert!(Tier::new("45s:1h").is_ok());
        for bad in [
            "1d:forever",
            "7m:1h",
            "1m",
            "1h:30m",
            "1h:never",
            "2h:forever",
        ] {
            assert_eq!(
                Tier::new(bad).unwrap_err().code(),
                ErrorCode::InvalidSchema,
                "{bad}"
            );
        }
    }
}

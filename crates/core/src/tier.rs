//! Tier choice (SPEC §2): the coarsest tier that holds the whole range and has every
//! boundary of the range on one of its own bucket boundaries. A pure function: the answer
//! depends only on the schema, the boundaries and `now`, and a refusal says why.

use crate::model::{Duration, Namespace, Retention, Schema, Tier};

/// Which tiers a query may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Totals only (series without `dim`, window, top without `dim`): every tier.
    Totals,
    /// Subtotals (breakdown, filtered series, dashboard, top by value): breakdown tiers only.
    Breakdown,
}

/// Why no tier qualifies, as a sentence for the `no_tier_for_range` answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NoTier {
    pub message: String,
}

/// The greatest common divisor (`gcd(0, b) = b`): of resolutions, the bucket every one of
/// them is made of.
pub fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The coarsest alignment every boundary has: the largest divisor of 3600 that divides
/// each of them. A tier of resolution `r` (which divides 3600) fits iff `r` divides it.
pub fn alignment(boundaries: &[i64]) -> i64 {
    boundaries
        .iter()
        .fold(3600, |g, b| gcd(g, b.rem_euclid(3600)))
}

/// How a resolution reads in a sentence: "hourly data", "minute data", "15m data".
fn word(r: Duration) -> String {
    match r.secs() {
        1 => "per-second".into(),
        60 => "minute".into(),
        3600 => "hourly".into(),
        _ => r.to_string(),
    }
}

fn words<'a>(tiers: impl Iterator<Item = &'a Tier>) -> String {
    let all: Vec<String> = tiers.map(|t| word(t.resolution)).collect();
    match all.as_slice() {
        [] => "no".into(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// An age in a sentence: "57h", "12m", "40s".
fn ago(secs: i64) -> String {
    match secs {
        s if s >= 3600 => format!("{}h", s / 3600),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{}s", s.max(0)),
    }
}

/// Where in the UTC hour a boundary falls: ":30", or ":58:59".
fn at(b: i64) -> String {
    let (m, s) = (b.rem_euclid(3600) / 60, b.rem_euclid(60));
    if s == 0 {
        format!(":{m:02}")
    } else {
        format!(":{m:02}:{s:02}")
    }
}

/// Chooses the tier for a range whose boundaries (both ends included) are `boundaries`.
/// `what` names those boundaries for a message: `"Asia/Kolkata day"`, `"range"`.
pub fn choose(
    ns: &Namespace,
    schema: &Schema,
    purpose: Purpose,
    boundaries: &[i64],
    what: &str,
    now: i64,
) -> Result<Tier, NoTier> {
    let candidates: Vec<&Tier> = match purpose {
        Purpose::Totals => schema.tiers().iter().collect(),
        Purpose::Breakdown => schema.breakdown_tiers().collect(),
    };
    let from = boundaries.first().copied().unwrap_or(now);
    let g = alignment(boundaries);
    let aligned = |t: &&&Tier| g % t.resolution.secs_i64() == 0;
    let holds = |t: &&&Tier| t.retention.holds_from(from, now);
    if let Some(t) = candidates.iter().rev().filter(aligned).find(holds) {
        return Ok(**t);
    }
    let kind = match purpose {
        Purpose::Totals => "",
        Purpose::Breakdown => "breakdowns in ",
    };
    if candidates.is_empty() {
        return Err(NoTier {
            message: format!("namespace {ns} keeps no breakdown tiers"),
        });
    }
    if let Some(longest) = candidates
        .iter()
        .filter(aligned)
        .max_by_key(|t| match t.retention {
            Retention::Forever => u64::MAX,
            Retention::For(d) => d.secs(),
        })
    {
        let mut message = format!(
            "{} data is kept for {}, and the range starts {} ago",
            word(longest.resolution),
            longest.retention,
            ago(now.saturating_sub(from))
        );
        // Say why the tiers that do hold the range cannot serve it.
        let holding: Vec<&Tier> = candidates.iter().filter(holds).copied().collect();
        let misaligned = holding
            .iter()
            .flat_map(|t| {
                boundaries
                    .iter()
                    .find(|b| b.rem_euclid(t.resolution.secs_i64()) != 0)
            })
            .next();
        if let Some(b) = misaligned {
            message.push_str(&format!(
                "; {} data holds it, but {what} boundaries fall on {}",
                words(holding.into_iter()),
                at(*b)
            ));
        }
        return Err(NoTier { message });
    }
    let finest = candidates
        .iter()
        .map(|t| t.resolution.secs_i64())
        .min()
        .unwrap_or(3600);
    let off = boundaries
        .iter()
        .find(|b| b.rem_euclid(finest) != 0)
        .copied()
        .unwrap_or(from);
    let suggest = Duration::from_secs(g.unsigned_abs()).map_or("1s".into(), |d| d.to_string());
    Err(NoTier {
        message: format!(
            "namespace {ns} keeps {kind}{} data; {what} boundaries fall on {} — add a {suggest} or finer tier",
            words(candidates.iter().copied()),
            at(off)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SchemaDoc;

    fn schema(tiers: &[&str], bd: Option<&[&str]>) -> Schema {
        Schema::from_doc(&SchemaDoc {
            tiers: tiers.iter().map(|s| s.to_string()).collect(),
            breakdown_tiers: bd.map(|b| b.iter().map(|s| s.to_string()).collect()),
            dimensions: None,
        })
        .unwrap()
    }

    const NOW: i64 = 1_790_000_000 - 1_790_000_000 % 3600;
    const H: i64 = 3600;

    #[test]
    fn table() {
        let ns = Namespace::new("clicks").unwrap();
        let api = schema(&["1s:2h", "1m:48h", "1h:forever"], Some(&["1m", "1h"]));
        let hourly = schema(&["1h:forever"], None);
        let kolkata_day = [NOW - 5 * H - 1800, NOW + 19 * H - 1800];
        type Case<'a> = (&'a Schema, Purpose, Vec<i64>, Result<&'a str, &'a str>);
        let cases: Vec<Case> = vec![
            // Whole hours, recent: the coarsest tier wins.
            (
                &api,
                Purpose::Totals,
                vec![NOW - 3 * H, NOW],
                Ok("1h:forever"),
            ),
            // Minute boundaries: the minute tier, while it holds the range.
            (
                &api,
                Purpose::Totals,
                vec![NOW - 600, NOW - 60],
                Ok("1m:2d"),
            ),
            // Second boundaries within 2h.
            (&api, Purpose::Totals, vec![NOW - 61, NOW - 1], Ok("1s:2h")),
            // Second boundaries older than 2h: nothing holds them.
            (
                &api,
                Purpose::Totals,
                vec![NOW - 3 * H - 1, NOW],
                Err(
                    "per-second data is kept for 2h, and the range starts 3h ago; minute and hourly data holds it, but Asia/Kolkata day boundaries fall on :59:59",
                ),
            ),
            // Minute boundaries older than 48h.
            (
                &api,
                Purpose::Totals,
                vec![NOW - 49 * H - 60, NOW],
                Err(
                    "minute data is kept for 2d, and the range starts 49h ago; hourly data holds it, but Asia/Kolkata day boundaries fall on :59",
                ),
            ),
            // Kolkata days on an hourly-only namespace.
            (
                &hourly,
                Purpose::Totals,
                kolkata_day.to_vec(),
                Err(
                    "namespace clicks keeps hourly data; Asia/Kolkata day boundaries fall on :30 — add a 30m or finer tier",
                ),
            ),
            // ... but a namespace with a minute tier serves them while it holds them.
            (&api, Purpose::Totals, kolkata_day.to_vec(), Ok("1m:2d")),
            // Breakdowns ignore the 1s tier.
            (
                &api,
                Purpose::Breakdown,
                vec![NOW - 61, NOW - 1],
                Err(
                    "namespace clicks keeps breakdowns in minute and hourly data; Asia/Kolkata day boundaries fall on :58:59 — add a 1s or finer tier",
                ),
            ),
            (
                &api,
                Purpose::Breakdown,
                vec![NOW - 2 * H, NOW],
                Ok("1h:forever"),
            ),
            // No boundaries (from == to): the coarsest tier.
            (&api, Purpose::Totals, vec![], Ok("1h:forever")),
        ];
        for (i, (schema, purpose, bounds, want)) in cases.into_iter().enumerate() {
            let got = choose(&ns, schema, purpose, &bounds, "Asia/Kolkata day", NOW);
            match (got, want) {
                (Ok(t), Ok(w)) => assert_eq!(t.to_string(), w, "case {i}"),
                (Err(e), Err(w)) => assert!(e.message.starts_with(w), "case {i}: {}", e.message),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn no_breakdown_tiers() {
        let ns = Namespace::new("x").unwrap();
        let s = schema(&["1h:forever"], Some(&[]));
        let e = choose(&ns, &s, Purpose::Breakdown, &[0, H], "range", NOW).unwrap_err();
        assert_eq!(e.message, "namespace x keeps no breakdown tiers");
    }
}

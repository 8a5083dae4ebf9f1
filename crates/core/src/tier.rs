//! Tier choice (SPEC §2): the coarsest tier that holds the whole range and has every
//! boundary of the range on one of its own bucket boundaries. A pure function: the answer
//! depends only on the schema, the boundaries and `now`, and a refusal says why.
//!
//! A tier holds a range when its retention still keeps the range's start and it has
//! counted every event from there on: one that a schema change added, made a breakdown
//! tier or gave a longer retention holds nothing (or not everything) from before the
//! change (the schema's [`crate::model::Coverage`]).
//!
//! Totals (series without `dim`, window, top without `dim`) read every tier; subtotals
//! (breakdown, filtered series, dashboard, top by value) only breakdown tiers.

use crate::model::{Duration, Namespace, Reads, Retention, Schema, Tier};

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

/// An instant in a sentence: `2026-11-27T20:00:00Z`.
fn instant(t: i64) -> String {
    jiff::Timestamp::from_second(t).map_or_else(|_| t.to_string(), |t| t.to_string())
}

/// Where in the UTC hour a boundary falls, in words: "30 minutes past the hour", "58 min
/// 59 s past the hour".
fn at(b: i64) -> String {
    let (m, s) = (b.rem_euclid(3600) / 60, b.rem_euclid(60));
    let plural = |n: i64| if n == 1 { "" } else { "s" };
    match (m, s) {
        (m, 0) => format!("{m} minute{} past the hour", plural(m)),
        (0, s) => format!("{s} second{} past the hour", plural(s)),
        (m, s) => format!("{m} min {s} s past the hour"),
    }
}

/// Chooses the tier for a range whose boundaries (both ends included) are `boundaries`.
/// `what` names those boundaries for a message: `"Asia/Kolkata day"`, `"range"`.
pub fn choose(
    ns: &Namespace,
    schema: &Schema,
    reads: Reads<'_>,
    boundaries: &[i64],
    what: &str,
    now: i64,
) -> Result<Tier, NoTier> {
    let candidates: Vec<&Tier> = match reads {
        Reads::Totals => schema.tiers().iter().collect(),
        Reads::Subtotals | Reads::Dimension(_) => schema.breakdown_tiers().collect(),
    };
    let from = boundaries.first().copied().unwrap_or(now);
    let g = alignment(boundaries);
    let aligned = |t: &&&Tier| g % t.resolution.secs_i64() == 0;
    // An empty range reads nothing: any tier answers it whole.
    let whole_from = |t: &Tier| {
        schema
            .whole_from(t.resolution, reads)
            .filter(|_| !boundaries.is_empty())
    };
    let kept = |t: &&&Tier| t.retention.holds_from(from, now);
    let holds = |t: &&&Tier| kept(t) && whole_from(t).is_none_or(|s| from >= s);
    if let Some(t) = candidates.iter().rev().filter(aligned).find(holds) {
        return Ok(**t);
    }
    let kind = match reads {
        Reads::Totals => "",
        Reads::Subtotals | Reads::Dimension(_) => "breakdowns in ",
    };
    if candidates.is_empty() {
        return Err(NoTier {
            message: format!("namespace {ns} keeps no breakdown tiers"),
        });
    }
    // A tier that keeps the range but has not counted all of it since a schema change.
    if let Some((t, since)) = candidates
        .iter()
        .rev()
        .filter(aligned)
        .filter(kept)
        .find_map(|t| Some((t, whole_from(t)?)))
    {
        let part = match reads {
            Reads::Dimension(d)
                if schema.whole_from(t.resolution, Reads::Subtotals) < Some(since) =>
            {
                format!("breakdowns by {d} are")
            }
            Reads::Totals => format!("{} data is", word(t.resolution)),
            _ => format!("breakdowns in {} data are", word(t.resolution)),
        };
        return Err(NoTier {
            message: format!(
                "{part} whole only from {} (a schema change then added them or lengthened \
                 their retention), and the {what} starts at {}",
                instant(since),
                instant(from)
            ),
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
                "; {} data holds it, but {what} boundaries fall {}",
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
    // A breakdown read whose range a tier keeping totals only would serve: that tier is
    // the one to keep breakdowns in (a review saw "add a 1s tier" to a namespace with one).
    let totals_only = match reads {
        Reads::Totals => None,
        Reads::Subtotals | Reads::Dimension(_) => schema
            .tiers()
            .iter()
            .filter(|t| g % t.resolution.secs_i64() == 0 && t.retention.holds_from(from, now))
            .max_by_key(|t| t.resolution.secs()),
    };
    let advice = match totals_only {
        Some(t) => format!("add {} to its breakdown_tiers", t.resolution),
        None => format!("add a {suggest} or finer tier"),
    };
    Err(NoTier {
        message: format!(
            "namespace {ns} keeps {kind}{} data; {what} boundaries fall {} — {advice}",
            words(candidates.iter().copied()),
            at(off)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SchemaDoc;

    /// A boundary is named by where it falls in its hour, in words: a black-box review read
    /// the old ":01" (one minute past) as a second.
    #[test]
    fn boundaries_are_named_by_where_they_fall_in_the_hour() {
        assert_eq!(at(60), "1 minute past the hour");
        assert_eq!(at(7200 + 1800), "30 minutes past the hour");
        assert_eq!(at(1), "1 second past the hour");
        assert_eq!(at(45), "45 seconds past the hour");
        assert_eq!(at(3599), "59 min 59 s past the hour");
        assert_eq!(at(-60), "59 minutes past the hour");
    }

    fn schema(tiers: &[&str], bd: Option<&[&str]>) -> Schema {
        Schema::from_doc(&SchemaDoc {
            tiers: tiers.iter().map(|s| s.to_string()).collect(),
            breakdown_tiers: bd.map(|b| b.iter().map(|s| s.to_string()).collect()),
            dimensions: None,
        })
        .unwrap()
    }

    const NOW: i64 = 1_790_000_000 - 1_790_000_000 % 3600;

    type Case<'a> = (&'a Schema, Reads<'a>, Vec<i64>, Result<&'a str, &'a str>);
    const H: i64 = 3600;

    #[test]
    fn table() {
        let ns = Namespace::new("clicks").unwrap();
        let api = schema(&["1s:2h", "1m:48h", "1h:forever"], Some(&["1m", "1h"]));
        let hourly = schema(&["1h:forever"], None);
        let kolkata_day = [NOW - 5 * H - 1800, NOW + 19 * H - 1800];
        let cases: Vec<Case> = vec![
            // Whole hours, recent: the coarsest tier wins.
            (
                &api,
                Reads::Totals,
                vec![NOW - 3 * H, NOW],
                Ok("1h:forever"),
            ),
            // Minute boundaries: the minute tier, while it holds the range.
            (&api, Reads::Totals, vec![NOW - 600, NOW - 60], Ok("1m:2d")),
            // Second boundaries within 2h.
            (&api, Reads::Totals, vec![NOW - 61, NOW - 1], Ok("1s:2h")),
            // Second boundaries older than 2h: nothing holds them.
            (
                &api,
                Reads::Totals,
                vec![NOW - 3 * H - 1, NOW],
                Err(
                    "per-second data is kept for 2h, and the range starts 3h ago; minute and hourly data holds it, but Asia/Kolkata day boundaries fall 59 min 59 s past the hour",
                ),
            ),
            // Minute boundaries older than 48h.
            (
                &api,
                Reads::Totals,
                vec![NOW - 49 * H - 60, NOW],
                Err(
                    "minute data is kept for 2d, and the range starts 49h ago; hourly data holds it, but Asia/Kolkata day boundaries fall 59 minutes past the hour",
                ),
            ),
            // Kolkata days on an hourly-only namespace.
            (
                &hourly,
                Reads::Totals,
                kolkata_day.to_vec(),
                Err(
                    "namespace clicks keeps hourly data; Asia/Kolkata day boundaries fall 30 minutes past the hour — add a 30m or finer tier",
                ),
            ),
            // ... but a namespace with a minute tier serves them while it holds them.
            (&api, Reads::Totals, kolkata_day.to_vec(), Ok("1m:2d")),
            // Breakdowns ignore the 1s tier, and the advice says to keep them in it.
            (
                &api,
                Reads::Dimension("country"),
                vec![NOW - 61, NOW - 1],
                Err(
                    "namespace clicks keeps breakdowns in minute and hourly data; Asia/Kolkata day boundaries fall 58 min 59 s past the hour — add 1s to its breakdown_tiers",
                ),
            ),
            (
                &api,
                Reads::Subtotals,
                vec![NOW - 2 * H, NOW],
                Ok("1h:forever"),
            ),
            // No boundaries (from == to): the coarsest tier.
            (&api, Reads::Totals, vec![], Ok("1h:forever")),
        ];
        for (i, (schema, reads, bounds, want)) in cases.into_iter().enumerate() {
            let got = choose(&ns, schema, reads, &bounds, "Asia/Kolkata day", NOW);
            match (got, want) {
                (Ok(t), Ok(w)) => assert_eq!(t.to_string(), w, "case {i}"),
                (Err(e), Err(w)) => assert!(e.message.starts_with(w), "case {i}: {}", e.message),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// A schema change: what it adds holds every event only from the change on (plus the
    /// future an event may be dated in), a grown retention only what the old one kept; a
    /// query that would start earlier goes to a tier that holds it, or is refused.
    #[test]
    fn what_a_schema_change_adds_serves_only_ranges_after_it() {
        let ns = Namespace::new("clicks").unwrap();
        let future = 600;
        let change = NOW - 10 * H;
        let whole = change + future + 1;
        let before = schema(&["1m:2d"], Some(&["1m"]));
        // An hourly tier added, keeping breakdowns; the minute tier goes on.
        let after = schema(&["1m:2d", "1h:forever"], Some(&["1m", "1h"])).replacing(
            Some(&before),
            change,
            future,
        );
        let cases: Vec<Case> = vec![
            // Hours after the change (and its margin): the new hourly tier.
            (
                &after,
                Reads::Totals,
                vec![NOW - 5 * H, NOW],
                Ok("1h:forever"),
            ),
            (
                &after,
                Reads::Dimension("country"),
                vec![NOW - 5 * H, NOW],
                Ok("1h:forever"),
            ),
            // From the change's own hour: the minute tier still holds it whole.
            (&after, Reads::Totals, vec![change, NOW], Ok("1m:2d")),
            (&after, Reads::Subtotals, vec![change, NOW], Ok("1m:2d")),
            // Older than the minute tier keeps: the hourly tier has only part of it.
            (
                &after,
                Reads::Totals,
                vec![NOW - 50 * H, NOW],
                Err(
                    "hourly data is whole only from 2026-09-21T04:10:01Z (a schema change then added them or lengthened their retention), and the range starts at 2026-09-19T12:00:00Z",
                ),
            ),
            // An empty range reads nothing: any tier answers it.
            (&after, Reads::Totals, vec![], Ok("1h:forever")),
        ];
        check(&ns, cases);
        assert_eq!(
            after.whole_from(Duration::from_secs(3600).unwrap(), Reads::Totals),
            Some(whole)
        );
        assert_eq!(
            after.whole_from(Duration::from_secs(60).unwrap(), Reads::Subtotals),
            None
        );

        // A tier that starts keeping breakdowns: its totals go on, its subtotals start.
        let hourly = schema(&["1h:forever"], Some(&[]));
        let broken = schema(&["1h:forever"], Some(&["1h"])).replacing(Some(&hourly), change, 0);
        check(
            &ns,
            vec![
                (
                    &broken,
                    Reads::Totals,
                    vec![NOW - 20 * H, NOW],
                    Ok("1h:forever"),
                ),
                (
                    &broken,
                    Reads::Dimension("country"),
                    vec![NOW - 20 * H, NOW],
                    Err("breakdowns in hourly data are whole only from 2026-09-21T04:00:01Z"),
                ),
                (
                    &broken,
                    Reads::Dimension("country"),
                    vec![change + H, NOW],
                    Ok("1h:forever"),
                ),
            ],
        );

        // A retention that grows: the tier holds what the old one kept, from the change on.
        let short = schema(&["1m:2h", "1h:forever"], None);
        let grown = schema(&["1m:2d", "1h:forever"], None).replacing(Some(&short), change, future);
        let minutes = |from: i64| vec![from + 60, NOW - 60];
        check(
            &ns,
            vec![
                (&grown, Reads::Totals, minutes(change - 2 * H), Ok("1m:2d")),
                (
                    &grown,
                    Reads::Totals,
                    minutes(change - 3 * H),
                    Err("minute data is whole only from 2026-09-21T02:00:00Z"),
                ),
            ],
        );
        // A second change carries the marks on, and one the retention has passed is dropped.
        let again = grown.clone().replacing(Some(&grown), NOW, future);
        assert_eq!(again.coverage(), grown.coverage());
        let later = grown.clone().replacing(Some(&grown), NOW + 50 * H, future);
        assert!(later.coverage().is_empty(), "{:?}", later.coverage());
        // A namespace as created holds everything it was given.
        let created = after.clone().replacing(None, NOW, future);
        assert!(created.coverage().is_empty());
    }

    #[test]
    fn a_dimension_the_allow_list_starts_counting_serves_only_ranges_after_it() {
        let ns = Namespace::new("clicks").unwrap();
        let change = NOW - 10 * H;
        let dims = |list: Option<&[&str]>| {
            Schema::from_doc(&SchemaDoc {
                tiers: vec!["1h:forever".into()],
                breakdown_tiers: None,
                dimensions: list.map(|l| l.iter().map(|s| s.to_string()).collect()),
            })
            .unwrap()
        };
        let any = dims(None);
        // Simple dimensions were counted before; a compound was not.
        let listed =
            dims(Some(&["country", "device", "country+device"])).replacing(Some(&any), change, 0);
        let old = vec![NOW - 20 * H, NOW];
        check(
            &ns,
            vec![
                (
                    &listed,
                    Reads::Dimension("country"),
                    old.clone(),
                    Ok("1h:forever"),
                ),
                (
                    &listed,
                    Reads::Dimension("country+device"),
                    old.clone(),
                    Err("breakdowns by country+device are whole only from 2026-09-21T04:00:01Z"),
                ),
                (&listed, Reads::Subtotals, old.clone(), Ok("1h:forever")),
            ],
        );
        // Back to any simple dimension: the compound goes; `device` stays whole, and a
        // dimension the list left out (counted by neither) starts now.
        let compounded = dims(Some(&["country+device"])).replacing(Some(&any), change, 0);
        let open = dims(None).replacing(Some(&compounded), NOW, 0);
        check(
            &ns,
            vec![
                (
                    &open,
                    Reads::Dimension("country"),
                    vec![change, NOW + H],
                    Err("breakdowns by country are whole only from 2026-09-21T14:00:01Z"),
                ),
                (
                    &open,
                    Reads::Dimension("country"),
                    vec![NOW + H, NOW + 2 * H],
                    Ok("1h:forever"),
                ),
            ],
        );
        // Dropping an allow-list keeps what it listed whole (found by review: `country`,
        // counted since the namespace was made, fell under the mark of the unlisted ones).
        let only = dims(Some(&["country"])).replacing(Some(&any), change, 0);
        let dropped = dims(None).replacing(Some(&only), NOW, 0);
        check(
            &ns,
            vec![
                (
                    &dropped,
                    Reads::Dimension("country"),
                    old.clone(),
                    Ok("1h:forever"),
                ),
                (
                    &dropped,
                    Reads::Dimension("device"),
                    old.clone(),
                    Err("breakdowns by device are whole only from 2026-09-21T14:00:01Z"),
                ),
            ],
        );
        let relisted = dims(Some(&["country", "country+device"])).replacing(Some(&listed), NOW, 0);
        assert_eq!(
            relisted.whole_from(
                Duration::from_secs(3600).unwrap(),
                Reads::Dimension("country+device")
            ),
            Some(change + 1),
            "a dimension kept keeps its mark"
        );
    }

    fn check(ns: &Namespace, cases: Vec<Case>) {
        for (i, (schema, reads, bounds, want)) in cases.into_iter().enumerate() {
            let got = choose(ns, schema, reads, &bounds, "range", NOW);
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
        let e = choose(&ns, &s, Reads::Subtotals, &[0, H], "range", NOW).unwrap_err();
        assert_eq!(e.message, "namespace x keeps no breakdown tiers");
    }
}

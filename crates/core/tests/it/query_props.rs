//! Properties of whole queries: calendar rollups against a brute-force assignment of each
//! event to its local period, and the breakdown invariant `Σ values + other + unset == total`.

use std::collections::BTreeMap;

use crate::queries::Db;
use proptest::prelude::*;

use crate::ZONES;

/// The local period of an instant, by jiff's zoned arithmetic: the label a person would
/// write on the bucket ("2026-11-01", "2026-11 week of the 1st", "01:00 first/second time").
fn label(unit: &str, tz: &jiff::tz::TimeZone, t: i64) -> (jiff::civil::Date, i64) {
    let z = jiff::Timestamp::from_second(t)
        .unwrap()
        .to_zoned(tz.clone());
    let d = z.date();
    match unit {
        "day" => (d, 0),
        "mweek" => (
            d - jiff::Span::new().days(d.weekday().to_monday_zero_offset()),
            0,
        ),
        "month" => (d.first_of_month(), 0),
        _ => unreachable!(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every event lands in the point whose local period holds it, in every zone.
    #[test]
    fn rollups_match_brute_force(
        zone in 0..ZONES.len(),
        unit in prop::sample::select(vec!["day", "mweek", "month"]),
        start in 631_152_000i64..2_177_452_800,
        events in prop::collection::vec((0i64..90 * 86_400, -5i64..20), 1..60),
    ) {
        let db = Db::new("2041-01-01T00:00:00Z");
        db.schema("ns", &["15m:forever"], None, None);
        let raws: Vec<_> = events.iter().map(|(dt, n)| Db::raw("ns", "k", start + dt, *n, &[])).collect();
        db.ingest(&raws).unwrap();
        let (from, to) = (start.to_string(), (start + 90 * 86_400).to_string());
        let a = db.series("ns", "k", &[("from", &from), ("to", &to), ("unit", unit), ("tz", ZONES[zone])]).unwrap();
        let tz = jiff::tz::TimeZone::get(ZONES[zone]).unwrap();
        // Brute force: group events by their local period label.
        let mut want: BTreeMap<(jiff::civil::Date, i64), i64> = BTreeMap::new();
        for (dt, n) in &events {
            *want.entry(label(unit, &tz, start + dt)).or_default() += n;
        }
        let mut got: BTreeMap<(jiff::civil::Date, i64), i64> = BTreeMap::new();
        for p in &a.points {
            // A point's own label is its start's period; it must be unique.
            prop_assert!(got.insert(label(unit, &tz, p.ts), p.n).is_none(), "two points share a period");
        }
        for (k, n) in &want {
            prop_assert_eq!(got.get(k).copied().unwrap_or(0), *n, "period {:?}", k);
        }
        prop_assert_eq!(a.total, events.iter().map(|(_, n)| n).sum::<i64>());
        prop_assert_eq!(a.points.iter().map(|p| p.n).sum::<i64>(), a.total);
    }

    /// Σ values + other + unset == total, values exact, sorted, non-zero, at most `limit`.
    #[test]
    fn breakdown_invariant(
        events in prop::collection::vec((0i64..48, -3i64..10, prop::option::of(0usize..6)), 0..80),
        limit in 1usize..8,
    ) {
        const COUNTRIES: [&str; 6] = ["US", "DE", "BR", "IN", "FR", "JP"];
        let db = Db::new("2026-11-20T00:00:00Z");
        db.schema("ns", &["1h:forever"], None, None);
        let base = 1_795_000_000 - 1_795_000_000 % 86_400;
        let raws: Vec<_> = events.iter().map(|(h, n, c)| {
            let dims: Vec<(&str, &str)> = c.map(|c| ("country", COUNTRIES[c])).into_iter().collect();
            Db::raw("ns", "k", base + h * 3600, *n, &dims)
        }).collect();
        db.ingest(&raws).unwrap();
        let limit_s = limit.to_string();
        let (from, to) = (base.to_string(), (base + 2 * 86_400).to_string());
        let a = db.breakdown("ns", "k", &[("dim", "country"), ("from", &from), ("to", &to), ("limit", &limit_s)]).unwrap();
        let shown: i64 = a.values.iter().map(|v| v.n).sum();
        prop_assert_eq!(shown + a.other + a.unset, a.total);
        prop_assert_eq!(a.total, events.iter().map(|(_, n, _)| n).sum::<i64>());
        let mut exact: BTreeMap<&str, i64> = BTreeMap::new();
        for (_, n, c) in &events {
            if let Some(c) = c {
                *exact.entry(COUNTRIES[*c]).or_default() += n;
            }
        }
        prop_assert_eq!(a.unset, events.iter().filter(|e| e.2.is_none()).map(|e| e.1).sum::<i64>());
        prop_assert!(a.values.len() <= limit);
        for v in &a.values {
            prop_assert!(v.n != 0);
            prop_assert_eq!(exact[v.value.as_str()], v.n);
        }
        for w in a.values.windows(2) {
            prop_assert!(w[0].n > w[1].n || (w[0].n == w[1].n && w[0].value < w[1].value));
        }
    }
}

//! Tops of keys over random histories: two namespaces with the same key names, skewed
//! counts with ties and sometimes decrements, interleaved with flushes (day and delta
//! segments, keys forgotten), compactions and clock moves; ranges on hours and minutes,
//! some past the minute tier's retention. Every path of a top (memory alone, by rank, by
//! thresholds, by name) answers what the reference answers. (Written by an independent
//! review of the top by thresholds.)

use tally_core::model::Namespace;
use tally_core::reference::MemStore;
use tally_core::store::{Clock, Scan, Store};

use crate::NOW;
use crate::archive::{open_with, write_both};
use crate::raw;

const DAY: i64 = 86_400;

fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let reference = MemStore::new(clock.clone());
    let e = open_with(dir.path(), &clock, tally_engine::FlushPolicy::default());
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(11);
    let mut next = move |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let nkeys = 1 + next(60);
    let neg = next(4) == 0;
    let deadline = tally_core::store::Deadline::none();
    for step in 0..14 {
        let now = clock.now();
        let today = now - now % DAY;
        match next(6) {
            0..=2 => {
                let mut ev = Vec::new();
                for _ in 0..(1 + next(150)) {
                    let ns = ["a", "b"][next(2) as usize];
                    let k = next(nkeys);
                    let key = format!("k{:02}", k * k / nkeys.max(1));
                    let ts = today - 4 * DAY + next(5 * 24) as i64 * 3600 + next(3600) as i64;
                    let ts = ts.min(now);
                    let n = if neg && next(10) == 0 {
                        -1
                    } else {
                        1 + next(3) as i64
                    };
                    ev.push(raw(ns, &key, ts, n, &[]));
                }
                write_both(&e, &reference, now, &ev);
            }
            3 => {
                e.flush().unwrap();
            }
            4 => {
                let _ = e.compact();
            }
            _ => clock.advance(next(4 * 3600) as i64),
        }
        let now = clock.now();
        let today = now - now % DAY;
        for _ in 0..12 {
            let minute = next(2) == 0;
            let (res, from, to) = if minute {
                let from = today - 3 * DAY + next(4 * 24 * 60) as i64 * 60;
                let to = if next(2) == 0 {
                    from + (1 + next(3 * 24)) as i64 * 3600
                } else {
                    from + (1 + next(3 * 24 * 60)) as i64 * 60
                };
                (60, from, to)
            } else {
                let from = today - 5 * DAY + next(6 * 24) as i64 * 3600;
                (3600, from, from + (1 + next(3 * 24)) as i64 * 3600)
            };
            for ns in ["a", "b"] {
                let ns = Namespace::new(ns).unwrap();
                let scan = Scan {
                    ns: &ns,
                    resolution: tally_core::model::Duration::from_secs(res).unwrap(),
                    from,
                    to,
                    value: None,
                    deadline: &deadline,
                };
                for limit in [0, 1, 2, 3, 5, 10, 1000] {
                    assert_eq!(
                        e.top(&scan, limit).unwrap(),
                        reference.top(&scan, limit).unwrap(),
                        "seed {seed} step {step}: {ns} top {limit} over {from}..{to}"
                    );
                }
            }
        }
    }
}

#[test]
fn tops_over_random_histories_match_the_reference() {
    for seed in 0..40 {
        run(seed);
    }
}

/// Breakdowns and dashboards read only the values they answer (`KeyRead::keep`): the
/// engine ranks each dimension's sums before copying any value out, and answers the others
/// as one sum. Their answers are the reference's (which reads every value) for every
/// limit, over values with ties, decrements, sums netting to 0, and counts split between
/// the archive and memory.
#[test]
fn breakdowns_and_dashboards_keeping_few_values_answer_as_the_reference() {
    use tally_core::query::{self, BreakdownQuery, DashboardQuery};
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::clock(NOW);
    let reference = MemStore::new(clock.clone());
    let e = open_with(dir.path(), &clock, tally_engine::FlushPolicy::default());
    let day = NOW - NOW % DAY;
    let mut ev = Vec::new();
    // Values v0..v11 of `country` with counts 3, 3, 2, 2, 1, …, some negative or netting
    // to 0; `device` with few values; some events with neither (unset).
    for i in 0..12i64 {
        let n = [3, 3, 2, 2, 1, -1, 5, 0, 2, 1, 1, 4][i as usize];
        let value = format!("v{i:02}");
        ev.push(raw(
            "m",
            "k",
            day - DAY + 3600 * (i % 5),
            n,
            &[("country", &value)],
        ));
        ev.push(raw(
            "m",
            "k",
            day - DAY + 60,
            1,
            &[("device", ["a", "b"][i as usize % 2])],
        ));
    }
    ev.push(raw(
        "m",
        "k",
        day - DAY + 7200,
        2,
        &[("country", "v07"), ("device", "c")],
    ));
    ev.push(raw("m", "k", day - DAY + 7200, -2, &[("country", "v07")]));
    ev.push(raw("m", "k", day - DAY, 6, &[]));
    let (old, late) = ev.split_at(ev.len() / 2);
    write_both(&e, &reference, NOW, old);
    e.flush().unwrap();
    write_both(&e, &reference, NOW, late);
    let p = |limit: usize| {
        [
            ("from", (day - 2 * DAY).to_string()),
            ("to", day.to_string()),
            ("limit", limit.to_string()),
        ]
    };
    let ctx = || query::Ctx {
        now: clock.now(),
        max_points: 100_000,
        deadline: tally_core::store::Deadline::none(),
    };
    for limit in [1, 2, 3, 4, 5, 11, 12, 13, 100] {
        let params = p(limit);
        let params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut with_dim = params.clone();
        with_dim.push(("dim", "country"));
        let b = BreakdownQuery::parse("m", "k", &with_dim[..]).unwrap();
        let got = query::breakdown(&e, ctx(), &b).unwrap();
        assert_eq!(
            got,
            query::breakdown(&reference, ctx(), &b).unwrap(),
            "limit {limit}"
        );
        // v07 nets to 0: 11 values to rank.
        assert_eq!(got.values.len(), limit.min(11), "limit {limit}");
        let mut daily = params.clone();
        daily.push(("unit", "day"));
        let d = DashboardQuery::parse("m", "k", &daily[..]).unwrap();
        assert_eq!(
            query::dashboard(&e, ctx(), &d).unwrap(),
            query::dashboard(&reference, ctx(), &d).unwrap(),
            "limit {limit}"
        );
    }
}

//! What this machine allows the engine's in-memory work, measured outside the engine: the
//! clickstream workload's counter updates as bare loops over flat hash maps, with the ids
//! worked out beforehand. No log, no names, no locks: the floor an apply path's memory work
//! stands on, to read beside `tally-bench replay`'s figures.
//!
//! Per event, as the engine counts it with the default schema (`1m:48h`, `1h:forever`,
//! breakdowns in `1h`): the key's minute total, its hour total, and the hour subtotals of
//! its country and of its referrer — four updates of `series << 32 | bucket` counters, in
//! one map per kind as the engine keeps one per (resolution, totals or subtotals).

use std::collections::HashMap;
use std::time::Instant;

use tally_core::store::{Clock, SystemClock};

use crate::workload::{Generator, Shape};

type Counters = HashMap<u64, i64, foldhash::fast::FixedState>;

fn counter(series: u32, bucket: u32) -> u64 {
    u64::from(series) << 32 | u64::from(bucket)
}

/// One event with its series ids: key (the total series), the (key, country) and (key,
/// referrer) subtotal series, the minute and the hour.
#[derive(Clone, Copy)]
struct Ids {
    key: u32,
    country: u32,
    referrer: u32,
    sub_country: u32,
    sub_referrer: u32,
    minute: u32,
    hour: u32,
}

pub fn bench(args: &[String]) {
    let runs: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("runs="))
        .map_or(5, |v| v.parse().expect("runs=N"))
        .max(1);
    let events = 2_000_000;
    let now = SystemClock.now();
    let mut g = Generator::new(Shape::default(), 42);
    // Subtotal series numbered as first seen, after the keys' total series.
    let mut subs: HashMap<(u32, u32), u32, foldhash::fast::FixedState> = HashMap::default();
    let mut next = Shape::default().keys as u32;
    let mut sub = |key: u32, value: u32| {
        *subs.entry((key, value)).or_insert_with(|| {
            next += 1;
            next
        })
    };
    let ids: Vec<Ids> = (0..events)
        .map(|_| {
            let d = g.draw(|r| now - (r.next_u64() % 3600) as i64);
            let (key, country) = (d.key as u32, d.country as u32);
            // Referrers numbered after the countries, so the two dimensions never share a
            // (key, value) pair.
            let referrer = 1_000 + d.referrer as u32;
            Ids {
                key,
                country,
                referrer,
                sub_country: sub(key, country),
                sub_referrer: sub(key, referrer),
                minute: (d.ts / 60) as u32,
                hour: (d.ts / 3600) as u32,
            }
        })
        .collect();
    let series = subs.len();
    // One pass over fresh maps, each event's subtotal series given by `sub_series`: ns per
    // event, and the counters made.
    let pass = |sub_series: &dyn Fn(&Ids) -> (u32, u32)| {
        let (mut minutes, mut hours, mut subtotals) = (
            Counters::default(),
            Counters::default(),
            Counters::default(),
        );
        let t = Instant::now();
        for e in &ids {
            let (c, r) = sub_series(e);
            *minutes.entry(counter(e.key, e.minute)).or_insert(0) += 1;
            *hours.entry(counter(e.key, e.hour)).or_insert(0) += 1;
            *subtotals.entry(counter(c, e.hour)).or_insert(0) += 1;
            *subtotals.entry(counter(r, e.hour)).or_insert(0) += 1;
        }
        let ns = t.elapsed().as_nanos() as f64 / events as f64;
        (ns, minutes.len() + hours.len() + subtotals.len())
    };
    let (mut bare, mut looked_up) = (Vec::new(), Vec::new());
    let mut live = 0;
    for _ in 0..runs {
        let (ns, made) = pass(&|e| (e.sub_country, e.sub_referrer));
        bare.push(ns);
        live = made;
        let (ns, made) = pass(&|e| (subs[&(e.key, e.country)], subs[&(e.key, e.referrer)]));
        looked_up.push(ns);
        assert_eq!(made, live);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "| floor ({runs} runs, {events} events, {live} counters, {series} subtotal series, maps from empty) | median ns per event | every run |"
    );
    println!("|---|---|---|");
    for (what, v) in [
        ("four counter updates, ids known", &mut bare),
        (
            "the same, each subtotal series looked up by (key, value)",
            &mut looked_up,
        ),
    ] {
        let all = list(v);
        println!("| {what} | {:.0} | {all} |", median(v));
    }
}

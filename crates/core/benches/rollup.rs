//! Rolling one year of hourly buckets into days in America/New_York (issue: ≤ 50 µs).
//!
//! `boundaries+rollup` is the calendar work alone: the 366 day boundaries of 2026 in the
//! zone and the sum of 8760 hourly buckets into them. `+labels` adds formatting every
//! point's RFC 3339 string, as an answer does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tally_core::query::rollup;
use tally_core::time::{Calendar, Tz, Unit};

fn year_of_hours() -> (i64, i64, Vec<(i64, i64)>) {
    let from = 1_767_225_600; // 2026-01-01T00:00:00Z
    let to = from + 365 * 86_400 + 86_400;
    let buckets = (0..(to - from) / 3600)
        .map(|h| (from + h * 3600, h % 7 + 1))
        .collect();
    (from, to, buckets)
}

fn bench(c: &mut Criterion) {
    let (from, to, buckets) = year_of_hours();
    let cal = Calendar::new(Unit::Day, None, Tz::get("America/New_York").unwrap()).unwrap();
    let mut g = c.benchmark_group("rollup_year_hours_to_days_new_york");
    g.bench_function("boundaries+rollup", |b| {
        b.iter(|| {
            let (f, t) = cal.range(black_box(from), black_box(to)).unwrap();
            let bounds = cal.boundaries(f, t, 100_000).unwrap();
            black_box(rollup(black_box(&buckets), &bounds))
        })
    });
    g.bench_function("boundaries+rollup+labels", |b| {
        b.iter(|| {
            let (f, t) = cal.range(black_box(from), black_box(to)).unwrap();
            let bounds = cal.boundaries(f, t, 100_000).unwrap();
            let counts = rollup(black_box(&buckets), &bounds);
            let labels: Vec<String> = bounds.iter().map(|&b| cal.tz().rfc3339(b)).collect();
            black_box((counts, labels))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Execution: series, breakdown, dashboard, top and keys over a [`Store`].

use std::collections::BTreeMap;

use super::answer::{
    BreakdownAnswer, DashboardAnswer, KeyCount, KeysAnswer, Point, SeriesAnswer, Span, TopAnswer,
    ValueCount,
};
use super::params::{BreakdownQuery, DashboardQuery, KeysQuery, SeriesQuery, TopQuery};
use super::{Ctx, QueryError, time};
use crate::model::Reads;
use crate::model::{Dimension, Duration, Key, ModelError, Namespace, Schema};
use crate::store::{
    Buckets, Deadline, KeyData, KeyList, KeyRead, Scan, Store, StoreError, TopKeys, Want,
};
use crate::tier;
use crate::time::{Calendar, TimeError, Tz};

pub(super) fn schema_of(store: &dyn Store, ns: &Namespace) -> Result<Schema, QueryError> {
    store
        .schema(ns)?
        .ok_or_else(|| QueryError::UnknownNamespace { ns: ns.to_string() })
}

fn check_dim(schema: &Schema, dim: &Dimension) -> Result<(), QueryError> {
    let name = dim.name().to_owned();
    match (schema.knows_dimension(dim.name()), schema.dimensions()) {
        (true, _) => Ok(()),
        (false, None) if dim.is_compound() => Err(QueryError::Model {
            field: "dim",
            source: ModelError::UndeclaredCompound { name },
        }),
        (false, _) => Err(QueryError::Model {
            field: "dim",
            source: ModelError::UnknownDimension { name },
        }),
    }
}

/// How a calendar's boundaries are named in a `no_tier_for_range` message.
fn what(cal: &Calendar) -> String {
    match cal.every() {
        1 => format!("{} {}", cal.tz().name(), cal.unit()),
        n => format!("{} {n}-{}", cal.tz().name(), cal.unit()),
    }
}

/// Sums sorted sparse buckets into the buckets between consecutive `boundaries`.
pub fn rollup(buckets: &[(i64, i64)], boundaries: &[i64]) -> Vec<i64> {
    let n = boundaries.len().saturating_sub(1);
    let mut out = vec![0i64; n];
    let mut i = 0;
    for &(start, count) in buckets {
        if n == 0 || start < boundaries[0] {
            continue;
        }
        while i < n && start >= boundaries[i + 1] {
            i += 1;
        }
        if i == n {
            break;
        }
        out[i] = out[i].wrapping_add(count);
    }
    out
}

fn points(boundaries: &[i64], counts: &[i64], tz: &Tz) -> Vec<Point> {
    boundaries
        .iter()
        .zip(counts)
        .map(|(&ts, &n)| Point {
            ts,
            t: tz.rfc3339(ts),
            n,
        })
        .collect()
}

pub(super) fn sum(buckets: &Buckets) -> i64 {
    wrapping_sum(buckets.iter().map(|(_, n)| *n))
}

/// Counters are 64-bit and wrap (as every store keeps them): so do their sums, in a debug
/// build too.
pub(crate) fn wrapping_sum(ns: impl Iterator<Item = i64>) -> i64 {
    ns.fold(0, i64::wrapping_add)
}

/// Reads one key, giving up first if the query's time is already past (a read is bounded by
/// `max_points`, so one check on each side is enough).
pub(super) fn read_one(
    store: &dyn Store,
    read: KeyRead<'_>,
    deadline: &Deadline,
) -> Result<KeyData, QueryError> {
    deadline.check()?;
    let mut data = store.read(&[read])?;
    deadline.check()?;
    data.pop()
        .ok_or_else(|| StoreError::internal("a read returned no answer").into())
}

/// The exact, unit-less range `[from, to)` of breakdown and top, or the floored/ceiled one.
fn plain_range(from: i64, to: i64, cal: Option<&Calendar>) -> Result<(i64, i64), QueryError> {
    match cal {
        Some(c) => c.range(from, to).map_err(time("from")),
        None if from > to => Err(QueryError::Time {
            field: "from",
            source: TimeError::InvalidRange { from, to },
        }),
        None => Ok((from, to)),
    }
}

fn ends(from: i64, to: i64) -> Vec<i64> {
    if from < to {
        vec![from, to]
    } else {
        Vec::new()
    }
}

/// Values of one dimension summed, sorted by count (desc) then value bytes, zeros left out.
/// A breakdown's answer from its values (`left_out`: the sum of those the store left out,
/// [`KeyData::rest`], which are never among the first `limit`).
fn breakdown_of(
    head: BreakdownHead<'_>,
    total: i64,
    (mut values, left_out): (Vec<ValueCount>, i64),
    limit: usize,
) -> BreakdownAnswer {
    values.retain(|v| v.n != 0);
    let all = wrapping_sum(values.iter().map(|v| v.n)).wrapping_add(left_out);
    let order = |a: &ValueCount, b: &ValueCount| {
        b.n.cmp(&a.n)
            .then_with(|| a.value.as_bytes().cmp(b.value.as_bytes()))
    };
    // Only the first `limit` are answered in order: select them, then sort those alone
    // (a busy key has thousands of values). Values are distinct, so the order is total
    // and the selection is the one a full sort would make.
    if limit < values.len() {
        values.select_nth_unstable_by(limit, order);
    }
    let rest = wrapping_sum(values.iter().skip(limit).map(|v| v.n)).wrapping_add(left_out);
    values.truncate(limit);
    values.sort_unstable_by(order);
    BreakdownAnswer {
        ns: head.ns.to_string(),
        key: head.key.to_string(),
        dim: head.dim.to_owned(),
        resolution: head.resolution.to_string(),
        span: Span::new(head.from, head.to, head.tz),
        total,
        values,
        other: rest,
        unset: total.wrapping_sub(all),
    }
}

/// The sum of the values of `dim` a read left out ([`KeyRead::keep`]).
fn left_out(rest: &[(String, i64)], dim: &str) -> i64 {
    rest.iter()
        .filter(|(d, _)| d == dim)
        .fold(0i64, |t, (_, n)| t.wrapping_add(*n))
}

#[derive(Clone, Copy)]
struct BreakdownHead<'a> {
    ns: &'a Namespace,
    key: &'a Key,
    dim: &'a str,
    resolution: Duration,
    from: i64,
    to: i64,
    tz: &'a Tz,
}

pub fn series(store: &dyn Store, ctx: Ctx, q: &SeriesQuery) -> Result<SeriesAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    if let Some((dim, _)) = &q.filter {
        check_dim(&schema, dim)?;
    }
    let (from, to) = q.cal.range(q.from, q.to).map_err(time("from"))?;
    let bounds = q
        .cal
        .boundaries(from, to, ctx.max_points)
        .map_err(time("to"))?;
    let reads = match &q.filter {
        Some((d, _)) => Reads::Dimension(d.name()),
        None => Reads::Totals,
    };
    let tier = tier::choose(&q.ns, &schema, reads, &bounds, &what(&q.cal), ctx.now)?;
    let want = match &q.filter {
        None => Want::Totals,
        Some((d, v)) => Want::Value {
            dim: d.name(),
            value: v,
        },
    };
    let counts = if bounds.is_empty() {
        Vec::new()
    } else {
        let read = KeyRead {
            ns: &q.ns,
            key: &q.key,
            resolution: tier.resolution,
            from,
            to,
            want,
            sum_subtotals: false,
            keep: None,
        };
        let data = read_one(store, read, &ctx.deadline)?;
        let buckets = match &q.filter {
            None => data.totals,
            Some((d, v)) => data
                .subtotals
                .into_iter()
                .find(|s| s.dim == d.name() && s.value == *v)
                .map(|s| s.buckets)
                .unwrap_or_default(),
        };
        rollup(&buckets, &bounds)
    };
    let tz = q.cal.tz();
    Ok(SeriesAnswer {
        ns: q.ns.to_string(),
        key: q.key.to_string(),
        unit: q.cal.unit().as_str().to_owned(),
        every: q.cal.every(),
        tz: tz.name().to_owned(),
        resolution: tier.resolution.to_string(),
        dim: q.filter.as_ref().map(|(d, _)| d.name().to_owned()),
        value: q.filter.as_ref().map(|(_, v)| v.clone()),
        span: Span::new(from, to, tz),
        total: wrapping_sum(counts.iter().copied()),
        points: points(&bounds, &counts, tz),
    })
}

pub fn breakdown(
    store: &dyn Store,
    ctx: Ctx,
    q: &BreakdownQuery,
) -> Result<BreakdownAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    check_dim(&schema, &q.dim)?;
    let (from, to) = plain_range(q.from, q.to, q.cal.as_ref())?;
    let label = q.cal.as_ref().map_or_else(|| "range".to_owned(), what);
    let tier = tier::choose(
        &q.ns,
        &schema,
        Reads::Dimension(q.dim.name()),
        &ends(from, to),
        &label,
        ctx.now,
    )?;
    let read = KeyRead {
        ns: &q.ns,
        key: &q.key,
        resolution: tier.resolution,
        from,
        to,
        want: Want::Dim { dim: q.dim.name() },
        sum_subtotals: true,
        keep: Some(q.limit),
    };
    let data = if from < to {
        read_one(store, read, &ctx.deadline)?
    } else {
        Default::default()
    };
    let total = sum(&data.totals);
    let left_out = left_out(&data.rest, q.dim.name());
    let values = data
        .subtotals
        .into_iter()
        .filter(|s| s.dim == q.dim.name())
        .map(|s| ValueCount {
            n: sum(&s.buckets),
            value: s.value,
        })
        .collect();
    let head = BreakdownHead {
        ns: &q.ns,
        key: &q.key,
        dim: q.dim.name(),
        resolution: tier.resolution,
        from,
        to,
        tz: &q.tz,
    };
    Ok(breakdown_of(head, total, (values, left_out), q.limit))
}

pub fn dashboard(
    store: &dyn Store,
    ctx: Ctx,
    q: &DashboardQuery,
) -> Result<DashboardAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    let (from, to) = q.cal.range(q.from, q.to).map_err(time("from"))?;
    let bounds = q
        .cal
        .boundaries(from, to, ctx.max_points)
        .map_err(time("to"))?;
    let tier = tier::choose(
        &q.ns,
        &schema,
        Reads::Subtotals,
        &bounds,
        &what(&q.cal),
        ctx.now,
    )?;
    let read = KeyRead {
        ns: &q.ns,
        key: &q.key,
        resolution: tier.resolution,
        from,
        to,
        want: Want::All,
        sum_subtotals: true,
        keep: Some(q.limit),
    };
    let data = if bounds.is_empty() {
        Default::default()
    } else {
        read_one(store, read, &ctx.deadline)?
    };
    let counts = rollup(&data.totals, &bounds);
    let total = sum(&data.totals);
    let tz = q.cal.tz();
    let mut by_dim: BTreeMap<String, Vec<ValueCount>> = BTreeMap::new();
    // A dimension a schema change started counting after `from` has only part of the
    // range: its breakdown is left out rather than shown too small (the tier was chosen for
    // every subtotal, so this can only be one the allow-list added).
    // So is one the schema no longer counts: its subtotals stopped when it left.
    let whole = |dim: &str| {
        schema.knows_dimension(dim)
            && schema
                .whole_from(tier.resolution, Reads::Dimension(dim))
                .is_none_or(|s| from >= s)
    };
    // The values are moved, not copied: a key's values may be hundreds of megabytes.
    for s in data.subtotals.into_iter().filter(|s| whole(&s.dim)) {
        let n = sum(&s.buckets);
        if n != 0 {
            let value = ValueCount { value: s.value, n };
            match by_dim.get_mut(&s.dim) {
                Some(values) => values.push(value),
                None => {
                    by_dim.insert(s.dim, vec![value]);
                }
            }
        }
    }
    let breakdowns = by_dim
        .into_iter()
        .map(|(dim, values)| {
            let head = BreakdownHead {
                ns: &q.ns,
                key: &q.key,
                dim: &dim,
                resolution: tier.resolution,
                from,
                to,
                tz,
            };
            let left_out = left_out(&data.rest, &dim);
            let answer = breakdown_of(head, total, (values, left_out), q.limit);
            (dim, answer)
        })
        .collect();
    Ok(DashboardAnswer {
        ns: q.ns.to_string(),
        key: q.key.to_string(),
        unit: q.cal.unit().as_str().to_owned(),
        every: q.cal.every(),
        tz: tz.name().to_owned(),
        resolution: tier.resolution.to_string(),
        dim: None,
        value: None,
        span: Span::new(from, to, tz),
        total,
        timeline: points(&bounds, &counts, tz),
        breakdowns,
    })
}

pub fn top(store: &dyn Store, ctx: Ctx, q: &TopQuery) -> Result<TopAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    if let Some((dim, _)) = &q.filter {
        check_dim(&schema, dim)?;
    }
    let (from, to) = plain_range(q.from, q.to, q.cal.as_ref())?;
    let label = q.cal.as_ref().map_or_else(|| "range".to_owned(), what);
    let reads = match &q.filter {
        Some((d, _)) => Reads::Dimension(d.name()),
        None => Reads::Totals,
    };
    let tier = tier::choose(&q.ns, &schema, reads, &ends(from, to), &label, ctx.now)?;
    let mut found = TopKeys::default();
    if from < to {
        let scan = Scan {
            ns: &q.ns,
            resolution: tier.resolution,
            from,
            to,
            value: q.filter.as_ref().map(|(d, v)| (d.name(), v.as_str())),
            deadline: &ctx.deadline,
        };
        found = store.top(&scan, q.limit)?;
    }
    let total = found.total;
    let keys: Vec<KeyCount> = found
        .keys
        .into_iter()
        .map(|(k, n)| KeyCount {
            key: k.to_string(),
            n,
        })
        .collect();
    let shown = keys.iter().fold(0i64, |t, k| t.wrapping_add(k.n));
    Ok(TopAnswer {
        ns: q.ns.to_string(),
        dim: q.filter.as_ref().map(|(d, _)| d.name().to_owned()),
        value: q.filter.as_ref().map(|(_, v)| v.clone()),
        resolution: tier.resolution.to_string(),
        span: Span::new(from, to, &q.tz),
        total,
        keys,
        other: total.wrapping_sub(shown),
    })
}

pub fn keys(store: &dyn Store, q: &KeysQuery) -> Result<KeysAnswer, QueryError> {
    schema_of(store, &q.ns)?;
    let mut page = store.keys(&KeyList {
        ns: &q.ns,
        prefix: &q.prefix,
        after: q.after.as_deref(),
        limit: q.limit + 1,
    })?;
    let more = page.len() > q.limit;
    page.truncate(q.limit);
    let next = if more {
        page.last().map(|k| k.to_string())
    } else {
        None
    };
    Ok(KeysAnswer {
        ns: q.ns.to_string(),
        keys: page.into_iter().map(|k| k.to_string()).collect(),
        next,
    })
}

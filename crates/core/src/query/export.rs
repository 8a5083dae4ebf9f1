//! Export (SPEC §3 `GET /v1/ns/{ns}/export`, `tally export`): every key's totals and
//! subtotals of one tier over a range, as flat rows `ns, key, ts, resolution, dim, value, n`
//! (a total has an empty `dim` and `value`), for analytics tools.
//!
//! Rows come key by key in byte order of the key, a key's totals first (by `ts`), then its
//! subtotals (by dimension, value, `ts`); zero counts are left out. Keys are read
//! [`EXPORT_PAGE_KEYS`] at a time through [`Store::keys`] and [`Store::read`], so memory is
//! bounded by a page whatever the namespace's size, and any backend can export.

use super::params::{Params, required, span};
use super::{QueryError, model};
use crate::model::{Duration, Key, Namespace, Reads, Schema};
use crate::store::{Deadline, KeyList, KeyRead, Store, Want};
use crate::time::TimeError;

/// Keys read per round.
pub const EXPORT_PAGE_KEYS: usize = 256;

/// `export`: `from`, `to`, `resolution` (one of the namespace's tiers).
#[derive(Debug, Clone)]
pub struct ExportQuery {
    pub ns: Namespace,
    pub from: i64,
    pub to: i64,
    pub resolution: Duration,
}

impl ExportQuery {
    pub fn parse(ns: &str, p: &(impl Params + ?Sized)) -> Result<Self, QueryError> {
        let ns = Namespace::new(ns).map_err(model("ns"))?;
        let (from, to) = span(p, true)?;
        let resolution = Duration::new(required(p, "resolution")?).map_err(model("resolution"))?;
        Ok(ExportQuery {
            ns,
            from,
            to,
            resolution,
        })
    }
}

/// A checked export: the range widened to whole buckets of the tier, and whether the tier
/// keeps subtotals.
#[derive(Debug, Clone)]
pub struct ExportPlan {
    pub ns: Namespace,
    pub resolution: Duration,
    pub from: i64,
    pub to: i64,
    pub subtotals: bool,
    /// The namespace's schema: its coverage says from which bucket on a dimension's rows
    /// are whole.
    pub schema: Schema,
}

/// One row; `dim` and `value` are empty for a total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row<'a> {
    pub key: &'a str,
    pub ts: i64,
    pub dim: &'a str,
    pub value: &'a str,
    pub n: i64,
}

/// Checks an export against the namespace: it exists, `resolution` is one of its tiers, the
/// tier still keeps the range's first bucket at `now` (else the rows would silently start
/// later: `no_tier_for_range`, as a series over the range in that unit answers), and the
/// range holds at most `max_points` buckets of it (a key's read is bounded like a query's).
pub fn export_plan(
    store: &dyn Store,
    q: &ExportQuery,
    max_points: usize,
    now: i64,
) -> Result<ExportPlan, QueryError> {
    let schema = super::exec::schema_of(store, &q.ns)?;
    let res = q.resolution;
    if !schema.tiers().iter().any(|t| t.resolution == res) {
        let have: Vec<String> = schema
            .tiers()
            .iter()
            .map(|t| t.resolution.to_string())
            .collect();
        return Err(QueryError::InvalidParameter {
            field: "resolution",
            why: format!(
                "namespace {} has no {res} tier (its tiers: {})",
                q.ns,
                have.join(", ")
            ),
        });
    }
    if q.from > q.to {
        return Err(QueryError::Time {
            field: "from",
            source: TimeError::InvalidRange {
                from: q.from,
                to: q.to,
            },
        });
    }
    let r = res.secs_i64();
    let from = q.from.div_euclid(r) * r;
    // The ends widened to whole buckets, as a series in that unit widens them; `from == to`
    // gives no rows (SPEC §2), wherever the instant lies.
    let to = if q.from == q.to {
        from
    } else {
        q.to.div_euclid(r) * r + if q.to.rem_euclid(r) == 0 { 0 } else { r }
    };
    let buckets = (to - from) / r;
    if usize::try_from(buckets).map_or(true, |b| b > max_points) {
        return Err(QueryError::Time {
            field: "to",
            source: TimeError::TooManyPoints { max: max_points },
        });
    }
    if let Some(tier) = schema.tiers().iter().find(|t| t.resolution == res)
        && from < to
        && !tier.retention.keeps_bucket(from, res, now)
    {
        return Err(QueryError::NoTier(crate::tier::NoTier {
            message: format!(
                "{res} data of namespace {} is kept for {}, and the range starts before it; \
                 export a later range, or a coarser tier",
                q.ns, tier.retention
            ),
        }));
    }
    // Rows of a tier (or of subtotals, or of a dimension) a schema change started after
    // `from` would be too small, with nothing to say so.
    // (A dimension the allow-list began counting later only loses its rows before then:
    // see `export`.)
    let subtotals = schema.is_breakdown(res);
    let reads = if subtotals {
        Reads::Subtotals
    } else {
        Reads::Totals
    };
    if let Some(since) = schema.whole_from(res, reads)
        && from < to
        && from < since
    {
        return Err(QueryError::NoTier(crate::tier::NoTier {
            message: format!(
                "{res} data of namespace {} is whole only from {} (a schema change then added \
                 the tier or its breakdowns, or lengthened its retention), and the range \
                 starts before it; export a later range, or another tier",
                q.ns,
                jiff::Timestamp::from_second(since)
                    .map_or_else(|_| since.to_string(), |t| t.to_string())
            ),
        }));
    }
    Ok(ExportPlan {
        ns: q.ns.clone(),
        resolution: res,
        from,
        to,
        subtotals,
        schema,
    })
}

/// Visits the plan's rows, starting after key `after`; `deadline` gives each page's deadline.
/// `visit` returns false to stop early (a client that went away).
pub fn export(
    store: &dyn Store,
    plan: &ExportPlan,
    deadline: &dyn Fn() -> Deadline,
    visit: &mut dyn FnMut(&Row<'_>) -> bool,
) -> Result<(), QueryError> {
    let mut after: Option<String> = None;
    loop {
        let d = deadline();
        d.check()?;
        let page = store.keys(&KeyList {
            ns: &plan.ns,
            prefix: "",
            after: after.as_deref(),
            limit: EXPORT_PAGE_KEYS,
        })?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.to_string());
        let want = if plan.subtotals {
            Want::All
        } else {
            Want::Totals
        };
        let reads: Vec<KeyRead<'_>> = page
            .iter()
            .map(|key: &Key| KeyRead {
                ns: &plan.ns,
                key,
                resolution: plan.resolution,
                from: plan.from,
                to: plan.to,
                want,
                sum_subtotals: false,
                keep: None,
            })
            .collect();
        let data = store.read(&reads)?;
        d.check()?;
        for (key, data) in page.iter().zip(&data) {
            let key = key.as_str();
            for &(ts, n) in &data.totals {
                if n != 0
                    && !visit(&Row {
                        key,
                        ts,
                        dim: "",
                        value: "",
                        n,
                    })
                {
                    return Ok(());
                }
            }
            let mut subs: Vec<_> = data.subtotals.iter().collect();
            subs.sort_by(|a, b| (&a.dim, &a.value).cmp(&(&b.dim, &b.value)));
            for s in subs {
                // A dimension a schema change began counting: its buckets from before then
                // hold only part of what they would, so they are left out.
                let whole = plan
                    .schema
                    .whole_from(plan.resolution, Reads::Dimension(&s.dim))
                    .unwrap_or(i64::MIN);
                for &(ts, n) in s.buckets.iter().filter(|(ts, _)| *ts >= whole) {
                    if n != 0
                        && !visit(&Row {
                            key,
                            ts,
                            dim: &s.dim,
                            value: &s.value,
                            n,
                        })
                    {
                        return Ok(());
                    }
                }
            }
        }
        if page.len() < EXPORT_PAGE_KEYS {
            return Ok(());
        }
    }
}

/// Appends one CSV field as RFC 4180 wants: quoted when it holds a comma, a quote or a line
/// break, quotes doubled. The export's rows (the route's and `tally export`'s files) use it.
pub fn csv_field(out: &mut String, s: &str) {
    if s.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&s.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_only_when_they_must_be() {
        let mut out = String::new();
        for f in ["plain", "a,b", "say \"hi\"", ""] {
            csv_field(&mut out, f);
            out.push('|');
        }
        assert_eq!(out, "plain|\"a,b\"|\"say \"\"hi\"\"\"||");
    }
}

//! Rolling windows: which buckets of which tier a window sums, the `window` query, and the
//! window as it stands after an increment (what `incr?window=` answers).

use super::answer::{WindowAnswer, WindowCount};
use super::exec::{read_one, schema_of, sum};
use super::params::WindowQuery;
use super::{Ctx, QueryError};
use crate::model::{Duration, Key, Namespace, Schema};
use crate::store::{Batch, Deadline, KeyRead, Store, StoreError, Want};
use crate::tier::NoTier;
use crate::time::{Tz, bucket_start};

/// Which buckets a window sums: `[from, to)` of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPlan {
    pub resolution: Duration,
    pub from: i64,
    pub to: i64,
}

impl WindowPlan {
    /// The read of one key's totals over this window.
    pub fn read<'a>(&self, ns: &'a Namespace, key: &'a Key) -> KeyRead<'a> {
        KeyRead {
            ns,
            key,
            resolution: self.resolution,
            from: self.from,
            to: self.to,
            want: Want::Totals,
        }
    }

    /// Whether an event at `ts` counts in this window.
    pub fn covers(&self, ts: i64) -> bool {
        let b = bucket_start(ts, self.resolution.secs_i64());
        self.from <= b && b < self.to
    }
}

/// The window's tier and buckets for a schema at `now`: the `ceil(last / r)` most recent
/// buckets of the finest tier whose retention is at least `last`.
pub fn window_plan(
    ns: &Namespace,
    schema: &Schema,
    last: Duration,
    now: i64,
) -> Result<WindowPlan, QueryError> {
    let Some(tier) = schema.tiers().iter().find(|t| t.retention.at_least(last)) else {
        let longest = schema
            .tiers()
            .iter()
            .map(|t| t.retention.to_string())
            .next_back();
        return Err(NoTier {
            message: format!(
                "namespace {ns} keeps no tier for {last} (the longest retention is {})",
                longest.unwrap_or_default()
            ),
        }
        .into());
    };
    let r = tier.resolution.secs_i64();
    let count = (last.secs_i64() + r - 1) / r;
    let current = bucket_start(now, r);
    Ok(WindowPlan {
        resolution: tier.resolution,
        from: current - (count - 1) * r,
        to: current + r,
    })
}

/// The window's count for a plan: its header and `n`.
fn count(last: Duration, plan: WindowPlan, n: i64) -> WindowCount {
    WindowCount {
        last: last.to_string(),
        resolution: plan.resolution.to_string(),
        from: plan.from,
        from_t: Tz::utc().rfc3339(plan.from),
        n,
    }
}

pub fn window(store: &dyn Store, ctx: Ctx, q: &WindowQuery) -> Result<WindowAnswer, QueryError> {
    let schema = schema_of(store, &q.ns)?;
    let plan = window_plan(&q.ns, &schema, q.last, ctx.now)?;
    let data = read_one(store, plan.read(&q.ns, &q.key), &ctx.deadline)?;
    Ok(WindowAnswer {
        ns: q.ns.to_string(),
        key: q.key.to_string(),
        window: count(q.last, plan, sum(&data.totals)),
    })
}

/// The window over `last` of the key of `batch`'s first increment as it will stand once the
/// batch is applied: what the store holds now plus the batch's increments of that key that
/// fall in the window. Computed before the batch is applied, so that the answer can travel
/// in the batch (an idempotent `incr` logs its answer with its increment). Writes of other
/// requests between this read and the apply are not counted.
pub fn window_after(
    store: &dyn Store,
    now: i64,
    batch: &Batch,
    last: Duration,
) -> Result<WindowCount, QueryError> {
    let Some(first) = batch.increments.first() else {
        return Err(StoreError::internal("window_after of an empty batch").into());
    };
    let (ns, key) = (&first.ns, &first.key);
    let created = batch.create.iter().find(|(n, _)| n == ns).map(|(_, s)| s);
    let plan = match created {
        Some(schema) => window_plan(ns, schema, last, now)?,
        None => window_plan(ns, &schema_of(store, ns)?, last, now)?,
    };
    // A namespace this batch creates holds nothing yet.
    let before = match created {
        Some(_) => 0,
        None => sum(&read_one(store, plan.read(ns, key), &Deadline::none())?.totals),
    };
    let added: i64 = batch
        .increments
        .iter()
        .filter(|i| i.ns == *ns && i.key == *key && plan.covers(i.ts))
        .map(|i| i.n)
        .sum();
    Ok(count(last, plan, before + added))
}

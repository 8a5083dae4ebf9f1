//! Rolling windows: which buckets of which tier a window sums, the `window` query, and the
//! window as it stands after an increment (what `incr?window=` answers).

use super::answer::{WindowAnswer, WindowCount};
use super::exec::{read_one, schema_of, sum, wrapping_sum};
use super::params::WindowQuery;
use super::{Ctx, QueryError};
use crate::model::{Duration, Key, Namespace, Reads, Schema, Tier};
use crate::store::{Batch, Deadline, Decision, KeyRead, Store, StoreError, Want};
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
            sum_subtotals: false,
            keep: None,
        }
    }

    /// Whether an event at `ts` counts in this window.
    pub fn covers(&self, ts: i64) -> bool {
        let b = bucket_start(ts, self.resolution.secs_i64());
        self.from <= b && b < self.to
    }
}

/// The window's tier and buckets for a schema at `now`: the `ceil(last / r)` most recent
/// buckets of the finest tier whose retention is at least `last` — and that has counted
/// every event of those buckets: a tier a schema change added lately is passed over for the
/// next one (see [`crate::model::Coverage`]).
pub fn window_plan(
    ns: &Namespace,
    schema: &Schema,
    last: Duration,
    now: i64,
) -> Result<WindowPlan, QueryError> {
    let plan = |tier: &Tier| {
        let r = tier.resolution.secs_i64();
        let count = (last.secs_i64() + r - 1) / r;
        let current = bucket_start(now, r);
        WindowPlan {
            resolution: tier.resolution,
            from: current - (count - 1) * r,
            to: current + r,
        }
    };
    let long_enough = || schema.tiers().iter().filter(|t| t.retention.at_least(last));
    let whole = |p: &WindowPlan| {
        schema
            .whole_from(p.resolution, Reads::Totals)
            .is_none_or(|s| p.from >= s)
    };
    if let Some(p) = long_enough().map(plan).find(whole) {
        return Ok(p);
    }
    let message = match long_enough().next() {
        Some(t) => format!(
            "namespace {ns} keeps {last} only in tiers a schema change added or lengthened \
             lately: {t} data is whole only from {}",
            schema
                .whole_from(t.resolution, Reads::Totals)
                .and_then(|s| jiff::Timestamp::from_second(s).ok())
                .map_or_else(String::new, |s| s.to_string())
        ),
        None => format!(
            "namespace {ns} keeps no tier for {last} (the longest retention is {})",
            schema
                .tiers()
                .iter()
                .map(|t| t.retention.to_string())
                .next_back()
                .unwrap_or_default()
        ),
    };
    Err(NoTier { message }.into())
}

/// The window's count for a plan: its header and `n`.
/// What `batch` adds to key `key` of `ns` inside the window (counts wrap past 64 bits).
fn added_by(batch: &Batch, ns: &Namespace, key: &Key, plan: &WindowPlan) -> i64 {
    wrapping_sum(
        batch
            .increments
            .iter()
            .filter(|i| i.ns == *ns && i.key == *key && plan.covers(i.ts))
            .map(|i| i.n),
    )
}

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
    let mut window = count(q.last, plan, sum(&data.totals));
    window.last.clone_from(&q.spelled);
    Ok(WindowAnswer {
        ns: q.ns.to_string(),
        key: q.key.to_string(),
        window,
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
    let added = added_by(batch, ns, key, &plan);
    Ok(count(last, plan, before.wrapping_add(added)))
}

/// The outcome of an increment limited to `max` over a rolling window (SPEC §3
/// `incr?window=…&max=…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limited {
    /// Applied; the window as it stands with the increment.
    Accepted(WindowCount),
    /// Refused, nothing counted: the window as it stands (`n` without the increment), the
    /// limit, and the seconds until enough of the window has aged out for the increment to
    /// fit — `None` when it never can (the increment alone is over `max`).
    Refused {
        window: WindowCount,
        max: i64,
        retry_after: Option<i64>,
    },
}

/// Seconds from `now` until the window's count, with `added` on top, is at most `max`, as
/// its oldest buckets age out: bucket `b` leaves a window of `k` buckets of `r` seconds
/// when the current bucket starts at `b + k·r`. `None` when it never is: once every bucket
/// now in the window has left, `added` alone is over `max` (with negative counts in the
/// window it may still fit for a while before that, and the answer says when).
/// `buckets` are the window's, in any order.
pub fn retry_after(
    plan: &WindowPlan,
    buckets: &[(i64, i64)],
    now: i64,
    added: i64,
    max: i64,
) -> Option<i64> {
    let span = plan.to - plan.from;
    let mut sorted: Vec<(i64, i64)> = buckets.to_vec();
    sorted.sort_unstable();
    // The count as a window query answers it (wrapping, as every sum), and the rule
    // `incr_limited` decides by: so a refusal never says "retry now".
    let mut left: i64 = sum(&sorted);
    if fits(left, added, max) {
        return Some(0);
    }
    for (b, n) in sorted {
        left = left.wrapping_sub(n);
        if fits(left, added, max) {
            // The bucket starting at `b` is out once the window starts after it.
            return Some((b + span - now).max(1));
        }
    }
    // Every bucket gone and it still does not fit: the increment alone is over `max`.
    None
}

/// Whether `added` on top of a window counting `count` stays at most `max` (a sum past 64
/// bits does not).
fn fits(count: i64, added: i64, max: i64) -> bool {
    count.checked_add(added).is_some_and(|after| after <= max)
}

/// How far past the window's end, as planned before waiting for the key's lock, the read
/// of a limited increment reaches: the window is planned again once the lock is held, and
/// by then it may have moved on by as long as the wait (seconds at most).
const LOCK_WAIT_MARGIN: i64 = 300;

/// Applies `batch` (one key's increment, prepared at `prepared_at`) only if the key's count
/// over `last`, with the batch's increments, stays at most `max` — atomically with every
/// other limited increment of the key ([`Store::apply_if`]). The window is planned from
/// `now()` read once the key's lock is held (a request that waited for the lock must count
/// what the others wrote meanwhile). `record` builds the answer to remember under the
/// request's idempotency key from the outcome, inside that atomic step, so a retry replays
/// an acceptance or a refusal alike.
///
/// `None`: the window moved past one of the increments while the request waited for the
/// key's lock (a bucket edge passed meanwhile), so counted now it would land outside the
/// window it is checked against, unchecked. Nothing was applied or remembered: the caller
/// prepares the increment again at a fresh `now` and tries again (an increment given an
/// explicit `ts` that has left the window is then refused). So too when the increments were
/// `stamped` at `prepared_at` (no `ts` given) and a bucket edge passed before the decision:
/// counted in its old bucket, an increment would add to windows that ended before the one
/// checked (the window of its own moment was full, the one of the decision's not yet), and
/// a history read back would show more than `max` in a window (found by a review: 18 in
/// two seconds for a limit of 10). Stamped again, it lands in the bucket the check ends at.
pub fn incr_limited(
    store: &dyn Store,
    (prepared_at, stamped): (i64, bool),
    now: &dyn Fn() -> i64,
    batch: &Batch,
    last: Duration,
    max: i64,
    record: &mut dyn FnMut(&Limited) -> Result<Option<crate::store::IdemRecord>, StoreError>,
) -> Result<Option<Limited>, QueryError> {
    let Some(first) = batch.increments.first() else {
        return Err(StoreError::internal("incr_limited of an empty batch").into());
    };
    let (ns, key) = (&first.ns, &first.key);
    let schema = match batch.create.iter().find(|(n, _)| n == ns) {
        Some((_, schema)) => schema.clone(),
        None => schema_of(store, ns)?,
    };
    // Planned at the moment the increment was stamped: one given no `ts` is always inside.
    let planned = window_plan(ns, &schema, last, prepared_at)?;
    // The limit is on the window: an increment outside it would be counted unchecked (and
    // a future one would overfill its window when that comes).
    if let Some(i) = batch.increments.iter().find(|i| !planned.covers(i.ts)) {
        return Err(QueryError::InvalidParameter {
            field: "ts",
            why: format!(
                "ts {} is outside the window the limit checks (the last {last}): a limited \
                 increment counts now, give no ts or one inside the window",
                i.ts
            ),
        });
    }
    let mut read = planned.read(ns, key);
    read.to = planned.to.saturating_add(LOCK_WAIT_MARGIN);
    let mut outcome = None;
    store.apply_if(batch, &read, &mut |buckets| {
        let at = now();
        let plan = window_plan(ns, &schema, last, at)
            .map_err(|e| StoreError::internal(format!("the window's tier went away: {e}")))?;
        let res = plan.resolution.secs_i64();
        let moved = |ts: i64| ts.div_euclid(res) != at.div_euclid(res);
        if plan.resolution != planned.resolution
            || batch.increments.iter().any(|i| !plan.covers(i.ts))
            || (stamped && batch.increments.iter().any(|i| moved(i.ts)))
        {
            // Undecided (see above): nothing applied, nothing remembered. So too when the
            // window moved to another tier while we waited (a tier a schema change added
            // became whole): the buckets read are the planned tier's.
            return Ok(Decision {
                apply: false,
                idempotency: None,
            });
        }
        let inside: Vec<(i64, i64)> = buckets
            .iter()
            .copied()
            .filter(|&(b, _)| plan.from <= b && b < plan.to)
            .collect();
        let added = added_by(batch, ns, key, &plan);
        let before = sum(&inside);
        let decided = match before.checked_add(added) {
            Some(after) if fits(before, added, max) => Limited::Accepted(count(last, plan, after)),
            _ => Limited::Refused {
                window: count(last, plan, before),
                max,
                retry_after: retry_after(&plan, &inside, at, added, max),
            },
        };
        let idempotency = record(&decided)?;
        let apply = matches!(decided, Limited::Accepted(_));
        outcome = Some(decided);
        Ok(Decision { apply, idempotency })
    })?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(r: u64, last: u64, now: i64) -> WindowPlan {
        let schema = Schema::from_doc(&crate::model::SchemaDoc {
            tiers: vec![format!("{r}s:30d")],
            breakdown_tiers: None,
            dimensions: None,
        })
        .unwrap();
        let ns = Namespace::new("a").unwrap();
        window_plan(&ns, &schema, Duration::from_secs(last).unwrap(), now).unwrap()
    }

    /// A request that waited for the key's lock decides on the window as it is once it holds
    /// the lock: what others wrote while it waited, in seconds after it planned, counts.
    #[test]
    fn the_window_is_planned_again_once_the_lock_is_held() {
        use std::sync::Arc;

        use crate::ingest::{Defaults, Limits, prepare};
        use crate::model::RawEvent;
        use crate::reference::MemStore;
        use crate::store::ManualClock;

        let t = 1_795_176_000;
        let clock = Arc::new(ManualClock::new(t + 2));
        let store = MemStore::new(clock.clone());
        let ns = Namespace::new("api").unwrap();
        store
            .put_schema(
                &ns,
                &Schema::from_doc(&crate::model::SchemaDoc {
                    tiers: vec!["1s:2h".into()],
                    breakdown_tiers: None,
                    dimensions: None,
                })
                .unwrap(),
            )
            .unwrap();
        let event = |ts: i64| RawEvent {
            ns: "api".into(),
            key: "k".into(),
            ts: Some(ts),
            n: Some(1),
            dims: Vec::new(),
        };
        let apply = |ts: i64| {
            let b = prepare(
                &store,
                &[event(ts)],
                t + 2,
                &Limits::default(),
                &Defaults::default(),
            );
            store.apply(&b.unwrap()).unwrap();
        };
        // Planned at t; while it waited, two increments landed at t + 1 (the limit is 2).
        apply(t + 1);
        apply(t + 1);
        let batch = prepare(
            &store,
            &[event(t)],
            t,
            &Limits::default(),
            &Defaults::default(),
        )
        .unwrap();
        let last = Duration::from_secs(60).unwrap();
        let outcome = incr_limited(&store, (t, false), &|| t + 2, &batch, last, 2, &mut |_| {
            Ok(None)
        })
        .unwrap();
        assert!(
            matches!(&outcome, Some(Limited::Refused { window, .. }) if window.n == 2),
            "{outcome:?}"
        );
    }

    /// Found by review: a tier a schema change added becomes whole while a limited increment
    /// waits for the key's lock, so the window moves to it; the buckets read are the old
    /// tier's, and held to the new tier's range they summed to nothing — the limit let it
    /// through. Now it comes back undecided, and prepared again it is refused.
    #[test]
    fn a_window_that_moves_to_another_tier_while_waiting_is_decided_again() {
        use std::sync::Arc;

        use crate::ingest::{Defaults, Limits, prepare};
        use crate::model::RawEvent;
        use crate::reference::MemStore;
        use crate::store::ManualClock;

        let h = 1_795_176_000;
        let clock = Arc::new(ManualClock::new(h));
        let store = MemStore::new(clock.clone()).with_max_future_secs(0);
        let ns = Namespace::new("api").unwrap();
        let schema = |tiers: &[&str]| {
            Schema::from_doc(&crate::model::SchemaDoc {
                tiers: tiers.iter().map(|t| t.to_string()).collect(),
                breakdown_tiers: None,
                dimensions: None,
            })
            .unwrap()
        };
        store.put_schema(&ns, &schema(&["1h:forever"])).unwrap();
        clock.set(h + 600);
        store
            .put_schema(&ns, &schema(&["1m:2h", "1h:forever"]))
            .unwrap();
        let raw = |ts: Option<i64>| RawEvent {
            ns: "api".into(),
            key: "k".into(),
            ts,
            n: Some(1),
            dims: Vec::new(),
        };
        let at = |when: i64, ts: Option<i64>| {
            prepare(
                &store,
                &[raw(ts)],
                when,
                &Limits::default(),
                &Defaults::default(),
            )
            .unwrap()
        };
        clock.set(h + 1000);
        for _ in 0..5 {
            store.apply(&at(h + 1000, Some(h + 1000))).unwrap();
        }
        // Planned at h + 4199 on the hourly tier (the minute tier is whole from h + 601, and
        // an hour's window of minutes starts at h + 600); decided at h + 4200, on minutes.
        let last = Duration::from_secs(3600).unwrap();
        clock.set(h + 4200);
        let o = incr_limited(
            &store,
            (h + 4199, true),
            &|| h + 4200,
            &at(h + 4199, None),
            last,
            5,
            &mut |_| Ok(None),
        )
        .unwrap();
        assert!(o.is_none(), "undecided: {o:?}");
        let o = incr_limited(
            &store,
            (h + 4200, true),
            &|| h + 4200,
            &at(h + 4200, None),
            last,
            5,
            &mut |_| Ok(None),
        )
        .unwrap();
        assert!(
            matches!(&o, Some(Limited::Refused { window, .. }) if window.n == 5),
            "{o:?}"
        );
    }

    /// A reference store at `t` whose namespace `api` keeps a `1s:2h` tier.
    fn seconds_store(
        t: i64,
    ) -> (
        std::sync::Arc<crate::store::ManualClock>,
        crate::reference::MemStore,
    ) {
        let clock = std::sync::Arc::new(crate::store::ManualClock::new(t));
        let store = crate::reference::MemStore::new(clock.clone());
        let schema = Schema::from_doc(&crate::model::SchemaDoc {
            tiers: vec!["1s:2h".into()],
            breakdown_tiers: None,
            dimensions: None,
        })
        .unwrap();
        store
            .put_schema(&Namespace::new("api").unwrap(), &schema)
            .unwrap();
        (clock, store)
    }

    /// One increment of 1 to `api`/`k`, with `ts` (none: stamped at `when`), prepared at
    /// `when`.
    fn one_at(store: &dyn Store, when: i64, ts: Option<i64>) -> Batch {
        let raw = crate::model::RawEvent {
            ns: "api".into(),
            key: "k".into(),
            ts,
            n: Some(1),
            dims: Vec::new(),
        };
        crate::ingest::prepare(
            store,
            &[raw],
            when,
            &crate::ingest::Limits::default(),
            &crate::ingest::Defaults::default(),
        )
        .unwrap()
    }

    /// The sum of `api`/`k`'s seconds in `[from, to)`.
    fn seconds_sum(store: &dyn Store, from: i64, to: i64) -> i64 {
        let (ns, k) = (
            Namespace::new("api").unwrap(),
            crate::model::Key::new("k").unwrap(),
        );
        let read = crate::store::KeyRead {
            ns: &ns,
            key: &k,
            resolution: Duration::from_secs(1).unwrap(),
            from,
            to,
            want: crate::store::Want::Totals,
            sum_subtotals: false,
            keep: None,
        };
        store.read(&[read]).unwrap()[0]
            .totals
            .iter()
            .map(|(_, n)| n)
            .sum()
    }

    /// Found by an independent review: requests stamped in second t (no `ts` given) that got
    /// the key's lock once the clock reached t + 1 saw an empty window and were all written
    /// into second t, uncounted: 8 in one second for a limit of 3 per second. Now they come
    /// back undecided, changing nothing, and prepared again at t + 1 they fill that second
    /// to the limit and no further.
    #[test]
    fn an_increment_whose_bucket_left_the_window_while_it_waited_is_not_counted_unchecked() {
        let t = 1_795_176_000;
        let (clock, store) = seconds_store(t);
        let (last, max) = (Duration::from_secs(1).unwrap(), 3);
        let at = |when: i64| one_at(&store, when, None);
        for _ in 0..3 {
            let o = incr_limited(&store, (t, true), &|| t, &at(t), last, max, &mut |_| {
                Ok(None)
            });
            assert!(matches!(o, Ok(Some(Limited::Accepted(_)))), "{o:?}");
        }
        // Five more stamped in second t take the lock at t + 1.
        clock.set(t + 1);
        let mut remembered = 0;
        for _ in 0..5 {
            let o = incr_limited(&store, (t, true), &|| t + 1, &at(t), last, max, &mut |_| {
                remembered += 1;
                Ok(None)
            });
            assert!(matches!(o, Ok(None)), "{o:?}");
        }
        assert_eq!(remembered, 0, "an undecided increment is not remembered");
        // One given an explicit ts of second t, tried again at t + 1, is refused: counted
        // now it would escape the window.
        let b = one_at(&store, t + 1, Some(t));
        let o = incr_limited(
            &store,
            (t + 1, false),
            &|| t + 1,
            &b,
            last,
            max,
            &mut |_| Ok(None),
        );
        assert!(
            matches!(o, Err(QueryError::InvalidParameter { field: "ts", .. })),
            "{o:?}"
        );
        // Prepared again at t + 1: three fit.
        let outcomes: Vec<_> = (0..5)
            .map(|_| {
                incr_limited(
                    &store,
                    (t + 1, true),
                    &|| t + 1,
                    &at(t + 1),
                    last,
                    max,
                    &mut |_| Ok(None),
                )
            })
            .map(|o| matches!(o, Ok(Some(Limited::Accepted(_)))))
            .collect();
        assert_eq!(outcomes, [true, true, true, false, false]);
        assert_eq!(
            (
                seconds_sum(&store, t, t + 1),
                seconds_sum(&store, t + 1, t + 2)
            ),
            (3, 3)
        );
    }

    /// Found by a review: a request stamped in second t + 1 (no `ts`), while second t held
    /// the limit, that got the key's lock in second t + 2 was checked against seconds t + 1
    /// and t + 2 — room — and counted in second t + 1: seconds t and t + 1 then held 11 for
    /// a limit of 10 in 2 s. Now it comes back undecided, and stamped again it lands in
    /// second t + 2, so every 2 seconds hold at most 10.
    #[test]
    fn a_stamped_increment_decided_after_a_bucket_edge_is_stamped_again() {
        let t = 1_795_176_000;
        let (clock, store) = seconds_store(t);
        let (last, max) = (Duration::from_secs(2).unwrap(), 10);
        let limited = |stamped: i64, decided: i64| {
            incr_limited(
                &store,
                (stamped, true),
                &|| decided,
                &one_at(&store, stamped, None),
                last,
                max,
                &mut |_| Ok(None),
            )
            .unwrap()
        };
        for _ in 0..10 {
            assert!(matches!(limited(t, t), Some(Limited::Accepted(_))));
        }
        clock.set(t + 2);
        assert!(limited(t + 1, t + 2).is_none(), "undecided");
        assert!(matches!(limited(t + 2, t + 2), Some(Limited::Accepted(_))));
        assert_eq!(
            (
                seconds_sum(&store, t, t + 2),
                seconds_sum(&store, t + 1, t + 3)
            ),
            (10, 1)
        );
    }

    #[test]
    fn retry_after_counts_the_seconds_until_the_oldest_buckets_age_out() {
        // 1s tier, last 10 s at now = 1000: buckets 991..=1000.
        let p = plan(1, 10, 1000);
        assert_eq!((p.from, p.to), (991, 1001));
        let full = [(991, 3), (995, 4), (1000, 3)];
        // 10 of max 10: +1 fits once the 3 at 991 leave (when the window starts at 992).
        assert_eq!(retry_after(&p, &full, 1000, 1, 10), Some(1));
        // +4 needs the 995 bucket gone as well: the window starts at 996 at t = 1005.
        assert_eq!(retry_after(&p, &full, 1000, 4, 10), Some(5));
        assert_eq!(retry_after(&p, &full, 1000, 11, 10), None);
        assert_eq!(retry_after(&p, &full, 1000, 0, 10), Some(0));

        // 1m tier, last 1h at 12:30:20: 60 minute buckets, 11:31 .. 12:30.
        let now = 1_795_176_000 + 30 * 60 + 20;
        let p = plan(60, 3600, now);
        let b = |m: i64| 1_795_176_000 - 3600 + m * 60;
        let buckets = [(b(31), 50), (b(59), 40), (b(90), 10)];
        // 100 of max 100: +1 fits when 11:31 leaves, at 12:31:00 — 40 s from now.
        assert_eq!(retry_after(&p, &buckets, now, 1, 100), Some(40));
        // +51 needs 11:59 gone too: at 12:59:00.
        assert_eq!(retry_after(&p, &buckets, now, 51, 100), Some(40 + 28 * 60));

        // 1h tier, last 24 h at 00:00:01: the oldest hour leaves in 3599 s.
        let now = 1_795_132_801;
        let p = plan(3600, 86_400, now);
        let oldest = now - 1 - 23 * 3600;
        assert_eq!(p.from, oldest);
        assert_eq!(
            retry_after(&p, &[(oldest, 5), (now - 1, 5)], now, 1, 10),
            Some(3599)
        );

        // Negative counts: +3 then −3 in the window; +3 of max 2 does not fit now, fits
        // once the +3 leaves (the −3 still in), and would not once both have left — the
        // answer is the first moment, not "never".
        let p = plan(1, 10, 1000);
        let mixed = [(997, 3), (999, -3)];
        assert_eq!(retry_after(&p, &mixed, 1000, 3, 2), Some(7));
        // Alone over the limit with nothing negative to help: never.
        assert_eq!(retry_after(&p, &[(997, 3)], 1000, 3, 2), None);
        assert_eq!(retry_after(&p, &[], 1000, 3, 2), None);
        // A window whose sum wraps to i64::MAX does not fit +1 now (the decision overflows),
        // so the answer is not "now" but when the bucket that wrapped it leaves.
        assert_eq!(
            retry_after(&p, &[(997, i64::MIN), (998, -1)], 1000, 1, 10),
            Some(7)
        );
        assert!(!fits(sum(&vec![(997, i64::MIN), (998, -1)]), 1, 10));
        // A sum past 64 bits never fits (as `incr_limited` decides).
        assert_eq!(
            retry_after(&p, &[(997, i64::MAX)], 1000, i64::MAX, i64::MAX),
            Some(7)
        );
    }
}

//! Reads: one key's buckets (the few windows its range touches, in one `MULTI`/`EXEC` to its
//! slot, so totals and subtotals agree), key listing by lex range, and scans for `top`
//! (`COUNTS` script calls over groups of keys, a page of keys at a time, all in flight).
//!
//! Retention is applied here, by the store's clock, exactly as `MemStore` applies it: a range
//! starts at the first bucket its tier still keeps. Redis' own expiries only collect what
//! is already hidden.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use redis::Value;
use tally_core::model::{Duration, Key, Namespace};
use tally_core::store::{KeyData, KeyList, KeyRead, Scan, StoreError, SubtotalBuckets, Want};

use crate::layout::{self, Stored, WINDOW_BUCKETS};
use crate::{RedisStore, scripts};

/// Keys per page of a scan (the deadline is checked between pages), and per prune step.
const PAGE: usize = 1000;

/// Series per `COUNTS` call in a scan on one server, at most: many enough that a page of
/// keys is ten calls, not a thousand.
const GROUP: usize = 100;

/// Hash reads (`HGET`s, or fields of `HGETALL`s) one `COUNTS` call may make, about: a call
/// holds Redis for a short while, however long the range.
const GROUP_WORK: usize = 12_000;

/// Series per `COUNTS` call: `GROUP`, fewer when each series costs many reads (a value's
/// `HGET` per bucket over a long fine range), one in a cluster (each series in its own slot).
fn group_size(cluster: bool, windows: &[(i64, i64, i64)], by_value: bool) -> usize {
    if cluster {
        return 1;
    }
    let per_series: usize = if by_value {
        windows
            .iter()
            .map(|&(_, lo, hi)| usize::try_from(hi - lo + 1).unwrap_or(0))
            .sum()
    } else {
        windows.len() * WINDOW_BUCKETS as usize
    };
    (GROUP_WORK / per_series.max(1)).clamp(1, GROUP)
}

/// The windows a range touches at one resolution: `(window start, first offset, last offset)`.
fn windows(from: i64, to: i64, res: i64) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    if from >= to {
        return out;
    }
    let last = (to - 1).div_euclid(res) * res;
    let mut w = layout::window_of(from, res);
    while w <= last {
        let lo = layout::offset_of(from.max(w), w, res);
        let hi = layout::offset_of(last.min(w + res * (WINDOW_BUCKETS - 1)), w, res);
        out.push((w, lo, hi));
        w += res * WINDOW_BUCKETS;
    }
    out
}

/// The part of a read that a tier still shows: its generations and kept range.
struct Plan {
    tag: String,
    res: i64,
    gen_: u64,
    sgen: Option<u64>,
    windows: Vec<(i64, i64, i64)>,
}

fn plan_for(
    st: &Stored,
    ns: &Namespace,
    key: &str,
    resolution: Duration,
    from: i64,
    to: i64,
    now: i64,
) -> Option<Plan> {
    let tier = st.tier(resolution)?;
    let gen_ = st.generation(resolution)?;
    let res = resolution.secs_i64();
    let from = layout::first_kept(from, tier, now);
    let windows = windows(from, to, res);
    if windows.is_empty() {
        return None;
    }
    Some(Plan {
        tag: layout::series_tag(ns, key),
        res,
        gen_,
        sgen: st.breakdown_generation(resolution),
        windows,
    })
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// An `HGETALL` reply as pairs (RESP2 arrays or RESP3 maps).
fn pairs(v: &Value) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    match v {
        Value::Array(items) => {
            for kv in items.chunks(2) {
                if let [k, v] = kv
                    && let (Some(k), Some(v)) = (text(k), int(v))
                {
                    out.push((k, v));
                }
            }
        }
        Value::Map(items) => {
            for (k, v) in items {
                if let (Some(k), Some(v)) = (text(k), int(v)) {
                    out.push((k, v));
                }
            }
        }
        _ => {}
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// What one key's read asks Redis, in order, and how to put the answers together.
enum Part {
    Totals {
        window: i64,
    },
    Dim {
        dim: String,
        window: i64,
    },
    Value {
        dim: String,
        value: String,
        window: i64,
        lo: i64,
    },
    Dims,
}

impl RedisStore {
    pub(crate) async fn read_async(
        &self,
        reads: &[KeyRead<'_>],
    ) -> Result<Vec<KeyData>, StoreError> {
        let now = self.now();
        let mut nss: Vec<&Namespace> = reads.iter().map(|r| r.ns).collect();
        nss.sort();
        nss.dedup();
        let schemas = self.load_schemas(&nss).await?;
        let futures = reads.iter().map(|r| {
            let plan = schemas
                .get(r.ns)
                .and_then(|st| plan_for(st, r.ns, r.key.as_str(), r.resolution, r.from, r.to, now));
            async move {
                match plan {
                    None => Ok(KeyData::default()),
                    Some(p) => self.read_one(&p, r.want).await,
                }
            }
        });
        join_all(futures).await.into_iter().collect()
    }

    async fn read_one(&self, p: &Plan, want: Want<'_>) -> Result<KeyData, StoreError> {
        // Every dimension: which ones exist is read first, then again inside the
        // transaction; if a write added one in between, read again.
        let mut dims: Vec<String> = Vec::new();
        if matches!(want, Want::All) && p.sgen.is_some() {
            dims = self.dims(&p.tag).await?;
        }
        for _ in 0..8 {
            let mut pipe = redis::pipe();
            pipe.atomic();
            let mut parts = Vec::new();
            for &(w, _, _) in &p.windows {
                pipe.cmd("HGETALL")
                    .arg(layout::totals_key(&p.tag, p.gen_, p.res, w));
                parts.push(Part::Totals { window: w });
            }
            if let Some(sgen) = p.sgen {
                let wanted: Vec<&str> = match want {
                    Want::Totals => Vec::new(),
                    Want::Value { dim, .. } | Want::Dim { dim } => vec![dim],
                    Want::All => dims.iter().map(String::as_str).collect(),
                };
                if matches!(want, Want::All) {
                    pipe.cmd("SMEMBERS").arg(layout::dims_key(&p.tag));
                    parts.push(Part::Dims);
                }
                for dim in wanted {
                    for &(w, lo, hi) in &p.windows {
                        let name = layout::subtotals_key(&p.tag, sgen, p.res, w, dim);
                        match want {
                            Want::Value { value, .. } => {
                                let fields: Vec<String> = (lo..=hi)
                                    .map(|o| layout::subtotal_field(o, value))
                                    .collect();
                                pipe.cmd("HMGET").arg(name).arg(fields);
                                parts.push(Part::Value {
                                    dim: dim.to_owned(),
                                    value: value.to_owned(),
                                    window: w,
                                    lo,
                                });
                            }
                            _ => {
                                pipe.cmd("HGETALL").arg(name);
                                parts.push(Part::Dim {
                                    dim: dim.to_owned(),
                                    window: w,
                                });
                            }
                        }
                    }
                }
            }
            let replies: Vec<Value> = self
                .retry(|mut c| {
                    let pipe = &pipe;
                    async move { pipe.query_async(&mut c).await }
                })
                .await?;
            if replies.len() != parts.len() {
                return Err(StoreError::internal(format!(
                    "{}: {} replies to a read of {} commands",
                    self.label,
                    replies.len(),
                    parts.len()
                )));
            }
            let mut data = Collect::new(p);
            let mut seen_dims = None;
            for (part, reply) in parts.iter().zip(&replies) {
                match part {
                    Part::Dims => {
                        let mut d = strings(reply);
                        d.sort();
                        seen_dims = Some(d);
                    }
                    part => data.add(part, reply),
                }
            }
            if let Some(seen) = seen_dims
                && seen != dims
            {
                dims = seen;
                continue;
            }
            return Ok(data.finish());
        }
        Err(StoreError::unavailable(format!(
            "{}: the dimensions of series {} kept changing while it was read; try again",
            self.label, p.tag
        )))
    }

    async fn dims(&self, tag: &str) -> Result<Vec<String>, StoreError> {
        let name = layout::dims_key(tag);
        let mut dims: Vec<String> = self
            .retry(|mut c| {
                let name = &name;
                async move { redis::cmd("SMEMBERS").arg(name).query_async(&mut c).await }
            })
            .await?;
        dims.sort();
        Ok(dims)
    }

    /// Drops keys whose every bucket has expired from a namespace's index.
    async fn prune(&self, ns: &Namespace) -> Result<(), StoreError> {
        let (lex, exp) = (layout::keys_key(ns), layout::expiry_key(ns));
        let now = self.now();
        for _ in 0..1000 {
            let removed: i64 = self
                .retry(|mut c| {
                    let (lex, exp) = (&lex, &exp);
                    async move {
                        scripts::PRUNE
                            .key(lex)
                            .key(exp)
                            .arg(now)
                            .arg(PAGE)
                            .invoke_async(&mut c)
                            .await
                    }
                })
                .await?;
            if removed < PAGE as i64 {
                break;
            }
        }
        Ok(())
    }

    /// Keys of a namespace's index in byte order, from `min` (a `ZRANGEBYLEX` bound).
    async fn key_page(
        &self,
        ns: &Namespace,
        min: &[u8],
        max: &[u8],
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let lex = layout::keys_key(ns);
        self.retry(|mut c| {
            let lex = &lex;
            async move {
                redis::cmd("ZRANGEBYLEX")
                    .arg(lex)
                    .arg(min)
                    .arg(max)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .query_async(&mut c)
                    .await
            }
        })
        .await
    }

    pub(crate) async fn keys_async(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        if list.limit == 0 {
            return Ok(Vec::new());
        }
        self.prune(list.ns).await?;
        let prefix = list.prefix.as_bytes();
        // From the prefix (inclusive) or just after `after`, whichever is later.
        let min = match list.after {
            Some(a) if a.as_bytes() >= prefix => [b"(", a.as_bytes()].concat(),
            _ if prefix.is_empty() => b"-".to_vec(),
            _ => [b"[", prefix].concat(),
        };
        // UTF-8 never holds 0xff, so `prefix ff` is past every key that starts with it.
        let max = if prefix.is_empty() {
            b"+".to_vec()
        } else {
            [b"(", prefix, b"\xff"].concat()
        };
        let page = self.key_page(list.ns, &min, &max, list.limit).await?;
        page.into_iter()
            .map(|k| self.key_of(list.ns, k))
            .filter(|k| {
                k.as_ref()
                    .map_or(true, |k| k.as_str().starts_with(list.prefix))
            })
            .collect()
    }

    fn key_of(&self, ns: &Namespace, bytes: Vec<u8>) -> Result<Key, StoreError> {
        let s = String::from_utf8(bytes).map_err(|e| {
            StoreError::corrupt(format!(
                "{}: the key index of {ns} holds a non-UTF-8 key",
                self.label
            ))
            .because(e)
        })?;
        Key::new(&s).map_err(|e| {
            StoreError::corrupt(format!(
                "{}: the key index of {ns} holds an invalid key",
                self.label
            ))
            .because(e)
        })
    }

    pub(crate) async fn scan_async(
        &self,
        scan: &Scan<'_>,
        visit: &mut dyn FnMut(&Key, i64),
    ) -> Result<(), StoreError> {
        let now = self.now();
        let schemas = self.load_schemas(&[scan.ns]).await?;
        let Some(st) = schemas.get(scan.ns) else {
            return Ok(());
        };
        let Some(tier) = st.tier(scan.resolution) else {
            return Ok(());
        };
        let res = scan.resolution.secs_i64();
        let windows = windows(layout::first_kept(scan.from, tier, now), scan.to, res);
        if windows.is_empty() {
            return Ok(());
        }
        let (generation, dim, value) = match scan.value {
            None => (st.generation(scan.resolution), None, ""),
            Some((d, v)) => (st.breakdown_generation(scan.resolution), Some(d), v),
        };
        let Some(generation) = generation else {
            return Ok(());
        };
        self.prune(scan.ns).await?;
        let mut min = b"-".to_vec();
        loop {
            scan.deadline.check()?;
            let page = self.key_page(scan.ns, &min, b"+", PAGE).await?;
            let Some(last) = page.last() else { break };
            min = [b"(", last.as_slice()].concat();
            let group = group_size(self.is_cluster(), &windows, dim.is_some());
            let sums = join_all(page.chunks(group).map(|keys| {
                let names: Vec<String> = keys
                    .iter()
                    .flat_map(|k| {
                        let tag = layout::series_tag(scan.ns, &String::from_utf8_lossy(k));
                        windows
                            .iter()
                            .map(|&(w, _, _)| match dim {
                                None => layout::totals_key(&tag, generation, res, w),
                                Some(d) => layout::subtotals_key(&tag, generation, res, w, d),
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                let windows = &windows;
                async move {
                    let counts: Vec<Vec<i64>> = self
                        .retry(|mut c| {
                            let names = &names;
                            async move {
                                let mut inv = scripts::COUNTS.prepare_invoke();
                                for n in names {
                                    inv.key(n);
                                }
                                inv.arg(value).arg(windows.len());
                                for &(_, lo, hi) in windows {
                                    inv.arg(lo).arg(hi);
                                }
                                inv.invoke_async(&mut c).await
                            }
                        })
                        .await?;
                    if counts.len() != keys.len() {
                        return Err(StoreError::internal(format!(
                            "COUNTS answered {} series for {}",
                            counts.len(),
                            keys.len()
                        )));
                    }
                    Ok::<Vec<i64>, StoreError>(
                        counts
                            .iter()
                            .map(|c| c.iter().fold(0i64, |a, n| a.wrapping_add(*n)))
                            .collect(),
                    )
                }
            }))
            .await;
            let mut all = Vec::with_capacity(page.len());
            for sums in sums {
                all.extend(sums?);
            }
            let full = page.len() == PAGE;
            for (k, sum) in page.into_iter().zip(all) {
                if sum != 0 {
                    visit(&self.key_of(scan.ns, k)?, sum);
                }
            }
            if !full {
                break;
            }
        }
        Ok(())
    }
}

/// Buckets gathered from replies, kept sorted.
struct Collect {
    res: i64,
    totals: BTreeMap<i64, i64>,
    subtotals: BTreeMap<(String, String), BTreeMap<i64, i64>>,
    /// The window ranges: a bucket outside them is not part of the read.
    windows: Vec<(i64, i64, i64)>,
}

impl Collect {
    fn new(p: &Plan) -> Collect {
        Collect {
            res: p.res,
            totals: BTreeMap::new(),
            subtotals: BTreeMap::new(),
            windows: p.windows.clone(),
        }
    }

    fn in_range(&self, window: i64, offset: i64) -> bool {
        self.windows
            .iter()
            .any(|&(w, lo, hi)| w == window && (lo..=hi).contains(&offset))
    }

    fn add(&mut self, part: &Part, reply: &Value) {
        match part {
            Part::Totals { window } => {
                for (f, n) in pairs(reply) {
                    if let Ok(o) = f.parse::<i64>()
                        && self.in_range(*window, o)
                    {
                        *self.totals.entry(window + o * self.res).or_default() += n;
                    }
                }
            }
            Part::Dim { dim, window } => {
                for (f, n) in pairs(reply) {
                    let Some((o, value)) = f.split_once(':') else {
                        continue;
                    };
                    if let Ok(o) = o.parse::<i64>()
                        && self.in_range(*window, o)
                    {
                        *self
                            .subtotals
                            .entry((dim.clone(), value.to_owned()))
                            .or_default()
                            .entry(window + o * self.res)
                            .or_default() += n;
                    }
                }
            }
            Part::Value {
                dim,
                value,
                window,
                lo,
            } => {
                if let Value::Array(items) = reply {
                    for (i, v) in items.iter().enumerate() {
                        if let Some(n) = int(v) {
                            let o = lo + i as i64;
                            *self
                                .subtotals
                                .entry((dim.clone(), value.clone()))
                                .or_default()
                                .entry(window + o * self.res)
                                .or_default() += n;
                        }
                    }
                }
            }
            Part::Dims => {}
        }
    }

    fn finish(self) -> KeyData {
        let nonzero = |m: BTreeMap<i64, i64>| -> Vec<(i64, i64)> {
            m.into_iter().filter(|&(_, n)| n != 0).collect()
        };
        KeyData {
            totals: nonzero(self.totals),
            subtotals: self
                .subtotals
                .into_iter()
                .map(|((dim, value), b)| SubtotalBuckets {
                    dim,
                    value,
                    buckets: nonzero(b),
                })
                .filter(|s| !s.buckets.is_empty())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counts_call_is_bounded_by_the_reads_it_makes() {
        let hour = windows(0, 3600, 3600);
        assert_eq!(group_size(false, &hour, false), GROUP_WORK / 120);
        assert_eq!(group_size(false, &windows(0, 3600, 60), true), GROUP);
        // A value over a week of minutes: an HGET per bucket, one series per call.
        assert_eq!(group_size(false, &windows(0, 7 * 86_400, 60), true), 1);
        assert_eq!(group_size(true, &hour, false), 1);
    }

    #[test]
    fn windows_cover_the_range_exactly() {
        // 1m buckets, 2h windows.
        assert_eq!(windows(0, 60, 60), vec![(0, 0, 0)]);
        assert_eq!(windows(60, 7260, 60), vec![(0, 1, 119), (7200, 0, 0)]);
        assert_eq!(windows(7200, 7200, 60), vec![]);
        let total: i64 = windows(-7200, 86_400, 60)
            .iter()
            .map(|(_, lo, hi)| hi - lo + 1)
            .sum();
        assert_eq!(total, (86_400 + 7200) / 60);
    }
}

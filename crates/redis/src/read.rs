//! Reads: one key's buckets (the few windows its range touches, in one `READ` script call to
//! its slot, so totals and subtotals agree), key listing by lex range, and scans for `top`
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

use crate::layout::{self, Field, Stored, WINDOW_BUCKETS};
use crate::{RedisStore, scripts};

/// Keys per page of a scan (the deadline is checked between pages), and per prune step.
const PAGE: usize = 1000;

/// Series per `COUNTS` call in a scan on one server, at most: many enough that a page of
/// keys is ten calls, not a thousand.
const GROUP: usize = 100;

/// Hash fields one `COUNTS` call names (`HMGET`), about: a call holds Redis for a short
/// while, however long the range.
const GROUP_WORK: usize = 12_000;

/// Series per `COUNTS` call: `GROUP`, fewer when each series costs many reads (a field per
/// bucket over a long fine range), one in a cluster (each series in its own slot).
fn group_size(cluster: bool, windows: &[(i64, i64, i64)]) -> usize {
    if cluster {
        return 1;
    }
    let per_series: usize = windows
        .iter()
        .map(|&(_, lo, hi)| usize::try_from(hi - lo + 1).unwrap_or(0))
        .sum();
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
        // What the fields must be to be kept: totals, plus subtotals of one dimension, one
        // value, or all of them.
        let (mode, suffix, keep) = match (want, p.sgen) {
            (Want::All, Some(_)) => ("all", String::new(), Keep::All),
            (Want::Dim { dim }, Some(_)) => ("all", String::new(), Keep::Dim(dim)),
            (Want::Value { dim, value }, Some(sgen)) => (
                "value",
                layout::subtotal_suffix(sgen, dim, value),
                Keep::Value(dim, value),
            ),
            _ => ("totals", String::new(), Keep::Totals),
        };
        let names: Vec<String> = p
            .windows
            .iter()
            .map(|&(w, _, _)| layout::window_key(&p.tag, p.gen_, p.res, w))
            .collect();
        let replies: Vec<Value> = self
            .retry(|mut c| {
                let (names, suffix) = (&names, &suffix);
                async move {
                    let mut inv = scripts::READ.prepare_invoke();
                    for n in names {
                        inv.key(n);
                    }
                    inv.arg(mode).arg(suffix);
                    for &(_, lo, hi) in &p.windows {
                        inv.arg(lo).arg(hi);
                    }
                    inv.invoke_async(&mut c).await
                }
            })
            .await?;
        if replies.len() != p.windows.len() {
            return Err(StoreError::internal(format!(
                "{}: {} replies to a read of {} windows",
                self.label,
                replies.len(),
                p.windows.len()
            )));
        }
        let mut data = Collect::new(p);
        for (&(window, _, _), reply) in p.windows.iter().zip(&replies) {
            data.add(window, keep, reply);
        }
        Ok(data.finish())
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
        let Some(generation) = st.generation(scan.resolution) else {
            return Ok(());
        };
        // The suffix that makes an offset the wanted field.
        let suffix = match scan.value {
            None => String::new(),
            Some((dim, value)) => match st.breakdown_generation(scan.resolution) {
                Some(sgen) => layout::subtotal_suffix(sgen, dim, value),
                None => return Ok(()),
            },
        };
        self.prune(scan.ns).await?;
        let mut min = b"-".to_vec();
        loop {
            scan.deadline.check()?;
            let page = self.key_page(scan.ns, &min, b"+", PAGE).await?;
            let Some(last) = page.last() else { break };
            min = [b"(", last.as_slice()].concat();
            let group = group_size(self.is_cluster(), &windows);
            let sums = join_all(page.chunks(group).map(|keys| {
                let names: Vec<String> = keys
                    .iter()
                    .flat_map(|k| {
                        let tag = layout::series_tag(scan.ns, &String::from_utf8_lossy(k));
                        windows
                            .iter()
                            .map(|&(w, _, _)| layout::window_key(&tag, generation, res, w))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                let (windows, suffix) = (&windows, &suffix);
                async move {
                    let counts: Vec<Vec<i64>> = self
                        .retry(|mut c| {
                            let names = &names;
                            async move {
                                let mut inv = scripts::COUNTS.prepare_invoke();
                                for n in names {
                                    inv.key(n);
                                }
                                inv.arg(suffix).arg(windows.len());
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

/// Which subtotals a read keeps (totals are always kept).
#[derive(Debug, Clone, Copy)]
enum Keep<'a> {
    Totals,
    Dim(&'a str),
    Value(&'a str, &'a str),
    All,
}

impl Keep<'_> {
    fn keeps(self, dim: &str, value: &str) -> bool {
        match self {
            Keep::Totals => false,
            Keep::Dim(d) => d == dim,
            Keep::Value(d, v) => d == dim && v == value,
            Keep::All => true,
        }
    }
}

/// Buckets gathered from replies, kept sorted.
struct Collect {
    res: i64,
    /// The subtotal generation a field must carry to be read (`None`: no breakdowns).
    sgen: Option<u64>,
    totals: BTreeMap<i64, i64>,
    subtotals: BTreeMap<(String, String), BTreeMap<i64, i64>>,
    /// The window ranges: a bucket outside them is not part of the read.
    windows: Vec<(i64, i64, i64)>,
}

impl Collect {
    fn new(p: &Plan) -> Collect {
        Collect {
            res: p.res,
            sgen: p.sgen,
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

    fn add(&mut self, window: i64, keep: Keep<'_>, reply: &Value) {
        for (f, n) in pairs(reply) {
            match Field::parse(&f) {
                Some(Field::Total { offset }) if self.in_range(window, offset) => {
                    *self.totals.entry(window + offset * self.res).or_default() += n;
                }
                Some(Field::Subtotal {
                    offset,
                    sgen,
                    dim,
                    value,
                }) if Some(sgen) == self.sgen
                    && keep.keeps(dim, value)
                    && self.in_range(window, offset) =>
                {
                    *self
                        .subtotals
                        .entry((dim.to_owned(), value.to_owned()))
                        .or_default()
                        .entry(window + offset * self.res)
                        .or_default() += n;
                }
                _ => {}
            }
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
        assert_eq!(group_size(false, &hour), GROUP);
        assert_eq!(
            group_size(false, &windows(0, 5 * 86_400, 3600)),
            GROUP_WORK / 120
        );
        // A week of minutes: a field per bucket, one series per call.
        assert_eq!(group_size(false, &windows(0, 7 * 86_400, 60)), 1);
        assert_eq!(group_size(true, &hour), 1);
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

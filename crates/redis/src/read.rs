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

/// `COUNTS` calls a scan has in flight at once, at most: about `PAGE_WORK` fields.
const CALLS_AT_ONCE: usize = 100;

/// Hash fields a page of a scan names, about, before it checks its deadline again: a scan
/// of a long range takes fewer keys a page (and a key past it alone is read
/// `CALLS_AT_ONCE` calls at a time).
const PAGE_WORK: usize = CALLS_AT_ONCE * GROUP_WORK;

/// The fields a series names over `windows`: one per bucket and suffix.
fn fields_of(windows: &[(i64, i64, i64)], suffixes: usize) -> usize {
    windows
        .iter()
        .map(|&(_, lo, hi)| usize::try_from(hi - lo + 1).unwrap_or(0))
        .sum::<usize>()
        * suffixes
}

/// Series per `COUNTS` call: `GROUP`, fewer when each series costs many reads (a field per
/// bucket and suffix over a long fine range), one in a cluster (each series in its own slot).
fn group_size(cluster: bool, windows: &[(i64, i64, i64)], suffixes: usize) -> usize {
    if cluster {
        return 1;
    }
    (GROUP_WORK / fields_of(windows, suffixes).max(1)).clamp(1, GROUP)
}

/// `windows` in runs that each name at most `GROUP_WORK` fields of a series (a window
/// names at most 120 per suffix): a series over a long range is read in several calls, so
/// no call holds Redis for long, however long the range.
fn runs(windows: &[(i64, i64, i64)], suffixes: usize) -> Vec<&[(i64, i64, i64)]> {
    let mut out = Vec::new();
    let (mut start, mut work) = (0, 0);
    for (i, w) in windows.iter().enumerate() {
        let cost = fields_of(std::slice::from_ref(w), suffixes);
        if work + cost > GROUP_WORK && i > start {
            out.push(&windows[start..i]);
            (start, work) = (i, 0);
        }
        work += cost;
    }
    if start < windows.len() {
        out.push(&windows[start..]);
    }
    out
}

/// Windows a read names before it asks where its namespace has data: up to this, one script
/// call of at most this many keys (85 days of a `1m` tier, 14 years of `1h`, 34 hours of
/// `1s`), so dashboards, rate-limit windows and series never depend on the extent; a longer
/// one (all time, `last=100y`) would name a key per window of its whole range, nearly all
/// of them absent, and is clipped to the extent.
const CLIP_AFTER_WINDOWS: i64 = 1024;

/// Seconds past now a clipped range still reads, whatever the extent says: a write racing
/// the read (it widens the extent as it writes newer buckets) is read whole or not at all.
const CLIP_MARGIN_SECS: i64 = 7200;

/// What a read knows of where its namespace has data at its resolution.
#[derive(Debug, Clone, Copy)]
enum Extent {
    /// Not kept from the start (a namespace older than layout 6): the whole range is read.
    Unknown,
    /// No write ever put data here.
    Empty,
    /// The first and last bucket start written.
    Known(i64, i64),
}

/// Whether a range at `res` is long enough to be worth clipping to the extent.
fn long(from: i64, to: i64, res: i64) -> bool {
    (to - from) / res > CLIP_AFTER_WINDOWS * WINDOW_BUCKETS
}

/// `[from, to)` clipped to an extent (`None`: nothing to read).
fn clip(from: i64, to: i64, res: i64, extent: Extent, now: i64) -> Option<(i64, i64)> {
    match extent {
        Extent::Unknown => Some((from, to)),
        Extent::Empty => None,
        Extent::Known(lo, hi) => {
            let (from, to) = (from.max(lo), to.min((hi + res).max(now + CLIP_MARGIN_SECS)));
            (from < to).then_some((from, to))
        }
    }
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

/// The part of a read that a tier still shows: its generations, dimension codes and kept
/// range.
struct Plan {
    tag: String,
    resolution: Duration,
    res: i64,
    gen_: u64,
    sgen: Option<u64>,
    /// The tier's dimension codes, code → dimension.
    codes: BTreeMap<u64, String>,
    /// The record's next generation: a code at or past it is newer than the record.
    next: u64,
    /// Whether the record is the one last read, not the one stored now (`Stored::cached`).
    cached: bool,
    windows: Vec<(i64, i64, i64)>,
}

#[allow(clippy::too_many_arguments)]
fn plan_for(
    st: &Stored,
    ns: &Namespace,
    key: &str,
    resolution: Duration,
    from: i64,
    to: i64,
    now: i64,
    extent: Extent,
) -> Option<Plan> {
    let tier = st.tier(resolution)?;
    let gen_ = st.generation(resolution)?;
    let res = resolution.secs_i64();
    let from = layout::first_kept(from, tier, now);
    let (from, to) = match long(from, to, res) {
        true => clip(from, to, res, extent, now)?,
        false => (from, to),
    };
    let windows = windows(from, to, res);
    if windows.is_empty() {
        return None;
    }
    Some(Plan {
        tag: layout::series_tag(ns, key),
        resolution,
        res,
        gen_,
        sgen: st.breakdown_generation(resolution),
        codes: st.dims_by_code(resolution),
        next: st.record.next,
        cached: st.cached,
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

/// An `HGETALL` reply as pairs (RESP2 arrays or RESP3 maps), each value read by `value`;
/// a pair whose field or value does not read is left out.
fn pairs_of<T>(v: &Value, value: impl Fn(&Value) -> Option<T>) -> Vec<(String, T)> {
    let pair = |k: &Value, v: &Value| Some((text(k)?, value(v)?));
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => pair(k, v),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items.iter().filter_map(|(k, v)| pair(k, v)).collect(),
        _ => Vec::new(),
    }
}

/// An `HGETALL` reply of counts.
fn pairs(v: &Value) -> Vec<(String, i64)> {
    pairs_of(v, int)
}

/// Extents as [`RedisStore::extents`] reads them: per namespace kept from the start, each
/// resolution's; a namespace not in it is [`Extent::Unknown`].
type Extents = BTreeMap<Namespace, BTreeMap<i64, (i64, i64)>>;

fn extent_of(extents: &Extents, ns: &Namespace, resolution: Duration) -> Extent {
    match extents.get(ns) {
        None => Extent::Unknown,
        Some(m) => match m.get(&resolution.secs_i64()) {
            Some(&(lo, hi)) => Extent::Known(lo, hi),
            None => Extent::Empty,
        },
    }
}

impl RedisStore {
    /// The extents (`layout::extent_key`) of the namespaces among `nss` whose records say
    /// they were kept from the start: one `HGETALL` each, all in flight at once.
    async fn extents(
        &self,
        nss: &[&Namespace],
        schemas: &BTreeMap<Namespace, Stored>,
    ) -> Result<Extents, StoreError> {
        let kept: Vec<&Namespace> = nss
            .iter()
            .copied()
            .filter(|ns| schemas.get(*ns).is_some_and(|s| s.record.extents))
            .collect();
        let replies = join_all(kept.iter().map(|ns| {
            let name = layout::extent_key(ns);
            self.retry(move |mut c| {
                let name = name.clone();
                async move {
                    redis::cmd("HGETALL")
                        .arg(name)
                        .query_async::<Value>(&mut c)
                        .await
                }
            })
        }))
        .await;
        let mut out = Extents::new();
        for (ns, reply) in kept.into_iter().zip(replies) {
            let mut m = BTreeMap::new();
            for (field, range) in pairs_of(&reply?, text) {
                let parsed = field.parse::<i64>().ok().zip(
                    range
                        .split_once(':')
                        .and_then(|(l, h)| l.parse::<i64>().ok().zip(h.parse::<i64>().ok())),
                );
                match parsed {
                    Some((res, span)) => {
                        m.insert(res, span);
                    }
                    // Not written by tally: refuse rather than clip by a guess.
                    None => {
                        return Err(StoreError::corrupt(format!(
                            "{}: {} holds {field:?} = {range:?}, not a resolution and a range",
                            self.label,
                            layout::extent_key(ns)
                        )));
                    }
                }
            }
            out.insert(ns.clone(), m);
        }
        Ok(out)
    }

    pub(crate) async fn read_async(
        &self,
        reads: &[KeyRead<'_>],
    ) -> Result<Vec<KeyData>, StoreError> {
        let mut nss: Vec<&Namespace> = reads.iter().map(|r| r.ns).collect();
        nss.sort();
        nss.dedup();
        let mut schemas = self.load_schemas(&nss).await?;
        let mut long_reads: Vec<&Namespace> = reads
            .iter()
            .filter(|r| long(r.from, r.to, r.resolution.secs_i64()))
            .map(|r| r.ns)
            .collect();
        long_reads.sort();
        long_reads.dedup();
        let extents = self.extents(&long_reads, &schemas).await?;
        for _ in 0..4 {
            let now = self.now();
            let futures = reads.iter().map(|r| {
                let st = schemas.get(r.ns);
                let extent = extent_of(&extents, r.ns, r.resolution);
                let plan = st.and_then(|st| {
                    plan_for(
                        st,
                        r.ns,
                        r.key.as_str(),
                        r.resolution,
                        r.from,
                        r.to,
                        now,
                        extent,
                    )
                });
                async move {
                    match (plan, st) {
                        (Some(p), Some(st)) => self.read_one(&p, st, r.want).await,
                        _ => Ok((KeyData::default(), false)),
                    }
                }
            });
            let got: Vec<(KeyData, bool)> = join_all(futures)
                .await
                .into_iter()
                .collect::<Result<_, _>>()?;
            // A read that may have missed coded subtotals given a code after its record
            // was read: if the records changed since, read again with the new ones.
            let mut doubtful: Vec<&Namespace> = reads
                .iter()
                .zip(&got)
                .filter(|(_, (_, doubt))| *doubt)
                .map(|(r, _)| r.ns)
                .collect();
            doubtful.sort();
            doubtful.dedup();
            let changed = if doubtful.is_empty() {
                false
            } else {
                let fresh = self.load_schemas(&doubtful).await?;
                self.refuse_cached(&doubtful, &fresh)?;
                let changed = doubtful.iter().any(|ns| {
                    fresh.get(*ns).map(|s| &s.record) != schemas.get(*ns).map(|s| &s.record)
                });
                schemas.extend(fresh);
                changed
            };
            if !changed {
                return Ok(got.into_iter().map(|(d, _)| d).collect());
            }
        }
        Err(StoreError::unavailable(format!(
            "{}: the schemas being read kept changing; try again",
            self.label
        )))
    }

    /// A read that may have missed coded subtotals cannot be checked against a record last
    /// read instead of the one stored now: it fails rather than answer too little.
    fn refuse_cached(
        &self,
        nss: &[&Namespace],
        schemas: &BTreeMap<Namespace, Stored>,
    ) -> Result<(), StoreError> {
        match nss
            .iter()
            .find(|ns| schemas.get(**ns).is_some_and(|s| s.cached))
        {
            Some(ns) => Err(self.cached_schema(ns)),
            None => Ok(()),
        }
    }

    fn cached_schema(&self, ns: &Namespace) -> StoreError {
        StoreError::unavailable(format!(
            "{}: the schema of {ns} cannot be read now, and without it this read may miss \
             subtotals written since; try again",
            self.label
        ))
    }

    /// One key's read, and whether it may have missed subtotals written under a dimension
    /// code its record does not know yet.
    async fn read_one(
        &self,
        p: &Plan,
        st: &Stored,
        want: Want<'_>,
    ) -> Result<(KeyData, bool), StoreError> {
        // What the fields must be to be kept: totals, plus subtotals of one dimension, one
        // value, or all of them. A value's fields are looked for in both forms: coded, and
        // spelled out (written while its tier had no code for it to give).
        let (mode, suffixes, keep) = match (want, p.sgen) {
            (Want::All, Some(_)) => ("all", [String::new(), String::new()], Keep::All),
            (Want::Dim { dim }, Some(_)) => ("all", [String::new(), String::new()], Keep::Dim(dim)),
            (Want::Value { dim, value }, Some(sgen)) => (
                "value",
                [
                    layout::subtotal_suffix(sgen, dim, value),
                    st.code(p.resolution, dim)
                        .map(|c| layout::coded_suffix(c, value))
                        .unwrap_or_default(),
                ],
                Keep::Value(dim, value),
            ),
            _ => ("totals", [String::new(), String::new()], Keep::Totals),
        };
        // A value read by name cannot see a code it does not know: it must look again if
        // one may have been given.
        let doubt = match keep {
            Keep::Value(dim, _) => st.may_get_code(p.resolution, dim),
            _ => false,
        };
        let names: Vec<String> = p
            .windows
            .iter()
            .map(|&(w, _, _)| layout::window_key(&p.tag, p.gen_, p.res, w))
            .collect();
        let replies: Vec<Value> = self
            .retry(|mut c| {
                let (names, suffixes) = (&names, &suffixes);
                async move {
                    let mut inv = scripts::READ.prepare_invoke();
                    for n in names {
                        inv.key(n);
                    }
                    inv.arg(mode).arg(&suffixes[0]).arg(&suffixes[1]);
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
        let doubt = doubt || data.newer_code;
        Ok((data.finish(), doubt))
    }

    /// Drops keys whose every bucket has expired from a namespace's index.
    async fn prune(&self, ns: &Namespace) -> Result<(), StoreError> {
        let (dir, exp) = (layout::key_dir_key(ns), layout::expiry_key(ns));
        let pfx = layout::key_page_prefix(ns);
        let now = self.now();
        for _ in 0..1000 {
            let removed: i64 = self
                .retry(|mut c| {
                    let (dir, exp, pfx) = (&dir, &exp, &pfx);
                    async move {
                        scripts::PRUNE
                            .key(dir)
                            .key(exp)
                            .arg(now)
                            .arg(PAGE)
                            .arg(pfx)
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

    /// Keys of a namespace's index in byte order between two `ZRANGEBYLEX` bounds, at most
    /// `limit` (one `KEY_PAGE` call: atomic, however many pages it reads).
    async fn key_page(
        &self,
        ns: &Namespace,
        min: &[u8],
        max: &[u8],
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let (dir, pfx) = (layout::key_dir_key(ns), layout::key_page_prefix(ns));
        self.retry(|mut c| {
            let (dir, pfx) = (&dir, &pfx);
            async move {
                scripts::KEY_PAGE
                    .key(dir)
                    .arg(pfx)
                    .arg(min)
                    .arg(max)
                    .arg(limit)
                    .invoke_async(&mut c)
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
        let from = layout::first_kept(scan.from, tier, now);
        let (from, to) = if long(from, scan.to, res) {
            let extents = self.extents(&[scan.ns], &schemas).await?;
            match clip(
                from,
                scan.to,
                res,
                extent_of(&extents, scan.ns, scan.resolution),
                now,
            ) {
                Some(r) => r,
                None => return Ok(()),
            }
        } else {
            (from, scan.to)
        };
        let windows = windows(from, to, res);
        if windows.is_empty() {
            return Ok(());
        }
        let Some(generation) = st.generation(scan.resolution) else {
            return Ok(());
        };
        // The suffixes that make an offset the wanted fields: the total, or a value's
        // subtotal spelled out and (if its dimension has a code) coded.
        let suffixes = match scan.value {
            None => vec![String::new()],
            Some((dim, value)) => match st.breakdown_generation(scan.resolution) {
                Some(_) if st.cached && st.may_get_code(scan.resolution, dim) => {
                    return Err(self.cached_schema(scan.ns));
                }
                Some(sgen) => {
                    let mut s = vec![layout::subtotal_suffix(sgen, dim, value)];
                    s.extend(
                        st.code(scan.resolution, dim)
                            .map(|c| layout::coded_suffix(c, value)),
                    );
                    s
                }
                None => return Ok(()),
            },
        };
        self.prune(scan.ns).await?;
        // A series over a long range is read in runs of windows, a call each; then one
        // series a call. A page takes as many keys as `PAGE_WORK` fields allow.
        let runs = runs(&windows, suffixes.len());
        let group = match runs.len() {
            1 => group_size(self.is_cluster(), &windows, suffixes.len()),
            _ => 1,
        };
        let page_size = (PAGE_WORK / fields_of(&windows, suffixes.len()).max(1)).clamp(1, PAGE);
        let mut min = b"-".to_vec();
        loop {
            scan.deadline.check()?;
            let page = self.key_page(scan.ns, &min, b"+", page_size).await?;
            let Some(last) = page.last() else { break };
            min = [b"(", last.as_slice()].concat();
            let calls: Vec<_> = page
                .chunks(group)
                .enumerate()
                .flat_map(|(g, keys)| runs.iter().map(move |run| (g, keys, *run)))
                .collect();
            // Each call's sums, added at the place of its first key.
            let mut all = vec![0i64; page.len()];
            // At most `PAGE_WORK` fields in flight, the deadline checked between: one key
            // of years of minutes alone names millions.
            for (i, calls) in calls.chunks(CALLS_AT_ONCE).enumerate() {
                if i > 0 {
                    scan.deadline.check()?;
                }
                let sums = join_all(calls.iter().map(|&(g, keys, windows)| {
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
                    let suffixes = &suffixes;
                    async move {
                        let counts: Vec<Vec<i64>> = self
                            .retry(|mut c| {
                                let names = &names;
                                async move {
                                    let mut inv = scripts::COUNTS.prepare_invoke();
                                    for n in names {
                                        inv.key(n);
                                    }
                                    inv.arg(suffixes.len());
                                    for s in suffixes {
                                        inv.arg(s);
                                    }
                                    inv.arg(windows.len());
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
                        Ok::<(usize, Vec<i64>), StoreError>((
                            g * group,
                            counts
                                .iter()
                                .map(|c| c.iter().fold(0i64, |a, n| a.wrapping_add(*n)))
                                .collect(),
                        ))
                    }
                }))
                .await;
                for sums in sums {
                    let (first, sums) = sums?;
                    for (sum, n) in all[first..].iter_mut().zip(sums) {
                        *sum = sum.wrapping_add(n);
                    }
                }
            }
            let full = page.len() == page_size;
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
    /// The tier's codes, code → dimension, and the record's next generation.
    codes: BTreeMap<u64, String>,
    next: u64,
    /// Whether the record is the one last read: then a failover may have given codes below
    /// its `next` since, and any code it does not know may be wanted.
    cached: bool,
    /// Whether a field a read keeps could be under a code newer than the record.
    newer_code: bool,
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
            codes: p.codes.clone(),
            next: p.next,
            cached: p.cached,
            newer_code: false,
            totals: BTreeMap::new(),
            subtotals: BTreeMap::new(),
            windows: p.windows.clone(),
        }
    }

    /// Whether a window's bucket is part of the read. Windows are in order (`windows`), so
    /// a binary search: a scan of all of them per field made a long read's decoding
    /// quadratic (8.8 s for a read of 4 096 dense 1m windows, found by an independent
    /// review).
    fn in_range(&self, window: i64, offset: i64) -> bool {
        self.windows
            .binary_search_by_key(&window, |&(w, _, _)| w)
            .is_ok_and(|i| {
                let (_, lo, hi) = self.windows[i];
                (lo..=hi).contains(&offset)
            })
    }

    fn add(&mut self, window: i64, keep: Keep<'_>, reply: &Value) {
        for (f, n) in pairs(reply) {
            match Field::parse(&f) {
                Some(Field::Total { offset }) if self.in_range(window, offset) => {
                    let t = self.totals.entry(window + offset * self.res).or_default();
                    *t = t.wrapping_add(n);
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
                    self.subtotal(window, offset, dim, value, n);
                }
                Some(Field::Coded {
                    offset,
                    code,
                    value,
                }) if self.sgen.is_some() && self.in_range(window, offset) => {
                    match self.codes.get(&code) {
                        Some(dim) if keep.keeps(dim, value) => {
                            let dim = dim.clone();
                            self.subtotal(window, offset, &dim, value, n);
                        }
                        Some(_) => {}
                        // Given after the record was read (a smaller one is of an earlier
                        // subtotal generation, hidden, unless the record is a cached one);
                        // it matters unless the read wants a dimension whose code it knows.
                        None if code >= self.next || self.cached => {
                            self.newer_code |= match keep {
                                Keep::Totals => false,
                                Keep::Dim(d) | Keep::Value(d, _) => {
                                    !self.codes.values().any(|c| c == d)
                                }
                                Keep::All => true,
                            };
                        }
                        None => {}
                    }
                }
                _ => {}
            }
        }
    }

    fn subtotal(&mut self, window: i64, offset: i64, dim: &str, value: &str, n: i64) {
        let s = self
            .subtotals
            .entry((dim.to_owned(), value.to_owned()))
            .or_default()
            .entry(window + offset * self.res)
            .or_default();
        *s = s.wrapping_add(n);
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
            rest: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counts_call_is_bounded_by_the_reads_it_makes() {
        let hour = windows(0, 3600, 3600);
        assert_eq!(group_size(false, &hour, 1), GROUP);
        assert_eq!(
            group_size(false, &windows(0, 5 * 86_400, 3600), 1),
            GROUP_WORK / 120
        );
        // Two fields per bucket (a value, spelled out and coded): half as many series.
        assert_eq!(
            group_size(false, &windows(0, 5 * 86_400, 3600), 2),
            GROUP_WORK / 240
        );
        // A week of minutes: a field per bucket, one series per call.
        assert_eq!(group_size(false, &windows(0, 7 * 86_400, 60), 1), 1);
        assert_eq!(group_size(true, &hour, 1), 1);
    }

    fn reply(fields: &[(&str, i64)]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(f, n)| {
                    [
                        Value::BulkString(f.as_bytes().to_vec()),
                        Value::BulkString(n.to_string().into_bytes()),
                    ]
                })
                .collect(),
        )
    }

    fn plan() -> Plan {
        Plan {
            tag: "{m|k}".into(),
            resolution: Duration::new("1h").unwrap(),
            res: 3600,
            gen_: 1,
            sgen: Some(2),
            codes: BTreeMap::from([(5, "country".to_owned())]),
            next: 7,
            cached: false,
            windows: vec![(0, 0, 119)],
        }
    }

    /// A scan's windows go in runs of at most `GROUP_WORK` fields a series, in order, each
    /// window whole in one run.
    #[test]
    fn runs_of_windows_name_at_most_group_work_fields() {
        let years = windows(0, 14 * 365 * 86_400, 3600);
        for suffixes in [1, 2] {
            let r = runs(&years, suffixes);
            assert!(r.len() > 5, "{}", r.len());
            assert!(r.iter().all(|run| fields_of(run, suffixes) <= GROUP_WORK));
            assert_eq!(r.concat(), years);
        }
        let day = windows(0, 86_400, 3600);
        assert_eq!(runs(&day, 2), vec![&day[..]]);
        assert_eq!(runs(&[], 1), Vec::<&[(i64, i64, i64)]>::new());
    }

    /// A long read's bucket check is a binary search over its windows: it answers as a
    /// scan of every window does, for buckets inside, before, between and after them.
    #[test]
    fn a_bucket_is_in_range_exactly_when_a_window_holds_it() {
        let res = 60;
        let span = res * WINDOW_BUCKETS;
        let mut p = plan();
        p.res = res;
        p.windows = windows(span * 3 + 17 * res, span * 700 - 5 * res, res);
        let c = Collect::new(&p);
        let scan = |w: i64, o: i64| {
            p.windows
                .iter()
                .any(|&(x, lo, hi)| x == w && (lo..=hi).contains(&o))
        };
        for w in (0..span * 702).step_by(span as usize) {
            for o in [-1, 0, 1, 16, 17, 18, 114, 115, 116, 119, 120] {
                assert_eq!(c.in_range(w, o), scan(w, o), "window {w}, offset {o}");
            }
            assert!(!c.in_range(w + 1, 20), "not a window's start");
        }
    }

    /// Both forms of a subtotal add up; a code of an earlier subtotal generation is hidden;
    /// a code newer than the record makes the read doubtful when it could be wanted.
    #[test]
    fn coded_and_spelled_out_subtotals_add_up() {
        let fields = [
            ("3", 10),
            ("3.5:US", 4),
            ("3:2:country:US", 1),
            ("3:1:country:US", 100),
            ("3.4:US", 100),
            ("4.9:x", 3),
        ];
        let read = |keep| {
            let mut c = Collect::new(&plan());
            c.add(0, keep, &reply(&fields));
            let newer = c.newer_code;
            (c.finish(), newer)
        };
        let (all, newer) = read(Keep::All);
        assert!(newer);
        assert_eq!(all.totals, vec![(3 * 3600, 10)]);
        assert_eq!(all.subtotals.len(), 1);
        assert_eq!(all.subtotals[0].dim, "country");
        assert_eq!(all.subtotals[0].buckets, vec![(3 * 3600, 5)]);
        assert!(!read(Keep::Totals).1);
        assert!(!read(Keep::Dim("country")).1, "its code is known");
        assert!(read(Keep::Dim("device")).1);
        let (value, newer) = read(Keep::Value("country", "US"));
        assert!(!newer);
        assert_eq!(value.subtotals[0].buckets, vec![(3 * 3600, 5)]);

        // Through a cached record, an unknown code below `next` may be one a failover gave
        // again: doubtful too.
        let older = [("3", 10), ("3.4:US", 100)];
        let doubt = |cached, keep| {
            let mut c = Collect::new(&Plan { cached, ..plan() });
            c.add(0, keep, &reply(&older));
            c.newer_code
        };
        assert!(!doubt(false, Keep::All), "an earlier generation's code");
        assert!(doubt(true, Keep::All));
        assert!(doubt(true, Keep::Dim("device")));
        assert!(!doubt(true, Keep::Dim("country")), "its code is known");
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

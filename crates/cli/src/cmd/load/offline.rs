//! `tally load --data`: the offline loader, which meets its input once per pass.
//!
//! A reading thread decompresses the input, splits its records and checks each one by the
//! API's rules. For CSV it remembers what it has checked: a namespace, a dimension value and
//! a combination of one line's values (what decides its subtotals, the schema's allow-list
//! and compounds included) are each checked once, then known by a number; a key is checked
//! on every line (cheaper than finding it among every key seen, which the aggregating thread
//! does when it numbers keys for the [`Bulk`], so the two threads share the work). A line
//! it cannot decide that way — quoted or not UTF-8, a timestamp or amount out of bounds,
//! anything the rules refuse — and every NDJSON event go through the check every other path
//! uses ([`Checker`], one event at a time), which also gives the reason. So the two ways
//! accept exactly the same lines (`tests::the_fast_check_agrees_with_the_api_rules`).
//!
//! The main thread adds the rows into a [`Bulk`] (appending counter updates: see its
//! module) and installs it:
//! - pass 1 checks every line and aggregates while the aggregate fits its share of
//!   `--memory-mb` (see `run`); if every line was checked and the aggregate fit, it is
//!   installed — one pass;
//! - otherwise (the budget filled) pass 2 reads the input again and installs whenever the
//!   aggregate fills the budget.
//!
//! Nothing is installed before every line is checked, so a bad line refuses the load with
//! nothing applied. Batches of `--batch` records carry idempotency answers
//! (`tally-load-{digest}-{batch}-{first line}`) installed with their counts: a re-run skips
//! what an earlier run installed. A rebuild (`--replace`) neither looks answers up nor
//! records them: it replaces its range with every line of its files, loaded before or not.
//!
//! Memory: the aggregate (its keys' names included) is bounded as above; the reading thread's
//! tables of names are bounded to an eighth of `--memory-mb` (past it, it forgets them and
//! numbers afresh, and the aggregate, told so, installs what it holds first when it may).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::json;
use tally_core::model::{self as m, DimName, DimValue, Key, Namespace, RawEvent, Schema};
use tally_core::store::{IdemRecord, Store};
use tally_engine::{Bulk, Engine, SubId};

use super::{Checker, LoadArgs, Rebuild, Source, progress};
use crate::conn::write_json;
use crate::load::{Format, Input, csv_event};

/// Seeded per process (as the engine's tables are, see `tally_engine`'s `seeded`): the
/// names come from files, which anyone may have written.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Heap bytes of one remembered name beyond its own bytes (map entry, spare capacity).
const NAME_OVERHEAD: usize = 48;
/// Segments installed before the archive is compacted (see `Aggregate::install`).
const COMPACT_AFTER_SEGMENTS: usize = 512;
/// Combinations of values remembered before the table starts again.
const MAX_COMBOS: usize = 1 << 20;

/// Combinations of a line's values (see `Scanner::fast`) → their subtotals (`None`: the
/// rules refuse it). Up to four numbers (a namespace and three columns) are packed into one
/// `u128` key, found without following a pointer (the line's second costliest look-up when
/// boxed); longer ones are boxed. (A file's combinations all have its width, so the zeros
/// packing leaves after a short one name nothing else.)
#[derive(Debug, Default)]
struct Combos {
    packed: Map<u128, Option<(u32, u32)>>,
    boxed: Map<Box<[u32]>, Option<(u32, u32)>>,
}

impl Combos {
    #[inline]
    fn pack(c: &[u32]) -> Option<u128> {
        if c.len() > 4 {
            return None;
        }
        Some(
            c.iter()
                .enumerate()
                .fold(0u128, |k, (i, x)| k | (u128::from(*x) << (32 * i))),
        )
    }

    #[inline]
    fn get(&self, c: &[u32]) -> Option<Option<(u32, u32)>> {
        match Self::pack(c) {
            Some(k) => self.packed.get(&k).copied(),
            None => self.boxed.get(c).copied(),
        }
    }

    fn insert(&mut self, c: &[u32], subs: Option<(u32, u32)>) {
        match Self::pack(c) {
            Some(k) => self.packed.insert(k, subs),
            None => self.boxed.insert(c.into(), subs),
        };
    }

    fn len(&self) -> usize {
        self.packed.len() + self.boxed.len()
    }

    fn clear(&mut self) {
        self.packed.clear();
        self.boxed.clear();
    }
}

/// One checked event, its names by number (its key: `keys[key..key + key_len]` of the
/// chunk).
#[derive(Debug, Clone, Copy)]
struct Row {
    ns: u32,
    key: u32,
    key_len: u32,
    /// Its subtotals: `subs[from..from + len]` of the chunk.
    from: u32,
    len: u32,
    ts: i64,
    n: i64,
}

/// A batch of `--batch` records, checked.
#[derive(Debug, Default)]
struct Chunk {
    /// The reader forgot its names before this chunk: numbers start again.
    reset: bool,
    /// Names numbered in this chunk, in the order of their numbers.
    new_ns: Vec<(Namespace, Schema)>,
    new_subs: Vec<(String, String)>,
    rows: Vec<Row>,
    /// The rows' keys, checked, back to back: the aggregating thread numbers them (a look-up
    /// in a table of every key, which costs a miss to memory: there, not on this thread).
    keys: String,
    subs: Vec<u32>,
    /// Its idempotency key; `None` when an earlier run installed it.
    answer: Option<String>,
    /// Good events in it.
    events: u64,
}

/// The reading side: what has been checked, by number.
struct Scanner<'a> {
    checker: &'a Checker,
    rebuild: Option<&'a Rebuild>,
    engine: &'a Engine,
    /// Namespaces, never forgotten (few): bytes → number.
    ns_ids: Map<Box<[u8]>, u32>,
    nss: Vec<(Namespace, Schema)>,
    sent_ns: usize,
    /// Subtotals, `dim \0 value` → number.
    sub_ids: Map<Box<str>, u32>,
    /// The file's header: dimension names (None: not a valid name).
    dims: Vec<String>,
    dim_names: Vec<Option<DimName>>,
    /// Values by column: bytes → number, and the values by number.
    values: Vec<Map<Box<[u8]>, u32>>,
    value_names: Vec<Vec<DimValue>>,
    /// (namespace, value number + 1 or 0 per column) → its subtotals in `combo_subs`
    /// (`None`: the rules refuse it).
    combos: Combos,
    combo_subs: Vec<u32>,
    /// Bytes the tables above hold (estimated), and their bound.
    bytes: usize,
    max_bytes: usize,
    forgot: bool,
    scratch: Vec<u32>,
}

impl<'a> Scanner<'a> {
    fn new(
        checker: &'a Checker,
        rebuild: Option<&'a Rebuild>,
        engine: &'a Engine,
        max_bytes: usize,
    ) -> Scanner<'a> {
        Scanner {
            checker,
            rebuild,
            engine,
            ns_ids: Map::default(),
            nss: Vec::new(),
            sent_ns: 0,
            sub_ids: Map::default(),
            dims: Vec::new(),
            dim_names: Vec::new(),
            values: Vec::new(),
            value_names: Vec::new(),
            combos: Combos::default(),
            combo_subs: Vec::new(),
            bytes: 0,
            max_bytes,
            forgot: false,
            scratch: Vec::new(),
        }
    }

    /// A new file: its header's dimension columns.
    fn header(&mut self, dims: &[String]) {
        self.dims = dims.to_vec();
        self.dim_names = dims.iter().map(|d| DimName::new(d).ok()).collect();
        self.values = dims.iter().map(|_| Map::default()).collect();
        self.value_names = dims.iter().map(|_| Vec::new()).collect();
        self.combos.clear();
        self.combo_subs.clear();
    }

    /// Forgets values, subtotals and combinations (not namespaces): the next chunk says so.
    fn forget(&mut self) {
        self.sub_ids = Map::default();
        let dims = self.dims.clone();
        self.header(&dims);
        self.combos = Combos::default();
        self.bytes = 0;
        self.forgot = true;
    }

    /// The namespace's number, checking it (and creating it in the checker, as a batch
    /// would) the first time; `None` if the rules refuse it.
    fn ns(&mut self, bytes: &[u8]) -> anyhow::Result<Option<u32>> {
        if let Some(id) = self.ns_ids.get(bytes) {
            return Ok(Some(*id));
        }
        let Some(ns) = std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| Namespace::new(s).ok())
        else {
            return Ok(None);
        };
        let schema = match self.checker.schemas.schema(&ns) {
            Ok(Some(s)) => s,
            Ok(None) if self.checker.defaults.auto_create => {
                // One too many: the checker's own pass names the line and the limit.
                match self.checker.schemas.namespace_count() {
                    Ok(n) if n >= self.checker.limits.max_namespaces => return Ok(None),
                    Ok(_) => {}
                    Err(e) => bail!("checking a namespace: {}", e.detail()),
                }
                let s = self.checker.defaults.schema.clone();
                self.checker
                    .schemas
                    .put_schema(&ns, &s)
                    .map_err(|e| anyhow::anyhow!(e.detail()))?;
                s
            }
            Ok(None) => return Ok(None),
            Err(e) => bail!("checking a namespace: {}", e.detail()),
        };
        let id = self.nss.len() as u32;
        self.nss.push((ns, schema));
        self.ns_ids.insert(bytes.into(), id);
        Ok(Some(id))
    }

    /// Checks a key and adds it to the chunk's keys: where it starts there, and its length.
    fn key(bytes: &[u8], chunk: &mut Chunk) -> Option<(u32, u32)> {
        let key = std::str::from_utf8(bytes)
            .ok()
            .filter(|k| Key::is_valid(k))?;
        let at = chunk.keys.len() as u32;
        chunk.keys.push_str(key);
        Some((at, key.len() as u32))
    }

    /// The subtotal's number.
    fn sub(&mut self, dim: &str, value: &str, chunk: &mut Chunk) -> u32 {
        let name = format!("{dim}\0{value}");
        if let Some(id) = self.sub_ids.get(name.as_str()) {
            return *id;
        }
        let id = self.sub_ids.len() as u32;
        self.bytes += name.len() + NAME_OVERHEAD;
        self.sub_ids.insert(name.into(), id);
        chunk.new_subs.push((dim.to_owned(), value.to_owned()));
        id
    }

    /// Checks a record the quick way and adds its row to `chunk`; `false` if this way cannot
    /// tell (the caller asks [`Scanner::slow`]).
    fn fast(&mut self, rec: &csv::ByteRecord, chunk: &mut Chunk) -> anyhow::Result<bool> {
        if rec.len() != 4 + self.dims.len() {
            return Ok(false);
        }
        let field = |i: usize| rec.get(i).unwrap_or_default();
        let Some(ns) = self.ns(field(0))? else {
            return Ok(false);
        };
        let c = self.checker;
        let ts = match field(2) {
            b"" => c.now,
            t => match std::str::from_utf8(t).map(m::parse_timestamp) {
                Ok(Ok(ts)) if ts <= c.now.saturating_add(c.limits.max_future_secs) => ts,
                _ => return Ok(false),
            },
        };
        let n = match field(3) {
            b"" => 1,
            t => match std::str::from_utf8(t).map(str::parse::<i64>) {
                Ok(Ok(n)) if m::amount(n).is_ok() => n,
                _ => return Ok(false),
            },
        };
        if let Some(r) = self.rebuild
            && (self.nss[ns as usize].0 != r.ns || ts < r.from || ts >= r.to)
        {
            return Ok(false);
        }
        // The line's values, by number, decide its subtotals.
        let mut combo = std::mem::take(&mut self.scratch);
        combo.clear();
        combo.push(ns);
        for col in 0..self.dims.len() {
            let v = field(4 + col);
            if v.is_empty() {
                combo.push(0);
                continue;
            }
            let values = &mut self.values[col];
            let id = match values.get(v) {
                Some(id) => *id,
                None => {
                    let Some(value) = std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| DimValue::new(s).ok())
                    else {
                        self.scratch = combo;
                        return Ok(false);
                    };
                    let id = self.value_names[col].len() as u32;
                    values.insert(v.into(), id);
                    self.value_names[col].push(value);
                    self.bytes += v.len() + NAME_OVERHEAD;
                    id
                }
            };
            combo.push(id + 1);
        }
        let subs = match self.combos.get(&combo) {
            Some(s) => s,
            None => {
                if self.combos.len() >= MAX_COMBOS {
                    self.combos.clear();
                    self.combo_subs.clear();
                }
                let s = self.combo(&combo, chunk);
                self.bytes += combo.len() * 4 + NAME_OVERHEAD;
                self.combos.insert(&combo, s);
                s
            }
        };
        self.scratch = combo;
        let Some((from, len)) = subs else {
            return Ok(false);
        };
        let Some((key, key_len)) = Self::key(field(1), chunk) else {
            return Ok(false);
        };
        let at = chunk.subs.len() as u32;
        chunk
            .subs
            .extend_from_slice(&self.combo_subs[from as usize..(from + len) as usize]);
        chunk.rows.push(Row {
            ns,
            key,
            key_len,
            from: at,
            len,
            ts,
            n,
        });
        Ok(true)
    }

    /// The subtotals of a combination of values (see `fast`), in `combo_subs`; `None` if
    /// the rules refuse it.
    fn combo(&mut self, combo: &[u32], chunk: &mut Chunk) -> Option<(u32, u32)> {
        let (ns, values) = combo.split_first()?;
        let mut dims = Vec::new();
        for (col, v) in values.iter().enumerate() {
            if *v == 0 {
                continue;
            }
            let name = self.dim_names.get(col)?.clone()?;
            let value = self.value_names.get(col)?.get(*v as usize - 1)?.clone();
            dims.push((name, value));
        }
        if dims.len() > m::MAX_DIMS_PER_EVENT {
            return None;
        }
        dims.sort_unstable();
        if dims.windows(2).any(|w| w[0].0 == w[1].0) {
            return None;
        }
        let subtotals = self.nss.get(*ns as usize)?.1.subtotals(&dims).ok()?;
        let from = self.combo_subs.len() as u32;
        for s in &subtotals {
            let id = self.sub(&s.dim, &s.value, chunk);
            self.combo_subs.push(id);
        }
        Some((from, subtotals.len() as u32))
    }

    /// Checks a record as every other path does; adds its row, or answers why it is bad.
    fn slow(
        &mut self,
        rec: &csv::ByteRecord,
        chunk: &mut Chunk,
    ) -> anyhow::Result<Result<(), String>> {
        match csv_event(rec, &self.dims) {
            Ok(raw) => self.slow_event(raw, chunk),
            Err(why) => Ok(Err(why)),
        }
    }

    /// Checks an event as every other path does; adds its row, or answers why it is bad.
    fn slow_event(
        &mut self,
        raw: RawEvent,
        chunk: &mut Chunk,
    ) -> anyhow::Result<Result<(), String>> {
        if let Some(why) = self.rebuild.and_then(|r| r.refuses(&raw)) {
            return Ok(Err(why));
        }
        let batch = match self.checker.one(raw)? {
            Ok(b) => b,
            Err(why) => return Ok(Err(why)),
        };
        let Some(inc) = batch.increments.first() else {
            bail!("a checked event went missing");
        };
        let Some(ns) = self.ns(inc.ns.as_str().as_bytes())? else {
            bail!("namespace {} passed the check but not the loader's", inc.ns);
        };
        let Some((key, key_len)) = Self::key(inc.key.as_str().as_bytes(), chunk) else {
            bail!("key {:?} passed the check but not the loader's", inc.key);
        };
        let from = chunk.subs.len() as u32;
        for s in &inc.subtotals {
            let id = self.sub(&s.dim, &s.value, chunk);
            chunk.subs.push(id);
        }
        chunk.rows.push(Row {
            ns,
            key,
            key_len,
            from,
            len: inc.subtotals.len() as u32,
            ts: inc.ts,
            n: inc.n,
        });
        Ok(Ok(()))
    }

    /// Starts a chunk: the names forgotten first if they outgrew their bound.
    fn start_chunk(&mut self, chunk: &mut Chunk) {
        if self.bytes > self.max_bytes {
            self.forget();
        }
        chunk.reset = std::mem::take(&mut self.forgot);
    }

    /// Ends a chunk: it carries the namespaces numbered since the last one.
    fn end_chunk(&mut self, chunk: &mut Chunk) {
        chunk.new_ns.extend(
            self.nss
                .get(self.sent_ns..)
                .unwrap_or_default()
                .iter()
                .cloned(),
        );
        self.sent_ns = self.nss.len();
    }
}

/// The aggregating side: the reader's numbers mapped to the [`Bulk`]'s.
struct Aggregate {
    bulk: Bulk,
    subs: Vec<SubId>,
    /// By namespace number: its tiers (resolution, the newest bucket start retention drops,
    /// whether subtotals are kept).
    tiers: Vec<Vec<(i64, i64, bool)>>,
    nss: Vec<Namespace>,
    used: Vec<bool>,
    schemas: Vec<Schema>,
    answers: Vec<IdemRecord>,
    /// Segments installed since the archive was last compacted.
    segments: usize,
}

impl Aggregate {
    /// With counters bounded to `budget` bytes (0: unbounded), cut in parts as `engine`
    /// cuts periods.
    fn new(budget: usize, engine: &Engine) -> Aggregate {
        let mut bulk = Bulk::default();
        bulk.set_policy(engine.flush_policy());
        bulk.set_budget(budget);
        Aggregate {
            bulk,
            subs: Vec::new(),
            tiers: Vec::new(),
            nss: Vec::new(),
            used: Vec::new(),
            schemas: Vec::new(),
            answers: Vec::new(),
            segments: 0,
        }
    }

    /// Learns the chunk's names (after a reset, afresh).
    fn names(&mut self, chunk: &mut Chunk, now: i64) {
        if chunk.reset {
            self.subs.clear();
        }
        for (ns, schema) in chunk.new_ns.drain(..) {
            let tiers = schema
                .tiers()
                .iter()
                .map(|t| {
                    let res = t.resolution.secs_i64();
                    // `keeps_bucket`: start + res > now - retention.
                    let drops_through = match t.retention {
                        m::Retention::Forever => i64::MIN,
                        m::Retention::For(d) => now.saturating_sub(d.secs_i64()) - res,
                    };
                    (res, drops_through, schema.is_breakdown(t.resolution))
                })
                .collect();
            self.tiers.push(tiers);
            self.nss.push(ns);
            self.used.push(false);
            self.schemas.push(schema);
        }
        for (dim, value) in chunk.new_subs.drain(..) {
            let id = self.bulk.sub(&dim, &value);
            self.subs.push(id);
        }
    }

    /// Adds the chunk's rows as the write path would count them.
    fn add(&mut self, chunk: &Chunk) {
        for row in &chunk.rows {
            let name = &chunk.keys[row.key as usize..(row.key + row.key_len) as usize];
            let key = self.bulk.key(self.nss[row.ns as usize].as_str(), name);
            let subs = &chunk.subs[row.from as usize..(row.from + row.len) as usize];
            self.used[row.ns as usize] = true;
            for &(res, drops_through, breakdown) in &self.tiers[row.ns as usize] {
                let start = row.ts.div_euclid(res) * res;
                if start <= drops_through {
                    continue;
                }
                self.bulk.add_to(key, None, res, start, row.n);
                if breakdown {
                    for s in subs {
                        self.bulk
                            .add_to(key, Some(self.subs[*s as usize]), res, start, row.n);
                    }
                }
            }
        }
    }

    /// Creates the namespaces the rows use that the engine lacks.
    fn create(&self, engine: &Engine) -> anyhow::Result<()> {
        for ((ns, schema), used) in self.nss.iter().zip(&self.schemas).zip(&self.used) {
            let known = engine
                .schema(ns)
                .map_err(|e| anyhow::anyhow!(e.detail()))?
                .is_some();
            if *used && !known {
                engine
                    .put_schema(ns, schema)
                    .map_err(|e| anyhow::anyhow!(e.detail()))?;
            }
        }
        Ok(())
    }

    /// Installs what is held (with the answers of its batches), keeping the names.
    ///
    /// Every install writes a segment per (tier, period) it touches, and every segment keeps
    /// a file open: once the installs since the last compaction have written
    /// [`COMPACT_AFTER_SEGMENTS`], the archive is compacted (a period's pieces merged), so a
    /// long backfill in little memory does not run out of file descriptors.
    fn install(&mut self, engine: &Engine) -> anyhow::Result<()> {
        if self.bulk.is_empty() && self.answers.is_empty() {
            return Ok(());
        }
        self.create(engine)?;
        let report = engine
            .install_from(&mut self.bulk, std::mem::take(&mut self.answers))
            .map_err(|e| anyhow::anyhow!(e.detail()))
            .context("installing archive segments")?;
        self.segments += report.segments;
        if self.segments >= COMPACT_AFTER_SEGMENTS {
            // Only to bound the files held open: a merge that fails (a segment already
            // there found damaged) is passed over while the pass merges the rest, and the
            // load goes on, saying so — it must not fail on every run for an old file.
            if let Err(e) = engine.compact() {
                eprintln!(
                    "tally: warning: compacting the installed segments: {}; the load goes on \
                     (`tally check --data` names any damage)",
                    e.detail()
                );
            }
            self.segments = 0;
        }
        Ok(())
    }

    /// The most counter updates a chunk can add, and the most parts they can open (per tier
    /// resolution, the periods between the chunk's first and last times, at most one per
    /// row).
    fn most(&self, chunk: &Chunk) -> (usize, usize) {
        let (mut updates, mut from, mut to) = (0, i64::MAX, i64::MIN);
        let mut res: Vec<i64> = Vec::new();
        for r in &chunk.rows {
            let tiers = self.tiers.get(r.ns as usize).map_or(&[][..], Vec::as_slice);
            updates += tiers.len() * (1 + r.len as usize);
            (from, to) = (from.min(r.ts), to.max(r.ts));
            for (t, _, _) in tiers {
                if !res.contains(t) {
                    res.push(*t);
                }
            }
        }
        let rows = chunk.rows.len();
        if rows == 0 {
            return (0, 0);
        }
        let parts = res
            .iter()
            .map(|r| self.bulk.periods_within(*r, from, to).min(rows))
            .sum();
        (updates, parts)
    }
}

/// How a pass treats what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Check every line; aggregate while the budget holds.
    First,
    /// Aggregate and install whenever the budget fills (the lines are known good).
    Second,
}

/// What a pass found.
#[derive(Debug, Default)]
struct Found {
    events: u64,
    already: u64,
    bad: u64,
    shown: Vec<String>,
    /// The aggregate outgrew its budget (pass 1 stopped aggregating).
    overflowed: bool,
}

pub(super) fn run(
    a: &LoadArgs,
    engine: &Engine,
    sources: &[Source],
    checker: &Checker,
    rebuild: Option<&Rebuild>,
    start: Instant,
    created: Option<&Path>,
) -> anyhow::Result<()> {
    let total: u64 = sources.iter().map(|s| s.bytes).sum();
    let memory = a.memory_mb as usize * 1024 * 1024;
    // The aggregate gets two thirds: its updates (16 bytes each, in blocks; merged in place,
    // one per counter, when they fill it) and room to sort its largest part, which copies
    // that part once; the reader's names get an eighth.
    let budget = memory / 3 * 2;
    let names = memory / 8;
    let mut agg = Aggregate::new(budget, engine);
    let found = pass(
        a,
        engine,
        sources,
        checker,
        rebuild,
        Pass::First,
        budget,
        names,
        &mut agg,
        total,
    )?;
    if found.events + found.already == 0 && rebuild.is_none() {
        if a.json {
            super::json_summary(
                0,
                sources.len(),
                start.elapsed().as_secs_f64(),
                json!({
                    "passes": 1,
                    "loaded_before": 0,
                    "skipped": found.bad,
                    "skipped_lines": found.shown,
                    // A refused load takes away the directory it made.
                    "created": false,
                }),
            )?;
        }
        return Err(super::no_events(found.bad, 0, &found.shown));
    }
    if let Some(r) = rebuild {
        if found.overflowed {
            bail!(
                "the rebuild's events need more than --memory-mb {} (a rebuild is installed in \
                 one piece): give more, or replace a shorter range; nothing was changed",
                a.memory_mb
            );
        }
        agg.create(engine)?;
        let changed = engine
            .rebuild_bulk(&r.ns, r.from, r.to, std::mem::take(&mut agg.bulk))
            .map_err(|e| match e.code() {
                tally_core::ErrorCode::TooManyPoints => anyhow::anyhow!(
                    "{}, or give the load more memory (--memory-mb; a rebuild holds the \
                     range in up to two thirds of it)",
                    e.detail()
                ),
                _ => anyhow::anyhow!(e.detail()),
            })
            .context("installing the rebuild")?;
        engine.sync().map_err(|e| anyhow::anyhow!(e.detail()))?;
        engine.close();
        if a.json {
            return write_json(&json!({
                "replaced": {"ns": r.ns.as_str(), "from": r.from, "to": r.to},
                "loaded": found.events,
                "seconds": start.elapsed().as_secs_f64(),
                "held_before": changed,
            }));
        }
        eprintln!(
            "replaced [{}, {}) of namespace {} with {} events in {:.1} s ({changed} counters held before)",
            r.from,
            r.to,
            r.ns,
            found.events,
            start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    if found.overflowed {
        let mut agg = Aggregate::new(budget, engine);
        pass(
            a,
            engine,
            sources,
            checker,
            rebuild,
            Pass::Second,
            budget,
            names,
            &mut agg,
            total,
        )?;
        // (Each install wrote a segment per (tier, period); a server merges them in its
        // minutely compaction, `tally compact --data` at once.)
        agg.install(engine)?;
    } else {
        agg.install(engine)?;
    }
    engine.sync().map_err(|e| anyhow::anyhow!(e.detail()))?;
    engine.close();
    let secs = start.elapsed().as_secs_f64();
    let loaded = found.events + found.already;
    if a.json {
        return super::json_summary(
            loaded as u64,
            sources.len(),
            secs,
            json!({
                "passes": if found.overflowed { 2 } else { 1 },
                "loaded_before": found.already,
                "skipped": found.bad,
                "skipped_lines": found.shown,
                "created": created.is_some(),
            }),
        );
    }
    eprintln!(
        "loaded {loaded} events from {} file(s) in {secs:.1} s ({:.0} events/s){}{}{}{}",
        sources.len(),
        loaded as f64 / secs.max(1e-9),
        if found.overflowed {
            "; in two passes (the aggregate outgrew --memory-mb: more memory makes it one)"
        } else {
            ""
        },
        if found.already > 0 {
            format!(
                "; {} of them were loaded before (the same file's batches count once in 24 \
                 hours; --again counts them again)",
                found.already
            )
        } else {
            String::new()
        },
        super::skipped(found.bad, 0),
        match created {
            Some(dir) => format!("; created a new data directory at {}", dir.display()),
            None => String::new(),
        }
    );
    for s in found.shown {
        eprintln!("  skipped {s}");
    }
    Ok(())
}

/// One pass over every source: the reading thread checks, this one aggregates.
#[allow(clippy::too_many_arguments)]
fn pass(
    a: &LoadArgs,
    engine: &Engine,
    sources: &[Source],
    checker: &Checker,
    rebuild: Option<&Rebuild>,
    which: Pass,
    budget: usize,
    names: usize,
    agg: &mut Aggregate,
    total: u64,
) -> anyhow::Result<Found> {
    let bar = progress(
        a.quiet,
        total,
        if which == Pass::First {
            "loading"
        } else {
            "loading, 2nd pass"
        },
    );
    let check_only = AtomicBool::new(false);
    let forget = AtomicBool::new(false);
    let (tx, rx) = mpsc::sync_channel::<Chunk>(2);
    let now = checker.now;
    let mut overflowed = false;
    let found = std::thread::scope(|scope| -> anyhow::Result<Found> {
        let (bar, check_only, forget) = (&bar, &check_only, &forget);
        let reader = scope.spawn(move || {
            // (`tx` moves here: the loop below ends when this thread drops it.)
            let mut scanner = Scanner::new(checker, rebuild, engine, names);
            read(a, sources, &mut scanner, bar, &tx, check_only, forget)
        });
        for mut chunk in rx {
            if overflowed {
                continue;
            }
            if chunk.reset && which == Pass::Second {
                // Numbers start again: what the aggregate holds goes first, then its names
                // (namespaces, never forgotten, keep theirs).
                agg.install(engine)?;
                *agg = Aggregate {
                    tiers: std::mem::take(&mut agg.tiers),
                    nss: std::mem::take(&mut agg.nss),
                    used: std::mem::take(&mut agg.used),
                    schemas: std::mem::take(&mut agg.schemas),
                    segments: agg.segments,
                    ..Aggregate::new(budget, engine)
                };
            }
            agg.names(&mut chunk, now);
            let (more, parts) = agg.most(&chunk);
            if !agg.bulk.has_room(more, parts) {
                match which {
                    Pass::First => {
                        // Too much to hold: this pass only checks from here on.
                        overflowed = true;
                        check_only.store(true, Ordering::Relaxed);
                        *agg = Aggregate::new(0, engine);
                        continue;
                    }
                    Pass::Second => {
                        // (A chunk larger than the whole table still goes in: the table
                        // grows by that chunk at most.)
                        agg.install(engine)?;
                        if agg.bulk.name_bytes() > budget / 4 {
                            forget.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
            agg.add(&chunk);
            if let Some(key) = chunk.answer.take()
                && chunk.events > 0
            {
                agg.answers.push(IdemRecord {
                    key: key.clone(),
                    fingerprint: key,
                    expires: now + 86_400,
                    status: 200,
                    body: json!({"accepted": chunk.events}).to_string(),
                });
            }
        }
        let mut found = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reading thread failed"))??;
        found.overflowed = overflowed;
        Ok(found)
    })?;
    bar.finish_and_clear();
    Ok(found)
}

/// The reading thread: every source's records checked, in chunks of `--batch`.
fn read(
    a: &LoadArgs,
    sources: &[Source],
    scanner: &mut Scanner<'_>,
    bar: &indicatif::ProgressBar,
    tx: &mpsc::SyncSender<Chunk>,
    check_only: &AtomicBool,
    forget: &AtomicBool,
) -> anyhow::Result<Found> {
    let mut found = Found::default();
    for s in sources {
        let input = Input::open(&s.path, &s.name, a.format, bar)?;
        let mut chunks = Chunker {
            a,
            s,
            tx,
            check_only,
            forget,
            found: &mut found,
            chunk: Chunk::default(),
            lines: 0,
            bytes: 0,
            skip: false,
            counted: None,
            first: 0,
            good: 0,
        };
        match input.format {
            Format::Csv => {
                let mut records = input.csv()?;
                scanner.header(&records.dims);
                let mut rec = csv::ByteRecord::new();
                while let Some(next) = records.next(&mut rec)? {
                    let line = match next {
                        Ok(line) | Err((line, _)) => line,
                    };
                    // (As `Input::events` weighs a line: the same batches online.)
                    let bytes = match &next {
                        Ok(_) => rec.as_slice().len(),
                        Err(_) => 0,
                    };
                    chunks.line(scanner, line, bytes, |scanner, chunk| match next {
                        Err((_, why)) => Ok(Err(why)),
                        Ok(_) if scanner.fast(&rec, chunk)? => Ok(Ok(())),
                        Ok(_) => scanner.slow(&rec, chunk),
                    })?;
                }
            }
            Format::Ndjson => {
                scanner.header(&[]);
                input.events(&mut |line, bytes, event| {
                    chunks.line(scanner, line, bytes, |scanner, chunk| match event {
                        Err(why) => Ok(Err(why)),
                        Ok(raw) => scanner.slow_event(raw, chunk),
                    })
                })?;
            }
        }
        chunks.send(scanner)?;
    }
    Ok(found)
}

/// Cuts one source's lines into chunks of `--batch`, each with its idempotency key.
struct Chunker<'r> {
    a: &'r LoadArgs,
    s: &'r Source,
    tx: &'r mpsc::SyncSender<Chunk>,
    check_only: &'r AtomicBool,
    forget: &'r AtomicBool,
    found: &'r mut Found,
    chunk: Chunk,
    /// Lines in `chunk`, good or bad.
    lines: usize,
    /// Their bytes, as [`crate::load::MAX_BATCH_BYTES`] counts them.
    bytes: usize,
    /// An earlier run installed this chunk: its lines are checked, not sent.
    skip: bool,
    /// How many of the chunk's lines that run counted (its answer's `accepted`), when known,
    /// and the chunk's first line.
    counted: Option<u64>,
    first: u64,
    /// How many of the chunk's lines this run finds good.
    good: u64,
}

impl Chunker<'_> {
    /// Checks line `line` (of `bytes`) with `check` (which adds its row to the chunk, or
    /// says why it is bad), in the chunk it belongs to: a chunk ends at `--batch` lines, or
    /// once its lines reach [`crate::load::MAX_BATCH_BYTES`].
    fn line(
        &mut self,
        scanner: &mut Scanner<'_>,
        line: u64,
        bytes: usize,
        check: impl FnOnce(&mut Scanner<'_>, &mut Chunk) -> anyhow::Result<Result<(), String>>,
    ) -> anyhow::Result<()> {
        if self.lines == self.a.batch as usize || self.bytes >= crate::load::MAX_BATCH_BYTES {
            self.send(scanner)?;
        }
        self.bytes += bytes;
        if self.lines == 0 {
            if self.forget.swap(false, Ordering::Relaxed) {
                scanner.forget();
            }
            scanner.start_chunk(&mut self.chunk);
            // A rebuild neither consults nor records answers: it replaces the range with
            // every line of its files, so a batch an earlier load installed is not "loaded
            // before" here (skipping it would leave the range without it). Otherwise a batch
            // is skipped when an earlier run installed it, or when it is the second copy of a
            // file given twice in this run (same keys: counted once, as a server replays).
            self.first = line;
            self.good = 0;
            self.counted = None;
            if scanner.rebuild.is_none() {
                let key = format!("tally-load-{:016x}-{}-{line}", self.s.digest, self.a.batch);
                let before = scanner
                    .engine
                    .idempotency(&key)
                    .map_err(|e| anyhow::anyhow!(e.detail()))?;
                // (An online load's answer, `{"accepted": N}` from the server, says it too.)
                self.counted = before.as_ref().and_then(|r| {
                    serde_json::from_str::<serde_json::Value>(&r.body)
                        .ok()?
                        .get("accepted")?
                        .as_u64()
                });
                self.skip = self.s.repeat || before.is_some();
                self.chunk.answer = (!self.skip).then_some(key);
            }
        }
        self.lines += 1;
        let (rows, keys) = (self.chunk.rows.len(), self.chunk.keys.len());
        match check(scanner, &mut self.chunk)? {
            Ok(()) if self.skip => {
                self.found.already += 1;
                self.good += 1;
            }
            Ok(()) => {
                self.found.events += 1;
                self.chunk.events += 1;
            }
            Err(why) => {
                let name = &self.s.name;
                if !self.a.skip_bad {
                    bail!("{name}:{line}: {why}; nothing was loaded (--skip-bad skips bad lines)");
                }
                self.found.bad += 1;
                if self.found.shown.len() < 5 {
                    self.found.shown.push(format!("{name}:{line}: {why}"));
                }
            }
        }
        if self.skip || self.check_only.load(Ordering::Relaxed) {
            // Checked, not sent: the rows go (names stay, later rows may use them).
            self.chunk.rows.truncate(rows);
            self.chunk.keys.truncate(keys);
            if self.chunk.rows.is_empty() {
                self.chunk.subs.clear();
            }
        }
        Ok(())
    }

    /// Hands the chunk over (if it holds any line). A chunk an earlier run counted must
    /// count the same lines now: else a line's verdict changed (a line `--skip-bad` skipped
    /// then is good now, or the other way), and skipping the chunk as "loaded before" would
    /// leave such a line uncounted, or the summary wrong, without a word.
    fn send(&mut self, scanner: &mut Scanner<'_>) -> anyhow::Result<()> {
        if self.lines == 0 {
            return Ok(());
        }
        if let Some(counted) = self.counted.filter(|&n| self.skip && n != self.good) {
            bail!(
                "{}:{}: the batch of lines from here was loaded within 24 hours, counting {counted} \
                 of them, and this run finds {} good: a line's verdict changed since (a \
                 timestamp then in the future, a limit or a schema), or --skip-bad was given \
                 only one of the times. What that load counted stays counted; nothing was \
                 loaded now (--again counts the file again)",
                self.s.name,
                self.first,
                self.good
            );
        }
        scanner.end_chunk(&mut self.chunk);
        self.tx
            .send(std::mem::take(&mut self.chunk))
            .map_err(|_| anyhow::anyhow!("the load stopped"))?;
        self.lines = 0;
        self.bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_core::ingest::{Defaults, Limits};
    use tally_core::model::SchemaDoc;
    use tally_core::reference::MemStore;
    use tally_core::store::SystemClock;

    use super::*;

    const NOW: i64 = 1_795_000_000;

    fn checker(auto_create: bool) -> Checker {
        let c = Checker {
            schemas: MemStore::new(Arc::new(SystemClock)),
            limits: Limits::default(),
            defaults: Defaults {
                auto_create,
                ..Defaults::default()
            },
            now: NOW,
        };
        // `allowed`: an allow-list with a compound; `clicks`: any dimension.
        let doc = SchemaDoc {
            tiers: vec!["1m:2d".into(), "1h:forever".into()],
            breakdown_tiers: Some(vec!["1h".into()]),
            dimensions: Some(vec!["country".into(), "country+device".into()]),
        };
        let allowed = Schema::from_doc(&doc).unwrap();
        c.schemas
            .put_schema(&Namespace::new("allowed").unwrap(), &allowed)
            .unwrap();
        c.schemas
            .put_schema(&Namespace::new("clicks").unwrap(), &Schema::default())
            .unwrap();
        c
    }

    /// (ns, key, ts, n, sorted subtotals) of a row, by name.
    type Named = (String, String, i64, i64, Vec<(String, String)>);

    /// The names a scanner gave, by number (gathered from its chunks).
    #[derive(Default)]
    struct Names {
        subs: Vec<(String, String)>,
    }

    impl Names {
        fn learn(&mut self, chunk: &Chunk) {
            self.subs.extend(chunk.new_subs.iter().cloned());
        }

        fn named(&self, scanner: &Scanner<'_>, chunk: &Chunk) -> Named {
            let row = &chunk.rows[0];
            let mut s: Vec<(String, String)> = chunk.subs
                [row.from as usize..(row.from + row.len) as usize]
                .iter()
                .map(|i| self.subs[*i as usize].clone())
                .collect();
            s.sort();
            (
                scanner.nss[row.ns as usize].0.to_string(),
                chunk.keys[row.key as usize..(row.key + row.key_len) as usize].to_owned(),
                row.ts,
                row.n,
                s,
            )
        }
    }

    /// Combinations of up to four numbers are packed, longer ones boxed; either way each is
    /// found as it was put, and no other is.
    #[test]
    fn combinations_are_found_packed_or_boxed() {
        let mut c = Combos::default();
        let width: Vec<Vec<u32>> = (1..=6u32)
            .map(|w| (0..w).map(|i| i * 7 + w).collect())
            .collect();
        for (i, combo) in width.iter().enumerate() {
            c.insert(combo, Some((i as u32, combo.len() as u32)));
        }
        c.insert(&[u32::MAX, u32::MAX, u32::MAX, u32::MAX], None);
        assert_eq!((c.packed.len(), c.boxed.len()), (5, 2));
        for (i, combo) in width.iter().enumerate() {
            assert_eq!(c.get(combo), Some(Some((i as u32, combo.len() as u32))));
            let mut other = combo.clone();
            other[0] += 1;
            assert_eq!(c.get(&other), None, "{other:?}");
        }
        assert_eq!(c.get(&[u32::MAX; 4]), Some(None));
        assert_eq!(c.get(&[u32::MAX, u32::MAX, u32::MAX, u32::MAX - 1]), None);
        c.clear();
        assert_eq!((c.len(), c.get(&width[0])), (0, None));
    }

    /// Every line either way: the quick check takes only lines the full check takes, and
    /// counts them the same.
    #[test]
    fn the_fast_check_agrees_with_the_api_rules() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(tally_engine::Config::new(dir.path())).unwrap();
        let long = "k".repeat(300);
        let future = (NOW + 3601).to_string();
        let near = (NOW + 3600).to_string();
        let headers: Vec<Vec<&str>> = vec![
            vec!["country", "device"],
            vec!["country", "Device"],
            vec!["country", "country"],
        ];
        let fields: Vec<Vec<&str>> = vec![
            vec!["clicks", "k1", "1794900000", "2", "US", "mobile"],
            vec!["clicks", "k1", "1794900000", "", "", ""],
            vec!["clicks", "k2", "", "", "US", ""],
            vec!["clicks", "k1", "2026-11-20T12:00:00Z", "1", "US", ""],
            vec!["clicks", "k1", "2026-11-20 12:00:00", "1", "US", ""],
            vec!["clicks", "k1", "1794900000", "+5", "", "x"],
            vec!["clicks", "k1", "1794900000", "-5", "", "x"],
            vec!["clicks", "k1", "1794900000", "9007199254740992", "", ""],
            vec!["clicks", "k1", "1794900000", "1.5", "", ""],
            vec!["clicks", "k1", "-1", "1", "", ""],
            vec!["clicks", "k1", &future, "1", "", ""],
            vec!["clicks", "k1", &near, "1", "", ""],
            vec!["clicks", "", "1794900000", "1", "", ""],
            vec!["clicks", &long, "1794900000", "1", "", ""],
            vec!["clicks", "a\u{1}b", "1794900000", "1", "", ""],
            vec!["clicks", "k1", "1794900000", "1", "a\u{7}", ""],
            vec!["Clicks", "k1", "1794900000", "1", "", ""],
            vec!["fresh", "k1", "1794900000", "1", "US", "tv"],
            vec!["allowed", "k1", "1794900000", "1", "US", "tv"],
            vec!["allowed", "k1", "1794900000", "1", "US", ""],
            vec!["allowed", "k1", "1794900000", "1", "", "tv"],
            vec!["allowed", "k9", "1794900000", "3", "US", "tv"],
            vec!["clicks", "k1", "1794900000", "1", "US"],
            vec!["clicks", "k1", "1794900000", "1", "US", "mobile", "x"],
        ];
        for auto_create in [true, false] {
            for header in &headers {
                let c = checker(auto_create);
                let mut fast = Scanner::new(&c, None, &engine, usize::MAX);
                let mut slow = Scanner::new(&c, None, &engine, usize::MAX);
                let (mut fast_names, mut slow_names) = (Names::default(), Names::default());
                let dims: Vec<String> = header.iter().map(|d| (*d).to_owned()).collect();
                fast.header(&dims);
                slow.header(&dims);
                // Twice: the second time every name is known already.
                for round in 0..2 {
                    for f in &fields {
                        let rec = csv::ByteRecord::from(f.clone());
                        let mut fc = Chunk::default();
                        let mut sc = Chunk::default();
                        let quick = fast.fast(&rec, &mut fc).unwrap();
                        let full = slow.slow(&rec, &mut sc).unwrap();
                        fast_names.learn(&fc);
                        slow_names.learn(&sc);
                        let what = format!("{header:?} {f:?} round {round} auto {auto_create}");
                        if quick {
                            assert!(full.is_ok(), "{what}: taken quickly, refused: {full:?}");
                            let a = fast_names.named(&fast, &fc);
                            let b = slow_names.named(&slow, &sc);
                            assert_eq!(a, b, "{what}");
                        }
                        if full.is_ok() && round == 0 && !quick {
                            // Taken by the full check only: fine (quoted, RFC 3339 …), but the
                            // common shapes must be quick.
                            assert!(
                                !(f[0] == "clicks" && f[1] == "k1" && f[2] == "1794900000"),
                                "{what}: a plain line took the slow way"
                            );
                        }
                    }
                }
            }
        }
    }
}

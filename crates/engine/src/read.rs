//! Reads: one key's buckets, a namespace's sums per key (top), a page of its keys. Each
//! sums memory (live and frozen counters) and the archive. A reader holds the archive's
//! lock shared while it reads memory, so a flush's frozen counters are seen either in memory
//! or in the archive, never both; the archive's segments are then read without any lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tally_core::model::Key;
use tally_core::store::{
    Deadline, KeyData, KeyList, KeyRead, Scan, StoreError, SubtotalBuckets, TopKeys, Want,
};

use crate::archive::{SubSums, SumRead, Wants, index_range};
use crate::catalog::{Catalog, KeyId, NsId, SeriesId, StrId, TOTAL, TierPlan, is_total, total_of};
use crate::memtable::{Lane, Shard, split_key};
use crate::names::PairSums;
use crate::segment::{Cover, Segment, SegmentError};
use crate::state::Core;
use crate::top::{ByName, RankSums, TopError, top_across};

impl Core {
    /// One key's buckets: memory (live and frozen counters) plus the archive, summed.
    pub(crate) fn read(&self, r: &KeyRead<'_>, now: i64) -> Result<KeyData, StoreError> {
        let cat = self.read_cat();
        let Some(ns) = cat.ns_id(r.ns.as_str()) else {
            return Ok(KeyData::default());
        };
        let Some(tier) = cat.ns[ns as usize].tier(r.resolution) else {
            return Ok(KeyData::default());
        };
        let wants_subtotals = tier.breakdown && !matches!(r.want, Want::Totals);
        if wants_subtotals && r.sum_subtotals {
            return self.read_summed(r, now, cat, (ns, tier));
        }
        let want: Box<Wants<'_>> = match (tier.breakdown, r.want) {
            (false, _) | (_, Want::Totals) => Box::new(|_, _| false),
            (true, Want::Value { dim, value }) => Box::new(move |d, v| d == dim && v == value),
            (true, Want::Dim { dim }) => Box::new(move |d, _| d == dim),
            (true, Want::All) => Box::new(|_, _| true),
        };
        let window = Window::new(&tier, r.from, r.to, now);
        let res = r.resolution.secs() as u32;
        let cutoff = cat.ns[ns as usize].cutoff(res);
        let mut totals = BTreeMap::new();
        let mut subs = SubSums::new();
        let archive = {
            let archive = self.archive();
            let mine = (ns, r.key.as_str());
            self.key_in_memory(
                &cat,
                mine,
                &window,
                &mut totals,
                if tier.breakdown { r.want } else { Want::Totals },
                &mut |shard, series| {
                    for s in series {
                        let m = subs
                            .entry((s.dim.to_owned(), s.value.to_owned()))
                            .or_default();
                        window.add_into(shard, (Lane::Sub, s.sid), m);
                    }
                },
            );
            Arc::clone(&archive)
        };
        drop(cat);
        archive
            .add_key(
                res,
                (r.from, r.to),
                (r.ns.as_str(), r.key.as_str()),
                cutoff,
                (wants_subtotals, &*want),
                &mut totals,
                &mut subs,
            )
            .map_err(|e| self.archive_error(e))?;
        let buckets = |m: BTreeMap<u32, i64>| -> Vec<(i64, i64)> {
            m.into_iter()
                .filter(|&(i, n)| n != 0 && window.keeps(i))
                .map(|(i, n)| (i64::from(i) * window.res, n))
                .collect()
        };
        Ok(KeyData {
            totals: buckets(totals),
            subtotals: subs
                .into_iter()
                .map(|((dim, value), m)| SubtotalBuckets {
                    dim,
                    value,
                    buckets: buckets(m),
                })
                .filter(|s| !s.buckets.is_empty())
                .collect(),
            rest: Vec::new(),
        })
    }

    /// One key's totals bucket by bucket and each wanted subtotal series as one sum (a
    /// bucket at `from`): what a breakdown or a dashboard needs, without a map entry per
    /// subtotal bucket. The subtotals of other dimensions are not decoded from the archive.
    fn read_summed(
        &self,
        r: &KeyRead<'_>,
        now: i64,
        cat: std::sync::RwLockReadGuard<'_, Catalog>,
        (ns, tier): (u32, TierPlan),
    ) -> Result<KeyData, StoreError> {
        let (one_dim, one_value) = match r.want {
            Want::Totals => (Some(""), None),
            Want::Value { dim, value } => (Some(dim), Some(value)),
            Want::Dim { dim } => (Some(dim), None),
            Want::All => (None, None),
        };
        let dim_ok = |d: &str| one_dim.is_none_or(|w| w == d);
        let window = Window::new(&tier, r.from, r.to, now);
        let res = r.resolution.secs() as u32;
        let cutoff = cat.ns[ns as usize].cutoff(res);
        let mut totals = BTreeMap::new();
        // Sums by (dimension, value) named by ids of `names`: the archive adds by id, so a
        // value met in many segments is hashed as a name once (when its segment is mapped).
        let names = self.names();
        let mut sums = PairSums::default();
        let mut in_memory: Vec<(StrId, StrId, i64)> = Vec::new();
        let (mut ids, missing, strings_freed);
        let archive = {
            let archive = self.archive();
            let mine = (ns, r.key.as_str());
            self.key_in_memory(
                &cat,
                mine,
                &window,
                &mut totals,
                r.want,
                &mut |shard, series| {
                    let sids: Vec<SeriesId> = series.iter().map(|s| s.sid).collect();
                    let mut sums = vec![0i64; sids.len()];
                    window.sum_many(shard, &sids, &mut sums);
                    for (s, n) in series.iter().zip(sums) {
                        if n != 0 {
                            in_memory.push((s.d, s.v, n));
                        }
                    }
                },
            );
            // Memory's names as ids of `names`: those earlier reads numbered now, the others
            // (their text copied) once the locks are let go.
            let strs: Vec<StrId> = in_memory.iter().flat_map(|&(d, v, _)| [d, v]).collect();
            strings_freed = cat.strings_freed;
            ids = self.catalog_names_known(&names, strings_freed, &strs);
            missing = ids
                .iter()
                .zip(&strs)
                .filter(|(id, _)| id.is_none())
                .map(|(_, &s)| (s, cat.str_list.get(s as usize).cloned().unwrap_or_default()))
                .collect::<Vec<(StrId, Arc<str>)>>();
            Arc::clone(&archive)
        };
        drop(cat);
        if !missing.is_empty() {
            let mut numbered = self
                .catalog_names_number(&names, strings_freed, &missing)
                .into_iter();
            for id in ids.iter_mut().filter(|id| id.is_none()) {
                *id = numbered.next();
            }
        }
        for (pair, &(_, _, n)) in ids.chunks_exact(2).zip(&in_memory) {
            if let [Some(d), Some(v)] = *pair {
                sums.add(d, v, n);
            }
        }
        let (lo, hi) = index_range(res, r.from, r.to);
        let inside = |i: u32| lo <= i && i < hi && window.keeps(i);
        let read = SumRead {
            resolution: res,
            ns: r.ns.as_str(),
            key: r.key.as_str(),
            cutoff,
            inside: &inside,
            dim_ok: &dim_ok,
            value: one_value,
            names: &names,
        };
        archive
            .sum_key(&read, (r.from, r.to), &mut totals, &mut |d, v, n| {
                sums.add(d, v, n)
            })
            .map_err(|e| self.archive_error(e))?;
        // In no particular order: the callers (breakdowns, dashboards) order by count. Only
        // the values they answer are copied out as text (`KeyRead::keep`): a key's values
        // may be hundreds of megabytes.
        let (subtotals, rest) = names.with(|name| {
            let mut found: Vec<(u32, u32, i64)> = sums.non_zero().collect();
            let mut rest = Vec::new();
            if let Some(keep) = r.keep {
                found.sort_unstable_by_key(|&(d, _, _)| d);
                let mut kept = Vec::with_capacity(found.len().min(keep.saturating_mul(16)));
                for one in found.chunk_by_mut(|a, b| a.0 == b.0) {
                    if one.len() > keep {
                        let order = |a: &(u32, u32, i64), b: &(u32, u32, i64)| {
                            b.2.cmp(&a.2)
                                .then_with(|| name(a.1).as_bytes().cmp(name(b.1).as_bytes()))
                        };
                        if keep > 0 {
                            one.select_nth_unstable_by(keep - 1, order);
                        }
                        let left = one[keep..].iter().fold(0i64, |t, e| t.wrapping_add(e.2));
                        rest.push((name(one[0].0).to_owned(), left));
                    }
                    kept.extend_from_slice(&one[..one.len().min(keep)]);
                }
                found = kept;
            }
            let subtotals: Vec<SubtotalBuckets> = found
                .into_iter()
                .map(|(d, v, n)| SubtotalBuckets {
                    dim: name(d).to_owned(),
                    value: name(v).to_owned(),
                    buckets: vec![(r.from, n)],
                })
                .collect();
            (subtotals, rest)
        });
        Ok(KeyData {
            totals: totals
                .into_iter()
                .filter(|&(i, n)| n != 0 && window.keeps(i))
                .map(|(i, n)| (i64::from(i) * window.res, n))
                .collect(),
            subtotals,
            rest,
        })
    }

    /// What a scan of a namespace's keys reads: memory's sums per key, taken under the
    /// catalog's lock with the archive held shared (see the module doc), then the archive.
    /// `None` if the namespace or tier has nothing to scan.
    fn prepare_scan(&self, scan: &Scan<'_>, now: i64) -> Result<Option<Prepared>, StoreError> {
        let cat = self.read_cat();
        let Some(Target {
            ns,
            tier,
            window,
            res,
            cutoff,
        }) = Target::of(&cat, scan, now)
        else {
            return Ok(None);
        };
        if scan.value.is_some() && !tier.breakdown {
            return Ok(None);
        }
        let value = scan
            .value
            .and_then(|(d, v)| Some((cat.str_id(d)?, cat.str_id(v)?)));
        // Key → its sum so far; looked up by `&str`, so a key is copied once.
        let mut sums: KeySums = HashMap::default();
        let mut tick = ticker(scan.deadline);
        let archive = self.archive();
        if scan.value.is_none() {
            let found = self.memory_totals(&cat, ns, &window, scan.deadline)?;
            for (key, n) in found.into_iter().flatten() {
                if let Some(e) = cat.keys.get(key as usize) {
                    add(&mut sums, e.name.as_str(), n);
                }
            }
        } else if let Some((d, v)) = value {
            // The value's series of every key, grouped by shard, then each shard's summed in
            // one go (`sum_many`: probes, or one walk of its counters): summing key by key
            // walked a shard's whole map once per key, all under the catalog's lock, which
            // every write that names a new series waits for.
            let mut by_shard: Vec<(Vec<SeriesId>, Vec<&str>)> =
                vec![(Vec::new(), Vec::new()); self.mem.shards()];
            for key in cat.ns[ns as usize].keys.iter() {
                tick()?;
                let name = cat.key_name(key);
                let Some(sid) = cat.sub_id(key, d, v) else {
                    continue;
                };
                if let Some((sids, names)) = by_shard.get_mut(self.mem.shard_of(key)) {
                    sids.push(sid);
                    names.push(name);
                }
            }
            let mut out = Vec::new();
            for (i, (sids, names)) in by_shard.iter().enumerate() {
                if sids.is_empty() {
                    continue;
                }
                tick()?;
                out.clear();
                out.resize(sids.len(), 0i64);
                window.sum_many(&self.mem.lock(i), sids, &mut out);
                for (name, &n) in names.iter().zip(&out) {
                    if n != 0 {
                        add(&mut sums, name, n);
                    }
                }
            }
        }
        let archive = Arc::clone(&archive);
        drop(cat);
        Ok(Some(Prepared {
            sums,
            archive,
            window,
            res,
            cutoff,
        }))
    }

    /// Every key of a namespace with its sum over the scan's range (memory plus archive);
    /// `visit` gets the non-zero ones.
    pub(crate) fn scan(
        &self,
        scan: &Scan<'_>,
        now: i64,
        visit: &mut dyn FnMut(&Key, i64),
    ) -> Result<(), StoreError> {
        match self.prepare_scan(scan, now)? {
            Some(p) => self.scan_prepared(p, scan, visit),
            None => Ok(()),
        }
    }

    /// The archive half of [`Core::scan`], memory's sums already taken.
    fn scan_prepared(
        &self,
        Prepared {
            mut sums,
            archive,
            window,
            res,
            cutoff,
        }: Prepared,
        scan: &Scan<'_>,
        visit: &mut dyn FnMut(&Key, i64),
    ) -> Result<(), StoreError> {
        let mut tick = ticker(scan.deadline);
        let stopped = |e: StoreError| SegmentError::Stopped { why: e.detail() };
        let (lo, hi) = index_range(res, scan.from, scan.to);
        let in_range = |i: u32| lo <= i && i < hi && window.keeps(i);
        let segments: Vec<_> = archive
            .overlapping(res, scan.from, scan.to, cutoff)
            .collect();
        if let ([(seg, _)], true, None) = (&segments[..], sums.is_empty(), scan.value) {
            // One source alone (a closed day or month, nothing of it in memory): its keys
            // come in order, each once, and go straight to `visit` without a map.
            let mut bad = None;
            seg.scan_total_sums(scan.ns.as_str(), &in_range, &mut |key, n| {
                tick().map_err(stopped)?;
                if n == 0 {
                    return Ok(());
                }
                match key_of(key.to_owned()) {
                    Ok(k) => visit(&k, n),
                    Err(e) => bad = Some(e),
                }
                Ok(())
            })
            .map_err(|e| self.archive_error(e))?;
            return bad.map_or(Ok(()), Err);
        }
        for (seg, (_, show_subs)) in segments {
            if scan.value.is_some() && !show_subs {
                continue;
            }
            if scan.value.is_none() {
                self.add_total_sums(seg, scan, &in_range, &mut sums)?;
                continue;
            }
            seg.scan(scan.ns.as_str(), &mut |key, rec| {
                tick().map_err(stopped)?;
                let n: i64 = match scan.value {
                    None => 0,
                    Some((d, v)) => rec
                        .dims
                        .iter()
                        .filter(|r| r.dim == d)
                        .flat_map(|r| r.values.iter().filter(|(value, _)| value == v))
                        .flat_map(|(_, b)| b.iter().filter(|(i, _)| in_range(*i)))
                        // Counts wrap past 64 bits, their sums too.
                        .fold(0i64, |t, (_, n)| t.wrapping_add(*n)),
                };
                if n != 0 {
                    add(&mut sums, key, n);
                }
                Ok(())
            })
            .map_err(|e| self.archive_error(e))?;
        }
        for (name, n) in sums {
            if n != 0 {
                visit(&key_of(name)?, n);
            }
        }
        Ok(())
    }

    /// A top of keys by totals, without a `Key` made for every key where it can: memory
    /// alone by key id ([`Core::top_of_memory`]); segments that sum the range by rank (span
    /// and hour frames), with memory, by thresholds ([`Core::top_by_thresholds`]); one
    /// such segment alone by rank in one pass, any other source (a delta segment) summed
    /// by name and folded in, and only the winners' names read. Any other top (a
    /// breakdown's, or sums that go negative) is a scan, selected.
    pub(crate) fn top(
        &self,
        scan: &Scan<'_>,
        limit: usize,
        now: i64,
    ) -> Result<TopKeys, StoreError> {
        if scan.value.is_none() {
            if let Some(top) = self.top_of_memory(scan, limit, now)? {
                return Ok(top);
            }
            if let Some(top) = self.top_by_thresholds(scan, limit, now)? {
                return Ok(top);
            }
        }
        let Some(prepared) = self.prepare_scan(scan, now)? else {
            return Ok(TopKeys::default());
        };
        let by_scan = |prepared: Prepared| {
            let mut keys = Vec::new();
            self.scan_prepared(prepared, scan, &mut |k, n| keys.push((k.clone(), n)))?;
            Ok(TopKeys::select(keys, limit))
        };
        if scan.value.is_some() {
            return by_scan(prepared);
        }
        let (lo, hi) = index_range(prepared.res, scan.from, scan.to);
        let window = &prepared.window;
        let archive = Arc::clone(&prepared.archive);
        let segments: Vec<_> = archive
            .overlapping(prepared.res, scan.from, scan.to, prepared.cutoff)
            .map(|(s, _)| s)
            .collect();
        let mut covered = covers(&segments, (lo, hi), window);
        let (primary, cover) = match covered.pop() {
            Some(c) if covered.is_empty() => c,
            // None, or several that [`Core::top_by_thresholds`] did not read because a sum
            // is negative (a decrement voids the thresholds' bound): by name.
            _ => return by_scan(prepared),
        };
        let Prepared {
            mut sums, window, ..
        } = prepared;
        let in_range = |i: u32| lo <= i && i < hi && window.keeps(i);
        let err = |e| self.archive_error(e);
        let ns = scan.ns.as_str();
        // The covered segment is read by rank; every other source by name.
        for (i, seg) in segments.iter().enumerate() {
            if i != primary {
                self.add_total_sums(seg, scan, &in_range, &mut sums)?;
            }
        }
        let seg = segments[primary];
        let ranks = seg.rank_range(ns).map_err(err)?;
        // Memory and the other segments, by name: as ranks where the primary has the key,
        // else kept apart.
        let mut extra: Vec<(u64, i64)> = Vec::new();
        let mut apart: Vec<(Key, i64)> = Vec::new();
        let mut tick = ticker(scan.deadline);
        for (name, n) in sums {
            tick()?;
            match seg.rank_of(ns, &name).map_err(err)? {
                Some(r) if ranks.contains(&r) => extra.push((r, n)),
                _ => apart.push((key_of(name)?, n)),
            }
        }
        extra.sort_unstable_by_key(|&(r, _)| r);
        let mut best = Leaders::new(limit);
        if let ([frame], []) = (&cover.add[..], &cover.sub[..]) {
            // One frame: its entries stream in rank order, merged with the extra ranks.
            scan.deadline.check()?;
            let mut extra = extra.into_iter().peekable();
            seg.frame_sums(*frame, ranks.clone(), &mut |r, mut n| {
                while let Some(&(e, m)) = extra.peek()
                    && e <= r
                {
                    extra.next();
                    if e == r {
                        n = n.wrapping_add(m);
                    } else {
                        best.offer(e, m);
                    }
                }
                best.offer(r, n);
            })
            .map_err(err)?;
            extra.for_each(|(e, m)| best.offer(e, m));
        } else {
            let mut by_rank = RankSums::read(seg, ns, &cover, scan.deadline)
                .map_err(err)?
                .by_rank;
            for (r, n) in extra {
                let at = &mut by_rank[(r - ranks.start) as usize];
                *at = at.wrapping_add(n);
            }
            best.offer_all(ranks.start, &by_rank);
        }
        let total = apart
            .iter()
            .fold(best.total, |t, (_, n)| t.wrapping_add(*n));
        let best = best.into_ranks();
        let names = seg
            .keys_at(&best.iter().map(|&(r, _)| r).collect::<Vec<_>>())
            .map_err(err)?;
        let mut keys = apart;
        for ((_, key), (_, n)) in names.into_iter().zip(best) {
            keys.push((key_of(key)?, n));
        }
        let mut top = TopKeys::select(keys, limit);
        top.total = total;
        Ok(top)
    }

    /// A top of keys by totals over segments that sum the range by rank (span and hour
    /// frames), with memory and any other segment: by thresholds (see [`crate::top`]), so
    /// that only the keys they pick are named and looked up in each source. Memory's sums
    /// stay by key id, looked up through the catalog only for the keys picked (the catalog
    /// is not held while segments are read). `None` (read another way) when no segment
    /// covers the range, when one does and memory holds nothing of it (its ranks are then
    /// read in one pass), when a sum is negative, or when a key was forgotten meanwhile.
    fn top_by_thresholds(
        &self,
        scan: &Scan<'_>,
        limit: usize,
        now: i64,
    ) -> Result<Option<TopKeys>, StoreError> {
        let cat = self.read_cat();
        let Some(Target {
            ns,
            window,
            res,
            cutoff,
            ..
        }) = Target::of(&cat, scan, now)
        else {
            return Ok(None);
        };
        let (lo, hi) = index_range(res, scan.from, scan.to);
        // Held while memory is read, as every read does (see the module doc).
        let held = self.archive();
        let archive = Arc::clone(&held);
        let segments: Vec<_> = archive
            .overlapping(res, scan.from, scan.to, cutoff)
            .map(|(s, _)| s)
            .collect();
        let covered = covers(&segments, (lo, hi), &window);
        if covered.is_empty() {
            return Ok(None);
        }
        let found = self
            .memory_totals(&cat, ns, &window, scan.deadline)?
            .unwrap_or_default();
        drop(held);
        if (covered.len() == 1 && found.is_empty()) || found.iter().any(|e| e.1 < 0) {
            return Ok(None);
        }
        let memory = MemorySums::new(self, &cat, ns, found);
        drop(cat);
        let err = |e| self.archive_error(e);
        let name = scan.ns.as_str();
        let mut lists = Vec::with_capacity(covered.len());
        for (i, cover) in &covered {
            let list = RankSums::read(segments[*i], name, cover, scan.deadline).map_err(err)?;
            if !list.non_negative() {
                return Ok(None);
            }
            lists.push(list);
        }
        let in_range = |i: u32| lo <= i && i < hi && window.keeps(i);
        let mut others = KeySums::default();
        for (i, seg) in segments.iter().enumerate() {
            if !covered.iter().any(|(c, _)| *c == i) {
                self.add_total_sums(seg, scan, &in_range, &mut others)?;
            }
        }
        if others.values().any(|&n| n < 0) {
            return Ok(None);
        }
        let (found, total) = top_across(name, &lists, &[&others, &memory], limit, scan.deadline)
            .map_err(|e| match e {
                TopError::Segment(e) => self.archive_error(e),
                TopError::Store(e) => e,
            })?;
        if memory.stale.get() {
            return Ok(None);
        }
        let keys = found
            .into_iter()
            .map(|(k, n)| Ok((key_of(k)?, n)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let mut top = TopKeys::select(keys, limit);
        top.total = total;
        Ok(Some(top))
    }

    /// A segment's keys of the scan's namespace summed by totals over `in_range`, into
    /// `sums`: only the totals streams are walked.
    fn add_total_sums(
        &self,
        seg: &crate::segment::Segment,
        scan: &Scan<'_>,
        in_range: &dyn Fn(u32) -> bool,
        sums: &mut KeySums,
    ) -> Result<(), StoreError> {
        let mut tick = ticker(scan.deadline);
        let stopped = |e: StoreError| SegmentError::Stopped { why: e.detail() };
        seg.scan_total_sums(scan.ns.as_str(), in_range, &mut |key, n| {
            tick().map_err(stopped)?;
            if n != 0 {
                add(sums, key, n);
            }
            Ok(())
        })
        .map_err(|e| self.archive_error(e))
    }

    /// One key's counters in memory: its totals added into `totals`, and the subtotal
    /// series `want` names handed to `sub` with their (locked) shard. The caller holds the
    /// archive's lock shared (see the module doc).
    fn key_in_memory<'c>(
        &self,
        cat: &'c Catalog,
        (ns, key): (u32, &str),
        window: &Window,
        totals: &mut BTreeMap<u32, i64>,
        want: Want<'_>,
        subs: &mut dyn FnMut(&Shard, &[Named<'c>]),
    ) {
        let Some(key) = cat.key_id(ns, key) else {
            return;
        };
        let entry = &cat.keys[key as usize];
        // The wanted names as catalog ids: a series is then picked without a string
        // compare (a busy key has thousands). A name the catalog lacks picks nothing.
        let pick = match want {
            Want::Totals => None,
            Want::Value { dim, value } => cat
                .str_id(dim)
                .zip(cat.str_id(value))
                .map(|(d, v)| (Some(d), Some(v))),
            Want::Dim { dim } => cat.str_id(dim).map(|d| (Some(d), None)),
            Want::All => Some((None, None)),
        };
        let wanted: Vec<Named<'_>> = match pick {
            None => Vec::new(),
            Some((dim, value)) => cat
                .subs_of(entry)
                .filter(|&(d, v, _)| dim.is_none_or(|w| w == d) && value.is_none_or(|w| w == v))
                .map(|(d, v, sid)| Named {
                    d,
                    v,
                    dim: cat.str(d),
                    value: cat.str(v),
                    sid,
                })
                .collect(),
        };
        let shard = self.mem.lock(self.mem.shard_of(key));
        window.add_into(&shard, (Lane::Total, total_of(key)), totals);
        if !wanted.is_empty() {
            subs(&shard, &wanted);
        }
    }

    /// The memory half of a top by totals: each key of the namespace with a non-zero sum of
    /// its total series over the window, as (key id, sum), in no particular order; `None`
    /// when memory holds nothing of the window. Walks every counter of the tier's totals
    /// maps once when that costs less than probing each key of the namespace for each
    /// bucket of the range (a top over today, with the open day in memory), else probes.
    /// What it allocates is bounded by the work it does, not by the catalog.
    fn memory_totals(
        &self,
        cat: &Catalog,
        ns: u32,
        window: &Window,
        deadline: &Deadline,
    ) -> Result<Option<Vec<(KeyId, i64)>>, StoreError> {
        let keys = &cat.ns[ns as usize].keys;
        let mut counters = 0usize;
        let mut span = 0u64;
        for s in 0..self.mem.shards() {
            let shard = self.mem.lock(s);
            let (min, max) = shard.extent(window.slot);
            span = span.max(u64::from(
                window.hi.min(max).saturating_sub(window.lo.max(min)),
            ));
            counters += shard.count(window.slot, Lane::Total);
        }
        if span == 0 {
            // No shard holds a counter of the window's buckets (extents bound them): memory
            // adds nothing, and probing each key would find nothing.
            return Ok(None);
        }
        if (counters as u64) >= (keys.len() as u64).saturating_mul(span) {
            let mut tick = ticker(deadline);
            let mut found = Vec::new();
            for key in keys.iter() {
                tick()?;
                let sid = total_of(key);
                let shard = self.mem.lock(self.mem.shard_of(key));
                match window.sum(&shard, (Lane::Total, sid)) {
                    0 => {}
                    n => found.push((key, n)),
                }
            }
            return Ok(Some(found));
        }
        // Sums by key id in an array when the catalog's keys are not many more than the
        // counters walked, else in a map.
        let dense = cat.keys.len() <= counters.saturating_mul(4);
        let mut by_key = vec![0i64; if dense { cat.keys.len() } else { 0 }];
        let mut sparse: HashMap<KeyId, i64, crate::seeded::State> = HashMap::default();
        // Retention keeps a suffix of the window: its first kept bucket. `[lo, hi)` as one
        // unsigned comparison (`hi >= lo`).
        let lo = window.first_kept();
        let width = window.hi.saturating_sub(lo);
        let mut seen = 0u32;
        for s in 0..self.mem.shards() {
            let shard = self.mem.lock(s);
            for (k, n) in shard.counters(window.slot, Lane::Total) {
                seen = seen.wrapping_add(1);
                if seen.is_multiple_of(1 << 14) {
                    deadline.check()?;
                }
                let (sid, idx) = split_key(k);
                // Frozen counters of subtotals come too: told apart by their id, without
                // reading the catalog's entries; a total's id names its key, and the key's
                // namespace comes from a small array.
                let key = sid & !TOTAL;
                if !is_total(sid) || cat.key_ns.get(key as usize) != Some(&ns) {
                    continue;
                }
                // Whether the bucket is in the window is not branched on: a window that
                // cuts the memtable's hours (the last 24 hours, half of them in memory)
                // takes about half the counters, in hash order, and a branch on it was
                // mispredicted half the time (the walk took twice as long).
                let inside = idx.wrapping_sub(lo) < width;
                let n = n & 0i64.wrapping_sub(i64::from(inside));
                match by_key.get_mut(key as usize) {
                    Some(at) => *at = at.wrapping_add(n),
                    None if inside => {
                        let at = sparse.entry(key).or_default();
                        *at = at.wrapping_add(n);
                    }
                    None => {}
                }
            }
        }
        let found = by_key
            .iter()
            .enumerate()
            .map(|(k, &n)| (k as KeyId, n))
            .chain(sparse)
            .filter(|e| e.1 != 0)
            .collect();
        Ok(Some(found))
    }

    /// A top of keys by totals that memory alone answers (no archive segment overlaps the
    /// range: "today", with the open day in memory): a selection over each key's sum by key
    /// id, and only the winners named — no map by name, no `Key` made for every key. `None`
    /// when the archive holds part of the range.
    fn top_of_memory(
        &self,
        scan: &Scan<'_>,
        limit: usize,
        now: i64,
    ) -> Result<Option<TopKeys>, StoreError> {
        let cat = self.read_cat();
        let Some(Target {
            ns,
            window,
            res,
            cutoff,
            ..
        }) = Target::of(&cat, scan, now)
        else {
            return Ok(None);
        };
        // Held while memory is read, as every read does (see the module doc).
        let archive = self.archive();
        if archive
            .overlapping(res, scan.from, scan.to, cutoff)
            .next()
            .is_some()
        {
            return Ok(None);
        }
        let Some(mut found) = self.memory_totals(&cat, ns, &window, scan.deadline)? else {
            return Ok(Some(TopKeys::default()));
        };
        let total = found.iter().fold(0i64, |t, e| t.wrapping_add(e.1));
        let name = |k: KeyId| cat.key_name(k);
        if limit == 0 {
            found.clear();
        } else if found.len() > limit {
            // The `limit`th largest sum is the floor: the keys above it win, and of those
            // equal to it the first by name fill the rest — selected by borrowed names, so
            // that only the winners are copied.
            found.select_nth_unstable_by(limit - 1, |a, b| b.1.cmp(&a.1));
            let floor = found[limit - 1].1;
            let (mut won, mut tied): (Vec<_>, Vec<_>) = found
                .into_iter()
                .filter(|e| e.1 >= floor)
                .partition(|e| e.1 > floor);
            let room = limit - won.len();
            if tied.len() > room {
                tied.select_nth_unstable_by(room, |a, b| name(a.0).cmp(name(b.0)));
                tied.truncate(room);
            }
            won.extend(tied);
            found = won;
        }
        let mut keys = Vec::with_capacity(found.len());
        for (k, n) in found {
            keys.push((key_of(name(k).to_owned())?, n));
        }
        let mut top = TopKeys::select(keys, limit);
        top.total = total;
        Ok(Some(top))
    }

    /// A page of a namespace's keys: those in memory and those in the archive, merged.
    pub(crate) fn keys(&self, list: &KeyList<'_>) -> Result<Vec<Key>, StoreError> {
        use std::ops::Bound;
        let mut page: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let prefix = list.prefix;
        let archive = {
            let cat = self.read_cat();
            if let Some(id) = cat.ns_id(list.ns.as_str()) {
                let start: Bound<&str> = match list.after {
                    Some(a) if a >= prefix => Bound::Excluded(a),
                    _ => Bound::Included(prefix),
                };
                let start = start.map(str::as_bytes);
                page.extend(
                    cat.ns[id as usize]
                        .keys
                        .range(start, |k| cat.key_bytes(k))
                        .map(|k| cat.key_name(k))
                        .take_while(|k| k.starts_with(prefix))
                        .take(list.limit)
                        .map(str::to_owned),
                );
            }
            Arc::clone(&self.archive())
        };
        for (_, seg) in archive.all() {
            let keys = seg
                .keys(list.ns.as_str(), prefix, list.after, list.limit)
                .map_err(|e| self.archive_error(e))?;
            page.extend(keys);
            while page.len() > list.limit {
                page.pop_last();
            }
        }
        page.into_iter()
            .take(list.limit)
            .map(|k| {
                Key::from_string(k).map_err(|e| StoreError::corrupt("a stored key").because(e))
            })
            .collect()
    }
}

/// The `limit` best (rank, sum) pairs of a top offered in ascending rank order, and the
/// sum of all: (sum desc, rank asc) is the top's order, as ranks follow key byte order
/// within a namespace. Holds at most twice `limit` pairs: once full, it keeps the best
/// `limit` and from then on turns away any sum not above the worst of them (a later rank
/// with an equal sum comes after it).
struct Leaders {
    limit: usize,
    best: Vec<(u64, i64)>,
    floor: Option<i64>,
    total: i64,
}

impl Leaders {
    fn new(limit: usize) -> Leaders {
        Leaders {
            limit,
            best: Vec::new(),
            floor: None,
            total: 0,
        }
    }

    fn order(a: &(u64, i64), b: &(u64, i64)) -> std::cmp::Ordering {
        b.1.cmp(&a.1).then(a.0.cmp(&b.0))
    }

    fn offer(&mut self, rank: u64, n: i64) {
        if n == 0 {
            return;
        }
        self.total = self.total.wrapping_add(n);
        if self.limit == 0 || self.floor.is_some_and(|f| n <= f) {
            return;
        }
        self.best.push((rank, n));
        if self.best.len() >= self.limit.saturating_mul(2).max(16) {
            self.keep_best();
            self.floor = self.best.last().map(|&(_, n)| n);
        }
    }

    /// Offers `sums[i]` as rank `first + i` for each `i`, in order, as [`Leaders::offer`]
    /// would; once full, a run of sums none above the floor (most of them, in a skewed
    /// top) is passed over after one look at its largest.
    fn offer_all(&mut self, first: u64, sums: &[i64]) {
        const RUN: usize = 64;
        for (c, run) in sums.chunks(RUN).enumerate() {
            if let Some(f) = self.floor
                && run.iter().all(|&n| n <= f)
            {
                self.total = run.iter().fold(self.total, |t, &n| t.wrapping_add(n));
                continue;
            }
            for (i, &n) in run.iter().enumerate() {
                self.offer(first + (c * RUN + i) as u64, n);
            }
        }
    }

    /// Down to the best `limit`, the worst of them last.
    fn keep_best(&mut self) {
        if self.best.len() > self.limit {
            self.best
                .select_nth_unstable_by(self.limit - 1, Self::order);
            // Everything before the `limit`th comes before it: it is the worst kept.
            self.best.truncate(self.limit);
        }
    }

    /// The best `limit`, in rank order.
    fn into_ranks(mut self) -> Vec<(u64, i64)> {
        self.keep_best();
        self.best.sort_unstable_by_key(|&(r, _)| r);
        self.best
    }
}

/// The segments of `segments` whose span and hour frames give the sums of buckets
/// `[lo, hi)` by rank (within retention), by position, each with its cover.
fn covers(
    segments: &[&Arc<Segment>],
    (lo, hi): (u32, u32),
    window: &Window,
) -> Vec<(usize, Cover)> {
    segments
        .iter()
        .enumerate()
        .filter_map(|(i, seg)| {
            let cover = seg.cover(lo, hi)?;
            let first = lo.max(seg.meta().first_bucket());
            (!cover.is_empty() && window.keeps(first)).then_some((i, cover))
        })
        .collect()
}

/// Memory's sums of a namespace's keys by key id (taken under the catalog's lock), looked
/// up by name through the catalog later, each look-up under the lock for its own length:
/// a top does not hold the catalog (and so every write) while it reads segments. Ids mean
/// the same keys as long as no key is forgotten meanwhile; if one is, `stale` is set and
/// the caller reads another way.
struct MemorySums<'a> {
    core: &'a Core,
    ns: NsId,
    /// [`Catalog::forgets`] when the sums were taken.
    epoch: u64,
    stale: std::cell::Cell<bool>,
    found: Vec<(KeyId, i64)>,
    /// The sum of each key, by key id when the catalog holds not many more keys than have
    /// a sum, else in `sparse`.
    dense: Vec<i64>,
    sparse: HashMap<KeyId, i64, crate::seeded::State>,
}

impl<'a> MemorySums<'a> {
    fn new(core: &'a Core, cat: &Catalog, ns: NsId, found: Vec<(KeyId, i64)>) -> Self {
        let keys = cat.keys.len();
        let mut dense = Vec::new();
        let mut sparse = HashMap::default();
        if keys <= found.len().saturating_mul(8).saturating_add(4096) {
            dense = vec![0i64; keys];
            for &(k, n) in &found {
                if let Some(at) = dense.get_mut(k as usize) {
                    *at = n;
                }
            }
        } else {
            sparse.extend(found.iter().copied());
        }
        MemorySums {
            core,
            ns,
            epoch: cat.forgets,
            stale: std::cell::Cell::new(false),
            found,
            dense,
            sparse,
        }
    }

    /// The catalog, if its key ids still mean what they did when the sums were taken.
    fn catalog(&self) -> Option<std::sync::RwLockReadGuard<'a, Catalog>> {
        if self.stale.get() {
            return None;
        }
        let cat = self.core.read_cat();
        if cat.forgets == self.epoch {
            Some(cat)
        } else {
            self.stale.set(true);
            None
        }
    }
}

impl ByName for MemorySums<'_> {
    fn total(&self) -> i64 {
        self.found.iter().fold(0i64, |t, e| t.wrapping_add(e.1))
    }

    fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    fn of(&self, key: &str) -> i64 {
        let Some(k) = self.catalog().and_then(|cat| cat.key_id(self.ns, key)) else {
            return 0;
        };
        match self.dense.get(k as usize) {
            Some(&n) => n,
            None => self.sparse.get(&k).copied().unwrap_or(0),
        }
    }

    fn names(&self, most: usize, keep: &dyn Fn(i64) -> bool) -> Vec<String> {
        let picked = crate::top::best(self.found.iter().copied().filter(|e| keep(e.1)), most);
        let Some(cat) = self.catalog() else {
            return Vec::new();
        };
        picked
            .into_iter()
            .filter_map(|(k, _)| cat.keys.get(k as usize).map(|e| e.name.as_str().to_owned()))
            .collect()
    }
}

/// What a scan's namespace and resolution name in the catalog: `None` if it has neither.
struct Target {
    ns: NsId,
    tier: TierPlan,
    window: Window,
    res: u32,
    cutoff: crate::catalog::Cutoff,
}

impl Target {
    fn of(cat: &Catalog, scan: &Scan<'_>, now: i64) -> Option<Target> {
        let ns = cat.ns_id(scan.ns.as_str())?;
        let tier = cat.ns[ns as usize].tier(scan.resolution)?;
        let window = Window::new(&tier, scan.from, scan.to, now);
        let res = scan.resolution.secs() as u32;
        let cutoff = cat.ns[ns as usize].cutoff(res);
        Some(Target {
            ns,
            tier,
            window,
            res,
            cutoff,
        })
    }
}

/// What [`Core::prepare_scan`] gathers.
struct Prepared {
    sums: KeySums,
    archive: Arc<crate::archive::Archive>,
    window: Window,
    res: u32,
    cutoff: crate::catalog::Cutoff,
}

/// A check of the deadline every few thousand calls (a top can visit millions of keys).
fn ticker(deadline: &Deadline) -> impl FnMut() -> Result<(), StoreError> + '_ {
    const STEP: u32 = 1024;
    let mut steps = 0u32;
    move || {
        steps = steps.wrapping_add(1);
        if steps.is_multiple_of(STEP) {
            deadline.check()?;
        }
        Ok(())
    }
}

fn key_of(name: String) -> Result<Key, StoreError> {
    Key::from_string(name).map_err(|e| StoreError::corrupt("a stored key").because(e))
}

/// Each key's sum so far, looked up by `&str` so that a key is copied once.
type KeySums = HashMap<String, i64, crate::seeded::State>;

fn add(sums: &mut KeySums, key: &str, n: i64) {
    match sums.get_mut(key) {
        Some(s) => *s = s.wrapping_add(n),
        None => {
            sums.insert(key.to_owned(), n);
        }
    }
}

/// A key's subtotal series with its (dimension, value) ids and names in the catalog.
pub(crate) struct Named<'c> {
    d: StrId,
    v: StrId,
    dim: &'c str,
    value: &'c str,
    sid: SeriesId,
}

/// The buckets of one tier that a read covers.
pub(crate) struct Window {
    slot: usize,
    pub(crate) res: i64,
    lo: u32,
    hi: u32,
    tier: TierPlan,
    now: i64,
}

impl Window {
    pub(crate) fn new(tier: &TierPlan, from: i64, to: i64, now: i64) -> Self {
        let idx = |t: i64| {
            (t.max(0) + tier.res - 1)
                .div_euclid(tier.res)
                .min(i64::from(u32::MAX)) as u32
        };
        Window {
            slot: tier.slot,
            res: tier.res,
            lo: idx(from),
            hi: idx(to),
            tier: *tier,
            now,
        }
    }

    /// Whether a bucket index is still within the tier's retention.
    pub(crate) fn keeps(&self, idx: u32) -> bool {
        let b = i64::from(idx) * self.res;
        self.tier
            .retention
            .keeps_bucket(b, self.tier.resolution, self.now)
    }

    /// Adds one series' counters in memory (live and frozen) to `out`, by bucket index.
    pub(crate) fn add_into(
        &self,
        shard: &Shard,
        (lane, sid): (Lane, SeriesId),
        out: &mut BTreeMap<u32, i64>,
    ) {
        for (b, n) in self.collect(shard, (lane, sid)) {
            let o = out.entry((b / self.res) as u32).or_default();
            *o = o.wrapping_add(n);
        }
    }

    /// The bucket indexes of the window `shard` can hold, and whether probing each of them
    /// costs less than scanning the shard's counters; `None` when there is nothing to read.
    /// Retention keeps every bucket after a kept one, so the kept ones are a suffix.
    fn probe_range(&self, shard: &Shard, lane: Lane) -> Option<(u32, u32, bool)> {
        let (min, max) = shard.extent(self.slot);
        let (lo, hi) = (self.lo.max(min), self.hi.min(max));
        let len = shard.count(self.slot, lane);
        if lo >= hi || len == 0 {
            return None;
        }
        let a = self.first_kept_in(lo, hi);
        (a < hi).then_some((a, hi, ((hi - lo) as usize) <= len))
    }

    /// The first bucket index of the window retention keeps (`hi` if none).
    pub(crate) fn first_kept(&self) -> u32 {
        self.first_kept_in(self.lo, self.hi)
    }

    /// The first index of `[lo, hi)` retention keeps (`hi` if none), by binary search:
    /// retention keeps every bucket after a kept one.
    fn first_kept_in(&self, lo: u32, hi: u32) -> u32 {
        let (mut a, mut b) = (lo, hi);
        while a < b {
            let mid = a + (b - a) / 2;
            if self.keeps(mid) {
                b = mid;
            } else {
                a = mid + 1;
            }
        }
        a
    }

    /// One series' counters in memory over the window, summed (wrapping, as every sum).
    pub(crate) fn sum(&self, shard: &Shard, (lane, sid): (Lane, SeriesId)) -> i64 {
        match self.probe_range(shard, lane) {
            None => 0,
            Some((lo, hi, true)) => (lo..hi)
                .map(|i| shard.get(self.slot, lane, sid, i))
                .fold(0i64, i64::wrapping_add),
            // Live and frozen counters of one bucket are both added, as a sum wants.
            Some((lo, hi, false)) => shard
                .counters(self.slot, lane)
                .filter(|&(k, _)| {
                    let (s, i) = split_key(k);
                    s == sid && (lo..hi).contains(&i)
                })
                .fold(0i64, |t, (_, n)| t.wrapping_add(n)),
        }
    }

    /// Several series' counters in memory over the window, each summed into `out` at its
    /// position: probing each series' buckets, or walking the slot's counters once when
    /// that is fewer steps (a busy key's thousands of values over the open day).
    pub(crate) fn sum_many(&self, shard: &Shard, sids: &[SeriesId], out: &mut [i64]) {
        let lane = Lane::Sub;
        let Some((lo, hi, _)) = self.probe_range(shard, lane) else {
            return;
        };
        let probes = (sids.len() as u64).saturating_mul(u64::from(hi - lo));
        if probes <= shard.count(self.slot, lane) as u64 {
            for (o, &sid) in out.iter_mut().zip(sids) {
                *o = (lo..hi)
                    .map(|i| shard.get(self.slot, lane, sid, i))
                    .fold(*o, i64::wrapping_add);
            }
            return;
        }
        let at: HashMap<SeriesId, usize, crate::seeded::State> =
            sids.iter().enumerate().map(|(p, &s)| (s, p)).collect();
        // Live and frozen counters of one bucket are both added, as a sum wants.
        for (k, n) in shard.counters(self.slot, lane) {
            let (s, i) = split_key(k);
            if (lo..hi).contains(&i)
                && let Some(o) = at.get(&s).and_then(|&p| out.get_mut(p))
            {
                *o = o.wrapping_add(n);
            }
        }
    }

    pub(crate) fn collect(&self, shard: &Shard, (lane, sid): (Lane, SeriesId)) -> Vec<(i64, i64)> {
        let Some((lo, hi, probe)) = self.probe_range(shard, lane) else {
            return Vec::new();
        };
        if probe {
            (lo..hi)
                .filter_map(|i| match shard.get(self.slot, lane, sid, i) {
                    0 => None,
                    n => Some((i64::from(i) * self.res, n)),
                })
                .collect()
        } else {
            // A range longer than the maps: scanning them is cheaper than probing.
            let mut out: Vec<(i64, i64)> = shard
                .counters(self.slot, lane)
                .filter_map(|(k, n)| {
                    let (s, i) = split_key(k);
                    (s == sid && (lo..hi).contains(&i)).then_some((i64::from(i) * self.res, n))
                })
                .collect();
            out.sort_unstable();
            // A counter can be both live (a late add) and frozen: one bucket, summed.
            out.dedup_by(|later, first| {
                let same = later.0 == first.0;
                if same {
                    first.1 = first.1.wrapping_add(later.1);
                }
                same
            });
            out.retain(|(_, n)| *n != 0);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Leaders;
    use proptest::prelude::*;

    proptest! {
        /// Offered in rank order, `Leaders` keeps what sorting everything would: the best
        /// `limit` by (sum desc, rank asc), and the sum of all.
        #[test]
        fn leaders_keep_what_a_full_sort_keeps(
            sums in proptest::collection::vec(-4i64..5, 0..400),
            limit in 0usize..12,
            first in 0u64..1000,
        ) {
            let mut leaders = Leaders::new(limit);
            for (r, &n) in sums.iter().enumerate() {
                leaders.offer(r as u64, n);
            }
            let total = leaders.total;
            let got = leaders.into_ranks();
            let mut want: Vec<(u64, i64)> = sums
                .iter()
                .enumerate()
                .filter(|(_, n)| **n != 0)
                .map(|(r, &n)| (r as u64, n))
                .collect();
            want.sort_by(Leaders::order);
            want.truncate(limit);
            want.sort_unstable_by_key(|&(r, _)| r);
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(total, sums.iter().sum::<i64>());
            // Offered all at once from a first rank: the same, shifted.
            let mut all = Leaders::new(limit);
            all.offer_all(first, &sums);
            prop_assert_eq!(all.total, total);
            let shifted: Vec<(u64, i64)> = want.iter().map(|&(r, n)| (r + first, n)).collect();
            prop_assert_eq!(all.into_ranks(), shifted);
        }
    }
}

//! One archive segment file through `Segment::open`, `verify` and every read a query makes
//! of it.
//!
//! Input: a flag byte, then the file. Flag bit 0 recomputes the blocks' checksums and bit 1
//! the index section's and the footer's after mutation (`tally_fuzz::fix_segment_checksums`),
//! so that damage reaches the block decoders and the structure checks behind the CRCs.
//!
//! The key index (an `fst` map) must be byte for byte one of the seeds' own: everything else
//! (blocks, dictionary, block table, footer) is the fuzzer's. `fst` trusts its bytes once its
//! checksum holds, and libFuzzer learns to forge that checksum (it found a panic inside `fst`
//! so): a map crafted with valid checksums is the limit docs/format.md names, not ours to find.
//!
//! Asserts, beyond "no panic": every read of a key that answers at all answers what the
//! whole-record read of it says — `get`, `get_totals`, `sums` (totals bucket by bucket,
//! each subtotal series as one sum, over every bucket and over half of them), `scan`,
//! `scan_totals` and `scan_total_sums` — and `keys` lists what the index holds. In a
//! version 2 file that `verify` accepts, each span frame read for a namespace holds the sums
//! of its records' totals over the span, and the ranks name the keys the records have: a
//! frame changed behind a recomputed checksum is what `verify` is there to catch. Likewise
//! `sums` over the whole period as whole spans (a rollup, when a record has one) sums each
//! subtotal series as its buckets do.

#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tally_engine::segment::{Exact, KeyRecord, Segment};
use tally_fuzz::{fix_segment_checksums, scratch_dir};

/// Records read per input at most (a valid segment may hold many).
const MAX_RECORDS: usize = 64;

/// The key index bytes of a segment file, if its footer places them inside the file.
fn key_index(bytes: &[u8]) -> Option<&[u8]> {
    use tally_engine::segment::layout as l;
    let footer = bytes.len().checked_sub(l::FOOTER_LEN)?;
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let index_at = u64::from_le_bytes(
        bytes[footer + l::FOOTER_INDEX_OFFSET_OFFSET..][..8]
            .try_into()
            .unwrap(),
    );
    let at = usize::try_from(index_at)
        .ok()?
        .checked_add(u32_at(footer + l::FOOTER_DICT_LEN_OFFSET))?;
    bytes.get(at..at.checked_add(u32_at(footer + l::FOOTER_FST_LEN_OFFSET))?)
}

/// The seeds' key indexes (their files start with the flag byte).
fn known_indexes() -> &'static [&'static [u8]] {
    static KNOWN: OnceLock<Vec<&'static [u8]>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        // The `-v2` seeds are the same records rewritten in format 2: the same key index.
        // `month-rollups-v2` has one record made dense enough for a rollup.
        let seeds: [&'static [u8]; 4] = [
            include_bytes!("../corpus/segment_read/day-hourly"),
            include_bytes!("../corpus/segment_read/month-hourly"),
            include_bytes!("../corpus/segment_read/delta-minutes"),
            include_bytes!("../corpus/segment_read/month-rollups-v2"),
        ];
        seeds.iter().filter_map(|s| key_index(&s[1..])).collect()
    })
}

fn path() -> &'static std::path::Path {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| scratch_dir().join("fuzz.seg"))
}

fn total_sum(r: &KeyRecord, inside: &dyn Fn(u32) -> bool) -> BTreeMap<u32, i64> {
    r.totals
        .iter()
        .filter(|(i, _)| inside(*i))
        .map(|&(i, n)| (i, n))
        .collect()
}

fn sub_sums(r: &KeyRecord, inside: &dyn Fn(u32) -> bool) -> BTreeMap<(String, String), i64> {
    let mut out = BTreeMap::new();
    for d in &r.dims {
        for (v, b) in &d.values {
            let s: i64 = b.iter().filter(|(i, _)| inside(*i)).map(|(_, n)| n).sum();
            *out.entry((d.dim.clone(), v.clone())).or_default() += s;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, file)) = data.split_first() else {
        return;
    };
    let mut bytes = file.to_vec();
    match key_index(&bytes) {
        Some(index) if known_indexes().contains(&index) => {}
        _ => return,
    }
    fix_segment_checksums(&mut bytes, flags & 1 != 0, flags & 2 != 0);
    std::fs::write(path(), &bytes).unwrap();
    let Ok(seg) = Segment::open(path()) else {
        return;
    };
    // Span and key frames repeat what the records and the key index say; a frame whose
    // bytes the fuzzer changed and whose checksum it then recomputed is caught by `verify`
    // alone (like a forged block: docs/format.md), so the frames' reads are compared with the
    // records only in a file that verifies.
    let verified = seg.verify().is_ok();

    let mut records: Vec<(String, String, KeyRecord)> = Vec::new();
    let _ = seg.scan_all(&mut |ns, key, r| {
        if records.len() < MAX_RECORDS {
            records.push((ns.to_owned(), key.to_owned(), r.clone()));
        }
        Ok(())
    });
    let first = seg.meta().first_bucket();
    let half = |i: u32| i % 2 == first % 2;
    let all = |_: u32| true;
    for (ns, key, rec) in &records {
        if let Ok(got) = seg.get(ns, key) {
            assert_eq!(got.as_ref(), Some(rec), "get {ns}/{key}");
        }
        if let Ok(got) = seg.get_totals(ns, key) {
            assert_eq!(got.as_ref(), Some(&rec.totals), "get_totals {ns}/{key}");
        }
        let whole = seg.spans_within(first, u32::try_from(seg.meta().end_bucket()).unwrap_or(0));
        if let Some(spans) = whole.filter(|_| verified) {
            let (mut totals, mut subs) = (Vec::new(), BTreeMap::new());
            let summed = seg.sums(
                (ns, key),
                Some(Exact::Spans(spans.start, spans.end)),
                &all,
                &|_| true,
                &mut |i, n| totals.push((i, n)),
                &mut |d, v, n| {
                    subs.insert((d.to_owned(), v.to_owned()), n);
                },
            );
            if summed.is_ok() {
                assert_eq!(
                    totals, rec.totals,
                    "sums over whole spans: totals {ns}/{key}"
                );
                let mut want = BTreeMap::new();
                for d in &rec.dims {
                    for (v, b) in &d.values {
                        let n = b.iter().fold(0i64, |t, (_, n)| t.wrapping_add(*n));
                        if n != 0 {
                            want.insert((d.dim.clone(), v.clone()), n);
                        }
                    }
                }
                assert_eq!(subs, want, "sums over whole spans: subtotals {ns}/{key}");
            }
        }
        // All but the period's first bucket, told as an exact range (summed once, then
        // kept: read twice), and every other bucket. No rollup is read on this path, so
        // damaged bytes must give an error or the record's own sums, verified or not.
        let end = u32::try_from(seg.meta().end_bucket()).unwrap_or(u32::MAX);
        let lo = first.saturating_add(1).min(end);
        let rest = move |i: u32| lo <= i && i < end;
        for (inside, exact) in [
            (&all as &dyn Fn(u32) -> bool, None),
            (&half, None),
            (&rest, Some(Exact::Buckets(lo, end))),
            (&rest, Some(Exact::Buckets(lo, end))),
        ] {
            let (mut totals, mut subs) = (BTreeMap::new(), BTreeMap::new());
            let summed = seg.sums(
                (ns, key),
                exact,
                inside,
                &|_| true,
                &mut |i, n| *totals.entry(i).or_insert(0) += n,
                &mut |d, v, n| *subs.entry((d.to_owned(), v.to_owned())).or_insert(0) += n,
            );
            if summed.is_ok() {
                assert_eq!(summed.ok(), Some(true), "sums found {ns}/{key}");
                assert_eq!(totals, total_sum(rec, inside), "sums totals {ns}/{key}");
                let mut want = sub_sums(rec, inside);
                let mut got = subs;
                want.retain(|_, n| *n != 0);
                got.retain(|_, n| *n != 0);
                assert_eq!(got, want, "sums subtotals {ns}/{key}");
            }
        }
    }
    let mut namespaces: Vec<&String> = records.iter().map(|(ns, _, _)| ns).collect();
    namespaces.dedup();
    for ns in namespaces {
        let mine: Vec<&(String, String, KeyRecord)> =
            records.iter().filter(|(n, _, _)| n == ns).collect();
        let mut seen = Vec::new();
        let scanned = seg.scan(ns, &mut |k, r| {
            if seen.len() < mine.len() {
                seen.push((k.to_owned(), r.clone()));
            }
            Ok(())
        });
        if scanned.is_ok() {
            for ((k, r), (_, key, rec)) in seen.iter().zip(&mine) {
                assert_eq!((k, r), (key, rec), "scan {ns}");
            }
        }
        let mut totals = Vec::new();
        if seg
            .scan_totals(ns, &mut |k, t| {
                totals.push((k.to_owned(), t.clone()));
                Ok(())
            })
            .is_ok()
        {
            for ((k, t), (_, key, rec)) in totals.iter().zip(&mine) {
                assert_eq!((k, t), (key, &rec.totals), "scan_totals {ns}");
            }
        }
        for inside in [&all as &dyn Fn(u32) -> bool, &half] {
            let mut sums = Vec::new();
            if seg
                .scan_total_sums(ns, inside, &mut |k, n| {
                    sums.push((k.to_owned(), n));
                    Ok(())
                })
                .is_ok()
            {
                for ((k, n), (_, key, rec)) in sums.iter().zip(&mine) {
                    let want: i64 = total_sum(rec, inside).values().sum();
                    assert_eq!((k, *n), (key, want), "scan_total_sums {ns}");
                }
            }
        }
        // Span sums (version 2): ranks are positions in `scan_all`'s order, so the records
        // read are ranks 0.. of the whole segment.
        if verified
            && let (Ok(ranks), Some(spans)) = (
                seg.rank_range(ns),
                seg.spans_within(
                    first,
                    u32::try_from(seg.meta().end_bucket()).unwrap_or(u32::MAX),
                ),
            )
        {
            let known = records.len() as u64;
            let span_len = (seg.meta().end_bucket() - u64::from(first)) / spans.len().max(1) as u64;
            for span in spans {
                let mut got = Vec::new();
                if seg
                    .span_sums(span, ranks.clone(), &mut |r, n| got.push((r, n)))
                    .is_err()
                {
                    continue;
                }
                let lo = u64::from(first) + span as u64 * span_len;
                let inside = |i: u32| (lo..lo + span_len).contains(&u64::from(i));
                let want: Vec<(u64, i64)> = records
                    .iter()
                    .enumerate()
                    .filter(|(r, (n, _, _))| n == ns && ranks.contains(&(*r as u64)))
                    .map(|(r, (_, _, rec))| {
                        let sum = rec
                            .totals
                            .iter()
                            .filter(|(i, _)| inside(*i))
                            .fold(0i64, |t, (_, n)| t.wrapping_add(*n));
                        (r as u64, sum)
                    })
                    .filter(|&(_, n)| n != 0)
                    .collect();
                got.retain(|&(r, _)| r < known);
                assert_eq!(got, want, "span {span} of {ns}");
            }
            let mine_ranks: Vec<u64> = (0..known).filter(|r| ranks.contains(r)).collect();
            if let Ok(names) = seg.keys_at(&mine_ranks) {
                for (r, (n, k)) in mine_ranks.iter().zip(&names) {
                    let (rn, rk, _) = &records[*r as usize];
                    assert_eq!((n, k), (rn, rk), "keys_at {r}");
                    if let Ok(at) = seg.rank_of(n, k) {
                        assert_eq!(at, Some(*r), "rank_of {n}/{k}");
                    }
                }
            }
        }
        if let Ok(keys) = seg.keys(ns, "", None, mine.len()) {
            let want: Vec<&String> = mine.iter().map(|(_, k, _)| k).collect();
            assert_eq!(keys.iter().collect::<Vec<_>>(), want, "keys {ns}");
        }
    }
});

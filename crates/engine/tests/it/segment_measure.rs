//! Bytes per data point of a realistic day, per block codec (docs/format.md, "Compression").
//! Not a correctness test: run by hand with
//!
//! ```text
//! cargo test -p tally-engine --release --test it segment_measure -- --ignored --nocapture
//! ```

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use tally_engine::segment::{Codec, DimRecord, KeyRecord, Segment, WriteOptions};

use crate::segment::{FIRST, HOURS, Input, write_with};

/// splitmix64: a small, good-enough deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Samples 0..n with probability proportional to `weights`.
struct Pick(Vec<f64>);

impl Pick {
    fn zipf(n: usize, s: f64) -> Self {
        Self::weights((0..n).map(|i| 1.0 / ((i + 1) as f64).powf(s)))
    }

    fn weights(w: impl Iterator<Item = f64>) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = w
            .map(|x| {
                acc += x;
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Pick(cdf)
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.0.partition_point(|&c| c < u).min(self.0.len() - 1)
    }
}

const KEYS: usize = 100_000;
const EVENTS: usize = 670_000;

/// One day of an hourly tier: 670 k events (20 M a month) over 100 k links with Zipf(1.0)
/// traffic, a diurnal hour profile, `country` (50 values, Zipf 1.3) and `referrer`
/// (1000 host names, Zipf 1.1) on every event.
fn realistic_day() -> Input {
    let mut rng = Rng(42);
    const B62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let keys: Vec<String> = (0..KEYS)
        .map(|_| {
            (0..7)
                .map(|_| B62[(rng.next() % 62) as usize] as char)
                .collect()
        })
        .collect();
    let countries: Vec<String> = (0..50)
        .map(|i| {
            let c = |x: u64| (b'A' + (x % 26) as u8) as char;
            format!("{}{}", c(i * 7 + 3), c(i * 11 + i / 26))
        })
        .collect();
    let referrers: Vec<String> = (0..1000)
        .map(|_| {
            let len = 4 + rng.next() % 9;
            let name: String = (0..len)
                .map(|_| (b'a' + (rng.next() % 26) as u8) as char)
                .collect();
            let tld = ["com", "org", "net", "co.uk", "de", "io"][(rng.next() % 6) as usize];
            format!("www.{name}.{tld}")
        })
        .collect();
    let key_pick = Pick::zipf(KEYS, 1.0);
    let hour_pick = Pick::weights(
        (0..HOURS).map(|h| 1.0 + 0.7 * (std::f64::consts::TAU * (f64::from(h) - 9.0) / 24.0).sin()),
    );
    let country_pick = Pick::zipf(countries.len(), 1.3);
    let referrer_pick = Pick::zipf(referrers.len(), 1.1);

    type Series = BTreeMap<u32, i64>;
    #[derive(Default)]
    struct Agg {
        totals: Series,
        country: BTreeMap<usize, Series>,
        referrer: BTreeMap<usize, Series>,
    }
    let mut aggs: HashMap<usize, Agg> = HashMap::new();
    for _ in 0..EVENTS {
        let k = key_pick.sample(&mut rng);
        let h = FIRST + hour_pick.sample(&mut rng) as u32;
        let a = aggs.entry(k).or_default();
        *a.totals.entry(h).or_default() += 1;
        let c = country_pick.sample(&mut rng);
        *a.country.entry(c).or_default().entry(h).or_default() += 1;
        let r = referrer_pick.sample(&mut rng);
        *a.referrer.entry(r).or_default().entry(h).or_default() += 1;
    }
    let dim = |name: &str, m: BTreeMap<usize, Series>, names: &[String]| {
        let mut values: Vec<(String, Vec<(u32, i64)>)> = m
            .into_iter()
            .map(|(i, s)| (names[i].clone(), s.into_iter().collect()))
            .collect();
        values.sort_by(|a, b| a.0.cmp(&b.0));
        DimRecord {
            dim: name.to_owned(),
            values,
        }
    };
    aggs.into_iter()
        .map(|(k, a)| {
            let r = KeyRecord {
                totals: a.totals.into_iter().collect(),
                dims: vec![
                    dim("country", a.country, &countries),
                    dim("referrer", a.referrer, &referrers),
                ],
            };
            (("clicks".to_owned(), keys[k].clone()), r)
        })
        .collect()
}

#[test]
#[ignore = "a measurement: run by hand, see the module doc"]
fn segment_bytes_per_data_point() {
    let day = realistic_day();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("day.seg");
    let points: u64 = day.values().map(KeyRecord::data_points).sum();
    let totals: usize = day.values().map(|r| r.totals.len()).sum();
    println!(
        "{} keys, {points} data points ({totals} totals, {} subtotals), {EVENTS} events",
        day.len(),
        points - totals as u64
    );

    // Uncompressed, then lz4_flex over the same block payloads.
    let opts = |codec, block_target| WriteOptions {
        codec,
        block_target,
    };
    let raw = write_with(&path, &day, opts(Codec::None, 32 << 10));
    let seg = Segment::open(&path).unwrap();
    let index = raw.bytes
        - seg
            .blocks()
            .iter()
            .map(|b| u64::from(b.stored_len))
            .sum::<u64>();
    println!(
        "index section + footer: {index} bytes ({:.2} B/key, {:.3} B/point); fst {} bytes, dictionary of {} strings",
        index as f64 / day.len() as f64,
        index as f64 / points as f64,
        seg.index_bytes(),
        seg.dictionary_strings()
    );
    let row = |name: &str, bytes: u64, blocks: usize, write_ms: u128, read_ms: u128| {
        println!(
            "{name:<22} {bytes:>10} bytes  {:>6.3} B/point  {blocks:>4} blocks  write {write_ms:>5} ms  verify {read_ms:>5} ms",
            bytes as f64 / points as f64
        );
    };
    row("none, 32 KiB", raw.bytes, seg.blocks().len(), 0, 0);
    let t = Instant::now();
    let lz4: u64 = (0..seg.blocks().len())
        .map(|i| lz4_flex::block::compress(&seg.block_payload(i).unwrap()).len() as u64)
        .sum();
    row(
        "lz4_flex, 32 KiB",
        index + lz4,
        seg.blocks().len(),
        t.elapsed().as_millis(),
        0,
    );
    for (level, target) in [
        (1, 32 << 10),
        (3, 16 << 10),
        (3, 32 << 10),
        (3, 64 << 10),
        (6, 32 << 10),
        (9, 16 << 10),
        (9, 32 << 10),
        (19, 32 << 10),
    ] {
        let t = Instant::now();
        let s = write_with(&path, &day, opts(Codec::Zstd { level }, target));
        let write_ms = t.elapsed().as_millis();
        let seg = Segment::open(&path).unwrap();
        let t = Instant::now();
        assert_eq!(seg.verify().unwrap(), s);
        row(
            &format!("zstd {level}, {} KiB", target >> 10),
            s.bytes,
            seg.blocks().len(),
            write_ms,
            t.elapsed().as_millis(),
        );
    }

    // What one `get` costs, by block size.
    for target in [8 << 10, 16 << 10, 32 << 10, 64 << 10] {
        let s = write_with(&path, &day, opts(Codec::Zstd { level: 9 }, target));
        let seg = Segment::open(&path).unwrap();
        let raw: u64 = seg.blocks().iter().map(|b| u64::from(b.raw_len)).sum();
        println!(
            "zstd 9, {} KiB target: {} bytes, {:.3} B/point, {} blocks of {} raw bytes on average",
            target >> 10,
            s.bytes,
            s.bytes as f64 / points as f64,
            seg.blocks().len(),
            raw / seg.blocks().len() as u64
        );
        let t = Instant::now();
        for i in 0..seg.blocks().len() {
            seg.block_payload(i).unwrap();
        }
        println!(
            "  read + check + decompress one block: {:.1} us on average",
            t.elapsed().as_secs_f64() * 1e6 / seg.blocks().len() as f64
        );
        get_latency(&path, &day);
    }
}

/// p50 / p90 / p99 of `Segment::get` over random present keys: uniform over the keys (the
/// worst case for any cache), then weighted by their traffic (as reads of popular links are),
/// each on a freshly opened segment (an empty block cache).
fn get_latency(path: &std::path::Path, day: &Input) {
    let keys: Vec<&(String, String)> = day.keys().collect();
    let weight = Pick::weights(
        day.values()
            .map(|r| r.totals.iter().map(|b| b.1 as f64).sum()),
    );
    let mut rng = Rng(7);
    let uniform: Vec<&(String, String)> = (0..20_000)
        .map(|_| keys[(rng.next() % keys.len() as u64) as usize])
        .collect();
    let by_traffic: Vec<&(String, String)> =
        (0..20_000).map(|_| keys[weight.sample(&mut rng)]).collect();
    for (pass, picks) in [("uniform", uniform), ("by traffic", by_traffic)] {
        let seg = Segment::open(path).unwrap();
        let mut ns: Vec<u128> = picks
            .iter()
            .map(|(n, k)| {
                let t = Instant::now();
                let r = seg.get(n, k).unwrap();
                let e = t.elapsed().as_nanos();
                assert!(r.is_some());
                e
            })
            .collect();
        ns.sort_unstable();
        let q = |p: f64| ns[((ns.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
        println!(
            "get, {} random keys, {pass}: p50 {:.1} us  p90 {:.1} us  p99 {:.1} us",
            picks.len(),
            q(0.5),
            q(0.9),
            q(0.99)
        );
    }
    // A cache hit: one small key again and again.
    let seg = Segment::open(path).unwrap();
    let (n, k) = keys.iter().find(|k| day[**k].data_points() <= 4).unwrap();
    seg.get(n, k).unwrap();
    let t = Instant::now();
    for _ in 0..10_000 {
        seg.get(n, k).unwrap();
    }
    println!(
        "get of one small key again and again (a cache hit): {:.2} us",
        t.elapsed().as_secs_f64() * 1e6 / 10_000.0
    );
}

/// What the key index could cost: the day's keys as fst maps with the values v1 stores and
/// with the block alone, as an fst set, and front-coded (zstd 19) — docs/format.md,
/// "Compression". Run like the test above, with `fst_sizes` for its name.
#[test]
#[ignore = "a measurement: run by hand, see the module doc"]
fn fst_sizes() {
    let day = realistic_day();
    let keys: Vec<Vec<u8>> = day
        .keys()
        .map(|(n, k)| tally_engine::segment::index_key(n, k))
        .collect();
    for per_block in [500usize, 860, 1000, 2000] {
        let mut a = fst::MapBuilder::memory();
        let mut b = fst::MapBuilder::memory();
        let mut c = fst::SetBuilder::memory();
        for (i, k) in keys.iter().enumerate() {
            let blk = (i / per_block) as u64;
            a.insert(k, blk << 32 | (i % per_block) as u64).unwrap();
            b.insert(k, blk).unwrap();
            c.insert(k).unwrap();
        }
        let a = a.into_inner().unwrap().len();
        let b = b.into_inner().unwrap().len();
        let c = c.into_inner().unwrap();
        let cz = zstd::bulk::compress(&c, 19).unwrap().len();
        let c = c.len();
        // keys front-coded
        let mut fc = Vec::new();
        let mut prev: &[u8] = &[];
        for k in &keys {
            let p = prev
                .iter()
                .zip(k.iter())
                .take_while(|(x, y)| x == y)
                .count();
            fc.push(p as u8);
            fc.push((k.len() - p) as u8);
            fc.extend_from_slice(&k[p..]);
            prev = k;
        }
        let fcz = zstd::bulk::compress(&fc, 19).unwrap().len();
        println!(
            "per block {per_block}: block<<32|ord {a}, block {b}, set {c} (zstd {cz}), front-coded {} zstd {fcz}",
            fc.len()
        );
    }
}

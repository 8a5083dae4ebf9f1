//! The clickstream workload of SPEC §6: Zipf-distributed keys, and country and referrer
//! dimensions (themselves Zipf), timestamps spread over the last hour — or, through
//! [`Generator::span`], over any stretch of time, one piece at a time (the archive benchmark's
//! 30 days). Deterministic: the same seed gives the same events.

use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::RawEvent;
use tally_core::store::{Batch, Store};

/// A small, fast, deterministic generator (PCG-style LCG), so runs are comparable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let x = self.0;
        (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd) ^ (x >> 29)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over `n` ranks with exponent `s`, by inverse CDF.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|c| *c < u).min(self.cdf.len() - 1)
    }
}

/// Shape of the workload.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub keys: usize,
    pub countries: usize,
    pub referrers: usize,
    pub batch: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            keys: 100_000,
            countries: 60,
            referrers: 2_000,
            batch: 1_000,
        }
    }
}

/// One clickstream event as the ranks its names are made of.
#[derive(Debug, Clone, Copy)]
pub struct Draw {
    pub key: usize,
    pub ts: i64,
    pub country: usize,
    pub referrer: usize,
}

/// Draws clickstream events one at a time, so a long stream (days of traffic) need not be
/// held in memory. The same seed gives the same events.
#[derive(Debug, Clone)]
pub struct Generator {
    shape: Shape,
    rng: Rng,
    keys: Zipf,
    countries: Zipf,
    referrers: Zipf,
}

impl Generator {
    pub fn new(shape: Shape, seed: u64) -> Self {
        Generator {
            shape,
            rng: Rng::new(seed),
            keys: Zipf::new(shape.keys, 1.1),
            countries: Zipf::new(shape.countries, 1.3),
            referrers: Zipf::new(shape.referrers, 1.1),
        }
    }

    /// One event as ranks: `ts` draws its timestamp from the same generator (between the
    /// key and the dimensions, the order `raw_batches` always used).
    pub fn draw(&mut self, ts: impl FnOnce(&mut Rng) -> i64) -> Draw {
        let key = self.keys.sample(&mut self.rng);
        let ts = ts(&mut self.rng);
        let country = self.countries.sample(&mut self.rng);
        let referrer = self.referrers.sample(&mut self.rng);
        Draw {
            key,
            ts,
            country,
            referrer,
        }
    }

    /// One event in namespace `clicks`: [`Generator::draw`] with its names spelt out.
    pub fn event(&mut self, ts: impl FnOnce(&mut Rng) -> i64) -> RawEvent {
        let d = self.draw(ts);
        RawEvent {
            ns: "clicks".into(),
            key: format!("lnk_{}", d.key),
            ts: Some(d.ts),
            n: Some(1),
            dims: vec![
                ("country".into(), format!("C{}", d.country)),
                ("referrer".into(), format!("r{}.example", d.referrer)),
            ],
        }
    }

    /// `events` events with timestamps uniform in `[start, start + len)`, in raw batches of
    /// `shape.batch` (the last one shorter).
    pub fn span(&mut self, start: i64, len: i64, events: usize) -> Vec<Vec<RawEvent>> {
        let len = len.max(1) as u64;
        let mut out = Vec::with_capacity(events.div_ceil(self.shape.batch));
        let mut left = events;
        while left > 0 {
            let n = left.min(self.shape.batch);
            out.push(
                (0..n)
                    .map(|_| self.event(|r| start + (r.next_u64() % len) as i64))
                    .collect(),
            );
            left -= n;
        }
        out
    }
}

/// `batches` raw batches of clickstream events in namespace `clicks`, timestamps spread over
/// the hour before `now`.
pub fn raw_batches(shape: Shape, batches: usize, now: i64, seed: u64) -> Vec<Vec<RawEvent>> {
    let mut g = Generator::new(shape, seed);
    (0..batches)
        .map(|_| {
            (0..shape.batch)
                .map(|_| g.event(|r| now - (r.next_u64() % 3600) as i64))
                .collect()
        })
        .collect()
}

/// Validates raw batches into store batches (namespaces auto-created with the defaults:
/// `1m:48h` and `1h:forever`, breakdowns in `1h`). Takes them by value, as the server does.
pub fn prepare(store: &dyn Store, raws: Vec<Vec<RawEvent>>, now: i64) -> Vec<Batch> {
    raws.into_iter()
        .map(|r| {
            ingest::prepare_owned(store, r, now, &Limits::default(), &Defaults::default())
                .unwrap_or_else(|e| panic!("workload batch refused: {e}"))
        })
        .collect()
}

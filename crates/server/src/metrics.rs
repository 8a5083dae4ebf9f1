//! `/metrics` in the Prometheus text format. Kept per server rather than in a process-global
//! recorder (the `metrics` crate's model) so that tests can run many servers in one process
//! and each reports only its own figures — a handful of counters and one histogram family.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::AtomicI64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tally_core::store::Gauge;

/// Upper bounds of the latency buckets, in seconds.
const BOUNDS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; BOUNDS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub events: AtomicU64,
    pub batches: AtomicU64,
    /// Dry runs (`POST /v1/events?dry_run=true`) that passed, and their events: what a
    /// load's check pass sent, which applied nothing.
    pub dry_run_batches: AtomicU64,
    pub dry_run_events: AtomicU64,
    /// StatsD lines by outcome; rendered once a listener has started.
    pub statsd: crate::statsd::LineCounts,
    responses: Mutex<BTreeMap<u16, u64>>,
    queries: Mutex<BTreeMap<&'static str, Histogram>>,
    /// The listener's figures: it starts before the app exists (while the engine
    /// recovers), so it keeps them and hands them over once the app serves.
    connections: OnceLock<Arc<Connections>>,
}

/// What the listener counts: open connections, and connections it refused.
#[derive(Debug, Default)]
pub struct Connections {
    pub open: AtomicI64,
    /// Closed at once because `[limits] max_connections` were open.
    pub refused_max_connections: AtomicU64,
    /// `accept` failed (out of file descriptors, out of memory).
    pub refused_accept_error: AtomicU64,
}

impl Metrics {
    pub fn response(&self, status: u16) {
        *self
            .responses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    pub fn query(&self, kind: &'static str, took: Duration) {
        let secs = took.as_secs_f64();
        let mut q = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        let h = q.entry(kind).or_default();
        for (b, bound) in h.buckets.iter_mut().zip(BOUNDS) {
            if secs <= bound {
                *b += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// Reports `connections` from now on; the first attached stays.
    pub fn attach_connections(&self, connections: Arc<Connections>) {
        let _ = self.connections.set(connections);
    }

    pub fn render(&self, backend: &[Gauge]) -> String {
        let mut out = String::new();
        if let Some(c) = self.connections.get() {
            let _ = writeln!(
                out,
                "# HELP tally_connections_open HTTP connections open now.\n# TYPE tally_connections_open gauge\ntally_connections_open {}",
                c.open.load(Ordering::Relaxed)
            );
            let _ = writeln!(
                out,
                "# HELP tally_connections_refused_total Connections closed at once or never accepted, by reason.\n# TYPE tally_connections_refused_total counter"
            );
            for (reason, n) in [
                ("max_connections", &c.refused_max_connections),
                ("accept_error", &c.refused_accept_error),
            ] {
                let _ = writeln!(
                    out,
                    "tally_connections_refused_total{{reason=\"{reason}\"}} {}",
                    n.load(Ordering::Relaxed)
                );
            }
        }
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        counter(
            "tally_events_accepted_total",
            "Events accepted (durable under the fsync policy), StatsD lines included.",
            self.events.load(Ordering::Relaxed),
        );
        counter(
            "tally_batches_accepted_total",
            "Batches accepted (POST /v1/events, incr and StatsD batches).",
            self.batches.load(Ordering::Relaxed),
        );
        counter(
            "tally_dry_run_batches_total",
            "Dry runs of POST /v1/events that passed every check (nothing applied).",
            self.dry_run_batches.load(Ordering::Relaxed),
        );
        counter(
            "tally_dry_run_events_total",
            "Events of dry runs that passed every check (nothing applied).",
            self.dry_run_events.load(Ordering::Relaxed),
        );
        if self.statsd.enabled() {
            let _ = writeln!(
                out,
                "# HELP tally_statsd_lines_total StatsD lines received, by outcome.\n# TYPE tally_statsd_lines_total counter"
            );
            for o in crate::statsd::Outcome::ALL {
                let _ = writeln!(
                    out,
                    "tally_statsd_lines_total{{outcome=\"{}\"}} {}",
                    o.as_str(),
                    self.statsd.get(o)
                );
            }
            let _ = writeln!(
                out,
                "# HELP tally_statsd_tcp_connections StatsD TCP connections open now.\n# TYPE tally_statsd_tcp_connections gauge\ntally_statsd_tcp_connections {}",
                self.statsd.tcp_connections.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tally_http_responses_total HTTP responses by status.\n# TYPE tally_http_responses_total counter"
        );
        for (status, n) in self
            .responses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "tally_http_responses_total{{status=\"{status}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP tally_query_duration_seconds Query latency by kind, in the server.\n# TYPE tally_query_duration_seconds histogram"
        );
        for (kind, h) in self
            .queries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            for (b, bound) in h.buckets.iter().zip(BOUNDS) {
                let _ = writeln!(
                    out,
                    "tally_query_duration_seconds_bucket{{kind=\"{kind}\",le=\"{bound}\"}} {b}"
                );
            }
            let _ = writeln!(
                out,
                "tally_query_duration_seconds_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "tally_query_duration_seconds_sum{{kind=\"{kind}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "tally_query_duration_seconds_count{{kind=\"{kind}\"}} {}",
                h.count
            );
        }
        for g in backend {
            let _ = writeln!(
                out,
                "# HELP {} {}\n# TYPE {} {}\n{} {}",
                g.name, g.help, g.name, g.kind, g.name, g.value
            );
        }
        out
    }
}

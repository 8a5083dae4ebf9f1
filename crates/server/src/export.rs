//! `GET /v1/ns/{ns}/export`: one tier's totals and subtotals over a range as streaming CSV
//! (SPEC §3), for analytics tools and `tally export --server`.
//!
//! The query is checked before the answer starts, so a bad one is a JSON error with its code
//! like any other. Rows are then written on the blocking pool into 64 KiB chunks that wait in
//! a queue of four for the client: a slow client slows the export, it never grows in memory.
//! Each page of keys has its own `[limits] query_timeout_ms`. The answer starts (`200`) at
//! the first row found or once the first page is read: a failure before it is a JSON error
//! like any query's (a damaged segment's `500 corrupt_data`, a `503 query_timeout`); a
//! failure after it cuts the response off (no last chunk), so a client never takes a partial
//! export for a whole one. A client that goes away stops the export at its next chunk; one that
//! takes nothing for `[limits] body_timeout_ms`, or takes the answer slower than
//! `export_min_bytes_per_sec` (see [`Pace`]), is cut off. At most `max_concurrent_queries`
//! exports stream at once (each holds a permit of its own until it ends: it outlives its
//! handler and so the admission permit); past that, `503` with `Retry-After`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use hyper::body::{Bytes, Frame};
use tally_core::ErrorCode;
use tally_core::query::{self, ExportQuery, Row, csv_field};
use tally_core::store::Deadline;
use tokio::sync::mpsc;

use crate::app::App;
use crate::auth;
use crate::config::Action;
use crate::error::ApiError;
use crate::params;

/// The first line of every export.
pub const HEADER: &str = "ns,key,ts,resolution,dim,value,n\n";
/// Bytes per chunk sent.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks waiting for the client at most.
const QUEUED_CHUNKS: usize = 4;

/// One tier's totals and subtotals of every key as CSV rows.
#[utoipa::path(get, path = "/v1/ns/{ns}/export", tag = "queries",
    description = "Streaming CSV `ns,key,ts,resolution,dim,value,n` (header first): every key's totals (empty `dim` and `value`) and subtotals in the tier `resolution` over [from, to) widened to whole buckets, zero counts left out, and so are a dimension's buckets from before a schema change began counting it; keys in byte order. `ts` is the bucket's start in unix seconds. A tier that is not whole from the range's start (added, or made a breakdown tier, by a schema change since) is `422 no_tier_for_range`. The answer starts at the first row or once the first page of keys is read: a failure before that is a JSON error like any query's (`500 corrupt_data`, `503 query_timeout`); one after it cuts the stream off without its last chunk.",
    params(("ns" = String, Path), ("from" = String, Query), ("to" = String, Query), ("resolution" = String, Query, description = "one of the namespace's tiers, e.g. 1h")),
    responses((status = 200, description = "CSV rows", content_type = "text/csv"), (status = 422, description = "no_tier_for_range")))]
pub async fn export(
    State(app): State<App>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Read, &ns)?;
    let p = params::unique(q.as_deref())?;
    if let Some(k) = p
        .keys()
        .find(|k| !["from", "to", "resolution"].contains(&k.as_str()))
    {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!("unknown parameter {k:?}; export takes from, to, resolution"),
        )
        .field(k.clone()));
    }
    let Ok(permit) = app.exports().clone().try_acquire_owned() else {
        let mut busy = ApiError::new(
            ErrorCode::BackendUnavailable,
            format!(
                "{} exports are streaming already ([limits] max_concurrent_queries); try again soon",
                app.settings().server.max_concurrent_queries
            ),
        )
        .into_response();
        busy.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
        return Ok(busy);
    };
    let max_points = app.settings().limits.max_points;
    let plan = app
        .query(move |app, deadline| {
            deadline.check()?;
            let q = ExportQuery::parse(&ns, &p)?;
            Ok(query::export_plan(
                &**app.store(),
                &q,
                max_points,
                app.now(),
            )?)
        })
        .await?;
    let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
    // Set once the last chunk is queued: a stream that ends without it was cut off, and the
    // body then ends in an error (no last chunk), never like a whole export.
    let complete = Arc::new(AtomicBool::new(false));
    let done_flag = complete.clone();
    let timeout = Duration::from_millis(app.settings().server.query_timeout_ms);
    // A client that takes none of the answer for this long, or takes it slower than
    // `export_min_bytes_per_sec`, is cut off: it holds an export permit and a blocking
    // thread meanwhile.
    let mut pace = Pace::new(
        Duration::from_millis(app.settings().server.body_timeout_ms),
        app.settings().server.export_min_bytes_per_sec,
    );
    let handle = tokio::runtime::Handle::current();
    // Told once: at the first row or once the first page of keys is read (the answer then
    // starts, 200), or at the end, with the error of an export that failed before — answered
    // as any query's error is, with its code, rather than a 200 cut off before its first
    // byte. The handler waits for it, holding its admission permit, for one page at most:
    // as long as any query may.
    let (started_tx, started) = tokio::sync::oneshot::channel::<Result<(), ApiError>>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    // Set as soon as the client goes away (the body, and so the receiver, dropped): every
    // page's deadline shares it, so the scan stops at once even if it has found no row to
    // send (an export of a sparse range learns of it at no chunk).
    let cancelled = Arc::new(AtomicBool::new(false));
    let watch = {
        let (tx, cancelled) = (tx.clone(), cancelled.clone());
        tokio::spawn(async move {
            tx.closed().await;
            cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        // However this ends (a panic included), the watch goes, and with it the last sender
        // besides this closure's: the body then ends, cut off unless complete.
        struct Unwatch(tokio::task::JoinHandle<()>);
        impl Drop for Unwatch {
            fn drop(&mut self) {
                self.0.abort();
            }
        }
        let _unwatch = Unwatch(watch);
        let start = |r: Result<(), ApiError>| {
            let t = started_tx
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            t.map(|t| t.send(r)).is_some()
        };
        let mut send = |chunk: Result<Bytes, std::io::Error>| {
            let len = chunk.as_ref().map_or(0, Bytes::len);
            let started = std::time::Instant::now();
            let sent = handle
                .block_on(tokio::time::timeout(pace.allowance(len), tx.send(chunk)))
                .is_ok_and(|sent| sent.is_ok());
            pace.waited(len, started.elapsed());
            sent
        };
        let mut buf = String::with_capacity(CHUNK_BYTES + 4096);
        buf.push_str(HEADER);
        let (ns, res) = (plan.ns.to_string(), plan.resolution.to_string());
        // Each page asks for its deadline first: the second ask means the first page was read.
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let deadline = || {
            if pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 1 {
                start(Ok(()));
            }
            Deadline::new(timeout, cancelled.clone())
        };
        let mut cut = false;
        let done = query::export(&**app.store(), &plan, &deadline, &mut |row| {
            start(Ok(()));
            write_row(&mut buf, &ns, &res, row);
            if buf.len() < CHUNK_BYTES {
                return true;
            }
            let chunk = Bytes::from(std::mem::take(&mut buf).into_bytes());
            let sent = send(Ok(chunk));
            cut |= !sent;
            sent
        });
        let done = match done {
            // Nothing sent yet: the handler answers with the error.
            Err(e) if start(Err(ApiError::from(e.clone()))) => return,
            done => {
                start(Ok(()));
                done
            }
        };
        // A client that went away ended it; one still there was too slow.
        let cut_off = || {
            if cancelled.load(std::sync::atomic::Ordering::SeqCst) {
                tracing::debug!(ns = %ns, "an export's client went away before its end");
            } else {
                tracing::warn!(
                    ns = %ns,
                    "an export was cut off: its client took nothing for body_timeout_ms, or \
                     read slower than [limits] export_min_bytes_per_sec"
                );
            }
        };
        match done {
            Ok(()) if !cut => {
                if buf.is_empty() || send(Ok(Bytes::from(buf.into_bytes()))) {
                    done_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                } else {
                    cut_off();
                }
            }
            Ok(()) => cut_off(),
            Err(_) if cancelled.load(std::sync::atomic::Ordering::SeqCst) => cut_off(),
            Err(e) => {
                tracing::warn!(error = %e, "an export failed after its answer started; cutting it off");
                send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    // One page at most, bounded as any query is (a page checks its deadline between the
    // store's calls, not inside them); giving up drops the receiver, which stops the scan.
    let ms = timeout.as_millis();
    match tokio::time::timeout(timeout + Duration::from_millis(50), started).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(e),
        Ok(Err(_)) => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "the export stopped before it started (see the server's log)",
            ));
        }
        Err(_) => {
            return Err(ApiError::new(
                ErrorCode::QueryTimeout,
                format!("the export's first page ran past {ms} ms ([limits] query_timeout_ms)"),
            ));
        }
    }
    Ok((
        [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
        Body::new(Chunks(rx, complete)),
    )
        .into_response())
}

/// How long an export may wait to hand its client the next chunk. Its client must take
/// each chunk within the stall timeout, and must take the whole answer at the minimum rate:
/// the time the export has waited on it, all chunks together, may pass `grace + bytes /
/// min_rate` by nothing. Only time spent waiting counts (a scan that finds rows slowly costs
/// its client nothing), so a client keeping up is never cut off; one that reads steadily
/// but slowly, never stalling long enough to trip the stall timeout, is cut off once it has
/// used up its grace instead of holding an export permit for as long as it likes.
struct Pace {
    stall: Duration,
    min_rate: f64,
    bytes: u64,
    waited: Duration,
}

impl Pace {
    fn new(stall: Duration, min_bytes_per_sec: usize) -> Pace {
        Pace {
            stall,
            min_rate: min_bytes_per_sec.max(1) as f64,
            bytes: 0,
            waited: Duration::ZERO,
        }
    }

    /// How long the next send, of `len` bytes, may wait.
    fn allowance(&self, len: usize) -> Duration {
        let earned =
            self.stall + Duration::from_secs_f64((self.bytes + len as u64) as f64 / self.min_rate);
        earned.saturating_sub(self.waited).min(self.stall)
    }

    /// A send of `len` bytes waited `took`.
    fn waited(&mut self, len: usize, took: Duration) {
        self.bytes += len as u64;
        self.waited += took;
    }
}

/// The chunks as a response body; an error, or an end before the producer said it was
/// complete, ends it without its last chunk.
pub(crate) struct Chunks(
    pub(crate) mpsc::Receiver<Result<Bytes, std::io::Error>>,
    pub(crate) Arc<AtomicBool>,
);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let complete = self.1.clone();
        self.0.poll_recv(cx).map(|o| match o {
            Some(r) => Some(r.map(Frame::data)),
            None if complete.load(std::sync::atomic::Ordering::SeqCst) => None,
            None => Some(Err(std::io::Error::other("the export was cut off"))),
        })
    }
}

/// Appends one CSV row (RFC 4180: a field with a comma or a quote is quoted, quotes doubled;
/// keys and values hold no control characters, so no line breaks).
pub fn write_row(out: &mut String, ns: &str, resolution: &str, row: &Row<'_>) {
    use std::fmt::Write;
    csv_field(out, ns);
    out.push(',');
    csv_field(out, row.key);
    let _ = write!(out, ",{},{resolution},", row.ts);
    csv_field(out, row.dim);
    out.push(',');
    csv_field(out, row.value);
    let _ = writeln!(out, ",{}", row.n);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_slower_than_the_minimum_rate_runs_out_of_allowance() {
        let ms = Duration::from_millis;
        // 64 KiB/s, 1 s of grace: a chunk of 64 KiB earns a second of waiting.
        let mut p = Pace::new(ms(1000), 64 * 1024);
        assert_eq!(
            p.allowance(64 * 1024),
            ms(1000),
            "capped by the stall timeout"
        );
        // A client at the rate (1 s per chunk) keeps its grace for good.
        for _ in 0..100 {
            p.waited(64 * 1024, ms(1000));
            assert_eq!(p.allowance(64 * 1024), ms(1000));
        }
        // One at half the rate (2 s per chunk, each under a stall timeout of 3 s) loses a
        // second a chunk: its grace is gone after one, and then it has what it earns.
        let mut p = Pace::new(ms(3000), 64 * 1024);
        p.waited(64 * 1024, ms(2000));
        assert_eq!(p.allowance(64 * 1024), ms(3000));
        p.waited(64 * 1024, ms(2000));
        assert_eq!(p.allowance(64 * 1024), ms(2000));
        p.waited(64 * 1024, ms(2000));
        assert_eq!(p.allowance(64 * 1024), ms(1000));
        p.waited(64 * 1024, ms(1000));
        assert_eq!(p.allowance(64 * 1024), ms(1000));
        p.waited(64 * 1024, ms(2000));
        assert_eq!(p.allowance(0), Duration::ZERO, "out of allowance: cut off");
    }

    /// Through the handler itself, no sockets: the only buffer between the scan and the
    /// client is the queue of chunks, so the client's pace is exactly what the export sees
    /// (a socket's buffers take megabytes before the server waits). A client taking a
    /// chunk every 350 ms never stalls for `body_timeout_ms` (500) but takes ~190 KB/s,
    /// below the minimum of 4 MiB/s: it is cut off, its body ending in an error. One that
    /// takes chunks as they come gets the export whole. (At 200 ms a chunk, a debug build
    /// on a loaded machine made chunks nearly as slowly as the client took them, so the
    /// export hardly waited: CI failed once.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_reading_below_the_minimum_rate_is_cut_off() {
        use http_body_util::BodyExt;
        const NOW: i64 = 1_795_176_000;
        let clock = Arc::new(tally_core::store::ManualClock::new(NOW));
        let store = Arc::new(tally_core::reference::MemStore::new(clock.clone()));
        let settings = crate::config::Settings::from_toml(
            "[limits]\nbody_timeout_ms = 500\nexport_min_bytes_per_sec = 4194304",
        )
        .unwrap();
        let app = App::new(store, settings, clock);
        let (mut router, _) = crate::router::router(app.clone());
        for part in 0..4 {
            let body: String = (0..10_000)
                .map(|i| format!("{{\"ns\":\"big\",\"key\":\"k{part}{i:05}\",\"ts\":{NOW}}}\n"))
                .collect();
            let req = axum::http::Request::post("/v1/events")
                .header("content-type", "application/x-ndjson")
                .body(Body::from(body))
                .unwrap();
            let resp = tower::Service::call(&mut router, req).await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        let query = format!("from={NOW}&to={}&resolution=1h", NOW + 1);
        let export = |app: App| {
            let query = query.clone();
            async move {
                let resp = export(
                    State(app),
                    Path("big".to_owned()),
                    RawQuery(Some(query)),
                    HeaderMap::new(),
                )
                .await
                .unwrap();
                assert_eq!(resp.status(), 200);
                resp.into_body()
            }
        };
        // Taken as it comes: whole.
        let whole = export(app.clone())
            .await
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let rows = whole.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(rows, 40_001);
        // Taken slowly: cut off before its end.
        let mut body = export(app).await;
        let (mut got, mut chunks) = (0, 0);
        let cut = loop {
            match body.frame().await {
                None => break false,
                Some(Err(_)) => break true,
                Some(Ok(f)) => {
                    got += f.into_data().map_or(0, |d| d.len());
                    chunks += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(350)).await;
        };
        assert!(
            cut,
            "a client at a twentieth of the minimum rate took the whole export"
        );
        assert!(got < whole.len(), "{got} of {} bytes", whole.len());
        assert!(
            chunks >= 4,
            "cut off before its grace was spent: {chunks} chunks"
        );
    }

    #[test]
    fn rows_quote_commas_and_quotes() {
        let mut out = String::new();
        let row = |key, dim, value, n| Row {
            key,
            ts: 3600,
            dim,
            value,
            n,
        };
        write_row(&mut out, "clicks", "1h", &row("k", "", "", 5));
        write_row(
            &mut out,
            "clicks",
            "1h",
            &row("a,b", "ref", "say \"hi\"", -2),
        );
        assert_eq!(
            out,
            "clicks,k,3600,1h,,,5\nclicks,\"a,b\",3600,1h,ref,\"say \"\"hi\"\"\",-2\n"
        );
    }
}

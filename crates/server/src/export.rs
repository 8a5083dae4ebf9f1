//! `GET /v1/ns/{ns}/export`: one tier's totals and subtotals over a range as streaming CSV
//! (SPEC §3), for analytics tools and `tally export --server`.
//!
//! The query is checked before the answer starts, so a bad one is a JSON error with its code
//! like any other. Rows are then written on the blocking pool into 64 KiB chunks that wait in
//! a queue of four for the client: a slow client slows the export, it never grows in memory.
//! Each page of keys has its own `[limits] query_timeout_ms`; a failure after the answer
//! started cuts the response off (no last chunk), so a client never takes a partial export
//! for a whole one. A client that goes away stops the export at its next chunk, and one that
//! takes nothing for `[limits] body_timeout_ms` is cut off. At most `max_concurrent_queries`
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
    description = "Streaming CSV `ns,key,ts,resolution,dim,value,n` (header first): every key's totals (empty `dim` and `value`) and subtotals in the tier `resolution` over [from, to) widened to whole buckets, zero counts left out; keys in byte order. `ts` is the bucket's start in unix seconds.",
    params(("ns" = String, Path), ("from" = String, Query), ("to" = String, Query), ("resolution" = String, Query, description = "one of the namespace's tiers, e.g. 1h")),
    responses((status = 200, description = "CSV rows", content_type = "text/csv")))]
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
    // A client that takes none of the answer for this long is cut off: it holds a query
    // permit and a blocking thread meanwhile.
    let stalled = Duration::from_millis(app.settings().server.body_timeout_ms);
    let handle = tokio::runtime::Handle::current();
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
        let send = |chunk: Result<Bytes, std::io::Error>| {
            handle
                .block_on(tokio::time::timeout(stalled, tx.send(chunk)))
                .is_ok_and(|sent| sent.is_ok())
        };
        let mut buf = String::with_capacity(CHUNK_BYTES + 4096);
        buf.push_str(HEADER);
        let (ns, res) = (plan.ns.to_string(), plan.resolution.to_string());
        let deadline = || Deadline::new(timeout, cancelled.clone());
        let mut cut = false;
        let done = query::export(&**app.store(), &plan, &deadline, &mut |row| {
            write_row(&mut buf, &ns, &res, row);
            if buf.len() < CHUNK_BYTES {
                return true;
            }
            let chunk = Bytes::from(std::mem::take(&mut buf).into_bytes());
            let sent = send(Ok(chunk));
            cut |= !sent;
            sent
        });
        match done {
            Ok(()) if !cut => {
                if buf.is_empty() || send(Ok(Bytes::from(buf.into_bytes()))) {
                    done_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, "an export failed after its answer started; cutting it off");
                send(Err(std::io::Error::other(e.to_string())));
            }
        }
        watch.abort();
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
        Body::new(Chunks(rx, complete)),
    )
        .into_response())
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

//! The connection layer: the accept loop, each connection's clock, TLS, and which router
//! answers — [`serve`] and [`serve_with`].
//!
//! - **Connections.** At most `[limits] max_connections` are open; one more is accepted and
//!   closed at once (so its client learns at once instead of hanging in the backlog),
//!   counted in `tally_connections_refused_total{reason="max_connections"}` and logged at
//!   most once a second. A failed `accept` (out of file descriptors) is counted under
//!   `reason="accept_error"`, logged at most once a second, and the loop backs off
//!   [`ACCEPT_BACKOFF`] before trying again: it never spins and never stalls in silence.
//! - **Each connection's clock** ([`Activity`]) is in one of three phases. *Head*: from
//!   the accept (the TLS handshake included), or from the first byte of a keep-alive
//!   connection's next request, the request line and headers must arrive within
//!   `header_timeout_ms` (slowloris). *Idle*: a keep-alive connection with no request is
//!   closed after `idle_timeout_ms`. *Busy*: a request is being served — its body is timed
//!   by the admission middleware (`body_timeout_ms`, see `admission.rs`), its query by
//!   `query_timeout_ms`; only a client that stops reading its answer for `idle_timeout_ms`
//!   is cut off. hyper's own `header_read_timeout` is not used: it starts as soon as a
//!   keep-alive connection waits for its next request, so it would also be the idle timeout.
//! - **Shutdown.** When `shutdown` completes, the port closes, idle and half-sent
//!   connections are dropped, requests being served finish, then [`serve_with`] returns.
//! - **What answers** is a [`Routes`]: a stand-in answering 503 while the engine recovers,
//!   then the app's router — so the port is open (and `/healthz` says so) during recovery.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tally_core::ErrorCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use crate::app::App;
use crate::bare::JsonBare;
use crate::body::Holding;
use crate::config::ServerLimits;
use crate::error::ApiError;
use crate::metrics::Connections;
use crate::tls::Tls;

/// How long the accept loop waits after a failed `accept` before trying again.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Header fields hyper parses in one request head; more, and hyper answers a bare `431`
/// itself. Above the admission middleware's own bound, which answers in JSON.
const HYPER_MAX_HEADERS: usize = 1024;

/// Serves `app` on `listener` over plain HTTP with the app's `[limits]` until `shutdown`
/// completes, then stops accepting and finishes in-flight requests.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let limits = app.settings().server;
    let routes = Routes::recovering();
    routes.ready(&app);
    serve_with(listener, limits, routes, None, shutdown).await
}

/// Serves whatever `routes` answers with, over TLS when `tls` is given, until `shutdown`
/// completes; then closes the port, drops idle connections, lets requests being served
/// finish, and returns.
pub async fn serve_with(
    listener: TcpListener,
    limits: ServerLimits,
    routes: Routes,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let stats = routes.connections();
    let refused_log = Throttle::default();
    let accept_log = Throttle::default();
    // Every connection holds a receiver; `closed()` on the sender is the drain.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if per_connection(&e) => continue,
            Err(e) => {
                stats.refused_accept_error.fetch_add(1, Ordering::Relaxed);
                if let Some(more) = accept_log.ready() {
                    tracing::warn!(
                        error = %e,
                        also_failed = more,
                        "accepting a connection failed; backing off {} ms",
                        ACCEPT_BACKOFF.as_millis()
                    );
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            stats
                .refused_max_connections
                .fetch_add(1, Ordering::Relaxed);
            if let Some(more) = refused_log.ready() {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    also_refused = more,
                    "refused a connection: max_connections are open"
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            routes: routes.clone(),
            limits,
            stop: stop_rx.clone(),
            open: OpenGuard::new(stats.clone()),
            _slot: slot,
        };
        let tls = tls.clone();
        tokio::spawn(conn.run(stream, tls));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(stop_rx);
    stop_tx.closed().await;
    Ok(())
}

/// Errors of one connection that `accept` reports (it was reset before we took it):
/// nothing is wrong with the listener, so no back-off.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// What the server answers with: a stand-in while the engine recovers, then the app.
#[derive(Clone)]
pub struct Routes(Arc<RoutesInner>);

struct RoutesInner {
    current: RwLock<Router>,
    connections: Arc<Connections>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes").finish_non_exhaustive()
    }
}

impl Routes {
    /// Answers `503 backend_unavailable` (with `Retry-After: 1`) until [`Routes::ready`];
    /// `/healthz` adds `"status": "recovering"` to the error.
    pub fn recovering() -> Routes {
        fn unavailable() -> ApiError {
            ApiError::new(
                ErrorCode::BackendUnavailable,
                "recovering the log; try again shortly",
            )
        }
        fn retry_after(mut r: axum::response::Response) -> axum::response::Response {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            r
        }
        let router = Router::new()
            .route(
                "/healthz",
                axum::routing::any(|| async {
                    let mut body = unavailable().to_json();
                    body["status"] = serde_json::json!("recovering");
                    retry_after(
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            axum::Json(body),
                        )
                            .into_response(),
                    )
                }),
            )
            // Built here rather than by `ApiError::into_response`, which logs every 5xx at
            // ERROR: a restart's expected refusals are not errors (a review saw the log
            // fill with them).
            .fallback(|| async {
                retry_after(
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(unavailable().to_json()),
                    )
                        .into_response(),
                )
            });
        Routes(Arc::new(RoutesInner {
            current: RwLock::new(router),
            connections: Arc::new(Connections::default()),
        }))
    }

    /// From now on, new requests go to `app`'s router.
    pub fn ready(&self, app: &App) {
        let (router, _) = crate::router::router(app.clone());
        app.metrics().attach_connections(self.0.connections.clone());
        *self.0.current.write().unwrap_or_else(|e| e.into_inner()) = router;
    }

    fn current(&self) -> Router {
        self.0
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn connections(&self) -> Arc<Connections> {
        self.0.connections.clone()
    }
}

/// One accepted connection and what it holds while open.
struct Conn {
    routes: Routes,
    limits: ServerLimits,
    stop: watch::Receiver<bool>,
    open: OpenGuard,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Conn {
    async fn run(mut self, stream: tokio::net::TcpStream, tls: Option<Tls>) {
        let activity = Arc::new(Activity::new(&self.limits));
        let io = Watched {
            inner: stream,
            activity: activity.clone(),
        };
        let Some(tls) = tls else {
            return self.drive(io, activity).await;
        };
        let handshake = tokio::time::timeout(
            Duration::from_millis(self.limits.header_timeout_ms),
            tls.0.accept(io),
        );
        let stream = tokio::select! {
            r = handshake => r,
            _ = self.stop.changed() => return,
        };
        match stream {
            Ok(Ok(s)) => self.drive(s, activity).await,
            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake timed out"),
        }
    }

    async fn drive<S>(mut self, io: S, activity: Arc<Activity>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let routes = self.routes.clone();
        let busy = activity.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let mut router = routes.current();
            let guard = busy.begin();
            async move {
                let resp = tower::Service::call(&mut router, req.map(Body::new)).await;
                let resp = match resp {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(resp.map(|b| {
                    // The request's busy guard, held until hyper has taken the last of the
                    // answer (see `Holding`).
                    Body::new(Holding::new(b, guard))
                }))
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_headers(HYPER_MAX_HEADERS);
        let conn = builder.serve_connection(TokioIo::new(JsonBare::new(io)), service);
        tokio::pin!(conn);
        let mut stopping = false;
        loop {
            let deadline = activity.deadline();
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    break;
                }
                _ = self.stop.changed(), if !stopping => {
                    stopping = true;
                    if !activity.is_busy() {
                        break;
                    }
                    conn.as_mut().graceful_shutdown();
                }
                () = activity.changed.notified() => {}
                () = tokio::time::sleep_until(deadline.unwrap_or_else(far_future)), if deadline.is_some() => {
                    if let Some(why) = activity.expired() {
                        tracing::debug!("closing a connection: {why}");
                        break;
                    }
                }
            }
        }
        drop(self.open);
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

/// Counts a connection open while it lives.
struct OpenGuard(Arc<Connections>);

impl OpenGuard {
    fn new(c: Arc<Connections>) -> OpenGuard {
        c.open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(c)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's phase, and when it must move on (see the module doc).
struct Activity {
    state: Mutex<Phase>,
    changed: Notify,
    header: Duration,
    idle: Duration,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// A request head is arriving, since then.
    Head(Instant),
    /// Waiting for the next request, since then.
    Idle(Instant),
    /// Serving `requests`; the client has not read our writes since `write_blocked`.
    Busy {
        requests: usize,
        write_blocked: Option<Instant>,
    },
}

impl Activity {
    fn new(limits: &ServerLimits) -> Activity {
        Activity {
            state: Mutex::new(Phase::Head(Instant::now())),
            changed: Notify::new(),
            header: Duration::from_millis(limits.header_timeout_ms),
            idle: Duration::from_millis(limits.idle_timeout_ms),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deadline(&self) -> Option<Instant> {
        match *self.phase() {
            Phase::Head(t) => Some(t + self.header),
            Phase::Idle(t) => Some(t + self.idle),
            Phase::Busy { write_blocked, .. } => write_blocked.map(|t| t + self.idle),
        }
    }

    /// Why the connection must close now, if it must.
    fn expired(&self) -> Option<&'static str> {
        let now = Instant::now();
        match *self.phase() {
            Phase::Head(t) if now >= t + self.header => {
                Some("the request head did not arrive within header_timeout_ms")
            }
            Phase::Idle(t) if now >= t + self.idle => Some("idle for idle_timeout_ms"),
            Phase::Busy {
                write_blocked: Some(t),
                ..
            } if now >= t + self.idle => Some("the client read nothing for idle_timeout_ms"),
            _ => None,
        }
    }

    fn is_busy(&self) -> bool {
        matches!(*self.phase(), Phase::Busy { .. })
    }

    /// A request is being served until the guard (moved into its answer's body) drops.
    fn begin(self: &Arc<Self>) -> BusyGuard {
        {
            let mut p = self.phase();
            *p = match *p {
                Phase::Busy {
                    requests,
                    write_blocked,
                } => Phase::Busy {
                    requests: requests + 1,
                    write_blocked,
                },
                _ => Phase::Busy {
                    requests: 1,
                    write_blocked: None,
                },
            };
        }
        self.changed.notify_one();
        BusyGuard(self.clone())
    }

    fn read(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut p = self.phase();
        if let Phase::Idle(_) = *p {
            *p = Phase::Head(Instant::now());
            drop(p);
            self.changed.notify_one();
        }
    }

    fn write(&self, blocked: bool) {
        let mut p = self.phase();
        if let Phase::Busy { write_blocked, .. } = &mut *p {
            match (blocked, write_blocked.is_some()) {
                (true, false) => {
                    *write_blocked = Some(Instant::now());
                    drop(p);
                    self.changed.notify_one();
                }
                (false, true) => *write_blocked = None,
                _ => {}
            }
        }
    }
}

struct BusyGuard(Arc<Activity>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        {
            let mut p = self.0.phase();
            if let Phase::Busy {
                requests,
                write_blocked,
            } = *p
            {
                *p = if requests > 1 {
                    Phase::Busy {
                        requests: requests - 1,
                        write_blocked,
                    }
                } else {
                    Phase::Idle(Instant::now())
                };
            }
        }
        self.0.changed.notify_one();
    }
}

/// The socket, telling the connection's [`Activity`] when bytes arrive and when the client
/// stops reading.
struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.activity.read(buf.filled().len() - before);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.activity.write(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.activity.write(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.activity.write(r.is_pending());
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Lets a log line through at most once a second, counting the ones it held back.
#[derive(Debug, Default)]
struct Throttle {
    last: Mutex<Option<Instant>>,
    held: std::sync::atomic::AtomicU64,
}

impl Throttle {
    /// `Some(held back since the last line)` when a line may be logged now.
    fn ready(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_lets_one_line_a_second_through() {
        let t = Throttle::default();
        assert_eq!(t.ready(), Some(0));
        assert_eq!(t.ready(), None);
        assert_eq!(t.ready(), None);
        *t.last.lock().unwrap() = Some(Instant::now() - Duration::from_secs(2));
        assert_eq!(t.ready(), Some(2));
    }
}

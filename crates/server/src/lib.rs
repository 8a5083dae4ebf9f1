//! tally's HTTP API (SPEC §3) over any [`Store`]: routes, authentication, errors mapped to
//! statuses in one place, idempotency keys, metrics and the OpenAPI document — which is
//! generated from the route handlers themselves, so it cannot drift from them.
//!
//! Store calls block (the embedded engine waits for fsync), so every one runs on tokio's
//! blocking pool, never on the async workers.

pub mod config;
mod error;
mod events;
mod metrics;
mod queries;
mod schemas;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::http::HeaderMap;
use tally_core::query::Ctx;
use tally_core::store::{Clock, Store};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use config::{Action, ConfigError, Scope, Settings, Token};
pub use error::ApiError;
use tally_core::ErrorCode;

/// Everything a request needs.
#[derive(Clone)]
pub struct App(Arc<Inner>);

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

struct Inner {
    store: Arc<dyn Store>,
    settings: Settings,
    clock: Arc<dyn Clock>,
    metrics: metrics::Metrics,
    /// Idempotency keys whose first request is still being processed, with its fingerprint.
    in_flight: Mutex<HashMap<String, String>>,
    openapi: OnceLock<String>,
}

impl App {
    pub fn new(store: Arc<dyn Store>, settings: Settings, clock: Arc<dyn Clock>) -> App {
        App(Arc::new(Inner {
            store,
            settings,
            clock,
            metrics: metrics::Metrics::default(),
            in_flight: Mutex::new(HashMap::new()),
            openapi: OnceLock::new(),
        }))
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.0.store
    }

    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    fn now(&self) -> i64 {
        self.0.clock.now()
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            now: self.now(),
            max_points: self.0.settings.limits.max_points,
        }
    }

    /// Creates or updates the namespaces the configuration file declares.
    pub fn apply_config_namespaces(&self) -> Result<(), tally_core::store::StoreError> {
        for (ns, schema) in &self.0.settings.namespaces {
            if self.0.store.schema(ns)?.as_ref() != Some(schema) {
                self.0.store.put_schema(ns, schema)?;
            }
        }
        Ok(())
    }

    /// Runs a store call on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let app = self.clone();
        tokio::task::spawn_blocking(move || f(&app))
            .await
            .map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("a request task failed: {e}"))
            })?
    }

    /// Checks the bearer token (when tokens are configured) against a scope.
    fn authorize(&self, headers: &HeaderMap, action: Action, ns: &str) -> Result<(), ApiError> {
        match self.token(headers)? {
            None => Ok(()),
            Some(t) if t.allows(action, ns) => Ok(()),
            Some(_) => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("this token has no {}:{ns} scope", action.as_str()),
            )),
        }
    }

    /// The caller's token: `None` when no tokens are configured.
    fn token(&self, headers: &HeaderMap) -> Result<Option<&Token>, ApiError> {
        let tokens = &self.0.settings.tokens;
        if tokens.is_empty() {
            return Ok(None);
        }
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::Unauthorized,
                    "send Authorization: Bearer <token>",
                )
            })?;
        tokens
            .iter()
            .find(|t| t.secret == given)
            .map(Some)
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "unknown token"))
    }
}

/// Reads a request body of at most `limit` bytes; a larger one is `413 body_too_large`.
async fn read_body(body: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("the body is larger than {limit} bytes"),
        )
    })
}

/// The router, and the OpenAPI document of its routes.
pub fn router(app: App) -> (Router, utoipa::openapi::OpenApi) {
    let (router, mut api) = OpenApiRouter::new()
        .routes(routes!(events::post_events))
        .routes(routes!(events::incr))
        .routes(routes!(queries::series))
        .routes(routes!(queries::breakdown))
        .routes(routes!(queries::window))
        .routes(routes!(queries::dashboard))
        .routes(routes!(queries::top))
        .routes(routes!(queries::keys))
        .routes(routes!(queries::batch))
        .routes(routes!(schemas::list))
        .routes(routes!(schemas::get, schemas::put))
        .routes(routes!(schemas::healthz))
        .routes(routes!(schemas::metrics))
        .routes(routes!(schemas::openapi))
        .with_state(app.clone())
        .split_for_parts();
    api.info.title = "tally".into();
    api.info.description = Some("A time-series counter database: SPEC §3, HTTP API v1.".into());
    api.info.version = env!("CARGO_PKG_VERSION").into();
    api.info.contact = None;
    api.info.license = Some(utoipa::openapi::License::new("MIT OR Apache-2.0"));
    let json = serde_json::to_string_pretty(&api).unwrap_or_else(|_| "{}".into());
    let _ = app.0.openapi.set(json);
    let app2 = app.clone();
    let router = router
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let app = app2.clone();
                async move {
                    let method = req.method().clone();
                    let resp = json_errors(next.run(req).await, &method).await;
                    app.0.metrics.response(resp.status().as_u16());
                    resp
                }
            },
        ));
    (router, api)
}

/// Requests served at once; more wait their turn. Bounds the blocking-pool threads and the
/// memory of bodies being parsed under a flood.
pub const MAX_CONCURRENT_REQUESTS: usize = 1024;

/// Errors that axum itself answers (a path segment that is not UTF-8 once decoded, a method
/// the route does not take) come as plain text: rewrap them in the `{"error": ...}` shape so
/// every error a client sees is JSON with a code.
async fn json_errors(
    resp: axum::response::Response,
    method: &axum::http::Method,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return resp;
    }
    let allow = resp.headers().get(axum::http::header::ALLOW).cloned();
    let text = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let err = match status.as_u16() {
        405 => {
            let allowed = allow
                .as_ref()
                .and_then(|a| a.to_str().ok())
                .unwrap_or("another method");
            ApiError::new(
                ErrorCode::NotFound,
                format!("no route for {method} here; this path takes {allowed}"),
            )
        }
        400 if text.contains("`key`") => ApiError::new(ErrorCode::InvalidKey, text).field("key"),
        400 if text.contains("`ns`") => ApiError::new(ErrorCode::InvalidName, text).field("ns"),
        400 => ApiError::new(ErrorCode::InvalidParameter, text),
        413 => ApiError::new(ErrorCode::BodyTooLarge, text),
        404 => ApiError::new(ErrorCode::NotFound, text),
        s if s < 500 => ApiError::new(ErrorCode::MalformedBody, text),
        _ => ApiError::new(ErrorCode::Internal, text),
    };
    let mut out = err.into_response();
    if let Some(a) = allow {
        out.headers_mut().insert(axum::http::header::ALLOW, a);
    }
    out
}

/// Serves until `shutdown` completes, then stops accepting and finishes in-flight requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (router, _) = router(app);
    let router = router.layer(tower::limit::ConcurrencyLimitLayer::new(
        MAX_CONCURRENT_REQUESTS,
    ));
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

//! The operational routes: `/healthz` (200 once recovery is done and the backend takes
//! writes), `/metrics` (Prometheus text) and `/openapi.json` — none needs a token, so a load
//! balancer or a scraper can call them — and `POST /v1/admin/compact`, which needs `admin:*`.

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::Value;
use tally_core::store::StoreError;

use crate::app::App;
use crate::auth;
use crate::config::Action;
use crate::error::ApiError;

/// How many `/healthz` and `/metrics` requests ask the backend at once; the others wait
/// their turn without holding a thread.
pub const OPS_PROBES: usize = 4;

/// 200 once recovery is done and the backend takes writes.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "`{\"status\": \"ok\"}`"), (status = 503, description = "backend_unavailable")))]
pub async fn healthz(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    let _turn = app.probe_turn().await;
    app.blocking(|app| Ok(app.store().health()?)).await?;
    Ok(Json(serde_json::json!({ "status": "ok" })))
}

/// Prometheus text.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format")))]
pub async fn metrics(State(app): State<App>) -> impl IntoResponse {
    let turn = app.probe_turn().await;
    let (gauges, health) = app
        .blocking(|app| Ok((app.store().gauges(), app.store().health())))
        .await
        .unwrap_or_else(|e| (Vec::new(), Err(StoreError::internal(e.message))));
    drop(turn);
    let mut text = app.metrics().render(&gauges);
    // A poisoned log writer (or Redis down) shows here as well as on /healthz (which says
    // why), so an alert can fire on it.
    let _ = writeln!(
        text,
        "# HELP tally_backend_healthy 1 when the backend takes writes, 0 when it does not.\n# TYPE tally_backend_healthy gauge"
    );
    let _ = writeln!(text, "tally_backend_healthy {}", u8::from(health.is_ok()));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "OpenAPI 3 document")))]
pub async fn openapi(State(app): State<App>) -> impl IntoResponse {
    let doc = app.openapi().unwrap_or("{}").to_owned();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        doc,
    )
}

/// Flushes closed periods into the archive and compacts it now, instead of within the
/// minute. Needs a token with the `admin:*` scope when tokens are configured.
#[utoipa::path(post, path = "/v1/admin/compact", tag = "operations",
    responses(
        (status = 200, description = "`{\"flushed_segments\", \"flushed_points\", \"log_files_removed\", \"merged\", \"written\", \"dropped\"}`"),
        (status = 401, description = "unauthorized"), (status = 403, description = "forbidden: admin:* is needed"),
        (status = 503, description = "backend_unavailable"),
    ))]
pub async fn compact(
    State(app): State<App>,
    headers: HeaderMap,
) -> Result<Json<tally_core::store::Maintenance>, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Admin, "*")?;
    let report = app.blocking(|app| Ok(app.store().maintain()?)).await?;
    Ok(Json(report))
}

//! The operational routes: `/healthz` (200 once recovery is done and the backend takes
//! writes), `/metrics` (Prometheus text) and `/openapi.json`. None needs a token, so a load
//! balancer or a scraper can call them.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::Value;

use crate::app::App;
use crate::error::ApiError;

/// 200 once recovery is done and the backend takes writes.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "`{\"status\": \"ok\"}`"), (status = 503, description = "backend_unavailable")))]
pub async fn healthz(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    app.blocking(|app| Ok(app.store().health()?)).await?;
    Ok(Json(serde_json::json!({ "status": "ok" })))
}

/// Prometheus text.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format")))]
pub async fn metrics(State(app): State<App>) -> impl IntoResponse {
    let gauges = app
        .blocking(|app| Ok(app.store().gauges()))
        .await
        .unwrap_or_default();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        app.metrics().render(&gauges),
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

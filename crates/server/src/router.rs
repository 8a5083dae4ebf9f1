//! The router: every route with its OpenAPI entry (collected by utoipa from the handlers, so
//! the document cannot drift from them; the dashboard's static files of `dashboard.rs`
//! included), the fallback, the admission middleware (see
//! `admission.rs`) and the one that makes every error JSON and counts responses.

use std::sync::Arc;

use axum::Router;
use tally_core::ErrorCode;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::admission::{self, Admission};
use crate::app::App;
use crate::error::ApiError;
use crate::{dashboard, events, export, ops, queries, rebuild, schemas};

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
        .routes(routes!(export::export))
        .routes(routes!(queries::batch))
        .routes(routes!(schemas::list))
        .routes(routes!(schemas::get, schemas::put))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .routes(routes!(ops::compact))
        .routes(routes!(rebuild::rebuild))
        .routes(routes!(dashboard::index))
        .routes(routes!(dashboard::app_js))
        .routes(routes!(dashboard::style_css))
        .with_state(app.clone())
        .split_for_parts();
    api.info.title = "tally".into();
    api.info.description = Some("A time-series counter database: SPEC §3, HTTP API v1.".into());
    api.info.version = env!("CARGO_PKG_VERSION").into();
    api.info.contact = None;
    api.info.license = Some(utoipa::openapi::License::new("MIT OR Apache-2.0"));
    let doc = crate::openapi::complete(&api, &app.settings().limits);
    let json = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into());
    app.set_openapi(json);
    let app2 = app.clone();
    let admission = Arc::new(Admission::new(app.clone()));
    let router = router
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                admission::admit(admission.clone(), req, next)
            },
        ))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let app = app2.clone();
                async move {
                    let method = req.method().clone();
                    let resp = json_errors(next.run(req).await, &method).await;
                    app.metrics().response(resp.status().as_u16());
                    resp
                }
            },
        ));
    (router, api)
}

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
    let text = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let err = match status.as_u16() {
        // axum adds the `Allow` header after this layer has seen the answer.
        405 => ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{method} is not allowed on this path; the Allow header lists what is"),
        ),
        400 if text.contains("`key`") => ApiError::new(ErrorCode::InvalidKey, text).field("key"),
        400 if text.contains("`ns`") => ApiError::new(ErrorCode::InvalidName, text).field("ns"),
        400 => ApiError::new(ErrorCode::InvalidParameter, text),
        413 => ApiError::new(ErrorCode::BodyTooLarge, text),
        404 => ApiError::new(ErrorCode::NotFound, text),
        s if s < 500 => ApiError::new(ErrorCode::MalformedBody, text),
        _ => ApiError::new(ErrorCode::Internal, text),
    };
    err.into_response()
}

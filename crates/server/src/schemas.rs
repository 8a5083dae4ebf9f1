//! Namespaces: `GET /v1/ns` (the ones the caller may read), `GET /v1/ns/{ns}` and
//! `PUT /v1/ns/{ns}` (create, or change a schema), answering schemas in their canonical form.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde_json::Value;
use tally_core::ErrorCode;
use tally_core::model::{Namespace, Schema, SchemaDoc};

use crate::app::App;
use crate::auth;
use crate::body::read_body;
use crate::config::Action;
use crate::error::ApiError;

fn schema_json(ns: &Namespace, s: &Schema) -> Value {
    let doc = s.to_doc();
    serde_json::json!({
        "name": ns.as_str(),
        "tiers": doc.tiers,
        "breakdown_tiers": doc.breakdown_tiers,
        "dimensions": doc.dimensions,
    })
}

/// Every namespace the caller may read, with its schema.
#[utoipa::path(get, path = "/v1/ns", tag = "namespaces",
    responses((status = 200, description = "`{\"namespaces\": [{\"name\", \"tiers\", \"breakdown_tiers\", \"dimensions\"}]}`")))]
pub async fn list(State(app): State<App>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let token = auth::caller(&app.settings().tokens, &headers)?.cloned();
    let all = app.blocking(|app| Ok(app.store().namespaces()?)).await?;
    let list: Vec<Value> = all
        .iter()
        .filter(|(ns, _)| {
            token
                .as_ref()
                .is_none_or(|t| t.allows(Action::Read, ns.as_str()))
        })
        .map(|(ns, s)| schema_json(ns, s))
        .collect();
    Ok(Json(serde_json::json!({ "namespaces": list })))
}

/// One namespace's schema.
#[utoipa::path(get, path = "/v1/ns/{ns}", tag = "namespaces",
    params(("ns" = String, Path)),
    responses((status = 200, description = "the schema"), (status = 404, description = "unknown_namespace")))]
pub async fn get(
    State(app): State<App>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Read, &ns)?;
    let ns = Namespace::new(&ns).map_err(|e| ApiError::from(e).field("ns"))?;
    app.blocking(move |app| match app.store().schema(&ns)? {
        Some(s) => Ok(Json(schema_json(&ns, &s))),
        None => Err(ApiError::new(
            ErrorCode::UnknownNamespace,
            format!("namespace {ns} does not exist"),
        )),
    })
    .await
}

/// Create a namespace or change its schema (a removed tier loses its data; a new tier
/// starts empty).
#[utoipa::path(put, path = "/v1/ns/{ns}", tag = "namespaces",
    params(("ns" = String, Path)),
    request_body(content = String, description = "`{\"tiers\": [...], \"breakdown_tiers\": [...], \"dimensions\": [...] or null}`", content_type = "application/json"),
    responses((status = 200, description = "the stored schema, durations in canonical form"), (status = 400, description = "invalid_schema, invalid_name, malformed_body"), (status = 422, description = "too_many_namespaces: a new namespace past `[limits] max_namespaces`"), (status = 503, description = "backend_unavailable: the backend cannot be reached, or (Redis) the schema is stored but the expiries of a tier whose retention grew are not all extended yet: send it again")))]
pub async fn put(
    State(app): State<App>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    auth::authorize(&app.settings().tokens, &headers, Action::Admin, &ns)?;
    let ns = Namespace::new(&ns).map_err(|e| ApiError::from(e).field("ns"))?;
    let bytes = read_body(body, 1 << 20).await?;
    let doc: SchemaDoc = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedBody,
            format!("expected {{\"tiers\", \"breakdown_tiers\"?, \"dimensions\"?}}: {e}"),
        )
    })?;
    let schema = Schema::from_input(&doc)?;
    app.blocking(move |app| {
        // A new namespace: held to max_namespaces with the creations in flight, in the turn
        // batches take to create theirs, and reserved until stored (a namespace is never
        // deleted, so one that exists needs neither).
        let mut reserved = None;
        if app.store().schema(&ns)?.is_none() {
            let batch = tally_core::store::Batch {
                create: vec![(ns.clone(), schema.clone())],
                ..Default::default()
            };
            let (reservation, over) = app.reserve_creations(&batch)?;
            if !over.is_empty() {
                let max = app.settings().limits.max_namespaces;
                return Err(ApiError::new(
                    ErrorCode::TooManyNamespaces,
                    tally_core::ingest::too_many_namespaces(ns.as_str(), max),
                )
                .field("ns"));
            }
            reserved = Some(reservation);
        }
        app.store().put_schema(&ns, &schema)?;
        drop(reserved);
        Ok(Json(schema_json(&ns, &schema)))
    })
    .await
}

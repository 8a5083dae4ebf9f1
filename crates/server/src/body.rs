//! Reading a request body under a byte limit: the one place a body enters memory, so the
//! limit cannot be forgotten by a new route.

use axum::body::{Body, Bytes};
use tally_core::ErrorCode;

use crate::error::ApiError;

/// Reads a request body of at most `limit` bytes; a larger one is `413 body_too_large`.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("the body is larger than {limit} bytes"),
        )
    })
}

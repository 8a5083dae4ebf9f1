//! Reading a request body under a byte limit: the one place a body enters memory, so the
//! limit cannot be forgotten by a new route.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use hyper::body::{Frame, SizeHint};
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

/// An answer's body holding `G` (a guard, a permit) until hyper has taken the last of it
/// (or the connection went away). Chunked ([`Holding::chunked`]), data is handed to hyper
/// in copies of at most [`CHUNK`] bytes: hyper takes a body's frames into its own queue while that holds fewer than 16
/// of them (and under its buffer size), so a whole answer given in one frame would leave
/// the body, and drop what it holds, long before a slow client has read it. With small
/// copied chunks what hyper holds past the body is at most 16 chunks (128 KiB), and the
/// answer's own allocation goes with its last chunk.
pub(crate) struct Holding<G> {
    inner: Body,
    /// What is left of the last data frame, given out a chunk at a time.
    rest: Bytes,
    /// The most bytes a frame carries: [`CHUNK`], or unbounded (frames as they come).
    chunk: usize,
    _held: G,
}

/// The most bytes one frame of a chunked [`Holding`] body carries.
pub(crate) const CHUNK: usize = 8 * 1024;

impl<G> Holding<G> {
    /// Frames as the inner body gives them: `held` lasts until hyper has taken the last
    /// (what it holds past that is not its business — the connection's busy guard).
    pub(crate) fn new(inner: Body, held: G) -> Self {
        Holding {
            inner,
            rest: Bytes::new(),
            chunk: usize::MAX,
            _held: held,
        }
    }

    /// Frames of at most [`CHUNK`] copied bytes, so that `held` (an answer's charge) lasts
    /// until at most 16 of them wait in hyper's queue.
    pub(crate) fn chunked(inner: Body, held: G) -> Self {
        Holding {
            chunk: CHUNK,
            ..Holding::new(inner, held)
        }
    }
}

impl<G: Unpin> hyper::body::Body for Holding<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.rest.is_empty() {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    // Small enough already: as it is.
                    Ok(data) if data.len() <= self.chunk => {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(data) => self.rest = data,
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                other => return other,
            }
        }
        // A copy: a slice would keep the whole answer's allocation alive in hyper's queue.
        let n = self.rest.len().min(self.chunk);
        let chunk = Bytes::copy_from_slice(&self.rest[..n]);
        drop(self.rest.split_to(n));
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

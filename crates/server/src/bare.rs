//! JSON for the answers hyper writes itself. A request whose head hyper cannot parse — a
//! request line or header that is not HTTP/1.1, a target past its 64 KiB, headers past its
//! read buffer — never reaches the router: hyper answers `400`, `414` or `431` with an
//! empty body and closes the connection, with no hook to say more. Every other error of
//! the API is JSON with a code (SPEC §3), so [`JsonBare`] sits between hyper and the
//! connection and rewrites those heads, recognised by their exact form (`connection:
//! close` and `content-length: 0`, which no answer of tally's router has: its errors all
//! carry a JSON body), into the same answer with a JSON body. Everything else passes
//! through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tally_core::ErrorCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::admission::{MAX_HEADER_BYTES, MAX_HEADER_FIELDS, MAX_URI_BYTES};
use crate::error::ApiError;

/// The status lines hyper answers a head it cannot read with, and what tally says instead.
fn replacement(status_line: &[u8]) -> Option<ApiError> {
    Some(match status_line {
        b"HTTP/1.1 400 Bad Request" => ApiError::new(
            ErrorCode::MalformedRequest,
            "the request is not HTTP/1.1: its request line or a header could not be read; \
             nothing was done",
        ),
        b"HTTP/1.1 414 URI Too Long" => ApiError::new(
            ErrorCode::UriTooLong,
            format!(
                "the request target is longer than the server reads; at most {MAX_URI_BYTES} \
                 bytes are taken"
            ),
        ),
        b"HTTP/1.1 431 Request Header Fields Too Large" => ApiError::new(
            ErrorCode::HeadersTooLarge,
            format!(
                "the request's headers are larger than the server reads; at most \
                 {MAX_HEADER_FIELDS} fields in {MAX_HEADER_BYTES} bytes are taken"
            ),
        ),
        _ => return None,
    })
}

/// The answer to write instead of `head` (one whole response head with no body, as hyper
/// writes it), or `None` to write `head` as it is.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    // Most writes are other answers and their bodies: a look at the first line settles it.
    let first = &head[..head.len().min(64)];
    let status = &first[..first.windows(2).position(|w| w == b"\r\n")?];
    let error = replacement(status)?;
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let fields: Vec<&[u8]> = head
        .get(status.len() + 2..end)
        .unwrap_or_default()
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect();
    let has = |f: &[u8]| fields.iter().any(|l| l.eq_ignore_ascii_case(f));
    if !has(b"connection: close") || !has(b"content-length: 0") {
        return None;
    }
    let body = error.to_json().to_string();
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    out.extend_from_slice(status);
    out.extend_from_slice(b"\r\ncontent-type: application/json\r\n");
    for f in &fields {
        if f.len() >= 15 && f[..15].eq_ignore_ascii_case(b"content-length:") {
            out.extend_from_slice(format!("content-length: {}", body.len()).as_bytes());
        } else {
            out.extend_from_slice(f);
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    // Whatever followed the head in the same write (nothing, for these answers).
    out.extend_from_slice(&head[end + 4..]);
    Some(out)
}

/// A connection whose bare error answers from hyper get a JSON body (see the module).
pub struct JsonBare<T> {
    inner: T,
    /// A rewritten answer being written: its bytes, how many are written, and how many
    /// bytes of hyper's it stands for (reported once all of it is written).
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<T> JsonBare<T> {
    pub fn new(inner: T) -> Self {
        JsonBare {
            inner,
            pending: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> JsonBare<T> {
    /// Writes `buf`, or its rewrite; `Some` when it was one of hyper's bare answers.
    fn poll_rewritten(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Option<Poll<io::Result<usize>>> {
        if self.pending.is_none() {
            let out = rewrite(buf)?;
            self.pending = Some((out, 0, buf.len()));
        }
        let (out, written, stands_for) = self.pending.as_mut()?;
        while *written < out.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &out[*written..]) {
                Poll::Ready(Ok(0)) => {
                    self.pending = None;
                    return Some(Poll::Ready(Err(io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => {
                    self.pending = None;
                    return Some(Poll::Ready(Err(e)));
                }
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        let n = *stands_for;
        self.pending = None;
        Some(Poll::Ready(Ok(n)))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonBare<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonBare<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(r) = this.poll_rewritten(cx, buf) {
            return r;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        // hyper's bare answers are a head alone: the first slice that holds anything.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty())
            && let Some(r) = this.poll_rewritten(cx, first)
        {
            return r;
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(answer: &[u8]) -> serde_json::Value {
        let at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        serde_json::from_slice(&answer[at..]).unwrap()
    }

    #[test]
    fn hyper_s_bare_answers_get_a_json_body_and_the_rest_passes() {
        let date = "date: Sat, 28 Nov 2026 02:31:02 GMT";
        for (status, code) in [
            ("400 Bad Request", "malformed_request"),
            ("414 URI Too Long", "uri_too_long"),
            ("431 Request Header Fields Too Large", "headers_too_large"),
        ] {
            let bare = format!(
                "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\n{date}\r\n\r\n"
            );
            let out = rewrite(bare.as_bytes()).unwrap();
            let text = String::from_utf8(out.clone()).unwrap();
            assert!(
                text.starts_with(&format!("HTTP/1.1 {status}\r\n")),
                "{text}"
            );
            assert!(
                text.contains("content-type: application/json\r\n"),
                "{text}"
            );
            assert!(text.contains("connection: close\r\n"), "{text}");
            assert!(text.contains(date), "{text}");
            let body = body_of(&out);
            assert_eq!(body["error"]["code"], code, "{text}");
            let len = serde_json::to_string(&body).unwrap().len();
            assert!(
                text.contains(&format!("content-length: {len}\r\n")),
                "{text}"
            );
        }
        // The router's own answers (a JSON error, a success) and hyper's interim answers
        // pass as they are.
        for head in [
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n",
            "HTTP/1.1 400 Bad Request\r\n\r\n",
        ] {
            assert_eq!(rewrite(head.as_bytes()), None, "{head}");
        }
    }
}

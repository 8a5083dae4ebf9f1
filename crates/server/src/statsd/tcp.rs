//! StatsD over TCP: newline-delimited lines on long-lived connections (`[statsd] listen_tcp`,
//! `--statsd-tcp`).
//!
//! Only a line that ends in `\n` is parsed: a connection that closes, times out or is shut down
//! in the middle of a line drops that line as `malformed` ("the connection closed in the middle
//! of a line"), so a cut line is never counted as a shorter one. A line longer than
//! [`MAX_LINE_BYTES`] is dropped as `malformed` and the stream skipped to the next newline.
//! At most [`MAX_TCP_CONNECTIONS`] connections are served at once (more are closed at once,
//! with a log line at most once a second), and a connection idle for [`IDLE_SECS`] is closed.
//! While the store is behind, connections are not read, so TCP's own flow control slows the
//! senders: nothing is dropped for being fast.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tally_core::model::RawEvent;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use super::parse::{Rng, parse_line};
use super::{Ctx, Dropped, MAX_DATAGRAM_BYTES};

/// The longest line taken (as long as a whole datagram).
pub const MAX_LINE_BYTES: usize = MAX_DATAGRAM_BYTES;
/// Connections served at once.
pub const MAX_TCP_CONNECTIONS: usize = 256;
/// A connection silent this long is closed.
pub const IDLE_SECS: u64 = 300;
/// Bytes read at a time from one connection.
const READ_BYTES: usize = 64 * 1024;

/// Splits a byte stream into lines, bounded: it holds at most [`MAX_LINE_BYTES`] of an
/// unfinished line.
#[derive(Debug, Default)]
pub struct Framer {
    partial: Vec<u8>,
    /// Inside a line that was too long: drop bytes up to the next newline.
    skipping: bool,
}

/// What the framer found in a chunk.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed<'a> {
    Line(&'a [u8]),
    TooLong,
}

impl Framer {
    /// Feeds `chunk`, calling `out` with every complete line (without its `\n`) in order.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut dyn FnMut(Framed<'_>)) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            let (head, tail) = (&chunk[..i], &chunk[i + 1..]);
            if self.skipping {
                self.skipping = false;
            } else if self.partial.is_empty() {
                if head.len() > MAX_LINE_BYTES {
                    out(Framed::TooLong);
                } else {
                    out(Framed::Line(head));
                }
            } else if self.partial.len() + head.len() > MAX_LINE_BYTES {
                self.partial.clear();
                out(Framed::TooLong);
            } else {
                self.partial.extend_from_slice(head);
                out(Framed::Line(&self.partial));
                self.partial.clear();
            }
            chunk = tail;
        }
        if self.skipping {
            return;
        }
        if self.partial.len() + chunk.len() > MAX_LINE_BYTES {
            self.partial.clear();
            self.skipping = true;
            out(Framed::TooLong);
        } else {
            self.partial.extend_from_slice(chunk);
        }
    }

    /// Whether a line was cut: bytes after the last newline (blank ones aside).
    pub fn unfinished(&self) -> bool {
        self.partial.iter().any(|b| !b.is_ascii_whitespace())
    }
}

/// Accepts connections until `stop`, then waits for the connections to finish their lines.
pub(super) async fn accept(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    tx: mpsc::Sender<Vec<RawEvent>>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    let mut conns = JoinSet::new();
    let mut refused_log: Option<Instant> = None;
    let mut refused_since = 0u64;
    let mut number = 0u64;
    loop {
        let got = tokio::select! {
            _ = stop.changed() => break,
            got = listener.accept() => got,
        };
        // Reap finished connections so the set stays as small as the live ones.
        while conns.try_join_next().is_some() {}
        let stream = match got {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // EMFILE and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "statsd: accepting a TCP connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused_since += 1;
            if refused_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                tracing::warn!(
                    max = MAX_TCP_CONNECTIONS,
                    refused_since_last_log = refused_since,
                    "statsd: too many TCP connections; closing new ones"
                );
                refused_log = Some(Instant::now());
                refused_since = 0;
            }
            drop(stream);
            continue;
        };
        number += 1;
        let rng = Rng::new(ctx.seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (ctx, tx, stop) = (ctx.clone(), tx.clone(), stop.clone());
        conns.spawn(async move {
            let open = &ctx.app.metrics().statsd.tcp_connections;
            open.fetch_add(1, Ordering::Relaxed);
            connection(stream, &ctx, rng, &tx, stop).await;
            open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(tx);
    while conns.join_next().await.is_some() {}
}

/// Reads one connection's lines until it closes, idles out, or `stop`.
async fn connection(
    stream: TcpStream,
    ctx: &Ctx,
    mut rng: Rng,
    tx: &mpsc::Sender<Vec<RawEvent>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut framer = Framer::default();
    let mut buf = vec![0u8; READ_BYTES];
    let idle = Duration::from_secs(IDLE_SECS);
    // After a stop, what the connection's buffer holds already is read (up to
    // DRAIN_BYTES), without waiting for more.
    let mut drained = 0;
    let mut stopped = false;
    loop {
        let read = if stopped {
            // Straight to the socket, as the UDP drain: tokio's `try_read` answers "would
            // block" unless it has seen the socket ready since its last read.
            match std::io::Read::read(&mut &*socket2::SockRef::from(&stream), &mut buf) {
                Ok(n) if n > 0 && drained < DRAIN_BYTES => {
                    drained += n;
                    Ok(Ok(n))
                }
                _ => break,
            }
        } else {
            tokio::select! {
                _ = stop.changed() => {
                    stopped = true;
                    continue;
                }
                read = tokio::time::timeout(idle, read_some(&stream, &mut buf)) => read,
            }
        };
        let n = match read {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "statsd: a TCP connection failed");
                break;
            }
        };
        let mut events = Vec::new();
        framer.feed(buf.get(..n).unwrap_or_default(), &mut |f| {
            let line = match f {
                Framed::Line(l) => l,
                Framed::TooLong => {
                    ctx.drop_line(&Dropped::malformed(format!(
                        "a line longer than {MAX_LINE_BYTES} bytes"
                    )));
                    return;
                }
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                return;
            }
            match parse_line(line, &ctx.map, &mut rng) {
                Ok(raw) => events.push(raw),
                Err(d) => ctx.drop_line(&d),
            }
        });
        ctx.stamp(&mut events);
        if !events.is_empty() && tx.send(events).await.is_err() {
            return;
        }
    }
    if framer.unfinished() {
        ctx.drop_line(&Dropped::malformed(
            "the connection closed in the middle of a line",
        ));
    }
}

/// Bytes a connection reads after a stop at most.
const DRAIN_BYTES: usize = 4 << 20;

/// Reads what has arrived (0 at the end of the stream).
async fn read_some(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            got => return got,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn frame(chunks: &[&[u8]]) -> (Vec<String>, bool) {
        let mut f = Framer::default();
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c, &mut |x| {
                out.push(match x {
                    Framed::Line(l) => String::from_utf8(l.to_vec()).unwrap(),
                    Framed::TooLong => "<too long>".into(),
                })
            });
        }
        (out, f.unfinished())
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        assert_eq!(
            frame(&[b"a:1|c\nb:", b"2|c", b"\nc:3|c\n"]),
            (vec!["a:1|c".into(), "b:2|c".into(), "c:3|c".into()], false)
        );
        assert_eq!(frame(&[b"a:1|c\nb:2"]), (vec!["a:1|c".into()], true));
        assert_eq!(
            frame(&[b"a:1|c\n\n"]),
            (vec!["a:1|c".into(), "".into()], false)
        );
    }

    #[test]
    fn a_too_long_line_is_dropped_up_to_its_newline() {
        let long = vec![b'x'; MAX_LINE_BYTES + 1];
        // In one chunk with its newline.
        let mut one = long.clone();
        one.extend_from_slice(b"\nok:1|c\n");
        assert_eq!(
            frame(&[&one]),
            (vec!["<too long>".into(), "ok:1|c".into()], false)
        );
        // Arriving in pieces: reported once, the rest skipped, the next line kept.
        let (a, b) = long.split_at(40_000);
        assert_eq!(
            frame(&[a, b, b"yyyy", b"yy\nok:1|c\n"]),
            (vec!["<too long>".into(), "ok:1|c".into()], false)
        );
        // Exactly the maximum is a line.
        let mut max = vec![b'x'; MAX_LINE_BYTES];
        max.push(b'\n');
        let (x, y) = max.split_at(10);
        assert_eq!(frame(&[x, y]).0.len(), 1);
        assert_ne!(frame(&[x, y]).0[0], "<too long>");
    }
}

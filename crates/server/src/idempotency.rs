//! `Idempotency-Key` on `POST /v1/events` and `incr` (SPEC §3, after the IETF httpapi draft):
//! the keys whose first request is still running (a second one meanwhile is `409
//! idempotency_in_progress`), request fingerprints, and stored answers — replayed for the same
//! request, `422 idempotency_key_reused` for a different one.
//!
//! A stored answer is not written here: [`Ticket::record`] builds it before the batch is
//! applied and it travels in the batch, so the store keeps answer and increments in one
//! record and a retry after a crash finds both or neither.

use std::collections::HashSet;
use std::sync::Mutex;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tally_core::ErrorCode;
use tally_core::query::Accepted;
use tally_core::store::IdemRecord;

use crate::app::App;
use crate::auth;
use crate::config::Token;
use crate::error::ApiError;

/// How long an answer is remembered under its idempotency key.
const IDEMPOTENCY_SECS: i64 = 24 * 3600;

/// The header, as axum's lower-case lookup spells it.
pub(crate) const HEADER: &str = "idempotency-key";

/// Whether the client asked for idempotency: fingerprinting a large body costs, so only then.
pub(crate) fn requested(headers: &HeaderMap) -> bool {
    headers.contains_key(HEADER)
}

/// A stable fingerprint of a request (FNV-1a 64 and CRC32C): it is stored on disk, so it must
/// not depend on a hasher's per-process seed or version.
pub(crate) fn fingerprint(parts: &[&[u8]]) -> String {
    let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
    let mut crc = 0u32;
    for p in parts {
        for b in p.iter() {
            fnv = (fnv ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so that ["ab", "c"] and ["a", "bc"] differ.
        fnv = (fnv ^ 0xff).wrapping_mul(0x0100_0000_01b3);
        crc = crc32c::crc32c_append(crc, p);
    }
    format!("{fnv:016x}{crc:08x}")
}

/// The idempotency keys whose first request is still being processed. In memory only: after a
/// restart nothing is in flight, and a finished request's answer is in the store.
#[derive(Debug, Default)]
pub(crate) struct InFlight(Mutex<HashSet<String>>);

impl InFlight {
    /// Takes `key`; false when another request holds it.
    fn claim(&self, key: &str) -> bool {
        // std Mutex, not tokio's: no await while it is held.
        let mut keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if keys.contains(key) {
            return false;
        }
        keys.insert(key.to_owned());
        true
    }

    fn release(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// A key this request holds while it runs; released on drop, however the request ends.
#[derive(Debug)]
pub(crate) struct Held {
    app: App,
    ticket: Ticket,
}

impl Held {
    /// What the blocking part of the request needs to store its answer.
    pub(crate) fn ticket(&self) -> Ticket {
        self.ticket.clone()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.app.in_flight().release(&self.ticket.key);
    }
}

/// A first request's key and fingerprint, to be stored with its answer.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    key: String,
    fingerprint: String,
}

impl Ticket {
    /// The answer stored under this ticket's key now, if it is this request's (another one
    /// under the key is `422 idempotency_key_reused`). A limited increment asks once it is
    /// decided: another server may have decided the same request first (see
    /// `events::apply_limited`).
    pub(crate) fn stored(
        &self,
        store: &dyn tally_core::store::Store,
    ) -> Result<Option<IdemRecord>, ApiError> {
        match store.idempotency(&self.key)? {
            Some(r) if r.fingerprint == self.fingerprint => Ok(Some(r)),
            Some(_) => Err(ApiError::new(
                ErrorCode::IdempotencyKeyReused,
                "this Idempotency-Key was used for a different request",
            )),
            None => Ok(None),
        }
    }

    /// The record that travels in the batch: this answer, kept for 24 h from `now`.
    pub(crate) fn record(self, now: i64, answer: &Accepted) -> Result<IdemRecord, ApiError> {
        let body = serde_json::to_string(answer)
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        Ok(self.record_raw(now, 200, body))
    }

    /// The record of any answer: its status and JSON body (a limited increment's refusal).
    pub(crate) fn record_raw(self, now: i64, status: u16, body: String) -> IdemRecord {
        IdemRecord {
            key: self.key,
            fingerprint: self.fingerprint,
            expires: now + IDEMPOTENCY_SECS,
            status,
            body,
        }
    }
}

/// What to do with a request.
#[derive(Debug)]
pub(crate) enum Idem {
    /// No `Idempotency-Key`, or its first use: proceed, holding the key (if any) while running.
    Proceed(Option<Held>),
    /// Seen before with the same request: answer this, apply nothing.
    Replay(Response),
}

/// Looks at the request's `Idempotency-Key`: claims it, or finds its stored answer.
/// `fp` is the request's [`fingerprint`]; it is not looked at when there is no key.
pub(crate) async fn begin(app: &App, headers: &HeaderMap, fp: String) -> Result<Idem, ApiError> {
    let Some(key) = header_key(headers)? else {
        return Ok(Idem::Proceed(None));
    };
    // Each token has its own keys: one client's key never replays, blocks or reveals
    // another's request. Without tokens, the key is stored as the client sent it.
    let key = match auth::caller(&app.settings().tokens, headers)? {
        Some(token) => scoped(token, &key),
        None => key,
    };
    if !app.in_flight().claim(&key) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyInProgress,
            "a request with this Idempotency-Key is still being processed",
        ));
    }
    let held = Held {
        app: app.clone(),
        ticket: Ticket {
            key: key.clone(),
            fingerprint: fp.clone(),
        },
    };
    let seen = app
        .blocking(move |app| Ok(app.store().idempotency(&key)?))
        .await?;
    match seen {
        Some(r) if r.fingerprint == fp => {
            // Said so a client can tell "done now" from "done before" (`tally load` counts
            // the batches a re-run finds loaded already).
            let mut resp = replay(r.status, r.body);
            resp.headers_mut().insert(
                "idempotent-replayed",
                axum::http::HeaderValue::from_static("true"),
            );
            Ok(Idem::Replay(resp))
        }
        Some(_) => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            "this Idempotency-Key was used for a different request",
        )),
        None => Ok(Idem::Proceed(Some(held))),
    }
}

/// The request's `Idempotency-Key`, if it sent one: `400 invalid_parameter` unless it is 1-256
/// visible ASCII characters (a dry run checks it too, as the real request would).
pub(crate) fn header_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(key) = headers.get(HEADER) else {
        return Ok(None);
    };
    // Two keys would make the request two different promises: which one holds?
    if headers.get_all(HEADER).iter().nth(1).is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            "send one Idempotency-Key header, not several",
        )
        .field("Idempotency-Key"));
    }
    key.to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .map(|k| Some(k.to_owned()))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParameter,
                "Idempotency-Key must be 1-256 visible ASCII characters",
            )
            .field("Idempotency-Key")
        })
}

/// The stored key of a token's `Idempotency-Key`: a stable digest of the token (not the
/// secret itself: stored keys reach the log and the archive's manifest), then the key.
fn scoped(token: &Token, key: &str) -> String {
    let id = fingerprint(&[b"tally idempotency scope", token.secret.as_bytes()]);
    format!("t{id}:{key}")
}

/// A stored answer, sent again as it was (and an answer built as stored ones are). A `429`
/// carries its `retry_after` as a `Retry-After` header too.
pub(crate) fn replay(status: u16, body: String) -> Response {
    let retry_after = (status == 429)
        .then(|| serde_json::from_str::<serde_json::Value>(&body).ok())
        .flatten()
        .and_then(|v| v["error"]["retry_after"].as_i64());
    let status = axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::OK);
    let mut resp = (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    if let Some(s) = retry_after {
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(s.max(0)),
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_pinned_because_they_are_stored() {
        // A change here makes every stored key look "reused" after an upgrade.
        assert_eq!(fingerprint(&[]), "cbf29ce484222325".to_owned() + "00000000");
        assert_eq!(
            fingerprint(&[b"POST /v1/events", &[0], b"[]"]),
            fingerprint(&[b"POST /v1/events", &[0], b"[]"])
        );
        let a = fingerprint(&[b"ab", b"c"]);
        assert_ne!(a, fingerprint(&[b"a", b"bc"]));
        assert_ne!(a, fingerprint(&[b"abc"]));
        assert_eq!(a.len(), 24);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn tokens_have_their_own_keys() {
        let token = |secret: &str| Token {
            secret: secret.into(),
            scopes: Vec::new(),
        };
        let (a, b) = (token("alpha"), token("beta"));
        assert_ne!(scoped(&a, "k"), scoped(&b, "k"));
        assert_eq!(scoped(&a, "k"), scoped(&token("alpha"), "k"));
        assert_ne!(scoped(&a, "k"), scoped(&a, "k2"));
        assert!(!scoped(&a, "k").contains("alpha"));
        assert!(scoped(&a, "k").ends_with(":k"));
    }

    #[test]
    fn a_key_is_held_by_one_request_at_a_time() {
        let f = InFlight::default();
        assert!(f.claim("k"));
        assert!(!f.claim("k"));
        assert!(f.claim("other"));
        f.release("k");
        assert!(f.claim("k"));
    }

    #[test]
    fn a_record_keeps_the_answer_for_a_day() {
        let t = Ticket {
            key: "k".into(),
            fingerprint: "fp".into(),
        };
        let answer = Accepted {
            accepted: 3,
            window: None,
        };
        let r = t.record(1000, &answer).unwrap();
        assert_eq!(r.key, "k");
        assert_eq!(r.fingerprint, "fp");
        assert_eq!(r.expires, 1000 + 24 * 3600);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, r#"{"accepted":3}"#);
    }
}

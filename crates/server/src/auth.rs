//! Who the caller is and what it may do: the bearer token of a request, and its scope for a
//! namespace (SPEC §3). With no tokens configured, every request is allowed.
//!
//! Handlers authorize before they read a body or validate a parameter, so a caller without
//! a scope learns nothing about a namespace.

use axum::http::HeaderMap;
use tally_core::ErrorCode;

use crate::config::{Action, Token};
use crate::error::ApiError;

/// Checks the bearer token (when tokens are configured) against a scope.
pub(crate) fn authorize(
    tokens: &[Token],
    headers: &HeaderMap,
    action: Action,
    ns: &str,
) -> Result<(), ApiError> {
    match caller(tokens, headers)? {
        None => Ok(()),
        Some(t) if t.allows(action, ns) => Ok(()),
        Some(_) => Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("this token has no {}:{ns} scope", action.as_str()),
        )),
    }
}

/// The caller's token: `None` when no tokens are configured; `401` when tokens are
/// configured and the request has none of them.
pub(crate) fn caller<'t>(
    tokens: &'t [Token],
    headers: &HeaderMap,
) -> Result<Option<&'t Token>, ApiError> {
    if tokens.is_empty() {
        return Ok(None);
    }
    // Several would leave which one counts to the order of the headers.
    if headers
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "send one Authorization header, not several",
        ));
    }
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "send Authorization: Bearer <token>",
            )
        })?;
    tokens
        .iter()
        .find(|t| same_secret(t.secret.as_bytes(), given.as_bytes()))
        .map(Some)
        .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "unknown token"))
}

/// The token of an `Authorization: Bearer <token>` value: the scheme is matched without
/// regard to case (RFC 9110 §11.1), any spaces after it are skipped.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares two secrets without stopping at the first differing byte, so the time a wrong
/// token takes does not tell a caller how much of a secret it guessed (SPEC §3: constant
/// time). A secret's length can still show; it is not the secret.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the optimiser from turning the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Scope;

    fn tokens() -> Vec<Token> {
        vec![Token {
            secret: "s3cret".into(),
            scopes: vec![
                Scope::parse("write:clicks").unwrap(),
                Scope::parse("read:*").unwrap(),
            ],
        }]
    }

    fn bearer(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn secrets_match_only_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(same_secret(b"", b""));
        assert!(!same_secret(b"s3cret", b"s3creT"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"s3cret", b"s3crets"));
        assert!(!same_secret(b"", b"s"));
    }

    #[test]
    fn the_bearer_scheme_is_matched_without_case() {
        let t = tokens();
        for v in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "Bearer   s3cret",
        ] {
            assert!(caller(&t, &bearer(v)).unwrap().is_some(), "{v}");
        }
        for v in [
            "Bearer",
            "Bearer ",
            "Basic s3cret",
            "Bearers3cret",
            "s3cret",
        ] {
            let e = caller(&t, &bearer(v)).unwrap_err();
            assert_eq!(e.code, ErrorCode::Unauthorized, "{v}");
        }
    }

    #[test]
    fn without_tokens_everything_is_allowed() {
        let none = HeaderMap::new();
        assert!(caller(&[], &none).unwrap().is_none());
        assert!(authorize(&[], &none, Action::Admin, "clicks").is_ok());
    }

    #[test]
    fn a_missing_or_unknown_token_is_401() {
        let t = tokens();
        for h in [HeaderMap::new(), bearer("s3cret"), bearer("Bearer nope")] {
            let e = authorize(&t, &h, Action::Read, "clicks").unwrap_err();
            assert_eq!(e.code, ErrorCode::Unauthorized);
        }
        let e = caller(&t, &bearer("Bearer nope")).unwrap_err();
        assert_eq!(e.message, "unknown token");
    }

    #[test]
    fn a_known_token_needs_the_scope() {
        let t = tokens();
        let h = bearer("Bearer s3cret");
        assert!(authorize(&t, &h, Action::Write, "clicks").is_ok());
        assert!(authorize(&t, &h, Action::Read, "views").is_ok());
        let e = authorize(&t, &h, Action::Write, "views").unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
        assert_eq!(e.message, "this token has no write:views scope");
        let e = authorize(&t, &h, Action::Admin, "clicks").unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
    }
}

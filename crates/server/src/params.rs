//! Query strings: the one decoder of `a=1&b=2` (form encoding, `+` is a space) used by `incr`
//! and every GET query, so a parameter means the same on every route.
//!
//! Hand-written rather than `form_urlencoded` because it refuses what that crate passes
//! through: a bad escape and a value that is not UTF-8 once decoded are `400
//! invalid_parameter`, never a silently altered string.

use std::collections::BTreeMap;

use tally_core::ErrorCode;

use crate::error::ApiError;

/// Every `name=value` pair in order, decoded; a piece without `=` has an empty value, empty
/// pieces (`a=1&&b=2`) are skipped. Repeats are kept: each route says what a repeat means.
pub(crate) fn pairs(q: &str) -> Result<Vec<(String, String)>, ApiError> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let k = decode(k)?;
            // A bad value is named by its parameter.
            let v = decode(v).map_err(|e| e.field(k.clone()))?;
            Ok((k, v))
        })
        .collect()
}

/// The parameters of a query string by name, each given at most once.
pub(crate) fn unique(q: Option<&str>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (k, v) in pairs(q.unwrap_or(""))? {
        if out.contains_key(&k) {
            return Err(given_twice(k));
        }
        out.insert(k, v);
    }
    Ok(out)
}

/// The refusal of a parameter that appears twice.
pub(crate) fn given_twice(name: String) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidParameter,
        format!("{name} is given twice"),
    )
    .field(name)
}

/// One form-encoded component: `+` is a space, `%XX` a byte; the bytes must be UTF-8.
fn decode(s: &str) -> Result<String, ApiError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    // Two hex digits exactly: from_str_radix alone would take `+1`.
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => {
                        return Err(ApiError::new(
                            ErrorCode::InvalidParameter,
                            format!("bad percent-encoding in {s:?}"),
                        ));
                    }
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!("{s:?} is not UTF-8 once decoded"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(q: &str) -> Result<String, ApiError> {
        let mut p = pairs(q)?;
        assert_eq!(p.len(), 1, "{q}");
        let (k, v) = p.remove(0);
        assert_eq!(k, "a");
        Ok(v)
    }

    #[test]
    fn percent_escapes_decode_to_bytes() {
        assert_eq!(one("a=%41%62c").unwrap(), "Abc");
        assert_eq!(one("a=lnk%2F1").unwrap(), "lnk/1");
        assert_eq!(one("a=%26%3D%25").unwrap(), "&=%");
        // Either case of hex digit; a multi-byte character from its UTF-8 bytes.
        assert_eq!(one("a=caf%C3%A9").unwrap(), "café");
        assert_eq!(one("a=caf%c3%a9").unwrap(), "café");
        // A raw (unescaped) non-ASCII character passes as it is.
        assert_eq!(one("a=café").unwrap(), "café");
        // Names are decoded too.
        assert_eq!(
            pairs("dim.c%6Funtry=US").unwrap(),
            [("dim.country".to_owned(), "US".to_owned())]
        );
    }

    #[test]
    fn plus_is_a_space_and_an_escaped_plus_is_a_plus() {
        assert_eq!(one("a=New+York").unwrap(), "New York");
        assert_eq!(one("a=1%2B1").unwrap(), "1+1");
        assert_eq!(one("a=%20+").unwrap(), "  ");
    }

    #[test]
    fn pieces_keep_their_order_and_repeats() {
        assert_eq!(
            pairs("b=2&&a=1&b=3&flag&e=&x=y=z").unwrap(),
            [
                ("b".to_owned(), "2".to_owned()),
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "3".to_owned()),
                ("flag".to_owned(), String::new()),
                ("e".to_owned(), String::new()),
                ("x".to_owned(), "y=z".to_owned()),
            ]
        );
        assert!(pairs("").unwrap().is_empty());
        assert!(pairs("&&").unwrap().is_empty());
    }

    #[test]
    fn bad_escapes_are_refused() {
        for q in [
            "a=%", "a=%4", "a=1%", "a=%zz", "a=%G1", "a=%%41", "a=%é1", "%=1", "%x=1", "a=%+1",
            "a=%-1",
        ] {
            let e = pairs(q).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParameter, "{q}");
            assert!(
                e.message.starts_with("bad percent-encoding in "),
                "{q}: {e:?}"
            );
            let field = if q.starts_with("a=") { Some("a") } else { None };
            assert_eq!(e.field.as_deref(), field, "{q}");
        }
        assert_eq!(
            pairs("a=%4").unwrap_err().message,
            "bad percent-encoding in \"%4\""
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused() {
        for q in ["a=%FF", "a=%C3", "a=%C3%28", "a=%ED%A0%80", "%80=1"] {
            let e = pairs(q).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParameter, "{q}");
            assert!(
                e.message.ends_with("is not UTF-8 once decoded"),
                "{q}: {e:?}"
            );
            // A bad value is named by its parameter; a bad name by nothing.
            let field = if q.starts_with("a=") { Some("a") } else { None };
            assert_eq!(e.field.as_deref(), field, "{q}");
        }
        let e = pairs("prefix=ok&after=%FF").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("after"));
    }

    #[test]
    fn unique_refuses_a_repeat_by_name() {
        let p = unique(Some("from=1&to=2&tz=UTC")).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p["tz"], "UTC");
        assert!(unique(None).unwrap().is_empty());
        // A repeat is the decoded name's: `%74z` is `tz`.
        let e = unique(Some("tz=UTC&%74z=UTC")).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParameter);
        assert_eq!(e.message, "tz is given twice");
        assert_eq!(e.field.as_deref(), Some("tz"));
    }
}

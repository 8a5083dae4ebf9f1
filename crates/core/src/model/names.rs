//! Names and keys: namespaces, keys, dimension names and values, and dimensions (simple
//! `country` or compound `country+device`, whose values are their parts escaped and joined).

use std::fmt;
use std::str::FromStr;

use super::{MAX_DIM_VALUE_BYTES, MAX_DIMS_PER_EVENT, MAX_KEY_BYTES, MAX_NAME_BYTES, ModelError};

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

macro_rules! string_newtype {
    ($name:ident) => {
        impl $name {
            pub fn new(s: &str) -> Result<Self, ModelError> {
                Self::check(s)?;
                Ok($name(s.to_owned()))
            }

            /// Validates and keeps the string (no copy).
            pub fn from_string(s: String) -> Result<Self, ModelError> {
                Self::check(&s)?;
                Ok($name(s))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        // Ord and Hash are derived from the one String field, so they agree with str's.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        string_from_str!($name);
    };
}

/// A namespace name: `[a-z0-9][a-z0-9_.-]{0,63}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(String);
string_newtype!(Namespace);

impl Namespace {
    fn check(s: &str) -> Result<(), ModelError> {
        let err = |why| ModelError::InvalidName {
            got: s.to_owned(),
            why,
        };
        let bytes = s.as_bytes();
        let Some(first) = bytes.first() else {
            return Err(err("it is empty"));
        };
        if bytes.len() > MAX_NAME_BYTES {
            return Err(err("it is longer than 64 bytes"));
        }
        if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
            return Err(err("it must start with a-z or 0-9"));
        }
        let ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(b);
        if !bytes.iter().all(ok) {
            return Err(err("only a-z, 0-9, '_', '.' and '-' are allowed"));
        }
        Ok(())
    }
}

/// The entity being counted: UTF-8, 1–256 bytes, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);
string_newtype!(Key);

impl Key {
    /// Whether `s` makes a key (as [`Key::new`] would take it), without making one.
    pub fn is_valid(s: &str) -> bool {
        Self::check(s).is_ok()
    }

    fn check(s: &str) -> Result<(), ModelError> {
        if s.is_empty() {
            return Err(ModelError::InvalidKey { why: "it is empty" });
        }
        if s.len() > MAX_KEY_BYTES {
            return Err(ModelError::InvalidKey {
                why: "it is longer than 256 bytes",
            });
        }
        if has_control(s) {
            return Err(ModelError::InvalidKey {
                why: "it contains a control character",
            });
        }
        Ok(())
    }
}

/// A simple dimension name: `[a-z0-9_]{1,64}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DimName(String);
string_newtype!(DimName);

impl DimName {
    fn check(s: &str) -> Result<(), ModelError> {
        let err = |why: &str| ModelError::InvalidDimension {
            what: format!("name {s:?}"),
            why: why.to_owned(),
        };
        if s.is_empty() || s.len() > MAX_NAME_BYTES {
            return Err(err("a name is 1 to 64 bytes"));
        }
        let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
        if !s.bytes().all(ok) {
            return Err(err("only a-z, 0-9 and '_' are allowed"));
        }
        Ok(())
    }
}

/// A dimension value: UTF-8, 1–2048 bytes, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DimValue(String);
string_newtype!(DimValue);

impl DimValue {
    fn check(s: &str) -> Result<(), ModelError> {
        let err = |why: &str| ModelError::InvalidDimension {
            what: "value".to_owned(),
            why: why.to_owned(),
        };
        if s.is_empty() || s.len() > MAX_DIM_VALUE_BYTES {
            return Err(err("a value is 1 to 2048 bytes"));
        }
        if has_control(s) {
            return Err(err("it contains a control character"));
        }
        Ok(())
    }
}

/// A dimension declared in a schema: one name, or a compound `a+b` of at least two.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dimension {
    parts: Vec<DimName>,
    /// The canonical name: the parts joined by `+`.
    name: String,
}

impl Dimension {
    pub fn new(s: &str) -> Result<Self, ModelError> {
        let parts = s
            .split('+')
            .map(DimName::new)
            .collect::<Result<Vec<_>, _>>()?;
        if parts.len() > MAX_DIMS_PER_EVENT {
            return Err(ModelError::InvalidDimension {
                what: format!("{s:?}"),
                why: format!("a compound has at most {MAX_DIMS_PER_EVENT} parts"),
            });
        }
        for (i, p) in parts.iter().enumerate() {
            if parts[..i].contains(p) {
                return Err(ModelError::InvalidDimension {
                    what: format!("{s:?}"),
                    why: format!("{p} appears twice"),
                });
            }
        }
        Ok(Dimension {
            name: s.to_owned(),
            parts,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn parts(&self) -> &[DimName] {
        &self.parts
    }

    pub fn is_compound(&self) -> bool {
        self.parts.len() > 1
    }

    /// The value this dimension takes for an event's dimensions (sorted by name), or `None`
    /// when the event lacks a part (the event then counts toward `unset`).
    pub fn value_of(&self, dims: &[(DimName, DimValue)]) -> Option<String> {
        let find = |p: &DimName| {
            dims.binary_search_by(|(n, _)| n.cmp(p))
                .ok()
                .map(|i| dims[i].1.as_str())
        };
        if let [single] = self.parts.as_slice() {
            return find(single).map(str::to_owned);
        }
        let mut out = String::new();
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            escape_part(find(p)?, &mut out);
        }
        Some(out)
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Appends one part of a compound value, escaping `|` and `\` with `\`.
pub fn escape_part(part: &str, out: &mut String) {
    for c in part.chars() {
        if c == '|' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn namespace_rules() {
        for ok in ["clicks", "api_hits", "a", "0.x-y_z", &"a".repeat(64)] {
            assert!(Namespace::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Clicks", "_a", ".a", "a b", "a/b", "é", &"a".repeat(65)] {
            let e = Namespace::new(bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidName, "{bad}");
        }
    }

    #[test]
    fn key_rules() {
        assert!(Key::new("lnk_1").is_ok());
        assert!(Key::new("a/b c?é").is_ok());
        assert!(Key::new(&"k".repeat(256)).is_ok());
        for bad in ["", "a\nb", "\u{7f}", &"k".repeat(257)] {
            assert_eq!(Key::new(bad).unwrap_err().code(), ErrorCode::InvalidKey);
        }
    }

    #[test]
    fn dimension_rules() {
        assert!(DimName::new("country").is_ok());
        for bad in ["", "Country", "a+b", "a-b", &"d".repeat(65)] {
            assert_eq!(
                DimName::new(bad).unwrap_err().code(),
                ErrorCode::InvalidDimension
            );
        }
        assert!(DimValue::new(&"v".repeat(2048)).is_ok());
        for bad in ["", "a\tb", &"v".repeat(2049)] {
            assert_eq!(
                DimValue::new(bad).unwrap_err().code(),
                ErrorCode::InvalidDimension
            );
        }
        let c = Dimension::new("country+device").unwrap();
        assert!(c.is_compound());
        assert_eq!(
            Dimension::new("a+a").unwrap_err().code(),
            ErrorCode::InvalidDimension
        );
        assert_eq!(
            Dimension::new("a+").unwrap_err().code(),
            ErrorCode::InvalidDimension
        );
    }

    #[test]
    fn compound_values_escape_parts() {
        let c = Dimension::new("country+device").unwrap();
        let dims = |pairs: &[(&str, &str)]| {
            let mut v: Vec<_> = pairs
                .iter()
                .map(|(n, v)| (DimName::new(n).unwrap(), DimValue::new(v).unwrap()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            c.value_of(&dims(&[("device", "mobile"), ("country", "US")]))
                .unwrap(),
            "US|mobile"
        );
        assert_eq!(
            c.value_of(&dims(&[("device", "a|b"), ("country", "x\\y")]))
                .unwrap(),
            "x\\\\y|a\\|b"
        );
        assert_eq!(c.value_of(&dims(&[("country", "US")])), None);
    }
}

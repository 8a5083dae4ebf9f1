//! JSON bodies read strictly: an object naming the same member twice is refused instead of
//! silently keeping the last value (RFC 8259 leaves that to the reader; a database should
//! not guess which of two `ns` a client meant).

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `bytes` as one JSON value; a repeated member name anywhere is an error naming it.
pub(crate) fn from_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<Strict>(bytes).map(|s| s.0)
}

/// Parses `text` as one JSON value, strictly as [`from_slice`].
pub(crate) fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Strict>(text).map(|s| s.0)
}

struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: Error>(self, v: f64) -> Result<Value, E> {
        // Not finite cannot come from JSON text; null keeps the match total.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if out.contains_key(&name) {
                return Err(A::Error::custom(format_args!(
                    "the member {name:?} appears twice in one object"
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(name, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_member_is_refused_at_any_depth() {
        for text in [
            r#"{"a": 1, "a": 2}"#,
            r#"[{"ns": "x", "key": "k", "ns": "y"}]"#,
            r#"[{"ns": "x", "dims": {"d": "1", "d": "2"}}]"#,
        ] {
            let e = from_str(text).unwrap_err().to_string();
            assert!(e.contains("appears twice"), "{text}: {e}");
        }
    }

    #[test]
    fn everything_else_reads_as_serde_json_does() {
        for text in [
            r#"{"a": [1, -2, 3.5, true, null, "s\u00e9"], "b": {"c": {}}, "d": []}"#,
            "18446744073709551615",
            r#""\ud83d\ude00""#,
            "[]",
        ] {
            let plain: Value = serde_json::from_str(text).unwrap();
            assert_eq!(from_str(text).unwrap(), plain, "{text}");
        }
        assert!(from_str("{").is_err());
        assert!(from_str("[1,]").is_err());
    }
}

//! JSON bodies read strictly: an object naming the same member twice is refused instead of
//! silently keeping the last value (RFC 8259 leaves that to the reader; a database should
//! not guess which of two `ns` a client meant).

use std::cell::Cell;

use serde::de::{Deserialize, DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `text` as one JSON value, a repeated member name anywhere being an error naming
/// it, building at most `budget` values (each scalar, array and object counts one): `Ok(None)` when it holds more. The
/// rest is then only checked, not built, so a small body cannot make a large tree (a value
/// tree takes ~36 times the bytes of `[0,0,…]`).
pub(crate) fn from_str_within(
    text: &str,
    budget: usize,
) -> Result<Option<Value>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let left = Cell::new(budget);
    let v = Budgeted(&left).deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// One JSON value read through and checked as a value tree would be (strings valid UTF-8,
/// numbers in range), building nothing: serde's `IgnoredAny` skips strings unchecked.
pub(crate) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E: Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_none<E: Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// Reads a JSON array: each element through `take` while it asks for more (`Some(true)`;
/// `None` when the array has ended) and fewer than `max` were taken, every element after
/// only checked ([`Checked`]). Answers how many elements the array has.
pub(crate) fn take_then_check<'de, A: SeqAccess<'de>>(
    mut seq: A,
    max: usize,
    mut take: impl FnMut(&mut A) -> Result<Option<bool>, A::Error>,
) -> Result<usize, A::Error> {
    let (mut n, mut taking) = (0, true);
    loop {
        if taking && n < max {
            match take(&mut seq)? {
                Some(more) => taking = more,
                None => return Ok(n),
            }
        } else if seq.next_element::<Checked>()?.is_none() {
            return Ok(n);
        }
        n += 1;
    }
}

/// Whether `bytes` is one JSON value (as a value tree would read it), building nothing.
pub(crate) fn check(bytes: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<Checked>(bytes).map(|_| ())
}

/// One JSON value built strictly (a member named twice is an error) within what `.0` has left: `None` once it
/// runs out, the rest of the value then read through without building anything.
#[derive(Clone, Copy)]
pub(crate) struct Budgeted<'b>(pub(crate) &'b Cell<usize>);

impl<'de> DeserializeSeed<'de> for Budgeted<'_> {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Budgeted<'_> {
    /// Takes one value from the budget; false when none is left.
    fn take(&self) -> bool {
        match self.0.get() {
            0 => false,
            n => {
                self.0.set(n - 1);
                true
            }
        }
    }
}

impl<'de> Visitor<'de> for Budgeted<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.take().then_some(Value::Bool(v)))
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.take().then(|| Value::from(v)))
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.take().then(|| Value::from(v)))
    }
    fn visit_f64<E: Error>(self, v: f64) -> Result<Self::Value, E> {
        // Not finite cannot come from JSON text; null keeps the match total.
        Ok(self
            .take()
            .then(|| serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)))
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.take().then(|| Value::String(v.to_owned())))
    }
    fn visit_string<E: Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(self.take().then_some(Value::String(v)))
    }
    fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
        Ok(self.take().then_some(Value::Null))
    }
    fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
        Ok(self.take().then_some(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let mut out = self.take().then(Vec::new);
        take_then_check(seq, usize::MAX, |seq| {
            Ok(seq.next_element_seed(self)?.map(|v| match (&mut out, v) {
                (Some(out), Some(v)) => {
                    out.push(v);
                    true
                }
                _ => {
                    out = None;
                    false
                }
            }))
        })?;
        Ok(out.map(Value::Array))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = self.take().then(Map::new);
        while let Some(name) = map.next_key::<String>()? {
            if out.as_ref().is_some_and(|o| o.contains_key(&name)) {
                return Err(A::Error::custom(format_args!(
                    "the member {name:?} appears twice in one object"
                )));
            }
            let v = map.next_value_seed(self)?;
            match (&mut out, v) {
                (Some(out), Some(v)) => {
                    out.insert(name, v);
                }
                _ => out = None,
            }
            if out.is_none() {
                while map.next_entry::<Checked, Checked>()?.is_some() {}
                break;
            }
        }
        Ok(out.map(Value::Object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_str(text: &str) -> Result<Value, serde_json::Error> {
        from_str_within(text, usize::MAX).map(|v| v.unwrap())
    }

    #[test]
    fn checked_refuses_what_a_value_tree_refuses() {
        let texts: [&[u8]; 7] = [
            b"[1, {\"a\": [\"b\", null]}, 2.5e3]",
            b"[\"\xff\"]",
            b"{\"\xdd\": 1}",
            b"[1e400]",
            b"[1, 2",
            b"\"\\ud800\"",
            b"[] x",
        ];
        for text in texts {
            assert_eq!(
                check(text).is_ok(),
                serde_json::from_slice::<Value>(text).is_ok(),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn past_the_budget_nothing_more_is_built_but_all_is_checked() {
        let text = r#"{"a": [1, 2, {"b": 3}], "c": "d"}"#;
        // The object, a, its array's three values, b's object's value... seven in all.
        assert!(from_str_within(text, 7).unwrap().is_some());
        for budget in 0..7 {
            assert_eq!(from_str_within(text, budget).unwrap(), None, "{budget}");
        }
        // Checked all the same: bad JSON past the budget is an error.
        assert!(from_str_within(r#"[1, 2, 3, oops]"#, 1).is_err());
        assert!(from_str_within(r#"[1, 2, 3] x"#, 1).is_err());
        assert!(from_str_within("[1, 2, \"\\ud800\"]", 1).is_err());
    }

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

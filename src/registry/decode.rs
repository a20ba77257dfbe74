//! Request body decoding: JSON into a `Value`, noting duplicate fields (reported under fieldValidation=Strict|Warn).

use crate::error::ApiError;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::fmt;

struct Seed<'a> {
    path: String,
    dups: &'a RefCell<Vec<String>>,
}

impl Seed<'_> {
    fn child(&self, seg: &str) -> String {
        if self.path.is_empty() {
            seg.to_string()
        } else {
            format!("{}.{seg}", self.path)
        }
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map(Value::Number).unwrap_or(Value::Null))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) =
            seq.next_element_seed(Seed { path: format!("{}[{}]", self.path, out.len()), dups: self.dups })?
        {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let path = self.child(&k);
            let v = map.next_value_seed(Seed { path: path.clone(), dups: self.dups })?;
            if out.insert(k, v).is_some() {
                self.dups.borrow_mut().push(path);
            }
        }
        Ok(Value::Object(out))
    }
}

/// Whether JSON text is an object, by its first character (whitespace skipped): enough to tell an object from
/// the other JSON values once the text is known to be JSON, or to know that a failed decode was not about one.
pub fn starts_object(json: &[u8]) -> bool {
    json.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// Parses a JSON request body; returns the value (last duplicate wins, as Go's decoder) and duplicate field paths.
pub fn parse_json(body: &[u8]) -> Result<(Value, Vec<String>), ApiError> {
    let dups = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(body);
    let v = Seed { path: String::new(), dups: &dups }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|_| v))
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
    Ok((v, dups.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_duplicates_with_paths() {
        let (v, d) = parse_json(br#"{"a":1,"spec":{"x":[{"k":1,"k":2}],"y":1,"y":2},"a":3}"#).unwrap();
        assert_eq!(v["a"], 3);
        assert_eq!(d, vec!["spec.x[0].k", "spec.y", "a"]);
        assert_eq!(parse_json(b"{").unwrap_err().code, 400);
        assert_eq!(parse_json(b"{} x").unwrap_err().code, 400);
    }
}

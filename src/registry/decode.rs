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
    json.trim_ascii_start().starts_with(b"{")
}

/// Why a stored value cannot be read as an object.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("the stored object does not decode as JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the stored object is not a JSON object")]
    NotAnObject,
    #[error("the stored object's metadata is not a JSON object")]
    MetadataNotAnObject,
}

/// A stored object as every read of it decodes it: a JSON object whose metadata, when present, is an object.
/// What is not is unreadable (corrupt, or written by something other than this server), and why.
pub fn read_stored(value: &[u8]) -> Result<Map<String, Value>, Unreadable> {
    let obj = match serde_json::from_slice(value) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(Unreadable::NotAnObject),
        Err(e) => return Err(Unreadable::NotJson(e)),
    };
    match obj.get("metadata") {
        None | Some(Value::Object(_)) => Ok(obj),
        Some(_) => Err(Unreadable::MetadataNotAnObject),
    }
}

/// How deeply serde_json's reader, which [`read_stored`] and every kube-rs client use, lets text nest.
const READER_DEPTH: usize = 127;

/// Whether JSON text nests no deeper than [`read_stored`] reads, by a scan of its brackets: for the paths that
/// copy stored text to clients without reading it whole, so that they serve exactly what a read would.
pub fn reads_within_depth(text: &[u8]) -> bool {
    nests_within(text, READER_DEPTH)
}

/// Whether JSON text nests no deeper than `max` levels (an object or list at the top is the first), by a scan of
/// its brackets.
pub fn nests_within(text: &[u8], max: usize) -> bool {
    // Text with no more brackets than `max` cannot nest deeper. The count (per chunk of 255 bytes, in u8 lanes the
    // compiler vectorizes) answers for nearly every object at a twentieth of the scan's cost, which a LIST pays
    // per item (BENCHMARKS.md, "The typed core").
    let count = |chunk: &[u8]| chunk.iter().fold(0u8, |n, &b| n + u8::from((b == b'{') | (b == b'[')));
    if text.chunks(255).map(|chunk| usize::from(count(chunk))).sum::<usize>() <= max {
        return true;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// How deeply objects and lists may nest in a stored object. Every reader of stored objects, ours and kube-rs
/// clients alike, is serde_json's, which refuses text nested 128 levels deep; a list, a watch event, a Table row
/// or an AdmissionReview wraps an object in up to three more. So writes refuse what reads could not take back.
pub const MAX_NESTING_DEPTH: usize = 100;

/// The path of the first value in `v` that nests deeper than [`MAX_NESTING_DEPTH`] (counting `v` itself as the
/// first level when it is an object or a list), as a field path (`spec.a[0].b`); `None` when `v` is within it.
/// Looks no deeper than one level past the limit, so it is cheap and never recurses far.
pub fn too_deep(v: &Value) -> Option<String> {
    too_deep_at(v, 1)
}

/// [`too_deep`] of a value found at nesting level `depth` of the object it is in; the path is relative to `v`.
pub fn too_deep_at(v: &Value, depth: usize) -> Option<String> {
    /// Whether `v`, at nesting level `depth`, is or holds a value too deep; `path` ends at that value when so.
    fn walk(v: &Value, depth: usize, path: &mut String) -> bool {
        if !(v.is_object() || v.is_array()) {
            return false;
        }
        if depth > MAX_NESTING_DEPTH {
            return true;
        }
        let child = |path: &mut String, segment: std::fmt::Arguments, value: &Value| {
            let len = path.len();
            let _ = fmt::Write::write_fmt(path, segment);
            let found = walk(value, depth + 1, path);
            if !found {
                path.truncate(len);
            }
            found
        };
        match v {
            Value::Object(m) => m.iter().any(|(k, value)| {
                let dot = if path.is_empty() { "" } else { "." };
                child(path, format_args!("{dot}{k}"), value)
            }),
            Value::Array(a) => a.iter().enumerate().any(|(i, value)| child(path, format_args!("[{i}]"), value)),
            _ => false,
        }
    }
    let mut path = String::new();
    walk(v, depth, &mut path).then_some(path)
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

    /// `levels` objects nested in one another: `{"a":{"a":...{}}}`.
    fn nested(levels: usize) -> String {
        format!("{}{}", "{\"a\":".repeat(levels - 1) + "{", "}".repeat(levels))
    }

    #[test]
    fn what_may_be_written_can_be_read_back_in_any_envelope() {
        let at_limit: Value = serde_json::from_str(&nested(MAX_NESTING_DEPTH)).unwrap();
        assert_eq!(too_deep(&at_limit), None);
        // The deepest envelope a reader meets an object in: a Table row's object in a list of rows.
        let wrapped = format!(r#"{{"rows":[{{"object":{}}}]}}"#, nested(MAX_NESTING_DEPTH));
        assert!(serde_json::from_str::<Value>(&wrapped).is_ok());
        let over: Value = serde_json::from_str(&nested(MAX_NESTING_DEPTH + 1)).unwrap();
        assert_eq!(too_deep(&over).as_deref(), Some(&*vec!["a"; MAX_NESTING_DEPTH].join(".")));
        let in_list: Value = serde_json::json!({"spec": {"x": [1, {"y": over}]}});
        assert!(too_deep(&in_list).unwrap().starts_with("spec.x[1].y.a.a"));
        assert_eq!(too_deep(&serde_json::json!({"spec": [[[]]], "n": 1})), None);
        // The reader's own limit is above ours, which is why the write check exists; the text scan agrees with it.
        assert!(serde_json::from_str::<Value>(&nested(READER_DEPTH)).is_ok());
        assert!(reads_within_depth(nested(READER_DEPTH).as_bytes()));
        assert!(serde_json::from_str::<Value>(&nested(READER_DEPTH + 1)).is_err());
        assert!(!reads_within_depth(nested(READER_DEPTH + 1).as_bytes()));
        // Many brackets side by side are not depth.
        let wide = format!("[{}]", vec!["{}"; 300].join(","));
        assert!(reads_within_depth(wide.as_bytes()) && nests_within(wide.as_bytes(), 2) && !nests_within(b"[[[]]]", 2));
        // Brackets in strings, escaped quotes included, are text.
        let text = format!(r#"{{"a":"{}\"{}","b":[]}}"#, "[".repeat(200), "{".repeat(200));
        assert!(serde_json::from_str::<Value>(&text).is_ok() && reads_within_depth(text.as_bytes()));
    }
}

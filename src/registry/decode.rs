//! Request body decoding: JSON into a `Value`, noting duplicate fields (reported under fieldValidation=Strict|Warn).

use super::unknown::Path;
use crate::error::ApiError;
use serde::de::value::{BorrowedStrDeserializer, MapAccessDeserializer, StringDeserializer};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Unexpected, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

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

/// A JSON string borrowed from the text it is decoded from when it has no escapes, copied when it has.
pub type Text<'a> = Cow<'a, str>;

/// Reads a JSON string as [`Text`] and null as `None`; with `OTHERS_ARE_NONE`, other JSON values are skipped and
/// read as `None` too (as the registry reads a `Value`'s apiVersion and kind), otherwise they are an error.
struct TextVisitor<const OTHERS_ARE_NONE: bool>;

impl<'de, const OTHERS_ARE_NONE: bool> Visitor<'de> for TextVisitor<OTHERS_ARE_NONE> {
    type Value = Option<Text<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(v)))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v.to_string())))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v)))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.other(Unexpected::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.other(Unexpected::Signed(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.other(Unexpected::Unsigned(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.other(Unexpected::Float(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        if !OTHERS_ARE_NONE {
            return Err(serde::de::Error::invalid_type(Unexpected::Seq, &self));
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        if !OTHERS_ARE_NONE {
            return Err(serde::de::Error::invalid_type(Unexpected::Map, &self));
        }
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

impl<const OTHERS_ARE_NONE: bool> TextVisitor<OTHERS_ARE_NONE> {
    fn other<'de, E: serde::de::Error>(self, unexpected: Unexpected) -> Result<Option<Text<'de>>, E> {
        match OTHERS_ARE_NONE {
            true => Ok(None),
            false => Err(E::invalid_type(unexpected, &self)),
        }
    }
}

/// `deserialize_with` for a [`Text`] field: a string, borrowed when it can be; null reads as "".
pub fn text<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Text<'a>, D::Error> {
    Ok(d.deserialize_any(TextVisitor::<false>)?.unwrap_or_default())
}

/// A string (borrowed when it can be) or, for any other JSON value, `None`.
pub(super) struct TextOrNone;

impl<'de> DeserializeSeed<'de> for TextOrNone {
    type Value = Option<Text<'de>>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(TextVisitor::<true>)
    }
}

/// An object's apiVersion and kind as [`deserialize_with_type_meta`] finds them: strings, or `None` when absent or not
/// a string.
#[derive(Debug, Default)]
pub struct TypeMeta<'a> {
    pub api_version: Option<Text<'a>>,
    pub kind: Option<Text<'a>>,
}

impl<'a> TypeMeta<'a> {
    /// The apiVersion and kind of a `Value`, read the same way.
    pub fn of(v: &'a Value) -> Self {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(Cow::Borrowed);
        TypeMeta { api_version: text("apiVersion"), kind: text("kind") }
    }
}

/// `seed` given the deserializer of `key` (borrowed when it can be).
fn key_into<'de, S: DeserializeSeed<'de>, E: serde::de::Error>(seed: S, key: Text<'de>) -> Result<S::Value, E> {
    match key {
        Cow::Borrowed(k) => seed.deserialize(BorrowedStrDeserializer::new(k)),
        Cow::Owned(k) => seed.deserialize(StringDeserializer::new(k)),
    }
}

/// The entries of a top-level object without its apiVersion and kind, which are read into `meta` on the way, and
/// with the fields `skip_metadata` of its `metadata` skipped.
struct TopLevel<'m, 'a, A> {
    map: A,
    meta: &'m mut TypeMeta<'a>,
    skip_metadata: &'static [&'static str],
    in_metadata: bool,
}

impl<'de: 'a, 'a, A: MapAccess<'de>> MapAccess<'de> for TopLevel<'_, 'a, A> {
    type Error = A::Error;
    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, A::Error> {
        while let Some(key) = self.map.next_key_seed(TextOrNone)? {
            let key = key.unwrap_or_default();
            let slot = match &*key {
                "apiVersion" => &mut self.meta.api_version,
                "kind" => &mut self.meta.kind,
                _ => {
                    self.in_metadata = key == "metadata";
                    return key_into(seed, key).map(Some);
                }
            };
            // The last of duplicate keys counts, as in the `Value` a request body is read as.
            *slot = self.map.next_value_seed(TextOrNone)?;
        }
        Ok(None)
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        match self.in_metadata && !self.skip_metadata.is_empty() {
            true => self.map.next_value_seed(Skipping { inner: seed, skip: self.skip_metadata }),
            false => self.map.next_value_seed(seed),
        }
    }
    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A seed (`inner`) given an object without its entries named in `skip`; null and options pass through, and any
/// other value is an error (the callers fall back to a careful decode). The same wrapper is the deserializer,
/// visitor and map access that do it.
struct Skipping<S> {
    inner: S,
    skip: &'static [&'static str],
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Skipping<S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Skipping { inner: d, skip: self.skip })
    }
}

/// The deserializer side of [`Skipping`]: an object's visitor sees its entries without those named in `skip`.
/// Types that ask for anything but a map or struct get the JSON value as it is.
impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skipping<D> {
    type Error = D::Error;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(Skipping { inner: visitor, skip: self.skip })
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(Skipping { inner: visitor, skip: self.skip })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_struct(name, fields, Skipping { inner: visitor, skip: self.skip })
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_option(Skipping { inner: visitor, skip: self.skip })
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct enum identifier ignored_any
    }
}

/// The visitor side of [`Skipping`]: maps lose the entries named in `skip`, options and null pass through; other
/// values fail (the caller's fallback decodes them the careful way).
impl<'de, V: Visitor<'de>> Visitor<'de> for Skipping<V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(Skipping { inner: map, skip: self.skip })
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Skipping { inner: d, skip: self.skip })
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }
}

/// The map side of [`Skipping`].
impl<'de, A: MapAccess<'de>> MapAccess<'de> for Skipping<A> {
    type Error = A::Error;
    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, A::Error> {
        while let Some(key) = self.inner.next_key_seed(TextOrNone)? {
            let key = key.unwrap_or_default();
            if !self.skip.contains(&&*key) {
                return key_into(seed, key).map(Some);
            }
            self.inner.next_value::<IgnoredAny>()?;
        }
        Ok(None)
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.inner.next_value_seed(seed)
    }
}

/// Decodes the JSON object `d` gives (a whole document, or a value inside a larger one) as `T` in one pass,
/// reading its apiVersion and kind into the returned [`TypeMeta`] rather than giving them to `T` (for types that do
/// not carry them), and skipping the fields `skip_metadata` of its `metadata`; `ignored` is told the path of every
/// field `T` does not know ([`super::unknown`]).
pub fn deserialize_with_type_meta<'de, T, D, F>(
    d: D,
    skip_metadata: &'static [&'static str],
    ignored: F,
) -> Result<(T, TypeMeta<'de>), D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
    F: FnMut(&Path<'_, 'de>),
{
    struct ObjectVisitor<'m, 'a, T, F> {
        meta: &'m mut TypeMeta<'a>,
        skip_metadata: &'static [&'static str],
        ignored: F,
        _t: PhantomData<fn() -> T>,
    }
    impl<'de, T: Deserialize<'de>, F: FnMut(&Path<'_, 'de>)> Visitor<'de> for ObjectVisitor<'_, 'de, T, F> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let top = TopLevel { map, meta: self.meta, skip_metadata: self.skip_metadata, in_metadata: false };
            super::unknown::deserialize(MapAccessDeserializer::new(top), self.ignored)
        }
    }
    let mut meta = TypeMeta::default();
    let visitor = ObjectVisitor { meta: &mut meta, skip_metadata, ignored, _t: PhantomData };
    let typed = d.deserialize_map(visitor)?;
    Ok((typed, meta))
}

/// A stored object as every read of it decodes it: a JSON object whose metadata, when present, is an object.
/// What is not is unreadable (corrupt, or written by something other than this server), and why.
pub fn read_stored(value: &[u8]) -> Result<Map<String, Value>, String> {
    let obj = match serde_json::from_slice(value) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err("the stored object is not a JSON object".into()),
        Err(e) => return Err(format!("the stored object does not decode as JSON: {e}")),
    };
    match obj.get("metadata") {
        None | Some(Value::Object(_)) => Ok(obj),
        Some(_) => Err("the stored object's metadata is not a JSON object".into()),
    }
}

/// How deeply serde_json's reader, which [`read_stored`] and every kube-rs client use, lets text nest.
const READER_DEPTH: usize = 127;

/// Whether JSON text nests no deeper than [`read_stored`] reads, by a scan of its brackets: for the paths that
/// copy stored text to clients without reading it whole, so that they serve exactly what a read would.
pub fn reads_within_depth(text: &[u8]) -> bool {
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
                if depth > READER_DEPTH {
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
        // Brackets in strings, escaped quotes included, are text.
        let text = format!(r#"{{"a":"{}\"{}","b":[]}}"#, "[".repeat(200), "{".repeat(200));
        assert!(serde_json::from_str::<Value>(&text).is_ok() && reads_within_depth(text.as_bytes()));
    }

    #[derive(Deserialize, Debug, PartialEq)]
    struct Meta {
        name: Option<String>,
        labels: Option<std::collections::BTreeMap<String, String>>,
    }

    #[derive(Deserialize, Debug, PartialEq)]
    struct Obj {
        metadata: Option<Meta>,
        spec: Option<Value>,
    }

    fn decode(text: &str) -> Result<(Obj, TypeMeta<'_>, Vec<String>), serde_json::Error> {
        let mut ignored = Vec::new();
        let mut de = serde_json::Deserializer::from_str(text);
        let (o, t) = deserialize_with_type_meta(&mut de, &["managedFields"], |p| ignored.push(p.field_path()))?;
        de.end()?;
        Ok((o, t, ignored))
    }

    #[test]
    fn type_meta_is_read_and_metadata_skipped_in_one_pass() {
        let (o, t, ignored) = decode(
            r#"{"apiVersion":"g\/v1","kind":"K","metadata":{"name":"a","managedFields":[{"bad":1}],"x":1},
                "spec":{"managedFields":1},"kind":"K2","extra":true}"#,
        )
        .unwrap();
        // apiVersion and kind are not the type's; escapes are read; the last duplicate counts.
        assert_eq!((t.api_version.as_deref(), t.kind.as_deref()), (Some("g/v1"), Some("K2")));
        assert!(matches!(t.kind, Some(Cow::Borrowed(_))));
        // metadata.managedFields is skipped (whatever it holds) without being reported; elsewhere the name is
        // an ordinary field; unknown fields are reported by path.
        assert_eq!(o.metadata, Some(Meta { name: Some("a".into()), labels: None }));
        assert_eq!(o.spec, Some(serde_json::json!({"managedFields": 1})));
        assert_eq!(ignored, vec!["metadata.x", "extra"]);
        // Non-strings read as absent.
        let (_, t, _) = decode(r#"{"apiVersion":5,"kind":{"a":[1]}}"#).unwrap();
        assert_eq!((t.api_version, t.kind), (None, None));
        // Not an object, metadata not an object, trailing text, a type error: errors (callers fall back).
        assert!(decode("[1]").is_err());
        assert!(decode(r#"{"metadata":"m"}"#).is_err());
        assert!(decode(r#"{"metadata":{"labels":{"a":1}}}"#).is_err());
        assert!(decode("{} x").is_err());
        // Text with escapes in keys and values decodes as it reads.
        let (o, _, _) = decode(r#"{"metadata":{"na\u006de":"a\"b","labels":{"k\/1":"v"}}}"#).unwrap();
        let m = o.metadata.unwrap();
        assert_eq!(m.name.as_deref(), Some("a\"b"));
        assert_eq!(m.labels.unwrap().keys().collect::<Vec<_>>(), vec!["k/1"]);
    }
}

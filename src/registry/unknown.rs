//! The fields a typed decode skipped: a deserializer wrapper that tells a callback the path of every value the
//! type's `Deserialize` ignored (serde hands those to `deserialize_ignored_any`), for the "unknown field" warnings
//! and strict field validation.
//!
//! It does what the `serde_ignored` crate does, with map keys borrowed from the input (copied only when they are
//! escaped) instead of copied into a `String` at every level: every object of every request and admission review
//! is decoded through it, and the copies were a fifth of an admission review's decode.

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// Where a value is in the document being decoded.
#[derive(Debug)]
pub enum Path<'a, 'de> {
    Root,
    Seq {
        parent: &'a Path<'a, 'de>,
        index: usize,
    },
    Map {
        parent: &'a Path<'a, 'de>,
        key: &'a Cow<'de, str>,
    },
    /// Inside an `Option`, a newtype or a newtype variant: no segment of its own.
    Inner {
        parent: &'a Path<'a, 'de>,
    },
}

impl Path<'_, '_> {
    /// The field path as Kubernetes writes it: keys and list indexes joined with dots (`spec.items.0.name`).
    pub fn field_path(&self) -> String {
        let mut segments = Vec::new();
        let mut at = self;
        loop {
            at = match at {
                Path::Root => break,
                Path::Seq { parent, index } => {
                    segments.push(Cow::Owned(index.to_string()));
                    parent
                }
                Path::Map { parent, key } => {
                    segments.push(Cow::Borrowed(&***key));
                    parent
                }
                Path::Inner { parent } => parent,
            };
        }
        segments.reverse();
        segments.join(".")
    }

    /// The key of a value of the top-level object.
    pub fn top_level_key(&self) -> Option<&str> {
        match self {
            Path::Map { parent: Path::Root, key } => Some(key),
            _ => None,
        }
    }
}

/// Decodes `T` from `d`, telling `callback` the path of every value `T` ignored.
pub fn deserialize<'de, T, D, F>(d: D, mut callback: F) -> Result<T, D::Error>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
    F: FnMut(&Path<'_, 'de>),
{
    T::deserialize(Tracked { de: d, path: Path::Root, callback: &mut callback })
}

/// The deserializer of the value at `path`.
struct Tracked<'a, 'b, 'de, D, F> {
    de: D,
    path: Path<'a, 'de>,
    callback: &'b mut F,
}

/// A visitor of the value at `path`, whose containers it tracks.
struct Wrap<'a, 'b, 'de, X, F> {
    inner: X,
    path: &'a Path<'a, 'de>,
    callback: &'b mut F,
}

/// Every `deserialize_*` method but `deserialize_ignored_any`, with its extra arguments.
macro_rules! deserialize_methods {
    ($mac:ident!($($prefix:tt)*)) => {
        $mac!($($prefix)*
            deserialize_any() deserialize_bool() deserialize_i8() deserialize_i16() deserialize_i32()
            deserialize_i64() deserialize_i128() deserialize_u8() deserialize_u16() deserialize_u32()
            deserialize_u64() deserialize_u128() deserialize_f32() deserialize_f64() deserialize_char()
            deserialize_str() deserialize_string() deserialize_bytes() deserialize_byte_buf()
            deserialize_option() deserialize_unit() deserialize_seq() deserialize_map() deserialize_identifier()
            deserialize_unit_struct(name: &'static str) deserialize_newtype_struct(name: &'static str)
            deserialize_tuple(len: usize) deserialize_tuple_struct(name: &'static str, len: usize)
            deserialize_struct(name: &'static str, fields: &'static [&'static str])
            deserialize_enum(name: &'static str, variants: &'static [&'static str])
        );
    };
}

macro_rules! tracked_methods {
    ($($method:ident($($arg:ident: $ty:ty),*))*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                let visitor = Wrap { inner: visitor, path: &self.path, callback: self.callback };
                self.de.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>, F: FnMut(&Path<'_, 'de>)> Deserializer<'de> for Tracked<'_, '_, 'de, D, F> {
    type Error = D::Error;

    deserialize_methods!(tracked_methods!());

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        (self.callback)(&self.path);
        self.de.deserialize_ignored_any(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// Visitor methods that hand what they are given to `self.inner` unchanged: values, nothing, or the access to a
/// container.
macro_rules! forward_visits {
    (values: $($method:ident($ty:ty))*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.inner.$method(v)
        }
    )*};
    (empty: $($method:ident)*) => {$(
        fn $method<E: de::Error>(self) -> Result<Self::Value, E> {
            self.inner.$method()
        }
    )*};
    (access: $($method:ident($bound:ident))*) => {$(
        fn $method<A: $bound<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
            self.inner.$method(a)
        }
    )*};
}

/// [`CaptureKey`]'s visitor methods for keys that are not borrowed strings: the key is kept as its text, then
/// handed on.
macro_rules! capture_visits {
    ($($method:ident($ty:ty))*) => {$(
        fn $method<E: de::Error>(mut self, v: $ty) -> Result<Self::Value, E> {
            self.keep(|| Cow::Owned(v.to_string()));
            self.inner.$method(v)
        }
    )*};
}

impl<'de, X: Visitor<'de>, F: FnMut(&Path<'_, 'de>)> Visitor<'de> for Wrap<'_, '_, 'de, X, F> {
    type Value = X::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }
    forward_visits!(values: visit_bool(bool) visit_i64(i64) visit_i128(i128) visit_u64(u64) visit_u128(u128)
        visit_f64(f64) visit_char(char) visit_str(&str) visit_borrowed_str(&'de str) visit_string(String)
        visit_bytes(&[u8]) visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>));
    forward_visits!(empty: visit_none visit_unit);
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<X::Value, D::Error> {
        self.inner.visit_some(Tracked { de: d, path: Path::Inner { parent: self.path }, callback: self.callback })
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<X::Value, D::Error> {
        let inner = Tracked { de: d, path: Path::Inner { parent: self.path }, callback: self.callback };
        self.inner.visit_newtype_struct(inner)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<X::Value, A::Error> {
        self.inner.visit_seq(Items { seq, path: self.path, index: 0, callback: self.callback })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<X::Value, A::Error> {
        self.inner.visit_map(Entries { map, path: self.path, key: None, callback: self.callback })
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<X::Value, A::Error> {
        self.inner.visit_enum(Variant { inner: data, path: self.path, callback: self.callback })
    }
}

/// The seed of the value at `path`.
struct Seed<'a, 'b, 'de, S, F> {
    seed: S,
    path: Path<'a, 'de>,
    callback: &'b mut F,
}

impl<'de, S: DeserializeSeed<'de>, F: FnMut(&Path<'_, 'de>)> DeserializeSeed<'de> for Seed<'_, '_, 'de, S, F> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Tracked { de: d, path: self.path, callback: self.callback })
    }
}

/// The items of a list.
struct Items<'a, 'b, 'de, A, F> {
    seq: A,
    path: &'a Path<'a, 'de>,
    index: usize,
    callback: &'b mut F,
}

impl<'de, A: SeqAccess<'de>, F: FnMut(&Path<'_, 'de>)> SeqAccess<'de> for Items<'_, '_, 'de, A, F> {
    type Error = A::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        let path = Path::Seq { parent: self.path, index: self.index };
        self.index += 1;
        self.seq.next_element_seed(Seed { seed, path, callback: &mut *self.callback })
    }
    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

/// The entries of an object (or map), each value's path ending in its key.
struct Entries<'a, 'b, 'de, A, F> {
    map: A,
    path: &'a Path<'a, 'de>,
    key: Option<Cow<'de, str>>,
    callback: &'b mut F,
}

impl<'de, A: MapAccess<'de>, F: FnMut(&Path<'_, 'de>)> MapAccess<'de> for Entries<'_, '_, 'de, A, F> {
    type Error = A::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.map.next_key_seed(CaptureKey { inner: seed, key: &mut self.key })
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        const NO_KEY: Cow<'static, str> = Cow::Borrowed("");
        let key = self.key.as_ref().unwrap_or(&NO_KEY);
        let path = Path::Map { parent: self.path, key };
        self.map.next_value_seed(Seed { seed, path, callback: &mut *self.callback })
    }
    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A key on its way to the type's key seed, kept for the path of its value: borrowed from the input when it can
/// be. The same wrapper is the seed, the deserializer and the visitor of the key.
struct CaptureKey<'k, 'de, X> {
    inner: X,
    key: &'k mut Option<Cow<'de, str>>,
}

impl<'de, X: DeserializeSeed<'de>> DeserializeSeed<'de> for CaptureKey<'_, 'de, X> {
    type Value = X::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<X::Value, D::Error> {
        self.inner.deserialize(CaptureKey { inner: d, key: self.key })
    }
}

macro_rules! capture_key_methods {
    ($($method:ident($($arg:ident: $ty:ty),*))*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method($($arg,)* CaptureKey { inner: visitor, key: self.key })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for CaptureKey<'_, 'de, D> {
    type Error = D::Error;

    deserialize_methods!(capture_key_methods!());

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_ignored_any(CaptureKey { inner: visitor, key: self.key })
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

impl<'de, X: Visitor<'de>> CaptureKey<'_, 'de, X> {
    fn keep(&mut self, key: impl FnOnce() -> Cow<'de, str>) {
        *self.key = Some(key());
    }
}

impl<'de, X: Visitor<'de>> Visitor<'de> for CaptureKey<'_, 'de, X> {
    type Value = X::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }
    capture_visits!(visit_bool(bool) visit_i64(i64) visit_u64(u64) visit_char(char) visit_str(&str)
        visit_string(String));
    fn visit_borrowed_str<E: de::Error>(mut self, v: &'de str) -> Result<X::Value, E> {
        self.keep(|| Cow::Borrowed(v));
        self.inner.visit_borrowed_str(v)
    }
    forward_visits!(values: visit_i128(i128) visit_u128(u128) visit_f64(f64) visit_bytes(&[u8])
        visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>));
    forward_visits!(empty: visit_none visit_unit);
    forward_visits!(access: visit_some(Deserializer) visit_newtype_struct(Deserializer) visit_seq(SeqAccess)
        visit_map(MapAccess) visit_enum(EnumAccess));
}

/// An enum's variant, whose content is tracked as the inner value of its parent's path.
struct Variant<'a, 'b, 'de, A, F> {
    inner: A,
    path: &'a Path<'a, 'de>,
    callback: &'b mut F,
}

impl<'a, 'b, 'de, A: EnumAccess<'de>, F: FnMut(&Path<'_, 'de>)> EnumAccess<'de> for Variant<'a, 'b, 'de, A, F> {
    type Error = A::Error;
    type Variant = Variant<'a, 'b, 'de, A::Variant, F>;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self::Variant), A::Error> {
        let (value, variant) = self.inner.variant_seed(seed)?;
        Ok((value, Variant { inner: variant, path: self.path, callback: self.callback }))
    }
}

impl<'de, A: VariantAccess<'de>, F: FnMut(&Path<'_, 'de>)> VariantAccess<'de> for Variant<'_, '_, 'de, A, F> {
    type Error = A::Error;
    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let path = Path::Inner { parent: self.path };
        self.inner.newtype_variant_seed(Seed { seed, path, callback: self.callback })
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(len, Wrap { inner: visitor, path: self.path, callback: self.callback })
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner.struct_variant(fields, Wrap { inner: visitor, path: self.path, callback: self.callback })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        name: Option<String>,
        items: Vec<Item>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        mode: Option<Mode>,
        wrapped: Option<Wrapped>,
    }
    #[derive(Deserialize, Debug, PartialEq)]
    struct Item {
        a: u32,
    }
    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "camelCase")]
    enum Mode {
        Fast { level: u32 },
        Slow(Item),
        Off,
    }
    #[derive(Deserialize, Debug, PartialEq)]
    struct Wrapped(Item);

    fn unknown(json: &str) -> (Result<Spec, String>, Vec<String>) {
        let mut seen = Vec::new();
        let mut de = serde_json::Deserializer::from_str(json);
        let r = deserialize(&mut de, |p: &Path<'_, '_>| seen.push(p.field_path())).map_err(|e| e.to_string());
        (r, seen)
    }

    #[test]
    fn ignored_values_are_reported_by_field_path() {
        let (r, seen) = unknown(
            r#"{"name":"n","x":1,"items":[{"a":1},{"a":2,"b":[3]}],"labels":{"k":"v"},"mode":{"fast":{"level":1,"extra":true}},
                "wrapped":{"a":1,"z":null},"y\u0031":{"deep":1}}"#,
        );
        let spec = r.expect("decodes");
        assert_eq!(spec.items, vec![Item { a: 1 }, Item { a: 2 }]);
        assert_eq!(spec.labels.get("k").map(String::as_str), Some("v"));
        assert_eq!(spec.mode, Some(Mode::Fast { level: 1 }));
        // Options, newtypes and variants add no segment; an escaped key is read as it means.
        assert_eq!(seen, ["x", "items.1.b", "mode.extra", "wrapped.z", "y1"]);
        let (r, seen) = unknown(r#"{"items":[],"mode":{"slow":{"a":1,"q":2}}}"#);
        assert_eq!(r.expect("decodes").mode, Some(Mode::Slow(Item { a: 1 })));
        assert_eq!(seen, ["mode.q"]);
        let (r, seen) = unknown(r#"{"items":[],"mode":"off"}"#);
        assert_eq!((r.expect("decodes").mode, seen), (Some(Mode::Off), vec![]));
        // Errors are the inner deserializer's.
        let (r, _) = unknown(r#"{"items":[{"a":"no"}]}"#);
        assert!(r.unwrap_err().contains("invalid type"));
    }

    /// As deep as serde_json goes (its limit is 128 levels) on a test thread's stack, in a debug build too.
    #[test]
    fn deep_values_decode_within_the_stack() {
        let depth = 127;
        let json = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let mut de = serde_json::Deserializer::from_str(&json);
        let v: serde_json::Value = deserialize(&mut de, |_: &Path<'_, '_>| {}).expect("decodes");
        assert!(v.is_array());
        let deeper = format!("[{json}]");
        let mut de = serde_json::Deserializer::from_str(&deeper);
        assert!(deserialize::<serde_json::Value, _, _>(&mut de, |_: &Path<'_, '_>| {}).is_err());
    }

    #[test]
    fn top_level_keys_are_told_apart() {
        let key = Cow::Borrowed("kind");
        let top = Path::Map { parent: &Path::Root, key: &key };
        assert_eq!(top.top_level_key(), Some("kind"));
        let inner = Path::Map { parent: &top, key: &key };
        assert_eq!((inner.top_level_key(), inner.field_path()), (None, "kind.kind".to_string()));
    }
}

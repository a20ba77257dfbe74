//! The JSON Patch of mutating admission: what defaulting added to an object, as operations on the object as sent.
//!
//! The rule: a value is added where the object as decoded (`before`, the typed object before its defaults, as a
//! [`Shape`]) has none — absent, null, "" or [] — and only inside objects, and lists of the same length; the items of a
//! list and set values are never replaced. What the typed round trip merely normalizes (unknown fields dropped,
//! empty fields omitted, number forms) is in `before` and in the defaulted object alike, so it is not a default
//! and is left as sent: kube-apiserver prunes and normalizes CRD objects itself, and a patch must not fight it
//! (reinvocation would loop).
//!
//! The defaulted object is compared with `before` as it is serialized ([`Fill`], a serde `Serializer`): no JSON
//! value of either is built (a [`Shape`] holds no text but map keys), and the values to add are written as JSON
//! text. An operation below the top level is checked against the text as sent, since the typed decode may have
//! made up a container that was absent or null there (a struct field with a default); the operation then fills
//! that container whole.

use super::decode::TextOrNone;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Impossible, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;

/// The JSON Patch (as JSON text) that adds to the object as sent what defaulting added to `before` (the shape of
/// the object as decoded from it) to make `after`; `None` when nothing is added. `sent` gives the object's JSON
/// text as sent (`None`: it cannot be found), and is called only when an operation below the top level needs it.
pub fn default_patch<'s, T: Serialize + ?Sized>(
    sent: impl FnOnce() -> Option<&'s str>,
    before: &Shape,
    after: &T,
) -> serde_json::Result<Option<Vec<u8>>> {
    let mut ops = Ops::default();
    after.serialize(Fill { ops: &mut ops, before })?;
    let mut ops = ops.found;
    if ops.is_empty() {
        return Ok(None);
    }
    // Operations at the top level add to the object itself, which is there; deeper ones need their containers.
    if ops.iter().any(|op| op.tokens.len() > 1) {
        let sent =
            sent().ok_or_else(|| <serde_json::Error as serde::de::Error>::custom("the object's text is gone"))?;
        let mut whole = None;
        for op in &mut ops {
            if op.tokens.len() < 2 {
                continue;
            }
            let mut de = serde_json::Deserializer::from_str(sent);
            let Some((depth, exists)) = Parents { below: &op.tokens }.deserialize(&mut de)? else { continue };
            // The container at `depth` is not in the text: the operation fills it whole, from the defaulted object.
            let defaulted = match &whole {
                Some(w) => w,
                None => whole.insert(serde_json::to_value(after)?),
            };
            op.tokens.truncate(depth);
            op.value = serde_json::to_vec(defaulted.pointer(&pointer(&op.tokens)).unwrap_or(&Value::Null))?;
            op.replace = exists;
        }
        // One operation per filled container: those below it (or equal to it) are dropped.
        ops.sort_by(|a, b| a.tokens.cmp(&b.tokens));
        ops.dedup_by(|later, kept| later.tokens.starts_with(&kept.tokens));
    }
    let mut out = Vec::with_capacity(64 + ops.iter().map(|op| op.value.len() + 32).sum::<usize>());
    for op in &ops {
        out.push(if out.is_empty() { b'[' } else { b',' });
        out.extend_from_slice(if op.replace { b"{\"op\":\"replace\",\"path\":" } else { b"{\"op\":\"add\",\"path\":" });
        serde_json::to_writer(&mut out, &pointer(&op.tokens))?;
        out.extend_from_slice(b",\"value\":");
        out.extend_from_slice(&op.value);
        out.push(b'}');
    }
    out.push(b']');
    Ok(Some(out))
}

/// What the comparison needs of the object before its defaults: which values were unset (null, "" or [];
/// absent fields are not in their object), which were set, and the fields and items of objects and lists.
#[derive(Debug, PartialEq)]
pub enum Shape {
    Unset,
    Set,
    Object(Vec<(Cow<'static, str>, Shape)>),
    /// A list with items (an empty one is unset).
    List(Vec<Shape>),
}

impl Shape {
    /// The shape of `value` as it serializes to JSON.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Shape> {
        value.serialize(ShapeOf)
    }
}

/// Serializes a value into its [`Shape`].
struct ShapeOf;

/// The parts of an object or list being shaped; tuples and enum variants are set values, not compared.
enum ShapeParts {
    Object(Vec<(Cow<'static, str>, Shape)>, Option<String>),
    List(Vec<Shape>),
    Set,
}

impl ShapeParts {
    /// A field of an object (of a struct or a map).
    fn field<T: Serialize + ?Sized>(&mut self, key: Cow<'static, str>, value: &T) -> serde_json::Result<()> {
        if let ShapeParts::Object(fields, _) = self {
            fields.push((key, value.serialize(ShapeOf)?));
        }
        Ok(())
    }
    /// An item of a list.
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> serde_json::Result<()> {
        if let ShapeParts::List(items) = self {
            items.push(value.serialize(ShapeOf)?);
        }
        Ok(())
    }
    /// Where a map's key waits for its value.
    fn key_slot(&mut self) -> Option<&mut Option<String>> {
        match self {
            ShapeParts::Object(_, slot) => Some(slot),
            _ => None,
        }
    }
    fn finish(self) -> serde_json::Result<Shape> {
        Ok(match self {
            ShapeParts::Object(fields, _) => Shape::Object(fields),
            ShapeParts::List(items) if items.is_empty() => Shape::Unset,
            ShapeParts::List(items) => Shape::List(items),
            ShapeParts::Set => Shape::Set,
        })
    }
}

/// Serializer methods of scalars, all answering `$answer`.
macro_rules! scalars {
    ($ok:ty, $answer:expr) => {
        fn serialize_bool(self, _: bool) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_i8(self, _: i8) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_i16(self, _: i16) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_i32(self, _: i32) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_i64(self, _: i64) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_u8(self, _: u8) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_u16(self, _: u16) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_u32(self, _: u32) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_u64(self, _: u64) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_f32(self, _: f32) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_f64(self, _: f64) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_char(self, _: char) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_bytes(self, _: &[u8]) -> serde_json::Result<$ok> {
            $answer
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> serde_json::Result<$ok> {
            $answer
        }
    };
}

/// serde's compound serializers for the parts of a value (`$parts`, answering `$ok` when they end): the fields of
/// a struct or a map go to `$parts::field` (a map's key waits in `$parts::key_slot` for its value), the items of a
/// list to `$parts::item`; the parts of tuples and enum variants are skipped.
macro_rules! parts_serializers {
    ($parts:ty => $ok:ty) => {
        impl ser::SerializeStruct for $parts {
            type Ok = $ok;
            type Error = serde_json::Error;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> serde_json::Result<()> {
                self.field(Cow::Borrowed(key), value)
            }
            fn end(self) -> serde_json::Result<$ok> {
                self.finish()
            }
        }
        impl ser::SerializeMap for $parts {
            type Ok = $ok;
            type Error = serde_json::Error;
            fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> serde_json::Result<()> {
                if let Some(slot) = self.key_slot() {
                    *slot = Some(key.serialize(KeyText)?);
                }
                Ok(())
            }
            fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> serde_json::Result<()> {
                match self.key_slot().and_then(Option::take) {
                    Some(key) => self.field(Cow::Owned(key), value),
                    None => Ok(()),
                }
            }
            fn end(self) -> serde_json::Result<$ok> {
                self.finish()
            }
        }
        impl ser::SerializeSeq for $parts {
            type Ok = $ok;
            type Error = serde_json::Error;
            fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> serde_json::Result<()> {
                self.item(value)
            }
            fn end(self) -> serde_json::Result<$ok> {
                self.finish()
            }
        }
        parts_serializers!(@skip $parts => $ok;
            SerializeTuple::serialize_element(),
            SerializeTupleStruct::serialize_field(),
            SerializeTupleVariant::serialize_field(),
            SerializeStructVariant::serialize_field(&'static str)
        );
    };
    (@skip $parts:ty => $ok:ty; $($trait:ident :: $method:ident($($arg:ty),*)),*) => {$(
        impl ser::$trait for $parts {
            type Ok = $ok;
            type Error = serde_json::Error;
            fn $method<T: Serialize + ?Sized>(&mut self, $(_: $arg,)* _: &T) -> serde_json::Result<()> {
                Ok(())
            }
            fn end(self) -> serde_json::Result<$ok> {
                self.finish()
            }
        }
    )*};
}

impl Serializer for ShapeOf {
    type Ok = Shape;
    type Error = serde_json::Error;
    type SerializeSeq = ShapeParts;
    type SerializeTuple = ShapeParts;
    type SerializeTupleStruct = ShapeParts;
    type SerializeTupleVariant = ShapeParts;
    type SerializeMap = ShapeParts;
    type SerializeStruct = ShapeParts;
    type SerializeStructVariant = ShapeParts;

    scalars!(Shape, Ok(Shape::Set));
    fn serialize_str(self, v: &str) -> serde_json::Result<Shape> {
        Ok(if v.is_empty() { Shape::Unset } else { Shape::Set })
    }
    fn serialize_none(self) -> serde_json::Result<Shape> {
        Ok(Shape::Unset)
    }
    fn serialize_unit(self) -> serde_json::Result<Shape> {
        Ok(Shape::Unset)
    }
    fn serialize_unit_struct(self, _: &'static str) -> serde_json::Result<Shape> {
        Ok(Shape::Unset)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> serde_json::Result<Shape> {
        Ok(Shape::Set)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> serde_json::Result<Shape> {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> serde_json::Result<Shape> {
        value.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::List(Vec::with_capacity(len.unwrap_or(0))))
    }
    fn serialize_tuple(self, _: usize) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::Set)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::Set)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::Set)
    }
    fn serialize_map(self, len: Option<usize>) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::Object(Vec::with_capacity(len.unwrap_or(0)), None))
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::Object(Vec::with_capacity(len), None))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<ShapeParts> {
        Ok(ShapeParts::Set)
    }
}

parts_serializers!(ShapeParts => Shape);

/// One operation: the path's tokens (unescaped), the value as JSON text, and whether the path is there to replace
/// (otherwise it is added; "add" also replaces an object's member that is there, as RFC 6902 says).
struct Op {
    tokens: Vec<String>,
    value: Vec<u8>,
    replace: bool,
}

/// The operations found so far, and the path (its tokens) where the comparison is.
#[derive(Default)]
struct Ops {
    path: Vec<Cow<'static, str>>,
    found: Vec<Op>,
}

impl Ops {
    /// Adds `value` at the path plus `key`, unless it is unset too.
    fn add<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> serde_json::Result<()> {
        let text = serde_json::to_vec(value)?;
        if !matches!(&text[..], b"null" | b"\"\"" | b"[]" | b"{}") {
            let mut tokens: Vec<String> = self.path.iter().map(|t| t.to_string()).collect();
            tokens.push(key.to_string());
            self.found.push(Op { tokens, value: text, replace: false });
        }
        Ok(())
    }
    /// Compares `value` with `before`, at the path plus `key`.
    fn descend<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        before: &Shape,
        value: &T,
    ) -> serde_json::Result<()> {
        self.path.push(key);
        let r = value.serialize(Fill { ops: &mut *self, before });
        self.path.pop();
        r
    }
}

/// The JSON pointer of `tokens` (RFC 6901: `~` as `~0`, `/` as `~1`).
fn pointer(tokens: &[String]) -> String {
    let mut p = String::with_capacity(tokens.iter().map(|t| t.len() + 1).sum());
    for t in tokens {
        p.push('/');
        if !t.contains(['~', '/']) {
            p.push_str(t);
            continue;
        }
        for c in t.chars() {
            match c {
                '~' => p.push_str("~0"),
                '/' => p.push_str("~1"),
                c => p.push(c),
            }
        }
    }
    p
}

/// The defaulted value, serialized against the value `before` at the same path (an object or a list: set values
/// are never compared, and unset ones are filled by their container).
struct Fill<'o, 'b> {
    ops: &'o mut Ops,
    before: &'b Shape,
}

/// The fields of an object (a struct or a map) and the items of a list, compared one by one; anything else is
/// skipped.
enum Compound<'o, 'b> {
    Object { ops: &'o mut Ops, before: &'b [(Cow<'static, str>, Shape)], key: Option<String> },
    List { ops: &'o mut Ops, before: &'b [Shape], index: usize },
    Skip,
}

impl<'o, 'b> Fill<'o, 'b> {
    fn object(self) -> Compound<'o, 'b> {
        match self.before {
            Shape::Object(before) => Compound::Object { ops: self.ops, before, key: None },
            _ => Compound::Skip,
        }
    }
}

impl<'o, 'b> Compound<'o, 'b> {
    /// A field: added when unset before, compared when it was an object or a non-empty list, else left.
    fn field<T: Serialize + ?Sized>(&mut self, key: Cow<'static, str>, value: &T) -> serde_json::Result<()> {
        let Compound::Object { ops, before, .. } = self else { return Ok(()) };
        match before.iter().find(|(k, _)| *k == key).map(|(_, b)| b) {
            None | Some(Shape::Unset) => ops.add(&key, value),
            Some(b @ (Shape::Object(_) | Shape::List(_))) => ops.descend(key, b, value),
            Some(Shape::Set) => Ok(()),
        }
    }
    /// Where a map's key waits for its value.
    fn key_slot(&mut self) -> Option<&mut Option<String>> {
        match self {
            Compound::Object { key, .. } => Some(key),
            _ => None,
        }
    }
    fn finish(self) -> serde_json::Result<()> {
        Ok(())
    }
    /// An item: compared when it was an object or a non-empty list (items are not filled whole).
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> serde_json::Result<()> {
        let Compound::List { ops, before, index } = self else { return Ok(()) };
        let i = *index;
        *index += 1;
        match before.get(i) {
            Some(b @ (Shape::Object(_) | Shape::List(_))) => ops.descend(Cow::Owned(i.to_string()), b, value),
            _ => Ok(()),
        }
    }
}

impl<'o, 'b> Serializer for Fill<'o, 'b> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Compound<'o, 'b>;
    type SerializeTuple = Compound<'o, 'b>;
    type SerializeTupleStruct = Compound<'o, 'b>;
    type SerializeTupleVariant = Compound<'o, 'b>;
    type SerializeMap = Compound<'o, 'b>;
    type SerializeStruct = Compound<'o, 'b>;
    type SerializeStructVariant = Compound<'o, 'b>;

    // A set value where `before` was an object or a list: a change of type, which is not a default.
    scalars!((), Ok(()));
    fn serialize_str(self, _: &str) -> serde_json::Result<()> {
        Ok(())
    }
    fn serialize_none(self) -> serde_json::Result<()> {
        Ok(())
    }
    fn serialize_unit(self) -> serde_json::Result<()> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> serde_json::Result<()> {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> serde_json::Result<()> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> serde_json::Result<()> {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> serde_json::Result<()> {
        value.serialize(self)
    }
    /// A list of as many items as before is compared item by item; one of another length is left alone.
    fn serialize_seq(self, len: Option<usize>) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(match self.before {
            Shape::List(before) if len == Some(before.len()) => Compound::List { ops: self.ops, before, index: 0 },
            _ => Compound::Skip,
        })
    }
    fn serialize_tuple(self, _: usize) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(Compound::Skip)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(Compound::Skip)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(Compound::Skip)
    }
    fn serialize_map(self, _: Option<usize>) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(self.object())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(self.object())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Compound<'o, 'b>> {
        Ok(Compound::Skip)
    }
}

parts_serializers!(Compound<'_, '_> => ());

/// A map's key as text: a string (JSON object keys are).
struct KeyText;

impl Serializer for KeyText {
    type Ok = String;
    type Error = serde_json::Error;
    type SerializeSeq = Impossible<String, serde_json::Error>;
    type SerializeTuple = Impossible<String, serde_json::Error>;
    type SerializeTupleStruct = Impossible<String, serde_json::Error>;
    type SerializeTupleVariant = Impossible<String, serde_json::Error>;
    type SerializeMap = Impossible<String, serde_json::Error>;
    type SerializeStruct = Impossible<String, serde_json::Error>;
    type SerializeStructVariant = Impossible<String, serde_json::Error>;

    fn serialize_str(self, v: &str) -> serde_json::Result<String> {
        Ok(v.to_string())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> serde_json::Result<String> {
        v.serialize(self)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> serde_json::Result<String> {
        Ok(variant.to_string())
    }
    scalars!(String, Err(not_a_key()));
    fn serialize_none(self) -> serde_json::Result<String> {
        Err(not_a_key())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> serde_json::Result<String> {
        Err(not_a_key())
    }
    fn serialize_unit(self) -> serde_json::Result<String> {
        Err(not_a_key())
    }
    fn serialize_unit_struct(self, _: &'static str) -> serde_json::Result<String> {
        Err(not_a_key())
    }
    fn serialize_seq(self, _: Option<usize>) -> serde_json::Result<Self::SerializeSeq> {
        Err(not_a_key())
    }
    fn serialize_tuple(self, _: usize) -> serde_json::Result<Self::SerializeTuple> {
        Err(not_a_key())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> serde_json::Result<Self::SerializeTupleStruct> {
        Err(not_a_key())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeTupleVariant> {
        Err(not_a_key())
    }
    fn serialize_map(self, _: Option<usize>) -> serde_json::Result<Self::SerializeMap> {
        Err(not_a_key())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> serde_json::Result<Self::SerializeStruct> {
        Err(not_a_key())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeStructVariant> {
        Err(not_a_key())
    }
}

fn not_a_key() -> serde_json::Error {
    ser::Error::custom("a map key that is not a string")
}

/// Reads the value at some container of an operation's path in the text as sent, with `below` the tokens under
/// it: whether the containers down to the operation's own (all tokens but the last) are objects or lists there.
/// `None` when they are; else how many tokens down the first one that is not is, and whether it is there (null,
/// say) rather than absent. Everything off the path is skipped unread; of a key written twice the last counts.
struct Parents<'t> {
    below: &'t [String],
}

impl<'de> DeserializeSeed<'de> for Parents<'_> {
    type Value = Option<(usize, bool)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Parents<'_> {
    type Value = Option<(usize, bool)>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Some((0, true)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (token, rest) = match self.below {
            [token, rest @ ..] if !rest.is_empty() => (token, rest),
            // The operation's own container: it is here.
            _ => {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(None);
            }
        };
        let mut found = Some((1, false));
        while let Some(key) = map.next_key_seed(TextOrNone)? {
            match key.as_deref() == Some(token.as_str()) {
                true => found = map.next_value_seed(Parents { below: rest })?.map(|(d, e)| (d + 1, e)),
                false => map.next_value::<IgnoredAny>().map(|_| ())?,
            }
        }
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (index, rest) = match self.below {
            [token, rest @ ..] if !rest.is_empty() => (token.parse::<usize>().ok(), rest),
            _ => {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(None);
            }
        };
        let mut found = Some((1, false));
        let mut i = 0;
        loop {
            let more = match Some(i) == index {
                true => seq.next_element_seed(Parents { below: rest })?.map(|r| found = r.map(|(d, e)| (d + 1, e))),
                false => seq.next_element::<IgnoredAny>()?.map(|_| ()),
            };
            if more.is_none() {
                return Ok(found);
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::json;

    /// The operations that default `sent` (JSON text, decoded as `before`, or as itself) to `after`, as values.
    fn ops_from(sent: &str, before: &Value, after: &Value) -> Vec<Value> {
        let patch = default_patch(|| Some(sent), &Shape::of(before).expect("a shape"), after).expect("a patch");
        patch.map(|p| serde_json::from_slice(&p).expect("a JSON array")).unwrap_or_default()
    }
    fn ops(sent: &str, after: &str) -> Vec<Value> {
        let before: Value = serde_json::from_str(sent).expect("JSON");
        ops_from(sent, &before, &serde_json::from_str(after).expect("JSON"))
    }
    /// `sent` with the operations applied.
    fn patched(sent: &str, ops: Vec<Value>) -> Value {
        let mut v: Value = serde_json::from_str(sent).expect("JSON");
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("a JSON Patch");
        json_patch::patch(&mut v, &patch).expect("applies");
        v
    }

    #[test]
    fn defaults_fill_only_what_is_unset() {
        let sent = json!({"a": "", "b": [], "c": {"x": 1, "keep": "me"}, "d": null, "e": [{"k": ""}], "f": "x"});
        let defaulted = json!({"a": "A", "b": ["B"], "c": {"x": 2, "y": 3}, "d": {}, "e": [{"k": "K"}], "f": "y"});
        let sent = sent.to_string();
        assert_eq!(
            patched(&sent, ops(&sent, &defaulted.to_string())),
            json!({"a": "A", "b": ["B"], "c": {"x": 1, "y": 3, "keep": "me"}, "d": null, "e": [{"k": "K"}], "f": "x"})
        );
        // Keys are escaped in the pointers; an empty object gets the fields added (it may hold fields the decode
        // dropped); an object that needs nothing gets no operation.
        assert_eq!(
            ops(r#"{"a/b~c": {}}"#, r#"{"a/b~c":{"z":1}}"#),
            vec![json!({"op": "add", "path": "/a~1b~0c/z", "value": 1})]
        );
        assert_eq!(ops(r#"{"a": 1}"#, r#"{"a":2,"b":""}"#), Vec::<Value>::new());
        // A list of another length is left alone; the root gets additions.
        assert_eq!(ops(r#"{"e":[{"k":""},{"k":""}],"f":[]}"#, r#"{"e":[{"k":"K"}],"f":[]}"#), Vec::<Value>::new());
        assert_eq!(ops(" { } ", r#"{"a":"A","b":{}}"#), vec![json!({"op": "add", "path": "/a", "value": "A"})]);
        // Unset items of a list are not replaced (that would only normalize them); an empty item object gets the
        // fields defaulting adds.
        assert_eq!(
            ops(r#"{"l":["",null,[],{}]}"#, r#"{"l":["A",{"x":1},[1],{"y":2,"z":""}]}"#),
            vec![json!({"op": "add", "path": "/l/3/y", "value": 2})]
        );
    }

    /// The decode may make up a container the text does not have (a struct field with a default, sent null or
    /// not at all): the operation then fills that container whole, so that it applies to the text as sent.
    #[test]
    fn containers_the_text_lacks_are_filled_whole() {
        // Sent null: replaced. Sent absent, deeper down: added where the text stops.
        let sent = r#"{"spec":null,"status":{"x":1}}"#;
        let before = json!({"spec": {"a": {}}, "status": {"x": 1, "deep": {"b": {}}}});
        let after = json!({"spec": {"a": {"d": "D"}}, "status": {"x": 1, "deep": {"b": {"e": "E"}, "f": 1}}});
        let ops = ops_from(sent, &before, &after);
        assert_eq!(
            ops,
            vec![
                json!({"op": "replace", "path": "/spec", "value": {"a": {"d": "D"}}}),
                json!({"op": "add", "path": "/status/deep", "value": {"b": {"e": "E"}, "f": 1}}),
            ]
        );
        assert_eq!(patched(sent, ops), after);
        // An item sent null is replaced, not inserted before; of a key written twice the last counts.
        let sent = r#"{"l":[{"y":1},null],"m":{"n":{}},"m":null}"#;
        let before = json!({"l": [{"y": 1}, {}], "m": {"n": {}}});
        let after = json!({"l": [{"y": 1}, {"y": 2}], "m": {"n": {"o": 3}}});
        let ops = ops_from(sent, &before, &after);
        assert_eq!(
            ops,
            vec![
                json!({"op": "replace", "path": "/l/1", "value": {"y": 2}}),
                json!({"op": "replace", "path": "/m", "value": {"n": {"o": 3}}}),
            ]
        );
        assert_eq!(patched(sent, ops), after);
        // Containers the text has: the operation stays where it is.
        let sent = r#"{"m":{"n":{"keep":true}}}"#;
        let before = json!({"m": {"n": {}}});
        let ops = ops_from(sent, &before, &json!({"m": {"n": {"o": 3}}}));
        assert_eq!(ops, vec![json!({"op": "add", "path": "/m/n/o", "value": 3})]);
        assert_eq!(patched(sent, ops), json!({"m": {"n": {"keep": true, "o": 3}}}));
    }

    /// Typed objects compare as their JSON does: fields skipped when empty, options, maps with string keys.
    #[test]
    fn typed_objects_compare_as_their_json() {
        #[derive(Serialize)]
        struct Obj {
            #[serde(skip_serializing_if = "Option::is_none")]
            name: Option<String>,
            labels: std::collections::BTreeMap<String, String>,
            #[serde(skip_serializing_if = "Vec::is_empty")]
            items: Vec<Item>,
            status: Option<Status>,
        }
        #[derive(Serialize)]
        struct Item {
            mode: Option<String>,
        }
        #[derive(Default, Serialize)]
        struct Status {
            hashes: Vec<String>,
        }
        let sent = r#"{"labels":{"a/b":""},"items":[{},{"mode":"x"}],"status":null}"#;
        let before = Obj {
            name: None,
            labels: [("a/b".to_string(), String::new())].into(),
            items: vec![Item { mode: None }, Item { mode: Some("x".into()) }],
            status: None,
        };
        let object = |fields: Vec<(&'static str, Shape)>| {
            Shape::Object(fields.into_iter().map(|(k, v)| (Cow::Borrowed(k), v)).collect())
        };
        let before = Shape::of(&before).expect("a shape");
        assert_eq!(
            before,
            object(vec![
                ("labels", object(vec![("a/b", Shape::Unset)])),
                ("items", Shape::List(vec![object(vec![("mode", Shape::Unset)]), object(vec![("mode", Shape::Set)])])),
                ("status", Shape::Unset),
            ])
        );
        assert_eq!(
            Shape::of(&json!([[], [0], {}, "", 0, false])).expect("a shape"),
            Shape::List(vec![
                Shape::Unset,
                Shape::List(vec![Shape::Set]),
                object(vec![]),
                Shape::Unset,
                Shape::Set,
                Shape::Set
            ])
        );
        let after = Obj {
            name: Some("n".into()),
            labels: [("a/b".to_string(), "v".to_string())].into(),
            items: vec![Item { mode: Some("m".into()) }, Item { mode: Some("y".into()) }],
            status: Some(Status { hashes: vec!["Unknown".into()] }),
        };
        let mut ops: Vec<String> = default_patch(|| Some(sent), &before, &after)
            .expect("a patch")
            .map(|p| serde_json::from_slice::<Vec<Value>>(&p).expect("JSON"))
            .unwrap_or_default()
            .iter()
            .map(|op| format!("{} {} {}", op["op"], op["path"], op["value"]))
            .collect();
        ops.sort();
        assert_eq!(
            ops,
            [
                r#""add" "/items/0/mode" "m""#,
                r#""add" "/labels/a~1b" "v""#,
                r#""add" "/name" "n""#,
                r#""add" "/status" {"hashes":["Unknown"]}"#,
            ]
        );
    }
}

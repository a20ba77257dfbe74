//! Decoding request bodies as kube-apiserver's decoder (sigs.k8s.io/json, Go's `encoding/json` rules) decodes them
//! into the Go types of a kind:
//!
//! - a field of a *value* type (string, number, bool, struct, slice, map, `metav1.Time`) that is missing or `null`
//!   is its zero value, never a decode error; validation then answers for it (a 422 with `Required value` beside the
//!   object's other errors, where a strict decoder would answer 400 `missing field` or `invalid type: null` alone);
//! - a `null` item of a slice and a `null` value of a map are the item type's zero value;
//! - a *pointer* field (`*string`, `*int64`, `*metav1.Time`, an optional struct) is nil when missing or `null`,
//!   which is what Rust's `Option` decodes to already;
//! - a value of the wrong JSON type is still a decode error (a 400 naming its path), a JSON array for a struct
//!   included: serde's derived struct decoders take an array too (its items as the fields in order), which Go's
//!   never does, so a kind is decoded through [`GoStructs`], which refuses it.
//!
//! A Go value field in Rust: `#[serde(default, deserialize_with = "go_decode::null_as_default")]` on a `String`,
//! number, bool or struct, [`list`] on a `Vec`, [`map`] on a `BTreeMap`, [`object_meta`] on `metadata`. Where a
//! value field is kept as an `Option` in Rust (None standing for the zero value), nothing is needed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, OwnerReference, Time};
use serde::de::{self, DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::fmt;

/// Go's zero `time.Time` (0001-01-01T00:00:00Z), in Unix seconds: what an unset `metav1.Time` value is.
pub const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// Go's zero `metav1.Time`, for a Rust type whose time is not optional (k8s-openapi's `Condition`).
pub fn zero_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(GO_ZERO_TIME_SECONDS).unwrap_or_default())
}

/// Whether `t` is Go's zero time (`metav1.Time.IsZero`).
pub fn is_zero_time(t: &Time) -> bool {
    t.0.as_second() == GO_ZERO_TIME_SECONDS && t.0.subsec_nanosecond() == 0
}

/// A value decoded as Go decodes a non-pointer: `null` is the zero value ([`Default`]).
struct Zero<T>(T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Zero<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Zero(Option::<T>::deserialize(d)?.unwrap_or_default()))
    }
}

/// `deserialize_with` for a Go value field: `null` is the zero value (with `#[serde(default)]`, so is a missing one).
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Zero::deserialize(d).map(|Zero(v)| v)
}

/// `deserialize_with` for a Go slice: `null` is empty, and a `null` item is the item type's zero value.
pub fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<Vec<Zero<T>>>::deserialize(d)?.into_iter().flatten().map(|Zero(v)| v).collect())
}

/// `deserialize_with` for a Go map with string keys: `null` is empty, and a `null` value is the value type's zero.
pub fn map<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de> + Default,
{
    Ok(Option::<BTreeMap<String, Zero<V>>>::deserialize(d)?.into_iter().flatten().map(|(k, Zero(v))| (k, v)).collect())
}

/// `metav1.ObjectMeta` as it may come on the wire. k8s-openapi's own decoder already takes missing and `null`
/// fields (every field is an `Option`, and `OwnerReference`'s strings default), but not a `null` metadata, label or
/// annotation value, finalizer, owner reference or managedFields entry, all of which Go decodes to zero values.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", expecting = "struct ObjectMeta")]
struct WireObjectMeta {
    #[serde(default)]
    annotations: Option<BTreeMap<String, Zero<String>>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: Option<Vec<Zero<String>>>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, Zero<String>>>,
    #[serde(default)]
    managed_fields: Option<Vec<Zero<ManagedFieldsEntry>>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<Zero<OwnerReference>>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    self_link: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

fn zeros<T>(items: Option<Vec<Zero<T>>>) -> Option<Vec<T>> {
    items.map(|items| items.into_iter().map(|Zero(v)| v).collect())
}

fn zero_values<V>(entries: Option<BTreeMap<String, Zero<V>>>) -> Option<BTreeMap<String, V>> {
    entries.map(|entries| entries.into_iter().map(|(k, Zero(v))| (k, v)).collect())
}

/// `deserialize_with` for `metadata` (a `metav1.ObjectMeta` value): see [`WireObjectMeta`].
pub fn object_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let Zero(m) = Zero::<WireObjectMeta>::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: zero_values(m.annotations),
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: zeros(m.finalizers),
        generate_name: m.generate_name,
        generation: m.generation,
        labels: zero_values(m.labels),
        managed_fields: zeros(m.managed_fields),
        name: m.name,
        namespace: m.namespace,
        owner_references: zeros(m.owner_references),
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
}

/// A deserializer whose structs take only a JSON object, as Go's `encoding/json` decodes a struct: a JSON array for
/// one is `invalid type: sequence, expected struct ...`, the error serde gives for any other value of the wrong
/// type. serde's derived struct decoders (`visit_seq`) would take the array's items as the fields in order.
///
/// Every deserializer reached from this one (a map's values, a list's items, an `Option`'s or newtype's content,
/// an enum's variant) is wrapped again, so nested structs are held to it too; everything else is passed through
/// unchanged, so it composes with `serde_ignored` and `serde_path_to_error` (wrap the innermost deserializer).
pub struct GoStructs<D>(pub D);

/// `visitor`, with what it is given wrapped in [`GoStructs`]; when `struct_` (it was asked for by
/// `deserialize_struct` or a struct variant), a sequence is refused.
struct Visit<V> {
    visitor: V,
    struct_: bool,
}

fn visit<V>(visitor: V) -> Visit<V> {
    Visit { visitor, struct_: false }
}

/// A seed whose deserializer is wrapped in [`GoStructs`].
struct Seed<S>(S);

/// A sequence, map or enum access whose values' deserializers are wrapped in [`GoStructs`].
struct Access<A>(A);

macro_rules! forward_deserialize {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?;)*) => {
        $(fn $method<V: Visitor<'de>>(self, $($($arg: $ty,)*)? visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method($($($arg,)*)? visit(visitor))
        })*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for GoStructs<D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any; deserialize_bool; deserialize_i8; deserialize_i16; deserialize_i32; deserialize_i64;
        deserialize_i128; deserialize_u8; deserialize_u16; deserialize_u32; deserialize_u64; deserialize_u128;
        deserialize_f32; deserialize_f64; deserialize_char; deserialize_str; deserialize_string; deserialize_bytes;
        deserialize_byte_buf; deserialize_option; deserialize_unit; deserialize_seq; deserialize_map;
        deserialize_identifier; deserialize_ignored_any;
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, Visit { visitor, struct_: true })
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {
        $(fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.visitor.$method(v)
        })*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Visit<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    forward_visit! {
        visit_bool(bool); visit_i8(i8); visit_i16(i16); visit_i32(i32); visit_i64(i64); visit_i128(i128);
        visit_u8(u8); visit_u16(u16); visit_u32(u32); visit_u64(u64); visit_u128(u128); visit_f32(f32);
        visit_f64(f64); visit_char(char); visit_str(&str); visit_borrowed_str(&'de str); visit_string(String);
        visit_bytes(&[u8]); visit_borrowed_bytes(&'de [u8]); visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(GoStructs(d))
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(GoStructs(d))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        if self.struct_ {
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        self.visitor.visit_seq(Access(seq))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Access(map))
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Access(data))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(GoStructs(d))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Access<A> {
    type Error = A::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }
    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Access<A> {
    type Error = A::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Seed(seed))
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(Seed(seed))
    }
    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Access<A> {
    type Error = A::Error;
    type Variant = Access<A::Variant>;
    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        self.0.variant_seed(Seed(seed)).map(|(v, variant)| (v, Access(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Access<A> {
    type Error = A::Error;
    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, visit(visitor))
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Visit { visitor, struct_: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[derive(Deserialize, Default, Debug, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Item {
        #[serde(default, deserialize_with = "null_as_default")]
        name: String,
        #[serde(default, deserialize_with = "null_as_default")]
        count: i32,
        #[serde(default)]
        pointer: Option<String>,
    }

    #[derive(Deserialize, Default, Debug, PartialEq)]
    struct Object {
        #[serde(default, deserialize_with = "object_meta")]
        metadata: ObjectMeta,
        #[serde(default, deserialize_with = "null_as_default")]
        item: Item,
        #[serde(default, deserialize_with = "list")]
        items: Vec<Item>,
        #[serde(default, deserialize_with = "list")]
        names: Vec<String>,
        #[serde(default, deserialize_with = "map")]
        labels: BTreeMap<String, String>,
    }

    fn decode(v: Value) -> Result<Object, String> {
        serde_path_to_error::deserialize(GoStructs(v)).map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn missing_and_null_value_fields_are_zero() {
        assert_eq!(decode(json!({})).unwrap(), Object::default());
        let all_null = json!({"metadata": null, "item": null, "items": null, "names": null, "labels": null});
        assert_eq!(decode(all_null).unwrap(), Object::default());
        let o = decode(json!({"item": {"name": null, "count": null, "pointer": null},
                              "items": [null, {"name": "a"}], "names": ["x", null], "labels": {"k": null}}))
        .unwrap();
        assert_eq!(o.item, Item::default());
        assert_eq!(o.items, [Item::default(), Item { name: "a".into(), ..Item::default() }]);
        assert_eq!(o.names, ["x", ""]);
        assert_eq!(o.labels, BTreeMap::from([("k".to_string(), String::new())]));
    }

    #[test]
    fn pointer_fields_stay_unset() {
        let o = decode(json!({"item": {"pointer": null}})).unwrap();
        assert_eq!(o.item.pointer, None);
        let o = decode(json!({"item": {"pointer": ""}})).unwrap();
        assert_eq!(o.item.pointer.as_deref(), Some(""));
    }

    #[test]
    fn metadata_nulls_inside_maps_and_lists_are_zero() {
        let o = decode(json!({"metadata": {"name": null, "labels": {"a": null, "b": "c"}, "annotations": {"x": null},
            "finalizers": [null, "f"], "ownerReferences": [null, {"uid": null, "controller": null}],
            "managedFields": [null], "creationTimestamp": null, "generation": null}}))
        .unwrap();
        let m = o.metadata;
        assert_eq!(m.name, None);
        assert_eq!(m.labels.unwrap_or_default(), BTreeMap::from([("a".into(), "".into()), ("b".into(), "c".into())]));
        assert_eq!(m.annotations.unwrap_or_default()["x"], "");
        assert_eq!(m.finalizers.unwrap_or_default(), ["", "f"]);
        assert_eq!(m.owner_references.unwrap_or_default(), [OwnerReference::default(), OwnerReference::default()]);
        assert_eq!(m.managed_fields.unwrap_or_default(), [ManagedFieldsEntry::default()]);
        // Unset lists and maps stay unset, set empty ones stay set, as k8s-openapi's own decoder keeps them.
        let m = decode(json!({"metadata": {"labels": {}, "finalizers": null}})).unwrap().metadata;
        assert_eq!((m.labels, m.finalizers), (Some(BTreeMap::new()), None));
    }

    /// A value of the wrong JSON type is still an error, with the path and the words of a strict decode.
    #[test]
    fn wrong_types_are_errors_at_their_path() {
        for (body, want) in [
            (json!({"item": {"name": 5}}), "item.name: invalid type: integer `5`, expected a string"),
            (json!({"items": [null, {"count": "1"}]}), "items[1].count: invalid type: string \"1\", expected i32"),
            (json!({"names": "x"}), "names: invalid type: string \"x\", expected a sequence"),
            (json!({"labels": {"a": 1}}), "labels.a: invalid type: integer `1`, expected a string"),
            (
                json!({"metadata": {"labels": {"a": 1}}}),
                "metadata.labels.a: invalid type: integer `1`, expected a string",
            ),
            (
                json!({"metadata": {"finalizers": [1]}}),
                "metadata.finalizers[0]: invalid type: integer `1`, expected a string",
            ),
            (json!({"metadata": "x"}), "metadata: invalid type: string \"x\", expected struct ObjectMeta"),
        ] {
            assert_eq!(decode(body.clone()).unwrap_err(), want, "{body}");
        }
    }

    /// A JSON array is no struct, at the top or anywhere below (a list's item, a map's value, a pointer, our
    /// wrappers of k8s-openapi's metadata and k8s-openapi's own types inside it), with the words of any other
    /// wrong type; serde's derived decoders alone take it, its items as the fields in order.
    #[test]
    fn arrays_are_no_structs() {
        #[derive(Deserialize, Default, Debug)]
        struct Outer {
            #[serde(default, deserialize_with = "null_as_default")]
            item: Item,
            #[serde(default)]
            pointer: Option<Item>,
            #[serde(default, deserialize_with = "map")]
            by_name: BTreeMap<String, Item>,
            #[serde(default)]
            nested: Vec<Vec<Item>>,
        }
        let decode_outer = |v: Value| {
            serde_path_to_error::deserialize::<_, Outer>(GoStructs(v))
                .map_err(|e| format!("{}: {}", e.path(), e.inner()))
        };
        let sequence = "invalid type: sequence, expected struct Item";
        for (body, path) in [
            (json!({"item": []}), "item"),
            (json!({"item": ["a", 1, null]}), "item"),
            (json!({"pointer": []}), "pointer"),
            (json!({"by_name": {"a": {}, "b": ["x"]}}), "by_name.b"),
            (json!({"nested": [[], [{}, []]]}), "nested[1][1]"),
        ] {
            assert_eq!(decode_outer(body.clone()).unwrap_err(), format!("{path}: {sequence}"), "{body}");
        }
        let o = decode_outer(json!({"item": {"name": "a"}, "pointer": {}, "by_name": {"b": null}, "nested": [[{}]]}))
            .expect("objects decode");
        assert_eq!(
            (o.item.name.as_str(), o.pointer, o.by_name.len(), o.nested),
            ("a", Some(Item::default()), 1, vec![vec![Item::default()]])
        );
        assert_eq!(decode(json!({"items": [{}, null, []]})).unwrap_err(), format!("items[2]: {sequence}"));
        for (body, want) in [
            (json!({"metadata": []}), "metadata: invalid type: sequence, expected struct ObjectMeta"),
            (
                json!({"metadata": {"ownerReferences": [{}, ["v1", "Pod"]]}}),
                "metadata.ownerReferences[1]: invalid type: sequence, expected OwnerReference",
            ),
            (
                json!({"metadata": {"managedFields": [[]]}}),
                "metadata.managedFields[0]: invalid type: sequence, expected ManagedFieldsEntry",
            ),
        ] {
            assert_eq!(decode(body.clone()).unwrap_err(), want, "{body}");
        }
        // What the adapter is for: serde alone fills the fields from the items.
        let o: Object = serde_json::from_value(json!({"item": ["a", 1]})).expect("serde takes an array");
        assert_eq!(o.item, Item { name: "a".into(), count: 1, pointer: None });
        // From text as from a value; lists, maps and everything else decode as before.
        let mut de = serde_json::Deserializer::from_str(r#"{"item": {"name": "a"}, "items": [[]]}"#);
        let e = serde_path_to_error::deserialize::<_, Object>(GoStructs(&mut de)).unwrap_err();
        assert_eq!(format!("{}: {}", e.path(), e.inner()), format!("items[0]: {sequence} at line 1 column 36"));
        let mut de =
            serde_json::Deserializer::from_str(r#"{"item": {"name": "a"}, "names": ["b"], "labels": {"c": "d"}}"#);
        let o = Object::deserialize(GoStructs(&mut de)).expect("decodes");
        assert_eq!((o.item.name, o.names, o.labels["c"].as_str()), ("a".to_string(), vec!["b".to_string()], "d"));
    }

    #[test]
    fn unknown_fields_are_still_seen() {
        let body = json!({"metadata": {"bogus": 1, "labels": {"a": null}}, "items": [null, {"extra": true}]});
        let mut unknown = Vec::new();
        let _: Object = serde_ignored::deserialize(GoStructs(body), |p| unknown.push(p.to_string())).expect("decodes");
        // `?` is an `Option` on the way, which the registry's paths leave out (`metadata.bogus`, `items[1].extra`).
        assert_eq!(unknown, ["items.?.1.?.extra", "metadata.?.bogus"]);
    }

    #[test]
    fn zero_time_is_go_s() {
        assert!(is_zero_time(&zero_time()));
        assert_eq!(serde_json::to_value(zero_time()).unwrap(), json!("0001-01-01T00:00:00Z"));
    }
}

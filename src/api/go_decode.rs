//! Decoding request bodies as kube-apiserver's decoder (sigs.k8s.io/json, Go's `encoding/json` rules) decodes them
//! into the Go types of a kind:
//!
//! - a field of a *value* type (string, number, bool, struct, slice, map, `metav1.Time`) that is missing or `null`
//!   is its zero value, never a decode error; validation then answers for it (a 422 with `Required value` beside the
//!   object's other errors, where a strict decoder would answer 400 `missing field` or `invalid type: null` alone);
//! - a `null` item of a slice and a `null` value of a map are the item type's zero value;
//! - a *pointer* field (`*string`, `*int64`, `*metav1.Time`, an optional struct) is nil when missing or `null`,
//!   which is what Rust's `Option` decodes to already;
//! - a value of the wrong JSON type is still a decode error (a 400 naming its path).
//!
//! A Go value field in Rust: `#[serde(default, deserialize_with = "go_decode::null_as_default")]` on a `String`,
//! number, bool or struct, [`list`] on a `Vec`, [`map`] on a `BTreeMap`, [`object_meta`] on `metadata`. Where a
//! value field is kept as an `Option` in Rust (None standing for the zero value), nothing is needed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

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
        serde_path_to_error::deserialize(v).map_err(|e| format!("{}: {}", e.path(), e.inner()))
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

    #[test]
    fn unknown_fields_are_still_seen() {
        let body = json!({"metadata": {"bogus": 1, "labels": {"a": null}}, "items": [null, {"extra": true}]});
        let mut unknown = Vec::new();
        let _: Object = serde_ignored::deserialize(body, |p| unknown.push(p.to_string())).expect("decodes");
        // `?` is an `Option` on the way, which the registry's paths leave out (`metadata.bogus`, `items[1].extra`).
        assert_eq!(unknown, ["items.?.1.?.extra", "metadata.?.bogus"]);
    }

    #[test]
    fn zero_time_is_go_s() {
        assert!(is_zero_time(&zero_time()));
        assert_eq!(serde_json::to_value(zero_time()).unwrap(), json!("0001-01-01T00:00:00Z"));
    }
}

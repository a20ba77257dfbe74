//! What structured merge needs to know of a kind's schema: which nodes are objects with fields, maps, lists (and how
//! their items are identified), or leaves. Read from the kind's OpenAPI schema and its markers, as
//! structured-merge-diff reads kube-apiserver's: `x-kubernetes-list-type` (`atomic`, `set`, `map` with
//! `x-kubernetes-list-map-keys`), `x-kubernetes-map-type: atomic`, and for lists without a list type the older
//! `x-kubernetes-patch-strategy: merge` with `x-kubernetes-patch-merge-key`; other lists are atomic. Object
//! metadata is Kubernetes' ObjectMeta with its upstream markers.

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// How a list's items are told apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// The list is one value.
    Atomic,
    /// Items are scalars, identified by value.
    Set,
    /// Items are objects, identified by these key fields.
    Map(Vec<String>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Scalar,
    /// An object: its declared fields, and the shape of the values of any other key (a map's values).
    Object {
        fields: BTreeMap<String, Shape>,
        values: Option<Box<Shape>>,
        atomic: bool,
    },
    List {
        items: Box<Shape>,
        kind: ListKind,
    },
    /// Any JSON (`x-kubernetes-preserve-unknown-fields`): objects are granular maps, lists atomic.
    Untyped,
}

const REF_PREFIXES: [&str; 2] = ["#/components/schemas/", "#/definitions/"];
const MAX_DEPTH: usize = 64;

impl Shape {
    /// The shape of a kind's object from its schema definitions (`root` names the kind's); `metadata` is
    /// Kubernetes' ObjectMeta.
    pub fn of_kind(root: &str, defs: &Map<String, Value>) -> Shape {
        let mut shape = defs.get(root).map_or(Shape::Untyped, |s| node(s, defs, 0));
        if let Shape::Object { fields, .. } = &mut shape {
            fields.insert("metadata".into(), object_meta());
            fields.insert("apiVersion".into(), Shape::Scalar);
            fields.insert("kind".into(), Shape::Scalar);
        }
        shape
    }

    fn object(fields: impl IntoIterator<Item = (&'static str, Shape)>) -> Shape {
        Shape::Object {
            fields: fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            values: None,
            atomic: false,
        }
    }
}

/// ObjectMeta as k8s.io/apimachinery declares it: labels and annotations granular maps, finalizers a set, owner
/// references a map list keyed by uid, managedFields atomic.
fn object_meta() -> Shape {
    let map_of_strings =
        Shape::Object { fields: BTreeMap::new(), values: Some(Box::new(Shape::Scalar)), atomic: false };
    let owner_reference = Shape::object(
        ["apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion"].map(|f| (f, Shape::Scalar)),
    );
    let mut fields: Vec<(&'static str, Shape)> = [
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ]
    .map(|f| (f, Shape::Scalar))
    .into();
    fields.push(("labels", map_of_strings.clone()));
    fields.push(("annotations", map_of_strings));
    fields.push(("finalizers", Shape::List { items: Box::new(Shape::Scalar), kind: ListKind::Set }));
    fields.push((
        "ownerReferences",
        Shape::List { items: Box::new(owner_reference), kind: ListKind::Map(vec!["uid".into()]) },
    ));
    fields.push(("managedFields", Shape::List { items: Box::new(Shape::Untyped), kind: ListKind::Atomic }));
    Shape::object(fields)
}

/// The schema a node stands for: references followed, single-schema wrappers (`allOf: [ref]`, `anyOf: [X,
/// null]`) unwrapped; the outer node's keys (markers) are kept over the inner's.
fn resolve(node: &Value, defs: &Map<String, Value>, depth: usize) -> Map<String, Value> {
    let Value::Object(m) = node else { return Map::new() };
    let mut out = Map::new();
    if depth < MAX_DEPTH {
        if let Some(r) = m.get("$ref").and_then(Value::as_str) {
            let name = REF_PREFIXES.iter().find_map(|p| r.strip_prefix(p)).unwrap_or(r);
            if let Some(def) = defs.get(name) {
                out = resolve(def, defs, depth + 1);
            }
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(list)) = m.get(key) {
                let non_null: Vec<&Value> = list.iter().filter(|v| !is_null_schema(v)).collect();
                if let [only] = non_null.as_slice() {
                    out.extend(resolve(only, defs, depth + 1));
                }
            }
        }
    }
    for (k, v) in m {
        if !["$ref", "allOf", "anyOf", "oneOf"].contains(&k.as_str()) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// `{type: null}` or `{enum: [null]}`: the null half of an optional value's `anyOf`.
fn is_null_schema(v: &Value) -> bool {
    v.get("type") == Some(&Value::from("null")) || v.get("enum") == Some(&Value::Array(vec![Value::Null]))
}

fn node(schema: &Value, defs: &Map<String, Value>, depth: usize) -> Shape {
    if depth > MAX_DEPTH {
        return Shape::Untyped;
    }
    let m = resolve(schema, defs, depth);
    let text = |k: &str| m.get(k).and_then(Value::as_str);
    let types: Vec<&str> = match m.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
        _ => Vec::new(),
    };
    let has = |k: &str| m.contains_key(k);
    if types == ["array"] || has("items") {
        let items = m.get("items").map_or(Shape::Untyped, |i| node(i, defs, depth + 1));
        let kind = match text("x-kubernetes-list-type") {
            Some("set") => ListKind::Set,
            Some("map") => ListKind::Map(strings(m.get("x-kubernetes-list-map-keys"))),
            Some(_) => ListKind::Atomic,
            None => match (text("x-kubernetes-patch-strategy"), text("x-kubernetes-patch-merge-key")) {
                (Some(s), Some(key)) if s.split(',').any(|s| s == "merge") => ListKind::Map(vec![key.to_string()]),
                _ => ListKind::Atomic,
            },
        };
        return Shape::List { items: Box::new(items), kind };
    }
    if types == ["object"] || has("properties") || has("additionalProperties") {
        if !has("properties") && !matches!(m.get("additionalProperties"), Some(Value::Object(_))) {
            // An object of anything (preserve-unknown-fields, or no declared content).
            return Shape::Untyped;
        }
        let fields = match m.get("properties") {
            Some(Value::Object(p)) => p.iter().map(|(k, v)| (k.clone(), node(v, defs, depth + 1))).collect(),
            _ => BTreeMap::new(),
        };
        let values = match m.get("additionalProperties") {
            Some(ap @ Value::Object(_)) => Some(Box::new(node(ap, defs, depth + 1))),
            _ => None,
        };
        let atomic = text("x-kubernetes-map-type") == Some("atomic");
        return Shape::Object { fields, values, atomic };
    }
    if types.is_empty() && !has("x-kubernetes-int-or-string") && !has("enum") && !has("format") {
        return Shape::Untyped;
    }
    Shape::Scalar
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn markers_decide_list_and_map_kinds() {
        let defs = json!({
            "K": {"type": "object", "properties": {
                "spec": {"$ref": "#/components/schemas/Spec"},
                "status": {"allOf": [{"$ref": "#/components/schemas/Status"}], "description": "d"}
            }},
            "Spec": {"type": "object", "properties": {
                "byName": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                           "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": "name"},
                "plain": {"type": "array", "items": {"type": "string"}},
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "sel": {"type": "object", "properties": {"a": {"type": "string"}}, "x-kubernetes-map-type": "atomic"},
                "any": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "n": {"type": ["integer", "null"]},
                "opt": {"anyOf": [{"$ref": "#/components/schemas/Status"}, {"enum": [null], "nullable": true}]}
            }},
            "Status": {"type": "object", "properties": {"conditions": {"type": "array", "items": {"type": "object"},
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}}}
        });
        let shape = Shape::of_kind("K", defs.as_object().unwrap());
        let Shape::Object { fields, .. } = &shape else { panic!("{shape:?}") };
        let Shape::Object { fields: spec, .. } = &fields["spec"] else { panic!() };
        let kind = |s: &Shape| match s {
            Shape::List { kind, .. } => kind.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(kind(&spec["byName"]), ListKind::Map(vec!["name".into()]));
        assert_eq!(kind(&spec["plain"]), ListKind::Atomic);
        assert_eq!(kind(&spec["tags"]), ListKind::Set);
        assert!(matches!(&spec["labels"], Shape::Object { values: Some(_), atomic: false, .. }));
        assert!(matches!(&spec["sel"], Shape::Object { atomic: true, .. }));
        assert_eq!(spec["any"], Shape::Untyped);
        assert_eq!(spec["n"], Shape::Scalar);
        assert!(
            matches!(&spec["opt"], Shape::Object { fields, .. } if fields.contains_key("conditions")),
            "an optional object"
        );
        let Shape::Object { fields: status, .. } = &fields["status"] else { panic!() };
        assert_eq!(kind(&status["conditions"]), ListKind::Map(vec!["type".into()]));
        let Shape::Object { fields: meta, .. } = &fields["metadata"] else { panic!() };
        assert_eq!(kind(&meta["finalizers"]), ListKind::Set);
        assert_eq!(kind(&meta["ownerReferences"]), ListKind::Map(vec!["uid".into()]));
    }
}

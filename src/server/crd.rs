//! CustomResourceDefinitions (apiextensions.k8s.io/v1) of our kinds, generated from the same Rust types and kind
//! table the aggregated API serves: the upstream deployment form, where kube-apiserver stores the objects and calls
//! our admission webhooks (`/mutate`, `/validate`) for defaulting and validation. `migration-apiserver crds`
//! prints them or writes `manifests/crds/`; `migration-apiserver manifests` writes them with the other generated
//! manifests (see `server::manifests`).
//!
//! The OpenAPI schemas become structural schemas as apiextensions requires: references inlined, every node typed,
//! optional values as their inner type, free-form JSON as `x-kubernetes-preserve-unknown-fields`, metadata just
//! `type: object` (kube-apiserver owns its schema). Printer columns are the kind's Table columns that a JSONPath can
//! express, then AGE, as in our Tables.

use super::openapi::{API_VERSION_DESCRIPTION, KIND_DESCRIPTION};
use crate::registry::strategy::{Strategy, Subresource};
use crate::server::manifests::GENERATED_HEADER;
use serde_json::{json, Map, Value};
use std::sync::Arc;

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const REF_PREFIX: &str = "#/components/schemas/";

/// The annotation kube-apiserver requires of CRDs in the protected `*.k8s.io` and `*.kubernetes.io` groups; its
/// value is the kind's ([`KindInfo::api_approved`](crate::registry::strategy::KindInfo::api_approved)).
const API_APPROVED: &str = "api-approved.kubernetes.io";
/// The label on every CRD this server's CRD form installs: it tells ours from another installation's CRDs of the
/// same names (kube-storage-version-migrator's), which the deploy kit must neither replace nor hide
/// (`server::cluster_check`).
pub const OWNER_LABEL: (&str, &str) = ("app.kubernetes.io/name", "migration-apiserver");

/// Formats apiextensions knows; others (schemars' `uint`, `uint32`, ...) are dropped, their bounds kept.
const FORMATS: &[&str] =
    &["int32", "int64", "float", "double", "byte", "binary", "date", "date-time", "password", "uuid"];

/// Schema keywords a structural schema may carry (besides the ones handled explicitly).
const KEPT: &[&str] = &[
    "description",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
];

/// Kubernetes descriptions are paragraphs; doc comments wrap lines.
fn paragraphs(d: &str) -> String {
    d.split("\n\n").map(|p| p.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n\n")
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type") == Some(&json!("null")) || v.get("enum") == Some(&json!([null]))
}

/// Why a kind's schema has no CRD form.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("schema nests too deep (recursive type?)")]
    TooDeep,
    #[error("unresolved schema reference {0}")]
    UnresolvedReference(String),
    #[error("{key} with {count} schemas has no structural form")]
    NotStructural { key: &'static str, count: usize },
    #[error("a node of types {0} has no structural form")]
    MixedTypes(String),
    #[error("no schema {0}")]
    NoSchema(String),
    #[error("{kind}: {error}")]
    OfKind { kind: &'static str, error: Box<CrdError> },
    #[error("{0}: the schema has no properties")]
    NoProperties(&'static str),
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// One schema node in structural form, references resolved against `defs`.
fn structural(node: &Value, defs: &Map<String, Value>, depth: usize) -> Result<Value, CrdError> {
    if depth > 64 {
        return Err(CrdError::TooDeep);
    }
    let m = match node {
        Value::Object(m) if !m.is_empty() => m,
        // `true` or `{}`: any JSON value.
        _ => return Ok(json!({"x-kubernetes-preserve-unknown-fields": true})),
    };
    let mut out = folded(m, defs, depth)?;
    node_type(m, &mut out)?;
    if let Some(f) = m.get("format").and_then(Value::as_str).filter(|f| FORMATS.contains(f)) {
        out.insert("format".into(), json!(f));
    }
    if let Some(c) = m.get("const") {
        out.insert("enum".into(), json!([c]));
    }
    for (k, v) in m {
        // apiextensions knows its own x-kubernetes- keys only; the patch-strategy markers the served OpenAPI
        // carries (as kube-apiserver's built-in types do) have list-type equivalents there.
        if KEPT.contains(&k.as_str()) || (k.starts_with("x-kubernetes-") && !k.starts_with("x-kubernetes-patch-")) {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(Value::String(d)) = out.get("description") {
        let d = paragraphs(d);
        out.insert("description".into(), json!(d));
    }
    children(m, defs, depth, &mut out)?;
    if !out.contains_key("type") && !out.contains_key("x-kubernetes-int-or-string") {
        out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
    Ok(Value::Object(out))
}

/// A node's references and single-schema wrappers (allOf [ref], anyOf [X, null]) folded into one node, on which
/// the node's own keys (description, extensions) then win over the referenced schema's.
fn folded(m: &Map<String, Value>, defs: &Map<String, Value>, depth: usize) -> Result<Map<String, Value>, CrdError> {
    let mut base: Option<Value> = None;
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix(REF_PREFIX).unwrap_or(r);
        base = Some(if name == OBJECT_META {
            json!({"type": "object"})
        } else {
            let def = defs.get(name).ok_or_else(|| CrdError::UnresolvedReference(r.to_string()))?;
            structural(def, defs, depth + 1)?
        });
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = m.get(key) {
            let inner: Vec<&Value> = list.iter().filter(|v| !is_null_schema(v)).collect();
            if inner.len() != 1 || (key == "allOf" && list.len() != 1) {
                return Err(CrdError::NotStructural { key, count: list.len() });
            }
            base = Some(structural(inner[0], defs, depth + 1)?);
        }
    }
    Ok(match base {
        Some(Value::Object(b)) => b,
        _ => Map::new(),
    })
}

/// The node's type, without `null` (nullability is not structural).
fn node_type(m: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), CrdError> {
    match m.get("type") {
        Some(Value::String(t)) if t != "null" => {
            out.insert("type".into(), json!(t));
        }
        Some(Value::Array(ts)) => {
            let ts: Vec<&Value> = ts.iter().filter(|t| t.as_str() != Some("null")).collect();
            match ts.as_slice() {
                [t] => {
                    out.insert("type".into(), (*t).clone());
                }
                _ => return Err(CrdError::MixedTypes(format!("{ts:?}"))),
            }
        }
        _ => {}
    }
    Ok(())
}

/// The node's properties, items and map values, each in structural form.
fn children(
    m: &Map<String, Value>,
    defs: &Map<String, Value>,
    depth: usize,
    out: &mut Map<String, Value>,
) -> Result<(), CrdError> {
    if let Some(Value::Object(props)) = m.get("properties") {
        let mut p = Map::new();
        for (k, v) in props {
            p.insert(k.clone(), structural(v, defs, depth + 1)?);
        }
        out.insert("properties".into(), Value::Object(p));
        out.entry("type").or_insert(json!("object"));
    }
    if let Some(items) = m.get("items") {
        let mut items = structural(items, defs, depth + 1)?;
        // apiextensions wants a map list's keys required (or defaulted); validation requires them anyway.
        if let (Some("map"), Some(Value::Array(keys))) =
            (m.get("x-kubernetes-list-type").and_then(Value::as_str), m.get("x-kubernetes-list-map-keys"))
        {
            let required = items.as_object_mut().map(|o| o.entry("required").or_insert(json!([])));
            if let Some(Value::Array(required)) = required {
                required.extend(keys.iter().filter(|k| !required.contains(k)).cloned().collect::<Vec<_>>());
            }
        }
        out.insert("items".into(), items);
    }
    // A map's value schema; `additionalProperties: false` (closed objects) has no place in a structural schema.
    if let Some(ap @ Value::Object(_)) = m.get("additionalProperties") {
        out.insert("additionalProperties".into(), structural(ap, defs, depth + 1)?);
        out.entry("type").or_insert(json!("object"));
    }
    Ok(())
}

/// The kind's `openAPIV3Schema`.
pub fn schema(kind: &dyn Strategy) -> Result<Value, CrdError> {
    let (name, defs) = kind.schemas();
    let root = defs.get(&name).ok_or_else(|| CrdError::NoSchema(name.clone()))?;
    let mut s =
        structural(root, &defs, 0).map_err(|e| CrdError::OfKind { kind: kind.info().kind, error: Box::new(e) })?;
    s["type"] = json!("object");
    let props = s.as_object_mut().and_then(|o| o.get_mut("properties")).and_then(Value::as_object_mut);
    let Some(props) = props else { return Err(CrdError::NoProperties(kind.info().kind)) };
    props.insert("apiVersion".into(), json!({"type": "string", "description": API_VERSION_DESCRIPTION}));
    props.insert("kind".into(), json!({"type": "string", "description": KIND_DESCRIPTION}));
    // Only `type: object` (and properties name and generateName, which we do not give): apiextensions refuses a
    // CRD whose metadata schema has anything else, even a description ("must not specify anything other than name
    // and generateName, but metadata is implicitly specified"; pkg/apiserver/schema/validation.go).
    props.insert("metadata".into(), json!({"type": "object"}));
    Ok(s)
}

/// `additionalPrinterColumns`: the kind's columns with a JSONPath, AGE, then the wide ones among them (priority 1),
/// in the order the served Table has them.
fn printer_columns(kind: &dyn Strategy) -> Vec<Value> {
    let columns = kind.columns();
    let (narrow, wide) = columns.split_at(crate::registry::strategy::Column::before_age(&columns));
    let mut cols: Vec<Value> = narrow.iter().filter_map(printer_column).collect();
    cols.push(json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}));
    cols.extend(wide.iter().filter_map(printer_column));
    cols
}

/// One column of a CRD; `None` for a computed column no JSONPath expresses.
fn printer_column(c: &crate::registry::strategy::Column) -> Option<Value> {
    let mut v = json!({"name": c.name, "type": c.type_, "jsonPath": c.json_path?, "description": c.description});
    if !c.format.is_empty() {
        v["format"] = json!(c.format);
    }
    if c.priority != 0 {
        v["priority"] = json!(c.priority);
    }
    Some(v)
}

/// The CustomResourceDefinition of one kind: every served version (the same schema), the storage version stored.
pub fn crd(kind: &dyn Strategy) -> Result<Value, CrdError> {
    let i = kind.info();
    let schema = schema(kind)?;
    let columns = printer_columns(kind);
    let versions: Vec<Value> = i
        .versions
        .iter()
        .map(|v| {
            let mut ver = json!({
                "name": v,
                "served": true,
                "storage": *v == kind.storage_version(),
                "schema": {"openAPIV3Schema": schema},
                "additionalPrinterColumns": columns,
            });
            if kind.serves(Subresource::Status) {
                ver["subresources"] = json!({"status": {}});
            }
            ver
        })
        .collect();
    let mut names = json!({"kind": i.kind, "listKind": i.list_kind, "plural": i.plural, "singular": i.singular});
    if !i.short_names.is_empty() {
        names["shortNames"] = json!(i.short_names);
    }
    if !i.categories.is_empty() {
        names["categories"] = json!(i.categories);
    }
    let mut metadata = json!({"name": i.qualified_resource(), "labels": {OWNER_LABEL.0: OWNER_LABEL.1}});
    if let Some(value) = i.api_approved {
        metadata["annotations"] = json!({API_APPROVED: value});
    }
    Ok(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": i.group,
            "names": names,
            "scope": if i.namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
        },
    }))
}

/// The file of a kind's CRD: `<group>_<plural>.yaml`, as controller-gen names them.
pub fn file_name(kind: &dyn Strategy) -> String {
    format!("{}_{}.yaml", kind.info().group, kind.info().plural)
}

fn yaml(v: &Value) -> Result<String, CrdError> {
    Ok(serde_yaml_ng::to_string(v)?)
}

/// The kinds that have a CRD form: create-only virtual kinds store nothing, so kube-apiserver has nothing to keep.
pub fn stored(kinds: &[Arc<dyn Strategy>]) -> impl Iterator<Item = &Arc<dyn Strategy>> {
    kinds.iter().filter(|k| !k.info().create_only)
}

/// Every generated file of `manifests/crds/` (name, content): one CRD per kind and the kustomization listing them.
pub fn files(kinds: &[Arc<dyn Strategy>]) -> Result<Vec<(String, String)>, CrdError> {
    let mut out = Vec::new();
    for k in stored(kinds) {
        out.push((file_name(k.as_ref()), format!("{GENERATED_HEADER}{}", yaml(&crd(k.as_ref())?)?)));
    }
    out.push(crate::server::manifests::kustomization(&out)?);
    Ok(out)
}

/// All CRDs as one YAML stream (for `kubectl apply -f -`).
pub fn stream(kinds: &[Arc<dyn Strategy>]) -> Result<String, CrdError> {
    let mut out = String::from(GENERATED_HEADER);
    for (i, k) in stored(kinds).enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&yaml(&crd(k.as_ref())?)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds() -> Vec<Arc<dyn Strategy>> {
        let all = crate::api::kinds(&Default::default()).unwrap();
        stored(&all).cloned().collect()
    }

    /// Every node typed (or explicitly free-form), no references or combinators left: apiextensions' rules.
    fn assert_structural(v: &Value, path: &str) {
        let m = v.as_object().unwrap_or_else(|| panic!("{path}: not an object"));
        for k in ["$ref", "allOf", "anyOf", "oneOf", "not", "nullable", "default", "uniqueItems", "title"] {
            assert!(!m.contains_key(k), "{path}: has {k}");
        }
        let free = m.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
            || m.contains_key("x-kubernetes-int-or-string");
        assert!(m.get("type").is_some_and(Value::is_string) || free, "{path}: no type");
        if let Some(Value::Object(p)) = m.get("properties") {
            for (k, s) in p {
                assert_structural(s, &format!("{path}.{k}"));
            }
        }
        if let Some(s) = m.get("items") {
            assert_structural(s, &format!("{path}[]"));
        }
        if let Some(s) = m.get("additionalProperties") {
            assert_structural(s, &format!("{path}{{}}"));
        }
    }

    /// kube-apiserver refuses a CRD of a protected group without the annotation: every such kind says what it is.
    #[test]
    fn protected_groups_carry_their_kinds_api_approved_text() {
        for k in kinds() {
            let (info, crd) = (k.info(), crd(k.as_ref()).expect("crd"));
            let protected = info.group.ends_with(".k8s.io") || info.group.ends_with(".kubernetes.io");
            let value = crd["metadata"]["annotations"][API_APPROVED].as_str();
            assert_eq!(value.is_some(), protected, "{}", info.qualified_resource());
            assert!(value.is_none_or(|v| v.starts_with("unapproved, ")), "{value:?}");
        }
    }

    #[test]
    fn schemas_are_structural() {
        for k in kinds() {
            let s = schema(k.as_ref()).unwrap();
            assert_structural(&s, k.info().kind);
            assert_eq!(s["properties"]["metadata"], json!({"type": "object"}), "as apiextensions allows it");
        }
    }

    #[test]
    fn crds_carry_the_kind_table() {
        for k in kinds() {
            let c = crd(k.as_ref()).unwrap();
            let i = k.info();
            assert_eq!(c["metadata"]["name"], i.qualified_resource());
            assert_eq!(c["spec"]["scope"], if i.namespaced { "Namespaced" } else { "Cluster" });
            let versions = c["spec"]["versions"].as_array().unwrap();
            assert_eq!(versions.len(), i.versions.len());
            assert_eq!(versions.iter().filter(|v| v["storage"] == true).count(), 1);
            for v in versions {
                assert_eq!(v.get("subresources").is_some(), k.serves(Subresource::Status));
                let cols = v["additionalPrinterColumns"].as_array().unwrap();
                // AGE after the kind's columns, before the wide ones, as in the served Table.
                let age = cols.iter().position(|c| c["name"] == "Age").unwrap();
                assert!(cols[..age].iter().all(|c| c.get("priority").is_none()), "{cols:?}");
                assert!(cols[age + 1..].iter().all(|c| c["priority"] == 1), "{cols:?}");
            }
        }
    }
}

//! Table output (`as=Table`), built from a kind's printer columns; Name first and Age last, as for CRDs.

use crate::api::printers::human_duration;
use crate::api::Strategy;
use serde_json::{json, Value};

/// What rows carry (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> Result<Self, crate::error::ApiError> {
        match s.unwrap_or("Metadata") {
            "" | "Metadata" => Ok(IncludeObject::Metadata),
            "None" => Ok(IncludeObject::None),
            "Object" => Ok(IncludeObject::Object),
            other => Err(crate::error::ApiError::bad_request(format!(
                "includeObject: unsupported value {other:?}: supported values: \"None\", \"Metadata\", \"Object\""
            ))),
        }
    }
}

pub fn column_definitions(strategy: &dyn Strategy) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    })];
    cols.extend(strategy.columns().into_iter().map(|c| serde_json::to_value(c).unwrap_or(Value::Null)));
    cols.push(json!({
        "name": "Age", "type": "date", "format": "", "priority": 0,
        "description": "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.",
    }));
    cols
}

/// A JSON object of `fields`, moved in (`json!` would deep-copy every interpolated value).
pub fn object<const N: usize>(fields: [(&str, Value); N]) -> Value {
    Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// An object reduced to its metadata.
pub fn partial_metadata(mut obj: Value, meta_version: &str) -> Value {
    let metadata = obj.get_mut("metadata").map(Value::take).unwrap_or_else(|| json!({}));
    object([
        ("kind", Value::String("PartialObjectMetadata".into())),
        ("apiVersion", Value::String(format!("meta.k8s.io/{meta_version}"))),
        ("metadata", metadata),
    ])
}

fn age(obj: &Value, now: chrono::DateTime<chrono::Utc>) -> Value {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| Value::String(human_duration(now - t.with_timezone(&chrono::Utc))))
        .unwrap_or_else(|| Value::String("<unknown>".into()))
}

pub fn row(
    strategy: &dyn Strategy,
    obj: Value,
    include: IncludeObject,
    meta_version: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Value {
    let mut cells = vec![obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
    cells.extend(strategy.cells(&obj, now));
    cells.push(age(&obj, now));
    let cells = Value::Array(cells);
    match include {
        IncludeObject::None => object([("cells", cells)]),
        IncludeObject::Metadata => object([("cells", cells), ("object", partial_metadata(obj, meta_version))]),
        IncludeObject::Object => object([("cells", cells), ("object", obj)]),
    }
}

/// A Table of `objects`; `columns` false leaves out columnDefinitions (watch events after the first).
pub fn table(
    strategy: &dyn Strategy,
    objects: Vec<Value>,
    include: IncludeObject,
    meta_version: &str,
    list_meta: Value,
    columns: bool,
) -> Value {
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objects.into_iter().map(|o| row(strategy, o, include, meta_version, now)).collect();
    let defs = if columns { Value::Array(column_definitions(strategy)) } else { Value::Array(vec![]) };
    object([
        ("kind", Value::String("Table".into())),
        ("apiVersion", Value::String(format!("meta.k8s.io/{meta_version}"))),
        ("metadata", list_meta),
        ("columnDefinitions", defs),
        ("rows", Value::Array(rows)),
    ])
}

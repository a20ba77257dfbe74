//! Table output (`as=Table`), built from a kind's printer columns; Name first and Age last, as for CRDs.

use crate::api::printers::human_duration;
use crate::registry::strategy::{Column, Strategy};
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
            // kube-apiserver's ValidateTableOptions, as its Table conversion answers it.
            other => {
                let cause = crate::error::FieldError::invalid(
                    "includeObject",
                    other,
                    "must be 'Metadata', 'Object', 'None', or empty",
                );
                Err(crate::error::ApiError::bad_request(format!(
                    "Unable to convert to Table as requested: {}",
                    cause.message
                )))
            }
        }
    }
}

/// Name, the kind's columns, Age, then the kind's wide columns (priority 1, shown by `kubectl get -o wide`); only
/// the kind's columns for a kind without Name and Age ([`Strategy::name_and_age_columns`]).
pub fn column_definitions(strategy: &dyn Strategy) -> Vec<Value> {
    if !strategy.name_and_age_columns() {
        return strategy.columns().into_iter().map(|c| serde_json::to_value(c).unwrap_or(Value::Null)).collect();
    }
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    })];
    let columns = strategy.columns();
    let age_at = 1 + Column::before_age(&columns);
    cols.extend(columns.into_iter().map(|c| serde_json::to_value(c).unwrap_or(Value::Null)));
    cols.insert(
        age_at,
        json!({
            "name": "Age", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.",
        }),
    );
    cols
}

/// Where the Age cell goes in a row of `strategy`: where [`column_definitions`] puts the Age column.
fn age_index(strategy: &dyn Strategy) -> usize {
    1 + Column::before_age(&strategy.columns())
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

/// The Age cell of an object created at `created` (RFC 3339).
fn age(created: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> Value {
    created
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
    let cells = match strategy.name_and_age_columns() {
        true => {
            let mut cells = vec![obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            cells.extend(strategy.cells(&obj, now));
            let created = obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str);
            cells.insert(age_index(strategy), age(created, now));
            cells
        }
        false => strategy.cells(&obj, now),
    };
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

/// A Table row written from an object's stored JSON (no `Value` of the whole object): the cells from a typed
/// decode, the object as PartialObjectMetadata or the whole object spliced from the stored bytes. `None` when the
/// stored bytes are not in the shape this server writes; the caller then takes the parsed path.
pub fn raw_row(
    strategy: &dyn Strategy,
    stored: &[u8],
    revision: u64,
    api_version: &str,
    include: IncludeObject,
    meta_version: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Vec<u8>> {
    use serde_json::value::RawValue;
    use std::borrow::Cow;
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow)]
        metadata: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow)]
        name: Option<Cow<'a, str>>,
        #[serde(rename = "creationTimestamp", borrow)]
        creation_timestamp: Option<Cow<'a, str>>,
    }
    if !crate::registry::decode::reads_within_depth(stored) {
        return None;
    }
    let head: Head = serde_json::from_slice(stored).ok()?;
    let meta_raw = head.metadata.map_or("{}", RawValue::get);
    // Where the metadata is within `stored` (it is borrowed from it).
    let span = head.metadata.map(|m| {
        let start = m.get().as_ptr() as usize - stored.as_ptr() as usize;
        start..start + m.get().len()
    });
    let meta: Meta = serde_json::from_str(meta_raw).ok()?;
    let cells = match strategy.name_and_age_columns() {
        true => {
            let mut cells = vec![meta.name.map_or(Value::Null, |n| Value::String(n.into_owned()))];
            cells.extend(strategy.cells_from_json(stored, span, now)?);
            cells.insert(age_index(strategy), age(meta.creation_timestamp.as_deref(), now));
            cells
        }
        false => strategy.cells_from_json(stored, span, now)?,
    };
    let mut out = Vec::with_capacity(256 + if include == IncludeObject::None { 0 } else { stored.len() });
    out.extend_from_slice(b"{\"cells\":");
    serde_json::to_writer(&mut out, &cells).ok()?;
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            out.extend_from_slice(b",\"object\":{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/");
            out.extend_from_slice(meta_version.as_bytes());
            out.extend_from_slice(b"\",\"metadata\":");
            crate::registry::splice_metadata(&mut out, meta_raw, revision)?;
            out.push(b'}');
        }
        IncludeObject::Object => {
            let object = crate::registry::splice_stored(stored, revision, api_version, strategy.info().kind)?;
            out.extend_from_slice(b",\"object\":");
            out.extend_from_slice(&object);
        }
    }
    out.push(b'}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_rows_equal_parsed_rows() {
        let mut kinds = crate::api::kinds(&Default::default()).expect("kinds");
        // Events print kube-apiserver's own whole column set (no Name first, no Age).
        kinds.push(std::sync::Arc::new(crate::registry::store::Store::<crate::api::event::Event>::new("v1")));
        let kind = |k: &str| kinds.iter().find(|s| s.info().kind == k).expect("kind").clone();
        let meta = json!({"name": "m", "namespace": "n", "uid": "u", "creationTimestamp": "2026-11-20T10:00:00Z",
                          "labels": {"a": "b\u{1}\"resourceVersion\""}});
        let cases = [
            (
                kind("StorageVersionMigration"),
                json!({
                    "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration", "metadata": meta,
                    "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
                    "status": {"conditions": [{"type": "Running", "status": "True", "lastUpdateTime": "2026-11-20T10:00:00Z"}],
                               "migratedObjects": 7},
                }),
            ),
            (
                kind("StorageState"),
                json!({
                    "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": "d.apps"},
                    "spec": {"resource": {"group": "apps", "resource": "d"}},
                    "status": {"currentStorageVersionHash": "h", "persistedStorageVersionHashes": ["a", "b"],
                               "lastHeartbeatTime": "2026-11-21T03:00:00Z"},
                }),
            ),
            // ShootState's SIZE cell measures the whole object, metadata included.
            (
                kind("ShootState"),
                json!({
                    "apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState", "metadata": meta,
                    "spec": {"gardener": [{"name": "ca", "data": {"k": "v"}}], "extensions": [{"kind": "Infrastructure"}]},
                }),
            ),
            (
                kind("Event"),
                json!({
                    "apiVersion": "v1", "kind": "Event", "metadata": meta, "reason": "Done", "type": "Normal",
                    "involvedObject": {"kind": "StorageVersionMigration", "name": "m"}, "message": "ok",
                    "eventTime": "2026-11-21T03:00:00.000000Z", "reportingComponent": "c", "reportingInstance": "i",
                }),
            ),
        ];
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-21T04:00:00Z").unwrap().with_timezone(&chrono::Utc);
        for (strategy, stored) in cases {
            let bytes = serde_json::to_vec(&stored).unwrap();
            let api_version = stored["apiVersion"].as_str().unwrap();
            let mut obj = stored.clone();
            obj["metadata"]["resourceVersion"] = json!("9");
            for include in [IncludeObject::None, IncludeObject::Metadata, IncludeObject::Object] {
                let raw = raw_row(strategy.as_ref(), &bytes, 9, api_version, include, "v1", now).expect("raw");
                let raw: Value = serde_json::from_slice(&raw).expect("valid JSON");
                let parsed = row(strategy.as_ref(), obj.clone(), include, "v1", now);
                assert_eq!(raw, parsed, "{} {include:?}", strategy.info().kind);
            }
        }
        let svm = kind("StorageVersionMigration");
        assert!(raw_row(svm.as_ref(), b"not json", 1, "v", IncludeObject::None, "v1", now).is_none());
    }
}

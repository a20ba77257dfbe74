//! The typed store: the generic registry's steps on one kind's Rust type, like k8s.io/apiserver's generic store
//! with a kind's strategy. A request body is decoded once into `K` (unknown fields noted by `serde_ignored`), every
//! step runs on `&mut K`, and the object is encoded once for storage. [`Store`] is the one implementation of the
//! object-safe [`Strategy`]: types are erased there, at the router's edge, and nowhere else.

use super::managed::shape::Shape;
use super::strategy::{
    kind_schemas, note_unknown, path_string, Admit, Column, Defaulted, Kind, KindInfo, KindStatus, Strategy,
    Subresource, Validated, WithTypeMeta,
};
use super::{
    check_namespace, decode, steps, too_deep_error, unknown_field_warnings, Change, DeleteOptions, FieldValidation,
    ObjectRef, Resource, WriteOptions, Written,
};
use crate::error::{ApiError, ApiResult};
use crate::go_decode::GoStructs;
use crate::storage::{KeyValue, Storage, StorageError};
use bytes::Bytes;
use serde_json::Value;
use std::marker::PhantomData;

/// One kind's typed store; the storage it writes to is the [`Resource`]'s.
pub struct Store<K: Kind> {
    storage_version: String,
    /// The kind's schema as structured merge reads it (server-side apply, managedFields).
    pub(super) shape: Shape,
    _k: PhantomData<fn() -> K>,
}

impl<K: Kind> Store<K> {
    pub fn new(storage_version: &str) -> Self {
        let (root, defs) = kind_schemas::<K>();
        Store { storage_version: storage_version.to_string(), shape: Shape::of_kind(&root, &defs), _k: PhantomData }
    }
}

/// A request's object decoded into the kind's type, and the fields the decoder did not know, sorted; a value of
/// the wrong type (a JSON array for a struct included, as Go's decoder has it: [`GoStructs`]) is a 400 naming its
/// path. Without the kind's defaults (see [`decode_defaulted`]).
pub(super) fn decode_typed<K: Kind>(obj: &Value) -> ApiResult<(K, Vec<String>)> {
    let mut unknown = Vec::new();
    // Objects that decode (nearly all) take one pass; the path of an error is found by decoding again.
    let typed: K = match serde_ignored::deserialize(GoStructs(obj), |p| note_unknown(&p, &mut unknown)) {
        Ok(typed) => typed,
        Err(_) => {
            let e = serde_path_to_error::deserialize::<_, K>(GoStructs(obj)).err();
            let (path, inner) = match e {
                Some(e) => (path_string(e.path()), e.into_inner().to_string()),
                None => (String::new(), "the object does not decode".to_string()),
            };
            let at = if path.is_empty() || path == "?" { String::new() } else { format!(" at {path}") };
            return Err(ApiError::bad_request(format!("error decoding {}{at}: {inner}", K::info().kind)));
        }
    };
    unknown.sort();
    unknown.dedup();
    Ok((typed, unknown))
}

/// [`decode_typed`] with the kind's defaults, as every request's object is decoded.
pub(super) fn decode_defaulted<K: Kind>(obj: &Value) -> ApiResult<(K, Vec<String>)> {
    let (mut typed, unknown) = decode_typed::<K>(obj)?;
    typed.defaults();
    Ok((typed, unknown))
}

/// Where a write goes: to storage, or, for a dry run, nowhere after the checks storage would make (a create of a
/// taken name fails as the real one would). The one place dry-run is decided; a revision is `None` when nothing
/// was written.
pub(super) enum Sink<'a> {
    Storage(&'a dyn Storage),
    DryRun(&'a dyn Storage),
}

impl<'a> Sink<'a> {
    pub(super) fn new(storage: &'a dyn Storage, dry_run: bool) -> Self {
        if dry_run {
            Sink::DryRun(storage)
        } else {
            Sink::Storage(storage)
        }
    }
    pub(super) async fn create(&self, key: &str, value: Bytes) -> Result<Option<u64>, StorageError> {
        match self {
            Sink::Storage(s) => s.create(key, value).await.map(|kv| Some(kv.mod_revision)),
            Sink::DryRun(s) => match s.get(key).await? {
                Some(_) => Err(StorageError::AlreadyExists { key: key.to_string() }),
                None => Ok(None),
            },
        }
    }
    pub(super) async fn update(&self, key: &str, value: Bytes, expected: u64) -> Result<Option<u64>, StorageError> {
        match self {
            Sink::Storage(s) => s.update(key, value, expected).await.map(|kv| Some(kv.mod_revision)),
            Sink::DryRun(_) => Ok(None),
        }
    }
    pub(super) async fn delete(&self, key: &str, expected: u64) -> Result<Option<u64>, StorageError> {
        match self {
            Sink::Storage(s) => s.delete(key, Some(expected)).await.map(|kv| Some(kv.mod_revision)),
            Sink::DryRun(_) => Ok(None),
        }
    }
}

impl<K: Kind> Store<K> {
    /// A request body for this kind: apiVersion/kind checked, decoded once into `K` with its defaults, unknown and
    /// duplicate fields reported as `fieldValidation` says.
    pub(super) fn decode_body(
        at: &Resource,
        body: &Value,
        dups: &[String],
        version: &str,
        fv: FieldValidation,
    ) -> ApiResult<(K, Vec<String>)> {
        at.check_type_meta(body, version)?;
        let (typed, unknown) = decode_defaulted::<K>(body)?;
        let mut problems = unknown_field_warnings(&unknown);
        problems.extend(dups.iter().map(|f| format!("duplicate field {f:?}")));
        let warnings = match fv {
            FieldValidation::Strict if !problems.is_empty() => {
                // kube-apiserver's wording, which clients and tools match on.
                return Err(ApiError::bad_request(format!(
                    "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                    problems.join(", "),
                    kind = K::info().kind
                )));
            }
            FieldValidation::Warn => problems,
            _ => Vec::new(),
        };
        Ok((typed, warnings))
    }

    /// A stored object, with its revision as resourceVersion. What does not decode into the kind's type is a store
    /// read error naming the key (corruption, or data written by something other than this server).
    pub(super) fn read(kv: &KeyValue) -> ApiResult<K> {
        let decoded = match K::stored_as() {
            Some(stored) => (stored.decode)(&kv.value),
            None => serde_json::from_slice(&kv.value),
        };
        let mut obj: K = decoded.map_err(|e| {
            let why = match decode::read_stored(&kv.value) {
                Err(unreadable) => unreadable.to_string(),
                Ok(_) => format!("the stored object does not decode as {}: {e}", K::info().kind),
            };
            ApiError::from(StorageError::corrupt(&kv.key, why))
        })?;
        obj.meta_mut().resource_version = Some(kv.mod_revision.to_string());
        Ok(obj)
    }

    /// The stored encoding: the storage version, without resourceVersion (the revision is the resourceVersion).
    /// Refused when it nests deeper than reads take back, or is larger than the store takes.
    pub(super) fn encode(&self, at: &Resource, obj: &mut K) -> ApiResult<Bytes> {
        let info = K::info();
        let resource_version = obj.meta_mut().resource_version.take();
        let api_version = info.api_version(&self.storage_version);
        let encoded = match K::stored_as() {
            Some(stored) => (stored.encode)(obj),
            None => serde_json::to_vec(&WithTypeMeta { api_version: &api_version, kind: info.kind, object: &*obj }),
        };
        obj.meta_mut().resource_version = resource_version;
        let bytes = encoded.map_err(|e| ApiError::internal(e.to_string()))?;
        let name = obj.meta().name.clone().unwrap_or_default();
        if !decode::nests_within(&bytes, decode::MAX_NESTING_DEPTH) {
            let path = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| decode::too_deep(&v));
            return Err(at.invalid(&name, vec![too_deep_error(path.unwrap_or_default())]));
        }
        if bytes.len() > at.config.max_object_bytes {
            return Err(ApiError::too_large(format!(
                "{} {name:?} is too large: the encoded object is {} bytes, the limit is {} bytes",
                info.qualified_resource(),
                bytes.len(),
                at.config.max_object_bytes
            )));
        }
        Ok(Bytes::from(bytes))
    }

    /// The object as the client sees it in `version`.
    pub(super) fn response(obj: &K, version: &str) -> ApiResult<Value> {
        let info = K::info();
        let api_version = info.api_version(version);
        serde_json::to_value(WithTypeMeta { api_version: &api_version, kind: info.kind, object: obj })
            .map_err(|e| ApiError::internal(e.to_string()))
    }
}

#[async_trait::async_trait]
impl<K: Kind> Strategy for Store<K> {
    fn info(&self) -> &'static KindInfo {
        K::info()
    }
    fn storage_version(&self) -> &str {
        &self.storage_version
    }
    async fn create(
        &self,
        at: &Resource,
        namespace: Option<&str>,
        version: &str,
        body: Value,
        dups: &[String],
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        self.create_typed(at, namespace, version, &body, dups, opts).await
    }
    async fn update(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        change: Change,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        self.update_typed(at, target, change, subresource, opts).await
    }
    async fn delete(&self, at: &Resource, target: &ObjectRef<'_>, opts: &DeleteOptions) -> ApiResult<Value> {
        self.delete_typed(at, target, opts).await
    }
    fn admit(&self, namespace: Option<&str>, write: Admit<'_>) -> ApiResult<Validated> {
        let namespaced = K::info().namespaced;
        let (mut typed, unknown_fields) = decode_defaulted::<K>(write.object)?;
        let old = match write.old {
            Some((old, subresource)) => Some((decode_defaulted::<K>(old)?.0, subresource)),
            None => None,
        };
        check_namespace(namespaced, &mut typed.meta_mut().namespace, namespace)?;
        let errors = match old {
            None => {
                steps::prepare_create(&mut typed);
                steps::validate_create(&typed)
            }
            Some((mut old, subresource)) => {
                check_namespace(namespaced, &mut old.meta_mut().namespace, namespace)?;
                steps::validate_update(&typed, &old, subresource)
            }
        };
        let name = typed.meta_mut().name.take().unwrap_or_default();
        Ok(Validated { name, errors, unknown_fields })
    }
    fn defaulted(&self, obj: &Value, create: bool) -> Result<Defaulted, ApiError> {
        let to_value = |typed: &K| serde_json::to_value(typed).map_err(|e| ApiError::internal(e.to_string()));
        let (mut typed, unknown_fields) = decode_typed::<K>(obj)?;
        let before = to_value(&typed)?;
        typed.defaults();
        if create {
            steps::default_create(&mut typed);
        }
        Ok(Defaulted { before, after: to_value(&typed)?, unknown_fields })
    }
    fn serves(&self, subresource: Subresource) -> bool {
        match subresource {
            Subresource::Main => true,
            Subresource::Status => K::Status::SUBRESOURCE,
        }
    }
    fn columns(&self) -> Vec<Column> {
        K::columns()
    }
    fn cells(&self, obj: &Value, now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        match K::deserialize(obj) {
            Ok(t) => t.cells(now),
            Err(_) => K::columns().iter().map(|_| Value::Null).collect(),
        }
    }
    fn cells_from_json(
        &self,
        json: &[u8],
        metadata: Option<std::ops::Range<usize>>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<Vec<Value>> {
        match metadata.filter(|m| !K::CELLS_READ_METADATA && m.end <= json.len() && m.start <= m.end) {
            // The object with `"metadata":{}`: decoding ObjectMeta is much of the cost of a row.
            Some(m) => {
                let mut blanked = Vec::with_capacity(json.len() - m.len() + 2);
                blanked.extend_from_slice(&json[..m.start]);
                blanked.extend_from_slice(b"{}");
                blanked.extend_from_slice(&json[m.end..]);
                serde_json::from_slice::<K>(&blanked).ok().map(|t| t.cells(now))
            }
            None => serde_json::from_slice::<K>(json).ok().map(|t| t.cells(now)),
        }
    }
    fn schemas(&self) -> (String, serde_json::Map<String, Value>) {
        kind_schemas::<K>()
    }
    fn stored_info(&self) -> &'static KindInfo {
        K::stored_as().map_or(K::info(), |stored| stored.info)
    }
    fn convert_stored(&self, stored: &[u8]) -> Option<serde_json::Result<serde_json::Map<String, Value>>> {
        let decode = K::stored_as()?.decode;
        Some(decode(stored).and_then(|obj| serde_json::to_value(obj)).and_then(serde_json::from_value))
    }
    fn field_labels(&self) -> &'static [&'static str] {
        K::FIELD_LABELS
    }
    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        K::deserialize(obj).map(|typed| typed.selectable_fields()).unwrap_or_default()
    }
    fn name_and_age_columns(&self) -> bool {
        K::NAME_AND_AGE_COLUMNS
    }
}

#[cfg(test)]
mod tests {
    use super::decode_typed;
    use crate::api::{
        csi_translation, event, events_event, namespace, shoot_state, storage_state, storage_version_migration,
        storagemigration,
    };
    use crate::registry::strategy::Kind;
    use serde_json::{json, Value};

    /// The 400 `body` gets, as `reason: message`.
    fn refused<K: Kind>(body: Value) -> String {
        let e = decode_typed::<K>(&body).err().unwrap_or_else(|| panic!("{body} decodes"));
        assert_eq!(e.code, 400, "{body}");
        format!("{:?}: {}", e.reason, e.message)
    }

    /// A JSON array where a kind has a struct is a 400 naming its path and the struct, as a value of any other
    /// wrong type is: Go's decoder takes no array for a struct (serde's derived decoders would, field by field).
    #[test]
    fn arrays_are_no_structs_in_any_kind() {
        fn check<K: Kind>(cases: &[(Value, &str, &str)]) {
            let kind = K::info().kind;
            // Every kind has metadata (Go's decoding of it, or k8s-openapi's for CSITranslation, which is no
            // upstream kind), and ownerReferences (k8s-openapi's own type) in it.
            let meta = if kind == "CSITranslation" { "ObjectMeta" } else { "struct ObjectMeta" };
            let common = [
                (json!({"metadata": []}), "metadata", meta),
                (
                    json!({"metadata": {"name": "a", "ownerReferences": [["v1"]]}}),
                    "metadata.ownerReferences[0]",
                    "OwnerReference",
                ),
            ];
            for (body, path, expected) in common.iter().chain(cases) {
                assert_eq!(
                    refused::<K>(body.clone()),
                    format!("BadRequest: error decoding {kind} at {path}: invalid type: sequence, expected {expected}"),
                    "{kind}: {body}"
                );
            }
        }
        check::<storage_version_migration::StorageVersionMigration>(&[
            (json!({"spec": []}), "spec", "struct StorageVersionMigrationSpec"),
            (json!({"spec": {"resource": ["", "v1", "pods"]}}), "spec.resource", "struct GroupVersionResource"),
            (json!({"status": {"conditions": [[]]}}), "status.conditions[0]", "struct MigrationCondition"),
        ]);
        check::<storage_state::StorageState>(&[
            (json!({"spec": []}), "spec", "struct StorageStateSpec"),
            (json!({"spec": {"resource": ["", "pods"]}}), "spec.resource", "struct GroupResource"),
            (json!({"status": []}), "status", "struct StorageStateStatus"),
            (
                json!({"status": {"currentStorageVersionHashes": [["r", "h"]]}}),
                "status.currentStorageVersionHashes[0]",
                "struct ReportedStorageVersionHash",
            ),
        ]);
        check::<storagemigration::StorageVersionMigration>(&[
            (json!({"spec": []}), "spec", "struct StorageVersionMigrationSpec"),
            (json!({"spec": {"resource": ["a", "b"]}}), "spec.resource", "struct GroupResource"),
            (json!({"status": {"conditions": [[]]}}), "status.conditions[0]", "struct Condition"),
        ]);
        check::<shoot_state::ShootState>(&[
            (json!({"spec": []}), "spec", "struct ShootStateSpec"),
            (json!({"spec": {"gardener": [["ca"]]}}), "spec.gardener[0]", "struct GardenerResourceData"),
            (
                json!({"spec": {"extensions": [{"kind": "Worker", "resources": [["r"]]}]}}),
                "spec.extensions[0].resources[0]",
                "struct NamedResourceReference",
            ),
        ]);
        check::<event::Event>(&[
            (json!({"involvedObject": []}), "involvedObject", "ObjectReference"),
            (json!({"source": ["c"]}), "source", "EventSource"),
            (json!({"series": []}), "series", "EventSeries"),
        ]);
        check::<events_event::Event>(&[
            (json!({"regarding": []}), "regarding", "ObjectReference"),
            (json!({"series": [2]}), "series", "struct EventSeries"),
        ]);
        check::<namespace::Namespace>(&[
            (json!({"spec": []}), "spec", "struct NamespaceSpec"),
            (json!({"status": {"conditions": [["T"]]}}), "status.conditions[0]", "struct NamespaceCondition"),
        ]);
        check::<csi_translation::CSITranslation>(&[
            (json!({"spec": []}), "spec", "struct CSITranslationSpec"),
            (
                json!({"spec": {"repairVolumeHandle": ["d", "h"]}}),
                "spec.repairVolumeHandle",
                "struct VolumeHandleRepair",
            ),
            (json!({"spec": {"persistentVolume": {"spec": []}}}), "spec.persistentVolume.spec", "PersistentVolumeSpec"),
        ]);
    }

    /// Objects in place of the structs still decode, Go's zero values and the unknown fields with them.
    #[test]
    fn objects_still_decode() {
        let (m, unknown) = decode_typed::<storagemigration::StorageVersionMigration>(&json!({
            "metadata": {"name": "a", "labels": {"x": null}}, "spec": {"resource": {"group": null, "resource": "pods"}},
            "status": {"conditions": [null], "bogus": []}
        }))
        .expect("decodes");
        assert_eq!(
            (m.spec.resource.resource.as_str(), m.metadata.labels.unwrap_or_default()["x"].as_str()),
            ("pods", "")
        );
        assert_eq!(unknown, ["status.bogus"]);
    }
}

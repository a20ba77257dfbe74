//! StorageState (migration.k8s.io/v1alpha1): which storage versions the objects of one resource may be stored in.
//! Named `<resource>.<group>` (just `<resource>` for the core group), like the trigger of seed 002 keeps it.

use crate::api::printers::age_cell;
use crate::error::FieldError;
use crate::go_decode;
use crate::registry::strategy::{Column, Kind, KindInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The persisted hash when the storage versions of existing objects are not known.
pub const UNKNOWN_HASH: &str = "Unknown";

/// The state of the storage of a specific resource.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.StorageState")]
pub struct StorageState {
    /// Standard object metadata. The name must be "<resource>.<group>" ("<resource>" for the core group).
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// Specification of the storage state.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub spec: StorageStateSpec,
    /// Status of the storage state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StorageStateStatus>,
}

/// Specification of the storage state.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.StorageStateSpec")]
pub struct StorageStateSpec {
    /// The resource this storageState is about.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub resource: GroupResource,
}

/// The names of the group and the resource.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[schemars(rename = "io.k8s.migration.v1alpha1.GroupResource")]
pub struct GroupResource {
    /// The name of the group ("" for the core group).
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The name of the resource (plural, lower case).
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

impl GroupResource {
    /// The StorageState name this resource must have.
    pub fn state_name(&self) -> String {
        crate::error::qualified(&self.resource, &self.group)
    }
}

/// Status of the storage state.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.StorageStateStatus")]
pub struct StorageStateStatus {
    /// The hash values of storage versions that persisted instances of spec.resource might still be encoded in.
    /// "Unknown" is a valid value in the list, and is the default value. It is not safe to upgrade or downgrade
    /// to an apiserver binary that does not support all versions listed in this field, or if "Unknown" is
    /// listed. Once the storage version migration for this resource has completed, the value of this field is
    /// refined to only contain the currentStorageVersionHash. Once the apiserver has changed the storage version,
    /// the new storage version is appended to the list.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub persisted_storage_version_hashes: Vec<String>,
    /// The hash value of the current storage version, as shown in the discovery document served by the API
    /// server. Storage Version is the version to which objects are converted to before persisted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_storage_version_hash: Option<String>,
    /// LastHeartbeatTime is the last time the storage migration triggering controller checks the storage
    /// version hash of this resource in the discovery document and updates this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// The storage version hash each API server replica reports (HA extension): one entry per reporter.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub current_storage_version_hashes: Vec<ReportedStorageVersionHash>,
    /// Encryption at rest of this server's own store (an addition to upstream's shape; the key-rotation trigger
    /// writes it): the key new values of the resource are written with, `<provider>:v1:<name>` or `identity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_write_key: Option<String>,
    /// When the trigger first saw `encryptionWriteKey` configured: a migration requested since then rewrites every
    /// value with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_write_key_time: Option<Time>,
    /// The keys stored values of the resource may still be encrypted with: the counted ones, plus a new write key
    /// until the count after its migration. Only the write key listed: no value uses any other key.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub persisted_encryption_keys: Vec<String>,
    /// How many stored values use each key, counted in the store (never assumed).
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub encryption_key_counts: Vec<EncryptionKeyCount>,
    /// When `encryptionKeyCounts` was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_keys_count_time: Option<Time>,
    /// `Rotating` while values may use a key other than the write key, `Finished` once the count after the
    /// migration found every value under the write key, `Incomplete` when a finished migration left values under
    /// other keys (see `encryptionKeyCounts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_rotation: Option<String>,
}

/// How many stored values of one resource one key encrypts.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.EncryptionKeyCount")]
pub struct EncryptionKeyCount {
    /// `<provider>:v1:<name>`, `identity` (plaintext) or `malformed`.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub key: String,
    /// Stored values encrypted with it.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub values: u64,
}

/// The storage version hash one reporter (an API server replica) observed.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.ReportedStorageVersionHash")]
pub struct ReportedStorageVersionHash {
    /// The identity of the reporter.
    #[serde(rename = "reporterID", default, deserialize_with = "go_decode::null_as_default")]
    pub reporter_id: String,
    /// The storage version hash the reporter observed.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub current_storage_version_hash: String,
    /// The last time the reporter confirmed this hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
}

static INFO: KindInfo = KindInfo {
    group: "migration.k8s.io",
    kind: "StorageState",
    list_kind: "StorageStateList",
    plural: "storagestates",
    singular: "storagestate",
    namespaced: false,
    short_names: &["ss"],
    categories: &["migration"],
    versions: &["v1alpha1"],
    name_rule: crate::validation::NameRule::Subdomain,
    unconditional_update: true,
    create_only: false,
    generation: true,
    return_deleted_object: false,
    api_approved: Some(crate::api::STORAGE_VERSION_MIGRATOR_API),
    priority: None,
};

impl StorageState {
    fn validate_status(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let Some(s) = &self.status else { return errs };
        for (i, h) in s.persisted_storage_version_hashes.iter().enumerate() {
            if h.is_empty() {
                errs.push(FieldError::required(format!("status.persistedStorageVersionHashes[{i}]")));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in s.current_storage_version_hashes.iter().enumerate() {
            let f = format!("status.currentStorageVersionHashes[{i}]");
            if r.reporter_id.is_empty() {
                errs.push(FieldError::required(format!("{f}.reporterID")));
            } else if !seen.insert(r.reporter_id.as_str()) {
                errs.push(FieldError::duplicate(format!("{f}.reporterID"), &r.reporter_id));
            }
            if r.current_storage_version_hash.is_empty() {
                errs.push(FieldError::required(format!("{f}.currentStorageVersionHash")));
            }
        }
        errs
    }
}

crate::kube_resource!(StorageState, kube::core::ClusterResourceScope);

impl Kind for StorageState {
    const CELLS_READ_METADATA: bool = false;
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = Option<StorageStateStatus>;
    fn replace_status(&mut self, status: Self::Status) -> Self::Status {
        std::mem::replace(&mut self.status, status)
    }
    fn defaults(&mut self) {
        if let Some(s) = &mut self.status {
            if s.persisted_storage_version_hashes.is_empty() {
                s.persisted_storage_version_hashes = vec![UNKNOWN_HASH.to_string()];
            }
        }
    }
    fn prepare_for_create(&mut self) {
        // Status is written through /status; a new StorageState starts with "persisted: unknown".
        if self.status.is_none() {
            self.status = Some(StorageStateStatus::default());
        }
    }
    fn validate(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let r = &self.spec.resource;
        if r.resource.is_empty() {
            errs.push(FieldError::required("spec.resource.resource"));
        } else {
            let want = r.state_name();
            let name = self.metadata.name.as_deref().unwrap_or_default();
            if !name.is_empty() && name != want {
                errs.push(FieldError::invalid(
                    "metadata.name",
                    name,
                    &format!("must be {want:?}: the name of a StorageState is <resource>.<group> of spec.resource (<resource> for the core group)"),
                ));
            }
        }
        errs.extend(self.validate_status());
        errs
    }
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut errs = self.validate();
        if self.spec.resource != old.spec.resource {
            let v = serde_json::to_value(&self.spec.resource).unwrap_or(Value::Null);
            errs.push(FieldError::immutable("spec.resource", &v));
        }
        errs
    }
    fn validate_status_update(&self, _old: &Self) -> Vec<FieldError> {
        self.validate_status()
    }
    fn columns() -> Vec<Column> {
        vec![
            Column::new("Current", "string", "The current storage version hash of the resource.")
                .json_path(".status.currentStorageVersionHash"),
            Column::new("Persisted", "string", "The storage version hashes objects may still be stored in.")
                .json_path(".status.persistedStorageVersionHashes"),
            Column::new("Heartbeat", "date", "The last time the trigger confirmed the current storage version hash.")
                .json_path(".status.lastHeartbeatTime"),
            Column::new("Write Key", "string", "The encryption key new values are written with.")
                .json_path(".status.encryptionWriteKey"),
            Column::new("Keys In Use", "string", "The encryption keys stored values may still use.")
                .json_path(".status.persistedEncryptionKeys"),
            Column::new("Rotation", "string", "Rotating, or Finished once every stored value uses the write key.")
                .json_path(".status.encryptionKeyRotation"),
            // Wide only: which API server replicas report a hash (the HA extension), to see who is stale.
            Column::new("Reporters", "string", "The replicas that report a current storage version hash.")
                .json_path(".status.currentStorageVersionHashes[*].reporterID")
                .wide(),
        ]
    }
    fn cells(&self, now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        let none = StorageStateStatus::default();
        let s = self.status.as_ref().unwrap_or(&none);
        vec![
            Value::from(s.current_storage_version_hash.as_deref().unwrap_or_default()),
            Value::from(s.persisted_storage_version_hashes.join(",")),
            age_cell(s.last_heartbeat_time.as_ref(), now),
            Value::from(s.encryption_write_key.as_deref().unwrap_or_default()),
            Value::from(s.persisted_encryption_keys.join(",")),
            Value::from(s.encryption_key_rotation.as_deref().unwrap_or_default()),
            Value::from(
                s.current_storage_version_hashes.iter().map(|r| r.reporter_id.as_str()).collect::<Vec<_>>().join(","),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// kube-storage-version-migrator's StorageState: every field a Go value (the hash and the heartbeat kept optional
    /// here, None standing for the zero value); our additions decode the same way. A `null` hash in the list is "",
    /// which validation reports.
    #[test]
    fn missing_and_null_fields_decode_as_go_and_validate() {
        let s: StorageState =
            serde_json::from_value(json!({"metadata": null, "spec": {"resource": null}, "status": null}))
                .expect("decodes");
        assert_eq!(s, StorageState::default());
        let s: StorageState = serde_json::from_value(json!({
            "metadata": {"name": "pods"},
            "spec": {"resource": {"group": null, "resource": "pods"}},
            "status": {"persistedStorageVersionHashes": ["h", null], "currentStorageVersionHash": null,
                       "lastHeartbeatTime": null, "currentStorageVersionHashes": [null],
                       "encryptionKeyCounts": [{"key": null, "values": null}], "persistedEncryptionKeys": null},
        }))
        .expect("decodes");
        let status = s.status.clone().expect("status");
        assert_eq!(status.persisted_storage_version_hashes, ["h", ""]);
        assert_eq!(status.encryption_key_counts, [EncryptionKeyCount::default()]);
        let fields: Vec<String> = s.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "status.persistedStorageVersionHashes[1]",
                "status.currentStorageVersionHashes[0].reporterID",
                "status.currentStorageVersionHashes[0].currentStorageVersionHash",
            ]
        );
    }
}

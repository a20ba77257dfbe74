//! The trigger's record in the own API: annotations on the StorageState of each resource it watches (created when
//! the storage-version trigger has not created it yet).

use super::decide::Recorded;
use crate::api::storage_state::{GroupResource, StorageState, StorageStateSpec};
use crate::api::storage_version_migration::{StorageVersionMigration, CONDITION_FAILED, CONDITION_SUCCEEDED};
use crate::scheduler::trigger::{OwnObjects, StoreError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use std::collections::BTreeMap;

/// The encryption config hash every live kube-apiserver reported when the trigger last acted.
pub const ANNOTATION_CONFIG_HASH: &str = "migration.k8s.io/encryption-config-hash";
/// The resource's write key in the mounted copy then (`aescbc:v1:key2`); with a copy only.
pub const ANNOTATION_WRITE_KEY: &str = "migration.k8s.io/encryption-write-key";
/// The latest observation of the cluster's kube-apiservers, in words (who did not answer, who disagrees).
pub const ANNOTATION_OBSERVED: &str = "migration.k8s.io/encryption-observed";
/// The migration the trigger requested last.
pub const ANNOTATION_MIGRATION: &str = "migration.k8s.io/encryption-migration";
/// Where the rotation stands: `Migrating`, `Failed`, or `Done` with when the old keys can go.
pub const ANNOTATION_ROTATION: &str = "migration.k8s.io/encryption-rotation";

fn annotation(state: &StorageState, key: &str) -> Option<String> {
    state.metadata.annotations.as_ref()?.get(key).cloned()
}

/// What the trigger recorded on `state`.
pub fn recorded(state: Option<&StorageState>) -> Recorded {
    Recorded {
        hash: state.and_then(|s| annotation(s, ANNOTATION_CONFIG_HASH)),
        write_key: state.and_then(|s| annotation(s, ANNOTATION_WRITE_KEY)),
    }
}

pub fn requested_migration(state: Option<&StorageState>) -> Option<String> {
    state.and_then(|s| annotation(s, ANNOTATION_MIGRATION))
}

/// Where the rotation of a resource stands, from the migration the trigger requested for it.
pub fn rotation(m: &StorageVersionMigration, write_key: Option<&str>) -> String {
    let name = m.metadata.name.as_deref().unwrap_or_default();
    let with = write_key.map_or_else(|| "the current write key".to_string(), str::to_string);
    if m.is_true(CONDITION_SUCCEEDED) {
        format!(
            "Done: {name} rewrote every object with {with}; no stored object of this resource needs another key, \
             which can be removed from the EncryptionConfiguration of every kube-apiserver"
        )
    } else if m.is_true(CONDITION_FAILED) {
        let why = m.condition(CONDITION_FAILED).and_then(|c| c.message.clone()).unwrap_or_default();
        format!("Failed: {name}: {why}; keep the old keys")
    } else {
        format!("Migrating: {name} rewrites every object with {with}; keep the old keys until it succeeds")
    }
}

/// Sets `annotations` on the StorageState `name` (creating it for `resource`.`group` when missing), when any differs.
pub async fn annotate(
    own: &OwnObjects,
    state: Option<&StorageState>,
    name: &str,
    (resource, group): (&str, &str),
    annotations: &BTreeMap<&'static str, String>,
) -> Result<(), StoreError> {
    let current = state.and_then(|s| s.metadata.annotations.clone()).unwrap_or_default();
    if state.is_some() && annotations.iter().all(|(k, v)| current.get(*k) == Some(v)) {
        return Ok(());
    }
    if state.is_none() {
        let new = StorageState {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            spec: StorageStateSpec { resource: GroupResource { group: group.into(), resource: resource.into() } },
            status: None,
        };
        match own.states.create(&PostParams::default(), &new).await {
            Ok(_) => {}
            Err(e) if crate::scheduler::api_reason(&e) == Some(crate::error::StatusReason::AlreadyExists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let patch = serde_json::json!({"metadata": {"annotations": annotations}});
    own.states.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

//! The trigger's record in the own API: annotations on the StorageState of each resource it watches (created when
//! the storage-version trigger has not created it yet).

use super::decide::Recorded;
use crate::api::storage_state::{GroupResource, StorageState, StorageStateSpec, StorageStateStatus};
use crate::api::storage_version_migration::{StorageVersionMigration, CONDITION_FAILED, CONDITION_SUCCEEDED};
use crate::error::StatusReason;
use crate::scheduler::trigger::{OwnObjects, StoreError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Patch;
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
        match own.states.create(&own.post_params(), &new).await {
            Ok(_) => {}
            Err(e) if crate::scheduler::api_reason(&e) == Some(StatusReason::AlreadyExists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let patch = serde_json::json!({"metadata": {"annotations": annotations}});
    own.states.patch(name, &crate::scheduler::managers::patch(own.manager), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// `encryptionKeyRotation` while a resource's objects may still be written with an older key, and once its
/// migration rewrote them all (the values the own store's key-rotation trigger uses).
pub const ROTATING: &str = "Rotating";
pub const FINISHED: &str = "Finished";

/// The StorageState status fields for encryption keys (shared with the own store's key-rotation trigger), for a
/// cluster resource whose write key in the copy is `key`, `previous` before it: `encryptionWriteKey` (and since when),
/// `persistedEncryptionKeys` (the keys objects may still use: the previous ones and the write key until the
/// migration requested for it Succeeded, then the write key alone) and `encryptionKeyRotation`. The cluster's
/// values cannot be counted from here (no access to its etcd): the migration's success is what says they were
/// rewritten, as in kube-apiserver's documented procedure; `encryptionKeyCounts` stays empty.
pub fn key_status(
    mut s: StorageStateStatus,
    key: &str,
    previous: Option<&str>,
    migration: Option<&StorageVersionMigration>,
    now: Timestamp,
) -> StorageStateStatus {
    if s.encryption_write_key.as_deref() != Some(key) {
        s.encryption_write_key = Some(key.to_string());
        s.encryption_write_key_time = Some(Time(now));
    }
    if migration.is_some_and(|m| m.is_true(CONDITION_SUCCEEDED)) {
        s.persisted_encryption_keys = vec![key.to_string()];
        s.encryption_key_rotation = Some(FINISHED.into());
    } else {
        for k in previous.into_iter().chain([key]) {
            if !s.persisted_encryption_keys.iter().any(|p| p == k) {
                s.persisted_encryption_keys.push(k.to_string());
            }
        }
        s.encryption_key_rotation = Some(ROTATING.into());
    }
    s
}

/// Applies `f` to the status of the StorageState `name` through `/status`, re-reading on conflicts (the
/// storage-version reporter writes the same StorageStates); nothing is written when `f` changes nothing.
pub async fn update_status(
    own: &OwnObjects,
    name: &str,
    f: impl Fn(StorageStateStatus) -> StorageStateStatus,
) -> Result<(), StoreError> {
    for _ in 0..STATUS_WRITE_ATTEMPTS {
        let Some(mut state) = own.get_state(name).await? else { return Ok(()) };
        let before = state.status.clone().unwrap_or_default();
        let after = f(before.clone());
        if after == before {
            return Ok(());
        }
        state.status = Some(after);
        match own.update_state_status(&state).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError {
        reason: Some(StatusReason::Conflict),
        message: format!("storagestate {name}: too many conflicting writes"),
    })
}

const STATUS_WRITE_ATTEMPTS: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::storage_version_migration::MigrationCondition;

    fn svm(succeeded: bool) -> StorageVersionMigration {
        let mut m: StorageVersionMigration = serde_json::from_value(serde_json::json!({
            "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
            "metadata": {"name": "secrets-x"}, "spec": {"resource": {"group": "", "version": "v1", "resource": "secrets"}}
        }))
        .expect("svm");
        if succeeded {
            let c: MigrationCondition =
                serde_json::from_value(serde_json::json!({"type": "Succeeded", "status": "True"})).expect("condition");
            m.status = Some(serde_json::from_value(serde_json::json!({"conditions": [c]})).expect("status"));
        }
        m
    }

    #[test]
    fn keys_in_use_until_the_migration_succeeded() {
        let now = Timestamp::from_second(1_000).expect("time");
        let s =
            key_status(StorageStateStatus::default(), "aescbc:v1:key2", Some("aescbc:v1:key1"), Some(&svm(false)), now);
        assert_eq!(s.encryption_write_key.as_deref(), Some("aescbc:v1:key2"));
        assert_eq!(s.persisted_encryption_keys, ["aescbc:v1:key1", "aescbc:v1:key2"]);
        assert_eq!(s.encryption_key_rotation.as_deref(), Some(ROTATING));
        let later = Timestamp::from_second(2_000).expect("time");
        let done = key_status(s.clone(), "aescbc:v1:key2", None, Some(&svm(true)), later);
        assert_eq!(done.persisted_encryption_keys, ["aescbc:v1:key2"]);
        assert_eq!(done.encryption_key_rotation.as_deref(), Some(FINISHED));
        assert_eq!(done.encryption_write_key_time, s.encryption_write_key_time, "the key did not change");
    }
}

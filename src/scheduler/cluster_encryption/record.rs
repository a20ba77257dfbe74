//! The trigger's record in the own API: annotations on the StorageState of each resource it watches (created when
//! the storage-version trigger has not created it yet).

use super::decide::Recorded;
use super::key_id_rotation::{KmsRecorded, KmsStep, Pending};
use crate::api::storage_state::{GroupResource, StorageState, StorageStateSpec, StorageStateStatus};
use crate::api::storage_version_migration::{StorageVersionMigration, CONDITION_FAILED, CONDITION_SUCCEEDED};
use crate::error::StatusReason;
use crate::scheduler::trigger_kit::{OwnObjects, StoreError};
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

/// The key_id hash per KMS v2 provider writing the resource the trigger last acted on, as JSON
/// (`{"vault":"sha256:…"}`).
pub const ANNOTATION_KMS_KEY_IDS: &str = "migration.k8s.io/encryption-kms-key-id-hashes";
/// A new key_id hash every live kube-apiserver reports per provider and since when, while the migration waits for
/// the passive-migration margin, as JSON (`{"vault":{"keyIDHash":"sha256:…","since":"2026-11-27T17:00:00Z"}}`).
pub const ANNOTATION_KMS_PENDING: &str = "migration.k8s.io/encryption-kms-pending";
/// The latest observation of the key_ids the kube-apiservers report for the resource's KMS v2 providers, in words.
pub const ANNOTATION_KMS_OBSERVED: &str = "migration.k8s.io/encryption-kms-observed";

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

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PendingJson {
    #[serde(rename = "keyIDHash")]
    key_id_hash: String,
    since: Timestamp,
}

/// What the trigger recorded on `state` about its KMS v2 providers. An annotation that does not parse (edited by
/// hand) counts as absent: a key_id is then first observed again, a pending rotation starts its margin over.
pub fn recorded_kms(state: Option<&StorageState>) -> KmsRecorded {
    let json = |key| state.and_then(|s| annotation(s, key));
    let key_ids = json(ANNOTATION_KMS_KEY_IDS).and_then(|j| serde_json::from_str(&j).ok()).unwrap_or_default();
    let pending: BTreeMap<String, PendingJson> =
        json(ANNOTATION_KMS_PENDING).and_then(|j| serde_json::from_str(&j).ok()).unwrap_or_default();
    let pending = pending.into_iter().map(|(p, j)| (p, Pending { key_id: j.key_id_hash, since: j.since })).collect();
    KmsRecorded { key_ids, pending }
}

/// The annotations of a KMS record: (key ids, pending), None for an empty map (the annotation is removed).
pub fn kms_annotations(rec: &KmsRecorded) -> (Option<String>, Option<String>) {
    let key_ids = (!rec.key_ids.is_empty()).then(|| serde_json::json!(rec.key_ids).to_string());
    let pending: BTreeMap<&str, PendingJson> = rec
        .pending
        .iter()
        .map(|(p, v)| (p.as_str(), PendingJson { key_id_hash: v.key_id.clone(), since: v.since }))
        .collect();
    let pending = (!pending.is_empty()).then(|| serde_json::json!(pending).to_string());
    (key_ids, pending)
}

/// The key a StorageState's status names for values a KMS v2 provider writes under one key_id:
/// `kms:v2:<name>:<key_id hash>` (a v2 provider's name has no `:`, so the hash is what follows the third one).
pub fn kms_status_key(write_key: &str, key_id_hash: &str) -> String {
    format!("{write_key}:{key_id_hash}")
}

/// The key the status names as the write key of a resource whose write key in the copy is `write_key`, and the
/// previous keys its values may still use (`recorded`, the write key the trigger acted on before, and during a KMS
/// v2 key_id rotation the provider's other key_ids). A KMS v2 resource is named with its key_id
/// ([`kms_status_key`]); None (no status update) for one whose key_ids this round did not decide on.
pub fn status_keys(
    write_key: Option<&str>,
    recorded: Option<String>,
    kms: Option<&KmsStep>,
) -> (Option<String>, Vec<String>) {
    let mut previous: Vec<String> = recorded.into_iter().filter(|p| Some(p.as_str()) != write_key).collect();
    let Some(key) = write_key else { return (None, previous) };
    let Some(provider) = key.strip_prefix("kms:v2:") else { return (Some(key.to_string()), previous) };
    match kms.and_then(|k| k.in_use.get(provider)) {
        Some(ids) => {
            previous.extend(ids.others.iter().map(|o| kms_status_key(key, o)));
            (Some(kms_status_key(key, &ids.writing)), previous)
        }
        None => (None, previous),
    }
}

pub fn requested_migration(state: Option<&StorageState>) -> Option<String> {
    state.and_then(|s| annotation(s, ANNOTATION_MIGRATION))
}

/// Where the rotation of a resource stands, from the migration the trigger requested for it. `kms` names the KMS v2
/// providers writing the resource: what may go then is an older key_id, in the KMS.
pub fn rotation(m: &StorageVersionMigration, write_key: Option<&str>, kms: &[&str]) -> String {
    let name = m.metadata.name.as_deref().unwrap_or_default();
    let with = write_key.map_or_else(|| "the current write key".to_string(), str::to_string);
    if m.is_true(CONDITION_SUCCEEDED) && !kms.is_empty() {
        format!(
            "Done: {name} rewrote every object with {with}; no stored object of this resource needs an older \
             key_id of kms provider {}, which may be retired in the KMS once no other resource needs it",
            kms.join(", ")
        )
    } else if m.is_true(CONDITION_SUCCEEDED) {
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

/// Sets `annotations` on the StorageState `name` (creating it for `resource`.`group` when missing), when any differs;
/// a None value removes the annotation.
pub async fn annotate(
    own: &OwnObjects,
    state: Option<&StorageState>,
    name: &str,
    (resource, group): (&str, &str),
    annotations: &BTreeMap<&'static str, Option<String>>,
) -> Result<(), StoreError> {
    let current = state.and_then(|s| s.metadata.annotations.clone()).unwrap_or_default();
    if state.is_some() && annotations.iter().all(|(k, v)| current.get(*k) == v.as_ref()) {
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
            Err(e) if crate::client::api_reason(&e) == Some(StatusReason::AlreadyExists) => {}
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
/// cluster resource whose write key in the copy is `key`, `previous` before it (and, during a KMS v2 key_id
/// rotation, the older key_ids'): `encryptionWriteKey` (and since when),
/// `persistedEncryptionKeys` (the keys objects may still use: the previous ones and the write key until the
/// migration requested for it Succeeded, then the write key alone) and `encryptionKeyRotation`. The cluster's
/// values cannot be counted from here (no access to its etcd): the migration's success is what says they were
/// rewritten, as in kube-apiserver's documented procedure; `encryptionKeyCounts` stays empty.
pub fn key_status(
    mut s: StorageStateStatus,
    key: &str,
    previous: &[String],
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
        for k in previous.iter().map(String::as_str).chain([key]) {
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
        let s = key_status(
            StorageStateStatus::default(),
            "aescbc:v1:key2",
            &["aescbc:v1:key1".into()],
            Some(&svm(false)),
            now,
        );
        assert_eq!(s.encryption_write_key.as_deref(), Some("aescbc:v1:key2"));
        assert_eq!(s.persisted_encryption_keys, ["aescbc:v1:key1", "aescbc:v1:key2"]);
        assert_eq!(s.encryption_key_rotation.as_deref(), Some(ROTATING));
        let later = Timestamp::from_second(2_000).expect("time");
        let done = key_status(s.clone(), "aescbc:v1:key2", &[], Some(&svm(true)), later);
        assert_eq!(done.persisted_encryption_keys, ["aescbc:v1:key2"]);
        assert_eq!(done.encryption_key_rotation.as_deref(), Some(FINISHED));
        assert_eq!(done.encryption_write_key_time, s.encryption_write_key_time, "the key did not change");
    }

    #[test]
    fn the_kms_record_round_trips_and_bad_annotations_count_as_absent() {
        let rec = KmsRecorded {
            key_ids: BTreeMap::from([("vault".into(), "sha256:new".into())]),
            pending: BTreeMap::from([(
                "vault".into(),
                Pending { key_id: "sha256:newer".into(), since: Timestamp::from_second(1_000).expect("time") },
            )]),
        };
        let (key_ids, pending) = kms_annotations(&rec);
        assert_eq!(key_ids.as_deref(), Some(r#"{"vault":"sha256:new"}"#));
        assert_eq!(
            pending.as_deref(),
            Some(r#"{"vault":{"keyIDHash":"sha256:newer","since":"1970-01-01T00:16:40Z"}}"#)
        );
        let state = |key_ids: &str, pending: &str| StorageState {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([
                    (ANNOTATION_KMS_KEY_IDS.to_string(), key_ids.to_string()),
                    (ANNOTATION_KMS_PENDING.to_string(), pending.to_string()),
                ])),
                ..Default::default()
            },
            spec: StorageStateSpec { resource: GroupResource { group: String::new(), resource: "secrets".into() } },
            status: None,
        };
        let s = state(&key_ids.unwrap_or_default(), &pending.unwrap_or_default());
        assert_eq!(recorded_kms(Some(&s)), rec);
        assert_eq!(recorded_kms(Some(&state("vault=x", "{"))), KmsRecorded::default());
        assert_eq!(kms_annotations(&KmsRecorded::default()), (None, None));
    }

    #[test]
    fn status_keys_name_a_kms_v2_write_key_with_its_key_id() {
        use super::super::key_id_rotation::KeyIdsInUse;
        let aes = status_keys(Some("aescbc:v1:key2"), Some("aescbc:v1:key1".into()), None);
        assert_eq!(aes, (Some("aescbc:v1:key2".into()), vec!["aescbc:v1:key1".into()]));
        assert_eq!(status_keys(None, None, None), (None, vec![]));
        let kms = KmsStep {
            in_use: BTreeMap::from([(
                "vault".into(),
                KeyIdsInUse { writing: "sha256:new".into(), others: ["sha256:old".into()].into() },
            )]),
            ..Default::default()
        };
        let (key, previous) = status_keys(Some("kms:v2:vault"), Some("aescbc:v1:key1".into()), Some(&kms));
        assert_eq!(key.as_deref(), Some("kms:v2:vault:sha256:new"));
        assert_eq!(previous, ["aescbc:v1:key1", "kms:v2:vault:sha256:old"]);
        // Without this round's key_ids the status is left as it is.
        assert_eq!(status_keys(Some("kms:v2:vault"), None, None), (None, vec![]));
        assert_eq!(status_keys(Some("kms:v2:hsm"), None, Some(&kms)).0, None);
    }

    #[test]
    fn a_kms_rotation_done_retires_the_old_key_id_in_the_kms() {
        let done = rotation(&svm(true), Some("kms:v2:vault:sha256:new"), &["vault"]);
        assert!(done.starts_with("Done: secrets-x rewrote every object with kms:v2:vault:sha256:new;"), "{done}");
        assert!(done.ends_with(
            "older key_id of kms provider vault, which may be retired in the KMS once no other resource needs it"
        ));
        assert!(rotation(&svm(true), None, &[]).ends_with("EncryptionConfiguration of every kube-apiserver"));
    }
}

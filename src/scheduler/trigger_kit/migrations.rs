//! Migrations: building, ordering, superseding, pruning.

use super::*;
use crate::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
};
use crate::error::qualified;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

/// The label value for a resource: `<resource>.<group>` when it is a valid label value (<= 63 characters), else a
/// prefix of it and a short hash of the whole (the full name then goes into [`ANNOTATION_RESOURCE`]).
pub fn resource_label_value(group: &str, resource: &str) -> (String, bool) {
    let full = qualified(resource, group);
    if full.len() <= MAX_LABEL_VALUE {
        return (full, false);
    }
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    let mut prefix: String = full.chars().take(MAX_LABEL_VALUE - hash.len() - 1).collect();
    while prefix.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.pop();
    }
    (format!("{prefix}-{hash}"), true)
}

/// The migration the trigger (or `migrate`) requests for `gvr`, whose storage version hash is `hash`.
pub fn desired_migration(gvr: &GroupVersionResource, hash: Option<&str>, now: Timestamp) -> StorageVersionMigration {
    let (label, shortened) = resource_label_value(&gvr.group, &gvr.resource);
    let mut annotations = BTreeMap::new();
    if let Some(h) = hash {
        annotations.insert(ANNOTATION_HASH.to_string(), h.to_string());
    }
    if shortened {
        annotations.insert(ANNOTATION_RESOURCE.to_string(), qualified(&gvr.resource, &gvr.group));
    }
    annotations.insert(ANNOTATION_REQUESTED_AT.to_string(), now.to_string());
    StorageVersionMigration {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", qualified(&gvr.resource, &gvr.group))),
            labels: Some(BTreeMap::from([(LABEL_RESOURCE.to_string(), label)])),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: crate::api::storage_version_migration::StorageVersionMigrationSpec {
            resource: gvr.clone(),
            continue_token: None,
        },
        status: None,
    }
}

pub fn name_of(m: &StorageVersionMigration) -> &str {
    m.metadata.name.as_deref().unwrap_or_default()
}

pub fn annotation<'a>(m: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    m.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The storage version hash a migration was requested for (None when not requested by us).
pub fn migration_hash(m: &StorageVersionMigration) -> Option<&str> {
    annotation(&m.metadata, ANNOTATION_HASH)
}

/// Succeeded or Failed: the migrator is done with it.
pub fn is_finished(m: &StorageVersionMigration) -> bool {
    m.is_true(CONDITION_SUCCEEDED) || m.is_true(CONDITION_FAILED)
}

pub fn is_superseded(m: &StorageVersionMigration) -> bool {
    m.is_true(CONDITION_FAILED)
        && m.condition(CONDITION_FAILED).and_then(|c| c.reason.as_deref()) == Some(REASON_SUPERSEDED)
}

/// When a migration was requested: our annotation, else its creationTimestamp.
pub fn requested_at(m: &StorageVersionMigration) -> Option<Timestamp> {
    annotation(&m.metadata, ANNOTATION_REQUESTED_AT)
        .and_then(|s| s.parse().ok())
        .or_else(|| m.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Oldest first (ties by name, for a stable order). Generic over how the migrations are held: owned (an API list),
/// borrowed, or shared from the decider's reflector store.
pub fn sort_by_request<M: Borrow<StorageVersionMigration>>(migrations: &mut [M]) {
    migrations.sort_by(|a, b| by_request(a.borrow(), b.borrow()));
}

fn by_request(a: &StorageVersionMigration, b: &StorageVersionMigration) -> std::cmp::Ordering {
    requested_at(a).cmp(&requested_at(b)).then_with(|| name_of(a).cmp(name_of(b)))
}

/// The most recently requested migration.
pub fn latest<M: Borrow<StorageVersionMigration>>(migrations: &[M]) -> Option<&StorageVersionMigration> {
    migrations.iter().map(Borrow::borrow).max_by(|a, b| by_request(a, b))
}

/// The migrations of one resource (by spec.resource, so that migrations created by hand count too), oldest first.
pub fn of_resource<'a, M: Borrow<StorageVersionMigration>>(
    all: &'a [M],
    group: &str,
    resource: &str,
) -> Vec<&'a StorageVersionMigration> {
    let mut out: Vec<&StorageVersionMigration> = all
        .iter()
        .map(Borrow::borrow)
        .filter(|m| m.spec.resource.group == group && m.spec.resource.resource == resource)
        .collect();
    sort_by_request(&mut out);
    out
}

/// The unfinished migrations (of one resource) other than `keep`: at most one migration of a resource runs, the
/// latest requested.
pub fn to_supersede<'a, M: Borrow<StorageVersionMigration>>(
    migrations: &'a [M],
    keep: &str,
) -> Vec<&'a StorageVersionMigration> {
    migrations.iter().map(Borrow::borrow).filter(|m| !is_finished(m) && name_of(m) != keep).collect()
}

/// The finished migrations (of one resource) beyond the newest `keep`, oldest first.
pub fn to_prune<M: Borrow<StorageVersionMigration>>(migrations: &[M], keep: usize) -> Vec<String> {
    let mut finished: Vec<&StorageVersionMigration> =
        migrations.iter().map(Borrow::borrow).filter(|m| is_finished(m)).collect();
    sort_by_request(&mut finished);
    let excess = finished.len().saturating_sub(keep);
    finished[..excess].iter().map(|m| name_of(m).to_string()).collect()
}

/// Why a migration was superseded: a newer one of the same resource replaced it.
pub fn superseded_by(by: &str) -> String {
    format!("superseded by storageversionmigration {by}: a newer migration of this resource was requested")
}

/// Why a migration was superseded: the replicas' API servers report different storage versions (seed 002's HA
/// extension: the leader cancels a migration once the reports stop being identical).
pub fn superseded_by_divergence(hashes: &BTreeSet<String>) -> String {
    let list: Vec<&str> = hashes.iter().map(String::as_str).collect();
    format!(
        "cancelled: the API server replicas report different storage versions ({}); a migration is requested again once they agree",
        list.join(", ")
    )
}

/// The status of `m` once superseded (`message`: [`superseded_by`] or [`superseded_by_divergence`]):
/// Failed=True (reason Superseded), Running=False. None when `m` is already finished (a terminal condition is never
/// reverted).
pub fn superseded_status(
    m: &StorageVersionMigration,
    message: &str,
    now: Timestamp,
) -> Option<crate::api::storage_version_migration::StorageVersionMigrationStatus> {
    if is_finished(m) {
        return None;
    }
    let mut status = m.status.clone().unwrap_or_default();
    let set = |status: &mut crate::api::storage_version_migration::StorageVersionMigrationStatus,
               type_: &str,
               value: &str,
               reason: &str,
               message: String| {
        let c = MigrationCondition {
            type_: type_.to_string(),
            status: value.to_string(),
            last_update_time: Some(Time(now)),
            reason: Some(reason.to_string()),
            message: Some(message),
        };
        match status.conditions.iter_mut().find(|x| x.type_ == type_) {
            Some(x) => *x = c,
            None => status.conditions.push(c),
        }
    };
    if m.is_true(CONDITION_RUNNING) {
        set(&mut status, CONDITION_RUNNING, "False", REASON_SUPERSEDED, message.to_string());
    }
    set(&mut status, CONDITION_FAILED, "True", REASON_SUPERSEDED, message.to_string());
    Some(status)
}

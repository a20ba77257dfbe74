//! Reporting (every replica): each resource's current hash into its StorageState.

use super::*;
use crate::api::storage_state::{GroupResource, StorageState};
use crate::api::storage_version_migration::GroupVersionResource;
use crate::scheduler::report::{reported_status, withdrawn_status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::time::Duration;

/// The group-version-resource a migration of each resource uses on this replica's target (`<resource>.<group>` ->
/// GVR at the preferred version), from the reporter's latest discovery; the leader's decisions take the version of
/// a new migration from it.
pub type Served = std::sync::Arc<std::sync::RwLock<HashMap<String, GroupVersionResource>>>;

/// What the reporter and the decider of one process share.
#[derive(Clone, Default)]
pub struct Local {
    pub served: Served,
    /// Opened once the start-up staleness check is done: the reporter's first heartbeat must not hide a stale
    /// StorageState from it.
    pub startup_checked: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

/// With several replicas, the start-up check is every reporter's, before its first report: a StorageState whose
/// heartbeat is older than two intervals (no replica reported meanwhile, changes may have been missed) is
/// recreated, as the KEP says: deleted here, created again with persisted ["Unknown"] by the report that follows;
/// migrations requested before it was created do not count for it (see [`decide`]). Returns the names deleted.
pub async fn recreate_stale(store: &OwnObjects, now: Timestamp, interval: Duration) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    for s in store.list_states().await? {
        if is_stale(&s, now, interval) {
            let name = s.metadata.name.clone().unwrap_or_default();
            if !store.delete_state(&s).await? {
                // Another replica recreated or reported into it first: it is no longer stale.
                continue;
            }
            tracing::info!(storagestate = %name, "trigger: heartbeat older than two discovery intervals, storagestate recreated with persisted storage versions Unknown");
            out.push(name);
        }
    }
    Ok(out)
}

/// Writes `reporter`'s observation of every resource of `discovery` that publishes a storageVersionHash into its
/// StorageState ([`reported_status`]), creating StorageStates for new resources. Returns the names written; a
/// resource whose write failed is logged and retried at the next poll.
pub async fn report(
    store: &OwnObjects,
    reporter: &str,
    discovery: &Discovery,
    now: Timestamp,
    interval: Duration,
    replicas: Replicas,
) -> Vec<String> {
    let mut written = Vec::new();
    for r in &discovery.resources {
        let Some(hash) = r.hash.as_deref() else { continue };
        let name = r.qualified();
        match report_one(store, reporter, r, hash, now, interval, replicas).await {
            Ok(()) => written.push(name),
            Err(e) => {
                tracing::warn!(storagestate = %name, error = %e, "trigger: reporting the storage version hash failed; retrying next period")
            }
        }
    }
    written
}

pub(super) async fn report_one(
    store: &OwnObjects,
    reporter: &str,
    r: &DiscoveredResource,
    hash: &str,
    now: Timestamp,
    interval: Duration,
    replicas: Replicas,
) -> Result<(), StoreError> {
    let name = r.qualified();
    let mut state = store.get_state(&name).await?;
    for attempt in 0..STATE_WRITE_ATTEMPTS {
        let status = reported_status(
            state.as_ref().and_then(|s| s.status.as_ref()),
            reporter,
            hash,
            now,
            interval,
            replicas == Replicas::Several,
        );
        let mut target = match state.take() {
            Some(s) => s,
            None => {
                let new = StorageState {
                    metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                    spec: crate::api::storage_state::StorageStateSpec {
                        resource: GroupResource { group: r.group.clone(), resource: r.resource.clone() },
                    },
                    status: None,
                };
                match store.create_state(&new).await {
                    Ok(created) => {
                        tracing::info!(storagestate = %name, current = hash, "trigger: storagestate created");
                        created
                    }
                    // Another replica created it first.
                    Err(e) if e.is_conflict() && attempt + 1 < STATE_WRITE_ATTEMPTS => {
                        state = store.get_state(&name).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let before = target.status.clone().unwrap_or_default();
        if before.persisted_storage_version_hashes != status.persisted_storage_version_hashes
            && !before.persisted_storage_version_hashes.is_empty()
        {
            tracing::info!(storagestate = %name, reporter, current = hash, persisted = ?status.persisted_storage_version_hashes,
                "trigger: new storage version reported, added to the persisted storage versions");
        }
        target.status = Some(status);
        match store.update_state_status(&target).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() && attempt + 1 < STATE_WRITE_ATTEMPTS => {
                state = store.get_state(&name).await?;
            }
            Err(e) => return Err(e),
        }
    }
    let message = format!("storagestate {name}: too many conflicting writes");
    Err(StoreError { reason: Some(crate::error::StatusReason::Conflict), message })
}

/// Removes `reporter`'s elements from every StorageState (a replica that stops gracefully, so that its silence does
/// not hold the leader back for three intervals).
pub async fn withdraw(store: &OwnObjects, reporter: &str) -> Result<usize, StoreError> {
    let mut n = 0;
    for mut s in store.list_states().await? {
        let name = s.metadata.name.clone().unwrap_or_default();
        for attempt in 0..STATE_WRITE_ATTEMPTS {
            let Some(status) = s.status.as_ref().and_then(|st| withdrawn_status(st, reporter)) else { break };
            s.status = Some(status);
            match store.update_state_status(&s).await {
                Ok(_) => {
                    n += 1;
                    break;
                }
                Err(e) if e.is_conflict() && attempt + 1 < STATE_WRITE_ATTEMPTS => {
                    match store.get_state(&name).await? {
                        Some(fresh) => s = fresh,
                        None => break,
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

//! Where migrations and StorageStates are written: through kube's typed client, to this server (the scheduler,
//! over its in-process client) or a remote one (`migrate`).

use super::*;
use crate::api::storage_state::StorageState;
use crate::api::storage_version_migration::{GroupVersionResource, StorageVersionMigration};
use crate::client::api_reason;
use crate::error::StatusReason;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use std::borrow::Borrow;

/// An error of a request through [`OwnObjects`]: its reason (`None` when there was no answer) and message.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub reason: Option<StatusReason>,
    pub message: String,
}

impl StoreError {
    /// A write that lost a race: a stale resourceVersion, or a create of a name just taken.
    pub fn is_conflict(&self) -> bool {
        matches!(self.reason, Some(StatusReason::Conflict | StatusReason::AlreadyExists))
    }
    pub fn is_not_found(&self) -> bool {
        self.reason == Some(StatusReason::NotFound)
    }
}

impl From<kube::Error> for StoreError {
    fn from(e: kube::Error) -> Self {
        let reason = crate::client::api_reason(&e);
        let message = match e {
            kube::Error::Api(s) => s.message,
            other => other.to_string(),
        };
        StoreError { reason, message }
    }
}

/// The scheduler's own objects through kube's typed client: this server's in-process client (the scheduler), or a
/// remote migration-apiserver's (`migrate`). Its writes are API requests like any client's: authentication,
/// validation, resourceVersion preconditions and watch events apply to them.
#[derive(Clone)]
pub struct OwnObjects {
    pub migrations: Api<StorageVersionMigration>,
    pub states: Api<StorageState>,
    /// The field manager of every write ([`crate::scheduler::managers`]): the trigger's unless
    /// [`with_manager`](Self::with_manager) names another writer.
    pub manager: &'static str,
}

impl OwnObjects {
    pub fn new(client: kube::Client) -> Self {
        OwnObjects {
            migrations: Api::all(client.clone()),
            states: Api::all(client),
            manager: crate::scheduler::managers::TRIGGER,
        }
    }

    /// The same objects, written as `manager`.
    pub fn with_manager(&self, manager: &'static str) -> Self {
        OwnObjects { manager, ..self.clone() }
    }

    /// Create and update parameters naming this writer.
    pub fn post_params(&self) -> PostParams {
        crate::scheduler::managers::post(self.manager)
    }
}

/// StorageVersionMigrations.
impl OwnObjects {
    pub async fn list_migrations(&self) -> Result<Vec<StorageVersionMigration>, StoreError> {
        Ok(self.migrations.list(&ListParams::default()).await?.items)
    }
    pub async fn get_migration(&self, name: &str) -> Result<Option<StorageVersionMigration>, StoreError> {
        Ok(self.migrations.get_opt(name).await?)
    }
    pub async fn create_migration(&self, m: &StorageVersionMigration) -> Result<StorageVersionMigration, StoreError> {
        Ok(self.migrations.create(&self.post_params(), m).await?)
    }
    pub async fn update_migration_status(
        &self,
        m: &StorageVersionMigration,
    ) -> Result<StorageVersionMigration, StoreError> {
        Ok(self.migrations.replace_status(name_of(m), &self.post_params(), m).await?)
    }
    pub async fn delete_migration(&self, name: &str) -> Result<(), StoreError> {
        match self.migrations.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if api_reason(&e) == Some(StatusReason::NotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Marks `m` Failed/Superseded (with `message`) through `/status`, re-reading on conflicts (the migrator writes
/// progress meanwhile). Returns the written migration, or None when it was finished or deleted meanwhile.
pub async fn supersede(
    store: &OwnObjects,
    m: &StorageVersionMigration,
    message: &str,
    now: Timestamp,
) -> Result<Option<StorageVersionMigration>, StoreError> {
    let mut cur = m.clone();
    for attempt in 0.. {
        let Some(status) = superseded_status(&cur, message, now) else { return Ok(None) };
        // A conflict replaces `cur` with a fresh read, so the status is set on it in place.
        cur.status = Some(status);
        match store.update_migration_status(&cur).await {
            Ok(written) => return Ok(Some(written)),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) if e.is_conflict() && attempt < 10 => match store.get_migration(name_of(&cur)).await? {
                Some(fresh) => cur = fresh,
                None => return Ok(None),
            },
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// Requests a migration of `gvr` (storage version hash `hash`) and supersedes every unfinished migration of the same
/// resource among `existing`. Returns the new migration and the names of those it superseded.
pub async fn start_migration<M: Borrow<StorageVersionMigration>>(
    store: &OwnObjects,
    gvr: &GroupVersionResource,
    hash: Option<&str>,
    why: &str,
    existing: &[M],
    now: Timestamp,
) -> Result<(StorageVersionMigration, Vec<String>), StoreError> {
    let mut desired = desired_migration(gvr, hash, now);
    desired.metadata.annotations.get_or_insert_with(Default::default).insert(ANNOTATION_REASON.into(), why.into());
    let created = store.create_migration(&desired).await?;
    let same = of_resource(existing, &gvr.group, &gvr.resource);
    let mut superseded = Vec::new();
    let message = superseded_by(name_of(&created));
    for old in to_supersede(&same, name_of(&created)) {
        if supersede(store, old, &message, now).await?.is_some() {
            superseded.push(name_of(old).to_string());
        }
    }
    Ok((created, superseded))
}

/// Deletes the finished migrations of one resource beyond the newest `keep`. Returns the names deleted.
pub async fn prune_history<M: Borrow<StorageVersionMigration>>(
    store: &OwnObjects,
    migrations: &[M],
    keep: usize,
) -> Result<Vec<String>, StoreError> {
    let names = to_prune(migrations, keep);
    for n in &names {
        store.delete_migration(n).await?;
    }
    Ok(names)
}

/// StorageStates.
impl OwnObjects {
    pub async fn list_states(&self) -> Result<Vec<StorageState>, StoreError> {
        Ok(self.states.list(&ListParams::default()).await?.items)
    }
    pub async fn get_state(&self, name: &str) -> Result<Option<StorageState>, StoreError> {
        Ok(self.states.get_opt(name).await?)
    }
    pub async fn create_state(&self, s: &StorageState) -> Result<StorageState, StoreError> {
        Ok(self.states.create(&self.post_params(), s).await?)
    }
    pub async fn update_state_status(&self, s: &StorageState) -> Result<StorageState, StoreError> {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        Ok(self.states.replace_status(name, &self.post_params(), s).await?)
    }
    pub async fn delete_state(&self, s: &StorageState) -> Result<bool, StoreError> {
        let m = &s.metadata;
        let preconditions = Preconditions { uid: m.uid.clone(), resource_version: m.resource_version.clone() };
        let params = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
        match self.states.delete(m.name.as_deref().unwrap_or_default(), &params).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(api_reason(&e), Some(StatusReason::NotFound | StatusReason::Conflict)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Conflicting writes of one StorageState (several replicas report into it) are retried this often from a fresh
/// read.
pub const STATE_WRITE_ATTEMPTS: usize = 10;

//! Where migrations and StorageStates are written: the registry (in the server), a remote migration-apiserver (the CLI), or memory (the HA walkthrough test).

use super::*;
use crate::api::storage_state::StorageState;
use crate::api::storage_version_migration::{GroupVersionResource, StorageVersionMigration};
use crate::error::ApiError;
use crate::registry::strategy::Kind;
use crate::scheduler::own::OwnApi;
use axum::http::{header, Method, Request};
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// An error of a [`MigrationStore`]: the HTTP status code (0 when there was no response) and message.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub code: u16,
    pub message: String,
}

impl StoreError {
    pub fn is_conflict(&self) -> bool {
        self.code == 409
    }
    pub fn is_not_found(&self) -> bool {
        self.code == 404
    }
}

impl From<ApiError> for StoreError {
    fn from(e: ApiError) -> Self {
        StoreError { code: e.code, message: e.message }
    }
}

impl From<kube::Error> for StoreError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => StoreError { code: s.code, message: s.message },
            other => StoreError { code: 0, message: other.to_string() },
        }
    }
}

/// StorageVersionMigration CRUD, wherever they live.
#[async_trait::async_trait]
pub trait MigrationStore: Send + Sync {
    async fn list_migrations(&self) -> Result<Vec<StorageVersionMigration>, StoreError>;
    async fn get_migration(&self, name: &str) -> Result<Option<StorageVersionMigration>, StoreError>;
    async fn create_migration(&self, m: &StorageVersionMigration) -> Result<StorageVersionMigration, StoreError>;
    /// PUT of `/status`, conditional on `metadata.resourceVersion`.
    async fn update_migration_status(&self, m: &StorageVersionMigration)
        -> Result<StorageVersionMigration, StoreError>;
    /// A missing migration is not an error.
    async fn delete_migration(&self, name: &str) -> Result<(), StoreError>;
}

#[async_trait::async_trait]
impl MigrationStore for OwnApi {
    async fn list_migrations(&self) -> Result<Vec<StorageVersionMigration>, StoreError> {
        Ok(self.list(None, "").await?)
    }
    async fn get_migration(&self, name: &str) -> Result<Option<StorageVersionMigration>, StoreError> {
        Ok(self.get(None, name).await?)
    }
    async fn create_migration(&self, m: &StorageVersionMigration) -> Result<StorageVersionMigration, StoreError> {
        Ok(self.create(m).await?)
    }
    async fn update_migration_status(
        &self,
        m: &StorageVersionMigration,
    ) -> Result<StorageVersionMigration, StoreError> {
        Ok(self.update_status(m).await?)
    }
    async fn delete_migration(&self, name: &str) -> Result<(), StoreError> {
        Ok(self.delete::<StorageVersionMigration>(None, name).await?)
    }
}

/// The StorageVersionMigrations of a migration-apiserver reached over the network.
pub struct RemoteMigrations {
    client: kube::Client,
}

pub(super) const SVM_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";

impl RemoteMigrations {
    pub fn new(client: kube::Client) -> Self {
        RemoteMigrations { client }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, StoreError> {
        let bytes = match body {
            Some(v) => serde_json::to_vec(&v).map_err(|e| StoreError { code: 0, message: e.to_string() })?,
            None => Vec::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_TYPE, "application/json")
            .body(bytes)
            .map_err(|e| StoreError { code: 0, message: e.to_string() })?;
        Ok(self.client.request::<T>(req).await?)
    }

    fn body(m: &StorageVersionMigration) -> Result<Value, StoreError> {
        let mut v = serde_json::to_value(m).map_err(|e| StoreError { code: 0, message: e.to_string() })?;
        v["apiVersion"] = json!("migration.k8s.io/v1alpha1");
        v["kind"] = json!(StorageVersionMigration::info().kind);
        Ok(v)
    }
}

#[async_trait::async_trait]
impl MigrationStore for RemoteMigrations {
    async fn list_migrations(&self) -> Result<Vec<StorageVersionMigration>, StoreError> {
        #[derive(serde::Deserialize)]
        struct List {
            #[serde(default)]
            items: Vec<StorageVersionMigration>,
        }
        Ok(self.call::<List>(Method::GET, SVM_PATH, None).await?.items)
    }
    async fn get_migration(&self, name: &str) -> Result<Option<StorageVersionMigration>, StoreError> {
        match self.call(Method::GET, &format!("{SVM_PATH}/{name}"), None).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
    async fn create_migration(&self, m: &StorageVersionMigration) -> Result<StorageVersionMigration, StoreError> {
        self.call(Method::POST, SVM_PATH, Some(Self::body(m)?)).await
    }
    async fn update_migration_status(
        &self,
        m: &StorageVersionMigration,
    ) -> Result<StorageVersionMigration, StoreError> {
        self.call(Method::PUT, &format!("{SVM_PATH}/{}/status", name_of(m)), Some(Self::body(m)?)).await
    }
    async fn delete_migration(&self, name: &str) -> Result<(), StoreError> {
        match self.call::<Value>(Method::DELETE, &format!("{SVM_PATH}/{name}"), None).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Marks `m` Failed/Superseded (with `message`) through `/status`, re-reading on conflicts (the migrator writes
/// progress meanwhile). Returns the written migration, or None when it was finished or deleted meanwhile.
pub async fn supersede<S: MigrationStore + ?Sized>(
    store: &S,
    m: &StorageVersionMigration,
    message: &str,
    now: Timestamp,
) -> Result<Option<StorageVersionMigration>, StoreError> {
    let mut cur = m.clone();
    for attempt in 0.. {
        let Some(status) = superseded_status(&cur, message, now) else { return Ok(None) };
        let mut next = cur.clone();
        next.status = Some(status);
        match store.update_migration_status(&next).await {
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
pub async fn start_migration<S: MigrationStore + ?Sized>(
    store: &S,
    gvr: &GroupVersionResource,
    hash: Option<&str>,
    existing: &[StorageVersionMigration],
    now: Timestamp,
) -> Result<(StorageVersionMigration, Vec<String>), StoreError> {
    let created = store.create_migration(&desired_migration(gvr, hash, now)).await?;
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
pub async fn prune_history<S: MigrationStore + ?Sized>(
    store: &S,
    migrations: &[StorageVersionMigration],
    keep: usize,
) -> Result<Vec<String>, StoreError> {
    let names = to_prune(migrations, keep);
    for n in &names {
        store.delete_migration(n).await?;
    }
    Ok(names)
}

// ---------------------------------------------------------------------------------------------------------------
// Where StorageStates are written: the registry (in the server), or memory (the HA walkthrough test).

/// StorageState reads and writes, wherever they live.
#[async_trait::async_trait]
pub trait StateStore: Send + Sync {
    async fn list_states(&self) -> Result<Vec<StorageState>, StoreError>;
    async fn get_state(&self, name: &str) -> Result<Option<StorageState>, StoreError>;
    /// Creates the object (its status is then written with [`StateStore::update_state_status`]).
    async fn create_state(&self, s: &StorageState) -> Result<StorageState, StoreError>;
    /// PUT of `/status`, conditional on `metadata.resourceVersion`.
    async fn update_state_status(&self, s: &StorageState) -> Result<StorageState, StoreError>;
    /// Deletes `s` only as it was read (uid and resourceVersion preconditions): false when it is gone or another
    /// replica wrote it meanwhile.
    async fn delete_state(&self, s: &StorageState) -> Result<bool, StoreError>;
}

#[async_trait::async_trait]
impl StateStore for OwnApi {
    async fn list_states(&self) -> Result<Vec<StorageState>, StoreError> {
        Ok(self.list(None, "").await?)
    }
    async fn get_state(&self, name: &str) -> Result<Option<StorageState>, StoreError> {
        Ok(self.get(None, name).await?)
    }
    async fn create_state(&self, s: &StorageState) -> Result<StorageState, StoreError> {
        Ok(self.create(s).await?)
    }
    async fn update_state_status(&self, s: &StorageState) -> Result<StorageState, StoreError> {
        Ok(self.update_status(s).await?)
    }
    async fn delete_state(&self, s: &StorageState) -> Result<bool, StoreError> {
        let m = &s.metadata;
        let name = m.name.as_deref().unwrap_or_default();
        Ok(self.delete_unchanged::<StorageState>(None, name, m.uid.clone(), m.resource_version.clone()).await?)
    }
}

/// Conflicting writes of one StorageState (several replicas report into it) are retried this often from a fresh
/// read.
pub(super) const STATE_WRITE_ATTEMPTS: usize = 10;

//! The trigger (seed 002): reads the target's legacy discovery every `--discovery-interval`, keeps one StorageState
//! per resource that publishes a storageVersionHash, and requests a StorageVersionMigration whenever the objects of
//! a resource may be stored in a version other than the current one. It never migrates anything itself: the
//! migrator runs the StorageVersionMigrations it creates.
//!
//! Life-cycle of a StorageState (KEP, with the changes of issue 4):
//! - new resource: persisted ["Unknown"], current = hash, heartbeat; start a migration;
//! - hash changed: append the hash to persisted, set current, heartbeat; start a migration;
//! - hash unchanged: heartbeat only;
//! - at start-up, a heartbeat older than two intervals resets persisted to ["Unknown"] (changes may have been
//!   missed) and a migration is started;
//! - the latest migration of the resource Succeeded for the current hash: persisted = [current].
//!
//! Starting a migration supersedes any unfinished one of the same resource (Failed, reason `Superseded`) instead of
//! deleting it; finished migrations beyond `--migration-history` per resource are deleted, oldest first.
//!
//! The decisions are pure functions ([`plan`], [`success_update`], [`to_supersede`], [`to_prune`],
//! [`migratable_resources`]); the rest is I/O. Requests to the target go through a Kubernetes client (a cluster, or
//! this server in-process); our own objects go through [`MigrationStore`]: the registry inside the server, a remote
//! client in the `migrate` command.

use super::own::OwnApi;
use super::SchedulerConfig;
use crate::api::storage_state::{GroupResource, StorageState, StorageStateStatus, UNKNOWN_HASH};
use crate::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
};
use crate::api::Kind;
use crate::error::{qualified, ApiError};
use crate::registry::{WatchOut, WatchParams};
use axum::http::{header, Method, Request};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList, APIVersions, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;

/// Label on every migration the trigger or `migrate` creates: `<resource>.<group>` (`<resource>` for the core
/// group), or a shortened form with a hash when that is not a valid label value (then the annotation of the same
/// name holds the full name).
pub const LABEL_RESOURCE: &str = "migration.k8s.io/resource";
/// The full `<resource>.<group>` when the label had to be shortened.
pub const ANNOTATION_RESOURCE: &str = "migration.k8s.io/resource";
/// The storage version hash the target published when the migration was requested.
pub const ANNOTATION_HASH: &str = "migration.k8s.io/storage-version-hash";
/// When the migration was requested, with sub-second precision: creationTimestamp has whole seconds, and two
/// migrations of one resource may be requested within a second.
pub const ANNOTATION_REQUESTED_AT: &str = "migration.k8s.io/requested-at";
/// Reason of the Failed condition of a migration that a newer one replaced.
pub const REASON_SUPERSEDED: &str = "Superseded";

const MAX_LABEL_VALUE: usize = 63;
/// Resources that the initializer never migrates (upstream's list: their objects expire anyway).
const NEVER_MIGRATED: &[&str] = &["events"];

// ---------------------------------------------------------------------------------------------------------------
// Discovery of the target.

/// One resource of the target's legacy discovery (no subresources).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredResource {
    pub group: String,
    /// The version a migration uses: the group's preferred version when it serves the resource, else the first
    /// listed version that does (client-go's ServerPreferredResources).
    pub version: String,
    pub resource: String,
    pub kind: String,
    /// storageVersionHash as published with `version` (the hash is about the storage version, the same in every
    /// served version).
    pub hash: Option<String>,
    pub verbs: Vec<String>,
    /// Every version of the group that serves the resource, preferred first.
    pub versions: Vec<String>,
}

impl DiscoveredResource {
    /// `<resource>.<group>` (`<resource>` for the core group): the StorageState name.
    pub fn qualified(&self) -> String {
        qualified(&self.resource, &self.group)
    }
    pub fn gvr(&self) -> GroupVersionResource {
        GroupVersionResource {
            group: self.group.clone(),
            version: self.version.clone(),
            resource: self.resource.clone(),
        }
    }
}

/// What one read of the target's discovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    pub resources: Vec<DiscoveredResource>,
    /// Groups whose discovery failed ("" is the core group), with the error. Nothing is concluded about them.
    pub failed: BTreeMap<String, String>,
}

/// A discovery failure that leaves nothing to work with (the group list itself).
#[derive(Clone, Debug, thiserror::Error)]
#[error("reading discovery {path}: {message}")]
pub struct DiscoveryError {
    pub path: String,
    pub message: String,
}

/// GET of a JSON document from the target; None on 404.
async fn get_json<T: DeserializeOwned>(
    client: &kube::Client,
    path: &str,
    timeout: Duration,
) -> Result<Option<T>, DiscoveryError> {
    let err = |message: String| DiscoveryError { path: path.to_string(), message };
    let req = Request::builder()
        .method(Method::GET)
        .uri(path)
        // Plain JSON: the legacy documents (APIGroupList, APIResourceList), which carry storageVersionHash.
        .header(header::ACCEPT, "application/json")
        .body(Vec::new())
        .map_err(|e| err(e.to_string()))?;
    match tokio::time::timeout(timeout, client.request::<T>(req)).await {
        Err(_) => Err(err(format!("timed out after {timeout:?}"))),
        Ok(Ok(v)) => Ok(Some(v)),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(None),
        Ok(Err(kube::Error::Api(s))) => Err(err(format!("{} ({})", s.message, s.code))),
        Ok(Err(e)) => Err(err(e.to_string())),
    }
}

/// Reads `/api`, `/api/<v>`, `/apis` and `/apis/<group>/<version>` for every version of every group. A group whose
/// documents cannot all be read is reported in [`Discovery::failed`] and contributes no resources; only a failure
/// of `/apis` itself fails the whole read.
pub async fn discover(client: &kube::Client, timeout: Duration) -> Result<Discovery, DiscoveryError> {
    let mut out = Discovery::default();
    // The core group: absent on servers that have none (404, or no versions).
    match get_json::<APIVersions>(client, "/api", timeout).await {
        Ok(Some(v)) => {
            let versions = v.versions;
            match read_group(client, "", &versions, timeout).await {
                Ok(rs) => out.resources.extend(rs),
                Err(e) => drop(out.failed.insert(String::new(), e.to_string())),
            }
        }
        Ok(None) => {}
        Err(e) => drop(out.failed.insert(String::new(), e.to_string())),
    }
    let groups: APIGroupList = get_json(client, "/apis", timeout)
        .await?
        .ok_or_else(|| DiscoveryError { path: "/apis".into(), message: "not found".into() })?;
    let reads = groups.groups.into_iter().map(|g| async move {
        let mut versions: Vec<String> = Vec::new();
        if let Some(p) = &g.preferred_version {
            versions.push(p.version.clone());
        }
        for v in &g.versions {
            if !versions.contains(&v.version) {
                versions.push(v.version.clone());
            }
        }
        let r = read_group(client, &g.name, &versions, timeout).await;
        (g.name, r)
    });
    let results: Vec<_> = futures::stream::iter(reads).buffered(8).collect().await;
    for (group, r) in results {
        match r {
            Ok(rs) => out.resources.extend(rs),
            Err(e) => drop(out.failed.insert(group, e.to_string())),
        }
    }
    Ok(out)
}

/// The resources of one group from its versions' APIResourceLists (`versions` preferred first).
async fn read_group(
    client: &kube::Client,
    group: &str,
    versions: &[String],
    timeout: Duration,
) -> Result<Vec<DiscoveredResource>, DiscoveryError> {
    let mut lists = Vec::new();
    for v in versions {
        let path = if group.is_empty() { format!("/api/{v}") } else { format!("/apis/{group}/{v}") };
        // A version listed in the group but not served (404) has no resources; any other failure fails the group.
        if let Some(list) = get_json::<APIResourceList>(client, &path, timeout).await? {
            lists.push((v.clone(), list));
        }
    }
    Ok(group_resources(group, &lists))
}

/// Merges the APIResourceLists of one group's versions (preferred first) into one entry per resource.
pub fn group_resources(group: &str, lists: &[(String, APIResourceList)]) -> Vec<DiscoveredResource> {
    let mut out: Vec<DiscoveredResource> = Vec::new();
    for (version, list) in lists {
        for r in &list.resources {
            if r.name.contains('/') {
                continue; // subresource
            }
            match out.iter_mut().find(|d| d.resource == r.name) {
                Some(d) => d.versions.push(version.clone()),
                None => out.push(DiscoveredResource {
                    group: group.to_string(),
                    version: version.clone(),
                    resource: r.name.clone(),
                    kind: r.kind.clone(),
                    hash: r.storage_version_hash.clone().filter(|h| !h.is_empty()),
                    verbs: r.verbs.clone(),
                    versions: vec![version.clone()],
                }),
            }
        }
    }
    out
}

/// `migrate --all`: the upstream initializer's rule. Resources served in two or more group-versions (counted by
/// resource name over all groups, as upstream does), except those of CRD groups and aggregated groups,
/// subresources, `events`, and resources that cannot be listed and updated (or patched). One entry per resource
/// name: its first group in discovery order, at that group's preferred version.
pub fn migratable_resources(
    discovery: &Discovery,
    crd_groups: &BTreeSet<String>,
    aggregated_groups: &BTreeSet<String>,
) -> Vec<DiscoveredResource> {
    let mut by_name: Vec<(String, Vec<&DiscoveredResource>)> = Vec::new();
    for r in &discovery.resources {
        let has = |v: &str| r.verbs.iter().any(|x| x == v);
        if crd_groups.contains(&r.group)
            || aggregated_groups.contains(&r.group)
            || NEVER_MIGRATED.contains(&r.resource.as_str())
            || !(has("list") && (has("update") || has("patch")))
        {
            continue;
        }
        match by_name.iter_mut().find(|(n, _)| *n == r.resource) {
            Some((_, rs)) => rs.push(r),
            None => by_name.push((r.resource.clone(), vec![r])),
        }
    }
    by_name
        .into_iter()
        .filter(|(_, rs)| rs.iter().map(|r| r.versions.len()).sum::<usize>() >= 2)
        .map(|(_, rs)| rs[0].clone())
        .collect()
}

/// Finds `<resource>.<group>` (or `<resource>` for the core group) in discovery; a bare resource name that no core
/// resource has matches when exactly one group serves it (as kubectl resolves `deployments`).
pub fn resolve_resource<'a>(discovery: &'a Discovery, name: &str) -> Result<&'a DiscoveredResource, String> {
    if let Some(r) = discovery.resources.iter().find(|r| r.qualified() == name) {
        return Ok(r);
    }
    let candidates: Vec<&DiscoveredResource> = discovery.resources.iter().filter(|r| r.resource == name).collect();
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => {
            let failed = if discovery.failed.is_empty() {
                String::new()
            } else {
                let groups: Vec<&str> =
                    discovery.failed.keys().map(|g| if g.is_empty() { "core" } else { g.as_str() }).collect();
                format!(" (discovery failed for: {})", groups.join(", "))
            };
            Err(format!("the server doesn't have a resource type \"{name}\"{failed}"))
        }
        many => Err(format!(
            "\"{name}\" is ambiguous, use one of: {}",
            many.iter().map(|r| r.qualified()).collect::<Vec<_>>().join(", ")
        )),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Migrations: building, ordering, superseding, pruning.

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

fn name_of(m: &StorageVersionMigration) -> &str {
    m.metadata.name.as_deref().unwrap_or_default()
}

fn annotation<'a>(m: &'a ObjectMeta, key: &str) -> Option<&'a str> {
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

/// Oldest first (ties by name, for a stable order).
pub fn sort_by_request(migrations: &mut [StorageVersionMigration]) {
    migrations.sort_by(|a, b| requested_at(a).cmp(&requested_at(b)).then_with(|| name_of(a).cmp(name_of(b))));
}

/// The most recently requested migration.
pub fn latest(migrations: &[StorageVersionMigration]) -> Option<&StorageVersionMigration> {
    migrations.iter().max_by(|a, b| requested_at(a).cmp(&requested_at(b)).then_with(|| name_of(a).cmp(name_of(b))))
}

/// The migrations of one resource (by spec.resource, so that migrations created by hand count too).
pub fn of_resource(all: &[StorageVersionMigration], group: &str, resource: &str) -> Vec<StorageVersionMigration> {
    let mut out: Vec<_> = all
        .iter()
        .filter(|m| m.spec.resource.group == group && m.spec.resource.resource == resource)
        .cloned()
        .collect();
    sort_by_request(&mut out);
    out
}

/// The unfinished migrations (of one resource) other than `keep`: at most one migration of a resource runs, the
/// latest requested.
pub fn to_supersede<'a>(migrations: &'a [StorageVersionMigration], keep: &str) -> Vec<&'a StorageVersionMigration> {
    migrations.iter().filter(|m| !is_finished(m) && name_of(m) != keep).collect()
}

/// The finished migrations (of one resource) beyond the newest `keep`, oldest first.
pub fn to_prune(migrations: &[StorageVersionMigration], keep: usize) -> Vec<String> {
    let mut finished: Vec<StorageVersionMigration> = migrations.iter().filter(|m| is_finished(m)).cloned().collect();
    sort_by_request(&mut finished);
    let excess = finished.len().saturating_sub(keep);
    finished[..excess].iter().map(|m| name_of(m).to_string()).collect()
}

/// The status of `m` once superseded by `by`: Failed=True (reason Superseded), Running=False. None when `m` is
/// already finished (a terminal condition is never reverted).
pub fn superseded_status(
    m: &StorageVersionMigration,
    by: &str,
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
        set(&mut status, CONDITION_RUNNING, "False", REASON_SUPERSEDED, format!("superseded by {by}"));
    }
    set(
        &mut status,
        CONDITION_FAILED,
        "True",
        REASON_SUPERSEDED,
        format!("superseded by storageversionmigration {by}: a newer migration of this resource was requested"),
    );
    Some(status)
}

// ---------------------------------------------------------------------------------------------------------------
// Where migrations are written: the registry (in the server) or a remote migration-apiserver (the CLI).

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

const SVM_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";

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

/// Marks `m` Failed/Superseded by `by` through `/status`, re-reading on conflicts (the migrator writes progress
/// meanwhile). Returns the written migration, or None when it was finished or deleted meanwhile.
pub async fn supersede<S: MigrationStore + ?Sized>(
    store: &S,
    m: &StorageVersionMigration,
    by: &str,
) -> Result<Option<StorageVersionMigration>, StoreError> {
    let mut cur = m.clone();
    for attempt in 0.. {
        let Some(status) = superseded_status(&cur, by, Timestamp::now()) else { return Ok(None) };
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
) -> Result<(StorageVersionMigration, Vec<String>), StoreError> {
    let created = store.create_migration(&desired_migration(gvr, hash, Timestamp::now())).await?;
    let same = of_resource(existing, &gvr.group, &gvr.resource);
    let mut superseded = Vec::new();
    for old in to_supersede(&same, name_of(&created)) {
        if supersede(store, old, name_of(&created)).await?.is_some() {
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
// Decisions about one StorageState.

/// What the trigger concluded about a resource from one observation of its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// No StorageState (or one that never recorded a hash).
    New,
    /// The StorageState was reset at start-up (its heartbeat was stale).
    Reset,
    /// The hash differs from the recorded current hash.
    Changed {
        from: String,
    },
    Unchanged,
}

/// What to do for one resource after one observation of its hash.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub observation: Observation,
    /// The StorageState does not exist: create it (then write `status` through /status).
    pub create_state: bool,
    /// The StorageState status to write (always: at least the heartbeat).
    pub status: StorageStateStatus,
    /// Request a new migration (which supersedes any unfinished one).
    pub start_migration: bool,
}

fn latest_for_hash<'a>(migrations: &'a [StorageVersionMigration], hash: &str) -> Option<&'a StorageVersionMigration> {
    latest(migrations).filter(|m| migration_hash(m) == Some(hash))
}

/// The trigger's decision for one resource whose discovery shows `hash`, given its StorageState, its migrations and
/// whether the start-up check reset it. Migrations of the current hash that are unfinished are kept (never
/// restarted: a restart of the server resumes them); a Succeeded one counts as done except after a reset; a Failed
/// one (not superseded) is not relaunched automatically (upstream relaunched failed migrations every period) but
/// waits for `migrate` by hand.
pub fn plan(
    hash: &str,
    state: Option<&StorageState>,
    migrations: &[StorageVersionMigration],
    now: Timestamp,
    reset: bool,
) -> Plan {
    let current = latest_for_hash(migrations, hash);
    let unfinished = current.is_some_and(|m| !is_finished(m));
    let succeeded = current.is_some_and(|m| m.is_true(CONDITION_SUCCEEDED));
    let failed = current.is_some_and(|m| m.is_true(CONDITION_FAILED) && !is_superseded(m));
    let mut status = state.and_then(|s| s.status.clone()).unwrap_or_default();
    let recorded = status.current_storage_version_hash.clone().filter(|h| !h.is_empty());
    let (observation, start) = match (state, recorded) {
        (None, _) | (Some(_), None) => {
            status.persisted_storage_version_hashes = vec![UNKNOWN_HASH.to_string()];
            (Observation::New, !unfinished)
        }
        (Some(_), Some(_)) if reset => {
            status.persisted_storage_version_hashes = vec![UNKNOWN_HASH.to_string()];
            (Observation::Reset, !unfinished)
        }
        (Some(_), Some(from)) if from != hash => {
            if !status.persisted_storage_version_hashes.iter().any(|h| h == hash) {
                status.persisted_storage_version_hashes.push(hash.to_string());
            }
            if succeeded {
                // A migration to this hash already completed (requested by hand, or before a crash).
                status.persisted_storage_version_hashes = vec![hash.to_string()];
            }
            (Observation::Changed { from }, !unfinished && !succeeded)
        }
        (Some(_), Some(_)) => {
            let migrated = status.persisted_storage_version_hashes == [hash];
            if !migrated && succeeded {
                // The success was not seen yet (it happened while the trigger was down, or just now).
                status.persisted_storage_version_hashes = vec![hash.to_string()];
            }
            (Observation::Unchanged, !migrated && !succeeded && !unfinished && !failed)
        }
    };
    status.current_storage_version_hash = Some(hash.to_string());
    status.last_heartbeat_time = Some(Time(now));
    Plan { observation, create_state: state.is_none(), status, start_migration: start }
}

/// Whether a StorageState's heartbeat is older than two discovery intervals (or missing): the trigger may have
/// missed storage version changes, so persisted is no longer trustworthy.
pub fn is_stale(state: &StorageState, now: Timestamp, interval: Duration) -> bool {
    let Some(hb) = state.status.as_ref().and_then(|s| s.last_heartbeat_time.as_ref()) else { return true };
    let age_ms = now.as_millisecond().saturating_sub(hb.0.as_millisecond());
    age_ms > 2 * i64::try_from(interval.as_millis()).unwrap_or(i64::MAX / 4)
}

/// The StorageState status after the latest migration of its resource Succeeded for the current hash: persisted =
/// [current]. None when there is nothing to change.
pub fn success_update(state: &StorageState, migrations: &[StorageVersionMigration]) -> Option<StorageStateStatus> {
    let status = state.status.as_ref()?;
    let current = status.current_storage_version_hash.as_deref().filter(|h| !h.is_empty())?;
    if status.persisted_storage_version_hashes == [current] {
        return None;
    }
    let m = latest_for_hash(migrations, current)?;
    if !m.is_true(CONDITION_SUCCEEDED) {
        return None;
    }
    let mut next = status.clone();
    next.persisted_storage_version_hashes = vec![current.to_string()];
    Some(next)
}

// ---------------------------------------------------------------------------------------------------------------
// The controller.

pub fn spawn(config: SchedulerConfig, target: kube::Client, own: OwnApi) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { Trigger::new(config, target, own).run().await })
}

struct Trigger {
    config: SchedulerConfig,
    target: kube::Client,
    own: OwnApi,
    /// StorageStates reset at start-up that still need their migration.
    reset_pending: HashSet<String>,
}

type Finished = BTreeSet<(String, String)>;

impl Trigger {
    fn new(config: SchedulerConfig, target: kube::Client, own: OwnApi) -> Self {
        Trigger { config, target, own, reset_pending: HashSet::new() }
    }

    async fn run(mut self) {
        self.reset_stale().await;
        let mut watch = self.watch_migrations().await;
        let mut next_poll = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_poll) => {
                    let complete = self.poll().await;
                    let interval = self.config.discovery_interval;
                    // A target that cannot be read at all is retried sooner than a full interval.
                    let wait = if complete { interval } else { interval.min(Duration::from_secs(30)) };
                    next_poll = tokio::time::Instant::now() + wait;
                }
                ev = recv(&mut watch) => {
                    let mut finished = Finished::new();
                    let mut lost = false;
                    match ev {
                        Some(ev) => collect_finished(ev, &mut finished, &mut lost),
                        None => lost = true,
                    }
                    if let Some(rx) = watch.as_mut() {
                        while let Ok(ev) = rx.try_recv() {
                            collect_finished(ev, &mut finished, &mut lost);
                        }
                    }
                    if lost {
                        // Events may have been missed: look at every resource, then watch again.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        watch = self.watch_migrations().await;
                        finished = self.all_migrated_resources().await;
                    }
                    self.on_finished(finished).await;
                }
            }
        }
    }

    /// Start-up: StorageStates whose heartbeat is older than two intervals get persisted = ["Unknown"].
    async fn reset_stale(&mut self) {
        let states = match self.own.list::<StorageState>(None, "").await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e.message, "trigger: listing storagestates for the start-up check");
                return;
            }
        };
        for mut s in states {
            let now = Timestamp::now();
            if !is_stale(&s, now, self.config.discovery_interval) {
                continue;
            }
            let name = s.metadata.name.clone().unwrap_or_default();
            for attempt in 0..5 {
                let mut status = s.status.clone().unwrap_or_default();
                status.persisted_storage_version_hashes = vec![UNKNOWN_HASH.to_string()];
                let mut next = s.clone();
                next.status = Some(status);
                match self.own.update_status(&next).await {
                    Ok(_) => {
                        tracing::info!(storagestate = %name, heartbeat = ?s.status.as_ref().and_then(|st| st.last_heartbeat_time.as_ref()).map(|t| t.0.to_string()),
                            "trigger: heartbeat older than two discovery intervals, persisted storage versions reset to Unknown");
                        self.reset_pending.insert(name.clone());
                        break;
                    }
                    Err(e) if e.code == 409 && attempt < 4 => match self.own.get::<StorageState>(None, &name).await {
                        Ok(Some(fresh)) => s = fresh,
                        _ => break,
                    },
                    Err(e) => {
                        tracing::warn!(storagestate = %name, error = %e.message, "trigger: resetting a stale storagestate");
                        break;
                    }
                }
            }
        }
    }

    async fn watch_migrations(&self) -> Option<mpsc::Receiver<WatchOut>> {
        let info = StorageVersionMigration::info();
        let resource = self.own.registry().resource(info.group, info.versions[0], info.plural)?;
        let params = WatchParams { send_initial_events: Some(false), ..Default::default() };
        match resource.watch(None, info.versions[0], params).await {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(error = %e.message, "trigger: watching storageversionmigrations");
                None
            }
        }
    }

    /// One discovery read and the StorageStates and migrations it implies. Returns false when discovery could not
    /// be read at all.
    async fn poll(&mut self) -> bool {
        let discovery = match discover(&self.target, self.config.request_timeout).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "trigger: discovery failed; nothing changed, retrying");
                return false;
            }
        };
        for (group, error) in &discovery.failed {
            tracing::warn!(group = %group, error = %error, "trigger: discovery of a group failed; its storagestates are left as they are");
        }
        let (states, migrations) = match self.read_own().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "trigger: reading storagestates and storageversionmigrations");
                return true;
            }
        };
        let states: HashMap<String, StorageState> =
            states.into_iter().map(|s| (s.metadata.name.clone().unwrap_or_default(), s)).collect();
        for r in &discovery.resources {
            let Some(hash) = r.hash.as_deref() else { continue };
            let name = r.qualified();
            let mine = of_resource(&migrations, &r.group, &r.resource);
            if let Err(e) = self.reconcile(r, hash, states.get(&name).cloned(), mine).await {
                tracing::warn!(storagestate = %name, error = %e, "trigger: reconciling a resource failed; retrying next period");
            }
        }
        true
    }

    async fn read_own(&self) -> Result<(Vec<StorageState>, Vec<StorageVersionMigration>), StoreError> {
        Ok((self.own.list(None, "").await?, self.own.list_migrations().await?))
    }

    /// Applies [`plan`] to one resource: the migration first (so that a heartbeat always means its migration was
    /// requested), then the StorageState; on a write conflict, again from fresh reads.
    async fn reconcile(
        &mut self,
        r: &DiscoveredResource,
        hash: &str,
        mut state: Option<StorageState>,
        mut migrations: Vec<StorageVersionMigration>,
    ) -> Result<(), StoreError> {
        let name = r.qualified();
        for attempt in 0..4 {
            let reset = self.reset_pending.contains(&name);
            let plan = plan(hash, state.as_ref(), &migrations, Timestamp::now(), reset);
            if plan.start_migration {
                let (created, superseded) = start_migration(&self.own, &r.gvr(), Some(hash), &migrations).await?;
                tracing::info!(resource = %name, hash, observation = ?plan.observation, migration = %name_of(&created),
                    superseded = ?superseded, "trigger: storage version migration requested");
                migrations = of_resource(&self.own.list_migrations().await?, &r.group, &r.resource);
            } else if let Some(keep) = latest(&migrations).map(|m| name_of(m).to_string()) {
                let stray: Vec<StorageVersionMigration> =
                    to_supersede(&migrations, &keep).into_iter().cloned().collect();
                for m in &stray {
                    supersede(&self.own, m, &keep).await?;
                }
                if !stray.is_empty() {
                    migrations = of_resource(&self.own.list_migrations().await?, &r.group, &r.resource);
                }
            }
            self.prune(&name, &migrations).await?;
            if plan.observation != Observation::Unchanged {
                tracing::info!(storagestate = %name, observation = ?plan.observation, current = hash,
                    persisted = ?plan.status.persisted_storage_version_hashes, "trigger: storagestate updated");
            }
            let written = match state.take() {
                None => {
                    let new = StorageState {
                        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                        spec: crate::api::storage_state::StorageStateSpec {
                            resource: GroupResource { group: r.group.clone(), resource: r.resource.clone() },
                        },
                        status: None,
                    };
                    match self.own.create(&new).await {
                        Ok(mut created) => {
                            created.status = Some(plan.status.clone());
                            self.own.update_status(&created).await
                        }
                        Err(e) => Err(e),
                    }
                }
                Some(mut s) => {
                    s.status = Some(plan.status.clone());
                    self.own.update_status(&s).await
                }
            };
            match written {
                Ok(_) => {
                    self.reset_pending.remove(&name);
                    return Ok(());
                }
                Err(e) if e.code == 409 && attempt < 3 => {
                    state = self.own.get(None, &name).await?;
                    migrations = of_resource(&self.own.list_migrations().await?, &r.group, &r.resource);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn prune(&self, name: &str, migrations: &[StorageVersionMigration]) -> Result<(), StoreError> {
        let deleted = prune_history(&self.own, migrations, self.config.migration_history.max(1)).await?;
        if !deleted.is_empty() {
            tracing::info!(resource = %name, deleted = ?deleted, keep = self.config.migration_history,
                "trigger: finished migrations beyond the history limit deleted");
        }
        Ok(())
    }

    /// Every resource that has a finished migration (after the watch was lost).
    async fn all_migrated_resources(&self) -> Finished {
        match self.own.list_migrations().await {
            Ok(all) => all
                .iter()
                .filter(|m| is_finished(m))
                .map(|m| (m.spec.resource.group.clone(), m.spec.resource.resource.clone()))
                .collect(),
            Err(_) => Finished::new(),
        }
    }

    /// Migrations finished: persisted = [current] where the latest one Succeeded for the current hash; history
    /// pruned.
    async fn on_finished(&mut self, finished: Finished) {
        if finished.is_empty() {
            return;
        }
        let all = match self.own.list_migrations().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "trigger: listing storageversionmigrations");
                return;
            }
        };
        for (group, resource) in finished {
            let name = qualified(&resource, &group);
            let mine = of_resource(&all, &group, &resource);
            if let Err(e) = self.prune(&name, &mine).await {
                tracing::warn!(resource = %name, error = %e, "trigger: pruning migration history");
            }
            if self.reset_pending.contains(&name) {
                continue; // its new migration is yet to be requested
            }
            for _ in 0..4 {
                let state = match self.own.get::<StorageState>(None, &name).await {
                    Ok(Some(s)) => s,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(storagestate = %name, error = %e.message, "trigger: reading storagestate");
                        break;
                    }
                };
                let Some(status) = success_update(&state, &mine) else { break };
                let mut next = state.clone();
                next.status = Some(status);
                match self.own.update_status(&next).await {
                    Ok(_) => {
                        tracing::info!(storagestate = %name, persisted = ?next.status.as_ref().map(|s| &s.persisted_storage_version_hashes),
                            "trigger: migration succeeded; objects are stored in the current storage version");
                        break;
                    }
                    Err(e) if e.code == 409 => continue,
                    Err(e) => {
                        tracing::warn!(storagestate = %name, error = %e.message, "trigger: updating storagestate after a migration");
                        break;
                    }
                }
            }
        }
    }
}

async fn recv(watch: &mut Option<mpsc::Receiver<WatchOut>>) -> Option<WatchOut> {
    match watch {
        Some(rx) => rx.recv().await,
        // No watch (it could not be opened): fall back to a short poll of every finished migration.
        None => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        }
    }
}

fn collect_finished(ev: WatchOut, finished: &mut Finished, lost: &mut bool) {
    match ev {
        WatchOut::Event { kind, object } if kind != "DELETED" => {
            if let Ok(m) = serde_json::from_value::<StorageVersionMigration>(object) {
                if is_finished(&m) {
                    finished.insert((m.spec.resource.group.clone(), m.spec.resource.resource.clone()));
                }
            }
        }
        WatchOut::Event { .. } | WatchOut::Bookmark { .. } => {}
        WatchOut::Error(_) => *lost = true,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// `migrate`: migrations requested by hand.

/// What `migrate` should do.
#[derive(Clone, Debug)]
pub enum MigrateRequest {
    /// `--resource <resource>.<group>`, repeatable.
    Resources(Vec<String>),
    /// `--all`: the initializer's rule ([`migratable_resources`]).
    All,
}

/// Group names of the target's CRDs (empty when it serves no CustomResourceDefinitions).
async fn crd_groups(target: &kube::Client, timeout: Duration) -> Result<BTreeSet<String>, DiscoveryError> {
    let list: Option<Value> =
        get_json(target, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", timeout).await?;
    Ok(items(&list).filter_map(|crd| crd["spec"]["group"].as_str().map(str::to_string)).collect())
}

/// Groups served by an aggregated API server (an APIService with spec.service).
async fn aggregated_groups(target: &kube::Client, timeout: Duration) -> Result<BTreeSet<String>, DiscoveryError> {
    let list: Option<Value> = get_json(target, "/apis/apiregistration.k8s.io/v1/apiservices", timeout).await?;
    Ok(items(&list)
        .filter(|s| s["spec"]["service"].is_object())
        .filter_map(|s| s["spec"]["group"].as_str().map(str::to_string))
        .collect())
}

fn items(list: &Option<Value>) -> impl Iterator<Item = &Value> {
    list.iter().flat_map(|l| l["items"].as_array().into_iter().flatten())
}

/// Requests migrations by hand: resolves the resources against `target`'s discovery (preferred version, current
/// hash) and creates them in `store` exactly as the trigger would, superseding unfinished ones. Returns the names
/// created.
pub async fn request_migrations<S: MigrationStore + ?Sized>(
    target: &kube::Client,
    store: &S,
    request: &MigrateRequest,
) -> anyhow::Result<Vec<String>> {
    let timeout = Duration::from_secs(30);
    let discovery = discover(target, timeout).await?;
    let wanted: Vec<DiscoveredResource> = match request {
        MigrateRequest::Resources(names) => {
            let mut out = Vec::new();
            for n in names {
                out.push(resolve_resource(&discovery, n).map_err(anyhow::Error::msg)?.clone());
            }
            out
        }
        MigrateRequest::All => {
            if !discovery.failed.is_empty() {
                anyhow::bail!(
                    "discovery failed for some groups, refusing to guess what to migrate: {:?}",
                    discovery.failed
                );
            }
            let crds = crd_groups(target, timeout).await?;
            let aggregated = aggregated_groups(target, timeout).await?;
            migratable_resources(&discovery, &crds, &aggregated)
        }
    };
    let mut existing = store.list_migrations().await?;
    let mut created = Vec::new();
    for r in wanted {
        let (m, superseded) = start_migration(store, &r.gvr(), r.hash.as_deref(), &existing).await?;
        for s in superseded {
            tracing::info!(migration = %s, by = %name_of(&m), "superseded");
        }
        created.push(name_of(&m).to_string());
        existing.push(m);
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    const A: &str = "hashA=";
    const B: &str = "hashB=";

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("timestamp")
    }

    fn state(current: &str, persisted: &[&str], heartbeat: i64) -> StorageState {
        StorageState {
            metadata: ObjectMeta { name: Some("shootstates.core.gardener.cloud".into()), ..Default::default() },
            spec: crate::api::storage_state::StorageStateSpec {
                resource: GroupResource { group: "core.gardener.cloud".into(), resource: "shootstates".into() },
            },
            status: Some(StorageStateStatus {
                persisted_storage_version_hashes: persisted.iter().map(|s| s.to_string()).collect(),
                current_storage_version_hash: Some(current.into()),
                last_heartbeat_time: Some(Time(ts(heartbeat))),
                ..Default::default()
            }),
        }
    }

    fn gvr() -> GroupVersionResource {
        GroupVersionResource {
            group: "core.gardener.cloud".into(),
            version: "v1beta1".into(),
            resource: "shootstates".into(),
        }
    }

    /// A migration requested at `at` for `hash`, with the True condition `phase` (or none: pending).
    fn svm(name: &str, hash: &str, at: i64, phase: Option<(&str, &str)>) -> StorageVersionMigration {
        let mut m = desired_migration(&gvr(), Some(hash), ts(at));
        m.metadata.name = Some(name.into());
        if let Some((type_, reason)) = phase {
            m.status = Some(crate::api::storage_version_migration::StorageVersionMigrationStatus {
                conditions: vec![MigrationCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    reason: Some(reason.into()),
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        m
    }

    fn plan_of(st: Option<&StorageState>, ms: &[StorageVersionMigration], hash: &str, reset: bool) -> Plan {
        plan(hash, st, ms, ts(100), reset)
    }

    #[test]
    fn new_resource_gets_unknown_and_a_migration() {
        let p = plan_of(None, &[], A, false);
        assert_eq!(p.observation, Observation::New);
        assert!(p.create_state && p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [UNKNOWN_HASH]);
        assert_eq!(p.status.current_storage_version_hash.as_deref(), Some(A));
        assert_eq!(p.status.last_heartbeat_time, Some(Time(ts(100))));
    }

    #[test]
    fn new_resource_keeps_an_unfinished_migration_of_its_hash() {
        // E.g. the migration was requested and the trigger stopped before it created the StorageState.
        let p = plan_of(None, &[svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")))], A, false);
        assert!(!p.start_migration);
        // ... but a succeeded one does not make a new StorageState "migrated": persisted starts Unknown, and a
        // migration is requested (deleting a StorageState is the KEP's way to reset it).
        let p = plan_of(None, &[svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))], A, false);
        assert!(p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [UNKNOWN_HASH]);
    }

    #[test]
    fn unchanged_hash_is_a_heartbeat_only() {
        let st = state(A, &[A], 50);
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        let p = plan_of(Some(&st), &ms, A, false);
        assert_eq!(p.observation, Observation::Unchanged);
        assert!(!p.start_migration && !p.create_state);
        assert_eq!(p.status.persisted_storage_version_hashes, [A]);
        assert_eq!(p.status.last_heartbeat_time, Some(Time(ts(100))));
        // Migrated, and no migration at all (history pruned to nothing, or never needed): still nothing to do.
        assert!(!plan_of(Some(&st), &[], A, false).start_migration);
    }

    #[test]
    fn unchanged_hash_while_the_migration_runs_waits() {
        let st = state(A, &[UNKNOWN_HASH], 50);
        let ms = [svm("m1", A, 1, None)];
        let p = plan_of(Some(&st), &ms, A, false);
        assert!(!p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [UNKNOWN_HASH]);
    }

    #[test]
    fn unchanged_hash_without_a_migration_requests_one() {
        // The StorageState was written but its migration never was (a crash in between), or was deleted.
        let p = plan_of(Some(&state(A, &[UNKNOWN_HASH], 50)), &[], A, false);
        assert!(p.start_migration);
        // The latest migration is for another hash (a downgrade back to A after a migration to B).
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
        assert!(plan_of(Some(&state(A, &[A, B], 50)), &ms, A, false).start_migration);
    }

    #[test]
    fn missed_success_is_applied() {
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        let p = plan_of(Some(&state(A, &[UNKNOWN_HASH], 50)), &ms, A, false);
        assert!(!p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [A]);
    }

    #[test]
    fn failed_migration_is_not_relaunched_but_a_superseded_one_is() {
        let st = state(A, &[UNKNOWN_HASH], 50);
        let failed = [svm("m1", A, 1, Some((CONDITION_FAILED, "Forbidden")))];
        assert!(!plan_of(Some(&st), &failed, A, false).start_migration);
        // Superseded, and its successor is gone: it did not fail, it was replaced.
        let superseded = [svm("m1", A, 1, Some((CONDITION_FAILED, REASON_SUPERSEDED)))];
        assert!(plan_of(Some(&st), &superseded, A, false).start_migration);
    }

    #[test]
    fn changed_hash_appends_and_requests_a_migration() {
        let st = state(A, &[A], 50);
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        let p = plan_of(Some(&st), &ms, B, false);
        assert_eq!(p.observation, Observation::Changed { from: A.into() });
        assert!(p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [A, B]);
        assert_eq!(p.status.current_storage_version_hash.as_deref(), Some(B));
        // Back to A (a downgrade) while the migration to B runs, or after it succeeded: A is already listed, not
        // appended twice, and the old success of A does not count (B's migration is the latest).
        for b in [None, Some((CONDITION_SUCCEEDED, "Done"))] {
            let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, b)];
            let p = plan_of(Some(&state(B, &[A, B], 50)), &ms, A, false);
            assert!(p.start_migration);
            assert_eq!(p.status.persisted_storage_version_hashes, [A, B]);
        }
        // From Unknown.
        let p = plan_of(Some(&state(A, &[UNKNOWN_HASH], 50)), &[], B, false);
        assert_eq!(p.status.persisted_storage_version_hashes, [UNKNOWN_HASH, B]);
    }

    #[test]
    fn changed_hash_with_its_migration_already_requested() {
        // `migrate` (or a previous run) requested the migration to B before the trigger saw B.
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
        let p = plan_of(Some(&state(A, &[A], 50)), &ms, B, false);
        assert!(!p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [A, B]);
        // ... and it already succeeded.
        let ms = [svm("m2", B, 2, Some((CONDITION_SUCCEEDED, "Done")))];
        let p = plan_of(Some(&state(A, &[A], 50)), &ms, B, false);
        assert!(!p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [B]);
    }

    #[test]
    fn reset_requests_a_migration_even_after_a_success() {
        let st = state(A, &[UNKNOWN_HASH], 1);
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        let p = plan_of(Some(&st), &ms, A, true);
        assert_eq!(p.observation, Observation::Reset);
        assert!(p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [UNKNOWN_HASH]);
        // An unfinished migration of the current hash is resumed, not restarted.
        let ms = [svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")))];
        assert!(!plan_of(Some(&st), &ms, A, true).start_migration);
        // A reset resource whose hash changed meanwhile: Unknown, current = new hash, migrate.
        let p = plan_of(Some(&st), &ms, B, true);
        assert!(p.start_migration);
        assert_eq!(p.status.persisted_storage_version_hashes, [UNKNOWN_HASH]);
        assert_eq!(p.status.current_storage_version_hash.as_deref(), Some(B));
    }

    #[test]
    fn ha_reports_are_preserved() {
        let mut st = state(A, &[A], 50);
        let reports = vec![crate::api::storage_state::ReportedStorageVersionHash {
            reporter_id: "replica-1".into(),
            current_storage_version_hash: A.into(),
            last_heartbeat_time: None,
        }];
        st.status.as_mut().expect("status").current_storage_version_hashes = reports.clone();
        for h in [A, B] {
            assert_eq!(plan_of(Some(&st), &[], h, false).status.current_storage_version_hashes, reports);
        }
    }

    #[test]
    fn staleness() {
        let interval = Duration::from_secs(600);
        let now = ts(10_000);
        assert!(!is_stale(&state(A, &[A], 10_000 - 1200), now, interval));
        assert!(is_stale(&state(A, &[A], 10_000 - 1201), now, interval));
        let mut never = state(A, &[A], 0);
        never.status.as_mut().expect("status").last_heartbeat_time = None;
        assert!(is_stale(&never, now, interval));
    }

    #[test]
    fn success_sets_persisted_to_current_only_for_the_latest_migration() {
        let done = [svm("m1", B, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        assert_eq!(success_update(&state(B, &[A, B], 0), &done).expect("update").persisted_storage_version_hashes, [B]);
        // Already migrated: nothing to write.
        assert!(success_update(&state(B, &[B], 0), &done).is_none());
        // A migration of an older hash succeeded (it finished before it could be superseded): no conclusion.
        assert!(success_update(&state(A, &[A, B], 0), &done).is_none());
        // A -> B -> A: the old success of A is not the latest migration; the one of B is unfinished.
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
        assert!(success_update(&state(A, &[A, B], 0), &ms).is_none());
        // Failed: nothing.
        let failed = [svm("m1", B, 1, Some((CONDITION_FAILED, "Forbidden")))];
        assert!(success_update(&state(B, &[A, B], 0), &failed).is_none());
    }

    #[test]
    fn ordering_uses_the_sub_second_request_time() {
        let mut early =
            desired_migration(&gvr(), Some(A), Timestamp::from_nanosecond(1_700_000_000_100_000_000).expect("ts"));
        early.metadata.name = Some("zzz".into());
        let mut late =
            desired_migration(&gvr(), Some(B), Timestamp::from_nanosecond(1_700_000_000_900_000_000).expect("ts"));
        late.metadata.name = Some("aaa".into());
        let both = [late.clone(), early.clone()];
        assert_eq!(latest(&both).and_then(|m| m.metadata.name.as_deref()), Some("aaa"));
    }

    #[test]
    fn supersede_and_prune_selection() {
        let ms = vec![
            svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))),
            svm("m2", A, 2, Some((CONDITION_FAILED, REASON_SUPERSEDED))),
            svm("m3", A, 3, Some((CONDITION_FAILED, "Forbidden"))),
            svm("m4", B, 4, Some((CONDITION_RUNNING, "Running"))),
            svm("m5", B, 5, None),
        ];
        let names = |v: Vec<&StorageVersionMigration>| v.iter().map(|m| name_of(m).to_string()).collect::<Vec<_>>();
        assert_eq!(names(to_supersede(&ms, "m5")), ["m4"]);
        assert_eq!(to_prune(&ms, 2), ["m1"]);
        assert_eq!(to_prune(&ms, 1), ["m1", "m2"]);
        assert!(to_prune(&ms, 5).is_empty());
    }

    #[test]
    fn superseded_status_never_reverts_a_terminal_condition() {
        let running = svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")));
        let st = superseded_status(&running, "m2", ts(5)).expect("status");
        let by_type = |t: &str| st.conditions.iter().find(|c| c.type_ == t).cloned().expect("condition");
        assert_eq!(by_type(CONDITION_FAILED).status, "True");
        assert_eq!(by_type(CONDITION_FAILED).reason.as_deref(), Some(REASON_SUPERSEDED));
        assert!(by_type(CONDITION_FAILED).message.expect("message").contains("m2"));
        assert_eq!(by_type(CONDITION_RUNNING).status, "False");
        // Valid per the API's own rules.
        let mut m = running.clone();
        m.status = Some(st);
        assert!(crate::api::Kind::validate(&m).is_empty(), "{:?}", crate::api::Kind::validate(&m));
        for done in [CONDITION_SUCCEEDED, CONDITION_FAILED] {
            assert!(superseded_status(&svm("m1", A, 1, Some((done, "X"))), "m2", ts(5)).is_none());
        }
    }

    #[test]
    fn desired_migration_names_and_labels() {
        let m = desired_migration(&gvr(), Some(A), ts(0));
        assert_eq!(m.metadata.generate_name.as_deref(), Some("shootstates.core.gardener.cloud-"));
        let labels = m.metadata.labels.clone().expect("labels");
        assert_eq!(labels[LABEL_RESOURCE], "shootstates.core.gardener.cloud");
        let ann = m.metadata.annotations.clone().expect("annotations");
        assert_eq!(ann[ANNOTATION_HASH], A);
        assert!(!ann.contains_key(ANNOTATION_RESOURCE));
        assert_eq!(m.spec.resource, gvr());
        // Core group.
        let pods = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "pods".into() };
        let m = desired_migration(&pods, Some(A), ts(0));
        assert_eq!(m.metadata.generate_name.as_deref(), Some("pods-"));
        assert_eq!(m.metadata.labels.expect("labels")[LABEL_RESOURCE], "pods");
        // Too long for a label value: shortened with a hash, full name in the annotation.
        let group = format!("{}.example.com", "very-long-group-name".repeat(3));
        let long = GroupVersionResource { group: group.clone(), version: "v1".into(), resource: "widgets".into() };
        let m = desired_migration(&long, None, ts(0));
        let label = m.metadata.labels.expect("labels")[LABEL_RESOURCE].clone();
        assert!(label.len() <= 63, "{label}");
        assert!(
            label.starts_with("widgets.very-long") && label.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        );
        let ann = m.metadata.annotations.expect("annotations");
        assert_eq!(ann[ANNOTATION_RESOURCE], format!("widgets.{group}"));
        assert!(!ann.contains_key(ANNOTATION_HASH));
        // Different long names get different labels.
        let other = resource_label_value(&group, "gadgets").0;
        assert_ne!(other, label);
    }

    fn api_resource(name: &str, verbs: &[&str], hash: Option<&str>) -> APIResource {
        APIResource {
            name: name.into(),
            kind: "K".into(),
            namespaced: true,
            singular_name: String::new(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            storage_version_hash: hash.map(str::to_string),
            ..Default::default()
        }
    }

    fn list(gv: &str, resources: Vec<APIResource>) -> APIResourceList {
        APIResourceList { group_version: gv.into(), resources }
    }

    const RW: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

    #[test]
    fn group_resources_prefers_the_preferred_version_and_skips_subresources() {
        let lists = vec![
            (
                "v1beta1".to_string(),
                list("g/v1beta1", vec![api_resource("a", RW, Some(A)), api_resource("a/status", &["get"], None)]),
            ),
            (
                "v1alpha1".to_string(),
                list("g/v1alpha1", vec![api_resource("a", RW, Some(A)), api_resource("b", RW, Some(B))]),
            ),
        ];
        let rs = group_resources("g", &lists);
        assert_eq!(rs.len(), 2);
        assert_eq!((rs[0].resource.as_str(), rs[0].version.as_str()), ("a", "v1beta1"));
        assert_eq!(rs[0].versions, ["v1beta1", "v1alpha1"]);
        assert_eq!(rs[0].hash.as_deref(), Some(A));
        // Only in a non-preferred version: that version.
        assert_eq!((rs[1].resource.as_str(), rs[1].version.as_str()), ("b", "v1alpha1"));
    }

    #[test]
    fn initializer_rule() {
        let mut d = Discovery::default();
        d.resources.extend(group_resources(
            "",
            &[(
                "v1".into(),
                list(
                    "v1",
                    vec![
                        api_resource("pods", RW, Some(A)),
                        api_resource("events", RW, Some(A)),
                        api_resource("bindings", &["create"], None),
                    ],
                ),
            )],
        ));
        d.resources.extend(group_resources(
            "events.k8s.io",
            &[("v1".into(), list("events.k8s.io/v1", vec![api_resource("events", RW, Some(A))]))],
        ));
        d.resources.extend(group_resources(
            "core.gardener.cloud",
            &[
                ("v1beta1".into(), list("core.gardener.cloud/v1beta1", vec![api_resource("shootstates", RW, Some(B))])),
                (
                    "v1alpha1".into(),
                    list("core.gardener.cloud/v1alpha1", vec![api_resource("shootstates", RW, Some(B))]),
                ),
            ],
        ));
        d.resources.extend(group_resources(
            "crd.example.com",
            &[
                ("v2".into(), list("crd.example.com/v2", vec![api_resource("widgets", RW, Some(A))])),
                ("v1".into(), list("crd.example.com/v1", vec![api_resource("widgets", RW, Some(A))])),
            ],
        ));
        d.resources.extend(group_resources(
            "metrics.k8s.io",
            &[("v1beta1".into(), list("metrics.k8s.io/v1beta1", vec![api_resource("pods", &["get", "list"], None)]))],
        ));
        d.resources.extend(group_resources(
            "extensions",
            &[("v1beta1".into(), list("extensions/v1beta1", vec![api_resource("ingresses", RW, Some(A))]))],
        ));
        d.resources.extend(group_resources(
            "networking.k8s.io",
            &[(
                "v1".into(),
                list("networking.k8s.io/v1", vec![api_resource("ingresses", &["get", "list", "patch"], Some(A))]),
            )],
        ));
        d.resources.extend(group_resources(
            "readonly.io",
            &[
                ("v2".into(), list("readonly.io/v2", vec![api_resource("things", &["get", "list"], Some(A))])),
                ("v1".into(), list("readonly.io/v1", vec![api_resource("things", &["get", "list"], Some(A))])),
            ],
        ));
        let crds = BTreeSet::from(["crd.example.com".to_string()]);
        let aggregated = BTreeSet::from(["metrics.k8s.io".to_string()]);
        let got: Vec<String> = migratable_resources(&d, &crds, &aggregated)
            .iter()
            .map(|r| format!("{}/{}", r.gvr().display(), r.hash.clone().unwrap_or_default()))
            .collect();
        // shootstates: 2 versions; ingresses: 2 groups, the first in discovery order; pods only once (the
        // aggregated metrics group does not count); events never; CRDs never; things cannot be updated.
        assert_eq!(
            got,
            [format!("shootstates.v1beta1.core.gardener.cloud/{B}"), format!("ingresses.v1beta1.extensions/{A}")]
        );
    }

    /// A target with canned discovery documents: one group answers 503.
    fn canned_target() -> kube::Client {
        use axum::routing::get;
        use axum::Json;
        let rl = |gv: &str, name: &str, hash: &str| {
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
                {"name": name, "singularName": "", "namespaced": true, "kind": "K", "verbs": ["get", "list", "update"], "storageVersionHash": hash},
                {"name": format!("{name}/status"), "singularName": "", "namespaced": true, "kind": "K", "verbs": ["get", "update"]},
            ]})
        };
        let group = |name: &str, versions: &[&str]| {
            let vs: Vec<Value> =
                versions.iter().map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
            json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
        };
        let apis = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group("good.io", &["v2", "v1"]), group("broken.io", &["v1"])]});
        let (good2, good1) = (rl("good.io/v2", "widgets", A), rl("good.io/v1", "widgets", A));
        let core = rl("v1", "pods", B);
        let router = axum::Router::new()
            .route("/api", get(|| async { Json(json!({"kind": "APIVersions", "versions": ["v1"]})) }))
            .route("/api/v1", get(move || async move { Json(core) }))
            .route("/apis", get(move || async move { Json(apis) }))
            .route("/apis/good.io/v2", get(move || async move { Json(good2) }))
            .route("/apis/good.io/v1", get(move || async move { Json(good1) }))
            .route(
                "/apis/broken.io/v1",
                get(|| async {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                                        "reason": "ServiceUnavailable", "message": "the server is currently unable to handle the request"});
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(status))
                }),
            );
        crate::scheduler::in_process_client(router)
    }

    #[tokio::test]
    async fn discovery_reports_failing_groups_and_keeps_the_rest() {
        let d = discover(&canned_target(), Duration::from_secs(5)).await.expect("discovery");
        let got: Vec<(String, String, Vec<String>, Option<String>)> = d
            .resources
            .iter()
            .map(|r| (r.qualified(), r.version.clone(), r.versions.clone(), r.hash.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("pods".to_string(), "v1".to_string(), vec!["v1".to_string()], Some(B.to_string())),
                (
                    "widgets.good.io".to_string(),
                    "v2".to_string(),
                    vec!["v2".to_string(), "v1".to_string()],
                    Some(A.to_string())
                ),
            ]
        );
        assert_eq!(d.failed.keys().collect::<Vec<_>>(), ["broken.io"]);
        assert!(d.failed["broken.io"].contains("unable to handle"), "{:?}", d.failed);
        // `migrate` names the failed groups when a resource is not found.
        assert!(resolve_resource(&d, "things.broken.io").unwrap_err().contains("discovery failed for: broken.io"));
        // Without the group list there is nothing to work with.
        let router = axum::Router::new();
        let err = discover(&crate::scheduler::in_process_client(router), Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.path, "/apis");
    }

    #[test]
    fn resolve_by_qualified_or_unique_name() {
        let mut d = Discovery::default();
        d.resources.extend(group_resources("", &[("v1".into(), list("v1", vec![api_resource("pods", RW, Some(A))]))]));
        d.resources.extend(group_resources(
            "apps",
            &[("v1".into(), list("apps/v1", vec![api_resource("deployments", RW, Some(B))]))],
        ));
        d.resources.extend(group_resources(
            "metrics.k8s.io",
            &[("v1beta1".into(), list("metrics.k8s.io/v1beta1", vec![api_resource("pods", &["get"], None)]))],
        ));
        assert_eq!(resolve_resource(&d, "deployments.apps").expect("found").version, "v1");
        assert_eq!(resolve_resource(&d, "deployments").expect("found").group, "apps");
        assert_eq!(resolve_resource(&d, "pods").expect("found").group, "");
        assert_eq!(resolve_resource(&d, "pods.metrics.k8s.io").expect("found").group, "metrics.k8s.io");
        assert!(resolve_resource(&d, "widgets").unwrap_err().contains("doesn't have a resource type"));
    }
}

//! The trigger (seed 002): keeps one StorageState per resource of the target that publishes a storageVersionHash,
//! and requests a StorageVersionMigration whenever the objects of a resource may be stored in a version other than
//! the current one. It never migrates anything itself: the migrator runs the StorageVersionMigrations it creates.
//!
//! It has two halves, as seed 002's HA extension describes:
//! - the reporter (every replica): every `--discovery-interval` it reads its own target's legacy discovery and
//!   reports each hash into `status.currentStorageVersionHashes` under its reporterID ([`report`], the rules are in
//!   [`super::report`]): new StorageStates start with persisted ["Unknown"], a new hash is appended to persisted;
//! - the decider (the leader only, [`Decider`]): decides from the reports ([`decide`]) when a periodic round comes,
//!   a StorageState changes or a migration finishes: it starts a migration when the stored objects may be in
//!   another version and the reports agree, cancels unfinished ones when they diverge, sets persisted = [current]
//!   once the latest migration of the current hash Succeeded, and at start-up resets StorageStates whose heartbeat
//!   is older than two intervals to persisted ["Unknown"] (changes may have been missed).
//!
//! With one replica (the embedded store) this is the KEP's original trigger: the change is acted on at the poll
//! that sees it.
//!
//! Starting a migration supersedes any unfinished one of the same resource (Failed, reason `Superseded`) instead of
//! deleting it; finished migrations beyond `--migration-history` per resource are deleted, oldest first.
//!
//! The decisions are pure functions ([`decide`], [`to_supersede`], [`to_prune`], [`migratable_resources`]); the rest
//! is I/O. Requests to the target go through a Kubernetes client (a cluster, or this server in-process); our own
//! objects go through [`MigrationStore`] and [`StateStore`]: the registry inside the server, a remote client in the
//! `migrate` command, memory in the HA walkthrough test.

use super::own::OwnApi;
use super::report::{reported_status, reports, withdrawn_status, Reports};
use super::SchedulerConfig;
use crate::api::storage_state::{GroupResource, StorageState, StorageStateStatus, UNKNOWN_HASH};
use crate::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
};
use crate::error::{qualified, ApiError};
use crate::registry::strategy::Kind;
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
const STATE_WRITE_ATTEMPTS: usize = 10;

// ---------------------------------------------------------------------------------------------------------------
// Reporting (every replica).

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
pub async fn recreate_stale<S: StateStore + ?Sized>(
    store: &S,
    now: Timestamp,
    interval: Duration,
) -> Result<Vec<String>, StoreError> {
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
pub async fn report<S: StateStore + ?Sized>(
    store: &S,
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

async fn report_one<S: StateStore + ?Sized>(
    store: &S,
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
                    Err(e) if e.code == 409 && attempt + 1 < STATE_WRITE_ATTEMPTS => {
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
    Err(StoreError { code: 409, message: format!("storagestate {name}: too many conflicting writes") })
}

/// Removes `reporter`'s elements from every StorageState (a replica that stops gracefully, so that its silence does
/// not hold the leader back for three intervals).
pub async fn withdraw<S: StateStore + ?Sized>(store: &S, reporter: &str) -> Result<usize, StoreError> {
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

// ---------------------------------------------------------------------------------------------------------------
// Decisions about one StorageState (the leader).

/// Who reports into the StorageStates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// This process alone (the embedded store): the KEP's non-HA trigger. A storage version change is acted on at
    /// the poll that sees it.
    One,
    /// Several replicas share the StorageStates (etcd): seed 002's HA extension.
    Several,
}

/// What the leader does about one resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The StorageState status to write (persisted refined after a success), when it changes.
    pub status: Option<StorageStateStatus>,
    /// Request a migration to this hash (it supersedes unfinished migrations of the resource).
    pub start: Option<String>,
    /// Cancel every unfinished migration of the resource (Failed, reason Superseded) with this message: the
    /// replicas disagree.
    pub cancel: Option<String>,
    /// Why nothing was started although the objects may be stored in another version (for logs and tests).
    pub waiting: Option<&'static str>,
}

fn latest_for_hash<'a>(migrations: &'a [StorageVersionMigration], hash: &str) -> Option<&'a StorageVersionMigration> {
    latest(migrations).filter(|m| migration_hash(m) == Some(hash))
}

/// The leader's decision for one resource, from its StorageState (the replicas' reports), its migrations (of this
/// resource), whether the start-up check reset it, and — with several replicas — who reported at the leader's
/// previous periodic round.
///
/// Seed 002 (HA): a migration starts only when persisted has "Unknown" or more than one hash, all reports are
/// fresh (no older than one interval) and agree; unfinished migrations are cancelled once the reports diverge; when
/// the latest migration of the agreed hash Succeeded, persisted = [that hash].
///
/// The KEP asks in addition that the hashes "have been identical in the past two polls", yet its own walkthrough
/// starts the migration in the poll in which agreement first appears (minutes 20 and 40). We follow the
/// walkthrough and keep that rule's stated purpose — "to give newly deployed triggering controllers a chance to
/// report" — as: the set of reporters must be the one the leader saw at its previous periodic round. A new replica
/// (or a new leader, or a new resource) therefore delays the start by one poll; a reporter that merely changes its
/// hash does not. With one replica that set is trivially stable, and the KEP's non-HA rule applies: the change is
/// acted on at once.
///
/// Unchanged from the single-replica trigger: an unfinished migration of the agreed hash is kept (never restarted:
/// a restart resumes it), a Failed one (not superseded) is not relaunched automatically (it waits for `migrate` by
/// hand), and only migrations requested since the StorageState was created count (deleting a StorageState resets
/// it, as the KEP says).
pub fn decide(
    state: &StorageState,
    migrations: &[StorageVersionMigration],
    now: Timestamp,
    interval: Duration,
    reset: bool,
    replicas: Replicas,
    previous_round: Option<&BTreeSet<String>>,
) -> Decision {
    let status = state.status.clone().unwrap_or_default();
    let (hash, fresh, reporters) = match reports(&status, now, interval) {
        Reports::None => return Decision { waiting: Some("no reports"), ..Default::default() },
        Reports::Diverge { hashes } => {
            let cancel = migrations.iter().any(|m| !is_finished(m)).then(|| superseded_by_divergence(&hashes));
            return Decision {
                cancel,
                waiting: Some("the replicas report different storage versions"),
                ..Default::default()
            };
        }
        Reports::Agree { hash, fresh, reporters } => (hash, fresh, reporters),
    };
    // Only migrations requested since the StorageState was created (creationTimestamp has whole seconds).
    let created = state.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    let counted: Vec<StorageVersionMigration> = migrations
        .iter()
        .filter(|m| !is_finished(m) || created.is_none_or(|c| requested_at(m).is_none_or(|r| r.as_second() >= c)))
        .cloned()
        .collect();
    let current = latest_for_hash(&counted, &hash);
    let unfinished = current.is_some_and(|m| !is_finished(m));
    let succeeded = current.is_some_and(|m| m.is_true(CONDITION_SUCCEEDED));
    let failed = current.is_some_and(|m| m.is_true(CONDITION_FAILED) && !is_superseded(m));
    let migrated = status.persisted_storage_version_hashes == [hash.as_str()];
    let mut d = Decision::default();
    if succeeded && !reset {
        if !migrated {
            let mut next = status.clone();
            next.persisted_storage_version_hashes = vec![hash.clone()];
            d.status = Some(next);
        }
        return d;
    }
    if migrated && !reset {
        return d;
    }
    if unfinished {
        d.waiting = Some("its migration is under way");
        return d;
    }
    if failed && !reset {
        d.waiting = Some("its migration failed; request a new one with `migrate`");
        return d;
    }
    let stable = match replicas {
        Replicas::One => true,
        Replicas::Several => previous_round == Some(&reporters),
    };
    if !fresh {
        d.waiting = Some("a report is older than one discovery interval");
    } else if !stable {
        d.waiting = Some("the set of reporters changed since the previous poll");
    } else {
        d.start = Some(hash);
    }
    d
}

/// Whether a StorageState's heartbeat is older than two discovery intervals (or missing): the trigger may have
/// missed storage version changes, so persisted is no longer trustworthy.
pub fn is_stale(state: &StorageState, now: Timestamp, interval: Duration) -> bool {
    let Some(hb) = state.status.as_ref().and_then(|s| s.last_heartbeat_time.as_ref()) else { return true };
    let age_ms = now.as_millisecond().saturating_sub(hb.0.as_millisecond());
    age_ms > 2 * i64::try_from(interval.as_millis()).unwrap_or(i64::MAX / 4)
}

/// What the leader did about one resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The migration requested, if any.
    pub started: Option<String>,
    /// Migrations superseded (by the new one, or cancelled because the reports diverged).
    pub superseded: Vec<String>,
    /// persisted as written, when the leader wrote it.
    pub persisted: Option<Vec<String>>,
    pub waiting: Option<&'static str>,
}

/// The leader's side of the trigger: applies [`decide`] to StorageStates, through any store (the registry in the
/// server; memory in the walkthrough test), at the times it is given.
pub struct Decider<S: ?Sized> {
    store: std::sync::Arc<S>,
    interval: Duration,
    history: usize,
    replicas: Replicas,
    served: Served,
    /// StorageStates reset at start-up that still need their migration.
    reset_pending: HashSet<String>,
    /// Who reported, per StorageState, at the previous periodic round.
    previous_round: HashMap<String, BTreeSet<String>>,
}

impl<S: MigrationStore + StateStore + ?Sized> Decider<S> {
    pub fn new(store: std::sync::Arc<S>, config: &SchedulerConfig, served: Served) -> Self {
        Decider {
            store,
            interval: config.discovery_interval,
            history: config.migration_history.max(1),
            replicas: config.replicas,
            served,
            reset_pending: HashSet::new(),
            previous_round: HashMap::new(),
        }
    }

    /// Start-up of a leader: StorageStates whose heartbeat is older than two intervals get persisted = ["Unknown"].
    pub async fn reset_stale(&mut self, now: Timestamp) -> Result<Vec<String>, StoreError> {
        let mut reset = Vec::new();
        for mut s in self.store.list_states().await? {
            if !is_stale(&s, now, self.interval) {
                continue;
            }
            let name = s.metadata.name.clone().unwrap_or_default();
            for attempt in 0..5 {
                let mut status = s.status.clone().unwrap_or_default();
                status.persisted_storage_version_hashes = vec![UNKNOWN_HASH.to_string()];
                let mut next = s.clone();
                next.status = Some(status);
                match self.store.update_state_status(&next).await {
                    Ok(_) => {
                        tracing::info!(storagestate = %name, heartbeat = ?s.status.as_ref().and_then(|st| st.last_heartbeat_time.as_ref()).map(|t| t.0.to_string()),
                            "trigger: heartbeat older than two discovery intervals, persisted storage versions reset to Unknown");
                        self.reset_pending.insert(name.clone());
                        reset.push(name);
                        break;
                    }
                    Err(e) if e.is_conflict() && attempt < 4 => match self.store.get_state(&name).await? {
                        Some(fresh) => s = fresh,
                        None => break,
                    },
                    Err(e) => {
                        tracing::warn!(storagestate = %name, error = %e, "trigger: resetting a stale storagestate");
                        break;
                    }
                }
            }
        }
        Ok(reset)
    }

    /// A periodic round (every discovery interval): every StorageState is decided, then who reported is
    /// remembered for the next round. Returns the outcome per StorageState.
    pub async fn round(&mut self, now: Timestamp) -> Result<BTreeMap<String, Outcome>, StoreError> {
        let states = self.store.list_states().await?;
        let all = self.store.list_migrations().await?;
        let mut out = BTreeMap::new();
        for s in states {
            let name = s.metadata.name.clone().unwrap_or_default();
            let reporters: BTreeSet<String> = s
                .status
                .iter()
                .flat_map(|st| st.current_storage_version_hashes.iter().map(|r| r.reporter_id.clone()))
                .collect();
            let r = &s.spec.resource;
            let mine = of_resource(&all, &r.group, &r.resource);
            match self.apply(s, mine, now).await {
                Ok(o) => drop(out.insert(name.clone(), o)),
                Err(e) => {
                    tracing::warn!(storagestate = %name, error = %e, "trigger: deciding about a resource failed; retrying")
                }
            }
            self.previous_round.insert(name, reporters);
        }
        Ok(out)
    }

    /// A decision about one StorageState outside the periodic rounds (it changed, or a migration finished).
    pub async fn resource(&mut self, name: &str, now: Timestamp) -> Result<Outcome, StoreError> {
        let Some(s) = self.store.get_state(name).await? else { return Ok(Outcome::default()) };
        let r = s.spec.resource.clone();
        let mine = of_resource(&self.store.list_migrations().await?, &r.group, &r.resource);
        self.apply(s, mine, now).await
    }

    async fn apply(
        &mut self,
        mut state: StorageState,
        mut migrations: Vec<StorageVersionMigration>,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let name = state.metadata.name.clone().unwrap_or_default();
        let gr = state.spec.resource.clone();
        let mut out = Outcome::default();
        for attempt in 0..STATE_WRITE_ATTEMPTS {
            let reset = self.reset_pending.contains(&name);
            let d =
                decide(&state, &migrations, now, self.interval, reset, self.replicas, self.previous_round.get(&name));
            out.waiting = d.waiting;
            if let Some(message) = &d.cancel {
                for m in migrations.iter().filter(|m| !is_finished(m)) {
                    if supersede(&*self.store, m, message, now).await?.is_some() {
                        tracing::info!(resource = %name, migration = %name_of(m), "trigger: the replicas disagree on the storage version, migration cancelled");
                        out.superseded.push(name_of(m).to_string());
                    }
                }
            }
            if let Some(hash) = &d.start {
                let gvr = self.served.read().unwrap_or_else(|e| e.into_inner()).get(&name).cloned();
                match gvr {
                    Some(gvr) => {
                        let (created, superseded) =
                            start_migration(&*self.store, &gvr, Some(hash), &migrations, now).await?;
                        tracing::info!(resource = %name, hash = %hash, reset, migration = %name_of(&created),
                            superseded = ?superseded, "trigger: storage version migration requested");
                        out.started = Some(name_of(&created).to_string());
                        out.superseded.extend(superseded);
                        self.reset_pending.remove(&name);
                    }
                    None => {
                        out.waiting = Some("the local target does not serve the resource");
                        tracing::warn!(resource = %name, "trigger: a migration is due but this replica's target does not serve the resource");
                    }
                }
            } else if d.cancel.is_none() {
                // At most one migration of a resource runs: the latest requested.
                if let Some(keep) = latest(&migrations).map(|m| name_of(m).to_string()) {
                    let message = superseded_by(&keep);
                    for m in to_supersede(&migrations, &keep) {
                        if supersede(&*self.store, m, &message, now).await?.is_some() {
                            out.superseded.push(name_of(m).to_string());
                        }
                    }
                }
            }
            if out.started.is_some() || !out.superseded.is_empty() {
                migrations = of_resource(&self.store.list_migrations().await?, &gr.group, &gr.resource);
            }
            let deleted = prune_history(&*self.store, &migrations, self.history).await?;
            if !deleted.is_empty() {
                tracing::info!(resource = %name, deleted = ?deleted, keep = self.history,
                    "trigger: finished migrations beyond the history limit deleted");
            }
            let Some(status) = d.status else { return Ok(out) };
            let mut next = state.clone();
            next.status = Some(status.clone());
            match self.store.update_state_status(&next).await {
                Ok(_) => {
                    tracing::info!(storagestate = %name, persisted = ?status.persisted_storage_version_hashes,
                        "trigger: migration succeeded; objects are stored in the current storage version");
                    out.persisted = Some(status.persisted_storage_version_hashes);
                    return Ok(out);
                }
                Err(e) if e.is_conflict() && attempt + 1 < STATE_WRITE_ATTEMPTS => {
                    let Some(fresh) = self.store.get_state(&name).await? else { return Ok(out) };
                    state = fresh;
                    migrations = of_resource(&self.store.list_migrations().await?, &gr.group, &gr.resource);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The controllers: the reporter (every replica) and the decider (the leader).

/// Starts the reporter: every `--discovery-interval` it reads the target's discovery and reports the hashes.
/// Returns the task and the versions it found (for the decider).
pub fn spawn_reporter(
    config: SchedulerConfig,
    target: kube::Client,
    own: OwnApi,
) -> (tokio::task::JoinHandle<()>, Local) {
    let local = Local::default();
    let s = local.served.clone();
    let mut checked = local.startup_checked.subscribe();
    let task = tokio::spawn(async move {
        if config.replicas == Replicas::Several {
            if let Err(e) = recreate_stale(&own, Timestamp::now(), config.discovery_interval).await {
                tracing::warn!(error = %e, "trigger: the start-up check of storagestates failed");
            }
        } else {
            // One replica: the decider's start-up check comes first.
            let _ = checked.wait_for(|c| *c).await;
        }
        loop {
            let complete = match discover(&target, config.request_timeout).await {
                Ok(d) => {
                    for (group, error) in &d.failed {
                        tracing::warn!(group = %group, error = %error, "trigger: discovery of a group failed; its storagestates are left as they are");
                    }
                    {
                        let mut map = s.write().unwrap_or_else(|e| e.into_inner());
                        for r in &d.resources {
                            map.insert(r.qualified(), r.gvr());
                        }
                    }
                    report(&own, &config.identity, &d, Timestamp::now(), config.discovery_interval, config.replicas)
                        .await;
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "trigger: discovery failed; nothing reported, retrying");
                    false
                }
            };
            // A target that cannot be read at all is retried sooner than a full interval.
            let interval = config.discovery_interval;
            tokio::time::sleep(if complete { interval } else { interval.min(Duration::from_secs(30)) }).await;
        }
    });
    (task, local)
}

/// Starts the decider (leader only).
pub fn spawn(config: SchedulerConfig, own: OwnApi, local: Local) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let decider = Decider::new(std::sync::Arc::new(own.clone()), &config, local.served.clone());
        run_decider(decider, own, config.discovery_interval, local).await
    })
}

/// The decider's events: a periodic round every interval, and single decisions when a StorageState changes (a
/// replica reported) or a migration finishes.
async fn run_decider(mut decider: Decider<OwnApi>, own: OwnApi, interval: Duration, local: Local) {
    // With several replicas every reporter checks at its own start ([`recreate_stale`]).
    if decider.replicas == Replicas::One {
        if let Err(e) = decider.reset_stale(Timestamp::now()).await {
            tracing::warn!(error = %e, "trigger: listing storagestates for the start-up check");
        }
    }
    local.startup_checked.send_replace(true);
    let mut states = watch_kind::<StorageState>(&own).await;
    let mut migrations = watch_kind::<StorageVersionMigration>(&own).await;
    let mut next_round = tokio::time::Instant::now();
    loop {
        let mut changed: BTreeSet<String> = BTreeSet::new();
        let mut lost = false;
        tokio::select! {
            _ = tokio::time::sleep_until(next_round) => {
                if let Err(e) = decider.round(Timestamp::now()).await {
                    tracing::warn!(error = %e, "trigger: reading storagestates and storageversionmigrations");
                }
                next_round = tokio::time::Instant::now() + interval;
                continue;
            }
            ev = recv(&mut states) => collect(ev, &mut changed, &mut lost, state_changed),
            ev = recv(&mut migrations) => collect(ev, &mut changed, &mut lost, migration_finished),
        }
        if let Some(rx) = states.as_mut() {
            while let Ok(ev) = rx.try_recv() {
                collect(Some(ev), &mut changed, &mut lost, state_changed);
            }
        }
        if let Some(rx) = migrations.as_mut() {
            while let Ok(ev) = rx.try_recv() {
                collect(Some(ev), &mut changed, &mut lost, migration_finished);
            }
        }
        if lost {
            // Events may have been missed: watch again and decide everything.
            tokio::time::sleep(Duration::from_millis(200)).await;
            states = watch_kind::<StorageState>(&own).await;
            migrations = watch_kind::<StorageVersionMigration>(&own).await;
            next_round = tokio::time::Instant::now();
            continue;
        }
        for name in changed {
            if let Err(e) = decider.resource(&name, Timestamp::now()).await {
                tracing::warn!(storagestate = %name, error = %e, "trigger: deciding about a resource failed; retrying next period");
            }
        }
    }
}

async fn watch_kind<K: Kind>(own: &OwnApi) -> Option<mpsc::Receiver<WatchOut>> {
    let info = K::info();
    let resource = own.registry().resource(info.group, info.versions[0], info.plural)?;
    let params = WatchParams { send_initial_events: Some(false), ..Default::default() };
    match resource.watch(None, info.versions[0], params).await {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!(error = %e.message, resource = info.plural, "trigger: watching");
            None
        }
    }
}

async fn recv(watch: &mut Option<mpsc::Receiver<WatchOut>>) -> Option<WatchOut> {
    match watch {
        Some(rx) => rx.recv().await,
        // No watch (it could not be opened): fall back to a short wait, then a full round.
        None => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        }
    }
}

/// The StorageState a watch event concerns, if it calls for a decision.
type Interest = fn(&Value) -> Option<String>;

/// A StorageState changed: its name (DELETED ones need nothing).
fn state_changed(object: &Value) -> Option<String> {
    object["metadata"]["name"].as_str().map(str::to_string)
}

/// A migration finished: the StorageState of its resource.
fn migration_finished(object: &Value) -> Option<String> {
    let m = serde_json::from_value::<StorageVersionMigration>(object.clone()).ok()?;
    is_finished(&m).then(|| qualified(&m.spec.resource.resource, &m.spec.resource.group))
}

fn collect(ev: Option<WatchOut>, changed: &mut BTreeSet<String>, lost: &mut bool, interest: Interest) {
    match ev {
        Some(WatchOut::Event { kind, object }) if kind != "DELETED" => {
            if let Some(name) = interest(&object) {
                changed.insert(name);
            }
        }
        Some(WatchOut::Event { .. }) | Some(WatchOut::Bookmark { .. }) => {}
        Some(WatchOut::Error(_)) | None => *lost = true,
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
        let (m, superseded) = start_migration(store, &r.gvr(), r.hash.as_deref(), &existing, Timestamp::now()).await?;
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

    const I: Duration = Duration::from_secs(600);

    /// A StorageState (created at ts(0)) with one report per (reporter, hash, heartbeat).
    fn reported(persisted: &[&str], reports: &[(&str, &str, i64)]) -> StorageState {
        let mut s = state(reports.first().map(|r| r.1).unwrap_or(A), persisted, 100);
        s.metadata.creation_timestamp = Some(Time(ts(0)));
        s.status.as_mut().expect("status").current_storage_version_hashes = reports
            .iter()
            .map(|(id, h, hb)| crate::api::storage_state::ReportedStorageVersionHash {
                reporter_id: id.to_string(),
                current_storage_version_hash: h.to_string(),
                last_heartbeat_time: Some(Time(ts(*hb))),
            })
            .collect();
        s
    }

    /// The single-replica decision at ts(100) about a state whose one reporter sees `hash`.
    fn one(persisted: &[&str], hash: &str, ms: &[StorageVersionMigration], reset: bool) -> Decision {
        decide(&reported(persisted, &[("r", hash, 100)]), ms, ts(100), I, reset, Replicas::One, None)
    }

    #[test]
    fn new_resource_is_migrated_at_the_first_poll() {
        // The reporter's first report: persisted Unknown, current = hash.
        let status = reported_status(None, "r", A, ts(100), I, false);
        let mut st = reported(&[], &[]);
        st.status = Some(status);
        let d = decide(&st, &[], ts(100), I, false, Replicas::One, None);
        assert_eq!(d.start.as_deref(), Some(A));
        assert!(d.status.is_none() && d.cancel.is_none());
    }

    #[test]
    fn an_unfinished_migration_of_the_hash_is_kept() {
        let d = one(&[UNKNOWN_HASH], A, &[svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")))], false);
        assert_eq!(d.start, None);
        assert_eq!(d.waiting, Some("its migration is under way"));
        assert!(one(&[UNKNOWN_HASH], A, &[svm("m1", A, 1, None)], false).start.is_none());
    }

    #[test]
    fn successes_before_the_storagestate_was_created_do_not_count() {
        // Deleting a StorageState resets it (the KEP's way): an old success does not make the new one migrated.
        let mut st = reported(&[UNKNOWN_HASH], &[("r", A, 100)]);
        st.metadata.creation_timestamp = Some(Time(ts(50)));
        let d = decide(
            &st,
            &[svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))],
            ts(100),
            I,
            false,
            Replicas::One,
            None,
        );
        assert_eq!(d.start.as_deref(), Some(A));
    }

    #[test]
    fn migrated_means_nothing_to_do() {
        let done = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        assert_eq!(one(&[A], A, &done, false), Decision::default());
        // No migration at all (history pruned to nothing, or never needed): still nothing to do.
        assert_eq!(one(&[A], A, &[], false), Decision::default());
    }

    #[test]
    fn without_a_migration_one_is_requested() {
        // The StorageState was written but its migration never was (a crash in between), or was deleted.
        assert_eq!(one(&[UNKNOWN_HASH], A, &[], false).start.as_deref(), Some(A));
        // The latest migration is for another hash (a downgrade back to A after a migration to B).
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
        assert_eq!(one(&[A, B], A, &ms, false).start.as_deref(), Some(A));
    }

    #[test]
    fn a_success_sets_persisted_to_the_agreed_hash_only_for_the_latest_migration() {
        let done = [svm("m1", B, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        let d = one(&[A, B], B, &done, false);
        assert_eq!(d.status.expect("update").persisted_storage_version_hashes, [B]);
        assert_eq!(d.start, None);
        // Missed while the trigger was down: applied.
        assert_eq!(one(&[UNKNOWN_HASH], B, &done, false).status.expect("update").persisted_storage_version_hashes, [B]);
        // A migration of an older hash succeeded (it finished before it could be superseded): migrate again.
        let d = one(&[A, B], A, &done, false);
        assert!(d.status.is_none());
        assert_eq!(d.start.as_deref(), Some(A));
        // A -> B -> A: the old success of A is not the latest migration; the one of B is unfinished.
        let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
        assert!(one(&[A, B], A, &ms, false).status.is_none());
        // Several replicas: only when they all agree.
        let split = reported(&[A, B], &[("r1", B, 100), ("r2", A, 100)]);
        let d = decide(&split, &done, ts(100), I, false, Replicas::Several, None);
        assert!(d.status.is_none() && d.start.is_none());
    }

    #[test]
    fn failed_migration_is_not_relaunched_but_a_superseded_one_is() {
        let failed = [svm("m1", A, 1, Some((CONDITION_FAILED, "Forbidden")))];
        let d = one(&[UNKNOWN_HASH], A, &failed, false);
        assert_eq!(d.start, None);
        assert!(d.waiting.expect("why").contains("failed"));
        // Superseded, and its successor is gone: it did not fail, it was replaced.
        let superseded = [svm("m1", A, 1, Some((CONDITION_FAILED, REASON_SUPERSEDED)))];
        assert_eq!(one(&[UNKNOWN_HASH], A, &superseded, false).start.as_deref(), Some(A));
    }

    #[test]
    fn changed_hash_requests_a_migration_unless_requested_already() {
        let done_a = svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")));
        assert_eq!(one(&[A, B], B, std::slice::from_ref(&done_a), false).start.as_deref(), Some(B));
        // `migrate` (or a previous run) requested the migration to B before the trigger saw B.
        assert_eq!(one(&[A, B], B, &[done_a.clone(), svm("m2", B, 2, None)], false).start, None);
        // ... and it already succeeded.
        let d = one(&[A, B], B, &[svm("m2", B, 2, Some((CONDITION_SUCCEEDED, "Done")))], false);
        assert_eq!((d.start, d.status.expect("update").persisted_storage_version_hashes), (None, vec![B.to_string()]));
    }

    #[test]
    fn reset_requests_a_migration_even_after_a_success() {
        let done = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
        let d = one(&[UNKNOWN_HASH], A, &done, true);
        assert_eq!(d.start.as_deref(), Some(A));
        assert!(d.status.is_none(), "persisted stays Unknown until the new migration succeeds");
        // An unfinished migration of the current hash is resumed, not restarted.
        assert!(one(&[UNKNOWN_HASH], A, &[svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")))], true)
            .start
            .is_none());
    }

    #[test]
    fn several_replicas_start_only_on_fresh_agreement_of_a_known_set_of_reporters() {
        let st = reported(&[A, B], &[("r1", B, 100), ("r2", B, 95)]);
        let set: BTreeSet<String> = ["r1".to_string(), "r2".to_string()].into();
        let at =
            |now: i64, prev: Option<&BTreeSet<String>>| decide(&st, &[], ts(now), I, false, Replicas::Several, prev);
        assert_eq!(at(100, Some(&set)).start.as_deref(), Some(B));
        // First round of this leader, or a new reporter: one more poll.
        assert_eq!(at(100, None).waiting, Some("the set of reporters changed since the previous poll"));
        let other: BTreeSet<String> = ["r1".to_string()].into();
        assert!(at(100, Some(&other)).start.is_none());
        // r2's report is older than one interval.
        assert_eq!(at(95 + 601, Some(&set)).waiting, Some("a report is older than one discovery interval"));
        // Diverging reports cancel unfinished migrations, never start one.
        let split = reported(&[A, B], &[("r1", B, 100), ("r2", A, 100)]);
        let running = [svm("m1", B, 1, Some((CONDITION_RUNNING, "Running")))];
        let d = decide(&split, &running, ts(100), I, false, Replicas::Several, Some(&set));
        assert!(d.start.is_none());
        assert!(d.cancel.expect("cancel").contains(&format!("({A}, {B})")));
        assert!(decide(&split, &[], ts(100), I, false, Replicas::Several, Some(&set)).cancel.is_none());
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
        let st = superseded_status(&running, &superseded_by("m2"), ts(5)).expect("status");
        let by_type = |t: &str| st.conditions.iter().find(|c| c.type_ == t).cloned().expect("condition");
        assert_eq!(by_type(CONDITION_FAILED).status, "True");
        assert_eq!(by_type(CONDITION_FAILED).reason.as_deref(), Some(REASON_SUPERSEDED));
        assert!(by_type(CONDITION_FAILED).message.expect("message").contains("m2"));
        assert_eq!(by_type(CONDITION_RUNNING).status, "False");
        // Valid per the API's own rules.
        let mut m = running.clone();
        m.status = Some(st);
        assert!(
            crate::registry::strategy::Kind::validate(&m).is_empty(),
            "{:?}",
            crate::registry::strategy::Kind::validate(&m)
        );
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

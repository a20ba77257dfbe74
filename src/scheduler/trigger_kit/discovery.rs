//! Discovery of the target: its resources, preferred versions and storage version hashes.

use super::*;
use crate::api::storage_version_migration::GroupVersionResource;
use crate::error::qualified;
use axum::http::{header, Method, Request};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroup, APIGroupList, APIResourceList, APIVersions};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
pub(super) async fn get_json<T: DeserializeOwned>(
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
        Ok(Err(e)) if crate::client::api_reason(&e) == Some(crate::error::StatusReason::NotFound) => Ok(None),
        Ok(Err(kube::Error::Api(s))) => Err(err(format!("{} ({})", s.message, s.code))),
        Ok(Err(e)) => Err(err(e.to_string())),
    }
}

/// Where discovery documents come from: the target through a client with a timeout ([`Timed`], the triggers and
/// `migrate`), or the migrator's rate-limited and retried requests, whose errors say whether to retry later.
pub trait DocumentSource: Sync {
    type Error;
    /// GET of the JSON document at `path`; None on 404.
    fn get_json<T: DeserializeOwned + Send>(
        &self,
        path: &str,
    ) -> impl std::future::Future<Output = Result<Option<T>, Self::Error>> + Send;
}

/// The target through `client`, each request bounded by `timeout`.
pub struct Timed<'a> {
    pub client: &'a kube::Client,
    pub timeout: Duration,
}

impl DocumentSource for Timed<'_> {
    type Error = DiscoveryError;
    async fn get_json<T: DeserializeOwned + Send>(&self, path: &str) -> Result<Option<T>, DiscoveryError> {
        get_json(self.client, path, self.timeout).await
    }
}

/// A group's versions, preferred first (the core group's from `/api`); empty when the group is not served.
pub async fn group_versions<S: DocumentSource>(source: &S, group: &str) -> Result<Vec<String>, S::Error> {
    if group.is_empty() {
        let core: Option<APIVersions> = source.get_json("/api").await?;
        return Ok(core.map(|v| v.versions).unwrap_or_default());
    }
    let group: Option<APIGroup> = source.get_json(&format!("/apis/{group}")).await?;
    let (preferred, listed) = group.map(|g| (g.preferred_version.map(|p| p.version), g.versions)).unwrap_or_default();
    let others = listed.into_iter().map(|v| v.version).filter(|v| Some(v) != preferred.as_ref());
    Ok(preferred.clone().into_iter().chain(others).collect())
}

/// One resource of the target, as a migration resolves it (kube-controller-manager's RESTMapper): at the group's
/// preferred version when it serves the resource, else the first listed version that does. The versions are read
/// in that order until one lists the resource. None when no version does.
pub async fn discover_resource<S: DocumentSource>(
    source: &S,
    group: &str,
    resource: &str,
) -> Result<Option<DiscoveredResource>, S::Error> {
    for version in group_versions(source, group).await? {
        let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
        let Some(list) = source.get_json::<APIResourceList>(&path).await? else { continue };
        if let Some(found) = group_resources(group, &[(version, list)]).into_iter().find(|r| r.resource == resource) {
            return Ok(Some(found));
        }
    }
    Ok(None)
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
pub(super) async fn read_group(
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

/// A resource name that discovery does not resolve to one resource (kubectl's words).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// `failed`: the groups whose discovery failed, which may have served it.
    #[error("the server doesn't have a resource type \"{name}\"{}", failed_groups(.failed))]
    NotFound { name: String, failed: Vec<String> },
    #[error("\"{name}\" is ambiguous, use one of: {}", .candidates.join(", "))]
    Ambiguous { name: String, candidates: Vec<String> },
}

fn failed_groups(groups: &[String]) -> String {
    match groups.is_empty() {
        true => String::new(),
        false => format!(" (discovery failed for: {})", groups.join(", ")),
    }
}

/// Finds `<resource>.<group>` (or `<resource>` for the core group) in discovery; a bare resource name that no core
/// resource has matches when exactly one group serves it (as kubectl resolves `deployments`).
pub fn resolve_resource<'a>(discovery: &'a Discovery, name: &str) -> Result<&'a DiscoveredResource, ResolveError> {
    if let Some(r) = discovery.resources.iter().find(|r| r.qualified() == name) {
        return Ok(r);
    }
    let candidates: Vec<&DiscoveredResource> = discovery.resources.iter().filter(|r| r.resource == name).collect();
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => Err(ResolveError::NotFound {
            name: name.to_string(),
            failed: discovery
                .failed
                .keys()
                .map(|g| if g.is_empty() { "core" } else { g.as_str() }.to_string())
                .collect(),
        }),
        many => Err(ResolveError::Ambiguous {
            name: name.to_string(),
            candidates: many.iter().map(|r| r.qualified()).collect(),
        }),
    }
}

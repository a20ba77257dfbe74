//! Discovery documents: legacy (APIGroupList, APIGroup, APIResourceList with storageVersionHash) and aggregated
//! (apidiscovery.k8s.io v2 and v2beta1, negotiated by Accept, with ETag). Built once at start-up.

use crate::api::storage_version_hash;
use crate::registry::strategy::group_priority_minimum;
use crate::registry::strategy::{Strategy, Subresource};
use crate::server::negotiate::parse_accept;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery, ListMeta, ObjectMeta,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];
/// A create-only virtual resource (like TokenReview) is only created.
const CREATE_ONLY_VERBS: [&str; 1] = ["create"];

/// The storage version's hash, of the stored kind for a kind stored as another (events.k8s.io Events: core/v1
/// Event's, as kube-apiserver's discovery gives for both).
fn stored_version_hash(k: &dyn Strategy) -> String {
    let stored = k.stored_info();
    let version = if std::ptr::eq(stored, k.info()) { k.storage_version() } else { stored.versions[0] };
    storage_version_hash(stored.group, version, stored.kind)
}

/// The verbs discovery lists for a kind's resource (and the aggregated roles grant from).
pub fn verbs(info: &crate::registry::strategy::KindInfo) -> &'static [&'static str] {
    if info.create_only {
        &CREATE_ONLY_VERBS
    } else {
        &VERBS
    }
}

/// A prepared response body and its ETag.
pub struct Doc {
    pub body: bytes::Bytes,
    pub etag: String,
}

impl Doc {
    fn new(v: &impl Serialize) -> Doc {
        let body = serde_json::to_vec(v).unwrap_or_default();
        let etag = format!("\"{:X}\"", Sha256::digest(&body));
        Doc { body: body.into(), etag }
    }
}

pub struct Discovery {
    /// `/apis`: every group but the core group.
    pub group_list: Doc,
    pub groups: BTreeMap<String, Doc>,
    /// `/apis/<g>/<v>`, and `/api/<v>` under the group "".
    pub resource_lists: BTreeMap<(String, String), Doc>,
    /// Aggregated discovery for /apis, by version ("v2", "v2beta1").
    pub aggregated: BTreeMap<&'static str, Doc>,
    /// Aggregated discovery for /api, by version: the core group when served (standalone), else an empty list.
    pub aggregated_legacy: BTreeMap<&'static str, Doc>,
    /// `/api`: the core group's versions, none unless served.
    pub api_versions: Doc,
}

/// What an Accept header asks of /api and /apis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryFormat {
    /// APIVersions / APIGroupList.
    Legacy,
    /// apidiscovery.k8s.io at this version ("v2" or "v2beta1").
    Aggregated(&'static str),
    /// Only aggregated versions this server does not serve: 406.
    Unsupported,
}

pub fn aggregated_version(accept: Option<&str>) -> DiscoveryFormat {
    let Some(accept) = accept else { return DiscoveryFormat::Legacy };
    let mut asked_aggregated = false;
    for m in parse_accept(accept) {
        if m.param("g") == Some("apidiscovery.k8s.io") && m.param("as") == Some("APIGroupDiscoveryList") {
            asked_aggregated = true;
            match m.param("v") {
                Some("v2") => return DiscoveryFormat::Aggregated("v2"),
                Some("v2beta1") => return DiscoveryFormat::Aggregated("v2beta1"),
                _ => continue,
            }
        }
        if matches!(m.essence, "application/json" | "*/*" | "application/*") && m.param("as").is_none() {
            return DiscoveryFormat::Legacy;
        }
    }
    if asked_aggregated {
        DiscoveryFormat::Unsupported
    } else {
        DiscoveryFormat::Legacy
    }
}

fn group_versions(kinds: &[Arc<dyn Strategy>]) -> BTreeMap<&'static str, Vec<&'static str>> {
    let mut out: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
    for k in kinds {
        let i = k.info();
        let vs = out.entry(i.group).or_default();
        for v in i.versions {
            if !vs.contains(v) {
                vs.push(v);
            }
        }
    }
    out
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn api_group(group: &str, versions: &[&str]) -> APIGroup {
    let gvs: Vec<GroupVersionForDiscovery> = versions
        .iter()
        .map(|v| GroupVersionForDiscovery { group_version: format!("{group}/{v}"), version: v.to_string() })
        .collect();
    APIGroup {
        name: group.to_string(),
        preferred_version: gvs.first().cloned(),
        versions: gvs,
        server_address_by_client_cidrs: None,
    }
}

/// The kinds of `kinds` served in `group`/`version`, by resource name: k8s.io/apiserver installs (and so lists)
/// a group version's resources in the sorted order of their paths.
fn served_in<'a>(kinds: &'a [Arc<dyn Strategy>], group: &str, version: &str) -> Vec<&'a Arc<dyn Strategy>> {
    let mut served: Vec<_> =
        kinds.iter().filter(|k| k.info().group == group && k.info().versions.contains(&version)).collect();
    served.sort_by_key(|k| k.info().plural);
    served
}

/// The APIResourceList of one group version: each kind, and its status subresource.
fn resource_list(kinds: &[Arc<dyn Strategy>], group: &str, version: &str) -> APIResourceList {
    let mut resources = Vec::new();
    for k in served_in(kinds, group, version) {
        let i = k.info();
        resources.push(APIResource {
            name: i.plural.to_string(),
            singular_name: i.singular.to_string(),
            namespaced: i.namespaced,
            kind: i.kind.to_string(),
            verbs: strings(verbs(i)),
            short_names: Some(strings(i.short_names)),
            categories: Some(strings(i.categories)),
            // Only what is stored has a storage version.
            storage_version_hash: (!i.create_only).then(|| stored_version_hash(k.as_ref())),
            ..Default::default()
        });
        if k.serves(Subresource::Status) {
            resources.push(APIResource {
                name: format!("{}/status", i.plural),
                namespaced: i.namespaced,
                kind: i.kind.to_string(),
                verbs: strings(&STATUS_VERBS),
                ..Default::default()
            });
        }
    }
    let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    APIResourceList { group_version, resources }
}

// apidiscovery.k8s.io (v2, and v2beta1 of the same shape), which k8s-openapi does not carry.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupDiscoveryList {
    kind: &'static str,
    api_version: String,
    metadata: ListMeta,
    items: Vec<GroupDiscovery>,
}

#[derive(Serialize)]
struct GroupDiscovery {
    metadata: ObjectMeta,
    versions: Vec<VersionDiscovery>,
}

#[derive(Serialize)]
struct VersionDiscovery {
    version: String,
    resources: Vec<ResourceDiscovery>,
    freshness: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceDiscovery {
    resource: String,
    response_kind: GroupVersionKind,
    scope: &'static str,
    singular_resource: String,
    verbs: Vec<String>,
    short_names: Vec<String>,
    categories: Vec<String>,
    subresources: Vec<SubresourceDiscovery>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SubresourceDiscovery {
    subresource: &'static str,
    response_kind: GroupVersionKind,
    verbs: Vec<String>,
}

fn version_discovery(kinds: &[Arc<dyn Strategy>], group: &str, version: &str) -> VersionDiscovery {
    let resources = served_in(kinds, group, version)
        .into_iter()
        .map(|k| {
            let i = k.info();
            let kind = GroupVersionKind { group: group.into(), version: version.into(), kind: i.kind.into() };
            let status = SubresourceDiscovery {
                subresource: "status",
                response_kind: kind.clone(),
                verbs: strings(&STATUS_VERBS),
            };
            ResourceDiscovery {
                resource: i.plural.to_string(),
                response_kind: kind,
                scope: if i.namespaced { "Namespaced" } else { "Cluster" },
                singular_resource: i.singular.to_string(),
                verbs: strings(verbs(i)),
                short_names: strings(i.short_names),
                categories: strings(i.categories),
                subresources: k.serves(Subresource::Status).then_some(status).into_iter().collect(),
            }
        })
        .collect();
    VersionDiscovery { version: version.to_string(), resources, freshness: "Current" }
}

fn discovery_list(version: &str, items: Vec<GroupDiscovery>) -> Doc {
    let list = GroupDiscoveryList {
        kind: "APIGroupDiscoveryList",
        api_version: format!("apidiscovery.k8s.io/{version}"),
        metadata: ListMeta::default(),
        items,
    };
    Doc::new(&list)
}

impl Discovery {
    pub fn build(kinds: &[Arc<dyn Strategy>]) -> Discovery {
        let mut gv = group_versions(kinds);
        // The core group is discovered under /api, never listed in /apis.
        let core = gv.remove("").unwrap_or_default();
        // Groups in the aggregator's order (groupPriorityMinimum of our APIServices, highest first, then by name),
        // so that a bare resource name means the same group standalone as through a cluster's aggregator.
        let mut gv: Vec<_> = gv.into_iter().collect();
        gv.sort_by_key(|(g, _)| (std::cmp::Reverse(group_priority_minimum(kinds, g)), *g));
        let group_list = Doc::new(&APIGroupList { groups: gv.iter().map(|(g, vs)| api_group(g, vs)).collect() });
        let mut groups = BTreeMap::new();
        let mut resource_lists = BTreeMap::new();
        for (g, vs) in &gv {
            groups.insert(g.to_string(), Doc::new(&api_group(g, vs)));
        }
        for (g, vs) in gv.iter().chain((!core.is_empty()).then_some(&("", core.clone()))) {
            for v in vs {
                resource_lists.insert((g.to_string(), v.to_string()), Doc::new(&resource_list(kinds, g, v)));
            }
        }
        let mut aggregated = BTreeMap::new();
        let mut aggregated_legacy = BTreeMap::new();
        for dv in ["v2", "v2beta1"] {
            let items = gv
                .iter()
                .map(|(g, vs)| GroupDiscovery {
                    metadata: ObjectMeta { name: Some(g.to_string()), ..Default::default() },
                    versions: vs.iter().map(|v| version_discovery(kinds, g, v)).collect(),
                })
                .collect();
            aggregated.insert(dv, discovery_list(dv, items));
            // As kube-apiserver's /api: one nameless group.
            let legacy = (!core.is_empty()).then(|| GroupDiscovery {
                metadata: ObjectMeta::default(),
                versions: core.iter().map(|v| version_discovery(kinds, "", v)).collect(),
            });
            aggregated_legacy.insert(dv, discovery_list(dv, legacy.into_iter().collect()));
        }
        let api_versions = Doc::new(&APIVersions {
            versions: strings(&core),
            // Clients reach us at the address they used; there is no other to advertise.
            server_address_by_client_cidrs: Vec::new(),
        });
        Discovery { group_list, groups, resource_lists, aggregated, aggregated_legacy, api_versions }
    }
}

#[derive(Clone, Serialize)]
struct GroupVersionKind {
    group: String,
    version: String,
    kind: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The core group (namespaces, standalone) is discovered under /api as kube-apiserver's is, never in /apis.
    #[test]
    fn the_core_group_is_discovered_under_api() {
        let mut kinds = crate::api::kinds(&Default::default()).expect("kinds");
        let without = Discovery::build(&kinds);
        let json = |d: &Doc| serde_json::from_slice::<serde_json::Value>(&d.body).expect("json");
        assert_eq!(json(&without.api_versions)["versions"], serde_json::json!([]));
        assert_eq!(json(&without.aggregated_legacy["v2"])["items"], serde_json::json!([]));

        kinds.push(Arc::new(crate::registry::store::Store::<crate::api::namespace::Namespace>::new("v1")));
        let d = Discovery::build(&kinds);
        assert_eq!(json(&d.api_versions)["versions"], serde_json::json!(["v1"]));
        let core = json(&d.resource_lists[&(String::new(), "v1".to_string())]);
        assert_eq!(core["groupVersion"], "v1");
        let names: Vec<&str> =
            core["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
        assert_eq!(names, ["namespaces", "namespaces/status"]);
        // kube-apiserver's hash of namespaces: the storage version v1 of the core group.
        assert_eq!(core["resources"][0]["storageVersionHash"], "Q3oi5N2YM8M=");
        let legacy = json(&d.aggregated_legacy["v2"]);
        assert_eq!(legacy["items"][0]["metadata"], serde_json::json!({}));
        assert_eq!(legacy["items"][0]["versions"][0]["resources"][0]["resource"], "namespaces");
        let groups = json(&d.group_list);
        assert!(groups["groups"].as_array().unwrap().iter().all(|g| g["name"] != ""), "{groups}");
        assert_eq!(groups, json(&without.group_list));
    }

    #[test]
    fn aggregated_negotiation() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        use DiscoveryFormat::*;
        assert_eq!(aggregated_version(Some(kubectl)), Aggregated("v2"));
        assert_eq!(
            aggregated_version(Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")),
            Aggregated("v2beta1")
        );
        assert_eq!(
            aggregated_version(Some("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList")),
            Unsupported
        );
        assert_eq!(aggregated_version(Some("application/json")), Legacy);
        assert_eq!(aggregated_version(None), Legacy);
    }
}

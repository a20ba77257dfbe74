//! Discovery documents: legacy (APIGroupList, APIGroup, APIResourceList with storageVersionHash) and aggregated
//! (apidiscovery.k8s.io v2 and v2beta1, negotiated by Accept, with ETag). Built once at start-up.

use crate::api::{storage_version_hash, Strategy};
use crate::server::negotiate::parse_accept;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];
/// A create-only virtual resource (like TokenReview) is only created.
const CREATE_ONLY_VERBS: [&str; 1] = ["create"];

fn verbs(info: &crate::api::KindInfo) -> &'static [&'static str] {
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
    fn new(v: &Value) -> Doc {
        let body = serde_json::to_vec(v).unwrap_or_default();
        let etag = format!("\"{:X}\"", Sha256::digest(&body));
        Doc { body: body.into(), etag }
    }
}

pub struct Discovery {
    pub group_list: Doc,
    pub groups: BTreeMap<String, Doc>,
    pub resource_lists: BTreeMap<(String, String), Doc>,
    /// Aggregated discovery for /apis, by version ("v2", "v2beta1").
    pub aggregated: BTreeMap<&'static str, Doc>,
    /// Aggregated discovery for /api (no core group here: an empty list), by version.
    pub aggregated_legacy: BTreeMap<&'static str, Doc>,
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

fn api_group(group: &str, versions: &[&str]) -> Value {
    let gvs: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({ "name": group, "versions": gvs, "preferredVersion": gvs.first().cloned().unwrap_or(Value::Null) })
}

impl Discovery {
    pub fn build(kinds: &[Arc<dyn Strategy>]) -> Discovery {
        let gv = group_versions(kinds);
        let groups_json: Vec<Value> = gv.iter().map(|(g, vs)| api_group(g, vs)).collect();
        let group_list = Doc::new(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups_json}));
        let mut groups = BTreeMap::new();
        let mut resource_lists = BTreeMap::new();
        for (g, vs) in &gv {
            let mut doc = api_group(g, vs);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            groups.insert(g.to_string(), Doc::new(&doc));
            for v in vs {
                let mut resources = Vec::new();
                for k in kinds.iter().filter(|k| k.info().group == *g && k.info().versions.contains(v)) {
                    let i = k.info();
                    let mut r = json!({
                        "name": i.plural, "singularName": i.singular, "namespaced": i.namespaced, "kind": i.kind,
                        "verbs": verbs(i), "shortNames": i.short_names, "categories": i.categories,
                    });
                    // Only what is stored has a storage version.
                    if !i.create_only {
                        r["storageVersionHash"] = json!(storage_version_hash(i.group, k.storage_version(), i.kind));
                    }
                    resources.push(r);
                    if i.has_status {
                        resources.push(json!({
                            "name": format!("{}/status", i.plural), "singularName": "", "namespaced": i.namespaced,
                            "kind": i.kind, "verbs": STATUS_VERBS,
                        }));
                    }
                }
                let list = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/{v}"), "resources": resources});
                resource_lists.insert((g.to_string(), v.to_string()), Doc::new(&list));
            }
        }
        let mut aggregated = BTreeMap::new();
        let mut aggregated_legacy = BTreeMap::new();
        for dv in ["v2", "v2beta1"] {
            let items: Vec<Value> = gv
                .iter()
                .map(|(g, vs)| {
                    let versions: Vec<Value> = vs
                        .iter()
                        .map(|v| {
                            let resources: Vec<Value> = kinds
                                .iter()
                                .filter(|k| k.info().group == *g && k.info().versions.contains(v))
                                .map(|k| {
                                    let i = k.info();
                                    let rk = json!({"group": g, "version": v, "kind": i.kind});
                                    let subs: Vec<Value> = if i.has_status {
                                        vec![
                                            json!({"subresource": "status", "responseKind": rk, "verbs": STATUS_VERBS}),
                                        ]
                                    } else {
                                        vec![]
                                    };
                                    json!({
                                        "resource": i.plural, "responseKind": rk,
                                        "scope": if i.namespaced { "Namespaced" } else { "Cluster" },
                                        "singularResource": i.singular, "verbs": verbs(i), "shortNames": i.short_names,
                                        "categories": i.categories, "subresources": subs,
                                    })
                                })
                                .collect();
                            json!({"version": v, "resources": resources, "freshness": "Current"})
                        })
                        .collect();
                    json!({"metadata": {"name": g}, "versions": versions})
                })
                .collect();
            let av = format!("apidiscovery.k8s.io/{dv}");
            aggregated.insert(
                dv,
                Doc::new(&json!({"kind": "APIGroupDiscoveryList", "apiVersion": av, "metadata": {}, "items": items})),
            );
            aggregated_legacy.insert(
                dv,
                Doc::new(&json!({"kind": "APIGroupDiscoveryList", "apiVersion": av, "metadata": {}, "items": []})),
            );
        }
        let api_versions = Doc::new(&json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}));
        Discovery { group_list, groups, resource_lists, aggregated, aggregated_legacy, api_versions }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

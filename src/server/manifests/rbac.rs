//! The migrator's RBAC rule for our own kinds: a kustomize patch (JSON 6902) that adds it to the ClusterRole of the
//! hand-kept `manifests/rbac.yaml`, whose other rules name other servers' resources. The migrator lists and
//! patches (a no-op merge patch) the objects of a resource whose storage version changed, through kube-apiserver,
//! which the aggregator proxies back to us: the kinds served in several versions are those a storage version
//! change can concern.

use super::{yaml_file, Files};
use crate::registry::strategy::Strategy;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::rbac::v1::PolicyRule;
use std::sync::Arc;

/// The patch file, which manifests/kustomization.yaml applies to the ClusterRole [`CLUSTER_ROLE`].
pub const FILE: &str = "rbac-own-kinds.yaml";
pub const CLUSTER_ROLE: &str = "migration-apiserver";
/// A chunked LIST, then one merge patch per object (src/scheduler/migrator/target.rs).
const MIGRATOR_VERBS: [&str; 2] = ["list", "patch"];

const COMMENT: &str = "\
Kustomize patch of the ClusterRole migration-apiserver (rbac.yaml): the migrator's rules for our own kinds that a
storage version change can concern (those served in several versions), also when the aggregator proxies them back
to us. manifests/kustomization.yaml applies it.";

/// One rule per group of the stored kinds served in several versions, resources in the kind table's order.
fn rules(kinds: &[Arc<dyn Strategy>]) -> Vec<PolicyRule> {
    let mut rules: Vec<PolicyRule> = Vec::new();
    for info in super::super::crd::stored(kinds).map(|k| k.info()).filter(|i| i.versions.len() > 1) {
        let group = Some(vec![info.group.to_string()]);
        let at = match rules.iter().position(|r| r.api_groups == group) {
            Some(at) => at,
            None => {
                let verbs = MIGRATOR_VERBS.map(String::from).into();
                rules.push(PolicyRule { api_groups: group, resources: Some(Vec::new()), verbs, ..Default::default() });
                rules.len() - 1
            }
        };
        rules[at].resources.get_or_insert_with(Vec::new).push(info.plural.to_string());
    }
    rules
}

/// The rules inserted first, in order, as rbac.yaml had them.
fn patch(kinds: &[Arc<dyn Strategy>]) -> Result<Patch, serde_json::Error> {
    let mut ops = Vec::new();
    for (i, rule) in rules(kinds).into_iter().enumerate() {
        let path = PointerBuf::from_tokens(["rules".to_string(), i.to_string()]);
        ops.push(PatchOperation::Add(AddOperation { path, value: serde_json::to_value(rule)? }));
    }
    Ok(Patch(ops))
}

/// Why the patch file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RbacFileError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// The generated file of `manifests/`.
pub fn files(kinds: &[Arc<dyn Strategy>]) -> Result<Files, RbacFileError> {
    Ok(vec![(FILE.into(), yaml_file(COMMENT, &patch(kinds)?)?)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_version_kinds_are_listed_and_patched() {
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        let rules = rules(&kinds);
        let summary: Vec<(Vec<String>, Vec<String>, Vec<String>)> = rules
            .iter()
            .map(|r| {
                (r.api_groups.clone().unwrap_or_default(), r.resources.clone().unwrap_or_default(), r.verbs.clone())
            })
            .collect();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            summary,
            [
                (strings(&["core.gardener.cloud"]), strings(&["shootstates"]), strings(&["list", "patch"])),
                (
                    strings(&["storagemigration.k8s.io"]),
                    strings(&["storageversionmigrations"]),
                    strings(&["list", "patch"])
                ),
            ]
        );
    }
}

//! `apiservice/`: one APIService (apiregistration.k8s.io/v1) per group version the kinds serve, which registers it
//! with kube-apiserver's aggregator so that its requests are proxied to our Service. No `caBundle`: cert-manager's
//! CA injector or `make deploy` fills it (see [`INJECT_CA_FROM`](super::INJECT_CA_FROM)).

use super::{ca_injected_metadata, kustomization, yaml_file, Files, SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_PORT};
use crate::registry::strategy::Strategy;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec, ServiceReference};
use std::sync::Arc;

/// Below kube-apiserver's own groups (15800 and up) and the PaaS range the field's documentation suggests
/// (the 2000s): our groups never shadow another server's.
const GROUP_PRIORITY_MINIMUM: i32 = 1000;

/// The groups kube-apiserver also serves itself get kube-apiserver's own priorities, so that discovery orders them
/// the same whether we or the cluster serve them: `storagemigration.k8s.io` at 15800 as in kubernetes
/// `pkg/controlplane/apiserver/aggregator.go` `DefaultGenericAPIServicePriorities` (commit 008b365, where
/// v1beta1 has version priority 9); v1 gets 15, the priority of the GA versions there. Both groups now have
/// `storageversionmigrations`: kubectl resolves a bare resource name to the first group in discovery order
/// (highest groupPriorityMinimum), so a bare `kubectl get storageversionmigrations` is
/// `storagemigration.k8s.io` on every cluster, before and after the upgrade; `svm` stays `migration.k8s.io`'s.
const IN_TREE_PRIORITIES: &[(&str, &str, i32, i32)] =
    &[("storagemigration.k8s.io", "v1", 15800, 15), ("storagemigration.k8s.io", "v1beta1", 15800, 9)];

/// The groupPriorityMinimum of `group`'s APIServices, by which the aggregator orders groups in discovery.
pub fn group_priority_minimum(group: &str) -> i32 {
    IN_TREE_PRIORITIES.iter().find(|(g, ..)| *g == group).map_or(GROUP_PRIORITY_MINIMUM, |(_, _, p, _)| *p)
}

/// (groupPriorityMinimum, versionPriority) of `version`, the `index`th preferred of `count` versions of `group`.
fn priorities(group: &str, version: &str, index: usize, count: usize) -> (i32, i32) {
    match IN_TREE_PRIORITIES.iter().find(|(g, v, _, _)| *g == group && *v == version) {
        Some((_, _, group_priority, version_priority)) => (*group_priority, *version_priority),
        None => (GROUP_PRIORITY_MINIMUM, version_priority(index, count)),
    }
}

/// The aggregator orders a group's versions by versionPriority, highest first, so the preferred version (the
/// kinds list versions preferred first) gets the highest. A group's only version sits at 15, the middle, leaving
/// room for a version added before or after it; with several, the preferred gets 20 and the next ones 10, 9, ...
fn version_priority(index: usize, count: usize) -> i32 {
    match (index, count) {
        (_, 1) => 15,
        (0, _) => 20,
        (i, _) => i32::try_from(i).map_or(1, |i| (11 - i).max(1)),
    }
}

/// Every (group, its versions preferred first) the kinds serve, in the kind table's order: one APIService each,
/// named `<version>.<group>`.
pub fn group_versions(kinds: &[Arc<dyn Strategy>]) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for k in kinds {
        let info = k.info();
        let at = match out.iter().position(|(g, _)| *g == info.group) {
            Some(at) => at,
            None => {
                out.push((info.group, Vec::new()));
                out.len() - 1
            }
        };
        let versions = &mut out[at].1;
        for v in info.versions {
            if !versions.contains(v) {
                versions.push(v);
            }
        }
    }
    out
}

fn api_service(group: &str, version: &str, (group_priority_minimum, version_priority): (i32, i32)) -> APIService {
    APIService {
        metadata: ca_injected_metadata(format!("{version}.{group}")),
        spec: Some(APIServiceSpec {
            group: Some(group.to_string()),
            version: Some(version.to_string()),
            group_priority_minimum,
            version_priority,
            service: Some(ServiceReference {
                namespace: Some(SERVICE_NAMESPACE.into()),
                name: Some(SERVICE_NAME.into()),
                port: Some(SERVICE_PORT),
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// Every file of `apiservice/`: `<version>.<group>.yaml` per group version, and the kustomization listing them.
pub fn files(kinds: &[Arc<dyn Strategy>]) -> Result<Files, serde_yaml_ng::Error> {
    let mut out = Vec::new();
    for (group, versions) in group_versions(kinds) {
        for (i, version) in versions.iter().enumerate() {
            let comment = format!(
                "Registers {group}/{version} with kube-apiserver's aggregator: requests for it are proxied to the\n\
                 migration-apiserver Service. caBundle is injected by cert-manager from the serving certificate\n\
                 (or filled from certs/ca.crt by `make deploy`)."
            );
            let object = api_service(group, version, priorities(group, version, i, versions.len()));
            out.push((format!("{version}.{group}.yaml"), yaml_file(&comment, &object)?));
        }
    }
    out.push(kustomization(&out)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preferred_version_comes_first_in_its_group() {
        assert_eq!(version_priority(0, 1), 15);
        let priorities: Vec<i32> = (0..4).map(|i| version_priority(i, 4)).collect();
        assert_eq!(priorities, [20, 10, 9, 8]);
        assert!(priorities.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn in_tree_groups_sort_as_kube_apiserver_sorts_them() {
        assert_eq!(priorities("storagemigration.k8s.io", "v1", 0, 2), (15800, 15));
        assert_eq!(priorities("storagemigration.k8s.io", "v1beta1", 1, 2), (15800, 9));
        // Ahead of migration.k8s.io: a bare `storageversionmigrations` is the in-tree group's.
        assert!(priorities("migration.k8s.io", "v1alpha1", 0, 1).0 < 15800);
    }

    #[test]
    fn one_per_group_version_of_the_kinds() {
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        let names: Vec<String> = files(&kinds).expect("files").into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "v1alpha1.migration.k8s.io.yaml",
                "v1beta1.core.gardener.cloud.yaml",
                "v1alpha1.core.gardener.cloud.yaml",
                "v1.storagemigration.k8s.io.yaml",
                "v1beta1.storagemigration.k8s.io.yaml",
                "kustomization.yaml"
            ]
        );
    }
}

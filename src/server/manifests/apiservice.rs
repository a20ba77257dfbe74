//! `apiservice/`: one APIService (apiregistration.k8s.io/v1) per group version the kinds serve, which registers it
//! with kube-apiserver's aggregator so that its requests are proxied to our Service. No `caBundle`: cert-manager's
//! CA injector or `make deploy` fills it (see [`INJECT_CA_FROM`](super::INJECT_CA_FROM)).

use super::{ca_injected_metadata, kustomization, yaml_file, Files, SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_PORT};
use crate::registry::strategy::{own_version_priority, Strategy, OWN_GROUP_PRIORITY};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec, ServiceReference};
use std::sync::Arc;

/// (groupPriorityMinimum, versionPriority) of `version`, the `index`th preferred of `count` versions of `group`:
/// the facts of the group's kinds ([`KindInfo::priority`](crate::registry::strategy::KindInfo::priority)).
fn priorities(kinds: &[Arc<dyn Strategy>], group: &str, version: &str, index: usize, count: usize) -> (i32, i32) {
    match kinds.iter().map(|k| k.info()).find(|i| i.group == group) {
        Some(info) => (info.group_priority(), info.version_priority(version, index, count)),
        None => (OWN_GROUP_PRIORITY, own_version_priority(index, count)),
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
            let object = api_service(group, version, priorities(kinds, group, version, i, versions.len()));
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
        assert_eq!(own_version_priority(0, 1), 15);
        let priorities: Vec<i32> = (0..4).map(|i| own_version_priority(i, 4)).collect();
        assert_eq!(priorities, [20, 10, 9, 8]);
        assert!(priorities.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn in_tree_groups_sort_as_kube_apiserver_sorts_them() {
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        assert_eq!(priorities(&kinds, "storagemigration.k8s.io", "v1", 0, 2), (15800, 15));
        assert_eq!(priorities(&kinds, "storagemigration.k8s.io", "v1beta1", 1, 2), (15800, 9));
        // Ahead of migration.k8s.io: a bare `storageversionmigrations` is the in-tree group's.
        assert!(priorities(&kinds, "migration.k8s.io", "v1alpha1", 0, 1).0 < 15800);
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

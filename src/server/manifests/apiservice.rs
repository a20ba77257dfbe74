//! `apiservice/`: one APIService (apiregistration.k8s.io/v1) per group version the kinds serve, which registers it
//! with kube-apiserver's aggregator so that its requests are proxied to our Service. No `caBundle`: cert-manager's
//! CA injector or `make deploy` fills it (see [`INJECT_CA_FROM`](super::INJECT_CA_FROM)).

use super::{ca_injected_metadata, kustomization, yaml_file, Files, SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_PORT};
use crate::registry::strategy::Strategy;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec, ServiceReference};
use std::sync::Arc;

/// Below kube-apiserver's own groups (which start at 16000) and the PaaS range the field's documentation suggests
/// (the 2000s): our groups never shadow another server's.
const GROUP_PRIORITY_MINIMUM: i32 = 1000;

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

/// Every (group, its versions preferred first) the kinds serve, in the kind table's order.
fn group_versions(kinds: &[Arc<dyn Strategy>]) -> Vec<(&'static str, Vec<&'static str>)> {
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

fn api_service(group: &str, version: &str, version_priority: i32) -> APIService {
    APIService {
        metadata: ca_injected_metadata(format!("{version}.{group}")),
        spec: Some(APIServiceSpec {
            group: Some(group.to_string()),
            version: Some(version.to_string()),
            group_priority_minimum: GROUP_PRIORITY_MINIMUM,
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
            let object = api_service(group, version, version_priority(i, versions.len()));
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

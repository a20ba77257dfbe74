//! `manifests/audit/configmap.yaml`: the ConfigMap holding the recommended audit policy (manifests/audit/policy.yaml,
//! the same bytes: compiled in, so the two cannot drift), which the Deployment mounts read-only at [`MOUNT_PATH`]
//! and names with `--audit-policy-file`.

use super::{yaml_file, Files, SERVICE_NAMESPACE};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The recommended policy, as committed.
pub const POLICY: &str = include_str!("../../../manifests/audit/policy.yaml");
pub const NAME: &str = "migration-apiserver-audit-policy";
/// Where manifests/deployment.yaml mounts the ConfigMap; the policy is `policy.yaml` in it.
pub const MOUNT_PATH: &str = "/etc/migration-apiserver/audit";
pub const KEY: &str = "policy.yaml";

const COMMENT: &str = "\
The recommended audit policy (manifests/audit/policy.yaml, the same bytes), mounted read-only by the Deployment at
/etc/migration-apiserver/audit (--audit-policy-file=/etc/migration-apiserver/audit/policy.yaml). The server reads
the policy at start: after changing it, `kubectl -n migration-apiserver rollout restart deployment/migration-apiserver`.";

pub fn files() -> Result<Files, serde_yaml_ng::Error> {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(SERVICE_NAMESPACE.into()),
            labels: Some([("app.kubernetes.io/name".to_string(), "migration-apiserver".to_string())].into()),
            ..Default::default()
        },
        data: Some([(KEY.to_string(), POLICY.to_string())].into()),
        ..Default::default()
    };
    Ok(vec![("configmap.yaml".into(), yaml_file(COMMENT, &config_map)?)])
}

#[cfg(test)]
mod tests {
    /// The ConfigMap's data is the policy file byte for byte, and the policy validates.
    #[test]
    fn the_configmap_holds_the_policy_file() {
        let files = super::files().expect("render");
        let doc: serde_json::Value = serde_yaml_ng::from_str(&files[0].1).expect("YAML");
        assert_eq!(doc["kind"], "ConfigMap");
        assert_eq!(doc["data"][super::KEY].as_str(), Some(super::POLICY));
        let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/audit/policy.yaml"));
        assert_eq!(committed.expect("policy.yaml"), super::POLICY);
    }
}

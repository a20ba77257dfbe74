//! The admission webhook configurations for our kinds (the CRD deployment form): kube-apiserver sends every
//! CREATE and UPDATE of a stored kind, and of its `/status`, to `/mutate` (defaults) and `/validate`. The rules
//! follow from the kinds: one per group and scope, every version. The CSI migration webhooks of the same directory
//! act on core resources, not on our kinds, and stay hand-written.

use super::{
    ca_injected_metadata, resources_with_status, yaml_file, Files, SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_PORT,
};
use crate::registry::strategy::Strategy;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use std::sync::Arc;

/// The name of both configurations, and the suffix of their webhooks' names.
const NAME: &str = "migration-apiserver";
const WEBHOOK_NAME_SUFFIX: &str = "migration-apiserver.migration.k8s.io";
/// DELETE and CONNECT are always allowed, so they are not sent.
const OPERATIONS: [&str; 2] = ["CREATE", "UPDATE"];

const MUTATING_COMMENT: &str = "\
Defaulting of our kinds when they are installed as CRDs (manifests/crds/): kube-apiserver sends an AdmissionReview
to migration-apiserver's /mutate, which answers with a JSON Patch of the kind's defaults (the same strategy code as
the aggregated API). See docs/install/crds.md. The patch is idempotent, hence reinvocationPolicy IfNeeded. /status is included:
a CRD with a status subresource drops status on create, so status defaults (StorageState
persistedStorageVersionHashes [\"Unknown\"]) take effect on the /status writes.";

const VALIDATING_COMMENT: &str = "\
Validation of our kinds when they are installed as CRDs (manifests/crds/): kube-apiserver sends an AdmissionReview
to migration-apiserver's /validate, which validates with the same strategy code as the aggregated API. See
docs/install/crds.md. /status writes are validated like the aggregated API's /status.";

/// One rule per (group, scope) of the stored kinds, in the kind table's order: their resources and `/status`.
fn rules(kinds: &[Arc<dyn Strategy>]) -> Vec<RuleWithOperations> {
    let mut rules: Vec<RuleWithOperations> = Vec::new();
    for k in super::super::crd::stored(kinds) {
        let info = k.info();
        let scope = if info.namespaced { "Namespaced" } else { "Cluster" };
        let same = |r: &RuleWithOperations| {
            r.api_groups.as_deref() == Some(&[info.group.to_string()]) && r.scope.as_deref() == Some(scope)
        };
        let at = match rules.iter().position(same) {
            Some(at) => at,
            None => {
                rules.push(RuleWithOperations {
                    api_groups: Some(vec![info.group.to_string()]),
                    api_versions: Some(vec!["*".into()]),
                    operations: Some(OPERATIONS.map(String::from).into()),
                    resources: Some(Vec::new()),
                    scope: Some(scope.into()),
                });
                rules.len() - 1
            }
        };
        rules[at].resources.get_or_insert_with(Vec::new).extend(resources_with_status(k.as_ref()));
    }
    rules
}

/// The webhook calling `path` (`/validate`, `/mutate`) for the kinds' writes: a failed call fails the write
/// (`failurePolicy: Fail`), since an unvalidated object of ours must not be stored.
fn webhook(prefix: &str, path: &str, kinds: &[Arc<dyn Strategy>]) -> ValidatingWebhook {
    ValidatingWebhook {
        name: format!("{prefix}.{WEBHOOK_NAME_SUFFIX}"),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some("Fail".into()),
        match_policy: Some("Equivalent".into()),
        timeout_seconds: Some(10),
        client_config: WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: SERVICE_NAMESPACE.into(),
                name: SERVICE_NAME.into(),
                path: Some(path.into()),
                port: Some(SERVICE_PORT),
            }),
            ..Default::default()
        },
        rules: Some(rules(kinds)),
        ..Default::default()
    }
}

fn validating(kinds: &[Arc<dyn Strategy>]) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ca_injected_metadata(NAME.into()),
        webhooks: Some(vec![webhook("validate", "/validate", kinds)]),
    }
}

fn mutating(kinds: &[Arc<dyn Strategy>]) -> MutatingWebhookConfiguration {
    let w = webhook("mutate", "/mutate", kinds);
    let hook = MutatingWebhook {
        name: w.name,
        admission_review_versions: w.admission_review_versions,
        side_effects: w.side_effects,
        failure_policy: w.failure_policy,
        match_policy: w.match_policy,
        timeout_seconds: w.timeout_seconds,
        client_config: w.client_config,
        rules: w.rules,
        // The patch is idempotent: a reinvocation after other webhooks' changes returns none unless a default is
        // missing again.
        reinvocation_policy: Some("IfNeeded".into()),
        match_conditions: w.match_conditions,
        namespace_selector: w.namespace_selector,
        object_selector: w.object_selector,
    };
    MutatingWebhookConfiguration { metadata: ca_injected_metadata(NAME.into()), webhooks: Some(vec![hook]) }
}

/// The two generated files of `manifests/webhooks/` (its kustomization.yaml, which lists the CSI ones too, is
/// hand-kept).
pub fn files(kinds: &[Arc<dyn Strategy>]) -> Result<Files, serde_yaml_ng::Error> {
    Ok(vec![
        ("mutating-webhook-configuration.yaml".into(), yaml_file(MUTATING_COMMENT, &mutating(kinds))?),
        ("validating-webhook-configuration.yaml".into(), yaml_file(VALIDATING_COMMENT, &validating(kinds))?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_per_group_and_scope_with_status() {
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        let rules = rules(&kinds);
        let summary: Vec<(String, String, Vec<String>)> = rules
            .iter()
            .map(|r| {
                let group = r.api_groups.clone().unwrap_or_default().join(",");
                (group, r.scope.clone().unwrap_or_default(), r.resources.clone().unwrap_or_default())
            })
            .collect();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            summary,
            [
                (
                    "migration.k8s.io".to_string(),
                    "Cluster".to_string(),
                    strings(&[
                        "storageversionmigrations",
                        "storageversionmigrations/status",
                        "storagestates",
                        "storagestates/status"
                    ])
                ),
                ("core.gardener.cloud".to_string(), "Namespaced".to_string(), strings(&["shootstates"])),
                (
                    "storagemigration.k8s.io".to_string(),
                    "Cluster".to_string(),
                    strings(&["storageversionmigrations", "storageversionmigrations/status"])
                ),
            ]
        );
    }
}

//! checker_test.go's (k8s.io/apiserver `pkg/audit/policy`) rules and expected levels and stages, shared by the
//! policy's unit tests and tests/audit.rs (which sends the same requests to the real server).

use super::policy::{Level, Stage};

/// checker_test.go's `rules`, in the policy file's own syntax.
fn rule(name: &str) -> &'static str {
    match name {
        "default" => "{level: Metadata}",
        "create" => "{level: Request, verbs: [create]}",
        "tims" => "{level: Metadata, users: [tim@k8s.io]}",
        "humans" => "{level: Metadata, userGroups: [humans]}",
        "serviceAccounts" => "{level: Request, userGroups: ['system:serviceaccounts']}",
        "getPods" => "{level: RequestResponse, verbs: [get], resources: [{resources: [pods]}]}",
        "getPodLogs" => "{level: Request, verbs: [get], resources: [{resources: [pods/log]}]}",
        "getPodWildcardMatching" => "{level: Request, verbs: [get], resources: [{resources: ['*']}]}",
        "getPodResourceWildcardMatching" => "{level: Request, verbs: [get], resources: [{resources: ['*/log']}]}",
        "getPodSubResourceWildcardMatching" => "{level: Request, verbs: [get], resources: [{resources: ['pods/*']}]}",
        "getClusterRoles" => {
            "{level: RequestResponse, verbs: [get], resources: [{group: rbac.authorization.k8s.io, resources: [clusterroles]}], namespaces: ['']}"
        }
        "getGroupWildCardMatchingWithSubresourceWildcardMatching" => {
            "{level: RequestResponse, verbs: [update], resources: [{group: '*', resources: ['*/status']}]}"
        }
        "getLogs" => "{level: RequestResponse, verbs: [get], nonResourceURLs: ['/logs*']}",
        "getMetrics" => "{level: Request, verbs: [get], nonResourceURLs: [/metrics]}",
        "clusterRoleEdit" => {
            "{level: Request, resources: [{group: rbac.authorization.k8s.io, resources: [clusterroles], resourceNames: [edit]}]}"
        }
        "omit RequestReceived" => "{level: Request, omitStages: [RequestReceived]}",
        "only audit panic" => "{level: Request, omitStages: [RequestReceived, ResponseStarted, ResponseComplete]}",
        other => panic!("no rule {other}"),
    }
}

/// The policy file of `rules` with the policy-wide `omit` stages.
pub fn policy_yaml(omit: &[Stage], rules: &[&str]) -> String {
    let stages: Vec<&str> = omit.iter().map(|s| s.as_str()).collect();
    let rules: Vec<&str> = rules.iter().map(|r| rule(r)).collect();
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [{}]\nrules: [{}]\n",
        stages.join(", "),
        rules.join(", ")
    )
}

/// checker_test.go's `testAuditLevel` (request, expected level, rules), shared with tests/audit.rs.
pub const LEVEL_CASES: &[(&str, Level, &[&str])] = &[
    ("namespaced", Level::Metadata, &["default"]),
    ("namespaced", Level::None, &["create"]),
    ("namespaced", Level::Metadata, &["tims"]),
    ("namespaced", Level::Metadata, &["humans"]),
    ("namespaced", Level::None, &["serviceAccounts"]),
    ("namespaced", Level::RequestResponse, &["getPods"]),
    ("namespaced", Level::None, &["getClusterRoles"]),
    ("namespaced", Level::None, &["getLogs"]),
    ("namespaced", Level::None, &["getMetrics"]),
    ("namespaced", Level::Metadata, &["getMetrics", "serviceAccounts", "default"]),
    ("namespaced", Level::RequestResponse, &["getMetrics", "getPods", "default"]),
    ("namespaced", Level::RequestResponse, &["getPodLogs", "getPods"]),
    ("cluster", Level::Metadata, &["default"]),
    ("cluster", Level::None, &["create"]),
    ("cluster", Level::Metadata, &["tims"]),
    ("cluster", Level::Metadata, &["humans"]),
    ("cluster", Level::None, &["serviceAccounts"]),
    ("cluster", Level::None, &["getPods"]),
    ("cluster", Level::RequestResponse, &["getClusterRoles"]),
    ("cluster", Level::Request, &["clusterRoleEdit", "getClusterRoles"]),
    ("cluster", Level::None, &["getLogs"]),
    ("cluster", Level::None, &["getMetrics"]),
    ("cluster", Level::Metadata, &["getMetrics", "serviceAccounts", "default"]),
    ("cluster", Level::RequestResponse, &["getMetrics", "getClusterRoles", "default"]),
    ("cluster", Level::None, &["getPodLogs", "getPods"]),
    ("nonResource", Level::Metadata, &["default"]),
    ("nonResource", Level::None, &["create"]),
    ("nonResource", Level::Metadata, &["tims"]),
    ("nonResource", Level::Metadata, &["humans"]),
    ("nonResource", Level::None, &["serviceAccounts"]),
    ("nonResource", Level::None, &["getPods"]),
    ("nonResource", Level::None, &["getClusterRoles"]),
    ("nonResource", Level::RequestResponse, &["getLogs"]),
    ("nonResource", Level::None, &["getMetrics"]),
    ("nonResource", Level::Metadata, &["getMetrics", "serviceAccounts", "default"]),
    ("nonResource", Level::RequestResponse, &["getLogs", "getClusterRoles", "default"]),
    ("nonResource", Level::None, &["getPodLogs", "getPods"]),
    ("subresource", Level::Request, &["getPodLogs", "getPods"]),
    ("subresource", Level::Request, &["getPodWildcardMatching"]),
    ("subresource", Level::Request, &["getPodResourceWildcardMatching"]),
    ("subresource", Level::Request, &["getPodSubResourceWildcardMatching"]),
    ("Unauthorized", Level::None, &["tims"]),
    ("Unauthorized", Level::Metadata, &["tims", "default"]),
    ("Unauthorized", Level::None, &["humans"]),
    ("Unauthorized", Level::Metadata, &["humans", "default"]),
    ("ClusterRoleUpdate", Level::RequestResponse, &["getGroupWildCardMatchingWithSubresourceWildcardMatching"]),
];

use Stage::{RequestReceived as Received, ResponseComplete as Complete, ResponseStarted as Started};

/// checker_test.go's per-rule omitStages cases: (request, level, policy stages, expected stages, rules).
/// (request, level, policy-wide stages, expected omitted stages, rules)
pub type StageCase = (&'static str, Level, &'static [Stage], &'static [Stage], &'static [&'static str]);

pub const STAGE_CASES: &[StageCase] = &[
    ("namespaced", Level::Request, &[], &[Received], &["omit RequestReceived", "getPods", "default"]),
    ("namespaced", Level::Request, &[], &[Received, Started, Complete], &["only audit panic", "getPods", "default"]),
    ("cluster", Level::Request, &[], &[Received], &["omit RequestReceived", "getPods", "default"]),
    ("cluster", Level::Request, &[], &[Received, Started, Complete], &["only audit panic", "getPods", "default"]),
    ("nonResource", Level::Request, &[], &[Received], &["omit RequestReceived", "getPods", "default"]),
    ("nonResource", Level::Request, &[], &[Received, Started, Complete], &["only audit panic", "getPods", "default"]),
    (
        "namespaced",
        Level::Request,
        &[Received, Started],
        &[Received, Started],
        &["omit RequestReceived", "getPods", "default"],
    ),
    (
        "namespaced",
        Level::Request,
        &[Received, Started],
        &[Received, Started, Complete],
        &["only audit panic", "getPods", "default"],
    ),
    (
        "cluster",
        Level::Request,
        &[Received, Started],
        &[Received, Started],
        &["omit RequestReceived", "getPods", "default"],
    ),
    (
        "cluster",
        Level::Request,
        &[Received, Started],
        &[Received, Started, Complete],
        &["only audit panic", "getPods", "default"],
    ),
    (
        "nonResource",
        Level::Metadata,
        &[Received, Started],
        &[Received, Started],
        &["default", "omit RequestReceived", "getPods"],
    ),
    (
        "nonResource",
        Level::Request,
        &[Received, Started],
        &[Received, Started, Complete],
        &["only audit panic", "getPods", "default"],
    ),
];

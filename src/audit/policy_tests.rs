//! The tables of k8s.io/apiserver `pkg/audit/policy/checker_test.go` (requests, rules, expected levels and stages),
//! and the validation cases of `pkg/apis/audit/validation`.

use super::*;
use crate::audit::checker_cases::*;
use axum::http::Method;
use std::collections::BTreeMap;

fn tim() -> UserInfo {
    UserInfo {
        name: "tim@k8s.io".into(),
        uid: String::new(),
        groups: vec!["humans".into(), "developers".into()],
        extra: BTreeMap::new(),
    }
}

/// checker_test.go's `attrs`: (user?, RequestInfo).
fn request(name: &str) -> (bool, RequestInfo) {
    let res = |verb: &str, ns: &str, group: &str, version: &str, resource: &str, sub: &str, name: &str| RequestInfo {
        verb: verb.into(),
        is_resource_request: true,
        namespace: ns.into(),
        api_group: group.into(),
        api_version: version.into(),
        resource: resource.into(),
        subresource: sub.into(),
        name: name.into(),
        ..Default::default()
    };
    match name {
        "namespaced" => (true, res("get", "default", "", "v1", "pods", "", "busybox")),
        "cluster" => (true, res("get", "", "rbac.authorization.k8s.io", "v1beta1", "clusterroles", "", "edit")),
        "nonResource" => (true, RequestInfo::parse(&Method::GET, "/logs/kubelet.log", None)),
        "subresource" => (true, res("get", "default", "", "v1", "pods", "log", "busybox")),
        "Unauthorized" => (false, res("get", "default", "", "v1", "pods", "", "busybox")),
        "ClusterRoleUpdate" => {
            (true, res("update", "", "rbac.authorization.k8s.io", "v1beta1", "clusterroles", "status", "somerole"))
        }
        other => panic!("no request {other}"),
    }
}

fn check(req: &str, level: Level, policy_stages: &[Stage], omit: &[Stage], rules: &[&str]) {
    let policy = Policy::from_bytes(policy_yaml(policy_stages, rules).as_bytes()).expect("valid policy");
    let (with_user, info) = request(req);
    let user = tim();
    let got = PolicyRuleEvaluator::new(policy).evaluate(&Attributes { user: with_user.then_some(&user), info: &info });
    assert_eq!(got.level, level, "request {req}, rules {rules:?}");
    assert_eq!(got.omit_stages, omit.iter().copied().collect::<Stages>(), "request {req}, rules {rules:?}");
}

#[test]
fn checker_levels_without_and_with_policy_stages() {
    for policy_stages in [&[][..], &[Stage::RequestReceived, Stage::ResponseStarted][..]] {
        for (req, level, rules) in LEVEL_CASES {
            check(req, *level, policy_stages, policy_stages, rules);
        }
    }
}

#[test]
fn checker_omit_stages_per_rule_and_policy_wide() {
    for (req, level, policy_stages, omit, rules) in STAGE_CASES {
        check(req, *level, policy_stages, omit, rules);
    }
}

/// TestOmitManagedFields: the policy's default unless the rule says otherwise.
#[test]
fn omit_managed_fields_policy_default_and_rule_override() {
    for (policy, rule, want) in
        [(false, None, false), (true, None, true), (false, Some(true), true), (true, Some(false), false)]
    {
        let rule = rule.map_or(String::new(), |r: bool| format!(", omitManagedFields: {r}"));
        let yaml = format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitManagedFields: {policy}\nrules: [{{level: RequestResponse, verbs: [get]{rule}}}]\n"
        );
        let info = RequestInfo::parse(&Method::GET, "/healthz", None);
        let config = PolicyRuleEvaluator::new(Policy::from_bytes(yaml.as_bytes()).expect("valid"))
            .evaluate(&Attributes { user: None, info: &info });
        assert_eq!(config.omit_managed_fields, want, "{yaml}");
    }
}

fn error_of(yaml: &str) -> String {
    Policy::from_bytes(format!("apiVersion: audit.k8s.io/v1\nkind: Policy\n{yaml}").as_bytes()).expect_err(yaml)
}

/// validation_test.go's invalid rules, with upstream's messages.
#[test]
fn invalid_policies_name_the_field() {
    let cases = [
        (
            "rules: [{level: Foo}]",
            r#"rules[0].level: Unsupported value: "Foo": supported values: "None", "Metadata", "Request", "RequestResponse""#,
        ),
        ("rules: [{verbs: [get]}]", "rules[0].level: Required value"),
        (
            "rules: [{level: None, nonResourceURLs: [foo]}]",
            r#"rules[0].nonResourceURLs[0]: Invalid value: "foo": non-resource URL rules must begin with a '/' character"#,
        ),
        (
            "rules: [{level: None, nonResourceURLs: ['/*/foo']}]",
            r#"rules[0].nonResourceURLs[0]: Invalid value: "/*/foo": non-resource URL wildcards '*' must be the final character of the rule"#,
        ),
        (
            "rules: [{level: None, resources: [{group: rbac.authorization.k8s.io/v1beta1}]}]",
            r#"rules[0].resources.group: Invalid value: "rbac.authorization.k8s.io/v1beta1": a lowercase RFC 1123 subdomain"#,
        ),
        (
            "rules: [{level: None, resources: [{resourceNames: [leader]}]}]",
            r#"rules[0].resources.resourceNames: Invalid value: []string{"leader"}: using resourceNames requires at least one resource"#,
        ),
        (
            "rules: [{level: None, nonResourceURLs: [/metrics], namespaces: [default]}]",
            r#"rules[0].nonResourceURLs: Invalid value: []string{"/metrics"}: rules cannot apply to both regular resources and non-resource URLs"#,
        ),
        (
            "rules: [{level: None, omitStages: [foo]}]",
            r#"rules[0].omitStages[0]: Invalid value: "foo": allowed stages are RequestReceived,ResponseStarted,ResponseComplete,Panic"#,
        ),
        ("omitStages: [Bar]\nrules: [{level: None}]", r#"omitStages[0]: Invalid value: "Bar": allowed stages are"#),
        ("rules: []", "loaded illegal policy with 0 rules"),
    ];
    for (yaml, want) in cases {
        let got = error_of(yaml);
        assert!(got.starts_with(want), "{yaml}:\n got {got}\nwant {want}");
    }
    // Several errors: Go's aggregate, in brackets.
    let got = error_of("rules: [{level: Foo, omitStages: [x]}]");
    assert!(got.starts_with("[rules[0].level: Unsupported value") && got.contains(", rules[0].omitStages[0]"), "{got}");
    // Another group version or kind is refused.
    let wrong = Policy::from_bytes(b"apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]")
        .expect_err("v1beta1");
    assert!(wrong.contains("audit.k8s.io/v1beta1"), "{wrong}");
    // JSON is YAML.
    let json = r#"{"apiVersion":"audit.k8s.io/v1","kind":"Policy","rules":[{"level":"Metadata"}]}"#;
    assert_eq!(Policy::from_bytes(json.as_bytes()).expect("JSON").rules.len(), 1);
}

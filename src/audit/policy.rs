//! The audit policy (`--audit-policy-file`): kube-apiserver's `audit.k8s.io/v1` `Policy`, read, validated and
//! evaluated as k8s.io/apiserver reads (`pkg/audit/policy/reader.go`), validates (`pkg/apis/audit/validation`) and
//! evaluates it (`pkg/audit/policy/checker.go`): rules in order, the first that matches decides the level, and a
//! request no rule matches is not audited.

use crate::auth::authn::UserInfo;
use crate::error::FieldError;
use crate::request_info::RequestInfo;
use serde::{Deserialize, Deserializer};
use std::path::Path;

/// How much of a request an event records. Ordered: each level records what the ones before it do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub const ALL: [Level; 4] = [Level::None, Level::Metadata, Level::Request, Level::RequestResponse];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }

    fn parse(s: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// When in a request's life an event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    RequestReceived,
    /// Only for long-running requests (watches): once the response headers are sent.
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::RequestReceived, Stage::ResponseStarted, Stage::ResponseComplete, Stage::Panic];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }

    fn parse(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|st| st.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of stages (the omitted ones), as a bit set: copied per request at no cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages(u8);

impl Stages {
    pub fn contains(self, stage: Stage) -> bool {
        self.0 & stage.bit() != 0
    }
    pub fn with(self, stage: Stage) -> Stages {
        Stages(self.0 | stage.bit())
    }
    fn union(self, other: Stages) -> Stages {
        Stages(self.0 | other.0)
    }
    fn from_names(names: &[String]) -> Stages {
        names.iter().filter_map(|n| Stage::parse(n)).fold(Stages::default(), Stages::with)
    }
}

impl FromIterator<Stage> for Stages {
    fn from_iter<I: IntoIterator<Item = Stage>>(iter: I) -> Self {
        iter.into_iter().fold(Stages::default(), Stages::with)
    }
}

/// The policy as written (`audit.k8s.io/v1` `Policy`); levels and stages stay text until validated, so that a bad
/// value is reported with upstream's message rather than a decode error.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub rules: Vec<PolicyRule>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub omit_stages: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub omit_managed_fields: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    #[serde(default, deserialize_with = "null_as_default")]
    pub level: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub users: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub user_groups: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub verbs: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resources: Vec<GroupResources>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs", deserialize_with = "null_as_default")]
    pub non_resource_urls: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub omit_stages: Vec<String>,
    /// Unset: the policy's `omitManagedFields`.
    #[serde(default)]
    pub omit_managed_fields: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    #[serde(default, deserialize_with = "null_as_default")]
    pub group: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resources: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_names: Vec<String>,
}

/// Go decodes `null` into a field's zero value.
fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Why a policy file was refused; the text is kube-apiserver's (`loading audit policy file: ...`).
#[derive(Debug, thiserror::Error)]
#[error("loading audit policy file: {0}")]
pub struct PolicyError(String);

impl Policy {
    /// Reads and validates a policy file (YAML or JSON), as `policy.LoadPolicyFromFile`. Unknown fields are
    /// accepted with a warning, as upstream falls back to lenient decoding.
    pub fn from_file(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read(path).map_err(|e| {
            PolicyError(format!("failed to read file path {}: {e}", crate::gostr::quote(&path.display().to_string())))
        })?;
        Policy::from_bytes(&text).map_err(|e| PolicyError(format!("{e}: from file {}", path.display())))
    }

    pub fn from_bytes(text: &[u8]) -> Result<Policy, String> {
        let de = serde_yaml_ng::Deserializer::from_slice(text);
        let mut unknown = Vec::new();
        let policy: Policy = serde_ignored::deserialize(de, |p| unknown.push(p.to_string()))
            .map_err(|e| format!("failed decoding: {e}"))?;
        if !unknown.is_empty() {
            tracing::warn!(fields = ?unknown, "Audit policy contains errors, falling back to lenient decoding: unknown fields");
        }
        if policy.kind.is_empty() {
            return Err(format!(
                "failed decoding: Object 'Kind' is missing in '{}'",
                String::from_utf8_lossy(text).trim()
            ));
        }
        if (policy.api_version.as_str(), policy.kind.as_str()) != ("audit.k8s.io/v1", "Policy") {
            return Err(format!(
                "failed decoding: no kind {} is registered for version {} in scheme \"audit\"",
                crate::gostr::quote(&policy.kind),
                crate::gostr::quote(&policy.api_version)
            ));
        }
        let errs = policy.validate();
        match errs.len() {
            0 => {}
            1 => return Err(errs[0].message.clone()),
            _ => return Err(format!("[{}]", errs.iter().map(|e| e.message.as_str()).collect::<Vec<_>>().join(", "))),
        }
        if policy.rules.is_empty() {
            return Err("loaded illegal policy with 0 rules".into());
        }
        Ok(policy)
    }

    /// `validation.ValidatePolicy`.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errs = validate_omit_stages(&self.omit_stages, "omitStages");
        for (i, rule) in self.rules.iter().enumerate() {
            errs.extend(rule.validate(&format!("rules[{i}]")));
        }
        errs
    }
}

impl PolicyRule {
    fn validate(&self, path: &str) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let level = format!("{path}.level");
        match self.level.as_str() {
            "" => errs.push(FieldError::required(level)),
            l if Level::parse(l).is_none() => {
                let allowed: Vec<&str> = Level::ALL.iter().map(|l| l.as_str()).collect();
                errs.push(FieldError::not_supported(level, l, &allowed));
            }
            _ => {}
        }
        for (i, url) in self.non_resource_urls.iter().enumerate() {
            if url == "*" {
                continue;
            }
            let field = format!("{path}.nonResourceURLs[{i}]");
            if !url.starts_with('/') {
                errs.push(FieldError::invalid(&field, url, "non-resource URL rules must begin with a '/' character"));
            }
            if !url.is_empty() && url[..url.len() - 1].contains('*') {
                errs.push(FieldError::invalid(
                    &field,
                    url,
                    "non-resource URL wildcards '*' must be the final character of the rule",
                ));
            }
        }
        for gr in &self.resources {
            if !gr.group.is_empty() && gr.group != "*" {
                let msgs = crate::validation::dns1123_subdomain(&gr.group);
                if !msgs.is_empty() {
                    errs.push(FieldError::invalid(format!("{path}.resources.group"), &gr.group, &msgs.join(",")));
                }
            }
            if !gr.resource_names.is_empty() && gr.resources.is_empty() {
                errs.push(FieldError::invalid_rendered(
                    format!("{path}.resources.resourceNames"),
                    &go_string_slice(&gr.resource_names),
                    "using resourceNames requires at least one resource",
                ));
            }
        }
        errs.extend(validate_omit_stages(&self.omit_stages, &format!("{path}.omitStages")));
        if !self.non_resource_urls.is_empty() && (!self.resources.is_empty() || !self.namespaces.is_empty()) {
            errs.push(FieldError::invalid_rendered(
                format!("{path}.nonResourceURLs"),
                &go_string_slice(&self.non_resource_urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        errs
    }
}

fn validate_omit_stages(stages: &[String], path: &str) -> Vec<FieldError> {
    let allowed: Vec<&str> = Stage::ALL.iter().map(|s| s.as_str()).collect();
    stages
        .iter()
        .enumerate()
        .filter(|(_, s)| Stage::parse(s).is_none())
        .map(|(i, s)| {
            FieldError::invalid(format!("{path}[{i}]"), s, &format!("allowed stages are {}", allowed.join(",")))
        })
        .collect()
}

/// A `[]string` as Go's `%#v` prints it in a field error: `[]string{"a", "b"}`.
fn go_string_slice(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| crate::gostr::quote(v)).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// What the policy decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestAuditConfig {
    pub level: Level,
    pub omit_stages: Stages,
    pub omit_managed_fields: bool,
}

/// What a rule is matched against: the authenticated user (none when authentication failed) and the request.
pub struct Attributes<'a> {
    pub user: Option<&'a UserInfo>,
    pub info: &'a RequestInfo,
}

/// A validated policy, ready to evaluate: each rule's omitted stages include the policy's.
#[derive(Debug)]
pub struct PolicyRuleEvaluator {
    rules: Vec<(PolicyRule, RequestAuditConfig)>,
    default: RequestAuditConfig,
}

impl PolicyRuleEvaluator {
    pub fn new(policy: Policy) -> PolicyRuleEvaluator {
        let policy_stages = Stages::from_names(&policy.omit_stages);
        let rules = policy
            .rules
            .into_iter()
            .map(|rule| {
                let config = RequestAuditConfig {
                    level: Level::parse(&rule.level).unwrap_or(Level::None),
                    omit_stages: policy_stages.union(Stages::from_names(&rule.omit_stages)),
                    omit_managed_fields: rule.omit_managed_fields.unwrap_or(policy.omit_managed_fields),
                };
                (rule, config)
            })
            .collect();
        let default = RequestAuditConfig {
            level: Level::None,
            omit_stages: policy_stages,
            omit_managed_fields: policy.omit_managed_fields,
        };
        PolicyRuleEvaluator { rules, default }
    }

    /// The first matching rule's level and stages; no match: level None.
    pub fn evaluate(&self, attrs: &Attributes<'_>) -> RequestAuditConfig {
        self.rules.iter().find(|(rule, _)| rule_matches(rule, attrs)).map_or(self.default, |(_, config)| *config)
    }
}

fn rule_matches(r: &PolicyRule, attrs: &Attributes<'_>) -> bool {
    if !r.users.is_empty() && !attrs.user.is_some_and(|u| r.users.contains(&u.name)) {
        return false;
    }
    if !r.user_groups.is_empty() && !attrs.user.is_some_and(|u| u.groups.iter().any(|g| r.user_groups.contains(g))) {
        return false;
    }
    if !r.verbs.is_empty() && !r.verbs.contains(&attrs.info.verb) {
        return false;
    }
    if !r.namespaces.is_empty() || !r.resources.is_empty() {
        return rule_matches_resource(r, attrs.info);
    }
    if !r.non_resource_urls.is_empty() {
        return !attrs.info.is_resource_request
            && r.non_resource_urls.iter().any(|spec| path_matches(&attrs.info.path, spec));
    }
    true
}

fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*" || spec == path || spec.strip_suffix('*').is_some_and(|_| path.starts_with(spec.trim_end_matches('*')))
}

fn rule_matches_resource(r: &PolicyRule, info: &RequestInfo) -> bool {
    if !info.is_resource_request {
        return false;
    }
    // Cluster-scoped requests have the empty namespace.
    if !r.namespaces.is_empty() && !r.namespaces.contains(&info.namespace) {
        return false;
    }
    if r.resources.is_empty() {
        return true;
    }
    let (resource, sub) = (info.resource.as_str(), info.subresource.as_str());
    let combined = if sub.is_empty() { resource.to_string() } else { format!("{resource}/{sub}") };
    r.resources.iter().filter(|gr| gr.group == info.api_group || gr.group == "*").any(|gr| {
        if gr.resources.is_empty() {
            return true;
        }
        if !gr.resource_names.is_empty() && !gr.resource_names.contains(&info.name) {
            return false;
        }
        gr.resources.iter().any(|res| {
            res == &combined
                || res == "*"
                || (!sub.is_empty() && res.strip_prefix("*/") == Some(sub))
                || res.strip_suffix("/*") == Some(resource)
        })
    })
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

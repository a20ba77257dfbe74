//! Validation as kube-apiserver's for storagemigration.k8s.io: pkg/apis/storagemigration/validation/validation.go
//! of kubernetes/kubernetes (the GroupResource and metav1.Condition form: DNS-1035 resource, DNS-1123 group, the
//! whole spec immutable, `resourceversion.CompareResourceVersion` for `status.resourceVersion`,
//! `metav1validation.ValidateConditions`), with its field paths, messages and bad values. Upstream is moving these
//! rules to declarative validation (zz_generated.validations.go); the messages here are the hand-written ones,
//! which the declarative ones keep. Metadata (the DNS-subdomain name rule and the metadata update rules) is the
//! registry's part, as `ValidateObjectMeta`/`ValidateObjectMetaUpdate` are upstream's.

use super::{
    StorageVersionMigration, StorageVersionMigrationSpec, CONDITION_FAILED, CONDITION_RUNNING, CONDITION_SUCCEEDED,
};
use crate::error::{CauseType, FieldError};
use crate::registry::object_meta::{condition_reason, dns1123_subdomain, qualified_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;
use serde_json::Value;

const DNS1035_LABEL_MAX: usize = 63;
const MAX_MESSAGE: usize = 32 * 1024;
/// 0001-01-01T00:00:00Z, Go's zero `time.Time`, in seconds since the Unix epoch.
const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;
const CONDITION_STATUSES: &[&str] = &["False", "True", "Unknown"];

/// `ValidateStorageVersionMigration` without the metadata: `spec.resource`.
pub(super) fn validate_spec(spec: &StorageVersionMigrationSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let resource = &spec.resource;
    if resource.resource.is_empty() {
        errs.push(FieldError::required_msg("spec.resource.resource", "resource is required to be set"));
    } else {
        // As APIService's names: the resource a DNS-1035 label, the group a DNS-1123 subdomain.
        let problems = dns1035_label(&resource.resource);
        if !problems.is_empty() {
            errs.push(FieldError::invalid("spec.resource.resource", &resource.resource, &problems.join(",")));
        }
    }
    if !resource.group.is_empty() {
        let problems = dns1123_subdomain(&resource.group);
        if !problems.is_empty() {
            errs.push(FieldError::invalid("spec.resource.group", &resource.group, &problems.join(",")));
        }
    }
    errs
}

/// `ValidateStorageVersionMigrationUpdate`: the new object valid, and its spec as it was.
pub(super) fn validate_update(new: &StorageVersionMigration, old: &StorageVersionMigration) -> Vec<FieldError> {
    let mut errs = validate_spec(&new.spec);
    if new.spec != old.spec {
        errs.push(FieldError::immutable("spec", &serde_json::to_value(&new.spec).unwrap_or(Value::Null)));
    }
    errs
}

/// `ValidateStorageVersionMigrationStatusUpdate`: the status alone (the spec is the stored one on `/status`).
pub(super) fn validate_status_update(new: &StorageVersionMigration, old: &StorageVersionMigration) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let empty = Default::default();
    let status = new.status.as_ref().unwrap_or(&empty);
    let old_rv = old.status.as_ref().map_or("", |s| s.resource_version.as_str());
    // Upstream compares the version with itself, which fails exactly when it is not a well-formed positive integer:
    // an empty one too, so every status write carries the resourceVersion the migration started at.
    if !well_formed_resource_version(&status.resource_version) {
        errs.push(FieldError::invalid(
            "status.resourceVersion",
            &status.resource_version,
            &format!("resource version is not well formed: {}", status.resource_version),
        ));
    }
    errs.extend(validate_conditions(&status.conditions));
    if !old_rv.is_empty() && old_rv != status.resource_version {
        errs.push(FieldError::invalid("status.resourceVersion", &status.resource_version, "field is immutable"));
    }
    let conditions_error = |detail: &str| {
        FieldError::invalid_rendered("status.conditions", &go_json_conditions(&status.conditions), detail)
    };
    let (succeeded, failed, running) =
        (new.is_true(CONDITION_SUCCEEDED), new.is_true(CONDITION_FAILED), new.is_true(CONDITION_RUNNING));
    if succeeded && failed {
        errs.push(conditions_error("Both success and failed conditions cannot be true at the same time"));
    }
    if succeeded && running {
        errs.push(conditions_error("Running condition cannot be true when success condition is true"));
    }
    if failed && running {
        errs.push(conditions_error("Running condition cannot be true when failed condition is true"));
    }
    if old.is_true(CONDITION_SUCCEEDED) && !succeeded {
        errs.push(conditions_error("Success condition cannot be set to false once it is true"));
    }
    if old.is_true(CONDITION_FAILED) && !failed {
        errs.push(conditions_error("Failed condition cannot be set to false once it is true"));
    }
    errs
}

/// apimachinery's `metav1validation.ValidateConditions`: types unique, and each condition valid.
fn validate_conditions(conditions: &[Condition]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let at = format!("status.conditions[{i}]");
        if !seen.insert(c.type_.as_str()) {
            errs.push(FieldError::duplicate(format!("{at}.type"), &c.type_));
        }
        errs.extend(validate_condition(c, &at));
    }
    errs
}

/// apimachinery's `metav1validation.ValidateCondition`.
fn validate_condition(c: &Condition, at: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for problem in qualified_name(&c.type_) {
        errs.push(FieldError::invalid(format!("{at}.type"), &c.type_, &problem));
    }
    if !CONDITION_STATUSES.contains(&c.status.as_str()) {
        errs.push(FieldError::not_supported(format!("{at}.status"), &c.status, CONDITION_STATUSES));
    }
    if let Some(g) = c.observed_generation.filter(|g| *g < 0) {
        errs.push(FieldError::invalid_value(
            format!("{at}.observedGeneration"),
            &Value::from(g),
            "must be greater than or equal to zero",
        ));
    }
    // Go's zero time (a missing lastTransitionTime does not decode here, as k8s-openapi requires the field).
    if c.last_transition_time.0.as_second() == GO_ZERO_TIME_SECONDS {
        errs.push(FieldError::required_msg(format!("{at}.lastTransitionTime"), "must be set"));
    }
    if c.reason.is_empty() {
        errs.push(FieldError::required_msg(format!("{at}.reason"), "must be set"));
    } else {
        let mut reason = condition_reason(&format!("{at}.reason"), &c.reason);
        // Upstream reports the syntax before the length.
        reason.sort_by_key(|e| e.reason == CauseType::FieldValueTooLong);
        errs.extend(reason);
    }
    if c.message.len() > MAX_MESSAGE {
        errs.push(FieldError::too_long(format!("{at}.message"), MAX_MESSAGE));
    }
    errs
}

/// apimachinery's `IsDNS1035Label`: problems with `s` (empty when valid).
fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1035_LABEL_MAX {
        errs.push(format!("must be no more than {DNS1035_LABEL_MAX} characters"));
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
        && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if !ok {
        errs.push("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".into());
    }
    errs
}

/// apimachinery's `resourceversion` well-formedness: a positive integer without leading zeros, of any length.
fn well_formed_resource_version(rv: &str) -> bool {
    !rv.is_empty() && !rv.starts_with('0') && rv.bytes().all(|b| b.is_ascii_digit())
}

/// A condition as Go's `encoding/json` writes a metav1.Condition: its field order, message always present,
/// observedGeneration only when set.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoCondition<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
    last_transition_time: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    reason: &'a str,
    message: &'a str,
}

/// The conditions as apimachinery puts them in an Invalid message: `encoding/json` of the Go slice, which also
/// escapes HTML characters and the JavaScript line separators that serde_json leaves as they are (only inside
/// strings here, so replacing them is safe).
fn go_json_conditions(conditions: &[Condition]) -> String {
    let go: Vec<GoCondition<'_>> = conditions
        .iter()
        .map(|c| GoCondition {
            type_: &c.type_,
            status: &c.status,
            observed_generation: c.observed_generation.filter(|g| *g != 0),
            last_transition_time: &c.last_transition_time,
            reason: &c.reason,
            message: &c.message,
        })
        .collect();
    let json = serde_json::to_string(&go).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    if out == "[]" && conditions.is_empty() {
        // A nil Go slice.
        return "null".into();
    }
    out
}

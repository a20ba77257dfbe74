//! Validation as kube-apiserver's for storagemigration.k8s.io: pkg/apis/storagemigration/validation/validation.go
//! of kubernetes/kubernetes (the GroupResource and metav1.Condition form: DNS-1035 resource, DNS-1123 group, the
//! whole spec immutable, `resourceversion.CompareResourceVersion` for `status.resourceVersion`,
//! `metav1validation.ValidateConditions`), with its field paths, messages and bad values. Upstream is moving these
//! rules to declarative validation (zz_generated.validations.go); the messages here are the hand-written ones,
//! which the declarative ones keep. Metadata (the DNS-subdomain name rule and the metadata update rules) is the
//! registry's part, as `ValidateObjectMeta`/`ValidateObjectMetaUpdate` are upstream's.

use super::{StorageVersionMigration, StorageVersionMigrationSpec, CONDITION_FAILED, CONDITION_SUCCEEDED};
use crate::error::{CauseType, FieldError};
use crate::go_decode::is_zero_time;
use crate::registry::object_meta::condition_reason;
use crate::validation::{dns1035_label, dns1123_subdomain, qualified_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;
use serde_json::Value;

const MAX_MESSAGE: usize = 32 * 1024;
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
        // Upstream renders the internal Go type, whose Resource field has no JSON tag: Go's encoder names it
        // `Resource` (kube-apiserver v1.37.2 answers `spec: Invalid value: {"Resource":{"group":...}}`).
        let rendered = serde_json::json!({"Resource": new.spec.resource});
        errs.push(FieldError::immutable("spec", &rendered));
    }
    errs
}

/// `ValidateStorageVersionMigrationStatusUpdate`: the status alone (the spec is the stored one on `/status`).
pub(super) fn validate_status_update(new: &StorageVersionMigration, old: &StorageVersionMigration) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let empty = Default::default();
    let status = new.status.as_ref().unwrap_or(&empty);
    let old_rv = old.status.as_ref().map_or("", |s| s.resource_version.as_str());
    // Upstream (GA) checks the version only when one is set, comparing it with itself, which fails exactly when it
    // is not a well-formed positive integer. An empty one is valid: the controller writes Running before it has
    // listed, and a migration of a resource not in discovery fails without one.
    if !status.resource_version.is_empty() && !well_formed_resource_version(&status.resource_version) {
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
    // GA dropped "Running condition cannot be true when success/failed condition is true": its controllers leave
    // Running True beside Succeeded or Failed until the runner flips it (pkg/controller/storageversionmigrator at
    // the GA commits write exactly that).
    let (succeeded, failed) = (new.is_true(CONDITION_SUCCEEDED), new.is_true(CONDITION_FAILED));
    if succeeded && failed {
        errs.push(conditions_error("Both success and failed conditions cannot be true at the same time"));
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
        // The duplicate is reported at the entry, not its type (apimachinery eed9617a).
        if !seen.insert(c.type_.as_str()) {
            errs.push(FieldError::duplicate(at.clone(), &c.type_));
        }
        errs.extend(validate_condition(c, &at));
    }
    errs
}

/// apimachinery's `metav1validation.ValidateCondition`.
fn validate_condition(c: &Condition, at: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if c.type_.is_empty() {
        errs.push(FieldError::required_msg(format!("{at}.type"), "is required"));
    }
    for problem in qualified_name(&c.type_).into_iter().filter(|_| !c.type_.is_empty()) {
        errs.push(FieldError::invalid(format!("{at}.type"), &c.type_, &problem));
    }
    if c.status.is_empty() {
        errs.push(FieldError::required(format!("{at}.status")));
    } else if !CONDITION_STATUSES.contains(&c.status.as_str()) {
        errs.push(FieldError::not_supported(format!("{at}.status"), &c.status, CONDITION_STATUSES));
    }
    if let Some(g) = c.observed_generation.filter(|g| *g < 0) {
        errs.push(FieldError::invalid_value(
            format!("{at}.observedGeneration"),
            &Value::from(g),
            "must be greater than or equal to zero",
        ));
    }
    // Go's zero time: also what a missing or null lastTransitionTime decodes to (`conditions::deserialize`).
    if is_zero_time(&c.last_transition_time) {
        errs.push(FieldError::required(format!("{at}.lastTransitionTime")));
    }
    if c.reason.is_empty() {
        errs.push(FieldError::required(format!("{at}.reason")));
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

/// The conditions as apimachinery puts them in an Invalid message: `encoding/json` of the Go slice.
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
    let out = crate::api::go_json(&go);
    if out == "[]" && conditions.is_empty() {
        // A nil Go slice.
        return "null".into();
    }
    out
}

/// The cases of upstream's pkg/apis/storagemigration/validation/validation_test.go (the GroupResource and
/// metav1.Condition form), with its expected messages.
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svm(group: &str, resource: &str, rv: &str, conditions: &[(&str, &str)]) -> StorageVersionMigration {
        let conditions: Vec<Value> = conditions
            .iter()
            .map(|(t, s)| {
                let reason = if *s == "True" { t.to_string() } else { format!("Not{t}") };
                json!({"type": t, "status": s, "reason": reason, "lastTransitionTime": "2024-01-01T00:00:00Z"})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "test-svm", "resourceVersion": "1"},
            "spec": {"resource": {"group": group, "resource": resource}},
            "status": {"resourceVersion": rv, "conditions": conditions},
        }))
        .expect("object")
    }

    fn messages(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.message.as_str()).collect()
    }

    #[test]
    fn spec() {
        let dns1035 = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
        let dns1123 = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
        let cases: &[(&str, &str, Vec<String>)] = &[
            ("non-empty", "non-empty", vec![]),
            ("", "", vec!["spec.resource.resource: Required value: resource is required to be set".into()]),
            ("non-empty", "", vec!["spec.resource.resource: Required value: resource is required to be set".into()]),
            ("non-empty", ".", vec![format!("spec.resource.resource: Invalid value: \".\": {dns1035}")]),
            ("-", "non-empty", vec![format!("spec.resource.group: Invalid value: \"-\": {dns1123}")]),
        ];
        for (group, resource, want) in cases {
            let errs = validate_spec(&svm(group, resource, "", &[]).spec);
            assert_eq!(messages(&errs), *want, "{group:?} {resource:?}");
        }
    }

    #[test]
    fn update() {
        let old = svm("example.com", "myresources", "", &[]);
        assert!(validate_update(&old, &old).is_empty());
        let moved = svm("new.example.com", "myresources", "", &[]);
        assert_eq!(
            messages(&validate_update(&moved, &old)),
            ["spec: Invalid value: {\"Resource\":{\"group\":\"new.example.com\",\"resource\":\"myresources\"}}: field is immutable"]
        );
        let emptied = svm("example.com", "", "", &[]);
        assert!(messages(&validate_update(&emptied, &old))[0].starts_with("spec.resource.resource: Required value"));
    }

    #[test]
    fn status_update() {
        let s = |rv: &str, conditions: &[(&str, &str)]| svm("example.com", "myresources", rv, conditions);
        let (running, succeeded, failed) = (("Running", "True"), ("Succeeded", "True"), ("Failed", "True"));
        let (running_false, succeeded_false, failed_false) =
            (("Running", "False"), ("Succeeded", "False"), ("Failed", "False"));
        let cases: &[(&str, StorageVersionMigration, StorageVersionMigration, &str)] = &[
            ("initial status set with RV", s("123", &[running]), s("", &[]), ""),
            // GA: an empty resourceVersion is valid, with any condition (the controllers write Running before it is
            // known, and Failed without one for a resource not in discovery); once set, it cannot be emptied.
            ("running without RV", s("", &[running]), s("", &[]), ""),
            ("failed without RV", s("", &[failed]), s("", &[]), ""),
            (
                "RV emptied",
                s("", &[running]),
                s("123", &[running]),
                "status.resourceVersion: Invalid value: \"\": field is immutable",
            ),
            ("running to succeeded", s("123", &[running_false, succeeded]), s("123", &[running]), ""),
            // GA: the controllers leave Running True beside the outcome until the runner flips it.
            ("running beside succeeded", s("123", &[running, succeeded]), s("123", &[running]), ""),
            ("running beside failed", s("", &[running, failed]), s("", &[running]), ""),
            ("running to failed", s("123", &[running_false, failed]), s("123", &[running]), ""),
            ("succeeded stays", s("123", &[succeeded]), s("123", &[succeeded]), ""),
            ("failed stays", s("123", &[failed]), s("123", &[failed]), ""),
            (
                "resource version change",
                s("456", &[running]),
                s("123", &[running]),
                "status.resourceVersion: Invalid value: \"456\": field is immutable",
            ),
            (
                "bad resource version format",
                s("abc", &[running]),
                s("", &[]),
                "status.resourceVersion: Invalid value: \"abc\": resource version is not well formed: abc",
            ),
            (
                "both succeeded and failed",
                s("123", &[succeeded, failed]),
                s("123", &[running]),
                "Both success and failed conditions cannot be true at the same time",
            ),
            (
                "succeeded back to false",
                s("123", &[succeeded_false]),
                s("123", &[succeeded]),
                "Success condition cannot be set to false once it is true",
            ),
            (
                "failed back to false",
                s("123", &[failed_false]),
                s("123", &[failed]),
                "Failed condition cannot be set to false once it is true",
            ),
        ];
        for (name, new, old, want) in cases {
            let errs = validate_status_update(new, old);
            let all = messages(&errs).join(", ");
            if want.is_empty() {
                assert!(errs.is_empty(), "{name}: {all}");
            } else {
                assert!(all.contains(want), "{name}: {all}");
            }
        }
    }

    /// The conditions in an Invalid message as Go writes them: its field order, message present.
    #[test]
    fn conditions_rendered_as_go() {
        let new = svm("g", "r", "1", &[("Succeeded", "True"), ("Failed", "True")]);
        let errs = validate_status_update(&new, &new);
        assert_eq!(
            errs[0].message,
            "status.conditions: Invalid value: [{\"type\":\"Succeeded\",\"status\":\"True\",\"lastTransitionTime\":\"2024-01-01T00:00:00Z\",\"reason\":\"Succeeded\",\"message\":\"\"},{\"type\":\"Failed\",\"status\":\"True\",\"lastTransitionTime\":\"2024-01-01T00:00:00Z\",\"reason\":\"Failed\",\"message\":\"\"}]: Both success and failed conditions cannot be true at the same time"
        );
    }

    #[test]
    fn condition_rules() {
        let mut new = svm("g", "r", "abc", &[("Running", "Maybe"), ("Running", "True")]);
        let status = new.status.as_mut().expect("status");
        status.conditions[1].reason = "1bad".into();
        status.conditions[1].observed_generation = Some(-1);
        status.conditions[1].message = "m".repeat(MAX_MESSAGE + 1);
        let errs = validate_status_update(&new, &svm("g", "r", "", &[]));
        let fields: Vec<(&str, &str)> = errs.iter().map(|e| (e.reason.as_str(), e.field.as_str())).collect();
        assert_eq!(
            fields,
            [
                ("FieldValueInvalid", "status.resourceVersion"),
                ("FieldValueNotSupported", "status.conditions[0].status"),
                ("FieldValueDuplicate", "status.conditions[1]"),
                ("FieldValueInvalid", "status.conditions[1].observedGeneration"),
                ("FieldValueInvalid", "status.conditions[1].reason"),
                ("FieldValueTooLong", "status.conditions[1].message"),
            ]
        );
        assert_eq!(
            errs[0].message,
            "status.resourceVersion: Invalid value: \"abc\": resource version is not well formed: abc"
        );
        assert_eq!(
            errs[1].message,
            "status.conditions[0].status: Unsupported value: \"Maybe\": supported values: \"False\", \"True\", \"Unknown\""
        );
        assert!(well_formed_resource_version("10") && !well_formed_resource_version("01"));
        assert!(!well_formed_resource_version("-1") && !well_formed_resource_version("0"));
    }
}

//! Validation shared by every kind: object metadata and the name/label syntaxes of apimachinery, with its messages.

use crate::error::FieldError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

fn is_alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn dns_label_chars_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

fn dns_label_ok(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX && dns_label_chars_ok(s)
}

/// Problems with `s` as an RFC 1123 label (empty when valid).
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    if !dns_label_ok(&s[..s.len().min(DNS1123_LABEL_MAX)]) || s.is_empty() {
        errs.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".into());
    }
    errs
}

/// Problems with `s` as an RFC 1123 subdomain (empty when valid).
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(format!("must be no more than {DNS1123_SUBDOMAIN_MAX} characters"));
    }
    // apimachinery's IsDNS1123Subdomain: the whole name at most 253 characters and the regex; its dot-separated
    // parts have no length limit of their own (unlike DNS itself).
    if s.is_empty() || !s.split('.').all(dns_label_chars_ok) {
        errs.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into());
    }
    errs
}

fn qualified_name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Problems with `s` as a qualified name (`[prefix/]name`), used for label and annotation keys and finalizers.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".into());
        } else {
            errs.extend(dns1123_subdomain(p).into_iter().map(|e| format!("prefix part {e}")));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else {
        if name.len() > QUALIFIED_NAME_MAX {
            errs.push(format!("name part must be no more than {QUALIFIED_NAME_MAX} characters"));
        }
        if !qualified_name_part_ok(name) || name.contains('/') {
            errs.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
        }
    }
    errs
}

pub fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        errs.push(format!("must be no more than {LABEL_VALUE_MAX} characters"));
    }
    if !s.is_empty() && !qualified_name_part_ok(s) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into());
    }
    errs
}

/// Name validation of a kind: DNS subdomain (most kinds) or DNS label.
#[derive(Clone, Copy, Debug)]
pub enum NameRule {
    Subdomain,
    Label,
}

impl NameRule {
    pub fn check(self, name: &str) -> Vec<String> {
        match self {
            NameRule::Subdomain => dns1123_subdomain(name),
            NameRule::Label => dns1123_label(name),
        }
    }
}

/// ValidateObjectMeta: the generic part of every create and update.
pub fn validate_object_meta(meta: &ObjectMeta, namespaced: bool, rule: NameRule) -> Vec<FieldError> {
    let mut errs = validate_names(meta, namespaced, rule);
    errs.extend(validate_labels_and_annotations(meta));
    errs.extend(validate_finalizers(meta.finalizers.as_deref().unwrap_or_default()));
    errs.extend(validate_owner_references(meta.owner_references.as_deref().unwrap_or_default()));
    if let Some(g) = meta.generation.filter(|g| *g < 0) {
        errs.push(FieldError::invalid_value(
            "metadata.generation",
            &Value::from(g),
            "must be greater than or equal to 0",
        ));
    }
    errs
}

/// generateName, name and namespace.
fn validate_names(meta: &ObjectMeta, namespaced: bool, rule: NameRule) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta.name.as_deref().unwrap_or_default();
    let generate_name = meta.generate_name.as_deref().unwrap_or_default();
    // generateName first, as apimachinery checks it: a valid name prefix, i.e. valid once a trailing dash is
    // masked (the random suffix follows it); its length is checked before the base is cut to 58 characters.
    if !generate_name.is_empty() {
        let masked = match generate_name.strip_suffix('-') {
            Some(base) => format!("{base}a"),
            None => generate_name.to_string(),
        };
        for e in rule.check(&masked) {
            errs.push(FieldError::invalid("metadata.generateName", generate_name, &e));
        }
    }
    if name.is_empty() {
        errs.push(FieldError::required_msg("metadata.name", "name or generateName is required"));
    } else {
        for e in rule.check(name) {
            errs.push(FieldError::invalid("metadata.name", name, &e));
        }
    }
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    if namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::required("metadata.namespace"));
        } else {
            for e in dns1123_label(namespace) {
                errs.push(FieldError::invalid("metadata.namespace", namespace, &e));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden("metadata.namespace", "not allowed on this type"));
    }
    errs
}

/// Label keys and values, annotation keys and the annotations' total size.
fn validate_labels_and_annotations(meta: &ObjectMeta) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in meta.labels.iter().flatten() {
        for e in qualified_name(k) {
            errs.push(FieldError::invalid("metadata.labels", k, &e));
        }
        for e in label_value(v) {
            errs.push(FieldError::invalid(format!("metadata.labels.{k}"), v, &e));
        }
    }
    let mut total = 0usize;
    for (k, v) in meta.annotations.iter().flatten() {
        total += k.len() + v.len();
        for e in qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid("metadata.annotations", k, &e));
        }
    }
    if total > TOTAL_ANNOTATION_SIZE {
        errs.push(FieldError::too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE));
    }
    errs
}

/// Finalizers: qualified names, each once.
fn validate_finalizers(finalizers: &[String]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, f) in finalizers.iter().enumerate() {
        for e in qualified_name(f) {
            errs.push(FieldError::invalid(format!("metadata.finalizers[{i}]"), f, &e));
        }
        if !seen.insert(f) {
            errs.push(FieldError::duplicate(format!("metadata.finalizers[{i}]"), f));
        }
    }
    errs
}

/// Owner references: their identifying fields set, at most one controller.
fn validate_owner_references(refs: &[OwnerReference]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        for (f, v) in [("apiVersion", &r.api_version), ("kind", &r.kind), ("name", &r.name), ("uid", &r.uid)] {
            if v.is_empty() {
                errs.push(FieldError::required(format!("metadata.ownerReferences[{i}].{f}")));
            }
        }
    }
    if refs.iter().filter(|r| r.controller == Some(true)).count() > 1 {
        errs.push(FieldError::invalid_value(
            "metadata.ownerReferences",
            &serde_json::to_value(refs).unwrap_or_default(),
            "Only one reference can have Controller set to true",
        ));
    }
    errs
}

/// Condition `reason` syntax of the in-tree API: `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`, at most 1024 characters.
pub fn condition_reason(field: &str, reason: &str) -> Vec<FieldError> {
    let b = reason.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && (b.len() == 1
            || (b[1..b.len() - 1].iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b',' || c == b':')
                && (b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')));
    let mut errs = Vec::new();
    if reason.len() > 1024 {
        errs.push(FieldError::too_long(field, 1024));
    }
    if !ok {
        errs.push(FieldError::invalid(
            field,
            reason,
            "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(dns1123_subdomain("deployments.apps").is_empty());
        assert!(!dns1123_subdomain("Deployments").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        // apimachinery's TestIsDNS1123Subdomain: a part may be longer than a label; only the total is bounded.
        assert!(dns1123_subdomain(&format!("x{}", "a".repeat(63))).is_empty());
        assert!(dns1123_subdomain(&format!("{}.b", "a".repeat(100))).is_empty());
        assert!(dns1123_subdomain(&"a".repeat(253)).is_empty());
        assert_eq!(dns1123_subdomain(&"a".repeat(254)), ["must be no more than 253 characters"]);
        assert!(!dns1123_label(&format!("x{}", "a".repeat(63))).is_empty(), "a label keeps its 63");
        assert!(dns1123_label("ab-1").is_empty());
        assert!(!dns1123_label("a.b").is_empty());
        assert!(qualified_name("example.com/my-key").is_empty());
        assert!(!qualified_name("/x").is_empty());
        assert!(label_value("").is_empty());
        assert!(!label_value("-x").is_empty());
    }

    #[test]
    fn meta_errors_are_all_reported() {
        let m = json!({"name": "Bad_Name", "namespace": "ns", "labels": {"ok": "-bad"}, "finalizers": ["a/b", "a/b"]});
        let m: ObjectMeta = serde_json::from_value(m).expect("metadata");
        let errs = validate_object_meta(&m, false, NameRule::Subdomain);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"metadata.name"));
        assert!(fields.contains(&"metadata.namespace"));
        assert!(fields.contains(&"metadata.labels.ok"));
        assert!(fields.contains(&"metadata.finalizers[1]"));
    }

    #[test]
    fn reasons() {
        assert!(condition_reason("r", "Superseded").is_empty());
        assert!(condition_reason("r", "A:B_").is_empty());
        assert!(!condition_reason("r", "1bad").is_empty());
        assert!(!condition_reason("r", "bad-").is_empty());
    }
}

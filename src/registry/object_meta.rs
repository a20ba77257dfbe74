//! Object metadata as apimachinery's `ValidateObjectMeta` checks it (pkg/api/validation/objectmeta.go), with its
//! messages; the name and label syntaxes it applies are [`crate::validation`]'s.

use crate::error::FieldError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

use crate::validation::*;

/// ValidateObjectMeta (`ValidateObjectMetaAccessor` of pkg/api/validation/objectmeta.go): the generic part of
/// every create and update, in its order: generateName, name, namespace, generation, labels, annotations, owner
/// references, finalizers.
pub fn validate_object_meta(meta: &ObjectMeta, namespaced: bool, rule: NameRule) -> Vec<FieldError> {
    let mut errs = validate_names(meta, namespaced, rule);
    if let Some(g) = meta.generation.filter(|g| *g < 0) {
        errs.push(FieldError::invalid_value(
            "metadata.generation",
            &Value::from(g),
            "must be greater than or equal to 0",
        ));
    }
    errs.extend(validate_labels(meta.labels.iter().flatten(), "metadata.labels"));
    errs.extend(validate_annotations(meta.annotations.iter().flatten(), "metadata.annotations"));
    errs.extend(validate_owner_references(meta.owner_references.as_deref().unwrap_or_default()));
    errs.extend(validate_finalizers(meta.finalizers.as_deref().unwrap_or_default()));
    errs
}

/// generateName, name and namespace.
fn validate_names(meta: &ObjectMeta, namespaced: bool, rule: NameRule) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta.name.as_deref().unwrap_or_default();
    let generate_name = meta.generate_name.as_deref().unwrap_or_default();
    // generateName first, as apimachinery checks it: the kind's name rule with `prefix` (a trailing dash masked,
    // for the random suffix that follows it), on the whole generateName, before the registry cut it to 58 bytes.
    if !generate_name.is_empty() {
        for e in rule.check(generate_name, true) {
            errs.push(FieldError::invalid("metadata.generateName", generate_name, &e));
        }
    }
    if name.is_empty() {
        errs.push(FieldError::required_msg("metadata.name", "name or generateName is required"));
    } else {
        for e in rule.check(name, false) {
            errs.push(FieldError::invalid("metadata.name", name, &e));
        }
    }
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    if namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::required("metadata.namespace"));
        } else {
            // `ValidateNamespaceName(namespace, false)`: a DNS label.
            for e in dns1123_label(namespace) {
                errs.push(FieldError::invalid("metadata.namespace", namespace, &e));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden("metadata.namespace", "not allowed on this type"));
    }
    errs
}

/// `ValidateLabels` of pkg/apis/meta/v1/validation: each key a qualified name, each value a label value, both
/// reported at `field` itself (the bad value tells which label), a key's problems before its value's.
pub fn validate_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        for e in qualified_name(k) {
            errs.push(FieldError::invalid(field, k, &e));
        }
        for e in label_value(v) {
            errs.push(FieldError::invalid(field, v, &e));
        }
    }
    errs
}

/// `ValidateAnnotations`: each key a qualified name once lower-cased (case does not matter; the message shows
/// the key as written), and keys and values together at most 256 KiB (Too long, no value shown).
pub fn validate_annotations<'a>(
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
    field: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for (k, v) in annotations {
        total += k.len() + v.len();
        for e in qualified_name(&crate::gostr::to_lower(k)) {
            errs.push(FieldError::invalid(field, k, &e));
        }
    }
    if total > TOTAL_ANNOTATION_SIZE {
        errs.push(FieldError::too_long(field, TOTAL_ANNOTATION_SIZE));
    }
    errs
}

/// Finalizers: qualified names, each once.
fn validate_finalizers(finalizers: &[String]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, f) in finalizers.iter().enumerate() {
        // `ValidateFinalizerName(finalizer, fldPath)`: at the list, not the item.
        for e in qualified_name(f) {
            errs.push(FieldError::invalid("metadata.finalizers", f, &e));
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

    const LABEL_KEY_REGEX: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";

    fn a(n: usize) -> String {
        "a".repeat(n)
    }

    #[test]
    fn meta_errors_are_all_reported() {
        let m = json!({"name": "Bad_Name", "namespace": "ns", "labels": {"ok": "-bad"}, "finalizers": ["a/b", "a/b"]});
        let m: ObjectMeta = serde_json::from_value(m).expect("metadata");
        let errs = validate_object_meta(&m, false, NameRule::Subdomain);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["metadata.name", "metadata.namespace", "metadata.labels", "metadata.finalizers[1]"]);
    }

    /// pkg/apis/meta/v1/validation's `TestValidateLabels` and objectmeta_test.go's `TestValidateAnnotations`: the
    /// field is the map's, the message the syntax's, one error a case.
    #[test]
    fn labels_and_annotations() {
        let one = |k: &str, v: &str| std::iter::once((k.to_string(), v.to_string())).collect::<Vec<_>>();
        let labels = |k: &str, v: &str| {
            let l = one(k, v);
            validate_labels(l.iter().map(|(k, v)| (k, v)), "metadata.labels")
                .into_iter()
                .map(|e| e.message)
                .collect::<Vec<_>>()
        };
        let annotations = |k: &str, v: &str| {
            let l = one(k, v);
            validate_annotations(l.iter().map(|(k, v)| (k, v)), "metadata.annotations")
                .into_iter()
                .map(|e| e.message)
                .collect::<Vec<_>>()
        };
        for k in [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "1234",
            "simple/simple",
            "now-with-dashes/simple",
            "now-with-dashes/now-with-dashes",
            "now.with.dots/simple",
            "now-with.dashes-and.dots/simple",
            "1-num.2-num/3-num",
            "1234/5678",
            "1.2.3.4/5678",
            "UpperCaseAreOK123",
        ] {
            assert!(labels(k, "bar").is_empty(), "{k}");
            assert!(annotations(k, "bar").is_empty(), "{k}");
        }
        assert!(labels("goodvalue", "123_-.BaR").is_empty());
        for (k, want) in [
            ("nospecialchars^=@", "name part must consist of"),
            ("cantendwithadash-", "name part must consist of"),
            ("only/one/slash", "a valid label key must consist of"),
            (&a(254), "must be no more than"),
        ] {
            for got in [labels(k, "bar"), annotations(k, "bar")] {
                assert_eq!(got.len(), 1, "{k}: {got:?}");
                assert!(got[0].contains(want), "{k}: {got:?}");
            }
        }
        for (v, want) in [
            (a(64), "must be no more than"),
            ("some\\bad\\value".into(), "a valid label must be an empty string or consist of"),
            ("bad,value".into(), "a valid label must be an empty string or consist of"),
            ("?#$notsogood".into(), "a valid label must be an empty string or consist of"),
        ] {
            let got = labels("key", &v);
            assert_eq!(got.len(), 1, "{v}: {got:?}");
            assert!(got[0].contains(want) && got[0].starts_with("metadata.labels: Invalid value: "), "{got:?}");
        }
        // Annotation keys are checked lower-cased, and shown as written.
        assert!(annotations("Example.COM/Key", "v").is_empty());
        assert_eq!(
            annotations("A/B/C", "v"),
            [format!("metadata.annotations: Invalid value: \"A/B/C\": {LABEL_KEY_REGEX}")]
        );
        // The total size: keys and values, at most 256 KiB.
        assert!(annotations("a", &"b".repeat(TOTAL_ANNOTATION_SIZE - 1)).is_empty());
        assert_eq!(
            annotations("a", &"b".repeat(TOTAL_ANNOTATION_SIZE)),
            ["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
    }

    #[test]
    fn reasons() {
        assert!(condition_reason("r", "Superseded").is_empty());
        assert!(condition_reason("r", "A:B_").is_empty());
        assert!(!condition_reason("r", "1bad").is_empty());
        assert!(!condition_reason("r", "bad-").is_empty());
    }
}

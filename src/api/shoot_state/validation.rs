//! ShootState spec validation as gardener-apiserver's: `ValidateShootStateSpec` of gardener/gardener
//! pkg/api/core/validation/shootstate.go and the helpers it calls in utils.go (`ValidateResources`,
//! `validateCrossVersionObjectReference`), as read at commit b312835d1784c3628983205c05452b2eaa95b645. Error types,
//! field paths, bad values and details are Gardener's, so that a client matching `details.causes` sees what
//! gardener-apiserver sends. Metadata is the registry's part (`NameRule::Label`, namespace required), as Gardener's
//! `ValidateObjectMeta(meta, true, NameIsDNSLabel, ...)`; an update runs the same rules on the new object, as
//! `ValidateShootStateUpdate` does (its spec-update check is empty).

use super::{CrossVersionObjectReference, NamedResourceReference, ShootStateSpec};
use crate::error::FieldError;
use std::collections::HashSet;

/// Gardener validates `spec.extensions[i].resources` with `fldPath.Child("resources")` where `fldPath` is `spec`, so
/// their problems are reported at `spec.resources[j]...`, the path of the top-level list. Kept: the causes' fields
/// are what clients of gardener-apiserver match on.
const EXTENSION_RESOURCES_PATH: &str = "spec.resources";

/// `GroupVersionKind.String()` of the kinds a reference may name: v1 Secret and ConfigMap. Gardener adds
/// security.gardener.cloud WorkloadIdentity only where a caller asks for it, and ShootState does not.
const ALLOWED_GVKS: &[&str] = &["/v1, Kind=Secret", "/v1, Kind=ConfigMap"];

pub(super) fn validate_spec(spec: &ShootStateSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    // Gardener does not require gardener[].name to be unique (the list merges by name, but the server takes
    // duplicates), so neither do we.
    for (i, data) in spec.gardener.iter().enumerate() {
        if data.name.is_empty() {
            errs.push(FieldError::invalid(
                format!("spec.gardener[{i}].name"),
                &data.name,
                "name of data required to generate resources cannot be empty",
            ));
        }
    }
    for (i, extension) in spec.extensions.iter().enumerate() {
        if extension.kind.is_empty() {
            errs.push(FieldError::invalid(
                format!("spec.extensions[{i}].kind"),
                &extension.kind,
                "extension resource kind cannot be empty",
            ));
        }
        if let Some(purpose) = extension.purpose.as_deref().filter(|p| p.is_empty()) {
            errs.push(FieldError::invalid(
                format!("spec.extensions[{i}].purpose"),
                purpose,
                "extension resource purpose cannot be empty",
            ));
        }
        errs.extend(validate_resources(&extension.resources, EXTENSION_RESOURCES_PATH));
    }
    for (i, resource) in spec.resources.iter().enumerate() {
        // ResourceData inlines its reference, so its fields sit right under the item.
        let reference = CrossVersionObjectReference {
            kind: resource.kind.clone(),
            name: resource.name.clone(),
            api_version: resource.api_version.clone(),
        };
        errs.extend(validate_reference(&reference, &format!("spec.resources[{i}]")));
    }
    errs
}

/// Gardener's `ValidateResources` (WorkloadIdentity not allowed): names required and unique within the list.
fn validate_resources(resources: &[NamedResourceReference], path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = HashSet::new();
    for (i, resource) in resources.iter().enumerate() {
        let item = format!("{path}[{i}]");
        if resource.name.is_empty() {
            errs.push(FieldError::required_msg(format!("{item}.name"), "field must not be empty"));
        } else if !names.insert(resource.name.as_str()) {
            errs.push(FieldError::duplicate(format!("{item}.name"), &resource.name));
        }
        errs.extend(validate_reference(&resource.resource_ref, &format!("{item}.resourceRef")));
    }
    errs
}

/// Gardener's `validateCrossVersionObjectReference`. The GroupVersionKind is checked even when apiVersion or kind
/// is missing (an empty apiVersion parses as the empty group version), so an empty reference gets both Required
/// and NotSupported, as in Gardener.
fn validate_reference(reference: &CrossVersionObjectReference, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if reference.api_version.is_empty() {
        errs.push(FieldError::required_msg(format!("{path}.apiVersion"), "must provide an apiVersion"));
    }
    if reference.kind.is_empty() {
        errs.push(FieldError::required_msg(format!("{path}.kind"), "must provide a kind"));
    }
    match parse_group_version(&reference.api_version) {
        Err(e) => errs.push(FieldError::invalid_rendered(
            path,
            &go_json(reference),
            &format!("cannot determine GroupVersionKind for specified reference: {e}"),
        )),
        Ok((group, version)) => {
            let gvk = format!("{group}/{version}, Kind={}", reference.kind);
            if !ALLOWED_GVKS.contains(&gvk.as_str()) {
                errs.push(FieldError::not_supported(path, &gvk, ALLOWED_GVKS));
            }
        }
    }
    if reference.name.is_empty() {
        errs.push(FieldError::required_msg(format!("{path}.name"), "must provide a name"));
    }
    errs
}

/// apimachinery's `schema.ParseGroupVersion`: `""` and `"/"` are the empty group version, so `"/v1"` names the core
/// group just as `"v1"` does.
fn parse_group_version(gv: &str) -> Result<(&str, &str), UnexpectedGroupVersion<'_>> {
    if gv.is_empty() || gv == "/" {
        return Ok(("", ""));
    }
    match gv.split_once('/') {
        None => Ok(("", gv)),
        Some((group, version)) if !version.contains('/') => Ok((group, version)),
        Some(_) => Err(UnexpectedGroupVersion(gv)),
    }
}

/// An apiVersion with more than one `/`, in apimachinery's words.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("unexpected GroupVersion string: {0}")]
struct UnexpectedGroupVersion<'a>(&'a str);

/// A reference as apimachinery puts a struct in an Invalid message: `encoding/json` of the Go struct (field order
/// kind, name, apiVersion; apiVersion omitted when empty, as the struct's serde attributes give).
fn go_json(reference: &CrossVersionObjectReference) -> String {
    crate::api::go_json(reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn spec(v: Value) -> ShootStateSpec {
        serde_json::from_value(v).expect("spec")
    }

    fn causes(errs: &[FieldError]) -> Vec<(&str, &str)> {
        errs.iter().map(|e| (e.reason.as_str(), e.field.as_str())).collect()
    }

    #[test]
    fn gardener_names_are_required_but_not_unique() {
        let errs = validate_spec(&spec(json!({"gardener": [{"name": "ca"}, {"name": ""}, {"name": "ca"}]})));
        assert_eq!(causes(&errs), [("FieldValueInvalid", "spec.gardener[1].name")]);
        assert_eq!(
            errs[0].message,
            "spec.gardener[1].name: Invalid value: \"\": name of data required to generate resources cannot be empty"
        );
    }

    #[test]
    fn extension_kind_and_purpose() {
        let errs = validate_spec(&spec(json!({"extensions": [{"kind": "", "purpose": ""}, {"kind": "Worker"}]})));
        assert_eq!(
            causes(&errs),
            [("FieldValueInvalid", "spec.extensions[0].kind"), ("FieldValueInvalid", "spec.extensions[0].purpose")]
        );
        assert_eq!(
            errs[1].message,
            "spec.extensions[0].purpose: Invalid value: \"\": extension resource purpose cannot be empty"
        );
    }

    /// An empty reference: Gardener's five errors, in its order, with its messages; at `spec.resources`, not under
    /// the extension.
    #[test]
    fn empty_extension_reference() {
        let errs =
            validate_spec(&spec(json!({"extensions": [{"kind": "Worker"}, {"kind": "Worker", "resources": [{}]}]})));
        let messages: Vec<&str> = errs.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "spec.resources[0].name: Required value: field must not be empty",
                "spec.resources[0].resourceRef.apiVersion: Required value: must provide an apiVersion",
                "spec.resources[0].resourceRef.kind: Required value: must provide a kind",
                "spec.resources[0].resourceRef: Unsupported value: \"/, Kind=\": supported values: \"/v1, Kind=Secret\", \"/v1, Kind=ConfigMap\"",
                "spec.resources[0].resourceRef.name: Required value: must provide a name",
            ]
        );
        assert_eq!(errs[3].reason, "FieldValueNotSupported");
    }

    #[test]
    fn duplicate_names_within_one_extension_only() {
        let secret = |n: &str| json!({"name": n, "resourceRef": {"apiVersion": "v1", "kind": "Secret", "name": "s"}});
        let errs = validate_spec(&spec(json!({"extensions": [
            {"kind": "A", "resources": [secret("r"), secret("r")]},
            {"kind": "B", "resources": [secret("r")]},
        ]})));
        assert_eq!(causes(&errs), [("FieldValueDuplicate", "spec.resources[1].name")]);
        assert_eq!(errs[0].message, "spec.resources[1].name: Duplicate value: \"r\"");
    }

    #[test]
    fn references_to_other_kinds() {
        let with = |api_version: &str, kind: &str| {
            validate_spec(&spec(json!({"resources": [{"apiVersion": api_version, "kind": kind, "name": "x"}]})))
        };
        assert!(with("v1", "Secret").is_empty());
        assert!(with("v1", "ConfigMap").is_empty());
        // "/v1" parses as the core group, as apimachinery parses it.
        assert!(with("/v1", "ConfigMap").is_empty());
        let errs = with("apps/v1", "Deployment");
        assert_eq!(causes(&errs), [("FieldValueNotSupported", "spec.resources[0]")]);
        assert_eq!(
            errs[0].message,
            "spec.resources[0]: Unsupported value: \"apps/v1, Kind=Deployment\": supported values: \"/v1, Kind=Secret\", \"/v1, Kind=ConfigMap\""
        );
        assert_eq!(causes(&with("v1", "secret")), [("FieldValueNotSupported", "spec.resources[0]")]);
        let errs = with("a/b/<c>", "Secret");
        assert_eq!(causes(&errs), [("FieldValueInvalid", "spec.resources[0]")]);
        assert_eq!(
            errs[0].message,
            "spec.resources[0]: Invalid value: {\"kind\":\"Secret\",\"name\":\"x\",\"apiVersion\":\"a/b/\\u003cc\\u003e\"}: cannot determine GroupVersionKind for specified reference: unexpected GroupVersion string: a/b/<c>"
        );
    }

    #[test]
    fn top_level_resources() {
        let errs = validate_spec(&spec(json!({"resources": [{"kind": "Secret", "data": {}}]})));
        assert_eq!(
            causes(&errs),
            [
                ("FieldValueRequired", "spec.resources[0].apiVersion"),
                ("FieldValueNotSupported", "spec.resources[0]"),
                ("FieldValueRequired", "spec.resources[0].name"),
            ]
        );
    }

    #[test]
    fn group_versions() {
        assert_eq!(parse_group_version(""), Ok(("", "")));
        assert_eq!(parse_group_version("/"), Ok(("", "")));
        assert_eq!(parse_group_version("v1"), Ok(("", "v1")));
        assert_eq!(parse_group_version("apps/v1"), Ok(("apps", "v1")));
        assert_eq!(parse_group_version("apps/"), Ok(("apps", "")));
        assert!(parse_group_version("a/b/c").is_err());
    }
}

//! Namespace (core `v1`), served only when the server stands alone: then kubectl talks to nothing else, and what it
//! asks of the core group must have kube-apiserver's answers (its lookup of a namespace after a namespaced object
//! was not found, `kubectl get namespaces`, a `kind: List` file with a Namespace in it). Behind kube-apiserver's
//! aggregator the core group is kube-apiserver's, and this kind is not served at all (see
//! [`AppState::new`](crate::server::AppState::new)).
//!
//! As kube-apiserver with its `NamespaceAutoProvision` admission plugin: creating an object in a namespace that
//! does not exist creates the namespace (see `server::namespaces`), so the namespaces are at least those in use.

use crate::error::FieldError;
use crate::go_decode;
use crate::registry::strategy::{Column, Kind, KindInfo};
use crate::validation::qualified_name;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The label kube-apiserver gives every namespace: its name, so that selectors can pick namespaces by name.
pub const LABEL_METADATA_NAME: &str = "kubernetes.io/metadata.name";
/// The finalizer kube-apiserver puts in every new namespace's spec: its contents are deleted before it goes.
pub const FINALIZER_KUBERNETES: &str = "kubernetes";
pub const PHASE_ACTIVE: &str = "Active";
/// The finalizers a namespace may carry without a prefix (pkg/apis/core/helper's `standardFinalizers`).
const STANDARD_FINALIZERS: &[&str] = &[FINALIZER_KUBERNETES, "orphan", "foregroundDeletion"];

/// Namespace provides a scope for Names. Use of multiple namespaces is optional.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.core.v1.Namespace")]
pub struct Namespace {
    /// Standard object's metadata.
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// Spec defines the behavior of the Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<NamespaceSpec>,
    /// Status describes the current status of a Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NamespaceStatus>,
}

/// NamespaceSpec describes the attributes on a Namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.core.v1.NamespaceSpec")]
pub struct NamespaceSpec {
    /// Finalizers is an opaque list of values that must be empty to permanently remove object from storage.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
}

/// NamespaceStatus is information about the current status of a Namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.core.v1.NamespaceStatus")]
pub struct NamespaceStatus {
    /// Phase is the current lifecycle phase of the namespace: Active or Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Represents the latest available observations of a namespace's current state.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<NamespaceCondition>,
}

/// NamespaceCondition contains details about state of namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.core.v1.NamespaceCondition")]
pub struct NamespaceCondition {
    /// Type of namespace controller condition.
    #[serde(rename = "type", default, deserialize_with = "go_decode::null_as_default")]
    pub type_: String,
    /// Status of the condition, one of True, False, Unknown.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub status: String,
    /// Last time the condition transitioned from one status to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Unique, one-word, CamelCase reason for the condition's last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message indicating details about last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

static INFO: KindInfo = KindInfo {
    group: "",
    kind: "Namespace",
    list_kind: "NamespaceList",
    plural: "namespaces",
    singular: "namespace",
    namespaced: false,
    short_names: &["ns"],
    categories: &[],
    versions: &["v1"],
    name_rule: crate::validation::NameRule::Label,
    // kube-apiserver's namespace strategy allows an update without resourceVersion.
    unconditional_update: true,
    create_only: false,
    generation: false,
    return_deleted_object: true,
    api_approved: None,
    priority: None,
};

crate::kube_resource!(Namespace, kube::core::ClusterResourceScope);

impl Kind for Namespace {
    const CELLS_READ_METADATA: bool = false;
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = Option<NamespaceStatus>;
    fn replace_status(&mut self, status: Self::Status) -> Self::Status {
        std::mem::replace(&mut self.status, status)
    }
    /// kube-apiserver's defaulting: the name as the `kubernetes.io/metadata.name` label, which no write can change.
    fn defaults(&mut self) {
        if let Some(name) = self.metadata.name.clone().filter(|n| !n.is_empty()) {
            self.metadata.labels.get_or_insert_with(Default::default).insert(LABEL_METADATA_NAME.into(), name);
        }
    }
    /// The namespace strategy's `Canonicalize`: a name generated from generateName, unknown to the defaults, gets
    /// its label too.
    fn canonicalize(&mut self) {
        self.defaults();
    }
    /// As kube-apiserver's namespace strategy: a new namespace is Active and carries the `kubernetes` finalizer.
    fn prepare_for_create(&mut self) {
        self.status = Some(NamespaceStatus { phase: Some(PHASE_ACTIVE.into()), conditions: Vec::new() });
        let finalizers = &mut self.spec.get_or_insert_with(Default::default).finalizers;
        if !finalizers.iter().any(|f| f == FINALIZER_KUBERNETES) {
            finalizers.push(FINALIZER_KUBERNETES.into());
        }
    }
    /// kube-apiserver's `ValidateNamespace` (pkg/apis/core/validation/validation.go) beyond the metadata: each
    /// finalizer a qualified name, and a standard one when it has no prefix (`validateFinalizerName`), reported at
    /// `spec.finalizers` without an index, as upstream reports it. A `null` finalizer decodes to "", as in Go.
    fn validate(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        for f in self.spec.iter().flat_map(|spec| &spec.finalizers) {
            for msg in qualified_name(f) {
                errs.push(FieldError::invalid("spec.finalizers", f, &msg));
            }
            if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f.as_str()) {
                errs.push(FieldError::invalid(
                    "spec.finalizers",
                    f,
                    "name is neither a standard finalizer name nor is it fully qualified",
                ));
            }
        }
        errs
    }
    /// `ValidateNamespaceUpdate` checks the metadata only (the registry's part).
    fn validate_update(&self, _old: &Self) -> Vec<FieldError> {
        Vec::new()
    }
    fn columns() -> Vec<Column> {
        vec![Column::new("Status", "string", "The status of the namespace").json_path(".status.phase")]
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        vec![Value::from(self.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default())]
    }
}

/// A namespace named `name`, as kube-apiserver's `NamespaceAutoProvision` creates it (the rest is defaulted).
pub fn provisioned(name: &str) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_namespaces_are_active_labelled_and_finalized() {
        let mut ns: Namespace = serde_json::from_value(provisioned("garden-dev")).expect("decode");
        ns.defaults();
        ns.prepare_for_create();
        let v = serde_json::to_value(&ns).expect("encode");
        assert_eq!(v["metadata"]["labels"][LABEL_METADATA_NAME], "garden-dev");
        assert_eq!(v["spec"]["finalizers"], serde_json::json!(["kubernetes"]));
        assert_eq!(v["status"]["phase"], "Active");
        assert_eq!(ns.cells(chrono::Utc::now()), [Value::from("Active")]);
    }

    /// k8s.io/api/core/v1 Namespace: spec and status are struct values, a `null` finalizer is "" (which
    /// `ValidateNamespace` refuses at `spec.finalizers`), a `null` condition the zero condition.
    #[test]
    fn missing_and_null_fields_decode_as_go_and_finalizers_validate() {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"}, "spec": {"finalizers": [null, "kubernetes", "example.com/x", "custom"]},
            "status": {"phase": null, "conditions": [null, {"type": null, "status": null}]},
        }))
        .expect("decodes");
        assert_eq!(ns.spec.as_ref().map(|s| s.finalizers[0].as_str()), Some(""));
        let status = ns.status.clone().expect("status");
        assert_eq!(status.conditions, [NamespaceCondition::default(), NamespaceCondition::default()]);
        let errs: Vec<String> = ns.validate().into_iter().map(|e| e.message).collect();
        assert!(errs.iter().all(|m| m.starts_with("spec.finalizers: Invalid value: ")), "{errs:?}");
        assert!(errs.contains(&"spec.finalizers: Invalid value: \"\": name part must be non-empty".to_string()));
        for bad in ["\"\"", "\"custom\""] {
            let want = format!("spec.finalizers: Invalid value: {bad}: name is neither a standard finalizer name nor is it fully qualified");
            assert!(errs.contains(&want), "{want} not in {errs:?}");
        }
        // An update checks the metadata only, as ValidateNamespaceUpdate does.
        assert!(ns.validate_update(&ns).is_empty());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": null, "spec": null, "status": null}))
            .expect("decodes");
        assert_eq!(ns, Namespace::default());
    }
}

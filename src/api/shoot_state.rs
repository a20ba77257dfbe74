//! ShootState (core.gardener.cloud v1alpha1 and v1beta1, the same JSON): the state Gardener needs to move a
//! shoot's control plane to another seed. Namespaced, no status; validation as gardener-apiserver's.

use crate::error::FieldError;
use crate::go_decode;
use crate::registry::strategy::{Column, Kind, KindInfo, NoStatus};
use crate::validation::NameRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

mod validation;

/// ShootState contains the state of a Shoot cluster required to migrate the Shoot's control plane to a new Seed.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.github.gardener.gardener.pkg.apis.core.v1beta1.ShootState")]
pub struct ShootState {
    /// Standard object metadata. The name is a DNS label (the Shoot's name).
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// Specification of the ShootState.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub spec: ShootStateSpec,
}

/// ShootStateSpec is the specification of the ShootState.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.github.gardener.gardener.pkg.apis.core.v1beta1.ShootStateSpec")]
pub struct ShootStateSpec {
    /// Gardener holds the data required to generate resources deployed by the gardenlet.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    // Merged by name, as Gardener declares it (patchMergeKey=name, patchStrategy=merge).
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"], "x-kubernetes-patch-merge-key" = "name", "x-kubernetes-patch-strategy" = "merge"))]
    pub gardener: Vec<GardenerResourceData>,
    /// Extensions holds the state of custom resources reconciled by extension controllers in the seed.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    // Gardener declares no list type (several states may share a kind): one value.
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub extensions: Vec<ExtensionResourceState>,
    /// Resources holds the data of resources referred to by extension controller states.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub resources: Vec<ResourceData>,
}

/// GardenerResourceData holds the data which is used to generate resources, deployed in the Shoot's control plane.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[schemars(rename = "com.github.gardener.gardener.pkg.apis.core.v1beta1.GardenerResourceData")]
pub struct GardenerResourceData {
    /// Name of the object required to generate resources.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub name: String,
    /// Type of the object ("secret", "machine-state", ...).
    #[serde(default, rename = "type", deserialize_with = "go_decode::null_as_default")]
    pub type_: String,
    /// Data contains the payload required to generate resources.
    #[serde(default)]
    #[schemars(extend("type" = "object", "x-kubernetes-preserve-unknown-fields" = true))]
    pub data: Value,
    /// Labels are labels of the object.
    #[serde(default, deserialize_with = "go_decode::map", skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// ExtensionResourceState contains the kind of the extension custom resource and its last observed state.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.github.gardener.gardener.pkg.apis.core.v1beta1.ExtensionResourceState")]
pub struct ExtensionResourceState {
    /// Kind (type) of the extension custom resource.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub kind: String,
    /// Name of the extension custom resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Purpose of the extension custom resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
    /// State of the extension resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("type" = "object", "x-kubernetes-preserve-unknown-fields" = true))]
    pub state: Option<Value>,
    /// Resources holds a list of named resource references that can be referred to in the state by their names.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<NamedResourceReference>,
}

/// NamedResourceReference is a named reference to a resource.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.github.gardener.gardener.pkg.apis.core.v1beta1.NamedResourceReference")]
pub struct NamedResourceReference {
    /// Name of the resource reference.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub name: String,
    /// ResourceRef is a reference to a resource.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub resource_ref: CrossVersionObjectReference,
}

/// CrossVersionObjectReference contains enough information to let you identify the referred resource.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.autoscaling.v1.CrossVersionObjectReference")]
pub struct CrossVersionObjectReference {
    /// Kind of the referent.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub kind: String,
    /// Name of the referent.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub name: String,
    /// API version of the referent.
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub api_version: String,
}

/// ResourceData holds the data of a resource referred to by an extension controller state.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.github.gardener.gardener.pkg.apis.core.v1beta1.ResourceData")]
pub struct ResourceData {
    /// Kind of the referent.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub kind: String,
    /// Name of the referent.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub name: String,
    /// API version of the referent.
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Data of the resource.
    #[serde(default)]
    #[schemars(extend("type" = "object", "x-kubernetes-preserve-unknown-fields" = true))]
    pub data: Value,
}

static INFO: KindInfo = KindInfo {
    group: "core.gardener.cloud",
    kind: "ShootState",
    list_kind: "ShootStateList",
    plural: "shootstates",
    singular: "shootstate",
    namespaced: true,
    short_names: &[],
    // As Gardener declares it, so that `kubectl get all` lists ShootStates.
    categories: &["all"],
    versions: &["v1beta1", "v1alpha1"],
    name_rule: NameRule::Label,
    unconditional_update: false,
    create_only: false,
    generation: true,
    return_deleted_object: false,
    api_approved: None,
    priority: None,
};

/// Bytes as kubectl users read sizes: 512B, 12Ki, 1.5Mi.
fn human_bytes(n: usize) -> String {
    const KI: f64 = 1024.0;
    let f = n as f64;
    if f < KI {
        format!("{n}B")
    } else if f < KI * KI {
        format!("{:.1}Ki", f / KI).replace(".0Ki", "Ki")
    } else {
        format!("{:.1}Mi", f / KI / KI).replace(".0Mi", "Mi")
    }
}

crate::kube_resource!(ShootState, kube::core::NamespaceResourceScope);

impl Kind for ShootState {
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = NoStatus;
    fn replace_status(&mut self, status: NoStatus) -> NoStatus {
        status
    }
    fn validate(&self) -> Vec<FieldError> {
        validation::validate_spec(&self.spec)
    }
    /// `ValidateShootStateUpdate` runs `ValidateShootState` on the new object, `ValidateObjectMeta` with
    /// `NameIsDNSLabel` included.
    const UPDATE_NAME_RULE: NameRule = NameRule::Label;
    fn columns() -> Vec<Column> {
        vec![
            Column::new("Gardener Data", "integer", "Number of gardener data entries."),
            Column::new("Extensions", "integer", "Number of extension resource states."),
            Column::new("Size", "string", "Size of the object as stored (JSON)."),
            // Wide only: the resources extension states refer to.
            Column::new("Resources", "integer", "Number of resource data entries.").wide(),
        ]
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        // The size as stored, which has no resourceVersion (`"resourceVersion":"<rv>",` is taken off when the
        // object is the one served), so that every list path shows the same size.
        let served_rv =
            self.metadata.resource_version.as_ref().map_or(0, |rv| r#""resourceVersion":"","#.len() + rv.len());
        let mut counted = ByteCount(0);
        let size = match serde_json::to_writer(&mut counted, self) {
            Ok(()) => counted.0.saturating_sub(served_rv),
            Err(_) => 0,
        };
        vec![
            Value::from(self.spec.gardener.len()),
            Value::from(self.spec.extensions.len()),
            Value::from(human_bytes(size)),
            Value::from(self.spec.resources.len()),
        ]
    }
}

/// Counts the bytes written to it: the size of a serialisation without building it (a Table row per object).
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(10), "10B");
        assert_eq!(human_bytes(2048), "2Ki");
        assert_eq!(human_bytes(1536 * 1024), "1.5Mi");
    }

    /// gardener's pkg/apis/core/v1beta1/types_shootstate.go: the entries' names, types, kinds and references are
    /// Go values (zero when missing or `null`, then reported by Gardener's validation); `name`, `purpose` and `state`
    /// of an extension are pointers; `data` is a RawExtension value, whose `null` stays null.
    #[test]
    fn missing_and_null_fields_decode_as_go() {
        let s: ShootState =
            serde_json::from_value(serde_json::json!({"metadata": null, "spec": null})).expect("decodes");
        assert_eq!(s, ShootState::default());
        let s: ShootState = serde_json::from_value(serde_json::json!({"spec": {
            "gardener": [null, {"name": null, "type": null, "data": null, "labels": {"a": null}}],
            "extensions": [{"kind": "Worker", "name": null, "purpose": null, "state": null,
                            "resources": [{"name": "r", "resourceRef": null}]}],
            "resources": [null],
        }}))
        .expect("decodes");
        assert_eq!(s.spec.gardener[0], GardenerResourceData::default());
        assert_eq!(s.spec.gardener[1].labels, BTreeMap::from([("a".to_string(), String::new())]));
        let extension = &s.spec.extensions[0];
        assert_eq!((&extension.name, &extension.purpose, &extension.state), (&None, &None, &None));
        assert_eq!(extension.resources[0].resource_ref, CrossVersionObjectReference::default());
        assert_eq!(s.spec.resources, [ResourceData::default()]);
        let fields: Vec<String> = s.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.gardener[0].name",
                "spec.gardener[1].name",
                "spec.resources[0].resourceRef.apiVersion",
                "spec.resources[0].resourceRef.kind",
                "spec.resources[0].resourceRef",
                "spec.resources[0].resourceRef.name",
                "spec.resources[0].apiVersion",
                "spec.resources[0].kind",
                "spec.resources[0]",
                "spec.resources[0].name",
            ]
        );
    }
}

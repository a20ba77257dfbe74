//! CSITranslation (migration.k8s.io/v1alpha1): a create-only virtual resource, like TokenReview. Creating one
//! translates the object in its spec with the CSI translation library ([`crate::csi`]) — or repairs a volume handle,
//! the library's `RepairVolumeHandle` — and answers with the result in its status; nothing is stored. A translation failure is a status with `error` (201, like a TokenReview that
//! does not authenticate); a request that cannot be translated as asked is 422.

use crate::csi;
use crate::error::FieldError;
use crate::registry::strategy::{Column, Kind, KindInfo, NoStatus};
use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const TO_CSI: &str = "ToCSI";
pub const TO_IN_TREE: &str = "ToInTree";

/// A translation between an in-tree volume plugin and its CSI driver, computed on create and never stored.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.CSITranslation")]
pub struct CSITranslation {
    /// Standard object metadata (the name is optional: nothing is stored).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What to translate: exactly one of persistentVolume, inlineVolume, storageClass or repairVolumeHandle.
    #[serde(default)]
    pub spec: CSITranslationSpec,
    /// The translation, filled by the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CSITranslationStatus>,
}

/// What to translate.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.CSITranslationSpec")]
pub struct CSITranslationSpec {
    /// ToCSI (default): an in-tree PersistentVolume, inline volume or StorageClass to CSI. ToInTree: a CSI
    /// PersistentVolume back to the in-tree plugin its driver supersedes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    /// A PersistentVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume: Option<PersistentVolume>,
    /// A volume of a pod spec (spec.volumes[]), translated to a PersistentVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_volume: Option<Volume>,
    /// The namespace of the pod of inlineVolume: Azure File reads its secret there ("default" when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// An in-tree StorageClass; its provisioner names the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<StorageClass>,
    /// A CSI volume handle to complete from the node it attaches to (the library's RepairVolumeHandle, as the
    /// external attacher uses it to match VolumeAttachments): the answer is status.volumeHandle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_volume_handle: Option<VolumeHandleRepair>,
}

/// The arguments of RepairVolumeHandle(driverName, volumeHandle, nodeID).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.VolumeHandleRepair")]
pub struct VolumeHandleRepair {
    /// The CSI driver of the volume, e.g. pd.csi.storage.gke.io (a driver that supersedes no in-tree plugin is a
    /// translation error).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub driver_name: String,
    /// The handle, e.g. projects/UNSPECIFIED/zones/UNSPECIFIED/disks/data (GCE PD handles translated from in-tree
    /// leave the project, and without a zone label the zone, UNSPECIFIED).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume_handle: String,
    /// The node's ID as its CSI driver reports it (CSINode spec.drivers[].nodeID), e.g.
    /// projects/my-project/zones/europe-west1-b/instances/node-1. Only GCE PD reads it.
    #[serde(default, rename = "nodeID", skip_serializing_if = "String::is_empty")]
    pub node_id: String,
}

/// The result of the translation.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.CSITranslationStatus")]
pub struct CSITranslationStatus {
    /// The in-tree plugin, e.g. kubernetes.io/gce-pd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_tree_plugin_name: Option<String>,
    /// The CSI driver that supersedes it, e.g. pd.csi.storage.gke.io.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_name: Option<String>,
    /// The translated PersistentVolume (for persistentVolume and inlineVolume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume: Option<PersistentVolume>,
    /// The translated StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<StorageClass>,
    /// The repaired volume handle (for repairVolumeHandle); the handle as it was when the driver has nothing to
    /// fill in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    /// Why the object could not be translated (the translation library's message); the other fields are then
    /// empty, except the plugin and driver when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

static INFO: KindInfo = KindInfo {
    group: "migration.k8s.io",
    kind: "CSITranslation",
    list_kind: "CSITranslationList",
    plural: "csitranslations",
    singular: "csitranslation",
    namespaced: false,
    short_names: &[],
    categories: &[],
    versions: &["v1alpha1"],
    name_rule: crate::validation::NameRule::Subdomain,
    unconditional_update: false,
    create_only: true,
    generation: false,
    return_deleted_object: false,
    api_approved: Some(crate::api::STORAGE_VERSION_MIGRATOR_API),
    priority: None,
};

impl CSITranslation {
    fn direction(&self) -> &str {
        self.spec.direction.as_deref().unwrap_or(TO_CSI)
    }

    /// What the spec holds, for the printer column.
    fn source(&self) -> &'static str {
        let s = &self.spec;
        match (&s.persistent_volume, &s.inline_volume, &s.storage_class, &s.repair_volume_handle) {
            (Some(_), _, _, _) => "PersistentVolume",
            (_, Some(_), _, _) => "InlineVolume",
            (_, _, Some(_), _) => "StorageClass",
            (_, _, _, Some(_)) => "VolumeHandle",
            _ => "",
        }
    }

    /// The translation of a valid spec.
    pub fn translate(&self) -> CSITranslationStatus {
        let s = &self.spec;
        let to_csi = self.direction() == TO_CSI;
        let mut status = CSITranslationStatus::default();
        let plugin = if let Some(pv) = &s.persistent_volume {
            if to_csi {
                csi::in_tree_plugin_name_from_spec(Some(pv), None).ok().and_then(csi::plugin_by_in_tree_name)
            } else {
                pv.spec.as_ref().and_then(|s| s.csi.as_ref()).and_then(|c| csi::plugin_by_driver_name(&c.driver))
            }
        } else if let Some(v) = &s.inline_volume {
            csi::in_tree_plugin_name_from_spec(None, Some(v)).ok().and_then(csi::plugin_by_in_tree_name)
        } else if let Some(r) = &s.repair_volume_handle {
            csi::plugin_by_driver_name(&r.driver_name)
        } else {
            s.storage_class.as_ref().and_then(|sc| csi::plugin_by_in_tree_name(&sc.provisioner))
        };
        if let Some(p) = plugin {
            status.in_tree_plugin_name = Some(p.in_tree_plugin_name().to_string());
            status.driver_name = Some(p.csi_driver_name().to_string());
        }
        let result = if let Some(pv) = &s.persistent_volume {
            let out = if to_csi { csi::translate_in_tree_pv_to_csi(pv) } else { csi::translate_csi_pv_to_in_tree(pv) };
            out.map(|pv| status.persistent_volume = Some(pv))
        } else if let Some(v) = &s.inline_volume {
            csi::translate_in_tree_inline_volume_to_csi(v, s.pod_namespace.as_deref().unwrap_or_default())
                .map(|pv| status.persistent_volume = Some(pv))
        } else if let Some(sc) = &s.storage_class {
            csi::translate_in_tree_storage_class_to_csi(&sc.provisioner, sc).map(|sc| status.storage_class = Some(sc))
        } else if let Some(r) = &s.repair_volume_handle {
            csi::repair_volume_handle(&r.driver_name, &r.volume_handle, &r.node_id)
                .map(|h| status.volume_handle = Some(h))
        } else {
            Ok(())
        };
        if let Err(e) = result {
            status.error = Some(e.0);
        }
        status
    }
}

crate::kube_resource!(CSITranslation, kube::core::ClusterResourceScope);

impl Kind for CSITranslation {
    const CELLS_READ_METADATA: bool = false;
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = NoStatus;
    fn replace_status(&mut self, status: NoStatus) -> NoStatus {
        status
    }
    /// The status of a request is not the client's: it is the answer, which replaces it.
    fn prepare_for_create(&mut self) {
        self.status = None;
    }
    fn defaults(&mut self) {
        if self.spec.direction.as_deref().unwrap_or_default().is_empty() {
            self.spec.direction = Some(TO_CSI.to_string());
        }
    }
    fn validate(&self) -> Vec<FieldError> {
        let s = &self.spec;
        let mut errs = Vec::new();
        let given: Vec<&str> = [
            ("persistentVolume", s.persistent_volume.is_some()),
            ("inlineVolume", s.inline_volume.is_some()),
            ("storageClass", s.storage_class.is_some()),
            ("repairVolumeHandle", s.repair_volume_handle.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, set)| set.then_some(f))
        .collect();
        match given.as_slice() {
            [] => errs.push(FieldError::required_msg(
                "spec",
                "exactly one of spec.persistentVolume, spec.inlineVolume, spec.storageClass or spec.repairVolumeHandle \
                 is required",
            )),
            [_] => {}
            [first, rest @ ..] => {
                for f in rest {
                    errs.push(FieldError::forbidden(
                        format!("spec.{f}"),
                        &format!("may not be specified together with spec.{first}: translate one object at a time"),
                    ));
                }
            }
        }
        let direction = self.direction();
        if direction != TO_CSI && direction != TO_IN_TREE {
            errs.push(FieldError::not_supported("spec.direction", direction, &[TO_CSI, TO_IN_TREE]));
        } else if direction == TO_IN_TREE && s.persistent_volume.is_none() && given.len() == 1 {
            errs.push(FieldError::invalid(
                "spec.direction",
                direction,
                "only a spec.persistentVolume translates from CSI back to in-tree",
            ));
        }
        if let Some(ns) = &s.pod_namespace {
            if s.inline_volume.is_none() {
                errs.push(FieldError::forbidden("spec.podNamespace", "only allowed with spec.inlineVolume"));
            } else if !ns.is_empty() {
                for e in crate::validation::dns1123_label(ns) {
                    errs.push(FieldError::invalid("spec.podNamespace", ns, &e));
                }
            }
        }
        if direction == TO_IN_TREE {
            if let Some(pv) = &s.persistent_volume {
                if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_none() {
                    errs.push(FieldError::required_msg(
                        "spec.persistentVolume.spec.csi",
                        "a PersistentVolume translated to in-tree needs a CSI source",
                    ));
                }
            }
        }
        errs
    }
    fn respond(&mut self) {
        self.status = Some(self.translate());
    }
    fn columns() -> Vec<Column> {
        vec![
            Column::new(
                "Source",
                "string",
                "What was translated: PersistentVolume, InlineVolume, StorageClass or VolumeHandle (a repair).",
            ),
            Column::new("Direction", "string", "ToCSI or ToInTree.").json_path(".spec.direction"),
            Column::new("Plugin", "string", "The in-tree plugin.").json_path(".status.inTreePluginName"),
            Column::new("Driver", "string", "The CSI driver.").json_path(".status.driverName"),
            Column::new("Error", "string", "Why the translation failed.").json_path(".status.error"),
        ]
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        let st = self.status.as_ref();
        vec![
            Value::from(self.source()),
            Value::from(self.direction()),
            Value::from(st.and_then(|s| s.in_tree_plugin_name.clone()).unwrap_or_default()),
            Value::from(st.and_then(|s| s.driver_name.clone()).unwrap_or_default()),
            Value::from(st.and_then(|s| s.error.clone()).unwrap_or_default()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translation(spec: Value) -> CSITranslation {
        let mut t: CSITranslation = serde_json::from_value(serde_json::json!({"spec": spec})).unwrap();
        t.defaults();
        t
    }

    fn fields(t: &CSITranslation) -> Vec<String> {
        t.validate().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn validation_lists_every_field() {
        assert_eq!(fields(&translation(serde_json::json!({}))), ["spec"]);
        let both = translation(serde_json::json!({
            "persistentVolume": {"metadata": {"name": "a"}},
            "storageClass": {"provisioner": "kubernetes.io/gce-pd"},
            "direction": "Sideways",
            "podNamespace": "ns",
        }));
        assert_eq!(fields(&both), ["spec.storageClass", "spec.direction", "spec.podNamespace"]);
        let back = translation(serde_json::json!({"storageClass": {"provisioner": "x"}, "direction": "ToInTree"}));
        assert_eq!(fields(&back), ["spec.direction"]);
        let no_csi = translation(serde_json::json!({"persistentVolume": {"spec": {}}, "direction": "ToInTree"}));
        assert_eq!(fields(&no_csi), ["spec.persistentVolume.spec.csi"]);
    }

    #[test]
    fn translates_into_status() {
        let mut t = translation(
            serde_json::json!({"inlineVolume": {"name": "v", "awsElasticBlockStore": {"volumeID": "aws://z/bad"}}}),
        );
        t.respond();
        let st = t.status.unwrap();
        assert_eq!(st.in_tree_plugin_name.as_deref(), Some("kubernetes.io/aws-ebs"));
        assert_eq!(
            st.error.as_deref(),
            Some("failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://z/bad)")
        );
        assert!(st.persistent_volume.is_none());
    }

    #[test]
    fn repairs_a_volume_handle_into_status() {
        let mut t = translation(serde_json::json!({"repairVolumeHandle": {
            "driverName": "pd.csi.storage.gke.io",
            "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
            "nodeID": "projects/p/zones/europe-west1-b/instances/n"}}));
        assert!(t.validate().is_empty());
        assert_eq!(t.source(), "VolumeHandle");
        t.respond();
        let st = t.status.unwrap();
        assert_eq!(st.volume_handle.as_deref(), Some("projects/p/zones/europe-west1-b/disks/d"));
        assert_eq!(st.in_tree_plugin_name.as_deref(), Some("kubernetes.io/gce-pd"));
        let back = translation(serde_json::json!({"repairVolumeHandle": {"driverName": "x"}, "direction": "ToInTree"}));
        assert_eq!(fields(&back), ["spec.direction"]);
        let mut unknown = translation(serde_json::json!({"repairVolumeHandle": {"driverName": "nfs.csi.k8s.io"}}));
        unknown.respond();
        let st = unknown.status.unwrap();
        assert_eq!(st.error.as_deref(), Some("could not find In-Tree driver name for CSI plugin nfs.csi.k8s.io"));
        assert_eq!((st.volume_handle, st.driver_name), (None, None));
    }
}

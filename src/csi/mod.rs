//! CSI migration: translation of in-tree volume plugins to their CSI drivers and back, behaving like Kubernetes'
//! `k8s.io/csi-translation-lib` (same results, same error messages) for GCE PD, AWS EBS, Azure Disk, Azure File,
//! OpenStack Cinder, vSphere and Portworx. Pure: no I/O. The `CSITranslation` API, the `translate` command and the
//! PV/PVC admission webhook call it.
//!
//! Go's zero values are written as absent (`None`), as Go's `omitempty` does when it encodes, so a translated object
//! serializes as the library's would.

pub mod annotations;
pub mod aws_ebs;
pub mod azure_disk;
pub mod azure_file;
pub mod document;
pub mod gates;
pub mod gce_pd;
pub(crate) mod go;
pub mod openstack_cinder;
pub mod portworx;
pub mod storage_class;
pub mod topology;
pub mod vsphere_volume;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::BTreeMap;

pub const ACCESS_MODE_READ_WRITE_ONCE: &str = "ReadWriteOnce";
pub const ACCESS_MODE_READ_ONLY_MANY: &str = "ReadOnlyMany";
pub const ACCESS_MODE_READ_WRITE_MANY: &str = "ReadWriteMany";
pub const VOLUME_MODE_FILESYSTEM: &str = "Filesystem";

/// A translation failure, worded as csi-translation-lib words it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TranslationError(pub String);

impl TranslationError {
    pub fn new(message: impl Into<String>) -> Self {
        TranslationError(message.into())
    }
}

pub type Result<T> = std::result::Result<T, TranslationError>;

/// The translation of one in-tree plugin (csi-translation-lib's `InTreePlugin`). Translations take the object by
/// value and return the translated one; the top-level functions below work on copies.
pub trait InTreePlugin: Send + Sync {
    /// `kubernetes.io/<plugin>`.
    fn in_tree_plugin_name(&self) -> &'static str;
    /// The CSI driver that supersedes the plugin.
    fn csi_driver_name(&self) -> &'static str;
    /// The feature gate that migrates the plugin (`CSIMigration<Plugin>`).
    fn feature_gate(&self) -> &'static str;
    /// Translates the parameters and allowed topologies of an in-tree StorageClass.
    fn translate_in_tree_storage_class_to_csi(&self, sc: StorageClass) -> Result<StorageClass>;
    /// Translates an inline volume to a PV with a CSI source. `pod_namespace` is only used by Azure File (the
    /// namespace of its secret).
    fn translate_in_tree_inline_volume_to_csi(&self, volume: &Volume, pod_namespace: &str) -> Result<PersistentVolume>;
    fn translate_in_tree_pv_to_csi(&self, pv: PersistentVolume) -> Result<PersistentVolume>;
    fn translate_csi_pv_to_in_tree(&self, pv: PersistentVolume) -> Result<PersistentVolume>;
    /// Whether the PV has this plugin's in-tree source.
    fn can_support(&self, pv: &PersistentVolume) -> bool;
    /// Whether the inline volume has this plugin's in-tree source.
    fn can_support_inline(&self, volume: &Volume) -> bool;
    /// A fully specified volume handle from a node ID (the library's `RepairVolumeHandle`: the external attacher
    /// matches VolumeAttachments by handle). Only GCE PD has anything to fill in; every other plugin answers the
    /// handle as it is.
    fn repair_volume_handle(&self, volume_handle: &str, node_id: &str) -> Result<String> {
        let _ = node_id;
        Ok(volume_handle.to_string())
    }
}

static PLUGINS: [&dyn InTreePlugin; 7] = [
    &gce_pd::GcePersistentDisk,
    &aws_ebs::AwsElasticBlockStore,
    &openstack_cinder::Cinder,
    &azure_disk::AzureDisk,
    &azure_file::AzureFile,
    &vsphere_volume::VsphereVolume,
    &portworx::Portworx,
];

/// Every plugin with migration logic.
pub fn plugins() -> &'static [&'static dyn InTreePlugin] {
    &PLUGINS
}

/// The plugin named `kubernetes.io/<plugin>`.
pub fn plugin_by_in_tree_name(name: &str) -> Option<&'static dyn InTreePlugin> {
    PLUGINS.iter().copied().find(|p| p.in_tree_plugin_name() == name)
}

/// The plugin that the CSI driver `name` supersedes.
pub fn plugin_by_driver_name(name: &str) -> Option<&'static dyn InTreePlugin> {
    PLUGINS.iter().copied().find(|p| p.csi_driver_name() == name)
}

fn plugin_for_pv(pv: &PersistentVolume) -> Option<&'static dyn InTreePlugin> {
    PLUGINS.iter().copied().find(|p| p.can_support(pv))
}

fn plugin_for_inline(volume: &Volume) -> Option<&'static dyn InTreePlugin> {
    PLUGINS.iter().copied().find(|p| p.can_support_inline(volume))
}

/// Translates an in-tree StorageClass of the plugin `in_tree_plugin_name`.
pub fn translate_in_tree_storage_class_to_csi(in_tree_plugin_name: &str, sc: &StorageClass) -> Result<StorageClass> {
    match plugin_by_in_tree_name(in_tree_plugin_name) {
        Some(p) => p.translate_in_tree_storage_class_to_csi(sc.clone()),
        None => Err(TranslationError::new(format!(
            "could not find in-tree storage class parameter translation logic for {}",
            go::quote(in_tree_plugin_name)
        ))),
    }
}

/// Translates an inline volume of a pod in `pod_namespace` to a PV with a CSI source (volume mode Filesystem:
/// inline volumes support nothing else).
pub fn translate_in_tree_inline_volume_to_csi(volume: &Volume, pod_namespace: &str) -> Result<PersistentVolume> {
    let Some(p) = plugin_for_inline(volume) else {
        return Err(TranslationError::new(format!(
            "could not find in-tree plugin translation logic for {}",
            go::quote(&volume.name)
        )));
    };
    let mut pv = p.translate_in_tree_inline_volume_to_csi(volume, pod_namespace)?;
    let spec = spec_mut(&mut pv);
    if spec.volume_mode.is_none() {
        spec.volume_mode = Some(VOLUME_MODE_FILESYSTEM.to_string());
    }
    Ok(pv)
}

/// Translates a PV with an in-tree source to one with a CSI source; `pv` is not modified.
pub fn translate_in_tree_pv_to_csi(pv: &PersistentVolume) -> Result<PersistentVolume> {
    match plugin_for_pv(pv) {
        Some(p) => p.translate_in_tree_pv_to_csi(pv.clone()),
        None => Err(TranslationError::new(format!(
            "could not find in-tree plugin translation logic for {}",
            go::quote(pv.metadata.name.as_deref().unwrap_or_default())
        ))),
    }
}

/// Translates a PV with a CSI source to the in-tree source of the plugin its driver supersedes; `pv` is not
/// modified.
pub fn translate_csi_pv_to_in_tree(pv: &PersistentVolume) -> Result<PersistentVolume> {
    let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return Err(TranslationError::new("CSI persistent volume was nil"));
    };
    match plugin_by_driver_name(&csi.driver) {
        Some(p) => p.translate_csi_pv_to_in_tree(pv.clone()),
        None => {
            Err(TranslationError::new(format!("could not find in-tree plugin translation logic for {}", csi.driver)))
        }
    }
}

/// Whether there is migration logic for the in-tree plugin `name`.
pub fn is_migratable_in_tree_plugin_by_name(name: &str) -> bool {
    plugin_by_in_tree_name(name).is_some()
}

/// Whether the CSI driver `name` supersedes an in-tree plugin.
pub fn is_migrated_csi_driver_by_name(name: &str) -> bool {
    plugin_by_driver_name(name).is_some()
}

/// Whether there is migration logic for the PV's source.
pub fn is_pv_migratable(pv: &PersistentVolume) -> bool {
    plugin_for_pv(pv).is_some()
}

/// Whether there is migration logic for the inline volume's source.
pub fn is_inline_migratable(volume: &Volume) -> bool {
    plugin_for_inline(volume).is_some()
}

/// The in-tree plugin of a PV or, without a PV, of an inline volume.
pub fn in_tree_plugin_name_from_spec(pv: Option<&PersistentVolume>, volume: Option<&Volume>) -> Result<&'static str> {
    match (pv, volume) {
        // Unlike the translations' messages, these name the object with %s (unquoted).
        (Some(pv), _) => plugin_for_pv(pv).map(|p| p.in_tree_plugin_name()).ok_or_else(|| {
            TranslationError::new(format!(
                "could not find in-tree plugin name from persistent volume {}",
                pv.metadata.name.as_deref().unwrap_or_default()
            ))
        }),
        (None, Some(v)) => plugin_for_inline(v)
            .map(|p| p.in_tree_plugin_name())
            .ok_or_else(|| TranslationError::new(format!("could not find in-tree plugin name from volume {}", v.name))),
        (None, None) => Err(TranslationError::new("both persistent volume and volume are nil")),
    }
}

/// The CSI driver that supersedes the in-tree plugin `name`.
pub fn csi_name_from_in_tree_name(name: &str) -> Result<&'static str> {
    plugin_by_in_tree_name(name)
        .map(|p| p.csi_driver_name())
        .ok_or_else(|| TranslationError::new(format!("could not find CSI Driver name for plugin {name}")))
}

/// The in-tree plugin that the CSI driver `name` supersedes.
pub fn in_tree_name_from_csi_name(name: &str) -> Result<&'static str> {
    plugin_by_driver_name(name)
        .map(|p| p.in_tree_plugin_name())
        .ok_or_else(|| TranslationError::new(format!("could not find In-Tree driver name for CSI plugin {name}")))
}

/// A fully specified volume handle of the driver `driver_name`, from the node ID (`RepairVolumeHandle`).
pub fn repair_volume_handle(driver_name: &str, volume_handle: &str, node_id: &str) -> Result<String> {
    match plugin_by_driver_name(driver_name) {
        Some(p) => p.repair_volume_handle(volume_handle, node_id),
        None => Err(TranslationError::new(format!("could not find In-Tree driver name for CSI plugin {driver_name}"))),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Go zero values, for the plugins.

/// A Go string field with `omitempty`: empty is absent.
pub(crate) fn non_empty(s: Option<&String>) -> Option<String> {
    s.filter(|s| !s.is_empty()).cloned()
}

/// A Go bool field with `omitempty`: false is absent.
pub(crate) fn flag(b: Option<bool>) -> Option<bool> {
    b.filter(|b| *b)
}

/// A Go map field with `omitempty`: empty is absent.
pub(crate) fn string_map(m: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!m.is_empty()).then_some(m)
}

pub(crate) fn spec_mut(pv: &mut PersistentVolume) -> &mut PersistentVolumeSpec {
    pv.spec.get_or_insert_with(Default::default)
}

/// A PV named `name` with one access mode and a CSI source: what inline volumes translate to.
pub(crate) fn inline_pv(
    name: String,
    csi: k8s_openapi::api::core::v1::CSIPersistentVolumeSource,
    access_mode: &str,
) -> PersistentVolume {
    PersistentVolume {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta { name: Some(name), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            csi: Some(csi),
            access_modes: Some(vec![access_mode.to_string()]),
            ..Default::default()
        }),
        status: None,
    }
}

//! vSphere volume (`kubernetes.io/vsphere-volume`) <-> `csi.vsphere.vmware.com`.
//!
//! To CSI, the volume handle is the volume path. Back to in-tree, the path comes from the `initialvolumefilepath`
//! attribute that the CSI driver records for volumes it provisioned in migration mode (as upstream: a handle alone
//! is a vSphere volume ID, which the in-tree plugin cannot use). A StorageClass keeps `storagepolicyname`, suffixes
//! the other parameters the driver knows with `-migrationparam`, drops the rest and gets `csimigration: "true"`.
//! Zone and region topology use the driver's two keys; multi-zone values are not split.

use super::storage_class::{parameters, CSI_FS_TYPE_KEY, FS_TYPE_KEY};
use super::topology::{add_topology, replace_topology, topology_labels, topology_values, translate_allowed_topologies};
use super::{inline_pv, non_empty, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_WRITE_ONCE};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, Volume, VsphereVirtualDiskVolumeSource};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::BTreeMap;

pub const DRIVER_NAME: &str = "csi.vsphere.vmware.com";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/vsphere-volume";
pub const TOPOLOGY_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
pub const TOPOLOGY_REGION_KEY: &str = "topology.csi.vmware.com/region";
pub const FEATURE_GATE: &str = "CSIMigrationvSphere";

/// The SPBM storage policy (kept as is).
pub const PARAM_STORAGE_POLICY_NAME: &str = "storagepolicyname";
/// Tells the driver to return the volume path (`initialvolumefilepath`), which the in-tree plugin understands.
pub const PARAM_CSI_MIGRATION: &str = "csimigration";
/// Where the CSI driver records the volume path of a volume it created in migration mode.
pub const ATTRIBUTE_INITIAL_VOLUME_FILEPATH: &str = "initialvolumefilepath";

/// In-tree parameters the driver accepts under a `-migrationparam` name.
const MIGRATION_PARAMS: [&str; 8] = [
    "datastore",
    "diskformat",
    "hostfailurestotolerate",
    "forceprovisioning",
    "cachereservation",
    "diskstripes",
    "objectspacereservation",
    "iopslimit",
];

pub struct VsphereVolume;

fn csi_source(volume: &VsphereVirtualDiskVolumeSource) -> CSIPersistentVolumeSource {
    let mut attrs = BTreeMap::new();
    if let Some(policy) = volume.storage_policy_name.as_ref().filter(|p| !p.is_empty()) {
        attrs.insert(PARAM_STORAGE_POLICY_NAME.to_string(), policy.clone());
    }
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: volume.volume_path.clone(),
        fs_type: non_empty(volume.fs_type.as_ref()),
        volume_attributes: super::string_map(attrs),
        ..Default::default()
    }
}

fn label(pv: &PersistentVolume, key: &str) -> Option<String> {
    pv.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned()
}

/// In-tree -> CSI: the zone and region keys of the affinity (or, without them, the labels) become the driver's.
fn translate_topology_to_csi(pv: &mut PersistentVolume) {
    let (zone_label, region_label) = topology_labels(pv);
    for (k8s_key, csi_key) in [(zone_label, TOPOLOGY_ZONE_KEY), (region_label, TOPOLOGY_REGION_KEY)] {
        if !topology_values(pv, k8s_key).is_empty() {
            replace_topology(pv, k8s_key, csi_key);
        } else if let Some(value) = label(pv, k8s_key).filter(|v| !v.is_empty()) {
            let _ = add_topology(pv, csi_key, &[value]);
        }
    }
}

/// CSI -> in-tree: the driver's keys become the Kubernetes zone and region keys; labels are added when missing.
fn translate_topology_to_in_tree(pv: &mut PersistentVolume) {
    let (zone_label, region_label) = topology_labels(pv);
    replace_topology(pv, TOPOLOGY_ZONE_KEY, zone_label);
    replace_topology(pv, TOPOLOGY_REGION_KEY, region_label);
    for key in [zone_label, region_label] {
        if let Some(first) = topology_values(pv, key).into_iter().next() {
            pv.metadata.labels.get_or_insert_with(Default::default).entry(key.to_string()).or_insert(first);
        }
    }
}

impl InTreePlugin for VsphereVolume {
    fn in_tree_plugin_name(&self) -> &'static str {
        IN_TREE_PLUGIN_NAME
    }
    fn csi_driver_name(&self) -> &'static str {
        DRIVER_NAME
    }
    fn feature_gate(&self) -> &'static str {
        FEATURE_GATE
    }

    fn translate_in_tree_storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        for (k, v) in sc.parameters.take().unwrap_or_default() {
            let key = super::go::to_lower(&k);
            match key.as_str() {
                FS_TYPE_KEY => {
                    params.insert(CSI_FS_TYPE_KEY.to_string(), v);
                }
                PARAM_STORAGE_POLICY_NAME => {
                    params.insert(PARAM_STORAGE_POLICY_NAME.to_string(), v);
                }
                known if MIGRATION_PARAMS.contains(&known) => {
                    params.insert(format!("{known}-migrationparam"), v);
                }
                // Not supported by the driver: dropped (upstream logs it).
                _ => {}
            }
        }
        // Lets the driver tell a migrated in-tree request from a CSI one.
        params.insert(PARAM_CSI_MIGRATION.to_string(), "true".to_string());
        if let Some(terms) = sc.allowed_topologies.take().filter(|t| !t.is_empty()) {
            sc.allowed_topologies = Some(translate_allowed_topologies(&terms, TOPOLOGY_ZONE_KEY));
        }
        sc.parameters = parameters(params);
        Ok(sc)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let Some(vs) = &volume.vsphere_volume else {
            return Err(TranslationError::new("volume is nil or VsphereVolume not defined on volume"));
        };
        // The name must be unique per disk: it is the unique part of the staging path. With a storage policy,
        // upstream reads it from the new PV's (nil) vSphere source and panics; we carry it, as the PV translation
        // does and as that line meant to.
        Ok(inline_pv(format!("{DRIVER_NAME}-{}", vs.volume_path), csi_source(vs), ACCESS_MODE_READ_WRITE_ONCE))
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(vs) = pv.spec.as_ref().and_then(|s| s.vsphere_volume.clone()) else {
            return Err(TranslationError::new("pv is nil or VsphereVolume not defined on pv"));
        };
        translate_topology_to_csi(&mut pv);
        let spec = spec_mut(&mut pv);
        spec.vsphere_volume = None;
        spec.csi = Some(csi_source(&vs));
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let vs = VsphereVirtualDiskVolumeSource {
            fs_type: non_empty(csi.fs_type.as_ref()),
            volume_path: csi
                .volume_attributes
                .as_ref()
                .and_then(|a| a.get(ATTRIBUTE_INITIAL_VOLUME_FILEPATH))
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        };
        translate_topology_to_in_tree(&mut pv);
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.vsphere_volume = Some(vs);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.vsphere_volume.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.vsphere_volume.is_some()
    }
}

//! OpenStack Cinder (`kubernetes.io/cinder`) <-> `cinder.csi.openstack.org`.
//!
//! The volume handle is the Cinder volume ID. Topology is translated, but no region is derived on the way back: a
//! Cinder region cannot be guessed from a zone.

use super::storage_class::{self, Rules};
use super::topology::{translate_topology_from_csi_to_in_tree, translate_topology_from_in_tree_to_csi};
use super::{
    flag, inline_pv, non_empty, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_WRITE_ONCE,
};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;

pub const DRIVER_NAME: &str = "cinder.csi.openstack.org";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/cinder";
pub const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
pub const FEATURE_GATE: &str = "CSIMigrationOpenStack";

pub struct Cinder;

fn csi_source(volume_id: &str, fs_type: Option<&String>, read_only: Option<bool>) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: volume_id.to_string(),
        read_only: flag(read_only),
        fs_type: non_empty(fs_type),
        // Upstream writes an empty attribute map, which is not encoded.
        volume_attributes: None,
        ..Default::default()
    }
}

impl InTreePlugin for Cinder {
    fn in_tree_plugin_name(&self) -> &'static str {
        IN_TREE_PLUGIN_NAME
    }
    fn csi_driver_name(&self) -> &'static str {
        DRIVER_NAME
    }
    fn feature_gate(&self) -> &'static str {
        FEATURE_GATE
    }

    /// `fstype` becomes the CSI parameter; every other parameter (`availability` too) is the driver's as well, and
    /// explicit allowed topologies move to the driver's key.
    fn translate_in_tree_storage_class_to_csi(&self, sc: StorageClass) -> Result<StorageClass> {
        storage_class::translate(
            sc,
            Rules { topology_key: TOPOLOGY_KEY, fs_type: true, zones: false, iops_per_gb: false },
        )
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let Some(cinder) = &volume.cinder else {
            return Err(TranslationError::new("volume is nil or Cinder not defined on volume"));
        };
        let csi = csi_source(&cinder.volume_id, cinder.fs_type.as_ref(), cinder.read_only);
        // The name must be unique per disk: it is the unique part of the staging path.
        Ok(inline_pv(format!("{DRIVER_NAME}-{}", cinder.volume_id), csi, ACCESS_MODE_READ_WRITE_ONCE))
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(cinder) = pv.spec.as_ref().and_then(|s| s.cinder.clone()) else {
            return Err(TranslationError::new("pv is nil or Cinder not defined on pv"));
        };
        let csi = csi_source(&cinder.volume_id, cinder.fs_type.as_ref(), cinder.read_only);
        translate_topology_from_in_tree_to_csi(&mut pv, TOPOLOGY_KEY);
        let spec = spec_mut(&mut pv);
        spec.cinder = None;
        spec.csi = Some(csi);
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let cinder = CinderPersistentVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: non_empty(csi.fs_type.as_ref()),
            read_only: flag(csi.read_only),
            secret_ref: None,
        };
        translate_topology_from_csi_to_in_tree(&mut pv, TOPOLOGY_KEY, None)
            .map_err(|e| super::gce_pd::topology_error(&pv, &e.0))?;
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.cinder = Some(cinder);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.cinder.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.cinder.is_some()
    }
}

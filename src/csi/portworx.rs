//! Portworx (`kubernetes.io/portworx-volume`) <-> `pxd.portworx.com`.
//!
//! The volume handle is the Portworx volume ID. As upstream, `readOnly` of the in-tree source is not carried into
//! the CSI source (an inline read-only volume becomes a ReadOnlyMany PV instead), and a StorageClass only changes
//! its provisioner.

use super::{
    inline_pv, non_empty, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_ONLY_MANY,
    ACCESS_MODE_READ_WRITE_ONCE,
};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource, Volume};
use k8s_openapi::api::storage::v1::StorageClass;

pub const DRIVER_NAME: &str = "pxd.portworx.com";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/portworx-volume";
pub const FEATURE_GATE: &str = "CSIMigrationPortworx";

pub struct Portworx;

fn csi_source(px: &PortworxVolumeSource) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: px.volume_id.clone(),
        fs_type: non_empty(px.fs_type.as_ref()),
        ..Default::default()
    }
}

impl InTreePlugin for Portworx {
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
        sc.provisioner = DRIVER_NAME.to_string();
        Ok(sc)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let Some(px) = &volume.portworx_volume else {
            return Err(TranslationError::new("volume is nil or PortworxVolume not defined on volume"));
        };
        let mode = if px.read_only == Some(true) { ACCESS_MODE_READ_ONLY_MANY } else { ACCESS_MODE_READ_WRITE_ONCE };
        Ok(inline_pv(format!("{DRIVER_NAME}-{}", px.volume_id), csi_source(px), mode))
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(px) = pv.spec.as_ref().and_then(|s| s.portworx_volume.clone()) else {
            return Err(TranslationError::new("pv is nil or PortworxVolume not defined on pv"));
        };
        let spec = spec_mut(&mut pv);
        spec.portworx_volume = None;
        spec.csi = Some(csi_source(&px));
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let px = PortworxVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: non_empty(csi.fs_type.as_ref()),
            read_only: super::flag(csi.read_only),
        };
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.portworx_volume = Some(px);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.portworx_volume.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.portworx_volume.is_some()
    }
}

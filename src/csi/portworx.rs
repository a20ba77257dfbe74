//! Portworx (`kubernetes.io/portworx-volume`) <-> `pxd.portworx.com`.
//!
//! The volume handle is the Portworx volume ID. As upstream, `readOnly` of the in-tree source is not carried into
//! the CSI source (an inline read-only volume becomes a ReadOnlyMany PV instead).
//!
//! The in-tree plugin authenticates with the secret named by `openstorage.io/auth-secret-name` and
//! `openstorage.io/auth-secret-namespace`: StorageClass parameters when provisioning, PV annotations afterwards. The
//! CSI driver gets the secret the CSI way: a StorageClass's two parameters become the `csi.storage.k8s.io/*-secret-*`
//! parameters of every operation the external sidecars run (provisioner, controller publish, node stage, node
//! publish, controller expand, node expand); a PV with both annotations gets that secret as the reference of each
//! operation a PV carries one for (all but provisioning). The way back leaves the references: the in-tree plugin
//! still reads the annotations, which the translation never removes.

use super::{
    go, inline_pv, non_empty, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_ONLY_MANY,
    ACCESS_MODE_READ_WRITE_ONCE,
};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::BTreeMap;

pub const DRIVER_NAME: &str = "pxd.portworx.com";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/portworx-volume";
pub const FEATURE_GATE: &str = "CSIMigrationPortworx";

/// The in-tree secret: StorageClass parameters (matched case-insensitively) and PV annotations (exact).
pub const AUTH_SECRET_NAME_KEY: &str = "openstorage.io/auth-secret-name";
pub const AUTH_SECRET_NAMESPACE_KEY: &str = "openstorage.io/auth-secret-namespace";

/// The external sidecars' operations with a secret, in the order of csi-translation-lib's constants:
/// `csi.storage.k8s.io/<operation>-secret-name` and `-secret-namespace`.
const SECRET_OPERATIONS: [&str; 6] =
    ["provisioner", "controller-publish", "node-stage", "node-publish", "controller-expand", "node-expand"];

pub struct Portworx;

fn csi_source(px: &PortworxVolumeSource) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: px.volume_id.clone(),
        fs_type: non_empty(px.fs_type.as_ref()),
        ..Default::default()
    }
}

/// The secret of a PV with both annotations (present is enough, as `metav1.HasAnnotation`: empty values give an
/// empty reference).
fn annotated_secret(pv: &PersistentVolume) -> Option<SecretReference> {
    let annotations = pv.metadata.annotations.as_ref()?;
    let name = annotations.get(AUTH_SECRET_NAME_KEY)?;
    let namespace = annotations.get(AUTH_SECRET_NAMESPACE_KEY)?;
    Some(SecretReference { name: non_empty(Some(name)), namespace: non_empty(Some(namespace)) })
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

    /// The provisioner becomes the driver; the auth secret parameters become the CSI secret parameters (they win
    /// over the same CSI parameters given verbatim, where Go's result depends on map order); every other parameter
    /// is copied as it is.
    fn translate_in_tree_storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut copied = BTreeMap::new();
        let mut translated = BTreeMap::new();
        for (k, v) in sc.parameters.take().unwrap_or_default() {
            let suffix = match go::to_lower(&k).as_str() {
                AUTH_SECRET_NAME_KEY => "secret-name",
                AUTH_SECRET_NAMESPACE_KEY => "secret-namespace",
                _ => {
                    copied.insert(k, v);
                    continue;
                }
            };
            for op in SECRET_OPERATIONS {
                translated.insert(format!("csi.storage.k8s.io/{op}-{suffix}"), v.clone());
            }
        }
        copied.extend(translated);
        sc.parameters = super::string_map(copied);
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
        let secret = annotated_secret(&pv);
        let csi = CSIPersistentVolumeSource {
            controller_publish_secret_ref: secret.clone(),
            node_stage_secret_ref: secret.clone(),
            node_publish_secret_ref: secret.clone(),
            controller_expand_secret_ref: secret.clone(),
            node_expand_secret_ref: secret,
            ..csi_source(&px)
        };
        let spec = spec_mut(&mut pv);
        spec.portworx_volume = None;
        spec.csi = Some(csi);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_annotation_is_not_a_secret() {
        let mut pv = PersistentVolume::default();
        pv.metadata.annotations = Some([(AUTH_SECRET_NAME_KEY.to_string(), "s".to_string())].into());
        assert_eq!(annotated_secret(&pv), None);
        pv.metadata.annotations.as_mut().unwrap().insert(AUTH_SECRET_NAMESPACE_KEY.into(), String::new());
        assert_eq!(annotated_secret(&pv), Some(SecretReference { name: Some("s".into()), namespace: None }));
    }
}

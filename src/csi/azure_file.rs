//! Azure File (`kubernetes.io/azure-file`) <-> `file.csi.azure.com`.
//!
//! The volume handle is `<resourceGroup>#<account>#<share>#<pvName>#<secretNamespace>`; the account comes from the
//! secret name `azure-storage-account-<account>-secret` (or is the secret name itself), the resource group from the
//! PV annotation `kubernetes.io/azure-file-resource-group`.

use super::{flag, inline_pv, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_WRITE_MANY};
use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use regex::Regex;
use std::collections::BTreeMap;
use std::sync::LazyLock;

pub const DRIVER_NAME: &str = "file.csi.azure.com";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/azure-file";
pub const FEATURE_GATE: &str = "CSIMigrationAzureFile";

const SEPARATOR: char = '#';
pub const ATTR_SHARE_NAME: &str = "sharename";
pub const ATTR_SECRET_NAME: &str = "secretname";
pub const ATTR_SECRET_NAMESPACE: &str = "secretnamespace";
pub const DEFAULT_SECRET_NAMESPACE: &str = "default";
pub const RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";
const SECRET_NAME_FORMAT: &str = "azure-storage-account-(.+)-secret";

static SECRET_NAME_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(SECRET_NAME_FORMAT).expect("valid regex"));

fn volume_id(resource_group: &str, account: &str, share: &str, pv_name: &str, namespace: &str) -> String {
    [resource_group, account, share, pv_name, namespace].join(&SEPARATOR.to_string())
}

/// The storage account of a secret named `azure-storage-account-<account>-secret`.
pub fn storage_account_name(secret_name: &str) -> Result<String> {
    match SECRET_NAME_RE.captures(secret_name).and_then(|c| c.get(1)) {
        Some(m) => Ok(m.as_str().to_string()),
        None => Err(TranslationError::new(format!(
            "could not get account name from {secret_name}, correct format: {SECRET_NAME_FORMAT}"
        ))),
    }
}

/// (resource group, account, share, disk name) of a volume handle.
pub fn file_share_info(id: &str) -> Result<(String, String, String, String)> {
    let segments: Vec<&str> = id.split(SEPARATOR).collect();
    if segments.len() < 3 {
        return Err(TranslationError::new(format!(
            "error parsing volume id: {}, should at least contain two #",
            super::go::quote(id)
        )));
    }
    let disk = segments.get(3).copied().unwrap_or_default();
    Ok((segments[0].into(), segments[1].into(), segments[2].into(), disk.into()))
}

/// The account named by the secret, or (as upstream, which only logs the mismatch) the secret name itself.
fn account_or_secret_name(secret_name: &str) -> String {
    storage_account_name(secret_name).unwrap_or_else(|_| secret_name.to_string())
}

pub struct AzureFile;

impl InTreePlugin for AzureFile {
    fn in_tree_plugin_name(&self) -> &'static str {
        IN_TREE_PLUGIN_NAME
    }
    fn csi_driver_name(&self) -> &'static str {
        DRIVER_NAME
    }
    fn feature_gate(&self) -> &'static str {
        FEATURE_GATE
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: StorageClass) -> Result<StorageClass> {
        Ok(sc)
    }

    fn translate_in_tree_inline_volume_to_csi(&self, volume: &Volume, pod_namespace: &str) -> Result<PersistentVolume> {
        let Some(file) = &volume.azure_file else {
            return Err(TranslationError::new("volume is nil or Azure File not defined on volume"));
        };
        let account = account_or_secret_name(&file.secret_name);
        let namespace = if pod_namespace.is_empty() { DEFAULT_SECRET_NAMESPACE } else { pod_namespace };
        let id = volume_id("", &account, &file.share_name, &volume.name, namespace);
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: id.clone(),
            read_only: flag(file.read_only),
            volume_attributes: Some(BTreeMap::from([(ATTR_SHARE_NAME.to_string(), file.share_name.clone())])),
            node_stage_secret_ref: Some(SecretReference {
                name: super::non_empty(Some(&file.secret_name)),
                namespace: Some(namespace.to_string()),
            }),
            ..Default::default()
        };
        // The name must be unique: it is the unique part of the staging path.
        Ok(inline_pv(id, csi, ACCESS_MODE_READ_WRITE_MANY))
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(file) = pv.spec.as_ref().and_then(|s| s.azure_file.clone()) else {
            return Err(TranslationError::new("pv is nil or Azure File source not defined on pv"));
        };
        let account = account_or_secret_name(&file.secret_name);
        let resource_group = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESOURCE_GROUP_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        // The secret is needed to mount, but no pod can be assumed now: the source's namespace, else the claim's.
        let namespace = match &file.secret_namespace {
            Some(ns) => ns.clone(),
            None => pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|c| c.namespace.clone())
                .unwrap_or_default(),
        };
        if namespace.is_empty() {
            return Err(TranslationError::new(
                "could not find a secret namespace in PersistentVolumeSource or ClaimRef",
            ));
        }
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            node_stage_secret_ref: Some(SecretReference {
                name: super::non_empty(Some(&file.secret_name)),
                namespace: Some(namespace.clone()),
            }),
            read_only: flag(file.read_only),
            volume_attributes: Some(BTreeMap::from([(ATTR_SHARE_NAME.to_string(), file.share_name.clone())])),
            volume_handle: volume_id(&resource_group, &account, &file.share_name, &pv_name, &namespace),
            ..Default::default()
        };
        let spec = spec_mut(&mut pv);
        spec.azure_file = None;
        spec.csi = Some(csi);
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let mut file = AzureFilePersistentVolumeSource { read_only: flag(csi.read_only), ..Default::default() };
        for (k, v) in csi.volume_attributes.iter().flatten() {
            match super::go::to_lower(k).as_str() {
                ATTR_SHARE_NAME => file.share_name = v.clone(),
                ATTR_SECRET_NAME => file.secret_name = v.clone(),
                ATTR_SECRET_NAMESPACE => file.secret_namespace = Some(v.clone()),
                _ => {}
            }
        }
        if let Some(secret) =
            csi.node_stage_secret_ref.as_ref().filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
        {
            file.secret_name = secret.name.clone().unwrap_or_default();
            file.secret_namespace = Some(secret.namespace.clone().unwrap_or_default());
        }
        let mut resource_group = String::new();
        if file.share_name.is_empty() || file.secret_name.is_empty() {
            let (rg, account, share, _) = file_share_info(&csi.volume_handle)?;
            if file.share_name.is_empty() {
                file.share_name = share;
            }
            if file.secret_name.is_empty() {
                file.secret_name = format!("azure-storage-account-{account}-secret");
            }
            resource_group = rg;
        }
        if file.secret_namespace.is_none() {
            file.secret_namespace = Some(DEFAULT_SECRET_NAMESPACE.to_string());
        }
        if !resource_group.is_empty() {
            pv.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(RESOURCE_GROUP_ANNOTATION.to_string(), resource_group);
        }
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.azure_file = Some(file);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.azure_file.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.azure_file.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_like_upstream() {
        assert_eq!(storage_account_name("azure-storage-account-acct-secret").unwrap(), "acct");
        assert_eq!(
            storage_account_name("my-secret").unwrap_err().0,
            "could not get account name from my-secret, correct format: azure-storage-account-(.+)-secret"
        );
        assert_eq!(
            file_share_info("rg#acct#share#disk.vhd").unwrap(),
            ("rg".into(), "acct".into(), "share".into(), "disk.vhd".into())
        );
        assert_eq!(
            file_share_info("rg#acct").unwrap_err().0,
            r#"error parsing volume id: "rg#acct", should at least contain two #"#
        );
    }
}

//! Azure Disk (`kubernetes.io/azure-disk`) <-> `disk.csi.azure.com`.
//!
//! The volume handle is the disk URI, and so is the name of the PV an inline volume becomes (it must be unique per
//! disk: it is the unique part of the staging path). Only managed disks migrate; the CSI attributes carry `kind`
//! (always `Managed`), `cachingmode` and `fstype`. In a StorageClass, a zone value that is a number (`"0"`, `"1"`:
//! what Kubernetes labels nodes with in Azure regions without availability zones) becomes `""`, the driver's zone
//! for them.

use super::storage_class::{self, Rules};
use super::{go, inline_pv, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_WRITE_ONCE};
use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume, TopologySelectorTerm, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use regex::Regex;
use std::collections::BTreeMap;
use std::sync::LazyLock;

pub const DRIVER_NAME: &str = "disk.csi.azure.com";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/azure-disk";
pub const TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";
pub const FEATURE_GATE: &str = "CSIMigrationAzureDisk";

/// CSI volume attributes (the driver's parameter names, lower case).
pub const ATTR_KIND: &str = "kind";
pub const ATTR_CACHING_MODE: &str = "cachingmode";
pub const ATTR_FS_TYPE: &str = "fstype";
/// The only disk kind the CSI driver serves.
pub const MANAGED: &str = "Managed";

const MANAGED_DISK_PATH: &str = ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";
const UNMANAGED_DISK_PATH: &str = "http(?:.*)://(?:.*)/vhds/(.+)";

static MANAGED_DISK_PATH_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(MANAGED_DISK_PATH).expect("valid regex"));
static UNMANAGED_DISK_PATH_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(UNMANAGED_DISK_PATH).expect("valid regex"));

pub struct AzureDisk;

fn check_kind(source: &AzureDiskVolumeSource) -> Result<()> {
    match source.kind.as_deref() {
        Some(kind) if !kind.eq_ignore_ascii_case(MANAGED) => {
            Err(TranslationError::new(format!("kind({kind}) is not supported in csi migration")))
        }
        _ => Ok(()),
    }
}

impl InTreePlugin for AzureDisk {
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
        let rules = Rules { topology_key: TOPOLOGY_KEY, fs_type: false, zones: true, iops_per_gb: false };
        let mut sc = storage_class::translate(sc, rules)?;
        if let Some(terms) = sc.allowed_topologies.as_mut() {
            unzoned_values_to_csi(terms);
        }
        Ok(sc)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let Some(disk) = &volume.azure_disk else {
            return Err(TranslationError::new("volume is nil or Azure Disk not defined on volume"));
        };
        check_kind(disk)?;
        let mut attrs = BTreeMap::from([(ATTR_KIND.to_string(), MANAGED.to_string())]);
        if let Some(mode) = disk.caching_mode.as_ref().filter(|m| !m.is_empty()) {
            attrs.insert(ATTR_CACHING_MODE.to_string(), mode.clone());
        }
        if let Some(fs) = &disk.fs_type {
            attrs.insert(ATTR_FS_TYPE.to_string(), fs.clone());
        }
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: disk.disk_uri.clone(),
            read_only: super::flag(disk.read_only),
            fs_type: super::non_empty(disk.fs_type.as_ref()),
            volume_attributes: Some(attrs),
            ..Default::default()
        };
        Ok(inline_pv(disk.disk_uri.clone(), csi, ACCESS_MODE_READ_WRITE_ONCE))
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(disk) = pv.spec.as_ref().and_then(|s| s.azure_disk.clone()) else {
            return Err(TranslationError::new("pv is nil or Azure Disk source not defined on pv"));
        };
        check_kind(&disk)?;
        let mut attrs = BTreeMap::from([(ATTR_KIND.to_string(), MANAGED.to_string())]);
        if let Some(mode) = &disk.caching_mode {
            attrs.insert(ATTR_CACHING_MODE.to_string(), mode.clone());
        }
        if let Some(fs) = &disk.fs_type {
            attrs.insert(ATTR_FS_TYPE.to_string(), fs.clone());
        }
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: disk.disk_uri.clone(),
            read_only: super::flag(disk.read_only),
            fs_type: super::non_empty(disk.fs_type.as_ref()),
            volume_attributes: Some(attrs),
            ..Default::default()
        };
        let spec = spec_mut(&mut pv);
        spec.azure_disk = None;
        spec.csi = Some(csi);
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let disk_uri = csi.volume_handle.clone();
        let disk_name = disk_name(&disk_uri)?;
        // Go points FSType and ReadOnly at the CSI fields, so they are set even when empty (false).
        let mut disk = AzureDiskVolumeSource {
            disk_name,
            disk_uri,
            fs_type: Some(csi.fs_type.clone().unwrap_or_default()),
            read_only: Some(csi.read_only.unwrap_or(false)),
            kind: Some(MANAGED.to_string()),
            caching_mode: None,
        };
        for (k, v) in csi.volume_attributes.iter().flatten() {
            match go::to_lower(k).as_str() {
                ATTR_CACHING_MODE if !v.is_empty() => disk.caching_mode = Some(v.clone()),
                ATTR_FS_TYPE if !v.is_empty() => disk.fs_type = Some(v.clone()),
                _ => {}
            }
        }
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.azure_disk = Some(disk);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.azure_disk.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.azure_disk.is_some()
    }
}

/// The zone values of the driver's key that are numbers (`^[0-9]+$`) become `""`: in-tree, nodes of an Azure region
/// without availability zones carry zone `"0"`, `"1"`, …; the driver's topology for them is the empty zone.
fn unzoned_values_to_csi(terms: &mut [TopologySelectorTerm]) {
    for e in terms.iter_mut().flat_map(|t| t.match_label_expressions.iter_mut().flatten()) {
        if e.key == TOPOLOGY_KEY {
            for v in e.values.iter_mut().filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())) {
                v.clear();
            }
        }
    }
}

/// Whether a disk URI names a managed disk (an unmanaged one is a blob URL).
pub fn is_managed_disk(disk_uri: &str) -> bool {
    !(disk_uri.len() > 4 && disk_uri.as_bytes()[..4].eq_ignore_ascii_case(b"http"))
}

/// The disk name at the end of a managed disk's resource ID or an unmanaged disk's blob URL.
pub fn disk_name(disk_uri: &str) -> Result<String> {
    let (re, pattern) = if is_managed_disk(disk_uri) {
        (&*MANAGED_DISK_PATH_RE, MANAGED_DISK_PATH)
    } else {
        (&*UNMANAGED_DISK_PATH_RE, UNMANAGED_DISK_PATH)
    };
    match re.captures(disk_uri).and_then(|c| c.get(1)) {
        Some(m) => Ok(m.as_str().to_string()),
        None => {
            Err(TranslationError::new(format!("could not get disk name from {disk_uri}, correct format: {pattern}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_like_upstream() {
        assert!(is_managed_disk("testurl/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name"));
        assert!(is_managed_disk("test.com"));
        assert!(!is_managed_disk("HTTP://test.com"));
        assert_eq!(
            disk_name("testurl/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name").unwrap(),
            "name"
        );
        assert_eq!(
            disk_name("testurl/subscriptions/23/providers/Microsoft.Compute/disks/name").unwrap_err().0,
            format!("could not get disk name from testurl/subscriptions/23/providers/Microsoft.Compute/disks/name, correct format: {MANAGED_DISK_PATH}")
        );
        assert_eq!(disk_name("http://test.com/vhds/name").unwrap(), "name");
        assert_eq!(
            disk_name("http://test.io/name").unwrap_err().0,
            format!("could not get disk name from http://test.io/name, correct format: {UNMANAGED_DISK_PATH}")
        );
    }
}

//! GCE Persistent Disk (`kubernetes.io/gce-pd`) <-> `pd.csi.storage.gke.io`.
//!
//! The volume handle is `projects/<project>/zones/<zone>/disks/<pd>` (`regions/<region>` for a regional disk, whose
//! zone label lists several zones joined by `__`); the project, and the zone without a zone label, are
//! `UNSPECIFIED` until [`InTreePlugin::repair_volume_handle`] fills them from a node ID.

use super::storage_class::{self, Rules};
use super::topology::{
    translate_topology_from_csi_to_in_tree, translate_topology_from_in_tree_to_csi, LABEL_FAILURE_DOMAIN_BETA_ZONE,
    LABEL_MULTI_ZONE_DELIMITER, LABEL_TOPOLOGY_ZONE,
};
use super::{
    flag, go, inline_pv, non_empty, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_ONLY_MANY,
    ACCESS_MODE_READ_WRITE_MANY, ACCESS_MODE_READ_WRITE_ONCE, VOLUME_MODE_FILESYSTEM,
};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};

pub const DRIVER_NAME: &str = "pd.csi.storage.gke.io";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/gce-pd";
pub const TOPOLOGY_KEY: &str = "topology.gke.io/zone";
pub const FEATURE_GATE: &str = "CSIMigrationGCE";
/// An unknown project or zone in a volume handle.
pub const UNSPECIFIED: &str = "UNSPECIFIED";

const PROJECT: usize = 1;
const REGIONALITY: usize = 2;
const ZONE: usize = 3;
const DISK_NAME: usize = 5;
const TOTAL_ELEMENTS: usize = 6;

fn zonal_id(project: &str, zone: &str, disk: &str) -> String {
    format!("projects/{project}/zones/{zone}/disks/{disk}")
}

fn regional_id(project: &str, region: &str, disk: &str) -> String {
    format!("projects/{project}/regions/{region}/disks/{disk}")
}

pub struct GcePersistentDisk;

fn partition_attribute(partition: Option<i32>) -> BTreeMap<String, String> {
    let p = partition.filter(|p| *p != 0).map(|p| p.to_string()).unwrap_or_default();
    BTreeMap::from([("partition".to_string(), p)])
}

/// The access modes the CSI driver accepts for what the in-tree plugin tolerated: ReadWriteMany (never supported,
/// never validated) and {ReadWriteOnce, ReadOnlyMany} both attach as ReadWriteOnce.
pub fn backward_compatible_access_modes(modes: Option<&Vec<String>>) -> Option<Vec<String>> {
    let modes = modes?;
    let seen: BTreeSet<&str> = modes
        .iter()
        .map(|m| if m == ACCESS_MODE_READ_WRITE_MANY { ACCESS_MODE_READ_WRITE_ONCE } else { m.as_str() })
        .collect();
    let only_rox = seen.contains(ACCESS_MODE_READ_ONLY_MANY) && !seen.contains(ACCESS_MODE_READ_WRITE_ONCE);
    Some(vec![if only_rox { ACCESS_MODE_READ_ONLY_MANY } else { ACCESS_MODE_READ_WRITE_ONCE }.to_string()])
}

/// The one region of GCE zones (`<locale>-<region>-<zone>`).
pub fn region_from_zones(zones: &[String]) -> Result<String> {
    if zones.is_empty() {
        return Err(TranslationError::new("no zones specified"));
    }
    let mut regions = BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(TranslationError::new(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            )));
        }
        regions.insert(parts[..2].join("-"));
    }
    if regions.len() != 1 {
        return Err(TranslationError::new(format!(
            "multiple or no regions gotten from zones, got: {}",
            go::string_set(&regions)
        )));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}

fn pd_name_from_volume_id(id: &str) -> Result<String> {
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() < TOTAL_ELEMENTS {
        return Err(TranslationError::new(format!(
            "failed to get id components.Got: {}, wanted {TOTAL_ELEMENTS} components or more. ",
            parts.len()
        )));
    }
    Ok(parts[DISK_NAME].to_string())
}

impl InTreePlugin for GcePersistentDisk {
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
        storage_class::translate(
            sc,
            Rules { topology_key: TOPOLOGY_KEY, fs_type: true, zones: true, iops_per_gb: false },
        )
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let Some(pd) = &volume.gce_persistent_disk else {
            return Err(TranslationError::new("volume is nil or GCE PD not defined on volume"));
        };
        let read_only = pd.read_only == Some(true);
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: zonal_id(UNSPECIFIED, UNSPECIFIED, &pd.pd_name),
            read_only: flag(pd.read_only),
            fs_type: non_empty(pd.fs_type.as_ref()),
            volume_attributes: Some(partition_attribute(pd.partition)),
            ..Default::default()
        };
        // The name must be unique per disk: it is the unique part of the staging path.
        let access_mode = if read_only { ACCESS_MODE_READ_ONLY_MANY } else { ACCESS_MODE_READ_WRITE_ONCE };
        let mut pv = inline_pv(format!("{DRIVER_NAME}-{}", pd.pd_name), csi, access_mode);
        spec_mut(&mut pv).volume_mode = Some(VOLUME_MODE_FILESYSTEM.to_string());
        Ok(pv)
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(pd) = pv.spec.as_ref().and_then(|s| s.gce_persistent_disk.clone()) else {
            return Err(TranslationError::new("pv is nil or GCE Persistent Disk source not defined on pv"));
        };
        // The label is the beta one or the GA one, depending on the version the PV was created with.
        let label = |k: &str| pv.metadata.labels.as_ref().and_then(|l| l.get(k)).cloned().unwrap_or_default();
        let mut zones_label = label(LABEL_FAILURE_DOMAIN_BETA_ZONE);
        if zones_label.is_empty() {
            zones_label = label(LABEL_TOPOLOGY_ZONE);
        }
        let zones: Vec<String> = zones_label.split(LABEL_MULTI_ZONE_DELIMITER).map(str::to_string).collect();
        let volume_id = if zones.len() == 1 && !zones[0].is_empty() {
            zonal_id(UNSPECIFIED, &zones[0], &pd.pd_name)
        } else if zones.len() > 1 {
            let region = region_from_zones(&zones)
                .map_err(|e| TranslationError::new(format!("failed to get region from zones: {e}")))?;
            regional_id(UNSPECIFIED, &region, &pd.pd_name)
        } else {
            zonal_id(UNSPECIFIED, UNSPECIFIED, &pd.pd_name)
        };
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: volume_id,
            read_only: flag(pd.read_only),
            fs_type: non_empty(pd.fs_type.as_ref()),
            volume_attributes: Some(partition_attribute(pd.partition)),
            ..Default::default()
        };
        translate_topology_from_in_tree_to_csi(&mut pv, TOPOLOGY_KEY);
        let spec = spec_mut(&mut pv);
        spec.gce_persistent_disk = None;
        spec.csi = Some(csi);
        spec.access_modes = backward_compatible_access_modes(spec.access_modes.as_ref());
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let mut pd = GCEPersistentDiskVolumeSource {
            pd_name: pd_name_from_volume_id(&csi.volume_handle)?,
            fs_type: non_empty(csi.fs_type.as_ref()),
            read_only: flag(csi.read_only),
            partition: None,
        };
        if let Some(partition) = csi.volume_attributes.as_ref().and_then(|a| a.get("partition")) {
            if !partition.is_empty() {
                let n = go::atoi(partition).map_err(|e| {
                    TranslationError::new(format!("Failed to convert partition {partition} to integer: {e}"))
                })?;
                // Go's int32() conversion.
                pd.partition = Some(n as i32).filter(|p| *p != 0);
            }
        }
        translate_topology_from_csi_to_in_tree(&mut pv, TOPOLOGY_KEY, Some(region_from_zones))
            .map_err(|e| topology_error(&pv, &e.0))?;
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.gce_persistent_disk = Some(pd);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.gce_persistent_disk.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.gce_persistent_disk.is_some()
    }

    fn repair_volume_handle(&self, volume_handle: &str, node_id: &str) -> Result<String> {
        let tok: Vec<&str> = volume_handle.split('/').collect();
        if tok.len() < TOTAL_ELEMENTS {
            return Err(TranslationError::new(format!(
                "volume handle has wrong number of elements; got {}, wanted {TOTAL_ELEMENTS} or more",
                tok.len()
            )));
        }
        if tok[PROJECT] != UNSPECIFIED {
            return Ok(volume_handle.to_string());
        }
        let node: Vec<&str> = node_id.split('/').collect();
        if node.len() < TOTAL_ELEMENTS {
            return Err(TranslationError::new(format!(
                "node handle has wrong number of elements; got {}, wanted {TOTAL_ELEMENTS} or more",
                node.len()
            )));
        }
        match tok[REGIONALITY] {
            "zones" => {
                let zone = if tok[ZONE] == UNSPECIFIED { node[ZONE] } else { tok[ZONE] };
                Ok(zonal_id(node[PROJECT], zone, tok[DISK_NAME]))
            }
            "regions" => {
                let region = if tok[ZONE] == UNSPECIFIED {
                    region_from_zones(&[node[ZONE].to_string()]).map_err(|e| {
                        TranslationError::new(format!("failed to get region from zone {}: {e}", node[ZONE]))
                    })?
                } else {
                    tok[ZONE].to_string()
                };
                Ok(regional_id(node[PROJECT], &region, tok[DISK_NAME]))
            }
            other => Err(TranslationError::new(format!(
                "expected volume handle to have zones or regions regionality value, got: {other}"
            ))),
        }
    }
}

/// The library's message when the topology of a CSI PV cannot be translated back (Go prints the whole PV struct
/// there; we print it as JSON).
pub(crate) fn topology_error(pv: &PersistentVolume, e: &str) -> TranslationError {
    let pv = serde_json::to_string(pv).unwrap_or_default();
    TranslationError::new(format!("failed to translate topology. PV:{pv}. Error:{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(m: &[&str]) -> Option<Vec<String>> {
        Some(m.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn access_modes_like_upstream() {
        let f = |m: &[&str]| backward_compatible_access_modes(modes(m).as_ref());
        assert_eq!(f(&["ReadWriteMany"]), modes(&["ReadWriteOnce"]));
        assert_eq!(f(&["ReadOnlyMany", "ReadWriteOnce"]), modes(&["ReadWriteOnce"]));
        assert_eq!(f(&["ReadOnlyMany", "ReadWriteMany"]), modes(&["ReadWriteOnce"]));
        assert_eq!(f(&["ReadOnlyMany"]), modes(&["ReadOnlyMany"]));
        assert_eq!(f(&["ReadWriteOncePod"]), modes(&["ReadWriteOnce"]));
        assert_eq!(f(&[]), modes(&["ReadWriteOnce"]));
        assert_eq!(backward_compatible_access_modes(None), None);
    }

    #[test]
    fn regions() {
        let z = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(region_from_zones(&z(&["us-central1-a", "us-central1-b"])).unwrap(), "us-central1");
        assert_eq!(
            region_from_zones(&z(&["us-central1-a", "europe-west1-b"])).unwrap_err().to_string(),
            "multiple or no regions gotten from zones, got: map[europe-west1:{} us-central1:{}]"
        );
        assert_eq!(
            region_from_zones(&z(&["us-central1"])).unwrap_err().to_string(),
            "zone in unexpected format, expected: {locale}-{region}-{zone}, got: us-central1"
        );
        assert_eq!(region_from_zones(&[]).unwrap_err().to_string(), "no zones specified");
    }

    #[test]
    fn repair() {
        let p = GcePersistentDisk;
        let node = "projects/p1/zones/us-central1-c/instances/n1";
        assert_eq!(
            p.repair_volume_handle("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d", node).unwrap(),
            "projects/p1/zones/us-central1-c/disks/d"
        );
        assert_eq!(
            p.repair_volume_handle("projects/UNSPECIFIED/zones/us-central1-a/disks/d", node).unwrap(),
            "projects/p1/zones/us-central1-a/disks/d"
        );
        assert_eq!(
            p.repair_volume_handle("projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d", node).unwrap(),
            "projects/p1/regions/us-central1/disks/d"
        );
        assert_eq!(p.repair_volume_handle("projects/p0/zones/z/disks/d", node).unwrap(), "projects/p0/zones/z/disks/d");
        assert_eq!(
            p.repair_volume_handle("projects/UNSPECIFIED/zones/z", node).unwrap_err().0,
            "volume handle has wrong number of elements; got 4, wanted 6 or more"
        );
        assert_eq!(
            p.repair_volume_handle("projects/UNSPECIFIED/zones/z/disks/d", "n1").unwrap_err().0,
            "node handle has wrong number of elements; got 1, wanted 6 or more"
        );
        assert_eq!(
            p.repair_volume_handle("projects/UNSPECIFIED/areas/z/disks/d", node).unwrap_err().0,
            "expected volume handle to have zones or regions regionality value, got: areas"
        );
    }
}

//! AWS Elastic Block Store (`kubernetes.io/aws-ebs`) <-> `ebs.csi.aws.com`.
//!
//! The in-tree volume ID is `vol-…`, `aws:///vol-…` or `aws://<zone>/vol-…`; the CSI volume handle is the bare
//! `vol-…`. The partition is always written as a decimal attribute. A StorageClass with `iopsPerGB` also gets
//! `allowautoiopspergbincrease: "true"`: the in-tree plugin raised a volume's IOPS to the minimum AWS accepts when
//! size × iopsPerGB fell short, and the driver only does so when asked.

use super::storage_class::{self, Rules};
use super::topology::{translate_topology_from_csi_to_in_tree, translate_topology_from_in_tree_to_csi};
use super::{
    flag, go, inline_pv, non_empty, spec_mut, InTreePlugin, Result, TranslationError, ACCESS_MODE_READ_WRITE_ONCE,
};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};

pub const DRIVER_NAME: &str = "ebs.csi.aws.com";
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/aws-ebs";
pub const TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";
pub const FEATURE_GATE: &str = "CSIMigrationAWS";

pub struct AwsElasticBlockStore;

fn csi_source(ebs: &AWSElasticBlockStoreVolumeSource) -> Result<CSIPersistentVolumeSource> {
    let handle = kubernetes_volume_id_to_ebs_volume_id(&ebs.volume_id)
        .map_err(|e| TranslationError::new(format!("failed to translate Kubernetes ID to EBS Volume ID {e}")))?;
    Ok(CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: handle,
        read_only: flag(ebs.read_only),
        fs_type: non_empty(ebs.fs_type.as_ref()),
        volume_attributes: Some(BTreeMap::from([(
            "partition".to_string(),
            ebs.partition.unwrap_or_default().to_string(),
        )])),
        ..Default::default()
    })
}

impl InTreePlugin for AwsElasticBlockStore {
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
            Rules { topology_key: TOPOLOGY_KEY, fs_type: true, zones: true, iops_per_gb: true },
        )
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let Some(ebs) = &volume.aws_elastic_block_store else {
            return Err(TranslationError::new("volume is nil or AWS EBS not defined on volume"));
        };
        let csi = csi_source(ebs)?;
        // The name must be unique per disk: it is the unique part of the staging path.
        let name = format!("{DRIVER_NAME}-{}", csi.volume_handle);
        Ok(inline_pv(name, csi, ACCESS_MODE_READ_WRITE_ONCE))
    }

    fn translate_in_tree_pv_to_csi(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(ebs) = pv.spec.as_ref().and_then(|s| s.aws_elastic_block_store.clone()) else {
            return Err(TranslationError::new("pv is nil or AWS EBS not defined on pv"));
        };
        let csi = csi_source(&ebs)?;
        translate_topology_from_in_tree_to_csi(&mut pv, TOPOLOGY_KEY);
        let spec = spec_mut(&mut pv);
        spec.aws_elastic_block_store = None;
        spec.csi = Some(csi);
        Ok(pv)
    }

    fn translate_csi_pv_to_in_tree(&self, mut pv: PersistentVolume) -> Result<PersistentVolume> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Err(TranslationError::new("pv is nil or CSI source not defined on pv"));
        };
        let mut ebs = AWSElasticBlockStoreVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: non_empty(csi.fs_type.as_ref()),
            read_only: flag(csi.read_only),
            partition: None,
        };
        if let Some(partition) = csi.volume_attributes.as_ref().and_then(|a| a.get("partition")) {
            let n = go::atoi(partition).map_err(|e| {
                TranslationError::new(format!("failed to convert partition {partition} to integer: {e}"))
            })?;
            ebs.partition = Some(n as i32).filter(|p| *p != 0);
        }
        translate_topology_from_csi_to_in_tree(&mut pv, TOPOLOGY_KEY, Some(region_from_zones))
            .map_err(|e| super::gce_pd::topology_error(&pv, &e.0))?;
        let spec = spec_mut(&mut pv);
        spec.csi = None;
        spec.aws_elastic_block_store = Some(ebs);
        Ok(pv)
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.aws_elastic_block_store.is_some())
    }
    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.aws_elastic_block_store.is_some()
    }
}

/// Whether `id` is an EBS volume ID: `^vol-[^/]*$`.
fn is_ebs_volume_id(id: &str) -> bool {
    id.strip_prefix("vol-").is_some_and(|rest| !rest.contains('/'))
}

/// The EBS volume ID of a Kubernetes volume ID: `aws://<zone>/<id>` and `aws:///<id>` lose the URL around it; a
/// bare ID is taken as it is.
pub fn kubernetes_volume_id_to_ebs_volume_id(kubernetes_id: &str) -> Result<String> {
    if !kubernetes_id.starts_with("aws://") {
        // Assumed to be a bare volume ID (vol-1234...).
        return Ok(kubernetes_id.to_string());
    }
    let path = go::url_path(kubernetes_id)
        .map_err(|e| TranslationError::new(format!("Invalid disk name ({kubernetes_id}): {e}")))?;
    let aws_id = path.trim_matches('/');
    // The two known formats are vol-12345678 and vol-12345678abcdef01.
    if !is_ebs_volume_id(aws_id) {
        return Err(TranslationError::new(format!("Invalid format for AWS volume ({kubernetes_id})")));
    }
    Ok(aws_id.to_string())
}

/// The one region of AWS zones: `us-west-2a`, `us-gov-east-1a`, local zones (`us-west-2-lax-1a`) and wavelength
/// zones (`us-east-1-wl1-bos-wlz-1`).
pub fn region_from_zones(zones: &[String]) -> Result<String> {
    if zones.is_empty() {
        return Err(TranslationError::new("no zones specified"));
    }
    let mut regions = BTreeSet::new();
    for zone in zones {
        let mut parts: Vec<String> = zone.split('-').map(str::to_string).collect();
        let n = parts.len();
        if (n == 3 || n == 4) && parts[n - 1].len() == 2 {
            // This would break with a location of more than 9 regions (us-west-10).
            let last = parts[n - 1].chars().next().map(String::from).unwrap_or_default();
            parts[n - 1] = last;
            regions.insert(parts.join("-"));
        } else if n == 5 || n == 7 {
            regions.insert(parts[..3].join("-"));
        } else {
            return Err(TranslationError::new(format!("Unexpected zone format: {zone} is not a valid AWS zone")));
        }
    }
    if regions.len() != 1 {
        return Err(TranslationError::new(format!(
            "multiple or no regions gotten from zones, got: {}",
            go::string_set(&regions)
        )));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_ids() {
        let ok = |s: &str| kubernetes_volume_id_to_ebs_volume_id(s).unwrap();
        let err = |s: &str| kubernetes_volume_id_to_ebs_volume_id(s).unwrap_err().to_string();
        assert_eq!(ok("vol-1234"), "vol-1234");
        assert_eq!(ok("aws:///vol-1234"), "vol-1234");
        assert_eq!(ok("aws://us-east-1a/vol-1234"), "vol-1234");
        assert_eq!(ok("aws://us-east-1a/vol-1234/"), "vol-1234");
        // A bare ID is not checked (as upstream).
        assert_eq!(ok("anything"), "anything");
        assert_eq!(err("aws://us-east-1a/disk-1"), "Invalid format for AWS volume (aws://us-east-1a/disk-1)");
        assert_eq!(err("aws://us-east-1a/vol-1/x"), "Invalid format for AWS volume (aws://us-east-1a/vol-1/x)");
        assert_eq!(err("aws://us-east-1a"), "Invalid format for AWS volume (aws://us-east-1a)");
        assert_eq!(
            err("aws://us-east-1a/vol-%zz"),
            r#"Invalid disk name (aws://us-east-1a/vol-%zz): parse "aws://us-east-1a/vol-%zz": invalid URL escape "%zz""#
        );
        assert_eq!(
            err("aws://us-east-1a:x/vol-1"),
            r#"Invalid disk name (aws://us-east-1a:x/vol-1): parse "aws://us-east-1a:x/vol-1": invalid port ":x" after host"#
        );
        assert_eq!(
            err("aws://us east/vol-1"),
            r#"Invalid disk name (aws://us east/vol-1): parse "aws://us east/vol-1": invalid character " " in host name"#
        );
        assert_eq!(ok("aws://us-east-1a/vol-%41"), "vol-A");
        assert_eq!(
            err("aws://z/vol-1%"),
            r#"Invalid disk name (aws://z/vol-1%): parse "aws://z/vol-1%": invalid URL escape "%""#
        );
    }

    #[test]
    fn regions() {
        let z = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(region_from_zones(&z(&["us-west-2a", "us-west-2b"])).unwrap(), "us-west-2");
        assert_eq!(region_from_zones(&z(&["us-gov-east-1a"])).unwrap(), "us-gov-east-1");
        assert_eq!(region_from_zones(&z(&["us-west-2-lax-1a"])).unwrap(), "us-west-2");
        assert_eq!(region_from_zones(&z(&["us-east-1-wl1-bos-wlz-1"])).unwrap(), "us-east-1");
        assert_eq!(
            region_from_zones(&z(&["us-west-2a", "us-east-1a"])).unwrap_err().to_string(),
            "multiple or no regions gotten from zones, got: map[us-east-1:{} us-west-2:{}]"
        );
        assert_eq!(
            region_from_zones(&z(&["uswest2a"])).unwrap_err().to_string(),
            "Unexpected zone format: uswest2a is not a valid AWS zone"
        );
    }
}

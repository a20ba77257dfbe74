//! StorageClass parameter translation shared by the zonal block plugins (GCE PD, AWS EBS, Azure Disk, Cinder):
//! `fstype` -> `csi.storage.k8s.io/fstype`, `zone`/`zones` -> allowed topologies on the driver's key (never together
//! with explicit allowed topologies), explicit allowed topologies renamed to the driver's key, and for EBS
//! `iopsPerGB` kept with `allowautoiopspergbincrease: "true"` added.
//!
//! Parameter names match case-insensitively, as upstream. Go walks the parameter map in random order, so when two
//! parameters land on one key its result varies from run to run; ours is fixed: a parameter the translation writes
//! wins over one copied as it is, and among parameters of one kind the later in byte order wins.

use super::topology::{topology_selectors, translate_allowed_topologies};
use super::{go, Result, TranslationError};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::BTreeMap;

/// The deprecated in-tree fstype parameter.
pub const FS_TYPE_KEY: &str = "fstype";
/// The CSI fstype parameter (the external provisioner strips the prefixed parameters).
pub const CSI_FS_TYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// The deprecated in-tree zone parameters.
pub const ZONE_KEY: &str = "zone";
pub const ZONES_KEY: &str = "zones";
/// EBS: the IOPS per GiB of a volume (kept under the name it was given).
pub const IOPS_PER_GB_KEY: &str = "iopspergb";
/// EBS: lets the driver raise IOPS to the minimum AWS accepts, as the in-tree plugin did.
pub const ALLOW_INCREASE_IOPS_KEY: &str = "allowautoiopspergbincrease";

/// What a plugin translates of a StorageClass.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub topology_key: &'static str,
    /// `fstype` -> `csi.storage.k8s.io/fstype` (else it passes unchanged).
    pub fs_type: bool,
    /// `zone`/`zones` -> allowed topologies (else they pass unchanged).
    pub zones: bool,
    /// `iopsPerGB` brings `allowautoiopspergbincrease: "true"` (EBS).
    pub iops_per_gb: bool,
}

/// The parameters as a map, `None` when empty (an empty map is not written, as Go's `omitempty` does).
pub fn parameters(params: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!params.is_empty()).then_some(params)
}

pub fn translate(mut sc: StorageClass, rules: Rules) -> Result<StorageClass> {
    let mut generated = Vec::new();
    let mut copied = BTreeMap::new();
    let mut translated = BTreeMap::new();
    for (k, v) in sc.parameters.take().unwrap_or_default() {
        match go::to_lower(&k).as_str() {
            FS_TYPE_KEY if rules.fs_type => {
                translated.insert(CSI_FS_TYPE_KEY.to_string(), v);
            }
            ZONE_KEY if rules.zones => generated = topology_selectors(rules.topology_key, vec![v]),
            ZONES_KEY if rules.zones => {
                generated = topology_selectors(rules.topology_key, v.split(',').map(str::to_string).collect())
            }
            IOPS_PER_GB_KEY if rules.iops_per_gb => {
                copied.insert(k, v);
                translated.insert(ALLOW_INCREASE_IOPS_KEY.to_string(), "true".to_string());
            }
            _ => {
                copied.insert(k, v);
            }
        }
    }
    let allowed = sc.allowed_topologies.take().unwrap_or_default();
    if !generated.is_empty() && !allowed.is_empty() {
        return Err(TranslationError::new("cannot simultaneously set allowed topologies and zone/zones parameters"));
    }
    sc.allowed_topologies = if !generated.is_empty() {
        Some(generated)
    } else if !allowed.is_empty() {
        Some(translate_allowed_topologies(&allowed, rules.topology_key))
    } else {
        None
    };
    copied.extend(translated);
    sc.parameters = parameters(copied);
    Ok(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc(params: &[(&str, &str)]) -> StorageClass {
        StorageClass {
            parameters: Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    fn params(sc: &StorageClass) -> Vec<(&str, &str)> {
        sc.parameters.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    const EBS: Rules = Rules { topology_key: "k", fs_type: true, zones: true, iops_per_gb: true };

    #[test]
    fn translated_parameters_win_over_copied_ones() {
        let out = translate(sc(&[("csi.storage.k8s.io/fstype", "xfs"), ("FsType", "ext4")]), EBS).unwrap();
        assert_eq!(params(&out), [("csi.storage.k8s.io/fstype", "ext4")]);
        let out = translate(sc(&[("allowautoiopspergbincrease", "false"), ("iopsPerGB", "10")]), EBS).unwrap();
        assert_eq!(params(&out), [("allowautoiopspergbincrease", "true"), ("iopsPerGB", "10")]);
        let plain = Rules { iops_per_gb: false, ..EBS };
        assert_eq!(params(&translate(sc(&[("iopsPerGB", "10")]), plain).unwrap()), [("iopsPerGB", "10")]);
    }

    #[test]
    fn names_are_lowered_as_go_lowers_them() {
        // Go maps İ to i; Rust's str::to_lowercase would add a combining dot and miss the parameter.
        let out = translate(sc(&[("\u{130}opsPerGB", "5")]), EBS).unwrap();
        assert_eq!(params(&out), [("allowautoiopspergbincrease", "true"), ("\u{130}opsPerGB", "5")]);
    }
}

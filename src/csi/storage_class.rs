//! StorageClass parameter translation shared by the zonal block plugins (GCE PD, AWS EBS, Azure Disk, Cinder):
//! `fstype` -> `csi.storage.k8s.io/fstype`, `zone`/`zones` -> allowed topologies on the driver's key (never together
//! with explicit allowed topologies), explicit allowed topologies renamed to the driver's key.

use super::topology::{topology_selectors, translate_allowed_topologies};
use super::{Result, TranslationError};
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::BTreeMap;

/// The deprecated in-tree fstype parameter.
pub const FS_TYPE_KEY: &str = "fstype";
/// The CSI fstype parameter (the external provisioner strips the prefixed parameters).
pub const CSI_FS_TYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// The deprecated in-tree zone parameters.
pub const ZONE_KEY: &str = "zone";
pub const ZONES_KEY: &str = "zones";

/// What a plugin translates of a StorageClass.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub topology_key: &'static str,
    /// `fstype` -> `csi.storage.k8s.io/fstype` (else it passes unchanged).
    pub fs_type: bool,
    /// `zone`/`zones` -> allowed topologies (else they pass unchanged).
    pub zones: bool,
}

/// The parameters as a map, `None` when empty (an empty map is not written, as Go's `omitempty` does).
pub fn parameters(params: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!params.is_empty()).then_some(params)
}

pub fn translate(mut sc: StorageClass, rules: Rules) -> Result<StorageClass> {
    let mut generated = Vec::new();
    let mut params = BTreeMap::new();
    for (k, v) in sc.parameters.take().unwrap_or_default() {
        match k.to_lowercase().as_str() {
            FS_TYPE_KEY if rules.fs_type => {
                params.insert(CSI_FS_TYPE_KEY.to_string(), v);
            }
            ZONE_KEY if rules.zones => generated = topology_selectors(rules.topology_key, vec![v]),
            ZONES_KEY if rules.zones => {
                generated = topology_selectors(rules.topology_key, v.split(',').map(str::to_string).collect())
            }
            _ => {
                params.insert(k, v);
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
    sc.parameters = parameters(params);
    Ok(sc)
}

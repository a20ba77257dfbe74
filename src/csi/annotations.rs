//! The `pv.kubernetes.io/migrated-to` annotation, as Kubernetes' PV controller keeps it on PVs and PVCs
//! (`updateMigrationAnnotations`): set to the CSI driver when the provisioner is an in-tree plugin whose migration is
//! on, removed when it is off (rollback). A PV's provisioner is `pv.kubernetes.io/provisioned-by`; a PVC's is
//! `volume.kubernetes.io/storage-provisioner`, else its beta form. Beyond upstream, a PV without a provisioner
//! annotation (statically provisioned) is judged by its in-tree volume source.

use super::gates::FeatureGates;
use super::{csi_name_from_in_tree_name, in_tree_plugin_name_from_spec};
use k8s_openapi::api::core::v1::PersistentVolume;
use std::collections::BTreeMap;

pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_DYNAMICALLY_PROVISIONED: &str = "pv.kubernetes.io/provisioned-by";

/// What to do with the annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationAnnotation {
    Unchanged,
    /// Set it to this driver.
    Set(&'static str),
    Remove,
}

type Annotations = BTreeMap<String, String>;

fn decide(provisioner: &str, annotations: Option<&Annotations>, gates: &FeatureGates) -> MigrationAnnotation {
    let current = annotations.and_then(|a| a.get(ANN_MIGRATED_TO)).map(String::as_str).unwrap_or_default();
    if gates.is_migration_enabled_for_plugin(provisioner) {
        match csi_name_from_in_tree_name(provisioner) {
            Ok(driver) if driver != current => MigrationAnnotation::Set(driver),
            _ => MigrationAnnotation::Unchanged,
        }
    } else if !current.is_empty() {
        MigrationAnnotation::Remove
    } else {
        MigrationAnnotation::Unchanged
    }
}

/// For a PersistentVolumeClaim with these annotations.
pub fn for_claim(annotations: Option<&Annotations>, gates: &FeatureGates) -> MigrationAnnotation {
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    match get(ANN_STORAGE_PROVISIONER).or_else(|| get(ANN_BETA_STORAGE_PROVISIONER)) {
        Some(provisioner) => decide(provisioner, annotations, gates),
        None => MigrationAnnotation::Unchanged,
    }
}

/// For a PersistentVolume.
pub fn for_volume(pv: &PersistentVolume, gates: &FeatureGates) -> MigrationAnnotation {
    let annotations = pv.metadata.annotations.as_ref();
    let provisioner = annotations
        .and_then(|a| a.get(ANN_DYNAMICALLY_PROVISIONED))
        .map(String::as_str)
        .or_else(|| in_tree_plugin_name_from_spec(Some(pv), None).ok());
    match provisioner {
        Some(provisioner) => decide(provisioner, annotations, gates),
        None => MigrationAnnotation::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> Annotations {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn claims() {
        let on: FeatureGates = "CSIMigrationAWS=true".parse().unwrap();
        let off = FeatureGates::default();
        let a = ann(&[(ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs")]);
        assert_eq!(for_claim(Some(&a), &on), MigrationAnnotation::Set("ebs.csi.aws.com"));
        assert_eq!(for_claim(Some(&a), &off), MigrationAnnotation::Unchanged);
        let beta =
            ann(&[(ANN_BETA_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs"), (ANN_MIGRATED_TO, "ebs.csi.aws.com")]);
        assert_eq!(for_claim(Some(&beta), &on), MigrationAnnotation::Unchanged);
        assert_eq!(for_claim(Some(&beta), &off), MigrationAnnotation::Remove);
        let csi = ann(&[(ANN_STORAGE_PROVISIONER, "ebs.csi.aws.com"), (ANN_MIGRATED_TO, "ebs.csi.aws.com")]);
        assert_eq!(for_claim(Some(&csi), &on), MigrationAnnotation::Remove, "upstream: not an in-tree plugin");
        assert_eq!(for_claim(None, &on), MigrationAnnotation::Unchanged);
        assert_eq!(for_claim(Some(&ann(&[(ANN_MIGRATED_TO, "x")])), &off), MigrationAnnotation::Unchanged);
    }
}

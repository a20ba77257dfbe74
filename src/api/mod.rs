//! The kinds this server serves. Each kind is one file with its types and policy (defaults, validation, printer
//! columns); this module bridges them to the object-safe [`Strategy`] the generic registry works with.
//! Adding a kind = one module + one line in [`kinds`] (or [`standalone_kinds`] for a standalone-only one).

pub mod csi_translation;
pub mod event;
pub mod events_event;
pub mod namespace;
pub mod printers;
pub mod self_review;
pub mod shoot_state;
pub mod storage_state;
pub mod storage_version_migration;
pub mod storagemigration;

use crate::registry::store::Store;
use crate::registry::strategy::{Kind, Strategy};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// base64(sha256("group/version/Kind")[:8]), the discovery `storageVersionHash` (core group gives a leading "/").
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    use base64::Engine;
    let digest = Sha256::digest(format!("{group}/{version}/{kind}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// A `--storage-version` override that names no kind or no served version of it.
#[derive(Debug, thiserror::Error)]
pub enum StorageVersionError {
    #[error("--storage-version {resource}={version}: not a served version (served: {served})")]
    NotServed { resource: String, version: String, served: String },
    #[error("--storage-version {0}: no such resource (expected <plural>.<group>)")]
    NoSuchResource(String),
}

/// The kind table. `storage_versions` overrides a kind's storage version (`--storage-version plural.group=version`).
pub fn kinds(
    storage_versions: &std::collections::HashMap<String, String>,
) -> Result<Vec<Arc<dyn Strategy>>, StorageVersionError> {
    fn make<K: Kind>(
        overrides: &std::collections::HashMap<String, String>,
        default: &str,
    ) -> Result<Arc<dyn Strategy>, StorageVersionError> {
        let info = K::info();
        let key = info.qualified_resource();
        let version = overrides.get(&key).map(String::as_str).unwrap_or(default);
        if !info.versions.contains(&version) {
            return Err(StorageVersionError::NotServed {
                resource: key,
                version: version.to_string(),
                served: info.versions.join(", "),
            });
        }
        Ok(Arc::new(Store::<K>::new(version)))
    }
    let all = vec![
        make::<storage_version_migration::StorageVersionMigration>(storage_versions, "v1alpha1")?,
        make::<storage_state::StorageState>(storage_versions, "v1alpha1")?,
        make::<shoot_state::ShootState>(storage_versions, "v1beta1")?,
        make::<csi_translation::CSITranslation>(storage_versions, "v1alpha1")?,
        make::<storagemigration::StorageVersionMigration>(storage_versions, storagemigration::STORAGE_VERSION)?,
    ];
    for key in storage_versions.keys() {
        if !all.iter().any(|k| &k.info().qualified_resource() == key) {
            return Err(StorageVersionError::NoSuchResource(key.clone()));
        }
    }
    Ok(all)
}

/// The `api-approved.kubernetes.io` of our kinds in `migration.k8s.io`, a protected group: not a reviewed API of
/// Kubernetes itself, which kube-apiserver accepts as an "unapproved, ..." value.
pub const STORAGE_VERSION_MIGRATOR_API: &str = "unapproved, implementation of the kube-storage-version-migrator API (https://github.com/kubernetes-sigs/kube-storage-version-migrator)";

/// The kinds of kube-apiserver's groups served only when standalone, with no kube-apiserver in front: namespaces
/// and events, stored in v1 (see `AppState::new`), and the self reviews kubectl's `auth can-i` and `auth whoami`
/// create, which store nothing.
pub fn standalone_kinds() -> Vec<Arc<dyn Strategy>> {
    vec![
        Arc::new(Store::<namespace::Namespace>::new("v1")),
        Arc::new(Store::<event::Event>::new("v1")),
        Arc::new(Store::<events_event::Event>::new("v1")),
        Arc::new(Store::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>::new("v1")),
        Arc::new(Store::<k8s_openapi::api::authentication::v1::SelfSubjectReview>::new("v1")),
    ]
}

/// A value as apimachinery puts it in an Invalid message: Go's `encoding/json` output, which escapes HTML characters
/// and the JavaScript line separators that serde_json leaves as they are. Those can only occur inside strings, so
/// replacing them in serde_json's output is safe.
pub fn go_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::strategy::KindInfo;

    #[test]
    fn storage_version_hash_matches_kube_apiserver() {
        assert_eq!(storage_version_hash("apps", "v1", "Deployment"), "8aSe+NMegvE=");
    }

    /// The comparison says yes exactly for the apiVersion the kind writes, in the core group too.
    #[test]
    fn is_api_version_agrees_with_api_version() {
        let grouped = storage_state::StorageState::info();
        let core = KindInfo { group: "", ..*grouped };
        for info in [grouped, &core] {
            for candidate in
                ["v1", "v1alpha1", "migration.k8s.io/v1alpha1", "migration.k8s.io/v1", "/v1alpha1", "x/v1alpha1", ""]
            {
                for version in ["v1", "v1alpha1"] {
                    let expected = info.api_version(version) == candidate;
                    assert_eq!(
                        info.is_api_version(candidate, version),
                        expected,
                        "{:?} {candidate} {version}",
                        info.group
                    );
                }
            }
        }
    }
}

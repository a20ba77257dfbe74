//! Every generated file at once (`migration-apiserver manifests --output-dir .`): each directory's generator, by
//! the path it writes under the repository root.

use super::{apiservice, audit_policy, rbac, webhooks, Files};
use crate::registry::strategy::Strategy;
use std::path::PathBuf;
use std::sync::Arc;

/// Why a manifest could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Crd(#[from] crate::server::crd::CrdError),
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error(transparent)]
    Rbac(#[from] rbac::RbacFileError),
}

/// Every generated file, by its path under the repository root.
pub fn all(kinds: &[Arc<dyn Strategy>]) -> Result<Vec<(PathBuf, String)>, ManifestError> {
    let dirs: [(&str, Files); 6] = [
        ("manifests/crds", crate::server::crd::files(kinds)?),
        ("manifests/roles", crate::server::roles::files(kinds)?),
        ("apiservice", apiservice::files(kinds)?),
        ("manifests/webhooks", webhooks::files(kinds)?),
        ("manifests", rbac::files(kinds)?),
        ("manifests/audit", audit_policy::files()?),
    ];
    let mut out = Vec::new();
    for (dir, files) in dirs {
        out.extend(files.into_iter().map(|(name, content)| (PathBuf::from(dir).join(name), content)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated files never clash, and each starts with the header the staleness check looks for.
    #[test]
    fn every_file_once_with_the_header() {
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        let files = all(&kinds).expect("generate");
        let mut paths: Vec<&PathBuf> = files.iter().map(|(p, _)| p).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), files.len());
        for (path, content) in &files {
            assert!(content.starts_with(super::super::GENERATED_HEADER), "{}", path.display());
        }
    }
}

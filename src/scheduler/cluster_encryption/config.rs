//! The mounted copy of the control plane's EncryptionConfiguration: its hash, as kube-apiserver reports it, and the
//! write key of each resource. Only provider types and key names are read: the key material is never parsed or
//! kept (serde skips the `secret` fields).

use sha2::{Digest, Sha256};
use std::path::Path;

/// The copy could not be read or is not an EncryptionConfiguration.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("reading the EncryptionConfiguration copy {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the EncryptionConfiguration copy {path} is not valid: {problem}")]
    Parse { path: String, problem: CopyProblem },
}

/// What is wrong with a copy's content.
#[derive(Debug, thiserror::Error)]
pub enum CopyProblem {
    #[error("{0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("resources[{index}]: no providers")]
    NoProviders { index: usize },
    #[error("resources[{index}]: {problem}")]
    Provider { index: usize, problem: ProviderProblem },
}

/// What is wrong with the first provider of an entry.
#[derive(Debug, thiserror::Error)]
pub enum ProviderProblem {
    #[error("an empty provider")]
    Empty,
    #[error("a provider name must be a string")]
    NameNotString,
    #[error("{0}: no first key name")]
    NoKeyName(String),
    #[error("kms: no name")]
    NoKmsName,
    #[error("unknown provider {0:?}")]
    Unknown(String),
}

/// `sha256:` and the hex SHA-256 of `bytes`: the form of the `apiserver_id_hash` label (k8s.io/apiserver
/// pkg/server/options/encryptionconfig/metrics `getHash`).
pub fn sha256_label(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// The hex digest of a reported hash, whatever its prefix (`k8s:enc:unstable:1:`, none in earlier releases, or
/// `sha256:`): comparing digests keeps a copy matching any of them.
pub fn digest_of(hash: &str) -> &str {
    hash.rsplit(':').next().unwrap_or(hash)
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    resources: Vec<Entry>,
}

#[derive(serde::Deserialize)]
struct Entry {
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<serde_yaml_ng::Mapping>,
}

/// A parsed copy: its hash and, per `resources` entry in order, its patterns and the write key (the first
/// provider's first key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigCopy {
    pub hash: String,
    entries: Vec<(Vec<String>, String)>,
}

impl ConfigCopy {
    pub fn read(path: &Path) -> Result<ConfigCopy, CopyError> {
        let bytes =
            std::fs::read(path).map_err(|source| CopyError::Read { path: path.display().to_string(), source })?;
        Self::parse(&bytes).map_err(|problem| CopyError::Parse { path: path.display().to_string(), problem })
    }

    fn parse(bytes: &[u8]) -> Result<ConfigCopy, CopyProblem> {
        let file: File = serde_yaml_ng::from_slice(bytes)?;
        let mut entries = Vec::new();
        for (index, e) in file.resources.iter().enumerate() {
            let first = e.providers.first().ok_or(CopyProblem::NoProviders { index })?;
            let key = write_key(first).map_err(|problem| CopyProblem::Provider { index, problem })?;
            entries.push((e.resources.clone(), key));
        }
        // The `hash` label kube-apiserver reports in `..._last_config_info` for this file (the same hash as ours).
        Ok(ConfigCopy { hash: crate::storage::encryption::content_hash(bytes), entries })
    }

    /// What writes `resource` of `group`: `identity`, `aescbc:v1:key2`, `kms:v2:vault`…; the first entry whose
    /// patterns match wins, as kube-apiserver picks the transformer; unlisted resources are written in clear.
    pub fn write_key(&self, resource: &str, group: &str) -> String {
        self.entries
            .iter()
            .find(|(patterns, _)| patterns.iter().any(|p| pattern_matches(p, resource, group)))
            .map(|(_, key)| key.clone())
            .unwrap_or_else(|| "identity".into())
    }

    /// The KMS v2 provider that writes `resource` of `group` (its first provider is `kms` with `apiVersion: v2`): the
    /// one whose key_id rotations rewrite it.
    pub fn kms_v2_writer(&self, resource: &str, group: &str) -> Option<String> {
        self.write_key(resource, group).strip_prefix("kms:v2:").map(str::to_string)
    }

    /// The resources the copy names one by one (`secrets`, `shootstates.core.gardener.cloud`), not by wildcard.
    pub fn named_resources(&self) -> Vec<String> {
        self.entries.iter().flat_map(|(ps, _)| ps.iter()).filter(|p| !p.contains('*')).cloned().collect()
    }
}

/// `secrets`, `*.` (the core group), `*.apps`, `*.*`, `deployments.apps`.
fn pattern_matches(pattern: &str, resource: &str, group: &str) -> bool {
    if pattern == "*.*" {
        return true;
    }
    let (r, g) = pattern.split_once('.').unwrap_or((pattern, ""));
    g == group && (r == "*" || r == resource)
}

/// The write key of one provider, in the label form of stored values' prefixes (`k8s:enc:aescbc:v1:key2:`).
fn write_key(provider: &serde_yaml_ng::Mapping) -> Result<String, ProviderProblem> {
    let (name, config) = provider.iter().next().ok_or(ProviderProblem::Empty)?;
    let name = name.as_str().ok_or(ProviderProblem::NameNotString)?;
    match name {
        "identity" => Ok("identity".into()),
        "aesgcm" | "aescbc" | "secretbox" => {
            let key = config["keys"][0]["name"].as_str().ok_or_else(|| ProviderProblem::NoKeyName(name.into()))?;
            Ok(format!("{name}:v1:{key}"))
        }
        "kms" => {
            let kms = config["name"].as_str().ok_or(ProviderProblem::NoKmsName)?;
            let version = config["apiVersion"].as_str().unwrap_or("v1");
            Ok(format!("kms:{version}:{kms}"))
        }
        other => Err(ProviderProblem::Unknown(other.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COPY: &str = "apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets, configmaps]
    providers:
      - aescbc:
          keys:
            - {name: key2, secret: c2VjcmV0IGlzIHNlY3VyZSwgb3IgaXMgaXQ/Cg==}
            - {name: key1, secret: dGhpcyBpcyBwYXNzd29yZA==}
      - identity: {}
  - resources: ['*.apps']
    providers:
      - kms: {apiVersion: v2, name: vault, endpoint: unix:///tmp/kms.sock}
  - resources: ['*.*']
    providers:
      - identity: {}
";

    #[test]
    fn write_keys_follow_the_first_matching_entry() {
        let c = ConfigCopy::parse(COPY.as_bytes()).expect("copy");
        assert_eq!(c.write_key("secrets", ""), "aescbc:v1:key2");
        assert_eq!(c.write_key("configmaps", ""), "aescbc:v1:key2");
        assert_eq!(c.write_key("deployments", "apps"), "kms:v2:vault");
        assert_eq!(c.kms_v2_writer("deployments", "apps").as_deref(), Some("vault"));
        assert_eq!(c.kms_v2_writer("secrets", ""), None);
        assert_eq!(c.write_key("shootstates", "core.gardener.cloud"), "identity");
        assert_eq!(c.named_resources(), ["secrets", "configmaps"]);
        assert!(!format!("{c:?}").contains("c2VjcmV0"), "no key material kept");
    }

    #[test]
    fn the_hash_is_sha256_of_the_bytes_with_its_prefix() {
        // k8s.io/apiserver metrics_test.go: testAPIServerID's hash.
        assert_eq!(
            sha256_label(b"testAPIServerID"),
            "sha256:14f9d63e669337ac6bfda2e2162915ee6a6067743eddd4e5c374b572f951ff37"
        );
        assert_eq!(digest_of("k8s:enc:unstable:1:abc"), "abc");
        assert_eq!(digest_of("sha256:abc"), "abc");
    }

    #[test]
    fn a_provider_without_keys_is_refused() {
        let bad = "resources:\n  - resources: [secrets]\n    providers:\n      - aesgcm: {keys: []}\n";
        assert!(ConfigCopy::parse(bad.as_bytes()).is_err());
    }
}

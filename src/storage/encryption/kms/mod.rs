//! The `kms` provider with apiVersion v2 (KEP-3299), as kube-apiserver implements it: its configuration and its
//! checks ([`KmsConfig`]), the gRPC client of its plugin ([`client`]), the stored `EncryptedObject` and the data
//! encryption ([`envelope`]), the provider's write state, Status polling, health and read cache ([`provider`]), and
//! upstream's metrics ([`metrics`]). `../shared/reference/kms-v2.md` holds the upstream behaviour with sources.

pub mod client;
pub mod envelope;
mod key_ids;
pub use key_ids::{key_id_label, provider_label, stored_key_id_hash, stored_key_label, KeyIdChanges};
pub mod metrics;
mod provider;
pub mod timings;
pub use provider::KmsProvider;

/// The generated KMS v2 plugin API (proto/kmsv2/api.proto) and stored object (proto/kmsv2/encrypted_object.proto).
pub mod proto {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("v2");
}

use super::{Encoding, EncryptionConfig, Key};

use serde::Deserialize;
use std::time::Duration;

/// The KMS v2 side of a config: starting its providers, their health check, and the read step that may call a
/// plugin.
impl EncryptionConfig {
    /// Whether the config has KMS v2 providers (and so the `kms-providers` health check).
    pub fn has_kms(&self) -> bool {
        !self.kms.is_empty()
    }

    /// Probes each KMS v2 provider's plugin once (each within its timeout), then keeps polling them in the
    /// background for as long as this config lives. A plugin that is not up yet does not stop the start: its
    /// resources are unavailable until it answers.
    pub async fn start_kms(&self) {
        futures::future::join_all(self.kms.iter().map(|p| p.start())).await;
    }

    /// kube-apiserver's KMSCloseGracePeriod: twice the sum of the KMS v2 providers' timeouts.
    pub fn kms_close_grace_period(&self) -> std::time::Duration {
        self.kms.iter().map(|p| p.timeout()).sum::<std::time::Duration>() * 2
    }

    /// kube-apiserver's `kms-providers` health check: every KMS v2 provider's probe, failures named
    /// `kms-provider-<i>` (config order) and joined as Go's aggregate errors are.
    pub async fn check_kms(&self) -> std::result::Result<(), String> {
        let results = futures::future::join_all(self.kms.iter().map(|p| p.check())).await;
        let errs: Vec<String> = results
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| r.err().map(|e| format!("kms-provider-{i}: {e}")))
            .collect();
        match errs.len() {
            0 => Ok(()),
            1 => Err(errs.into_iter().next().unwrap_or_default()),
            _ => Err(format!("[{}]", errs.join(", "))),
        }
    }

    /// Makes a read of `stored` under `key` possible without waiting: a KMS v2 value whose DEK source is not cached
    /// has it decrypted by the plugin (one call, bounded by the provider's timeout). Other values need nothing.
    pub async fn prepare(&self, key: &str, stored: &[u8]) -> crate::storage::Result<()> {
        // Every read passes here: values of other providers leave at the cheapest test.
        if self.kms.is_empty() || !stored.starts_with(KMS_PREFIX.as_bytes()) {
            return Ok(());
        }
        let encoding = Encoding::of(stored);
        let Encoding::Encrypted { len, .. } = encoding else { return Ok(()) };
        match self.transformer(key).readers.get(&encoding.label()).map(|k| &**k) {
            Some(Key::Kms(p)) => p.prepare(&stored[len..]).await,
            _ => Ok(()),
        }
    }
}

/// What every value of a KMS v2 provider starts with, before `<name>:`.
pub const KMS_PREFIX: &str = "k8s:enc:kms:v2:";

/// kube-apiserver's default call timeout of a KMS provider.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// A `kms` provider as the file writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct FileKms {
    api_version: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    endpoint: String,
    #[serde(rename = "cachesize")]
    cache_size: Option<i64>,
    timeout: Option<String>,
}

/// One config error: the field path and kube-apiserver's message (`Invalid value: …`, `Required value: …`).
pub(super) type FieldError = (String, String);

/// A checked `kms` provider.
#[derive(Debug)]
pub(super) struct KmsConfig {
    pub name: String,
    pub address: client::SocketAddress,
    pub timeout: Duration,
}

impl FileKms {
    /// kube-apiserver's checks (k8s.io/apiserver `pkg/apis/apiserver/validation/validation_encryption.go` and
    /// `pkg/server/options/encryptionconfig/config.go`), with its field paths and messages. `names` are the KMS
    /// provider names seen so far in the file.
    pub(super) fn check(&self, field: &str, names: &[String]) -> Result<KmsConfig, FieldError> {
        let api_version = self.api_version.as_deref().unwrap_or("v1");
        let name_field = format!("{field}.name");
        if self.name.is_empty() {
            return Err((name_field, "Required value: name is a mandatory field for a provider".into()));
        }
        if api_version != "v1" && self.name.contains(':') {
            let n = &self.name;
            return Err((
                name_field,
                format!("Invalid value: {n:?}: invalid KMS provider name {n}, must not contain ':'"),
            ));
        }
        // Names are unique across KMS providers: v2 always, v1 under automatic reload; we refuse v1 anyway (below).
        if names.contains(&self.name) {
            let n = &self.name;
            return Err((
                name_field,
                format!("Invalid value: {n:?}: duplicate KMS provider name {n}, names must be unique"),
            ));
        }
        let timeout = match self.timeout.as_deref() {
            None => DEFAULT_TIMEOUT,
            Some(t) => match crate::duration::parse_duration(t) {
                Ok(d) if !d.is_zero() => d,
                _ => {
                    return Err((
                        format!("{field}.timeout"),
                        format!("Invalid value: {t:?}: timeout should be a positive value"),
                    ))
                }
            },
        };
        let address = check_endpoint(&format!("{field}.endpoint"), &self.endpoint)?;
        match (api_version, self.cache_size) {
            ("v2", Some(c)) => {
                return Err((
                    format!("{field}.cachesize"),
                    format!("Invalid value: {c}: cachesize is not supported in v2"),
                ))
            }
            ("v1", Some(0)) => {
                return Err((
                    format!("{field}.cachesize"),
                    "Invalid value: 0: cachesize should be a positive value, or negative to disable".into(),
                ))
            }
            _ => {}
        }
        match api_version {
            "v2" => Ok(KmsConfig { name: self.name.clone(), address, timeout }),
            "v1" => Err((
                format!("{field}.apiVersion"),
                "KMSv1 is deprecated and will only receive security updates going forward. Use KMSv2 instead.  Set \
                 --feature-gates=KMSv1=true to use the deprecated KMSv1 feature. (this server has no KMSv1: set \
                 apiVersion: v2)"
                    .into(),
            )),
            other => Err((
                format!("{field}.apiVersion"),
                format!("Invalid value: {other:?}: unsupported apiVersion apiVersion for KMS provider, only v1 and v2 are supported"),
            )),
        }
    }
}

/// `unix://<path>` or `unix:///@<abstract name>`.
fn check_endpoint(field: &str, endpoint: &str) -> Result<client::SocketAddress, FieldError> {
    if endpoint.is_empty() {
        return Err((field.into(), "Invalid value: \"\": endpoint is a mandatory field for a kms".into()));
    }
    if endpoint.chars().any(char::is_control) {
        return Err((
            field.into(),
            format!(
                "Invalid value: {endpoint:?}: invalid endpoint for kms provider, error: parse {endpoint:?}: net/url: \
                 invalid control character in URL"
            ),
        ));
    }
    let scheme = endpoint.split_once("://").map(|(s, _)| s).unwrap_or("");
    if scheme != "unix" {
        return Err((
            field.into(),
            format!(
                "Invalid value: {endpoint:?}: unsupported scheme {scheme:?} for KMS provider, only unix is supported"
            ),
        ));
    }
    client::SocketAddress::from_endpoint(endpoint)
        .ok_or_else(|| (field.into(), format!("Invalid value: {endpoint:?}: the unix endpoint names no socket path")))
}

#[cfg(test)]
mod config_tests;

//! [`EncryptionConfigHandle`]: the encryption config in use, replaced as a whole by a reload, and the check that
//! refuses a config which no longer holds a key that still encrypts stored values (kube-apiserver accepts such a
//! config, and every object under the dropped key then answers 500).

use super::EncryptionConfig;
use crate::storage::inspect::{count_values, ValueCounts};
use crate::storage::{Storage, StorageError};
use std::sync::Arc;
use tokio::sync::watch;

/// Where the stored values of every resource live.
const REGISTRY_PREFIX: &str = "/registry/";

/// A key that a refused config no longer holds, though stored values (or the writes in flight) still use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInUse {
    /// `shootstates.core.gardener.cloud`, `secrets`.
    pub resource: String,
    /// `aesgcm:v1:key1`.
    pub key: String,
    /// The stored values of `resource` encrypted with `key`.
    pub values: u64,
    /// `key` writes `resource` under the config in use: values written while the reload is checked would use it.
    pub writes: bool,
}

impl std::fmt::Display for KeyInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (key, resource, values) = (&self.key, &self.resource, self.values);
        match (values, self.writes) {
            (_, false) => write!(f, "key {key:?} still encrypts {values} stored values of {resource}"),
            (0, true) => write!(f, "key {key:?} still writes {resource}"),
            (_, true) => write!(f, "key {key:?} still encrypts {values} stored values of {resource} and writes it"),
        }
    }
}

/// Why a config was not put in use.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(
        "the encryption provider config drops keys still in use: {}; keep them as read keys (after the write key) \
         until every value is rewritten with the new key (`storage inspect` shows each value's key)",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    KeysInUse(Vec<KeyInUse>),
    #[error("counting the stored values per encryption key: {0}")]
    Count(#[from] StorageError),
    /// kube-apiserver swaps in a config with KMS v2 providers only once its `kms-providers` check passes.
    #[error("the KMS v2 providers of the new encryption provider config are not healthy after {waited:?}: {error}")]
    KmsUnhealthy { waited: std::time::Duration, error: String },
}

/// How often a reloaded config's `kms-providers` check is polled, and the least time it is given (upstream's
/// controller: every 100 ms, for max(KMSCloseGracePeriod, 10 s)).
const KMS_RELOAD_POLL: std::time::Duration = std::time::Duration::from_millis(100);
const KMS_RELOAD_MIN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts the KMS v2 providers of a new config and waits until its `kms-providers` check passes.
async fn wait_for_kms(config: &EncryptionConfig) -> Result<(), ReloadError> {
    if !config.has_kms() {
        return Ok(());
    }
    config.start_kms().await;
    let waited = config.kms_close_grace_period().max(KMS_RELOAD_MIN_WAIT);
    let deadline = tokio::time::Instant::now() + waited;
    loop {
        let error = match config.check_kms().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(ReloadError::KmsUnhealthy { waited, error });
        }
        tokio::time::sleep(KMS_RELOAD_POLL).await;
    }
}

/// The keys that `new` cannot read though stored values use them (per `counts`), or, with `current`, though
/// `current` writes with them. With `current`, a key that `current` cannot read either is not counted: its values
/// are unreadable already, and refusing would keep them so.
pub fn keys_in_use(new: &EncryptionConfig, counts: &ValueCounts, current: Option<&EncryptionConfig>) -> Vec<KeyInUse> {
    let mut refused: Vec<KeyInUse> = Vec::new();
    for (resource, key, values) in counts.iter() {
        let encrypted = key != "identity" && key != "malformed";
        let readable_now = current.is_none_or(|c| c.reads_for_resource(resource, key));
        if encrypted && readable_now && !new.reads_for_resource(resource, key) {
            refused.push(KeyInUse { resource: resource.into(), key: key.into(), values, writes: false });
        }
    }
    let Some(current) = current else { return refused };
    let mut resources: Vec<String> = counts.0.keys().cloned().collect();
    resources.extend(current.named_resources());
    resources.sort();
    resources.dedup();
    for resource in resources {
        let writer = current.write_key_for_resource(&resource);
        if writer == "identity" || new.reads_for_resource(&resource, &writer) {
            continue;
        }
        match refused.iter_mut().find(|k| k.resource == resource && k.key == writer) {
            Some(k) => k.writes = true,
            None => refused.push(KeyInUse { resource, key: writer, values: 0, writes: true }),
        }
    }
    refused
}

/// The encryption config in use: cheap to clone, read on every storage request ([`Self::current`]), replaced by
/// [`Self::reload`] after the check that no key in use is dropped.
#[derive(Clone)]
pub struct EncryptionConfigHandle {
    inner: Arc<Inner>,
}

struct Inner {
    config: watch::Sender<Arc<EncryptionConfig>>,
    /// The store below encryption (values as stored), counted by the check.
    store: Arc<dyn Storage>,
    /// One reload at a time: the check and the swap of one must not interleave with another's.
    reloading: tokio::sync::Mutex<()>,
}

impl EncryptionConfigHandle {
    /// `config` in use over `store`, the store below encryption.
    pub fn new(config: EncryptionConfig, store: Arc<dyn Storage>) -> Self {
        let (config, _) = watch::channel(Arc::new(config));
        Self { inner: Arc::new(Inner { config, store, reloading: tokio::sync::Mutex::new(()) }) }
    }

    /// The config in use now.
    pub fn current(&self) -> Arc<EncryptionConfig> {
        self.inner.config.borrow().clone()
    }

    /// Sees every config put in use from now on (the current one is marked seen).
    pub fn subscribe(&self) -> watch::Receiver<Arc<EncryptionConfig>> {
        self.inner.config.subscribe()
    }

    /// Puts `config` in use unless it drops a key still in use ([`keys_in_use`] against the config in use) or its
    /// KMS v2 providers do not become healthy ([`ReloadError::KmsUnhealthy`]); the config in use stays otherwise. Counts every stored value (see [`count_values`] for the cost) without holding
    /// anything that requests wait for.
    pub async fn reload(&self, config: EncryptionConfig) -> Result<(), ReloadError> {
        let _one_at_a_time = self.inner.reloading.lock().await;
        wait_for_kms(&config).await?;
        let counts = self.count().await?;
        let refused = keys_in_use(&config, &counts, Some(&self.current()));
        if !refused.is_empty() {
            return Err(ReloadError::KeysInUse(refused));
        }
        self.inner.config.send_replace(Arc::new(config));
        Ok(())
    }

    /// The check of a start: the keys that stored values use and the config in use cannot read.
    pub async fn check_start(&self) -> Result<(), ReloadError> {
        let counts = self.count().await?;
        let refused = keys_in_use(&self.current(), &counts, None);
        match refused.is_empty() {
            true => Ok(()),
            false => Err(ReloadError::KeysInUse(refused)),
        }
    }

    /// Stored values per resource and key.
    pub async fn count(&self) -> Result<ValueCounts, StorageError> {
        count_values(self.inner.store.as_ref(), REGISTRY_PREFIX).await
    }
}

//! `--encryption-provider-config-automatic-reload`: the `--encryption-provider-config` file reloaded while serving,
//! and kube-apiserver's metrics of it (k8s.io/apiserver `pkg/server/options/encryptionconfig/metrics/metrics.go`:
//! names, labels, label values and HELP; `controller/controller.go`: when each is recorded).
//!
//! kube-apiserver polls the file's content hash every minute. This watcher polls it every second, and does not use
//! inotify: the file is usually a mounted Secret or ConfigMap, which the kubelet swaps by renaming a symlinked
//! directory (an inotify watch on the file sees nothing), editors replace files by rename, and network filesystems
//! send no events; reading a file of a few KB and hashing it once a second costs nothing measurable, and the poll
//! finds every change whatever made it. A new file that does not parse, or that drops a key still in use
//! ([`EncryptionConfigHandle::reload`]), keeps the config in use, is logged and counted as a failure, and is tried
//! again with a doubling delay (as upstream requeues it rate-limited): a refused config is accepted once the values
//! that use the dropped key have been rewritten.

use crate::server::metrics::Label;
use crate::storage::encryption::{content_hash, EncryptionConfig, EncryptionConfigHandle};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// How often the file's content hash is compared with the config in use.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The longest wait before a file that failed is tried again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(64);

/// `apiserver_encryption_config_controller_automatic_reloads_total`'s and `..._last_timestamp_seconds`' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    /// `success` or `failure`.
    status: Label,
    apiserver_id_hash: Label,
}

/// `apiserver_encryption_config_controller_last_config_info`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigInfoLabels {
    apiserver_id_hash: Label,
    /// [`EncryptionConfig::hash`].
    hash: Label,
}

/// kube-apiserver's `apiserver_id_hash`: `sha256:<hex>` of the apiserver's identity (`getHash` in upstream's
/// metrics.go), empty for an empty identity. Our identity is the scheduler's (`<hostname>_<random>`, logged at start).
pub fn apiserver_id_hash(identity: &str) -> String {
    use sha2::Digest;
    match identity.is_empty() {
        true => String::new(),
        false => format!("sha256:{:x}", sha2::Sha256::digest(identity.as_bytes())),
    }
}

/// The encryption config's metric families, for one identity.
pub struct EncryptionConfigMetrics {
    id_hash: Label,
    reloads: Family<ReloadLabels, Counter>,
    last_reload: Family<ReloadLabels, Gauge<f64, AtomicU64>>,
    config_info: Family<ConfigInfoLabels, Gauge>,
}

impl EncryptionConfigMetrics {
    pub fn register(registry: &mut Registry, identity: &str) -> Self {
        let metrics = Self {
            id_hash: Label::Owned(apiserver_id_hash(identity)),
            reloads: Family::default(),
            last_reload: Family::default(),
            config_info: Family::default(),
        };
        registry.register(
            "apiserver_encryption_config_controller_automatic_reloads_total",
            "[ALPHA] Total number of reload successes and failures of encryption configuration split by apiserver identity.",
            metrics.reloads.clone(),
        );
        registry.register(
            "apiserver_encryption_config_controller_automatic_reload_last_timestamp_seconds",
            "[ALPHA] Timestamp of the last successful or failed automatic reload of encryption configuration split by apiserver identity.",
            metrics.last_reload.clone(),
        );
        registry.register(
            "apiserver_encryption_config_controller_last_config_info",
            "[ALPHA] Information about the last applied encryption configuration with hash as label, split by apiserver identity.",
            metrics.config_info.clone(),
        );
        metrics
    }

    /// The config with `hash` is in use (at start, and after each successful reload).
    pub fn config_in_use(&self, hash: &str) {
        self.config_info.clear();
        let labels = ConfigInfoLabels { apiserver_id_hash: self.id_hash.clone(), hash: Label::Owned(hash.into()) };
        self.config_info.get_or_create(&labels).set(1);
    }

    fn reloaded(&self, status: &'static str) {
        let labels = ReloadLabels { status: Label::Borrowed(status), apiserver_id_hash: self.id_hash.clone() };
        self.reloads.get_or_create(&labels).inc();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_reload.get_or_create(&labels).set(now.as_secs_f64());
    }
}

/// Why a new file was not put in use.
#[derive(Debug, thiserror::Error)]
enum ReloadFailure {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(transparent)]
    Config(#[from] crate::storage::encryption::ConfigError),
    #[error(transparent)]
    Refused(#[from] crate::storage::encryption::ReloadError),
}

/// A file content that failed, and when to try it again.
struct Failed {
    hash: String,
    delay: Duration,
    retry_at: Instant,
}

/// Polls `path` every [`POLL_INTERVAL`] and reloads `handle` when its content changes, for as long as the process
/// runs.
pub fn spawn(path: PathBuf, handle: EncryptionConfigHandle, metrics: EncryptionConfigMetrics) {
    tokio::spawn(async move {
        let mut failed: Option<Failed> = None;
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            poll(&path, &handle, &metrics, &mut failed).await;
        }
    });
}

/// One look at the file: nothing when it is the config in use or a failed content whose retry is not due.
async fn poll(
    path: &PathBuf,
    handle: &EncryptionConfigHandle,
    metrics: &EncryptionConfigMetrics,
    failed: &mut Option<Failed>,
) {
    let bytes = tokio::fs::read(path).await;
    let hash = bytes.as_ref().map(|b| content_hash(b)).unwrap_or_default();
    if bytes.is_ok() && hash == handle.current().hash() {
        *failed = None;
        return;
    }
    if failed.as_ref().is_some_and(|f| f.hash == hash && Instant::now() < f.retry_at) {
        return;
    }
    let result = match bytes {
        Err(source) => Err(ReloadFailure::Read { path: path.display().to_string(), source }),
        Ok(bytes) => reload(&bytes, handle).await,
    };
    match result {
        Ok(config) => {
            tracing::info!(path = %path.display(), hash = %config.hash(), resources = ?config.describe(),
                "encryption provider config reloaded");
            metrics.reloaded("success");
            metrics.config_in_use(config.hash());
            *failed = None;
        }
        Err(e) => {
            metrics.reloaded("failure");
            let delay = match failed.take() {
                Some(f) if f.hash == hash => (f.delay * 2).min(MAX_RETRY_DELAY),
                _ => POLL_INTERVAL * 2,
            };
            tracing::error!(path = %path.display(), error = %e, retry_in = ?delay,
                "encryption provider config not reloaded; the config in use stays");
            *failed = Some(Failed { hash, delay, retry_at: Instant::now() + delay });
        }
    }
}

/// Parses `bytes` and puts the config in use unless [`EncryptionConfigHandle::reload`] refuses it.
async fn reload(
    bytes: &[u8],
    handle: &EncryptionConfigHandle,
) -> Result<std::sync::Arc<EncryptionConfig>, ReloadFailure> {
    let config = EncryptionConfig::from_bytes(bytes)?;
    handle.reload(config).await?;
    Ok(handle.current())
}

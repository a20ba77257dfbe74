//! One `kms` provider (apiVersion v2) of a loaded config, as kube-apiserver runs it (k8s.io/apiserver
//! `pkg/server/options/encryptionconfig/config.go`, `.../envelope/kmsv2/envelope.go`):
//! - the write state: one random seed per provider per loaded config, encrypted by one Encrypt call, and made again
//!   when Status reports a new key_id (adopted only when Encrypt returns that key_id);
//! - the Status probe behind the poll loop and the `kms-providers` health check, with its cached result;
//! - the cache of decrypted DEK sources of the values read, so that the plugin is off the request path.
//!
//! Writes are refused before the first good Status and Encrypt, and 3 minutes after the last Status with a valid
//! key_id. Reads need a write state too (their staleness is against its key_id), then a cached DEK source or one
//! Decrypt call.

use super::client::{KmsClient, SocketAddress};
use super::envelope::{self, DataKeySource};
use super::proto::{EncryptedDekSourceType, EncryptedObject};
use super::timings::Timings;
use super::{metrics, KMS_PREFIX};
use crate::storage::{Result, StorageError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

/// How long a decrypted DEK source is kept (upstream's cache TTL). Expired entries are served until collected.
const CACHE_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Expired entries are collected when the cache has grown by this many since the last collection.
const COLLECT_EVERY: usize = 1024;
/// The only type written: HKDF-SHA256 extended-nonce AES-GCM from a seed.
const WRITE_TYPE: i32 = EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed as i32;

/// The seed that writes, and what every value it writes carries.
struct WriteState {
    source: Arc<DataKeySource>,
    key_id: String,
    encrypted_dek_source: Vec<u8>,
    annotations: HashMap<String, Vec<u8>>,
    cache_key: [u8; 32],
    /// Writes are refused after this: the plugin has not confirmed the key_id since `expires - write_ttl`.
    expires: SystemTime,
}

/// The last probe's result and when it was made.
struct LastProbe {
    at: Instant,
    /// The bare error (what a cached answer returns), or success.
    result: std::result::Result<(), String>,
}

pub struct KmsProvider {
    name: String,
    /// `k8s:enc:kms:v2:<name>:`
    prefix: Vec<u8>,
    client: KmsClient,
    timings: Timings,
    state: RwLock<Option<Arc<WriteState>>>,
    cache: Mutex<SourceCache>,
    /// One probe at a time, holding the last result.
    probe: tokio::sync::Mutex<Option<LastProbe>>,
    /// The first Status version seen: a plugin must not change its API version.
    first_version: Mutex<Option<String>>,
    /// The key_id that writes, for whoever acts on a change (the key-rotation trigger).
    key_ids: tokio::sync::watch::Sender<Option<String>>,
}

#[derive(Default)]
struct SourceCache {
    entries: HashMap<[u8; 32], (Arc<DataKeySource>, Instant)>,
    size_at_last_collection: usize,
}

impl std::fmt::Debug for KmsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KmsProvider").field("name", &self.name).finish()
    }
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn go_error<E: std::fmt::Display>(e: &Option<E>) -> String {
    e.as_ref().map(ToString::to_string).unwrap_or_else(|| "<nil>".into())
}

impl KmsProvider {
    pub fn new(name: &str, address: SocketAddress, timeout: Duration, timings: Timings) -> Self {
        Self {
            name: name.to_string(),
            prefix: format!("{KMS_PREFIX}{name}:").into_bytes(),
            client: KmsClient::new(name, address, timeout),
            timings,
            state: RwLock::new(None),
            cache: Mutex::new(SourceCache::default()),
            probe: tokio::sync::Mutex::new(None),
            first_version: Mutex::new(None),
            key_ids: tokio::sync::watch::channel(None).0,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bound of each call to the plugin.
    pub fn timeout(&self) -> Duration {
        self.client.timeout()
    }

    /// `kms:v2:<name>`, the label of its values (`storage inspect`, the replicas' reports).
    pub fn label(&self) -> String {
        format!("kms:v2:{}", self.name)
    }

    fn prefix_str(&self) -> String {
        String::from_utf8_lossy(&self.prefix).into_owned()
    }

    fn current(&self) -> Option<Arc<WriteState>> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The write state, or upstream's error when there is none yet.
    fn state_or_err(&self) -> Result<Arc<WriteState>> {
        self.current().ok_or_else(|| {
            StorageError::Internal(format!(
                "got unexpected nil transformer (KMS provider {:?} has no data encryption key yet: no successful \
                 Status and Encrypt with its plugin since the encryption config was loaded)",
                self.name
            ))
        })
    }

    /// The key_id that writes now, if any.
    pub fn write_key_id(&self) -> Option<String> {
        self.current().map(|s| s.key_id.clone())
    }

    /// Sees every key_id this provider writes with from now on (the current one is marked seen).
    pub fn subscribe_key_id(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.key_ids.subscribe()
    }

    /// Probes the plugin once now (waiting for it, within the timeout), then polls it in the background until the
    /// provider is dropped: every minute while healthy, every 10 s after a failure.
    pub async fn start(self: &Arc<Self>) {
        let healthy = self.probe(true).await.is_ok();
        if !healthy {
            tracing::warn!(provider = %self.name, "KMS v2 plugin not ready at start; retrying in the background");
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        let mut healthy = healthy;
        tokio::spawn(async move {
            loop {
                let wait = match (healthy, weak.upgrade()) {
                    (_, None) => return,
                    (true, Some(p)) => p.timings.poll,
                    (false, Some(p)) => p.timings.retry,
                };
                tokio::time::sleep(wait).await;
                let Some(p) = weak.upgrade() else { return };
                healthy = match p.probe(true).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(provider = %p.name, error = %e, "KMS v2 plugin Status probe failed");
                        false
                    }
                };
            }
        });
    }

    /// The health check: the last probe's result while fresh (20 s after success, 3 s after failure), else a new
    /// probe (rotation included).
    pub async fn check(&self) -> std::result::Result<(), String> {
        self.probe(false).await
    }

    async fn probe(&self, force: bool) -> std::result::Result<(), String> {
        let mut last = self.probe.lock().await;
        if let Some(l) = last.as_ref().filter(|_| !force) {
            let ttl = if l.result.is_ok() { self.timings.healthy_cache } else { self.timings.failed_cache };
            if l.at.elapsed() < ttl {
                return l.result.clone();
            }
        }
        let (stored, returned) = match self.probe_now().await {
            Ok(()) => (Ok(()), Ok(())),
            Err((stored, returned)) => (Err(stored), Err(returned)),
        };
        *last = Some(LastProbe { at: Instant::now(), result: stored });
        returned
    }

    /// One Status call and what follows from it (upstream's `check` and `isKMSv2ProviderHealthyAndMaybeRotateDEK`):
    /// healthz, version and key_id checked, the seed rotated or its expiry extended, every failure gathered as Go's
    /// aggregate error. An error is (what a cached answer repeats, what this one returns).
    async fn probe_now(&self) -> std::result::Result<(), (String, String)> {
        let status = self.client.status().await.map_err(|e| {
            let wrapped = format!(
                "failed to perform status section of the healthz check for KMS Provider {}, error: {e}",
                self.name
            );
            (e.to_string(), wrapped)
        })?;
        let mut errs = Vec::new();
        if status.healthz != "ok" {
            errs.push(format!("got unexpected healthz status: {}", status.healthz));
        }
        if let Err(e) = self.check_version(&status.version) {
            errs.push(e);
        }
        match envelope::validate_key_id(&status.key_id) {
            Err(e) => {
                metrics::invalid_key_id_from_status(&self.name, e.code());
                errs.push(format!("got invalid KMSv2 KeyID hash {:?}: {e}", envelope::key_id_hash(&status.key_id)));
            }
            Ok(()) => {
                metrics::key_id_from_status(&self.name, &envelope::key_id_hash(&status.key_id));
                if let Err(e) = self.rotate_on_key_id_change(&status.key_id).await {
                    errs.push(e);
                }
            }
        }
        let aggregate = match errs.len() {
            0 => return Ok(()),
            1 => errs.remove(0),
            _ => format!("[{}]", errs.join(", ")),
        };
        let e = format!("kmsv2 Provider {} is not healthy, error: {aggregate}", self.name);
        Err((e.clone(), e))
    }

    /// `v2` or `v2beta1`, and the version of the first Status reply.
    fn check_version(&self, version: &str) -> std::result::Result<(), String> {
        if version != "v2" && version != "v2beta1" {
            return Err(format!("expected KMSv2 API version v2, got {version}"));
        }
        let mut first = self.first_version.lock().unwrap_or_else(|p| p.into_inner());
        let first = first.get_or_insert_with(|| version.to_string());
        match first == version {
            true => Ok(()),
            false => Err(format!(
                "KMSv2 API version should not change after the initial status response version {first}, got {version}"
            )),
        }
    }

    /// Status said `status_key_id`: the same key_id as the write state extends its expiry; another (or no state)
    /// means a new seed and one Encrypt, adopted only when Encrypt returns that same key_id. Otherwise the old
    /// state stays until it expires.
    async fn rotate_on_key_id_change(&self, status_key_id: &str) -> std::result::Result<(), String> {
        // From before the call, as upstream: the plugin vouched for the key_id when Status answered.
        let expires = SystemTime::now() + self.timings.write_ttl;
        let state = self.current();
        if let Some(s) = state.as_ref().filter(|s| s.key_id == status_key_id) {
            let extended = WriteState {
                source: s.source.clone(),
                key_id: s.key_id.clone(),
                encrypted_dek_source: s.encrypted_dek_source.clone(),
                annotations: s.annotations.clone(),
                cache_key: s.cache_key,
                expires,
            };
            *self.state.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(extended));
            return Ok(());
        }
        let uid = uuid::Uuid::new_v4().to_string();
        let (generated, err_gen) = match self.generate().await {
            Ok(g) => (Some(g), None),
            Err(e) => (None, Some(e)),
        };
        let encrypt_key_id = generated.as_ref().map(|g| g.key_id.clone()).unwrap_or_default();
        if let Some(mut g) = generated.filter(|g| g.key_id == status_key_id) {
            g.expires = expires;
            let g = Arc::new(g);
            self.remember(g.cache_key, g.source.clone());
            *self.state.write().unwrap_or_else(|p| p.into_inner()) = Some(g.clone());
            self.key_ids.send_replace(Some(g.key_id.clone()));
            tracing::info!(provider = %self.name, key_id_hash = %envelope::key_id_hash(&g.key_id), uid = %uid,
                "KMS v2: new data encryption key seed in use");
            return Ok(());
        }
        let err_state = state.is_none().then_some("got unexpected nil transformer");
        Err(format!(
            "failed to rotate DEK uid={uid:?}, useSeed=true, errState={}, errGen={}, statusKeyIDHash={:?}, \
             encryptKeyIDHash={:?}, stateKeyIDHash={:?}, expirationTimestamp={}",
            go_error(&err_state),
            go_error(&err_gen),
            envelope::key_id_hash(status_key_id),
            envelope::key_id_hash(&encrypt_key_id),
            envelope::key_id_hash(&state.as_ref().map(|s| s.key_id.clone()).unwrap_or_default()),
            // Go's zero time when there is no state.
            state.as_ref().map(|s| rfc3339(s.expires)).unwrap_or_else(|| "0001-01-01T00:00:00Z".into()),
        ))
    }

    /// A new seed, encrypted by the plugin, checked as a stored value would be.
    async fn generate(&self) -> std::result::Result<WriteState, String> {
        let source = DataKeySource::random_seed()?;
        let resp =
            self.client.encrypt(source.seed_bytes()).await.map_err(|e| format!("failed to encrypt DEK, error: {e}"))?;
        let check = EncryptedObject {
            encrypted_data: vec![0],
            key_id: resp.key_id.clone(),
            encrypted_dek_source: resp.ciphertext.clone(),
            annotations: resp.annotations.clone(),
            encrypted_dek_source_type: WRITE_TYPE,
        };
        envelope::validate(&check)?;
        let cache_key = envelope::cache_key(WRITE_TYPE, &resp.ciphertext, &resp.key_id, &resp.annotations);
        Ok(WriteState {
            source: Arc::new(source),
            key_id: resp.key_id,
            encrypted_dek_source: resp.ciphertext,
            annotations: resp.annotations,
            cache_key,
            expires: SystemTime::UNIX_EPOCH,
        })
    }

    fn remember(&self, key: [u8; 32], source: Arc<DataKeySource>) {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.entries.insert(key, (source, Instant::now()));
        if c.entries.len() >= c.size_at_last_collection + COLLECT_EVERY {
            c.entries.retain(|_, (_, at)| at.elapsed() < CACHE_TTL);
            c.size_at_last_collection = c.entries.len();
        }
        metrics::cache_size(&self.name, c.entries.len());
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Arc<DataKeySource>> {
        let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.entries.get(key).map(|(s, _)| s.clone())
    }

    /// The stored form of `plaintext` under the storage key `key`, with the write seed.
    pub fn encrypt(&self, key: &str, plaintext: &[u8]) -> Result<Vec<u8>> {
        let start = Instant::now();
        let result = self.encrypt_inner(key, plaintext);
        self.record("to_storage", key, &result, start);
        result
    }

    fn encrypt_inner(&self, key: &str, plaintext: &[u8]) -> Result<Vec<u8>> {
        let state = self.state_or_err()?;
        let now = SystemTime::now();
        if now > state.expires {
            return Err(StorageError::Internal(format!(
                "encryptedDEKSource with keyID hash {:?} expired at {} (current time is {})",
                envelope::key_id_hash(&state.key_id),
                rfc3339(state.expires),
                rfc3339(now)
            )));
        }
        let failed = |e: String| StorageError::Internal(format!("encrypting {key} with {}: {e}", self.label()));
        let object = EncryptedObject {
            encrypted_data: state.source.seal(plaintext, key.as_bytes()).map_err(failed)?,
            key_id: state.key_id.clone(),
            encrypted_dek_source: state.encrypted_dek_source.clone(),
            annotations: state.annotations.clone(),
            encrypted_dek_source_type: WRITE_TYPE,
        };
        let encoded = envelope::encode(&object).map_err(failed)?;
        metrics::key_id_used("to_storage", &self.name, &envelope::key_id_hash(&state.key_id));
        let mut out = Vec::with_capacity(self.prefix.len() + encoded.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(&encoded);
        Ok(out)
    }

    fn record<T>(&self, kind: &str, key: &str, result: &Result<T>, start: Instant) {
        let resource = crate::storage::encryption::resource_of_key(key).unwrap_or_default();
        let status = if result.is_ok() { "OK" } else { "unknown-non-grpc" };
        metrics::transformation(&resource, kind, &self.prefix_str(), status, start.elapsed());
    }

    /// Makes sure the DEK source of `data` (a stored value after the prefix) is cached: a Decrypt call on a miss.
    /// What does not decode is left for [`Self::decrypt`] to report.
    pub async fn prepare(&self, data: &[u8]) -> Result<()> {
        let state = self.state_or_err()?;
        let Ok(o) = envelope::decode(data) else { return Ok(()) };
        let key = envelope::cache_key(o.encrypted_dek_source_type, &o.encrypted_dek_source, &o.key_id, &o.annotations);
        if key == state.cache_key || self.cached(&key).is_some() {
            return Ok(());
        }
        metrics::cache_miss();
        let plaintext = self
            .client
            .decrypt(&o.encrypted_dek_source, &o.key_id, &o.annotations)
            .await
            .map_err(|e| StorageError::Internal(format!("failed to decrypt DEK, error: {e}")))?;
        let source = DataKeySource::new(o.encrypted_dek_source_type, plaintext)
            .map_err(|e| StorageError::Internal(format!("failed to decrypt DEK, error: {e}")))?;
        self.remember(key, Arc::new(source));
        Ok(())
    }

    /// The plaintext of `data` stored under `key`, and whether it is stale: written under another key_id or type
    /// than the current write state's. Its DEK source must be cached ([`Self::prepare`]).
    pub fn decrypt(&self, key: &str, data: &[u8]) -> Result<(Vec<u8>, bool)> {
        let start = Instant::now();
        let result = self.decrypt_inner(key, data);
        self.record("from_storage", key, &result, start);
        result
    }

    fn decrypt_inner(&self, key: &str, data: &[u8]) -> Result<(Vec<u8>, bool)> {
        let state = self.state_or_err()?;
        let failed = |e: String| StorageError::Internal(format!("cannot decrypt {key} with {}: {e}", self.label()));
        let o = envelope::decode(data).map_err(failed)?;
        let cache_key =
            envelope::cache_key(o.encrypted_dek_source_type, &o.encrypted_dek_source, &o.key_id, &o.annotations);
        let source = match cache_key == state.cache_key {
            true => state.source.clone(),
            false => self.cached(&cache_key).ok_or_else(|| {
                StorageError::Internal(format!(
                    "failed to decrypt DEK, error: the DEK source of {key} is not cached and was not decrypted"
                ))
            })?,
        };
        let plain = source.open(&o.encrypted_data, key.as_bytes()).map_err(failed)?;
        metrics::key_id_used("from_storage", &self.name, &envelope::key_id_hash(&o.key_id));
        let stale = o.key_id != state.key_id || o.encrypted_dek_source_type != WRITE_TYPE;
        Ok((plain, stale))
    }
}

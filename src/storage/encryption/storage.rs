//! [`EncryptedStorage`]: any [`Storage`] with values encrypted on the way in and decrypted on the way out, as
//! kube-apiserver's transformer sits between its registry and etcd. Each request reads the config in use when it
//! starts ([`EncryptionConfigHandle::current`]), so a reload applies from the next request on. Before a value is
//! decrypted, [`EncryptionConfig::prepare`] has a KMS v2 provider's plugin decrypt its DEK source when it is not
//! cached (the one read step that waits, bounded by the provider's timeout); a failure there is the request's
//! error (kube-apiserver's "failed to decrypt DEK"), not a corrupt value.

use super::replicas::WriteGate;
use super::{Encoding, EncryptionConfig, EncryptionConfigHandle};
use crate::storage::{Event, KeyValue, ListOptions, ListResult, Result, Revision, Storage, StorageError, WatchItem};
use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::mpsc;

/// How many decrypted events wait for a slow watcher.
const WATCH_BUFFER: usize = 128;

/// A [`Storage`] that encrypts values on their way to `inner` and decrypts them on their way back (get, list, the
/// values a delete returns, and watch events with their previous values).
pub struct EncryptedStorage {
    inner: Arc<dyn Storage>,
    config: EncryptionConfigHandle,
    /// With several replicas: which of the config's keys writes, so that every live replica reads what this one
    /// writes ([`super::replicas`]). None: the configured writer.
    gate: Option<Arc<WriteGate>>,
}

impl EncryptedStorage {
    pub fn new(inner: Arc<dyn Storage>, config: EncryptionConfig) -> Self {
        let config = EncryptionConfigHandle::new(config, inner.clone());
        Self { inner, config, gate: None }
    }

    /// Over `inner`, with the config of `handle` (whose store must be `inner`).
    pub fn with_handle(inner: Arc<dyn Storage>, handle: EncryptionConfigHandle) -> Self {
        Self { inner, config: handle, gate: None }
    }

    /// Writes with the key `gate` says every live replica reads.
    pub fn with_gate(mut self, gate: Arc<WriteGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The config in use now.
    pub fn config(&self) -> Arc<EncryptionConfig> {
        self.config.current()
    }

    /// What reloads the config.
    pub fn handle(&self) -> &EncryptionConfigHandle {
        &self.config
    }

    fn encrypt(&self, config: &EncryptionConfig, key: &str, value: &[u8]) -> Result<Bytes> {
        match &self.gate {
            Some(gate) => config.encrypt_with(key, value, &gate.writer_in(config, key)),
            None => config.encrypt(key, value),
        }
    }

    /// The value decrypted; with a gate, stale means "not written with the key this replica writes now" (a value
    /// under the new key while the others cannot read it yet is not rewritten back, nor one under the old key
    /// forward), or written by a KMS v2 provider under another key_id than the one it writes with now (every replica
    /// reads every key_id of a provider).
    fn decrypt_kv(
        &self,
        config: &EncryptionConfig,
        kv: KeyValue,
    ) -> std::result::Result<KeyValue, crate::storage::CorruptValue> {
        let Some(gate) = &self.gate else { return config.try_decrypt_kv(kv) };
        let mut out = kv;
        let written_with = Encoding::of(&out.value).label();
        let d = config
            .decrypt(&out.key, &out.value)
            .map_err(|e| crate::storage::CorruptValue { key: out.key.clone(), message: e.to_string() })?;
        // Which provider writes is the gate's; a KMS v2 value under an old key_id is stale whatever it says.
        out.stale = out.stale || written_with != gate.writer_in(config, &out.key) || d.key_id_stale;
        out.value = d.value;
        Ok(out)
    }
}

#[async_trait]
impl Storage for EncryptedStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let config = self.config();
        let corrupt = |v| StorageError::Corrupt(vec![v]);
        let Some(kv) = self.inner.get(key).await? else { return Ok(None) };
        config.prepare(&kv.key, &kv.value).await?;
        self.decrypt_kv(&config, kv).map_err(corrupt).map(Some)
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let mut result = self.inner.list(prefix, opts).await?;
        // Every value of the page that does not decrypt is named, not just the first.
        let mut corrupt = Vec::new();
        let config = self.config();
        for kv in &result.items {
            config.prepare(&kv.key, &kv.value).await?;
        }
        result.items = std::mem::take(&mut result.items)
            .into_iter()
            .filter_map(|kv| self.decrypt_kv(&config, kv).map_err(|v| corrupt.push(v)).ok())
            .collect();
        match corrupt.is_empty() {
            true => Ok(result),
            false => Err(StorageError::Corrupt(corrupt)),
        }
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        let stored = self.encrypt(&self.config(), key, &value)?;
        let kv = self.inner.create(key, stored).await?;
        Ok(KeyValue { value, stale: false, ..kv })
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        let stored = self.encrypt(&self.config(), key, &value)?;
        let kv = self.inner.update(key, stored, expected).await?;
        Ok(KeyValue { value, stale: false, ..kv })
    }

    /// The deleted value, decrypted; one that does not decrypt (the forced delete of an unreadable object) is
    /// returned as it was stored, since the delete itself has happened.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        let kv = self.inner.delete(key, expected).await?;
        let config = self.config();
        if config.prepare(&kv.key, &kv.value).await.is_err() {
            return Ok(kv);
        }
        Ok(config.decrypt_kv(kv.clone()).unwrap_or(kv))
    }

    async fn sync_revision(&self) -> Revision {
        self.inner.sync_revision().await
    }

    async fn check_health(&self) -> Result<()> {
        self.inner.check_health().await
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<mpsc::Receiver<WatchItem>> {
        let mut events = self.inner.watch(prefix, after).await?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let config = self.config.clone();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    // The consumer went away: stop (and drop the backend's stream).
                    _ = tx.closed() => return,
                    item = events.recv() => item,
                };
                let Some(item) = item else { return };
                let item = match item {
                    WatchItem::Error(e) => WatchItem::Error(e),
                    WatchItem::Event(ev) => match prepare_and_decrypt_event(&config.current(), &ev).await {
                        Ok(ev) => WatchItem::Event(Arc::new(ev)),
                        Err(e) => {
                            // Like kube-apiserver, a value that cannot be decrypted ends the watch with an error.
                            let _ = tx.send(WatchItem::Error(e)).await;
                            return;
                        }
                    },
                };
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }

    fn progress_revision(&self) -> Revision {
        self.inner.progress_revision()
    }

    fn current_revision(&self) -> Revision {
        self.inner.current_revision()
    }
}

/// The event decrypted, once the DEK sources of its values are at hand.
async fn prepare_and_decrypt_event(config: &EncryptionConfig, ev: &Event) -> Result<Event> {
    config.prepare(&ev.key, &ev.value).await?;
    if let Some(p) = &ev.prev {
        config.prepare(&p.key, &p.value).await?;
    }
    decrypt_event(config, ev)
}

fn decrypt_event(config: &EncryptionConfig, ev: &Event) -> Result<Event> {
    let corrupt = |e: StorageError| StorageError::corrupt(&ev.key, e.to_string());
    Ok(Event {
        kind: ev.kind,
        revision: ev.revision,
        key: ev.key.clone(),
        value: config.decrypt(&ev.key, &ev.value).map_err(corrupt)?.value,
        prev: ev.prev.clone().map(|p| config.decrypt_kv(p)).transpose()?,
    })
}

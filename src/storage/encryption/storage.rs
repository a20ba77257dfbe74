//! [`EncryptedStorage`]: any [`Storage`] with values encrypted on the way in and decrypted on the way out, as
//! kube-apiserver's transformer sits between its registry and etcd.

use super::EncryptionConfig;
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
    config: Arc<EncryptionConfig>,
}

impl EncryptedStorage {
    pub fn new(inner: Arc<dyn Storage>, config: EncryptionConfig) -> Self {
        Self { inner, config: Arc::new(config) }
    }

    pub fn config(&self) -> &EncryptionConfig {
        &self.config
    }

    /// The config, shared.
    pub fn config_arc(&self) -> Arc<EncryptionConfig> {
        self.config.clone()
    }
}

#[async_trait]
impl Storage for EncryptedStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.get(key).await?.map(|kv| self.config.decrypt_kv(kv)).transpose()
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let mut result = self.inner.list(prefix, opts).await?;
        // Every value of the page that does not decrypt is named, not just the first.
        let mut corrupt = Vec::new();
        result.items = std::mem::take(&mut result.items)
            .into_iter()
            .filter_map(|kv| self.config.try_decrypt_kv(kv).map_err(|v| corrupt.push(v)).ok())
            .collect();
        match corrupt.is_empty() {
            true => Ok(result),
            false => Err(StorageError::Corrupt(corrupt)),
        }
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        let stored = self.config.encrypt(key, &value)?;
        let kv = self.inner.create(key, stored).await?;
        Ok(KeyValue { value, stale: false, ..kv })
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        let stored = self.config.encrypt(key, &value)?;
        let kv = self.inner.update(key, stored, expected).await?;
        Ok(KeyValue { value, stale: false, ..kv })
    }

    /// The deleted value, decrypted; one that does not decrypt (the forced delete of an unreadable object) is
    /// returned as it was stored, since the delete itself has happened.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        let kv = self.inner.delete(key, expected).await?;
        Ok(self.config.decrypt_kv(kv.clone()).unwrap_or(kv))
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
                    WatchItem::Event(ev) => match decrypt_event(&config, &ev) {
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

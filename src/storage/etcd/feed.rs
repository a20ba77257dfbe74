//! The one etcd watch per replica: it fills the watch cache, then applies every event to it and hands the events
//! to the hub (watchers), in revision order.

use super::cache::Cache;
use super::{prefix_end, registry_key, rev, storage_error, to_key_value, LIST_BATCH};
use crate::storage::{Event, EventKind, KeyValue, Result, Revision, StorageError, WatchHub};
use bytes::Bytes;
use etcd_client::{EventType, GetOptions, KvClient, WatchClient, WatchOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The one etcd watch on the whole prefix that feeds the cache and the hub; it resumes after its last revision
/// whenever the stream breaks (etcd restarted, network), so watchers see no gap and the cache stays valid. Only when
/// etcd compacted its history past the watch is the cache rebuilt by a fresh list (watchers get 410 then).
pub(super) struct Feed {
    pub(super) kv: KvClient,
    pub(super) watch: WatchClient,
    pub(super) prefix: String,
    pub(super) hub: Arc<WatchHub>,
    pub(super) cache: Arc<Cache>,
    pub(super) current: Arc<AtomicU64>,
    pub(super) compacted: Arc<AtomicU64>,
    /// etcd answers requested progress notifications in order with the events ([`orders_progress`]).
    pub(super) progress_ordered: bool,
}

/// Why one etcd watch stream ended (the watch resumes from the last revision).
#[derive(Debug, thiserror::Error)]
enum WatchBroke {
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
    #[error("watch canceled: {0}")]
    Canceled(String),
}

impl Feed {
    /// Runs for the backend's lifetime; `last` is the revision the hub starts at.
    pub(super) async fn run(mut self, mut last: Revision) {
        let mut backoff = Duration::from_millis(100);
        loop {
            if !self.cache.is_ready() {
                if let Err(e) = self.fill(&mut last).await {
                    tracing::warn!(revision = last, error = %e, "filling the etcd watch cache failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
            match self.stream(&mut last, &mut backoff).await {
                Ok(()) => tracing::warn!(revision = last, "etcd watch stream ended; resuming"),
                Err(e) => tracing::warn!(revision = last, error = %e, "etcd watch failed; resuming"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// Fills the cache with etcd's state at `last`, so that the watch continues from `last + 1` with no gap for
    /// the hub's watchers. If etcd no longer has `last` (compacted), the state at etcd's current revision instead:
    /// the events in between are lost, so every watcher expires (410, clients re-list).
    async fn fill(&mut self, last: &mut Revision) -> Result<()> {
        let started = Instant::now();
        let exact = match *last {
            0 => Err(StorageError::Expired { requested: 0, oldest: 0 }),
            at => self.list_all(at).await,
        };
        let (items, revision) = match exact {
            Ok(listed) => listed,
            Err(StorageError::Expired { .. }) => {
                let listed = self.list_all(0).await?;
                self.hub.expire_all(listed.1);
                listed
            }
            Err(e) => return Err(e),
        };
        let keys = items.len();
        self.cache.load(items, revision);
        self.current.fetch_max(revision, Ordering::AcqRel);
        *last = revision;
        tracing::info!(revision, keys, elapsed = ?started.elapsed(), "etcd watch cache filled");
        Ok(())
    }

    /// Every key under the prefix at revision `at` (0: etcd's current revision), in pages of LIST_BATCH keys all
    /// read at the first page's revision.
    async fn list_all(&mut self, mut at: Revision) -> Result<(BTreeMap<String, KeyValue>, Revision)> {
        let mut start = format!("{}/", self.prefix).into_bytes();
        let end = prefix_end(&start);
        let mut items = BTreeMap::new();
        loop {
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(LIST_BATCH);
            if at > 0 {
                opts = opts.with_revision(at as i64);
            }
            let resp = self.kv.get(start.clone(), Some(opts)).await.map_err(|e| storage_error(e, 0))?;
            if at == 0 {
                at = resp.header().map_or(0, |h| rev(h.revision()));
            }
            if let Some(last) = resp.kvs().last() {
                start = last.key().to_vec();
                start.push(0);
            }
            for kv in resp.kvs() {
                let kv = to_key_value(&self.prefix, kv);
                items.insert(kv.key.clone(), kv);
            }
            if !resp.more() {
                return Ok((items, at));
            }
        }
    }

    /// Follows one watch stream until it breaks, applying its events to the cache and publishing them.
    async fn stream(&mut self, last: &mut Revision, backoff: &mut Duration) -> std::result::Result<(), WatchBroke> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(*last as i64 + 1)
            .with_prev_key()
            .with_progress_notify();
        let mut stream = self.watch.watch(format!("{}/", self.prefix), Some(opts)).await?;
        // Bookmarks and consistent reads need etcd's word that nothing is pending when etcd's revision moved
        // without events of ours (writes elsewhere in etcd): asked for every second while behind, and at once when
        // a reader waits for the cache.
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let msg = tokio::select! {
                msg = stream.message() => msg,
                _ = tick.tick() => {
                    if self.current.load(Ordering::Acquire) > self.hub.progress_revision() {
                        stream.request_progress().await?;
                    }
                    continue;
                }
                _ = self.cache.progress_wanted.notified() => {
                    stream.request_progress().await?;
                    continue;
                }
            };
            let Some(resp) = msg? else { return Ok(()) };
            *backoff = Duration::from_millis(100);
            if resp.canceled() {
                let c = rev(resp.compact_revision());
                if c == 0 {
                    return Err(WatchBroke::Canceled(resp.cancel_reason().to_string()));
                }
                // The events between `last` and the compaction are gone: watchers must re-list, and the cache is
                // rebuilt from a fresh list (reads go to etcd meanwhile).
                tracing::warn!(
                    revision = *last,
                    compacted = c,
                    "etcd history compacted past the watch; watchers expire and the watch cache is rebuilt"
                );
                self.compacted.fetch_max(c, Ordering::AcqRel);
                self.cache.invalidate();
                *last = c - 1;
                self.hub.expire_all(*last);
                return Ok(());
            }
            let header = resp.header().map_or(0, |h| rev(h.revision()));
            let mut batch: Vec<(Event, Revision)> =
                resp.events().iter().filter_map(|e| to_event(&self.prefix, e)).collect();
            if let Some(newest) = batch.iter().map(|(e, _)| e.revision).max() {
                *last = (*last).max(newest);
                self.current.fetch_max(newest, Ordering::AcqRel);
                // The cache first: a reader who sees its revision at X finds every change up to X in it.
                self.cache.apply(&mut batch);
                self.hub.publish(batch.into_iter().map(|(e, _)| e).collect());
            } else if !resp.created() && header > *last {
                // A progress notification: every event up to `header` has been sent. One that answers our request
                // (watch id -1, sent to the whole stream) is trusted only where etcd orders it after the events
                // it had queued; an older etcd may send it first (etcd-io/etcd#15220), so there it makes a
                // bookmark as before, but moves neither the cache (a consistent read could miss a queued event)
                // nor the revision the watch resumes from.
                self.current.fetch_max(header, Ordering::AcqRel);
                self.hub.advance(header);
                if resp.watch_id() != -1 || self.progress_ordered {
                    *last = header;
                    self.cache.advance(header);
                }
            }
        }
    }
}

/// Whether etcd `version` sends a requested progress notification only once every event queued before it has been
/// sent (etcd-io/etcd#15220, and #17507 for watches that get no events): 3.4.31 and 3.5.13 on, the versions
/// kube-apiserver requires for consistent reads from its watch cache.
pub(super) fn orders_progress(version: &str) -> bool {
    let mut parts = version.trim().trim_start_matches('v').split(['.', '-', '+']);
    let mut next = || parts.next().and_then(|p| p.parse::<u64>().ok());
    match (next(), next(), next()) {
        (Some(major), Some(minor), Some(patch)) => match (major, minor) {
            (3, 4) => patch >= 31,
            (3, 5) => patch >= 13,
            (3, m) => m >= 6,
            (m, _) => m > 3,
        },
        _ => false,
    }
}

/// A watch event as the hub carries it, with the create_revision of the key it writes (for the cache). The value
/// is copied out of etcd's message once; the cache and the hub share that copy.
fn to_event(prefix: &str, e: &etcd_client::Event) -> Option<(Event, Revision)> {
    let kv = e.kv()?;
    let prev = e.prev_kv().map(|p| to_key_value(prefix, p));
    let key = registry_key(prefix, kv.key());
    let revision = rev(kv.mod_revision());
    let created = rev(kv.create_revision());
    Some(match e.event_type() {
        EventType::Put if kv.version() == 1 => {
            let value = Bytes::copy_from_slice(kv.value());
            (Event { kind: EventKind::Created, revision, key, value, prev: None }, created)
        }
        EventType::Put => {
            let value = Bytes::copy_from_slice(kv.value());
            (Event { kind: EventKind::Updated, revision, key, value, prev }, created)
        }
        EventType::Delete => {
            let value = prev.as_ref().map(|p| p.value.clone()).unwrap_or_default();
            (Event { kind: EventKind::Deleted, revision, key, value, prev }, 0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_progress_is_ordered_from_the_versions_kube_apiserver_requires() {
        for v in ["3.4.31", "3.4.37", "3.5.13", "3.5.21", "3.6.0", "v3.6.4", "4.0.0"] {
            assert!(orders_progress(v), "{v}");
        }
        for v in ["3.4.23", "3.4.30", "3.5.12", "3.5.0-rc.1", "3.3.27", "2.3.8", "", "unknown (etcd: down)"] {
            assert!(!orders_progress(v), "{v}");
        }
    }
}

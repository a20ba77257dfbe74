//! Objects that expire a fixed time after their last write, as kube-apiserver's events do (`--event-ttl`:
//! kube-apiserver attaches an etcd lease of that TTL at every write of an event, so an event goes TTL after it was
//! last written).
//!
//! The same mechanism on every backend (embedded store and etcd): a task follows the writes under a prefix (a
//! list, then a watch from its revision), notes when each key was last written, and deletes a key TTL after that,
//! compare-and-swap on the revision it saw, so that a write in between is never lost (that write starts the key's
//! TTL anew, when the watch brings it). Objects found at start count from their last write as recorded in
//! `metadata.managedFields` (the newest entry's time), or from the start when they have none. Replicas on one etcd
//! each run it; the compare-and-swap makes them agree.

use crate::storage::{EventKind, KeyValue, ListOptions, Revision, Storage, StorageError, WatchItem};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often due keys are looked for: a tenth of the TTL, within these bounds.
const MIN_SWEEP: Duration = Duration::from_millis(100);
const MAX_SWEEP: Duration = Duration::from_secs(5);
/// How long after a failure (storage unavailable, watch expired) the task starts over with a list.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Page size of the list at (re)start.
const PAGE: usize = 500;

/// Starts expiring the objects under `prefix` `ttl` after their last write; runs until the process ends.
pub fn spawn(storage: Arc<dyn Storage>, prefix: String, ttl: Duration) {
    tokio::spawn(async move {
        loop {
            if let Err(e) = follow(storage.as_ref(), &prefix, ttl).await {
                tracing::warn!(prefix = %prefix, error = %e, "expiring objects: starting over");
            }
            tokio::time::sleep(RETRY_AFTER).await;
        }
    });
}

/// When each key is due: its revision as last seen, and the instant it expires.
type Deadlines = HashMap<String, (Revision, Instant)>;

/// Lists the prefix, then follows its watch and deletes what is due, until the watch ends or fails.
async fn follow(storage: &dyn Storage, prefix: &str, ttl: Duration) -> Result<(), StorageError> {
    let (mut deadlines, revision) = list(storage, prefix, ttl).await?;
    let mut watch = storage.watch(prefix, revision).await?;
    let mut sweep = tokio::time::interval((ttl / 10).clamp(MIN_SWEEP, MAX_SWEEP));
    loop {
        tokio::select! {
            item = watch.recv() => match item {
                Some(WatchItem::Event(ev)) => match ev.kind {
                    EventKind::Deleted => {
                        deadlines.remove(&ev.key);
                    }
                    EventKind::Created | EventKind::Updated => {
                        deadlines.insert(ev.key.clone(), (ev.revision, Instant::now() + ttl));
                    }
                },
                Some(WatchItem::Error(e)) => return Err(e),
                None => return Ok(()),
            },
            _ = sweep.tick() => delete_due(storage, &mut deadlines).await,
        }
    }
}

/// Every key under `prefix` with its deadline, and the revision of the list.
async fn list(storage: &dyn Storage, prefix: &str, ttl: Duration) -> Result<(Deadlines, Revision), StorageError> {
    let mut deadlines = Deadlines::new();
    let (mut start_after, mut revision) = (None, None);
    loop {
        let page = storage
            .list(prefix, ListOptions { start_after: start_after.take(), limit: PAGE, revision, ..Default::default() })
            .await?;
        revision = Some(page.revision);
        for kv in &page.items {
            deadlines.insert(kv.key.clone(), (kv.mod_revision, Instant::now() + remaining(kv, ttl)));
        }
        match (page.more, page.items.last()) {
            (true, Some(last)) => start_after = Some(last.key.clone()),
            _ => return Ok((deadlines, page.revision)),
        }
    }
}

/// What is left of the TTL of a stored object: counted from the newest `metadata.managedFields[].time`, the whole
/// TTL when there is none (or the object cannot be read: it then goes TTL from now, like any other).
fn remaining(kv: &KeyValue, ttl: Duration) -> Duration {
    #[derive(serde::Deserialize)]
    struct Entry {
        time: Option<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        #[serde(default)]
        managed_fields: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Meta,
    }
    let last_write = serde_json::from_slice::<Object>(&kv.value)
        .ok()
        .and_then(|o| o.metadata.managed_fields.into_iter().filter_map(|e| e.time).max());
    match last_write {
        Some(at) => {
            let elapsed = (chrono::Utc::now() - at).to_std().unwrap_or_default();
            ttl.saturating_sub(elapsed)
        }
        None => ttl,
    }
}

/// Deletes every key whose deadline has passed, if still at the revision seen. A key written since (conflict)
/// stays until the watch brings its write; a key gone already is forgotten; any other failure is tried again at
/// the next sweep.
async fn delete_due(storage: &dyn Storage, deadlines: &mut Deadlines) {
    let now = Instant::now();
    let due: Vec<(String, Revision)> = deadlines
        .iter()
        .filter(|(_, (_, at))| *at <= now)
        .map(|(key, (revision, _))| (key.clone(), *revision))
        .collect();
    for (key, revision) in due {
        match storage.delete(&key, Some(revision)).await {
            Ok(_) | Err(StorageError::NotFound { .. }) => {
                deadlines.remove(&key);
            }
            Err(StorageError::Conflict { .. }) => {
                // Written since: due again only once the watch has brought that write (and its new deadline).
                if let Some(entry) = deadlines.get_mut(&key) {
                    entry.1 = now + MAX_SWEEP;
                }
            }
            Err(e) => tracing::warn!(key = %key, error = %e, "expiring an object"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(value: serde_json::Value) -> KeyValue {
        let value = serde_json::to_vec(&value).expect("json").into();
        KeyValue { key: "/registry/events/default/e".into(), value, create_revision: 1, mod_revision: 1, stale: false }
    }

    /// What is left counts from the newest managedFields entry; nothing recorded (or unreadable): the whole TTL.
    #[test]
    fn remaining_counts_from_the_newest_managed_fields_time() {
        let ttl = Duration::from_secs(3600);
        let at = |minutes_ago: i64| (chrono::Utc::now() - chrono::Duration::minutes(minutes_ago)).to_rfc3339();
        let kv = stored(serde_json::json!({"metadata": {"managedFields": [{"time": at(50)}, {"time": at(20)}, {}]}}));
        let left = remaining(&kv, ttl);
        assert!(left <= Duration::from_secs(40 * 60) && left > Duration::from_secs(39 * 60), "{left:?}");
        assert_eq!(
            remaining(&stored(serde_json::json!({"metadata": {"managedFields": [{"time": at(90)}]}})), ttl),
            Duration::ZERO
        );
        assert_eq!(remaining(&stored(serde_json::json!({"metadata": {}})), ttl), ttl);
        assert_eq!(remaining(&KeyValue { value: "not json".into(), ..stored(serde_json::json!({})) }, ttl), ttl);
    }
}

//! The watch hub: fans committed events out to watchers and keeps a bounded in-memory history ring.
//!
//! The writer calls [`WatchHub::publish`] right after each commit, in revision order. The ring keeps the newest
//! events within a [`HistoryLimit`] (a count and a size in bytes: with large objects the count alone would let the
//! ring take gigabytes); `compacted` is the revision of the newest event dropped from it (or the store's revision at
//! open), so every event with a revision greater than `compacted` that has been published is in the ring.
//!
//! Watchers are pushed to through bounded channels with `try_send`: a watcher that does not keep up is sent an
//! `Expired` error (a slot is always kept free for it) and dropped, so a slow watcher never blocks the writer or
//! other watchers.

use super::{Event, Result, Revision, StorageError, WatchItem};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch, Semaphore};

/// Default number of events kept in the history ring.
pub const DEFAULT_HISTORY: usize = 10_000;
/// Default size of the history ring (`--watch-history-bytes`).
pub const DEFAULT_HISTORY_BYTES: usize = 64 << 20;
/// What one event costs in the ring beyond its keys and values: the `Event`, its `Arc`, the ring slot and the
/// allocations' headers (an estimate; it only needs to keep the bound honest for small objects).
const EVENT_OVERHEAD: usize = 192;

/// How much history the ring keeps: at most `events` events, and at most `bytes` of them (keys, values and the
/// previous values they carry). The newest event is always kept, whatever its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimit {
    pub events: usize,
    pub bytes: usize,
}

impl Default for HistoryLimit {
    fn default() -> Self {
        Self { events: DEFAULT_HISTORY, bytes: DEFAULT_HISTORY_BYTES }
    }
}

impl HistoryLimit {
    /// A count limit alone (tests).
    pub fn events(events: usize) -> Self {
        Self { events, bytes: usize::MAX }
    }
}

/// The memory an event holds in the ring.
fn event_bytes(e: &Event) -> usize {
    let prev = e.prev.as_ref().map_or(0, |p| p.key.len() + p.value.len());
    EVENT_OVERHEAD + e.key.len() + e.value.len() + prev
}
/// Default number of live events a watcher may have queued before it is dropped.
pub const DEFAULT_WATCH_BUFFER: usize = 2048;

pub struct WatchHub {
    state: Mutex<HubState>,
    /// The newest revision whose events are in the ring and have been handed to watchers.
    progress: watch::Sender<Revision>,
    limit: HistoryLimit,
    buffer: usize,
}

struct HubState {
    ring: VecDeque<Arc<Event>>,
    /// What the ring's events hold ([`event_bytes`]).
    ring_bytes: usize,
    /// Every published event with a revision greater than this is in the ring.
    compacted: Revision,
    watchers: Vec<Watcher>,
}

struct Watcher {
    prefix: String,
    /// Every matching event up to this revision has been sent (or was before the watch's start).
    sent_upto: Revision,
    tx: mpsc::Sender<WatchItem>,
}

impl WatchHub {
    /// A hub for a store at `revision`, keeping history within `limit`.
    pub fn new(revision: Revision, limit: HistoryLimit) -> Self {
        Self::with_watch_buffer(revision, limit, DEFAULT_WATCH_BUFFER)
    }

    /// Like [`WatchHub::new`], with `buffer` live events allowed to queue per watcher.
    pub fn with_watch_buffer(revision: Revision, limit: HistoryLimit, buffer: usize) -> Self {
        let (progress, _) = watch::channel(revision);
        Self {
            state: Mutex::new(HubState {
                ring: VecDeque::new(),
                ring_bytes: 0,
                compacted: revision,
                watchers: Vec::new(),
            }),
            progress,
            limit,
            // Leave room under tokio's channel limit for the replay and the error slot.
            buffer: buffer.clamp(1, Semaphore::MAX_PERMITS / 4),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // Nothing under this lock panics; if something did, the state is still consistent enough to go on.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records committed events (in revision order) and sends them to the watchers.
    pub fn publish(&self, events: Vec<Event>) {
        let Some(last) = events.last().map(|e| e.revision) else {
            return;
        };
        let events: Vec<Arc<Event>> = events.into_iter().map(Arc::new).collect();
        let mut st = self.lock();
        st.ring_bytes += events.iter().map(|e| event_bytes(e)).sum::<usize>();
        st.ring.extend(events.iter().cloned());
        while st.ring.len() > self.limit.events.max(1) || (st.ring_bytes > self.limit.bytes && st.ring.len() > 1) {
            match st.ring.pop_front() {
                Some(dropped) => {
                    st.compacted = dropped.revision;
                    st.ring_bytes -= event_bytes(&dropped);
                }
                None => break,
            }
        }
        let compacted = st.compacted;
        st.watchers.retain_mut(|w| w.deliver(&events, compacted));
        self.progress.send_if_modified(|p| {
            if last > *p {
                *p = last;
                true
            } else {
                false
            }
        });
    }

    /// Events under `prefix` with revision > `after`: first those in the ring, then live ones, with no gap and no
    /// duplicate. `Expired` when `after` is older than the retained history.
    pub fn watch(&self, prefix: &str, after: Revision) -> Result<mpsc::Receiver<WatchItem>> {
        let mut st = self.lock();
        if after < st.compacted {
            return Err(StorageError::Expired { requested: after, oldest: st.compacted });
        }
        let start = st.ring.partition_point(|e| e.revision <= after);
        let replay: Vec<Arc<Event>> = st.ring.range(start..).filter(|e| e.key.starts_with(prefix)).cloned().collect();
        // Room for the whole replay, the live buffer, and one slot reserved for the final error.
        let (tx, rx) = mpsc::channel(replay.len() + self.buffer + 1);
        for ev in replay {
            // Cannot fail: the channel has room for every replayed event and the receiver is alive.
            let _ = tx.try_send(WatchItem::Event(ev));
        }
        // Events published later have revisions above the ring's newest; an `after` beyond it (a snapshot
        // committed but not yet published) is skipped over by `deliver`.
        let newest = st.ring.back().map_or(after, |e| e.revision);
        st.watchers.retain(|w| !w.tx.is_closed());
        st.watchers.push(Watcher { prefix: prefix.to_owned(), sent_upto: after.max(newest), tx });
        Ok(rx)
    }

    /// Events under `prefix` with `after < revision <= upto`, in revision order. `Expired` when `after` is older
    /// than the retained history; `Unavailable` when `upto` has not been published yet (see
    /// [`WatchHub::wait_published`]).
    pub fn history_between(&self, after: Revision, upto: Revision, prefix: &str) -> Result<Vec<Arc<Event>>> {
        let st = self.lock();
        if after < st.compacted {
            return Err(StorageError::Expired { requested: after, oldest: st.compacted });
        }
        let published = *self.progress.borrow();
        if upto > published {
            return Err(StorageError::Unavailable(format!(
                "history up to revision {upto} is not published yet (at {published})"
            )));
        }
        let start = st.ring.partition_point(|e| e.revision <= after);
        Ok(st
            .ring
            .range(start..)
            .take_while(|e| e.revision <= upto)
            .filter(|e| e.key.starts_with(prefix))
            .cloned()
            .collect())
    }

    /// Returns once every event up to `revision` has been published.
    pub async fn wait_published(&self, revision: Revision) {
        let mut rx = self.progress.subscribe();
        // The sender lives in `self`, so it cannot close while we wait.
        let _ = rx.wait_for(|p| *p >= revision).await;
    }

    /// Every event up to `revision` has been published (a backend's progress notification with no events of its
    /// own, e.g. etcd's): bookmarks may advance to it.
    pub fn advance(&self, revision: Revision) {
        let _st = self.lock();
        self.progress.send_if_modified(|p| {
            if revision > *p {
                *p = revision;
                true
            } else {
                false
            }
        });
    }

    /// The backend lost events (its history was compacted while the feed was down): every watcher gets `Expired`
    /// and is dropped (clients re-list), and the history restarts empty at `revision`.
    pub fn expire_all(&self, revision: Revision) {
        let mut st = self.lock();
        st.ring.clear();
        st.ring_bytes = 0;
        st.compacted = st.compacted.max(revision);
        let oldest = st.compacted;
        for w in st.watchers.drain(..) {
            let _ = w.tx.try_send(WatchItem::Error(StorageError::Expired { requested: w.sent_upto, oldest }));
        }
        drop(st);
        self.advance(revision);
    }

    /// The newest revision all of whose events are in the ring and have been handed to watchers.
    pub fn progress_revision(&self) -> Revision {
        *self.progress.borrow()
    }

    /// The revision below which history is no longer available (events after it are all retained).
    pub fn compacted_revision(&self) -> Revision {
        self.lock().compacted
    }

    /// The number of registered watchers (closed ones are pruned on the next publish or watch).
    pub fn watcher_count(&self) -> usize {
        self.lock().watchers.len()
    }
}

impl Watcher {
    /// Sends the matching events; false when the watcher is to be dropped (closed, or fell behind).
    fn deliver(&mut self, events: &[Arc<Event>], compacted: Revision) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        for ev in events {
            if ev.revision <= self.sent_upto || !ev.key.starts_with(&self.prefix) {
                continue;
            }
            // Keep the last slot for the error, so a watcher that falls behind always learns why its stream ends.
            if self.tx.capacity() <= 1 {
                let expired = StorageError::Expired { requested: self.sent_upto, oldest: compacted };
                let _ = self.tx.try_send(WatchItem::Error(expired));
                return false;
            }
            if self.tx.try_send(WatchItem::Event(ev.clone())).is_err() {
                return false;
            }
            self.sent_upto = ev.revision;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{EventKind, KeyValue};
    use bytes::Bytes;

    fn ev(revision: Revision, key: &str) -> Event {
        Event {
            kind: EventKind::Created,
            revision,
            key: key.to_owned(),
            value: Bytes::from(format!("v{revision}")),
            prev: None,
        }
    }

    fn upd(revision: Revision, key: &str, prev_rev: Revision) -> Event {
        Event {
            kind: EventKind::Updated,
            revision,
            key: key.to_owned(),
            value: Bytes::from(format!("v{revision}")),
            prev: Some(KeyValue {
                key: key.to_owned(),
                value: Bytes::from(format!("v{prev_rev}")),
                create_revision: prev_rev,
                mod_revision: prev_rev,
                stale: false,
            }),
        }
    }

    fn revs(rx: &mut mpsc::Receiver<WatchItem>) -> Vec<Revision> {
        let mut out = Vec::new();
        while let Ok(item) = rx.try_recv() {
            match item {
                WatchItem::Event(e) => out.push(e.revision),
                WatchItem::Error(e) => panic!("unexpected error {e}"),
            }
        }
        out
    }

    #[tokio::test]
    async fn replay_then_live_filtered_by_prefix() {
        let hub = WatchHub::new(10, HistoryLimit::events(100));
        hub.publish(vec![ev(11, "/a/1"), ev(12, "/b/1"), ev(13, "/a/2")]);
        let mut rx = hub.watch("/a/", 11).expect("watch");
        hub.publish(vec![ev(14, "/a/3"), ev(15, "/b/2")]);
        assert_eq!(revs(&mut rx), vec![13, 14]);
        let mut all = hub.watch("", 10).expect("watch");
        assert_eq!(revs(&mut all), vec![11, 12, 13, 14, 15]);
        assert_eq!(hub.progress_revision(), 15);
    }

    #[tokio::test]
    async fn watch_ahead_of_published_skips_duplicates() {
        let hub = WatchHub::new(0, HistoryLimit::events(100));
        hub.publish(vec![ev(1, "/a")]);
        // A reader saw revision 3 committed before the hub published it.
        let mut rx = hub.watch("/", 3).expect("watch");
        hub.publish(vec![ev(2, "/b"), ev(3, "/c"), ev(4, "/d")]);
        assert_eq!(revs(&mut rx), vec![4]);
    }

    #[tokio::test]
    async fn expired_after_overflow() {
        let hub = WatchHub::new(0, HistoryLimit::events(3));
        hub.publish((1..=5).map(|r| ev(r, "/k")).collect());
        assert_eq!(hub.compacted_revision(), 2);
        assert_eq!(hub.watch("/", 1).err(), Some(StorageError::Expired { requested: 1, oldest: 2 }));
        let mut rx = hub.watch("/", 2).expect("watch");
        assert_eq!(revs(&mut rx), vec![3, 4, 5]);
        assert!(matches!(hub.history_between(0, 5, "/"), Err(StorageError::Expired { .. })));
        let h = hub.history_between(3, 4, "/").expect("history");
        assert_eq!(h.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![4]);
        assert!(matches!(hub.history_between(3, 6, "/"), Err(StorageError::Unavailable(_))));
    }

    #[tokio::test]
    async fn history_is_bounded_in_bytes() {
        let big = |revision: Revision| Event {
            kind: EventKind::Created,
            revision,
            key: "/k".to_owned(),
            value: Bytes::from(vec![b'x'; 1000]),
            prev: None,
        };
        // Room for two such events, not three.
        let hub = WatchHub::new(0, HistoryLimit { events: 100, bytes: 2 * (1000 + 2 + EVENT_OVERHEAD) + 10 });
        hub.publish((1..=5).map(big).collect());
        assert_eq!(hub.compacted_revision(), 3);
        assert!(matches!(hub.watch("/", 2), Err(StorageError::Expired { requested: 2, oldest: 3 })));
        let mut rx = hub.watch("/", 3).expect("watch");
        assert_eq!(revs(&mut rx), vec![4, 5]);
        // One event larger than the whole bound is still kept (the newest always is).
        let tiny = WatchHub::new(0, HistoryLimit { events: 100, bytes: 10 });
        tiny.publish(vec![big(1), big(2)]);
        assert_eq!(tiny.compacted_revision(), 1);
    }

    #[tokio::test]
    async fn slow_watcher_is_dropped_with_error() {
        let hub = WatchHub::with_watch_buffer(0, HistoryLimit::events(100), 4);
        let mut slow = hub.watch("/", 0).expect("watch");
        let mut fast = hub.watch("/", 0).expect("watch");
        for r in 1..=10 {
            hub.publish(vec![upd(r, "/k", r - 1)]);
            assert_eq!(revs(&mut fast), vec![r]);
        }
        assert_eq!(hub.watcher_count(), 1);
        let mut items = Vec::new();
        while let Ok(item) = slow.try_recv() {
            items.push(item);
        }
        assert_eq!(items.len(), 5);
        assert!(matches!(items.last(), Some(WatchItem::Error(StorageError::Expired { requested: 4, .. }))));
        // The stream ends after the error.
        assert!(slow.recv().await.is_none());
    }

    #[tokio::test]
    async fn closed_watchers_are_pruned() {
        let hub = WatchHub::new(0, HistoryLimit::events(100));
        let rx = hub.watch("/", 0).expect("watch");
        drop(rx);
        hub.publish(vec![ev(1, "/x")]);
        assert_eq!(hub.watcher_count(), 0);
    }

    #[tokio::test]
    async fn wait_published_returns_once_progress_reaches() {
        let hub = Arc::new(WatchHub::new(0, HistoryLimit::events(100)));
        let h = hub.clone();
        let waiter = tokio::spawn(async move { h.wait_published(2).await });
        hub.publish(vec![ev(1, "/x")]);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        hub.publish(vec![ev(2, "/x")]);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("wait_published returned")
            .expect("join");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fan_out_to_many_watchers() {
        let hub = Arc::new(WatchHub::new(0, HistoryLimit::events(100)));
        let mut latencies = Vec::new();
        for round in 1..=20u64 {
            let (ready_tx, mut ready_rx) = mpsc::channel::<()>(100);
            let tasks: Vec<_> = (0..100)
                .map(|_| {
                    let mut rx = hub.watch("/pods/", round - 1).expect("watch");
                    let ready = ready_tx.clone();
                    tokio::spawn(async move {
                        let _ = ready.send(()).await;
                        match rx.recv().await {
                            Some(WatchItem::Event(e)) => (e.revision, std::time::Instant::now()),
                            other => panic!("unexpected {other:?}"),
                        }
                    })
                })
                .collect();
            for _ in 0..100 {
                ready_rx.recv().await.expect("ready");
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let start = std::time::Instant::now();
            hub.publish(vec![ev(round, "/pods/x")]);
            let mut worst = std::time::Duration::ZERO;
            for t in tasks {
                let (rev, at) = t.await.expect("watcher");
                assert_eq!(rev, round);
                worst = worst.max(at.duration_since(start));
            }
            latencies.push(worst);
        }
        latencies.sort();
        println!("100 watchers, publish to last delivery: median {:?}, max {:?}", latencies[10], latencies[19]);
        assert!(latencies[10] < std::time::Duration::from_millis(50));
    }
}

//! The watch cache: every key under `--etcd-prefix` in memory, at one etcd revision, so that GET and LIST need no
//! etcd range request (kube-apiserver's cacher, in small).
//!
//! The [`Feed`](super::feed::Feed) fills it with a paged list at a revision R, then applies every event of its
//! watch from R+1 (and advances it on progress notifications) before handing the events to the hub. Map and
//! revision change together under one lock, so the cache at revision r is exactly etcd's state at r: a reader that
//! sees revision >= X sees every change <= X. Values are kept as stored (possibly encrypted); their `Bytes` are
//! shared with the hub's events, not copied.
//!
//! Memory: the cache holds every object under the prefix, as kube-apiserver's watch cache does. It is "not ready"
//! until the first list is done, and again while it is rebuilt after etcd compacted its history past the watch;
//! reads then go to etcd.

use super::super::{Event, EventKind, KeyValue, ListOptions, ListResult, Revision};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// What readers wait on: whether the cache can be read, and the revision it reflects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Progress {
    ready: bool,
    revision: Revision,
}

struct State {
    ready: bool,
    revision: Revision,
    items: BTreeMap<String, KeyValue>,
}

pub(super) struct Cache {
    state: RwLock<State>,
    /// The state's `ready` and `revision`, published after every change (readers wait on it without the lock).
    progress: watch::Sender<Progress>,
    /// A reader waits for a revision the cache has not reached: the feed asks etcd for a progress notification at
    /// once (etcd's revision may have moved through writes outside the prefix, which bring no event).
    pub(super) progress_wanted: Notify,
}

/// Which cache revision a read accepts.
#[derive(Clone, Copy, Debug)]
pub(super) enum At {
    /// A consistent read: any revision not older than this one (etcd's revision when the read began).
    AtLeast(Revision),
    /// A read at this exact revision (a continue page, a resourceVersionMatch=Exact list).
    Exactly(Revision),
}

impl At {
    fn accepts(self, revision: Revision) -> bool {
        match self {
            At::AtLeast(r) => revision >= r,
            At::Exactly(r) => revision == r,
        }
    }
}

impl Cache {
    /// An empty cache, not ready.
    pub(super) fn new() -> Self {
        let (progress, _) = watch::channel(Progress { ready: false, revision: 0 });
        Self {
            state: RwLock::new(State { ready: false, revision: 0, items: BTreeMap::new() }),
            progress,
            progress_wanted: Notify::new(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // Nothing under this lock panics; if something did, the feed rebuilds the cache after its next error.
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes the state's readiness and revision to waiting readers (called with the write lock held, so that
    /// what readers see never goes backwards).
    fn publish(&self, st: &State) {
        let now = Progress { ready: st.ready, revision: st.revision };
        self.progress.send_if_modified(|p| {
            let changed = *p != now;
            *p = now;
            changed
        });
    }

    pub(super) fn is_ready(&self) -> bool {
        self.progress.borrow().ready
    }

    /// The revision the cache reflects (meaningful while ready).
    pub(super) fn revision(&self) -> Revision {
        self.progress.borrow().revision
    }

    /// Not ready until the next [`Cache::load`] (etcd's history was compacted past the watch: events are lost).
    /// The old contents go at once: they may be large, and nothing reads them any more.
    pub(super) fn invalidate(&self) {
        let mut st = self.write();
        st.ready = false;
        st.items = BTreeMap::new();
        self.publish(&st);
    }

    /// Replaces the contents with etcd's state at `revision` (a complete list at that revision) and makes the
    /// cache ready.
    pub(super) fn load(&self, items: BTreeMap<String, KeyValue>, revision: Revision) {
        let mut st = self.write();
        st.items = items;
        st.revision = revision;
        st.ready = true;
        self.publish(&st);
    }

    /// Applies a watch response's events (in revision order), each with the create_revision of the key it writes.
    /// Where the cache holds the value an event replaced, the event's `prev` takes the cache's `Bytes` instead of
    /// its own copy from etcd, so the hub's history shares memory with the cache.
    pub(super) fn apply(&self, events: &mut [(Event, Revision)]) {
        let Some(newest) = events.iter().map(|(e, _)| e.revision).max() else { return };
        let mut st = self.write();
        for (ev, create_revision) in events.iter_mut() {
            let old = match ev.kind {
                EventKind::Deleted => st.items.remove(&ev.key),
                EventKind::Created | EventKind::Updated => {
                    let kv = KeyValue {
                        key: ev.key.clone(),
                        value: ev.value.clone(),
                        create_revision: *create_revision,
                        mod_revision: ev.revision,
                        stale: false,
                    };
                    st.items.insert(ev.key.clone(), kv)
                }
            };
            if let (Some(old), Some(prev)) = (old, ev.prev.as_mut()) {
                if old.mod_revision == prev.mod_revision {
                    if ev.kind == EventKind::Deleted {
                        ev.value = old.value.clone();
                    }
                    *prev = old;
                }
            }
        }
        // Events arrive in revision order; `max` only guards against etcd answering a requested progress
        // notification ahead of events it had queued (etcd-io/etcd#15220, etcd < 3.4.25 / 3.5.8).
        st.revision = st.revision.max(newest);
        self.publish(&st);
    }

    /// etcd's progress notification: every event up to `revision` has been applied.
    pub(super) fn advance(&self, revision: Revision) {
        let mut st = self.write();
        if st.ready && revision > st.revision {
            st.revision = revision;
            self.publish(&st);
        }
    }

    /// Waits until the cache has reached `target` (asking the feed for a progress notification if it has not);
    /// false if the cache is not ready, stops being ready, or does not get there within `timeout`.
    pub(super) async fn wait_for(&self, target: Revision, timeout: Duration) -> bool {
        let mut rx = self.progress.subscribe();
        let now = *rx.borrow_and_update();
        if !now.ready {
            return false;
        }
        if now.revision >= target {
            return true;
        }
        if timeout.is_zero() {
            return false;
        }
        self.progress_wanted.notify_one();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|p| !p.ready || p.revision >= target)).await;
        matches!(reached, Ok(Ok(p)) if p.ready)
    }

    /// The value of `key` (or its absence) if the cache is ready at a revision `at` accepts; `None` otherwise.
    pub(super) fn get(&self, key: &str, at: At) -> Option<Option<KeyValue>> {
        let st = self.read();
        (st.ready && at.accepts(st.revision)).then(|| st.items.get(key).cloned())
    }

    /// A page of the keys under `prefix` after `opts.start_after`, as etcd would answer it, if the cache is ready at
    /// a revision `at` accepts; `None` otherwise. `remaining` counts the keys under the prefix after the page.
    pub(super) fn list(&self, prefix: &str, opts: &ListOptions, at: At) -> Option<ListResult> {
        let st = self.read();
        if !st.ready || !at.accepts(st.revision) {
            return None;
        }
        let start = match opts.start_after.as_deref() {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut range = st.items.range::<str, _>((start, Bound::Unbounded)).take_while(|(k, _)| k.starts_with(prefix));
        let limit = if opts.limit == 0 { usize::MAX } else { opts.limit };
        let max_bytes = if opts.max_bytes == 0 { usize::MAX } else { opts.max_bytes };
        let (mut items, mut bytes) = (Vec::new(), 0);
        while items.len() < limit && bytes < max_bytes {
            let Some((_, kv)) = range.next() else { break };
            bytes += kv.value.len();
            items.push(kv.clone());
        }
        let remaining = range.count() as u64;
        Some(ListResult { items, revision: st.revision, more: remaining > 0, remaining })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;

    fn kv(key: &str, revision: Revision) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Bytes::from(format!("v{revision}")),
            create_revision: revision,
            mod_revision: revision,
            stale: false,
        }
    }

    fn put(key: &str, revision: Revision, prev: Option<KeyValue>) -> (Event, Revision) {
        let kind = if prev.is_some() { EventKind::Updated } else { EventKind::Created };
        let create = prev.as_ref().map_or(revision, |p| p.create_revision);
        (Event { kind, revision, key: key.into(), value: Bytes::from(format!("v{revision}")), prev }, create)
    }

    fn loaded(keys: &[(&str, Revision)], revision: Revision) -> Cache {
        let cache = Cache::new();
        cache.load(keys.iter().map(|(k, r)| (k.to_string(), kv(k, *r))).collect(), revision);
        cache
    }

    fn opts(start_after: Option<&str>, limit: usize) -> ListOptions {
        ListOptions { start_after: start_after.map(str::to_string), limit, revision: None, ..Default::default() }
    }

    fn keys(res: &ListResult) -> Vec<&str> {
        res.items.iter().map(|kv| kv.key.as_str()).collect()
    }

    #[test]
    fn lists_pages_under_a_prefix_with_remaining_counts() {
        let cache = loaded(&[("/r/a/1", 1), ("/r/a/2", 2), ("/r/a/3", 3), ("/r/ab", 4), ("/r/b/1", 5)], 5);
        let page = cache.list("/r/a/", &opts(None, 2), At::AtLeast(5)).expect("ready");
        assert_eq!((keys(&page), page.more, page.remaining, page.revision), (vec!["/r/a/1", "/r/a/2"], true, 1, 5));
        let rest = cache.list("/r/a/", &opts(Some("/r/a/2"), 2), At::Exactly(5)).expect("ready");
        assert_eq!((keys(&rest), rest.more, rest.remaining), (vec!["/r/a/3"], false, 0));
        let all = cache.list("/r/", &opts(None, 0), At::AtLeast(1)).expect("ready");
        assert_eq!(all.items.len(), 5);
        assert!(!all.more);
        // A start before the prefix starts at the prefix.
        let before = cache.list("/r/b/", &opts(Some("/r/a/9"), 0), At::AtLeast(1)).expect("ready");
        assert_eq!(keys(&before), vec!["/r/b/1"]);
        // A revision the cache is not at: no answer from the cache.
        assert!(cache.list("/r/", &opts(None, 0), At::AtLeast(6)).is_none());
        assert!(cache.list("/r/", &opts(None, 0), At::Exactly(4)).is_none());
        assert_eq!(cache.get("/r/a/1", At::AtLeast(5)), Some(Some(kv("/r/a/1", 1))));
        assert_eq!(cache.get("/r/zz", At::AtLeast(5)), Some(None));
    }

    #[test]
    fn a_page_stops_at_its_byte_limit_with_the_item_that_reaches_it() {
        let cache = loaded(&[("/r/a/1", 1), ("/r/a/2", 2), ("/r/a/3", 3)], 3);
        let value_len = cache.get("/r/a/1", At::AtLeast(3)).flatten().expect("stored").value.len();
        let opts = ListOptions { max_bytes: value_len + 1, ..Default::default() };
        let page = cache.list("/r/a/", &opts, At::AtLeast(3)).expect("ready");
        assert_eq!((keys(&page), page.more, page.remaining), (vec!["/r/a/1", "/r/a/2"], true, 1));
    }

    #[test]
    fn events_apply_in_order_and_share_values_with_prev() {
        let cache = loaded(&[("/k", 3)], 3);
        let mut batch = vec![put("/k", 4, Some(kv("/k", 3))), put("/n", 5, None)];
        cache.apply(&mut batch);
        assert_eq!(cache.revision(), 5);
        let stored = cache.get("/k", At::AtLeast(5)).flatten().expect("/k");
        assert_eq!((stored.create_revision, stored.mod_revision, &stored.value[..]), (3, 4, &b"v4"[..]));
        // The event's prev is the cache's old entry (same bytes, no second copy).
        assert_eq!(batch[0].0.prev.as_ref().map(|p| p.mod_revision), Some(3));
        let mut del = vec![(
            Event {
                kind: EventKind::Deleted,
                revision: 6,
                key: "/k".into(),
                value: Bytes::new(),
                prev: Some(kv("/k", 4)),
            },
            0,
        )];
        cache.apply(&mut del);
        assert_eq!(&del[0].0.value[..], b"v4", "a delete carries the last value");
        assert_eq!(cache.get("/k", At::AtLeast(6)), Some(None));
        cache.advance(9);
        assert_eq!(cache.revision(), 9);
        cache.invalidate();
        assert!(cache.get("/n", At::AtLeast(0)).is_none(), "not ready: no answer");
        cache.advance(12);
        assert!(!cache.is_ready());
    }

    #[tokio::test]
    async fn readers_wait_for_the_revision_or_give_up() {
        let cache = Arc::new(loaded(&[], 10));
        assert!(cache.wait_for(10, Duration::ZERO).await);
        // Behind: the feed is asked for progress, and the reader wakes when the cache gets there.
        let c = cache.clone();
        let waiter = tokio::spawn(async move { c.wait_for(12, Duration::from_secs(10)).await });
        tokio::time::timeout(Duration::from_secs(5), cache.progress_wanted.notified()).await.expect("asked");
        cache.advance(12);
        assert!(waiter.await.expect("join"));
        // Lagging past the bound: false (the read goes to etcd).
        assert!(!cache.wait_for(13, Duration::from_millis(20)).await);
        // Invalidated while waiting: false at once.
        let c = cache.clone();
        let waiter = tokio::spawn(async move { c.wait_for(20, Duration::from_secs(30)).await });
        cache.progress_wanted.notified().await;
        cache.invalidate();
        assert!(!tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken").expect("join"));
        assert!(!Cache::new().wait_for(0, Duration::from_secs(1)).await, "never loaded");
    }
}

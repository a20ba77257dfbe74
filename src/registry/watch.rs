//! Watches of the generic registry: selectors, bookmarks, initial events (read as a streamed LIST is), and the
//! translation of the store's events into the client's version.

use super::read::NOT_OLDER_THAN;
use super::{parse_rv, ListParams, ListRest, Resource, WatchOut, WatchParams};
use crate::error::{ApiError, ApiResult, FieldError};
use crate::storage::{EventKind, KeyValue, StorageError, WatchItem};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Events of a watch ready for its client.
const WATCH_AHEAD: usize = 32;

/// The type of a watch event, as the wire names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchEventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl WatchEventType {
    /// The wire name (`ADDED`, ...), as protobuf's WatchEvent carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEventType::Added => "ADDED",
            WatchEventType::Modified => "MODIFIED",
            WatchEventType::Deleted => "DELETED",
            WatchEventType::Bookmark => "BOOKMARK",
            WatchEventType::Error => "ERROR",
        }
    }
}

impl Resource {
    /// Opens a watch; events arrive on the returned channel until the client goes away.
    pub async fn watch(
        &self,
        namespace: Option<&str>,
        version: &str,
        p: WatchParams,
    ) -> ApiResult<mpsc::Receiver<WatchOut>> {
        self.stored("watch")?;
        let prefix = self.prefix(namespace);
        let rv = p.resource_version.clone().unwrap_or_default();
        let this = Arc::new(Resource {
            strategy: self.strategy.clone(),
            storage: self.storage.clone(),
            config: self.config.clone(),
        });
        let (initial_items, rest, after) = if self.sends_initial_events(&p, &rv)? {
            let params = ListParams {
                label_selector: p.label_selector.clone(),
                field_selector: p.field_selector.clone(),
                resource_version: (!rv.is_empty() && rv != "0").then(|| rv.clone()),
                ..Default::default()
            };
            // Streamed as a LIST without a limit is: the initial events of a large collection are read while they
            // are sent.
            let (of, version, label, field) =
                (this.clone(), version.to_string(), params.label_selector.clone(), params.field_selector.clone());
            let item = move |kv: &KeyValue| {
                let obj = of.decode_stored(kv, &version)?;
                Ok(of.matches(&obj, &label, &field).then_some(obj))
            };
            match this.list_streamed(namespace, &params, item).await {
                Ok((list, rest)) => (list.items, rest, list.revision),
                // kube-apiserver's cacher answers a watch whose initial events wait for a revision it does not reach
                // with a watch whose one event is that error (its errWatcher), not with an HTTP error.
                Err(e) if is_too_large_resource_version(&e) => return Ok(error_watch(e)),
                Err(e) => return Err(e),
            }
        } else {
            (
                Vec::new(),
                None,
                if rv.is_empty() || rv == "0" { self.storage.current_revision() } else { parse_rv(&rv)? },
            )
        };
        let events = self.storage.watch(&prefix, after).await.map_err(|e| match e {
            StorageError::Expired { requested, oldest } => {
                ApiError::gone(format!("too old resource version: {requested} ({oldest})"))
            }
            other => other.into(),
        })?;
        // Events ready for the client: enough for bursts of small ones, few enough that a slow client of large
        // objects (a watch's initial events among them) holds megabytes, not the collection.
        let (tx, rx) = mpsc::channel(WATCH_AHEAD);
        let version = version.to_string();
        tokio::spawn(async move { this.forward((initial_items, rest), after, events, tx, &version, &p).await });
        Ok(rx)
    }

    /// Whether a watch starts with the current objects as ADDED events: asked for (only with bookmarks and
    /// resourceVersionMatch=NotOlderThan), or by default from "now" (no resourceVersion, or "0").
    fn sends_initial_events(&self, p: &WatchParams, rv: &str) -> ApiResult<bool> {
        match p.send_initial_events {
            Some(true) => {
                if p.resource_version_match.as_deref() != Some(NOT_OLDER_THAN) || !p.allow_bookmarks {
                    return Err(self.invalid("", vec![FieldError::forbidden(
                        "sendInitialEvents",
                        "sendInitialEvents is forbidden unless allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan",
                    )]));
                }
                Ok(true)
            }
            Some(false) => Ok(false),
            None => Ok(rv.is_empty() || rv == "0"),
        }
    }

    /// A watch's life after it opened: the initial objects, then storage events after selectors and bookmarks,
    /// until the client goes away or an event ends it with an ERROR.
    async fn forward(
        &self,
        (initial_items, rest): (Vec<Value>, Option<ListRest<Value>>),
        after: u64,
        mut events: mpsc::Receiver<WatchItem>,
        tx: mpsc::Sender<WatchOut>,
        version: &str,
        p: &WatchParams,
    ) {
        for object in initial_items {
            if tx.send(WatchOut::Event { kind: WatchEventType::Added, object }).await.is_err() {
                return;
            }
        }
        if let Some(mut rest) = rest {
            while let Some(read) = rest.recv().await {
                let out = match read {
                    Ok(object) => WatchOut::Event { kind: WatchEventType::Added, object },
                    // The initial events cannot be complete: the watch ends with the error.
                    Err(e) => {
                        let _ = tx.send(WatchOut::Error(e)).await;
                        return;
                    }
                };
                if tx.send(out).await.is_err() {
                    return;
                }
            }
        }
        if p.send_initial_events == Some(true)
            && tx.send(WatchOut::Bookmark { revision: after, initial_events_end: true }).await.is_err()
        {
            return;
        }
        let mut last = after;
        let mut tick = tokio::time::interval(p.bookmark_interval.max(Duration::from_millis(100)));
        tick.tick().await;
        loop {
            let item = tokio::select! {
                item = events.recv() => item,
                _ = tick.tick(), if p.allow_bookmarks => {
                    // Every event up to the progress revision is already queued: drain, then bookmark.
                    let progress = self.storage.progress_revision();
                    while let Ok(item) = events.try_recv() {
                        if !self.relay(item, version, p, &tx, &mut last).await {
                            return;
                        }
                    }
                    last = last.max(progress);
                    if tx.send(WatchOut::Bookmark { revision: last, initial_events_end: false }).await.is_err() {
                        return;
                    }
                    continue;
                }
                _ = tx.closed() => return,
            };
            let Some(item) = item else { return };
            if !self.relay(item, version, p, &tx, &mut last).await {
                return;
            }
        }
    }

    /// Sends a storage event on to the watcher, after selectors, and moves `last` to its revision; false when the
    /// watch is over (the client went away, or the event ended it with an ERROR).
    async fn relay(
        &self,
        item: WatchItem,
        version: &str,
        p: &WatchParams,
        tx: &mpsc::Sender<WatchOut>,
        last: &mut u64,
    ) -> bool {
        match self.translate(item, version, p) {
            Ok(Some((out, revision))) => {
                *last = (*last).max(revision);
                tx.send(out).await.is_ok()
            }
            Ok(None) => true,
            Err(e) => {
                let _ = tx.send(WatchOut::Error(e)).await;
                false
            }
        }
    }

    /// A storage event as the watcher sees it, after selectors: a DELETED when an object leaves the selection.
    fn translate(&self, item: WatchItem, version: &str, p: &WatchParams) -> ApiResult<Option<(WatchOut, u64)>> {
        // An event whose object cannot be read ends the watch with a store read error naming its key, as
        // kube-apiserver's watch does (a client relists, and its list names the object too).
        self.translate_event(item, version, p).map_err(|e| match e.unreadable.is_empty() {
            true => e,
            false => ApiError::store_read_error(self.info().plural, &self.prefix(None), &e.unreadable),
        })
    }

    fn translate_event(&self, item: WatchItem, version: &str, p: &WatchParams) -> ApiResult<Option<(WatchOut, u64)>> {
        let ev = match item {
            WatchItem::Event(ev) => ev,
            WatchItem::Error(StorageError::Expired { requested, oldest }) => {
                return Err(ApiError::gone(format!("too old resource version: {requested} ({oldest})")))
            }
            WatchItem::Error(e) => return Err(e.into()),
        };
        let cur = self.decode_stored_at(&ev.key, &ev.value, ev.revision, version)?;
        let cur_m = self.matches(&cur, &p.label_selector, &p.field_selector);
        let out = match ev.kind {
            EventKind::Created => cur_m.then_some((WatchEventType::Added, cur)),
            EventKind::Deleted => cur_m.then_some((WatchEventType::Deleted, cur)),
            EventKind::Updated => {
                let prev_m = match &ev.prev {
                    Some(prev) => {
                        let p_obj = self.decode_stored(prev, version)?;
                        self.matches(&p_obj, &p.label_selector, &p.field_selector)
                    }
                    None => false,
                };
                match (prev_m, cur_m) {
                    (true, true) => Some((WatchEventType::Modified, cur)),
                    (false, true) => Some((WatchEventType::Added, cur)),
                    (true, false) => Some((WatchEventType::Deleted, cur)),
                    (false, false) => None,
                }
            }
        };
        Ok(out.map(|(kind, object)| (WatchOut::Event { kind, object }, ev.revision)))
    }
}

/// The 504 of a resourceVersion the store has not reached (`wait_for_revision`).
fn is_too_large_resource_version(e: &ApiError) -> bool {
    e.details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == crate::error::CauseType::ResourceVersionTooLarge))
}

/// A watch that sends `e` as its one ERROR event and ends.
fn error_watch(e: ApiError) -> mpsc::Receiver<WatchOut> {
    let (tx, rx) = mpsc::channel(1);
    // The channel is new and has room for the one event.
    let _ = tx.try_send(WatchOut::Error(e));
    rx
}

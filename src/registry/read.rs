//! The reads of the generic registry: get, list (resourceVersion semantics, chunking, continue tokens, every
//! unreadable object named) and watch (selectors, bookmarks, initial events).

use super::continue_token::ContinueToken;
use super::selectors::{FieldSelector, LabelSelector};
use super::splice::splice_stored;
use super::{expired_continue, parse_rv, ListOut, ListParams, RawObject, Resource, WatchOut, WatchParams};
use crate::error::{ApiError, ApiResult, FieldError};
use crate::storage::{EventKind, KeyValue, ListOptions, StorageError, WatchItem};
use kube::api::VersionMatch;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The objects of a LIST without a limit that come after its first part, read at the list's revision while its
/// answer is sent: each one in key order, or the error that ends the list.
pub type ListRest<T> = mpsc::Receiver<ApiResult<T>>;

/// A LIST without a limit whose stored objects come to at most this many bytes is read in one go and answered at
/// once, as before streaming (a thousand small objects cost nothing more); a longer one is answered while its
/// objects are read, this much first, then [`STREAM_STEP_BYTES`] at a time.
const WHOLE_LIST_BYTES: usize = 2 << 20;
const STREAM_STEP_BYTES: usize = 1 << 20;
/// Objects read ahead of the client's reading: with a step, what a slow client makes the server hold.
const STREAM_AHEAD: usize = 16;
/// Events of a watch ready for its client.
const WATCH_AHEAD: usize = 32;

/// The `resourceVersionMatch` parameter and its values, as clients send them.
const RV_MATCH: &str = "resourceVersionMatch";
const EXACT: &str = "Exact";
const NOT_OLDER_THAN: &str = "NotOlderThan";

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

/// What the pages of a list gave: the items kept, the revision read at, whether more follow (and how many objects
/// the store still holds after the last key read).
struct Pages<T> {
    items: Vec<T>,
    read_at: Option<u64>,
    more: bool,
    remaining: u64,
    last_key: Option<String>,
}

impl Resource {
    pub async fn get(&self, namespace: Option<&str>, name: &str, version: &str) -> ApiResult<Value> {
        self.stored("get")?;
        let kv = self.storage.get(&self.key(namespace, name)).await?.ok_or_else(|| self.not_found(name))?;
        self.decode_stored(&kv, version)
    }

    /// Waits (briefly) until `rv` has been reached, for reads that must be "not older than" it.
    async fn wait_for_revision(&self, rv: u64) -> ApiResult<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while self.storage.current_revision() < rv && self.storage.sync_revision().await < rv {
            if tokio::time::Instant::now() >= deadline {
                let mut e = ApiError::timeout(format!(
                    "Too large resource version: {rv}, current: {}",
                    self.storage.current_revision()
                ));
                e.details = Some(Box::new(crate::error::Details {
                    causes: vec![FieldError {
                        reason: crate::error::CauseType::ResourceVersionTooLarge,
                        field: String::new(),
                        message: "Too large resource version".into(),
                    }],
                    retry_after_seconds: Some(1),
                    ..Default::default()
                }));
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn matches(&self, obj: &Value, label: &LabelSelector, field: &FieldSelector) -> bool {
        (label.is_empty() || label.matches(obj.pointer("/metadata/labels")))
            && (field.is_empty() || field.matches(obj, || self.strategy.selectable_fields(obj)))
    }

    pub async fn list(&self, namespace: Option<&str>, version: &str, p: &ListParams) -> ApiResult<ListOut> {
        let (label, field) = (&p.label_selector, &p.field_selector);
        self.list_with(namespace, p, |kv| {
            let obj = self.decode_stored(kv, version)?;
            Ok(self.matches(&obj, label, field).then_some(obj))
        })
        .await
    }

    /// A list without selectors whose items are written for the client straight from their stored bytes: the
    /// stored JSON with apiVersion, kind and metadata.resourceVersion spliced in, without building a
    /// `serde_json::Value` per object (the cost of a large LIST). `None` when selectors need the objects parsed.
    pub async fn list_raw(
        self: &Arc<Self>,
        namespace: Option<&str>,
        version: &str,
        p: &ListParams,
    ) -> ApiResult<Option<(ListOut<RawObject>, Option<ListRest<RawObject>>)>> {
        if !p.label_selector.is_empty() || !p.field_selector.is_empty() || !self.serves_stored_form() {
            return Ok(None);
        }
        let info = self.info();
        let (api_version, version, res) = (info.api_version(version), version.to_string(), self.clone());
        let item = move |kv: &KeyValue| match splice_stored(&kv.value, kv.mod_revision, &api_version, info.kind) {
            Some(raw) => Ok(Some(RawObject(raw))),
            // Not in the shape this server writes: go through the parsed path, which reports it properly.
            None => {
                let obj = res.decode_stored(kv, &version)?;
                serde_json::to_vec(&obj).map(|b| Some(RawObject(b))).map_err(|e| ApiError::internal(e.to_string()))
            }
        };
        Ok(Some(self.list_streamed(namespace, p, item).await?))
    }

    /// [`Resource::list`] as [`Resource::list_streamed`] reads it: every object the selectors match, in `version`,
    /// becomes what `encode` makes of it (its JSON, a Table row, its protobuf message), so that a LIST that needs the
    /// objects parsed (selectors, another version, PartialObjectMetadata) holds a few pages too.
    pub async fn list_encoded(
        self: &Arc<Self>,
        namespace: Option<&str>,
        version: &str,
        p: &ListParams,
        mut encode: impl FnMut(Value) -> ApiResult<Vec<u8>> + Send + 'static,
    ) -> ApiResult<(ListOut<RawObject>, Option<ListRest<RawObject>>)> {
        let (res, version) = (self.clone(), version.to_string());
        let (label, field) = (p.label_selector.clone(), p.field_selector.clone());
        let item = move |kv: &KeyValue| {
            let obj = res.decode_stored(kv, &version)?;
            match res.matches(&obj, &label, &field) {
                true => encode(obj).map(|b| Some(RawObject(b))),
                false => Ok(None),
            }
        };
        self.list_streamed(namespace, p, item).await
    }

    /// [`Resource::list_with`], but a list (or a page of one) whose objects come to more than [`WHOLE_LIST_BYTES`]
    /// reads only that much now (whose errors answer the request) and the rest while its answer is sent, so that
    /// memory holds a few megabytes, not the whole collection. Its answer is the same: one revision, every object
    /// in order, the same continue token. A page's continue token is known only at its end, and comes before its
    /// items: such a page is read twice at its revision, first to find its end, then to send it.
    pub async fn list_streamed<T: Send + 'static>(
        self: &Arc<Self>,
        namespace: Option<&str>,
        p: &ListParams,
        mut item: impl FnMut(&KeyValue) -> ApiResult<Option<T>> + Send + 'static,
    ) -> ApiResult<(ListOut<T>, Option<ListRest<T>>)> {
        self.stored("list")?;
        let prefix = self.prefix(namespace);
        let version_match = self.version_match(p)?;
        let (start_after, revision) = self.list_start(&prefix, p, version_match).await?;
        // As much as WHOLE_LIST_BYTES of stored objects in one read: a list no longer is answered whole, as before.
        let head = self.read_pages(&prefix, p, start_after, (revision, WHOLE_LIST_BYTES), &mut item).await?;
        let revision = head.read_at.unwrap_or_else(|| self.storage.current_revision());
        let page_full = p.limit > 0 && head.items.len() >= p.limit;
        let (Some(head_end), true, false) = (head.last_key.clone(), head.more, page_full) else {
            return Ok((self.list_out(&prefix, p, head, revision), None));
        };
        let Pages { items, read_at, more, remaining, last_key } = head;
        // A page's end: read on, keeping nothing, until its limit is reached or the list ends.
        let (mut end, mut to_send) = (Pages { items: Vec::<()>::new(), read_at, more, remaining, last_key }, None);
        if p.limit > 0 {
            let (mut counted, mut after) = (items.len(), Some(head_end.clone()));
            while let Some(start) = after.take() {
                let step = ListParams { limit: p.limit - counted, continue_token: None, ..p.clone() };
                let mut count = |kv: &KeyValue| item(kv).map(|o| o.map(drop));
                let read = (Some(revision), STREAM_STEP_BYTES);
                end = self.read_pages(&prefix, &step, Some(start), read, &mut count).await?;
                counted += end.items.len();
                to_send = Some(counted - items.len());
                after = end.last_key.clone().filter(|_| end.more && counted < p.limit);
            }
        }
        // Without a limit the answer is the whole list: no continue token, nothing remaining.
        end.more &= p.limit > 0;
        let page = self.list_out(&prefix, p, end, revision);
        let out = ListOut { items, revision, continue_token: page.continue_token, remaining: page.remaining };
        if to_send == Some(0) {
            return Ok((out, None)); // nothing after the first read matched
        }
        let (tx, rx) = mpsc::channel(STREAM_AHEAD);
        let (res, p) = (self.clone(), ListParams { continue_token: None, ..p.clone() });
        tokio::spawn(async move {
            let (mut after, mut sent) = (Some(head_end), 0);
            while let Some(start) = after.take() {
                // With a limit: as many as the page's end was found to hold.
                let limit = to_send.map_or(0, |n: usize| n - sent);
                let step = ListParams { limit, ..p.clone() };
                let read = (Some(revision), STREAM_STEP_BYTES);
                let pages = match res.read_pages(&prefix, &step, Some(start), read, &mut item).await {
                    Ok(pages) => pages,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                sent += pages.items.len();
                for obj in pages.items {
                    if tx.send(Ok(obj)).await.is_err() {
                        return; // the client went away
                    }
                }
                let page_done = to_send.is_some_and(|n| sent >= n);
                after = pages.last_key.filter(|_| pages.more && !page_done);
            }
        });
        Ok((out, Some(rx)))
    }

    /// The list machinery (resourceVersion semantics, chunking, continue tokens) with `item` deciding what each
    /// stored object becomes (`None`: filtered out).
    pub async fn list_with<T>(
        &self,
        namespace: Option<&str>,
        p: &ListParams,
        mut item: impl FnMut(&KeyValue) -> ApiResult<Option<T>>,
    ) -> ApiResult<ListOut<T>> {
        self.stored("list")?;
        let prefix = self.prefix(namespace);
        let version_match = self.version_match(p)?;
        let (start_after, revision) = self.list_start(&prefix, p, version_match).await?;
        let pages = self.read_pages(&prefix, p, start_after, (revision, 0), &mut item).await?;
        let revision = pages.read_at.unwrap_or_else(|| self.storage.current_revision());
        Ok(self.list_out(&prefix, p, pages, revision))
    }

    /// A list (or page) of what `pages` read, at `revision`: its continue token when more is left to read after
    /// its last key, and how many objects are left when no selector leaves them uncounted.
    fn list_out<T>(&self, prefix: &str, p: &ListParams, pages: Pages<T>, revision: u64) -> ListOut<T> {
        let continue_token = match (&pages.last_key, pages.more) {
            (Some(k), true) => Some(
                ContinueToken { revision: Some(revision), start: k.strip_prefix(prefix).unwrap_or(k).to_string() }
                    .encode(),
            ),
            _ => None,
        };
        let filtered = !p.label_selector.is_empty() || !p.field_selector.is_empty();
        let remaining = (pages.more && !filtered).then_some(pages.remaining as i64);
        ListOut { items: pages.items, revision, continue_token, remaining }
    }

    /// The list's resourceVersionMatch, checked against its resourceVersion as kube-apiserver checks it.
    fn version_match(&self, p: &ListParams) -> ApiResult<Option<VersionMatch>> {
        let version_match = match p.resource_version_match.as_deref().unwrap_or("") {
            "" => return Ok(None),
            EXACT => VersionMatch::Exact,
            NOT_OLDER_THAN => VersionMatch::NotOlderThan,
            other => {
                let allowed = [EXACT, NOT_OLDER_THAN];
                return Err(self.invalid("", vec![FieldError::not_supported(RV_MATCH, other, &allowed)]));
            }
        };
        let forbidden = |why: &str| self.invalid("", vec![FieldError::forbidden(RV_MATCH, why)]);
        match p.resource_version.as_deref().unwrap_or("") {
            "" => Err(forbidden("resourceVersionMatch is forbidden unless resourceVersion is provided")),
            "0" if version_match == VersionMatch::Exact => {
                Err(forbidden("resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""))
            }
            _ => Ok(Some(version_match)),
        }
    }

    /// Where a list starts (the key to start after) and the revision it reads at, from its continue token or its
    /// resourceVersion. A revision the store has not reached (an exact resourceVersion, or one in a continue token)
    /// is waited for briefly, then a 504 as kube-apiserver answers it: never a list "at" a revision that does not
    /// exist.
    async fn list_start(
        &self,
        prefix: &str,
        p: &ListParams,
        version_match: Option<VersionMatch>,
    ) -> ApiResult<(Option<String>, Option<u64>)> {
        let rv = p.resource_version.as_deref().unwrap_or("");
        let (mut start_after, mut revision) = (None, None);
        if let Some(token) = p.continue_token.as_deref().filter(|t| !t.is_empty()) {
            if !rv.is_empty() && rv != "0" {
                return Err(ApiError::bad_request("specifying resource version is not allowed when using continue"));
            }
            let t = ContinueToken::decode(token)?;
            start_after = Some(format!("{prefix}{}", t.start));
            revision = t.revision;
        } else if !rv.is_empty() && rv != "0" {
            let n = parse_rv(rv)?;
            if version_match == Some(VersionMatch::Exact) {
                revision = Some(n);
            } else {
                self.wait_for_revision(n).await?;
            }
        }
        if let Some(n) = revision {
            self.wait_for_revision(n).await?;
        }
        Ok((start_after, revision))
    }

    /// Reads pages from `start_after` at `revision` until `p.limit` items are kept (all, without a limit); with
    /// `max_bytes`, or until about that many bytes of stored objects are read.
    async fn read_pages<T>(
        &self,
        prefix: &str,
        p: &ListParams,
        mut start_after: Option<String>,
        (revision, max_bytes): (Option<u64>, usize),
        item: &mut impl FnMut(&KeyValue) -> ApiResult<Option<T>>,
    ) -> ApiResult<Pages<T>> {
        let mut pages = Pages { items: Vec::new(), read_at: revision, more: false, remaining: 0, last_key: None };
        let (mut unreadable, mut budget) = (Vec::new(), max_bytes);
        loop {
            let options = ListOptions {
                start_after: start_after.clone(),
                limit: p.limit,
                revision: pages.read_at,
                max_bytes: budget,
            };
            let res = self.storage.list(prefix, options).await.map_err(|e| match e {
                StorageError::Expired { .. } if p.continue_token.is_some() => expired_continue(prefix, &start_after),
                StorageError::Expired { requested, oldest } => {
                    ApiError::gone(format!("too old resource version: {requested} ({oldest})"))
                }
                StorageError::Corrupt(values) => ApiError::store_read_error(self.info().plural, prefix, &values),
                other => other.into(),
            })?;
            pages.read_at = Some(res.revision);
            pages.more = res.more;
            pages.remaining = res.remaining;
            let n = res.items.len();
            for (idx, kv) in res.items.iter().enumerate() {
                pages.last_key = Some(kv.key.clone());
                let read = match item(kv) {
                    // Every unreadable object of the list is named, not just the first.
                    Err(e) if !e.unreadable.is_empty() => {
                        unreadable.extend(e.unreadable);
                        continue;
                    }
                    other => other?,
                };
                if let Some(obj) = read {
                    pages.items.push(obj);
                    if p.limit > 0 && pages.items.len() >= p.limit {
                        // Stopped inside this page: what is left of it is still to come.
                        pages.more |= idx + 1 < n;
                        break;
                    }
                }
            }
            if !pages.more || p.limit == 0 || pages.items.len() >= p.limit {
                break;
            }
            // Reads capped in bytes stop at that many in all: a step of a streamed list, which reads on itself.
            if max_bytes > 0 {
                budget = budget.saturating_sub(res.items.iter().map(|kv| kv.value.len()).sum());
                if budget == 0 {
                    break;
                }
            }
            start_after = pages.last_key.clone();
        }
        if !unreadable.is_empty() {
            return Err(ApiError::store_read_error(self.info().plural, prefix, &unreadable));
        }
        Ok(pages)
    }

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

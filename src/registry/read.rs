//! The reads of the generic registry: get and list (resourceVersion semantics, chunking, continue tokens, every
//! unreadable object named, large answers streamed). Watches are in [`super::watch`].

use super::continue_token::ContinueToken;
use super::selectors::{FieldSelector, LabelSelector};
use super::splice::splice_stored;
use super::{expired_continue, parse_rv, ListOut, ListParams, RawObject, Resource};
use crate::error::{ApiError, ApiResult, FieldError};
use crate::storage::{KeyValue, ListOptions, StorageError};
use kube::api::VersionMatch;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The objects of a LIST without a limit that come after its first part, read at the list's revision while its
/// answer is sent: each one in key order, or the error that ends the list.
pub type ListRest<T> = mpsc::Receiver<ApiResult<T>>;

/// A LIST without a limit whose stored objects come to at most this many bytes is read in one go and answered at
/// once, as before streaming (a thousand small objects cost nothing more); a longer one is answered while its
/// objects are read, this much first, then [`STREAM_STEP_BYTES`] at a time.
const WHOLE_LIST_BYTES: usize = 2 << 20;
const STREAM_STEP_BYTES: usize = 1 << 20;
/// How long a list decodes objects before the runtime's other tasks get their turn, and the stored bytes decoded
/// between two looks at the clock.
const TURN: Duration = Duration::from_micros(250);
const CLOCK_BYTES: usize = 16 * 1024;
/// Objects read ahead of the client's reading: with a step, what a slow client makes the server hold.
const STREAM_AHEAD: usize = 16;

/// The `resourceVersionMatch` parameter and its values, as clients send them.
const RV_MATCH: &str = "resourceVersionMatch";
const EXACT: &str = "Exact";
pub(super) const NOT_OLDER_THAN: &str = "NotOlderThan";

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

    pub(super) fn matches(&self, obj: &Value, label: &LabelSelector, field: &FieldSelector) -> bool {
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
        let (mut unreadable, mut budget, mut turn) = (Vec::new(), max_bytes, Turn::start());
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
            let mut since_clock = 0;
            for (idx, kv) in res.items.iter().enumerate() {
                // Decoding and encoding a megabyte takes milliseconds: other requests get their turn in between.
                since_clock += kv.value.len();
                if since_clock >= CLOCK_BYTES {
                    since_clock = 0;
                    turn.take_if_over().await;
                }
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
}

/// A task's turn on its worker thread: with one worker, a list that decodes megabytes at once holds every other
/// request (a GET) for milliseconds, so it yields once its turn has lasted [`TURN`].
struct Turn(Instant);

impl Turn {
    fn start() -> Self {
        Turn(Instant::now())
    }

    async fn take_if_over(&mut self) {
        if self.0.elapsed() >= TURN {
            tokio::task::yield_now().await;
            self.0 = Instant::now();
        }
    }
}

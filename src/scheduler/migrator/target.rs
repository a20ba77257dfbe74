//! Talking to the target: its responses, retries and the chunked LIST and no-op writes of one migration. Requests
//! are built by kube-core's request builders, lists read as typed lists of object metadata, and answers classified
//! by their Status reason (as the rest of the crate compares errors).

use super::*;
use crate::api::storage_version_migration::GroupVersionResource;
use crate::error::StatusReason;
use crate::scheduler::adaptive::Pace;
use crate::scheduler::trigger_kit::{discover_resource, DocumentSource};
use crate::scheduler::SchedulerConfig;
use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch};
use kube::core::{ApiResource, DynamicObject, ObjectList, PartialObjectMeta};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// What to do with a response to a request to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    Success,
    /// The object was deleted (404) or rewritten (409) since it was listed: nothing left to do for it.
    Skip,
    /// Transient: try again after a backoff (or the server's Retry-After).
    Retry,
    /// Permanent: the migration fails.
    Fail,
}

/// The disposition of a write's answer: its HTTP status for a success, else its Status reason
/// ([`StatusReason::of_answer`]). LISTs read it too, with their own meaning of NotFound and Expired.
pub fn classify(code: u16, reason: Option<StatusReason>) -> Disposition {
    if (200..=299).contains(&code) {
        return Disposition::Success;
    }
    match reason {
        Some(StatusReason::NotFound | StatusReason::Conflict | StatusReason::AlreadyExists) => Disposition::Skip,
        Some(
            StatusReason::TooManyRequests
            | StatusReason::InternalError
            | StatusReason::StoreReadError
            | StatusReason::ServiceUnavailable
            | StatusReason::Timeout,
        ) => Disposition::Retry,
        Some(_) => Disposition::Fail,
        // A proxy's Bad Gateway carries no Status: transient as well.
        None if code == 502 => Disposition::Retry,
        None => Disposition::Fail,
    }
}

/// The retries of a request: `attempts` in all, waiting `base * 2^(n-1)` (capped at `max`) after the n-th failure.
pub fn backoff(base: Duration, max: Duration, attempts: u32) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(base)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_max_times(attempts.saturating_sub(1) as usize)
}

/// The wait before the next attempt: the server's Retry-After when it sent one (capped), else the backoff's;
/// `None` (no more attempts) stays `None`.
pub fn next_delay(backoff: Option<Duration>, retry_after: Option<Duration>) -> Option<Duration> {
    backoff.map(|d| retry_after.map_or(d, |ra| ra.min(MAX_RETRY_AFTER)))
}

/// A failed attempt that may be retried: why, and the server's Retry-After.
struct Transient {
    why: String,
    retry_after: Option<Duration>,
}

/// A response read to the end.
pub(super) struct Reply {
    pub(super) code: u16,
    /// The Status reason of an answer other than a success (by its code when it carries none).
    pub(super) reason: Option<StatusReason>,
    pub(super) retry_after: Option<Duration>,
    pub(super) body: Bytes,
}

impl Reply {
    fn disposition(&self) -> Disposition {
        classify(self.code, self.reason)
    }

    /// `404 NotFound: <message>` from a Status body, or the start of whatever else the server sent.
    pub(super) fn describe(&self) -> String {
        let reason = axum::http::StatusCode::from_u16(self.code).ok().and_then(|c| c.canonical_reason()).unwrap_or("");
        let detail = match serde_json::from_slice::<serde_json::Value>(&self.body) {
            Ok(v) if v["kind"] == "Status" => v["message"].as_str().unwrap_or_default().to_string(),
            _ => String::from_utf8_lossy(&self.body).trim().to_string(),
        };
        let detail = truncate(&detail, MAX_QUOTE);
        if detail.is_empty() {
            format!("{} {reason}", self.code)
        } else {
            format!("{} {reason}: {detail}", self.code)
        }
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Retry-After in seconds (the only form Kubernetes sends), from the header or the Status' details.
pub(super) fn retry_after(headers: &axum::http::HeaderMap, body: &[u8]) -> Option<Duration> {
    let header =
        headers.get(axum::http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|s| s.trim().parse().ok());
    let details = || serde_json::from_slice::<serde_json::Value>(body).ok()?["details"]["retryAfterSeconds"].as_u64();
    header.or_else(details).map(Duration::from_secs)
}

pub(super) struct Target {
    pub(super) client: kube::Client,
    pub(super) pace: Pace,
    pub(super) config: SchedulerConfig,
}

/// Why a request to the target got no answer to interpret.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Build(#[from] kube::core::request::Error),
    #[error(transparent)]
    Send(#[from] kube::Error),
    #[error("reading the response: {0}")]
    Read(kube::Error),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// `last`: the last attempt's transport error or retryable answer.
    #[error("gave up after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: String },
}

/// Why a migration failed: the message of its Failed condition.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("LIST {resource}: {error}")]
    List { resource: String, error: RequestError },
    #[error("LIST {resource}: decoding the response: {error}")]
    ListDecode { resource: String, error: serde_json::Error },
    /// `answer`: the target's answer, described.
    #[error("LIST {resource}: {answer}")]
    ListRefused { resource: String, answer: String },
    #[error("LIST {resource}: {answer} (the target does not serve {plural} in {group_version})")]
    NotServed { resource: String, answer: String, plural: String, group_version: String },
    #[error("LIST {resource}: the list ended without a final chunk")]
    ListEnded { resource: String },
    #[error("LIST {resource}: the continue token expired {times} times in a row")]
    TokenExpired { resource: String, times: u32 },
    #[error("rewriting {object}: {error}")]
    Rewrite { object: String, error: RequestError },
    #[error("rewriting {object}: {answer}")]
    RewriteRefused { object: String, answer: String },
    /// This server refused to record the migration's own state (a 422 of its validation).
    #[error("the server refused to record the migration's state: {answer}")]
    StateRefused { answer: String },
    /// An in-tree migration names a resource the target's discovery does not list.
    #[error("{resource}: the resource does not exist in discovery")]
    NotInDiscovery { resource: String },
    #[error("discovery of {resource}: {error}")]
    Discovery { resource: String, error: RequestError },
    #[error("discovery of {resource}: {answer}")]
    DiscoveryRefused { resource: String, answer: String },
    /// Discovery lists the resource without one of the verbs a migration needs (the in-tree resource-version
    /// controller's message; `gvr` as Go prints a GroupVersionResource).
    #[error("resource {gvr:?} does not support discovery operations: [update patch list]")]
    UnsupportedVerbs { gvr: String },
    /// The resource's list resourceVersion is not one a migration can compare objects' with (the in-tree
    /// resource-version controller's message).
    #[error("latest resourceVersion for {gvr} is not valid: resource version is not well formed: {resource_version}")]
    MalformedResourceVersion { gvr: String, resource_version: String },
}

impl Failure {
    /// A request kept failing with retryable errors (429, 5xx, timeouts, dropped connections): the migration is
    /// retried later, never Failed, as kube-controller-manager's GA controller retries such errors.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Failure::List { error: RequestError::GaveUp { .. }, .. }
                | Failure::Rewrite { error: RequestError::GaveUp { .. }, .. }
                | Failure::Discovery { error: RequestError::GaveUp { .. }, .. }
        )
    }

    /// Whether the in-tree resource-version controller would say this (its message is then the Failed message,
    /// as it is).
    pub fn is_checkpoint(&self) -> bool {
        matches!(
            self,
            Failure::NotInDiscovery { .. }
                | Failure::UnsupportedVerbs { .. }
                | Failure::MalformedResourceVersion { .. }
        )
    }
}

/// A GroupVersionResource as Go's `schema.GroupVersionResource.String()` prints it: `apps/v1, Resource=deployments`,
/// `/v1, Resource=secrets`.
pub fn go_gvr(gvr: &GroupVersionResource) -> String {
    format!("{}/{}, Resource={}", gvr.group, gvr.version, gvr.resource)
}

/// Whether `rv` is a resourceVersion apimachinery can compare (`CompareResourceVersion`): decimal digits without a
/// leading zero, and not `0`.
pub fn well_formed_resource_version(rv: &str) -> bool {
    !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit()) && !rv.starts_with('0')
}

impl Target {
    /// One request, rate limited and with a timeout; Err is a transport failure (retryable).
    pub(super) async fn send_once(&self, req: axum::http::Request<Vec<u8>>) -> Result<Reply, RequestError> {
        self.pace.acquire().await;
        let sent = std::time::Instant::now();
        let mut req = req.map(kube::client::Body::from);
        // JSON, unless the request asks for a form of it (a LIST of metadata).
        if !req.headers().contains_key(axum::http::header::ACCEPT) {
            req.headers_mut()
                .insert(axum::http::header::ACCEPT, axum::http::HeaderValue::from_static("application/json"));
        }
        let exchange = async {
            let resp = self.client.send(req).await?;
            let code = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.map_err(RequestError::Read)?.to_bytes();
            let reason = match (200..=299).contains(&code) {
                true => None,
                false => answer_reason(code, &body),
            };
            let retry_after =
                if classify(code, reason) == Disposition::Retry { retry_after(&headers, &body) } else { None };
            Ok(Reply { code, reason, retry_after, body })
        };
        let result = match tokio::time::timeout(self.config.request_timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(RequestError::Timeout(self.config.request_timeout)),
        };
        // The answer (or its absence) is the adaptive rate's feedback.
        match &result {
            Ok(reply) => self.pace.answered(reply.code, sent.elapsed(), reply.retry_after),
            Err(_) => self.pace.failed(),
        }
        result
    }

    /// A request retried on transient errors. Ok is the final response (any non-retryable status, for the caller
    /// to interpret); Err says why it gave up after `max_attempts`. `retrying` holds the last transient error while
    /// this request is being retried, and is cleared when it gets an answer to interpret.
    pub(super) async fn send(
        &self,
        build: impl Fn() -> Result<axum::http::Request<Vec<u8>>, kube::core::request::Error>,
        retrying: &RetryNote,
    ) -> Result<Reply, RequestError> {
        let (method, path) = {
            let req = build()?;
            (req.method().clone(), req.uri().to_string())
        };
        let attempts = AtomicU32::new(0);
        let attempt = || async {
            attempts.fetch_add(1, Ordering::Relaxed);
            let req = build().map_err(|e| Transient { why: e.to_string(), retry_after: None })?;
            match self.send_once(req).await {
                Ok(reply) if reply.disposition() != Disposition::Retry => {
                    retrying.set(None);
                    Ok(reply)
                }
                Ok(reply) => Err(Transient { why: reply.describe(), retry_after: reply.retry_after }),
                Err(e) => Err(Transient { why: e.to_string(), retry_after: None }),
            }
        };
        let policy = backoff(self.config.retry_base, self.config.retry_max, self.config.max_attempts.max(1));
        attempt
            .retry(policy)
            .sleep(tokio::time::sleep)
            .adjust(|t: &Transient, delay| next_delay(delay, t.retry_after))
            .notify(|t: &Transient, delay| {
                retrying.set(Some(t.why.clone()));
                tracing::debug!(%method, %path, attempt = attempts.load(Ordering::Relaxed), ?delay, error = %t.why,
                    "retrying a request to the target")
            })
            .await
            .map_err(|t| RequestError::GaveUp { attempts: attempts.load(Ordering::Relaxed), last: t.why })
    }
}

/// The target's discovery documents as a migration reads them: rate limited and retried like its other requests,
/// failures named after the resource.
struct Documents<'a> {
    target: &'a Target,
    resource: &'a str,
    retrying: &'a RetryNote,
}

impl DocumentSource for Documents<'_> {
    type Error = Failure;
    async fn get_json<T: serde::de::DeserializeOwned + Send>(&self, path: &str) -> Result<Option<T>, Failure> {
        let build = || {
            axum::http::Request::builder()
                .method(axum::http::Method::GET)
                .uri(path)
                .body(Vec::new())
                .map_err(kube::core::request::Error::BuildRequest)
        };
        let resource = || self.resource.to_string();
        let reply = self
            .target
            .send(build, self.retrying)
            .await
            .map_err(|error| Failure::Discovery { resource: resource(), error })?;
        if reply.reason == Some(StatusReason::NotFound) {
            return Ok(None);
        }
        if !(200..=299).contains(&reply.code) {
            return Err(Failure::DiscoveryRefused { resource: resource(), answer: reply.describe() });
        }
        serde_json::from_slice(&reply.body)
            .map(Some)
            .map_err(|e| Failure::DiscoveryRefused { resource: resource(), answer: format!("decoding {path}: {e}") })
    }
}

impl Target {
    /// The version an in-tree migration of `resource` lists and writes through, as kube-controller-manager's
    /// RESTMapper picks it (the scheduler's discovery, [`discover_resource`]). It must list the verbs a migration
    /// uses (list, update, patch), as the GA resource-version controller checks.
    pub(super) async fn resolve(
        &self,
        resource: &ResourceKey,
        retrying: &RetryNote,
    ) -> Result<GroupVersionResource, Failure> {
        let qualified = crate::error::qualified(&resource.resource, &resource.group);
        let documents = Documents { target: self, resource: &qualified, retrying };
        let Some(found) = discover_resource(&documents, &resource.group, &resource.resource).await? else {
            return Err(Failure::NotInDiscovery { resource: qualified });
        };
        if ["update", "patch", "list"].iter().any(|verb| !found.verbs.iter().any(|v| v == verb)) {
            return Err(Failure::UnsupportedVerbs { gvr: go_gvr(&found.gvr()) });
        }
        Ok(found.gvr())
    }
}

/// The last transient error of a migration's requests while they are being retried: what its Running condition
/// shows (a migration that only retries looks stuck otherwise), and a Warning Event regarding the migration at
/// every retry (repetitions become one Event's series).
pub(super) struct RetryNote {
    last: std::sync::Mutex<Option<String>>,
    events: MigrationEvents,
}

impl RetryNote {
    pub(super) fn new(events: MigrationEvents) -> Self {
        RetryNote { last: Default::default(), events }
    }
    pub(super) fn set(&self, why: Option<String>) {
        if let Some(why) = &why {
            self.events.warning(EVENT_RETRYING, &format!("Retrying a request to the target: {why}"));
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
    pub(super) fn get(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The reason of an answer other than a success: its Status' (or by its code when the body is none).
fn answer_reason(code: u16, body: &[u8]) -> Option<StatusReason> {
    let status = serde_json::from_slice::<kube::core::Status>(body).ok();
    StatusReason::of_answer(status.as_ref().map_or("", |s| s.reason.as_str()), code)
}

/// What the migrator reads of a LIST: the objects' metadata and the list's, asked for as a
/// PartialObjectMetadataList.
pub(super) type ListChunk = ObjectList<PartialObjectMeta<DynamicObject>>;

/// One listed object.
pub(super) type ItemRef = PartialObjectMeta<DynamicObject>;

/// `namespace/name`, or `name` for a cluster-scoped object.
pub(super) fn display(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// kube-core's description of the resource, for its request builders (the kind is not needed for URLs).
pub(super) fn api_resource(gvr: &GroupVersionResource) -> ApiResource {
    let gvk = kube::core::GroupVersionKind::gvk(&gvr.group, &gvr.version, "");
    ApiResource::from_gvk_with_plural(&gvk, &gvr.resource)
}

/// `api/v1` or `apis/<group>/<version>`: the resource's URL, as kube-core builds it, without its plural.
pub(super) fn group_version_of(url: &str, plural: &str) -> String {
    let url = url.trim_start_matches('/');
    url.strip_suffix(plural).map_or(url, |u| u.trim_end_matches('/')).to_string()
}

pub(super) enum Listed {
    Chunk(ListChunk),
    /// 410 Gone on an expired continue token: resume with the inconsistent token the server handed out.
    Expired(Option<String>),
}

/// How one object went.
pub(super) enum Rewrite {
    Done,
    Skipped,
}

/// One resource of the target, as a migration sees it.
pub(super) struct Migrating<'a> {
    pub(super) target: &'a Target,
    pub(super) gvr: &'a GroupVersionResource,
    /// `shootstates.core.gardener.cloud` for messages.
    pub(super) qualified: String,
    pub(super) retrying: RetryNote,
    /// The field manager of the no-op writes.
    pub(super) manager: &'static str,
    /// Objects asked for in the next chunk: `--migration-chunk-size`, or fewer when the objects' metadata is so
    /// large that a chunk of that many would pass [`CHUNK_BYTES`] (see [`chunk_limit`]).
    pub(super) chunk_limit: AtomicU32,
}

/// The bytes of a LIST chunk the migrator aims to stay under. Chunks are lists of the objects' metadata
/// (PartialObjectMetadataList, as the in-tree migrator's metadata informer reads them), so their size does not grow
/// with the objects' data; metadata is usually under 2 KiB, so 500 objects take about 1 MiB, but annotations and
/// managedFields can make it hundreds of KiB, which would make chunks of 500 that much larger.
pub(super) const CHUNK_BYTES: usize = 4 << 20;

/// The next chunk's limit after a chunk of `items` objects that came to `bytes`: as many objects of that average
/// size as fit in [`CHUNK_BYTES`], between 1 and `max` (`--migration-chunk-size`).
pub(super) fn chunk_limit(max: u32, items: usize, bytes: usize) -> u32 {
    if items == 0 {
        return max;
    }
    let per_object = (bytes / items).max(1);
    u32::try_from(CHUNK_BYTES / per_object).unwrap_or(u32::MAX).clamp(1, max.max(1))
}

impl Migrating<'_> {
    pub(super) async fn list(&self, token: Option<&str>) -> Result<Listed, Failure> {
        let url = <DynamicObject as kube::Resource>::url_path(&api_resource(self.gvr), None);
        let mut params = ListParams::default().limit(self.chunk_limit.load(Ordering::Relaxed));
        params.continue_token = token.filter(|t| !t.is_empty()).map(str::to_string);
        let reply = self
            .target
            .send(|| kube::core::Request::new(&url).list_metadata(&params), &self.retrying)
            .await
            .map_err(|error| Failure::List { resource: self.qualified.clone(), error })?;
        if (200..=299).contains(&reply.code) {
            let chunk = serde_json::from_slice::<ListChunk>(&reply.body)
                .map_err(|error| Failure::ListDecode { resource: self.qualified.clone(), error })?;
            let next = chunk_limit(self.target.config.chunk_size, chunk.items.len(), reply.body.len());
            self.chunk_limit.store(next, Ordering::Relaxed);
            return Ok(Listed::Chunk(chunk));
        }
        match reply.reason {
            Some(StatusReason::Expired) => {
                let status = serde_json::from_slice::<kube::core::Status>(&reply.body).ok();
                let next = status.and_then(|s| s.metadata?.continue_).filter(|t| !t.is_empty());
                Ok(Listed::Expired(next))
            }
            Some(StatusReason::NotFound) => Err(Failure::NotServed {
                resource: self.qualified.clone(),
                answer: reply.describe(),
                plural: self.gvr.resource.clone(),
                group_version: group_version_of(&url, &self.gvr.resource),
            }),
            _ => Err(Failure::ListRefused { resource: self.qualified.clone(), answer: reply.describe() }),
        }
    }

    /// The resource's current list resourceVersion (a LIST of one object), recorded by an in-tree migration when
    /// it starts as the in-tree controller records it (resourceversion.go).
    pub(super) async fn list_resource_version(&self) -> Result<String, Failure> {
        let url = <DynamicObject as kube::Resource>::url_path(&api_resource(self.gvr), None);
        let params = ListParams::default().limit(1);
        let reply = self
            .target
            .send(|| kube::core::Request::new(&url).list_metadata(&params), &self.retrying)
            .await
            .map_err(|error| Failure::List { resource: self.qualified.clone(), error })?;
        if !(200..=299).contains(&reply.code) {
            return Err(Failure::ListRefused { resource: self.qualified.clone(), answer: reply.describe() });
        }
        let list = serde_json::from_slice::<ListChunk>(&reply.body)
            .map_err(|error| Failure::ListDecode { resource: self.qualified.clone(), error })?;
        let rv = list.metadata.resource_version.unwrap_or_default();
        match well_formed_resource_version(&rv) {
            true => Ok(rv),
            false => Err(Failure::MalformedResourceVersion { gvr: go_gvr(self.gvr), resource_version: rv }),
        }
    }

    pub(super) async fn rewrite(&self, item: &ObjectMeta) -> Result<Rewrite, Failure> {
        let ns = item.namespace.as_deref().filter(|n| !n.is_empty());
        let url = <DynamicObject as kube::Resource>::url_path(&api_resource(self.gvr), ns);
        let name = item.name.as_deref().unwrap_or_default();
        let patch = Patch::Merge(serde_json::json!({"metadata": {"resourceVersion": item.resource_version}}));
        let what = || format!("{} {:?}", self.qualified, display(item));
        let params = crate::scheduler::managers::patch(self.manager);
        let build = || kube::core::Request::new(&url).patch(name, &params, &patch);
        let reply = self
            .target
            .send(build, &self.retrying)
            .await
            .map_err(|error| Failure::Rewrite { object: what(), error })?;
        match reply.disposition() {
            Disposition::Success => Ok(Rewrite::Done),
            Disposition::Skip => {
                tracing::debug!(object = %self::display(item), code = reply.code, "skipped: deleted or rewritten meanwhile");
                Ok(Rewrite::Skipped)
            }
            _ => Err(Failure::RewriteRefused { object: what(), answer: reply.describe() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_holds_up_to_its_bytes() {
        // Metadata of about 1 KiB: --migration-chunk-size holds.
        assert_eq!(chunk_limit(500, 500, 500 << 10), 500);
        // Metadata of 64 KiB (a large last-applied-configuration): 64 objects make the 4 MiB.
        assert_eq!(chunk_limit(500, 500, 500 << 16), 64);
        // One object larger than the bound: still one at a time; an empty chunk says nothing of sizes.
        assert_eq!(chunk_limit(500, 1, 8 << 20), 1);
        assert_eq!(chunk_limit(500, 0, 100), 500);
        // Small again: back up to the flag, never past it.
        assert_eq!(chunk_limit(500, 64, 64 << 10), 500);
        assert_eq!(chunk_limit(0, 10, 10), 1);
    }
}

//! The migrator: runs every StorageVersionMigration that has neither Succeeded nor Failed, oldest first (Running
//! ones before pending ones), at most `concurrency` at once. A migration LISTs its resource in chunks from
//! `spec.continueToken` and rewrites each object with a no-op write (a JSON merge patch carrying only
//! `metadata.resourceVersion`, as the in-tree controller sends it), then saves the next token and its progress
//! through our own API. The token is saved only after every object of the chunk was handled, so a crash at any
//! point re-does at most one chunk (harmless: a stale resourceVersion is a 409, which is skipped) and skips nothing.
//!
//! Every request to the target takes a token from one global bucket (`--migration-qps`/`--migration-burst`).
//! Transient errors (429, 500, 502, 503, 504, timeouts, connection errors) are retried with exponential backoff
//! honouring Retry-After, up to `max_attempts`; anything else fails the migration at once with a message naming the
//! object, instead of retrying forever as kube-storage-version-migrator does (its issue #83).
//!
//! Someone else may finish a migration under us: the trigger supersedes it (Failed=True, reason Superseded) or a
//! user deletes it. Every save is a compare-and-swap on resourceVersion; on a conflict the migration is re-read and,
//! if it is now finished or gone, dropped without overwriting anything. The scheduler loop also notices it (watch
//! of storageversionmigrations) and interrupts the work on the target.

use super::metrics::{resource_label, SchedulerMetrics};
use super::own::OwnApi;
use super::ratelimit::RateLimiter;
use super::SchedulerConfig;
use crate::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
};
use crate::registry::{WatchOut, WatchParams};
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::{AbortHandle, JoinSet};

/// Writes in flight at once within one migration: enough to keep a fast target busy at unlimited QPS; with a QPS
/// limit they simply queue at the token bucket.
const WRITE_PARALLELISM: usize = 16;
/// The scheduler re-reads the migrations at least this often (a watch wakes it sooner).
const RESCAN: Duration = Duration::from_secs(1);
/// Own-API saves that fail for reasons other than a conflict are retried this often before the worker gives up
/// (the scheduler restarts it from the saved token on its next scan).
const SAVE_ATTEMPTS: u32 = 5;
/// Retry-After values beyond this are capped (a misbehaving server must not park a migration for days).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// How much of an error response is quoted in a failure message.
const MAX_QUOTE: usize = 1024;

const REASON_MIGRATING: &str = "Migrating";
const REASON_COMPLETED: &str = "Completed";
const REASON_FAILED: &str = "MigrationFailed";

pub fn spawn(
    config: SchedulerConfig,
    target: kube::Client,
    own: OwnApi,
    metrics: Arc<SchedulerMetrics>,
) -> tokio::task::JoinHandle<()> {
    let limiter = RateLimiter::new(config.qps, config.burst);
    let ctx = Arc::new(Ctx { target: Target { client: target, limiter, config }, own, metrics });
    tokio::spawn(Scheduler { ctx, running: HashMap::new(), workers: JoinSet::new() }.run())
}

struct Ctx {
    target: Target,
    own: OwnApi,
    metrics: Arc<SchedulerMetrics>,
}

// ---------------------------------------------------------------------------------------------------------------
// Talking to the target.

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

/// The disposition of a write's HTTP status. LISTs read it too, with their own meaning of 404 and 410.
pub fn classify(code: u16) -> Disposition {
    match code {
        200..=299 => Disposition::Success,
        404 | 409 => Disposition::Skip,
        429 | 500 | 502 | 503 | 504 => Disposition::Retry,
        _ => Disposition::Fail,
    }
}

/// The delay before attempt `attempt + 1` after `attempt` failed (1-based): the server's Retry-After when it sent
/// one, else `base * 2^(attempt-1)` capped at `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration, retry_after: Option<Duration>) -> Duration {
    if let Some(ra) = retry_after {
        return ra.min(MAX_RETRY_AFTER);
    }
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(30));
    base.saturating_mul(factor).min(max)
}

/// A response read to the end.
struct Reply {
    code: u16,
    retry_after: Option<Duration>,
    body: Bytes,
}

impl Reply {
    /// `404 NotFound: <message>` from a Status body, or the start of whatever else the server sent.
    fn describe(&self) -> String {
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

fn truncate(s: &str, max: usize) -> String {
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
fn retry_after(headers: &axum::http::HeaderMap, body: &[u8]) -> Option<Duration> {
    let header =
        headers.get(axum::http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|s| s.trim().parse().ok());
    let details = || serde_json::from_slice::<serde_json::Value>(body).ok()?["details"]["retryAfterSeconds"].as_u64();
    header.or_else(details).map(Duration::from_secs)
}

struct Target {
    client: kube::Client,
    limiter: RateLimiter,
    config: SchedulerConfig,
}

impl Target {
    /// One request, rate limited and with a timeout; Err is a transport failure (retryable).
    async fn send_once(
        &self,
        method: &axum::http::Method,
        path: &str,
        body: &Option<Vec<u8>>,
    ) -> Result<Reply, String> {
        self.limiter.acquire().await;
        let mut req = axum::http::Request::builder()
            .method(method.clone())
            .uri(path)
            .header(axum::http::header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(axum::http::header::CONTENT_TYPE, "application/merge-patch+json");
        }
        let req = req.body(kube::client::Body::from(body.clone().unwrap_or_default())).map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = self.client.send(req).await.map_err(|e| e.to_string())?;
            let code = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.map_err(|e| format!("reading the response: {e}"))?.to_bytes();
            let retry_after = if classify(code) == Disposition::Retry { retry_after(&headers, &body) } else { None };
            Ok(Reply { code, retry_after, body })
        };
        match tokio::time::timeout(self.config.request_timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {:?}", self.config.request_timeout)),
        }
    }

    /// A request retried on transient errors. Ok is the final response (any non-retryable status, for the caller
    /// to interpret); Err says why it gave up after `max_attempts`.
    async fn send(&self, method: axum::http::Method, path: &str, body: Option<Vec<u8>>) -> Result<Reply, String> {
        let max = self.config.max_attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (why, ra) = match self.send_once(&method, path, &body).await {
                Ok(reply) if classify(reply.code) != Disposition::Retry => return Ok(reply),
                Ok(reply) => (reply.describe(), reply.retry_after),
                Err(e) => (e, None),
            };
            if attempt >= max {
                return Err(format!("gave up after {attempt} attempts: {why}"));
            }
            let delay = backoff(attempt, self.config.retry_base, self.config.retry_max, ra);
            tracing::debug!(%method, path, attempt, ?delay, error = %why, "retrying a request to the target");
            tokio::time::sleep(delay).await;
        }
    }
}

/// `/api/v1` or `/apis/<group>/<version>`.
fn group_version_path(gvr: &GroupVersionResource) -> String {
    if gvr.group.is_empty() {
        format!("/api/{}", gvr.version)
    } else {
        format!("/apis/{}/{}", gvr.group, gvr.version)
    }
}

/// Percent-encodes a path segment (names are DNS subdomains or path segment names; this is belt and braces).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Just what the migrator needs of a LIST: the objects' coordinates and the list metadata (a chunk of full objects
/// is never kept, only its body until parsed).
#[derive(Deserialize, Default)]
struct ListChunk {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<ItemRef>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
    #[serde(default)]
    remaining_item_count: Option<i64>,
}

#[derive(Deserialize)]
struct ItemRef {
    #[serde(default)]
    metadata: ItemMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ItemMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: String,
}

impl ItemMeta {
    fn display(&self) -> String {
        match self.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

enum Listed {
    Chunk(ListChunk),
    /// 410 Gone on an expired continue token: resume with the inconsistent token the server handed out.
    Expired(Option<String>),
}

/// How one object went.
enum Rewrite {
    Done,
    Skipped,
}

/// One resource of the target, as a migration sees it.
struct Migrating<'a> {
    target: &'a Target,
    gvr: &'a GroupVersionResource,
    /// `shootstates.core.gardener.cloud` for messages.
    qualified: String,
}

impl Migrating<'_> {
    async fn list(&self, token: Option<&str>) -> Result<Listed, String> {
        let mut path = format!(
            "{}/{}?limit={}",
            group_version_path(self.gvr),
            segment(&self.gvr.resource),
            self.target.config.chunk_size
        );
        if let Some(t) = token.filter(|t| !t.is_empty()) {
            path.push_str("&continue=");
            path.extend(form_urlencoded::byte_serialize(t.as_bytes()));
        }
        let reply = self
            .target
            .send(axum::http::Method::GET, &path, None)
            .await
            .map_err(|e| format!("LIST {}: {e}", self.qualified))?;
        match reply.code {
            200..=299 => serde_json::from_slice::<ListChunk>(&reply.body)
                .map(Listed::Chunk)
                .map_err(|e| format!("LIST {}: decoding the response: {e}", self.qualified)),
            410 => {
                let meta = serde_json::from_slice::<ListChunk>(&reply.body).unwrap_or_default().metadata;
                Ok(Listed::Expired(meta.continue_token.filter(|t| !t.is_empty())))
            }
            404 => Err(format!(
                "LIST {}: {} (the target does not serve {} in {})",
                self.qualified,
                reply.describe(),
                self.gvr.resource,
                group_version_path(self.gvr).trim_start_matches('/'),
            )),
            _ => Err(format!("LIST {}: {}", self.qualified, reply.describe())),
        }
    }

    async fn rewrite(&self, item: &ItemMeta) -> Result<Rewrite, String> {
        let ns = match item.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("/namespaces/{}", segment(ns)),
            None => String::new(),
        };
        let path =
            format!("{}{ns}/{}/{}", group_version_path(self.gvr), segment(&self.gvr.resource), segment(&item.name));
        let body = serde_json::json!({"metadata": {"resourceVersion": item.resource_version}}).to_string().into_bytes();
        let what = || format!("{} {:?}", self.qualified, item.display());
        let reply = self
            .target
            .send(axum::http::Method::PATCH, &path, Some(body))
            .await
            .map_err(|e| format!("rewriting {}: {e}", what()))?;
        match classify(reply.code) {
            Disposition::Success => Ok(Rewrite::Done),
            Disposition::Skip => {
                tracing::debug!(object = %item.display(), code = reply.code, "skipped: deleted or rewritten meanwhile");
                Ok(Rewrite::Skipped)
            }
            _ => Err(format!("rewriting {}: {}", what(), reply.describe())),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// One migration.

fn is_finished(svm: &StorageVersionMigration) -> bool {
    svm.is_true(CONDITION_SUCCEEDED) || svm.is_true(CONDITION_FAILED)
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Sets (adds or replaces) a condition.
fn set_condition(svm: &mut StorageVersionMigration, type_: &str, status: bool, reason: &str, message: String) {
    let conditions = &mut svm.status.get_or_insert_with(Default::default).conditions;
    let c = MigrationCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_update_time: Some(now()),
        reason: Some(reason.to_string()),
        message: Some(message),
    };
    match conditions.iter_mut().find(|x| x.type_ == type_) {
        Some(x) => *x = c,
        None => conditions.push(c),
    }
}

/// Why a migration stopped without an outcome of ours.
#[derive(Debug)]
enum Stop {
    /// Deleted meanwhile.
    Gone,
    /// Finished by someone else (superseded by the trigger).
    FinishedElsewhere(&'static str),
    /// Interrupted by the scheduler (the migration was finished or deleted elsewhere, or the scheduler stopped).
    Cancelled,
    /// Our own API kept failing: the scheduler resumes it from the saved token later.
    OwnApi(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Gone => write!(f, "deleted"),
            Stop::FinishedElsewhere(phase) => write!(f, "{phase} elsewhere"),
            Stop::Cancelled => write!(f, "interrupted by the scheduler"),
            Stop::OwnApi(e) => write!(f, "cannot save its state: {e}"),
        }
    }
}

struct Worker {
    ctx: Arc<Ctx>,
    name: String,
    /// The latest copy we read or wrote (its resourceVersion is the CAS precondition of the next save).
    svm: StorageVersionMigration,
    cancel: watch::Receiver<bool>,
}

fn cancelled(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow() || rx.has_changed().is_err()
}

async fn until_cancelled(rx: &mut watch::Receiver<bool>) {
    // A dropped sender (the scheduler is gone) cancels too.
    let _ = rx.wait_for(|c| *c).await;
}

impl Worker {
    /// Saves `edit` applied to the latest copy, through the main resource (`status` false) or /status. On a
    /// conflict, re-reads: a migration finished or deleted meanwhile is left alone, anything else gets the edit
    /// again.
    async fn save(&mut self, status: bool, edit: impl Fn(&mut StorageVersionMigration)) -> Result<(), Stop> {
        let mut failures = 0;
        loop {
            let mut next = self.svm.clone();
            edit(&mut next);
            let res = if status { self.ctx.own.update_status(&next).await } else { self.ctx.own.update(&next).await };
            let err = match res {
                Ok(saved) => {
                    self.svm = saved;
                    return Ok(());
                }
                Err(e) if e.code == 409 => match self.ctx.own.get::<StorageVersionMigration>(None, &self.name).await {
                    Ok(None) => return Err(Stop::Gone),
                    Ok(Some(fresh)) if is_finished(&fresh) => return Err(Stop::FinishedElsewhere(fresh.phase())),
                    Ok(Some(fresh)) => {
                        self.svm = fresh;
                        continue;
                    }
                    Err(e) => e,
                },
                Err(e) if e.code == 404 => return Err(Stop::Gone),
                Err(e) => e,
            };
            failures += 1;
            if failures >= SAVE_ATTEMPTS {
                return Err(Stop::OwnApi(err.to_string()));
            }
            tracing::warn!(migration = %self.name, error = %err, "saving the migration failed; retrying");
            tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
        }
    }

    async fn run(mut self) {
        let gvr = self.svm.spec.resource.clone();
        let label = resource_label(&gvr);
        let started = std::time::Instant::now();
        let outcome = self.migrate(&gvr, &label).await;
        let migrated = self.svm.status.as_ref().and_then(|s| s.migrated_objects).unwrap_or(0);
        let stop = match outcome {
            Ok(Ok(total)) => {
                let message = format!("Migrated {total} objects of {}.", gvr.display());
                let r = self
                    .save(true, |s| {
                        set_condition(s, CONDITION_RUNNING, false, REASON_COMPLETED, message.clone());
                        set_condition(s, CONDITION_SUCCEEDED, true, REASON_COMPLETED, message.clone());
                        let st = s.status.get_or_insert_with(Default::default);
                        st.migrated_objects = Some(total);
                        st.remaining_objects_estimate = Some(0);
                    })
                    .await;
                if r.is_ok() {
                    self.ctx.metrics.observe_remaining(&label, 0);
                    self.ctx.metrics.observe_finished(&label, CONDITION_SUCCEEDED);
                    tracing::info!(migration = %self.name, resource = %gvr.display(), objects = total,
                        seconds = started.elapsed().as_secs_f64(), "migration succeeded");
                }
                r.err()
            }
            Ok(Err(failure)) => {
                let message = truncate(&failure, 32000);
                let r = self
                    .save(true, |s| {
                        set_condition(s, CONDITION_RUNNING, false, REASON_FAILED, message.clone());
                        set_condition(s, CONDITION_FAILED, true, REASON_FAILED, message.clone());
                    })
                    .await;
                if r.is_ok() {
                    self.ctx.metrics.observe_finished(&label, CONDITION_FAILED);
                    tracing::warn!(migration = %self.name, resource = %gvr.display(), migrated, error = %failure,
                        "migration failed");
                }
                r.err()
            }
            Err(stop) => Some(stop),
        };
        match stop {
            None => {}
            Some(stop @ Stop::OwnApi(_)) => {
                tracing::warn!(migration = %self.name, resource = %gvr.display(), migrated, reason = %stop,
                    "migration interrupted; it resumes from its saved token")
            }
            Some(stop) => tracing::info!(migration = %self.name, resource = %gvr.display(), migrated, reason = %stop,
                "migration stopped"),
        }
    }

    /// Runs the migration to its end. Ok(Ok(n)): every object handled (n in total); Ok(Err(message)): it failed.
    async fn migrate(&mut self, gvr: &GroupVersionResource, label: &str) -> Result<Result<i64, String>, Stop> {
        if is_finished(&self.svm) {
            return Err(Stop::FinishedElsewhere(self.svm.phase()));
        }
        let token = self.svm.spec.continue_token.clone().filter(|t| !t.is_empty());
        if self.svm.is_true(CONDITION_RUNNING) {
            tracing::info!(migration = %self.name, resource = %gvr.display(), resumed_from_token = token.is_some(),
                "migration resumed");
        } else {
            let message = format!("Migrating {}.", gvr.display());
            self.save(true, |s| set_condition(s, CONDITION_RUNNING, true, REASON_MIGRATING, message.clone())).await?;
            tracing::info!(migration = %self.name, resource = %gvr.display(), "migration started");
        }
        let ctx = self.ctx.clone();
        let m = Migrating { target: &ctx.target, gvr, qualified: crate::error::qualified(&gvr.resource, &gvr.group) };
        let mut migrated = self.svm.status.as_ref().and_then(|s| s.migrated_objects).unwrap_or(0);
        let mut cancel = self.cancel.clone();
        // A pipeline, so that the target always has work: up to WRITE_PARALLELISM writes in flight, and the next
        // chunk is listed while the current one is written. Chunks complete in order; a chunk's next token is saved
        // only when it and every chunk before it are done.
        let mut chunks: VecDeque<Chunk> = VecDeque::new();
        let mut next_seq = 0u64;
        // The token to list next; None after the last chunk was listed.
        let mut to_list: Option<Option<String>> = Some(token);
        let mut listing: Option<BoxFuture<'_, Result<Listed, String>>> = None;
        let mut expired_in_a_row = 0;
        let mut in_flight: FuturesUnordered<BoxFuture<'_, (u64, Result<Rewrite, String>)>> = FuturesUnordered::new();
        loop {
            if cancelled(&cancel) {
                return Err(Stop::Cancelled);
            }
            // Completed chunks, oldest first: progress and token are saved.
            while chunks.front().is_some_and(|c| c.todo.len() == 0 && c.outstanding == 0) {
                let Some(c) = chunks.pop_front() else { break };
                migrated += c.len as i64;
                ctx.metrics.observe_remaining(label, if c.next.is_some() { c.remaining.unwrap_or(0) } else { 0 });
                tracing::debug!(migration = %self.name, done = c.done, skipped = c.skipped, migrated,
                    remaining = ?c.remaining, more = c.next.is_some(), "chunk migrated");
                let Some(next) = c.next else { return Ok(Ok(migrated)) };
                self.save(false, |s| s.spec.continue_token = Some(next.clone())).await?;
                self.save(true, |s| {
                    let st = s.status.get_or_insert_with(Default::default);
                    st.migrated_objects = Some(migrated);
                    st.remaining_objects_estimate = c.remaining;
                })
                .await?;
            }
            // List ahead: at most the chunk being written and the next one are held.
            if listing.is_none() && chunks.len() < 2 {
                if let Some(token) = to_list.take() {
                    let m = &m;
                    listing = Some(Box::pin(async move { m.list(token.as_deref()).await }));
                }
            }
            // Keep the writes going.
            while in_flight.len() < WRITE_PARALLELISM {
                let Some(c) = chunks.iter_mut().find(|c| c.todo.len() > 0) else { break };
                let Some(item) = c.todo.next() else { break };
                c.outstanding += 1;
                let (seq, m) = (c.seq, &m);
                in_flight.push(Box::pin(async move { (seq, m.rewrite(&item.metadata).await) }));
            }
            if listing.is_none() && in_flight.is_empty() {
                // Nothing is left to list or to write, yet no chunk ended the migration: cannot happen.
                return Ok(Err(format!("LIST {}: the list ended without a final chunk", m.qualified)));
            }
            tokio::select! {
                Some((seq, r)) = in_flight.next(), if !in_flight.is_empty() => {
                    let Some(c) = chunks.iter_mut().find(|c| c.seq == seq) else { continue };
                    c.outstanding -= 1;
                    match r {
                        Ok(Rewrite::Done) => c.done += 1,
                        Ok(Rewrite::Skipped) => c.skipped += 1,
                        // Returning drops (cancels) the writes still in flight.
                        Err(failure) => return Ok(Err(failure)),
                    }
                    ctx.metrics.observe_migrated(label, 1);
                }
                Some(r) = async { Some(listing.as_mut()?.await) }, if listing.is_some() => {
                    listing = None;
                    match r {
                        Ok(Listed::Chunk(list)) => {
                            expired_in_a_row = 0;
                            let next = list.metadata.continue_token.filter(|t| !t.is_empty());
                            if next.is_some() {
                                to_list = Some(next.clone());
                            }
                            chunks.push_back(Chunk {
                                seq: next_seq,
                                len: list.items.len(),
                                todo: list.items.into_iter(),
                                outstanding: 0,
                                done: 0,
                                skipped: 0,
                                next,
                                remaining: list.metadata.remaining_item_count.map(|n| n.max(0)),
                            });
                            next_seq += 1;
                        }
                        Ok(Listed::Expired(next)) => {
                            expired_in_a_row += 1;
                            if expired_in_a_row >= ctx.target.config.max_attempts.max(1) {
                                return Ok(Err(format!(
                                    "LIST {}: the continue token expired {expired_in_a_row} times in a row",
                                    m.qualified
                                )));
                            }
                            tracing::info!(migration = %self.name, restart = next.is_none(),
                                "continue token expired (410): resuming with the inconsistent continue token");
                            // Without a token from the server, starting over is safe: rewriting twice is harmless.
                            to_list = Some(next);
                        }
                        Err(failure) => return Ok(Err(failure)),
                    }
                }
                _ = until_cancelled(&mut cancel) => return Err(Stop::Cancelled),
            }
        }
    }
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A listed chunk on its way through the pipeline.
struct Chunk {
    seq: u64,
    len: usize,
    /// Objects not yet handed to a writer.
    todo: std::vec::IntoIter<ItemRef>,
    /// Writes in flight.
    outstanding: usize,
    done: u64,
    skipped: u64,
    /// Where the list continues after this chunk; None for the last one.
    next: Option<String>,
    remaining: Option<i64>,
}

// ---------------------------------------------------------------------------------------------------------------
// The scheduler: which migrations run.

struct Running {
    cancel: watch::Sender<bool>,
    task: AbortHandle,
}

struct Scheduler {
    ctx: Arc<Ctx>,
    running: HashMap<String, Running>,
    /// Dropped with the scheduler (a replica losing leadership aborts it): the workers go too.
    workers: JoinSet<()>,
}

/// Wakes the scheduler on every change of a storageversionmigration, so new ones start without waiting for the
/// next scan.
async fn watch_migrations(own: OwnApi, wake: Arc<Notify>) {
    let info = <StorageVersionMigration as crate::registry::strategy::Kind>::info();
    let version = info.versions[0];
    loop {
        if let Some(resource) = own.registry().resource(info.group, version, info.plural) {
            let params = WatchParams { send_initial_events: Some(false), ..Default::default() };
            match resource.watch(None, version, params).await {
                Ok(mut rx) => {
                    while let Some(ev) = rx.recv().await {
                        if let WatchOut::Error(e) = ev {
                            tracing::debug!(error = %e, "storageversionmigrations watch ended");
                            break;
                        }
                        wake.notify_one();
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot watch storageversionmigrations"),
            }
        }
        wake.notify_one();
        tokio::time::sleep(RESCAN).await;
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Scheduler {
    async fn run(mut self) {
        let c = &self.ctx.target.config;
        tracing::info!(
            qps = c.qps,
            burst = c.burst,
            chunk_size = c.chunk_size,
            concurrency = c.concurrency,
            max_attempts = c.max_attempts,
            "migrator started"
        );
        let wake = Arc::new(Notify::new());
        let _watch = AbortOnDrop(tokio::spawn(watch_migrations(self.ctx.own.clone(), wake.clone())).abort_handle());
        loop {
            self.reconcile().await;
            tokio::select! {
                _ = wake.notified() => {}
                Some(_) = self.workers.join_next(), if !self.workers.is_empty() => {}
                _ = tokio::time::sleep(RESCAN) => {}
            }
            self.running.retain(|_, r| !r.task.is_finished());
        }
    }

    async fn reconcile(&mut self) {
        self.running.retain(|_, r| !r.task.is_finished());
        let all = match self.ctx.own.list::<StorageVersionMigration>(None, "").await {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list storageversionmigrations");
                return;
            }
        };
        let name = |s: &StorageVersionMigration| s.metadata.name.clone().unwrap_or_default();
        // Interrupt work on migrations finished or deleted elsewhere.
        for (n, r) in &self.running {
            if !all.iter().any(|s| name(s) == *n && !is_finished(s)) {
                let _ = r.cancel.send(true);
            }
        }
        let mut queue: Vec<&StorageVersionMigration> =
            all.iter().filter(|s| !is_finished(s) && !self.running.contains_key(&name(s))).collect();
        queue.sort_by(|a, b| {
            (!a.is_true(CONDITION_RUNNING), &a.metadata.creation_timestamp, &a.metadata.name).cmp(&(
                !b.is_true(CONDITION_RUNNING),
                &b.metadata.creation_timestamp,
                &b.metadata.name,
            ))
        });
        let mut pending: BTreeMap<String, i64> = BTreeMap::new();
        for svm in queue {
            if self.running.len() < self.ctx.target.config.concurrency.max(1) {
                self.start(svm.clone());
            } else {
                *pending.entry(resource_label(&svm.spec.resource)).or_default() += 1;
            }
        }
        let mut running_now: BTreeMap<String, i64> = BTreeMap::new();
        for svm in all.iter().filter(|s| self.running.contains_key(&name(s))) {
            *running_now.entry(resource_label(&svm.spec.resource)).or_default() += 1;
        }
        self.ctx.metrics.set_queue(&pending, &running_now);
    }

    fn start(&mut self, svm: StorageVersionMigration) {
        let name = svm.metadata.name.clone().unwrap_or_default();
        let (tx, rx) = watch::channel(false);
        let worker = Worker { ctx: self.ctx.clone(), name: name.clone(), svm, cancel: rx };
        let task = self.workers.spawn(worker.run());
        self.running.insert(name, Running { cancel: tx, task });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_of_responses() {
        for code in [200, 201] {
            assert_eq!(classify(code), Disposition::Success);
        }
        for code in [404, 409] {
            assert_eq!(classify(code), Disposition::Skip, "{code}");
        }
        for code in [429, 500, 502, 503, 504] {
            assert_eq!(classify(code), Disposition::Retry, "{code}");
        }
        for code in [400, 401, 403, 405, 410, 413, 415, 422, 501] {
            assert_eq!(classify(code), Disposition::Fail, "{code}");
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let delays: Vec<_> = (1..=7).map(|a| backoff(a, base, max, None)).collect();
        assert_eq!(delays.iter().map(|d| d.as_millis()).collect::<Vec<_>>(), [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff(1, base, max, Some(Duration::from_secs(5))), Duration::from_secs(5));
        assert_eq!(backoff(40, base, max, None), max);
        assert_eq!(backoff(1, base, max, Some(Duration::from_secs(86_400))), MAX_RETRY_AFTER);
    }

    #[test]
    fn retry_after_from_header_or_status_details() {
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(retry_after(&h, b""), None);
        let status = br#"{"kind":"Status","code":429,"details":{"retryAfterSeconds":3}}"#;
        assert_eq!(retry_after(&h, status), Some(Duration::from_secs(3)));
        h.insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        assert_eq!(retry_after(&h, status), Some(Duration::from_secs(1)));
    }

    #[test]
    fn paths_and_messages() {
        let core = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "secrets".into() };
        assert_eq!(group_version_path(&core), "/api/v1");
        let apps = GroupVersionResource { group: "apps".into(), version: "v1".into(), resource: "deployments".into() };
        assert_eq!(group_version_path(&apps), "/apis/apps/v1");
        assert_eq!(segment("system:node/x y"), "system:node%2Fx%20y");
        let r = Reply {
            code: 403,
            retry_after: None,
            body: Bytes::from_static(br#"{"kind":"Status","code":403,"message":"denied by webhook"}"#),
        };
        assert_eq!(r.describe(), "403 Forbidden: denied by webhook");
        assert_eq!(truncate("ééé", 3), "é...");
    }
}

//! Talking to the target: its responses, retries and the chunked LIST and no-op writes of one migration.

use super::*;
use crate::api::storage_version_migration::GroupVersionResource;
use crate::scheduler::ratelimit::RateLimiter;
use crate::scheduler::SchedulerConfig;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Deserialize;
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
pub(super) struct Reply {
    pub(super) code: u16,
    pub(super) retry_after: Option<Duration>,
    pub(super) body: Bytes,
}

impl Reply {
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
    pub(super) limiter: RateLimiter,
    pub(super) config: SchedulerConfig,
}

impl Target {
    /// One request, rate limited and with a timeout; Err is a transport failure (retryable).
    pub(super) async fn send_once(
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
    pub(super) async fn send(
        &self,
        method: axum::http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Reply, String> {
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
pub(super) fn group_version_path(gvr: &GroupVersionResource) -> String {
    if gvr.group.is_empty() {
        format!("/api/{}", gvr.version)
    } else {
        format!("/apis/{}/{}", gvr.group, gvr.version)
    }
}

/// Percent-encodes a path segment (names are DNS subdomains or path segment names; this is belt and braces).
pub(super) fn segment(s: &str) -> String {
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
pub(super) struct ListChunk {
    #[serde(default)]
    pub(super) metadata: ListMeta,
    #[serde(default)]
    pub(super) items: Vec<ItemRef>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListMeta {
    #[serde(default, rename = "continue")]
    pub(super) continue_token: Option<String>,
    #[serde(default)]
    pub(super) remaining_item_count: Option<i64>,
}

#[derive(Deserialize)]
pub(super) struct ItemRef {
    #[serde(default)]
    pub(super) metadata: ItemMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct ItemMeta {
    #[serde(default)]
    pub(super) name: String,
    #[serde(default)]
    pub(super) namespace: Option<String>,
    #[serde(default)]
    pub(super) resource_version: String,
}

impl ItemMeta {
    pub(super) fn display(&self) -> String {
        match self.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
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
}

impl Migrating<'_> {
    pub(super) async fn list(&self, token: Option<&str>) -> Result<Listed, String> {
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

    pub(super) async fn rewrite(&self, item: &ItemMeta) -> Result<Rewrite, String> {
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

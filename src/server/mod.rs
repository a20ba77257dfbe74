//! The HTTP surface: routing, discovery, OpenAPI, health, metrics and authentication around the REST handlers.

pub mod admission;
pub mod admission_review;
pub mod audit;
mod backup;
pub mod cert_metrics;
pub mod cluster_check;
pub mod crd;
pub mod csi_admission;
pub mod discovery;
pub mod encryption_reload;
pub mod exposition;
pub mod inflight;
pub mod latency;
pub mod manifests;
pub mod metrics;
mod namespaces;
pub mod negotiate;
pub mod openapi;
pub mod protobuf;
pub mod query;
mod render;
pub mod rest;
pub mod roles;
mod self_review;
pub mod serve;
pub mod table;
mod watch;
mod write_options;

use crate::auth::authn::{Authenticator, PeerCertificates, UserInfo};
use crate::auth::authz::{forbidden, AuthorizationMode, Authorizer, Decision, RequestAttributes};
use crate::auth::impersonation::{self, Impersonation};
use crate::error::{ApiError, ApiResult, StatusReason};
use crate::registry::Registry;
use crate::request_info::RequestInfo;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use discovery::{aggregated_version, Discovery, DiscoveryFormat};
use metrics::{Label, LatencyLabelSet, Metrics};
use openapi::OpenApi;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct AppState {
    pub registry: Arc<Registry>,
    pub discovery: Discovery,
    pub openapi: OpenApi,
    pub authn: Arc<Authenticator>,
    /// Decides what authenticated users may do; only `system:masters` until [`AppState::with_authorizer`].
    pub authz: Arc<Authorizer>,
    pub metrics: Arc<Metrics>,
    pub bookmark_interval: Duration,
    pub ready: AtomicBool,
    /// Feature gates and CSIDriver lookup of the CSI migration webhooks.
    pub csi_migration: Arc<csi_admission::CsiMigration>,
    /// The audit policy and backend (`--audit-*`); off until [`AppState::with_auditor`].
    pub audit: Arc<crate::audit::Auditor>,
    /// Set once the namespaces of objects stored before namespaces were served exist (see [`namespaces`]).
    namespaces_in_use: tokio::sync::OnceCell<()>,
    /// The encryption config in use, whose KMS v2 providers make the `kms-providers` health check.
    pub encryption: Option<crate::storage::encryption::EncryptionConfigHandle>,
    /// Snapshots of the embedded store (`POST /storage/snapshots`); unset on etcd.
    pub backups: std::sync::OnceLock<Arc<crate::storage::backup::Backups>>,
    /// `--max-requests-inflight` and `--max-mutating-requests-inflight`.
    pub inflight: Arc<inflight::InflightLimits>,
}

impl AppState {
    /// The server state over `registry`'s resources. Standalone (no cluster authenticates for us, so no
    /// kube-apiserver stands in front), the server is all the API its clients have, and it also serves the core
    /// group's namespaces (kubectl asks for them, and a `kind: List` file maps only where the core group `v1` is
    /// served) and events, in the core group and in events.k8s.io (recorders write them, `kubectl describe` reads
    /// them). Behind kube-apiserver's aggregator the core group is kube-apiserver's and none of it is served here.
    pub fn new(
        registry: Arc<Registry>,
        authn: Arc<Authenticator>,
        metrics: Arc<Metrics>,
        bookmark_interval: Duration,
    ) -> Self {
        let registry = match authn.delegates() {
            true => registry,
            false => Arc::new(registry.with_resources(crate::api::standalone_kinds())),
        };
        let kinds: Vec<_> = registry.resources.iter().map(|r| r.strategy.clone()).collect();
        AppState {
            discovery: Discovery::build(&kinds),
            openapi: OpenApi::build(&kinds),
            registry,
            authn,
            authz: Arc::new(Authorizer::new(AuthorizationMode::MastersOnly)),
            metrics,
            bookmark_interval,
            ready: AtomicBool::new(true),
            csi_migration: Arc::default(),
            audit: Arc::new(crate::audit::Auditor::disabled(Arc::default())),
            namespaces_in_use: tokio::sync::OnceCell::new(),
            encryption: None,
            backups: std::sync::OnceLock::new(),
            inflight: Arc::default(),
        }
    }
}

impl AppState {
    pub fn with_authorizer(mut self, authz: Arc<Authorizer>) -> Self {
        self.authz = authz;
        self
    }

    /// Audits requests with `auditor`, whose metrics this server then serves.
    pub fn with_auditor(mut self, auditor: Arc<crate::audit::Auditor>) -> Self {
        auditor.metrics.register(&mut self.metrics.registry.lock().unwrap_or_else(|p| p.into_inner()));
        self.audit = auditor;
        self
    }

    /// The `kms-providers` check of /healthz and /readyz follows the KMS v2 providers of `encryption`'s config.
    pub fn with_encryption(mut self, encryption: Option<crate::storage::encryption::EncryptionConfigHandle>) -> Self {
        self.encryption = encryption;
        self
    }

    /// Limits of the requests in flight other than the defaults (kube-apiserver's 400 and 200).
    pub fn with_inflight(mut self, limits: inflight::InflightLimits) -> Self {
        self.inflight = Arc::new(limits);
        self
    }

    pub fn with_csi_migration(mut self, csi: csi_admission::CsiMigration) -> Self {
        self.csi_migration = Arc::new(csi);
        self
    }

    /// Standalone, where this server serves events: they expire `ttl` after their last write (`--event-ttl`), as
    /// kube-apiserver's do. Both groups' events are the core group's stored objects.
    pub fn with_event_ttl(self, ttl: Duration) -> Self {
        if let Some(events) = self.registry.resource("", "v1", "events") {
            crate::registry::expiry::spawn(self.registry.storage.clone(), events.prefix(None), ttl);
        }
        self
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(health))
        .route("/readyz", get(ready))
        .route("/healthz/{check}", get(healthz_check))
        .route("/livez/{check}", get(health))
        .route("/readyz/{check}", get(ready_check))
        .route("/version", get(version))
        .route("/metrics", get(metrics_handler))
        .route("/storage/snapshots", axum::routing::post(backup::take_snapshot))
        .route("/openapi/v2", get(openapi::http::openapi_v2))
        .route("/openapi/v3", get(openapi::http::openapi_v3_root))
        .route("/openapi/v3/{*gv}", get(openapi::http::openapi_v3))
        .merge(admission::routes())
        .merge(csi_admission::routes())
        .fallback(rest::handle)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), authenticate_and_measure))
        // Auditing sees the panics before `answer_panics` answers them, and the Audit-ID is on every answer.
        .layer(axum::middleware::from_fn_with_state(state.audit.clone(), audit::audit))
        .layer(axum::middleware::from_fn(answer_panics))
        .layer(axum::middleware::from_fn(audit::audit_id))
        .layer(axum::middleware::map_response(default_cache_control))
        .with_state(state)
}

/// Every answer is private to the authenticated user and must be revalidated, unless its handler says otherwise
/// (the OpenAPI hash URLs): kube-apiserver's WithCacheControl.
async fn default_cache_control(mut resp: Response) -> Response {
    resp.headers_mut()
        .entry(axum::http::header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-cache, private"));
    resp
}

/// A method a fixed path does not serve (a GET-only endpoint asked with POST, the webhooks asked with GET): a
/// `Status`, as every error this server answers.
async fn method_not_allowed() -> Response {
    ApiError::new(StatusReason::MethodNotAllowed, "the server does not allow this method on the requested resource")
        .into_response()
}

/// A request whose handler panics still gets its answer, a 500 `Status`, and the panic is logged with the request
/// it happened on; the worker thread and the connection's other requests carry on.
async fn answer_panics(req: Request, next: Next) -> Response {
    use futures::FutureExt;
    let (method, uri) = (req.method().clone(), req.uri().clone());
    match std::panic::AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(resp) => resp,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            tracing::error!(%method, %uri, panic = %what, "request handler panicked");
            ApiError::internal("the server could not complete the request").into_response()
        }
    }
}

/// Paths served to anyone, like kube-apiserver's system:public-info-viewer.
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
        || path.starts_with("/healthz/")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
}

async fn authenticate_and_measure(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let dry_run = metrics::dry_run_label(req.uri().query());
    // Parsed once: authorization, the REST handlers and their metrics labels all read this.
    let info = RequestInfo::parse(req.method(), req.uri().path(), req.uri().query());
    req.extensions_mut().insert(info);
    let internal = req.extensions().get::<crate::client::InternalIdentity>().is_some();
    let mut resp = authenticate_and_authorize(&st, req, next).await;
    let labels = resp.extensions_mut().remove::<rest::RequestLabels>().unwrap_or_default();
    let verb: Label = match labels.verb {
        "" => static_method(&method).map_or_else(|| Label::Owned(method.as_str().to_string()), Label::Borrowed),
        verb => Label::Borrowed(verb),
    };
    let owned = |s: String| if s.is_empty() { Label::Borrowed("") } else { Label::Owned(s) };
    let request = LatencyLabelSet {
        verb,
        dry_run,
        group: owned(labels.group),
        version: owned(labels.version),
        resource: owned(labels.resource),
        subresource: owned(labels.subresource),
        scope: Label::Borrowed(labels.scope),
        component: Label::Borrowed("apiserver"),
    };
    let elapsed = (request.verb != "WATCH").then(|| start.elapsed());
    st.metrics.record(request, code_label(resp.status()), elapsed);
    if let (Some(elapsed), false) = (elapsed, internal) {
        st.metrics.clients.observe(elapsed);
    }
    resp
}

/// The name of a standard HTTP method, as a static string.
fn static_method(method: &Method) -> Option<&'static str> {
    ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"].into_iter().find(|m| *m == method.as_str())
}

/// An HTTP status code as a label, static for the codes this server answers with.
fn code_label(code: StatusCode) -> Label {
    const CODES: [&str; 17] = [
        "200", "201", "202", "204", "301", "304", "400", "401", "403", "404", "405", "406", "409", "410", "413", "415",
        "422",
    ];
    match CODES.into_iter().find(|c| *c == code.as_str()) {
        Some(c) => Label::Borrowed(c),
        None => Label::Owned(code.as_str().to_string()),
    }
}

/// Authentication (401 without a valid credential), then impersonation (400, 403), then authorization (403 when
/// denied), then the handler, which finds the [`UserInfo`] in the request extensions. The front-proxy identity
/// headers never reach a handler, nor do the impersonation headers.
async fn authenticate_and_authorize(st: &AppState, mut req: Request, next: Next) -> Response {
    // The scheduler's in-process client carries its identity as an extension, which no network client can set.
    let internal = req.extensions().get::<crate::client::InternalIdentity>().map(|i| i.0.clone());
    let user: Option<UserInfo> = match internal.clone() {
        Some(user) => Some(user),
        None => st.authn.authenticate_request(req.extensions().get::<PeerCertificates>(), req.headers()).await,
    };
    st.authn.strip_request_headers(req.headers_mut());
    let public = is_public(req.uri().path());
    let Some(user) = user else {
        impersonation::strip_headers(req.headers_mut());
        if !public {
            audit::authentication_failed(&req);
            return ApiError::unauthorized().into_response();
        }
        // Audited as kube-apiserver's anonymous user; the public paths need no authorizer.
        if let Some(rejected) = audit::request_received(&mut req, &audit::anonymous()) {
            return rejected;
        }
        audit::authorized(&req, "");
        return next.run(req).await;
    };
    // Audited as the user who sent it: upstream's WithAudit runs before WithImpersonation, whose user the later
    // stages record as `impersonatedUser`.
    if let Some(rejected) = audit::request_received(&mut req, &user) {
        return rejected;
    }
    // The scheduler's in-process requests act as themselves (they send no impersonation headers).
    let user = match internal {
        Some(_) => user,
        None => match impersonate(st, user, &mut req).await {
            Ok(user) => user,
            Err(e) => return e.into_response(),
        },
    };
    // Between impersonation and authorization, as upstream's max-in-flight filter: the user it counts is the one
    // the request acts as. The scheduler's own requests are not counted.
    let seats = match internal {
        Some(_) => None,
        None => match inflight::admit(st, req.extensions().get(), req.method(), req.uri(), &user).await {
            Ok(seats) => seats,
            Err(rejected) => return *rejected,
        },
    };
    if public || internal.is_some() {
        audit::authorized(&req, "");
    } else {
        let attrs = match req.extensions().get::<RequestInfo>() {
            Some(info) => RequestAttributes::from_info(info),
            None => RequestAttributes::from_request(req.method(), req.uri().path(), req.uri().query()),
        };
        match st.authz.authorize(&user, &attrs).await {
            Ok(Decision::Allow) => audit::authorized(&req, ""),
            Ok(Decision::Deny { reason }) => {
                tracing::debug!(user = %user.name, verb = %attrs.verb, path = %attrs.path, "forbidden");
                audit::forbidden(&req, &reason);
                return forbidden(&user, &attrs, &reason).into_response();
            }
            Err(e) => {
                tracing::warn!(error = %e, user = %user.name, path = %attrs.path, "authorization failed");
                audit::authorization_error(&req);
                return ApiError::internal(e.to_string()).into_response();
            }
        }
    }
    req.extensions_mut().insert(user);
    let resp = next.run(req).await;
    match seats {
        Some(seats) => inflight::holding(resp, seats),
        None => resp,
    }
}

/// k8s.io/apiserver's WithImpersonation between authentication and authorization: the user the request acts as,
/// and, when it impersonates, both users as the request's [`Impersonation`] extension (for the audit log). The
/// impersonation headers never reach what comes after.
async fn impersonate(st: &AppState, user: UserInfo, req: &mut Request) -> ApiResult<UserInfo> {
    let impersonated = impersonation::impersonate(&st.authz, &user, req.headers()).await;
    impersonation::strip_headers(req.headers_mut());
    let Some(impersonated) = impersonated? else { return Ok(user) };
    req.extensions_mut().insert(crate::audit::ImpersonatedUser(impersonated.clone()));
    req.extensions_mut().insert(Impersonation { original: user, impersonated: impersonated.clone() });
    Ok(impersonated)
}

async fn health() -> &'static str {
    "ok"
}

/// kube-apiserver's `kms-providers` check, when the config in use has KMS v2 providers: `None` when there is none.
async fn kms_providers(st: &AppState) -> Option<Result<(), String>> {
    let config = st.encryption.as_ref()?.current();
    match config.has_kms() {
        true => Some(config.check_kms().await),
        false => None,
    }
}

/// A failed check as k8s.io/apiserver's healthz handler answers the whole endpoint (`[-]<name> failed: reason
/// withheld`, then `<endpoint> check failed`), with 500.
fn failed_checks(endpoint: &str, passed: &[&str], failed: &str) -> Response {
    let mut body = String::new();
    for p in passed {
        body += &format!("[+]{p} ok\n");
    }
    body += &format!("[-]{failed} failed: reason withheld\n{endpoint} check failed");
    (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
}

/// One named check (`/healthz/kms-providers`): `ok`, or 500 with `internal server error: <error>`, as upstream.
/// Other names answer `ok`, as before there were checks here.
async fn single_check(st: &AppState, check: &str) -> Response {
    if check != "kms-providers" {
        return "ok".into_response();
    }
    match kms_providers(st).await {
        Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {e}\n")).into_response(),
        _ => "ok".into_response(),
    }
}

/// /healthz: the `kms-providers` check (not on /livez: kube-apiserver removed it there in 1.29).
async fn healthz(State(st): State<Arc<AppState>>) -> Response {
    match kms_providers(&st).await {
        Some(Err(e)) => {
            tracing::warn!(error = %e, "healthz: kms-providers check failed");
            failed_checks("healthz", &["ping"], "kms-providers")
        }
        _ => "ok".into_response(),
    }
}

async fn healthz_check(State(st): State<Arc<AppState>>, Path(check): Path<String>) -> Response {
    single_check(&st, &check).await
}

async fn ready_check(State(st): State<Arc<AppState>>, Path(check): Path<String>) -> Response {
    match check.as_str() {
        "kms-providers" => single_check(&st, &check).await,
        _ => ready(State(st)).await,
    }
}

async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if !st.ready.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "[-]shutdown failed: reason withheld\nreadyz check failed")
            .into_response();
    }
    if let Some(Err(e)) = kms_providers(&st).await {
        tracing::warn!(error = %e, "readyz: kms-providers check failed");
        return failed_checks("readyz", &["ping"], "kms-providers");
    }
    match st.registry.storage.check_health().await {
        Ok(()) => "ok".into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "readyz: storage check failed");
            (StatusCode::SERVICE_UNAVAILABLE, "[-]etcd failed: reason withheld\nreadyz check failed").into_response()
        }
    }
}

async fn version() -> Response {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.split('.');
    let body = serde_json::json!({
        "major": parts.next().unwrap_or("0"),
        "minor": parts.next().unwrap_or("0"),
        "gitVersion": format!("v{v}"),
        "gitCommit": option_env!("GIT_COMMIT").unwrap_or(""),
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    });
    axum::Json(body).into_response()
}

async fn metrics_handler(State(st): State<Arc<AppState>>) -> Response {
    // The text format 0.0.4 whatever the Accept header asks for, as kube-apiserver's handler.
    let mut r = match st.metrics.encode() {
        Ok(text) => text.into_response(),
        Err(e) => return ApiError::internal(e.to_string()).into_response(),
    };
    r.headers_mut().insert("content-type", HeaderValue::from_static(exposition::CONTENT_TYPE));
    r
}

fn bytes_response(body: bytes::Bytes, content_type: &'static str, etag: Option<&str>, headers: &HeaderMap) -> Response {
    if let (Some(tag), Some(inm)) = (etag, headers.get("if-none-match").and_then(|v| v.to_str().ok())) {
        if inm.split(',').any(|t| t.trim() == tag) {
            let mut r = StatusCode::NOT_MODIFIED.into_response();
            if let Ok(v) = HeaderValue::from_str(tag) {
                r.headers_mut().insert("etag", v);
            }
            return r;
        }
    }
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static(content_type));
    if let Some(v) = etag.and_then(|t| HeaderValue::from_str(t).ok()) {
        h.insert("etag", v);
    }
    h.insert("vary", HeaderValue::from_static("Accept"));
    r
}

/// GET /api, /api/<v>, /apis, /apis/<g>, /apis/<g>/<v>.
pub(crate) fn discovery_response(
    st: &AppState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    if segs.is_empty() || !(segs[0] == "apis" || segs[0] == "api") {
        return Err(ApiError::path_not_found());
    }
    if method != Method::GET {
        return Err(ApiError::method_not_allowed(&method.as_str().to_lowercase(), "", ""));
    }
    let accept = headers.get("accept").and_then(|v| v.to_str().ok());
    let d = &st.discovery;
    match segs.as_slice() {
        ["api"] | ["apis"] => {
            let legacy = segs[0] == "api";
            match aggregated_version(accept) {
                DiscoveryFormat::Aggregated(v) => {
                    let docs = if legacy { &d.aggregated_legacy } else { &d.aggregated };
                    let doc = docs.get(v).ok_or_else(ApiError::path_not_found)?;
                    let ct = if v == "v2" {
                        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
                    } else {
                        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
                    };
                    Ok(bytes_response(doc.body.clone(), ct, Some(&doc.etag), headers))
                }
                DiscoveryFormat::Legacy => {
                    let doc = if legacy { &d.api_versions } else { &d.group_list };
                    Ok(bytes_response(doc.body.clone(), "application/json", None, headers))
                }
                DiscoveryFormat::Unsupported => Err(ApiError::not_acceptable(&[
                    "application/json",
                    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
                ])),
            }
        }
        ["apis", g] => {
            let doc = d.groups.get(*g).ok_or_else(ApiError::path_not_found)?;
            Ok(bytes_response(doc.body.clone(), "application/json", None, headers))
        }
        ["apis", g, v] => {
            let doc = d.resource_lists.get(&(g.to_string(), v.to_string())).ok_or_else(ApiError::path_not_found)?;
            Ok(bytes_response(doc.body.clone(), "application/json", None, headers))
        }
        // The core group's versions (standalone only), keyed by the empty group.
        ["api", v] => {
            let doc = d.resource_lists.get(&(String::new(), v.to_string())).ok_or_else(ApiError::path_not_found)?;
            Ok(bytes_response(doc.body.clone(), "application/json", None, headers))
        }
        _ => Err(ApiError::path_not_found()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// A handler that panics answers a 500 Status; the service goes on answering the next request.
    #[tokio::test]
    async fn a_panicking_handler_answers_a_status() {
        async fn boom() -> &'static str {
            panic!("boom")
        }
        let app = Router::new()
            .route("/boom", get(boom))
            .route("/fine", get(health))
            .layer(axum::middleware::from_fn(answer_panics));
        let get = |path: &str| Request::builder().uri(path).body(axum::body::Body::empty()).expect("request");
        let resp = app.clone().oneshot(get("/boom")).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let status: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
        assert_eq!((status["kind"].as_str(), status["reason"].as_str()), (Some("Status"), Some("InternalError")));
        assert_eq!(app.oneshot(get("/fine")).await.expect("answer").status(), StatusCode::OK);
    }
}

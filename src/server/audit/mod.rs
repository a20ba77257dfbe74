//! The audit filter: kube-apiserver's WithAuditInit, WithAudit and WithFailedAuthenticationAudit
//! (k8s.io/apiserver `pkg/endpoints/filters/audit*.go`, `authn_audit.go`) around this server's request chain.
//!
//! - [`audit_id`] (outermost, always on): the request's `Audit-ID` header, or a new UUID, answered as `Audit-Id`.
//! - [`audit`] (inside the panic handler, around authentication): one [`RequestAudit`] per request in the request
//!   extensions, which the authentication step calls at its decisions:
//!   [`request_received`] once the user is known (the policy is evaluated there, once; RequestReceived is written,
//!   and in blocking-strict a failure answers 500 and nothing else runs), [`authentication_failed`] (one
//!   ResponseStarted event with the 401), and [`authorized`]/[`forbidden`]/[`authorization_error`] (the
//!   `authorization.k8s.io/*` annotations, and the impersonated user).
//! - When the handler answers: ResponseStarted at once for a watch, ResponseComplete when the body has been sent
//!   (for a watch: when it ends), Panic if the handler panicked (the panic then goes on to `answer_panics`).

mod body;

use crate::audit::event::{source_ips, Event, ObjectReference, Payload, ResponseStatus};
use crate::audit::policy::{Attributes, Level, RequestAuditConfig, Stage};
use crate::audit::{Auditor, ImpersonatedUser};
use crate::auth::authn::UserInfo;
use crate::request_info::RequestInfo;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use body::ObservedBody;
use chrono::{DateTime, Utc};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Bodies larger than this are not copied into events (larger than any object this server stores).
const MAX_LOGGED_BODY: usize = 4 << 20;
const MAX_USER_AGENT: usize = 1024;

/// The request's audit ID (request extension), set by [`audit_id`] for every request.
#[derive(Clone, Debug)]
pub struct AuditId(pub HeaderValue);

/// WithAuditInit: every answer carries the request's `Audit-Id`, audited or not.
pub async fn audit_id(mut req: Request, next: Next) -> Response {
    let id = match req.headers().get("audit-id").filter(|v| !v.is_empty()) {
        Some(v) => v.clone(),
        None => HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()).expect("a UUID is a header value"),
    };
    req.extensions_mut().insert(AuditId(id.clone()));
    let mut resp = next.run(req).await;
    resp.headers_mut().entry("audit-id").or_insert(id);
    resp
}

/// One request's audit: what was known when it arrived, then the event as the request goes on.
pub struct RequestAudit {
    auditor: Arc<Auditor>,
    state: Mutex<Progress>,
}

struct Progress {
    /// The event so far; None until the policy was evaluated, and when it said None.
    event: Option<Event>,
    config: Option<RequestAuditConfig>,
    long_running: bool,
    failed_authentication: bool,
    /// RequestReceived could not be stored (blocking-strict): nothing more is written.
    rejected: bool,
    /// The request body as the handler read it (create, update, patch, delete).
    request_body: Option<Payload>,
    /// What is known before the user: the ID, the URI, the client.
    arrived: Arrival,
}

struct Arrival {
    received: DateTime<Utc>,
    audit_id: String,
    request_uri: String,
    user_agent: String,
    source_ips: Vec<String>,
}

/// WithAudit, for a server with a policy and a backend.
pub async fn audit(State(auditor): State<Arc<Auditor>>, mut req: Request, next: Next) -> Response {
    use futures::FutureExt;
    if !auditor.enabled() {
        return next.run(req).await;
    }
    let ctx = Arc::new(RequestAudit { auditor, state: Mutex::new(Progress::new(Arrival::of(&req))) });
    req.extensions_mut().insert(ctx.clone());
    match std::panic::AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(resp) => ctx.answered(resp),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            ctx.panicked(&what);
            std::panic::resume_unwind(panic)
        }
    }
}

impl Arrival {
    fn of(req: &Request) -> Arrival {
        let audit_id = match req.extensions().get::<AuditId>() {
            Some(AuditId(v)) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let mut user_agent =
            String::from_utf8_lossy(req.headers().get("user-agent").map_or(&b""[..], |v| v.as_bytes())).into_owned();
        if user_agent.len() > MAX_USER_AGENT {
            let mut cut = MAX_USER_AGENT;
            while !user_agent.is_char_boundary(cut) {
                cut -= 1;
            }
            user_agent = format!("{}...TRUNCATED", &user_agent[..cut]);
        }
        // The scheduler's in-process requests come from this process, as kube-apiserver's loopback client does.
        let remote = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()).or_else(|| {
            req.extensions().get::<crate::client::InternalIdentity>().map(|_| std::net::Ipv4Addr::LOCALHOST.into())
        });
        Arrival {
            received: Utc::now(),
            audit_id,
            request_uri: req.uri().path_and_query().map_or_else(|| req.uri().path().to_string(), |p| p.to_string()),
            user_agent,
            source_ips: source_ips(req.headers(), remote),
        }
    }
}

impl Progress {
    fn new(arrived: Arrival) -> Progress {
        Progress {
            event: None,
            config: None,
            long_running: false,
            failed_authentication: false,
            rejected: false,
            request_body: None,
            arrived,
        }
    }
}

impl RequestAudit {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Evaluates the policy (once per request) and starts the event.
    fn begin(&self, user: Option<&UserInfo>, info: &RequestInfo) -> RequestAuditConfig {
        let config = self.auditor.evaluate(&Attributes { user, info });
        let mut p = self.progress();
        p.config = Some(config);
        p.long_running = info.is_resource_request && info.verb == "watch";
        if config.level == Level::None {
            return config;
        }
        let object_ref = info.is_resource_request.then(|| ObjectReference {
            resource: info.resource.clone(),
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            api_group: info.api_group.clone(),
            api_version: info.api_version.clone(),
            subresource: info.subresource.clone(),
            ..Default::default()
        });
        // The arrival's strings move into the event: the policy is evaluated once per request, so this runs once.
        let a = &mut p.arrived;
        let event = Event {
            level: config.level,
            audit_id: std::mem::take(&mut a.audit_id),
            stage: Stage::RequestReceived,
            request_uri: std::mem::take(&mut a.request_uri),
            verb: info.verb.clone(),
            user: user.cloned(),
            impersonated_user: None,
            source_ips: std::mem::take(&mut a.source_ips),
            user_agent: std::mem::take(&mut a.user_agent),
            object_ref,
            response_status: None,
            request_object: None,
            response_object: None,
            request_received: a.received,
            stage_timestamp: a.received,
            annotations: Default::default(),
        };
        p.event = Some(event);
        config
    }

    /// Writes the event at `stage` unless the policy omits it; false when the backend could not store it.
    fn emit(&self, p: &mut Progress, stage: Stage) -> bool {
        let (Some(config), Some(event)) = (p.config, p.event.as_mut()) else { return true };
        if config.omit_stages.contains(stage) {
            return true;
        }
        event.stage = stage;
        event.stage_timestamp = if stage == Stage::RequestReceived { event.request_received } else { Utc::now() };
        self.auditor.process(event)
    }

    fn annotate(&self, req: &Request, pairs: &[(&str, &str)]) {
        let mut p = self.progress();
        let Some(event) = p.event.as_mut() else { return };
        for (k, v) in pairs {
            // The first value set stays, as upstream's addAuditAnnotationLocked keeps it.
            event.annotations.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
        if let Some(ImpersonatedUser(user)) = req.extensions().get::<ImpersonatedUser>() {
            event.impersonated_user = Some(user.clone());
        }
    }

    fn answered(self: &Arc<Self>, resp: Response) -> Response {
        let mut p = self.progress();
        if p.event.is_none() || p.rejected {
            return resp;
        }
        let code = resp.status().as_u16();
        let level = p.config.map_or(Level::None, |c| c.level);
        let is_resource = p.event.as_ref().is_some_and(|e| e.object_ref.is_some());
        if p.failed_authentication || p.long_running {
            // The status code at once (the body of an error is read when it ends, below).
            if let Some(e) = p.event.as_mut() {
                e.response_status = Some(ResponseStatus { code, ..Default::default() });
            }
        }
        if p.long_running && !p.failed_authentication {
            self.emit(&mut p, Stage::ResponseStarted);
        }
        // A Status answer's fields go into responseStatus at every level, as upstream's LogResponseObject copies
        // them: errors, and the Success a delete answers with.
        let is_delete = p.event.as_ref().is_some_and(|e| e.verb == "delete");
        let copy = code >= 400 || is_delete || (level == Level::RequestResponse && is_resource && !p.long_running);
        let yaml = content_type(resp.headers()).contains("yaml");
        drop(p);
        let (parts, inner) = resp.into_parts();
        let ctx = self.clone();
        let body =
            ObservedBody::wrap(inner, copy, MAX_LOGGED_BODY, Box::new(move |bytes| ctx.completed(code, yaml, bytes)));
        Response::from_parts(parts, body)
    }

    /// The answer's body has been sent (or dropped): ResponseComplete, or for a failed authentication the one
    /// ResponseStarted event.
    fn completed(&self, code: u16, yaml: bool, body: Option<Vec<u8>>) {
        let mut p = self.progress();
        let omit_managed_fields = p.config.is_some_and(|c| c.omit_managed_fields);
        let request_body = p.request_body.take();
        let (failed_authentication, long_running) = (p.failed_authentication, p.long_running);
        let Some(event) = p.event.as_mut() else { return };
        let parsed: Option<serde_json::Value> = body.as_deref().and_then(|b| serde_json::from_slice(b).ok());
        event.response_status = Some(ResponseStatus::from_answer(code, parsed.as_ref()));
        if failed_authentication {
            self.emit(&mut p, Stage::ResponseStarted);
            return;
        }
        event.request_object = request_body;
        if event.level == Level::RequestResponse && !long_running && event.object_ref.is_some() {
            event.response_object = body.map(|b| Payload { bytes: b.into(), yaml, omit_managed_fields });
        }
        self.emit(&mut p, Stage::ResponseComplete);
    }

    fn panicked(&self, what: &str) {
        let mut p = self.progress();
        let request_body = p.request_body.take();
        let Some(event) = p.event.as_mut() else { return };
        event.request_object = request_body;
        event.response_status = Some(ResponseStatus {
            code: 500,
            status: "Failure".into(),
            reason: "InternalError".into(),
            message: format!("APIServer panic'd: {what}"),
            details: None,
        });
        self.emit(&mut p, Stage::Panic);
    }
}

fn content_type(headers: &axum::http::HeaderMap) -> &str {
    headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default()
}

fn request_audit(req: &Request) -> Option<Arc<RequestAudit>> {
    req.extensions().get::<Arc<RequestAudit>>().cloned()
}

/// The user kube-apiserver's anonymous authenticator gives a request without credentials (to the public paths).
pub fn anonymous() -> UserInfo {
    UserInfo { name: "system:anonymous".into(), groups: vec!["system:unauthenticated".into()], ..Default::default() }
}

/// The user is known: the policy decides, RequestReceived is written. Some: blocking-strict could not store it, and
/// the request is answered with this (upstream's 500) and goes no further.
pub fn request_received(req: &mut Request, user: &UserInfo) -> Option<Response> {
    let ctx = request_audit(req)?;
    let parsed;
    let info = match req.extensions().get::<RequestInfo>() {
        Some(info) => info,
        None => {
            parsed = RequestInfo::parse(req.method(), req.uri().path(), req.uri().query());
            &parsed
        }
    };
    let config = ctx.begin(Some(user), info);
    if config.level == Level::None {
        return None;
    }
    // The request object: logged from Request on; a create's or update's also completes objectRef at Metadata.
    let object_verb = info.is_resource_request
        && match info.verb.as_str() {
            "create" | "update" => true,
            "patch" | "delete" | "deletecollection" => config.level >= Level::Request,
            _ => false,
        };
    let is_delete = matches!(info.verb.as_str(), "delete" | "deletecollection");
    let mut p = ctx.progress();
    if !ctx.emit(&mut p, Stage::RequestReceived) {
        p.rejected = true;
        drop(p);
        ctx.auditor.metrics.rejected();
        return Some(failed_to_store(req));
    }
    drop(p);
    if object_verb {
        let yaml = content_type(req.headers()).contains("yaml");
        let omit = config.omit_managed_fields;
        let body = std::mem::take(req.body_mut());
        let keep = ctx.clone();
        *req.body_mut() = ObservedBody::wrap(
            body,
            true,
            MAX_LOGGED_BODY,
            Box::new(move |bytes| {
                // A delete without a body is logged with the DeleteOptions it defaults to.
                let bytes = match bytes {
                    Some(b) if b.is_empty() && is_delete => {
                        Some(br#"{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1"}"#.to_vec())
                    }
                    Some(b) if b.is_empty() => None,
                    other => other,
                };
                keep.progress().request_body =
                    bytes.map(|b| Payload { bytes: b.into(), yaml, omit_managed_fields: omit });
            }),
        );
    }
    None
}

/// responsewriters.InternalError: plain text naming the request URI.
fn failed_to_store(req: &Request) -> Response {
    let uri = req.uri().path_and_query().map_or_else(|| req.uri().path().to_string(), |p| p.to_string());
    let mut resp = (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("Internal Server Error: {}: failed to store audit event\n", crate::gostr::quote(&uri)),
    )
        .into_response();
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    resp
}

/// Authentication failed: the policy decides with no user; the 401 is audited as one ResponseStarted event.
pub fn authentication_failed(req: &Request) {
    let Some(ctx) = request_audit(req) else { return };
    let parsed;
    let info = match req.extensions().get::<RequestInfo>() {
        Some(info) => info,
        None => {
            parsed = RequestInfo::parse(req.method(), req.uri().path(), req.uri().query());
            &parsed
        }
    };
    ctx.begin(None, info);
    ctx.progress().failed_authentication = true;
}

const DECISION: &str = "authorization.k8s.io/decision";
const REASON: &str = "authorization.k8s.io/reason";

/// The authorizer allowed the request (or needed not be asked: public paths, the scheduler's own requests).
pub fn authorized(req: &Request, reason: &str) {
    if let Some(ctx) = request_audit(req) {
        ctx.annotate(req, &[(DECISION, "allow"), (REASON, reason)]);
    }
}

pub fn forbidden(req: &Request, reason: &str) {
    if let Some(ctx) = request_audit(req) {
        ctx.annotate(req, &[(DECISION, "forbid"), (REASON, reason)]);
    }
}

/// The authorizer could not decide (the request is answered 500).
pub fn authorization_error(req: &Request) {
    if let Some(ctx) = request_audit(req) {
        ctx.annotate(req, &[(REASON, "internal error")]);
    }
}

#[cfg(test)]
mod tests;

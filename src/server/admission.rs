//! Admission webhooks on the API's own TLS server: `POST /mutate` defaults and `POST /validate` validates objects of
//! our kinds that kube-apiserver stores as CRDs, answering AdmissionReview admission.k8s.io/v1. The decisions are
//! the registry's ([`crate::registry::admission`]), made with each kind's own strategy — the one the aggregated API
//! uses — so both deployment forms accept, default and reject the same objects.
//!
//! Answers follow what kube-apiserver checks: the response echoes `request.uid`; apiVersion/kind are exactly
//! `admission.k8s.io/v1` `AdmissionReview`; a mutation is a base64 JSON Patch with `patchType: JSONPatch` (no patch
//! at all when nothing changes); validating answers never carry a patch. A denial's `status` is the 422 Invalid the
//! aggregated API would answer (kube-apiserver shows it to the user as is). dryRun changes nothing: we have no side
//! effects. A review that is not one (wrong apiVersion or kind, no request, no uid, bad JSON) is a 400; a body over
//! the REST limit is a 413. An object of a kind we do not serve is allowed with a warning rather than denied, so a
//! webhook configuration whose rules are too broad cannot block a cluster's writes.

use super::admission_review::{parse_review, review_body, AdmissionRequest, Answer};
use super::AppState;
use crate::registry::admission::{AdmissionWrite, Sent};
use crate::registry::{Registry, Resource, Subresource};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine;
use std::sync::Arc;

/// `/mutate` and `/validate` (behind the server's authentication, like every non-public path).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/mutate", post(mutate)).route("/validate", post(validate))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Mutate,
    Validate,
}

async fn mutate(State(st): State<Arc<AppState>>, req: Request) -> Response {
    admit(&st, req, Mode::Mutate).await
}

async fn validate(State(st): State<Arc<AppState>>, req: Request) -> Response {
    admit(&st, req, Mode::Validate).await
}

impl Answer {
    /// The HTTP answer carrying [`Answer::review`].
    pub(crate) fn into_response(self, uid: &str) -> Response {
        let mut r = Response::new(Body::from(self.review(uid)));
        r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        r
    }
}

/// A review of a kind we do not serve: admitted unchecked, with a warning naming the kind.
#[derive(Debug, thiserror::Error)]
#[error("migration-apiserver does not serve {0}: admitted unchecked (check the rules of the webhook configuration)")]
struct Unserved(String);

/// The served resource the review is about (by `request.kind`, else `request.resource`), with the version its
/// objects are in; Err when it is not ours.
fn target<'a>(registry: &'a Registry, req: &'a AdmissionRequest) -> Result<(&'a Arc<Resource>, &'a str), Unserved> {
    if let Some(k) = req.kind.as_ref().filter(|k| !k.kind.is_empty()) {
        let gv = if k.group.is_empty() { k.version.to_string() } else { format!("{}/{}", k.group, k.version) };
        return registry
            .resource_for_kind(&k.group, &k.version, &k.kind)
            .map(|r| (r, &*k.version))
            .ok_or_else(|| Unserved(format!("{gv}, Kind={}", k.kind)));
    }
    let r =
        req.resource.as_ref().filter(|r| !r.resource.is_empty()).ok_or_else(|| Unserved("an unnamed kind".into()))?;
    registry
        .resource(&r.group, &r.version, &r.resource)
        .map(|res| (res, &*r.version))
        .ok_or_else(|| Unserved(format!("{}/{}, Resource={}", r.group, r.version, r.resource)))
}

/// The answer to `req`, whose objects it takes.
fn decide(registry: &Registry, req: &mut AdmissionRequest, mode: Mode) -> Answer {
    // Deletes and connects carry nothing to default or validate.
    let (object, old_object) = match (req.operation.as_str(), req.object.take(), req.old_object.take()) {
        ("CREATE", Some(o), _) => (o, None),
        ("UPDATE", Some(o), Some(old)) => (o, Some(old)),
        _ => return Answer::allow(Vec::new()),
    };
    let (res, version) = match target(registry, req) {
        Ok(t) => t,
        Err(unserved) => return Answer::allow(vec![unserved.to_string()]),
    };
    let info = res.strategy.info();
    let subresource = match Subresource::parse(&req.sub_resource) {
        Some(Subresource::Main) => Subresource::Main,
        Some(sub @ Subresource::Status) if res.strategy.serves(sub) && old_object.is_some() => sub,
        _ => {
            let other = &req.sub_resource;
            return Answer::allow(vec![format!(
                "migration-apiserver does not handle {} {:?}: admitted unchecked",
                info.qualified_resource(),
                format!("{}/{other}", req.operation.to_lowercase())
            )]);
        }
    };
    let write = match old_object {
        None => AdmissionWrite::Create { object: Sent::Value(object) },
        Some(old_object) => {
            AdmissionWrite::Update { object: Sent::Value(object), old_object: Sent::Value(old_object), subresource }
        }
    };
    match mode {
        Mode::Mutate => match res.admission_default(version, write) {
            Ok(d) => Answer {
                allowed: true,
                patch: d.patch.map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
                warnings: d.warnings,
                status: None,
            },
            Err(e) => Answer::deny(&e),
        },
        Mode::Validate => {
            let ns = Some(&*req.namespace).filter(|n| !n.is_empty());
            match res.admission_validate(version, ns, write) {
                Ok(warnings) => Answer::allow(warnings),
                Err(e) => Answer::deny(&e),
            }
        }
    }
}

async fn admit(st: &AppState, req: Request, mode: Mode) -> Response {
    let raw = match review_body(req).await {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    let mut req = match parse_review(&raw) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let answer = decide(&st.registry, &mut req, mode);
    tracing::debug!(
        uid = %req.uid,
        operation = %req.operation,
        name = %req.name,
        namespace = %req.namespace,
        dry_run = req.dry_run.unwrap_or(false),
        ?mode,
        allowed = answer.allowed,
        patched = answer.patch.is_some(),
        "admission review"
    );
    answer.into_response(&req.uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn malformed_reviews_say_why() {
        let msg = |body: &str| parse_review(body.as_bytes()).unwrap_err().message;
        assert!(msg("{").contains("invalid JSON"));
        // Not UTF-8: the text path is skipped, and the byte path says where.
        let e = parse_review(b"{\"apiVersion\":\"\xff\"}").unwrap_err().message;
        assert!(e.contains("invalid JSON") && e.contains("column"), "{e}");
        assert!(msg(r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#).contains("apiVersion"));
        assert!(msg(r#"{"apiVersion":"admission.k8s.io/v1","kind":"Review"}"#).contains("kind must be"));
        assert!(msg(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).contains("request is missing"));
        assert!(msg(
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"DELETE"}}"#
        )
        .contains("request.uid"));
        assert!(msg(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}}"#)
            .contains("request.uid: invalid type"));
    }

    #[test]
    fn answers_have_the_shape_kube_apiserver_checks() {
        let review = |a: Answer, uid: &str| serde_json::from_slice::<Value>(&a.review(uid)).unwrap();
        let v = review(Answer::allow(vec![]), "u1");
        assert_eq!(
            v,
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u1", "allowed": true}})
        );
        let v = review(Answer { allowed: true, patch: Some("W10=".into()), ..Default::default() }, "u2");
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        assert_eq!(v["response"]["patch"], "W10=");
        // A uid that needs escaping, warnings and a status.
        let a = Answer {
            allowed: false,
            warnings: vec!["w \"1\"".into()],
            status: Some(json!({"code": 422})),
            patch: None,
        };
        let v = review(a, "u\"3\\");
        assert_eq!(
            v,
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                "uid": "u\"3\\", "allowed": false, "warnings": ["w \"1\""], "status": {"code": 422}}})
        );
    }
}

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

use super::rest::read_body;
use super::AppState;
pub(crate) use crate::api::admission_review::AdmissionRequest;
use crate::api::admission_review::{kind_hint, AdmissionObject, AdmissionReview, ReviewObject};
use crate::error::{ApiError, ApiResult};
use crate::registry::admission::AdmissionWrite;
use crate::registry::decode::starts_object;
use crate::registry::{Registry, Resource};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::Arc;

pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
pub const ADMISSION_REVIEW: &str = "AdmissionReview";

/// `/mutate` and `/validate` (behind the server's authentication, like every non-public path).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .merge(super::csi_admission::routes())
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

fn malformed(detail: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("malformed AdmissionReview: {detail}"))
}

/// The review's request, or the 400 (413) that says why there is none. A well-formed review is decoded in one
/// pass; a body that does not decode so is read again step by step (the envelope with its request as raw JSON,
/// then the request with path tracking) to say exactly what is wrong with it.
pub(crate) fn parse_review<'a, O: ReviewObject + Deserialize<'a>>(raw: &'a [u8]) -> ApiResult<AdmissionRequest<'a, O>> {
    // Read as text once it is known to be UTF-8 (one check of the whole body, rather than one per string).
    if let (true, Ok(text)) = (starts_object(raw), std::str::from_utf8(raw)) {
        if let Ok(review) = serde_json::from_str::<AdmissionReview<AdmissionRequest<'a, O>>>(text) {
            return check_review(review);
        }
    }
    let envelope: AdmissionReview<&'a RawValue> = match serde_json::from_slice(raw) {
        Ok(e) if starts_object(raw) => e,
        Ok(_) => return Err(malformed("the body must be a JSON object")),
        Err(e) if e.is_data() && !starts_object(raw) => return Err(malformed("the body must be a JSON object")),
        Err(e) => return Err(malformed(format!("invalid JSON: {e}"))),
    };
    check_type(&envelope.api_version, &envelope.kind)?;
    let request = match envelope.request {
        None => return Err(malformed("request is missing")),
        Some(r) if !starts_object(r.get().as_bytes()) => return Err(malformed("request must be an object")),
        Some(r) => r,
    };
    let mut de = serde_json::Deserializer::from_str(request.get());
    let req: AdmissionRequest<'a, O> = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        malformed(format!("request.{path}: {}", e.into_inner()))
    })?;
    check_request(req)
}

/// The request of a review that decoded, or the 400 that says why it is not one we answer.
fn check_review<O: ReviewObject>(
    review: AdmissionReview<AdmissionRequest<'_, O>>,
) -> ApiResult<AdmissionRequest<'_, O>> {
    check_type(&review.api_version, &review.kind)?;
    check_request(review.request.ok_or_else(|| malformed("request is missing"))?)
}

/// A review of one of our kinds. When its text names the request's kind plainly ([`kind_hint`]; kube-apiserver's
/// reviews do), it is read in one pass with its objects decoded into the kind's type on the way; otherwise, or when
/// that pass fails, it is read step by step ([`parse_review`]), which also says what is wrong with it.
fn read_review<'a>(registry: &Registry, raw: &'a [u8]) -> ApiResult<AdmissionRequest<'a, AdmissionObject<'a>>> {
    if let (true, Ok(text)) = (starts_object(raw), std::str::from_utf8(raw)) {
        let hint = kind_hint(text);
        let resource = hint.as_ref().and_then(|k| registry.resource_for_kind(k.group, k.version, k.kind));
        if let (Some(res), Some(hint)) = (resource, &hint) {
            let review = res.read_review(hint.version, text);
            if let Some(review) = review.filter(|r| r.request.as_ref().is_some_and(|req| hint.is_of(req))) {
                return check_review(review);
            }
        }
    }
    let req = parse_review::<&RawValue>(raw)?;
    req.try_map_objects(|o, _| Some(AdmissionObject::sent(o.get())))
        .ok_or_else(|| ApiError::internal("a review's objects could not be kept as text"))
}

/// apiVersion and kind of a review must be the ones we answer.
fn check_type(api_version: &Option<Value>, kind: &Option<Value>) -> ApiResult<()> {
    let field = |v: &Option<Value>| v.as_ref().and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind) = (field(api_version), field(kind));
    if api_version != ADMISSION_API_VERSION {
        return Err(malformed(format!(
            "apiVersion must be {ADMISSION_API_VERSION:?} (admissionReviewVersions: [v1]), got {api_version:?}"
        )));
    }
    if kind != ADMISSION_REVIEW {
        return Err(malformed(format!("kind must be {ADMISSION_REVIEW:?}, got {kind:?}")));
    }
    Ok(())
}

/// The checks of a decoded request that its type cannot express.
fn check_request<O: ReviewObject>(req: AdmissionRequest<'_, O>) -> ApiResult<AdmissionRequest<'_, O>> {
    if req.uid.is_empty() {
        return Err(malformed("request.uid is missing"));
    }
    let op = &*req.operation;
    if !matches!(op, "CREATE" | "UPDATE" | "DELETE" | "CONNECT") {
        return Err(malformed(format!(
            "request.operation: Unsupported value: {op:?}: supported values: \"CREATE\", \"UPDATE\", \"DELETE\", \"CONNECT\""
        )));
    }
    if matches!(op, "CREATE" | "UPDATE") && !req.object.as_ref().is_some_and(ReviewObject::is_json_object) {
        return Err(malformed(format!("request.object is required for {op}")));
    }
    if op == "UPDATE" && !req.old_object.as_ref().is_some_and(ReviewObject::is_json_object) {
        return Err(malformed("request.oldObject is required for UPDATE"));
    }
    let has_kind = req.kind.as_ref().is_some_and(|k| !k.kind.is_empty());
    let has_resource = req.resource.as_ref().is_some_and(|r| !r.resource.is_empty());
    if !has_kind && !has_resource {
        return Err(malformed("request.kind (or request.resource) is required"));
    }
    Ok(req)
}

/// The `response` of an AdmissionReview.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub(crate) allowed: bool,
    /// Base64 of the JSON Patch (mutating only).
    pub(crate) patch: Option<String>,
    pub(crate) warnings: Vec<String>,
    pub(crate) status: Option<Value>,
}

impl Answer {
    pub(crate) fn allow(warnings: Vec<String>) -> Self {
        Answer { allowed: true, warnings, ..Default::default() }
    }
    pub(crate) fn deny(e: &ApiError) -> Self {
        Answer { allowed: false, status: Some(e.status()), ..Default::default() }
    }
    /// The AdmissionReview answering the request `uid`, as JSON. Written out field by field: only the uid, the
    /// warnings and the status need JSON escaping (the patch is base64), and this is every review's answer.
    pub(crate) fn review(&self, uid: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.patch.as_ref().map_or(0, String::len));
        for part in ["{\"apiVersion\":\"", ADMISSION_API_VERSION, "\",\"kind\":\"", ADMISSION_REVIEW] {
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(b"\",\"response\":{\"uid\":");
        // Plain data with string keys: serializing it cannot fail.
        let _ = serde_json::to_writer(&mut out, uid);
        out.extend_from_slice(if self.allowed { b",\"allowed\":true" } else { b",\"allowed\":false" });
        if let Some(patch) = &self.patch {
            debug_assert!(patch.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)), "not base64");
            out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
            out.extend_from_slice(patch.as_bytes());
            out.push(b'"');
        }
        if !self.warnings.is_empty() {
            out.extend_from_slice(b",\"warnings\":");
            let _ = serde_json::to_writer(&mut out, &self.warnings);
        }
        if let Some(status) = &self.status {
            out.extend_from_slice(b",\"status\":");
            let _ = serde_json::to_writer(&mut out, status);
        }
        out.extend_from_slice(b"}}");
        out
    }

    /// The HTTP answer carrying [`Answer::review`].
    pub(crate) fn into_response(self, uid: &str) -> Response {
        let mut r = Response::new(Body::from(self.review(uid)));
        r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        r
    }
}

/// The served resource the review is about (by `request.kind`, else `request.resource`), with the version its
/// objects are in; Err(warning) when it is not ours.
fn target<'a, O>(
    registry: &'a Registry,
    req: &'a AdmissionRequest<'_, O>,
) -> Result<(&'a Arc<Resource>, &'a str), String> {
    let unserved = |what: String| {
        format!("migration-apiserver does not serve {what}: admitted unchecked (check the rules of the webhook configuration)")
    };
    if let Some(k) = req.kind.as_ref().filter(|k| !k.kind.is_empty()) {
        let gv = if k.group.is_empty() { k.version.to_string() } else { format!("{}/{}", k.group, k.version) };
        return registry
            .resource_for_kind(&k.group, &k.version, &k.kind)
            .map(|r| (r, &*k.version))
            .ok_or_else(|| unserved(format!("{gv}, Kind={}", k.kind)));
    }
    let r =
        req.resource.as_ref().filter(|r| !r.resource.is_empty()).ok_or_else(|| unserved("an unnamed kind".into()))?;
    registry
        .resource(&r.group, &r.version, &r.resource)
        .map(|res| (res, &*r.version))
        .ok_or_else(|| unserved(format!("{}/{}, Resource={}", r.group, r.version, r.resource)))
}

/// The answer to `req`, whose objects it takes.
fn decide(registry: &Registry, req: &mut AdmissionRequest<'_, AdmissionObject<'_>>, mode: Mode) -> Answer {
    // Deletes and connects carry nothing to default or validate.
    let (object, old_object) = match (&*req.operation, req.object.take(), req.old_object.take()) {
        ("CREATE", Some(o), _) => (o, None),
        ("UPDATE", Some(o), Some(old)) => (o, Some(old)),
        _ => return Answer::allow(Vec::new()),
    };
    let (res, version) = match target(registry, req) {
        Ok(t) => t,
        Err(warning) => return Answer::allow(vec![warning]),
    };
    let info = res.strategy.info();
    let status = match &*req.sub_resource {
        "" => false,
        "status" if info.has_status && old_object.is_some() => true,
        other => {
            return Answer::allow(vec![format!(
                "migration-apiserver does not handle {} {:?}: admitted unchecked",
                info.qualified_resource(),
                format!("{}/{other}", req.operation.to_lowercase())
            )])
        }
    };
    let write = match old_object {
        None => AdmissionWrite::Create { object },
        Some(old_object) => AdmissionWrite::Update { object, old_object, status },
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

/// The body of a review, or the response that says why there is none (its request is parsed from it with
/// [`parse_review`], borrowing its strings).
pub(crate) async fn review_body(req: Request) -> Result<bytes::Bytes, Response> {
    let (parts, body) = req.into_parts();
    read_body(body, &parts.headers).await.map_err(IntoResponse::into_response)
}

async fn admit(st: &AppState, req: Request, mode: Mode) -> Response {
    let raw = match review_body(req).await {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    let mut req = match read_review(&st.registry, &raw) {
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
    use serde_json::json;

    #[test]
    fn malformed_reviews_say_why() {
        let msg = |body: &str| parse_review::<&RawValue>(body.as_bytes()).unwrap_err().message;
        assert!(msg("{").contains("invalid JSON"));
        // Not UTF-8: the text path is skipped, and the byte path says where.
        let e = parse_review::<&RawValue>(b"{\"apiVersion\":\"\xff\"}").unwrap_err().message;
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

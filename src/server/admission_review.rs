//! The AdmissionReview (admission.k8s.io/v1) that kube-apiserver sends to webhooks, as our webhooks read and answer
//! it: the fields of its request we act on, and the response. kube's own review types would decode the objects as
//! `DynamicObject`, which turns an object whose metadata does not decode into a malformed review rather than a
//! denial naming the field, and its response always writes a `status`; these are plain serde types instead.

use super::rest::read_body;
use crate::error::{ApiError, ApiResult};
use crate::go_decode::GoStructs;
use crate::registry::decode::starts_object;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
pub const ADMISSION_REVIEW: &str = "AdmissionReview";

#[derive(Deserialize, Debug, Default)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Deserialize, Debug, Default)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// The fields of `AdmissionRequest` we act on, its objects read as JSON values with the review.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub kind: Option<GroupVersionKind>,
    #[serde(default)]
    pub resource: Option<GroupVersionResource>,
    #[serde(default)]
    pub sub_resource: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    /// Read for the log only: without side effects a dry run is answered like any other review.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// An AdmissionReview and its request.
#[derive(Deserialize)]
struct AdmissionReview {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<Value>,
    #[serde(default)]
    kind: Option<Value>,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

fn malformed(detail: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("malformed AdmissionReview: {detail}"))
}

/// The review's request, or the 400 that says what is wrong with the review (the path of a field that does not
/// decode).
pub fn parse_review(raw: &[u8]) -> ApiResult<AdmissionRequest> {
    if !starts_object(raw) {
        return Err(match serde_json::from_slice::<IgnoredAny>(raw) {
            Ok(_) => malformed("the body must be a JSON object"),
            Err(e) => malformed(format!("invalid JSON: {e}")),
        });
    }
    // Reviews that decode (nearly all) take one pass; the path of an error is found by decoding again. As Go
    // decodes it (kube-apiserver's own types are Go's): an array is no struct ([`GoStructs`]).
    let mut de = serde_json::Deserializer::from_slice(raw);
    let review = AdmissionReview::deserialize(GoStructs(&mut de)).and_then(|review| de.end().map(|()| review));
    let review = match review {
        Ok(review) => review,
        Err(_) => {
            let mut de = serde_json::Deserializer::from_slice(raw);
            let e = match serde_path_to_error::deserialize::<_, AdmissionReview>(GoStructs(&mut de)) {
                Ok(_) => de.end().err().map(|e| format!("invalid JSON: {e}")),
                Err(e) if e.inner().is_syntax() || e.inner().is_eof() => Some(format!("invalid JSON: {}", e.inner())),
                Err(e) => Some(format!("{}: {}", e.path(), e.inner())),
            };
            return Err(malformed(e.unwrap_or_else(|| "the review does not decode".into())));
        }
    };
    check_type(&review.api_version, &review.kind)?;
    check_request(review.request.ok_or_else(|| malformed("request is missing"))?)
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
fn check_request(req: AdmissionRequest) -> ApiResult<AdmissionRequest> {
    if req.uid.is_empty() {
        return Err(malformed("request.uid is missing"));
    }
    let op = req.operation.as_str();
    if !matches!(op, "CREATE" | "UPDATE" | "DELETE" | "CONNECT") {
        return Err(malformed(format!(
            "request.operation: Unsupported value: {op:?}: supported values: \"CREATE\", \"UPDATE\", \"DELETE\", \"CONNECT\""
        )));
    }
    if matches!(op, "CREATE" | "UPDATE") && !req.object.as_ref().is_some_and(Value::is_object) {
        return Err(malformed(format!("request.object is required for {op}")));
    }
    if op == "UPDATE" && !req.old_object.as_ref().is_some_and(Value::is_object) {
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
pub struct Answer {
    pub allowed: bool,
    /// Base64 of the JSON Patch (mutating only).
    pub patch: Option<String>,
    pub warnings: Vec<String>,
    pub status: Option<Value>,
}

/// An AdmissionReview answering a request, as written.
#[derive(Serialize)]
struct ReviewAnswer<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    response: ResponseFields<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseFields<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a Value>,
}

impl Answer {
    pub fn allow(warnings: Vec<String>) -> Self {
        Answer { allowed: true, warnings, ..Default::default() }
    }
    pub fn deny(e: &ApiError) -> Self {
        Answer { allowed: false, status: Some(e.status()), ..Default::default() }
    }
    /// The AdmissionReview answering the request `uid`, as JSON.
    pub fn review(&self, uid: &str) -> Vec<u8> {
        let answer = ReviewAnswer {
            api_version: ADMISSION_API_VERSION,
            kind: ADMISSION_REVIEW,
            response: ResponseFields {
                uid,
                allowed: self.allowed,
                patch_type: self.patch.as_ref().map(|_| "JSONPatch"),
                patch: self.patch.as_deref(),
                warnings: &self.warnings,
                status: self.status.as_ref(),
            },
        };
        // Plain data with string keys: serializing it cannot fail.
        serde_json::to_vec(&answer).unwrap_or_default()
    }
}

/// The body of a review, or the response that says why there is none.
pub async fn review_body(req: Request) -> Result<bytes::Bytes, Response> {
    let (parts, body) = req.into_parts();
    read_body(body, &parts.headers).await.map_err(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::parse_review;
    use serde_json::json;

    /// An array where the review has a struct is malformed, at its path, as any other value of the wrong type;
    /// serde's derived decoders alone would read the array's items as the fields in order.
    #[test]
    fn arrays_are_no_structs() {
        let review = |request: serde_json::Value| {
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}),
            )
            .expect("encodes")
        };
        let ok = json!({"uid": "u", "operation": "CREATE", "object": {}, "kind": {"version": "v1", "kind": "Pod"}});
        assert_eq!(parse_review(&review(ok.clone())).expect("a review").uid, "u");
        let mut kind_list = ok;
        kind_list["kind"] = json!(["", "v1", "Pod"]);
        for (request, want) in [
            (
                json!(["u", null, null, "", "", "", "CREATE"]),
                "request: invalid type: sequence, expected struct AdmissionRequest",
            ),
            (kind_list, "request.kind: invalid type: sequence, expected struct GroupVersionKind"),
        ] {
            let e = parse_review(&review(request)).expect_err("malformed");
            assert_eq!(e.code, 400);
            assert!(
                e.message.starts_with(&format!("malformed AdmissionReview: {want} at line 1 column")),
                "{}",
                e.message
            );
        }
    }
}

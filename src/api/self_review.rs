//! SelfSubjectAccessReview (`authorization.k8s.io/v1`) and SelfSubjectReview (`authentication.k8s.io/v1`): what
//! the requesting user may do, and who the server takes the requesting user to be, as kube-apiserver's
//! `pkg/registry/authorization/selfsubjectaccessreview` and `pkg/registry/authentication/selfsubjectreview` answer
//! them. `kubectl auth can-i` and `kubectl auth whoami` create them.
//!
//! Served only standalone, where this server is all the API kubectl sees; behind the aggregator both groups are
//! kube-apiserver's (see [`AppState::new`](crate::server::AppState::new)). Both are create-only virtual kinds: the
//! registry decodes and validates the request like any create, and the answer, which needs the request's user and
//! the authorizer, is filled by the HTTP layer (`server::self_review`). The types are k8s-openapi's, the ones
//! kube-apiserver's clients use.

use crate::error::FieldError;
use crate::registry::strategy::{Column, Kind, KindInfo, NoStatus};
use crate::validation::NameRule;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SelfSubjectAccessReview};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

static ACCESS_REVIEW: KindInfo = KindInfo {
    group: "authorization.k8s.io",
    kind: "SelfSubjectAccessReview",
    list_kind: "SelfSubjectAccessReviewList",
    plural: "selfsubjectaccessreviews",
    singular: "selfsubjectaccessreview",
    namespaced: false,
    short_names: &[],
    categories: &[],
    versions: &["v1"],
    name_rule: NameRule::PathSegment,
    unconditional_update: false,
    create_only: true,
    generation: false,
    return_deleted_object: false,
    api_approved: None,
    priority: None,
};

static REVIEW: KindInfo = KindInfo {
    group: "authentication.k8s.io",
    kind: "SelfSubjectReview",
    list_kind: "SelfSubjectReviewList",
    plural: "selfsubjectreviews",
    singular: "selfsubjectreview",
    namespaced: false,
    short_names: &[],
    categories: &[],
    versions: &["v1"],
    name_rule: NameRule::PathSegment,
    unconditional_update: false,
    create_only: true,
    generation: false,
    return_deleted_object: false,
    api_approved: None,
    priority: None,
};

/// A value as Go's `%#v` prints a string field.
fn go_quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Go's `%#v` of the internal NonResourceAttributes, which `field.Invalid` prints for the value of the spec error.
fn non_resource_value(a: &NonResourceAttributes) -> String {
    let s = |v: &Option<String>| go_quoted(v.as_deref().unwrap_or_default());
    format!("authorization.NonResourceAttributes{{Path:{}, Verb:{}}}", s(&a.path), s(&a.verb))
}

impl Kind for SelfSubjectAccessReview {
    const CELLS_READ_METADATA: bool = false;
    fn info() -> &'static KindInfo {
        &ACCESS_REVIEW
    }
    type Status = NoStatus;
    fn replace_status(&mut self, status: NoStatus) -> NoStatus {
        status
    }
    /// The status of a request is not the client's: it is the answer, which replaces it.
    fn prepare_for_create(&mut self) {
        self.status = None;
    }
    /// `ValidateSelfSubjectAccessReview`: exactly one of the attributes, and no metadata (managedFields aside).
    fn validate(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = &self.spec;
        match (&spec.resource_attributes, &spec.non_resource_attributes) {
            (Some(_), Some(non_resource)) => errs.push(FieldError::invalid_rendered(
                "spec.nonResourceAttributes",
                &non_resource_value(non_resource),
                "cannot be specified in combination with resourceAttributes",
            )),
            (None, None) => errs.push(FieldError::invalid(
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )),
            _ => {}
        }
        let metadata = ObjectMeta { managed_fields: None, ..self.metadata.clone() };
        if metadata != ObjectMeta::default() {
            let rendered = serde_json::to_string(&metadata).unwrap_or_default();
            errs.push(FieldError::invalid_rendered("metadata", &rendered, "must be empty"));
        }
        errs
    }
    /// Upstream's REST validates the review itself ([`validate`](Self::validate)), never the metadata's syntax.
    fn validate_with_meta(&self, _meta: Vec<FieldError>) -> Vec<FieldError> {
        self.validate()
    }
    fn columns() -> Vec<Column> {
        Vec::new()
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        Vec::new()
    }
}

impl Kind for SelfSubjectReview {
    const CELLS_READ_METADATA: bool = false;
    fn info() -> &'static KindInfo {
        &REVIEW
    }
    type Status = NoStatus;
    fn replace_status(&mut self, status: NoStatus) -> NoStatus {
        status
    }
    fn prepare_for_create(&mut self) {
        self.status = None;
    }
    /// Upstream validates nothing: whatever was sent, the answer is the requesting user.
    fn validate(&self) -> Vec<FieldError> {
        Vec::new()
    }
    fn validate_with_meta(&self, _meta: Vec<FieldError>) -> Vec<FieldError> {
        Vec::new()
    }
    fn columns() -> Vec<Column> {
        Vec::new()
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReviewSpec};

    fn review(resource: bool, non_resource: bool) -> SelfSubjectAccessReview {
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: resource
                    .then(|| ResourceAttributes { verb: Some("get".into()), ..Default::default() }),
                non_resource_attributes: non_resource
                    .then(|| NonResourceAttributes { path: Some("/metrics".into()), verb: Some("get".into()) }),
            },
            ..Default::default()
        }
    }

    /// pkg/apis/authorization/validation's ValidateSelfSubjectAccessReview.
    #[test]
    fn access_reviews_validate_as_upstream() {
        let messages = |r: SelfSubjectAccessReview| r.validate().into_iter().map(|e| e.message).collect::<Vec<_>>();
        assert!(messages(review(true, false)).is_empty());
        assert!(messages(review(false, true)).is_empty());
        assert_eq!(
            messages(review(false, false)),
            ["spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"]
        );
        assert_eq!(
            messages(review(true, true)),
            ["spec.nonResourceAttributes: Invalid value: authorization.NonResourceAttributes{Path:\"/metrics\", Verb:\"get\"}: cannot be specified in combination with resourceAttributes"]
        );
        let mut named = review(true, false);
        named.metadata.name = Some("x".into());
        assert_eq!(messages(named), ["metadata: Invalid value: {\"name\":\"x\"}: must be empty"]);
        let mut managed = review(true, false);
        managed.metadata.managed_fields = Some(Vec::new());
        assert!(messages(managed).is_empty(), "managedFields aside");
    }
}

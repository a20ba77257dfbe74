//! authorization.k8s.io/v1 SelfSubjectAccessReview and authentication.k8s.io/v1 SelfSubjectReview to and from their
//! messages (k8s.io/api's generated.proto): kubectl's `auth can-i` and `auth whoami` send them in protobuf. Through
//! k8s-openapi's types, the kinds' own ([`crate::api::self_review`]); an empty string of a message is a field Go's
//! JSON leaves out.

use super::meta::{object_meta_from_proto, object_meta_to_proto};
use super::DecodeError;
use crate::error::{ApiError, ApiResult};
use k8s_openapi::api::authentication::v1 as authn;
use k8s_openapi::api::authorization::v1 as authz;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::api::authentication::v1 as pb_authn;
use k8s_pb::api::authorization::v1 as pb_authz;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use prost::Message;
use serde_json::Value;

fn typed<T: serde::de::DeserializeOwned>(object: &Value) -> ApiResult<T> {
    let mut object = object.clone();
    // k8s-openapi's types check apiVersion and kind, which the envelope carries instead.
    if let Value::Object(o) = &mut object {
        o.remove("apiVersion");
        o.remove("kind");
    }
    serde_json::from_value(object).map_err(|e| ApiError::internal(format!("a review that does not encode: {e}")))
}

/// A message's string as JSON has it: absent when empty.
fn opt(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// A string as Go's message writes it: always, empty or not.
fn always(s: &Option<String>) -> Option<String> {
    Some(s.clone().unwrap_or_default())
}

fn to_json<T: serde::Serialize>(typed: &T) -> Result<Value, DecodeError> {
    let mut v = serde_json::to_value(typed)?;
    if let Value::Object(o) = &mut v {
        o.remove("apiVersion");
        o.remove("kind");
    }
    Ok(v)
}

pub(super) fn access_review_to_proto(object: &Value) -> ApiResult<pb_authz::SelfSubjectAccessReview> {
    let r: authz::SelfSubjectAccessReview = typed(object)?;
    let status = r.status.unwrap_or_default();
    Ok(pb_authz::SelfSubjectAccessReview {
        metadata: Some(object_meta_to_proto(&r.metadata)),
        spec: Some(pb_authz::SelfSubjectAccessReviewSpec {
            resource_attributes: r.spec.resource_attributes.map(|a| pb_authz::ResourceAttributes {
                namespace: always(&a.namespace),
                verb: always(&a.verb),
                group: always(&a.group),
                version: always(&a.version),
                resource: always(&a.resource),
                subresource: always(&a.subresource),
                name: always(&a.name),
                field_selector: a.field_selector.map(|f| pb_authz::FieldSelectorAttributes {
                    raw_selector: always(&f.raw_selector),
                    requirements: f.requirements.unwrap_or_default().into_iter().map(field_requirement).collect(),
                }),
                label_selector: a.label_selector.map(|l| pb_authz::LabelSelectorAttributes {
                    raw_selector: always(&l.raw_selector),
                    requirements: l.requirements.unwrap_or_default().into_iter().map(label_requirement).collect(),
                }),
            }),
            non_resource_attributes: r
                .spec
                .non_resource_attributes
                .map(|a| pb_authz::NonResourceAttributes { path: always(&a.path), verb: always(&a.verb) }),
        }),
        status: Some(pb_authz::SubjectAccessReviewStatus {
            allowed: Some(status.allowed),
            denied: Some(status.denied.unwrap_or_default()),
            reason: always(&status.reason),
            evaluation_error: always(&status.evaluation_error),
        }),
    })
}

fn field_requirement(r: meta::FieldSelectorRequirement) -> pb_meta::FieldSelectorRequirement {
    pb_meta::FieldSelectorRequirement {
        key: Some(r.key),
        operator: Some(r.operator),
        values: r.values.unwrap_or_default(),
    }
}

fn label_requirement(r: meta::LabelSelectorRequirement) -> pb_meta::LabelSelectorRequirement {
    pb_meta::LabelSelectorRequirement {
        key: Some(r.key),
        operator: Some(r.operator),
        values: r.values.unwrap_or_default(),
    }
}

pub(super) fn access_review_from_proto(raw: &[u8]) -> Result<Value, DecodeError> {
    let r = pb_authz::SelfSubjectAccessReview::decode(raw)?;
    let spec = r.spec.unwrap_or_default();
    let list = |v: Vec<String>| (!v.is_empty()).then_some(v);
    let typed = authz::SelfSubjectAccessReview {
        metadata: object_meta_from_proto(r.metadata.unwrap_or_default())?,
        spec: authz::SelfSubjectAccessReviewSpec {
            resource_attributes: spec.resource_attributes.map(|a| authz::ResourceAttributes {
                namespace: opt(a.namespace),
                verb: opt(a.verb),
                group: opt(a.group),
                version: opt(a.version),
                resource: opt(a.resource),
                subresource: opt(a.subresource),
                name: opt(a.name),
                field_selector: a.field_selector.map(|f| authz::FieldSelectorAttributes {
                    raw_selector: opt(f.raw_selector),
                    requirements: list_of(f.requirements, |r| meta::FieldSelectorRequirement {
                        key: r.key.unwrap_or_default(),
                        operator: r.operator.unwrap_or_default(),
                        values: list(r.values),
                    }),
                }),
                label_selector: a.label_selector.map(|l| authz::LabelSelectorAttributes {
                    raw_selector: opt(l.raw_selector),
                    requirements: list_of(l.requirements, |r| meta::LabelSelectorRequirement {
                        key: r.key.unwrap_or_default(),
                        operator: r.operator.unwrap_or_default(),
                        values: list(r.values),
                    }),
                }),
            }),
            non_resource_attributes: spec
                .non_resource_attributes
                .map(|a| authz::NonResourceAttributes { path: opt(a.path), verb: opt(a.verb) }),
        },
        // A request's status is dropped on create; only its presence matters to nobody.
        status: None,
    };
    to_json(&typed)
}

fn list_of<A, B>(items: Vec<A>, f: impl Fn(A) -> B) -> Option<Vec<B>> {
    (!items.is_empty()).then(|| items.into_iter().map(f).collect())
}

pub(super) fn subject_review_to_proto(object: &Value) -> ApiResult<pb_authn::SelfSubjectReview> {
    let r: authn::SelfSubjectReview = typed(object)?;
    let user = r.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok(pb_authn::SelfSubjectReview {
        metadata: Some(object_meta_to_proto(&r.metadata)),
        status: Some(pb_authn::SelfSubjectReviewStatus {
            user_info: Some(pb_authn::UserInfo {
                username: always(&user.username),
                uid: always(&user.uid),
                groups: user.groups.unwrap_or_default(),
                extra: user
                    .extra
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, items)| (k, pb_authn::ExtraValue { items }))
                    .collect(),
            }),
        }),
    })
}

/// The request's metadata is all a SelfSubjectReview has to send (the answer ignores it).
pub(super) fn subject_review_from_proto(raw: &[u8]) -> Result<Value, DecodeError> {
    let r = pb_authn::SelfSubjectReview::decode(raw)?;
    let typed =
        authn::SelfSubjectReview { metadata: object_meta_from_proto(r.metadata.unwrap_or_default())?, status: None };
    to_json(&typed)
}

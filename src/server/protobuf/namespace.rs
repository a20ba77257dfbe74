//! core/v1 Namespace and NamespaceList to and from their messages (k8s.io/api/core/v1/generated.proto), through the
//! kind's own type ([`crate::api::namespace::Namespace`]) so that both forms mean the same fields.

use super::meta::{list_meta_to_proto, object_meta_from_proto, object_meta_to_proto, time_from_proto, time_to_proto};
use super::DecodeError;
use crate::api::namespace::{Namespace, NamespaceCondition, NamespaceSpec, NamespaceStatus};
use crate::error::{ApiError, ApiResult};
use k8s_pb::api::core::v1 as pb;
use prost::Message;
use serde_json::Value;

fn typed(object: &Value) -> ApiResult<Namespace> {
    serde_json::from_value(object.clone())
        .map_err(|e| ApiError::internal(format!("a Namespace that does not encode as one: {e}")))
}

/// As Go writes a Namespace: metadata, spec and status always (they are not pointers), empty or not.
pub(super) fn to_proto(object: &Value) -> ApiResult<pb::Namespace> {
    let ns = typed(object)?;
    let status = ns.status.unwrap_or_default();
    Ok(pb::Namespace {
        metadata: Some(object_meta_to_proto(&ns.metadata)),
        spec: Some(pb::NamespaceSpec { finalizers: ns.spec.unwrap_or_default().finalizers }),
        status: Some(pb::NamespaceStatus {
            phase: Some(status.phase.unwrap_or_default()),
            conditions: status.conditions.iter().map(condition_to_proto).collect(),
        }),
    })
}

fn condition_to_proto(c: &NamespaceCondition) -> pb::NamespaceCondition {
    pb::NamespaceCondition {
        r#type: Some(c.type_.clone()),
        status: Some(c.status.clone()),
        last_transition_time: Some(time_to_proto(c.last_transition_time.as_ref())),
        reason: Some(c.reason.clone().unwrap_or_default()),
        message: Some(c.message.clone().unwrap_or_default()),
    }
}

pub(super) fn list_to_proto(meta: &Value, items: &[Value]) -> ApiResult<pb::NamespaceList> {
    Ok(pb::NamespaceList {
        metadata: Some(list_meta_to_proto(meta)),
        items: items.iter().map(to_proto).collect::<ApiResult<_>>()?,
    })
}

/// A Namespace message as JSON; spec and status are there when the message has them (Go's JSON always writes both).
pub(super) fn from_proto(raw: &[u8]) -> Result<Value, DecodeError> {
    let ns = pb::Namespace::decode(raw)?;
    let status = match ns.status {
        Some(s) => Some(NamespaceStatus {
            phase: s.phase.filter(|p| !p.is_empty()),
            conditions: s.conditions.into_iter().map(condition_from_proto).collect::<Result<_, _>>()?,
        }),
        None => None,
    };
    let typed = Namespace {
        metadata: object_meta_from_proto(ns.metadata.unwrap_or_default())?,
        spec: ns.spec.map(|s| NamespaceSpec { finalizers: s.finalizers }),
        status,
    };
    Ok(serde_json::to_value(&typed)?)
}

fn condition_from_proto(c: pb::NamespaceCondition) -> Result<NamespaceCondition, DecodeError> {
    Ok(NamespaceCondition {
        type_: c.r#type.unwrap_or_default(),
        status: c.status.unwrap_or_default(),
        last_transition_time: time_from_proto(c.last_transition_time)?,
        reason: c.reason.filter(|r| !r.is_empty()),
        message: c.message.filter(|m| !m.is_empty()),
    })
}

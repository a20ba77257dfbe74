//! meta/v1 messages (ObjectMeta, ListMeta, Time, Status, DeleteOptions) to and from the JSON forms of k8s-openapi's
//! types. Written as Go's generated marshallers write them (k8s.io/apimachinery/pkg/apis/meta/v1/generated.pb.go):
//! fields that are not pointers in Go are always present, empty or not; read back, an empty value is an absent one,
//! as Go's JSON `omitempty` leaves it out. Times carry whole seconds only, both ways (time_proto.go: the JSON form
//! has no fractions, so neither has the protobuf one).

use super::DecodeError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as json;
use k8s_openapi::jiff::Timestamp;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb;
use serde_json::Value;

fn always(s: &Option<String>) -> Option<String> {
    Some(s.clone().unwrap_or_default())
}

/// An empty string read back is an absent one.
fn present(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

fn nonempty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

/// A Time as Go writes it: nothing for the zero (absent) time, else whole seconds and zero nanos.
pub(super) fn time_to_proto(t: Option<&json::Time>) -> pb::Time {
    match t {
        Some(t) => pb::Time { seconds: Some(t.0.as_second()), nanos: Some(0) },
        None => pb::Time::default(),
    }
}

/// A Time read back: none for the empty message (Go's zero time), else its seconds (nanos are dropped, as Go drops
/// them). Seconds outside what RFC 3339 can write (years 1 to 9999) fail the decode.
pub(super) fn time_from_proto(t: Option<pb::Time>) -> Result<Option<json::Time>, DecodeError> {
    let Some(seconds) = t.and_then(|t| t.seconds) else { return Ok(None) };
    Timestamp::from_second(seconds).map(|ts| Some(json::Time(ts))).map_err(|_| DecodeError::TimeOutOfRange(seconds))
}

pub(super) fn object_meta_to_proto(m: &json::ObjectMeta) -> pb::ObjectMeta {
    pb::ObjectMeta {
        name: always(&m.name),
        generate_name: always(&m.generate_name),
        namespace: always(&m.namespace),
        self_link: always(&m.self_link),
        uid: always(&m.uid),
        resource_version: always(&m.resource_version),
        generation: Some(m.generation.unwrap_or_default()),
        creation_timestamp: Some(time_to_proto(m.creation_timestamp.as_ref())),
        deletion_timestamp: m.deletion_timestamp.as_ref().map(|t| time_to_proto(Some(t))),
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: m.labels.clone().unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
        owner_references: m.owner_references.iter().flatten().map(owner_reference_to_proto).collect(),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        managed_fields: m.managed_fields.iter().flatten().map(managed_fields_to_proto).collect(),
    }
}

pub(super) fn object_meta_from_proto(m: pb::ObjectMeta) -> Result<json::ObjectMeta, DecodeError> {
    Ok(json::ObjectMeta {
        name: present(m.name),
        generate_name: present(m.generate_name),
        namespace: present(m.namespace),
        self_link: present(m.self_link),
        uid: present(m.uid),
        resource_version: present(m.resource_version),
        generation: m.generation.filter(|g| *g != 0),
        creation_timestamp: time_from_proto(m.creation_timestamp)?,
        deletion_timestamp: time_from_proto(m.deletion_timestamp)?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: (!m.labels.is_empty()).then_some(m.labels),
        annotations: (!m.annotations.is_empty()).then_some(m.annotations),
        owner_references: nonempty(m.owner_references.into_iter().map(owner_reference_from_proto).collect()),
        finalizers: nonempty(m.finalizers),
        managed_fields: nonempty(
            m.managed_fields.into_iter().map(managed_fields_from_proto).collect::<Result<Vec<_>, _>>()?,
        ),
    })
}

fn owner_reference_to_proto(r: &json::OwnerReference) -> pb::OwnerReference {
    pb::OwnerReference {
        api_version: Some(r.api_version.clone()),
        kind: Some(r.kind.clone()),
        name: Some(r.name.clone()),
        uid: Some(r.uid.clone()),
        controller: r.controller,
        block_owner_deletion: r.block_owner_deletion,
    }
}

fn owner_reference_from_proto(r: pb::OwnerReference) -> json::OwnerReference {
    json::OwnerReference {
        api_version: r.api_version.unwrap_or_default(),
        kind: r.kind.unwrap_or_default(),
        name: r.name.unwrap_or_default(),
        uid: r.uid.unwrap_or_default(),
        controller: r.controller,
        block_owner_deletion: r.block_owner_deletion,
    }
}

/// `fieldsV1` travels as the bytes of its JSON text (FieldsV1.Raw), in protobuf as in Go's memory.
fn managed_fields_to_proto(e: &json::ManagedFieldsEntry) -> pb::ManagedFieldsEntry {
    pb::ManagedFieldsEntry {
        manager: always(&e.manager),
        operation: always(&e.operation),
        api_version: always(&e.api_version),
        time: e.time.as_ref().map(|t| time_to_proto(Some(t))),
        fields_type: always(&e.fields_type),
        fields_v1: e.fields_v1.as_ref().map(|f| pb::FieldsV1 { raw: serde_json::to_vec(&f.0).ok() }),
        subresource: always(&e.subresource),
    }
}

fn managed_fields_from_proto(e: pb::ManagedFieldsEntry) -> Result<json::ManagedFieldsEntry, DecodeError> {
    let fields_v1 = match e.fields_v1.and_then(|f| f.raw).filter(|raw| !raw.is_empty()) {
        Some(raw) => Some(json::FieldsV1(serde_json::from_slice(&raw).map_err(DecodeError::FieldsV1)?)),
        None => None,
    };
    Ok(json::ManagedFieldsEntry {
        manager: present(e.manager),
        operation: present(e.operation),
        api_version: present(e.api_version),
        time: time_from_proto(e.time)?,
        fields_type: present(e.fields_type),
        fields_v1,
        subresource: present(e.subresource),
    })
}

/// ListMeta from its JSON form (as the list answers write it).
pub(super) fn list_meta_to_proto(meta: &Value) -> pb::ListMeta {
    let m: json::ListMeta = serde_json::from_value(meta.clone()).unwrap_or_default();
    pb::ListMeta {
        self_link: always(&m.self_link),
        resource_version: always(&m.resource_version),
        r#continue: always(&m.continue_),
        remaining_item_count: m.remaining_item_count,
    }
}

/// A Status from its JSON form ([`crate::error::ApiError::status`], or the Success Status of a delete).
pub(super) fn status_to_proto(status: &Value) -> pb::Status {
    let s: json::Status = serde_json::from_value(status.clone()).unwrap_or_default();
    let details = s.details.map(|d| pb::StatusDetails {
        name: always(&d.name),
        group: always(&d.group),
        kind: always(&d.kind),
        uid: always(&d.uid),
        causes: d
            .causes
            .into_iter()
            .flatten()
            .map(|c| pb::StatusCause {
                reason: always(&c.reason),
                message: always(&c.message),
                field: always(&c.field),
            })
            .collect(),
        retry_after_seconds: Some(d.retry_after_seconds.unwrap_or_default()),
    });
    pb::Status {
        metadata: Some(pb::ListMeta {
            self_link: always(&s.metadata.self_link),
            resource_version: always(&s.metadata.resource_version),
            r#continue: always(&s.metadata.continue_),
            remaining_item_count: s.metadata.remaining_item_count,
        }),
        status: always(&s.status),
        message: always(&s.message),
        reason: always(&s.reason),
        details,
        code: Some(s.code.unwrap_or_default()),
    }
}

/// DeleteOptions as the JSON keys the delete handler reads.
pub(super) fn delete_options_to_json(o: pb::DeleteOptions) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(seconds) = o.grace_period_seconds {
        out.insert("gracePeriodSeconds".into(), seconds.into());
    }
    if let Some(p) = o.preconditions {
        let mut pre = serde_json::Map::new();
        if let Some(uid) = p.uid {
            pre.insert("uid".into(), uid.into());
        }
        if let Some(rv) = p.resource_version {
            pre.insert("resourceVersion".into(), rv.into());
        }
        out.insert("preconditions".into(), Value::Object(pre));
    }
    if let Some(orphan) = o.orphan_dependents {
        out.insert("orphanDependents".into(), orphan.into());
    }
    if let Some(policy) = o.propagation_policy {
        out.insert("propagationPolicy".into(), policy.into());
    }
    if !o.dry_run.is_empty() {
        out.insert("dryRun".into(), o.dry_run.into());
    }
    if let Some(unsafe_delete) = o.ignore_store_read_error_with_cluster_breaking_potential {
        out.insert("ignoreStoreReadErrorWithClusterBreakingPotential".into(), unsafe_delete.into());
    }
    Value::Object(out)
}

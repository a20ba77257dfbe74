//! Kubernetes' protobuf wire format (`application/vnd.kubernetes.protobuf`), for the kinds kube-apiserver serves in
//! it that this server serves too, standalone: the core/v1 Namespace and the self reviews. kubectl's typed clients
//! (`kubectl create namespace`, `kubectl auth can-i`, `kubectl auth whoami`) send and ask for it; other kinds stay
//! JSON-only, as custom resources and aggregated servers are.
//!
//! As k8s.io/apimachinery/pkg/runtime/serializer/protobuf (protobuf.go): an object is the 4-byte magic `k8s\0` and
//! a `runtime.Unknown` whose `typeMeta` names its apiVersion and kind and whose `raw` holds the object's message. A
//! watch is a stream of length-delimited frames (4-byte big-endian length), each a bare `metav1.WatchEvent` (no
//! magic, no Unknown: the "raw" serializer) whose `object.raw` is an enveloped object, as
//! k8s.io/apiserver/pkg/endpoints/handlers/watch.go writes them. The messages themselves are k8s-pb's, generated
//! from the upstream .proto files; [`meta`] and [`namespace`] convert them to and from the JSON the registry keeps.

mod meta;
mod namespace;
mod self_review;

use crate::error::{ApiError, ApiResult};
use crate::registry::strategy::KindInfo;
use crate::registry::WatchEventType;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
use prost::Message;
use serde_json::Value;

/// The media type of Kubernetes' protobuf encoding.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// The media type of a watch in protobuf.
pub const PROTOBUF_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";
/// What starts every enveloped object.
const MAGIC: &[u8; 4] = b"k8s\0";

/// Why a message does not decode into the object it should be.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Message(#[from] prost::DecodeError),
    #[error("time out of range: {0} seconds since the epoch")]
    TimeOutOfRange(i64),
    #[error("fieldsV1 is not JSON: {0}")]
    FieldsV1(serde_json::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// A kind this server serves in protobuf: how its objects are written and read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoKind {
    Namespace,
    SelfSubjectAccessReview,
    SelfSubjectReview,
}

impl ProtoKind {
    /// The protobuf form of a kind, if it has one here: kube-apiserver's kinds that this server serves.
    pub fn of(info: &KindInfo) -> Option<Self> {
        match (info.group, info.kind) {
            ("", "Namespace") => Some(Self::Namespace),
            ("authorization.k8s.io", "SelfSubjectAccessReview") => Some(Self::SelfSubjectAccessReview),
            ("authentication.k8s.io", "SelfSubjectReview") => Some(Self::SelfSubjectReview),
            _ => None,
        }
    }

    /// The message of one object (no envelope) of this kind, from its JSON form.
    fn encode(self, object: &Value) -> ApiResult<Vec<u8>> {
        match self {
            Self::Namespace => Ok(namespace::to_proto(object)?.encode_to_vec()),
            Self::SelfSubjectAccessReview => Ok(self_review::access_review_to_proto(object)?.encode_to_vec()),
            Self::SelfSubjectReview => Ok(self_review::subject_review_to_proto(object)?.encode_to_vec()),
        }
    }

    /// The message of a list of this kind: its ListMeta (JSON) and items (JSON objects). The reviews have no
    /// lists (they are create-only).
    fn encode_list(self, meta: &Value, items: &[Value]) -> ApiResult<Vec<u8>> {
        match self {
            Self::Namespace => Ok(namespace::list_to_proto(meta, items)?.encode_to_vec()),
            _ => Err(ApiError::internal("a create-only kind has no list")),
        }
    }

    /// One object of this kind from its message, as JSON (without apiVersion and kind).
    fn decode(self, raw: &[u8]) -> Result<Value, DecodeError> {
        match self {
            Self::Namespace => namespace::from_proto(raw),
            Self::SelfSubjectAccessReview => self_review::access_review_from_proto(raw),
            Self::SelfSubjectReview => self_review::subject_review_from_proto(raw),
        }
    }
}

/// `k8s\0` and the Unknown that carries `raw` as `api_version`/`kind`.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta { api_version: Some(api_version.into()), kind: Some(kind.into()) }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    out.extend_from_slice(MAGIC);
    unknown.encode(&mut out).unwrap_or_default();
    out
}

/// What an answer in protobuf holds: an object of `kind` or a Status (the JSON names which, by its `kind`).
pub fn encode_object(kind: ProtoKind, info: &KindInfo, object: &Value) -> ApiResult<Vec<u8>> {
    let text = |k: &str| object.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind_name) = (text("apiVersion"), text("kind"));
    if kind_name == "Status" {
        return Ok(encode_status(object));
    }
    if kind_name != info.kind {
        return Err(ApiError::internal(format!("{kind_name} has no protobuf encoding on this server")));
    }
    Ok(envelope(&api_version, &kind_name, kind.encode(object)?))
}

/// A list of `kind` in `api_version`: ListMeta `meta` and `items`.
pub fn encode_list(
    kind: ProtoKind,
    info: &KindInfo,
    api_version: &str,
    meta: &Value,
    items: &[Value],
) -> ApiResult<Vec<u8>> {
    Ok(envelope(api_version, info.list_kind, kind.encode_list(meta, items)?))
}

/// A list answer in parts, so that it can be written while its items are read: [`list_head`], each item as
/// [`ProtoKind::list_item`] makes it, then [`list_tail`]; together the bytes [`encode_list`] writes. The head carries
/// the length of the list's message, so the items' total length must be known before the first is written.
impl ProtoKind {
    /// One item of a list: the list message's `items` field (2), its key and length included.
    pub fn list_item(self, object: &Value) -> ApiResult<Vec<u8>> {
        let message = self.encode(object)?;
        let mut out = Vec::with_capacity(message.len() + 6);
        prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(message.len() as u64, &mut out);
        out.extend_from_slice(&message);
        Ok(out)
    }

    /// The list message's `metadata` field (1): the ListMeta, as the list's message starts.
    fn list_meta_field(self, meta: &Value) -> ApiResult<Vec<u8>> {
        self.encode_list(meta, &[])
    }
}

/// What comes before a list's items: the magic, the Unknown's typeMeta, the key and length of its `raw` (the list's
/// message: its ListMeta `meta` and `items_len` bytes of items), and the ListMeta.
pub fn list_head(
    kind: ProtoKind,
    api_version: &str,
    list_kind: &str,
    meta: &Value,
    items_len: usize,
) -> ApiResult<Vec<u8>> {
    let meta_field = kind.list_meta_field(meta)?;
    let unknown = Unknown {
        type_meta: Some(TypeMeta { api_version: Some(api_version.into()), kind: Some(list_kind.into()) }),
        ..Unknown::default()
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len() + 16 + meta_field.len());
    out.extend_from_slice(MAGIC);
    unknown.encode(&mut out).unwrap_or_default();
    prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint((meta_field.len() + items_len) as u64, &mut out);
    out.extend_from_slice(&meta_field);
    Ok(out)
}

/// What comes after a list's items: the Unknown's contentEncoding and contentType (empty), as [`envelope`] writes.
pub fn list_tail() -> Vec<u8> {
    Unknown { content_encoding: Some(String::new()), content_type: Some(String::new()), ..Unknown::default() }
        .encode_to_vec()
}

/// A Status (its JSON form, as [`ApiError::status`] writes it) as an enveloped `v1` Status.
pub fn encode_status(status: &Value) -> Vec<u8> {
    envelope("v1", "Status", meta::status_to_proto(status).encode_to_vec())
}

/// One frame of a protobuf watch: the object is a Status (in its JSON form) on ERROR, else an object of `kind` (a
/// bookmark's carries only metadata).
pub fn watch_frame(kind: ProtoKind, info: &KindInfo, event: WatchEventType, object: &Value) -> ApiResult<Vec<u8>> {
    let event = pb_meta::WatchEvent {
        r#type: Some(event.as_str().to_string()),
        object: Some(RawExtension { raw: Some(encode_object(kind, info, object)?) }),
    };
    let message = event.encode_to_vec();
    let length = u32::try_from(message.len()).map_err(|_| ApiError::internal("a watch event too large to frame"))?;
    let mut frame = Vec::with_capacity(4 + message.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&message);
    Ok(frame)
}

/// The start of a body as kube-apiserver quotes it in decode errors (its `summarizeData`): at most 30 bytes, as text
/// for what looks like a JSON object and in hex for anything else, " ..." after when there is more.
pub(super) fn summarize(body: &[u8]) -> String {
    const MAX: usize = 30;
    if body.is_empty() {
        return "<empty>".into();
    }
    let head = &body[..body.len().min(MAX)];
    let text = if body.starts_with(b"{") {
        String::from_utf8_lossy(head).into_owned()
    } else {
        head.iter().map(|b| format!("{b:02x}")).collect()
    };
    if body.len() > MAX {
        format!("{text} ...")
    } else {
        text
    }
}

/// kube-apiserver's reasons (protobuf.go's Decode) for a body holding no enveloped object.
#[derive(Debug, thiserror::Error)]
enum EnvelopeError {
    #[error("empty data")]
    EmptyData,
    #[error("provided data does not appear to be a protobuf message, expected prefix [{}]", go_bytes(MAGIC))]
    NoMagic,
    #[error("empty body")]
    EmptyBody,
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
}

/// A byte slice as Go prints it: `[107 56 115 0]` without the brackets.
fn go_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(u8::to_string).collect::<Vec<_>>().join(" ")
}

/// The Unknown of an enveloped body, or why there is none.
fn unwrap_envelope(body: &[u8]) -> Result<Unknown, EnvelopeError> {
    if body.is_empty() {
        return Err(EnvelopeError::EmptyData);
    }
    let rest = body.strip_prefix(MAGIC.as_slice()).ok_or(EnvelopeError::NoMagic)?;
    if rest.is_empty() {
        return Err(EnvelopeError::EmptyBody);
    }
    Ok(Unknown::decode(rest)?)
}

/// An object of `kind` from a protobuf request body, as the JSON a JSON body would have been: apiVersion and kind
/// from the envelope (the kind's own when it names none, as kube-apiserver defaults them). A body of another kind
/// keeps only its apiVersion and kind, for the registry to refuse as it refuses such a JSON body.
pub fn decode_object(kind: ProtoKind, info: &KindInfo, version: &str, body: &[u8]) -> ApiResult<Value> {
    let unknown = unwrap_envelope(body).map_err(|why| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): {why} ({})",
            info.kind,
            summarize(body)
        ))
    })?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.filter(|v| !v.is_empty()).unwrap_or_else(|| info.api_version(version));
    let kind_name = type_meta.kind.filter(|k| !k.is_empty()).unwrap_or_else(|| info.kind.to_string());
    let mut object = if kind_name == info.kind {
        kind.decode(unknown.raw.as_deref().unwrap_or_default()).map_err(|e| {
            let version = api_version.rsplit('/').next().unwrap_or_default();
            ApiError::bad_request(format!(
                "{kind_name} in version {version:?} cannot be handled as a {}: {e}",
                info.kind
            ))
        })?
    } else {
        Value::Object(Default::default())
    };
    if let Value::Object(o) = &mut object {
        o.insert("apiVersion".into(), Value::String(api_version));
        o.insert("kind".into(), Value::String(kind_name));
    }
    Ok(object)
}

/// DeleteOptions from a protobuf body, as the JSON a JSON body would have been (kube-apiserver reads DeleteOptions
/// in any of its media types, for every resource).
pub fn decode_delete_options(body: &[u8]) -> ApiResult<Value> {
    let bad = |why: EnvelopeError| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type DeleteOptions): {why} ({})",
            summarize(body)
        ))
    };
    let unknown = unwrap_envelope(body).map_err(bad)?;
    let options =
        pb_meta::DeleteOptions::decode(unknown.raw.as_deref().unwrap_or_default()).map_err(|e| bad(e.into()))?;
    Ok(meta::delete_options_to_json(options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::namespace::Namespace;
    use crate::registry::strategy::Kind;

    #[test]
    fn a_namespace_round_trips_through_its_envelope() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "garden-dev", "uid": "u-1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-02T03:04:05Z", "labels": {"kubernetes.io/metadata.name": "garden-dev"},
                "managedFields": [{"manager": "kubectl-create", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:kubernetes.io/metadata.name": {}}}}}]},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active", "conditions": [{"type": "NamespaceDeletionDiscoveryFailure",
                "status": "False", "lastTransitionTime": "2026-01-02T03:04:06Z", "reason": "ResourcesDiscovered",
                "message": "All resources successfully discovered"}]}
        });
        let info = Namespace::info();
        let bytes = encode_object(ProtoKind::Namespace, info, &json).expect("encode");
        assert_eq!(&bytes[..4], b"k8s\0");
        let back = decode_object(ProtoKind::Namespace, info, "v1", &bytes).expect("decode");
        assert_eq!(back, json);
    }

    #[test]
    fn a_list_in_parts_is_the_list_in_one() {
        let info = Namespace::info();
        let namespace = |i: usize, label: usize| {
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": format!("ns-{i}"), "uid": format!("u-{i}"), "resourceVersion": "9",
                    "labels": {"big": "x".repeat(label)}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        };
        let meta = serde_json::json!({"resourceVersion": "12"});
        // No item, one, and enough (some large) that the lengths take several bytes.
        for items in [vec![], vec![namespace(0, 0)], (0..300).map(|i| namespace(i, i * 7)).collect()] {
            let whole = encode_list(ProtoKind::Namespace, info, "v1", &meta, &items).expect("whole");
            let parts: Vec<Vec<u8>> = items.iter().map(|o| ProtoKind::Namespace.list_item(o).expect("item")).collect();
            let len = parts.iter().map(Vec::len).sum();
            let mut streamed = list_head(ProtoKind::Namespace, "v1", info.list_kind, &meta, len).expect("head");
            parts.iter().for_each(|p| streamed.extend_from_slice(p));
            streamed.extend_from_slice(&list_tail());
            assert_eq!(streamed, whole, "{} items", items.len());
        }
    }

    #[test]
    fn malformed_bodies_are_bad_requests() {
        let info = Namespace::info();
        for body in [&b""[..], b"k8s\0", b"{\"kind\":\"Namespace\"}", b"k8s\0\x0a\xff\xff\xff"] {
            let e = decode_object(ProtoKind::Namespace, info, "v1", body).expect_err("refused");
            assert_eq!(e.code, 400, "{}", e.message);
            assert!(e.message.starts_with("the object provided is unrecognized (must be of type Namespace): "));
        }
        let e = decode_object(ProtoKind::Namespace, info, "v1", b"{}").expect_err("refused");
        assert_eq!(
            e.message,
            "the object provided is unrecognized (must be of type Namespace): provided data does not appear to be a \
             protobuf message, expected prefix [107 56 115 0] ({})"
        );
        let raw_garbage = envelope("v1", "Namespace", vec![0x0a, 0x05, 0x01]);
        let e = decode_object(ProtoKind::Namespace, info, "v1", &raw_garbage).expect_err("refused");
        assert!(
            e.message.starts_with("Namespace in version \"v1\" cannot be handled as a Namespace: "),
            "{}",
            e.message
        );
    }
}

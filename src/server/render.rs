//! REST answers: objects, lists (from parsed objects, or spliced from their stored bytes), Tables and
//! PartialObjectMetadata, YAML and protobuf for the kinds that have them, with their media types and warnings.

use super::negotiate::{Output, YAML};
use super::protobuf::{self, ProtoKind, PROTOBUF};
use super::query::QueryParams;
use super::table::{self, object, partial_metadata, table, IncludeObject};
use crate::error::{ApiError, ApiResult};
use crate::registry::ListRest;
use crate::registry::{ListOut, ListParams, RawObject, Resource};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc::error::TryRecvError;

pub(super) fn json_response(
    code: StatusCode,
    body: &Value,
    content_type: &'static str,
    warnings: &[String],
) -> Response {
    bytes_response(code, serde_json::to_vec(body).unwrap_or_default(), content_type, warnings)
}

/// An answer of `content_type` with kube-apiserver's `Warning` headers.
fn bytes_response(code: StatusCode, body: Vec<u8>, content_type: &'static str, warnings: &[String]) -> Response {
    let mut r = (code, body).into_response();
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static(content_type));
    for w in warnings {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(v) = HeaderValue::from_str(&text) {
            h.append("warning", v);
        }
    }
    r
}

pub(super) const JSON: &str = "application/json";

/// An object (or a Status) in the negotiated form: JSON, or YAML or protobuf for a kind that has them.
pub(super) fn object_response(
    res: &Resource,
    code: StatusCode,
    body: &Value,
    out: Output,
    warnings: &[String],
) -> ApiResult<Response> {
    match out {
        Output::Protobuf => {
            let bytes = protobuf::encode_object(proto_kind(res)?, res.strategy.info(), body)?;
            Ok(bytes_response(code, bytes, PROTOBUF, warnings))
        }
        Output::Yaml => yaml_response(code, body, warnings),
        _ => Ok(json_response(code, body, JSON, warnings)),
    }
}

/// An object as YAML, as kube-apiserver writes it (sigs.k8s.io/yaml: the JSON form, keys in order, with strings
/// a YAML 1.1 reader would take for something else, such as timestamps, quoted).
pub(super) fn yaml_response(code: StatusCode, body: &Value, warnings: &[String]) -> ApiResult<Response> {
    let text = serde_saphyr::to_string(body).map_err(|e| ApiError::internal(format!("encoding YAML: {e}")))?;
    Ok(bytes_response(code, text.into_bytes(), YAML, warnings))
}

/// The protobuf form of `res`'s kind; negotiation offers protobuf only for kinds that have one.
pub(super) fn proto_kind(res: &Resource) -> ApiResult<ProtoKind> {
    let info = res.strategy.info();
    ProtoKind::of(info).ok_or_else(|| ApiError::internal(format!("{} has no protobuf form", info.kind)))
}

pub(super) fn content_type_for(out: Output) -> &'static str {
    match out {
        Output::Json => JSON,
        Output::Table("v1beta1") => "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        Output::Table(_) => "application/json;as=Table;v=v1;g=meta.k8s.io",
        Output::Metadata(_) => JSON,
        Output::Protobuf => PROTOBUF,
        Output::Yaml => YAML,
    }
}

pub(super) fn render_one(res: &Resource, obj: Value, out: Output, q: &QueryParams) -> ApiResult<Response> {
    let body = match out {
        Output::Json => obj,
        Output::Protobuf | Output::Yaml => return object_response(res, StatusCode::OK, &obj, out, &[]),
        Output::Metadata(mv) => partial_metadata(obj, mv),
        Output::Table(mv) => {
            let include = IncludeObject::parse(q.include_object.as_deref())?;
            let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
            table(res.strategy.as_ref(), vec![obj], include, mv, object([("resourceVersion", rv)]), true)
        }
    };
    Ok(json_response(StatusCode::OK, &body, content_type_for(out), &[]))
}

pub(super) fn render_list(
    res: &Resource,
    version: &str,
    list: ListOut,
    out: Output,
    q: &QueryParams,
) -> ApiResult<Response> {
    let info = res.strategy.info();
    let meta = list_meta(&list);
    let body = match out {
        Output::Protobuf => {
            let api_version = info.api_version(version);
            let bytes = protobuf::encode_list(proto_kind(res)?, info, &api_version, &meta, &list.items)?;
            return Ok(bytes_response(StatusCode::OK, bytes, PROTOBUF, &[]));
        }
        Output::Json | Output::Yaml => object([
            ("apiVersion", Value::String(info.api_version(version))),
            ("kind", Value::String(info.list_kind.into())),
            ("metadata", meta),
            ("items", Value::Array(list.items)),
        ]),
        Output::Metadata(mv) => object([
            ("apiVersion", Value::String(format!("meta.k8s.io/{mv}"))),
            ("kind", Value::String("PartialObjectMetadataList".into())),
            ("metadata", meta),
            ("items", list.items.into_iter().map(|o| partial_metadata(o, mv)).collect()),
        ]),
        Output::Table(mv) => {
            let include = IncludeObject::parse(q.include_object.as_deref())?;
            table(res.strategy.as_ref(), list.items, include, mv, meta, true)
        }
    };
    if out == Output::Yaml {
        return yaml_response(StatusCode::OK, &body, &[]);
    }
    Ok(json_response(StatusCode::OK, &body, content_type_for(out), &[]))
}

/// ListMeta of a list response.
fn list_meta<T>(list: &ListOut<T>) -> Value {
    let mut meta = serde_json::Map::new();
    meta.insert("resourceVersion".into(), Value::String(list.revision.to_string()));
    if let Some(c) = &list.continue_token {
        meta.insert("continue".into(), Value::String(c.clone()));
    }
    if let Some(r) = list.remaining {
        meta.insert("remainingItemCount".into(), Value::from(r));
    }
    Value::Object(meta)
}

/// A JSON list written from the items' spliced bytes (no `Value` per item); the items of `rest` as they are read.
pub(super) fn render_raw_list(
    res: &Resource,
    version: &str,
    list: ListOut<RawObject>,
    rest: Option<ListRest<RawObject>>,
) -> Response {
    let info = res.strategy.info();
    let head = vec![
        ("apiVersion", Value::String(info.api_version(version))),
        ("kind", Value::String(info.list_kind.into())),
        ("metadata", list_meta(&list)),
    ];
    list_answer(head, "items", list, rest, JSON)
}

/// A Table list without selectors: rows written from the stored bytes (see [`table::raw_row`]).
pub(super) async fn raw_table_list(
    res: &Arc<Resource>,
    ns: Option<&str>,
    version: &str,
    params: &ListParams,
    mv: &'static str,
    q: &QueryParams,
) -> ApiResult<Response> {
    let include = IncludeObject::parse(q.include_object.as_deref())?;
    let (api_version, version, of) = (res.strategy.info().api_version(version), version.to_string(), res.clone());
    let now = chrono::Utc::now();
    let (list, rest) = res
        .list_streamed(ns, params, move |kv| {
            let strategy = of.strategy.as_ref();
            let row = match table::raw_row(strategy, &kv.value, kv.mod_revision, &api_version, include, mv, now) {
                Some(raw) => raw,
                // Not in the shape this server writes: the parsed path reports it properly.
                None => {
                    let obj = of.decode_stored(kv, &version)?;
                    let row = table::row(strategy, obj, include, mv, now);
                    serde_json::to_vec(&row).map_err(|e| ApiError::internal(e.to_string()))?
                }
            };
            Ok(Some(RawObject(row)))
        })
        .await?;
    let head = table_head(res, mv, list_meta(&list));
    Ok(list_answer(head, "rows", list, rest, content_type_for(Output::Table(mv))))
}

/// A LIST whose objects are parsed (selectors, a version other than the stored one, PartialObjectMetadata), as JSON,
/// a Table or PartialObjectMetadataList: written as it is read, as [`render_raw_list`] writes a list, with the items
/// [`render_list`] would have built.
pub(super) async fn parsed_list(
    res: &Arc<Resource>,
    ns: Option<&str>,
    version: &str,
    params: &ListParams,
    out: Output,
    q: &QueryParams,
) -> ApiResult<Response> {
    let to_vec = |v: &Value| serde_json::to_vec(v).map_err(|e| ApiError::internal(e.to_string()));
    let info = res.strategy.info();
    match out {
        Output::Json => {
            let (list, rest) = res.list_encoded(ns, version, params, move |obj| to_vec(&obj)).await?;
            let head = vec![
                ("apiVersion", Value::String(info.api_version(version))),
                ("kind", Value::String(info.list_kind.into())),
                ("metadata", list_meta(&list)),
            ];
            Ok(list_answer(head, "items", list, rest, JSON))
        }
        Output::Metadata(mv) => {
            let encode = move |obj| to_vec(&partial_metadata(obj, mv));
            let (list, rest) = res.list_encoded(ns, version, params, encode).await?;
            let head = vec![
                ("apiVersion", Value::String(format!("meta.k8s.io/{mv}"))),
                ("kind", Value::String("PartialObjectMetadataList".into())),
                ("metadata", list_meta(&list)),
            ];
            Ok(list_answer(head, "items", list, rest, JSON))
        }
        Output::Table(mv) => {
            let include = IncludeObject::parse(q.include_object.as_deref())?;
            let (of, now) = (res.clone(), chrono::Utc::now());
            let encode = move |obj| to_vec(&table::row(of.strategy.as_ref(), obj, include, mv, now));
            let (list, rest) = res.list_encoded(ns, version, params, encode).await?;
            let head = table_head(res, mv, list_meta(&list));
            Ok(list_answer(head, "rows", list, rest, content_type_for(out)))
        }
        Output::Protobuf | Output::Yaml => Err(ApiError::internal("a parsed list answer is JSON")),
    }
}

/// The fields of a Table answer before its rows.
fn table_head(res: &Resource, mv: &str, meta: Value) -> Vec<(&'static str, Value)> {
    vec![
        ("kind", Value::String("Table".into())),
        ("apiVersion", Value::String(format!("meta.k8s.io/{mv}"))),
        ("metadata", meta),
        ("columnDefinitions", Value::Array(table::column_definitions(res.strategy.as_ref()))),
    ]
}

/// A JSON list answer of `head` and the items `list` holds and `rest` brings: whole when there is no rest.
fn list_answer(
    head: Vec<(&str, Value)>,
    array: &str,
    list: ListOut<RawObject>,
    rest: Option<ListRest<RawObject>>,
    content_type: &'static str,
) -> Response {
    match rest {
        None => raw_response(&head, array, &list.items, content_type),
        Some(rest) => streamed_response(&head, array, list.items, rest, content_type),
    }
}

/// A LIST in protobuf, written as it is read. The answer's envelope gives the list message's length before the
/// items, so a list answered while it is read is read twice at its revision: first to count the items' bytes,
/// then to write them.
pub(super) async fn protobuf_list(
    res: &Arc<Resource>,
    ns: Option<&str>,
    version: &str,
    params: &ListParams,
) -> ApiResult<Response> {
    let kind = proto_kind(res)?;
    let info = res.strategy.info();
    let api_version = info.api_version(version);
    let encode = move |obj: Value| kind.list_item(&obj);
    let (list, rest) = res.list_encoded(ns, version, params, encode).await?;
    let meta = list_meta(&list);
    let mut items_len: usize = list.items.iter().map(|i| i.0.len()).sum();
    let Some(mut rest) = rest else {
        let mut body = protobuf::list_head(kind, &api_version, info.list_kind, &meta, items_len)?;
        list.items.iter().for_each(|i| body.extend_from_slice(&i.0));
        body.extend_from_slice(&protobuf::list_tail());
        return Ok(bytes_response(StatusCode::OK, body, PROTOBUF, &[]));
    };
    while let Some(item) = rest.recv().await {
        items_len += item?.0.len();
    }
    let exact = ListParams {
        resource_version: Some(list.revision.to_string()),
        resource_version_match: Some("Exact".into()),
        ..params.clone()
    };
    let (again, rest) = res.list_encoded(ns, version, &exact, encode).await?;
    let start = protobuf::list_head(kind, &api_version, info.list_kind, &meta, items_len)?;
    let rest = rest.unwrap_or_else(|| tokio::sync::mpsc::channel(1).1);
    let framing = Framing { separator: b"", first: true, tail: protobuf::list_tail() };
    Ok(stream_items(start, Items { first: again.items.into_iter(), rest }, framing, PROTOBUF))
}

/// `{<head fields>, "<array>": [<items as they are>]}`.
pub(super) fn raw_response(
    head: &[(&str, Value)],
    array: &str,
    items: &[RawObject],
    content_type: &'static str,
) -> Response {
    let size: usize = items.iter().map(|i| i.0.len() + 1).sum();
    let mut body = Vec::with_capacity(size + 1024);
    write_head(&mut body, head, array, items);
    body.extend_from_slice(b"]}");
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
    r
}

/// `{<head fields>, "<array>":[<items>` of a list answer, its items separated by commas.
fn write_head(body: &mut Vec<u8>, head: &[(&str, Value)], array: &str, items: &[RawObject]) {
    body.push(b'{');
    for (key, value) in head {
        let _ = serde_json::to_writer(&mut *body, key);
        body.push(b':');
        let _ = serde_json::to_writer(&mut *body, value);
        body.push(b',');
    }
    let _ = serde_json::to_writer(&mut *body, array);
    body.extend_from_slice(b":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&item.0);
    }
}

/// Bytes of a streamed list answer sent at a time (once that many are read; less when the store is slower than the
/// client).
const STREAM_CHUNK: usize = 64 * 1024;

/// [`raw_response`] whose items after `first` come from `rest` while the answer is sent, in chunks of about
/// [`STREAM_CHUNK`]: the same bytes, never the whole answer in memory. A slow client slows the reading of `rest`.
/// An error after the first items (the store failed, an object cannot be read) can no longer be a Status: the answer
/// is cut off, which the client sees as a broken response, and the error is logged.
fn streamed_response(
    head: &[(&str, Value)],
    array: &str,
    first: Vec<RawObject>,
    rest: ListRest<RawObject>,
    content_type: &'static str,
) -> Response {
    let mut start = Vec::with_capacity(1024);
    write_head(&mut start, head, array, &[]);
    let framing = Framing { separator: b",", first: true, tail: b"]}".to_vec() };
    stream_items(start, Items { first: first.into_iter(), rest }, framing, content_type)
}

/// How a streamed answer joins its items and ends.
struct Framing {
    /// Written between two items.
    separator: &'static [u8],
    /// No item was written yet (none goes before the next).
    first: bool,
    /// Written after the last item.
    tail: Vec<u8>,
}

/// The items of a streamed answer: those read before it began, then those read while it is sent.
struct Items {
    first: std::vec::IntoIter<RawObject>,
    rest: ListRest<RawObject>,
}

impl Items {
    async fn next(&mut self) -> Option<ApiResult<RawObject>> {
        match self.first.next() {
            Some(item) => Some(Ok(item)),
            None => self.rest.recv().await,
        }
    }

    /// The next item if it is there already; `Ok(None)` at the end.
    fn ready(&mut self) -> Result<Option<ApiResult<RawObject>>, ()> {
        match self.first.next() {
            Some(item) => Ok(Some(Ok(item))),
            None => match self.rest.try_recv() {
                Ok(item) => Ok(Some(item)),
                Err(TryRecvError::Empty) => Err(()),
                Err(TryRecvError::Disconnected) => Ok(None),
            },
        }
    }
}

/// An answer of `start`, then the items as they come, then the framing's tail (see [`streamed_response`]).
fn stream_items(start: Vec<u8>, items: Items, framing: Framing, content_type: &'static str) -> Response {
    let chunks = futures::stream::unfold((items, framing, false), |(mut items, mut framing, done)| async move {
        if done {
            return None;
        }
        let mut chunk = Vec::new();
        let mut next = items.next().await;
        loop {
            match next {
                None => {
                    chunk.extend_from_slice(&framing.tail);
                    return Some((Ok(Bytes::from(chunk)), (items, framing, true)));
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "a streamed list answer is cut off");
                    return Some((Err(std::io::Error::other(e.to_string())), (items, framing, true)));
                }
                Some(Ok(item)) => {
                    if !framing.first {
                        chunk.extend_from_slice(framing.separator);
                    }
                    framing.first = false;
                    chunk.extend_from_slice(&item.0);
                }
            }
            if chunk.len() >= STREAM_CHUNK {
                return Some((Ok(Bytes::from(chunk)), (items, framing, false)));
            }
            next = match items.ready() {
                Ok(next) => next,
                Err(()) => return Some((Ok(Bytes::from(chunk)), (items, framing, false))),
            };
        }
    });
    // Each chunk waits its turn behind the runtime's other tasks: with one worker thread, an answer of megabytes
    // written in one go would hold every other request (a GET) for its whole length.
    let chunks = chunks.then(|chunk| async move {
        tokio::task::yield_now().await;
        chunk
    });
    let body = futures::stream::once(std::future::ready(Ok(Bytes::from(start)))).chain(chunks);
    let mut r = (StatusCode::OK, Body::from_stream(body)).into_response();
    r.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
    r
}

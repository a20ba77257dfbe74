//! A watch as a stream of newline-delimited events: objects as JSON, Tables or PartialObjectMetadata, bookmarks,
//! and the ERROR event that ends a failed watch; it ends at its timeout or when the client goes away. Kinds with a
//! protobuf form are also watched in protobuf: length-delimited WatchEvent frames (see `super::protobuf`).

use super::negotiate::{negotiate_for, Forms, Output};
use super::protobuf::{self, ProtoKind, PROTOBUF_WATCH};
use super::query::QueryParams;
use super::render::content_type_for;
use super::table::{self, partial_metadata, table, IncludeObject};
use super::AppState;
use crate::error::{ApiError, ApiResult};
use crate::registry::{Resource, WatchOut, WatchParams};
use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

pub(super) async fn watch(
    st: &Arc<AppState>,
    res: &Arc<Resource>,
    ns: Option<&str>,
    version: &str,
    q: &QueryParams,
    accept: Option<&str>,
) -> ApiResult<Response> {
    let proto_kind = ProtoKind::of(res.strategy.info());
    let forms = if proto_kind.is_some() { Forms::BUILT_IN.streaming() } else { Forms::default() };
    let out = negotiate_for(accept, true, forms)?;
    let include = IncludeObject::parse(q.include_object.as_deref())?;
    let lp = q.list_params(res.strategy.field_labels())?;
    let send_initial = q.send_initial_events;
    let params = WatchParams {
        label_selector: lp.label_selector,
        field_selector: lp.field_selector,
        resource_version: lp.resource_version,
        resource_version_match: lp.resource_version_match,
        send_initial_events: send_initial,
        allow_bookmarks: q.allow_watch_bookmarks,
        bookmark_interval: st.bookmark_interval,
    };
    let timeout = match q.timeout_seconds.filter(|s| *s != 0) {
        // A negative lifetime ends the watch at once, as kube-apiserver's timer does.
        Some(s) => Duration::from_secs(u64::try_from(s).unwrap_or(0)),
        // kube-apiserver spreads watch lifetimes over [minRequestTimeout, 2*minRequestTimeout).
        None => Duration::from_secs(1800 + u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 7),
    };
    let rx = res.watch(ns, version, params).await?;
    let res = res.clone();
    let info = res.strategy.info();
    let api_version = info.api_version(version);
    // A client may ask for any lifetime; one past what the clock can represent is a watch without end.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    struct S {
        rx: tokio::sync::mpsc::Receiver<WatchOut>,
        first: bool,
        done: bool,
    }
    let stream = futures::stream::unfold(S { rx, first: true, done: false }, move |mut s| {
        let res = res.clone();
        let api_version = api_version.clone();
        async move {
            if s.done {
                return None;
            }
            let item = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, s.rx.recv()).await.ok().flatten()?,
                None => s.rx.recv().await?,
            };
            let ev = match item {
                WatchOut::Event { kind, object } => {
                    let object = match out {
                        // YAML is never negotiated for a watch (see `Forms::streaming`).
                        Output::Json | Output::Protobuf | Output::Yaml => object,
                        Output::Metadata(mv) => partial_metadata(object, mv),
                        Output::Table(mv) => {
                            let rv = object.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
                            let t = table(
                                res.strategy.as_ref(),
                                vec![object],
                                include,
                                mv,
                                table::object([("resourceVersion", rv)]),
                                s.first,
                            );
                            s.first = false;
                            t
                        }
                    };
                    table::object([("type", Value::String(kind.into())), ("object", object)])
                }
                WatchOut::Bookmark { revision, initial_events_end } => {
                    let mut meta = json!({"resourceVersion": revision.to_string()});
                    if initial_events_end {
                        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                    }
                    let object = match out {
                        Output::Table(mv) => {
                            json!({"kind": "Table", "apiVersion": format!("meta.k8s.io/{mv}"), "metadata": meta, "columnDefinitions": [], "rows": []})
                        }
                        Output::Metadata(mv) => {
                            json!({"kind": "PartialObjectMetadata", "apiVersion": format!("meta.k8s.io/{mv}"), "metadata": meta})
                        }
                        Output::Json | Output::Protobuf | Output::Yaml => {
                            json!({"kind": res.strategy.info().kind, "apiVersion": api_version, "metadata": meta})
                        }
                    };
                    json!({"type": "BOOKMARK", "object": object})
                }
                WatchOut::Error(e) => {
                    s.done = true;
                    json!({"type": "ERROR", "object": e.status()})
                }
            };
            let encoded = match proto_kind.filter(|_| out == Output::Protobuf) {
                Some(kind) => protobuf::watch_frame(kind, res.strategy.info(), &ev).unwrap_or_else(|e| {
                    // An event that cannot be written ends the watch, as any failed watch ends.
                    s.done = true;
                    let error = json!({"type": "ERROR", "object": e.status()});
                    protobuf::watch_frame(kind, res.strategy.info(), &error).unwrap_or_default()
                }),
                None => {
                    let mut line = serde_json::to_vec(&ev).unwrap_or_default();
                    line.push(b'\n');
                    line
                }
            };
            Some((Ok::<_, std::convert::Infallible>(Bytes::from(encoded)), s))
        }
    });
    // A panic while an event is encoded ends the watch with an ERROR event, as any failed watch ends, instead of
    // taking the connection down unannounced.
    let stream =
        futures::StreamExt::map(futures::StreamExt::catch_unwind(std::panic::AssertUnwindSafe(stream)), |item| {
            item.unwrap_or_else(|_| {
                tracing::error!("a watch stream panicked while encoding an event");
                let status = ApiError::internal("the server could not encode a watch event").status();
                let mut line = serde_json::to_vec(&json!({"type": "ERROR", "object": status})).unwrap_or_default();
                line.push(b'\n');
                Ok(Bytes::from(line))
            })
        });
    let mut r = Response::new(Body::from_stream(stream));
    let content_type = if out == Output::Protobuf { PROTOBUF_WATCH } else { content_type_for(out) };
    r.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
    // Ends when the server shuts down, as kube-apiserver's watches do (see `serve`).
    r.extensions_mut().insert(super::serve::LongRunning);
    Ok(r)
}

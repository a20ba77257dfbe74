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
use crate::registry::{Resource, WatchEventType, WatchOut, WatchParams};
use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// One event as a watch writes it (in JSON, `{"object", "type"}`: the keys in serde_json's order).
#[derive(serde::Serialize)]
struct Event {
    object: Value,
    #[serde(rename = "type")]
    kind: WatchEventType,
}

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
    let params = WatchParams {
        label_selector: lp.label_selector,
        field_selector: lp.field_selector,
        resource_version: lp.resource_version,
        resource_version_match: lp.resource_version_match,
        send_initial_events: q.send_initial_events,
        allow_bookmarks: q.allow_watch_bookmarks,
        bookmark_interval: st.bookmark_interval,
    };
    let timeout = lifetime(q.timeout_seconds);
    let rx = res.watch(ns, version, params).await?;
    let encoder = Encoder {
        res: res.clone(),
        api_version: res.strategy.info().api_version(version),
        out,
        include,
        proto_kind: proto_kind.filter(|_| out == Output::Protobuf),
        first: true,
    };
    // A client may ask for any lifetime; one past what the clock can represent is a watch without end.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    struct S {
        rx: tokio::sync::mpsc::Receiver<WatchOut>,
        encoder: Encoder,
        done: bool,
    }
    let stream = futures::stream::unfold(S { rx, encoder, done: false }, move |mut s| async move {
        if s.done {
            return None;
        }
        let item = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, s.rx.recv()).await.ok().flatten()?,
            None => s.rx.recv().await?,
        };
        let (encoded, last) = s.encoder.encode(item);
        s.done = last;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(encoded)), s))
    });
    // A panic while an event is encoded ends the watch with an ERROR event, as any failed watch ends, instead of
    // taking the connection down unannounced.
    let stream =
        futures::StreamExt::map(futures::StreamExt::catch_unwind(std::panic::AssertUnwindSafe(stream)), |item| {
            item.unwrap_or_else(|_| {
                tracing::error!("a watch stream panicked while encoding an event");
                let status = ApiError::internal("the server could not encode a watch event").status();
                Ok(Bytes::from(json_line(&Event { object: status, kind: WatchEventType::Error })))
            })
        });
    let mut r = Response::new(Body::from_stream(stream));
    let content_type = if out == Output::Protobuf { PROTOBUF_WATCH } else { content_type_for(out) };
    r.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
    // Ends when the server shuts down, as kube-apiserver's watches do (see `serve`).
    r.extensions_mut().insert(super::serve::LongRunning);
    Ok(r)
}

/// How long a watch lasts: `timeoutSeconds` (a negative one ends the watch at once, as kube-apiserver's timer
/// does), else a lifetime spread over [minRequestTimeout, 2*minRequestTimeout) as kube-apiserver spreads them.
fn lifetime(timeout_seconds: Option<i64>) -> Duration {
    match timeout_seconds.filter(|s| *s != 0) {
        Some(s) => Duration::from_secs(u64::try_from(s).unwrap_or(0)),
        None => Duration::from_secs(1800 + u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 7),
    }
}

fn json_line(event: &Event) -> Vec<u8> {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Writes a watch's events in the form the client negotiated.
struct Encoder {
    res: Arc<Resource>,
    api_version: String,
    out: Output,
    include: IncludeObject,
    /// Set when the watch is written in protobuf.
    proto_kind: Option<ProtoKind>,
    /// Whether the next Table is the first (the only one with column definitions).
    first: bool,
}

impl Encoder {
    /// The bytes of one event, and whether it ends the watch.
    fn encode(&mut self, item: WatchOut) -> (Vec<u8>, bool) {
        let (event, mut last) = match item {
            WatchOut::Event { kind, object } => (Event { object: self.object(object), kind }, false),
            WatchOut::Bookmark { revision, initial_events_end } => {
                (Event { object: self.bookmark(revision, initial_events_end), kind: WatchEventType::Bookmark }, false)
            }
            WatchOut::Error(e) => (Event { object: e.status(), kind: WatchEventType::Error }, true),
        };
        let Some(kind) = self.proto_kind else { return (json_line(&event), last) };
        let info = self.res.strategy.info();
        let frame = protobuf::watch_frame(kind, info, event.kind, &event.object).unwrap_or_else(|e| {
            // An event that cannot be written ends the watch, as any failed watch ends.
            last = true;
            protobuf::watch_frame(kind, info, WatchEventType::Error, &e.status()).unwrap_or_default()
        });
        (frame, last)
    }

    /// An event's object in the negotiated form.
    fn object(&mut self, object: Value) -> Value {
        match self.out {
            // YAML is never negotiated for a watch (see `Forms::streaming`).
            Output::Json | Output::Protobuf | Output::Yaml => object,
            Output::Metadata(mv) => partial_metadata(object, mv),
            Output::Table(mv) => {
                let rv = object.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
                let list_meta = table::object([("resourceVersion", rv)]);
                let t = table(self.res.strategy.as_ref(), vec![object], self.include, mv, list_meta, self.first);
                self.first = false;
                t
            }
        }
    }

    /// A bookmark's object: the negotiated kind, with only a resourceVersion (and the end of the initial events).
    fn bookmark(&self, revision: u64, initial_events_end: bool) -> Value {
        let mut meta = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        match self.out {
            Output::Table(mv) => {
                json!({"kind": "Table", "apiVersion": format!("meta.k8s.io/{mv}"), "metadata": meta, "columnDefinitions": [], "rows": []})
            }
            Output::Metadata(mv) => {
                json!({"kind": "PartialObjectMetadata", "apiVersion": format!("meta.k8s.io/{mv}"), "metadata": meta})
            }
            Output::Json | Output::Protobuf | Output::Yaml => {
                json!({"kind": self.res.strategy.info().kind, "apiVersion": self.api_version, "metadata": meta})
            }
        }
    }
}

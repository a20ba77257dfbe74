//! The scheduler's Event recorder, modelled on client-go's `k8s.io/client-go/tools/events` (event_recorder.go
//! `makeEvent`, event_broadcaster.go `recordToSink`/`recordEvent`/`attemptRecording`, kubernetes master): it writes
//! events.k8s.io/v1 Events through a Kubernetes client, to the target (this server standalone, the cluster's
//! kube-apiserver in cluster mode, where our APIService serves no events).
//!
//! Recording never blocks and never fails the caller: [`EventRecorder::record`] puts the event into a bounded queue
//! (upstream's broadcaster drops when its 1000 queued events are full, and so do we, counting and logging the
//! drops); one background task deduplicates ([`series`]) and writes. A write that got no answer is tried again
//! every 10 to 12.5 seconds, up to 12 times; one the server refused is dropped and logged, as upstream's.

pub mod series;

use crate::scheduler::managers;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use series::SeriesCache;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// The reportingController of our events; reportingInstance is `<controller>-<hostname>`, as upstream's
/// `NewRecorder`.
pub const REPORTING_CONTROLLER: &str = "migration-apiserver";
/// Upstream's `maxQueuedEvents`.
const MAX_QUEUED_EVENTS: usize = 1000;
/// Upstream's `maxTriesPerEvent` and `defaultSleepDuration`.
const MAX_TRIES_PER_EVENT: u32 = 12;
const SLEEP_BETWEEN_TRIES: Duration = Duration::from_secs(10);
/// kube-apiserver's validation limits (pkg/apis/core/validation/events.go): longer values are refused.
const NOTE_LENGTH_LIMIT: usize = 1024;
const FIELD_LENGTH_LIMIT: usize = 128;

/// An Event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// A reference to `object` for an Event's `regarding`. Without resourceVersion, unlike client-go's
/// `reference.GetReference`: our objects change with every progress save, and a reference carrying the
/// resourceVersion would make every repetition (a retry) its own Event instead of a series.
pub fn reference_to<K: kube::Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    let mut reference = object.object_ref(&());
    reference.resource_version = None;
    reference
}

/// Records Events; cheap to clone. Dropping every clone ends the writer once it has written what is queued.
#[derive(Clone)]
pub struct EventRecorder {
    queue: mpsc::Sender<Event>,
    controller: String,
    instance: String,
    dropped: Arc<AtomicU64>,
}

impl EventRecorder {
    /// A recorder writing through `client`, and its writer task.
    pub fn spawn(client: kube::Client) -> (EventRecorder, tokio::task::JoinHandle<()>) {
        let (queue, incoming) = mpsc::channel(MAX_QUEUED_EVENTS);
        let instance = truncate(&format!("{REPORTING_CONTROLLER}-{}", hostname()), FIELD_LENGTH_LIMIT);
        let recorder = EventRecorder {
            queue,
            controller: REPORTING_CONTROLLER.to_string(),
            instance,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        (recorder, tokio::spawn(write_events(client, incoming)))
    }

    /// Records an event about `regarding` (upstream's `Eventf`): never waits; a full queue drops the event.
    pub fn record(&self, regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: &str) {
        let event = make_event(regarding, type_, reason, action, note, &self.controller, &self.instance, now());
        if let Err(e) = self.queue.try_send(event) {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let why = match e {
                mpsc::error::TrySendError::Full(_) => "too many queued events",
                mpsc::error::TrySendError::Closed(_) => "the event writer has stopped",
            };
            tracing::warn!(reason, regarding = ?regarding.name, dropped, "unable to record event: {why}; dropped");
        }
    }
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// kube-scheduler's `truncateMessage`: at most `max` bytes, the cut marked with " ...".
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    const SUFFIX: &str = " ...";
    let mut end = max - SUFFIX.len();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{SUFFIX}", &s[..end])
}

/// Upstream's `makeEvent`: named `<regarding.name>.<unix nanoseconds in hex>`, in the regarding object's namespace
/// or `default` for a cluster-scoped one.
#[allow(clippy::too_many_arguments)]
fn make_event(
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
    controller: &str,
    instance: &str,
    now: Timestamp,
) -> Event {
    let name = regarding.name.as_deref().unwrap_or_default();
    let namespace = regarding.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        reporting_controller: Some(controller.to_string()),
        reporting_instance: Some(instance.to_string()),
        action: Some(truncate(action, FIELD_LENGTH_LIMIT)),
        reason: Some(truncate(reason, FIELD_LENGTH_LIMIT)),
        regarding: Some(regarding.clone()),
        note: Some(truncate(note, NOTE_LENGTH_LIMIT)),
        type_: Some(type_.as_str().to_string()),
        ..Default::default()
    }
}

/// The writer: deduplicates incoming events, ends and refreshes series on upstream's clock, and writes each
/// Event in its own task (a server that does not answer delays only that Event).
async fn write_events(client: kube::Client, mut incoming: mpsc::Receiver<Event>) {
    let mut cache = SeriesCache::default();
    let mut writes = JoinSet::new();
    let start = tokio::time::Instant::now();
    let mut finish = tokio::time::interval_at(start + series::FINISH_TIME, series::FINISH_TIME);
    let mut heartbeat = tokio::time::interval_at(start + series::REFRESH_TIME, series::REFRESH_TIME);
    loop {
        let to_write = tokio::select! {
            event = incoming.recv() => match event {
                Some(event) => cache.observe(event, now()).into_iter().collect(),
                None => break,
            },
            _ = finish.tick() => cache.finish(now()),
            _ = heartbeat.tick() => cache.heartbeat(),
            Some(_) = writes.join_next(), if !writes.is_empty() => Vec::new(),
        };
        for event in to_write {
            writes.spawn(attempt_recording(client.clone(), event));
        }
    }
    while writes.join_next().await.is_some() {}
}

/// What became of one write.
#[derive(Debug, PartialEq)]
enum Recorded {
    Done,
    /// Refused, or not worth retrying: logged and dropped.
    Dropped,
    /// Try again later.
    Retry(String),
}

/// Upstream's `attemptRecording`: up to 12 tries, 10 to 12.5 seconds apart (`wait.Jitter(10s, 0.25)`, so that
/// many writers do not retry in step).
async fn attempt_recording(client: kube::Client, event: Event) {
    for tries in 1..=MAX_TRIES_PER_EVENT {
        let why = match record_event(&client, &event).await {
            Recorded::Done | Recorded::Dropped => return,
            Recorded::Retry(why) => why,
        };
        if tries == MAX_TRIES_PER_EVENT {
            tracing::warn!(event = ?event.metadata.name, error = %why, "unable to write event (retry limit exceeded)");
            return;
        }
        let jitter = uuid::Uuid::new_v4().as_u128() as f64 / u128::MAX as f64;
        let delay = SLEEP_BETWEEN_TRIES.mul_f64(1.0 + 0.25 * jitter);
        tracing::debug!(event = ?event.metadata.name, error = %why, ?delay, "unable to write event; retrying");
        tokio::time::sleep(delay).await;
    }
}

/// Upstream's `recordEvent`: a series is patched (created when its Event is gone), any other Event created.
async fn record_event(client: &kube::Client, event: &Event) -> Recorded {
    let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let name = event.metadata.name.as_deref().unwrap_or_default();
    if let Some(series) = &event.series {
        // Upstream sends this as a strategic merge patch of `series` alone; as a JSON merge patch it means the
        // same, and every server we write to accepts it.
        let patch = serde_json::json!({"series": series});
        match api.patch(name, &managers::patch(managers::EVENTS), &Patch::Merge(&patch)).await {
            Ok(_) => return Recorded::Done,
            Err(e) if status_code(&e) == Some(404) => {}
            Err(e) => return classify(e, true),
        }
    }
    let mut create = event.clone();
    create.metadata.resource_version = None;
    match api.create(&managers::post(managers::EVENTS), &create).await {
        Ok(_) => Recorded::Done,
        Err(e) => classify(e, event.series.is_some()),
    }
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Upstream's error handling of `recordEvent`: any answer of the server is final (the same request would get
/// it again), except AlreadyExists to the create of a series, which lost the race against the create of its
/// first Event (patch again); no answer at all (transport errors) retries.
fn classify(e: kube::Error, series: bool) -> Recorded {
    match &e {
        kube::Error::Api(s) if series && s.reason == "AlreadyExists" => Recorded::Retry(e.to_string()),
        kube::Error::Api(s) if s.reason == "AlreadyExists" => {
            tracing::debug!(error = %e, "server rejected event (will not retry)");
            Recorded::Dropped
        }
        kube::Error::Api(_) => {
            tracing::warn!(error = %e, "server rejected event (will not retry)");
            Recorded::Dropped
        }
        _ => Recorded::Retry(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_named_and_placed_as_upstream_makes_them() {
        let regarding = ObjectReference {
            api_version: Some("migration.k8s.io/v1alpha1".into()),
            kind: Some("StorageVersionMigration".into()),
            name: Some("deployments.apps-x7".into()),
            uid: Some("u1".into()),
            ..Default::default()
        };
        let t = Timestamp::from_nanosecond(1_700_000_000_123_456_789).expect("time");
        let long = "é".repeat(1000);
        let e = make_event(&regarding, EventType::Warning, "MigrationRetrying", "Migrate", &long, "c", "c-h", t);
        assert_eq!(e.metadata.name.as_deref(), Some("deployments.apps-x7.17979cfe3d85cd15"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"), "cluster-scoped: default");
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!((e.reporting_controller.as_deref(), e.reporting_instance.as_deref()), (Some("c"), Some("c-h")));
        let note = e.note.expect("note");
        assert!(note.len() <= NOTE_LENGTH_LIMIT && note.ends_with(" ..."), "{}", note.len());
        assert_eq!(e.event_time, Some(MicroTime(t)));
        let namespaced = ObjectReference { namespace: Some("ns1".into()), ..regarding };
        let e = make_event(&namespaced, EventType::Normal, "R", "A", "n", "c", "c-h", t);
        assert_eq!((e.metadata.namespace.as_deref(), e.type_.as_deref()), (Some("ns1"), Some("Normal")));
        assert_eq!(e.note.as_deref(), Some("n"));
    }

    /// A request the fake API server saw: method, path, content type, body.
    type Seen = Arc<std::sync::Mutex<Vec<(String, String, String, serde_json::Value)>>>;

    /// A client of a fake API server answering with `codes` in turn (0: no answer), and what it was sent.
    fn fake_api(codes: &[u16]) -> (kube::Client, Seen) {
        let seen = Seen::default();
        let codes = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(codes.to_vec())));
        let log = seen.clone();
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let (log, codes) = (log.clone(), codes.clone());
            async move {
                let (parts, body) = req.into_parts();
                let body = http_body_util::BodyExt::collect(body).await.expect("body").to_bytes();
                let content_type = parts.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
                let sent = serde_json::from_slice(&body).unwrap_or_default();
                log.lock().expect("log").push((
                    parts.method.to_string(),
                    parts.uri.path().to_string(),
                    content_type.to_string(),
                    sent,
                ));
                let code = codes.lock().expect("codes").pop_front().unwrap_or(200);
                let answer = match code {
                    0 => return Err(std::io::Error::other("connection reset")),
                    200..=299 => serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                        "metadata": {"name": "e"}}),
                    409 => serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "AlreadyExists", "code": 409, "message": "already exists"}),
                    _ => serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": code, "message": "refused"}),
                };
                let response = axum::http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(answer.to_string()))
                    .expect("response");
                Ok::<_, std::io::Error>(response)
            }
        });
        (kube::Client::new(service, "default"), seen)
    }

    fn recorded_event(series: Option<i32>) -> Event {
        let regarding = ObjectReference { name: Some("m".into()), ..Default::default() };
        let t = Timestamp::from_second(1_700_000_000).expect("time");
        let mut e = make_event(&regarding, EventType::Warning, "MigrationRetrying", "Migrate", "503", "c", "c-h", t);
        e.series =
            series.map(|count| k8s_openapi::api::events::v1::EventSeries { count, last_observed_time: MicroTime(t) });
        e
    }

    fn requests(seen: &Seen) -> Vec<(String, String, String)> {
        seen.lock().expect("log").iter().map(|(m, p, c, _)| (m.clone(), p.clone(), c.clone())).collect()
    }

    #[tokio::test]
    async fn a_new_event_is_created_and_a_refusal_is_final() {
        let (client, seen) = fake_api(&[201]);
        assert_eq!(record_event(&client, &recorded_event(None)).await, Recorded::Done);
        let reqs = requests(&seen);
        assert_eq!(reqs.len(), 1);
        assert_eq!(
            (reqs[0].0.as_str(), reqs[0].1.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/default/events")
        );
        let sent = seen.lock().expect("log")[0].3.clone();
        assert_eq!((sent["reason"].as_str(), sent["note"].as_str()), (Some("MigrationRetrying"), Some("503")));
        // Any answer of the server is final: no second request.
        for code in [409, 422, 500] {
            let (client, seen) = fake_api(&[code]);
            assert_eq!(record_event(&client, &recorded_event(None)).await, Recorded::Dropped, "{code}");
            assert_eq!(requests(&seen).len(), 1);
        }
        // No answer at all: retried.
        let (client, _) = fake_api(&[0]);
        assert!(matches!(record_event(&client, &recorded_event(None)).await, Recorded::Retry(_)));
    }

    #[tokio::test]
    async fn a_series_is_a_merge_patch_of_series_and_created_when_its_event_is_gone() {
        let (client, seen) = fake_api(&[200]);
        assert_eq!(record_event(&client, &recorded_event(Some(2))).await, Recorded::Done);
        let path = format!("/apis/events.k8s.io/v1/namespaces/default/events/{}", "m.17979cfe362a0000");
        assert_eq!(requests(&seen), [("PATCH".into(), path.clone(), "application/merge-patch+json".into())]);
        let sent = seen.lock().expect("log")[0].3.clone();
        assert_eq!(
            sent,
            serde_json::json!({"series": {"count": 2, "lastObservedTime": "2023-11-14T22:13:20.000000Z"}})
        );
        // The Event expired (404): created whole, series included.
        let (client, seen) = fake_api(&[404, 201]);
        assert_eq!(record_event(&client, &recorded_event(Some(3))).await, Recorded::Done);
        let reqs = requests(&seen);
        assert_eq!((reqs[0].0.as_str(), reqs[1].0.as_str()), ("PATCH", "POST"));
        assert_eq!(seen.lock().expect("log")[1].3["series"]["count"], 3);
        // The create lost the race against the first create of the Event: patched again later.
        let (client, _) = fake_api(&[404, 409]);
        assert!(matches!(record_event(&client, &recorded_event(Some(2))).await, Recorded::Retry(_)));
    }

    #[test]
    fn truncation_keeps_short_values_and_marks_cuts() {
        assert_eq!(truncate("short", 128), "short");
        let cut = truncate(&"a".repeat(2000), NOTE_LENGTH_LIMIT);
        assert_eq!(cut.len(), NOTE_LENGTH_LIMIT);
        assert!(cut.ends_with("a ..."));
    }
}

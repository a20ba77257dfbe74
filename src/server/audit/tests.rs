//! The stages a real server cannot be made to show on demand: a handler's panic, and batch mode's full queue.

use super::*;
use crate::audit::backend::{Backend, BackendError, BatchConfig, Mode, Sink};
use crate::audit::metrics::AuditMetrics;
use crate::audit::policy::{Policy, PolicyRuleEvaluator};
use axum::routing::get;
use axum::Router;
use std::sync::mpsc;
use std::time::Duration;
use tower::ServiceExt;

/// Keeps the events; `gate` (when set) holds each write until the test lets it go.
struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    gate: Option<Mutex<mpsc::Receiver<()>>>,
}

impl Backend for Recorder {
    fn plugin(&self) -> &'static str {
        "recorder"
    }
    fn process(&self, events: &[Event]) -> Result<(), BackendError> {
        if let Some(gate) = &self.gate {
            let _ = gate.lock().expect("lock").recv();
        }
        self.events.lock().expect("lock").extend_from_slice(events);
        Ok(())
    }
    fn encoded_size(&self, _: &Event) -> usize {
        0
    }
}

fn auditor(mode: Mode, buffer: usize, gate: Option<mpsc::Receiver<()>>) -> (Arc<Auditor>, Arc<Mutex<Vec<Event>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let policy =
        Policy::from_bytes(b"apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata}]").expect("policy");
    let metrics = Arc::new(AuditMetrics::default());
    let batch = BatchConfig { buffer_size: buffer, max_batch_size: 1, max_batch_wait: Duration::ZERO, throttle: None };
    let sink = Sink::new(
        Box::new(Recorder { events: events.clone(), gate: gate.map(Mutex::new) }),
        mode,
        batch,
        None,
        metrics.clone(),
    );
    (Arc::new(Auditor::new(Some(PolicyRuleEvaluator::new(policy)), vec![sink], metrics)), events)
}

/// The chain of `server::router` in small: Audit-ID, panics answered, the audit filter, an authenticated user.
fn app(auditor: Arc<Auditor>) -> Router {
    async fn boom() -> &'static str {
        panic!("boom")
    }
    async fn ok() -> &'static str {
        "ok"
    }
    async fn as_alice(mut req: Request, next: Next) -> Response {
        let alice = UserInfo { name: "alice".into(), ..Default::default() };
        if let Some(rejected) = request_received(&mut req, &alice) {
            return rejected;
        }
        authorized(&req, "");
        next.run(req).await
    }
    Router::new()
        .route("/boom", get(boom))
        .route("/ok", get(ok))
        .layer(axum::middleware::from_fn(as_alice))
        .layer(axum::middleware::from_fn_with_state(auditor, audit))
        .layer(axum::middleware::from_fn(crate::server::answer_panics))
        .layer(axum::middleware::from_fn(audit_id))
}

fn get_req(path: &str) -> Request {
    Request::builder().uri(path).header("audit-id", "the-id").body(axum::body::Body::empty()).expect("request")
}

/// A panicking handler: RequestReceived, then Panic with upstream's status; the client gets the 500 Status and the
/// Audit-Id.
#[tokio::test]
async fn a_panic_is_audited_at_the_panic_stage() {
    let (auditor, events) = auditor(Mode::Blocking, 1, None);
    let resp = app(auditor).oneshot(get_req("/boom")).await.expect("answer");
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.headers().get("audit-id").map(|v| v.as_bytes()), Some(&b"the-id"[..]));
    let events = events.lock().expect("lock").clone();
    let stages: Vec<&str> = events.iter().map(|e| e.stage.as_str()).collect();
    assert_eq!(stages, ["RequestReceived", "Panic"]);
    let line: serde_json::Value = serde_json::from_slice(&events[1].to_json_line(false).expect("json")).expect("json");
    assert_eq!(
        line["responseStatus"],
        serde_json::json!({"metadata": {}, "status": "Failure", "message": "APIServer panic'd: boom", "reason": "InternalError", "code": 500})
    );
    assert_eq!(line["user"]["username"], "alice");
}

/// Batch mode never waits for the backend: with the writer held and the queue full, events are dropped and
/// counted (`plugin="buffered"`), and the request is answered at once.
#[tokio::test]
async fn batch_mode_drops_and_counts_when_its_queue_is_full() {
    let (release, gate) = mpsc::channel();
    let (auditor, events) = auditor(Mode::Batch, 1, Some(gate));
    let app = app(auditor.clone());
    for _ in 0..3 {
        assert_eq!(app.clone().oneshot(get_req("/ok")).await.expect("answer").status(), StatusCode::OK);
    }
    let mut registry = prometheus_client::registry::Registry::default();
    auditor.metrics.register(&mut registry);
    let text = crate::server::exposition::encode(&registry).expect("metrics");
    assert!(text.contains("apiserver_audit_error_total{plugin=\"buffered\"}"), "{text}");
    assert!(text.contains("apiserver_audit_event_total 6"), "{text}");
    // Let the writer go: what was queued is written at shutdown.
    std::thread::spawn(move || while release.send(()).is_ok() {});
    auditor.shutdown(Duration::from_secs(5));
    let written = events.lock().expect("lock").len();
    assert!((1..6).contains(&written), "{written} of 6 events written");
}

//! The webhook backend (`--audit-webhook-*`, k8s.io/apiserver `plugin/pkg/audit/webhook` on `pkg/util/webhook`):
//! each batch is POSTed as one `audit.k8s.io/v1` `EventList` (JSON) to the server a kubeconfig file names, with the
//! kubeconfig's CA, client certificate or token (kube's client, as client-go's rest client is upstream's).
//!
//! A failed POST is tried again, five attempts in all, waiting the initial backoff, then 1.5 times longer each time
//! with up to 20% jitter (`DefaultRetryBackoffWithInitialDelay`). Like upstream's audit webhook (its `retryOnError`)
//! every failure is retried, not only the connection errors, 5xx and 429 that the generic webhook util retries: a
//! receiver that answers 400 or 403 may be fixed meanwhile, and an event given up is lost. Each attempt is bounded
//! by 30 seconds, upstream's request timeout. The events of a batch that still fails are counted in
//! `apiserver_audit_error_total{plugin="webhook"}`.
//!
//! The requests run on a runtime of their own (one thread): in batch mode each batch is a task there, so that a
//! webhook that is down (a minute and more of retries per batch) never holds the server's runtime or the next batch.

use super::{fills_object_ref, Backend, BackendError, Done};
use crate::audit::event::Event;
use axum::http::{header, Request, StatusCode, Uri};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// `pkg/util/webhook`'s `defaultRequestTimeout`: one attempt, the answer's body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// `DefaultRetryBackoffWithInitialDelay`: steps, factor, jitter.
const ATTEMPTS: u32 = 5;
const FACTOR: f64 = 1.5;
const JITTER: f64 = 0.2;
/// What of an error answer's body goes into the error message.
const ERROR_BODY_BYTES: usize = 512;

#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// A kubeconfig: its current context's cluster (server URL, CA) and user (client certificate, token).
    pub config_file: PathBuf,
    /// The wait before the second attempt.
    pub initial_backoff: Duration,
}

pub struct WebhookBackend {
    client: Arc<Client>,
    /// Taken at drop, to be shut down without waiting (the server may drop it from within its own runtime).
    runtime: Option<tokio::runtime::Runtime>,
    started: Arc<InFlight>,
}

struct Client {
    kube: kube::Client,
    /// The server URL's path and query: the base URL that kube joins requests to is the scheme and authority only,
    /// so that the POST goes to exactly the URL configured (not to `<path>/`).
    target: Uri,
    initial_backoff: Duration,
}

impl WebhookBackend {
    /// Reads the kubeconfig and makes the client, as upstream at start: a file that cannot be read or used stops it.
    pub fn load(options: &WebhookOptions) -> anyhow::Result<WebhookBackend> {
        crate::auth::install_default_crypto_provider();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("audit-webhook")
            .enable_all()
            .build()?;
        let (path, backoff) = (options.config_file.clone(), options.initial_backoff);
        let error = match wait_for(runtime.handle(), async move { Client::load(&path, backoff).await }) {
            Some(Ok(client)) => {
                return Ok(WebhookBackend { client: Arc::new(client), runtime: Some(runtime), started: Arc::default() })
            }
            Some(Err(e)) => format!("{e:#}"),
            None => "its runtime stopped".into(),
        };
        // Not dropped: the caller may be in an async context, where dropping a runtime panics.
        runtime.shutdown_background();
        Err(anyhow::anyhow!("initializing audit webhook: {}: {error}", options.config_file.display()))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.as_ref().expect("the runtime is taken only at drop").handle()
    }
}

impl Drop for WebhookBackend {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Runs `fut` on `runtime` and waits for it from this thread (whatever it is: a request's, the batch writer's);
/// None if the runtime stopped first.
fn wait_for<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    fut: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().ok()
}

impl Client {
    async fn load(path: &Path, initial_backoff: Duration) -> anyhow::Result<Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
        let target = match config.cluster_url.path_and_query() {
            Some(pq) => Uri::try_from(pq.as_str())?,
            None => Uri::from_static("/"),
        };
        let mut base = config.cluster_url.clone().into_parts();
        base.path_and_query = Some(axum::http::uri::PathAndQuery::from_static("/"));
        config.cluster_url = Uri::from_parts(base)?;
        // Our own retries only (upstream's backoff); kube's would retry 5xx and 429 again inside each attempt.
        config.default_retry = false;
        let kube = kube::Client::try_from(config)?;
        Ok(Client { kube, target, initial_backoff })
    }

    /// POSTs `body`, retrying as upstream; the last attempt's error when all failed.
    async fn send(&self, body: Bytes) -> Result<(), String> {
        let mut wait = self.initial_backoff;
        let mut attempt = 1;
        loop {
            let error = match tokio::time::timeout(REQUEST_TIMEOUT, self.post(body.clone())).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => format!("no answer within {REQUEST_TIMEOUT:?}"),
            };
            if attempt == ATTEMPTS {
                return Err(error);
            }
            tracing::debug!(attempt, error = %error, "audit webhook: retrying");
            tokio::time::sleep(jittered(wait)).await;
            wait = wait.mul_f64(FACTOR);
            attempt += 1;
        }
    }

    /// One attempt: a 2xx (client-go: 200 to 206) is success.
    async fn post(&self, body: Bytes) -> Result<(), String> {
        let request = Request::post(self.target.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, */*")
            .body(kube::client::Body::from(body))
            .map_err(|e| e.to_string())?;
        let response = self.kube.send(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        if (StatusCode::OK.as_u16()..=StatusCode::PARTIAL_CONTENT.as_u16()).contains(&status.as_u16()) {
            // Read to the end, so that the connection can be used again.
            let _ = response.into_body().collect().await;
            return Ok(());
        }
        let limited = http_body_util::Limited::new(response.into_body(), 64 * 1024);
        let body = limited.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let mut text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_BYTES)]).trim().to_string();
        if text.is_empty() {
            text = "no body".into();
        }
        Err(format!("the server responded with the status code {}: {text}", status.as_u16()))
    }
}

/// `wait` plus up to 20% of it, as `wait.Backoff` jitters.
fn jittered(wait: Duration) -> Duration {
    // A v4 UUID is 122 random bits from the system's generator; no random number crate for one number.
    let random = (uuid::Uuid::new_v4().as_u128() & u128::from(u32::MAX)) as f64 / f64::from(u32::MAX);
    wait + wait.mul_f64(JITTER * random)
}

/// The body of a POST: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[...]}`, as
/// client-go encodes upstream's list (the items without their own kind and apiVersion).
fn encode(events: &[Event]) -> Result<Bytes, BackendError> {
    struct Items<'a>(&'a [Event]);
    impl Serialize for Items<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.0.len()))?;
            for e in self.0 {
                seq.serialize_element(&e.encodable(fills_object_ref(e)).list_item())?;
            }
            seq.end()
        }
    }
    struct List<'a>(&'a [Event]);
    impl Serialize for List<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut st = s.serialize_struct("EventList", 4)?;
            st.serialize_field("kind", "EventList")?;
            st.serialize_field("apiVersion", "audit.k8s.io/v1")?;
            st.serialize_field("metadata", &serde_json::Map::new())?;
            st.serialize_field("items", &Items(self.0))?;
            st.end()
        }
    }
    serde_json::to_vec(&List(events))
        .map(Bytes::from)
        .map_err(|e| BackendError { lost: events.len(), error: e.to_string() })
}

impl Backend for WebhookBackend {
    fn plugin(&self) -> &'static str {
        "webhook"
    }

    fn process(&self, events: &[Event]) -> Result<(), BackendError> {
        let body = encode(events)?;
        let client = self.client.clone();
        let outcome = wait_for(self.handle(), async move { client.send(body).await })
            .unwrap_or_else(|| Err("the audit webhook is shut down".into()));
        outcome.map_err(|error| BackendError { lost: events.len(), error })
    }

    fn encoded_size(&self, event: &Event) -> usize {
        // As the log measures it: the event on its own (upstream's truncate plugin encodes each event alone too).
        event.to_json_line(fills_object_ref(event)).map_or(usize::MAX, |l| l.len() - 1)
    }

    fn remote(&self) -> bool {
        true
    }

    fn start(&self, events: Vec<Event>, done: Done) {
        let lost = events.len();
        let body = match encode(&events) {
            Ok(b) => b,
            Err(e) => return done(Err(e)),
        };
        drop(events);
        let client = self.client.clone();
        let ticket = InFlight::enter(&self.started);
        self.handle().spawn(async move {
            let outcome = client.send(body).await;
            done(outcome.map_err(|error| BackendError { lost, error }));
            drop(ticket);
        });
    }

    fn wait_started(&self, deadline: Instant) {
        self.started.wait_idle(deadline);
    }
}

/// The batches started and not yet done, for the shutdown to wait for.
#[derive(Default)]
struct InFlight {
    count: Mutex<usize>,
    idle: Condvar,
}

struct Ticket(Arc<InFlight>);

impl InFlight {
    fn enter(this: &Arc<InFlight>) -> Ticket {
        *this.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Ticket(this.clone())
    }

    fn wait_idle(&self, deadline: Instant) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *count > 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return };
            count = self.idle.wait_timeout(count, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        *self.0.count.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.idle.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_by_half_with_up_to_a_fifth_of_jitter() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(10));
            assert!(d >= Duration::from_secs(10) && d <= Duration::from_secs(12), "{d:?}");
        }
        assert_eq!(Duration::from_secs(10).mul_f64(FACTOR), Duration::from_secs(15));
    }

    #[test]
    fn batches_are_event_lists_whose_items_carry_no_type() {
        let event = Event::for_tests(crate::audit::policy::Level::Metadata, "id-1", "/healthz");
        let body = encode(&[event.clone(), event]).expect("encode");
        let list: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(list["kind"], "EventList");
        assert_eq!(list["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(list["metadata"], serde_json::json!({}));
        let items = list["items"].as_array().expect("items");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["auditID"], "id-1");
        assert!(items[0].get("kind").is_none() && items[0].get("apiVersion").is_none(), "{}", items[0]);
    }
}

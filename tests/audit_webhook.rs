//! The audit webhook backend against the real binary: a receiver of our own over HTTPS (its own CA, a token) gets
//! the EventList batches; a webhook that is down never slows batch mode (its losses counted), and fails the
//! requests of blocking-strict. The receiver's batches and `/metrics` are polled with a deadline: never a sleep.

mod common;
use common::requests::{call, Resp};
use common::*;

use axum::http::Method;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use migration_apiserver::auth::certs::{issue_serving_cert, CertAuthority};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SS: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";
const WEBHOOK_TOKEN: &str = "audit-webhook-token";
/// Nothing of the probes (the test's readiness polls, its metric scrapes); Metadata for the rest.
const POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n\
    - {level: None, nonResourceURLs: [/readyz, /healthz, /livez, /metrics]}\n- {level: Metadata}\n";

/// One POST the receiver got.
#[derive(Clone, Debug)]
struct Post {
    path: String,
    authorization: String,
    content_type: String,
    body: Value,
    /// The code it was answered.
    code: u16,
}

/// An HTTPS receiver of audit batches with a CA of its own, on its own thread and runtime. It answers the first
/// POSTs with the codes of `fail_first`, then 200.
struct Receiver {
    port: u16,
    ca_pem: String,
    posts: Arc<Mutex<Vec<Post>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start(fail_first: Vec<u16>) -> Receiver {
        migration_apiserver::auth::tls::install_default_crypto_provider();
        let ca = CertAuthority::generate("audit-receiver-ca").expect("CA");
        let (cert, key) = issue_serving_cert(&ca, &["127.0.0.1".to_string()]).expect("serving cert");
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert.as_bytes()).map(|c| c.expect("cert")).collect();
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let mut tls = rustls::ServerConfig::builder_with_provider(migration_apiserver::auth::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let posts = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(fail_first.into_iter()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let recorded = posts.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let accept = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else { continue };
                        let (acceptor, recorded, script) = (acceptor.clone(), recorded.clone(), script.clone());
                        tokio::spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else { return };
                            let service =
                                hyper::service::service_fn(move |req| receive(req, recorded.clone(), script.clone()));
                            let io = hyper_util::rt::TokioIo::new(tls);
                            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
            });
        });
        Receiver { port, ca_pem: ca.cert_pem().to_string(), posts, stop: Some(stop_tx), thread: Some(thread) }
    }

    fn posts(&self) -> Vec<Post> {
        self.posts.lock().expect("lock").clone()
    }

    /// The events of the batches answered 200, in order.
    fn events(&self) -> Vec<Value> {
        let posts = self.posts().into_iter().filter(|p| p.code == 200);
        posts.flat_map(|p| p.body["items"].as_array().cloned().unwrap_or_default()).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Script = Arc<Mutex<std::vec::IntoIter<u16>>>;

async fn receive(
    req: hyper::Request<hyper::body::Incoming>,
    recorded: Arc<Mutex<Vec<Post>>>,
    script: Script,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let (path, authorization, content_type) =
        (req.uri().path().to_string(), header("authorization"), header("content-type"));
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let code = script.lock().expect("lock").next().unwrap_or(200);
    recorded.lock().expect("lock").push(Post { path, authorization, content_type, body, code });
    let resp = hyper::Response::builder().status(code).body(Full::new(Bytes::from_static(b"{}"))).expect("response");
    Ok(resp)
}

/// A kubeconfig naming `server` (with the CA in a file beside it, by a relative path, as kubeconfigs may) and the
/// webhook's token.
fn webhook_kubeconfig(dir: &Path, server: &str, ca_pem: &str) -> PathBuf {
    std::fs::write(dir.join("receiver-ca.crt"), ca_pem).expect("CA");
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "receiver", "cluster": {"server": server, "certificate-authority": "receiver-ca.crt"}}],
        "users": [{"name": "apiserver", "user": {"token": WEBHOOK_TOKEN}}],
        "contexts": [{"name": "audit", "context": {"cluster": "receiver", "user": "apiserver"}}],
        "current-context": "audit",
    });
    let path = dir.join("webhook.kubeconfig");
    std::fs::write(&path, kubeconfig.to_string()).expect("kubeconfig");
    path
}

/// A kubeconfig naming a port nothing listens on (with a CA nobody serves with).
fn down_kubeconfig(dir: &Path) -> PathBuf {
    let ca = CertAuthority::generate("nobody-ca").expect("CA");
    webhook_kubeconfig(dir, &format!("https://127.0.0.1:{}", free_port()), ca.cert_pem())
}

/// A server auditing with `policy` to the webhook of `kubeconfig` (and `extra` flags); tim authenticates with a
/// token and may do anything (system:masters).
fn audited(dir: &Path, policy: &str, kubeconfig: &Path, extra: &[&str]) -> Server {
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, policy).expect("policy");
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, "tim-token,tim@k8s.io,uid-tim,\"humans,system:masters\"\n").expect("tokens");
    let mut args = vec![
        "--audit-policy-file",
        policy_file.to_str().expect("utf-8"),
        "--audit-webhook-config-file",
        kubeconfig.to_str().expect("utf-8"),
        "--token-auth-file",
        tokens.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// A client of the server's CA presenting no credentials (tim's token goes in an Authorization header).
async fn anonymous(s: &Server) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(s.kubeconfig()).expect("kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
    cfg.auth_info = Default::default();
    kube::Client::try_from(cfg).expect("client")
}

async fn as_tim(c: &kube::Client, method: Method, path: &str, body: Value) -> Resp {
    let mut headers = vec![("Authorization", "Bearer tim-token")];
    let body = if body.is_null() { vec![] } else { body.to_string().into_bytes() };
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    call(c, method, path, &headers, body).await
}

/// A StorageState named `<resource>.<group>`.
fn ss(name: &str) -> Value {
    let (resource, group) = name.split_once('.').expect("resource.group");
    json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": name},
           "spec": {"resource": {"group": group, "resource": resource}}})
}

/// The value of a counter of `/metrics` with these labels (0 when absent).
fn counter(s: &Server, series: &str) -> f64 {
    let metrics = s.kubectl_ok(&["get", "--raw", "/metrics"]);
    let value = metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')));
    value.map_or(0.0, |v| v.trim().parse().expect("a number"))
}

/// Batches reach the receiver as upstream sends them (EventList JSON, POSTed to the configured path with the token,
/// over TLS to the receiver's CA) with every stage of a request under its Audit-Id; a receiver that fails the
/// first attempts (503, then 400) gets the batch again; the log, on at the same time, gets the same events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_reach_the_webhook_with_every_stage() {
    let receiver = Receiver::start(vec![503, 400]);
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("https://127.0.0.1:{}/audit/events", receiver.port);
    let kubeconfig = webhook_kubeconfig(dir.path(), &url, &receiver.ca_pem);
    let log = dir.path().join("audit.log");
    let flags = [
        "--audit-webhook-batch-max-wait=50ms",
        "--audit-webhook-initial-backoff=10ms",
        "--audit-log-path",
        log.to_str().expect("utf-8"),
    ];
    let mut s = audited(dir.path(), POLICY, &kubeconfig, &flags);
    let c = anonymous(&s).await;
    let resp = as_tim(&c, Method::POST, SS, ss("hooked.example.com")).await;
    assert_eq!(resp.status, 201, "{}", resp.text());
    let id = resp.header("audit-id").expect("Audit-Id");

    let mine = eventually("the create's two events at the webhook", Duration::from_secs(20), || {
        let mine: Vec<Value> = receiver.events().into_iter().filter(|e| e["auditID"] == id.as_str()).collect();
        (mine.len() >= 2).then_some(mine)
    });
    let stages: Vec<&str> = mine.iter().map(|e| e["stage"].as_str().expect("stage")).collect();
    assert_eq!(stages, ["RequestReceived", "ResponseComplete"], "{mine:?}");
    for e in &mine {
        assert_eq!(e["user"]["username"], "tim@k8s.io", "{e}");
        assert_eq!(e["verb"], "create", "{e}");
        assert_eq!(e["level"], "Metadata", "{e}");
        assert_eq!(e["objectRef"]["resource"], "storagestates", "{e}");
        assert!(e.get("kind").is_none(), "list items carry no kind of their own: {e}");
    }
    assert_eq!(mine[1]["responseStatus"]["code"], 201, "{}", mine[1]);

    let posts = receiver.posts();
    assert_eq!(posts.iter().map(|p| p.code).take(3).collect::<Vec<_>>(), [503, 400, 200], "{posts:?}");
    assert_eq!(posts[0].body, posts[1].body, "the same batch is sent again");
    for p in &posts {
        assert_eq!(p.path, "/audit/events");
        assert_eq!(p.authorization, format!("Bearer {WEBHOOK_TOKEN}"));
        assert_eq!(p.content_type, "application/json");
        assert_eq!(p.body["kind"], "EventList", "{}", p.body);
        assert_eq!(p.body["apiVersion"], "audit.k8s.io/v1", "{}", p.body);
    }

    // Both backends got every event: what the log has of the request is what the webhook got.
    s.stop();
    let logged: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
        .filter(|e| e["auditID"] == id.as_str())
        .collect();
    assert_eq!(logged.len(), 2, "{logged:?}");
    for (l, w) in logged.iter().zip(&mine) {
        let mut l = l.clone();
        let obj = l.as_object_mut().expect("object");
        obj.remove("kind");
        obj.remove("apiVersion");
        assert_eq!(&l, w);
    }
}

/// Blocking mode: a request's RequestReceived event is at the receiver before the request is answered (one batch
/// per event), and its ResponseComplete follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_mode_sends_before_answering() {
    let receiver = Receiver::start(vec![]);
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("https://127.0.0.1:{}", receiver.port);
    let kubeconfig = webhook_kubeconfig(dir.path(), &url, &receiver.ca_pem);
    let s = audited(dir.path(), POLICY, &kubeconfig, &["--audit-webhook-mode=blocking"]);
    let c = anonymous(&s).await;
    let resp = as_tim(&c, Method::GET, SS, Value::Null).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let id = resp.header("audit-id").expect("Audit-Id");
    let received: Vec<Value> = receiver.events().into_iter().filter(|e| e["auditID"] == id.as_str()).collect();
    assert_eq!(received.first().map(|e| e["stage"].clone()), Some(json!("RequestReceived")), "{received:?}");
    eventually("the ResponseComplete event", Duration::from_secs(20), || {
        let all = receiver.events();
        all.iter().any(|e| e["auditID"] == id.as_str() && e["stage"] == "ResponseComplete").then_some(())
    });
    let posts = receiver.posts();
    assert!(posts.iter().all(|p| p.body["items"].as_array().map(Vec::len) == Some(1)), "{posts:?}");
    assert!(posts.iter().all(|p| p.path == "/"), "{posts:?}");
}

/// Batch mode with a webhook that is down (nothing listens; each batch retried for over a minute at the default
/// backoff): requests are served at once, the queue fills and its overflow is dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_webhook_never_slows_batch_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = down_kubeconfig(dir.path());
    // One event a batch, one batch a second: 40 quick requests (80 events) overflow a queue of 4.
    let flags = [
        "--audit-webhook-batch-max-size=1",
        "--audit-webhook-batch-buffer-size=4",
        "--audit-webhook-batch-throttle-qps=1",
        "--audit-webhook-batch-throttle-burst=1",
    ];
    let s = audited(dir.path(), POLICY, &kubeconfig, &flags);
    let c = anonymous(&s).await;
    for i in 0..40 {
        let started = Instant::now();
        let resp = as_tim(&c, Method::GET, &format!("{SS}/n{i}.example.com"), Value::Null).await;
        assert_eq!(resp.status, 404, "{}", resp.text());
        assert!(started.elapsed() < Duration::from_secs(2), "request {i} took {:?}", started.elapsed());
    }
    eventually("dropped events counted", Duration::from_secs(20), || {
        (counter(&s, "apiserver_audit_error_total{plugin=\"buffered\"}") > 0.0).then_some(())
    });
}

/// A webhook that is down, tried with a short backoff: the batches given up are counted for the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_a_down_webhook_never_gets_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = down_kubeconfig(dir.path());
    let flags = ["--audit-webhook-initial-backoff=1ms", "--audit-webhook-batch-max-wait=10ms"];
    let s = audited(dir.path(), POLICY, &kubeconfig, &flags);
    let c = anonymous(&s).await;
    let resp = as_tim(&c, Method::GET, SS, Value::Null).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let lost = eventually("webhook errors counted", Duration::from_secs(20), || {
        let n = counter(&s, "apiserver_audit_error_total{plugin=\"webhook\"}");
        (n >= 2.0).then_some(n)
    });
    assert!(lost >= 2.0, "the list's two events: {lost}");
}

/// blocking-strict with a webhook that is down: 500 (upstream's text), the create not done, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_strict_with_a_down_webhook_refuses_requests() {
    // Only creates are audited: the readiness polls and kubectl's reads below are served.
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata, verbs: [create]}]\n";
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = down_kubeconfig(dir.path());
    let flags = ["--audit-webhook-mode=blocking-strict", "--audit-webhook-initial-backoff=1ms"];
    let s = audited(dir.path(), policy, &kubeconfig, &flags);
    let c = anonymous(&s).await;
    let resp = as_tim(&c, Method::POST, SS, ss("strict.example.com")).await;
    assert_eq!(resp.status, 500, "{}", resp.text());
    assert_eq!(resp.text(), format!("Internal Server Error: \"{SS}\": failed to store audit event\n"));
    let out = s.kubectl(&["get", "storagestates", "strict.example.com"]);
    assert!(!out.status.success(), "the create was not done");
    assert!(counter(&s, "apiserver_audit_error_total{plugin=\"webhook\"}") >= 1.0);
    assert!(counter(&s, "apiserver_audit_requests_rejected_total") >= 1.0);
}

/// A kubeconfig that cannot be read stops the start, naming it.
#[test]
fn an_unreadable_webhook_kubeconfig_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let missing = dir.path().join("missing.kubeconfig");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--audit-policy-file", policy.to_str().expect("utf-8")])
        .args(["--audit-webhook-config-file", missing.to_str().expect("utf-8")])
        .args(["--data-dir", dir.path().join("data").to_str().expect("utf-8")])
        .args(["--cert-dir", dir.path().join("certs").to_str().expect("utf-8")])
        .args(["--secure-port", &free_port().to_string(), "--disable-scheduler"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("initializing audit webhook") && stderr.contains("missing.kubeconfig"), "{stderr}");
}

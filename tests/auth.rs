//! Running inside a real cluster: delegated authentication and authorization, certificate rotation, and the deploy
//! kit (manifests/, apiservice/, scripts/deploy.sh).
//!
//! kube-apiserver cannot run here, so the tests play its part with real certificates and real HTTPS:
//! - the **front proxy** (the aggregator): a front-proxy CA and client certificate made here, and the X-Remote-*
//!   headers set as kube-apiserver sets them when it proxies a request;
//! - the **cluster** ([`Cluster`], the one allowed stand-in): a small HTTPS server that answers TokenReview and
//!   SubjectAccessReview and serves (GET and watch) the kube-system/extension-apiserver-authentication ConfigMap,
//!   and counts what it is asked. The server under test reaches it through `--authentication-kubeconfig` and
//!   `--authorization-kubeconfig`, exactly as it reaches kube-apiserver in a cluster.

mod common;
use common::status::strings;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use migration_apiserver::auth::certs::{issue_client_cert, issue_serving_cert, CertAuthority};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

const GROUP: &str = "migration.k8s.io";
const SS_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";
/// The bearer token the server under test uses towards the cluster (its ServiceAccount token in a pod).
const SERVER_TOKEN: &str = "server-serviceaccount-token";
const FRONT_PROXY_CN: &str = "front-proxy-client";
const WEBHOOK_CALLER: &str = "migration-apiserver-webhook-client";
/// What system:auth-delegator and extension-apiserver-authentication-reader grant (manifests/rbac.yaml binds
/// both): every request the server makes to the cluster for authentication and authorization must be one of these.
const DELEGATION_GRANTS: [(&str, &str); 5] = [
    ("create", "tokenreviews"),
    ("create", "subjectaccessreviews"),
    ("get", "configmaps/extension-apiserver-authentication"),
    ("list", "configmaps/extension-apiserver-authentication"),
    ("watch", "configmaps/extension-apiserver-authentication"),
];

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

// ---------------------------------------------------------------------------------------------------------------
// the cluster stand-in: TokenReview, SubjectAccessReview, the extension-apiserver-authentication ConfigMap

type Body = UnsyncBoxBody<Bytes, Infallible>;

struct ClusterState {
    /// resourceVersion and data of the ConfigMap; watches follow it.
    configmap: tokio::sync::watch::Sender<(u64, BTreeMap<String, String>)>,
    token_reviews: AtomicUsize,
    /// The spec of every SubjectAccessReview received.
    reviews: Mutex<Vec<Value>>,
    configmap_gets: AtomicUsize,
    configmap_watches: AtomicUsize,
    /// (verb, resource) of every request, as kube-apiserver's RBAC would see it.
    requests: Mutex<BTreeSet<(String, String)>>,
    /// Requests without the server's own credentials.
    unauthenticated: AtomicUsize,
}

struct Cluster {
    state: Arc<ClusterState>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// The certificates kube-apiserver would have: the cluster's client CA and the front-proxy CA.
struct Pki {
    client_ca: CertAuthority,
    front_proxy_ca: CertAuthority,
}

impl Pki {
    fn new(suffix: &str) -> Pki {
        Pki {
            client_ca: CertAuthority::generate(&format!("kubernetes-ca{suffix}")).expect("client CA"),
            front_proxy_ca: CertAuthority::generate(&format!("front-proxy-ca{suffix}")).expect("front-proxy CA"),
        }
    }

    /// kube-apiserver's --proxy-client-cert-file.
    fn front_proxy(&self) -> (String, String) {
        issue_client_cert::<&str>(&self.front_proxy_ca, FRONT_PROXY_CN, &[]).expect("proxy cert")
    }

    /// The ConfigMap kube-apiserver writes for these CAs (list values are JSON arrays in strings).
    fn configmap_data(&self) -> BTreeMap<String, String> {
        [
            ("client-ca-file", self.client_ca.cert_pem().to_string()),
            ("requestheader-client-ca-file", self.front_proxy_ca.cert_pem().to_string()),
            ("requestheader-allowed-names", json!([FRONT_PROXY_CN]).to_string()),
            ("requestheader-username-headers", json!(["X-Remote-User"]).to_string()),
            ("requestheader-uid-headers", json!(["X-Remote-Uid"]).to_string()),
            ("requestheader-group-headers", json!(["X-Remote-Group"]).to_string()),
            ("requestheader-extra-headers-prefix", json!(["X-Remote-Extra-"]).to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl Cluster {
    async fn start(pki: &Pki) -> Cluster {
        install_crypto();
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = CertAuthority::generate("cluster-serving-ca").expect("CA");
        let (cert, key) = issue_serving_cert(&ca, &["localhost".into(), "127.0.0.1".into()]).expect("serving cert");
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem")],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
            )
            .expect("TLS config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(ClusterState {
            configmap: tokio::sync::watch::Sender::new((1, pki.configmap_data())),
            token_reviews: AtomicUsize::new(0),
            reviews: Mutex::new(Vec::new()),
            configmap_gets: AtomicUsize::new(0),
            configmap_watches: AtomicUsize::new(0),
            requests: Mutex::new(BTreeSet::new()),
            unauthenticated: AtomicUsize::new(0),
        });
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (acceptor, st) = (acceptor.clone(), st.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(route(st, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let kubeconfig = dir.path().join("cluster.kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: https://{addr}\n    \
                 certificate-authority-data: {}\nusers:\n- name: server\n  user:\n    token: {SERVER_TOKEN}\n\
                 contexts:\n- name: cluster\n  context:\n    cluster: cluster\n    user: server\n\
                 current-context: cluster\n",
                b64(ca.cert_pem())
            ),
        )
        .expect("kubeconfig");
        Cluster { state, kubeconfig, _dir: dir }
    }

    fn kubeconfig_arg(&self) -> String {
        self.kubeconfig.to_str().expect("utf-8").to_string()
    }

    /// A server's flags to delegate both authentication and authorization to this cluster.
    fn delegating_args(&self) -> Vec<String> {
        let kubeconfig = self.kubeconfig_arg();
        vec!["--authentication-kubeconfig".into(), kubeconfig.clone(), "--authorization-kubeconfig".into(), kubeconfig]
    }

    fn set_configmap(&self, data: BTreeMap<String, String>) {
        self.state.configmap.send_modify(|(rv, d)| {
            *rv += 1;
            *d = data;
        });
    }

    fn token_reviews(&self) -> usize {
        self.state.token_reviews.load(Ordering::SeqCst)
    }

    fn reviews(&self) -> Vec<Value> {
        self.state.reviews.lock().expect("lock").clone()
    }
}

fn full(code: u16, body: &Value) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed_unsync())
        .expect("response")
}

fn status(code: u16, reason: &str, message: &str) -> hyper::Response<Body> {
    full(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": reason, "code": code}),
    )
}

fn configmap_json(rv: u64, data: &BTreeMap<String, String>) -> Value {
    json!({"kind": "ConfigMap", "apiVersion": "v1",
           "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system",
                        "resourceVersion": rv.to_string(), "uid": "5c1a0e3e-0000-4000-8000-000000000001"},
           "data": data})
}

/// The cluster's authorization policy (what RBAC would say).
fn policy(spec: &Value) -> bool {
    let user = spec["user"].as_str().unwrap_or_default();
    if let Some(r) = spec.get("resourceAttributes") {
        let (verb, resource) = (r["verb"].as_str().unwrap_or_default(), r["resource"].as_str().unwrap_or_default());
        return matches!(
            (user, resource, verb),
            ("alice", "storagestates", "get" | "list" | "watch")
                | ("bob", "storagestates", "list")
                | ("dave" | "erin", "shootstates", "delete")
                | ("erin", "shootstates", "unsafe-delete-ignore-read-errors")
        );
    }
    let a = &spec["nonResourceAttributes"];
    let (path, verb) = (a["path"].as_str().unwrap_or_default(), a["verb"].as_str().unwrap_or_default());
    match (user, path, verb) {
        (WEBHOOK_CALLER, "/validate" | "/mutate", "post") => true,
        // system:discovery: every authenticated user may read discovery.
        (_, p, "get") => p == "/apis" || p == "/api" || p.starts_with("/apis/") || p.starts_with("/api/"),
        _ => false,
    }
}

async fn route(st: Arc<ClusterState>, req: hyper::Request<Incoming>) -> hyper::Response<Body> {
    let authorized = req.headers().get("authorization").and_then(|v| v.to_str().ok())
        == Some(format!("Bearer {SERVER_TOKEN}").as_str());
    if !authorized {
        st.unauthenticated.fetch_add(1, Ordering::SeqCst);
        return status(401, "Unauthorized", "Unauthorized");
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query: BTreeMap<String, String> =
        form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes()).into_owned().collect();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let record = |verb: &str, resource: &str| {
        st.requests.lock().expect("lock").insert((verb.to_string(), resource.to_string()));
    };
    match (method.as_str(), path.as_str()) {
        ("POST", "/apis/authentication.k8s.io/v1/tokenreviews") => {
            record("create", "tokenreviews");
            st.token_reviews.fetch_add(1, Ordering::SeqCst);
            let status = match body["spec"]["token"].as_str() {
                Some("bob-token") => json!({"authenticated": true, "user": {
                    "username": "bob", "uid": "uid-bob", "groups": ["team-b"], "extra": {"scopes": ["s1"]}}}),
                _ => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            full(
                201,
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                        "spec": body["spec"], "status": status}),
            )
        }
        ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews") => {
            record("create", "subjectaccessreviews");
            let spec = body["spec"].clone();
            st.reviews.lock().expect("lock").push(spec.clone());
            let allowed = policy(&spec);
            full(
                201,
                &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
                        "spec": spec, "status": {"allowed": allowed}}),
            )
        }
        ("GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication") => {
            record("get", "configmaps/extension-apiserver-authentication");
            st.configmap_gets.fetch_add(1, Ordering::SeqCst);
            let (rv, data) = st.configmap.borrow().clone();
            full(200, &configmap_json(rv, &data))
        }
        ("GET", "/api/v1/namespaces/kube-system/configmaps")
            if query.get("watch").map(String::as_str) == Some("true")
                && query.get("fieldSelector").map(String::as_str)
                    == Some("metadata.name=extension-apiserver-authentication") =>
        {
            record("watch", "configmaps/extension-apiserver-authentication");
            st.configmap_watches.fetch_add(1, Ordering::SeqCst);
            let since: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let timeout: u64 = query.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(60);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
            let rx = st.configmap.subscribe();
            let events = futures::stream::unfold((rx, since), move |(mut rx, mut since)| async move {
                loop {
                    let (rv, data) = rx.borrow_and_update().clone();
                    if rv > since {
                        since = rv;
                        let line = format!("{}\n", json!({"type": "MODIFIED", "object": configmap_json(rv, &data)}));
                        return Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), (rx, since)));
                    }
                    match tokio::time::timeout_at(deadline, rx.changed()).await {
                        Ok(Ok(())) => {}
                        _ => return None,
                    }
                }
            });
            hyper::Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(StreamBody::new(events).boxed_unsync())
                .expect("response")
        }
        _ => {
            record(&method.as_str().to_ascii_lowercase(), &path);
            status(404, "NotFound", "the server could not find the requested resource")
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// an HTTPS client with full control over certificate and headers (a new connection per request)

struct Reply {
    status: u16,
    body: Vec<u8>,
    /// The certificate the server presented.
    served: CertificateDer<'static>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), {}: {}", self.status, self.text()))
    }

    /// Asserts a Status of `code` and `reason`, and returns it.
    fn status(&self, code: u16, reason: &str) -> Value {
        assert_eq!(self.status, code, "{}", self.text());
        let s = self.json();
        assert_eq!(
            (s["kind"].as_str(), s["reason"].as_str(), s["code"].as_u64()),
            (Some("Status"), Some(reason), Some(code as u64)),
            "{s}"
        );
        s
    }
}

#[derive(Clone)]
struct Caller {
    port: u16,
    /// The CA the server's certificate is checked against.
    server_ca: Vec<u8>,
    identity: Option<(String, String)>,
}

impl Caller {
    fn new(s: &Server) -> Caller {
        Caller {
            port: s.port,
            server_ca: std::fs::read(s.cert_dir().join("ca.crt")).expect("server CA"),
            identity: None,
        }
    }

    fn with_cert(&self, identity: (String, String)) -> Caller {
        Caller { identity: Some(identity), ..self.clone() }
    }

    async fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&Value>) -> Reply {
        let what = format!("{method} {path}");
        tokio::time::timeout(Duration::from_secs(20), self.try_call(method, path, headers, body))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer in 20s"))
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.call("GET", path, headers, None).await
    }

    async fn try_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
        install_crypto();
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.server_ca) {
            roots.add(cert?)?;
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => builder.with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes())?],
                PrivateKeyDer::from_pem_slice(key.as_bytes())?,
            )?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tcp = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], self.port))).await?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost".to_string())?, tcp)
            .await?;
        let served = tls.get_ref().1.peer_certificates().ok_or("no server certificate")?[0].clone().into_owned();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let mut req = hyper::Request::builder().method(method).uri(path).header("host", "localhost");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = match body {
            Some(b) => req.header("content-type", "application/json").body(Full::new(Bytes::from(b.to_string())))?,
            None => req.body(Full::new(Bytes::new()))?,
        };
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes().to_vec();
        Ok(Reply { status, body, served })
    }
}

/// Headers as kube-apiserver's proxy sets them for `user` in `groups`.
fn as_user<'a>(user: &'a str, groups: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("X-Remote-User", user)];
    h.extend(groups.iter().map(|g| ("X-Remote-Group", *g)));
    h
}

const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The aggregator's availability probe, and discovery through the front proxy.
async fn assert_aggregator_probe_passes(proxy: &Caller) {
    let aggregator = as_user("system:kube-aggregator", &["system:masters"]);
    for gv in ["migration.k8s.io/v1alpha1", "core.gardener.cloud/v1alpha1", "core.gardener.cloud/v1beta1"] {
        let r = proxy.get(&format!("/apis/{gv}"), &aggregator).await;
        assert_eq!(r.status, 200, "probe of {gv}: {}", r.text());
        let list = r.json();
        assert_eq!(
            (list["kind"].as_str(), list["groupVersion"].as_str()),
            (Some("APIResourceList"), Some(gv)),
            "{list}"
        );
    }
    // /apis: a valid aggregated discovery document, or 406, never 404.
    let mut accept = aggregator.clone();
    accept.push(("Accept", AGGREGATED_V2));
    let r = proxy.get("/apis", &accept).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    assert_eq!(
        (doc["apiVersion"].as_str(), doc["kind"].as_str()),
        (Some("apidiscovery.k8s.io/v2"), Some("APIGroupDiscoveryList"))
    );
    let groups: Vec<&str> =
        doc["items"].as_array().expect("items").iter().filter_map(|g| g["metadata"]["name"].as_str()).collect();
    assert!(groups.contains(&GROUP) && groups.contains(&"core.gardener.cloud"), "{groups:?}");
    let mut unknown = aggregator.clone();
    unknown.push(("Accept", "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList"));
    proxy.get("/apis", &unknown).await.status(406, "NotAcceptable");
    assert_eq!(proxy.get("/apis", &aggregator).await.json()["kind"], "APIGroupList");
}

/// Starts the binary (blocking: the harness polls with kubectl) without blocking the runtime the cluster runs on.
async fn start_server(args: Vec<String>) -> Server {
    tokio::task::spawn_blocking(move || Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .expect("server start")
}

async fn eventually_async<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// delegated authentication and authorization

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegated_authentication_and_authorization() {
    let pki = Pki::new("");
    let cluster = Cluster::start(&pki).await;
    let s = start_server(cluster.delegating_args()).await;
    let anonymous = Caller::new(&s);
    let proxy = anonymous.with_cert(pki.front_proxy());

    // The aggregator: system:masters is never reviewed.
    assert_aggregator_probe_passes(&proxy).await;
    assert!(cluster.reviews().is_empty(), "{:?}", cluster.reviews());

    // A user proxied by kube-apiserver: the identity is exactly what the headers say (every group line, extra keys
    // lower-cased and percent-decoded), plus system:authenticated, and the SubjectAccessReview carries it.
    let alice = [
        ("X-Remote-User", "alice"),
        ("X-Remote-Uid", "uid-alice"),
        ("X-Remote-Group", "devs"),
        ("X-Remote-Group", "ops"),
        ("X-Remote-Extra-Acme.com%2FProject", "p1"),
        ("X-Remote-Extra-Scopes", "read"),
    ];
    let r = proxy.get(SS_PATH, &alice).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["kind"], "StorageStateList");
    let reviews = cluster.reviews();
    assert_eq!(reviews.len(), 1, "{reviews:?}");
    assert_eq!(
        reviews[0],
        json!({"user": "alice", "uid": "uid-alice", "groups": ["devs", "ops", "system:authenticated"],
               "extra": {"acme.com/project": ["p1"], "scopes": ["read"]},
               "resourceAttributes": {"verb": "list", "group": GROUP, "version": "v1alpha1", "resource": "storagestates"}})
    );
    // Cached: the same question is not asked again.
    for _ in 0..3 {
        assert_eq!(proxy.get(SS_PATH, &alice).await.status, 200);
    }
    assert_eq!(cluster.reviews().len(), 1);
    // Watch is its own verb; a fieldSelector on the name makes it a question about that object.
    let r =
        proxy.get(&format!("{SS_PATH}?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3Dpods"), &alice).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        cluster.reviews()[1]["resourceAttributes"],
        json!({"verb": "watch", "group": GROUP, "version": "v1alpha1", "resource": "storagestates", "name": "pods"})
    );

    // Denied: 403 naming user, verb and resource, as kube-apiserver words it; denials are cached too.
    let before = cluster.reviews().len();
    for _ in 0..2 {
        let st = proxy.call("DELETE", &format!("{SS_PATH}/pods"), &alice, None).await.status(403, "Forbidden");
        assert_eq!(
            st["message"],
            "storagestates.migration.k8s.io \"pods\" is forbidden: User \"alice\" cannot delete resource \"storagestates\" in API group \"migration.k8s.io\" at the cluster scope"
        );
        assert_eq!(st["details"], json!({"name": "pods", "group": GROUP, "kind": "storagestates"}));
    }
    assert_eq!(cluster.reviews().len(), before + 1, "the denial was cached");
    let st =
        proxy.call("PATCH", &format!("{SS_PATH}/pods/status"), &alice, Some(&json!({}))).await.status(403, "Forbidden");
    assert!(
        st["message"].as_str().unwrap_or_default().contains("cannot patch resource \"storagestates/status\""),
        "{st}"
    );
    let st = proxy
        .get("/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates", &alice)
        .await
        .status(403, "Forbidden");
    assert_eq!(
        st["message"],
        "shootstates.core.gardener.cloud is forbidden: User \"alice\" cannot list resource \"shootstates\" in API group \"core.gardener.cloud\" in the namespace \"garden\""
    );
    let st = proxy.get("/metrics", &alice).await.status(403, "Forbidden");
    assert_eq!(st["message"], "forbidden: User \"alice\" cannot get path \"/metrics\"");
    // Discovery is a non-resource request (system:discovery allows it).
    assert_eq!(proxy.get("/apis/migration.k8s.io/v1alpha1", &alice).await.status, 200);
    assert!(cluster
        .reviews()
        .iter()
        .any(|r| r["nonResourceAttributes"] == json!({"path": "/apis/migration.k8s.io/v1alpha1", "verb": "get"})));

    // The identity headers mean nothing without the front proxy's certificate.
    let masters = as_user("mallory", &["system:masters"]);
    anonymous.get(SS_PATH, &masters).await.status(401, "Unauthorized");
    // ... with a certificate of another CA, even with the proxy's name,
    let other = CertAuthority::generate("front-proxy-ca").expect("CA");
    let forged = anonymous.with_cert(issue_client_cert::<&str>(&other, FRONT_PROXY_CN, &[]).expect("cert"));
    forged.get(SS_PATH, &masters).await.status(401, "Unauthorized");
    // ... with the front-proxy CA's certificate of a name that is not allowed,
    let not_allowed =
        anonymous.with_cert(issue_client_cert::<&str>(&pki.front_proxy_ca, "not-the-proxy", &[]).expect("cert"));
    not_allowed.get(SS_PATH, &masters).await.status(401, "Unauthorized");
    // ... or with a client certificate of the cluster CA: that user is itself, the headers are ignored.
    let carol = anonymous.with_cert(issue_client_cert(&pki.client_ca, "carol", &["qa"]).expect("cert"));
    let st = carol.get(SS_PATH, &masters).await.status(403, "Forbidden");
    assert!(st["message"].as_str().unwrap_or_default().contains("User \"carol\" cannot list"), "{st}");
    let carol_review = cluster.reviews().into_iter().rev().find(|r| r["user"] == "carol").expect("carol reviewed");
    assert_eq!(carol_review["groups"], json!(["qa", "system:authenticated"]));
    assert!(carol_review.get("extra").is_none(), "{carol_review}");
    // The server's own dev admin certificate is trusted for nothing in a cluster.
    let admin = anonymous.with_cert((
        std::fs::read_to_string(s.cert_dir().join("admin.crt")).expect("admin cert"),
        std::fs::read_to_string(s.cert_dir().join("admin.key")).expect("admin key"),
    ));
    admin.get(SS_PATH, &[]).await.status(401, "Unauthorized");
    // x509 users in system:masters are allowed without a review.
    let root = anonymous.with_cert(issue_client_cert(&pki.client_ca, "root", &["system:masters"]).expect("cert"));
    assert_eq!(root.get(SS_PATH, &[]).await.status, 200);

    // Bearer tokens through TokenReview, cached (valid and invalid alike).
    let bob = [("Authorization", "Bearer bob-token")];
    let r = anonymous.get(SS_PATH, &bob).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let bob_review = cluster.reviews().into_iter().rev().find(|r| r["user"] == "bob").expect("bob reviewed");
    assert_eq!(
        bob_review,
        json!({"user": "bob", "uid": "uid-bob", "groups": ["team-b", "system:authenticated"], "extra": {"scopes": ["s1"]},
               "resourceAttributes": {"verb": "list", "group": GROUP, "version": "v1alpha1", "resource": "storagestates"}})
    );
    assert_eq!(anonymous.get(SS_PATH, &bob).await.status, 200);
    assert_eq!(cluster.token_reviews(), 1, "the token review was cached");
    let wrong = [("Authorization", "Bearer not-a-token")];
    anonymous.get(SS_PATH, &wrong).await.status(401, "Unauthorized");
    anonymous.get(SS_PATH, &wrong).await.status(401, "Unauthorized");
    assert_eq!(cluster.token_reviews(), 2, "the invalid token was cached");
    anonymous.get(SS_PATH, &[]).await.status(401, "Unauthorized");

    // The webhook endpoints: kube-apiserver's webhook client certificate, authorized as POST on the path.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": GROUP, "version": "v1alpha1", "kind": "StorageState"},
        "resource": {"group": GROUP, "version": "v1alpha1", "resource": "storagestates"},
        "name": "pods", "operation": "CREATE", "userInfo": {"username": "admin"},
        "object": {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": "pods"},
                   "spec": {"resource": {"group": "", "resource": "pods"}}}}});
    let webhook = anonymous.with_cert(issue_client_cert::<&str>(&pki.client_ca, WEBHOOK_CALLER, &[]).expect("cert"));
    let r = webhook.call("POST", "/validate?timeout=10s", &[], Some(&review)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["response"]["allowed"], true, "{}", r.text());
    assert!(cluster
        .reviews()
        .iter()
        .any(|r| r["user"] == WEBHOOK_CALLER
            && r["nonResourceAttributes"] == json!({"path": "/validate", "verb": "post"})));
    let st = carol.call("POST", "/validate", &[], Some(&review)).await.status(403, "Forbidden");
    assert_eq!(st["message"], "forbidden: User \"carol\" cannot post path \"/validate\"");

    // Health needs no credentials.
    for path in ["/healthz", "/livez", "/readyz", "/readyz/ping", "/version"] {
        assert_eq!(anonymous.get(path, &[]).await.status, 200, "{path}");
    }

    // Every request the server made to the cluster is covered by system:auth-delegator and
    // extension-apiserver-authentication-reader (manifests/rbac.yaml), made with its own credentials.
    let grants: BTreeSet<(String, String)> =
        DELEGATION_GRANTS.iter().map(|(v, r)| (v.to_string(), r.to_string())).collect();
    let made = cluster.state.requests.lock().expect("lock").clone();
    assert!(
        made.is_subset(&grants),
        "requests beyond the granted ones: {:?}",
        made.difference(&grants).collect::<Vec<_>>()
    );
    assert_eq!(cluster.state.unauthenticated.load(Ordering::SeqCst), 0);
    assert!(cluster.state.configmap_watches.load(Ordering::SeqCst) >= 1, "the ConfigMap is watched");
}

// ---------------------------------------------------------------------------------------------------------------
// rotation without restart

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_cas_and_serving_certificate_apply_without_restart() {
    let pki = Pki::new("");
    let cluster = Cluster::start(&pki).await;
    let s = start_server(cluster.delegating_args()).await;
    let anonymous = Caller::new(&s);
    let aggregator = as_user("system:kube-aggregator", &["system:masters"]);
    let old_proxy = anonymous.with_cert(pki.front_proxy());
    let old_root = anonymous.with_cert(issue_client_cert(&pki.client_ca, "root", &["system:masters"]).expect("cert"));
    assert_eq!(old_proxy.get(SS_PATH, &aggregator).await.status, 200);
    assert_eq!(old_root.get(SS_PATH, &[]).await.status, 200);

    // kube-apiserver rotates both CAs and rewrites the ConfigMap.
    let rotated = Pki::new("-2");
    let new_proxy = anonymous.with_cert(rotated.front_proxy());
    let new_root =
        anonymous.with_cert(issue_client_cert(&rotated.client_ca, "root", &["system:masters"]).expect("cert"));
    new_proxy.get(SS_PATH, &aggregator).await.status(401, "Unauthorized");
    let gets = cluster.state.configmap_gets.load(Ordering::SeqCst);
    cluster.set_configmap(rotated.configmap_data());
    eventually_async("the rotated front-proxy CA", Duration::from_secs(20), || async {
        (new_proxy.get(SS_PATH, &aggregator).await.status == 200).then_some(())
    })
    .await;
    assert_eq!(new_root.get(SS_PATH, &[]).await.status, 200, "the rotated client CA");
    old_proxy.get(SS_PATH, &aggregator).await.status(401, "Unauthorized");
    old_root.get(SS_PATH, &[]).await.status(401, "Unauthorized");
    assert_aggregator_probe_passes(&new_proxy).await;
    // The change arrived through the watch, not by polling.
    assert!(cluster.state.configmap_gets.load(Ordering::SeqCst) <= gets + 1);

    // The serving certificate files are replaced (as the kubelet does with a renewed Secret): new connections get
    // the new certificate.
    let before = anonymous.get("/readyz", &[]).await.served;
    let ca = CertAuthority::load(&s.cert_dir().join("ca.crt"), &s.cert_dir().join("ca.key")).expect("dev CA");
    let (cert, key) = issue_serving_cert(&ca, &["localhost".into(), "127.0.0.1".into()]).expect("serving cert");
    let new_cert = CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem").into_owned();
    assert_ne!(before, new_cert);
    replace_file(&s.cert_dir().join("apiserver.key"), &key);
    replace_file(&s.cert_dir().join("apiserver.crt"), &cert);
    eventually_async("the rotated serving certificate", Duration::from_secs(20), || async {
        (anonymous.get("/readyz", &[]).await.served == new_cert).then_some(())
    })
    .await;
    assert_eq!(new_proxy.get(SS_PATH, &aggregator).await.status, 200);
}

fn replace_file(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

// ---------------------------------------------------------------------------------------------------------------
// standalone: no cluster to ask

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_authorization_and_front_proxy_from_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "dave-token,dave,uid-dave,\"devs\"\nroot-token,root,uid-root,\"system:masters\"\n")
        .expect("tokens");
    let pki = Pki::new("");
    let proxy_ca_file = dir.path().join("front-proxy-ca.crt");
    std::fs::write(&proxy_ca_file, pki.front_proxy_ca.cert_pem()).expect("ca");
    let s = start_server(vec![
        "--token-auth-file".into(),
        tokens.to_str().expect("utf-8").into(),
        "--requestheader-client-ca-file".into(),
        proxy_ca_file.to_str().expect("utf-8").into(),
        "--requestheader-allowed-names".into(),
        FRONT_PROXY_CN.into(),
    ])
    .await;
    let anonymous = Caller::new(&s);

    // Only system:masters: the generated admin certificate and tokens in that group.
    let st = anonymous.get(SS_PATH, &[("Authorization", "Bearer dave-token")]).await.status(403, "Forbidden");
    assert_eq!(
        st["message"],
        "storagestates.migration.k8s.io is forbidden: User \"dave\" cannot list resource \"storagestates\" in API group \"migration.k8s.io\" at the cluster scope"
    );
    assert_eq!(anonymous.get(SS_PATH, &[("Authorization", "Bearer root-token")]).await.status, 200);
    let admin = anonymous.with_cert((
        std::fs::read_to_string(s.cert_dir().join("admin.crt")).expect("admin cert"),
        std::fs::read_to_string(s.cert_dir().join("admin.key")).expect("admin key"),
    ));
    assert_eq!(admin.get(SS_PATH, &[]).await.status, 200);
    s.kubectl_ok(&["get", "storagestates"]);

    // The front proxy configured by flags.
    let proxy = anonymous.with_cert(pki.front_proxy());
    assert_aggregator_probe_passes(&proxy).await;
    let st = proxy.get(SS_PATH, &as_user("dave", &["devs"])).await.status(403, "Forbidden");
    assert!(st["message"].as_str().unwrap_or_default().contains("User \"dave\" cannot list"), "{st}");

    // A new front-proxy CA written to the file applies to the next requests.
    let rotated = Pki::new("-2");
    let new_proxy = anonymous.with_cert(rotated.front_proxy());
    let aggregator = as_user("system:kube-aggregator", &["system:masters"]);
    new_proxy.get(SS_PATH, &aggregator).await.status(401, "Unauthorized");
    replace_file(&proxy_ca_file, rotated.front_proxy_ca.cert_pem());
    eventually_async("the rotated front-proxy CA file", Duration::from_secs(20), || async {
        (new_proxy.get(SS_PATH, &aggregator).await.status == 200).then_some(())
    })
    .await;
    proxy.get(SS_PATH, &aggregator).await.status(401, "Unauthorized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_authentication_configmap_fails_the_start_unless_tolerated() {
    let pki = Pki::new("");
    let cluster = Cluster::start(&pki).await;
    // A kubeconfig with the wrong credentials: the cluster answers 401.
    let bad = cluster._dir.path().join("bad.kubeconfig");
    std::fs::write(&bad, std::fs::read_to_string(&cluster.kubeconfig).expect("read").replace(SERVER_TOKEN, "wrong"))
        .expect("write");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--secure-port", &free_port().to_string(), "--authentication-kubeconfig"])
        .arg(&bad)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await.expect("exits").expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("extension-apiserver-authentication"), "{stderr}");
    // Tolerated: the server starts, and picks the ConfigMap up once it can read it (here: never; health is fine).
    let s = start_server(vec![
        "--authentication-kubeconfig".into(),
        bad.to_str().expect("utf-8").into(),
        "--authentication-tolerate-lookup-failure".into(),
    ])
    .await;
    assert_eq!(Caller::new(&s).get("/readyz", &[]).await.status, 200);
}

// ---------------------------------------------------------------------------------------------------------------
// the deploy kit

fn kustomize(dir: &Path) -> Vec<Value> {
    let out = std::process::Command::new("kubectl").arg("kustomize").arg(dir).output().expect("run kubectl kustomize");
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    documents(&String::from_utf8(out.stdout).expect("utf8"))
}

fn documents(text: &str) -> Vec<Value> {
    text.split("\n---\n").map(|d| serde_yaml_ng::from_str::<Value>(d).expect("YAML")).filter(|v| !v.is_null()).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Every rule of our ClusterRole and Role, one row per (apiGroup, resource, verb), with the code that makes the
/// request: a rule that is not in this table, or a row whose rule is gone, fails the test. Rows name a source file
/// and a string that file must contain, so a rule whose user disappears fails too.
const RULES_IN_USE: &[(&str, &str, &str, &str, &str)] = &[
    // The migrator (src/scheduler/migrator.rs): chunked LIST, then one JSON merge patch per object.
    ("core.gardener.cloud", "shootstates", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("core.gardener.cloud", "shootstates", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    // storagemigration.k8s.io StorageVersionMigrations: served in two versions, so migrated like ShootStates.
    (
        "storagemigration.k8s.io",
        "storageversionmigrations",
        "list",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).list(",
    ),
    (
        "storagemigration.k8s.io",
        "storageversionmigrations",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    ("apps", "deployments", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("apps", "deployments", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("apps", "statefulsets", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("apps", "statefulsets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("apps", "daemonsets", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("apps", "daemonsets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("apps", "replicasets", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("apps", "replicasets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("batch", "cronjobs", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("batch", "cronjobs", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("batch", "jobs", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("batch", "jobs", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    ("autoscaling", "horizontalpodautoscalers", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    (
        "autoscaling",
        "horizontalpodautoscalers",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    ("policy", "poddisruptionbudgets", "list", "src/scheduler/migrator/target.rs", "Request::new(&url).list("),
    ("policy", "poddisruptionbudgets", "patch", "src/scheduler/migrator/target.rs", "Request::new(&url).patch("),
    (
        "flowcontrol.apiserver.k8s.io",
        "flowschemas",
        "list",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).list(",
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "flowschemas",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
        "list",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).list(",
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
        "patch",
        "src/scheduler/migrator/target.rs",
        "Request::new(&url).patch(",
    ),
    // A custom resource's CRD after its migration (src/scheduler/migrator/crd.rs): read, then its status updated.
    ("apiextensions.k8s.io", "customresourcedefinitions", "get", "src/scheduler/migrator/crd.rs", "self.api.get_opt("),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions/status",
        "update",
        "src/scheduler/migrator/crd.rs",
        "self.api.replace_status(",
    ),
    // Leader election among replicas (src/scheduler/election/lease.rs): one Lease in our namespace, read before
    // every write, created once, renewed with a compare-and-swap update.
    ("coordination.k8s.io", "leases", "get", "src/scheduler/election/lease.rs", "self.api.get_opt("),
    ("coordination.k8s.io", "leases", "create", "src/scheduler/election/lease.rs", "self.api.create("),
    ("coordination.k8s.io", "leases", "update", "src/scheduler/election/lease.rs", "self.api.replace("),
    // The scheduler's Events (src/scheduler/events/mod.rs): created, and a repeated one's series patched.
    ("events.k8s.io", "events", "create", "src/scheduler/events/mod.rs", "api.create("),
    ("events.k8s.io", "events", "patch", "src/scheduler/events/mod.rs", "api.patch("),
    // Cluster safety (src/server/cluster_check/): whether one of our APIServices hides a group the cluster serves
    // itself, or a group we serve is routed elsewhere (it also reads our kinds' CRDs by name: the `get` above).
    ("apiregistration.k8s.io", "apiservices", "list", "src/server/cluster_check/mod.rs", "api.list("),
    // Cluster key rotation (src/scheduler/cluster_encryption/): the kube-apiservers' identity Leases in
    // kube-system, listed and watched by label (a reflector), and /metrics (a nonResourceURL: group "", the URL as
    // the resource).
    ("coordination.k8s.io", "leases", "list", "src/scheduler/cluster_encryption/reconciler.rs", LEASE_REFLECTOR),
    ("coordination.k8s.io", "leases", "watch", "src/scheduler/cluster_encryption/reconciler.rs", LEASE_REFLECTOR),
    ("", "/metrics", "get", "src/scheduler/cluster_encryption/observe.rs", "Request::get(\"/metrics\")"),
];

/// The identity Leases' watcher, which lists and then watches them.
const LEASE_REFLECTOR: &str = "watcher(api, watcher::Config::default().labels(IDENTITY_LABEL))";

/// The merge patch the migrator sends (the patch verb, not update): kube-core's `Patch::Merge`, sent as
/// `application/merge-patch+json`.
const MIGRATOR_PATCH_TYPE: &str = "Patch::Merge(";

#[test]
fn manifests_render_least_privilege_and_every_rule_is_used() {
    let docs = kustomize(&repo().join("manifests"));
    let mut kinds: Vec<String> = docs.iter().map(|d| d["kind"].as_str().unwrap_or_default().to_string()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Namespace",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    let sa = json!({"kind": "ServiceAccount", "name": "migration-apiserver", "namespace": "migration-apiserver"});

    // No wildcard anywhere, no cluster-admin, and the rules are exactly the table.
    let mut granted = BTreeSet::new();
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role") {
        for rule in role["rules"].as_array().expect("rules") {
            for field in ["apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"] {
                assert!(!strings(&rule[field]).iter().any(|v| v.contains('*')), "wildcard in {field}: {rule}");
            }
            // Discovery needs no rule (system:discovery); /metrics is the one nonResourceURL, in the table.
            for u in strings(&rule["nonResourceURLs"]) {
                for v in strings(&rule["verbs"]) {
                    assert!(granted.insert((String::new(), u.clone(), v)), "duplicate grant in {rule}");
                }
            }
            for g in strings(&rule["apiGroups"]) {
                for r in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        assert!(granted.insert((g.clone(), r.clone(), v)), "duplicate grant in {rule}");
                    }
                }
            }
        }
    }
    let table: BTreeSet<(String, String, String)> =
        RULES_IN_USE.iter().map(|(g, r, v, _, _)| (g.to_string(), r.to_string(), v.to_string())).collect();
    assert_eq!(granted, table, "manifests/rbac.yaml and RULES_IN_USE differ");
    for (g, r, v, file, needle) in RULES_IN_USE {
        if file.is_empty() {
            continue; // planned; see the row's comment
        }
        let source = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(source.contains(needle), "{v} {r}.{g}: {file} no longer contains {needle:?}");
    }
    let migrator = std::fs::read_to_string(repo().join("src/scheduler/migrator/target.rs")).expect("migrator");
    assert!(migrator.contains(MIGRATOR_PATCH_TYPE), "the migrator's no-op write is a merge patch: verb patch");
    let leases = find(&docs, "Role", "migration-apiserver-leader-election");
    assert_eq!(leases["metadata"]["namespace"], "migration-apiserver", "a Role in our namespace, not a ClusterRole");
    // get and update only for the Lease the server uses by default (--leader-elect-resource-name).
    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    for rule in leases["rules"].as_array().expect("rules") {
        if strings(&rule["verbs"]).iter().any(|v| v == "get" || v == "update") {
            assert_eq!(strings(&rule["resourceNames"]), ["migration-apiserver"], "{rule}");
        }
    }
    assert!(help.contains("--leader-elect-resource-name") && help.contains("[default: migration-apiserver]"), "{help}");

    // Bindings: our roles, system:auth-delegator (TokenReview, SubjectAccessReview) and the ConfigMap reader in
    // kube-system; the delegated requests they cover are checked against the server in
    // delegated_authentication_and_authorization.
    for (kind, name, role_kind, role) in [
        ("ClusterRoleBinding", "migration-apiserver", "ClusterRole", "migration-apiserver"),
        ("ClusterRoleBinding", "migration-apiserver:system:auth-delegator", "ClusterRole", "system:auth-delegator"),
        (
            "RoleBinding",
            "migration-apiserver:extension-apiserver-authentication-reader",
            "Role",
            "extension-apiserver-authentication-reader",
        ),
        ("RoleBinding", "migration-apiserver-leader-election", "Role", "migration-apiserver-leader-election"),
        ("RoleBinding", "migration-apiserver-apiserver-identities", "Role", "migration-apiserver-apiserver-identities"),
    ] {
        let b = find(&docs, kind, name);
        assert_eq!(b["roleRef"], json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}));
        assert_eq!(b["subjects"], json!([sa]), "{name}");
        assert!(!b["roleRef"]["name"].as_str().unwrap_or_default().contains("admin"));
    }
    assert_eq!(
        find(&docs, "RoleBinding", "migration-apiserver:extension-apiserver-authentication-reader")["metadata"]
            ["namespace"],
        "kube-system"
    );
    let identities = find(&docs, "Role", "migration-apiserver-apiserver-identities");
    assert_eq!(identities["metadata"]["namespace"], "kube-system", "only kube-system's Leases");
    assert_eq!(
        find(&docs, "RoleBinding", "migration-apiserver-apiserver-identities")["metadata"]["namespace"],
        "kube-system"
    );

    // The Deployment: probes on the HTTPS port, resource requests, the serving Secret, our ServiceAccount.
    let d = find(&docs, "Deployment", "migration-apiserver");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "migration-apiserver");
    let c = &pod["containers"][0];
    assert_eq!(c["ports"][0], json!({"name": "https", "containerPort": 8443, "protocol": "TCP"}));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")] {
        assert_eq!(c[probe]["httpGet"], json!({"path": path, "port": "https", "scheme": "HTTPS"}), "{probe}");
    }
    assert!(c["resources"]["requests"]["cpu"].is_string() && c["resources"]["requests"]["memory"].is_string());
    let args = strings(&c["args"]);
    for flag in
        ["--bind-address=0.0.0.0", "--secure-port=8443", "--tls-cert-file=/etc/migration-apiserver/serving/tls.crt"]
    {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    let serving =
        pod["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == "serving").expect("serving volume");
    assert_eq!(serving["secret"]["secretName"], "migration-apiserver-serving");
    // Audited with the recommended policy: its ConfigMap (the file's bytes) mounted read-only, the log on stdout.
    let policy = find(&docs, "ConfigMap", "migration-apiserver-audit-policy");
    assert_eq!(policy["metadata"]["namespace"], "migration-apiserver");
    let recommended = std::fs::read_to_string(repo().join("manifests/audit/policy.yaml")).expect("policy.yaml");
    assert_eq!(policy["data"]["policy.yaml"].as_str(), Some(recommended.as_str()));
    let volume = pod["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == "audit-policy");
    assert_eq!(volume.expect("audit-policy volume")["configMap"]["name"], "migration-apiserver-audit-policy");
    let mount = c["volumeMounts"].as_array().expect("mounts").iter().find(|m| m["name"] == "audit-policy");
    let mount = mount.expect("audit-policy mount");
    assert_eq!(mount["readOnly"], true);
    let policy_flag = format!("--audit-policy-file={}/policy.yaml", mount["mountPath"].as_str().expect("mountPath"));
    for flag in [policy_flag.as_str(), "--audit-log-path=-"] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    // The flags in the Deployment exist.
    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap_or_default();
        assert!(help.contains(flag), "{flag} is not a serve flag");
    }

    let svc = find(&docs, "Service", "migration-apiserver");
    assert_eq!(svc["spec"]["ports"], json!([{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]));
    assert_eq!(svc["spec"]["selector"], d["spec"]["selector"]["matchLabels"]);
    let pdb = find(&docs, "PodDisruptionBudget", "migration-apiserver");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], d["spec"]["selector"]["matchLabels"]);
}

#[test]
fn apiservices_and_the_cert_manager_alternative() {
    let apiservices = kustomize(&repo().join("apiservice"));
    let mut names: Vec<&str> = apiservices.iter().filter_map(|a| a["metadata"]["name"].as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "v1.storagemigration.k8s.io",
            "v1alpha1.core.gardener.cloud",
            "v1alpha1.migration.k8s.io",
            "v1beta1.core.gardener.cloud",
            "v1beta1.storagemigration.k8s.io"
        ]
    );
    let certificates = kustomize(&repo().join("manifests/cert-manager"));
    let serving = find(&certificates, "Certificate", "migration-apiserver-serving");
    assert_eq!(serving["spec"]["secretName"], "migration-apiserver-serving");
    assert!(strings(&serving["spec"]["dnsNames"]).contains(&"migration-apiserver.migration-apiserver.svc".to_string()));
    let issuer = serving["spec"]["issuerRef"]["name"].as_str().expect("issuer");
    find(&certificates, "Issuer", issuer);
    let webhooks = kustomize(&repo().join("manifests/webhooks"));
    let configurations =
        webhooks.iter().filter(|w| w["kind"].as_str().unwrap_or_default().ends_with("WebhookConfiguration"));
    for a in apiservices.iter().chain(configurations) {
        // cert-manager's CA injector fills caBundle from this Certificate.
        assert_eq!(
            a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "migration-apiserver/migration-apiserver-serving",
            "{a}"
        );
    }
    for a in &apiservices {
        let name = a["metadata"]["name"].as_str().expect("name");
        assert_eq!(
            format!("{}.{}", a["spec"]["version"].as_str().expect("v"), a["spec"]["group"].as_str().expect("g")),
            name
        );
        assert_eq!(
            a["spec"]["service"],
            json!({"namespace": "migration-apiserver", "name": "migration-apiserver", "port": 443})
        );
        assert!(a["spec"].get("insecureSkipTLSVerify").is_none());
    }
    // The webhook callers' RBAC covers exactly the two webhook paths, POST.
    let caller = kustomize(&repo().join("manifests/webhook-caller"));
    let role = find(&caller, "ClusterRole", "migration-apiserver:webhook-caller");
    assert_eq!(role["rules"], json!([{"nonResourceURLs": ["/validate", "/mutate"], "verbs": ["post"]}]));
}

#[test]
fn make_deploy_fills_ca_bundles_and_the_serving_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let out = std::process::Command::new(BIN)
        .args(["certs", "--cert-dir"])
        .arg(&certs)
        .args(["--service-namespace", "migration-apiserver"])
        .output()
        .expect("certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ca = std::fs::read_to_string(certs.join("ca.crt")).expect("ca");
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let serving = std::fs::read_to_string(certs.join("apiserver.crt")).expect("serving");
    let render = |form: &str, image: &str| {
        let out = std::process::Command::new("bash")
            .arg(repo().join("scripts/deploy.sh"))
            .env("CERT_DIR", &certs)
            .env("FORM", form)
            .env("IMAGE", image)
            .env("DRY_RUN", "1")
            // Rendered without a cluster (tests/storagemigration_safety.rs asks the cluster stand-in).
            .env("IN_TREE_GROUPS", "register")
            .env("OFFLINE", "1")
            .env("MIGRATION_APISERVER", BIN)
            .output()
            .expect("deploy.sh");
        assert!(out.status.success(), "deploy.sh FORM={form}: {}", String::from_utf8_lossy(&out.stderr));
        documents(&String::from_utf8(out.stdout).expect("utf8"))
    };

    let docs = render("aggregated", "registry.example.com/migration-apiserver:v1");
    let apiservices: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "APIService").collect();
    assert_eq!(apiservices.len(), 5);
    for a in &apiservices {
        assert_eq!(a["spec"]["caBundle"], ca_bundle.as_str(), "{}", a["metadata"]["name"]);
    }
    let secret = find(&docs, "Secret", "migration-apiserver-serving");
    assert_eq!(
        (secret["type"].as_str(), secret["metadata"]["namespace"].as_str()),
        (Some("kubernetes.io/tls"), Some("migration-apiserver"))
    );
    let tls_crt = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["tls.crt"].as_str().expect("tls.crt").replace(char::is_whitespace, ""))
        .expect("b64");
    assert_eq!(String::from_utf8(tls_crt).expect("utf8"), serving);
    let d = find(&docs, "Deployment", "migration-apiserver");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "registry.example.com/migration-apiserver:v1");
    assert!(!docs.iter().any(|d| d["kind"] == "CustomResourceDefinition"), "one form at a time");
    // Both forms install the roles for people (tests/roles.rs checks what they grant).
    for role in ["migration-apiserver:aggregate-to-view", "migration-apiserver:aggregate-to-edit"] {
        find(&docs, "ClusterRole", role);
    }

    // The serving certificate made by `make certs` is valid for the in-cluster name the aggregator dials.
    let roots = {
        let mut r = RootCertStore::empty();
        r.add(CertificateDer::from_pem_slice(ca.as_bytes()).expect("pem")).expect("root");
        Arc::new(r)
    };
    install_crypto();
    let verifier = rustls::client::WebPkiServerVerifier::builder(roots).build().expect("verifier");
    let cert = CertificateDer::from_pem_slice(serving.as_bytes()).expect("pem");
    let name = ServerName::try_from("migration-apiserver.migration-apiserver.svc").expect("name");
    rustls::client::danger::ServerCertVerifier::verify_server_cert(
        verifier.as_ref(),
        &cert,
        &[],
        &name,
        &[],
        rustls::pki_types::UnixTime::now(),
    )
    .expect("serving certificate valid for migration-apiserver.migration-apiserver.svc");

    let docs = render("crds", "");
    assert!(!docs.iter().any(|d| d["kind"] == "APIService"), "one form at a time");
    assert_eq!(docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").count(), 4);
    // The CRD form's objects are the committed manifests' (deploy-check writes them with the same generator).
    let committed = |dir: &str| -> Vec<Value> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(repo().join(dir)).expect("dir") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.ends_with(".yaml") && name != "kustomization.yaml" {
                out.extend(documents(&std::fs::read_to_string(&path).expect("read")));
            }
        }
        out
    };
    for want in committed("manifests/crds").into_iter().chain(committed("manifests/webhooks")) {
        let (kind, name) = (want["kind"].as_str().expect("kind"), want["metadata"]["name"].as_str().expect("name"));
        let mut got = find(&docs, kind, name).clone();
        // The rendering adds the CA and puts objects in their namespace.
        if let Some(hooks) = got["webhooks"].as_array_mut() {
            for h in hooks {
                h["clientConfig"].as_object_mut().map(|c| c.remove("caBundle"));
            }
        }
        assert_eq!(got["spec"], want["spec"], "{kind} {name}");
        assert_eq!(got["webhooks"], want["webhooks"], "{kind} {name}");
    }
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        find(&docs, kind, "migration-apiserver");
    }
    // Every webhook of every configuration gets the CA.
    let configurations: Vec<&Value> =
        docs.iter().filter(|d| d["kind"].as_str().unwrap_or_default().ends_with("WebhookConfiguration")).collect();
    for w in &configurations {
        for hook in w["webhooks"].as_array().expect("webhooks") {
            assert_eq!(hook["clientConfig"]["caBundle"], ca_bundle.as_str(), "{}", w["metadata"]["name"]);
        }
    }
    // The CA bundle's ConfigMap is local only (kustomize drops it); the one ConfigMap applied is the audit policy's,
    // which manifests/ has had since the Deployment audits (issue 37).
    let config_maps: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "ConfigMap").collect();
    assert_eq!(config_maps.len(), 1, "{config_maps:?}");
    assert_eq!(config_maps[0]["metadata"]["name"], "migration-apiserver-audit-policy");
    find(&docs, "ClusterRoleBinding", "migration-apiserver:webhook-caller");
    for role in ["migration-apiserver:aggregate-to-view", "migration-apiserver:aggregate-to-edit"] {
        find(&docs, "ClusterRole", role);
    }
    let d = find(&docs, "Deployment", "migration-apiserver");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "migration-apiserver:dev");
}

/// The unsafe delete of an unreadable object (`ignoreStoreReadErrorWithClusterBreakingPotential`) is asked of the
/// authorizer as its own verb on the same object, as kube-apiserver asks it: a user allowed to delete is not
/// allowed to remove what cannot be read unless allowed that too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_delete_of_an_unreadable_object_needs_its_own_permission() {
    if etcd_backend_selected() {
        return; // the unreadable object is written straight into the embedded store
    }
    let pki = Pki::new("-unsafe");
    let cluster = Cluster::start(&pki).await;
    let mut s = start_server(cluster.delegating_args()).await;
    const KEY: &str = "/registry/core.gardener.cloud/shootstates/garden-a/bad";
    let mut s = tokio::task::spawn_blocking(move || {
        s.stop();
        s.write_raw(KEY, b"not json");
        s.restart();
        s
    })
    .await
    .expect("restart");
    let proxy = Caller::new(&s).with_cert(pki.front_proxy());
    let path = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-a/shootstates/bad";
    let unsafe_delete = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "ignoreStoreReadErrorWithClusterBreakingPotential": true});

    // dave may delete, but not unsafely: 403, and the object is still there (a plain delete cannot read it).
    let dave = [("X-Remote-User", "dave")];
    let r = proxy.call("DELETE", path, &dave, Some(&unsafe_delete)).await.status(403, "Forbidden");
    assert_eq!(
        r["message"].as_str().unwrap_or_default(),
        "shootstates.core.gardener.cloud \"bad\" is forbidden: not permitted to do \
         \"unsafe-delete-ignore-read-errors\", reason: ",
        "{r}"
    );
    let unsafe_review = |user: &str| {
        cluster.reviews().iter().any(|spec| {
            spec["user"] == user
                && spec["resourceAttributes"]
                    == json!({"verb": "unsafe-delete-ignore-read-errors", "group": "core.gardener.cloud",
                              "version": "v1beta1", "resource": "shootstates", "namespace": "garden-a", "name": "bad"})
        })
    };
    assert!(unsafe_review("dave"), "{:?}", cluster.reviews());
    proxy.call("DELETE", path, &dave, None).await.status(500, "InternalError");
    // erin may: the object is removed.
    let erin = [("X-Remote-User", "erin")];
    let r = proxy.call("DELETE", path, &erin, Some(&unsafe_delete)).await;
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("Success")), "{}", r.text());
    assert!(unsafe_review("erin"));
    s.stop();
}

//! A fault-injecting HTTPS proxy of our own between a migrating server and its target, a real kube-apiserver (or, for
//! what only this server serves, a server of ours): it forwards every request to the target over TLS with the
//! target's admin client certificate, records each request with its arrival time, and answers some of them itself by
//! rule (dropped connections, 429 with Retry-After, 5xx, 410 Expired on a LIST, a given code for one object's writes).
//!
//! It runs on its own thread and runtime, so blocking test code (kubectl, `Server::start`) never stalls it.

use super::cluster::Cluster;
use super::Server;
use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use migration_apiserver::auth::certs::{issue_serving_cert, write_kubeconfig, CertAuthority};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// A request as the rules see it.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    pub method: String,
    pub path: String,
    pub query: String,
    /// 0-based arrival order over all requests.
    pub seq: u64,
}

impl RequestInfo {
    /// A query parameter, decoded.
    pub fn param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
    }
    /// A chunked collection LIST (what the migrator sends).
    pub fn is_list(&self) -> bool {
        self.method == "GET" && self.param("limit").is_some()
    }
    pub fn is_patch(&self) -> bool {
        self.method == "PATCH"
    }
    /// `<namespace>/<name>` of an object path (`.../namespaces/<ns>/<resource>/<name>`).
    pub fn object(&self) -> Option<String> {
        let parts: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        let i = parts.iter().position(|p| *p == "namespaces")?;
        (parts.len() == i + 4).then(|| format!("{}/{}", parts[i + 1], parts[i + 3]))
    }
}

/// What the proxy does instead of (or besides) forwarding.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Close the connection without an answer; the target never sees the request.
    Drop,
    /// Forward the request, then close the connection without passing the answer on (the write happened).
    DropAfterForward,
    /// Answer with this code (a Status body), optionally with Retry-After (seconds).
    Status { code: u16, retry_after: Option<u64> },
    /// 410 Expired with `metadata.continue` = the request's own continue token, which is a valid token to resume
    /// from (kube-apiserver hands out an inconsistent one for the same position).
    Expired,
    /// Forward after this long (a slow target).
    Delay(Duration),
    /// A concurrent writer: the proxy first deletes the object on the target, then forwards (the client gets 404).
    DeleteFirst,
    /// A concurrent writer: the proxy first changes the object's labels on the target (new resourceVersion), then
    /// forwards (a write with the old resourceVersion gets 409). On a `/status` path it changes the object.
    TouchFirst,
}

pub type Rule = Box<dyn FnMut(&RequestInfo) -> Option<Fault> + Send>;
/// Endpoints the proxy serves itself (a stand-in for kube-apiserver's, e.g. apiextensions): the answer's code and
/// JSON body, or None to forward.
pub type Local = Box<dyn FnMut(&RequestInfo, &[u8]) -> Option<(u16, serde_json::Value)> + Send>;
/// Endpoints the proxy serves itself with a text body (e.g. `/metrics`): code, content type and body, or None.
pub type TextLocal = Box<dyn FnMut(&RequestInfo) -> Option<(u16, &'static str, String)> + Send>;
/// Watches the proxy serves itself: the JSON lines of the watch events, sent as they come (the answer ends when the
/// sender is dropped), or None.
pub type WatchLocal = Box<dyn FnMut(&RequestInfo) -> Option<tokio::sync::mpsc::UnboundedReceiver<Bytes>> + Send>;
/// A whole answer, or a watch's stream of lines.
type Body = UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// One request seen by the proxy.
#[derive(Clone, Debug)]
pub struct Record {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub query: String,
    /// The code the client got; 0 when the connection was dropped.
    pub code: u16,
    pub fault: bool,
}

struct State {
    rules: Mutex<Vec<Rule>>,
    local: Mutex<Option<Local>>,
    text_local: Mutex<Option<TextLocal>>,
    watch_local: Mutex<Option<WatchLocal>>,
    records: Mutex<Vec<Record>>,
    seq: AtomicU64,
    upstream: Upstream,
}

struct Upstream {
    tls: tokio_rustls::TlsConnector,
    port: u16,
}

impl Upstream {
    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let tls = self.tls.connect(name, tcp).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

pub struct Proxy {
    pub port: u16,
    dir: tempfile::TempDir,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl Proxy {
    /// Starts a proxy in front of `target` (which must be running: its certificates are read now).
    pub fn start(target: &Server) -> Proxy {
        let certs = target.cert_dir();
        Proxy::in_front_of(target.port, &certs.join("ca.crt"), &certs.join("admin.crt"), &certs.join("admin.key"))
    }

    /// Starts a proxy in front of a real cluster's kube-apiserver, as its administrator (system:masters).
    pub fn in_front_of_cluster(cluster: &Cluster) -> Proxy {
        let port = cluster.url().rsplit(':').next().and_then(|p| p.parse().ok()).expect("kube-apiserver's port");
        Proxy::in_front_of(port, &cluster.pki("ca.crt"), &cluster.pki("admin.crt"), &cluster.pki("admin.key"))
    }

    /// Starts a proxy in front of the HTTPS server on 127.0.0.1:`target_port` whose serving certificate `ca` signed,
    /// presenting the client certificate `cert` with `key`.
    fn in_front_of(target_port: u16, ca: &Path, cert: &Path, key: &Path) -> Proxy {
        migration_apiserver::auth::tls::install_default_crypto_provider();
        let provider = migration_apiserver::auth::tls::crypto_provider();
        let (ca, admin_cert, admin_key) = (read(ca), read(cert), read(key));

        // Towards the target: its CA, its admin client certificate.
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(c.expect("target CA")).expect("add CA");
        }
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(admin_cert.as_bytes()).map(|c| c.expect("admin cert")).collect();
        let key = PrivateKeyDer::from_pem_slice(admin_key.as_bytes()).expect("admin key");
        let mut client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .expect("client config");
        client.alpn_protocols = vec![b"http/1.1".to_vec()];

        // Towards the migrating server: a CA and serving certificate of our own.
        let proxy_ca = CertAuthority::generate("fault-proxy-ca").expect("CA");
        let (serving_cert, serving_key) =
            issue_serving_cert(&proxy_ca, &["127.0.0.1".to_string(), "localhost".to_string()]).expect("serving cert");
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(serving_cert.as_bytes()).map(|c| c.expect("cert")).collect();
        let key = PrivateKeyDer::from_pem_slice(serving_key.as_bytes()).expect("key");
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        server.alpn_protocols = vec![b"http/1.1".to_vec()];

        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let port = std_listener.local_addr().expect("addr").port();
        let dir = tempfile::tempdir().expect("tempdir");
        write_kubeconfig(
            &dir.path().join("proxy.kubeconfig"),
            &format!("https://127.0.0.1:{port}"),
            proxy_ca.cert_pem(),
            &admin_cert,
            &admin_key,
        )
        .expect("kubeconfig");

        let state = Arc::new(State {
            rules: Mutex::new(Vec::new()),
            local: Mutex::new(None),
            text_local: Mutex::new(None),
            watch_local: Mutex::new(None),
            records: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            upstream: Upstream { tls: tokio_rustls::TlsConnector::from(Arc::new(client)), port: target_port },
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                let accept = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else { continue };
                        let _ = tcp.set_nodelay(true);
                        tokio::spawn(serve_connection(acceptor.clone(), tcp, st.clone()));
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        Proxy { port, dir, state, stop: Some(stop_tx), thread: Some(thread) }
    }

    /// A kubeconfig pointing at the proxy (the proxy's CA; the target's admin client certificate).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("proxy.kubeconfig")
    }

    /// Adds a rule; the first rule that returns a fault for a request decides.
    pub fn add_rule(&self, rule: impl FnMut(&RequestInfo) -> Option<Fault> + Send + 'static) {
        self.state.rules.lock().unwrap().push(Box::new(rule));
    }

    /// Serves some endpoints here instead of forwarding them (checked after the rules).
    pub fn serve_locally(
        &self,
        local: impl FnMut(&RequestInfo, &[u8]) -> Option<(u16, serde_json::Value)> + Send + 'static,
    ) {
        *self.state.local.lock().unwrap() = Some(Box::new(local));
    }

    /// Serves some endpoints here with a text body (checked before [`Proxy::serve_locally`]'s).
    pub fn serve_text_locally(
        &self,
        local: impl FnMut(&RequestInfo) -> Option<(u16, &'static str, String)> + Send + 'static,
    ) {
        *self.state.text_local.lock().unwrap() = Some(Box::new(local));
    }

    /// Serves some watches here (checked before [`Proxy::serve_text_locally`]'s).
    pub fn serve_watch_locally(
        &self,
        local: impl FnMut(&RequestInfo) -> Option<tokio::sync::mpsc::UnboundedReceiver<Bytes>> + Send + 'static,
    ) {
        *self.state.watch_local.lock().unwrap() = Some(Box::new(local));
    }

    pub fn clear_rules(&self) {
        self.state.rules.lock().unwrap().clear();
    }

    /// Every request so far, in arrival order.
    pub fn records(&self) -> Vec<Record> {
        let mut r = self.state.records.lock().unwrap().clone();
        r.sort_by_key(|r| r.at);
        r
    }

    pub fn clear_records(&self) {
        self.state.records.lock().unwrap().clear();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Raised inside the service to make hyper close the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by the fault proxy")
    }
}

impl std::error::Error for Dropped {}

async fn serve_connection(acceptor: tokio_rustls::TlsAcceptor, tcp: TcpStream, state: Arc<State>) {
    let Ok(tls) = acceptor.accept(tcp).await else { return };
    // One upstream connection per downstream connection: HTTP/1.1 requests on it arrive one at a time.
    let upstream: Arc<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>> = Arc::new(tokio::sync::Mutex::new(None));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (state, upstream) = (state.clone(), upstream.clone());
        async move { handle(req, &state, &upstream).await }
    });
    let _ =
        hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(tls), service).await;
}

fn status_body(code: u16, reason: &str, message: &str, cont: Option<&str>) -> Bytes {
    let mut v = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    if let Some(c) = cont {
        v["metadata"]["continue"] = serde_json::Value::from(c);
    }
    Bytes::from(v.to_string())
}

async fn handle(
    req: Request<Incoming>,
    state: &State,
    upstream: &tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
) -> Result<Response<Body>, Dropped> {
    let at = Instant::now();
    let info = RequestInfo {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: req.uri().query().unwrap_or_default().to_string(),
        seq: state.seq.fetch_add(1, Ordering::SeqCst),
    };
    let fault = state.rules.lock().unwrap().iter_mut().find_map(|r| r(&info));
    // A slow target answers as usual, later.
    let fault = match fault {
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            None
        }
        other => other,
    };
    let record = |code: u16, fault: bool| {
        state.records.lock().unwrap().push(Record {
            at,
            method: info.method.clone(),
            path: info.path.clone(),
            query: info.query.clone(),
            code,
            fault,
        })
    };
    let reply = |code: u16, body: Bytes, retry_after: Option<u64>| {
        let mut b = Response::builder().status(code).header("content-type", "application/json");
        if let Some(s) = retry_after {
            b = b.header("retry-after", s.to_string());
        }
        b.body(Full::new(body).boxed_unsync()).expect("response")
    };
    match &fault {
        Some(Fault::Drop) => {
            record(0, true);
            return Err(Dropped);
        }
        Some(Fault::Status { code, retry_after }) => {
            record(*code, true);
            let reason = match code {
                429 => "TooManyRequests",
                403 => "Forbidden",
                422 => "Invalid",
                500 => "InternalError",
                503 => "ServiceUnavailable",
                504 => "Timeout",
                _ => "Unknown",
            };
            let msg = format!("injected by the fault proxy: {code} for {} {}", info.method, info.path);
            return Ok(reply(*code, status_body(*code, reason, &msg, None), *retry_after));
        }
        Some(Fault::Expired) => {
            record(410, true);
            let cont = info.param("continue");
            let msg = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";
            return Ok(reply(410, status_body(410, "Expired", msg, cont.as_deref()), None));
        }
        Some(Fault::DropAfterForward | Fault::DeleteFirst | Fault::TouchFirst | Fault::Delay(_)) | None => {}
    }

    // Forward (after the concurrent write of a DeleteFirst or TouchFirst).
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        record(0, false);
        return Err(Dropped);
    };
    if fault.is_none() {
        let watch = state.watch_local.lock().unwrap().as_mut().and_then(|local| local(&info));
        if let Some(lines) = watch {
            record(200, false);
            let frames = futures::stream::unfold(lines, |mut lines| async move {
                let line = lines.recv().await?;
                Some((Ok(hyper::body::Frame::data(line)), lines))
            });
            let answer = Response::builder().status(200).header("content-type", "application/json");
            return Ok(answer.body(StreamBody::new(frames).boxed_unsync()).expect("response"));
        }
        let text = state.text_local.lock().unwrap().as_mut().and_then(|local| local(&info));
        if let Some((code, content_type, body)) = text {
            record(code, false);
            let answer = Response::builder().status(code).header("content-type", content_type);
            return Ok(answer.body(Full::new(Bytes::from(body)).boxed_unsync()).expect("response"));
        }
        let answer = state.local.lock().unwrap().as_mut().and_then(|local| local(&info, &body));
        if let Some((code, json)) = answer {
            record(code, false);
            return Ok(reply(code, Bytes::from(json.to_string()), None));
        }
    }
    let path_and_query = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let concurrent = match &fault {
        Some(Fault::DeleteFirst) => Some(("DELETE", Bytes::new(), "application/json")),
        Some(Fault::TouchFirst) => Some((
            "PATCH",
            Bytes::from(serde_json::json!({"metadata": {"labels": {"touched": info.seq.to_string()}}}).to_string()),
            "application/merge-patch+json",
        )),
        _ => None,
    };
    if let Some((method, body, ct)) = concurrent {
        // The other writer changes the object itself, also when the request is on its status.
        let object = info.path.strip_suffix("/status").unwrap_or(&info.path);
        let req = Request::builder()
            .method(method)
            .uri(object)
            .header("content-type", ct)
            .body(Full::new(body))
            .expect("request");
        let ok = match forward(state, upstream, req).await {
            Ok((p, body)) => p.status.is_success() && body.collect().await.is_ok(),
            Err(()) => false,
        };
        assert!(ok, "the proxy's concurrent {method} of {} failed", info.path);
    }
    let mut up = Request::builder().method(parts.method.clone()).uri(path_and_query);
    for (k, v) in parts.headers.iter() {
        if k != "host" && k != "connection" {
            up = up.header(k, v);
        }
    }
    let Ok((parts, body)) = forward(state, upstream, up.body(Full::new(body)).expect("request")).await else {
        record(0, false);
        return Err(Dropped);
    };
    // A watch's events are passed on as they come; any other answer is read whole first.
    let watch = matches!(info.param("watch").as_deref(), Some("true" | "1"));
    let body = match watch {
        true => {
            let frames = http_body_util::BodyStream::new(body)
                .take_while(|f| std::future::ready(f.is_ok()))
                .map(|f| Ok::<_, std::convert::Infallible>(f.expect("a frame")));
            StreamBody::new(frames).boxed_unsync()
        }
        false => match body.collect().await {
            Ok(collected) => Full::new(collected.to_bytes()).boxed_unsync(),
            Err(_) => {
                record(0, false);
                return Err(Dropped);
            }
        },
    };
    if matches!(fault, Some(Fault::DropAfterForward)) {
        record(0, true);
        return Err(Dropped);
    }
    record(parts.status.as_u16(), false);
    let mut out = Response::builder().status(parts.status);
    for (k, v) in parts.headers.iter() {
        if k != "transfer-encoding" && k != "connection" && k != "content-length" {
            out = out.header(k, v);
        }
    }
    Ok(out.body(body).expect("response"))
}

/// Sends one request to the target on this connection's upstream connection (opened or reopened as needed); the
/// answer's body is the caller's to read.
async fn forward(
    state: &State,
    upstream: &tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
    mut req: Request<Full<Bytes>>,
) -> Result<(hyper::http::response::Parts, Incoming), ()> {
    let host = format!("127.0.0.1:{}", state.upstream.port);
    req.headers_mut().insert("host", host.parse().map_err(|_| ())?);
    let resp = {
        let mut guard = upstream.lock().await;
        let reusable = match guard.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            *guard = Some(state.upstream.connect().await.map_err(|_| ())?);
        }
        let sender = guard.as_mut().ok_or(())?;
        match sender.send_request(req).await {
            Ok(r) => r,
            Err(_) => {
                *guard = None;
                return Err(());
            }
        }
    };
    Ok(resp.into_parts())
}

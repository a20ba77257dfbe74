//! Tests of [`super`] (serve.rs), in a file of their own to keep that one readable.

use super::*;
use crate::auth::authn::{Authenticator, StaticTokens};
use crate::auth::certs::{
    ensure_dev_certs, issue_client_cert, issue_serving_cert, CertAuthority, DevCertOptions, DevCerts,
};
use crate::auth::tls::{install_default_crypto_provider, reloadable_server_config, TlsReloader};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use std::path::Path;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn whoami(
    State(authn): State<Arc<Authenticator>>,
    peer: Option<Extension<PeerCertificates>>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    assert!(remote.ip().is_loopback());
    match authn.authenticate(peer.as_ref().map(|p| &p.0), &headers) {
        Some(user) => Json(user).into_response(),
        None => (StatusCode::UNAUTHORIZED, "no credentials").into_response(),
    }
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_millis(700)).await;
    "slow done"
}

/// How many `/watch` requests reached their handler.
static WATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A watch: one event, then nothing until the server shuts down.
async fn watch() -> Response {
    WATCHES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let first = futures::stream::once(async { Ok::<_, std::convert::Infallible>(Bytes::from_static(b"event\n")) });
    let mut r =
        Response::new(axum::body::Body::from_stream(futures::StreamExt::chain(first, futures::stream::pending())));
    r.extensions_mut().insert(LongRunning);
    r
}

struct TestServer {
    addr: SocketAddr,
    certs: DevCerts,
    reloader: TlsReloader,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    async fn start(options: ServeOptions) -> TestServer {
        install_default_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let certs = ensure_dev_certs(&DevCertOptions {
            cert_dir: dir.path().join("certs"),
            kubeconfig_server: format!("https://127.0.0.1:{}", addr.port()),
            ..DevCertOptions::default()
        })
        .expect("certs");
        let token_file = dir.path().join("tokens.csv");
        std::fs::write(&token_file, "# test tokens\nsecret-token,token-user,uid-42,\"team-a,team-b\"\n")
            .expect("token file");
        let (tls, reloader) =
            reloadable_server_config(&certs.serving_cert_path, &certs.serving_key_path, Some(&certs.client_ca_path))
                .expect("tls");
        let authn = Arc::new(
            Authenticator::from_token_file(&token_file)
                .expect("tokens")
                .with_trust(reloader.trust.clone().expect("client trust")),
        );
        let app = axum::Router::new()
            .route("/whoami", get(whoami))
            .route("/slow", get(slow))
            .route("/watch", get(watch))
            .with_state(authn);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_with_options(
            listener,
            tls,
            app,
            async {
                let _ = stopped.await;
            },
            options,
        ));
        TestServer { addr, certs, reloader, stop: Some(stop), task, _dir: dir }
    }

    fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.certs.ca_cert_path).expect("ca")
    }

    fn ca(&self) -> CertAuthority {
        CertAuthority::load(&self.certs.ca_cert_path, &self.certs.ca_key_path).expect("ca")
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("server stops").expect("server task");
    }
}

struct Client<'a> {
    ca_pem: &'a [u8],
    identity: Option<(String, String)>,
    server_name: &'a str,
    alpn: &'a [u8],
    tls12_only: bool,
}

impl<'a> Client<'a> {
    fn new(ca_pem: &'a [u8]) -> Self {
        Client { ca_pem, identity: None, server_name: "localhost", alpn: b"http/1.1", tls12_only: false }
    }

    async fn connect(&self, addr: SocketAddr) -> Result<TlsStream<TcpStream>, BoxError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem) {
            roots.add(cert?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: &[&rustls::SupportedProtocolVersion] = if self.tls12_only {
            &[&rustls::version::TLS12]
        } else {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => builder.with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes())?],
                PrivateKeyDer::from_pem_slice(key.as_bytes())?,
            )?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![self.alpn.to_vec()];
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from(self.server_name.to_string())?;
        Ok(TlsConnector::from(Arc::new(config)).connect(name, tcp).await?)
    }

    /// GET `path` on a fresh connection; returns status and body.
    async fn get(&self, addr: SocketAddr, path: &str, token: Option<&str>) -> Result<(StatusCode, String), BoxError> {
        let tls = self.connect(addr).await?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let mut req = axum::http::Request::get(format!("https://localhost{path}"));
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if !h2 {
            req = req.header(header::HOST, "localhost");
        }
        let req = req.body(Empty::<Bytes>::new())?;
        let resp = if h2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
            let conn = tokio::spawn(conn);
            match sender.send_request(req).await {
                Ok(resp) => resp,
                // The connection's own error (e.g. a TLS alert) says more.
                Err(e) => return Err(conn.await?.err().map_or(e, Into::into).into()),
            }
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
            let conn = tokio::spawn(conn);
            match sender.send_request(req).await {
                Ok(resp) => resp,
                Err(e) => return Err(conn.await?.err().map_or(e, Into::into).into()),
            }
        };
        assert_eq!(resp.version(), if h2 { axum::http::Version::HTTP_2 } else { axum::http::Version::HTTP_11 });
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_client_with_admin_kubeconfig() {
    let server = TestServer::start(ServeOptions::default()).await;
    let kubeconfig = kube::config::Kubeconfig::read_from(&server.certs.admin_kubeconfig_path).expect("read");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    for _ in 0..3 {
        let body = client
            .request_text(axum::http::Request::get("/whoami").body(Vec::new()).expect("request"))
            .await
            .expect("whoami");
        assert_eq!(
            json(&body),
            serde_json::json!({
                "name": "migration-admin",
                "uid": "",
                "groups": ["system:masters", "system:authenticated"],
                "extra": {},
            })
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_raw() {
    let kubectl = Path::new("/usr/bin/kubectl");
    if !kubectl.exists() {
        eprintln!("skipping: {} not found", kubectl.display());
        return;
    }
    let server = TestServer::start(ServeOptions::default()).await;
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&server.certs.admin_kubeconfig_path)
        .args(["get", "--raw", "/whoami", "--request-timeout=20s"])
        .output()
        .await
        .expect("run kubectl");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "kubectl failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    let user = json(&stdout);
    assert_eq!(user["name"], "migration-admin");
    assert_eq!(user["groups"], serde_json::json!(["system:masters", "system:authenticated"]));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_and_anonymous() {
    let server = TestServer::start(ServeOptions::default()).await;
    let ca = server.ca_pem();
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let client = Client { alpn, ..Client::new(&ca) };
        let (status, body) = client.get(server.addr, "/whoami", Some("secret-token")).await.expect("request");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            json(&body),
            serde_json::json!({
                "name": "token-user",
                "uid": "uid-42",
                "groups": ["team-a", "team-b", "system:authenticated"],
                "extra": {},
            })
        );
        let (status, _) = client.get(server.addr, "/whoami", Some("wrong-token")).await.expect("request");
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = client.get(server.addr, "/whoami", None).await.expect("request");
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_over_tls12_and_tls13_http1_and_h2() {
    let server = TestServer::start(ServeOptions::default()).await;
    let ca_pem = server.ca_pem();
    let identity = issue_client_cert(&server.ca(), "alice", &["dev", "ops"]).expect("issue");
    for tls12_only in [false, true] {
        for alpn in [&b"http/1.1"[..], b"h2"] {
            let client = Client { identity: Some(identity.clone()), alpn, tls12_only, ..Client::new(&ca_pem) };
            let (status, body) = client.get(server.addr, "/whoami", Some("secret-token")).await.expect("request");
            assert_eq!(status, StatusCode::OK);
            let user = json(&body);
            assert_eq!(user["name"], "alice", "tls12_only={tls12_only}");
            assert_eq!(user["groups"], serde_json::json!(["dev", "ops", "system:authenticated"]));
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_from_another_ca_is_no_identity() {
    let server = TestServer::start(ServeOptions::default()).await;
    let ca_pem = server.ca_pem();
    // Like Go's tls.RequestClientCert in kube-apiserver: the handshake only proves possession of the key; the
    // chain is verified by the authenticator, so a certificate of another CA (even one with the same subject as
    // ours) is simply no identity: 401.
    for ca_name in ["someone-else-ca", "migration-apiserver-ca"] {
        let other = CertAuthority::generate(ca_name).expect("other CA");
        let identity = issue_client_cert(&other, "mallory", &["system:masters"]).expect("issue");
        for tls12_only in [false, true] {
            let client = Client { identity: Some(identity.clone()), tls12_only, ..Client::new(&ca_pem) };
            let (status, _) = client.get(server.addr, "/whoami", None).await.expect("request");
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{ca_name} tls12_only={tls12_only}");
            // A valid token still works next to an untrusted certificate.
            let (status, body) = client.get(server.addr, "/whoami", Some("secret-token")).await.expect("request");
            assert_eq!(status, StatusCode::OK);
            assert_eq!(json(&body)["name"], "token-user");
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificate_names() {
    let server = TestServer::start(ServeOptions::default()).await;
    let ca_pem = server.ca_pem();
    for name in ["localhost", "127.0.0.1", "migration-apiserver.default.svc"] {
        let client = Client { server_name: name, ..Client::new(&ca_pem) };
        let tls = client.connect(server.addr).await.expect(name);
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    }
    let wrong_name = Client { server_name: "example.com", ..Client::new(&ca_pem) };
    assert!(wrong_name.connect(server.addr).await.is_err());
    let other = CertAuthority::generate("other").expect("other CA");
    assert!(Client::new(other.cert_pem().as_bytes()).connect(server.addr).await.is_err());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_neither_block_accepting_nor_live_forever() {
    let server =
        TestServer::start(ServeOptions { handshake_timeout: Duration::from_millis(300), ..ServeOptions::default() })
            .await;
    let ca_pem = server.ca_pem();
    // Connections that never send a ClientHello.
    let mut idle = Vec::new();
    for _ in 0..5 {
        idle.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(5),
        Client::new(&ca_pem).get(server.addr, "/whoami", Some("secret-token")),
    )
    .await
    .expect("not blocked by idle connections")
    .expect("request");
    assert_eq!(status, StatusCode::OK);
    for mut stream in idle {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("server closes the stalled connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_requests() {
    let server = TestServer::start(ServeOptions::default()).await;
    let addr = server.addr;
    let ca_pem = server.ca_pem();
    let in_flight = {
        let ca_pem = ca_pem.clone();
        tokio::spawn(async move { Client::new(&ca_pem).get(addr, "/slow", None).await })
    };
    let in_flight_h2 = {
        let ca_pem = ca_pem.clone();
        tokio::spawn(async move { Client { alpn: b"h2", ..Client::new(&ca_pem) }.get(addr, "/slow", None).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.stop().await;
    for task in [in_flight, in_flight_h2] {
        let (status, body) = task.await.expect("join").expect("in-flight request");
        assert_eq!((status, body.as_str()), (StatusCode::OK, "slow done"));
    }
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
}

/// Watches end, cleanly, as soon as the server shuts down, over HTTP/1.1 and HTTP/2: they do not hold the shutdown
/// for the grace period (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_long_running_responses_at_once() {
    let server = TestServer::start(ServeOptions::default()).await;
    let ca_pem = server.ca_pem();
    let watches: Vec<_> = [&b"http/1.1"[..], b"h2"]
        .into_iter()
        .map(|alpn| {
            let (ca_pem, addr) = (ca_pem.clone(), server.addr);
            tokio::spawn(async move { Client { alpn, ..Client::new(&ca_pem) }.get(addr, "/watch", None).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while WATCHES.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "the watches did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    for watch in watches {
        let (status, body) = watch.await.expect("join").expect("the watch ends cleanly");
        assert_eq!((status, body.as_str()), (StatusCode::OK, "event\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_period_is_bounded() {
    let server = TestServer::start(ServeOptions {
        shutdown_grace_period: Duration::from_millis(100),
        ..ServeOptions::default()
    })
    .await;
    let addr = server.addr;
    let ca_pem = server.ca_pem();
    let in_flight = tokio::spawn(async move { Client::new(&ca_pem).get(addr, "/slow", None).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(in_flight.await.expect("join").is_err(), "aborted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_serving_certificate_and_client_ca() {
    let server = TestServer::start(ServeOptions::default()).await;
    let ca_pem = server.ca_pem();
    let ca = server.ca();
    let served = |tls: &TlsStream<TcpStream>| tls.get_ref().1.peer_certificates().expect("server certs")[0].clone();

    let before = served(&Client::new(&ca_pem).connect(server.addr).await.expect("connect"));
    let (cert, key) = issue_serving_cert(&ca, &["localhost".to_string()]).expect("issue");
    std::fs::write(&server.certs.serving_cert_path, &cert).expect("write");
    std::fs::write(&server.certs.serving_key_path, &key).expect("write");
    server.reloader.reload().expect("reload");
    let after = served(&Client::new(&ca_pem).connect(server.addr).await.expect("connect"));
    assert_ne!(before, after);
    assert_eq!(after, CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem"));

    // A broken file keeps the current certificate.
    std::fs::write(&server.certs.serving_key_path, "garbage").expect("write");
    assert!(server.reloader.serving.reload().is_err());
    let still = served(&Client::new(&ca_pem).connect(server.addr).await.expect("connect"));
    assert_eq!(still, after);

    // Switch the client CA to another CA: its users are accepted, the old ones rejected.
    let other = CertAuthority::generate("other-ca").expect("other");
    let new_user = issue_client_cert(&other, "new-user", &["g"]).expect("issue");
    let old_user = issue_client_cert(&ca, "old-user", &["g"]).expect("issue");
    let get_as = |identity: (String, String)| {
        let ca_pem = ca_pem.clone();
        let addr = server.addr;
        async move {
            let (status, body) =
                Client { identity: Some(identity), ..Client::new(&ca_pem) }.get(addr, "/whoami", None).await?;
            Ok::<_, BoxError>((status == StatusCode::OK).then(|| json(&body)["name"].clone()))
        }
    };
    assert_eq!(get_as(old_user.clone()).await.expect("old CA"), Some("old-user".into()));
    assert_eq!(get_as(new_user.clone()).await.expect("request"), None);
    std::fs::write(&server.certs.client_ca_path, other.cert_pem()).expect("write");
    server.reloader.reload_client_ca().expect("reload");
    assert_eq!(get_as(new_user).await.expect("new CA"), Some("new-user".into()));
    assert_eq!(get_as(old_user).await.expect("request"), None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_ca_means_no_client_certificates() {
    install_default_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = ensure_dev_certs(&DevCertOptions { cert_dir: dir.path().to_path_buf(), ..DevCertOptions::default() })
        .expect("certs");
    let tls = crate::auth::tls::server_config(&certs.serving_cert_path, &certs.serving_key_path, None).expect("tls");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let authn = Arc::new(Authenticator::new().with_tokens(StaticTokens::default()));
    let app = axum::Router::new().route("/whoami", get(whoami)).with_state(authn);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, tls, app, async {
        let _ = stopped.await;
    }));
    let ca_pem = std::fs::read(&certs.ca_cert_path).expect("ca");
    let admin = (
        std::fs::read_to_string(&certs.admin_cert_path).expect("cert"),
        std::fs::read_to_string(&certs.admin_key_path).expect("key"),
    );
    let (status, _) =
        Client { identity: Some(admin), ..Client::new(&ca_pem) }.get(addr, "/whoami", None).await.expect("request");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let _ = stop.send(());
    task.await.expect("server");
}

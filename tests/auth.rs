//! Authentication and authorization without a cluster (static tokens, the generated admin certificate, the front
//! proxy configured by files). The deploy kit's manifests are tests/deploy_kit_manifests.rs's.
//!
//! The front proxy is played here with real certificates and real HTTPS: a front-proxy CA and client certificate
//! made by the test, and the X-Remote-* headers set as kube-apiserver's aggregator sets them. Delegation to a cluster
//! (TokenReview, SubjectAccessReview, the extension-apiserver-authentication ConfigMap and its rotation) runs against
//! a real kube-apiserver: tests/cluster_delegation.rs and tests/cluster_auth.rs.

mod common;
use common::*;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use migration_apiserver::auth::certs::{issue_client_cert, CertAuthority};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use tokio::net::TcpStream;

const GROUP: &str = "migration.k8s.io";
const SS_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";
const FRONT_PROXY_CN: &str = "front-proxy-client";

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The front proxy's CA and its client certificate, as kube-apiserver's --requestheader-client-ca-file and
/// --proxy-client-cert-file would hold them.
struct Pki {
    front_proxy_ca: CertAuthority,
}

impl Pki {
    fn new(suffix: &str) -> Pki {
        Pki { front_proxy_ca: CertAuthority::generate(&format!("front-proxy-ca{suffix}")).expect("front-proxy CA") }
    }

    /// kube-apiserver's --proxy-client-cert-file.
    fn front_proxy(&self) -> (String, String) {
        issue_client_cert::<&str>(&self.front_proxy_ca, FRONT_PROXY_CN, &[]).expect("proxy cert")
    }
}

// ---------------------------------------------------------------------------------------------------------------
// an HTTPS client with full control over certificate and headers (a new connection per request)

struct Reply {
    status: u16,
    body: Vec<u8>,
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
        Ok(Reply { status, body })
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

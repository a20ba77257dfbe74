//! Authentication and authorization without a cluster (static tokens, the generated admin certificate, the front
//! proxy configured by files), and the deploy kit (manifests/, apiservice/, scripts/deploy.sh) rendered and checked
//! offline.
//!
//! The front proxy is played here with real certificates and real HTTPS: a front-proxy CA and client certificate
//! made by the test, and the X-Remote-* headers set as kube-apiserver's aggregator sets them. Delegation to a cluster
//! (TokenReview, SubjectAccessReview, the extension-apiserver-authentication ConfigMap and its rotation) runs against
//! a real kube-apiserver: tests/cluster_delegation.rs and tests/cluster_auth.rs.

mod common;
use common::status::strings;
use common::*;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use migration_apiserver::auth::certs::{issue_client_cert, CertAuthority};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use serde_json::{json, Value};
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
    // kube-system; that the server asks a real kube-apiserver for nothing beyond them is checked in
    // tests/cluster_delegation.rs (delegated_authentication_and_authorization).
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

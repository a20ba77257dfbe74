//! What tests/cluster_delegation.rs uses to talk to this server directly (curl, as the aggregator does) and to read
//! the real cluster: RBAC, tokens, kube-apiserver's own answers and its audit log.

use crate::common::cluster::Cluster;
use crate::common::{eventually, Server};
use base64::Engine;
use migration_apiserver::auth::certs::{issue_client_cert, CertAuthority};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const GROUP: &str = "migration.k8s.io";
pub const SS_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";
pub const MINUTE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------------------------
// requests to this server, directly (curl)

/// The server under test: its URL and the CA of its serving certificate.
pub struct Target {
    pub url: String,
    pub ca: PathBuf,
}

/// A client certificate and its key.
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Identity {
    pub fn pki(c: &Cluster, name: &str) -> Identity {
        Identity { cert: c.pki(&format!("{name}.crt")), key: c.pki(&format!("{name}.key")) }
    }

    /// A certificate of `ca` for `cn` in `groups`, written to `dir`.
    pub fn issue(dir: &Path, ca: &CertAuthority, cn: &str, groups: &[&str]) -> Identity {
        let (cert, key) = issue_client_cert(ca, cn, groups).expect("client certificate");
        let id = Identity { cert: dir.join(format!("{cn}.crt")), key: dir.join(format!("{cn}.key")) };
        std::fs::write(&id.cert, cert).expect("write");
        std::fs::write(&id.key, key).expect("write");
        id
    }
}

pub struct Reply {
    pub code: u16,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}), {}: {}", self.code, self.text))
    }

    /// Asserts a Status of `code` and `reason`, and returns it.
    pub fn status(&self, code: u16, reason: &str) -> Value {
        let s = self.json();
        assert_eq!(
            (self.code, s["kind"].as_str(), s["reason"].as_str(), s["code"].as_u64()),
            (code, Some("Status"), Some(reason), Some(u64::from(code))),
            "{s}"
        );
        s
    }
}

/// `method path` to the server under test with curl: the client certificate `id`, `headers` as given, `body` as JSON.
pub fn call(
    t: &Target,
    method: &str,
    path: &str,
    id: Option<&Identity>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-X", method, "-w", "\n%{http_code}", "--cacert"]).arg(&t.ca);
    if let Some(id) = id {
        cmd.arg("--cert").arg(&id.cert).arg("--key").arg(&id.key);
    }
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", &b.to_string()]);
    }
    let out = cmd.arg(format!("{}{path}", t.url)).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or_else(|| panic!("{method} {path}: {text}{out:?}"));
    Reply { code: code.parse().unwrap_or_else(|_| panic!("{method} {path}: {out:?}")), text: body.to_string() }
}

pub fn get(t: &Target, path: &str, id: Option<&Identity>, headers: &[(&str, &str)]) -> Reply {
    call(t, "GET", path, id, headers, None)
}

/// Headers as kube-apiserver's proxy sets them for `user` in `groups`.
pub fn as_user<'a>(user: &'a str, groups: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("X-Remote-User", user)];
    h.extend(groups.iter().map(|g| ("X-Remote-Group", *g)));
    h
}

pub const AGGREGATOR: [(&str, &str); 2] =
    [("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters")];
pub const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The aggregator's availability probe, and discovery through the front proxy.
pub fn assert_aggregator_probe_passes(t: &Target, proxy: &Identity) {
    for gv in ["migration.k8s.io/v1alpha1", "core.gardener.cloud/v1alpha1", "core.gardener.cloud/v1beta1"] {
        let r = get(t, &format!("/apis/{gv}"), Some(proxy), &AGGREGATOR);
        assert_eq!(r.code, 200, "probe of {gv}: {}", r.text);
        assert_eq!((r.json()["kind"].as_str(), r.json()["groupVersion"].as_str()), (Some("APIResourceList"), Some(gv)));
    }
    // /apis: a valid aggregated discovery document, or 406, never 404.
    let mut accept = AGGREGATOR.to_vec();
    accept.push(("Accept", AGGREGATED_V2));
    let doc = get(t, "/apis", Some(proxy), &accept).json();
    assert_eq!(
        (doc["apiVersion"].as_str(), doc["kind"].as_str()),
        (Some("apidiscovery.k8s.io/v2"), Some("APIGroupDiscoveryList"))
    );
    let groups: Vec<&str> =
        doc["items"].as_array().expect("items").iter().filter_map(|g| g["metadata"]["name"].as_str()).collect();
    assert!(groups.contains(&GROUP) && groups.contains(&"core.gardener.cloud"), "{groups:?}");
    accept[2].1 = "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList";
    get(t, "/apis", Some(proxy), &accept).status(406, "NotAcceptable");
    assert_eq!(get(t, "/apis", Some(proxy), &AGGREGATOR).json()["kind"], "APIGroupList");
}

// ---------------------------------------------------------------------------------------------------------------
// the cluster: RBAC, tokens, kube-apiserver's own answers and its audit log

pub fn apply(c: &Cluster, objects: &[Value]) {
    let stream: String = objects.iter().map(|o| format!("{o}\n")).collect();
    c.kubectl_ok_stdin(&["apply", "-f", "-"], &stream);
}

pub fn cluster_role(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
        "rules": rules})
}

pub fn service_account(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
}

/// A RoleBinding (in `namespace`) or ClusterRoleBinding of `role` (a ClusterRole, or a Role in the namespace) to
/// `subject`.
pub fn binding(name: &str, namespace: Option<&str>, role: (&str, &str), subject: Value) -> Value {
    let (kind, meta) = match namespace {
        Some(ns) => ("RoleBinding", json!({"name": name, "namespace": ns})),
        None => ("ClusterRoleBinding", json!({"name": name})),
    };
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role.0, "name": role.1}, "subjects": [subject]})
}

pub fn user(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name})
}

pub fn namespace(c: &Cluster, name: &str) {
    apply(c, &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})]);
}

/// Waits until kube-apiserver's own SubjectAccessReview allows `user` `attributes` (resourceAttributes, or
/// nonResourceAttributes when they name a path): RBAC changes take effect a moment after they are written.
pub fn wait_allowed(c: &Cluster, user: &str, attributes: Value) {
    let key = if attributes.get("path").is_some() { "nonResourceAttributes" } else { "resourceAttributes" };
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:authenticated"], key: attributes}})
    .to_string();
    eventually(&format!("kube-apiserver to allow {user} {attributes}"), MINUTE, || {
        let answer = c.kubectl_ok_stdin(&["create", "-f", "-", "-o", "json"], &review);
        (serde_json::from_str::<Value>(&answer).expect("JSON")["status"]["allowed"] == true).then_some(())
    });
}

/// A token of the ServiceAccount `namespace/name`.
pub fn token(c: &Cluster, namespace: &str, name: &str) -> String {
    c.kubectl_ok(&["-n", namespace, "create", "token", name, "--duration=2h"]).trim().to_string()
}

/// A token's ID, which kube-apiserver's audit log gives as the user's `authentication.kubernetes.io/credential-id`.
pub fn jti(token: &str) -> String {
    let payload = token.split('.').nth(1).expect("a JWT");
    let claims: Value =
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64"))
            .expect("claims");
    claims["jti"].as_str().expect("jti").to_string()
}

pub fn token_kubeconfig(c: &Cluster, path: &Path, token: &str) {
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster: {{server: '{}', certificate-authority: \
         '{}'}}\nusers:\n- name: u\n  user: {{token: '{token}'}}\ncontexts:\n- name: local\n  context: {{cluster: \
         local, user: u}}\ncurrent-context: local\n",
        c.url(),
        c.pki("ca.crt").display()
    );
    std::fs::write(path, kubeconfig).expect("kubeconfig");
}

/// kube-apiserver's own refusal of `kubectl <args>` as the administrator (`--as` someone, authorized by its RBAC):
/// the Status kubectl -v=8 logged.
pub fn kube_apiserver_error(c: &Cluster, args: &[&str]) -> Value {
    let out = c.kubectl_as(&c.admin(), &[&["-v=8"], args].concat(), None);
    assert!(!out.status.success(), "kube-apiserver allowed {args:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("\"kind\":\"Status\"")).unwrap_or_else(|| panic!("{stderr}"));
    serde_json::from_str(line[line.find('{').expect("json")..].trim_end_matches('\'')).expect("Status")
}

/// kube-apiserver's own refusal of `kubectl --as user <args>`.
pub fn kube_apiserver_refusal(c: &Cluster, user: &str, args: &[&str]) -> Value {
    kube_apiserver_error(c, &[&["--as", user], args].concat())
}

/// kube-apiserver's audit events.
pub fn audit(c: &Cluster) -> Vec<Value> {
    let log = std::fs::read_to_string(c.dir.join("logs/kube-apiserver-audit.log")).unwrap_or_default();
    log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The requests made to kube-apiserver with the token `jti` (a watch appears twice: started and complete).
pub fn requests_of(c: &Cluster, jti: &str) -> Vec<Value> {
    let id = json!([format!("JTI={jti}")]);
    audit(c).into_iter().filter(|e| e["user"]["extra"]["authentication.kubernetes.io/credential-id"] == id).collect()
}

/// The specs of the `resource` reviews (tokenreviews, subjectaccessreviews) made with the token `jti`.
pub fn reviews(c: &Cluster, jti: &str, resource: &str) -> Vec<Value> {
    let made = requests_of(c, jti).into_iter().filter(|e| e["objectRef"]["resource"] == resource);
    made.map(|e| e["requestObject"]["spec"].clone()).collect()
}

/// Waits until the audit log shows a SubjectAccessReview made with `jti` about `user`: every review asked before
/// it is in the log by then.
pub fn wait_for_review_of(c: &Cluster, jti: &str, user: &str) -> Value {
    eventually(&format!("a review of {user} in kube-apiserver's audit log"), MINUTE, || {
        reviews(c, jti, "subjectaccessreviews").into_iter().find(|s| s["user"] == user)
    })
}

/// This server started beside the cluster's (its own port and store), delegating both authentication and
/// authorization to kube-apiserver as the kit's ServiceAccount, with a token of its own; and that token's ID.
pub fn delegating_server(c: &Cluster, dir: &Path, extra: &[&str]) -> (Server, String) {
    let token = token(c, "migration-apiserver", "migration-apiserver");
    let kubeconfig = dir.join("server.kubeconfig");
    token_kubeconfig(c, &kubeconfig, &token);
    let kc = kubeconfig.to_str().expect("utf-8");
    let mut args = vec!["--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc];
    args.extend_from_slice(extra);
    (Server::start(&args), jti(&token))
}

pub fn target(s: &Server) -> Target {
    Target { url: s.url(), ca: s.cert_dir().join("ca.crt") }
}

// ---------------------------------------------------------------------------------------------------------------
// rotation

/// Starts `name` again with `--flag=value` for each of `flags` in place of the value it was started with (in the
/// command line scripts/cluster.sh keeps, NUL-separated, in cmds/<name>), and waits until it serves.
pub fn restart_with_flags(c: &Cluster, name: &str, flags: &[(&str, &Path)]) {
    let path = c.dir.join("cmds").join(name);
    let cmd = String::from_utf8(std::fs::read(&path).expect("command line")).expect("utf-8");
    let mut args: Vec<String> = cmd.split('\0').filter(|a| !a.is_empty()).map(str::to_string).collect();
    for (flag, value) in flags {
        let arg = args.iter_mut().find(|a| a.starts_with(&format!("{flag}="))).expect("a flag it was started with");
        *arg = format!("{flag}={}", value.display());
    }
    std::fs::write(&path, args.iter().map(|a| format!("{a}\0")).collect::<String>()).expect("write");
    c.restart(name);
}

pub fn replace_file(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The certificates of a PEM bundle (DER), in no order.
pub fn ders(pem: &str) -> BTreeSet<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).map(|c| c.expect("PEM").to_vec()).collect()
}

/// The certificate the server presents to a new connection.
pub fn served_certificate(t: &Target) -> Vec<u8> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&t.ca).expect("CA") {
        roots.add(cert.expect("PEM")).expect("root");
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("TLS");
    let mut tcp = std::net::TcpStream::connect(t.url.trim_start_matches("https://")).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp).expect("handshake");
    }
    tls.peer_certificates().expect("a certificate")[0].to_vec()
}

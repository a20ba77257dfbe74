//! Delegated authentication and authorization against a real kube-apiserver (v1.37.2, `make cluster`): kube-apiserver
//! answers this server's TokenReviews and SubjectAccessReviews (RBAC, set up by each test), publishes the
//! kube-system/extension-apiserver-authentication ConfigMap and rewrites it when restarted with other CAs, and refuses
//! it to a kubeconfig it does not accept (401) or whose user may not read it (403). What this server asked, and how
//! often (its caches), is read from kube-apiserver's audit log, which records TokenReviews and SubjectAccessReviews at
//! Request level; where kube-apiserver refuses the same request itself, its Status is the oracle for ours.
//!
//! Requests reach this server directly, as the aggregator sends them: with the cluster's front-proxy client
//! certificate and the user in X-Remote-* headers. Three tests run a server of their own on the shared cluster,
//! delegating as the kit's ServiceAccount with a token of its own, whose ID (JTI) tells its requests apart in the
//! audit log; the CA rotation restarts kube-apiserver, so it has a cluster of its own and rotates that cluster's
//! server.
//!
//! None of this needs a stand-in for kube-apiserver any more: each case (a wrong token, a user without rights, rotated
//! CAs, an object that cannot be read) the real cluster shows on demand. Helpers: tests/cluster_delegation/support.rs.

mod common;
#[path = "cluster_delegation/support.rs"]
mod support;
use common::cluster::{shared, Cluster, Options};
use common::{eventually, repo, Server};
use migration_apiserver::auth::certs::{issue_serving_cert, CertAuthority};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

const SERVICE_ACCOUNT: &str = "system:serviceaccount:migration-apiserver:migration-apiserver";
/// What system:auth-delegator and extension-apiserver-authentication-reader grant (manifests/rbac.yaml binds both):
/// every request the server makes to the cluster for authentication and authorization must be one of these.
const DELEGATION_GRANTS: [(&str, &str); 5] = [
    ("create", "tokenreviews"),
    ("create", "subjectaccessreviews"),
    ("get", "configmaps/extension-apiserver-authentication"),
    ("list", "configmaps/extension-apiserver-authentication"),
    ("watch", "configmaps/extension-apiserver-authentication"),
];

// ---------------------------------------------------------------------------------------------------------------

/// Who a request is, what kube-apiserver is asked about it and how often; what is refused and with which words
/// (kube-apiserver's own, compared where kube-apiserver refuses the same request itself).
#[test]
fn delegated_authentication_and_authorization() {
    let c = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    // Caching within the TTL is what is shown: a TTL no slow machine outlasts.
    let ttls = [
        "--authentication-token-webhook-cache-ttl=10m",
        "--authorization-webhook-cache-authorized-ttl=10m",
        "--authorization-webhook-cache-unauthorized-ttl=10m",
    ];
    let (s, jti) = delegating_server(c, dir.path(), &ttls);
    let t = target(&s);
    let proxy = Identity::pki(c, "front-proxy-client");
    // RBAC: alice reads storagestates; bob (a ServiceAccount) lists them; the webhook caller the kit binds.
    namespace(c, "delegation");
    apply(
        c,
        &[
            service_account("delegation", "bob"),
            cluster_role(
                "delegation:reader",
                json!([{"apiGroups": [GROUP], "resources": ["storagestates"], "verbs": ["get", "list", "watch"]}]),
            ),
            binding("delegation:alice", None, ("ClusterRole", "delegation:reader"), user("alice")),
            binding(
                "delegation:bob",
                None,
                ("ClusterRole", "delegation:reader"),
                json!({"kind": "ServiceAccount", "name": "bob", "namespace": "delegation"}),
            ),
        ],
    );
    c.kubectl_ok(&["apply", "-k", repo().join("manifests/webhook-caller").to_str().expect("utf-8")]);
    let list = json!({"verb": "list", "group": GROUP, "version": "v1alpha1", "resource": "storagestates"});
    wait_allowed(c, "alice", list.clone());
    wait_allowed(c, "system:serviceaccount:delegation:bob", list.clone());
    wait_allowed(c, "migration-apiserver-webhook-client", json!({"path": "/validate", "verb": "post"}));

    // The aggregator: system:masters is never reviewed (checked below, once later reviews are in the log).
    assert_aggregator_probe_passes(&t, &proxy);

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
    for _ in 0..4 {
        let r = get(&t, SS_PATH, Some(&proxy), &alice);
        assert_eq!((r.code, r.json()["kind"].as_str()), (200, Some("StorageStateList")), "{}", r.text);
    }
    assert_eq!(
        wait_for_review_of(c, &jti, "alice"),
        json!({"user": "alice", "uid": "uid-alice", "groups": ["devs", "ops", "system:authenticated"],
               "extra": {"acme.com/project": ["p1"], "scopes": ["read"]}, "resourceAttributes": list})
    );
    // Watch is its own verb; a fieldSelector on the name makes it a question about that object.
    let r = get(
        &t,
        &format!("{SS_PATH}?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3Dpods"),
        Some(&proxy),
        &alice,
    );
    assert_eq!(r.code, 200, "{}", r.text);

    // Denied: 403 naming user, verb and resource, word for word kube-apiserver's; denials are cached too.
    for _ in 0..2 {
        let ours = call(&t, "DELETE", &format!("{SS_PATH}/pods"), Some(&proxy), &alice, None).status(403, "Forbidden");
        assert_eq!(ours, kube_apiserver_refusal(c, "alice", &["delete", "--raw", &format!("{SS_PATH}/pods")]));
        assert_eq!(ours["details"], json!({"name": "pods", "group": GROUP, "kind": "storagestates"}));
    }
    let st = call(&t, "PATCH", &format!("{SS_PATH}/pods/status"), Some(&proxy), &alice, Some(&json!({})));
    let st = st.status(403, "Forbidden");
    assert!(
        st["message"].as_str().unwrap_or_default().contains("cannot patch resource \"storagestates/status\""),
        "{st}"
    );
    for path in ["/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates", "/metrics"] {
        let ours = get(&t, path, Some(&proxy), &alice).status(403, "Forbidden");
        assert_eq!(ours, kube_apiserver_refusal(c, "alice", &["get", "--raw", path]), "{path}");
    }
    // Discovery is a non-resource request (system:discovery allows it).
    assert_eq!(get(&t, "/apis/migration.k8s.io/v1alpha1", Some(&proxy), &alice).code, 200);

    // The identity headers mean nothing without the front proxy's certificate,
    let masters = as_user("mallory", &["system:masters"]);
    get(&t, SS_PATH, None, &masters).status(401, "Unauthorized");
    // ... with a certificate of another CA, even with the proxy's name,
    let other = CertAuthority::generate("front-proxy-ca").expect("CA");
    get(&t, SS_PATH, Some(&Identity::issue(dir.path(), &other, "front-proxy-client", &[])), &masters)
        .status(401, "Unauthorized");
    // ... with the cluster's front-proxy CA's certificate of a name that kube-apiserver does not allow,
    let front_proxy_ca = CertAuthority::load(&c.pki("front-proxy-ca.crt"), &c.pki("front-proxy-ca.key")).expect("CA");
    get(&t, SS_PATH, Some(&Identity::issue(dir.path(), &front_proxy_ca, "not-the-proxy", &[])), &masters)
        .status(401, "Unauthorized");
    // ... or with a client certificate of the cluster CA: that user is itself, the headers are ignored.
    let cluster_ca = CertAuthority::load(&c.pki("ca.crt"), &c.pki("ca.key")).expect("CA");
    let carol = Identity::issue(dir.path(), &cluster_ca, "carol", &["qa"]);
    let st = get(&t, SS_PATH, Some(&carol), &masters).status(403, "Forbidden");
    assert!(st["message"].as_str().unwrap_or_default().contains("User \"carol\" cannot list"), "{st}");
    // The server's own dev admin certificate is trusted for nothing in a cluster; the cluster's admin (system:masters)
    // is allowed without a review.
    let dev_admin = Identity { cert: s.cert_dir().join("admin.crt"), key: s.cert_dir().join("admin.key") };
    get(&t, SS_PATH, Some(&dev_admin), &[]).status(401, "Unauthorized");
    assert_eq!(get(&t, SS_PATH, Some(&Identity::pki(c, "admin")), &[]).code, 200);

    // Bearer tokens through TokenReview, cached (valid and invalid alike); the review carries what kube-apiserver's
    // TokenReview says of the token.
    let bob_token = token(c, "delegation", "bob");
    let bob = [("Authorization", format!("Bearer {bob_token}"))];
    let bob: Vec<(&str, &str)> = bob.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for _ in 0..2 {
        let r = get(&t, SS_PATH, None, &bob);
        assert_eq!(r.code, 200, "{}", r.text);
    }
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": bob_token}});
    let answer: Value =
        serde_json::from_str(&c.kubectl_ok_stdin(&["create", "-f", "-", "-o", "json"], &review.to_string()))
            .expect("JSON");
    let who = &answer["status"]["user"];
    let bob_name = who["username"].as_str().expect("username");
    assert_eq!(
        wait_for_review_of(c, &jti, bob_name),
        json!({"user": bob_name, "uid": who["uid"], "groups": who["groups"], "extra": who["extra"],
            "resourceAttributes": list})
    );
    let wrong = [("Authorization", "Bearer not-a-token")];
    get(&t, SS_PATH, None, &wrong).status(401, "Unauthorized");
    get(&t, SS_PATH, None, &wrong).status(401, "Unauthorized");
    get(&t, SS_PATH, None, &[]).status(401, "Unauthorized");

    // The webhook endpoints: kube-apiserver's webhook client certificate, authorized as POST on the path.
    let admission = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": GROUP, "version": "v1alpha1", "kind": "StorageState"},
        "resource": {"group": GROUP, "version": "v1alpha1", "resource": "storagestates"},
        "name": "pods", "operation": "CREATE", "userInfo": {"username": "admin"},
        "object": {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": "pods"},
                   "spec": {"resource": {"group": "", "resource": "pods"}}}}});
    let r = call(&t, "POST", "/validate?timeout=10s", Some(&Identity::pki(c, "webhook-client")), &[], Some(&admission));
    assert_eq!((r.code, &r.json()["response"]["allowed"]), (200, &json!(true)), "{}", r.text);
    let st = call(&t, "POST", "/validate", Some(&carol), &[], Some(&admission)).status(403, "Forbidden");
    assert_eq!(st["message"], "forbidden: User \"carol\" cannot post path \"/validate\"");
    let file = dir.path().join("admission.json");
    std::fs::write(&file, admission.to_string()).expect("write");
    let kube =
        kube_apiserver_refusal(c, "carol", &["create", "--raw", "/validate", "-f", file.to_str().expect("utf-8")]);
    assert_eq!(st, kube);

    // Health needs no credentials.
    for path in ["/healthz", "/livez", "/readyz", "/readyz/ping", "/version"] {
        assert_eq!(get(&t, path, None, &[]).code, 200, "{path}");
    }

    // What kube-apiserver was asked, once the last question is in its log.
    get(&t, SS_PATH, Some(&proxy), &as_user("last-question", &[])).status(403, "Forbidden");
    wait_for_review_of(c, &jti, "last-question");
    let sars = reviews(c, &jti, "subjectaccessreviews");
    // How often `user` was asked about exactly `attributes`.
    let asked = |user: &str, attributes: &Value| {
        sars.iter().filter(|s| s["user"] == user && s["resourceAttributes"] == *attributes).count()
    };
    for masters in ["system:kube-aggregator", "kubernetes-admin"] {
        assert!(sars.iter().all(|s| s["user"] != masters), "{masters} (system:masters) was reviewed: {sars:?}");
    }
    let pods = |verb: &str| {
        json!({"verb": verb, "group": GROUP, "version": "v1alpha1", "resource": "storagestates",
            "name": "pods"})
    };
    assert_eq!(asked("alice", &list), 1, "allowed: asked once, then cached: {sars:?}");
    assert_eq!(asked("alice", &pods("delete")), 1, "denied: asked once, then cached: {sars:?}");
    assert_eq!(asked("alice", &pods("watch")), 1, "{sars:?}");
    assert_eq!(asked(bob_name, &list), 1, "{sars:?}");
    let discovery = json!({"path": "/apis/migration.k8s.io/v1alpha1", "verb": "get"});
    assert!(sars.iter().any(|s| s["user"] == "alice" && s["nonResourceAttributes"] == discovery), "{sars:?}");
    let carol_review = json!({"user": "carol", "groups": ["qa", "system:authenticated"], "resourceAttributes": list});
    assert_eq!(sars.iter().filter(|s| **s == carol_review).count(), 1, "no extra, no uid: {sars:?}");
    let webhook = json!({"path": "/validate", "verb": "post"});
    assert!(sars
        .iter()
        .any(|s| s["user"] == "migration-apiserver-webhook-client" && s["nonResourceAttributes"] == webhook));
    let tokens = reviews(c, &jti, "tokenreviews");
    let reviewed = |token: &str| tokens.iter().filter(|s| s["token"] == token).count();
    assert_eq!((reviewed(&bob_token), reviewed("not-a-token")), (1, 1), "each token reviewed once: {tokens:?}");

    // Every request the server made to kube-apiserver is covered by system:auth-delegator and
    // extension-apiserver-authentication-reader (manifests/rbac.yaml), and kube-apiserver granted it.
    let made = requests_of(c, &jti);
    for e in &made {
        let r = &e["objectRef"];
        let resource = match r["name"].as_str() {
            Some(name) => format!("{}/{name}", r["resource"].as_str().unwrap_or_default()),
            None => r["resource"].as_str().unwrap_or_default().to_string(),
        };
        let verb = e["verb"].as_str().unwrap_or_default();
        assert!(DELEGATION_GRANTS.contains(&(verb, resource.as_str())), "beyond the grants: {e}");
        assert!(e["responseStatus"]["code"].as_u64().is_some_and(|code| code < 400), "refused: {e}");
        assert!(!resource.starts_with("configmaps") || r["namespace"] == "kube-system", "{e}");
    }
    assert!(made.iter().any(|e| e["verb"] == "watch"), "the ConfigMap is watched");
}

/// Runs `serve` delegating authentication to `kubeconfig`, which must end in a failure within a minute; its stderr.
fn failed_start(dir: &Path, kubeconfig: &Path) -> String {
    let run = tempfile::tempdir_in(dir).expect("tempdir");
    let stderr = run.path().join("stderr");
    let mut child = Command::new(common::BIN)
        .args(["serve", "--disable-scheduler", "--secure-port", &common::free_port().to_string()])
        .arg("--authentication-kubeconfig")
        .arg(kubeconfig)
        .arg("--data-dir")
        .arg(run.path().join("data"))
        .arg("--cert-dir")
        .arg(run.path().join("certs"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("stderr"))
        .spawn()
        .expect("serve");
    let deadline = Instant::now() + MINUTE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            common::kill9_child(Some(child));
            panic!("the server still runs after a minute: {}", std::fs::read_to_string(&stderr).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&stderr).expect("stderr");
    assert!(!status.success(), "{stderr}");
    stderr
}

/// The ConfigMap is read at start: a kubeconfig kube-apiserver does not accept (401) or whose user may not read it
/// (403) fails the start; tolerated, the server starts and picks the ConfigMap up once it may read it.
#[test]
fn unreadable_authentication_configmap_fails_the_start_unless_tolerated() {
    let c = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let wrong = dir.path().join("wrong.kubeconfig");
    token_kubeconfig(c, &wrong, "not-a-token");
    let stderr = failed_start(dir.path(), &wrong);
    assert!(
        stderr.contains(
            "error: reading ConfigMap kube-system/extension-apiserver-authentication: ApiError: Unauthorized"
        ) && stderr.contains("code: 401"),
        "{stderr}"
    );

    namespace(c, "delegation-lookup");
    let sa = json!({"kind": "ServiceAccount", "name": "lookup", "namespace": "delegation-lookup"});
    apply(c, &[service_account("delegation-lookup", "lookup")]);
    let rightless = dir.path().join("rightless.kubeconfig");
    token_kubeconfig(c, &rightless, &token(c, "delegation-lookup", "lookup"));
    let stderr = failed_start(dir.path(), &rightless);
    assert!(
        stderr.contains(
            "configmaps \"extension-apiserver-authentication\" is forbidden: User \
             \"system:serviceaccount:delegation-lookup:lookup\" cannot get resource \"configmaps\" in API group \
             \"\" in the namespace \"kube-system\""
        ) && stderr.contains("code: 403"),
        "{stderr}"
    );

    // Tolerated: the server starts (healthy) without the cluster's front-proxy CA, and trusts the front proxy once
    // kube-apiserver lets it read the ConfigMap (the kit's RoleBinding, given late).
    let s = Server::start(&[
        "--authentication-kubeconfig",
        rightless.to_str().expect("utf-8"),
        "--authentication-tolerate-lookup-failure",
    ]);
    let t = target(&s);
    let proxy = Identity::pki(c, "front-proxy-client");
    assert_eq!(get(&t, "/readyz", None, &[]).code, 200);
    get(&t, SS_PATH, Some(&proxy), &AGGREGATOR).status(401, "Unauthorized");
    let reader = ("Role", "extension-apiserver-authentication-reader");
    apply(c, &[binding("delegation-lookup:reader", Some("kube-system"), reader, sa)]);
    eventually("the ConfigMap read once allowed", 2 * MINUTE, || {
        (get(&t, SS_PATH, Some(&proxy), &AGGREGATOR).code == 200).then_some(())
    });
}

/// The unsafe delete of an unreadable object (`ignoreStoreReadErrorWithClusterBreakingPotential`) is asked of the
/// authorizer as its own verb on the same object, as kube-apiserver asks it: a user allowed to delete is not
/// allowed to remove what cannot be read unless allowed that too. kube-apiserver's own answers for a custom resource
/// that does not decode are the oracle.
#[test]
fn unsafe_delete_of_an_unreadable_object_needs_its_own_permission() {
    if common::etcd_backend_selected() {
        return; // the unreadable object is written straight into the embedded store
    }
    let c = shared();
    const NS: &str = "unsafe-delete";
    const UNSAFE: &str = "unsafe-delete-ignore-read-errors";
    namespace(c, NS);
    let rules = |verbs: &[&str]| {
        json!([{"apiGroups": ["core.gardener.cloud"], "resources": ["shootstates"], "verbs": verbs},
               {"apiGroups": ["delegation.example.com"], "resources": ["unreadables"], "verbs": verbs}])
    };
    apply(
        c,
        &[
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "unreadables.delegation.example.com"},
                "spec": {"group": "delegation.example.com", "scope": "Namespaced",
                    "names": {"plural": "unreadables", "singular": "unreadable", "kind": "Unreadable"},
                    "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema":
                        {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}),
            cluster_role("unsafe-delete:delete", rules(&["delete"])),
            cluster_role("unsafe-delete:unsafe", rules(&["delete", UNSAFE])),
            binding("dave", Some(NS), ("ClusterRole", "unsafe-delete:delete"), user("dave")),
            binding("erin", Some(NS), ("ClusterRole", "unsafe-delete:unsafe"), user("erin")),
        ],
    );
    let on = |verb: &str, group: &str, resource: &str| {
        json!({"verb": verb, "group": group, "resource": resource,
            "namespace": NS, "name": "bad"})
    };
    for (group, resource) in [("core.gardener.cloud", "shootstates"), ("delegation.example.com", "unreadables")] {
        wait_allowed(c, "dave", on("delete", group, resource));
        wait_allowed(c, "erin", on(UNSAFE, group, resource));
    }
    c.kubectl_ok(&["wait", "--for=condition=Established", "crd/unreadables.delegation.example.com", "--timeout=60s"]);

    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, jti) = delegating_server(c, dir.path(), &[]);
    s.stop();
    s.write_raw(&format!("/registry/core.gardener.cloud/shootstates/{NS}/bad"), b"not json");
    s.restart();
    c.etcdctl(&["put", &format!("/registry/delegation.example.com/unreadables/{NS}/bad"), "not json"]);
    let t = target(&s);
    let proxy = Identity::pki(c, "front-proxy-client");
    let ours = format!("/apis/core.gardener.cloud/v1beta1/namespaces/{NS}/shootstates/bad");
    let theirs = format!("/apis/delegation.example.com/v1/namespaces/{NS}/unreadables/bad");
    let options = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "ignoreStoreReadErrorWithClusterBreakingPotential": true});
    let options_file = dir.path().join("unsafe.json");
    std::fs::write(&options_file, options.to_string()).expect("write");
    let unsafe_delete = ["delete", "--raw", &theirs, "-f", options_file.to_str().expect("utf-8")];
    // kube-apiserver's words, for our resource.
    let as_ours = |status: Value| -> Value {
        let text = status.to_string().replace("unreadables.delegation.example.com", "shootstates.core.gardener.cloud");
        serde_json::from_str(
            &text.replace("delegation.example.com", "core.gardener.cloud").replace("unreadables", "shootstates"),
        )
        .expect("JSON")
    };

    // dave may delete, but not unsafely: 403, and the object is still there (a plain delete cannot read it).
    let dave = as_user("dave", &[]);
    let refused = call(&t, "DELETE", &ours, Some(&proxy), &dave, Some(&options)).status(403, "Forbidden");
    assert_eq!(
        refused["message"],
        format!("shootstates.core.gardener.cloud \"bad\" is forbidden: not permitted to do \"{UNSAFE}\", reason: ")
    );
    assert_eq!(refused, as_ours(kube_apiserver_refusal(c, "dave", &unsafe_delete)));
    let plain = call(&t, "DELETE", &ours, Some(&proxy), &dave, None).status(500, "InternalError");
    let kube_plain = kube_apiserver_refusal(c, "dave", &["delete", "--raw", &theirs]);
    assert_eq!((&plain["code"], &plain["reason"]), (&kube_plain["code"], &kube_plain["reason"]), "{kube_plain}");

    // erin may: the object is removed, as kube-apiserver removes its own.
    let r = call(&t, "DELETE", &ours, Some(&proxy), &as_user("erin", &[]), Some(&options));
    assert_eq!((r.code, r.json()["status"].as_str()), (200, Some("Success")), "{}", r.text);
    let mut args = vec!["--as", "erin"];
    args.extend_from_slice(&unsafe_delete);
    let kube: Value = serde_json::from_str(&c.kubectl_ok(&args)).expect("JSON");
    assert_eq!((&kube["code"], &kube["status"]), (&json!(200), &json!("Success")), "{kube}");
    get(&t, &ours, Some(&Identity::pki(c, "admin")), &[]).status(404, "NotFound");
    assert_eq!(kube_apiserver_error(c, &["get", "--raw", &theirs])["code"], 404);

    // Each unsafe delete was a SubjectAccessReview of its own verb on the object, after the delete's own (as
    // kube-apiserver's filter authorizes the delete before its handler asks about the unsafe one).
    let review = |verb: &str| {
        json!({"verb": verb, "group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates",
            "namespace": NS, "name": "bad"})
    };
    let asked = |sars: &[Value], user: &str| -> Vec<Value> {
        sars.iter().filter(|s| s["user"] == user).map(|s| s["resourceAttributes"].clone()).take(2).collect()
    };
    let sars = eventually("erin's reviews in kube-apiserver's audit log", MINUTE, || {
        let sars = reviews(c, &jti, "subjectaccessreviews");
        (asked(&sars, "erin").len() == 2).then_some(sars)
    });
    for user in ["dave", "erin"] {
        assert_eq!(asked(&sars, user), [review("delete"), review(UNSAFE)], "{user}: {sars:?}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// rotation

/// The client CAs and front-proxy CAs of kube-system/extension-apiserver-authentication.
fn configmap_cas(c: &Cluster) -> (BTreeSet<Vec<u8>>, BTreeSet<Vec<u8>>) {
    let cm =
        c.kubectl_json(&["-n", "kube-system", "get", "configmap", "extension-apiserver-authentication", "-o", "json"]);
    let bundle = |key: &str| ders(cm["data"][key].as_str().unwrap_or_default());
    (bundle("client-ca-file"), bundle("requestheader-client-ca-file"))
}

/// How often the cluster's server read the ConfigMap (GET) so far.
fn configmap_reads(c: &Cluster) -> usize {
    let reads = audit(c).into_iter().filter(|e| {
        e["user"]["username"] == SERVICE_ACCOUNT
            && e["verb"] == "get"
            && e["objectRef"]["name"] == "extension-apiserver-authentication"
    });
    reads.count()
}

/// kube-apiserver restarted with new CAs rewrites the ConfigMap, and this server applies it without a restart; the
/// ConfigMap keeps the old CAs as well until an administrator deletes it (kube-apiserver writes it anew with its own
/// only). A new serving certificate in the files applies to the next connection.
#[test]
fn rotated_cas_and_serving_certificate_apply_without_restart() {
    // kube-apiserver restarts with other CAs: a cluster of this test's own.
    let c = Cluster::up(Options::default());
    let t = Target { url: c.server_url(), ca: c.server_certs().join("ca.crt") };
    let pid = || std::fs::read_to_string(c.dir.join("pids/migration-apiserver")).expect("pid");
    let started = pid();
    let dir = tempfile::tempdir().expect("tempdir");
    let old_proxy = Identity::pki(&c, "front-proxy-client");
    let old_admin = Identity { cert: dir.path().join("old-admin.crt"), key: dir.path().join("old-admin.key") };
    std::fs::copy(c.pki("admin.crt"), &old_admin.cert).expect("copy");
    std::fs::copy(c.pki("admin.key"), &old_admin.key).expect("copy");
    let client_ca = CertAuthority::generate("rotated-client-ca").expect("CA");
    let front_proxy_ca = CertAuthority::generate("rotated-front-proxy-ca").expect("CA");
    let new_proxy = Identity::issue(dir.path(), &front_proxy_ca, "front-proxy-client", &[]);
    let new_admin = Identity::issue(dir.path(), &client_ca, "kubernetes-admin", &["system:masters"]);
    // The aggregator's headers; an x509 user (the admins) is itself, whatever the headers say.
    let code = |id: &Identity| get(&t, SS_PATH, Some(id), &AGGREGATOR).code;
    let codes = || [&old_proxy, &old_admin, &new_proxy, &new_admin].map(code);
    assert_eq!(codes(), [200, 200, 401, 401]);

    // kube-apiserver restarts with the new client and front-proxy CAs and its front-proxy certificate of the new CA
    // (the administrator's certificate is replaced too, so that the cluster's kubeconfig still works).
    let (client_ca_file, front_proxy_ca_file) =
        (dir.path().join("client-ca.crt"), dir.path().join("front-proxy-ca.crt"));
    std::fs::write(&client_ca_file, client_ca.cert_pem()).expect("write");
    std::fs::write(&front_proxy_ca_file, front_proxy_ca.cert_pem()).expect("write");
    replace_file(&c.pki("admin.key"), &std::fs::read(&new_admin.key).expect("key"));
    replace_file(&c.pki("admin.crt"), &std::fs::read(&new_admin.cert).expect("cert"));
    restart_with_flags(
        &c,
        "kube-apiserver",
        &[
            ("--client-ca-file", &client_ca_file),
            ("--requestheader-client-ca-file", &front_proxy_ca_file),
            ("--proxy-client-cert-file", &new_proxy.cert),
            ("--proxy-client-key-file", &new_proxy.key),
        ],
    );
    // kube-apiserver adds its CAs to the ConfigMap's and keeps those there (another kube-apiserver of the cluster
    // may still use them); this server trusts the new ones without a restart, and the old ones still.
    let old = (
        ders(&std::fs::read_to_string(c.pki("ca.crt")).expect("CA")),
        ders(&std::fs::read_to_string(c.pki("front-proxy-ca.crt")).expect("CA")),
    );
    let new = (ders(client_ca.cert_pem()), ders(front_proxy_ca.cert_pem()));
    let both = (&old.0 | &new.0, &old.1 | &new.1);
    eventually("kube-apiserver's ConfigMap with both CAs", 2 * MINUTE, || (configmap_cas(&c) == both).then_some(()));
    eventually("the rotated CAs trusted", 2 * MINUTE, || (codes() == [200, 200, 200, 200]).then_some(()));
    // The aggregator (kube-apiserver, presenting its new front-proxy certificate) reaches this server.
    eventually("the aggregator through the new front proxy", 2 * MINUTE, || {
        c.kubectl(&["get", "--raw", SS_PATH]).status.success().then_some(())
    });
    assert_aggregator_probe_passes(&t, &new_proxy);

    // The administrator drops the old CAs: kube-apiserver writes the ConfigMap anew with its own only, and this
    // server follows it through its watch (a renewal of the watch, every minute, is the one read it may make).
    let reads = configmap_reads(&c);
    c.kubectl_ok(&["-n", "kube-system", "delete", "configmap", "extension-apiserver-authentication"]);
    eventually("kube-apiserver's ConfigMap with its CAs only", 2 * MINUTE, || (configmap_cas(&c) == new).then_some(()));
    eventually("the old CAs no longer trusted", MINUTE, || (codes() == [401, 401, 200, 200]).then_some(()));
    assert!(configmap_reads(&c) <= reads + 1, "the ConfigMap was read again, not watched");
    assert_eq!(pid(), started, "this server was not restarted");

    // The serving certificate files are replaced (as the kubelet does with a renewed Secret): new connections get
    // the new certificate.
    let before = served_certificate(&t);
    let ca = CertAuthority::load(&c.server_certs().join("ca.crt"), &c.server_certs().join("ca.key")).expect("CA");
    let sans = ["localhost", "127.0.0.1", "migration-apiserver.migration-apiserver.svc"].map(String::from);
    let (cert, key) = issue_serving_cert(&ca, &sans).expect("serving certificate");
    let renewed = CertificateDer::from_pem_slice(cert.as_bytes()).expect("PEM").to_vec();
    assert_ne!(before, renewed);
    replace_file(&c.server_certs().join("apiserver.key"), key.as_bytes());
    replace_file(&c.server_certs().join("apiserver.crt"), cert.as_bytes());
    eventually("the renewed serving certificate", MINUTE, || (served_certificate(&t) == renewed).then_some(()));
    assert_eq!(code(&new_proxy), 200);
    assert_eq!(pid(), started, "this server was not restarted");
}

//! Impersonation and the self reviews against the real binary, standalone (the server is all the API kubectl sees),
//! with real kubectl (`--as`, `--as-group`, `--as-uid`, `auth can-i`, `auth whoami`), raw requests and the Python
//! `kubernetes` client. The answers are kube-apiserver's (k8s.io/apiserver's impersonation filter and its tests,
//! pkg/registry/authorization/selfsubjectaccessreview, pkg/registry/authentication/selfsubjectreview).
//!
//! Users: the generated admin (a client certificate in system:masters) and `bob`, a static token outside it.

mod common;
use common::requests::{call, post};
use common::*;

use axum::http::Method;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Output;

const SHOOTSTATES: &str = "/apis/core.gardener.cloud/v1beta1/shootstates";
const SSAR: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
const SSR: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
const ALICE_FORBIDDEN: &str = "shootstates.core.gardener.cloud is forbidden: User \"alice\" cannot list resource \"shootstates\" in API group \"core.gardener.cloud\" at the cluster scope";

/// A standalone server with `bob` (token `bob-token`, group `devs`), a kubeconfig for bob, and the directory of
/// the token file (kept while the server runs).
fn server() -> (Server, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "bob-token,bob,uid-bob,\"devs\"\n").expect("tokens");
    let s = Server::start(&["--token-auth-file", tokens.to_str().expect("utf-8")]);
    let admin = std::fs::read_to_string(s.kubeconfig()).expect("kubeconfig");
    let cluster = admin.split("users:").next().expect("clusters");
    let bob = format!(
        "{cluster}users:\n- name: bob\n  user:\n    token: bob-token\ncontexts:\n- name: bob\n  context:\n    cluster: migration-apiserver\n    user: bob\ncurrent-context: bob\n"
    );
    // Beside the admin's, so that kubectl's discovery cache (next to the kubeconfig) is per server.
    let path = s.cert_dir().join("bob").join("kubeconfig");
    std::fs::create_dir_all(path.parent().expect("dir")).expect("dir");
    std::fs::write(&path, bob).expect("bob's kubeconfig");
    (s, path, dir)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// kubectl that must fail with `message` as its (last) error line.
fn fails_with(out: Output, message: &str) {
    assert!(!out.status.success(), "succeeded: {}", stdout(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().last(), Some(message), "{err}");
}

#[test]
fn kubectl_as_another_user() {
    let (s, bob, _dir) = server();
    // The admin acting as alice is alice, who is not in system:masters.
    fails_with(
        s.kubectl(&["--as", "alice", "get", "shootstates", "-A"]),
        &format!("Error from server (Forbidden): {ALICE_FORBIDDEN}"),
    );
    // Alice with the groups given.
    let out = s.kubectl(&["--as", "alice", "--as-group", "system:masters", "get", "shootstates", "-A"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "No resources found");
    // Bob as himself: discovery is every authenticated user's, the shootstates are not his.
    fails_with(
        kubectl_with(&bob, &["get", "shootstates", "-A"], None),
        "Error from server (Forbidden): shootstates.core.gardener.cloud is forbidden: User \"bob\" cannot list resource \"shootstates\" in API group \"core.gardener.cloud\" at the cluster scope",
    );
    // Bob may not impersonate anyone: the first thing asked, the user, is refused. (kubectl reads discovery as the
    // impersonated user too: without the discovery cached above, it would report that 403 as "unknown", as it
    // does against kube-apiserver.)
    fails_with(
        kubectl_with(&bob, &["--as", "alice", "get", "shootstates", "-A"], None),
        "Error from server (Forbidden): users \"alice\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope",
    );
    fails_with(
        kubectl_with(&bob, &["--as", "system:serviceaccount:garden:gardener", "get", "shootstates", "-A"], None),
        "Error from server (Forbidden): serviceaccounts \"gardener\" is forbidden: User \"bob\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"garden\"",
    );
}

#[test]
fn kubectl_auth_whoami_and_can_i() {
    let (s, bob, _dir) = server();
    assert_eq!(
        s.kubectl_ok(&["auth", "whoami"])
            .lines()
            .map(str::split_whitespace)
            .map(Iterator::collect::<Vec<_>>)
            .collect::<Vec<_>>(),
        [
            vec!["ATTRIBUTE", "VALUE"],
            vec!["Username", "migration-admin"],
            vec!["Groups", "[system:masters", "system:authenticated]"]
        ]
    );
    let out = s.kubectl_ok(&["auth", "whoami", "--as", "alice", "--as-group", "g"]);
    assert!(out.contains("Username    alice") && out.contains("Groups      [g system:authenticated]"), "{out}");
    let review =
        s.kubectl_json(&["auth", "whoami", "--as", "alice", "--as-group", "g", "--as-uid", "u-1", "-o", "json"]);
    assert_eq!(
        (review["apiVersion"].as_str(), review["kind"].as_str()),
        (Some("authentication.k8s.io/v1"), Some("SelfSubjectReview"))
    );
    assert_eq!(
        review["status"],
        json!({"userInfo": {"username": "alice", "uid": "u-1", "groups": ["g", "system:authenticated"]}})
    );
    assert!(review["metadata"]["creationTimestamp"].is_string(), "{review}");
    let out = kubectl_with(&bob, &["auth", "whoami", "-o", "json"], None);
    let review: Value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    assert_eq!(
        review["status"]["userInfo"],
        json!({"username": "bob", "uid": "uid-bob", "groups": ["devs", "system:authenticated"]})
    );

    // can-i answers yes (0) or no (1) from this server's authorizer, for the (impersonated) requester.
    let can_i = |kubeconfig: &PathBuf, args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let out = kubectl_with(kubeconfig, &all, None);
        (stdout(&out), out.status.code())
    };
    let admin = s.kubeconfig();
    let yes = ("yes".to_string(), Some(0));
    let no = ("no".to_string(), Some(1));
    assert_eq!(can_i(&admin, &["create", "shootstates"]), yes);
    assert_eq!(can_i(&admin, &["create", "shootstates", "--as", "alice"]), no);
    assert_eq!(can_i(&admin, &["create", "shootstates", "--as", "alice", "--as-group", "system:masters"]), yes);
    assert_eq!(can_i(&admin, &["get", "/metrics"]), yes);
    assert_eq!(can_i(&admin, &["get", "/metrics", "--as", "alice"]), no);
    assert_eq!(can_i(&bob, &["create", "shootstates", "-n", "garden"]), no);
    assert_eq!(can_i(&bob, &["create", "selfsubjectaccessreviews.authorization.k8s.io"]), yes);
    assert_eq!(can_i(&bob, &["get", "/apis"]), yes);
}

#[tokio::test]
async fn impersonation_headers() {
    let (s, _bob, _dir) = tokio::task::spawn_blocking(server).await.expect("server");
    let c = s.client().await;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let whoami = |headers: Vec<(&'static str, &'static str)>| {
        let c = c.clone();
        let body = serde_json::to_vec(&review).expect("json");
        async move {
            let mut h = headers;
            h.push(("content-type", "application/json"));
            call(&c, Method::POST, SSR, &h, body).await
        }
    };

    // Groups, extra or a UID without a user: upstream's 400, naming what was asked as Go prints it.
    let st = whoami(vec![("Impersonate-Group", "g")]).await.status_err(400, "BadRequest");
    assert_eq!(st["message"], "requested [{Group  g    }] without impersonating a user");
    let st = whoami(vec![("Impersonate-Extra-Scopes", "view")]).await.status_err(400, "BadRequest");
    assert_eq!(
        st["message"],
        "requested [{UserExtra  view  authentication.k8s.io/v1  scopes}] without impersonating a user"
    );
    let st = whoami(vec![("Impersonate-Uid", "u-1")]).await.status_err(400, "BadRequest");
    assert_eq!(st["message"], "requested [{UID  u-1  authentication.k8s.io/v1  }] without impersonating a user");

    // UID and extra (one line per value; the key lower-cased and percent-decoded).
    let r = whoami(vec![
        ("Impersonate-User", "alice"),
        ("Impersonate-Uid", "u-1"),
        ("Impersonate-Extra-Scopes", "view"),
        ("Impersonate-Extra-Scopes", "edit"),
        ("Impersonate-Extra-Example.com%2FTeam", "a"),
    ])
    .await;
    assert_eq!(
        r.ok(201)["status"]["userInfo"],
        json!({"username": "alice", "uid": "u-1", "groups": ["system:authenticated"],
            "extra": {"scopes": ["view", "edit"], "example.com/team": ["a"]}})
    );
    // A service account gets its groups; the anonymous user is unauthenticated.
    let r = whoami(vec![("Impersonate-User", "system:serviceaccount:garden:gardener")]).await;
    assert_eq!(
        r.ok(201)["status"]["userInfo"]["groups"],
        json!(["system:serviceaccounts", "system:serviceaccounts:garden", "system:authenticated"])
    );
    // The impersonated anonymous user is unauthenticated: not even discovery, nor a SelfSubjectReview.
    let st = whoami(vec![("Impersonate-User", "system:anonymous")]).await.status_err(403, "Forbidden");
    assert_eq!(
        st["message"],
        "selfsubjectreviews.authentication.k8s.io is forbidden: User \"system:anonymous\" cannot create resource \"selfsubjectreviews\" in API group \"authentication.k8s.io\" at the cluster scope"
    );
    let r = call(&c, Method::GET, "/apis", &[("Impersonate-User", "system:anonymous")], vec![]).await;
    let st = r.status_err(403, "Forbidden");
    assert_eq!(st["message"], "forbidden: User \"system:anonymous\" cannot get path \"/apis\"");
    // The request itself is authorized as the impersonated user.
    let r = call(&c, Method::GET, SHOOTSTATES, &[("Impersonate-User", "alice")], vec![]).await;
    assert_eq!(r.status_err(403, "Forbidden")["message"], ALICE_FORBIDDEN);
}

#[tokio::test]
async fn self_subject_access_reviews() {
    let (s, _bob, _dir) = tokio::task::spawn_blocking(server).await.expect("server");
    let c = s.client().await;
    let ssar =
        |spec: Value| json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": spec});
    let create =
        json!({"resourceAttributes": {"verb": "create", "group": "core.gardener.cloud", "resource": "shootstates"}});
    let r = post(&c, SSAR, &ssar(create.clone())).await.ok(201);
    assert_eq!(
        r,
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {},
        "spec": create, "status": {"allowed": true}})
    );
    let body = serde_json::to_vec(&ssar(create.clone())).expect("json");
    let h = [("content-type", "application/json"), ("Impersonate-User", "alice")];
    assert_eq!(call(&c, Method::POST, SSAR, &h, body).await.ok(201)["status"], json!({"allowed": false}));

    // pkg/apis/authorization/validation: exactly one of the attributes.
    let st = post(&c, SSAR, &ssar(json!({}))).await.status_err(422, "Invalid");
    assert_eq!(
        st["message"],
        "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"
    );
    let both =
        json!({"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"path": "/metrics", "verb": "get"}});
    let st = post(&c, SSAR, &ssar(both)).await.status_err(422, "Invalid");
    assert_eq!(st["details"]["causes"][0]["field"], "spec.nonResourceAttributes");
    // Create only.
    call(&c, Method::GET, SSAR, &[], vec![]).await.status_err(405, "MethodNotAllowed");

    // The Python client (its generated AuthorizationV1Api), as the admin.
    let script = r#"
import json, sys
from kubernetes import client, config
config.load_kube_config(config_file=sys.argv[1])
api = client.AuthorizationV1Api()
body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
    resource_attributes=client.V1ResourceAttributes(verb="delete", group="core.gardener.cloud", resource="shootstates", namespace="garden")))
allowed = api.create_self_subject_access_review(body).status.allowed
body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
    non_resource_attributes=client.V1NonResourceAttributes(verb="get", path="/version")))
print(json.dumps([allowed, api.create_self_subject_access_review(body).status.allowed]))
"#;
    let kubeconfig = s.kubeconfig().display().to_string();
    let out = tokio::task::spawn_blocking(move || python(&["-c", script, &kubeconfig])).await.expect("python");
    assert_eq!(out.trim(), "[true, true]");
}

//! Delegated authentication and authorization with a real kube-apiserver (v1.37.2, `make cluster`): this server
//! trusts kube-apiserver's front proxy, asks it SubjectAccessReviews, and answers a denied user with the same
//! Status kube-apiserver answers; the kit's roles aggregate into view and edit; `kubectl --as` reaches our audit
//! log as the impersonated user.
//!
//! kube-apiserver checks RBAC itself before it proxies a request to us, so our own 403 is provoked by calling this
//! server directly with the front-proxy client certificate, as the aggregator does.

mod common;
use common::cluster::{shared, Cluster};
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

const SERVICE_ACCOUNT: &str = "system:serviceaccount:migration-apiserver:migration-apiserver";

/// A request to this server directly, as kube-apiserver's aggregator sends it: with the front-proxy client
/// certificate and the user in `X-Remote-User` (and groups in `X-Remote-Group`). Status code and body.
fn as_front_proxy(c: &Cluster, path: &str, user: &str, groups: &[&str]) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-w", "\n%{http_code}", "--cacert"])
        .arg(c.server_certs().join("ca.crt"))
        .arg("--cert")
        .arg(c.pki("front-proxy-client.crt"))
        .arg("--key")
        .arg(c.pki("front-proxy-client.key"))
        .args(["-H", &format!("X-Remote-User: {user}")]);
    for g in groups {
        cmd.args(["-H", &format!("X-Remote-Group: {g}")]);
    }
    let out = cmd.arg(format!("{}{path}", c.server_url())).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or_else(|| panic!("{text}"));
    (code.parse().expect("status code"), serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")))
}

/// A request through kube-apiserver as `kubeconfig`'s user: `kubectl get --raw`'s Status on failure.
fn through_kube_apiserver(c: &Cluster, kubeconfig: &std::path::Path, path: &str) -> Value {
    let out = c.kubectl_as(kubeconfig, &["get", "--raw", path, "-v=8"], None);
    assert!(!out.status.success(), "expected a refusal of {path}");
    // kubectl -v=8 logs the response body; the Status is the line that holds `"kind":"Status"`.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("\"kind\":\"Status\"")).unwrap_or_else(|| panic!("{stderr}"));
    let json = &line[line.find('{').expect("json")..];
    serde_json::from_str(json.trim_end_matches('\'')).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// kube-apiserver's audit events (its log at Request level for SubjectAccessReviews).
fn kube_apiserver_audit(c: &Cluster) -> Vec<Value> {
    audit_events(&c.dir.join("logs/kube-apiserver-audit.log"))
}

fn audit_events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[test]
fn a_user_without_rights_gets_kube_apiservers_403_from_this_server_after_a_subject_access_review() {
    let c = shared();
    let path = "/apis/migration.k8s.io/v1alpha1/storagestates";
    let (code, ours) = as_front_proxy(c, path, "nobody", &["system:authenticated"]);
    assert_eq!(code, 403, "{ours}");
    // The oracle: kube-apiserver's own refusal of the same request for the same user.
    let theirs = through_kube_apiserver(c, &c.nobody(), path);
    assert_eq!(ours, theirs, "our 403 differs from kube-apiserver's");
    assert_eq!(
        ours["message"],
        "storagestates.migration.k8s.io is forbidden: User \"nobody\" cannot list resource \"storagestates\" in API \
         group \"migration.k8s.io\" at the cluster scope"
    );
    // kube-apiserver's audit log shows the SubjectAccessReview this server sent about nobody.
    let review =
        common::eventually("our SubjectAccessReview in kube-apiserver's audit log", Duration::from_secs(20), || {
            kube_apiserver_audit(c).into_iter().find(|e| {
                e["objectRef"]["resource"] == "subjectaccessreviews"
                    && e["user"]["username"] == SERVICE_ACCOUNT
                    && e["requestObject"]["spec"]["user"] == "nobody"
                    && e["requestObject"]["spec"]["resourceAttributes"]["resource"] == "storagestates"
            })
        });
    assert_eq!(review["verb"], "create", "{review}");
    assert_eq!(review["responseStatus"]["code"], 201, "{review}");
    assert_eq!(review["requestObject"]["spec"]["resourceAttributes"]["verb"], "list", "{review}");
}

#[test]
fn a_client_certificate_that_is_not_the_front_proxys_is_not_trusted_for_its_headers() {
    let c = shared();
    // The cluster's admin certificate is signed by the client CA, not the front-proxy CA: its X-Remote-User is
    // ignored and the request is the admin's own (system:masters), as kube-apiserver's requestheader does.
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(c.server_certs().join("ca.crt"))
        .arg("--cert")
        .arg(c.pki("admin.crt"))
        .arg("--key")
        .arg(c.pki("admin.key"))
        .args(["-H", "X-Remote-User: nobody"])
        .arg(format!("{}/apis/migration.k8s.io/v1alpha1/storagestates", c.server_url()))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
}

fn apply(c: &Cluster, objects: &[Value]) {
    let stream: String = objects.iter().map(|o| format!("{o}\n")).collect();
    c.kubectl_ok_stdin(&["apply", "-f", "-"], &stream);
}

fn binding(kind: &str, name: &str, namespace: Option<&str>, user: &str, role: &str) -> Value {
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
}

fn can_i(c: &Cluster, user: &str, args: &[&str]) -> bool {
    let mut full = vec!["auth", "can-i", "--as", user];
    full.extend_from_slice(args);
    String::from_utf8_lossy(&c.kubectl(&full).stdout).trim() == "yes"
}

fn kubectl_as_user(c: &Cluster, user: &str, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut full = vec!["--as", user];
    full.extend_from_slice(args);
    c.kubectl_as(&c.admin(), &full, stdin)
}

#[test]
fn the_kits_roles_grant_through_view_and_edit_what_the_docs_say() {
    let c = shared();
    let out = c.kubectl(&["create", "namespace", "team-roles"]);
    assert!(out.status.success() || String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"));
    apply(
        c,
        &[
            binding("RoleBinding", "viewer", Some("team-roles"), "viewer", "view"),
            binding("RoleBinding", "editor", Some("team-roles"), "editor", "edit"),
            binding("ClusterRoleBinding", "cluster-viewer", None, "cluster-viewer", "view"),
        ],
    );
    // kube-controller-manager's ClusterRole aggregation adds our rules to view and edit.
    common::eventually("our rules aggregated into view and edit", Duration::from_secs(60), || {
        (can_i(c, "viewer", &["list", "shootstates.core.gardener.cloud", "-n", "team-roles"])
            && can_i(c, "editor", &["create", "shootstates.core.gardener.cloud", "-n", "team-roles"]))
        .then_some(())
    });
    // docs/reference/security.md, "Roles for people".
    for verb in ["get", "list", "watch"] {
        assert!(can_i(c, "viewer", &[verb, "shootstates.core.gardener.cloud", "-n", "team-roles"]), "view {verb}");
        assert!(can_i(c, "cluster-viewer", &[verb, "storagestates.migration.k8s.io"]), "view {verb} storagestates");
        assert!(can_i(c, "cluster-viewer", &[verb, "storageversionmigrations.migration.k8s.io"]), "view {verb}");
    }
    for verb in ["create", "update", "patch", "delete", "deletecollection"] {
        assert!(!can_i(c, "viewer", &[verb, "shootstates.core.gardener.cloud", "-n", "team-roles"]), "view {verb}");
        assert!(can_i(c, "editor", &[verb, "shootstates.core.gardener.cloud", "-n", "team-roles"]), "edit {verb}");
        assert!(!can_i(c, "editor", &[verb, "storageversionmigrations.migration.k8s.io"]), "edit {verb} svm");
    }
    assert!(can_i(c, "cluster-viewer", &["get", "storagestates.migration.k8s.io", "--subresource=status"]));

    // And the requests themselves, through kube-apiserver and then this server's own authorization.
    let shootstate = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
        "metadata": {"name": "by-editor", "namespace": "team-roles"}, "spec": {}})
    .to_string();
    let created = kubectl_as_user(c, "editor", &["create", "-f", "-"], Some(&shootstate));
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let listed = kubectl_as_user(c, "viewer", &["get", "shootstates", "-n", "team-roles", "-o", "name"], None);
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "shootstate.core.gardener.cloud/by-editor");
    let denied = kubectl_as_user(c, "viewer", &["delete", "shootstate", "by-editor", "-n", "team-roles"], None);
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("User \"viewer\" cannot delete resource \"shootstates\" in API group \"core.gardener.cloud\""),
        "{stderr}"
    );
    let deleted = kubectl_as_user(c, "editor", &["delete", "shootstate", "by-editor", "-n", "team-roles"], None);
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
}

#[test]
fn kubectl_as_arrives_as_the_impersonated_user_in_our_audit_log() {
    let c = shared();
    let out = c.kubectl(&["create", "namespace", "team-audit"]);
    assert!(out.status.success() || String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"));
    apply(c, &[binding("RoleBinding", "auditee", Some("team-audit"), "auditee", "view")]);
    common::eventually("auditee may list shootstates", Duration::from_secs(60), || {
        can_i(c, "auditee", &["list", "shootstates.core.gardener.cloud", "-n", "team-audit"]).then_some(())
    });
    let out = c.kubectl_as(
        &c.admin(),
        &["get", "shootstates", "-n", "team-audit", "--as", "auditee", "--as-group", "auditors"],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ours = c.dir.join("logs/migration-apiserver-audit.log");
    let event = common::eventually("the impersonated list in our audit log", Duration::from_secs(20), || {
        audit_events(&ours).into_iter().find(|e| {
            e["objectRef"]["resource"] == "shootstates"
                && e["objectRef"]["namespace"] == "team-audit"
                && e["verb"] == "list"
                && e["stage"] == "ResponseComplete"
        })
    });
    // kube-apiserver impersonated and passed the impersonated user on: to us it is the user.
    assert_eq!(event["user"]["username"], "auditee", "{event}");
    let groups = event["user"]["groups"].as_array().expect("groups");
    assert!(groups.contains(&json!("auditors")) && groups.contains(&json!("system:authenticated")), "{event}");
    assert!(event.get("impersonatedUser").is_none(), "{event}");
    assert_eq!(event["responseStatus"]["code"], 200, "{event}");
}

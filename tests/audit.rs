//! Auditing against the real binary: policies (checker_test.go's tables, requests and rules as upstream wrote them),
//! every stage and level, watches, failed authentication, 403s, the front proxy, rotation, blocking-strict.
//!
//! The log is read once the server has stopped (every event written) or polled with a deadline: never a sleep.

mod common;
use common::requests::{call, Resp};
use common::*;

use axum::http::Method;
use migration_apiserver::auth::certs::{issue_client_cert, write_kubeconfig, CertAuthority};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SS: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";

/// A server auditing with `policy` to `<dir>/audit/audit.log` (and `extra` flags); tim (groups humans, developers)
/// and dave (devs) authenticate with tokens.
fn audited(policy: &str, extra: &[&str]) -> (Server, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy).expect("policy");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "tim-token,tim@k8s.io,uid-tim,\"humans,developers\"\ndave-token,dave,uid-dave,\"devs\"\n")
        .expect("tokens");
    let log = dir.path().join("audit/audit.log");
    let mut args = vec![
        "--audit-policy-file",
        policy_file.to_str().expect("utf-8"),
        "--audit-log-path",
        log.to_str().expect("utf-8"),
        "--token-auth-file",
        tokens.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    (Server::start(&args), log, dir)
}

/// The events of the log, in order.
fn events(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn of<'a>(events: &'a [Value], audit_id: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["auditID"] == audit_id).collect()
}

fn stages(events: &[&Value]) -> Vec<String> {
    events.iter().map(|e| e["stage"].as_str().unwrap_or_default().to_string()).collect()
}

/// Polls the log until `audit_id` has `n` events (deadline 20 s).
fn wait_events(log: &Path, audit_id: &str, n: usize) -> Vec<Value> {
    eventually(&format!("{n} events of {audit_id}"), Duration::from_secs(20), || {
        let all = events(log);
        let mine: Vec<Value> = of(&all, audit_id).into_iter().cloned().collect();
        (mine.len() >= n).then_some(mine)
    })
}

/// A client of the server's CA presenting no credentials (tokens go in an Authorization header).
async fn anonymous(s: &Server) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(s.kubeconfig()).expect("kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
    cfg.auth_info = Default::default();
    kube::Client::try_from(cfg).expect("client")
}

/// A client with a certificate of `cn` in `groups`, issued by `ca` (`ca_dir` holds ca.crt and ca.key).
async fn with_cert(s: &Server, ca_dir: &Path, cn: &str, groups: &[&str]) -> kube::Client {
    let ca = CertAuthority::load(&ca_dir.join("ca.crt"), &ca_dir.join("ca.key")).expect("CA");
    let (cert, key) = issue_client_cert(&ca, cn, groups).expect("client cert");
    let server_ca = std::fs::read_to_string(s.cert_dir().join("ca.crt")).expect("server CA");
    let path = s.dir.join(format!("{cn}.kubeconfig"));
    write_kubeconfig(&path, &s.url(), &server_ca, &cert, &key).expect("kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    kube::Client::try_from(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config"))
        .expect("client")
}

async fn send(c: &kube::Client, method: Method, path: &str, id: &str, headers: &[(&str, &str)], body: Value) -> Resp {
    let mut h = vec![("Audit-ID", id)];
    h.extend_from_slice(headers);
    let body = if body.is_null() { vec![] } else { body.to_string().into_bytes() };
    if !body.is_empty() {
        let ct = if method == Method::PATCH { "application/merge-patch+json" } else { "application/json" };
        h.push(("Content-Type", ct));
    }
    let resp = call(c, method, path, &h, body).await;
    assert_eq!(resp.header("audit-id").as_deref(), Some(id), "the Audit-ID is answered");
    resp
}

/// checker_test.go's requests, as paths: this server serves none of pods, clusterroles or /logs, but every request
/// is audited as kube-apiserver would (RequestInfo is upstream's), whatever it is answered.
const REQUESTS: [(&str, &str, &str, bool); 6] = [
    ("namespaced", "GET", "/api/v1/namespaces/default/pods/busybox", true),
    ("cluster", "GET", "/apis/rbac.authorization.k8s.io/v1beta1/clusterroles/edit", true),
    ("nonResource", "GET", "/logs/kubelet.log", true),
    ("subresource", "GET", "/api/v1/namespaces/default/pods/busybox/log", true),
    ("Unauthorized", "GET", "/api/v1/namespaces/default/pods/busybox", false),
    ("ClusterRoleUpdate", "PUT", "/apis/rbac.authorization.k8s.io/v1beta1/clusterroles/somerole/status", true),
];

/// The tables shared with the policy's unit tests (which name the policy module `super::policy`).
#[path = "../src/audit/checker_cases.rs"]
mod checker;
use migration_apiserver::audit::policy;

/// checker_test.go's tables through the server: per policy (its rules and policy-wide stages), each request as tim
/// (or without credentials), then the level of its events and which stages were written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_tables_through_the_server() {
    use checker::{policy_yaml, LEVEL_CASES, STAGE_CASES};
    use policy::{Level, Stage};
    // (policy stages, rules) -> [(request, level, omitted stages)]
    type Policy = (Vec<Stage>, Vec<&'static str>);
    type Case = (&'static str, Level, Vec<Stage>);
    let mut policies: Vec<(Policy, Vec<Case>)> = Vec::new();
    let cases = LEVEL_CASES
        .iter()
        .map(|(req, level, rules)| (*req, *level, &[][..], &[][..], *rules))
        .chain(STAGE_CASES.iter().map(|(r, l, p, o, rules)| (*r, *l, *p, *o, *rules)));
    for (req, level, policy_stages, omit, rules) in cases {
        let key = (policy_stages.to_vec(), rules.to_vec());
        let case = (req, level, omit.to_vec());
        match policies.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(case),
            None => policies.push((key, vec![case])),
        }
    }
    for ((policy_stages, rules), cases) in policies {
        let (mut s, log, _dir) = audited(&policy_yaml(&policy_stages, &rules), &[]);
        let anon = anonymous(&s).await;
        for (name, method, path, authenticated) in REQUESTS {
            let auth = [("Authorization", "Bearer tim-token")];
            let headers: &[(&str, &str)] = if authenticated { &auth } else { &[] };
            send(&anon, method.parse().expect("method"), path, name, headers, Value::Null).await;
        }
        s.stop();
        let all = events(&log);
        for (req, level, omit) in cases {
            let mine = of(&all, req);
            let what = format!("request {req}, rules {rules:?}, policy stages {policy_stages:?}");
            let written: Vec<Stage> = match (req, level) {
                (_, Level::None) => vec![],
                ("Unauthorized", _) => vec![Stage::ResponseStarted],
                _ => vec![Stage::RequestReceived, Stage::ResponseComplete],
            };
            let want: Vec<&str> = written.iter().filter(|st| !omit.contains(st)).map(|st| st.as_str()).collect();
            assert_eq!(stages(&mine), want, "{what}");
            for e in mine {
                assert_eq!(e["level"], level.as_str(), "{what}: {e}");
            }
        }
    }
}

const STAGES_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: None
  nonResourceURLs: [/readyz, /healthz, /livez, /version, /api, /apis, /apis/*]
- level: Metadata
  verbs: [get]
  resources: [{group: migration.k8s.io, resources: [storagestates]}]
- level: Request
  verbs: [create]
- level: RequestResponse
  verbs: [update]
  omitManagedFields: true
- level: RequestResponse
"#;

fn ss(name: &str) -> Value {
    let (resource, group) = name.split_once('.').expect("resource.group");
    json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": name},
           "spec": {"resource": {"group": group, "resource": resource}}})
}

/// Every level and stage of ordinary requests, the objects each level logs, objectRef, responseStatus, the
/// client's addresses, the authorization annotations, a watch, and a failed authentication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_levels_objects_and_watches() {
    let (s, log, _dir) = audited(STAGES_POLICY, &[]);
    let c = s.client().await;
    let fwd = [("X-Forwarded-For", "10.1.1.1, 10.2.2.2"), ("X-Real-Ip", "10.3.3.3"), ("User-Agent", "audit-test/1")];

    // create at Request: the request object, no response object; objectRef named from the body.
    let created = send(&c, Method::POST, SS, "create", &fwd, ss("widgets.example.com")).await.ok(201);
    let ev = wait_events(&log, "create", 2);
    assert_eq!(stages(&ev.iter().collect::<Vec<_>>()), ["RequestReceived", "ResponseComplete"]);
    let (received, complete) = (&ev[0], &ev[1]);
    assert_eq!(received["kind"], "Event");
    assert_eq!(received["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(received["level"], "Request");
    assert_eq!(received["verb"], "create");
    assert_eq!(received["requestURI"], SS);
    assert_eq!(received["user"]["username"], "migration-admin", "{received}");
    assert_eq!(received["sourceIPs"], json!(["10.1.1.1", "10.2.2.2", "10.3.3.3", "127.0.0.1"]));
    assert_eq!(received["userAgent"], "audit-test/1");
    assert_eq!(received["stageTimestamp"], received["requestReceivedTimestamp"]);
    assert!(received.get("responseStatus").is_none() && received.get("requestObject").is_none(), "{received}");
    let ts = received["requestReceivedTimestamp"].as_str().expect("timestamp");
    assert!(ts.len() == 27 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "RFC 3339 in microseconds: {ts}");
    assert_eq!(complete["responseStatus"], json!({"metadata": {}, "code": 201}));
    assert_eq!(complete["requestObject"], ss("widgets.example.com"));
    assert!(complete.get("responseObject").is_none(), "{complete}");
    assert_eq!(
        complete["objectRef"],
        json!({"resource": "storagestates", "name": "widgets.example.com", "apiGroup": "migration.k8s.io", "apiVersion": "v1alpha1"})
    );
    assert_eq!(
        complete["annotations"],
        json!({"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": ""})
    );

    // get at Metadata: no objects.
    let one = format!("{SS}/widgets.example.com");
    send(&c, Method::GET, &one, "get", &[], Value::Null).await.ok(200);
    let ev = wait_events(&log, "get", 2);
    assert_eq!(ev[1]["level"], "Metadata");
    assert!(ev[1].get("requestObject").is_none() && ev[1].get("responseObject").is_none(), "{}", ev[1]);

    // patch at RequestResponse: the patch itself, and the answer with its managedFields.
    let patch = json!({"metadata": {"labels": {"a": "b"}}});
    let patched = send(&c, Method::PATCH, &one, "patch", &[], patch.clone()).await.ok(200);
    let ev = wait_events(&log, "patch", 2);
    assert_eq!(ev[1]["requestObject"], patch);
    assert_eq!(ev[1]["responseObject"], patched);
    assert!(patched["metadata"]["managedFields"].is_array(), "{patched}");

    // update at RequestResponse with omitManagedFields: neither object has them.
    let mut update = patched.clone();
    update["metadata"]["labels"]["c"] = json!("d");
    send(&c, Method::PUT, &one, "update", &[], update).await.ok(200);
    let ev = wait_events(&log, "update", 2);
    assert!(ev[1]["requestObject"]["metadata"].get("managedFields").is_none(), "{}", ev[1]);
    assert!(ev[1]["responseObject"]["metadata"].get("managedFields").is_none(), "{}", ev[1]);
    assert_eq!(ev[1]["responseObject"]["metadata"]["labels"]["c"], "d");
    assert_eq!(
        ev[1]["objectRef"]["resourceVersion"], patched["metadata"]["resourceVersion"],
        "from the request object"
    );
    assert_eq!(ev[1]["objectRef"]["uid"], created["metadata"]["uid"]);

    // An error: its Status in responseStatus, and (RequestResponse) as the response object.
    let missing = send(&c, Method::DELETE, &format!("{SS}/nothing.example.com"), "missing", &[], Value::Null).await;
    let status = missing.status_err(404, "NotFound");
    let ev = wait_events(&log, "missing", 2);
    let rs = &ev[1]["responseStatus"];
    assert_eq!(
        (rs["code"].as_u64(), rs["reason"].as_str(), rs["status"].as_str()),
        (Some(404), Some("NotFound"), Some("Failure"))
    );
    assert_eq!((&rs["message"], &rs["details"]), (&status["message"], &status["details"]));
    assert_eq!(ev[1]["responseObject"], status);
    assert_eq!(ev[1]["requestObject"], json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}));

    // A watch: ResponseStarted when it starts, ResponseComplete when it ends; no response object.
    let watch = format!("{SS}?watch=true&timeoutSeconds=1");
    send(&c, Method::GET, &watch, "watch", &[], Value::Null).await;
    let ev = wait_events(&log, "watch", 3);
    assert_eq!(stages(&ev.iter().collect::<Vec<_>>()), ["RequestReceived", "ResponseStarted", "ResponseComplete"]);
    assert_eq!(ev[1]["verb"], "watch");
    for e in &ev[1..] {
        assert_eq!(e["responseStatus"], json!({"metadata": {}, "code": 200}));
        assert!(e.get("responseObject").is_none(), "{e}");
    }

    // A failed authentication: one ResponseStarted event with the 401, and no user.
    let anon = anonymous(&s).await;
    let bad = [("Authorization", "Bearer nobody")];
    send(&anon, Method::GET, SS, "unauthenticated", &bad, Value::Null).await.status_err(401, "Unauthorized");
    let ev = wait_events(&log, "unauthenticated", 1);
    assert_eq!(ev[0]["stage"], "ResponseStarted");
    assert_eq!(ev[0]["user"], json!({}));
    assert_eq!(ev[0]["verb"], "list");
    assert_eq!(
        ev[0]["responseStatus"],
        json!({"metadata": {}, "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    );
    assert!(ev[0].get("annotations").is_none(), "{}", ev[0]);

    // No Audit-ID sent: the server makes one and answers it.
    let resp = call(&c, Method::GET, &one, &[], vec![]).await;
    let id = resp.header("audit-id").expect("Audit-Id");
    assert_eq!(uuid::Uuid::parse_str(&id).map(|u| u.get_version_num()), Ok(4), "{id}");
    assert_eq!(wait_events(&log, &id, 2)[0]["auditID"], id);

    // Nothing of the excluded paths (the harness's /readyz polls included).
    assert!(events(&log).iter().all(|e| e["requestURI"] != "/readyz"), "level None is not audited");
    let metrics = s.kubectl_ok(&["get", "--raw", "/metrics"]);
    for line in ["apiserver_audit_level_total{level=\"None\"}", "apiserver_audit_level_total{level=\"Request\"}"] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

/// A 403 (a client certificate of a user outside system:masters, standalone) carries the authorizer's decision; the
/// front proxy's user is the audited user; the legacy format's line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_front_proxy_and_legacy_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy_ca = CertAuthority::generate("front-proxy-ca").expect("CA");
    std::fs::write(dir.path().join("ca.crt"), proxy_ca.cert_pem()).expect("ca");
    std::fs::write(dir.path().join("ca.key"), proxy_ca.key_pem()).expect("key");
    let proxy_ca_file = dir.path().join("ca.crt");
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/readyz]}, {level: Metadata}]\n";
    let args = [
        "--requestheader-client-ca-file",
        proxy_ca_file.to_str().expect("utf-8"),
        "--requestheader-allowed-names",
        "front-proxy-client",
        "--audit-log-format",
        "legacy",
    ];
    let (s, log, _d) = audited(policy, &args);

    let eve = with_cert(&s, &s.cert_dir(), "eve", &["devs"]).await;
    let st = send(&eve, Method::GET, SS, "forbidden", &[], Value::Null).await.status_err(403, "Forbidden");
    let proxy = with_cert(&s, dir.path(), "front-proxy-client", &[]).await;
    let as_bob = [("X-Remote-User", "bob"), ("X-Remote-Group", "system:masters"), ("X-Remote-Group", "g2")];
    send(&proxy, Method::GET, SS, "proxied", &as_bob, Value::Null).await.ok(200);
    let lines = eventually("the legacy lines", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let done = text.lines().filter(|l| l.contains("stage=\"ResponseComplete\"")).count() >= 2;
        done.then(|| text.lines().map(str::to_string).collect::<Vec<_>>())
    });
    let forbidden: Vec<&String> = lines.iter().filter(|l| l.contains("id=\"forbidden\"")).collect();
    let line = forbidden.last().expect("a line of the 403");
    // `<RFC3339Nano> AUDIT: id="..." stage="..." ip="..." method="..." user="..." groups="..." as="..." ...`
    let (time, rest) = line.split_once(" AUDIT: ").expect("legacy line");
    assert!(chrono::DateTime::parse_from_rfc3339(time).is_ok(), "{line}");
    assert_eq!(
        rest,
        format!(
            "id=\"forbidden\" stage=\"ResponseComplete\" ip=\"127.0.0.1\" method=\"list\" user=\"eve\" groups=\"\\\"devs\\\",\\\"system:authenticated\\\"\" as=\"<self>\" asgroups=\"<lookup>\" user-agent=\"{}\" namespace=\"<none>\" uri=\"{SS}\" response=\"403\"",
            user_agent(&lines, "forbidden")
        )
    );
    assert!(st["message"].as_str().unwrap_or_default().contains("User \"eve\" cannot list"), "{st}");
    let proxied = lines.iter().find(|l| l.contains("id=\"proxied\"")).expect("the proxied request");
    assert!(
        proxied.contains("user=\"bob\" groups=\"\\\"system:masters\\\",\\\"g2\\\",\\\"system:authenticated\\\"\""),
        "{proxied}"
    );
}

/// The user agent the kube client sent, as the line quotes it.
fn user_agent(lines: &[String], id: &str) -> String {
    let line = lines.iter().find(|l| l.contains(&format!("id=\"{id}\""))).expect("line");
    let ua = line.split("user-agent=\"").nth(1).and_then(|r| r.split("\" namespace=").next()).expect("user agent");
    ua.to_string()
}

/// The 403's annotations in JSON: the decision and the authorizer's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_request_is_annotated_with_the_decision() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/readyz]}, {level: Metadata}]\n";
    let (s, log, _d) = audited(policy, &[]);
    let eve = with_cert(&s, &s.cert_dir(), "eve", &["devs"]).await;
    let st = send(&eve, Method::DELETE, &format!("{SS}/a.b"), "forbidden", &[], Value::Null)
        .await
        .status_err(403, "Forbidden");
    let ev = wait_events(&log, "forbidden", 2);
    assert_eq!(ev[1]["annotations"]["authorization.k8s.io/decision"], "forbid", "{}", ev[1]);
    assert!(ev[1]["annotations"]["authorization.k8s.io/reason"].is_string(), "{}", ev[1]);
    assert_eq!(ev[1]["responseStatus"]["message"], st["message"]);
    assert_eq!(ev[1]["responseStatus"]["code"], 403);
    assert_eq!(ev[1]["user"], json!({"username": "eve", "groups": ["devs", "system:authenticated"]}));
}

/// Impersonation (k8s.io/apiserver's WithAudit before WithImpersonation): RequestReceived records the user who sent
/// the request; the later stages add `impersonatedUser`, and the decision is the impersonated user's. An impersonation
/// the sender may not make is a 403 recorded under the sender alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_records_both_users() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata}]\n";
    let (s, log, _d) = audited(policy, &[]);
    let admin = s.client().await;
    let st = send(&admin, Method::GET, SS, "as-alice", &[("Impersonate-User", "alice")], Value::Null)
        .await
        .status_err(403, "Forbidden");
    assert!(st["message"].as_str().unwrap_or_default().contains("User \"alice\" cannot list"), "{st}");
    let ev = wait_events(&log, "as-alice", 2);
    assert_eq!(stages(&ev.iter().collect::<Vec<_>>()), ["RequestReceived", "ResponseComplete"]);
    assert!(ev[0]["impersonatedUser"].is_null(), "{}", ev[0]);
    assert!(ev[0]["user"]["groups"].as_array().is_some_and(|g| g.contains(&json!("system:masters"))), "{}", ev[0]);
    assert_eq!(
        ev[1]["impersonatedUser"],
        json!({"username": "alice", "groups": ["system:authenticated"]}),
        "{}",
        ev[1]
    );
    assert_eq!(ev[1]["user"], ev[0]["user"]);
    assert_eq!(ev[1]["annotations"]["authorization.k8s.io/decision"], "forbid", "{}", ev[1]);
    // dave may not impersonate: the 403 is the impersonation's, under dave alone.
    let dave = anonymous(&s).await;
    let st = send(
        &dave,
        Method::GET,
        SS,
        "dave-as-tim",
        &[("Authorization", "Bearer dave-token"), ("Impersonate-User", "tim@k8s.io")],
        Value::Null,
    )
    .await
    .status_err(403, "Forbidden");
    assert!(st["message"].as_str().unwrap_or_default().contains("cannot impersonate resource \"users\""), "{st}");
    let ev = wait_events(&log, "dave-as-tim", 2);
    assert_eq!(ev[1]["user"]["username"], "dave", "{}", ev[1]);
    assert!(ev[1]["impersonatedUser"].is_null(), "{}", ev[1]);
    assert_eq!(ev[1]["responseStatus"]["code"], 403, "{}", ev[1]);
}

/// Small max size: the file rotates to lumberjack's names, mode 0600, at most --audit-log-maxbackup backups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_rotates_with_upstreams_names_and_mode() {
    use std::os::unix::fs::PermissionsExt;
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/readyz]}, {level: RequestResponse}]\n";
    let (s, log, _d) = audited(policy, &["--audit-log-maxsize", "1", "--audit-log-maxbackup", "2"]);
    let c = s.client().await;
    // Each create logs its ~200 KiB object twice at RequestResponse: about 400 KiB a request.
    for i in 0..8 {
        let mut obj = ss(&format!("r{i}.example.com"));
        obj["metadata"]["annotations"] = json!({"big": "x".repeat(200 * 1024)});
        send(&c, Method::POST, SS, &format!("big-{i}"), &[], obj).await.ok(201);
    }
    wait_events(&log, "big-7", 2);
    let dir = log.parent().expect("dir");
    let backups = eventually("two backups, the older removed", Duration::from_secs(20), || {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n != "audit.log")
            .collect();
        names.sort();
        (names.len() == 2).then_some(names)
    });
    for name in &backups {
        // audit-2006-01-02T15-04-05.000.log
        let stamp = name.strip_prefix("audit-").and_then(|n| n.strip_suffix(".log")).expect(name);
        assert!(chrono::NaiveDateTime::parse_from_str(stamp, "%Y-%m-%dT%H-%M-%S%.3f").is_ok(), "{name}");
        assert_eq!(stamp.len(), 23, "{name}");
    }
    for file in backups.iter().map(|b| dir.join(b)).chain([log.clone()]) {
        let meta = std::fs::metadata(&file).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", file.display());
        assert!(meta.len() <= 1024 * 1024, "{}: {}", file.display(), meta.len());
    }
    assert_eq!(std::fs::metadata(dir).expect("dir").permissions().mode() & 0o777, 0o700);
}

/// blocking-strict with a log that can no longer be written: 500, and the create is not done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_strict_refuses_requests_it_cannot_audit() {
    // Only creates are audited: everything else (readiness, kubectl's reads below) is served.
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata, verbs: [create]}]\n";
    // /dev/full takes the open and refuses every write (ENOSPC); no rotation on a device.
    let args = ["--audit-log-mode", "blocking-strict", "--audit-log-maxsize", "0"];
    let dir = tempfile::tempdir().expect("tempdir");
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy).expect("policy");
    let mut all = vec!["--audit-policy-file", policy_file.to_str().expect("utf-8"), "--audit-log-path", "/dev/full"];
    all.extend_from_slice(&args);
    let s = Server::start(&all);
    let c = s.client().await;
    let resp = send(&c, Method::POST, SS, "strict", &[], ss("strict.example.com")).await;
    assert_eq!(resp.status, 500, "{}", resp.text());
    assert_eq!(resp.text(), format!("Internal Server Error: \"{SS}\": failed to store audit event\n"));
    assert_eq!(resp.header("content-type").as_deref(), Some("text/plain; charset=utf-8"));
    let out = s.kubectl(&["get", "storagestates", "strict.example.com"]);
    assert!(!out.status.success(), "the create was not done");
    let metrics = String::from_utf8_lossy(&s.kubectl(&["get", "--raw", "/metrics"]).stdout).into_owned();
    assert!(metrics.contains("apiserver_audit_error_total{plugin=\"log\"}"), "{metrics}");
    let rejected =
        metrics.lines().find(|l| l.starts_with("apiserver_audit_requests_rejected_total ")).expect("rejected");
    assert_ne!(rejected, "apiserver_audit_requests_rejected_total 0", "{metrics}");
}

/// Without a policy nothing is audited, but every answer carries its Audit-Id (WithAuditInit always runs); a bad
/// policy stops the start naming its field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_ids_without_a_policy_and_a_bad_policy_stops_the_start() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let resp = send(&c, Method::GET, "/healthz", "no-policy", &[], Value::Null).await;
    assert_eq!(resp.status, 200);
    assert!(call(&c, Method::GET, "/nothing", &[], vec![]).await.header("audit-id").is_some());

    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Foo}]\n").expect("policy");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--secure-port", &free_port().to_string(), "--audit-policy-file"])
        .arg(&policy)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(r#"loading audit policy file: rules[0].level: Unsupported value: "Foo": supported values: "None", "Metadata", "Request", "RequestResponse": from file"#),
        "{err}"
    );
    assert!(!dir.path().join("data").exists(), "nothing was opened");
}

/// manifests/audit/policy.yaml: ShootStates at Metadata whatever the verb, writes of the migration kinds at
/// RequestResponse, probes and scrapes not at all, Metadata otherwise.
#[test]
fn the_recommended_policy() {
    use migration_apiserver::request_info::RequestInfo;
    use policy::{Attributes, Level, Policy, PolicyRuleEvaluator};
    let file = repo().join("manifests/audit/policy.yaml");
    let p = PolicyRuleEvaluator::new(Policy::from_file(&file).expect("the recommended policy validates"));
    let user = migration_apiserver::auth::authn::UserInfo { name: "u".into(), ..Default::default() };
    let shootstates = "/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates";
    let cases = [
        ("POST", shootstates.to_string(), Level::Metadata),
        ("PUT", format!("{shootstates}/s"), Level::Metadata),
        ("GET", format!("{shootstates}/s/status"), Level::Metadata),
        ("POST", SS.to_string(), Level::RequestResponse),
        ("DELETE", format!("{SS}/a.b"), Level::RequestResponse),
        ("PATCH", "/apis/storagemigration.k8s.io/v1beta1/storageversionmigrations/m".into(), Level::RequestResponse),
        ("GET", SS.to_string(), Level::Metadata),
        ("GET", "/apis".into(), Level::Metadata),
        ("GET", "/healthz".into(), Level::None),
        ("GET", "/readyz/etcd".into(), Level::None),
        ("GET", "/metrics".into(), Level::None),
        ("GET", "/version".into(), Level::None),
    ];
    for (method, path, level) in cases {
        let info = RequestInfo::parse(&method.parse().expect("method"), &path, None);
        let got = p.evaluate(&Attributes { user: Some(&user), info: &info });
        assert_eq!(got.level, level, "{method} {path}");
        assert!(got.omit_stages.contains(policy::Stage::RequestReceived), "{method} {path}");
    }
}

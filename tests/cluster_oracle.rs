//! Upstream as the oracle (tests/common/oracle.rs): the same requests to this server and to a real kube-apiserver
//! v1.37.2, whole answers compared, every difference either listed in docs/reference/differences.md or a failure.
//! - `storagemigration.k8s.io` v1 objects and status updates, valid and invalid, from upstream's validation tests
//!   (pkg/apis/storagemigration/validation/validation_test.go): ours on a cluster with the group off, through
//!   kube-apiserver's aggregator, against kube-apiserver's own on a cluster that serves it;
//! - Namespaces and core/v1 Events, and field validation (Strict, Warn, Ignore): this server standalone (where it
//!   serves them) against kube-apiserver.

mod common;
use axum::http::Method;
use common::cluster::{Cluster, Options};
use common::oracle::{assert_only_known, compare, Answer, Difference};
use common::requests::call;
use serde_json::{json, Value};

const SVMS: &str = "/apis/storagemigration.k8s.io/v1/storageversionmigrations";
const JSON: (&str, &str) = ("content-type", "application/json");

/// Ours: the group off, so the kit registered this server for it (its scheduler off: nothing else writes the
/// objects). Theirs: kube-apiserver's own group, kube-controller-manager's controller off for the same reason.
fn clusters() -> (Cluster, Cluster) {
    let ours =
        Cluster::up(Options { in_tree: false, server_args: vec!["--disable-scheduler".into()], ..Options::default() });
    let theirs = Cluster::up(Options {
        server: false,
        kcm_args: vec!["--controllers=-storage-version-migrator-controller".into()],
        ..Options::default()
    });
    (ours, theirs)
}

/// One request to both; its answers.
async fn both(
    ours: &kube::Client,
    theirs: &kube::Client,
    method: Method,
    path: &str,
    body: &Value,
) -> (Answer, Answer) {
    let bytes = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
    let a = call(ours, method.clone(), path, &[JSON], bytes.clone()).await;
    let b = call(theirs, method, path, &[JSON], bytes).await;
    (Answer::of(&a), Answer::of(&b))
}

fn svm(name: &str, group: &str, resource: &str) -> Value {
    json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
        "metadata": {"name": name}, "spec": {"resource": {"group": group, "resource": resource}}})
}

fn condition(kind: &str, status: &str, reason: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": "", "lastTransitionTime": "2026-11-29T00:00:00Z"})
}

/// PUTs `object` (with its resourceVersion set to the stored one) to `path` on one server; the answer.
async fn put_current(c: &kube::Client, path: &str, name: &str, mut object: Value, suffix: &str) -> Answer {
    let current = call(c, Method::GET, &format!("{SVMS}/{name}"), &[], vec![]).await.json();
    object["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    Answer::of(&call(c, Method::PUT, &format!("{path}{suffix}"), &[JSON], object.to_string().into_bytes()).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn storagemigration_validation_matches_kube_apiserver() {
    let (ours_cluster, theirs_cluster) = clusters();
    let (ours, theirs) = (ours_cluster.client().await, theirs_cluster.client().await);
    let mut differences: Vec<Difference> = Vec::new();

    // TestValidateStorageVersionMigration: creates (dry run, so that one name serves every case).
    let creates = [
        ("svm-create/all fields non-empty", "non-empty", "non-empty"),
        ("svm-create/all fields empty", "", ""),
        ("svm-create/resource empty", "non-empty", ""),
        ("svm-create/resource invalid", "non-empty", "."),
        ("svm-create/group invalid", "-", "non-empty"),
    ];
    for (case, group, resource) in creates {
        let (a, b) =
            both(&ours, &theirs, Method::POST, &format!("{SVMS}?dryRun=All"), &svm("test-svm", group, resource)).await;
        differences.extend(compare(case, &a, &b));
    }

    // TestValidateStorageVersionMigrationUpdate: one object, then updates of it (dry run).
    let base = svm("test-svm-update", "example.com", "myresources");
    let (a, b) = both(&ours, &theirs, Method::POST, SVMS, &base).await;
    differences.extend(compare("svm-update/create", &a, &b));
    let mut labelled = base.clone();
    labelled["metadata"]["labels"] = json!({"a": "b"});
    let mut regrouped = base.clone();
    regrouped["spec"]["resource"]["group"] = json!("new.example.com");
    let mut emptied = base.clone();
    emptied["spec"]["resource"]["resource"] = json!("");
    for (case, object) in [
        ("svm-update/no change", &base),
        ("svm-update/metadata change", &labelled),
        ("svm-update/spec changed", &regrouped),
        ("svm-update/new object invalid", &emptied),
    ] {
        let path = format!("{SVMS}/test-svm-update");
        let a = put_current(&ours, &path, "test-svm-update", object.clone(), "?dryRun=All").await;
        let b = put_current(&theirs, &path, "test-svm-update", object.clone(), "?dryRun=All").await;
        differences.extend(compare(case, &a, &b));
    }

    // TestValidateStorageVersionMigrationStatusUpdate: per case a fresh object, its old status written, then the
    // new one (dry run).
    let running = condition("Running", "True", "Running");
    let succeeded = condition("Succeeded", "True", "Succeeded");
    let failed = condition("Failed", "True", "Failed");
    let running_false = condition("Running", "False", "NotRunning");
    let succeeded_false = condition("Succeeded", "False", "NotSucceeded");
    let failed_false = condition("Failed", "False", "NotFailed");
    let status = |rv: &str, conditions: Vec<&Value>| json!({"resourceVersion": rv, "conditions": conditions});
    let cases = [
        ("svm-status/initial status set with RV", None, status("123", vec![&running])),
        (
            "svm-status/running to succeeded",
            Some(status("123", vec![&running])),
            status("123", vec![&running_false, &succeeded]),
        ),
        (
            "svm-status/running to failed",
            Some(status("123", vec![&running])),
            status("123", vec![&running_false, &failed]),
        ),
        (
            "svm-status/succeeded stays succeeded",
            Some(status("123", vec![&succeeded])),
            status("123", vec![&succeeded]),
        ),
        ("svm-status/failed stays failed", Some(status("123", vec![&failed])), status("123", vec![&failed])),
        ("svm-status/resource version change", Some(status("123", vec![&running])), status("456", vec![&running])),
        ("svm-status/bad resource version format", None, status("abc", vec![&running])),
        (
            "svm-status/both succeeded and failed",
            Some(status("123", vec![&running])),
            status("123", vec![&succeeded, &failed]),
        ),
        (
            "svm-status/succeeded true to false",
            Some(status("123", vec![&succeeded])),
            status("123", vec![&succeeded_false]),
        ),
        ("svm-status/failed true to false", Some(status("123", vec![&failed])), status("123", vec![&failed_false])),
    ];
    for (i, (case, old, new)) in cases.into_iter().enumerate() {
        let name = format!("status-{i}");
        let object = svm(&name, "example.com", "myresources");
        let path = format!("{SVMS}/{name}/status");
        for c in [&ours, &theirs] {
            let created = call(c, Method::POST, SVMS, &[JSON], object.to_string().into_bytes()).await;
            assert_eq!(created.status, 201, "{case}: {}", created.text());
            if let Some(old) = &old {
                let mut with = object.clone();
                with["status"] = old.clone();
                let written = put_current(c, &path, &name, with, "").await;
                assert_eq!(written.code, 200, "{case}: old status: {}", written.body);
            }
        }
        let mut with = object.clone();
        with["status"] = new;
        let a = put_current(&ours, &path, &name, with.clone(), "?dryRun=All").await;
        let b = put_current(&theirs, &path, &name, with, "?dryRun=All").await;
        differences.extend(compare(case, &a, &b));
    }
    assert_only_known("svm-", &differences);
}

#[tokio::test(flavor = "multi_thread")]
async fn namespaces_events_and_field_validation_match_kube_apiserver() {
    // This server serves Namespaces and Events standalone (in a cluster they are kube-apiserver's).
    let server = common::Server::start(&[]);
    let c = Cluster::up(Options { server: false, ..Options::default() });
    let ours = server.client().await;
    let theirs = c.client().await;
    let mut differences: Vec<Difference> = Vec::new();
    let ns = |name: &str| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let requests: Vec<(&str, Method, String, Value)> = vec![
        ("ns/create", Method::POST, "/api/v1/namespaces?dryRun=All".into(), ns("oracle-ns")),
        ("ns/create invalid name", Method::POST, "/api/v1/namespaces".into(), ns("Invalid_Name")),
        ("ns/get missing", Method::GET, "/api/v1/namespaces/does-not-exist".into(), Value::Null),
        ("ns/delete missing", Method::DELETE, "/api/v1/namespaces/does-not-exist".into(), Value::Null),
        (
            "ns/fieldValidation Strict unknown field",
            Method::POST,
            "/api/v1/namespaces?dryRun=All&fieldValidation=Strict".into(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "strict"}, "spec": {"bogus": 1}}),
        ),
        (
            "ns/fieldValidation Warn unknown field",
            Method::POST,
            "/api/v1/namespaces?dryRun=All&fieldValidation=Warn".into(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "warn"}, "spec": {"bogus": 1}}),
        ),
        (
            "ns/fieldValidation Ignore unknown field",
            Method::POST,
            "/api/v1/namespaces?dryRun=All&fieldValidation=Ignore".into(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ignore"}, "spec": {"bogus": 1}}),
        ),
        (
            "events/create",
            Method::POST,
            "/api/v1/namespaces/default/events?dryRun=All".into(),
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1", "namespace": "default"},
                   "involvedObject": {"kind": "Namespace", "name": "default", "apiVersion": "v1"},
                   "reason": "Tested", "message": "by the oracle", "type": "Normal", "count": 1,
                   "source": {"component": "oracle"},
                   "firstTimestamp": "2026-11-29T00:00:00Z", "lastTimestamp": "2026-11-29T00:00:00Z"}),
        ),
        (
            "events/create without involvedObject",
            Method::POST,
            "/api/v1/namespaces/default/events?dryRun=All".into(),
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e2", "namespace": "default"},
                   "reason": "Tested", "type": "Normal"}),
        ),
        ("events/get missing", Method::GET, "/api/v1/namespaces/default/events/missing".into(), Value::Null),
    ];
    for (case, method, path, body) in requests {
        let (a, b) = both(&ours, &theirs, method, &path, &body).await;
        differences.extend(compare(case, &a, &b));
    }
    // A duplicate field, sent as raw bytes (a JSON object cannot hold it).
    let duplicate = br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"dup","name":"dup2"}}"#.to_vec();
    for (case, query) in
        [("ns/fieldValidation Strict duplicate field", "Strict"), ("ns/fieldValidation Warn duplicate field", "Warn")]
    {
        let path = format!("/api/v1/namespaces?dryRun=All&fieldValidation={query}");
        let a = Answer::of(&call(&ours, Method::POST, &path, &[JSON], duplicate.clone()).await);
        let b = Answer::of(&call(&theirs, Method::POST, &path, &[JSON], duplicate.clone()).await);
        differences.extend(compare(case, &a, &b));
    }
    assert_only_known("ns/", &differences.iter().filter(|d| d.case.starts_with("ns/")).cloned().collect::<Vec<_>>());
    assert_only_known(
        "events/",
        &differences.iter().filter(|d| d.case.starts_with("events/")).cloned().collect::<Vec<_>>(),
    );
}

/// The audit events of one log for ShootStates in `namespace`, at ResponseComplete, by verb (the last of each).
fn shootstate_audit_events(path: &std::path::Path, namespace: &str) -> std::collections::BTreeMap<String, Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["objectRef"]["resource"] == "shootstates"
                && e["objectRef"]["namespace"] == namespace
                && e["stage"] == "ResponseComplete"
        })
        .map(|mut e| {
            // Set per request and per server: compared by neither side.
            if let Some(o) = e.as_object_mut() {
                for field in ["auditID", "requestReceivedTimestamp", "stageTimestamp", "sourceIPs", "userAgent"] {
                    o.remove(field);
                }
            }
            // Per cluster: the object's identity, and the hash of each cluster's own admin certificate (its scheme,
            // `X509SHA256=`, is compared).
            for field in ["/objectRef/uid", "/objectRef/resourceVersion", "/responseStatus/details/uid"] {
                if let Some(v) = e.pointer_mut(field) {
                    *v = json!("<set>");
                }
            }
            if let Some(Value::Array(ids)) = e["user"]["extra"].get_mut("authentication.kubernetes.io/credential-id") {
                for id in ids.iter_mut() {
                    let scheme = id.as_str().and_then(|s| s.split_once('=')).map(|(k, _)| format!("{k}=<hash>"));
                    *id = json!(scheme);
                }
            }
            (e["verb"].as_str().unwrap_or_default().to_string(), e)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_events_of_shootstate_requests_match_kube_apiservers_for_its_crd() {
    // Ours: the aggregated ShootStates, audited by this server with manifests/audit/policy.yaml (Metadata for
    // ShootStates, RequestReceived omitted). Theirs: the same kind as a CRD (manifests/crds/), audited by
    // kube-apiserver under a policy with the same outcome for them (scripts/cluster.sh: Metadata, RequestReceived
    // omitted); no webhooks, whose annotations would be kube-apiserver's alone.
    let ours = Cluster::up(Options { server_args: vec!["--disable-scheduler".into()], ..Options::default() });
    let theirs = Cluster::up(Options { server: false, ..Options::default() });
    let crd = common::repo().join("manifests/crds/core.gardener.cloud_shootstates.yaml");
    theirs.kubectl_ok(&["apply", "-f", crd.to_str().expect("path")]);
    theirs.kubectl_ok(&["wait", "--for=condition=Established", "crd/shootstates.core.gardener.cloud", "--timeout=60s"]);
    const NS: &str = "audit-oracle";
    let base = format!("/apis/core.gardener.cloud/v1beta1/namespaces/{NS}/shootstates");
    let object = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
        "metadata": {"name": "s", "namespace": NS},
        "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"ca.crt": "YWJj"}}]}});
    for c in [&ours, &theirs] {
        c.kubectl_ok(&["create", "namespace", NS]);
        let client = c.client().await;
        let send = |method: Method, path: String, body: Option<Value>, content_type: &'static str| {
            let client = client.clone();
            async move {
                let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
                call(&client, method, &path, &[("content-type", content_type)], bytes).await
            }
        };
        assert_eq!(send(Method::POST, base.clone(), Some(object.clone()), JSON.1).await.status, 201);
        let got = send(Method::GET, format!("{base}/s"), None, JSON.1).await.json();
        assert_eq!(send(Method::GET, base.clone(), None, JSON.1).await.status, 200);
        let mut updated = got.clone();
        updated["metadata"]["labels"] = json!({"updated": "yes"});
        assert_eq!(send(Method::PUT, format!("{base}/s"), Some(updated), JSON.1).await.status, 200);
        let patch = json!({"metadata": {"labels": {"patched": "yes"}}});
        let patched = send(Method::PATCH, format!("{base}/s"), Some(patch), "application/merge-patch+json").await;
        assert_eq!(patched.status, 200);
        assert_eq!(send(Method::DELETE, format!("{base}/s"), None, JSON.1).await.status, 200);
    }
    let verbs = ["create", "get", "list", "update", "patch", "delete"];
    let read = |c: &Cluster, log: &str| {
        let path = c.dir.join("logs").join(log);
        common::eventually("an audit event for each verb", std::time::Duration::from_secs(20), || {
            let events = shootstate_audit_events(&path, NS);
            verbs.iter().all(|v| events.contains_key(*v)).then_some(events)
        })
    };
    let (our_events, their_events) =
        (read(&ours, "migration-apiserver-audit.log"), read(&theirs, "kube-apiserver-audit.log"));
    let mut differences = Vec::new();
    for verb in verbs {
        let answer = |e: &Value| Answer { code: 0, body: e.clone(), warnings: Vec::new() };
        differences.extend(compare(&format!("audit/{verb}"), &answer(&our_events[verb]), &answer(&their_events[verb])));
    }
    assert_only_known("audit/", &differences);
}

//! StorageVersionMigration of the in-tree API, `storagemigration.k8s.io` v1 and v1beta1, against the real binary:
//! kubectl CRUD in both versions (a v1beta1 read of a v1 object), the printer's columns, server-side apply, dry-run,
//! `/status` (kubectl `--subresource=status` and the Python client's `patch_storage_version_migration_status`),
//! watch, and upstream's validation cases through the REST API and the `/validate` webhook.
//!
//! The validation table is derived from kubernetes/kubernetes pkg/apis/storagemigration/validation/validation_test.go
//! as it reads for the v1 API (GroupResource spec, metav1.Condition status; the version whose status cases include
//! "invalid: bad resource version format"), the API of staging/src/k8s.io/api/storagemigration/v1/types.go at
//! 5807bf165780ef7d87b808db2c80c33fb01572a9.

mod common;
use common::admission::{admission_review, ReviewAnswer, ReviewOf, ADMIN_GROUPS, ADMIN_USERNAME};
use common::requests::{get, merge_patch, post};
use common::*;
use futures::stream::BoxStream;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use std::time::Duration;

const GROUP: &str = "storagemigration.k8s.io";
const V1_PATH: &str = "/apis/storagemigration.k8s.io/v1/storageversionmigrations";
const V1BETA1_PATH: &str = "/apis/storagemigration.k8s.io/v1beta1/storageversionmigrations";
/// The fully qualified name kubectl needs: a bare `storageversionmigrations` is also `migration.k8s.io`'s.
const QUALIFIED: &str = "storageversionmigrations.storagemigration.k8s.io";

fn svm(version: &str, name: &str, group: &str, resource: &str) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{version}"), "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": group, "resource": resource}},
    })
}

fn condition(type_: &str, status: &str) -> Value {
    let reason = if status == "True" { type_.to_string() } else { format!("Not{type_}") };
    json!({"type": type_, "status": status, "reason": reason, "lastTransitionTime": "2025-01-01T00:00:00Z"})
}

fn status(rv: &str, conditions: &[(&str, &str)]) -> Value {
    let conditions: Vec<Value> = conditions.iter().map(|(t, s)| condition(t, s)).collect();
    json!({"resourceVersion": rv, "conditions": conditions})
}

fn jsonpath(s: &Server, version: &str, name: &str, path: &str) -> String {
    s.kubectl_ok(&[
        "get",
        &format!("storageversionmigrations.{version}.{GROUP}"),
        name,
        "-o",
        &format!("jsonpath={path}"),
    ])
}

#[test]
fn kubectl_crud_in_both_versions_with_printer_columns_apply_and_dry_run() {
    let s = Server::start(&[]);
    // Created in v1 with a status: the status is dropped (only /status writes it).
    let v1 = "apiVersion: storagemigration.k8s.io/v1\nkind: StorageVersionMigration\nmetadata:\n  name: shootstates-v1\nspec:\n  resource:\n    group: core.gardener.cloud\n    resource: shootstates\nstatus:\n  resourceVersion: \"7\"\n";
    s.kubectl_ok_stdin(&["create", "-f", "-"], v1);
    let v1beta1 = "apiVersion: storagemigration.k8s.io/v1beta1\nkind: StorageVersionMigration\nmetadata:\n  name: configmaps-beta\nspec:\n  resource:\n    group: \"\"\n    resource: configmaps\n";
    s.kubectl_ok_stdin(&["create", "-f", "-"], v1beta1);
    for name in ["shootstates-v1", "configmaps-beta"] {
        for version in ["v1", "v1beta1"] {
            let got = jsonpath(&s, version, name, "{.apiVersion}|{.spec.resource.resource}|{.status}");
            let resource = if name == "configmaps-beta" { "configmaps" } else { "shootstates" };
            // No status is `{}`, as kube-apiserver v1.37.2 writes it (tests/cluster_oracle.rs).
            assert_eq!(got, format!("{GROUP}/{version}|{resource}|{{}}"), "{name} via {version}");
        }
    }

    // The printer's columns: NAME and RESOURCE (no AGE), the resource as `resource.group`.
    let table = s.kubectl_ok(&["get", QUALIFIED]);
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines,
        [
            vec!["NAME", "RESOURCE"],
            vec!["configmaps-beta", "configmaps"],
            vec!["shootstates-v1", "shootstates.core.gardener.cloud"]
        ],
        "{table}"
    );
    // Discovery: cluster-scoped, no short name (`svm` is migration.k8s.io's), v1 preferred.
    let resources = s.kubectl_ok(&["api-resources", "--api-group", GROUP, "--no-headers"]);
    let row: Vec<&str> = resources.split_whitespace().collect();
    assert_eq!(row, ["storageversionmigrations", "storagemigration.k8s.io/v1", "false", "StorageVersionMigration"]);

    // The spec is immutable, as a whole.
    let out = s.kubectl(&[
        "patch",
        QUALIFIED,
        "shootstates-v1",
        "--type=merge",
        "-p",
        r#"{"spec":{"resource":{"group":"apps"}}}"#,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("spec: Invalid value") && err.contains("field is immutable"),
        "{err}"
    );

    // Server-side dry-run stores nothing.
    let dry = v1beta1.replace("configmaps-beta", "dry");
    assert!(s.kubectl_ok_stdin(&["create", "--dry-run=server", "-f", "-"], &dry).contains("dry"));
    let out = s.kubectl(&["get", QUALIFIED, "dry"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"), "{out:?}");

    // Server-side apply: the manager owns the spec.
    let applied = v1.replace("shootstates-v1", "applied").replace("status:\n  resourceVersion: \"7\"\n", "");
    s.kubectl_ok_stdin(&["apply", "--server-side", "--field-manager=ssa-test", "-f", "-"], &applied);
    let obj = s.kubectl_json(&["get", QUALIFIED, "applied", "-o", "json", "--show-managed-fields"]);
    let managed = obj["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    assert!(
        managed.iter().any(|m| m["manager"] == "ssa-test"
            && m["operation"] == "Apply"
            && m["fieldsV1"]["f:spec"]["f:resource"].is_object()),
        "{obj}"
    );

    // Delete, in v1beta1 for a v1 object.
    s.kubectl_ok(&["delete", &format!("storageversionmigrations.v1beta1.{GROUP}"), "shootstates-v1", "applied"]);
    let left = s.kubectl_ok(&["get", QUALIFIED, "-o", "name"]);
    assert_eq!(left.trim(), format!("storageversionmigration.{GROUP}/configmaps-beta"));
}

#[test]
fn status_through_kubectl_subresource_only() {
    let s = Server::start(&[]);
    s.kubectl_ok_stdin(&["create", "-f", "-"], &svm("v1", "m", "core.gardener.cloud", "shootstates").to_string());
    let running = json!({"status": status("15", &[("Running", "True")])}).to_string();
    s.kubectl_ok(&["patch", QUALIFIED, "m", "--subresource=status", "--type=merge", "-p", &running]);
    let read = |version: &str| {
        jsonpath(
            &s,
            version,
            "m",
            "{.status.resourceVersion}|{.status.conditions[0].type}={.status.conditions[0].status}",
        )
    };
    assert_eq!(read("v1"), "15|Running=True");
    assert_eq!(read("v1beta1"), "15|Running=True");

    // A write of the object leaves the status as it was.
    s.kubectl_ok(&[
        "patch",
        QUALIFIED,
        "m",
        "--type=merge",
        "-p",
        r#"{"status":{"resourceVersion":"99"},"metadata":{"labels":{"a":"b"}}}"#,
    ]);
    assert_eq!(read("v1"), "15|Running=True");
    assert_eq!(jsonpath(&s, "v1", "m", "{.metadata.labels.a}"), "b");

    // Once set, status.resourceVersion stays; /status does not write the spec.
    let moved = json!({"status": {"resourceVersion": "16"}}).to_string();
    let out = s.kubectl(&["patch", QUALIFIED, "m", "--subresource=status", "--type=merge", "-p", &moved]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"status.resourceVersion: Invalid value: "16": field is immutable"#), "{err}");
    let spec = json!({"spec": {"resource": {"resource": "secrets"}}}).to_string();
    s.kubectl_ok(&["patch", QUALIFIED, "m", "--subresource=status", "--type=merge", "-p", &spec]);
    assert_eq!(jsonpath(&s, "v1", "m", "{.spec.resource.resource}"), "shootstates");

    // Succeeded, with Running turned False: allowed; then Succeeded cannot go back.
    let done = json!({"status": status("15", &[("Running", "False"), ("Succeeded", "True")])}).to_string();
    s.kubectl_ok(&["patch", QUALIFIED, "m", "--subresource=status", "--type=merge", "-p", &done]);
    let undone = json!({"status": status("15", &[("Succeeded", "False")])}).to_string();
    let out = s.kubectl(&["patch", QUALIFIED, "m", "--subresource=status", "--type=merge", "-p", &undone]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Success condition cannot be set to false once it is true"), "{err}");
}

/// A watch in v1beta1 sees the objects the Python client creates in v1 and the status it patches.
#[tokio::test(flavor = "multi_thread")]
async fn watch_and_the_python_client() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let gvk = GroupVersionKind::gvk(GROUP, "v1beta1", "StorageVersionMigration");
    let api: Api<DynamicObject> =
        Api::all_with(c.clone(), &ApiResource::from_gvk_with_plural(&gvk, "storageversionmigrations"));
    let mut events = api.watch(&WatchParams::default(), "0").await.expect("watch").boxed();
    let script = r#"
import json, sys
from kubernetes import client, config
config.load_kube_config(config_file=sys.argv[1])
v1 = client.StoragemigrationV1Api()
body = client.V1StorageVersionMigration(
    metadata=client.V1ObjectMeta(name="py"),
    spec=client.V1StorageVersionMigrationSpec(resource=client.V1GroupResource(group="apps", resource="deployments")))
v1.create_storage_version_migration(body)
status = {"status": {"resourceVersion": "21", "conditions": [{"type": "Running", "status": "True",
          "reason": "Started", "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}
# The server takes JSON merge patches (no strategic merge, as for every kind it serves): named explicitly.
v1.patch_storage_version_migration_status("py", status, _content_type="application/merge-patch+json")
beta = client.StoragemigrationV1beta1Api().read_storage_version_migration("py")
print(json.dumps({"resource": beta.spec.resource.resource, "rv": beta.status.resource_version,
                  "running": [c.status for c in beta.status.conditions if c.type == "Running"]}))
"#;
    let kubeconfig = s.kubeconfig().display().to_string();
    let out = tokio::task::spawn_blocking(move || python(&["-c", script, &kubeconfig])).await.expect("python");
    let answer: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answer, json!({"resource": "deployments", "rv": "21", "running": ["True"]}));

    match next(&mut events).await {
        WatchEvent::Added(o) => {
            assert_eq!(o.metadata.name.as_deref(), Some("py"));
            assert_eq!(o.types.as_ref().map(|t| t.api_version.as_str()), Some("storagemigration.k8s.io/v1beta1"));
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
    match next(&mut events).await {
        WatchEvent::Modified(o) => assert_eq!(o.data["status"]["resourceVersion"], "21", "{o:?}"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // Created through the kube crate in v1beta1 too.
    api.create(&PostParams::default(), &serde_json::from_value(svm("v1beta1", "kube", "", "secrets")).expect("object"))
        .await
        .expect("create");
    assert!(matches!(next(&mut events).await, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("kube")));
}

/// Discovery and OpenAPI: both versions, v1 preferred, with `/status`, no short name and no category; the OpenAPI
/// schema keys conditions by type.
#[tokio::test]
async fn discovery_and_openapi() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let group = get(&c, "/apis/storagemigration.k8s.io").await.ok(200);
    assert_eq!(
        group["versions"],
        json!([{"groupVersion": "storagemigration.k8s.io/v1", "version": "v1"},
               {"groupVersion": "storagemigration.k8s.io/v1beta1", "version": "v1beta1"}])
    );
    assert_eq!(group["preferredVersion"]["version"], "v1");
    for version in ["v1", "v1beta1"] {
        let list = get(&c, &format!("/apis/storagemigration.k8s.io/{version}")).await.ok(200);
        let resources = list["resources"].as_array().expect("resources");
        let names: Vec<&str> = resources.iter().filter_map(|r| r["name"].as_str()).collect();
        assert_eq!(names, ["storageversionmigrations", "storageversionmigrations/status"], "{list}");
        let main = &resources[0];
        assert_eq!(
            (main["kind"].as_str(), main["namespaced"].as_bool()),
            (Some("StorageVersionMigration"), Some(false))
        );
        let none = |field: &str| main.get(field).is_none_or(|v| v == &json!([]));
        assert!(none("shortNames") && none("categories"), "{main}");
    }
    let doc = get(&c, "/openapi/v3/apis/storagemigration.k8s.io/v1").await.ok(200);
    let schemas = &doc["components"]["schemas"];
    let status = &schemas["io.k8s.api.storagemigration.v1.StorageVersionMigrationStatus"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map", "{status}");
    assert_eq!(status["conditions"]["x-kubernetes-list-map-keys"], json!(["type"]), "{status}");
    let gvks = &schemas["io.k8s.api.storagemigration.v1.StorageVersionMigration"]["x-kubernetes-group-version-kind"];
    assert!(gvks.to_string().contains("\"version\":\"v1\""), "{gvks}");
}

/// The next watch event, within a deadline.
async fn next(events: &mut BoxStream<'_, kube::Result<WatchEvent<DynamicObject>>>) -> WatchEvent<DynamicObject> {
    let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event in time");
    event.expect("stream open").expect("event")
}

// ---------------------------------------------------------------------------------------------------------------
// upstream's validation cases, through the REST API and the webhook

const DNS1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const DNS1123: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// `TestValidateStorageVersionMigration`: (group, resource, the whole error, or "" when valid).
fn create_cases() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("non-empty", "non-empty", String::new()),
        ("", "", "spec.resource.resource: Required value: resource is required to be set".into()),
        ("non-empty", "", "spec.resource.resource: Required value: resource is required to be set".into()),
        ("non-empty", ".", format!("spec.resource.resource: Invalid value: \".\": {DNS1035}")),
        ("-", "non-empty", format!("spec.resource.group: Invalid value: \"-\": {DNS1123}")),
    ]
}

/// `TestValidateStorageVersionMigrationStatusUpdate`: (name, new status, old status, a part of the error).
fn status_cases() -> Vec<(&'static str, Value, Value, &'static str)> {
    let (running, succeeded, failed) = (("Running", "True"), ("Succeeded", "True"), ("Failed", "True"));
    let (running_false, succeeded_false, failed_false) =
        (("Running", "False"), ("Succeeded", "False"), ("Failed", "False"));
    vec![
        ("initial-status-with-rv", status("123", &[running]), Value::Null, ""),
        // GA: empty is valid (Running before the list, Failed for a resource not in discovery), not once set.
        ("running-without-rv", status("", &[running]), Value::Null, ""),
        ("failed-without-rv", status("", &[failed]), Value::Null, ""),
        (
            "rv-emptied",
            status("", &[running]),
            status("123", &[running]),
            "status.resourceVersion: Invalid value: \"\": field is immutable",
        ),
        ("running-to-succeeded", status("123", &[running_false, succeeded]), status("123", &[running]), ""),
        ("running-beside-succeeded", status("123", &[running, succeeded]), status("123", &[running]), ""),
        ("running-beside-failed", status("", &[running, failed]), status("", &[running]), ""),
        ("running-to-failed", status("123", &[running_false, failed]), status("123", &[running]), ""),
        ("succeeded-stays", status("123", &[succeeded]), status("123", &[succeeded]), ""),
        ("failed-stays", status("123", &[failed]), status("123", &[failed]), ""),
        (
            "rv-change",
            status("456", &[running]),
            status("123", &[running]),
            "status.resourceVersion: Invalid value: \"456\": field is immutable",
        ),
        (
            "bad-rv-format",
            status("abc", &[running]),
            Value::Null,
            "status.resourceVersion: Invalid value: \"abc\": resource version is not well formed: abc",
        ),
        (
            "succeeded-and-failed",
            status("123", &[succeeded, failed]),
            status("123", &[running]),
            "Both success and failed conditions cannot be true at the same time",
        ),
        (
            "succeeded-to-false",
            status("123", &[succeeded_false]),
            status("123", &[succeeded]),
            "Success condition cannot be set to false once it is true",
        ),
        (
            "failed-to-false",
            status("123", &[failed_false]),
            status("123", &[failed]),
            "Failed condition cannot be set to false once it is true",
        ),
    ]
}

/// The AdmissionReview kube-apiserver sends for a write of a StorageVersionMigration in `version`.
fn review(uid: &str, version: &str, operation: &str, object: &Value, old: Option<&Value>, sub: &str) -> Value {
    let of = ReviewOf {
        group: GROUP,
        version,
        kind: "StorageVersionMigration",
        resource: "storageversionmigrations",
        operation,
        username: ADMIN_USERNAME,
        groups: ADMIN_GROUPS,
    };
    let mut r = admission_review(uid, &of, Some(object), old);
    r["request"]["name"] = object["metadata"]["name"].clone();
    let options = if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" };
    r["request"]["options"] = json!({"apiVersion": "meta.k8s.io/v1", "kind": options});
    if !sub.is_empty() {
        r["request"]["subResource"] = json!(sub);
    }
    r
}

/// What the webhook answered: "" when allowed, else the denial's message.
fn webhook_message(answer: &Value) -> String {
    if answer["allowed"] == true {
        return String::new();
    }
    assert_eq!(answer["status"]["code"], 422, "{answer}");
    answer["status"]["message"].as_str().unwrap_or_default().to_string()
}

/// What the REST API answered: "" when `ok`, else the 422's message.
fn rest_message(resp: &common::requests::Resp, ok: u16) -> String {
    if resp.status == ok {
        return String::new();
    }
    let st = resp.status_err(422, "Invalid");
    st["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn upstream_validation_cases_through_rest_and_webhook() {
    let s = Server::start(&[]);
    let c = s.client().await;

    for (i, (group, resource, want)) in create_cases().into_iter().enumerate() {
        let (version, path) = if i % 2 == 0 { ("v1", V1_PATH) } else { ("v1beta1", V1BETA1_PATH) };
        let name = format!("create-{i}");
        let obj = svm(version, &name, group, resource);
        let rest = rest_message(&post(&c, path, &obj).await, 201);
        let uid = format!("c-{i}");
        let hook = webhook_message(
            &post(&c, "/validate", &review(&uid, version, "CREATE", &obj, None, "")).await.review(&uid),
        );
        if want.is_empty() {
            assert_eq!((rest.as_str(), hook.as_str()), ("", ""), "{group:?} {resource:?}");
        } else {
            let whole = format!("StorageVersionMigration.storagemigration.k8s.io \"{name}\" is invalid: {want}");
            assert_eq!(rest, whole, "REST {group:?} {resource:?}");
            assert_eq!(hook, whole, "webhook {group:?} {resource:?}");
        }
    }

    // TestValidateStorageVersionMigrationUpdate: the spec is immutable, metadata is not.
    let stored = post(&c, V1_PATH, &svm("v1", "update", "example.com", "myresources")).await.ok(201);
    let moved =
        merge_patch(&c, &format!("{V1_PATH}/update"), &json!({"spec": {"resource": {"group": "new.example.com"}}}))
            .await;
    // Upstream renders its internal type, whose Resource field has no JSON tag (kube-apiserver v1.37.2 answers so).
    let want = "StorageVersionMigration.storagemigration.k8s.io \"update\" is invalid: spec: Invalid value: {\"Resource\":{\"group\":\"new.example.com\",\"resource\":\"myresources\"}}: field is immutable";
    assert_eq!(rest_message(&moved, 200), want);
    let mut new = stored.clone();
    new["spec"]["resource"]["group"] = json!("new.example.com");
    let answer = post(&c, "/validate", &review("u-1", "v1", "UPDATE", &new, Some(&stored), "")).await.review("u-1");
    assert_eq!(webhook_message(&answer), want);
    let mut labeled = stored.clone();
    labeled["metadata"]["labels"] = json!({"a": "b"});
    let answer = post(&c, "/validate", &review("u-2", "v1", "UPDATE", &labeled, Some(&stored), "")).await.review("u-2");
    assert_eq!(webhook_message(&answer), "");
    assert_eq!(
        rest_message(
            &merge_patch(&c, &format!("{V1_PATH}/update"), &json!({"metadata": {"labels": {"a": "b"}}})).await,
            200
        ),
        ""
    );

    for (i, (name, new_status, old_status, want)) in status_cases().into_iter().enumerate() {
        let path = format!("{V1BETA1_PATH}/{name}");
        let created = post(&c, V1BETA1_PATH, &svm("v1beta1", name, "example.com", "myresources")).await.ok(201);
        if !old_status.is_null() {
            merge_patch(&c, &format!("{path}/status"), &json!({"status": old_status})).await.ok(200);
        }
        let mut old = created.clone();
        old["status"] = old_status.clone();
        let mut new = old.clone();
        new["status"] = new_status.clone();
        let uid = format!("s-{i}");
        let hook = webhook_message(
            &post(&c, "/validate", &review(&uid, "v1beta1", "UPDATE", &new, Some(&old), "status")).await.review(&uid),
        );
        let rest = rest_message(&merge_patch(&c, &format!("{path}/status"), &json!({"status": new_status})).await, 200);
        if want.is_empty() {
            assert_eq!((rest.as_str(), hook.as_str()), ("", ""), "{name}");
        } else {
            assert!(rest.contains(want), "{name}: REST said {rest}");
            assert!(hook.contains(want), "{name}: webhook said {hook}");
        }
    }
}

/// Names are DNS subdomains as apimachinery's IsDNS1123Subdomain checks them: at most 253 characters, with no limit
/// of 63 on a dot-separated part (that is a label's). In both groups' StorageVersionMigrations.
#[test]
fn long_names_are_subdomains_without_a_limit_per_part() {
    let s = Server::start(&["--disable-scheduler"]);
    let ours = |name: &str| {
        json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration", "metadata": {"name": name},
               "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}}})
    };
    let in_tree = |name: &str| svm("v1", name, "apps", "deployments");
    let long_part = format!("x{}", "a".repeat(63));
    let longest = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    let too_long = "a".repeat(254);
    for make in [&ours as &dyn Fn(&str) -> Value, &in_tree] {
        for name in [&long_part, &longest] {
            s.kubectl_ok_stdin(&["create", "-f", "-"], &make(name).to_string());
        }
        let out = s.kubectl_stdin(&["create", "-f", "-"], &make(&too_long).to_string());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains(&format!(
                    "metadata.name: Invalid value: \"{too_long}\": must be no more than 253 characters"
                )),
            "{stderr}"
        );
    }
}

/// A condition without lastTransitionTime, or with null (a Go client's zero metav1.Time), decodes as Go decodes
/// it and is a validation error beside every other one of the object: a 422, not a 400 decode error.
#[test]
fn zero_valued_condition_fields_are_validation_errors() {
    let s = Server::start(&["--disable-scheduler"]);
    // On create the status is reset before validation (upstream's strategy), so a status that decodes only as Go
    // decodes it is simply dropped, as upstream drops it.
    let mut with_status = svm("v1", "zero", "apps", "deployments");
    with_status["status"] = json!({"conditions": [{"type": "Running", "status": "True", "lastTransitionTime": null}]});
    let created = s.kubectl_ok_stdin(&["create", "-f", "-", "-o", "json"], &with_status.to_string());
    let created: Value = serde_json::from_str(&created).expect("json");
    assert!(created.get("status").is_none_or(|st| st["conditions"].is_null()), "{created}");
    for time in [json!({}), json!({"lastTransitionTime": null})] {
        let mut running = json!({"type": "Running", "status": "True", "reason": "Migrating", "message": ""});
        running.as_object_mut().expect("object").extend(time.as_object().expect("object").clone());
        let patch =
            json!({"status": {"resourceVersion": "abc", "conditions": [running, {"type": "Failed", "status": ""}]}});
        let out =
            s.kubectl(&["patch", QUALIFIED, "zero", "--subresource=status", "--type=merge", "-p", &patch.to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{patch}");
        for want in [
            "The StorageVersionMigration \"zero\" is invalid: ",
            "status.resourceVersion: Invalid value: \"abc\": resource version is not well formed: abc",
            "status.conditions[0].lastTransitionTime: Required value",
            "status.conditions[1].status: Required value",
            "status.conditions[1].lastTransitionTime: Required value",
            "status.conditions[1].reason: Required value",
        ] {
            assert!(stderr.contains(want), "{want:?} not in {stderr}");
        }
    }
}

//! Server-side apply and managedFields against the real binary: kubectl's `apply --server-side` (create, update,
//! conflicts, `--force-conflicts`, `--show-managed-fields`, the upgrade from client-side apply), the wire answers to
//! bad applies, dry-run, /status, and the Python `kubernetes` client's dynamic-client apply.

mod common;
use common::requests::*;
use common::*;

use axum::http::Method;
use serde_json::{json, Value};

const SS: &str = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-ssa/shootstates";
const APPLY: &str = "application/apply-patch+yaml";

fn shoot_yaml(name: &str, gardener: &[(&str, &str)], extensions_kind: Option<&str>) -> String {
    let mut y = format!(
        "apiVersion: core.gardener.cloud/v1beta1\nkind: ShootState\nmetadata:\n  name: {name}\n  namespace: garden-ssa\nspec:\n"
    );
    if !gardener.is_empty() {
        y.push_str("  gardener:\n");
        for (n, t) in gardener {
            y.push_str(&format!("  - name: {n:?}\n    type: {t}\n    data: {{k: v}}\n"));
        }
    }
    if let Some(k) = extensions_kind {
        y.push_str(&format!("  extensions:\n  - kind: {k}\n"));
    }
    y
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn get_json(s: &Server, name: &str) -> Value {
    let out = s.kubectl_ok(&["get", "shootstate", "-n", "garden-ssa", name, "-o", "json", "--show-managed-fields"]);
    serde_json::from_str(&out).expect("json")
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| (e["manager"].as_str().unwrap_or("").into(), e["operation"].as_str().unwrap_or("").into()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kubectl_server_side_apply_owns_conflicts_and_forces() {
    let s = Server::start(&[]);
    // Create, then update, by apply.
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &shoot_yaml("crew", &[("ca", "secret")], None));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "shootstate.core.gardener.cloud/crew serverside-applied");
    let obj = get_json(&s, "crew");
    assert_eq!(managers(&obj), [("kubectl".to_string(), "Apply".to_string())]);
    let entry = &obj["metadata"]["managedFields"][0];
    assert_eq!(entry["apiVersion"], "core.gardener.cloud/v1beta1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert!(entry["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{entry}");
    assert_eq!(
        entry["fieldsV1"]["f:spec"]["f:gardener"]["k:{\"name\":\"ca\"}"],
        json!({".": {}, "f:name": {}, "f:type": {}, "f:data": {"f:k": {}}})
    );
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "-f", "-"],
        &shoot_yaml("crew", &[("ca", "secret"), ("etcd", "secret")], Some("Infrastructure")),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let obj = get_json(&s, "crew");
    assert_eq!(obj["spec"]["gardener"].as_array().map(Vec::len), Some(2));

    // A second manager changing a field kubectl owns: the conflict, as kube-apiserver words it.
    let other = shoot_yaml("crew", &[("ca", "machine-state")], None);
    let out = s.kubectl_stdin(&["apply", "--server-side", "--field-manager", "gardenlet", "-f", "-"], &other);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .spec.gardener[name=\"ca\"].type"),
        "{err}"
    );
    // The same value is shared, not a conflict.
    let same = shoot_yaml("crew", &[("ca", "secret")], None);
    s.kubectl_stdin(&["apply", "--server-side", "--field-manager", "gardenlet", "-f", "-"], &same);
    let obj = get_json(&s, "crew");
    assert_eq!(managers(&obj).len(), 2, "{:?}", managers(&obj));

    // --force-conflicts takes the field; both managers remain, each with its fields.
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "--force-conflicts", "--field-manager", "gardenlet", "-f", "-"],
        &other,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let obj = get_json(&s, "crew");
    assert_eq!(obj["spec"]["gardener"][0]["type"], "machine-state");
    let by: std::collections::BTreeMap<String, Value> = obj["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .map(|e| (e["manager"].as_str().unwrap().to_string(), e["fieldsV1"].clone()))
        .collect();
    let ca = "k:{\"name\":\"ca\"}";
    assert!(by["gardenlet"]["f:spec"]["f:gardener"][ca].get("f:type").is_some());
    assert!(by["kubectl"]["f:spec"]["f:gardener"][ca].get("f:type").is_none(), "{by:?}");
    assert!(by["kubectl"]["f:spec"]["f:gardener"].get("k:{\"name\":\"etcd\"}").is_some());

    // kubectl hides managedFields unless asked.
    let plain: Value =
        serde_json::from_str(&s.kubectl_ok(&["get", "shootstate", "-n", "garden-ssa", "crew", "-o", "json"]))
            .expect("json");
    assert!(plain["metadata"].get("managedFields").is_none());

    // Leaving a field out of the next apply removes it when no one else owns it: etcd goes, ca (shared) stays.
    let out =
        s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &shoot_yaml("crew", &[("ca", "machine-state")], None));
    assert!(out.status.success(), "{}", stderr(&out));
    let obj = get_json(&s, "crew");
    let names: Vec<&str> =
        obj["spec"]["gardener"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(names, ["ca"]);
    assert!(obj["spec"].get("extensions").is_none(), "{}", obj["spec"]);
}

#[test]
fn server_side_apply_after_client_side_apply() {
    let s = Server::start(&[]);
    let v1 = shoot_yaml("legacy", &[("ca", "secret")], None);
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &v1);
    assert!(out.status.success(), "{}", stderr(&out));
    let obj = get_json(&s, "legacy");
    assert_eq!(managers(&obj), [("kubectl-client-side-apply".to_string(), "Update".to_string())]);
    // The same file, server-side, with a changed value: kubectl takes over its client-side apply's fields.
    let v2 = shoot_yaml("legacy", &[("ca", "machine-state")], None);
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &v2);
    assert!(out.status.success(), "{}", stderr(&out));
    let obj = get_json(&s, "legacy");
    assert_eq!(obj["spec"]["gardener"][0]["type"], "machine-state");
    assert!(managers(&obj).contains(&("kubectl".to_string(), "Apply".to_string())), "{:?}", managers(&obj));
    // And back to client-side apply, which still works from the annotation kept in step.
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &shoot_yaml("legacy", &[("ca", "secret")], None));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(get_json(&s, "legacy")["spec"]["gardener"][0]["type"], "secret");
}

#[tokio::test]
async fn bad_applies_and_options() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let path = format!("{SS}/wire");
    let apply = |query: &str, body: &str| {
        let c = c.clone();
        let url = format!("{path}{query}");
        let body = body.as_bytes().to_vec();
        async move { call(&c, Method::PATCH, &url, &[("content-type", APPLY)], body).await }
    };
    let good = shoot_yaml("wire", &[("ca", "secret")], None);
    let st = apply("", &good).await.status_err(422, "Invalid");
    assert_eq!(
        st["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    let st = call(
        &c,
        Method::PATCH,
        &format!("{path}?force=true"),
        &[("content-type", "application/merge-patch+json")],
        b"{}".to_vec(),
    )
    .await
    .status_err(422, "Invalid");
    assert_eq!(st["details"]["causes"][0]["field"], "force");
    let st = apply("?fieldManager=t", "a: [b\n").await.status_err(400, "BadRequest");
    assert!(st["message"].as_str().unwrap().starts_with("error encoding patch: "), "{st}");
    let st = apply("?fieldManager=t", "- 1\n- 2\n").await.status_err(400, "BadRequest");
    assert!(st["message"].as_str().unwrap().starts_with("error decoding patch: "), "{st}");
    let with_mf = good.replace("  namespace: garden-ssa\n", "  namespace: garden-ssa\n  managedFields: []\n");
    let st = apply("?fieldManager=t", &with_mf).await.status_err(400, "BadRequest");
    assert_eq!(st["message"], "metadata.managedFields must be nil");
    let st = apply("?fieldManager=t", &good.replace("v1beta1", "v9")).await.status_err(400, "BadRequest");
    assert_eq!(st["message"], "invalid object type: core.gardener.cloud/v9, Kind=ShootState");
    let st =
        apply("?fieldManager=t", &good.replace("kind: ShootState", "kind: Shoot")).await.status_err(400, "BadRequest");
    assert_eq!(st["message"], "invalid object type: core.gardener.cloud/v1beta1, Kind=Shoot");
    // YAML aliases expand within a bound: a body that would expand past it is a 400, not a server out of memory.
    let bomb = format!("a: &x [{}]\nb: [{}]\n", vec!["0"; 2000].join(","), vec!["*x"; 20000].join(","));
    let st = apply("?fieldManager=t", &bomb).await.status_err(400, "BadRequest");
    assert!(st["message"].as_str().unwrap().starts_with("error encoding patch: "), "{st}");
    // Validation applies to the merged object.
    let st = apply("?fieldManager=t", &shoot_yaml("wire", &[("", "secret")], None)).await.status_err(422, "Invalid");
    assert_eq!(st["details"]["causes"][0]["field"], "spec.gardener[0].name", "{st}");
    // Dry run: the answer, nothing stored.
    let r = apply("?fieldManager=t&dryRun=All", &good).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["metadata"]["managedFields"][0]["manager"], "t");
    get(&c, &path).await.status_err(404, "NotFound");
    // Created (201), then applied again (200); JSON is YAML.
    assert_eq!(apply("?fieldManager=t", &good).await.status, 201);
    let as_json = serde_yaml_ng::from_str::<Value>(&good).unwrap().to_string();
    let r = apply("?fieldManager=t", &as_json).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // 415 names the apply type among those accepted.
    let st =
        call(&c, Method::PATCH, &path, &[("content-type", "application/strategic-merge-patch+json")], b"{}".to_vec())
            .await
            .status_err(415, "UnsupportedMediaType");
    assert!(st["message"].as_str().unwrap().contains("application/apply-patch+yaml"), "{st}");
}

#[tokio::test]
async fn updates_record_managers_and_status_applies() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let svm = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": "m"}, "spec": {"resource": {"group": "g", "version": "v1", "resource": "r"}}});
    let path = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";
    let r = call(
        &c,
        Method::POST,
        &format!("{path}?fieldManager=creator"),
        &[("content-type", "application/json")],
        svm.to_string().into_bytes(),
    )
    .await;
    let created = r.ok(201);
    let mf = &created["metadata"]["managedFields"][0];
    assert_eq!((mf["manager"].as_str(), mf["operation"].as_str()), (Some("creator"), Some("Update")));
    assert!(mf["fieldsV1"]["f:spec"]["f:resource"].get("f:group").is_some(), "{mf}");
    // The status, applied through /status: an entry with subresource "status", conditions merged by type.
    let status = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration", "metadata": {"name": "m"},
        "status": {"conditions": [{"type": "Running", "status": "True", "lastUpdateTime": "2026-01-01T00:00:00Z"}]}});
    let r = call(
        &c,
        Method::PATCH,
        &format!("{path}/m/status?fieldManager=ctl"),
        &[("content-type", APPLY)],
        status.to_string().into_bytes(),
    )
    .await;
    let obj = r.ok(200);
    let entry = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "ctl")
        .cloned()
        .expect("ctl");
    assert_eq!(entry["subresource"], "status");
    assert!(entry["fieldsV1"]["f:status"]["f:conditions"].get("k:{\"type\":\"Running\"}").is_some(), "{entry}");
    // A write without fieldManager is recorded under the User-Agent's first segment.
    let merge = |body: &'static [u8], ua: &'static str| {
        let c = c.clone();
        async move {
            let headers = [("content-type", "application/merge-patch+json"), ("user-agent", ua)];
            call(
                &c,
                Method::PATCH,
                "/apis/migration.k8s.io/v1alpha1/storageversionmigrations/m",
                &headers,
                body.to_vec(),
            )
            .await
        }
    };
    let obj = merge(br#"{"metadata":{"labels":{"a":"b"}}}"#, "my-tool/1.2 (linux)").await.ok(200);
    let managers: Vec<&str> =
        obj["metadata"]["managedFields"].as_array().unwrap().iter().filter_map(|e| e["manager"].as_str()).collect();
    assert!(managers.contains(&"my-tool"), "{obj}");
    // `[{}]` (and `[]`) clear managedFields, and updates are not tracked again until an apply, as in kube-apiserver.
    for reset in [&br#"{"metadata":{"managedFields":[{}]}}"#[..], &br#"{"metadata":{"managedFields":[]}}"#[..]] {
        let obj = merge(reset, "kubectl/1").await.ok(200);
        assert!(obj["metadata"].get("managedFields").is_none(), "{obj}");
        let obj = merge(br#"{"metadata":{"labels":{"c":"d"}}}"#, "later/1").await.ok(200);
        assert!(obj["metadata"].get("managedFields").is_none(), "{obj}");
    }
    let again = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration", "metadata": {"name": "m", "labels": {"e": "f"}}});
    let r = call(
        &c,
        Method::PATCH,
        &format!("{path}/m?fieldManager=tracker"),
        &[("content-type", APPLY)],
        again.to_string().into_bytes(),
    )
    .await;
    let obj = r.ok(200);
    assert!(
        obj["metadata"]["managedFields"].as_array().is_some_and(|m| m.iter().any(|e| e["manager"] == "tracker")),
        "{obj}"
    );
}

/// An independent client: the Python `kubernetes` package's dynamic client applies server-side.
#[test]
fn python_dynamic_client_server_side_apply() {
    let s = Server::start(&[]);
    let script = r#"
import json, sys
from kubernetes import client, config, dynamic
config.load_kube_config(config_file=sys.argv[1])
dyn = dynamic.DynamicClient(client.ApiClient())
api = dyn.resources.get(api_version="core.gardener.cloud/v1beta1", kind="ShootState")
body = {"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
        "metadata": {"name": "py", "namespace": "garden-ssa"},
        "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"k": "v"}}]}}
api.server_side_apply(body=body, name="py", namespace="garden-ssa", field_manager="python")
body["spec"]["gardener"][0]["type"] = "other"
try:
    api.server_side_apply(body=body, name="py", namespace="garden-ssa", field_manager="intruder")
    print(json.dumps({"conflict": None}))
except client.exceptions.ApiException as e:
    print(json.dumps({"conflict": e.status, "body": json.loads(e.body)}))
"#;
    let out = python(&["-c", script, &s.kubeconfig().display().to_string()]);
    let answer: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answer["conflict"], 409, "{answer}");
    assert_eq!(answer["body"]["details"]["causes"][0]["field"], ".spec.gardener[name=\"ca\"].type");
    let obj = get_json(&s, "py");
    assert_eq!(managers(&obj), [("python".to_string(), "Apply".to_string())]);
}

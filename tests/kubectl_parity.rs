//! kubectl against the standalone server answers as against kube-apiserver: `kind: List` files (create, apply,
//! replace, delete, get), the lookups kubectl makes in the core group (a namespace after a namespaced object was not
//! found, `kubectl get namespaces`), 422 messages that name each field once, and wide columns. Real kubectl, and the
//! Python `kubernetes` package as an independent client.

mod common;
use common::requests::*;
use common::status::table_columns;
use common::*;

use serde_json::{json, Value};
use std::time::Duration;

/// A `kind: List` file: a namespace, a ShootState in it, and two cluster-scoped objects of ours.
const LIST: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata:
    name: garden-list
- apiVersion: core.gardener.cloud/v1beta1
  kind: ShootState
  metadata:
    name: shoot-a
    namespace: garden-list
  spec:
    gardener:
    - {name: ca, type: secret, data: {ca.crt: YWJj}}
- apiVersion: migration.k8s.io/v1alpha1
  kind: StorageState
  metadata:
    name: deployments.apps
  spec:
    resource: {group: apps, resource: deployments}
- apiVersion: migration.k8s.io/v1alpha1
  kind: StorageVersionMigration
  metadata:
    name: deployments-migration
  spec:
    resource: {group: apps, version: v1, resource: deployments}
"#;

const OBJECTS: [&str; 4] = [
    "namespace/garden-list",
    "shootstate.core.gardener.cloud/shoot-a",
    "storagestate.migration.k8s.io/deployments.apps",
    "storageversionmigration.migration.k8s.io/deployments-migration",
];

fn write(s: &Server, name: &str, body: &str) -> String {
    let p = s.dir.join(name);
    std::fs::write(&p, body).expect("write manifest");
    p.display().to_string()
}

/// kubectl's report, one line per object: `<kind>/<name> <what>` (`<kind> "<name>" deleted` for delete).
fn lines(out: &str) -> Vec<String> {
    out.lines().map(str::to_string).collect()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Must-show: a `kind: List` file works for create, get, apply, replace and delete, as against kube-apiserver (the
/// core group's `v1` is discovered, so kubectl maps `List` and flattens it; each item goes to its own resource).
#[test]
fn list_files_create_apply_replace_delete() {
    let s = Server::start(&[]);
    let list = write(&s, "list.yaml", LIST);
    let labelled = LIST
        .replace("    name: shoot-a\n", "    name: shoot-a\n    labels: {team: storage}\n")
        .replace("    name: deployments-migration\n", "    name: deployments-migration\n    labels: {team: storage}\n");
    let labelled = write(&s, "labelled.yaml", &labelled);

    let created: Vec<String> = OBJECTS.iter().map(|o| format!("{o} created")).collect();
    assert_eq!(lines(&s.kubectl_ok(&["apply", "-f", &list])), created);
    // The second apply patches what changed (JSON merge patch for our kinds), and leaves the rest alone.
    assert_eq!(
        lines(&s.kubectl_ok(&["apply", "-f", &labelled])),
        [
            "namespace/garden-list unchanged",
            "shootstate.core.gardener.cloud/shoot-a configured",
            "storagestate.migration.k8s.io/deployments.apps unchanged",
            "storageversionmigration.migration.k8s.io/deployments-migration configured",
        ]
    );
    let label = |kind: &str, ns: &[&str]| {
        let args = [&["get", kind][..], ns, &["-o", "jsonpath={.metadata.labels.team}"]].concat();
        s.kubectl_ok(&args)
    };
    assert_eq!(label("shootstate/shoot-a", &["-n", "garden-list"]), "storage");
    assert_eq!(label("svm/deployments-migration", &[]), "storage");

    // get -f lists every item; replace -f puts the file back (the labels go).
    let got = s.kubectl_ok(&["get", "-f", &list, "-o", "name"]);
    assert_eq!(lines(&got), OBJECTS);
    let replaced: Vec<String> = OBJECTS.iter().map(|o| format!("{o} replaced")).collect();
    assert_eq!(lines(&s.kubectl_ok(&["replace", "-f", &list])), replaced);
    assert_eq!(label("shootstate/shoot-a", &["-n", "garden-list"]), "");

    // delete -f: the namespace first, then what was in it, each found (no NotFound), exit status 0.
    let deleted = s.kubectl_ok(&["delete", "-f", &list]);
    assert_eq!(
        lines(&deleted),
        [
            "namespace \"garden-list\" deleted",
            "shootstate.core.gardener.cloud \"shoot-a\" deleted",
            "storagestate.migration.k8s.io \"deployments.apps\" deleted",
            "storageversionmigration.migration.k8s.io \"deployments-migration\" deleted",
        ]
    );
    let out = s.kubectl(&["get", "-f", &list]);
    assert!(!out.status.success());

    // create -f, from stdin and as JSON too.
    let json_list = serde_json::to_string(&yaml_to_json(&s, LIST)).expect("json");
    assert_eq!(lines(&stdin_ok(&s, &["create", "-f", "-"], &json_list)), created);
    let out = s.kubectl(&["create", "-f", &list]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(r#"Error from server (AlreadyExists): error when creating "#)
            && stderr(&out).contains(r#"shootstates.core.gardener.cloud "shoot-a" already exists"#),
        "{}",
        stderr(&out)
    );
}

fn stdin_ok(s: &Server, args: &[&str], input: &str) -> String {
    let out = s.kubectl_stdin(args, input);
    assert!(out.status.success(), "kubectl {args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The YAML of [`LIST`] as a JSON List, converted by kubectl itself (a client-side dry run prints the items).
fn yaml_to_json(s: &Server, yaml: &str) -> Value {
    let out = stdin_ok(s, &["create", "--dry-run=client", "-o", "json", "-f", "-"], yaml);
    let items: Vec<Value> = serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(items.len(), OBJECTS.len(), "{out}");
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Must-show: after a namespaced object is not found, kubectl asks for its namespace; the answers are kube-apiserver's:
/// the object is missing when the namespace exists (it does once an object was created in it), the namespace when
/// it does not. `kubectl get namespaces` lists the namespaces in use.
#[test]
fn missing_objects_and_namespaces_read_as_from_kube_apiserver() {
    let mut s = Server::start(&[]);
    stdin_ok(&s, &["create", "-f", "-"], &shoot_state("garden-dev", "shoot-a"));

    let out = s.kubectl(&["get", "shootstate", "-n", "garden-dev", "nope"]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out), "Error from server (NotFound): shootstates.core.gardener.cloud \"nope\" not found\n");
    let out = s.kubectl(&["get", "shootstate", "-n", "nowhere", "nope"]);
    assert_eq!(stderr(&out), "Error from server (NotFound): namespaces \"nowhere\" not found\n");

    // The namespace the create made, as kube-apiserver's NamespaceAutoProvision makes it.
    let table = s.kubectl_ok(&["get", "namespaces"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "STATUS", "AGE"], "{table}");
    assert_eq!(rows[1][..2], ["garden-dev", "Active"], "{table}");
    assert_eq!(rows.len(), 2, "{table}");
    let ns: Value = serde_json::from_str(&s.kubectl_ok(&["get", "ns", "garden-dev", "-o", "json"])).expect("json");
    assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "garden-dev", "{ns}");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]), "{ns}");
    assert_eq!(ns["status"]["phase"], "Active", "{ns}");
    // A dry-run create makes no namespace.
    stdin_ok(&s, &["create", "--dry-run=server", "-f", "-"], &shoot_state("garden-dry", "x"));
    let out = s.kubectl(&["get", "ns", "garden-dry"]);
    assert_eq!(stderr(&out), "Error from server (NotFound): namespaces \"garden-dry\" not found\n");

    // Objects stored before namespaces were served (written straight into the store): their namespaces exist once
    // namespaces are asked for.
    s.stop();
    let legacy = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                        "metadata": {"name": "old", "namespace": "garden-old", "uid": "u-old",
                                     "creationTimestamp": "2026-01-01T00:00:00Z"},
                        "spec": {"gardener": [{"name": "ca"}]}});
    s.write_raw("/registry/core.gardener.cloud/shootstates/garden-old/old", legacy.to_string().as_bytes());
    s.restart();
    let names = s.kubectl_ok(&["get", "namespaces", "-o", "name"]);
    assert_eq!(lines(&names), ["namespace/garden-dev", "namespace/garden-old"]);

    // Deleting a namespace deletes what is in it, in the background, as kube-apiserver's namespace controller.
    s.kubectl_ok(&["delete", "namespace", "garden-dev"]);
    eventually("the namespace's ShootStates deleted", Duration::from_secs(20), || {
        s.kubectl_ok(&["get", "shootstates", "-n", "garden-dev", "-o", "name"]).is_empty().then_some(())
    });
    assert_eq!(
        s.kubectl_ok(&["get", "shootstates", "-n", "garden-old", "-o", "name"]).trim(),
        "shootstate.core.gardener.cloud/old"
    );
}

fn shoot_state(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: core.gardener.cloud/v1beta1\nkind: ShootState\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  gardener:\n  - {{name: ca, type: secret, data: {{k: v}}}}\n"
    )
}

/// Behind kube-apiserver's aggregator (here: a cluster authenticates for us), the core group is kube-apiserver's:
/// `/api` lists no version and nothing under `/api/v1` is served.
#[test]
fn the_core_group_is_not_served_when_a_cluster_authenticates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "admin-token,admin,1,\"system:masters\"\n").expect("tokens");
    // Never reached: the lookup of the cluster's client CA is skipped, and only unknown tokens would be reviewed.
    let kubeconfig = dir.path().join("cluster.kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\nusers:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n",
    )
    .expect("kubeconfig");
    let s = Server::start(&[
        "--authentication-kubeconfig",
        &kubeconfig.display().to_string(),
        "--authentication-skip-lookup",
        "--token-auth-file",
        &tokens.display().to_string(),
    ]);
    let get = |path: &str| s.kubectl(&["--token", "admin-token", "get", "--raw", path]);
    let api: Value = serde_json::from_slice(&get("/api").stdout).expect("APIVersions");
    assert_eq!(api["versions"], json!([]), "{api}");
    for path in ["/api/v1", "/api/v1/namespaces", "/api/v1/namespaces/default"] {
        let out = get(path);
        assert!(stderr(&out).contains("NotFound"), "{path}: {}", stderr(&out));
    }
    // Our own groups are served as ever.
    assert!(get("/apis/migration.k8s.io/v1alpha1/storagestates").status.success());
}

/// Must-show: a 422 names each field once: kubectl prints `<field>: <message>` from each cause, and the Status
/// carries kube-apiserver's message and causes (`field`, and the message without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_name_each_field_once() {
    let s = Server::start(&[]);
    let bad_name = "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageState\nmetadata: {name: pods}\nspec:\n  resource: {group: apps, resource: deployments}\n";
    let out = s.kubectl_stdin(&["create", "-f", "-"], bad_name);
    assert!(!out.status.success());
    let detail = "must be \"deployments.apps\": the name of a StorageState is <resource>.<group> of spec.resource \
                  (<resource> for the core group)";
    assert_eq!(
        stderr(&out),
        format!("The StorageState \"pods\" is invalid: metadata.name: Invalid value: \"pods\": {detail}\n")
    );
    // Several causes: kubectl lists them, each once.
    let many = "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata: {name: m}\nspec:\n  resource: {group: apps}\n";
    let out = s.kubectl_stdin(&["create", "-f", "-"], many);
    assert_eq!(
        stderr(&out),
        "The StorageVersionMigration \"m\" is invalid: \n* spec.resource.resource: Required value\n* spec.resource.version: Required value\n"
    );

    let c = s.client().await;
    let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": "pods"},
                      "spec": {"resource": {"group": "apps", "resource": "deployments"}}});
    let st = post(&c, "/apis/migration.k8s.io/v1alpha1/storagestates", &body).await.status_err(422, "Invalid");
    assert_eq!(
        st["message"],
        format!("StorageState.migration.k8s.io \"pods\" is invalid: metadata.name: Invalid value: \"pods\": {detail}")
    );
    assert_eq!(
        st["details"],
        json!({"name": "pods", "group": "migration.k8s.io", "kind": "StorageState", "causes": [
            {"reason": "FieldValueInvalid", "field": "metadata.name", "message": format!("Invalid value: \"pods\": {detail}")},
        ]})
    );
    let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
                      "metadata": {"name": "m"}, "spec": {"resource": {"group": "apps"}}});
    let st =
        post(&c, "/apis/migration.k8s.io/v1alpha1/storageversionmigrations", &body).await.status_err(422, "Invalid");
    assert_eq!(
        st["message"],
        "StorageVersionMigration.migration.k8s.io \"m\" is invalid: [spec.resource.resource: Required value, \
         spec.resource.version: Required value]"
    );
    assert_eq!(
        st["details"]["causes"],
        json!([
            {"reason": "FieldValueRequired", "field": "spec.resource.resource", "message": "Required value"},
            {"reason": "FieldValueRequired", "field": "spec.resource.version", "message": "Required value"},
        ])
    );
}

/// Must-show: columns of priority 1 appear with `-o wide` only, after AGE as in kube-apiserver's tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_output_adds_the_priority_one_columns() {
    let s = Server::start(&[]);
    let svm = "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata: {name: m}\nspec:\n  resource: {group: apps, version: v1, resource: deployments}\n";
    stdin_ok(&s, &["create", "-f", "-"], svm);
    s.kubectl_ok(&[
        "patch", "svm", "m", "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"conditions":[{"type":"Failed","status":"True","reason":"Superseded","message":"a newer migration"}]}}"#,
    ]);
    let header =
        |out: &str| out.lines().next().unwrap_or_default().split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let narrow = s.kubectl_ok(&["get", "svm"]);
    assert_eq!(header(&narrow), ["NAME", "RESOURCE", "STATUS", "MIGRATED", "PROGRESS", "REMAINING", "AGE"], "{narrow}");
    let wide = s.kubectl_ok(&["get", "svm", "-o", "wide"]);
    assert_eq!(
        header(&wide),
        ["NAME", "RESOURCE", "STATUS", "MIGRATED", "PROGRESS", "REMAINING", "AGE", "REASON", "MESSAGE"],
        "{wide}"
    );
    assert!(wide.lines().nth(1).unwrap_or_default().ends_with("Superseded   a newer migration"), "{wide}");

    stdin_ok(&s, &["create", "-f", "-"], "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageState\nmetadata: {name: pods}\nspec:\n  resource: {resource: pods}\n");
    let wide = s.kubectl_ok(&["get", "ss", "-o", "wide"]);
    // Split on whitespace: "WRITE KEY" and "KEYS IN USE" are one column each.
    let narrow = ["NAME", "CURRENT", "PERSISTED", "HEARTBEAT", "WRITE", "KEY", "KEYS", "IN", "USE", "ROTATION", "AGE"];
    assert_eq!(header(&wide)[..narrow.len()], narrow, "{wide}");
    assert_eq!(header(&wide)[narrow.len()..], ["REPORTERS"], "{wide}");
    assert_eq!(header(&s.kubectl_ok(&["get", "ss"])), narrow);

    // The Table says which columns are wide.
    let c = s.client().await;
    let table = get_accept(
        &c,
        "/apis/migration.k8s.io/v1alpha1/storageversionmigrations",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .await
    .ok(200);
    let priorities = table_columns(&table);
    let want = [
        ("Name", 0),
        ("Resource", 0),
        ("Status", 0),
        ("Migrated", 0),
        ("Progress", 0),
        ("Remaining", 0),
        ("Age", 0),
        ("Reason", 1),
        ("Message", 1),
    ];
    assert_eq!(priorities, want.map(|(n, p)| (n.to_string(), p)));
    assert_eq!(table["rows"][0]["cells"].as_array().map(Vec::len), Some(want.len()), "{table}");
}

/// Must-show: an independent client, the Python `kubernetes` package, creates what a `kind: List` file holds with
/// `utils.create_from_yaml` (without server-side apply it creates built-in kinds only: namespaces here), and reads
/// it back.
#[test]
fn python_client_creates_a_list_file() {
    let s = Server::start(&[]);
    let list = write(
        &s,
        "namespaces.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: team-a}\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: team-b, labels: {tier: gold}}\n",
    );
    let script = r#"
import json, sys
from kubernetes import client, config, utils
config.load_kube_config(config_file=sys.argv[1])
api = client.ApiClient()
created = utils.create_from_yaml(api, sys.argv[2])
names = [o.metadata.name for group in created for o in group]
read = client.CoreV1Api(api).read_namespace("team-b")
listed = [n.metadata.name for n in client.CoreV1Api(api).list_namespace(label_selector="tier=gold").items]
print(json.dumps({"created": names, "phase": read.status.phase, "labels": read.metadata.labels, "listed": listed}))
"#;
    let out = python(&["-c", script, &s.kubeconfig().display().to_string(), &list]);
    let answer: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answer["created"], json!(["team-a", "team-b"]), "{answer}");
    assert_eq!(answer["phase"], "Active", "{answer}");
    assert_eq!(answer["labels"], json!({"tier": "gold", "kubernetes.io/metadata.name": "team-b"}), "{answer}");
    assert_eq!(answer["listed"], json!(["team-b"]), "{answer}");
    assert_eq!(lines(&s.kubectl_ok(&["get", "ns", "-o", "name"])), ["namespace/team-a", "namespace/team-b"]);
}

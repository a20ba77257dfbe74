//! ShootState (core.gardener.cloud v1alpha1 + v1beta1) against the real binary: kubectl CRUD in both versions,
//! Gardener's validation rules with exact field paths, size limits, and a storage-version switch across a restart.

mod common;
use common::status::cause_fields as causes;
use common::*;
use serde_json::{json, Value};

const NS_PATH: &str = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-dev/shootstates";

fn shoot(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
           "metadata": {"name": name, "namespace": "garden-dev"}, "spec": spec})
}

async fn send(client: &kube::Client, method: &str, path: &str, body: Vec<u8>, ct: &str) -> (u16, Value) {
    let req = http::Request::builder().method(method).uri(path).header("content-type", ct).body(body).expect("request");
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("transport");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[test]
fn kubectl_crud_in_both_versions_and_across_namespaces() {
    let s = Server::start(&[]);
    let v1alpha1 = "apiVersion: core.gardener.cloud/v1alpha1\nkind: ShootState\nmetadata:\n  name: shoot-a\n  namespace: garden-one\nspec:\n  gardener:\n  - name: ca\n    type: secret\n    data: {data: {ca.crt: YWJj}}\n  extensions:\n  - kind: Infrastructure\n    purpose: provider\n    state: {vpc: vpc-1}\n";
    s.kubectl_ok_stdin(&["apply", "-f", "-"], v1alpha1);
    let v1beta1 =
        v1alpha1.replace("v1alpha1", "v1beta1").replace("shoot-a", "shoot-b").replace("garden-one", "garden-two");
    assert!(s.kubectl_stdin(&["apply", "-f", "-"], &v1beta1).status.success());

    // Read each through both versions.
    for (ns, name) in [("garden-one", "shoot-a"), ("garden-two", "shoot-b")] {
        for v in ["v1alpha1", "v1beta1"] {
            let av = s.kubectl_ok(&[
                "get",
                &format!("shootstates.{v}.core.gardener.cloud"),
                "-n",
                ns,
                name,
                "-o",
                "jsonpath={.apiVersion}/{.spec.extensions[0].state.vpc}/{.metadata.generation}",
            ]);
            assert_eq!(av, format!("core.gardener.cloud/{v}/vpc-1/1"));
        }
    }
    let table = s.kubectl_ok(&["get", "shootstates", "-A"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAMESPACE", "NAME", "GARDENER", "DATA", "EXTENSIONS", "SIZE", "AGE"], "{table}");
    assert!(table.contains("garden-one") && table.contains("garden-two"), "{table}");

    // A spec change through v1alpha1 bumps the generation; a label change does not.
    s.kubectl_ok(&[
        "patch",
        "shootstates.v1alpha1.core.gardener.cloud",
        "-n",
        "garden-one",
        "shoot-a",
        "--type=merge",
        "-p",
        r#"{"spec":{"extensions":[{"kind":"Worker"}]}}"#,
    ]);
    s.kubectl_ok(&["label", "shootstate", "-n", "garden-one", "shoot-a", "x=y"]);
    assert_eq!(
        s.kubectl_ok(&[
            "get",
            "shootstate",
            "-n",
            "garden-one",
            "shoot-a",
            "-o",
            "jsonpath={.metadata.generation}/{.spec.extensions[0].kind}"
        ]),
        "2/Worker"
    );
    assert!(s
        .kubectl_ok(&["delete", "shootstates.v1alpha1.core.gardener.cloud", "-n", "garden-one", "shoot-a"])
        .contains("deleted"));
    assert_eq!(
        s.kubectl_ok(&["get", "shootstates", "-A", "-o", "name"]).trim(),
        "shootstate.core.gardener.cloud/shoot-b"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_rules_with_field_paths() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (shoot("Not_A_Label", json!({})), vec!["metadata.name"]),
        (shoot("dots.are.subdomains", json!({})), vec!["metadata.name"]),
        (shoot("s1", json!({"gardener": [{"name": "", "type": "secret"}]})), vec!["spec.gardener[0].name"]),
        // Top-level resources may also name only v1 Secrets and ConfigMaps.
        (
            shoot(
                "s2",
                json!({"resources": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "data": {}}]}),
            ),
            vec!["spec.resources[0]"],
        ),
        (shoot("s3", json!({"extensions": [{"kind": ""}]})), vec!["spec.extensions[0].kind"]),
        (shoot("s4", json!({"extensions": [{"kind": "Worker", "purpose": ""}]})), vec!["spec.extensions[0].purpose"]),
        (
            shoot(
                "s5",
                json!({"extensions": [{"kind": "Worker", "resources": [{"name": "r", "resourceRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}}]}]}),
            ),
            // Gardener reports an extension's resources at spec.resources, not under the extension.
            vec!["spec.resources[0].resourceRef"],
        ),
        (
            shoot(
                "s6",
                json!({"extensions": [{"kind": "Worker", "resources": [{"name": "", "resourceRef": {"kind": "Secret"}}]}]}),
            ),
            // Without an apiVersion the reference is also to an unsupported kind ("/, Kind=Secret").
            vec![
                "spec.resources[0].name",
                "spec.resources[0].resourceRef.apiVersion",
                "spec.resources[0].resourceRef",
                "spec.resources[0].resourceRef.name",
            ],
        ),
        (
            shoot(
                "s7",
                json!({"extensions": [{"kind": "Worker", "resources": [
                {"name": "r", "resourceRef": {"apiVersion": "v1", "kind": "Secret", "name": "a"}},
                {"name": "r", "resourceRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "b"}}]}]}),
            ),
            vec!["spec.resources[1].name"],
        ),
    ];
    for (obj, want) in cases {
        let (code, status) = send(&c, "POST", NS_PATH, obj.to_string().into_bytes(), "application/json").await;
        assert_eq!(code, 422, "{obj}: {status}");
        assert_eq!(status["reason"], "Invalid");
        assert_eq!(causes(&status), want, "{status}");
        for f in want {
            assert!(status["message"].as_str().unwrap_or("").contains(f), "{status}");
        }
    }
    // A valid one with every section, then an update without resourceVersion is refused (as gardener-apiserver).
    let ok = shoot(
        "valid",
        json!({
        "gardener": [{"name": "ca", "type": "secret", "data": {"data": {"ca.crt": "YWJj"}}, "labels": {"a": "b"}}],
        "extensions": [{"kind": "Worker", "name": "w", "purpose": "p", "state": {"x": 1},
                        "resources": [{"name": "r", "resourceRef": {"apiVersion": "v1", "kind": "Secret", "name": "s"}}]}],
        "resources": [{"apiVersion": "v1", "kind": "Secret", "name": "s", "data": {"k": "v"}}]}),
    );
    let (code, created) = send(&c, "POST", NS_PATH, ok.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["spec"], ok["spec"], "the object round-trips unchanged");
    let (code, status) =
        send(&c, "PUT", &format!("{NS_PATH}/valid"), ok.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(causes(&status), ["metadata.resourceVersion"]);
    let mut with_rv = created.clone();
    with_rv["spec"]["gardener"][0]["type"] = json!("machine-state");
    let (code, updated) =
        send(&c, "PUT", &format!("{NS_PATH}/valid"), with_rv.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["metadata"]["generation"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limits() {
    let s = Server::start(&["--max-object-bytes", "200000"]);
    let c = s.client().await;
    let blob = "x".repeat(250_000);
    let big = shoot("big", json!({"gardener": [{"name": "blob", "type": "secret", "data": {"v": blob}}]}));
    let (code, status) = send(&c, "POST", NS_PATH, big.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 413, "{status}");
    let msg = status["message"].as_str().unwrap_or("");
    assert!(msg.contains("200000") && msg.contains("bytes"), "message states size and limit: {msg}");
    // Bodies over 3 MiB are refused before parsing (this one is not even JSON).
    let (code, status) = send(&c, "POST", NS_PATH, vec![b'{'; 3 * 1024 * 1024 + 1], "application/json").await;
    assert_eq!(code, 413, "{status}");
    assert_eq!(status["reason"], "RequestEntityTooLarge");
    // Just under the object limit works.
    let fits =
        shoot("fits", json!({"gardener": [{"name": "blob", "type": "secret", "data": {"v": "y".repeat(150_000)}}]}));
    let (code, _) = send(&c, "POST", NS_PATH, fits.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_version_switch_across_restart() {
    let mut s = Server::start(&["--storage-version", "shootstates.core.gardener.cloud=v1alpha1"]);
    let hash = |c: kube::Client| async move {
        let (code, list) = send(&c, "GET", "/apis/core.gardener.cloud/v1beta1", vec![], "application/json").await;
        assert_eq!(code, 200);
        list["resources"][0]["storageVersionHash"].as_str().unwrap_or("").to_string()
    };
    let c = s.client().await;
    let h1 = hash(c.clone()).await;
    assert_eq!(h1, migration_apiserver::api::storage_version_hash("core.gardener.cloud", "v1alpha1", "ShootState"));
    let mut rvs = Vec::new();
    for i in 0..5 {
        let (code, obj) = send(
            &c,
            "POST",
            NS_PATH,
            shoot(&format!("s{i}"), json!({"gardener": [{"name": "ca"}]})).to_string().into_bytes(),
            "application/json",
        )
        .await;
        assert_eq!(code, 201);
        rvs.push(obj["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string());
    }
    s.restart_with(&[]);
    let c = s.client().await;
    let h2 = hash(c.clone()).await;
    assert_eq!(h2, migration_apiserver::api::storage_version_hash("core.gardener.cloud", "v1beta1", "ShootState"));
    assert_ne!(h1, h2, "the discovery hash follows the storage version");
    for (i, rv) in rvs.iter().enumerate() {
        for v in ["v1alpha1", "v1beta1"] {
            let path = format!("/apis/core.gardener.cloud/{v}/namespaces/garden-dev/shootstates/s{i}");
            let (code, obj) = send(&c, "GET", &path, vec![], "application/json").await;
            assert_eq!(code, 200);
            assert_eq!(obj["apiVersion"], format!("core.gardener.cloud/{v}"));
            assert_eq!(&obj["metadata"]["resourceVersion"], rv);
        }
    }
    // A no-op rewrite moves a stale (v1alpha1-encoded) object to v1beta1: new resourceVersion; a second one is a no-op.
    let path = format!("{NS_PATH}/s0");
    let (_, obj) = send(&c, "GET", &path, vec![], "application/json").await;
    let (code, rewritten) = send(&c, "PUT", &path, obj.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 200);
    assert_ne!(rewritten["metadata"]["resourceVersion"], obj["metadata"]["resourceVersion"]);
    assert_eq!(rewritten["metadata"]["generation"], obj["metadata"]["generation"], "no spec change");
    let (code, again) = send(&c, "PUT", &path, rewritten.to_string().into_bytes(), "application/json").await;
    assert_eq!(code, 200);
    assert_eq!(again["metadata"]["resourceVersion"], rewritten["metadata"]["resourceVersion"]);
}

//! Encryption at rest against the real binary: `--encryption-provider-config` in kube-apiserver's format, the data
//! file and `storage inspect` free of plaintext, reads (and watch events) decrypted, key rotation and
//! identity -> aesgcm migration by no-op rewrites, and clear errors for bad configs and missing keys.

mod common;
use common::shootstates::*;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

// Distinct keys (base64 of 32 bytes), never the same as each other.
const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const SB1: &str = "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";
const CBC1: &str = "YGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn8=";

const NS: &str = "garden-enc";

fn aesgcm(keys: &[(&str, &str)]) -> String {
    let mut s = "  - aesgcm:\n      keys:\n".to_string();
    for (name, secret) in keys {
        s += &format!("      - name: {name}\n        secret: {secret}\n");
    }
    s
}

/// An EncryptionConfiguration whose only entry covers `resources` with `providers` (YAML list items).
fn config_file(dir: &Path, name: &str, resources: &[&str], providers: &str) -> String {
    let list = resources.iter().map(|r| format!("\"{r}\"")).collect::<Vec<_>>().join(", ");
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [{list}]\n  \
         providers:\n{providers}"
    );
    let path = dir.join(name);
    std::fs::write(&path, yaml).expect("write config");
    path.display().to_string()
}

/// A ShootState carrying `canary` in a secret's labels and data and in an extension's state: every place a
/// plaintext leak would show.
fn canary_shootstate(name: &str, canary: &str) -> String {
    let mut o = shootstate("v1beta1", NS, name, json!({"note": canary}));
    o["spec"]["gardener"][0]["labels"] = json!({"canary": canary});
    o["spec"]["extensions"] = json!([{"kind": "Infrastructure", "purpose": "provider", "state": {"secret": canary}}]);
    o.to_string()
}

/// `kubectl create` (not apply: `kubectl replace` rewrites apply's last-applied annotation, so it would not be a
/// no-op rewrite).
fn create(s: &Server, manifest: &str) {
    s.kubectl_ok_stdin(&["create", "-f", "-"], manifest);
}

fn rv(s: &Server, name: &str) -> u64 {
    s.kubectl_ok(&["get", "shootstate", "-n", NS, name, "-o", "jsonpath={.metadata.resourceVersion}"])
        .parse()
        .expect("resourceVersion")
}

/// `kubectl get -o json | kubectl replace -f -`: a no-op rewrite. Returns the resourceVersion after it.
fn noop_replace(s: &Server, name: &str) -> u64 {
    let current = s.kubectl_ok(&["get", "shootstate", "-n", NS, name, "-o", "json"]);
    s.kubectl_ok_stdin(&["replace", "-f", "-"], &current);
    rv(s, name)
}

/// `storage inspect -o json` (the server must be stopped).
fn inspect(s: &Server, config: Option<&str>) -> (Vec<Value>, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["storage", "inspect", "--data-dir"]).arg(s.data_dir()).args(["-o", "json"]);
    if let Some(c) = config {
        cmd.args(["--encryption-provider-config", c]);
    }
    let out = cmd.output().expect("run inspect");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "inspect failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("inspect JSON: {e}\n{stdout}"));
    (v["items"].as_array().cloned().unwrap_or_default(), stdout)
}

fn entry<'a>(items: &'a [Value], key: &str) -> &'a Value {
    items.iter().find(|i| i["key"] == key).unwrap_or_else(|| panic!("{key} not in {items:#?}"))
}

fn shoot_key(name: &str) -> String {
    format!("/registry/core.gardener.cloud/shootstates/{NS}/{name}")
}

fn store_bytes(s: &Server) -> Vec<u8> {
    std::fs::read(s.data_dir().join("store.redb")).expect("read store.redb")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

async fn send(client: &kube::Client, method: &str, path: &str) -> (u16, Value) {
    let req = http::Request::builder().method(method).uri(path).body(Vec::new()).expect("request");
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("transport");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_at_rest_readable_through_the_api() {
    let cfg = tempfile::tempdir().expect("tempdir");
    // Three resources, three providers: ShootStates with aesgcm, StorageStates with secretbox, SVMs with aescbc.
    let yaml = format!(
        r#"apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [shootstates.core.gardener.cloud]
  providers:
{}- resources: [storagestates.migration.k8s.io]
  providers:
  - secretbox:
      keys:
      - name: sb1
        secret: {SB1}
- resources: ["*.*"]
  providers:
  - aescbc:
      keys:
      - name: cbc1
        secret: {CBC1}
  - identity: {{}}
"#,
        aesgcm(&[("key1", KEY1)])
    );
    let config = cfg.path().join("enc.yaml").display().to_string();
    std::fs::write(&config, yaml).expect("write config");
    let mut s = Server::start(&["--encryption-provider-config", &config]);

    create(&s, &canary_shootstate("s1", "CANARY-SHOOT-4f1d"));
    create(
        &s,
        "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageState\nmetadata:\n  name: deployments.apps\n  \
         annotations:\n    note: CANARY-SS-9c2e\nspec:\n  resource:\n    group: apps\n    resource: deployments\n",
    );
    create(
        &s,
        "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  name: m1\n  \
         annotations:\n    note: CANARY-SVM-07ab\nspec:\n  resource:\n    group: apps\n    version: v1\n    \
         resource: deployments\n",
    );

    // Reads decrypt: kubectl sees the plaintext.
    let got = s.kubectl_ok(&["get", "shootstate", "-n", NS, "s1", "-o", "jsonpath={.spec.extensions[0].state.secret}"]);
    assert_eq!(got, "CANARY-SHOOT-4f1d");
    let got = s.kubectl_ok(&["get", "storagestate", "deployments.apps", "-o", "jsonpath={.metadata.annotations.note}"]);
    assert_eq!(got, "CANARY-SS-9c2e");
    let got = s.kubectl_ok(&["get", "svm", "m1", "-o", "jsonpath={.metadata.annotations.note}"]);
    assert_eq!(got, "CANARY-SVM-07ab");
    let list = s.kubectl_ok(&["get", "shootstates", "-A", "-o", "json"]);
    assert!(list.contains("CANARY-SHOOT-4f1d"), "{list}");

    // Watch events are decrypted too (the value and, for the registry, the previous one).
    let api = shootstates_api(&s.client().await, NS);
    let start = rv(&s, "s1").to_string();
    let mut events = Box::pin(api.watch(&kube::api::WatchParams::default(), &start).await.expect("watch"));
    s.kubectl_ok(&["label", "shootstate", "-n", NS, "s1", "seen=yes"]);
    use futures::StreamExt;
    let modified = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match events.next().await.expect("stream open").expect("event") {
                kube::api::WatchEvent::Modified(o) => return o,
                kube::api::WatchEvent::Bookmark(_) => continue,
                other => panic!("expected Modified, got {other:?}"),
            }
        }
    })
    .await
    .expect("event in time");
    assert_eq!(modified.data["spec"]["extensions"][0]["state"]["secret"], "CANARY-SHOOT-4f1d");
    assert_eq!(modified.metadata.labels.as_ref().and_then(|l| l.get("seen")).map(String::as_str), Some("yes"));

    s.stop();
    // The data file holds none of the plaintext.
    let raw = store_bytes(&s);
    for canary in ["CANARY-SHOOT-4f1d", "CANARY-SS-9c2e", "CANARY-SVM-07ab", "ShootState", "StorageState"] {
        assert!(!contains(&raw, canary), "{canary} in plaintext in store.redb");
    }
    assert!(contains(&raw, "k8s:enc:aesgcm:v1:key1:") && contains(&raw, "k8s:enc:secretbox:v1:sb1:"));

    // inspect without the config: encryption visible, apiVersion and values not.
    let (items, out) = inspect(&s, None);
    let e = entry(&items, &shoot_key("s1"));
    assert_eq!((e["encryption"].as_str(), e["apiVersion"].as_str()), (Some("aesgcm:v1:key1"), Some("<encrypted>")));
    let e = entry(&items, "/registry/migration.k8s.io/storagestates/deployments.apps");
    assert_eq!(e["encryption"], "secretbox:v1:sb1");
    let e = entry(&items, "/registry/migration.k8s.io/storageversionmigrations/m1");
    assert_eq!(e["encryption"], "aescbc:v1:cbc1");
    assert!(items.iter().all(|i| i["size"].as_u64().unwrap_or(0) > 0 && i["revision"].as_u64().unwrap_or(0) > 0));
    assert!(!out.contains("CANARY") && !out.contains("spec"), "{out}");

    // With the config: the stored apiVersion, still no values.
    let (items, out) = inspect(&s, Some(&config));
    let e = entry(&items, &shoot_key("s1"));
    assert_eq!((e["apiVersion"].as_str(), e["stale"].as_bool()), (Some("core.gardener.cloud/v1beta1"), Some(false)));
    let e = entry(&items, "/registry/migration.k8s.io/storagestates/deployments.apps");
    assert_eq!(e["apiVersion"], "migration.k8s.io/v1alpha1");
    assert!(!out.contains("CANARY"), "{out}");

    // The table form.
    let out = Command::new(BIN)
        .args(["storage", "inspect", "--data-dir"])
        .arg(s.data_dir())
        .args(["--prefix", "/registry/core.gardener.cloud/", "--encryption-provider-config", &config])
        .output()
        .expect("inspect");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["KEY", "REVISION", "ENCRYPTION", "APIVERSION", "SIZE"], "{table}");
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!(rows[1][0], shoot_key("s1"));
    assert_eq!(rows[1][2..4], ["aesgcm:v1:key1", "core.gardener.cloud/v1beta1"], "{table}");
    assert!(!table.contains("CANARY"));

    // While the server runs, inspect refuses (the store is locked) instead of reading a moving file.
    s.restart_with(&["--encryption-provider-config", &config]);
    let out = Command::new(BIN).args(["storage", "inspect", "--data-dir"]).arg(s.data_dir()).output().expect("inspect");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it first"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn key_rotation_moves_objects_on_rewrite_only() {
    let cfg = tempfile::tempdir().expect("tempdir");
    let res = ["shootstates.core.gardener.cloud"];
    let v1 = config_file(cfg.path(), "v1.yaml", &res, &aesgcm(&[("key1", KEY1)]));
    let v2 = config_file(cfg.path(), "v2.yaml", &res, &aesgcm(&[("key2", KEY2), ("key1", KEY1)]));
    let mut s = Server::start(&["--encryption-provider-config", &v1]);
    create(&s, &canary_shootstate("a", "CANARY-A"));
    create(&s, &canary_shootstate("b", "CANARY-B"));
    let (rv_a, rv_b) = (rv(&s, "a"), rv(&s, "b"));
    // Current with key1: a no-op rewrite writes nothing.
    assert_eq!(noop_replace(&s, "a"), rv_a);

    // Rotate: key2 writes, key1 still reads.
    s.restart_with(&["--encryption-provider-config", &v2]);
    let got = s.kubectl_ok(&["get", "shootstate", "-n", NS, "a", "-o", "jsonpath={.spec.gardener[0].data.note}"]);
    assert_eq!(got, "CANARY-A");
    assert_eq!(rv(&s, "a"), rv_a, "reading does not rewrite");
    s.stop();
    let (items, _) = inspect(&s, Some(&v2));
    for name in ["a", "b"] {
        let e = entry(&items, &shoot_key(name));
        assert_eq!((e["encryption"].as_str(), e["stale"].as_bool()), (Some("aesgcm:v1:key1"), Some(true)));
    }

    // A no-op rewrite of the stale object re-encrypts it with key2 (new revision); a second one changes nothing.
    s.restart_with(&["--encryption-provider-config", &v2]);
    let moved = noop_replace(&s, "a");
    assert!(moved > rv_a, "rewrite of a stale value bumps the resourceVersion ({rv_a} -> {moved})");
    assert_eq!(noop_replace(&s, "a"), moved, "rewrite of a current value is skipped");
    assert_eq!(rv(&s, "b"), rv_b);
    s.stop();
    let (items, _) = inspect(&s, Some(&v2));
    let a = entry(&items, &shoot_key("a"));
    assert_eq!(
        (a["encryption"].as_str(), a["revision"].as_u64(), a["stale"].as_bool()),
        (Some("aesgcm:v1:key2"), Some(moved), Some(false))
    );
    let b = entry(&items, &shoot_key("b"));
    assert_eq!((b["encryption"].as_str(), b["revision"].as_u64()), (Some("aesgcm:v1:key1"), Some(rv_b)));
    let raw = store_bytes(&s);
    assert!(!contains(&raw, "CANARY-A") && !contains(&raw, "CANARY-B"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_to_aesgcm_and_missing_keys() {
    let cfg = tempfile::tempdir().expect("tempdir");
    let res = ["*.core.gardener.cloud"];
    let enc = config_file(cfg.path(), "enc.yaml", &res, &format!("{}  - identity: {{}}\n", aesgcm(&[("key1", KEY1)])));
    let only2 = config_file(cfg.path(), "only2.yaml", &res, &aesgcm(&[("key2", KEY2)]));

    // Written without encryption: the plaintext is in the file (which shows the file check can see it).
    let mut s = Server::start(&[]);
    create(&s, &canary_shootstate("p", "CANARY-PLAIN-51e0"));
    create(&s, &canary_shootstate("q", "CANARY-PLAIN-q"));
    let rv_p = rv(&s, "p");
    s.stop();
    assert!(contains(&store_bytes(&s), "CANARY-PLAIN-51e0"));
    let (items, _) = inspect(&s, None);
    let e = entry(&items, &shoot_key("p"));
    assert_eq!(
        (e["encryption"].as_str(), e["apiVersion"].as_str()),
        (Some("identity"), Some("core.gardener.cloud/v1beta1"))
    );

    // Encryption enabled: plaintext still reads, is stale, and a no-op rewrite encrypts it.
    s.restart_with(&["--encryption-provider-config", &enc]);
    let got = s.kubectl_ok(&["get", "shootstate", "-n", NS, "p", "-o", "jsonpath={.spec.gardener[0].labels.canary}"]);
    assert_eq!(got, "CANARY-PLAIN-51e0");
    let moved = noop_replace(&s, "p");
    assert!(moved > rv_p, "identity -> aesgcm rewrite bumps the resourceVersion");
    assert_eq!(noop_replace(&s, "p"), moved);
    s.stop();
    let (items, _) = inspect(&s, Some(&enc));
    assert_eq!(entry(&items, &shoot_key("p"))["encryption"], "aesgcm:v1:key1");
    let q = entry(&items, &shoot_key("q"));
    assert_eq!((q["encryption"].as_str(), q["stale"].as_bool()), (Some("identity"), Some(true)));

    // A config without key1: the start is refused (tests/encryption_reload.rs); forced, a clear 500 naming the key,
    // never garbage; plaintext objects still read.
    s.restart_with(&["--encryption-provider-config", &only2, "--allow-unreadable-encrypted-values"]);
    let c = s.client().await;
    let base = format!("/apis/core.gardener.cloud/v1beta1/namespaces/{NS}/shootstates");
    let (code, status) = send(&c, "GET", &format!("{base}/p")).await;
    assert_eq!(code, 500, "{status}");
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("InternalError")),
        "{status}"
    );
    let msg = status["message"].as_str().unwrap_or_default();
    assert!(msg.contains("aesgcm:v1:key1") && msg.contains(&shoot_key("p")), "{msg}");
    let (code, status) = send(&c, "GET", &base).await;
    assert_eq!(code, 500, "a list that includes it fails too: {status}");
    let (code, q) = send(&c, "GET", &format!("{base}/q")).await;
    assert_eq!((code, q["spec"]["gardener"][0]["labels"]["canary"].as_str()), (200, Some("CANARY-PLAIN-q")));
    let out = s.kubectl(&["get", "shootstate", "-n", NS, "p"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("key1"), "{}", String::from_utf8_lossy(&out.stderr));

    // The list names the undecryptable object by key (KEP-3926's StorageReadError).
    let (_, status) = send(&c, "GET", &base).await;
    assert_eq!(status["reason"], "StorageReadError", "{status}");
    assert_eq!(status["details"]["causes"][0]["field"], shoot_key("p"), "{status}");
    // Offline, `storage inspect --unreadable` with the same config lists it, and only it.
    s.stop();
    let out = Command::new(BIN)
        .args(["storage", "inspect", "--unreadable", "--encryption-provider-config", &only2, "--data-dir"])
        .arg(s.data_dir())
        .output()
        .expect("inspect");
    let text = String::from_utf8_lossy(&out.stdout);
    let keys: Vec<&str> = text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(keys, [shoot_key("p")], "{text}");
    // Its unsafe delete removes it without decrypting it; the resource lists again.
    s.restart_with(&["--encryption-provider-config", &only2, "--allow-unreadable-encrypted-values"]);
    let path = format!("{base}/p?ignoreStoreReadErrorWithClusterBreakingPotential=true");
    assert!(s.kubectl_ok(&["delete", "--raw", &path]).contains("Success"));
    let c = s.client().await;
    let (code, list) = send(&c, "GET", &base).await;
    assert_eq!((code, list["items"].as_array().map(Vec::len)), (200, Some(1)), "{list}");
}

#[test]
fn invalid_configs_fail_the_start() {
    let cfg = tempfile::tempdir().expect("tempdir");
    let res = ["*.*"];
    let cases: Vec<(PathBuf, &str)> = vec![
        (config_file(cfg.path(), "b64.yaml", &res, &aesgcm(&[("key1", "not*base64")])).into(), "base64"),
        (config_file(cfg.path(), "size.yaml", &res, &aesgcm(&[("key1", "AAECAwQ=")])).into(), "got 5 bytes"),
        (config_file(cfg.path(), "unknown.yaml", &res, "  - rot13:\n      keys: []\n").into(), "unknown field `rot13`"),
        (config_file(cfg.path(), "none.yaml", &res, "    []\n").into(), "at least one provider"),
        (cfg.path().join("missing.yaml"), "missing.yaml"),
    ];
    for (path, want) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(BIN)
            .args(["serve", "--secure-port", &free_port().to_string(), "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--cert-dir")
            .arg(dir.path().join("certs"))
            .arg("--encryption-provider-config")
            .arg(&path)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path:?} was accepted");
        assert!(stderr.contains("encryption provider config") && stderr.contains(want), "{path:?}: {stderr}");
        assert!(!dir.path().join("data").exists() && !dir.path().join("certs").exists(), "nothing is created");
    }
}

//! Secrets under a cluster's encryption-at-rest rotation, for the real-cluster key-rotation tests
//! (tests/cluster_encryption_real.rs, tests/cluster_encryption_ha.rs): the kube-apiserver config written as an
//! operator rolls it out, the kit's RBAC rule for Secrets that docs/guides/cluster-key-rotation.md tells users to add,
//! numbered Secrets in namespace `rotation` and their check, and this server's StorageState and migrations of them.

use super::cluster::Cluster;
use base64::Engine;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The namespace of the test Secrets.
pub const NAMESPACE: &str = "rotation";

/// One of this server's migrations of Secrets.
#[derive(Clone, Debug, PartialEq)]
pub struct Migration {
    pub name: String,
    pub reason: String,
    pub created: Timestamp,
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Writes `content` to `path` whole: a temporary file in the same directory, renamed over it.
pub fn write_atomically(path: &Path, content: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, content).expect("write the temporary config");
    std::fs::rename(&tmp, path).expect("rename the config into place");
}

/// An EncryptionConfiguration of Secrets: aesgcm with `keys` in this order, then identity.
pub fn aesgcm_config(keys: &[(&str, &[u8; 32])]) -> String {
    let keys: String =
        keys.iter().map(|(n, k)| format!("            - name: {n}\n              secret: {}\n", b64(*k))).collect();
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - aesgcm:\n          keys:\n{keys}      - identity: {{}}\n"
    )
}

/// Adds the rule the guide's step 1 tells users to add to the ClusterRole for Secrets, as it words it:
/// `{apiGroups: [""], resources: ["secrets"], verbs: ["list", "patch"]}`.
pub fn grant_secrets(c: &Cluster) {
    let rule = json!([{"op": "add", "path": "/rules/-",
        "value": {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "patch"]}}]);
    c.kubectl_ok(&["patch", "clusterrole", "migration-apiserver", "--type=json", "-p", &rule.to_string()]);
}

/// The value of Secret `i`.
pub fn secret_value(i: usize) -> String {
    format!("the value of secret {i:03}, which must survive every rewrite")
}

/// Every Secret of the namespace still reads as it was written.
pub fn assert_secrets_intact(c: &Cluster, count: usize) {
    let list = c.kubectl_json(&["get", "secrets", "-n", NAMESPACE, "-o", "json"]);
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), count);
    for s in items {
        let name = s["metadata"]["name"].as_str().expect("name");
        let i: usize = name.trim_start_matches("s-").parse().expect("index");
        assert_eq!(s["data"]["value"].as_str(), Some(b64(secret_value(i).as_bytes()).as_str()), "{name}");
    }
}

/// The StorageState `secrets` of this server.
pub fn storage_state(c: &Cluster) -> Option<Value> {
    let out = c.kubectl(&["get", "storagestates.migration.k8s.io", "secrets", "-o", "json"]);
    serde_json::from_slice(&out.stdout).ok()
}

pub fn annotation(state: &Value, key: &str) -> String {
    state["metadata"]["annotations"][key].as_str().unwrap_or_default().to_string()
}

/// The migrations in `after` that were not in `before` (older ones may have been pruned: --migration-history).
pub fn new_migrations(before: &[Migration], after: Vec<Migration>) -> Vec<Migration> {
    after.into_iter().filter(|m| !before.iter().any(|b| b.name == m.name)).collect()
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls `f` every half second until it returns Some or `timeout` passes (then None).
pub fn poll_or<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn create_secrets(c: &Cluster, count: usize) {
    c.kubectl_ok(&["create", "namespace", NAMESPACE]);
    let stream: String = (0..count)
        .map(|i| {
            let s = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("s-{i:03}"), "namespace": NAMESPACE},
                "data": {"value": b64(secret_value(i).as_bytes())}});
            format!("{s}\n")
        })
        .collect();
    let out = c.kubectl_ok_stdin(&["create", "-f", "-"], &stream);
    assert_eq!(out.lines().filter(|l| l.ends_with(" created")).count(), count, "{out}");
}

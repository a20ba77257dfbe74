//! What tests/storagemigration_ga.rs and tests/storagemigration_ga_faults.rs share: the cluster of each binary, the
//! custom resources of the tests, the migrator behind the proxy, and how an in-tree migration is requested and read.
#![allow(dead_code)]

use crate::common::cluster::{Cluster, Options};
use crate::common::crs::Cr;
use crate::common::proxy::{Proxy, Record, RequestInfo};
use crate::common::{cluster_migrator, eventually, Server};
use serde_json::{json, Value};
use std::sync::OnceLock;
use std::time::Duration;

pub const IN_TREE: &str = "storageversionmigrations.storagemigration.k8s.io";
/// The group of the tests' custom resources.
pub const GROUP: &str = "ga.example.com";
pub const END: Duration = Duration::from_secs(90);

/// The cluster the tests of a binary share: without this server, and without kube-apiserver's own
/// `storagemigration.k8s.io` (kube-controller-manager's migrator off), so that the migrator under test is the only
/// one; kube-apiserver reloads its encryption config every second.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::up(Options {
            server: false,
            in_tree: false,
            encryption_config_poll: Some("1s".into()),
            ..Default::default()
        })
    })
}

/// The custom resource `<plural>.ga.example.com` of `kind` in `namespace` (one per test).
pub fn cr(plural: &'static str, kind: &'static str, namespace: &'static str) -> Cr {
    Cr { group: GROUP, plural, kind, namespace: Some(namespace) }
}

/// The proxy in front of the cluster's kube-apiserver, and the migrator under test behind it.
pub struct Real {
    pub proxy: Proxy,
    pub migrating: Server,
}

impl Real {
    /// A migrator with the flags `extra`, without a rate limit unless they set one.
    pub fn new(c: &Cluster, extra: &[&str]) -> Real {
        let proxy = Proxy::in_front_of_cluster(c);
        let mut args = extra.to_vec();
        if !extra.contains(&"--migration-qps") {
            args.extend_from_slice(&["--migration-qps", "0"]);
        }
        let migrating = cluster_migrator(&proxy.kubeconfig(), &args);
        Real { proxy, migrating }
    }
}

/// `cr` installed with `n` stale objects (stored in v1, storage version v2), and a migrator of them.
pub async fn stale(cr: Cr, n: usize, extra: &[&str]) -> (Cr, Real) {
    let c = cluster();
    cr.install_stale(c, &c.client().await, n).await;
    (cr, Real::new(c, extra))
}

pub fn in_tree_manifest(name: &str, group: &str, resource: &str) -> String {
    json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration", "metadata": {"name": name},
           "spec": {"resource": {"group": group, "resource": resource}}})
    .to_string()
}

pub fn create_in_tree(s: &Server, name: &str, group: &str, resource: &str) {
    s.kubectl_ok_stdin(&["create", "-f", "-"], &in_tree_manifest(name, group, resource));
}

pub fn get(s: &Server, name: &str) -> Value {
    s.kubectl_json(&["get", IN_TREE, name, "-o", "json"])
}

pub fn condition<'a>(m: &'a Value, type_: &str) -> &'a Value {
    m["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

pub fn is_true(m: &Value, type_: &str) -> bool {
    condition(m, type_)["status"] == "True"
}

/// Polls until the migration ended and the runner turned Running False.
pub fn wait_ended(s: &Server, name: &str) -> Value {
    eventually(&format!("{name} to end"), END, || {
        let m = get(s, name);
        ((is_true(&m, "Succeeded") || is_true(&m, "Failed")) && !is_true(&m, "Running")).then_some(m)
    })
}

/// (type, status, reason, message) of every condition, in order.
pub fn conditions(m: &Value) -> Vec<(String, String, String, String)> {
    let s = |c: &Value, f: &str| c[f].as_str().unwrap_or_default().to_string();
    let cs = m["status"]["conditions"].as_array().cloned().unwrap_or_default();
    cs.iter().map(|c| (s(c, "type"), s(c, "status"), s(c, "reason"), s(c, "message"))).collect()
}

pub fn cond(t: &str, s: &str, r: &str, m: &str) -> (String, String, String, String) {
    (t.into(), s.into(), r.into(), m.into())
}

/// The runner's cleanup (migrationrunner_test.go "Cleanup admission updates SVM condition"): Running False,
/// `MigrationCompleted`, with the migration's generation.
pub fn assert_completed(m: &Value) {
    let running = condition(m, "Running");
    assert_eq!(
        (&running["status"], &running["reason"], &running["message"]),
        (&json!("False"), &json!("MigrationCompleted"), &json!("Migration completed")),
        "{m:#}"
    );
    assert_eq!(running["observedGeneration"], m["metadata"]["generation"], "{m:#}");
}

/// The `StorageMigrating` condition of a CRD (Null when it has none).
pub fn crd_condition(crd: &Value) -> &Value {
    condition(crd, "StorageMigrating")
}

/// Whether the request names `manager` as its field manager.
pub fn by_manager(r: &Record, manager: &str) -> bool {
    r.query.split('&').any(|kv| kv == format!("fieldManager={manager}"))
}

/// The writes (PATCH, PUT) of `cr`'s objects in `records`.
pub fn object_writes<'a>(records: &'a [Record], cr: &Cr) -> Vec<&'a Record> {
    let (prefix, plural) = (format!("/apis/{}/", cr.group), format!("/{}/", cr.plural));
    records
        .iter()
        .filter(|r| {
            (r.method == "PATCH" || r.method == "PUT") && r.path.starts_with(&prefix) && r.path.contains(&plural)
        })
        .collect()
}

/// The `i` of a request to `cr`'s object `<kind>-<i:05>`.
pub fn object_index(r: &RequestInfo, cr: &Cr) -> Option<usize> {
    if !r.path.starts_with(&format!("/apis/{}/", cr.group)) || !r.path.contains(&format!("/{}/", cr.plural)) {
        return None;
    }
    let prefix = format!("{}/{}-", cr.namespace?, cr.kind.to_lowercase());
    r.object()?.strip_prefix(&prefix)?.parse().ok()
}

//! The Events the scheduler records, read where operators look: `kubectl describe`, `kubectl get events`, core/v1
//! and events.k8s.io/v1. Standalone, this server keeps its own events (one server, its own ShootStates). In cluster
//! mode (`--kubeconfig`) they go to the target, and none to the migrating server: here a real kube-apiserver
//! (v1.37.2, a cluster without this server) serves them, its custom resources migrated by a standalone
//! migration-apiserver through our fault proxy (tests/common/proxy.rs), which injects the retried 503s.

mod common;
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use common::proxy::{Fault, Proxy};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);
const SS: &str = "shootstates.core.gardener.cloud";

/// Every Event of `s` in `resource` (`events` for core/v1, `events.v1.events.k8s.io`) with this reason, regarding
/// the object `name`.
fn events_of(s: &Server, resource: &str, reason: &str, name: &str) -> Vec<Value> {
    matching(&s.kubectl_json(&["get", resource, "-A", "-o", "json"]), resource, reason, name)
}

/// The Events of a `list` of `resource` with this reason, regarding the object `name`.
fn matching(list: &Value, resource: &str, reason: &str, name: &str) -> Vec<Value> {
    let regarding = |e: &Value| if resource == "events" { e["involvedObject"].clone() } else { e["regarding"].clone() };
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items.into_iter().filter(|e| e["reason"] == reason && regarding(e)["name"] == name).collect()
}

/// The part of `kubectl describe` after `Events:`.
fn described_events(s: &Server, kind: &str, name: &str) -> String {
    let out = s.kubectl_ok(&["describe", kind, name]);
    out.split_once("\nEvents:").map(|(_, events)| events.to_string()).unwrap_or_default()
}

/// A line of the described events with this type and reason, from us.
fn has_event(described: &str, type_: &str, reason: &str) -> bool {
    described.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.first() == Some(&type_) && words.get(1) == Some(&reason) && l.contains("migration-apiserver")
    })
}

fn condition_status(s: &Server, name: &str, type_: &str) -> String {
    let path = format!("jsonpath={{.status.conditions[?(@.type==\"{type_}\")].status}}");
    s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io", name, "-o", &path]).trim().to_string()
}

fn wait_condition(s: &Server, name: &str, type_: &str) {
    eventually(&format!("{name} {type_}"), TIMEOUT, || (condition_status(s, name, type_) == "True").then_some(()));
}

/// Standalone: a StorageState with a stale heartbeat at start-up is reset and migrated; the trigger's decisions
/// are Events regarding the StorageState, the migration's start and success Events regarding the migration, and
/// `kubectl describe` / `kubectl get events` show them, through core/v1 and events.k8s.io/v1 alike.
#[test]
fn standalone_trigger_and_migration_events() {
    let mut s = Server::start(&["--disable-scheduler"]);
    let discovery = s.kubectl_json(&["get", "--raw", "/apis/core.gardener.cloud/v1beta1"]);
    let hash = discovery["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == "shootstates"))
        .and_then(|r| r["storageVersionHash"].as_str())
        .expect("hash")
        .to_string();
    let state = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": SS},
                       "spec": {"resource": {"group": "core.gardener.cloud", "resource": "shootstates"}}});
    s.kubectl_ok_stdin(&["create", "-f", "-"], &state.to_string());
    let status = json!({"status": {"persistedStorageVersionHashes": [hash], "currentStorageVersionHash": hash,
                                   "lastHeartbeatTime": "2020-01-01T00:00:00Z"}});
    s.kubectl_ok(&["patch", "storagestate", SS, "--subresource=status", "--type=merge", "-p", &status.to_string()]);

    s.restart_with(&["--discovery-interval", "30s"]);
    let selector = format!("migration.k8s.io/resource={SS}");
    let name = eventually("the migration after the reset", TIMEOUT, || {
        let list = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", "-l", &selector, "-o", "json"]);
        list["items"][0]["metadata"]["name"].as_str().map(str::to_string)
    });
    wait_condition(&s, &name, "Succeeded");

    // kubectl describe (core/v1 events, found by involvedObject) of the migration and of the StorageState.
    let described = eventually("start and success under Events:", TIMEOUT, || {
        let d = described_events(&s, "storageversionmigrations.migration.k8s.io", &name);
        (has_event(&d, "Normal", "MigrationStarted") && has_event(&d, "Normal", "MigrationSucceeded")).then_some(d)
    });
    assert!(described.contains("Migrating shootstates.v1beta1.core.gardener.cloud"), "{described}");
    assert!(!described.contains("MigrationRetrying"), "nothing was retried: {described}");
    eprintln!("kubectl describe storageversionmigrations.migration.k8s.io {name}, Events:{described}");
    let described = eventually("the trigger's decisions under Events:", TIMEOUT, || {
        let d = described_events(&s, "storagestates", SS);
        (has_event(&d, "Normal", "StaleStorageStateReset") && has_event(&d, "Normal", "MigrationRequested"))
            .then_some(d)
    });
    assert!(described.contains(&format!("Requested StorageVersionMigration {name}")), "{described}");
    assert!(described.contains("storage state stale at start-up"), "{described}");

    let listed = s.kubectl_ok(&["get", "events", "-A"]);
    for reason in ["MigrationStarted", "MigrationSucceeded", "MigrationRequested", "StaleStorageStateReset"] {
        assert!(listed.contains(reason), "{reason} missing from kubectl get events -A:\n{listed}");
    }

    // As client-go's tools/events writes them (events.k8s.io/v1).
    let succeeded = events_of(&s, "events.v1.events.k8s.io", "MigrationSucceeded", &name);
    assert_eq!(succeeded.len(), 1, "{succeeded:#?}");
    let e = &succeeded[0];
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["action"], "Migrate");
    assert_eq!(e["reportingController"], "migration-apiserver");
    assert!(e["reportingInstance"].as_str().is_some_and(|i| i.starts_with("migration-apiserver-")), "{e}");
    assert_eq!(e["metadata"]["namespace"], "default", "a cluster-scoped object's events live in default");
    assert!(e["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(&format!("{name}."))), "{e}");
    assert_eq!(e["regarding"]["kind"], "StorageVersionMigration");
    assert_eq!(e["regarding"]["apiVersion"], "migration.k8s.io/v1alpha1");
    assert!(e["note"].as_str().is_some_and(|n| n.starts_with("Migrated 0 objects of shootstates")), "{e}");
    assert!(e["eventTime"].is_string(), "{e}");
}

/// Cluster mode: a migration whose writes are retried records a Warning with the error, and the repetition of
/// the same retry becomes that Event's series; a migration refused by the target records its failure. The
/// Events are on the target, a real kube-apiserver (core/v1 and events.k8s.io/v1 there), none on the migrating
/// server. The 503s of the retries are the fault proxy's; the refusal (403) is kube-apiserver's own, a
/// ValidatingAdmissionPolicy denying the writes of one object.
#[test]
fn cluster_mode_retry_series_and_failure_go_to_the_target() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let c = Cluster::up(Options { server: false, ..Default::default() });
    let cr = Cr { group: "events.example.com", plural: "bells", kind: "Bell", namespace: Some("events-recorded") };
    rt.block_on(async { cr.install_stale(&c, &c.client().await, 3).await });
    let (retried_object, refused_object) = (cr.object_name(1), cr.object_name(2));
    let proxy = Proxy::in_front_of_cluster(&c);
    // The no-op write of the second object gets 503 twice, then passes.
    let mut refused = 0;
    let write_of = |name: &str| format!("/{}/{name}", cr.plural);
    let retried_path = write_of(&retried_object);
    proxy.add_rule(move |r| {
        if !(r.is_patch() && r.path.ends_with(&retried_path)) || refused == 2 {
            return None;
        }
        refused += 1;
        Some(Fault::Status { code: 503, retry_after: None })
    });
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "0"]);

    let retried = request_cr_migration(&m, &cr);
    wait_condition(&m, &retried, "Succeeded");
    let (core, series) = eventually("the retry Warning with a series of 2 on the target", TIMEOUT, || {
        let core = cluster_events(&c, "events", "MigrationRetrying", &retried).pop()?;
        let series = cluster_events(&c, "events.v1.events.k8s.io", "MigrationRetrying", &retried).pop()?;
        // Both reads after the series patch: the core/v1 read may come before it lands and the other after.
        let both = series["series"]["count"].as_i64() >= Some(2) && core["series"]["count"].as_i64() >= Some(2);
        both.then_some((core, series))
    });
    assert_eq!(series["type"], "Warning");
    let note = series["note"].as_str().unwrap_or_default();
    assert!(note.contains("503 Service Unavailable") && note.contains("injected by the fault proxy"), "{series}");
    assert_eq!(series["reportingController"], "migration-apiserver");
    assert_eq!(series["regarding"]["kind"], "StorageVersionMigration");
    assert_eq!(series["metadata"]["namespace"], "default", "a cluster-scoped object's events live in default");
    // The same Event read through core/v1: what kubectl describe shows, with its series.
    assert_eq!(core["type"], "Warning");
    assert_eq!(core["message"], series["note"]);
    assert!(core["series"]["count"].as_i64() >= Some(2), "{core}");
    assert_eq!(core["metadata"]["name"], series["metadata"]["name"], "one Event, not one per retry");
    let retries = cluster_events(&c, "events", "MigrationRetrying", &retried);
    assert_eq!(retries.len(), 1, "one Event, not one per retry: {retries:#?}");
    eventually("start and success on the target", TIMEOUT, || {
        let started = cluster_events(&c, "events", "MigrationStarted", &retried);
        let succeeded = cluster_events(&c, "events", "MigrationSucceeded", &retried);
        (started.len() == 1 && succeeded.len() == 1).then_some(())
    });
    let listed = c.kubectl_ok(&["get", "events", "-A"]);
    assert!(listed.contains("MigrationRetrying") && listed.contains(&retried), "{listed}");
    eprintln!("the target's kubectl get events -A:\n{listed}");
    let in_v2 = BTreeMap::from([(format!("{}/v2", cr.group), 3)]);
    assert_eq!(cr.stored_counts(&c), in_v2, "the retried migration rewrote every object");

    // A write the target refuses (403) fails the migration: a Warning with the error.
    proxy.clear_rules();
    rt.block_on(cr.refuse_writes(&c, &refused_object, Some("Forbidden")));
    proxy.clear_records();
    let failed = request_cr_migration(&m, &cr);
    wait_condition(&m, &failed, "Failed");
    let e = eventually("the failure Warning on the target", TIMEOUT, || {
        cluster_events(&c, "events", "MigrationFailed", &failed).pop()
    });
    assert_eq!(e["type"], "Warning");
    let message = e["message"].as_str().unwrap_or_default();
    let object = format!("{}/{refused_object}", cr.namespace.unwrap_or_default());
    assert!(message.contains("403 Forbidden") && message.contains(&object), "{e}");
    assert!(message.contains("refused by the test's policy"), "kube-apiserver's own message: {e}");
    eprintln!("the failure Event's message: {message}");
    let refusals: Vec<(u16, bool)> = proxy
        .records()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with(&write_of(&refused_object)))
        .map(|r| (r.code, r.fault))
        .collect();
    assert_eq!(refusals, [(403, false)], "kube-apiserver's answers, not the proxy's: (code, injected)");

    // Nothing on the migrating server: its events went to the target.
    let own = m.kubectl_json(&["get", "events", "-A", "-o", "json"]);
    assert_eq!(own["items"], json!([]), "{own}");
}

/// The Events of the cluster in `resource` with this reason regarding `name`, as [`events_of`] reads a server's.
fn cluster_events(c: &Cluster, resource: &str, reason: &str, name: &str) -> Vec<Value> {
    matching(&c.kubectl_json(&["get", resource, "-A", "-o", "json"]), resource, reason, name)
}

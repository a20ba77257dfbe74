//! `storagemigration.k8s.io` migrations as kube-controller-manager runs them at GA (Kubernetes 1.37), black-box
//! against the real binary. The cases are derived from upstream's own tests (kubernetes/kubernetes, each named at its
//! test): `pkg/controller/storageversionmigrator/migrationrunner_test.go` (promotion, the CRD's `StorageMigrating`
//! condition and storedVersions, the cleanup to Running=False), `storageversionmigrator_test.go` (no-op merge
//! patches, 404 and 409 skipped, transient errors retried, an unhandled error failing with its counts),
//! `resourceversion.go`'s checks (verbs, a malformed list resourceVersion) and `test/integration/storageversionmigrator/`
//! (every object rewritten once after a key change, a second migration rewriting none).
//!
//! A standalone server shows what it can alone (key rotation, the conditions as a watch sees them, field managers);
//! for the rest the target is a real migration-apiserver holding ShootStates behind our fault proxy, which also
//! stands in for kube-apiserver's apiextensions endpoints and, where a case needs it, its discovery.

mod common;
use common::proxy::{Fault, Proxy, RequestInfo};
use common::shootstates::{target_with_shootstates, SHOOTSTATES};
use common::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const IN_TREE: &str = "storageversionmigrations.storagemigration.k8s.io";
const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/shootstates.core.gardener.cloud";
const END: Duration = Duration::from_secs(90);

fn in_tree_manifest(name: &str) -> String {
    json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration", "metadata": {"name": name},
           "spec": {"resource": {"group": "core.gardener.cloud", "resource": "shootstates"}}})
    .to_string()
}

fn create_in_tree(s: &Server, name: &str) {
    s.kubectl_ok_stdin(&["create", "-f", "-"], &in_tree_manifest(name));
}

fn get(s: &Server, name: &str) -> Value {
    s.kubectl_json(&["get", IN_TREE, name, "-o", "json"])
}

fn condition<'a>(m: &'a Value, type_: &str) -> &'a Value {
    m["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

fn is_true(m: &Value, type_: &str) -> bool {
    condition(m, type_)["status"] == "True"
}

/// Polls until the migration ended and the runner turned Running False.
fn wait_ended(s: &Server, name: &str) -> Value {
    eventually(&format!("{name} to end"), END, || {
        let m = get(s, name);
        ((is_true(&m, "Succeeded") || is_true(&m, "Failed")) && !is_true(&m, "Running")).then_some(m)
    })
}

/// (type, status, reason, message) of every condition, in order.
fn conditions(m: &Value) -> Vec<(String, String, String, String)> {
    let s = |c: &Value, f: &str| c[f].as_str().unwrap_or_default().to_string();
    let cs = m["status"]["conditions"].as_array().cloned().unwrap_or_default();
    cs.iter().map(|c| (s(c, "type"), s(c, "status"), s(c, "reason"), s(c, "message"))).collect()
}

fn c(t: &str, s: &str, r: &str, m: &str) -> (String, String, String, String) {
    (t.into(), s.into(), r.into(), m.into())
}

/// The runner's cleanup (migrationrunner_test.go "Cleanup admission updates SVM condition"): Running False,
/// `MigrationCompleted`, with the migration's generation.
fn assert_completed(m: &Value) {
    let running = condition(m, "Running");
    assert_eq!(
        (&running["status"], &running["reason"], &running["message"]),
        (&json!("False"), &json!("MigrationCompleted"), &json!("Migration completed")),
        "{m:#}"
    );
    assert_eq!(running["observedGeneration"], m["metadata"]["generation"], "{m:#}");
}

// ---------------------------------------------------------------------------------------------------------------
// The stand-in: a target with ShootStates behind the proxy, a CRD for them, a migrating server.

/// The stand-in's CRD of the ShootStates (storage version v1beta1, both versions stored) and the query strings of
/// its status writes.
struct Crd {
    object: Value,
    status_queries: Vec<String>,
}

impl Crd {
    fn new() -> Self {
        let object = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": SHOOTSTATES, "generation": 1, "resourceVersion": "10", "uid": "u-crd"},
            "spec": {"group": "core.gardener.cloud", "names": {"plural": "shootstates", "kind": "ShootState"},
                     "scope": "Namespaced",
                     "versions": [{"name": "v1alpha1", "served": true, "storage": false},
                                  {"name": "v1beta1", "served": true, "storage": true}]},
            "status": {"storedVersions": ["v1alpha1", "v1beta1"]},
        });
        Crd { object, status_queries: Vec::new() }
    }

    fn condition(&self) -> Value {
        let cs = self.object["status"]["conditions"].as_array().cloned().unwrap_or_default();
        cs.into_iter().find(|c| c["type"] == "StorageMigrating").unwrap_or(Value::Null)
    }

    fn serve(&mut self, r: &RequestInfo, body: &[u8]) -> Option<(u16, Value)> {
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", CRD_PATH) => Some((200, self.object.clone())),
            ("PUT", p) if p == format!("{CRD_PATH}/status") => {
                let sent: Value = serde_json::from_slice(body).ok()?;
                if sent["metadata"]["resourceVersion"] != self.object["metadata"]["resourceVersion"] {
                    return Some((409, json!({"kind": "Status", "code": 409, "reason": "Conflict"})));
                }
                self.status_queries.push(r.query.clone());
                self.object["status"] = sent["status"].clone();
                let rv: u64 = self.object["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
                self.object["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
                Some((200, self.object.clone()))
            }
            _ => None,
        }
    }
}

/// The discovery document of core.gardener.cloud/v1beta1 with the ShootStates' verbs replaced.
fn discovery_with_verbs(verbs: &[&str]) -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "core.gardener.cloud/v1beta1",
           "resources": [{"name": "shootstates", "singularName": "shootstate", "namespaced": true,
                          "kind": "ShootState", "verbs": verbs}]})
}

struct StandIn {
    _target: Server,
    proxy: Proxy,
    migrating: Server,
    crd: Arc<Mutex<Crd>>,
}

/// `n` ShootStates `garden/s-<i>` on the target; `local` answers further endpoints before the CRD's.
async fn stand_in(
    n: usize,
    extra: &[&str],
    mut local: impl FnMut(&RequestInfo) -> Option<(u16, Value)> + Send + 'static,
) -> StandIn {
    let target = target_with_shootstates(n).await;
    let proxy = Proxy::start(&target);
    let crd = Arc::new(Mutex::new(Crd::new()));
    let served = crd.clone();
    proxy.serve_locally(move |r, body| local(r).or_else(|| served.lock().unwrap().serve(r, body)));
    let mut args = vec!["--migration-qps", "0"];
    args.extend_from_slice(extra);
    let migrating = migrating_server(&proxy.kubeconfig(), &args);
    StandIn { _target: target, proxy, migrating, crd }
}

fn shootstate_index(r: &RequestInfo) -> Option<usize> {
    r.object()?.strip_prefix("garden/s-")?.parse().ok()
}

/// migrationrunner_test.go "Initial sync: CRD exists" and "Migration succeeded: Update CRD stored versions";
/// storageversionmigrator_test.go's successful run (merge patches named `storage-version-migrator-controller`,
/// Running's message `Y objects verified migrated` beside `Succeeded`); the runner's cleanup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_of_a_custom_resource_runs_as_the_ga_controllers_run_it() {
    let s = stand_in(12, &[], |_| None).await;
    create_in_tree(&s.migrating, "shootstates-1");
    let m = wait_ended(&s.migrating, "shootstates-1");
    assert_eq!(
        conditions(&m),
        [
            c("Running", "False", "MigrationCompleted", "Migration completed"),
            c("Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed"),
        ],
        "{m:#}\n{}",
        s.migrating.log()
    );
    assert_completed(&m);
    assert!(condition(&m, "Succeeded")["observedGeneration"].is_null(), "{m:#}");
    let rv = m["status"]["resourceVersion"].as_str().unwrap_or_default();
    assert!(rv.parse::<u64>().is_ok_and(|rv| rv > 0), "{m:#}");
    // The CRD: StorageMigrating True while it ran, then False with storedVersions trimmed; every write by the
    // runner's field manager.
    let crd = s.crd.lock().unwrap();
    let cond = crd.condition();
    assert_eq!(
        (&cond["status"], &cond["reason"], &cond["message"]),
        (
            &json!("False"),
            &json!("MigrationSucceeded"),
            &json!("The migration has succeeded and the stored versions have been updated")
        ),
        "{:#}",
        crd.object
    );
    assert_eq!(crd.object["status"]["storedVersions"], json!(["v1beta1"]));
    assert_eq!(crd.status_queries.len(), 2, "{:?}", crd.status_queries);
    assert!(
        crd.status_queries.iter().all(|q| q.split('&').any(|kv| kv == "fieldManager=migration-runner-controller")),
        "{:?}",
        crd.status_queries
    );
    // The objects: one merge patch each, named as upstream's, after the resourceVersion checkpoint (a LIST of one).
    let records = s.proxy.records();
    let patches: Vec<_> = records.iter().filter(|r| r.method == "PATCH" && r.path.contains("/shootstates/")).collect();
    assert_eq!(patches.len(), 12, "{patches:#?}");
    let by_migrator = |q: &str| q.split('&').any(|kv| kv == "fieldManager=storage-version-migrator-controller");
    assert!(patches.iter().all(|p| by_migrator(&p.query) && p.code == 200), "{patches:#?}");
    let first_list = records
        .iter()
        .position(|r| r.method == "GET" && r.query.contains("limit=1") && r.path.ends_with("/shootstates"));
    let first_patch = records.iter().position(|r| r.method == "PATCH");
    assert!(first_list < first_patch && first_list.is_some(), "{records:#?}");
}

/// storageversionmigrator_test.go's transient cases (429 with Retry-After, 500, 503): retried, never Failed; the
/// Running message carries the counts and `; transient error: ...` while they last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_and_never_fail_the_migration() {
    let failing = Arc::new(AtomicBool::new(true));
    let s = stand_in(6, &["--migration-max-attempts", "2"], |_| None).await;
    let (f, mut n) = (failing.clone(), 0u32);
    s.proxy.add_rule(move |r| {
        if !(r.is_patch() && shootstate_index(r) == Some(3) && f.load(Ordering::SeqCst)) {
            return None;
        }
        n += 1;
        let (code, retry_after) = [(429, Some(1)), (500, None), (503, None)][n as usize % 3];
        Some(Fault::Status { code, retry_after })
    });
    create_in_tree(&s.migrating, "shootstates-flaky");
    let retrying = eventually("the transient error in the Running message", END, || {
        let m = get(&s.migrating, "shootstates-flaky");
        assert!(!is_true(&m, "Failed"), "a transient error failed the migration: {m:#}");
        let message = condition(&m, "Running")["message"].as_str().unwrap_or_default().to_string();
        message.contains("; transient error: ").then_some(m)
    });
    let message = condition(&retrying, "Running")["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("The migration is running, "), "{message}");
    assert!(message.contains("/6 objects not yet migrated; transient error: "), "{message}");
    assert!(is_true(&retrying, "Running"), "{retrying:#}");
    failing.store(false, Ordering::SeqCst);
    let m = wait_ended(&s.migrating, "shootstates-flaky");
    assert!(is_true(&m, "Succeeded") && condition(&m, "Failed").is_null(), "{m:#}\n{}", s.migrating.log());
    assert_completed(&m);
}

/// storageversionmigrator_test.go: a patch answered 404 (deleted meanwhile) or 409 (changed meanwhile) is skipped
/// and counts as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_and_conflict_on_a_patch_are_skipped() {
    let s = stand_in(8, &[], |_| None).await;
    s.proxy.add_rule(|r| match (r.is_patch(), shootstate_index(r)) {
        (true, Some(2)) => Some(Fault::DeleteFirst),
        (true, Some(5)) => Some(Fault::TouchFirst),
        _ => None,
    });
    create_in_tree(&s.migrating, "shootstates-raced");
    let m = wait_ended(&s.migrating, "shootstates-raced");
    assert!(is_true(&m, "Succeeded"), "{m:#}\n{}", s.migrating.log());
    let codes: Vec<u16> = s.proxy.records().iter().filter(|r| r.method == "PATCH").map(|r| r.code).collect();
    assert_eq!(codes.iter().filter(|c| **c == 404).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 1, "{codes:?}");
    assert_completed(&m);
}

/// storageversionmigrator_test.go's unhandled error: one UpdateStatus with Running's counts and
/// `Failed` = `X/Y not yet migrated. migration encountered unhandled error: ...`; then the runner's cleanup and the
/// CRD's `MigrationFailed` (migrationrunner_test.go "Migration failed: CRD condition updated"; storedVersions stay
/// as they are here, where upstream resets them: see docs/reference/differences.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_write_fails_the_migration_with_its_counts() {
    let s = stand_in(5, &["--migration-chunk-size", "5"], |_| None).await;
    s.proxy.add_rule(|r| {
        (r.is_patch() && shootstate_index(r) == Some(4)).then_some(Fault::Status { code: 403, retry_after: None })
    });
    create_in_tree(&s.migrating, "shootstates-forbidden");
    let m = wait_ended(&s.migrating, "shootstates-forbidden");
    let failed = condition(&m, "Failed");
    assert_eq!(failed["reason"], "StorageVersionMigrationFailed", "{m:#}");
    let message = failed["message"].as_str().unwrap_or_default();
    let (counts, rest) = message.split_once(" not yet migrated. ").unwrap_or_else(|| panic!("{message}"));
    assert!(["1/5", "2/5", "3/5", "4/5", "5/5"].contains(&counts), "{message}");
    assert!(
        rest.starts_with(r#"migration encountered unhandled error: rewriting shootstates.core.gardener.cloud "garden/s-4": 403 Forbidden"#),
        "{message}"
    );
    assert_completed(&m);
    assert!(condition(&m, "Succeeded").is_null(), "{m:#}");
    let crd = s.crd.lock().unwrap();
    let cond = crd.condition();
    assert_eq!(
        (&cond["status"], &cond["reason"], &cond["message"]),
        (&json!("False"), &json!("MigrationFailed"), &json!("The migration has failed"))
    );
    assert_eq!(crd.object["status"]["storedVersions"], json!(["v1alpha1", "v1beta1"]));
}

/// resourceversion.go at GA: discovery must list update, patch and list for the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_without_the_needed_verbs_fails_at_the_checkpoint() {
    let s = stand_in(2, &[], |r| {
        (r.method == "GET" && r.path == "/apis/core.gardener.cloud/v1beta1")
            .then(|| (200, discovery_with_verbs(&["get", "list", "watch", "update"])))
    })
    .await;
    create_in_tree(&s.migrating, "shootstates-readonly");
    let m = wait_ended(&s.migrating, "shootstates-readonly");
    assert_eq!(
        condition(&m, "Failed")["message"],
        r#"resource "core.gardener.cloud/v1beta1, Resource=shootstates" does not support discovery operations: [update patch list]"#,
        "{m:#}"
    );
    assert_eq!(condition(&m, "Failed")["reason"], "StorageVersionMigrationFailed");
    assert_eq!(m["status"]["resourceVersion"].as_str().unwrap_or_default(), "", "{m:#}");
    assert_completed(&m);
    assert!(!s.proxy.records().iter().any(|r| r.method == "PATCH"), "nothing is written");
}

/// resourceversion.go at GA: the list resourceVersion must be one apimachinery can compare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_list_resource_version_fails_at_the_checkpoint() {
    let s = stand_in(2, &[], |r| {
        (r.is_list() && r.param("limit").as_deref() == Some("1") && r.path.ends_with("/shootstates")).then(|| {
            (
                200,
                json!({"kind": "ShootStateList", "apiVersion": "core.gardener.cloud/v1beta1",
                         "metadata": {"resourceVersion": "07"}, "items": []}),
            )
        })
    })
    .await;
    create_in_tree(&s.migrating, "shootstates-odd-rv");
    let m = wait_ended(&s.migrating, "shootstates-odd-rv");
    assert_eq!(
        condition(&m, "Failed")["message"],
        "latest resourceVersion for core.gardener.cloud/v1beta1, Resource=shootstates is not valid: resource version is not well formed: 07",
        "{m:#}"
    );
    assert_completed(&m);
}

// ---------------------------------------------------------------------------------------------------------------
// Standalone.

const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

fn encryption_config(keys: &[(&str, &str)]) -> String {
    let keys: String = keys.iter().map(|(n, s)| format!("      - name: {n}\n        secret: {s}\n")).collect();
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [{SHOOTSTATES}]\n  providers:\n  - aesgcm:\n      keys:\n{keys}"
    )
}

fn resource_versions(s: &Server) -> Vec<(String, String)> {
    let list = s.kubectl_json(&["get", SHOOTSTATES, "-A", "-o", "json"]);
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let pair = |o: &Value| {
        (
            o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            o["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string(),
        )
    };
    items.iter().map(pair).collect()
}

/// test/integration/storageversionmigrator: after a key change, a migration rewrites every object once (new
/// resourceVersions, every value under the new key); a second migration changes none. A watch sees the
/// conditions go as the GA controllers write them, the Running message counting down while it runs; and every
/// write is named by its controller in managedFields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_key_change_a_migration_rewrites_every_object_once_and_a_second_none() {
    use futures::StreamExt;
    let n = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("encryption.yaml");
    std::fs::write(&config, encryption_config(&[("key1", KEY1)])).expect("config");
    let config_flag = config.to_str().expect("utf-8").to_string();
    let mut s = Server::start(&["--disable-scheduler", "--encryption-provider-config", &config_flag]);
    s.kubectl_ok(&["create", "namespace", "garden"]);
    for i in 0..n {
        let o = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                       "metadata": {"name": format!("s-{i}"), "namespace": "garden"}, "spec": {}});
        s.kubectl_ok_stdin(&["create", "-f", "-"], &o.to_string());
    }
    std::fs::write(&config, encryption_config(&[("key2", KEY2), ("key1", KEY1)])).expect("config");
    // Slow enough (one object per chunk, 3 writes a second) that the progress message is seen while it runs.
    let slow = ["--migration-chunk-size", "1", "--migration-qps", "3", "--migration-burst", "1"];
    let mut args = vec!["--disable-trigger", "--encryption-provider-config", config_flag.as_str()];
    args.extend_from_slice(&slow);
    s.restart_with(&args);
    let before = resource_versions(&s);
    assert_eq!(before.len(), n);

    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        s.client().await,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("storagemigration.k8s.io", "v1", "StorageVersionMigration"),
            "storageversionmigrations",
        ),
    );
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let (watched, watch_api) = (seen.clone(), api.clone());
    let watch = tokio::spawn(async move {
        let params = kube::api::WatchParams::default().fields("metadata.name=rotate-1");
        let mut events = watch_api.watch(&params, "0").await.expect("watch").boxed();
        while let Some(Ok(kube::api::WatchEvent::Added(o) | kube::api::WatchEvent::Modified(o))) = events.next().await {
            let o = serde_json::to_value(o).expect("json");
            let done = o["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Running" && c["reason"] == "MigrationCompleted"));
            watched.lock().unwrap().push(o);
            if done {
                break;
            }
        }
    });
    let sc = &s;
    tokio::task::spawn_blocking({
        let manifest = in_tree_manifest("rotate-1");
        let kubeconfig = sc.kubeconfig();
        move || kubectl_with(&kubeconfig, &["create", "-f", "-"], Some(&manifest))
    })
    .await
    .expect("kubectl");
    tokio::time::timeout(END, watch).await.expect("the migration ends within the deadline").expect("watch");
    let seen = seen.lock().unwrap().clone();
    // Promotion first, without a resourceVersion; then the checkpoint; then the counts; then the end.
    let running_messages: Vec<String> = seen
        .iter()
        .filter(|o| !is_true(o, "Succeeded"))
        .map(|o| condition(o, "Running")["message"].as_str().unwrap_or_default().to_string())
        .collect();
    let promoted = seen.iter().find(|o| is_true(o, "Running")).expect("promoted");
    assert_eq!(conditions(promoted), [c("Running", "True", "MigrationRunning", "The migration is running")]);
    assert_eq!(promoted["status"]["resourceVersion"].as_str().unwrap_or_default(), "");
    assert!(
        running_messages
            .iter()
            .any(|m| m.starts_with("The migration is running, ")
                && m.ends_with(&format!("/{n} objects not yet migrated"))),
        "the counts while it ran: {running_messages:#?}"
    );
    let succeeded = seen.iter().find(|o| is_true(o, "Succeeded")).expect("Succeeded seen");
    assert_eq!(
        conditions(succeeded),
        [
            c(
                "Running",
                "True",
                "MigrationRunning",
                &format!("The migration is running, {n} objects verified migrated")
            ),
            c("Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed"),
        ]
    );
    let last = seen.last().expect("the end");
    assert_completed(last);

    // Every object rewritten once: new resourceVersions, every value under key2.
    let after = resource_versions(&s);
    assert_eq!(after.len(), n);
    for ((name, old), (_, new)) in before.iter().zip(&after) {
        assert_ne!(old, new, "{name} was not rewritten");
    }
    // The writers of the migration, by name.
    let m = s.kubectl_json(&["get", IN_TREE, "rotate-1", "-o", "json", "--show-managed-fields"]);
    let managers: std::collections::BTreeSet<&str> =
        m["metadata"]["managedFields"].as_array().into_iter().flatten().filter_map(|f| f["manager"].as_str()).collect();
    for expected in
        ["migration-runner-controller", "resource-version-controller", "storage-version-migrator-controller"]
    {
        assert!(managers.contains(expected), "{managers:?}: {m:#}");
    }
    assert!(!managers.contains("unknown"), "{managers:?}");

    // A second migration rewrites nothing: no resourceVersion moves.
    create_in_tree(&s, "rotate-2");
    let m2 = wait_ended(&s, "rotate-2");
    assert!(is_true(&m2, "Succeeded"), "{m2:#}");
    assert_eq!(resource_versions(&s), after, "a second migration changed objects");
    s.stop();
    let summary = s.storage_inspect(&["--summary", "--encryption-provider-config", &config_flag]);
    let rows: Vec<&Value> =
        summary["items"].as_array().into_iter().flatten().filter(|r| r["resource"] == SHOOTSTATES).collect();
    assert_eq!(rows.len(), 1, "{summary:#}");
    assert_eq!((&rows[0]["key"], &rows[0]["values"]), (&json!("key2"), &json!(n)), "{summary:#}");
}

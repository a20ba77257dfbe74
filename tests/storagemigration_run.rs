//! StorageVersionMigrations of the in-tree API (`storagemigration.k8s.io`, KEP-4192) run by our embedded migrator,
//! as users request them: kubectl, the Python `kubernetes` client and `migration-apiserver migrate --api`. A
//! standalone server holds ShootStates stored as v1alpha1 and is restarted storing v1beta1 (as in the README
//! walk-through, without the trigger, so that only the migrations asked for run); afterwards `storage inspect`
//! must show every object in the current storage version.

mod common;
use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

const SHOOTSTATES: &str = "shootstates.core.gardener.cloud";
const IN_TREE: &str = "storageversionmigrations.storagemigration.k8s.io";
const OURS: &str = "storageversionmigrations.migration.k8s.io";
const FINISH: Duration = Duration::from_secs(120);

fn storage_version(version: &str) -> String {
    format!("{SHOOTSTATES}={version}")
}

/// A server with `n` ShootStates written while `stored_as` was the storage version, restarted storing `current`
/// (trigger off): every stored object is stale. `extra` are further flags of the restarted server.
fn stale_server(n: usize, stored_as: &str, current: &str, extra: &[&str]) -> Server {
    let old = storage_version(stored_as);
    let mut s = Server::start(&["--disable-scheduler", "--storage-version", &old]);
    let items: Vec<Value> = (0..n)
        .map(|i| {
            serde_json::json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                "metadata": {"name": format!("s-{i:03}"), "namespace": format!("ns-{}", i % 3)},
                "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"n": i}}]}})
        })
        .collect();
    for ns in ["ns-0", "ns-1", "ns-2"] {
        s.kubectl_ok(&["create", "namespace", ns]);
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    s.kubectl_ok_stdin(&["create", "-f", "-"], &list.to_string());
    let new = storage_version(current);
    let mut args = vec!["--disable-trigger", "--storage-version", new.as_str()];
    args.extend_from_slice(extra);
    s.restart_with(&args);
    s
}

fn assert_all_stored_as(s: &mut Server, n: usize, api_version: &str) {
    let stored = s.stored_shootstate_versions();
    assert_eq!(stored.len(), n, "{stored:?}");
    let stale: Vec<_> = stored.iter().filter(|(_, v)| *v != api_version).collect();
    assert!(stale.is_empty(), "not stored as {api_version}: {stale:?}");
}

/// `kubectl create` of an in-tree migration of the ShootStates through `version`; its name.
fn create_in_tree(s: &Server, version: &str) -> String {
    let manifest = format!(
        "apiVersion: storagemigration.k8s.io/{version}\nkind: StorageVersionMigration\nmetadata:\n  generateName: \
         {SHOOTSTATES}-\nspec:\n  resource:\n    group: core.gardener.cloud\n    resource: shootstates\n"
    );
    let name = s.kubectl_ok_stdin(&["create", "-f", "-", "-o", "jsonpath={.metadata.name}"], &manifest);
    name.trim().to_string()
}

fn get(s: &Server, plural: &str, name: &str) -> Value {
    s.kubectl_json(&["get", plural, name, "-o", "json"])
}

fn condition<'a>(m: &'a Value, type_: &str) -> &'a Value {
    m["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

fn is_true(m: &Value, type_: &str) -> bool {
    condition(m, type_)["status"] == "True"
}

fn finished(m: &Value) -> bool {
    is_true(m, "Succeeded") || is_true(m, "Failed")
}

/// Polls a migration (by kubectl) until it has ended: Succeeded or Failed, and (the in-tree runner's last step)
/// Running no longer True.
fn wait_finished(s: &Server, plural: &str, name: &str) -> Value {
    let ended = |m: &Value| finished(m) && !is_true(m, "Running");
    eventually(&format!("{plural}/{name} to end"), FINISH, || Some(get(s, plural, name)).filter(ended))
}

/// What kube-controller-manager's GA controllers leave on a migration that Succeeded (kubernetes/kubernetes
/// pkg/controller/storageversionmigrator/migrationrunner_test.go "Cleanup admission updates SVM condition"):
/// Succeeded (`Migration completed`, no observedGeneration), Running turned False by the runner
/// (`MigrationCompleted`, observedGeneration the migration's generation), and `status.resourceVersion`.
fn assert_in_tree_succeeded(m: &Value, s: &Server) {
    assert!(is_true(m, "Succeeded"), "{m:#}\n{}", s.log());
    let succeeded = condition(m, "Succeeded");
    assert_eq!(succeeded["reason"], "StorageVersionMigrationSucceeded", "{m:#}");
    assert_eq!(succeeded["message"], "Migration completed", "{m:#}");
    assert!(succeeded["observedGeneration"].is_null(), "{m:#}");
    let running = condition(m, "Running");
    assert_eq!(running["status"], "False", "{m:#}");
    assert_eq!(running["reason"], "MigrationCompleted", "{m:#}");
    assert_eq!(running["message"], "Migration completed", "{m:#}");
    assert_eq!(running["observedGeneration"], m["metadata"]["generation"], "{m:#}");
    assert!(condition(m, "Failed").is_null(), "{m:#}");
    let rv = m["status"]["resourceVersion"].as_str().unwrap_or_default();
    assert!(rv.parse::<u64>().is_ok_and(|rv| rv > 0), "status.resourceVersion {rv:?}: {m:#}");
}

#[test]
fn v1_and_v1beta1_migrations_succeed_and_every_object_is_rewritten() {
    let n = 30;
    // Round 1: stored as v1alpha1, current v1beta1; a v1 migration created with kubectl.
    let mut s = stale_server(n, "v1alpha1", "v1beta1", &[]);
    let name = create_in_tree(&s, "v1");
    let m = wait_finished(&s, IN_TREE, &name);
    assert_in_tree_succeeded(&m, &s);
    assert_eq!(m["metadata"]["annotations"]["migration.k8s.io/migrated-objects"], n.to_string(), "{m:#}");
    // A v1beta1 read of the v1-created object.
    let beta = get(&s, "storageversionmigrations.v1beta1.storagemigration.k8s.io", &name);
    assert_eq!(beta["apiVersion"], "storagemigration.k8s.io/v1beta1");
    assert_eq!(beta["status"]["resourceVersion"], m["status"]["resourceVersion"]);
    assert_all_stored_as(&mut s, n, "core.gardener.cloud/v1beta1");

    // Round 2: the storage version goes back to v1alpha1; a v1beta1 migration created with the Python client.
    let current = storage_version("v1alpha1");
    s.restart_with(&["--disable-trigger", "--storage-version", &current]);
    let script = r#"
import json, sys, time
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
api = client.StoragemigrationV1beta1Api()
body = client.V1beta1StorageVersionMigration(
    metadata=client.V1ObjectMeta(generate_name="shootstates.core.gardener.cloud-"),
    spec=client.V1beta1StorageVersionMigrationSpec(
        resource=client.V1GroupResource(group="core.gardener.cloud", resource="shootstates")))
name = api.create_storage_version_migration(body).metadata.name
deadline = time.time() + 120
while True:
    m = api.read_storage_version_migration(name)
    done = [c for c in (m.status and m.status.conditions or []) if c.type in ("Succeeded", "Failed") and c.status == "True"]
    if done or time.time() > deadline:
        break
    time.sleep(0.2)
print(json.dumps({"name": name, "resourceVersion": m.status and m.status.resource_version,
    "conditions": [[c.type, c.status, c.reason] for c in (m.status and m.status.conditions or [])]}))
"#;
    let out = python(&["-c", script, &s.kubeconfig().display().to_string()]);
    let answer: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let conditions = answer["conditions"].as_array().cloned().unwrap_or_default();
    assert!(
        conditions.contains(&serde_json::json!(["Succeeded", "True", "StorageVersionMigrationSucceeded"])),
        "{answer}\n{}",
        s.log()
    );
    assert!(answer["resourceVersion"].as_str().is_some_and(|rv| !rv.is_empty()), "{answer}");
    let m = get(&s, IN_TREE, answer["name"].as_str().unwrap_or_default());
    assert_in_tree_succeeded(&m, &s);
    assert_all_stored_as(&mut s, n, "core.gardener.cloud/v1alpha1");
}

/// `--migration-qps` low enough that a migration of `n` objects takes a few seconds.
const SLOW: [&str; 6] = ["--migration-qps", "10", "--migration-burst", "1", "--migration-chunk-size", "5"];

#[test]
fn one_migration_per_resource_across_both_apis() {
    let n = 30;
    // Two migrations may run at once: only the one-per-resource rule keeps these two apart.
    let mut s = stale_server(n, "v1alpha1", "v1beta1", &[&SLOW[..], &["--migration-concurrency", "2"]].concat());
    let ours = request_shootstate_migration(&s);
    let in_tree = create_in_tree(&s, "v1");
    let mut ours_ended_at = None;
    let deadline = Instant::now() + FINISH;
    loop {
        // The in-tree one is read first: when ours reads unfinished afterwards, it was unfinished then too.
        let t = get(&s, IN_TREE, &in_tree);
        let o = get(&s, OURS, &ours);
        if !finished(&o) {
            assert!(condition(&t, "Running").is_null(), "started while {ours} runs: {t:#}");
            assert!(t["status"]["resourceVersion"].is_null(), "started while {ours} runs: {t:#}");
        } else if ours_ended_at.is_none() {
            assert!(is_true(&o, "Succeeded"), "{o:#}\n{}", s.log());
            ours_ended_at = Some(Instant::now());
        }
        if finished(&t) {
            assert_in_tree_succeeded(&t, &s);
            break;
        }
        assert!(Instant::now() < deadline, "not finished: {o:#}\n{t:#}\n{}", s.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ours_ended_at.is_some(), "the in-tree migration ended before ours was seen ending");
    assert_all_stored_as(&mut s, n, "core.gardener.cloud/v1beta1");
}

#[test]
fn kill9_during_an_in_tree_migration_resumes_to_success() {
    let n = 60;
    let mut s = stale_server(n, "v1alpha1", "v1beta1", &SLOW);
    let name = create_in_tree(&s, "v1");
    // A checkpoint was saved: some objects are migrated, most are not.
    let m = eventually("a saved checkpoint", FINISH, || {
        let m = get(&s, IN_TREE, &name);
        m["metadata"]["annotations"]["migration.k8s.io/continue-token"].is_string().then_some(m)
    });
    assert!(!finished(&m), "finished before the kill: {m:#}");
    let recorded = m["status"]["resourceVersion"].clone();
    s.kill9();
    let args: Vec<String> = s.extra_args.clone();
    s.restart_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let m = wait_finished(&s, IN_TREE, &name);
    assert_in_tree_succeeded(&m, &s);
    assert_eq!(m["status"]["resourceVersion"], recorded, "recorded once, at the start");
    assert_eq!(m["metadata"]["annotations"]["migration.k8s.io/migrated-objects"], n.to_string(), "{m:#}");
    assert!(s.log().contains("migration resumed"), "{}", s.log());
    assert_all_stored_as(&mut s, n, "core.gardener.cloud/v1beta1");
}

#[test]
fn migrate_api_storagemigration_waits_for_the_in_tree_migration() {
    let n = 20;
    let mut s = stale_server(n, "v1alpha1", "v1beta1", &[]);
    let out = Command::new(BIN)
        .args(["migrate", "--resource", SHOOTSTATES, "--api", "storagemigration.k8s.io/v1", "--wait", "--kubeconfig"])
        .arg(s.kubeconfig())
        .output()
        .expect("migrate");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", s.log());
    let name = stdout
        .trim()
        .strip_prefix("storageversionmigration.storagemigration.k8s.io/")
        .and_then(|l| l.strip_suffix(" created"))
        .unwrap_or_else(|| panic!("{stdout:?}"));
    assert!(stderr.contains(&format!("{name}: Succeeded: {n} objects")), "{stderr}");
    let m = get(&s, IN_TREE, name);
    assert_in_tree_succeeded(&m, &s);
    // Events regarding the in-tree migration, as for ours.
    let reasons = eventually("the migration's Events", Duration::from_secs(30), || {
        let events = s.kubectl_json(&["get", "events.events.k8s.io", "-A", "-o", "json"]);
        let reasons: Vec<String> = events["items"]
            .as_array()?
            .iter()
            .filter(|e| e["regarding"]["name"] == name && e["regarding"]["apiVersion"] == "storagemigration.k8s.io/v1")
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect();
        reasons.contains(&"MigrationSucceeded".to_string()).then_some(reasons)
    });
    assert!(reasons.contains(&"MigrationStarted".to_string()), "{reasons:?}");
    // An API it does not speak is refused before anything is created.
    let out = Command::new(BIN)
        .args(["migrate", "--resource", SHOOTSTATES, "--api", "storagemigration.k8s.io/v1alpha1", "--kubeconfig"])
        .arg(s.kubeconfig())
        .output()
        .expect("migrate");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported API"), "{out:?}");
    assert_all_stored_as(&mut s, n, "core.gardener.cloud/v1beta1");
}

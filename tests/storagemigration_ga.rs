//! `storagemigration.k8s.io` migrations as kube-controller-manager runs them at GA (Kubernetes 1.37), black-box
//! against the real binary. The cases are derived from upstream's own tests (kubernetes/kubernetes, each named at its
//! test): `pkg/controller/storageversionmigrator/migrationrunner_test.go` (promotion, the CRD's `StorageMigrating`
//! condition and storedVersions, the cleanup to Running=False), `storageversionmigrator_test.go` (no-op merge
//! patches), `resourceversion.go`'s checks (verbs) and `test/integration/storageversionmigrator/` (every Secret
//! rewritten once after a key change, a second migration rewriting none). The faults of the target (transient
//! errors, 404 and 409 on a patch, a refused write, a malformed list resourceVersion) are
//! tests/storagemigration_ga_faults.rs's.
//!
//! What runs against what:
//! - The migrator under test is a standalone migration-apiserver (`common::cluster_migrator`): it serves
//!   `storagemigration.k8s.io` itself, keeps the migrations in its own store, and migrates a real kube-apiserver
//!   (v1.37.2) through our fault proxy (`Proxy::in_front_of_cluster`), which here only forwards and records every
//!   request with its code.
//! - The cluster (etcd, kube-apiserver, kube-controller-manager; shared by the tests of this file) runs without this
//!   server and without its own `storagemigration.k8s.io` (kube-controller-manager's migrator off), so that ours is
//!   the only writer of the CRDs' `StorageMigrating` condition; its kube-apiserver reloads its encryption config
//!   every second.
//! - The objects are custom resources of real CRDs (`common::crs`: served in v1 and v2, created in v1, then stored in
//!   v2, so that every object is stale), Secrets for the key change, and for the verbs check kube-apiserver's own
//!   resources whose discovery lacks them (`componentstatuses`: get, list; `tokenreviews`: create).
//! - Standalone only: a migration-apiserver alone, rewriting its own embedded store after a key change of its own
//!   encryption config (a feature of ours, not a stand-in for kube-apiserver), its ShootStates the objects.

mod common;
#[path = "storagemigration_ga/support.rs"]
mod support;
use common::apiservers::sha256_label;
use common::cluster::Cluster;
use common::proxy::Record;
use common::secrets::{aesgcm_config, assert_secrets_intact, create_secrets, write_atomically, NAMESPACE};
use common::shootstates::SHOOTSTATES;
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use support::*;

/// migrationrunner_test.go "Initial sync: CRD exists" and "Migration succeeded: Update CRD stored versions";
/// storageversionmigrator_test.go's successful run (merge patches named `storage-version-migrator-controller`,
/// Running's message `Y objects verified migrated` beside `Succeeded`); the runner's cleanup. The real CRD ends
/// with `StorageMigrating` False and storedVersions trimmed to v2, and etcd holds every object in v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_of_a_custom_resource_runs_as_the_ga_controllers_run_it() {
    let (cr, t) = stale(cr("widgets", "Widget", "ga-widgets"), 12, &[]).await;
    let c = cluster();
    assert_eq!(cr.crd_json(c)["status"]["storedVersions"], json!(["v1", "v2"]), "kube-apiserver added v2");
    create_in_tree(&t.migrating, "widgets-1", GROUP, "widgets");
    let m = wait_ended(&t.migrating, "widgets-1");
    assert_eq!(
        conditions(&m),
        [
            cond("Running", "False", "MigrationCompleted", "Migration completed"),
            cond("Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed"),
        ],
        "{m:#}\n{}",
        t.migrating.log()
    );
    assert_completed(&m);
    assert!(condition(&m, "Succeeded")["observedGeneration"].is_null(), "{m:#}");
    let rv = m["status"]["resourceVersion"].as_str().unwrap_or_default();
    assert!(rv.parse::<u64>().is_ok_and(|rv| rv > 0), "{m:#}");

    // The CRD: StorageMigrating False at its generation, storedVersions trimmed; two status writes (True, then
    // False), both by the runner's field manager, which kube-apiserver records in managedFields.
    let crd = c.kubectl_json(&["get", "crd", &cr.name(), "-o", "json", "--show-managed-fields"]);
    let cond = crd_condition(&crd);
    assert_eq!(
        (&cond["status"], &cond["reason"], &cond["message"]),
        (
            &json!("False"),
            &json!("MigrationSucceeded"),
            &json!("The migration has succeeded and the stored versions have been updated")
        ),
        "{crd:#}"
    );
    assert_eq!(cond["observedGeneration"], crd["metadata"]["generation"], "{crd:#}");
    assert_eq!(crd["status"]["storedVersions"], json!(["v2"]), "{crd:#}");
    let records = t.proxy.records();
    let status_path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}/status", cr.name());
    let status_writes: Vec<&Record> = records.iter().filter(|r| r.method == "PUT" && r.path == status_path).collect();
    assert_eq!(status_writes.iter().filter(|r| r.code == 200).count(), 2, "{status_writes:#?}");
    assert!(status_writes.iter().all(|r| r.code == 200 || r.code == 409), "{status_writes:#?}");
    assert!(status_writes.iter().all(|r| by_manager(r, "migration-runner-controller")), "{status_writes:#?}");
    let managers: Vec<(&str, &str)> = crd["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| (f["manager"].as_str().unwrap_or_default(), f["subresource"].as_str().unwrap_or_default()))
        .collect();
    assert!(managers.contains(&("migration-runner-controller", "status")), "{managers:?}");

    // The objects: one merge patch each, named as upstream's, after the resourceVersion checkpoint (a LIST of one);
    // etcd then holds every one in v2.
    let patches = object_writes(&records, &cr);
    assert_eq!(patches.len(), 12, "{patches:#?}");
    assert!(
        patches
            .iter()
            .all(|p| p.method == "PATCH" && by_manager(p, "storage-version-migrator-controller") && p.code == 200),
        "{patches:#?}"
    );
    assert_eq!(patches.iter().map(|p| &p.path).collect::<BTreeSet<_>>().len(), 12, "one patch per object");
    let first_list =
        records.iter().position(|r| r.method == "GET" && r.query.contains("limit=1") && r.path == cr.path("v2"));
    let first_patch = records.iter().position(|r| r.method == "PATCH");
    assert!(first_list < first_patch && first_list.is_some(), "{records:#?}");
    assert_eq!(cr.stored_counts(c), BTreeMap::from([(format!("{GROUP}/v2"), 12)]));
}

/// resourceversion.go at GA: discovery must list update, patch and list for the resource. kube-apiserver's own
/// discovery has resources without them: `componentstatuses` (get and list: no update, no patch) and
/// `tokenreviews.authentication.k8s.io` (create only: no list either). Each migration fails at the checkpoint with
/// the controller's message naming the version discovery gave, and nothing of the resource is listed or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_without_the_needed_verbs_fails_at_the_checkpoint() {
    let c = cluster();
    let t = Real::new(c, &[]);
    // What the checks below rest on: the verbs of the real discovery documents.
    let discovered = [
        ("/api/v1", "componentstatuses", json!(["get", "list"])),
        ("/apis/authentication.k8s.io/v1", "tokenreviews", json!(["create"])),
    ];
    for (path, name, verbs) in discovered {
        let list: Value = serde_json::from_str(&c.kubectl_ok(&["get", "--raw", path])).expect("discovery");
        let resource = list["resources"].as_array().and_then(|rs| rs.iter().find(|r| r["name"] == name));
        assert_eq!(resource.map(|r| &r["verbs"]), Some(&verbs), "{path}: {list:#}");
    }
    let cases = [
        (
            "componentstatuses-1",
            "",
            "componentstatuses",
            r#"resource "/v1, Resource=componentstatuses" does not support discovery operations: [update patch list]"#,
        ),
        (
            "tokenreviews-1",
            "authentication.k8s.io",
            "tokenreviews",
            r#"resource "authentication.k8s.io/v1, Resource=tokenreviews" does not support discovery operations: [update patch list]"#,
        ),
    ];
    for (name, group, resource, _) in cases {
        create_in_tree(&t.migrating, name, group, resource);
    }
    for (name, _, resource, message) in cases {
        let m = wait_ended(&t.migrating, name);
        assert_eq!(condition(&m, "Failed")["message"], message, "{m:#}");
        assert_eq!(condition(&m, "Failed")["reason"], "StorageVersionMigrationFailed");
        assert_eq!(m["status"]["resourceVersion"].as_str().unwrap_or_default(), "", "{m:#}");
        assert!(condition(&m, "Succeeded").is_null(), "{m:#}");
        assert_completed(&m);
        let records = t.proxy.records();
        let touched: Vec<_> = records
            .iter()
            .filter(|r| r.path.ends_with(resource) || r.path.contains(&format!("/{resource}/")))
            .collect();
        assert!(touched.is_empty(), "nothing of {resource} is listed or written: {touched:#?}");
    }
    // The verbs came from the real discovery, through the proxy.
    let records = t.proxy.records();
    for path in ["/api/v1", "/apis/authentication.k8s.io/v1"] {
        assert!(records.iter().any(|r| r.method == "GET" && r.path == path && r.code == 200), "{records:#?}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// After a key change.

/// Watches the in-tree migration `name` on `s` (the watch established first), creates it from `manifest`, and
/// returns every version of it seen until the runner ended it.
async fn watch_while_created(s: &Server, name: &str, manifest: &str) -> Vec<Value> {
    use futures::StreamExt;
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        s.client().await,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("storagemigration.k8s.io", "v1", "StorageVersionMigration"),
            "storageversionmigrations",
        ),
    );
    let params = kube::api::WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = api.watch(&params, "0").await.expect("watch").boxed();
    let watch = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(Ok(kube::api::WatchEvent::Added(o) | kube::api::WatchEvent::Modified(o))) = events.next().await {
            let o = serde_json::to_value(o).expect("json");
            let done = o["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Running" && c["reason"] == "MigrationCompleted"));
            seen.push(o);
            if done {
                break;
            }
        }
        seen
    });
    let (kubeconfig, manifest) = (s.kubeconfig(), manifest.to_string());
    let out = tokio::task::spawn_blocking(move || kubectl_with(&kubeconfig, &["create", "-f", "-"], Some(&manifest)))
        .await
        .expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    tokio::time::timeout(END, watch).await.expect("the migration ends within the deadline").expect("watch")
}

/// The conditions as a watch saw them while a migration of `n` objects ran: promotion first, without a
/// resourceVersion; then the checkpoint; then the counts; then the end.
fn assert_ga_sequence(seen: &[Value], n: usize) {
    let running_messages: Vec<String> = seen
        .iter()
        .filter(|o| !is_true(o, "Succeeded"))
        .map(|o| condition(o, "Running")["message"].as_str().unwrap_or_default().to_string())
        .collect();
    let promoted = seen.iter().find(|o| is_true(o, "Running")).expect("promoted");
    assert_eq!(conditions(promoted), [cond("Running", "True", "MigrationRunning", "The migration is running")]);
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
            cond(
                "Running",
                "True",
                "MigrationRunning",
                &format!("The migration is running, {n} objects verified migrated")
            ),
            cond("Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed"),
        ]
    );
    assert_completed(seen.last().expect("the end"));
}

/// The writers of the migration `name`, by name in its managedFields.
fn assert_managers(s: &Server, name: &str) {
    let m = s.kubectl_json(&["get", IN_TREE, name, "-o", "json", "--show-managed-fields"]);
    let managers: BTreeSet<&str> =
        m["metadata"]["managedFields"].as_array().into_iter().flatten().filter_map(|f| f["manager"].as_str()).collect();
    for expected in
        ["migration-runner-controller", "resource-version-controller", "storage-version-migrator-controller"]
    {
        assert!(managers.contains(expected), "{managers:?}: {m:#}");
    }
    assert!(!managers.contains("unknown"), "{managers:?}");
}

/// Every Secret in etcd: key -> (how its value is encrypted, up to its key name, and etcd's version of the key:
/// 1 when created, +1 at each write).
fn stored_secrets(c: &Cluster) -> BTreeMap<String, (String, i64)> {
    use base64::Engine;
    let out = c.etcdctl(&["get", "--prefix", "/registry/secrets/", "-w", "json"]);
    let answer: Value = serde_json::from_slice(&out).expect("etcdctl -w json");
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or("")).expect("base64");
    let encryption = |value: &[u8]| match value.starts_with(b"k8s:enc:") {
        // k8s:enc:aesgcm:v1:<key name>:
        true => String::from_utf8_lossy(value).split(':').take(5).collect::<Vec<_>>().join(":"),
        false => "plaintext".to_string(),
    };
    let kvs = answer["kvs"].as_array().cloned().unwrap_or_default();
    kvs.iter()
        .map(|kv| {
            let key = String::from_utf8(b64(&kv["key"])).expect("key");
            (key, (encryption(&b64(&kv["value"])), kv["version"].as_i64().expect("version")))
        })
        .collect()
}

/// kube-apiserver's encryption config becomes `content`; returns once kube-apiserver reports it loaded.
fn roll_out(c: &Cluster, content: &str) {
    write_atomically(&c.dir.join("encryption-config.yaml"), content);
    let hash = sha256_label(content.as_bytes());
    let loaded = format!(r#",hash="{hash}"}} 1"#);
    eventually(&format!("kube-apiserver to load the encryption config {hash}"), END, || {
        let metrics = c.kubectl_ok(&["get", "--raw", "/metrics"]);
        metrics
            .lines()
            .any(|l| l.starts_with("apiserver_encryption_config_controller_last_config_info{") && l.ends_with(&loaded))
            .then_some(())
    });
}

/// The writes (PATCH or PUT) of Secrets in `records`: etcd's key of the Secret -> the codes of its writes.
fn secret_writes(records: &[Record]) -> BTreeMap<String, Vec<u16>> {
    let mut writes: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.method == "PATCH" || r.method == "PUT") {
        let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        if let ["api", "v1", "namespaces", ns, "secrets", name] = parts[..] {
            writes.entry(format!("/registry/secrets/{ns}/{name}")).or_default().push(r.code);
        }
    }
    writes
}

const KEY1: &[u8; 32] = b"key one of the GA migration test";
const KEY2: &[u8; 32] = b"key two of the GA migration test";
const SECRETS: usize = 10;
/// One object per chunk, 3 requests a second: slow enough that the progress message is seen while it runs.
const SLOW: &[&str] = &["--migration-chunk-size", "1", "--migration-qps", "3", "--migration-burst", "1"];

/// test/integration/storageversionmigrator on the real kube-apiserver: Secrets written under an aesgcm key, the key
/// changes (the new one first, the old one still read), and a `storagemigration.k8s.io/v1` migration of `secrets`
/// rewrites every Secret once: one merge patch each through the proxy, etcd's version of each key one more, every
/// value under the new key. A second migration patches each again, and kube-apiserver writes none (nothing was
/// stale). A watch sees the conditions go as the GA controllers write them, the Running message counting down
/// while it runs; and every write of the migration is named by its controller in managedFields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_key_change_a_migration_rewrites_every_object_once_and_a_second_none() {
    let c = cluster();
    roll_out(c, &aesgcm_config(&[("key1", KEY1)]));
    create_secrets(c, SECRETS);
    let before = stored_secrets(c);
    let ours = before.keys().filter(|k| k.starts_with(&format!("/registry/secrets/{NAMESPACE}/"))).count();
    assert_eq!(ours, SECRETS, "{before:#?}");
    assert!(before.values().all(|(e, v)| e == "k8s:enc:aesgcm:v1:key1" && *v == 1), "{before:#?}");
    roll_out(c, &aesgcm_config(&[("key2", KEY2), ("key1", KEY1)]));
    let t = Real::new(c, SLOW);

    let seen = watch_while_created(&t.migrating, "rotate-1", &in_tree_manifest("rotate-1", "", "secrets")).await;
    assert_ga_sequence(&seen, before.len());
    assert_managers(&t.migrating, "rotate-1");
    // Every Secret rewritten once, under key2.
    let writes = secret_writes(&t.proxy.records());
    let once: BTreeMap<String, Vec<u16>> = before.keys().map(|k| (k.clone(), vec![200])).collect();
    assert_eq!(writes, once, "one successful patch per Secret");
    let after = stored_secrets(c);
    let rewritten: BTreeMap<String, (String, i64)> =
        before.iter().map(|(k, (_, v))| (k.clone(), ("k8s:enc:aesgcm:v1:key2".to_string(), v + 1))).collect();
    assert_eq!(after, rewritten, "every Secret written once more, under key2");

    // A second migration (by a migrator without the rate limit) patches every Secret again; kube-apiserver writes
    // none of them.
    drop(t);
    let t = Real::new(c, &[]);
    create_in_tree(&t.migrating, "rotate-2", "", "secrets");
    let m2 = wait_ended(&t.migrating, "rotate-2");
    assert!(is_true(&m2, "Succeeded"), "{m2:#}");
    assert_eq!(secret_writes(&t.proxy.records()), once, "one successful patch per Secret");
    assert_eq!(stored_secrets(c), after, "a second migration changed Secrets in etcd");
    assert_secrets_intact(c, SECRETS);
}

// ---------------------------------------------------------------------------------------------------------------
// Standalone.

const OWN_KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const OWN_KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

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

/// The same on a standalone server's own store: after a key change of its own encryption config, an in-tree
/// migration of its ShootStates rewrites every one once (new resourceVersions, every value under the new key, as
/// `storage inspect` shows); a second migration changes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_key_change_of_its_own_store_a_standalone_server_rewrites_every_object_once() {
    let n = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("encryption.yaml");
    std::fs::write(&config, encryption_config(&[("key1", OWN_KEY1)])).expect("config");
    let config_flag = config.to_str().expect("utf-8").to_string();
    let mut s = Server::start(&["--disable-scheduler", "--encryption-provider-config", &config_flag]);
    s.kubectl_ok(&["create", "namespace", "garden"]);
    for i in 0..n {
        let o = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                       "metadata": {"name": format!("s-{i}"), "namespace": "garden"}, "spec": {}});
        s.kubectl_ok_stdin(&["create", "-f", "-"], &o.to_string());
    }
    std::fs::write(&config, encryption_config(&[("key2", OWN_KEY2), ("key1", OWN_KEY1)])).expect("config");
    let mut args = vec!["--disable-trigger", "--encryption-provider-config", config_flag.as_str()];
    args.extend_from_slice(SLOW);
    s.restart_with(&args);
    let before = resource_versions(&s);
    assert_eq!(before.len(), n);

    let manifest = in_tree_manifest("rotate-1", "core.gardener.cloud", "shootstates");
    let seen = watch_while_created(&s, "rotate-1", &manifest).await;
    assert_ga_sequence(&seen, n);
    assert_managers(&s, "rotate-1");

    // Every object rewritten once: new resourceVersions, every value under key2.
    let after = resource_versions(&s);
    assert_eq!(after.len(), n);
    for ((name, old), (_, new)) in before.iter().zip(&after) {
        assert_ne!(old, new, "{name} was not rewritten");
    }
    // A second migration rewrites nothing: no resourceVersion moves.
    create_in_tree(&s, "rotate-2", "core.gardener.cloud", "shootstates");
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

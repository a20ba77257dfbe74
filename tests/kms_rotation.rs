//! Re-encryption on a KMS key_id change (issue 39, part 2), against the real binary and the test KMS v2 plugin: a
//! new key_id from the plugin's Status is a new write key for the key-rotation trigger, which migrates the ShootStates
//! so that every value is rewritten under it (its resourceVersion changes once), shows it in the StorageState
//! (`kms:v2:p1:<key_id hash>`, Rotating, Finished, the counts), and leaves `storage inspect --summary` with the new
//! key_id only. Also: kill -9 during such a rotation loses nothing acknowledged, and with two replicas on etcd the
//! rotation starts only once both write with the new key_id.

mod common;
use common::etcd::Etcd;
use common::kms::*;
use common::shootstates::*;
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const NS: &str = "garden-kms-rot";
const DEADLINE: Duration = Duration::from_secs(90);
/// Quick rounds, and a migration slow enough that Rotating can be seen.
const FLAGS: &[&str] =
    &["--discovery-interval", "1s", "--key-rotation-interval", "1s", "--migration-qps", "10", "--migration-burst", "1"];

fn server(config: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--encryption-provider-config", config.to_str().expect("utf-8")];
    args.extend_from_slice(FLAGS);
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn state(s: &Server) -> Value {
    s.kubectl_json(&["get", "storagestate", SHOOTSTATES, "-o", "json"])
}

/// The StorageState's rotation once its write key is `key`.
fn rotation(s: &Server, key: &str) -> Option<String> {
    let st = state(s);
    (st["status"]["encryptionWriteKey"] == key)
        .then(|| st["status"]["encryptionKeyRotation"].as_str().map(String::from))?
}

fn wait_finished(s: &Server, key: &str) -> Value {
    eventually(&format!("ShootStates Finished under {key}"), DEADLINE, || {
        (rotation(s, key).as_deref() == Some("Finished")).then(|| state(s))
    })
}

/// Every ShootState of `NS`: name -> (resourceVersion, note).
fn shoots(s: &Server) -> BTreeMap<String, (String, String)> {
    let list = s.kubectl_json(&["get", "shootstates", "-n", NS, "-o", "json"]);
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .map(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let rv = o["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
            let note = o["spec"]["gardener"][0]["data"]["note"].as_str().unwrap_or_default().to_string();
            (name, (rv, note))
        })
        .collect()
}

fn created(n: usize, prefix: &str) -> Vec<Value> {
    (0..n)
        .map(|i| shootstate("v1beta1", NS, &format!("{prefix}{i}"), json!({"note": format!("note of {prefix}{i}")})))
        .collect()
}

/// `storage inspect --summary -o json` rows of ShootStates: (provider, key, key id hash, values).
fn summary(s: &Server) -> Vec<(String, String, String, u64)> {
    let v = s.storage_inspect(&["--summary"]);
    let rows = v["items"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .filter(|r| r["resource"] == SHOOTSTATES)
        .map(|r| {
            let f = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (f("provider"), f("key"), f("keyIdHash"), r["values"].as_u64().unwrap_or_default())
        })
        .collect()
}

fn keys_in_use(st: &Value) -> Vec<String> {
    serde_json::from_value(st["status"]["persistedEncryptionKeys"].clone()).unwrap_or_default()
}

#[test]
fn a_new_key_id_from_the_plugin_rotates_every_value_to_it() {
    let p = plugin("rotate");
    let (_dir, path) = config_file(&config_yaml(&kms_provider(&p.endpoint)));
    let mut s = server(&path, &[]);
    kubectl_create(&s, &created(20, "s"));
    let (k1, k2) = (p1_label("key-1"), p1_label("key-2"));
    let first = wait_finished(&s, &k1);
    assert_eq!(keys_in_use(&first), [k1.as_str()]);
    let before = shoots(&s);
    assert_eq!(before.len(), 20);

    // The KMS rotates its key: the next Status poll brings key-2, and the trigger migrates to it.
    assert_eq!(p.plugin.rotate(), "key-2");
    eventually("Rotating to key-2", DEADLINE, || (rotation(&s, &k2).as_deref() == Some("Rotating")).then_some(()));
    let rotating = state(&s);
    assert_eq!(keys_in_use(&rotating), [k1.as_str(), k2.as_str()], "both key_ids in use while rotating");
    let done = wait_finished(&s, &k2);
    assert_eq!(keys_in_use(&done), [k2.as_str()]);
    assert_eq!(done["status"]["encryptionKeyCounts"], json!([{"key": k2, "values": 20}]));
    let after = shoots(&s);
    for (name, (rv, note)) in &after {
        assert_eq!(note, &format!("note of {name}"));
        assert_ne!(rv, &before[name].0, "{name} was not rewritten");
    }
    let migrations = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", "-o", "json"]);
    let by_trigger = migrations["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["metadata"]["annotations"]["migration.k8s.io/reason"] == "encryption write key changed")
        .count();
    assert_eq!(by_trigger, 1, "one migration for the new key_id: {migrations}");

    // Once: a migration of values already under key-2 rewrites none of them.
    let name = request_shootstate_migration(&s);
    eventually("the migration by hand to succeed", DEADLINE, || {
        let m = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", &name, "-o", "json"]);
        let conditions = m["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.iter().any(|c| c["type"] == "Succeeded" && c["status"] == "True").then_some(())
    });
    assert_eq!(shoots(&s), after, "values under the current key_id are left alone");

    // Stopped, the store confirms it: only key-2 encrypts ShootStates; key-1 may be retired in the KMS.
    s.stop();
    assert_eq!(summary(&s), [("kms".into(), "p1".into(), key_id_hash("key-2"), 20)]);
}

#[test]
fn kill_9_during_a_kms_rotation_loses_nothing_and_ends_under_the_new_key_id() {
    let p = plugin("kill9");
    let (_dir, path) = config_file(&config_yaml(&kms_provider(&p.endpoint)));
    let mut s = server(&path, &[]);
    let n = 200;
    kubectl_create(&s, &created(n, "s"));
    let (k1, k2) = (p1_label("key-1"), p1_label("key-2"));
    wait_finished(&s, &k1);
    let before = shoots(&s);

    p.plugin.rotate();
    // Partway: some values rewritten under key-2 (10 per second), most not yet.
    eventually("the rotation partway", DEADLINE, || {
        let now = shoots(&s);
        let moved = now.iter().filter(|(name, (rv, _))| before.get(*name).is_some_and(|b| &b.0 != rv)).count();
        (moved >= 10).then_some(())
    });
    // Writes acknowledged during the rotation, then kill -9.
    let late = created(5, "late");
    let mut acknowledged = Vec::new();
    for o in &late {
        let out = s.kubectl_stdin(&["create", "-f", "-"], &o.to_string());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        acknowledged.push(o["metadata"]["name"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(rotation(&s, &k2).as_deref(), Some("Rotating"), "killed during the rotation");
    s.kill9();

    // Restarted (without the slow rate): the rotation goes on to its end.
    let fast: Vec<String> = [
        "--encryption-provider-config",
        path.to_str().expect("utf-8"),
        "--discovery-interval",
        "1s",
        "--key-rotation-interval",
        "1s",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    s.restart_with(&fast.iter().map(String::as_str).collect::<Vec<_>>());
    let done = wait_finished(&s, &k2);
    assert_eq!(keys_in_use(&done), [k2.as_str()]);
    let all = shoots(&s);
    assert_eq!(all.len(), n + acknowledged.len(), "every acknowledged object is there");
    for name in before.keys().chain(&acknowledged) {
        assert_eq!(all.get(name).map(|(_, note)| note.clone()), Some(format!("note of {name}")), "{name}");
    }
    s.stop();
    assert_eq!(summary(&s), [("kms".into(), "p1".into(), key_id_hash("key-2"), (n + acknowledged.len()) as u64)]);
}

/// With two replicas on one etcd, each with a plugin instance of the same KMS: the one whose plugin reports key-2
/// first writes with it (the other reads it: same KMS), but the rotation starts only once both do.
#[test]
fn with_two_replicas_the_rotation_waits_until_both_write_the_new_key_id() {
    let master = [7u8; 32];
    let (pa, pb) = (plugin_with("ha-a", Some(master)), plugin_with("ha-b", Some(master)));
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |name: &str, endpoint: &str| {
        let path = dir.path().join(name);
        write_config(&path, &config_yaml(&kms_provider(endpoint)));
        let mut args = vec!["--encryption-provider-config".to_string(), path.display().to_string()];
        args.extend(FLAGS.iter().map(|f| f.to_string()));
        Server::start_on_etcd(&etcd, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let a = start("a.yaml", &pa.endpoint);
    let b = start("b.yaml", &pb.endpoint);
    kubectl_create(&a, &created(10, "s"));
    let (k1, k2) = (p1_label("key-1"), p1_label("key-2"));
    wait_finished(&a, &k1);

    pa.plugin.rotate();
    // a writes key-2 now: a write through a, read through b.
    let o = shootstate("v1beta1", NS, "via-a", json!({"note": "note of via-a"}));
    a.kubectl_ok_stdin(&["create", "-f", "-"], &o.to_string());
    assert_eq!(shoots(&b)["via-a"].1, "note of via-a");
    // Three rounds of the leader with a on key-2 and b on key-1: nothing starts.
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        assert_eq!(state(&a)["status"]["encryptionWriteKey"], k1.as_str(), "rotation started before b writes key-2");
        std::thread::sleep(Duration::from_millis(300));
    }
    pb.plugin.rotate();
    let done = wait_finished(&b, &k2);
    assert_eq!(done["status"]["encryptionKeyCounts"], json!([{"key": k2, "values": 11}]));
    assert_eq!(shoots(&a).len(), 11);
    assert_eq!(shoots(&b).len(), 11);
}

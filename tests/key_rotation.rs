//! The key-rotation trigger against the real binary: a new write key (by restart, or by reload while serving)
//! migrates exactly the resources whose write key changed; a read-key-only or whitespace edit starts nothing; the
//! StorageState shows the rotation Rotating, then Finished with the counted keys; `storage inspect --summary`
//! shows every value under the new key afterwards.

mod common;
use common::shootstates::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const SB1: &str = "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";
const SB2: &str = "YGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn8=";

const NS: &str = "garden-rot";
const STORAGESTATES: &str = "storagestates.migration.k8s.io";
const REASON: &str = "encryption write key changed";
/// Quick rounds, and a migration slow enough (one object per chunk, 4 requests/s) that Rotating can be seen.
const FLAGS: &[&str] = &[
    "--discovery-interval",
    "1s",
    "--key-rotation-interval",
    "1s",
    "--migration-chunk-size",
    "1",
    "--migration-qps",
    "4",
    "--migration-burst",
    "1",
];

/// ShootStates written with the aesgcm keys `shoot_keys` (the first writes), StorageStates with the secretbox keys
/// `state_keys`.
fn config(shoot_keys: &[(&str, &str)], state_keys: &[(&str, &str)]) -> String {
    let keys = |ks: &[(&str, &str)]| -> String {
        ks.iter().map(|(n, s)| format!("      - name: {n}\n        secret: {s}\n")).collect()
    };
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [{SHOOTSTATES}]\n  providers:\n  - aesgcm:\n      keys:\n{}\
         - resources: [{STORAGESTATES}]\n  providers:\n  - secretbox:\n      keys:\n{}",
        keys(shoot_keys),
        keys(state_keys)
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the config");
}

fn state(s: &Server, name: &str) -> Value {
    s.kubectl_json(&["get", "storagestate", name, "-o", "json"])
}

/// The rotation field of a StorageState once its write key is `key`.
fn rotation(s: &Server, name: &str, key: &str) -> Option<String> {
    let st = state(s, name);
    (st["status"]["encryptionWriteKey"] == key)
        .then(|| st["status"]["encryptionKeyRotation"].as_str().map(String::from))?
}

fn wait_finished(s: &Server, name: &str, key: &str) -> Value {
    eventually(&format!("{name} Finished with {key}"), Duration::from_secs(60), || {
        (rotation(s, name, key).as_deref() == Some("Finished")).then(|| state(s, name))
    })
}

/// Waits until `name` shows Rotating to `key`, then Finished; returns the finished StorageState.
fn wait_rotating_then_finished(s: &Server, name: &str, key: &str) -> Value {
    eventually(&format!("{name} Rotating to {key}"), Duration::from_secs(60), || {
        (rotation(s, name, key).as_deref() == Some("Rotating")).then_some(())
    });
    wait_finished(s, name, key)
}

/// The migrations the key-rotation trigger requested, as `<resource>.<group>`.
fn rotation_migrations(s: &Server) -> Vec<String> {
    let list = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", "-o", "json"]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["metadata"]["annotations"]["migration.k8s.io/reason"] == REASON)
        .map(|m| {
            format!(
                "{}.{}",
                m["spec"]["resource"]["resource"].as_str().unwrap_or(""),
                m["spec"]["resource"]["group"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// `storage inspect --summary -o json` rows of `resource` as (provider, key, values).
fn summary(s: &Server, config: &Path, resource: &str) -> Vec<(String, String, u64)> {
    let v = s.storage_inspect(&["--summary", "--encryption-provider-config", config.to_str().expect("utf-8")]);
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["resource"] == resource)
        .map(|r| {
            let str_of = |f: &str| r[f].as_str().unwrap_or_default().to_string();
            (str_of("provider"), str_of("key"), r["values"].as_u64().unwrap_or_default())
        })
        .collect()
}

fn keys_in_use(st: &Value) -> Vec<String> {
    serde_json::from_value(st["status"]["persistedEncryptionKeys"].clone()).unwrap_or_default()
}

#[test]
fn a_new_write_key_at_restart_migrates_exactly_the_resources_whose_key_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("enc.yaml");
    write(&path, &config(&[("key1", KEY1)], &[("sb1", SB1)]));
    let cfg = path.to_str().expect("utf-8");
    let mut args = vec!["--encryption-provider-config", cfg];
    args.extend_from_slice(FLAGS);
    let mut s = Server::start(&args);
    kubectl_create(&s, &numbered_shootstates(NS, 5, |i| format!("s{i}")));
    // First sight: recorded and counted (maybe before the ShootStates were created), nothing migrated.
    let first = wait_finished(&s, SHOOTSTATES, "aesgcm:v1:key1");
    assert_eq!(keys_in_use(&first), ["aesgcm:v1:key1"]);
    wait_finished(&s, STORAGESTATES, "secretbox:v1:sb1");
    assert_eq!(rotation_migrations(&s), Vec::<String>::new());

    // key2 first for ShootStates; for StorageStates a read key added, and whitespace: only ShootStates migrate.
    write(&path, &(config(&[("key2", KEY2), ("key1", KEY1)], &[("sb1", SB1), ("sb2", SB2)]) + "\n\n"));
    s.restart();
    let done = wait_rotating_then_finished(&s, SHOOTSTATES, "aesgcm:v1:key2");
    assert_eq!(keys_in_use(&done), ["aesgcm:v1:key2"]);
    assert_eq!(done["status"]["encryptionKeyCounts"], json!([{"key": "aesgcm:v1:key2", "values": 5}]));
    assert_eq!(rotation_migrations(&s), [SHOOTSTATES]);
    let states = state(&s, STORAGESTATES);
    assert_eq!(states["status"]["encryptionWriteKey"], "secretbox:v1:sb1");
    assert_eq!(keys_in_use(&states), ["secretbox:v1:sb1"]);
    // The table shows the rotation.
    let table = s.kubectl_ok(&["get", "ss", SHOOTSTATES]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert!(header.windows(6).any(|w| w == ["WRITE", "KEY", "KEYS", "IN", "USE", "ROTATION"]), "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert!(row.windows(3).any(|w| w == ["aesgcm:v1:key2", "aesgcm:v1:key2", "Finished"]), "{table}");

    s.stop();
    assert_eq!(summary(&s, &path, SHOOTSTATES), [("aesgcm".to_string(), "key2".to_string(), 5)]);
    // Text output too.
    let out = std::process::Command::new(BIN)
        .args(["storage", "inspect", "--summary", "--data-dir"])
        .arg(s.data_dir())
        .output()
        .expect("inspect");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("RESOURCE"), "{text}");
    assert!(
        text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == [SHOOTSTATES, "aesgcm", "key2", "5"]),
        "{text}"
    );
}

/// Accepted automatic reloads so far (`apiserver_encryption_config_controller_automatic_reloads_total`, success).
fn reloads_accepted(s: &Server) -> u64 {
    let metrics = s.kubectl_ok(&["get", "--raw", "/metrics"]);
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_encryption_config_controller_automatic_reloads_total{"))
        .filter(|l| l.contains("status=\"success\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Rewrites the config while serving and waits until the reload is accepted.
fn reload(s: &Server, path: &Path, text: &str) {
    let before = reloads_accepted(s);
    write(path, text);
    eventually("the reload accepted", Duration::from_secs(30), || (reloads_accepted(s) > before).then_some(()));
}

#[test]
fn a_new_write_key_by_reload_migrates_and_other_edits_start_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("enc.yaml");
    let start = config(&[("key1", KEY1)], &[("sb1", SB1)]);
    write(&path, &start);
    let cfg = path.to_str().expect("utf-8");
    let mut args = vec!["--encryption-provider-config", cfg, "--encryption-provider-config-automatic-reload"];
    args.extend_from_slice(FLAGS);
    let mut s = Server::start(&args);
    kubectl_create(&s, &numbered_shootstates(NS, 5, |i| format!("s{i}")));
    wait_finished(&s, SHOOTSTATES, "aesgcm:v1:key1");
    wait_finished(&s, STORAGESTATES, "secretbox:v1:sb1");

    // Whitespace, then a read key added: the hash changes, no write key does.
    reload(&s, &path, &(start.clone() + "\n# rotation comes next\n"));
    reload(&s, &path, &config(&[("key1", KEY1), ("key2", KEY2)], &[("sb1", SB1)]));
    // key2 first: ShootStates rotate while serving.
    reload(&s, &path, &config(&[("key2", KEY2), ("key1", KEY1)], &[("sb1", SB1)]));
    let done = wait_rotating_then_finished(&s, SHOOTSTATES, "aesgcm:v1:key2");
    assert_eq!(keys_in_use(&done), ["aesgcm:v1:key2"]);
    assert_eq!(done["status"]["encryptionKeyCounts"], json!([{"key": "aesgcm:v1:key2", "values": 5}]));
    // Exactly one migration, of the resource whose write key changed: the earlier edits started none.
    assert_eq!(rotation_migrations(&s), [SHOOTSTATES]);
    assert_eq!(state(&s, STORAGESTATES)["status"]["encryptionKeyRotation"], "Finished");
    // The old key holds nothing: removing it is accepted.
    reload(&s, &path, &config(&[("key2", KEY2)], &[("sb1", SB1)]));
    s.kubectl_ok(&["get", "shootstate", "-n", NS, "s0"]);
    s.stop();
    assert_eq!(summary(&s, &path, SHOOTSTATES), [("aesgcm".to_string(), "key2".to_string(), 5)]);
}

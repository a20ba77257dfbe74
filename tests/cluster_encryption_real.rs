//! The cluster key-rotation trigger against the real kube-apiserver (v1.37.2, `scripts/cluster.sh`): an operator
//! rotates the encryption-at-rest key of Secrets as docs/guides/cluster-key-rotation.md says (the rule for Secrets
//! added to the ClusterRole, a copy of the EncryptionConfiguration given with `--cluster-encryption-provider-config`),
//! and this server finishes the rotation by itself: etcd ends up holding every Secret under the new key.
//! - aesgcm: key2 added second (nothing migrated), then moved first: every Secret is rewritten under key2; key1
//!   removed (nothing migrated);
//! - KMS v2 (this project's test plugin as kube-apiserver's plugin): the plugin's key_id changes (kube-apiserver is
//!   restarted rather than waited for: it asks its plugin's Status about once a minute) and every Secret is rewritten
//!   under the new key_id once the passive-migration margin (shortened by its flag) has passed, not before.
//!
//! Each test runs a cluster of its own (the trigger's record lives in its server's StorageStates).

mod common;
use base64::Engine;
use common::apiservers::sha256_label;
use common::cluster::{Cluster, Options};
use common::secrets::*;
use k8s_openapi::jiff::Timestamp;
use migration_apiserver::kms_test_plugin::TestKmsPlugin;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SECRETS: usize = 300;
const SECRETS_PREFIX: &str = "/registry/secrets/";
const LAST_CONFIG_INFO: &str = "apiserver_encryption_config_controller_last_config_info";
const KEY_ID_STATUS: &str = "apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds";
/// What the trigger's rounds and kube-apiserver's reloads (polled every second) may take.
const WAIT: Duration = Duration::from_secs(60);
/// A rewrite of every Secret, from kube-apiserver reporting the new key on.
const MIGRATION_WAIT: Duration = Duration::from_secs(120);

/// kube-apiserver's EncryptionConfiguration file.
fn apiserver_config(c: &Cluster) -> PathBuf {
    c.dir.join("encryption-config.yaml")
}

/// The operator's rollout of a new EncryptionConfiguration: the file kube-apiserver reads (which it reloads), then,
/// once kube-apiserver reports it loaded, the copy mounted into this server (the guide's steps 3 and 4: "in the file
/// on every control-plane node (and in the copy)"). Returns the hash kube-apiserver reports.
fn roll_out(c: &Cluster, copy: &Path, content: &str) -> String {
    write_atomically(&apiserver_config(c), content);
    let hash = sha256_label(content.as_bytes());
    poll(c, &format!("kube-apiserver to report the encryption config {hash}"), WAIT, || {
        loaded_config_hashes(&metrics(c)).contains(&hash).then_some(())
    });
    write_atomically(copy, content);
    hash
}

fn metrics(c: &Cluster) -> String {
    c.kubectl_ok(&["get", "--raw", "/metrics"])
}

/// The samples of `metric` in a Prometheus text exposition: (its labels as written, its value).
fn samples(text: &str, metric: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(metric)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once('}')?;
            Some((labels.to_string(), value.trim().to_string()))
        })
        .collect()
}

/// The `hash` labels of kube-apiserver's `..._last_config_info` samples with value 1.
fn loaded_config_hashes(text: &str) -> Vec<String> {
    samples(text, LAST_CONFIG_INFO)
        .into_iter()
        .filter(|(_, v)| v == "1")
        .filter_map(|(labels, _)| {
            labels.split(',').find_map(|l| l.strip_prefix("hash=\"")).map(|h| h.trim_end_matches('"').to_string())
        })
        .collect()
}

/// Every Secret in etcd: (key, raw value).
fn stored_secrets(c: &Cluster) -> Vec<(String, Vec<u8>)> {
    let out = c.etcdctl(&["get", "--prefix", SECRETS_PREFIX, "-w", "json"]);
    let v: Value = serde_json::from_slice(&out).expect("etcdctl JSON");
    let decode =
        |s: &Value| base64::engine::general_purpose::STANDARD.decode(s.as_str().unwrap_or("")).expect("base64");
    v["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter().map(|kv| (String::from_utf8(decode(&kv["key"])).expect("key"), decode(&kv["value"]))).collect()
        })
        .unwrap_or_default()
}

/// How a stored value is encrypted: the prefix up to the key name (`k8s:enc:aesgcm:v1:key1:`), or for a
/// KMS v2 value its provider and the key_id of its EncryptedObject (`k8s:enc:kms:v2:p1: key_id=kek-a`), or
/// `plaintext` for a value in the clear.
fn encryption_of(value: &[u8]) -> String {
    const KMS: &[u8] = b"k8s:enc:kms:v2:";
    if let Some(rest) = value.strip_prefix(KMS) {
        let Some(colon) = rest.iter().position(|b| *b == b':') else { return "kms:v2: (no provider name)".into() };
        let (name, object) = (&rest[..colon], &rest[colon + 1..]);
        let key_id = proto_string_field(object, 2).unwrap_or_else(|| "(undecodable)".into());
        return format!("k8s:enc:kms:v2:{}: key_id={key_id}", String::from_utf8_lossy(name));
    }
    if value.starts_with(b"k8s:enc:") {
        // k8s:enc:<provider>:v1:<key name>:
        let mut colons = value.iter().enumerate().filter(|(_, b)| **b == b':').map(|(i, _)| i);
        return match colons.nth(4) {
            Some(end) => String::from_utf8_lossy(&value[..=end]).into_owned(),
            None => "k8s:enc: (truncated)".into(),
        };
    }
    "plaintext".into()
}

/// One varint of a protobuf message: (value, the rest).
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, &bytes[i + 1..]));
        }
    }
    None
}

/// The string field `field` of a protobuf message (EncryptedObject's keyID is field 2: kmsv2/v2/api.proto).
fn proto_string_field(mut bytes: &[u8], field: u64) -> Option<String> {
    while !bytes.is_empty() {
        let (tag, rest) = varint(bytes)?;
        bytes = match tag & 7 {
            0 => varint(rest)?.1,
            1 => rest.get(8..)?,
            2 => {
                let (len, rest) = varint(rest)?;
                let len = usize::try_from(len).ok()?;
                let value = rest.get(..len)?;
                if tag >> 3 == field {
                    return String::from_utf8(value.to_vec()).ok();
                }
                &rest[len..]
            }
            5 => rest.get(4..)?,
            _ => return None,
        };
    }
    None
}

/// The stored Secrets (all of them, or only those of the test's namespace) whose encryption is not `want`, with
/// theirs; and how many were looked at.
fn not_under(c: &Cluster, want: &str, only_ours: bool) -> (Vec<(String, String)>, usize) {
    let ours = format!("{SECRETS_PREFIX}{NAMESPACE}/");
    let stored: Vec<_> = stored_secrets(c).into_iter().filter(|(k, _)| !only_ours || k.starts_with(&ours)).collect();
    let n = stored.len();
    let wrong = stored.into_iter().map(|(k, v)| (k, encryption_of(&v))).filter(|(_, e)| e != want).collect();
    (wrong, n)
}

/// Waits until every stored Secret is under `want` (and those of the namespace are all there).
fn wait_all_under(c: &Cluster, want: &str) {
    let mut last = Vec::new();
    let found = poll_or(MIGRATION_WAIT, || {
        let (wrong, _) = not_under(c, want, false);
        let (_, ours) = not_under(c, want, true);
        if wrong.is_empty() && ours == SECRETS {
            return Some(());
        }
        last = wrong;
        None
    });
    if found.is_none() {
        let shown: Vec<_> = last.iter().take(5).collect();
        panic!(
            "{} Secrets in etcd not under {want}, e.g. {shown:?}\nstoragestate: {}\nthe server's log (end):\n{}",
            last.len(),
            storage_state(c).map(|s| s.to_string()).unwrap_or_default(),
            tail(&c.log("migration-apiserver"), 40)
        );
    }
}

/// This server's migrations of Secrets.
fn migrations(c: &Cluster) -> Vec<Migration> {
    let list = c.kubectl_json(&[
        "get",
        "storageversionmigrations.migration.k8s.io",
        "-l",
        "migration.k8s.io/resource=secrets",
        "-o",
        "json",
    ]);
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|m| Migration {
            name: m["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            reason: annotation(m, "migration.k8s.io/reason"),
            created: m["metadata"]["creationTimestamp"].as_str().and_then(|t| t.parse().ok()).expect("created"),
        })
        .collect()
}

/// The Events this server recorded on the cluster about the StorageState `secrets` with `reason`: (note, series
/// count, 1 for a single Event).
fn events(c: &Cluster, reason: &str) -> Vec<(String, i64)> {
    let list = c.kubectl_json(&["get", "events.events.k8s.io", "-A", "-o", "json"]);
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| {
            e["reason"] == reason && e["regarding"]["kind"] == "StorageState" && e["regarding"]["name"] == "secrets"
        })
        .map(|e| (e["note"].as_str().unwrap_or_default().to_string(), e["series"]["count"].as_i64().unwrap_or(1)))
        .collect()
}

/// Waits until the rotation recorded on the StorageState is Done with the write key `key` (the status' name for
/// it); returns the StorageState.
fn rotation_done(c: &Cluster, key: &str) -> Value {
    poll(c, &format!("the rotation to {key} to be Done"), MIGRATION_WAIT, || {
        let s = storage_state(c)?;
        let rotation = annotation(&s, "migration.k8s.io/encryption-rotation");
        (rotation.starts_with("Done:")
            && rotation.contains(&format!("with {key};"))
            && s["status"]["encryptionWriteKey"] == key
            && s["status"]["encryptionKeyRotation"] == "Finished")
            .then_some(s)
    })
}

/// [`poll_or`], failing with the StorageState and the end of this server's log on time-out.
fn poll<T>(c: &Cluster, what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll_or(timeout, f).unwrap_or_else(|| {
        panic!(
            "timed out after {timeout:?} waiting for {what}\nstoragestate: {}\nthe server's log (end):\n{}",
            storage_state(c).map(|s| s.to_string()).unwrap_or_default(),
            tail(&c.log("migration-apiserver"), 40)
        )
    })
}

/// A cluster whose server runs the trigger with a copy of the config at `copy` (not there yet: the operator writes
/// it with the first config), a round at least every 2 s, and `extra` flags; the rule for Secrets granted.
fn cluster(copy: &Path, extra: &[&str]) -> Cluster {
    let mut server_args = vec![
        format!("--cluster-encryption-provider-config={}", copy.display()),
        "--cluster-key-rotation-interval=2s".to_string(),
    ];
    server_args.extend(extra.iter().map(|s| s.to_string()));
    let c = Cluster::up(Options { server_args, encryption_config_poll: Some("1s".into()), ..Default::default() });
    grant_secrets(&c);
    c
}

const KEY1: &[u8; 32] = b"key one of the aesgcm rotation!!";
const KEY2: &[u8; 32] = b"key two of the aesgcm rotation!!";

/// Waits until the trigger recorded the config hash `hash` on the StorageState; returns the StorageState.
fn recorded_hash(c: &Cluster, hash: &str) -> Value {
    poll(c, &format!("the trigger to record the config hash {hash}"), WAIT, || {
        let s = storage_state(c)?;
        (annotation(&s, "migration.k8s.io/encryption-config-hash") == hash).then_some(s)
    })
}

#[test]
fn an_aesgcm_key_rotation_rewrites_every_secret_under_the_new_key() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("encryption-config.yaml");
    let c = cluster(&copy, &[]);
    eprintln!("cluster up in {:?}", started.elapsed());

    // Encryption turned on with key1; the Secrets are written under it.
    let h1 = roll_out(&c, &copy, &aesgcm_config(&[("key1", KEY1)]));
    create_secrets(&c, SECRETS);
    let (wrong, n) = not_under(&c, "k8s:enc:aesgcm:v1:key1:", true);
    assert!(n == SECRETS && wrong.is_empty(), "{n} stored, not under key1: {wrong:?}");
    // The trigger's first sight of the write key rewrites every Secret once with it.
    let s = rotation_done(&c, "aesgcm:v1:key1");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h1, "{s}");
    wait_all_under(&c, "k8s:enc:aesgcm:v1:key1:");
    let before = migrations(&c);
    assert!(before.iter().any(|m| m.reason == "encryption key rotation: write key aesgcm:v1:key1 first observed"));
    eprintln!("key1 everywhere after {:?}", started.elapsed());

    // Step 3: key2 added second. A new hash, the same write key: nothing is migrated.
    let h2 = roll_out(&c, &copy, &aesgcm_config(&[("key1", KEY1), ("key2", KEY2)]));
    let s = recorded_hash(&c, &h2);
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-write-key"), "aesgcm:v1:key1", "{s}");
    assert_eq!(new_migrations(&before, migrations(&c)), [], "adding a read key migrates nothing");
    let (wrong, _) = not_under(&c, "k8s:enc:aesgcm:v1:key1:", false);
    assert!(wrong.is_empty(), "{wrong:?}");

    // Step 4: key2 first. The trigger migrates once kube-apiserver reports it: every Secret ends up under key2.
    let h3 = roll_out(&c, &copy, &aesgcm_config(&[("key2", KEY2), ("key1", KEY1)]));
    wait_all_under(&c, "k8s:enc:aesgcm:v1:key2:");
    eprintln!("key2 everywhere after {:?}", started.elapsed());
    let s = rotation_done(&c, "aesgcm:v1:key2");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h3, "{s}");
    assert_eq!(s["status"]["persistedEncryptionKeys"], json!(["aesgcm:v1:key2"]), "{s}");
    let rotated = new_migrations(&before, migrations(&c));
    assert_eq!(rotated.len(), 1, "{rotated:?}");
    assert_eq!(rotated[0].reason, "encryption key rotation: write key changed from aesgcm:v1:key1 to aesgcm:v1:key2");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-migration"), rotated[0].name, "{s}");
    // Its Event repeats the first sight's (the note is not part of an Event's identity, as in client-go): the one
    // Event EncryptionConfigChanged of the StorageState becomes a series of 2.
    poll(&c, "the EncryptionConfigChanged Event to count the rotation", WAIT, || {
        let noted = events(&c, "EncryptionConfigChanged");
        (noted.len() == 1 && noted[0].1 == 2).then_some(())
    });

    // Step 6: key1 removed. Nothing is migrated; every Secret still reads as it was written.
    let h4 = roll_out(&c, &copy, &aesgcm_config(&[("key2", KEY2)]));
    let s = recorded_hash(&c, &h4);
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-write-key"), "aesgcm:v1:key2", "{s}");
    assert_eq!(new_migrations(&before, migrations(&c)), rotated, "removing a read key migrates nothing");
    assert_secrets_intact(&c, SECRETS);
    eprintln!("done after {:?}", started.elapsed());
}

/// The KMS v2 plugin, on a runtime of its own that lives as long as it.
struct Plugin {
    plugin: TestKmsPlugin,
    endpoint: String,
    _runtime: tokio::runtime::Runtime,
}

fn kms_plugin(socket: &Path, key_id: &str) -> Plugin {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let endpoint = format!("unix://{}", socket.display());
    let plugin = runtime.block_on(async { TestKmsPlugin::start(&endpoint, key_id, None) }).expect("plugin");
    Plugin { plugin, endpoint, _runtime: runtime }
}

fn kms_config(endpoint: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - kms:\n          apiVersion: v2\n          name: p1\n          endpoint: {endpoint}\n          timeout: 3s\n      - identity: {{}}\n"
    )
}

/// The key_id hashes kube-apiserver's plugin reported in Status replies, per provider (`p1`).
fn status_key_id_hashes(text: &str) -> Vec<String> {
    samples(text, KEY_ID_STATUS)
        .into_iter()
        .filter(|(labels, _)| labels.contains("provider_name=\"p1\""))
        .filter_map(|(labels, _)| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix("key_id_hash=\""))
                .map(|h| h.trim_end_matches('"').to_string())
        })
        .collect()
}

/// The passive-migration margin the KMS test runs with (the default is 10m): long enough to see the rotation wait.
const MARGIN: Duration = Duration::from_secs(20);

#[test]
fn a_kms_v2_key_id_rotation_rewrites_every_secret_under_the_new_key_id() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("encryption-config.yaml");
    let plugin = kms_plugin(&dir.path().join("kms.sock"), "kek-a");
    let margin = format!("--cluster-kms-migration-margin={}s", MARGIN.as_secs());
    let c = cluster(&copy, &[&margin]);
    eprintln!("cluster up in {:?}", started.elapsed());

    roll_out(&c, &copy, &kms_config(&plugin.endpoint));
    create_secrets(&c, SECRETS);
    let (wrong, n) = not_under(&c, "k8s:enc:kms:v2:p1: key_id=kek-a", true);
    assert!(n == SECRETS && wrong.is_empty(), "{n} stored, not under kek-a: {wrong:?}");
    let (a, b) = (sha256_label(b"kek-a"), sha256_label(b"kek-b"));
    let (key_a, key_b) = (format!("kms:v2:p1:{a}"), format!("kms:v2:p1:{b}"));
    // The first sight of the write key rewrites every Secret with key_id kek-a; the key_id is recorded.
    let s = rotation_done(&c, &key_a);
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), json!({"p1": a}).to_string());
    wait_all_under(&c, "k8s:enc:kms:v2:p1: key_id=kek-a");
    let before = migrations(&c);
    assert!(before.iter().any(|m| m.reason == "encryption key rotation: write key kms:v2:p1 first observed"));
    eprintln!("kek-a everywhere after {:?}", started.elapsed());

    // The KMS rotates its key; kube-apiserver would ask within a minute, a restart asks at once.
    plugin.plugin.set_key_id("kek-b");
    c.restart("kube-apiserver");
    let reported = poll(&c, "the restarted kube-apiserver's plugin to report a key_id", WAIT, || {
        Some(status_key_id_hashes(&metrics(&c))).filter(|r| !r.is_empty())
    });
    assert_eq!(reported, std::slice::from_ref(&b), "the restarted kube-apiserver's plugin reports kek-b only");
    eprintln!("kube-apiserver restarted after {:?}", started.elapsed());

    // The trigger sees the new key_id and waits for the margin: the Secrets stay under kek-a meanwhile.
    let s = poll(&c, "the rotation to kek-b to wait for its margin", WAIT, || {
        let s = storage_state(&c)?;
        annotation(&s, "migration.k8s.io/encryption-rotation").starts_with("Waiting:").then_some(s)
    });
    let pending: Value =
        serde_json::from_str(&annotation(&s, "migration.k8s.io/encryption-kms-pending")).expect("pending JSON");
    assert_eq!(pending["p1"]["keyIDHash"], b, "{s}");
    let since: Timestamp = pending["p1"]["since"].as_str().and_then(|t| t.parse().ok()).expect("since");
    let observed = annotation(&s, "migration.k8s.io/encryption-kms-observed");
    assert!(observed.contains(&format!("(the passive-migration margin, {}s)", MARGIN.as_secs())), "{observed}");
    assert_eq!(s["status"]["encryptionWriteKey"], key_b, "{s}");
    assert_eq!(s["status"]["encryptionKeyRotation"], "Rotating", "{s}");
    assert_eq!(s["status"]["persistedEncryptionKeys"], json!([key_a, key_b]), "{s}");
    let (wrong, _) = not_under(&c, "k8s:enc:kms:v2:p1: key_id=kek-a", true);
    assert!(wrong.is_empty(), "rewritten before the margin: {wrong:?}");
    assert_eq!(new_migrations(&before, migrations(&c)), [], "no migration before the margin");

    // After the margin, one migration: every Secret ends up under kek-b.
    wait_all_under(&c, "k8s:enc:kms:v2:p1: key_id=kek-b");
    eprintln!("kek-b everywhere after {:?}", started.elapsed());
    let s = rotation_done(&c, &key_b);
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), json!({"p1": b}).to_string());
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-pending"), "", "{s}");
    assert_eq!(s["status"]["persistedEncryptionKeys"], json!([key_b]), "{s}");
    let rotated = new_migrations(&before, migrations(&c));
    assert_eq!(rotated.len(), 1, "{rotated:?}");
    let reason = format!("encryption key rotation: kms provider p1: key_id hash changed from {a} to {b}");
    assert!(rotated[0].reason.starts_with(&reason), "{rotated:?}");
    let noted =
        poll(&c, "the KMSKeyIDChanged Event", WAIT, || Some(events(&c, "KMSKeyIDChanged")).filter(|e| !e.is_empty()));
    let note = format!("{} requested: kms provider p1: key_id hash changed from {a} to {b}", rotated[0].name);
    assert!(noted.len() == 1 && noted[0].0.starts_with(&note), "{noted:?}");
    let margin_end = since.checked_add(MARGIN).expect("time");
    assert!(rotated[0].created >= margin_end, "{rotated:?} created before {margin_end}");
    assert_secrets_intact(&c, SECRETS);
    eprintln!("done after {:?}", started.elapsed());
}

//! The `kms` provider (apiVersion v2) against the real binary and the test KMS v2 plugin (run in this process over
//! an abstract unix socket): ShootStates created and read under KMS v2, stored as `k8s:enc:kms:v2:` (storage
//! inspect), one Encrypt per seed, the plugin down (cached reads go on, writes until the write expiry, then
//! upstream's error; health endpoints), upstream's metrics, and a reload swapped in only once its plugin is healthy.
//! The intervals are shortened with MIGRATION_APISERVER_KMS_TEST_TIMINGS (test-only).

mod common;
use common::kms::*;
use common::shootstates::*;
use common::*;
use serde_json::json;
use sha2::Digest;
use std::time::Duration;

const NS: &str = "garden-kms";
const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const DEADLINE: Duration = Duration::from_secs(30);

fn create(s: &Server, name: &str) -> std::process::Output {
    let o = shootstate("v1beta1", NS, name, json!({"note": format!("CANARY-{name}")}));
    s.kubectl_stdin(&["create", "-f", "-"], &o.to_string())
}

fn note(s: &Server, name: &str) -> String {
    s.kubectl_ok(&["get", "shootstate", "-n", NS, name, "-o", "jsonpath={.spec.gardener[0].data.note}"])
}

/// `kubectl get --raw <path>`: success and the body (stdout, or the error kubectl printed).
fn raw(s: &Server, path: &str) -> (bool, String) {
    let out = s.kubectl(&["get", "--raw", path]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The encryption label of each stored shootstate, from `storage inspect` (the server must be stopped).
fn stored_encodings(s: &Server) -> Vec<String> {
    let out = s.storage_inspect(&[]);
    let items = out["items"].as_array().cloned().unwrap_or_default();
    let prefix = format!("/registry/core.gardener.cloud/shootstates/{NS}/");
    let mut e: Vec<String> = items
        .iter()
        .filter(|i| i["key"].as_str().is_some_and(|k| k.starts_with(&prefix)))
        .filter_map(|i| i["encryption"].as_str().map(String::from))
        .collect();
    e.sort();
    e
}

#[test]
fn shootstates_under_kms_v2_and_the_plugin_down() {
    let p = plugin("down");
    let (_dir, path) = config_file(&config_yaml(&kms_provider(&p.endpoint)));
    let mut s = Server::start(&["--encryption-provider-config", &path.display().to_string()]);
    kubectl_create(&s, &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})]);
    for name in ["a", "b", "c"] {
        let out = create(&s, name);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(note(&s, name), format!("CANARY-{name}"));
    }
    assert_eq!(p.plugin.encrypt_calls(), 1, "one Encrypt for the seed, none per write");
    assert_eq!(raw(&s, "/healthz/kms-providers"), (true, "ok".into()));
    assert_eq!(raw(&s, "/readyz/kms-providers"), (true, "ok".into()));

    // upstream's metrics: names, HELP, labels, the key_id hashed.
    let (_, metrics) = raw(&s, "/metrics");
    let key_id_hash = key_id_hash("key-1");
    assert!(
        metrics.contains("# HELP apiserver_envelope_encryption_key_id_hash_total [ALPHA] Number of times a keyID is used split by transformation type, provider, and apiserver identity."),
        "{metrics}"
    );
    let to_storage = metrics
        .lines()
        .find(|l| l.starts_with("apiserver_envelope_encryption_key_id_hash_total{") && l.contains("to_storage"))
        .unwrap_or_else(|| panic!("no to_storage series: {metrics}"));
    assert!(
        to_storage.contains(&format!("key_id_hash=\"{key_id_hash}\"")) && to_storage.contains("provider_name=\"p1\""),
        "{to_storage}"
    );
    assert!(metrics.contains("apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds{"), "{metrics}");
    let one_encrypt = "apiserver_envelope_encryption_kms_operations_latency_seconds_count{grpc_status_code=\"OK\",\
                       method_name=\"/v2.KeyManagementService/Encrypt\",provider_name=\"p1\"} 1";
    assert!(metrics.lines().any(|l| l == one_encrypt), "{metrics}");
    assert!(metrics.contains("transformer_prefix=\"k8s:enc:kms:v2:p1:\""), "{metrics}");

    // Down: reads of cached seeds go on, writes too until the write expiry, then upstream's error.
    p.plugin.set_down(true);
    let down_at = std::time::Instant::now();
    assert_eq!(note(&s, "a"), "CANARY-a");
    let failed = eventually("writes to stop", DEADLINE, || {
        let out = create(&s, &format!("late-{}", down_at.elapsed().as_millis()));
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    });
    assert!(down_at.elapsed() >= Duration::from_secs(2), "writes stopped before the expiry");
    assert!(failed.contains("encryptedDEKSource with keyID hash") && failed.contains(&key_id_hash), "{failed}");
    assert!(failed.contains("expired at") && failed.contains("(current time is"), "{failed}");
    assert_eq!(note(&s, "b"), "CANARY-b", "cached reads go on after the expiry");
    let (ok, body) = raw(&s, "/healthz/kms-providers");
    assert!(!ok && body.contains("kms-provider-0: ") && body.contains("code = Unavailable"), "{body}");
    let (ok, body) = raw(&s, "/readyz");
    assert!(!ok && body.contains("kms-providers"), "{body}");
    assert_eq!(raw(&s, "/livez"), (true, "ok".into()), "not on /livez");

    // Back with the same key_id: writes again, without a new Encrypt.
    let encrypts = p.plugin.encrypt_calls();
    p.plugin.set_down(false);
    eventually("writes again", DEADLINE, || create(&s, "after").status.success().then_some(()));
    eventually("healthy again", DEADLINE, || raw(&s, "/healthz").0.then_some(()));
    assert_eq!(p.plugin.encrypt_calls(), encrypts);

    s.stop();
    let encodings = stored_encodings(&s);
    assert!(!encodings.is_empty() && encodings.iter().all(|e| e == "kms:v2:p1"), "{encodings:?}");
    let data = std::fs::read(s.data_dir().join("data.redb")).unwrap_or_default();
    assert!(!data.windows(8).any(|w| w == b"CANARY-a"), "plaintext on disk");
    // With the config, inspect asks the plugin for the seed and reads every value.
    let config = path.display().to_string();
    let out = s.storage_inspect(&["--encryption-provider-config", &config]);
    let items: Vec<&serde_json::Value> =
        out["items"].as_array().expect("items").iter().filter(|i| i["encryption"] == "kms:v2:p1").collect();
    assert!(!items.is_empty());
    for i in items {
        assert!(i.get("error").is_none() && i["stale"] == false, "{i}");
        assert_eq!(i["apiVersion"], "core.gardener.cloud/v1beta1", "{i}");
    }

    // A restart: a new seed; the old values' seed is decrypted once by the plugin.
    let decrypts = p.plugin.decrypt_calls();
    s.restart();
    for name in ["a", "b", "c", "after"] {
        assert_eq!(note(&s, name), format!("CANARY-{name}"));
    }
    assert_eq!(p.plugin.decrypt_calls(), decrypts + 1);
    the_metrics_table_is_what_is_served(&raw(&s, "/metrics").1);
}

/// docs/operations/metrics.md's KMS v2 table lists the families served, with their types (the invalid key_id
/// counter has no series until a plugin reports an invalid key_id, so it is not served here).
fn the_metrics_table_is_what_is_served(metrics: &str) {
    let doc = std::fs::read_to_string(repo().join("docs/operations/metrics.md")).expect("metrics.md");
    let table = doc.split("<!-- kms-metrics -->").nth(1).and_then(|t| t.split("<!-- /kms-metrics -->").next());
    let listed: std::collections::BTreeSet<(String, String)> = table
        .expect("the <!-- kms-metrics --> table")
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(2)?.to_string()))
        })
        .filter(|(n, _)| n != "apiserver_envelope_encryption_invalid_key_id_from_status_total")
        .collect();
    let served: std::collections::BTreeSet<(String, String)> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| {
            ["apiserver_envelope_encryption_", "apiserver_storage_transformation_", "apiserver_storage_envelope_"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(listed, served, "docs/operations/metrics.md's KMS v2 table and /metrics differ");
}

#[test]
fn a_reloaded_config_with_kms_is_swapped_in_only_once_its_plugin_is_healthy() {
    let p = plugin("reload");
    p.plugin.set_down(true);
    let aesgcm = format!("  - aesgcm:\n      keys:\n      - name: key1\n        secret: {KEY1}\n");
    let (_dir, path) = config_file(&config_yaml(&aesgcm));
    let file = path.display().to_string();
    let mut s =
        Server::start(&["--encryption-provider-config", &file, "--encryption-provider-config-automatic-reload"]);
    kubectl_create(&s, &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})]);
    assert!(create(&s, "before").status.success());
    let with_kms = config_yaml(&format!("{}{aesgcm}", kms_provider(&p.endpoint)));
    write_config(&path, &with_kms);
    // Refused while the plugin is down (the check is given at least 10 s), the aesgcm config stays in use.
    eventually("the refused reload", DEADLINE, || {
        s.log().contains("the KMS v2 providers of the new encryption provider config are not healthy").then_some(())
    });
    assert!(create(&s, "while-refused").status.success());
    p.plugin.set_down(false);
    let hash = format!("k8s:enc:unstable:1:{:x}", sha2::Sha256::digest(with_kms.as_bytes()));
    eventually("the reload", Duration::from_secs(60), || raw(&s, "/metrics").1.contains(&hash).then_some(()));
    assert!(create(&s, "after").status.success());
    assert_eq!(note(&s, "before"), "CANARY-before");
    s.stop();
    let encodings = stored_encodings(&s);
    assert_eq!(
        encodings,
        vec!["aesgcm:v1:key1", "aesgcm:v1:key1", "kms:v2:p1"],
        "before, while-refused: aesgcm; after: kms"
    );
}

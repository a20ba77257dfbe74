//! `--encryption-provider-config-automatic-reload` against the real binary: the file rewritten while serving (new
//! writes use the new first key, old values still read), a malformed file and a file that drops a key still in use
//! (both keep the config in use, are counted and logged, and the server keeps serving), a restart with such a file
//! (refused unless --allow-unreadable-encrypted-values), and kube-apiserver's metrics with their names, labels, HELP
//! and hashes, the expected hashes computed here from the file's bytes and the logged identity.

mod common;
use common::shootstates::*;
use common::*;
use serde_json::json;
use sha2::Digest;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const NS: &str = "garden-reload";
const RELOADS: &str = "apiserver_encryption_config_controller_automatic_reloads_total";
const LAST_RELOAD: &str = "apiserver_encryption_config_controller_automatic_reload_last_timestamp_seconds";
const CONFIG_INFO: &str = "apiserver_encryption_config_controller_last_config_info";
const RELOAD_DEADLINE: Duration = Duration::from_secs(20);

/// An EncryptionConfiguration for shootstates with aesgcm `keys`, the first writing.
fn config(keys: &[(&str, &str)]) -> String {
    let mut s = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
                 [\"shootstates.core.gardener.cloud\"]\n  providers:\n  - aesgcm:\n      keys:\n"
        .to_string();
    for (name, secret) in keys {
        s += &format!("      - name: {name}\n        secret: {secret}\n");
    }
    s
}

/// Replaces the file at once (write, then rename), as a Secret mount or an editor does: never half-written.
fn replace(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// kube-apiserver's `hash` label: `k8s:enc:unstable:1:` and the hex SHA-256 of the file's bytes.
fn file_hash(content: &str) -> String {
    format!("k8s:enc:unstable:1:{:x}", sha2::Sha256::digest(content.as_bytes()))
}

fn create(s: &Server, name: &str) {
    kubectl_create(s, &[shootstate("v1beta1", NS, name, json!({"note": format!("CANARY-{name}")}))]);
}

fn note(s: &Server, name: &str) -> String {
    s.kubectl_ok(&["get", "shootstate", "-n", NS, name, "-o", "jsonpath={.spec.gardener[0].data.note}"])
}

fn metrics(s: &Server) -> String {
    s.kubectl_ok(&["get", "--raw", "/metrics"])
}

/// The value of the sample of `family` whose labels are exactly `labels` (sorted by name, as exposed).
fn sample(text: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let prefix = format!("{family}{{{}}} ", labels.join(","));
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
}

/// The samples of `family`, label sets included.
fn samples<'a>(text: &'a str, family: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} "))).collect()
}

/// The identity the server logged, and upstream's `apiserver_id_hash` of it, computed here.
fn id_hash(s: &Server) -> String {
    let log = s.log();
    let line = log.lines().find(|l| l.contains("encryption provider config: automatic reload")).expect("logged");
    let identity = line.split("identity=").nth(1).and_then(|r| r.split_whitespace().next()).expect("identity");
    format!("sha256:{:x}", sha2::Sha256::digest(identity.trim_matches('"').as_bytes()))
}

/// The keys of the stored shootstates by name, from `storage inspect` (the server must be stopped).
fn keys_by_name(s: &Server) -> Vec<(String, String)> {
    let out = s.storage_inspect(&[]);
    let items = out["items"].as_array().cloned().unwrap_or_default();
    let prefix = format!("/registry/core.gardener.cloud/shootstates/{NS}/");
    let mut keys: Vec<(String, String)> = items
        .iter()
        .filter_map(|i| {
            let name = i["key"].as_str()?.strip_prefix(&prefix)?.to_string();
            Some((name, i["encryption"].as_str()?.to_string()))
        })
        .collect();
    keys.sort();
    keys
}

#[test]
fn the_config_reloads_while_serving_and_a_bad_one_keeps_the_old() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("encryption.yaml");
    let v1 = config(&[("key1", KEY1)]);
    replace(&path, &v1);
    let file = path.display().to_string();
    let mut s =
        Server::start(&["--encryption-provider-config", &file, "--encryption-provider-config-automatic-reload"]);
    let id = id_hash(&s);
    create(&s, "a");
    create(&s, "b");
    // At start: the config in use, no reload yet.
    let text = metrics(&s);
    assert_eq!(sample(&text, CONFIG_INFO, &[("apiserver_id_hash", &id), ("hash", &file_hash(&v1))]), Some(1.0));
    assert!(samples(&text, RELOADS).is_empty(), "{text}");

    // key2 first: reloaded while serving; new writes use key2, old values still read.
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let v2 = config(&[("key2", KEY2), ("key1", KEY1)]);
    replace(&path, &v2);
    let text = eventually("the reload of key2", RELOAD_DEADLINE, || {
        let text = metrics(&s);
        (sample(&text, RELOADS, &[("apiserver_id_hash", &id), ("status", "success")]) == Some(1.0)).then_some(text)
    });
    assert_eq!(
        samples(&text, CONFIG_INFO),
        [format!("{CONFIG_INFO}{{apiserver_id_hash=\"{id}\",hash=\"{}\"}} 1", file_hash(&v2))]
    );
    let at = sample(&text, LAST_RELOAD, &[("apiserver_id_hash", &id), ("status", "success")]).expect("timestamp");
    assert!(at >= started.floor() && at < started + 60.0, "{at} vs {started}");
    for help in [
        format!("# HELP {RELOADS} [ALPHA] Total number of reload successes and failures of encryption configuration split by apiserver identity.\n# TYPE {RELOADS} counter\n"),
        format!("# HELP {LAST_RELOAD} [ALPHA] Timestamp of the last successful or failed automatic reload of encryption configuration split by apiserver identity.\n# TYPE {LAST_RELOAD} gauge\n"),
        format!("# HELP {CONFIG_INFO} [ALPHA] Information about the last applied encryption configuration with hash as label, split by apiserver identity.\n# TYPE {CONFIG_INFO} gauge\n"),
    ] {
        assert!(text.contains(&help), "{help}\nnot in\n{text}");
    }
    create(&s, "c");
    assert_eq!((note(&s, "a"), note(&s, "c")), ("CANARY-a".to_string(), "CANARY-c".to_string()));

    // A malformed file: counted, logged, the config in use stays, the server serves.
    replace(&path, "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources: [oops\n");
    eventually("the malformed file's failure", RELOAD_DEADLINE, || {
        let text = metrics(&s);
        sample(&text, RELOADS, &[("apiserver_id_hash", &id), ("status", "failure")])
    });
    assert!(s.log().contains("encryption provider config not reloaded"), "{}", s.log());
    create(&s, "d");
    assert_eq!(note(&s, "b"), "CANARY-b");
    let text = metrics(&s);
    assert_eq!(sample(&text, CONFIG_INFO, &[("apiserver_id_hash", &id), ("hash", &file_hash(&v2))]), Some(1.0));

    // key1 dropped while a and b use it: refused, naming the key and the count; key2 still writes, key1 reads.
    let failures = |s: &Server| sample(&metrics(s), RELOADS, &[("apiserver_id_hash", &id), ("status", "failure")]);
    let before = failures(&s).unwrap_or_default();
    let only2 = config(&[("key2", KEY2)]);
    replace(&path, &only2);
    let refusal = r#"key "aesgcm:v1:key1" still encrypts 2 stored values of shootstates.core.gardener.cloud"#;
    eventually("the refusal", RELOAD_DEADLINE, || (failures(&s)? > before && s.log().contains(refusal)).then_some(()));
    create(&s, "e");
    assert_eq!(note(&s, "a"), "CANARY-a");
    let text = metrics(&s);
    assert_eq!(sample(&text, CONFIG_INFO, &[("apiserver_id_hash", &id), ("hash", &file_hash(&v2))]), Some(1.0));
    assert_eq!(sample(&text, RELOADS, &[("apiserver_id_hash", &id), ("status", "success")]), Some(1.0));

    s.stop();
    let key1 = "aesgcm:v1:key1".to_string();
    let key2 = "aesgcm:v1:key2".to_string();
    let want: Vec<(String, String)> = [("a", &key1), ("b", &key1), ("c", &key2), ("d", &key2), ("e", &key2)]
        .iter()
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect();
    assert_eq!(keys_by_name(&s), want);

    // A restart with that file: refused with the same message and a non-zero exit, before anything is served.
    let out = Command::new(BIN)
        .args(["serve", "--secure-port", &s.port.to_string(), "--disable-scheduler", "--data-dir"])
        .arg(s.data_dir())
        .arg("--cert-dir")
        .arg(s.cert_dir())
        .args(["--encryption-provider-config", &file])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(stderr.contains(refusal) && stderr.contains("--allow-unreadable-encrypted-values"), "{stderr}");
    // With the flag it starts; the values under key1 cannot be read, the others can.
    s.restart_with(&["--encryption-provider-config", &file, "--allow-unreadable-encrypted-values"]);
    assert_eq!(note(&s, "c"), "CANARY-c");
    assert!(!s.kubectl(&["get", "shootstate", "-n", NS, "a"]).status.success());
}

/// The table of the encryption config's metrics in docs/operations/metrics.md is what `/metrics` serves with an encryption config:
/// the same families, types and label names.
#[test]
fn the_readme_lists_the_encryption_config_metrics_served() {
    use std::collections::BTreeSet;
    let readme = std::fs::read_to_string(repo().join("docs/operations/metrics.md")).expect("metrics.md");
    let table = readme
        .split("<!-- encryption-metrics -->")
        .nth(1)
        .and_then(|t| t.split("<!-- /encryption-metrics -->").next())
        .expect("docs/operations/metrics.md table between <!-- encryption-metrics --> markers");
    let listed: BTreeSet<(String, String, String)> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let labels: Vec<&str> = cells[3].split(',').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[2].to_string(), labels.join(","))
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("encryption.yaml");
    replace(&path, &config(&[("key1", KEY1)]));
    let file = path.display().to_string();
    let s = Server::start(&["--encryption-provider-config", &file, "--encryption-provider-config-automatic-reload"]);
    replace(&path, &config(&[("key2", KEY2), ("key1", KEY1)]));
    let text = eventually("the reload", RELOAD_DEADLINE, || {
        let text = metrics(&s);
        text.contains(&format!("{LAST_RELOAD}{{")).then_some(text)
    });
    let mut served = BTreeSet::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE apiserver_encryption_config_controller_")) {
        let mut parts = line.split_whitespace();
        let family = format!("apiserver_encryption_config_controller_{}", parts.next().unwrap_or_default());
        let kind = parts.next().unwrap_or_default().to_string();
        let first = samples(&text, &family).first().map(|l| l.to_string()).unwrap_or_default();
        let labels: Vec<String> = first
            .split_once('{')
            .map(|(_, r)| r.split('}').next().unwrap_or_default())
            .unwrap_or_default()
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
            .collect();
        served.insert((family, kind, labels.join(",")));
    }
    assert_eq!(listed, served, "docs/operations/metrics.md's encryption metrics table and /metrics differ:\n{text}");
}

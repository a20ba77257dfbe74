//! The cluster key-rotation trigger (cluster mode) against the kube-apiserver stand-in (`common::apiservers`,
//! served by the proxy in front of a target server), for what real kube-apiservers cannot show on demand. The
//! rotation with a copy of the config, a lagging apiserver waited for and one whose Lease disappears no longer, is
//! tests/cluster_encryption_real.rs's and tests/cluster_encryption_ha.rs's, against real kube-apiservers. Here: a
//! round runs when the set of live apiservers (their watched Leases) or the copy changes, and every interval, not
//! when a Lease is only renewed; without a copy every new shared hash migrates; a KMS v2 provider's new key_id (the
//! config unchanged) is migrated once every one of three live apiservers' plugins reports it and the
//! passive-migration margin has passed.

mod common;
use common::apiservers::{config_hash_label, sha256_label, Apiservers};
use common::proxy::Proxy;
use common::shootstates::*;
use common::*;

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const RESOURCE: &str = SHOOTSTATES;
const IDS: [&str; 3] = [
    "apiserver-5qyo3ypfpdaxslhy6l4rbsbwbq",
    "apiserver-7s4ngdmbnesdnnj2i5o5i4wuqe",
    "apiserver-zr4d5pqkx6oxegxbgkqkbwsbfq",
];
const KEY1: &str = "dGhpcyBpcyBhIDMyIGJ5dGUgdGVzdCBrZXkgISEhISE=";
const KEY2: &str = "YW5vdGhlciAzMiBieXRlIHRlc3Qga2V5ICEhISEhISE=";
const WAIT: Duration = Duration::from_secs(60);

/// An EncryptionConfiguration covering Secrets and ShootStates with these aescbc keys, in this order.
fn config(keys: &[(&str, &str)]) -> String {
    let keys: String =
        keys.iter().map(|(n, s)| format!("            - name: {n}\n              secret: {s}\n")).collect();
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources:\n      - secrets\n      - {RESOURCE}\n    providers:\n      - aescbc:\n          keys:\n{keys}      - identity: {{}}\n"
    )
}

/// Writes the copy and returns its hash as kube-apiserver reports it.
fn write_copy(path: &Path, text: &str) -> String {
    std::fs::write(path, text).expect("write copy");
    config_hash_label(text.as_bytes())
}

/// A target with a few ShootStates behind the proxy serving the apiservers, and a migrating server with `extra`.
async fn setup(apiservers: &Apiservers, extra: &[&str]) -> (Server, Proxy, Server) {
    setup_every(apiservers, "300ms", extra).await
}

/// [`setup`] with the rounds requeued every `interval`.
async fn setup_every(apiservers: &Apiservers, interval: &str, extra: &[&str]) -> (Server, Proxy, Server) {
    let target = target_with_shootstates(5).await;
    let proxy = Proxy::start(&target);
    apiservers.install(&proxy);
    let mut args =
        vec!["--migration-qps", "0", "--encrypted-resources", RESOURCE, "--cluster-key-rotation-interval", interval];
    args.extend_from_slice(extra);
    let m = migrating_server(&proxy.kubeconfig(), &args);
    (target, proxy, m)
}

fn annotation(state: &Value, key: &str) -> String {
    state["metadata"]["annotations"][key].as_str().unwrap_or_default().to_string()
}

fn storage_state(m: &Server) -> Option<Value> {
    let out = m.kubectl(&["get", "storagestates", RESOURCE, "-o", "json"]);
    serde_json::from_slice(&out.stdout).ok()
}

/// Waits until the StorageState's observation satisfies `f`; returns the StorageState.
fn observed(m: &Server, what: &str, f: impl Fn(&str) -> bool) -> Value {
    eventually(what, WAIT, || {
        let s = storage_state(m)?;
        f(&annotation(&s, "migration.k8s.io/encryption-observed")).then_some(s)
    })
}

/// The migrations of the resource, oldest first: (name, reason, Succeeded).
fn migrations(m: &Server) -> Vec<(String, String, bool)> {
    let list = m.kubectl_json(&["get", "svm", "-l", &format!("migration.k8s.io/resource={RESOURCE}"), "-o", "json"]);
    let mut out: Vec<(String, String, String, bool)> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| {
            let done = s["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Succeeded" && c["status"] == "True"));
            (
                annotation(s, "migration.k8s.io/requested-at"),
                s["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                annotation(s, "migration.k8s.io/reason"),
                done,
            )
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, n, r, d)| (n, r, d)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_copy_every_new_shared_hash_migrates_the_encrypted_resources() {
    let apiservers = Apiservers::new(&IDS, "sha256:aaaa");
    let (_t, _p, m) = setup(&apiservers, &["--cluster-key-rotation"]).await;
    eventually("the first migration", WAIT, || (migrations(&m).len() == 1).then_some(()));
    observed(&m, "the hash recorded", |o| o == "all 3 live kube-apiservers report sha256:aaaa");
    apiservers.load(IDS[0], "sha256:bbbb");
    apiservers.load(IDS[1], "sha256:bbbb");
    observed(&m, "the apiservers to disagree", |o| {
        o.contains("sha256:bbbb (") && o.contains(&format!("sha256:aaaa ({})", IDS[2]))
    });
    assert_eq!(migrations(&m).len(), 1);
    apiservers.load(IDS[2], "sha256:bbbb");
    let all = eventually("the second migration", WAIT, || {
        let all = migrations(&m);
        (all.len() == 2).then_some(all)
    });
    assert_eq!(all[1].1, "encryption key rotation: encryption config sha256:bbbb loaded by all 3 kube-apiservers");
    let s = observed(&m, "agreement", |o| o == "all 3 live kube-apiservers report sha256:bbbb");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), "sha256:bbbb");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-write-key"), "", "no write key without a copy");
    assert!(s["status"]["encryptionWriteKey"].is_null(), "{s:#}");
}

/// With a requeue far beyond the test, only the inputs make a round: a change of the set of live apiservers (seen
/// through the Lease watch, a deletion included) and of the copy's content. Renewals change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_are_woken_by_the_live_apiservers_and_the_copy_not_by_renewals() {
    let dir = tempfile::tempdir().expect("dir");
    let copy = dir.path().join("encryption-config.yaml");
    let h1 = write_copy(&copy, &config(&[("key1", KEY1)]));
    let apiservers = Apiservers::new(&IDS, &h1);
    let copy_arg = copy.to_str().expect("path");
    let (_t, _p, m) = setup_every(&apiservers, "1h", &["--cluster-encryption-provider-config", copy_arg]).await;
    observed(&m, "the first round", |o| {
        o == format!("all 3 live kube-apiservers report {h1}, the mounted copy's hash")
    });
    assert!(apiservers.lease_watches() > 0, "the Leases are watched");
    let scrapes = apiservers.scrapes();

    // Renewals, then a Lease deleted: one round, of the two that are left (two scrapes reach both, round robin).
    for id in IDS {
        apiservers.renew(id);
    }
    apiservers.remove(IDS[2]);
    observed(&m, "the round for the deleted Lease", |o| {
        o == format!("all 2 live kube-apiservers report {h1}, the mounted copy's hash")
    });
    assert_eq!(apiservers.scrapes(), scrapes + 2, "one round of two scrapes, none for the renewals");

    // Loading a new file shows only in /metrics (no round); the copy's change, after it, makes one.
    let text = config(&[("key1", KEY1), ("key2", KEY2)]);
    let h2 = config_hash_label(text.as_bytes());
    apiservers.load(IDS[0], &h2);
    apiservers.load(IDS[1], &h2);
    write_copy(&copy, &text);
    observed(&m, "the round for the new copy", |o| {
        o == format!("all 2 live kube-apiservers report {h2}, the mounted copy's hash")
    });
}

/// An EncryptionConfiguration whose first provider for the ShootStates is the KMS v2 provider `vault`.
fn kms_config() -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources:\n      - {RESOURCE}\n    providers:\n      - kms:\n          apiVersion: v2\n          name: vault\n          endpoint: unix:///var/run/kms/vault.sock\n          timeout: 3s\n      - identity: {{}}\n"
    )
}

/// The recorded key_ids annotation of a resource the provider `vault` writes.
fn vault_key_id(key_id_hash: &str) -> String {
    format!(r#"{{"vault":"{key_id_hash}"}}"#)
}

/// Waits until the StorageState's KMS observation satisfies `f`; returns the StorageState.
fn kms_observed(m: &Server, what: &str, f: impl Fn(&str) -> bool) -> Value {
    eventually(what, WAIT, || {
        let s = storage_state(m)?;
        f(&annotation(&s, "migration.k8s.io/encryption-kms-observed")).then_some(s)
    })
}

/// When the migration `name` was requested.
fn requested_at(m: &Server, name: &str) -> Timestamp {
    let svm = m.kubectl_json(&["get", "svm", name, "-o", "json"]);
    annotation(&svm, "migration.k8s.io/requested-at").parse().expect("RFC 3339")
}

/// Waits until the status says `rotation` with exactly `keys` in use; returns the StorageState.
fn key_fields(m: &Server, rotation: &str, keys: &[&str]) -> Value {
    eventually(&format!("the status {rotation} with {keys:?}"), WAIT, || {
        let s = storage_state(m)?;
        (s["status"]["encryptionKeyRotation"] == rotation && s["status"]["persistedEncryptionKeys"] == json!(keys))
            .then_some(s)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kms_key_id_rotation_waits_for_every_live_apiserver_and_the_margin() {
    let dir = tempfile::tempdir().expect("dir");
    let copy = dir.path().join("encryption-config.yaml");
    let h1 = write_copy(&copy, &kms_config());
    let apiservers = Apiservers::new(&IDS, &h1);
    for id in IDS {
        apiservers.report_key_id(id, "vault", "key-1");
    }
    let (k1, k2, k3) = (sha256_label(b"key-1"), sha256_label(b"key-2"), sha256_label(b"key-3"));
    let (write1, write2) = (format!("kms:v2:vault:{k1}"), format!("kms:v2:vault:{k2}"));
    let copy_arg = copy.to_str().expect("path");
    let margin = std::time::Duration::from_secs(4);
    let args = ["--cluster-encryption-provider-config", copy_arg, "--cluster-key-rotation-scrapes", "12"];
    let (_t, _p, m) = setup(&apiservers, &[&args[..], &["--cluster-kms-migration-margin", "4s"]].concat()).await;

    // First sight: the write key's migration rewrites everything; the key_id is recorded with it, not migrated.
    let s = kms_observed(&m, "the key_id recorded", |o| o.ends_with("first observed") || o.ends_with(&k1));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), vault_key_id(&k1));
    key_fields(&m, "Finished", &[&write1]);
    let first = migrations(&m);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].1, "encryption key rotation: write key kms:v2:vault first observed");

    // The KMS rotates: the plugins report key-2 one apiserver after the other. The laggards are named; nothing starts.
    for (i, id) in IDS.iter().enumerate() {
        apiservers.report_key_id(id, "vault", "key-2");
        if i + 1 < IDS.len() {
            let moved = format!("{k2} ({})", IDS[..=i].join(", "));
            let s = kms_observed(&m, "the apiservers to disagree on the key_id", |o| o.contains(&moved));
            let o = annotation(&s, "migration.k8s.io/encryption-kms-observed");
            assert!(o.contains(&format!("the recorded {k1} ({})", IDS[i + 1..].join(", "))), "{o}");
            let r = annotation(&s, "migration.k8s.io/encryption-rotation");
            assert!(
                r.starts_with("Waiting: the live kube-apiservers report different key_ids of kms provider vault"),
                "{r}"
            );
            key_fields(&m, "Rotating", &[&write1, &write2]);
            assert_eq!(migrations(&m).len(), 1);
            assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-pending"), "");
        }
    }

    // All three: the margin, said on the StorageState, then one migration.
    let s = kms_observed(&m, "the margin", |o| o.contains("waiting until"));
    let pending: Value =
        serde_json::from_str(&annotation(&s, "migration.k8s.io/encryption-kms-pending")).expect("json");
    assert_eq!(pending["vault"]["keyIDHash"], k2);
    let since: Timestamp = pending["vault"]["since"].as_str().expect("since").parse().expect("RFC 3339");
    let o = annotation(&s, "migration.k8s.io/encryption-kms-observed");
    assert!(o.contains("the passive-migration margin, 4s"), "{o}");
    assert!(annotation(&s, "migration.k8s.io/encryption-rotation").contains("the migration starts after"));
    let all = eventually("the key_id migration", WAIT, || {
        let all = migrations(&m);
        (all.len() == 2).then_some(all)
    });
    assert_eq!(
        all[1].1,
        format!(
            "encryption key rotation: kms provider vault: key_id hash changed from {k1} to {k2}, reported by all 3 \
             kube-apiservers since {since}"
        )
    );
    let started = requested_at(&m, &all[1].0);
    assert!(started.as_millisecond() >= since.as_millisecond() + margin.as_millis() as i64, "{started} {since}");
    let s = eventually("the key_id rotation done", WAIT, || {
        let s = storage_state(&m)?;
        let r = annotation(&s, "migration.k8s.io/encryption-rotation");
        (r.starts_with(&format!("Done: {}", all[1].0))).then_some(s)
    });
    let r = annotation(&s, "migration.k8s.io/encryption-rotation");
    assert!(r.contains(&write2) && r.contains("may be retired in the KMS"), "{r}");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), vault_key_id(&k2));
    key_fields(&m, "Finished", &[&write2]);

    // key-3 on two of them: the third lags; it is named, key-2 stays recorded, nothing pending, no migration.
    apiservers.report_key_id(IDS[0], "vault", "key-3");
    apiservers.report_key_id(IDS[1], "vault", "key-3");
    // The old series persist in every /metrics: a refreshed key-2 Status on the laggard keeps it on key-2.
    apiservers.report_key_id(IDS[2], "vault", "key-2");
    kms_observed(&m, "the laggard named", |o| o.contains(&format!("the recorded {k2} ({})", IDS[2])));
    let scrapes = apiservers.scrapes();
    eventually("several more rounds", WAIT, || (apiservers.scrapes() > scrapes + 2 * 12).then_some(()));
    let s = storage_state(&m).expect("storagestate");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), vault_key_id(&k2));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-pending"), "");
    assert_eq!(migrations(&m).len(), 2);

    // Its Lease disappears: the two others decide, after the margin.
    apiservers.remove(IDS[2]);
    kms_observed(&m, "the two remaining apiservers to agree", |o| {
        o.starts_with(&format!("kms provider vault: all 2 live kube-apiservers report key_id hash {k3} since"))
    });
    let all = eventually("the second key_id migration", WAIT, || {
        let all = migrations(&m);
        (all.len() == 3).then_some(all)
    });
    assert!(all[2].1.contains(&format!("from {k2} to {k3}, reported by all 2 kube-apiservers")), "{all:?}");
    key_fields(&m, "Finished", &[&format!("kms:v2:vault:{k3}")]);
}

/// Without a copy, which provider writes what is unknown: a new key_id that every live apiserver reports for any
/// KMS v2 provider migrates the `--encrypted-resources`, after the margin; the config hash is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_copy_a_new_key_id_migrates_the_encrypted_resources() {
    let apiservers = Apiservers::new(&IDS, "sha256:aaaa");
    for id in IDS {
        apiservers.report_key_id(id, "vault", "key-1");
    }
    let (k1, k2) = (sha256_label(b"key-1"), sha256_label(b"key-2"));
    let (_t, _p, m) = setup(&apiservers, &["--cluster-key-rotation", "--cluster-kms-migration-margin", "1s"]).await;
    eventually("the key_id recorded", WAIT, || {
        let s = storage_state(&m)?;
        (annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes") == vault_key_id(&k1)).then_some(())
    });
    assert_eq!(migrations(&m).len(), 1, "the first hash only");
    for id in IDS {
        apiservers.report_key_id(id, "vault", "key-2");
    }
    let all = eventually("the key_id migration", WAIT, || {
        let all = migrations(&m);
        (all.len() == 2).then_some(all)
    });
    assert!(all[1]
        .1
        .contains(&format!("kms provider vault: key_id hash changed from {k1} to {k2}, reported by all 3")));
    let s = eventually("the new key_id recorded", WAIT, || {
        let s = storage_state(&m)?;
        (annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes") == vault_key_id(&k2)).then_some(s)
    });
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-observed"), "all 3 live kube-apiservers report sha256:aaaa");
    assert!(s["status"]["encryptionWriteKey"].is_null(), "no write key without a copy: {s:#}");
}

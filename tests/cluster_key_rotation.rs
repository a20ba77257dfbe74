//! The cluster key-rotation trigger (cluster mode) for what real kube-apiservers cannot show on demand: three
//! kube-apiservers whose identity Leases and `/metrics` (the loaded config's hash, the KMS v2 plugins' key_id hashes)
//! change when a test says so (`common::apiservers`). Our fault proxy serves those itself in front of a real
//! kube-apiserver (v1.37.2, one cluster without this server shared by the tests of this file) and forwards everything
//! else to it, so the migrations the trigger requests rewrite real objects: each test has a custom resource of its
//! own (its own group and namespace, tests/common/crs.rs) with a few objects stored in the version that is not the
//! storage version, given as `--encrypted-resources` or named by the copy of the config. Every migration that
//! Succeeded left them all in etcd in the storage version, each under a new resourceVersion; before the next one the
//! test switches the storage version back, so that it too has something to rewrite, and while nothing is to be
//! migrated they stay as they were. The migrating server is standalone (its StorageStates and migrations in its own
//! store), without the storage-version trigger and without a leader election, so the tests run side by side.
//!
//! The rotation with a copy of the config, a lagging apiserver waited for and one whose Lease disappears no longer,
//! is tests/cluster_encryption_real.rs's and tests/cluster_encryption_ha.rs's, against real kube-apiservers. Here: a
//! round runs when the set of live apiservers (their watched Leases) or the copy changes, and every interval, not
//! when a Lease is only renewed; without a copy every new shared hash migrates; a KMS v2 provider's new key_id (the
//! config unchanged) is migrated once every one of three live apiservers' plugins reports it and the
//! passive-migration margin has passed.

mod common;
use common::apiservers::{config_hash_label, sha256_label, Apiservers};
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use common::proxy::Proxy;
use common::status::is_true;
use common::*;

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

const IDS: [&str; 3] = [
    "apiserver-5qyo3ypfpdaxslhy6l4rbsbwbq",
    "apiserver-7s4ngdmbnesdnnj2i5o5i4wuqe",
    "apiserver-zr4d5pqkx6oxegxbgkqkbwsbfq",
];
const KEY1: &str = "dGhpcyBpcyBhIDMyIGJ5dGUgdGVzdCBrZXkgISEhISE=";
const KEY2: &str = "YW5vdGhlciAzMiBieXRlIHRlc3Qga2V5ICEhISEhISE=";
const WAIT: Duration = Duration::from_secs(90);
/// The objects of each test's resource.
const OBJECTS: usize = 10;

/// The cluster the tests of this file share: kube-apiserver without this server.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::up(Options { server: false, ..Default::default() }))
}

/// A test's own custom resource: a group of its own (a round's discovery of it never meets another test's CRD
/// being installed or switched) and a namespace of its own.
fn cr(group: &'static str, namespace: &'static str) -> Cr {
    Cr { group, plural: "lockers", kind: "Locker", namespace: Some(namespace) }
}

/// An EncryptionConfiguration covering `resource` with these aescbc keys, in this order.
fn config(resource: &str, keys: &[(&str, &str)]) -> String {
    let keys: String =
        keys.iter().map(|(n, s)| format!("            - name: {n}\n              secret: {s}\n")).collect();
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources:\n      - {resource}\n    providers:\n      - aescbc:\n          keys:\n{keys}      - identity: {{}}\n"
    )
}

/// Writes the copy and returns its hash as kube-apiserver reports it.
fn write_copy(path: &Path, text: &str) -> String {
    std::fs::write(path, text).expect("write copy");
    config_hash_label(text.as_bytes())
}

/// One test's world: its resource in the shared cluster, the proxy with the apiservers in front of kube-apiserver,
/// and the migrating server behind the proxy.
struct Rig {
    c: &'static Cluster,
    cr: Cr,
    /// The objects' resourceVersions before the migrating server started.
    initial: BTreeMap<String, String>,
    m: Server,
    _proxy: Proxy,
}

/// [`setup_every`] with the rounds requeued every 300 ms.
async fn setup(apiservers: &Apiservers, cr: Cr, extra: &[&str]) -> Rig {
    setup_every(apiservers, cr, "300ms", extra).await
}

/// `cr` installed with [`OBJECTS`] stale objects (stored in v1, v2 the storage version), the proxy serving the
/// apiservers in front of kube-apiserver, and a migrating server through it with `extra`, its rounds requeued every
/// `interval`.
async fn setup_every(apiservers: &Apiservers, cr: Cr, interval: &str, extra: &[&str]) -> Rig {
    let c = cluster();
    cr.install_stale(c, &c.client().await, OBJECTS).await;
    let initial = resource_versions(c, &cr);
    let proxy = Proxy::in_front_of_cluster(c);
    apiservers.install(&proxy);
    let resource = cr.name();
    let mut args =
        vec!["--migration-qps", "0", "--encrypted-resources", &resource, "--cluster-key-rotation-interval", interval];
    args.extend_from_slice(extra);
    // The key-rotation trigger runs (only the storage-version trigger is disabled), without a leader election.
    let m = cluster_migrator(&proxy.kubeconfig(), &args);
    Rig { c, cr, initial, m, _proxy: proxy }
}

/// `cr`'s objects in kube-apiserver: name -> resourceVersion.
fn resource_versions(c: &Cluster, cr: &Cr) -> BTreeMap<String, String> {
    let path = format!("/apis/{}/v2/namespaces/{}/{}", cr.group, cr.namespace.expect("namespaced"), cr.plural);
    let list = c.kubectl_json(&["get", "--raw", &path]);
    let items = list["items"].as_array().expect("items");
    let rv = |o: &Value, f: &str| o["metadata"][f].as_str().expect("metadata").to_string();
    items.iter().map(|o| (rv(o, "name"), rv(o, "resourceVersion"))).collect()
}

fn annotation(state: &Value, key: &str) -> String {
    state["metadata"]["annotations"][key].as_str().unwrap_or_default().to_string()
}

impl Rig {
    fn storage_state(&self) -> Option<Value> {
        let out = self.m.kubectl(&["get", "storagestates", &self.cr.name(), "-o", "json"]);
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls `f` until it returns Some; on time-out fails with the StorageState and the end of the server's log.
    fn poll<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if let Some(v) = f() {
                return v;
            }
            if std::time::Instant::now() > deadline {
                let log = self.m.log();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "timed out after {WAIT:?} waiting for {what}\nstoragestate: {}\nthe server's log (end):\n{}",
                    self.storage_state().unwrap_or_default(),
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until the StorageState's observation satisfies `f`; returns the StorageState.
    fn observed(&self, what: &str, f: impl Fn(&str) -> bool) -> Value {
        self.poll(what, || {
            let s = self.storage_state()?;
            f(&annotation(&s, "migration.k8s.io/encryption-observed")).then_some(s)
        })
    }

    /// Waits until the StorageState's KMS observation satisfies `f`; returns the StorageState.
    fn kms_observed(&self, what: &str, f: impl Fn(&str) -> bool) -> Value {
        self.poll(what, || {
            let s = self.storage_state()?;
            f(&annotation(&s, "migration.k8s.io/encryption-kms-observed")).then_some(s)
        })
    }

    /// Waits until the status says `rotation` with exactly `keys` in use; returns the StorageState.
    fn key_fields(&self, rotation: &str, keys: &[&str]) -> Value {
        self.poll(&format!("the status {rotation} with {keys:?}"), || {
            let s = self.storage_state()?;
            (s["status"]["encryptionKeyRotation"] == rotation && s["status"]["persistedEncryptionKeys"] == json!(keys))
                .then_some(s)
        })
    }

    /// The migrations of the resource, oldest first: (name, reason, Succeeded).
    fn migrations(&self) -> Vec<(String, String, bool)> {
        let label = format!("migration.k8s.io/resource={}", self.cr.name());
        let list = self.m.kubectl_json(&["get", "svm", "-l", &label, "-o", "json"]);
        let mut out: Vec<(String, String, String, bool)> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|s| {
                (
                    annotation(s, "migration.k8s.io/requested-at"),
                    s["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    annotation(s, "migration.k8s.io/reason"),
                    is_true(s, "Succeeded"),
                )
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, n, r, d)| (n, r, d)).collect()
    }

    /// Waits until there are `n` migrations of the resource; returns them.
    fn wait_migrations(&self, what: &str, n: usize) -> Vec<(String, String, bool)> {
        self.poll(what, || Some(self.migrations()).filter(|all| all.len() == n))
    }

    /// When the migration `name` was requested.
    fn requested_at(&self, name: &str) -> Timestamp {
        let svm = self.m.kubectl_json(&["get", "svm", name, "-o", "json"]);
        annotation(&svm, "migration.k8s.io/requested-at").parse().expect("RFC 3339")
    }

    /// The resource's objects in kube-apiserver: name -> resourceVersion.
    fn resource_versions(&self) -> BTreeMap<String, String> {
        resource_versions(self.c, &self.cr)
    }

    /// How etcd holds the resource's objects: apiVersion -> how many.
    fn stored_counts(&self) -> BTreeMap<String, usize> {
        self.cr.stored_counts(self.c)
    }

    /// Every object stored in `version`.
    fn all_in(&self, version: &str) -> BTreeMap<String, usize> {
        BTreeMap::from([(format!("{}/{version}", self.cr.group), OBJECTS)])
    }

    /// Waits until the migration `name` Succeeded; then kube-apiserver has rewritten every object: etcd holds each
    /// in `version`, the storage version, under a resourceVersion other than its one in `before`.
    fn rewritten(&self, name: &str, version: &str, before: &BTreeMap<String, String>) {
        let svm = self.poll(&format!("the migration {name} to succeed"), || {
            let svm = self.m.kubectl_json(&["get", "svm", name, "-o", "json"]);
            assert!(!is_true(&svm, "Failed"), "{svm:#}");
            is_true(&svm, "Succeeded").then_some(svm)
        });
        assert_eq!(svm["status"]["migratedObjects"], OBJECTS, "{svm:#}");
        assert_eq!(self.stored_counts(), self.all_in(version), "after {name}");
        let after = self.resource_versions();
        assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
        let kept: Vec<_> = after.iter().filter(|(k, rv)| before.get(*k) == Some(rv)).collect();
        assert!(kept.is_empty(), "not rewritten by {name}: {kept:?}");
    }

    /// Makes `version` the storage version (v1 stays first in the CRD; both stay served), as a user edits the CRD:
    /// every object, stored in the other version, is stale. Returns once kube-apiserver writes the resource in
    /// `version` (a probe object, deleted again, is stored so), with the objects' resourceVersions.
    async fn store_in(&self, version: &str) -> BTreeMap<String, String> {
        let (c, cr) = (self.c, &self.cr);
        let before = cr.discovery_hash(c).expect("a storage version hash in discovery");
        cr.store_in(c, version, &before);
        cr.written_in(c, &c.client().await, version).await;
        let stale = if version == "v1" { "v2" } else { "v1" };
        assert_eq!(self.stored_counts(), self.all_in(stale));
        self.resource_versions()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_copy_every_new_shared_hash_migrates_the_encrypted_resources() {
    let apiservers = Apiservers::new(&IDS, "sha256:aaaa");
    let cr = cr("hash.rotation.example.com", "rotation-hash");
    let rig = setup(&apiservers, cr, &["--cluster-key-rotation"]).await;
    let first = rig.wait_migrations("the first migration", 1);
    assert_eq!(first[0].1, "encryption key rotation: encryption config sha256:aaaa loaded by all 3 kube-apiservers");
    rig.rewritten(&first[0].0, "v2", &rig.initial);
    rig.observed("the hash recorded", |o| o == "all 3 live kube-apiservers report sha256:aaaa");

    // Stale again; two apiservers load a new config: nothing is migrated while the third has not.
    let before = rig.store_in("v1").await;
    apiservers.load(IDS[0], "sha256:bbbb");
    apiservers.load(IDS[1], "sha256:bbbb");
    rig.observed("the apiservers to disagree", |o| {
        o.contains("sha256:bbbb (") && o.contains(&format!("sha256:aaaa ({})", IDS[2]))
    });
    assert_eq!(rig.migrations().len(), 1);
    assert_eq!(rig.stored_counts(), rig.all_in("v2"), "nothing rewritten");
    apiservers.load(IDS[2], "sha256:bbbb");
    let all = rig.wait_migrations("the second migration", 2);
    assert_eq!(all[1].1, "encryption key rotation: encryption config sha256:bbbb loaded by all 3 kube-apiservers");
    rig.rewritten(&all[1].0, "v1", &before);
    let s = rig.observed("agreement", |o| o == "all 3 live kube-apiservers report sha256:bbbb");
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
    let cr = cr("rounds.rotation.example.com", "rotation-rounds");
    let resource = cr.name();
    let h1 = write_copy(&copy, &config(&resource, &[("key1", KEY1)]));
    let apiservers = Apiservers::new(&IDS, &h1);
    let copy_arg = copy.to_str().expect("path");
    let rig = setup_every(&apiservers, cr, "1h", &["--cluster-encryption-provider-config", copy_arg]).await;
    rig.observed("the first round", |o| {
        o == format!("all 3 live kube-apiservers report {h1}, the mounted copy's hash")
    });
    assert!(apiservers.lease_watches() > 0, "the Leases are watched");
    let scrapes = apiservers.scrapes();
    // The first round's migration: the write key first observed.
    let first = rig.migrations();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].1, "encryption key rotation: write key aescbc:v1:key1 first observed");
    rig.rewritten(&first[0].0, "v2", &rig.initial);

    // Renewals, then a Lease deleted: one round, of the two that are left (two scrapes reach both, round robin).
    for id in IDS {
        apiservers.renew(id);
    }
    apiservers.remove(IDS[2]);
    rig.observed("the round for the deleted Lease", |o| {
        o == format!("all 2 live kube-apiservers report {h1}, the mounted copy's hash")
    });
    assert_eq!(apiservers.scrapes(), scrapes + 2, "one round of two scrapes, none for the renewals");

    // Loading a new file shows only in /metrics (no round); the copy's change, after it, makes one. The new file
    // only adds a read key: nothing is migrated.
    let text = config(&resource, &[("key1", KEY1), ("key2", KEY2)]);
    let h2 = config_hash_label(text.as_bytes());
    apiservers.load(IDS[0], &h2);
    apiservers.load(IDS[1], &h2);
    write_copy(&copy, &text);
    let s = rig.observed("the round for the new copy", |o| {
        o == format!("all 2 live kube-apiservers report {h2}, the mounted copy's hash")
    });
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-config-hash"), h2);
    assert_eq!(rig.migrations().len(), 1, "a read key added migrates nothing");
}

/// An EncryptionConfiguration whose first provider for `resource` is the KMS v2 provider `vault`.
fn kms_config(resource: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources:\n      - {resource}\n    providers:\n      - kms:\n          apiVersion: v2\n          name: vault\n          endpoint: unix:///var/run/kms/vault.sock\n          timeout: 3s\n      - identity: {{}}\n"
    )
}

/// The recorded key_ids annotation of a resource the provider `vault` writes.
fn vault_key_id(key_id_hash: &str) -> String {
    format!(r#"{{"vault":"{key_id_hash}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kms_key_id_rotation_waits_for_every_live_apiserver_and_the_margin() {
    let dir = tempfile::tempdir().expect("dir");
    let copy = dir.path().join("encryption-config.yaml");
    let cr = cr("kms.rotation.example.com", "rotation-kms");
    let h1 = write_copy(&copy, &kms_config(&cr.name()));
    let apiservers = Apiservers::new(&IDS, &h1);
    for id in IDS {
        apiservers.report_key_id(id, "vault", "key-1");
    }
    let (k1, k2, k3) = (sha256_label(b"key-1"), sha256_label(b"key-2"), sha256_label(b"key-3"));
    let (write1, write2) = (format!("kms:v2:vault:{k1}"), format!("kms:v2:vault:{k2}"));
    let copy_arg = copy.to_str().expect("path");
    let margin = Duration::from_secs(4);
    let args = ["--cluster-encryption-provider-config", copy_arg, "--cluster-key-rotation-scrapes", "12"];
    let rig = setup(&apiservers, cr, &[&args[..], &["--cluster-kms-migration-margin", "4s"]].concat()).await;

    // First sight: the write key's migration rewrites everything; the key_id is recorded with it, not migrated.
    let s = rig.kms_observed("the key_id recorded", |o| o.ends_with("first observed") || o.ends_with(&k1));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), vault_key_id(&k1));
    rig.key_fields("Finished", &[&write1]);
    let first = rig.migrations();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].1, "encryption key rotation: write key kms:v2:vault first observed");
    rig.rewritten(&first[0].0, "v2", &rig.initial);

    // The KMS rotates: the plugins report key-2 one apiserver after the other. The laggards are named; nothing starts.
    let before = rig.store_in("v1").await;
    for (i, id) in IDS.iter().enumerate() {
        apiservers.report_key_id(id, "vault", "key-2");
        if i + 1 < IDS.len() {
            let moved = format!("{k2} ({})", IDS[..=i].join(", "));
            let s = rig.kms_observed("the apiservers to disagree on the key_id", |o| o.contains(&moved));
            let o = annotation(&s, "migration.k8s.io/encryption-kms-observed");
            assert!(o.contains(&format!("the recorded {k1} ({})", IDS[i + 1..].join(", "))), "{o}");
            let r = annotation(&s, "migration.k8s.io/encryption-rotation");
            assert!(
                r.starts_with("Waiting: the live kube-apiservers report different key_ids of kms provider vault"),
                "{r}"
            );
            rig.key_fields("Rotating", &[&write1, &write2]);
            assert_eq!(rig.migrations().len(), 1);
            assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-pending"), "");
            assert_eq!(rig.stored_counts(), rig.all_in("v2"), "nothing rewritten");
        }
    }

    // All three: the margin, said on the StorageState, then one migration.
    let s = rig.kms_observed("the margin", |o| o.contains("waiting until"));
    let pending: Value =
        serde_json::from_str(&annotation(&s, "migration.k8s.io/encryption-kms-pending")).expect("json");
    assert_eq!(pending["vault"]["keyIDHash"], k2);
    let since: Timestamp = pending["vault"]["since"].as_str().expect("since").parse().expect("RFC 3339");
    let o = annotation(&s, "migration.k8s.io/encryption-kms-observed");
    assert!(o.contains("the passive-migration margin, 4s"), "{o}");
    assert!(annotation(&s, "migration.k8s.io/encryption-rotation").contains("the migration starts after"));
    let all = rig.wait_migrations("the key_id migration", 2);
    assert_eq!(
        all[1].1,
        format!(
            "encryption key rotation: kms provider vault: key_id hash changed from {k1} to {k2}, reported by all 3 \
             kube-apiservers since {since}"
        )
    );
    let started = rig.requested_at(&all[1].0);
    assert!(started.as_millisecond() >= since.as_millisecond() + margin.as_millis() as i64, "{started} {since}");
    rig.rewritten(&all[1].0, "v1", &before);
    let s = rig.poll("the key_id rotation done", || {
        let s = rig.storage_state()?;
        let r = annotation(&s, "migration.k8s.io/encryption-rotation");
        (r.starts_with(&format!("Done: {}", all[1].0))).then_some(s)
    });
    let r = annotation(&s, "migration.k8s.io/encryption-rotation");
    assert!(r.contains(&write2) && r.contains("may be retired in the KMS"), "{r}");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), vault_key_id(&k2));
    rig.key_fields("Finished", &[&write2]);

    // key-3 on two of them: the third lags; it is named, key-2 stays recorded, nothing pending, no migration.
    let before = rig.store_in("v2").await;
    apiservers.report_key_id(IDS[0], "vault", "key-3");
    apiservers.report_key_id(IDS[1], "vault", "key-3");
    // The old series persist in every /metrics: a refreshed key-2 Status on the laggard keeps it on key-2.
    apiservers.report_key_id(IDS[2], "vault", "key-2");
    rig.kms_observed("the laggard named", |o| o.contains(&format!("the recorded {k2} ({})", IDS[2])));
    let scrapes = apiservers.scrapes();
    rig.poll("several more rounds", || (apiservers.scrapes() > scrapes + 2 * 12).then_some(()));
    let s = rig.storage_state().expect("storagestate");
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes"), vault_key_id(&k2));
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-kms-pending"), "");
    assert_eq!(rig.migrations().len(), 2);
    assert_eq!(rig.stored_counts(), rig.all_in("v1"), "nothing rewritten");

    // Its Lease disappears: the two others decide, after the margin.
    apiservers.remove(IDS[2]);
    rig.kms_observed("the two remaining apiservers to agree", |o| {
        o.starts_with(&format!("kms provider vault: all 2 live kube-apiservers report key_id hash {k3} since"))
    });
    let all = rig.wait_migrations("the second key_id migration", 3);
    assert!(all[2].1.contains(&format!("from {k2} to {k3}, reported by all 2 kube-apiservers")), "{all:?}");
    rig.rewritten(&all[2].0, "v2", &before);
    rig.key_fields("Finished", &[&format!("kms:v2:vault:{k3}")]);
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
    let cr = cr("keyid.rotation.example.com", "rotation-keyid");
    let rig = setup(&apiservers, cr, &["--cluster-key-rotation", "--cluster-kms-migration-margin", "1s"]).await;
    rig.poll("the key_id recorded", || {
        let s = rig.storage_state()?;
        (annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes") == vault_key_id(&k1)).then_some(())
    });
    let first = rig.migrations();
    assert_eq!(first.len(), 1, "the first hash only: {first:?}");
    rig.rewritten(&first[0].0, "v2", &rig.initial);
    let before = rig.store_in("v1").await;
    for id in IDS {
        apiservers.report_key_id(id, "vault", "key-2");
    }
    let all = rig.wait_migrations("the key_id migration", 2);
    assert!(all[1]
        .1
        .contains(&format!("kms provider vault: key_id hash changed from {k1} to {k2}, reported by all 3")));
    rig.rewritten(&all[1].0, "v1", &before);
    let s = rig.poll("the new key_id recorded", || {
        let s = rig.storage_state()?;
        (annotation(&s, "migration.k8s.io/encryption-kms-key-id-hashes") == vault_key_id(&k2)).then_some(s)
    });
    assert_eq!(annotation(&s, "migration.k8s.io/encryption-observed"), "all 3 live kube-apiservers report sha256:aaaa");
    assert!(s["status"]["encryptionWriteKey"].is_null(), "no write key without a copy: {s:#}");
}

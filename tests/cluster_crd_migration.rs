//! Custom resources migrated by this server's trigger and migrator behind a real kube-apiserver (v1.37.2, `make
//! cluster`): a CRD's storage version changes, the trigger sees the new storageVersionHash in discovery, the migrator
//! rewrites every object (etcd then holds each one in the new version), trims the CRD's `status.storedVersions` to
//! it, and the StorageState records the objects as migrated. The server runs as the deploy kit's ServiceAccount,
//! whose ClusterRole lists no custom resources: each test grants `list` and `patch` on its resource as
//! docs/install/before-you-install.md and docs/operations/troubleshooting.md tell users to.
//!
//! Both tests share one cluster (its trigger polls discovery every 2 s) and run one after the other: the second one
//! restarts kube-apiserver, which the first one's requests would not survive.

mod common;
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ApiResource;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const GROUP: &str = "stable.example.com";

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::up(Options { server_args: vec!["--discovery-interval=2s".into()], ..Default::default() })
    })
}

/// One test at a time on the shared cluster (the second restarts kube-apiserver).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The test group's custom resource `plural` of `kind`.
fn cr(plural: &'static str, kind: &'static str, namespace: Option<&'static str>) -> Cr {
    Cr { group: GROUP, plural, kind, namespace }
}

/// What the trigger records about a custom resource, read through kube-apiserver's aggregator.
trait Recorded {
    fn storage_state(&self, c: &Cluster) -> Option<Value>;
    async fn migrations(&self, client: &kube::Client) -> Option<Vec<Value>>;
    async fn migrations_to(&self, client: &kube::Client, hash: &str) -> Option<Vec<Value>>;
}

impl Recorded for Cr {
    /// The resource's StorageState (`kubectl get storagestate <name> -o json`), once the trigger made it.
    fn storage_state(&self, c: &Cluster) -> Option<Value> {
        let out = c.kubectl(&["get", "storagestate", &self.name(), "-o", "json"]);
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The migrations the trigger requested for the resource, through kube-apiserver's aggregator (the query a user
    /// runs: `kubectl get storageversionmigrations.migration.k8s.io -l migration.k8s.io/resource=<name>`).
    async fn migrations(&self, client: &kube::Client) -> Option<Vec<Value>> {
        let ar = ApiResource {
            group: "migration.k8s.io".into(),
            version: "v1alpha1".into(),
            api_version: "migration.k8s.io/v1alpha1".into(),
            kind: "StorageVersionMigration".into(),
            plural: "storageversionmigrations".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let lp = ListParams::default().labels(&format!("migration.k8s.io/resource={}", self.name()));
        let list = api.list(&lp).await.ok()?;
        list.items.into_iter().map(|m| serde_json::to_value(m).ok()).collect()
    }

    /// The migrations the trigger requested for storage version hash `hash`, oldest first.
    async fn migrations_to(&self, client: &kube::Client, hash: &str) -> Option<Vec<Value>> {
        let mut to_hash: Vec<Value> = self
            .migrations(client)
            .await?
            .into_iter()
            .filter(|m| m["metadata"]["annotations"]["migration.k8s.io/storage-version-hash"] == hash)
            .collect();
        to_hash.sort_by_key(|m| m["metadata"]["annotations"]["migration.k8s.io/requested-at"].to_string());
        Some(to_hash)
    }
}

/// Polls `f` every 100 ms until it answers, for at most `timeout` (kube-apiserver's requests are cheap; kubectl's
/// processes would load the two cores the migration runs on).
async fn until<T, F: Future<Output = Option<T>>>(what: &str, timeout: Duration, mut f: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

fn is_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

fn finished(m: &Value) -> bool {
    is_true(m, "Succeeded") || is_true(m, "Failed")
}

/// Once the trigger is done with `hash` (every migration to it finished, and the StorageState's persisted ==
/// [hash]): each of those migrations Succeeded, rewriting all `objects`; every object of `cr` is stored in v2 in
/// etcd; its CRD's storedVersions is exactly ["v2"] (trimmed by the server: kube-apiserver itself added v2 to
/// ["v1"]); and its StorageState's current hash is `hash`. Returns the migrations, oldest first.
async fn assert_migrated(c: &Cluster, client: &kube::Client, cr: &Cr, hash: &str, objects: usize) -> Vec<Value> {
    let what = format!("the migrations of {} to {hash} to end and persisted to be [{hash}]", cr.name());
    let migrations = until(&what, Duration::from_secs(150), || async {
        let ms = cr.migrations_to(client, hash).await.filter(|ms| !ms.is_empty() && ms.iter().all(finished))?;
        // A failed one is reported below at once.
        let ss = cr.storage_state(c)?;
        let done = ss["status"]["persistedStorageVersionHashes"] == json!([hash]);
        (done || ms.iter().any(|m| is_true(m, "Failed"))).then_some(ms)
    })
    .await;
    for m in &migrations {
        assert!(is_true(m, "Succeeded"), "{m:#}");
        assert_eq!(m["status"]["migratedObjects"], json!(objects), "{m:#}");
        assert_eq!(m["spec"]["resource"], json!({"group": GROUP, "version": "v2", "resource": cr.plural}), "{m:#}");
    }

    // (a) Every object, in etcd, is stored as v2.
    let stored = cr.stored(c);
    assert_eq!(stored.len(), objects, "objects in etcd");
    let not_v2: Vec<_> = stored.iter().filter(|(_, v)| *v != &format!("{GROUP}/v2")).collect();
    assert!(not_v2.is_empty(), "{} objects not stored in v2, e.g. {:?}", not_v2.len(), not_v2.first());

    // (b) storedVersions trimmed to the storage version by the migration: its StorageMigrating condition, set at
    // the CRD's current generation, says so.
    let crd = cr.crd_json(c);
    assert_eq!(crd["status"]["storedVersions"], json!(["v2"]), "{crd:#}");
    let migrating = condition(&crd, "StorageMigrating").unwrap_or_else(|| panic!("{crd:#}"));
    assert_eq!(migrating["reason"], "MigrationSucceeded", "{crd:#}");
    assert_eq!(migrating["status"], "False", "{crd:#}");
    assert_eq!(migrating["observedGeneration"], crd["metadata"]["generation"], "{crd:#}");

    // (c) The StorageState: persisted == [current], current being discovery's hash.
    let ss = c.kubectl_json(&["get", "storagestate", &cr.name(), "-o", "json"]);
    assert_eq!(ss["status"]["currentStorageVersionHash"], hash, "{ss:#}");
    assert_eq!(ss["status"]["persistedStorageVersionHashes"], json!([hash]), "{ss:#}");
    migrations
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crd_storage_version_change_migrates_every_object_and_trims_stored_versions() {
    let _serial = serial().await;
    let c = cluster();
    let client = c.client().await;
    let cr = cr("widgets", "Widget", Some("widgets"));
    cr.install(c);
    const N: usize = 300;
    cr.create(&client, N).await;

    // The trigger requests a migration of the new resource (persisted ["Unknown"]) at once; as the docs say, with
    // the kit's RBAC alone it ends Failed at its first request, a 403 from kube-apiserver naming the resource.
    let v1_hash = common::eventually("the v1 storage version hash in discovery", Duration::from_secs(30), || {
        cr.discovery_hash(c)
    });
    let first = until("the first migration of widgets to end", Duration::from_secs(60), || async {
        cr.migrations_to(&client, &v1_hash).await?.into_iter().find(finished)
    })
    .await;
    let failed = condition(&first, "Failed").filter(|c| c["status"] == "True").unwrap_or_else(|| panic!("{first:#}"));
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("403 Forbidden")
            && message.contains(&format!("cannot list resource \"widgets\" in API group \"{GROUP}\"")),
        "{first:#}"
    );
    let ss = cr.storage_state(c).expect("the StorageState of widgets");
    assert_eq!(ss["status"]["persistedStorageVersionHashes"], json!(["Unknown"]), "{ss:#}");
    assert_eq!(ss["status"]["currentStorageVersionHash"], v1_hash.as_str(), "{ss:#}");
    // Nothing was rewritten: every object is in v1, the CRD has only ever stored v1.
    assert_eq!(cr.stored_counts(c), BTreeMap::from([(format!("{GROUP}/v1"), N)]));
    assert_eq!(cr.crd_json(c)["status"]["storedVersions"], json!(["v1"]));

    // Granted as the docs say, then the storage version changes: the trigger sees the new hash and migrates.
    cr.grant(c);
    let v2_hash = cr.store_in(c, "v2", &v1_hash);
    let migrations = assert_migrated(c, &client, &cr, &v2_hash, N).await;
    assert_eq!(migrations.len(), 1, "{migrations:#?}");
    let reason = &migrations[0]["metadata"]["annotations"]["migration.k8s.io/reason"];
    // persisted was [Unknown, v2's]: no known hash before, so "new" rather than "changed".
    assert_eq!(reason, "new storage version hash", "{:#}", migrations[0]);

    // The Event the docs list for a trim (docs/operations/events.md), in namespace default.
    common::eventually("the StoredVersionsTrimmed Event", Duration::from_secs(30), || {
        let out = c.kubectl(&["get", "events.events.k8s.io", "-n", "default", "-o", "json"]);
        let events: Value = serde_json::from_slice(&out.stdout).ok()?;
        events["items"].as_array()?.iter().find(|e| {
            e["reason"] == "StoredVersionsTrimmed"
                && e["regarding"]["kind"] == "CustomResourceDefinition"
                && e["regarding"]["name"] == cr.name().as_str()
                && e["note"].as_str().is_some_and(|n| n.contains(r#"from ["v1","v2"] to ["v2"]"#))
        })?;
        Some(())
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_objects_migrate_across_a_kube_apiserver_restart() {
    let _serial = serial().await;
    let c = cluster();
    let client = c.client().await;
    let cr = cr("gadgets", "Gadget", None);
    // Granted before the CRD exists: the trigger's first migration (persisted ["Unknown"]) succeeds, and the
    // storage version change below is a changed hash.
    cr.grant(c);
    cr.install(c);
    let v1_hash = common::eventually("the v1 storage version hash in discovery", Duration::from_secs(30), || {
        cr.discovery_hash(c)
    });
    until("the first migration of gadgets to succeed", Duration::from_secs(60), || async {
        let ss = cr.storage_state(c)?;
        (ss["status"]["persistedStorageVersionHashes"] == json!([v1_hash])).then_some(())
    })
    .await;

    const N: usize = 10_000;
    let started = Instant::now();
    cr.create(&client, N).await;
    eprintln!("created {N} gadgets in {:.1?}", started.elapsed());
    assert_eq!(cr.stored_counts(c), BTreeMap::from([(format!("{GROUP}/v1"), N)]));

    let v2_hash = cr.store_in(c, "v2", &v1_hash);
    let started = Instant::now();
    // Kube-apiserver goes away in the middle: once the migration saved a continue token (a chunk done), before
    // it is done.
    let running = until("the migration to save a continue token", Duration::from_secs(60), || async {
        let ms = cr.migrations_to(&client, &v2_hash).await?;
        let m = ms
            .into_iter()
            .find(|m| m["metadata"]["annotations"]["migration.k8s.io/reason"] == "changed storage version hash")?;
        assert!(!finished(&m), "the migration ended before kube-apiserver could be restarted in its middle: {m:#}");
        m["spec"]["continueToken"].is_string().then_some(m)
    })
    .await;
    let name = running["metadata"]["name"].as_str().expect("name").to_string();
    eprintln!("{name}: {} objects migrated after {:.1?}", running["status"]["migratedObjects"], started.elapsed());
    c.stop("kube-apiserver");
    // While kube-apiserver is down nothing writes the objects: etcd shows the migration half-way.
    let counts = cr.stored_counts(c);
    let v2 = counts.get(&format!("{GROUP}/v2")).copied().unwrap_or(0);
    assert!(v2 > 0 && v2 < N, "the restart did not land in the middle of the migration: {counts:?}");
    assert_eq!(counts.values().sum::<usize>(), N, "{counts:?}");
    eprintln!("kube-apiserver stopped with {counts:?} stored");
    c.restart("kube-apiserver");

    let migrations = assert_migrated(c, &client, &cr, &v2_hash, N).await;
    eprintln!("done {:.1?} after the storage version changed: {}", started.elapsed(), summary(&migrations));
    // The interrupted migration itself Succeeded. It lost its requests and, when the outage outlasted the renew
    // deadline, the scheduler's Lease (on kube-apiserver) too: it went on from its saved token, never over again.
    assert_eq!(migrations[0]["metadata"]["name"], name.as_str(), "{migrations:#?}");
    let log = c.log("migration-apiserver");
    let resumed = format!("migration resumed migration=storageversionmigration.migration.k8s.io/{name} ");
    for line in log.lines().filter(|l| l.contains(&resumed)) {
        assert!(line.contains("resumed_from_token=true"), "{line}");
    }
    // Any later one is the trigger's re-check after the outage: the scheduler lost its Lease while kube-apiserver
    // was down, and its decider, leading again, found the StorageState's heartbeat older than two discovery
    // intervals (docs/guides/storage-version-migration.md: persisted reset to ["Unknown"], migrated again).
    for m in &migrations[1..] {
        assert_eq!(m["metadata"]["annotations"]["migration.k8s.io/reason"], "storage state stale at start-up", "{m:#}");
    }
    // No migration of the resource failed or was superseded meanwhile.
    let all = cr.migrations(&client).await.expect("migrations");
    let failed: Vec<&Value> = all.iter().filter(|m| is_true(m, "Failed")).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Each migration's name, reason and objects, for the test's output.
fn summary(migrations: &[Value]) -> String {
    let one = |m: &Value| {
        let reason = &m["metadata"]["annotations"]["migration.k8s.io/reason"];
        let name = m["metadata"]["name"].as_str().unwrap_or_default();
        format!("{name} ({reason}, {} objects)", m["status"]["migratedObjects"])
    };
    migrations.iter().map(one).collect::<Vec<_>>().join(", ")
}

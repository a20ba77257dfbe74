//! A custom resource's CRD `status.storedVersions` after its migration (KEP-4192's CRD Storage Version Status
//! Update), on a real kube-apiserver (v1.37.2, `make kube`) with real CRDs (`common::crs`): each test makes a CRD
//! served in v1 and v2 whose objects are all stored in v1 while its storage version is v2 (`storedVersions` is
//! ["v1","v2"]), requests a migration of it from a standalone migrating server (`common::cluster_migrator`), and
//! reads the CRD (its storedVersions, its `StorageMigrating` condition with observedGeneration, every version of it
//! a watch saw) and etcd (the apiVersion each object is stored in) afterwards. The migrator sets storedVersions to
//! the storage version only when the migration Succeeded and the CRD's generation is the one it started at; it
//! leaves it alone when the storage version changed meanwhile or the migration Failed, reads the CRD again after a
//! conflicting write, and does nothing at all to CRDs with `--update-crd-stored-versions=false`.
//!
//! Kube-apiserver itself answers every request; our fault proxy (`common::proxy`, in front of it as its
//! administrator) only adds what it cannot show on demand: object writes held back with 429 while the test changes
//! the storage version, and another writer's change of the CRD just before the migrator's status write (a real 409).
//! The failed migration meets a real 403 of kube-apiserver's RBAC: the migrator runs as a user that may patch every
//! object but one.
//!
//! The four tests share one cluster without our server in it, each with a resource of its own.

mod common;
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use common::proxy::{Fault, Proxy};
use common::*;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, WatchEvent, WatchParams};
use kube::core::ApiResource;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

const GROUP: &str = "storedversions.example.com";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
/// Objects of each resource.
const N: usize = 30;
/// Generous: four tests, their migrating servers and the cluster share two cores.
const DEADLINE: Duration = Duration::from_secs(120);

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::up(Options { server: false, ..Default::default() }))
}

/// The test group's resource `plural` of `kind`, in namespace `plural`.
fn cr(plural: &'static str, kind: &'static str) -> Cr {
    Cr { group: GROUP, plural, kind, namespace: Some(plural) }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn crds(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions"),
    )
}

async fn crd(client: &kube::Client, cr: &Cr) -> Value {
    let crd = crds(client).get(&cr.name()).await.unwrap_or_else(|e| panic!("get crd {}: {e}", cr.name()));
    serde_json::to_value(crd).expect("JSON")
}

fn migrating(crd: &Value) -> Option<&Value> {
    crd["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "StorageMigrating")
}

fn storage_version(crd: &Value) -> Option<&str> {
    crd["spec"]["versions"].as_array()?.iter().find(|v| v["storage"] == true)?["name"].as_str()
}

/// The CRD as it starts in every test: stored in v2, both versions stored, no condition of ours.
async fn stale_crd(client: &kube::Client, cr: &Cr) -> Value {
    let crd = crd(client, cr).await;
    assert_eq!(storage_version(&crd), Some("v2"), "{crd:#}");
    assert_eq!(crd["status"]["storedVersions"], json!(["v1", "v2"]), "{crd:#}");
    assert!(migrating(&crd).is_none(), "{crd:#}");
    crd
}

/// Every version of a CRD a watch from a resourceVersion on delivered, as kube-apiserver sent them.
struct History {
    /// The resourceVersion the watch started from.
    from: Value,
    seen: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    async fn watch(client: &kube::Client, crd: &Value) -> History {
        let name = crd["metadata"]["name"].as_str().expect("name");
        let rv = crd["metadata"]["resourceVersion"].as_str().expect("resourceVersion");
        let wp = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(290);
        let mut events = crds(client).watch(&wp, rv).await.expect("watch the CRD").boxed();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event.expect("a watch event") {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                        into.lock().unwrap().push(serde_json::to_value(o).expect("JSON"))
                    }
                    WatchEvent::Bookmark(_) => {}
                    other => panic!("unexpected watch event on the CRD: {other:?}"),
                }
            }
        });
        History { from: json!(rv), seen, task }
    }

    /// Every version seen, once the watch delivered `last` (the CRD as the test read it last).
    async fn until(&self, last: &Value) -> Vec<Value> {
        let rv = &last["metadata"]["resourceVersion"];
        if *rv == self.from {
            return Vec::new();
        }
        eventually_async("the watch to deliver the CRD's last version", DEADLINE, || async {
            assert!(!self.task.is_finished(), "the watch of the CRD ended");
            let seen = self.seen.lock().unwrap().clone();
            seen.iter().any(|o| o["metadata"]["resourceVersion"] == *rv).then_some(seen)
        })
        .await
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each write of the StorageMigrating condition in `history`: (status, reason, observedGeneration), in order.
fn transitions(history: &[Value]) -> Vec<(String, String, i64)> {
    let mut out = Vec::new();
    let mut last: Option<&Value> = None;
    for c in history.iter().filter_map(migrating) {
        if last != Some(c) {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            out.push((s("status"), s("reason"), c["observedGeneration"].as_i64().unwrap_or(-1)));
        }
        last = Some(c);
    }
    out
}

fn t(status: &str, reason: &str, generation: i64) -> (String, String, i64) {
    (status.into(), reason.into(), generation)
}

fn generation(crd: &Value) -> i64 {
    crd["metadata"]["generation"].as_i64().expect("generation")
}

/// Requests a migration of `cr` on `m` and waits until it has ended; returns it.
async fn migrate(m: &Server, cr: &Cr) -> Value {
    let name = request_cr_migration(m, cr);
    let svm = resource("migration.k8s.io", "v1alpha1", "StorageVersionMigration", "storageversionmigrations");
    let api: Api<DynamicObject> = Api::all_with(m.client().await, &svm);
    let (api, name) = (&api, name.as_str());
    eventually_async(&format!("migration {name} to end"), DEADLINE, || async move {
        let svm = serde_json::to_value(api.get(name).await.ok()?).ok()?;
        let conditions = svm["status"]["conditions"].as_array()?;
        let ended =
            conditions.iter().any(|c| (c["type"] == "Succeeded" || c["type"] == "Failed") && c["status"] == "True");
        ended.then_some(svm)
    })
    .await
}

fn ended_as<'a>(svm: &'a Value, type_: &str) -> &'a Value {
    let cs = svm["status"]["conditions"].as_array().unwrap_or_else(|| panic!("{svm:#}"));
    cs.iter().find(|c| c["type"] == type_ && c["status"] == "True").unwrap_or_else(|| panic!("not {type_}: {svm:#}"))
}

fn counts(cr: &Cr, v1: usize, v2: usize) -> BTreeMap<String, usize> {
    [(format!("{}/v1", cr.group), v1), (format!("{}/v2", cr.group), v2)].into_iter().filter(|(_, n)| *n > 0).collect()
}

/// Is `r` a write of one of `cr`'s objects?
fn object_write(cr: &Cr, method: &str, path: &str) -> bool {
    method == "PATCH" && path.starts_with(&format!("/apis/{}/", cr.group)) && path.contains(&format!("/{}/", cr.plural))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untouched_when_the_storage_version_changed_during_the_migration() {
    let c = cluster();
    let client = c.client().await;
    let cr = cr("sprockets", "Sprocket");
    cr.install_stale(c, &client, N).await;
    let before = stale_crd(&client, &cr).await;
    let g = generation(&before);

    // The first K object writes go through (stored in v2); the later ones meet 429 until the test has switched the
    // storage version back to v1 and kube-apiserver writes v1.
    const K: usize = 10;
    let proxy = Proxy::in_front_of_cluster(c);
    let open = Arc::new(AtomicBool::new(false));
    let (o, forwarded, rule_cr) = (open.clone(), AtomicUsize::new(0), cr.clone());
    proxy.add_rule(move |r| {
        if !object_write(&rule_cr, &r.method, &r.path) || o.load(Ordering::SeqCst) {
            return None;
        }
        let first = forwarded.fetch_add(1, Ordering::SeqCst) < K;
        (!first).then_some(Fault::Status { code: 429, retry_after: Some(1) })
    });
    // Attempts enough that the held writes never make the migration step back (and list again) meanwhile.
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-max-attempts=1000"]);
    let history = History::watch(&client, &before).await;
    let migration = tokio::spawn({
        let cr = cr.clone();
        async move { migrate(&m, &cr).await }
    });

    eventually_async("K object writes to be done and the next one held", DEADLINE, || async {
        let records = proxy.records();
        let writes = records.iter().filter(|r| object_write(&cr, &r.method, &r.path));
        let (done, held) = writes.fold((0, 0), |(d, h), r| match (r.fault, r.code) {
            (false, 200) => (d + 1, h),
            (true, 429) => (d, h + 1),
            _ => panic!("unexpected answer to a write: {r:?}"),
        });
        (done == K && held > 0).then_some(())
    })
    .await;
    assert!(!migration.is_finished(), "the migration ended while its writes were held");
    let running = crd(&client, &cr).await;
    assert_eq!(transitions(&[running]), [t("True", "MigrationRunning", g)]);
    assert_eq!(cr.stored_counts(c), counts(&cr, N - K, K), "K objects rewritten in v2");

    // The user moves the storage version back to v1: a new generation.
    let patch = json!([
        {"op": "test", "path": "/spec/versions/1/name", "value": "v2"},
        {"op": "replace", "path": "/spec/versions/0/storage", "value": true},
        {"op": "replace", "path": "/spec/versions/1/storage", "value": false},
    ]);
    c.kubectl_ok(&["patch", "crd", &cr.name(), "--type=json", "-p", &patch.to_string()]);
    cr.written_in(c, &client, "v1").await;
    open.store(true, Ordering::SeqCst);

    let svm = migration.await.expect("the migration's task");
    ended_as(&svm, "Succeeded");
    assert_eq!(svm["status"]["migratedObjects"], json!(N), "{svm:#}");
    let after = crd(&client, &cr).await;
    assert_eq!(generation(&after), g + 1, "{after:#}");
    assert_eq!(storage_version(&after), Some("v1"), "{after:#}");
    // etcd holds both versions: trimming to the storage version (v1) would have lost the K objects in v2.
    assert_eq!(cr.stored_counts(c), counts(&cr, N - K, K));
    assert_eq!(after["status"]["storedVersions"], json!(["v1", "v2"]), "{after:#}");
    let condition = migrating(&after).expect("the condition");
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(message.contains("generation mismatch"), "{condition:#}");
    // Started at generation g, ended at g+1 (the condition records the generation it was written at).
    let history = history.until(&after).await;
    assert_eq!(transitions(&history), [t("True", "MigrationRunning", g), t("False", "MigrationSucceeded", g + 1)]);
}

/// Lets `nobody` do what a migration of `cr` needs (read and write the CRD's status, list the objects), and patch
/// every object but `denied`; waits until kube-apiserver's authorizer answers so.
fn grant_all_but(c: &Cluster, cr: &Cr, denied: &str) {
    let name = format!("stored-versions-{}", cr.name());
    let allowed: Vec<String> = (0..N).map(|i| cr.object_name(i)).filter(|n| n != denied).collect();
    let (ae, crd) = (["apiextensions.k8s.io"], [cr.name()]);
    let rules = json!([
        {"apiGroups": ae, "resources": ["customresourcedefinitions"], "verbs": ["get"], "resourceNames": crd},
        {"apiGroups": ae, "resources": ["customresourcedefinitions/status"], "verbs": ["update"], "resourceNames": crd},
        {"apiGroups": [cr.group], "resources": [cr.plural], "verbs": ["list"]},
        {"apiGroups": [cr.group], "resources": [cr.plural], "verbs": ["patch"], "resourceNames": allowed},
    ]);
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
        "rules": rules});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "nobody"}]});
    c.kubectl_ok_stdin(&["apply", "-f", "-"], &format!("{role}\n{binding}\n"));
    let ns = cr.namespace.unwrap_or_default();
    let first_allowed = allowed[0].as_str();
    let checks = [
        ("apiextensions.k8s.io", "customresourcedefinitions", "", "get", "", cr.name(), true),
        ("apiextensions.k8s.io", "customresourcedefinitions", "status", "update", "", cr.name(), true),
        (cr.group, cr.plural, "", "list", "", String::new(), true),
        (cr.group, cr.plural, "", "patch", ns, first_allowed.to_string(), true),
        (cr.group, cr.plural, "", "patch", ns, denied.to_string(), false),
    ];
    for (group, resource, subresource, verb, namespace, name, allowed) in checks {
        let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "nobody", "groups": ["system:authenticated"],
                "resourceAttributes": {"group": group, "resource": resource, "subresource": subresource,
                    "verb": verb, "namespace": namespace, "name": name}}});
        eventually(&format!("nobody's {verb} {resource}/{subresource} {name} to be {allowed}"), DEADLINE, || {
            let out = c.kubectl_ok_stdin(&["create", "--validate=false", "-f", "-", "-o", "json"], &review.to_string());
            let answer: Value = serde_json::from_str(&out).expect("a SubjectAccessReview");
            (answer["status"]["allowed"].as_bool().unwrap_or(false) == allowed).then_some(())
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untouched_after_failed() {
    let c = cluster();
    let client = c.client().await;
    let cr = cr("cogs", "Cog");
    cr.install_stale(c, &client, N).await;
    let before = stale_crd(&client, &cr).await;
    let g = generation(&before);
    // A real 403 from kube-apiserver's RBAC at one object's write: a permanent error, the migration fails.
    let denied = "cog-00007";
    grant_all_but(c, &cr, denied);
    let m = cluster_migrator(&c.nobody(), &[]);
    let history = History::watch(&client, &before).await;

    let svm = migrate(&m, &cr).await;
    let failed = ended_as(&svm, "Failed");
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(message.contains(denied) && message.contains("403"), "{svm:#}");
    assert!(message.contains(&format!("cannot patch resource \"{}\"", cr.plural)), "{svm:#}");

    let after = crd(&client, &cr).await;
    // The denied object is still stored in v1: storedVersions must keep listing v1, and does.
    let stored = cr.stored(c);
    let denied_version = stored.iter().find(|(k, _)| k.ends_with(&format!("/{denied}"))).map(|(_, v)| v.as_str());
    assert_eq!(denied_version, Some(format!("{GROUP}/v1").as_str()), "{stored:#?}");
    assert_eq!(stored.len(), N);
    assert_eq!(after["status"]["storedVersions"], json!(["v1", "v2"]), "{after:#}");
    assert_eq!(generation(&after), g);
    let history = history.until(&after).await;
    assert_eq!(transitions(&history), [t("True", "MigrationRunning", g), t("False", "MigrationFailed", g)]);
    assert_eq!(migrating(&after).expect("the condition")["message"], "The migration has failed", "{after:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_the_crd_rereads_and_still_ends_right() {
    let c = cluster();
    let client = c.client().await;
    let cr = cr("gears", "Gear");
    cr.install_stale(c, &client, N).await;
    let before = stale_crd(&client, &cr).await;
    let g = generation(&before);

    // Another writer changes the CRD (its labels) just before the migrator's 2nd and 3rd status writes: the first
    // ending write and its first retry meet 409.
    let proxy = Proxy::in_front_of_cluster(c);
    let status_path = format!("{CRDS}/{}/status", cr.name());
    let touched = Arc::new(Mutex::new(Vec::new()));
    let (path, seqs, writes) = (status_path.clone(), touched.clone(), AtomicUsize::new(0));
    proxy.add_rule(move |r| {
        if r.path != path || r.method == "GET" {
            return None;
        }
        let n = writes.fetch_add(1, Ordering::SeqCst);
        (n == 1 || n == 2).then(|| {
            seqs.lock().unwrap().push(r.seq);
            Fault::TouchFirst
        })
    });
    let m = cluster_migrator(&proxy.kubeconfig(), &[]);
    let history = History::watch(&client, &before).await;

    let svm = migrate(&m, &cr).await;
    ended_as(&svm, "Succeeded");
    assert_eq!(svm["status"]["migratedObjects"], json!(N), "{svm:#}");
    let records = proxy.records();
    let status_writes: Vec<(&str, u16)> =
        records.iter().filter(|r| r.path == status_path).map(|r| (r.method.as_str(), r.code)).collect();
    assert_eq!(status_writes, [("PUT", 200), ("PUT", 409), ("PUT", 409), ("PUT", 200)], "start, 2 conflicts, end");
    let crd_path = format!("{CRDS}/{}", cr.name());
    let reads = records.iter().filter(|r| r.method == "GET" && r.path == crd_path).count();
    assert_eq!(reads, status_writes.len(), "each attempt reads the CRD again");

    // Every object is in v2, so the trim is right; the other writer's change is kept.
    assert_eq!(cr.stored_counts(c), counts(&cr, 0, N));
    let after = crd(&client, &cr).await;
    assert_eq!(after["status"]["storedVersions"], json!(["v2"]), "{after:#}");
    let last_touch = touched.lock().unwrap().last().map(u64::to_string).expect("two touches");
    assert_eq!(after["metadata"]["labels"]["touched"], last_touch, "{after:#}");
    assert_eq!(generation(&after), g, "a change of labels is no new generation");
    let history = history.until(&after).await;
    assert_eq!(transitions(&history), [t("True", "MigrationRunning", g), t("False", "MigrationSucceeded", g)]);
    // Both touches reached kube-apiserver, each a version of the CRD of its own.
    let mut labels: Vec<String> =
        history.iter().filter_map(|o| o["metadata"]["labels"]["touched"].as_str()).map(String::from).collect();
    labels.dedup();
    let touches: Vec<String> = touched.lock().unwrap().iter().map(u64::to_string).collect();
    assert_eq!(labels, touches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flag_off_leaves_crds_alone() {
    let c = cluster();
    let client = c.client().await;
    let cr = cr("flanges", "Flange");
    cr.install_stale(c, &client, N).await;
    let before = stale_crd(&client, &cr).await;
    // The proxy only watches here: the migrator must not even read a CRD.
    let proxy = Proxy::in_front_of_cluster(c);
    let m = cluster_migrator(&proxy.kubeconfig(), &["--update-crd-stored-versions=false"]);

    let svm = migrate(&m, &cr).await;
    ended_as(&svm, "Succeeded");
    assert_eq!(cr.stored_counts(c), counts(&cr, 0, N), "the migration itself happened");
    let after = crd(&client, &cr).await;
    assert_eq!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"], "never written: {after:#}");
    assert_eq!(after["status"]["storedVersions"], json!(["v1", "v2"]), "{after:#}");
    assert!(migrating(&after).is_none(), "{after:#}");
    let apiextensions: Vec<_> =
        proxy.records().into_iter().filter(|r| r.path.starts_with("/apis/apiextensions.k8s.io/")).collect();
    assert!(apiextensions.is_empty(), "{apiextensions:#?}");
}

//! The migrator end to end against a real kube-apiserver (v1.37.2, with its etcd and kube-controller-manager, no
//! migration-apiserver in the cluster; one cluster shared by this file's tests). Each test installs a custom resource
//! of its own (`common::crs`: served in v1 and v2, stored in v1), creates objects and switches the storage version to
//! v2, so that every stored object is stale; a standalone MIGRATOR migration-apiserver (`--kubeconfig` at
//! kube-apiserver through a fault-injecting proxy of our own, `--disable-trigger`, its migrations in its own store) is
//! asked with kubectl to migrate the resource to v2. Afterwards every object must have been rewritten (a new
//! resourceVersion; etcd holds it as `<group>/v2`) or have been deleted meanwhile. The proxy adds what kube-apiserver
//! does not do on demand (dropped connections, 429 with Retry-After, 5xx, 410 Expired on a continue token, writes
//! racing the migrator's) and records every request the migrator sends, with its arrival time.

mod common;
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use common::proxy::{Fault, Proxy};
use common::status::{condition, is_true};
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const GROUP: &str = "migrator.example.com";
const SVMS: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";
/// Where a migration records how many objects it had handled when it saved its continue token.
const MIGRATED_AT_TOKEN: &str = "migration.k8s.io/migrated-objects-at-continue-token";

/// The bare cluster shared by this file's tests; each test starts its own migrator beside it.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::up(Options { server: false, ..Default::default() }))
}

/// A test's own custom resource, in a namespace named after it, so that the tests can run side by side.
fn cr(plural: &'static str, kind: &'static str) -> Cr {
    Cr { group: GROUP, plural, kind, namespace: Some(plural) }
}

/// The cluster, an admin client of kube-apiserver, and `n` stale objects of `cr` (stored in v1, storage version v2).
async fn stale(cr: &Cr, n: usize) -> (&'static Cluster, kube::Client) {
    let c = cluster();
    let client = c.client().await;
    cr.install_stale(c, &client, n).await;
    (c, client)
}

/// `namespace/name` of the `i`-th object (named as `Cr::create` names it).
fn object_key(cr: &Cr, i: usize) -> String {
    format!("{}/{}", cr.namespace.expect("namespaced"), cr.object_name(i))
}

/// The `i`-th object's path in v2.
fn object_path(cr: &Cr, i: usize) -> String {
    let key = object_key(cr, i);
    let (ns, name) = key.split_once('/').expect("namespace/name");
    format!("/apis/{}/v2/namespaces/{ns}/{}/{name}", cr.group, cr.plural)
}

/// The index in an object path's name (`.../flake-00042` -> 42); None for a collection.
fn index_in(path: &str) -> Option<usize> {
    path.rsplit('/').next()?.rsplit('-').next()?.parse().ok()
}

/// A request for the objects of the test's group (its LISTs and writes), not for the CRD or anything else.
fn is_object_request(cr: &Cr, path: &str) -> bool {
    path.starts_with(&format!("/apis/{}/", cr.group))
}

/// The `resource` label of the migrator's metrics for migrations of `cr` to v2 (a GroupVersionResource as Go prints
/// it).
fn label(cr: &Cr) -> String {
    format!("resource=\"{}/v2, Resource={}\"", cr.group, cr.plural)
}

async fn send(client: &kube::Client, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let ct = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let req = http::Request::builder().method(method).uri(path).header("content-type", ct).body(body).expect("request");
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("transport");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())))
}

/// `namespace/name` -> resourceVersion of every object of `cr`, as kube-apiserver lists them.
async fn resource_versions(client: &kube::Client, cr: &Cr) -> BTreeMap<String, String> {
    let list = cr.api(client, "v2").list(&Default::default()).await.expect("list");
    list.items
        .into_iter()
        .map(|o| {
            let key = format!("{}/{}", o.metadata.namespace.unwrap_or_default(), o.metadata.name.unwrap_or_default());
            (key, o.metadata.resource_version.unwrap_or_default())
        })
        .collect()
}

async fn get_svm(c: &kube::Client, name: &str) -> Value {
    let (code, svm) = send(c, "GET", &format!("{SVMS}/{name}"), None).await;
    assert_eq!(code, 200, "{svm}");
    svm
}

/// Polls the migration until Succeeded or Failed is True.
async fn wait_finished(m: &Server, name: &str, timeout: Duration) -> Value {
    let c = m.client().await;
    let deadline = Instant::now() + timeout;
    loop {
        let svm = get_svm(&c, name).await;
        if is_true(&svm, "Succeeded") || is_true(&svm, "Failed") {
            return svm;
        }
        assert!(Instant::now() < deadline, "migration not finished in {timeout:?}: {svm:#}\n{}", m.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_succeeded(svm: &Value, m: &Server) {
    assert!(is_true(svm, "Succeeded"), "{svm:#}\n{}", m.log());
    assert_eq!(condition(svm, "Succeeded")["reason"], "Completed");
    assert_eq!(condition(svm, "Running")["status"], "False");
    assert!(condition(svm, "Succeeded")["lastUpdateTime"].is_string());
    assert_eq!(svm["status"]["remainingObjectsEstimate"], 0);
}

/// Every object of `before` either has a new resourceVersion or is in `deleted`, and nothing else exists.
fn assert_all_rewritten(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    deleted: &HashSet<String>,
) {
    for (k, rv) in before {
        match after.get(k) {
            Some(now) => assert_ne!(now, rv, "{k} was not rewritten"),
            None => assert!(deleted.contains(k), "{k} disappeared"),
        }
    }
    for k in deleted {
        assert!(!after.contains_key(k), "{k} was deleted but exists");
    }
}

/// etcd holds `expected` objects of `cr`, each one as v2.
fn assert_all_stored_in_v2(c: &Cluster, cr: &Cr, expected: usize) {
    let stored = cr.stored(c);
    assert_eq!(stored.len(), expected, "objects in etcd");
    let v2 = format!("{}/v2", cr.group);
    let stale: Vec<_> = stored.iter().filter(|(_, v)| **v != v2).collect();
    assert!(stale.is_empty(), "{} objects still stored in an old version: {stale:?}", stale.len());
}

async fn metrics(m: &Server) -> String {
    let (code, body) = send(&m.client().await, "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    body.as_str().unwrap_or_default().to_string()
}

/// The value of the sample whose line starts with `prefix` (name and labels).
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

/// Waits until the sample `prefix` has `value` (the migrator updates its metrics right after its own writes).
async fn wait_metric(m: &Server, prefix: &str, value: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(m).await;
        if sample(&text, prefix) == Some(value) {
            return text;
        }
        assert!(Instant::now() < deadline, "{prefix} is not {value}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// (b) A flaky target: dropped connections (before and after the write reached kube-apiserver), 429 with
/// Retry-After, 500, 503 and 504, 410 Expired on LISTs, plus concurrent deletes and writes. The migration succeeds;
/// every object is rewritten, or was deleted meanwhile, and etcd holds every one as v2.
///
/// The 410s are the proxy's: kube-apiserver's continue tokens expire only when etcd is compacted (every 5 minutes,
/// to the revision of 5 minutes before), which would not happen within a test. The stand-in target this test used to
/// have expired them on its own (a short watch history, no list snapshots); compacting the shared etcd on demand
/// would expire the other tests' tokens too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_target_migration_succeeds_and_rewrites_everything() {
    const N: usize = 300;
    let cr = cr("flakes", "Flake");
    let (c, client) = stale(&cr, N).await;
    let before = resource_versions(&client, &cr).await;
    assert_eq!(before.len(), N);
    let proxy = Proxy::in_front_of_cluster(c);

    // Per object, a fault on its first write attempt(s) only, so that every object succeeds within the attempts.
    let mut attempts: HashMap<usize, u32> = HashMap::new();
    proxy.add_rule(move |r| {
        if !r.is_patch() {
            return None;
        }
        let i = index_in(&r.path)?;
        let n = attempts.entry(i).or_default();
        *n += 1;
        match (i % 20, *n) {
            (1, 1) | (11, 1) => Some(Fault::Drop),
            (2, 1) => Some(Fault::DropAfterForward), // the retry gets 409: skipped
            (3, 1) => Some(Fault::Status { code: 500, retry_after: None }),
            (4, 1) | (4, 2) => Some(Fault::Status { code: 503, retry_after: None }),
            (5, 1) => Some(Fault::Status { code: 504, retry_after: None }),
            (6, 1) if i % 60 == 6 => Some(Fault::Status { code: 429, retry_after: Some(1) }),
            (7, 1) => Some(Fault::DeleteFirst), // 404: skipped
            (8, 1) => Some(Fault::TouchFirst),  // 409: skipped
            _ => None,
        }
    });
    // LISTs: the second one fails with 503, the third one's connection drops, and every continue token is
    // answered once with 410 Expired (metadata.continue carrying the token to resume from).
    let mut lists = 0;
    let mut expired: HashSet<String> = HashSet::new();
    proxy.add_rule(move |r| {
        if !r.is_list() {
            return None;
        }
        lists += 1;
        match lists {
            2 => return Some(Fault::Status { code: 503, retry_after: None }),
            3 => return Some(Fault::Drop),
            _ => {}
        }
        let token = r.param("continue")?;
        expired.insert(token).then_some(Fault::Expired)
    });

    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-chunk-size", "40"]);
    let started = Instant::now();
    let name = request_cr_migration(&m, &cr);

    // Meanwhile, a user rewrites and deletes objects directly on kube-apiserver (paced, to spread them over the
    // migration; the assertions hold wherever they land).
    let writer = {
        let (client, cr) = (client.clone(), cr.clone());
        tokio::spawn(async move {
            let mut deleted = HashSet::new();
            for round in 0..40 {
                let i = (round * 37 + 13) % N;
                if i % 20 == 7 {
                    continue; // the proxy deletes those
                }
                let path = object_path(&cr, i);
                if round % 4 == 0 {
                    let (code, _) = send(&client, "DELETE", &path, None).await;
                    assert!(code == 200 || code == 404, "delete: {code}");
                    deleted.insert(object_key(&cr, i));
                } else {
                    let labels = json!({"metadata": {"labels": {"user": round.to_string()}}});
                    let (code, _) = send(&client, "PATCH", &path, Some(labels)).await;
                    assert!(code == 200 || code == 404, "patch: {code}");
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            deleted
        })
    };
    let svm = wait_finished(&m, &name, Duration::from_secs(120)).await;
    let elapsed = started.elapsed();
    assert_succeeded(&svm, &m);
    let mut deleted = writer.await.expect("writer");
    deleted.extend((0..N).filter(|i| i % 20 == 7).map(|i| object_key(&cr, i)));

    let records = proxy.records();
    let patches: Vec<_> = records.iter().filter(|r| r.method == "PATCH").collect();
    let count = |code: u16| patches.iter().filter(|r| r.code == code && !r.fault).count();
    assert!(count(409) >= N / 20, "409s from kube-apiserver: {}", count(409));
    assert!(count(404) >= N / 20, "404s from kube-apiserver: {}", count(404));
    assert!(records.iter().any(|r| r.code == 410 && r.fault), "injected 410");
    eprintln!(
        "flaky migration: {N} objects in {elapsed:?}, {} requests ({} faults injected), {} x 409, {} x 404, {} LISTs \
         ({} real 410s)",
        records.len(),
        records.iter().filter(|r| r.fault).count(),
        count(409),
        count(404),
        records.iter().filter(|r| r.method == "GET" && is_object_request(&cr, &r.path)).count(),
        records.iter().filter(|r| r.code == 410 && !r.fault).count(),
    );
    assert!(svm["status"]["migratedObjects"].as_i64().unwrap_or(0) >= (N - deleted.len()) as i64, "{svm:#}");
    let label = label(&cr);
    let succeeded = format!("storage_migrator_core_migrator_migrations{{{label},status=\"Succeeded\"}}");
    let text = wait_metric(&m, &succeeded, 1.0).await;
    let migrated = sample(&text, &format!("storage_migrator_core_migrator_migrated_objects{{{label}}}"));
    assert!(migrated >= Some((N - deleted.len()) as f64), "{text}");
    assert_eq!(sample(&text, &format!("storage_migrator_core_migrator_remaining_objects{{{label}}}")), Some(0.0));

    let after = resource_versions(&client, &cr).await;
    assert_all_rewritten(&before, &after, &deleted);
    assert_all_stored_in_v2(c, &cr, N - deleted.len());
    // Every object in v2, through all those faults: the migrator trimmed the CRD's storedVersions.
    assert_eq!(cr.crd_json(c)["status"]["storedVersions"], json!(["v2"]));
}

/// (c) kill -9 of the migrating server mid-migration: after the restart it resumes from spec.continueToken (its
/// first LIST carries the saved token) and succeeds; no object is skipped, and only the objects written past the
/// saved token are written again (409: skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_the_saved_token_after_kill_9() {
    const N: usize = 200;
    const CHUNK: usize = 10;
    /// Writes that reach kube-apiserver before the kill: four and a half chunks' worth.
    const LET_THROUGH: usize = 45;
    let cr = cr("survivors", "Survivor");
    let (c, client) = stale(&cr, N).await;
    let before = resource_versions(&client, &cr).await;
    let proxy = Proxy::in_front_of_cluster(c);
    // Until the kill the proxy lets LET_THROUGH writes through and drops every later one (the migrator retries
    // them, in vain), so that the kill lands in the middle of a chunk with a token saved, whatever the pace.
    let holding = Arc::new(AtomicBool::new(true));
    let mut writes = 0;
    let hold = holding.clone();
    proxy.add_rule(move |r| {
        if !r.is_patch() || !hold.load(Ordering::SeqCst) {
            return None;
        }
        writes += 1;
        (writes > LET_THROUGH).then_some(Fault::Drop)
    });
    let mut m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-chunk-size", "10"]);
    let name = request_cr_migration(&m, &cr);
    let written: HashSet<usize> = eventually_async("writes held at the proxy", Duration::from_secs(60), || async {
        let records = proxy.records();
        let patches = records.iter().filter(|r| r.method == "PATCH");
        let forwarded: Vec<_> = patches.clone().filter(|r| !r.fault).collect();
        let held = patches.clone().any(|r| r.fault);
        (forwarded.len() == LET_THROUGH && held).then(|| {
            assert!(forwarded.iter().all(|r| r.code == 200), "{forwarded:?}");
            forwarded.iter().filter_map(|r| index_in(&r.path)).collect()
        })
    })
    .await;
    // Writes run in parallel: the token saved is the one after the chunks written whole.
    let at_token = (0..N).take_while(|i| written.contains(i)).count() / CHUNK * CHUNK;
    let mc = m.client().await;
    let at_kill = eventually_async("the token after the chunks written whole", Duration::from_secs(30), || async {
        let svm = get_svm(&mc, &name).await;
        let saved = svm["metadata"]["annotations"][MIGRATED_AT_TOKEN].as_str()?.parse::<usize>().ok()?;
        (saved == at_token && svm["spec"]["continueToken"].is_string()).then_some(svm)
    })
    .await;
    assert!(is_true(&at_kill, "Running"), "{at_kill:#}");
    let token = at_kill["spec"]["continueToken"].as_str().expect("a saved token").to_string();
    m.kill9();
    let killed_at = Instant::now();
    holding.store(false, Ordering::SeqCst);

    m.restart();
    let svm = wait_finished(&m, &name, Duration::from_secs(60)).await;
    assert_succeeded(&svm, &m);
    // The count resumed from the one saved with the token: every object counted once.
    assert_eq!(svm["status"]["migratedObjects"], N as i64, "{svm:#}");
    let records = proxy.records();
    let first = records
        .iter()
        .find(|r| r.at > killed_at && r.method == "GET" && r.path == cr.path("v2"))
        .expect("a LIST after the restart");
    let sent =
        form_urlencoded::parse(first.query.as_bytes()).find(|(k, _)| k == "continue").map(|(_, v)| v.into_owned());
    assert_eq!(sent.as_deref(), Some(token.as_str()), "the first LIST after the restart: {}", first.query);
    assert!(m.log().contains("resumed_from_token=true"), "{}", m.log());
    // Each object was written once; after the restart exactly those written past the token before the kill came
    // again, listed at the token's snapshot with their old resourceVersions: 409, skipped.
    let patches: Vec<_> = records.iter().filter(|r| r.method == "PATCH" && !r.fault).collect();
    let rewritten: Vec<_> = patches.iter().filter(|r| r.code == 200).filter_map(|r| index_in(&r.path)).collect();
    assert_eq!(rewritten.len(), N, "writes that rewrote an object");
    assert_eq!(rewritten.iter().collect::<HashSet<_>>().len(), N, "objects rewritten");
    let redone: HashSet<usize> =
        patches.iter().filter(|r| r.at > killed_at && r.code == 409).filter_map(|r| index_in(&r.path)).collect();
    let past_token: HashSet<usize> = written.iter().copied().filter(|i| *i >= at_token).collect();
    assert_eq!(redone, past_token, "written again after the restart");
    eprintln!("kill -9 with {at_token} objects at the saved token; {} written again (409)", redone.len());
    let after = resource_versions(&client, &cr).await;
    assert_all_rewritten(&before, &after, &HashSet::new());
    assert_all_stored_in_v2(c, &cr, N);
}

/// (d) A permanent error for one object's write (403, then 422 in a second migration) fails the migration quickly,
/// with a message naming the object and the error; upstream retries these forever. A third migration without the
/// fault succeeds. The metrics count both outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_fail_the_migration_quickly_with_a_clear_message() {
    const N: usize = 60;
    let cr = cr("refusals", "Refusal");
    let (c, _) = stale(&cr, N).await;
    let proxy = Proxy::in_front_of_cluster(c);
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-chunk-size", "20"]);

    for (code, victim) in [(403u16, 31usize), (422, 44)] {
        proxy.clear_rules();
        proxy.add_rule(move |r| {
            (r.is_patch() && index_in(&r.path) == Some(victim)).then_some(Fault::Status { code, retry_after: None })
        });
        let started = Instant::now();
        let name = request_cr_migration(&m, &cr);
        let svm = wait_finished(&m, &name, Duration::from_secs(30)).await;
        let took = started.elapsed();
        assert!(is_true(&svm, "Failed"), "{svm:#}");
        // Retrying would take 12.7 s before the migration even stepped back (8 attempts from 100 ms, doubling).
        assert!(took < Duration::from_secs(10), "failing took {took:?}");
        let failed = condition(&svm, "Failed");
        assert_eq!(failed["reason"], "MigrationFailed");
        assert_eq!(condition(&svm, "Running")["status"], "False");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(message.contains(&object_key(&cr, victim)), "{message}");
        assert!(message.contains(&code.to_string()), "{message}");
        assert!(message.contains("injected by the fault proxy"), "the target's message is quoted: {message}");
        // Failed at once: exactly one write for the victim.
        let victim_path = object_path(&cr, victim);
        let victim_writes = proxy.records().iter().filter(|r| r.method == "PATCH" && r.path == victim_path).count();
        assert_eq!(victim_writes, 1, "{code} is not retried");
        eprintln!("{code}: failed in {took:?}: {message}");
        proxy.clear_records();
    }
    proxy.clear_rules();
    let name = request_cr_migration(&m, &cr);
    assert_succeeded(&wait_finished(&m, &name, Duration::from_secs(30)).await, &m);
    assert_all_stored_in_v2(c, &cr, N);

    let label = label(&cr);
    for (status, n) in [("Failed", 2.0), ("Succeeded", 1.0)] {
        let line = format!("storage_migrator_core_migrator_migrations{{{label},status=\"{status}\"}}");
        wait_metric(&m, &line, n).await;
    }
    for gauge in ["pending_migrations", "running_migrations"] {
        wait_metric(&m, &format!("migration_apiserver_{gauge}{{{label}}}"), 0.0).await;
    }
    // A resource kube-apiserver does not serve fails with a clear message too.
    let manifest = "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  name: nothing-here\nspec:\n  resource:\n    group: example.com\n    version: v1\n    resource: widgets\n";
    assert!(m.kubectl_stdin(&["create", "-f", "-"], manifest).status.success());
    let svm = wait_finished(&m, "nothing-here", Duration::from_secs(30)).await;
    let message = condition(&svm, "Failed")["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("404") && message.contains("widgets"), "{message}");
    eprintln!("unserved: {message}");
}

/// (e) `--migration-qps 20 --migration-burst 5`: counted at the proxy, no window of the run holds more than
/// burst + qps * t requests (LISTs and writes alike), and the run takes about as long as the limit implies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qps_limit_holds_at_the_target() {
    const N: usize = 150;
    const QPS: f64 = 20.0;
    const BURST: f64 = 5.0;
    let cr = cr("throttles", "Throttle");
    let (c, _) = stale(&cr, N).await;
    let proxy = Proxy::in_front_of_cluster(c);
    let m = cluster_migrator(
        &proxy.kubeconfig(),
        &["--migration-qps", "20", "--migration-burst", "5", "--migration-chunk-size", "50"],
    );
    let name = request_cr_migration(&m, &cr);
    let svm = wait_finished(&m, &name, Duration::from_secs(60)).await;
    assert_succeeded(&svm, &m);
    // The migration's requests (its LISTs and writes of the objects). The rest through the proxy (the CRD's
    // StorageMigrating condition and storedVersions) is not rate limited.
    let records: Vec<_> = proxy.records().into_iter().filter(|r| is_object_request(&cr, &r.path)).collect();
    let n = records.len();
    assert!(n > N, "{n} requests");
    let t = |i: usize| records[i].at.duration_since(records[0].at).as_secs_f64();
    let mut worst = f64::MIN;
    for i in 0..n {
        for j in i..n {
            let excess = (j - i + 1) as f64 - (BURST + QPS * (t(j) - t(i)));
            worst = worst.max(excess);
        }
    }
    // Arrival times at the proxy carry a little network and scheduling jitter beyond the limiter's grants.
    assert!(worst <= 2.0, "a window exceeded burst + qps*t by {worst:.2} requests");
    let span = t(n - 1);
    let expected = (n as f64 - BURST) / QPS;
    assert!(span >= expected - 0.3, "{n} requests in {span:.2}s: faster than {QPS} qps allows ({expected:.2}s)");
    assert!(span <= expected * 1.25 + 1.0, "{n} requests in {span:.2}s, expected about {expected:.2}s");
    eprintln!("qps limit: {n} requests in {span:.2}s (expected {expected:.2}s), worst window excess {worst:.2}");
}

/// The trigger supersedes an unfinished migration by marking it Failed (reason Superseded) through /status: the
/// migrator stops sending requests for it and never overwrites the terminal condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_migration_is_left_alone() {
    const N: usize = 120;
    let cr = cr("leftovers", "Leftover");
    let (c, _) = stale(&cr, N).await;
    let proxy = Proxy::in_front_of_cluster(c);
    let m = cluster_migrator(
        &proxy.kubeconfig(),
        &["--migration-qps", "30", "--migration-burst", "1", "--migration-chunk-size", "10"],
    );
    let name = request_cr_migration(&m, &cr);
    let mc = m.client().await;
    let mut svm = eventually_async("the migration's first chunk", Duration::from_secs(30), || async {
        let svm = get_svm(&mc, &name).await;
        (svm["status"]["migratedObjects"].as_i64().unwrap_or(0) >= 10).then_some(svm)
    })
    .await;
    // What the trigger does: Running False, Failed True reason Superseded, via /status (CAS on resourceVersion).
    let now = "2025-01-01T00:00:00Z";
    loop {
        let mut conditions: Vec<Value> = svm["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["type"] != "Running")
            .collect();
        conditions.push(json!({"type": "Running", "status": "False", "reason": "Superseded", "lastUpdateTime": now}));
        conditions.push(json!({"type": "Failed", "status": "True", "reason": "Superseded",
            "message": "superseded by a newer migration", "lastUpdateTime": now}));
        svm["status"]["conditions"] = Value::Array(conditions);
        let (code, saved) = send(&mc, "PUT", &format!("{SVMS}/{name}/status"), Some(svm.clone())).await;
        match code {
            200 => break,
            409 => svm = get_svm(&mc, &name).await,
            _ => panic!("{code}: {saved:#}"),
        }
    }
    let stopped = format!("migration stopped migration={name} ");
    eventually("the migrator to stop the migration", Duration::from_secs(30), || {
        m.log().contains(&stopped).then_some(())
    });
    let stopped_at = Instant::now();
    // Nothing can announce that nothing more comes: watched for 1.5 s, in which the worker at 30 qps would have sent
    // some 45 requests had it not stopped.
    while stopped_at.elapsed() < Duration::from_millis(1500) {
        let late: Vec<_> = proxy.records().into_iter().filter(|r| r.at > stopped_at).collect();
        assert!(late.is_empty(), "requests to kube-apiserver after the migration stopped: {late:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let svm = get_svm(&mc, &name).await;
    assert!(is_true(&svm, "Failed") && !is_true(&svm, "Succeeded"), "{svm:#}");
    assert_eq!(condition(&svm, "Failed")["reason"], "Superseded");
    assert_eq!(condition(&svm, "Failed")["message"], "superseded by a newer migration");
    let writes = proxy.records().iter().filter(|r| r.method == "PATCH" && is_object_request(&cr, &r.path)).count();
    assert!(writes < N, "it stopped early: {writes} writes");
    // Objects were left stale: the migration did not end its work somewhere else.
    let counts = cr.stored_counts(c);
    assert!(counts.get(&format!("{GROUP}/v1")).is_some_and(|n| *n > 0), "{counts:?}");
}

/// Peak RSS (VmHWM, KiB) of the server process running in `dir`.
fn peak_rss_kib(dir: &std::path::Path) -> Option<u64> {
    let needle = dir.to_str()?;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("serve") && cmdline.contains(needle) {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}

/// Throughput at unlimited QPS against kube-apiserver (no proxy). Not a timed test: run it with
/// `cargo test --release --test migrator -- --ignored --nocapture throughput` (MIGRATOR_THROUGHPUT_N objects,
/// default 20,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput() {
    let n: usize = std::env::var("MIGRATOR_THROUGHPUT_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let cr = cr("bulks", "Bulk");
    let created = Instant::now();
    let (c, client) = stale(&cr, n).await;
    eprintln!("created {n} objects in {:?}", created.elapsed());
    let m = cluster_migrator(&c.admin(), &["--migration-qps", "0"]);
    let rss_idle = peak_rss_kib(&m.dir);
    let started = Instant::now();
    let name = request_cr_migration(&m, &cr);
    let svm = wait_finished(&m, &name, Duration::from_secs(600)).await;
    let secs = started.elapsed().as_secs_f64();
    assert_succeeded(&svm, &m);
    assert_eq!(svm["status"]["migratedObjects"], n);
    assert_all_stored_in_v2(c, &cr, n);
    eprintln!(
        "migrated {n} objects in {secs:.2}s: {:.0} objects/s; migrator peak RSS {:?} KiB (idle {:?} KiB)",
        n as f64 / secs,
        peak_rss_kib(&m.dir),
        rss_idle
    );
    // Where the time went in kube-apiserver: its own request latency metrics.
    let (code, text) = send(&client, "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    let text = text.as_str().unwrap_or_default();
    for verb in ["LIST", "PATCH"] {
        let total = |what: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(&format!("apiserver_request_duration_seconds_{what}{{")))
                .filter(|l| {
                    l.contains(&format!("verb=\"{verb}\"")) && l.contains(&format!("resource=\"{}\"", cr.plural))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let (sum, count) = (total("sum"), total("count"));
        eprintln!("kube-apiserver {verb}: {count} requests, mean {:.1} ms", 1000.0 * sum / count.max(1.0));
    }
}

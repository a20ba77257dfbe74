//! The migrator end to end, no mocks: a TARGET migration-apiserver holds ShootStates stored as v1alpha1 and is
//! restarted with storage version v1beta1, so every stored object is stale; a MIGRATOR migration-apiserver
//! (`--kubeconfig` at the target, through a fault-injecting proxy of our own, `--disable-trigger`) is asked with
//! kubectl to migrate `shootstates.core.gardener.cloud`. Afterwards every object must have been rewritten (new
//! resourceVersion; `storage inspect` shows v1beta1) or have been deleted meanwhile.

mod common;
use common::proxy::{Fault, Proxy, RequestInfo};
use common::shootstates::stale_shootstates_in;
use common::status::{condition, is_true};
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

const ALL: &str = "/apis/core.gardener.cloud/v1beta1/shootstates";
const SVMS: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";

async fn send(client: &kube::Client, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let ct = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let req = http::Request::builder().method(method).uri(path).header("content-type", ct).body(body).expect("request");
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("transport");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())))
}

/// `ns-<i % namespaces>/s-<i:05>`.
fn object(i: usize, namespaces: usize) -> (String, String) {
    (format!("ns-{}", i % namespaces), format!("s-{i:05}"))
}

/// The index in an object's name (`s-00042` -> 42).
fn index_of(r: &RequestInfo) -> Option<usize> {
    r.object()?.rsplit("/s-").next()?.parse().ok()
}

/// `namespace/name` -> resourceVersion of every ShootState.
async fn resource_versions(c: &kube::Client) -> BTreeMap<String, String> {
    let (code, list) = send(c, "GET", ALL, None).await;
    assert_eq!(code, 200, "{list}");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            let m = &o["metadata"];
            (
                format!("{}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or("")),
                m["resourceVersion"].as_str().unwrap_or("").to_string(),
            )
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

fn assert_all_v1beta1(stored: &BTreeMap<String, String>, expected: usize) {
    assert_eq!(stored.len(), expected, "stored objects");
    let stale: Vec<_> = stored.iter().filter(|(_, v)| *v != "core.gardener.cloud/v1beta1").collect();
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
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics(m).await;
        if sample(&text, prefix) == Some(value) {
            return text;
        }
        assert!(Instant::now() < deadline, "{prefix} is not {value}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const LABEL: &str = "resource=\"core.gardener.cloud/v1beta1, Resource=shootstates\"";

/// (b) A flaky target: dropped connections (before and after the write reached the target), 429 with Retry-After,
/// 500 and 503, 410 on LISTs (injected by the proxy, and real ones: the target keeps little history and no list
/// snapshots, so the migration's own writes expire its continue tokens), plus concurrent deletes and writes. The migration succeeds;
/// every object is rewritten, or was deleted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_target_migration_succeeds_and_rewrites_everything() {
    const N: usize = 300;
    let mut target =
        stale_shootstates_in(N, |i| object(i, 3).0, &["--watch-history", "100", "--list-snapshot-timeout", "0"]).await;
    let tc = target.client().await;
    let before = resource_versions(&tc).await;
    assert_eq!(before.len(), N);
    let proxy = Proxy::start(&target);

    // Per object, a fault on its first write attempt(s) only, so that every object succeeds within the attempts.
    let mut attempts: HashMap<usize, u32> = HashMap::new();
    proxy.add_rule(move |r| {
        if !r.is_patch() {
            return None;
        }
        let i = index_of(r)?;
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

    let m = migrating_server(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-chunk-size", "40"]);
    let started = Instant::now();
    let name = request_shootstate_migration(&m);

    // Meanwhile, a user rewrites and deletes objects directly on the target.
    let writer = {
        let tc = tc.clone();
        tokio::spawn(async move {
            let mut deleted = HashSet::new();
            for round in 0..40 {
                let i = (round * 37 + 13) % N;
                if i % 20 == 7 {
                    continue; // the proxy deletes those
                }
                let (ns, name) = object(i, 3);
                let path = format!("/apis/core.gardener.cloud/v1beta1/namespaces/{ns}/shootstates/{name}");
                if round % 4 == 0 {
                    let (code, _) = send(&tc, "DELETE", &path, None).await;
                    assert!(code == 200 || code == 404, "delete: {code}");
                    deleted.insert(format!("{ns}/{name}"));
                } else {
                    let (code, _) =
                        send(&tc, "PATCH", &path, Some(json!({"metadata": {"labels": {"user": round.to_string()}}})))
                            .await;
                    assert!(code == 200 || code == 404, "patch: {code}");
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            deleted
        })
    };
    let svm = wait_finished(&m, &name, Duration::from_secs(40)).await;
    let elapsed = started.elapsed();
    assert_succeeded(&svm, &m);
    let mut deleted = writer.await.expect("writer");
    deleted.extend((0..N).filter(|i| i % 20 == 7).map(|i| {
        let (ns, name) = object(i, 3);
        format!("{ns}/{name}")
    }));

    let records = proxy.records();
    let patches: Vec<_> = records.iter().filter(|r| r.method == "PATCH").collect();
    let count = |code: u16| patches.iter().filter(|r| r.code == code && !r.fault).count();
    assert!(count(409) >= N / 20, "409s from the target: {}", count(409));
    assert!(count(404) >= N / 20, "404s from the target: {}", count(404));
    assert!(records.iter().any(|r| r.code == 410 && r.fault), "injected 410");
    eprintln!(
        "flaky migration: {N} objects in {elapsed:?}, {} requests ({} faults injected), {} x 409, {} x 404, {} LISTs \
         ({} real 410s)",
        records.len(),
        records.iter().filter(|r| r.fault).count(),
        count(409),
        count(404),
        records.iter().filter(|r| r.method == "GET").count(),
        records.iter().filter(|r| r.code == 410 && !r.fault).count(),
    );
    assert!(svm["status"]["migratedObjects"].as_i64().unwrap_or(0) >= (N - deleted.len()) as i64, "{svm:#}");
    let succeeded = format!("storage_migrator_core_migrator_migrations{{{LABEL},status=\"Succeeded\"}}");
    let text = wait_metric(&m, &succeeded, 1.0).await;
    let migrated = sample(&text, &format!("storage_migrator_core_migrator_migrated_objects{{{LABEL}}}"));
    assert!(migrated >= Some((N - deleted.len()) as f64), "{text}");
    assert_eq!(sample(&text, &format!("storage_migrator_core_migrator_remaining_objects{{{LABEL}}}")), Some(0.0));

    let after = resource_versions(&tc).await;
    assert_all_rewritten(&before, &after, &deleted);
    let stored = target.stored_shootstate_versions();
    assert_all_v1beta1(&stored, N - deleted.len());
}

/// (c) kill -9 of the migrating server mid-migration: after the restart it resumes from spec.continueToken (its
/// first LIST carries the saved token) and succeeds; no object is skipped and at most a chunk is redone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_the_saved_token_after_kill_9() {
    const N: usize = 200;
    const CHUNK: usize = 10;
    let mut target = stale_shootstates_in(N, |i| object(i, 2).0, &[]).await;
    let tc = target.client().await;
    let before = resource_versions(&tc).await;
    let proxy = Proxy::start(&target);
    let flags = ["--migration-qps", "50", "--migration-burst", "5", "--migration-chunk-size", "10"];
    let mut m = migrating_server(&proxy.kubeconfig(), &flags);
    let name = request_shootstate_migration(&m);
    let mc = m.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let at_kill = loop {
        let svm = get_svm(&mc, &name).await;
        assert!(!is_true(&svm, "Succeeded"), "finished before the kill; slow it down");
        if svm["status"]["migratedObjects"].as_i64().unwrap_or(0) >= 40 {
            break svm;
        }
        assert!(Instant::now() < deadline, "no progress: {svm:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Into the next chunk: some of its objects are rewritten, its token is not saved yet.
    tokio::time::sleep(Duration::from_millis(110)).await;
    m.kill9();
    let killed_at = Instant::now();
    let token = at_kill["spec"]["continueToken"].as_str().expect("a saved token").to_string();
    assert!(is_true(&at_kill, "Running"), "{at_kill:#}");
    tokio::time::sleep(Duration::from_millis(300)).await;

    m.restart();
    let svm = wait_finished(&m, &name, Duration::from_secs(30)).await;
    assert_succeeded(&svm, &m);
    // The count resumed from the one saved with the token: every object counted once.
    assert_eq!(svm["status"]["migratedObjects"], N as i64, "{svm:#}");
    let records = proxy.records();
    // LISTs only: at start the server also reads /apis/coordination.k8s.io/v1 (is there a Lease to elect with?).
    let resumed: Vec<_> =
        records.iter().filter(|r| r.at > killed_at && r.method == "GET" && r.path.ends_with("/shootstates")).collect();
    let first = resumed.first().expect("a LIST after the restart");
    let sent =
        form_urlencoded::parse(first.query.as_bytes()).find(|(k, _)| k == "continue").map(|(_, v)| v.into_owned());
    // The token at the kill, or a later one saved between our read and the kill.
    let saved_later = sent.as_deref() != Some(token.as_str());
    assert!(sent.is_some(), "the first LIST after the restart starts over: {}", first.query);
    assert!(m.log().contains("migration resumed"), "{}", m.log());
    let patches = records.iter().filter(|r| r.method == "PATCH").count();
    assert!(patches >= N, "{patches} writes for {N} objects");
    assert!(patches <= N + 3 * CHUNK, "{patches} writes for {N} objects: more than the interrupted chunk was redone");
    let redone = records.iter().filter(|r| r.at > killed_at && r.method == "PATCH" && r.code == 409).count();
    eprintln!(
        "kill -9 at {} migrated; resumed with {} token; {patches} writes for {N} objects ({redone} redone: 409)",
        at_kill["status"]["migratedObjects"],
        if saved_later { "a later" } else { "the same" }
    );
    let after = resource_versions(&tc).await;
    assert_all_rewritten(&before, &after, &HashSet::new());
    assert_all_v1beta1(&target.stored_shootstate_versions(), N);
}

/// (d) A permanent error for one object's write (403, then 422 in a second migration) fails the migration quickly,
/// with a message naming the object and the error; upstream retries these forever. A third migration without the
/// fault succeeds. The metrics count both outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_fail_the_migration_quickly_with_a_clear_message() {
    const N: usize = 60;
    let target = stale_shootstates_in(N, |i| object(i, 2).0, &[]).await;
    let proxy = Proxy::start(&target);
    let m = migrating_server(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-chunk-size", "20"]);

    for (code, victim) in [(403u16, 31usize), (422, 44)] {
        proxy.clear_rules();
        proxy.add_rule(move |r| {
            (r.is_patch() && index_of(r) == Some(victim)).then_some(Fault::Status { code, retry_after: None })
        });
        let started = Instant::now();
        let name = request_shootstate_migration(&m);
        let svm = wait_finished(&m, &name, Duration::from_secs(15)).await;
        let took = started.elapsed();
        assert!(is_true(&svm, "Failed"), "{svm:#}");
        assert!(took < Duration::from_secs(10), "failing took {took:?}");
        let failed = condition(&svm, "Failed");
        assert_eq!(failed["reason"], "MigrationFailed");
        assert_eq!(condition(&svm, "Running")["status"], "False");
        let message = failed["message"].as_str().unwrap_or_default();
        let (ns, obj) = object(victim, 2);
        assert!(message.contains(&format!("{ns}/{obj}")), "{message}");
        assert!(message.contains(&code.to_string()), "{message}");
        assert!(message.contains("injected by the fault proxy"), "the target's message is quoted: {message}");
        // Failed at once: exactly one write for the victim.
        let victim_writes = proxy
            .records()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with(&format!("/{ns}/shootstates/{obj}")))
            .count();
        assert_eq!(victim_writes, 1, "{code} is not retried");
        eprintln!("{code}: failed in {took:?}: {message}");
        proxy.clear_records();
    }
    proxy.clear_rules();
    let name = request_shootstate_migration(&m);
    assert_succeeded(&wait_finished(&m, &name, Duration::from_secs(15)).await, &m);

    for (status, n) in [("Failed", 2.0), ("Succeeded", 1.0)] {
        let line = format!("storage_migrator_core_migrator_migrations{{{LABEL},status=\"{status}\"}}");
        wait_metric(&m, &line, n).await;
    }
    for gauge in ["pending_migrations", "running_migrations"] {
        wait_metric(&m, &format!("migration_apiserver_{gauge}{{{LABEL}}}"), 0.0).await;
    }
    // A resource the target does not serve fails with a clear message too.
    let manifest = "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  name: nothing-here\nspec:\n  resource:\n    group: example.com\n    version: v1\n    resource: widgets\n";
    assert!(m.kubectl_stdin(&["create", "-f", "-"], manifest).status.success());
    let svm = wait_finished(&m, "nothing-here", Duration::from_secs(10)).await;
    let message = condition(&svm, "Failed")["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("404") && message.contains("widgets"), "{message}");
}

/// (e) `--migration-qps 20 --migration-burst 5`: counted at the proxy, no window of the run holds more than
/// burst + qps * t requests (LISTs and writes alike), and the run takes about as long as the limit implies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qps_limit_holds_at_the_target() {
    const N: usize = 150;
    const QPS: f64 = 20.0;
    const BURST: f64 = 5.0;
    let target = stale_shootstates_in(N, |i| object(i, 3).0, &[]).await;
    let proxy = Proxy::start(&target);
    let m = migrating_server(
        &proxy.kubeconfig(),
        &["--migration-qps", "20", "--migration-burst", "5", "--migration-chunk-size", "50"],
    );
    let name = request_shootstate_migration(&m);
    let svm = wait_finished(&m, &name, Duration::from_secs(30)).await;
    assert_succeeded(&svm, &m);
    // The migration's requests (its lists and writes of ShootStates): the rest through the proxy (Events about it,
    // the triggers' discovery reads, the cluster check) is not the migrator's and not rate limited.
    let records: Vec<_> = proxy.records().into_iter().filter(|r| r.path.contains("/shootstates")).collect();
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
    let target = stale_shootstates_in(N, |i| object(i, 2).0, &[]).await;
    let proxy = Proxy::start(&target);
    let m = migrating_server(
        &proxy.kubeconfig(),
        &["--migration-qps", "30", "--migration-burst", "1", "--migration-chunk-size", "10"],
    );
    let name = request_shootstate_migration(&m);
    let mc = m.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut svm = loop {
        let svm = get_svm(&mc, &name).await;
        if svm["status"]["migratedObjects"].as_i64().unwrap_or(0) >= 10 {
            break svm;
        }
        assert!(Instant::now() < deadline, "no progress: {svm:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
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
    let superseded_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let records = proxy.records();
    let late = records.iter().filter(|r| r.at > superseded_at + Duration::from_millis(500)).count();
    assert_eq!(late, 0, "requests to the target after the migration was superseded");
    let svm = get_svm(&mc, &name).await;
    assert!(is_true(&svm, "Failed") && !is_true(&svm, "Succeeded"), "{svm:#}");
    assert_eq!(condition(&svm, "Failed")["reason"], "Superseded");
    assert!((records.iter().filter(|r| r.method == "PATCH").count()) < N, "it stopped early");
    assert!(m.log().contains("migration stopped"), "{}", m.log());
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

/// Throughput at unlimited QPS against another migration-apiserver over TLS (no proxy). Not a timed test: run it
/// with `cargo test --release --test migrator -- --ignored --nocapture throughput` (MIGRATOR_THROUGHPUT_N objects,
/// default 20,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput() {
    let n: usize = std::env::var("MIGRATOR_THROUGHPUT_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let created = Instant::now();
    let target = stale_shootstates_in(n, |i| object(i, 10).0, &[]).await;
    eprintln!("created {n} objects in {:?}", created.elapsed());
    let m = migrating_server(&target.kubeconfig(), &["--migration-qps", "0"]);
    let rss_idle = peak_rss_kib(&m.dir);
    let started = Instant::now();
    let name = request_shootstate_migration(&m);
    let svm = wait_finished(&m, &name, Duration::from_secs(600)).await;
    let secs = started.elapsed().as_secs_f64();
    assert_succeeded(&svm, &m);
    assert_eq!(svm["status"]["migratedObjects"], n);
    eprintln!(
        "migrated {n} objects in {secs:.2}s: {:.0} objects/s; migrator peak RSS {:?} KiB (idle {:?} KiB)",
        n as f64 / secs,
        peak_rss_kib(&m.dir),
        rss_idle
    );
    // Where the time went on the target: its own request latency metrics.
    let text = metrics(&target).await;
    for verb in ["LIST", "PATCH"] {
        let total = |what: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(&format!("apiserver_request_duration_seconds_{what}{{")))
                .filter(|l| l.contains(&format!("verb=\"{verb}\"")) && l.contains("resource=\"shootstates\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let (sum, count) = (total("sum"), total("count"));
        eprintln!("target {verb}: {count} requests, mean {:.1} ms", 1000.0 * sum / count.max(1.0));
    }
}

//! A migration as people follow it: its progress while it runs (status, printer columns, the remaining-objects
//! metric), the error it is retrying, and `migrate --wait` with its exit status. The target is a real kube-apiserver
//! (v1.37.2, one cluster without this server shared by the tests of this file) holding custom resources stored in
//! v1 and made stale by a switch of their storage version to v2 (tests/common/crs.rs); the migrating server, a
//! standalone migration-apiserver of our own, reaches it through our fault proxy (tests/common/proxy.rs), which
//! injects the 503s of the retrying migration. The refusal that fails `migrate --wait` is kube-apiserver's own: a
//! ValidatingAdmissionPolicy denying the writes of one object.

mod common;
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use common::proxy::{Fault, Proxy, RequestInfo};
use common::status::{condition, is_true};
use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const GROUP: &str = "progress.example.com";

/// The cluster the tests of this file share: kube-apiserver without this server.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::up(Options { server: false, ..Default::default() }))
}

/// A test's own custom resource, in a namespace of its own.
fn cr(plural: &'static str, kind: &'static str, namespace: &'static str) -> Cr {
    Cr { group: GROUP, plural, kind, namespace: Some(namespace) }
}

/// The cluster with `n` stale objects of `cr` (stored in v1, v2 the storage version).
fn stale(rt: &tokio::runtime::Runtime, cr: &Cr, n: usize) -> &'static Cluster {
    let c = cluster();
    rt.block_on(async { cr.install_stale(c, &c.client().await, n).await });
    c
}

/// Whether a request is a write of one of `cr`'s objects (not of its CRD, nor an Event).
fn writes_object_of(cr: &Cr, r: &RequestInfo) -> bool {
    r.is_patch() && r.path.starts_with(&format!("/apis/{}/", cr.group)) && r.object().is_some()
}

/// Every object of `cr` in etcd in v2, the storage version: the migration rewrote them all.
fn assert_all_in_v2(c: &Cluster, cr: &Cr, n: usize) {
    assert_eq!(cr.stored_counts(c), BTreeMap::from([(format!("{}/v2", cr.group), n)]), "{}", cr.name());
}

fn get(m: &Server, name: &str) -> Value {
    serde_json::from_slice(&m.kubectl(&["get", "svm", name, "-o", "json"]).stdout).unwrap_or(Value::Null)
}

#[test]
fn progress_rises_while_running() {
    const N: usize = 500;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cr = cr("dials", "Dial", "progress-rises");
    let c = stale(&rt, &cr, N);
    let proxy = Proxy::in_front_of_cluster(c);
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "50", "--migration-burst", "5"]);
    let name = request_cr_migration(&m, &cr);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen: Vec<(i64, i64)> = Vec::new();
    let mut table_progress = BTreeSet::new();
    let mut metric_seen = None;
    loop {
        let svm = get(&m, &name);
        if is_true(&svm, "Succeeded") {
            assert_eq!(svm["status"]["migratedObjects"], N);
            break;
        }
        assert!(!is_true(&svm, "Failed"), "{svm:#}");
        let (migrated, remaining) =
            (svm["status"]["migratedObjects"].as_i64(), svm["status"]["remainingObjectsEstimate"].as_i64());
        if let (true, Some(done), Some(left)) = (is_true(&svm, "Running"), migrated, remaining) {
            if seen.last() != Some(&(done, left)) {
                seen.push((done, left));
                // The printer columns: PROGRESS as a percentage, REMAINING.
                let row = m.kubectl_ok(&["get", "svm", &name, "--no-headers"]);
                let cells: Vec<&str> = row.split_whitespace().collect();
                if cells.get(2) == Some(&"Running") {
                    table_progress.insert(cells.get(4).unwrap_or(&"").to_string());
                }
            }
            if metric_seen.is_none() && done > 0 {
                let metrics = m.kubectl_ok(&["get", "--raw", "/metrics"]);
                metric_seen = metrics
                    .lines()
                    .find(|l| l.starts_with("storage_migrator_core_migrator_remaining_objects{"))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse::<f64>().ok());
            }
        }
        assert!(Instant::now() < deadline, "not finished: {svm:#}\n{}", m.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("(migratedObjects, remainingObjectsEstimate) while Running: {seen:?}; PROGRESS: {table_progress:?}");
    let rising: Vec<i64> = seen.iter().map(|(d, _)| *d).filter(|d| *d > 0 && *d < N as i64).collect();
    assert!(rising.len() >= 3, "migratedObjects should rise at least three times before Succeeded: {seen:?}");
    assert!(rising.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // The estimate of the rest (kube-apiserver's remainingItemCount, and what is left of the chunk) falls as the
    // count rises, and the two add up to the whole.
    assert!(seen.iter().all(|(d, l)| d + l == N as i64), "{seen:?}");
    assert!(table_progress.iter().any(|p| p.ends_with('%') && p != "0%" && p != "100%"), "{table_progress:?}");
    // The gauge is set from the first chunk on, not only at the end.
    assert!(metric_seen.is_some_and(|v| v > 0.0), "{metric_seen:?}");
    assert_all_in_v2(c, &cr, N);
}

#[test]
fn a_retrying_migration_shows_the_last_error() {
    const N: usize = 30;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cr = cr("levers", "Lever", "progress-retrying");
    let c = stale(&rt, &cr, N);
    let proxy = Proxy::in_front_of_cluster(c);
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let writes = cr.clone();
    proxy.add_rule(move |r| {
        (writes_object_of(&writes, r) && f.load(Ordering::SeqCst))
            .then_some(Fault::Status { code: 503, retry_after: None })
    });
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-max-attempts", "1000"]);
    let name = request_cr_migration(&m, &cr);
    let svm = eventually("the Running condition to name the error", Duration::from_secs(60), || {
        let svm = get(&m, &name);
        let message = condition(&svm, "Running")["message"].as_str().unwrap_or_default().to_string();
        (is_true(&svm, "Running") && message.contains("Retrying") && message.contains("503")).then_some(svm)
    });
    assert!(!is_true(&svm, "Failed"), "{svm:#}");
    // Nothing got through to kube-apiserver while it was refused: every object is still stale.
    assert_eq!(cr.stored_counts(c), BTreeMap::from([(format!("{}/v1", cr.group), N)]));
    failing.store(false, Ordering::SeqCst);
    let svm = eventually("the migration to succeed", Duration::from_secs(90), || {
        let svm = get(&m, &name);
        is_true(&svm, "Succeeded").then_some(svm)
    });
    assert_eq!(condition(&svm, "Running")["status"], "False");
    assert!(!condition(&svm, "Running")["message"].as_str().unwrap_or_default().contains("Retrying"), "{svm:#}");
    assert_all_in_v2(c, &cr, N);
}

/// `migrate --resource R --wait`, output not a terminal: lines as it goes, exit 0 on Succeeded, non-zero on Failed.
#[test]
fn migrate_wait_exit_status_follows_the_outcome() {
    const N: usize = 40;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cr = cr("knobs", "Knob", "progress-wait");
    let c = stale(&rt, &cr, N);
    let proxy = Proxy::in_front_of_cluster(c);
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", "0"]);
    let run = || {
        std::process::Command::new(BIN)
            .args(["migrate", "--resource", &cr.name(), "--wait", "--kubeconfig"])
            .arg(m.kubeconfig())
            .arg("--target-kubeconfig")
            .arg(proxy.kubeconfig())
            .output()
            .expect("migrate")
    };
    let ok = run();
    let (stdout, stderr) = (String::from_utf8_lossy(&ok.stdout), String::from_utf8_lossy(&ok.stderr));
    assert!(ok.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("storageversionmigration.migration.k8s.io/") && stdout.contains(" created"), "{stdout}");
    assert!(stderr.contains(&format!("Succeeded: {N} objects")), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "no escape codes when the output is not a terminal: {stderr:?}");
    assert_all_in_v2(c, &cr, N);

    // kube-apiserver refuses the (no-op) write of one object: the next migration fails.
    let refused = cr.object_name(17);
    rt.block_on(cr.refuse_writes(c, &refused, None));
    proxy.clear_records();
    let failed = run();
    let (stdout, stderr) = (String::from_utf8_lossy(&failed.stdout), String::from_utf8_lossy(&failed.stderr));
    assert!(!failed.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("Failed") && stderr.contains(&refused) && stderr.contains("422"), "{stderr}");
    assert!(stderr.contains("did not succeed"), "{stderr}");
    eprintln!("migrate --wait with a refused object:\n{stderr}");
    // The 422 was kube-apiserver's answer, passed on by the proxy, not one of its faults.
    let answers: Vec<(u16, bool)> = proxy
        .records()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with(&format!("/{}/{refused}", cr.plural)))
        .map(|r| (r.code, r.fault))
        .collect();
    assert_eq!(answers, [(422, false)], "the writes of {refused}: (code, injected)");
}

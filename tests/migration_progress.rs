//! A migration as people follow it: its progress while it runs (status, printer columns, the remaining-objects
//! metric), the error it is retrying, and `migrate --wait` with its exit status. A target migration-apiserver holds
//! the ShootStates; the migrating server reaches it through our fault proxy (tests/common/proxy.rs).

mod common;
use common::proxy::{Fault, Proxy};
use common::status::{condition, is_true};
use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RESOURCE: &str = "shootstates.core.gardener.cloud";

async fn target_with(n: usize) -> Server {
    let t = Server::start(&["--disable-scheduler"]);
    let c = t.client().await;
    let codes: Vec<u16> = futures::stream::iter(0..n)
        .map(|i| {
            let c = c.clone();
            async move {
                let body = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                    "metadata": {"name": format!("s-{i:04}"), "namespace": "garden"}, "spec": {}});
                let req = http::Request::builder()
                    .method("POST")
                    .uri("/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates")
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.to_string().into_bytes()))
                    .expect("request");
                c.send(req).await.expect("create").status().as_u16()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(codes.iter().all(|c| *c == 201), "{codes:?}");
    t
}

fn get(m: &Server, name: &str) -> Value {
    serde_json::from_slice(&m.kubectl(&["get", "svm", name, "-o", "json"]).stdout).unwrap_or(Value::Null)
}

#[test]
fn progress_rises_while_running() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let target = rt.block_on(target_with(500));
    let proxy = Proxy::start(&target);
    let m = migrating_server(&proxy.kubeconfig(), &["--migration-qps", "50", "--migration-burst", "5"]);
    let name = request_shootstate_migration(&m);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<(i64, i64)> = Vec::new();
    let mut table_progress = BTreeSet::new();
    let mut metric_seen = None;
    loop {
        let svm = get(&m, &name);
        if is_true(&svm, "Succeeded") {
            assert_eq!(svm["status"]["migratedObjects"], 500);
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
    let rising: Vec<i64> = seen.iter().map(|(d, _)| *d).filter(|d| *d > 0 && *d < 500).collect();
    assert!(rising.len() >= 3, "migratedObjects should rise at least three times before Succeeded: {seen:?}");
    assert!(rising.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // The estimate of the rest falls as the count rises, and the two add up to the whole.
    assert!(seen.iter().all(|(d, l)| d + l == 500), "{seen:?}");
    assert!(table_progress.iter().any(|p| p.ends_with('%') && p != "0%" && p != "100%"), "{table_progress:?}");
    // The gauge is set from the first chunk on, not only at the end.
    assert!(metric_seen.is_some_and(|v| v > 0.0), "{metric_seen:?}");
}

#[test]
fn a_retrying_migration_shows_the_last_error() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let target = rt.block_on(target_with(30));
    let proxy = Proxy::start(&target);
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    proxy.add_rule(move |r| {
        (r.is_patch() && f.load(Ordering::SeqCst)).then_some(Fault::Status { code: 503, retry_after: None })
    });
    let m = migrating_server(&proxy.kubeconfig(), &["--migration-qps", "0", "--migration-max-attempts", "1000"]);
    let name = request_shootstate_migration(&m);
    let svm = eventually("the Running condition to name the error", Duration::from_secs(30), || {
        let svm = get(&m, &name);
        let message = condition(&svm, "Running")["message"].as_str().unwrap_or_default().to_string();
        (is_true(&svm, "Running") && message.contains("Retrying") && message.contains("503")).then_some(svm)
    });
    assert!(!is_true(&svm, "Failed"), "{svm:#}");
    failing.store(false, Ordering::SeqCst);
    let svm = eventually("the migration to succeed", Duration::from_secs(60), || {
        let svm = get(&m, &name);
        is_true(&svm, "Succeeded").then_some(svm)
    });
    assert_eq!(condition(&svm, "Running")["status"], "False");
    assert!(!condition(&svm, "Running")["message"].as_str().unwrap_or_default().contains("Retrying"), "{svm:#}");
}

/// `migrate --resource R --wait`, output not a terminal: lines as it goes, exit 0 on Succeeded, non-zero on Failed.
#[test]
fn migrate_wait_exit_status_follows_the_outcome() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let target = rt.block_on(target_with(40));
    let proxy = Proxy::start(&target);
    let m = migrating_server(&proxy.kubeconfig(), &["--migration-qps", "0"]);
    let run = || {
        std::process::Command::new(BIN)
            .args(["migrate", "--resource", RESOURCE, "--wait", "--kubeconfig"])
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
    assert!(stderr.contains("Succeeded: 40 objects"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "no escape codes when the output is not a terminal: {stderr:?}");

    proxy.add_rule(|r| {
        (r.is_patch() && r.path.ends_with("/shootstates/s-0017"))
            .then_some(Fault::Status { code: 422, retry_after: None })
    });
    let failed = run();
    let (stdout, stderr) = (String::from_utf8_lossy(&failed.stdout), String::from_utf8_lossy(&failed.stderr));
    assert!(!failed.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("Failed") && stderr.contains("s-0017") && stderr.contains("422"), "{stderr}");
    assert!(stderr.contains("did not succeed"), "{stderr}");
}

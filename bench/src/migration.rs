//! The migrator: migrations of 10^4 and 10^5 objects.

use super::*;
use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

// The migrator (issue 4).

pub(super) const SHOOTSTATES_V1ALPHA1: &str = "/apis/core.gardener.cloud/v1alpha1";

/// Migrations of 10^4 and 10^5 (--quick: 10^3 and 10^4) objects, each by a fresh migrating server.
pub(super) async fn migration_rows(bin: &Path, quick: bool) -> Vec<Row> {
    let sizes: [u64; 2] = if quick { [1_000, 10_000] } else { [10_000, 100_000] };
    let mut rows = Vec::new();
    let mut peaks = Vec::new();
    for n in sizes {
        let scenario = format!("migrate 10^{} objects (--migration-adaptive=false --migration-qps 0)", n.ilog10());
        eprintln!("bench: {scenario}");
        match migrate(bin, n, &scenario).await {
            Ok((row, peak, growth)) => {
                rows.push(row);
                peaks.push((n, peak, growth));
            }
            Err(e) => rows.push(Row::failed(scenario, e)),
        }
    }
    if let [(n1, peak1, _), (n2, peak2, growth2)] = peaks[..] {
        let across = peak2.saturating_sub(peak1);
        let worst = across.max(growth2);
        rows.push(Row {
            scenario: format!("migrator peak RSS growth, 10^{} -> 10^{} objects", n1.ilog10(), n2.ilog10()),
            target: Goal::MaxMib(20.0).show(Some(worst as f64 / 1024.0)),
            notes: format!(
                "VmHWM {} -> {} (+{}); during the 10^{} migration alone +{}; the target judges the larger",
                mib(peak1),
                mib(peak2),
                mib(across),
                n2.ilog10(),
                mib(growth2)
            ),
            ..Row::default()
        });
    }
    rows
}

/// A target server holding `n` ShootStates stored as v1alpha1 and restarted with storage version v1beta1, and a
/// second server (the migrator, --kubeconfig to the target, scheduler without trigger, unlimited QPS) asked to
/// migrate them with a StorageVersionMigration. Returns the row, the migrator's peak RSS (VmHWM, KiB) and its
/// growth during the migration.
pub(super) async fn migrate(bin: &Path, n: u64, scenario: &str) -> anyhow::Result<(Row, u64, u64)> {
    let v1alpha1 = ["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1alpha1"];
    let (mut target_server, target) = ServerProcess::start(bin, &v1alpha1).await?;
    let seed = run_load(&target, None, 64, None, n, shoot_state_creates(0, "")).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    let v1beta1 = ["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1beta1"];
    let target = target_server.restart(&v1beta1).await?;
    let kubeconfig = target_server.kubeconfig().to_string_lossy().into_owned();
    // Unthrottled (a fixed rate without a limit): the migrator's own speed; the adaptive rate has its own rows.
    let migrator_args = [
        "--kubeconfig",
        kubeconfig.as_str(),
        "--disable-trigger",
        "--migration-adaptive=false",
        "--migration-qps",
        "0",
    ];
    let (mut migrator_server, migrator) = ServerProcess::start(bin, &migrator_args).await?;
    let (mpid, tpid) = (migrator_server.child.id(), target_server.child.id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let hwm_before = hwm_kib(mpid).context("no VmHWM for the migrator")?;
    let requests_before = target_requests(&target).await?;

    let name = format!("bench-shootstates-{n}");
    let svm = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name, "labels": {"migration.k8s.io/resource": "shootstates.core.gardener.cloud"}},
        "spec": {"resource": {"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"}},
    });
    let cpu0 = (CpuTicks::now(Some(mpid)), cpu_ticks(tpid));
    let started = Instant::now();
    migrator.call_ok(&Req::post(format!("{API}/storageversionmigrations"), Bytes::from(svm.to_string()))).await?;
    let mut conn = migrator.connect().await?;
    let status = loop {
        let svm: Value =
            serde_json::from_slice(&conn.call_ok(&Req::get(format!("{API}/storageversionmigrations/{name}"))).await?)?;
        let condition = |t: &str| {
            svm["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
                .cloned()
        };
        if let Some(failed) = condition("Failed") {
            bail!("the migration failed: {failed}");
        }
        if condition("Succeeded").is_some() {
            break svm["status"].clone();
        }
        if let Some(exit) = migrator_server.exited().or_else(|| target_server.exited()) {
            bail!("a server exited during the migration ({exit})");
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("the migration did not finish within 15 min: {}", svm["status"]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    let cpu = cpu0
        .0
        .usage_since(Some(mpid), took)
        .replace("server", &format!("target {}, migrator", cores(cpu0.1, cpu_ticks(tpid), took)));
    let hwm = hwm_kib(mpid).context("no VmHWM for the migrator")?;
    let requests = target_requests(&target).await?;
    if status["migratedObjects"] != n {
        bail!("the migration succeeded with migratedObjects {} instead of {n}", status["migratedObjects"]);
    }
    drop(migrator_server);

    // Every object is stored in the new version now.
    target_server.stop().await?;
    let items = stored_shootstates(bin, &target_server.data_dir())?;
    let migrated = items.iter().filter(|e| e["apiVersion"] == "core.gardener.cloud/v1beta1").count() as u64;
    if migrated != n || items.len() as u64 != n {
        bail!("after the migration {migrated} of {} stored ShootStates are v1beta1 (expected all {n})", items.len());
    }

    let mut by_verb: BTreeMap<String, f64> = BTreeMap::new();
    for (verb, after) in &requests {
        let d = after - requests_before.get(verb).copied().unwrap_or(0.0);
        if d > 0.0 {
            by_verb.insert(verb.clone(), d);
        }
    }
    let total: f64 = by_verb.values().sum();
    if total < n as f64 {
        bail!("the target counted {total} ShootState requests (apiserver_request_total) for {n} migrated objects");
    }
    let verbs: Vec<String> = by_verb.iter().map(|(v, c)| format!("{} {v}", thousands(*c))).collect();
    let rate = n as f64 / took.as_secs_f64();
    let growth = hwm.saturating_sub(hwm_before);
    let notes = format!(
        "{} objects in {:.1} s; at the target {} requests ({}) = {:.3} per object; migrator VmHWM {}, +{} during the \
         migration; afterwards storage inspect: all {} stored as v1beta1; {cpu}",
        thousands(n as f64),
        took.as_secs_f64(),
        thousands(total),
        verbs.join(", "),
        total / n as f64,
        mib(hwm),
        mib(growth),
        thousands(n as f64),
    );
    let row = Row {
        scenario: scenario.to_string(),
        rps: thousands(rate),
        target: Goal::MinRps(2_000.0).show(Some(rate)),
        notes,
        rps_v: Some(rate),
        ..Row::default()
    };
    Ok((row, hwm, growth))
}

/// Where the small ShootState number `i` lives: namespace `bench-<i % 10>`, name `s-<i>` (6 digits, so that up
/// to 10^6 of them list in the order they were created).
pub(super) fn shoot_state_id(i: u64) -> (String, String) {
    (format!("bench-{}", i % 10), format!("s-{i:06}"))
}

/// CREATEs (v1alpha1) of the small ShootStates numbered from `first` on; `pad`, when not empty, is added to the
/// secret's data to give the objects a size.
pub(super) fn shoot_state_creates(first: u64, pad: &str) -> MakeReq {
    let pad = pad.to_owned();
    Arc::new(move |i| {
        let i = first + i;
        let (ns, name) = shoot_state_id(i);
        let mut data = json!({"n": i});
        if !pad.is_empty() {
            data["pad"] = pad.as_str().into();
        }
        let body = json!({"apiVersion": "core.gardener.cloud/v1alpha1", "kind": "ShootState",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"gardener": [{"name": "ca", "type": "secret", "data": data}]}});
        Req::post(format!("{SHOOTSTATES_V1ALPHA1}/namespaces/{ns}/shootstates"), Bytes::from(body.to_string()))
    })
}

/// The target's request counters for ShootStates (`apiserver_request_total`), summed by verb.
pub(super) async fn target_requests(target: &Target) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = target.call_ok(&Req::get("/metrics".into()).accept("text/plain")).await?;
    let mut by_verb = BTreeMap::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let Some(labels) = line.strip_prefix("apiserver_request_total{") else { continue };
        if !labels.contains("resource=\"shootstates\"") {
            continue;
        }
        let verb = labels.split("verb=\"").nth(1).and_then(|v| v.split('"').next()).unwrap_or("?").to_string();
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *by_verb.entry(verb).or_default() += value;
    }
    Ok(by_verb)
}

//! The admission webhook rows.

use super::*;
use anyhow::{anyhow, bail, Context};
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

// Admission webhooks (issue 3).

pub(super) const ADMISSION_V1: &str = "admission.k8s.io/v1";

/// The admission rows on servers of their own, placed two ways. First (with 2 CPUs or more) the server on one half
/// of the CPUs and the bench on the other, as for a webhook pod with cores of its own on kube-apiserver's node: the
/// server's own latency, without the bench's threads preempting it. These rows are judged by the targets. Then both
/// free to run on every CPU, each row after its pair with the ratio and the targets' verdict marked as not judged:
/// on 2 cores the server's and the bench's busy threads preempt each other, and an answer waits while its thread
/// does (a 4 ms tick; see BENCHMARKS.md).
pub(super) async fn admission_group(bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    let cpus = allowed_cpus();
    let Some((server_cpus, bench_cpus)) = split_cpus(cpus.clone()) else {
        let why = if cpus.is_empty() { "the CPU affinity mask could not be read" } else { "a single CPU" };
        eprintln!("bench: the admission rows run with the server and the bench sharing the CPUs only: {why}");
        return admission_on(bin, None, conns, duration, run).await;
    };
    let mut rows = admission_on(bin, Some((&server_cpus, &bench_cpus)), conns, duration, run).await;
    let mut shared = admission_on(bin, None, conns, duration, run).await;
    for row in &mut shared {
        // A row whose pair failed stays on its own, at the end, and is judged.
        if rows.iter().any(|r| r.scenario == row.scenario) {
            row.pair = Some(row.scenario.clone());
            if !row.target.is_empty() {
                row.target = format!("not judged: {}", row.target);
            }
        }
        row.scenario += ", server and bench sharing the CPUs";
    }
    merge_pairs(&mut rows, shared, "the separate CPUs'");
    rows
}

/// The admission rows against a new server. With `cpus` (the server's, the bench's), the server may only run on
/// the first (checked in its `/proc` status) and the load runs on a runtime of its own, on the second.
pub(super) async fn admission_on(
    bin: &Path,
    cpus: Option<(&[usize], &[usize])>,
    conns: usize,
    duration: Duration,
    run: &str,
) -> Vec<Row> {
    let failed = |e: anyhow::Error| vec![Row::failed("AdmissionReview /validate and /mutate".into(), e)];
    let (server, target) = match ServerProcess::start_on(bin, &["--disable-scheduler"], cpus.map(|c| c.0)).await {
        Ok(started) => started,
        Err(e) => return failed(e),
    };
    let pid = server.child.id();
    let load = admission_rows(target, Some(pid), conns, duration, run.to_string());
    let (mut rows, placement) = match cpus {
        None => {
            let all = allowed_cpus();
            let placement = format!("server and bench sharing {}, {} each", cpu_list(&all), workers(all.len()));
            (load.await, placement)
        }
        Some((server_cpus, bench_cpus)) => {
            let allowed = cpus_allowed(pid);
            if allowed.as_deref() != Some(server_cpus) {
                return failed(anyhow!("the server may run on {allowed:?}, not only on {}", cpu_list(server_cpus)));
            }
            let rows = match on_cpus(bench_cpus, load).await {
                Ok(rows) => rows,
                Err(e) => return failed(e),
            };
            let placement = format!(
                "server on {} ({}), bench on {} ({})",
                cpu_list(server_cpus),
                workers(server_cpus.len()),
                cpu_list(bench_cpus),
                workers(bench_cpus.len())
            );
            (rows, placement)
        }
    };
    for row in &mut rows {
        row.notes += &format!("; {placement}");
    }
    rows
}

/// /validate with a StorageVersionMigration CREATE and /mutate with a StorageState CREATE (the kind that has a
/// default, so that the answer carries a patch), as kube-apiserver sends them for the CRD form. Every answer is
/// checked: its uid echoed, allowed, and no patch (/validate) or exactly the expected patch (/mutate). Then the
/// floor under them.
pub(super) async fn admission_rows(
    target: Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    run: String,
) -> Vec<Row> {
    let (target, run) = (&target, run.as_str());
    let mut rows = Vec::new();
    for mutate in [false, true] {
        let scenario = if mutate {
            "AdmissionReview /mutate (StorageState CREATE)"
        } else {
            "AdmissionReview /validate (StorageVersionMigration CREATE)"
        };
        eprintln!("bench: {scenario} ({conns} connections, {duration:?})");
        match admission_row(target, pid, conns, duration, run, mutate, scenario).await {
            Ok(row) => rows.push(row),
            Err(e) => rows.push(Row::failed(scenario.into(), e)),
        }
    }
    // The floor under any review: the same requests to a path that rejects the method without reading anything.
    let scenario = "floor: the same POST to /healthz (405, nothing decoded)";
    eprintln!("bench: {scenario} ({conns} connections, {duration:?})");
    let template = Arc::new(Template::new(&admission_review("uid-@N@", "CREATE", &admitted_migration("@N@"))));
    let r = run.to_string();
    let make: MakeReq =
        Arc::new(move |i| Req::post("/healthz".into(), template.render(&format!("{r}-{i:07}"))).expect(405));
    let load = run_load_checked(target, pid, conns, Some(duration), u64::MAX, make, None).await;
    let note = "TLS, HTTP and the bench client alone, per request: the ceiling for any webhook placed the same way";
    rows.push(load.row(scenario, conns, Goal::None, note));
    rows
}

pub(super) async fn admission_row(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    run: &str,
    mutate: bool,
    scenario: &str,
) -> anyhow::Result<Row> {
    let path = if mutate { "/mutate" } else { "/validate" };
    let object = |n: &str| if mutate { admitted_storage_state(n) } else { admitted_migration(n) };
    let template = Arc::new(Template::new(&admission_review("uid-@N@", "CREATE", &object("@N@"))));
    let uid = |n: &str| format!("uid-{n}");

    // Probes, one of them an object that must be denied: a webhook that allows everything cannot score.
    let probe_n = format!("{run}-probe");
    let answer = target.call_ok(&Req::post(path.into(), template.render(&probe_n))).await?;
    let patch = if mutate {
        let patch = review_response(&answer, &uid(&probe_n))?["patch"].as_str().unwrap_or_default().to_string();
        let decoded = base64::engine::general_purpose::STANDARD.decode(&patch).context("the patch is not base64")?;
        let ops: json_patch::Patch = serde_json::from_slice(&decoded).context("the patch is not a JSON Patch")?;
        let mut patched = object(&probe_n);
        json_patch::patch(&mut patched, &ops).context("the patch does not apply to the object sent")?;
        if patched["status"]["persistedStorageVersionHashes"] != json!(["Unknown"]) {
            bail!(
                "the patch does not default status.persistedStorageVersionHashes: {}",
                String::from_utf8_lossy(&decoded)
            );
        }
        Some(patch)
    } else {
        None
    };
    check_review(&answer, &uid(&probe_n), patch.as_deref()).map_err(|e| anyhow!("probe: {e}"))?;
    let mut invalid = object(&format!("{run}-invalid"));
    invalid["spec"] = json!({});
    let denied = target
        .call_ok(&Req::post(path.into(), Template::new(&admission_review("uid-x", "CREATE", &invalid)).render("")))
        .await?;
    if !mutate && review_response(&denied, "uid-x")?["allowed"] != false {
        bail!("an object without spec.resource was not denied: {}", String::from_utf8_lossy(&denied));
    }

    let size = template.render(&format!("{run}-0000000")).len();
    let r = run.to_string();
    let (t, p) = (template.clone(), path.to_string());
    let make: MakeReq = Arc::new(move |i| Req::post(p.clone(), t.render(&format!("{r}-{i:07}"))));
    let r = run.to_string();
    let check: Check = Arc::new(move |i, body| check_review(body, &format!("uid-{r}-{i:07}"), patch.as_deref()));
    let load = run_load_checked(target, pid, conns, Some(duration), u64::MAX, make, Some(check)).await;
    let what = if mutate { "allowed, uid echoed, the expected JSON Patch" } else { "allowed, uid echoed, no patch" };
    let note = format!("{:.1} KiB per review; every answer checked: {what}", size as f64 / 1024.0);
    let mut row = load.row(scenario, conns, Goal::MinRps(30_000.0), &note);
    // The second target is p99 <= 5 ms.
    row.target += &format!("; {}", Goal::MaxP99Ms(5.0).show(row.p99_v));
    Ok(row)
}

/// The `response` of an AdmissionReview answer to `uid`.
pub(super) fn review_response(body: &[u8], uid: &str) -> anyhow::Result<Value> {
    let v: Value = serde_json::from_slice(body).context("the answer is not JSON")?;
    if v["apiVersion"] != ADMISSION_V1 || v["kind"] != "AdmissionReview" {
        bail!("not an {ADMISSION_V1} AdmissionReview: {v}");
    }
    if v["response"]["uid"] != uid {
        bail!("uid {uid} not echoed: {v}");
    }
    Ok(v["response"].clone())
}

/// An allowed answer to `uid`, with exactly `patch` (base64) or no patch at all. Read into borrowed fields (this
/// runs for every answer of the timed loop, on the cores the server uses); anything unexpected is reported with
/// the whole answer.
pub(super) fn check_review(body: &[u8], uid: &str, patch: Option<&str>) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Review<'a> {
        #[serde(rename = "apiVersion", borrow)]
        api_version: Cow<'a, str>,
        #[serde(borrow)]
        kind: Cow<'a, str>,
        #[serde(borrow)]
        response: Response<'a>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Response<'a> {
        #[serde(borrow)]
        uid: Cow<'a, str>,
        allowed: bool,
        #[serde(default)]
        patch_type: Option<String>,
        #[serde(default)]
        patch: Option<String>,
    }
    let whole = || String::from_utf8_lossy(body).into_owned();
    let r: Review<'_> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview ({e}): {}", whole()))?;
    if r.api_version != ADMISSION_V1 || r.kind != "AdmissionReview" {
        return Err(format!("not an {ADMISSION_V1} AdmissionReview: {}", whole()));
    }
    let r = r.response;
    if r.uid != uid {
        return Err(format!("uid {uid} not echoed: {}", whole()));
    }
    if !r.allowed {
        return Err(format!("not allowed: {}", whole()));
    }
    match patch {
        None if r.patch.is_some() || r.patch_type.is_some() => {
            Err(format!("a patch in a validating answer: {}", whole()))
        }
        Some(p) if r.patch_type.as_deref() != Some("JSONPatch") || r.patch.as_deref() != Some(p) => {
            Err(format!("not the expected patch: {}", whole()))
        }
        _ => Ok(()),
    }
}

/// An AdmissionReview as kube-apiserver sends it to a webhook for a write of `object`.
pub(super) fn admission_review(uid: &str, operation: &str, object: &Value) -> Value {
    let (group, version) = object["apiVersion"].as_str().unwrap_or_default().split_once('/').unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"],
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:storage-version-migrator",
                "uid": "5b0c8a52-1f4e-4a2b-9c61-0d7e3f5a9b21",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "storage-version-migrator"},
        },
    })
}

/// Metadata as kube-apiserver has filled it in by the time the webhooks see a CREATE.
pub(super) fn admitted_meta(name: &str) -> Value {
    json!({
        "name": name,
        "uid": "0d1f3c5e-2b4a-4c6e-8f10-32547698badc",
        "generation": 1,
        "creationTimestamp": "2026-11-21T02:00:00Z",
        "labels": {"app.kubernetes.io/managed-by": "storage-version-migrator"},
        "managedFields": [{
            "manager": "storage-version-migrator", "operation": "Update", "apiVersion": "migration.k8s.io/v1alpha1",
            "time": "2026-11-21T02:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {}}}, "f:spec": {".": {}, "f:resource": {".": {}, "f:group": {}, "f:resource": {}}}},
        }],
    })
}

pub(super) fn admitted_migration(n: &str) -> Value {
    json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": admitted_meta(&format!("deployments-{n}")),
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    })
}

pub(super) fn admitted_storage_state(n: &str) -> Value {
    json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
        "metadata": admitted_meta(&format!("r{n}.bench.io")),
        "spec": {"resource": {"group": "bench.io", "resource": format!("r{n}")}},
    })
}

/// A JSON body with `@N@` placeholders, rendered per request without serializing it again.
pub(super) struct Template(Vec<Bytes>);

impl Template {
    pub(super) fn new(body: &Value) -> Template {
        Template(body.to_string().split("@N@").map(|p| Bytes::from(p.to_owned())).collect())
    }

    pub(super) fn render(&self, n: &str) -> Bytes {
        let mut out = Vec::with_capacity(self.0.iter().map(Bytes::len).sum::<usize>() + self.0.len() * n.len());
        for (k, part) in self.0.iter().enumerate() {
            if k > 0 {
                out.extend_from_slice(n.as_bytes());
            }
            out.extend_from_slice(part);
        }
        Bytes::from(out)
    }
}

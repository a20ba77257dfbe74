//! `storagemigration.k8s.io` migrations as kube-controller-manager runs them at GA (Kubernetes 1.37) when the
//! target answers with errors, black-box against the real binary: upstream's
//! `pkg/controller/storageversionmigrator/storageversionmigrator_test.go` (404 and 409 skipped, transient errors
//! retried, an unhandled error failing with its counts), `migrationrunner_test.go` ("Migration failed: CRD condition
//! updated") and `resourceversion.go`'s check of the list resourceVersion. The successful runs are
//! tests/storagemigration_ga.rs's, whose header says what runs against what; here the same: a standalone migrator
//! (`common::cluster_migrator`) migrates the custom resources of real CRDs (`common::crs`, every object stale) in a
//! real kube-apiserver (v1.37.2, a cluster shared by the tests of this file) through our fault proxy
//! (`Proxy::in_front_of_cluster`).
//!
//! Who answers what:
//! - 429 (with Retry-After), 500, 503 on one object's patch: the proxy, which answers them itself (kube-apiserver
//!   shows none of them on demand);
//! - 404 and 409 on a patch: the real kube-apiserver, the proxy being the concurrent writer that deletes or changes
//!   the object just before it forwards the patch (`Fault::DeleteFirst`, `Fault::TouchFirst`);
//! - 403 on one object's patch: the real kube-apiserver, whose ValidatingAdmissionPolicy (reason Forbidden) refuses
//!   updates of that object;
//! - a malformed list resourceVersion: the proxy, answering the migration's LIST of one itself (kube-apiserver never
//!   hands one out).

mod common;
#[path = "storagemigration_ga/support.rs"]
mod support;
use common::crs::Cr;
use common::proxy::Fault;
use common::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use support::*;

/// storageversionmigrator_test.go's transient cases (429 with Retry-After, 500, 503): retried, never Failed; the
/// Running message carries the counts and `; transient error: ...` while they last. Every object ends in v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_and_never_fail_the_migration() {
    let failing = Arc::new(AtomicBool::new(true));
    let (cr, t) = stale(cr("gizmos", "Gizmo", "ga-gizmos"), 6, &["--migration-max-attempts", "2"]).await;
    let (f, mut n, rule_cr) = (failing.clone(), 0u32, cr.clone());
    t.proxy.add_rule(move |r| {
        if !(r.is_patch() && object_index(r, &rule_cr) == Some(3) && f.load(Ordering::SeqCst)) {
            return None;
        }
        n += 1;
        let (code, retry_after) = [(429, Some(1)), (500, None), (503, None)][n as usize % 3];
        Some(Fault::Status { code, retry_after })
    });
    create_in_tree(&t.migrating, "gizmos-flaky", GROUP, "gizmos");
    let retrying = eventually("the transient error in the Running message", END, || {
        let m = get(&t.migrating, "gizmos-flaky");
        assert!(!is_true(&m, "Failed"), "a transient error failed the migration: {m:#}");
        let message = condition(&m, "Running")["message"].as_str().unwrap_or_default().to_string();
        message.contains("; transient error: ").then_some(m)
    });
    let message = condition(&retrying, "Running")["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("The migration is running, "), "{message}");
    assert!(message.contains("/6 objects not yet migrated; transient error: "), "{message}");
    assert!(is_true(&retrying, "Running"), "{retrying:#}");
    failing.store(false, Ordering::SeqCst);
    let m = wait_ended(&t.migrating, "gizmos-flaky");
    assert!(is_true(&m, "Succeeded") && condition(&m, "Failed").is_null(), "{m:#}\n{}", t.migrating.log());
    assert_completed(&m);
    let faults: Vec<u16> = t.proxy.records().iter().filter(|r| r.fault).map(|r| r.code).collect();
    assert!(!faults.is_empty() && faults.iter().all(|c| [429, 500, 503].contains(c)), "{faults:?}");
    assert_eq!(cr.stored_counts(cluster()), BTreeMap::from([(format!("{GROUP}/v2"), 6)]));
}

/// storageversionmigrator_test.go: a patch answered 404 (deleted meanwhile) or 409 (changed meanwhile) is skipped
/// and counts as done. kube-apiserver gives both answers to the proxy's concurrent writes; the changed object is
/// stored in v2 by that write, so the migration succeeds with every remaining object in v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_and_conflict_on_a_patch_are_skipped() {
    let (cr, t) = stale(cr("sprockets", "Sprocket", "ga-sprockets"), 8, &[]).await;
    let rule_cr = cr.clone();
    t.proxy.add_rule(move |r| match (r.is_patch(), object_index(r, &rule_cr)) {
        (true, Some(2)) => Some(Fault::DeleteFirst),
        (true, Some(5)) => Some(Fault::TouchFirst),
        _ => None,
    });
    create_in_tree(&t.migrating, "sprockets-raced", GROUP, "sprockets");
    let m = wait_ended(&t.migrating, "sprockets-raced");
    assert!(is_true(&m, "Succeeded"), "{m:#}\n{}", t.migrating.log());
    assert_completed(&m);
    let records = t.proxy.records();
    let codes: BTreeMap<usize, Vec<u16>> = object_writes(&records, &cr).iter().fold(BTreeMap::new(), |mut codes, r| {
        let i = r.path.rsplit('-').next().and_then(|i| i.parse().ok()).expect("an object's index");
        codes.entry(i).or_insert_with(Vec::new).push(r.code);
        codes
    });
    let code = |i: usize| match i {
        2 => 404,
        5 => 409,
        _ => 200,
    };
    let expected: BTreeMap<usize, Vec<u16>> = (0..8).map(|i| (i, vec![code(i)])).collect();
    assert_eq!(codes, expected, "one patch per object, the raced ones answered by kube-apiserver");
    // etcd: the deleted object is gone, every other one is stored in v2, the changed one with the proxy's label.
    let stored = cr.stored(cluster());
    let key = |i: usize| format!("/registry/{GROUP}/sprockets/ga-sprockets/{}", cr.object_name(i));
    let want: BTreeMap<String, String> = (0..8).filter(|i| *i != 2).map(|i| (key(i), format!("{GROUP}/v2"))).collect();
    assert_eq!(stored, want);
    let touched = &cr.stored_objects(cluster())[&key(5)];
    assert!(touched["metadata"]["labels"]["touched"].is_string(), "{touched:#}");
    assert_eq!(cr.crd_json(cluster())["status"]["storedVersions"], json!(["v2"]));
}

/// A ValidatingAdmissionPolicy of kube-apiserver refusing updates of `cr`'s object `name` with 403 Forbidden and
/// `message`; returns once kube-apiserver enforces it (a dry-run patch of the object is refused).
fn refuse_updates(cr: &Cr, name: &str, message: &str) {
    let c = cluster();
    let policy = format!("ga-refuse-{name}");
    let objects = [
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [cr.group], "apiVersions": ["*"],
                    "resources": [cr.plural], "operations": ["UPDATE"]}]},
                "matchConditions": [{"name": "the-object", "expression": format!("object.metadata.name == '{name}'")}],
                "validations": [{"expression": "false", "reason": "Forbidden", "message": message}]}}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy}, "spec": {"policyName": policy, "validationActions": ["Deny"]}}),
    ];
    c.kubectl_ok_stdin(&["create", "-f", "-"], &format!("{}\n{}\n", objects[0], objects[1]));
    let (resource, ns) = (cr.name(), cr.namespace.expect("namespaced"));
    eventually(&format!("kube-apiserver to enforce {policy}"), END, || {
        let args = ["patch", &resource, name, "-n", ns, "--type=merge", "-p", "{}", "--dry-run=server"];
        let out = c.kubectl(&args);
        (!out.status.success() && String::from_utf8_lossy(&out.stderr).contains(message)).then_some(())
    });
}

/// storageversionmigrator_test.go's unhandled error: one UpdateStatus with Running's counts and
/// `Failed` = `X/Y not yet migrated. migration encountered unhandled error: ...`; then the runner's cleanup and the
/// CRD's `MigrationFailed` (migrationrunner_test.go "Migration failed: CRD condition updated"; storedVersions stay
/// as they are here, where upstream resets them: see docs/reference/differences.md). The refusal is kube-apiserver's
/// own: an admission policy forbids updates of one object, which stays stored in v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_write_fails_the_migration_with_its_counts() {
    let (cr, t) = stale(cr("cogs", "Cog", "ga-cogs"), 5, &["--migration-chunk-size", "5"]).await;
    let refused = cr.object_name(4);
    refuse_updates(&cr, &refused, "this cog is frozen");
    create_in_tree(&t.migrating, "cogs-forbidden", GROUP, "cogs");
    let m = wait_ended(&t.migrating, "cogs-forbidden");
    let failed = condition(&m, "Failed");
    assert_eq!(failed["reason"], "StorageVersionMigrationFailed", "{m:#}");
    let message = failed["message"].as_str().unwrap_or_default();
    let (counts, rest) = message.split_once(" not yet migrated. ").unwrap_or_else(|| panic!("{message}"));
    assert!(["1/5", "2/5", "3/5", "4/5", "5/5"].contains(&counts), "{message}");
    let expected = format!(
        r#"migration encountered unhandled error: rewriting cogs.{GROUP} "ga-cogs/{refused}": 403 Forbidden: cogs.{GROUP} "{refused}" is forbidden: ValidatingAdmissionPolicy 'ga-refuse-{refused}' with binding 'ga-refuse-{refused}' denied request: this cog is frozen"#
    );
    assert_eq!(rest, expected, "{message}");
    assert_completed(&m);
    assert!(condition(&m, "Succeeded").is_null(), "{m:#}");
    let records = t.proxy.records();
    let refusals: Vec<_> = object_writes(&records, &cr).into_iter().filter(|r| r.code == 403).collect();
    assert!(refusals.len() == 1 && !refusals[0].fault && refusals[0].path.ends_with(&refused), "{refusals:#?}");
    let crd = cr.crd_json(cluster());
    let cond = crd_condition(&crd);
    assert_eq!(
        (&cond["status"], &cond["reason"], &cond["message"]),
        (&json!("False"), &json!("MigrationFailed"), &json!("The migration has failed")),
        "{crd:#}"
    );
    assert_eq!(crd["status"]["storedVersions"], json!(["v1", "v2"]), "{crd:#}");
    let stored = cr.stored(cluster());
    assert_eq!(stored[&format!("/registry/{GROUP}/cogs/ga-cogs/{refused}")], format!("{GROUP}/v1"), "{stored:#?}");
}

/// resourceversion.go at GA: the list resourceVersion must be one apimachinery can compare. The proxy answers the
/// migration's LIST of one with `07`; the migration fails at the checkpoint, and nothing is written: the CRD's
/// condition ends `MigrationFailed` with storedVersions as they were, every object still in v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_list_resource_version_fails_at_the_checkpoint() {
    let (cr, t) = stale(cr("levers", "Lever", "ga-levers"), 2, &[]).await;
    let collection = cr.path("v2");
    t.proxy.serve_locally(move |r, _| {
        (r.is_list() && r.param("limit").as_deref() == Some("1") && r.path == collection).then(|| {
            (200, json!({"kind": "LeverList", "apiVersion": format!("{GROUP}/v2"), "metadata": {"resourceVersion": "07"}, "items": []}))
        })
    });
    create_in_tree(&t.migrating, "levers-odd-rv", GROUP, "levers");
    let m = wait_ended(&t.migrating, "levers-odd-rv");
    assert_eq!(
        condition(&m, "Failed")["message"],
        format!("latest resourceVersion for {GROUP}/v2, Resource=levers is not valid: resource version is not well formed: 07"),
        "{m:#}"
    );
    assert_eq!(m["status"]["resourceVersion"].as_str().unwrap_or_default(), "", "{m:#}");
    assert_completed(&m);
    let records = t.proxy.records();
    let writes = object_writes(&records, &cr);
    assert!(writes.is_empty(), "nothing is written: {writes:#?}");
    let crd = cr.crd_json(cluster());
    assert_eq!(crd_condition(&crd)["reason"], "MigrationFailed", "{crd:#}");
    assert_eq!(crd["status"]["storedVersions"], json!(["v1", "v2"]), "{crd:#}");
    assert_eq!(cr.stored_counts(cluster()), BTreeMap::from([(format!("{GROUP}/v1"), 2)]));
}

use super::*;
use crate::api::storage_state::{GroupResource, StorageState, StorageStateStatus, UNKNOWN_HASH};
use crate::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
};
use crate::scheduler::report::reported_status;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const A: &str = "hashA=";
const B: &str = "hashB=";
/// No migrations (`decide` takes them owned, borrowed or shared).
const NO_MIGRATIONS: &[StorageVersionMigration] = &[];

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).expect("timestamp")
}

fn state(current: &str, persisted: &[&str], heartbeat: i64) -> StorageState {
    StorageState {
        metadata: ObjectMeta { name: Some("shootstates.core.gardener.cloud".into()), ..Default::default() },
        spec: crate::api::storage_state::StorageStateSpec {
            resource: GroupResource { group: "core.gardener.cloud".into(), resource: "shootstates".into() },
        },
        status: Some(StorageStateStatus {
            persisted_storage_version_hashes: persisted.iter().map(|s| s.to_string()).collect(),
            current_storage_version_hash: Some(current.into()),
            last_heartbeat_time: Some(Time(ts(heartbeat))),
            ..Default::default()
        }),
    }
}

fn gvr() -> GroupVersionResource {
    GroupVersionResource {
        group: "core.gardener.cloud".into(),
        version: "v1beta1".into(),
        resource: "shootstates".into(),
    }
}

/// A migration requested at `at` for `hash`, with the True condition `phase` (or none: pending).
fn svm(name: &str, hash: &str, at: i64, phase: Option<(&str, &str)>) -> StorageVersionMigration {
    let mut m = desired_migration(&gvr(), Some(hash), ts(at));
    m.metadata.name = Some(name.into());
    if let Some((type_, reason)) = phase {
        m.status = Some(crate::api::storage_version_migration::StorageVersionMigrationStatus {
            conditions: vec![MigrationCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(reason.into()),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    m
}

const I: Duration = Duration::from_secs(600);

/// A StorageState (created at ts(0)) with one report per (reporter, hash, heartbeat).
fn reported(persisted: &[&str], reports: &[(&str, &str, i64)]) -> StorageState {
    let mut s = state(reports.first().map(|r| r.1).unwrap_or(A), persisted, 100);
    s.metadata.creation_timestamp = Some(Time(ts(0)));
    s.status.as_mut().expect("status").current_storage_version_hashes = reports
        .iter()
        .map(|(id, h, hb)| crate::api::storage_state::ReportedStorageVersionHash {
            reporter_id: id.to_string(),
            current_storage_version_hash: h.to_string(),
            last_heartbeat_time: Some(Time(ts(*hb))),
        })
        .collect();
    s
}

/// The single-replica decision at ts(100) about a state whose one reporter sees `hash`.
fn one(persisted: &[&str], hash: &str, ms: &[StorageVersionMigration], reset: bool) -> Decision {
    decide(&reported(persisted, &[("r", hash, 100)]), ms, ts(100), I, reset, Replicas::One, None)
}

#[test]
fn new_resource_is_migrated_at_the_first_poll() {
    // The reporter's first report: persisted Unknown, current = hash.
    let status = reported_status(None, "r", A, ts(100), I, false);
    let mut st = reported(&[], &[]);
    st.status = Some(status);
    let d = decide(&st, NO_MIGRATIONS, ts(100), I, false, Replicas::One, None);
    assert_eq!(d.start.as_deref(), Some(A));
    assert!(d.status.is_none() && d.cancel.is_none());
}

#[test]
fn an_unfinished_migration_of_the_hash_is_kept() {
    let d = one(&[UNKNOWN_HASH], A, &[svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")))], false);
    assert_eq!(d.start, None);
    assert_eq!(d.waiting, Some("its migration is under way"));
    assert!(one(&[UNKNOWN_HASH], A, &[svm("m1", A, 1, None)], false).start.is_none());
}

#[test]
fn successes_before_the_storagestate_was_created_do_not_count() {
    // Deleting a StorageState resets it (the KEP's way): an old success does not make the new one migrated.
    let mut st = reported(&[UNKNOWN_HASH], &[("r", A, 100)]);
    st.metadata.creation_timestamp = Some(Time(ts(50)));
    let d =
        decide(&st, &[svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))], ts(100), I, false, Replicas::One, None);
    assert_eq!(d.start.as_deref(), Some(A));
}

#[test]
fn migrated_means_nothing_to_do() {
    let done = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
    assert_eq!(one(&[A], A, &done, false), Decision::default());
    // No migration at all (history pruned to nothing, or never needed): still nothing to do.
    assert_eq!(one(&[A], A, &[], false), Decision::default());
}

#[test]
fn without_a_migration_one_is_requested() {
    // The StorageState was written but its migration never was (a crash in between), or was deleted.
    assert_eq!(one(&[UNKNOWN_HASH], A, &[], false).start.as_deref(), Some(A));
    // The latest migration is for another hash (a downgrade back to A after a migration to B).
    let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
    assert_eq!(one(&[A, B], A, &ms, false).start.as_deref(), Some(A));
}

#[test]
fn a_success_sets_persisted_to_the_agreed_hash_only_for_the_latest_migration() {
    let done = [svm("m1", B, 1, Some((CONDITION_SUCCEEDED, "Done")))];
    let d = one(&[A, B], B, &done, false);
    assert_eq!(d.status.expect("update").persisted_storage_version_hashes, [B]);
    assert_eq!(d.start, None);
    // Missed while the trigger was down: applied.
    assert_eq!(one(&[UNKNOWN_HASH], B, &done, false).status.expect("update").persisted_storage_version_hashes, [B]);
    // A migration of an older hash succeeded (it finished before it could be superseded): migrate again.
    let d = one(&[A, B], A, &done, false);
    assert!(d.status.is_none());
    assert_eq!(d.start.as_deref(), Some(A));
    // A -> B -> A: the old success of A is not the latest migration; the one of B is unfinished.
    let ms = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))), svm("m2", B, 2, None)];
    assert!(one(&[A, B], A, &ms, false).status.is_none());
    // Several replicas: only when they all agree.
    let split = reported(&[A, B], &[("r1", B, 100), ("r2", A, 100)]);
    let d = decide(&split, &done, ts(100), I, false, Replicas::Several, None);
    assert!(d.status.is_none() && d.start.is_none());
}

#[test]
fn failed_migration_is_not_relaunched_but_a_superseded_one_is() {
    let failed = [svm("m1", A, 1, Some((CONDITION_FAILED, "Forbidden")))];
    let d = one(&[UNKNOWN_HASH], A, &failed, false);
    assert_eq!(d.start, None);
    assert!(d.waiting.expect("why").contains("failed"));
    // Superseded, and its successor is gone: it did not fail, it was replaced.
    let superseded = [svm("m1", A, 1, Some((CONDITION_FAILED, REASON_SUPERSEDED)))];
    assert_eq!(one(&[UNKNOWN_HASH], A, &superseded, false).start.as_deref(), Some(A));
}

#[test]
fn changed_hash_requests_a_migration_unless_requested_already() {
    let done_a = svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")));
    assert_eq!(one(&[A, B], B, std::slice::from_ref(&done_a), false).start.as_deref(), Some(B));
    // `migrate` (or a previous run) requested the migration to B before the trigger saw B.
    assert_eq!(one(&[A, B], B, &[done_a.clone(), svm("m2", B, 2, None)], false).start, None);
    // ... and it already succeeded.
    let d = one(&[A, B], B, &[svm("m2", B, 2, Some((CONDITION_SUCCEEDED, "Done")))], false);
    assert_eq!((d.start, d.status.expect("update").persisted_storage_version_hashes), (None, vec![B.to_string()]));
}

#[test]
fn reset_requests_a_migration_even_after_a_success() {
    let done = [svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done")))];
    let d = one(&[UNKNOWN_HASH], A, &done, true);
    assert_eq!(d.start.as_deref(), Some(A));
    assert!(d.status.is_none(), "persisted stays Unknown until the new migration succeeds");
    // An unfinished migration of the current hash is resumed, not restarted.
    assert!(one(&[UNKNOWN_HASH], A, &[svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")))], true).start.is_none());
}

#[test]
fn several_replicas_start_only_on_fresh_agreement_of_a_known_set_of_reporters() {
    let st = reported(&[A, B], &[("r1", B, 100), ("r2", B, 95)]);
    let set: BTreeSet<String> = ["r1".to_string(), "r2".to_string()].into();
    let at = |now: i64, prev: Option<&BTreeSet<String>>| {
        decide(&st, NO_MIGRATIONS, ts(now), I, false, Replicas::Several, prev)
    };
    assert_eq!(at(100, Some(&set)).start.as_deref(), Some(B));
    // First round of this leader, or a new reporter: one more poll.
    assert_eq!(at(100, None).waiting, Some("the set of reporters changed since the previous poll"));
    let other: BTreeSet<String> = ["r1".to_string()].into();
    assert!(at(100, Some(&other)).start.is_none());
    // r2's report is older than one interval.
    assert_eq!(at(95 + 601, Some(&set)).waiting, Some("a report is older than one discovery interval"));
    // Diverging reports cancel unfinished migrations, never start one.
    let split = reported(&[A, B], &[("r1", B, 100), ("r2", A, 100)]);
    let running = [svm("m1", B, 1, Some((CONDITION_RUNNING, "Running")))];
    let d = decide(&split, &running, ts(100), I, false, Replicas::Several, Some(&set));
    assert!(d.start.is_none());
    assert!(d.cancel.expect("cancel").contains(&format!("({A}, {B})")));
    assert!(decide(&split, NO_MIGRATIONS, ts(100), I, false, Replicas::Several, Some(&set)).cancel.is_none());
}

#[test]
fn staleness() {
    let interval = Duration::from_secs(600);
    let now = ts(10_000);
    assert!(!is_stale(&state(A, &[A], 10_000 - 1200), now, interval));
    assert!(is_stale(&state(A, &[A], 10_000 - 1201), now, interval));
    let mut never = state(A, &[A], 0);
    never.status.as_mut().expect("status").last_heartbeat_time = None;
    assert!(is_stale(&never, now, interval));
}

#[test]
fn ordering_uses_the_sub_second_request_time() {
    let mut early =
        desired_migration(&gvr(), Some(A), Timestamp::from_nanosecond(1_700_000_000_100_000_000).expect("ts"));
    early.metadata.name = Some("zzz".into());
    let mut late =
        desired_migration(&gvr(), Some(B), Timestamp::from_nanosecond(1_700_000_000_900_000_000).expect("ts"));
    late.metadata.name = Some("aaa".into());
    let both = [late.clone(), early.clone()];
    assert_eq!(latest(&both).and_then(|m| m.metadata.name.as_deref()), Some("aaa"));
}

#[test]
fn supersede_and_prune_selection() {
    let ms = vec![
        svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))),
        svm("m2", A, 2, Some((CONDITION_FAILED, REASON_SUPERSEDED))),
        svm("m3", A, 3, Some((CONDITION_FAILED, "Forbidden"))),
        svm("m4", B, 4, Some((CONDITION_RUNNING, "Running"))),
        svm("m5", B, 5, None),
    ];
    let names = |v: Vec<&StorageVersionMigration>| v.iter().map(|m| name_of(m).to_string()).collect::<Vec<_>>();
    assert_eq!(names(to_supersede(&ms, "m5")), ["m4"]);
    assert_eq!(to_prune(&ms, 2), ["m1"]);
    assert_eq!(to_prune(&ms, 1), ["m1", "m2"]);
    assert!(to_prune(&ms, 5).is_empty());
}

#[test]
fn superseded_status_never_reverts_a_terminal_condition() {
    let running = svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")));
    let st = superseded_status(&running, &superseded_by("m2"), ts(5)).expect("status");
    let by_type = |t: &str| st.conditions.iter().find(|c| c.type_ == t).cloned().expect("condition");
    assert_eq!(by_type(CONDITION_FAILED).status, "True");
    assert_eq!(by_type(CONDITION_FAILED).reason.as_deref(), Some(REASON_SUPERSEDED));
    assert!(by_type(CONDITION_FAILED).message.expect("message").contains("m2"));
    assert_eq!(by_type(CONDITION_RUNNING).status, "False");
    // Valid per the API's own rules.
    let mut m = running.clone();
    m.status = Some(st);
    assert!(
        crate::registry::strategy::Kind::validate(&m).is_empty(),
        "{:?}",
        crate::registry::strategy::Kind::validate(&m)
    );
    for done in [CONDITION_SUCCEEDED, CONDITION_FAILED] {
        assert!(superseded_status(&svm("m1", A, 1, Some((done, "X"))), "m2", ts(5)).is_none());
    }
}

#[test]
fn desired_migration_names_and_labels() {
    let m = desired_migration(&gvr(), Some(A), ts(0));
    assert_eq!(m.metadata.generate_name.as_deref(), Some("shootstates.core.gardener.cloud-"));
    let labels = m.metadata.labels.clone().expect("labels");
    assert_eq!(labels[LABEL_RESOURCE], "shootstates.core.gardener.cloud");
    let ann = m.metadata.annotations.clone().expect("annotations");
    assert_eq!(ann[ANNOTATION_HASH], A);
    assert!(!ann.contains_key(ANNOTATION_RESOURCE));
    assert_eq!(m.spec.resource, gvr());
    // Core group.
    let pods = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "pods".into() };
    let m = desired_migration(&pods, Some(A), ts(0));
    assert_eq!(m.metadata.generate_name.as_deref(), Some("pods-"));
    assert_eq!(m.metadata.labels.expect("labels")[LABEL_RESOURCE], "pods");
    // Too long for a label value: shortened with a hash, full name in the annotation.
    let group = format!("{}.example.com", "very-long-group-name".repeat(3));
    let long = GroupVersionResource { group: group.clone(), version: "v1".into(), resource: "widgets".into() };
    let m = desired_migration(&long, None, ts(0));
    let label = m.metadata.labels.expect("labels")[LABEL_RESOURCE].clone();
    assert!(label.len() <= 63, "{label}");
    assert!(label.starts_with("widgets.very-long") && label.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
    let ann = m.metadata.annotations.expect("annotations");
    assert_eq!(ann[ANNOTATION_RESOURCE], format!("widgets.{group}"));
    assert!(!ann.contains_key(ANNOTATION_HASH));
    // Different long names get different labels.
    let other = resource_label_value(&group, "gadgets").0;
    assert_ne!(other, label);
}

fn api_resource(name: &str, verbs: &[&str], hash: Option<&str>) -> APIResource {
    APIResource {
        name: name.into(),
        kind: "K".into(),
        namespaced: true,
        singular_name: String::new(),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        storage_version_hash: hash.map(str::to_string),
        ..Default::default()
    }
}

fn list(gv: &str, resources: Vec<APIResource>) -> APIResourceList {
    APIResourceList { group_version: gv.into(), resources }
}

const RW: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

#[test]
fn group_resources_prefers_the_preferred_version_and_skips_subresources() {
    let lists = vec![
        (
            "v1beta1".to_string(),
            list("g/v1beta1", vec![api_resource("a", RW, Some(A)), api_resource("a/status", &["get"], None)]),
        ),
        (
            "v1alpha1".to_string(),
            list("g/v1alpha1", vec![api_resource("a", RW, Some(A)), api_resource("b", RW, Some(B))]),
        ),
    ];
    let rs = group_resources("g", &lists);
    assert_eq!(rs.len(), 2);
    assert_eq!((rs[0].resource.as_str(), rs[0].version.as_str()), ("a", "v1beta1"));
    assert_eq!(rs[0].versions, ["v1beta1", "v1alpha1"]);
    assert_eq!(rs[0].hash.as_deref(), Some(A));
    // Only in a non-preferred version: that version.
    assert_eq!((rs[1].resource.as_str(), rs[1].version.as_str()), ("b", "v1alpha1"));
}

#[test]
fn initializer_rule() {
    let mut d = Discovery::default();
    d.resources.extend(group_resources(
        "",
        &[(
            "v1".into(),
            list(
                "v1",
                vec![
                    api_resource("pods", RW, Some(A)),
                    api_resource("events", RW, Some(A)),
                    api_resource("bindings", &["create"], None),
                ],
            ),
        )],
    ));
    d.resources.extend(group_resources(
        "events.k8s.io",
        &[("v1".into(), list("events.k8s.io/v1", vec![api_resource("events", RW, Some(A))]))],
    ));
    d.resources.extend(group_resources(
        "core.gardener.cloud",
        &[
            ("v1beta1".into(), list("core.gardener.cloud/v1beta1", vec![api_resource("shootstates", RW, Some(B))])),
            ("v1alpha1".into(), list("core.gardener.cloud/v1alpha1", vec![api_resource("shootstates", RW, Some(B))])),
        ],
    ));
    d.resources.extend(group_resources(
        "crd.example.com",
        &[
            ("v2".into(), list("crd.example.com/v2", vec![api_resource("widgets", RW, Some(A))])),
            ("v1".into(), list("crd.example.com/v1", vec![api_resource("widgets", RW, Some(A))])),
        ],
    ));
    d.resources.extend(group_resources(
        "metrics.k8s.io",
        &[("v1beta1".into(), list("metrics.k8s.io/v1beta1", vec![api_resource("pods", &["get", "list"], None)]))],
    ));
    d.resources.extend(group_resources(
        "extensions",
        &[("v1beta1".into(), list("extensions/v1beta1", vec![api_resource("ingresses", RW, Some(A))]))],
    ));
    d.resources.extend(group_resources(
        "networking.k8s.io",
        &[(
            "v1".into(),
            list("networking.k8s.io/v1", vec![api_resource("ingresses", &["get", "list", "patch"], Some(A))]),
        )],
    ));
    d.resources.extend(group_resources(
        "readonly.io",
        &[
            ("v2".into(), list("readonly.io/v2", vec![api_resource("things", &["get", "list"], Some(A))])),
            ("v1".into(), list("readonly.io/v1", vec![api_resource("things", &["get", "list"], Some(A))])),
        ],
    ));
    let crds = BTreeSet::from(["crd.example.com".to_string()]);
    let aggregated = BTreeSet::from(["metrics.k8s.io".to_string()]);
    let got: Vec<String> = migratable_resources(&d, &crds, &aggregated)
        .iter()
        .map(|r| format!("{}/{}", r.gvr().display(), r.hash.clone().unwrap_or_default()))
        .collect();
    // shootstates: 2 versions; ingresses: 2 groups, the first in discovery order; pods only once (the
    // aggregated metrics group does not count); events never; CRDs never; things cannot be updated.
    assert_eq!(
        got,
        [format!("shootstates.v1beta1.core.gardener.cloud/{B}"), format!("ingresses.v1beta1.extensions/{A}")]
    );
}

#[test]
fn a_migration_queues_the_storagestate_of_its_resource() {
    use kube::runtime::reflector::ObjectRef;
    assert_eq!(state_of(&svm("m1", A, 1, None)), ObjectRef::new("shootstates.core.gardener.cloud"));
    // Created by hand: no label, yet it counts for its resource.
    let mut by_hand = svm("m2", A, 1, None);
    by_hand.metadata.labels = None;
    by_hand.spec.resource =
        GroupVersionResource { group: String::new(), version: "v1".into(), resource: "pods".into() };
    assert_eq!(state_of(&by_hand), ObjectRef::new("pods"));
    // A name too long for a label value: the label is shortened, the StorageState is the full name.
    let group = format!("{}.example.com", "g".repeat(60));
    let long = desired_migration(
        &GroupVersionResource { group: group.clone(), version: "v1".into(), resource: "widgets".into() },
        Some(A),
        ts(1),
    );
    assert_eq!(state_of(&long), ObjectRef::new(&format!("widgets.{group}")));
}

#[tokio::test]
async fn periodic_rounds_are_due_an_interval_apart_per_storagestate() {
    use kube::runtime::controller::Action;
    use tokio::time::Instant;
    let config = crate::scheduler::SchedulerConfig { discovery_interval: I, ..Default::default() };
    let decider = Decider::new(OwnObjects::new(canned_target()), &config, Served::default());
    let (migrations, _writer) = kube::runtime::reflector::store();
    let context = DeciderContext::new(decider, migrations, I);
    let t0 = Instant::now();
    let second = Duration::from_secs(1);
    assert!(context.round_due("a", t0), "the first decision is a round");
    assert!(!context.round_due("a", t0 + second), "a change within the interval is no round");
    assert_eq!(context.until_next_round("a", t0 + second), Action::requeue(I - second));
    assert!(context.round_due("b", t0 + second), "rounds are per StorageState");
    assert!(context.round_due("a", t0 + I), "an interval later");
    assert!(!context.round_due("a", t0 + I + second));
    assert_eq!(context.until_next_round("a", t0 + 3 * I), Action::requeue(Duration::ZERO), "overdue: at once");
}

/// A target with canned discovery documents: one group answers 503.
fn canned_target() -> kube::Client {
    use axum::routing::get;
    use axum::Json;
    let rl = |gv: &str, name: &str, hash: &str| {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
            {"name": name, "singularName": "", "namespaced": true, "kind": "K", "verbs": ["get", "list", "update"], "storageVersionHash": hash},
            {"name": format!("{name}/status"), "singularName": "", "namespaced": true, "kind": "K", "verbs": ["get", "update"]},
        ]})
    };
    let group = |name: &str, versions: &[&str]| {
        let vs: Vec<Value> =
            versions.iter().map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
        json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
    };
    let apis = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group("good.io", &["v2", "v1"]), group("broken.io", &["v1"])]});
    let (good2, good1) = (rl("good.io/v2", "widgets", A), rl("good.io/v1", "widgets", A));
    let core = rl("v1", "pods", B);
    let router = axum::Router::new()
        .route("/api", get(|| async { Json(json!({"kind": "APIVersions", "versions": ["v1"]})) }))
        .route("/api/v1", get(move || async move { Json(core) }))
        .route("/apis", get(move || async move { Json(apis) }))
        .route("/apis/good.io/v2", get(move || async move { Json(good2) }))
        .route("/apis/good.io/v1", get(move || async move { Json(good1) }))
        .route(
            "/apis/broken.io/v1",
            get(|| async {
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                                    "reason": "ServiceUnavailable", "message": "the server is currently unable to handle the request"});
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(status))
            }),
        );
    crate::scheduler::in_process_client(router)
}

#[tokio::test]
async fn discovery_reports_failing_groups_and_keeps_the_rest() {
    let d = discover(&canned_target(), Duration::from_secs(5)).await.expect("discovery");
    let got: Vec<(String, String, Vec<String>, Option<String>)> =
        d.resources.iter().map(|r| (r.qualified(), r.version.clone(), r.versions.clone(), r.hash.clone())).collect();
    assert_eq!(
        got,
        [
            ("pods".to_string(), "v1".to_string(), vec!["v1".to_string()], Some(B.to_string())),
            (
                "widgets.good.io".to_string(),
                "v2".to_string(),
                vec!["v2".to_string(), "v1".to_string()],
                Some(A.to_string())
            ),
        ]
    );
    assert_eq!(d.failed.keys().collect::<Vec<_>>(), ["broken.io"]);
    assert!(d.failed["broken.io"].contains("unable to handle"), "{:?}", d.failed);
    // `migrate` names the failed groups when a resource is not found.
    assert!(resolve_resource(&d, "things.broken.io")
        .unwrap_err()
        .to_string()
        .contains("discovery failed for: broken.io"));
    // Without the group list there is nothing to work with.
    let router = axum::Router::new();
    let err = discover(&crate::scheduler::in_process_client(router), Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err.path, "/apis");
}

#[test]
fn resolve_by_qualified_or_unique_name() {
    let mut d = Discovery::default();
    d.resources.extend(group_resources("", &[("v1".into(), list("v1", vec![api_resource("pods", RW, Some(A))]))]));
    d.resources.extend(group_resources(
        "apps",
        &[("v1".into(), list("apps/v1", vec![api_resource("deployments", RW, Some(B))]))],
    ));
    d.resources.extend(group_resources(
        "metrics.k8s.io",
        &[("v1beta1".into(), list("metrics.k8s.io/v1beta1", vec![api_resource("pods", &["get"], None)]))],
    ));
    assert_eq!(resolve_resource(&d, "deployments.apps").expect("found").version, "v1");
    assert_eq!(resolve_resource(&d, "deployments").expect("found").group, "apps");
    assert_eq!(resolve_resource(&d, "pods").expect("found").group, "");
    assert_eq!(resolve_resource(&d, "pods.metrics.k8s.io").expect("found").group, "metrics.k8s.io");
    assert!(resolve_resource(&d, "widgets").unwrap_err().to_string().contains("doesn't have a resource type"));
}

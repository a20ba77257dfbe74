use super::*;
use crate::api::storage_state::{GroupResource, StorageState, StorageStateStatus, UNKNOWN_HASH};
use crate::api::storage_version_migration::{
    GroupVersionResource, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING, CONDITION_SUCCEEDED,
};
use crate::scheduler::report::reported_status;
use crate::scheduler::trigger_kit::test_fixtures::{svm, ts, A, B};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use std::collections::BTreeSet;
use std::time::Duration;

/// No migrations (`decide` takes them owned, borrowed or shared).
const NO_MIGRATIONS: &[StorageVersionMigration] = &[];

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
    let decider = Decider::new(
        OwnObjects::new(crate::client::in_process_client(axum::Router::new())),
        &config,
        Served::default(),
    );
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

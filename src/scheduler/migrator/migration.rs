//! A migration to run, whichever API requested it: `migration.k8s.io/v1alpha1` (ours, the trigger's and `migrate`'s)
//! or `storagemigration.k8s.io` (the in-tree kind of KEP-4192). The worker and the scheduler know only [`Migration`];
//! how each kind records a checkpoint, progress and its conditions is decided here.
//!
//! The in-tree kind follows kube-controller-manager's controllers at GA (Kubernetes 1.37, kubernetes/kubernetes
//! `pkg/controller/storageversionmigrator/`: migrationrunner.go, resourceversion.go, storageversionmigrator.go and
//! util.go after PRs #135297, #138560, #138874 and #138875), one step each:
//! - the runner promotes it: `Running=True`, reason `MigrationRunning`, message `The migration is running`;
//! - the resource-version controller records the resource's list resourceVersion in `status.resourceVersion`, or
//!   fails it (`resource does not exist in discovery`, unsupported verbs, a malformed resourceVersion);
//! - the migrator rewrites the objects, its progress in the Running message (`The migration is running, X/Y objects
//!   not yet migrated`, `; transient error: ...`), and ends it: `Succeeded=True` (`Migration completed`, the
//!   Running message `..., Y objects verified migrated`) or `Failed=True` (`X/Y not yet migrated. migration
//!   encountered unhandled error: ...`), Running still True;
//! - the runner ends it: `Running=False`, reason `MigrationCompleted`, message `Migration completed`.
//!
//! That kind has no field for a continue token or progress: ours are kept in annotations (written through the main
//! resource, whose update leaves the status alone), so that it resumes after a crash as ours do.

use super::in_tree::*;
use super::ANNOTATION_MIGRATED_AT_TOKEN;
use crate::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
};
use crate::api::storagemigration::StorageVersionMigration as InTreeMigration;
use crate::registry::Subresource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use std::collections::BTreeMap;

/// Where an in-tree migration's list resumes (our kind has `spec.continueToken`).
pub const ANNOTATION_CONTINUE_TOKEN: &str = "migration.k8s.io/continue-token";
/// An in-tree migration's progress (our kind has `status.migratedObjects` and `status.remainingObjectsEstimate`).
pub const ANNOTATION_MIGRATED_OBJECTS: &str = "migration.k8s.io/migrated-objects";
pub const ANNOTATION_REMAINING_OBJECTS: &str = "migration.k8s.io/remaining-objects-estimate";

/// Our kind's condition reasons.
const REASON_MIGRATING: &str = "Migrating";
const REASON_COMPLETED: &str = "Completed";
const REASON_FAILED: &str = "MigrationFailed";

/// The API a migration was requested through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MigrationApi {
    /// `migration.k8s.io/v1alpha1`.
    Ours,
    /// `storagemigration.k8s.io` (v1, the storage version, and v1beta1).
    InTree,
}

/// A migration's identity in the scheduler: names are unique only within one API.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigrationKey {
    pub api: MigrationApi,
    pub name: String,
}

/// The resource a migration rewrites, without a version: at most one migration per resource runs at a time.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub group: String,
    pub resource: String,
}

/// How a migration ended, for [`Migration::set_outcome`].
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Every object handled (`total`); `message` is ours.
    Succeeded { total: i64, message: String },
    /// `message` is ours; `in_tree` what the in-tree controllers say; `counts` the progress when it failed.
    Failed { message: String, in_tree: InTreeFailure, counts: Option<Counts> },
}

/// Which part of the work writes a migration: upstream's three in-tree controllers name themselves apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Running=True (the runner).
    Promote,
    /// `status.resourceVersion`, or a failure to record it (the resource-version controller).
    Checkpoint,
    /// Progress, continue token and outcome (the migrator).
    Migrate,
    /// Running=False at the end (the runner).
    Complete,
}

/// A migration to run.
#[derive(Clone, Debug)]
pub enum Migration {
    Ours(StorageVersionMigration),
    InTree(InTreeMigration),
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn is_true_in_tree(m: &InTreeMigration, type_: &str) -> bool {
    m.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Sets (adds or replaces) a condition of our kind.
fn set_ours(svm: &mut StorageVersionMigration, type_: &str, status: bool, reason: &str, message: &str) {
    let conditions = &mut svm.status.get_or_insert_with(Default::default).conditions;
    let c = MigrationCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_update_time: Some(now()),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
    };
    match conditions.iter_mut().find(|x| x.type_ == type_) {
        Some(x) => *x = c,
        None => conditions.push(c),
    }
}

/// Sets a condition of the in-tree kind as apimachinery's `meta.SetStatusCondition` does: lastTransitionTime moves
/// only when the status changes; reason, message and observedGeneration are replaced (upstream passes a generation
/// only when it ends the migration).
fn set_in_tree(
    m: &mut InTreeMigration,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) {
    let conditions = &mut m.status.get_or_insert_with(Default::default).conditions;
    let status = if status { "True" } else { "False" }.to_string();
    match conditions.iter_mut().find(|x| x.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now();
                c.status = status;
            }
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            observed_generation,
            last_transition_time: now(),
            reason: reason.to_string(),
            message: message.to_string(),
        }),
    }
}

fn annotations(meta: &mut ObjectMeta) -> &mut BTreeMap<String, String> {
    meta.annotations.get_or_insert_with(Default::default)
}

fn annotation_i64(meta: &ObjectMeta, key: &str) -> Option<i64> {
    meta.annotations.as_ref()?.get(key)?.parse().ok()
}

impl Migration {
    pub fn api(&self) -> MigrationApi {
        match self {
            Migration::Ours(_) => MigrationApi::Ours,
            Migration::InTree(_) => MigrationApi::InTree,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Migration::Ours(m) => &m.metadata,
            Migration::InTree(m) => &m.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Migration::Ours(m) => &mut m.metadata,
            Migration::InTree(m) => &mut m.metadata,
        }
    }

    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    pub fn key(&self) -> MigrationKey {
        MigrationKey { api: self.api(), name: self.name().to_string() }
    }

    /// `storageversionmigration.migration.k8s.io/<name>` or `storageversionmigration.storagemigration.k8s.io/<name>`.
    pub fn display(&self) -> String {
        match self {
            Migration::Ours(_) => format!("storageversionmigration.migration.k8s.io/{}", self.name()),
            Migration::InTree(_) => format!("storageversionmigration.storagemigration.k8s.io/{}", self.name()),
        }
    }

    pub fn resource(&self) -> ResourceKey {
        match self {
            Migration::Ours(m) => {
                ResourceKey { group: m.spec.resource.group.clone(), resource: m.spec.resource.resource.clone() }
            }
            Migration::InTree(m) => {
                ResourceKey { group: m.spec.resource.group.clone(), resource: m.spec.resource.resource.clone() }
            }
        }
    }

    /// The version to list and write through: ours names it; the in-tree kind leaves it to the target's discovery
    /// (None).
    pub fn requested_gvr(&self) -> Option<GroupVersionResource> {
        match self {
            Migration::Ours(m) => Some(m.spec.resource.clone()),
            Migration::InTree(_) => None,
        }
    }

    pub fn is_true(&self, type_: &str) -> bool {
        match self {
            Migration::Ours(m) => m.is_true(type_),
            Migration::InTree(m) => is_true_in_tree(m, type_),
        }
    }

    pub fn is_finished(&self) -> bool {
        self.is_true(CONDITION_SUCCEEDED) || self.is_true(CONDITION_FAILED)
    }

    pub fn is_running(&self) -> bool {
        self.is_true(CONDITION_RUNNING)
    }

    /// Succeeded, Failed, Running or Pending.
    pub fn phase(&self) -> &'static str {
        [CONDITION_SUCCEEDED, CONDITION_FAILED, CONDITION_RUNNING]
            .into_iter()
            .find(|t| self.is_true(t))
            .unwrap_or("Pending")
    }

    /// The Running condition's message.
    pub fn running_message(&self) -> Option<&str> {
        self.condition_message(CONDITION_RUNNING)
    }

    /// The message of condition `type_`.
    pub fn condition_message(&self, type_: &str) -> Option<&str> {
        match self {
            Migration::Ours(m) => m.condition(type_).and_then(|c| c.message.as_deref()),
            Migration::InTree(m) => {
                m.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).map(|c| c.message.as_str())
            }
        }
    }

    /// The Running condition's message while the migration runs: ours names the resource and what is retried
    /// (`Retrying: <error>`); the in-tree kind's is upstream's progress message.
    pub fn progress_message(
        &self,
        gvr: &GroupVersionResource,
        counts: Option<Counts>,
        retrying: Option<&str>,
    ) -> String {
        self.progress_message_at(gvr, counts, retrying, None)
    }

    /// [`Self::progress_message`], ours naming the migrator's rate limit (requests/s to the target, two significant
    /// digits, so that it does not change the message at every step of the adaptive rate).
    pub fn progress_message_at(
        &self,
        gvr: &GroupVersionResource,
        counts: Option<Counts>,
        retrying: Option<&str>,
        rate: Option<f64>,
    ) -> String {
        match self {
            Migration::Ours(_) => {
                let base = match rate {
                    Some(r) => format!("Migrating {} at up to {} requests/s.", gvr.display(), two_digits(r)),
                    None => format!("Migrating {}.", gvr.display()),
                };
                match retrying {
                    Some(why) => super::truncate(&format!("{base} Retrying: {why}"), 32000),
                    None => base,
                }
            }
            Migration::InTree(_) => in_tree_running_message(counts, retrying),
        }
    }

    /// The field manager of a write at `step`.
    pub fn manager(&self, step: Step) -> &'static str {
        use crate::scheduler::managers;
        match (self, step) {
            (Migration::Ours(_), _) => managers::MIGRATOR,
            (Migration::InTree(_), Step::Promote | Step::Complete) => managers::MIGRATION_RUNNER,
            (Migration::InTree(_), Step::Checkpoint) => managers::RESOURCE_VERSION,
            (Migration::InTree(_), Step::Migrate) => managers::IN_TREE_MIGRATOR,
        }
    }

    /// Whether the migration ended (Succeeded or Failed) with Running still True: the in-tree runner's last step
    /// ([`complete`](Self::complete)) is still to come. Ours ends Running with its outcome.
    pub fn needs_completion(&self) -> bool {
        matches!(self, Migration::InTree(_)) && self.is_finished() && self.is_running()
    }

    /// Running=False, reason `MigrationCompleted`, message `Migration completed`, observedGeneration the
    /// migration's generation (the in-tree runner's cleanup; a status write).
    pub fn complete(&mut self) {
        if let Migration::InTree(m) = self {
            let generation = m.metadata.generation;
            set_in_tree(m, CONDITION_RUNNING, false, IN_TREE_REASON_COMPLETED, IN_TREE_COMPLETED, generation);
        }
    }

    /// Where the list resumes (None: from the start).
    pub fn continue_token(&self) -> Option<String> {
        let token = match self {
            Migration::Ours(m) => m.spec.continue_token.clone(),
            Migration::InTree(m) => {
                m.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_CONTINUE_TOKEN)).cloned()
            }
        };
        token.filter(|t| !t.is_empty())
    }

    /// Objects handled before [`continue_token`](Self::continue_token).
    pub fn migrated_at_token(&self) -> i64 {
        annotation_i64(self.meta(), ANNOTATION_MIGRATED_AT_TOKEN).unwrap_or(0)
    }

    /// Records where the list resumes and how many objects were handled before it: a main-resource write.
    pub fn set_checkpoint(&mut self, token: &str, migrated: i64) {
        if let Migration::Ours(m) = self {
            m.spec.continue_token = Some(token.to_string());
        } else {
            annotations(self.meta_mut()).insert(ANNOTATION_CONTINUE_TOKEN.into(), token.to_string());
        }
        annotations(self.meta_mut()).insert(ANNOTATION_MIGRATED_AT_TOKEN.into(), migrated.to_string());
    }

    /// Objects handled so far and the estimate of those left, as last saved.
    pub fn progress(&self) -> (Option<i64>, Option<i64>) {
        match self {
            Migration::Ours(m) => {
                let s = m.status.as_ref();
                (s.and_then(|s| s.migrated_objects), s.and_then(|s| s.remaining_objects_estimate))
            }
            Migration::InTree(m) => (
                annotation_i64(&m.metadata, ANNOTATION_MIGRATED_OBJECTS),
                annotation_i64(&m.metadata, ANNOTATION_REMAINING_OBJECTS),
            ),
        }
    }

    /// Where [`set_progress`](Self::set_progress) is written: ours in its status, the in-tree kind's annotations
    /// through the main resource.
    pub fn progress_subresource(&self) -> Subresource {
        match self {
            Migration::Ours(_) => Subresource::Status,
            Migration::InTree(_) => Subresource::Main,
        }
    }

    pub fn set_progress(&mut self, handled: i64, remaining: Option<i64>) {
        match self {
            Migration::Ours(m) => {
                let st = m.status.get_or_insert_with(Default::default);
                st.migrated_objects = Some(handled);
                st.remaining_objects_estimate = remaining;
            }
            Migration::InTree(m) => {
                let a = annotations(&mut m.metadata);
                a.insert(ANNOTATION_MIGRATED_OBJECTS.into(), handled.to_string());
                match remaining {
                    Some(r) => a.insert(ANNOTATION_REMAINING_OBJECTS.into(), r.to_string()),
                    None => a.remove(ANNOTATION_REMAINING_OBJECTS),
                };
            }
        }
    }

    /// Whether the migration still has to record the resource's list resourceVersion before it runs (the in-tree
    /// kind's `status.resourceVersion`).
    pub fn needs_resource_version(&self) -> bool {
        match self {
            Migration::Ours(_) => false,
            Migration::InTree(m) => m.status.as_ref().is_none_or(|s| s.resource_version.is_empty()),
        }
    }

    /// Records `status.resourceVersion` (the in-tree kind; ours has none).
    pub fn set_resource_version(&mut self, resource_version: &str) {
        if let Migration::InTree(m) = self {
            m.status.get_or_insert_with(Default::default).resource_version = resource_version.to_string();
        }
    }

    /// Running=True with `message` (a status write).
    pub fn set_running(&mut self, message: &str) {
        match self {
            Migration::Ours(m) => set_ours(m, CONDITION_RUNNING, true, REASON_MIGRATING, message),
            Migration::InTree(m) => set_in_tree(m, CONDITION_RUNNING, true, IN_TREE_REASON_RUNNING, message, None),
        }
    }

    /// Succeeded or Failed, Running=False (a status write).
    pub fn set_outcome(&mut self, outcome: &Outcome) {
        match (self, outcome) {
            (Migration::Ours(m), Outcome::Succeeded { total, message }) => {
                set_ours(m, CONDITION_RUNNING, false, REASON_COMPLETED, message);
                set_ours(m, CONDITION_SUCCEEDED, true, REASON_COMPLETED, message);
                let st = m.status.get_or_insert_with(Default::default);
                st.migrated_objects = Some(*total);
                st.remaining_objects_estimate = Some(0);
            }
            (Migration::Ours(m), Outcome::Failed { message, .. }) => {
                set_ours(m, CONDITION_RUNNING, false, REASON_FAILED, message);
                set_ours(m, CONDITION_FAILED, true, REASON_FAILED, message);
            }
            (Migration::InTree(m), Outcome::Succeeded { total, .. }) => {
                // Running stays True (the runner ends it next): its message says what was verified.
                set_in_tree(
                    m,
                    CONDITION_RUNNING,
                    true,
                    IN_TREE_REASON_RUNNING,
                    &in_tree_verified_message(*total),
                    None,
                );
                set_in_tree(m, CONDITION_SUCCEEDED, true, IN_TREE_REASON_SUCCEEDED, IN_TREE_COMPLETED, None);
            }
            (Migration::InTree(m), Outcome::Failed { in_tree, counts, .. }) => {
                let message = match in_tree {
                    InTreeFailure::Checkpoint(message) => message.clone(),
                    InTreeFailure::Unhandled(error) => {
                        let running = in_tree_running_message(*counts, None);
                        set_in_tree(m, CONDITION_RUNNING, true, IN_TREE_REASON_RUNNING, &running, None);
                        in_tree_unhandled_message(*counts, error)
                    }
                };
                set_in_tree(m, CONDITION_FAILED, true, IN_TREE_REASON_FAILED, &message, None);
            }
        }
    }
}

/// `r` rounded to two significant digits, without a fraction: 40, 1300, 27000.
fn two_digits(r: f64) -> u64 {
    let r = r.max(1.0);
    let scale = 10f64.powi((r.log10().floor() as i32 - 1).max(0));
    ((r / scale).round() * scale) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_tree() -> Migration {
        let m: InTreeMigration = serde_json::from_value(serde_json::json!({
            "apiVersion": "storagemigration.k8s.io/v1",
            "kind": "StorageVersionMigration",
            "metadata": {"name": "m", "generation": 3},
            "spec": {"resource": {"group": "core.gardener.cloud", "resource": "shootstates"}}
        }))
        .expect("a valid in-tree migration");
        Migration::InTree(m)
    }

    fn conditions(m: &Migration) -> Vec<(String, String, String, String, Option<i64>)> {
        let Migration::InTree(svm) = m else { unreachable!() };
        let status = svm.status.as_ref().expect("a status");
        let c = status.conditions.iter();
        c.map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone(), c.observed_generation))
            .collect()
    }

    fn c(t: &str, s: &str, r: &str, m: &str, g: Option<i64>) -> (String, String, String, String, Option<i64>) {
        (t.into(), s.into(), r.into(), m.into(), g)
    }

    // kubernetes/kubernetes pkg/controller/storageversionmigrator/migrationrunner_test.go: "Initial sync: CRD
    // missing" (promotion), "Cleanup admission updates SVM condition" (the end); storageversionmigrator_test.go's
    // success case (Running message and Succeeded in one write).
    #[test]
    fn in_tree_conditions_follow_the_ga_controllers() {
        let mut m = in_tree();
        assert!(m.needs_resource_version());
        m.set_running(IN_TREE_RUNNING);
        assert_eq!(m.phase(), "Running");
        assert_eq!(conditions(&m), [c("Running", "True", "MigrationRunning", "The migration is running", None)]);
        m.set_resource_version("42");
        assert!(!m.needs_resource_version());
        let gvr = GroupVersionResource { group: "g".into(), version: "v1".into(), resource: "rs".into() };
        m.set_running(&m.progress_message(&gvr, Counts::of(2, Some(3)), None));
        assert_eq!(m.running_message(), Some("The migration is running, 3/5 objects not yet migrated"));
        m.set_running(&m.progress_message(&gvr, Counts::of(2, Some(3)), Some("503 Service Unavailable")));

        assert_eq!(
            m.running_message(),
            Some("The migration is running, 3/5 objects not yet migrated; transient error: 503 Service Unavailable")
        );
        m.set_outcome(&Outcome::Succeeded { total: 5, message: "ours".into() });
        assert_eq!(m.phase(), "Succeeded");
        assert!(m.needs_completion());
        assert_eq!(
            conditions(&m),
            [
                c("Running", "True", "MigrationRunning", "The migration is running, 5 objects verified migrated", None),
                c("Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed", None),
            ]
        );
        m.complete();
        assert!(!m.needs_completion());
        assert_eq!(
            conditions(&m),
            [
                c("Running", "False", "MigrationCompleted", "Migration completed", Some(3)),
                c("Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed", None),
            ]
        );
        // No objects: no count.
        assert_eq!(in_tree_verified_message(0), IN_TREE_RUNNING);
    }

    #[test]
    fn in_tree_failures_carry_the_in_tree_messages() {
        let mut m = in_tree();
        m.set_running(IN_TREE_RUNNING);
        let failure = InTreeFailure::Checkpoint(IN_TREE_NOT_IN_DISCOVERY.into());
        m.set_outcome(&Outcome::Failed { message: "x".into(), in_tree: failure, counts: None });
        assert_eq!(m.phase(), "Failed");
        assert_eq!(
            conditions(&m),
            [
                c("Running", "True", "MigrationRunning", "The migration is running", None),
                c("Failed", "True", "StorageVersionMigrationFailed", IN_TREE_NOT_IN_DISCOVERY, None),
            ]
        );
        let mut m = in_tree();
        m.set_running(IN_TREE_RUNNING);
        let failure = InTreeFailure::Unhandled("rewriting x: 403".into());
        m.set_outcome(&Outcome::Failed { message: "x".into(), in_tree: failure, counts: Counts::of(1, Some(2)) });
        assert_eq!(
            conditions(&m),
            [
                c(
                    "Running",
                    "True",
                    "MigrationRunning",
                    "The migration is running, 2/3 objects not yet migrated",
                    None
                ),
                c(
                    "Failed",
                    "True",
                    "StorageVersionMigrationFailed",
                    "2/3 not yet migrated. migration encountered unhandled error: rewriting x: 403",
                    None
                ),
            ]
        );
        assert!(m.needs_completion());
    }

    #[test]
    fn each_step_names_its_field_manager() {
        use crate::scheduler::managers;
        let m = in_tree();
        assert_eq!(m.manager(Step::Promote), managers::MIGRATION_RUNNER);
        assert_eq!(m.manager(Step::Checkpoint), managers::RESOURCE_VERSION);
        assert_eq!(m.manager(Step::Migrate), managers::IN_TREE_MIGRATOR);
        assert_eq!(m.manager(Step::Complete), managers::MIGRATION_RUNNER);
    }

    #[test]
    fn in_tree_checkpoint_and_progress_live_in_annotations() {
        let mut m = in_tree();
        assert_eq!((m.continue_token(), m.migrated_at_token()), (None, 0));
        m.set_checkpoint("abc", 500);
        m.set_progress(600, Some(400));
        assert_eq!((m.continue_token().as_deref(), m.migrated_at_token()), (Some("abc"), 500));
        assert_eq!(m.progress(), (Some(600), Some(400)));
        assert_eq!(m.progress_subresource(), Subresource::Main);
    }

    #[test]
    fn our_running_message_names_the_rate_in_two_digits() {
        let m = Migration::Ours(Default::default());
        let gvr = GroupVersionResource { group: "g".into(), version: "v1".into(), resource: "rs".into() };
        assert_eq!(
            m.progress_message_at(&gvr, None, None, Some(1349.7)),
            "Migrating rs.v1.g at up to 1300 requests/s."
        );
        assert_eq!(two_digits(40.0), 40);
        assert_eq!(two_digits(26_800.0), 27_000);
    }
}

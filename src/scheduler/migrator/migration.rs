//! A migration to run, whichever API requested it: `migration.k8s.io/v1alpha1` (ours, the trigger's and `migrate`'s)
//! or `storagemigration.k8s.io` (the in-tree kind of KEP-4192). The worker and the scheduler know only [`Migration`];
//! how each kind records a checkpoint, progress and its conditions is decided here.
//!
//! The in-tree kind follows kube-controller-manager's controller (kubernetes/kubernetes
//! `pkg/controller/storageversionmigrator/`, storageversionmigrator.go and resourceversion.go at commit
//! 1892e4deb967a2b39cfc2fea87a8bd49274449ef): `status.resourceVersion` is the resource's list resourceVersion when
//! the migration starts; a Running condition (reason `StorageVersionMigrationInProgress`), then Succeeded
//! (`StorageVersionMigrationSucceeded`) or Failed (`StorageVersionMigrationFailed`, message `resource does not exist
//! in discovery` or `migration encountered unhandled error`), the Running condition turning False at the end. That
//! kind has no field for a continue token or progress: ours are kept in annotations (written through the main
//! resource, whose update leaves the status alone), so that it resumes after a crash as ours do.

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

/// The in-tree controller's condition reasons and messages.
pub const IN_TREE_REASON_RUNNING: &str = "StorageVersionMigrationInProgress";
pub const IN_TREE_REASON_SUCCEEDED: &str = "StorageVersionMigrationSucceeded";
pub const IN_TREE_REASON_FAILED: &str = "StorageVersionMigrationFailed";
pub const IN_TREE_NOT_IN_DISCOVERY: &str = "resource does not exist in discovery";
pub const IN_TREE_UNHANDLED_ERROR: &str = "migration encountered unhandled error";

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
    /// `message` is ours; `not_in_discovery` when the target does not serve the resource (the in-tree controller's
    /// own message then).
    Failed { message: String, not_in_discovery: bool },
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
/// only when the status changes; observedGeneration is the migration's generation.
fn set_in_tree(m: &mut InTreeMigration, type_: &str, status: bool, reason: Option<&str>, message: &str) {
    let generation = m.metadata.generation;
    let conditions = &mut m.status.get_or_insert_with(Default::default).conditions;
    let status = if status { "True" } else { "False" }.to_string();
    match conditions.iter_mut().find(|x| x.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now();
                c.status = status;
            }
            if let Some(reason) = reason {
                c.reason = reason.to_string();
            }
            c.message = message.to_string();
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            observed_generation: generation,
            last_transition_time: now(),
            reason: reason.unwrap_or(IN_TREE_REASON_RUNNING).to_string(),
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

    /// The Running condition's message when nothing is retried: ours names the resource, the in-tree controller's
    /// is empty.
    pub fn base_running_message(&self, gvr: &GroupVersionResource) -> String {
        match self {
            Migration::Ours(_) => format!("Migrating {}.", gvr.display()),
            Migration::InTree(_) => String::new(),
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
            Migration::InTree(m) => set_in_tree(m, CONDITION_RUNNING, true, Some(IN_TREE_REASON_RUNNING), message),
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
            (Migration::InTree(m), Outcome::Succeeded { .. }) => {
                // The in-tree controller turns Running False without another reason or message.
                set_running_false(m);
                set_in_tree(m, CONDITION_SUCCEEDED, true, Some(IN_TREE_REASON_SUCCEEDED), "");
            }
            (Migration::InTree(m), Outcome::Failed { message, not_in_discovery }) => {
                let message = match not_in_discovery {
                    true => IN_TREE_NOT_IN_DISCOVERY.to_string(),
                    false => super::truncate(&format!("{IN_TREE_UNHANDLED_ERROR}: {message}"), 32000),
                };
                set_running_false(m);
                set_in_tree(m, CONDITION_FAILED, true, Some(IN_TREE_REASON_FAILED), &message);
            }
        }
    }
}

/// Running=False at the end, keeping its reason and message (the in-tree controller flips only the status); absent
/// when the migration never ran.
fn set_running_false(m: &mut InTreeMigration) {
    let running = m.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_RUNNING)).cloned();
    if let Some(c) = running {
        set_in_tree(m, CONDITION_RUNNING, false, None, &c.message);
    }
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

    #[test]
    fn in_tree_conditions_follow_the_in_tree_controller() {
        let mut m = in_tree();
        assert!(m.needs_resource_version());
        m.set_resource_version("42");
        assert!(!m.needs_resource_version());
        m.set_running("");
        assert_eq!(m.phase(), "Running");
        m.set_outcome(&Outcome::Succeeded { total: 3, message: "ours".into() });
        assert_eq!(m.phase(), "Succeeded");
        let Migration::InTree(svm) = &m else { unreachable!() };
        let status = svm.status.as_ref().expect("a status");
        let running = status.conditions.iter().find(|c| c.type_ == "Running").expect("Running");
        assert_eq!((running.status.as_str(), running.reason.as_str()), ("False", IN_TREE_REASON_RUNNING));
        let succeeded = status.conditions.iter().find(|c| c.type_ == "Succeeded").expect("Succeeded");
        assert_eq!((succeeded.reason.as_str(), succeeded.message.as_str()), (IN_TREE_REASON_SUCCEEDED, ""));
        assert!(status.conditions.iter().all(|c| c.observed_generation == Some(3)));
    }

    #[test]
    fn in_tree_failures_carry_the_in_tree_messages() {
        let mut m = in_tree();
        m.set_outcome(&Outcome::Failed { message: "x".into(), not_in_discovery: true });
        assert_eq!(m.phase(), "Failed");
        let Migration::InTree(svm) = &m else { unreachable!() };
        let failed = &svm.status.as_ref().expect("a status").conditions[0];
        assert_eq!(
            (failed.reason.as_str(), failed.message.as_str()),
            (IN_TREE_REASON_FAILED, IN_TREE_NOT_IN_DISCOVERY)
        );
        let mut m = in_tree();
        m.set_running("");
        m.set_outcome(&Outcome::Failed { message: "rewriting x: 403".into(), not_in_discovery: false });
        let Migration::InTree(svm) = &m else { unreachable!() };
        let failed = svm.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Failed")).cloned();
        assert_eq!(failed.map(|c| c.message), Some(format!("{IN_TREE_UNHANDLED_ERROR}: rewriting x: 403")));
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
}

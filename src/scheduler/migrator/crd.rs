//! Retiring old versions of a custom resource: once every object of a CRD's resource has been rewritten in the
//! storage version, the CRD's `status.storedVersions` is set to just that version, so that the old versions can
//! be removed from the CRD. This is KEP-4192's "CRD Storage Version Status Update" as kube-controller-manager does
//! it (Kubernetes 1.36): the CRD carries a `StorageMigrating` condition, True while a migration runs, whose
//! `observedGeneration` records the CRD's generation when the migration started; storedVersions is trimmed only if
//! the generation is unchanged when the migration Succeeds (any change of the CRD's spec, a new storage version
//! among them, bumps it: the trigger then requests a new migration). Every write carries the resourceVersion it
//! was computed from; on a conflict the CRD is read again and the rules are applied again.
//!
//! A resource without a CRD (built-in, aggregated, or ours) has no storedVersions: nothing is done. The condition
//! names the migration that set it, so that a migration only ever ends the condition it started.

use crate::api::storage_version_migration::GroupVersionResource;
use crate::client::api_reason;
use crate::error::StatusReason;
use crate::scheduler::events::{EventRecorder, EventType};
use crate::scheduler::managers;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use serde_json::{json, Value};

pub const CONDITION_STORAGE_MIGRATING: &str = "StorageMigrating";
pub const REASON_RUNNING: &str = "MigrationRunning";
pub const REASON_SUCCEEDED: &str = "MigrationSucceeded";
pub const REASON_FAILED: &str = "MigrationFailed";
/// Conflicting writes in a row before giving up (another controller keeps writing the CRD).
const CONFLICT_ATTEMPTS: u32 = 10;

/// What happened to the migration, for the CRD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Started,
    Succeeded,
    /// Failed, superseded or deleted before it finished: storedVersions stays as it is.
    Failed,
}

/// The message of the condition while `migration` runs: how a migration recognises the condition it set.
pub fn running_message(migration: &str) -> String {
    format!("Migration {migration} is running")
}

/// The name of `storage: true` among the CRD's versions.
pub fn storage_version(crd: &Value) -> Option<&str> {
    crd["spec"]["versions"].as_array()?.iter().find(|v| v["storage"] == true)?["name"].as_str()
}

/// The CRD as `migration` leaves it at `phase`, or None when there is nothing to write. Pure: the rules of this
/// module, tested on their own.
pub fn edit(crd: &Value, migration: &str, phase: Phase, now: Timestamp) -> Option<Value> {
    let generation = crd["metadata"]["generation"].as_i64();
    let conditions = crd["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let current = conditions.iter().find(|c| c["type"] == CONDITION_STORAGE_MIGRATING);
    let ours = current.is_some_and(|c| c["status"] == "True" && c["message"] == running_message(migration).as_str());
    let mut next = crd.clone();
    let (status, reason, message, observed) = match phase {
        Phase::Started => ("True", REASON_RUNNING, running_message(migration), generation),
        Phase::Succeeded | Phase::Failed if !ours => return None,
        Phase::Succeeded => {
            let observed = current.and_then(|c| c["observedGeneration"].as_i64());
            let version = storage_version(crd);
            let message = match version {
                Some(v) if observed.is_some() && observed == generation => {
                    next["status"]["storedVersions"] = json!([v]);
                    "The migration has succeeded and the stored versions have been updated"
                }
                _ => "The migration has succeeded but the stored versions have not been updated due to a generation mismatch",
            };
            ("False", REASON_SUCCEEDED, message.to_string(), generation)
        }
        Phase::Failed => ("False", REASON_FAILED, "The migration has failed".to_string(), generation),
    };
    let changed = current.is_none_or(|c| c["status"] != status);
    let transition = match current {
        Some(c) if !changed => c["lastTransitionTime"].clone(),
        _ => json!(now.to_string()),
    };
    let mut condition = json!({
        "type": CONDITION_STORAGE_MIGRATING,
        "status": status,
        "lastTransitionTime": transition,
        "reason": reason,
        "message": message,
    });
    if let Some(g) = observed {
        condition["observedGeneration"] = json!(g);
    }
    let mut conditions: Vec<Value> =
        conditions.into_iter().filter(|c| c["type"] != CONDITION_STORAGE_MIGRATING).collect();
    conditions.push(condition);
    if !next["status"].is_object() {
        next["status"] = json!({});
    }
    next["status"]["conditions"] = Value::Array(conditions);
    (next != *crd).then_some(next)
}

/// A reference to the CRD named `name`, read as `crd`, for an Event's `regarding`.
fn crd_reference(name: &str, crd: &Value) -> ObjectReference {
    ObjectReference {
        api_version: Some("apiextensions.k8s.io/v1".into()),
        kind: Some("CustomResourceDefinition".into()),
        name: Some(name.to_string()),
        uid: crd["metadata"]["uid"].as_str().map(str::to_string),
        ..Default::default()
    }
}

/// The CRDs of the target, as the migrator updates them.
pub struct Crds {
    api: Api<DynamicObject>,
    enabled: bool,
    events: EventRecorder,
}

/// The Event regarding a CRD whose storedVersions a migration trimmed (Normal, action `UpdateStoredVersions`).
pub const EVENT_STORED_VERSIONS_TRIMMED: &str = "StoredVersionsTrimmed";

impl Crds {
    /// `enabled` is `--update-crd-stored-versions`: false leaves every CRD alone.
    pub fn new(target: kube::Client, enabled: bool, events: EventRecorder) -> Self {
        let resource = ApiResource {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
        };
        Crds { api: Api::all_with(target, &resource), enabled, events }
    }

    /// Applies [`edit`] to the CRD of `gvr` (if it has one) until it is written or there is nothing to write. A
    /// failure is logged and leaves storedVersions alone, which is always safe.
    pub async fn update(&self, gvr: &GroupVersionResource, migration: &str, phase: Phase) {
        if !self.enabled || gvr.group.is_empty() {
            return;
        }
        let name = crate::error::qualified(&gvr.resource, &gvr.group);
        for _ in 0..CONFLICT_ATTEMPTS {
            let crd = match self.api.get_opt(&name).await {
                Ok(Some(crd)) => crd,
                // Not a custom resource (or a target without apiextensions): nothing to do.
                Ok(None) => return,
                Err(e) if api_reason(&e) == Some(StatusReason::MethodNotAllowed) => return,
                Err(e) => {
                    tracing::warn!(crd = %name, migration, error = %e, "cannot read the CustomResourceDefinition");
                    return;
                }
            };
            let Ok(crd) = serde_json::to_value(&crd) else { return };
            let Some(next) = edit(&crd, migration, phase, Timestamp::now()) else { return };
            // `next` carries the resourceVersion it was computed from: the write is a compare-and-swap.
            let Ok(body) = serde_json::from_value::<DynamicObject>(next.clone()) else { return };
            let params = managers::post(managers::MIGRATION_RUNNER);
            match self.api.replace_status(&name, &params, &body).await {
                Ok(_) => {
                    let (stored, before) = (&next["status"]["storedVersions"], &crd["status"]["storedVersions"]);
                    tracing::info!(crd = %name, migration, ?phase, stored_versions = %stored,
                        "CustomResourceDefinition status updated");
                    if stored != before {
                        let note = format!(
                            "status.storedVersions trimmed from {before} to {stored}: migration {migration} succeeded"
                        );
                        let regarding = crd_reference(&name, &crd);
                        self.events.record(
                            &regarding,
                            EventType::Normal,
                            EVENT_STORED_VERSIONS_TRIMMED,
                            "UpdateStoredVersions",
                            &note,
                        );
                    }
                    return;
                }
                Err(e) if api_reason(&e) == Some(StatusReason::Conflict) => continue,
                Err(e) if api_reason(&e) == Some(StatusReason::NotFound) => return,
                Err(e) => {
                    tracing::warn!(crd = %name, migration, error = %e, "cannot update the CustomResourceDefinition");
                    return;
                }
            }
        }
        tracing::warn!(crd = %name, migration, "the CustomResourceDefinition kept changing; left as it is");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(generation: i64, storage: &str, stored: &[&str], conditions: Value) -> Value {
        json!({
            "metadata": {"name": "widgets.example.com", "generation": generation, "resourceVersion": "7"},
            "spec": {"versions": [
                {"name": "v1", "served": true, "storage": storage == "v1"},
                {"name": "v2", "served": true, "storage": storage == "v2"},
            ]},
            "status": {"storedVersions": stored, "conditions": conditions},
        })
    }

    fn condition(c: &Value) -> &Value {
        c["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == CONDITION_STORAGE_MIGRATING))
            .expect("condition")
    }

    #[test]
    fn started_then_succeeded_trims_to_the_storage_version() {
        let now = Timestamp::now();
        let start = crd(3, "v2", &["v1", "v2"], json!([{"type": "Established", "status": "True"}]));
        let running = edit(&start, "m1", Phase::Started, now).expect("a write");
        let c = condition(&running);
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("True"), Some(REASON_RUNNING)));
        assert_eq!(c["observedGeneration"], 3);
        assert_eq!(c["message"], "Migration m1 is running");
        // Other conditions are kept; the resourceVersion is the precondition of the write.
        assert_eq!(running["status"]["conditions"][0]["type"], "Established");
        assert_eq!(running["metadata"]["resourceVersion"], "7");
        let done = edit(&running, "m1", Phase::Succeeded, now).expect("a write");
        assert_eq!(done["status"]["storedVersions"], json!(["v2"]));
        let c = condition(&done);
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some(REASON_SUCCEEDED)));
    }

    #[test]
    fn a_changed_generation_keeps_stored_versions() {
        let now = Timestamp::now();
        let running = edit(&crd(3, "v1", &["v1", "v2"], json!([])), "m1", Phase::Started, now).expect("a write");
        // The storage version moved to v2 meanwhile: generation 4.
        let mut changed = running.clone();
        changed["metadata"]["generation"] = json!(4);
        changed["spec"]["versions"][0]["storage"] = json!(false);
        changed["spec"]["versions"][1]["storage"] = json!(true);
        let done = edit(&changed, "m1", Phase::Succeeded, now).expect("a write");
        assert_eq!(done["status"]["storedVersions"], json!(["v1", "v2"]));
        let c = condition(&done);
        assert_eq!(c["status"], "False");
        assert!(c["message"].as_str().is_some_and(|m| m.contains("generation mismatch")), "{c}");
    }

    #[test]
    fn failed_keeps_stored_versions_and_only_the_starting_migration_ends_the_condition() {
        let now = Timestamp::now();
        let running = edit(&crd(1, "v2", &["v1", "v2"], json!([])), "m1", Phase::Started, now).expect("a write");
        assert_eq!(edit(&running, "other", Phase::Succeeded, now), None, "not the migration that started it");
        assert_eq!(edit(&running, "other", Phase::Failed, now), None);
        let failed = edit(&running, "m1", Phase::Failed, now).expect("a write");
        assert_eq!(failed["status"]["storedVersions"], json!(["v1", "v2"]));
        let c = condition(&failed);
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some(REASON_FAILED)));
        // Ended once: a second end writes nothing.
        assert_eq!(edit(&failed, "m1", Phase::Succeeded, now), None);
        // Without a condition of ours (set before an upgrade, or removed), nothing is trimmed.
        assert_eq!(edit(&crd(1, "v2", &["v1", "v2"], json!([])), "m1", Phase::Succeeded, now), None);
    }

    #[test]
    fn never_removes_the_current_storage_version() {
        let now = Timestamp::now();
        // storedVersions without the storage version (a CRD edited by hand): the trim still lists it.
        let running = edit(&crd(2, "v2", &["v1"], json!([])), "m1", Phase::Started, now).expect("a write");
        let done = edit(&running, "m1", Phase::Succeeded, now).expect("a write");
        assert_eq!(done["status"]["storedVersions"], json!(["v2"]));
        // No storage version at all: nothing is trimmed.
        let mut odd = running.clone();
        odd["spec"]["versions"] = json!([]);
        let done = edit(&odd, "m1", Phase::Succeeded, now).expect("a write");
        assert_eq!(done["status"]["storedVersions"], json!(["v1"]));
    }
}

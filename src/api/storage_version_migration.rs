//! StorageVersionMigration (migration.k8s.io/v1alpha1): a request to rewrite every object of one resource.

use crate::error::FieldError;
use crate::go_decode;
use crate::registry::object_meta::condition_reason;
use crate::registry::strategy::{Column, Kind, KindInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const CONDITION_RUNNING: &str = "Running";
pub const CONDITION_SUCCEEDED: &str = "Succeeded";
pub const CONDITION_FAILED: &str = "Failed";
const MAX_MESSAGE: usize = 32768;

/// StorageVersionMigration represents a migration of stored data to the latest storage version.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.StorageVersionMigration")]
pub struct StorageVersionMigration {
    /// Standard object metadata.
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// Specification of the migration.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub spec: StorageVersionMigrationSpec,
    /// Status of the migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StorageVersionMigrationStatus>,
}

/// Spec of the storage version migration.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.StorageVersionMigrationSpec")]
pub struct StorageVersionMigrationSpec {
    /// The resource that is being migrated. The migrator sends requests to the endpoint serving the resource.
    /// Immutable.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub resource: GroupVersionResource,
    /// The token used in the list options to get the next chunk of objects to migrate. When the
    /// .status.conditions indicates the migration is "Running", users can use this token to check the progress
    /// of the migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
}

/// The names of the group, the version, and the resource.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[schemars(rename = "io.k8s.migration.v1alpha1.GroupVersionResource")]
pub struct GroupVersionResource {
    /// The name of the group ("" for the core group).
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The name of the version.
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The name of the resource (plural, lower case).
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

impl GroupVersionResource {
    /// `resource.version.group` (`resource.version` for the core group), as the RESOURCE column shows it.
    pub fn display(&self) -> String {
        if self.group.is_empty() {
            format!("{}.{}", self.resource, self.version)
        } else {
            format!("{}.{}.{}", self.resource, self.version, self.group)
        }
    }
}

/// Status of the storage version migration.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.StorageVersionMigrationStatus")]
pub struct StorageVersionMigrationStatus {
    /// The latest available observations of the migration's current state.
    #[serde(default, deserialize_with = "go_decode::list", skip_serializing_if = "Vec::is_empty")]
    // Merged by type, as the upstream type declares it (patchMergeKey=type, patchStrategy=merge).
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"], "x-kubernetes-patch-merge-key" = "type", "x-kubernetes-patch-strategy" = "merge"))]
    pub conditions: Vec<MigrationCondition>,
    /// Number of objects rewritten (or found deleted or already rewritten) so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrated_objects: Option<i64>,
    /// Estimate of the objects still to be migrated, from the last list's remainingItemCount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_objects_estimate: Option<i64>,
}

/// Describes the state of a migration at a certain point.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.migration.v1alpha1.MigrationCondition")]
pub struct MigrationCondition {
    /// Type of the condition: Running, Succeeded or Failed.
    #[serde(rename = "type", default, deserialize_with = "go_decode::null_as_default")]
    pub type_: String,
    /// Status of the condition, one of True, False, Unknown.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub status: String,
    /// The last time this condition was updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// The reason for the condition's last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human readable message indicating details about the transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl StorageVersionMigration {
    pub fn condition(&self, type_: &str) -> Option<&MigrationCondition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }
    /// Succeeded, Failed, Running or Pending: the STATUS column.
    pub fn phase(&self) -> &'static str {
        if self.is_true(CONDITION_SUCCEEDED) {
            "Succeeded"
        } else if self.is_true(CONDITION_FAILED) {
            "Failed"
        } else if self.is_true(CONDITION_RUNNING) {
            "Running"
        } else {
            "Pending"
        }
    }

    /// The condition [`phase`](Self::phase) names (none while Pending): whose reason and message wide output shows.
    fn shown_condition(&self) -> Option<&MigrationCondition> {
        [CONDITION_SUCCEEDED, CONDITION_FAILED, CONDITION_RUNNING]
            .into_iter()
            .find(|t| self.is_true(t))
            .and_then(|t| self.condition(t))
    }

    /// Percent of the objects migrated, rounded down (100 once Succeeded); None while nothing tells.
    pub fn progress(&self) -> Option<i64> {
        if self.is_true(CONDITION_SUCCEEDED) {
            return Some(100);
        }
        let status = self.status.as_ref()?;
        let (migrated, remaining) = (status.migrated_objects.unwrap_or(0), status.remaining_objects_estimate?);
        let total = migrated.saturating_add(remaining);
        Some(if total <= 0 { 100 } else { (migrated.saturating_mul(100) / total).min(100) })
    }

    fn validate_status(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let Some(status) = &self.status else { return errs };
        let mut seen = std::collections::HashSet::new();
        for (i, c) in status.conditions.iter().enumerate() {
            let f = format!("status.conditions[{i}]");
            // kube-storage-version-migrator's CRD schema requires `type` and `status` in a condition (a missing or
            // null one decodes to "", as in Go); the values allowed beyond that are our own rule.
            if c.type_.is_empty() {
                errs.push(FieldError::required(format!("{f}.type")));
            } else if !matches!(c.type_.as_str(), CONDITION_RUNNING | CONDITION_SUCCEEDED | CONDITION_FAILED) {
                errs.push(FieldError::not_supported(
                    format!("{f}.type"),
                    &c.type_,
                    &[CONDITION_FAILED, CONDITION_RUNNING, CONDITION_SUCCEEDED],
                ));
            } else if !seen.insert(c.type_.as_str()) {
                errs.push(FieldError::duplicate(format!("{f}.type"), &c.type_));
            }
            if c.status.is_empty() {
                errs.push(FieldError::required(format!("{f}.status")));
            } else if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
                errs.push(FieldError::not_supported(format!("{f}.status"), &c.status, &["False", "True", "Unknown"]));
            }
            if let Some(r) = c.reason.as_deref().filter(|r| !r.is_empty()) {
                errs.extend(condition_reason(&format!("{f}.reason"), r));
            }
            if c.message.as_ref().is_some_and(|m| m.len() > MAX_MESSAGE) {
                errs.push(FieldError::too_long(format!("{f}.message"), MAX_MESSAGE));
            }
        }
        let (succeeded, failed, running) =
            (self.is_true(CONDITION_SUCCEEDED), self.is_true(CONDITION_FAILED), self.is_true(CONDITION_RUNNING));
        if succeeded && failed {
            errs.push(FieldError::invalid(
                "status.conditions",
                "Succeeded",
                "Both success and failed conditions cannot be true at the same time",
            ));
        }
        if running && (succeeded || failed) {
            errs.push(FieldError::invalid(
                "status.conditions",
                "Running",
                "Running condition cannot be true when success or failed condition is true",
            ));
        }
        for (field, v) in [
            ("status.migratedObjects", status.migrated_objects),
            ("status.remainingObjectsEstimate", status.remaining_objects_estimate),
        ] {
            if let Some(n) = v.filter(|n| *n < 0) {
                errs.push(FieldError::invalid_value(field, &Value::from(n), "must be greater than or equal to 0"));
            }
        }
        errs
    }
}

static INFO: KindInfo = KindInfo {
    group: "migration.k8s.io",
    kind: "StorageVersionMigration",
    list_kind: "StorageVersionMigrationList",
    plural: "storageversionmigrations",
    singular: "storageversionmigration",
    namespaced: false,
    short_names: &["svm"],
    categories: &["migration"],
    versions: &["v1alpha1"],
    name_rule: crate::validation::NameRule::Subdomain,
    unconditional_update: true,
    create_only: false,
    generation: true,
    return_deleted_object: false,
    api_approved: Some(crate::api::STORAGE_VERSION_MIGRATOR_API),
    priority: None,
};

crate::kube_resource!(StorageVersionMigration, kube::core::ClusterResourceScope);

impl Kind for StorageVersionMigration {
    const CELLS_READ_METADATA: bool = false;
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = Option<StorageVersionMigrationStatus>;
    fn replace_status(&mut self, status: Self::Status) -> Self::Status {
        std::mem::replace(&mut self.status, status)
    }
    fn validate(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let r = &self.spec.resource;
        if r.resource.is_empty() {
            errs.push(FieldError::required("spec.resource.resource"));
        }
        if r.version.is_empty() {
            errs.push(FieldError::required("spec.resource.version"));
        }
        errs.extend(self.validate_status());
        errs
    }
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut errs = self.validate();
        if self.spec.resource != old.spec.resource {
            let v = serde_json::to_value(&self.spec.resource).unwrap_or(Value::Null);
            errs.push(FieldError::immutable("spec.resource", &v));
        }
        errs
    }
    fn validate_status_update(&self, old: &Self) -> Vec<FieldError> {
        let mut errs = self.validate_status();
        for t in [CONDITION_SUCCEEDED, CONDITION_FAILED] {
            if old.is_true(t) && !self.is_true(t) {
                errs.push(FieldError::invalid(
                    "status.conditions",
                    t,
                    &format!("{t} condition cannot be set to False or removed once it is True"),
                ));
            }
        }
        errs
    }
    fn columns() -> Vec<Column> {
        vec![
            // In CRD form: the resource name only (a JSONPath cannot join resource, version and group).
            Column::new("Resource", "string", "The resource being migrated: resource.version.group.")
                .json_path(".spec.resource.resource"),
            // In CRD form: the type of the condition that is True (empty while pending).
            Column::new("Status", "string", "Pending, Running, Succeeded or Failed.")
                .json_path(".status.conditions[?(@.status==\"True\")].type"),
            Column::new("Migrated", "integer", "Objects migrated so far.").json_path(".status.migratedObjects"),
            // A share of two fields: no JSONPath expresses it, so the CRD form goes without it.
            Column::new("Progress", "string", "Migrated objects as a share of migrated and remaining ones."),
            Column::new("Remaining", "integer", "Estimate of the objects still to migrate.")
                .json_path(".status.remainingObjectsEstimate"),
            // Wide only: why the migration is where STATUS says (e.g. Superseded) and the condition's message (the
            // error a Failed migration stopped at, the one a Running one is retrying), too long for every listing.
            Column::new("Reason", "string", "The reason of the condition STATUS shows.")
                .json_path(".status.conditions[?(@.status==\"True\")].reason")
                .wide(),
            Column::new("Message", "string", "The message of the condition STATUS shows.")
                .json_path(".status.conditions[?(@.status==\"True\")].message")
                .wide(),
        ]
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        let migrated = self.status.as_ref().and_then(|s| s.migrated_objects).unwrap_or(0);
        let remaining = self.status.as_ref().and_then(|s| s.remaining_objects_estimate);
        vec![
            Value::from(self.spec.resource.display()),
            Value::from(self.phase()),
            Value::from(migrated),
            self.progress().map_or(Value::Null, |p| Value::from(format!("{p}%"))),
            remaining.map_or(Value::Null, Value::from),
            Value::from(self.shown_condition().and_then(|c| c.reason.clone()).unwrap_or_default()),
            Value::from(self.shown_condition().and_then(|c| c.message.clone()).unwrap_or_default()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn causes(m: &StorageVersionMigration) -> Vec<(&'static str, String)> {
        m.validate().into_iter().map(|e| (e.reason.as_str(), e.field)).collect()
    }

    /// kube-storage-version-migrator's pkg/apis/migration/v1alpha1/types.go: every field is a Go value but
    /// `continueToken` (a value too, kept optional here, None standing for ""); missing and `null` ones are their
    /// zero values, and validation reports them as the CRD's schema does (`type` and `status` required).
    #[test]
    fn missing_and_null_fields_decode_as_go_and_validate() {
        let m: StorageVersionMigration =
            serde_json::from_value(json!({"metadata": null, "spec": null, "status": null})).expect("decodes");
        assert_eq!(m, StorageVersionMigration::default());
        let m: StorageVersionMigration = serde_json::from_value(json!({
            "metadata": {"name": "m"},
            "spec": {"resource": {"group": null, "version": "v1", "resource": null}, "continueToken": null},
            "status": {"conditions": [null, {"type": "Running", "status": null, "lastUpdateTime": null,
                                             "reason": null, "message": null}]},
        }))
        .expect("decodes");
        assert_eq!(m.spec.continue_token, None);
        assert_eq!(m.status.as_ref().map(|s| s.conditions.len()), Some(2));
        let required = |f: &str| ("FieldValueRequired", f.to_string());
        assert_eq!(
            causes(&m),
            [
                required("spec.resource.resource"),
                required("status.conditions[0].type"),
                required("status.conditions[0].status"),
                required("status.conditions[1].status"),
            ]
        );
        // A value that is there but not allowed is still our own NotSupported.
        let m: StorageVersionMigration = serde_json::from_value(json!({
            "spec": {"resource": {"version": "v1", "resource": "pods"}},
            "status": {"conditions": [{"type": "Done", "status": "Yes"}]},
        }))
        .expect("decodes");
        let reasons: Vec<&str> = causes(&m).into_iter().map(|(r, _)| r).collect();
        assert_eq!(reasons, ["FieldValueNotSupported", "FieldValueNotSupported"]);
    }
}

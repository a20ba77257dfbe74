//! StorageVersionMigration of the in-tree API, `storagemigration.k8s.io` v1 (the storage version) and v1beta1: the
//! same JSON in both versions, as upstream's types are (staging/src/k8s.io/api/storagemigration/v1/types.go and
//! v1beta1/types.go). Cluster-scoped; status only through `/status` (upstream's registry strategy). Validation:
//! [`validation`]; printer columns: [`printers`].
//!
//! Followed: kubernetes/kubernetes v1/types.go at 5807bf165780ef7d87b808db2c80c33fb01572a9, v1beta1/types.go at
//! 008b3652959ca58af8be3fb5b6ecfe9ae7638282 and pkg/registry/storagemigration/storagemigration/strategy.go at
//! 1b61b4268a83efc7ca7f81f888e580d70cb3caac (status reset on create and kept on update, spec kept on `/status`,
//! no unconditional update). Upstream declares no short names and no categories for this resource,
//! so neither do we (`svm` stays `migration.k8s.io`'s).

use crate::error::FieldError;
use crate::go_decode;
use crate::registry::strategy::{ApiPriority, Column, Kind, KindInfo};
use crate::validation::NameRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod conditions;
mod printers;
mod validation;

/// The API group.
pub const GROUP: &str = "storagemigration.k8s.io";
/// The resource name (plural), the same as `migration.k8s.io`'s.
pub const PLURAL: &str = "storageversionmigrations";
/// The storage version.
pub const STORAGE_VERSION: &str = "v1";

/// Condition type: the migration is running.
pub const CONDITION_RUNNING: &str = "Running";
/// Condition type: the migration has completed successfully.
pub const CONDITION_SUCCEEDED: &str = "Succeeded";
/// Condition type: the migration has failed.
pub const CONDITION_FAILED: &str = "Failed";

/// StorageVersionMigration represents a migration of stored data to the latest storage version.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.storagemigration.v1.StorageVersionMigration")]
pub struct StorageVersionMigration {
    /// metadata is the standard object metadata.
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// spec is the specification of the migration.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub spec: StorageVersionMigrationSpec,
    /// status is the status of the migration.
    #[serde(default, serialize_with = "status_or_empty")]
    pub status: Option<StorageVersionMigrationStatus>,
}

/// No status is written `{}`, as kube-apiserver writes it: upstream's status is a struct, not a pointer, so Go's
/// encoder writes it even when empty (`omitempty` does not omit structs).
fn status_or_empty<S: serde::Serializer>(
    status: &Option<StorageVersionMigrationStatus>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match status {
        Some(status) => status.serialize(serializer),
        None => StorageVersionMigrationStatus::default().serialize(serializer),
    }
}

/// Spec of the storage version migration.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.storagemigration.v1.StorageVersionMigrationSpec")]
pub struct StorageVersionMigrationSpec {
    /// resource is the resource that is being migrated. The migrator sends requests to the endpoint serving the
    /// resource. Immutable.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub resource: GroupResource,
}

/// GroupResource specifies a Group and a Resource, but does not force a version. This is useful for identifying
/// concepts during lookup stages without having partially valid types (metav1.GroupResource: both fields always
/// written, empty or not).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[schemars(rename = "io.k8s.apimachinery.pkg.apis.meta.v1.GroupResource")]
pub struct GroupResource {
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub group: String,
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub resource: String,
}

impl std::fmt::Display for GroupResource {
    /// `resource.group`, or `resource` for the core group (apimachinery's `GroupResource.String()`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// Status of the storage version migration.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.storagemigration.v1.StorageVersionMigrationStatus")]
pub struct StorageVersionMigrationStatus {
    /// conditions is the latest available observations of the migration's current state.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "conditions::deserialize")]
    // Merged by type, as upstream declares it (listType=map, listMapKey=type, patchStrategy=merge).
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"], "x-kubernetes-patch-merge-key" = "type", "x-kubernetes-patch-strategy" = "merge"))]
    pub conditions: Vec<Condition>,
    /// resourceVersion to compare with the GC cache for performing the migration. This is the current resource
    /// version of given group, version and resource when kube-controller-manager first observes this
    /// StorageVersionMigration resource.
    #[serde(default, deserialize_with = "go_decode::null_as_default", skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

impl StorageVersionMigration {
    /// The condition of `type_`, if any (apimachinery's `meta.FindStatusCondition`).
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }
    /// Whether the condition of `type_` is there with status True.
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }
}

/// The CRD form's `api-approved.kubernetes.io`: an implementation of the in-tree API, for clusters that lack it.
const API_APPROVED: &str = "unapproved, implementation of the in-tree storagemigration.k8s.io API for clusters without it (https://github.com/kubernetes/enhancements/tree/master/keps/sig-api-machinery/4192-svm-in-tree)";

/// kube-apiserver serves this group itself, so it gets kube-apiserver's own priorities and discovery orders it the
/// same whether we or the cluster serve it: 15800 as in kubernetes `pkg/controlplane/apiserver/aggregator.go`
/// `DefaultGenericAPIServicePriorities` (commit 008b365, where v1beta1 has version priority 9); v1 gets 15, the
/// priority of the GA versions there. Both migration groups have `storageversionmigrations`: kubectl resolves a
/// bare resource name to the first group in discovery order (highest groupPriorityMinimum), so a bare `kubectl get
/// storageversionmigrations` is this group's on every cluster, before and after the upgrade; `svm` stays
/// `migration.k8s.io`'s.
const PRIORITY: ApiPriority = ApiPriority { group: 15800, versions: &[("v1", 15), ("v1beta1", 9)] };

static INFO: KindInfo = KindInfo {
    group: GROUP,
    kind: "StorageVersionMigration",
    list_kind: "StorageVersionMigrationList",
    plural: PLURAL,
    singular: "storageversionmigration",
    namespaced: false,
    short_names: &[],
    categories: &[],
    versions: &["v1", "v1beta1"],
    name_rule: NameRule::Subdomain,
    // Upstream's strategy: AllowUnconditionalUpdate false (a PUT without resourceVersion is 422).
    unconditional_update: false,
    create_only: false,
    generation: false,
    return_deleted_object: false,
    api_approved: Some(API_APPROVED),
    priority: Some(PRIORITY),
};

crate::kube_resource!(StorageVersionMigration, kube::core::ClusterResourceScope);

impl Kind for StorageVersionMigration {
    const CELLS_READ_METADATA: bool = true;
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = Option<StorageVersionMigrationStatus>;
    fn replace_status(&mut self, status: Self::Status) -> Self::Status {
        std::mem::replace(&mut self.status, status)
    }
    fn validate(&self) -> Vec<FieldError> {
        validation::validate_spec(&self.spec)
    }
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        validation::validate_update(self, old)
    }
    fn validate_status_update(&self, old: &Self) -> Vec<FieldError> {
        validation::validate_status_update(self, old)
    }
    const NAME_AND_AGE_COLUMNS: bool = false;
    fn columns() -> Vec<Column> {
        printers::columns()
    }
    fn cells(&self, _now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        printers::cells(self)
    }
}

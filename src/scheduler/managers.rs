//! The field managers of the scheduler's own writes: each part names itself in `metadata.managedFields`, as
//! upstream's components do (kube-storage-version-migrator's by its user agents, kube-controller-manager's
//! storage-version-migration controllers by their names), instead of `unknown`.

/// The storage-version trigger: StorageStates and the migrations it requests (kube-storage-version-migrator's
/// trigger's user agent).
pub const TRIGGER: &str = "storage-version-migration-trigger";
/// The migrator's writes of a `migration.k8s.io` migration and of its objects on the target
/// (kube-storage-version-migrator's migrator's user agent).
pub const MIGRATOR: &str = "storage-version-migration-migrator";
/// A `storagemigration.k8s.io` migration's promotion to Running and its end (Running=False), and the CRD's
/// `StorageMigrating` condition and `storedVersions` for both APIs (kube-controller-manager's MigrationRunner).
pub const MIGRATION_RUNNER: &str = "migration-runner-controller";
/// A `storagemigration.k8s.io` migration's `status.resourceVersion` (kube-controller-manager's
/// ResourceVersionController).
pub const RESOURCE_VERSION: &str = "resource-version-controller";
/// A `storagemigration.k8s.io` migration's progress and outcome, and its no-op writes on the target
/// (kube-controller-manager's SVMController: `?fieldManager=storage-version-migrator-controller`).
pub const IN_TREE_MIGRATOR: &str = "storage-version-migrator-controller";
/// Key rotation of this server's own store: StorageStates and the migrations it requests.
pub const KEY_ROTATION: &str = "migration-apiserver-key-rotation";
/// Key rotation of a cluster's store (`--cluster-key-rotation`): StorageStates and the migrations it requests.
pub const CLUSTER_KEY_ROTATION: &str = "migration-apiserver-cluster-key-rotation";
/// Events about migrations, StorageStates and CRDs.
pub const EVENTS: &str = "migration-apiserver-events";
/// The leader election Lease.
pub const LEADER_ELECTION: &str = "migration-apiserver-leader-election";

/// Every name, for documentation and tests.
pub const ALL: &[&str] = &[
    TRIGGER,
    MIGRATOR,
    MIGRATION_RUNNER,
    RESOURCE_VERSION,
    IN_TREE_MIGRATOR,
    KEY_ROTATION,
    CLUSTER_KEY_ROTATION,
    EVENTS,
    LEADER_ELECTION,
];

/// kube's create/replace parameters naming `manager`.
pub fn post(manager: &str) -> kube::api::PostParams {
    kube::api::PostParams { field_manager: Some(manager.to_string()), ..Default::default() }
}

/// kube's patch parameters naming `manager`.
pub fn patch(manager: &str) -> kube::api::PatchParams {
    kube::api::PatchParams { field_manager: Some(manager.to_string()), ..Default::default() }
}

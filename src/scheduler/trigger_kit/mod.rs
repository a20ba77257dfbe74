//! The triggers' shared library: what a trigger is ([`Trigger`], its context and flags), the scheduler's own objects ([`OwnObjects`]) and how a migration is started
//! ([`start_migration`]: requested, superseding unfinished ones of its resource) and pruned, the annotations and
//! label of the migrations requested, the resources never migrated, the target's discovery (the scheduler's one
//! reading of it, the migrator's too), and the migrations requested by hand (`migrate`). The triggers themselves
//! live beside it (`storage_version`, `key_rotation`, `cluster_encryption`).

mod contract;
pub use contract::*;
mod discovery;
pub use discovery::*;
mod migrations;
pub use migrations::*;
mod stores;
pub use stores::*;
mod migrate;
pub use migrate::*;

/// Label on every migration the trigger or `migrate` creates: `<resource>.<group>` (`<resource>` for the core
/// group), or a shortened form with a hash when that is not a valid label value (then the annotation of the same
/// name holds the full name).
pub const LABEL_RESOURCE: &str = "migration.k8s.io/resource";
/// The full `<resource>.<group>` when the label had to be shortened.
pub const ANNOTATION_RESOURCE: &str = "migration.k8s.io/resource";
/// The storage version hash the target published when the migration was requested.
pub const ANNOTATION_HASH: &str = "migration.k8s.io/storage-version-hash";
/// When the migration was requested, with sub-second precision: creationTimestamp has whole seconds, and two
/// migrations of one resource may be requested within a second.
pub const ANNOTATION_REQUESTED_AT: &str = "migration.k8s.io/requested-at";
/// Why the migration was requested, for the logs and for people: one of the `WHY_*` texts.
pub const ANNOTATION_REASON: &str = "migration.k8s.io/reason";
pub const WHY_NEW_HASH: &str = "new storage version hash";
pub const WHY_CHANGED_HASH: &str = "changed storage version hash";
pub const WHY_STALE: &str = "storage state stale at start-up";
pub const WHY_BY_HAND: &str = "requested by hand";
/// Reason of the Failed condition of a migration that a newer one replaced.
pub const REASON_SUPERSEDED: &str = "Superseded";

pub(crate) const MAX_LABEL_VALUE: usize = 63;
/// Resources that the initializer never migrates (upstream's list: their objects expire anyway).
pub const NEVER_MIGRATED: &[&str] = &["events"];

/// Who reports into the StorageStates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// This process alone (the embedded store): the KEP's non-HA trigger. A storage version change is acted on at
    /// the poll that sees it.
    One,
    /// Several replicas share the StorageStates (etcd): seed 002's HA extension.
    Several,
}

#[cfg(test)]
pub(crate) mod test_fixtures;
#[cfg(test)]
mod tests;

//! What kube-controller-manager's GA controllers write on an in-tree (`storagemigration.k8s.io`) migration: their
//! reasons and messages (kubernetes/kubernetes `pkg/controller/storageversionmigrator/`, util.go's progress
//! formats), kept apart from how a [`super::Migration`] records them.

/// The in-tree controllers' condition reasons and messages.
pub const IN_TREE_REASON_RUNNING: &str = "MigrationRunning";
pub const IN_TREE_REASON_COMPLETED: &str = "MigrationCompleted";
pub const IN_TREE_REASON_SUCCEEDED: &str = "StorageVersionMigrationSucceeded";
pub const IN_TREE_REASON_FAILED: &str = "StorageVersionMigrationFailed";
pub const IN_TREE_RUNNING: &str = "The migration is running";
pub const IN_TREE_COMPLETED: &str = "Migration completed";
pub const IN_TREE_NOT_IN_DISCOVERY: &str = "resource does not exist in discovery";
pub const IN_TREE_UNHANDLED_ERROR: &str = "migration encountered unhandled error";

/// An in-tree migration's failure, as kube-controller-manager words it.
#[derive(Clone, Debug)]
pub enum InTreeFailure {
    /// The resource-version controller's message (discovery, verbs, the list's resourceVersion), as it is.
    Checkpoint(String),
    /// The migrator's: `X/Y not yet migrated. migration encountered unhandled error: <error>`.
    Unhandled(String),
}

/// A migration's progress as the in-tree controller counts it: objects not yet migrated, of all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub not_migrated: i64,
    pub total: i64,
}

impl Counts {
    /// From the objects handled and the estimate of those left (None: not known yet).
    pub fn of(handled: i64, remaining: Option<i64>) -> Option<Counts> {
        remaining.map(|r| Counts { not_migrated: r, total: handled.saturating_add(r) })
    }
}

/// The in-tree Running message while the migration runs: `The migration is running`, then `, X/Y objects not yet
/// migrated` once the counts are known, then `; transient error: <error>` while a request is retried (upstream's
/// util.go formats; upstream writes it on a transient error, this server also every few seconds).
pub fn in_tree_running_message(counts: Option<Counts>, transient: Option<&str>) -> String {
    let mut m = IN_TREE_RUNNING.to_string();
    if let Some(c) = counts {
        m.push_str(&format!(", {}/{} objects not yet migrated", c.not_migrated, c.total));
    }
    if let Some(why) = transient {
        m.push_str(&format!("; transient error: {why}"));
    }
    super::truncate(&m, 32000)
}

/// The in-tree Running message once every object is handled: `The migration is running, Y objects verified
/// migrated` (without the count when there were none).
pub fn in_tree_verified_message(total: i64) -> String {
    match total {
        0 => IN_TREE_RUNNING.to_string(),
        n => format!("{IN_TREE_RUNNING}, {n} objects verified migrated"),
    }
}

/// The in-tree Failed message of an error while migrating.
pub fn in_tree_unhandled_message(counts: Option<Counts>, error: &str) -> String {
    let m = match counts {
        Some(c) => format!("{}/{} not yet migrated. {IN_TREE_UNHANDLED_ERROR}: {error}", c.not_migrated, c.total),
        None => format!("{IN_TREE_UNHANDLED_ERROR}: {error}"),
    };
    super::truncate(&m, 32000)
}

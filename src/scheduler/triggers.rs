//! Triggers: what requests StorageVersionMigrations. A trigger is one module that says what it watches (its
//! replica part, run on every replica: observing the target and reporting into StorageStates) and what it decides
//! (its leader part, run by the elected leader only), and brings its own `serve` flags; it is registered by one
//! line in `registered_triggers.rs`. The migrator runs whatever migrations the triggers request.

use super::events::EventRecorder;
use super::trigger::OwnObjects;
use super::SchedulerConfig;
use tokio::task::JoinHandle;

/// What a trigger runs with.
#[derive(Clone)]
pub struct TriggerContext {
    /// The scheduler's tunables (identity, replicas, request timeout).
    pub config: SchedulerConfig,
    /// The target whose resources are migrated.
    pub target: kube::Client,
    /// Our own StorageStates and StorageVersionMigrations.
    pub own: OwnObjects,
    /// This server's own encrypted store, when it has one and is the target (standalone): for the key-rotation
    /// trigger.
    pub encryption: Option<crate::storage::encryption::EncryptionConfigHandle>,
    /// With several replicas on etcd: the key each live replica writes with (for the key-rotation trigger).
    pub replica_writes: Option<std::sync::Arc<crate::storage::encryption::replicas::WriteGate>>,
}

/// A migration trigger.
pub trait Trigger: Send + Sync {
    /// For the logs.
    fn name(&self) -> &'static str;
    /// Starts the part every replica runs (none when the trigger reports nothing).
    fn start_replica(&self, ctx: &TriggerContext) -> Option<JoinHandle<()>>;
    /// Starts the leader's part: its decisions, recorded as Events through `events`. The tasks run until the
    /// process ends or they are aborted, as a replica that loses leadership does at once.
    fn start_leader(&self, ctx: &TriggerContext, events: &EventRecorder) -> Option<JoinHandle<()>>;
}

/// A trigger's own flags: the trigger they configure, `None` when they disable it.
pub trait TriggerFlags {
    fn trigger(&self) -> Option<Box<dyn Trigger>>;
}

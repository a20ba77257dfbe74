//! Triggers: what requests StorageVersionMigrations. A trigger is one module that says what it watches (its
//! replica part, run on every replica: observing the target and reporting into StorageStates) and what it decides
//! (its leader part, run by the elected leader only), and brings its own `serve` flags; it is registered by one
//! line in [`triggers!`] below. The migrator runs whatever migrations the triggers request.

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

/// Declares the registered triggers: each one's flags (a `clap::Args`), flattened into `serve`'s.
macro_rules! triggers {
    ($($field:ident: $flags:ty),* $(,)?) => {
        /// Every registered trigger's flags.
        #[derive(clap::Args, Debug, Clone)]
        pub struct TriggerArgs {
            $(
                #[command(flatten)]
                pub $field: $flags,
            )*
        }

        impl TriggerArgs {
            /// The triggers the flags enable, in registration order.
            pub fn triggers(&self) -> Vec<Box<dyn Trigger>> {
                [$(TriggerFlags::trigger(&self.$field)),*].into_iter().flatten().collect()
            }
        }
    };
}

triggers! {
    storage_version: super::trigger::StorageVersionFlags,
    key_rotation: super::key_rotation::KeyRotationFlags,
    cluster_key_rotation: super::cluster_encryption::ClusterKeyRotationFlags,
}

/// The running triggers of this process.
pub struct Triggers(Vec<std::sync::Arc<dyn Trigger>>);

impl Triggers {
    pub fn new(triggers: Vec<Box<dyn Trigger>>) -> Self {
        Triggers(triggers.into_iter().map(std::sync::Arc::from).collect())
    }

    /// Starts every trigger's replica part.
    pub fn start_replicas(&self, ctx: &TriggerContext) -> Vec<JoinHandle<()>> {
        self.0.iter().filter_map(|t| t.start_replica(ctx)).collect()
    }

    /// Starts every trigger's leader part.
    pub fn start_leaders(&self, ctx: &TriggerContext, events: &EventRecorder) -> Vec<JoinHandle<()>> {
        self.0
            .iter()
            .filter_map(|t| {
                tracing::debug!(trigger = t.name(), "trigger: leader part started");
                t.start_leader(ctx, events)
            })
            .collect()
    }
}

impl Clone for Triggers {
    fn clone(&self) -> Self {
        Triggers(self.0.clone())
    }
}

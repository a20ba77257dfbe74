//! What a trigger is: a module that says what it watches (its replica part, run on every replica: observing the
//! target and reporting into StorageStates) and what it decides (its leader part, run by the elected leader only),
//! and brings its own `serve` flags. It is registered by one line in `scheduler/triggers.rs`.

use super::OwnObjects;
use crate::scheduler::events::EventRecorder;
use crate::scheduler::SchedulerConfig;
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
    /// What this process offers particular triggers, by type: each such input is a type of the module of the
    /// trigger that reads it (the key-rotation trigger's [`OwnStoreKeys`](crate::scheduler::key_rotation::OwnStoreKeys)), put
    /// here by whoever has it, so that a trigger with inputs of its own adds no field to this context.
    pub inputs: TriggerInputs,
}

/// Inputs of particular triggers, one value per type ([`TriggerContext::inputs`]).
#[derive(Clone, Default)]
pub struct TriggerInputs(axum::http::Extensions);

impl TriggerInputs {
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, input: T) {
        self.0.insert(input);
    }
    /// The input of type `T`, if this process has one.
    pub fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<&T> {
        self.0.get::<T>()
    }
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

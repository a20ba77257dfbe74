//! The registered triggers, what requests StorageVersionMigrations: one line each in [`triggers!`] below (the
//! trigger's flags), which flattens their flags into `serve`'s and starts each trigger on every replica and on the
//! leader. A trigger itself only knows the trait of [`super::trigger_kit`], the triggers' shared library, so
//! nothing here is imported back. The migrator runs whatever migrations the triggers request.

use super::events::EventRecorder;
use super::trigger_kit::{Trigger, TriggerContext, TriggerFlags};
use tokio::task::JoinHandle;

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
    storage_version: super::storage_version::StorageVersionFlags,
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

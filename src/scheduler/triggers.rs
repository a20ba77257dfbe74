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

/// docs/architecture.md's "Adding a trigger", followed once: a toy trigger, a module with its own flag, registered
/// by one line of [`triggers!`], whose leader part requests a migration through the shared library.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::in_process_client;
    use crate::scheduler::trigger_kit::OwnObjects;
    use crate::scheduler::SchedulerConfig;
    use axum::routing::post;
    use serde_json::{json, Value};
    use std::sync::{Arc, Mutex};

    /// The toy trigger's module: its flags, and the trigger they configure.
    mod toy {
        use crate::api::storage_version_migration::{GroupVersionResource, StorageVersionMigration};
        use crate::scheduler::events::EventRecorder;
        use crate::scheduler::trigger_kit::{start_migration, Trigger, TriggerContext, TriggerFlags};
        use tokio::task::JoinHandle;

        /// The toy's flags.
        #[derive(clap::Args, Debug, Clone)]
        pub struct ToyFlags {
            /// The resource the toy requests a migration of when it leads (none: the toy is off).
            #[arg(long = "toy-resource")]
            pub resource: Option<String>,
        }

        impl TriggerFlags for ToyFlags {
            fn trigger(&self) -> Option<Box<dyn Trigger>> {
                let resource = self.resource.clone()?;
                Some(Box::new(Toy { resource }))
            }
        }

        struct Toy {
            resource: String,
        }

        impl Trigger for Toy {
            fn name(&self) -> &'static str {
                "toy"
            }

            fn start_replica(&self, _: &TriggerContext) -> Option<JoinHandle<()>> {
                None
            }

            fn start_leader(&self, ctx: &TriggerContext, _: &EventRecorder) -> Option<JoinHandle<()>> {
                let gvr = GroupVersionResource {
                    group: "toy.io".into(),
                    version: "v1".into(),
                    resource: self.resource.clone(),
                };
                let own = ctx.own.clone();
                Some(tokio::spawn(async move {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    let none: &[StorageVersionMigration] = &[];
                    start_migration(&own, &gvr, None, "a toy's whim", none, now).await.expect("the toy's migration");
                }))
            }
        }
    }

    // The registration: one line.
    triggers! {
        toy: toy::ToyFlags,
    }

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        triggers: TriggerArgs,
    }

    #[tokio::test]
    async fn a_toy_trigger_follows_the_recipe() {
        use clap::Parser as _;
        let off = Serve::try_parse_from(["serve"]).expect("flags");
        assert!(off.triggers.triggers().is_empty(), "the toy is off without its flag");
        let on = Serve::try_parse_from(["serve", "--toy-resource", "widgets"]).expect("flags");
        let triggers = Triggers::new(on.triggers.triggers());

        // The target: a canned API server that keeps the migrations created and answers them back named.
        let created: Arc<Mutex<Vec<Value>>> = Arc::default();
        let kept = created.clone();
        let router = axum::Router::new().route(
            "/apis/migration.k8s.io/v1alpha1/storageversionmigrations",
            post(move |axum::Json(mut m): axum::Json<Value>| async move {
                m["metadata"]["name"] = json!("widgets.toy.io-1");
                kept.lock().expect("lock").push(m.clone());
                (axum::http::StatusCode::CREATED, axum::Json(m))
            }),
        );
        let client = in_process_client(router);
        let ctx = TriggerContext {
            config: SchedulerConfig::default(),
            target: client.clone(),
            own: OwnObjects::new(client.clone()),
            inputs: Default::default(),
        };
        assert!(triggers.start_replicas(&ctx).is_empty(), "the toy reports nothing");
        let (events, _writer) = crate::scheduler::events::EventRecorder::spawn(client);
        let leaders = triggers.start_leaders(&ctx, &events);
        assert_eq!(leaders.len(), 1);
        for task in leaders {
            task.await.expect("the toy's leader part");
        }
        let created = created.lock().expect("lock");
        assert_eq!(created.len(), 1, "{created:?}");
        assert_eq!(created[0]["spec"]["resource"], json!({"group": "toy.io", "version": "v1", "resource": "widgets"}));
        assert_eq!(created[0]["metadata"]["annotations"]["migration.k8s.io/reason"], json!("a toy's whim"));
    }
}

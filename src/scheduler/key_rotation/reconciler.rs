//! The key-rotation trigger as a kube-runtime controller: one reconcile per StorageState, from reflector stores of
//! the StorageStates and the migrations, queued when the StorageState changes, when a migration of its resource
//! finishes, when the encryption config in use changes or one of its KMS v2 providers adopts a new key_id (every
//! StorageState), and every `--key-rotation-interval`
//! (the reconcile's requeue: the other replicas' write keys change without any event here). No round re-lists
//! everything: a reconcile reads its resource's discovery, and reads the StorageState and the migrations again from
//! the API only before it acts, so that a store that has not yet seen its own last write never makes it act twice.

use super::*;
use crate::error::qualified;
use crate::scheduler::trigger_kit::{discover_resource, is_finished, of_resource, Timed, NEVER_MIGRATED};
use crate::storage::encryption::kms::KeyIdChanges;
use futures::StreamExt;
use kube::runtime::controller::{applier, trigger_self, trigger_with, Action, Config};
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use std::sync::Arc;

struct Context {
    rotator: Rotator,
    migrations: Store<StorageVersionMigration>,
    interval: Duration,
}

/// Runs the reconciles until the task is aborted (a replica losing leadership).
pub(super) async fn run(rotator: Rotator, interval: Duration) {
    let (states, states_writer) = reflector::store::<StorageState>();
    let (migrations, migrations_writer) = reflector::store::<StorageVersionMigration>();
    let state_changes = reflector(states_writer, watcher(rotator.own.states.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let migration_changes =
        reflector(migrations_writer, watcher(rotator.own.migrations.clone(), watcher::Config::default()))
            .default_backoff()
            .applied_objects();
    let finished = trigger_with(migration_changes, |m: StorageVersionMigration| {
        is_finished(&m).then(|| ObjectRef::new(&qualified(&m.spec.resource.resource, &m.spec.resource.group)))
    });
    // A new config in use, or a new key_id of one of its KMS v2 providers, concerns every resource.
    let every_state = states.clone();
    let reloads = futures::stream::unfold((rotator.encryption.subscribe(), None), |(mut config, key_ids)| async move {
        let mut key_ids: KeyIdChanges = key_ids.unwrap_or_else(|| config.borrow_and_update().key_id_changes());
        tokio::select! {
            changed = config.changed() => {
                changed.ok()?;
                Some(((), (config, None)))
            }
            () = key_ids.changed() => Some(((), (config, Some(key_ids)))),
        }
    })
    .flat_map(move |()| {
        let all: Vec<ObjectRef<StorageState>> =
            every_state.state().iter().map(|s| ObjectRef::from_obj(s.as_ref())).collect();
        futures::stream::iter(all.into_iter().map(Ok::<_, watcher::Error>))
    });
    let queue = futures::stream::select(
        futures::stream::select(trigger_self(state_changes, ()).boxed(), finished.boxed()),
        reloads.map(|r| r.map(Into::into)).boxed(),
    );
    let context = Arc::new(Context { rotator, migrations, interval });
    let reconciles = applier(
        |state, context| Box::pin(reconcile(state, context)),
        |state, error, context| {
            tracing::warn!(storagestate = ?state.metadata.name, error = %error, "key rotation: acting on the decision failed; retrying next round");
            Action::requeue(context.interval)
        },
        context,
        states,
        queue,
        Config::default(),
    );
    reconciles
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "key rotation");
            }
        })
        .await;
}

/// One decision about a StorageState of a resource the target serves.
async fn reconcile(state: Arc<StorageState>, context: Arc<Context>) -> Result<Action, RoundError> {
    // The decisions follow the migrations: they must see every one.
    if context.migrations.wait_until_ready().await.is_err() {
        return Ok(Action::await_change());
    }
    let again = Action::requeue(context.interval);
    let r = &state.spec.resource;
    if NEVER_MIGRATED.contains(&r.resource.as_str()) {
        return Ok(Action::await_change());
    }
    let rotator = &context.rotator;
    let target = Timed { client: &rotator.target, timeout: rotator.timeout };
    let Some(served) = discover_resource(&target, &r.group, &r.resource).await? else { return Ok(again) };
    // A KMS v2 provider's key_id counts as part of its write key; without one yet, its first is awaited.
    let Some(configured) = rotator.encryption.current().write_key_id_label_for_resource(&r.state_name()) else {
        return Ok(again);
    };
    let replicas = rotator.live_writers(&r.state_name(), &configured);
    let all = context.migrations.state();
    let decision = decide_about(&state, &configured, &replicas, &of_resource(&all, &r.group, &r.resource));
    if matches!(decision, Decision::WaitForReplicas | Decision::Wait | Decision::Nothing) {
        return Ok(again);
    }
    // About to act: on the StorageState and migrations as they are now, not as the stores last saw them.
    let name = state.metadata.name.as_deref().unwrap_or_default();
    let Some(fresh) = rotator.own.get_state(name).await? else { return Ok(Action::await_change()) };
    let migrations = rotator.own.list_migrations().await?;
    let of = of_resource(&migrations, &r.group, &r.resource);
    let decision = decide_about(&fresh, &configured, &replicas, &of);
    rotator.act(&fresh, decision, &configured, &served, &of, Timestamp::now()).await?;
    Ok(again)
}

fn decide_about(
    state: &StorageState,
    configured: &str,
    replicas: &[String],
    migrations: &[&StorageVersionMigration],
) -> Decision {
    decide(&Observed { configured, replicas, status: state.status.as_ref(), migrations })
}

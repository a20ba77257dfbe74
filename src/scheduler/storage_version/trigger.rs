//! The storage-version trigger as a [`Trigger`]: its flags, the reporter (every replica) and the decider (the
//! leader).

use super::*;
use crate::api::storage_state::StorageState;
use crate::api::storage_version_migration::StorageVersionMigration;
use crate::error::qualified;
use crate::scheduler::events::EventRecorder;
use crate::scheduler::trigger_kit::{Trigger, TriggerContext, TriggerFlags};
use crate::scheduler::SchedulerConfig;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{trigger_self, trigger_with, Action, Config};
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{applier, WatchStreamExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The storage-version trigger's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct StorageVersionFlags {
    /// Run only the migrator of the scheduler: no discovery poll, migrations are requested by hand (kubectl create,
    /// `migration-apiserver migrate`).
    #[arg(long)]
    pub disable_trigger: bool,
    /// How often the trigger reads the target's discovery for storage version hashes.
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse_duration)]
    pub discovery_interval: Duration,
    /// Finished migrations kept per resource.
    #[arg(long, default_value_t = 5)]
    pub migration_history: usize,
}

impl TriggerFlags for StorageVersionFlags {
    fn trigger(&self) -> Option<Box<dyn Trigger>> {
        (!self.disable_trigger).then(|| {
            Box::new(StorageVersionTrigger {
                interval: self.discovery_interval,
                history: self.migration_history.max(1),
                local: Local::default(),
            }) as Box<dyn Trigger>
        })
    }
}

/// Storage version hashes from the target's discovery: the reporter on every replica, the decider on the leader;
/// what the reporter discovers is shared with the decider of the same process ([`Local`]).
pub struct StorageVersionTrigger {
    interval: Duration,
    history: usize,
    local: Local,
}

impl StorageVersionTrigger {
    fn config(&self, ctx: &TriggerContext) -> SchedulerConfig {
        SchedulerConfig { discovery_interval: self.interval, migration_history: self.history, ..ctx.config.clone() }
    }
}

impl Trigger for StorageVersionTrigger {
    fn name(&self) -> &'static str {
        "storage-version"
    }

    fn start_replica(&self, ctx: &TriggerContext) -> Option<tokio::task::JoinHandle<()>> {
        Some(spawn_reporter(self.config(ctx), ctx.target.clone(), ctx.own.clone(), self.local.clone()))
    }

    fn start_leader(&self, ctx: &TriggerContext, events: &EventRecorder) -> Option<tokio::task::JoinHandle<()>> {
        Some(spawn(self.config(ctx), ctx.own.clone(), self.local.clone(), events.clone()))
    }
}

/// Starts the reporter: every `--discovery-interval` it reads the target's discovery and reports the hashes into
/// the StorageStates, and the versions it found into `local` (for the decider).
pub fn spawn_reporter(
    config: SchedulerConfig,
    target: kube::Client,
    own: OwnObjects,
    local: Local,
) -> tokio::task::JoinHandle<()> {
    let s = local.served.clone();
    let mut checked = local.startup_checked.subscribe();
    tokio::spawn(async move {
        if config.replicas == Replicas::Several {
            if let Err(e) = recreate_stale(&own, Timestamp::now(), config.discovery_interval).await {
                tracing::warn!(error = %e, "trigger: the start-up check of storagestates failed");
            }
        } else {
            // One replica: the decider's start-up check comes first.
            let _ = checked.wait_for(|c| *c).await;
        }
        loop {
            let complete = match discover(&target, config.request_timeout).await {
                Ok(d) => {
                    for (group, error) in &d.failed {
                        tracing::warn!(group = %group, error = %error, "trigger: discovery of a group failed; its storagestates are left as they are");
                    }
                    {
                        let mut map = s.write().unwrap_or_else(|e| e.into_inner());
                        for r in &d.resources {
                            map.insert(r.qualified(), r.gvr());
                        }
                    }
                    report(&own, &config.identity, &d, Timestamp::now(), config.discovery_interval, config.replicas)
                        .await;
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "trigger: discovery failed; nothing reported, retrying");
                    false
                }
            };
            // A target that cannot be read at all is retried sooner than a full interval.
            let interval = config.discovery_interval;
            tokio::time::sleep(if complete { interval } else { interval.min(Duration::from_secs(30)) }).await;
        }
    })
}

/// Starts the decider (leader only), recording its decisions as Events. Aborting the task stops its watches and
/// its decisions under way at once (the reconciles run inside it).
pub fn spawn(
    config: SchedulerConfig,
    own: OwnObjects,
    local: Local,
    events: EventRecorder,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let decider = Decider::new(own.clone(), &config, local.served.clone()).with_events(events);
        run_decider(decider, own, config.discovery_interval, local).await
    })
}

/// What the decider's reconciles share.
pub(super) struct DeciderContext {
    decider: Decider,
    /// Every StorageVersionMigration, as its reflector sees them.
    migrations: Store<StorageVersionMigration>,
    interval: Duration,
    /// When each StorageState's next periodic round is due.
    next_round: Mutex<HashMap<String, Instant>>,
}

impl DeciderContext {
    pub(super) fn new(decider: Decider, migrations: Store<StorageVersionMigration>, interval: Duration) -> Self {
        DeciderContext { decider, migrations, interval, next_round: Mutex::default() }
    }

    /// Whether a decision about `name` at `now` is its periodic round (the first one is); if so, the next one is
    /// due an interval later.
    pub(super) fn round_due(&self, name: &str, now: Instant) -> bool {
        let mut rounds = self.next_round.lock().unwrap_or_else(|e| e.into_inner());
        let due = rounds.get(name).is_none_or(|next| *next <= now);
        if due {
            rounds.insert(name.to_string(), now + self.interval);
        }
        due
    }

    /// The requeue that brings `name`'s next periodic round: reports age and replicas fall silent without any
    /// watch event.
    pub(super) fn until_next_round(&self, name: &str, now: Instant) -> Action {
        let rounds = self.next_round.lock().unwrap_or_else(|e| e.into_inner());
        let next = rounds.get(name).copied().unwrap_or(now);
        Action::requeue(next.saturating_duration_since(now))
    }
}

/// The decider as kube-runtime runs a controller (its [`applier`], which `Controller` is built on): one reconcile
/// per StorageState, queued when it changes (a replica reported, or the watch listed again), when a migration of
/// its resource changes, and at its periodic round (the reconcile's requeue). The StorageStates and migrations
/// come from reflector stores fed by one watch each; a store that lists again brings a decision about every
/// StorageState, as a periodic round over all of them did.
///
/// Followed: kube-rs kube-runtime 5.0.0, `controller/mod.rs` (`applier`, `Controller::run`) and `controller/trigger.rs`.
/// kube-runtime's `Controller::watches` would open a second watch of the migrations (its store is not shared
/// without the unstable `watches_stream`), so the queue is built from the same pieces: `trigger_self` for the
/// StorageStates, `trigger_with` and [`state_of`] for the migrations.
pub(super) async fn run_decider(decider: Decider, own: OwnObjects, interval: Duration, local: Local) {
    // With several replicas every reporter checks at its own start ([`recreate_stale`]).
    if decider.replicas == Replicas::One {
        if let Err(e) = decider.reset_stale(Timestamp::now()).await {
            tracing::warn!(error = %e, "trigger: listing storagestates for the start-up check");
        }
    }
    local.startup_checked.send_replace(true);
    let (states, states_writer) = reflector::store::<StorageState>();
    let (migrations, migrations_writer) = reflector::store::<StorageVersionMigration>();
    let state_changes =
        reflector(states_writer, watcher(own.states, watcher::Config::default())).default_backoff().applied_objects();
    let migration_changes = reflector(migrations_writer, watcher(own.migrations, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let queue = futures::stream::select(
        trigger_self(state_changes, ()).boxed(),
        trigger_with(migration_changes, |m: StorageVersionMigration| Some(state_of(&m))).boxed(),
    );
    let context = Arc::new(DeciderContext::new(decider, migrations, interval));
    let reconciles = applier(
        |state, context| Box::pin(reconcile(state, context)),
        |state, error, context| {
            let name = state.metadata.name.as_deref().unwrap_or_default();
            tracing::warn!(storagestate = %name, error = %error, "trigger: deciding about a resource failed; retrying next period");
            context.until_next_round(name, Instant::now())
        },
        context,
        states,
        queue,
        Config::default(),
    );
    reconciles
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "trigger: decider");
            }
        })
        .await;
}

/// One decision about `state`, from the stores.
async fn reconcile(state: Arc<StorageState>, context: Arc<DeciderContext>) -> Result<Action, StoreError> {
    // The first decisions wait for the first list of the migrations: they must see every one.
    if context.migrations.wait_until_ready().await.is_err() {
        return Ok(Action::await_change());
    }
    let name = state.metadata.name.as_deref().unwrap_or_default();
    let round = context.round_due(name, Instant::now());
    let all = context.migrations.state();
    let mine = of_resource(&all, &state.spec.resource.group, &state.spec.resource.resource);
    context.decider.reconcile(&state, &mine, Timestamp::now(), round).await?;
    Ok(context.until_next_round(name, Instant::now()))
}

/// The StorageState a migration's change is about: the one of its `spec.resource`. The
/// `migration.k8s.io/resource` label (or annotation, when the label had to be shortened) says the same for the
/// migrations we request, but migrations created by hand carry none, and [`of_resource`] counts them by
/// `spec.resource` too: a migration queues exactly the StorageState whose decision reads it.
pub(super) fn state_of(m: &StorageVersionMigration) -> ObjectRef<StorageState> {
    ObjectRef::new(&qualified(&m.spec.resource.resource, &m.spec.resource.group))
}

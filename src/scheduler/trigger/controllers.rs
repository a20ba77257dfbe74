//! The storage-version trigger as a [`Trigger`]: its flags, the reporter (every replica) and the decider (the
//! leader).

use super::*;
use crate::api::storage_state::StorageState;
use crate::api::storage_version_migration::StorageVersionMigration;
use crate::error::qualified;
use crate::scheduler::events::EventRecorder;
use crate::scheduler::triggers::{Trigger, TriggerContext, TriggerFlags};
use crate::scheduler::SchedulerConfig;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use std::collections::BTreeSet;
use std::time::Duration;

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

/// Starts the decider (leader only), recording its decisions as Events.
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

/// What a watch event asks of the decider.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// A decision about this StorageState.
    Decide(String),
    /// A decision about every StorageState: the watch listed again, so events may have been missed.
    All,
    Nothing,
}

/// The watcher of `api`'s objects as [`Wake`]s: an added or modified object by `interest`, every completed list as
/// a full round; deletions need nothing. The first list counts too: the decider's first round runs before the
/// watch starts, and a replica's report written between the two is only in that list (it is not an event).
fn wakes<K>(api: kube::Api<K>, interest: fn(&K) -> Option<String>) -> impl Stream<Item = Wake> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    watcher(api, watcher::Config::default()).default_backoff().map(move |event| match event {
        Ok(Event::Apply(object)) => interest(&object).map_or(Wake::Nothing, Wake::Decide),
        Ok(Event::InitDone) => Wake::All,
        Ok(_) => Wake::Nothing,
        Err(e) => {
            tracing::debug!(error = %e, "trigger: watch");
            Wake::Nothing
        }
    })
}

/// The decider's events: a periodic round every interval, and single decisions when a StorageState changes (a
/// replica reported) or a migration finishes.
pub(super) async fn run_decider(mut decider: Decider, own: OwnObjects, interval: Duration, local: Local) {
    // With several replicas every reporter checks at its own start ([`recreate_stale`]).
    if decider.replicas == Replicas::One {
        if let Err(e) = decider.reset_stale(Timestamp::now()).await {
            tracing::warn!(error = %e, "trigger: listing storagestates for the start-up check");
        }
    }
    local.startup_checked.send_replace(true);
    let mut events = futures::stream::select(
        wakes(own.states.clone(), state_changed).boxed(),
        wakes(own.migrations.clone(), migration_finished).boxed(),
    );
    let mut next_round = tokio::time::Instant::now();
    loop {
        let mut wakes = Vec::new();
        tokio::select! {
            _ = tokio::time::sleep_until(next_round) => {
                if let Err(e) = decider.round(Timestamp::now()).await {
                    tracing::warn!(error = %e, "trigger: reading storagestates and storageversionmigrations");
                }
                next_round = tokio::time::Instant::now() + interval;
                continue;
            }
            Some(wake) = events.next() => wakes.push(wake),
        }
        // Everything already waiting is decided together.
        while let Some(Some(wake)) = events.next().now_or_never() {
            wakes.push(wake);
        }
        if wakes.contains(&Wake::All) {
            next_round = tokio::time::Instant::now();
            continue;
        }
        let changed: BTreeSet<String> =
            wakes.into_iter().filter_map(|w| if let Wake::Decide(name) = w { Some(name) } else { None }).collect();
        if let Err(e) = decider.resources(&changed, Timestamp::now()).await {
            tracing::warn!(error = %e, "trigger: reading storageversionmigrations failed; retrying next period");
        }
    }
}

/// A StorageState changed: its name.
pub(super) fn state_changed(state: &StorageState) -> Option<String> {
    state.metadata.name.clone()
}

/// A migration finished: the StorageState of its resource.
pub(super) fn migration_finished(m: &StorageVersionMigration) -> Option<String> {
    is_finished(m).then(|| qualified(&m.spec.resource.resource, &m.spec.resource.group))
}

//! The controllers: the reporter (every replica) and the decider (the leader).

use super::*;
use crate::api::storage_state::StorageState;
use crate::api::storage_version_migration::StorageVersionMigration;
use crate::error::qualified;
use crate::registry::strategy::Kind;
use crate::registry::{WatchOut, WatchParams};
use crate::scheduler::own::OwnApi;
use crate::scheduler::SchedulerConfig;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::mpsc;

/// Starts the reporter: every `--discovery-interval` it reads the target's discovery and reports the hashes.
/// Returns the task and the versions it found (for the decider).
pub fn spawn_reporter(
    config: SchedulerConfig,
    target: kube::Client,
    own: OwnApi,
) -> (tokio::task::JoinHandle<()>, Local) {
    let local = Local::default();
    let s = local.served.clone();
    let mut checked = local.startup_checked.subscribe();
    let task = tokio::spawn(async move {
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
    });
    (task, local)
}

/// Starts the decider (leader only).
pub fn spawn(config: SchedulerConfig, own: OwnApi, local: Local) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let decider = Decider::new(std::sync::Arc::new(own.clone()), &config, local.served.clone());
        run_decider(decider, own, config.discovery_interval, local).await
    })
}

/// The decider's events: a periodic round every interval, and single decisions when a StorageState changes (a
/// replica reported) or a migration finishes.
pub(super) async fn run_decider(mut decider: Decider<OwnApi>, own: OwnApi, interval: Duration, local: Local) {
    // With several replicas every reporter checks at its own start ([`recreate_stale`]).
    if decider.replicas == Replicas::One {
        if let Err(e) = decider.reset_stale(Timestamp::now()).await {
            tracing::warn!(error = %e, "trigger: listing storagestates for the start-up check");
        }
    }
    local.startup_checked.send_replace(true);
    let mut states = watch_kind::<StorageState>(&own).await;
    let mut migrations = watch_kind::<StorageVersionMigration>(&own).await;
    let mut next_round = tokio::time::Instant::now();
    loop {
        let mut changed: BTreeSet<String> = BTreeSet::new();
        let mut lost = false;
        tokio::select! {
            _ = tokio::time::sleep_until(next_round) => {
                if let Err(e) = decider.round(Timestamp::now()).await {
                    tracing::warn!(error = %e, "trigger: reading storagestates and storageversionmigrations");
                }
                next_round = tokio::time::Instant::now() + interval;
                continue;
            }
            ev = recv(&mut states) => collect(ev, &mut changed, &mut lost, state_changed),
            ev = recv(&mut migrations) => collect(ev, &mut changed, &mut lost, migration_finished),
        }
        if let Some(rx) = states.as_mut() {
            while let Ok(ev) = rx.try_recv() {
                collect(Some(ev), &mut changed, &mut lost, state_changed);
            }
        }
        if let Some(rx) = migrations.as_mut() {
            while let Ok(ev) = rx.try_recv() {
                collect(Some(ev), &mut changed, &mut lost, migration_finished);
            }
        }
        if lost {
            // Events may have been missed: watch again and decide everything.
            tokio::time::sleep(Duration::from_millis(200)).await;
            states = watch_kind::<StorageState>(&own).await;
            migrations = watch_kind::<StorageVersionMigration>(&own).await;
            next_round = tokio::time::Instant::now();
            continue;
        }
        for name in changed {
            if let Err(e) = decider.resource(&name, Timestamp::now()).await {
                tracing::warn!(storagestate = %name, error = %e, "trigger: deciding about a resource failed; retrying next period");
            }
        }
    }
}

pub(super) async fn watch_kind<K: Kind>(own: &OwnApi) -> Option<mpsc::Receiver<WatchOut>> {
    let info = K::info();
    let resource = own.registry().resource(info.group, info.versions[0], info.plural)?;
    let params = WatchParams { send_initial_events: Some(false), ..Default::default() };
    match resource.watch(None, info.versions[0], params).await {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!(error = %e.message, resource = info.plural, "trigger: watching");
            None
        }
    }
}

pub(super) async fn recv(watch: &mut Option<mpsc::Receiver<WatchOut>>) -> Option<WatchOut> {
    match watch {
        Some(rx) => rx.recv().await,
        // No watch (it could not be opened): fall back to a short wait, then a full round.
        None => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        }
    }
}

/// The StorageState a watch event concerns, if it calls for a decision.
pub(super) type Interest = fn(&Value) -> Option<String>;

/// A StorageState changed: its name (DELETED ones need nothing).
pub(super) fn state_changed(object: &Value) -> Option<String> {
    object["metadata"]["name"].as_str().map(str::to_string)
}

/// A migration finished: the StorageState of its resource.
pub(super) fn migration_finished(object: &Value) -> Option<String> {
    let m = serde_json::from_value::<StorageVersionMigration>(object.clone()).ok()?;
    is_finished(&m).then(|| qualified(&m.spec.resource.resource, &m.spec.resource.group))
}

pub(super) fn collect(ev: Option<WatchOut>, changed: &mut BTreeSet<String>, lost: &mut bool, interest: Interest) {
    match ev {
        Some(WatchOut::Event { kind, object }) if kind != "DELETED" => {
            if let Some(name) = interest(&object) {
                changed.insert(name);
            }
        }
        Some(WatchOut::Event { .. }) | Some(WatchOut::Bookmark { .. }) => {}
        Some(WatchOut::Error(_)) | None => *lost = true,
    }
}

//! `serve`'s scheduler side: the triggers and the migrator, leader election, and the cluster check, all of which
//! talk to the target cluster when there is one.

use super::ServeArgs;
use crate::server::AppState;
use crate::storage::encryption::EncryptionConfigHandle;
use std::sync::Arc;
use std::time::Duration;

/// The running scheduler: what a graceful shutdown stops.
pub(super) struct RunningScheduler {
    /// Tells the election to stop leading and release its lock.
    pub(super) stop_election: tokio::sync::watch::Sender<bool>,
    pub(super) election: Option<tokio::task::JoinHandle<()>>,
    /// The triggers' replica parts: stopped before our reports are withdrawn, so that no late report puts them
    /// back.
    pub(super) reporters: Vec<tokio::task::JoinHandle<()>>,
    /// Our reports are withdrawn on shutdown when other replicas share the StorageStates.
    pub(super) withdraw: Option<(crate::scheduler::trigger_kit::OwnObjects, String)>,
}

impl RunningScheduler {
    /// Gives leadership up at once (the lock released, so another replica takes over without waiting for the
    /// lease to expire) and withdraws our reports. Bounded: shutdown never hangs on etcd or the cluster.
    pub(super) async fn stop(self) {
        let _ = self.stop_election.send(true);
        for r in &self.reporters {
            r.abort();
        }
        let steps = async {
            if let Some(e) = self.election {
                let _ = e.await;
            }
            if let Some((own, id)) = &self.withdraw {
                match crate::scheduler::storage_version::withdraw(own, id).await {
                    Ok(n) => tracing::info!(storagestates = n, reporter = %id, "trigger: reports withdrawn"),
                    Err(e) => tracing::warn!(error = %e, "trigger: withdrawing our reports"),
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), steps).await.is_err() {
            tracing::warn!("scheduler: stopping took longer than 5s; leaving the lease to expire");
        }
    }
}

/// The scheduler: the triggers' replica parts on every replica; their decisions and the migrator on the elected
/// leader (or at once when there is nothing to elect among).
pub(super) async fn start_scheduler(
    args: &ServeArgs,
    state: &Arc<AppState>,
    app: &axum::Router,
    identity: &str,
    encryption: Option<EncryptionConfigHandle>,
    replica_writes: Option<Arc<crate::storage::encryption::replicas::WriteGate>>,
) -> anyhow::Result<RunningScheduler> {
    use crate::scheduler::election;
    use crate::scheduler::trigger_kit::TriggerContext;
    use crate::scheduler::triggers::Triggers;
    let cluster = cluster_client(args).await?;
    let target = cluster.clone().unwrap_or_else(|| crate::client::in_process_client(app.clone()));
    let identity = identity.to_string();
    let mut config = args.scheduler_config();
    config.identity = identity.clone();
    if cluster.is_none() {
        // Standalone the target is this server: the adaptive rate also watches how its other clients are served.
        config.clients_latency = Some(state.metrics.clients.clone());
    }
    let (scheduler_metrics, election_metrics, state_metrics) = match state.metrics.registry.lock() {
        Ok(mut reg) => (
            crate::scheduler::metrics::SchedulerMetrics::register(&mut reg),
            election::ElectionMetrics::register(&mut reg),
            crate::scheduler::state_metrics::StorageStateMetrics::register(&mut reg),
        ),
        Err(_) => anyhow::bail!("metrics registry poisoned"),
    };
    let econfig = args.election_config(&identity);
    let lock = leader_lock(args, cluster.as_ref(), &identity).await?;
    if lock.is_some() {
        // Before anything starts: invalid timing fails the start.
        econfig.validate()?;
    }
    let own = crate::scheduler::trigger_kit::OwnObjects::new(crate::client::in_process_client(app.clone()));
    let mut ctx = TriggerContext { config, target, own, inputs: Default::default() };
    // Our own store's keys are rotated only when it is the target: a cluster's stores are not ours.
    if let Some(encryption) = encryption.filter(|_| cluster.is_none()) {
        ctx.inputs.insert(crate::scheduler::key_rotation::OwnStoreKeys { encryption, replica_writes });
    }
    let triggers = Triggers::new(args.triggers.triggers());
    let reporters = crate::scheduler::start_replica(&triggers, &ctx);
    // Every replica exports the StorageStates' metrics; the watch runs as long as the process.
    let _state_metrics = crate::scheduler::state_metrics::spawn(ctx.own.states.clone(), state_metrics);
    let withdraw = (ctx.config.replicas == crate::scheduler::trigger_kit::Replicas::Several)
        .then(|| (ctx.own.clone(), identity.clone()));
    let (stop_election, stop_rx) = tokio::sync::watch::channel(false);
    let start = move || crate::scheduler::start(&triggers, &ctx, scheduler_metrics.clone());
    let Some(lock) = lock else {
        tracing::info!(identity = %identity, leader_elect = args.leader_elect,
            "leader election: none (no cluster Lease and no etcd to elect with, or --leader-elect=false); this process runs the scheduler");
        election_metrics.set(&econfig.name, true);
        let _tasks = start();
        return Ok(RunningScheduler { stop_election, election: None, reporters, withdraw });
    };
    let (leading_tx, leading_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(election::supervise(leading_rx, start));
    let election = tokio::spawn(election::run(lock, econfig, leading_tx, election_metrics, stop_rx));
    Ok(RunningScheduler { stop_election, election: Some(election), reporters, withdraw })
}

/// In cluster mode: warns (and exports metrics) while one of our APIServices hides a group the cluster serves
/// itself, or a group this server serves is routed elsewhere (`server::cluster_check`).
pub(super) async fn spawn_cluster_check(
    args: &ServeArgs,
    served: &[Arc<dyn crate::registry::strategy::Strategy>],
    state: &Arc<AppState>,
) -> anyhow::Result<()> {
    use crate::server::cluster_check::{watch, Backend, ClusterCheckMetrics, ServedGroups};
    let Some(client) = cluster_client(args).await? else { return Ok(()) };
    let metrics = match state.metrics.registry.lock() {
        Ok(mut reg) => ClusterCheckMetrics::register(&mut reg),
        Err(_) => anyhow::bail!("metrics registry poisoned"),
    };
    let groups = crate::server::manifests::apiservice::group_versions(served)
        .into_iter()
        .map(|(group, _)| {
            let crds = crate::server::crd::stored(served).map(|k| k.info()).filter(|i| i.group == group);
            (group.to_string(), crds.map(|i| i.qualified_resource()).collect())
        })
        .collect();
    let ours = Backend::service(&args.service_namespace, crate::server::manifests::SERVICE_NAME);
    tokio::spawn(watch(client, ours, ServedGroups(groups), metrics));
    Ok(())
}

/// The target cluster's client: --kubeconfig, else the in-cluster config in a pod; None standalone.
pub(super) async fn cluster_client(args: &ServeArgs) -> anyhow::Result<Option<kube::Client>> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    Ok(match &args.kubeconfig {
        Some(path) => Some(crate::cli::target_client(Some(path)).await?),
        None if in_cluster => Some(crate::cli::target_client(None).await?),
        None => None,
    })
}

/// What the replicas elect a leader with: a Lease on the target cluster when it serves them, else an etcd lease
/// with --etcd-servers; none with --leader-elect=false or without either.
async fn leader_lock(
    args: &ServeArgs,
    cluster: Option<&kube::Client>,
    identity: &str,
) -> anyhow::Result<Option<Box<dyn crate::scheduler::election::LeaderLock>>> {
    use crate::scheduler::election;
    if !args.leader_elect {
        return Ok(None);
    }
    if let Some(client) = cluster {
        if election::lease::served(client).await {
            let ns = args.leader_elect_resource_namespace.clone().unwrap_or_else(|| args.service_namespace.clone());
            return Ok(Some(Box::new(election::lease::LeaseLock::new(
                client.clone(),
                &ns,
                &args.leader_elect_resource_name,
                identity,
                args.leader_elect_lease_duration,
            ))));
        }
        tracing::warn!("leader election: the target cluster serves no coordination.k8s.io/v1 Leases; electing over etcd when --etcd-servers is set, else not at all");
    }
    if !args.etcd.enabled() {
        return Ok(None);
    }
    Ok(Some(Box::new(election::etcd::EtcdLock::new(
        args.etcd.connect().await?,
        &args.etcd.prefix,
        &args.leader_elect_resource_name,
        identity,
        args.leader_elect_lease_duration,
    ))))
}

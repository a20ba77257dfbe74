//! The embedded migration scheduler: the trigger (discovery poll -> StorageState -> StorageVersionMigration) and the
//! migrator (chunked LIST + no-op writes, rate limited). It talks to the target through a Kubernetes client (a
//! cluster via kubeconfig, or this server itself through an in-process client over the same HTTP API), and to its
//! own state (StorageState, StorageVersionMigration) through `kube::Api` over the in-process client, never the
//! registry or storage: authentication, validation, resourceVersions and watch events apply to its own writes as
//! to any client's, and kube-runtime's watchers follow them.

pub mod adaptive;
pub mod cluster_encryption;
pub mod election;
pub mod events;
pub mod key_rotation;
pub mod managers;
pub mod metrics;
pub mod migrator;
pub mod report;
pub mod state_metrics;
pub mod storage_version;
pub mod trigger_kit;
pub mod triggers;

use std::time::Duration;

/// Tunables, from the `serve` flags.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// How often the storage-version trigger reads the target's discovery (its flags set it).
    pub discovery_interval: Duration,
    /// Finished migrations kept per resource, older ones deleted (the storage-version trigger's flags set it).
    pub migration_history: usize,
    /// Objects per LIST chunk.
    pub chunk_size: u32,
    /// Target requests per second over all migrations (token bucket), and the bucket size: the ceiling of the
    /// adaptive rate, or the rate itself when it is not adaptive. 0 = no ceiling (unlimited when not adaptive).
    pub qps: f64,
    pub burst: u32,
    /// Whether the rate adapts to the target's feedback ([`adaptive`]), and its floor.
    pub adaptive: bool,
    pub min_qps: f64,
    /// Standalone (the target is this server): the latencies of the server's other clients, which the adaptive
    /// rate keeps close to what they are without the migration.
    pub clients_latency: Option<std::sync::Arc<crate::server::latency::LatencyHistogram>>,
    /// Resources migrated at once.
    pub concurrency: usize,
    /// Attempts for one request on retryable errors (429, 5xx, timeouts, connection errors) before the migration
    /// steps back (and is resumed later); delays grow exponentially from `retry_base` to `retry_max`, or follow
    /// Retry-After.
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Timeout of one request to the target.
    pub request_timeout: Duration,
    /// Trim a custom resource's CRD `status.storedVersions` to the storage version when its migration Succeeds
    /// (`--update-crd-stored-versions`).
    pub update_crd_stored_versions: bool,
    /// This process' reporterID in StorageStates (the leader election identity).
    pub identity: String,
    /// Whether other replicas report into the same StorageStates (etcd) or this process is alone.
    pub replicas: trigger_kit::Replicas,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            discovery_interval: Duration::from_secs(600),
            migration_history: 5,
            chunk_size: 500,
            qps: 0.0,
            burst: 10,
            adaptive: true,
            min_qps: 40.0,
            clients_latency: None,
            concurrency: 1,
            max_attempts: 8,
            retry_base: Duration::from_millis(100),
            retry_max: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            update_crd_stored_versions: true,
            identity: "migration-apiserver".into(),
            replicas: trigger_kit::Replicas::One,
        }
    }
}

/// Starts the part of the scheduler every replica runs: the triggers' replica parts (none with
/// `--disable-trigger`).
pub fn start_replica(
    triggers: &triggers::Triggers,
    ctx: &trigger_kit::TriggerContext,
) -> Vec<tokio::task::JoinHandle<()>> {
    triggers.start_replicas(ctx)
}

/// Starts the leader's part: the triggers' decisions, the migrator and their Event recorder; they run until the
/// process ends or the returned tasks are aborted, as a replica that loses leadership does at once. Events go to
/// the target: this server standalone, the cluster's kube-apiserver in cluster mode (our APIService serves none).
pub fn start(
    triggers: &triggers::Triggers,
    ctx: &trigger_kit::TriggerContext,
    metrics: std::sync::Arc<metrics::SchedulerMetrics>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (events, writer) = events::EventRecorder::spawn(ctx.target.clone());
    let mut tasks = vec![writer];
    tasks.extend(triggers.start_leaders(ctx, &events));
    // Both migration APIs are served by this server: the in-tree kind's Api shares our kind's in-process client.
    let apis = migrator::MigrationApis {
        ours: ctx.own.migrations.clone(),
        in_tree: kube::Api::all(ctx.own.migrations.clone().into_client()),
    };
    tasks.push(migrator::spawn(ctx.config.clone(), ctx.target.clone(), apis, metrics, events));
    tasks
}

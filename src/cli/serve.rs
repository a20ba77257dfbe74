//! `serve`: its flags, logging, and the assembly of storage, registry, authentication, scheduler and HTTP server.

use crate::api::kinds;
use crate::auth::certs::{ensure_dev_certs, DevCertOptions};
use crate::duration::parse_duration;
use crate::registry::{Registry, RegistryConfig};
use crate::server::inflight::InflightLimits;
use crate::server::metrics::Metrics;
use crate::server::{router, AppState};
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use crate::storage::encryption::{EncryptedStorage, EncryptionConfig, EncryptionConfigHandle, ReloadError};
use crate::storage::etcd::{EtcdOptions, EtcdStorage};
use crate::storage::{HistoryLimit, Storage};
use clap::ValueEnum;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod backups;
use backups::{backups, check_snapshot_flags, with_backups};
pub(crate) mod runtime_config;
mod scheduler;
use scheduler::{cluster_client, spawn_cluster_check, start_scheduler, RunningScheduler};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The port on which to serve HTTPS.
    #[arg(long, default_value_t = 8443)]
    pub secure_port: u16,
    /// The IP address on which to listen.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    /// The most non-mutating requests in flight at once, as kube-apiserver's flag without API Priority and
    /// Fairness: above it the server answers 429 with Retry-After. A LIST counts one per 100 objects it returns
    /// (at most 10); watches and system:masters are not counted. 0: no limit.
    #[arg(long, default_value_t = crate::server::inflight::DEFAULT_MAX_REQUESTS_INFLIGHT)]
    pub max_requests_inflight: u32,
    /// The most mutating requests in flight at once (create, update, patch, delete), as kube-apiserver's flag
    /// without API Priority and Fairness: above it the server answers 429 with Retry-After. 0: no limit.
    #[arg(long, default_value_t = crate::server::inflight::DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT)]
    pub max_mutating_requests_inflight: u32,
    /// Directory of the embedded store (unused with --etcd-servers).
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// The etcd backend: --etcd-servers, --etcd-prefix, --etcd-cafile, --etcd-certfile, --etcd-keyfile.
    #[command(flatten)]
    pub etcd: crate::storage::etcd::EtcdArgs,
    /// Directory of the generated certificates and admin.kubeconfig (ignored for serving when
    /// --tls-cert-file is set).
    #[arg(long, default_value = "./certs")]
    pub cert_dir: PathBuf,
    /// Serving certificate (PEM, may include the chain); overrides the generated one.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Authentication and authorization: --client-ca-file, --token-auth-file, --authentication-kubeconfig,
    /// --authorization-kubeconfig, --requestheader-*, ... (see `auth::options`).
    #[command(flatten)]
    pub auth: Box<crate::auth::options::AuthArgs>,
    /// Auditing: --audit-policy-file, --audit-log-* (see `audit::options`).
    #[command(flatten)]
    pub audit: Box<crate::audit::options::AuditArgs>,
    /// Storage version of a resource, `<plural>.<group>=<version>`; repeatable.
    #[arg(long, value_parser = parse_storage_version)]
    pub storage_version: Vec<(String, String)>,
    /// API group versions to turn on or off, kube-apiserver's syntax: `<group>/<version>=false`, comma-separated,
    /// repeatable. A group is served whole or not at all (turn off every version of it); use it where another
    /// server serves the group (gardener-apiserver: core.gardener.cloud/v1alpha1=false,core.gardener.cloud/v1beta1=false).
    /// migration.k8s.io and storagemigration.k8s.io stay on while the scheduler runs.
    #[arg(long, value_parser = runtime_config::parse_runtime_config)]
    pub runtime_config: Vec<Vec<runtime_config::RuntimeConfigEntry>>,
    /// Objects larger than this (encoded) are rejected.
    #[arg(long, default_value_t = 1536 * 1024)]
    pub max_object_bytes: usize,
    /// Events kept in memory for watch resumption (a watch from an older resourceVersion gets 410 Gone).
    #[arg(long, default_value_t = 100_000)]
    pub watch_history: usize,
    /// Memory the watch history may take (keys, values and previous values of its events); whichever of this and
    /// --watch-history is reached first drops the oldest events. Quantity: 64Mi, 1Gi, ...
    #[arg(long, default_value = "64Mi", value_parser = crate::byte_size::parse_byte_size)]
    pub watch_history_bytes: usize,
    /// Page cache of the embedded store (redb): reads of objects not in it go to the file (and the kernel's page
    /// cache, which is not counted in the server's RSS). Quantity: 128Mi, 1Gi, ...
    #[arg(long, default_value = "128Mi", value_parser = crate::byte_size::parse_byte_size)]
    pub storage_cache_size: usize,
    /// How long the embedded store keeps a chunked list's snapshot after its last page: continue tokens within it
    /// read the first page's state at a cost independent of the store's size and of the writes since; older ones
    /// fall back to the watch history, then 410 Gone. A pinned snapshot makes the file grow by what is written
    /// meanwhile (at most 5 minutes' worth, longer only with a longer timeout); 0 pins none.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub list_snapshot_timeout: Duration,
    /// Take a snapshot of the embedded store this often (0: never, the default); the first one an interval after
    /// the start. Snapshots go to --snapshot-dir; `POST /storage/snapshots` takes one at any time. Embedded store
    /// only: on etcd, use etcd's own snapshots (`etcdctl snapshot save`).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub snapshot_interval: Duration,
    /// Directory of the embedded store's snapshots (default: <data-dir>/snapshots).
    #[arg(long)]
    pub snapshot_dir: Option<PathBuf>,
    /// How many snapshots to keep in --snapshot-dir (default 5; 0 keeps all): after each snapshot, the oldest
    /// beyond it are removed.
    #[arg(long)]
    pub snapshot_retention: Option<usize>,
    /// How often watches that allow bookmarks get one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub watch_bookmark_interval: Duration,
    /// Amount of time to retain events (standalone, where this server serves them), as kube-apiserver's flag: an
    /// event is removed this long after its last write.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub event_ttl: Duration,
    /// Namespace the server runs in (for the in-cluster names in the generated serving certificate).
    #[arg(long, default_value = "migration-apiserver")]
    pub service_namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Encryption at rest: a kube-apiserver EncryptionConfiguration (apiserver.config.k8s.io/v1) file.
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,
    /// Reload --encryption-provider-config while serving when its content changes (as kube-apiserver's flag). A new
    /// file that does not parse, or that drops a key stored values still use, keeps the config in use.
    #[arg(long, requires = "encryption_provider_config")]
    pub encryption_provider_config_automatic_reload: bool,
    /// Start even though --encryption-provider-config no longer holds a key that stored values are encrypted
    /// with: those values cannot be read (each read of one answers 500) until the key is back in the config.
    #[arg(long, requires = "encryption_provider_config")]
    pub allow_unreadable_encrypted_values: bool,
    /// Kubeconfig of the Kubernetes API whose resources the scheduler migrates. Without it: the in-cluster
    /// config when running in a pod (KUBERNETES_SERVICE_HOST set), else this server itself.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Do not run the embedded migration scheduler.
    #[arg(long)]
    pub disable_scheduler: bool,
    /// The triggers' flags: --disable-trigger, --discovery-interval, --migration-history (see
    /// `scheduler::triggers`).
    #[command(flatten)]
    pub triggers: crate::scheduler::triggers::TriggerArgs,
    /// Objects per LIST chunk when migrating.
    #[arg(long, default_value_t = 500)]
    pub migration_chunk_size: u32,
    /// The most requests per second to the target while migrating, all migrations together (0: no ceiling). The
    /// rate itself adapts to the target: it rises while the target answers at a steady latency (and, standalone,
    /// while this server's other clients are served about as fast as without the migration) and backs off on 429
    /// (pausing for Retry-After), 5xx, timeouts and rising latency. With --migration-adaptive=false this is the
    /// rate (0: unlimited).
    #[arg(long, default_value_t = 0.0)]
    pub migration_qps: f64,
    /// The adaptive rate never goes below this many requests per second, so that a migration finishes on a
    /// saturated target.
    #[arg(long, default_value_t = 40.0)]
    pub migration_min_qps: f64,
    /// Adapt the migration rate to the target's feedback; false: a fixed rate of --migration-qps.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub migration_adaptive: bool,
    /// Burst of the migration rate limit.
    #[arg(long, default_value_t = 10)]
    pub migration_burst: u32,
    /// Resources migrated at once.
    #[arg(long, default_value_t = 1)]
    pub migration_concurrency: usize,
    /// Attempts of one request on retryable errors (429, 5xx, timeouts) in a row before the migration steps back:
    /// it stays Running, its message naming the error, and is resumed from its saved token after a backoff (1 s,
    /// doubling, at most 5 min). Retryable errors never fail a migration.
    #[arg(long, default_value_t = 8)]
    pub migration_max_attempts: u32,
    /// When a migration of a custom resource Succeeds, set its CRD's status.storedVersions to the storage version
    /// (if the CRD did not change meanwhile), so that old versions can be removed from the CRD.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub update_crd_stored_versions: bool,
    /// Elect a leader among the replicas before running the scheduler: a coordination.k8s.io Lease on the target
    /// cluster (with --kubeconfig or in a pod), else an etcd lease (with --etcd-servers). Without either, or with
    /// --leader-elect=false, this process runs the scheduler unconditionally.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long a leader's lease is valid without renewal: candidates wait this long before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// A leader that has not renewed within this time stops the scheduler (shorter than the lease duration).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire the lease and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Name of the Lease (cluster mode) or of the etcd key `<--etcd-prefix>/leader-election/<name>`.
    #[arg(long, default_value = "migration-apiserver")]
    pub leader_elect_resource_name: String,
    /// Namespace of the Lease in cluster mode (default: --service-namespace, where the deploy kit grants it).
    #[arg(long)]
    pub leader_elect_resource_namespace: Option<String>,
    /// CSI migration feature gates, key=bool pairs: CSIMigration (default true) and per plugin CSIMigrationGCE,
    /// CSIMigrationAWS, CSIMigrationAzureDisk, CSIMigrationAzureFile, CSIMigrationOpenStack, CSIMigrationvSphere,
    /// CSIMigrationPortworx (default false). Repeatable.
    #[arg(long, value_name = "GATE=BOOL,...")]
    pub feature_gates: Vec<crate::csi::gates::GateSettings>,
}

impl ServeArgs {
    pub fn scheduler_config(&self) -> crate::scheduler::SchedulerConfig {
        crate::scheduler::SchedulerConfig {
            chunk_size: self.migration_chunk_size.max(1),
            qps: self.migration_qps.max(0.0),
            burst: self.migration_burst.max(1),
            adaptive: self.migration_adaptive,
            min_qps: self.migration_min_qps.max(1.0),
            concurrency: self.migration_concurrency.max(1),
            max_attempts: self.migration_max_attempts.max(1),
            update_crd_stored_versions: self.update_crd_stored_versions,
            replicas: if self.etcd.enabled() {
                crate::scheduler::trigger_kit::Replicas::Several
            } else {
                crate::scheduler::trigger_kit::Replicas::One
            },
            ..Default::default()
        }
    }

    pub(super) fn election_config(&self, identity: &str) -> crate::scheduler::election::ElectionConfig {
        crate::scheduler::election::ElectionConfig {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            identity: identity.to_string(),
            name: self.leader_elect_resource_name.clone(),
        }
    }
}

/// A `--storage-version` value that is not `<plural>.<group>=<version>`.
#[derive(Debug, thiserror::Error)]
#[error("expected <plural>.<group>=<version>, got {0:?}")]
pub struct StorageVersionFlagError(String);

pub(super) fn parse_storage_version(s: &str) -> Result<(String, String), StorageVersionFlagError> {
    match s.split_once('=') {
        Some((r, v)) if !r.is_empty() && !v.is_empty() => Ok((r.to_string(), v.to_string())),
        _ => Err(StorageVersionFlagError(s.to_string())),
    }
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: escape codes in a file or a log collector are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Assembles and runs the server until SIGINT/SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // First, so that an invalid config fails the start before anything is bound, generated or opened.
    let encryption = args.encryption_provider_config.as_deref().map(EncryptionConfig::from_file).transpose()?;
    check_snapshot_flags(&args)?;
    // The scheduler's identity is also the apiserver identity of the encryption metrics.
    let identity = crate::scheduler::election::identity();
    if let Some(config) = encryption.as_ref().filter(|c| c.has_kms()) {
        // One Status (and Encrypt) per KMS v2 provider, bounded by its timeout; a plugin that is not up does not
        // stop the start, its resources are unavailable until it answers (kube-apiserver's behaviour).
        crate::storage::encryption::kms::metrics::set_apiserver_id_hash(
            &crate::server::encryption_reload::apiserver_id_hash(&identity),
        );
        config.start_kms().await;
    }
    let auditor = Arc::new(args.audit.build(Arc::default())?);
    let served = served_kinds(&args)?;
    crate::auth::tls::install_default_crypto_provider();
    let addr = SocketAddr::new(args.bind_address, args.secure_port);
    let listener = listen(addr).await?;
    let port = listener.local_addr()?.port();
    let host = if args.bind_address.is_unspecified() { IpAddr::from([127, 0, 0, 1]) } else { args.bind_address };
    let server_url = match host {
        IpAddr::V6(h) => format!("https://[{h}]:{port}"),
        IpAddr::V4(h) => format!("https://{h}:{port}"),
    };
    // The store next: like the port, it is one process's, and a second server on the same --data-dir stops here,
    // before it rewrites the certificate directory's admin.kubeconfig for its own port.
    let (storage, embedded, etcd, encryption, key_reports) = open_storage(&args, encryption).await?;
    let backups = embedded.map(|store| backups(&args, store)).transpose()?;
    if let Some(handle) = &encryption {
        check_keys_in_use(&args, handle).await?;
    }
    let dev = ensure_dev_certs(&DevCertOptions {
        cert_dir: args.cert_dir.clone(),
        namespaces: vec![args.service_namespace.clone(), "kube-system".into(), "default".into()],
        kubeconfig_server: server_url.clone(),
        ..DevCertOptions::default()
    })?;
    let (cert, key) = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => (dev.serving_cert_path.clone(), dev.serving_key_path.clone()),
    };
    // TLS, authentication and authorization with their reloads; kept alive until the server stops.
    let auth = crate::auth::options::build(&args.auth, &cert, &key, &dev.client_ca_path).await?;
    let state =
        app_state(&args, served.clone(), storage, etcd.as_ref(), &auth, auditor.clone(), encryption.clone()).await?;
    let state = with_backups(state, backups, args.snapshot_interval);
    // The key-rotation trigger follows the config in use too.
    let encryption_handle = encryption.clone();
    if let Some(handle) = encryption {
        encryption_config_metrics(&args, handle, &state, &identity)?;
    }
    let app = router(state.clone());
    spawn_cluster_check(&args, &served, &state).await?;
    let scheduler = match args.disable_scheduler {
        true => None,
        false => {
            let replica_writes = key_reports.as_ref().map(|r| r.gate.clone());
            Some(start_scheduler(&args, &state, &app, &identity, encryption_handle, replica_writes).await?)
        }
    };
    match args.etcd.enabled() {
        true => tracing::info!(address = %addr, etcd = %args.etcd.servers.join(","), "serving"),
        false => tracing::info!(address = %addr, data_dir = %args.data_dir.display(), "serving"),
    }
    println!("migration-apiserver is serving on {server_url}");
    println!("  kubectl --kubeconfig {} get storagestates", dev.admin_kubeconfig_path.display());
    println!("  (or: export KUBECONFIG={})", dev.admin_kubeconfig_path.display());
    serve_until_signal(listener, &auth, app, state, scheduler).await;
    // Batch mode's queued events are written before the process ends.
    auditor.shutdown(Duration::from_secs(5));
    if let Some(reports) = key_reports {
        reports.stop();
    }
    drop(auth);
    Ok(())
}

/// The store as the registry uses it, and the embedded store or etcd by their types (for backups and metrics).
/// The config of encryption at rest in use, and what reloads it.
/// With several replicas on etcd, the replicas' encryption key reports too.
type OpenedStorage = (
    Arc<dyn Storage>,
    Option<Arc<EmbeddedStorage>>,
    Option<Arc<EtcdStorage>>,
    Option<EncryptionConfigHandle>,
    Option<RunningKeyReports>,
);

/// The embedded store or etcd (kept by its type too, for its metrics), encrypted at rest when configured (with the
/// handle of its config). Values have room for the encryption envelope and metadata on top of the largest object.
async fn open_storage(args: &ServeArgs, encryption: Option<EncryptionConfig>) -> anyhow::Result<OpenedStorage> {
    let max_value_bytes = args.max_object_bytes.max(1) + 64 * 1024;
    let history = HistoryLimit { events: args.watch_history, bytes: args.watch_history_bytes };
    let (mut etcd, mut embedded) = (None, None);
    let storage: Arc<dyn Storage> = if args.etcd.enabled() {
        let client = args.etcd.connect().await?;
        let opts = EtcdOptions { history, max_value_bytes, compaction_interval: args.etcd.compaction_interval };
        let store = EtcdStorage::open(client, &args.etcd.prefix, opts).await?;
        etcd = Some(store.clone());
        store
    } else {
        let opts = EmbeddedOptions {
            history,
            max_value_bytes,
            cache_bytes: args.storage_cache_size,
            list_snapshot_idle: args.list_snapshot_timeout,
        };
        let store = EmbeddedStorage::open(&args.data_dir, opts)?;
        embedded = Some(store.clone());
        store
    };
    let Some(config) = encryption else { return Ok((storage, embedded, etcd, None, None)) };
    tracing::info!(resources = ?config.describe(), hash = %config.hash(), "encryption at rest enabled");
    let handle = EncryptionConfigHandle::new(config, storage.clone());
    let mut encrypted = EncryptedStorage::with_handle(storage, handle.clone());
    let mut key_reports = None;
    if args.etcd.enabled() {
        let running = RunningKeyReports::start(args, &handle).await?;
        encrypted = encrypted.with_gate(running.gate.clone());
        key_reports = Some(running);
    }
    Ok((Arc::new(encrypted), embedded, etcd, Some(handle), key_reports))
}

/// With encryption on etcd: this replica's encryption key report and the others' (see
/// `storage::encryption::replicas`), refreshed until the server stops.
struct RunningKeyReports {
    gate: Arc<crate::storage::encryption::replicas::WriteGate>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningKeyReports {
    /// The heartbeat is the HA StorageState protocol's, every --discovery-interval.
    async fn start(
        args: &ServeArgs,
        handle: &crate::storage::encryption::EncryptionConfigHandle,
    ) -> anyhow::Result<RunningKeyReports> {
        use crate::storage::encryption::key_reports::KeyReporter;
        let client = args.etcd.connect().await?;
        let replica = crate::scheduler::election::identity();
        let interval = args.triggers.storage_version.discovery_interval;
        let reporter = KeyReporter::start(client, &args.etcd.prefix, &replica, handle, interval).await?;
        Ok(RunningKeyReports { gate: reporter.gate(), task: reporter.spawn() })
    }

    /// Stops the heartbeat. The report is not withdrawn: it keeps counting until it expires, so that a replica
    /// restarted with its old config (a rolling restart) is never missed by the others in between.
    fn stop(self) {
        self.task.abort();
    }
}

/// Refuses to start when stored values use a key the config no longer holds, unless
/// --allow-unreadable-encrypted-values. Counts every stored value before serving (see `count_values` for the cost).
async fn check_keys_in_use(args: &ServeArgs, handle: &EncryptionConfigHandle) -> anyhow::Result<()> {
    match handle.check_start().await {
        Ok(()) => Ok(()),
        Err(e @ ReloadError::KeysInUse(_)) if args.allow_unreadable_encrypted_values => {
            tracing::warn!(error = %e, "starting anyway (--allow-unreadable-encrypted-values): these values cannot be read");
            Ok(())
        }
        Err(e @ ReloadError::KeysInUse(_)) => Err(anyhow::anyhow!(
            "{e}. To start anyway, leaving those values unreadable, pass --allow-unreadable-encrypted-values"
        )),
        Err(e) => Err(e.into()),
    }
}

/// kube-apiserver's metrics of the encryption config, and, with --encryption-provider-config-automatic-reload, the
/// watcher that reloads it.
fn encryption_config_metrics(
    args: &ServeArgs,
    handle: EncryptionConfigHandle,
    state: &AppState,
    identity: &str,
) -> anyhow::Result<()> {
    use crate::server::encryption_reload::{self, EncryptionConfigMetrics};
    let metrics = match state.metrics.registry.lock() {
        Ok(mut reg) => EncryptionConfigMetrics::register(&mut reg, identity),
        Err(_) => anyhow::bail!("metrics registry poisoned"),
    };
    metrics.config_in_use(handle.current().hash());
    match (&args.encryption_provider_config, args.encryption_provider_config_automatic_reload) {
        (Some(path), true) => {
            tracing::info!(path = %path.display(), identity = %identity, apiserver_id_hash = %encryption_reload::apiserver_id_hash(identity),
                interval = ?encryption_reload::POLL_INTERVAL, "encryption provider config: automatic reload");
            encryption_reload::spawn(path.clone(), handle, metrics);
        }
        _ => tracing::info!(identity = %identity, "encryption provider config: read at start only"),
    }
    Ok(())
}

/// Our kinds as served: in their storage versions (--storage-version), without the groups --runtime-config turns
/// off.
fn served_kinds(args: &ServeArgs) -> anyhow::Result<Vec<Arc<dyn crate::registry::strategy::Strategy>>> {
    let overrides: HashMap<String, String> = args.storage_version.iter().cloned().collect();
    let entries: Vec<_> = args.runtime_config.concat();
    Ok(runtime_config::served_kinds(kinds(&overrides)?, &entries, !args.disable_scheduler)?)
}

/// The registry of the served kinds over `storage`, the metrics, and what the HTTP layer needs.
async fn app_state(
    args: &ServeArgs,
    kinds: Vec<Arc<dyn crate::registry::strategy::Strategy>>,
    storage: Arc<dyn Storage>,
    etcd: Option<&Arc<EtcdStorage>>,
    auth: &crate::auth::options::AuthStack,
    auditor: Arc<crate::audit::Auditor>,
    encryption: Option<EncryptionConfigHandle>,
) -> anyhow::Result<Arc<AppState>> {
    let registry = Arc::new(Registry::new(
        storage,
        kinds,
        RegistryConfig { gc_finalizers: false, max_object_bytes: args.max_object_bytes },
    ));
    let metrics = Arc::new(Metrics::new());
    {
        let mut reg = metrics.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(etcd) = etcd {
            etcd.register_metrics(&mut reg);
        }
        reg.register_collector(Box::new(crate::server::cert_metrics::ServingCertExpiry(auth.serving.clone())));
        if encryption.is_some() {
            crate::storage::encryption::kms::metrics::register(&mut reg);
        }
    }
    let limits = InflightLimits::new(args.max_requests_inflight, args.max_mutating_requests_inflight);
    let state = Arc::new(
        AppState::new(registry, auth.authenticator.clone(), metrics, args.watch_bookmark_interval)
            .with_authorizer(auth.authorizer.clone())
            .with_auditor(auditor)
            .with_csi_migration(csi_migration(args).await?)
            .with_event_ttl(args.event_ttl)
            .with_encryption(encryption)
            .with_inflight(limits),
    );
    tokio::spawn(crate::server::inflight::publish_peaks(Arc::downgrade(&state)));
    Ok(state)
}

/// Serves until SIGINT/SIGTERM, then drains the connections while the scheduler stops.
async fn serve_until_signal(
    listener: tokio::net::TcpListener,
    auth: &crate::auth::options::AuthStack,
    app: axum::Router,
    state: Arc<AppState>,
    scheduler: Option<RunningScheduler>,
) {
    let (stopping, mut stopped) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown_signal().await;
        state.ready.store(false, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("shutting down");
        // As kube-apiserver: a second signal does not wait for anything.
        tokio::spawn(async {
            shutdown_signal().await;
            tracing::warn!("second signal: exiting at once");
            std::process::exit(1);
        });
        let _ = stopping.send(true);
    };
    // The scheduler stops while the server drains its connections, not before: its own bound (5 s) would
    // otherwise come on top of the connections'.
    let stop_scheduler = async move {
        if stopped.wait_for(|s| *s).await.is_ok() {
            if let Some(s) = scheduler {
                s.stop().await;
            }
        }
    };
    tokio::join!(crate::server::serve::serve(listener, auth.tls.clone(), app, shutdown), stop_scheduler);
}

/// Binds the HTTPS port; the error names the address, as kube-apiserver's does ("failed to listen on ...").
async fn listen(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow::anyhow!(
            "failed to listen on {addr}: address already in use (another process listens on this port; choose another --secure-port or stop it)"
        ),
        _ => anyhow::anyhow!("failed to listen on {addr}: {e}"),
    })
}

/// The CSI migration webhooks' gates and, with a cluster (--kubeconfig or in a pod), its CSIDrivers.
pub(super) async fn csi_migration(args: &ServeArgs) -> anyhow::Result<crate::server::csi_admission::CsiMigration> {
    use crate::server::csi_admission::{ClusterCsiDrivers, CsiDriverLookup, CsiMigration};
    let gates = crate::csi::gates::FeatureGates::from_settings(&args.feature_gates);
    let client = cluster_client(args).await?;
    let migrated = gates.migrated_plugins();
    tracing::info!(gates = %gates.describe(), migrated = ?migrated, "CSI migration");
    if client.is_none() && !migrated.is_empty() {
        tracing::warn!(
            "no cluster client: /validate-csi-migration admits PersistentVolumes without checking CSIDrivers"
        );
    }
    let drivers = client.map(|c| Arc::new(ClusterCsiDrivers::new(c)) as Arc<dyn CsiDriverLookup>);
    Ok(CsiMigration::new(gates, drivers))
}

pub(super) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

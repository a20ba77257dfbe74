//! Snapshots of a serving embedded store: on demand (`POST /storage/snapshots`) and every `--snapshot-interval`,
//! one at a time, each followed by retention, logged and counted in the metrics.

use super::{list, prune, remove_temporary, write_snapshot, SnapshotInfo};
use crate::storage::embedded::EmbeddedStorage;
use crate::storage::{Result, StorageError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The metrics of snapshots; the alerts `EmbeddedStoreSnapshotsFailing` and `EmbeddedStoreSnapshotStale` read them.
#[derive(Clone, Default)]
pub struct BackupMetrics {
    pub last_success: Gauge<f64, AtomicU64>,
    pub last_size: Gauge<i64>,
    pub last_duration: Gauge<f64, AtomicU64>,
    pub failures: Counter,
    pub interval: Gauge<f64, AtomicU64>,
}

impl BackupMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "migration_apiserver_storage_snapshot_last_success_timestamp_seconds",
            "Unix time of the newest snapshot of the embedded store written (or found in the snapshot directory at start); 0 when there is none.",
            self.last_success.clone(),
        );
        registry.register(
            "migration_apiserver_storage_snapshot_last_size_bytes",
            "Bytes of the newest snapshot of the embedded store written.",
            self.last_size.clone(),
        );
        registry.register(
            "migration_apiserver_storage_snapshot_last_duration_seconds",
            "How long the newest snapshot of the embedded store took to write.",
            self.last_duration.clone(),
        );
        registry.register(
            "migration_apiserver_storage_snapshot_failures_total",
            "Snapshots of the embedded store that failed (scheduled or on demand).",
            self.failures.clone(),
        );
        registry.register(
            "migration_apiserver_storage_snapshot_interval_seconds",
            "--snapshot-interval in seconds (0: no scheduled snapshots).",
            self.interval.clone(),
        );
    }
}

/// What takes the snapshots of one serving store.
pub struct Backups {
    store: Arc<EmbeddedStorage>,
    dir: PathBuf,
    retention: usize,
    /// One snapshot at a time: a request that comes while one is written waits for it, then takes its own.
    running: tokio::sync::Mutex<()>,
    pub metrics: BackupMetrics,
}

impl Backups {
    /// Snapshots of `store` into `dir`, keeping the newest `retention` (0: all). Removes what interrupted snapshots
    /// left in `dir` (none can be in progress: the store's lock is this process's), and sets the metrics from the
    /// newest snapshot there, so that a restart does not look like a missing backup.
    pub fn new(store: Arc<EmbeddedStorage>, dir: PathBuf, retention: usize, interval: Duration) -> Result<Self> {
        remove_temporary(&dir)?;
        let metrics = BackupMetrics::default();
        metrics.interval.set(interval.as_secs_f64());
        if let Some(newest) = list(&dir)?.into_iter().rev().find_map(|l| l.header.ok().map(|h| (h, l.size))) {
            metrics.last_success.set(newest.0.created_unix_ms as f64 / 1000.0);
            metrics.last_size.set(i64::try_from(newest.1).unwrap_or(i64::MAX));
        }
        Ok(Self { store, dir, retention, running: tokio::sync::Mutex::new(()), metrics })
    }

    /// Takes a snapshot now (`trigger` says why, for the log), then applies retention.
    pub async fn take(self: &Arc<Self>, trigger: &'static str) -> Result<SnapshotInfo> {
        let _one = self.running.lock().await;
        let start = Instant::now();
        let this = self.clone();
        // On a thread of its own in the idle CPU and I/O classes (`gentle`): requests served meanwhile come first.
        let written = tokio::task::spawn_blocking(move || {
            super::at_low_priority("storage-snapshot", move || {
                // The read transaction is the snapshot's revision; writers go on meanwhile.
                let txn = this.store.begin_read()?;
                write_snapshot(&txn, &this.dir, chrono::Utc::now())
            })
        })
        .await
        .map_err(|e| StorageError::Internal(format!("snapshot task failed: {e}")))
        .and_then(|r| r.map_err(|e| StorageError::Internal(format!("snapshot thread: {e}"))))
        .and_then(|r| r);
        let elapsed = start.elapsed();
        let info = match written {
            Ok(info) => info,
            Err(e) => {
                self.metrics.failures.inc();
                tracing::error!(trigger, dir = %self.dir.display(), error = %e, "storage snapshot failed");
                return Err(e);
            }
        };
        self.metrics.last_success.set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
        self.metrics.last_size.set(i64::try_from(info.size).unwrap_or(i64::MAX));
        self.metrics.last_duration.set(elapsed.as_secs_f64());
        tracing::info!(trigger, name = %info.name, revision = info.revision, objects = info.objects, size = info.size,
            checksum = %info.checksum, duration = ?elapsed, "storage snapshot written");
        match prune(&self.dir, self.retention) {
            Ok(removed) if !removed.is_empty() => tracing::info!(?removed, "old storage snapshots removed"),
            Ok(_) => {}
            // The snapshot itself is good: a failed cleanup is logged, not counted as a failed snapshot.
            Err(e) => tracing::warn!(error = %e, "removing old storage snapshots failed"),
        }
        Ok(info)
    }

    /// Takes a snapshot every `interval` until the process ends (the first one `interval` after the start).
    pub fn spawn_schedule(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            // A snapshot slower than the interval is followed by the next one, not by a burst of missed ones.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                // Failures are logged and counted in `take`; the schedule goes on.
                let _ = this.take("scheduled").await;
            }
        })
    }
}

//! `serve`'s snapshots of the embedded store: the flags' check, the snapshot service and its schedule
//! (`storage::backup`).

use super::ServeArgs;
use crate::server::AppState;
use crate::storage::backup::Backups;
use crate::storage::embedded::EmbeddedStorage;
use std::sync::Arc;
use std::time::Duration;

/// The snapshot flags apply to the embedded store only: on etcd they would silently do nothing.
pub(super) fn check_snapshot_flags(args: &ServeArgs) -> anyhow::Result<()> {
    let set: Vec<&str> = [
        (!args.snapshot_interval.is_zero(), "--snapshot-interval"),
        (args.snapshot_dir.is_some(), "--snapshot-dir"),
        (args.snapshot_retention.is_some(), "--snapshot-retention"),
    ]
    .into_iter()
    .filter_map(|(on, flag)| on.then_some(flag))
    .collect();
    if args.etcd.enabled() && !set.is_empty() {
        anyhow::bail!(
            "{} applies to the embedded store only, not with --etcd-servers: back etcd up with etcd's own snapshots (etcdctl snapshot save)",
            set.join(", ")
        );
    }
    Ok(())
}

/// The snapshots of the embedded store (`storage::backup`).
pub(super) fn backups(args: &ServeArgs, store: Arc<EmbeddedStorage>) -> anyhow::Result<Arc<Backups>> {
    let dir = args.snapshot_dir.clone().unwrap_or_else(|| crate::storage::backup::default_dir(&args.data_dir));
    let retention = args.snapshot_retention.unwrap_or(5);
    Ok(Arc::new(Backups::new(store, dir, retention, args.snapshot_interval)?))
}

/// Serves `POST /storage/snapshots` and exports the snapshot metrics with `backups`; takes one every `interval`
/// (unless 0).
pub(super) fn with_backups(state: Arc<AppState>, backups: Option<Arc<Backups>>, interval: Duration) -> Arc<AppState> {
    let Some(backups) = backups else { return state };
    backups.metrics.register(&mut state.metrics.registry.lock().unwrap_or_else(|p| p.into_inner()));
    if !interval.is_zero() {
        tracing::info!(interval = ?interval, "scheduled storage snapshots");
        backups.spawn_schedule(interval);
    }
    state.backups.set(backups).ok();
    state
}

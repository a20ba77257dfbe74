//! This project's metrics of the StorageStates, which the alerts read (kube-storage-version-migrator has none):
//! whether a StorageState's persisted hashes are behind its current one, and the time of its last heartbeat. Every
//! replica watches the StorageStates (they live in the shared storage), so every replica exports the same values,
//! leader or not; alerts aggregate over replicas with `max by (storagestate)`.

use crate::api::storage_state::StorageState;
use futures::StreamExt;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The StorageState's name: `<resource>.<group>` (`<resource>` for the core group).
    pub storagestate: String,
}

pub struct StorageStateMetrics {
    /// 1 while persisted is not exactly [current] (a migration is due, running, or failed), 0 once it is.
    pub behind: Family<StateLabels, Gauge>,
    /// `status.lastHeartbeatTime` as Unix time; no series before the first heartbeat.
    pub heartbeat: Family<StateLabels, Gauge<f64, AtomicU64>>,
}

impl StorageStateMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = StorageStateMetrics { behind: Family::default(), heartbeat: Family::default() };
        registry.register(
            "migration_apiserver_storage_state_behind",
            "1 while the StorageState's persisted storage version hashes are not exactly its current one, else 0, labeled with the StorageState's name.",
            m.behind.clone(),
        );
        registry.register(
            "migration_apiserver_storage_state_heartbeat_timestamp_seconds",
            "Unix time of the StorageState's last heartbeat (status.lastHeartbeatTime), labeled with the StorageState's name.",
            m.heartbeat.clone(),
        );
        Arc::new(m)
    }

    /// Sets the series of one StorageState from its status.
    pub fn observe(&self, state: &StorageState) {
        let Some(labels) = labels(state) else { return };
        let status = state.status.clone().unwrap_or_default();
        let current = status.current_storage_version_hash.as_deref();
        let caught_up = current.is_some_and(|c| status.persisted_storage_version_hashes == [c]);
        self.behind.get_or_create(&labels).set(i64::from(!caught_up));
        match status.last_heartbeat_time {
            Some(t) => {
                self.heartbeat.get_or_create(&labels).set(t.0.as_millisecond() as f64 / 1000.0);
            }
            None => {
                self.heartbeat.remove(&labels);
            }
        }
    }

    /// Drops the series of a StorageState that is gone.
    pub fn forget(&self, name: &str) {
        let labels = StateLabels { storagestate: name.to_string() };
        self.behind.remove(&labels);
        self.heartbeat.remove(&labels);
    }
}

fn labels(state: &StorageState) -> Option<StateLabels> {
    Some(StateLabels { storagestate: state.metadata.name.clone()? })
}

/// Watches the StorageStates and keeps the metrics in step, for as long as the process runs. After every (re)list,
/// the series of StorageStates no longer listed are dropped.
pub fn spawn(states: kube::Api<StorageState>, metrics: Arc<StorageStateMetrics>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = watcher(states, watcher::Config::default()).default_backoff().boxed();
        let mut exported: BTreeSet<String> = BTreeSet::new();
        let mut listed: BTreeSet<String> = BTreeSet::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => listed.clear(),
                Ok(Event::InitApply(state)) => {
                    metrics.observe(&state);
                    listed.extend(state.metadata.name.clone());
                }
                Ok(Event::InitDone) => {
                    for gone in exported.difference(&listed) {
                        metrics.forget(gone);
                    }
                    exported = std::mem::take(&mut listed);
                }
                Ok(Event::Apply(state)) => {
                    metrics.observe(&state);
                    exported.extend(state.metadata.name.clone());
                }
                Ok(Event::Delete(state)) => {
                    if let Some(name) = &state.metadata.name {
                        metrics.forget(name);
                        exported.remove(name);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "storagestate metrics: watch"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::storage_state::StorageStateStatus;

    fn state(persisted: &[&str], current: Option<&str>) -> StorageState {
        let mut s: StorageState = serde_json::from_value(serde_json::json!({
            "apiVersion": "migration.k8s.io/v1alpha1",
            "kind": "StorageState",
            "metadata": {"name": "shootstates.core.gardener.cloud"},
            "spec": {"resource": {"group": "core.gardener.cloud", "resource": "shootstates"}},
        }))
        .expect("storagestate");
        s.status = Some(StorageStateStatus {
            persisted_storage_version_hashes: persisted.iter().map(|h| h.to_string()).collect(),
            current_storage_version_hash: current.map(str::to_string),
            last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-02T03:04:05Z".parse().expect("time"),
            )),
            current_storage_version_hashes: Vec::new(),
            ..Default::default()
        });
        s
    }

    #[test]
    fn behind_until_persisted_is_exactly_current() {
        let mut registry = Registry::default();
        let m = StorageStateMetrics::register(&mut registry);
        let labels = StateLabels { storagestate: "shootstates.core.gardener.cloud".into() };
        let behind = |s: &StorageState| {
            m.observe(s);
            m.behind.get_or_create(&labels).get()
        };
        assert_eq!(behind(&state(&["Unknown"], None)), 1);
        assert_eq!(behind(&state(&["Unknown"], Some("abc"))), 1);
        assert_eq!(behind(&state(&["old", "abc"], Some("abc"))), 1);
        assert_eq!(behind(&state(&["abc"], Some("abc"))), 0);
        assert_eq!(m.heartbeat.get_or_create(&labels).get(), 1767323045.0);
        m.forget("shootstates.core.gardener.cloud");
        let text = crate::server::exposition::encode(&registry).expect("encode");
        assert!(!text.contains("shootstates"), "{text}");
    }
}

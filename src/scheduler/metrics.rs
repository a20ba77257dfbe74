//! The migrator's Prometheus metrics. The three of kube-storage-version-migrator's `pkg/migrator/metrics`
//! (kubernetes-sigs/kube-storage-version-migrator at 5c8923c5ff96ceb4435f66b986b5aec2dd0cbc22, the latest commit;
//! its metrics last changed in c4a712e, 2019) with its names, types, labels and HELP texts (one ends with a period,
//! two do not, as upstream's), and this project's own under `migration_apiserver_`: the migration queue and the time
//! of a running migration's last progress, which the alerts read. `resource` is Go's
//! `schema.GroupVersionResource.String()`, e.g. `core.gardener.cloud/v1beta1, Resource=shootstates`
//! (`/v1, Resource=pods` for the core group), and `status` is `Succeeded` or `Failed`. Counters are exposed in the
//! text format 0.0.4 under their registered names, as client_golang writes upstream's ([`crate::server::exposition`]).

use crate::api::storage_version_migration::GroupVersionResource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigrationLabels {
    pub resource: String,
    pub status: String,
}

pub struct SchedulerMetrics {
    /// Objects handled (rewritten, or skipped because they were deleted or rewritten meanwhile).
    pub migrated_objects: Family<ResourceLabels, Counter>,
    /// Objects still to migrate, from the last LIST's `remainingItemCount` (0 once a migration ends).
    pub remaining_objects: Family<ResourceLabels, Gauge>,
    /// Finished migrations by status (`Succeeded`, `Failed`).
    pub migrations: Family<MigrationLabels, Counter>,
    /// Migrations neither finished nor running, and migrations running now.
    pub pending_migrations: Family<ResourceLabels, Gauge>,
    pub running_migrations: Family<ResourceLabels, Gauge>,
    /// Unix time of the last progress of the resource's running migration: its start, a chunk listed, an object
    /// handled. Retries of a failing target are no progress.
    pub progress: Family<ResourceLabels, Gauge<f64, AtomicU64>>,
    /// The migrator's rate limit now (requests/s to the target), and its cuts by reason ([`crate::scheduler::adaptive`]).
    pub rate: Gauge<f64, AtomicU64>,
    pub rate_cuts: Family<ReasonLabels, Counter>,
    /// Resources the queue gauges have been set for (to zero them when their migrations are gone).
    known: Mutex<BTreeSet<String>>,
}

/// The `resource` label value: Go's `GroupVersionResource.String()`.
pub fn resource_label(gvr: &GroupVersionResource) -> String {
    format!("{}/{}, Resource={}", gvr.group, gvr.version, gvr.resource)
}

impl SchedulerMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = SchedulerMetrics {
            migrated_objects: Family::default(),
            remaining_objects: Family::default(),
            migrations: Family::default(),
            pending_migrations: Family::default(),
            running_migrations: Family::default(),
            progress: Family::default(),
            rate: Gauge::default(),
            rate_cuts: Family::default(),
            known: Mutex::new(BTreeSet::new()),
        };
        // Upstream's names and HELP texts, verbatim (the exposition drops the period prometheus-client appends).
        registry.register(
            "storage_migrator_core_migrator_migrated_objects",
            "The number of objects that have been migrated, labeled with the full resource name.",
            m.migrated_objects.clone(),
        );
        registry.register(
            "storage_migrator_core_migrator_remaining_objects",
            "The number of objects that still require migration, labeled with the full resource name",
            m.remaining_objects.clone(),
        );
        registry.register(
            "storage_migrator_core_migrator_migrations",
            "The number of completed migration, labeled with the full resource name, and the status of the migration (failed or succeeded)",
            m.migrations.clone(),
        );
        // This project's own.
        registry.register(
            "migration_apiserver_pending_migrations",
            "The number of migrations waiting to run, labeled with the full resource name.",
            m.pending_migrations.clone(),
        );
        registry.register(
            "migration_apiserver_running_migrations",
            "The number of migrations running now, labeled with the full resource name.",
            m.running_migrations.clone(),
        );
        registry.register(
            "migration_apiserver_migration_progress_timestamp_seconds",
            "Unix time of the last progress (start, chunk listed, object migrated) of the running migration, labeled with the full resource name.",
            m.progress.clone(),
        );
        registry.register(
            "migration_apiserver_migration_rate_limit",
            "The requests per second the migrator allows itself to send to its target, all migrations together: the adaptive rate, or --migration-qps when fixed (0: unlimited).",
            m.rate.clone(),
        );
        registry.register(
            "migration_apiserver_migration_rate_cuts_total",
            "The number of times the migrator's adaptive rate went down, labeled with the reason: throttled (429 or Retry-After), errors (5xx, timeouts), latency (its own requests), clients_latency, clients_throughput (the server's other clients, standalone), cpu_wait (the server's threads waited for a CPU, standalone).",
            m.rate_cuts.clone(),
        );
        Arc::new(m)
    }

    pub fn observe_migrated(&self, resource: &str, n: u64) {
        self.migrated_objects.get_or_create(&ResourceLabels { resource: resource.to_string() }).inc_by(n);
        self.observe_progress(resource);
    }

    /// Set from every chunk listed, and to 0 when a migration ends.
    pub fn observe_remaining(&self, resource: &str, n: i64) {
        self.remaining_objects.get_or_create(&ResourceLabels { resource: resource.to_string() }).set(n);
        self.observe_progress(resource);
    }

    /// The resource's migration started or moved on now.
    pub fn observe_progress(&self, resource: &str) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.progress.get_or_create(&ResourceLabels { resource: resource.to_string() }).set(now.as_secs_f64());
    }

    pub fn observe_rate(&self, rate: f64) {
        self.rate.set(rate);
    }

    /// Gives each reason its series at 0 before its first cut, so that rate() over it works from that cut on.
    pub fn declare_rate_cuts<'a>(&self, reasons: impl IntoIterator<Item = &'a str>) {
        for reason in reasons {
            let _ = self.rate_cuts.get_or_create(&ReasonLabels { reason: reason.to_string() });
        }
    }

    pub fn observe_rate_cut(&self, reason: &str) {
        self.rate_cuts.get_or_create(&ReasonLabels { reason: reason.to_string() }).inc();
    }

    pub fn observe_finished(&self, resource: &str, status: &str) {
        self.migrations
            .get_or_create(&MigrationLabels { resource: resource.to_string(), status: status.to_string() })
            .inc();
    }

    /// Sets the pending and running gauges from a full count; resources seen before and absent now go to 0.
    pub fn set_queue(&self, pending: &BTreeMap<String, i64>, running: &BTreeMap<String, i64>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.extend(pending.keys().chain(running.keys()).cloned());
        for resource in known.iter() {
            let labels = ResourceLabels { resource: resource.clone() };
            self.pending_migrations.get_or_create(&labels).set(pending.get(resource).copied().unwrap_or(0));
            self.running_migrations.get_or_create(&labels).set(running.get(resource).copied().unwrap_or(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_and_label_values() {
        let mut reg = Registry::default();
        let m = SchedulerMetrics::register(&mut reg);
        let gvr = GroupVersionResource {
            group: "core.gardener.cloud".into(),
            version: "v1beta1".into(),
            resource: "shootstates".into(),
        };
        let r = resource_label(&gvr);
        assert_eq!(r, "core.gardener.cloud/v1beta1, Resource=shootstates");
        let core = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "pods".into() };
        assert_eq!(resource_label(&core), "/v1, Resource=pods");
        m.observe_migrated(&r, 3);
        m.observe_remaining(&r, 7);
        m.observe_finished(&r, "Succeeded");
        let out = crate::server::exposition::encode(&reg).expect("encode");
        for line in [
            "# HELP storage_migrator_core_migrator_migrated_objects The number of objects that have been migrated, labeled with the full resource name.",
            "# TYPE storage_migrator_core_migrator_migrated_objects counter",
            "storage_migrator_core_migrator_migrated_objects{resource=\"core.gardener.cloud/v1beta1, Resource=shootstates\"} 3",
            "# HELP storage_migrator_core_migrator_remaining_objects The number of objects that still require migration, labeled with the full resource name",
            "storage_migrator_core_migrator_remaining_objects{resource=\"core.gardener.cloud/v1beta1, Resource=shootstates\"} 7",
            "# TYPE storage_migrator_core_migrator_migrations counter",
            "storage_migrator_core_migrator_migrations{resource=\"core.gardener.cloud/v1beta1, Resource=shootstates\",status=\"Succeeded\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
        // Upstream's counters have no `_total` (client_golang writes what was registered); ours register it.
        assert!(!out.contains("storage_migrator_core_migrator_migrated_objects_total"), "{out}");
        assert!(!out.contains("storage_migrator_core_migrator_migrations_total"), "{out}");
        assert!(out.contains("migration_apiserver_migration_progress_timestamp_seconds{resource=\"core.gardener.cloud/v1beta1, Resource=shootstates\"} 1."), "{out}");
    }
}

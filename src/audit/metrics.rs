//! kube-apiserver's audit metrics (k8s.io/apiserver `pkg/audit/metrics.go`), with its names, labels and HELP.
//! Registered whether or not auditing is on, as upstream registers them at start.

use super::policy::Level;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabels {
    pub level: &'static str,
}

#[derive(Default)]
pub struct AuditMetrics {
    events: Counter,
    errors: Family<PluginLabels, Counter>,
    levels: Family<LevelLabels, Counter>,
    rejected: Counter,
    /// Each level's counter once used, so that counting a request takes no lock of the family.
    level_handles: [OnceLock<Counter>; 4],
}

impl AuditMetrics {
    /// Serves these metrics from `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "apiserver_audit_event_total",
            "[ALPHA] Counter of audit events generated and sent to the audit backend.",
            m.events.clone(),
        );
        registry.register(
            "apiserver_audit_error_total",
            "[ALPHA] Counter of audit events that failed to be audited properly. Plugin identifies the plugin affected by the error.",
            m.errors.clone(),
        );
        registry.register(
            "apiserver_audit_level_total",
            "[ALPHA] Counter of policy levels for audit events (1 per request).",
            m.levels.clone(),
        );
        registry.register(
            "apiserver_audit_requests_rejected_total",
            "[ALPHA] Counter of apiserver requests rejected due to an error in audit logging backend.",
            m.rejected.clone(),
        );
    }

    /// An event handed to the backend (not one of an omitted stage).
    pub fn event(&self) {
        self.events.inc();
    }

    /// The policy's level for a request, once per request (None included).
    pub fn level(&self, level: Level) {
        let handle = &self.level_handles[level as usize];
        handle.get_or_init(|| self.levels.get_or_create(&LevelLabels { level: level.as_str() }).clone()).inc();
    }

    /// `HandlePluginError`: `events` lost or damaged by `plugin` (log, buffered, truncate, webhook).
    pub fn plugin_error(&self, plugin: &'static str, events: usize, error: &dyn std::fmt::Display) {
        self.errors.get_or_create(&PluginLabels { plugin }).inc_by(events as u64);
        tracing::error!(plugin, events, error = %error, "Error in audit plugin");
    }

    /// A request answered 500 because its RequestReceived event could not be stored (blocking-strict).
    pub fn rejected(&self) {
        self.rejected.inc();
    }
}

//! Auditing as kube-apiserver audits (k8s.io/apiserver `pkg/audit`, `plugin/pkg/audit`): a policy says how much of
//! each request to record ([`policy`]), events are built per stage of the request ([`event`]; the HTTP filter that
//! builds them is `server::audit`) and go to a backend in its mode ([`backend`]), counted by upstream's metrics
//! ([`metrics`]). The flags are [`options`].
//!
//! No policy file, or no backend: nothing is audited (the `Audit-Id` header is still answered).

pub mod backend;
#[cfg(test)]
pub(crate) mod checker_cases;
pub mod event;
pub mod metrics;
pub mod options;
pub mod policy;

use crate::auth::authn::UserInfo;
use std::sync::Arc;

/// The hook of impersonation: the filter that serves `Impersonate-*` headers inserts the impersonated user into the
/// request's extensions as this, before authorization runs. The audit filter copies it into the event's
/// `impersonatedUser` at the authorization decision, so every stage after RequestReceived carries it (as upstream,
/// where WithAudit runs before WithImpersonation); `user` stays the authenticated requester.
#[derive(Clone, Debug)]
pub struct ImpersonatedUser(pub UserInfo);

/// The policy, the backends each in its mode, and the metrics: one per server, shared by every request (no request
/// waits for another's lock: the log's lines are concurrent appends, and only a rotation takes the file alone).
pub struct Auditor {
    policy: Option<policy::PolicyRuleEvaluator>,
    /// The log's, then the webhook's: each gets every event (upstream's union).
    sinks: Vec<backend::Sink>,
    pub metrics: Arc<metrics::AuditMetrics>,
}

impl Auditor {
    /// Auditing off (no policy file); the metrics are still served, as upstream registers them regardless.
    pub fn disabled(metrics: Arc<metrics::AuditMetrics>) -> Auditor {
        Auditor { policy: None, sinks: Vec::new(), metrics }
    }

    pub fn new(
        policy: Option<policy::PolicyRuleEvaluator>,
        sinks: Vec<backend::Sink>,
        metrics: Arc<metrics::AuditMetrics>,
    ) -> Auditor {
        Auditor { policy, sinks, metrics }
    }

    pub fn enabled(&self) -> bool {
        self.policy.is_some() && !self.sinks.is_empty()
    }

    /// The policy's decision for one request, counted in `apiserver_audit_level_total`.
    pub fn evaluate(&self, attrs: &policy::Attributes<'_>) -> policy::RequestAuditConfig {
        let config = match &self.policy {
            Some(p) => p.evaluate(attrs),
            None => policy::RequestAuditConfig {
                level: policy::Level::None,
                omit_stages: policy::Stages::default(),
                omit_managed_fields: false,
            },
        };
        self.metrics.level(config.level);
        config
    }

    /// Hands an event to every backend; false when one in blocking-strict mode could not store it. Borrowed: the
    /// blocking modes encode it where it is, and only a backend that keeps it (batch mode's queue) copies it.
    pub fn process(&self, event: &event::Event) -> bool {
        if self.sinks.is_empty() {
            return true;
        }
        self.metrics.event();
        self.sinks.iter().fold(true, |stored, sink| sink.process(event, &self.metrics) & stored)
    }

    /// At shutdown: what batch mode has queued is written or sent (each backend within `timeout`).
    pub fn shutdown(&self, timeout: std::time::Duration) {
        for sink in &self.sinks {
            sink.shutdown(timeout);
        }
    }
}

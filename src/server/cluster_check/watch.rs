//! The server's side of cluster safety, in cluster mode: at start and every [`RECHECK_INTERVAL`], a warning and a
//! gauge for each APIService of ours that hides a group the cluster serves itself, and for each group this server
//! serves whose APIService sends it elsewhere (another server, or CRDs that are not ours).

use super::{Backend, Claimed, ClusterCheckError, ClusterFacts, ExistingApiService};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HidingLabels {
    apiservice: String,
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ElsewhereLabels {
    apiservice: String,
    group: String,
    served_by: String,
}

/// The two gauges, as of the last check:
/// - `migration_apiserver_apiservice_hiding_builtin_group{apiservice, group}`: 1 per APIService of ours that
///   hides a group the cluster serves itself;
/// - `migration_apiserver_apiservice_served_elsewhere{apiservice, group, served_by}`: 1 per APIService of a group
///   this server serves that routes the group to another server or to CRDs that are not ours.
#[derive(Clone, Default)]
pub struct ClusterCheckMetrics {
    hiding: Family<HidingLabels, Gauge>,
    elsewhere: Family<ElsewhereLabels, Gauge>,
}

impl ClusterCheckMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> ClusterCheckMetrics {
        let metrics = ClusterCheckMetrics::default();
        registry.register(
            "migration_apiserver_apiservice_hiding_builtin_group",
            "1 for each APIService of this server that hides an API group the cluster serves itself (after an upgrade): delete it with kubectl delete apiservice <name>.",
            metrics.hiding.clone(),
        );
        registry.register(
            "migration_apiserver_apiservice_served_elsewhere",
            "1 for each APIService of an API group this server serves that sends the group to another server or to CustomResourceDefinitions that are not this server's: clients do not reach this server's copy of the group.",
            metrics.elsewhere.clone(),
        );
        metrics
    }

    fn set(&self, hidden: &[(ExistingApiService, Claimed)], elsewhere: &[(ExistingApiService, Claimed)]) {
        self.hiding.clear();
        for (a, _) in hidden {
            self.hiding.get_or_create(&HidingLabels { apiservice: a.name.clone(), group: a.group.clone() }).set(1);
        }
        self.elsewhere.clear();
        for (a, why) in elsewhere {
            let labels =
                ElsewhereLabels { apiservice: a.name.clone(), group: a.group.clone(), served_by: why.served_by() };
            self.elsewhere.get_or_create(&labels).set(1);
        }
    }
}

/// What this server serves, for the checks: each group with the CRD names its kinds would have in the CRD form.
#[derive(Clone, Debug)]
pub struct ServedGroups(pub Vec<(String, Vec<String>)>);

/// How often a running server checks again: an upgrade of the control plane, or another installation, does not
/// restart this server.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(600);

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckOutcome {
    /// This many APIServices hide a group the cluster serves itself, or send one of ours elsewhere (each warned
    /// about).
    Found(usize),
    /// The cluster serves no APIServices: there is no aggregator to hide anything behind.
    NoAggregator,
}

/// One check: a warning per finding, and the gauges.
pub async fn check_once(
    client: &kube::Client,
    ours: &Backend,
    served: &ServedGroups,
    metrics: &ClusterCheckMetrics,
) -> Result<CheckOutcome, ClusterCheckError> {
    let Some(mut facts) = ClusterFacts::read(client).await? else { return Ok(CheckOutcome::NoAggregator) };
    // Our CRD names in the groups kube-apiserver serves from CRDs: ours (the CRD form) or someone else's?
    let crd_names: Vec<String> = served
        .0
        .iter()
        .filter(|(g, _)| facts.apiservices_of(g).any(|a| a.backend == Backend::CustomResources))
        .flat_map(|(_, names)| names.iter().cloned())
        .collect();
    facts.get_crds(client, &crd_names).await?;
    let hidden = facts.hidden_by_ours(ours);
    for (a, why) in &hidden {
        tracing::warn!(
            apiservice = %a.name,
            group = %a.group,
            "APIService {} of this server hides {}: {why}; delete it to hand the group over to kube-apiserver: kubectl delete apiservice {} (migration.k8s.io keeps working)",
            a.name, a.group, a.name
        );
    }
    let groups: Vec<&str> = served.0.iter().map(|(g, _)| g.as_str()).collect();
    let elsewhere = facts.served_elsewhere(&groups, ours);
    for (a, why) in &elsewhere {
        tracing::warn!(
            apiservice = %a.name,
            group = %a.group,
            "{} is not served by this server in this cluster: {why}; clients reach that instead of this server's {} (hand it over, or turn the group off here with --runtime-config={}/{}=false: docs/install/handover.md)",
            a.group, a.group, a.group, a.version
        );
    }
    metrics.set(&hidden, &elsewhere);
    if hidden.is_empty() && elsewhere.is_empty() {
        tracing::info!(version = %facts.version.git_version, "cluster check: none of our APIServices hides a group the cluster serves itself, and every group this server serves is routed to it or absent");
    }
    Ok(CheckOutcome::Found(hidden.len() + elsewhere.len()))
}

/// Checks at start (retrying while the cluster cannot be read) and again every [`RECHECK_INTERVAL`]; stops on a
/// cluster without APIServices.
pub async fn watch(client: kube::Client, ours: Backend, served: ServedGroups, metrics: ClusterCheckMetrics) {
    let mut retry = Duration::from_secs(1);
    loop {
        let wait = match check_once(&client, &ours, &served, &metrics).await {
            Ok(CheckOutcome::NoAggregator) => {
                tracing::info!(
                    "cluster check: the cluster serves no APIServices (apiregistration.k8s.io); nothing to check"
                );
                return;
            }
            Ok(CheckOutcome::Found(_)) => {
                retry = Duration::from_secs(1);
                RECHECK_INTERVAL
            }
            Err(e) => {
                tracing::warn!(error = %e, "cluster check: cannot tell whether our API groups are ours in this cluster; retrying");
                retry = (retry * 2).min(RECHECK_INTERVAL);
                retry
            }
        };
        tokio::time::sleep(wait).await;
    }
}

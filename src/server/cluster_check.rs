//! Cluster safety for the groups kube-apiserver may serve itself (`storagemigration.k8s.io`: GA in 1.37, earlier
//! behind `--runtime-config`): this server must not claim such a group where the cluster serves it.
//!
//! Discovery cannot tell once our APIService exists (the aggregator then shows our group), and kube-apiserver's
//! autoregister controller leaves an APIService it did not create alone (it only manages the ones labelled
//! `kube-aggregator.kubernetes.io/automanaged`; kubernetes `staging/src/k8s.io/kube-aggregator/pkg/controllers/
//! autoregister/autoregister_controller.go`), so after an upgrade ours would keep hiding the built-in version. The
//! decision therefore rests on two facts read from the cluster:
//! - `/version`: from the release that serves the group by default on;
//! - the APIService objects of the group: a local one (no `spec.service`, created by kube-apiserver for a group
//!   version it serves itself, e.g. enabled with `--runtime-config`), one of another server, or ours (`spec.service`
//!   naming our Service).
//!
//! The deploy kit (`migration-apiserver deploy-check`, called by scripts/deploy.sh) registers our APIServices of
//! such a group only where the cluster does not serve it; the server ([`watch`]) warns and exports
//! `migration_apiserver_apiservice_hiding_builtin_group` when one of ours hides a group the cluster serves itself.

use k8s_openapi::apimachinery::pkg::version::Info;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::fmt;
use std::time::Duration;

/// A group that kube-apiserver serves itself from a release on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InTreeGroup {
    pub group: &'static str,
    /// (major, minor) of the first release serving the group by default.
    pub since: (u32, u32),
    /// The version it serves by default from then on (for the messages).
    pub version: &'static str,
}

/// KEP-4192's StorageVersionMigration: v1alpha1 (1.30) and v1beta1 (1.35) off by default, v1 GA in 1.37.
pub const IN_TREE_GROUPS: &[InTreeGroup] =
    &[InTreeGroup { group: "storagemigration.k8s.io", since: (1, 37), version: "v1" }];

/// The in-tree group entry of `group`, if kube-apiserver may serve it itself.
pub fn in_tree_group(group: &str) -> Option<&'static InTreeGroup> {
    IN_TREE_GROUPS.iter().find(|g| g.group == group)
}

/// Why the cluster could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCheckError {
    #[error("the cluster's /version has no release number: major {major:?}, minor {minor:?}, gitVersion {git:?}")]
    Version { major: String, minor: String, git: String },
    #[error("reading the cluster's /version: {0}")]
    ReadVersion(#[source] kube::Error),
    #[error("listing the cluster's APIServices (apiregistration.k8s.io/v1): {0}")]
    ListApiServices(#[source] kube::Error),
}

/// The cluster's release, from `/version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterVersion {
    pub major: u32,
    pub minor: u32,
    pub git_version: String,
}

/// The leading digits of `s` ("37+" on some providers' builds is 37).
fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl ClusterVersion {
    /// The release whose APIs the cluster serves: its emulated version when it reports one (kube-apiserver's
    /// `--emulated-version` serves the APIs of that release), else `major` and `minor`, else `gitVersion`
    /// (`v1.37.0-...`).
    pub fn from_info(info: &Info) -> Result<ClusterVersion, ClusterCheckError> {
        let emulated = info
            .emulation_major
            .as_deref()
            .and_then(leading_number)
            .zip(info.emulation_minor.as_deref().and_then(leading_number));
        let from_fields = emulated.or_else(|| leading_number(&info.major).zip(leading_number(&info.minor)));
        let from_git = || {
            let mut parts = info.git_version.trim_start_matches('v').split('.');
            leading_number(parts.next()?).zip(leading_number(parts.next()?))
        };
        let (major, minor) = from_fields.or_else(from_git).ok_or_else(|| ClusterCheckError::Version {
            major: info.major.clone(),
            minor: info.minor.clone(),
            git: info.git_version.clone(),
        })?;
        Ok(ClusterVersion { major, minor, git_version: info.git_version.clone() })
    }

    fn at_least(&self, (major, minor): (u32, u32)) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

/// Where the aggregator sends an APIService's requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// No `spec.service`: kube-apiserver serves the group version itself.
    Local,
    /// No `spec.service`, labelled `kube-aggregator.kubernetes.io/automanaged: "true"`: kube-apiserver's
    /// crdregistration controller keeps it for a group of CustomResourceDefinitions (the built-in groups' are
    /// `onstart`; kubernetes `staging/src/k8s.io/kube-aggregator/pkg/controllers/autoregister`).
    CustomResources,
    Service {
        namespace: String,
        name: String,
    },
}

impl Backend {
    pub fn service(namespace: &str, name: &str) -> Backend {
        Backend::Service { namespace: namespace.to_string(), name: name.to_string() }
    }
}

/// The label kube-apiserver's autoregister controller puts on the APIServices it manages, and its value for the
/// ones kept for CustomResourceDefinitions.
const AUTOMANAGED_LABEL: &str = "kube-aggregator.kubernetes.io/automanaged";
const MANAGED_CONTINUOUSLY: &str = "true";

/// An APIService of the cluster, as far as the decision goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingApiService {
    pub name: String,
    pub group: String,
    pub version: String,
    pub backend: Backend,
}

impl From<&APIService> for ExistingApiService {
    fn from(a: &APIService) -> Self {
        let spec = a.spec.clone().unwrap_or_default();
        let backend = match spec.service {
            Some(s) => {
                Backend::Service { namespace: s.namespace.unwrap_or_default(), name: s.name.unwrap_or_default() }
            }
            None if a.metadata.labels.as_ref().and_then(|l| l.get(AUTOMANAGED_LABEL)).map(String::as_str)
                == Some(MANAGED_CONTINUOUSLY) =>
            {
                Backend::CustomResources
            }
            None => Backend::Local,
        };
        ExistingApiService {
            name: a.metadata.name.clone().unwrap_or_default(),
            group: spec.group.unwrap_or_default(),
            version: spec.version.unwrap_or_default(),
            backend,
        }
    }
}

/// Why a group is not ours to serve on this cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// kube-apiserver serves a version of the group itself (its local APIService, e.g. from `--runtime-config`).
    LocalApiService { group: String, apiservice: String },
    /// The cluster's release serves the group by default.
    Release { group: String, version: String, git_version: String, since: (u32, u32) },
    /// Another aggregated server is registered for a version of the group.
    OtherServer { group: String, apiservice: String, namespace: String, service: String },
    /// CustomResourceDefinitions serve the group (ours in the CRD form, or someone else's).
    CustomResources { group: String, apiservice: String },
}

impl Claimed {
    /// kube-apiserver itself serves the group (not another aggregated server).
    pub fn by_the_cluster(&self) -> bool {
        !matches!(self, Claimed::OtherServer { .. } | Claimed::CustomResources { .. })
    }
}

impl fmt::Display for Claimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claimed::LocalApiService { group, apiservice } => write!(
                f,
                "the cluster serves {group} itself (APIService {apiservice} is local: no spec.service, kube-apiserver's own)"
            ),
            Claimed::Release { group, version, git_version, since: (major, minor) } => write!(
                f,
                "the cluster ({git_version}) serves {group}/{version} itself (built in from v{major}.{minor} on)"
            ),
            Claimed::OtherServer { group, apiservice, namespace, service } => {
                write!(f, "APIService {apiservice} registers {group} for another server (Service {namespace}/{service})")
            }
            Claimed::CustomResources { group, apiservice } => write!(
                f,
                "CustomResourceDefinitions serve {group} (APIService {apiservice} is kube-apiserver's for CRDs; \
                 delete the group's CRDs first to serve it aggregated)"
            ),
        }
    }
}

/// What the cluster says about the in-tree groups.
#[derive(Clone, Debug)]
pub struct ClusterFacts {
    pub version: ClusterVersion,
    pub apiservices: Vec<ExistingApiService>,
}

impl ClusterFacts {
    /// Lists the APIServices (the only request that needs a rule: `list` of `apiservices.apiregistration.k8s.io`),
    /// then reads `/version` (allowed to everyone: system:public-info-viewer). None when the cluster serves no
    /// APIServices (404: no aggregator, e.g. a standalone migration-apiserver as the target): nothing to check.
    pub async fn read(client: &kube::Client) -> Result<Option<ClusterFacts>, ClusterCheckError> {
        let api: kube::Api<APIService> = kube::Api::all(client.clone());
        let list = match api.list(&Default::default()).await {
            Ok(list) => list,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(e) => return Err(ClusterCheckError::ListApiServices(e)),
        };
        let info = client.apiserver_version().await.map_err(ClusterCheckError::ReadVersion)?;
        Ok(Some(ClusterFacts {
            version: ClusterVersion::from_info(&info)?,
            apiservices: list.items.iter().map(ExistingApiService::from).collect(),
        }))
    }

    /// Whether `group` is claimed by the cluster, another server or CRDs; our own APIServices (`ours`) never
    /// count. A concrete APIService goes first: it names what is there.
    pub fn claimed(&self, group: &InTreeGroup, ours: &Backend) -> Option<Claimed> {
        let in_group = || self.apiservices.iter().filter(|a| a.group == group.group);
        if let Some(local) = in_group().find(|a| a.backend == Backend::Local) {
            return Some(Claimed::LocalApiService { group: group.group.into(), apiservice: local.name.clone() });
        }
        if let Some(crds) = in_group().find(|a| a.backend == Backend::CustomResources) {
            return Some(Claimed::CustomResources { group: group.group.into(), apiservice: crds.name.clone() });
        }
        if let Some(other) = in_group().find(|a| &a.backend != ours) {
            let Backend::Service { namespace, name } = &other.backend else { return None };
            return Some(Claimed::OtherServer {
                group: group.group.into(),
                apiservice: other.name.clone(),
                namespace: namespace.clone(),
                service: name.clone(),
            });
        }
        self.version.at_least(group.since).then(|| Claimed::Release {
            group: group.group.into(),
            version: group.version.into(),
            git_version: self.version.git_version.clone(),
            since: group.since,
        })
    }

    /// The deploy kit's decision for our APIService of `group`: None to register it, else why not.
    pub fn skip_reason(&self, group: &str, ours: &Backend) -> Option<Claimed> {
        in_tree_group(group).and_then(|g| self.claimed(g, ours))
    }

    /// The deploy kit's decision for our CRDs of `group` (the CRD form): None to install them, else why not.
    /// CRDs serving the group already are taken for ours (installing again updates them).
    pub fn crd_skip_reason(&self, group: &str, ours: &Backend) -> Option<Claimed> {
        let g = in_tree_group(group)?;
        let others = ClusterFacts {
            version: self.version.clone(),
            apiservices: self.apiservices.iter().filter(|a| a.backend != Backend::CustomResources).cloned().collect(),
        };
        others.claimed(g, ours)
    }

    /// Our APIServices that hide a group the cluster serves itself, with why.
    pub fn hidden_by_ours(&self, ours: &Backend) -> Vec<(ExistingApiService, Claimed)> {
        let mut out = Vec::new();
        for group in IN_TREE_GROUPS {
            let Some(why) = self.claimed(group, ours).filter(Claimed::by_the_cluster) else { continue };
            for a in self.apiservices.iter().filter(|a| a.group == group.group && &a.backend == ours) {
                out.push((a.clone(), why.clone()));
            }
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HidingLabels {
    apiservice: String,
    group: String,
}

/// `migration_apiserver_apiservice_hiding_builtin_group{apiservice, group}`: 1 per APIService of ours that hides a
/// group the cluster serves itself, as of the last check.
#[derive(Clone, Default)]
pub struct HidingMetric(Family<HidingLabels, Gauge>);

impl HidingMetric {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> HidingMetric {
        let metric = HidingMetric::default();
        registry.register(
            "migration_apiserver_apiservice_hiding_builtin_group",
            "1 for each APIService of this server that hides an API group the cluster serves itself (after an upgrade): delete it with kubectl delete apiservice <name>.",
            metric.0.clone(),
        );
        metric
    }

    fn set(&self, hidden: &[(ExistingApiService, Claimed)]) {
        self.0.clear();
        for (a, _) in hidden {
            self.0.get_or_create(&HidingLabels { apiservice: a.name.clone(), group: a.group.clone() }).set(1);
        }
    }
}

/// How often a running server checks again: an upgrade of the control plane does not restart this server.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(600);

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckOutcome {
    /// This many APIServices of ours hide a group the cluster serves itself (each warned about).
    Hiding(usize),
    /// The cluster serves no APIServices: there is no aggregator to hide anything behind.
    NoAggregator,
}

/// One check: a warning per APIService of ours that hides a group the cluster serves itself, and the metric.
pub async fn check_once(
    client: &kube::Client,
    ours: &Backend,
    metric: &HidingMetric,
) -> Result<CheckOutcome, ClusterCheckError> {
    let Some(facts) = ClusterFacts::read(client).await? else { return Ok(CheckOutcome::NoAggregator) };
    let hidden = facts.hidden_by_ours(ours);
    for (a, why) in &hidden {
        tracing::warn!(
            apiservice = %a.name,
            group = %a.group,
            "APIService {} of this server hides {}: {why}; delete it to hand the group over to kube-apiserver: kubectl delete apiservice {} (migration.k8s.io keeps working)",
            a.name, a.group, a.name
        );
    }
    metric.set(&hidden);
    if hidden.is_empty() {
        tracing::info!(version = %facts.version.git_version, "cluster check: none of our APIServices hides a group the cluster serves itself");
    }
    Ok(CheckOutcome::Hiding(hidden.len()))
}

/// Checks at start (retrying while the cluster cannot be read) and again every [`RECHECK_INTERVAL`]; stops on a
/// cluster without APIServices.
pub async fn watch(client: kube::Client, ours: Backend, metric: HidingMetric) {
    let mut retry = Duration::from_secs(1);
    loop {
        let wait = match check_once(&client, &ours, &metric).await {
            Ok(CheckOutcome::NoAggregator) => {
                tracing::info!(
                    "cluster check: the cluster serves no APIServices (apiregistration.k8s.io); nothing to check"
                );
                return;
            }
            Ok(CheckOutcome::Hiding(_)) => {
                retry = Duration::from_secs(1);
                RECHECK_INTERVAL
            }
            Err(e) => {
                tracing::warn!(error = %e, "cluster check: cannot tell whether our APIServices hide a group the cluster serves itself; retrying");
                retry = (retry * 2).min(RECHECK_INTERVAL);
                retry
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUP: &str = "storagemigration.k8s.io";

    fn ours() -> Backend {
        Backend::service("migration-apiserver", "migration-apiserver")
    }

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info { major: major.into(), minor: minor.into(), git_version: git.into(), ..Default::default() }
    }

    fn apiservice(version: &str, backend: Backend) -> ExistingApiService {
        ExistingApiService { name: format!("{version}.{GROUP}"), group: GROUP.into(), version: version.into(), backend }
    }

    fn facts(minor: u32, apiservices: Vec<ExistingApiService>) -> ClusterFacts {
        let git_version = format!("v1.{minor}.0");
        ClusterFacts { version: ClusterVersion { major: 1, minor, git_version }, apiservices }
    }

    #[test]
    fn versions_are_read_as_providers_report_them() {
        let v = |i: Info| ClusterVersion::from_info(&i).map(|v| (v.major, v.minor)).ok();
        assert_eq!(v(info("1", "37", "v1.37.0")), Some((1, 37)));
        assert_eq!(v(info("1", "36+", "v1.36.2-gke.100")), Some((1, 36)));
        assert_eq!(v(info("", "", "v1.35.1")), Some((1, 35)));
        assert_eq!(v(info("", "", "unknown")), None);
        let emulating = Info {
            emulation_major: Some("1".into()),
            emulation_minor: Some("36".into()),
            ..info("1", "37", "v1.37.0")
        };
        assert_eq!(v(emulating), Some((1, 36)));
    }

    #[test]
    fn an_older_cluster_without_the_group_gets_ours() {
        assert_eq!(facts(34, vec![]).skip_reason(GROUP, &ours()), None);
        let with_ours = facts(36, vec![apiservice("v1", ours()), apiservice("v1beta1", ours())]);
        assert_eq!(with_ours.skip_reason(GROUP, &ours()), None);
        assert!(with_ours.hidden_by_ours(&ours()).is_empty());
        // Groups kube-apiserver never serves are always ours.
        assert_eq!(facts(40, vec![]).skip_reason("migration.k8s.io", &ours()), None);
    }

    #[test]
    fn a_cluster_serving_the_group_is_left_alone() {
        let local = facts(37, vec![apiservice("v1", Backend::Local)]);
        assert!(matches!(local.skip_reason(GROUP, &ours()), Some(Claimed::LocalApiService { .. })));
        // Enabled with --runtime-config before 1.37: its local APIService.
        let beta = facts(35, vec![apiservice("v1beta1", Backend::Local)]);
        let why = beta.skip_reason(GROUP, &ours()).expect("skipped");
        assert_eq!(why.to_string(), "the cluster serves storagemigration.k8s.io itself (APIService v1beta1.storagemigration.k8s.io is local: no spec.service, kube-apiserver's own)");
        // 1.37 before its autoregister ran: the release alone.
        assert!(matches!(facts(37, vec![]).skip_reason(GROUP, &ours()), Some(Claimed::Release { .. })));
        let other = facts(34, vec![apiservice("v1", Backend::service("x", "other"))]);
        assert!(matches!(other.skip_reason(GROUP, &ours()), Some(Claimed::OtherServer { .. })));
        assert!(other.hidden_by_ours(&ours()).is_empty(), "another server's APIService is not ours to delete");
    }

    #[test]
    fn crds_of_the_group_are_neither_the_cluster_nor_in_the_way_of_our_crds() {
        let crds = facts(34, vec![apiservice("v1", Backend::CustomResources)]);
        let why = crds.skip_reason(GROUP, &ours()).expect("our APIServices would hide the CRDs");
        assert!(matches!(why, Claimed::CustomResources { .. }) && !why.by_the_cluster(), "{why}");
        assert_eq!(crds.crd_skip_reason(GROUP, &ours()), None, "installing our CRDs again updates them");
        // The CRD form still steps aside for the cluster's own API.
        assert!(matches!(facts(37, vec![]).crd_skip_reason(GROUP, &ours()), Some(Claimed::Release { .. })));
        let local = facts(35, vec![apiservice("v1beta1", Backend::Local), apiservice("v1", Backend::CustomResources)]);
        assert!(matches!(local.crd_skip_reason(GROUP, &ours()), Some(Claimed::LocalApiService { .. })));
    }

    #[test]
    fn the_crd_label_tells_crd_apiservices_from_built_in_ones() {
        let api = |label: Option<&str>| {
            let labels = label.map(|v| [(AUTOMANAGED_LABEL.to_string(), v.to_string())].into());
            let a = APIService {
                metadata: kube::api::ObjectMeta { name: Some(format!("v1.{GROUP}")), labels, ..Default::default() },
                spec: Some(Default::default()),
                status: None,
            };
            ExistingApiService::from(&a).backend
        };
        assert_eq!(api(Some("true")), Backend::CustomResources);
        assert_eq!(api(Some("onstart")), Backend::Local);
        assert_eq!(api(None), Backend::Local);
    }

    #[test]
    fn an_upgrade_under_ours_names_every_apiservice_to_delete() {
        let upgraded = facts(37, vec![apiservice("v1", ours()), apiservice("v1beta1", ours())]);
        let hidden: Vec<String> = upgraded.hidden_by_ours(&ours()).into_iter().map(|(a, _)| a.name).collect();
        assert_eq!(hidden, ["v1.storagemigration.k8s.io", "v1beta1.storagemigration.k8s.io"]);
        // On 1.36 with v1beta1 enabled while ours serves v1: the local one gives it away.
        let mixed = facts(36, vec![apiservice("v1", ours()), apiservice("v1beta1", Backend::Local)]);
        let hidden: Vec<String> = mixed.hidden_by_ours(&ours()).into_iter().map(|(a, _)| a.name).collect();
        assert_eq!(hidden, ["v1.storagemigration.k8s.io"]);
    }
}

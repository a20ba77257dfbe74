//! Cluster safety: this server must never take over an API group version that something else in the cluster
//! serves: kube-apiserver itself (`storagemigration.k8s.io`: GA in 1.37, earlier behind `--runtime-config`),
//! another aggregated server (gardener-apiserver serves `core.gardener.cloud`), or CustomResourceDefinitions
//! (kube-storage-version-migrator's serve `migration.k8s.io`). An APIService of ours replaces an existing one of
//! the same name when applied, and from then on the aggregator sends every request of that group version to us.
//!
//! Discovery cannot tell once our APIService exists (the aggregator then shows our group), and kube-apiserver's
//! autoregister controller leaves an APIService it did not create alone (it only manages the ones labelled
//! `kube-aggregator.kubernetes.io/automanaged`; kubernetes `staging/src/k8s.io/kube-aggregator/pkg/controllers/
//! autoregister/autoregister_controller.go`). The decisions therefore rest on facts read from the cluster:
//! - `/version`: from the release that serves an in-tree group by default on;
//! - the APIService objects: a local one (no `spec.service`: kube-apiserver serves the group version, built in or,
//!   when labelled `automanaged: "true"`, for CRDs), another server's, or ours (`spec.service` naming our Service);
//! - the CustomResourceDefinitions of our groups, ours (the CRD form, labelled [`crate::server::crd::OWNER_LABEL`])
//!   or someone else's.
//!
//! The deploy kit (`migration-apiserver deploy-check`, called by scripts/deploy.sh) registers our APIServices and
//! CRDs of a group only where the group is absent or already ours ([`ClusterFacts::apiservice_claim`],
//! [`ClusterFacts::crd_claim`]); the server ([`watch`]) warns and exports a gauge while one of our APIServices hides
//! a group the cluster serves itself, and while a group it serves is routed elsewhere.

mod claims;
#[cfg(test)]
mod tests;
mod watch;

pub use claims::Claimed;
pub use watch::{check_once, watch, CheckOutcome, ClusterCheckMetrics, ServedGroups, RECHECK_INTERVAL};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::version::Info;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

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
    #[error("reading the cluster's CustomResourceDefinitions (apiextensions.k8s.io/v1): {0}")]
    ReadCrds(#[source] kube::Error),
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

/// A CustomResourceDefinition of the cluster, as far as the decision goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingCrd {
    pub name: String,
    pub group: String,
    /// Installed by this server's CRD form (it carries our owner label).
    pub ours: bool,
}

impl From<&CustomResourceDefinition> for ExistingCrd {
    fn from(c: &CustomResourceDefinition) -> Self {
        let (key, value) = crate::server::crd::OWNER_LABEL;
        let ours = c.metadata.labels.as_ref().and_then(|l| l.get(key)).is_some_and(|v| v == value);
        ExistingCrd { name: c.metadata.name.clone().unwrap_or_default(), group: c.spec.group.clone(), ours }
    }
}

/// What the cluster says about the API groups.
#[derive(Clone, Debug)]
pub struct ClusterFacts {
    pub version: ClusterVersion,
    pub apiservices: Vec<ExistingApiService>,
    /// The CRDs of the groups that matter (every CRD for the deploy kit, which lists them; for the server, those
    /// of our kinds' names that exist).
    pub crds: Vec<ExistingCrd>,
}

impl ClusterFacts {
    /// Lists the APIServices (`list` of `apiservices.apiregistration.k8s.io`), then reads `/version` (allowed to
    /// everyone: system:public-info-viewer). No CRDs yet: [`ClusterFacts::list_crds`] or
    /// [`ClusterFacts::get_crds`] add them. None when the cluster serves no APIServices (404: no aggregator, e.g.
    /// a standalone migration-apiserver as the target): nothing to check.
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
            crds: Vec::new(),
        }))
    }

    /// Every CRD of the cluster (the deploy kit, with its user's rights): a cluster without apiextensions has none.
    pub async fn list_crds(&mut self, client: &kube::Client) -> Result<(), ClusterCheckError> {
        let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
        self.crds = match api.list(&Default::default()).await {
            Ok(list) => list.items.iter().map(ExistingCrd::from).collect(),
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => return Err(ClusterCheckError::ReadCrds(e)),
        };
        Ok(())
    }

    /// The CRDs of these names that exist (the server, whose role may only `get` CRDs).
    pub async fn get_crds(&mut self, client: &kube::Client, names: &[String]) -> Result<(), ClusterCheckError> {
        let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
        for name in names {
            if let Some(crd) = api.get_opt(name).await.map_err(ClusterCheckError::ReadCrds)? {
                self.crds.push(ExistingCrd::from(&crd));
            }
        }
        Ok(())
    }

    fn apiservices_of<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a ExistingApiService> + 'a {
        self.apiservices.iter().filter(move |a| a.group == group)
    }

    fn crds_of<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a ExistingCrd> + 'a {
        self.crds.iter().filter(move |c| c.group == group)
    }
}

//! Whether a group of ours is someone else's on this cluster, and why: the decisions of the deploy kit (register
//! our APIServices, install our CRDs) and of the server's checks, from [`ClusterFacts`].
//!
//! A group is decided as a whole, never version by version: two servers behind one group would split its
//! discovery, and a kind served by both (ShootState by gardener-apiserver and by us) would live in two stores.

use super::{in_tree_group, Backend, ClusterFacts, ExistingApiService};
use std::fmt;

/// Why a group is not ours to serve on this cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// kube-apiserver serves a version of the group itself (its local APIService, e.g. from `--runtime-config`).
    LocalApiService { group: String, apiservice: String },
    /// The cluster's release serves the group by default.
    Release { group: String, version: String, git_version: String, since: (u32, u32) },
    /// Another aggregated server is registered for a version of the group.
    OtherServer { group: String, apiservice: String, namespace: String, service: String },
    /// CustomResourceDefinitions serve the group: `crds` (as far as known) and kube-apiserver's APIService for
    /// them; `ours` when every one of them is this server's (the CRD form).
    CustomResources { group: String, apiservice: Option<String>, crds: Vec<String>, ours: bool },
    /// This server serves the group aggregated (in the way of the CRD form).
    OursAggregated { group: String, apiservice: String },
}

impl Claimed {
    /// kube-apiserver itself serves the group (not another aggregated server, nor CRDs).
    pub fn by_the_cluster(&self) -> bool {
        matches!(self, Claimed::LocalApiService { .. } | Claimed::Release { .. })
    }

    /// Where the group's requests go instead, for the metric's `served_by` label.
    pub fn served_by(&self) -> String {
        match self {
            Claimed::LocalApiService { .. } | Claimed::Release { .. } => "kube-apiserver".into(),
            Claimed::OtherServer { namespace, service, .. } => format!("service/{namespace}/{service}"),
            Claimed::CustomResources { .. } => "customresourcedefinitions".into(),
            Claimed::OursAggregated { .. } => "migration-apiserver".into(),
        }
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
            Claimed::CustomResources { group, crds, ours: true, .. } => write!(
                f,
                "this server's CustomResourceDefinitions (the CRD form: {}) serve {group}; delete them first to \
                 serve the group aggregated (docs/install/upgrade.md)",
                crds.join(", ")
            ),
            Claimed::CustomResources { group, crds, apiservice, ours: false } if crds.is_empty() => write!(
                f,
                "CustomResourceDefinitions serve {group} (APIService {} is kube-apiserver's for CRDs; delete the \
                 group's CRDs first to serve it aggregated)",
                apiservice.as_deref().unwrap_or("?")
            ),
            Claimed::CustomResources { group, crds, ours: false, .. } => write!(
                f,
                "CustomResourceDefinitions that are not this server's serve {group} ({}; kube-storage-version-migrator \
                 installs such CRDs): carry their objects over and delete them first (docs/install/handover.md)",
                crds.join(", ")
            ),
            Claimed::OursAggregated { group, apiservice } => write!(
                f,
                "this server serves {group} aggregated (APIService {apiservice}); delete its APIServices of the group \
                 first to switch to the CRD form (docs/install/upgrade.md)"
            ),
        }
    }
}

/// `a` registers its group for a server other than ours.
fn another_servers(a: &ExistingApiService, ours: &Backend) -> Option<Claimed> {
    match &a.backend {
        Backend::Service { namespace, name } if &a.backend != ours => Some(Claimed::OtherServer {
            group: a.group.clone(),
            apiservice: a.name.clone(),
            namespace: namespace.clone(),
            service: name.clone(),
        }),
        _ => None,
    }
}

impl ClusterFacts {
    fn local(&self, group: &str) -> Option<Claimed> {
        let local = self.apiservices_of(group).find(|a| a.backend == Backend::Local)?;
        Some(Claimed::LocalApiService { group: group.into(), apiservice: local.name.clone() })
    }

    fn other_server(&self, group: &str, ours: &Backend) -> Option<Claimed> {
        self.apiservices_of(group).find_map(|a| another_servers(a, ours))
    }

    /// The group's CRDs (all, or only those not ours), with kube-apiserver's APIService for them.
    fn custom_resources(&self, group: &str, only_foreign: bool) -> Option<Claimed> {
        let mut crds: Vec<_> = self.crds_of(group).filter(|c| !(only_foreign && c.ours)).collect();
        crds.sort_by(|a, b| a.name.cmp(&b.name));
        let apiservice = self.apiservices_of(group).find(|a| a.backend == Backend::CustomResources);
        if crds.is_empty() && (only_foreign || apiservice.is_none()) {
            return None;
        }
        Some(Claimed::CustomResources {
            group: group.into(),
            apiservice: apiservice.map(|a| a.name.clone()),
            ours: !crds.is_empty() && crds.iter().all(|c| c.ours),
            crds: crds.iter().map(|c| c.name.clone()).collect(),
        })
    }

    /// The release serves the group by default, and an APIService of another backend sits where kube-apiserver's
    /// own would be (`<version>.<group>`), so that discovery cannot show whether the cluster has the group on. A
    /// release whose APIService list has no `<version>.<group>` at all has the group turned off
    /// (`--runtime-config=<group>/<version>=false`): kube-apiserver's autoregister registers every group version it
    /// serves before it reports ready, so the absence is discovery's answer, and the group is free.
    fn release(&self, group: &str) -> Option<Claimed> {
        let g = in_tree_group(group)?;
        let name = format!("{}.{}", g.version, g.group);
        let occupied = self.apiservices_of(group).any(|a| a.name == name);
        (occupied && self.version.at_least(g.since)).then(|| Claimed::Release {
            group: g.group.into(),
            version: g.version.into(),
            git_version: self.version.git_version.clone(),
            since: g.since,
        })
    }

    /// The deploy kit's decision for our APIServices of `group`: None to register them (the group is absent, or
    /// served by ours), else why not. A concrete object goes first: it names what is there.
    pub fn apiservice_claim(&self, group: &str, ours: &Backend) -> Option<Claimed> {
        self.local(group)
            .or_else(|| self.custom_resources(group, false))
            .or_else(|| self.other_server(group, ours))
            .or_else(|| self.release(group))
    }

    /// The deploy kit's decision for our CRDs (and webhook rules) of `group`, the CRD form: None to install them
    /// (the group is absent, or served by our CRDs: installing again updates them), else why not.
    pub fn crd_claim(&self, group: &str, ours: &Backend) -> Option<Claimed> {
        let ours_aggregated = || {
            let a = self.apiservices_of(group).find(|a| &a.backend == ours)?;
            Some(Claimed::OursAggregated { group: group.into(), apiservice: a.name.clone() })
        };
        self.local(group)
            .or_else(|| self.other_server(group, ours))
            .or_else(ours_aggregated)
            .or_else(|| self.custom_resources(group, true))
            .or_else(|| self.release(group))
    }

    /// Our APIServices that hide a group the cluster serves itself, with why.
    pub fn hidden_by_ours(&self, ours: &Backend) -> Vec<(ExistingApiService, Claimed)> {
        let mut out = Vec::new();
        for group in super::IN_TREE_GROUPS {
            let Some(why) = self.apiservice_claim(group.group, ours).filter(Claimed::by_the_cluster) else { continue };
            for a in self.apiservices_of(group.group).filter(|a| &a.backend == ours) {
                out.push((a.clone(), why.clone()));
            }
        }
        out
    }

    /// The APIServices of `groups` (the groups this server serves) that send the group elsewhere: to another
    /// server, or to CRDs that are not ours. An in-tree group's local APIService is the hand-over to
    /// kube-apiserver (docs/install/handover.md), not counted here.
    pub fn served_elsewhere(&self, groups: &[&str], ours: &Backend) -> Vec<(ExistingApiService, Claimed)> {
        let mut out = Vec::new();
        for &group in groups {
            for a in self.apiservices_of(group) {
                let why = match &a.backend {
                    Backend::Service { .. } => match another_servers(a, ours) {
                        Some(why) => why,
                        None => continue,
                    },
                    Backend::CustomResources => match self.custom_resources(group, false) {
                        Some(Claimed::CustomResources { ours: true, .. }) => continue,
                        Some(why) => why,
                        None => continue,
                    },
                    Backend::Local if in_tree_group(group).is_some() => continue,
                    Backend::Local => Claimed::LocalApiService { group: group.into(), apiservice: a.name.clone() },
                };
                out.push((a.clone(), why));
            }
        }
        out
    }
}

//! Cluster safety for `storagemigration.k8s.io`, which kube-apiserver serves itself from 1.37 (or earlier with
//! `--runtime-config`): the deploy kit registers our APIServices of that group only where the cluster does not
//! serve it, and says why it skips; a server whose APIService hides the cluster's own group (the cluster was
//! upgraded under it) warns, naming the APIService to delete, and exports
//! `migration_apiserver_apiservice_hiding_builtin_group`.
//!
//! The clusters here are the stand-in of tests/common/deploy_kit.rs, since they claim releases (1.34, 1.35) other
//! than the one `make kube` builds; on 1.37 with and without the in-tree API, tests/cluster_intree.rs runs the same
//! decisions against a real kube-apiserver. The other groups (gardener-apiserver's, kube-storage-version-migrator's)
//! are tests/cluster_install_guard.rs's.

mod common;
use common::deploy_kit::{self, metric_lines, Cluster};
use common::*;
use serde_json::Value;
use std::time::Duration;

const GROUP: &str = "storagemigration.k8s.io";

/// A local APIService, as kube-apiserver's autoregister creates it for a group version it serves itself.
fn local_apiservice(version: &str, group_priority: i64, version_priority: i64) -> Value {
    deploy_kit::local_apiservice(GROUP, version, "onstart", group_priority, version_priority)
}

/// Ours, as `make deploy` registered it on the older cluster.
fn our_apiservice(version: &str) -> Value {
    deploy_kit::service_apiservice(GROUP, version, "migration-apiserver", "migration-apiserver", 15800)
}

/// Our other groups' APIServices, always present once deployed.
fn our_other_apiservices() -> Vec<Value> {
    ["v1alpha1.migration.k8s.io", "v1beta1.core.gardener.cloud", "v1alpha1.core.gardener.cloud"]
        .iter()
        .map(|name| {
            let (version, group) = name.split_once('.').expect("name");
            deploy_kit::service_apiservice(group, version, "migration-apiserver", "migration-apiserver", 1000)
        })
        .collect()
}

/// The stand-in: a 1.<minor> cluster with these APIServices and no CRDs.
fn cluster(minor: u32, apiservices: Vec<Value>) -> Cluster {
    Cluster::start(minor, apiservices, vec![])
}

#[test]
fn deploy_kit_skips_the_group_on_1_37_under_ours_by_its_version() {
    // Our APIService, registered before the upgrade, sits where kube-apiserver's own would be: discovery shows ours,
    // the release says the cluster serves the group. (With no APIService of the group at all, the group is turned
    // off: tests/cluster_intree.rs registers ours on such a real cluster.)
    let c = cluster(37, vec![our_apiservice("v1")]);
    let (names, stderr) = c.apiservices_to_register();
    assert!(!names.iter().any(|n| n.ends_with(GROUP)), "{names:?}");
    assert!(
        stderr.contains(
            "skipping APIService v1.storagemigration.k8s.io: the cluster (v1.37.0) serves \
             storagemigration.k8s.io/v1 itself (built in from v1.37 on)"
        ),
        "{stderr}"
    );
}

#[test]
fn deploy_kit_skips_the_group_turned_on_with_runtime_config_on_1_35() {
    let c = cluster(35, vec![local_apiservice("v1beta1", 15800, 9)]);
    let (names, stderr) = c.apiservices_to_register();
    assert!(!names.iter().any(|n| n.ends_with(GROUP)), "{names:?}");
    assert!(stderr.contains("(APIService v1beta1.storagemigration.k8s.io is local: no spec.service"), "{stderr}");
}

fn hiding_metric_lines(s: &Server) -> Vec<String> {
    metric_lines(s, "migration_apiserver_apiservice_hiding_builtin_group")
}

#[test]
fn a_server_on_a_1_34_cluster_hides_nothing() {
    let mut apiservices = vec![our_apiservice("v1"), our_apiservice("v1beta1")];
    apiservices.extend(our_other_apiservices());
    let c = cluster(34, apiservices);
    let s = c.server(&[]);
    // The check has run once it says so (after setting the metric).
    eventually("the check", Duration::from_secs(30), || {
        s.log().contains("cluster check: none of our APIServices hides a group the cluster serves itself").then_some(())
    });
    assert!(hiding_metric_lines(&s).is_empty());
    assert!(!s.log().contains("kubectl delete apiservice"), "{}", s.log());
}

#[test]
fn a_target_without_an_aggregator_is_asked_once() {
    // Another migration-apiserver as the target (as in the migrator's tests): no APIServices to hide anything.
    let target = Server::start(&[]);
    let proxy = common::proxy::Proxy::start(&target);
    let s = Server::start(&["--kubeconfig", proxy.kubeconfig().to_str().expect("path"), "--disable-scheduler"]);
    eventually("the check", Duration::from_secs(30), || {
        s.log().contains("the cluster serves no APIServices (apiregistration.k8s.io); nothing to check").then_some(())
    });
    let asked: Vec<String> = proxy
        .records()
        .into_iter()
        .filter(|r| r.path.starts_with("/apis/apiregistration.k8s.io/") || r.path == "/version")
        .map(|r| format!("{} {} {}", r.method, r.path, r.code))
        .collect();
    assert_eq!(asked, ["GET /apis/apiregistration.k8s.io/v1/apiservices 404"]);
    assert!(hiding_metric_lines(&s).is_empty());
}

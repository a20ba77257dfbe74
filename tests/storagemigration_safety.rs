//! Cluster safety for `storagemigration.k8s.io`, which kube-apiserver serves itself from 1.37 (or earlier with
//! `--runtime-config`): the deploy kit registers our APIServices of that group only where the cluster does not
//! serve it, and says why it skips; a server whose APIService hides the cluster's own group (the cluster was
//! upgraded under it) warns, naming the APIService to delete, and exports
//! `migration_apiserver_apiservice_hiding_builtin_group`.
//!
//! kube-apiserver cannot run here: the cluster is the stand-in of tests/common/deploy_kit.rs. The other groups
//! (gardener-apiserver's, kube-storage-version-migrator's) are tests/install_guard.rs's.

mod common;
use common::deploy_kit::{self, crds_and_webhook_groups, metric_lines, Cluster};
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
fn the_crd_form_leaves_out_the_group_where_the_cluster_serves_it() {
    let all = ["core.gardener.cloud", "migration.k8s.io", "storagemigration.k8s.io"];
    // 1.34: every CRD, and webhook rules for every group.
    let (docs, stderr) = cluster(34, vec![]).render("crds");
    let (crds, groups) = crds_and_webhook_groups(&docs);
    assert_eq!(crds.len(), 4, "{crds:?}");
    assert!(crds.contains(&format!("storageversionmigrations.{GROUP}")), "{crds:?}");
    assert_eq!(groups, all, "{stderr}");
    assert!(!stderr.contains("skipping"), "{stderr}");
    // ... also when our CRDs are already there (kube-apiserver keeps an APIService labelled for CRDs).
    let crd_apiservice = deploy_kit::local_apiservice(GROUP, "v1", "true", 1000, 15);
    let (docs, stderr) = cluster(34, vec![crd_apiservice]).render("crds");
    assert_eq!(crds_and_webhook_groups(&docs), (crds.clone(), groups.clone()), "{stderr}");
    // 1.37 serving the group: neither its CRD nor webhook rules that would sit in the way of the built-in API.
    let c = cluster(37, vec![local_apiservice("v1", 15800, 15)]);
    let (docs, stderr) = c.render("crds");
    let (crds_37, groups_37) = crds_and_webhook_groups(&docs);
    assert_eq!(crds_37.len(), 3, "{crds_37:?}");
    assert!(!crds_37.iter().any(|c| c.ends_with(GROUP)), "{crds_37:?}");
    assert_eq!(groups_37, all[..2], "{stderr}");
    assert!(
        stderr.contains(
            "skipping CustomResourceDefinition storageversionmigrations.storagemigration.k8s.io and its webhook \
             rules: the cluster serves storagemigration.k8s.io itself (APIService v1.storagemigration.k8s.io is local"
        ),
        "{stderr}"
    );
    c.assert_asked_version_and_apiservices();
}

#[test]
fn deploy_kit_registers_ours_on_a_1_34_cluster_without_the_group() {
    let c = cluster(34, vec![]);
    let (names, stderr) = c.apiservices_to_register();
    assert_eq!(
        names,
        [
            "v1.storagemigration.k8s.io",
            "v1alpha1.core.gardener.cloud",
            "v1alpha1.migration.k8s.io",
            "v1beta1.core.gardener.cloud",
            "v1beta1.storagemigration.k8s.io",
        ],
        "{stderr}"
    );
    assert!(!stderr.contains("skipping"), "{stderr}");
    c.assert_asked_version_and_apiservices();
}

#[test]
fn deploy_kit_skips_the_group_on_a_1_37_cluster_and_says_why() {
    let mut apiservices = vec![local_apiservice("v1", 15800, 15)];
    apiservices.extend(our_other_apiservices());
    let c = cluster(37, apiservices);
    let (names, stderr) = c.apiservices_to_register();
    assert_eq!(
        names,
        ["v1alpha1.core.gardener.cloud", "v1alpha1.migration.k8s.io", "v1beta1.core.gardener.cloud"],
        "{stderr}"
    );
    for skipped in ["v1.storagemigration.k8s.io", "v1beta1.storagemigration.k8s.io"] {
        let line = format!(
            "skipping APIService {skipped}: the cluster serves storagemigration.k8s.io itself (APIService \
             v1.storagemigration.k8s.io is local: no spec.service, kube-apiserver's own)"
        );
        assert!(stderr.contains(&line), "{line:?} not in {stderr}");
    }
    c.assert_asked_version_and_apiservices();
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
fn a_server_upgraded_under_names_the_apiservices_to_delete() {
    let mut apiservices = vec![our_apiservice("v1"), our_apiservice("v1beta1")];
    apiservices.extend(our_other_apiservices());
    let c = cluster(37, apiservices);
    let s = c.server(&[]);
    let log = eventually("the warning", Duration::from_secs(30), || {
        let log = s.log();
        log.contains("kubectl delete apiservice v1beta1.storagemigration.k8s.io").then_some(log)
    });
    let warning = log
        .lines()
        .find(|l| l.contains("kubectl delete apiservice v1.storagemigration.k8s.io "))
        .unwrap_or_else(|| panic!("no warning for v1: {log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains(
            "APIService v1.storagemigration.k8s.io of this server hides storagemigration.k8s.io: the cluster \
             (v1.37.0) serves storagemigration.k8s.io/v1 itself (built in from v1.37 on); delete it to hand the \
             group over to kube-apiserver: kubectl delete apiservice v1.storagemigration.k8s.io"
        ),
        "{warning}"
    );
    // Our other groups are not named.
    assert!(!log.contains("kubectl delete apiservice v1alpha1.migration.k8s.io"), "{log}");
    assert_eq!(
        hiding_metric_lines(&s),
        [
            "migration_apiserver_apiservice_hiding_builtin_group{apiservice=\"v1.storagemigration.k8s.io\",group=\"storagemigration.k8s.io\"} 1",
            "migration_apiserver_apiservice_hiding_builtin_group{apiservice=\"v1beta1.storagemigration.k8s.io\",group=\"storagemigration.k8s.io\"} 1",
        ]
    );
    // migration.k8s.io keeps working.
    s.kubectl_ok(&["get", "storagestates.migration.k8s.io"]);
    s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io"]);
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

//! Installing next to what a real cluster (kube-apiserver v1.37.2, `make cluster INTREE=off SERVER=off`) already
//! runs: the deploy kit (`make deploy`, both forms, rendered with DRY_RUN=1) reads the cluster's APIServices and CRDs
//! and leaves a group to whoever serves it, saying why: gardener-apiserver's `core.gardener.cloud` on a garden
//! cluster, kube-storage-version-migrator's CRDs of `migration.k8s.io`.

mod common;
use common::cluster::{Cluster, Options};
use common::deploy_kit::{crds_and_webhook_groups, deployment_args, names_of_kind};
use serde_json::{json, Value};

const GARDENER_OFF: &str = "--runtime-config=core.gardener.cloud/v1alpha1=false,core.gardener.cloud/v1beta1=false";

/// A cluster without the in-tree group (so that every group of ours is up to the kit) and without this server.
fn bare() -> Cluster {
    Cluster::up(Options { in_tree: false, server: false, ..Options::default() })
}

fn apply(c: &Cluster, objects: &[Value]) {
    let stream: String = objects.iter().map(|o| format!("{o}\n")).collect();
    c.kubectl_ok_stdin(&["apply", "-f", "-"], &stream);
}

#[test]
fn on_a_garden_cluster_make_deploy_leaves_core_gardener_cloud_to_gardener_apiserver() {
    let c = bare();
    // gardener-apiserver's APIServices (it serves v1beta1 of core.gardener.cloud only).
    let garden: Vec<Value> = ["core.gardener.cloud", "seedmanagement.gardener.cloud", "settings.gardener.cloud"]
        .iter()
        .map(|g| {
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": format!("v1beta1.{g}")},
                "spec": {"group": g, "version": "v1beta1", "groupPriorityMinimum": 10000, "versionPriority": 15,
                         "insecureSkipTLSVerify": true,
                         "service": {"namespace": "garden", "name": "gardener-apiserver", "port": 443}}})
        })
        .collect();
    apply(&c, &garden);
    let (docs, stderr) = c.render("aggregated");
    assert_eq!(
        names_of_kind(&docs, "APIService"),
        ["v1.storagemigration.k8s.io", "v1alpha1.migration.k8s.io", "v1beta1.storagemigration.k8s.io"],
        "{stderr}"
    );
    // Both versions, although gardener-apiserver registers only v1beta1: a group is never split between servers.
    for version in ["v1alpha1", "v1beta1"] {
        let line = format!(
            "skipping APIService {version}.core.gardener.cloud: APIService v1beta1.core.gardener.cloud registers \
             core.gardener.cloud for another server (Service garden/gardener-apiserver)"
        );
        assert!(stderr.contains(&line), "{line:?} not in {stderr}");
    }
    assert!(stderr.contains(&format!("turning core.gardener.cloud off in the server ({GARDENER_OFF})")), "{stderr}");
    assert!(deployment_args(&docs).contains(&GARDENER_OFF.to_string()), "{:?}", deployment_args(&docs));

    // The CRD form: no ShootState CRD, no webhook rule for the group, the same flag.
    let (docs, stderr) = c.render("crds");
    let (crds, groups) = crds_and_webhook_groups(&docs);
    assert!(!crds.iter().any(|n| n.ends_with(".core.gardener.cloud")), "{crds:?}");
    assert_eq!(groups, ["migration.k8s.io", "storagemigration.k8s.io"], "{stderr}");
    assert!(
        stderr.contains(
            "skipping CustomResourceDefinition shootstates.core.gardener.cloud and its webhook rules: APIService \
             v1beta1.core.gardener.cloud registers core.gardener.cloud for another server"
        ),
        "{stderr}"
    );
    assert!(deployment_args(&docs).contains(&GARDENER_OFF.to_string()));
}

/// A CRD of kube-storage-version-migrator's (its manifests label them with nothing of ours).
fn ksvm_crd(plural: &str, kind: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.migration.k8s.io"), "labels": {"app": "kube-storage-version-migrator"},
                     "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/747"}},
        "spec": {"group": "migration.k8s.io", "scope": "Cluster",
                 "names": {"plural": plural, "kind": kind, "listKind": format!("{kind}List")},
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

#[test]
fn beside_kube_storage_version_migrator_make_deploy_neither_hides_nor_replaces_its_crds() {
    let c = bare();
    apply(
        &c,
        &[ksvm_crd("storageversionmigrations", "StorageVersionMigration"), ksvm_crd("storagestates", "StorageState")],
    );
    for crd in ["storageversionmigrations.migration.k8s.io", "storagestates.migration.k8s.io"] {
        c.kubectl_ok(&["wait", "--for=condition=Established", &format!("crd/{crd}"), "--timeout=60s"]);
    }
    // kube-apiserver keeps an APIService for the CRDs' group, labelled as its own for CRDs.
    common::eventually("kube-apiserver's APIService for the CRDs", std::time::Duration::from_secs(30), || {
        let out = c.kubectl(&["get", "apiservice", "v1alpha1.migration.k8s.io", "-o", "json"]);
        let a: Value = serde_json::from_slice(&out.stdout).ok()?;
        (a["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"] == "true").then_some(())
    });
    let (docs, stderr) = c.render("aggregated");
    let names = names_of_kind(&docs, "APIService");
    assert_eq!(
        names,
        [
            "v1.storagemigration.k8s.io",
            "v1alpha1.core.gardener.cloud",
            "v1beta1.core.gardener.cloud",
            "v1beta1.storagemigration.k8s.io"
        ],
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "skipping APIService v1alpha1.migration.k8s.io: CustomResourceDefinitions that are not this server's \
             serve migration.k8s.io (storagestates.migration.k8s.io, storageversionmigrations.migration.k8s.io; \
             kube-storage-version-migrator installs such CRDs): carry their objects over and delete them first \
             (docs/install/handover.md)"
        ),
        "{stderr}"
    );
    // The server keeps migration.k8s.io (its scheduler's state): only the warning and the gauge say it is elsewhere.
    assert!(!deployment_args(&docs).iter().any(|a| a.starts_with("--runtime-config")), "{stderr}");

    // The CRD form would replace their CRDs with ours: it leaves the group out.
    let (docs, stderr) = c.render("crds");
    let (crds, groups) = crds_and_webhook_groups(&docs);
    assert_eq!(crds, ["shootstates.core.gardener.cloud", "storageversionmigrations.storagemigration.k8s.io"]);
    assert_eq!(groups, ["core.gardener.cloud", "storagemigration.k8s.io"], "{stderr}");
    assert!(
        stderr.contains(
            "skipping CustomResourceDefinition storagestates.migration.k8s.io and its webhook rules: \
             CustomResourceDefinitions that are not this server's"
        ),
        "{stderr}"
    );

    // The hand-over's last steps: their CRDs deleted (kube-apiserver drops its APIService with them), ours next.
    c.kubectl_ok(&["delete", "crd", "storagestates.migration.k8s.io", "storageversionmigrations.migration.k8s.io"]);
    let names = common::eventually("the kit registering every group", std::time::Duration::from_secs(60), || {
        let (docs, _) = c.render("aggregated");
        let names = names_of_kind(&docs, "APIService");
        (names.len() == 5).then_some(names)
    });
    assert_eq!(
        names,
        [
            "v1.storagemigration.k8s.io",
            "v1alpha1.core.gardener.cloud",
            "v1alpha1.migration.k8s.io",
            "v1beta1.core.gardener.cloud",
            "v1beta1.storagemigration.k8s.io"
        ]
    );
}

#[test]
fn a_server_warns_while_a_group_it_serves_is_routed_elsewhere() {
    const ELSEWHERE: &str = "migration_apiserver_apiservice_served_elsewhere";
    let c = Cluster::up(Options { in_tree: false, ..Options::default() });
    // After our registration: gardener-apiserver takes core.gardener.cloud (its v1beta1 only; ours of v1alpha1
    // goes), and kube-storage-version-migrator's CRDs take migration.k8s.io (kube-apiserver registers the group
    // for them once our APIService is gone).
    c.kubectl_ok(&["delete", "apiservice", "v1alpha1.core.gardener.cloud", "v1alpha1.migration.k8s.io"]);
    apply(
        &c,
        &[
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": "v1beta1.core.gardener.cloud"},
                "spec": {"group": "core.gardener.cloud", "version": "v1beta1", "groupPriorityMinimum": 10000, "versionPriority": 15,
                         "insecureSkipTLSVerify": true, "caBundle": null,
                         "service": {"namespace": "garden", "name": "gardener-apiserver", "port": 443}}}),
            ksvm_crd("storageversionmigrations", "StorageVersionMigration"),
            ksvm_crd("storagestates", "StorageState"),
        ],
    );
    common::eventually("kube-apiserver's APIService for the CRDs", std::time::Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "apiservice", "v1alpha1.migration.k8s.io", "-o", "json"]);
        let a: Value = serde_json::from_slice(&out.stdout).ok()?;
        (a["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"] == "true").then_some(())
    });
    // The server checks at its start (and every 10 minutes).
    c.restart("migration-apiserver");
    let log = common::eventually("the warnings", std::time::Duration::from_secs(60), || {
        let log = c.log("migration-apiserver");
        (log.contains("migration.k8s.io is not served by this server")
            && log.contains("core.gardener.cloud is not served"))
        .then_some(log)
    });
    assert!(
        log.contains(
            "core.gardener.cloud is not served by this server in this cluster: APIService v1beta1.core.gardener.cloud \
             registers core.gardener.cloud for another server (Service garden/gardener-apiserver)"
        ),
        "{log}"
    );
    assert_eq!(
        c.server_metric_lines(ELSEWHERE),
        [
            format!("{ELSEWHERE}{{apiservice=\"v1alpha1.migration.k8s.io\",group=\"migration.k8s.io\",served_by=\"customresourcedefinitions\"}} 1"),
            format!("{ELSEWHERE}{{apiservice=\"v1beta1.core.gardener.cloud\",group=\"core.gardener.cloud\",served_by=\"service/garden/gardener-apiserver\"}} 1"),
        ]
    );
    // As `make deploy` runs it in a Gardener landscape: without core.gardener.cloud, which is gardener-apiserver's.
    c.restart_with_args(
        "migration-apiserver",
        "--service-namespace=migration-apiserver",
        &["--service-namespace=migration-apiserver", GARDENER_OFF],
    );
    common::eventually("the check", std::time::Duration::from_secs(60), || {
        let lines = c.server_metric_lines(ELSEWHERE);
        (lines.len() == 1).then_some(())
    });
    let lines = c.server_metric_lines(ELSEWHERE);
    assert!(lines[0].contains("group=\"migration.k8s.io\""), "{lines:?}");
}

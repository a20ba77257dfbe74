//! Installing next to what a real cluster (kube-apiserver v1.37.2, `make cluster INTREE=off SERVER=off`) already
//! runs: the deploy kit (`make deploy`, both forms, rendered with DRY_RUN=1) reads the cluster's APIServices and CRDs
//! and leaves a group to whoever serves it, saying why: gardener-apiserver's `core.gardener.cloud` on a garden
//! cluster, kube-storage-version-migrator's CRDs of `migration.k8s.io`; on a cluster with neither it registers every
//! group and updates its own. The server, in cluster mode, warns and exports
//! `migration_apiserver_apiservice_served_elsewhere` while a group it serves is routed to someone else, and counts
//! nothing while none is. docs/install/handover.md's carry-over from kube-storage-version-migrator runs as written.

mod common;
use common::cluster::{Cluster, Options};
use common::deploy_kit::{crds_and_webhook_groups, deployment_args, names_of_kind};
use serde_json::{json, Value};
use std::time::Duration;

const GARDENER_OFF: &str = "--runtime-config=core.gardener.cloud/v1alpha1=false,core.gardener.cloud/v1beta1=false";

/// A cluster without the in-tree group (so that every group of ours is up to the kit) and without this server.
fn bare() -> Cluster {
    Cluster::up(Options { in_tree: false, server: false, ..Options::default() })
}

/// Every APIService of ours, as `make deploy` registers them on a cluster with neither.
const EVERY_APISERVICE: [&str; 5] = [
    "v1.storagemigration.k8s.io",
    "v1alpha1.core.gardener.cloud",
    "v1alpha1.migration.k8s.io",
    "v1beta1.core.gardener.cloud",
    "v1beta1.storagemigration.k8s.io",
];

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
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

/// Installs kube-storage-version-migrator's CRDs and waits until kube-apiserver serves them and registered their
/// group for them (its own APIService, labelled automanaged).
fn install_ksvm_crds(c: &Cluster) {
    apply(
        c,
        &[ksvm_crd("storageversionmigrations", "StorageVersionMigration"), ksvm_crd("storagestates", "StorageState")],
    );
    for crd in ["storageversionmigrations.migration.k8s.io", "storagestates.migration.k8s.io"] {
        c.kubectl_ok(&["wait", "--for=condition=Established", &format!("crd/{crd}"), "--timeout=60s"]);
    }
    automanaged_apiservice(c, "v1alpha1.migration.k8s.io");
}

/// Waits until kube-apiserver registered the APIService `name` for CRDs (labelled automanaged).
fn automanaged_apiservice(c: &Cluster, name: &str) {
    common::eventually(&format!("kube-apiserver's APIService {name} for the CRDs"), Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "apiservice", name, "-o", "json"]);
        let a: Value = serde_json::from_slice(&out.stdout).ok()?;
        (a["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"] == "true").then_some(())
    });
}

#[test]
fn beside_kube_storage_version_migrator_make_deploy_neither_hides_nor_replaces_its_crds() {
    let c = bare();
    // kube-apiserver keeps an APIService for the CRDs' group, labelled as its own for CRDs.
    install_ksvm_crds(&c);
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
    let names = common::eventually("the kit registering every group", Duration::from_secs(60), || {
        let (docs, _) = c.render("aggregated");
        let names = names_of_kind(&docs, "APIService");
        (names.len() == 5).then_some(names)
    });
    assert_eq!(names, EVERY_APISERVICE);
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
    common::eventually("kube-apiserver's APIService for the CRDs", Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "apiservice", "v1alpha1.migration.k8s.io", "-o", "json"]);
        let a: Value = serde_json::from_slice(&out.stdout).ok()?;
        (a["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"] == "true").then_some(())
    });
    // The server checks at its start (and every 10 minutes).
    c.restart("migration-apiserver");
    let log = common::eventually("the warnings", Duration::from_secs(60), || {
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
    common::eventually("the check", Duration::from_secs(60), || {
        let lines = c.server_metric_lines(ELSEWHERE);
        (lines.len() == 1).then_some(())
    });
    let lines = c.server_metric_lines(ELSEWHERE);
    assert!(lines[0].contains("group=\"migration.k8s.io\""), "{lines:?}");
}

#[test]
fn on_a_cluster_with_neither_make_deploy_registers_every_group_and_updates_its_own() {
    let c = bare();
    let (docs, stderr) = c.render("aggregated");
    eprintln!("make deploy on a cluster with neither says:\n{stderr}");
    assert_eq!(names_of_kind(&docs, "APIService"), EVERY_APISERVICE, "{stderr}");
    assert!(!stderr.contains("skipping") && !stderr.contains("turning"), "{stderr}");
    assert!(!deployment_args(&docs).iter().any(|a| a.starts_with("--runtime-config")));
    // The CRD form installs every CRD, labelled as ours.
    let (crd_docs, stderr) = c.render("crds");
    let crds: Vec<Value> = crd_docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").cloned().collect();
    assert_eq!(crds.len(), 4, "{stderr}");
    for crd in &crds {
        assert_eq!(crd["metadata"]["labels"]["app.kubernetes.io/name"], "migration-apiserver", "{crd}");
    }

    // Deployed (the kit's APIServices applied): ours again is no reason to skip, the next `make deploy` updates it.
    // Except, as documented, storagemigration.k8s.io's on a release that serves the group: with ours in the place
    // of kube-apiserver's APIService, nothing tells whether the group is turned off (IN_TREE_GROUPS=register says).
    let apiservices: Vec<Value> = docs.iter().filter(|d| d["kind"] == "APIService").cloned().collect();
    apply(&c, &apiservices);
    let (docs, stderr) = c.render("aggregated");
    let ours_elsewhere: Vec<&str> =
        EVERY_APISERVICE.into_iter().filter(|n| !n.ends_with(".storagemigration.k8s.io")).collect();
    assert_eq!(names_of_kind(&docs, "APIService"), ours_elsewhere, "{stderr}");
    for version in ["v1", "v1beta1"] {
        let line = format!(
            "skipping APIService {version}.storagemigration.k8s.io: the cluster (v1.37.2) serves \
             storagemigration.k8s.io/v1 itself (built in from v1.37 on)"
        );
        assert!(stderr.contains(&line), "{line:?} not in {stderr}");
    }
    assert_eq!(stderr.matches("skipping").count(), 2, "{stderr}");

    // Deployed in the CRD form instead: the CRD form updates our CRDs, and they are in the aggregated form's way.
    let mut delete = vec!["delete", "apiservice"];
    delete.extend(EVERY_APISERVICE);
    c.kubectl_ok(&delete);
    apply(&c, &crds);
    for crd in names_of_kind(&crds, "CustomResourceDefinition") {
        c.kubectl_ok(&["wait", "--for=condition=Established", &format!("crd/{crd}"), "--timeout=60s"]);
    }
    automanaged_apiservice(&c, "v1alpha1.migration.k8s.io");
    // Again but for storagemigration.k8s.io's: the APIService kube-apiserver made for our CRD sits in the place of
    // its built-in one.
    let (docs, stderr) = c.render("crds");
    let ours_elsewhere: Vec<String> = names_of_kind(&crds, "CustomResourceDefinition")
        .into_iter()
        .filter(|n| !n.ends_with(".storagemigration.k8s.io"))
        .collect();
    assert_eq!(names_of_kind(&docs, "CustomResourceDefinition"), ours_elsewhere, "{stderr}");
    let line = "skipping CustomResourceDefinition storageversionmigrations.storagemigration.k8s.io and its webhook \
                rules: the cluster (v1.37.2) serves storagemigration.k8s.io/v1 itself (built in from v1.37 on)";
    assert!(stderr.contains(line), "{line:?} not in {stderr}");
    assert_eq!(stderr.matches("skipping").count(), 1, "{stderr}");
    let (_, stderr) = c.render("aggregated");
    assert!(
        stderr.contains(
            "skipping APIService v1alpha1.migration.k8s.io: this server's CustomResourceDefinitions (the CRD form: \
             storagestates.migration.k8s.io, storageversionmigrations.migration.k8s.io) serve migration.k8s.io"
        ),
        "{stderr}"
    );
}

/// The sh block after `<!-- handover: <name> -->` in docs/install/handover.md (inside a list item: indented 3).
fn handover_block(name: &str) -> String {
    let doc = std::fs::read_to_string(common::repo().join("docs/install/handover.md")).expect("handover.md");
    let rest = &doc[doc.find(&format!("<!-- handover: {name} -->")).expect("marker")..];
    let start = rest.find("```sh\n").expect("sh block") + "```sh\n".len();
    let end = start + rest[start..].find("```").expect("block end");
    rest[start..end].lines().map(|l| l.strip_prefix("   ").unwrap_or(l)).collect::<Vec<_>>().join("\n")
}

/// Runs `script` in `dir` with bash, as `kubeconfig`'s user and with the cluster's kubectl first on the PATH.
fn bash(dir: &std::path::Path, kubeconfig: &std::path::Path, script: &str) {
    let path = format!("{}:{}", common::cluster::kube_bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path)
        .output()
        .expect("bash");
    assert!(out.status.success(), "{script}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// docs/install/handover.md's steps from kube-storage-version-migrator, as written: its StorageStates (in its
/// CRDs, in kube-apiserver) exported, its CRDs deleted, `make deploy` again, the StorageStates imported into this
/// server through the aggregator.
#[test]
fn the_documented_carry_over_from_kube_storage_version_migrator_keeps_the_storage_states() {
    // This server without its scheduler, so that what is compared is what was carried over, not what the trigger
    // made of it since.
    let c = Cluster::up(Options { server_args: vec!["--disable-scheduler".into()], ..Options::default() });
    // Registered by the kit on a cluster with neither (and the in-tree group left to kube-apiserver): every group is
    // routed to this server or absent, and the server counts nothing.
    common::eventually("the check", Duration::from_secs(60), || {
        c.log("migration-apiserver").contains("every group this server serves is routed to it or absent").then_some(())
    });
    for family in
        ["migration_apiserver_apiservice_served_elsewhere", "migration_apiserver_apiservice_hiding_builtin_group"]
    {
        assert_eq!(c.server_metric_lines(family), Vec::<String>::new(), "{family}");
    }
    // Before: kube-storage-version-migrator serves migration.k8s.io with its CRDs, where its trigger keeps the
    // StorageStates.
    c.kubectl_ok(&["delete", "apiservice", "v1alpha1.migration.k8s.io"]);
    install_ksvm_crds(&c);
    let persisted = json!(["OldHash0001=", "NewHash0002="]);
    const NAMES: [&str; 2] = ["shootstates.core.gardener.cloud", "deployments.apps"];
    for name in NAMES {
        let (resource, group) = name.split_once('.').expect("name");
        let manifest = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
                              "metadata": {"name": name}, "spec": {"resource": {"group": group, "resource": resource}}});
        c.kubectl_ok_stdin(&["create", "-f", "-"], &manifest.to_string());
        let status = json!({"status": {"currentStorageVersionHash": "NewHash0002=", "persistedStorageVersionHashes": persisted}});
        let status = status.to_string();
        c.kubectl_ok(&[
            "patch",
            "storagestates.migration.k8s.io",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ]);
    }

    // 1. The export.
    let dir = tempfile::tempdir().expect("tempdir");
    bash(dir.path(), &c.admin(), &handover_block("ksvm-export"));
    // 2. Their CRDs deleted; kube-apiserver drops its APIService with the last one.
    c.kubectl_ok(&["delete", "crd", "storagestates.migration.k8s.io", "storageversionmigrations.migration.k8s.io"]);
    common::eventually("kube-apiserver to drop its APIService", Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "apiservice", "v1alpha1.migration.k8s.io"]);
        String::from_utf8_lossy(&out.stderr).contains("NotFound").then_some(())
    });
    // 3. `make deploy` again registers the group for this server.
    let stderr = c.deploy();
    assert!(!stderr.contains("skipping APIService v1alpha1.migration.k8s.io"), "{stderr}");
    c.kubectl_ok(&["wait", "--for=condition=Available", "apiservice/v1alpha1.migration.k8s.io", "--timeout=60s"]);
    // 4. The import, through kube-apiserver's aggregator to this server.
    bash(dir.path(), &c.admin(), &handover_block("ksvm-import"));
    for name in NAMES {
        let ss = c.kubectl_json(&["get", "storagestates.migration.k8s.io", name, "-o", "json"]);
        assert_eq!(ss["status"]["persistedStorageVersionHashes"], persisted, "{ss}");
        assert_eq!(ss["status"]["currentStorageVersionHash"], "NewHash0002=", "{ss}");
        assert_eq!(ss["spec"]["resource"]["group"], name.split_once('.').expect("name").1, "{ss}");
    }
    // Served by this server now: the group's APIService is the kit's, and no CRD of the group is left.
    let apiservice = c.kubectl_json(&["get", "apiservice", "v1alpha1.migration.k8s.io", "-o", "json"]);
    assert_eq!(apiservice["spec"]["service"]["name"], "migration-apiserver", "{apiservice}");
    let crds = c.kubectl_ok(&["get", "crd", "-o", "name"]);
    assert!(!crds.contains("migration.k8s.io"), "{crds}");
}

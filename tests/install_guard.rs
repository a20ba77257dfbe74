//! Installing next to what a cluster already runs: `make deploy` (both forms) registers a group of ours only where
//! the group is absent or already ours, and says why it skips one; the server, in cluster mode, warns and exports
//! `migration_apiserver_apiservice_served_elsewhere` while a group it serves is routed to someone else.
//!
//! Three clusters (the stand-in of tests/common/deploy_kit.rs): a Gardener garden, where gardener-apiserver
//! serves `core.gardener.cloud`; one with kube-storage-version-migrator's CRDs of `migration.k8s.io`; and one with
//! neither. The deploy kit's decisions on the first two, and the server's warning while a group is routed elsewhere,
//! are tests/cluster_install_guard.rs's, against a real kube-apiserver; `storagemigration.k8s.io`, which
//! kube-apiserver may serve itself, is tests/cluster_intree.rs's and tests/storagemigration_safety.rs's.

mod common;
use common::deploy_kit::{deployment_args, local_apiservice, metric_lines, names_of_kind, service_apiservice, Cluster};
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const ELSEWHERE: &str = "migration_apiserver_apiservice_served_elsewhere";
const EVERY_APISERVICE: [&str; 5] = [
    "v1.storagemigration.k8s.io",
    "v1alpha1.core.gardener.cloud",
    "v1alpha1.migration.k8s.io",
    "v1beta1.core.gardener.cloud",
    "v1beta1.storagemigration.k8s.io",
];

/// Ours, all five, as `make deploy` registers them.
fn our_apiservices() -> Vec<Value> {
    EVERY_APISERVICE
        .iter()
        .map(|n| {
            let (version, group) = n.split_once('.').expect("name");
            service_apiservice(group, version, "migration-apiserver", "migration-apiserver", 1000)
        })
        .collect()
}

#[test]
fn on_a_cluster_with_neither_make_deploy_registers_every_group_and_updates_its_own() {
    let c = Cluster::start(34, vec![local_apiservice("apps", "v1", "onstart", 17800, 15)], vec![]);
    let (docs, stderr) = c.render("aggregated");
    eprintln!("make deploy on a cluster with neither says:\n{stderr}");
    assert_eq!(names_of_kind(&docs, "APIService"), EVERY_APISERVICE, "{stderr}");
    assert!(!stderr.contains("skipping") && !stderr.contains("turning"), "{stderr}");
    assert!(!deployment_args(&docs).iter().any(|a| a.starts_with("--runtime-config")));
    // The CRD form installs every CRD, labelled as ours.
    let (docs, stderr) = c.render("crds");
    let crds: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").collect();
    assert_eq!(crds.len(), 4, "{stderr}");
    for crd in &crds {
        assert_eq!(crd["metadata"]["labels"]["app.kubernetes.io/name"], "migration-apiserver", "{crd}");
    }

    // Deployed: ours again is no reason to skip (the next `make deploy` updates it).
    c.view.lock().unwrap().apiservices = our_apiservices();
    let (names, stderr) = c.apiservices_to_register();
    assert_eq!(names, EVERY_APISERVICE, "{stderr}");
    // Our CRDs (the CRD form) are updated by the CRD form, and in the way of the aggregated one.
    {
        let mut view = c.view.lock().unwrap();
        view.apiservices = vec![local_apiservice("migration.k8s.io", "v1alpha1", "true", 1000, 15)];
        view.crds = crds.iter().map(|c| (*c).clone()).collect();
    }
    let (docs, stderr) = c.render("crds");
    assert_eq!(names_of_kind(&docs, "CustomResourceDefinition").len(), 4, "{stderr}");
    assert!(!stderr.contains("skipping"), "{stderr}");
    let (_, stderr) = c.apiservices_to_register();
    assert!(
        stderr.contains(
            "skipping APIService v1alpha1.migration.k8s.io: this server's CustomResourceDefinitions (the CRD form: \
             storagestates.migration.k8s.io, storageversionmigrations.migration.k8s.io) serve migration.k8s.io"
        ),
        "{stderr}"
    );
}

#[test]
fn a_server_on_a_cluster_with_neither_counts_nothing() {
    let c = Cluster::start(34, our_apiservices(), vec![]);
    let s = c.server(&[]);
    eventually("the check", Duration::from_secs(30), || {
        s.log().contains("every group this server serves is routed to it or absent").then_some(())
    });
    assert!(metric_lines(&s, ELSEWHERE).is_empty());
}

#[test]
fn runtime_config_that_would_break_the_server_is_refused_at_start() {
    for (flag, message) in [
        (
            "core.gardener.cloud/v1beta1=false",
            "--runtime-config: core.gardener.cloud is turned off for v1beta1 but not for v1alpha1: this server serves a group whole or not at all",
        ),
        (
            "migration.k8s.io/v1alpha1=false",
            "--runtime-config: migration.k8s.io cannot be turned off while the scheduler runs (it records its StorageStates and StorageVersionMigrations there); add --disable-scheduler",
        ),
        ("apps/v1=false", "--runtime-config: this server serves no apps/v1 (it serves "),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new(BIN)
            .args(["serve", "--secure-port", "0", "--runtime-config", flag, "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--cert-dir")
            .arg(dir.path().join("certs"))
            .output()
            .expect("serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(message), "{flag}: {stderr}");
        assert!(!dir.path().join("data").exists(), "{flag}: refused before the store is created");
    }
}

/// The sh block after `<!-- handover: <name> -->` in docs/install/handover.md (inside a list item: indented 3).
fn handover_block(name: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/install/handover.md")).expect("handover.md");
    let rest = &doc[doc.find(&format!("<!-- handover: {name} -->")).expect("marker")..];
    let start = rest.find("```sh\n").expect("sh block") + "```sh\n".len();
    let end = start + rest[start..].find("```").expect("block end");
    rest[start..end].lines().map(|l| l.strip_prefix("   ").unwrap_or(l)).collect::<Vec<_>>().join("\n")
}

fn bash(dir: &std::path::Path, kubeconfig: &std::path::Path, script: &str) {
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("bash");
    assert!(out.status.success(), "{script}\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_documented_carry_over_from_kube_storage_version_migrator_keeps_the_storage_states() {
    // The old installation's API (a server holding StorageStates as kube-storage-version-migrator's CRDs would),
    // and ours, just registered; no scheduler on either, so that what is compared is what was carried over.
    let old = Server::start(&["--disable-scheduler"]);
    let ours = Server::start(&["--disable-scheduler"]);
    let persisted = json!(["OldHash0001=", "NewHash0002="]);
    for name in ["shootstates.core.gardener.cloud", "deployments.apps"] {
        let (resource, group) = name.split_once('.').expect("name");
        let manifest = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
                              "metadata": {"name": name}, "spec": {"resource": {"group": group, "resource": resource}}});
        old.kubectl_ok_stdin(&["create", "-f", "-"], &manifest.to_string());
        let status = json!({"status": {"currentStorageVersionHash": "NewHash0002=", "persistedStorageVersionHashes": persisted}});
        old.kubectl_ok(&[
            "patch",
            "storagestates.migration.k8s.io",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    bash(dir.path(), &old.kubeconfig(), &handover_block("ksvm-export"));
    bash(dir.path(), &ours.kubeconfig(), &handover_block("ksvm-import"));
    for name in ["shootstates.core.gardener.cloud", "deployments.apps"] {
        let ss = ours.kubectl_json(&["get", "storagestates.migration.k8s.io", name, "-o", "json"]);
        assert_eq!(ss["status"]["persistedStorageVersionHashes"], persisted, "{ss}");
        assert_eq!(ss["status"]["currentStorageVersionHash"], "NewHash0002=", "{ss}");
        assert_eq!(ss["spec"]["resource"]["group"], name.split_once('.').expect("name").1, "{ss}");
    }
}

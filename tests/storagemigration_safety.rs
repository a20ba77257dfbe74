//! Cluster safety for `storagemigration.k8s.io`, which kube-apiserver serves itself from 1.37 (or earlier with
//! `--runtime-config`): the deploy kit registers our APIServices of that group only where the cluster does not
//! serve it, and says why it skips; a server whose APIService hides the cluster's own group (the cluster was
//! upgraded under it) warns, naming the APIService to delete, and exports
//! `migration_apiserver_apiservice_hiding_builtin_group`.
//!
//! kube-apiserver cannot run here: the cluster is our fault proxy (tests/common/proxy.rs) in front of a real
//! migration-apiserver, answering itself what this needs of kube-apiserver: `/version` and the APIService list
//! (`apiregistration.k8s.io/v1`). The deploy kit runs as `make deploy` runs it (scripts/deploy.sh, DRY_RUN=1,
//! the cluster of the current kubectl context through KUBECONFIG).

mod common;
use common::proxy::Proxy;
use common::*;
use serde_json::{json, Value};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const GROUP: &str = "storagemigration.k8s.io";

/// What the stand-in answers for `/version` and the APIService list.
struct ClusterView {
    minor: u32,
    apiservices: Vec<Value>,
}

/// A local APIService, as kube-apiserver's autoregister creates it for a group version it serves itself.
fn local_apiservice(version: &str, group_priority: i64, version_priority: i64) -> Value {
    json!({
        "metadata": {"name": format!("{version}.{GROUP}"),
                     "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
        "spec": {"group": GROUP, "version": version,
                 "groupPriorityMinimum": group_priority, "versionPriority": version_priority},
    })
}

/// Ours, as `make deploy` registered it on the older cluster.
fn our_apiservice(version: &str) -> Value {
    json!({
        "metadata": {"name": format!("{version}.{GROUP}")},
        "spec": {"group": GROUP, "version": version, "groupPriorityMinimum": 15800, "versionPriority": 15,
                 "service": {"namespace": "migration-apiserver", "name": "migration-apiserver", "port": 443}},
    })
}

/// Our other groups' APIServices, always present once deployed.
fn our_other_apiservices() -> Vec<Value> {
    ["v1alpha1.migration.k8s.io", "v1beta1.core.gardener.cloud", "v1alpha1.core.gardener.cloud"]
        .iter()
        .map(|name| {
            let (version, group) = name.split_once('.').expect("name");
            json!({"metadata": {"name": name},
                   "spec": {"group": group, "version": version, "groupPriorityMinimum": 1000, "versionPriority": 15,
                            "service": {"namespace": "migration-apiserver", "name": "migration-apiserver"}}})
        })
        .collect()
}

struct Cluster {
    _target: Server,
    proxy: Proxy,
}

/// The stand-in: a 1.<minor> cluster with these APIServices.
fn cluster(minor: u32, apiservices: Vec<Value>) -> Cluster {
    let target = Server::start(&[]);
    let proxy = Proxy::start(&target);
    let view = Arc::new(Mutex::new(ClusterView { minor, apiservices }));
    proxy.serve_locally(move |r, _body| {
        let view = view.lock().unwrap();
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/version") => Some((
                200,
                json!({"major": "1", "minor": view.minor.to_string(),
                       "gitVersion": format!("v1.{}.0", view.minor), "gitCommit": "0123456789abcdef",
                       "gitTreeState": "clean", "buildDate": "2026-08-01T00:00:00Z", "goVersion": "go1.25.0",
                       "compiler": "gc", "platform": "linux/amd64"}),
            )),
            ("GET", "/apis/apiregistration.k8s.io/v1/apiservices") => Some((
                200,
                json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIServiceList",
                       "metadata": {"resourceVersion": "42"}, "items": view.apiservices}),
            )),
            _ => None,
        }
    });
    Cluster { _target: target, proxy }
}

/// `DRY_RUN=1 scripts/deploy.sh` against the cluster: the APIServices it would apply, and its stderr.
fn deploy_dry_run(cluster: &Cluster) -> (Vec<String>, String) {
    let (docs, stderr) = render(cluster, "aggregated");
    (names_of_kind(&docs, "APIService"), stderr)
}

/// The sorted names of the objects of `kind` in `docs`.
fn names_of_kind(docs: &[Value], kind: &str) -> Vec<String> {
    let mut names: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| d["metadata"]["name"].as_str().expect("name").to_string())
        .collect();
    names.sort();
    names
}

/// `DRY_RUN=1 FORM=<form> scripts/deploy.sh` against the cluster: the objects it would apply, and its stderr.
fn render(cluster: &Cluster, form: &str) -> (Vec<Value>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let out = Command::new(BIN).args(["certs", "--cert-dir"]).arg(&certs).output().expect("certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("bash")
        .arg(repo().join("scripts/deploy.sh"))
        .env("CERT_DIR", &certs)
        .env("DRY_RUN", "1")
        .env("KUBECONFIG", cluster.proxy.kubeconfig())
        .env("MIGRATION_APISERVER", BIN)
        .env("FORM", form)
        .env_remove("IN_TREE_GROUPS")
        .output()
        .expect("deploy.sh");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "deploy.sh: {stderr}");
    let stdout = String::from_utf8(out.stdout).expect("utf8");
    let docs = stdout.split("\n---\n").map(|d| serde_yaml_ng::from_str::<Value>(d).expect("YAML")).collect();
    (docs, stderr)
}

/// The CRDs a CRD-form rendering installs, and the groups its webhook configurations' rules name.
fn crds_and_webhook_groups(docs: &[Value]) -> (Vec<String>, Vec<String>) {
    let crds = names_of_kind(docs, "CustomResourceDefinition");
    let mut groups: Vec<String> = docs
        .iter()
        .filter(|d| d["metadata"]["name"] == "migration-apiserver")
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")))
        .flat_map(|d| d["webhooks"].as_array().cloned().unwrap_or_default())
        .flat_map(|w| w["rules"].as_array().cloned().unwrap_or_default())
        .flat_map(|r| r["apiGroups"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g.as_str().map(String::from))
        .collect();
    groups.sort();
    groups.dedup();
    (crds, groups)
}

#[test]
fn the_crd_form_leaves_out_the_group_where_the_cluster_serves_it() {
    let all = ["core.gardener.cloud", "migration.k8s.io", "storagemigration.k8s.io"];
    // 1.34: every CRD, and webhook rules for every group.
    let (docs, stderr) = render(&cluster(34, vec![]), "crds");
    let (crds, groups) = crds_and_webhook_groups(&docs);
    assert_eq!(crds.len(), 4, "{crds:?}");
    assert!(crds.contains(&format!("storageversionmigrations.{GROUP}")), "{crds:?}");
    assert_eq!(groups, all, "{stderr}");
    assert!(!stderr.contains("skipping"), "{stderr}");
    // ... also when our CRDs are already there (kube-apiserver keeps an APIService labelled for CRDs).
    let mut crd_apiservice = local_apiservice("v1", 1000, 15);
    crd_apiservice["metadata"]["labels"] = json!({"kube-aggregator.kubernetes.io/automanaged": "true"});
    let (docs, stderr) = render(&cluster(34, vec![crd_apiservice]), "crds");
    assert_eq!(crds_and_webhook_groups(&docs), (crds.clone(), groups.clone()), "{stderr}");
    // 1.37 serving the group: neither its CRD nor webhook rules that would sit in the way of the built-in API.
    let c = cluster(37, vec![local_apiservice("v1", 15800, 15)]);
    let (docs, stderr) = render(&c, "crds");
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
    assert_asked_version_and_apiservices(&c);
}

/// The deploy kit asked the cluster exactly what its RBAC-free and RBAC'd reads are: /version and a list.
fn assert_asked_version_and_apiservices(cluster: &Cluster) {
    let asked: Vec<(String, String)> = cluster.proxy.records().into_iter().map(|r| (r.method, r.path)).collect();
    assert!(asked.contains(&("GET".into(), "/version".into())), "{asked:?}");
    assert!(asked.contains(&("GET".into(), "/apis/apiregistration.k8s.io/v1/apiservices".into())), "{asked:?}");
}

#[test]
fn deploy_kit_registers_ours_on_a_1_34_cluster_without_the_group() {
    let c = cluster(34, vec![]);
    let (names, stderr) = deploy_dry_run(&c);
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
    assert_asked_version_and_apiservices(&c);
}

#[test]
fn deploy_kit_skips_the_group_on_a_1_37_cluster_and_says_why() {
    let mut apiservices = vec![local_apiservice("v1", 15800, 15)];
    apiservices.extend(our_other_apiservices());
    let c = cluster(37, apiservices);
    let (names, stderr) = deploy_dry_run(&c);
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
    assert_asked_version_and_apiservices(&c);
}

#[test]
fn deploy_kit_skips_the_group_on_1_37_by_its_version_alone() {
    // Before kube-apiserver's autoregister created its APIService (or with ours in the way): the release says it.
    let c = cluster(37, vec![]);
    let (names, stderr) = deploy_dry_run(&c);
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
    let (names, stderr) = deploy_dry_run(&c);
    assert!(!names.iter().any(|n| n.ends_with(GROUP)), "{names:?}");
    assert!(stderr.contains("(APIService v1beta1.storagemigration.k8s.io is local: no spec.service"), "{stderr}");
}

/// A server in cluster mode (the stand-in as its --kubeconfig) whose APIServices are `apiservices`.
fn server_on(c: &Cluster) -> Server {
    let kubeconfig = c.proxy.kubeconfig();
    Server::start(&["--kubeconfig", kubeconfig.to_str().expect("path"), "--disable-scheduler"])
}

fn hiding_metric_lines(s: &Server) -> Vec<String> {
    s.kubectl_ok(&["get", "--raw", "/metrics"])
        .lines()
        .filter(|l| l.starts_with("migration_apiserver_apiservice_hiding_builtin_group{"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_server_upgraded_under_names_the_apiservices_to_delete() {
    let mut apiservices = vec![our_apiservice("v1"), our_apiservice("v1beta1")];
    apiservices.extend(our_other_apiservices());
    let c = cluster(37, apiservices);
    let s = server_on(&c);
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
    let mut lines = hiding_metric_lines(&s);
    lines.sort();
    assert_eq!(
        lines,
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
    let s = server_on(&c);
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
    let proxy = Proxy::start(&target);
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

//! A cluster for the deploy kit and the server's cluster check: our fault proxy (tests/common/proxy.rs) in front of
//! a real migration-apiserver, answering itself what they need of kube-apiserver: `/version`, the APIService list
//! (`apiregistration.k8s.io/v1`) and the CustomResourceDefinitions (`apiextensions.k8s.io/v1`: list, get,
//! delete). The deploy kit runs as `make deploy` runs it (scripts/deploy.sh, DRY_RUN=1, the cluster of the current
//! kubectl context through KUBECONFIG).

use super::proxy::Proxy;
use super::{repo, Server, BIN};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// What the stand-in answers for `/version`, the APIServices and the CRDs.
pub struct ClusterView {
    pub minor: u32,
    pub apiservices: Vec<Value>,
    pub crds: Vec<Value>,
}

pub struct Cluster {
    _target: Server,
    pub proxy: Proxy,
    pub view: Arc<Mutex<ClusterView>>,
}

/// An APIService of `<version>.<group>` for a Service `namespace/name`.
pub fn service_apiservice(group: &str, version: &str, namespace: &str, name: &str, priority: i64) -> Value {
    json!({
        "metadata": {"name": format!("{version}.{group}")},
        "spec": {"group": group, "version": version, "groupPriorityMinimum": priority, "versionPriority": 15,
                 "service": {"namespace": namespace, "name": name, "port": 443}},
    })
}

/// A local APIService labelled as kube-apiserver's autoregister labels it: `onstart` for a built-in group version,
/// `true` for a group of CRDs.
pub fn local_apiservice(
    group: &str,
    version: &str,
    automanaged: &str,
    group_priority: i64,
    version_priority: i64,
) -> Value {
    json!({
        "metadata": {"name": format!("{version}.{group}"),
                     "labels": {"kube-aggregator.kubernetes.io/automanaged": automanaged}},
        "spec": {"group": group, "version": version,
                 "groupPriorityMinimum": group_priority, "versionPriority": version_priority},
    })
}

/// A CRD `<plural>.<group>` with these labels.
pub fn crd(plural: &str, group: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"), "labels": labels},
        "spec": {"group": group, "scope": "Cluster",
                 "names": {"plural": plural, "kind": plural, "listKind": format!("{plural}List")},
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true}]},
    })
}

impl Cluster {
    /// The stand-in: a 1.<minor> cluster with these APIServices and CRDs.
    pub fn start(minor: u32, apiservices: Vec<Value>, crds: Vec<Value>) -> Cluster {
        let target = Server::start(&[]);
        let proxy = Proxy::start(&target);
        let view = Arc::new(Mutex::new(ClusterView { minor, apiservices, crds }));
        let served = view.clone();
        proxy.serve_locally(move |r, _body| {
            const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
            let mut view = served.lock().unwrap();
            let crd_named = |name: &str| r.path == format!("{CRDS}/{name}");
            let not_found = |name: &str| {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                       "message": format!("customresourcedefinitions.apiextensions.k8s.io \"{name}\" not found")})
            };
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
                ("GET", CRDS) => Some((
                    200,
                    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinitionList",
                           "metadata": {"resourceVersion": "42"}, "items": view.crds}),
                )),
                ("GET", path) if path.starts_with(CRDS) => {
                    let name = path.rsplit('/').next().unwrap_or_default();
                    Some(match view.crds.iter().find(|c| crd_named(c["metadata"]["name"].as_str().unwrap_or(""))) {
                        Some(c) => (200, c.clone()),
                        None => (404, not_found(name)),
                    })
                }
                ("DELETE", path) if path.starts_with(CRDS) => {
                    let name = path.rsplit('/').next().unwrap_or_default().to_string();
                    let at = view.crds.iter().position(|c| c["metadata"]["name"] == name.as_str());
                    Some(match at {
                        Some(at) => {
                            let gone = view.crds.remove(at);
                            // kube-apiserver's crdregistration drops its APIService with the group's last CRD.
                            let group = gone["spec"]["group"].clone();
                            if !view.crds.iter().any(|c| c["spec"]["group"] == group) {
                                view.apiservices.retain(|a| {
                                    a["spec"]["group"] != group
                                        || a["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"]
                                            != "true"
                                });
                            }
                            (200, gone)
                        }
                        None => (404, not_found(&name)),
                    })
                }
                _ => None,
            }
        });
        Cluster { _target: target, proxy, view }
    }

    /// A server in cluster mode (the stand-in as its --kubeconfig), without the scheduler, with `extra` flags.
    pub fn server(&self, extra: &[&str]) -> Server {
        let kubeconfig = self.proxy.kubeconfig();
        let mut args = vec!["--kubeconfig", kubeconfig.to_str().expect("path"), "--disable-scheduler"];
        args.extend_from_slice(extra);
        Server::start(&args)
    }

    /// `DRY_RUN=1 FORM=<form> scripts/deploy.sh` against the cluster: the objects it would apply, and its stderr.
    pub fn render(&self, form: &str) -> (Vec<Value>, String) {
        render(&self.proxy.kubeconfig(), None, form)
    }

    /// The APIServices the aggregated form would apply, and the deploy kit's stderr.
    pub fn apiservices_to_register(&self) -> (Vec<String>, String) {
        let (docs, stderr) = self.render("aggregated");
        (names_of_kind(&docs, "APIService"), stderr)
    }

    /// The deploy kit asked the cluster /version and the APIService list.
    pub fn assert_asked_version_and_apiservices(&self) {
        let asked: Vec<(String, String)> = self.proxy.records().into_iter().map(|r| (r.method, r.path)).collect();
        assert!(asked.contains(&("GET".into(), "/version".into())), "{asked:?}");
        assert!(asked.contains(&("GET".into(), "/apis/apiregistration.k8s.io/v1/apiservices".into())), "{asked:?}");
    }
}

/// The sorted names of the objects of `kind` in `docs`.
pub fn names_of_kind(docs: &[Value], kind: &str) -> Vec<String> {
    let mut names: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| d["metadata"]["name"].as_str().expect("name").to_string())
        .collect();
    names.sort();
    names
}

/// The CRDs a CRD-form rendering installs, and the groups its webhook configurations' rules name.
pub fn crds_and_webhook_groups(docs: &[Value]) -> (Vec<String>, Vec<String>) {
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

/// The args of the rendered Deployment's server container.
pub fn deployment_args(docs: &[Value]) -> Vec<String> {
    let d = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "migration-apiserver")
        .expect("the Deployment");
    d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string())
        .collect()
}

/// The lines of `/metrics` of `family`.
pub fn metric_lines(s: &Server, family: &str) -> Vec<String> {
    let prefix = format!("{family}{{");
    let mut lines: Vec<String> = s
        .kubectl_ok(&["get", "--raw", "/metrics"])
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// `DRY_RUN=1 FORM=<form> scripts/deploy.sh` against the cluster of `kubeconfig`, with fresh certificates and, when
/// given, `kubectl_dir` first on the PATH (the real cluster's kubectl): the objects it would apply, and its stderr.
pub fn render(kubeconfig: &Path, kubectl_dir: Option<&Path>, form: &str) -> (Vec<Value>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let out = Command::new(BIN).args(["certs", "--cert-dir"]).arg(&certs).output().expect("certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut deploy = Command::new("bash");
    deploy
        .arg(repo().join("scripts/deploy.sh"))
        .env("CERT_DIR", &certs)
        .env("DRY_RUN", "1")
        .env("KUBECONFIG", kubeconfig)
        .env("MIGRATION_APISERVER", BIN)
        .env("FORM", form)
        .env_remove("IN_TREE_GROUPS")
        .env_remove("OFFLINE");
    if let Some(kubectl_dir) = kubectl_dir {
        deploy.env("PATH", format!("{}:{}", kubectl_dir.display(), std::env::var("PATH").unwrap_or_default()));
    }
    let out = deploy.output().expect("deploy.sh");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "deploy.sh: {stderr}");
    let stdout = String::from_utf8(out.stdout).expect("utf8");
    let docs = stdout.split("\n---\n").map(|d| serde_yaml_ng::from_str::<Value>(d).expect("YAML")).collect();
    (docs, stderr)
}

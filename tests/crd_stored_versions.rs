//! A custom resource's CRD `status.storedVersions` after its migration (KEP-4192's CRD Storage Version Status
//! Update). The target is a real migration-apiserver holding ShootStates, behind our proxy, which also stands in for
//! kube-apiserver's apiextensions endpoints (the CRD `shootstates.core.gardener.cloud`, its /status with
//! resourceVersion preconditions): kube-apiserver cannot run here. The migrating server runs the migration that
//! kubectl requests, as in tests/migrator.rs.

mod common;
use common::proxy::{Fault, Proxy, RequestInfo};
use common::shootstates::*;
use common::*;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/shootstates.core.gardener.cloud";
const RESOURCE: &str = SHOOTSTATES;

/// The stand-in's CRD and what happened to it.
struct Crd {
    object: Value,
    /// Condition (status, reason) of every accepted status write, in order.
    transitions: Vec<(String, String)>,
    status_writes: usize,
    /// Answer this many status writes that end a migration (condition False) with 409, after another writer's
    /// change (a new resourceVersion).
    conflicts_at_end: u32,
    /// At the first migration write of an object, change the storage version (a new generation).
    change_storage_on_write: bool,
}

impl Crd {
    fn new() -> Self {
        Crd {
            object: json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": RESOURCE, "generation": 2, "resourceVersion": "100", "uid": "u-1"},
                "spec": {
                    "group": "core.gardener.cloud",
                    "names": {"plural": "shootstates", "kind": "ShootState"},
                    "scope": "Namespaced",
                    "versions": [
                        {"name": "v1alpha1", "served": true, "storage": false},
                        {"name": "v1beta1", "served": true, "storage": true},
                    ],
                },
                "status": {
                    "storedVersions": ["v1alpha1", "v1beta1"],
                    "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}],
                },
            }),
            transitions: Vec::new(),
            status_writes: 0,
            conflicts_at_end: 0,
            change_storage_on_write: false,
        }
    }

    fn bump(&mut self) {
        let rv: u64 = self.object["metadata"]["resourceVersion"].as_str().unwrap_or("0").parse().unwrap_or(0);
        self.object["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
    }

    fn condition(&self) -> Value {
        self.object["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == "StorageMigrating"))
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn serve(&mut self, r: &RequestInfo, body: &[u8]) -> Option<(u16, Value)> {
        if r.method == "PATCH" && r.path.contains("/shootstates/") && self.change_storage_on_write {
            self.change_storage_on_write = false;
            self.object["metadata"]["generation"] = json!(3);
            self.object["spec"]["versions"][0]["storage"] = json!(true);
            self.object["spec"]["versions"][1]["storage"] = json!(false);
            self.bump();
            return None;
        }
        if !r.path.starts_with("/apis/apiextensions.k8s.io/") {
            return None;
        }
        let status = |code: u16, reason: &str, message: &str| json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message});
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", CRD_PATH) => Some((200, self.object.clone())),
            ("PUT", p) if p == format!("{CRD_PATH}/status") => {
                let sent: Value = serde_json::from_slice(body).ok()?;
                let ending = sent["status"]["conditions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|c| c["type"] == "StorageMigrating" && c["status"] == "False"));
                if ending && self.conflicts_at_end > 0 {
                    self.conflicts_at_end -= 1;
                    // Another writer came first.
                    self.object["metadata"]["labels"] = json!({"touched": self.conflicts_at_end.to_string()});
                    self.bump();
                }
                if sent["metadata"]["resourceVersion"] != self.object["metadata"]["resourceVersion"] {
                    let msg = "Operation cannot be fulfilled on customresourcedefinitions.apiextensions.k8s.io \"shootstates.core.gardener.cloud\": the object has been modified; please apply your changes to the latest version and try again";
                    return Some((409, status(409, "Conflict", msg)));
                }
                self.object["status"] = sent["status"].clone();
                self.bump();
                self.status_writes += 1;
                let c = self.condition();
                self.transitions.push((
                    c["status"].as_str().unwrap_or_default().into(),
                    c["reason"].as_str().unwrap_or_default().into(),
                ));
                Some((200, self.object.clone()))
            }
            _ => Some((404, status(404, "NotFound", "the server could not find the requested resource"))),
        }
    }
}

/// A target with `n` ShootStates, a proxy standing in for the CRD, and a migrating server.
async fn setup(n: usize, crd: Arc<Mutex<Crd>>, extra: &[&str]) -> (Server, Proxy, Server) {
    let target = target_with_shootstates(n).await;
    let proxy = Proxy::start(&target);
    let c2 = crd.clone();
    proxy.serve_locally(move |r, body| c2.lock().unwrap().serve(r, body));
    let mut args = vec!["--migration-qps", "0"];
    args.extend_from_slice(extra);
    let m = migrating_server(&proxy.kubeconfig(), &args);
    (target, proxy, m)
}

/// Requests the migration with kubectl and waits until it has ended; returns it.
fn migrate(m: &Server) -> Value {
    let name = request_shootstate_migration(m);
    eventually("the migration to end", Duration::from_secs(60), || {
        let out = m.kubectl(&["get", "svm", &name, "-o", "json"]);
        let svm: Value = serde_json::from_slice(&out.stdout).ok()?;
        let ended = svm["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| (c["type"] == "Succeeded" || c["type"] == "Failed") && c["status"] == "True");
        ended.then_some(svm)
    })
}

fn phase(svm: &Value) -> &str {
    let cs = svm["status"]["conditions"].as_array().expect("conditions");
    if cs.iter().any(|c| c["type"] == "Succeeded" && c["status"] == "True") {
        "Succeeded"
    } else {
        "Failed"
    }
}

fn pairs(t: &[(String, String)]) -> Vec<(&str, &str)> {
    t.iter().map(|(s, r)| (s.as_str(), r.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untouched_when_the_storage_version_changed_during_the_migration() {
    let crd = Arc::new(Mutex::new(Crd::new()));
    crd.lock().unwrap().change_storage_on_write = true;
    let (_t, _p, m) = setup(20, crd.clone(), &[]).await;
    let svm = migrate(&m);
    assert_eq!(phase(&svm), "Succeeded", "{svm:#}");
    let crd = crd.lock().unwrap();
    assert_eq!(crd.object["metadata"]["generation"], 3, "the stand-in changed the storage version");
    assert_eq!(crd.object["status"]["storedVersions"], json!(["v1alpha1", "v1beta1"]));
    assert_eq!(pairs(&crd.transitions), [("True", "MigrationRunning"), ("False", "MigrationSucceeded")]);
    let message = crd.condition()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("generation mismatch"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untouched_after_failed() {
    let crd = Arc::new(Mutex::new(Crd::new()));
    let (_t, proxy, m) = setup(20, crd.clone(), &[]).await;
    proxy.add_rule(|r| {
        (r.is_patch() && r.path.ends_with("/shootstates/s-7")).then_some(Fault::Status { code: 422, retry_after: None })
    });
    let svm = migrate(&m);
    assert_eq!(phase(&svm), "Failed", "{svm:#}");
    let crd = crd.lock().unwrap();
    assert_eq!(crd.object["status"]["storedVersions"], json!(["v1alpha1", "v1beta1"]));
    assert_eq!(pairs(&crd.transitions), [("True", "MigrationRunning"), ("False", "MigrationFailed")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_the_crd_rereads_and_still_ends_right() {
    let crd = Arc::new(Mutex::new(Crd::new()));
    crd.lock().unwrap().conflicts_at_end = 2;
    let (_t, proxy, m) = setup(20, crd.clone(), &[]).await;
    let svm = migrate(&m);
    assert_eq!(phase(&svm), "Succeeded", "{svm:#}");
    let crd = crd.lock().unwrap();
    assert_eq!(crd.conflicts_at_end, 0, "both conflicts were met");
    assert_eq!(crd.object["status"]["storedVersions"], json!(["v1beta1"]));
    assert_eq!(crd.object["metadata"]["labels"]["touched"], "0", "the other writer's change is kept");
    assert_eq!(pairs(&crd.transitions), [("True", "MigrationRunning"), ("False", "MigrationSucceeded")]);
    let records = proxy.records();
    let status_puts: Vec<u16> =
        records.iter().filter(|r| r.method == "PUT" && r.path.ends_with("/status")).map(|r| r.code).collect();
    assert_eq!(status_puts, [200, 409, 409, 200], "one start, two conflicts, then the write");
    let reads = records.iter().filter(|r| r.method == "GET" && r.path == CRD_PATH).count();
    assert!(reads >= 4, "each attempt reads the CRD again: {reads} reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flag_off_leaves_crds_alone() {
    let crd = Arc::new(Mutex::new(Crd::new()));
    let (_t, proxy, m) = setup(5, crd.clone(), &["--update-crd-stored-versions=false"]).await;
    let started = Instant::now();
    let svm = migrate(&m);
    assert_eq!(phase(&svm), "Succeeded", "{svm:#}");
    let crd = crd.lock().unwrap();
    assert_eq!(crd.status_writes, 0);
    assert_eq!(crd.object["status"]["storedVersions"], json!(["v1alpha1", "v1beta1"]));
    assert!(!proxy.records().iter().any(|r| r.at > started && r.path.starts_with("/apis/apiextensions.k8s.io/")));
}

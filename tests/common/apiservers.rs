//! A cluster's kube-apiservers as the cluster key-rotation trigger sees them, served by the [`Proxy`] in front of
//! a target: their identity Leases in kube-system (`apiserver.kubernetes.io/identity=kube-apiserver`, name = the
//! apiserver's ID, as pkg/controlplane writes them) and `/metrics`, which a load balancer answers from one apiserver
//! after the other (round robin), each with its own
//! `apiserver_encryption_config_controller_last_config_info{apiserver_id_hash,hash}`.

use super::proxy::{Proxy, RequestInfo};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};

/// The label selector the identity Leases are listed with.
pub const IDENTITY_SELECTOR: &str = "apiserver.kubernetes.io/identity=kube-apiserver";
const LEASES_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

/// `sha256:` and the hex SHA-256 of `bytes`: kube-apiserver's `apiserver_id_hash` of an ID, and the `hash` of an
/// EncryptionConfiguration file's bytes.
pub fn sha256_label(bytes: &[u8]) -> String {
    format!("sha256:{}", hex_sha256(bytes))
}

/// The `hash` label of `apiserver_encryption_config_controller_last_config_info` for a config file's bytes, as
/// k8s.io/apiserver's `computeEncryptionConfigHash` makes it.
pub fn config_hash_label(bytes: &[u8]) -> String {
    format!("k8s:enc:unstable:1:{}", hex_sha256(bytes))
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone, Debug)]
struct Apiserver {
    id: String,
    /// The hash of the config it has loaded.
    hash: String,
    /// Whether its /metrics has the sample (a lagging one, e.g. still loading or older than 1.34, has not).
    exports: bool,
    /// Whether its identity Lease exists (it is removed when the apiserver is gone).
    lease: bool,
}

#[derive(Default)]
struct State {
    servers: Vec<Apiserver>,
    next: usize,
    scrapes: usize,
    lease_lists: usize,
}

/// The stand-in's kube-apiservers; clones share them.
#[derive(Clone, Default)]
pub struct Apiservers(Arc<Mutex<State>>);

impl Apiservers {
    /// Apiservers with these IDs, each having loaded the config of hash `hash`.
    pub fn new(ids: &[&str], hash: &str) -> Apiservers {
        let servers = ids
            .iter()
            .map(|id| Apiserver { id: id.to_string(), hash: hash.into(), exports: true, lease: true })
            .collect();
        Apiservers(Arc::new(Mutex::new(State { servers, ..Default::default() })))
    }

    fn with(&self, id: &str, f: impl FnOnce(&mut Apiserver)) {
        let mut st = self.0.lock().unwrap();
        f(st.servers.iter_mut().find(|s| s.id == id).unwrap_or_else(|| panic!("no apiserver {id}")));
    }

    /// `id` (re)loads the config of hash `hash`.
    pub fn load(&self, id: &str, hash: &str) {
        self.with(id, |s| s.hash = hash.into());
    }

    /// Whether `id`'s /metrics carries its `last_config_info` sample.
    pub fn exports(&self, id: &str, exports: bool) {
        self.with(id, |s| s.exports = exports);
    }

    /// `id` is gone: its Lease is deleted (as the apiserver lease garbage collector does) and the load balancer no
    /// longer reaches it.
    pub fn remove(&self, id: &str) {
        self.with(id, |s| s.lease = false);
    }

    /// Scrapes of /metrics so far.
    pub fn scrapes(&self) -> usize {
        self.0.lock().unwrap().scrapes
    }

    /// Lists of the identity Leases so far.
    pub fn lease_lists(&self) -> usize {
        self.0.lock().unwrap().lease_lists
    }

    /// Serves the Leases and /metrics through `proxy`.
    pub fn install(&self, proxy: &Proxy) {
        let me = self.clone();
        proxy.serve_text_locally(move |r| me.serve_metrics(r));
        let me = self.clone();
        proxy.serve_locally(move |r, _| me.serve_leases(r));
    }

    fn serve_metrics(&self, r: &RequestInfo) -> Option<(u16, &'static str, String)> {
        if r.path != "/metrics" {
            return None;
        }
        let mut st = self.0.lock().unwrap();
        st.scrapes += 1;
        let reachable: Vec<Apiserver> = st.servers.iter().filter(|s| s.lease).cloned().collect();
        if reachable.is_empty() {
            return Some((503, "text/plain", "no apiserver behind the load balancer\n".into()));
        }
        let s = &reachable[st.next % reachable.len()];
        st.next += 1;
        let mut body = String::from(
            "# HELP apiserver_request_total [STABLE] Counter of apiserver requests.\n# TYPE apiserver_request_total counter\n\
             apiserver_request_total{code=\"200\",verb=\"GET\"} 12\n",
        );
        if s.exports {
            body.push_str(&format!(
                "# HELP apiserver_encryption_config_controller_last_config_info [ALPHA] Information about the last applied encryption configuration with hash as label, split by apiserver identity.\n\
                 # TYPE apiserver_encryption_config_controller_last_config_info gauge\n\
                 apiserver_encryption_config_controller_last_config_info{{apiserver_id_hash=\"{}\",hash=\"{}\"}} 1\n",
                sha256_label(s.id.as_bytes()),
                s.hash
            ));
        }
        Some((200, "text/plain; version=0.0.4; charset=utf-8", body))
    }

    fn serve_leases(&self, r: &RequestInfo) -> Option<(u16, Value)> {
        if r.path != LEASES_PATH || r.method != "GET" {
            return None;
        }
        let mut st = self.0.lock().unwrap();
        st.lease_lists += 1;
        let now = Timestamp::now().to_string();
        let lease = |name: &str, labels: Value| {
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": name, "namespace": "kube-system", "labels": labels, "resourceVersion": "7"},
                   "spec": {"holderIdentity": format!("{name}_0d6b6a5e-6a43-4a0e-9f0e-2b1c4f8c9a11"),
                            "leaseDurationSeconds": 3600, "renewTime": now}})
        };
        let identity = json!({"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": "cp"});
        let mut items: Vec<Value> =
            st.servers.iter().filter(|s| s.lease).map(|s| lease(&s.id, identity.clone())).collect();
        // Another component's Lease in kube-system: only a list without the label selector sees it.
        if r.param("labelSelector").as_deref() != Some(IDENTITY_SELECTOR) {
            items.push(lease("kube-controller-manager", json!({})));
        }
        Some((
            200,
            json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "metadata": {"resourceVersion": "7"}, "items": items}),
        ))
    }
}

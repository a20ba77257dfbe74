//! A cluster's kube-apiservers as the cluster key-rotation trigger sees them, served by the [`Proxy`] in front of
//! a target: their identity Leases in kube-system (`apiserver.kubernetes.io/identity=kube-apiserver`, name = the
//! apiserver's ID, as pkg/controlplane writes them), listed and watched, and `/metrics`, which a load balancer
//! answers from one apiserver after the other (round robin), each with its own
//! `apiserver_encryption_config_controller_last_config_info{apiserver_id_hash,hash}` and, per KMS v2 provider,
//! `apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds{apiserver_id_hash,key_id_hash,
//! provider_name}`: set to the time of the plugin's last Status reply for its key_id, the series of older key_ids
//! still exported (kube-apiserver deletes one only when its LRU cache of label sets evicts it), listed in label
//! order as client_golang lists them, so that an old key_id may come after the new one.
//!
//! The Leases have resourceVersions as kube-apiserver's do: every change (a renewal, a removal) is one event with
//! the next resourceVersion, kept in a history; a LIST answers at the current one, and a watch from a
//! resourceVersion replays the events after it and then streams the new ones (from none or "0": ADDED for every
//! Lease), with a BOOKMARK at the current resourceVersion after the replay when bookmarks are allowed.

use super::proxy::{Proxy, RequestInfo};
use bytes::Bytes;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

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
    /// Its Lease's renewTime and resourceVersion.
    renewed: String,
    version: u64,
    /// Its key_id status series: (provider, key_id hash) -> the time of the last Status reply with that key_id.
    key_ids: std::collections::BTreeMap<(String, String), f64>,
}

/// A change of an identity Lease: its resourceVersion, the event type and the Lease as it then is.
struct Change {
    version: u64,
    kind: &'static str,
    lease: Value,
}

#[derive(Default)]
struct State {
    servers: Vec<Apiserver>,
    next: usize,
    scrapes: usize,
    lease_lists: usize,
    lease_watches: usize,
    /// The last Status time given to a key_id series: each reply is strictly later than the one before.
    clock: f64,
    /// The Leases' current resourceVersion.
    version: u64,
    history: Vec<Change>,
    /// The open watches; those whose client went away are dropped at the next change.
    watchers: Vec<UnboundedSender<Bytes>>,
}

/// The first resourceVersion.
const FIRST_VERSION: u64 = 7;

/// The stand-in's kube-apiservers; clones share them.
#[derive(Clone, Default)]
pub struct Apiservers(Arc<Mutex<State>>);

impl Apiservers {
    /// Apiservers with these IDs, each having loaded the config of hash `hash`.
    pub fn new(ids: &[&str], hash: &str) -> Apiservers {
        let servers = ids
            .iter()
            .map(|id| Apiserver {
                id: id.to_string(),
                hash: hash.into(),
                exports: true,
                lease: true,
                renewed: Timestamp::now().to_string(),
                version: FIRST_VERSION,
                key_ids: Default::default(),
            })
            .collect();
        Apiservers(Arc::new(Mutex::new(State { servers, version: FIRST_VERSION, ..Default::default() })))
    }

    fn with(&self, id: &str, f: impl FnOnce(&mut Apiserver)) {
        let mut st = self.0.lock().unwrap();
        f(st.servers.iter_mut().find(|s| s.id == id).unwrap_or_else(|| panic!("no apiserver {id}")));
    }

    /// `id` (re)loads the config of hash `hash`.
    pub fn load(&self, id: &str, hash: &str) {
        self.with(id, |s| s.hash = hash.into());
    }

    /// `id`'s plugin for the KMS v2 provider `provider` answers Status with `key_id`: that series' timestamp is
    /// now (later than every earlier reply); the series of the other key_ids stay as they were.
    pub fn report_key_id(&self, id: &str, provider: &str, key_id: &str) {
        let mut st = self.0.lock().unwrap();
        let now = Timestamp::now().as_millisecond() as f64 / 1000.0;
        st.clock = now.max(st.clock + 0.001);
        let at = st.clock;
        let s = st.servers.iter_mut().find(|s| s.id == id).unwrap_or_else(|| panic!("no apiserver {id}"));
        s.key_ids.insert((provider.to_string(), sha256_label(key_id.as_bytes())), at);
    }

    /// Whether `id`'s /metrics carries its `last_config_info` sample.
    pub fn exports(&self, id: &str, exports: bool) {
        self.with(id, |s| s.exports = exports);
    }

    /// `id` is gone: its Lease is deleted (as the apiserver lease garbage collector does) and the load balancer no
    /// longer reaches it.
    pub fn remove(&self, id: &str) {
        self.change(id, "DELETED", |s| s.lease = false);
    }

    /// `id` renews its Lease (kube-apiserver does every 10 s): a MODIFIED event with a new renewTime.
    pub fn renew(&self, id: &str) {
        self.change(id, "MODIFIED", |s| s.renewed = Timestamp::now().to_string());
    }

    /// Changes `id`'s Lease and sends the event to every open watch.
    fn change(&self, id: &str, kind: &'static str, f: impl FnOnce(&mut Apiserver)) {
        let mut st = self.0.lock().unwrap();
        st.version += 1;
        let version = st.version;
        let s = st.servers.iter_mut().find(|s| s.id == id).unwrap_or_else(|| panic!("no apiserver {id}"));
        f(s);
        s.version = version;
        let lease = identity_lease(s);
        let line = event_line(kind, &lease);
        st.watchers.retain(|w| w.send(line.clone()).is_ok());
        st.history.push(Change { version, kind, lease });
    }

    /// Scrapes of /metrics so far.
    pub fn scrapes(&self) -> usize {
        self.0.lock().unwrap().scrapes
    }

    /// Lists of the identity Leases so far.
    pub fn lease_lists(&self) -> usize {
        self.0.lock().unwrap().lease_lists
    }

    /// Watches of the identity Leases opened so far.
    pub fn lease_watches(&self) -> usize {
        self.0.lock().unwrap().lease_watches
    }

    /// Serves the Leases and /metrics through `proxy`.
    pub fn install(&self, proxy: &Proxy) {
        let me = self.clone();
        proxy.serve_text_locally(move |r| me.serve_metrics(r));
        let me = self.clone();
        proxy.serve_locally(move |r, _| me.serve_leases(r));
        let me = self.clone();
        proxy.serve_watch_locally(move |r| me.watch_leases(r));
    }

    fn watch_leases(&self, r: &RequestInfo) -> Option<UnboundedReceiver<Bytes>> {
        if r.path != LEASES_PATH || r.method != "GET" || r.param("watch").as_deref() != Some("true") {
            return None;
        }
        let mut st = self.0.lock().unwrap();
        st.lease_watches += 1;
        let (tx, rx) = unbounded_channel();
        let from = r.param("resourceVersion").filter(|v| !v.is_empty() && v != "0");
        match from.map(|v| v.parse::<u64>()) {
            None => {
                for s in st.servers.iter().filter(|s| s.lease) {
                    let _ = tx.send(event_line("ADDED", &identity_lease(s)));
                }
                if r.param("labelSelector").as_deref() != Some(IDENTITY_SELECTOR) {
                    let _ = tx.send(event_line("ADDED", &other_lease()));
                }
            }
            Some(Ok(from)) => {
                for c in st.history.iter().filter(|c| c.version > from) {
                    let _ = tx.send(event_line(c.kind, &c.lease));
                }
            }
            // kube-apiserver's answer to a resourceVersion it cannot parse (the watcher then lists again).
            Some(Err(_)) => {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "invalid resource version", "reason": "Expired", "code": 410});
                let _ = tx.send(line(&json!({"type": "ERROR", "object": status})));
                return Some(rx);
            }
        }
        if r.param("allowWatchBookmarks").as_deref() == Some("true") {
            let bookmark = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                  "metadata": {"resourceVersion": st.version.to_string()}});
            let _ = tx.send(event_line("BOOKMARK", &bookmark));
        }
        st.watchers.push(tx);
        Some(rx)
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
        if !s.key_ids.is_empty() {
            body.push_str(&format!(
                "# HELP {KEY_ID_STATUS} [ALPHA] The last time in seconds when a keyID was returned by the Status RPC call.\n\
                 # TYPE {KEY_ID_STATUS} gauge\n"
            ));
            let id_hash = sha256_label(s.id.as_bytes());
            let mut series: Vec<(&(String, String), &f64)> = s.key_ids.iter().collect();
            series.sort_by(|((p1, k1), _), ((p2, k2), _)| (k1, p1).cmp(&(k2, p2)));
            for ((provider, key_id_hash), at) in series {
                body.push_str(&format!(
                    "{KEY_ID_STATUS}{{apiserver_id_hash=\"{id_hash}\",key_id_hash=\"{key_id_hash}\",provider_name=\"{provider}\"}} {}\n",
                    go_float(*at)
                ));
            }
        }
        Some((200, "text/plain; version=0.0.4; charset=utf-8", body))
    }

    fn serve_leases(&self, r: &RequestInfo) -> Option<(u16, Value)> {
        if r.path != LEASES_PATH || r.method != "GET" {
            return None;
        }
        let mut st = self.0.lock().unwrap();
        st.lease_lists += 1;
        let mut items: Vec<Value> = st.servers.iter().filter(|s| s.lease).map(identity_lease).collect();
        // Another component's Lease in kube-system: only a list without the label selector sees it.
        if r.param("labelSelector").as_deref() != Some(IDENTITY_SELECTOR) {
            items.push(other_lease());
        }
        let metadata = json!({"resourceVersion": st.version.to_string()});
        Some((
            200,
            json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "metadata": metadata, "items": items}),
        ))
    }
}

const KEY_ID_STATUS: &str = "apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds";

/// A sample value as client_golang writes it (Go's `strconv.FormatFloat(v, 'g', -1, 64)`): `1.7327001234567e+09`.
fn go_float(v: f64) -> String {
    let e = format!("{v:e}");
    match e.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => e,
    }
}

fn lease(name: &str, labels: Value, renewed: &str, version: u64) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": name, "namespace": "kube-system", "labels": labels,
                        "resourceVersion": version.to_string()},
           "spec": {"holderIdentity": format!("{name}_0d6b6a5e-6a43-4a0e-9f0e-2b1c4f8c9a11"),
                    "leaseDurationSeconds": 3600, "renewTime": renewed}})
}

fn identity_lease(s: &Apiserver) -> Value {
    let identity = json!({"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": "cp"});
    lease(&s.id, identity, &s.renewed, s.version)
}

/// kube-controller-manager's leader election Lease, which never changes here.
fn other_lease() -> Value {
    lease("kube-controller-manager", json!({}), &Timestamp::now().to_string(), FIRST_VERSION)
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    line(&json!({"type": kind, "object": object}))
}

fn line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

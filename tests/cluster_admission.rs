//! The CRD-and-webhook form (`make cluster FORM=crds`) with a real kube-apiserver (v1.37.2): kube-apiserver calls
//! this server's /validate and /mutate for ShootState custom resources and its CSI webhooks for PersistentVolumes,
//! presenting the client certificate manifests/webhooks/README.md tells a cluster to configure; and the webhooks'
//! failurePolicy holds while this server is down.

mod common;
use common::cluster::{Cluster, Options};
use serde_json::{json, Value};
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

/// The cluster of this binary: the CRD form, with GCE PD and AWS EBS migrated to CSI in the webhooks.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::up(Options {
            crds: true,
            server_args: vec!["--feature-gates=CSIMigrationGCE=true,CSIMigrationAWS=true".into()],
            ..Options::default()
        })
    })
}

/// Tests that need this server up hold it shared; the one that stops it holds it alone.
static SERVER_UP: RwLock<()> = RwLock::new(());

fn create(c: &Cluster, object: &Value) -> std::process::Output {
    c.kubectl_as(&c.admin(), &["create", "-f", "-", "-o", "json"], Some(&object.to_string()))
}

fn namespace(c: &Cluster, name: &str) {
    let out = c.kubectl(&["create", "namespace", name]);
    assert!(out.status.success() || String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"));
}

fn shootstate(namespace: &str, name: &str, gardener: Value) -> Value {
    json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
        "metadata": {"name": name, "namespace": namespace}, "spec": {"gardener": gardener}})
}

fn gce_pv(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "gcePersistentDisk": {"pdName": format!("disk-{name}"), "fsType": "ext4"}}})
}

#[test]
fn the_crd_form_is_installed_in_place_of_the_apiservices() {
    let _up = SERVER_UP.read().unwrap_or_else(|e| e.into_inner());
    let c = cluster();
    let crd = c.kubectl_json(&["get", "crd", "shootstates.core.gardener.cloud", "-o", "json"]);
    let mut versions: Vec<(&str, bool)> = crd["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["storage"].as_bool()?)))
        .collect();
    versions.sort();
    assert_eq!(versions, [("v1alpha1", false), ("v1beta1", true)], "{}", crd["spec"]);
    // Not the in-tree group: kube-apiserver serves it on this cluster (neither its CRD nor webhook rules for it).
    let ours = c.kubectl_ok(&["get", "crd", "-l", "app.kubernetes.io/name=migration-apiserver", "-o", "name"]);
    assert_eq!(
        ours.lines().collect::<Vec<_>>(),
        [
            "customresourcedefinition.apiextensions.k8s.io/shootstates.core.gardener.cloud",
            "customresourcedefinition.apiextensions.k8s.io/storagestates.migration.k8s.io",
            "customresourcedefinition.apiextensions.k8s.io/storageversionmigrations.migration.k8s.io"
        ]
    );
    let deploy = c.log("deploy");
    assert!(
        deploy.contains(
            "skipping CustomResourceDefinition storageversionmigrations.storagemigration.k8s.io and its webhook \
             rules: the cluster serves storagemigration.k8s.io itself (APIService v1.storagemigration.k8s.io is local"
        ),
        "{deploy}"
    );
    let rules = c.kubectl_json(&["get", "validatingwebhookconfiguration", "migration-apiserver", "-o", "json"]);
    assert!(!rules.to_string().contains("storagemigration.k8s.io"), "{rules}");
    let apiservices = c.kubectl_ok(&["get", "apiservices", "-o", "name"]);
    assert!(!apiservices.contains("migration-apiserver"), "{apiservices}");
    let ours = c.kubectl_json(&["get", "apiservice", "v1beta1.core.gardener.cloud", "-o", "json"]);
    assert!(ours["spec"].get("service").is_none(), "kube-apiserver serves the CRDs: {ours}");
}

#[test]
fn kube_apiserver_calls_our_webhooks_for_shootstates() {
    let _up = SERVER_UP.read().unwrap_or_else(|e| e.into_inner());
    let c = cluster();
    namespace(c, "garden-admission");
    let ok =
        shootstate("garden-admission", "valid", json!([{"name": "ca", "type": "secret", "data": {"ca.crt": "LS0t"}}]));
    let out = create(c, &ok);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Refused by our /validate, with our message: kube-apiserver relays the webhook's Status (reason Invalid, its
    // causes), which kubectl prints as for the built-in validation.
    let unnamed = shootstate(
        "garden-admission",
        "unnamed",
        json!([{"name": "ca", "type": "secret", "data": {}}, {"name": "", "type": "secret", "data": {}}]),
    );
    let out = create(c, &unnamed);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "The ShootState \"unnamed\" is invalid: spec.gardener[1].name: Invalid value: \"\": name of data required \
             to generate resources cannot be empty"
        ),
        "{stderr}"
    );
    // kube-apiserver's webhook client authenticated as the identity the README names (else 401 and a refusal of
    // the valid one above), and our audit log shows its calls.
    let audit = std::fs::read_to_string(c.dir.join("logs/migration-apiserver-audit.log")).unwrap_or_default();
    let call = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| {
            e["requestURI"].as_str().is_some_and(|u| u.starts_with("/validate?")) && e["stage"] == "ResponseComplete"
        })
        .unwrap_or_else(|| panic!("no /validate call in our audit log"));
    assert_eq!(call["user"]["username"], "migration-apiserver-webhook-client", "{call}");
}

#[test]
fn persistent_volumes_get_their_migrated_to_annotation_and_a_missing_csi_driver_refuses_them() {
    let _up = SERVER_UP.read().unwrap_or_else(|e| e.into_inner());
    let c = cluster();
    // GCE PD migrates to pd.csi.storage.gke.io, whose CSIDriver the cluster has.
    let driver = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": "pd.csi.storage.gke.io"}, "spec": {"attachRequired": true}});
    c.kubectl_ok_stdin(&["apply", "-f", "-"], &driver.to_string());
    let out = create(c, &gce_pv("pv-gce"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pv: Value = serde_json::from_slice(&out.stdout).expect("PV");
    assert_eq!(pv["metadata"]["annotations"]["pv.kubernetes.io/migrated-to"], "pd.csi.storage.gke.io", "{pv}");
    assert!(pv["spec"]["gcePersistentDisk"].is_object(), "the volume source is left alone: {pv}");

    // AWS EBS is migrated too, but the cluster has no CSIDriver ebs.csi.aws.com: refused by our validation.
    let ebs = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-ebs"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "awsElasticBlockStore": {"volumeID": "vol-1"}}});
    let out = create(c, &ebs);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("ebs.csi.aws.com") && stderr.contains("denied the request"),
        "{stderr}"
    );
}

#[test]
fn failure_policy_while_this_server_is_down() {
    let _down = SERVER_UP.write().unwrap_or_else(|e| e.into_inner());
    let c = cluster();
    namespace(c, "garden-down");
    c.stop("migration-apiserver");
    // Our kinds' webhooks: failurePolicy Fail (docs/install/crds.md): writes are refused while no server answers.
    let out = create(c, &shootstate("garden-down", "while-down", json!([])));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("failed calling webhook") && stderr.contains("connection refused"), "{stderr}");
    // The CSI webhooks: Ignore: the PV is written, without the annotation our webhook would add.
    let out = create(c, &gce_pv("pv-while-down"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pv: Value = serde_json::from_slice(&out.stdout).expect("PV");
    assert!(pv["metadata"]["annotations"].get("pv.kubernetes.io/migrated-to").is_none(), "{pv}");

    c.restart("migration-apiserver");
    // Back up: the same write passes, and an update of the PV gets its annotation now.
    common::eventually("ShootStates admitted again", Duration::from_secs(30), || {
        create(c, &shootstate("garden-down", "after", json!([]))).status.success().then_some(())
    });
    c.kubectl_ok(&["label", "pv", "pv-while-down", "touched=yes"]);
    let pv = c.kubectl_json(&["get", "pv", "pv-while-down", "-o", "json"]);
    assert_eq!(pv["metadata"]["annotations"]["pv.kubernetes.io/migrated-to"], "pd.csi.storage.gke.io", "{pv}");
}

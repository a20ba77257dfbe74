//! Upstream: kubernetes/csi-translation-lib `translate_test.go` at 83cf1e337910ea773d78dcb905d57e8305b3f65d (file
//! last changed in 0feceeb, kubernetes/kubernetes 1298c8a5fe6a33726f76516f71e83e52c46eee66).
//!
//! TestTopologyTranslation translates each PV to CSI and checks its node affinity; for the cases with a `key` it
//! translates the result back and checks that the key is gone and a Kubernetes zone key (GA or beta) is there:
//! here two rows, the second a round trip. TestTranslateInTreeInlineVolumeToCSINameUniqueness and
//! TestPluginNameMappings compare two answers rather than one: they are tests of their own in
//! `tests/csi_upstream.rs`, fed from here.

use super::*;
use serde_json::{json, Value};

const GCE_KEY: &str = "topology.gke.io/zone";
const EBS_KEY: &str = "topology.ebs.csi.aws.com/zone";
const CINDER_KEY: &str = "topology.cinder.csi.openstack.org/zone";

fn gce_pd() -> Value {
    json!({"gcePersistentDisk": {"pdName": "test-disk", "fsType": "ext4"}})
}

fn aws_ebs() -> Value {
    json!({"awsElasticBlockStore": {"volumeID": "vol01", "fsType": "ext3", "partition": 1, "readOnly": true}})
}

fn cinder() -> Value {
    json!({"cinder": {"volumeID": "vol1", "fsType": "ext4"}})
}

/// `makePV`: labels (none when null) and a one-expression topology (none when null), with `source`.
fn make_pv(labels: Value, topology: Value, source: Value) -> Value {
    let meta = if labels.is_null() { json!({}) } else { json!({"labels": labels}) };
    let mut spec = source;
    if !topology.is_null() {
        spec["nodeAffinity"] = affinity(vec![vec![topology]]);
    }
    pv(meta, spec)
}

/// `makeNodeAffinity`: one term with all values, or (multi_terms) one term per value.
fn node_affinity(multi_terms: bool, key: &str, values: &[&str]) -> Value {
    if multi_terms {
        affinity(values.iter().map(|v| vec![req(key, &[v])]).collect())
    } else {
        affinity(vec![vec![req(key, values)]])
    }
}

/// Whether no expression of the PV uses `key` and some uses a Kubernetes zone key (`TopologyKeyExist`).
fn back_in_tree(pv: &Value, key: &str) -> bool {
    let keys: Vec<&str> = pv
        .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|t| t["matchExpressions"].as_array().into_iter().flatten())
        .filter_map(|e| e["key"].as_str())
        .collect();
    !keys.contains(&key) && keys.iter().any(|k| *k == GA_ZONE || *k == BETA_ZONE)
}

/// Both rows of a TestTopologyTranslation case: to CSI, and (with a key) back.
fn topology(name: &str, key: Option<&'static str>, input: Value, want: Value) -> Vec<Case> {
    let name = format!("TestTopologyTranslation/{name}");
    let mut rows = vec![case(&name, Input::PvToCsi(input.clone()), parts(vec![("/spec/nodeAffinity", want)]))];
    let check: fn(&Value) -> bool = match key {
        Some(GCE_KEY) => |pv| back_in_tree(pv, GCE_KEY),
        Some(other) => panic!("no check for {other}"),
        None => return rows,
    };
    rows.push(case(
        format!("{name} (back in-tree)"),
        Input::RoundTrip(input),
        Expect::Check("the CSI key replaced by a Kubernetes zone key", check),
    ));
    rows
}

pub fn cases() -> Vec<Case> {
    let beta = labels(&[(BETA_ZONE, "us-east-1a"), (BETA_REGION, "us-east-1")]);
    let ga = labels(&[(GA_ZONE, "us-east-1a"), (GA_REGION, "us-east-1")]);
    let regional_beta = labels(&[(BETA_ZONE, "europe-west1-b__europe-west1-c")]);
    let regional_ga = labels(&[(GA_ZONE, "europe-west1-b__europe-west1-c")]);
    let (b, c, f, g) = ("europe-west1-b", "europe-west1-c", "europe-west1-f", "europe-west1-g");
    let mut multi_terms = make_pv(Value::Null, req(GA_ZONE, &[f]), gce_pd());
    multi_terms["spec"]["nodeAffinity"] = affinity(vec![vec![req(GA_ZONE, &[f])], vec![req(GA_ZONE, &[g])]]);

    let mut cases = vec![
        case(
            "TestTranslationStability/GCE PD PV Source",
            Input::RoundTrip(pv(json!({}), gce_pd())),
            Expect::Result(pv(json!({}), gce_pd())),
        ),
        case(
            "TestTranslationStability/AWS EBS PV Source",
            Input::RoundTrip(pv(json!({}), aws_ebs())),
            Expect::Result(pv(json!({}), aws_ebs())),
        ),
    ];
    let gce = Some(GCE_KEY);
    let topologies = [
        (
            "GCE PD with beta zone labels",
            gce,
            make_pv(beta.clone(), Value::Null, gce_pd()),
            node_affinity(false, GCE_KEY, &["us-east-1a"]),
        ),
        (
            "GCE PD with GA kubernetes zone labels",
            gce,
            make_pv(ga.clone(), Value::Null, gce_pd()),
            node_affinity(false, GCE_KEY, &["us-east-1a"]),
        ),
        (
            "GCE PD with existing topology (beta keys)",
            None,
            make_pv(Value::Null, req(BETA_ZONE, &["us-east-2a"]), gce_pd()),
            node_affinity(false, GCE_KEY, &["us-east-2a"]),
        ),
        (
            "GCE PD with existing topology (CSI keys)",
            gce,
            make_pv(Value::Null, req(GCE_KEY, &["us-east-2a"]), gce_pd()),
            node_affinity(false, GCE_KEY, &["us-east-2a"]),
        ),
        (
            "GCE PD with zone labels and topology",
            None,
            make_pv(beta.clone(), req(BETA_ZONE, &["us-east-2a"]), gce_pd()),
            node_affinity(false, GCE_KEY, &["us-east-2a"]),
        ),
        (
            "GCE PD with regional zones",
            gce,
            make_pv(regional_beta.clone(), Value::Null, gce_pd()),
            node_affinity(false, GCE_KEY, &[b, c]),
        ),
        (
            "GCE PD with regional topology",
            gce,
            make_pv(Value::Null, req(GA_ZONE, &[b, c]), gce_pd()),
            node_affinity(false, GCE_KEY, &[b, c]),
        ),
        (
            "GCE PD with Beta regional zone and topology",
            gce,
            make_pv(regional_beta, req(BETA_ZONE, &[f, g]), gce_pd()),
            node_affinity(false, GCE_KEY, &[f, g]),
        ),
        (
            "GCE PD with GA regional zone and topology",
            gce,
            make_pv(regional_ga, req(GA_ZONE, &[f, g]), gce_pd()),
            node_affinity(false, GCE_KEY, &[f, g]),
        ),
        ("GCE PD with multiple node selector terms", gce, multi_terms, node_affinity(true, GCE_KEY, &[f, g])),
        (
            "AWS EBS with beta zone labels",
            None,
            make_pv(beta.clone(), Value::Null, aws_ebs()),
            node_affinity(false, EBS_KEY, &["us-east-1a"]),
        ),
        (
            "AWS EBS with beta zone labels and topology",
            None,
            make_pv(beta.clone(), req(BETA_ZONE, &["us-east-2a"]), aws_ebs()),
            node_affinity(false, EBS_KEY, &["us-east-2a"]),
        ),
        (
            "AWS EBS with GA zone labels",
            None,
            make_pv(ga.clone(), Value::Null, aws_ebs()),
            node_affinity(false, EBS_KEY, &["us-east-1a"]),
        ),
        (
            "AWS EBS with GA zone labels and topology",
            None,
            make_pv(ga, req(GA_ZONE, &["us-east-2a"]), aws_ebs()),
            node_affinity(false, EBS_KEY, &["us-east-2a"]),
        ),
        (
            "OpenStack Cinder with zone labels",
            None,
            make_pv(beta.clone(), Value::Null, cinder()),
            node_affinity(false, CINDER_KEY, &["us-east-1a"]),
        ),
        (
            "OpenStack Cinder with zone labels and topology",
            None,
            make_pv(beta, req(BETA_ZONE, &["us-east-2a"]), cinder()),
            node_affinity(false, CINDER_KEY, &["us-east-2a"]),
        ),
    ];
    for (name, key, input, want) in topologies {
        cases.extend(topology(name, key, input, want));
    }
    cases
}

/// Builds a PV's volume source (a field of `spec`).
pub type Source = fn() -> Value;

/// TestPluginNameMappings: (in-tree plugin, CSI driver, a source of the plugin).
pub const PLUGIN_NAMES: [(&str, &str, Source); 2] =
    [("kubernetes.io/gce-pd", "pd.csi.storage.gke.io", gce_pd), ("kubernetes.io/aws-ebs", "ebs.csi.aws.com", aws_ebs)];

/// The drivers `generateUniqueVolumeSource` knows.
pub const UNIQUE_SOURCE_DRIVERS: [&str; 7] = [
    "pd.csi.storage.gke.io",
    "ebs.csi.aws.com",
    "cinder.csi.openstack.org",
    "disk.csi.azure.com",
    "file.csi.azure.com",
    "csi.vsphere.vmware.com",
    "pxd.portworx.com",
];

/// `generateUniqueVolumeSource`: an inline volume (without a name, as upstream's) of the driver's plugin whose
/// identifying fields are fresh UUIDs.
pub fn unique_volume(driver: &str) -> Value {
    let id = || uuid::Uuid::new_v4().to_string();
    let source = match driver {
        "pd.csi.storage.gke.io" => json!({"gcePersistentDisk": {"pdName": id()}}),
        "ebs.csi.aws.com" => json!({"awsElasticBlockStore": {"volumeID": id()}}),
        "cinder.csi.openstack.org" => json!({"cinder": {"volumeID": id()}}),
        "disk.csi.azure.com" => json!({"azureDisk": {"diskName": id(), "diskURI": id()}}),
        "file.csi.azure.com" => json!({"azureFile": {"secretName": id(), "shareName": id()}}),
        "csi.vsphere.vmware.com" => json!({"vsphereVolume": {"volumePath": format!(
            " [vsanDatastore] 6785a85e-268e-6352-a2e8-02008b7afadd/kubernetes-dynamic-pvc-{}.vmdk", id()), "fsType": "ext4"}}),
        "pxd.portworx.com" => json!({"portworxVolume": {"volumeID": id()}}),
        other => panic!("couldn't find logic for driver: {other}"),
    };
    let mut volume = json!({"name": ""});
    volume.as_object_mut().unwrap().extend(source.as_object().cloned().unwrap_or_default());
    volume
}

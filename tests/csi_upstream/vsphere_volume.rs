//! Upstream: kubernetes/csi-translation-lib `plugins/vsphere_volume_test.go` at
//! 83cf1e337910ea773d78dcb905d57e8305b3f65d (file last changed in 0feceeb, kubernetes/kubernetes
//! 1298c8a5fe6a33726f76516f71e83e52c46eee66).
//!
//! "expect error when pv.Spec.CSI is nil" goes back to in-tree without a CSI source: the library's error from the
//! command, a 422 from the API (which refuses such a request before translating).

use super::*;
use serde_json::{json, Value};

const DRIVER: &str = "csi.vsphere.vmware.com";
const PLUGIN: &str = "kubernetes.io/vsphere-volume";
const ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const REGION_KEY: &str = "topology.csi.vmware.com/region";
const PV_NAME: &str = "pvc-d8b4475f-2c47-486e-9b57-43ae006f9b59";
const PATH: &str =
    "[vsanDatastore] 6785a85e-268e-6352-a2e8-02008b7afadd/kubernetes-dynamic-pvc-68734c9f-a679-42e6-a694-39632c51e31f.vmdk";
const POLICY: &str = "vSAN Default Storage Policy";

fn storage_class(name: &str, params: Value, topologies: Value, want_params: Value, want_topologies: Value) -> Case {
    let input = Input::StorageClass(sc(PLUGIN, params, topologies));
    let expect = Expect::Result(sc(PLUGIN, want_params, want_topologies));
    case(format!("TestTranslatevSphereInTreeStorageClassToCSI/{name}"), input, expect)
}

/// A CSI PV of the driver, with the node affinity `affinity` (none when null).
fn csi_pv(labels: Value, node_affinity: Value, volume_attributes: Value, handle: &str) -> Value {
    let mut meta = json!({"name": PV_NAME});
    if !labels.is_null() {
        meta["labels"] = labels;
    }
    let mut spec = json!({"csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4",
        "volumeAttributes": volume_attributes}, "accessModes": ["ReadWriteOnce"]});
    if !node_affinity.is_null() {
        spec["nodeAffinity"] = node_affinity;
    }
    pv(meta, spec)
}

/// An in-tree PV of the plugin, with labels and node affinity when not null, and the storage policy or not.
fn in_tree_pv(labels: Value, node_affinity: Value, policy: bool) -> Value {
    let mut meta = json!({"name": PV_NAME});
    if !labels.is_null() {
        meta["labels"] = labels;
    }
    let mut source = json!({"volumePath": PATH, "fsType": "ext4"});
    if policy {
        source["storagePolicyName"] = json!(POLICY);
    }
    let mut spec = json!({"vsphereVolume": source, "accessModes": ["ReadWriteOnce"]});
    if !node_affinity.is_null() {
        spec["nodeAffinity"] = node_affinity;
    }
    pv(meta, spec)
}

fn zone_and_region(zone_key: &str, region_key: &str) -> Value {
    affinity(vec![vec![req(zone_key, &["z1"]), req(region_key, &["r1"])]])
}

pub fn cases() -> Vec<Case> {
    let migration = |mut params: Value| {
        params["csimigration"] = json!("true");
        params
    };
    let zone_a = |key: &str| json!([{"matchLabelExpressions": [{"key": key, "values": ["zone-a"]}]}]);
    let attrs = json!({"storagepolicyname": POLICY, "initialvolumefilepath": PATH});
    let handle = "e4073a6d-642e-4dff-8f4a-b4e3a47c4bbd";
    let beta_labels = labels(&[(BETA_ZONE, "z1"), (BETA_REGION, "r1")]);
    let ga_labels = labels(&[(GA_ZONE, "z1"), (GA_REGION, "r1")]);
    let translated = |labels: Value| {
        Expect::Result(csi_pv(
            labels,
            zone_and_region(ZONE_KEY, REGION_KEY),
            json!({"storagepolicyname": POLICY}),
            PATH,
        ))
    };
    vec![
        storage_class("translate with no parameter", json!({}), Value::Null, migration(json!({})), Value::Null),
        storage_class(
            "translate with unknown parameter",
            json!({"unknownparam": "value"}),
            Value::Null,
            migration(json!({})),
            Value::Null,
        ),
        storage_class(
            "translate with storagepolicyname and datastore",
            json!({"storagepolicyname": "test-policy-name", "datastore": "vsanDatastore"}),
            Value::Null,
            migration(json!({"storagepolicyname": "test-policy-name", "datastore-migrationparam": "vsanDatastore"})),
            Value::Null,
        ),
        storage_class(
            "translate with fstype",
            json!({"fstype": "ext4"}),
            Value::Null,
            migration(json!({"csi.storage.k8s.io/fstype": "ext4"})),
            Value::Null,
        ),
        storage_class(
            "translate with storagepolicyname and fstype",
            json!({"storagepolicyname": "test-policy-name", "fstype": "ext4"}),
            Value::Null,
            migration(json!({"csi.storage.k8s.io/fstype": "ext4", "storagepolicyname": "test-policy-name"})),
            Value::Null,
        ),
        storage_class(
            "translate with no parameter and allowedTopology",
            json!({}),
            zone_a(GA_ZONE),
            migration(json!({})),
            zone_a(ZONE_KEY),
        ),
        storage_class(
            "translate with storagepolicyname and allowedTopology",
            json!({"storagepolicyname": "test-policy-name"}),
            zone_a(GA_ZONE),
            migration(json!({"storagepolicyname": "test-policy-name"})),
            zone_a(ZONE_KEY),
        ),
        storage_class(
            "translate with storagepolicyname and allowedTopology beta labels",
            json!({"storagepolicyname": "test-policy-name"}),
            zone_a(BETA_ZONE),
            migration(json!({"storagepolicyname": "test-policy-name"})),
            zone_a(ZONE_KEY),
        ),
        storage_class(
            "translate with raw vSAN policy parameters, datastore and diskformat",
            json!({"hostfailurestotolerate": "2", "datastore": "vsanDatastore", "diskformat": "thin"}),
            zone_a(GA_ZONE),
            migration(json!({"hostfailurestotolerate-migrationparam": "2", "datastore-migrationparam": "vsanDatastore",
                "diskformat-migrationparam": "thin"})),
            zone_a(ZONE_KEY),
        ),
        storage_class(
            "translate with all parameters",
            json!({"storagepolicyname": "test-policy-name", "datastore": "test-datastore-name", "fstype": "ext4",
                "diskformat": "thin", "hostfailurestotolerate": "1", "forceprovisioning": "yes", "cachereservation": "25",
                "diskstripes": "4", "objectspacereservation": "10", "iopslimit": "32"}),
            zone_a(GA_ZONE),
            migration(json!({"storagepolicyname": "test-policy-name", "datastore-migrationparam": "test-datastore-name",
                "csi.storage.k8s.io/fstype": "ext4", "diskformat-migrationparam": "thin",
                "hostfailurestotolerate-migrationparam": "1", "forceprovisioning-migrationparam": "yes",
                "cachereservation-migrationparam": "25", "diskstripes-migrationparam": "4",
                "objectspacereservation-migrationparam": "10", "iopslimit-migrationparam": "32"})),
            zone_a(ZONE_KEY),
        ),
        case(
            "TestTranslateVSphereCSIPVToInTree/expect error when pv.Spec.CSI is nil",
            Input::PvToInTree(pv(json!({"name": PV_NAME}), json!({"accessModes": ["ReadWriteOnce"]}))),
            Expect::Invalid { message: "CSI persistent volume was nil", field: "spec.persistentVolume.spec.csi" },
        ),
        case(
            "TestTranslateVSphereCSIPVToInTree/translate valid vSphere CSI PV to vSphere in-tree PV",
            Input::PvToInTree(csi_pv(Value::Null, Value::Null, attrs.clone(), handle)),
            Expect::Result(in_tree_pv(Value::Null, Value::Null, false)),
        ),
        case(
            "TestTranslateVSphereCSIPVToInTree/translate valid vSphere CSI PV with topology Node Affinity rules to \
             vSphere CSI PV with topology labels",
            Input::PvToInTree(csi_pv(Value::Null, zone_and_region(ZONE_KEY, REGION_KEY), attrs, handle)),
            Expect::Result(in_tree_pv(ga_labels.clone(), zone_and_region(GA_ZONE, GA_REGION), false)),
        ),
        case(
            "TestTranslateVSphereInTreePVToCSI/expect error when in-tree vsphere PV is nil",
            Input::PvToCsi(pv(json!({}), json!({}))),
            error("could not find in-tree plugin translation logic for \"\""),
        ),
        case(
            "TestTranslateVSphereInTreePVToCSI/translate valid vSphere in-tree PV to vSphere CSI PV",
            Input::PvToCsi(in_tree_pv(Value::Null, Value::Null, true)),
            Expect::Result(csi_pv(Value::Null, Value::Null, json!({"storagepolicyname": POLICY}), PATH)),
        ),
        case(
            "TestTranslateVSphereInTreePVToCSI/translate valid vSphere in-tree PV with beta topology labels to vSphere \
             CSI PV",
            Input::PvToCsi(in_tree_pv(beta_labels.clone(), Value::Null, true)),
            translated(beta_labels),
        ),
        case(
            "TestTranslateVSphereInTreePVToCSI/translate valid vSphere in-tree PV with GA topology labels to vSphere CSI \
             PV",
            Input::PvToCsi(in_tree_pv(ga_labels.clone(), Value::Null, true)),
            translated(ga_labels),
        ),
        case(
            "TestTranslatevSphereInTreeInlineVolumeToCSI/expect error when inline vsphere volume is nil",
            Input::Inline(json!({"name": ""}), ""),
            error("could not find in-tree plugin translation logic for \"\""),
        ),
        case(
            "TestTranslatevSphereInTreeInlineVolumeToCSI/translate valid in-tree vsphere volume to vSphere CSI PV",
            Input::Inline(
                json!({"name": "inlinevolume",
                    "vsphereVolume": {"volumePath": "[vsanDatastore] volume/inlinevolume.vmdk", "fsType": "ext4"}}),
                "",
            ),
            Expect::Result(pv(
                json!({"name": "csi.vsphere.vmware.com-[vsanDatastore] volume/inlinevolume.vmdk"}),
                json!({"accessModes": ["ReadWriteOnce"], "volumeMode": FILESYSTEM, "csi": {"driver": DRIVER,
                    "volumeHandle": "[vsanDatastore] volume/inlinevolume.vmdk", "fsType": "ext4"}}),
            )),
        ),
    ]
}

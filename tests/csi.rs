//! CSI migration: the translation library table by table (every plugin, both directions, round trips, topology,
//! StorageClasses, inline volumes, the library's error messages), the CSITranslation API through kubectl, the
//! `translate` command, and the PV/PVC admission webhooks with real AdmissionReview JSON against the running binary.

mod common;
use common::admission::{admission_review, ReviewOf};
use common::*;

use axum::http::{Method, Request};
use base64::Engine;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use migration_apiserver::csi;
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------------------------
// helpers

fn pv(v: Value) -> PersistentVolume {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("not a PersistentVolume: {e}"))
}

fn to_json<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("serializes")
}

/// A PV with a name, labels and one node selector term per entry of `terms`.
fn pv_with(name: &str, labels: Value, terms: Value, source: Value) -> PersistentVolume {
    let mut spec = source;
    if terms.as_array().is_some_and(|t| !t.is_empty()) {
        let terms: Vec<Value> = terms.as_array().unwrap().iter().map(|t| json!({"matchExpressions": t})).collect();
        spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": terms}});
    }
    let mut meta = json!({"name": name});
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        meta["labels"] = labels;
    }
    pv(json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta, "spec": spec}))
}

fn req(key: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": "In", "values": values})
}

fn affinity(pv: &PersistentVolume) -> Value {
    to_json(pv)["spec"]["nodeAffinity"].clone()
}

fn err_pv(r: csi::Result<PersistentVolume>) -> String {
    r.map(|p| panic!("expected an error, got {}", to_json(&p))).unwrap_or_else(|e| e.0)
}

const GA_ZONE: &str = "topology.kubernetes.io/zone";
const GA_REGION: &str = "topology.kubernetes.io/region";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const AZURE_DISK_URI: &str = "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name";

// ---------------------------------------------------------------------------------------------------------------
// names, migratable checks, repair

#[test]
fn plugin_and_driver_names_map_both_ways() {
    let table = [
        ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io", "CSIMigrationGCE"),
        ("kubernetes.io/aws-ebs", "ebs.csi.aws.com", "CSIMigrationAWS"),
        ("kubernetes.io/cinder", "cinder.csi.openstack.org", "CSIMigrationOpenStack"),
        ("kubernetes.io/azure-disk", "disk.csi.azure.com", "CSIMigrationAzureDisk"),
        ("kubernetes.io/azure-file", "file.csi.azure.com", "CSIMigrationAzureFile"),
        ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com", "CSIMigrationvSphere"),
        ("kubernetes.io/portworx-volume", "pxd.portworx.com", "CSIMigrationPortworx"),
    ];
    assert_eq!(csi::plugins().len(), table.len());
    for (plugin, driver, gate) in table {
        assert_eq!(csi::csi_name_from_in_tree_name(plugin).unwrap(), driver);
        assert_eq!(csi::in_tree_name_from_csi_name(driver).unwrap(), plugin);
        assert!(csi::is_migratable_in_tree_plugin_by_name(plugin), "{plugin}");
        assert!(csi::is_migrated_csi_driver_by_name(driver), "{driver}");
        assert_eq!(csi::plugin_by_in_tree_name(plugin).unwrap().feature_gate(), gate);
        // Without a node-specific part, a handle repairs to itself (only GCE fills anything in).
        if driver != "pd.csi.storage.gke.io" {
            assert_eq!(csi::repair_volume_handle(driver, "h", "node").unwrap(), "h");
        }
    }
    assert_eq!(
        csi::csi_name_from_in_tree_name("kubernetes.io/nfs").unwrap_err().0,
        "could not find CSI Driver name for plugin kubernetes.io/nfs"
    );
    assert_eq!(
        csi::in_tree_name_from_csi_name("nfs.csi.k8s.io").unwrap_err().0,
        "could not find In-Tree driver name for CSI plugin nfs.csi.k8s.io"
    );
    assert_eq!(
        csi::repair_volume_handle("nfs.csi.k8s.io", "h", "n").unwrap_err().0,
        "could not find In-Tree driver name for CSI plugin nfs.csi.k8s.io"
    );
    assert!(!csi::is_migratable_in_tree_plugin_by_name("kubernetes.io/rbd"));
    assert_eq!(
        csi::repair_volume_handle(
            "pd.csi.storage.gke.io",
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
            "projects/p/zones/europe-west1-b/instances/n"
        )
        .unwrap(),
        "projects/p/zones/europe-west1-b/disks/d"
    );

    let gce = pv_with("a", json!({}), json!([]), json!({"gcePersistentDisk": {"pdName": "d"}}));
    let nfs = pv_with("b", json!({}), json!([]), json!({"nfs": {"server": "s", "path": "/"}}));
    assert!(csi::is_pv_migratable(&gce) && !csi::is_pv_migratable(&nfs));
    assert_eq!(csi::in_tree_plugin_name_from_spec(Some(&gce), None).unwrap(), "kubernetes.io/gce-pd");
    // Upstream formats this name with %s: unquoted, unlike the translations' %#v.
    assert_eq!(
        csi::in_tree_plugin_name_from_spec(Some(&nfs), None).unwrap_err().0,
        "could not find in-tree plugin name from persistent volume b"
    );
    let v: Volume = serde_json::from_value(json!({"name": "v", "cinder": {"volumeID": "x"}})).unwrap();
    assert!(csi::is_inline_migratable(&v));
    assert_eq!(csi::in_tree_plugin_name_from_spec(None, Some(&v)).unwrap(), "kubernetes.io/cinder");
    assert_eq!(
        csi::in_tree_plugin_name_from_spec(None, None).unwrap_err().0,
        "both persistent volume and volume are nil"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// PersistentVolumes: to CSI, and round trips

/// (case, in-tree PV, the CSI source it translates to). Each must translate back to the original.
fn round_trip_cases() -> Vec<(&'static str, PersistentVolume, Value)> {
    vec![
        (
            "GCE PD with partition, read-only",
            pv_with(
                "gce",
                json!({}),
                json!([]),
                json!({"accessModes": ["ReadWriteOnce"], "gcePersistentDisk": {"pdName": "disk-1", "fsType": "ext4", "partition": 2, "readOnly": true}}),
            ),
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1",
                   "fsType": "ext4", "readOnly": true, "volumeAttributes": {"partition": "2"}}),
        ),
        (
            "GCE PD with GA zone and region labels and affinity",
            pv_with(
                "gce-zonal",
                json!({GA_ZONE: "us-central1-a", GA_REGION: "us-central1"}),
                json!([[req(GA_ZONE, &["us-central1-a"]), req(GA_REGION, &["us-central1"])]]),
                json!({"gcePersistentDisk": {"pdName": "disk-2"}}),
            ),
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-2",
                   "volumeAttributes": {"partition": ""}}),
        ),
        (
            "AWS EBS",
            pv_with(
                "ebs",
                json!({}),
                json!([]),
                json!({"awsElasticBlockStore": {"volumeID": "vol-0123456789abcdef0", "fsType": "ext3", "partition": 1, "readOnly": true}}),
            ),
            json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0", "fsType": "ext3", "readOnly": true,
                   "volumeAttributes": {"partition": "1"}}),
        ),
        (
            "AWS EBS with GA topology",
            pv_with(
                "ebs-zonal",
                json!({GA_ZONE: "us-east-1a", GA_REGION: "us-east-1"}),
                json!([[req(GA_ZONE, &["us-east-1a"]), req(GA_REGION, &["us-east-1"])]]),
                json!({"awsElasticBlockStore": {"volumeID": "vol-1"}}),
            ),
            json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "volumeAttributes": {"partition": "0"}}),
        ),
        (
            "Cinder with GA topology",
            pv_with(
                "cinder",
                json!({GA_ZONE: "nova"}),
                json!([[req(GA_ZONE, &["nova"])]]),
                json!({"cinder": {"volumeID": "vol1", "fsType": "ext4", "readOnly": true}}),
            ),
            json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "vol1", "fsType": "ext4", "readOnly": true}),
        ),
        (
            "Azure Disk (managed)",
            pv_with(
                "azdisk",
                json!({}),
                json!([]),
                json!({"azureDisk": {"diskName": "name", "diskURI": AZURE_DISK_URI, "cachingMode": "ReadOnly", "fsType": "ext4", "readOnly": false, "kind": "Managed"}}),
            ),
            json!({"driver": "disk.csi.azure.com", "volumeHandle": AZURE_DISK_URI, "fsType": "ext4",
                   "volumeAttributes": {"kind": "Managed", "cachingmode": "ReadOnly", "fstype": "ext4"}}),
        ),
        (
            "Azure File",
            pv_with(
                "azfile",
                json!({}),
                json!([]),
                json!({"azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "ns", "readOnly": true}}),
            ),
            json!({"driver": "file.csi.azure.com", "volumeHandle": "#acct#share#azfile#ns", "readOnly": true,
                   "volumeAttributes": {"sharename": "share"},
                   "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "ns"}}),
        ),
        (
            "Portworx",
            pv_with("px", json!({}), json!([]), json!({"portworxVolume": {"volumeID": "px-1", "fsType": "ext4"}})),
            json!({"driver": "pxd.portworx.com", "volumeHandle": "px-1", "fsType": "ext4"}),
        ),
    ]
}

#[test]
fn in_tree_to_csi_and_back_gives_the_original() {
    for (case, original, want_csi) in round_trip_cases() {
        let migrated = csi::translate_in_tree_pv_to_csi(&original).unwrap_or_else(|e| panic!("{case}: {e}"));
        let m = to_json(&migrated);
        assert_eq!(m["spec"]["csi"], want_csi, "{case}");
        let o = to_json(&original);
        for source in
            ["gcePersistentDisk", "awsElasticBlockStore", "cinder", "azureDisk", "azureFile", "portworxVolume"]
        {
            assert!(m["spec"].get(source).is_none(), "{case}: {source} left in {m}");
        }
        // The input is not modified.
        assert_eq!(to_json(&original), o, "{case}");
        let back = csi::translate_csi_pv_to_in_tree(&migrated).unwrap_or_else(|e| panic!("{case} back: {e}"));
        assert_eq!(to_json(&back), o, "{case}: round trip");
    }
}

#[test]
fn csi_to_in_tree_and_back_gives_the_original() {
    let cases = [
        json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d", "fsType": "ext4", "volumeAttributes": {"partition": ""}}),
        json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "readOnly": true, "volumeAttributes": {"partition": "3"}}),
        json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "c1", "fsType": "xfs"}),
        json!({"driver": "disk.csi.azure.com", "volumeHandle": AZURE_DISK_URI, "fsType": "ext4", "volumeAttributes": {"kind": "Managed", "cachingmode": "None", "fstype": "ext4"}}),
        json!({"driver": "pxd.portworx.com", "volumeHandle": "px", "fsType": "ext4"}),
    ];
    for source in cases {
        let original = pv_with("p", json!({}), json!([]), json!({"csi": source}));
        let in_tree = csi::translate_csi_pv_to_in_tree(&original).unwrap_or_else(|e| panic!("{source}: {e}"));
        let back = csi::translate_in_tree_pv_to_csi(&in_tree).unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(to_json(&back), to_json(&original), "{source}: via {}", to_json(&in_tree));
    }
    // Azure File: the resource group comes back from the PV annotation.
    let original =
        pv(json!({"metadata": {"name": "pv", "annotations": {"kubernetes.io/azure-file-resource-group": "rg"}},
        "spec": {"csi": {"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#pv#ns",
            "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "ns"},
            "volumeAttributes": {"sharename": "share"}}}}));
    let in_tree = csi::translate_csi_pv_to_in_tree(&original).unwrap();
    assert_eq!(
        to_json(&in_tree)["spec"]["azureFile"],
        json!({"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "ns"})
    );
    assert_eq!(to_json(&csi::translate_in_tree_pv_to_csi(&in_tree).unwrap()), to_json(&original));
}

#[test]
fn csi_to_in_tree_details() {
    // Azure File without secret in the source: account and share from the handle, the resource group annotated.
    let p = pv(
        json!({"metadata": {"name": "pv"}, "spec": {"csi": {"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#diskname.vhd"}}}),
    );
    let t = to_json(&csi::translate_csi_pv_to_in_tree(&p).unwrap());
    assert_eq!(
        t["spec"]["azureFile"],
        json!({"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "default"})
    );
    assert_eq!(t["metadata"]["annotations"], json!({"kubernetes.io/azure-file-resource-group": "rg"}));
    // Azure Disk: kind is always Managed; fsType and readOnly are set even when empty (Go points at the CSI fields).
    let p = pv_with(
        "d",
        json!({}),
        json!([]),
        json!({"csi": {"driver": "disk.csi.azure.com", "volumeHandle": "http://acct.blob/vhds/d1.vhd"}}),
    );
    let t = to_json(&csi::translate_csi_pv_to_in_tree(&p).unwrap());
    assert_eq!(
        t["spec"]["azureDisk"],
        json!({"diskName": "d1.vhd", "diskURI": "http://acct.blob/vhds/d1.vhd", "fsType": "", "readOnly": false, "kind": "Managed"})
    );
    // vSphere: the path comes from the attribute the driver records; the handle alone is a volume ID.
    let p = pv_with(
        "vs",
        json!({}),
        json!([[req("topology.csi.vmware.com/zone", &["z1"]), req("topology.csi.vmware.com/region", &["r1"])]]),
        json!({"csi": {"driver": "csi.vsphere.vmware.com", "volumeHandle": "6785a85e", "fsType": "ext4",
                       "volumeAttributes": {"initialvolumefilepath": "[ds] kubevols/v.vmdk"}}}),
    );
    let t = to_json(&csi::translate_csi_pv_to_in_tree(&p).unwrap());
    assert_eq!(t["spec"]["vsphereVolume"], json!({"volumePath": "[ds] kubevols/v.vmdk", "fsType": "ext4"}));
    assert_eq!(t["metadata"]["labels"], json!({GA_ZONE: "z1", GA_REGION: "r1"}));
    assert_eq!(
        t["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([req(GA_ZONE, &["z1"]), req(GA_REGION, &["r1"])])
    );
}

#[test]
fn vsphere_round_trips_through_the_driver_attribute() {
    // To CSI the handle is the volume path; the driver in migration mode records it as initialvolumefilepath,
    // from which the path comes back (upstream has no other way: its handles are volume IDs).
    let original = pv_with(
        "vs",
        json!({GA_ZONE: "z1", GA_REGION: "r1"}),
        json!([[req(GA_ZONE, &["z1"]), req(GA_REGION, &["r1"])]]),
        json!({"vsphereVolume": {"volumePath": "[vsanDatastore] kubevols/v.vmdk", "fsType": "ext4", "storagePolicyName": "gold"}}),
    );
    let mut migrated = csi::translate_in_tree_pv_to_csi(&original).unwrap();
    let m = to_json(&migrated);
    assert_eq!(
        m["spec"]["csi"],
        json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": "[vsanDatastore] kubevols/v.vmdk", "fsType": "ext4",
               "volumeAttributes": {"storagepolicyname": "gold"}})
    );
    assert_eq!(
        m["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([req("topology.csi.vmware.com/zone", &["z1"]), req("topology.csi.vmware.com/region", &["r1"])])
    );
    let spec = migrated.spec.as_mut().unwrap();
    let csi_source = spec.csi.as_mut().unwrap();
    let path = csi_source.volume_handle.clone();
    csi_source.volume_attributes.get_or_insert_with(Default::default).insert("initialvolumefilepath".into(), path);
    let back = to_json(&csi::translate_csi_pv_to_in_tree(&migrated).unwrap());
    let mut want = to_json(&original);
    // The storage policy is a provisioning parameter: the in-tree source does not get it back (as upstream).
    want["spec"]["vsphereVolume"].as_object_mut().unwrap().remove("storagePolicyName");
    assert_eq!(back, want);
}

#[test]
fn access_modes_and_ids_are_normalized_like_upstream() {
    let p = pv_with(
        "g",
        json!({}),
        json!([]),
        json!({"accessModes": ["ReadWriteMany", "ReadOnlyMany"], "gcePersistentDisk": {"pdName": "d"}}),
    );
    assert_eq!(
        to_json(&csi::translate_in_tree_pv_to_csi(&p).unwrap())["spec"]["accessModes"],
        json!(["ReadWriteOnce"])
    );
    let p = pv_with(
        "g",
        json!({}),
        json!([]),
        json!({"accessModes": ["ReadOnlyMany"], "gcePersistentDisk": {"pdName": "d"}}),
    );
    assert_eq!(to_json(&csi::translate_in_tree_pv_to_csi(&p).unwrap())["spec"]["accessModes"], json!(["ReadOnlyMany"]));
    for id in ["aws://us-east-1a/vol-0abc", "aws:///vol-0abc", "vol-0abc"] {
        let p = pv_with("e", json!({}), json!([]), json!({"awsElasticBlockStore": {"volumeID": id}}));
        let t = to_json(&csi::translate_in_tree_pv_to_csi(&p).unwrap());
        assert_eq!(t["spec"]["csi"]["volumeHandle"], "vol-0abc", "{id}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// topology

/// (case, labels, node selector terms, source, terms after translation to CSI, volume handle when it matters)
type TopologyCase<'a> = (&'a str, Value, Value, &'a Value, Value, Option<&'a str>);

#[test]
fn topology_with_beta_and_ga_labels_and_multi_zone_values() {
    let gce = json!({"gcePersistentDisk": {"pdName": "test-disk", "fsType": "ext4"}});
    let ebs =
        json!({"awsElasticBlockStore": {"volumeID": "vol01", "fsType": "ext3", "partition": 1, "readOnly": true}});
    let cinder = json!({"cinder": {"volumeID": "vol1", "fsType": "ext4"}});
    let beta_labels = json!({BETA_ZONE: "us-east-1a", BETA_REGION: "us-east-1"});
    let ga_labels = json!({GA_ZONE: "us-east-1a", GA_REGION: "us-east-1"});
    let gke = "topology.gke.io/zone";
    let ebs_key = "topology.ebs.csi.aws.com/zone";
    let cinder_key = "topology.cinder.csi.openstack.org/zone";
    let cases: Vec<TopologyCase> = vec![
        (
            "GCE PD beta labels",
            beta_labels.clone(),
            json!([]),
            &gce,
            json!([[req(gke, &["us-east-1a"])]]),
            Some("projects/UNSPECIFIED/zones/us-east-1a/disks/test-disk"),
        ),
        (
            "GCE PD GA labels",
            ga_labels.clone(),
            json!([]),
            &gce,
            json!([[req(gke, &["us-east-1a"])]]),
            Some("projects/UNSPECIFIED/zones/us-east-1a/disks/test-disk"),
        ),
        (
            "GCE PD beta affinity",
            json!({}),
            json!([[req(BETA_ZONE, &["us-east-2a"])]]),
            &gce,
            json!([[req(gke, &["us-east-2a"])]]),
            None,
        ),
        (
            "GCE PD CSI affinity",
            json!({}),
            json!([[req(gke, &["us-east-2a"])]]),
            &gce,
            json!([[req(gke, &["us-east-2a"])]]),
            None,
        ),
        (
            "GCE PD labels and affinity: affinity wins",
            beta_labels.clone(),
            json!([[req(BETA_ZONE, &["us-east-2a"])]]),
            &gce,
            json!([[req(gke, &["us-east-2a"])]]),
            None,
        ),
        (
            "GCE PD regional beta label",
            json!({BETA_ZONE: "europe-west1-b__europe-west1-c"}),
            json!([]),
            &gce,
            json!([[req(gke, &["europe-west1-b", "europe-west1-c"])]]),
            Some("projects/UNSPECIFIED/regions/europe-west1/disks/test-disk"),
        ),
        (
            "GCE PD regional GA label",
            json!({GA_ZONE: "europe-west1-c__europe-west1-b"}),
            json!([]),
            &gce,
            json!([[req(gke, &["europe-west1-b", "europe-west1-c"])]]),
            Some("projects/UNSPECIFIED/regions/europe-west1/disks/test-disk"),
        ),
        (
            "GCE PD regional topology",
            json!({}),
            json!([[req(GA_ZONE, &["europe-west1-b", "europe-west1-c"])]]),
            &gce,
            json!([[req(gke, &["europe-west1-b", "europe-west1-c"])]]),
            Some("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/test-disk"),
        ),
        (
            "GCE PD regional label and other topology",
            json!({GA_ZONE: "europe-west1-b__europe-west1-c"}),
            json!([[req(GA_ZONE, &["europe-west1-f", "europe-west1-g"])]]),
            &gce,
            json!([[req(gke, &["europe-west1-f", "europe-west1-g"])]]),
            Some("projects/UNSPECIFIED/regions/europe-west1/disks/test-disk"),
        ),
        (
            "GCE PD multiple terms",
            json!({}),
            json!([[req(GA_ZONE, &["europe-west1-f"])], [req(GA_ZONE, &["europe-west1-g"])]]),
            &gce,
            json!([[req(gke, &["europe-west1-f"])], [req(gke, &["europe-west1-g"])]]),
            None,
        ),
        (
            "GCE PD beta region becomes GA",
            json!({}),
            json!([[req(BETA_ZONE, &["us-east-1a"]), req(BETA_REGION, &["us-east-1"])]]),
            &gce,
            json!([[req(gke, &["us-east-1a"]), req(GA_REGION, &["us-east-1"])]]),
            None,
        ),
        ("AWS EBS beta labels", beta_labels.clone(), json!([]), &ebs, json!([[req(ebs_key, &["us-east-1a"])]]), None),
        (
            "AWS EBS beta labels and topology",
            beta_labels.clone(),
            json!([[req(BETA_ZONE, &["us-east-2a"])]]),
            &ebs,
            json!([[req(ebs_key, &["us-east-2a"])]]),
            None,
        ),
        ("AWS EBS GA labels", ga_labels.clone(), json!([]), &ebs, json!([[req(ebs_key, &["us-east-1a"])]]), None),
        (
            "AWS EBS GA labels and topology",
            ga_labels.clone(),
            json!([[req(GA_ZONE, &["us-east-2a"])]]),
            &ebs,
            json!([[req(ebs_key, &["us-east-2a"])]]),
            None,
        ),
        (
            "AWS EBS multi-zone label",
            json!({GA_ZONE: "us-east-1a__us-east-1b"}),
            json!([]),
            &ebs,
            json!([[req(ebs_key, &["us-east-1a", "us-east-1b"])]]),
            None,
        ),
        (
            "Cinder beta labels",
            beta_labels.clone(),
            json!([]),
            &cinder,
            json!([[req(cinder_key, &["us-east-1a"])]]),
            None,
        ),
        (
            "Cinder beta labels and topology",
            beta_labels.clone(),
            json!([[req(BETA_ZONE, &["us-east-2a"])]]),
            &cinder,
            json!([[req(cinder_key, &["us-east-2a"])]]),
            None,
        ),
    ];
    for (case, labels, terms, source, want_terms, want_handle) in cases {
        let p = pv_with("topo", labels.clone(), terms, source.clone());
        let migrated = csi::translate_in_tree_pv_to_csi(&p).unwrap_or_else(|e| panic!("{case}: {e}"));
        let got: Vec<Value> = affinity(&migrated)["required"]["nodeSelectorTerms"]
            .as_array()
            .unwrap_or_else(|| panic!("{case}: no affinity"))
            .iter()
            .map(|t| t["matchExpressions"].clone())
            .collect();
        assert_eq!(Value::Array(got), want_terms, "{case}");
        if let Some(h) = want_handle {
            assert_eq!(to_json(&migrated)["spec"]["csi"]["volumeHandle"], h, "{case}");
        }
        // Back to in-tree: no CSI key left, the Kubernetes zone key (beta or GA, as the PV used) instead.
        let back = csi::translate_csi_pv_to_in_tree(&migrated).unwrap_or_else(|e| panic!("{case} back: {e}"));
        let a = affinity(&back).to_string();
        for key in [gke, ebs_key, cinder_key] {
            assert!(!a.contains(key), "{case}: {key} left in {a}");
        }
        // The labels say which (the affinity now has the CSI key); GA when they do not.
        let uses_beta = labels.get(BETA_ZONE).is_some();
        assert!(a.contains(if uses_beta { BETA_ZONE } else { GA_ZONE }), "{case}: {a}");
        let back_labels = to_json(&back)["metadata"]["labels"].clone();
        assert!(back_labels.get(GA_ZONE).is_some() || back_labels.get(BETA_ZONE).is_some(), "{case}: {back_labels}");
    }
}

#[test]
fn topology_back_to_in_tree_adds_regions_and_labels() {
    // GCE: the region of each term from its zones, labels for zone (joined) and the single region.
    let p = pv_with(
        "r",
        json!({}),
        json!([[req("topology.gke.io/zone", &["europe-west1-c", "europe-west1-b"])]]),
        json!({"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/regions/europe-west1/disks/d"}}),
    );
    let t = to_json(&csi::translate_csi_pv_to_in_tree(&p).unwrap());
    assert_eq!(
        t["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([req(GA_ZONE, &["europe-west1-c", "europe-west1-b"]), req(GA_REGION, &["europe-west1"])])
    );
    assert_eq!(t["metadata"]["labels"], json!({GA_ZONE: "europe-west1-b__europe-west1-c", GA_REGION: "europe-west1"}));
    // Beta labels stay beta.
    let p = pv_with(
        "r",
        json!({BETA_ZONE: "us-east-1a"}),
        json!([[req("topology.ebs.csi.aws.com/zone", &["us-east-1a"])]]),
        json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}),
    );
    let t = to_json(&csi::translate_csi_pv_to_in_tree(&p).unwrap());
    assert_eq!(
        t["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([req(BETA_ZONE, &["us-east-1a"]), req(BETA_REGION, &["us-east-1"])])
    );
    assert_eq!(t["metadata"]["labels"], json!({BETA_ZONE: "us-east-1a", BETA_REGION: "us-east-1"}));
    // Cinder: no region can be derived.
    let p = pv_with(
        "r",
        json!({}),
        json!([[req("topology.cinder.csi.openstack.org/zone", &["nova"])]]),
        json!({"csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "v"}}),
    );
    let t = to_json(&csi::translate_csi_pv_to_in_tree(&p).unwrap());
    assert_eq!(
        t["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([req(GA_ZONE, &["nova"])])
    );
    assert_eq!(t["metadata"]["labels"], json!({GA_ZONE: "nova"}));
}

// ---------------------------------------------------------------------------------------------------------------
// inline volumes

#[test]
fn inline_volumes_to_csi() {
    let fs = "Filesystem";
    // (volume, namespace, expected PV)
    let cases = [
        (
            json!({"name": "v", "gcePersistentDisk": {"pdName": "pd", "readOnly": true, "partition": 1}}),
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pd.csi.storage.gke.io-pd"}, "spec": {
                "accessModes": ["ReadOnlyMany"], "volumeMode": fs,
                "csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/pd", "readOnly": true, "volumeAttributes": {"partition": "1"}}}}),
        ),
        (
            json!({"name": "v", "awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1", "fsType": "ext4"}}),
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "ebs.csi.aws.com-vol-1"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "volumeMode": fs,
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "fsType": "ext4", "volumeAttributes": {"partition": "0"}}}}),
        ),
        (
            json!({"name": "v", "cinder": {"volumeID": "c1"}}),
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "cinder.csi.openstack.org-c1"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "volumeMode": fs, "csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "c1"}}}),
        ),
        (
            json!({"name": "v", "azureDisk": {"diskName": "dn", "diskURI": "uri", "cachingMode": "ReadWrite", "fsType": "xfs"}}),
            "",
            // Named by the disk URI, as upstream (azure_disk.go), not by the driver and the disk name.
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "uri"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "volumeMode": fs,
                "csi": {"driver": "disk.csi.azure.com", "volumeHandle": "uri", "fsType": "xfs", "volumeAttributes": {"kind": "Managed", "cachingmode": "ReadWrite", "fstype": "xfs"}}}}),
        ),
        (
            json!({"name": "files", "azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "share"}}),
            "team-a",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "#acct#share#files#team-a"}, "spec": {
                "accessModes": ["ReadWriteMany"], "volumeMode": fs,
                "csi": {"driver": "file.csi.azure.com", "volumeHandle": "#acct#share#files#team-a", "volumeAttributes": {"sharename": "share"},
                        "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "team-a"}}}}),
        ),
        (
            json!({"name": "files", "azureFile": {"secretName": "my-secret", "shareName": "share"}}),
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "#my-secret#share#files#default"}, "spec": {
                "accessModes": ["ReadWriteMany"], "volumeMode": fs,
                "csi": {"driver": "file.csi.azure.com", "volumeHandle": "#my-secret#share#files#default", "volumeAttributes": {"sharename": "share"},
                        "nodeStageSecretRef": {"name": "my-secret", "namespace": "default"}}}}),
        ),
        (
            json!({"name": "v", "vsphereVolume": {"volumePath": "[ds] v.vmdk", "storagePolicyName": "gold"}}),
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "csi.vsphere.vmware.com-[ds] v.vmdk"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "volumeMode": fs,
                "csi": {"driver": "csi.vsphere.vmware.com", "volumeHandle": "[ds] v.vmdk", "volumeAttributes": {"storagepolicyname": "gold"}}}}),
        ),
        (
            json!({"name": "v", "portworxVolume": {"volumeID": "px", "readOnly": true}}),
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pxd.portworx.com-px"}, "spec": {
                "accessModes": ["ReadOnlyMany"], "volumeMode": fs, "csi": {"driver": "pxd.portworx.com", "volumeHandle": "px"}}}),
        ),
    ];
    for (vol, ns, want) in cases {
        let v: Volume = serde_json::from_value(vol.clone()).unwrap();
        let got = csi::translate_in_tree_inline_volume_to_csi(&v, ns).unwrap_or_else(|e| panic!("{vol}: {e}"));
        assert_eq!(to_json(&got), want, "{vol}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// StorageClasses

fn sc(provisioner: &str, params: Value, topologies: Value) -> StorageClass {
    let mut v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "sc"}, "provisioner": provisioner});
    if !params.as_object().is_some_and(|p| p.is_empty()) {
        v["parameters"] = params;
    }
    if !topologies.is_null() {
        v["allowedTopologies"] = topologies;
    }
    serde_json::from_value(v).unwrap()
}

fn topo(key: &str, values: &[&str]) -> Value {
    json!([{"matchLabelExpressions": [{"key": key, "values": values}]}])
}

#[test]
fn storage_classes_to_csi() {
    let gke = "topology.gke.io/zone";
    let ebs = "topology.ebs.csi.aws.com/zone";
    let disk = "topology.disk.csi.azure.com/zone";
    let cinder = "topology.cinder.csi.openstack.org/zone";
    let vmw = "topology.csi.vmware.com/zone";
    // (plugin, parameters, allowed topologies, expected parameters, expected allowed topologies)
    let cases = [
        (
            "kubernetes.io/gce-pd",
            json!({"type": "pd-ssd", "fstype": "ext4", "zone": "us-central1-a"}),
            Value::Null,
            json!({"type": "pd-ssd", "csi.storage.k8s.io/fstype": "ext4"}),
            topo(gke, &["us-central1-a"]),
        ),
        (
            "kubernetes.io/gce-pd",
            json!({"zones": "a,b,c", "FSType": "xfs"}),
            Value::Null,
            json!({"csi.storage.k8s.io/fstype": "xfs"}),
            topo(gke, &["a", "b", "c"]),
        ),
        ("kubernetes.io/gce-pd", json!({}), topo(BETA_ZONE, &["a"]), Value::Null, topo(gke, &["a"])),
        (
            "kubernetes.io/gce-pd",
            json!({}),
            json!([{"matchLabelExpressions": [{"key": GA_ZONE, "values": ["a"]}, {"key": "other", "values": ["x"]}]}]),
            Value::Null,
            json!([{"matchLabelExpressions": [{"key": gke, "values": ["a"]}, {"key": "other", "values": ["x"]}]}]),
        ),
        (
            "kubernetes.io/aws-ebs",
            json!({"type": "gp3", "fstype": "ext4", "zones": "us-east-1a,us-east-1b"}),
            Value::Null,
            json!({"type": "gp3", "csi.storage.k8s.io/fstype": "ext4"}),
            topo(ebs, &["us-east-1a", "us-east-1b"]),
        ),
        (
            "kubernetes.io/aws-ebs",
            json!({"foo": "bar"}),
            topo(GA_ZONE, &["us-east-1a"]),
            json!({"foo": "bar"}),
            topo(ebs, &["us-east-1a"]),
        ),
        (
            "kubernetes.io/azure-disk",
            json!({"skuName": "Premium_LRS", "fstype": "ext4", "zone": "eastus-1"}),
            Value::Null,
            json!({"skuName": "Premium_LRS", "fstype": "ext4"}),
            topo(disk, &["eastus-1"]),
        ),
        ("kubernetes.io/azure-disk", json!({}), topo(BETA_ZONE, &["foo"]), Value::Null, topo(disk, &["foo"])),
        (
            "kubernetes.io/cinder",
            json!({"availability": "nova", "fstype": "ext4", "type": "fast"}),
            topo(GA_ZONE, &["nova"]),
            json!({"availability": "nova", "csi.storage.k8s.io/fstype": "ext4", "type": "fast"}),
            topo(cinder, &["nova"]),
        ),
        (
            "kubernetes.io/azure-file",
            json!({"skuName": "Standard_LRS"}),
            Value::Null,
            json!({"skuName": "Standard_LRS"}),
            Value::Null,
        ),
        (
            "kubernetes.io/vsphere-volume",
            json!({"storagePolicyName": "gold", "datastore": "ds1", "diskformat": "thin", "hostFailuresToTolerate": "1", "fstype": "ext4", "unknown": "x"}),
            topo(BETA_ZONE, &["z1"]),
            json!({"storagepolicyname": "gold", "datastore-migrationparam": "ds1", "diskformat-migrationparam": "thin",
                "hostfailurestotolerate-migrationparam": "1", "csi.storage.k8s.io/fstype": "ext4", "csimigration": "true"}),
            topo(vmw, &["z1"]),
        ),
    ];
    for (plugin, params, topologies, want_params, want_topologies) in cases {
        let input = sc(plugin, params.clone(), topologies);
        let out = csi::translate_in_tree_storage_class_to_csi(plugin, &input)
            .unwrap_or_else(|e| panic!("{plugin} {params}: {e}"));
        let o = to_json(&out);
        assert_eq!(o.get("parameters").cloned().unwrap_or(Value::Null), want_params, "{plugin} {params}");
        assert_eq!(o.get("allowedTopologies").cloned().unwrap_or(Value::Null), want_topologies, "{plugin} {params}");
        assert_eq!(o["provisioner"], plugin, "only Portworx changes the provisioner");
    }
    let px = csi::translate_in_tree_storage_class_to_csi(
        "kubernetes.io/portworx-volume",
        &sc("kubernetes.io/portworx-volume", json!({"repl": "3"}), Value::Null),
    )
    .unwrap();
    assert_eq!(to_json(&px)["provisioner"], "pxd.portworx.com");
    assert_eq!(to_json(&px)["parameters"], json!({"repl": "3"}));
}

#[test]
fn storage_class_zones_together_with_allowed_topologies_is_an_error() {
    for plugin in ["kubernetes.io/gce-pd", "kubernetes.io/aws-ebs", "kubernetes.io/azure-disk"] {
        for params in [json!({"zone": "a"}), json!({"zones": "a,b"})] {
            let input = sc(plugin, params, topo(GA_ZONE, &["a"]));
            assert_eq!(
                csi::translate_in_tree_storage_class_to_csi(plugin, &input).unwrap_err().0,
                "cannot simultaneously set allowed topologies and zone/zones parameters",
                "{plugin}"
            );
        }
    }
    assert_eq!(
        csi::translate_in_tree_storage_class_to_csi(
            "kubernetes.io/nfs",
            &sc("kubernetes.io/nfs", json!({}), Value::Null)
        )
        .unwrap_err()
        .0,
        "could not find in-tree storage class parameter translation logic for \"kubernetes.io/nfs\""
    );
}

// ---------------------------------------------------------------------------------------------------------------
// errors

#[test]
fn malformed_ebs_volume_ids() {
    let cases = [
        ("aws://us-east-1a/disk-1", "Invalid format for AWS volume (aws://us-east-1a/disk-1)"),
        ("aws://us-east-1a/vol-1/extra", "Invalid format for AWS volume (aws://us-east-1a/vol-1/extra)"),
        ("aws:///", "Invalid format for AWS volume (aws:///)"),
        ("aws://us-east-1a/vol-%zz", "Invalid disk name (aws://us-east-1a/vol-%zz): parse \"aws://us-east-1a/vol-%zz\": invalid URL escape \"%zz\""),
        ("aws://us-east-1a:port/vol-1", "Invalid disk name (aws://us-east-1a:port/vol-1): parse \"aws://us-east-1a:port/vol-1\": invalid port \":port\" after host"),
    ];
    for (id, reason) in cases {
        let want = format!("failed to translate Kubernetes ID to EBS Volume ID {reason}");
        let p = pv_with("e", json!({}), json!([]), json!({"awsElasticBlockStore": {"volumeID": id}}));
        assert_eq!(err_pv(csi::translate_in_tree_pv_to_csi(&p)), want, "{id}");
        let v: Volume = serde_json::from_value(json!({"name": "v", "awsElasticBlockStore": {"volumeID": id}})).unwrap();
        assert_eq!(err_pv(csi::translate_in_tree_inline_volume_to_csi(&v, "")), want, "{id}");
    }
}

#[test]
fn mixed_regions() {
    let p = pv_with(
        "g",
        json!({GA_ZONE: "us-central1-a__europe-west1-b"}),
        json!([]),
        json!({"gcePersistentDisk": {"pdName": "d"}}),
    );
    assert_eq!(
        err_pv(csi::translate_in_tree_pv_to_csi(&p)),
        "failed to get region from zones: multiple or no regions gotten from zones, got: map[europe-west1:{} us-central1:{}]"
    );
    let p = pv_with("g", json!({BETA_ZONE: "zone1__zone2"}), json!([]), json!({"gcePersistentDisk": {"pdName": "d"}}));
    assert_eq!(
        err_pv(csi::translate_in_tree_pv_to_csi(&p)),
        "failed to get region from zones: zone in unexpected format, expected: {locale}-{region}-{zone}, got: zone1"
    );
    // Back to in-tree, the region of a term's zones must be one.
    let p = pv_with(
        "e",
        json!({}),
        json!([[req("topology.ebs.csi.aws.com/zone", &["us-east-1a", "us-west-2a"])]]),
        json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}),
    );
    let e = err_pv(csi::translate_csi_pv_to_in_tree(&p));
    assert!(e.starts_with("failed to translate topology. PV:{"), "{e}");
    assert!(
        e.ends_with(". Error:Failed to handle region topology. error: multiple or no regions gotten from zones, got: map[us-east-1:{} us-west-2:{}]"),
        "{e}"
    );
    let p = pv_with(
        "g",
        json!({}),
        json!([[req("topology.gke.io/zone", &["us-central1-a", "us-east1-b"])]]),
        json!({"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/z/disks/d"}}),
    );
    assert!(err_pv(csi::translate_csi_pv_to_in_tree(&p)).ends_with("got: map[us-central1:{} us-east1:{}]"));
}

#[test]
fn non_managed_azure_disk() {
    for kind in ["Shared", "Dedicated"] {
        let want = format!("kind({kind}) is not supported in csi migration");
        let p = pv_with(
            "d",
            json!({}),
            json!([]),
            json!({"azureDisk": {"diskName": "n", "diskURI": AZURE_DISK_URI, "kind": kind}}),
        );
        assert_eq!(err_pv(csi::translate_in_tree_pv_to_csi(&p)), want);
        let v: Volume =
            serde_json::from_value(json!({"name": "v", "azureDisk": {"diskName": "n", "diskURI": "u", "kind": kind}}))
                .unwrap();
        assert_eq!(err_pv(csi::translate_in_tree_inline_volume_to_csi(&v, "")), want);
    }
    // "managed" in any case is managed.
    let p = pv_with(
        "d",
        json!({}),
        json!([]),
        json!({"azureDisk": {"diskName": "n", "diskURI": AZURE_DISK_URI, "kind": "managed"}}),
    );
    assert_eq!(
        to_json(&csi::translate_in_tree_pv_to_csi(&p).unwrap())["spec"]["csi"]["volumeAttributes"]["kind"],
        "Managed"
    );
}

#[test]
fn nil_sources_and_other_errors() {
    let empty = pv_with("pv", json!({}), json!([]), json!({}));
    let no_vol: Volume = serde_json::from_value(json!({"name": "v"})).unwrap();
    let nil_pv = [
        (
            "kubernetes.io/gce-pd",
            "pv is nil or GCE Persistent Disk source not defined on pv",
            "volume is nil or GCE PD not defined on volume",
        ),
        (
            "kubernetes.io/aws-ebs",
            "pv is nil or AWS EBS not defined on pv",
            "volume is nil or AWS EBS not defined on volume",
        ),
        (
            "kubernetes.io/cinder",
            "pv is nil or Cinder not defined on pv",
            "volume is nil or Cinder not defined on volume",
        ),
        (
            "kubernetes.io/azure-disk",
            "pv is nil or Azure Disk source not defined on pv",
            "volume is nil or Azure Disk not defined on volume",
        ),
        (
            "kubernetes.io/azure-file",
            "pv is nil or Azure File source not defined on pv",
            "volume is nil or Azure File not defined on volume",
        ),
        (
            "kubernetes.io/vsphere-volume",
            "pv is nil or VsphereVolume not defined on pv",
            "volume is nil or VsphereVolume not defined on volume",
        ),
        (
            "kubernetes.io/portworx-volume",
            "pv is nil or PortworxVolume not defined on pv",
            "volume is nil or PortworxVolume not defined on volume",
        ),
    ];
    for (name, pv_err, vol_err) in nil_pv {
        let p = csi::plugin_by_in_tree_name(name).unwrap();
        assert!(!p.can_support(&empty) && !p.can_support_inline(&no_vol));
        assert_eq!(err_pv(p.translate_in_tree_pv_to_csi(empty.clone())), pv_err);
        assert_eq!(err_pv(p.translate_in_tree_inline_volume_to_csi(&no_vol, "")), vol_err);
        assert_eq!(err_pv(p.translate_csi_pv_to_in_tree(empty.clone())), "pv is nil or CSI source not defined on pv");
    }
    // The top level.
    assert_eq!(
        err_pv(csi::translate_in_tree_pv_to_csi(&empty)),
        "could not find in-tree plugin translation logic for \"pv\""
    );
    assert_eq!(err_pv(csi::translate_csi_pv_to_in_tree(&empty)), "CSI persistent volume was nil");
    assert_eq!(
        err_pv(csi::translate_in_tree_inline_volume_to_csi(&no_vol, "")),
        "could not find in-tree plugin translation logic for \"v\""
    );
    let other = pv_with("pv", json!({}), json!([]), json!({"csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "h"}}));
    assert_eq!(
        err_pv(csi::translate_csi_pv_to_in_tree(&other)),
        "could not find in-tree plugin translation logic for nfs.csi.k8s.io"
    );
    // Handles and attributes that do not parse.
    let bad = |source: Value| {
        err_pv(csi::translate_csi_pv_to_in_tree(&pv_with("pv", json!({}), json!([]), json!({"csi": source}))))
    };
    assert_eq!(
        bad(json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones"})),
        "failed to get id components.Got: 3, wanted 6 components or more. "
    );
    assert_eq!(
        bad(
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/z/disks/d", "volumeAttributes": {"partition": "abc"}})
        ),
        "Failed to convert partition abc to integer: strconv.Atoi: parsing \"abc\": invalid syntax"
    );
    assert_eq!(
        bad(json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "volumeAttributes": {"partition": ""}})),
        "failed to convert partition  to integer: strconv.Atoi: parsing \"\": invalid syntax"
    );
    assert_eq!(
        bad(json!({"driver": "disk.csi.azure.com", "volumeHandle": "/subscriptions/1/providers/Microsoft.Compute/disks/n"})),
        "could not get disk name from /subscriptions/1/providers/Microsoft.Compute/disks/n, correct format: .*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)"
    );
    assert_eq!(
        bad(json!({"driver": "file.csi.azure.com", "volumeHandle": "rg#acct"})),
        "error parsing volume id: \"rg#acct\", should at least contain two #"
    );
    // Azure File needs a secret namespace: from the source or the claim.
    let p = pv_with("pv", json!({}), json!([]), json!({"azureFile": {"secretName": "s", "shareName": "share"}}));
    assert_eq!(
        err_pv(csi::translate_in_tree_pv_to_csi(&p)),
        "could not find a secret namespace in PersistentVolumeSource or ClaimRef"
    );
    let p = pv_with(
        "pv",
        json!({}),
        json!([]),
        json!({"azureFile": {"secretName": "s", "shareName": "share"}, "claimRef": {"namespace": "claims", "name": "c"}}),
    );
    assert_eq!(
        to_json(&csi::translate_in_tree_pv_to_csi(&p).unwrap())["spec"]["csi"]["volumeHandle"],
        "#s#share#pv#claims"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The CSITranslation API, through kubectl

const TRANSLATION: &str = r#"apiVersion: migration.k8s.io/v1alpha1
kind: CSITranslation
metadata:
  name: regional-pd
spec:
  persistentVolume:
    apiVersion: v1
    kind: PersistentVolume
    metadata:
      name: pv-regional
      labels:
        topology.kubernetes.io/zone: europe-west1-b__europe-west1-c
    spec:
      capacity: {storage: 200Gi}
      accessModes: [ReadWriteOnce]
      persistentVolumeReclaimPolicy: Retain
      gcePersistentDisk: {pdName: data-disk, fsType: ext4}
"#;

/// kubectl with `stdin` that must succeed; returns stdout.
fn kubectl_stdin_ok(s: &Server, args: &[&str], stdin: &str) -> String {
    let out = s.kubectl_stdin(args, stdin);
    assert!(out.status.success(), "kubectl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}): {text}"))
}

#[test]
fn kubectl_create_returns_the_translation_and_stores_nothing() {
    let s = Server::start(&["--disable-scheduler"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("translation.yaml");
    std::fs::write(&file, TRANSLATION).expect("write");
    let out = yaml(&s.kubectl_ok(&["create", "-f", file.to_str().unwrap(), "-o", "yaml"]));
    assert_eq!(out["kind"], "CSITranslation");
    assert_eq!(out["spec"]["direction"], "ToCSI");
    let st = &out["status"];
    assert_eq!(st["inTreePluginName"], "kubernetes.io/gce-pd");
    assert_eq!(st["driverName"], "pd.csi.storage.gke.io");
    assert!(st.get("error").is_none(), "{st}");
    let pv = &st["persistentVolume"];
    assert_eq!(pv["kind"], "PersistentVolume");
    assert_eq!(pv["metadata"]["name"], "pv-regional");
    assert_eq!(
        pv["spec"]["csi"],
        json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/regions/europe-west1/disks/data-disk",
               "fsType": "ext4", "volumeAttributes": {"partition": ""}})
    );
    assert!(pv["spec"].get("gcePersistentDisk").is_none());
    assert_eq!(pv["spec"]["capacity"], json!({"storage": "200Gi"}));
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([req("topology.gke.io/zone", &["europe-west1-b", "europe-west1-c"])])
    );
    // Without -o: the usual one-liner; nothing was stored, nothing can be read.
    let line = s.kubectl_ok(&["create", "-f", file.to_str().unwrap()]);
    assert_eq!(line.trim(), "csitranslation.migration.k8s.io/regional-pd created");
    let get = s.kubectl(&["get", "csitranslations"]);
    assert!(!get.status.success());
    assert!(
        String::from_utf8_lossy(&get.stderr).contains("MethodNotAllowed"),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let explain = s.kubectl_ok(&["explain", "csitranslation.spec"]);
    assert!(
        explain.contains("persistentVolume") && explain.contains("inlineVolume") && explain.contains("storageClass"),
        "{explain}"
    );

    // Back to in-tree.
    let csi_pv = serde_json::to_string(pv).unwrap();
    let back = format!(
        r#"{{"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation", "metadata": {{"name": "back"}},
            "spec": {{"direction": "ToInTree", "persistentVolume": {csi_pv}}}}}"#
    );
    let out: Value =
        serde_json::from_str(&kubectl_stdin_ok(&s, &["create", "-f", "-", "-o", "json"], &back)).expect("json");
    let pv = &out["status"]["persistentVolume"];
    assert_eq!(pv["spec"]["gcePersistentDisk"], json!({"pdName": "data-disk", "fsType": "ext4"}));
    assert_eq!(pv["metadata"]["labels"][GA_ZONE], "europe-west1-b__europe-west1-c");

    // A translation error is a result (201) with status.error, like a TokenReview that does not authenticate.
    let failing = r#"{"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation", "metadata": {"name": "az"},
        "spec": {"inlineVolume": {"name": "data", "azureDisk": {"diskName": "d", "diskURI": "u", "kind": "Dedicated"}}}}"#;
    let out: Value =
        serde_json::from_str(&kubectl_stdin_ok(&s, &["create", "-f", "-", "-o", "json"], failing)).expect("json");
    assert_eq!(out["status"]["error"], "kind(Dedicated) is not supported in csi migration");
    assert_eq!(out["status"]["driverName"], "disk.csi.azure.com");
    assert!(out["status"].get("persistentVolume").is_none());

    // A request that cannot be translated as asked: 422 listing every field.
    let malformed = r#"{"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation", "metadata": {"name": "bad"},
        "spec": {"direction": "Sideways", "podNamespace": "x",
                 "storageClass": {"provisioner": "kubernetes.io/gce-pd"}, "inlineVolume": {"name": "v"}}}"#;
    let r = s.kubectl_stdin(&["create", "-f", "-"], malformed);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(!r.status.success());
    assert!(err.contains("is invalid"), "{err}");
    for field in ["spec.storageClass", "spec.direction", "Unsupported value: \"Sideways\""] {
        assert!(err.contains(field), "{field} missing: {err}");
    }
}

#[tokio::test]
async fn the_api_answers_like_a_virtual_resource() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let base = "/apis/migration.k8s.io/v1alpha1/csitranslations";
    let body = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "CSITranslation",
        "spec": {"storageClass": {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "standard"},
                 "provisioner": "kubernetes.io/aws-ebs", "parameters": {"type": "gp2", "zone": "us-east-1a"}}}});
    // No name needed: nothing is stored.
    let r = call(&c, Method::POST, base, serde_json::to_vec(&body).unwrap()).await;
    assert_eq!(r.0, 201, "{}", r.1);
    let sc = &r.1["status"]["storageClass"];
    assert_eq!(sc["parameters"], json!({"type": "gp2"}));
    assert_eq!(sc["allowedTopologies"], topo("topology.ebs.csi.aws.com/zone", &["us-east-1a"]));
    // Strict field validation on request.
    let mut unknown = body.clone();
    unknown["spec"]["bogus"] = json!(1);
    let r =
        call(&c, Method::POST, &format!("{base}?fieldValidation=Strict"), serde_json::to_vec(&unknown).unwrap()).await;
    assert_eq!(r.0, 400, "{}", r.1);
    assert!(r.1["message"].as_str().unwrap().contains("unknown field \"spec.bogus\""), "{}", r.1);
    // A JSON array for a struct is a decode error at its path, as a value of any other wrong type, not read as the
    // struct's fields in order (serde's derived decoders would), in our types and k8s-openapi's alike.
    for (spec, path, expected) in [
        (json!([]), "spec", "struct CSITranslationSpec"),
        (
            json!({"repairVolumeHandle": ["pd.csi.storage.gke.io", "h", "n"]}),
            "spec.repairVolumeHandle",
            "struct VolumeHandleRepair",
        ),
        (
            json!({"storageClass": {"provisioner": "kubernetes.io/aws-ebs", "metadata": []}}),
            "spec.storageClass.metadata",
            "ObjectMeta",
        ),
    ] {
        let mut listed = body.clone();
        listed["spec"] = spec;
        let r = call(&c, Method::POST, base, serde_json::to_vec(&listed).unwrap()).await;
        assert_eq!((r.0, r.1["reason"].as_str()), (400, Some("BadRequest")), "{}", r.1);
        assert_eq!(
            r.1["message"],
            format!("error decoding CSITranslation at {path}: invalid type: sequence, expected {expected}"),
            "{}",
            r.1
        );
    }
    // Every other verb: 405.
    for (m, p) in [
        (Method::GET, base.to_string()),
        (Method::GET, format!("{base}/x")),
        (Method::GET, format!("{base}?watch=true")),
        (Method::DELETE, format!("{base}/x")),
        (Method::DELETE, base.to_string()),
        (Method::PUT, format!("{base}/x")),
    ] {
        let r = call(&c, m.clone(), &p, serde_json::to_vec(&body).unwrap()).await;
        assert_eq!(r.0, 405, "{m} {p}: {}", r.1);
        assert_eq!(r.1["reason"], "MethodNotAllowed");
    }
}

/// A raw request with the admin client; (status, JSON body).
async fn call(c: &kube::Client, method: Method, path: &str, body: Vec<u8>) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(20), c.send(req)).await.expect("answer in 20s").expect("send");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())))
}

// ---------------------------------------------------------------------------------------------------------------
// migration-apiserver translate

fn translate(args: &[&str], input: &str) -> (bool, String, String) {
    let out = translate_cli(args, input.as_bytes());
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn translate_command_round_trips_through_stdin_and_stdout() {
    let pv = r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: ebs
  labels:
    topology.kubernetes.io/zone: us-east-1a
    topology.kubernetes.io/region: us-east-1
spec:
  accessModes: [ReadWriteOnce]
  capacity: {storage: 5Gi}
  awsElasticBlockStore: {volumeID: vol-0abc, fsType: ext4}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: topology.kubernetes.io/zone, operator: In, values: [us-east-1a]}
        - {key: topology.kubernetes.io/region, operator: In, values: [us-east-1]}
"#;
    // YAML in, YAML out.
    let (ok, out, err) = translate(&[], pv);
    assert!(ok, "{err}");
    let csi_pv = yaml(&out);
    assert_eq!(csi_pv["spec"]["csi"]["driver"], "ebs.csi.aws.com");
    assert_eq!(csi_pv["spec"]["csi"]["volumeHandle"], "vol-0abc");
    let (ok, back, err) = translate(&["--to-intree"], &out);
    assert!(ok, "{err}");
    assert_eq!(yaml(&back), yaml(pv), "round trip");
    // JSON in, JSON out.
    let json_pv = serde_json::to_string(&yaml(pv)).unwrap();
    let (ok, out, err) = translate(&[], &json_pv);
    assert!(ok && out.trim_start().starts_with('{'), "{err}{out}");
    let (ok, back, err) = translate(&["--to-intree"], &out);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&back).unwrap(), yaml(pv));

    // A StorageClass; a Pod's inline volumes (its namespace for Azure File); a bare inline volume.
    let sc = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: s}\nprovisioner: kubernetes.io/gce-pd\nparameters: {type: pd-ssd, zones: 'europe-west1-b,europe-west1-c'}\n";
    let (ok, out, err) = translate(&[], sc);
    assert!(ok, "{err}");
    assert_eq!(yaml(&out)["allowedTopologies"], topo("topology.gke.io/zone", &["europe-west1-b", "europe-west1-c"]));
    let pod = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [
            {"name": "cfg", "configMap": {"name": "x"}},
            {"name": "share", "azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "s"}},
            {"name": "disk", "gcePersistentDisk": {"pdName": "d"}}]}}"#;
    let (ok, out, err) = translate(&[], pod);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "configMap is not translated: {list}");
    assert_eq!(items[0]["spec"]["csi"]["volumeHandle"], "#acct#s#share#team");
    assert_eq!(items[1]["spec"]["csi"]["driver"], "pd.csi.storage.gke.io");
    let (ok, out, err) =
        translate(&["--pod-namespace", "other"], "name: v\nazureFile: {secretName: sec, shareName: s}\n");
    assert!(ok, "{err}");
    assert_eq!(yaml(&out)["spec"]["csi"]["nodeStageSecretRef"]["namespace"], "other");

    // Failures: the library's message on stderr, exit code 1.
    let (ok, _, err) = translate(&[], "kind: PersistentVolume\napiVersion: v1\nmetadata: {name: x}\nspec: {awsElasticBlockStore: {volumeID: 'aws://z/nope'}}\n");
    assert!(!ok);
    assert!(
        err.contains("failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://z/nope)"),
        "{err}"
    );
    let (ok, _, err) = translate(&["--to-intree"], sc);
    assert!(!ok && err.contains("StorageClass cannot be translated to in-tree"), "{err}");
    let (ok, _, err) = translate(&[], "kind: ConfigMap\n");
    assert!(!ok && err.contains("cannot translate a ConfigMap"), "{err}");
}

// ---------------------------------------------------------------------------------------------------------------
// the PV/PVC admission webhooks

async fn post_review(c: &kube::Client, path: &str, review: &Value) -> Value {
    let (status, body) = call(c, Method::POST, path, serde_json::to_vec(review).unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(body["response"]["uid"], review["request"]["uid"], "uid echoed");
    body["response"].clone()
}

/// The AdmissionReview kube-apiserver sends for a write of a core/v1 `object`.
fn review(uid: &str, operation: &str, object: &Value, old: Option<&Value>) -> Value {
    let kind = object["kind"].as_str().expect("kind");
    let resource = if kind == "PersistentVolume" { "persistentvolumes" } else { "persistentvolumeclaims" };
    let of = ReviewOf {
        group: "",
        version: "v1",
        kind,
        resource,
        operation,
        username: "system:serviceaccount:kube-system:persistent-volume-binder",
        groups: &["system:serviceaccounts", "system:authenticated"],
    };
    let mut r = admission_review(uid, &of, Some(object), old);
    let req = &mut r["request"];
    req["name"] = object["metadata"]["name"].clone();
    let options = if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" };
    req["options"] = json!({"apiVersion": "meta.k8s.io/v1", "kind": options});
    if let Some(ns) = object["metadata"].get("namespace") {
        req["namespace"] = ns.clone();
    }
    r
}

/// The object with the response's patch applied (the object itself without a patch).
fn patched(object: &Value, response: &Value) -> Value {
    assert_eq!(response["allowed"], true, "{response}");
    let Some(p) = response["patch"].as_str() else {
        assert!(response.get("patchType").is_none());
        return object.clone();
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let raw = base64::engine::general_purpose::STANDARD.decode(p).expect("base64");
    let ops: Vec<Value> = serde_json::from_slice(&raw).expect("patch JSON");
    for op in &ops {
        assert!(op["path"].as_str().unwrap().starts_with("/metadata"), "only metadata.annotations is patched: {op}");
    }
    let patch: json_patch::Patch = serde_json::from_slice(&raw).expect("JSON patch");
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).expect("patch applies");
    out
}

fn claim(annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "data", "namespace": "team", "annotations": annotations, "uid": "0c2a4c0e-6a4e-4e0c-9d43-1c5f0c7e5a01"},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "standard"}})
}

fn volume(annotations: Option<Value>, source: Value) -> Value {
    let mut meta = json!({"name": "pv-1", "uid": "1c2a4c0e-6a4e-4e0c-9d43-1c5f0c7e5a01"});
    if let Some(a) = annotations {
        meta["annotations"] = a;
    }
    let mut spec = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete"});
    for (k, v) in source.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta, "spec": spec})
}

const MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
const MUTATE: &str = "/mutate-csi-migration";
const VALIDATE: &str = "/validate-csi-migration";

fn migrated_to(o: &Value) -> Option<&str> {
    o["metadata"]["annotations"][MIGRATED_TO].as_str()
}

#[tokio::test]
async fn mutating_webhook_sets_the_annotation_when_the_gate_is_on() {
    let s = Server::start(&[
        "--disable-scheduler",
        "--feature-gates",
        "CSIMigrationAWS=true",
        "--feature-gates=CSIMigrationGCE=true",
    ]);
    let c = s.client().await;

    // PVC CREATE, GA provisioner annotation of a migrated plugin: set; a reinvocation changes nothing.
    let pvc = claim(json!({"volume.kubernetes.io/storage-provisioner": "kubernetes.io/aws-ebs"}));
    let r = post_review(&c, MUTATE, &review("u1", "CREATE", &pvc, None)).await;
    let out = patched(&pvc, &r);
    assert_eq!(migrated_to(&out), Some("ebs.csi.aws.com"));
    assert_eq!(out["spec"], pvc["spec"]);
    assert_eq!(out["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"], "kubernetes.io/aws-ebs");
    let again = post_review(&c, MUTATE, &review("u2", "CREATE", &out, None)).await;
    assert!(again.get("patch").is_none(), "idempotent: {again}");

    // PVC UPDATE with the beta provisioner annotation and a stale driver: corrected.
    let old = claim(json!({"volume.beta.kubernetes.io/storage-provisioner": "kubernetes.io/gce-pd"}));
    let new =
        claim(json!({"volume.beta.kubernetes.io/storage-provisioner": "kubernetes.io/gce-pd", MIGRATED_TO: "stale"}));
    let r = post_review(&c, MUTATE, &review("u3", "UPDATE", &new, Some(&old))).await;
    assert_eq!(migrated_to(&patched(&new, &r)), Some("pd.csi.storage.gke.io"));

    // PVC of a plugin whose gate is off: the annotation goes.
    let pvc = claim(
        json!({"volume.kubernetes.io/storage-provisioner": "kubernetes.io/cinder", MIGRATED_TO: "cinder.csi.openstack.org"}),
    );
    let r = post_review(&c, MUTATE, &review("u4", "UPDATE", &pvc, Some(&pvc))).await;
    let out = patched(&pvc, &r);
    assert_eq!(migrated_to(&out), None);
    assert_eq!(
        out["metadata"]["annotations"],
        json!({"volume.kubernetes.io/storage-provisioner": "kubernetes.io/cinder"})
    );

    // A PVC without a provisioner (bound to a static PV): untouched.
    let pvc = claim(json!({"note": "static"}));
    assert!(post_review(&c, MUTATE, &review("u5", "CREATE", &pvc, None)).await.get("patch").is_none());

    // PV CREATE, statically provisioned GCE PD without annotations: the annotations map is created; the volume
    // source is never changed.
    let pv = volume(None, json!({"gcePersistentDisk": {"pdName": "disk-1", "fsType": "ext4"}}));
    let r = post_review(&c, MUTATE, &review("u6", "CREATE", &pv, None)).await;
    let out = patched(&pv, &r);
    assert_eq!(out["metadata"]["annotations"], json!({MIGRATED_TO: "pd.csi.storage.gke.io"}));
    assert_eq!(out["spec"], pv["spec"]);
    assert!(post_review(&c, MUTATE, &review("u7", "UPDATE", &out, Some(&pv))).await.get("patch").is_none());

    // PV UPDATE, dynamically provisioned by the in-tree EBS plugin, already annotated: no patch.
    let pv = volume(
        Some(json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs", MIGRATED_TO: "ebs.csi.aws.com"})),
        json!({"awsElasticBlockStore": {"volumeID": "vol-1"}}),
    );
    let r = post_review(&c, MUTATE, &review("u8", "UPDATE", &pv, Some(&pv))).await;
    assert!(r.get("patch").is_none(), "{r}");
    // provisioned-by decides over the source (as the PV controller): an Azure Disk provisioner is not migrated.
    let pv = volume(
        Some(json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/azure-disk", MIGRATED_TO: "disk.csi.azure.com"})),
        json!({"azureDisk": {"diskName": "d", "diskURI": AZURE_DISK_URI}}),
    );
    assert_eq!(
        migrated_to(&patched(&pv, &post_review(&c, MUTATE, &review("u9", "UPDATE", &pv, Some(&pv))).await)),
        None
    );
    // A CSI PV provisioned by a CSI driver: nothing to do.
    let pv = volume(
        Some(json!({"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com"})),
        json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}),
    );
    assert!(post_review(&c, MUTATE, &review("u10", "CREATE", &pv, None)).await.get("patch").is_none());

    // DELETE and other kinds: allowed as they are (other kinds with a warning about the rules).
    let mut del = review("u11", "DELETE", &pv, Some(&pv));
    del["request"]["object"] = Value::Null;
    let r = post_review(&c, MUTATE, &del).await;
    assert!(r["allowed"] == true && r.get("patch").is_none());
    let mut pod = review("u12", "CREATE", &pv, None);
    pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    let r = post_review(&c, MUTATE, &pod).await;
    assert!(r["allowed"] == true && r.get("patch").is_none());
    assert!(r["warnings"][0].as_str().unwrap().contains("not Pod"), "{r}");
    // Not an AdmissionReview: 400, as /mutate answers.
    let (status, body) = call(&c, Method::POST, MUTATE, br#"{"kind": "AdmissionReview"}"#.to_vec()).await;
    assert_eq!(status, 400, "{body}");

    // The server refuses to start with an unknown gate.
    let out = Command::new(BIN).args(["serve", "--feature-gates", "CSIMigrationNFS=true"]).output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unrecognized feature gate: CSIMigrationNFS") && err.contains("CSIMigrationGCE"), "{err}");
}

#[tokio::test]
async fn mutating_webhook_removes_the_annotation_when_the_gates_are_off() {
    // Default gates: no plugin is migrated (rollback).
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let pvc = claim(
        json!({"volume.kubernetes.io/storage-provisioner": "kubernetes.io/aws-ebs", MIGRATED_TO: "ebs.csi.aws.com"}),
    );
    for (uid, op) in [("o1", "CREATE"), ("o2", "UPDATE")] {
        let r = post_review(&c, MUTATE, &review(uid, op, &pvc, Some(&pvc))).await;
        let out = patched(&pvc, &r);
        assert_eq!(migrated_to(&out), None, "{op}");
        assert!(post_review(&c, MUTATE, &review(uid, op, &out, Some(&out))).await.get("patch").is_none());
    }
    let pv = volume(
        Some(json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd", MIGRATED_TO: "pd.csi.storage.gke.io"})),
        json!({"gcePersistentDisk": {"pdName": "d"}}),
    );
    let r = post_review(&c, MUTATE, &review("o3", "UPDATE", &pv, Some(&pv))).await;
    let out = patched(&pv, &r);
    assert_eq!(out["metadata"]["annotations"], json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd"}));
    assert_eq!(out["spec"], pv["spec"]);
    // With the umbrella gate off, a plugin gate changes nothing either.
    let s = Server::start(&["--disable-scheduler", "--feature-gates", "CSIMigration=false,CSIMigrationGCE=true"]);
    let c = s.client().await;
    let r = post_review(&c, MUTATE, &review("o4", "UPDATE", &pv, Some(&pv))).await;
    assert_eq!(migrated_to(&patched(&pv, &r)), None);
}

#[tokio::test]
async fn validating_webhook_checks_the_csi_driver_in_the_cluster() {
    let gce_pv = volume(None, json!({"gcePersistentDisk": {"pdName": "disk-1"}}));
    let cinder_pv = volume(None, json!({"cinder": {"volumeID": "c1"}}));
    let pvc = claim(json!({"volume.kubernetes.io/storage-provisioner": "kubernetes.io/gce-pd"}));

    // Without a cluster client: admitted, with a warning that the check was skipped.
    let mut s = Server::start(&["--disable-scheduler", "--feature-gates", "CSIMigrationGCE=true"]);
    let c = s.client().await;
    let r = post_review(&c, VALIDATE, &review("v1", "CREATE", &gce_pv, None)).await;
    assert_eq!(r["allowed"], true);
    let warning = r["warnings"][0].as_str().unwrap_or_default();
    assert!(warning.contains("pd.csi.storage.gke.io") && warning.contains("not checked"), "{r}");
    assert!(r.get("patch").is_none(), "a validating answer never patches");
    let r = post_review(&c, VALIDATE, &review("v2", "CREATE", &pvc, None)).await;
    assert!(r["allowed"] == true && r.get("warnings").is_none(), "{r}");

    // A cluster without the driver's CSIDriver (here the server itself, which answers GET
    // /apis/storage.k8s.io/v1/csidrivers/<name> with 404 as kube-apiserver does for a missing object): denied.
    let kubeconfig = s.kubeconfig();
    let kc = kubeconfig.to_str().unwrap().to_string();
    s.restart_with(&["--disable-scheduler", "--feature-gates", "CSIMigrationGCE=true", "--kubeconfig", &kc]);
    let c = s.client().await;
    let r = post_review(&c, VALIDATE, &review("v3", "CREATE", &gce_pv, None)).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(r["status"]["code"], 403);
    let msg = r["status"]["message"].as_str().unwrap();
    for part in [
        "PersistentVolume \"pv-1\"",
        "kubernetes.io/gce-pd",
        "CSIMigrationGCE",
        "no CSIDriver \"pd.csi.storage.gke.io\"",
    ] {
        assert!(msg.contains(part), "{part} missing: {msg}");
    }
    // Only new PVs of migrated plugins are checked.
    assert_eq!(post_review(&c, VALIDATE, &review("v4", "UPDATE", &gce_pv, Some(&gce_pv))).await["allowed"], true);
    assert_eq!(post_review(&c, VALIDATE, &review("v5", "CREATE", &cinder_pv, None)).await["allowed"], true);
    assert_eq!(post_review(&c, VALIDATE, &review("v6", "CREATE", &pvc, None)).await["allowed"], true);

    // A cluster that cannot be reached: admitted, with a warning (the check is advisory).
    let dir = tempfile::tempdir().expect("tempdir");
    let unreachable = dir.path().join("unreachable.kubeconfig");
    let text =
        std::fs::read_to_string(&kubeconfig).unwrap().replace(&s.url(), &format!("https://127.0.0.1:{}", free_port()));
    std::fs::write(&unreachable, text).unwrap();
    s.restart_with(&[
        "--disable-scheduler",
        "--feature-gates",
        "CSIMigrationGCE=true",
        "--kubeconfig",
        unreachable.to_str().unwrap(),
    ]);
    let c = s.client().await;
    let r = post_review(&c, VALIDATE, &review("v7", "CREATE", &gce_pv, None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r["warnings"][0].as_str().unwrap().contains("could not be checked"), "{r}");
}

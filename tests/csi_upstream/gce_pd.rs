//! Upstream: kubernetes/csi-translation-lib `plugins/gce_pd_test.go` at 83cf1e337910ea773d78dcb905d57e8305b3f65d
//! (file last changed in 0feceeb, kubernetes/kubernetes 1298c8a5fe6a33726f76516f71e83e52c46eee66).
//!
//! TestBackwardCompatibleAccessModes calls `backwardCompatibleAccessModes`: here the access modes of a GCE PD PV
//! translated to CSI. TestRepairVolumeHandle's node IDs are `nodeIDFmt` (`projects/%s/zones/%s/instances/%s`).

use super::*;
use serde_json::{json, Value};

const DRIVER: &str = "pd.csi.storage.gke.io";
const PLUGIN: &str = "kubernetes.io/gce-pd";
const KEY: &str = "topology.gke.io/zone";

fn storage_class(name: &str, params: Value, topologies: Value, expect: Expect) -> Case {
    case(
        format!("TestTranslatePDInTreeStorageClassToCSI/{name}"),
        Input::StorageClass(sc(PLUGIN, params, topologies)),
        expect,
    )
}

fn sc_result(params: Value, topologies: Value) -> Expect {
    Expect::Result(sc(PLUGIN, params, topologies))
}

fn repair(name: &str, handle: &str, node: &str, expect: Expect) -> Case {
    let input = Input::Repair { driver: DRIVER, handle: handle.into(), node: node.into() };
    case(format!("TestRepairVolumeHandle/{name}"), input, expect)
}

fn handle(h: &str) -> Expect {
    Expect::Result(Value::from(h))
}

fn access_modes(name: &str, given: &[&str], want: &[&str]) -> Case {
    let input = pv(json!({}), json!({"accessModes": given, "gcePersistentDisk": {"pdName": "pd"}}));
    case(
        format!("TestBackwardCompatibleAccessModes/{name}"),
        Input::PvToCsi(input),
        parts(vec![("/spec/accessModes", json!(want))]),
    )
}

fn vol_id(name: &str, label: &str, value: &str, want: &str) -> Case {
    let input = pv(json!({"labels": {label: value}}), json!({"gcePersistentDisk": {"pdName": "pd-name"}}));
    let expect = parts(vec![("/spec/csi/volumeHandle", json!(want))]);
    case(format!("TestTranslateInTreePVToCSIVolIDFmt/{name}"), Input::PvToCsi(input), expect)
}

pub fn cases() -> Vec<Case> {
    let (rox, rwo, rwx) = ("ReadOnlyMany", "ReadWriteOnce", "ReadWriteMany");
    let node = "projects/bing/zones/bada/instances/boom";
    let regional_node = "projects/bing/zones/us-central1-c/instances/boom";
    vec![
        storage_class(
            "nothing special",
            json!({"foo": "bar"}),
            Value::Null,
            sc_result(json!({"foo": "bar"}), Value::Null),
        ),
        storage_class(
            "fstype",
            json!({"fstype": "myfs"}),
            Value::Null,
            sc_result(json!({"csi.storage.k8s.io/fstype": "myfs"}), Value::Null),
        ),
        storage_class("empty params", json!({}), Value::Null, sc_result(Value::Null, Value::Null)),
        storage_class("zone", json!({"zone": "foo"}), Value::Null, sc_result(Value::Null, selectors(KEY, &["foo"]))),
        storage_class(
            "zones",
            json!({"zones": "foo,bar,baz"}),
            Value::Null,
            sc_result(Value::Null, selectors(KEY, &["foo", "bar", "baz"])),
        ),
        storage_class(
            "some normal topology",
            json!({}),
            selectors(KEY, &["foo"]),
            sc_result(Value::Null, selectors(KEY, &["foo"])),
        ),
        storage_class(
            "some translated topology",
            json!({}),
            selectors(BETA_ZONE, &["foo"]),
            sc_result(Value::Null, selectors(KEY, &["foo"])),
        ),
        storage_class(
            "zone and topology",
            json!({"zone": "foo"}),
            selectors(KEY, &["foo"]),
            error("cannot simultaneously set allowed topologies and zone/zones parameters"),
        ),
        repair("fully specified", "projects/foo/zones/bar/disks/baz", node, handle("projects/foo/zones/bar/disks/baz")),
        repair(
            "fully specified (regional)",
            "projects/foo/regions/us-central1-c/disks/baz",
            node,
            handle("projects/foo/regions/us-central1-c/disks/baz"),
        ),
        repair(
            "no project",
            "projects/UNSPECIFIED/zones/bar/disks/baz",
            node,
            handle("projects/bing/zones/bar/disks/baz"),
        ),
        repair(
            "no project or zone",
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/baz",
            node,
            handle("projects/bing/zones/bada/disks/baz"),
        ),
        repair(
            "no project or region",
            "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/baz",
            regional_node,
            handle("projects/bing/regions/us-central1/disks/baz"),
        ),
        repair(
            "no project (regional)",
            "projects/UNSPECIFIED/regions/us-west1/disks/baz",
            regional_node,
            handle("projects/bing/regions/us-west1/disks/baz"),
        ),
        repair(
            "invalid handle",
            "foo",
            regional_node,
            error("volume handle has wrong number of elements; got 1, wanted 6 or more"),
        ),
        repair(
            "invalid node ID",
            "projects/UNSPECIFIED/regions/us-west1/disks/baz",
            "foo",
            error("node handle has wrong number of elements; got 1, wanted 6 or more"),
        ),
        access_modes("ROX", &[rox], &[rox]),
        access_modes("RWO", &[rwo], &[rwo]),
        access_modes("RWX", &[rwx], &[rwo]),
        access_modes("RWO, ROX", &[rox, rwo], &[rwo]),
        access_modes("RWO, RWX", &[rwo, rwx], &[rwo]),
        access_modes("RWX, ROX", &[rwx, rox], &[rwo]),
        access_modes("RWX, ROX, RWO", &[rwx, rwo, rox], &[rwo]),
        case(
            "TestInlineReadOnly",
            Input::Inline(json!({"name": "", "gcePersistentDisk": {"pdName": "foo", "readOnly": true}}), ""),
            parts(vec![("/spec/csi/readOnly", json!(true)), ("/spec/accessModes", json!([rox]))]),
        ),
        vol_id(
            "beta topology key zonal",
            BETA_ZONE,
            "us-east1-a",
            "projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name",
        ),
        vol_id("v1 topology key zonal", GA_ZONE, "us-east1-a", "projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name"),
        vol_id(
            "beta topology key regional",
            BETA_ZONE,
            "us-central1-a__us-central1-c",
            "projects/UNSPECIFIED/regions/us-central1/disks/pd-name",
        ),
        vol_id(
            "v1 topology key regional",
            GA_ZONE,
            "us-central1-a__us-central1-c",
            "projects/UNSPECIFIED/regions/us-central1/disks/pd-name",
        ),
    ]
}

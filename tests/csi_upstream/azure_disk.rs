//! Upstream: kubernetes/csi-translation-lib `plugins/azure_disk_test.go` at 83cf1e337910ea773d78dcb905d57e8305b3f65d
//! (file last changed in 0feceeb, kubernetes/kubernetes 1298c8a5fe6a33726f76516f71e83e52c46eee66).
//!
//! TestIsManagedDisk and TestGetDiskName call `isManagedDisk` and `getDiskName`: here the disk name a CSI PV with
//! that handle gets back in-tree, or the error naming the pattern (managed or not) the handle was held against.
//! The CSI PVs of TestTranslateTranslateCSIPVToInTree carry the driver that selects the plugin.

use super::*;
use serde_json::{json, Value};

const DRIVER: &str = "disk.csi.azure.com";
const PLUGIN: &str = "kubernetes.io/azure-disk";
const KEY: &str = "topology.disk.csi.azure.com/zone";
const DISK_URI: &str = "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name";
const MANAGED_RE: &str = ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";
const UNMANAGED_RE: &str = "http(?:.*)://(?:.*)/vhds/(.+)";
const NOT_MIGRATED: &str = "kind(Dedicated) is not supported in csi migration";

fn disk_name(test: &str, uri: &str, expect: Expect) -> Case {
    let input = pv(json!({}), json!({"csi": {"driver": DRIVER, "volumeHandle": uri}}));
    case(format!("{test}/{uri}"), Input::PvToInTree(input), expect)
}

fn name_is(n: &str) -> Expect {
    parts(vec![("/spec/azureDisk/diskName", json!(n))])
}

fn no_name(uri: &str, pattern: &str) -> Expect {
    error(format!("could not get disk name from {uri}, correct format: {pattern}"))
}

fn csi_to_in_tree(name: &str, attributes: Value, caching_mode: &str) -> Case {
    let input = pv(
        json!({}),
        json!({"csi": {"driver": DRIVER, "fsType": "fstype", "readOnly": true, "volumeAttributes": attributes,
            "volumeHandle": DISK_URI}}),
    );
    let want = pv(
        json!({}),
        json!({"azureDisk": {"cachingMode": caching_mode, "diskURI": DISK_URI, "fsType": "fstype", "readOnly": true,
            "kind": "Managed", "diskName": "name"}}),
    );
    case(format!("TestTranslateTranslateCSIPVToInTree/{name}"), Input::PvToInTree(input), Expect::Result(want))
}

fn storage_class(name: &str, params: Value, topologies: Value, expect: Expect) -> Case {
    let input = Input::StorageClass(sc(PLUGIN, params, topologies));
    case(format!("TestTranslateInTreeStorageClassToCSI/{name}"), input, expect)
}

fn sc_result(params: Value, topologies: Value) -> Expect {
    Expect::Result(sc(PLUGIN, params, topologies))
}

pub fn cases() -> Vec<Case> {
    let managed_only = "testurl/subscriptions/23/providers/Microsoft.Compute/disks/name";
    let mut cases = vec![
        disk_name(
            "TestIsManagedDisk",
            "testurl/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name",
            name_is("name"),
        ),
        disk_name("TestIsManagedDisk", "test.com", no_name("test.com", MANAGED_RE)),
        disk_name("TestIsManagedDisk", "HTTP://test.com", no_name("HTTP://test.com", UNMANAGED_RE)),
        disk_name("TestIsManagedDisk", "http://test.com/vhds/name", name_is("name")),
        disk_name("TestGetDiskName", managed_only, no_name(managed_only, MANAGED_RE)),
        disk_name("TestGetDiskName", "http://test.io/name", no_name("http://test.io/name", UNMANAGED_RE)),
        case(
            "TestTranslateAzureDiskInTreeInlineVolumeToCSI/no azure disk volume",
            Input::Inline(json!({"name": ""}), ""),
            error("could not find in-tree plugin translation logic for \"\""),
        ),
        case(
            "TestTranslateAzureDiskInTreeInlineVolumeToCSI/azure disk volume",
            Input::Inline(json!({"name": "", "azureDisk": {"diskName": "diskname", "diskURI": "datadiskuri"}}), ""),
            Expect::Result(pv(
                json!({"name": "datadiskuri"}),
                json!({"accessModes": ["ReadWriteOnce"], "volumeMode": FILESYSTEM,
                    "csi": {"driver": DRIVER, "volumeHandle": "datadiskuri", "volumeAttributes": {"kind": "Managed"}}}),
            )),
        ),
        case(
            "TestTranslateAzureDiskInTreeInlineVolumeToCSI/azure disk volume with non-managed kind",
            Input::Inline(
                json!({"name": "", "azureDisk": {"diskName": "diskname", "diskURI": "datadiskuri", "kind": "Dedicated"}}),
                "",
            ),
            error(NOT_MIGRATED),
        ),
        case(
            "TestTranslateAzureDiskInTreePVToCSI/no azure disk volume",
            Input::PvToCsi(pv(json!({}), json!({}))),
            error("could not find in-tree plugin translation logic for \"\""),
        ),
        case(
            "TestTranslateAzureDiskInTreePVToCSI/azure disk volume",
            Input::PvToCsi(pv(
                json!({}),
                json!({"azureDisk": {"cachingMode": "cachingmode", "diskName": "", "diskURI": DISK_URI, "fsType": "fstype",
                    "readOnly": true}}),
            )),
            Expect::Result(pv(
                json!({}),
                json!({"csi": {"driver": DRIVER, "fsType": "fstype", "readOnly": true, "volumeHandle": DISK_URI,
                    "volumeAttributes": {"cachingmode": "cachingmode", "fstype": "fstype", "kind": "Managed"}}}),
            )),
        ),
        case(
            "TestTranslateAzureDiskInTreePVToCSI/azure disk volume with non-managed kind",
            Input::PvToCsi(pv(
                json!({}),
                json!({"azureDisk": {"cachingMode": "cachingmode", "diskName": "", "diskURI": DISK_URI, "fsType": "fstype",
                    "readOnly": true, "kind": "Dedicated"}}),
            )),
            error(NOT_MIGRATED),
        ),
        csi_to_in_tree(
            "azure disk volume with ReadOnly cachingMode",
            json!({"cachingmode": "ReadOnly", "fstype": "fstype", "kind": "managed"}),
            "ReadOnly",
        ),
        csi_to_in_tree(
            "azure disk volume with ReadOnly cachingMode (the second of that name)",
            json!({"cachingmode": "ReadOnly", "fstype": "fstype", "kind": "managed"}),
            "ReadOnly",
        ),
        csi_to_in_tree(
            "azure disk volume with None cachingMode",
            json!({"cachingMode": "None", "fsType": "fstype", "kind": "managed"}),
            "None",
        ),
        csi_to_in_tree(
            "azure disk volume with ReadWrite cachingMode",
            json!({"cachingMode": "ReadWrite", "fsType": "fstype", "kind": "managed"}),
            "ReadWrite",
        ),
    ];
    cases.extend([
        storage_class(
            "nothing special",
            json!({"foo": "bar"}),
            Value::Null,
            sc_result(json!({"foo": "bar"}), Value::Null),
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
            selectors(GA_ZONE, &["foo"]),
            sc_result(Value::Null, selectors(KEY, &["foo"])),
        ),
        storage_class(
            "some translated topology with beta labels",
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
        storage_class(
            "topology in regions without zones",
            json!({}),
            selectors(GA_ZONE, &["0"]),
            sc_result(Value::Null, selectors(KEY, &[""])),
        ),
        storage_class(
            "longer topology in regions without zones",
            json!({}),
            selectors(GA_ZONE, &["1234"]),
            sc_result(Value::Null, selectors(KEY, &[""])),
        ),
        storage_class(
            "topology in regions with zones",
            json!({}),
            selectors(GA_ZONE, &["centralus-1"]),
            sc_result(Value::Null, selectors(KEY, &["centralus-1"])),
        ),
    ]);
    cases
}

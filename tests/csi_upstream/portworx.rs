//! Upstream: kubernetes/csi-translation-lib `plugins/portworx_test.go` at 83cf1e337910ea773d78dcb905d57e8305b3f65d
//! (file last changed in 7addcac, kubernetes/kubernetes 40b9a29738959ee6f4c053ab1fb59687b7097e20: the secret
//! parameters and annotations).
//!
//! The StorageClasses of "empty" and "with secret params" have no provisioner upstream (the plugin is called
//! directly); here they carry the in-tree provisioner, which selects the plugin and becomes the driver.
//! "no CSI section" goes back to in-tree without a CSI source: the library's error from the command, a 422 from
//! the API.

use super::*;
use serde_json::{json, Value};

const DRIVER: &str = "pxd.portworx.com";
const PLUGIN: &str = "kubernetes.io/portworx-volume";

fn storage_class(name: &str, params: Value, want: Value) -> Case {
    let input = Input::StorageClass(sc(PLUGIN, params, Value::Null));
    case(
        format!("TestTranslatePortworxInTreeStorageClassToCSI/{name}"),
        input,
        Expect::Result(sc(DRIVER, want, Value::Null)),
    )
}

/// The PV of TestTranslatePortworxInTreePVToCSI and TestTranslatePortworxCSIPvToInTree with `source` (and the
/// annotations when not null).
fn px_pv(annotations: Value, source: Value) -> Value {
    let mut meta = json!({"name": "pxd.portworx.com"});
    if !annotations.is_null() {
        meta["annotations"] = annotations;
    }
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "claimRef": {"name": "test-pvc", "namespace": "default"}});
    spec.as_object_mut().unwrap().extend(source.as_object().cloned().unwrap_or_default());
    pv(meta, spec)
}

pub fn cases() -> Vec<Case> {
    let params = json!({"repl": "1", "fs": "ext4", "shared": "true", "priority_io": "high"});
    let secret_annotations = json!({"openstorage.io/auth-secret-name": "test-secret", "openstorage.io/auth-secret-namespace": "test-namespace"});
    let secret = json!({"name": "test-secret", "namespace": "test-namespace"});
    let in_tree = json!({"portworxVolume": {"volumeID": "ID1111", "fsType": "type"}});
    let csi = json!({"csi": {"driver": DRIVER, "volumeHandle": "ID1111", "fsType": "type"}});
    vec![
        storage_class("correct", params.clone(), params),
        storage_class("empty", Value::Null, Value::Null),
        storage_class(
            "with secret params",
            json!({"repl": "1", "openstorage.io/auth-secret-name": "test-secret",
                "openstorage.io/auth-secret-namespace": "test-namespace"}),
            json!({
                "repl": "1",
                "csi.storage.k8s.io/provisioner-secret-name": "test-secret",
                "csi.storage.k8s.io/provisioner-secret-namespace": "test-namespace",
                "csi.storage.k8s.io/controller-publish-secret-name": "test-secret",
                "csi.storage.k8s.io/controller-publish-secret-namespace": "test-namespace",
                "csi.storage.k8s.io/node-stage-secret-name": "test-secret",
                "csi.storage.k8s.io/node-stage-secret-namespace": "test-namespace",
                "csi.storage.k8s.io/node-publish-secret-name": "test-secret",
                "csi.storage.k8s.io/node-publish-secret-namespace": "test-namespace",
                "csi.storage.k8s.io/controller-expand-secret-name": "test-secret",
                "csi.storage.k8s.io/controller-expand-secret-namespace": "test-namespace",
                "csi.storage.k8s.io/node-expand-secret-name": "test-secret",
                "csi.storage.k8s.io/node-expand-secret-namespace": "test-namespace",
            }),
        ),
        case(
            "TestTranslatePortworxInTreeInlineVolumeToCSI/normal",
            Input::Inline(
                json!({"name": "PortworxVol", "portworxVolume": {"volumeID": "ID", "fsType": "type", "readOnly": false}}),
                "ns",
            ),
            Expect::Result(pv(
                json!({"name": "pxd.portworx.com-ID"}),
                json!({"accessModes": ["ReadWriteOnce"], "volumeMode": FILESYSTEM,
                    "csi": {"driver": DRIVER, "volumeHandle": "ID", "fsType": "type"}}),
            )),
        ),
        case(
            "TestTranslatePortworxInTreePVToCSI/no Portworx volume",
            Input::PvToCsi(px_pv(Value::Null, json!({}))),
            error("could not find in-tree plugin translation logic for \"pxd.portworx.com\""),
        ),
        case(
            "TestTranslatePortworxInTreePVToCSI/normal",
            Input::PvToCsi(px_pv(Value::Null, in_tree.clone())),
            Expect::Result(px_pv(Value::Null, csi.clone())),
        ),
        case(
            "TestTranslatePortworxInTreePVToCSI/with secret annotations",
            Input::PvToCsi(px_pv(secret_annotations.clone(), in_tree.clone())),
            Expect::Result(px_pv(
                secret_annotations,
                json!({"csi": {"driver": DRIVER, "volumeHandle": "ID1111", "fsType": "type",
                    "controllerPublishSecretRef": secret, "nodeStageSecretRef": secret, "nodePublishSecretRef": secret,
                    "controllerExpandSecretRef": secret, "nodeExpandSecretRef": secret}}),
            )),
        ),
        case(
            "TestTranslatePortworxCSIPvToInTree/no CSI section",
            Input::PvToInTree(px_pv(Value::Null, json!({}))),
            Expect::Invalid { message: "CSI persistent volume was nil", field: "spec.persistentVolume.spec.csi" },
        ),
        case(
            "TestTranslatePortworxCSIPvToInTree/normal",
            Input::PvToInTree(px_pv(Value::Null, csi)),
            Expect::Result(px_pv(Value::Null, in_tree)),
        ),
    ]
}

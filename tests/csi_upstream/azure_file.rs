//! Upstream: kubernetes/csi-translation-lib `plugins/azure_file_test.go` at 83cf1e337910ea773d78dcb905d57e8305b3f65d
//! (file last changed in 0feceeb, kubernetes/kubernetes 1298c8a5fe6a33726f76516f71e83e52c46eee66).
//!
//! TestGetFileShareInfo calls `getFileShareInfo`: here a CSI PV with that handle and no attributes back in-tree
//! (share, account and resource group come from the handle). TestGetStorageAccount calls `getStorageAccountName`:
//! here the account part of the handle of an in-tree PV with that secret translated to CSI; where the helper fails,
//! the translation takes the secret name itself (upstream only logs the error). The CSI PVs of
//! TestTranslateCSIPVToInTree carry the driver that selects the plugin; TestTranslateAzureFileInTreeStorageClassToCSI
//! tests inline volumes, as its body does.

use super::*;
use serde_json::{json, Value};

const DRIVER: &str = "file.csi.azure.com";
const RG_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";
const SHARE_ID: &str = "rg#f5713de20cde511e8ba4900#pvc-file-dynamic-17e43f84-f474-11e8-acd0-000d3a00df41";
const HANDLE: &str = "rg#st#pvc-file-dynamic#diskname.vhd";

fn share_info(id: &str, expect: Expect) -> Case {
    let input = pv(json!({}), json!({"csi": {"driver": DRIVER, "volumeHandle": id}}));
    case(format!("TestGetFileShareInfo/{id:?}"), Input::PvToInTree(input), expect)
}

fn share_info_ok() -> Expect {
    Expect::Result(pv(
        json!({"annotations": {RG_ANNOTATION: "rg"}}),
        json!({"azureFile": {"secretName": "azure-storage-account-f5713de20cde511e8ba4900-secret",
            "shareName": "pvc-file-dynamic-17e43f84-f474-11e8-acd0-000d3a00df41", "secretNamespace": "default"}}),
    ))
}

fn unparsable(id: &str) -> Expect {
    error(format!("error parsing volume id: {id:?}, should at least contain two #"))
}

fn inline(name: &str, namespace: &'static str, volume: Value, expect: Expect) -> Case {
    case(format!("TestTranslateAzureFileInTreeStorageClassToCSI/{name}"), Input::Inline(volume, namespace), expect)
}

fn inline_pv(namespace: &str) -> Expect {
    let id = format!("#secretname#sharename#name#{namespace}");
    Expect::Result(pv(
        json!({"name": id}),
        json!({"accessModes": ["ReadWriteMany"], "volumeMode": FILESYSTEM,
            "csi": {"driver": DRIVER, "nodeStageSecretRef": {"name": "secretname", "namespace": namespace},
                "readOnly": true, "volumeAttributes": {"sharename": "sharename"}, "volumeHandle": id}}),
    ))
}

fn to_csi(name: &str, input: Value, expect: Expect) -> Case {
    case(format!("TestTranslateAzureFileInTreePVToCSI/{name}"), Input::PvToCsi(input), expect)
}

/// An in-tree Azure File PV `uuid` (with the resource group annotation, a secret namespace, a claim in it).
fn file_pv(rg: bool, secret_namespace: bool, claim: bool) -> Value {
    let mut meta = json!({"name": "uuid"});
    if rg {
        meta["annotations"] = json!({RG_ANNOTATION: "rg"});
    }
    let mut source = json!({"shareName": "sharename", "secretName": "secretname", "readOnly": true});
    if secret_namespace {
        source["secretNamespace"] = json!("secretnamespace");
    }
    let mut spec = json!({"azureFile": source});
    if claim {
        spec["claimRef"] = json!({"namespace": "secretnamespace"});
    }
    pv(meta, spec)
}

/// What `file_pv` translates to, with the handle `handle`.
fn csi_pv(rg: bool, claim: bool, handle: &str) -> Expect {
    let mut want = file_pv(rg, false, claim);
    want["spec"].as_object_mut().unwrap().remove("azureFile");
    want["spec"]["csi"] = json!({"driver": DRIVER, "readOnly": true,
        "nodeStageSecretRef": {"name": "secretname", "namespace": "secretnamespace"},
        "volumeAttributes": {"sharename": "sharename"}, "volumeHandle": handle});
    Expect::Result(want)
}

fn to_in_tree(name: &str, meta: Value, csi: Value, expect: Expect) -> Case {
    let mut source = json!({"driver": DRIVER, "volumeHandle": ""});
    source.as_object_mut().unwrap().extend(csi.as_object().cloned().unwrap_or_default());
    case(format!("TestTranslateCSIPVToInTree/{name}"), Input::PvToInTree(pv(meta, json!({"csi": source}))), expect)
}

fn in_tree(meta: Value, azure_file: Value) -> Expect {
    Expect::Result(pv(meta, json!({"azureFile": azure_file})))
}

fn account(secret: &str, want: &str) -> Case {
    let input = pv(
        json!({"name": "pv"}),
        json!({"azureFile": {"secretName": secret, "shareName": "share", "secretNamespace": "ns"}}),
    );
    let expect = parts(vec![("/spec/csi/volumeHandle", json!(format!("#{want}#share#pv#ns")))]);
    case(format!("TestGetStorageAccount/{secret}"), Input::PvToCsi(input), expect)
}

pub fn cases() -> Vec<Case> {
    let share = json!({"shareName": "sharename"});
    let named = json!({"name": "file.csi.azure.com-sharename"});
    let source = json!({"readOnly": true, "secretName": "secretname", "shareName": "sharename"});
    vec![
        share_info(&format!("{SHARE_ID}#diskname.vhd"), share_info_ok()),
        share_info(SHARE_ID, share_info_ok()),
        share_info("rg#f5713de20cde511e8ba4900", unparsable("rg#f5713de20cde511e8ba4900")),
        share_info("rg", unparsable("rg")),
        share_info("", unparsable("")),
        inline(
            "no azure file volume",
            "",
            json!({"name": ""}),
            error("could not find in-tree plugin translation logic for \"\""),
        ),
        inline("azure file volume", "", json!({"name": "name", "azureFile": source}), inline_pv("default")),
        inline(
            "azure file volume with a pod namespace",
            "test",
            json!({"name": "name", "azureFile": source}),
            inline_pv("test"),
        ),
        to_csi(
            "no azure file volume",
            pv(json!({}), json!({})),
            error("could not find in-tree plugin translation logic for \"\""),
        ),
        to_csi(
            "return error if secret namespace could not be found",
            file_pv(true, false, false),
            error("could not find a secret namespace in PersistentVolumeSource or ClaimRef"),
        ),
        to_csi(
            "azure file volume",
            file_pv(false, true, false),
            csi_pv(false, false, "#secretname#sharename#uuid#secretnamespace"),
        ),
        to_csi(
            "azure file volume with rg annotation",
            file_pv(true, true, false),
            csi_pv(true, false, "rg#secretname#sharename#uuid#secretnamespace"),
        ),
        to_csi(
            "get secret namespace from ClaimRef when it's missing in pv spec source",
            file_pv(true, false, true),
            csi_pv(true, true, "rg#secretname#sharename#uuid#secretnamespace"),
        ),
        to_in_tree(
            "resource group empty",
            json!({}),
            json!({"nodeStageSecretRef": {"name": "ut", "namespace": "secretnamespace"}, "readOnly": true,
                "volumeAttributes": share}),
            in_tree(
                json!({}),
                json!({"secretName": "ut", "secretNamespace": "secretnamespace", "readOnly": true, "shareName": "sharename"}),
            ),
        ),
        to_in_tree(
            "translate from volume handle error",
            json!({}),
            json!({"volumeHandle": "sharename", "readOnly": true, "volumeAttributes": share}),
            unparsable("sharename"),
        ),
        to_in_tree(
            "translate from VolumeAttributes",
            named.clone(),
            json!({"volumeHandle": HANDLE, "readOnly": true, "volumeAttributes": share}),
            in_tree(
                json!({"name": "file.csi.azure.com-sharename", "annotations": {RG_ANNOTATION: "rg"}}),
                json!({"secretName": "azure-storage-account-st-secret", "shareName": "sharename",
                    "secretNamespace": "default", "readOnly": true}),
            ),
        ),
        to_in_tree(
            "translate from SecretMap VolumeAttributes",
            named.clone(),
            json!({"volumeHandle": HANDLE, "readOnly": true, "volumeAttributes":
                {"shareName": "sharename", "secretName": "secretname", "secretNamespace": "secretnamespace"}}),
            in_tree(
                named.clone(),
                json!({"secretName": "secretname", "secretNamespace": "secretnamespace", "shareName": "sharename",
                    "readOnly": true}),
            ),
        ),
        to_in_tree(
            "translate from NodeStageSecretRef",
            named.clone(),
            json!({"volumeHandle": HANDLE, "readOnly": true, "volumeAttributes": share,
                "nodeStageSecretRef": {"name": "secretname", "namespace": "secretnamespace"}}),
            in_tree(
                named.clone(),
                json!({"secretName": "secretname", "shareName": "sharename", "secretNamespace": "secretnamespace",
                    "readOnly": true}),
            ),
        ),
        to_in_tree(
            "translate from VolumeHandle",
            named,
            json!({"volumeHandle": HANDLE, "readOnly": true}),
            in_tree(
                json!({"name": "file.csi.azure.com-sharename", "annotations": {RG_ANNOTATION: "rg"}}),
                json!({"secretName": "azure-storage-account-st-secret", "shareName": "pvc-file-dynamic",
                    "secretNamespace": "default", "readOnly": true}),
            ),
        ),
        account("azure-storage-account-accountname-secret", "accountname"),
        account("azure-storage-account-accountname-dup-secret", "accountname-dup"),
        account("invalid", "invalid"),
    ]
}

//! Upstream: kubernetes/csi-translation-lib `plugins/openstack_cinder_test.go` at
//! 83cf1e337910ea773d78dcb905d57e8305b3f65d (file last changed in 0feceeb, kubernetes/kubernetes
//! 1298c8a5fe6a33726f76516f71e83e52c46eee66).

use super::*;
use serde_json::{json, Value};

const PLUGIN: &str = "kubernetes.io/cinder";
const KEY: &str = "topology.cinder.csi.openstack.org/zone";

fn storage_class(name: &str, params: Value, topologies: Value, want: Expect) -> Case {
    let input = Input::StorageClass(sc(PLUGIN, params, topologies));
    case(format!("TestTranslateCinderInTreeStorageClassToCSI/{name}"), input, want)
}

pub fn cases() -> Vec<Case> {
    let result = |params: Value, topologies: Value| Expect::Result(sc(PLUGIN, params, topologies));
    vec![
        storage_class(
            "translate normal",
            json!({"foo": "bar"}),
            Value::Null,
            result(json!({"foo": "bar"}), Value::Null),
        ),
        storage_class("translate empty map", json!({}), Value::Null, result(Value::Null, Value::Null)),
        storage_class(
            "translate with fstype",
            json!({"fstype": "ext3"}),
            Value::Null,
            result(json!({"csi.storage.k8s.io/fstype": "ext3"}), Value::Null),
        ),
        storage_class(
            "translate with topology in parameters (no translation expected)",
            json!({"availability": "nova"}),
            Value::Null,
            result(json!({"availability": "nova"}), Value::Null),
        ),
        storage_class(
            "translate with topology",
            json!({}),
            selectors(BETA_ZONE, &["nova"]),
            result(Value::Null, selectors(KEY, &["nova"])),
        ),
    ]
}

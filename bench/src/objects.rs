//! The objects the load creates.

use super::*;
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;

// Objects.

/// Creates of new StorageStates named `<prefix>-<n>.bench.io`.
pub(super) fn new_states(prefix: String) -> MakeReq {
    Arc::new(move |i| Req::post(format!("{API}/storagestates"), storage_state(&format!("{prefix}-{i}"))))
}

/// A StorageState must be named `<resource>.<group>`.
pub(super) fn storage_state(resource: &str) -> Bytes {
    let body = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
        "metadata": {"name": format!("{resource}.bench.io")},
        "spec": {"resource": {"group": "bench.io", "resource": resource}},
    });
    Bytes::from(body.to_string())
}

pub(super) fn migration(name: &str) -> Bytes {
    let body = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    });
    Bytes::from(body.to_string())
}

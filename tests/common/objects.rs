//! The server's own objects as a client sees them: typed clients and sample objects, every group, version, kind
//! and plural spelled out here (never taken from the crate), so that a wrong name in the crate fails the tests.

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind, ObjectList};
use serde_json::{json, Value};

/// The StorageVersionMigrations (`migration.k8s.io/v1alpha1`, cluster-scoped).
pub fn svm_api(c: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("migration.k8s.io", "v1alpha1", "StorageVersionMigration");
    Api::all_with(c.clone(), &ApiResource::from_gvk_with_plural(&gvk, "storageversionmigrations"))
}

/// A StorageVersionMigration of `apps/v1` deployments named `name`, as JSON.
pub fn svm_json(name: &str) -> Value {
    json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    })
}

/// [`svm_json`] as the object a `kube::Api` sends.
pub fn svm_object(name: &str) -> DynamicObject {
    dynamic(svm_json(name))
}

pub fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("DynamicObject")
}

/// Anything that carries a resourceVersion: an object or a list, as JSON or as kube's types.
pub trait ResourceVersioned: std::fmt::Debug {
    fn resource_version(&self) -> Option<&str>;
}

impl ResourceVersioned for Value {
    fn resource_version(&self) -> Option<&str> {
        self["metadata"]["resourceVersion"].as_str()
    }
}

impl ResourceVersioned for DynamicObject {
    fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }
}

impl ResourceVersioned for ObjectList<DynamicObject> {
    fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }
}

/// The resourceVersion as the number the server makes it.
pub fn rv(o: &impl ResourceVersioned) -> u64 {
    let text = o.resource_version().unwrap_or_else(|| panic!("no resourceVersion in {o:?}"));
    text.parse().unwrap_or_else(|_| panic!("resourceVersion {text:?} is not a number"))
}

/// The names of a list's items, in order.
pub fn item_names(l: &ObjectList<DynamicObject>) -> Vec<String> {
    l.items.iter().filter_map(|o| o.metadata.name.clone()).collect()
}

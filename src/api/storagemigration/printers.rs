//! Printer columns as kube-apiserver's storagemigration printer (pkg/printers/internalversion/printers.go,
//! `storageVersionMigrationColumnDefinitions` and `printStorageVersionMigration`): NAME and RESOURCE, no AGE.
//! The resource cell is the GroupResource as apimachinery prints one (`resource.group`; `resource` for the core
//! group); the v1alpha1 printer put the version in between, which GroupResource no longer has.

use super::StorageVersionMigration;
use crate::registry::strategy::Column;
use serde_json::Value;

pub(super) fn columns() -> Vec<Column> {
    vec![
        // Upstream's Name column has no "name" format; in CRD form a CRD's own NAME column stands for it.
        Column::new("Name", "string", "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"),
        // In CRD form: the resource name only (a JSONPath cannot join resource and group).
        Column::new("Resource", "string", "Fully qualified resource to migrate").json_path(".spec.resource.resource"),
    ]
}

pub(super) fn cells(svm: &StorageVersionMigration) -> Vec<Value> {
    vec![Value::from(svm.metadata.name.clone().unwrap_or_default()), Value::from(svm.spec.resource.to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resource_cell_is_the_group_resource() {
        let svm = |group: &str| -> StorageVersionMigration {
            serde_json::from_value(json!({
                "metadata": {"name": "m"},
                "spec": {"resource": {"group": group, "resource": "shootstates"}}
            }))
            .expect("object")
        };
        assert_eq!(cells(&svm("core.gardener.cloud")), [json!("m"), json!("shootstates.core.gardener.cloud")]);
        assert_eq!(cells(&svm("")), [json!("m"), json!("shootstates")]);
        assert_eq!(columns().len(), cells(&svm("")).len());
    }
}

//! Typed access to the scheduler's own state (StorageState, StorageVersionMigration) through the registry: the same
//! validation, resourceVersions (compare-and-swap) and watch events as any client's writes.

use crate::error::{ApiError, ApiResult, StatusReason};
use crate::registry::selectors::LabelSelector;
use crate::registry::strategy::Kind;
use crate::registry::{DeleteOptions, ListParams, Registry, Resource, WriteOptions};
use serde_json::Value;
use std::sync::Arc;

#[derive(Clone)]
pub struct OwnApi {
    registry: Arc<Registry>,
}

fn to_value<K: Kind>(obj: &K) -> ApiResult<Value> {
    serde_json::to_value(obj).map_err(|e| ApiError::internal(e.to_string()))
}

fn from_value<K: Kind>(v: Value) -> ApiResult<K> {
    serde_json::from_value(v).map_err(|e| ApiError::internal(format!("decoding {}: {e}", K::info().kind)))
}

impl OwnApi {
    pub fn new(registry: Arc<Registry>) -> Self {
        OwnApi { registry }
    }

    fn resource<K: Kind>(&self) -> ApiResult<(&Arc<Resource>, &'static str)> {
        let i = K::info();
        let version = i.versions[0];
        let r = self
            .registry
            .resource(i.group, version, i.plural)
            .ok_or_else(|| ApiError::internal(format!("{} is not served", i.qualified_resource())))?;
        Ok((r, version))
    }

    fn ns_name<K: Kind>(obj: &K) -> (Option<String>, String) {
        let m = obj.metadata();
        (m.namespace.clone().filter(|n| !n.is_empty()), m.name.clone().unwrap_or_default())
    }

    /// The object, or None when it does not exist.
    pub async fn get<K: Kind>(&self, namespace: Option<&str>, name: &str) -> ApiResult<Option<K>> {
        let (r, v) = self.resource::<K>()?;
        match r.get(namespace, name, v).await {
            Ok(obj) => Ok(Some(from_value(obj)?)),
            Err(e) if e.reason == StatusReason::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every object (in all namespaces when `namespace` is None), optionally by label selector.
    pub async fn list<K: Kind>(&self, namespace: Option<&str>, label_selector: &str) -> ApiResult<Vec<K>> {
        let (r, v) = self.resource::<K>()?;
        let params = ListParams { label_selector: LabelSelector::parse(label_selector)?, ..Default::default() };
        r.list(namespace, v, &params).await?.items.into_iter().map(from_value).collect()
    }

    pub async fn create<K: Kind>(&self, obj: &K) -> ApiResult<K> {
        let (r, v) = self.resource::<K>()?;
        let (ns, _) = Self::ns_name(obj);
        let w = r.create(ns.as_deref(), v, to_value(obj)?, &[], &WriteOptions::default()).await?;
        from_value(w.object)
    }

    /// PUT of the main resource; conditional on `metadata.resourceVersion` when set (409 on a stale copy).
    pub async fn update<K: Kind>(&self, obj: &K) -> ApiResult<K> {
        self.put(obj, false).await
    }

    /// PUT of `/status`; conditional on `metadata.resourceVersion` when set.
    pub async fn update_status<K: Kind>(&self, obj: &K) -> ApiResult<K> {
        self.put(obj, true).await
    }

    async fn put<K: Kind>(&self, obj: &K, status: bool) -> ApiResult<K> {
        let (r, v) = self.resource::<K>()?;
        let (ns, name) = Self::ns_name(obj);
        let w = r.update(ns.as_deref(), &name, v, to_value(obj)?, Vec::new(), status, &WriteOptions::default()).await?;
        from_value(w.object)
    }

    /// Deletes the object; a missing one is not an error.
    pub async fn delete<K: Kind>(&self, namespace: Option<&str>, name: &str) -> ApiResult<()> {
        let (r, v) = self.resource::<K>()?;
        match r.delete(namespace, name, v, &DeleteOptions::default()).await {
            Ok(_) => Ok(()),
            Err(e) if e.reason == StatusReason::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the object if it still has this uid and resourceVersion: false when it is gone or has changed.
    pub async fn delete_unchanged<K: Kind>(
        &self,
        namespace: Option<&str>,
        name: &str,
        uid: Option<String>,
        resource_version: Option<String>,
    ) -> ApiResult<bool> {
        let (r, v) = self.resource::<K>()?;
        let opts = DeleteOptions { uid, resource_version, ..DeleteOptions::default() };
        match r.delete(namespace, name, v, &opts).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.reason, StatusReason::NotFound | StatusReason::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The registry, for watches.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
}

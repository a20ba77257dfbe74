//! Deletes: of one object by the typed store (preconditions, finalizers, the unsafe delete of an unreadable
//! object), and of a collection by the generic registry, object by object.

use super::store::{Sink, Store};
use super::strategy::{Kind, KindInfo};
use super::{now, parse_rv, DeleteOptions, ListOut, ListParams, ObjectRef, Resource};
use crate::error::{ApiError, ApiResult, FieldError, StatusReason};
use crate::storage::StorageError;
use kube::api::PropagationPolicy;
use serde_json::{json, Value};

impl<K: Kind> Store<K> {
    /// DELETE: removes the object, or marks it for deletion while finalizers remain.
    pub(super) async fn delete_typed(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        opts: &DeleteOptions,
    ) -> ApiResult<Value> {
        at.stored("delete")?;
        let (name, version) = (target.name, target.version);
        let info = K::info();
        let key = at.key(target.namespace, name);
        if opts.ignore_store_read_error {
            return Self::delete_unreadable(at, &key, name).await;
        }
        let sink = Sink::new(at.storage.as_ref(), opts.dry_run);
        loop {
            let kv = at.storage.get(&key).await?.ok_or_else(|| at.not_found(name))?;
            let mut obj = Self::read(&kv)?;
            Self::check_uid(name, opts.uid.as_deref(), &obj)?;
            if let Some(rv) = opts.resource_version.as_deref().filter(|r| !r.is_empty()) {
                if parse_rv(rv)? != kv.mod_revision {
                    let why = format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        kv.mod_revision
                    );
                    return Err(ApiError::conflict_msg(info.group, info.plural, name, &why));
                }
            }
            let had = obj.meta().finalizers.clone().unwrap_or_default();
            let mut finalizers = had.clone();
            if at.config.gc_finalizers {
                let add = match opts.propagation_policy {
                    Some(PropagationPolicy::Foreground) => Some("foregroundDeletion"),
                    Some(PropagationPolicy::Orphan) => Some("orphan"),
                    Some(PropagationPolicy::Background) | None => None,
                };
                if let Some(f) = add.filter(|f| !finalizers.iter().any(|x| x == f)) {
                    finalizers.push(f.to_string());
                }
            }
            if finalizers.is_empty() {
                match sink.delete(&key, kv.mod_revision).await {
                    Ok(_) if info.return_deleted_object => return Self::response(&obj, version),
                    Ok(_) => return Ok(deleted_status(info, name, obj.meta().uid.as_deref())),
                    Err(StorageError::Conflict { .. }) => continue,
                    Err(StorageError::NotFound { .. }) => return Err(at.not_found(name)),
                    Err(e) => return Err(e.into()),
                }
            }
            // Graceful: mark it; whoever removes the last finalizer deletes it.
            if obj.meta().deletion_timestamp.is_some() && finalizers == had {
                return Self::response(&obj, version);
            }
            let m = obj.meta_mut();
            if m.deletion_timestamp.is_none() {
                m.deletion_timestamp = Some(now());
                m.deletion_grace_period_seconds = Some(0);
            }
            m.finalizers = Some(finalizers);
            let bytes = self.encode(at, &mut obj)?;
            match sink.update(&key, bytes, kv.mod_revision).await {
                Ok(revision) => {
                    if let Some(r) = revision {
                        obj.meta_mut().resource_version = Some(r.to_string());
                    }
                    return Self::response(&obj, version);
                }
                Err(StorageError::Conflict { .. }) => continue,
                Err(StorageError::NotFound { .. }) => return Err(at.not_found(name)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The unsafe delete of an object that cannot be read (KEP-3926): its key is removed without reading the
    /// value, with no finalizers or preconditions to honour (they cannot be read either). An object that reads
    /// fine is not touched: the option is for unreadable objects only.
    async fn delete_unreadable(at: &Resource, key: &str, name: &str) -> ApiResult<Value> {
        let info = K::info();
        match at.storage.get(key).await {
            Ok(None) => return Err(at.not_found(name)),
            Err(StorageError::Corrupt(_)) => {}
            Ok(Some(kv)) => {
                if Self::read(&kv).is_ok() {
                    // kube-apiserver's words, with the resource where the kind would be (as it does too).
                    let cause = FieldError::invalid_value(
                        "ignoreStoreReadErrorWithClusterBreakingPotential",
                        &Value::Bool(true),
                        "is exclusively used to delete corrupt object(s), try again by removing this option",
                    );
                    return Err(ApiError::invalid(info.plural, info.group, name, vec![cause]));
                }
            }
            Err(e) => return Err(e.into()),
        }
        match at.storage.delete(key, None).await {
            Ok(_) => {
                tracing::warn!(key, "an unreadable object was deleted without being read");
                Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200,
                    "details": {"name": name, "kind": info.kind}}))
            }
            Err(StorageError::NotFound { .. }) => Err(at.not_found(name)),
            Err(e) => Err(e.into()),
        }
    }
}

/// What kube-apiserver's generic registry answers for an object it deleted (`finalizeDelete`): Success, with the
/// resource where the kind would be, as it does.
fn deleted_status(info: &KindInfo, name: &str, uid: Option<&str>) -> Value {
    let mut details = json!({"name": name, "kind": info.plural});
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    if let Some(uid) = uid {
        details["uid"] = json!(uid);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

impl Resource {
    /// DELETE on the collection: every object matching the selectors.
    pub async fn delete_collection(
        &self,
        namespace: Option<&str>,
        version: &str,
        params: &ListParams,
        opts: &DeleteOptions,
    ) -> ApiResult<ListOut> {
        let mut params = params.clone();
        params.limit = 0;
        params.continue_token = None;
        let list = self.list(namespace, version, &params).await?;
        for item in &list.items {
            let meta = |field: &str| item.pointer(&format!("/metadata/{field}")).and_then(Value::as_str);
            let (ns, name) = (meta("namespace").filter(|ns| !ns.is_empty()), meta("name").unwrap_or_default());
            let per_item = DeleteOptions { uid: None, resource_version: None, ..opts.clone() };
            match self.delete(ns, name, version, &per_item).await {
                Ok(_) => {}
                Err(e) if e.reason == StatusReason::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        // The objects as listed, as kube-apiserver's generic registry answers a collection delete (not what each
        // delete answered: a Status for most kinds).
        Ok(ListOut {
            items: list.items,
            revision: self.storage.current_revision(),
            continue_token: None,
            remaining: None,
        })
    }
}

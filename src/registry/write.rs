//! The writes of the generic registry: create, update (PUT), patch, delete and deletecollection, with their
//! preconditions, retries on storage conflicts, finalizers and dry-run.

use super::json_patch::{apply_json_patch, JsonPatchError};
use super::{
    meta, meta_mut, meta_str, now_rfc3339, parse_rv, random_suffix, spec_equal, strings, too_deep_error, DeleteOptions,
    ListOut, ListParams, PatchType, Resource, WriteOptions, Written,
};
use crate::error::{ApiError, ApiResult, FieldError, StatusReason};
use crate::storage::StorageError;
use serde_json::{json, Value};

impl Resource {
    /// A UID precondition (when given, non-empty) must be the current object's UID: 409 otherwise.
    fn check_uid(&self, name: &str, uid: &str, current: &Value) -> ApiResult<()> {
        let have = meta_str(current, "uid");
        if uid.is_empty() || uid == have {
            return Ok(());
        }
        let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}");
        Err(ApiError::conflict_msg(self.info().group, self.info().plural, name, &why))
    }

    /// The create of a create-only kind: decoded, defaulted and validated like any create (a name is optional, as
    /// nothing is stored), then answered with the kind's response instead of being stored.
    fn respond(&self, mut obj: Value, warnings: Vec<String>) -> ApiResult<Written> {
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
        self.strategy.prepare_for_create(&mut obj)?;
        let name = meta_str(&obj, "name").to_string();
        let mut errs: Vec<FieldError> = self
            .validate_meta(&obj)?
            .into_iter()
            .filter(|e| !(e.field == "metadata.name" && e.reason == "FieldValueRequired"))
            .collect();
        errs.extend(self.strategy.validate(&obj)?);
        if !errs.is_empty() {
            return Err(self.invalid(&name, errs));
        }
        self.strategy.respond(&mut obj)?;
        Ok(Written { object: obj, warnings, created: true })
    }

    pub async fn create(
        &self,
        namespace: Option<&str>,
        version: &str,
        body: Value,
        dups: &[String],
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let (mut obj, warnings) = self.decode_body(body, dups, version, opts.field_validation)?;
        self.check_namespace(&mut obj, namespace)?;
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::bad_request("resourceVersion should not be set on objects to be created"));
        }
        if self.info().create_only {
            return self.respond(obj, warnings);
        }
        if self.info().has_status {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        self.strategy.prepare_for_create(&mut obj)?;
        {
            let m = meta_mut(&mut obj);
            for k in ["deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"] {
                m.remove(k);
            }
            m.insert("uid".into(), Value::String(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
            m.insert("generation".into(), Value::from(1));
        }
        let generate = meta_str(&obj, "name").is_empty() && !meta_str(&obj, "generateName").is_empty();
        for attempt in 0..8 {
            if generate {
                let name = format!("{}{}", meta_str(&obj, "generateName"), random_suffix());
                meta_mut(&mut obj).insert("name".into(), Value::String(name));
            }
            let name = meta_str(&obj, "name").to_string();
            let mut errs = self.validate_meta(&obj)?;
            errs.extend(self.strategy.validate(&obj)?);
            if !errs.is_empty() {
                return Err(self.invalid(&name, errs));
            }
            let key = self.key(namespace, &name);
            let bytes = self.encode(&obj)?;
            if opts.dry_run {
                // Like kube-apiserver's dry-run storage: a name that is taken fails as the real create would.
                if self.storage.get(&key).await?.is_some() {
                    if generate && attempt < 7 {
                        continue;
                    }
                    return Err(ApiError::already_exists(self.info().group, self.info().plural, &name));
                }
                return Ok(Written { object: obj, warnings, created: true });
            }
            match self.storage.create(&key, bytes).await {
                Ok(kv) => {
                    meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(kv.mod_revision.to_string()));
                    return Ok(Written { object: obj, warnings, created: true });
                }
                Err(StorageError::AlreadyExists { .. }) if generate && attempt < 7 => continue,
                Err(StorageError::AlreadyExists { .. }) => {
                    return Err(ApiError::already_exists(self.info().group, self.info().plural, &name));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(ApiError::internal("could not generate a unique name"))
    }

    /// Update semantics shared by PUT and PATCH: `desired` computes the client's object from the current one, and
    /// says whether its resourceVersion is the client's precondition (PUT with one, a patch that sets it) rather
    /// than the current object's. Retried on a storage conflict unless the client pinned the resourceVersion.
    #[allow(clippy::too_many_arguments)]
    async fn guaranteed_update<F>(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        status: bool,
        opts: &WriteOptions,
        mut desired: F,
    ) -> ApiResult<Written>
    where
        F: FnMut(&Value) -> ApiResult<(Value, Vec<String>, bool)>,
    {
        self.stored("update")?;
        let key = self.key(namespace, name);
        loop {
            let cur_kv = self.storage.get(&key).await?.ok_or_else(|| self.not_found(name))?;
            let cur = self.decode_stored(&cur_kv, version)?;
            let (body, dups, precondition) = desired(&cur)?;
            match body.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|rv| !rv.is_empty()) {
                Some(rv) => {
                    let wanted = parse_rv(rv).map_err(|_| {
                        self.invalid(
                            name,
                            vec![FieldError::invalid(
                                "metadata.resourceVersion",
                                rv,
                                "must be a valid resource version",
                            )],
                        )
                    })?;
                    if wanted != cur_kv.mod_revision {
                        return Err(self.conflict(name));
                    }
                }
                None if !self.info().unconditional_update => {
                    return Err(self.invalid(
                        name,
                        vec![FieldError::invalid_value(
                            "metadata.resourceVersion",
                            &Value::from(0),
                            "must be specified for an update",
                        )],
                    ))
                }
                None => {}
            }
            let (new, warnings) = self.prepare_update(namespace, name, version, &cur, body, &dups, status, opts)?;
            // A no-op write whose encoding matches what is stored is skipped (no new revision), as kube-apiserver
            // does; a stale encoding (older storage version) is rewritten.
            let bytes = self.encode(&new)?;
            if bytes == cur_kv.value && !cur_kv.stale {
                return Ok(Written { object: cur, warnings, created: false });
            }
            let finalize = !meta_str(&new, "deletionTimestamp").is_empty()
                && strings(meta(&new).and_then(|m| m.get("finalizers"))).is_empty();
            if opts.dry_run {
                return Ok(Written { object: new, warnings, created: false });
            }
            let result = if finalize {
                self.storage.delete(&key, Some(cur_kv.mod_revision)).await.map(|kv| kv.mod_revision)
            } else {
                self.storage.update(&key, bytes, cur_kv.mod_revision).await.map(|kv| kv.mod_revision)
            };
            match result {
                Ok(rev) => {
                    let mut new = new;
                    meta_mut(&mut new).insert("resourceVersion".into(), Value::String(rev.to_string()));
                    return Ok(Written { object: new, warnings, created: false });
                }
                Err(StorageError::Conflict { .. }) if !precondition => continue,
                Err(StorageError::Conflict { .. }) => return Err(self.conflict(name)),
                Err(StorageError::NotFound { .. }) => return Err(self.not_found(name)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// From the current object and the client's desired one, the object to store (validated).
    #[allow(clippy::too_many_arguments)]
    fn prepare_update(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        cur: &Value,
        body: Value,
        dups: &[String],
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<(Value, Vec<String>)> {
        let (mut body, warnings) = self.decode_body(body, dups, version, opts.field_validation)?;
        match meta_str(&body, "name") {
            "" => {
                meta_mut(&mut body).insert("name".into(), Value::String(name.to_string()));
            }
            n if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
        self.check_namespace(&mut body, namespace)?;
        self.check_uid(name, meta_str(&body, "uid"), cur)?;
        let mut new = if status {
            // /status changes status only.
            let mut n = cur.clone();
            match body.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(o) = n.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            n
        } else {
            let mut n = body;
            if self.info().has_status {
                match cur.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(o) = n.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            let cm = meta(cur).cloned().unwrap_or_default();
            let m = meta_mut(&mut n);
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match cm.get(k) {
                    Some(v) => m.insert(k.to_string(), v.clone()),
                    None => m.remove(k),
                };
            }
            if !spec_equal(&n, cur) {
                let g = cm.get("generation").and_then(Value::as_i64).unwrap_or(0);
                meta_mut(&mut n).insert("generation".into(), Value::from(g + 1));
            }
            n
        };
        meta_mut(&mut new)
            .insert("resourceVersion".into(), Value::String(meta_str(cur, "resourceVersion").to_string()));
        let mut errs = self.validate_meta(&new)?;
        if !meta_str(cur, "deletionTimestamp").is_empty() {
            let old = strings(meta(cur).and_then(|m| m.get("finalizers")));
            let added: Vec<String> = strings(meta(&new).and_then(|m| m.get("finalizers")))
                .into_iter()
                .filter(|f| !old.contains(f))
                .collect();
            if !added.is_empty() {
                errs.push(FieldError::forbidden(
                    "metadata.finalizers",
                    &format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        errs.extend(self.strategy.validate_update(&new, cur, status)?);
        if !errs.is_empty() {
            return Err(self.invalid(name, errs));
        }
        Ok((new, warnings))
    }

    /// PUT: replace the object (or its status).
    #[allow(clippy::too_many_arguments)]
    pub async fn update(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        body: Value,
        dups: Vec<String>,
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let precondition =
            body.pointer("/metadata/resourceVersion").and_then(Value::as_str).is_some_and(|r| !r.is_empty());
        self.guaranteed_update(namespace, name, version, status, opts, |_| {
            Ok((body.clone(), dups.clone(), precondition))
        })
        .await
    }

    /// PATCH with a JSON patch or a JSON merge patch.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        patch_type: PatchType,
        patch: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let json_patch: Option<json_patch::Patch> = match patch_type {
            PatchType::Json => Some(
                serde_json::from_value(patch.clone())
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
            ),
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("error decoding patch: a merge patch must be a JSON object"));
                }
                None
            }
        };
        // The patch pins a resourceVersion only if it sets one itself.
        let precondition = match &json_patch {
            Some(p) => p.0.iter().any(|op| op.path().as_str() == "/metadata/resourceVersion"),
            None => patch.pointer("/metadata/resourceVersion").is_some_and(|v| !v.is_null()),
        };
        self.guaranteed_update(namespace, name, version, status, opts, |cur| {
            let mut doc = cur.clone();
            match &json_patch {
                // kube-apiserver: a patch that cannot be applied (failed test, missing path) is 422.
                Some(p) => apply_json_patch(&mut doc, p).map_err(|e| match e {
                    JsonPatchError::TooDeep(path) => self.invalid(name, vec![too_deep_error(path)]),
                    JsonPatchError::Failed(e) => ApiError::new(
                        StatusReason::Invalid,
                        format!("the server rejected our request due to an error in our request: {e}"),
                    ),
                })?,
                None => json_patch::merge(&mut doc, &patch),
            }
            Ok((doc, Vec::new(), precondition))
        })
        .await
    }

    /// DELETE: removes the object, or marks it for deletion while finalizers remain.
    pub async fn delete(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Value> {
        self.stored("delete")?;
        let key = self.key(namespace, name);
        if opts.ignore_store_read_error {
            return self.delete_unreadable(&key, name, version).await;
        }
        loop {
            let kv = self.storage.get(&key).await?.ok_or_else(|| self.not_found(name))?;
            let mut obj = self.decode_stored(&kv, version)?;
            self.check_uid(name, opts.uid.as_deref().unwrap_or_default(), &obj)?;
            if let Some(rv) = opts.resource_version.as_deref().filter(|r| !r.is_empty()) {
                if parse_rv(rv)? != kv.mod_revision {
                    return Err(ApiError::conflict_msg(
                        self.info().group,
                        self.info().plural,
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                            kv.mod_revision
                        ),
                    ));
                }
            }
            let mut finalizers = strings(meta(&obj).and_then(|m| m.get("finalizers")));
            if self.config.gc_finalizers {
                let add = match opts.propagation_policy.as_deref() {
                    Some("Foreground") => Some("foregroundDeletion"),
                    Some("Orphan") => Some("orphan"),
                    _ => None,
                };
                if let Some(f) = add.filter(|f| !finalizers.iter().any(|x| x == f)) {
                    finalizers.push(f.to_string());
                }
            }
            if finalizers.is_empty() {
                if opts.dry_run {
                    return Ok(obj);
                }
                match self.storage.delete(&key, Some(kv.mod_revision)).await {
                    Ok(_) => return Ok(obj),
                    Err(StorageError::Conflict { .. }) => continue,
                    Err(StorageError::NotFound { .. }) => return Err(self.not_found(name)),
                    Err(e) => return Err(e.into()),
                }
            }
            // Graceful: mark it; whoever removes the last finalizer deletes it.
            if !meta_str(&obj, "deletionTimestamp").is_empty()
                && finalizers == strings(meta(&obj).and_then(|m| m.get("finalizers")))
            {
                return Ok(obj);
            }
            {
                let m = meta_mut(&mut obj);
                if m.get("deletionTimestamp").is_none() {
                    m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
                    m.insert("deletionGracePeriodSeconds".into(), Value::from(0));
                }
                m.insert("finalizers".into(), json!(finalizers));
            }
            if opts.dry_run {
                return Ok(obj);
            }
            let bytes = self.encode(&obj)?;
            match self.storage.update(&key, bytes, kv.mod_revision).await {
                Ok(new_kv) => {
                    meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(new_kv.mod_revision.to_string()));
                    return Ok(obj);
                }
                Err(StorageError::Conflict { .. }) => continue,
                Err(StorageError::NotFound { .. }) => return Err(self.not_found(name)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The unsafe delete of an object that cannot be read (KEP-3926): its key is removed without reading the
    /// value, with no finalizers or preconditions to honour (they cannot be read either). An object that reads
    /// fine is not touched: the option is for unreadable objects only.
    async fn delete_unreadable(&self, key: &str, name: &str, version: &str) -> ApiResult<Value> {
        match self.storage.get(key).await {
            Ok(None) => return Err(self.not_found(name)),
            Err(StorageError::Corrupt(_)) => {}
            Ok(Some(kv)) => {
                if self.decode_stored(&kv, version).is_ok() {
                    // kube-apiserver's words, with the resource where the kind would be (as it does too).
                    let cause = FieldError::invalid_value(
                        "ignoreStoreReadErrorWithClusterBreakingPotential",
                        &Value::Bool(true),
                        "is exclusively used to delete corrupt object(s), try again by removing this option",
                    );
                    return Err(ApiError::invalid(self.info().plural, self.info().group, name, vec![cause]));
                }
            }
            Err(e) => return Err(e.into()),
        }
        match self.storage.delete(key, None).await {
            Ok(_) => {
                tracing::warn!(key, "an unreadable object was deleted without being read");
                Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200,
                    "details": {"name": name, "kind": self.info().kind}}))
            }
            Err(StorageError::NotFound { .. }) => Err(self.not_found(name)),
            Err(e) => Err(e.into()),
        }
    }

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
        let mut deleted = Vec::with_capacity(list.items.len());
        for item in list.items {
            let ns = meta_str(&item, "namespace").to_string();
            let name = meta_str(&item, "name").to_string();
            let ns = if ns.is_empty() { None } else { Some(ns.as_str()) };
            let per_item = DeleteOptions { uid: None, resource_version: None, ..opts.clone() };
            match self.delete(ns, &name, version, &per_item).await {
                Ok(obj) => deleted.push(obj),
                Err(e) if e.reason == StatusReason::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ListOut { items: deleted, revision: self.storage.current_revision(), continue_token: None, remaining: None })
    }
}

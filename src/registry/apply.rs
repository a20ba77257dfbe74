//! `metadata.managedFields` on the typed store's writes, and server-side apply, as kube-apiserver's field manager
//! runs them: every create, update and patch records what its manager changed (an Update entry); an apply merges
//! its configuration into the live object (see [`super::managed`]). The object then goes through the same
//! defaulting, preparation and validation as any write.

use super::managed::{Managers, Scope};
use super::store::Store;
use super::strategy::{Kind, KindStatus, Subresource};
use super::{ObjectRef, Resource, WriteOptions};
use crate::error::{ApiError, ApiResult};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;

impl<K: Kind> Store<K> {
    /// The object as structured merge sees it: JSON in the request's version, without managedFields.
    fn tree(obj: &K, version: &str) -> ApiResult<Value> {
        let mut v = Self::response(obj, version)?;
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        Ok(v)
    }

    /// What structured merge compares a create against: the kind's empty object (as Go's zero value encodes).
    fn empty(version: &str) -> ApiResult<Value> {
        let zero: K = serde_json::from_value(Value::Object(Default::default()))
            .map_err(|e| ApiError::internal(format!("the empty {} does not decode: {e}", K::info().kind)))?;
        Self::tree(&zero, version)
    }

    /// Records an update by `opts.manager` on `new`, whose managedFields are the client's (a main resource write)
    /// or the current ones (a /status write), as kube-apiserver's field manager: the client's entries count when it
    /// sent readable ones, else the current object's; `[]` or `[{}]` resets them, and an existing object without
    /// entries is not tracked until it is applied to. Nothing to do when nothing changed.
    pub(super) fn manage_update(
        &self,
        cur: Option<&K>,
        new: &mut K,
        version: &str,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<()> {
        if cur.is_some_and(|c| c == new) {
            return Ok(());
        }
        let sent = new.meta().managed_fields.as_deref();
        let reset = subresource == Subresource::Main
            && sent.is_some_and(|s| s.is_empty() || (s.len() == 1 && s[0] == ManagedFieldsEntry::default()));
        let current = || Managers::decode(cur.and_then(|c| c.meta().managed_fields.as_deref()).unwrap_or_default());
        let mut managers = match (reset, Managers::decode(sent.unwrap_or_default())) {
            (true, _) => Managers::default(),
            (false, Ok(m)) if m.entries() > 0 && subresource == Subresource::Main => m,
            _ => current().unwrap_or_default(),
        };
        if cur.is_some() && managers.entries() == 0 {
            new.meta_mut().managed_fields = None;
            return Ok(());
        }
        let api_version = K::info().api_version(version);
        let scope = self.scope(&api_version, subresource);
        let old = match cur {
            Some(c) => Self::tree(c, version)?,
            None => Self::empty(version)?,
        };
        managers.update(&scope, &old, &Self::tree(new, version)?, &opts.manager);
        new.meta_mut().managed_fields = managers.encode();
        Ok(())
    }

    fn scope<'a>(&'a self, api_version: &'a str, subresource: Subresource) -> Scope<'a> {
        Scope { shape: &self.shape, api_version, subresource, has_status: K::Status::SUBRESOURCE }
    }

    /// An apply's object: `config` merged into `live` (or into nothing, for a create) by `opts.manager`, with its
    /// managedFields; a 400 for a configuration of another version or kind, or one carrying managedFields.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply_config(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        live: Option<&K>,
        config: &Value,
        force: bool,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<(Value, Option<Vec<ManagedFieldsEntry>>)> {
        let info = K::info();
        let api_version = info.api_version(target.version);
        // apimachinery's versionCheckManager: the configuration is of the request's group, version and kind.
        let sent_version = config.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let sent_kind = config.get("kind").and_then(Value::as_str).unwrap_or_default();
        if sent_version != api_version || sent_kind != info.kind {
            let gv = if sent_version.contains('/') { sent_version.to_string() } else { format!("/{sent_version}") };
            return Err(ApiError::bad_request(format!("invalid object type: {gv}, Kind={sent_kind}")));
        }
        if config.pointer("/metadata/managedFields").is_some_and(|m| !m.is_null()) {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        let mut config = config.clone();
        // The name and namespace come from the URL when the configuration leaves them out.
        if let Some(meta) = config.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.entry("name").or_insert_with(|| Value::from(target.name));
        }
        at.check_type_meta(&config, target.version)?;
        let managed = live.and_then(|l| l.meta().managed_fields.as_deref()).unwrap_or_default();
        let mut managers = Managers::decode(managed)
            .map_err(|e| ApiError::internal(format!("failed to decode managed fields: {e}")))?;
        let empty = Self::empty(target.version)?;
        let live = match live {
            Some(l) => Self::tree(l, target.version)?,
            None => empty.clone(),
        };
        let scope = self.scope(&api_version, subresource);
        let merged = managers.apply(&scope, &empty, &live, &config, &opts.manager, force)?;
        Ok((merged, managers.encode()))
    }
}

//! The writes of the typed store: create, update (PUT) and patch, with their preconditions, retries on storage
//! conflicts and the `/status` split, every step on the kind's type. A dry run differs only in its [`Sink`].

use super::json_patch::{apply_json_patch, JsonPatchError};
use super::steps;
use super::store::{Sink, Store};
use super::strategy::{take_status, Kind, KindStatus, Subresource};
use super::{
    now, parse_rv, random_suffix, too_deep_error, Change, ObjectRef, PatchType, Resource, WriteOptions, Written,
};
use crate::error::{ApiError, ApiResult, FieldError, StatusReason};
use crate::storage::StorageError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;
use std::borrow::Cow;

/// The longest generateName kept whole: 63 (a DNS label) less the 5 random characters.
const MAX_GENERATED_NAME_BASE: usize = 58;

/// Everything but metadata and status equal: what a generation bump is about. Both are moved out of the objects
/// for the comparison and back, not copied.
fn spec_equal<K: Kind>(a: &mut K, b: &mut K) -> bool {
    let (meta_a, status_a) = (std::mem::take(a.meta_mut()), take_status(a));
    let (meta_b, status_b) = (std::mem::take(b.meta_mut()), take_status(b));
    let equal = a == b;
    (*a.meta_mut(), *b.meta_mut()) = (meta_a, meta_b);
    a.replace_status(status_a);
    b.replace_status(status_b);
    equal
}

impl<K: Kind> Store<K> {
    /// A UID precondition (when given, non-empty) must be the current object's UID: 409 otherwise.
    pub(super) fn check_uid(name: &str, uid: Option<&str>, current: &K) -> ApiResult<()> {
        let have = current.meta().uid.as_deref().unwrap_or_default();
        let uid = uid.unwrap_or_default();
        if uid.is_empty() || uid == have {
            return Ok(());
        }
        let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}");
        Err(ApiError::conflict_msg(K::info().group, K::info().plural, name, &why))
    }

    /// The create of a create-only kind: decoded, defaulted and validated like any create (a name is optional, as
    /// nothing is stored), then answered with the kind's response instead of being stored.
    fn respond(at: &Resource, mut obj: K, version: &str, warnings: Vec<String>) -> ApiResult<Written> {
        steps::prepare_create(&mut obj);
        let errs: Vec<FieldError> = steps::validate_create(&obj)
            .into_iter()
            .filter(|e| !(e.field == "metadata.name" && e.reason == "FieldValueRequired"))
            .collect();
        if !errs.is_empty() {
            return Err(at.invalid(obj.meta().name.as_deref().unwrap_or_default(), errs));
        }
        obj.respond();
        Ok(Written { object: Self::response(&obj, version)?, warnings, created: true })
    }

    pub(super) async fn create_typed(
        &self,
        at: &Resource,
        namespace: Option<&str>,
        version: &str,
        body: &Value,
        dups: &[String],
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        self.create_managed(at, namespace, version, body, dups, opts, None).await
    }

    /// A create whose managedFields are `applied` (an apply's), or recorded as the manager's update.
    #[allow(clippy::too_many_arguments)]
    async fn create_managed(
        &self,
        at: &Resource,
        namespace: Option<&str>,
        version: &str,
        body: &Value,
        dups: &[String],
        opts: &WriteOptions,
        applied: Option<Option<Vec<ManagedFieldsEntry>>>,
    ) -> ApiResult<Written> {
        let info = K::info();
        let (mut obj, warnings) = Self::decode_body(at, body, dups, version, opts.field_validation)?;
        at.check_namespace_of(&mut obj.meta_mut().namespace, namespace)?;
        if !obj.meta().resource_version.as_deref().unwrap_or_default().is_empty() {
            return Err(ApiError::bad_request("resourceVersion should not be set on objects to be created"));
        }
        if info.create_only {
            return Self::respond(at, obj, version, warnings);
        }
        steps::reset_status(&mut obj);
        {
            let m = obj.meta_mut();
            m.deletion_timestamp = None;
            m.deletion_grace_period_seconds = None;
            m.resource_version = None;
            m.uid = Some(uuid::Uuid::new_v4().to_string());
            m.creation_timestamp = Some(now());
            m.generation = info.generation.then_some(1);
        }
        // The managed fields are the request's, before the kind's create preparation: kube-apiserver's field
        // manager runs in the handler, before the strategy's PrepareForCreate (a Namespace's `kubernetes`
        // finalizer is in no manager's set).
        match applied {
            Some(managed) => obj.meta_mut().managed_fields = managed,
            None => self.manage_update(None, &mut obj, version, Subresource::Main, opts)?,
        }
        steps::default_create(&mut obj);
        let generate_name = obj.meta().generate_name.clone().unwrap_or_default();
        let generate = obj.meta().name.as_deref().unwrap_or_default().is_empty() && !generate_name.is_empty();
        let sink = Sink::new(at.storage.as_ref(), opts.dry_run);
        for attempt in 0..8 {
            if generate {
                // As apimachinery's name generator: the base cut to 58 characters, then 5 random ones.
                let base: String = generate_name.chars().take(MAX_GENERATED_NAME_BASE).collect();
                obj.meta_mut().name = Some(format!("{base}{}", random_suffix()));
            }
            let name = obj.meta().name.clone().unwrap_or_default();
            let errs = steps::validate_create(&obj);
            if !errs.is_empty() {
                return Err(at.invalid(&name, errs));
            }
            obj.canonicalize();
            let key = at.key(namespace, &name);
            let bytes = self.encode(at, &mut obj)?;
            match sink.create(&key, bytes).await {
                Ok(revision) => {
                    obj.meta_mut().resource_version = revision.map(|r| r.to_string());
                    return Ok(Written { object: Self::response(&obj, version)?, warnings, created: true });
                }
                Err(StorageError::AlreadyExists { .. }) if generate && attempt < 7 => continue,
                Err(StorageError::AlreadyExists { .. }) => {
                    return Err(ApiError::already_exists(info.group, info.plural, &name));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(ApiError::internal("could not generate a unique name"))
    }

    /// PUT and PATCH: the client's object is computed from the current one (a replacement ignores it; a patch
    /// applies to it), and its resourceVersion is the client's precondition when the client set it (a PUT with
    /// one, a patch that sets it). Retried on a storage conflict unless the client pinned the resourceVersion.
    pub(super) async fn update_typed(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        change: Change,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        at.stored("update")?;
        let name = target.name;
        let json_patch = decode_json_patch(&change)?;
        let precondition = pins_resource_version(&change, json_patch.as_ref());
        let key = at.key(target.namespace, name);
        let sink = Sink::new(at.storage.as_ref(), opts.dry_run);
        loop {
            let Some(cur_kv) = at.storage.get(&key).await? else {
                return match &change {
                    // Apply creates what is missing.
                    Change::Apply { config, force } if subresource == Subresource::Main => {
                        let (merged, managed) =
                            self.apply_config(at, target, None, config, *force, subresource, opts)?;
                        self.create_managed(at, target.namespace, target.version, &merged, &[], opts, Some(managed))
                            .await
                    }
                    _ => Err(at.not_found(name)),
                };
            };
            let mut cur = Self::read(&cur_kv)?;
            let desired = self.desired(at, target, &cur, &change, json_patch.as_ref(), subresource, opts)?;
            Self::check_precondition(at, name, &desired.body, cur_kv.mod_revision)?;
            let (mut new, warnings) =
                self.prepare_update(at, target, &mut cur, &desired.body, desired.dups, subresource, opts)?;
            match desired.applied {
                Some(managed) => new.meta_mut().managed_fields = managed,
                None => self.manage_update(Some(&cur), &mut new, target.version, subresource, opts)?,
            }
            // A no-op write whose encoding matches what is stored is skipped (no new revision), as kube-apiserver
            // does; a stale encoding (older storage version) is rewritten.
            let bytes = self.encode(at, &mut new)?;
            if bytes == cur_kv.value && !cur_kv.stale {
                return Ok(Written { object: Self::response(&cur, target.version)?, warnings, created: false });
            }
            let finalize =
                new.meta().deletion_timestamp.is_some() && new.meta().finalizers.as_ref().is_none_or(Vec::is_empty);
            let result = match finalize {
                true => sink.delete(&key, cur_kv.mod_revision).await,
                false => sink.update(&key, bytes, cur_kv.mod_revision).await,
            };
            match result {
                Ok(revision) => {
                    if let Some(r) = revision {
                        new.meta_mut().resource_version = Some(r.to_string());
                    }
                    let object = Self::response(&new, target.version)?;
                    return Ok(Written { object, warnings, created: false });
                }
                Err(StorageError::Conflict { .. }) if !precondition => continue,
                Err(StorageError::Conflict { .. }) => return Err(at.conflict(name)),
                Err(StorageError::NotFound { .. }) => return Err(at.not_found(name)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The client's desired object from the current one `cur`: the replacement as sent, the patch applied to
    /// `cur`, or the apply configuration merged into it (with the managedFields the apply leaves).
    #[allow(clippy::too_many_arguments)]
    fn desired<'c>(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        cur: &K,
        change: &'c Change,
        json_patch: Option<&json_patch::Patch>,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Desired<'c>> {
        let (body, applied) = match change {
            Change::Replace { body, dups } => return Ok(Desired { body: Cow::Borrowed(body), dups, applied: None }),
            Change::Apply { config, force } => {
                let (merged, managed) = self.apply_config(at, target, Some(cur), config, *force, subresource, opts)?;
                (merged, Some(managed))
            }
            Change::Patch { patch, .. } => {
                let mut doc = Self::response(cur, target.version)?;
                match json_patch {
                    // kube-apiserver: a patch that cannot be applied (failed test, missing path) is 422.
                    Some(p) => apply_json_patch(&mut doc, p).map_err(|e| match e {
                        JsonPatchError::TooDeep(path) => at.invalid(target.name, vec![too_deep_error(path)]),
                        JsonPatchError::Failed(e) => ApiError::new(
                            StatusReason::Invalid,
                            format!("the server rejected our request due to an error in our request: {e}"),
                        ),
                    })?,
                    None => json_patch::merge(&mut doc, patch),
                }
                (doc, None)
            }
        };
        Ok(Desired { body: Cow::Owned(body), dups: &[], applied })
    }

    /// The client's resourceVersion, when set, must be the current one; without one, an update is allowed only
    /// for kinds that take unconditional updates.
    fn check_precondition(at: &Resource, name: &str, body: &Value, current: u64) -> ApiResult<()> {
        match body.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|rv| !rv.is_empty()) {
            Some(rv) => {
                let wanted = parse_rv(rv).map_err(|_| {
                    at.invalid(
                        name,
                        vec![FieldError::invalid("metadata.resourceVersion", rv, "must be a valid resource version")],
                    )
                })?;
                match wanted == current {
                    true => Ok(()),
                    false => Err(at.conflict(name)),
                }
            }
            None if !K::info().unconditional_update => Err(at.invalid(
                name,
                vec![FieldError::invalid_value(
                    "metadata.resourceVersion",
                    &Value::from(0),
                    "must be specified for an update",
                )],
            )),
            None => Ok(()),
        }
    }

    /// From the current object and the client's desired one, the object to store (validated): a `/status` write
    /// takes only the status of the desired object, a write of the object everything but its status (kinds with
    /// `/status`) and the storing server's metadata.
    #[allow(clippy::too_many_arguments)]
    fn prepare_update(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        cur: &mut K,
        body: &Value,
        dups: &[String],
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<(K, Vec<String>)> {
        let name = target.name;
        let (mut body, warnings) = Self::decode_body(at, body, dups, target.version, opts.field_validation)?;
        match body.meta().name.as_deref().unwrap_or_default() {
            "" => body.meta_mut().name = Some(name.to_string()),
            n if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
        at.check_namespace_of(&mut body.meta_mut().namespace, target.namespace)?;
        Self::check_uid(name, body.meta().uid.as_deref(), cur)?;
        let mut new = match subresource {
            Subresource::Status => {
                let mut n = cur.clone();
                n.replace_status(take_status(&mut body));
                n
            }
            Subresource::Main => keep_server_fields(body, cur),
        };
        new.meta_mut().resource_version.clone_from(&cur.meta().resource_version);
        let errs = steps::validate_update(&new, cur, subresource);
        if !errs.is_empty() {
            return Err(at.invalid(name, errs));
        }
        Ok((new, warnings))
    }
}

/// The object a main-resource write stores: the client's `new` with the status of `cur` (kinds with `/status`)
/// and the metadata that is the storing server's, its generation (for kinds that keep one) bumped when more than
/// metadata and status changed.
fn keep_server_fields<K: Kind>(mut new: K, cur: &mut K) -> K {
    if K::Status::SUBRESOURCE {
        let status = take_status(cur);
        new.replace_status(status.clone());
        cur.replace_status(status);
    }
    let (m, c) = (new.meta_mut(), cur.meta());
    m.uid.clone_from(&c.uid);
    m.creation_timestamp.clone_from(&c.creation_timestamp);
    m.deletion_timestamp.clone_from(&c.deletion_timestamp);
    m.deletion_grace_period_seconds = c.deletion_grace_period_seconds;
    m.generation = c.generation;
    m.namespace.clone_from(&c.namespace);
    m.name.clone_from(&c.name);
    if K::info().generation && !spec_equal(&mut new, cur) {
        new.meta_mut().generation = Some(cur.meta().generation.unwrap_or(0) + 1);
    }
    new
}

/// The client's desired object of an update, and the managedFields an apply leaves on it.
struct Desired<'c> {
    body: Cow<'c, Value>,
    dups: &'c [String],
    applied: Option<Option<Vec<ManagedFieldsEntry>>>,
}

/// A JSON Patch decoded once for every retry; a merge patch that is not an object is refused here too.
fn decode_json_patch(change: &Change) -> ApiResult<Option<json_patch::Patch>> {
    match change {
        Change::Patch { patch_type: PatchType::Json, patch } => {
            serde_json::from_value::<json_patch::Patch>(patch.clone())
                .map(Some)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        }
        Change::Patch { patch_type: PatchType::Merge, patch } if !patch.is_object() => {
            Err(ApiError::bad_request("error decoding patch: a merge patch must be a JSON object"))
        }
        _ => Ok(None),
    }
}

/// Whether the client pinned the resourceVersion (then a storage conflict is the client's, not retried).
fn pins_resource_version(change: &Change, json_patch: Option<&json_patch::Patch>) -> bool {
    let set = |v: &Value| v.pointer("/metadata/resourceVersion").and_then(Value::as_str).is_some_and(|r| !r.is_empty());
    match (change, json_patch) {
        (_, Some(p)) => p.0.iter().any(|op| op.path().as_str() == "/metadata/resourceVersion"),
        (Change::Replace { body, .. }, None) => set(body),
        // The patch pins a resourceVersion only if it sets one itself.
        (Change::Patch { patch, .. }, None) => patch.pointer("/metadata/resourceVersion").is_some_and(|v| !v.is_null()),
        (Change::Apply { config, .. }, None) => set(config),
    }
}

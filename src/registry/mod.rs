//! The generic REST registry: create/get/list/watch/update/patch/delete over any kind, like k8s.io/apiserver's
//! `registry/generic`. It owns object metadata (uid, resourceVersion, generation, timestamps, finalizers), the
//! status-subresource split, selectors, chunking and dry-run; everything kind-specific comes from the kind's
//! [`Strategy`]. It knows no kind by name.

pub mod admission;
mod apply;
pub mod continue_token;
pub mod decode;
pub mod default_patch;
mod delete;
pub mod expiry;
mod json_patch;
pub mod managed;
pub mod object_meta;
mod read;
mod watch;
pub use read::ListRest;
pub use watch::WatchEventType;
pub mod selectors;
mod splice;
mod steps;
pub mod store;
pub mod strategy;
pub use splice::{splice_metadata, splice_stored};
mod write;

use crate::error::{ApiError, ApiResult, FieldError};
use crate::storage::{KeyValue, Storage, StorageError};
use continue_token::ContinueToken;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use selectors::{FieldSelector, LabelSelector};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
pub use strategy::Subresource;
use strategy::{KindInfo, Strategy};

/// How unknown and duplicate fields in a request body are treated (the `fieldValidation` query parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(s: Option<&str>) -> ApiResult<Self> {
        match s.unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// Who writes, as `metadata.managedFields` records it: the `fieldManager` parameter, or the client's
    /// User-Agent up to its first `/` (kube-apiserver's default).
    pub manager: String,
}

/// The outcome of a write: the object as returned to the client, warnings for the `Warning` header.
#[derive(Debug)]
pub struct Written {
    pub object: Value,
    pub warnings: Vec<String>,
    pub created: bool,
}

#[derive(Clone, Debug, Default)]
pub struct ListParams {
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub limit: usize,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

#[derive(Debug)]
pub struct ListOut<T = Value> {
    pub items: Vec<T>,
    pub revision: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<i64>,
}

/// One object's JSON for clients, spliced from its stored bytes (see [`Resource::list_raw`]).
pub struct RawObject(pub Vec<u8>);

#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation_policy: Option<kube::api::PropagationPolicy>,
    /// `ignoreStoreReadErrorWithClusterBreakingPotential`: remove an object that cannot be read, without reading
    /// it (the caller has authorized `unsafe-delete-ignore-read-errors`).
    pub ignore_store_read_error: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
}

/// The object a write names, and the version the client speaks.
#[derive(Clone, Copy, Debug)]
pub struct ObjectRef<'a> {
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub version: &'a str,
}

/// What an update asks for: the object (PUT, with the paths of its duplicate fields), or a patch of the current
/// one.
#[derive(Debug)]
pub enum Change {
    Replace {
        body: Value,
        dups: Vec<String>,
    },
    Patch {
        patch_type: PatchType,
        patch: Value,
    },
    /// Server-side apply of a configuration (creates the object when it is missing).
    Apply {
        config: Value,
        force: bool,
    },
}

#[derive(Clone, Debug, Default)]
pub struct WatchParams {
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub send_initial_events: Option<bool>,
    pub allow_bookmarks: bool,
    pub bookmark_interval: Duration,
}

/// What a watch stream carries, before encoding.
#[derive(Debug)]
pub enum WatchOut {
    Event {
        kind: WatchEventType,
        object: Value,
    },
    /// A bookmark at this revision; `initial_events_end` marks the end of `sendInitialEvents`.
    Bookmark {
        revision: u64,
        initial_events_end: bool,
    },
    Error(ApiError),
}

#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Add the garbage collector's `orphan`/`foregroundDeletion` finalizers on delete. Only when a garbage
    /// collector runs (in a cluster); standalone, nothing would ever remove them.
    pub gc_finalizers: bool,
    /// Largest encoded object accepted for storage.
    pub max_object_bytes: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig { gc_finalizers: false, max_object_bytes: 1536 * 1024 }
    }
}

/// All served resources.
pub struct Registry {
    pub resources: Vec<Arc<Resource>>,
    /// The store every resource uses (for health checks).
    pub storage: Arc<dyn Storage>,
}

impl Registry {
    pub fn new(storage: Arc<dyn Storage>, kinds: Vec<Arc<dyn Strategy>>, config: RegistryConfig) -> Self {
        let resources = kinds
            .into_iter()
            .map(|strategy| Arc::new(Resource { strategy, storage: storage.clone(), config: config.clone() }))
            .collect();
        Registry { resources, storage }
    }

    /// These resources and those of `kinds`, on the same store with the same configuration.
    pub fn with_resources(&self, kinds: Vec<Arc<dyn Strategy>>) -> Registry {
        let config = self.resources.first().map(|r| r.config.clone()).unwrap_or_default();
        let mut resources = self.resources.clone();
        resources.extend(
            kinds
                .into_iter()
                .map(|strategy| Arc::new(Resource { strategy, storage: self.storage.clone(), config: config.clone() })),
        );
        Registry { resources, storage: self.storage.clone() }
    }

    /// The resource `plural` of `group` if `version` is served.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<Resource>> {
        self.resources.iter().find(|r| {
            let i = r.strategy.info();
            i.group == group && i.plural == plural && i.versions.contains(&version)
        })
    }
}

/// Now, to the second, as object metadata records time.
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// kube-apiserver's generateName suffix alphabet: no vowels, no confusable characters.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5].iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The 422 cause for an object nested deeper than it may be stored (see [`decode::MAX_NESTING_DEPTH`]).
fn too_deep_error(path: String) -> FieldError {
    let detail = format!("objects and lists may nest at most {} levels deep", decode::MAX_NESTING_DEPTH);
    FieldError::forbidden(path, &detail)
}

/// The 410 for a continue token whose revision was compacted, with the inconsistent continuation to go on.
fn expired_continue(prefix: &str, start_after: &Option<String>) -> ApiError {
    let start = start_after.as_deref().map(|s| s.strip_prefix(prefix).unwrap_or(s).to_string()).unwrap_or_default();
    let mut e = ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.");
    e.continue_token = Some(ContinueToken { revision: None, start }.encode().into());
    e
}

/// The warnings (kube-apiserver's words) for fields a decode did not know.
fn unknown_field_warnings(fields: &[String]) -> Vec<String> {
    fields.iter().map(|f| format!("unknown field {f:?}")).collect()
}

fn parse_rv(s: &str) -> ApiResult<u64> {
    s.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

/// One served resource: the generic machinery bound to one kind's strategy.
pub struct Resource {
    pub strategy: Arc<dyn Strategy>,
    storage: Arc<dyn Storage>,
    config: RegistryConfig,
}

impl Resource {
    fn info(&self) -> &'static KindInfo {
        self.strategy.info()
    }

    fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(self.info().group, self.info().plural, name)
    }

    fn conflict(&self, name: &str) -> ApiError {
        ApiError::conflict(self.info().group, self.info().plural, name)
    }

    fn invalid(&self, name: &str, causes: Vec<FieldError>) -> ApiError {
        ApiError::invalid(self.info().kind, self.info().group, name, causes)
    }

    /// `/registry/<group>/<resource>/[<namespace>/]<name>`
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}{name}", self.prefix(namespace))
    }

    /// `/registry/<group>/<resource>/[<namespace>/]`, as kube-apiserver keys objects (`/registry/<resource>/` for
    /// the core group, e.g. `/registry/namespaces/`, which encryption at rest's resource patterns expect).
    /// A kind stored as another ([`strategy::Kind::stored_as`]) has that kind's keys.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        let i = self.strategy.stored_info();
        let (group, resource) = (if i.group.is_empty() { String::new() } else { format!("{}/", i.group) }, i.plural);
        match namespace.filter(|_| i.namespaced) {
            Some(ns) => format!("/registry/{group}{resource}/{ns}/"),
            None => format!("/registry/{group}{resource}/"),
        }
    }

    /// How many objects a LIST in `namespace` (all namespaces: None) would return now, without reading them.
    pub async fn count(&self, namespace: Option<&str>) -> ApiResult<u64> {
        Ok(self.storage.count(&self.prefix(namespace)).await?)
    }

    /// A stored value as the client sees it in `version`: apiVersion/kind of that version, resourceVersion set.
    pub fn decode_stored(&self, kv: &KeyValue, version: &str) -> ApiResult<Value> {
        self.decode_stored_at(&kv.key, &kv.value, kv.mod_revision, version)
    }

    /// A stored value that is not a JSON object with object metadata cannot be served: a store read error naming
    /// its key (corruption, or data written by something other than this server).
    fn decode_stored_at(&self, key: &str, value: &[u8], revision: u64, version: &str) -> ApiResult<Value> {
        let corrupt = |why: String| ApiError::from(StorageError::corrupt(key, why));
        let mut o = match self.strategy.convert_stored(value) {
            Some(converted) => converted.map_err(|e| corrupt(format!("the stored object does not convert: {e}")))?,
            None => decode::read_stored(value).map_err(|why| corrupt(why.to_string()))?,
        };
        let i = self.info();
        o.insert("apiVersion".into(), Value::String(i.api_version(version)));
        o.insert("kind".into(), Value::String(i.kind.into()));
        let mut obj = Value::Object(o);
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(revision.to_string()));
        Ok(obj)
    }

    /// Whether stored objects are in this kind's own form, which reads may serve spliced from the stored bytes (not
    /// so for a kind stored as another, whose reads convert).
    pub fn serves_stored_form(&self) -> bool {
        std::ptr::eq(self.strategy.stored_info(), self.info())
    }

    /// A request body is a JSON object whose apiVersion and kind, when set (non-empty), are this kind's in
    /// `version`.
    pub(crate) fn check_type_meta(&self, body: &Value, version: &str) -> ApiResult<()> {
        let i = self.info();
        if !body.is_object() {
            return Err(strategy::not_an_object(i.kind));
        }
        // A value that is not a string is refused at the HTTP edge; here (admission) it counts as absent.
        let text = |k: &str| body.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
        if let Some(av) = text("apiVersion") {
            if !i.is_api_version(av, version) {
                let want_av = i.api_version(version);
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
        }
        if let Some(k) = text("kind") {
            if k != i.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    i.kind
                )));
            }
        }
        Ok(())
    }

    /// A decoded object's `metadata.namespace` against the request's: set from it when empty, refused when it
    /// differs; none for cluster-scoped kinds.
    pub(crate) fn check_namespace_of(&self, ns: &mut Option<String>, namespace: Option<&str>) -> ApiResult<()> {
        check_namespace(self.info().namespaced, ns, namespace)
    }

    /// Create-only kinds store nothing: every verb but create is 405.
    fn stored(&self, verb: &str) -> ApiResult<()> {
        match self.info().create_only {
            true => Err(ApiError::method_not_allowed(verb, self.info().group, self.info().plural)),
            false => Ok(()),
        }
    }

    /// POST: a new object from the request body.
    pub async fn create(
        &self,
        namespace: Option<&str>,
        version: &str,
        body: Value,
        dups: &[String],
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        self.strategy.create(self, namespace, version, body, dups, opts).await
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
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let target = ObjectRef { namespace, name, version };
        self.strategy.update(self, &target, Change::Replace { body, dups }, subresource, opts).await
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
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let target = ObjectRef { namespace, name, version };
        self.strategy.update(self, &target, Change::Patch { patch_type, patch }, subresource, opts).await
    }

    /// PATCH with `application/apply-patch+yaml`: server-side apply of `config` by `opts.manager`.
    #[allow(clippy::too_many_arguments)]
    pub async fn apply(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        config: Value,
        force: bool,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let target = ObjectRef { namespace, name, version };
        self.strategy.update(self, &target, Change::Apply { config, force }, subresource, opts).await
    }

    /// DELETE: removes the object, or marks it for deletion while finalizers remain.
    pub async fn delete(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Value> {
        self.strategy.delete(self, &ObjectRef { namespace, name, version }, opts).await
    }
}

/// An object's namespace `ns` against the request's `namespace`: none for a cluster-scoped kind; the request's
/// when the object names none; a 400 when it names another.
pub(crate) fn check_namespace(namespaced: bool, ns: &mut Option<String>, namespace: Option<&str>) -> ApiResult<()> {
    if !namespaced {
        *ns = None;
        return Ok(());
    }
    let want = namespace.unwrap_or_default();
    match ns.as_deref().unwrap_or_default() {
        "" => {
            *ns = Some(want.to_string());
            Ok(())
        }
        have if have == want => Ok(()),
        _ => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
    }
}

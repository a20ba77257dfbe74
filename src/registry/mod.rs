//! The generic REST registry: create/get/list/watch/update/patch/delete over any kind, like k8s.io/apiserver's
//! `registry/generic`. It owns object metadata (uid, resourceVersion, generation, timestamps, finalizers), the
//! status-subresource split, selectors, chunking and dry-run; everything kind-specific comes from the kind's
//! [`Strategy`]. It knows no kind by name.

pub mod admission;
pub mod continue_token;
pub mod decode;
pub mod default_patch;
pub mod selectors;
pub mod unknown;

use crate::api::meta::validate_object_meta;
use crate::api::Strategy;
use crate::error::{ApiError, ApiResult, FieldError, StatusReason};
use crate::storage::{EventKind, KeyValue, ListOptions, Storage, StorageError, WatchItem};
use bytes::Bytes;
use continue_token::ContinueToken;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use selectors::{FieldSelector, LabelSelector};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

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
    pub propagation_policy: Option<String>,
    /// `ignoreStoreReadErrorWithClusterBreakingPotential`: remove an object that cannot be read, without reading
    /// it (the caller has authorized `unsafe-delete-ignore-read-errors`).
    pub ignore_store_read_error: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
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
        kind: &'static str,
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

    /// The resource `plural` of `group` if `version` is served.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<Resource>> {
        self.resources.iter().find(|r| {
            let i = r.strategy.info();
            i.group == group && i.plural == plural && i.versions.contains(&version)
        })
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// kube-apiserver's generateName suffix alphabet: no vowels, no confusable characters.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5].iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
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

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str).unwrap_or_default()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Everything but metadata and status: what a generation bump is about.
fn spec_equal(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            for k in ["metadata", "status", "apiVersion", "kind"] {
                o.remove(k);
            }
        }
        v
    };
    strip(a) == strip(b)
}

/// How Go's encoding/json names a JSON value's type in its unmarshal errors.
fn go_json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The 422 cause for an object nested deeper than it may be stored (see [`decode::MAX_NESTING_DEPTH`]).
fn too_deep_error(path: String) -> FieldError {
    let detail = format!("objects and lists may nest at most {} levels deep", decode::MAX_NESTING_DEPTH);
    FieldError::forbidden(path, &detail)
}

enum JsonPatchError {
    /// The operation would nest the object too deeply: the path of the value that is too deep.
    TooDeep(String),
    /// An operation failed (as json_patch words it, with the operation's index in the whole patch).
    Failed(String),
}

/// Applies a JSON patch one operation at a time, refusing an operation that would nest the object deeper than it
/// may be stored before it is applied: each operation can add a value at the depth its path names, so checking
/// only the result would let a long patch build an object deep enough to exhaust the stack of whatever walks it.
fn apply_json_patch(doc: &mut Value, patch: &json_patch::Patch) -> Result<(), JsonPatchError> {
    use json_patch::PatchOperation as Op;
    for (index, op) in patch.0.iter().enumerate() {
        let added = match op {
            Op::Add(o) => Some(&o.value),
            Op::Replace(o) => Some(&o.value),
            Op::Copy(o) => doc.pointer(o.from.as_str()),
            Op::Move(o) => doc.pointer(o.from.as_str()),
            Op::Remove(_) | Op::Test(_) => None,
        };
        if let Some(value) = added {
            let depth = op.path().as_str().matches('/').count();
            if let Some(inner) = decode::too_deep_at(value, depth + 1) {
                let path = field_path(doc, op.path());
                let sep = if path.is_empty() || inner.is_empty() || inner.starts_with('[') { "" } else { "." };
                return Err(JsonPatchError::TooDeep(format!("{path}{sep}{inner}")));
            }
        }
        json_patch::patch(doc, std::slice::from_ref(op)).map_err(|e| {
            JsonPatchError::Failed(format!("operation '/{index}' failed at path '{}': {}", e.path, e.kind))
        })?;
    }
    Ok(())
}

/// A JSON pointer into `doc` as a field path (`/spec/list/0/a` -> `spec.list[0].a`): a segment is an index where
/// `doc` has a list there (or the pointer goes past what `doc` has and the segment is a number or `-`).
fn field_path(doc: &Value, pointer: &json_patch::jsonptr::Pointer) -> String {
    let mut path = String::new();
    let mut at = Some(doc);
    for token in pointer.tokens() {
        let segment = token.decoded();
        let index = match at {
            Some(Value::Array(_)) => true,
            Some(_) => false,
            None => segment == "-" || segment.parse::<usize>().is_ok(),
        };
        match (index, path.is_empty()) {
            (true, _) => path.push_str(&format!("[{segment}]")),
            (false, true) => path.push_str(&segment),
            (false, false) => path.push_str(&format!(".{segment}")),
        }
        at = at.and_then(|v| match v {
            Value::Array(a) => segment.parse::<usize>().ok().and_then(|i| a.get(i)),
            Value::Object(m) => m.get(segment.as_ref()),
            _ => None,
        });
    }
    path
}

/// The 410 for a continue token whose revision was compacted, with the inconsistent continuation to go on.
fn expired_continue(prefix: &str, start_after: &Option<String>) -> ApiError {
    let start = start_after.as_deref().map(|s| s.strip_prefix(prefix).unwrap_or(s).to_string()).unwrap_or_default();
    let mut e = ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.");
    e.continue_token = Some(ContinueToken { revision: None, start }.encode().into());
    e
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
    fn info(&self) -> &'static crate::api::KindInfo {
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
        let i = self.info();
        match namespace.filter(|_| i.namespaced) {
            Some(ns) => format!("/registry/{}/{}/{ns}/{name}", i.group, i.plural),
            None => format!("/registry/{}/{}/{name}", i.group, i.plural),
        }
    }

    pub fn prefix(&self, namespace: Option<&str>) -> String {
        let i = self.info();
        match namespace.filter(|_| i.namespaced) {
            Some(ns) => format!("/registry/{}/{}/{ns}/", i.group, i.plural),
            None => format!("/registry/{}/{}/", i.group, i.plural),
        }
    }

    /// A stored value as the client sees it in `version`: apiVersion/kind of that version, resourceVersion set.
    pub fn decode_stored(&self, kv: &KeyValue, version: &str) -> ApiResult<Value> {
        self.decode_stored_at(&kv.key, &kv.value, kv.mod_revision, version)
    }

    /// A stored value that is not a JSON object with object metadata cannot be served: a store read error naming
    /// its key (corruption, or data written by something other than this server).
    fn decode_stored_at(&self, key: &str, value: &[u8], revision: u64, version: &str) -> ApiResult<Value> {
        let mut o = decode::read_stored(value).map_err(|why| ApiError::from(StorageError::corrupt(key, why)))?;
        let i = self.info();
        o.insert("apiVersion".into(), Value::String(i.api_version(version)));
        o.insert("kind".into(), Value::String(i.kind.into()));
        let mut obj = Value::Object(o);
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(revision.to_string()));
        Ok(obj)
    }

    /// The stored encoding: the storage version, without resourceVersion (the revision is the resourceVersion).
    fn encode(&self, obj: &Value) -> ApiResult<Bytes> {
        if let Some(path) = decode::too_deep(obj) {
            return Err(self.invalid(meta_str(obj, "name"), vec![too_deep_error(path)]));
        }
        let mut o = obj.clone();
        let i = self.info();
        if let Some(m) = o.as_object_mut() {
            m.insert("apiVersion".into(), Value::String(i.api_version(self.strategy.storage_version())));
            m.insert("kind".into(), Value::String(i.kind.into()));
        }
        meta_mut(&mut o).remove("resourceVersion");
        let bytes = serde_json::to_vec(&o).map_err(|e| ApiError::internal(e.to_string()))?;
        if bytes.len() > self.config.max_object_bytes {
            return Err(ApiError::too_large(format!(
                "{} {:?} is too large: the encoded object is {} bytes, the limit is {} bytes",
                i.qualified_resource(),
                meta_str(obj, "name"),
                bytes.len(),
                self.config.max_object_bytes
            )));
        }
        Ok(Bytes::from(bytes))
    }

    /// A request body is a JSON object whose apiVersion and kind, when set, are this kind's in `version`.
    pub(crate) fn check_type_meta(&self, body: &Value, version: &str) -> ApiResult<()> {
        let i = self.info();
        if !body.is_object() {
            return Err(crate::api::not_an_object(i.kind));
        }
        // apiVersion and kind are strings (or null, Go's zero value), as in kube-apiserver's decoder.
        for (field, value) in ["apiVersion", "kind"].into_iter().filter_map(|f| Some((f, body.get(f)?))) {
            if !(value.is_string() || value.is_null()) {
                return Err(ApiError::bad_request(format!(
                    "couldn't get version/kind; json parse error: json: cannot unmarshal {} into Go struct field \
                     .{field} of type string",
                    go_json_type(value)
                )));
            }
        }
        let t = decode::TypeMeta::of(body);
        self.check_type_strs(t.api_version.as_deref(), t.kind.as_deref(), version)
    }

    /// apiVersion and kind, when set (non-empty), must be this kind's in `version`.
    pub(crate) fn check_type_strs(
        &self,
        api_version: Option<&str>,
        kind: Option<&str>,
        version: &str,
    ) -> ApiResult<()> {
        let i = self.info();
        if let Some(av) = api_version.filter(|s| !s.is_empty()) {
            if !i.is_api_version(av, version) {
                let want_av = i.api_version(version);
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
        }
        if let Some(k) = kind.filter(|s| !s.is_empty()) {
            if k != i.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    i.kind
                )));
            }
        }
        Ok(())
    }

    /// Decodes a request body for this kind: version/kind checks, typed round trip, field validation.
    fn decode_body(
        &self,
        body: Value,
        dups: &[String],
        version: &str,
        fv: FieldValidation,
    ) -> ApiResult<(Value, Vec<String>)> {
        self.check_type_meta(&body, version)?;
        let i = self.info();
        let decoded = self.strategy.decode(body)?;
        let mut problems: Vec<String> = decoded.unknown_fields.iter().map(|f| format!("unknown field {f:?}")).collect();
        problems.extend(dups.iter().map(|f| format!("duplicate field {f:?}")));
        let warnings = match fv {
            FieldValidation::Strict if !problems.is_empty() => {
                // kube-apiserver's wording, which clients and tools match on.
                return Err(ApiError::bad_request(format!(
                    "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                    problems.join(", "),
                    kind = i.kind
                )));
            }
            FieldValidation::Warn => problems,
            _ => Vec::new(),
        };
        let mut obj = decoded.object;
        self.set_type_meta(&mut obj, version);
        Ok((obj, warnings))
    }

    /// apiVersion and kind of this kind in `version`.
    pub(crate) fn set_type_meta(&self, obj: &mut Value, version: &str) {
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), Value::String(self.info().api_version(version)));
            o.insert("kind".into(), Value::String(self.info().kind.into()));
        }
    }

    /// [`check_namespace`](Self::check_namespace) of a decoded object's `metadata.namespace`.
    pub(crate) fn check_namespace_of(&self, ns: &mut Option<String>, namespace: Option<&str>) -> ApiResult<()> {
        if !self.info().namespaced {
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

    fn check_namespace(&self, obj: &mut Value, namespace: Option<&str>) -> ApiResult<()> {
        let m = meta_mut(obj);
        let mut ns = m.get("namespace").and_then(Value::as_str).map(str::to_string);
        self.check_namespace_of(&mut ns, namespace)?;
        match ns {
            Some(ns) => m.insert("namespace".into(), Value::String(ns)),
            None => m.remove("namespace"),
        };
        Ok(())
    }

    /// Metadata validation of a decoded object (canonical JSON, so its metadata always reads as `ObjectMeta`).
    fn validate_meta(&self, obj: &Value) -> ApiResult<Vec<FieldError>> {
        let meta = match obj.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m).map_err(|e| ApiError::internal(format!("reading metadata: {e}")))?,
            None => ObjectMeta::default(),
        };
        Ok(validate_object_meta(&meta, self.info().namespaced, self.info().name_rule))
    }

    /// Create-only kinds store nothing: every verb but create is 405.
    fn stored(&self, verb: &str) -> ApiResult<()> {
        match self.info().create_only {
            true => Err(ApiError::method_not_allowed(verb, self.info().group, self.info().plural)),
            false => Ok(()),
        }
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

    pub async fn get(&self, namespace: Option<&str>, name: &str, version: &str) -> ApiResult<Value> {
        self.stored("get")?;
        let kv = self.storage.get(&self.key(namespace, name)).await?.ok_or_else(|| self.not_found(name))?;
        self.decode_stored(&kv, version)
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
        let uid = meta_str(&body, "uid");
        if !uid.is_empty() && uid != meta_str(cur, "uid") {
            return Err(ApiError::conflict_msg(
                self.info().group,
                self.info().plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(cur, "uid")
                ),
            ));
        }
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
            if let Some(uid) = opts.uid.as_deref().filter(|u| !u.is_empty()) {
                if uid != meta_str(&obj, "uid") {
                    return Err(ApiError::conflict_msg(
                        self.info().group,
                        self.info().plural,
                        name,
                        &format!(
                            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                            meta_str(&obj, "uid")
                        ),
                    ));
                }
            }
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
                    return Err(ApiError::bad_request(format!(
                        "{} {name:?} can be read: ignoreStoreReadErrorWithClusterBreakingPotential deletes only \
                         objects that cannot be read; delete it without the option",
                        self.info().qualified_resource()
                    )));
                }
            }
            Err(e) => return Err(e.into()),
        }
        match self.storage.delete(key, None).await {
            Ok(_) => {
                tracing::warn!(key, "an unreadable object was deleted without being read");
                Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": self.info().group, "kind": self.info().plural}}))
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

    /// Waits (briefly) until `rv` has been reached, for reads that must be "not older than" it.
    async fn wait_for_revision(&self, rv: u64) -> ApiResult<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while self.storage.current_revision() < rv && self.storage.sync_revision().await < rv {
            if tokio::time::Instant::now() >= deadline {
                let mut e = ApiError::timeout(format!(
                    "Too large resource version: {rv}, current: {}",
                    self.storage.current_revision()
                ));
                e.details = Some(Box::new(crate::error::Details {
                    causes: vec![FieldError {
                        reason: "ResourceVersionTooLarge",
                        field: String::new(),
                        message: "Too large resource version".into(),
                    }],
                    retry_after_seconds: Some(1),
                    ..Default::default()
                }));
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn matches(&self, obj: &Value, label: &LabelSelector, field: &FieldSelector) -> bool {
        (label.is_empty() || label.matches(obj.pointer("/metadata/labels"))) && (field.is_empty() || field.matches(obj))
    }

    pub async fn list(&self, namespace: Option<&str>, version: &str, p: &ListParams) -> ApiResult<ListOut> {
        let (label, field) = (&p.label_selector, &p.field_selector);
        self.list_with(namespace, p, |kv| {
            let obj = self.decode_stored(kv, version)?;
            Ok(self.matches(&obj, label, field).then_some(obj))
        })
        .await
    }

    /// A list without selectors whose items are written for the client straight from their stored bytes: the
    /// stored JSON with apiVersion, kind and metadata.resourceVersion spliced in, without building a
    /// `serde_json::Value` per object (the cost of a large LIST). `None` when selectors need the objects parsed.
    pub async fn list_raw(
        &self,
        namespace: Option<&str>,
        version: &str,
        p: &ListParams,
    ) -> ApiResult<Option<ListOut<RawObject>>> {
        if !p.label_selector.is_empty() || !p.field_selector.is_empty() {
            return Ok(None);
        }
        let info = self.info();
        let api_version = info.api_version(version);
        let out = self
            .list_with(namespace, p, |kv| match splice_stored(&kv.value, kv.mod_revision, &api_version, info.kind) {
                Some(raw) => Ok(Some(RawObject(raw))),
                // Not in the shape this server writes: go through the parsed path, which reports it properly.
                None => {
                    let obj = self.decode_stored(kv, version)?;
                    serde_json::to_vec(&obj).map(|b| Some(RawObject(b))).map_err(|e| ApiError::internal(e.to_string()))
                }
            })
            .await?;
        Ok(Some(out))
    }

    /// The list machinery (resourceVersion semantics, chunking, continue tokens) with `item` deciding what each
    /// stored object becomes (`None`: filtered out).
    pub async fn list_with<T>(
        &self,
        namespace: Option<&str>,
        p: &ListParams,
        mut item: impl FnMut(&KeyValue) -> ApiResult<Option<T>>,
    ) -> ApiResult<ListOut<T>> {
        self.stored("list")?;
        let prefix = self.prefix(namespace);
        let rv_match = p.resource_version_match.as_deref().unwrap_or("");
        let rv = p.resource_version.as_deref().unwrap_or("");
        if !rv_match.is_empty() {
            if !matches!(rv_match, "Exact" | "NotOlderThan") {
                return Err(self.invalid(
                    "",
                    vec![FieldError::not_supported("resourceVersionMatch", rv_match, &["Exact", "NotOlderThan"])],
                ));
            }
            if rv.is_empty() {
                return Err(self.invalid(
                    "",
                    vec![FieldError::forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )],
                ));
            }
            if rv_match == "Exact" && rv == "0" {
                return Err(self.invalid(
                    "",
                    vec![FieldError::forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    )],
                ));
            }
        }
        let (mut start_after, mut revision) = (None, None);
        if let Some(token) = p.continue_token.as_deref().filter(|t| !t.is_empty()) {
            if !rv.is_empty() && rv != "0" {
                return Err(ApiError::bad_request("specifying resource version is not allowed when using continue"));
            }
            let t = ContinueToken::decode(token)?;
            start_after = Some(format!("{prefix}{}", t.start));
            revision = t.revision;
        } else if !rv.is_empty() && rv != "0" {
            let n = parse_rv(rv)?;
            if rv_match == "Exact" {
                revision = Some(n);
            } else {
                self.wait_for_revision(n).await?;
            }
        }
        // A revision the store has not reached (an exact resourceVersion, or one in a continue token) is waited
        // for briefly, then a 504 as kube-apiserver answers it: never a list "at" a revision that does not exist.
        if let Some(n) = revision {
            self.wait_for_revision(n).await?;
        }
        let filtered = !p.label_selector.is_empty() || !p.field_selector.is_empty();
        let mut items = Vec::new();
        let mut read_at = revision;
        let (mut more, mut remaining, mut last_key);
        last_key = None::<String>;
        let mut unreadable = Vec::new();
        loop {
            let res = self
                .storage
                .list(&prefix, ListOptions { start_after: start_after.clone(), limit: p.limit, revision: read_at })
                .await
                .map_err(|e| match e {
                    StorageError::Expired { .. } if p.continue_token.is_some() => {
                        expired_continue(&prefix, &start_after)
                    }
                    StorageError::Expired { requested, oldest } => {
                        ApiError::gone(format!("too old resource version: {requested} ({oldest})"))
                    }
                    StorageError::Corrupt(values) => ApiError::store_read_error(self.info().plural, &prefix, &values),
                    other => other.into(),
                })?;
            read_at = Some(res.revision);
            more = res.more;
            remaining = res.remaining;
            let n = res.items.len();
            for (idx, kv) in res.items.iter().enumerate() {
                last_key = Some(kv.key.clone());
                let read = match item(kv) {
                    // Every unreadable object of the list is named, not just the first.
                    Err(e) if !e.unreadable.is_empty() => {
                        unreadable.extend(e.unreadable);
                        continue;
                    }
                    other => other?,
                };
                if let Some(obj) = read {
                    items.push(obj);
                    if p.limit > 0 && items.len() >= p.limit {
                        // Stopped inside this page: what is left of it is still to come.
                        if idx + 1 < n {
                            more = true;
                        }
                        break;
                    }
                }
            }
            if !more || p.limit == 0 || items.len() >= p.limit {
                break;
            }
            start_after = last_key.clone();
        }
        if !unreadable.is_empty() {
            return Err(ApiError::store_read_error(self.info().plural, &prefix, &unreadable));
        }
        let revision = read_at.unwrap_or_else(|| self.storage.current_revision());
        let continue_token = match (&last_key, more) {
            (Some(k), true) => Some(
                ContinueToken { revision: Some(revision), start: k.strip_prefix(&prefix).unwrap_or(k).to_string() }
                    .encode(),
            ),
            _ => None,
        };
        let remaining = (more && !filtered).then_some(remaining as i64);
        Ok(ListOut { items, revision, continue_token, remaining })
    }

    /// Opens a watch; events arrive on the returned channel until the client goes away.
    pub async fn watch(
        &self,
        namespace: Option<&str>,
        version: &str,
        p: WatchParams,
    ) -> ApiResult<mpsc::Receiver<WatchOut>> {
        self.stored("watch")?;
        let prefix = self.prefix(namespace);
        let rv = p.resource_version.clone().unwrap_or_default();
        let initial = match p.send_initial_events {
            Some(true) => {
                if p.resource_version_match.as_deref() != Some("NotOlderThan") || !p.allow_bookmarks {
                    return Err(self.invalid("", vec![FieldError::forbidden(
                        "sendInitialEvents",
                        "sendInitialEvents is forbidden unless allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan",
                    )]));
                }
                true
            }
            Some(false) => false,
            None => rv.is_empty() || rv == "0",
        };
        let (initial_items, after) = if initial {
            let list = self
                .list(
                    namespace,
                    version,
                    &ListParams {
                        label_selector: p.label_selector.clone(),
                        field_selector: p.field_selector.clone(),
                        resource_version: (!rv.is_empty() && rv != "0").then(|| rv.clone()),
                        ..Default::default()
                    },
                )
                .await?;
            (list.items, list.revision)
        } else {
            (Vec::new(), if rv.is_empty() || rv == "0" { self.storage.current_revision() } else { parse_rv(&rv)? })
        };
        let mut events = self.storage.watch(&prefix, after).await.map_err(|e| match e {
            StorageError::Expired { requested, oldest } => {
                ApiError::gone(format!("too old resource version: {requested} ({oldest})"))
            }
            other => other.into(),
        })?;
        let (tx, rx) = mpsc::channel(256);
        let this =
            Resource { strategy: self.strategy.clone(), storage: self.storage.clone(), config: self.config.clone() };
        let version = version.to_string();
        tokio::spawn(async move {
            for obj in initial_items {
                if tx.send(WatchOut::Event { kind: "ADDED", object: obj }).await.is_err() {
                    return;
                }
            }
            if p.send_initial_events == Some(true)
                && tx.send(WatchOut::Bookmark { revision: after, initial_events_end: true }).await.is_err()
            {
                return;
            }
            let mut last = after;
            let mut tick = tokio::time::interval(p.bookmark_interval.max(Duration::from_millis(100)));
            tick.tick().await;
            loop {
                let item = tokio::select! {
                    item = events.recv() => item,
                    _ = tick.tick(), if p.allow_bookmarks => {
                        // Every event up to the progress revision is already queued: drain, then bookmark.
                        let progress = this.storage.progress_revision();
                        while let Ok(item) = events.try_recv() {
                            match this.translate(item, &version, &p) {
                                Ok(Some((out, rev))) => { last = last.max(rev); if tx.send(out).await.is_err() { return; } }
                                Ok(None) => {}
                                Err(e) => { let _ = tx.send(WatchOut::Error(e)).await; return; }
                            }
                        }
                        last = last.max(progress);
                        if tx.send(WatchOut::Bookmark { revision: last, initial_events_end: false }).await.is_err() { return; }
                        continue;
                    }
                    _ = tx.closed() => return,
                };
                let Some(item) = item else { return };
                match this.translate(item, &version, &p) {
                    Ok(Some((out, rev))) => {
                        last = last.max(rev);
                        if tx.send(out).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(WatchOut::Error(e)).await;
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    /// A storage event as the watcher sees it, after selectors: a DELETED when an object leaves the selection.
    fn translate(&self, item: WatchItem, version: &str, p: &WatchParams) -> ApiResult<Option<(WatchOut, u64)>> {
        // An event whose object cannot be read ends the watch with a store read error naming its key, as
        // kube-apiserver's watch does (a client relists, and its list names the object too).
        self.translate_event(item, version, p).map_err(|e| match e.unreadable.is_empty() {
            true => e,
            false => ApiError::store_read_error(self.info().plural, &self.prefix(None), &e.unreadable),
        })
    }

    fn translate_event(&self, item: WatchItem, version: &str, p: &WatchParams) -> ApiResult<Option<(WatchOut, u64)>> {
        let ev = match item {
            WatchItem::Event(ev) => ev,
            WatchItem::Error(StorageError::Expired { requested, oldest }) => {
                return Err(ApiError::gone(format!("too old resource version: {requested} ({oldest})")))
            }
            WatchItem::Error(e) => return Err(e.into()),
        };
        let cur = self.decode_stored_at(&ev.key, &ev.value, ev.revision, version)?;
        let cur_m = self.matches(&cur, &p.label_selector, &p.field_selector);
        let out = match ev.kind {
            EventKind::Created => cur_m.then_some(("ADDED", cur)),
            EventKind::Deleted => cur_m.then_some(("DELETED", cur)),
            EventKind::Updated => {
                let prev_m = match &ev.prev {
                    Some(prev) => {
                        let p_obj = self.decode_stored(prev, version)?;
                        self.matches(&p_obj, &p.label_selector, &p.field_selector)
                    }
                    None => false,
                };
                match (prev_m, cur_m) {
                    (true, true) => Some(("MODIFIED", cur)),
                    (false, true) => Some(("ADDED", cur)),
                    (true, false) => Some(("DELETED", cur)),
                    (false, false) => None,
                }
            }
        };
        Ok(out.map(|(kind, object)| (WatchOut::Event { kind, object }, ev.revision)))
    }
}

/// The client's JSON of a stored object without parsing it into a `Value`: the stored bytes are a JSON object
/// (written by [`Resource::encode`]); its top-level members are copied as they are, apiVersion and kind replaced,
/// and metadata.resourceVersion added. `None` when the bytes are not such an object (or need unescaping to read
/// their keys); the caller then takes the parsed path.
pub fn splice_stored(stored: &[u8], revision: u64, api_version: &str, kind: &str) -> Option<Vec<u8>> {
    use serde_json::value::RawValue;
    use std::collections::BTreeMap;
    // Skipped values are not depth-checked by serde_json: what a read would refuse takes the reading path.
    if !decode::reads_within_depth(stored) {
        return None;
    }
    let top: BTreeMap<&str, &RawValue> = serde_json::from_slice(stored).ok()?;
    let mut out = Vec::with_capacity(stored.len() + 64);
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut out, api_version).ok()?;
    out.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut out, kind).ok()?;
    let mut has_metadata = false;
    for (key, value) in &top {
        if matches!(*key, "apiVersion" | "kind") {
            continue;
        }
        out.push(b',');
        serde_json::to_writer(&mut out, key).ok()?;
        out.push(b':');
        if *key == "metadata" {
            has_metadata = true;
            splice_metadata(&mut out, value.get(), revision)?;
        } else {
            out.extend_from_slice(value.get().as_bytes());
        }
    }
    if !has_metadata {
        out.extend_from_slice(b",\"metadata\":{\"resourceVersion\":");
        serde_json::to_writer(&mut out, &revision.to_string()).ok()?;
        out.push(b'}');
    }
    out.push(b'}');
    Some(out)
}

/// Writes an object's stored `metadata` (a JSON object) with `resourceVersion` set to `revision`. This server
/// stores metadata without one, so it is written in front of the stored fields as they are; metadata that may hold
/// one (or hides key names behind escapes) goes through a map. `None` when `metadata` is not an object.
pub fn splice_metadata(out: &mut Vec<u8>, metadata: &str, revision: u64) -> Option<()> {
    use std::io::Write;
    let inner = metadata.trim_start().strip_prefix('{')?.trim_start();
    if metadata.contains("\"resourceVersion\"") || metadata.contains("\\u") {
        use serde_json::value::RawValue;
        let mut meta: std::collections::BTreeMap<String, &RawValue> = serde_json::from_str(metadata).ok()?;
        let rv = serde_json::value::to_raw_value(&revision.to_string()).ok()?;
        meta.insert("resourceVersion".into(), &rv);
        return serde_json::to_writer(out, &meta).ok();
    }
    write!(out, "{{\"resourceVersion\":\"{revision}\"").ok()?;
    if !inner.starts_with('}') {
        out.push(b',');
    }
    out.extend_from_slice(inner.as_bytes());
    Some(())
}

#[cfg(test)]
mod splice_tests {
    use super::{splice_metadata, splice_stored};
    use serde_json::{json, Value};

    /// What the parsed path gives: the stored object with apiVersion, kind and resourceVersion set.
    fn parsed(stored: &Value, rv: u64, api_version: &str, kind: &str) -> Value {
        let mut o = stored.clone();
        o["apiVersion"] = json!(api_version);
        o["kind"] = json!(kind);
        if o.get("metadata").is_none() {
            o["metadata"] = json!({});
        }
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        o
    }

    #[test]
    fn splice_equals_the_parsed_path() {
        let cases = [
            json!({"apiVersion": "core.gardener.cloud/v1alpha1", "kind": "ShootState",
                "metadata": {"name": "a", "namespace": "n", "labels": {"x/y": "z\"q"}, "uid": "u"},
                "spec": {"gardener": [{"name": "ca", "data": {"k": "v\\n\u{e9}"}}]}}),
            json!({"apiVersion": "v", "kind": "K", "metadata": {}, "status": {"conditions": []}}),
            json!({"apiVersion": "v", "kind": "K", "spec": {}}),
            json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "b", "resourceVersion": "7"}}),
            json!({"apiVersion": "v", "kind": "K", "metadata": {"annotations": {"a": "x\u{1}y\"resourceVersion\""}}}),
        ];
        for stored in cases {
            let bytes = serde_json::to_vec(&stored).unwrap();
            let raw = splice_stored(&bytes, 42, "core.gardener.cloud/v1beta1", "ShootState").expect("spliced");
            assert_eq!(raw.windows(17).filter(|w| w == b"\"resourceVersion\"").count(), 1, "one resourceVersion");
            let got: Value = serde_json::from_slice(&raw).expect("valid JSON");
            assert_eq!(got, parsed(&stored, 42, "core.gardener.cloud/v1beta1", "ShootState"), "{stored}");
        }
    }

    #[test]
    fn metadata_splices_keep_every_field() {
        let splice = |m: &str| {
            let mut out = Vec::new();
            splice_metadata(&mut out, m, 9).map(|()| serde_json::from_slice::<Value>(&out).expect("valid JSON"))
        };
        assert_eq!(splice("{}"), Some(json!({"resourceVersion": "9"})));
        assert_eq!(splice(" { } "), Some(json!({"resourceVersion": "9"})));
        assert_eq!(splice(r#"{"name":"a","uid":"u"}"#), Some(json!({"name": "a", "uid": "u", "resourceVersion": "9"})));
        assert_eq!(splice(r#"{"resourceVersion":"3","name":"a"}"#), Some(json!({"name": "a", "resourceVersion": "9"})));
        assert_eq!(splice(r#"{"resource\u0056ersion":"3"}"#), Some(json!({"resourceVersion": "9"})));
        assert_eq!(splice("null"), None);
        assert_eq!(splice("[1]"), None);
    }

    #[test]
    fn splice_declines_what_it_cannot_borrow() {
        assert!(splice_stored(b"[1,2]", 1, "v", "K").is_none());
        assert!(splice_stored(b"{\"a\\u0062\":1}", 1, "v", "K").is_none(), "escaped keys go the parsed way");
        assert!(splice_stored(b"{\"metadata\":", 1, "v", "K").is_none());
        assert!(splice_stored(b"", 1, "v", "K").is_none());
    }
}

//! The kinds this server serves. Each kind is one file with its types and policy (defaults, validation, printer
//! columns); this module bridges them to the object-safe [`Strategy`] the generic registry works with.
//! Adding a kind = one file + one line in [`kinds`].

pub mod admission_review;
pub mod csi_translation;
pub mod meta;
pub mod printers;
pub mod shoot_state;
pub mod storage_state;
pub mod storage_version_migration;

use crate::error::{ApiError, FieldError};
use crate::registry::decode::{deserialize_with_type_meta, TypeMeta};
use crate::registry::default_patch::{default_patch, Shape};
use crate::registry::unknown::Path;
use admission_review::{AdmissionObject, AdmissionRequest, AdmissionReview, ObjectText};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Static facts about a kind: names, scope, versions. What discovery and routing need.
#[derive(Debug)]
pub struct KindInfo {
    pub group: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Served versions, preferred first.
    pub versions: &'static [&'static str],
    /// Whether the kind has a `/status` subresource (then main-resource writes ignore status).
    pub has_status: bool,
    /// Syntax of object names.
    pub name_rule: meta::NameRule,
    /// Whether a PUT without resourceVersion is allowed (last write wins); otherwise it is 422.
    pub unconditional_update: bool,
    /// A create-only virtual resource (like TokenReview): a create answers with [`Strategy::respond`]'s object and
    /// stores nothing; every other verb is 405, discovery lists only `create`, and there is no CRD form.
    pub create_only: bool,
}

impl KindInfo {
    pub fn qualified_resource(&self) -> String {
        crate::error::qualified(self.plural, self.group)
    }
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }
    /// Whether `api_version` is [`api_version`](Self::api_version)`(version)`, without formatting it.
    pub fn is_api_version(&self, api_version: &str, version: &str) -> bool {
        match api_version.split_once('/') {
            Some((group, v)) => !self.group.is_empty() && group == self.group && v == version,
            None => self.group.is_empty() && api_version == version,
        }
    }
}

/// A printer column (Table `columnDefinitions` entry).
#[derive(Clone, Debug, Serialize)]
pub struct Column {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: i32,
    /// The same cell as a JSONPath into the object, for the column of a CRD (`additionalPrinterColumns`); None
    /// when the cell is computed and no path expresses it (the CRD then goes without that column).
    #[serde(skip)]
    pub json_path: Option<&'static str>,
}

impl Column {
    pub const fn new(name: &'static str, type_: &'static str, description: &'static str) -> Self {
        Column { name, type_, format: "", description, priority: 0, json_path: None }
    }
    pub const fn json_path(mut self, path: &'static str) -> Self {
        self.json_path = Some(path);
        self
    }
}

/// The typed side of a kind: implemented by each kind's struct.
pub trait Kind: Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static {
    fn info() -> &'static KindInfo;
    fn metadata(&self) -> &ObjectMeta;
    fn into_metadata(self) -> ObjectMeta;
    /// Defaulting, applied to every object decoded from a request (like kube-apiserver's defaulting on decode).
    fn defaults(&mut self) {}
    /// Defaults and clean-up on create (status is already reset by the registry when the kind has `/status`).
    fn prepare_for_create(&mut self) {}
    /// What a main-resource write leaves of status: none (kinds with `/status`, [`KindInfo::has_status`]).
    fn clear_status(&mut self) {}
    fn validate(&self) -> Vec<FieldError>;
    /// Validation of an update of the main resource (spec, metadata).
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let _ = old;
        self.validate()
    }
    /// Validation of a `/status` update.
    fn validate_status_update(&self, old: &Self) -> Vec<FieldError> {
        self.validate_update(old)
    }
    /// The answer to a create of a create-only kind ([`KindInfo::create_only`]), computed from the validated
    /// request (typically its status).
    fn respond(&mut self) {}
    /// The kind's own printer columns (Name and Age are added around them).
    fn columns() -> Vec<Column>;
    /// Whether [`cells`](Self::cells) reads `metadata`; when not, Table lists decode objects without it.
    const CELLS_READ_METADATA: bool = true;
    fn cells(&self, now: chrono::DateTime<chrono::Utc>) -> Vec<Value>;
}

/// An object decoded from a request: canonical JSON plus the fields the decoder did not know.
pub struct Decoded {
    pub object: Value,
    pub unknown_fields: Vec<String>,
}

/// The write validating admission checks in [`Strategy::admission_pass`].
#[derive(Debug)]
pub enum PassWrite<'a> {
    Create,
    /// An update from `old`; `status`: of the `/status` subresource.
    Update {
        old: AdmissionObject<'a>,
        status: bool,
    },
}

/// What validating admission needs of an object, from one typed pass.
#[derive(Debug)]
pub struct AdmissionPass {
    /// The object's metadata as decoded (and prepared, on create), for the registry's metadata checks.
    pub metadata: ObjectMeta,
    /// The kind's own validation errors.
    pub errors: Vec<FieldError>,
    /// Fields of the object the decoder did not know.
    pub unknown_fields: Vec<String>,
    /// The namespace of the object before an update.
    pub old_namespace: Option<String>,
}

/// The registry's check of an object's apiVersion and kind.
pub type CheckType<'c> = &'c dyn Fn(&TypeMeta<'_>) -> Result<(), ApiError>;

/// Per-kind policy over JSON objects, as the generic registry sees it.
pub trait Strategy: Send + Sync {
    fn info(&self) -> &'static KindInfo;
    /// The version objects are written in.
    fn storage_version(&self) -> &str;
    /// Decodes a request body (already JSON) into canonical JSON: typed round trip, unknown fields dropped and named.
    fn decode(&self, obj: Value) -> Result<Decoded, ApiError>;
    fn prepare_for_create(&self, obj: &mut Value) -> Result<(), ApiError>;
    fn validate(&self, obj: &Value) -> Result<Vec<FieldError>, ApiError>;
    fn validate_update(&self, new: &Value, old: &Value, status: bool) -> Result<Vec<FieldError>, ApiError>;
    /// Validating admission in one typed pass over `obj`, the JSON text as sent: the steps of
    /// [`decode`](Self::decode), then on create [`Kind::clear_status`] and
    /// [`prepare_for_create`](Self::prepare_for_create), and the kind's validation (against `old`, decoded the same
    /// way, on update) — straight from the text into the kind's type, without JSON round trips between the steps.
    /// `check_type` is the registry's check of each object's apiVersion and kind, read on the way.
    fn admission_pass(
        &self,
        obj: AdmissionObject<'_>,
        write: PassWrite<'_>,
        check_type: CheckType<'_>,
    ) -> Result<AdmissionPass, ApiError>;
    /// Mutating admission in one typed pass over `obj`, the JSON text as sent (read as
    /// [`admission_pass`](Self::admission_pass) reads it): the defaults of [`decode`](Self::decode) and, on create,
    /// [`prepare_for_create`](Self::prepare_for_create), as the JSON Patch (JSON text) that adds them to `obj`
    /// ([`default_patch`](crate::registry::default_patch::default_patch); `None` when there are none), and the
    /// fields the decoder did not know. apiVersion and kind are checked, never patched.
    fn admission_defaults(
        &self,
        obj: AdmissionObject<'_>,
        create: bool,
        check_type: CheckType<'_>,
    ) -> Result<(Option<Vec<u8>>, Vec<String>), ApiError>;
    /// A review (its JSON text) of an object of this kind, read in one pass: its objects are decoded straight into
    /// the kind's type, as [`admission_pass`](Self::admission_pass) would decode their text, and checked with
    /// `check_type`. `None` when anything in it does not read or check so; the caller then reads the review step by
    /// step, which says what is wrong.
    fn read_review<'a>(
        &self,
        review: &'a str,
        check_type: CheckType<'_>,
    ) -> Option<AdmissionReview<AdmissionRequest<'a, AdmissionObject<'a>>>>;
    /// The response to a create of a create-only kind, computed in place.
    fn respond(&self, obj: &mut Value) -> Result<(), ApiError>;
    fn columns(&self) -> Vec<Column>;
    fn cells(&self, obj: &Value, now: chrono::DateTime<chrono::Utc>) -> Vec<Value>;
    /// The same from an object's stored JSON, without an intermediate `Value` (`None` if it does not decode).
    /// `metadata`: where the object's metadata is in `json`, for kinds whose cells do not read it to skip it.
    fn cells_from_json(
        &self,
        json: &[u8],
        metadata: Option<std::ops::Range<usize>>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<Vec<Value>>;
    /// OpenAPI v3 schema of the kind and the schemas it references, by fully qualified name.
    fn schemas(&self) -> (String, serde_json::Map<String, Value>);
}

/// The one [`Strategy`] implementation, generic over typed kinds.
pub struct KindStrategy<K: Kind> {
    storage_version: String,
    _k: std::marker::PhantomData<fn() -> K>,
}

impl<K: Kind> KindStrategy<K> {
    pub fn new(storage_version: &str) -> Self {
        KindStrategy { storage_version: storage_version.to_string(), _k: std::marker::PhantomData }
    }
    fn typed(obj: &Value) -> Result<K, ApiError> {
        K::deserialize(obj).map_err(|e| ApiError::internal(format!("decoding stored {}: {e}", K::info().kind)))
    }
    /// A request's object decoded into the kind's type (with its defaults), and the fields the decoder did not
    /// know, sorted; a value of the wrong type is a 400 naming its path.
    fn decode_typed(obj: &Value) -> Result<(K, Vec<String>), ApiError> {
        Self::read_typed(obj).map(Self::with_defaults)
    }
    /// [`decode_typed`](Self::decode_typed) without the defaults.
    fn read_typed(obj: &Value) -> Result<(K, Vec<String>), ApiError> {
        let mut unknown = Vec::new();
        // Objects that decode (nearly all) take one pass; the path of an error is found by decoding again.
        let typed: K =
            match crate::registry::unknown::deserialize(obj, |p: &Path<'_, '_>| note_unknown(p, &mut unknown)) {
                Ok(typed) => typed,
                Err(_) => {
                    let e = serde_path_to_error::deserialize::<_, K>(obj).err();
                    let (path, inner) = match e {
                        Some(e) => (path_string(e.path()), e.into_inner().to_string()),
                        None => (String::new(), "the object does not decode".to_string()),
                    };
                    let at = if path.is_empty() || path == "?" { String::new() } else { format!(" at {path}") };
                    return Err(ApiError::bad_request(format!("error decoding {}{at}: {inner}", K::info().kind)));
                }
            };
        Ok(Self::decoded(typed, unknown))
    }
    /// A decoded object, and its unknown fields sorted and without repeats.
    fn decoded(typed: K, mut unknown: Vec<String>) -> (K, Vec<String>) {
        unknown.sort();
        unknown.dedup();
        (typed, unknown)
    }
    fn with_defaults((mut typed, unknown): (K, Vec<String>)) -> (K, Vec<String>) {
        typed.defaults();
        (typed, unknown)
    }
    /// Create preparation, and the defaults again for what it set.
    fn prepare(typed: &mut K) {
        typed.prepare_for_create();
        typed.defaults();
    }
    /// An object of a review, as [`read_text`](Self::read_text) reads its text; one decoded with the review is
    /// taken as it is.
    fn read_object(obj: AdmissionObject<'_>, check_type: CheckType<'_>) -> Result<(K, Vec<String>), ApiError> {
        let lost = || ApiError::internal(format!("a review's {} is neither decoded nor found", K::info().kind));
        match obj.typed {
            Some(typed) => typed.downcast::<(K, Vec<String>)>().map(|t| *t).map_err(|_| lost()),
            None => Self::read_text(obj.text.get().ok_or_else(lost)?, check_type),
        }
    }
    /// [`read_typed`](Self::read_typed) straight from JSON text, after `check_type` of its apiVersion and kind
    /// (read in the same pass); text that does not decode so (a wrong type, a duplicate field) goes the `Value`
    /// way, which says exactly what is wrong and where.
    fn read_text(text: &str, check_type: CheckType<'_>) -> Result<(K, Vec<String>), ApiError> {
        match serde_json::from_str::<TypedObject<'_, K>>(text) {
            Ok(o) => {
                check_type(&o.type_meta)?;
                Ok(*o.decoded)
            }
            Err(_) => {
                let mut value: Value = serde_json::from_str(text)
                    .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
                if !value.is_object() {
                    return Err(not_an_object(K::info().kind));
                }
                check_type(&TypeMeta::of(&value))?;
                drop_storing_server_metadata(&mut value);
                Self::read_typed(&value)
            }
        }
    }
    /// Applies `f` to the typed object, keeping apiVersion and kind (the typed structs do not carry them).
    fn modify(obj: &mut Value, f: impl FnOnce(&mut K)) -> Result<(), ApiError> {
        let mut typed = Self::typed(obj)?;
        f(&mut typed);
        let keep = (obj.get("apiVersion").cloned(), obj.get("kind").cloned());
        *obj = serde_json::to_value(&typed).map_err(|e| ApiError::internal(e.to_string()))?;
        if let Some(o) = obj.as_object_mut() {
            if let Some(v) = keep.0 {
                o.insert("apiVersion".into(), v);
            }
            if let Some(k) = keep.1 {
                o.insert("kind".into(), k);
            }
        }
        Ok(())
    }
}

/// An object decoded straight into `K` from its JSON text ([`KindStrategy::read_text`]), on its own or while the
/// review it is in is read ([`Strategy::read_review`]).
struct TypedObject<'a, K> {
    /// The object and the fields it did not know, boxed at once: the review's request is moved about as it is
    /// decoded, and a kind's type is large.
    decoded: Box<(K, Vec<String>)>,
    type_meta: TypeMeta<'a>,
}

impl<'de, K: Kind> serde::Deserialize<'de> for TypedObject<'de, K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut unknown = Vec::new();
        let (typed, type_meta) =
            deserialize_with_type_meta(d, STORING_SERVER_METADATA, |p| note_unknown(p, &mut unknown))?;
        Ok(TypedObject { decoded: Box::new(KindStrategy::decoded(typed, unknown)), type_meta })
    }
}

/// Metadata that admission leaves out of the objects it decodes: `managedFields` is the storing server's record of
/// who set which field, which kube-apiserver writes and checks itself, and which no default or validation of ours
/// reads (it would be most of the cost of decoding an object kube-apiserver sends).
pub const STORING_SERVER_METADATA: &[&str] = &["managedFields"];

/// The error for an object of `kind` that is some other JSON value.
pub fn not_an_object(kind: &str) -> ApiError {
    ApiError::bad_request(format!("the body of the request must be a JSON object ({kind})"))
}

/// Removes [`STORING_SERVER_METADATA`] from an object read as a whole (what the one-pass decode skips).
pub fn drop_storing_server_metadata(obj: &mut Value) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.retain(|k, _| !STORING_SERVER_METADATA.contains(&k.as_str()));
    }
}

/// Notes a field the typed decode did not know, by its path (apiVersion and kind, which the registry checks and
/// the typed structs do not carry, excepted).
fn note_unknown(path: &Path<'_, '_>, unknown: &mut Vec<String>) {
    if !matches!(path.top_level_key(), Some("apiVersion" | "kind")) {
        unknown.push(path.field_path());
    }
}

/// Go-style field path from serde's path ("spec.resource" rather than ".spec.resource").
fn path_string(p: &serde_path_to_error::Path) -> String {
    p.to_string().trim_start_matches('.').to_string()
}

impl<K: Kind> Strategy for KindStrategy<K> {
    fn info(&self) -> &'static KindInfo {
        K::info()
    }
    fn storage_version(&self) -> &str {
        &self.storage_version
    }
    fn decode(&self, obj: Value) -> Result<Decoded, ApiError> {
        let (typed, unknown_fields) = Self::decode_typed(&obj)?;
        let mut object = serde_json::to_value(&typed).map_err(|e| ApiError::internal(e.to_string()))?;
        if let (Some(o), Some(src)) = (object.as_object_mut(), obj.as_object()) {
            for k in ["apiVersion", "kind"] {
                if let Some(v) = src.get(k) {
                    o.insert(k.to_string(), v.clone());
                }
            }
        }
        Ok(Decoded { object, unknown_fields })
    }
    fn admission_defaults(
        &self,
        obj: AdmissionObject<'_>,
        create: bool,
        check_type: CheckType<'_>,
    ) -> Result<(Option<Vec<u8>>, Vec<String>), ApiError> {
        let text = obj.text;
        let (mut typed, unknown_fields) = Self::read_object(obj, check_type)?;
        let before = Shape::of(&typed).map_err(|e| ApiError::internal(e.to_string()))?;
        typed.defaults();
        if create {
            Self::prepare(&mut typed);
        }
        // The patch reads the text again only along the paths of operations below the top level (to find the
        // containers the decode made up); what it cannot read there is the client's text.
        let patch = default_patch(|| text.get(), &before, &typed)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
        Ok((patch, unknown_fields))
    }
    fn read_review<'a>(
        &self,
        review: &'a str,
        check_type: CheckType<'_>,
    ) -> Option<AdmissionReview<AdmissionRequest<'a, AdmissionObject<'a>>>> {
        let r: AdmissionReview<AdmissionRequest<'a, TypedObject<'a, K>>> = serde_json::from_str(review).ok()?;
        let request = match r.request {
            None => None,
            Some(req) => Some(req.try_map_objects(|o, old| {
                check_type(&o.type_meta).ok()?;
                Some(AdmissionObject { typed: Some(o.decoded), text: ObjectText::InReview { review, old } })
            })?),
        };
        Some(AdmissionReview { api_version: r.api_version, kind: r.kind, request })
    }
    fn admission_pass(
        &self,
        obj: AdmissionObject<'_>,
        write: PassWrite<'_>,
        check_type: CheckType<'_>,
    ) -> Result<AdmissionPass, ApiError> {
        let (mut typed, unknown_fields) = Self::read_object(obj, check_type).map(Self::with_defaults)?;
        let mut old_namespace = None;
        let errors = match write {
            PassWrite::Create => {
                if K::info().has_status {
                    typed.clear_status();
                }
                Self::prepare(&mut typed);
                typed.validate()
            }
            PassWrite::Update { old, status } => {
                let (old, _) = Self::read_object(old, check_type).map(Self::with_defaults)?;
                old_namespace = old.metadata().namespace.clone();
                if status {
                    typed.validate_status_update(&old)
                } else {
                    typed.validate_update(&old)
                }
            }
        };
        Ok(AdmissionPass { metadata: typed.into_metadata(), errors, unknown_fields, old_namespace })
    }
    fn prepare_for_create(&self, obj: &mut Value) -> Result<(), ApiError> {
        Self::modify(obj, Self::prepare)
    }
    fn respond(&self, obj: &mut Value) -> Result<(), ApiError> {
        Self::modify(obj, K::respond)
    }
    fn validate(&self, obj: &Value) -> Result<Vec<FieldError>, ApiError> {
        Ok(Self::typed(obj)?.validate())
    }
    fn validate_update(&self, new: &Value, old: &Value, status: bool) -> Result<Vec<FieldError>, ApiError> {
        let (n, o) = (Self::typed(new)?, Self::typed(old)?);
        Ok(if status { n.validate_status_update(&o) } else { n.validate_update(&o) })
    }
    fn columns(&self) -> Vec<Column> {
        K::columns()
    }
    fn cells(&self, obj: &Value, now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        match K::deserialize(obj) {
            Ok(t) => t.cells(now),
            Err(_) => K::columns().iter().map(|_| Value::Null).collect(),
        }
    }

    fn cells_from_json(
        &self,
        json: &[u8],
        metadata: Option<std::ops::Range<usize>>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<Vec<Value>> {
        match metadata.filter(|m| !K::CELLS_READ_METADATA && m.end <= json.len() && m.start <= m.end) {
            // The object with `"metadata":{}`: decoding ObjectMeta is much of the cost of a row.
            Some(m) => {
                let mut blanked = Vec::with_capacity(json.len() - m.len() + 2);
                blanked.extend_from_slice(&json[..m.start]);
                blanked.extend_from_slice(b"{}");
                blanked.extend_from_slice(&json[m.end..]);
                serde_json::from_slice::<K>(&blanked).ok().map(|t| t.cells(now))
            }
            None => serde_json::from_slice::<K>(json).ok().map(|t| t.cells(now)),
        }
    }
    fn schemas(&self) -> (String, serde_json::Map<String, Value>) {
        crate::server::openapi::kind_schemas::<K>()
    }
}

/// base64(sha256("group/version/Kind")[:8]), the discovery `storageVersionHash` (core group gives a leading "/").
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    use base64::Engine;
    let digest = Sha256::digest(format!("{group}/{version}/{kind}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// The kind table. `storage_versions` overrides a kind's storage version (`--storage-version plural.group=version`).
pub fn kinds(storage_versions: &std::collections::HashMap<String, String>) -> Result<Vec<Arc<dyn Strategy>>, String> {
    fn make<K: Kind>(
        overrides: &std::collections::HashMap<String, String>,
        default: &str,
    ) -> Result<Arc<dyn Strategy>, String> {
        let info = K::info();
        let key = info.qualified_resource();
        let version = overrides.get(&key).map(String::as_str).unwrap_or(default);
        if !info.versions.contains(&version) {
            return Err(format!(
                "--storage-version {key}={version}: not a served version (served: {})",
                info.versions.join(", ")
            ));
        }
        Ok(Arc::new(KindStrategy::<K>::new(version)))
    }
    let all = vec![
        make::<storage_version_migration::StorageVersionMigration>(storage_versions, "v1alpha1")?,
        make::<storage_state::StorageState>(storage_versions, "v1alpha1")?,
        make::<shoot_state::ShootState>(storage_versions, "v1beta1")?,
        make::<csi_translation::CSITranslation>(storage_versions, "v1alpha1")?,
    ];
    for key in storage_versions.keys() {
        if !all.iter().any(|k| &k.info().qualified_resource() == key) {
            return Err(format!("--storage-version {key}: no such resource (expected <plural>.<group>)"));
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_version_hash_matches_kube_apiserver() {
        assert_eq!(storage_version_hash("apps", "v1", "Deployment"), "8aSe+NMegvE=");
    }

    /// The comparison says yes exactly for the apiVersion the kind writes, in the core group too.
    #[test]
    fn is_api_version_agrees_with_api_version() {
        let grouped = storage_state::StorageState::info();
        let core = KindInfo { group: "", ..*grouped };
        for info in [grouped, &core] {
            for candidate in
                ["v1", "v1alpha1", "migration.k8s.io/v1alpha1", "migration.k8s.io/v1", "/v1alpha1", "x/v1alpha1", ""]
            {
                for version in ["v1", "v1alpha1"] {
                    let expected = info.api_version(version) == candidate;
                    assert_eq!(
                        info.is_api_version(candidate, version),
                        expected,
                        "{:?} {candidate} {version}",
                        info.group
                    );
                }
            }
        }
    }
}

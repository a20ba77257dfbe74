//! The generic layer's view of a kind: its static facts ([`KindInfo`]), its typed policy ([`Kind`], implemented by
//! each kind's struct in `crate::api`) and the object-safe [`Strategy`] the router works with, implemented once by
//! the typed [`Store`](super::store::Store). Kinds depend on this module, never the reverse.

use super::{Change, DeleteOptions as DeleteRequest, ObjectRef, Resource, WriteOptions, Written};
use crate::error::{ApiError, ApiResult, FieldError};
use crate::validation::NameRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta, Status};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

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
    /// Syntax of object names.
    pub name_rule: NameRule,
    /// Whether a PUT without resourceVersion is allowed (last write wins); otherwise it is 422.
    pub unconditional_update: bool,
    /// A create-only virtual resource (like TokenReview): a create answers with [`Strategy::respond`]'s object and
    /// stores nothing; every other verb is 405, discovery lists only `create`, and there is no CRD form.
    pub create_only: bool,
    /// Whether objects carry `metadata.generation` (1 on create, one more with each change of the spec), as the
    /// strategies of most kinds set it and kube-apiserver does for every custom resource. Upstream's Namespaces,
    /// Events and `storagemigration.k8s.io` StorageVersionMigrations have none (their strategies never set it).
    pub generation: bool,
    /// Whether a DELETE that removes the object answers with the object, as kube-apiserver's Namespaces (and some
    /// other built-in kinds) do; otherwise it answers a `Status` Success naming it (the generic registry's
    /// default, and every custom resource's).
    pub return_deleted_object: bool,
    /// The `api-approved.kubernetes.io` annotation of the kind's CRD form, which kube-apiserver requires of CRDs in
    /// the protected `*.k8s.io` and `*.kubernetes.io` groups. None outside them (or without a CRD form).
    pub api_approved: Option<&'static str>,
    /// Where kube-apiserver's aggregator orders the kind's group and versions; None for a group only we serve
    /// ([`OWN_GROUP_PRIORITY`], versions by [`own_version_priority`]).
    pub priority: Option<ApiPriority>,
}

/// The priorities of a group's APIServices, by which the aggregator orders groups (and a group's versions) in
/// discovery: kubectl resolves a bare resource name to the first group that has it.
#[derive(Clone, Copy, Debug)]
pub struct ApiPriority {
    /// groupPriorityMinimum, highest first.
    pub group: i32,
    /// (version, versionPriority), highest preferred.
    pub versions: &'static [(&'static str, i32)],
}

/// The groupPriorityMinimum of the groups only we serve: below kube-apiserver's own groups (15800 and up) and the
/// PaaS range the field's documentation suggests (the 2000s), so that our groups never shadow another server's.
pub const OWN_GROUP_PRIORITY: i32 = 1000;

/// The versionPriority of a group only we serve: the aggregator orders a group's versions by it, highest first, so
/// the preferred version (the kinds list versions preferred first) gets the highest. A group's only version sits at
/// 15, the middle, leaving room for a version added before or after it; with several, the preferred gets 20 and
/// the next ones 10, 9, ...
pub fn own_version_priority(index: usize, count: usize) -> i32 {
    match (index, count) {
        (_, 1) => 15,
        (0, _) => 20,
        (i, _) => i32::try_from(i).map_or(1, |i| (11 - i).max(1)),
    }
}

/// The groupPriorityMinimum of `group`'s APIServices: its kinds' (the first that serves it).
pub fn group_priority_minimum(kinds: &[std::sync::Arc<dyn Strategy>], group: &str) -> i32 {
    kinds.iter().map(|k| k.info()).find(|i| i.group == group).map_or(OWN_GROUP_PRIORITY, KindInfo::group_priority)
}

impl KindInfo {
    /// The groupPriorityMinimum of the kind's group.
    pub fn group_priority(&self) -> i32 {
        self.priority.map_or(OWN_GROUP_PRIORITY, |p| p.group)
    }
    /// The versionPriority of `version`, the `index`th preferred of the group's `count` versions.
    pub fn version_priority(&self, version: &str, index: usize, count: usize) -> i32 {
        let listed = self.priority.and_then(|p| p.versions.iter().find(|(v, _)| *v == version).map(|(_, p)| *p));
        listed.unwrap_or_else(|| own_version_priority(index, count))
    }
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

/// The part of an object a write addresses: the object itself, or its `/status` subresource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

impl Subresource {
    /// The subresource a URL (or an admission request) names: "" the object itself; `None` when unknown.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "" => Some(Subresource::Main),
            "status" => Some(Subresource::Status),
            _ => None,
        }
    }
    /// The name in URLs and in managedFields entries ("" for the object itself).
    pub fn as_str(self) -> &'static str {
        match self {
            Subresource::Main => "",
            Subresource::Status => "status",
        }
    }
}

/// A kind's status: the part of its objects that only its `/status` subresource writes, and that main-resource
/// writes keep as stored. `Option<…Status>`, the type of the kind's `status` field, for a kind with `/status`;
/// [`NoStatus`] for one without.
pub trait KindStatus: Default + Clone + PartialEq + Send + Sync + 'static {
    /// Whether the kind has a `/status` subresource: the route, discovery, OpenAPI and the CRD follow from it.
    const SUBRESOURCE: bool;
}

/// The status of a kind without a `/status` subresource: writes of the object write all of it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NoStatus;

impl KindStatus for NoStatus {
    const SUBRESOURCE: bool = false;
}

impl<T: Clone + PartialEq + Send + Sync + 'static> KindStatus for Option<T> {
    const SUBRESOURCE: bool = true;
}

/// Takes the status out of `obj`, leaving none.
pub fn take_status<K: Kind>(obj: &mut K) -> K::Status {
    obj.replace_status(K::Status::default())
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
    /// A column only wide output shows (`kubectl get -o wide`): priority 1, as kube-apiserver's printers and CRDs
    /// mark them. Tables put such columns after AGE, as kube-apiserver's do (pods: ... AGE IP NODE).
    pub const fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
    /// How many of `columns` come before AGE: those up to the first wide one.
    pub fn before_age(columns: &[Column]) -> usize {
        columns.iter().take_while(|c| c.priority == 0).count()
    }
}

/// The typed side of a kind: implemented by each kind's struct, whose `metadata` it reaches through
/// `kube::Resource` (see [`kube_resource!`](crate::kube_resource)).
pub trait Kind:
    kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned + JsonSchema + Clone + PartialEq + Send + Sync + 'static
{
    fn info() -> &'static KindInfo;
    /// The kind's status ([`KindStatus`]): `Option<…Status>` when it has a `/status` subresource, else
    /// [`NoStatus`].
    type Status: KindStatus;
    /// Puts `status` in the object and answers the status it had (for [`NoStatus`]: answers `status`).
    fn replace_status(&mut self, status: Self::Status) -> Self::Status;
    /// Defaulting, applied to every object decoded from a request (like kube-apiserver's defaulting on decode).
    fn defaults(&mut self) {}
    /// Defaults and clean-up on create (status is already reset by the registry when the kind has `/status`).
    fn prepare_for_create(&mut self) {}
    fn validate(&self) -> Vec<FieldError>;
    /// A create's last change, once it validated (the strategy's `Canonicalize`): what needs the final name, which
    /// a generateName gives only after defaulting.
    fn canonicalize(&mut self) {}
    /// The kind's create validation (its strategy's `Validate`) with `meta`, the errors of `ValidateObjectMeta`
    /// under the kind's [`KindInfo::name_rule`], where the strategy reports them: before its own, as nearly every
    /// strategy does. Not called for [`NameRule::PathSegment`] kinds, whose strategy does not check metadata.
    fn validate_with_meta(&self, meta: Vec<FieldError>) -> Vec<FieldError> {
        let mut errs = meta;
        errs.extend(self.validate());
        errs
    }
    /// The name rule of an update's metadata checks. kube-apiserver checks a name's syntax on create only: an
    /// update runs the generic registry's `ValidateObjectMetaAccessor` with path-segment names and the strategy's
    /// `ValidateObjectMetaUpdate` (no name rule). A kind whose update validation calls `ValidateObjectMeta` again
    /// (Gardener's ShootState) names its rule here.
    const UPDATE_NAME_RULE: NameRule = NameRule::PathSegment;
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
    /// The kind's own printer columns (Name and Age are added around them), wide ones ([`Column::wide`]) last.
    fn columns() -> Vec<Column>;
    /// Whether [`cells`](Self::cells) reads `metadata`; when not, Table lists decode objects without it.
    const CELLS_READ_METADATA: bool = true;
    fn cells(&self, now: chrono::DateTime<chrono::Utc>) -> Vec<Value>;
    /// Whether Table output puts Name before the kind's columns and Age after them (as for CRDs); false for a kind
    /// whose [`columns`](Self::columns) are a kube-apiserver printer's whole set.
    const NAME_AND_AGE_COLUMNS: bool = true;
    /// The field labels a field selector may name besides `metadata.name` and `metadata.namespace` (kube-apiserver's
    /// field label conversion for the kind); their values come from [`selectable_fields`](Self::selectable_fields).
    const FIELD_LABELS: &'static [&'static str] = &[];
    /// The value of each of [`FIELD_LABELS`](Self::FIELD_LABELS) in this object (kube-apiserver's
    /// `ToSelectableFields`).
    fn selectable_fields(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The form objects are stored in when it is another kind's (see [`StoredAs`]); `None`, their own, for nearly
    /// every kind.
    fn stored_as() -> Option<StoredAs<Self>> {
        None
    }
}

/// A kind whose objects are stored in another kind's form, which both read and write through a typed conversion:
/// kube-apiserver stores events.k8s.io/v1 Events as core/v1 Events under `/registry/events/`. The stored kind's
/// [`KindInfo`] names the keys; reads convert each stored object, so they are never spliced from the stored bytes.
pub struct StoredAs<K> {
    /// The stored kind: its group and resource name the keys, its preferred version is the stored apiVersion.
    pub info: &'static KindInfo,
    /// The stored JSON as the kind's object.
    pub decode: fn(&[u8]) -> serde_json::Result<K>,
    /// The kind's object in the stored form, apiVersion and kind included.
    pub encode: fn(&K) -> serde_json::Result<Vec<u8>>,
}

impl<K: Kind> StoredAs<K> {
    /// Stored as `S`, converting with `From` both ways.
    pub fn converted<S>() -> Self
    where
        S: Kind + From<K>,
        K: From<S>,
    {
        StoredAs {
            info: S::info(),
            decode: |bytes| serde_json::from_slice::<S>(bytes).map(K::from),
            encode: |obj| {
                let info = S::info();
                let api_version = info.api_version(info.versions[0]);
                let stored = S::from(obj.clone());
                serde_json::to_vec(&WithTypeMeta { api_version: &api_version, kind: info.kind, object: &stored })
            },
        }
    }
}

/// `kube::Resource` for a kind, from its [`KindInfo`] (the preferred version), so that `kube::Api<K>` reaches it
/// through any client: the scheduler's in-process one, `migrate`'s remote one, the tests'. `$scope`: kube's
/// `ClusterResourceScope` or `NamespaceResourceScope`, as [`KindInfo::namespaced`] says.
#[macro_export]
macro_rules! kube_resource {
    ($kind:ty, $scope:ty) => {
        impl kube::Resource for $kind {
            type DynamicType = ();
            type Scope = $scope;
            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as $crate::registry::strategy::Kind>::info().kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as $crate::registry::strategy::Kind>::info().group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as $crate::registry::strategy::Kind>::info().versions[0].into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as $crate::registry::strategy::Kind>::info().plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// An object for validating admission, as JSON: a create's, or an update's with the object before it and the
/// part of it the update writes.
#[derive(Clone, Copy, Debug)]
pub struct Admit<'a> {
    pub object: &'a Value,
    pub old: Option<(&'a Value, Subresource)>,
}

/// What validating admission found: the object's name and every invalid field (none when admitted), and the fields
/// of the object the decoder did not know.
#[derive(Debug)]
pub struct Validated {
    pub name: String,
    pub errors: Vec<FieldError>,
    pub unknown_fields: Vec<String>,
}

/// An object decoded for mutating admission: canonical JSON before and after the kind's defaults.
pub struct Defaulted {
    pub before: Value,
    pub after: Value,
    pub unknown_fields: Vec<String>,
}

/// A kind as the generic registry and the HTTP edge see it, its type erased: the one object-safe trait per served
/// resource. Implemented once, generically, by the typed store ([`Store`](super::store::Store)), where every step
/// runs on the kind's Rust type; `at` is the resource's storage.
#[async_trait::async_trait]
pub trait Strategy: Send + Sync {
    fn info(&self) -> &'static KindInfo;
    /// The version objects are written in.
    fn storage_version(&self) -> &str;
    /// Create: the body decoded once into the kind's type, prepared, defaulted, validated and encoded once.
    async fn create(
        &self,
        at: &Resource,
        namespace: Option<&str>,
        version: &str,
        body: Value,
        dups: &[String],
        opts: &WriteOptions,
    ) -> ApiResult<Written>;
    /// Update (PUT) or patch of what `subresource` names of the object `target` names.
    async fn update(
        &self,
        at: &Resource,
        target: &ObjectRef<'_>,
        change: Change,
        subresource: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<Written>;
    /// Delete, or the mark for deletion while finalizers remain.
    async fn delete(&self, at: &Resource, target: &ObjectRef<'_>, opts: &DeleteRequest) -> ApiResult<Value>;
    /// What mutating admission needs: `obj` decoded as a request body is, before and after its defaults (and, on
    /// create, create preparation).
    fn defaulted(&self, obj: &Value, create: bool) -> Result<Defaulted, ApiError>;
    /// Validating admission: the steps a REST write runs, on the typed object — decode with its defaults, the
    /// namespace checked against the request's, then `BeforeCreate` (status reset, create preparation, metadata
    /// and kind validation) or `BeforeUpdate`'s validation against the old object decoded the same way. Only the
    /// decode and the namespace check fail; invalid fields are in the answer.
    fn admit(&self, namespace: Option<&str>, write: Admit<'_>) -> ApiResult<Validated>;
    /// Whether the kind serves `subresource`: the object itself always, `/status` when the kind has a status
    /// ([`Kind::Status`]).
    fn serves(&self, subresource: Subresource) -> bool;
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
    /// The kind whose keys and form stored objects have: this kind's own [`info`](Self::info), or that of the kind
    /// it is stored as ([`Kind::stored_as`]).
    fn stored_info(&self) -> &'static KindInfo;
    /// A stored object as this kind's JSON (apiVersion and kind left out) when it is stored as another kind;
    /// `None` when stored in its own form, which reads serve as stored.
    fn convert_stored(&self, stored: &[u8]) -> Option<serde_json::Result<Map<String, Value>>>;
    /// [`Kind::FIELD_LABELS`].
    fn field_labels(&self) -> &'static [&'static str];
    /// [`Kind::selectable_fields`] of an object in this kind's JSON (none when it does not decode).
    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)>;
    /// [`Kind::NAME_AND_AGE_COLUMNS`].
    fn name_and_age_columns(&self) -> bool;
}

/// Metadata that admission leaves out of the objects it decodes: `managedFields` is the storing server's record of
/// who set which field, which kube-apiserver writes and checks itself, and which no default or validation of ours
/// reads; entries of any shape are neither checked nor patched.
pub const STORING_SERVER_METADATA: &[&str] = &["managedFields"];

/// The error for an object of `kind` that is some other JSON value.
pub fn not_an_object(kind: &str) -> ApiError {
    ApiError::bad_request(format!("the body of the request must be a JSON object ({kind})"))
}

/// Removes [`STORING_SERVER_METADATA`] from an object that admission decodes.
pub fn drop_storing_server_metadata(obj: &mut Value) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.retain(|k, _| !STORING_SERVER_METADATA.contains(&k.as_str()));
    }
}

/// Notes a field the typed decode did not know, by its path as kube-apiserver's strict decoding error writes it
/// (keys joined with dots, list indexes in brackets: `spec.template.spec.initContainers[0].restartPolicy`);
/// apiVersion and kind, which the registry checks and the typed structs do not carry, excepted.
pub(super) fn note_unknown(path: &serde_ignored::Path<'_>, unknown: &mut Vec<String>) {
    use serde_ignored::Path;
    fn segments(path: &Path<'_>, out: &mut Vec<String>) {
        match path {
            Path::Root => {}
            Path::Seq { parent, index } => {
                segments(parent, out);
                match out.last_mut() {
                    Some(last) => last.push_str(&format!("[{index}]")),
                    None => out.push(format!("[{index}]")),
                }
            }
            Path::Map { parent, key } => {
                segments(parent, out);
                out.push(key.clone());
            }
            Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => {
                segments(parent, out)
            }
        }
    }
    let mut out = Vec::new();
    segments(path, &mut out);
    if !(out.len() == 1 && matches!(out[0].as_str(), "apiVersion" | "kind")) {
        unknown.push(out.join("."));
    }
}

/// Go-style field path from serde's path ("spec.resource" rather than ".spec.resource").
pub(super) fn path_string(p: &serde_path_to_error::Path) -> String {
    p.to_string().trim_start_matches('.').to_string()
}

/// The kind's schema name and every schema it references (OpenAPI v3 form, refs to `#/components/schemas/`).
pub(super) fn kind_schemas<K: Kind>() -> (String, Map<String, Value>) {
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    let _ = generator.subschema_for::<K>();
    let _ = generator.subschema_for::<ListMeta>();
    let _ = generator.subschema_for::<Status>();
    let _ = generator.subschema_for::<DeleteOptions>();
    let defs = generator.take_definitions(true);
    (K::schema_name().to_string(), defs)
}

/// An object with its apiVersion and kind (the typed structs do not carry them), as it is encoded.
#[derive(serde::Serialize)]
pub(super) struct WithTypeMeta<'a, K> {
    #[serde(rename = "apiVersion")]
    pub(super) api_version: &'a str,
    pub(super) kind: &'a str,
    #[serde(flatten)]
    pub(super) object: &'a K,
}

#[cfg(test)]
mod tests {
    use super::note_unknown;
    use serde_json::json;

    /// As kube-apiserver's strict decoding errors name them: `unknown field "spec.containers[0].ports"`.
    #[test]
    fn unknown_fields_are_named_as_kube_apiserver_names_them() {
        #[derive(serde::Deserialize)]
        struct Item {}
        #[derive(serde::Deserialize)]
        struct Object {
            #[serde(default)]
            _items: Vec<Item>,
            #[serde(default)]
            _nested: Vec<Vec<Item>>,
            #[serde(default)]
            _maybe: Option<Vec<Item>>,
        }
        let body =
            json!({"kind": "K", "_items": [{}, {"x": 1}], "_nested": [[{"y": 1}]], "_maybe": [{"w": 1}], "z": 1});
        let mut unknown = Vec::new();
        let _: Object = serde_ignored::deserialize(body, |p| note_unknown(&p, &mut unknown)).expect("decodes");
        assert_eq!(unknown, ["_items[1].x", "_maybe[0].w", "_nested[0][0].y", "z"]);
    }
}

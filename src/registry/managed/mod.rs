//! Field management and server-side apply, as k8s.io/apimachinery's managedfields package does it over
//! structured-merge-diff: `metadata.managedFields` records, per manager, operation (Apply or Update), API version
//! and subresource, the set of fields it owns. An update takes ownership of what it changed; an apply merges its
//! configuration into the object, owns exactly the fields it sets, removes the fields it stopped setting that no one
//! else owns, and fails with a conflict when it would change a field another manager owns, unless forced.

pub mod fieldpath;
pub mod shape;
#[cfg(test)]
mod tests;
pub mod walk;

use super::strategy::Subresource;
use crate::error::{ApiError, Details, FieldError, StatusReason};
use fieldpath::{path_string, PathElement, Set};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use serde_json::Value;
use shape::Shape;
use std::collections::BTreeMap;

pub const APPLY: &str = "Apply";
pub const UPDATE: &str = "Update";
/// kubectl's manager for `apply --server-side`; it alone upgrades from client-side apply's annotation.
const KUBECTL: &str = "kubectl";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// How many Update entries an object keeps, and the entry older ones are folded into (apimachinery's defaults).
const MAX_UPDATERS: usize = 10;
const ANCIENT_CHANGES: &str = "ancient-changes";
/// The name of a writer that gave none (no fieldManager, no User-Agent).
const UNKNOWN_MANAGER: &str = "unknown";
/// The largest the annotations may grow by the last-applied annotation kubectl's applies keep in step.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
/// The manager given the fields of an object that had none recorded when it is first applied to.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// Fields no manager owns: the identity and bookkeeping the server sets (apimachinery's stripMeta).
const STRIPPED_META: &[&str] =
    &["name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields", "resourceVersion"];

/// Who manages: upstream's manager identifier. An applier is the same manager whatever API version it applies in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ManagerId {
    manager: String,
    operation: String,
    api_version: String,
    subresource: String,
}

impl ManagerId {
    /// An applier is the same manager whatever API version it applies in, so its identity leaves the version out.
    fn new(manager: &str, operation: &str, api_version: &str, subresource: &str) -> ManagerId {
        ManagerId {
            manager: manager.to_string(),
            operation: operation.to_string(),
            api_version: if operation == APPLY { String::new() } else { api_version.to_string() },
            subresource: subresource.to_string(),
        }
    }

    /// As upstream prints a manager in a conflict.
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == UPDATE {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }
}

#[derive(Clone, Debug)]
struct Owned {
    set: Set,
    api_version: String,
    time: Option<Time>,
}

/// The managers of one object.
#[derive(Clone, Debug, Default)]
pub struct Managers(BTreeMap<ManagerId, Owned>);

/// Where a write happens: the request's API version and subresource, and the kind's shape.
pub struct Scope<'a> {
    pub shape: &'a Shape,
    pub api_version: &'a str,
    pub subresource: Subresource,
    /// The kind has a status subresource: the main resource does not own status, /status owns only status.
    pub has_status: bool,
}

impl Scope<'_> {
    /// The writer's identity; a writer without a name is `unknown`, as apimachinery names it.
    fn id(&self, manager: &str, operation: &str) -> ManagerId {
        let manager = if manager.is_empty() { UNKNOWN_MANAGER } else { manager };
        ManagerId::new(manager, operation, self.api_version, self.subresource.as_str())
    }

    /// The fields a write here can own: no server bookkeeping (apiVersion, kind, metadata's identity and
    /// bookkeeping fields), and status only through /status.
    fn filter(&self, set: &Set) -> Set {
        let field = |f: &str| PathElement::Field(f.to_string());
        let mut out = set.clone();
        for f in ["apiVersion", "kind", "metadata"] {
            out.remove_member(&field(f));
        }
        if let Some(meta) = out.child_mut(&field("metadata")) {
            for f in STRIPPED_META {
                meta.remove_member(&field(f));
                meta.remove_child(&field(f));
            }
        }
        match self.subresource {
            Subresource::Status => out.retain_root(&field("status")),
            Subresource::Main if self.has_status => {
                out.remove_member(&field("status"));
                out.remove_child(&field("status"));
            }
            Subresource::Main => {}
        }
        out.prune_empty();
        out
    }
}

/// Why stored or sent `metadata.managedFields` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManagedFieldsError {
    #[error("operation must be `Apply` or `Update`")]
    Operation,
    #[error("apiVersion must not be empty")]
    ApiVersion,
    #[error("missing fieldsType in managed fields entry {0}")]
    MissingFieldsType(usize),
    #[error("invalid fieldsType {fields_type:?} in managed fields entry {entry}")]
    FieldsType { fields_type: String, entry: usize },
    #[error(transparent)]
    FieldsV1(#[from] fieldpath::FieldsV1Error),
}

impl Managers {
    /// The entries of `metadata.managedFields`; an entry of another fieldsType or an unreadable set is an error.
    pub fn decode(entries: &[ManagedFieldsEntry]) -> Result<Managers, ManagedFieldsError> {
        let mut out = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            if !matches!(e.operation.as_deref(), Some(APPLY | UPDATE)) {
                return Err(ManagedFieldsError::Operation);
            }
            if e.api_version.as_deref().unwrap_or_default().is_empty() {
                return Err(ManagedFieldsError::ApiVersion);
            }
            match e.fields_type.as_deref().unwrap_or_default() {
                "FieldsV1" => {}
                "" => return Err(ManagedFieldsError::MissingFieldsType(i)),
                other => {
                    return Err(ManagedFieldsError::FieldsType { fields_type: other.to_string(), entry: i });
                }
            }
            let set = match &e.fields_v1 {
                Some(FieldsV1(v)) => Set::from_fields_v1(v)?,
                None => Set::default(),
            };
            let operation = e.operation.clone().unwrap_or_default();
            let api_version = e.api_version.clone().unwrap_or_default();
            let (manager, subresource) = (e.manager.as_deref(), e.subresource.as_deref());
            let id =
                ManagerId::new(manager.unwrap_or_default(), &operation, &api_version, subresource.unwrap_or_default());
            out.insert(id, Owned { set, api_version, time: e.time.clone() });
        }
        Ok(Managers(out))
    }

    /// The entries to store, in upstream's order (operation, time, manager, API version, subresource); managers
    /// that own nothing are left out.
    pub fn encode(&self) -> Option<Vec<ManagedFieldsEntry>> {
        let mut entries: Vec<ManagedFieldsEntry> = self
            .0
            .iter()
            .filter(|(_, o)| !o.set.is_empty())
            .map(|(id, o)| ManagedFieldsEntry {
                api_version: Some(o.api_version.clone()),
                fields_type: Some("FieldsV1".into()),
                fields_v1: Some(FieldsV1(o.set.to_fields_v1())),
                manager: Some(id.manager.clone()),
                operation: Some(id.operation.clone()),
                subresource: (!id.subresource.is_empty()).then(|| id.subresource.clone()),
                time: o.time.clone(),
            })
            .collect();
        let second = |e: &ManagedFieldsEntry| e.time.as_ref().map_or(0, |t| t.0.as_second());
        entries.sort_by(|a, b| {
            (&a.operation, second(a), &a.manager, &a.api_version, &a.subresource).cmp(&(
                &b.operation,
                second(b),
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
        });
        (!entries.is_empty()).then_some(entries)
    }

    /// How many entries were recorded (`[{}]` is one, owning nothing).
    pub fn entries(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.values().all(|o| o.set.is_empty())
    }

    /// An update (create, PUT, PATCH) by `manager`: it takes the fields it changed from everyone, and no one owns
    /// the fields it removed.
    pub fn update(&mut self, scope: &Scope, old: &Value, new: &Value, manager: &str) {
        let cmp = walk::compare(old, new, scope.shape);
        let changed = scope.filter(&cmp.changed());
        let removed = scope.filter(&cmp.removed);
        let me = scope.id(manager, UPDATE);
        for (_, o) in self.0.iter_mut().filter(|(id, _)| **id != me) {
            o.set = o.set.difference(&changed).difference(&removed);
        }
        let mine = self.0.remove(&me);
        let (previous, time) = mine.map_or((Set::default(), None), |o| (o.set, o.time));
        let set = previous.difference(&removed).union(&changed);
        let time = if changed.is_empty() { time } else { Some(super::now()) };
        self.0.insert(me, Owned { set, api_version: scope.api_version.to_string(), time });
        self.0.retain(|_, o| !o.set.is_empty());
        self.cap_updaters();
    }

    /// At most [`MAX_UPDATERS`] Update entries, as apimachinery's capManagers keeps them: the oldest are folded, per
    /// API version, into one `ancient-changes` entry, so that managers named after every client cannot grow an
    /// object without bound.
    fn cap_updaters(&mut self) {
        let mut updaters: Vec<ManagerId> = self.0.keys().filter(|id| id.operation == UPDATE).cloned().collect();
        if updaters.len() <= MAX_UPDATERS {
            return;
        }
        let second = |o: &Owned| o.time.as_ref().map_or(0, |t| t.0.as_second());
        updaters.sort_by(|a, b| (second(&self.0[a]), &a.manager).cmp(&(second(&self.0[b]), &b.manager)));
        let mut first_of_version: BTreeMap<String, ManagerId> = BTreeMap::new();
        let mut count = updaters.len();
        for id in updaters {
            if count <= MAX_UPDATERS {
                break;
            }
            let Some(owned) = self.0.get(&id).cloned() else { continue };
            let bucket = ManagerId::new(ANCIENT_CHANGES, UPDATE, &owned.api_version, "");
            match first_of_version.get(&owned.api_version) {
                None => {
                    first_of_version.insert(owned.api_version.clone(), id);
                }
                Some(first) => {
                    if !self.0.contains_key(&bucket) {
                        if let Some(f) = self.0.remove(first) {
                            self.0.insert(bucket.clone(), f);
                        }
                    }
                    self.0.remove(&id);
                    if let Some(b) = self.0.get_mut(&bucket) {
                        b.set = b.set.union(&owned.set);
                        b.time = owned.time;
                    }
                    count -= 1;
                }
            }
        }
    }

    /// Applies `config` to `live` for `manager`; the object to store, or a conflict.
    pub fn apply(
        &mut self,
        scope: &Scope,
        empty: &Value,
        live: &Value,
        config: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, ApiError> {
        if self.is_empty() {
            // The object's fields so far are someone's: an apply that changes them conflicts.
            self.update(scope, empty, live, BEFORE_FIRST_APPLY);
        }
        let before = self.clone();
        let merged = match self.apply_once(scope, live, config, manager, force) {
            Err(Failure::Conflicts(conflicts)) if manager == KUBECTL && !force => {
                // kubectl upgrading from client-side apply: conflicts on fields its last-applied annotation set (to
                // the live values) are its own.
                let allowed = last_applied_fields(scope, live).unwrap_or_default();
                let uncovered: Vec<_> = conflicts.into_iter().filter(|(_, p)| !allowed.contains(p)).collect();
                if !uncovered.is_empty() {
                    return Err(Failure::Conflicts(uncovered).into());
                }
                *self = before;
                self.apply_once(scope, live, config, manager, true)?
            }
            result => result?,
        };
        Ok(keep_last_applied(merged, config, manager))
    }

    fn apply_once(
        &mut self,
        scope: &Scope,
        live: &Value,
        config: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, Failure> {
        let mut merged = walk::merge(live, config, scope.shape).map_err(Failure::Malformed)?;
        let set = scope.filter(&walk::config_set(config, scope.shape).map_err(Failure::Malformed)?);
        let me = scope.id(manager, APPLY);
        let previous = self.0.remove(&me);
        let time = previous.as_ref().and_then(|o| o.time.clone());
        self.0.insert(me.clone(), Owned { set, api_version: scope.api_version.to_string(), time });
        // Prune: what this manager applied last time and not now goes, unless someone (this apply included) owns it.
        if let Some(last) = previous {
            let owned = self.0.values().fold(Set::default(), |acc, o| acc.union(&o.set));
            walk::prune(&mut merged, scope.shape, &last.set.difference(&owned), Some(&owned));
        }
        let cmp = walk::compare(live, &merged, scope.shape);
        let changed = scope.filter(&cmp.changed());
        let removed = scope.filter(&cmp.removed);
        let mut conflicts = Vec::new();
        for (id, o) in self.0.iter().filter(|(id, _)| **id != me) {
            conflicts.extend(o.set.intersection(&changed).paths().into_iter().map(|p| (id.describe(), p)));
        }
        if !conflicts.is_empty() && !force {
            return Err(Failure::Conflicts(conflicts));
        }
        for (_, o) in self.0.iter_mut().filter(|(id, _)| **id != me) {
            o.set = o.set.difference(&changed).difference(&removed);
        }
        if &merged != live {
            if let Some(o) = self.0.get_mut(&me) {
                o.time = Some(super::now());
            }
        }
        self.0.retain(|_, o| !o.set.is_empty());
        self.cap_updaters();
        Ok(merged)
    }
}

/// Why an apply failed.
enum Failure {
    /// (manager, path) pairs, the manager as a conflict names it.
    Conflicts(Vec<(String, Vec<PathElement>)>),
    /// The configuration cannot be merged (a map list item without its key, duplicate keys).
    Malformed(walk::WalkError),
}

impl From<Failure> for ApiError {
    /// A conflict is a 409 with one cause per conflicting field, worded as kube-apiserver words it; a configuration
    /// that cannot be merged is a 500 there too.
    fn from(f: Failure) -> ApiError {
        let mut conflicts = match f {
            Failure::Malformed(e) => return ApiError::internal(format!("failed to create typed patch object: {e}")),
            Failure::Conflicts(c) => c,
        };
        conflicts.sort();
        let causes = conflicts
            .iter()
            .map(|(m, p)| FieldError {
                reason: crate::error::CauseType::FieldManagerConflict,
                field: path_string(p),
                message: format!("conflict with {m}"),
            })
            .collect();
        let message = match conflicts.as_slice() {
            [(m, p)] => format!("Apply failed with 1 conflict: conflict with {m}: {}", path_string(p)),
            _ => {
                let mut lines = Vec::new();
                let mut current = None;
                for (m, p) in &conflicts {
                    if current != Some(m) {
                        lines.push(format!("conflicts with {m}:"));
                        current = Some(m);
                    }
                    lines.push(format!("- {}", path_string(p)));
                }
                format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
            }
        };
        let mut e = ApiError::new(StatusReason::Conflict, message);
        e.details = Some(Box::new(Details { causes, ..Default::default() }));
        e
    }
}

/// The fields the client-side apply annotation set to what the live object still has.
fn last_applied_fields(scope: &Scope, live: &Value) -> Option<Set> {
    let text = live.pointer("/metadata/annotations")?.get(LAST_APPLIED)?.as_str()?;
    let last: Value = serde_json::from_str(text).ok()?;
    // Only an annotation of the version applied in says what the applier set.
    if last.get("apiVersion").and_then(Value::as_str) != Some(scope.api_version) {
        return None;
    }
    let set = walk::to_set(&last, scope.shape).ok()?;
    let cmp = walk::compare(&last, live, scope.shape);
    Some(set.difference(&cmp.modified).difference(&cmp.added).difference(&cmp.removed))
}

/// kubectl's server-side applies keep the client-side apply annotation, where there is one, in step with the
/// applied configuration, so that a later client-side apply computes the right patch.
fn keep_last_applied(mut merged: Value, config: &Value, manager: &str) -> Value {
    let annotations = merged.pointer("/metadata/annotations").and_then(Value::as_object);
    let has = annotations.and_then(|a| a.get(LAST_APPLIED)).and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    if manager != KUBECTL || !has {
        return merged;
    }
    let mut applied = config.clone();
    if let Some(a) = applied.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        a.remove(LAST_APPLIED);
    }
    if let Some(a) = merged.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        a.insert(LAST_APPLIED.into(), Value::from(applied.to_string()));
        // Too large for the annotations' limit: dropped rather than failing the apply, as apimachinery does.
        let size: usize = a.iter().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum();
        if size > MAX_ANNOTATIONS_BYTES {
            a.remove(LAST_APPLIED);
        }
    }
    merged
}

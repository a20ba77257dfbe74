//! Admission of objects that another server stores: when our kinds are installed as CRDs (the upstream deployment
//! form), kube-apiserver stores them and asks us to default and validate them (AdmissionReview). These entry points
//! run the very steps [`Resource::create`] and [`Resource::update`] run — decode with the kind's defaults,
//! `prepare_for_create`, metadata validation, the kind's validation — and leave out what belongs to the storing
//! server (uid, resourceVersion, timestamps, generation, dropping status on create), which kube-apiserver does itself.

use super::decode::starts_object;
use super::{Registry, Resource};
use crate::api::meta::validate_object_meta;
use crate::api::{AdmissionPass, Decoded, PassWrite};
use crate::error::{ApiError, ApiResult};
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::Arc;

/// A write to admit, with the object(s) as kube-apiserver sent them.
#[derive(Debug)]
pub enum AdmissionWrite {
    Create {
        object: Box<RawValue>,
    },
    /// `status`: the write is to the `/status` subresource.
    Update {
        object: Box<RawValue>,
        old_object: Box<RawValue>,
        status: bool,
    },
}

/// The outcome of defaulting: the JSON patch that defaults the object as sent (empty when nothing changes).
#[derive(Debug)]
pub struct Defaulted {
    /// The operations of the JSON Patch.
    pub patch: Vec<Value>,
    pub warnings: Vec<String>,
}

impl Registry {
    /// The resource whose kind is `kind` of `group`, if it serves `version`.
    pub fn resource_for_kind(&self, group: &str, version: &str, kind: &str) -> Option<&Arc<Resource>> {
        self.resources.iter().find(|r| {
            let i = r.strategy.info();
            i.group == group && i.kind == kind && i.versions.contains(&version)
        })
    }
}

/// Absent, null or an empty string, list or object: what defaulting may fill in.
fn unset(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    }
}

/// The JSON Patch operations that add to `sent` what defaulting added in `defaulted`: values where `sent` has none
/// (`path` is the JSON pointer of both). What the typed round trip merely normalizes (unknown fields dropped, empty
/// fields omitted, number forms) is not a default and is left as sent — kube-apiserver prunes and normalizes CRD
/// objects itself, and a patch must not fight it (reinvocation would loop).
fn default_ops(sent: &Value, defaulted: &Value, path: &mut String, ops: &mut Vec<Value>) {
    match (sent, defaulted) {
        (Value::Object(s), Value::Object(d)) => {
            for (k, dv) in d {
                let len = path.len();
                path.push('/');
                path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                match s.get(k) {
                    sv if unset(sv) && !unset(Some(dv)) => {
                        let op = if sv.is_none() { "add" } else { "replace" };
                        ops.push(serde_json::json!({"op": op, "path": path.as_str(), "value": dv}));
                    }
                    Some(sv) if !unset(Some(sv)) => default_ops(sv, dv, path, ops),
                    _ => {}
                }
                path.truncate(len);
            }
        }
        (Value::Array(s), Value::Array(d)) if s.len() == d.len() => {
            for (i, (s, d)) in s.iter().zip(d).enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                default_ops(s, d, path, ops);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

impl Resource {
    /// Mutating admission: the kind's defaults, as the aggregated API applies them — decode defaults plus
    /// `prepare_for_create` on create, decode defaults on update (main resource and `/status`). Idempotent: the
    /// patched object defaults to itself, so a reinvocation returns no patch.
    pub fn admission_default(&self, version: &str, write: AdmissionWrite) -> ApiResult<Defaulted> {
        let (sent, create) = match write {
            AdmissionWrite::Create { object } => (object, true),
            AdmissionWrite::Update { object, .. } => (object, false),
        };
        // The patch is computed on the object as sent, so it is read as a `Value` here.
        let sent: Value = serde_json::from_str(sent.get()).map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.check_type_meta(&sent, version)?;
        let Decoded { object: mut defaulted, unknown_fields } = self.strategy.admission_defaults(&sent, create)?;
        self.set_type_meta(&mut defaulted, version);
        let warnings = unknown_fields.into_iter().map(|f| format!("unknown field {f:?}")).collect();
        let mut patch = Vec::new();
        default_ops(&sent, &defaulted, &mut String::new(), &mut patch);
        Ok(Defaulted { patch, warnings })
    }

    /// [`check_type_meta`](Resource::check_type_meta) of an object's JSON text, reading only apiVersion and kind
    /// (the whole text as a `Value` only when those are not plain strings).
    fn check_type_text(&self, text: &str, version: &str) -> ApiResult<()> {
        #[derive(serde::Deserialize)]
        struct TypeMeta<'a> {
            #[serde(rename = "apiVersion", default, borrow)]
            api_version: Option<&'a str>,
            #[serde(default, borrow)]
            kind: Option<&'a str>,
        }
        match serde_json::from_str::<TypeMeta<'_>>(text) {
            Ok(t) if starts_object(text.as_bytes()) => self.check_type_strs(t.api_version, t.kind, version),
            _ => {
                let value: Value = serde_json::from_str(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
                self.check_type_meta(&value, version)
            }
        }
    }

    /// Validating admission: metadata and kind validation on create (after the same preparation as
    /// [`Resource::create`]); the kind's update validation (or its `/status` validation) on update. A denial is
    /// the 422 Invalid the aggregated API would answer, listing every invalid field; Ok carries warnings.
    pub fn admission_validate(
        &self,
        version: &str,
        namespace: Option<&str>,
        write: AdmissionWrite,
    ) -> ApiResult<Vec<String>> {
        let (object, pass) = match &write {
            AdmissionWrite::Create { object } => (object.get(), PassWrite::Create),
            AdmissionWrite::Update { object, old_object, status } => {
                (object.get(), PassWrite::Update { old: old_object.get(), status: *status })
            }
        };
        self.check_type_text(object, version)?;
        if let PassWrite::Update { old, .. } = pass {
            self.check_type_text(old, version)?;
        }
        let AdmissionPass { mut metadata, errors, unknown_fields, mut old_namespace } =
            self.strategy.admission_pass(object, pass)?;
        self.check_namespace_of(&mut metadata.namespace, namespace)?;
        if let PassWrite::Update { .. } = pass {
            self.check_namespace_of(&mut old_namespace, namespace)?;
        }
        let metadata = serde_json::to_value(&metadata).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut errs = validate_object_meta(&metadata, self.info().namespaced, self.info().name_rule);
        errs.extend(errors);
        if !errs.is_empty() {
            let name = metadata.get("name").and_then(Value::as_str).unwrap_or_default();
            return Err(self.invalid(name, errs));
        }
        Ok(unknown_fields.into_iter().map(|f| format!("unknown field {f:?}")).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
    use serde_json::json;

    fn registry(dir: &std::path::Path) -> Registry {
        let storage = EmbeddedStorage::open(dir, EmbeddedOptions::default()).expect("store");
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        Registry::new(storage, kinds, Default::default())
    }

    fn raw(v: &Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(v).expect("JSON")
    }

    fn resource<'a>(r: &'a Registry, kind: &str) -> &'a Arc<Resource> {
        r.resources.iter().find(|r| r.strategy.info().kind == kind).expect("kind")
    }

    /// The typed admission pass answers as the REST path's decode, defaults, preparation and validation do.
    #[test]
    fn validating_admission_decodes_once_and_answers_as_the_api() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = registry(dir.path());
        let svm = resource(&r, "StorageVersionMigration");
        let json_of = |spec: Value| {
            json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
                   "metadata": {"name": "m1", "bogus": 1}, "spec": spec,
                   "status": {"conditions": [{"type": "Succeeded", "status": "True"}, {"type": "Failed", "status": "True"}]}})
        };
        let object = |spec: Value| raw(&json_of(spec));
        let good = json!({"resource": {"group": "apps", "version": "v1", "resource": "deployments"}, "extra": true});
        // Unknown fields are warnings (apiVersion and kind are not unknown); status is dropped on create, so the
        // contradictory conditions do not count.
        let warnings = svm
            .admission_validate("v1alpha1", None, AdmissionWrite::Create { object: object(good.clone()) })
            .expect("allowed");
        assert_eq!(warnings, vec!["unknown field \"metadata.bogus\"", "unknown field \"spec.extra\""]);
        // A value of the wrong type: 400 naming the field, as the REST decode says it.
        let e = svm
            .admission_validate(
                "v1alpha1",
                None,
                AdmissionWrite::Create { object: object(json!({"resource": {"group": 5}})) },
            )
            .unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with("error decoding StorageVersionMigration at spec.resource.group: invalid type"),
            "{}",
            e.message
        );
        // Missing fields: 422 listing each.
        let e = svm
            .admission_validate("v1alpha1", None, AdmissionWrite::Create { object: object(json!({"resource": {}})) })
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains("spec.resource.resource") && e.message.contains("spec.resource.version"),
            "{}",
            e.message
        );
        // Another kind's apiVersion: 400.
        let mut other = json_of(good.clone());
        other["apiVersion"] = json!("migration.k8s.io/v2");
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::Create { object: raw(&other) }).unwrap_err();
        assert!(e.message.contains("does not match the expected API version"), "{}", e.message);
        // Updates validate against the old object: spec.resource is immutable; a /status update checks status.
        let mut changed = good.clone();
        changed["resource"]["version"] = json!("v2");
        let update = |new: Box<RawValue>, status: bool| AdmissionWrite::Update {
            object: new,
            old_object: object(good.clone()),
            status,
        };
        let e = svm.admission_validate("v1alpha1", None, update(object(changed), false)).unwrap_err();
        assert!(e.message.contains("spec.resource") && e.message.contains("immutable"), "{}", e.message);
        let e = svm.admission_validate("v1alpha1", None, update(object(good.clone()), true)).unwrap_err();
        assert_eq!(e.code, 422, "{}", e.message);
        // Namespaced kinds take the request's namespace; another one in the object is a 400.
        let ss = resource(&r, "ShootState");
        let shoot = |ns: Option<&str>| {
            let mut o = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState", "metadata": {"name": "s"}, "spec": {}});
            if let Some(ns) = ns {
                o["metadata"]["namespace"] = json!(ns);
            }
            raw(&o)
        };
        assert!(ss
            .admission_validate("v1beta1", Some("garden-a"), AdmissionWrite::Create { object: shoot(None) })
            .is_ok());
        let e = ss
            .admission_validate("v1beta1", Some("garden-a"), AdmissionWrite::Create { object: shoot(Some("garden-b")) })
            .unwrap_err();
        assert!(e.message.contains("does not match the namespace sent on the request"), "{}", e.message);
        let e = ss.admission_validate("v1beta1", None, AdmissionWrite::Create { object: shoot(None) }).unwrap_err();
        assert!(e.message.contains("metadata.namespace"), "{}", e.message);
        // JSON text the typed decode does not take directly is read as a `Value`, as the REST API reads it: a
        // duplicate field (the last one counts), an escaped apiVersion, and a type error found after the escape.
        let text = |t: &str| RawValue::from_string(t.to_string()).expect("JSON");
        let dup = r#"{"apiVersion":"migration.k8s.io\/v1alpha1","kind":"StorageVersionMigration","metadata":{"name":"m2"},
            "spec":{"resource":{}},"spec":{"resource":{"group":"","version":"v1","resource":"pods"}}}"#;
        assert_eq!(
            svm.admission_validate("v1alpha1", None, AdmissionWrite::Create { object: text(dup) }).unwrap(),
            Vec::<String>::new()
        );
        let bad = r#"{"apiVersion":"migration.k8s.io\/v1alpha1","metadata":{"name":"m3"},"spec":{"resource":{"version":["v1"]}}}"#;
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::Create { object: text(bad) }).unwrap_err();
        assert!(
            e.message.starts_with("error decoding StorageVersionMigration at spec.resource.version"),
            "{}",
            e.message
        );
        let wrong = r#"{"apiVersion":"migration.k8s.io\/v2","metadata":{"name":"m4"}}"#;
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::Create { object: text(wrong) }).unwrap_err();
        assert!(e.message.contains("(migration.k8s.io/v2) does not match"), "{}", e.message);
    }

    #[test]
    fn defaults_fill_only_what_is_unset() {
        let sent = json!({"a": "", "b": [], "c": {"x": 1, "keep": "me"}, "d": null, "e": [{"k": ""}], "f": "x"});
        let defaulted = json!({"a": "A", "b": ["B"], "c": {"x": 2, "y": 3}, "d": {}, "e": [{"k": "K"}], "f": "y"});
        let mut ops = Vec::new();
        default_ops(&sent, &defaulted, &mut String::new(), &mut ops);
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("a JSON Patch");
        let mut patched = sent.clone();
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(
            patched,
            json!({"a": "A", "b": ["B"], "c": {"x": 1, "y": 3, "keep": "me"}, "d": null, "e": [{"k": "K"}], "f": "x"})
        );
        // Keys are escaped in the pointers; an object that needs nothing gets no operation.
        let mut ops = Vec::new();
        default_ops(&json!({"a/b~c": {}}), &json!({"a/b~c": {"z": 1}}), &mut String::new(), &mut ops);
        assert_eq!(ops, vec![json!({"op": "replace", "path": "/a~1b~0c", "value": {"z": 1}})]);
        let mut ops = Vec::new();
        default_ops(&json!({"a": 1}), &json!({"a": 2, "b": ""}), &mut String::new(), &mut ops);
        assert!(ops.is_empty(), "{ops:?}");
    }
}

//! Admission of objects that another server stores: when our kinds are installed as CRDs (the upstream deployment
//! form), kube-apiserver stores them and asks us to default and validate them (AdmissionReview). These entry points
//! run the very steps [`Resource::create`] and [`Resource::update`] run — decode with the kind's defaults,
//! `prepare_for_create`, metadata validation, the kind's validation — and leave out what belongs to the storing
//! server (uid, resourceVersion, timestamps, generation, dropping status on create), which kube-apiserver does itself.
//! `metadata.managedFields` ([`STORING_SERVER_METADATA`]) is not even decoded: kube-apiserver writes and checks it,
//! and nothing of ours reads it.

use super::decode::{decode_with_type_meta, TypeMeta};
use super::{Registry, Resource};
use crate::api::meta::validate_object_meta;
use crate::api::{drop_storing_server_metadata, AdmissionPass, Decoded, PassWrite, STORING_SERVER_METADATA};
use crate::error::{ApiError, ApiResult};
use serde_json::Value;
use std::fmt::Write;
use std::sync::Arc;

/// A write to admit, with the object(s) as kube-apiserver sent them (JSON text).
#[derive(Clone, Copy, Debug)]
pub enum AdmissionWrite<'a> {
    Create {
        object: &'a str,
    },
    /// `status`: the write is to the `/status` subresource.
    Update {
        object: &'a str,
        old_object: &'a str,
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
                push_pointer_token(path, k);
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
                let _ = write!(path, "{i}"); // Writing to a String cannot fail.
                default_ops(s, d, path, ops);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Appends `key` to a JSON pointer, escaped (RFC 6901: `~` as `~0`, `/` as `~1`).
fn push_pointer_token(path: &mut String, key: &str) {
    for c in key.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

impl Resource {
    /// Mutating admission: the kind's defaults, as the aggregated API applies them — decode defaults plus
    /// `prepare_for_create` on create, decode defaults on update (main resource and `/status`). Idempotent: the
    /// patched object defaults to itself, so a reinvocation returns no patch.
    pub fn admission_default(&self, version: &str, write: AdmissionWrite<'_>) -> ApiResult<Defaulted> {
        let (sent, create) = match write {
            AdmissionWrite::Create { object } => (object, true),
            AdmissionWrite::Update { object, .. } => (object, false),
        };
        let sent = self.sent_value(sent, version)?;
        let Decoded { object: mut defaulted, unknown_fields } = self.strategy.admission_defaults(&sent, create)?;
        self.set_type_meta(&mut defaulted, version);
        let warnings = unknown_fields.into_iter().map(|f| format!("unknown field {f:?}")).collect();
        let mut patch = Vec::new();
        default_ops(&sent, &defaulted, &mut String::new(), &mut patch);
        Ok(Defaulted { patch, warnings })
    }

    /// The object as sent, as a `Value` (the patch is computed on it) after the check of its apiVersion and kind,
    /// without the metadata that belongs to the storing server ([`STORING_SERVER_METADATA`]: no default touches
    /// it, so it stays out of the typed round trip and of the patch). Read in one pass that skips that metadata,
    /// or, for text that does not read so or has no string apiVersion and kind, as a whole.
    fn sent_value(&self, text: &str, version: &str) -> ApiResult<Value> {
        // Without a string apiVersion and kind (absent, or another JSON value) the whole text is read instead, so
        // that the patch treats them exactly as sent.
        let read = decode_with_type_meta::<Value, _>(text, STORING_SERVER_METADATA, |_| {});
        if let Ok((mut sent, TypeMeta { api_version: Some(api_version), kind: Some(kind) })) = read {
            self.check_type_strs(Some(&api_version), Some(&kind), version)?;
            if let Some(o) = sent.as_object_mut() {
                o.insert("apiVersion".into(), Value::String(api_version.into_owned()));
                o.insert("kind".into(), Value::String(kind.into_owned()));
            }
            return Ok(sent);
        }
        let mut sent: Value = serde_json::from_str(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.check_type_meta(&sent, version)?;
        drop_storing_server_metadata(&mut sent);
        Ok(sent)
    }

    /// Validating admission: metadata and kind validation on create (after the same preparation as
    /// [`Resource::create`]); the kind's update validation (or its `/status` validation) on update. A denial is
    /// the 422 Invalid the aggregated API would answer, listing every invalid field; Ok carries warnings.
    pub fn admission_validate(
        &self,
        version: &str,
        namespace: Option<&str>,
        write: AdmissionWrite<'_>,
    ) -> ApiResult<Vec<String>> {
        let (object, pass) = match write {
            AdmissionWrite::Create { object } => (object, PassWrite::Create),
            AdmissionWrite::Update { object, old_object, status } => {
                (object, PassWrite::Update { old: old_object, status })
            }
        };
        let check_type = |t: &TypeMeta<'_>| self.check_type_strs(t.api_version.as_deref(), t.kind.as_deref(), version);
        let AdmissionPass { mut metadata, errors, unknown_fields, mut old_namespace } =
            self.strategy.admission_pass(object, pass, &check_type)?;
        self.check_namespace_of(&mut metadata.namespace, namespace)?;
        if let PassWrite::Update { .. } = pass {
            self.check_namespace_of(&mut old_namespace, namespace)?;
        }
        let mut errs = validate_object_meta(&metadata, self.info().namespaced, self.info().name_rule);
        errs.extend(errors);
        if !errs.is_empty() {
            return Err(self.invalid(metadata.name.as_deref().unwrap_or_default(), errs));
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

    fn raw(v: &Value) -> String {
        v.to_string()
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
            .admission_validate("v1alpha1", None, AdmissionWrite::Create { object: &object(good.clone()) })
            .expect("allowed");
        assert_eq!(warnings, vec!["unknown field \"metadata.bogus\"", "unknown field \"spec.extra\""]);
        // A value of the wrong type: 400 naming the field, as the REST decode says it.
        let e = svm
            .admission_validate(
                "v1alpha1",
                None,
                AdmissionWrite::Create { object: &object(json!({"resource": {"group": 5}})) },
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
            .admission_validate("v1alpha1", None, AdmissionWrite::Create { object: &object(json!({"resource": {}})) })
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
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::Create { object: &raw(&other) }).unwrap_err();
        assert!(e.message.contains("does not match the expected API version"), "{}", e.message);
        // Updates validate against the old object: spec.resource is immutable; a /status update checks status.
        let mut changed = good.clone();
        changed["resource"]["version"] = json!("v2");
        let old = object(good.clone());
        let update = |new: &str, status: bool| {
            svm.admission_validate("v1alpha1", None, AdmissionWrite::Update { object: new, old_object: &old, status })
        };
        let e = update(&object(changed), false).unwrap_err();
        assert!(e.message.contains("spec.resource") && e.message.contains("immutable"), "{}", e.message);
        let e = update(&object(good.clone()), true).unwrap_err();
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
            .admission_validate("v1beta1", Some("garden-a"), AdmissionWrite::Create { object: &shoot(None) })
            .is_ok());
        let e = ss
            .admission_validate(
                "v1beta1",
                Some("garden-a"),
                AdmissionWrite::Create { object: &shoot(Some("garden-b")) },
            )
            .unwrap_err();
        assert!(e.message.contains("does not match the namespace sent on the request"), "{}", e.message);
        let e = ss.admission_validate("v1beta1", None, AdmissionWrite::Create { object: &shoot(None) }).unwrap_err();
        assert!(e.message.contains("metadata.namespace"), "{}", e.message);
        // JSON text the typed decode does not take directly is read as a `Value`, as the REST API reads it: a
        // duplicate field (the last one counts), an escaped apiVersion, and a type error found after the escape.
        let text = |t: &'static str| t;
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

    /// metadata.managedFields is kube-apiserver's: admission neither decodes it nor patches it.
    #[test]
    fn admission_leaves_managed_fields_to_the_storing_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = registry(dir.path());
        let managed = json!([{"manager": "m", "operation": "Update", "apiVersion": "migration.k8s.io/v1alpha1",
            "time": "2026-11-21T02:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}}}}]);
        let svm = resource(&r, "StorageVersionMigration");
        let migration = |mf: Value| {
            json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
                   "metadata": {"name": "m1", "managedFields": mf},
                   "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}}})
            .to_string()
        };
        // Entries of any shape are neither warned about nor rejected.
        for mf in [managed.clone(), json!("not a list"), json!([{"bogus": 1}])] {
            let warnings = svm.admission_validate("v1alpha1", None, AdmissionWrite::Create { object: &migration(mf) });
            assert_eq!(warnings.expect("allowed"), Vec::<String>::new());
        }
        // The same patch with and without them, and the patched object keeps them as they were.
        let ss = resource(&r, "StorageState");
        let state = |mf: Option<&Value>| {
            let mut o = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
                "metadata": {"name": "r.bench.io"}, "spec": {"resource": {"group": "bench.io", "resource": "r"}}});
            if let Some(mf) = mf {
                o["metadata"]["managedFields"] = mf.clone();
            }
            o.to_string()
        };
        let sent = state(Some(&managed));
        let with = ss.admission_default("v1alpha1", AdmissionWrite::Create { object: &sent }).expect("defaulted");
        let without =
            ss.admission_default("v1alpha1", AdmissionWrite::Create { object: &state(None) }).expect("defaulted");
        assert!(!with.patch.is_empty());
        assert_eq!(with.patch, without.patch);
        let mut patched: Value = serde_json::from_str(&sent).expect("JSON");
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(with.patch)).expect("a JSON Patch");
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(patched["metadata"]["managedFields"], managed);
        assert_eq!(patched["status"]["persistedStorageVersionHashes"], json!(["Unknown"]));
        // apiVersion and kind as sent are not patched; another apiVersion is a 400, as before.
        assert!(patched["apiVersion"] == "migration.k8s.io/v1alpha1" && patched["kind"] == "StorageState");
        let wrong = sent.replace("migration.k8s.io/v1alpha1\",\"kind", "migration.k8s.io/v9\",\"kind");
        assert_ne!(wrong, sent);
        let e = ss.admission_default("v1alpha1", AdmissionWrite::Create { object: &wrong }).unwrap_err();
        assert!(e.code == 400 && e.message.contains("does not match the expected API version"), "{}", e.message);
        // An apiVersion that is not a string is left as sent (the type check ignores it); an absent one is added.
        let paths = |object: &str| {
            let d = ss.admission_default("v1alpha1", AdmissionWrite::Create { object }).expect("defaulted");
            d.patch.iter().map(|op| format!("{} {}", op["op"], op["path"])).collect::<Vec<_>>()
        };
        let odd = sent.replace("\"migration.k8s.io/v1alpha1\",\"kind", "5,\"kind");
        assert!(odd.contains("\"apiVersion\":5") && !paths(&odd).iter().any(|p| p.contains("/apiVersion")));
        let absent = sent.replace("\"apiVersion\":\"migration.k8s.io/v1alpha1\",", "");
        assert!(!absent.contains("apiVersion") && paths(&absent).contains(&"\"add\" \"/apiVersion\"".to_string()));
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

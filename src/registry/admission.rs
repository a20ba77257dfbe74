//! Admission of objects that another server stores: when our kinds are installed as CRDs (the upstream deployment
//! form), kube-apiserver stores them and asks us to default and validate them (AdmissionReview). These entry points
//! run the very steps [`Resource::create`] and [`Resource::update`] run (`registry::steps`: decode with the kind's
//! defaults, `prepare_for_create`, metadata validation, the kind's validation) and leave out what belongs to the
//! storing server (uid, resourceVersion, timestamps, generation, the `/status` split; mutation does not drop status
//! on create either), which kube-apiserver does itself.
//! `metadata.managedFields` ([`STORING_SERVER_METADATA`](super::strategy::STORING_SERVER_METADATA)) is not decoded:
//! kube-apiserver writes and checks it, and nothing of ours reads it.

use super::default_patch::default_patch;
use super::strategy::{drop_storing_server_metadata, Admit, Subresource};
use super::{unknown_field_warnings, Registry, Resource};
use crate::error::{ApiError, ApiResult};
use serde_json::Value;
use std::sync::Arc;

/// An object as kube-apiserver sent it: its JSON text, or the JSON value read with the review.
#[derive(Debug)]
pub enum Sent<'a> {
    Text(&'a str),
    Value(Value),
}

/// A write to admit, with the object(s) as kube-apiserver sent them.
#[derive(Debug)]
pub enum AdmissionWrite<'a> {
    Create {
        object: Sent<'a>,
    },
    /// `subresource`: the part of the object the update writes.
    Update {
        object: Sent<'a>,
        old_object: Sent<'a>,
        subresource: Subresource,
    },
}

impl<'a> AdmissionWrite<'a> {
    /// A create of the object whose JSON text is `object`.
    pub fn create(object: &'a str) -> Self {
        AdmissionWrite::Create { object: Sent::Text(object) }
    }
    /// An update from `old_object` to `object` (JSON texts).
    pub fn update(object: &'a str, old_object: &'a str, subresource: Subresource) -> Self {
        AdmissionWrite::Update { object: Sent::Text(object), old_object: Sent::Text(old_object), subresource }
    }
}

/// The outcome of defaulting: the JSON Patch that defaults the object as sent.
#[derive(Debug)]
pub struct Defaulted {
    /// The JSON Patch as JSON text; `None` when nothing changes.
    pub patch: Option<Vec<u8>>,
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

impl Resource {
    /// Mutating admission: the kind's defaults, as the aggregated API applies them — decode defaults plus
    /// `prepare_for_create` on create, decode defaults on update (main resource and `/status`). Idempotent: the
    /// patched object defaults to itself, so a reinvocation returns no patch.
    pub fn admission_default(&self, version: &str, write: AdmissionWrite<'_>) -> ApiResult<Defaulted> {
        let (sent, create) = match write {
            AdmissionWrite::Create { object } => (object, true),
            AdmissionWrite::Update { object, .. } => (object, false),
        };
        let sent = self.admitted(sent, version)?;
        let d = self.strategy.defaulted(&sent, create)?;
        let patch = match default_patch(&sent, &d.before, &d.after) {
            Some(p) => Some(serde_json::to_vec(&p).map_err(|e| ApiError::internal(e.to_string()))?),
            None => None,
        };
        Ok(Defaulted { patch, warnings: unknown_field_warnings(&d.unknown_fields) })
    }

    /// Validating admission: the steps of [`Resource::create`] on create, the validation of [`Resource::update`]
    /// on update, on the typed object ([`Strategy::admit`](super::strategy::Strategy::admit)). A denial is the 422
    /// Invalid the aggregated API would answer, listing every invalid field; Ok carries warnings.
    pub fn admission_validate(
        &self,
        version: &str,
        namespace: Option<&str>,
        write: AdmissionWrite<'_>,
    ) -> ApiResult<Vec<String>> {
        let validated = match write {
            AdmissionWrite::Create { object } => {
                let object = self.admitted(object, version)?;
                self.strategy.admit(namespace, Admit { object: &object, old: None })?
            }
            AdmissionWrite::Update { object, old_object, subresource } => {
                let (object, old) = (self.admitted(object, version)?, self.admitted(old_object, version)?);
                self.strategy.admit(namespace, Admit { object: &object, old: Some((&old, subresource)) })?
            }
        };
        if !validated.errors.is_empty() {
            return Err(self.invalid(&validated.name, validated.errors));
        }
        Ok(unknown_field_warnings(&validated.unknown_fields))
    }

    /// An object of a review as admission reads it: JSON holding an object of this kind in `version`, without the
    /// metadata that is the storing server's.
    fn admitted(&self, sent: Sent<'_>, version: &str) -> ApiResult<Value> {
        let mut obj: Value = match sent {
            Sent::Value(v) => v,
            Sent::Text(text) => serde_json::from_str(text)
                .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?,
        };
        self.check_type_meta(&obj, version)?;
        drop_storing_server_metadata(&mut obj);
        Ok(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
    use serde_json::{json, Value};

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

    /// Admission answers as the REST path's decode, defaults, preparation and validation do.
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
        let warnings =
            svm.admission_validate("v1alpha1", None, AdmissionWrite::create(&object(good.clone()))).expect("allowed");
        assert_eq!(warnings, vec!["unknown field \"metadata.bogus\"", "unknown field \"spec.extra\""]);
        // A value of the wrong type: 400 naming the field, as the REST decode says it.
        let e = svm
            .admission_validate("v1alpha1", None, AdmissionWrite::create(&object(json!({"resource": {"group": 5}}))))
            .unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with("error decoding StorageVersionMigration at spec.resource.group: invalid type"),
            "{}",
            e.message
        );
        // Missing fields: 422 listing each.
        let e = svm
            .admission_validate("v1alpha1", None, AdmissionWrite::create(&object(json!({"resource": {}}))))
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
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::create(&raw(&other))).unwrap_err();
        assert!(e.message.contains("does not match the expected API version"), "{}", e.message);
        // Updates validate against the old object: spec.resource is immutable; a /status update checks status.
        let mut changed = good.clone();
        changed["resource"]["version"] = json!("v2");
        let old = object(good.clone());
        let update = |new: &str, subresource: Subresource| {
            svm.admission_validate("v1alpha1", None, AdmissionWrite::update(new, &old, subresource))
        };
        let e = update(&object(changed), Subresource::Main).unwrap_err();
        assert!(e.message.contains("spec.resource") && e.message.contains("immutable"), "{}", e.message);
        let e = update(&object(good.clone()), Subresource::Status).unwrap_err();
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
        assert!(ss.admission_validate("v1beta1", Some("garden-a"), AdmissionWrite::create(&shoot(None))).is_ok());
        let e = ss
            .admission_validate("v1beta1", Some("garden-a"), AdmissionWrite::create(&shoot(Some("garden-b"))))
            .unwrap_err();
        assert!(e.message.contains("does not match the namespace sent on the request"), "{}", e.message);
        let e = ss.admission_validate("v1beta1", None, AdmissionWrite::create(&shoot(None))).unwrap_err();
        assert!(e.message.contains("metadata.namespace"), "{}", e.message);
        // JSON text the typed decode does not take directly is read as a `Value`, as the REST API reads it: a
        // duplicate field (the last one counts), an escaped apiVersion, and a type error found after the escape.
        let text = |t: &'static str| t;
        let dup = r#"{"apiVersion":"migration.k8s.io\/v1alpha1","kind":"StorageVersionMigration","metadata":{"name":"m2"},
            "spec":{"resource":{}},"spec":{"resource":{"group":"","version":"v1","resource":"pods"}}}"#;
        assert_eq!(
            svm.admission_validate("v1alpha1", None, AdmissionWrite::create(text(dup))).unwrap(),
            Vec::<String>::new()
        );
        let bad = r#"{"apiVersion":"migration.k8s.io\/v1alpha1","metadata":{"name":"m3"},"spec":{"resource":{"version":["v1"]}}}"#;
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::create(text(bad))).unwrap_err();
        assert!(
            e.message.starts_with("error decoding StorageVersionMigration at spec.resource.version"),
            "{}",
            e.message
        );
        let wrong = r#"{"apiVersion":"migration.k8s.io\/v2","metadata":{"name":"m4"}}"#;
        let e = svm.admission_validate("v1alpha1", None, AdmissionWrite::create(text(wrong))).unwrap_err();
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
            let warnings = svm.admission_validate("v1alpha1", None, AdmissionWrite::create(&migration(mf)));
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
        let with = ss.admission_default("v1alpha1", AdmissionWrite::create(&sent)).expect("defaulted");
        let without = ss.admission_default("v1alpha1", AdmissionWrite::create(&state(None))).expect("defaulted");
        assert!(with.patch.is_some());
        assert_eq!(with.patch, without.patch);
        let mut patched: Value = serde_json::from_str(&sent).expect("JSON");
        let patch: json_patch::Patch = serde_json::from_slice(&with.patch.unwrap()).expect("a JSON Patch");
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(patched["metadata"]["managedFields"], managed);
        assert_eq!(patched["status"]["persistedStorageVersionHashes"], json!(["Unknown"]));
        // apiVersion and kind as sent are not patched; another apiVersion is a 400, as before.
        assert!(patched["apiVersion"] == "migration.k8s.io/v1alpha1" && patched["kind"] == "StorageState");
        let wrong = sent.replace("migration.k8s.io/v1alpha1\",\"kind", "migration.k8s.io/v9\",\"kind");
        assert_ne!(wrong, sent);
        let e = ss.admission_default("v1alpha1", AdmissionWrite::create(&wrong)).unwrap_err();
        assert!(e.code == 400 && e.message.contains("does not match the expected API version"), "{}", e.message);
        // apiVersion and kind are the storing server's, checked but never patched: not when absent, not when
        // they are not strings (the type check ignores them then).
        let paths = |object: &str| {
            let d = ss.admission_default("v1alpha1", AdmissionWrite::create(object)).expect("defaulted");
            let ops: Vec<Value> = serde_json::from_slice(&d.patch.unwrap_or_default()).unwrap_or_default();
            ops.iter().map(|op| format!("{} {}", op["op"], op["path"])).collect::<Vec<_>>()
        };
        let odd = sent.replace("\"migration.k8s.io/v1alpha1\",\"kind", "5,\"kind");
        let absent = state(None).replace("\"apiVersion\":\"migration.k8s.io/v1alpha1\",\"kind\":\"StorageState\",", "");
        assert!(odd.contains("\"apiVersion\":5") && !absent.contains("apiVersion") && !absent.contains("kind"));
        for object in [odd.as_str(), &absent] {
            assert_eq!(paths(object), ["\"add\" \"/status\""], "{object}");
        }
    }

    /// JSON that is not an object is the client's error (400) in both webhooks, never a 500 or an admitted
    /// object; both webhooks take the same text: what one admits, the other defaults, and what one refuses as
    /// JSON (a number past f64, a lone surrogate: nothing Go's encoder writes), the other refuses alike.
    #[test]
    fn admission_refuses_what_is_not_an_object() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = registry(dir.path());
        let ss = resource(&r, "StorageState");
        for object in ["[]", "[{}]", "\"x\""] {
            let e = ss.admission_default("v1alpha1", AdmissionWrite::create(object)).unwrap_err();
            assert_eq!(e.code, 400, "{object}: {e:?}");
        }
        let head = r#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageState","#;
        let text = |managed: &str, x: &str| {
            format!(
                r#"{head}"metadata":{{"name":"r.g","labels":{{"a":"b","a":"c"}},"managedFields":{managed}}},"spec":{{"resource":{{"group":"g","resource":"r"}}}},"x":{x}}}"#
            )
        };
        let admitted = text("[1]", "\"y\"");
        let write = || AdmissionWrite::create(&admitted);
        assert_eq!(ss.admission_validate("v1alpha1", None, write()).expect("allowed"), ["unknown field \"x\""]);
        let defaulted = ss.admission_default("v1alpha1", write()).expect("defaulted");
        let ops: Vec<Value> = serde_json::from_slice(&defaulted.patch.expect("a patch")).expect("JSON");
        assert_eq!(
            ops,
            [json!({"op": "add", "path": "/status", "value": {"persistedStorageVersionHashes": ["Unknown"]}})]
        );
        for refused in [text("[1e999]", "\"y\""), text("[1]", r#""\ud800""#)] {
            let write = || AdmissionWrite::create(&refused);
            let validated = ss.admission_validate("v1alpha1", None, write()).unwrap_err();
            let defaulted = ss.admission_default("v1alpha1", write()).unwrap_err();
            assert!(
                validated.code == 400 && validated.message.starts_with("error decoding request body"),
                "{validated:?}"
            );
            assert_eq!(format!("{validated:?}"), format!("{defaulted:?}"));
        }
        for object in ["[]", "[{}]", "5"] {
            let e = ss.admission_validate("v1alpha1", None, AdmissionWrite::create(object)).unwrap_err();
            assert!(e.code == 400 && e.message.contains("must be a JSON object"), "{object}: {e:?}");
        }
    }
}

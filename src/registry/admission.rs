//! Admission of objects that another server stores: when our kinds are installed as CRDs (the upstream deployment
//! form), kube-apiserver stores them and asks us to default and validate them (AdmissionReview). These entry points
//! run the very steps [`Resource::create`] and [`Resource::update`] run — decode with the kind's defaults,
//! `prepare_for_create`, metadata validation, the kind's validation — and leave out what belongs to the storing
//! server (uid, resourceVersion, timestamps, generation, dropping status on create), which kube-apiserver does itself.
//! `metadata.managedFields` ([`STORING_SERVER_METADATA`](crate::api::STORING_SERVER_METADATA)) is not even
//! decoded: kube-apiserver writes and checks it, and nothing of ours reads it.

use super::decode::{TextOrNone, TypeMeta};
use super::{Registry, Resource};
use crate::api::meta::validate_object_meta;
use crate::api::{AdmissionPass, PassWrite};
use crate::error::{ApiError, ApiResult};
use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
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

/// A JSON Patch written as JSON text, one operation at a time.
#[derive(Default)]
struct PatchText(Vec<u8>);

impl PatchText {
    fn push(&mut self, op: &str, path: &str, value: &Value) {
        self.0.push(if self.0.is_empty() { b'[' } else { b',' });
        self.0.extend_from_slice(b"{\"op\":\"");
        self.0.extend_from_slice(op.as_bytes());
        self.0.extend_from_slice(b"\",\"path\":");
        json_string(&mut self.0, path);
        self.0.extend_from_slice(b",\"value\":");
        // Writing a value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.0, value);
        self.0.push(b'}');
    }
    fn finish(mut self) -> Option<Vec<u8>> {
        (!self.0.is_empty()).then(|| {
            self.0.push(b']');
            self.0
        })
    }
}

/// Appends `s` to `out` as a JSON string.
fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(out, s);
}

/// The JSON Patch that adds to `sent` (JSON text) what defaulting added in `defaulted`: values where `sent`
/// has none. What the typed round trip merely normalizes (unknown fields dropped, empty fields omitted, number
/// forms, key order, white space) is not a default and is left as sent — kube-apiserver prunes and normalizes CRD
/// objects itself, and a patch must not fight it (reinvocation would loop). `None` when nothing is to be added.
///
/// `sent` is walked in one read, in step with `defaulted` (which is small: without
/// [`STORING_SERVER_METADATA`](crate::api::STORING_SERVER_METADATA)); what `defaulted` does not have is skipped
/// unread, and no value of it is built. When an object has a key that defaulting has written twice (of which the
/// last counts when the object is read), the walk stops and the text is read as a `Value`, which is walked the same
/// way. A read error is the client's: text that the typed decode accepts may still hold what a full read refuses
/// (a number out of range, a lone surrogate in a key) where that decode skipped it.
fn default_patch(sent: &str, defaulted: &Value) -> serde_json::Result<Option<Vec<u8>>> {
    let mut walk = Walk::default();
    let mut de = serde_json::Deserializer::from_str(sent);
    let read = Against::root(&mut walk, defaulted).deserialize(&mut de);
    match read.and_then(|()| de.end()) {
        Ok(()) => return Ok(walk.patch.finish()),
        Err(e) if !walk.duplicate_key => return Err(e),
        Err(_) => {}
    }
    let sent: Value = serde_json::from_str(sent)?;
    let mut walk = Walk::default();
    Against::root(&mut walk, defaulted).deserialize(&sent)?;
    Ok(walk.patch.finish())
}

/// Where [`default_patch`] is: the JSON pointer of the value read, and the operations so far.
#[derive(Default)]
struct Walk {
    path: String,
    patch: PatchText,
    /// The walk stopped at an object with a key, one that defaulting has, written twice.
    duplicate_key: bool,
}

/// The sent value at `walk.path`, read against the defaulted one there (`None`: defaulting has nothing there, so
/// the value is skipped).
struct Against<'w, 'd> {
    walk: &'w mut Walk,
    defaulted: Option<&'d Value>,
    /// Whether an unset value is replaced by the defaulted one: a field's value is; the whole object and the items
    /// of a list are not (an empty item object still gets the fields defaulting adds).
    fillable: bool,
}

impl<'w, 'd> Against<'w, 'd> {
    /// The whole object as sent.
    fn root(walk: &'w mut Walk, defaulted: &'d Value) -> Self {
        Against { walk, defaulted: Some(defaulted), fillable: false }
    }
    /// The sent value is unset: the defaulted one, if set, replaces it.
    fn fill<E>(self) -> Result<(), E> {
        if let Some(d) = self.defaulted.filter(|d| self.fillable && !unset(Some(d))) {
            self.walk.patch.push("replace", &self.walk.path, d);
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Against<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.defaulted {
            Some(_) => d.deserialize_any(self),
            None => d.deserialize_ignored_any(IgnoredAny).map(|_| ()),
        }
    }
}

impl<'de> Visitor<'de> for Against<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    // Numbers and booleans are set: nothing to fill.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        match v.is_empty() {
            true => self.fill(),
            false => Ok(()),
        }
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.fill()
    }
    fn visit_none<E>(self) -> Result<(), E> {
        self.fill()
    }
    /// A list of as many items as the defaulted one is walked item by item; one of another length is left alone,
    /// and an empty one is filled.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let items = self.defaulted.and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        let mark = self.walk.patch.0.len();
        let walk = self.walk;
        let mut n = 0;
        loop {
            let len = walk.path.len();
            let _ = write!(walk.path, "/{n}"); // Writing to a String cannot fail.
            let item = Against { walk: &mut *walk, defaulted: items.get(n), fillable: false };
            let more = seq.next_element_seed(item)?;
            walk.path.truncate(len);
            if more.is_none() {
                break;
            }
            n += 1;
        }
        if n == 0 {
            return Against { walk, ..self }.fill();
        }
        if n != items.len() {
            walk.patch.0.truncate(mark);
        }
        Ok(())
    }
    /// An object's keys that defaulting also has are walked; those it has alone are added.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut entries: Vec<(&str, &Value)> = match self.defaulted.and_then(Value::as_object) {
            Some(d) => d.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            None => Vec::new(),
        };
        entries.sort_unstable_by_key(|e| e.0);
        let walk = self.walk;
        let mut seen = vec![false; entries.len()];
        let mut n = 0;
        while let Some(key) = map.next_key_seed(TextOrNone)? {
            n += 1;
            let key = key.unwrap_or_default();
            let Ok(i) = entries.binary_search_by(|(k, _)| (*k).cmp(&*key)) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if std::mem::replace(&mut seen[i], true) {
                walk.duplicate_key = true;
                return Err(A::Error::custom(format_args!("duplicate key {key:?}")));
            }
            let len = walk.path.len();
            walk.path.push('/');
            push_pointer_token(&mut walk.path, &key);
            map.next_value_seed(Against { walk: &mut *walk, defaulted: Some(entries[i].1), fillable: true })?;
            walk.path.truncate(len);
        }
        // An empty object that is a field's value is unset, and filled as a whole.
        if n == 0 && self.fillable {
            return Against { walk, ..self }.fill();
        }
        for ((key, d), seen) in entries.iter().zip(seen) {
            if !seen && !unset(Some(d)) {
                let len = walk.path.len();
                walk.path.push('/');
                push_pointer_token(&mut walk.path, key);
                walk.patch.push("add", &walk.path, d);
                walk.path.truncate(len);
            }
        }
        Ok(())
    }
}

/// Appends `key` to a JSON pointer, escaped (RFC 6901: `~` as `~0`, `/` as `~1`).
fn push_pointer_token(path: &mut String, key: &str) {
    if !key.contains(['~', '/']) {
        return path.push_str(key);
    }
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
        let (mut defaulted, unknown_fields) =
            self.strategy.admission_defaults(sent, create, &self.type_check(version))?;
        self.set_type_meta(&mut defaulted, version);
        let patch = default_patch(sent, &defaulted)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
        let warnings = unknown_fields.into_iter().map(|f| format!("unknown field {f:?}")).collect();
        Ok(Defaulted { patch, warnings })
    }

    /// The check of an object's apiVersion and kind against this kind in `version`.
    fn type_check<'s>(&'s self, version: &'s str) -> impl Fn(&TypeMeta<'_>) -> ApiResult<()> + 's {
        move |t| self.check_type_strs(t.api_version.as_deref(), t.kind.as_deref(), version)
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
        let AdmissionPass { mut metadata, errors, unknown_fields, mut old_namespace } =
            self.strategy.admission_pass(object, pass, &self.type_check(version))?;
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
        let e = ss.admission_default("v1alpha1", AdmissionWrite::Create { object: &wrong }).unwrap_err();
        assert!(e.code == 400 && e.message.contains("does not match the expected API version"), "{}", e.message);
        // An apiVersion that is not a string is left as sent (the type check ignores it); an absent one is added.
        let paths = |object: &str| {
            let d = ss.admission_default("v1alpha1", AdmissionWrite::Create { object }).expect("defaulted");
            let ops: Vec<Value> = serde_json::from_slice(&d.patch.unwrap_or_default()).unwrap_or_default();
            ops.iter().map(|op| format!("{} {}", op["op"], op["path"])).collect::<Vec<_>>()
        };
        let odd = sent.replace("\"migration.k8s.io/v1alpha1\",\"kind", "5,\"kind");
        assert!(odd.contains("\"apiVersion\":5") && !paths(&odd).iter().any(|p| p.contains("/apiVersion")));
        let absent = sent.replace("\"apiVersion\":\"migration.k8s.io/v1alpha1\",", "");
        assert!(!absent.contains("apiVersion") && paths(&absent).contains(&"\"add\" \"/apiVersion\"".to_string()));
    }

    /// What the one-pass decode skips unread and a full read refuses, and JSON that is not an object, are the
    /// client's errors (400) in both webhooks, never a 500 or an admitted object.
    #[test]
    fn admission_refuses_what_a_full_read_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = registry(dir.path());
        let ss = resource(&r, "StorageState");
        let head = r#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageState","#;
        let out_of_range = format!(
            r#"{head}"metadata":{{"name":"r.g","labels":{{"a":"b","a":"c"}},"managedFields":[1e999]}},"spec":{{}}}}"#
        );
        let surrogate = r#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":{"\ud800":1},"metadata":{"name":"r.g"}}"#;
        for object in [out_of_range.as_str(), surrogate, "[]", "[{}]", "\"x\""] {
            let e = ss.admission_default("v1alpha1", AdmissionWrite::Create { object }).unwrap_err();
            assert_eq!(e.code, 400, "{object}: {e:?}");
        }
        for object in ["[]", "[{}]", "5"] {
            let e = ss.admission_validate("v1alpha1", None, AdmissionWrite::Create { object }).unwrap_err();
            assert!(e.code == 400 && e.message.contains("must be a JSON object"), "{object}: {e:?}");
        }
    }

    /// The operations of `default_patch` on two JSON texts, as values.
    fn ops(sent: &str, defaulted: &str) -> Vec<Value> {
        let patch = default_patch(sent, &serde_json::from_str(defaulted).expect("JSON")).expect("JSON");
        patch.map(|p| serde_json::from_slice(&p).expect("a JSON array")).unwrap_or_default()
    }

    #[test]
    fn defaults_fill_only_what_is_unset() {
        let sent = json!({"a": "", "b": [], "c": {"x": 1, "keep": "me"}, "d": null, "e": [{"k": ""}], "f": "x"});
        let defaulted = json!({"a": "A", "b": ["B"], "c": {"x": 2, "y": 3}, "d": {}, "e": [{"k": "K"}], "f": "y"});
        let operations = ops(&sent.to_string(), &defaulted.to_string());
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(operations)).expect("a JSON Patch");
        let mut patched = sent.clone();
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(
            patched,
            json!({"a": "A", "b": ["B"], "c": {"x": 1, "y": 3, "keep": "me"}, "d": null, "e": [{"k": "K"}], "f": "x"})
        );
        // Keys are escaped in the pointers; an object that needs nothing gets no operation.
        assert_eq!(
            ops(r#"{"a/b~c": {}}"#, r#"{"a/b~c":{"z":1}}"#),
            vec![json!({"op": "replace", "path": "/a~1b~0c", "value": {"z": 1}})]
        );
        assert_eq!(ops(r#"{"a": 1}"#, r#"{"a":2,"b":""}"#), Vec::<Value>::new());
        // The sent text as a hand-made review may write it: white space, escaped keys, keys in another order, a
        // list of other length (left alone); of duplicate keys the last counts.
        let sent = "{ \"l\" : [ ], \"s\":{\"\\u0061\":\"\" ,\"b\": {\n} }, \"n\":[1,2], \"d\":{\"v\":1}, \"d\":{ } }";
        let defaulted = r#"{"d":{"v":2},"l":[1],"n":[1],"s":{"b":{"c":true},"a":"A"}}"#;
        let mut paths: Vec<String> =
            ops(sent, defaulted).iter().map(|op| format!("{} {} {}", op["op"], op["path"], op["value"])).collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                r#""replace" "/d" {"v":2}"#,
                r#""replace" "/l" [1]"#,
                r#""replace" "/s/a" "A""#,
                r#""replace" "/s/b" {"c":true}"#
            ]
        );
        // The patch applies to the text as sent (read as a whole, the last duplicate counting).
        let mut patched: Value = serde_json::from_str(sent).expect("JSON");
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops(sent, defaulted))).expect("a patch");
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(patched, json!({"l": [1], "s": {"a": "A", "b": {"c": true}}, "n": [1, 2], "d": {"v": 2}}));
        // Operations on the items of a list of another length are undone; an empty root object gets additions
        // (it is not replaced); a duplicate key deep down counts as at the top.
        assert_eq!(ops(r#"{"e":[{"k":""},{"k":""}],"f":[]}"#, r#"{"e":[{"k":"K"}],"f":[]}"#), Vec::<Value>::new());
        assert_eq!(ops(" { } ", r#"{"a":"A","b":{}}"#), vec![json!({"op": "add", "path": "/a", "value": "A"})]);
        // Unset items of a list are not replaced (that would only normalize them); an empty item object gets the
        // fields defaulting adds.
        assert_eq!(
            ops(r#"{"l":["",null,[],{}]}"#, r#"{"l":["A",{"x":1},[1],{"y":2,"z":""}]}"#),
            vec![json!({"op": "add", "path": "/l/3/y", "value": 2})]
        );
        assert_eq!(
            ops(r#"{"x":[{"y":{"z":1},"y":{"z":""}}]}"#, r#"{"x":[{"y":{"z":"Z"}}]}"#),
            vec![json!({"op": "replace", "path": "/x/0/y/z", "value": "Z"})]
        );
    }
}

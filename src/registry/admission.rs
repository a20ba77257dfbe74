//! Admission of objects that another server stores: when our kinds are installed as CRDs (the upstream deployment
//! form), kube-apiserver stores them and asks us to default and validate them (AdmissionReview). These entry points
//! run the very steps [`Resource::create`] and [`Resource::update`] run — decode with the kind's defaults,
//! `prepare_for_create`, metadata validation, the kind's validation — and leave out what belongs to the storing
//! server (uid, resourceVersion, timestamps, generation, dropping status on create), which kube-apiserver does itself.

use super::{meta_str, FieldValidation, Registry, Resource};
use crate::error::ApiResult;
use serde_json::Value;
use std::sync::Arc;

/// A write to admit, with the object(s) as kube-apiserver sent them.
#[derive(Clone, Copy, Debug)]
pub enum AdmissionWrite<'a> {
    Create {
        object: &'a Value,
    },
    /// `status`: the write is to the `/status` subresource.
    Update {
        object: &'a Value,
        old_object: &'a Value,
        status: bool,
    },
}

/// The outcome of defaulting: the JSON patch that defaults the object as sent (empty when nothing changes).
#[derive(Debug)]
pub struct Defaulted {
    pub patch: json_patch::Patch,
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

/// `sent` plus what defaulting added in `defaulted`: values where `sent` has none. What the typed round trip merely
/// normalizes (unknown fields dropped, empty fields omitted, number forms) is not a default and is left as sent —
/// kube-apiserver prunes and normalizes CRD objects itself, and a patch must not fight it (reinvocation would loop).
fn with_defaults(sent: &Value, defaulted: &Value) -> Value {
    match (sent, defaulted) {
        (Value::Object(s), Value::Object(d)) => {
            let mut out = s.clone();
            for (k, dv) in d {
                let sv = s.get(k);
                if unset(sv) {
                    if !unset(Some(dv)) {
                        out.insert(k.clone(), dv.clone());
                    }
                } else if let Some(sv) = sv {
                    out.insert(k.clone(), with_defaults(sv, dv));
                }
            }
            Value::Object(out)
        }
        (Value::Array(s), Value::Array(d)) if s.len() == d.len() => {
            Value::Array(s.iter().zip(d).map(|(s, d)| with_defaults(s, d)).collect())
        }
        _ => sent.clone(),
    }
}

impl Resource {
    /// Mutating admission: the kind's defaults, as the aggregated API applies them — decode defaults plus
    /// `prepare_for_create` on create, decode defaults on update (main resource and `/status`). Idempotent: the
    /// patched object defaults to itself, so a reinvocation returns no patch.
    pub fn admission_default(&self, version: &str, write: AdmissionWrite<'_>) -> ApiResult<Defaulted> {
        let sent = match write {
            AdmissionWrite::Create { object } | AdmissionWrite::Update { object, .. } => object,
        };
        let (mut defaulted, warnings) = self.decode_body(sent.clone(), &[], version, FieldValidation::Warn)?;
        if let AdmissionWrite::Create { .. } = write {
            self.strategy.prepare_for_create(&mut defaulted)?;
        }
        let patch = json_patch::diff(sent, &with_defaults(sent, &defaulted));
        Ok(Defaulted { patch, warnings })
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
        match write {
            AdmissionWrite::Create { object } => {
                let (mut obj, warnings) = self.decode_body(object.clone(), &[], version, FieldValidation::Warn)?;
                self.check_namespace(&mut obj, namespace)?;
                if self.info().has_status {
                    if let Some(o) = obj.as_object_mut() {
                        o.remove("status");
                    }
                }
                self.strategy.prepare_for_create(&mut obj)?;
                let mut errs = self.validate_meta(&obj);
                errs.extend(self.strategy.validate(&obj)?);
                if !errs.is_empty() {
                    return Err(self.invalid(meta_str(&obj, "name"), errs));
                }
                Ok(warnings)
            }
            AdmissionWrite::Update { object, old_object, status } => {
                let (mut new, warnings) = self.decode_body(object.clone(), &[], version, FieldValidation::Warn)?;
                let (mut old, _) = self.decode_body(old_object.clone(), &[], version, FieldValidation::Ignore)?;
                self.check_namespace(&mut new, namespace)?;
                self.check_namespace(&mut old, namespace)?;
                let mut errs = self.validate_meta(&new);
                errs.extend(self.strategy.validate_update(&new, &old, status)?);
                if !errs.is_empty() {
                    return Err(self.invalid(meta_str(&new, "name"), errs));
                }
                Ok(warnings)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_only_what_is_unset() {
        let sent = json!({"a": "", "b": [], "c": {"x": 1, "keep": "me"}, "d": null, "e": [{"k": ""}], "f": "x"});
        let defaulted = json!({"a": "A", "b": ["B"], "c": {"x": 2, "y": 3}, "d": {}, "e": [{"k": "K"}], "f": "y"});
        assert_eq!(
            with_defaults(&sent, &defaulted),
            json!({"a": "A", "b": ["B"], "c": {"x": 1, "y": 3, "keep": "me"}, "d": null, "e": [{"k": "K"}], "f": "x"})
        );
    }
}

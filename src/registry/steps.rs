//! The steps every write of a kind runs on its typed object, REST writes and admission alike: k8s.io/apiserver's
//! `BeforeCreate` and `BeforeUpdate` (prepare, default, validate). What differs between the two callers is only
//! what belongs to the storing server (uid, timestamps, generation, the `/status` split), which the REST path adds
//! and admission leaves to kube-apiserver.

use super::object_meta::validate_object_meta;
use super::strategy::{take_status, Kind, KindStatus, Subresource};
use crate::error::FieldError;
use crate::validation::NameRule;

/// The first half of `BeforeCreate`, on an object decoded with its defaults: status reset (a kind with `/status`
/// takes none from a create), the kind's create preparation, and its defaults again for what that set.
pub(super) fn prepare_create<K: Kind>(obj: &mut K) {
    reset_status(obj);
    default_create(obj);
}

/// A kind with `/status` takes no status from a create.
pub(super) fn reset_status<K: Kind>(obj: &mut K) {
    if K::Status::SUBRESOURCE {
        take_status(obj);
    }
}

/// Create preparation and the defaults again for what it set: what mutating admission adds on create. Status is
/// not reset there: a patch only adds, and dropping status is the storing server's.
pub(super) fn default_create<K: Kind>(obj: &mut K) {
    obj.prepare_for_create();
    obj.defaults();
}

/// The second half of `BeforeCreate`: the kind's validation with the metadata checks its strategy makes
/// (`ValidateObjectMeta` with the kind's name rule, [`Kind::validate_with_meta`]). A kind whose strategy makes none
/// ([`NameRule::PathSegment`], core/v1 Event) gets only the generic registry's check, with path-segment names, and
/// only once its own validation passed, as `BeforeCreate` runs it after the strategy's.
pub(super) fn validate_create<K: Kind>(obj: &K) -> Vec<FieldError> {
    let info = K::info();
    if info.name_rule == NameRule::PathSegment {
        let errs = obj.validate();
        if !errs.is_empty() {
            return errs;
        }
        return validate_object_meta(obj.meta(), info.namespaced, NameRule::PathSegment);
    }
    obj.validate_with_meta(validate_meta(obj))
}

/// The validation of `BeforeUpdate`: metadata, no finalizer added to an object being deleted, then the kind's
/// update validation of what `subresource` writes.
pub(super) fn validate_update<K: Kind>(new: &K, old: &K, subresource: Subresource) -> Vec<FieldError> {
    let mut errs = validate_object_meta(new.meta(), K::info().namespaced, K::UPDATE_NAME_RULE);
    if old.meta().deletion_timestamp.is_some() {
        let before = old.meta().finalizers.as_deref().unwrap_or_default();
        let added: Vec<&String> = new.meta().finalizers.iter().flatten().filter(|f| !before.contains(f)).collect();
        if !added.is_empty() {
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
    }
    errs.extend(match subresource {
        Subresource::Main => new.validate_update(old),
        Subresource::Status => new.validate_status_update(old),
    });
    errs
}

/// ValidateObjectMeta with the kind's scope and name syntax (on create).
pub(super) fn validate_meta<K: Kind>(obj: &K) -> Vec<FieldError> {
    validate_object_meta(obj.meta(), K::info().namespaced, K::info().name_rule)
}

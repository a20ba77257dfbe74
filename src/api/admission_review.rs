//! The AdmissionReview (admission.k8s.io/v1) that kube-apiserver sends to webhooks, as our webhooks read it: the
//! fields of its request we act on, with strings borrowed from the body, and its objects held as the caller needs
//! them. The HTTP side ([`crate::server::admission`]) parses and answers reviews; the kinds' strategies read a
//! review of their own kind in one pass ([`Strategy::read_review`](super::Strategy::read_review)), decoding its
//! objects straight into their types.

use crate::registry::decode::{starts_object, text, Text};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::any::Any;

#[derive(Deserialize, Debug, Default)]
pub struct GroupVersionKind<'a> {
    #[serde(default, borrow, deserialize_with = "text")]
    pub group: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub version: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub kind: Text<'a>,
}

#[derive(Deserialize, Debug, Default)]
pub struct GroupVersionResource<'a> {
    #[serde(default, borrow, deserialize_with = "text")]
    pub group: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub version: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub resource: Text<'a>,
}

/// The fields of `AdmissionRequest` we act on, with strings borrowed from the body ([`Text`]; absent or null
/// strings are empty). `O` is how its objects are held: as JSON text (`&RawValue`), as a `Value` (the CSI
/// webhooks), decoded into their kind's type while the review is read, or as an [`AdmissionObject`].
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "'de: 'a, O: Deserialize<'de>"))]
pub struct AdmissionRequest<'a, O = Value> {
    #[serde(default, borrow, deserialize_with = "text")]
    pub uid: Text<'a>,
    #[serde(default, borrow)]
    pub kind: Option<GroupVersionKind<'a>>,
    #[serde(default, borrow)]
    pub resource: Option<GroupVersionResource<'a>>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub sub_resource: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub name: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub namespace: Text<'a>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub operation: Text<'a>,
    #[serde(default)]
    pub object: Option<O>,
    #[serde(default)]
    pub old_object: Option<O>,
    /// Read for the log only: without side effects a dry run is answered like any other review.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl<'a, O> AdmissionRequest<'a, O> {
    /// The same request with its objects held as `f` makes them (told whether it is the oldObject); `None` when
    /// `f` refuses one.
    pub fn try_map_objects<P>(self, mut f: impl FnMut(O, bool) -> Option<P>) -> Option<AdmissionRequest<'a, P>> {
        let object = match self.object {
            Some(o) => Some(f(o, false)?),
            None => None,
        };
        let old_object = match self.old_object {
            Some(o) => Some(f(o, true)?),
            None => None,
        };
        Some(AdmissionRequest {
            uid: self.uid,
            kind: self.kind,
            resource: self.resource,
            sub_resource: self.sub_resource,
            name: self.name,
            namespace: self.namespace,
            operation: self.operation,
            object,
            old_object,
            dry_run: self.dry_run,
        })
    }
}

/// An AdmissionReview: its type and its request, decoded as `R` (the whole request, or its raw JSON to decode it
/// step by step).
#[derive(Deserialize)]
#[serde(bound(deserialize = "R: Deserialize<'de>"))]
pub struct AdmissionReview<R> {
    #[serde(rename = "apiVersion", default)]
    pub api_version: Option<Value>,
    #[serde(default)]
    pub kind: Option<Value>,
    #[serde(default)]
    pub request: Option<R>,
}

/// An object of a review, however it is held.
pub trait ReviewObject {
    fn is_json_object(&self) -> bool;
}

impl ReviewObject for Value {
    fn is_json_object(&self) -> bool {
        self.is_object()
    }
}

impl ReviewObject for &RawValue {
    fn is_json_object(&self) -> bool {
        starts_object(self.get().as_bytes())
    }
}

/// An object of a review of one of our kinds, as admission takes it: its text, and the object decoded into its
/// kind's type when that was done while the review was read ([`Strategy::read_review`](super::Strategy::read_review):
/// the typed object and the fields it did not know, after the check of its apiVersion and kind).
pub struct AdmissionObject<'a> {
    pub typed: Option<Box<dyn Any + Send>>,
    pub text: ObjectText<'a>,
}

impl<'a> AdmissionObject<'a> {
    /// An object given as its JSON text.
    pub fn sent(text: &'a str) -> Self {
        AdmissionObject { typed: None, text: ObjectText::Sent(text) }
    }
}

impl std::fmt::Debug for AdmissionObject<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionObject").field("decoded", &self.typed.is_some()).field("text", &self.text).finish()
    }
}

impl ReviewObject for AdmissionObject<'_> {
    fn is_json_object(&self) -> bool {
        // Only objects decode into a kind's type.
        self.typed.is_some() || matches!(self.text, ObjectText::Sent(t) if starts_object(t.as_bytes()))
    }
}

/// Where the JSON text of a review's object is.
#[derive(Clone, Copy, Debug)]
pub enum ObjectText<'a> {
    /// As sent.
    Sent(&'a str),
    /// In the review `review` (its object, or its oldObject when `old`), to be found again when something needs it.
    InReview { review: &'a str, old: bool },
}

impl<'a> ObjectText<'a> {
    /// The object's JSON text as sent.
    pub fn get(self) -> Option<&'a str> {
        match self {
            ObjectText::Sent(t) => Some(t),
            ObjectText::InReview { review, old } => {
                let r: AdmissionReview<AdmissionRequest<'a, &'a RawValue>> = serde_json::from_str(review).ok()?;
                let req = r.request?;
                let object = if old { req.old_object } else { req.object };
                object.map(RawValue::get)
            }
        }
    }
}

/// A hint of the kind a review is about: the first `"kind":{...}` object in its text, which is `request.kind`
/// in reviews as kube-apiserver writes them (uid, kind and resource first, objects after), read without parsing
/// the rest of the review. Only a hint: a caller that reads the review with it must check that `request.kind` is
/// what the hint said. `None` when there is no such object, or it is not plain strings.
pub fn kind_hint(review: &str) -> Option<KindHint<'_>> {
    const KEY: &str = "\"kind\":{";
    let at = review.find(KEY)? + KEY.len() - 1;
    let mut de = serde_json::Deserializer::from_str(&review[at..]);
    KindHint::deserialize(&mut de).ok().filter(|k| !k.kind.is_empty())
}

/// What [`kind_hint`] reads: a group, version and kind without escapes.
#[derive(Deserialize, Debug, PartialEq, Eq)]
pub struct KindHint<'a> {
    #[serde(default)]
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
}

impl KindHint<'_> {
    /// Whether a request is about the kind of this hint.
    pub fn is_of<O>(&self, req: &AdmissionRequest<'_, O>) -> bool {
        req.kind.as_ref().is_some_and(|k| (&*k.group, &*k.version, &*k.kind) == (self.group, self.version, self.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_hint_is_the_first_kind_object() {
        let r = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"dryRun":false,"kind":{"group":"g","version":"v1","kind":"K"},"object":{}}}"#;
        assert_eq!(kind_hint(r), Some(KindHint { group: "g", version: "v1", kind: "K" }));
        // The core group is "" or absent; a kind object with escapes or without a kind is no hint.
        assert_eq!(
            kind_hint(r#"{"kind":{"version":"v1","kind":"Pod"}}"#),
            Some(KindHint { group: "", version: "v1", kind: "Pod" })
        );
        assert_eq!(kind_hint(r#"{"kind":{"group":"g","version":"v1","kind":"K\u0031"}}"#), None);
        assert_eq!(kind_hint(r#"{"kind":{"group":"g","version":"v1"}}"#), None);
        assert_eq!(kind_hint(r#"{"kind":"AdmissionReview"}"#), None);
    }
}

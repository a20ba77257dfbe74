//! AdmissionReviews as kube-apiserver sends them to the webhooks.

use serde_json::{json, Value};

/// What an AdmissionReview's request is about: the kind and resource written, by whom and how.
pub struct ReviewOf<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
    pub resource: &'a str,
    pub operation: &'a str,
    pub username: &'a str,
    pub groups: &'a [&'a str],
}

/// The administrator kubeconfig's user and groups, as kube-apiserver names them in `userInfo`.
pub const ADMIN_USERNAME: &str = "kubernetes-admin";
pub const ADMIN_GROUPS: &[&str] = &["system:masters", "system:authenticated"];

/// An AdmissionReview (admission.k8s.io/v1) whose request writes `object` over `old`, kind and resource given as
/// the request's (`requestKind`, `requestResource`), not dry-run; a caller adds name, namespace, options and
/// subresource as kube-apiserver would for its case.
pub fn admission_review(uid: &str, of: &ReviewOf, object: Option<&Value>, old: Option<&Value>) -> Value {
    let gvk = json!({"group": of.group, "version": of.version, "kind": of.kind});
    let gvr = json!({"group": of.group, "version": of.version, "resource": of.resource});
    let request = json!({
        "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "operation": of.operation,
        "userInfo": {"username": of.username, "groups": of.groups},
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": false,
    });
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// What a webhook answers to an AdmissionReview.
pub trait ReviewAnswer {
    /// A 200 AdmissionReview answer to the request `uid`: checks what kube-apiserver checks, returns `response`.
    fn review(&self, uid: &str) -> Value;
}

impl ReviewAnswer for super::requests::Resp {
    fn review(&self, uid: &str) -> Value {
        assert_eq!(self.status, 200, "{}", self.text());
        let v = self.json();
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{v}");
        assert_eq!(v["kind"], "AdmissionReview", "{v}");
        let r = v["response"].clone();
        assert_eq!(r["uid"], uid, "uid not echoed: {v}");
        assert!(r["allowed"].is_boolean(), "{v}");
        assert_eq!(r.get("patch").is_some(), r.get("patchType").is_some(), "patch and patchType go together: {v}");
        r
    }
}

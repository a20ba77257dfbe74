//! The answers of the self reviews ([`crate::api::self_review`]), which the registry cannot give: they are about
//! the request's user (the impersonated one when the request impersonates) and ask the authorizer, both of which
//! only the HTTP layer has. The registry has decoded and validated the review; this fills in its answer.

use super::AppState;
use crate::auth::authn::UserInfo;
use crate::auth::authz::{Decision, RequestAttributes, ResourceAttributes};
use crate::error::{ApiError, ApiResult};
use crate::registry::strategy::KindInfo;
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReviewSpec;
use serde_json::{json, Map, Value};

/// Completes `object`, the registry's answer to the create of a `info` kind, when it is a self review.
pub(super) async fn answer(
    st: &AppState,
    user: Option<&UserInfo>,
    info: &KindInfo,
    object: &mut Value,
) -> ApiResult<()> {
    let review = matches!(
        (info.group, info.kind),
        ("authorization.k8s.io", "SelfSubjectAccessReview") | ("authentication.k8s.io", "SelfSubjectReview")
    );
    if !review {
        return Ok(());
    }
    // Upstream's answer to a request without a user (none reaches here: authentication comes first).
    let user = user.ok_or_else(|| ApiError::bad_request("no user present on request"))?;
    match info.kind {
        "SelfSubjectAccessReview" => access_review(st, user, object).await,
        _ => {
            *object = subject_review(user, object);
            Ok(())
        }
    }
}

/// The attributes a SelfSubjectAccessReview asks about, as upstream's `ResourceAttributesFrom` and
/// `NonResourceAttributesFrom` make them (validation made sure there is exactly one of the two).
fn attributes(spec: SelfSubjectAccessReviewSpec) -> RequestAttributes {
    let s = |v: Option<String>| v.unwrap_or_default();
    match (spec.resource_attributes, spec.non_resource_attributes) {
        (Some(r), _) => RequestAttributes {
            verb: s(r.verb),
            path: String::new(),
            resource: Some(ResourceAttributes {
                namespace: s(r.namespace),
                group: s(r.group),
                version: s(r.version),
                resource: s(r.resource),
                subresource: s(r.subresource),
                name: s(r.name),
            }),
        },
        (None, n) => {
            let n = n.unwrap_or_default();
            RequestAttributes { verb: s(n.verb), path: s(n.path), resource: None }
        }
    }
}

/// `status.allowed`, `reason` and `evaluationError` from this server's authorizer. `denied` stays false: the
/// authorizers of a standalone server (system:masters only, or AlwaysAllow) never deny outright, they have no
/// opinion, as RBAC has none.
async fn access_review(st: &AppState, user: &UserInfo, object: &mut Value) -> ApiResult<()> {
    let spec: SelfSubjectAccessReviewSpec = serde_json::from_value(object["spec"].clone())
        .map_err(|e| ApiError::internal(format!("a validated SelfSubjectAccessReview that does not decode: {e}")))?;
    let attrs = attributes(spec);
    let mut status = Map::new();
    let (allowed, reason, error) = match st.authz.authorize(user, &attrs).await {
        Ok(Decision::Allow) => (true, String::new(), String::new()),
        Ok(Decision::Deny { reason }) => (false, reason, String::new()),
        Err(e) => (false, String::new(), e.to_string()),
    };
    status.insert("allowed".into(), Value::Bool(allowed));
    if !reason.is_empty() {
        status.insert("reason".into(), Value::String(reason));
    }
    if !error.is_empty() {
        status.insert("evaluationError".into(), Value::String(error));
    }
    object["status"] = Value::Object(status);
    Ok(())
}

/// Upstream's answer: a new review, whatever was sent, created now, with the user's name, UID, groups and extra
/// (each left out when empty, as Go's JSON leaves them).
fn subject_review(user: &UserInfo, request: &Value) -> Value {
    let mut info = Map::new();
    if !user.name.is_empty() {
        info.insert("username".into(), json!(user.name));
    }
    if !user.uid.is_empty() {
        info.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        info.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        info.insert("extra".into(), json!(user.extra));
    }
    json!({
        "apiVersion": request["apiVersion"],
        "kind": request["kind"],
        "metadata": {"creationTimestamp": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()},
        "status": {"userInfo": info},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::authn::{Authenticator, TokenAuthenticator};
    use crate::registry::Registry;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
    use std::sync::Arc;

    #[derive(Debug)]
    struct NoTokens;

    #[async_trait::async_trait]
    impl TokenAuthenticator for NoTokens {
        async fn authenticate_token(&self, _token: &str) -> crate::auth::Result<Option<UserInfo>> {
            Ok(None)
        }
    }

    /// Standalone, the self reviews are served and discovered; behind the aggregator (a cluster authenticates for
    /// us) their groups are kube-apiserver's, and this server neither serves nor discovers them.
    #[test]
    fn served_standalone_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("store");
        let kinds = crate::api::kinds(&Default::default()).expect("kinds");
        let registry = Arc::new(Registry::new(storage, kinds, Default::default()));
        let cluster = Authenticator::new().with_token_review(Arc::new(NoTokens));
        for (authn, standalone) in [(Authenticator::new(), true), (cluster, false)] {
            let metrics = Arc::new(super::super::metrics::Metrics::new());
            let st = AppState::new(registry.clone(), Arc::new(authn), metrics, std::time::Duration::from_secs(1));
            for (group, resource) in
                [("authorization.k8s.io", "selfsubjectaccessreviews"), ("authentication.k8s.io", "selfsubjectreviews")]
            {
                assert_eq!(st.registry.resource(group, "v1", resource).is_some(), standalone, "{group}");
                assert_eq!(st.discovery.groups.contains_key(group), standalone, "{group}");
            }
        }
    }

    #[test]
    fn a_subject_review_is_the_user() {
        let user = UserInfo {
            name: "alice".into(),
            uid: "u-1".into(),
            groups: vec!["g".into(), "system:authenticated".into()],
            extra: [("scopes".to_string(), vec!["view".to_string()])].into(),
        };
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
            "metadata": {"name": "ignored"}});
        let got = subject_review(&user, &request);
        assert_eq!(got["kind"], "SelfSubjectReview");
        assert_eq!(got["metadata"].as_object().map(|m| m.len()), Some(1), "only creationTimestamp: {got}");
        assert_eq!(
            got["status"],
            json!({"userInfo": {"username": "alice", "uid": "u-1", "groups": ["g", "system:authenticated"],
                "extra": {"scopes": ["view"]}}})
        );
        let bare = subject_review(&UserInfo { name: "bob".into(), ..Default::default() }, &request);
        assert_eq!(bare["status"], json!({"userInfo": {"username": "bob"}}));
    }
}

//! Request authorization, as an aggregated API server does it.
//!
//! - the health paths (`/healthz`, `/livez`, `/readyz` and their checks) and `/version` are served to anyone (the
//!   HTTP layer does not even ask);
//! - members of `system:masters` are allowed everything (kube-apiserver's aggregator probes as
//!   `system:kube-aggregator` in that group);
//! - everything else is a SubjectAccessReview (`authorization.k8s.io/v1`) to kube-apiserver ([`AccessReviewer`]),
//!   with the request's attributes mapped exactly as kube-apiserver maps them ([`RequestAttributes::from_request`]).
//!   Decisions, allow and deny, are cached briefly (10 s by default, like k8s.io/apiserver's delegated authorizer).
//! - standalone, with no cluster to ask: only `system:masters`, unless `--authorization-mode=AlwaysAllow`; besides,
//!   as kube-apiserver's bootstrap RBAC policy grants them to `system:authenticated`, every authenticated user may
//!   read discovery (`system:discovery`) and create the self reviews (`system:basic-user`: `kubectl auth can-i`,
//!   `kubectl auth whoami`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use k8s_openapi::api::authorization::v1 as authorization;
use sha2::{Digest, Sha256};

use super::authn::{UserInfo, GROUP_AUTHENTICATED, GROUP_MASTERS};
use super::cache::TtlCache;
use super::Result;
use crate::error::{ApiError, Details};
use crate::request_info::RequestInfo;

/// What a request asks to do, in kube-apiserver's terms (its `RequestInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestAttributes {
    /// get, list, watch, create, update, patch, delete, deletecollection for resources; the lower-case HTTP method
    /// for other paths.
    pub verb: String,
    pub path: String,
    /// `None` for a non-resource request (discovery, /openapi, /metrics, the webhooks).
    pub resource: Option<ResourceAttributes>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub namespace: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

impl RequestAttributes {
    /// The attributes kube-apiserver authorizes a request by, from its [`RequestInfo`].
    pub fn from_info(info: &RequestInfo) -> Self {
        let resource = info.is_resource_request.then(|| ResourceAttributes {
            namespace: info.namespace.clone(),
            group: info.api_group.clone(),
            version: info.api_version.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            name: info.name.clone(),
        });
        RequestAttributes { verb: info.verb.clone(), path: info.path.clone(), resource }
    }

    /// [`from_info`](Self::from_info) of a request parsed here.
    pub fn from_request(method: &Method, path: &str, query: Option<&str>) -> Self {
        Self::from_info(&RequestInfo::parse(method, path, query))
    }
}

/// The authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, or no opinion (which is a denial here: there is no other authorizer to ask).
    Deny {
        reason: String,
    },
}

/// Asks kube-apiserver (or a stand-in) whether a user may do something.
#[async_trait::async_trait]
pub trait AccessReviewer: Send + Sync + fmt::Debug {
    async fn review(&self, spec: &authorization::SubjectAccessReviewSpec) -> Result<Decision>;
}

/// How requests of users outside `system:masters` are decided.
#[derive(Debug, Clone)]
pub enum AuthorizationMode {
    /// Everyone authenticated may do everything (`--authorization-mode=AlwaysAllow`; for local experiments).
    AlwaysAllow,
    /// Only `system:masters` (standalone: nobody to ask).
    MastersOnly,
    /// SubjectAccessReview.
    Delegated(Arc<dyn AccessReviewer>),
}

/// Decides requests; see the module documentation.
#[derive(Debug)]
pub struct Authorizer {
    mode: AuthorizationMode,
    cache: TtlCache<[u8; 32], Decision>,
    allowed_ttl: Duration,
    denied_ttl: Duration,
}

/// Bound of the decision cache (entries are a few hundred bytes).
const DECISION_CACHE_CAPACITY: usize = 10_000;

impl Authorizer {
    pub fn new(mode: AuthorizationMode) -> Self {
        Self::with_cache_ttls(mode, Duration::from_secs(10), Duration::from_secs(10))
    }

    /// `allowed_ttl` and `denied_ttl`: how long SubjectAccessReview answers are reused (zero: never).
    pub fn with_cache_ttls(mode: AuthorizationMode, allowed_ttl: Duration, denied_ttl: Duration) -> Self {
        Authorizer { mode, cache: TtlCache::new(DECISION_CACHE_CAPACITY), allowed_ttl, denied_ttl }
    }

    pub fn mode(&self) -> &AuthorizationMode {
        &self.mode
    }

    /// Whether `user` may do what `attrs` describe. An error means the authorizer could not be asked (the request
    /// then fails with 500, as in kube-apiserver).
    pub async fn authorize(&self, user: &UserInfo, attrs: &RequestAttributes) -> Result<Decision> {
        if user.in_group(GROUP_MASTERS) {
            return Ok(Decision::Allow);
        }
        let reviewer = match &self.mode {
            AuthorizationMode::AlwaysAllow => return Ok(Decision::Allow),
            AuthorizationMode::MastersOnly if granted_to_authenticated(user, attrs) => return Ok(Decision::Allow),
            AuthorizationMode::MastersOnly => return Ok(Decision::Deny { reason: String::new() }),
            AuthorizationMode::Delegated(reviewer) => reviewer,
        };
        let spec = review_spec(user, attrs);
        let key: [u8; 32] = Sha256::digest(serde_json::to_vec(&spec).unwrap_or_default()).into();
        if let Some(decision) = self.cache.get(&key) {
            return Ok(decision);
        }
        let decision = reviewer.review(&spec).await?;
        let ttl = if decision == Decision::Allow { self.allowed_ttl } else { self.denied_ttl };
        self.cache.insert(key, decision.clone(), ttl);
        Ok(decision)
    }
}

/// What kube-apiserver's bootstrap policy lets every member of `system:authenticated` do, through the bindings of
/// `system:discovery` (get on the discovery, OpenAPI and version paths) and `system:basic-user` (create the self
/// reviews). The health paths need no authorization here at all.
fn granted_to_authenticated(user: &UserInfo, attrs: &RequestAttributes) -> bool {
    if !user.in_group(GROUP_AUTHENTICATED) {
        return false;
    }
    match &attrs.resource {
        None => {
            let p = attrs.path.as_str();
            attrs.verb == "get"
                && (matches!(p, "/api" | "/apis" | "/openapi" | "/version" | "/version/")
                    || ["/api/", "/apis/", "/openapi/"].iter().any(|prefix| p.starts_with(prefix)))
        }
        Some(r) => {
            attrs.verb == "create"
                && r.subresource.is_empty()
                && matches!(
                    (r.group.as_str(), r.resource.as_str()),
                    ("authorization.k8s.io", "selfsubjectaccessreviews" | "selfsubjectrulesreviews")
                        | ("authentication.k8s.io", "selfsubjectreviews")
                )
        }
    }
}

/// The SubjectAccessReview spec of a request, as k8s.io/apiserver's webhook authorizer builds it.
pub fn review_spec(user: &UserInfo, attrs: &RequestAttributes) -> authorization::SubjectAccessReviewSpec {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let mut spec = authorization::SubjectAccessReviewSpec {
        user: some(&user.name),
        uid: some(&user.uid),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: (!user.extra.is_empty())
            .then(|| user.extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<BTreeMap<_, _>>()),
        ..Default::default()
    };
    match &attrs.resource {
        Some(r) => {
            spec.resource_attributes = Some(authorization::ResourceAttributes {
                namespace: some(&r.namespace),
                verb: some(&attrs.verb),
                group: some(&r.group),
                version: some(&r.version),
                resource: some(&r.resource),
                subresource: some(&r.subresource),
                name: some(&r.name),
                ..Default::default()
            })
        }
        None => {
            spec.non_resource_attributes =
                Some(authorization::NonResourceAttributes { path: some(&attrs.path), verb: some(&attrs.verb) })
        }
    }
    spec
}

/// kube-apiserver's 403 for a denied request, e.g. `storagestates.migration.k8s.io "pods" is forbidden: User "alice"
/// cannot delete resource "storagestates" in API group "migration.k8s.io" at the cluster scope`, followed by `: reason`
/// when the authorizer gave one; `details` names the resource (`kind` is the plural, as upstream).
pub fn forbidden(user: &UserInfo, attrs: &RequestAttributes, reason: &str) -> ApiError {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"));
    let what = match &attrs.resource {
        None => format!("User {} cannot {} path {}", quote(&user.name), attrs.verb, quote(&attrs.path)),
        Some(r) => {
            let resource =
                if r.subresource.is_empty() { r.resource.clone() } else { format!("{}/{}", r.resource, r.subresource) };
            let scope = if r.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace {}", quote(&r.namespace))
            };
            format!(
                "User {} cannot {} resource {} in API group {} {scope}",
                quote(&user.name),
                attrs.verb,
                quote(&resource),
                quote(&r.group)
            )
        }
    };
    // responsewriters' sanitizer: the message must not look like HTML (the reason and the object's name are left
    // as they are, as upstream leaves them).
    let what = what.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let what = if reason.is_empty() { what } else { format!("{what}: {reason}") };
    let (message, details) = match &attrs.resource {
        None => (format!("forbidden: {what}"), Details::default()),
        Some(r) => {
            let qualified = crate::error::qualified(&r.resource, &r.group);
            let message = if r.name.is_empty() {
                format!("{qualified} is forbidden: {what}")
            } else {
                format!("{qualified} {} is forbidden: {what}", quote(&r.name))
            };
            let details = Details {
                name: r.name.clone(),
                group: r.group.clone(),
                kind: r.resource.clone(),
                ..Default::default()
            };
            (message, details)
        }
    };
    let mut e = ApiError::forbidden(message);
    e.details = Some(Box::new(details));
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn attrs(method: Method, path: &str, query: Option<&str>) -> RequestAttributes {
        RequestAttributes::from_request(&method, path, query)
    }

    fn res(
        verb: &str,
        ns: &str,
        group: &str,
        version: &str,
        resource: &str,
        sub: &str,
        name: &str,
    ) -> (String, ResourceAttributes) {
        (
            verb.to_string(),
            ResourceAttributes {
                namespace: ns.into(),
                group: group.into(),
                version: version.into(),
                resource: resource.into(),
                subresource: sub.into(),
                name: name.into(),
            },
        )
    }

    #[test]
    fn verbs_and_attributes_like_kube_apiserver() {
        let g = "migration.k8s.io";
        let ss = "/apis/migration.k8s.io/v1alpha1/storagestates";
        let shoots = "/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates";
        type Case<'a> = (Method, String, Option<&'a str>, (String, ResourceAttributes));
        let cases: Vec<Case> = vec![
            (Method::GET, ss.into(), None, res("list", "", g, "v1alpha1", "storagestates", "", "")),
            (Method::HEAD, ss.into(), None, res("list", "", g, "v1alpha1", "storagestates", "", "")),
            (Method::GET, ss.into(), Some("watch=true"), res("watch", "", g, "v1alpha1", "storagestates", "", "")),
            (Method::GET, ss.into(), Some("watch=1"), res("watch", "", g, "v1alpha1", "storagestates", "", "")),
            (Method::GET, ss.into(), Some("watch=false"), res("list", "", g, "v1alpha1", "storagestates", "", "")),
            (Method::GET, ss.into(), Some("watch=yes"), res("watch", "", g, "v1alpha1", "storagestates", "", "")),
            (
                Method::GET,
                ss.into(),
                Some("watch=true&fieldSelector=metadata.name%3Dpods"),
                res("watch", "", g, "v1alpha1", "storagestates", "", "pods"),
            ),
            (
                Method::GET,
                ss.into(),
                Some("fieldSelector=metadata.name%3D%3Dpods,metadata.namespace%3Dx"),
                res("list", "", g, "v1alpha1", "storagestates", "", "pods"),
            ),
            (Method::GET, format!("{ss}/pods"), None, res("get", "", g, "v1alpha1", "storagestates", "", "pods")),
            (
                Method::GET,
                format!("{ss}/pods"),
                Some("watch=true"),
                res("get", "", g, "v1alpha1", "storagestates", "", "pods"),
            ),
            (Method::POST, ss.into(), None, res("create", "", g, "v1alpha1", "storagestates", "", "")),
            (Method::PUT, format!("{ss}/pods"), None, res("update", "", g, "v1alpha1", "storagestates", "", "pods")),
            (
                Method::PUT,
                format!("{ss}/pods/status"),
                None,
                res("update", "", g, "v1alpha1", "storagestates", "status", "pods"),
            ),
            (
                Method::PATCH,
                format!("{ss}/pods/status"),
                None,
                res("patch", "", g, "v1alpha1", "storagestates", "status", "pods"),
            ),
            (Method::DELETE, format!("{ss}/pods"), None, res("delete", "", g, "v1alpha1", "storagestates", "", "pods")),
            (Method::DELETE, ss.into(), None, res("deletecollection", "", g, "v1alpha1", "storagestates", "", "")),
            (
                Method::GET,
                shoots.into(),
                None,
                res("list", "garden", "core.gardener.cloud", "v1beta1", "shootstates", "", ""),
            ),
            (
                Method::PATCH,
                format!("{shoots}/my-shoot"),
                None,
                res("patch", "garden", "core.gardener.cloud", "v1beta1", "shootstates", "", "my-shoot"),
            ),
            (
                Method::GET,
                "/apis/core.gardener.cloud/v1beta1/shootstates".into(),
                None,
                res("list", "", "core.gardener.cloud", "v1beta1", "shootstates", "", ""),
            ),
            (
                Method::GET,
                "/apis/core.gardener.cloud/v1beta1/watch/namespaces/garden/shootstates".into(),
                None,
                res("watch", "garden", "core.gardener.cloud", "v1beta1", "shootstates", "", ""),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/default/pods/p".into(),
                None,
                res("get", "default", "", "v1", "pods", "", "p"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/default".into(),
                None,
                res("get", "default", "", "v1", "namespaces", "", "default"),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/default/finalize".into(),
                None,
                res("update", "default", "", "v1", "namespaces", "finalize", "default"),
            ),
            (Method::GET, "/api/v1/nodes".into(), None, res("list", "", "", "v1", "nodes", "", "")),
        ];
        for (method, path, query, (verb, resource)) in cases {
            let got = attrs(method.clone(), &path, query);
            assert_eq!(got.verb, verb, "{method} {path}?{query:?}");
            assert_eq!(got.resource.as_ref(), Some(&resource), "{method} {path}?{query:?}");
            assert_eq!(got.path, path);
        }
        for (method, path, verb) in [
            (Method::GET, "/apis", "get"),
            (Method::GET, "/apis/migration.k8s.io", "get"),
            (Method::GET, "/apis/migration.k8s.io/v1alpha1", "get"),
            (Method::GET, "/api", "get"),
            (Method::GET, "/api/v1", "get"),
            (Method::GET, "/openapi/v3/apis/migration.k8s.io/v1alpha1", "get"),
            (Method::GET, "/metrics", "get"),
            (Method::POST, "/validate", "post"),
            (Method::POST, "/mutate", "post"),
            (Method::PUT, "/healthz", "put"),
        ] {
            let got = attrs(method.clone(), path, None);
            assert_eq!((got.verb.as_str(), got.resource.is_none()), (verb, true), "{method} {path}");
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect(), ..Default::default() }
    }

    #[test]
    fn forbidden_messages_match_kube_apiserver() {
        let alice = user("alice", &["system:authenticated"]);
        let e =
            forbidden(&alice, &attrs(Method::DELETE, "/apis/migration.k8s.io/v1alpha1/storagestates/pods", None), "");
        assert_eq!(e.code, 403);
        assert_eq!(
            e.status(),
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "storagestates.migration.k8s.io \"pods\" is forbidden: User \"alice\" cannot delete resource \"storagestates\" in API group \"migration.k8s.io\" at the cluster scope",
                "reason": "Forbidden",
                "details": {"name": "pods", "group": "migration.k8s.io", "kind": "storagestates"},
                "code": 403,
            })
        );
        let e = forbidden(
            &alice,
            &attrs(Method::GET, "/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates", None),
            "no RBAC policy matched",
        );
        assert_eq!(
            e.message,
            "shootstates.core.gardener.cloud is forbidden: User \"alice\" cannot list resource \"shootstates\" in API group \"core.gardener.cloud\" in the namespace \"garden\": no RBAC policy matched"
        );
        let e = forbidden(
            &alice,
            &attrs(Method::PATCH, "/apis/migration.k8s.io/v1alpha1/storagestates/pods/status", None),
            "",
        );
        assert!(e.message.contains("cannot patch resource \"storagestates/status\""), "{}", e.message);
        let e = forbidden(&alice, &attrs(Method::GET, "/metrics", None), "");
        assert_eq!(e.message, "forbidden: User \"alice\" cannot get path \"/metrics\"");
        let e = forbidden(&user("<b>&", &[]), &attrs(Method::GET, "/metrics", None), "<why>");
        assert_eq!(e.message, "forbidden: User \"&lt;b&gt;&amp;\" cannot get path \"/metrics\": <why>");
        assert_eq!(e.status()["details"], serde_json::json!({}));
    }

    #[derive(Debug, Default)]
    struct Reviewer {
        calls: AtomicUsize,
        seen: Mutex<Vec<authorization::SubjectAccessReviewSpec>>,
    }

    #[async_trait::async_trait]
    impl AccessReviewer for Reviewer {
        async fn review(&self, spec: &authorization::SubjectAccessReviewSpec) -> Result<Decision> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.seen.lock().expect("lock").push(spec.clone());
            match spec.user.as_deref() {
                Some("alice") => Ok(Decision::Allow),
                Some("broken") => Err(crate::auth::Error::Invalid("connection refused".into())),
                _ => Ok(Decision::Deny { reason: "nope".into() }),
            }
        }
    }

    #[tokio::test]
    async fn modes_and_cache() {
        let list = attrs(Method::GET, "/apis/migration.k8s.io/v1alpha1/storagestates", None);
        let masters = user("root", &["system:masters", "system:authenticated"]);
        let bob = user("bob", &["system:authenticated"]);
        for mode in [AuthorizationMode::AlwaysAllow, AuthorizationMode::MastersOnly] {
            assert_eq!(Authorizer::new(mode.clone()).authorize(&masters, &list).await.ok(), Some(Decision::Allow));
        }
        assert_eq!(
            Authorizer::new(AuthorizationMode::AlwaysAllow).authorize(&bob, &list).await.ok(),
            Some(Decision::Allow)
        );
        assert!(matches!(
            Authorizer::new(AuthorizationMode::MastersOnly).authorize(&bob, &list).await.ok(),
            Some(Decision::Deny { .. })
        ));
        // kube-apiserver's system:discovery and system:basic-user, for the authenticated only.
        let standalone = Authorizer::new(AuthorizationMode::MastersOnly);
        let ssar = attrs(Method::POST, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", None);
        let ssr = attrs(Method::POST, "/apis/authentication.k8s.io/v1/selfsubjectreviews", None);
        let discovery = attrs(Method::GET, "/apis/migration.k8s.io/v1alpha1", None);
        let anonymous = user("system:anonymous", &["system:unauthenticated"]);
        for a in [&ssar, &ssr, &discovery, &attrs(Method::GET, "/openapi/v3", None), &attrs(Method::GET, "/api", None)]
        {
            assert_eq!(standalone.authorize(&bob, a).await.ok(), Some(Decision::Allow), "{a:?}");
            assert!(matches!(standalone.authorize(&anonymous, a).await.ok(), Some(Decision::Deny { .. })), "{a:?}");
        }
        for a in [attrs(Method::GET, "/metrics", None), attrs(Method::POST, "/apis", None), list.clone()] {
            assert!(matches!(standalone.authorize(&bob, &a).await.ok(), Some(Decision::Deny { .. })), "{a:?}");
        }

        let reviewer = Arc::new(Reviewer::default());
        let authz = Authorizer::new(AuthorizationMode::Delegated(reviewer.clone()));
        let alice = user("alice", &["system:authenticated"]);
        assert_eq!(authz.authorize(&masters, &list).await.ok(), Some(Decision::Allow));
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 0, "system:masters is not reviewed");
        assert_eq!(authz.authorize(&alice, &list).await.ok(), Some(Decision::Allow));
        assert_eq!(authz.authorize(&alice, &list).await.ok(), Some(Decision::Allow));
        assert_eq!(authz.authorize(&bob, &list).await.ok(), Some(Decision::Deny { reason: "nope".into() }));
        assert_eq!(authz.authorize(&bob, &list).await.ok(), Some(Decision::Deny { reason: "nope".into() }));
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 2, "both answers cached");
        // Other attributes are another question.
        let get = attrs(Method::GET, "/apis/migration.k8s.io/v1alpha1/storagestates/pods", None);
        assert_eq!(authz.authorize(&alice, &get).await.ok(), Some(Decision::Allow));
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 3);
        // Errors are not cached.
        let broken = user("broken", &[]);
        assert!(authz.authorize(&broken, &get).await.is_err());
        assert!(authz.authorize(&broken, &get).await.is_err());
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 5);

        let seen = reviewer.seen.lock().expect("lock");
        let spec = serde_json::to_value(&seen[2]).expect("json");
        assert_eq!(
            spec,
            serde_json::json!({
                "user": "alice", "groups": ["system:authenticated"],
                "resourceAttributes": {"verb": "get", "group": "migration.k8s.io", "version": "v1alpha1",
                                       "resource": "storagestates", "name": "pods"},
            })
        );
    }

    #[tokio::test]
    async fn zero_ttls_disable_the_cache() {
        let reviewer = Arc::new(Reviewer::default());
        let authz =
            Authorizer::with_cache_ttls(AuthorizationMode::Delegated(reviewer.clone()), Duration::ZERO, Duration::ZERO);
        let alice = user("alice", &[]);
        let metrics = attrs(Method::GET, "/metrics", None);
        authz.authorize(&alice, &metrics).await.expect("allow");
        authz.authorize(&alice, &metrics).await.expect("allow");
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 2);
        let spec = serde_json::to_value(&reviewer.seen.lock().expect("lock")[0]).expect("json");
        assert_eq!(
            spec,
            serde_json::json!({"user": "alice", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
        );
    }
}

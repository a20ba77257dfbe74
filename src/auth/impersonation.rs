//! Impersonation, as k8s.io/apiserver's `WithImpersonation` filter (pkg/endpoints/filters/impersonation): a client
//! allowed to may act as another user with the headers `Impersonate-User`, `Impersonate-Group` (one line per group),
//! `Impersonate-Uid` and `Impersonate-Extra-<key>` (one line per value; the key lower-cased, then percent-decoded).
//!
//! It runs after authentication and before authorization. Each thing asked for is authorized for the requesting
//! user with the verb `impersonate`, in the order upstream asks them (the user, each group, each extra value, the
//! UID), and the first one denied is the answer (403); the request is then authorized, and served, as the
//! impersonated user. Groups, extra or a UID without a user are a 400. Behind kube-apiserver's aggregator none of
//! this happens here: kube-apiserver resolves impersonation and sends the impersonated user as the front-proxy
//! identity; the headers reach this server only when it stands alone.
//!
//! Upstream's newer constrained impersonation (the `ConstrainedImpersonation` feature gate, off by default) is not
//! implemented: only the classic filter, the one every kube-apiserver runs.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderValue};

use super::authn::{UserInfo, GROUP_AUTHENTICATED};
use super::authz::{forbidden, Authorizer, Decision, RequestAttributes, ResourceAttributes};
use crate::error::ApiError;
use crate::validation::{dns1123_label, dns1123_subdomain};

/// The headers (http's names are lower case; clients send `Impersonate-User` and so on).
pub const USER_HEADER: &str = "impersonate-user";
pub const GROUP_HEADER: &str = "impersonate-group";
pub const UID_HEADER: &str = "impersonate-uid";
pub const EXTRA_HEADER_PREFIX: &str = "impersonate-extra-";

/// The anonymous user and the group of unauthenticated requests (k8s.io/apiserver's `user.Anonymous`,
/// `user.AllUnauthenticated`).
pub const ANONYMOUS: &str = "system:anonymous";
pub const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";

const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";
const AUTHENTICATION_VERSION: &str = "authentication.k8s.io/v1";

/// A request extension set when a request impersonates: who sent it (`original`, as authenticated) and whom it acts
/// as (`impersonated`). From then on the request's [`UserInfo`] extension is the impersonated user: authorization,
/// the handlers and managedFields see only that one. An audit log records `original` as the event's `user` and
/// `impersonated` as its `impersonatedUser`, as kube-apiserver's does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Impersonation {
    pub original: UserInfo,
    pub impersonated: UserInfo,
}

/// One thing the headers ask to act as: upstream's `ObjectReference` per header value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Wanted {
    ServiceAccount { namespace: String, name: String },
    User(String),
    Group(String),
    Extra { key: String, value: String },
    Uid(String),
}

impl Wanted {
    /// Go's `%v` of that ObjectReference (upstream prints the list in its 400): the seven fields Kind, Namespace,
    /// Name, UID, APIVersion, ResourceVersion and FieldPath, space-separated, empty ones included.
    fn go_value(&self) -> String {
        let (kind, namespace, name, api_version, field_path) = match self {
            Wanted::ServiceAccount { namespace, name } => ("ServiceAccount", namespace.as_str(), name.as_str(), "", ""),
            Wanted::User(name) => ("User", "", name.as_str(), "", ""),
            Wanted::Group(name) => ("Group", "", name.as_str(), "", ""),
            Wanted::Extra { key, value } => ("UserExtra", "", value.as_str(), AUTHENTICATION_VERSION, key.as_str()),
            Wanted::Uid(uid) => ("UID", "", uid.as_str(), AUTHENTICATION_VERSION, ""),
        };
        format!("{{{kind} {namespace} {name}  {api_version}  {field_path}}}")
    }

    /// What the requesting user must be allowed: `impersonate` on users, groups and service accounts (core group,
    /// no version: the reference names none), on `userextras/<key>` and `uids` (authentication.k8s.io, v1).
    fn attributes(&self) -> RequestAttributes {
        let (namespace, group, version, resource, subresource, name) = match self {
            Wanted::ServiceAccount { namespace, name } => (namespace.as_str(), "", "", "serviceaccounts", "", name),
            Wanted::User(name) => ("", "", "", "users", "", name),
            Wanted::Group(name) => ("", "", "", "groups", "", name),
            Wanted::Extra { key, value } => ("", AUTHENTICATION_GROUP, "v1", "userextras", key.as_str(), value),
            Wanted::Uid(uid) => ("", AUTHENTICATION_GROUP, "v1", "uids", "", uid),
        };
        RequestAttributes {
            verb: "impersonate".into(),
            path: String::new(),
            resource: Some(ResourceAttributes {
                namespace: namespace.into(),
                group: group.into(),
                version: version.into(),
                resource: resource.into(),
                subresource: subresource.into(),
                name: name.clone(),
            }),
        }
    }
}

/// A header value as Go reads it: its bytes as they are (lossily, for the rare value that is not UTF-8).
fn text(v: &HeaderValue) -> String {
    String::from_utf8_lossy(v.as_bytes()).into_owned()
}

/// `system:serviceaccount:<namespace>:<name>` split as upstream's `serviceaccount.SplitUsername`: exactly two
/// parts, a DNS label and a DNS subdomain; anything else is an ordinary user name.
fn split_service_account(user: &str) -> Option<(String, String)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let mut parts = rest.split(':');
    let (namespace, name) = (parts.next()?, parts.next()?);
    let valid = parts.next().is_none() && dns1123_label(namespace).is_empty() && dns1123_subdomain(name).is_empty();
    valid.then(|| (namespace.to_string(), name.to_string()))
}

/// An extra key as upstream decodes it (`url.PathUnescape`): `%XX` sequences as bytes; a malformed one leaves the
/// key as it was, which upstream records anyway.
fn unescape_extra_key(key: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            match (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 3;
                    continue;
                }
                _ => return key.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the headers ask to act as, in upstream's order (`buildImpersonationRequests`): the user, each group, each
/// extra value (header by header), the UID. Groups, extra or a UID without a user are upstream's 400.
fn wanted(headers: &HeaderMap) -> Result<Vec<Wanted>, ApiError> {
    let mut out = Vec::new();
    let user = headers.get(USER_HEADER).map(text).unwrap_or_default();
    if !user.is_empty() {
        out.push(match split_service_account(&user) {
            Some((namespace, name)) => Wanted::ServiceAccount { namespace, name },
            None => Wanted::User(user.clone()),
        });
    }
    out.extend(headers.get_all(GROUP_HEADER).iter().map(|g| Wanted::Group(text(g))));
    // The header names are lower case already (as upstream lower-cases the key), decoded after.
    for name in headers.keys() {
        if let Some(key) = name.as_str().strip_prefix(EXTRA_HEADER_PREFIX) {
            let key = unescape_extra_key(key);
            out.extend(headers.get_all(name).iter().map(|v| Wanted::Extra { key: key.clone(), value: text(v) }));
        }
    }
    let uid = headers.get(UID_HEADER).map(text).unwrap_or_default();
    if !uid.is_empty() {
        out.push(Wanted::Uid(uid));
    }
    if user.is_empty() && !out.is_empty() {
        let list: Vec<String> = out.iter().map(Wanted::go_value).collect();
        return Err(ApiError::bad_request(format!("requested [{}] without impersonating a user", list.join(" "))));
    }
    Ok(out)
}

/// Removes every impersonation header, so that nothing after the filter mistakes them for the request's own.
pub fn strip_headers(headers: &mut HeaderMap) {
    let extra: Vec<_> = headers.keys().filter(|n| n.as_str().starts_with(EXTRA_HEADER_PREFIX)).cloned().collect();
    for name in extra.iter().map(|n| n.as_str()).chain([USER_HEADER, GROUP_HEADER, UID_HEADER]) {
        headers.remove(name);
    }
}

/// The user `requestor` acts as by `headers`: `Ok(None)` when the request impersonates nobody; the 400 or 403 when
/// it may not.
pub async fn impersonate(
    authz: &Authorizer,
    requestor: &UserInfo,
    headers: &HeaderMap,
) -> Result<Option<UserInfo>, ApiError> {
    let wanted = wanted(headers)?;
    if wanted.is_empty() {
        return Ok(None);
    }
    // Groups given are the whole answer; a service account without them gets its fixed ones.
    let groups_given = headers.contains_key(GROUP_HEADER);
    let mut user = UserInfo::default();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in &wanted {
        match w {
            Wanted::ServiceAccount { namespace, name } => {
                user.name = format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}");
                if !groups_given {
                    user.groups = vec![SERVICE_ACCOUNTS_GROUP.into(), format!("{SERVICE_ACCOUNTS_GROUP}:{namespace}")];
                }
            }
            Wanted::User(name) => user.name = name.clone(),
            Wanted::Group(group) => user.groups.push(group.clone()),
            Wanted::Extra { key, value } => extra.entry(key.clone()).or_default().push(value.clone()),
            Wanted::Uid(uid) => user.uid = uid.clone(),
        }
        let attrs = w.attributes();
        // Upstream answers an authorizer that fails as one that denies, with the reason it gave (none).
        let reason = match authz.authorize(requestor, &attrs).await {
            Ok(Decision::Allow) => continue,
            Ok(Decision::Deny { reason }) => reason,
            Err(e) => {
                tracing::warn!(error = %e, user = %requestor.name, "impersonation: authorization failed");
                String::new()
            }
        };
        tracing::debug!(user = %requestor.name, wanted = %w.go_value(), "impersonation forbidden");
        return Err(forbidden(requestor, &attrs, &reason));
    }
    user.extra = extra;
    // Every user but the anonymous one is authenticated, unless the groups given say otherwise; the anonymous one
    // is unauthenticated.
    let has = |groups: &[String], g: &str| groups.iter().any(|x| x == g);
    let unauthenticated = has(&user.groups, GROUP_UNAUTHENTICATED);
    if user.name != ANONYMOUS {
        if !unauthenticated && !has(&user.groups, GROUP_AUTHENTICATED) {
            user.groups.push(GROUP_AUTHENTICATED.into());
        }
    } else if !unauthenticated {
        user.groups.push(GROUP_UNAUTHENTICATED.into());
    }
    tracing::debug!(user = %requestor.name, impersonated = %user.name, "impersonating");
    Ok(Some(user))
}

#[cfg(test)]
#[path = "impersonation_tests.rs"]
mod tests;

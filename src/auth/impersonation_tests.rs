//! The cases of k8s.io/apiserver's TestImpersonationFilter (impersonation_test.go), with its authorizer, plus the
//! messages of its 400 and 403 answers.

use super::*;
use crate::auth::authz::{AccessReviewer, AuthorizationMode};
use k8s_openapi::api::authorization::v1 as authorization;
use std::sync::Arc;
use std::time::Duration;

/// Upstream's `impersonateAuthorizer`, reading the SubjectAccessReview this server would send.
#[derive(Debug)]
struct UpstreamAuthorizer;

#[async_trait::async_trait]
impl AccessReviewer for UpstreamAuthorizer {
    async fn review(&self, spec: &authorization::SubjectAccessReviewSpec) -> crate::auth::Result<Decision> {
        let deny = |reason: &str| Ok(Decision::Deny { reason: reason.into() });
        match spec.user.as_deref() {
            Some("system:admin") => return Ok(Decision::Allow),
            Some("tester") => return Err(crate::auth::Error::Invalid("works on my machine".into())),
            Some("deny-me") => return deny("denied"),
            _ => {}
        }
        let groups = spec.groups.clone().unwrap_or_default();
        let group = |i: usize| groups.get(i).map(String::as_str).unwrap_or_default();
        let r = spec.resource_attributes.clone().unwrap_or_default();
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        let (verb, resource, sub, name, api_group) =
            (s(&r.verb), s(&r.resource), s(&r.subresource), s(&r.name), s(&r.group));
        let impersonate = |res: &str| verb == "impersonate" && resource == res;
        let allowed = (group(0) == "wheel" && impersonate("users"))
            || (group(0) == "sa-impersonater" && impersonate("serviceaccounts"))
            || (group(0) == "regular-impersonater" && impersonate("users"))
            || (group(1) == "group-impersonater" && impersonate("groups"))
            || (group(1) == "extra-setter-scopes" && impersonate("userextras") && sub == "scopes")
            || group(1) == "escaped-scopes"
            || group(1) == "almost-escaped-scopes"
            || (group(1) == "extra-setter-particular-scopes"
                && impersonate("userextras")
                && sub == "scopes"
                && name == "scope-a"
                && api_group == "authentication.k8s.io")
            || (group(1) == "extra-setter-project"
                && impersonate("userextras")
                && sub == "project"
                && api_group == "authentication.k8s.io")
            || (group(0) == "everything-impersonater"
                && ((impersonate("users") && api_group.is_empty())
                    || (impersonate("uids") && name == "some-uid" && api_group == "authentication.k8s.io")
                    || (impersonate("groups") && api_group.is_empty())
                    || (impersonate("userextras") && sub == "scopes" && api_group == "authentication.k8s.io")));
        if allowed {
            Ok(Decision::Allow)
        } else {
            deny("deny by default")
        }
    }
}

fn authorizer() -> Authorizer {
    Authorizer::with_cache_ttls(
        AuthorizationMode::Delegated(Arc::new(UpstreamAuthorizer)),
        Duration::ZERO,
        Duration::ZERO,
    )
}

fn user(name: &str, groups: &[&str], extra: &[(&str, &[&str])], uid: &str) -> UserInfo {
    UserInfo {
        name: name.into(),
        uid: uid.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        extra: extra.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect(),
    }
}

struct Case {
    name: &'static str,
    requestor: UserInfo,
    user: &'static str,
    groups: &'static [&'static str],
    extra: &'static [(&'static str, &'static [&'static str])],
    uid: &'static str,
    /// The user the request goes on as, or the code it is refused with.
    expected: Result<UserInfo, u16>,
}

fn headers(c: &Case) -> HeaderMap {
    let mut h = HeaderMap::new();
    if !c.user.is_empty() {
        h.append("Impersonate-User", c.user.parse().expect("value"));
    }
    for g in c.groups {
        h.append("Impersonate-Group", g.parse().expect("value"));
    }
    for (key, values) in c.extra {
        let name: axum::http::HeaderName = format!("Impersonate-Extra-{key}").parse().expect("name");
        for v in *values {
            h.append(name.clone(), v.parse().expect("value"));
        }
    }
    if !c.uid.is_empty() {
        h.append("Impersonate-Uid", c.uid.parse().expect("value"));
    }
    h
}

fn cases() -> Vec<Case> {
    let authenticated = &["system:authenticated"][..];
    let case = |name, requestor, user, groups, extra, uid, expected| Case {
        name,
        requestor,
        user,
        groups,
        extra,
        uid,
        expected,
    };
    let scopes: &'static [(&str, &[&str])] = &[("scopes", &["scope-a", "scope-b"])];
    vec![
        case("impersonating-error", user("tester", &[], &[], ""), "anyone", &[], &[], "", Err(403)),
        case("impersonating-group-without-user", user("tester", &[], &[], ""), "", &["some-group"], &[], "", Err(400)),
        case(
            "impersonating-extra-without-user",
            user("tester", &[], &[], ""),
            "",
            &[],
            &[("scopes", &["scope-a"])],
            "",
            Err(400),
        ),
        case("impersonating-uid-without-user", user("tester", &[], &[], ""), "", &[], &[], "some-uid", Err(400)),
        case("disallowed-group", user("dev", &["wheel"], &[], ""), "system:admin", &["some-group"], &[], "", Err(403)),
        case(
            "allowed-group",
            user("dev", &["wheel", "group-impersonater"], &[], ""),
            "system:admin",
            &["some-group"],
            &[],
            "",
            Ok(user("system:admin", &["some-group", "system:authenticated"], &[], "")),
        ),
        case(
            "disallowed-userextra-1",
            user("dev", &["wheel"], &[], ""),
            "system:admin",
            &["some-group"],
            &[("scopes", &["scope-a"])],
            "",
            Err(403),
        ),
        case(
            "disallowed-userextra-2",
            user("dev", &["wheel", "extra-setter-project"], &[], ""),
            "system:admin",
            &["some-group"],
            &[("scopes", &["scope-a"])],
            "",
            Err(403),
        ),
        case(
            "disallowed-userextra-3",
            user("dev", &["wheel", "extra-setter-particular-scopes"], &[], ""),
            "system:admin",
            &["some-group"],
            scopes,
            "",
            Err(403),
        ),
        case(
            "allowed-userextras",
            user("dev", &["wheel", "extra-setter-scopes"], &[], ""),
            "system:admin",
            &[],
            scopes,
            "",
            Ok(user("system:admin", authenticated, scopes, "")),
        ),
        case(
            "percent-escaped-userextras",
            user("dev", &["wheel", "escaped-scopes"], &[], ""),
            "system:admin",
            &[],
            &[("example.com%2fescaped%e1%9b%84scopes", &["scope-a", "scope-b"])],
            "",
            Ok(user("system:admin", authenticated, &[("example.com/escapedᛄscopes", &["scope-a", "scope-b"])], "")),
        ),
        case(
            "almost-percent-escaped-userextras",
            user("dev", &["wheel", "almost-escaped-scopes"], &[], ""),
            "system:admin",
            &[],
            &[("almost%zzpercent%xxencoded", &["scope-a", "scope-b"])],
            "",
            Ok(user("system:admin", authenticated, &[("almost%zzpercent%xxencoded", &["scope-a", "scope-b"])], "")),
        ),
        case(
            "allowed-users-impersonation",
            user("dev", &["regular-impersonater"], &[], ""),
            "tester",
            &[],
            &[],
            "",
            Ok(user("tester", authenticated, &[], "")),
        ),
        case("disallowed-impersonating", user("dev", &["sa-impersonater"], &[], ""), "tester", &[], &[], "", Err(403)),
        case(
            "allowed-sa-impersonating",
            user("dev", &["sa-impersonater"], &[], ""),
            "system:serviceaccount:foo:default",
            &[],
            &[],
            "",
            Ok(user(
                "system:serviceaccount:foo:default",
                &["system:serviceaccounts", "system:serviceaccounts:foo", "system:authenticated"],
                &[],
                "",
            )),
        ),
        case(
            "anonymous-username-prevents-adding-authenticated-group",
            user("system:admin", &[], &[], ""),
            "system:anonymous",
            &[],
            &[],
            "",
            Ok(user("system:anonymous", &["system:unauthenticated"], &[], "")),
        ),
        case(
            "unauthenticated-group-prevents-adding-authenticated-group",
            user("system:admin", &[], &[], ""),
            "unknown",
            &["system:unauthenticated"],
            &[],
            "",
            Ok(user("unknown", &["system:unauthenticated"], &[], "")),
        ),
        case(
            "unauthenticated-group-prevents-double-adding-authenticated-group",
            user("system:admin", &[], &[], ""),
            "unknown",
            &["system:authenticated"],
            &[],
            "",
            Ok(user("unknown", authenticated, &[], "")),
        ),
        case(
            "specified-authenticated-group-prevents-double-adding-authenticated-group",
            user("dev", &["wheel", "group-impersonater"], &[], ""),
            "system:admin",
            &["some-group", "system:authenticated"],
            &[],
            "",
            Ok(user("system:admin", &["some-group", "system:authenticated"], &[], "")),
        ),
        case(
            "anonymous-user-prevents-double-adding-unauthenticated-group",
            user("system:admin", &[], &[], ""),
            "system:anonymous",
            &["system:unauthenticated"],
            &[],
            "",
            Ok(user("system:anonymous", &["system:unauthenticated"], &[], "")),
        ),
        case(
            "allowed-user-impersonation-with-uid",
            user("dev", &["everything-impersonater"], &[], ""),
            "tester",
            &[],
            &[],
            "some-uid",
            Ok(user("tester", authenticated, &[], "some-uid")),
        ),
        case(
            "disallowed-user-impersonation-with-uid",
            user("dev", &["everything-impersonater"], &[], ""),
            "tester",
            &[],
            &[],
            "disallowed-uid",
            Err(403),
        ),
        case(
            "allowed-impersonation-with-all-headers",
            user("dev", &["everything-impersonater"], &[], ""),
            "tester",
            &["system:authenticated"],
            scopes,
            "some-uid",
            Ok(user("tester", authenticated, scopes, "some-uid")),
        ),
    ]
}

#[tokio::test]
async fn upstream_impersonation_filter_cases() {
    let authz = authorizer();
    // Not impersonating: the request goes on as it came.
    let tester = user("tester", &[], &[], "");
    assert_eq!(impersonate(&authz, &tester, &HeaderMap::new()).await.ok(), Some(None));
    for c in cases() {
        let got = impersonate(&authz, &c.requestor, &headers(&c)).await;
        match (&c.expected, got) {
            (Ok(want), Ok(Some(got))) => assert_eq!(&got, want, "{}", c.name),
            (Err(code), Err(e)) => assert_eq!(e.code, *code, "{}: {}", c.name, e.message),
            (want, got) => panic!("{}: expected {want:?}, got {got:?}", c.name),
        }
    }
}

#[tokio::test]
async fn answers_have_upstreams_messages() {
    let authz = authorizer();
    let dev = user("dev", &["wheel"], &[], "");
    let refused = |h: &[(&str, &str)]| {
        let mut map = HeaderMap::new();
        for (k, v) in h {
            map.append(axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        let (authz, dev) = (&authz, dev.clone());
        async move { impersonate(authz, &dev, &map).await.expect_err("refused") }
    };
    // The 400 lists what was asked, as Go prints the ObjectReferences.
    let e =
        refused(&[("Impersonate-Group", "g1"), ("Impersonate-Group", "g2"), ("Impersonate-Extra-Scopes", "s")]).await;
    assert_eq!(e.code, 400);
    assert_eq!(
        e.message,
        "requested [{Group  g1    } {Group  g2    } {UserExtra  s  authentication.k8s.io/v1  scopes}] without impersonating a user"
    );
    let e = refused(&[("Impersonate-Uid", "u-1")]).await;
    assert_eq!(e.message, "requested [{UID  u-1  authentication.k8s.io/v1  }] without impersonating a user");

    // The 403 names what was refused, as responsewriters.Forbidden does.
    let e = refused(&[("Impersonate-User", "alice"), ("Impersonate-Group", "g")]).await;
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "groups \"g\" is forbidden: User \"dev\" cannot impersonate resource \"groups\" in API group \"\" at the cluster scope: deny by default"
    );
    assert_eq!(e.status()["details"], serde_json::json!({"name": "g", "kind": "groups"}));
    let e = refused(&[("Impersonate-User", "system:serviceaccount:kube-system:default")]).await;
    assert_eq!(
        e.message,
        "serviceaccounts \"default\" is forbidden: User \"dev\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"kube-system\": deny by default"
    );
    let e = refused(&[("Impersonate-User", "alice"), ("Impersonate-Extra-Scopes", "view")]).await;
    assert_eq!(
        e.message,
        "userextras.authentication.k8s.io \"view\" is forbidden: User \"dev\" cannot impersonate resource \"userextras/scopes\" in API group \"authentication.k8s.io\" at the cluster scope: deny by default"
    );
    let e = refused(&[("Impersonate-User", "alice"), ("Impersonate-Uid", "u-1")]).await;
    assert_eq!(
        e.message,
        "uids.authentication.k8s.io \"u-1\" is forbidden: User \"dev\" cannot impersonate resource \"uids\" in API group \"authentication.k8s.io\" at the cluster scope: deny by default"
    );
}

#[test]
fn service_account_names_split_as_upstream() {
    let sa = |s: &str| split_service_account(s);
    assert_eq!(sa("system:serviceaccount:foo:default"), Some(("foo".into(), "default".into())));
    assert_eq!(sa("system:serviceaccount:foo:a.b-c"), Some(("foo".into(), "a.b-c".into())));
    for not in [
        "system:serviceaccount:foo",
        "system:serviceaccount:foo:bar:baz",
        "system:serviceaccount::x",
        "system:serviceaccount:Foo:x",
        "system:serviceaccount:foo.bar:x",
        "system:serviceaccount:foo:",
        "alice",
    ] {
        assert_eq!(sa(not), None, "{not}");
    }
}

#[test]
fn extra_keys_unescape_as_go_path_unescape() {
    assert_eq!(unescape_extra_key("example.com%2fescaped%e1%9b%84scopes"), "example.com/escapedᛄscopes");
    assert_eq!(unescape_extra_key("almost%zzpercent%xxencoded"), "almost%zzpercent%xxencoded");
    assert_eq!(unescape_extra_key("trailing%4"), "trailing%4");
    assert_eq!(unescape_extra_key("a+b%20c"), "a+b c");
}

#[test]
fn every_impersonation_header_is_stripped() {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("Impersonate-User", "a"),
        ("Impersonate-Group", "g"),
        ("Impersonate-Group", "h"),
        ("Impersonate-Uid", "u"),
        ("Impersonate-Extra-Scopes", "s"),
        ("Impersonate-Extra-Other", "o"),
        ("Accept", "application/json"),
    ] {
        h.append(axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"), v.parse().expect("value"));
    }
    strip_headers(&mut h);
    assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["accept"]);
}

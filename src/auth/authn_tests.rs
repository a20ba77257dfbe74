//! Tests of [`super`] (authn.rs), in a file of their own to keep that one readable.

use super::*;
use crate::auth::certs::{issue_client_cert, CertAuthority};
use crate::auth::trust::CaBundle;
use axum::http::HeaderValue;
use rustls_pki_types::pem::PemObject;

fn headers(authorization: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::AUTHORIZATION, HeaderValue::from_str(authorization).expect("header"));
    h
}

fn user(name: &str, uid: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        name: name.into(),
        uid: uid.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        extra: BTreeMap::new(),
    }
}

#[test]
fn token_file_formats() {
    let tokens = StaticTokens::parse(
        "\u{feff}# comment line\n\
             \n\
             token1,alice,uid-1\n\
             \t# indented comment\n\
             token2,bob,uid-2,\"dev,ops\"\r\n\
             token3,carol,uid-3,single\n\
             \"tok,en4\",\"dave \"\"the\"\" user\",uid-4,\" a , b ,,\",ignored,columns\n\
             token5 , erin , uid-5 , \"x\"\n\
             token6,frank,,\"\"\n   \n",
    )
    .expect("parse");
    assert_eq!(tokens.len(), 6);
    assert_eq!(tokens.lookup("token1"), Some(&user("alice", "uid-1", &[])));
    assert_eq!(tokens.lookup("token2"), Some(&user("bob", "uid-2", &["dev", "ops"])));
    assert_eq!(tokens.lookup("token3"), Some(&user("carol", "uid-3", &["single"])));
    assert_eq!(tokens.lookup("tok,en4"), Some(&user("dave \"the\" user", "uid-4", &["a", "b"])));
    assert_eq!(tokens.lookup("token5"), Some(&user("erin", "uid-5", &["x"])));
    assert_eq!(tokens.lookup("token6"), Some(&user("frank", "", &[])));
    assert_eq!(tokens.lookup("token"), None);
    assert_eq!(tokens.lookup(""), None);
    assert_eq!(tokens.lookup("TOKEN1"), None);
}

#[test]
fn token_file_duplicates_keep_the_last() {
    let tokens = StaticTokens::parse("t,first,1\nt,second,2\n").expect("parse");
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens.lookup("t").map(|u| u.name.as_str()), Some("second"));
    assert!(StaticTokens::parse("").expect("empty").is_empty());
    assert!(StaticTokens::parse("# only comments\n\n").expect("comments").is_empty());
}

#[test]
fn token_file_errors_name_the_line() {
    for (content, line, what) in [
        ("ok,user,uid\nbad,user\n", 2, "at least 3 columns"),
        ("# c\n\nonlytoken\n", 3, "at least 3 columns"),
        ("t,\"unterminated,uid\n", 1, "unterminated"),
        ("t,us\"er,uid\n", 1, "bare \""),
        ("t,\"user\"x,uid\n", 1, "after closing quote"),
        ("ok,user,uid\n,user,uid\n", 2, "empty token"),
        ("t,,uid\n", 1, "empty user name"),
    ] {
        let err = StaticTokens::parse(content).expect_err(content).to_string();
        assert!(err.starts_with(&format!("line {line}: ")), "{content:?}: {err}");
        assert!(err.contains(what), "{content:?}: {err}");
    }
}

#[test]
fn token_file_from_disk() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("tokens.csv");
    std::fs::write(&path, "secret,alice,1,\"a,b\"\n").expect("write");
    let authn = Authenticator::from_token_file(&path).expect("load");
    assert_eq!(
        authn.authenticate(None, &headers("Bearer secret")),
        Some(user("alice", "1", &["a", "b", GROUP_AUTHENTICATED]))
    );

    std::fs::write(&path, "secret,alice\n").expect("write");
    let err = Authenticator::from_token_file(&path).expect_err("malformed");
    let msg = err.to_string();
    assert!(msg.contains("tokens.csv") && msg.contains("line 1"), "{msg}");
    assert!(Authenticator::from_token_file(&tmp.path().join("missing.csv")).is_err());
}

#[test]
fn bearer_header_parsing() {
    assert_eq!(bearer_token(&headers("Bearer abc")), Some("abc"));
    assert_eq!(bearer_token(&headers("bearer abc")), Some("abc"));
    assert_eq!(bearer_token(&headers("  BEARER abc  ")), Some("abc"));
    assert_eq!(bearer_token(&headers("Bearer abc extra")), Some("abc"));
    assert_eq!(bearer_token(&headers("Bearer  abc")), None);
    assert_eq!(bearer_token(&headers("Bearer")), None);
    assert_eq!(bearer_token(&headers("Basic abc")), None);
    assert_eq!(bearer_token(&HeaderMap::new()), None);
}

#[test]
fn tokens_authenticate_with_the_authenticated_group_once() {
    let tokens = StaticTokens::parse("t1,alice,1,\"dev\"\nt2,bob,2,\"system:authenticated,ops\"\n").expect("parse");
    let authn = Authenticator::new().with_tokens(tokens);
    assert_eq!(
        authn.authenticate(None, &headers("Bearer t1")),
        Some(user("alice", "1", &["dev", GROUP_AUTHENTICATED]))
    );
    assert_eq!(authn.authenticate(None, &headers("Bearer t2")), Some(user("bob", "2", &[GROUP_AUTHENTICATED, "ops"])));
    assert_eq!(authn.authenticate(None, &headers("Bearer nope")), None);
    assert_eq!(authn.authenticate(None, &HeaderMap::new()), None);
    // Without a token table, bearer tokens are not accepted.
    assert_eq!(Authenticator::new().authenticate(None, &headers("Bearer t1")), None);
}

fn peer(cert_pem: &str) -> PeerCertificates {
    PeerCertificates::new(vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("pem")])
}

fn bundle(ca: &CertAuthority) -> CaBundle {
    CaBundle::from_pem(ca.cert_pem().as_bytes()).expect("bundle")
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn default_request_header(ca: &CertAuthority, allowed: &[&str]) -> RequestHeaderConfig {
    RequestHeaderConfig::new(
        bundle(ca),
        &strings(allowed),
        &strings(&["X-Remote-User"]),
        &strings(&["X-Remote-Uid"]),
        &strings(&["X-Remote-Group"]),
        &strings(&["X-Remote-Extra-"]),
    )
    .expect("config")
}

#[test]
fn client_certificates() {
    let ca = CertAuthority::generate("ca").expect("ca");
    let (cert, _) = issue_client_cert(&ca, "alice", &["g1", "g2"]).expect("issue");
    let tokens = StaticTokens::parse("t1,bob,1\n").expect("parse");
    let trust = Arc::new(ClientTrust::new());
    trust.set_client_ca(Some(bundle(&ca)));
    let authn = Authenticator::new().with_trust(trust.clone()).with_tokens(tokens);

    let alice = Some(user("alice", "", &["g1", "g2", GROUP_AUTHENTICATED]));
    assert_eq!(authn.authenticate(Some(&peer(&cert)), &HeaderMap::new()), alice);
    // The certificate takes precedence over a token, as in kube-apiserver.
    assert_eq!(authn.authenticate(Some(&peer(&cert)), &headers("Bearer t1")), alice);
    // Without a trust, certificates are not accepted; the token is.
    let tokens_only = Authenticator::new().with_tokens(StaticTokens::parse("t1,bob,1\n").expect("parse"));
    assert_eq!(tokens_only.authenticate(Some(&peer(&cert)), &HeaderMap::new()), None);
    assert_eq!(
        tokens_only.authenticate(Some(&peer(&cert)), &headers("Bearer t1")).map(|u| u.name),
        Some("bob".to_string())
    );

    let (no_groups, _) = issue_client_cert::<&str>(&ca, "carol", &[]).expect("issue");
    assert_eq!(
        authn.authenticate(Some(&peer(&no_groups)), &HeaderMap::new()),
        Some(user("carol", "", &[GROUP_AUTHENTICATED]))
    );
    let (empty_cn, _) = issue_client_cert(&ca, "", &["g"]).expect("issue");
    assert_eq!(authn.authenticate(Some(&peer(&empty_cn)), &HeaderMap::new()), None);
    let garbage = PeerCertificates::new(vec![CertificateDer::from(vec![1, 2, 3])]);
    assert_eq!(authn.authenticate(Some(&garbage), &HeaderMap::new()), None);
    // A certificate that does not parse vouches for nobody, but a bearer token still counts.
    assert_eq!(authn.authenticate(Some(&garbage), &headers("Bearer t1")).map(|u| u.name), Some("bob".to_string()));
    assert_eq!(authn.authenticate(Some(&PeerCertificates::new(Vec::new())), &HeaderMap::new()), None);

    // A certificate of another CA is no identity; after a CA rotation, the old CA's certificates are not either.
    let other = CertAuthority::generate("other").expect("ca");
    let (mallory, _) = issue_client_cert(&other, "mallory", &["system:masters"]).expect("issue");
    assert_eq!(authn.authenticate(Some(&peer(&mallory)), &HeaderMap::new()), None);
    trust.set_client_ca(Some(bundle(&other)));
    assert_eq!(authn.authenticate(Some(&peer(&mallory)), &HeaderMap::new()).map(|u| u.name), Some("mallory".into()));
    assert_eq!(authn.authenticate(Some(&peer(&cert)), &HeaderMap::new()), None);
}

fn proxy_headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::try_from(*k).expect("name"), HeaderValue::from_str(v).expect("value"));
    }
    h
}

#[test]
fn front_proxy_identity() {
    let client_ca = CertAuthority::generate("client-ca").expect("ca");
    let proxy_ca = CertAuthority::generate("front-proxy-ca").expect("ca");
    let trust = Arc::new(ClientTrust::new());
    trust.set_client_ca(Some(bundle(&client_ca)));
    trust.set_request_header(Some(default_request_header(&proxy_ca, &["front-proxy-client"])));
    let authn = Authenticator::new().with_trust(trust.clone());
    let proxy = peer(&issue_client_cert::<&str>(&proxy_ca, "front-proxy-client", &[]).expect("issue").0);
    let h = proxy_headers(&[
        ("X-Remote-User", "alice"),
        ("X-Remote-User", "ignored-second-user"),
        ("X-Remote-Uid", "uid-1"),
        ("X-Remote-Group", "devs"),
        ("X-Remote-Group", "ops"),
        ("X-Remote-Group", ""),
        ("X-Remote-Extra-Acme.com%2Fproject", "p1"),
        ("X-Remote-Extra-acme.com%2fproject", "p2"),
        ("X-Remote-Extra-Scopes", "view"),
        ("X-Remote-Extra-Bad%zz", "kept"),
    ]);
    let got = authn.authenticate(Some(&proxy), &h).expect("identity");
    assert_eq!(got.name, "alice");
    assert_eq!(got.uid, "uid-1");
    assert_eq!(got.groups, strings(&["devs", "ops", GROUP_AUTHENTICATED]));
    assert_eq!(got.extra.get("acme.com/project"), Some(&strings(&["p1", "p2"])));
    assert_eq!(got.extra.get("scopes"), Some(&strings(&["view"])));
    assert_eq!(got.extra.get("bad%zz"), Some(&strings(&["kept"])));

    // No user header: not a front-proxy request; the proxy certificate is no x509 identity either.
    assert_eq!(authn.authenticate(Some(&proxy), &proxy_headers(&[("X-Remote-Group", "g")])), None);
    // A common name that is not allowed.
    let stranger = peer(&issue_client_cert::<&str>(&proxy_ca, "someone-else", &[]).expect("issue").0);
    assert_eq!(authn.authenticate(Some(&stranger), &h), None);
    // The headers mean nothing without the proxy's certificate: a client CA user stays itself.
    let carol = peer(&issue_client_cert(&client_ca, "carol", &["c"]).expect("issue").0);
    assert_eq!(authn.authenticate(Some(&carol), &h).map(|u| u.name), Some("carol".into()));
    assert_eq!(authn.authenticate(None, &h), None);
    // Empty allowed names: any certificate of the CA.
    trust.set_request_header(Some(default_request_header(&proxy_ca, &[])));
    assert_eq!(authn.authenticate(Some(&stranger), &h).map(|u| u.name), Some("alice".into()));

    // Configured header names.
    let custom = RequestHeaderConfig::new(
        bundle(&proxy_ca),
        &[],
        &strings(&["X-User", "X-Remote-User"]),
        &[],
        &strings(&["X-Groups"]),
        &strings(&["X-Extra-"]),
    )
    .expect("config");
    trust.set_request_header(Some(custom));
    let h2 = proxy_headers(&[("X-Remote-User", "second"), ("X-User", "first"), ("X-Groups", "g"), ("X-Extra-K", "v")]);
    let got = authn.authenticate(Some(&proxy), &h2).expect("identity");
    assert_eq!((got.name.as_str(), got.groups.clone()), ("first", strings(&["g", GROUP_AUTHENTICATED])));
    assert_eq!(got.extra.get("k"), Some(&strings(&["v"])));
}

#[test]
fn identity_headers_are_stripped() {
    let proxy_ca = CertAuthority::generate("front-proxy-ca").expect("ca");
    let trust = Arc::new(ClientTrust::new());
    let authn = Authenticator::new().with_trust(trust.clone());
    let mut h = proxy_headers(&[
        ("X-Remote-User", "a"),
        ("X-Remote-Uid", "u"),
        ("X-Remote-Group", "g"),
        ("X-Remote-Extra-Foo", "f"),
        ("X-User", "b"),
        ("X-Extra-Bar", "b"),
        ("Accept", "application/json"),
    ]);
    // Without any request-header configuration, the default names are still removed.
    authn.strip_request_headers(&mut h);
    let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
    names.sort();
    assert_eq!(names, ["accept", "x-extra-bar", "x-user"]);
    let custom =
        RequestHeaderConfig::new(bundle(&proxy_ca), &[], &strings(&["X-User"]), &[], &[], &strings(&["X-Extra-"]))
            .expect("config");
    trust.set_request_header(Some(custom));
    authn.strip_request_headers(&mut h);
    assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["accept"]);
}

#[derive(Debug, Default)]
struct Reviewer {
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl TokenAuthenticator for Reviewer {
    async fn authenticate_token(&self, token: &str) -> crate::auth::Result<Option<UserInfo>> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match token {
            "reviewed" => Ok(Some(user("dave", "d", &["team"]))),
            "broken" => Err(crate::auth::Error::Invalid("connection refused".into())),
            _ => Ok(None),
        }
    }
}

#[tokio::test]
async fn token_review_after_local_methods() {
    let reviewer = Arc::new(Reviewer::default());
    let authn = Authenticator::new()
        .with_tokens(StaticTokens::parse("t1,bob,1\n").expect("parse"))
        .with_token_review(reviewer.clone());
    assert_eq!(
        authn.authenticate_request(None, &headers("Bearer reviewed")).await,
        Some(user("dave", "d", &["team", GROUP_AUTHENTICATED]))
    );
    assert_eq!(authn.authenticate_request(None, &headers("Bearer t1")).await.map(|u| u.name), Some("bob".into()));
    assert_eq!(authn.authenticate_request(None, &headers("Bearer nope")).await, None);
    assert_eq!(authn.authenticate_request(None, &headers("Bearer broken")).await, None);
    assert_eq!(authn.authenticate_request(None, &HeaderMap::new()).await, None);
    // The static token never reached the reviewer; no token, no review.
    assert_eq!(reviewer.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[test]
fn extra_key_unescaping() {
    assert_eq!(unescape_extra_key("acme.com%2fproject"), "acme.com/project");
    assert_eq!(unescape_extra_key("a%20b"), "a b");
    assert_eq!(unescape_extra_key("plain+key"), "plain+key");
    assert_eq!(unescape_extra_key("bad%2"), "bad%2");
    assert_eq!(unescape_extra_key("bad%zz"), "bad%zz");
    assert_eq!(unescape_extra_key("%ff"), "%ff");
}

#[test]
fn user_info_json() {
    let json = serde_json::to_value(user("a", "u", &["g"])).expect("json");
    assert_eq!(json, serde_json::json!({"name": "a", "uid": "u", "groups": ["g"], "extra": {}}));
}

//! Request authentication, as kube-apiserver does it.
//!
//! Credentials are tried in order:
//! 1. a client certificate, already verified by rustls against the client CA during the TLS
//!    handshake ([`PeerCertificates`]): CN is the user name, each O a group;
//! 2. `Authorization: Bearer <token>`, looked up in a static token file
//!    (`--token-auth-file` format).
//!
//! Every authenticated user is in the group `system:authenticated`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

use axum::http::{header, HeaderMap};
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{Error, Result};

/// The group every authenticated user belongs to.
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";

/// An authenticated user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// Adds `system:authenticated` unless already present.
    fn with_authenticated_group(mut self) -> Self {
        if !self.groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
            self.groups.push(GROUP_AUTHENTICATED.to_string());
        }
        self
    }
}

/// The client's certificate chain (end entity first), verified by rustls during the handshake.
/// The server inserts it into the extensions of every request on that connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificates(pub Vec<CertificateDer<'static>>);

impl PeerCertificates {
    /// The client's own certificate.
    pub fn end_entity(&self) -> Option<&CertificateDer<'static>> {
        self.0.first()
    }
}

/// Authenticates requests from their client certificate or bearer token.
#[derive(Debug, Clone)]
pub struct Authenticator {
    client_certs: bool,
    tokens: Option<StaticTokens>,
}

impl Default for Authenticator {
    fn default() -> Self {
        Self::new()
    }
}

impl Authenticator {
    /// Client certificate authentication only.
    pub fn new() -> Self {
        Authenticator { client_certs: true, tokens: None }
    }

    /// Client certificates plus the static tokens of `path` (kube-apiserver's
    /// `--token-auth-file` format).
    pub fn from_token_file(path: &Path) -> Result<Self> {
        Ok(Self::new().with_tokens(StaticTokens::from_file(path)?))
    }

    /// Adds (replaces) the static token table.
    pub fn with_tokens(mut self, tokens: StaticTokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Enables or disables client certificate authentication (enabled by default).
    pub fn with_client_certs(mut self, enabled: bool) -> Self {
        self.client_certs = enabled;
        self
    }

    /// The user making the request, or `None` when it carries no valid credential.
    pub fn authenticate(&self, peer: Option<&PeerCertificates>, headers: &HeaderMap) -> Option<UserInfo> {
        if self.client_certs {
            if let Some(user) = peer.and_then(PeerCertificates::end_entity).and_then(user_from_certificate) {
                return Some(user.with_authenticated_group());
            }
        }
        if let Some(tokens) = &self.tokens {
            if let Some(user) = bearer_token(headers).and_then(|t| tokens.lookup(t)) {
                return Some(user.clone().with_authenticated_group());
            }
        }
        None
    }
}

/// The user of a client certificate: subject CN as name, subject O values as groups. `None` when
/// the certificate cannot be parsed, has an empty CN or is outside its validity period.
///
/// The certificate's chain must already have been verified (rustls does so in the handshake).
pub fn user_from_certificate(cert: &CertificateDer<'_>) -> Option<UserInfo> {
    let (_, cert) = match x509_parser::parse_x509_certificate(cert) {
        Ok(parsed) => parsed,
        Err(e) => {
            tracing::debug!(error = %e, "cannot parse client certificate");
            return None;
        }
    };
    // The chain was verified at handshake time; a long-lived connection may outlive the
    // certificate, so the validity period is checked again for every request.
    if !cert.validity().is_valid() {
        tracing::debug!("client certificate is not valid at this time");
        return None;
    }
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?;
    if name.is_empty() {
        return None;
    }
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_string).collect();
    Some(UserInfo { name: name.to_string(), uid: String::new(), groups, extra: BTreeMap::new() })
}

/// The token of an `Authorization: Bearer <token>` header, parsed as kube-apiserver does
/// (case-insensitive scheme, surrounding whitespace ignored).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A static token table.
///
/// Tokens are stored as SHA-256 digests, so a lookup's timing depends only on the digest of the
/// presented token, never on how much of a valid token it matches.
#[derive(Clone, Default)]
pub struct StaticTokens {
    by_digest: HashMap<[u8; 32], UserInfo>,
}

impl fmt::Debug for StaticTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticTokens").field("len", &self.by_digest.len()).finish()
    }
}

impl StaticTokens {
    /// Reads a token file: CSV lines `token,user,uid[,"group1,group2"]`.
    ///
    /// Blank lines and lines starting with `#` are ignored; fields may be double-quoted (with
    /// `""` as an escaped quote); whitespace around fields is ignored; columns after the fourth
    /// are ignored. A token listed twice keeps its last entry, as in kube-apiserver.
    pub fn from_file(path: &Path) -> Result<Self> {
        let content = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&content).map_err(|e| Error::file(path, e))
    }

    /// Parses the content of a token file (see [`from_file`](Self::from_file)). The error names
    /// the offending line.
    pub fn parse(content: &str) -> std::result::Result<Self, String> {
        let mut tokens = StaticTokens::default();
        let content = content.strip_prefix('\u{feff}').unwrap_or(content);
        for (index, line) in content.lines().enumerate() {
            let line_no = index + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let fields = parse_csv_line(trimmed).map_err(|e| format!("line {line_no}: {e}"))?;
            if fields.len() < 3 {
                return Err(format!(
                    "line {line_no}: expected at least 3 columns (token, user name, uid), found {}",
                    fields.len()
                ));
            }
            let (token, name, uid) = (&fields[0], &fields[1], &fields[2]);
            if token.is_empty() {
                return Err(format!("line {line_no}: empty token"));
            }
            if name.is_empty() {
                return Err(format!("line {line_no}: empty user name"));
            }
            let groups = fields
                .get(3)
                .map(|g| g.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_string).collect())
                .unwrap_or_default();
            let user = UserInfo { name: name.clone(), uid: uid.clone(), groups, extra: BTreeMap::new() };
            if tokens.by_digest.insert(digest(token), user).is_some() {
                tracing::warn!(line = line_no, "duplicate token in token file; the last one wins");
            }
        }
        Ok(tokens)
    }

    /// Inserts a token, replacing any previous user of it.
    pub fn insert(&mut self, token: &str, user: UserInfo) {
        self.by_digest.insert(digest(token), user);
    }

    /// The user of `token`, without the implicit `system:authenticated` group.
    pub fn lookup(&self, token: &str) -> Option<&UserInfo> {
        self.by_digest.get(&digest(token))
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Splits one CSV line into fields. Quoted fields may contain commas and `""` escapes but no line
/// breaks. Unquoted fields are trimmed.
fn parse_csv_line(line: &str) -> std::result::Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        let field_no = fields.len() + 1;
        if chars.next_if_eq(&'"').is_some() {
            let mut field = String::new();
            loop {
                match chars.next() {
                    Some('"') if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err(format!("field {field_no}: unterminated quoted field")),
                }
            }
            while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
            fields.push(field);
            match chars.next() {
                None => return Ok(fields),
                Some(',') => {}
                Some(c) => return Err(format!("field {field_no}: unexpected {c:?} after closing quote")),
            }
        } else {
            let mut field = String::new();
            let mut end = true;
            for c in chars.by_ref() {
                match c {
                    ',' => {
                        end = false;
                        break;
                    }
                    '"' => return Err(format!("field {field_no}: bare \" in unquoted field (quote the whole field)")),
                    c => field.push(c),
                }
            }
            fields.push(field.trim().to_string());
            if end {
                return Ok(fields);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::certs::{issue_client_cert, CertAuthority};
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
            let err = StaticTokens::parse(content).expect_err(content);
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
        assert_eq!(
            authn.authenticate(None, &headers("Bearer t2")),
            Some(user("bob", "2", &[GROUP_AUTHENTICATED, "ops"]))
        );
        assert_eq!(authn.authenticate(None, &headers("Bearer nope")), None);
        assert_eq!(authn.authenticate(None, &HeaderMap::new()), None);
        // Without a token table, bearer tokens are not accepted.
        assert_eq!(Authenticator::new().authenticate(None, &headers("Bearer t1")), None);
    }

    fn peer(cert_pem: &str) -> PeerCertificates {
        PeerCertificates(vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("pem")])
    }

    #[test]
    fn client_certificates() {
        let ca = CertAuthority::generate("ca").expect("ca");
        let (cert, _) = issue_client_cert(&ca, "alice", &["g1", "g2"]).expect("issue");
        let tokens = StaticTokens::parse("t1,bob,1\n").expect("parse");
        let authn = Authenticator::new().with_tokens(tokens);

        let alice = Some(user("alice", "", &["g1", "g2", GROUP_AUTHENTICATED]));
        assert_eq!(authn.authenticate(Some(&peer(&cert)), &HeaderMap::new()), alice);
        // The certificate takes precedence over a token, as in kube-apiserver.
        assert_eq!(authn.authenticate(Some(&peer(&cert)), &headers("Bearer t1")), alice);
        // Disabled client certificate authentication falls through to the token.
        assert_eq!(
            authn
                .clone()
                .with_client_certs(false)
                .authenticate(Some(&peer(&cert)), &headers("Bearer t1"))
                .map(|u| u.name),
            Some("bob".to_string())
        );

        let (no_groups, _) = issue_client_cert::<&str>(&ca, "carol", &[]).expect("issue");
        assert_eq!(
            authn.authenticate(Some(&peer(&no_groups)), &HeaderMap::new()),
            Some(user("carol", "", &[GROUP_AUTHENTICATED]))
        );
        let (empty_cn, _) = issue_client_cert(&ca, "", &["g"]).expect("issue");
        assert_eq!(authn.authenticate(Some(&peer(&empty_cn)), &HeaderMap::new()), None);
        assert_eq!(
            authn.authenticate(Some(&PeerCertificates(vec![CertificateDer::from(vec![1, 2, 3])])), &HeaderMap::new()),
            None
        );
        assert_eq!(authn.authenticate(Some(&PeerCertificates(Vec::new())), &HeaderMap::new()), None);
    }

    #[test]
    fn user_info_json() {
        let json = serde_json::to_value(user("a", "u", &["g"])).expect("json");
        assert_eq!(json, serde_json::json!({"name": "a", "uid": "u", "groups": ["g"], "extra": {}}));
    }
}

//! Request authentication, as k8s.io/apiserver's delegating authenticator does it.
//!
//! Credentials are tried in order; the first that yields a user wins:
//! 1. **front proxy**: a client certificate that chains to the request-header CA, with a common name in the allowed
//!    names, vouches for the identity in the request headers (`X-Remote-User`, every `X-Remote-Group` line,
//!    `X-Remote-Extra-<key>` with the key lower-cased and percent-decoded, `X-Remote-Uid`; names configurable);
//! 2. **x509**: a client certificate that chains to the client CA: CN is the user name, each O a group;
//! 3. **static tokens**: `Authorization: Bearer <token>` found in `--token-auth-file`;
//! 4. **TokenReview**: any other bearer token, asked of kube-apiserver ([`TokenAuthenticator`]).
//!
//! Every authenticated user is in the group `system:authenticated`. The front-proxy headers are removed from every
//! request ([`Authenticator::strip_request_headers`]) whether or not they were trusted, so nothing behind the
//! authentication layer can mistake a client's own headers for a vouched identity.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderName};
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::trust::{
    ClientTrust, RequestHeaderConfig, TrustState, DEFAULT_EXTRA_HEADERS_PREFIX, DEFAULT_GROUP_HEADER,
    DEFAULT_UID_HEADER, DEFAULT_USERNAME_HEADER,
};
use super::{Error, Result};

/// The group every authenticated user belongs to.
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";
/// The group whose members are allowed everything without asking the authorizer.
pub const GROUP_MASTERS: &str = "system:masters";

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
    pub fn with_authenticated_group(mut self) -> Self {
        if !self.groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
            self.groups.push(GROUP_AUTHENTICATED.to_string());
        }
        self
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The client's certificate chain (end entity first) as presented in the TLS handshake, in which the client
/// proved it holds the key. The server attaches it to every request on that connection (a clone is a reference
/// count); whether it chains to a trusted CA is decided per request ([`ClientTrust::verify`]), and remembered for
/// the connection while the trust bundles are unchanged and the verification is fresh, so that the requests of a
/// keep-alive connection neither hash the chain again nor parse the certificate again.
#[derive(Debug, Clone)]
pub struct PeerCertificates {
    chain: Arc<[CertificateDer<'static>]>,
    memo: Arc<Mutex<Option<PeerMemo>>>,
}

/// What one verification of a connection's chain found.
#[derive(Debug, Clone)]
struct PeerMemo {
    /// The trust bundles verified against.
    state: Arc<TrustState>,
    expires: Instant,
    by_client_ca: bool,
    by_request_header_ca: bool,
    subject: Option<Arc<CertSubject>>,
}

/// The parts of a client certificate authentication reads: subject CN and O values, and the validity period
/// (checked on every request: a keep-alive connection may outlive the certificate).
#[derive(Debug)]
struct CertSubject {
    common_name: String,
    organizations: Vec<String>,
    not_before: i64,
    not_after: i64,
}

impl CertSubject {
    fn parse(cert: &CertificateDer<'_>) -> Option<CertSubject> {
        let (_, cert) = match x509_parser::parse_x509_certificate(cert) {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::debug!(error = %e, "cannot parse client certificate");
                return None;
            }
        };
        let subject = cert.subject();
        let common_name = subject.iter_common_name().next().and_then(|a| a.as_str().ok()).unwrap_or("").to_string();
        let organizations = subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_string).collect();
        let validity = cert.validity();
        Some(CertSubject {
            common_name,
            organizations,
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
        })
    }

    fn valid_now(&self) -> bool {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        self.not_before <= now && now <= self.not_after
    }

    /// The x509 user: CN as name, O values as groups (`None` for an empty CN or outside the validity period).
    fn user(&self) -> Option<UserInfo> {
        if !self.valid_now() {
            tracing::debug!("client certificate is not valid at this time");
            return None;
        }
        if self.common_name.is_empty() {
            return None;
        }
        Some(UserInfo {
            name: self.common_name.clone(),
            uid: String::new(),
            groups: self.organizations.clone(),
            extra: BTreeMap::new(),
        })
    }
}

impl PeerCertificates {
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        PeerCertificates { chain: chain.into(), memo: Arc::default() }
    }

    /// The client's own certificate.
    pub fn end_entity(&self) -> Option<&CertificateDer<'static>> {
        self.chain.first()
    }

    /// The chain verified against `trust` as it is now, and the end entity's subject: remembered from an earlier
    /// request of the connection when the bundles have not changed since and the verification is fresh.
    fn verified(&self, trust: &ClientTrust) -> PeerMemo {
        let generation = trust.current().generation;
        let now = Instant::now();
        let mut memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = memo.as_ref().filter(|m| m.state.generation == generation && m.expires > now) {
            return m.clone();
        }
        let v = trust.verify(&self.chain);
        let subject = match memo.as_ref() {
            Some(m) => m.subject.clone(),
            None => self.end_entity().and_then(CertSubject::parse).map(Arc::new),
        };
        let fresh = PeerMemo {
            state: v.state,
            expires: now + PEER_MEMO_TTL,
            by_client_ca: v.by_client_ca,
            by_request_header_ca: v.by_request_header_ca,
            subject,
        };
        *memo = Some(fresh.clone());
        fresh
    }
}

/// How long a connection relies on one verification of its chain (as [`ClientTrust::verify`]'s own cache).
const PEER_MEMO_TTL: Duration = Duration::from_secs(60);

/// Authenticates bearer tokens that are not in the static table (kube-apiserver's TokenReview API). Errors are
/// logged and the request is unauthenticated, as in kube-apiserver.
#[async_trait::async_trait]
pub trait TokenAuthenticator: Send + Sync + fmt::Debug {
    /// The user of `token` (without `system:authenticated`), `Ok(None)` if the token is not valid.
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>>;
}

/// Authenticates requests from their client certificate, front-proxy headers or bearer token.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    trust: Option<Arc<ClientTrust>>,
    tokens: Option<StaticTokens>,
    token_review: Option<Arc<dyn TokenAuthenticator>>,
}

impl Authenticator {
    /// Accepts nothing until a method is added.
    pub fn new() -> Self {
        Authenticator::default()
    }

    /// Static tokens of `path` (kube-apiserver's `--token-auth-file` format) only.
    pub fn from_token_file(path: &Path) -> Result<Self> {
        Ok(Self::new().with_tokens(StaticTokens::from_file(path)?))
    }

    /// Client certificates (x509 and front proxy), trusted as `trust` says at the time of each request.
    pub fn with_trust(mut self, trust: Arc<ClientTrust>) -> Self {
        self.trust = Some(trust);
        self
    }

    /// Adds (replaces) the static token table.
    pub fn with_tokens(mut self, tokens: StaticTokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Bearer tokens not in the static table are asked of `reviewer`.
    pub fn with_token_review(mut self, reviewer: Arc<dyn TokenAuthenticator>) -> Self {
        self.token_review = Some(reviewer);
        self
    }

    pub fn trust(&self) -> Option<&Arc<ClientTrust>> {
        self.trust.as_ref()
    }

    /// Whether a cluster authenticates for us (TokenReview): what a server behind kube-apiserver's aggregator, or
    /// with `--authentication-kubeconfig`, has, and a standalone server has not.
    pub fn delegates(&self) -> bool {
        self.token_review.is_some()
    }

    /// The user of a request, by every method that needs no network call (front proxy, x509, static tokens).
    pub fn authenticate(&self, peer: Option<&PeerCertificates>, headers: &HeaderMap) -> Option<UserInfo> {
        if let (Some(trust), Some(peer)) = (&self.trust, peer) {
            peer.end_entity()?;
            let verified = peer.verified(trust);
            // A certificate that does not parse vouches for nobody; a bearer token may still.
            if let Some(subject) = verified.subject.as_deref() {
                if verified.by_request_header_ca {
                    if let Some(config) = &verified.state.request_header {
                        if let Some(user) = user_from_front_proxy(config, subject, headers) {
                            return Some(user.with_authenticated_group());
                        }
                    }
                }
                if verified.by_client_ca {
                    if let Some(user) = subject.user() {
                        return Some(user.with_authenticated_group());
                    }
                }
            }
        }
        if let Some(tokens) = &self.tokens {
            if let Some(user) = bearer_token(headers).and_then(|t| tokens.lookup(t)) {
                return Some(user.clone().with_authenticated_group());
            }
        }
        None
    }

    /// [`authenticate`](Self::authenticate), then a TokenReview for a bearer token nothing else accepted.
    pub async fn authenticate_request(&self, peer: Option<&PeerCertificates>, headers: &HeaderMap) -> Option<UserInfo> {
        if let Some(user) = self.authenticate(peer, headers) {
            return Some(user);
        }
        let (reviewer, token) = (self.token_review.as_ref()?, bearer_token(headers)?);
        match reviewer.authenticate_token(token).await {
            Ok(user) => user.map(UserInfo::with_authenticated_group),
            Err(e) => {
                tracing::warn!(error = %e, "unable to authenticate the request: token review failed");
                None
            }
        }
    }

    /// Removes the front-proxy headers (the configured names, and kube-apiserver's defaults) from a request.
    pub fn strip_request_headers(&self, headers: &mut HeaderMap) {
        let state = self.trust.as_ref().map(|t| t.current());
        let config = state.as_ref().and_then(|s| s.request_header.as_deref());
        strip_request_headers(config, headers);
    }
}

/// Removes the identity headers of `config` and kube-apiserver's default ones (`X-Remote-User`, `X-Remote-Uid`,
/// `X-Remote-Group`, `X-Remote-Extra-*`).
pub fn strip_request_headers(config: Option<&RequestHeaderConfig>, headers: &mut HeaderMap) {
    for name in [DEFAULT_USERNAME_HEADER, DEFAULT_UID_HEADER, DEFAULT_GROUP_HEADER] {
        headers.remove(name);
    }
    if let Some(c) = config {
        for name in c.username_headers.iter().chain(&c.uid_headers).chain(&c.group_headers) {
            headers.remove(name);
        }
    }
    // Header names are lower case; so are the configured prefixes.
    let is_extra = |k: &HeaderName| {
        let k = k.as_str();
        let default = DEFAULT_EXTRA_HEADERS_PREFIX.len();
        k.len() >= default && k[..default].eq_ignore_ascii_case(DEFAULT_EXTRA_HEADERS_PREFIX)
            || config.is_some_and(|c| c.extra_prefixes.iter().any(|p| k.starts_with(p.as_str())))
    };
    if headers.keys().any(is_extra) {
        let extra: Vec<HeaderName> = headers.keys().filter(|k| is_extra(k)).cloned().collect();
        for name in extra {
            headers.remove(name);
        }
    }
}

/// The identity a verified front-proxy certificate vouches for: `None` when its CN is not allowed or no user name
/// header is set (then other methods are tried, as in k8s.io/apiserver).
fn user_from_front_proxy(config: &RequestHeaderConfig, cert: &CertSubject, headers: &HeaderMap) -> Option<UserInfo> {
    if !cert.valid_now() {
        return None;
    }
    let cn = cert.common_name.as_str();
    if !config.allows(cn) {
        tracing::debug!(cn, "front-proxy certificate is not in the allowed names");
        return None;
    }
    let first =
        |names: &[HeaderName]| names.iter().find_map(|n| headers.get(n).map(header_text).filter(|v| !v.is_empty()));
    let name = first(&config.username_headers)?;
    let uid = first(&config.uid_headers).unwrap_or_default();
    let groups = config
        .group_headers
        .iter()
        .flat_map(|n| headers.get_all(n).iter().map(header_text))
        .filter(|g| !g.is_empty())
        .collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for prefix in &config.extra_prefixes {
        for (key, value) in headers.iter() {
            if let Some(rest) = key.as_str().strip_prefix(prefix.as_str()) {
                extra.entry(unescape_extra_key(rest)).or_default().push(header_text(value));
            }
        }
    }
    Some(UserInfo { name, uid, groups, extra })
}

fn header_text(value: &axum::http::HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// Go's `url.PathUnescape` of an (already lower-cased) extra key; a malformed escape keeps the key as sent.
fn unescape_extra_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            match (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => return key.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_string())
}

/// The user of a client certificate: subject CN as name, subject O values as groups. `None` when
/// the certificate cannot be parsed, has an empty CN or is outside its validity period.
///
/// The certificate's chain must already have been verified against the client CA ([`ClientTrust::verify`]).
pub fn user_from_certificate(cert: &CertificateDer<'_>) -> Option<UserInfo> {
    CertSubject::parse(cert)?.user()
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
        Self::parse(&content).map_err(|e| Error::file(path, e.to_string()))
    }

    /// Parses the content of a token file (see [`from_file`](Self::from_file)). The error names
    /// the offending line.
    pub fn parse(content: &str) -> Result<Self> {
        let mut tokens = StaticTokens::default();
        let content = content.strip_prefix('\u{feff}').unwrap_or(content);
        for (index, line) in content.lines().enumerate() {
            let line_no = index + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let fields = parse_csv_line(trimmed).map_err(|e| Error::Invalid(format!("line {line_no}: {e}")))?;
            if fields.len() < 3 {
                return Err(Error::Invalid(format!(
                    "line {line_no}: expected at least 3 columns (token, user name, uid), found {}",
                    fields.len()
                )));
            }
            let (token, name, uid) = (&fields[0], &fields[1], &fields[2]);
            if token.is_empty() {
                return Err(Error::Invalid(format!("line {line_no}: empty token")));
            }
            if name.is_empty() {
                return Err(Error::Invalid(format!("line {line_no}: empty user name")));
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
fn parse_csv_line(line: &str) -> Result<Vec<String>> {
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
                    None => return Err(Error::Invalid(format!("field {field_no}: unterminated quoted field"))),
                }
            }
            while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
            fields.push(field);
            match chars.next() {
                None => return Ok(fields),
                Some(',') => {}
                Some(c) => {
                    return Err(Error::Invalid(format!("field {field_no}: unexpected {c:?} after closing quote")))
                }
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
                    '"' => {
                        return Err(Error::Invalid(format!(
                            "field {field_no}: bare \" in unquoted field (quote the whole field)"
                        )))
                    }
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
#[path = "authn_tests.rs"]
mod tests;

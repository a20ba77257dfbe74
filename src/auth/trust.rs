//! Which CAs client certificates are trusted for, reloadable at run time.
//!
//! Two bundles, as in k8s.io/apiserver: the **client CA** (x509 client certificates: CN user, O groups) and the
//! **request-header CA** (the front proxy, i.e. kube-apiserver's aggregator, whose certificate vouches for the
//! identity in the X-Remote-* headers). Like Go's `tls.RequestClientCert`, the TLS layer only requests a certificate
//! and checks that the client holds its key ([`crate::auth::tls::ClientCertRequester`]); the authenticator then
//! verifies the chain against each bundle here, per request, so a rotated bundle applies to the next request.
//!
//! The bundles come from files (`--client-ca-file`, `--requestheader-client-ca-file`) or from the
//! `kube-system/extension-apiserver-authentication` ConfigMap, and are replaced with [`ClientTrust::set_client_ca`]
//! and [`ClientTrust::set_request_header`] when those change.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::http::HeaderName;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{DistinguishedName, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest, Sha256};

use super::{Error, Result};

/// kube-apiserver's conventional front-proxy header names (the defaults of `--requestheader-*-headers`).
pub const DEFAULT_USERNAME_HEADER: &str = "X-Remote-User";
pub const DEFAULT_UID_HEADER: &str = "X-Remote-Uid";
pub const DEFAULT_GROUP_HEADER: &str = "X-Remote-Group";
pub const DEFAULT_EXTRA_HEADERS_PREFIX: &str = "X-Remote-Extra-";

/// A CA bundle that client certificate chains are verified against (clientAuth usage required, as in Go).
pub struct CaBundle {
    digest: [u8; 32],
    /// The CA certificates themselves, for the v1 client certificates webpki refuses ([`super::x509v1`]).
    anchors: Vec<CertificateDer<'static>>,
    subjects: Vec<DistinguishedName>,
    verifier: Arc<dyn ClientCertVerifier>,
    len: usize,
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaBundle").field("certificates", &self.len).finish_non_exhaustive()
    }
}

impl CaBundle {
    /// Parses a PEM bundle (at least one certificate).
    pub fn from_pem(pem: &[u8]) -> Result<Self> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Invalid(format!("reading PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(Error::Invalid("no PEM certificate found".into()));
        }
        let mut roots = RootCertStore::empty();
        for cert in &certs {
            roots.add(cert.clone()).map_err(|e| Error::Invalid(format!("invalid CA certificate: {e}")))?;
        }
        let subjects = roots.subjects();
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::crypto_provider())
            .build()
            .map_err(|e| Error::Invalid(format!("CA bundle: {e}")))?;
        let len = certs.len();
        Ok(CaBundle { digest: Sha256::digest(pem).into(), subjects, verifier, anchors: certs, len })
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let pem = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_pem(&pem).map_err(|e| Error::file(path, e.to_string()))
    }

    /// Whether `chain` (end entity first) chains to this bundle now. A v1 end entity, which webpki refuses, is
    /// accepted when a CA of the bundle issued it, as Go's crypto/x509 (kube-apiserver) accepts it.
    pub fn verifies(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some((end_entity, intermediates)) = chain.split_first() else { return false };
        let now = UnixTime::now();
        self.verifier.verify_client_cert(end_entity, intermediates, now).is_ok()
            || super::x509v1::issued_by_anchor(
                end_entity,
                &self.anchors,
                &super::crypto_provider().signature_verification_algorithms,
                now,
            )
    }

    /// SHA-256 of the PEM it was read from: equal digests, equal bundles.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    pub fn subjects(&self) -> &[DistinguishedName] {
        &self.subjects
    }
}

/// The front proxy's trust and header names (kube-apiserver's `--requestheader-*` flags, which it also publishes in
/// the extension-apiserver-authentication ConfigMap).
#[derive(Debug)]
pub struct RequestHeaderConfig {
    pub ca: CaBundle,
    /// Common names a front-proxy certificate may have; empty: any certificate of the CA.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<HeaderName>,
    pub uid_headers: Vec<HeaderName>,
    pub group_headers: Vec<HeaderName>,
    /// Lower-cased.
    pub extra_prefixes: Vec<String>,
}

impl RequestHeaderConfig {
    /// A configuration from string lists; invalid header names are an error, empty entries are ignored.
    pub fn new(
        ca: CaBundle,
        allowed_names: &[String],
        username_headers: &[String],
        uid_headers: &[String],
        group_headers: &[String],
        extra_prefixes: &[String],
    ) -> Result<Self> {
        let names = |list: &[String]| -> Result<Vec<HeaderName>> {
            list.iter()
                .map(|h| h.trim())
                .filter(|h| !h.is_empty())
                .map(|h| HeaderName::try_from(h).map_err(|_| Error::Invalid(format!("invalid header name {h:?}"))))
                .collect()
        };
        Ok(RequestHeaderConfig {
            ca,
            allowed_names: allowed_names.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect(),
            username_headers: names(username_headers)?,
            uid_headers: names(uid_headers)?,
            group_headers: names(group_headers)?,
            extra_prefixes: extra_prefixes
                .iter()
                .map(|p| p.trim().to_ascii_lowercase())
                .filter(|p| !p.is_empty())
                .collect(),
        })
    }

    /// Whether `cn` may act as a front proxy.
    pub fn allows(&self, cn: &str) -> bool {
        self.allowed_names.is_empty() || self.allowed_names.iter().any(|n| n == cn)
    }
}

/// The trust in effect at one moment.
#[derive(Debug, Default)]
pub struct TrustState {
    /// Increases with every change; cached verifications of older generations are ignored.
    pub generation: u64,
    pub client_ca: Option<Arc<CaBundle>>,
    pub request_header: Option<Arc<RequestHeaderConfig>>,
}

/// Which bundles a certificate chain verified against.
#[derive(Debug, Clone)]
pub struct Verified {
    pub state: Arc<TrustState>,
    pub by_client_ca: bool,
    pub by_request_header_ca: bool,
}

const VERIFY_CACHE_CAPACITY: usize = 4096;
/// Verifications are cached briefly: a chain verification costs a signature check, a lookup far less. The
/// certificate's validity period is still checked on every request ([`crate::auth::authn::user_from_certificate`]).
const VERIFY_CACHE_TTL: Duration = Duration::from_secs(60);

/// (trust generation, expiry, verified by the client CA, verified by the request-header CA)
type CachedVerification = (u64, Instant, bool, bool);

/// The client CA and request-header configuration, replaceable at run time.
pub struct ClientTrust {
    state: RwLock<Arc<TrustState>>,
    generation: AtomicU64,
    /// The CA subjects sent in the TLS CertificateRequest (union of both bundles; Go clients, kube-apiserver
    /// included, send a certificate only when its issuer is listed). rustls borrows them for the verifier's
    /// lifetime, so each distinct list is leaked once: a few hundred bytes per CA rotation.
    hints: RwLock<&'static [DistinguishedName]>,
    verified: Mutex<HashMap<[u8; 32], CachedVerification>>,
}

impl fmt::Debug for ClientTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTrust").field("state", &self.current()).finish_non_exhaustive()
    }
}

impl Default for ClientTrust {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientTrust {
    /// No CA at all: every certificate is untrusted until a bundle is set.
    pub fn new() -> Self {
        ClientTrust {
            state: RwLock::new(Arc::new(TrustState::default())),
            generation: AtomicU64::new(0),
            hints: RwLock::new(&[]),
            verified: Mutex::new(HashMap::new()),
        }
    }

    pub fn current(&self) -> Arc<TrustState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn hints(&self) -> &'static [DistinguishedName] {
        *self.hints.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the client CA (`None`: x509 client certificates are not accepted).
    pub fn set_client_ca(&self, ca: Option<CaBundle>) {
        self.update(|old| TrustState {
            generation: 0,
            client_ca: ca.map(Arc::new),
            request_header: old.request_header.clone(),
        });
    }

    /// Replaces the front-proxy configuration (`None`: request headers are never trusted).
    pub fn set_request_header(&self, config: Option<RequestHeaderConfig>) {
        self.update(|old| TrustState {
            generation: 0,
            client_ca: old.client_ca.clone(),
            request_header: config.map(Arc::new),
        });
    }

    fn update(&self, f: impl FnOnce(&TrustState) -> TrustState) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = f(&state);
        next.generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let subjects: Vec<DistinguishedName> = next
            .client_ca
            .iter()
            .flat_map(|c| c.subjects().iter())
            .chain(next.request_header.iter().flat_map(|r| r.ca.subjects().iter()))
            .fold(Vec::new(), |mut acc, s| {
                if !acc.iter().any(|a: &DistinguishedName| a.as_ref() == s.as_ref()) {
                    acc.push(s.clone());
                }
                acc
            });
        {
            let mut hints = self.hints.write().unwrap_or_else(PoisonError::into_inner);
            let unchanged =
                hints.len() == subjects.len() && hints.iter().zip(&subjects).all(|(a, b)| a.as_ref() == b.as_ref());
            if !unchanged {
                *hints = Box::leak(subjects.into_boxed_slice());
            }
        }
        *state = Arc::new(next);
        self.verified.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Verifies `chain` (end entity first) against both bundles of the current state.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> Verified {
        let state = self.current();
        if chain.is_empty() {
            return Verified { state, by_client_ca: false, by_request_header_ca: false };
        }
        let mut hasher = Sha256::new();
        for cert in chain {
            hasher.update((cert.len() as u64).to_be_bytes());
            hasher.update(cert.as_ref());
        }
        let key: [u8; 32] = hasher.finalize().into();
        let now = Instant::now();
        if let Some((generation, expires, client, front)) =
            self.verified.lock().unwrap_or_else(PoisonError::into_inner).get(&key).copied()
        {
            if generation == state.generation && expires > now {
                return Verified { state, by_client_ca: client, by_request_header_ca: front };
            }
        }
        let client = state.client_ca.as_ref().is_some_and(|ca| ca.verifies(chain));
        let front = state.request_header.as_ref().is_some_and(|rh| rh.ca.verifies(chain));
        let mut cache = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= VERIFY_CACHE_CAPACITY {
            cache.retain(|_, (generation, expires, _, _)| *generation == state.generation && *expires > now);
            if cache.len() >= VERIFY_CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(key, (state.generation, now + VERIFY_CACHE_TTL, client, front));
        Verified { state, by_client_ca: client, by_request_header_ca: front }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::certs::{issue_client_cert, issue_serving_cert, CertAuthority};

    fn chain(pem: &str) -> Vec<CertificateDer<'static>> {
        vec![CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")]
    }

    fn rh(ca: &CertAuthority, allowed: &[&str]) -> RequestHeaderConfig {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        RequestHeaderConfig::new(
            CaBundle::from_pem(ca.cert_pem().as_bytes()).expect("bundle"),
            &list(allowed),
            &list(&[DEFAULT_USERNAME_HEADER]),
            &list(&[DEFAULT_UID_HEADER]),
            &list(&[DEFAULT_GROUP_HEADER]),
            &list(&[DEFAULT_EXTRA_HEADERS_PREFIX]),
        )
        .expect("config")
    }

    #[test]
    fn verifies_against_each_bundle_and_follows_changes() {
        let client_ca = CertAuthority::generate("client-ca").expect("ca");
        let proxy_ca = CertAuthority::generate("front-proxy-ca").expect("ca");
        let other = CertAuthority::generate("other").expect("ca");
        let user = chain(&issue_client_cert(&client_ca, "alice", &["g"]).expect("issue").0);
        let proxy = chain(&issue_client_cert::<&str>(&proxy_ca, "front-proxy-client", &[]).expect("issue").0);
        let stranger = chain(&issue_client_cert::<&str>(&other, "mallory", &[]).expect("issue").0);
        let serving = chain(&issue_serving_cert(&client_ca, &["localhost".into()]).expect("issue").0);

        let trust = ClientTrust::new();
        assert!(trust.hints().is_empty());
        let v = trust.verify(&user);
        assert!(!v.by_client_ca && !v.by_request_header_ca);

        trust.set_client_ca(Some(CaBundle::from_pem(client_ca.cert_pem().as_bytes()).expect("bundle")));
        trust.set_request_header(Some(rh(&proxy_ca, &["front-proxy-client"])));
        assert_eq!(trust.hints().len(), 2);
        let v = trust.verify(&user);
        assert!(v.by_client_ca && !v.by_request_header_ca);
        let v = trust.verify(&proxy);
        assert!(!v.by_client_ca && v.by_request_header_ca);
        assert!(v.state.request_header.as_ref().expect("rh").allows("front-proxy-client"));
        assert!(!v.state.request_header.as_ref().expect("rh").allows("someone"));
        let v = trust.verify(&stranger);
        assert!(!v.by_client_ca && !v.by_request_header_ca);
        // A serving certificate lacks the clientAuth usage.
        assert!(!trust.verify(&serving).by_client_ca);
        // Cached answers follow a change of the bundles.
        assert!(trust.verify(&user).by_client_ca);
        trust.set_client_ca(Some(CaBundle::from_pem(other.cert_pem().as_bytes()).expect("bundle")));
        assert!(!trust.verify(&user).by_client_ca);
        assert!(trust.verify(&stranger).by_client_ca);
        trust.set_request_header(None);
        assert!(!trust.verify(&proxy).by_request_header_ca);
        assert_eq!(trust.hints().len(), 1);
    }

    #[test]
    fn bundle_errors() {
        assert!(CaBundle::from_pem(b"").is_err());
        assert!(CaBundle::from_pem(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err());
        let ca = CertAuthority::generate("ca").expect("ca");
        let two = format!("{}{}", ca.cert_pem(), CertAuthority::generate("ca2").expect("ca").cert_pem());
        assert_eq!(CaBundle::from_pem(two.as_bytes()).expect("two").subjects().len(), 2);
        let bad_header = RequestHeaderConfig::new(
            CaBundle::from_pem(ca.cert_pem().as_bytes()).expect("bundle"),
            &[],
            &["bad header".to_string()],
            &[],
            &[],
            &[],
        );
        assert!(bad_header.is_err());
    }
}

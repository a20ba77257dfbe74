//! The rustls server configuration.
//!
//! The serving certificate is provided by [`ReloadableCertResolver`], which re-reads its files on
//! [`reload`](ReloadableCertResolver::reload) without rebuilding the `ServerConfig`, so new connections pick up a
//! rotated certificate while existing connections are unaffected.
//!
//! Client certificates are *requested*, never required, and not chain-verified during the handshake: like Go's
//! `tls.RequestClientCert` in k8s.io/apiserver, [`ClientCertRequester`] only checks that the client holds the key of
//! the certificate it presents. Which CA (client CA or front-proxy CA) a chain belongs to is decided per request by
//! the authenticator against the current [`ClientTrust`]; a certificate of an unknown CA therefore gets a 401, not a
//! failed handshake, and a rotated CA applies to the next request. The CertificateRequest lists the subjects of both
//! CAs, because Go clients (kube-apiserver's proxy and webhook clients, kubectl) only send a certificate whose issuer
//! is listed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use super::trust::{CaBundle, ClientTrust};
use super::x509v1::is_pre_v3;
use super::{Error, Result};

/// ALPN protocols offered by the server, in order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

pub use super::{crypto_provider, install_default_crypto_provider};

/// Builds the server TLS configuration: TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`, the serving
/// certificate from `serving_cert`/`serving_key` (PEM; the certificate file may hold a chain),
/// and, with `client_ca`, client certificates requested (not required) with that CA bundle as the
/// trust for x509 client certificate authentication.
pub fn server_config(serving_cert: &Path, serving_key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>> {
    Ok(reloadable_server_config(serving_cert, serving_key, client_ca)?.0)
}

/// Like [`server_config`], also returning the handle that reloads the certificate files.
pub fn reloadable_server_config(
    serving_cert: &Path,
    serving_key: &Path,
    client_ca: Option<&Path>,
) -> Result<(Arc<ServerConfig>, TlsReloader)> {
    let resolver = Arc::new(ReloadableCertResolver::load(serving_cert, serving_key, crypto_provider())?);
    let trust = match client_ca {
        Some(path) => {
            let trust = Arc::new(ClientTrust::new());
            trust.set_client_ca(Some(CaBundle::from_file(path)?));
            Some(trust)
        }
        None => None,
    };
    let config = server_config_with(resolver.clone(), trust.clone())?;
    let reloader = TlsReloader { serving: resolver, trust, client_ca_path: client_ca.map(Path::to_path_buf) };
    Ok((config, reloader))
}

/// The server configuration around a serving certificate resolver and, when given, the client trust that client
/// certificates are requested for (without a trust, no client certificate is requested).
pub fn server_config_with(
    resolver: Arc<ReloadableCertResolver>,
    trust: Option<Arc<ClientTrust>>,
) -> Result<Arc<ServerConfig>> {
    let provider = crypto_provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match trust {
        Some(trust) => builder.with_client_cert_verifier(Arc::new(ClientCertRequester::new(trust, provider))),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Reloads the serving certificate and the client CA file of a configuration built by
/// [`reloadable_server_config`].
#[derive(Debug, Clone)]
pub struct TlsReloader {
    pub serving: Arc<ReloadableCertResolver>,
    /// The trust client certificates are verified against by the authenticator.
    pub trust: Option<Arc<ClientTrust>>,
    client_ca_path: Option<PathBuf>,
}

impl TlsReloader {
    /// Re-reads all files. Each part is reloaded independently; when one fails, it keeps its
    /// previous state and the first error is returned.
    pub fn reload(&self) -> Result<()> {
        let serving = self.serving.reload();
        serving.and(self.reload_client_ca())
    }

    /// Re-reads the client CA file. On error the current bundle stays in use.
    pub fn reload_client_ca(&self) -> Result<()> {
        if let (Some(trust), Some(path)) = (&self.trust, &self.client_ca_path) {
            trust.set_client_ca(Some(CaBundle::from_file(path)?));
            tracing::info!(path = %path.display(), "reloaded client CA");
        }
        Ok(())
    }
}

/// Serves the current serving certificate, which [`reload`](Self::reload) replaces.
pub struct ReloadableCertResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl fmt::Debug for ReloadableCertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadableCertResolver")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadableCertResolver {
    pub fn load(cert_path: &Path, key_path: &Path, provider: Arc<CryptoProvider>) -> Result<Self> {
        let key = load_certified_key(cert_path, key_path, &provider)?;
        Ok(ReloadableCertResolver {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(key)),
        })
    }

    /// Re-reads the certificate and key files. On error the current certificate stays in use.
    pub fn reload(&self) -> Result<()> {
        let key = load_certified_key(&self.cert_path, &self.key_path, &self.provider)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
        tracing::info!(path = %self.cert_path.display(), "reloaded serving certificate");
        Ok(())
    }

    /// The certificate currently served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl ResolvesServerCert for ReloadableCertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Requests a client certificate and checks that the client holds its private key (the handshake signature), but
/// leaves chain verification to the authenticator (see the module documentation). A certificate that cannot even be
/// parsed fails the handshake. The key of an X.509 v1 certificate, which rustls's own check refuses to read
/// (`UnsupportedCertVersion`), is read by [`super::x509v1`]: kube-apiserver accepts v1 client certificates.
pub struct ClientCertRequester {
    trust: Arc<ClientTrust>,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for ClientCertRequester {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertRequester").field("trust", &self.trust).finish_non_exhaustive()
    }
}

impl ClientCertRequester {
    pub fn new(trust: Arc<ClientTrust>, provider: Arc<CryptoProvider>) -> Self {
        ClientCertRequester { trust, provider }
    }
}

impl ClientCertVerifier for ClientCertRequester {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.trust.hints()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match x509_parser::parse_x509_certificate(end_entity) {
            Ok(_) => Ok(ClientCertVerified::assertion()),
            Err(_) => Err(rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs).or_else(|e| match is_pre_v3(cert) {
            true => super::x509v1::verify_tls12_signature(message, cert, dss, algs),
            false => Err(e),
        })
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs).or_else(|e| match is_pre_v3(cert) {
            true => super::x509v1::verify_tls13_signature(message, cert, dss, algs),
            false => Err(e),
        })
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Reads all certificates of a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::file(path, format!("reading PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(Error::file(path, "no PEM certificate found"));
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| Error::file(path, format!("reading PEM private key: {e}")))
}

fn load_certified_key(cert_path: &Path, key_path: &Path, provider: &CryptoProvider) -> Result<CertifiedKey> {
    let certs = load_certs(cert_path)?;
    let key = load_private_key(key_path)?;
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| Error::file(cert_path, format!("does not form a usable pair with {}: {e}", key_path.display())))
}

//! The rustls server configuration.
//!
//! The serving certificate is provided by [`ReloadableCertResolver`] and client certificates are
//! verified by [`ReloadableClientVerifier`]; both re-read their files on [`reload`] without
//! rebuilding the `ServerConfig`, so that new connections pick up rotated certificates while
//! existing connections are unaffected.
//!
//! [`reload`]: TlsReloader::reload

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use super::{Error, Result};

/// ALPN protocols offered by the server, in order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The crypto provider used throughout (ring).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process-wide default rustls provider, for code that builds rustls
/// configurations without an explicit provider (e.g. `kube::Client`). Harmless when a default is
/// already installed.
pub fn install_default_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the server TLS configuration: TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`, the serving
/// certificate from `serving_cert`/`serving_key` (PEM; the certificate file may hold a chain),
/// and, with `client_ca`, client certificates requested (not required) and verified against that
/// CA bundle.
pub fn server_config(serving_cert: &Path, serving_key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>> {
    Ok(reloadable_server_config(serving_cert, serving_key, client_ca)?.0)
}

/// Like [`server_config`], also returning the handle that reloads the certificate files.
pub fn reloadable_server_config(
    serving_cert: &Path,
    serving_key: &Path,
    client_ca: Option<&Path>,
) -> Result<(Arc<ServerConfig>, TlsReloader)> {
    let provider = crypto_provider();
    let resolver = Arc::new(ReloadableCertResolver::load(serving_cert, serving_key, provider.clone())?);
    let verifier =
        client_ca.map(|ca| ReloadableClientVerifier::load(ca, provider.clone()).map(Arc::new)).transpose()?;

    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match &verifier {
        Some(v) => builder.with_client_cert_verifier(v.clone()),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver.clone());
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();

    let reloader = TlsReloader { serving: resolver, client_ca: verifier };
    Ok((Arc::new(config), reloader))
}

/// Reloads the serving certificate and the client CA of a configuration built by
/// [`reloadable_server_config`].
#[derive(Debug, Clone)]
pub struct TlsReloader {
    pub serving: Arc<ReloadableCertResolver>,
    pub client_ca: Option<Arc<ReloadableClientVerifier>>,
}

impl TlsReloader {
    /// Re-reads all files. Each part is reloaded independently; when one fails, it keeps its
    /// previous state and the first error is returned.
    pub fn reload(&self) -> Result<()> {
        let serving = self.serving.reload();
        let client_ca = match &self.client_ca {
            Some(v) => v.reload(),
            None => Ok(()),
        };
        serving.and(client_ca)
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

/// Verifies client certificates against a CA bundle that [`reload`](Self::reload) replaces.
///
/// Client certificates are requested but optional: a client without one completes the handshake
/// (and is then authenticated by other means or not at all), while a client presenting a
/// certificate that does not verify fails the handshake.
pub struct ReloadableClientVerifier {
    ca_path: PathBuf,
    provider: Arc<CryptoProvider>,
    inner: RwLock<Arc<dyn ClientCertVerifier>>,
    /// The CA subjects sent in the CertificateRequest. rustls borrows them from the verifier, so
    /// they must outlive any lock guard: each distinct list is leaked once. That bounds the
    /// leak by the number of CA bundle changes, a few hundred bytes per rotation.
    hints: RwLock<&'static [DistinguishedName]>,
}

impl fmt::Debug for ReloadableClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadableClientVerifier").field("ca_path", &self.ca_path).finish_non_exhaustive()
    }
}

impl ReloadableClientVerifier {
    pub fn load(ca_path: &Path, provider: Arc<CryptoProvider>) -> Result<Self> {
        let inner = build_client_verifier(ca_path, &provider)?;
        let hints: &'static [DistinguishedName] = Box::leak(inner.root_hint_subjects().to_vec().into_boxed_slice());
        Ok(ReloadableClientVerifier {
            ca_path: ca_path.to_path_buf(),
            provider,
            inner: RwLock::new(inner),
            hints: RwLock::new(hints),
        })
    }

    /// Re-reads the CA bundle. On error the current bundle stays in use.
    pub fn reload(&self) -> Result<()> {
        let inner = build_client_verifier(&self.ca_path, &self.provider)?;
        {
            let mut hints = self.hints.write().unwrap_or_else(PoisonError::into_inner);
            let new_hints = inner.root_hint_subjects();
            let unchanged =
                hints.len() == new_hints.len() && hints.iter().zip(new_hints).all(|(a, b)| a.as_ref() == b.as_ref());
            if !unchanged {
                *hints = Box::leak(inner.root_hint_subjects().to_vec().into_boxed_slice());
            }
        }
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = inner;
        tracing::info!(path = %self.ca_path.display(), "reloaded client CA");
        Ok(())
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl ClientCertVerifier for ReloadableClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.current().offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.current().client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        *self.hints.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.current().requires_raw_public_keys()
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

fn build_client_verifier(ca_path: &Path, provider: &Arc<CryptoProvider>) -> Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca_path)? {
        roots.add(cert).map_err(|e| Error::file(ca_path, format!("invalid CA certificate: {e}")))?;
    }
    Ok(WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?)
}

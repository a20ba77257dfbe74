//! TLS, certificates, authentication and authorization, delegated to kube-apiserver like every aggregated API
//! server's.
//!
//! - [`certs`]: the development CA, serving certificate and admin client certificate generated on
//!   first start, plus the admin kubeconfig.
//! - [`tls`]: the rustls server configuration: a reloadable serving certificate; client certificates requested.
//! - [`trust`]: the client CA and the front-proxy (request header) CA and names, replaceable at run time.
//! - [`x509v1`]: X.509 v1 client certificates, which rustls refuses and kube-apiserver accepts.
//! - [`authn`]: request authentication: front proxy, x509, static tokens, TokenReview.
//! - [`authz`]: request attributes as kube-apiserver derives them; authorization by SubjectAccessReview.
//! - [`impersonation`]: the `Impersonate-*` headers, between authentication and authorization.
//! - [`delegated`]: the calls to kube-apiserver (TokenReview, SubjectAccessReview, the
//!   extension-apiserver-authentication ConfigMap).
//! - [`options`]: the flags, and the assembly of all of the above with its file and ConfigMap watchers.

pub mod authn;
pub mod authz;
pub mod cache;
pub mod certs;
pub mod delegated;
pub mod impersonation;
pub mod options;
pub mod tls;
pub mod trust;
pub mod x509v1;

use rustls::crypto::CryptoProvider;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Errors of the certificate, TLS and authentication setup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The message names the I/O error (not a `source`, so that a chain is not printed twice).
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// A request to kube-apiserver (TokenReview, SubjectAccessReview) or building its client failed.
    #[error("{what}: {error}")]
    Kube { what: &'static str, error: kube::Error },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), error: source }
    }

    pub(crate) fn file(path: &Path, message: impl Into<String>) -> Self {
        Error::File { path: path.to_path_buf(), message: message.into() }
    }
}

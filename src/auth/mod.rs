//! TLS, certificates and authentication.
//!
//! - [`certs`]: the development CA, serving certificate and admin client certificate generated on
//!   first start, plus the admin kubeconfig.
//! - [`tls`]: the rustls server configuration, with a reloadable serving certificate and a
//!   reloadable client-CA verifier.
//! - [`authn`]: request authentication (verified client certificates, static bearer tokens).

pub mod authn;
pub mod certs;
pub mod tls;

use std::path::{Path, PathBuf};

/// Errors of the certificate, TLS and authentication setup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }

    pub(crate) fn file(path: &Path, message: impl Into<String>) -> Self {
        Error::File { path: path.to_path_buf(), message: message.into() }
    }
}

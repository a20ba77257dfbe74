//! The production backend: etcd v3 behind the same `Storage` trait as the embedded store.
//!
//! etcd's revision is the resourceVersion; creates and updates are transactions comparing create_revision /
//! mod_revision; paged lists read at the first page's revision; watches are etcd watches with progress
//! notifications as bookmarks. Keys are `<--etcd-prefix>` + the registry's key without its `/registry` root, so the
//! default prefix gives the same keys as kube-apiserver's.

use std::path::PathBuf;

/// `serve` flags of the etcd backend (named as kube-apiserver's).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EtcdArgs {
    /// etcd v3 endpoints (comma-separated URLs, e.g. https://10.0.0.1:2379); selects the etcd backend instead of
    /// the embedded store.
    #[arg(long = "etcd-servers", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Prefix of every key this server writes in etcd.
    #[arg(long = "etcd-prefix", default_value = "/registry")]
    pub prefix: String,
    /// CA bundle that verifies etcd's serving certificates.
    #[arg(long = "etcd-cafile")]
    pub cafile: Option<PathBuf>,
    /// Client certificate presented to etcd (PEM).
    #[arg(long = "etcd-certfile", requires = "keyfile")]
    pub certfile: Option<PathBuf>,
    /// Key of --etcd-certfile.
    #[arg(long = "etcd-keyfile", requires = "certfile")]
    pub keyfile: Option<PathBuf>,
}

impl EtcdArgs {
    pub fn enabled(&self) -> bool {
        !self.servers.is_empty()
    }

    /// A client for the configured endpoints (TLS when a CA or client certificate is given). The client
    /// reconnects by itself; the first connection must succeed within the timeout.
    pub async fn connect(&self) -> anyhow::Result<etcd_client::Client> {
        use anyhow::Context;
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(5))
            .with_timeout(std::time::Duration::from_secs(30))
            .with_keep_alive(std::time::Duration::from_secs(10), std::time::Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if self.cafile.is_some() || self.certfile.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &self.cafile {
                let pem = std::fs::read(ca).with_context(|| format!("reading --etcd-cafile {}", ca.display()))?;
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            if let (Some(cert), Some(key)) = (&self.certfile, &self.keyfile) {
                let c = std::fs::read(cert).with_context(|| format!("reading --etcd-certfile {}", cert.display()))?;
                let k = std::fs::read(key).with_context(|| format!("reading --etcd-keyfile {}", key.display()))?;
                tls = tls.identity(etcd_client::Identity::from_pem(c, k));
            }
            opts = opts.with_tls(tls);
        }
        etcd_client::Client::connect(&self.servers, Some(opts))
            .await
            .with_context(|| format!("connecting to etcd at {}", self.servers.join(",")))
    }
}

//! Command line: `serve` with kube-apiserver-style flags, and how a server is assembled from them.

use crate::api::kinds;
use crate::auth::authn::{Authenticator, StaticTokens};
use crate::auth::certs::{ensure_dev_certs, DevCertOptions};
use crate::registry::{Registry, RegistryConfig};
use crate::server::metrics::Metrics;
use crate::server::{router, AppState};
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use crate::storage::encryption::{EncryptedStorage, EncryptionConfig};
use crate::storage::Storage;
use clap::{Parser, Subcommand, ValueEnum};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "migration-apiserver", version, about = "Aggregated API server for storage version migration")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the API over TLS.
    Serve(ServeArgs),
    /// Generate the development CA, serving and admin certificates and admin.kubeconfig (existing files are kept).
    Certs(CertsArgs),
    /// Print the CustomResourceDefinitions of the served kinds (the CRD deployment form), or write manifests/crds/.
    Crds(CrdsArgs),
    /// Offline tools for the embedded store (run them while the server is stopped).
    #[command(subcommand)]
    Storage(StorageCommand),
}

#[derive(Subcommand, Debug)]
pub enum StorageCommand {
    /// List the stored keys with their revision, encryption, apiVersion and size (never their values).
    Inspect(InspectArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum InspectOutput {
    Table,
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct InspectArgs {
    /// Directory of the embedded store.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// The server's EncryptionConfiguration: decrypts values in memory to show their apiVersion.
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,
    /// Only keys under this prefix.
    #[arg(long, default_value = "/registry/")]
    pub prefix: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = InspectOutput::Table)]
    pub output: InspectOutput,
}

/// `storage inspect`.
pub fn storage(command: StorageCommand) -> anyhow::Result<()> {
    match command {
        StorageCommand::Inspect(a) => {
            let config = a.encryption_provider_config.as_deref().map(EncryptionConfig::from_file).transpose()?;
            let entries = crate::storage::inspect::inspect(&a.data_dir, config.as_ref(), &a.prefix)?;
            print!(
                "{}",
                match a.output {
                    InspectOutput::Table => crate::storage::inspect::table(&entries),
                    InspectOutput::Json => crate::storage::inspect::json(&entries),
                }
            );
            Ok(())
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct CertsArgs {
    /// Where to write them.
    #[arg(long, default_value = "./certs")]
    pub cert_dir: PathBuf,
    /// Namespace of the in-cluster Service (`migration-apiserver.<ns>.svc`).
    #[arg(long, default_value = "migration-apiserver")]
    pub service_namespace: String,
    /// Server address written into admin.kubeconfig.
    #[arg(long, default_value = "https://127.0.0.1:8443")]
    pub server: String,
    /// Additional subject alternative names (DNS names or IPs); repeatable.
    #[arg(long)]
    pub san: Vec<String>,
}

/// `certs`: the dev certificates without starting a server.
pub fn certs(args: CertsArgs) -> anyhow::Result<()> {
    crate::auth::tls::install_default_crypto_provider();
    let dev = ensure_dev_certs(&DevCertOptions {
        cert_dir: args.cert_dir,
        namespaces: vec![args.service_namespace, "kube-system".into(), "default".into()],
        extra_sans: args.san,
        kubeconfig_server: args.server,
        ..DevCertOptions::default()
    })?;
    println!("CA:          {}", dev.ca_cert_path.display());
    println!("serving:     {} / {}", dev.serving_cert_path.display(), dev.serving_key_path.display());
    println!("kubeconfig:  {}", dev.admin_kubeconfig_path.display());
    Ok(())
}

#[derive(clap::Args, Debug, Clone)]
pub struct CrdsArgs {
    /// Write one file per CRD and a kustomization.yaml here instead of printing them.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
}

/// `crds`: the CRDs generated from the kinds' types (see `server::crd`).
pub fn crds(args: CrdsArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new()).map_err(anyhow::Error::msg)?;
    match args.output_dir {
        Some(dir) => {
            for name in crate::server::crd::write(&kinds, &dir)? {
                println!("{}", dir.join(name).display());
            }
        }
        None => print!("{}", crate::server::crd::stream(&kinds).map_err(anyhow::Error::msg)?),
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The port on which to serve HTTPS.
    #[arg(long, default_value_t = 8443)]
    pub secure_port: u16,
    /// The IP address on which to listen.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    /// Directory of the embedded store.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Directory of the generated certificates and admin.kubeconfig (ignored for serving when
    /// --tls-cert-file is set).
    #[arg(long, default_value = "./certs")]
    pub cert_dir: PathBuf,
    /// Serving certificate (PEM, may include the chain); overrides the generated one.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates are verified against (default: the generated CA).
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Static bearer tokens, in kube-apiserver's CSV format: token,user,uid,"group1,group2".
    #[arg(long)]
    pub token_auth_file: Option<PathBuf>,
    /// Storage version of a resource, `<plural>.<group>=<version>`; repeatable.
    #[arg(long, value_parser = parse_storage_version)]
    pub storage_version: Vec<(String, String)>,
    /// Objects larger than this (encoded) are rejected.
    #[arg(long, default_value_t = 1536 * 1024)]
    pub max_object_bytes: usize,
    /// Events kept for watch resumption and consistent paged lists.
    #[arg(long, default_value_t = 100_000)]
    pub watch_history: usize,
    /// How often watches that allow bookmarks get one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub watch_bookmark_interval: Duration,
    /// Namespace the server runs in (for the in-cluster names in the generated serving certificate).
    #[arg(long, default_value = "migration-apiserver")]
    pub service_namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Encryption at rest: a kube-apiserver EncryptionConfiguration (apiserver.config.k8s.io/v1) file.
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,
}

fn parse_storage_version(s: &str) -> Result<(String, String), String> {
    let (r, v) = s.split_once('=').ok_or_else(|| format!("expected <plural>.<group>=<version>, got {s:?}"))?;
    if r.is_empty() || v.is_empty() {
        return Err(format!("expected <plural>.<group>=<version>, got {s:?}"));
    }
    Ok((r.to_string(), v.to_string()))
}

/// Go-style durations: 500ms, 10s, 5m, 1h.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit() && c != '.').map(|i| s.split_at(i)).unwrap_or((s, "s"));
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?} (use ms, s, m, h)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Assembles and runs the server until SIGINT/SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // First, so that an invalid config fails the start before anything is bound, generated or opened.
    let encryption = args.encryption_provider_config.as_deref().map(EncryptionConfig::from_file).transpose()?;
    crate::auth::tls::install_default_crypto_provider();
    let addr = SocketAddr::new(args.bind_address, args.secure_port);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let port = listener.local_addr()?.port();
    let host = if args.bind_address.is_unspecified() { IpAddr::from([127, 0, 0, 1]) } else { args.bind_address };
    let server_url = match host {
        IpAddr::V6(h) => format!("https://[{h}]:{port}"),
        IpAddr::V4(h) => format!("https://{h}:{port}"),
    };
    let dev = ensure_dev_certs(&DevCertOptions {
        cert_dir: args.cert_dir.clone(),
        namespaces: vec![args.service_namespace.clone(), "kube-system".into(), "default".into()],
        kubeconfig_server: server_url.clone(),
        ..DevCertOptions::default()
    })?;
    let (cert, key) = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => (dev.serving_cert_path.clone(), dev.serving_key_path.clone()),
    };
    let client_ca = args.client_ca_file.clone().unwrap_or(dev.client_ca_path.clone());
    let tls = crate::auth::tls::server_config(&cert, &key, Some(&client_ca))?;

    let storage = EmbeddedStorage::open(
        &args.data_dir,
        EmbeddedOptions { history: args.watch_history, max_value_bytes: args.max_object_bytes.max(1) + 64 * 1024 },
    )?;
    let storage: Arc<dyn Storage> = match encryption {
        Some(config) => {
            tracing::info!(resources = ?config.describe(), "encryption at rest enabled");
            Arc::new(EncryptedStorage::new(storage, config))
        }
        None => storage,
    };
    let overrides: HashMap<String, String> = args.storage_version.iter().cloned().collect();
    let kinds = kinds(&overrides).map_err(anyhow::Error::msg)?;
    let registry =
        Registry::new(storage, kinds, RegistryConfig { gc_finalizers: false, max_object_bytes: args.max_object_bytes });
    let mut authn = Authenticator::new();
    if let Some(f) = &args.token_auth_file {
        authn = authn.with_tokens(StaticTokens::from_file(f)?);
    }
    let metrics = Arc::new(Metrics::new());
    let state = Arc::new(AppState::new(registry, Arc::new(authn), metrics, args.watch_bookmark_interval));
    let app = router(state.clone());
    tracing::info!(address = %addr, data_dir = %args.data_dir.display(), "serving");
    println!("migration-apiserver is serving on {server_url}");
    println!("  kubectl --kubeconfig {} get storagestates", dev.admin_kubeconfig_path.display());
    println!("  (or: export KUBECONFIG={})", dev.admin_kubeconfig_path.display());
    let shutdown_state = state.clone();
    let shutdown = async move {
        shutdown_signal().await;
        shutdown_state.ready.store(false, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("shutting down");
    };
    crate::server::serve::serve(listener, tls, app, shutdown).await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

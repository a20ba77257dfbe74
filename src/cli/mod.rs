//! Command line: `serve` with kube-apiserver-style flags, and how a server is assembled from them.

use crate::api::kinds;
use crate::auth::certs::{ensure_dev_certs, DevCertOptions};
use crate::storage::encryption::EncryptionConfig;
use clap::{Parser, Subcommand, ValueEnum};
use std::collections::HashMap;
use std::path::PathBuf;

mod deploy_check;
pub use deploy_check::*;
mod kms_test_plugin;
pub use kms_test_plugin::*;
mod migrate;
pub use migrate::*;
mod serve;
pub use serve::*;
mod snapshot;
pub use snapshot::*;

#[derive(Parser, Debug)]
#[command(name = "migration-apiserver", version, about = "Aggregated API server for storage version migration")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once at start: the size of the serve variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve the API over TLS.
    Serve(Box<ServeArgs>),
    /// Generate the development CA, serving and admin certificates and admin.kubeconfig (existing files are kept).
    Certs(CertsArgs),
    /// Write every manifest generated from the kinds (CRDs, roles, APIServices, webhook configurations, the
    /// migrator's RBAC for our kinds) under a repository root: `manifests --output-dir .` (`make manifests`).
    Manifests(ManifestsArgs),
    /// Print the CustomResourceDefinitions of the served kinds (the CRD deployment form), or write manifests/crds/.
    Crds(CrdsArgs),
    /// Print the ClusterRoles that add the served kinds to the built-in view, edit and admin roles, or write
    /// manifests/roles/.
    Roles(CrdsArgs),
    /// Offline tools for the embedded store (run them while the server is stopped).
    #[command(subcommand)]
    Storage(StorageCommand),
    /// Request storage version migrations by hand: creates StorageVersionMigrations as the trigger would.
    Migrate(MigrateArgs),
    /// Translate an in-tree PersistentVolume, StorageClass or pod inline volume to CSI (or a CSI PersistentVolume
    /// back with --to-intree), as Kubernetes' csi-translation-lib does: YAML or JSON on stdin, the same on stdout.
    /// Or repair a CSI volume handle for a node (--repair-volume-handle).
    Translate(TranslateArgs),
    /// Which of our APIServices `make deploy` registers on the cluster of the current kubectl context: their names
    /// on stdout, the skipped ones with why on stderr (a group the cluster serves itself is not ours to claim).
    DeployCheck(DeployCheckArgs),
    /// A KMS v2 plugin for tests and walk-throughs, not for production (keys in memory or in a file).
    #[command(hide = true)]
    KmsTestPlugin(KmsTestPluginArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct TranslateArgs {
    /// Translate a CSI PersistentVolume back to the in-tree plugin its driver supersedes.
    #[arg(long = "to-intree")]
    pub to_in_tree: bool,
    /// Namespace of the pod of an inline volume (Azure File reads its secret there); default: the Pod's namespace,
    /// else "default".
    #[arg(long)]
    pub pod_namespace: Option<String>,
    /// Instead of translating stdin: complete this CSI volume handle of --driver for the node --node-id and print
    /// it, as the library's RepairVolumeHandle (only GCE PD fills anything in: the UNSPECIFIED project and zone of
    /// a translated handle).
    #[arg(long, value_name = "HANDLE", requires = "driver", conflicts_with_all = ["to_in_tree", "pod_namespace"])]
    pub repair_volume_handle: Option<String>,
    /// The CSI driver of the handle to repair, e.g. pd.csi.storage.gke.io.
    #[arg(long, requires = "repair_volume_handle")]
    pub driver: Option<String>,
    /// The ID of the node the volume attaches to, as its CSI driver reports it (CSINode spec.drivers[].nodeID).
    #[arg(long, requires = "repair_volume_handle")]
    pub node_id: Option<String>,
}

/// `translate`: stdin to stdout; or one repaired volume handle, a line on stdout.
pub fn translate(args: TranslateArgs) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    if let Some(handle) = args.repair_volume_handle {
        let driver = args.driver.unwrap_or_default();
        let repaired = crate::csi::repair_volume_handle(&driver, &handle, args.node_id.as_deref().unwrap_or_default())?;
        println!("{repaired}");
        return Ok(());
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let opts = crate::csi::document::Options { to_in_tree: args.to_in_tree, pod_namespace: args.pod_namespace };
    let out = crate::csi::document::translate_text(&input, &opts)?;
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum StorageCommand {
    /// List the stored keys with their revision, encryption, apiVersion and size (never their values).
    Inspect(InspectArgs),
    /// Backups of the embedded store: save (offline), ls, verify, restore.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum InspectOutput {
    Table,
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct InspectArgs {
    /// Directory of the embedded store (unused with --etcd-servers).
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Or read the keys from etcd: --etcd-servers, --etcd-prefix, --etcd-cafile, --etcd-certfile, --etcd-keyfile.
    #[command(flatten)]
    pub etcd: crate::storage::etcd::EtcdArgs,
    /// The server's EncryptionConfiguration: decrypts values in memory to show their apiVersion.
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,
    /// Only keys under this prefix.
    #[arg(long, id = "key_prefix", default_value = "/registry/")]
    pub prefix: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = InspectOutput::Table)]
    pub output: InspectOutput,
    /// List only the objects the server cannot read (they do not decrypt, or do not decode as objects), with why:
    /// the ones to remove with `ignoreStoreReadErrorWithClusterBreakingPotential` (see docs/operations/storage.md).
    #[arg(long)]
    pub unreadable: bool,
    /// Print only how many values each resource has under each provider and key (RESOURCE, PROVIDER, KEY, VALUES;
    /// with KMS v2 values also KEY ID HASH, one row per key_id): after a key rotation, a key no resource lists holds
    /// no data and can be removed from the config (a key_id, retired in the KMS).
    #[arg(long, conflicts_with = "unreadable")]
    pub summary: bool,
}

/// `storage inspect`, `storage snapshot ...`.
pub async fn storage(command: StorageCommand) -> anyhow::Result<()> {
    match command {
        StorageCommand::Snapshot(c) => snapshot(c),
        StorageCommand::Inspect(a) => {
            use crate::storage::inspect;
            let config = a.encryption_provider_config.as_deref().map(EncryptionConfig::from_file).transpose()?;
            let etcd = a.etcd.enabled().then_some(&a.etcd);
            // Each value is read as the server reads it, so what it cannot read is marked with why.
            let check = |value: &[u8]| crate::registry::decode::read_stored(value).map(|_| ()).map_err(Into::into);
            let mut entries = inspect::inspect_checked(&a.data_dir, etcd, config.as_ref(), &a.prefix, &check).await?;
            if a.unreadable {
                entries.retain(|e| e.error.is_some());
            }
            let text = match (a.summary, a.output, a.unreadable) {
                (true, InspectOutput::Table, _) => inspect::summary_table(&inspect::summary(&entries)),
                (true, InspectOutput::Json, _) => inspect::summary_json(&inspect::summary(&entries)),
                (false, InspectOutput::Table, false) => inspect::table(&entries),
                (false, InspectOutput::Table, true) => inspect::unreadable_table(&entries),
                (false, InspectOutput::Json, _) => inspect::json(&entries),
            };
            print!("{text}");
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
    /// Write one file per object and a kustomization.yaml here instead of printing them.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ManifestsArgs {
    /// The repository root: files go to manifests/crds/, manifests/roles/, apiservice/, manifests/webhooks/ and
    /// manifests/ under it.
    #[arg(long)]
    pub output_dir: PathBuf,
}

/// `manifests`: every generated file (see `server::manifests`), written and its path printed.
pub fn manifests(args: ManifestsArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new())?;
    for (path, content) in crate::server::manifests::generate::all(&kinds)? {
        let path = args.output_dir.join(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, content)?;
        println!("{}", path.display());
    }
    Ok(())
}

/// `crds`: the CRDs generated from the kinds' types (see `server::crd`).
pub fn crds(args: CrdsArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new())?;
    print_or_write(args.output_dir, crate::server::crd::files(&kinds)?, crate::server::crd::stream(&kinds)?)
}

/// `roles`: the aggregated ClusterRoles generated from the kinds (see `server::roles`).
pub fn roles(args: CrdsArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new())?;
    print_or_write(args.output_dir, crate::server::roles::files(&kinds)?, crate::server::roles::stream(&kinds)?)
}

/// Generated manifests: the files written into `dir` (created if missing) and their paths printed, or else the
/// stream printed.
fn print_or_write(dir: Option<PathBuf>, files: Vec<(String, String)>, stream: String) -> anyhow::Result<()> {
    let Some(dir) = dir else {
        print!("{stream}");
        return Ok(());
    };
    std::fs::create_dir_all(&dir)?;
    for (name, content) in files {
        std::fs::write(dir.join(&name), content)?;
        println!("{}", dir.join(name).display());
    }
    Ok(())
}

/// A client for the target named by `--kubeconfig` (or the in-cluster config when running in a pod).
pub(crate) async fn target_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::incluster()?,
    };
    // The migrator and trigger own retries (their backoff, Retry-After, attempt budget) and every retry must pass
    // the migration rate limit: kube's built-in retry layer (429/503/504, up to 15 times) would bypass both.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

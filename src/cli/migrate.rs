//! `migrate`: migrations requested by hand, through `migration.k8s.io/v1alpha1` (ours, as the trigger requests
//! them) or `storagemigration.k8s.io` (the in-tree kind, `--api`), and `--wait`, which follows them to their end.

use crate::api::storagemigration::{
    GroupResource, StorageVersionMigration as InTreeMigration, StorageVersionMigrationSpec as InTreeSpec,
};
use crate::scheduler::migrator::{Migration, MigrationApi, MigrationKey};
use crate::scheduler::trigger_kit::{
    request_migrations, wanted_resources, MigrateRequest, OwnObjects, ANNOTATION_REASON, WHY_BY_HAND,
};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often `--wait` reads the migrations.
const POLL: Duration = Duration::from_millis(500);
/// How often `--wait` prints a line per migration when the output is not a terminal (and at every phase change).
const LINE_EVERY: Duration = Duration::from_secs(5);

/// The API `migrate` requests migrations through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestApi {
    /// `migration.k8s.io/v1alpha1`: created as the trigger creates them, superseding unfinished ones.
    Ours,
    /// `storagemigration.k8s.io/<version>` (v1 or v1beta1): the in-tree kind, one new migration per resource.
    InTree { version: String },
}

/// An `--api` value other than the three served.
#[derive(Debug, thiserror::Error)]
#[error(
    "unsupported API {0:?}: one of migration.k8s.io/v1alpha1, storagemigration.k8s.io/v1, storagemigration.k8s.io/v1beta1"
)]
pub struct UnsupportedApi(String);

/// `--api`'s values.
pub fn parse_api(s: &str) -> Result<RequestApi, UnsupportedApi> {
    match s {
        "migration.k8s.io/v1alpha1" => Ok(RequestApi::Ours),
        "storagemigration.k8s.io/v1" | "storagemigration.k8s.io/v1beta1" => {
            Ok(RequestApi::InTree { version: s.trim_start_matches("storagemigration.k8s.io/").to_string() })
        }
        _ => Err(UnsupportedApi(s.to_string())),
    }
}

#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["resources", "all"])))]
pub struct MigrateArgs {
    /// Kubeconfig of the migration-apiserver where the StorageVersionMigrations are created.
    #[arg(long, default_value = "./certs/admin.kubeconfig")]
    pub kubeconfig: PathBuf,
    /// Kubeconfig of the API whose discovery names the resources (preferred version, storage version hash).
    /// Default: --kubeconfig (a standalone server migrating its own resources).
    #[arg(long)]
    pub target_kubeconfig: Option<PathBuf>,
    /// A resource to migrate, `<resource>.<group>` (`<resource>` for the core group); repeatable.
    #[arg(long = "resource", value_name = "RESOURCE.GROUP")]
    pub resources: Vec<String>,
    /// Every resource served in two or more versions, except CRDs, aggregated APIs and events (the upstream
    /// initializer's rule).
    #[arg(long, conflicts_with = "resources")]
    pub all: bool,
    /// The API the StorageVersionMigrations are created through: migration.k8s.io/v1alpha1, or the in-tree kind,
    /// storagemigration.k8s.io/v1 or storagemigration.k8s.io/v1beta1.
    #[arg(long, value_name = "GROUP/VERSION", default_value = "migration.k8s.io/v1alpha1", value_parser = parse_api)]
    pub api: RequestApi,
    /// Follow the migrations until they end: a progress bar on a terminal, a line every few seconds otherwise. The
    /// exit status is non-zero when one of them Fails (or is deleted or superseded before it ends).
    #[arg(long)]
    pub wait: bool,
}

/// `migrate`: prints each migration requested, as kubectl does, then follows them with `--wait`.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    crate::auth::tls::install_default_crypto_provider();
    let api = crate::cli::target_client(Some(&args.kubeconfig)).await?;
    let target = match &args.target_kubeconfig {
        Some(path) => crate::cli::target_client(Some(path)).await?,
        None => api.clone(),
    };
    let request = if args.all { MigrateRequest::All } else { MigrateRequest::Resources(args.resources) };
    let own = OwnObjects::new(api.clone());
    let keys: Vec<MigrationKey> = match &args.api {
        RequestApi::Ours => request_migrations(&target, &own, &request)
            .await?
            .into_iter()
            .map(|name| MigrationKey { api: MigrationApi::Ours, name })
            .collect(),
        RequestApi::InTree { version } => {
            let in_tree = Api::<InTreeMigration>::all(api.clone());
            request_in_tree(&target, &in_tree, version, &request).await?
        }
    };
    if keys.is_empty() {
        eprintln!("No resources to migrate.");
    }
    for key in &keys {
        println!("{} created", display(key));
    }
    if !args.wait {
        return Ok(());
    }
    let migrations = Migrations { ours: own, in_tree: Api::all(api) };
    let failed = follow(&migrations, &keys).await?;
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} of {} migrations did not succeed: {}", failed.len(), keys.len(), failed.join(", "))
    }
}

/// `storageversionmigration.<group>/<name>`, as kubectl prints an object.
fn display(key: &MigrationKey) -> String {
    match key.api {
        MigrationApi::Ours => format!("storageversionmigration.migration.k8s.io/{}", key.name),
        MigrationApi::InTree => format!("storageversionmigration.storagemigration.k8s.io/{}", key.name),
    }
}

/// Creates one in-tree migration per resource wanted (named after it, `generateName`), through `version` of
/// `storagemigration.k8s.io`. The resources are resolved against the target's discovery as for ours; unlike ours
/// nothing is superseded (the migrator runs them one after the other).
async fn request_in_tree(
    target: &kube::Client,
    in_tree: &Api<InTreeMigration>,
    version: &str,
    request: &MigrateRequest,
) -> anyhow::Result<Vec<MigrationKey>> {
    let wanted = wanted_resources(target, request).await?;
    // Created through the version asked for: the server converts to its storage version.
    let url =
        format!("/apis/{}/{version}/{}", crate::api::storagemigration::GROUP, crate::api::storagemigration::PLURAL);
    let mut created = Vec::new();
    for r in wanted {
        let mut m = InTreeMigration {
            spec: InTreeSpec { resource: GroupResource { group: r.group.clone(), resource: r.resource.clone() } },
            ..Default::default()
        };
        m.metadata.generate_name = Some(format!("{}-", r.qualified()));
        m.metadata.annotations = Some([(ANNOTATION_REASON.to_string(), WHY_BY_HAND.to_string())].into());
        let mut body = serde_json::to_value(&m)?;
        body["apiVersion"] = format!("{}/{version}", crate::api::storagemigration::GROUP).into();
        body["kind"] = "StorageVersionMigration".into();
        let req = kube::core::Request::new(&url).create(&PostParams::default(), serde_json::to_vec(&body)?)?;
        let saved: serde_json::Value = in_tree.clone().into_client().request(req).await?;
        let name = saved["metadata"]["name"].as_str().unwrap_or_default().to_string();
        created.push(MigrationKey { api: MigrationApi::InTree, name });
    }
    Ok(created)
}

/// Both APIs' migrations, as `--wait` reads them.
struct Migrations {
    ours: OwnObjects,
    in_tree: Api<InTreeMigration>,
}

impl Migrations {
    async fn get(&self, key: &MigrationKey) -> anyhow::Result<Option<Migration>> {
        Ok(match key.api {
            MigrationApi::Ours => self.ours.get_migration(&key.name).await?.map(Migration::Ours),
            MigrationApi::InTree => self.in_tree.get_opt(&key.name).await?.map(Migration::InTree),
        })
    }
}

/// One line about a migration: `Running: 120 of about 500 objects (24%)`.
pub fn describe(m: &Migration) -> String {
    let (migrated, remaining) = m.progress();
    let migrated = migrated.unwrap_or(0);
    let phase = m.phase();
    let mut line = match (phase, remaining) {
        ("Pending", _) => "Pending".to_string(),
        ("Running", Some(remaining)) => {
            let total = migrated.saturating_add(remaining);
            let percent = if total <= 0 { 100 } else { (migrated.saturating_mul(100) / total).min(100) };
            format!("Running: {migrated} of about {total} objects ({percent}%)")
        }
        (_, _) => format!("{phase}: {migrated} objects"),
    };
    let condition = m.condition_message(phase).filter(|m| !m.is_empty());
    if let (Some(message), "Failed" | "Running") = (condition, phase) {
        if phase == "Failed" || message.contains("Retrying") {
            line.push_str(&format!(": {message}"));
        }
    }
    line
}

/// Follows the migrations until every one has ended; returns those that did not succeed.
async fn follow(migrations: &Migrations, keys: &[MigrationKey]) -> anyhow::Result<Vec<String>> {
    let terminal = std::io::stderr().is_terminal();
    let bars = MultiProgress::new();
    let mut shown: BTreeMap<&str, (ProgressBar, String, Instant)> = BTreeMap::new();
    let mut failed = Vec::new();
    let mut open: Vec<&MigrationKey> = keys.iter().collect();
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
        .map_err(|e| anyhow::anyhow!("progress bar template: {e}"))?
        .progress_chars("=> ");
    while !open.is_empty() {
        let mut still_open = Vec::new();
        for key in open {
            let name = &key.name;
            let svm = match migrations.get(key).await {
                Ok(Some(svm)) => svm,
                Ok(None) => {
                    eprintln!("{name}: deleted before it ended");
                    failed.push(name.clone());
                    continue;
                }
                Err(e) => {
                    // The server may be restarting: keep following.
                    tracing::debug!(migration = %name, error = %e, "reading the migration");
                    still_open.push(key);
                    continue;
                }
            };
            let line = describe(&svm);
            let entry = shown.entry(name.as_str()).or_insert_with(|| {
                let bar = if terminal { bars.add(ProgressBar::new(0)) } else { ProgressBar::hidden() };
                bar.set_style(style.clone());
                bar.set_prefix(name.clone());
                (bar, String::new(), Instant::now() - LINE_EVERY)
            });
            let (migrated, remaining) = svm.progress();
            let migrated = u64::try_from(migrated.unwrap_or(0)).unwrap_or(0);
            let total = migrated + u64::try_from(remaining.unwrap_or(0)).unwrap_or(0);
            let (bar, last, at) = entry;
            bar.set_length(total.max(migrated));
            bar.set_position(migrated);
            bar.set_message(svm.phase());
            let phase_changed = last.split(':').next() != line.split(':').next();
            if !terminal && *last != line && (phase_changed || at.elapsed() >= LINE_EVERY || svm.is_finished()) {
                eprintln!("{name}: {line}");
                *at = Instant::now();
                *last = line.clone();
            }
            if svm.is_finished() {
                if terminal {
                    bar.finish_with_message(line.clone());
                }
                if svm.phase() != "Succeeded" {
                    failed.push(name.clone());
                }
            } else {
                still_open.push(key);
            }
        }
        open = still_open;
        if !open.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(failed)
}

//! `migrate`: migrations requested by hand, and `--wait`, which follows them to their end.

use crate::api::storage_version_migration::StorageVersionMigration;
use crate::scheduler::trigger::{is_finished, request_migrations, MigrateRequest, OwnObjects};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often `--wait` reads the migrations.
const POLL: Duration = Duration::from_millis(500);
/// How often `--wait` prints a line per migration when the output is not a terminal (and at every phase change).
const LINE_EVERY: Duration = Duration::from_secs(5);

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
    /// Follow the migrations until they end: a progress bar on a terminal, a line every few seconds otherwise. The
    /// exit status is non-zero when one of them Fails (or is deleted or superseded before it ends).
    #[arg(long)]
    pub wait: bool,
}

/// `migrate`: prints each migration requested, as kubectl does, then follows them with `--wait`.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    crate::auth::tls::install_default_crypto_provider();
    let api = crate::scheduler::target_client(Some(&args.kubeconfig)).await?;
    let target = match &args.target_kubeconfig {
        Some(path) => crate::scheduler::target_client(Some(path)).await?,
        None => api.clone(),
    };
    let request = if args.all { MigrateRequest::All } else { MigrateRequest::Resources(args.resources) };
    let own = OwnObjects::new(api);
    let names = request_migrations(&target, &own, &request).await?;
    if names.is_empty() {
        eprintln!("No resources to migrate.");
    }
    for name in &names {
        println!("storageversionmigration.migration.k8s.io/{name} created");
    }
    if !args.wait {
        return Ok(());
    }
    let failed = follow(&own, &names).await?;
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} of {} migrations did not succeed: {}", failed.len(), names.len(), failed.join(", "))
    }
}

/// One line about a migration: `Running: 120 of about 500 objects (24%)`.
pub fn describe(svm: &StorageVersionMigration) -> String {
    let status = svm.status.clone().unwrap_or_default();
    let migrated = status.migrated_objects.unwrap_or(0);
    let phase = svm.phase();
    let mut line = match (phase, status.remaining_objects_estimate, svm.progress()) {
        ("Pending", _, _) => "Pending".to_string(),
        (_, Some(remaining), Some(p)) if phase == "Running" => {
            format!("Running: {migrated} of about {} objects ({p}%)", migrated + remaining)
        }
        (_, _, _) => format!("{phase}: {migrated} objects"),
    };
    let condition = svm.condition(phase).and_then(|c| c.message.clone()).filter(|m| !m.is_empty());
    if let (Some(message), "Failed" | "Running") = (condition, phase) {
        if phase == "Failed" || message.contains("Retrying") {
            line.push_str(&format!(": {message}"));
        }
    }
    line
}

/// Follows the migrations until every one has ended; returns those that did not succeed.
async fn follow(own: &OwnObjects, names: &[String]) -> anyhow::Result<Vec<String>> {
    let terminal = std::io::stderr().is_terminal();
    let bars = MultiProgress::new();
    let mut shown: BTreeMap<&str, (ProgressBar, String, Instant)> = BTreeMap::new();
    let mut failed = Vec::new();
    let mut open: Vec<&String> = names.iter().collect();
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
        .map_err(|e| anyhow::anyhow!("progress bar template: {e}"))?
        .progress_chars("=> ");
    while !open.is_empty() {
        let mut still_open = Vec::new();
        for name in open {
            let svm = match own.get_migration(name).await {
                Ok(Some(svm)) => svm,
                Ok(None) => {
                    eprintln!("{name}: deleted before it ended");
                    failed.push(name.clone());
                    continue;
                }
                Err(e) => {
                    // The server may be restarting: keep following.
                    tracing::debug!(migration = %name, error = %e, "reading the migration");
                    still_open.push(name);
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
            let status = svm.status.clone().unwrap_or_default();
            let migrated = u64::try_from(status.migrated_objects.unwrap_or(0)).unwrap_or(0);
            let total = migrated + u64::try_from(status.remaining_objects_estimate.unwrap_or(0)).unwrap_or(0);
            let (bar, last, at) = entry;
            bar.set_length(total.max(migrated));
            bar.set_position(migrated);
            bar.set_message(svm.phase());
            let phase_changed = last.split(':').next() != line.split(':').next();
            if !terminal && *last != line && (phase_changed || at.elapsed() >= LINE_EVERY || is_finished(&svm)) {
                eprintln!("{name}: {line}");
                *at = Instant::now();
                *last = line.clone();
            }
            if is_finished(&svm) {
                if terminal {
                    bar.finish_with_message(line.clone());
                }
                if svm.phase() != "Succeeded" {
                    failed.push(name.clone());
                }
            } else {
                still_open.push(name);
            }
        }
        open = still_open;
        if !open.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(failed)
}

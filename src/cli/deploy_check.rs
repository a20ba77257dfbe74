//! `deploy-check`: which of our APIServices (or, in the CRD form, CRDs and webhook rules) the deploy kit installs on
//! a cluster (scripts/deploy.sh calls it). The decision is `server::cluster_check`'s: a group of ours is installed
//! only where it is absent or already ours. A group that kube-apiserver serves itself (`storagemigration.k8s.io`
//! from 1.37, or enabled with `--runtime-config`), that another server's APIService registers (gardener-apiserver's
//! `core.gardener.cloud`), or that CRDs of another installation serve (kube-storage-version-migrator's
//! `migration.k8s.io`) is skipped whole, and why is said on stderr. For a group another server serves, the server
//! itself is told to leave it alone (`--runtime-config-out`: `serve --runtime-config` turning it off).

use super::serve::runtime_config::needed_by_the_scheduler;
use crate::api::kinds;
use crate::registry::strategy::Strategy;
use crate::server::cluster_check::{in_tree_group, Backend, Claimed, ClusterFacts};
use crate::server::manifests::{apiservice, webhooks, SERVICE_NAME};
use clap::ValueEnum;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What to do with our APIServices of the groups the cluster may serve itself.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum InTreeGroups {
    /// Ask the cluster (its /version and APIServices).
    Auto,
    /// Register them whatever the cluster says (a cluster that turned the group off).
    Register,
    /// Skip them without asking.
    Skip,
}

/// The deployment form, as `make deploy FORM=...`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DeployForm {
    /// APIServices: prints the names of those to register.
    Aggregated,
    /// CRDs and admission webhooks: writes those to install into --output-dir.
    Crds,
}

#[derive(clap::Args, Debug, Clone)]
pub struct DeployCheckArgs {
    /// Kubeconfig of the cluster; default as kubectl: $KUBECONFIG, ~/.kube/config, else the in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; default its current context.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace of our Service (the APIServices name Service <namespace>/migration-apiserver).
    #[arg(long, default_value = "migration-apiserver")]
    pub service_namespace: String,
    /// Our APIServices of groups the cluster may serve itself (storagemigration.k8s.io).
    #[arg(long, value_enum, default_value_t = InTreeGroups::Auto)]
    pub in_tree_groups: InTreeGroups,
    /// Render without asking a cluster: every group of ours is installed (the in-tree groups as --in-tree-groups
    /// says, which must then be register or skip). Nothing guards what the cluster already serves.
    #[arg(long)]
    pub offline: bool,
    /// The deployment form.
    #[arg(long, value_enum, default_value_t = DeployForm::Aggregated)]
    pub form: DeployForm,
    /// With --form crds: where to write `crds/` (the CRDs and their kustomization) and `webhooks/` (the two
    /// webhook configurations), for the kinds to install.
    #[arg(long, required_if_eq("form", "crds"))]
    pub output_dir: Option<PathBuf>,
    /// Where to write the server's `--runtime-config` value turning off the groups another server serves (empty
    /// when there is none), for scripts/deploy.sh to add to the Deployment.
    #[arg(long)]
    pub runtime_config_out: Option<PathBuf>,
}

/// Aggregated: prints the name of every APIService to register (`<version>.<group>`, one a line, as the files of
/// `apiservice/` are named). CRDs: writes the CRDs and webhook configurations to install and prints the CRDs'
/// names. On stderr, everything skipped with why.
pub async fn deploy_check(args: DeployCheckArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new())?;
    let facts = match args.offline {
        true if args.in_tree_groups == InTreeGroups::Auto => {
            anyhow::bail!("--offline: set --in-tree-groups (IN_TREE_GROUPS) to register or skip: auto asks the cluster")
        }
        true => None,
        false => Some(read_facts(&args).await?),
    };
    let ours = Backend::service(&args.service_namespace, SERVICE_NAME);
    // Why `group` is skipped in this form, or None.
    let skip = |group: &str| -> Option<Skip> {
        match (args.in_tree_groups, in_tree_group(group)) {
            (InTreeGroups::Register, Some(_)) => return None,
            (InTreeGroups::Skip, Some(_)) => return Some(Skip::Flag),
            _ => {}
        }
        let facts = facts.as_ref()?;
        let why = match args.form {
            DeployForm::Aggregated => facts.apiservice_claim(group, &ours),
            DeployForm::Crds => facts.crd_claim(group, &ours),
        };
        why.map(Skip::Claimed)
    };
    let group_versions = apiservice::group_versions(&kinds);
    let decisions: Vec<(&str, &[&str], Option<Skip>)> =
        group_versions.iter().map(|(g, vs)| (*g, vs.as_slice(), skip(g))).collect();
    match (args.form, &args.output_dir) {
        (DeployForm::Aggregated, _) => {
            for (group, versions, why) in &decisions {
                for version in *versions {
                    match why {
                        None => println!("{version}.{group}"),
                        Some(why) => eprintln!("skipping APIService {version}.{group}: {why}"),
                    }
                }
            }
        }
        (DeployForm::Crds, Some(dir)) => {
            let mut installed: Vec<Arc<dyn Strategy>> = Vec::new();
            for k in kinds.iter() {
                let i = k.info();
                match decisions.iter().find(|(g, _, _)| *g == i.group).and_then(|(_, _, why)| why.as_ref()) {
                    None => installed.push(k.clone()),
                    Some(why) if !i.create_only => eprintln!(
                        "skipping CustomResourceDefinition {}.{} and its webhook rules: {why}",
                        i.plural, i.group
                    ),
                    Some(_) => {}
                }
            }
            write_crd_form(&installed, dir)?;
            for k in crate::server::crd::stored(&installed) {
                println!("{}.{}", k.info().plural, k.info().group);
            }
        }
        (DeployForm::Crds, None) => anyhow::bail!("--form crds needs --output-dir"),
    }
    let off = turned_off(&decisions);
    if let Some(path) = &args.runtime_config_out {
        std::fs::write(path, &off)?;
    }
    Ok(())
}

/// Why the deploy kit leaves a group out.
enum Skip {
    /// --in-tree-groups=skip.
    Flag,
    Claimed(Claimed),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Flag => f.write_str("--in-tree-groups=skip"),
            Skip::Claimed(why) => why.fmt(f),
        }
    }
}

/// The `--runtime-config` value for the server: every version of each group another server serves turned off
/// (said on stderr), so that the server neither serves nor claims it. The groups the scheduler keeps its state
/// in stay on: the server's check warns about them instead.
fn turned_off(decisions: &[(&str, &[&str], Option<Skip>)]) -> String {
    let mut entries = Vec::new();
    for (group, versions, why) in decisions {
        let Some(Skip::Claimed(Claimed::OtherServer { .. })) = why else { continue };
        if needed_by_the_scheduler(group) {
            eprintln!("note: {group} stays on in the server (its scheduler needs it); it warns while another server serves the group (docs/install/before-you-install.md)");
            continue;
        }
        let mut group_entries: Vec<String> = versions.iter().map(|v| format!("{group}/{v}=false")).collect();
        group_entries.sort();
        eprintln!(
            "turning {group} off in the server (--runtime-config={}): another server serves it; this server runs beside it (docs/install/handover.md)",
            group_entries.join(",")
        );
        entries.extend(group_entries);
    }
    entries.join(",")
}

/// `dir/crds/` and `dir/webhooks/`: the generated files of `manifests/crds/` and `manifests/webhooks/` for `kinds`
/// (the same generator as `make manifests`, so with every kind they equal the committed ones).
fn write_crd_form(kinds: &[Arc<dyn Strategy>], dir: &Path) -> anyhow::Result<()> {
    for (sub, files) in [("crds", crate::server::crd::files(kinds)?), ("webhooks", webhooks::files(kinds)?)] {
        let out = dir.join(sub);
        std::fs::create_dir_all(&out)?;
        for (name, content) in files {
            std::fs::write(out.join(name), content)?;
        }
    }
    Ok(())
}

async fn read_facts(args: &DeployCheckArgs) -> anyhow::Result<ClusterFacts> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    crate::auth::tls::install_default_crypto_provider();
    let options = KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?,
        (None, Some(_)) => kube::Config::from_kubeconfig(&options).await?,
        (None, None) => kube::Config::infer().await?,
    };
    let cluster = config.cluster_url.clone();
    let client = kube::Client::try_from(config)?;
    const HINT: &str = "to render without the cluster, pass --offline (OFFLINE=1 for scripts/deploy.sh) with \
         --in-tree-groups register or skip (IN_TREE_GROUPS)";
    match ClusterFacts::read(&client).await {
        Ok(Some(mut facts)) => {
            facts.list_crds(&client).await.map_err(|e| anyhow::anyhow!("{e} (cluster {cluster}); {HINT}"))?;
            Ok(facts)
        }
        Ok(None) => anyhow::bail!("cluster {cluster} serves no apiregistration.k8s.io/v1 APIServices; {HINT}"),
        Err(e) => anyhow::bail!("{e} (cluster {cluster}); {HINT}"),
    }
}

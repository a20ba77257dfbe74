//! `deploy-check`: which of our APIServices the deploy kit registers on a cluster (scripts/deploy.sh calls it).
//! The decision is `server::cluster_check`'s, the same the server makes at start: an APIService of a group the
//! cluster serves itself (`storagemigration.k8s.io` from 1.37, or enabled with `--runtime-config`) is skipped, and
//! why is said; every other group (migration.k8s.io, core.gardener.cloud) is always registered. In the CRD form
//! (`--form crds`) it writes the CRDs and webhook configurations of the kinds to install, without those of such a
//! group: on a cluster that serves the group, a CRD of it would never be served, and our webhook would sit in the
//! way of every write of the built-in API.

use crate::api::kinds;
use crate::registry::strategy::Strategy;
use crate::server::cluster_check::{in_tree_group, Backend, ClusterFacts};
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
    /// Register them without asking (rendering without a cluster, or a cluster that turned the group off).
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
    /// The deployment form.
    #[arg(long, value_enum, default_value_t = DeployForm::Aggregated)]
    pub form: DeployForm,
    /// With --form crds: where to write `crds/` (the CRDs and their kustomization) and `webhooks/` (the two
    /// webhook configurations), for the kinds to install.
    #[arg(long, required_if_eq("form", "crds"))]
    pub output_dir: Option<PathBuf>,
}

/// Aggregated: prints the name of every APIService to register (`<version>.<group>`, one a line, as the files of
/// `apiservice/` are named). CRDs: writes the CRDs and webhook configurations to install and prints the CRDs'
/// names. On stderr, everything skipped with why.
pub async fn deploy_check(args: DeployCheckArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new())?;
    let guarded = kinds.iter().any(|k| in_tree_group(k.info().group).is_some());
    let facts = match (args.in_tree_groups, guarded) {
        (InTreeGroups::Auto, true) => Some(read_facts(&args).await?),
        _ => None,
    };
    let ours = Backend::service(&args.service_namespace, SERVICE_NAME);
    // Why `group` is skipped in this form, or None.
    let skip = |group: &str| match (args.in_tree_groups, in_tree_group(group)) {
        (_, None) | (InTreeGroups::Register, _) => None,
        (InTreeGroups::Skip, Some(_)) => Some("--in-tree-groups=skip".to_string()),
        (InTreeGroups::Auto, Some(_)) => facts
            .as_ref()
            .and_then(|f| match args.form {
                DeployForm::Aggregated => f.skip_reason(group, &ours),
                DeployForm::Crds => f.crd_skip_reason(group, &ours),
            })
            .map(|why| why.to_string()),
    };
    match (args.form, &args.output_dir) {
        (DeployForm::Aggregated, _) => {
            for (group, versions) in apiservice::group_versions(&kinds) {
                let why = skip(group);
                for version in versions {
                    match &why {
                        None => println!("{version}.{group}"),
                        Some(why) => eprintln!("skipping APIService {version}.{group}: {why}"),
                    }
                }
            }
        }
        (DeployForm::Crds, Some(dir)) => {
            let mut installed: Vec<Arc<dyn Strategy>> = Vec::new();
            for k in kinds {
                let i = k.info();
                match skip(i.group) {
                    None => installed.push(k),
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
    Ok(())
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
    const HINT: &str =
        "to decide without the cluster, set --in-tree-groups (IN_TREE_GROUPS for scripts/deploy.sh) to register or skip";
    match ClusterFacts::read(&client).await {
        Ok(Some(facts)) => Ok(facts),
        Ok(None) => anyhow::bail!("cluster {cluster} serves no apiregistration.k8s.io/v1 APIServices; {HINT}"),
        Err(e) => anyhow::bail!("{e} (cluster {cluster}); {HINT}"),
    }
}

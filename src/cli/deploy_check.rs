//! `deploy-check`: which of our APIServices the deploy kit registers on a cluster (scripts/deploy.sh calls it).
//! The decision is `server::cluster_check`'s, the same the server makes at start: an APIService of a group the
//! cluster serves itself (`storagemigration.k8s.io` from 1.37, or enabled with `--runtime-config`) is skipped, and
//! why is said; every other group (migration.k8s.io, core.gardener.cloud) is always registered.

use crate::api::kinds;
use crate::server::cluster_check::{in_tree_group, Backend, ClusterFacts};
use crate::server::manifests::{apiservice, SERVICE_NAME};
use clap::ValueEnum;
use std::collections::HashMap;
use std::path::PathBuf;

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
}

/// Prints the name of every APIService to register (`<version>.<group>`, one a line, as the files of
/// `apiservice/` are named) and, on stderr, every one skipped with why.
pub async fn deploy_check(args: DeployCheckArgs) -> anyhow::Result<()> {
    let kinds = kinds(&HashMap::new())?;
    let wanted: Vec<(&str, &str)> = apiservice::group_versions(&kinds)
        .into_iter()
        .flat_map(|(group, versions)| versions.into_iter().map(move |v| (group, v)))
        .collect();
    let guarded = wanted.iter().any(|(group, _)| in_tree_group(group).is_some());
    let facts = match (args.in_tree_groups, guarded) {
        (InTreeGroups::Auto, true) => Some(read_facts(&args).await?),
        _ => None,
    };
    let ours = Backend::service(&args.service_namespace, SERVICE_NAME);
    for (group, version) in wanted {
        let name = format!("{version}.{group}");
        let skip = match (args.in_tree_groups, in_tree_group(group)) {
            (_, None) | (InTreeGroups::Register, _) => None,
            (InTreeGroups::Skip, Some(_)) => Some("--in-tree-groups=skip".to_string()),
            (InTreeGroups::Auto, Some(_)) => {
                facts.as_ref().and_then(|f| f.skip_reason(group, &ours)).map(|why| why.to_string())
            }
        };
        match skip {
            None => println!("{name}"),
            Some(why) => eprintln!("skipping APIService {name}: {why}"),
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

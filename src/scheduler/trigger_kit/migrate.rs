//! `migrate`: migrations requested by hand.

use super::*;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;

/// What `migrate` should do.
#[derive(Clone, Debug)]
pub enum MigrateRequest {
    /// `--resource <resource>.<group>`, repeatable.
    Resources(Vec<String>),
    /// `--all`: the initializer's rule ([`migratable_resources`]).
    All,
}

/// Group names of the target's CRDs (empty when it serves no CustomResourceDefinitions).
pub(super) async fn crd_groups(target: &kube::Client, timeout: Duration) -> Result<BTreeSet<String>, DiscoveryError> {
    let list: Option<Value> =
        get_json(target, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", timeout).await?;
    Ok(items(&list).filter_map(|crd| crd["spec"]["group"].as_str().map(str::to_string)).collect())
}

/// Groups served by an aggregated API server (an APIService with spec.service).
pub(super) async fn aggregated_groups(
    target: &kube::Client,
    timeout: Duration,
) -> Result<BTreeSet<String>, DiscoveryError> {
    let list: Option<Value> = get_json(target, "/apis/apiregistration.k8s.io/v1/apiservices", timeout).await?;
    Ok(items(&list)
        .filter(|s| s["spec"]["service"].is_object())
        .filter_map(|s| s["spec"]["group"].as_str().map(str::to_string))
        .collect())
}

pub(super) fn items(list: &Option<Value>) -> impl Iterator<Item = &Value> {
    list.iter().flat_map(|l| l["items"].as_array().into_iter().flatten())
}

/// The resources a request names, resolved against `target`'s discovery (preferred version, current hash).
pub async fn wanted_resources(
    target: &kube::Client,
    request: &MigrateRequest,
) -> anyhow::Result<Vec<DiscoveredResource>> {
    let timeout = Duration::from_secs(30);
    let discovery = discover(target, timeout).await?;
    Ok(match request {
        MigrateRequest::Resources(names) => {
            let mut out = Vec::new();
            for n in names {
                out.push(resolve_resource(&discovery, n)?.clone());
            }
            out
        }
        MigrateRequest::All => {
            if !discovery.failed.is_empty() {
                anyhow::bail!(
                    "discovery failed for some groups, refusing to guess what to migrate: {:?}",
                    discovery.failed
                );
            }
            let crds = crd_groups(target, timeout).await?;
            let aggregated = aggregated_groups(target, timeout).await?;
            migratable_resources(&discovery, &crds, &aggregated)
        }
    })
}

/// Requests migrations by hand: resolves the resources ([`wanted_resources`]) and creates them in `store` exactly
/// as the trigger would, superseding unfinished ones. Returns the names created.
pub async fn request_migrations(
    target: &kube::Client,
    store: &OwnObjects,
    request: &MigrateRequest,
) -> anyhow::Result<Vec<String>> {
    let wanted = wanted_resources(target, request).await?;
    let mut existing = store.list_migrations().await?;
    let mut created = Vec::new();
    for r in wanted {
        let (m, superseded) =
            start_migration(store, &r.gvr(), r.hash.as_deref(), WHY_BY_HAND, &existing, Timestamp::now()).await?;
        for s in superseded {
            tracing::info!(migration = %s, by = %name_of(&m), "superseded");
        }
        created.push(name_of(&m).to_string());
        existing.push(m);
    }
    Ok(created)
}

//! The cluster key-rotation trigger (cluster mode, kube-apiserver 1.34+): migrates the resources whose
//! encryption-at-rest write key the cluster's kube-apiservers changed, once every live one has loaded the change.
//!
//! The leader runs a round ([`reconciler`]) when the set of live kube-apiservers changes, when the mounted copy of
//! the config changes, and every `--cluster-key-rotation-interval`; a round:
//! - finds the live kube-apiservers from their identity Leases in kube-system, as a reflector keeps them
//!   ([`observe::live_identities`]);
//! - scrapes the target's `/metrics` until every live identity has answered with its
//!   `apiserver_encryption_config_controller_last_config_info{apiserver_id_hash,hash}` (behind a load balancer each
//!   scrape reaches one apiserver; at most `--cluster-key-rotation-scrapes` scrapes a round), matching identities by
//!   `apiserver_id_hash` as kube-apiserver derives it from its ID;
//! - decides ([`decide::plan`]): with a copy of the control plane's EncryptionConfiguration
//!   (`--cluster-encryption-provider-config`), once every apiserver reports the copy's hash, it migrates exactly
//!   the resources whose write key (first provider, first key) differs from the one recorded; without a copy, it
//!   migrates the `--encrypted-resources` on every new hash all apiservers share (coarser: any edit of the file,
//!   a read key added or whitespace, rewrites them);
//! - records it on each resource's StorageState ([`record`]): the shared hash, the write key, the observation (who
//!   did not answer, who disagrees), the migration requested and whether the old keys can go.
//!
//! Migrations are requested as the storage-version trigger requests them ([`start_migration`]: the preferred
//! version and storage version hash from discovery, superseding unfinished ones), so the storage-version decider
//! treats them as its own.

pub mod config;
pub mod decide;
pub mod key_id_metrics;
pub mod key_id_rotation;
pub mod observe;
mod reconciler;
pub mod record;

use crate::scheduler::events::{reference_to, EventRecorder, EventType};
use crate::scheduler::trigger::{discover, resolve_resource, start_migration, OwnObjects};
use crate::scheduler::triggers::{Trigger, TriggerContext, TriggerFlags};
use config::ConfigCopy;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use record::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

/// The cluster key-rotation trigger's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterKeyRotationFlags {
    /// Watch the cluster's kube-apiservers (1.34+, cluster mode) and migrate the encrypted resources when their
    /// encryption config changes (see --cluster-encryption-provider-config and --encrypted-resources).
    #[arg(long)]
    pub cluster_key_rotation: bool,
    /// A copy of the EncryptionConfiguration file the kube-apiservers use (mounted read-only). With it, the
    /// trigger waits until every kube-apiserver reports this file's hash and migrates exactly the resources whose
    /// write key changed. Implies --cluster-key-rotation.
    #[arg(long)]
    pub cluster_encryption_provider_config: Option<PathBuf>,
    /// Resources migrated (`<resource>.<group>`, `secrets` for the core group), comma-separated. Without a copy of
    /// the config they are migrated on every new config hash; with one, they are watched besides those it names.
    #[arg(long, value_delimiter = ',', default_value = "secrets")]
    pub encrypted_resources: Vec<String>,
    /// How often the kube-apiservers' metrics are read at least (a change of the set of live kube-apiservers, whose
    /// Leases are watched, or of the config copy makes a round at once).
    #[arg(long, default_value = "1m", value_parser = crate::duration::parse_duration)]
    pub cluster_key_rotation_interval: Duration,
    /// Scrapes of /metrics per round at most, until every live kube-apiserver has answered.
    #[arg(long, default_value_t = 20)]
    pub cluster_key_rotation_scrapes: u32,
}

impl TriggerFlags for ClusterKeyRotationFlags {
    fn trigger(&self) -> Option<Box<dyn Trigger>> {
        (self.cluster_key_rotation || self.cluster_encryption_provider_config.is_some()).then(|| {
            Box::new(ClusterKeyRotation {
                copy: self.cluster_encryption_provider_config.clone(),
                resources: self.encrypted_resources.iter().map(|r| r.trim().to_string()).collect(),
                interval: self.cluster_key_rotation_interval,
                scrapes: self.cluster_key_rotation_scrapes.max(1),
            }) as Box<dyn Trigger>
        })
    }
}

/// The trigger: its leader part only (the observation is the cluster's, the same for every replica).
#[derive(Clone, Debug)]
pub struct ClusterKeyRotation {
    copy: Option<PathBuf>,
    resources: BTreeSet<String>,
    interval: Duration,
    scrapes: u32,
}

impl Trigger for ClusterKeyRotation {
    fn name(&self) -> &'static str {
        "cluster-key-rotation"
    }

    fn start_replica(&self, _ctx: &TriggerContext) -> Option<tokio::task::JoinHandle<()>> {
        None
    }

    fn start_leader(&self, ctx: &TriggerContext, events: &EventRecorder) -> Option<tokio::task::JoinHandle<()>> {
        let (me, mut ctx, events) = (self.clone(), ctx.clone(), events.clone());
        ctx.own = ctx.own.with_manager(crate::scheduler::managers::CLUSTER_KEY_ROTATION);
        Some(tokio::spawn(reconciler::run(me, ctx, events)))
    }
}

/// A resource the trigger watches: its StorageState's name, resource and group, and the StorageState as read this
/// round (None before the first record).
struct Watched {
    name: String,
    resource: String,
    group: String,
    state: Option<crate::api::storage_state::StorageState>,
}

/// `<resource>.<group>` -> (resource, group).
fn split(name: &str) -> (String, String) {
    let (r, g) = name.split_once('.').unwrap_or((name, ""));
    (r.to_string(), g.to_string())
}

impl ClusterKeyRotation {
    /// One round: observe, decide, migrate and record. `leases` are the identity Leases as the reflector has them;
    /// `last` is the previous observation (logged on change).
    async fn round(&self, ctx: &TriggerContext, events: &EventRecorder, leases: &[Lease], last: &mut String) {
        let live = observe::live_identities(leases, Timestamp::now());
        let obs = observe::scrape(&ctx.target, &live, self.scrapes, ctx.config.request_timeout).await;
        let copy = self.copy.as_deref().map(ConfigCopy::read);
        let mut names = self.resources.clone();
        if let Some(Ok(c)) = &copy {
            names.extend(c.named_resources());
        }
        let mut watched = Vec::new();
        let mut resources = BTreeMap::new();
        for name in names {
            let state = match ctx.own.get_state(&name).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(storagestate = %name, error = %e, "cluster key rotation: reading the storagestate");
                    return;
                }
            };
            let (resource, group) = split(&name);
            resources.insert(name.clone(), (resource.clone(), group.clone(), recorded(state.as_ref())));
            watched.push(Watched { name, resource, group, state });
        }
        let plan = decide::plan(&obs, copy.as_ref().map(Result::as_ref), &resources);
        if plan.observed != *last {
            if plan.waiting {
                tracing::warn!(observed = %plan.observed, "cluster key rotation: waiting");
            } else {
                tracing::info!(observed = %plan.observed, "cluster key rotation: the kube-apiservers agree");
            }
            *last = plan.observed.clone();
        }
        for w in &watched {
            let step = plan.steps.get(&w.name);
            if let Err(e) = self.act(ctx, events, w, step, &plan.observed).await {
                tracing::warn!(storagestate = %w.name, error = %e, "cluster key rotation: retrying next round");
            }
        }
    }

    /// Migrates one resource when the plan says so, and records the outcome on its StorageState.
    async fn act(
        &self,
        ctx: &TriggerContext,
        events: &EventRecorder,
        w: &Watched,
        step: Option<&decide::Step>,
        observed: &str,
    ) -> anyhow::Result<()> {
        let (name, state) = (w.name.as_str(), w.state.as_ref());
        let mut annotations = BTreeMap::from([(ANNOTATION_OBSERVED, observed.to_string())]);
        let mut migration = requested_migration(state);
        let mut write_key = recorded(state).write_key;
        if let Some(step) = step {
            if let Some(why) = &step.migrate {
                let created = migrate(&ctx.own, &ctx.target, name, why, ctx.config.request_timeout).await?;
                tracing::info!(storagestate = %name, migration = %created, reason = %why, "cluster key rotation: migration requested");
                if let Some(s) = state {
                    let note = format!("{created} requested: {why}");
                    events.record(&reference_to(s), EventType::Normal, "EncryptionConfigChanged", "Migrate", &note);
                }
                migration = Some(created);
            }
            if let Some(h) = &step.record.hash {
                annotations.insert(ANNOTATION_CONFIG_HASH, h.clone());
            }
            if let Some(k) = &step.record.write_key {
                annotations.insert(ANNOTATION_WRITE_KEY, k.clone());
            }
            write_key = step.record.write_key.clone();
        }
        let mut svm = None;
        if let Some(m) = &migration {
            annotations.insert(ANNOTATION_MIGRATION, m.clone());
            svm = ctx.own.get_migration(m).await?;
            if let Some(svm) = &svm {
                annotations.insert(ANNOTATION_ROTATION, rotation(svm, write_key.as_deref()));
            }
        }
        annotate(&ctx.own, state, name, (&w.resource, &w.group), &annotations).await?;
        // With a copy the write key is known: the StorageState's key fields show the rotation in `kubectl get ss`.
        if let Some(key) = &write_key {
            let previous = recorded(state).write_key.filter(|p| p != key);
            let now = Timestamp::now();
            update_status(&ctx.own, name, |s| key_status(s, key, previous.as_deref(), svm.as_ref(), now)).await?;
        }
        Ok(())
    }
}

/// Requests a migration of `name` on the target, as the storage-version trigger would (discovery's preferred
/// version and storage version hash). Returns the migration's name.
async fn migrate(
    own: &OwnObjects,
    target: &kube::Client,
    name: &str,
    why: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let discovery = discover(target, timeout).await?;
    let r = resolve_resource(&discovery, name)?;
    let existing = own.list_migrations().await?;
    let why = format!("encryption key rotation: {why}");
    let (m, superseded) = start_migration(own, &r.gvr(), r.hash.as_deref(), &why, &existing, Timestamp::now()).await?;
    let created = m.metadata.name.clone().unwrap_or_default();
    for s in superseded {
        tracing::info!(migration = %s, by = %created, "superseded");
    }
    Ok(created)
}

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
//! - decides about KMS v2 key_id rotations ([`key_id_rotation::plan`]), which change nothing in the config: from the
//!   same scrapes, the key_id hash each apiserver's plugin reported last per provider
//!   (`apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds`, [`key_id_metrics`]); once every
//!   live one reports a new key_id for a provider and `--cluster-kms-migration-margin` has passed (the KEP's
//!   passive-migration margin), it migrates the resources that provider writes (the copy's resources whose first
//!   provider it is; without a copy, the `--encrypted-resources`);
//! - records it on each resource's StorageState ([`record`]): the shared hash, the write key, the observation (who
//!   did not answer, who disagrees), the key_ids and a rotation waiting for its margin, the migration requested and
//!   whether the old keys (or key_ids) can go.
//!
//! Migrations are requested as the storage-version trigger requests them ([`start_migration`]: the preferred
//! version and storage version hash from discovery, superseding unfinished ones), so the storage-version decider
//! treats them as its own.

pub mod config;
pub mod decide;
pub mod key_id_metrics;
pub mod key_id_rotation;
pub mod observe;
mod prometheus_text;
mod reconciler;
pub mod record;

use crate::scheduler::events::{reference_to, EventRecorder, EventType};
use crate::scheduler::trigger_kit::{discover, resolve_resource, start_migration, OwnObjects};
use crate::scheduler::trigger_kit::{Trigger, TriggerContext, TriggerFlags};
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
    /// How long after every live kube-apiserver first reports a new key_id for a KMS v2 provider the resources it
    /// writes are migrated: the passive-migration margin of KEP-3299, 3 + N + M minutes (3 minutes of cached write
    /// state, N for every plugin to pick the new key up, M of buffer).
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse_duration)]
    pub cluster_kms_migration_margin: Duration,
}

impl TriggerFlags for ClusterKeyRotationFlags {
    fn trigger(&self) -> Option<Box<dyn Trigger>> {
        (self.cluster_key_rotation || self.cluster_encryption_provider_config.is_some()).then(|| {
            Box::new(ClusterKeyRotation {
                copy: self.cluster_encryption_provider_config.clone(),
                resources: self.encrypted_resources.iter().map(|r| r.trim().to_string()).collect(),
                interval: self.cluster_key_rotation_interval,
                scrapes: self.cluster_key_rotation_scrapes.max(1),
                kms_margin: self.cluster_kms_migration_margin,
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
    kms_margin: Duration,
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
        // KMS v2 key_ids only once the apiservers agree on the config: it says which provider writes what.
        let kms = if plan.waiting {
            BTreeMap::new()
        } else {
            let reported: BTreeSet<String> = obs.key_ids.values().flat_map(|k| k.keys().cloned()).collect();
            let writers = watched
                .iter()
                .map(|w| {
                    let providers = match &copy {
                        Some(Ok(c)) => c.kms_v2_writer(&w.resource, &w.group).into_iter().collect(),
                        _ => reported.clone(),
                    };
                    (w.name.clone(), (providers, recorded_kms(w.state.as_ref())))
                })
                .collect();
            key_id_rotation::plan(&obs, &writers, Timestamp::now(), self.kms_margin)
        };
        let kms_observed: BTreeSet<&str> =
            kms.values().map(|k| k.observed.as_str()).filter(|o| !o.is_empty()).collect();
        let observed = [plan.observed.as_str()].into_iter().chain(kms_observed).collect::<Vec<_>>().join("; ");
        if observed != *last {
            if plan.waiting || kms.values().any(|k| k.rotating()) {
                tracing::warn!(%observed, "cluster key rotation: waiting");
            } else {
                tracing::info!(%observed, "cluster key rotation: the kube-apiservers agree");
            }
            *last = observed;
        }
        for w in &watched {
            let step = plan.steps.get(&w.name);
            if let Err(e) = self.act(ctx, events, w, step, kms.get(&w.name), &plan.observed).await {
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
        kms: Option<&key_id_rotation::KmsStep>,
        observed: &str,
    ) -> anyhow::Result<()> {
        let (name, state) = (w.name.as_str(), w.state.as_ref());
        let mut annotations = BTreeMap::from([(ANNOTATION_OBSERVED, Some(observed.to_string()))]);
        let mut migration = requested_migration(state);
        let mut write_key = recorded(state).write_key;
        // One migration for both reasons when the config and a key_id changed in the same round.
        let config_reason = step.and_then(|s| s.migrate.as_deref());
        let reasons: Vec<&str> =
            [config_reason, kms.and_then(|k| k.migrate.as_deref())].into_iter().flatten().collect();
        if let Some(step) = step {
            if !reasons.is_empty() {
                let why = reasons.join("; ");
                let created = migrate(&ctx.own, &ctx.target, name, &why, ctx.config.request_timeout).await?;
                tracing::info!(storagestate = %name, migration = %created, reason = %why, "cluster key rotation: migration requested");
                if let Some(s) = state {
                    let note = format!("{created} requested: {why}");
                    let reason = if config_reason.is_some() { "EncryptionConfigChanged" } else { "KMSKeyIDChanged" };
                    events.record(&reference_to(s), EventType::Normal, reason, "Migrate", &note);
                }
                migration = Some(created);
            }
            if let Some(h) = &step.record.hash {
                annotations.insert(ANNOTATION_CONFIG_HASH, Some(h.clone()));
            }
            if let Some(k) = &step.record.write_key {
                annotations.insert(ANNOTATION_WRITE_KEY, Some(k.clone()));
            }
            write_key = step.record.write_key.clone();
        }
        if let Some(k) = kms {
            let (key_ids, pending) = kms_annotations(&k.record);
            annotations.insert(ANNOTATION_KMS_KEY_IDS, key_ids);
            annotations.insert(ANNOTATION_KMS_PENDING, pending);
            annotations.insert(ANNOTATION_KMS_OBSERVED, (!k.observed.is_empty()).then(|| k.observed.clone()));
        }
        // Without this round's key_ids (the apiservers disagree on the config), what was recorded stands.
        let before = recorded_kms(state);
        let providers: Vec<&str> = match kms {
            Some(k) => k.providers.iter().map(String::as_str).collect(),
            None => before.key_ids.keys().map(String::as_str).collect(),
        };
        let (status_key, previous) = status_keys(write_key.as_deref(), recorded(state).write_key, kms);
        let mut svm = None;
        if let Some(m) = &migration {
            annotations.insert(ANNOTATION_MIGRATION, Some(m.clone()));
            svm = ctx.own.get_migration(m).await?;
            if let Some(svm) = &svm {
                let with = status_key.as_deref().or(write_key.as_deref());
                annotations.insert(ANNOTATION_ROTATION, Some(rotation(svm, with, &providers)));
            }
        }
        // A key_id rotation not yet migrated: the last migration, done or not, did not rewrite with the new key_id.
        let rotating = kms.map_or(!before.pending.is_empty(), |k| k.rotating());
        if rotating {
            match kms {
                Some(k) => annotations.insert(ANNOTATION_ROTATION, Some(waiting_rotation(k, &providers))),
                None => annotations.remove(ANNOTATION_ROTATION),
            };
        }
        annotate(&ctx.own, state, name, (&w.resource, &w.group), &annotations).await?;
        // With a copy the write key is known: the StorageState's key fields show the rotation in `kubectl get ss`.
        if let Some(key) = &status_key {
            let now = Timestamp::now();
            let done = svm.as_ref().filter(|_| !rotating);
            update_status(&ctx.own, name, |s| key_status(s, key, &previous, done, now)).await?;
        }
        Ok(())
    }
}

/// The rotation annotation while a key_id rotation waits: for its margin, or for every apiserver to report it.
fn waiting_rotation(k: &key_id_rotation::KmsStep, providers: &[&str]) -> String {
    let providers = providers.join(", ");
    match k.waiting_until {
        Some(until) => format!(
            "Waiting: every live kube-apiserver reports a new key_id of kms provider {providers}; the migration \
             starts after {until} (the passive-migration margin); keep the old key_id in the KMS"
        ),
        None => format!(
            "Waiting: the live kube-apiservers report different key_ids of kms provider {providers}; keep the old \
             key_id in the KMS"
        ),
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

//! The key-rotation trigger: when the write key of a resource of this server's own store changes (the first key of
//! the first provider of its `resources` entry in `--encryption-provider-config`), at a reload or at a restart, it
//! migrates that resource, so that every stored value is rewritten with the new key, and then counts the stored
//! values per key to say, in the resource's StorageState, that no value uses any other key: the old key can go.
//!
//! Any other edit of the config (a read key added or removed, whitespace) changes the config's hash but not a
//! write key, and starts nothing. The migration is a StorageVersionMigration like any other (the migrator runs
//! it, with its progress and Events), requested through [`start_migration`] with the reason
//! [`WHY_KEY_CHANGED`] in `migration.k8s.io/reason`.
//!
//! What it records per resource, in the StorageState's status (optional fields added to upstream's shape):
//! `encryptionWriteKey` (and since when), `persistedEncryptionKeys` (the keys values may still use: a new write key
//! is appended at the change; after the migration, exactly the counted ones), `encryptionKeyCounts` and
//! `encryptionKeyRotation` (`Rotating`, `Finished`, `Incomplete`). The decisions are pure ([`decide`]); with several
//! replicas the write key every live replica uses is an input of [`decide`], and a rotation waits until they agree.
//!
//! It runs on the leader, and only for this server's own store (standalone, not with a cluster as the target,
//! whose stores are not ours), and only for resources the storage-version trigger keeps StorageStates for.

mod decide;
pub use decide::*;
mod reconciler;

use crate::api::storage_state::{StorageState, StorageStateStatus};
use crate::api::storage_version_migration::StorageVersionMigration;
use crate::scheduler::events::{reference_to, EventRecorder, EventType};
use crate::scheduler::trigger_kit::{start_migration, OwnObjects, StoreError, STATE_WRITE_ATTEMPTS};
use crate::scheduler::trigger_kit::{Trigger, TriggerContext, TriggerFlags};
use crate::storage::encryption::EncryptionConfigHandle;
use crate::storage::StorageError;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

/// `migration.k8s.io/reason` of the migrations this trigger requests.
pub const WHY_KEY_CHANGED: &str = "encryption write key changed";
/// Event reason on the StorageState: a migration was requested for a new write key.
pub const EVENT_ROTATION_STARTED: &str = "EncryptionKeyRotationStarted";
/// Event reason on the StorageState: the count after the migration found every value under the write key.
pub const EVENT_ROTATION_FINISHED: &str = "EncryptionKeyRotationFinished";
/// Event reason on the StorageState: values under other keys were left after the migration.
pub const EVENT_ROTATION_INCOMPLETE: &str = "EncryptionKeyRotationIncomplete";

/// The key-rotation trigger's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct KeyRotationFlags {
    /// Do not migrate resources whose encryption write key changed (the key-rotation trigger).
    #[arg(long)]
    pub disable_key_rotation_trigger: bool,
    /// How often the key-rotation trigger checks every resource even without a reload or a finished migration.
    #[arg(long, default_value = "1m", value_parser = crate::duration::parse_duration)]
    pub key_rotation_interval: Duration,
}

impl TriggerFlags for KeyRotationFlags {
    fn trigger(&self) -> Option<Box<dyn Trigger>> {
        (!self.disable_key_rotation_trigger)
            .then(|| Box::new(KeyRotationTrigger { interval: self.key_rotation_interval }) as Box<dyn Trigger>)
    }
}

/// What the trigger reads of this process, besides the target: its own encrypted store, only when that store is
/// the target (standalone; a cluster's stores are not ours), and with several replicas on etcd the key each live
/// replica writes with. Without it in [`TriggerContext::inputs`] the trigger does nothing.
#[derive(Clone)]
pub struct OwnStoreKeys {
    pub encryption: EncryptionConfigHandle,
    pub replica_writes: Option<std::sync::Arc<crate::storage::encryption::replicas::WriteGate>>,
}

pub struct KeyRotationTrigger {
    interval: Duration,
}

impl Trigger for KeyRotationTrigger {
    fn name(&self) -> &'static str {
        "key-rotation"
    }

    fn start_replica(&self, _ctx: &TriggerContext) -> Option<tokio::task::JoinHandle<()>> {
        None
    }

    fn start_leader(&self, ctx: &TriggerContext, events: &EventRecorder) -> Option<tokio::task::JoinHandle<()>> {
        let OwnStoreKeys { encryption, replica_writes } = ctx.inputs.get::<OwnStoreKeys>()?.clone();
        let rotator = Rotator {
            own: ctx.own.with_manager(crate::scheduler::managers::KEY_ROTATION),
            target: ctx.target.clone(),
            timeout: ctx.config.request_timeout,
            encryption,
            replica_writes,
            events: events.clone(),
        };
        Some(tokio::spawn(reconciler::run(rotator, self.interval)))
    }
}

/// The leader's part: what the reconciles of the StorageStates act with ([`reconciler`]).
struct Rotator {
    own: OwnObjects,
    target: kube::Client,
    timeout: Duration,
    encryption: EncryptionConfigHandle,
    /// With several replicas on etcd: what each live replica writes with (else only this one's config counts).
    replica_writes: Option<std::sync::Arc<crate::storage::encryption::replicas::WriteGate>>,
    events: EventRecorder,
}

impl Rotator {
    /// The key each live replica writes `resource` with; without several replicas, this one's configured key.
    fn live_writers(&self, resource: &str, configured: &str) -> Vec<String> {
        let key = crate::storage::encryption::resource_key_prefix(resource);
        match &self.replica_writes {
            Some(gate) => gate.writers_of(&key),
            None => vec![configured.to_string()],
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn act(
        &self,
        state: &StorageState,
        decision: Decision,
        configured: &str,
        served: &crate::scheduler::trigger_kit::DiscoveredResource,
        migrations: &[&StorageVersionMigration],
        now: Timestamp,
    ) -> Result<(), RoundError> {
        let name = state.metadata.name.as_deref().unwrap_or_default();
        match decision {
            Decision::Record => {
                let counts = self.count(&state.spec.resource.state_name()).await?;
                let written = self.write_status(name, |s| counted_status(s, configured, &counts, now)).await?;
                tracing::info!(storagestate = %name, write_key = configured, counts = ?counts, "key rotation: write key recorded");
                self.note_count(&written, configured, &counts);
            }
            Decision::Rotate { from, to } => {
                self.write_status(name, |s| rotating_status(s, &to, now)).await?;
                let why = format!("{WHY_KEY_CHANGED} from {from} to {to}");
                self.migrate(state, served, migrations, &why, now).await?;
            }
            Decision::Migrate => {
                let why = format!("{WHY_KEY_CHANGED} to {configured}");
                self.migrate(state, served, migrations, &why, now).await?;
            }
            Decision::Count => {
                let counts = self.count(&state.spec.resource.state_name()).await?;
                let written = self.write_status(name, |s| counted_status(s, configured, &counts, now)).await?;
                self.note_count(&written, configured, &counts);
            }
            Decision::Failed { migration } => {
                tracing::warn!(storagestate = %name, migration = %migration, write_key = configured,
                    "key rotation: the migration failed; values may still use other keys until a migration of the resource succeeds");
            }
            Decision::WaitForReplicas | Decision::Wait | Decision::Nothing => {}
        }
        Ok(())
    }

    async fn migrate(
        &self,
        state: &StorageState,
        served: &crate::scheduler::trigger_kit::DiscoveredResource,
        migrations: &[&StorageVersionMigration],
        why: &str,
        now: Timestamp,
    ) -> Result<(), RoundError> {
        // The reason annotation is a fixed text (filterable); the keys go to the log and the Event.
        let (created, superseded) =
            start_migration(&self.own, &served.gvr(), served.hash.as_deref(), WHY_KEY_CHANGED, migrations, now).await?;
        let name = state.metadata.name.as_deref().unwrap_or_default();
        tracing::info!(storagestate = %name, migration = %created.metadata.name.as_deref().unwrap_or_default(), superseded = ?superseded, why,
            "key rotation: migration requested");
        let note = format!(
            "Requested StorageVersionMigration {}: {why}",
            created.metadata.name.as_deref().unwrap_or_default()
        );
        self.events.record(&reference_to(state), EventType::Normal, EVENT_ROTATION_STARTED, "RequestMigration", &note);
        Ok(())
    }

    /// The stored values of `resource` (`<resource>.<group>`) per key label, counted in the store.
    async fn count(&self, resource: &str) -> Result<BTreeMap<String, u64>, RoundError> {
        let counts = self.encryption.count().await?;
        Ok(counts.0.get(resource).cloned().unwrap_or_default())
    }

    /// The Event after a count: Finished (the old keys can go) or Incomplete.
    fn note_count(&self, state: &StorageState, write_key: &str, counts: &BTreeMap<String, u64>) {
        let status = state.status.clone().unwrap_or_default();
        let total: u64 = counts.values().sum();
        let (reason, note) = match status.encryption_key_rotation.as_deref() {
            Some(FINISHED) => (
                EVENT_ROTATION_FINISHED,
                format!("All {total} stored values are encrypted with {write_key}; no other key is in use for this resource"),
            ),
            _ => (
                EVENT_ROTATION_INCOMPLETE,
                format!("Stored values still use other keys than {write_key}: {}", describe_counts(counts)),
            ),
        };
        tracing::info!(storagestate = ?state.metadata.name, counts = %describe_counts(counts), "key rotation: {note}");
        self.events.record(&reference_to(state), EventType::Normal, reason, "CountEncryptionKeys", &note);
    }

    /// Writes `change(status)` into the StorageState `name` through /status, from a fresh read on conflicts.
    async fn write_status(
        &self,
        name: &str,
        change: impl Fn(&StorageStateStatus) -> StorageStateStatus,
    ) -> Result<StorageState, RoundError> {
        for _ in 0..STATE_WRITE_ATTEMPTS {
            let Some(mut state) = self.own.get_state(name).await? else {
                return Err(RoundError::Gone(name.to_string()));
            };
            state.status = Some(change(&state.status.clone().unwrap_or_default()));
            match self.own.update_state_status(&state).await {
                Ok(written) => return Ok(written),
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RoundError::Conflicts(name.to_string()))
    }
}

/// Why a round, or one resource's decision, did not complete.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Own(#[from] StoreError),
    #[error(transparent)]
    Discovery(#[from] crate::scheduler::trigger_kit::DiscoveryError),
    #[error("counting stored values: {0}")]
    Count(#[from] StorageError),
    #[error("storagestate {0} was deleted")]
    Gone(String),
    #[error("storagestate {0}: too many conflicting writes")]
    Conflicts(String),
}

/// `aesgcm:v1:key1=3, identity=1`
fn describe_counts(counts: &BTreeMap<String, u64>) -> String {
    counts.iter().map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(", ")
}

//! Decisions about one StorageState (the leader).

use super::*;
use crate::api::storage_state::{StorageState, StorageStateStatus, UNKNOWN_HASH};
use crate::api::storage_version_migration::{StorageVersionMigration, CONDITION_FAILED, CONDITION_SUCCEEDED};
use crate::scheduler::events::{reference_to, EventRecorder, EventType};
use crate::scheduler::report::{reports, Reports};
use crate::scheduler::SchedulerConfig;
use k8s_openapi::jiff::Timestamp;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// What the leader does about one resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The StorageState status to write (persisted refined after a success), when it changes.
    pub status: Option<StorageStateStatus>,
    /// Request a migration to this hash (it supersedes unfinished migrations of the resource).
    pub start: Option<String>,
    /// Cancel every unfinished migration of the resource (Failed, reason Superseded) with this message: the
    /// replicas disagree.
    pub cancel: Option<String>,
    /// Why nothing was started although the objects may be stored in another version (for logs and tests).
    pub waiting: Option<&'static str>,
}

pub(super) fn latest_for_hash<'a, M: Borrow<StorageVersionMigration>>(
    migrations: &'a [M],
    hash: &str,
) -> Option<&'a StorageVersionMigration> {
    latest(migrations).filter(|m| migration_hash(m) == Some(hash))
}

/// The leader's decision for one resource, from its StorageState (the replicas' reports), its migrations (of this
/// resource), whether the start-up check reset it, and — with several replicas — who reported at the leader's
/// previous periodic round.
///
/// Seed 002 (HA): a migration starts only when persisted has "Unknown" or more than one hash, all reports are
/// fresh (no older than one interval) and agree; unfinished migrations are cancelled once the reports diverge; when
/// the latest migration of the agreed hash Succeeded, persisted = [that hash].
///
/// The KEP asks in addition that the hashes "have been identical in the past two polls", yet its own walkthrough
/// starts the migration in the poll in which agreement first appears (minutes 20 and 40). We follow the
/// walkthrough and keep that rule's stated purpose — "to give newly deployed triggering controllers a chance to
/// report" — as: the set of reporters must be the one the leader saw at its previous periodic round. A new replica
/// (or a new leader, or a new resource) therefore delays the start by one poll; a reporter that merely changes its
/// hash does not. With one replica that set is trivially stable, and the KEP's non-HA rule applies: the change is
/// acted on at once.
///
/// Unchanged from the single-replica trigger: an unfinished migration of the agreed hash is kept (never restarted:
/// a restart resumes it), a Failed one (not superseded) is not relaunched automatically (it waits for `migrate` by
/// hand), and only migrations requested since the StorageState was created count (deleting a StorageState resets
/// it, as the KEP says).
pub fn decide<M: Borrow<StorageVersionMigration>>(
    state: &StorageState,
    migrations: &[M],
    now: Timestamp,
    interval: Duration,
    reset: bool,
    replicas: Replicas,
    previous_round: Option<&BTreeSet<String>>,
) -> Decision {
    let no_status = StorageStateStatus::default();
    let status = state.status.as_ref().unwrap_or(&no_status);
    let (hash, fresh, reporters) = match reports(status, now, interval) {
        Reports::None => return Decision { waiting: Some("no reports"), ..Default::default() },
        Reports::Diverge { hashes } => {
            let cancel = migrations.iter().any(|m| !is_finished(m.borrow())).then(|| superseded_by_divergence(&hashes));
            return Decision {
                cancel,
                waiting: Some("the replicas report different storage versions"),
                ..Default::default()
            };
        }
        Reports::Agree { hash, fresh, reporters } => (hash, fresh, reporters),
    };
    // Only migrations requested since the StorageState was created (creationTimestamp has whole seconds).
    let created = state.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    let counted: Vec<&StorageVersionMigration> = migrations
        .iter()
        .map(Borrow::borrow)
        .filter(|m| !is_finished(m) || created.is_none_or(|c| requested_at(m).is_none_or(|r| r.as_second() >= c)))
        .collect();
    let current = latest_for_hash(&counted, &hash);
    let unfinished = current.is_some_and(|m| !is_finished(m));
    let succeeded = current.is_some_and(|m| m.is_true(CONDITION_SUCCEEDED));
    let failed = current.is_some_and(|m| m.is_true(CONDITION_FAILED) && !is_superseded(m));
    let migrated = status.persisted_storage_version_hashes == [hash.as_str()];
    let mut d = Decision::default();
    if succeeded && !reset {
        if !migrated {
            let mut next = status.clone();
            next.persisted_storage_version_hashes = vec![hash.clone()];
            d.status = Some(next);
        }
        return d;
    }
    if migrated && !reset {
        return d;
    }
    if unfinished {
        d.waiting = Some("its migration is under way");
        return d;
    }
    if failed && !reset {
        d.waiting = Some("its migration failed; request a new one with `migrate`");
        return d;
    }
    let stable = match replicas {
        Replicas::One => true,
        Replicas::Several => previous_round == Some(&reporters),
    };
    if !fresh {
        d.waiting = Some("a report is older than one discovery interval");
    } else if !stable {
        d.waiting = Some("the set of reporters changed since the previous poll");
    } else {
        d.start = Some(hash);
    }
    d
}

/// Whether a StorageState's heartbeat is older than two discovery intervals (or missing): the trigger may have
/// missed storage version changes, so persisted is no longer trustworthy.
pub fn is_stale(state: &StorageState, now: Timestamp, interval: Duration) -> bool {
    let Some(hb) = state.status.as_ref().and_then(|s| s.last_heartbeat_time.as_ref()) else { return true };
    let age_ms = now.as_millisecond().saturating_sub(hb.0.as_millisecond());
    age_ms > 2 * i64::try_from(interval.as_millis()).unwrap_or(i64::MAX / 4)
}

/// What the leader did about one resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The migration requested, if any.
    pub started: Option<String>,
    /// Migrations superseded (by the new one, or cancelled because the reports diverged).
    pub superseded: Vec<String>,
    /// persisted as written, when the leader wrote it.
    pub persisted: Option<Vec<String>>,
    pub waiting: Option<&'static str>,
}

/// The leader's side of the trigger: carries out [`decide`] for one StorageState at a time, given the migrations
/// of its resource (from the decider controller's reflector store), writing through the
/// scheduler's client. Decisions about different StorageStates may run at once: what it remembers per
/// StorageState sits behind locks held only between requests, never across one.
pub struct Decider {
    store: OwnObjects,
    interval: Duration,
    history: usize,
    pub(super) replicas: Replicas,
    served: Served,
    /// StorageStates reset at start-up that still need their migration.
    reset_pending: Mutex<HashSet<String>>,
    /// Who reported, per StorageState, at its previous periodic round.
    previous_round: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Where the decisions are recorded as Events regarding the StorageState (none: only logged).
    events: Option<EventRecorder>,
}

/// Event reasons regarding a StorageState.
pub const EVENT_MIGRATION_REQUESTED: &str = "MigrationRequested";
pub const EVENT_STALE_STATE_RESET: &str = "StaleStorageStateReset";

/// The data behind a lock, also after a panic elsewhere (it holds plain sets, consistent between statements).
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Who reports into a StorageState.
fn reporters_of(state: &StorageState) -> BTreeSet<String> {
    state.status.iter().flat_map(|st| st.current_storage_version_hashes.iter().map(|r| r.reporter_id.clone())).collect()
}

impl Decider {
    pub fn new(store: OwnObjects, config: &SchedulerConfig, served: Served) -> Self {
        Decider {
            store,
            interval: config.discovery_interval,
            history: config.migration_history.max(1),
            replicas: config.replicas,
            served,
            reset_pending: Mutex::default(),
            previous_round: Mutex::default(),
            events: None,
        }
    }

    /// Records the decisions as Events too.
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = Some(events);
        self
    }

    fn record(&self, state: &StorageState, reason: &str, action: &str, note: &str) {
        if let Some(events) = &self.events {
            events.record(&reference_to(state), EventType::Normal, reason, action, note);
        }
    }

    /// Start-up of a leader: StorageStates whose heartbeat is older than two intervals get persisted = ["Unknown"].
    pub async fn reset_stale(&self, now: Timestamp) -> Result<Vec<String>, StoreError> {
        let mut reset = Vec::new();
        for mut s in self.store.list_states().await? {
            if !is_stale(&s, now, self.interval) {
                continue;
            }
            let name = s.metadata.name.clone().unwrap_or_default();
            for attempt in 0..5 {
                let heartbeat = s.status.as_ref().and_then(|st| st.last_heartbeat_time.as_ref());
                let heartbeat = heartbeat.map_or("never".to_string(), |t| t.0.to_string());
                // A conflict replaces `s` with a fresh read, so the status is set on it in place.
                s.status.get_or_insert_with(Default::default).persisted_storage_version_hashes =
                    vec![UNKNOWN_HASH.to_string()];
                match self.store.update_state_status(&s).await {
                    Ok(_) => {
                        tracing::info!(storagestate = %name, heartbeat = %heartbeat,
                            "trigger: heartbeat older than two discovery intervals, persisted storage versions reset to Unknown");
                        let note = format!("Last heartbeat {heartbeat} is older than two discovery intervals: storage version changes may have been missed, persisted storage version hashes reset to [\"{UNKNOWN_HASH}\"]");
                        self.record(&s, EVENT_STALE_STATE_RESET, "Reset", &note);
                        locked(&self.reset_pending).insert(name.clone());
                        reset.push(name);
                        break;
                    }
                    Err(e) if e.is_conflict() && attempt < 4 => match self.store.get_state(&name).await? {
                        Some(fresh) => s = fresh,
                        None => break,
                    },
                    Err(e) => {
                        tracing::warn!(storagestate = %name, error = %e, "trigger: resetting a stale storagestate");
                        break;
                    }
                }
            }
        }
        Ok(reset)
    }

    /// A periodic round over every StorageState at once, read through the API: what the decider controller's
    /// requeues do one StorageState at a time. Returns the outcome per StorageState (a failed decision is logged).
    pub async fn round(&self, now: Timestamp) -> Result<BTreeMap<String, Outcome>, StoreError> {
        let states = self.store.list_states().await?;
        let all = self.store.list_migrations().await?;
        let mut out = BTreeMap::new();
        for s in &states {
            let name = s.metadata.name.clone().unwrap_or_default();
            let mine = of_resource(&all, &s.spec.resource.group, &s.spec.resource.resource);
            match self.reconcile(s, &mine, now, true).await {
                Ok(o) => drop(out.insert(name, o)),
                Err(e) => {
                    tracing::warn!(storagestate = %name, error = %e, "trigger: deciding about a resource failed; retrying")
                }
            }
        }
        Ok(out)
    }

    /// A decision about one StorageState outside the periodic rounds (it changed, or a migration of its resource
    /// did), read through the API.
    pub async fn resource(&self, name: &str, now: Timestamp) -> Result<Outcome, StoreError> {
        let Some(s) = self.store.get_state(name).await? else { return Ok(Outcome::default()) };
        let all = self.store.list_migrations().await?;
        let mine = of_resource(&all, &s.spec.resource.group, &s.spec.resource.resource);
        self.reconcile(&s, &mine, now, false).await
    }

    /// The decision about `state`, given the migrations of its resource, carried out. `round`: a periodic round,
    /// after whose decision who reported is remembered for the next one.
    pub async fn reconcile<M: Borrow<StorageVersionMigration>>(
        &self,
        state: &StorageState,
        migrations: &[M],
        now: Timestamp,
        round: bool,
    ) -> Result<Outcome, StoreError> {
        let name = state.metadata.name.as_deref().unwrap_or_default();
        let reset = locked(&self.reset_pending).contains(name);
        let previous = {
            let mut rounds = locked(&self.previous_round);
            if round {
                rounds.insert(name.to_string(), reporters_of(state))
            } else {
                rounds.get(name).cloned()
            }
        };
        let decision = decide(state, migrations, now, self.interval, reset, self.replicas, previous.as_ref());
        if decision.start.is_none() {
            return self.carry_out(state, decision, migrations, reset, now).await;
        }
        // The migrations given may come from a store that does not show yet the migration this decider requested
        // moments ago (its watch event is on the way). A decision to request one is therefore taken again from a
        // fresh read, so that a lagging store never yields a duplicate: requests are rare, and reading back then
        // is simpler than remembering each request until the store shows it (and forgetting it when it never
        // will, as for a migration deleted meanwhile).
        let all = self.store.list_migrations().await?;
        let fresh = of_resource(&all, &state.spec.resource.group, &state.spec.resource.resource);
        let decision = decide(state, &fresh, now, self.interval, reset, self.replicas, previous.as_ref());
        self.carry_out(state, decision, &fresh, reset, now).await
    }

    /// Carries out `d` for `state`, whose migrations are `migrations`.
    async fn carry_out<M: Borrow<StorageVersionMigration>>(
        &self,
        state: &StorageState,
        d: Decision,
        migrations: &[M],
        reset: bool,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let name = state.metadata.name.as_deref().unwrap_or_default();
        let mut out = Outcome { waiting: d.waiting, ..Default::default() };
        if let Some(message) = &d.cancel {
            for m in migrations.iter().map(Borrow::borrow).filter(|m| !is_finished(m)) {
                if supersede(&self.store, m, message, now).await?.is_some() {
                    tracing::info!(resource = %name, migration = %name_of(m), "trigger: the replicas disagree on the storage version, migration cancelled");
                    out.superseded.push(name_of(m).to_string());
                }
            }
        }
        if let Some(hash) = &d.start {
            self.start(state, migrations, hash, reset, now, &mut out).await?;
        } else if d.cancel.is_none() {
            // At most one migration of a resource runs: the latest requested.
            if let Some(keep) = latest(migrations).map(name_of) {
                let message = superseded_by(keep);
                for m in to_supersede(migrations, keep) {
                    if supersede(&self.store, m, &message, now).await?.is_some() {
                        out.superseded.push(name_of(m).to_string());
                    }
                }
            }
        }
        // What was requested or superseded just now counts for the history at the decision its watch event brings.
        let deleted = prune_history(&self.store, migrations, self.history).await?;
        if !deleted.is_empty() {
            tracing::info!(resource = %name, deleted = ?deleted, keep = self.history,
                "trigger: finished migrations beyond the history limit deleted");
        }
        if let Some(status) = d.status {
            out.persisted = self.write_status(state, status).await?;
        }
        Ok(out)
    }

    /// Writes the status [`decide`] asked for (persisted refined after a success). Returns persisted as written;
    /// None when `state` was outdated (a replica reported meanwhile): the newer StorageState's watch event brings
    /// another decision, which writes it then.
    async fn write_status(
        &self,
        state: &StorageState,
        status: StorageStateStatus,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let name = state.metadata.name.as_deref().unwrap_or_default();
        let persisted = status.persisted_storage_version_hashes.clone();
        let next = StorageState { metadata: state.metadata.clone(), spec: state.spec.clone(), status: Some(status) };
        match self.store.update_state_status(&next).await {
            Ok(_) => {
                tracing::info!(storagestate = %name, persisted = ?persisted,
                    "trigger: migration succeeded; objects are stored in the current storage version");
                Ok(Some(persisted))
            }
            Err(e) if e.is_conflict() => {
                tracing::debug!(storagestate = %name, "trigger: storagestate changed meanwhile; decided again on its next version");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Requests the migration [`decide`] asked for (it supersedes the unfinished ones), with the version this
    /// replica's target serves the resource in; none when it does not serve it.
    async fn start<M: Borrow<StorageVersionMigration>>(
        &self,
        state: &StorageState,
        migrations: &[M],
        hash: &str,
        reset: bool,
        now: Timestamp,
        out: &mut Outcome,
    ) -> Result<(), StoreError> {
        let name = state.metadata.name.as_deref().unwrap_or_default();
        let gvr = self.served.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned();
        let Some(gvr) = gvr else {
            out.waiting = Some("the local target does not serve the resource");
            tracing::warn!(resource = %name, "trigger: a migration is due but this replica's target does not serve the resource");
            return Ok(());
        };
        let persisted = state.status.as_ref().map(|s| &s.persisted_storage_version_hashes);
        let why = if reset {
            WHY_STALE
        } else if persisted.is_some_and(|p| p.iter().any(|h| h != UNKNOWN_HASH && h != hash)) {
            WHY_CHANGED_HASH
        } else {
            WHY_NEW_HASH
        };
        let (created, superseded) = start_migration(&self.store, &gvr, Some(hash), why, migrations, now).await?;
        tracing::info!(resource = %name, hash = %hash, reason = why, migration = %name_of(&created),
            superseded = ?superseded, "trigger: storage version migration requested");
        let note =
            format!("Requested StorageVersionMigration {} to storage version hash {hash}: {why}", name_of(&created));
        self.record(state, EVENT_MIGRATION_REQUESTED, "RequestMigration", &note);
        out.started = Some(name_of(&created).to_string());
        out.superseded.extend(superseded);
        locked(&self.reset_pending).remove(name);
        Ok(())
    }
}

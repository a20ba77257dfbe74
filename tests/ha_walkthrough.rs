//! Seed 002's "Case walkthrough" (Extended API proposal for HA cluster), replayed with simulated time: three API
//! servers, each with its own reporter, a rolling upgrade v1 -> v2 from minute 3, apiserver 3 rolled back at minute
//! 22 and upgraded again at 34, the migration completed at minute 45. Polls every 10 minutes.
//!
//! It drives the real code: the reporters' [`report`] and the leader's [`Decider`] (the functions the server's
//! reporter and decider tasks call), over an in-memory store of StorageStates and StorageVersionMigrations with
//! resourceVersions and conflicts like the registry's. Each report is followed by a decision, as the server's
//! decider reacts to every StorageState change, and every poll ends with the leader's periodic round. The
//! migrator's part (Running, then Succeeded) is played by hand.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use migration_apiserver::api::storage_state::StorageState;
use migration_apiserver::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, StorageVersionMigrationStatus,
};
use migration_apiserver::scheduler::trigger::{
    is_finished, is_superseded, report, Decider, DiscoveredResource, Discovery, MigrationStore, Replicas, Served,
    StateStore, StoreError,
};
use migration_apiserver::scheduler::SchedulerConfig;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const INTERVAL: Duration = Duration::from_secs(600);
const NAME: &str = "deployments.apps";
const REPORTERS: [&str; 3] = ["apiserver-1", "apiserver-2", "apiserver-3"];

fn minute(m: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + m * 60).expect("timestamp")
}

/// StorageStates and StorageVersionMigrations in memory: resourceVersions, compare-and-swap (409), generateName,
/// creationTimestamp from the simulated clock.
#[derive(Default)]
struct Memory {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    now: Option<Timestamp>,
    rv: u64,
    states: BTreeMap<String, StorageState>,
    migrations: BTreeMap<String, StorageVersionMigration>,
}

impl Inner {
    fn stamp(&mut self, meta: &mut ObjectMeta) {
        self.rv += 1;
        meta.resource_version = Some(self.rv.to_string());
    }
}

fn conflict(what: &str) -> StoreError {
    StoreError { code: 409, message: format!("{what}: the object has been modified") }
}

impl Memory {
    fn set_now(&self, t: Timestamp) {
        self.inner.lock().expect("lock").now = Some(t);
    }
    fn state(&self) -> StorageState {
        self.inner.lock().expect("lock").states.get(NAME).cloned().expect("the StorageState")
    }
    fn migrations(&self) -> Vec<StorageVersionMigration> {
        self.inner.lock().expect("lock").migrations.values().cloned().collect()
    }
    /// The migrator's part: the condition `type_` True on migration `name`.
    fn set_phase(&self, name: &str, type_: &str) {
        let mut i = self.inner.lock().expect("lock");
        let mut m = i.migrations.get(name).cloned().expect("migration");
        m.status = Some(StorageVersionMigrationStatus {
            conditions: vec![MigrationCondition { type_: type_.into(), status: "True".into(), ..Default::default() }],
            ..Default::default()
        });
        i.stamp(&mut m.metadata);
        i.migrations.insert(name.to_string(), m);
    }
}

#[async_trait::async_trait]
impl StateStore for Memory {
    async fn list_states(&self) -> Result<Vec<StorageState>, StoreError> {
        Ok(self.inner.lock().expect("lock").states.values().cloned().collect())
    }
    async fn get_state(&self, name: &str) -> Result<Option<StorageState>, StoreError> {
        Ok(self.inner.lock().expect("lock").states.get(name).cloned())
    }
    async fn create_state(&self, s: &StorageState) -> Result<StorageState, StoreError> {
        let mut i = self.inner.lock().expect("lock");
        let name = s.metadata.name.clone().unwrap_or_default();
        if i.states.contains_key(&name) {
            return Err(conflict(&name));
        }
        let mut s = s.clone();
        s.metadata.creation_timestamp = i.now.map(Time);
        s.status = None;
        i.stamp(&mut s.metadata);
        i.states.insert(name, s.clone());
        Ok(s)
    }
    async fn update_state_status(&self, s: &StorageState) -> Result<StorageState, StoreError> {
        let mut i = self.inner.lock().expect("lock");
        let name = s.metadata.name.clone().unwrap_or_default();
        let cur = i.states.get(&name).cloned().ok_or(StoreError { code: 404, message: name.clone() })?;
        if s.metadata.resource_version.is_some() && s.metadata.resource_version != cur.metadata.resource_version {
            return Err(conflict(&name));
        }
        let mut next = cur;
        next.status = s.status.clone();
        i.stamp(&mut next.metadata);
        i.states.insert(name, next.clone());
        Ok(next)
    }
    async fn delete_state(&self, s: &StorageState) -> Result<bool, StoreError> {
        let mut inner = self.inner.lock().expect("lock");
        let name = s.metadata.name.clone().unwrap_or_default();
        let unchanged =
            inner.states.get(&name).is_some_and(|cur| cur.metadata.resource_version == s.metadata.resource_version);
        if unchanged {
            inner.states.remove(&name);
        }
        Ok(unchanged)
    }
}

#[async_trait::async_trait]
impl MigrationStore for Memory {
    async fn list_migrations(&self) -> Result<Vec<StorageVersionMigration>, StoreError> {
        Ok(self.migrations())
    }
    async fn get_migration(&self, name: &str) -> Result<Option<StorageVersionMigration>, StoreError> {
        Ok(self.inner.lock().expect("lock").migrations.get(name).cloned())
    }
    async fn create_migration(&self, m: &StorageVersionMigration) -> Result<StorageVersionMigration, StoreError> {
        let mut i = self.inner.lock().expect("lock");
        let mut m = m.clone();
        let name = format!("{}{}", m.metadata.generate_name.clone().unwrap_or_default(), i.migrations.len() + 1);
        m.metadata.name = Some(name.clone());
        m.metadata.creation_timestamp = i.now.map(Time);
        i.stamp(&mut m.metadata);
        i.migrations.insert(name, m.clone());
        Ok(m)
    }
    async fn update_migration_status(
        &self,
        m: &StorageVersionMigration,
    ) -> Result<StorageVersionMigration, StoreError> {
        let mut i = self.inner.lock().expect("lock");
        let name = m.metadata.name.clone().unwrap_or_default();
        let cur = i.migrations.get(&name).cloned().ok_or(StoreError { code: 404, message: name.clone() })?;
        if m.metadata.resource_version.is_some() && m.metadata.resource_version != cur.metadata.resource_version {
            return Err(conflict(&name));
        }
        let mut next = cur;
        next.status = m.status.clone();
        i.stamp(&mut next.metadata);
        i.migrations.insert(name, next.clone());
        Ok(next)
    }
    async fn delete_migration(&self, name: &str) -> Result<(), StoreError> {
        self.inner.lock().expect("lock").migrations.remove(name);
        Ok(())
    }
}

fn gvr() -> GroupVersionResource {
    GroupVersionResource { group: "apps".into(), version: "v1".into(), resource: "deployments".into() }
}

/// What one API server's discovery shows: deployments.apps with storage version hash `sv`.
fn discovery(sv: &str) -> Discovery {
    Discovery {
        resources: vec![DiscoveredResource {
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
            kind: "Deployment".into(),
            hash: Some(sv.into()),
            verbs: ["get", "list", "patch", "update"].iter().map(|v| v.to_string()).collect(),
            versions: vec!["v1".into()],
        }],
        failed: Default::default(),
    }
}

struct Cluster {
    store: Arc<Memory>,
    leader: Decider<Memory>,
    /// The storage version each API server serves now.
    sv: [&'static str; 3],
}

impl Cluster {
    /// A poll at minute `m`: every reporter reports what its API server serves (the leader decides after each
    /// report, as its watch of StorageStates makes it), then the leader's periodic round.
    async fn poll(&mut self, m: i64) {
        let now = minute(m);
        self.store.set_now(now);
        for (reporter, sv) in REPORTERS.iter().zip(self.sv) {
            let written = report(&*self.store, reporter, &discovery(sv), now, INTERVAL, Replicas::Several).await;
            assert_eq!(written, [NAME]);
            self.leader.resource(NAME, now).await.expect("decision");
        }
        self.leader.round(now).await.expect("round");
    }

    /// CurrentSV: the reported hashes, apiserver 1 to 3.
    fn current_sv(&self) -> Vec<String> {
        let st = self.store.state().status.unwrap_or_default();
        REPORTERS
            .iter()
            .map(|r| {
                st.current_storage_version_hashes
                    .iter()
                    .find(|e| e.reporter_id == *r)
                    .map(|e| e.current_storage_version_hash.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    fn persisted_sv(&self) -> Vec<String> {
        self.store.state().status.unwrap_or_default().persisted_storage_version_hashes
    }

    fn names(&self, pred: impl Fn(&StorageVersionMigration) -> bool) -> Vec<String> {
        self.store.migrations().iter().filter(|m| pred(m)).filter_map(|m| m.metadata.name.clone()).collect()
    }

    fn unfinished(&self) -> Vec<String> {
        self.names(|m| !is_finished(m))
    }

    /// One row of the table.
    #[track_caller]
    fn row(&self, m: i64, sv: [&str; 3], current: [&str; 3], persisted: &[&str]) {
        assert_eq!(self.sv, sv, "minute {m}: API server storage versions");
        assert_eq!(self.current_sv(), current, "minute {m}: CurrentSV");
        assert_eq!(self.persisted_sv(), persisted, "minute {m}: PersistedSV");
    }
}

#[tokio::test]
async fn seed_002_case_walkthrough() {
    let store = Arc::new(Memory::default());
    let served = Served::default();
    served.write().expect("served").insert(NAME.to_string(), gvr());
    let config =
        SchedulerConfig { discovery_interval: INTERVAL, replicas: Replicas::Several, ..SchedulerConfig::default() };
    let leader = Decider::new(store.clone(), &config, served);
    let mut c = Cluster { store: store.clone(), leader, sv: ["v1"; 3] };

    // Before the table: the cluster has run on v1 and its objects were migrated to v1 (persisted [v1]).
    c.poll(-20).await;
    assert_eq!(c.persisted_sv(), ["Unknown"]);
    c.poll(-10).await;
    let initial = c.unfinished();
    assert_eq!(initial.len(), 1, "the initial migration (persisted Unknown)");
    store.set_phase(&initial[0], "Succeeded");
    c.leader.resource(NAME, minute(-10)).await.expect("success seen");
    let history = |c: &Cluster| c.store.migrations().len();
    let before = history(&c);

    // 0: v1 everywhere.
    c.poll(0).await;
    c.row(0, ["v1", "v1", "v1"], ["v1", "v1", "v1"], &["v1"]);
    assert_eq!(history(&c), before, "0: migrated, nothing to do");

    // 3: the admin starts the rolling upgrade with apiserver 1.
    c.sv[0] = "v2";
    c.row(3, ["v2", "v1", "v1"], ["v1", "v1", "v1"], &["v1"]);

    // 10: the reporters update currentSV; no consensus, no migration.
    c.poll(10).await;
    c.row(10, ["v2", "v1", "v1"], ["v2", "v1", "v1"], &["v1", "v2"]);
    assert_eq!(history(&c), before, "10: no migration without consensus");
    assert_eq!(store.state().status.unwrap_or_default().current_storage_version_hash.as_deref(), Some("v1"));

    // 12: apiserver 2 upgraded; 18: apiserver 3 upgraded (no poll in between).
    c.sv[1] = "v2";
    c.row(12, ["v2", "v2", "v1"], ["v2", "v1", "v1"], &["v1", "v2"]);
    c.sv[2] = "v2";
    c.row(18, ["v2", "v2", "v2"], ["v2", "v1", "v1"], &["v1", "v2"]);
    assert_eq!(history(&c), before);

    // 20: consensus: the leader starts the migration.
    c.poll(20).await;
    c.row(20, ["v2", "v2", "v2"], ["v2", "v2", "v2"], &["v1", "v2"]);
    let first = c.unfinished();
    assert_eq!(first.len(), 1, "20: one migration started");
    let m = store.migrations().into_iter().find(|m| m.metadata.name.as_deref() == Some(first[0].as_str()));
    let m = m.expect("migration");
    assert_eq!(m.spec.resource, gvr());
    assert_eq!(migration_apiserver::scheduler::trigger::migration_hash(&m), Some("v2"));
    assert_eq!(store.state().status.unwrap_or_default().current_storage_version_hash.as_deref(), Some("v2"));
    store.set_phase(&first[0], "Running");

    // 22: apiserver 3 rolled back.
    c.sv[2] = "v1";
    c.row(22, ["v2", "v2", "v1"], ["v2", "v2", "v2"], &["v1", "v2"]);
    assert_eq!(c.unfinished(), first, "22: nothing observed yet, the migration runs");

    // 30: apiserver 3's reporter reports v1 (already in persisted); the leader cancels the migration.
    c.poll(30).await;
    c.row(30, ["v2", "v2", "v1"], ["v2", "v2", "v1"], &["v1", "v2"]);
    assert!(c.unfinished().is_empty(), "30: the running migration is cancelled and none is started");
    assert_eq!(c.names(is_superseded), first, "30: cancelled = Failed, reason Superseded (kept in the history)");

    // 34: apiserver 3 upgraded again.
    c.sv[2] = "v2";
    c.row(34, ["v2", "v2", "v2"], ["v2", "v2", "v1"], &["v1", "v2"]);
    assert!(c.unfinished().is_empty());

    // 40: consensus again: a new migration.
    c.poll(40).await;
    c.row(40, ["v2", "v2", "v2"], ["v2", "v2", "v2"], &["v1", "v2"]);
    let second = c.unfinished();
    assert_eq!(second.len(), 1, "40: one migration started");
    assert_ne!(second, first);
    store.set_phase(&second[0], "Running");

    // 45: the migration completes: persisted = [v2].
    store.set_now(minute(45));
    store.set_phase(&second[0], "Succeeded");
    c.leader.resource(NAME, minute(45)).await.expect("success seen");
    c.row(45, ["v2", "v2", "v2"], ["v2", "v2", "v2"], &["v2"]);
    assert!(c.unfinished().is_empty());

    // Beyond the table: apiserver 3's reporter goes silent. Its report holds further decisions back once older
    // than one interval, and is removed after three.
    c.poll(50).await;
    let two = |c: &mut Cluster, m: i64| {
        let now = minute(m);
        let store = c.store.clone();
        async move {
            store.set_now(now);
            for r in &REPORTERS[..2] {
                report(&*store, r, &discovery("v2"), now, INTERVAL, Replicas::Several).await;
            }
        }
    };
    for m in [60, 70, 80] {
        two(&mut c, m).await;
        c.leader.round(minute(m)).await.expect("round");
    }
    assert_eq!(c.current_sv(), ["v2", "v2", "v2"], "80: 30 minutes after its last report (50) it is kept");
    two(&mut c, 90).await;
    assert_eq!(c.current_sv(), ["v2", "v2", ""], "90: older than three intervals, removed");
    assert_eq!(c.persisted_sv(), ["v2"]);
}

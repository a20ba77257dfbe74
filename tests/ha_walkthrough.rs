//! Seed 002's "Case walkthrough" (Extended API proposal for HA cluster), replayed with simulated time: three API
//! servers, each with its own reporter, a rolling upgrade v1 -> v2 from minute 3, apiserver 3 rolled back at minute
//! 22 and upgraded again at 34, the migration completed at minute 45. Polls every 10 minutes.
//!
//! It drives the real code: the reporters' [`report`] and the leader's [`Decider`] (the functions the server's
//! reporter and decider tasks call), over this server's API in process, as the scheduler runs them. Each report is followed by a decision, as the server's
//! decider reacts to every StorageState change, and every poll ends with the leader's periodic round. The
//! migrator's part (Running, then Succeeded) is played by hand.

use k8s_openapi::jiff::Timestamp;
use migration_apiserver::api::storage_state::StorageState;
use migration_apiserver::api::storage_version_migration::{
    GroupVersionResource, MigrationCondition, StorageVersionMigration, StorageVersionMigrationStatus,
};
use migration_apiserver::auth::authn::Authenticator;
use migration_apiserver::client::in_process_client;
use migration_apiserver::registry::Registry;
use migration_apiserver::scheduler::storage_version::{report, Decider, Served};
use migration_apiserver::scheduler::trigger_kit::{
    is_finished, is_superseded, DiscoveredResource, Discovery, OwnObjects, Replicas,
};
use migration_apiserver::scheduler::SchedulerConfig;
use migration_apiserver::server::{metrics::Metrics, router, AppState};
use migration_apiserver::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const INTERVAL: Duration = Duration::from_secs(600);
const NAME: &str = "deployments.apps";
const REPORTERS: [&str; 3] = ["apiserver-1", "apiserver-2", "apiserver-3"];

/// Minute `m` of the walkthrough. The server stamps creationTimestamp with the real clock, and decisions count only
/// the migrations requested since their StorageState was created, so the simulated minutes start an hour from now.
fn minute(m: i64) -> Timestamp {
    static START: OnceLock<i64> = OnceLock::new();
    let start = START.get_or_init(|| Timestamp::now().as_second() + 3600);
    Timestamp::from_second(start + m * 60).expect("timestamp")
}

/// This server's API in process, on its embedded store in a temporary directory, reached as the scheduler reaches
/// it: kube's typed client over the server's own router, with the scheduler's identity.
struct Server {
    own: OwnObjects,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("store");
        let kinds = migration_apiserver::api::kinds(&Default::default()).expect("kinds");
        let registry = Arc::new(Registry::new(storage, kinds, Default::default()));
        let state = AppState::new(registry, Arc::new(Authenticator::new()), Arc::new(Metrics::new()), INTERVAL);
        Server { own: OwnObjects::new(in_process_client(router(Arc::new(state)))), _dir: dir }
    }
    async fn state(&self) -> StorageState {
        self.own.get_state(NAME).await.expect("read").expect("the StorageState")
    }
    async fn migrations(&self) -> Vec<StorageVersionMigration> {
        self.own.list_migrations().await.expect("list")
    }
    /// The migrator's part: the condition `type_` True on migration `name`.
    async fn set_phase(&self, name: &str, type_: &str) {
        let mut m = self.own.get_migration(name).await.expect("read").expect("migration");
        m.status = Some(StorageVersionMigrationStatus {
            conditions: vec![MigrationCondition { type_: type_.into(), status: "True".into(), ..Default::default() }],
            ..Default::default()
        });
        self.own.update_migration_status(&m).await.expect("status written");
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
    server: Arc<Server>,
    leader: Decider,
    /// The storage version each API server serves now.
    sv: [&'static str; 3],
}

impl Cluster {
    /// A poll at minute `m`: every reporter reports what its API server serves (the leader decides after each
    /// report, as its watch of StorageStates makes it), then the leader's periodic round.
    async fn poll(&mut self, m: i64) {
        let now = minute(m);
        for (reporter, sv) in REPORTERS.iter().zip(self.sv) {
            let written = report(&self.server.own, reporter, &discovery(sv), now, INTERVAL, Replicas::Several).await;
            assert_eq!(written, [NAME]);
            self.leader.resource(NAME, now).await.expect("decision");
        }
        self.leader.round(now).await.expect("round");
    }

    /// CurrentSV: the reported hashes, apiserver 1 to 3.
    async fn current_sv(&self) -> Vec<String> {
        let st = self.server.state().await.status.unwrap_or_default();
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

    async fn persisted_sv(&self) -> Vec<String> {
        self.server.state().await.status.unwrap_or_default().persisted_storage_version_hashes
    }

    async fn names(&self, pred: impl Fn(&StorageVersionMigration) -> bool) -> Vec<String> {
        self.server.migrations().await.iter().filter(|m| pred(m)).filter_map(|m| m.metadata.name.clone()).collect()
    }

    async fn unfinished(&self) -> Vec<String> {
        self.names(|m| !is_finished(m)).await
    }

    /// One row of the table.
    async fn row(&self, m: i64, sv: [&str; 3], current: [&str; 3], persisted: &[&str]) {
        assert_eq!(self.sv, sv, "minute {m}: API server storage versions");
        assert_eq!(self.current_sv().await, current, "minute {m}: CurrentSV");
        assert_eq!(self.persisted_sv().await, persisted, "minute {m}: PersistedSV");
    }
}

#[tokio::test]
async fn seed_002_case_walkthrough() {
    let server = Arc::new(Server::start());
    let served = Served::default();
    served.write().expect("served").insert(NAME.to_string(), gvr());
    let config =
        SchedulerConfig { discovery_interval: INTERVAL, replicas: Replicas::Several, ..SchedulerConfig::default() };
    let leader = Decider::new(server.own.clone(), &config, served);
    let mut c = Cluster { server: server.clone(), leader, sv: ["v1"; 3] };

    // Before the table: the cluster has run on v1 and its objects were migrated to v1 (persisted [v1]).
    c.poll(-20).await;
    assert_eq!(c.persisted_sv().await, ["Unknown"]);
    c.poll(-10).await;
    let initial = c.unfinished().await;
    assert_eq!(initial.len(), 1, "the initial migration (persisted Unknown)");
    server.set_phase(&initial[0], "Succeeded").await;
    c.leader.resource(NAME, minute(-10)).await.expect("success seen");
    let before = server.migrations().await.len();

    // 0: v1 everywhere.
    c.poll(0).await;
    c.row(0, ["v1", "v1", "v1"], ["v1", "v1", "v1"], &["v1"]).await;
    assert_eq!(server.migrations().await.len(), before, "0: migrated, nothing to do");

    // 3: the admin starts the rolling upgrade with apiserver 1.
    c.sv[0] = "v2";
    c.row(3, ["v2", "v1", "v1"], ["v1", "v1", "v1"], &["v1"]).await;

    // 10: the reporters update currentSV; no consensus, no migration.
    c.poll(10).await;
    c.row(10, ["v2", "v1", "v1"], ["v2", "v1", "v1"], &["v1", "v2"]).await;
    assert_eq!(server.migrations().await.len(), before, "10: no migration without consensus");
    assert_eq!(server.state().await.status.unwrap_or_default().current_storage_version_hash.as_deref(), Some("v1"));

    // 12: apiserver 2 upgraded; 18: apiserver 3 upgraded (no poll in between).
    c.sv[1] = "v2";
    c.row(12, ["v2", "v2", "v1"], ["v2", "v1", "v1"], &["v1", "v2"]).await;
    c.sv[2] = "v2";
    c.row(18, ["v2", "v2", "v2"], ["v2", "v1", "v1"], &["v1", "v2"]).await;
    assert_eq!(server.migrations().await.len(), before);

    // 20: consensus: the leader starts the migration.
    c.poll(20).await;
    c.row(20, ["v2", "v2", "v2"], ["v2", "v2", "v2"], &["v1", "v2"]).await;
    let first = c.unfinished().await;
    assert_eq!(first.len(), 1, "20: one migration started");
    let m = server.migrations().await.into_iter().find(|m| m.metadata.name.as_deref() == Some(first[0].as_str()));
    let m = m.expect("migration");
    assert_eq!(m.spec.resource, gvr());
    assert_eq!(migration_apiserver::scheduler::trigger_kit::migration_hash(&m), Some("v2"));
    assert_eq!(server.state().await.status.unwrap_or_default().current_storage_version_hash.as_deref(), Some("v2"));
    server.set_phase(&first[0], "Running").await;

    // 22: apiserver 3 rolled back.
    c.sv[2] = "v1";
    c.row(22, ["v2", "v2", "v1"], ["v2", "v2", "v2"], &["v1", "v2"]).await;
    assert_eq!(c.unfinished().await, first, "22: nothing observed yet, the migration runs");

    // 30: apiserver 3's reporter reports v1 (already in persisted); the leader cancels the migration.
    c.poll(30).await;
    c.row(30, ["v2", "v2", "v1"], ["v2", "v2", "v1"], &["v1", "v2"]).await;
    assert!(c.unfinished().await.is_empty(), "30: the running migration is cancelled and none is started");
    assert_eq!(c.names(is_superseded).await, first, "30: cancelled = Failed, reason Superseded (kept in the history)");

    // 34: apiserver 3 upgraded again.
    c.sv[2] = "v2";
    c.row(34, ["v2", "v2", "v2"], ["v2", "v2", "v1"], &["v1", "v2"]).await;
    assert!(c.unfinished().await.is_empty());

    // 40: consensus again: a new migration.
    c.poll(40).await;
    c.row(40, ["v2", "v2", "v2"], ["v2", "v2", "v2"], &["v1", "v2"]).await;
    let second = c.unfinished().await;
    assert_eq!(second.len(), 1, "40: one migration started");
    assert_ne!(second, first);
    server.set_phase(&second[0], "Running").await;

    // 45: the migration completes: persisted = [v2].
    server.set_phase(&second[0], "Succeeded").await;
    c.leader.resource(NAME, minute(45)).await.expect("success seen");
    c.row(45, ["v2", "v2", "v2"], ["v2", "v2", "v2"], &["v2"]).await;
    assert!(c.unfinished().await.is_empty());

    // Beyond the table: apiserver 3's reporter goes silent. Its report holds further decisions back once older
    // than one interval, and is removed after three.
    c.poll(50).await;
    let two = |c: &mut Cluster, m: i64| {
        let now = minute(m);
        let server = c.server.clone();
        async move {
            for r in &REPORTERS[..2] {
                report(&server.own, r, &discovery("v2"), now, INTERVAL, Replicas::Several).await;
            }
        }
    };
    for m in [60, 70, 80] {
        two(&mut c, m).await;
        c.leader.round(minute(m)).await.expect("round");
    }
    assert_eq!(c.current_sv().await, ["v2", "v2", "v2"], "80: 30 minutes after its last report (50) it is kept");
    two(&mut c, 90).await;
    assert_eq!(c.current_sv().await, ["v2", "v2", ""], "90: older than three intervals, removed");
    assert_eq!(c.persisted_sv().await, ["v2"]);
}

//! The migrator: runs every StorageVersionMigration that has neither Succeeded nor Failed, of both APIs
//! (`migration.k8s.io` and the in-tree `storagemigration.k8s.io`, one [`Migration`] to the worker), oldest first
//! (Running ones before pending ones), at most one per resource and `concurrency` in all at once. A migration
//! LISTs its resource in chunks from its saved continue token (`spec.continueToken`; an annotation for the in-tree
//! kind) and rewrites each object with a no-op write (a JSON merge patch carrying only
//! `metadata.resourceVersion`, as the in-tree controller sends it), then saves the next token and its progress
//! through our own API. The token is saved only after every object of the chunk was handled, so a crash at any
//! point re-does at most one chunk (harmless: a stale resourceVersion is a 409, which is skipped) and skips nothing.
//!
//! Every request to the target takes a token from one global bucket, whose rate adapts to the target's feedback
//! ([`super::adaptive`]; `--migration-qps` is its ceiling, `--migration-burst` its size).
//! Transient errors (429, 500, 502, 503, 504, timeouts, connection errors) are retried with exponential backoff
//! honouring Retry-After, up to `max_attempts` in a row; then the migration steps back, still Running with the error
//! in its message, and the scheduler starts it again from its saved token after a backoff that doubles up to
//! [`MAX_BACKOFF`]: transient errors never fail a migration (kube-controller-manager's GA controller retries them
//! too). Anything else fails the migration at once with a message naming the object, instead of retrying forever as
//! kube-storage-version-migrator does (its issue #83).
//!
//! Someone else may finish a migration under us: the trigger supersedes it (Failed=True, reason Superseded) or a
//! user deletes it. Every save is a compare-and-swap on resourceVersion; on a conflict the migration is re-read and,
//! if it is now finished or gone, dropped without overwriting anything. The scheduler loop also notices it (watch
//! of storageversionmigrations) and interrupts the work on the target.
//!
//! Which migrations run is decided as kube-runtime's controllers decide: from a reflector's store of the
//! storageversionmigrations, whenever it changes or a worker ends; there is no periodic re-list.

use super::adaptive::Pace;
use super::events::{reference_to, EventRecorder, EventType};
use super::metrics::{resource_label, SchedulerMetrics};
use super::SchedulerConfig;
use crate::api::storage_version_migration::{GroupVersionResource, StorageVersionMigration};
use crate::api::storagemigration::StorageVersionMigration as InTreeMigration;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::reflector::{self, reflector, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

pub mod crd;
mod in_tree;
pub use in_tree::*;
mod migration;
pub use migration::*;
mod target;
pub use target::*;
mod lifecycle;
mod worker;
use worker::*;

/// Writes in flight at once within one migration: enough to keep a fast target busy at unlimited QPS; with a QPS
/// limit they simply queue at the token bucket.
const WRITE_PARALLELISM: usize = 16;
/// A worker that gave up saving its state is started again after this long (from its saved token).
const REQUEUE: Duration = Duration::from_secs(1);
/// The longest a migration that stepped back on transient errors waits before it is started again (the backoff
/// starts at [`REQUEUE`] and doubles per step back in a row).
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Own-API saves that fail for reasons other than a conflict are retried this often before the worker gives up
/// (the scheduler starts it again from the saved token after [`REQUEUE`]).
const SAVE_ATTEMPTS: u32 = 5;
/// How long an in-tree migration of a resource missing from discovery waits for it, from the migration's creation
/// (kube-controller-manager's GA controller: a minute), and how often it looks again (its RESTMapper reset).
const DISCOVERY_GRACE: Duration = Duration::from_secs(60);
const DISCOVERY_RECHECK: Duration = Duration::from_secs(10);
/// Retry-After values beyond this are capped (a misbehaving server must not park a migration for days).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// How much of an error response is quoted in a failure message.
const MAX_QUOTE: usize = 1024;

/// Progress is saved at least this often while a migration runs (and after every chunk).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);
/// The log reports a running migration's progress this often.
const LOG_INTERVAL: Duration = Duration::from_secs(30);
/// Objects handled before `spec.continueToken`: where the count resumes after a restart.
pub const ANNOTATION_MIGRATED_AT_TOKEN: &str = "migration.k8s.io/migrated-objects-at-continue-token";

/// Event reasons regarding a StorageVersionMigration (action `Migrate`).
pub const EVENT_STARTED: &str = "MigrationStarted";
pub const EVENT_RETRYING: &str = "MigrationRetrying";
pub const EVENT_SUCCEEDED: &str = "MigrationSucceeded";
pub const EVENT_FAILED: &str = "MigrationFailed";
const EVENT_ACTION: &str = "Migrate";

/// The Events of one migration.
#[derive(Clone)]
pub(super) struct MigrationEvents {
    recorder: EventRecorder,
    regarding: ObjectReference,
}

impl MigrationEvents {
    fn new(recorder: &EventRecorder, m: &Migration) -> Self {
        let regarding = match m {
            Migration::Ours(m) => reference_to(m),
            Migration::InTree(m) => reference_to(m),
        };
        MigrationEvents { recorder: recorder.clone(), regarding }
    }
    pub(super) fn normal(&self, reason: &str, note: &str) {
        self.recorder.record(&self.regarding, EventType::Normal, reason, EVENT_ACTION, note);
    }
    pub(super) fn warning(&self, reason: &str, note: &str) {
        self.recorder.record(&self.regarding, EventType::Warning, reason, EVENT_ACTION, note);
    }
}

/// The migrations of both APIs, as the scheduler reads and writes them (through this server's in-process client).
pub struct MigrationApis {
    pub ours: Api<StorageVersionMigration>,
    pub in_tree: Api<InTreeMigration>,
}

pub fn spawn(
    config: SchedulerConfig,
    target: kube::Client,
    apis: MigrationApis,
    metrics: Arc<SchedulerMetrics>,
    events: EventRecorder,
) -> tokio::task::JoinHandle<()> {
    let pace = Pace::start(&config, metrics.clone());
    let crds = crd::Crds::new(target.clone(), config.update_crd_stored_versions, events.clone());
    let target = Target { client: target, pace, config };
    let (store, writer) = reflector::store();
    let (in_tree_store, in_tree_writer) = reflector::store();
    let ours = reflector(writer, watcher(apis.ours.clone(), watcher::Config::default())).default_backoff();
    let in_tree =
        reflector(in_tree_writer, watcher(apis.in_tree.clone(), watcher::Config::default())).default_backoff();
    let changes = futures::stream::select(ours.map(|e| e.map(drop)), in_tree.map(|e| e.map(drop))).map(|event| {
        if let Err(e) = event {
            tracing::debug!(error = %e, "storageversionmigrations watch");
        }
    });
    let ctx = Arc::new(Ctx { target, crds, migrations: apis.ours, in_tree: apis.in_tree, metrics, events });
    let scheduler = Scheduler {
        ctx,
        store,
        in_tree_store,
        running: HashMap::new(),
        ended: HashMap::new(),
        requeue_at: None,
        backing_off: HashMap::new(),
        workers: JoinSet::new(),
    };
    tokio::spawn(scheduler.run(changes))
}

struct Ctx {
    target: Target,
    /// The target's CustomResourceDefinitions, whose storedVersions a finished migration trims.
    crds: crd::Crds,
    /// The migrations, through this server's in-process client (as any client writes them).
    migrations: Api<StorageVersionMigration>,
    /// The in-tree kind's migrations, likewise.
    in_tree: Api<InTreeMigration>,
    metrics: Arc<SchedulerMetrics>,
    /// Records the migrations' Events.
    events: EventRecorder,
}

// ---------------------------------------------------------------------------------------------------------------
// The scheduler: which migrations run.

struct Running {
    cancel: watch::Sender<bool>,
    task: AbortHandle,
}

/// How a worker ended, for the scheduler: the migration (uid) and the last resourceVersion the worker read or
/// wrote of it, and whether it should be started again.
pub(super) struct Ended {
    pub(super) key: MigrationKey,
    pub(super) uid: String,
    pub(super) resource_version: Option<String>,
    pub(super) requeue: Requeue,
}

/// Whether and when a worker's migration is started again (it resumes from its saved token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Requeue {
    /// Finished, or left to whoever finished or deleted it.
    No,
    /// Its own API kept failing: after [`REQUEUE`].
    Soon,
    /// The target kept answering with retryable errors: after a backoff that grows with each step back in a row.
    Backoff,
}

/// A migration that stepped back on transient errors: how many times in a row, and when it may start again.
struct BackingOff {
    times: u32,
    until: tokio::time::Instant,
}

/// The wait after the `times`-th step back in a row: `first`, doubling, at most [`MAX_BACKOFF`].
fn backoff_after(first: Duration, times: u32) -> Duration {
    let factor = 2u32.saturating_pow(times.saturating_sub(1).min(16));
    first.max(Duration::from_millis(100)).saturating_mul(factor).min(MAX_BACKOFF)
}

struct Scheduler {
    ctx: Arc<Ctx>,
    /// The migrations as kube-runtime's reflectors keep them (a watch, listing again with backoff when it breaks),
    /// one store per API.
    store: Store<StorageVersionMigration>,
    in_tree_store: Store<InTreeMigration>,
    running: HashMap<MigrationKey, Running>,
    /// Migrations whose worker finished them (or saw them finished or deleted), by uid, with the resourceVersion
    /// it last saw: the store may still hold an older copy, which must not start them again.
    ended: HashMap<String, Option<String>>,
    /// When a worker that could not save its state is started again.
    requeue_at: Option<tokio::time::Instant>,
    /// Migrations that stepped back on transient errors, not started again before their time.
    backing_off: HashMap<MigrationKey, BackingOff>,
    /// Dropped with the scheduler (a replica losing leadership aborts it): the workers go too.
    workers: JoinSet<Ended>,
}

/// Whether resourceVersion `a` is not newer than `b` (numeric, as this server hands them out; else only equal ones).
fn not_newer(a: Option<&str>, b: Option<&str>) -> bool {
    match (a.and_then(|a| a.parse::<u64>().ok()), b.and_then(|b| b.parse::<u64>().ok())) {
        (Some(a), Some(b)) => a <= b,
        _ => a == b,
    }
}

/// The metrics' resource label of a migration: an in-tree migration names no version (its version is resolved
/// when it starts), so its label has none.
fn queue_label(m: &Migration) -> String {
    let r = m.resource();
    let gvr = m.requested_gvr().unwrap_or(GroupVersionResource {
        group: r.group,
        version: String::new(),
        resource: r.resource,
    });
    resource_label(&gvr)
}

/// Which of `queue` (unfinished migrations not running, in any order) start now: oldest first (Running ones, being
/// resumed, before pending ones), across both APIs; at most one per resource, counting those `running`; at most
/// `capacity` in all. A migration `waiting` (backing off) does not start and takes no capacity, but keeps its
/// resource: no younger migration of it overtakes it. Returns the indices into `queue` to start, and the others by
/// resource label (pending).
fn select(
    queue: &[Migration],
    running: &[ResourceKey],
    waiting: &[MigrationKey],
    capacity: usize,
) -> (Vec<usize>, BTreeMap<String, i64>) {
    let mut order: Vec<usize> = (0..queue.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |m: &Migration| (!m.is_running(), m.meta().creation_timestamp.clone(), m.api(), m.name().to_string());
        key(&queue[a]).cmp(&key(&queue[b]))
    });
    let mut busy: std::collections::HashSet<ResourceKey> = running.iter().cloned().collect();
    let (mut start, mut pending) = (Vec::new(), BTreeMap::new());
    for i in order {
        let resource = queue[i].resource();
        let free = start.len() < capacity.saturating_sub(running.len()) && !busy.contains(&resource);
        if free && !waiting.contains(&queue[i].key()) {
            start.push(i);
        } else {
            *pending.entry(queue_label(&queue[i])).or_default() += 1;
        }
        // A younger migration of the same resource waits for this one, even when this one waits for capacity.
        busy.insert(resource);
    }
    (start, pending)
}

impl Scheduler {
    async fn run(mut self, changes: impl futures::Stream<Item = ()> + Send) {
        let c = &self.ctx.target.config;
        tracing::info!(
            qps = c.qps,
            burst = c.burst,
            adaptive = c.adaptive,
            min_qps = c.min_qps,
            chunk_size = c.chunk_size,
            concurrency = c.concurrency,
            max_attempts = c.max_attempts,
            "migrator started"
        );
        let mut changes = std::pin::pin!(changes);
        // Nothing is decided from a store that has not listed yet.
        while self.store.wait_until_ready().now_or_never().is_none()
            || self.in_tree_store.wait_until_ready().now_or_never().is_none()
        {
            if changes.next().await.is_none() {
                return;
            }
        }
        loop {
            self.reconcile();
            // Entries past their time stay (their count of steps back in a row) but wake nothing.
            let now = tokio::time::Instant::now();
            let next_due = self.backing_off.values().map(|b| b.until).filter(|until| *until > now).min();
            let requeue = match (self.requeue_at, next_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                change = changes.next() => {
                    if change.is_none() {
                        return;
                    }
                    // Every change already waiting is reconciled together.
                    while let Some(Some(())) = changes.next().now_or_never() {}
                }
                Some(ended) = self.workers.join_next(), if !self.workers.is_empty() => self.ended(ended),
                _ = tokio::time::sleep_until(requeue.unwrap_or_else(tokio::time::Instant::now)), if requeue.is_some() => {
                    self.requeue_at = None;
                }
            }
            self.running.retain(|_, r| !r.task.is_finished());
        }
    }

    fn ended(&mut self, ended: Result<Ended, tokio::task::JoinError>) {
        let Ok(ended) = ended else { return };
        // The worker is done: the next migration of its resource may start.
        self.running.remove(&ended.key);
        match ended.requeue {
            Requeue::Soon => {
                self.requeue_at.get_or_insert_with(|| tokio::time::Instant::now() + REQUEUE);
            }
            Requeue::Backoff => {
                let times = self.backing_off.get(&ended.key).map_or(1, |b| b.times + 1);
                let wait = backoff_after(REQUEUE, times);
                let until = tokio::time::Instant::now() + wait;
                tracing::debug!(migration = %ended.key.name, times, ?wait, "migration backing off");
                self.backing_off.insert(ended.key, BackingOff { times, until });
            }
            Requeue::No => {
                self.backing_off.remove(&ended.key);
                self.ended.insert(ended.uid, ended.resource_version);
            }
        }
    }

    /// Whether the store's copy of `m` is one a worker already finished (the store has not caught up yet).
    fn known_ended(&self, m: &Migration) -> bool {
        let uid = m.meta().uid.as_deref().unwrap_or_default();
        self.ended.get(uid).is_some_and(|rv| not_newer(m.meta().resource_version.as_deref(), rv.as_deref()))
    }

    /// Every migration of both APIs, as the stores hold them.
    fn all(&self) -> Vec<Migration> {
        let ours = self.store.state().into_iter().map(|m| Migration::Ours(m.as_ref().clone()));
        let in_tree = self.in_tree_store.state().into_iter().map(|m| Migration::InTree(m.as_ref().clone()));
        ours.chain(in_tree).collect()
    }

    fn reconcile(&mut self) {
        self.running.retain(|_, r| !r.task.is_finished());
        let all = self.all();
        // A worker's record is kept only while the store lags behind it.
        let ended: Vec<String> = all
            .iter()
            .filter(|m| (!m.is_finished() || m.needs_completion()) && self.known_ended(m))
            .filter_map(|m| m.meta().uid.clone())
            .collect();
        self.ended.retain(|uid, _| ended.contains(uid));
        // Interrupt work on migrations finished or deleted elsewhere.
        for (key, r) in &self.running {
            if !all.iter().any(|m| m.key() == *key && !m.is_finished()) {
                let _ = r.cancel.send(true);
            }
        }
        let running: Vec<&Migration> = all.iter().filter(|m| self.running.contains_key(&m.key())).collect();
        let running_resources: Vec<ResourceKey> = running.iter().map(|m| m.resource()).collect();
        let mut running_now: BTreeMap<String, i64> = BTreeMap::new();
        for m in &running {
            *running_now.entry(queue_label(m)).or_default() += 1;
        }
        // A migration backing off keeps its resource but not a place among the `concurrency` running.
        let now = tokio::time::Instant::now();
        self.backing_off.retain(|key, _| all.iter().any(|m| m.key() == *key && !m.is_finished()));
        let waiting: Vec<MigrationKey> =
            self.backing_off.iter().filter(|(_, b)| b.until > now).map(|(key, _)| key.clone()).collect();
        let queue: Vec<Migration> = all
            .iter()
            .filter(|m| !m.is_finished() || m.needs_completion())
            .filter(|m| !self.known_ended(m) && !self.running.contains_key(&m.key()))
            .cloned()
            .collect();
        let capacity = self.ctx.target.config.concurrency.max(1);
        let (start, pending) = select(&queue, &running_resources, &waiting, capacity);
        for i in start {
            *running_now.entry(queue_label(&queue[i])).or_default() += 1;
            self.start(queue[i].clone());
        }
        self.ctx.metrics.set_queue(&pending, &running_now);
    }

    fn start(&mut self, m: Migration) {
        let key = m.key();
        let (tx, rx) = watch::channel(false);
        let events = MigrationEvents::new(&self.ctx.events, &m);
        let name = key.name.clone();
        let worker =
            Worker { ctx: self.ctx.clone(), name, svm: m, cancel: rx, events, seen_version: None, counts: None };
        let task = self.workers.spawn(worker.run());
        self.running.insert(key, Running { cancel: tx, task });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::storage_version_migration::GroupVersionResource;
    use crate::error::StatusReason;
    use bytes::Bytes;

    #[test]
    fn classification_of_responses() {
        for code in [200, 201] {
            assert_eq!(classify(code, StatusReason::of_answer("", code)), Disposition::Success);
        }
        for code in [404, 409] {
            assert_eq!(classify(code, StatusReason::of_answer("", code)), Disposition::Skip, "{code}");
        }
        for code in [429, 500, 502, 503, 504] {
            assert_eq!(classify(code, StatusReason::of_answer("", code)), Disposition::Retry, "{code}");
        }
        for code in [400, 401, 403, 405, 410, 413, 415, 422, 501] {
            assert_eq!(classify(code, StatusReason::of_answer("", code)), Disposition::Fail, "{code}");
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        use backon::BackoffBuilder;
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(2));
        // Eight attempts: seven waits.
        let delays: Vec<_> = backoff(base, max, 8).build().collect();
        assert_eq!(delays.iter().map(|d| d.as_millis()).collect::<Vec<_>>(), [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(next_delay(Some(base), Some(Duration::from_secs(5))), Some(Duration::from_secs(5)));
        assert_eq!(backoff(base, max, 41).build().last(), Some(max));
        assert_eq!(next_delay(Some(base), Some(Duration::from_secs(86_400))), Some(MAX_RETRY_AFTER));
        // No attempt left: a Retry-After does not add one.
        assert_eq!(next_delay(None, Some(Duration::from_secs(5))), None);
        assert_eq!(backoff(base, max, 1).build().next(), None);
    }

    #[test]
    fn retry_after_from_header_or_status_details() {
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(retry_after(&h, b""), None);
        let status = br#"{"kind":"Status","code":429,"details":{"retryAfterSeconds":3}}"#;
        assert_eq!(retry_after(&h, status), Some(Duration::from_secs(3)));
        h.insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        assert_eq!(retry_after(&h, status), Some(Duration::from_secs(1)));
    }

    #[test]
    fn paths_and_messages() {
        let core = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "secrets".into() };
        assert_eq!(group_version_path(&core), "/api/v1");
        let apps = GroupVersionResource { group: "apps".into(), version: "v1".into(), resource: "deployments".into() };
        assert_eq!(group_version_path(&apps), "/apis/apps/v1");
        assert_eq!(segment("system:node/x y"), "system:node%2Fx%20y");
        let r = Reply {
            code: 403,
            reason: Some(StatusReason::Forbidden),
            retry_after: None,
            body: Bytes::from_static(br#"{"kind":"Status","code":403,"message":"denied by webhook"}"#),
        };
        assert_eq!(r.describe(), "403 Forbidden: denied by webhook");
        assert_eq!(truncate("ééé", 3), "é...");
    }

    // The resource-version controller's messages (kubernetes/kubernetes pkg/controller/storageversionmigrator/
    // resourceversion.go at GA) print a GroupVersionResource as Go does, and accept only resourceVersions
    // apimachinery's CompareResourceVersion can compare (pkg/util/resourceversion).
    #[test]
    fn go_printed_resources_and_well_formed_resource_versions() {
        let apps = GroupVersionResource { group: "apps".into(), version: "v1".into(), resource: "deployments".into() };
        assert_eq!(go_gvr(&apps), "apps/v1, Resource=deployments");
        let core = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "secrets".into() };
        assert_eq!(go_gvr(&core), "/v1, Resource=secrets");
        assert_eq!(
            Failure::UnsupportedVerbs { gvr: go_gvr(&core) }.to_string(),
            r#"resource "/v1, Resource=secrets" does not support discovery operations: [update patch list]"#
        );
        for good in ["1", "42", "18446744073709551615"] {
            assert!(well_formed_resource_version(good), "{good}");
        }
        for bad in ["", "0", "01", "-1", "1a", " 1", "abc"] {
            assert!(!well_formed_resource_version(bad), "{bad:?}");
        }
    }

    #[test]
    fn stepping_back_waits_longer_each_time_in_a_row() {
        let first = Duration::from_secs(30);
        let waits: Vec<u64> = (1..=6).map(|n| backoff_after(first, n).as_secs()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 300, 300]);
        let waits: Vec<u64> = (1..=11).map(|n| backoff_after(REQUEUE, n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff_after(Duration::ZERO, 1), Duration::from_millis(100));
        assert_eq!(backoff_after(first, u32::MAX), MAX_BACKOFF);
    }

    fn migration(api: &str, name: &str, created: &str, resource: &str, running: bool) -> Migration {
        let conditions = match (api, running) {
            (_, false) => serde_json::json!([]),
            ("ours", true) => serde_json::json!([{"type": "Running", "status": "True"}]),
            (_, true) => serde_json::json!([{"type": "Running", "status": "True", "reason": "R", "message": "",
                "lastTransitionTime": created}]),
        };
        let metadata = serde_json::json!({"name": name, "uid": name, "creationTimestamp": created});
        match api {
            "ours" => Migration::Ours(
                serde_json::from_value(serde_json::json!({"metadata": metadata,
                    "spec": {"resource": {"group": "g", "version": "v1", "resource": resource}},
                    "status": {"conditions": conditions}}))
                .expect("ours"),
            ),
            _ => Migration::InTree(
                serde_json::from_value(serde_json::json!({"metadata": metadata,
                    "spec": {"resource": {"group": "g", "resource": resource}},
                    "status": {"conditions": conditions}}))
                .expect("in-tree"),
            ),
        }
    }

    #[test]
    fn one_migration_per_resource_oldest_first_across_both_apis() {
        let t = |s: u32| format!("2026-01-01T00:00:{s:02}Z");
        let queue = vec![
            migration("in-tree", "b-new", &t(3), "bs", false),
            migration("ours", "a-young", &t(2), "as", false),
            migration("in-tree", "a-old", &t(1), "as", false),
            migration("ours", "c", &t(4), "cs", false),
        ];
        let names = |start: &[usize]| start.iter().map(|&i| queue[i].name().to_string()).collect::<Vec<_>>();
        // Capacity for all: the younger migration of `as` waits for the older one of the other API.
        let (start, pending) = select(&queue, &[], &[], 10);
        assert_eq!(names(&start), ["a-old", "b-new", "c"]);
        assert_eq!(pending.values().sum::<i64>(), 1);
        // A running migration of `bs` holds its resource; capacity 2 leaves one place.
        let running = [ResourceKey { group: "g".into(), resource: "bs".into() }];
        let (start, _) = select(&queue, &running, &[], 2);
        assert_eq!(names(&start), ["a-old"]);
        // A migration being resumed (Running) goes before older pending ones.
        let queue = vec![migration("ours", "old", &t(1), "xs", false), migration("in-tree", "new", &t(5), "ys", true)];
        let (start, _) = select(&queue, &[], &[], 1);
        assert_eq!(start.iter().map(|&i| queue[i].name()).collect::<Vec<_>>(), ["new"]);
        // Backing off, it leaves its place to the next one, and keeps its resource from a younger migration.
        let queue = vec![
            migration("ours", "old", &t(1), "xs", false),
            migration("in-tree", "new", &t(5), "ys", true),
            migration("in-tree", "newer", &t(6), "ys", false),
        ];
        let waiting = [queue[1].key()];
        let (start, pending) = select(&queue, &[], &waiting, 1);
        assert_eq!(start.iter().map(|&i| queue[i].name()).collect::<Vec<_>>(), ["old"]);
        assert_eq!(pending.values().sum::<i64>(), 2);
    }
}

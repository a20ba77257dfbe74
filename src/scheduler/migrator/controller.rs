//! The migrator as a kube-runtime controller: one [`applier`] over the migrations of both APIs, from the reflector
//! stores of each (one watch each), merged into one store keyed by API and name. A reconcile of a migration starts
//! its worker when the [`plan`] over all of them lets it (one per resource, oldest first, `--migration-concurrency`),
//! runs it to its end, and returns: a migration that ended is done with; one whose worker gave up saving its state
//! is requeued after [`REQUEUE`]; one that stepped back on transient errors is requeued after a backoff that
//! doubles per step back in a row, up to [`MAX_BACKOFF`] (the error policy's [`Action::requeue`]). Migrations that
//! may not start yet are reconciled again whenever a worker ends or the migrations change.
//!
//! Followed: kube-rs kube-runtime 5.0.0, `controller/mod.rs` (`applier`) and `reflector/store.rs` (`Writer`), as
//! the storage-version trigger's decider does.

use super::queue::{plan, Occupancy};
use super::worker::Worker;
use super::*;
use futures::channel::mpsc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::{applier, Action, Config};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Mutex;
use tokio::time::Instant;

/// A migration as the controller's store holds it. Names are unique only within one API, and a reflector store
/// keys objects by namespace and name: the API's group stands in for the namespace (migrations are cluster-scoped).
#[derive(Clone, Debug)]
pub(super) struct Queued {
    key: ObjectMeta,
    pub(super) migration: Migration,
}

fn api_group(api: MigrationApi) -> &'static str {
    match api {
        MigrationApi::Ours => "migration.k8s.io",
        MigrationApi::InTree => crate::api::storagemigration::GROUP,
    }
}

impl Queued {
    fn new(migration: Migration) -> Self {
        let key = ObjectMeta {
            name: Some(migration.name().to_string()),
            namespace: Some(api_group(migration.api()).to_string()),
            resource_version: migration.meta().resource_version.clone(),
            ..Default::default()
        };
        Queued { key, migration }
    }
    fn reference(key: &MigrationKey) -> ObjectRef<Queued> {
        ObjectRef::new(&key.name).within(api_group(key.api))
    }
}

impl kube::Resource for Queued {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "StorageVersionMigration".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "storageversionmigrations".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.key
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.key
    }
}

/// A migration that stepped back on transient errors: how many times in a row, and when it may start again.
struct BackingOff {
    times: u32,
    until: Instant,
}

/// The wait after the `times`-th step back in a row: `first`, doubling, at most [`MAX_BACKOFF`].
pub(super) fn backoff_after(first: Duration, times: u32) -> Duration {
    let factor = 2u32.saturating_pow(times.saturating_sub(1).min(16));
    first.max(Duration::from_millis(100)).saturating_mul(factor).min(MAX_BACKOFF)
}

/// Whether resourceVersion `a` is not newer than `b` (numeric, as this server hands them out; else only equal ones).
fn not_newer(a: Option<&str>, b: Option<&str>) -> bool {
    match (a.and_then(|a| a.parse::<u64>().ok()), b.and_then(|b| b.parse::<u64>().ok())) {
        (Some(a), Some(b)) => a <= b,
        _ => a == b,
    }
}

/// What the reconciles share about the workers.
#[derive(Default)]
struct Workers {
    /// The running workers, each with the sender that interrupts it.
    running: HashMap<MigrationKey, watch::Sender<bool>>,
    backing_off: HashMap<MigrationKey, BackingOff>,
    /// Migrations whose worker finished them (or saw them finished or deleted), by uid, with the resourceVersion it
    /// last saw: the store may still hold an older copy, which must not start them again.
    ended: HashMap<String, Option<String>>,
    /// Migrations reconciled while they could not start: reconciled again when a worker ends or the migrations
    /// change.
    waiting: HashSet<ObjectRef<Queued>>,
}

impl Workers {
    /// Whether the store's copy of `m` is one a worker already finished; forgets the record once the store caught up.
    fn known_ended(&mut self, m: &Migration) -> bool {
        let uid = m.meta().uid.clone().unwrap_or_default();
        let Some(seen) = self.ended.get(&uid) else { return false };
        let lagging = not_newer(m.meta().resource_version.as_deref(), seen.as_deref());
        if !lagging {
            self.ended.remove(&uid);
        }
        lagging
    }
}

pub(super) struct Controller {
    ctx: Arc<Ctx>,
    store: Store<Queued>,
    workers: Mutex<Workers>,
    /// Requeues the waiting migrations when a worker ends (the applier's queue reads it).
    wake: mpsc::UnboundedSender<ObjectRef<Queued>>,
}

/// Why a reconcile's migration runs again later (the error policy's requeue).
#[derive(Debug, thiserror::Error)]
pub(super) enum Again {
    #[error("the migration's state could not be saved")]
    Soon,
    #[error("the target kept answering with retryable errors")]
    Backoff,
}

impl Controller {
    fn workers(&self) -> std::sync::MutexGuard<'_, Workers> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The plan over the migrations in the store now; forgets what it keeps about migrations no longer there.
    fn plan(&self, w: &mut Workers, now: Instant) -> queue::Plan {
        let all = self.store.state();
        let uids: HashSet<&str> = all.iter().filter_map(|q| q.migration.meta().uid.as_deref()).collect();
        w.ended.retain(|uid, _| uids.contains(uid.as_str()));
        w.backing_off.retain(|key, _| self.store.get(&Queued::reference(key)).is_some());
        let mut unfinished = Vec::new();
        for q in &all {
            let m = &q.migration;
            if (!m.is_finished() || m.needs_completion()) && !w.known_ended(m) {
                unfinished.push(m);
            }
        }
        let running: HashSet<MigrationKey> = w.running.keys().cloned().collect();
        let backing_off = w.backing_off.iter().filter(|(_, b)| b.until > now).map(|(k, _)| k.clone()).collect();
        let capacity = self.ctx.target.config.concurrency;
        plan(&unfinished, &Occupancy { running: &running, backing_off: &backing_off, capacity })
    }

    /// Reconciles every waiting migration again.
    fn wake_waiting(&self) {
        for r in std::mem::take(&mut self.workers().waiting) {
            let _ = self.wake.unbounded_send(r);
        }
    }

    /// Interrupts the workers of migrations finished or deleted elsewhere.
    fn interrupt_finished(&self) {
        let workers = self.workers();
        for (key, cancel) in &workers.running {
            let current = self.store.get(&Queued::reference(key));
            if current.is_none_or(|q| q.migration.is_finished()) {
                let _ = cancel.send(true);
            }
        }
    }
}

/// Starts the migrator's controller; it runs until the returned future is dropped (a replica losing leadership
/// aborts its task), and its workers with it.
pub(super) async fn run(ctx: Arc<Ctx>) {
    let (ours, ours_writer) = reflector::store::<StorageVersionMigration>();
    let (in_tree, in_tree_writer) = reflector::store::<InTreeMigration>();
    let (store, mut merged) = reflector::store::<Queued>();
    let (wake, woken) = mpsc::unbounded();
    let controller = Arc::new(Controller { ctx: ctx.clone(), store: store.clone(), workers: Mutex::default(), wake });
    let ours_events = reflector(ours_writer, watcher(ctx.migrations.clone(), watcher::Config::default()))
        .default_backoff()
        .map(|e| e.map(|e| into_migration(e, Migration::Ours)));
    let in_tree_events = reflector(in_tree_writer, watcher(ctx.in_tree.clone(), watcher::Config::default()))
        .default_backoff()
        .map(|e| e.map(|e| into_migration(e, Migration::InTree)));
    let changed = Arc::clone(&controller);
    let changes = futures::stream::select(ours_events, in_tree_events).flat_map(move |event| {
        let triggers = match event {
            Ok(event) => merge(&mut merged, event, &ours, &in_tree),
            Err(e) => {
                tracing::debug!(error = %e, "storageversionmigrations watch");
                Vec::new()
            }
        };
        changed.interrupt_finished();
        let waiting = std::mem::take(&mut changed.workers().waiting);
        futures::stream::iter(triggers.into_iter().chain(waiting).map(Ok::<_, std::convert::Infallible>))
    });
    let queue = futures::stream::select(changes, woken.map(Ok));
    let reconciles =
        applier(|q, c| Box::pin(reconcile(q, c)), error_policy, controller, store, queue, Config::default());
    reconciles
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "migrator");
            }
        })
        .await;
}

/// A watch event of one kind as an event of [`Migration`]s.
fn into_migration<K>(event: watcher::Event<K>, of: fn(K) -> Migration) -> watcher::Event<Migration> {
    match event {
        watcher::Event::Apply(m) => watcher::Event::Apply(of(m)),
        watcher::Event::Delete(m) => watcher::Event::Delete(of(m)),
        watcher::Event::InitApply(m) => watcher::Event::InitApply(of(m)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Applies one watch event of either API to the merged store; returns the migrations it concerns. A kind that
/// listed again rebuilds the merged store from both kinds' stores, once both have listed (only then is it ready).
fn merge(
    merged: &mut Writer<Queued>,
    event: watcher::Event<Migration>,
    ours: &Store<StorageVersionMigration>,
    in_tree: &Store<InTreeMigration>,
) -> Vec<ObjectRef<Queued>> {
    match event {
        watcher::Event::Apply(m) => {
            let q = Queued::new(m);
            let r = ObjectRef::from_obj(&q);
            merged.apply_watcher_event(&watcher::Event::Apply(q));
            vec![r]
        }
        watcher::Event::Delete(m) => {
            merged.apply_watcher_event(&watcher::Event::Delete(Queued::new(m)));
            Vec::new()
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
        watcher::Event::InitDone => {
            if ours.wait_until_ready().now_or_never().is_none() || in_tree.wait_until_ready().now_or_never().is_none() {
                return Vec::new();
            }
            let all: Vec<Queued> = ours
                .state()
                .into_iter()
                .map(|m| Queued::new(Migration::Ours(m.as_ref().clone())))
                .chain(in_tree.state().into_iter().map(|m| Queued::new(Migration::InTree(m.as_ref().clone()))))
                .collect();
            let refs = all.iter().map(ObjectRef::from_obj).collect();
            merged.apply_watcher_event(&watcher::Event::Init);
            for q in all {
                merged.apply_watcher_event(&watcher::Event::InitApply(q));
            }
            merged.apply_watcher_event(&watcher::Event::InitDone);
            refs
        }
    }
}

/// One migration: started when the plan lets it and run to its end, or left waiting.
async fn reconcile(q: Arc<Queued>, c: Arc<Controller>) -> Result<Action, Again> {
    // Nothing is decided before both kinds have listed: the plan must see every migration.
    if c.store.wait_until_ready().await.is_err() {
        return Ok(Action::await_change());
    }
    let m = &q.migration;
    let key = m.key();
    let cancel = {
        let mut w = c.workers();
        if (m.is_finished() && !m.needs_completion()) || w.known_ended(m) {
            w.backing_off.remove(&key);
            return Ok(Action::await_change());
        }
        if w.running.contains_key(&key) {
            return Ok(Action::await_change());
        }
        let now = Instant::now();
        if let Some(b) = w.backing_off.get(&key).filter(|b| b.until > now) {
            return Ok(Action::requeue(b.until - now));
        }
        let plan = c.plan(&mut w, now);
        c.ctx.metrics.set_queue(&plan.pending, &plan.running);
        if !plan.start.contains(&key) {
            w.waiting.insert(ObjectRef::from_obj(q.as_ref()));
            return Ok(Action::await_change());
        }
        // This one starts; the others the plan starts are started by their own reconciles.
        let (tx, rx) = watch::channel(false);
        w.running.insert(key.clone(), tx);
        rx
    };
    let ended = run_worker(&c.ctx, m.clone(), cancel).await;
    let again = {
        let mut w = c.workers();
        w.running.remove(&key);
        match ended.as_ref().map(|e| e.requeue) {
            Some(Requeue::No) => {
                w.backing_off.remove(&key);
                if let Some(e) = &ended {
                    w.ended.insert(e.uid.clone(), e.resource_version.clone());
                }
                None
            }
            Some(Requeue::Soon) => Some(Again::Soon),
            Some(Requeue::Backoff) => Some(Again::Backoff),
            // The worker panicked: treated as a failed save, resumed from its saved token.
            None => Some(Again::Soon),
        }
    };
    // Its resource and its place are free: the migrations waiting for them are reconciled again.
    let plan = c.plan(&mut c.workers(), Instant::now());
    c.ctx.metrics.set_queue(&plan.pending, &plan.running);
    c.wake_waiting();
    match again {
        None => Ok(Action::await_change()),
        Some(again) => Err(again),
    }
}

/// Runs the worker of `m` in a task of its own (migrations run in parallel), aborted when the reconcile is dropped.
async fn run_worker(ctx: &Arc<Ctx>, m: Migration, cancel: watch::Receiver<bool>) -> Option<Ended> {
    let events = MigrationEvents::new(&ctx.events, &m);
    let name = m.name().to_string();
    let worker = Worker { ctx: ctx.clone(), name, svm: m, cancel, events, seen_version: None, counts: None };
    let task = tokio::spawn(worker.run());
    let _abort = AbortOnDrop(task.abort_handle());
    task.await.ok()
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// When a migration that did not end runs again: a second after a failed save; after the backoff of its steps back
/// in a row after transient errors, during which it keeps its resource but holds no place.
fn error_policy(q: Arc<Queued>, again: &Again, c: Arc<Controller>) -> Action {
    match again {
        Again::Soon => Action::requeue(REQUEUE),
        Again::Backoff => {
            let key = q.migration.key();
            let mut w = c.workers();
            let times = w.backing_off.get(&key).map_or(1, |b| b.times + 1);
            let wait = backoff_after(REQUEUE, times);
            tracing::debug!(migration = %key.name, times, ?wait, "migration backing off");
            w.backing_off.insert(key, BackingOff { times, until: Instant::now() + wait });
            Action::requeue(wait)
        }
    }
}

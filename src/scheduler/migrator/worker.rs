//! One migration: the worker that lists, rewrites and saves its progress chunk by chunk.

use super::*;
use crate::api::storage_version_migration::GroupVersionResource;
use crate::client::api_reason;
use crate::error::StatusReason;
use crate::registry::Subresource;
use crate::scheduler::trigger_kit::annotation;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub(super) fn is_finished(m: &Migration) -> bool {
    m.is_finished()
}

/// Why a migration stopped without an outcome of ours.
#[derive(Debug)]
pub(super) enum Stop {
    /// Deleted meanwhile.
    Gone,
    /// Finished by someone else (superseded by the trigger).
    FinishedElsewhere(&'static str),
    /// Interrupted by the scheduler (the migration was finished or deleted elsewhere, or the scheduler stopped).
    Cancelled,
    /// Our own API kept failing: the scheduler resumes it from the saved token later.
    Save(String),
    /// Our own API refused a write of the migration as invalid (422): writing it again would be refused again, so
    /// the migration ends Failed with the refusal.
    Refused(String),
    /// The target kept answering with retryable errors: the migration stays Running (its message says why) and the
    /// scheduler starts it again from its saved token after a backoff.
    Transient(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Gone => write!(f, "deleted"),
            Stop::FinishedElsewhere(phase) => write!(f, "{phase} elsewhere"),
            Stop::Cancelled => write!(f, "interrupted by the scheduler"),
            Stop::Save(e) => write!(f, "cannot save its state: {e}"),
            Stop::Refused(e) => write!(f, "the server refused the migration's state: {e}"),
            Stop::Transient(e) => write!(f, "retrying later: {e}"),
        }
    }
}

pub(super) struct Worker {
    pub(super) ctx: Arc<Ctx>,
    pub(super) name: String,
    /// The latest copy we read or wrote (its resourceVersion is the CAS precondition of the next save).
    pub(super) svm: Migration,
    pub(super) cancel: watch::Receiver<bool>,
    pub(super) events: MigrationEvents,
    /// A newer resourceVersion than `svm`'s, read when the migration turned out finished elsewhere.
    pub(super) seen_version: Option<String>,
    /// The progress last counted (objects not yet migrated, of all), for the messages of a failure.
    pub(super) counts: Option<Counts>,
}

pub(super) fn cancelled(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow() || rx.has_changed().is_err()
}

pub(super) async fn until_cancelled(rx: &mut watch::Receiver<bool>) {
    // A dropped sender (the scheduler is gone) cancels too.
    let _ = rx.wait_for(|c| *c).await;
}

impl Ctx {
    /// Writes `m` through its own API's main resource or `/status`, as field manager `manager`.
    pub(super) async fn replace(
        &self,
        m: &Migration,
        subresource: Subresource,
        manager: &str,
    ) -> Result<Migration, kube::Error> {
        let (name, pp) = (m.name(), crate::scheduler::managers::post(manager));
        match (m, subresource) {
            (Migration::Ours(o), Subresource::Main) => self.migrations.replace(name, &pp, o).await.map(Migration::Ours),
            (Migration::Ours(o), Subresource::Status) => {
                self.migrations.replace_status(name, &pp, o).await.map(Migration::Ours)
            }
            (Migration::InTree(o), Subresource::Main) => {
                self.in_tree.replace(name, &pp, o).await.map(Migration::InTree)
            }
            (Migration::InTree(o), Subresource::Status) => {
                self.in_tree.replace_status(name, &pp, o).await.map(Migration::InTree)
            }
        }
    }

    /// Reads a migration again from its own API.
    pub(super) async fn get(&self, key: &MigrationKey) -> Result<Option<Migration>, kube::Error> {
        match key.api {
            MigrationApi::Ours => Ok(self.migrations.get_opt(&key.name).await?.map(Migration::Ours)),
            MigrationApi::InTree => Ok(self.in_tree.get_opt(&key.name).await?.map(Migration::InTree)),
        }
    }
}

impl Worker {
    /// Saves `edit` applied to the latest copy, through the main resource or /status (`subresource`), as the
    /// writer of `step`. On a conflict, re-reads: a migration finished or deleted meanwhile is left alone, anything
    /// else gets the edit again.
    pub(super) async fn save(
        &mut self,
        subresource: Subresource,
        step: Step,
        edit: impl Fn(&mut Migration),
    ) -> Result<(), Stop> {
        let mut failures = 0;
        loop {
            let mut next = self.svm.clone();
            edit(&mut next);
            let err = match self.ctx.replace(&next, subresource, self.svm.manager(step)).await {
                Ok(saved) => {
                    self.svm = saved;
                    return Ok(());
                }
                Err(e) if api_reason(&e) == Some(StatusReason::Conflict) => match self.ctx.get(&self.svm.key()).await {
                    Ok(None) => return Err(Stop::Gone),
                    Ok(Some(fresh)) if is_finished(&fresh) => {
                        self.seen_version = fresh.meta().resource_version.clone();
                        return Err(Stop::FinishedElsewhere(fresh.phase()));
                    }
                    Ok(Some(fresh)) => {
                        self.svm = fresh;
                        continue;
                    }
                    Err(e) => e,
                },
                Err(e) if api_reason(&e) == Some(StatusReason::NotFound) => return Err(Stop::Gone),
                Err(kube::Error::Api(status)) if status.code == 422 => return Err(Stop::Refused(status.message)),
                Err(e) => e,
            };
            failures += 1;
            if failures >= SAVE_ATTEMPTS {
                return Err(Stop::Save(err.to_string()));
            }
            tracing::warn!(migration = %self.name, error = %err, "saving the migration failed; retrying");
            tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
        }
    }

    /// Saves the progress, and the Running condition's message (the in-tree kind's counts what is left; both say
    /// what the target's requests are being retried for). Our kind takes both in one status write; the in-tree
    /// kind's progress is in annotations (a main-resource write) and each write happens only when it changes
    /// something.
    pub(super) async fn save_progress(
        &mut self,
        gvr: &GroupVersionResource,
        handled: i64,
        remaining: Option<i64>,
        retrying: Option<&str>,
    ) -> Result<(), Stop> {
        self.counts = Counts::of(handled, remaining);
        let message = self.svm.progress_message_at(gvr, self.counts, retrying, self.ctx.target.pace.rate());
        let message_changed = |m: &Migration| m.running_message() != Some(message.as_str());
        if self.svm.progress_subresource() == Subresource::Status {
            return self
                .save(Subresource::Status, Step::Migrate, |m| {
                    m.set_progress(handled, remaining);
                    if message_changed(m) {
                        m.set_running(&message);
                    }
                })
                .await;
        }
        if self.svm.progress() != (Some(handled), remaining) {
            self.save(Subresource::Main, Step::Migrate, |m| m.set_progress(handled, remaining)).await?;
        }
        if message_changed(&self.svm) {
            self.save(Subresource::Status, Step::Migrate, |m| m.set_running(&message)).await?;
        }
        Ok(())
    }

    /// The version the migration lists and writes through: the one it names, or (the in-tree kind) the target's
    /// preferred version of the resource. A resource missing from discovery gets the in-tree controller's grace
    /// (GA: a minute from the migration's creation, so that a CRD created with it can become served), looked up
    /// again every [`DISCOVERY_RECHECK`].
    pub(super) async fn resolve(&self) -> Result<Result<GroupVersionResource, Failure>, Stop> {
        if let Some(gvr) = self.svm.requested_gvr() {
            return Ok(Ok(gvr));
        }
        let mut cancel = self.cancel.clone();
        loop {
            let resolved = self.ctx.target.resolve(&self.svm.resource(), &RetryNote::new(self.events.clone())).await;
            let left = match (&resolved, self.discovery_grace_left()) {
                (Err(Failure::NotInDiscovery { .. }), Some(left)) => left,
                _ => return Ok(resolved),
            };
            tracing::debug!(migration = %self.svm.display(), left = ?left,
                "the resource is not in discovery; looking again until the grace has passed");
            tokio::select! {
                _ = tokio::time::sleep(left.min(DISCOVERY_RECHECK)) => {}
                _ = until_cancelled(&mut cancel) => return Err(Stop::Cancelled),
            }
        }
    }

    /// What is left of [`DISCOVERY_GRACE`] since the migration was created, if anything.
    fn discovery_grace_left(&self) -> Option<Duration> {
        let created = self.svm.meta().creation_timestamp.as_ref()?.0;
        let ends = created.checked_add(k8s_openapi::jiff::SignedDuration::try_from(DISCOVERY_GRACE).ok()?).ok()?;
        let left = k8s_openapi::jiff::Timestamp::now().duration_until(ends);
        Duration::try_from(left).ok().filter(|d| !d.is_zero())
    }

    /// Runs the migration to its end. Ok(Ok(n)): every object handled (n in total); Ok(Err(message)): it failed.
    pub(super) async fn migrate(
        &mut self,
        gvr: &GroupVersionResource,
        label: &str,
    ) -> Result<Result<i64, Failure>, Stop> {
        if is_finished(&self.svm) {
            return Err(Stop::FinishedElsewhere(self.svm.phase()));
        }
        let token = self.svm.continue_token();
        let ctx = self.ctx.clone();
        let m = Migrating {
            target: &ctx.target,
            gvr,
            qualified: crate::error::qualified(&gvr.resource, &gvr.group),
            retrying: RetryNote::new(self.events.clone()),
            manager: self.svm.manager(Step::Migrate),
            chunk_limit: ctx.target.config.chunk_size.into(),
        };
        if let Err(failure) = self.begin(&m, token.is_some()).await? {
            return Ok(Err(failure));
        }
        let mut p = Pipeline::new(self.migrated_at_token(token.is_some()), token);
        let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cancel = self.cancel.clone();
        // A pipeline, so that the target always has work: up to WRITE_PARALLELISM writes in flight, and the next
        // chunk is listed while the current one is written. Chunks complete in order; a chunk's next token is saved
        // only when it and every chunk before it are done.
        let mut listing: Option<BoxFuture<'_, Result<Listed, Failure>>> = None;
        let mut in_flight: FuturesUnordered<BoxFuture<'_, (u64, Result<Rewrite, Failure>)>> = FuturesUnordered::new();
        loop {
            if cancelled(&cancel) {
                return Err(Stop::Cancelled);
            }
            if let Some(total) = self.save_completed(&mut p, gvr, label).await? {
                return Ok(Ok(total));
            }
            let (handled, remaining) = progress(p.migrated, &p.chunks, p.after_listed);
            self.counts = Counts::of(handled, remaining);
            // List ahead: at most the chunk being written and the next one are held.
            if listing.is_none() && p.chunks.len() < 2 {
                if let Some(token) = p.to_list.take() {
                    let m = &m;
                    listing = Some(Box::pin(async move { m.list(token.as_deref()).await }));
                }
            }
            // Keep the writes going.
            while in_flight.len() < WRITE_PARALLELISM {
                let Some(c) = p.chunks.iter_mut().find(|c| c.todo.len() > 0) else { break };
                let Some(item) = c.todo.next() else { break };
                c.outstanding += 1;
                let (seq, m) = (c.seq, &m);
                in_flight.push(Box::pin(async move { (seq, m.rewrite(&item.metadata).await) }));
            }
            if listing.is_none() && in_flight.is_empty() {
                // Nothing is left to list or to write, yet no chunk ended the migration: cannot happen.
                return Ok(Err(Failure::ListEnded { resource: m.qualified.clone() }));
            }
            tokio::select! {
                Some((seq, r)) = in_flight.next(), if !in_flight.is_empty() => {
                    let Some(c) = p.chunks.iter_mut().find(|c| c.seq == seq) else { continue };
                    c.outstanding -= 1;
                    match r {
                        Ok(Rewrite::Done) => c.done += 1,
                        Ok(Rewrite::Skipped) => c.skipped += 1,
                        // Returning drops (cancels) the writes still in flight.
                        Err(failure) => return Ok(Err(failure)),
                    }
                    ctx.metrics.observe_migrated(label, 1);
                }
                Some(r) = async { Some(listing.as_mut()?.await) }, if listing.is_some() => {
                    listing = None;
                    if let Err(failure) = self.listed(&mut p, r, &m, label) {
                        return Ok(Err(failure));
                    }
                }
                _ = tick.tick() => self.tick(&mut p, &m, label).await?,
                _ = until_cancelled(&mut cancel) => return Err(Stop::Cancelled),
            }
        }
    }

    /// Objects handled before the saved token (the status may count some of the chunk after it, which is done
    /// again).
    fn migrated_at_token(&self, from_token: bool) -> i64 {
        match from_token {
            true => self.svm.migrated_at_token(),
            false => 0,
        }
    }

    /// Marks the migration Running (the CRD first), or logs that it resumes. An in-tree migration, already
    /// promoted to Running, records the resource's list resourceVersion first, as the in-tree resource-version
    /// controller does before the migrator starts.
    async fn begin(&mut self, m: &Migrating<'_>, from_token: bool) -> Result<Result<(), Failure>, Stop> {
        let gvr = m.gvr;
        if self.svm.needs_resource_version() {
            let rv = match m.list_resource_version().await {
                Ok(rv) => rv,
                Err(failure) => return Ok(Err(failure)),
            };
            self.save(Subresource::Status, Step::Checkpoint, |s| s.set_resource_version(&rv)).await?;
            return Ok(Ok(()));
        }
        let why = self.why();
        if self.svm.is_running() {
            tracing::info!(migration = %self.svm.display(), resource = %gvr.display(), reason = %why,
                resumed_from_token = from_token, "migration resumed");
            return Ok(Ok(()));
        }
        // The CRD first: a crash before the migration reads Running starts (and marks the CRD) again.
        self.ctx.crds.update(gvr, &self.name, crd::Phase::Started).await;
        let message = self.svm.progress_message(gvr, None, None);
        self.save(Subresource::Status, Step::Promote, |s| s.set_running(&message)).await?;
        self.started(gvr, &why);
        Ok(Ok(()))
    }

    /// Why the migration was requested (the trigger's annotation), for the log and Events.
    pub(super) fn why(&self) -> String {
        annotation(self.svm.meta(), crate::scheduler::trigger_kit::ANNOTATION_REASON)
            .unwrap_or("created by a user")
            .to_string()
    }

    /// The migration just turned Running: the log and a Normal Event say so.
    pub(super) fn started(&self, gvr: &GroupVersionResource, why: &str) {
        tracing::info!(migration = %self.svm.display(), resource = %gvr.display(), reason = %why,
            "migration started");
        self.events.normal(EVENT_STARTED, &format!("Migrating {} ({why})", gvr.display()));
    }

    /// Completed chunks, oldest first: progress and token are saved. Some(total) once the last chunk is done.
    async fn save_completed(
        &mut self,
        p: &mut Pipeline,
        gvr: &GroupVersionResource,
        label: &str,
    ) -> Result<Option<i64>, Stop> {
        while p.chunks.front().is_some_and(|c| c.todo.len() == 0 && c.outstanding == 0) {
            let Some(c) = p.chunks.pop_front() else { break };
            p.migrated += c.len as i64;
            let (handled, remaining) = progress(p.migrated, &p.chunks, p.after_listed);
            self.ctx.metrics.observe_remaining(label, remaining.unwrap_or(0));
            tracing::debug!(migration = %self.name, done = c.done, skipped = c.skipped, migrated = p.migrated,
                remaining = ?remaining, more = c.next.is_some(), "chunk migrated");
            let Some(next) = c.next else { return Ok(Some(p.migrated)) };
            let at_token = p.migrated;
            self.save(Subresource::Main, Step::Migrate, |s| s.set_checkpoint(&next, at_token)).await?;
            self.save_progress(gvr, handled, remaining, None).await?;
            p.saved = Some((handled, remaining, None));
        }
        Ok(None)
    }

    /// A LIST answered: its chunk joins the pipeline, or an expired token is resumed from.
    fn listed(
        &self,
        p: &mut Pipeline,
        r: Result<Listed, Failure>,
        m: &Migrating<'_>,
        label: &str,
    ) -> Result<(), Failure> {
        match r? {
            Listed::Chunk(list) => {
                p.expired_in_a_row = 0;
                let next = list.metadata.continue_.filter(|t| !t.is_empty());
                if next.is_some() {
                    p.to_list = Some(next.clone());
                }
                p.after_listed =
                    if next.is_some() { list.metadata.remaining_item_count.map(|n| n.max(0)) } else { Some(0) };
                p.chunks.push_back(Chunk {
                    seq: p.next_seq,
                    len: list.items.len(),
                    todo: list.items.into_iter(),
                    outstanding: 0,
                    done: 0,
                    skipped: 0,
                    next,
                });
                p.next_seq += 1;
                let (_, remaining) = progress(p.migrated, &p.chunks, p.after_listed);
                self.ctx.metrics.observe_remaining(label, remaining.unwrap_or(0));
            }
            Listed::Expired(next) => {
                p.expired_in_a_row += 1;
                if p.expired_in_a_row >= self.ctx.target.config.max_attempts.max(1) {
                    return Err(Failure::TokenExpired { resource: m.qualified.clone(), times: p.expired_in_a_row });
                }
                tracing::info!(migration = %self.name, restart = next.is_none(),
                    "continue token expired (410): resuming with the inconsistent continue token");
                // Without a token from the server, starting over is safe: rewriting twice is harmless.
                p.to_list = Some(next);
            }
        }
        Ok(())
    }

    /// Every PROGRESS_INTERVAL: progress saved when it changed, and logged now and then.
    async fn tick(&mut self, p: &mut Pipeline, m: &Migrating<'_>, label: &str) -> Result<(), Stop> {
        let (handled, remaining) = progress(p.migrated, &p.chunks, p.after_listed);
        self.ctx.metrics.observe_remaining(label, remaining.unwrap_or(0));
        let retrying = m.retrying.get();
        let now = (handled, remaining, retrying.clone());
        if p.saved.as_ref() != Some(&now) {
            self.save_progress(m.gvr, handled, remaining, retrying.as_deref()).await?;
            p.saved = Some(now);
        }
        if p.logged.elapsed() >= LOG_INTERVAL {
            p.logged = std::time::Instant::now();
            tracing::info!(migration = %self.name, resource = %m.gvr.display(), objects = handled,
                remaining = ?remaining, retrying = ?retrying, "migration progress");
        }
        Ok(())
    }
}

/// Where one migration's pipeline stands.
pub(super) struct Pipeline {
    /// Objects handled before the chunks held.
    pub(super) migrated: i64,
    pub(super) chunks: VecDeque<Chunk>,
    pub(super) next_seq: u64,
    /// The token to list next; None after the last chunk was listed.
    pub(super) to_list: Option<Option<String>>,
    /// The latest listed chunk's remainingItemCount (0 after the last chunk); None before the first LIST.
    pub(super) after_listed: Option<i64>,
    pub(super) expired_in_a_row: u32,
    /// The progress last saved (handled, remaining, retrying).
    pub(super) saved: Option<(i64, Option<i64>, Option<String>)>,
    pub(super) logged: std::time::Instant,
}

impl Pipeline {
    fn new(migrated: i64, token: Option<String>) -> Self {
        Pipeline {
            migrated,
            chunks: VecDeque::new(),
            next_seq: 0,
            to_list: Some(token),
            after_listed: None,
            expired_in_a_row: 0,
            saved: None,
            logged: std::time::Instant::now(),
        }
    }
}

/// Objects handled so far (`migrated` before the chunks held, plus those handled in them) and the estimate of the
/// objects left (those held and not yet handled, plus the latest LIST's remainingItemCount; None when unknown).
pub(super) fn progress(migrated: i64, chunks: &VecDeque<Chunk>, after_listed: Option<i64>) -> (i64, Option<i64>) {
    let handled: u64 = chunks.iter().map(|c| c.done + c.skipped).sum();
    let held: u64 = chunks.iter().map(|c| (c.len as u64).saturating_sub(c.done + c.skipped)).sum();
    let handled = migrated + i64::try_from(handled).unwrap_or(i64::MAX);
    (handled, after_listed.map(|after| after + i64::try_from(held).unwrap_or(i64::MAX)))
}

pub(super) type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A listed chunk on its way through the pipeline.
pub(super) struct Chunk {
    pub(super) seq: u64,
    pub(super) len: usize,
    /// Objects not yet handed to a writer.
    pub(super) todo: std::vec::IntoIter<ItemRef>,
    /// Writes in flight.
    pub(super) outstanding: usize,
    pub(super) done: u64,
    pub(super) skipped: u64,
    /// Where the list continues after this chunk; None for the last one.
    pub(super) next: Option<String>,
}

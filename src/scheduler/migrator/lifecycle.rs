//! A migration from start to end: promotion, the run, and how it ended (conditions, the CRD, Events, metrics, the
//! log). An in-tree migration goes through kube-controller-manager's steps at GA (see [`super::migration`]): Running
//! first, then discovery and `status.resourceVersion`, then the objects, then Succeeded or Failed, then Running=False.

use super::worker::*;
use super::*;
use crate::api::storage_version_migration::{GroupVersionResource, CONDITION_FAILED, CONDITION_SUCCEEDED};
use crate::client::api_reason;
use crate::error::StatusReason;
use crate::registry::Subresource;
use crate::scheduler::metrics::resource_label;

/// The resource of a migration before discovery named its version.
fn unresolved(svm: &Migration) -> GroupVersionResource {
    let r = svm.resource();
    GroupVersionResource { group: r.group, version: String::new(), resource: r.resource }
}

impl Worker {
    /// Runs the migration and records how it ended; tells the scheduler whether to start it again.
    pub(super) async fn run(mut self) -> Ended {
        if self.svm.needs_completion() {
            // Ended before a crash (or by someone else) with Running still True: only the runner's last step is
            // left.
            let stop = self.complete().await.err();
            if let Some(stop) = stop {
                tracing::info!(migration = %self.svm.display(), reason = %stop, "completing the migration stopped");
            }
            return self.ended(Requeue::No);
        }
        let started = std::time::Instant::now();
        let (gvr, outcome) = match self.promote().await {
            Err(stop) => (unresolved(&self.svm), Err(stop)),
            Ok(()) => match self.resolve().await {
                Ok(Ok(gvr)) => {
                    let label = resource_label(&gvr);
                    self.ctx.metrics.observe_progress(&label);
                    let outcome = self.migrate(&gvr, &label).await;
                    (gvr, outcome)
                }
                Ok(Err(failure)) => (unresolved(&self.svm), Ok(Err(failure))),
                Err(stop) => (unresolved(&self.svm), Err(stop)),
            },
        };
        let label = resource_label(&gvr);
        let migrated = self.svm.progress().0.unwrap_or(0);
        let mut stop = match outcome {
            Ok(Ok(total)) => self.succeeded(&gvr, &label, total, started).await.err(),
            Ok(Err(failure)) if failure.is_transient() => Some(self.transient(&gvr, &failure).await),
            Ok(Err(failure)) => self.failed(&gvr, &label, &failure, migrated, started).await.err(),
            Err(stop) => Some(stop),
        };
        if let Some(Stop::Refused(why)) = &stop {
            // Logged once here; the migration then ends Failed with the refusal, or stays as it is when even that
            // is refused (logged once more): never written again in a loop.
            tracing::warn!(migration = %self.svm.display(), resource = %gvr.display(), refusal = %why,
                "the server refused the migration's state; the migration fails");
            let failure = Failure::StateRefused { answer: why.clone() };
            stop = self.failed(&gvr, &label, &failure, migrated, started).await.err();
        }
        let requeue = match &stop {
            Some(Stop::Save(_)) => Requeue::Soon,
            Some(Stop::Transient(_)) => Requeue::Backoff,
            _ => Requeue::No,
        };
        if let Some(stop) = stop {
            self.stopped(&gvr, &label, stop, migrated).await;
        }
        self.ended(requeue)
    }

    fn ended(&mut self, requeue: Requeue) -> Ended {
        let resource_version = self.seen_version.take().or_else(|| self.svm.meta().resource_version.clone());
        Ended { uid: self.svm.meta().uid.clone().unwrap_or_default(), resource_version, requeue }
    }

    /// The in-tree runner's promotion: the CRD's condition, then Running=True (`The migration is running`), before
    /// discovery is asked. Ours turns Running when it starts writing ([`Worker::migrate`]).
    async fn promote(&mut self) -> Result<(), Stop> {
        if self.svm.api() != MigrationApi::InTree || self.svm.is_running() {
            return Ok(());
        }
        if is_finished(&self.svm) {
            return Err(Stop::FinishedElsewhere(self.svm.phase()));
        }
        let gvr = unresolved(&self.svm);
        self.ctx.crds.update(&gvr, &self.name, crd::Phase::Started).await;
        let message = self.svm.progress_message(&gvr, None, None);
        self.save(Subresource::Status, Step::Promote, |m| m.set_running(&message)).await?;
        self.started(&gvr, &self.why());
        Ok(())
    }

    /// The in-tree runner's last step: Running=False (`MigrationCompleted`). Nothing for ours, or when it is done
    /// already. A conflict is read again; a migration deleted meanwhile is left alone.
    pub(super) async fn complete(&mut self) -> Result<(), Stop> {
        for _ in 0..SAVE_ATTEMPTS {
            if !self.svm.needs_completion() {
                return Ok(());
            }
            let mut next = self.svm.clone();
            next.complete();
            match self.ctx.replace(&next, Subresource::Status, next.manager(Step::Complete)).await {
                Ok(saved) => {
                    self.svm = saved;
                    return Ok(());
                }
                Err(e) if api_reason(&e) == Some(StatusReason::Conflict) => match self.ctx.get(&self.svm.key()).await {
                    Ok(Some(fresh)) => self.svm = fresh,
                    Ok(None) => return Err(Stop::Gone),
                    Err(e) => return Err(Stop::Save(e.to_string())),
                },
                Err(e) if api_reason(&e) == Some(StatusReason::NotFound) => return Err(Stop::Gone),
                Err(kube::Error::Api(status)) if status.code == 422 => return Err(Stop::Refused(status.message)),
                Err(e) => return Err(Stop::Save(e.to_string())),
            }
        }
        Err(Stop::Save("the migration kept changing".into()))
    }

    /// Every object handled: the CRD's storedVersions, then Succeeded, then (in-tree) Running=False.
    async fn succeeded(
        &mut self,
        gvr: &GroupVersionResource,
        label: &str,
        total: i64,
        started: std::time::Instant,
    ) -> Result<(), Stop> {
        // The CRD first: when the migration reads Succeeded, its storedVersions are already trimmed.
        self.ctx.crds.update(gvr, &self.name, crd::Phase::Succeeded).await;
        if self.svm.progress_subresource() == Subresource::Main {
            self.save(Subresource::Main, Step::Migrate, |m| m.set_progress(total, Some(0))).await?;
        }
        let outcome = Outcome::Succeeded { total, message: format!("Migrated {total} objects of {}.", gvr.display()) };
        self.save(Subresource::Status, Step::Migrate, |m| m.set_outcome(&outcome)).await?;
        let seconds = started.elapsed().as_secs_f64();
        let note = format!("Migrated {total} objects of {} in {seconds:.1}s", gvr.display());
        self.events.normal(EVENT_SUCCEEDED, &note);
        self.ctx.metrics.observe_remaining(label, 0);
        self.ctx.metrics.observe_finished(label, CONDITION_SUCCEEDED);
        tracing::info!(migration = %self.svm.display(), resource = %gvr.display(), objects = total,
            seconds = started.elapsed().as_secs_f64(), outcome = CONDITION_SUCCEEDED, "migration ended");
        self.complete().await
    }

    /// The migration failed: the CRD's condition ends, then Failed, then (in-tree) Running=False.
    pub(super) async fn failed(
        &mut self,
        gvr: &GroupVersionResource,
        label: &str,
        failure: &Failure,
        migrated: i64,
        started: std::time::Instant,
    ) -> Result<(), Stop> {
        self.ctx.crds.update(gvr, &self.name, crd::Phase::Failed).await;
        let (in_tree, step) = match failure {
            Failure::NotInDiscovery { .. } => {
                (InTreeFailure::Checkpoint(IN_TREE_NOT_IN_DISCOVERY.into()), Step::Checkpoint)
            }
            f if f.is_checkpoint() => (InTreeFailure::Checkpoint(f.to_string()), Step::Checkpoint),
            f => (InTreeFailure::Unhandled(f.to_string()), Step::Migrate),
        };
        let outcome = Outcome::Failed { message: truncate(&failure.to_string(), 32000), in_tree, counts: self.counts };
        self.save(Subresource::Status, step, |m| m.set_outcome(&outcome)).await?;
        self.events.warning(EVENT_FAILED, &format!("Migration of {} failed: {failure}", gvr.display()));
        self.ctx.metrics.observe_remaining(label, 0);
        self.ctx.metrics.observe_finished(label, CONDITION_FAILED);
        tracing::warn!(migration = %self.svm.display(), resource = %gvr.display(), objects = migrated,
            seconds = started.elapsed().as_secs_f64(), outcome = CONDITION_FAILED, error = %failure,
            "migration ended");
        self.complete().await
    }

    /// The target kept answering with retryable errors: the Running condition says so (in-tree: `; transient
    /// error: <error>`, ours: `Retrying: <error>`) and the migration is started again later.
    async fn transient(&mut self, gvr: &GroupVersionResource, failure: &Failure) -> Stop {
        let why = failure.to_string();
        if self.svm.is_running() {
            let message = self.svm.progress_message(gvr, self.counts, Some(&why));
            if let Err(stop) = self.save(Subresource::Status, Step::Migrate, |m| m.set_running(&message)).await {
                return stop;
            }
        }
        Stop::Transient(why)
    }

    /// The migration stopped without an outcome of ours.
    async fn stopped(&mut self, gvr: &GroupVersionResource, label: &str, stop: Stop, migrated: i64) {
        match &stop {
            Stop::Save(_) => {
                tracing::warn!(migration = %self.name, resource = %gvr.display(), objects = migrated, reason = %stop,
                    "migration interrupted; it resumes from its saved token");
                return;
            }
            Stop::Transient(_) => {
                tracing::warn!(migration = %self.name, resource = %gvr.display(), objects = migrated, reason = %stop,
                    "the target keeps answering with retryable errors; the migration resumes from its saved token after a backoff");
                return;
            }
            _ => {}
        }
        // Superseded or deleted (the scheduler cancels the work on such a migration too): it will not finish, so
        // its CRD condition ends, storedVersions untouched. A scheduler that stopped (a replica losing leadership)
        // leaves it Running, to be resumed.
        let ended = match &stop {
            Stop::Cancelled => match self.ctx.get(&self.svm.key()).await {
                Ok(None) => true,
                Ok(Some(svm)) => is_finished(&svm),
                Err(_) => false,
            },
            _ => true,
        };
        if ended {
            self.ctx.crds.update(gvr, &self.name, crd::Phase::Failed).await;
            self.ctx.metrics.observe_remaining(label, 0);
        }
        tracing::info!(migration = %self.name, resource = %gvr.display(), objects = migrated,
            reason = %stop, "migration stopped")
    }
}

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
//! in its message, and the controller starts it again from its saved token after a backoff that doubles up to
//! [`MAX_BACKOFF`]: transient errors never fail a migration (kube-controller-manager's GA controller retries them
//! too). Anything else fails the migration at once with a message naming the object, instead of retrying forever as
//! kube-storage-version-migrator does (its issue #83).
//!
//! Someone else may finish a migration under us: the trigger supersedes it (Failed=True, reason Superseded) or a
//! user deletes it. Every save is a compare-and-swap on resourceVersion; on a conflict the migration is re-read and,
//! if it is now finished or gone, dropped without overwriting anything. The controller also notices it (watch
//! of storageversionmigrations) and interrupts the work on the target.
//!
//! Which migrations run is decided by a kube-runtime controller ([`controller`]) over reflector stores of both
//! kinds, with the one-per-resource rule and the concurrency limit inside its reconcile ([`queue`]); there is no
//! periodic re-list.

use super::adaptive::Pace;
use super::events::{reference_to, EventRecorder, EventType};
use super::metrics::{resource_label, SchedulerMetrics};
use super::SchedulerConfig;
use crate::api::storage_version_migration::StorageVersionMigration;
use crate::api::storagemigration::StorageVersionMigration as InTreeMigration;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

mod controller;
pub mod crd;
mod in_tree;
pub use in_tree::*;
mod migration;
pub use migration::*;
mod target;
pub use target::*;
mod lifecycle;
mod queue;
mod worker;

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
    tracing::info!(
        qps = config.qps,
        burst = config.burst,
        adaptive = config.adaptive,
        min_qps = config.min_qps,
        chunk_size = config.chunk_size,
        concurrency = config.concurrency,
        max_attempts = config.max_attempts,
        "migrator started"
    );
    let pace = Pace::start(&config, metrics.clone());
    let crds = crd::Crds::new(target.clone(), config.update_crd_stored_versions, events.clone());
    let target = Target { client: target, pace, config };
    let ctx = Arc::new(Ctx { target, crds, migrations: apis.ours, in_tree: apis.in_tree, metrics, events });
    tokio::spawn(controller::run(ctx))
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

/// How a worker ended, for the controller: the migration (uid) and the last resourceVersion the worker read or
/// wrote of it, and whether it should be started again.
pub(super) struct Ended {
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
        let url = <kube::core::DynamicObject as kube::Resource>::url_path(&api_resource(&core), None);
        assert_eq!(group_version_of(&url, "secrets"), "api/v1");
        let apps = GroupVersionResource { group: "apps".into(), version: "v1".into(), resource: "deployments".into() };
        let url = <kube::core::DynamicObject as kube::Resource>::url_path(&api_resource(&apps), None);
        assert_eq!(group_version_of(&url, "deployments"), "apis/apps/v1");
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
        use controller::backoff_after;
        let first = Duration::from_secs(30);
        let waits: Vec<u64> = (1..=6).map(|n| backoff_after(first, n).as_secs()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 300, 300]);
        let waits: Vec<u64> = (1..=11).map(|n| backoff_after(REQUEUE, n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff_after(Duration::ZERO, 1), Duration::from_millis(100));
        assert_eq!(backoff_after(first, u32::MAX), MAX_BACKOFF);
    }
}

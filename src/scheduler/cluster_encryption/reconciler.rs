//! The cluster key-rotation trigger as a reconciler of its inputs: a kube-runtime reflector keeps the identity
//! Leases of kube-system, and a round runs when the set of live kube-apiservers changes (a renewal alone, every
//! 10 s per apiserver, changes nothing the round decides on, so it does not wake it), when the mounted copy of the
//! EncryptionConfiguration changes (its content hash, polled as `--encryption-provider-config` is: a mounted
//! Secret changes by a symlink swap that no file event shows), and every `--cluster-key-rotation-interval`: the
//! `/metrics` each apiserver reports its loaded config in has no watch, so only a requeue sees an apiserver load a
//! new file. A round still reads the StorageStates from the API (not a store) before it acts, so that one that has
//! not yet seen its own last write never requests a migration twice.

use super::observe::{live_identities, IDENTITY_LABEL, IDENTITY_NAMESPACE};
use super::ClusterKeyRotation;
use crate::scheduler::events::EventRecorder;
use crate::scheduler::trigger_kit::TriggerContext;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{self, reflector, Store};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Notify;

/// Runs the rounds until the task is aborted (a replica losing leadership drops the reflector with them).
pub(super) async fn run(me: ClusterKeyRotation, ctx: TriggerContext, events: EventRecorder) {
    let (leases, writer) = reflector::store::<Lease>();
    let api: Api<Lease> = Api::namespaced(ctx.target.clone(), IDENTITY_NAMESPACE);
    let changes = reflector(writer, watcher(api, watcher::Config::default().labels(IDENTITY_LABEL))).default_backoff();
    // A Notify keeps one wake-up while a round runs: changes during a round make exactly one more round after it.
    let wake = Arc::new(Notify::new());
    let rounds = async {
        // The first complete list wakes the first round: before it, no apiserver is known to be live.
        wake.notified().await;
        let mut last = String::new();
        loop {
            let snapshot: Vec<Lease> = leases.state().iter().map(|l| Lease::clone(l)).collect();
            me.round(&ctx, &events, &snapshot, &mut last).await;
            // The requeue: /metrics has no watch.
            let _ = tokio::time::timeout(me.interval, wake.notified()).await;
        }
    };
    tokio::join!(wake_on_live_set(changes, leases.clone(), &wake), wake_on_copy(me.copy.clone(), &wake), rounds);
}

/// Wakes a round whenever the set of live identities in the store differs from the one last seen; the first
/// complete list always does.
async fn wake_on_live_set(
    changes: impl futures::Stream<Item = Result<Event<Lease>, watcher::Error>>,
    leases: Store<Lease>,
    wake: &Notify,
) {
    let mut live = LiveSet::default();
    let mut changes = std::pin::pin!(changes);
    while let Some(event) = changes.next().await {
        match event {
            Err(e) => tracing::warn!(error = %e, "cluster key rotation: watching the identity Leases; retrying"),
            // A relist replaces the store only at its end (InitDone): the store is stale until then.
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => {
                let leases: Vec<Lease> = leases.state().iter().map(|l| Lease::clone(l)).collect();
                if live.changed(live_identities(&leases, Timestamp::now())) {
                    wake.notify_one();
                }
            }
        }
    }
}

/// The live identities a round was last woken for: the predicate that filters renewals out.
#[derive(Default)]
struct LiveSet(Option<BTreeSet<String>>);

impl LiveSet {
    /// Whether `now` differs from the set last seen (always, the first time); remembers it.
    fn changed(&mut self, now: BTreeSet<String>) -> bool {
        let changed = self.0.as_ref() != Some(&now);
        self.0 = Some(now);
        changed
    }
}

/// Wakes a round when the copy's content hash changes (polled, like the own config's reload); without a copy,
/// returns at once.
async fn wake_on_copy(copy: Option<PathBuf>, wake: &Notify) {
    let Some(path) = copy else { return };
    let hash = |bytes: std::io::Result<Vec<u8>>| bytes.ok().map(|b| super::config::sha256_label(&b));
    let mut seen = hash(tokio::fs::read(&path).await);
    let mut tick = tokio::time::interval(crate::server::encryption_reload::POLL_INTERVAL);
    loop {
        tick.tick().await;
        let now = hash(tokio::fs::read(&path).await);
        if now != seen {
            seen = now;
            wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_a_different_set_of_live_apiservers_wakes_a_round() {
        let mut live = LiveSet::default();
        assert!(live.changed(set(&[])), "the first list wakes even with no apiserver");
        assert!(live.changed(set(&["a", "b"])));
        assert!(!live.changed(set(&["a", "b"])), "a renewal: the same set");
        assert!(live.changed(set(&["a"])), "b's Lease deleted or expired");
        assert!(live.changed(set(&["a", "b"])), "b back");
    }
}

//! The election lock in cluster mode: a coordination.k8s.io/v1 Lease on the target cluster, with client-go's
//! `LeaseLock` semantics. The holder writes holderIdentity, leaseDurationSeconds, acquireTime and renewTime (and
//! counts leaseTransitions when the holder changes); every write is a compare-and-swap on resourceVersion (a 409
//! means another candidate wrote first).
//!
//! As client-go, a candidate judges expiry on its own clock: the lease is expired when the record has not changed
//! for leaseDurationSeconds since this process last saw it change. Comparing another machine's renewTime with our
//! clock would make clock skew decide who leads. A record with no holder (released) is free at once.

use super::{LeaderLock, LockError};
use crate::client::api_reason;
use crate::error::StatusReason;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use std::time::{Duration, Instant};

/// The Lease's writes, named as the leader election's.
fn params() -> kube::api::PostParams {
    crate::scheduler::managers::post(crate::scheduler::managers::LEADER_ELECTION)
}

/// The record as last read, and when (our clock) it was first seen with this content.
#[derive(Clone, Debug)]
pub struct Observed {
    pub spec: LeaseSpec,
    pub at: Instant,
}

/// What a candidate does after reading the Lease.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseAction {
    /// No Lease: create it holding it.
    Create(LeaseSpec),
    /// Write this record (renewal, or take-over of an expired or released lease).
    Update(LeaseSpec),
    /// Someone else holds a valid lease.
    Wait,
}

/// When the record was last seen changing: `now` for a new or changed record, else when it was first seen.
pub fn observe(previous: Option<&Observed>, current: &LeaseSpec, now: Instant) -> Observed {
    match previous {
        Some(p) if p.spec == *current => p.clone(),
        _ => Observed { spec: current.clone(), at: now },
    }
}

/// client-go's `tryAcquireOrRenew` decision for `me`, given the Lease's current record (None: no Lease) seen
/// unchanged since `observed_at`, at `now` (our monotonic clock) and `wall` (the time written into the record).
pub fn decide(
    current: Option<&LeaseSpec>,
    observed_at: Instant,
    me: &str,
    lease_duration: Duration,
    now: Instant,
    wall: Timestamp,
) -> LeaseAction {
    // Rounded up: other candidates must never wait less than our own lease duration.
    let seconds = i32::try_from((lease_duration.as_secs_f64().ceil() as u64).max(1)).unwrap_or(i32::MAX);
    let fresh = LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: Some(0),
        ..Default::default()
    };
    let Some(cur) = current else { return LeaseAction::Create(fresh) };
    let holder = cur.holder_identity.as_deref().unwrap_or_default();
    if holder == me {
        // Renewal: acquireTime and transitions stay.
        return LeaseAction::Update(LeaseSpec {
            acquire_time: cur.acquire_time.clone().or(fresh.acquire_time),
            lease_transitions: cur.lease_transitions.or(Some(0)),
            ..fresh
        });
    }
    let held_for = Duration::from_secs(u64::try_from(cur.lease_duration_seconds.unwrap_or(0).max(0)).unwrap_or(0));
    let valid = !holder.is_empty() && observed_at + held_for > now;
    if valid {
        return LeaseAction::Wait;
    }
    // Take-over of an expired or released lease: one more transition.
    LeaseAction::Update(LeaseSpec {
        lease_transitions: Some(cur.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..fresh
    })
}

/// The record written on release (client-go's ReleaseOnCancel): no holder, so that others take over at once.
pub fn released(cur: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: cur.lease_transitions,
        ..Default::default()
    }
}

/// Whether the cluster serves coordination.k8s.io/v1 Leases (every kube-apiserver since 1.14 does; a target that is
/// another API server, such as a migration-apiserver, may not). Unknown (unreachable) counts as served: the election
/// then retries until it is reachable.
pub async fn served(client: &kube::Client) -> bool {
    let req = axum::http::Request::builder()
        .uri("/apis/coordination.k8s.io/v1")
        .header(axum::http::header::ACCEPT, "application/json")
        .body(Vec::new());
    let Ok(req) = req else { return true };
    let probe = tokio::time::timeout(Duration::from_secs(10), client.request_text(req)).await;
    !matches!(probe, Ok(Err(e)) if api_reason(&e) == Some(StatusReason::NotFound))
}

pub struct LeaseLock {
    api: kube::Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    observed: Option<Observed>,
    /// The Lease as last read or written (its resourceVersion is the precondition of the next write).
    last: Option<Lease>,
}

impl LeaseLock {
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str, lease_duration: Duration) -> Self {
        LeaseLock {
            api: kube::Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration,
            observed: None,
            last: None,
        }
    }
}

#[async_trait::async_trait]
impl LeaderLock for LeaseLock {
    async fn try_acquire_or_renew(&mut self) -> Result<bool, LockError> {
        // The leader election of client-go reads before every write: a renewal never blindly overwrites.
        let current = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        let spec = current.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
        if current.is_some() {
            self.observed = Some(observe(self.observed.as_ref(), &spec, now));
        }
        let observed_at = self.observed.as_ref().map(|o| o.at).unwrap_or(now);
        let action = decide(
            current.as_ref().map(|_| &spec),
            observed_at,
            &self.identity,
            self.lease_duration,
            now,
            Timestamp::now(),
        );
        let written = match action {
            LeaseAction::Wait => {
                self.last = current;
                return Ok(false);
            }
            LeaseAction::Create(spec) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&params(), &lease).await
            }
            LeaseAction::Update(spec) => {
                let mut lease = current.unwrap_or_default();
                lease.spec = Some(spec);
                self.api.replace(&self.name, &params(), &lease).await
            }
        };
        match written {
            Ok(l) => {
                if let Some(spec) = &l.spec {
                    self.observed = Some(Observed { spec: spec.clone(), at: now });
                }
                self.last = Some(l);
                Ok(true)
            }
            // Another candidate wrote first (409 on update, 409 AlreadyExists on create).
            Err(e) if matches!(api_reason(&e), Some(StatusReason::Conflict | StatusReason::AlreadyExists)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn release(&mut self) -> Result<(), LockError> {
        let Some(mut lease) = self.last.clone() else { return Ok(()) };
        let Some(spec) = lease.spec.as_ref().filter(|s| s.holder_identity.as_deref() == Some(&self.identity)) else {
            return Ok(());
        };
        lease.spec = Some(released(spec, Timestamp::now()));
        match self.api.replace(&self.name, &params(), &lease).await {
            Ok(written) => {
                self.last = Some(written);
                Ok(())
            }
            // Written by another since our last write: it is no longer ours to release.
            Err(e) if matches!(api_reason(&e), Some(StatusReason::Conflict | StatusReason::AlreadyExists)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn holder(&self) -> Option<String> {
        self.last.as_ref()?.spec.as_ref()?.holder_identity.clone().filter(|h| !h.is_empty())
    }

    fn describe(&self) -> String {
        format!("lease {}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn wall(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("ts")
    }

    fn held_by(who: &str, acquired: i64, renewed: i64, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(wall(acquired))),
            renew_time: Some(MicroTime(wall(renewed))),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    #[test]
    fn no_lease_is_created_holding_it() {
        let t0 = Instant::now();
        let LeaseAction::Create(spec) = decide(None, t0, "a", D, t0, wall(0)) else { panic!("create") };
        assert_eq!(spec, held_by("a", 0, 0, 0));
    }

    #[test]
    fn a_valid_lease_of_another_is_respected_until_it_expires_on_our_clock() {
        let t0 = Instant::now();
        let cur = held_by("b", 0, 0, 3);
        for after in [0, 5, 14] {
            assert_eq!(
                decide(Some(&cur), t0, "a", D, t0 + Duration::from_secs(after), wall(after as i64)),
                LeaseAction::Wait
            );
        }
        // Expired: taken over, one more transition, acquireTime and renewTime now.
        let LeaseAction::Update(spec) = decide(Some(&cur), t0, "a", D, t0 + Duration::from_secs(15), wall(15)) else {
            panic!("take over")
        };
        assert_eq!(spec, held_by("a", 15, 15, 4));
        // The record's renewTime is another machine's clock and does not count: a record renewed "long ago" but
        // first seen now is valid for a full lease duration.
        let old = held_by("b", -1000, -1000, 0);
        assert_eq!(decide(Some(&old), t0, "a", D, t0 + Duration::from_secs(1), wall(1)), LeaseAction::Wait);
    }

    #[test]
    fn renewal_keeps_acquire_time_and_transitions() {
        let t0 = Instant::now();
        let cur = held_by("a", 0, 10, 2);
        let LeaseAction::Update(spec) = decide(Some(&cur), t0, "a", D, t0 + Duration::from_secs(100), wall(12)) else {
            panic!("renew")
        };
        assert_eq!(spec, held_by("a", 0, 12, 2));
    }

    #[test]
    fn a_released_lease_is_free_at_once() {
        let t0 = Instant::now();
        let rel = released(&held_by("b", 0, 5, 1), wall(6));
        assert_eq!(rel.holder_identity, None);
        assert_eq!(rel.lease_transitions, Some(1));
        let LeaseAction::Update(spec) = decide(Some(&rel), t0, "a", D, t0, wall(7)) else { panic!("take over") };
        assert_eq!(spec, held_by("a", 7, 7, 2));
    }

    #[test]
    fn observation_time_moves_only_when_the_record_changes() {
        let t0 = Instant::now();
        let a = held_by("b", 0, 0, 0);
        let first = observe(None, &a, t0);
        assert_eq!(first.at, t0);
        let same = observe(Some(&first), &a, t0 + Duration::from_secs(9));
        assert_eq!(same.at, t0, "unchanged record: still the first sighting");
        let renewed = held_by("b", 0, 2, 0);
        let changed = observe(Some(&same), &renewed, t0 + Duration::from_secs(10));
        assert_eq!(changed.at, t0 + Duration::from_secs(10));
        // So a holder that keeps renewing is never expired in our eyes, and one that stopped expires a lease
        // duration after its last renewal was seen.
        assert_eq!(
            decide(Some(&renewed), changed.at, "a", D, t0 + Duration::from_secs(24), wall(24)),
            LeaseAction::Wait
        );
        assert!(matches!(
            decide(Some(&renewed), changed.at, "a", D, t0 + Duration::from_secs(25), wall(25)),
            LeaseAction::Update(_)
        ));
    }

    /// A stand-in for kube-apiserver's Lease endpoints (no kube-apiserver runs here): GET, POST and PUT of one
    /// Lease with resourceVersion compare-and-swap, and the group's discovery document.
    #[derive(Default)]
    struct StandIn {
        lease: Option<serde_json::Value>,
        rv: u64,
        conflict_next_put: bool,
    }

    fn status(code: u16, reason: &str) -> axum::response::Response {
        use axum::response::IntoResponse;
        let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                      "reason": reason, "message": reason});
        (axum::http::StatusCode::from_u16(code).expect("code"), axum::Json(body)).into_response()
    }

    fn stand_in(serve_group: bool) -> (axum::Router, std::sync::Arc<std::sync::Mutex<StandIn>>) {
        use axum::extract::State;
        use axum::response::IntoResponse;
        use axum::routing::get;
        type S = State<std::sync::Arc<std::sync::Mutex<StandIn>>>;
        let state = std::sync::Arc::new(std::sync::Mutex::new(StandIn::default()));
        let store = |st: &mut StandIn, mut v: serde_json::Value| {
            st.rv += 1;
            v["metadata"]["resourceVersion"] = serde_json::json!(st.rv.to_string());
            v["apiVersion"] = serde_json::json!("coordination.k8s.io/v1");
            v["kind"] = serde_json::json!("Lease");
            st.lease = Some(v.clone());
            v
        };
        let one = get(|State(s): S| async move {
            match s.lock().expect("lock").lease.clone() {
                Some(l) => axum::Json(l).into_response(),
                None => status(404, "NotFound"),
            }
        })
        .put(move |State(s): S, axum::Json(v): axum::Json<serde_json::Value>| async move {
            let mut st = s.lock().expect("lock");
            let current = st.lease.as_ref().map(|l| l["metadata"]["resourceVersion"].clone());
            if std::mem::take(&mut st.conflict_next_put) || current != Some(v["metadata"]["resourceVersion"].clone()) {
                return status(409, "Conflict");
            }
            axum::Json(store(&mut st, v)).into_response()
        });
        let all = axum::routing::post(move |State(s): S, axum::Json(v): axum::Json<serde_json::Value>| async move {
            let mut st = s.lock().expect("lock");
            if st.lease.is_some() {
                return status(409, "AlreadyExists");
            }
            (axum::http::StatusCode::CREATED, axum::Json(store(&mut st, v))).into_response()
        });
        let mut router = axum::Router::new()
            .route("/apis/coordination.k8s.io/v1/namespaces/ns/leases/lock", one)
            .route("/apis/coordination.k8s.io/v1/namespaces/ns/leases", all);
        if serve_group {
            router = router.route(
                "/apis/coordination.k8s.io/v1",
                get(|| async {
                    axum::Json(serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": "coordination.k8s.io/v1", "resources": []}))
                }),
            );
        }
        (router.with_state(state.clone()), state)
    }

    #[tokio::test]
    async fn lease_lock_reads_creates_renews_and_releases_with_compare_and_swap() {
        let (router, state) = stand_in(true);
        let client = crate::client::in_process_client(router);
        assert!(served(&client).await);
        let (un, _) = stand_in(false);
        assert!(!served(&crate::client::in_process_client(un)).await);

        let mut a = LeaseLock::new(client.clone(), "ns", "lock", "a", D);
        let mut b = LeaseLock::new(client.clone(), "ns", "lock", "b", D);
        assert_eq!(a.describe(), "lease ns/lock");
        // a creates the Lease holding it; b finds it valid.
        assert!(a.try_acquire_or_renew().await.expect("create"));
        assert!(!b.try_acquire_or_renew().await.expect("read"));
        assert_eq!(b.holder().as_deref(), Some("a"));
        let spec = |st: &std::sync::Arc<std::sync::Mutex<StandIn>>| {
            let l = st.lock().expect("lock").lease.clone().expect("lease");
            serde_json::from_value::<Lease>(l).expect("Lease").spec.expect("spec")
        };
        let created = spec(&state);
        assert_eq!(
            (created.holder_identity.as_deref(), created.lease_duration_seconds, created.lease_transitions),
            (Some("a"), Some(15), Some(0))
        );
        // a renews with a compare-and-swap on resourceVersion: acquireTime stays.
        assert!(a.try_acquire_or_renew().await.expect("renew"));
        assert_eq!(spec(&state).acquire_time, created.acquire_time);
        assert_eq!(state.lock().expect("lock").rv, 2);
        // Someone wrote between a's read and its write: 409, this attempt does not hold the lock.
        state.lock().expect("lock").conflict_next_put = true;
        assert!(!a.try_acquire_or_renew().await.expect("conflict is no error"));
        assert!(a.try_acquire_or_renew().await.expect("renew again"));
        // a releases: no holder, and b takes over at once with one more transition.
        a.release().await.expect("release");
        assert_eq!(spec(&state).holder_identity, None);
        assert!(b.try_acquire_or_renew().await.expect("take over"));
        let taken = spec(&state);
        assert_eq!((taken.holder_identity.as_deref(), taken.lease_transitions), (Some("b"), Some(1)));
        // a, no longer the holder (its copy is stale: the write is a 409), releases nothing.
        a.release().await.expect("no-op");
        assert_eq!(spec(&state).holder_identity.as_deref(), Some("b"));
    }
}

//! Leader election for the embedded scheduler: several replicas run, one (the leader) runs the deciding trigger and
//! the migrator. The loop is client-go's `leaderelection`: try to acquire the lock every `retry_period`; once
//! leader, renew it every `retry_period`; a leader that has not renewed successfully within `renew_deadline`
//! (shorter than the lease duration) stops leading at once, before anyone else may take the lock over.
//!
//! The lock is one small trait ([`LeaderLock`]) with two implementations: a coordination.k8s.io/v1 Lease on the
//! target cluster ([`lease::LeaseLock`], cluster mode) and an etcd lease attached to a key ([`etcd::EtcdLock`],
//! when the server keeps its data in etcd). Without either (the embedded store: one process) there is no election:
//! the process always leads.

pub mod etcd;
pub mod lease;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The timing of an election (kube-controller-manager's `--leader-elect-*` flags).
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// How long a lease is valid without renewal: others wait this long before taking over.
    pub lease_duration: Duration,
    /// A leader that has not renewed within this time steps down (must be shorter than the lease duration).
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    pub retry_period: Duration,
    /// Who we are: lease holder and StorageState reporterID.
    pub identity: String,
    /// The lock's name (label of the metric).
    pub name: String,
}

/// client-go's JitterFactor: candidates wait retry_period * [1, 1.2) between attempts.
const JITTER: f64 = 1.2;

/// A leader election configuration that cannot work (client-go's checks).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline")]
    LeaseNotLongerThanRenewDeadline,
    #[error("--leader-elect-renew-deadline must be greater than {JITTER} x --leader-elect-retry-period")]
    RenewDeadlineTooShort,
    #[error("--leader-elect-retry-period must be positive")]
    NoRetryPeriod,
    #[error("the leader election identity must not be empty")]
    NoIdentity,
}

/// Why a lock could not be taken, renewed or released (the election goes on: the next attempt may succeed).
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
    #[error("the etcd lease keep-alive stream closed")]
    KeepAliveClosed,
    #[error("the lock's store is unreachable")]
    Unreachable,
}

impl ElectionConfig {
    /// client-go's checks: lease duration > renew deadline > jitter * retry period.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseNotLongerThanRenewDeadline);
        }
        if self.renew_deadline.as_secs_f64() <= JITTER * self.retry_period.as_secs_f64() {
            return Err(ConfigError::RenewDeadlineTooShort);
        }
        if self.retry_period.is_zero() {
            return Err(ConfigError::NoRetryPeriod);
        }
        if self.identity.is_empty() {
            return Err(ConfigError::NoIdentity);
        }
        Ok(())
    }
}

/// This process' identity in elections and StorageState reports: `<hostname>_<random>`, as kube-controller-manager
/// makes it (a restarted process is a new candidate and a new reporter).
pub fn identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}_{}", &suffix[..12])
}

/// A lock that at most one holder holds at a time.
#[async_trait::async_trait]
pub trait LeaderLock: Send {
    /// One attempt to acquire the lock, or to renew it when we hold it. Ok(true): we hold it now (and, as of the
    /// start of this call, for the lease duration); Ok(false): someone else does.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, LockError>;
    /// Gives the lock up so that another candidate takes over at its next attempt (graceful shutdown).
    async fn release(&mut self) -> Result<(), LockError>;
    /// The current holder as last observed (for logs).
    fn holder(&self) -> Option<String>;
    /// What the lock is, for logs: `lease migration-apiserver/migration-apiserver`, `etcd key /registry/...`.
    fn describe(&self) -> String;
}

/// The outcome of one attempt of the leader, for [`LeaderState::after_renewal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    Held,
    /// Another holder has the lock (or ours is gone).
    Lost,
    /// The attempt failed (error or timeout): nothing is known.
    Failed,
}

/// The leader's bookkeeping: when it last renewed successfully. Kept apart from the I/O so that the rule that
/// matters (stop leading once the renew deadline passed) is tested without clocks.
#[derive(Clone, Copy, Debug)]
pub struct LeaderState {
    /// Start of the last successful attempt: the lease is valid until at least this + lease duration.
    pub renewed_at: Instant,
}

impl LeaderState {
    pub fn new(acquired_at: Instant) -> Self {
        LeaderState { renewed_at: acquired_at }
    }

    /// The deadline for the next successful renewal.
    pub fn deadline(&self, renew_deadline: Duration) -> Instant {
        self.renewed_at + renew_deadline
    }

    /// After an attempt that started at `started` and ended at `now`: still leading?
    pub fn after_renewal(
        &mut self,
        attempt: Attempt,
        started: Instant,
        now: Instant,
        renew_deadline: Duration,
    ) -> bool {
        match attempt {
            Attempt::Held => {
                self.renewed_at = self.renewed_at.max(started);
                true
            }
            Attempt::Lost => false,
            Attempt::Failed => now < self.deadline(renew_deadline),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabel {
    pub name: String,
}

/// `leader_election_master_status{name}`: 1 while this process leads, as client-go's leader election metric (name
/// and HELP from k8s.io/component-base `metrics/prometheus/clientgo/leaderelection`, ALPHA).
pub struct ElectionMetrics {
    pub master_status: Family<NameLabel, Gauge>,
}

impl ElectionMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> std::sync::Arc<Self> {
        let m = ElectionMetrics { master_status: Family::default() };
        registry.register(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            m.master_status.clone(),
        );
        std::sync::Arc::new(m)
    }

    pub fn set(&self, name: &str, leading: bool) {
        self.master_status.get_or_create(&NameLabel { name: name.to_string() }).set(i64::from(leading));
    }
}

fn jittered(d: Duration) -> Duration {
    let f = 1.0 + (JITTER - 1.0) * (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
    d.mul_f64(f)
}

/// One attempt, bounded by `until` (a hung request counts as failed).
async fn attempt(lock: &mut dyn LeaderLock, until: Instant) -> Attempt {
    let budget = until.saturating_duration_since(Instant::now());
    match tokio::time::timeout(budget, lock.try_acquire_or_renew()).await {
        Ok(Ok(true)) => Attempt::Held,
        Ok(Ok(false)) => Attempt::Lost,
        Ok(Err(e)) => {
            tracing::warn!(lock = %lock.describe(), error = %e, "leader election: attempt failed");
            Attempt::Failed
        }
        Err(_) => {
            tracing::warn!(lock = %lock.describe(), "leader election: attempt timed out");
            Attempt::Failed
        }
    }
}

/// Runs the election until `shutdown` turns true, publishing leadership in `leading` (false first). On shutdown a
/// leader stops leading, then releases the lock so that another replica takes over without waiting for expiry.
pub async fn run(
    mut lock: Box<dyn LeaderLock>,
    config: ElectionConfig,
    leading: watch::Sender<bool>,
    metrics: std::sync::Arc<ElectionMetrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    metrics.set(&config.name, false);
    tracing::info!(lock = %lock.describe(), identity = %config.identity, lease_duration = ?config.lease_duration,
        renew_deadline = ?config.renew_deadline, retry_period = ?config.retry_period, "leader election: started");
    let mut last_holder: Option<String> = None;
    loop {
        // Candidate: try until we hold the lock.
        let acquired = loop {
            if *shutdown.borrow() {
                return;
            }
            let started = Instant::now();
            let got = attempt(lock.as_mut(), started + config.retry_period.max(Duration::from_secs(1))).await;
            if got == Attempt::Held {
                break started;
            }
            let holder = lock.holder();
            if holder != last_holder {
                if let Some(h) = &holder {
                    tracing::info!(lock = %lock.describe(), leader = %h, "leader election: new leader observed");
                }
                last_holder = holder;
            }
            tokio::select! {
                _ = tokio::time::sleep(jittered(config.retry_period)) => {}
                _ = shutdown.changed() => {}
            }
        };
        tracing::info!(lock = %lock.describe(), identity = %config.identity, "leader election: acquired the lock, leading");
        last_holder = Some(config.identity.clone());
        metrics.set(&config.name, true);
        let _ = leading.send(true);
        // Leader: renew every retry period; stop at once when the renew deadline passes without a renewal.
        let mut state = LeaderState::new(acquired);
        let stepped_down_for_shutdown = loop {
            tokio::select! {
                _ = tokio::time::sleep(config.retry_period) => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                break true;
            }
            let started = Instant::now();
            let deadline = state.deadline(config.renew_deadline);
            let outcome = tokio::select! {
                a = attempt(lock.as_mut(), deadline) => a,
                // The deadline can pass while an attempt hangs: stop leading right then.
                _ = tokio::time::sleep_until(deadline.into()) => Attempt::Failed,
            };
            if !state.after_renewal(outcome, started, Instant::now(), config.renew_deadline) {
                let why =
                    if outcome == Attempt::Lost { "the lock is held by another" } else { "renew deadline passed" };
                tracing::warn!(lock = %lock.describe(), identity = %config.identity, reason = why,
                    "leader election: lost the lock, scheduler stopped");
                break false;
            }
        };
        metrics.set(&config.name, false);
        let _ = leading.send(false);
        if stepped_down_for_shutdown {
            match lock.release().await {
                Ok(()) => tracing::info!(lock = %lock.describe(), "leader election: lock released"),
                Err(e) => tracing::warn!(lock = %lock.describe(), error = %e, "leader election: releasing the lock"),
            }
            return;
        }
    }
}

/// Starts the leader-only tasks (`start`) whenever `leading` turns true and aborts them as soon as it turns false.
pub async fn supervise(
    mut leading: watch::Receiver<bool>,
    mut start: impl FnMut() -> Vec<tokio::task::JoinHandle<()>> + Send,
) {
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    loop {
        let lead = *leading.borrow_and_update();
        if lead && tasks.is_empty() {
            tracing::info!("scheduler: leading, starting the trigger's decisions and the migrator");
            tasks = start();
        } else if !lead && !tasks.is_empty() {
            for t in tasks.drain(..) {
                t.abort();
            }
            tracing::info!("scheduler: not leading, the trigger's decisions and the migrator are stopped");
        }
        if leading.changed().await.is_err() {
            for t in tasks.drain(..) {
                t.abort();
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: u64, renew: u64, retry: u64) -> ElectionConfig {
        ElectionConfig {
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
            identity: "me".into(),
            name: "x".into(),
        }
    }

    #[test]
    fn timing_is_validated_like_client_go() {
        assert!(config(15, 10, 2).validate().is_ok());
        assert!(config(10, 10, 2).validate().unwrap_err().to_string().contains("lease-duration"));
        assert!(config(15, 2, 2).validate().unwrap_err().to_string().contains("renew-deadline"));
        let mut c = config(15, 10, 2);
        c.identity.clear();
        assert!(c.validate().is_err());
    }

    #[test]
    fn identity_is_host_and_a_random_suffix() {
        let (a, b) = (identity(), identity());
        assert_ne!(a, b);
        let (host, suffix) = a.rsplit_once('_').expect("separator");
        assert!(!host.is_empty() && suffix.len() == 12, "{a}");
    }

    #[test]
    fn a_leader_steps_down_when_the_renew_deadline_passes() {
        let t0 = Instant::now();
        let renew = Duration::from_secs(10);
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut st = LeaderState::new(t0);
        // Renewals every 2 s keep it leading; the deadline moves with the start of each successful attempt.
        assert!(st.after_renewal(Attempt::Held, s(2), s(3), renew));
        assert_eq!(st.deadline(renew), s(12));
        // Failures within the deadline are tolerated...
        assert!(st.after_renewal(Attempt::Failed, s(4), s(5), renew));
        assert!(st.after_renewal(Attempt::Failed, s(6), s(11), renew));
        // ... not once it passed (the lease of others expires at renewed_at + lease duration > deadline).
        assert!(!st.after_renewal(Attempt::Failed, s(8), s(12), renew));
        // A renewal that started before the last success does not move the deadline back.
        let mut st = LeaderState::new(s(5));
        assert!(st.after_renewal(Attempt::Held, s(4), s(6), renew));
        assert_eq!(st.deadline(renew), s(15));
        // Losing the lock to another holder ends leadership at once.
        assert!(!st.after_renewal(Attempt::Lost, s(6), s(7), renew));
    }

    /// A lock in memory shared by candidates, with a holder that can be made unreachable.
    #[derive(Clone, Default)]
    struct MemoryLock {
        holder: std::sync::Arc<std::sync::Mutex<Option<(String, Instant)>>>,
        me: String,
        down: std::sync::Arc<std::sync::atomic::AtomicBool>,
        ttl: Duration,
    }

    #[async_trait::async_trait]
    impl LeaderLock for MemoryLock {
        async fn try_acquire_or_renew(&mut self) -> Result<bool, LockError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(LockError::Unreachable);
            }
            let mut h = self.holder.lock().expect("lock");
            let now = Instant::now();
            match h.as_ref() {
                Some((who, until)) if *who != self.me && *until > now => Ok(false),
                _ => {
                    *h = Some((self.me.clone(), now + self.ttl));
                    Ok(true)
                }
            }
        }
        async fn release(&mut self) -> Result<(), LockError> {
            let mut h = self.holder.lock().expect("lock");
            if h.as_ref().is_some_and(|(w, _)| *w == self.me) {
                *h = None;
            }
            Ok(())
        }
        fn holder(&self) -> Option<String> {
            self.holder.lock().expect("lock").as_ref().map(|(w, _)| w.clone())
        }
        fn describe(&self) -> String {
            "memory".into()
        }
    }

    async fn wait_for(rx: &mut watch::Receiver<bool>, value: bool, within: Duration) -> Duration {
        let t = Instant::now();
        tokio::time::timeout(within, rx.wait_for(|v| *v == value)).await.expect("in time").expect("sender alive");
        t.elapsed()
    }

    /// The loop end to end with short timings: one leader at a time, an unreachable leader stops leading before
    /// its lease expires, the other takes over after expiry, and a graceful stop hands over at once.
    #[tokio::test]
    async fn election_loop_hands_over() {
        let shared = MemoryLock { ttl: Duration::from_millis(1500), ..Default::default() };
        let cfg = |id: &str| ElectionConfig {
            lease_duration: Duration::from_millis(1500),
            renew_deadline: Duration::from_millis(1000),
            retry_period: Duration::from_millis(100),
            identity: id.into(),
            name: "test".into(),
        };
        let metrics = ElectionMetrics::register(&mut prometheus_client::registry::Registry::default());
        let spawn = |id: &str| {
            let lock = MemoryLock { me: id.into(), down: Default::default(), ..shared.clone() };
            let down = lock.down.clone();
            let (tx, rx) = watch::channel(false);
            let (stop_tx, stop_rx) = watch::channel(false);
            let task = tokio::spawn(run(Box::new(lock), cfg(id), tx, metrics.clone(), stop_rx));
            (rx, down, stop_tx, task)
        };
        let (mut a, a_down, _a_stop, _a_task) = spawn("a");
        wait_for(&mut a, true, Duration::from_secs(5)).await;
        let (mut b, _b_down, b_stop, b_task) = spawn("b");
        // a stays leader while it renews.
        assert!(tokio::time::timeout(Duration::from_millis(600), b.wait_for(|v| *v)).await.is_err());
        // a cannot reach the lock: it stops within the renew deadline (1 s), b leads only after the lease (1.5 s).
        a_down.store(true, std::sync::atomic::Ordering::SeqCst);
        let stopped = wait_for(&mut a, false, Duration::from_secs(5)).await;
        assert!(!*b.borrow(), "b leads before a stopped");
        wait_for(&mut b, true, Duration::from_secs(5)).await;
        // Within the renew deadline of its last renewal (at most a retry period before it went down), with slack
        // for a loaded machine; never after the lease duration.
        assert!(stopped < Duration::from_millis(1500), "{stopped:?}");
        // b shuts down gracefully: it releases the lock and a (reachable again) takes over at its next attempt.
        a_down.store(false, std::sync::atomic::Ordering::SeqCst);
        b_stop.send(true).expect("stop");
        b_task.await.expect("b ends");
        assert!(!*b.borrow());
        let handover = wait_for(&mut a, true, Duration::from_secs(5)).await;
        // Without waiting for the lease to expire (1.5 s): at a's next attempt.
        assert!(handover < Duration::from_millis(1200), "{handover:?}");
    }
}

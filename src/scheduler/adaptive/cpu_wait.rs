//! How long work that arrives waits before this process runs it: what a reader's request waits before the server
//! even reads it, which the HTTP layer cannot time.
//!
//! Standalone, the migration's no-op writes run in this process, on the cores and the runtime workers that serve the
//! other clients. When it keeps both cores busy, a worker thread woken by a client's request waits in the kernel's
//! run queue for up to a time slice (about 4 ms here, against a GET of 0.3 ms), and a task woken for it waits behind
//! the migration's on a busy worker: the readers' p99 grows by that while their p50 and the handler times the server
//! measures hardly move (BENCHMARKS.md, "Key rotation's GET tail"). So a thread of its own sleeps 1 ms at a time, as
//! cyclictest does, and on waking hands a task to the runtime; the lateness counted is from when the thread was due
//! to wake to when the runtime ran that task (the kernel's wait and the runtime's queue). The adaptive rate reads the
//! 99th percentile. It costs one wake-up and one task a millisecond (a few µs of CPU) while a migration runs, and
//! parks otherwise.

use crate::server::latency::{Counts, LatencyHistogram};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

const PERIOD: Duration = Duration::from_millis(1);
/// While parked, how often the thread looks whether it is needed again or its owner is gone.
const PARKED: Duration = Duration::from_millis(100);

/// The measurement; the thread ends when this is dropped.
#[derive(Debug, Default)]
pub struct CpuWait {
    latency: LatencyHistogram,
    active: AtomicBool,
    /// Wake-ups handed to the runtime; the histogram counts each once its task has run.
    handed: AtomicU64,
}

impl CpuWait {
    /// Starts the measuring thread, parked until [`CpuWait::set_active`], for the runtime it is called on.
    pub fn start() -> std::io::Result<Arc<CpuWait>> {
        let probe = Arc::new(CpuWait::default());
        let weak = Arc::downgrade(&probe);
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new().name("cpu-wait".into()).spawn(move || measure(weak, runtime))?;
        Ok(probe)
    }

    /// Whether to measure (a migration is running).
    pub fn set_active(&self, on: bool) {
        self.active.store(on, Ordering::Relaxed);
    }

    /// Everything counted so far.
    pub fn snapshot(&self) -> Counts {
        self.latency.snapshot()
    }
}

fn measure(probe: Weak<CpuWait>, runtime: tokio::runtime::Handle) {
    loop {
        let Some(p) = probe.upgrade() else { return };
        if !p.active.load(Ordering::Relaxed) {
            drop(p);
            std::thread::park_timeout(PARKED);
            continue;
        }
        let due = Instant::now() + PERIOD;
        std::thread::sleep(PERIOD);
        p.handed.fetch_add(1, Ordering::Relaxed);
        runtime.spawn(async move { p.latency.observe(due.elapsed()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_wake_ups_only_while_active_and_stops_with_its_owner() {
        let probe = CpuWait::start().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        probe.set_active(true);
        while probe.snapshot().count() < 20 {
            assert!(Instant::now() < deadline, "no wake-ups counted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        probe.set_active(false);
        // At most the one wake-up the thread was in when it was switched off; the tasks already handed to the
        // runtime may still be counting, so the thread's own count is what is compared.
        let parked = probe.handed.load(Ordering::Relaxed) + 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(probe.handed.load(Ordering::Relaxed) <= parked);
        let weak = Arc::downgrade(&probe);
        drop(probe);
        assert!(weak.upgrade().is_none());
    }
}

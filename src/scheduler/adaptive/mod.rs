//! The migrator's adaptive rate: how many requests a second it sends to its target, all migrations together, found
//! from the target's feedback instead of a number set in advance (`--migration-qps` is only a ceiling).
//!
//! **The choice.** Three families were read: TCP's AIMD (a loss halves the window, each round trip without one adds
//! a little), Netflix's concurrency-limits (Vegas compares each RTT with the least one seen; Gradient2 with a long
//! average of its own RTT) and Envoy's adaptive concurrency filter (a gradient `minRTT * (1 + buffer) / sampleRTT`,
//! where minRTT is *measured* in a short window every minute or so during which the concurrency drops to a
//! minimum). AIMD alone reacts only to losses (here 429s and 5xx): on a server that never refuses, such as this one
//! standalone, it would raise the rate until both cores are busy and the other clients wait, which is what
//! `--migration-qps 0` already does. Vegas and Gradient2 need the latency *without* the migration's load: Vegas
//! takes the least RTT ever seen, Gradient2 a long average of its own RTT, which climbs with a long migration until
//! the load it causes is the new normal. Envoy's way measures that latency instead, which is what we need for the
//! other clients: we cannot tell how fast they would be served without the migration unless we stop it now and then.
//! So: **Envoy's gradient with its periodic minimum-load window, applied to a rate, plus TCP's reaction to explicit
//! congestion signals**:
//!
//! - Every 30 s (and when the migration starts, or other clients appear) the rate drops to the floor for 1.5 s; the
//!   last second gives the baselines: the p50 of the migration's own requests and, standalone, the p90 of the
//!   server's other clients ([`crate::server::latency`], counted by the HTTP layer), how many of their requests it
//!   served, and the p99 of the wait for a CPU ([`cpu_wait`]).
//! - Every 500 ms: a 429 (or any answer with Retry-After) halves the rate and holds every request until the
//!   Retry-After has passed, so that the requests already queued do not all collect their own 429: no storm.
//!   5xx, timeouts and transport errors cut it by 30%. Else the latencies are compared with their baselines: own
//!   p50 above 2x (the target queues our requests), other clients' p90 above 1.25x (they pay for the migration),
//!   cut in proportion (the gradient, at most halving). Standalone two more signals cut the same way, because
//!   the cost of a migration in this process is CPU, and a request waiting for a CPU is not yet a request the HTTP
//!   layer can time: the other clients served below 0.9x of the probe's requests per interval (clients that send as
//!   fast as they are answered lose throughput, not latency), and the p99 of the wait for a CPU above 1.2x + 0.2 ms
//!   (readers at a fixed rate lose their tail: a worker woken for them waits up to a time slice when both cores
//!   are busy).
//! - An interval without any of that that used its rate raises it: doubling until the first cut (TCP's slow start),
//!   then by 5% more with each clean interval in a row, so a recovered target is found again within seconds.
//! - Never below the floor (`--migration-min-qps`), so a migration ends even on a saturated server, nor above the
//!   ceiling.
//!
//! Controlling the rate rather than the concurrency keeps `--migration-qps` a rate and one token bucket for every
//! request (LISTs, writes, retries); each migration's writes in flight stay bounded by the pipeline.

mod control;
mod cpu_wait;

pub use control::{Baselines, Controller, Cut, Sample, Settings, Step};
use cpu_wait::CpuWait;

use super::metrics::SchedulerMetrics;
use super::SchedulerConfig;
use crate::ratelimit::RateLimiter;
use crate::server::latency::{Counts, LatencyHistogram};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The rate of the migrator's requests to its target: adaptive, or fixed at `--migration-qps` with
/// `--migration-adaptive=false`.
pub struct Pace {
    inner: Arc<Inner>,
}

struct Inner {
    limiter: RateLimiter,
    adaptive: bool,
    /// Counted since the last step.
    granted: AtomicU64,
    throttled: AtomicU64,
    errors: AtomicU64,
    /// The longest Retry-After since the last step, in ms plus one (0: none).
    retry_after: AtomicU64,
    own: LatencyHistogram,
}

impl Pace {
    /// The pace of `config`, its steps taken by a task of its own that ends with it.
    pub fn start(config: &SchedulerConfig, metrics: Arc<SchedulerMetrics>) -> Pace {
        let settings = Settings::new(config.min_qps, config.qps);
        let first = if config.adaptive { settings.floor } else { config.qps };
        let inner = Arc::new(Inner {
            limiter: RateLimiter::new(first, config.burst),
            adaptive: config.adaptive,
            granted: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            retry_after: AtomicU64::new(0),
            own: LatencyHistogram::default(),
        });
        metrics.observe_rate(first);
        metrics.declare_rate_cuts(Cut::ALL.map(Cut::label));
        if config.adaptive {
            let controller = Controller::new(settings, Instant::now());
            let standalone = config.clients_latency.clone().map(|clients| Standalone {
                clients,
                cpu_wait: CpuWait::start()
                    .inspect_err(|e| tracing::warn!(error = %e, "cannot measure the wait for a CPU: not judged"))
                    .ok(),
            });
            tokio::spawn(steps(Arc::downgrade(&inner), controller, standalone, metrics));
        }
        Pace { inner }
    }

    /// Waits for the rate to let one more request through.
    pub async fn acquire(&self) {
        self.inner.limiter.acquire().await;
        self.inner.granted.fetch_add(1, Ordering::Relaxed);
    }

    /// The target answered with `code` after `elapsed`; `retry_after` when it asked for a pause.
    pub fn answered(&self, code: u16, elapsed: Duration, retry_after: Option<Duration>) {
        let i = &self.inner;
        if let Some(ra) = retry_after {
            let ms = u64::try_from(ra.as_millis()).unwrap_or(u64::MAX - 1);
            i.retry_after.fetch_max(ms + 1, Ordering::Relaxed);
            // At once, not at the next step: the requests queued behind this one must not collect a 429 each.
            if i.adaptive {
                i.limiter.pause_until(Instant::now() + ra.min(control::MAX_PAUSE));
            }
        }
        match code {
            429 => drop(i.throttled.fetch_add(1, Ordering::Relaxed)),
            500..=599 => drop(i.errors.fetch_add(1, Ordering::Relaxed)),
            _ => i.own.observe(elapsed),
        }
    }

    /// A request got no answer (timeout, connection error).
    pub fn failed(&self) {
        self.inner.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The requests a second allowed now; None when unlimited.
    pub fn rate(&self) -> Option<f64> {
        Some(self.inner.limiter.qps()).filter(|q| *q > 0.0)
    }

    pub fn adaptive(&self) -> bool {
        self.inner.adaptive
    }
}

/// Standalone (the target is this server): how its other clients are served.
struct Standalone {
    clients: Arc<LatencyHistogram>,
    /// None when its thread could not start.
    cpu_wait: Option<Arc<CpuWait>>,
}

/// The histograms' totals at the previous step; an interval's counts are the differences.
#[derive(Default)]
struct Totals {
    own: Counts,
    clients: Option<Counts>,
    cpu_wait: Option<Counts>,
}

impl Inner {
    /// What the interval's requests saw.
    fn sample(&self, standalone: Option<&Standalone>, previous: &mut Totals) -> Sample {
        let now = Totals {
            own: self.own.snapshot(),
            clients: standalone.map(|s| s.clients.snapshot()),
            cpu_wait: standalone.and_then(|s| s.cpu_wait.as_ref()).map(|c| c.snapshot()),
        };
        let since = |now: &Option<Counts>, then: &Option<Counts>| {
            now.as_ref().map(|n| then.as_ref().map_or_else(Counts::default, |t| n.since(t)))
        };
        let retry_after = self.retry_after.swap(0, Ordering::Relaxed);
        let sample = Sample {
            granted: self.granted.swap(0, Ordering::Relaxed),
            throttled: self.throttled.swap(0, Ordering::Relaxed),
            retry_after: retry_after.checked_sub(1).map(Duration::from_millis),
            errors: self.errors.swap(0, Ordering::Relaxed),
            own: now.own.since(&previous.own),
            clients: since(&now.clients, &previous.clients),
            cpu_wait: since(&now.cpu_wait, &previous.cpu_wait),
        };
        *previous = now;
        sample
    }
}

/// A step every interval until the pace is dropped (the migrator stopped).
async fn steps(
    inner: Weak<Inner>,
    mut controller: Controller,
    standalone: Option<Standalone>,
    metrics: Arc<SchedulerMetrics>,
) {
    let mut tick = tokio::time::interval(controller.settings().interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut previous = Totals::default();
    if let Some(inner) = inner.upgrade() {
        inner.sample(standalone.as_ref(), &mut previous);
    }
    let cpu_wait = standalone.as_ref().and_then(|s| s.cpu_wait.clone());
    loop {
        if let Some(c) = &cpu_wait {
            c.set_active(controller.active());
        }
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let sample = inner.sample(standalone.as_ref(), &mut previous);
        let now = Instant::now();
        let step = controller.step(now, &sample);
        inner.limiter.set_qps_at(step.rate, now);
        if let Some(pause) = step.pause {
            inner.limiter.pause_until(now + pause);
        }
        metrics.observe_rate(step.rate);
        if let Some(cut) = step.cut {
            metrics.observe_rate_cut(cut.label());
            tracing::debug!(rate = step.rate, reason = cut.label(), pause = ?step.pause, throttled = sample.throttled,
                errors = sample.errors, "migration rate cut");
        }
        tracing::trace!(rate = step.rate, granted = sample.granted, own_p50 = ?sample.own.quantile(0.5),
            clients = sample.clients.as_ref().map(Counts::count), clients_p90 = ?sample.clients.as_ref().and_then(|c| c.quantile(0.9)),
            cpu_wait_p99 = ?sample.cpu_wait.as_ref().and_then(|c| c.quantile(0.99)), baselines = ?controller.baselines(),
            "migration rate step");
    }
}

#[cfg(test)]
mod tests;

//! The adaptive rate's arithmetic, without clocks or I/O: one [`Controller::step`] per interval, from what the
//! interval's requests saw to the next rate. See [`super`] for why it is built this way.

use crate::server::latency::Counts;
use std::time::{Duration, Instant};

/// The controller's constants and bounds.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The rate never goes below this: a migration finishes even on a saturated target.
    pub floor: f64,
    /// Nor above this (`f64::INFINITY`: no ceiling).
    pub ceiling: f64,
    /// One step per interval.
    pub interval: Duration,
    /// How often the rate drops to the floor for a probe, to measure the latencies without the migration's load.
    pub probe_every: Duration,
    /// How long a probe lasts; its first [`Settings::settle`] is not measured (requests sent at the old rate are
    /// still being answered).
    pub probe_for: Duration,
    pub settle: Duration,
}

impl Settings {
    pub fn new(floor: f64, ceiling: f64) -> Settings {
        let ceiling = if ceiling > 0.0 && ceiling.is_finite() { ceiling } else { f64::INFINITY };
        Settings {
            floor: floor.max(1.0).min(ceiling),
            ceiling,
            interval: Duration::from_millis(500),
            probe_every: Duration::from_secs(30),
            probe_for: Duration::from_millis(1500),
            settle: Duration::from_millis(500),
        }
    }
}

/// Latency may rise this much over its probed baseline before the rate backs off: the migration's own requests
/// (the target is busier, but its queue is short) ...
const OWN_TOLERANCE: f64 = 2.0;
/// ... and the other clients' of this server standalone: at most a quarter slower than without the migration
/// (with 8 clients saturating the server, their throughput is then at least 0.8 of what it was).
const CLIENTS_TOLERANCE: f64 = 1.25;
/// Scheduling jitter that no rate change helps against: a 100 µs GET that takes 150 µs once is no signal.
const OWN_SLACK: Duration = Duration::from_micros(500);
const CLIENTS_SLACK: Duration = Duration::from_micros(200);
/// The percentiles read: the migration's median request (its writes, mostly), the other clients' 90th (their tail,
/// with enough requests in half a second to be more than noise).
const OWN_QUANTILE: f64 = 0.5;
const CLIENTS_QUANTILE: f64 = 0.9;
/// Fewer requests than these in an interval say nothing about latency. The other clients' bound is higher: a
/// watcher polling its progress and a Prometheus scrape are not a load whose tail one can read, and a migration
/// slowed to keep theirs would be slowed for nothing.
const MIN_OWN: u64 = 8;
const MIN_CLIENTS: u64 = 100;
/// The wait for a CPU ([`super::cpu_wait`]) is read at its 99th percentile, the readers' tail that a busy machine
/// stretches first: up to 1.2 times its probed baseline plus 0.2 ms. The baseline is itself about a millisecond on
/// a VM (waking an idle virtual CPU is slow), so a looser bound let readers' p99 reach 2.1x of idle (BENCHMARKS.md,
/// "Adaptive migration rate"). Below 100 wake-ups an interval it says nothing.
const CPU_WAIT_QUANTILE: f64 = 0.99;
const CPU_WAIT_TOLERANCE: f64 = 1.2;
const CPU_WAIT_SLACK: Duration = Duration::from_micros(200);
const MIN_CPU_WAIT: u64 = 100;
/// The other clients' requests served per interval may fall to this share of the probe's before the rate backs
/// off: clients that send as fast as they are answered get fewer answers when the migration takes their CPU, and
/// their latency as the server measures it hardly moves (the wait is before the server reads the request). Judged
/// only when they sent at least [`MIN_SERVED`] requests an interval during the probe.
const SERVED_TOLERANCE: f64 = 0.9;
const MIN_SERVED: f64 = 100.0;
/// Below this share of the probe's, the other clients may have been starved or may have gone: the rate is cut and
/// a probe tells which (gone clients leave a baseline too small to judge).
const SERVED_UNSURE: f64 = 0.5;
/// The largest cut for latency in one interval, and the cuts for errors and for throttling (TCP halves its window
/// on a loss).
const MIN_GRADIENT: f64 = 0.5;
const ERROR_CUT: f64 = 0.7;
const THROTTLE_CUT: f64 = 0.5;
/// A 429 without Retry-After pauses this long; a longer Retry-After is capped (the request retries honour it in
/// full, but the whole migrator does not stop for a server that says an hour).
const DEFAULT_PAUSE: Duration = Duration::from_secs(1);
pub(super) const MAX_PAUSE: Duration = Duration::from_secs(30);
/// After this many intervals without a request, the next migration starts over (floor, slow start, a new probe):
/// what the target could take minutes ago says little about now.
const IDLE_RESET: u32 = 20;
/// Each clean interval in a row adds this much to the growth factor, up to [`MAX_GROWTH`]: careful just after a
/// cut, quick to find a recovered target's capacity again.
const GROWTH_STEP: f64 = 0.05;
const MAX_GROWTH: f64 = 2.0;

/// What one interval's requests saw.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Requests let through.
    pub granted: u64,
    /// 429s, and the longest Retry-After among them (and among other retryable answers that carried one).
    pub throttled: u64,
    pub retry_after: Option<Duration>,
    /// 5xx answers, timeouts and transport errors.
    pub errors: u64,
    /// The latencies of the migration's answered requests.
    pub own: Counts,
    /// The other clients' latencies, when the target is this server (their count: the requests served).
    pub clients: Option<Counts>,
    /// How long this process' threads waited for a CPU when they woke, when the target is this server.
    pub cpu_wait: Option<Counts>,
}

/// Why the rate went down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    Throttled,
    Errors,
    Latency,
    ClientsLatency,
    ClientsThroughput,
    CpuWait,
}

impl Cut {
    pub const ALL: [Cut; 6] =
        [Cut::Throttled, Cut::Errors, Cut::Latency, Cut::ClientsLatency, Cut::ClientsThroughput, Cut::CpuWait];

    pub fn label(self) -> &'static str {
        match self {
            Cut::Throttled => "throttled",
            Cut::Errors => "errors",
            Cut::Latency => "latency",
            Cut::ClientsLatency => "clients_latency",
            Cut::ClientsThroughput => "clients_throughput",
            Cut::CpuWait => "cpu_wait",
        }
    }
}

/// What the last probe measured, the baselines of the intervals until the next.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Baselines {
    /// The migration's own requests' p50.
    pub own: Option<Duration>,
    /// Standalone: the other clients' p90, the requests of theirs served per interval, the p99 of the wait for a CPU.
    pub clients: Option<Duration>,
    pub served: Option<f64>,
    pub cpu_wait: Option<Duration>,
}

/// What a probe's settled intervals saw, summed.
#[derive(Clone, Debug, Default)]
struct Probed {
    own: Counts,
    clients: Option<Counts>,
    cpu_wait: Option<Counts>,
    intervals: u32,
}

impl Probed {
    fn add(&mut self, s: &Sample) {
        fn sum(total: &mut Option<Counts>, more: &Option<Counts>) {
            if let Some(c) = more {
                *total = Some(total.as_ref().map_or_else(|| c.clone(), |t| t.add(c)));
            }
        }
        self.own = self.own.add(&s.own);
        sum(&mut self.clients, &s.clients);
        sum(&mut self.cpu_wait, &s.cpu_wait);
        self.intervals += 1;
    }

    /// The baselines it gives; one without enough requests keeps the previous probe's.
    fn baselines(self, previous: &Baselines) -> Baselines {
        let quantile =
            |c: Option<&Counts>, min: u64, q: f64| c.filter(|c| c.count() >= min).and_then(|c| c.quantile(q));
        let intervals = f64::from(self.intervals.max(1));
        Baselines {
            own: quantile(Some(&self.own), MIN_OWN, OWN_QUANTILE).or(previous.own),
            clients: quantile(self.clients.as_ref(), MIN_CLIENTS, CLIENTS_QUANTILE).or(previous.clients),
            served: self.clients.as_ref().map(|c| c.count() as f64 / intervals).or(previous.served),
            cpu_wait: quantile(self.cpu_wait.as_ref(), MIN_CPU_WAIT, CPU_WAIT_QUANTILE).or(previous.cpu_wait),
        }
    }
}

/// What to do after a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub rate: f64,
    /// Send nothing for this long (the target's Retry-After).
    pub pause: Option<Duration>,
    pub cut: Option<Cut>,
}

#[derive(Clone, Debug)]
enum Phase {
    /// At the floor since `since`; back to `resume` afterwards. What the settled part saw is gathered in
    /// [`Controller::probed`].
    Probing {
        since: Instant,
        resume: f64,
    },
    Running {
        next_probe: Instant,
    },
}

#[derive(Clone, Debug)]
pub struct Controller {
    settings: Settings,
    rate: f64,
    /// Doubling each interval until the first sign of congestion.
    slow_start: bool,
    /// Clean intervals in a row (growth accelerates with them).
    clean: u32,
    idle: u32,
    phase: Phase,
    /// What the current probe's settled part saw.
    probed: Probed,
    base: Baselines,
    /// Probe at the next step, whenever the last one was.
    probe_soon: bool,
}

impl Controller {
    /// Starts with a probe at the floor.
    pub fn new(settings: Settings, now: Instant) -> Controller {
        let rate = settings.floor;
        Controller {
            phase: Phase::Probing { since: now, resume: rate },
            probed: Default::default(),
            settings,
            rate,
            slow_start: true,
            clean: 0,
            idle: 0,
            base: Baselines::default(),
            probe_soon: false,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn baselines(&self) -> &Baselines {
        &self.base
    }

    /// Whether the migration sent requests lately (else the rate starts over with the next one).
    pub fn active(&self) -> bool {
        self.idle < IDLE_RESET
    }

    /// One interval's feedback, at its end `now`: the rate for the next interval.
    pub fn step(&mut self, now: Instant, s: &Sample) -> Step {
        self.idle = if s.granted == 0 { self.idle.saturating_add(1) } else { 0 };
        if self.idle >= IDLE_RESET && matches!(self.phase, Phase::Running { .. }) {
            self.rate = self.settings.floor;
            self.slow_start = true;
            self.base = Baselines::default();
        }
        let (cut, pause) = self.congestion(s);
        if let Phase::Probing { since, resume } = &mut self.phase {
            if now.duration_since(*since) > self.settings.settle {
                self.probed.add(s);
            }
            if cut.is_some() {
                *resume = self.rate.max(self.settings.floor);
            }
            self.rate = self.settings.floor;
            if now.duration_since(*since) + self.settings.interval / 2 >= self.settings.probe_for {
                let resume = *resume;
                self.base = std::mem::take(&mut self.probed).baselines(&self.base);
                self.rate = resume;
                self.phase = Phase::Running { next_probe: now + self.settings.probe_every };
            }
            return Step { rate: self.rate, pause, cut };
        }
        let cut = cut.or_else(|| self.latency_cut(s));
        if cut.is_none() {
            self.grow(s);
        }
        self.rate = self.rate.clamp(self.settings.floor, self.settings.ceiling);
        if self.needs_probe(now, s) {
            self.phase = Phase::Probing { since: now, resume: self.rate };
            self.probed = Default::default();
            self.rate = self.settings.floor;
        }
        Step { rate: self.rate, pause, cut }
    }

    /// Throttling (429, Retry-After) halves the rate and pauses; errors cut it by less. One cut per interval, as
    /// TCP cuts once per round trip however many packets of it were lost.
    fn congestion(&mut self, s: &Sample) -> (Option<Cut>, Option<Duration>) {
        let (cut, factor) = match (s.throttled > 0 || s.retry_after.is_some(), s.errors > 0) {
            (true, _) => (Cut::Throttled, THROTTLE_CUT),
            (false, true) => (Cut::Errors, ERROR_CUT),
            (false, false) => return (None, None),
        };
        self.slow_start = false;
        self.clean = 0;
        self.rate = (self.rate * factor).max(self.settings.floor);
        let pause = (cut == Cut::Throttled).then(|| s.retry_after.unwrap_or(DEFAULT_PAUSE).min(MAX_PAUSE));
        (Some(cut), pause)
    }

    /// Latency above its tolerance over the probed baseline, or the other clients served less than at the probe,
    /// cuts the rate in proportion (Envoy's gradient, `baseline * tolerance / sample`, at most halving); the worst
    /// signal decides.
    fn latency_cut(&mut self, s: &Sample) -> Option<Cut> {
        let b = self.base.clone();
        let own = gradient(b.own, &s.own, OWN_QUANTILE, MIN_OWN, OWN_TOLERANCE, OWN_SLACK).map(|g| (g, Cut::Latency));
        let clients = s.clients.as_ref().and_then(|c| {
            gradient(b.clients, c, CLIENTS_QUANTILE, MIN_CLIENTS, CLIENTS_TOLERANCE, CLIENTS_SLACK)
                .map(|g| (g, Cut::ClientsLatency))
        });
        let served = s.clients.as_ref().zip(b.served.filter(|base| *base >= MIN_SERVED)).map(|(c, base)| {
            let share = c.count() as f64 / base;
            self.probe_soon |= share < SERVED_UNSURE;
            (share / SERVED_TOLERANCE, Cut::ClientsThroughput)
        });
        // Only when there are other clients to keep it for: alone, the migration may keep both cores busy.
        let others = s.clients.as_ref().is_some_and(|c| c.count() >= MIN_CLIENTS);
        let cpu_wait = s.cpu_wait.as_ref().filter(|_| others).and_then(|c| {
            gradient(b.cpu_wait, c, CPU_WAIT_QUANTILE, MIN_CPU_WAIT, CPU_WAIT_TOLERANCE, CPU_WAIT_SLACK)
                .map(|g| (g, Cut::CpuWait))
        });
        let (g, cut) = [own, clients, served, cpu_wait].into_iter().flatten().min_by(|a, b| a.0.total_cmp(&b.0))?;
        if g >= 1.0 {
            return None;
        }
        self.slow_start = false;
        self.clean = 0;
        self.rate *= g.max(MIN_GRADIENT);
        Some(cut)
    }

    /// A clean interval that used its rate raises it: doubling in slow start, else by a factor that grows with the
    /// clean intervals in a row. A rate the migration does not use (it waits for its LISTs, or for nothing) is not
    /// raised: it would say nothing about the target.
    fn grow(&mut self, s: &Sample) {
        let used = s.granted as f64 >= 0.5 * self.rate * self.settings.interval.as_secs_f64();
        if !used {
            return;
        }
        self.clean = self.clean.saturating_add(1);
        let factor = match self.slow_start {
            true => 2.0,
            false => (1.0 + GROWTH_STEP * f64::from(self.clean)).min(MAX_GROWTH),
        };
        self.rate *= factor;
    }

    /// Time for the periodic probe; or at once when a baseline is missing and there is something to measure: the
    /// migration's first requests, other clients that came while it ran.
    fn needs_probe(&mut self, now: Instant, s: &Sample) -> bool {
        let Phase::Running { next_probe } = self.phase else { return false };
        if std::mem::take(&mut self.probe_soon) {
            return true;
        }
        let b = &self.base;
        let own_unknown = b.own.is_none() && s.own.count() >= MIN_OWN;
        let clients_unknown = b.clients.is_none() && s.clients.as_ref().is_some_and(|c| c.count() >= MIN_CLIENTS);
        let others = s.clients.as_ref().is_some_and(|c| c.count() >= MIN_CLIENTS);
        let cpu_wait_unknown =
            others && b.cpu_wait.is_none() && s.cpu_wait.as_ref().is_some_and(|c| c.count() >= MIN_CPU_WAIT);
        now >= next_probe || own_unknown || clients_unknown || cpu_wait_unknown
    }
}

/// `tolerance * baseline + slack` over the sample's quantile (below 1: too slow); None without a baseline or
/// enough requests.
fn gradient(base: Option<Duration>, c: &Counts, q: f64, min: u64, tolerance: f64, slack: Duration) -> Option<f64> {
    let base = base?;
    if c.count() < min {
        return None;
    }
    let sample = c.quantile(q)?.as_secs_f64();
    Some((tolerance * base.as_secs_f64() + slack.as_secs_f64()) / sample.max(1e-9))
}

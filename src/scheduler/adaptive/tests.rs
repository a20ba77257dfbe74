//! The controller's arithmetic, step by step on a simulated clock.

use super::*;

fn counts(n: u64, each: Duration) -> Counts {
    let h = LatencyHistogram::default();
    for _ in 0..n {
        h.observe(each);
    }
    h.snapshot()
}

/// A controller (floor 40, `ceiling`) past its first probe, which measured `own` for its requests and `clients`
/// for the other clients'; and the clock.
fn probed(ceiling: f64, own: Duration, clients: Option<Duration>) -> (Controller, Instant) {
    let mut t = Instant::now();
    let mut c = Controller::new(Settings::new(40.0, ceiling), t);
    for _ in 0..3 {
        t += c.settings().interval;
        let s =
            Sample { granted: 20, own: counts(20, own), clients: clients.map(|d| counts(500, d)), ..Sample::default() };
        assert_eq!(c.step(t, &s).rate, 40.0);
    }
    assert_eq!(c.baselines().own.map(|b| b >= own), Some(true));
    assert_eq!(c.baselines().clients.is_some(), clients.is_some());
    (c, t)
}

/// An interval that used its whole rate, at these latencies.
fn busy(c: &Controller, own: Duration, clients: Option<Duration>) -> Sample {
    let granted = (c.rate() * c.settings().interval.as_secs_f64()) as u64;
    Sample { granted, own: counts(granted.max(8), own), clients: clients.map(|d| counts(500, d)), ..Sample::default() }
}

fn run(c: &mut Controller, t: &mut Instant, s: &Sample) -> Step {
    *t += c.settings().interval;
    c.step(*t, s)
}

const OWN: Duration = Duration::from_millis(2);

#[test]
fn slow_start_doubles_up_to_the_ceiling() {
    let (mut c, mut t) = probed(1000.0, OWN, None);
    let mut rates = Vec::new();
    for _ in 0..6 {
        let s = busy(&c, OWN, None);
        rates.push(run(&mut c, &mut t, &s).rate);
    }
    assert_eq!(rates, [80.0, 160.0, 320.0, 640.0, 1000.0, 1000.0]);
}

#[test]
fn an_unused_rate_is_not_raised() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    // The migration waits for a LIST: 3 requests in an interval at 40/s.
    let s = Sample { granted: 3, own: counts(3, OWN), ..Sample::default() };
    assert_eq!(run(&mut c, &mut t, &s).rate, 40.0);
}

#[test]
fn a_429_halves_the_rate_and_pauses_for_its_retry_after() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    for _ in 0..5 {
        let s = busy(&c, OWN, None);
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), 1280.0);
    let s = Sample { throttled: 7, retry_after: Some(Duration::from_secs(3)), ..busy(&c, OWN, None) };
    let step = run(&mut c, &mut t, &s);
    assert_eq!(step, Step { rate: 640.0, pause: Some(Duration::from_secs(3)), cut: Some(Cut::Throttled) });
    // Without Retry-After: a second; an absurd one is capped.
    let s = Sample { throttled: 1, ..busy(&c, OWN, None) };
    assert_eq!(run(&mut c, &mut t, &s).pause, Some(Duration::from_secs(1)));
    let s = Sample { throttled: 1, retry_after: Some(Duration::from_secs(3600)), ..busy(&c, OWN, None) };
    assert_eq!(run(&mut c, &mut t, &s).pause, Some(Duration::from_secs(30)));
    // Slow start is over: the next clean interval grows by 5%, the one after by 10%.
    let s = busy(&c, OWN, None);
    assert_eq!(run(&mut c, &mut t, &s).rate, 160.0 * 1.05);
    let s = busy(&c, OWN, None);
    assert!((run(&mut c, &mut t, &s).rate - 160.0 * 1.05 * 1.10).abs() < 1e-9);
}

#[test]
fn errors_cut_by_less_and_never_below_the_floor() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    let s = busy(&c, OWN, None);
    run(&mut c, &mut t, &s);
    let s = Sample { errors: 2, ..busy(&c, OWN, None) };
    let step = run(&mut c, &mut t, &s);
    assert_eq!((step.rate, step.pause, step.cut), (56.0, None, Some(Cut::Errors)));
    for _ in 0..20 {
        let s = Sample { errors: 5, throttled: 5, ..busy(&c, OWN, None) };
        assert_eq!(run(&mut c, &mut t, &s).rate.max(40.0), 40.0);
    }
}

#[test]
fn rising_own_latency_cuts_in_proportion() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    for _ in 0..4 {
        let s = busy(&c, OWN, None);
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), 640.0);
    // 2 ms probed: up to 2 x 2 ms + 0.5 ms is fine (read as the bound of its bucket, up to 19% high).
    let s = busy(&c, Duration::from_micros(3800), None);
    assert_eq!(run(&mut c, &mut t, &s).cut, None);
    // 6 ms: cut by about 4.5 / 6.
    let rate = c.rate();
    let s = busy(&c, Duration::from_millis(6), None);
    let step = run(&mut c, &mut t, &s);
    assert_eq!(step.cut, Some(Cut::Latency));
    let g = step.rate / rate;
    assert!(g > 0.6 && g < 0.8, "{g}");
    // 100 ms: at most halved.
    let rate = c.rate();
    let s = busy(&c, Duration::from_millis(100), None);
    assert_eq!(run(&mut c, &mut t, &s).rate, rate / 2.0);
}

#[test]
fn the_other_clients_latency_cuts_too() {
    let clients = Duration::from_millis(1);
    let (mut c, mut t) = probed(0.0, OWN, Some(clients));
    for _ in 0..4 {
        let s = busy(&c, OWN, Some(clients));
        run(&mut c, &mut t, &s);
    }
    let rate = c.rate();
    // 1.25 x 1 ms + 0.2 ms = 1.45 ms is the limit; the others' p90 at 2 ms cuts.
    let s = busy(&c, OWN, Some(Duration::from_millis(2)));
    let step = run(&mut c, &mut t, &s);
    assert_eq!(step.cut, Some(Cut::ClientsLatency));
    assert!(step.rate < rate * 0.8, "{} of {rate}", step.rate);
    // Fewer than 100 requests of theirs say nothing of their latency; that they got 10 answers where the probe saw
    // 500 says they lost their throughput.
    let s = Sample { clients: Some(counts(10, Duration::from_secs(1))), ..busy(&c, OWN, None) };
    assert_eq!(run(&mut c, &mut t, &s).cut, Some(Cut::ClientsThroughput));
}

/// A standalone controller past its first probe, which saw 500 requests of the other clients an interval at 1 ms
/// and a 99th percentile of `cpu_wait` for the wait for a CPU; and the clock.
fn probed_standalone(cpu_wait: Duration) -> (Controller, Instant) {
    let mut t = Instant::now();
    let mut c = Controller::new(Settings::new(40.0, 0.0), t);
    for _ in 0..3 {
        t += c.settings().interval;
        let s = Sample { cpu_wait: Some(counts(500, cpu_wait)), ..standalone(&c, 500, Duration::from_micros(50)) };
        assert_eq!(c.step(t, &s).rate, 40.0);
    }
    assert_eq!(c.baselines().served, Some(500.0));
    assert!(c.baselines().cpu_wait.is_some_and(|b| b >= cpu_wait));
    (c, t)
}

/// An interval that used its rate, with `served` requests of the other clients at 1 ms and 500 wake-ups late by
/// `cpu_wait`.
fn standalone(c: &Controller, served: u64, cpu_wait: Duration) -> Sample {
    let clients = Some(counts(served, Duration::from_millis(1)));
    Sample { clients, cpu_wait: Some(counts(500, cpu_wait)), ..busy(c, OWN, None) }
}

#[test]
fn the_other_clients_getting_fewer_answers_cuts_in_proportion() {
    let (mut c, mut t) = probed_standalone(Duration::from_micros(50));
    for _ in 0..4 {
        let s = standalone(&c, 500, Duration::from_micros(50));
        assert_eq!(run(&mut c, &mut t, &s).cut, None);
    }
    assert_eq!(c.rate(), 640.0);
    // Down to 0.92 of the probe's 500 is tolerated; 0.72 cuts by 0.72 / 0.9.
    let s = standalone(&c, 460, Duration::from_micros(50));
    assert_eq!(run(&mut c, &mut t, &s).cut, None);
    let rate = c.rate();
    let s = standalone(&c, 360, Duration::from_micros(50));
    let step = run(&mut c, &mut t, &s);
    assert_eq!(step.cut, Some(Cut::ClientsThroughput));
    assert!((step.rate / rate - 0.8).abs() < 1e-9, "{} of {rate}", step.rate);
    // Fewer than half: starved, or gone? Halved, and a probe finds out: gone, they leave nothing to judge by.
    let rate = c.rate();
    let s = standalone(&c, 100, Duration::from_micros(50));
    assert_eq!(run(&mut c, &mut t, &s), Step { rate: 40.0, pause: None, cut: Some(Cut::ClientsThroughput) });
    for _ in 0..3 {
        let s = standalone(&c, 0, Duration::from_micros(50));
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), rate / 2.0);
    assert_eq!(c.baselines().served, Some(0.0));
    let s = standalone(&c, 0, Duration::from_micros(50));
    assert_eq!(run(&mut c, &mut t, &s).cut, None);
}

#[test]
fn a_long_wait_for_a_cpu_cuts() {
    let (mut c, mut t) = probed_standalone(Duration::from_micros(100));
    for _ in 0..4 {
        let s = standalone(&c, 500, Duration::from_micros(100));
        run(&mut c, &mut t, &s);
    }
    // Probed 0.1 ms (read up to 19% high): up to 1.2 x that + 0.2 ms is fine.
    let s = standalone(&c, 500, Duration::from_micros(300));
    assert_eq!(run(&mut c, &mut t, &s).cut, None);
    // A time slice of 4 ms halves the rate.
    let rate = c.rate();
    let s = standalone(&c, 500, Duration::from_millis(4));
    assert_eq!(run(&mut c, &mut t, &s), Step { rate: rate / 2.0, pause: None, cut: Some(Cut::CpuWait) });
    // Fewer than 100 wake-ups say nothing.
    let s = Sample { cpu_wait: Some(counts(50, Duration::from_millis(4))), ..standalone(&c, 500, OWN) };
    assert_eq!(run(&mut c, &mut t, &s).cut, None);
    // Nor does the wait when there are no other clients to keep it short for (their throughput is judged alone).
    let (mut c, mut t) = probed(0.0, OWN, None);
    let s = Sample { cpu_wait: Some(counts(500, Duration::from_millis(4))), ..busy(&c, OWN, None) };
    assert_eq!(run(&mut c, &mut t, &s), Step { rate: 80.0, pause: None, cut: None });
}

#[test]
fn a_wait_for_a_cpu_without_a_baseline_is_probed_for_at_once() {
    let (mut c, mut t) = probed(0.0, OWN, Some(Duration::from_millis(1)));
    for _ in 0..3 {
        let s = busy(&c, OWN, Some(Duration::from_millis(1)));
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), 320.0);
    let s = Sample {
        cpu_wait: Some(counts(500, Duration::from_micros(80))),
        ..busy(&c, OWN, Some(Duration::from_millis(1)))
    };
    assert_eq!(run(&mut c, &mut t, &s).rate, 40.0);
}

#[test]
fn probes_drop_to_the_floor_then_resume_with_new_baselines() {
    let (mut c, mut t) = probed(500.0, OWN, Some(Duration::from_millis(1)));
    let mut steps = 0;
    while steps < 3 || c.rate() > 40.0 {
        let s = busy(&c, OWN, Some(Duration::from_millis(1)));
        run(&mut c, &mut t, &s);
        steps += 1;
        assert!(steps < 100, "no probe within 50 s");
    }
    // 30 s after the first probe: at the floor for 1.5 s, then back at the ceiling, the clients' baseline now 3 ms.
    assert_eq!(steps, 60);
    let slower = Some(Duration::from_millis(3));
    let rates: Vec<f64> = (0..3)
        .map(|_| {
            let s = busy(&c, OWN, slower);
            run(&mut c, &mut t, &s).rate
        })
        .collect();
    assert_eq!(rates, [40.0, 40.0, 500.0]);
    assert!(c.baselines().clients.is_some_and(|b| b >= Duration::from_millis(3)));
    let s = busy(&c, OWN, slower);
    assert_eq!(run(&mut c, &mut t, &s).cut, None);
}

#[test]
fn clients_that_appear_are_probed_for_at_once() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    for _ in 0..3 {
        let s = busy(&c, OWN, None);
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), 320.0);
    let s = busy(&c, OWN, Some(Duration::from_millis(1)));
    // Their first interval has no baseline to compare with: the rate drops to the floor to measure one.
    assert_eq!(run(&mut c, &mut t, &s).rate, 40.0);
}

#[test]
fn after_an_idle_while_a_migration_starts_over() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    for _ in 0..4 {
        let s = busy(&c, OWN, None);
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), 640.0);
    for _ in 0..20 {
        run(&mut c, &mut t, &Sample::default());
    }
    assert_eq!(c.rate(), 40.0);
    assert_eq!(c.baselines(), &Baselines::default());
}

#[test]
fn a_recovered_target_is_found_again_within_seconds() {
    let (mut c, mut t) = probed(0.0, OWN, None);
    for _ in 0..6 {
        let s = busy(&c, OWN, None);
        run(&mut c, &mut t, &s);
    }
    // Throttled down to the floor...
    for _ in 0..10 {
        let s = Sample { throttled: 1, ..busy(&c, OWN, None) };
        run(&mut c, &mut t, &s);
    }
    assert_eq!(c.rate(), 40.0);
    // ... then 10 s of a healthy target (probes included) bring it back above 2,000/s.
    for _ in 0..20 {
        let s = busy(&c, OWN, None);
        run(&mut c, &mut t, &s);
    }
    assert!(c.rate() > 2000.0, "{}", c.rate());
}

#[test]
fn the_floor_is_at_most_the_ceiling() {
    let s = Settings::new(40.0, 10.0);
    assert_eq!((s.floor, s.ceiling), (10.0, 10.0));
    let s = Settings::new(0.0, 0.0);
    assert_eq!((s.floor, s.ceiling), (1.0, f64::INFINITY));
}

/// Every reason of a cut has its series at 0 once the pace starts, adaptive or fixed, so that rate() over it works
/// from the first cut.
#[tokio::test]
async fn the_pace_declares_every_cut_reason() {
    for adaptive in [true, false] {
        let mut reg = prometheus_client::registry::Registry::default();
        let metrics = SchedulerMetrics::register(&mut reg);
        let config = SchedulerConfig { adaptive, ..Default::default() };
        let _pace = Pace::start(&config, metrics);
        let out = crate::server::exposition::encode(&reg).expect("encode");
        for cut in Cut::ALL {
            let line = format!("migration_apiserver_migration_rate_cuts_total{{reason=\"{}\"}} 0", cut.label());
            assert!(out.lines().any(|l| l == line), "adaptive {adaptive}: {line} missing in:\n{out}");
        }
    }
}

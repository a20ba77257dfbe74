//! The adaptive migration rate end to end: a MIGRATOR migration-apiserver (default flags but a ceiling, so that the
//! ShootStates last) migrates a TARGET's ShootStates through the fault-injecting proxy, which makes the target
//! healthy, then slow and throttling (ShootState writes above 60/s answered 429 with Retry-After: 1, the rest 50 ms
//! late), then healthy again. The rate (`migration_apiserver_migration_rate_limit`) must rise, fall within
//! seconds without a storm of 429s, and rise again.

mod common;
use common::proxy::{Fault, Proxy};
use common::shootstates::stale_shootstates;
use common::*;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const N: usize = 4000;
/// The throttling target's capacity for ShootState writes.
const CAPACITY: f64 = 60.0;

async fn send(client: &kube::Client, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let req = http::Request::builder().method(method).uri(path).header("content-type", "application/json");
    let resp = client.send(req.body(body).expect("request").map(kube::client::Body::from)).await.expect("transport");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

/// A sample of the migrator's /metrics.
async fn metric(m: &Server, prefix: &str) -> Option<f64> {
    let (code, text) = send(&m.client().await, "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

/// Polls the rate until `ok` says so; the rate and how long it took.
async fn wait_rate(m: &Server, what: &str, timeout: Duration, ok: impl Fn(f64) -> bool) -> (f64, Duration) {
    let started = Instant::now();
    loop {
        let rate = metric(m, "migration_apiserver_migration_rate_limit ").await.expect("the rate metric");
        if ok(rate) {
            return (rate, started.elapsed());
        }
        if started.elapsed() >= timeout {
            let (_, text) = send(&m.client().await, "GET", "/metrics", None).await;
            let cuts: Vec<&str> =
                text.lines().filter(|l| l.starts_with("migration_apiserver_migration_rate")).collect();
            panic!("the rate did not {what} within {timeout:?}: {rate}; {cuts:?}\n{}", m.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_shootstate_write(method: &str, path: &str) -> bool {
    method == "PATCH" && path.contains("/shootstates/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_falls_on_a_slow_throttling_target_without_a_storm_and_rises_again() {
    let target = stale_shootstates(N).await;
    let proxy = Proxy::start(&target);
    let throttling = Arc::new(AtomicBool::new(false));
    // The throttling target: a token bucket of CAPACITY writes a second (a burst of 3); writes beyond it get 429,
    // the others an answer 50 ms late.
    let bucket = Mutex::new((3.0_f64, Instant::now()));
    let on = throttling.clone();
    proxy.add_rule(move |r| {
        if !on.load(Ordering::SeqCst) || !is_shootstate_write(&r.method, &r.path) {
            return None;
        }
        let mut b = bucket.lock().unwrap();
        let now = Instant::now();
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * CAPACITY).min(3.0);
        b.1 = now;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            return Some(Fault::Delay(Duration::from_millis(50)));
        }
        Some(Fault::Status { code: 429, retry_after: Some(1) })
    });
    let m = migrating_server(&proxy.kubeconfig(), &["--migration-qps", "400"]);
    let name = request_shootstate_migration(&m);

    // Healthy: from the floor (40/s) up towards the ceiling.
    let (risen, _) = wait_rate(&m, "rise on a healthy target", Duration::from_secs(30), |r| r >= 300.0).await;

    // Slow and throttling: the rate falls within seconds.
    throttling.store(true, Ordering::SeqCst);
    let throttled_from = Instant::now();
    let (fell, fell_after) = wait_rate(&m, "fall", Duration::from_secs(10), |r| r <= 2.0 * CAPACITY).await;
    // It stays low while the target throttles: counted over the next 150 writes that get through (about 5 s).
    let through = |from: Instant| {
        proxy.records().into_iter().filter(|r| r.at >= from && is_shootstate_write(&r.method, &r.path)).fold(
            (0, 0, Vec::new()),
            |(ok, refused, mut at), r| match r.code {
                429 => {
                    at.push(r.at);
                    (ok, refused + 1, at)
                }
                c if (200..300).contains(&c) => (ok + 1, refused, at),
                _ => (ok, refused, at),
            },
        )
    };
    eventually("150 writes through the throttling target", Duration::from_secs(30), || {
        (through(throttled_from).0 >= 150).then_some(())
    });
    let (ok, refused, refused_at) = through(throttled_from);
    let window = throttled_from.elapsed();
    let low = metric(&m, "migration_apiserver_migration_rate_limit ").await.unwrap();

    // Recovered: the rate rises again.
    throttling.store(false, Ordering::SeqCst);
    let (recovered, recovered_after) =
        wait_rate(&m, "rise again after the target recovered", Duration::from_secs(30), |r| r >= 300.0).await;
    eprintln!(
        "adaptive rate: risen to {risen}/s; throttled: fell to {fell}/s after {fell_after:?}, {ok} writes and \
         {refused} 429s in {window:?}, rate {low}/s then; recovered to {recovered}/s after {recovered_after:?}"
    );
    assert!(low <= 3.0 * CAPACITY, "the rate went up again while the target throttled: {low}");
    // No storm: the 429s are a fraction of the writes that got through, not a multiple (a migrator at a fixed 400/s
    // collects one for most of its writes).
    assert!(refused >= 1, "the target never throttled");
    assert!(refused * 2 <= ok, "{refused} 429s for {ok} writes through in {window:?}");
    // Retry-After: 1 holds every request, not only the one that was refused: after the first 429, the requests
    // already on their way arrive, then none until the second has passed.
    let first = refused_at[0];
    let records = proxy.records();
    let during_pause: Vec<_> = records
        .iter()
        .filter(|r| r.path.contains("/shootstates"))
        .filter(|r| r.at > first + Duration::from_millis(200) && r.at < first + Duration::from_millis(900))
        .map(|r| (r.method.clone(), r.code, r.at.duration_since(first)))
        .collect();
    assert!(during_pause.is_empty(), "requests during the Retry-After pause: {during_pause:?}");
    let throttled_cuts = metric(&m, "migration_apiserver_migration_rate_cuts_total{reason=\"throttled\"}").await;
    assert!(throttled_cuts.is_some_and(|c| c >= 1.0), "{throttled_cuts:?}");

    // The migration finishes.
    eventually("the migration to succeed", Duration::from_secs(120), || {
        let out =
            m.kubectl(&["get", "svm", &name, "-o", "jsonpath={.status.conditions[?(@.type==\"Succeeded\")].status}"]);
        (String::from_utf8_lossy(&out.stdout).trim() == "True").then_some(())
    });
}

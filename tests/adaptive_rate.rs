//! The adaptive migration rate end to end: a MIGRATOR migration-apiserver (default flags but a ceiling and a floor)
//! migrates the stale custom resources of a real kube-apiserver (v1.37.2, a cluster without this server;
//! tests/common/crs.rs) through the fault-injecting proxy (tests/common/proxy.rs), which keeps kube-apiserver healthy,
//! then makes it look slow and throttling (writes of the resource above 20/s answered 429 with Retry-After: 1 by the
//! proxy, the rest forwarded 50 ms late), then healthy again. The rate (`migration_apiserver_migration_rate_limit`)
//! must rise, fall within seconds without a storm of 429s, stay low while throttled, and rise again.
//!
//! The numbers are scaled to what this kube-apiserver takes on the project's 2-core machine, shared with other
//! tests (measured 2026-11-29 at load averages of 4 to 8): 16 writes of stale objects in flight, as the migrator's
//! pipeline sends them, got 324-480/s through (p50 28-36 ms, the proxy's share about a tenth), and a migration left
//! to itself (no ceiling) ran at 140-210/s, its rate rising to 230-640/s and cut for latency every few seconds. So
//! the ceiling is 100/s, below anything kube-apiserver itself pushed back at, so that the healthy phases show the
//! adaptive rate and not kube-apiserver's limit; the injected capacity is 20/s, a fifth of the ceiling, and the
//! floor 10/s (40 by default), half that capacity, so that the rate can settle below it.

mod common;
use common::cluster::{Cluster, Options};
use common::crs::Cr;
use common::proxy::{Fault, Proxy, Record};
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Stale objects: enough that the migration outlasts the three phases (about 300 writes in the runs of 2026-11-29)
/// with a margin of about 9 s at the ceiling for a slow rise, few enough that the rest take seconds.
const N: usize = 1200;
/// The migrator's ceiling and floor (`--migration-qps`, `--migration-min-qps`).
const CEILING: f64 = 100.0;
const FLOOR: f64 = 10.0;
/// The throttling target's capacity for writes of the resource.
const CAPACITY: f64 = 20.0;
/// A rate at three quarters of the ceiling is "risen".
const RISEN: f64 = 0.75 * CEILING;

const GROUP: &str = "rate.example.com";

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

async fn rate(m: &Server) -> f64 {
    metric(m, "migration_apiserver_migration_rate_limit ").await.expect("the rate metric")
}

/// The rate's cuts so far, by reason.
async fn cuts(m: &Server) -> BTreeMap<String, f64> {
    let (_, text) = send(&m.client().await, "GET", "/metrics", None).await;
    let prefix = "migration_apiserver_migration_rate_cuts_total{reason=\"";
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| l.split_once("\"} ").and_then(|(reason, v)| Some((reason.to_string(), v.parse().ok()?))))
        .collect()
}

/// Polls the rate until `ok` says so; the rate and how long it took.
async fn wait_rate(m: &Server, what: &str, timeout: Duration, ok: impl Fn(f64) -> bool) -> (f64, Duration) {
    let started = Instant::now();
    loop {
        let rate = rate(m).await;
        if ok(rate) {
            return (rate, started.elapsed());
        }
        if started.elapsed() >= timeout {
            let migrations = m.kubectl_ok(&["get", "svm", "-o", "wide"]);
            panic!(
                "the rate did not {what} within {timeout:?}: {rate}; cuts {:?}\n{migrations}\n{}",
                cuts(m).await,
                m.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a request is a write of one of the resource's objects (not the CRD's status, nor an Event).
fn is_write(method: &str, path: &str) -> bool {
    method == "PATCH" && path.starts_with(&format!("/apis/{GROUP}/"))
}

/// The writes since `from`: how many got through (2xx), how many were refused with 429, and when those arrived.
fn writes_since(records: &[Record], from: Instant) -> (usize, usize, Vec<Instant>) {
    let writes = records.iter().filter(|r| r.at >= from && is_write(&r.method, &r.path));
    writes.fold((0, 0, Vec::new()), |(ok, refused, mut at), r| match r.code {
        429 => {
            at.push(r.at);
            (ok, refused + 1, at)
        }
        c if (200..300).contains(&c) => (ok + 1, refused, at),
        _ => (ok, refused, at),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_falls_on_a_slow_throttling_target_without_a_storm_and_rises_again() {
    let started = Instant::now();
    let c = Cluster::up(Options { server: false, ..Default::default() });
    let cr = Cr { group: GROUP, plural: "gears", kind: "Gear", namespace: Some("adaptive-rate") };
    cr.install_stale(&c, &c.client().await, N).await;
    let proxy = Proxy::in_front_of_cluster(&c);
    let throttling = Arc::new(AtomicBool::new(false));
    // The throttling target: a token bucket of CAPACITY writes a second (a burst of 3); writes beyond it get 429,
    // the others reach kube-apiserver 50 ms late.
    let bucket = Mutex::new((3.0_f64, Instant::now()));
    let on = throttling.clone();
    proxy.add_rule(move |r| {
        if !on.load(Ordering::SeqCst) || !is_write(&r.method, &r.path) {
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
    let (ceiling, floor) = (CEILING.to_string(), FLOOR.to_string());
    let m = cluster_migrator(&proxy.kubeconfig(), &["--migration-qps", &ceiling, "--migration-min-qps", &floor]);
    let name = request_cr_migration(&m, &cr);
    let (set_up, migrating) = (started.elapsed(), Instant::now());

    // Healthy: from the floor up towards the ceiling.
    let (risen, risen_after) = wait_rate(&m, "rise on a healthy target", Duration::from_secs(30), |r| r >= RISEN).await;
    let healthy_cuts = cuts(&m).await;

    // Slow and throttling: the rate falls within seconds.
    throttling.store(true, Ordering::SeqCst);
    let throttled_from = Instant::now();
    let (fell, fell_after) = wait_rate(&m, "fall", Duration::from_secs(10), |r| r <= 2.0 * CAPACITY).await;
    // It stays low while the target throttles: sampled until 5 s worth of writes at the capacity got through.
    let through = (5.0 * CAPACITY) as usize;
    let (mut highest, deadline) = (fell, Instant::now() + Duration::from_secs(60));
    while writes_since(&proxy.records(), throttled_from).0 < through {
        assert!(Instant::now() < deadline, "not {through} writes through the throttling target in 60 s");
        highest = highest.max(rate(&m).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, refused, refused_at) = writes_since(&proxy.records(), throttled_from);
    let window = throttled_from.elapsed();

    // Recovered: the rate rises again.
    throttling.store(false, Ordering::SeqCst);
    let (recovered, recovered_after) =
        wait_rate(&m, "rise again after the target recovered", Duration::from_secs(30), |r| r >= RISEN).await;
    eprintln!(
        "adaptive rate: risen to {risen}/s after {risen_after:?} (cuts {healthy_cuts:?}); throttled: fell to \
         {fell}/s after {fell_after:?}, at most {highest}/s since, {ok} writes and {refused} 429s in {window:?}; \
         recovered to {recovered}/s after {recovered_after:?}; cuts {:?}; {} writes through so far",
        cuts(&m).await,
        writes_since(&proxy.records(), migrating).0
    );
    assert!(highest <= 3.0 * CAPACITY, "the rate went up again while the target throttled: {highest}");
    // No storm: the 429s are a fraction of the writes that got through, not a multiple (a migrator at a fixed
    // ceiling collects one for most of its writes).
    assert!(refused >= 1, "the target never throttled");
    assert!(refused * 2 <= ok, "{refused} 429s for {ok} writes through in {window:?}");
    // Retry-After: 1 holds every request, not only the one that was refused: after the first 429, the requests
    // already on their way arrive, then none until the second has passed.
    let first = refused_at[0];
    let during_pause: Vec<_> = proxy
        .records()
        .into_iter()
        .filter(|r| r.path.starts_with(&format!("/apis/{GROUP}/")))
        .filter(|r| r.at > first + Duration::from_millis(200) && r.at < first + Duration::from_millis(900))
        .map(|r| (r.method, r.code, r.at.duration_since(first)))
        .collect();
    assert!(during_pause.is_empty(), "requests during the Retry-After pause: {during_pause:?}");
    let throttled_cuts = metric(&m, "migration_apiserver_migration_rate_cuts_total{reason=\"throttled\"}").await;
    assert!(throttled_cuts.is_some_and(|c| c >= 1.0), "{throttled_cuts:?}");

    // The migration finishes: every object is stored in v2.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = m.kubectl(&["get", "svm", &name, "-o", "jsonpath={.status.conditions[?(@.type==\"Succeeded\")]}"]);
        if String::from_utf8_lossy(&out.stdout).contains("\"status\":\"True\"") {
            break;
        }
        assert!(Instant::now() < deadline, "the migration did not succeed: {}", m.log());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(cr.stored_counts(&c), BTreeMap::from([(format!("{GROUP}/v2"), N)]));
    eprintln!("set up in {set_up:?}, migrated {N} objects in {:?}", migrating.elapsed());
}

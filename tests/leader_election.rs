//! Leader election of the embedded scheduler over an etcd lease, with real processes: two servers, one etcd. Only
//! the leader runs the trigger's decisions and the migrator (both replicas report); kill -9 of the leader hands
//! over within the lease duration; a graceful stop hands over at once (the lease is revoked); a leader cut off from
//! etcd stops its scheduler within the renew deadline, before its lease can expire.

mod common;
use common::etcd::Etcd;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);

fn replica(etcd: &Etcd) -> Server {
    Server::start(&[
        "--etcd-servers",
        &etcd.endpoint,
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
        "--leader-elect-retry-period",
        "500ms",
        "--discovery-interval",
        "1s",
    ])
}

/// `leader_election_master_status{name="migration-apiserver"}`, when exposed.
fn leading(s: &Server) -> Option<bool> {
    let out = s.kubectl(&["get", "--raw", "/metrics"]);
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.starts_with("leader_election_master_status{name=\"migration-apiserver\"}"))?;
    Some(line.split_whitespace().last()? == "1")
}

fn count(s: &Server, resource: &str) -> usize {
    let out = s.kubectl_ok(&["get", resource, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    v["items"].as_array().map(Vec::len).unwrap_or(0)
}

/// Every StorageState of `s` carries a report of its own reporter (the replica's identity).
fn reports(s: &Server) -> Vec<String> {
    let out = s.kubectl_ok(&["get", "storagestates", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|st| st["status"]["currentStorageVersionHashes"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["reporterID"].as_str().map(str::to_string))
        .collect()
}

/// Waits until exactly one of `a`, `b` leads; returns its index.
fn one_leader(servers: [&Server; 2], within: Duration) -> usize {
    eventually("one leader", within, || match (leading(servers[0]), leading(servers[1])) {
        (Some(true), Some(false)) => Some(0),
        (Some(false), Some(true)) => Some(1),
        (Some(true), Some(true)) => panic!("two leaders"),
        _ => None,
    })
}

#[test]
fn one_leader_runs_the_scheduler_and_kill_9_hands_over_within_the_lease_duration() {
    let etcd = Etcd::start();
    let a = replica(&etcd);
    eventually("a leads", Duration::from_secs(20), || leading(&a).filter(|l| *l));
    let b = replica(&etcd);
    let mut servers = [a, b];
    assert_eq!(one_leader([&servers[0], &servers[1]], Duration::from_secs(20)), 0);
    assert!(servers[1].log().contains("leader election: started"), "{}", servers[1].log());

    // Both replicas report (each into its own embedded store here); only the leader requests migrations.
    eventually("the leader's migrations", Duration::from_secs(30), || {
        (count(&servers[0], "storageversionmigrations") >= 3).then_some(())
    });
    eventually("b reports", Duration::from_secs(20), || (!reports(&servers[1]).is_empty()).then_some(()));
    assert_eq!(count(&servers[1], "storageversionmigrations"), 0, "a follower never starts a migration");
    // The same identity is the election's and the reporter's: it names the leader in the follower's log.
    let a_id = reports(&servers[0]).first().cloned().expect("a's reporterID");
    eventually("b saw a lead", Duration::from_secs(10), || servers[1].log().contains(&a_id).then_some(()));

    // kill -9 of the leader: b takes over once the etcd lease expires.
    let killed = Instant::now();
    servers[0].kill9();
    eventually("b leads", LEASE + Duration::from_secs(10), || leading(&servers[1]).filter(|l| *l));
    let handover = killed.elapsed();
    eprintln!("handover after kill -9: {handover:?} (lease duration {LEASE:?}, retry period {RETRY:?})");
    // Not before a's lease expired (its last renewal was at most a retry period before the kill) ...
    assert!(handover >= LEASE - RETRY - Duration::from_millis(300), "{handover:?}");
    // ... and within the lease duration plus one retry period (and the time a scrape takes).
    assert!(handover <= LEASE + RETRY + Duration::from_secs(2), "{handover:?}");
    // The new leader's scheduler runs: it requests migrations in its own store.
    eventually("b's migrations", Duration::from_secs(30), || {
        (count(&servers[1], "storageversionmigrations") >= 3).then_some(())
    });
    assert!(servers[1].log().contains("leader election: acquired the lock, leading"));
}

#[test]
fn a_graceful_stop_releases_the_lease_at_once() {
    let etcd = Etcd::start();
    let a = replica(&etcd);
    eventually("a leads", Duration::from_secs(20), || leading(&a).filter(|l| *l));
    let b = replica(&etcd);
    let mut servers = [a, b];
    assert_eq!(one_leader([&servers[0], &servers[1]], Duration::from_secs(20)), 0);
    let stopped = Instant::now();
    servers[0].stop();
    eventually("b leads", LEASE + Duration::from_secs(10), || leading(&servers[1]).filter(|l| *l));
    let handover = stopped.elapsed();
    eprintln!("handover after SIGTERM: {handover:?}");
    assert!(handover < LEASE, "released, not expired: {handover:?}");
    assert!(servers[0].log().contains("leader election: lock released"), "{}", servers[0].log());
}

#[test]
fn a_leader_cut_off_from_etcd_stops_within_the_renew_deadline() {
    let mut etcd = Etcd::start();
    let a = replica(&etcd);
    eventually("a leads", Duration::from_secs(20), || leading(&a).filter(|l| *l));
    let paused = Instant::now();
    etcd.pause();
    eventually("a stops leading", RENEW + Duration::from_secs(10), || leading(&a).filter(|l| !*l));
    let stopped = paused.elapsed();
    eprintln!("leader stopped {stopped:?} after etcd froze (renew deadline {RENEW:?})");
    // Before the lease could expire on etcd (no other replica could have led meanwhile).
    assert!(stopped < LEASE + Duration::from_secs(1), "{stopped:?}");
    assert!(a.log().contains("leader election: lost the lock, scheduler stopped"), "{}", a.log());
    etcd.resume();
    eventually("a leads again", Duration::from_secs(30), || leading(&a).filter(|l| *l));
}

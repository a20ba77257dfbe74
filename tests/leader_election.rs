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

/// The reporterIDs in the StorageStates `s` serves.
fn reporters(s: &Server) -> Vec<String> {
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

/// The server's log without terminal colours (tracing colours field names).
fn plain_log(s: &Server) -> String {
    let mut out = String::new();
    let log = s.log();
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The election identity a server logged at start (`identity=<hostname>_<random>`), which is also its reporterID.
fn identity(s: &Server) -> String {
    eventually("the identity in the log", Duration::from_secs(20), || {
        let log = plain_log(s);
        let line = log.lines().find(|l| l.contains("leader election: started"))?.to_string();
        let id = line.split("identity=").nth(1)?.split_whitespace().next()?.trim_matches('"').to_string();
        Some(id)
    })
}

const REQUESTED: &str = "trigger: storage version migration requested";

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

    // Both replicas report; only the leader decides and migrates.
    let (a_id, b_id) = (identity(&servers[0]), identity(&servers[1]));
    assert_ne!(a_id, b_id);
    eventually("the leader's migrations", Duration::from_secs(30), || {
        servers[0].log().contains(REQUESTED).then_some(())
    });
    eventually("b reports", Duration::from_secs(20), || reporters(&servers[1]).contains(&b_id).then_some(()));
    eventually("b saw a lead", Duration::from_secs(10), || {
        let log = plain_log(&servers[1]);
        log.lines().any(|l| l.contains("new leader observed") && l.contains(&format!("leader={a_id}"))).then_some(())
    });
    let follower = servers[1].log();
    for leader_only in [REQUESTED, "migration started", "scheduler: leading"] {
        assert!(!follower.contains(leader_only), "a follower logged {leader_only:?}:\n{follower}");
    }

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
    // The new leader's scheduler runs.
    eventually("b's scheduler", Duration::from_secs(10), || {
        servers[1].log().contains("scheduler: leading, starting").then_some(())
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

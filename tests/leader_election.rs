//! Leader election of the embedded scheduler over an etcd lease, with real processes: two replicas storing in one
//! etcd. Only the leader runs the trigger's decisions and the migrator (both replicas report into the shared
//! StorageStates); kill -9 of the leader hands over within the lease duration, also in the middle of a migration,
//! which the new leader finishes from its saved continue token; a graceful stop hands over at once (the lease is
//! revoked, the reports withdrawn); a leader cut off from etcd stops its scheduler within the renew deadline, before
//! its lease can expire.

mod common;
use common::etcd::Etcd;
use common::shootstates::*;
use common::status::is_true;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);
const SS: &str = SHOOTSTATES;

const REPLICA_FLAGS: &[&str] = &[
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
    "--discovery-interval",
    "1s",
];

fn replica(etcd: &Etcd) -> Server {
    Server::start_on_etcd(etcd, REPLICA_FLAGS)
}

/// Two replicas on `etcd` started with `flags`: the first leads, the second follows.
fn leader_then_follower(etcd: &Etcd, flags: &[&str]) -> [Server; 2] {
    let a = Server::start_on_etcd(etcd, flags);
    eventually("a leads", Duration::from_secs(20), || leading(&a).filter(|l| *l));
    let b = Server::start_on_etcd(etcd, flags);
    let servers = [a, b];
    assert_eq!(one_leader([&servers[0], &servers[1]], Duration::from_secs(20)), 0);
    servers
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
    let mut servers = leader_then_follower(&etcd, REPLICA_FLAGS);
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
    let mut servers = leader_then_follower(&etcd, REPLICA_FLAGS);
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

fn svm(s: &Server, name: &str) -> Value {
    let out = s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io", name, "-o", "json"]);
    serde_json::from_str(&out).expect("JSON")
}

/// Two replicas on one etcd share their StorageStates: each reports its element (reporterID = its identity), the
/// leader alone requests the migrations (one per resource), and a replica that stops gracefully withdraws its
/// element.
#[test]
fn replicas_report_into_shared_storagestates_and_the_leader_requests_one_migration() {
    let etcd = Etcd::start();
    let a = replica(&etcd);
    eventually("a leads", Duration::from_secs(20), || leading(&a).filter(|l| *l));
    let mut b = replica(&etcd);
    let (a_id, b_id) = (identity(&a), identity(&b));
    let both = |s: &Server| {
        let st: Value = serde_json::from_str(&s.kubectl_ok(&["get", "storagestate", SS, "-o", "json"])).ok()?;
        let es = st["status"]["currentStorageVersionHashes"].as_array()?.clone();
        let ids: Vec<String> = es.iter().filter_map(|e| e["reporterID"].as_str().map(str::to_string)).collect();
        (ids.contains(&a_id) && ids.contains(&b_id)).then_some(st)
    };
    // Read through b: the state a wrote is b's state too.
    let st = eventually("both reporters in one StorageState", Duration::from_secs(30), || both(&b));
    let hashes: Vec<&str> = st["status"]["currentStorageVersionHashes"]
        .as_array()
        .expect("reports")
        .iter()
        .filter_map(|e| e["currentStorageVersionHash"].as_str())
        .collect();
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{st}");
    // Agreement of a stable set of reporters: the leader requests the migration, once.
    let requested = |s: &Server| {
        let all: Value =
            serde_json::from_str(&s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io", "-o", "json"]))
                .ok()?;
        let ms: Vec<Value> = all["items"]
            .as_array()?
            .iter()
            .filter(|m| m["spec"]["resource"]["resource"] == "shootstates")
            .cloned()
            .collect();
        (!ms.is_empty()).then_some(ms)
    };
    eventually("the shootstates migration", Duration::from_secs(30), || requested(&b));
    // Several more polls (1 s each) later, still one: replicas never race to request it.
    eventually("five more polls", Duration::from_secs(30), || {
        (plain_log(&b).matches("trigger: storage version migration requested").count() == 0
            && st_heartbeat_advanced(&b, &st, 5))
        .then_some(())
    });
    assert_eq!(requested(&a).expect("migrations").len(), 1);
    // b stops gracefully: its element is withdrawn at once, a's stays.
    b.stop();
    let st = eventually("b's element withdrawn", Duration::from_secs(10), || {
        let st: Value = serde_json::from_str(&a.kubectl_ok(&["get", "storagestate", SS, "-o", "json"])).ok()?;
        let ids: Vec<String> = st["status"]["currentStorageVersionHashes"]
            .as_array()?
            .iter()
            .filter_map(|e| e["reporterID"].as_str().map(str::to_string))
            .collect();
        (ids == [a_id.clone()]).then_some(st)
    });
    assert!(plain_log(&b).contains("trigger: reports withdrawn"), "{st}");
}

/// Whether the StorageState's heartbeat (whole seconds) moved at least `secs` past the one in `before`.
fn st_heartbeat_advanced(s: &Server, before: &Value, secs: i64) -> bool {
    let parse = |v: &Value| {
        v["status"]["lastHeartbeatTime"].as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
    };
    let Ok(now) = serde_json::from_str::<Value>(&s.kubectl_ok(&["get", "storagestate", SS, "-o", "json"])) else {
        return false;
    };
    match (parse(before), parse(&now)) {
        (Some(b), Some(n)) => n.as_second() - b.as_second() >= secs,
        _ => false,
    }
}

/// Must-show: kill -9 of the leader during a migration; the other replica (same etcd store) takes over, resumes
/// the Running migration from its saved continue token and finishes it: every object is stored in the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_leader_mid_migration_the_other_replica_finishes_it() {
    const N: usize = 300;
    let etcd = Etcd::start();
    // ShootStates stored as v1alpha1.
    let mut seed = Server::start_on_etcd(
        &etcd,
        &["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1alpha1"],
    );
    kubectl_create(&seed, &numbered_shootstates("garden-ha", N, |i| format!("shoot-{i:04}")));
    seed.stop();
    // Two replicas now store v1beta1; migrations by hand only (no trigger), slowly enough to kill one mid-way.
    let flags = [
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
        "--leader-elect-retry-period",
        "500ms",
        "--disable-trigger",
        "--migration-qps",
        "60",
        "--migration-burst",
        "5",
        "--migration-chunk-size",
        "20",
    ];
    let mut servers = leader_then_follower(&etcd, &flags);
    let out = std::process::Command::new(BIN)
        .args(["migrate", "--resource", SS, "--kubeconfig"])
        .arg(servers[0].kubeconfig())
        .output()
        .expect("migrate");
    let name = created_migration(&out);
    // Read through the follower: mid-way, with a saved token.
    let at_kill = eventually("a third migrated", Duration::from_secs(30), || {
        let m = svm(&servers[1], &name);
        assert!(!is_true(&m, "Succeeded"), "finished before the kill; slow it down: {m}");
        (m["status"]["migratedObjects"].as_i64().unwrap_or(0) >= (N / 3) as i64).then_some(m)
    });
    assert!(is_true(&at_kill, "Running") && at_kill["spec"]["continueToken"].is_string(), "{at_kill}");
    let killed = Instant::now();
    servers[0].kill9();
    eventually("b leads", LEASE + Duration::from_secs(10), || leading(&servers[1]).filter(|l| *l));
    eprintln!("handover during a migration: {:?}", killed.elapsed());
    let done = eventually("b finishes the migration", Duration::from_secs(60), || {
        let m = svm(&servers[1], &name);
        assert!(!is_true(&m, "Failed"), "{m}\n{}", servers[1].log());
        is_true(&m, "Succeeded").then_some(m)
    });
    eprintln!("migration finished by the new leader {:?} after the kill: {}", killed.elapsed(), done["status"]);
    assert!(done["status"]["migratedObjects"].as_i64().unwrap_or(0) >= N as i64, "{done}");
    let log = plain_log(&servers[1]);
    assert!(log.contains("migration resumed") && log.contains("resumed_from_token=true"), "{log}");
    // No object missed: every ShootState in etcd is stored as v1beta1.
    let mut ec = etcd.client().await;
    let stored = ec
        .get("/registry/core.gardener.cloud/shootstates/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("etcd get");
    assert_eq!(stored.kvs().len(), N);
    for kv in stored.kvs() {
        let v: Value = serde_json::from_slice(kv.value()).expect("JSON in etcd");
        assert_eq!(v["apiVersion"], "core.gardener.cloud/v1beta1", "{}", String::from_utf8_lossy(kv.key()));
    }
}

/// Timing that could let two leaders overlap fails the start, with client-go's rule in the message.
#[test]
fn invalid_election_timing_fails_the_start() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--secure-port", &free_port().to_string(), "--etcd-servers", &etcd.endpoint])
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .args([
            "--discovery-interval",
            "1s",
            "--leader-elect-lease-duration",
            "5s",
            "--leader-elect-renew-deadline",
            "10s",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline"),
        "{stderr}"
    );
}

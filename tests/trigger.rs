//! The trigger against the real binary, with this server itself as the target: StorageStates for its own resources,
//! a storage version change of ShootStates across a restart migrated end to end (storage inspect), heartbeats,
//! superseding, the history bound, the start-up staleness check, and `migrate --resource` / `--all`.

mod common;
use common::shootstates::*;
use common::status::strings;
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

const SS: &str = SHOOTSTATES;
const OWN: [&str; 3] = [SS, "storagestates.migration.k8s.io", "storageversionmigrations.migration.k8s.io"];
const UNKNOWN: &str = "Unknown";
/// How long a migration may take: the migrator works at `--migration-qps`.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(120);

fn state(s: &Server, name: &str) -> Option<Value> {
    let out = s.kubectl(&["get", "storagestate", name, "-o", "json"]);
    out.status.success().then(|| serde_json::from_slice(&out.stdout).expect("storagestate JSON"))
}

fn persisted(st: &Value) -> Vec<String> {
    strings(&st["status"]["persistedStorageVersionHashes"])
}

fn current(st: &Value) -> String {
    st["status"]["currentStorageVersionHash"].as_str().unwrap_or_default().to_string()
}

fn heartbeat(st: &Value) -> String {
    st["status"]["lastHeartbeatTime"].as_str().unwrap_or_default().to_string()
}

/// The migrations of `qualified` (`<resource>.<group>`), oldest first by our sub-second annotation.
fn migrations(s: &Server, qualified: &str) -> Vec<Value> {
    let (resource, group) = qualified.split_once('.').unwrap_or((qualified, ""));
    let all = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", "-o", "json"]);
    let mut ms: Vec<Value> = all["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["spec"]["resource"]["resource"] == resource && m["spec"]["resource"]["group"] == group)
        .collect();
    ms.sort_by_key(|m| {
        m["metadata"]["annotations"]["migration.k8s.io/requested-at"].as_str().unwrap_or("").to_string()
    });
    ms
}

fn name(m: &Value) -> String {
    m["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

fn hash_of(m: &Value) -> String {
    m["metadata"]["annotations"]["migration.k8s.io/storage-version-hash"].as_str().unwrap_or_default().to_string()
}

/// The condition of `type_` that is True, if any: (reason, message).
fn condition(m: &Value, type_: &str) -> Option<(String, String)> {
    m["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_ && c["status"] == "True").map(|c| {
        (c["reason"].as_str().unwrap_or_default().to_string(), c["message"].as_str().unwrap_or_default().to_string())
    })
}

fn finished(m: &Value) -> bool {
    condition(m, "Succeeded").is_some() || condition(m, "Failed").is_some()
}

/// storageVersionHash of a resource in the server's legacy discovery.
fn discovery_hash(s: &Server, group_version: &str, resource: &str) -> String {
    let list = s.kubectl_json(&["get", "--raw", &format!("/apis/{group_version}")]);
    list["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == resource))
        .and_then(|r| r["storageVersionHash"].as_str())
        .unwrap_or_else(|| panic!("no hash for {resource} in {list}"))
        .to_string()
}

fn shootstates_hash(s: &Server) -> String {
    discovery_hash(s, "core.gardener.cloud/v1beta1", "shootstates")
}

fn own_hashes(s: &Server) -> Vec<(String, String)> {
    vec![
        (SS.to_string(), shootstates_hash(s)),
        (OWN[1].to_string(), discovery_hash(s, "migration.k8s.io/v1alpha1", "storagestates")),
        (OWN[2].to_string(), discovery_hash(s, "migration.k8s.io/v1alpha1", "storageversionmigrations")),
    ]
}

/// Every `persistedStorageVersionHashes` the StorageState `name` had after resourceVersion `from`, in order (equal
/// neighbours merged), and the last resourceVersion seen: a watch replayed from the server's event history (which
/// starts afresh at each start of the server), ended by timeoutSeconds.
fn persisted_history(s: &Server, name: &str, from: &str) -> (Vec<Vec<String>>, String) {
    let path = format!(
        "/apis/migration.k8s.io/v1alpha1/storagestates?watch=true&resourceVersion={from}&timeoutSeconds=1&fieldSelector=metadata.name%3D{name}"
    );
    let out = s.kubectl(&["get", "--raw", &path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // "too old resource version: 16 (78)": the history starts at 78 (the last start); replay from there.
        let oldest = Some(stderr.as_ref())
            .filter(|e| e.contains("too old resource version"))
            .and_then(|e| Some(e.rsplit_once('(')?.1.split_once(')')?.0.trim().to_string()))
            .unwrap_or_else(|| panic!("watch failed: {stderr}"));
        assert_ne!(oldest, from, "{stderr}");
        return persisted_history(s, name, &oldest);
    }
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    let mut seen: Vec<Vec<String>> = Vec::new();
    let mut last = from.to_string();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let ev: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("watch event {line}: {e}"));
        let p = persisted(&ev["object"]);
        if let Some(rv) = ev["object"]["metadata"]["resourceVersion"].as_str() {
            last = rv.to_string();
        }
        if !p.is_empty() && seen.last() != Some(&p) {
            seen.push(p);
        }
    }
    (seen, last)
}

fn hashes(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `storage inspect -o json` of the stopped server: (key, apiVersion).
fn inspect(s: &Server, prefix: &str) -> Vec<(String, String)> {
    let v = s.storage_inspect(&["--prefix", prefix]);
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|i| (i["key"].as_str().unwrap_or("").to_string(), i["apiVersion"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn migrate_cli(s: &Server, args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("migrate").arg("--kubeconfig").arg(s.kubeconfig()).args(args).output().expect("run migrate")
}

/// Waits for the latest migration of `qualified` to be Succeeded and for its StorageState to say persisted ==
/// [current]; returns that migration.
fn wait_migrated(s: &Server, qualified: &str, hash: &str) -> Value {
    eventually(&format!("{qualified} migrated to {hash}"), MIGRATION_TIMEOUT, || {
        let m = migrations(s, qualified).pop()?;
        if let Some((reason, message)) = condition(&m, "Failed") {
            panic!("migration {} failed: {reason}: {message}\n{}", name(&m), s.log());
        }
        let st = state(s, qualified)?;
        (hash_of(&m) == hash && condition(&m, "Succeeded").is_some() && persisted(&st) == [hash]).then_some(m)
    })
}

/// Must-show (a): ShootStates stored as v1alpha1, the server restarted with v1beta1; the trigger sees the new hash,
/// a migration runs to Succeeded, every object is stored as v1beta1 and persisted == [current].
#[test]
fn storage_version_change_is_detected_and_migrated() {
    const N: usize = 60;
    let phase1 = ["--storage-version", "shootstates.core.gardener.cloud=v1alpha1", "--discovery-interval", "30s"];
    let mut s = Server::start(&[&phase1[..], &["--migration-qps", "20"]].concat());
    let hash_a = shootstates_hash(&s);
    kubectl_create(&s, &numbered_shootstates("garden-a", N, |i| format!("shoot-{i:03}")));

    // StorageStates for the server's own resources, current = the discovery hash, and a migration for each, with
    // the contract's labels, annotations and spec.
    for (qualified, hash) in own_hashes(&s) {
        let st = eventually(&format!("storagestate {qualified}"), Duration::from_secs(20), || state(&s, &qualified));
        assert_eq!(current(&st), hash, "{st}");
        assert!(persisted(&st) == [UNKNOWN] || persisted(&st) == [hash.as_str()], "{st}");
        assert!(!heartbeat(&st).is_empty(), "{st}");
        let ms = migrations(&s, &qualified);
        assert_eq!(ms.len(), 1, "{ms:#?}");
        let m = &ms[0];
        assert_eq!(m["metadata"]["labels"]["migration.k8s.io/resource"], qualified.as_str());
        assert_eq!(hash_of(m), hash);
        assert!(name(m).starts_with(&format!("{qualified}-")), "{m}");
        let (resource, group) = qualified.split_once('.').expect("qualified");
        let version = if group == "core.gardener.cloud" { "v1beta1" } else { "v1alpha1" };
        assert_eq!(m["spec"]["resource"], json!({"group": group, "version": version, "resource": resource}));
    }
    let first = wait_migrated(&s, SS, &hash_a);
    // The KEP's life-cycle so far: created with persisted Unknown, refined to [A] by the migration.
    let (history, rv) = persisted_history(&s, SS, "1");
    assert_eq!(history, [hashes(&[UNKNOWN]), hashes(&[&hash_a])]);

    // Restart with the default storage version, v1beta1.
    s.restart_with(&["--discovery-interval", "30s", "--migration-qps", "20"]);
    let hash_b = shootstates_hash(&s);
    assert_ne!(hash_a, hash_b);
    let st = eventually("current hash B", Duration::from_secs(20), || state(&s, SS).filter(|st| current(st) == hash_b));
    assert!(persisted(&st) == [hash_a.clone(), hash_b.clone()] || persisted(&st) == [hash_b.clone()], "{st}");
    let second = wait_migrated(&s, SS, &hash_b);
    assert_ne!(name(&first), name(&second));
    // Each writer is named in managedFields, as kube-storage-version-migrator's user agents name them.
    let managers = |kind: &str, name: &str| -> BTreeSet<String> {
        let o = s.kubectl_json(&["get", kind, name, "-o", "json", "--show-managed-fields"]);
        let fields = o["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
        fields.iter().filter_map(|f| f["manager"].as_str().map(String::from)).collect()
    };
    assert_eq!(managers("storagestate", SS), BTreeSet::from(["storage-version-migration-trigger".to_string()]));
    assert_eq!(
        managers("storageversionmigrations.migration.k8s.io", &name(&second)),
        BTreeSet::from([
            "storage-version-migration-migrator".to_string(),
            "storage-version-migration-trigger".to_string()
        ])
    );
    assert_eq!(second["status"]["migratedObjects"], json!(N), "{second}");
    // The old hash stayed in persisted until the migration succeeded.
    let (mut after, _) = persisted_history(&s, SS, &rv);
    if after.first() == Some(&hashes(&[&hash_a])) {
        after.remove(0); // a heartbeat before the restart
    }
    assert_eq!(after, [hashes(&[&hash_a, &hash_b]), hashes(&[&hash_b])]);
    // The other resources' hashes did not change: no new migration for them.
    for qualified in &OWN[1..] {
        assert_eq!(migrations(&s, qualified).len(), 1, "{qualified}");
    }
    assert_eq!(migrations(&s, SS).len(), 2);

    // Every ShootState is stored as v1beta1.
    s.stop();
    let stored = inspect(&s, "/registry/core.gardener.cloud/shootstates/");
    assert_eq!(stored.len(), N, "{stored:?}");
    for (key, api_version) in &stored {
        assert_eq!(api_version, "core.gardener.cloud/v1beta1", "{key}");
    }
}

/// An unchanged hash: the heartbeat advances and no migration is requested.
#[test]
fn unchanged_hash_only_advances_the_heartbeat() {
    let s = Server::start(&["--discovery-interval", "1s"]);
    let hashes = own_hashes(&s);
    // The StorageState is written before its first migration is requested: wait for both.
    let before: Vec<(String, BTreeSet<String>)> = hashes
        .iter()
        .map(|(q, _)| {
            let st = eventually(&format!("storagestate {q}"), Duration::from_secs(20), || state(&s, q));
            let names: BTreeSet<String> =
                eventually(&format!("first migration of {q}"), Duration::from_secs(20), || {
                    Some(migrations(&s, q).iter().map(name).collect::<BTreeSet<_>>()).filter(|n| !n.is_empty())
                });
            (heartbeat(&st), names)
        })
        .collect();
    for ((qualified, hash), (hb, names)) in hashes.iter().zip(before) {
        // A later heartbeat means a discovery round ran after the snapshot (heartbeats have whole seconds).
        let st = eventually(&format!("{qualified}: heartbeat after {hb}"), Duration::from_secs(20), || {
            state(&s, qualified).filter(|st| heartbeat(st) > hb)
        });
        assert_eq!(current(&st), *hash);
        let now: BTreeSet<String> = migrations(&s, qualified).iter().map(name).collect();
        assert_eq!(now, names, "{qualified}: no new migration for an unchanged hash");
        assert_eq!(names.len(), 1);
    }
}

/// Two storage version changes in quick succession: the first change's migration is superseded (Failed, reason
/// Superseded, naming its successor), not deleted.
#[test]
fn a_second_change_supersedes_the_unfinished_migration() {
    let slow = ["--discovery-interval", "30s", "--migration-qps", "2", "--migration-burst", "1"];
    let alpha = ["--storage-version", "shootstates.core.gardener.cloud=v1alpha1"];
    let mut s = Server::start(&[&slow[..], &alpha[..]].concat());
    let hash_a = shootstates_hash(&s);
    kubectl_create(&s, &numbered_shootstates("garden-b", 40, |i| format!("shoot-{i:03}")));
    let initial = eventually("first migration", Duration::from_secs(20), || migrations(&s, SS).first().cloned());

    // A -> B: a migration to B is requested; at 2 qps over 40 objects it is still running at the next change.
    s.restart_with(&slow);
    let hash_b = shootstates_hash(&s);
    let to_b = eventually("migration to B", Duration::from_secs(20), || {
        migrations(&s, SS).into_iter().find(|m| hash_of(m) == hash_b)
    });
    // B -> A.
    s.restart_with(&[&slow[..], &alpha[..]].concat());
    let back = eventually("migration back to A", Duration::from_secs(20), || {
        migrations(&s, SS).into_iter().find(|m| hash_of(m) == hash_a && name(m) != name(&initial))
    });
    let to_b = eventually("migration to B superseded", Duration::from_secs(20), || {
        migrations(&s, SS).into_iter().find(|m| name(m) == name(&to_b)).filter(finished)
    });
    let (reason, message) = condition(&to_b, "Failed").unwrap_or_else(|| panic!("not failed: {to_b}"));
    assert_eq!(reason, "Superseded");
    assert!(message.contains(&name(&back)), "{message}");
    assert!(condition(&to_b, "Running").is_none() && condition(&to_b, "Succeeded").is_none(), "{to_b}");
    // History kept: all three migrations are still there, and only the newest is unfinished.
    let ms = migrations(&s, SS);
    assert_eq!(ms.len(), 3, "{ms:#?}");
    assert_eq!(ms.iter().filter(|m| !finished(m)).map(name).collect::<Vec<_>>(), [name(&back)]);
    let st = state(&s, SS).expect("state");
    assert_eq!(current(&st), hash_a);
    // [Unknown, B, A], or [A, B] when the first migration had succeeded before the change (it may have LISTed
    // before the ShootStates were created), or [A] once the last one succeeded.
    let p = persisted(&st);
    assert!(p == [UNKNOWN, &hash_b, &hash_a] || p == [hash_a.as_str(), &hash_b] || p == [hash_a.as_str()], "{st}");
}

/// Finished migrations beyond --migration-history are deleted, oldest first.
#[test]
fn migration_history_is_bounded() {
    let s = Server::start(&["--discovery-interval", "1s", "--migration-history", "2", "--migration-qps", "1"]);
    kubectl_create(&s, &numbered_shootstates("garden-c", 5, |i| format!("shoot-{i:03}")));
    eventually("trigger's migration", Duration::from_secs(20), || migrations(&s, SS).first().cloned());
    let mut created = Vec::new();
    for _ in 0..5 {
        let out = migrate_cli(&s, &["--resource", SS]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let n = line
            .strip_prefix("storageversionmigration.migration.k8s.io/")
            .and_then(|l| l.strip_suffix(" created"))
            .unwrap_or_else(|| panic!("unexpected output {line:?}"));
        created.push(n.to_string());
    }
    // 6 migrations requested (the trigger's and 5 by hand); the unfinished newest stays, of the finished ones
    // only the 2 newest.
    let kept = eventually("history pruned", Duration::from_secs(20), || {
        let ms = migrations(&s, SS);
        (ms.iter().filter(|m| finished(m)).count() <= 2 && ms.len() <= 3).then_some(ms)
    });
    let names: Vec<String> = kept.iter().map(name).collect();
    assert_eq!(names, created[created.len() - names.len()..], "the newest are kept");
    assert!(names.len() >= 2, "{names:?}");
    // And it stays bounded: the trigger does not request more (the newest covers the current hash). Two later
    // heartbeats mean at least one full discovery round ran after the pruning.
    let hb = heartbeat(&state(&s, SS).expect("state"));
    let next = eventually("a later heartbeat", Duration::from_secs(20), || {
        state(&s, SS).map(|st| heartbeat(&st)).filter(|h| *h > hb)
    });
    eventually("a second later heartbeat", Duration::from_secs(20), || {
        state(&s, SS).map(|st| heartbeat(&st)).filter(|h| *h > next)
    });
    let later: Vec<String> = migrations(&s, SS).iter().map(name).collect();
    assert!(later.iter().all(|n| created.contains(n)), "{later:?}");
}

/// A StorageState whose heartbeat is older than two intervals at start-up is reset to persisted ["Unknown"] and
/// migrated again, although it claimed to be migrated.
#[test]
fn stale_heartbeat_at_start_up_resets_persisted() {
    let mut s = Server::start(&["--disable-scheduler"]);
    let hash = shootstates_hash(&s);
    let st = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
                    "metadata": {"name": SS}, "spec": {"resource": {"group": "core.gardener.cloud", "resource": "shootstates"}}});
    s.kubectl_ok_stdin(&["create", "-f", "-"], &st.to_string());
    let status = json!({"status": {"persistedStorageVersionHashes": [hash], "currentStorageVersionHash": hash,
                                   "lastHeartbeatTime": "2020-01-01T00:00:00Z"}});
    s.kubectl_ok(&["patch", "storagestate", SS, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
    let written = state(&s, SS).expect("state");
    assert_eq!(persisted(&written), [hash.as_str()]);
    let rv = written["metadata"]["resourceVersion"].as_str().expect("resourceVersion").to_string();
    assert!(migrations(&s, SS).is_empty());

    // With a fresh heartbeat this state would mean "migrated, nothing to do"; stale, it is not trusted.
    s.restart_with(&["--discovery-interval", "30s"]);
    let m = eventually("a migration after the reset", Duration::from_secs(20), || migrations(&s, SS).first().cloned());
    assert_eq!(hash_of(&m), hash);
    let st = eventually("heartbeat renewed", Duration::from_secs(20), || {
        state(&s, SS).filter(|st| heartbeat(st).as_str() > "2021")
    });
    assert_eq!(current(&st), hash);
    // persisted went from [hash] (written above) to ["Unknown"] (the reset) first.
    let (history, _) = persisted_history(&s, SS, &rv);
    assert_eq!(history.first(), Some(&hashes(&[UNKNOWN])), "{history:?}");
    assert!(s.log().contains("persisted storage versions reset to Unknown"), "{}", s.log());
}

/// `migrate --resource` and `--all` against a standalone server (no scheduler, so nothing else creates migrations).
#[test]
fn migrate_command_requests_migrations() {
    let s = Server::start(&["--disable-scheduler"]);
    let hash = shootstates_hash(&s);

    let out = migrate_cli(&s, &["--resource", SS]);
    let first = created_migration(&out);
    let m = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", &first, "-o", "json"]);
    assert!(first.starts_with("shootstates.core.gardener.cloud-"), "{first}");
    assert_eq!(
        m["spec"]["resource"],
        json!({"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"})
    );
    assert_eq!(m["metadata"]["labels"]["migration.k8s.io/resource"], SS);
    assert_eq!(hash_of(&m), hash);
    assert!(m["status"]["conditions"].as_array().is_none_or(|c| c.is_empty()), "{m}");
    // Selectable by label, as users expect.
    let by_label = s.kubectl_ok(&["get", "svm", "-l", &format!("migration.k8s.io/resource={SS}"), "-o", "name"]);
    assert_eq!(by_label.trim(), format!("storageversionmigration.migration.k8s.io/{first}"));

    // --all: the resources served in two or more group-versions here, counted by resource name over all groups as
    // upstream's initializer counts: shootstates (v1alpha1, v1beta1) and storageversionmigrations
    // (migration.k8s.io/v1alpha1, storagemigration.k8s.io/v1 and v1beta1), the latter at its first group in
    // discovery order (storagemigration.k8s.io: highest groupPriorityMinimum). It supersedes the unfinished first one.
    let out = migrate_cli(&s, &["--all", "--target-kubeconfig", s.kubeconfig().to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("storageversionmigration.migration.k8s.io/shootstates.core.gardener.cloud-"),
        "{stdout}"
    );
    assert!(
        lines[1]
            .starts_with("storageversionmigration.migration.k8s.io/storageversionmigrations.storagemigration.k8s.io-"),
        "{stdout}"
    );
    let second = name(migrations(&s, SS).last().expect("second"));
    assert_ne!(second, first);
    let old = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", &first, "-o", "json"]);
    let (reason, message) = condition(&old, "Failed").unwrap_or_else(|| panic!("not superseded: {old}"));
    assert_eq!(reason, "Superseded");
    assert!(message.contains(&second), "{message}");

    // Errors name the problem.
    let out = migrate_cli(&s, &["--resource", "widgets.example.com"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("doesn't have a resource type \"widgets.example.com\""));
    let out = migrate_cli(&s, &[]);
    assert!(!out.status.success(), "one of --resource or --all is required");
}

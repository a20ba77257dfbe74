//! Key rotation with two replicas on one etcd (issue 31, "HA"): one edit of the encryption config on every replica,
//! in any order, is safe. A replica that has the new key first keeps writing with the old one until every live
//! replica reports that it reads the new key; then both write with it, and a rewrite moves every value to it. A
//! replica that dies stops holding the others back once its heartbeat expires (three intervals).
//!
//! "Reloading" here is restarting the replica with the edited file (what every replica does without automatic
//! reload); the replicas' reports, not the way a config is loaded, are what this tests.

mod common;
use common::etcd::Etcd;
use common::shootstates::*;
use common::*;

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const KEY1: &str = "{name: key1, secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=}";
const KEY2: &str = "{name: key2, secret: ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=}";
const SHOOTSTATES: &str = "/registry/core.gardener.cloud/shootstates/";
/// The heartbeat period: a replica's report counts for three of them after its last heartbeat.
const INTERVAL: &str = "2s";

fn write_config(dir: &Path, name: &str, keys: &[&str]) -> PathBuf {
    let providers: String = keys.iter().map(|k| format!("  - aesgcm: {{keys: [{k}]}}\n")).collect();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
             - resources: [shootstates.core.gardener.cloud]\n  providers:\n{providers}"
        ),
    )
    .expect("write config");
    path
}

/// The old config (key1) and the edited one (key2 first, key1 still reading).
struct Configs {
    _dir: tempfile::TempDir,
    old: PathBuf,
    new: PathBuf,
}

fn configs() -> Configs {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = write_config(dir.path(), "old.yaml", &[KEY1]);
    let new = write_config(dir.path(), "new.yaml", &[KEY2, KEY1]);
    Configs { _dir: dir, old, new }
}

fn args(config: &Path) -> Vec<String> {
    let c = config.to_str().expect("path").to_string();
    ["--encryption-provider-config", &c, "--discovery-interval", INTERVAL, "--disable-scheduler"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn replica(etcd: &Etcd, config: &Path) -> Server {
    let a = args(config);
    Server::start_on_etcd(etcd, &a.iter().map(String::as_str).collect::<Vec<_>>())
}

fn reload(s: &mut Server, config: &Path) {
    let a = args(config);
    s.restart_with(&a.iter().map(String::as_str).collect::<Vec<_>>());
}

fn shoot_api(c: &kube::Client) -> Api<DynamicObject> {
    shootstates_api(c, "garden-rot")
}

fn shoot(name: &str) -> DynamicObject {
    objects::dynamic(shootstate("v1beta1", "garden-rot", name, json!({"note": format!("payload of {name}")})))
}

async fn create(s: &Server, name: &str) {
    shoot_api(&s.client().await).create(&PostParams::default(), &shoot(name)).await.expect("create");
}

/// The key each stored ShootState is encrypted with, by object name, straight from etcd.
async fn stored_keys(etcd: &Etcd) -> Vec<(String, String)> {
    let mut c = etcd.client().await;
    let resp = c.get(SHOOTSTATES, Some(etcd_client::GetOptions::new().with_prefix())).await.expect("etcd get");
    resp.kvs()
        .iter()
        .map(|kv| {
            let name = String::from_utf8_lossy(kv.key()).rsplit('/').next().unwrap_or_default().to_string();
            let value = String::from_utf8_lossy(kv.value());
            let key = value.strip_prefix("k8s:enc:aesgcm:v1:").and_then(|r| r.split(':').next()).unwrap_or("other");
            (name, key.to_string())
        })
        .collect()
}

async fn key_of(etcd: &Etcd, name: &str) -> String {
    let keys = stored_keys(etcd).await;
    keys.into_iter().find(|(n, _)| n == name).map(|(_, k)| k).unwrap_or_else(|| panic!("{name} stored"))
}

/// Every ShootState reads through `s`, with its payload.
async fn all_read(s: &Server, names: &[String]) {
    let api = shoot_api(&s.client().await);
    let list = api.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), names.len(), "every object listed");
    for n in names {
        let o = api.get(n).await.unwrap_or_else(|e| panic!("get {n} on {}: {e}", s.url()));
        assert_eq!(o.data["spec"]["gardener"][0]["data"]["note"], format!("payload of {n}"));
    }
}

/// The manual rewrite of kube-apiserver's procedure (`kubectl get -o json | kubectl replace -f -`): values not
/// written with the replica's current write key are rewritten, current ones left alone.
fn rewrite_all(s: &Server) {
    let list = s.kubectl_ok(&["get", "shootstates.core.gardener.cloud", "-A", "-o", "json"]);
    s.kubectl_ok_stdin(&["replace", "-f", "-"], &list);
}

/// Creates probe objects through `s` until one is stored under `key` (within 30 s); how many it took.
async fn until_writes(etcd: &Etcd, s: &Server, key: &str, probe: &str) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut probes = 0;
    loop {
        let name = format!("{probe}-{probes}");
        probes += 1;
        create(s, &name).await;
        if key_of(etcd, &name).await == key {
            return probes;
        }
        assert!(std::time::Instant::now() < deadline, "{} never wrote with {key}", s.url());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn reloaded_on_one_replica_only_every_value_stays_readable_by_both() {
    let (etcd, c) = (Etcd::start(), configs());
    let mut a = replica(&etcd, &c.old);
    let mut b = replica(&etcd, &c.old);
    create(&a, "before").await;
    reload(&mut b, &c.new);
    // b has key2 first, but a cannot read key2: b writes with key1, which both read.
    create(&b, "from-b").await;
    create(&a, "from-a").await;
    // A rolling restart of a with its old config: b never writes key2 meanwhile.
    a.restart();
    create(&b, "from-b-after-a-restarted").await;
    // A rewrite through b leaves key1 values alone: key1 is what b writes with now.
    rewrite_all(&b);
    let names: Vec<String> = stored_keys(&etcd).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    for (name, key) in stored_keys(&etcd).await {
        assert_eq!(key, "key1", "{name} is written with a key a does not read");
    }
    all_read(&a, &names).await;
    all_read(&b, &names).await;
    assert!(b.log().contains("not every live replica reads the configured write key yet"), "{}", b.log());
}

/// Both replicas get the edit, `first` before the other: until the second one has it, every value is under key1;
/// then both write key2 (once the reports of the replaced processes expired), and the rewrite leaves every value
/// under key2, readable by both.
async fn reload_both(first_is_a: bool) {
    let (etcd, c) = (Etcd::start(), configs());
    let mut a = replica(&etcd, &c.old);
    let mut b = replica(&etcd, &c.old);
    create(&a, "old-1").await;
    create(&b, "old-2").await;
    let (first, second) = if first_is_a { (&mut a, &mut b) } else { (&mut b, &mut a) };
    reload(first, &c.new);
    create(first, "after-first").await;
    assert_eq!(key_of(&etcd, "after-first").await, "key1", "the other replica does not read key2 yet");
    reload(second, &c.new);
    until_writes(&etcd, second, "key2", "second").await;
    until_writes(&etcd, first, "key2", "first").await;
    rewrite_all(first);
    for (name, key) in stored_keys(&etcd).await {
        assert_eq!(key, "key2", "{name} still under the old key after the rewrite");
    }
    let names: Vec<String> = stored_keys(&etcd).await.into_iter().map(|(n, _)| n).collect();
    all_read(&a, &names).await;
    all_read(&b, &names).await;
}

#[tokio::test]
async fn reloaded_on_both_a_first_every_value_ends_under_the_new_key() {
    reload_both(true).await;
}

#[tokio::test]
async fn reloaded_on_both_b_first_every_value_ends_under_the_new_key() {
    reload_both(false).await;
}

/// A replica killed with SIGKILL holds the new key back for three intervals after its last heartbeat, then no
/// longer counts.
#[tokio::test]
async fn a_dead_replica_stops_counting_when_its_heartbeat_expires() {
    let (etcd, c) = (Etcd::start(), configs());
    let a = replica(&etcd, &c.new);
    let mut b = replica(&etcd, &c.old);
    // a learns within a second that b (started after it) does not read key2.
    until_writes(&etcd, &a, "key1", "while-b-lives").await;
    b.kill9();
    let killed = std::time::Instant::now();
    until_writes(&etcd, &a, "key2", "after-kill").await;
    // Three 2 s intervals after b's last heartbeat, which was at most one interval before the kill.
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(3), "b stopped counting after only {waited:?}");
}

/// The key-rotation trigger's migrations (its reason annotation), as `<resource>.<group>`.
fn rotation_migrations(s: &Server) -> Vec<String> {
    let list = s.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", "-o", "json"]);
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter(|m| m["metadata"]["annotations"]["migration.k8s.io/reason"] == "encryption write key changed")
        .map(|m| format!("{}.{}", m["spec"]["resource"]["resource"], m["spec"]["resource"]["group"]))
        .collect()
}

fn with_scheduler(config: &Path) -> Vec<String> {
    let c = config.to_str().expect("path").to_string();
    ["--encryption-provider-config", &c, "--discovery-interval", INTERVAL].iter().map(|s| s.to_string()).collect()
}

/// With the scheduler on both replicas: an edit on one replica starts no migration; once both have it, the
/// key-rotation trigger migrates once and every value ends under key2.
#[tokio::test]
async fn the_rotation_runs_once_when_every_replica_writes_the_new_key() {
    let (etcd, c) = (Etcd::start(), configs());
    let start = |config: &Path| {
        let a = with_scheduler(config);
        Server::start_on_etcd(&etcd, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let restart = |s: &mut Server, config: &Path| {
        let a = with_scheduler(config);
        s.restart_with(&a.iter().map(String::as_str).collect::<Vec<_>>());
    };
    let mut a = start(&c.old);
    let mut b = start(&c.old);
    for i in 0..5 {
        create(&a, &format!("obj-{i}")).await;
    }
    eventually("the trigger recorded key1 for shootstates", Duration::from_secs(60), || {
        let out = a.kubectl(&["get", "storagestates", "-o", "json"]);
        String::from_utf8_lossy(&out.stdout).contains("aesgcm:v1:key1").then_some(())
    });
    restart(&mut b, &c.new);
    // Three intervals: the leader's rounds see b's edit and a's lack of it; nothing starts.
    let until = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < until {
        assert!(rotation_migrations(&a).is_empty(), "a rotation started while a cannot read key2");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    restart(&mut a, &c.new);
    let done = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if stored_keys(&etcd).await.iter().all(|(_, k)| k == "key2") {
            break;
        }
        assert!(tokio::time::Instant::now() < done, "not every value under key2: {:?}", stored_keys(&etcd).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(rotation_migrations(&b), ["\"shootstates\".\"core.gardener.cloud\""], "the rotation ran once");
    let names: Vec<String> = stored_keys(&etcd).await.into_iter().map(|(n, _)| n).collect();
    all_read(&a, &names).await;
    all_read(&b, &names).await;
}

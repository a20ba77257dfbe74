//! Backups of the embedded store against the real binary: `POST /storage/snapshots` (with kubectl), scheduled
//! snapshots with retention, `storage snapshot save | ls | verify | restore`, a restore round trip of 10^4 encrypted
//! objects, a snapshot killed with SIGKILL, damaged files refused, a snapshot consistent under 8 writers, and the
//! etcd backend's refusals.

mod common;
use axum::http::Method;
use common::requests::*;
use common::shootstates::*;
use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const NS: &str = "garden-backup";
const PATH: &str = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-backup/shootstates";
const PREFIX: &str = "/registry/core.gardener.cloud/shootstates/garden-backup/";
const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn snapshot_cli(args: &[&str]) -> Output {
    Command::new(BIN).args(["storage", "snapshot"]).args(args).output().expect("run storage snapshot")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `kubectl create --raw /storage/snapshots -f /dev/null`: the snapshot's JSON.
fn take_snapshot(s: &Server) -> Value {
    let out = s.kubectl_ok(&["create", "--raw", "/storage/snapshots", "-f", "/dev/null"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The snapshot files (final names) in `dir`.
fn listed(dir: &Path) -> Vec<String> {
    let out = snapshot_cli(&["ls", "--snapshot-dir", dir.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| l.split(' ').next().unwrap_or("").to_string())
        .collect()
}

/// Creates `n` ShootStates `s-<i>` (32 at a time); their resourceVersions by name.
async fn create_many(c: &kube::Client, n: usize) -> BTreeMap<String, u64> {
    futures::stream::iter(0..n)
        .map(|i| {
            let c = c.clone();
            let body = shootstate("v1beta1", NS, &format!("s-{i:05}"), json!({"index": i})).to_string();
            async move {
                let r = call(&c, Method::POST, PATH, &[("content-type", "application/json")], body.into_bytes()).await;
                let o = r.ok(201);
                (o["metadata"]["name"].as_str().expect("name").to_string(), rv_of(&o))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

fn rv_of(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("resourceVersion")
}

/// name -> (resourceVersion, spec) of every ShootState of the namespace, as the API lists them.
async fn listed_objects(c: &kube::Client) -> BTreeMap<String, (u64, Value)> {
    let list = get(c, PATH).await.ok(200);
    let items = list["items"].as_array().expect("items");
    items
        .iter()
        .map(|o| (o["metadata"]["name"].as_str().expect("name").to_string(), (rv_of(o), o["spec"].clone())))
        .collect()
}

fn encryption_config(dir: &Path) -> String {
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [\"{SHOOTSTATES}\"]\n  \
         providers:\n  - aesgcm:\n      keys:\n      - name: key1\n        secret: {KEY1}\n"
    );
    let path = dir.join("encryption.yaml");
    std::fs::write(&path, yaml).expect("write config");
    path.display().to_string()
}

/// Replaces `s`'s (stopped) data directory with a restore of `snapshot`; the old one moves to `old-data`.
fn restore_in_place(s: &Server, snapshot: &Path) -> Value {
    let old = s.dir.join("old-data");
    let moved = old.join(snapshot.strip_prefix(s.data_dir()).expect("under the data dir"));
    std::fs::rename(s.data_dir(), &old).expect("move the data dir");
    let out =
        snapshot_cli(&["restore", moved.to_str().expect("utf-8"), "--data-dir", s.data_dir().to_str().expect("utf-8")]);
    assert!(out.status.success(), "restore: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("restore JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_of_10k_encrypted_objects_keeps_keys_values_and_revisions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = encryption_config(tmp.path());
    let mut s = Server::start(&["--encryption-provider-config", &config]);
    let c = s.client().await;
    create_many(&c, 10_000).await;
    let before = listed_objects(&c).await;
    assert_eq!(before.len(), 10_000);
    let snap = take_snapshot(&s);
    let revision = snap["revision"].as_u64().expect("revision");
    assert_eq!(revision, before.values().map(|(rv, _)| *rv).max().expect("objects"), "{snap}");
    // Written after the snapshot: not in the restored store.
    post(&c, PATH, &shootstate("v1beta1", NS, "later", json!({}))).await.ok(201);
    s.stop();

    let snapshot = s.data_dir().join("snapshots").join(snap["name"].as_str().expect("name"));
    let verified = snapshot_cli(&["verify", snapshot.to_str().expect("utf-8")]);
    assert!(verified.status.success(), "{}", stderr(&verified));
    let restored = restore_in_place(&s, &snapshot);
    assert_eq!((restored["revision"].as_u64(), &restored["checksum"]), (Some(revision), &snap["checksum"]));
    // Values are as they were stored: encrypted with key1, at the same revisions, with no config given.
    let inspected = s.storage_inspect(&["--prefix", PREFIX]);
    let items = inspected["items"].as_array().expect("items");
    assert_eq!(items.len(), 10_000);
    for e in items {
        assert_eq!(e["encryption"], "aesgcm:v1:key1", "{e}");
        let name = e["key"].as_str().expect("key").trim_start_matches(PREFIX);
        assert_eq!(e["revision"].as_u64(), Some(before[name].0), "{e}");
    }
    s.restart();
    let c = s.client().await;
    assert_eq!(listed_objects(&c).await, before, "the same objects, values and resourceVersions");
    let next = post(&c, PATH, &shootstate("v1beta1", NS, "after-restore", json!({}))).await.ok(201);
    assert_eq!(rv_of(&next), revision + 1, "the revision goes on from the snapshot's");
    too_large_resource_version(&s.client_without_retries().await, revision + 1000, revision + 1).await;
    watch_from_the_future(&c, revision + 1).await;
}

/// A resourceVersion the (restored) store has not reached: LIST with resourceVersionMatch=NotOlderThan waits, then
/// answers kube-apiserver's 504 (k8s.io/apiserver storage.NewTooLargeResourceVersionError).
async fn too_large_resource_version(c: &kube::Client, rv: u64, current: u64) {
    let r = get(c, &format!("{PATH}?resourceVersion={rv}&resourceVersionMatch=NotOlderThan")).await;
    let st = r.status_err(504, "Timeout");
    assert_eq!(st["message"], format!("Too large resource version: {rv}, current: {current}"), "{st}");
    assert_eq!(st["details"]["causes"][0]["reason"], "ResourceVersionTooLarge", "{st}");
    assert_eq!(st["details"]["retryAfterSeconds"], 1, "{st}");
    // A watch whose initial events wait for it: 200 with that Status as its one ERROR event (the cacher's errWatcher).
    let watch = format!(
        "{PATH}?watch=true&resourceVersion={rv}&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
    );
    let r = get(c, &watch).await;
    let event: Value = serde_json::from_str(r.text().lines().next().unwrap_or("")).expect("one event");
    assert_eq!((r.status, &event["type"]), (200, &json!("ERROR")), "{}", r.text());
    assert_eq!(event["object"]["code"], 504, "{event}");
    assert_eq!(event["object"]["message"], format!("Too large resource version: {rv}, current: {current}"));
    assert_eq!(r.text().lines().count(), 1, "{}", r.text());
}

/// A plain watch from a resourceVersion the store has not reached opens and waits, as kube-apiserver's does
/// ("clients can wait for events"): it gets the events after that resourceVersion once the store gets there.
async fn watch_from_the_future(c: &kube::Client, current: u64) {
    let path = format!("{PATH}?watch=true&resourceVersion={}", current + 1);
    let resp = c.send(request(Method::GET, &path, &[], Vec::new())).await.expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.into_body();
    for name in ["future-1", "future-2"] {
        post(c, PATH, &shootstate("v1beta1", NS, name, json!({}))).await.ok(201);
    }
    let frame = tokio::time::timeout(Duration::from_secs(20), http_body_util::BodyExt::frame(&mut body))
        .await
        .expect("an event")
        .expect("a frame")
        .expect("data");
    let event: Value = serde_json::from_slice(frame.data_ref().expect("data")).expect("event");
    assert_eq!(
        (&event["type"], &event["object"]["metadata"]["name"]),
        (&json!("ADDED"), &json!("future-2")),
        "{event}"
    );
    assert_eq!(rv_of(&event["object"]), current + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_snapshots_are_refused_with_a_clear_message() {
    let mut s = Server::start(&[]);
    let c = s.client().await;
    create_many(&c, 20).await;
    let snap = take_snapshot(&s);
    s.stop();
    let good = std::fs::read(s.data_dir().join("snapshots").join(snap["name"].as_str().expect("name"))).expect("read");
    let dir = s.dir.join("damaged");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut corrupted = good.clone();
    corrupted[good.len() - 40] ^= 0x01;
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("truncated.snap", good[..good.len() / 2].to_vec(), "truncated snapshot"),
        ("corrupted.snap", corrupted, "checksum mismatch: the snapshot is corrupted"),
        (
            "store.redb",
            std::fs::read(s.data_dir().join("store.redb")).expect("redb"),
            "not a migration-apiserver snapshot",
        ),
    ];
    for (name, bytes, why) in cases {
        let file = dir.join(name);
        std::fs::write(&file, bytes).expect("write");
        let out = snapshot_cli(&["verify", file.to_str().expect("utf-8")]);
        assert!(!out.status.success() && stderr(&out).contains(why), "verify {name}: {}", stderr(&out));
        let target = s.dir.join(format!("restore-{name}"));
        let out =
            snapshot_cli(&["restore", file.to_str().expect("utf-8"), "--data-dir", target.to_str().expect("utf-8")]);
        assert!(!out.status.success(), "restore {name} succeeded");
        assert!(stderr(&out).contains("refusing to restore") && stderr(&out).contains(why), "{name}: {}", stderr(&out));
        assert!(!target.exists(), "a refused restore leaves no directory");
    }
    // A directory that is not empty is refused too, and left as it was.
    let good_file = dir.join("good.snap");
    std::fs::write(&good_file, &good).expect("write");
    let out = snapshot_cli(&[
        "restore",
        good_file.to_str().expect("utf-8"),
        "--data-dir",
        s.data_dir().to_str().expect("utf-8"),
    ]);
    assert!(!out.status.success() && stderr(&out).contains("is not empty"), "{}", stderr(&out));
    s.restart();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_snapshots_keep_the_newest_of_the_retention() {
    let mut s = Server::start(&["--snapshot-interval", "300ms", "--snapshot-retention", "2"]);
    let dir = s.data_dir().join("snapshots");
    // Scheduled snapshots, logged one by one; retention leaves the newest two.
    let log = eventually("five scheduled snapshots", Duration::from_secs(30), || {
        let log = s.log();
        (log.matches("trigger=\"scheduled\"").count() >= 5).then_some(log)
    });
    assert!(log.contains("old storage snapshots removed"), "{log}");
    let names = listed(&dir);
    assert_eq!(names.len(), 2, "{names:?}");
    let metrics = s.kubectl_ok(&["get", "--raw", "/metrics"]);
    assert!(metrics.contains("migration_apiserver_storage_snapshot_failures_total 0"), "{metrics}");
    assert!(metrics.contains("migration_apiserver_storage_snapshot_interval_seconds 0.3"), "{metrics}");
    // On-demand snapshots count in the retention as well (restarted without the schedule, so that only they write).
    s.restart_with(&["--snapshot-retention", "2"]);
    let names: Vec<String> = (0..3).map(|_| take_snapshot(&s)["name"].as_str().expect("name").to_string()).collect();
    assert_eq!(listed(&dir), names[1..].to_vec());
    // At start the newest snapshot in the directory is the last one's time: a restart is no missing backup.
    s.restart_with(&["--snapshot-retention", "2"]);
    let metrics = s.kubectl_ok(&["get", "--raw", "/metrics"]);
    let last = metrics
        .lines()
        .find_map(|l| l.strip_prefix("migration_apiserver_storage_snapshot_last_success_timestamp_seconds "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the timestamp");
    assert!(last > 1.7e9, "{metrics}");
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_offline_refuses_a_running_server_and_the_etcd_backend_refuses_snapshots() {
    let mut s = Server::start(&[]);
    let data = s.data_dir();
    let out = snapshot_cli(&["save", "--data-dir", data.to_str().expect("utf-8")]);
    assert!(
        !out.status.success() && stderr(&out).contains("in use by a running server; stop it first"),
        "{}",
        stderr(&out)
    );
    s.stop();
    let out = snapshot_cli(&["save", "--data-dir", data.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listed(&data.join("snapshots")), vec![saved["name"].as_str().expect("name").to_string()]);

    // On etcd: the flags are refused at start, and POST /storage/snapshots answers 405.
    let etcd = etcd::Etcd::start();
    let out = Command::new(BIN)
        .args(["serve", "--etcd-servers", &etcd.endpoint, "--snapshot-interval", "1h", "--data-dir"])
        .arg(s.dir.join("unused"))
        .output()
        .expect("serve");
    assert!(!out.status.success(), "started");
    assert!(stderr(&out).contains("--snapshot-interval applies to the embedded store only"), "{}", stderr(&out));
    let e = Server::start_on_etcd(&etcd, &[]);
    let c = e.client().await;
    let r = call(&c, Method::POST, "/storage/snapshots", &[], Vec::new()).await;
    let st = r.status_err(405, "MethodNotAllowed");
    assert!(st["message"].as_str().unwrap_or("").contains("etcdctl snapshot save"), "{st}");
}

/// Fills the (stopped) server's store with `n` values of `size` bytes under a prefix nothing serves, straight
/// through the storage layer: a store large enough for a snapshot to take a while.
async fn fill_store(s: &Server, n: usize, size: usize) {
    use migration_apiserver::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
    use migration_apiserver::storage::Storage;
    let store = EmbeddedStorage::open(&s.data_dir(), EmbeddedOptions::default()).expect("open the store");
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            let value = bytes::Bytes::from(vec![b'a' + (i % 26) as u8; size]);
            async move { store.create(&format!("/bulk/{i:06}"), value).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    assert!(results.iter().all(|r| r.is_ok()), "fill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_killed_with_sigkill_leaves_no_complete_file() {
    let mut s = Server::start(&[]);
    s.stop();
    fill_store(&s, 2000, 64 * 1024).await;
    s.restart();
    let dir = s.data_dir().join("snapshots");
    let mut request = Command::new("kubectl")
        .args(["--kubeconfig", s.kubeconfig().to_str().expect("utf-8"), "create", "--raw", "/storage/snapshots"])
        .args(["-f", "/dev/null"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl");
    // The temporary file appears as soon as the snapshot starts writing; the server dies while it does.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let temp = loop {
        // Polled every millisecond: the snapshot of this store takes far longer.
        let found = std::fs::read_dir(&dir).into_iter().flatten().filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(".snapshot-") && n.ends_with(".tmp"))
        });
        match found {
            Some(path) => break path,
            None if std::time::Instant::now() > deadline => panic!("no temporary file in 30 s: {}", s.log()),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    s.kill9();
    let _ = request.wait();
    assert!(temp.exists(), "the snapshot finished before the kill: make the store larger");
    assert_eq!(listed(&dir), Vec::<String>::new(), "no snapshot is listed");
    let visible: Vec<_> = std::fs::read_dir(&dir).expect("dir").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert!(visible.iter().all(|n| n.to_string_lossy().starts_with('.')), "only hidden files: {visible:?}");
    let out = snapshot_cli(&["verify", temp.to_str().expect("utf-8")]);
    assert!(!out.status.success(), "the partial file verified");
    // The server starts as before, removes the leftover, and takes a good snapshot.
    s.restart();
    assert!(!temp.exists(), "the temporary file is removed at start");
    let snap = take_snapshot(&s);
    assert_eq!(snap["objects"], 2000, "{snap}");
    let out = snapshot_cli(&["verify", dir.join(snap["name"].as_str().expect("name")).to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// One writer: creates its own objects one after the other, and patches its first one every third write, until
/// `stop`; every acknowledged (name, resourceVersion).
async fn writer(c: kube::Client, w: usize, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Vec<(String, u64)> {
    let mut acked = Vec::new();
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let o = if n % 3 == 2 {
            let patch = json!({"spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"n": n}}]}});
            merge_patch(&c, &format!("{PATH}/w{w}-0"), &patch).await.ok(200)
        } else {
            post(&c, PATH, &shootstate("v1beta1", NS, &format!("w{w}-{n}"), json!({"n": n}))).await.ok(201)
        };
        acked.push((o["metadata"]["name"].as_str().expect("name").to_string(), rv_of(&o)));
        n += 1;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_under_8_writers_holds_one_revision() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8).map(|w| tokio::spawn(writer(c.clone(), w, stop.clone()))).collect();
    // Writes before, during and after the snapshot.
    let rv_now = |min: u64| {
        let c = c.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let rv = rv_of(&get(&c, &format!("{PATH}?limit=1")).await.ok(200));
                if rv >= min {
                    return rv;
                }
                assert!(tokio::time::Instant::now() < deadline, "the writers did not reach revision {min} in 60 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let started = rv_now(200).await;
    let snap = call(&c, Method::POST, "/storage/snapshots", &[], Vec::new()).await.ok(201);
    let revision = snap["revision"].as_u64().expect("revision");
    rv_now(revision + 200).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    assert!(started >= 200 && acked.iter().any(|(_, rv)| *rv > revision + 100), "writes went on around the snapshot");
    // Every object as of the snapshot's revision: its last write at or before it, none after.
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (name, rv) in acked.iter().filter(|(_, rv)| *rv <= revision) {
        let e = expected.entry(name.clone()).or_default();
        *e = (*e).max(*rv);
    }
    let restored = s.dir.join("restored");
    let file = s.data_dir().join("snapshots").join(snap["name"].as_str().expect("name"));
    let out =
        snapshot_cli(&["restore", file.to_str().expect("utf-8"), "--data-dir", restored.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = Command::new(BIN)
        .args(["storage", "inspect", "-o", "json", "--prefix", PREFIX, "--data-dir"])
        .arg(&restored)
        .output()
        .expect("inspect");
    let inspected: Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    let got: BTreeMap<String, u64> = inspected["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| {
            (
                e["key"].as_str().expect("key").trim_start_matches(PREFIX).to_string(),
                e["revision"].as_u64().expect("rv"),
            )
        })
        .collect();
    assert_eq!(got, expected, "the snapshot at revision {revision}");
}

/// `curl` of `POST /storage/snapshots` with a bearer token: the HTTP code and the body.
fn post_with_token(s: &Server, token: &str) -> (u16, Value) {
    let out = Command::new("curl")
        .args(["-sS", "-X", "POST", "-w", "\n%{http_code}", "--cacert"])
        .arg(s.cert_dir().join("ca.crt"))
        .args(["-H", &format!("Authorization: Bearer {token}"), &format!("{}/storage/snapshots", s.url())])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.trim_end().rsplit_once('\n').unwrap_or_else(|| panic!("curl: {text} {}", stderr(&out)));
    (code.parse().expect("code"), serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_authorized_as_a_non_resource_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "dave-token,dave,uid-dave,\"devs\"\nroot-token,root,uid-root,\"system:masters\"\n")
        .expect("tokens");
    let s = Server::start(&["--token-auth-file", tokens.to_str().expect("utf-8")]);
    // Standalone only system:masters may: verb post on the path, as kube-apiserver names a non-resource request.
    let (code, st) = post_with_token(&s, "dave-token");
    assert_eq!((code, &st["reason"]), (403, &json!("Forbidden")), "{st}");
    assert_eq!(st["message"], "forbidden: User \"dave\" cannot post path \"/storage/snapshots\"", "{st}");
    assert!(listed(&s.data_dir().join("snapshots")).is_empty());
    let (code, snap) = post_with_token(&s, "root-token");
    assert_eq!(code, 201, "{snap}");
    assert_eq!(listed(&s.data_dir().join("snapshots")), vec![snap["name"].as_str().expect("name").to_string()]);
}

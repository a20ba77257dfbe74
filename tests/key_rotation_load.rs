//! Issue 31's "Rotation under load": 10^4 ShootStates encrypted with key1, 8 writers and 8 readers (the `kube`
//! crate, no client-side retries) running from before key2 is put first by a reload until after the StorageState
//! shows the rotation Finished. No request fails except update conflicts (409 Conflict on a stale
//! resourceVersion, retried by re-reading). While the migration still runs, a reload that drops key1 is refused
//! (counted as a failed reload, logged with the key and its number of values) and the load keeps succeeding;
//! afterwards one that drops key2 is refused the same way, and one that drops key1 is accepted; `storage inspect
//! --summary` shows every value under key2.

mod common;
use common::shootstates::*;
use common::*;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const NS: &str = "garden-load";
const RELOADS: &str = "apiserver_encryption_config_controller_automatic_reloads_total";
const CONFIG_INFO: &str = "apiserver_encryption_config_controller_last_config_info";
/// The ShootStates created before the rotation (`s0` .. `s9999`); the writers update them and never delete them.
const TOTAL: usize = 10_000;
const WRITERS: usize = 8;
const READERS: usize = 8;
/// The pace of each worker: one operation (a GET, a LIST page or two, a write with its read) per period. Paced
/// so that the debug-build server, sharing two cores with the load and the test itself, still migrates 10^4
/// objects in well under a minute; 16 workers at this pace are some 200 requests/s.
const WORKER_PERIOD: Duration = Duration::from_millis(100);
/// Concurrent creates while filling the store.
const CREATE_CONCURRENCY: usize = 32;
/// The rotation's migration: chunks of 100 at most 1000 requests/s (one per rewritten object) takes at least
/// 10 s for 10^4 objects (in practice, in a debug build under the load, several times that), so the reload that
/// drops key1 (checked within a second or two of the write) surely lands while it runs.
const FLAGS: &[&str] = &[
    "--encryption-provider-config-automatic-reload",
    "--discovery-interval",
    "1s",
    "--key-rotation-interval",
    "1s",
    "--migration-chunk-size",
    "100",
    "--migration-qps",
    "1000",
    "--migration-burst",
    "1",
];
const DEADLINE: Duration = Duration::from_secs(30);
/// The whole rotation under the load.
const ROTATION_DEADLINE: Duration = Duration::from_secs(120);

/// ShootStates written with the aesgcm keys `keys` (the first writes).
fn config(keys: &[(&str, &str)]) -> String {
    let keys: String = keys.iter().map(|(n, s)| format!("      - name: {n}\n        secret: {s}\n")).collect();
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [{SHOOTSTATES}]\n  providers:\n  - aesgcm:\n      keys:\n{keys}"
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the config");
}

fn shootstates(c: &kube::Client) -> Api<DynamicObject> {
    shootstates_api(c, NS)
}

fn numbered(name: &str, n: u64) -> DynamicObject {
    objects::dynamic(shootstate("v1beta1", NS, name, json!({"n": n})))
}

async fn create_all(api: &Api<DynamicObject>) {
    futures::stream::iter(0..TOTAL)
        .map(|i| async move {
            let name = format!("s{i}");
            api.create(&PostParams::default(), &numbered(&name, 0)).await.unwrap_or_else(|e| panic!("{name}: {e}"))
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .for_each(|_| async {})
        .await;
}

/// What one worker did: requests and non-conflict errors per kind of request, conflicts, successful writes.
#[derive(Default)]
struct WorkerStats {
    requests: Mutex<BTreeMap<&'static str, u64>>,
    errors: Mutex<Vec<String>>,
    conflicts: AtomicU64,
    writes_ok: AtomicU64,
}

impl WorkerStats {
    /// Counts one request of `kind`; a write conflict only where `conflict_allowed`; anything else is an error.
    fn record<T>(&self, kind: &'static str, result: &Result<T, kube::Error>, conflict_allowed: bool) -> Outcome {
        *self.requests.lock().expect("stats").entry(kind).or_default() += 1;
        match result {
            Ok(_) => {
                if kind != "get" && kind != "list" {
                    self.writes_ok.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Ok
            }
            Err(kube::Error::Api(s)) if conflict_allowed && s.code == 409 && s.reason == "Conflict" => {
                self.conflicts.fetch_add(1, Ordering::Relaxed);
                Outcome::Conflict
            }
            Err(e) => {
                self.errors.lock().expect("stats").push(format!("{kind}: {e:?}"));
                Outcome::Failed
            }
        }
    }

    fn total(&self) -> u64 {
        self.requests.lock().expect("stats").values().sum()
    }
}

#[derive(PartialEq)]
enum Outcome {
    Ok,
    Conflict,
    Failed,
}

/// A small deterministic generator of indexes (each worker its own sequence).
struct Lcg(u64);
impl Lcg {
    fn index(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

/// One tick per [`WORKER_PERIOD`]; a late operation delays the next ticks rather than bunching them.
fn paced() -> tokio::time::Interval {
    let mut pace = tokio::time::interval(WORKER_PERIOD);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pace
}

/// Reads `name`, changes its data and writes it back with its resourceVersion; on a conflict, reads again and
/// writes again.
async fn update(api: &Api<DynamicObject>, stats: &WorkerStats, name: &str, n: u64) {
    for _ in 0..20 {
        let got = api.get(name).await;
        if stats.record("get", &got, false) != Outcome::Ok {
            return;
        }
        let Ok(mut obj) = got else { return };
        obj.data["spec"]["gardener"][0]["data"] = json!({"n": n});
        let put = api.replace(name, &PostParams::default(), &obj).await;
        if stats.record("update", &put, true) != Outcome::Conflict {
            return;
        }
    }
    stats.errors.lock().expect("stats").push(format!("update {name}: conflicts 20 times in a row"));
}

/// Updates and patches the pre-existing ShootStates, creates its own and deletes some of those, until `stop`.
async fn writer(api: Api<DynamicObject>, id: usize, stats: Arc<WorkerStats>, stop: Arc<AtomicBool>) {
    let mut rng = Lcg(id as u64 + 1);
    let mut created: Vec<String> = Vec::new();
    let mut k: u64 = 0;
    let mut pace = paced();
    while !stop.load(Ordering::Relaxed) {
        pace.tick().await;
        k += 1;
        let name = format!("s{}", rng.index(TOTAL));
        match k % 4 {
            0 | 1 => update(&api, &stats, &name, k).await,
            2 => {
                let patch = json!({"metadata": {"labels": {"writer": format!("w{id}-{k}")}}});
                let r = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                stats.record("patch", &r, false);
            }
            _ => {
                let own = format!("w{id}-{k}");
                let r = api.create(&PostParams::default(), &numbered(&own, k)).await;
                if stats.record("create", &r, false) == Outcome::Ok {
                    created.push(own);
                }
                // Every other create, delete one of this writer's own (no other worker touches them).
                if k % 8 == 7 && created.len() > 1 {
                    let gone = created.remove(0);
                    let r = api.delete(&gone, &Default::default()).await;
                    stats.record("delete", &r, false);
                }
            }
        }
    }
}

/// GETs pre-existing ShootStates and LISTs pages of 50 (following a continue token now and then), until `stop`.
async fn reader(api: Api<DynamicObject>, id: usize, stats: Arc<WorkerStats>, stop: Arc<AtomicBool>) {
    let mut rng = Lcg(1000 + id as u64);
    let mut k: u64 = 0;
    let mut pace = paced();
    while !stop.load(Ordering::Relaxed) {
        pace.tick().await;
        k += 1;
        if k.is_multiple_of(2) {
            let r = api.get(&format!("s{}", rng.index(TOTAL))).await;
            stats.record("get", &r, false);
            continue;
        }
        let page = api.list(&ListParams::default().limit(50)).await;
        let token = page.as_ref().ok().and_then(|l| l.metadata.continue_.clone());
        if stats.record("list", &page, false) == Outcome::Ok && k % 4 == 1 {
            let next = api.list(&ListParams::default().limit(50).continue_token(&token.unwrap_or_default())).await;
            stats.record("list", &next, false);
        }
    }
}

/// Looks at the server through a `kube` client while the test thread polls (a kubectl per poll would cost the
/// load more CPU than the request itself).
struct Probe<'a> {
    rt: &'a tokio::runtime::Runtime,
    client: kube::Client,
}

impl Probe<'_> {
    fn get(&self, path: &str) -> requests::Resp {
        let resp = self.rt.block_on(requests::get(&self.client, path));
        assert_eq!(resp.status, 200, "GET {path}: {}", resp.text());
        resp
    }

    fn storage_state(&self) -> Value {
        self.get(&format!("/apis/migration.k8s.io/v1alpha1/storagestates/{SHOOTSTATES}")).json()
    }

    /// The StorageState's rotation field once its write key is `key`.
    fn rotation(&self, key: &str) -> Option<String> {
        let st = self.storage_state();
        (st["status"]["encryptionWriteKey"] == key)
            .then(|| st["status"]["encryptionKeyRotation"].as_str().map(String::from))?
    }

    /// The hash of the config in use (`apiserver_encryption_config_controller_last_config_info`'s label).
    fn config_hash(&self) -> String {
        let metrics = self.get("/metrics").text();
        let line = metrics.lines().find(|l| l.starts_with(&format!("{CONFIG_INFO}{{"))).expect("the config info");
        let labels = line.split_once('{').and_then(|(_, rest)| rest.split_once('}')).map(|(l, _)| l).unwrap_or("");
        let hash = labels.split(',').find_map(|l| l.strip_prefix("hash=")).unwrap_or_else(|| panic!("{line}"));
        hash.trim_matches('"').to_string()
    }

    /// Sum of the automatic reloads counted with `status` (`success` or `failure`).
    fn reloads(&self, status: &str) -> u64 {
        let metrics = self.get("/metrics").text();
        let label = format!("status=\"{status}\"");
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{RELOADS}{{")) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

/// Rewrites the config while serving and waits until the reload is accepted.
fn reload_accepted(p: &Probe, path: &Path, text: &str) {
    let before = p.reloads("success");
    write(path, text);
    eventually("the reload accepted", DEADLINE, || (p.reloads("success") > before).then_some(()));
}

/// Rewrites the config while serving, waits until the reload is counted as failed and the log names `key` as
/// still in use; returns the number of values the log gives for it.
fn reload_refused(s: &Server, p: &Probe, path: &Path, text: &str, key: &str) -> u64 {
    let (before, log_from) = (p.reloads("failure"), s.log().len());
    write(path, text);
    let naming = format!("key \"{key}\" still encrypts ");
    eventually(&format!("the reload dropping {key} refused"), DEADLINE, || {
        let log = s.log();
        let at = log[log_from..].find(&naming)? + log_from + naming.len();
        let values: String = log[at..].chars().take_while(char::is_ascii_digit).collect();
        let named = log[at..].starts_with(&format!("{values} stored values of {SHOOTSTATES}"));
        (named && p.reloads("failure") > before).then(|| values.parse().expect("a count"))
    })
}

/// The 8 writers and 8 readers, running on `rt` until [`Load::finish`].
struct Load {
    stop: Arc<AtomicBool>,
    writers: Vec<Arc<WorkerStats>>,
    readers: Vec<Arc<WorkerStats>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(rt: &tokio::runtime::Runtime, api: &Api<DynamicObject>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = || Arc::new(WorkerStats::default());
        let (writers, readers): (Vec<_>, Vec<_>) =
            ((0..WRITERS).map(|_| stats()).collect(), (0..READERS).map(|_| stats()).collect());
        let mut tasks = Vec::new();
        for (id, w) in writers.iter().enumerate() {
            tasks.push(rt.spawn(writer(api.clone(), id, w.clone(), stop.clone())));
        }
        for (id, r) in readers.iter().enumerate() {
            tasks.push(rt.spawn(reader(api.clone(), id, r.clone(), stop.clone())));
        }
        Load { stop, writers, readers, tasks }
    }

    /// The successful writes of each writer so far.
    fn writes_ok(&self) -> Vec<u64> {
        self.writers.iter().map(|w| w.writes_ok.load(Ordering::Relaxed)).collect()
    }

    /// Waits until every writer has written successfully since `then` ([`Self::writes_ok`]).
    fn wait_writes_since(&self, what: &str, then: &[u64]) {
        eventually(what, DEADLINE, || self.writes_ok().iter().zip(then).all(|(now, then)| now > then).then_some(()));
    }

    /// Stops the workers, waits for them, and asserts that every one made requests and none failed except by
    /// write conflicts; returns a summary line.
    fn finish(self, rt: &tokio::runtime::Runtime) -> String {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            rt.block_on(t).expect("worker task");
        }
        check_workers(&self.writers, &self.readers)
    }
}

/// Asserts that every worker made requests and none failed except by write conflicts; returns a summary line.
fn check_workers(writers: &[Arc<WorkerStats>], readers: &[Arc<WorkerStats>]) -> String {
    let mut by_kind: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (i, w) in writers.iter().chain(readers).enumerate() {
        let errors = w.errors.lock().expect("stats");
        assert!(errors.is_empty(), "worker {i}: {} failed requests, first: {:?}", errors.len(), errors.first());
        assert!(w.total() > 0, "worker {i} made no request");
        for (kind, n) in w.requests.lock().expect("stats").iter() {
            *by_kind.entry(kind).or_default() += n;
        }
    }
    let conflicts: u64 = writers.iter().map(|w| w.conflicts.load(Ordering::Relaxed)).sum();
    format!("requests {by_kind:?}, update conflicts {conflicts}")
}

#[test]
fn rotation_under_load_fails_no_request_and_refuses_dropping_a_key_in_use() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("enc.yaml");
    let (only_key1, key2_first, only_key2) =
        (config(&[("key1", KEY1)]), config(&[("key2", KEY2), ("key1", KEY1)]), config(&[("key2", KEY2)]));
    write(&path, &only_key1);
    let mut args = vec!["--encryption-provider-config", path.to_str().expect("utf-8")];
    args.extend_from_slice(FLAGS);
    let mut s = Server::start(&args);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    let client = rt.block_on(s.client_without_retries());
    let api = shootstates(&client);
    let probe = Probe { rt: &rt, client: client.clone() };
    rt.block_on(create_all(&shootstates(&rt.block_on(s.client()))));
    eprintln!("{TOTAL} ShootStates created in {:?}", started.elapsed());
    eventually("key1 recorded", DEADLINE, || (probe.rotation("aesgcm:v1:key1")? == "Finished").then_some(()));

    // The load starts before the write key changes.
    let load = Load::start(&rt, &api);
    eventually("every worker busy", DEADLINE, || {
        load.writers.iter().chain(&load.readers).all(|w| w.total() > 0).then_some(())
    });
    reload_accepted(&probe, &path, &key2_first);
    let (rotation_started, key2_hash) = (Instant::now(), probe.config_hash());
    eventually("Rotating to key2", DEADLINE, || (probe.rotation("aesgcm:v1:key2")? == "Rotating").then_some(()));
    let writes_at_rotating = load.writes_ok();

    // Dropping key1 while values still use it: refused, the config in use stays, the rotation is still running,
    // and the load goes on succeeding.
    let key1_values = reload_refused(&s, &probe, &path, &only_key2, "aesgcm:v1:key1");
    assert_eq!(probe.rotation("aesgcm:v1:key2").as_deref(), Some("Rotating"), "the refusal came after the rotation");
    assert!(key1_values > 0 && key1_values <= TOTAL as u64, "{key1_values} values under key1");
    assert_eq!(probe.config_hash(), key2_hash);
    load.wait_writes_since("writes after the refusal", &load.writes_ok());
    // The file as the config in use (same bytes): nothing to reload, the rotation goes on.
    write(&path, &key2_first);

    eventually("Finished with key2", ROTATION_DEADLINE, || {
        (probe.rotation("aesgcm:v1:key2")? == "Finished").then_some(())
    });
    let writes_at_finished = load.writes_ok();
    eprintln!("rotation of {TOTAL}+ ShootStates under the load: {:?}", rotation_started.elapsed());
    // The load runs on a little after Finished, then stops.
    load.wait_writes_since("writes after Finished", &writes_at_finished);
    let summary = load.finish(&rt);
    for (i, (then, now)) in writes_at_rotating.iter().zip(&writes_at_finished).enumerate() {
        assert!(now > then, "writer {i} wrote nothing while Rotating ({then} then, {now} at Finished)");
    }
    eprintln!("load: {summary}; key1 refused with {key1_values} values; after {:?}", started.elapsed());
    after_finished(&mut s, &probe, &api, &path);
}

/// Once the rotation is Finished and the load stopped: every live ShootState under key2 (the StorageState, then
/// `storage inspect --summary`); a reload dropping key2 is refused, naming every live value, one dropping key1 is
/// accepted.
fn after_finished(s: &mut Server, probe: &Probe, api: &Api<DynamicObject>, path: &Path) {
    let live = probe.rt.block_on(api.list(&ListParams::default())).expect("list").items.len() as u64;
    assert!(live >= TOTAL as u64, "{live} live ShootStates");
    let st = probe.storage_state();
    assert_eq!(st["status"]["persistedEncryptionKeys"], json!(["aesgcm:v1:key2"]), "{st}");
    // Dropping key2 afterwards: refused, naming key2 and every live value.
    let (only_key1, in_use) = (config(&[("key1", KEY1)]), probe.config_hash());
    assert_eq!(reload_refused(s, probe, path, &only_key1, "aesgcm:v1:key2"), live);
    assert_eq!(probe.config_hash(), in_use);
    s.kubectl_ok(&["get", "shootstate", "-n", NS, "s0"]);
    // Dropping key1 afterwards: accepted, everything still reads.
    reload_accepted(probe, path, &config(&[("key2", KEY2)]));
    assert_eq!(probe.rt.block_on(api.list(&ListParams::default())).expect("list").items.len() as u64, live);

    s.stop();
    let inspected = s.storage_inspect(&["--summary", "--encryption-provider-config", path.to_str().expect("utf-8")]);
    let rows: Vec<Value> = inspected["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["resource"] == SHOOTSTATES)
        .map(|r| json!([r["provider"], r["key"], r["values"]]))
        .collect();
    assert_eq!(rows, [json!(["aesgcm", "key2", live])], "{inspected}");
}

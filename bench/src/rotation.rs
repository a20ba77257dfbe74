//! Key rotation (issue 31): a rotation of the encryption write key migrates the server's own store, next to a
//! storage-version migration of the same objects on the same server, and GET latency during a rotation; then the
//! same rotation on a KMS v2 key_id change ([`super::kms`]).

use super::*;
use anyhow::{bail, Context};
use base64::Engine;
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SHOOTSTATES: &str = "shootstates.core.gardener.cloud";
/// The annotation value of the migrations the key-rotation trigger requests.
const ROTATION_REASON: &str = "encryption write key changed";
/// Connections of the GET load, idle and during the rotation: a few clients reading while the store is rewritten.
pub(super) const GET_CONNS: usize = 4;
/// Each GET connection sends one request per period (4 x 250/s = 1,000 GET/s), idle and during the rotation: a
/// latency measurement at the same offered load, not a throughput one. A closed loop would saturate both cores
/// by itself, so its p99 would measure the queue, not what a reader sees (see BENCHMARKS.md).
pub(super) const GET_PERIOD: Duration = Duration::from_millis(4);
/// The rate limit of the third rotation, next to the unlimited one: 1,000 objects/s (100 times the default
/// --migration-qps), 10^5 objects in under 2 minutes.
const LIMITED_QPS: &str = "1000";
/// The request number that stops the background GET load's workers (they stop at their `limit`).
const STOP_LOAD: u64 = 1 << 62;

/// The rows of the `rotation` group: the storage-version migration, the key rotation with its ratio to it, and GET
/// p50/p99 idle and during a second rotation. 10^5 ShootStates (--quick: 10^4).
pub(super) async fn rotation_rows(bin: &Path, quick: bool, duration: Duration) -> Vec<Row> {
    let n: u64 = if quick { 10_000 } else { 100_000 };
    let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-rot-{}", std::process::id()));
    let mut rows = rotation(bin, n, duration, &dir)
        .await
        .unwrap_or_else(|e| vec![Row::failed(format!("key rotation of 10^{} objects", n.ilog10()), e)]);
    // The same rotation when a KMS v2 plugin's key_id changes (issue 39), next to the aesgcm rotation's rate.
    let kms = kms_rotation_row(bin, n, &dir, rows.get(1)).await;
    rows.push(kms.unwrap_or_else(|e| {
        Row::failed(format!("key rotation of 10^{} ShootStates on a KMS v2 key_id change", n.ilog10()), e)
    }));
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// The EncryptionConfiguration file of ShootStates, aesgcm with the named keys (the first one writes).
struct KeyConfig {
    path: PathBuf,
    keys: Vec<(String, String)>,
}

impl KeyConfig {
    /// Four fresh random keys, key1 alone in the file.
    fn new(dir: &Path) -> anyhow::Result<KeyConfig> {
        std::fs::create_dir_all(dir)?;
        let mut keys = Vec::new();
        for name in ["key1", "key2", "key3", "key4"] {
            let mut key = [0u8; 32];
            use std::io::Read;
            std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
            keys.push((name.to_string(), base64::engine::general_purpose::STANDARD.encode(key)));
        }
        let config = KeyConfig { path: dir.join("encryption-config.yaml"), keys };
        config.write(&["key1"])?;
        Ok(config)
    }

    /// Writes the file with `names` in this order: the first one writes.
    fn write(&self, names: &[&str]) -> anyhow::Result<()> {
        let mut yaml = format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
             - resources: [{SHOOTSTATES}]\n  providers:\n  - aesgcm:\n      keys:\n"
        );
        for name in names {
            let (_, secret) = self.keys.iter().find(|(n, _)| n == name).context("unknown key name")?;
            yaml += &format!("      - name: {name}\n        secret: {secret}\n");
        }
        // Written whole, then renamed: the server's reload never reads half a file.
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &self.path)?;
        Ok(())
    }
}

/// One server (embedded store, scheduler and triggers on, automatic reload, --migration-qps 0) with `n` ShootStates
/// written as v1alpha1 under key1. First the storage-version trigger migrates them to v1beta1 (restart with the new
/// --storage-version), then the key-rotation trigger to key2 (key2 put first in the file); both rates from the
/// migrator's own start-to-Succeeded time. Then GET idle, and GET during a second rotation (key3 first).
async fn rotation(bin: &Path, n: u64, duration: Duration, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let config = KeyConfig::new(dir)?;
    let config_arg = config.path.to_string_lossy().into_owned();
    let args = |version: &str, qps: &str| {
        let version = format!("{SHOOTSTATES}={version}");
        let flags = ["--encryption-provider-config-automatic-reload", "--migration-qps", qps, "--storage-version"];
        let mut args = vec!["--encryption-provider-config".to_string(), config_arg.clone()];
        args.extend(flags.iter().map(|f| f.to_string()).chain([version]));
        args
    };
    let (v1alpha1, v1beta1, limited) = (args("v1alpha1", "0"), args("v1beta1", "0"), args("v1beta1", LIMITED_QPS));
    let v1alpha1: Vec<&str> = v1alpha1.iter().map(String::as_str).collect();
    let v1beta1: Vec<&str> = v1beta1.iter().map(String::as_str).collect();
    let limited: Vec<&str> = limited.iter().map(String::as_str).collect();
    let (mut server, target) = ServerProcess::start(bin, &v1alpha1).await?;
    eprintln!("bench: rotation: storing {n} ShootStates under key1");
    let seed = run_load(&target, None, 64, None, n, shoot_state_creates(0, "")).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    wait_rotation(&target, &mut server, "aesgcm:v1:key1", None).await?;

    let sv_row = storage_version_row(&mut server, &target, &v1beta1, &config, n).await?;
    let target = server.restart(&v1beta1).await?;
    wait_rotation(&target, &mut server, "aesgcm:v1:key1", None).await?;
    let rotation_row = rotation_row(&mut server, &target, &config, n, &sv_row).await?;
    let get_rows = get_rows(&mut server, &target, &config, n, duration, &limited).await?;
    Ok([sv_row, rotation_row].into_iter().chain(get_rows).collect())
}

/// Restarted with `v1beta1` (a new --storage-version), the storage-version trigger migrates the `n` ShootStates;
/// the server is stopped afterwards and `storage inspect` checks them.
async fn storage_version_row(
    server: &mut ServerProcess,
    target: &Target,
    v1beta1: &[&str],
    config: &KeyConfig,
    n: u64,
) -> anyhow::Result<Row> {
    eprintln!("bench: rotation: storage-version migration of {n} ShootStates (v1alpha1 -> v1beta1)");
    let before = shootstate_migrations(target).await?;
    let target = server.restart(v1beta1).await?;
    let (name, status) = wait_new_migration(&target, server, &before).await?;
    check_migrated(&status, n)?;
    let seconds = migrator_seconds(server, &name)?;
    // The trigger records the new version as persisted after the migration: stopped before that, the restart would
    // migrate again, beside the rotation.
    wait_state(&target, server, "the new storage version persisted", |status| {
        let current = status["currentStorageVersionHash"].as_str()?;
        (status["persistedStorageVersionHashes"] == serde_json::json!([current])).then_some(Ok(()))
    })
    .await?;
    server.stop().await?;
    check_stored(&server.bin, &server.data_dir(), &config.path, n, "v1beta1", "aesgcm:v1:key1")?;
    let rate = n as f64 / seconds;
    Ok(Row {
        scenario: format!("storage-version migration of 10^{} ShootStates, aesgcm (--migration-qps 0)", n.ilog10()),
        rps: thousands(rate),
        notes: format!(
            "objects/s; v1alpha1 -> v1beta1 by the storage-version trigger after a restart, by the server's own \
             scheduler; {} objects in {seconds:.1} s (the migrator's start to Succeeded); afterwards storage \
             inspect: all {} v1beta1 under key1",
            thousands(n as f64),
            thousands(n as f64)
        ),
        rps_v: Some(rate),
        ..Row::default()
    })
}

/// key2 put first in the file while serving: the key-rotation trigger migrates the `n` ShootStates; the row's
/// target is its rate against `sv_row`'s.
async fn rotation_row(
    server: &mut ServerProcess,
    target: &Target,
    config: &KeyConfig,
    n: u64,
    sv_row: &Row,
) -> anyhow::Result<Row> {
    eprintln!("bench: rotation: key rotation of {n} ShootStates (key1 -> key2)");
    let rotated = rotate(target, server, config, &["key2", "key1"], "aesgcm:v1:key2", n).await?;
    let rate = n as f64 / rotated.seconds;
    let ratio = rate / sv_row.rps_v.unwrap_or(f64::NAN);
    Ok(Row {
        scenario: format!("key rotation of 10^{} ShootStates, aesgcm key1 -> key2 (--migration-qps 0)", n.ilog10()),
        rps: thousands(rate),
        target: Goal::MinRatio(0.8).show(Some(ratio)),
        notes: format!(
            "objects/s x{ratio:.2} of the storage-version migration's; key2 put first in the file while serving, the \
             key-rotation trigger's migration by the server's own scheduler: {} objects in {:.1} s (the migrator's \
             start to Succeeded); from the file write: Succeeded after {:.1} s, StorageState Finished after {:.1} s \
             with encryptionKeyCounts {}",
            thousands(n as f64),
            rotated.seconds,
            rotated.succeeded_after.as_secs_f64(),
            rotated.finished_after.as_secs_f64(),
            rotated.counts,
        ),
        rps_v: Some(rate),
        ..Row::default()
    })
}

/// GET of the ShootStates idle, then during a second rotation (key3 first, unlimited) and, restarted with
/// `limited` (--migration-qps [`LIMITED_QPS`]), during a third (key4 first); afterwards, the server stopped,
/// `storage inspect` finds every value under key4.
async fn get_rows(
    server: &mut ServerProcess,
    target: &Target,
    config: &KeyConfig,
    n: u64,
    duration: Duration,
    limited: &[&str],
) -> anyhow::Result<Vec<Row>> {
    let rate = GET_CONNS as f64 / GET_PERIOD.as_secs_f64();
    eprintln!("bench: rotation: ShootState GET idle ({} GET/s, {duration:?})", thousands(rate));
    let idle = BackgroundLoad::start(target, Some(server.child.id()), GET_CONNS, shootstate_gets(n));
    tokio::time::sleep(duration).await;
    let idle = idle.finish().await;
    let idle_name =
        format!("ShootState GET at {} GET/s, idle (the same server, 10^{} stored)", thousands(rate), n.ilog10());
    let idle_row = idle.row(&idle_name, GET_CONNS, Goal::None, "");
    let unlimited =
        get_during_rotation(server, target, config, n, &idle, ["key3", "key2"], "--migration-qps 0").await?;
    let target = server.restart(limited).await?;
    wait_rotation(&target, server, "aesgcm:v1:key3", None).await?;
    let qps = format!("--migration-qps {LIMITED_QPS}");
    let mut limited = get_during_rotation(server, &target, config, n, &idle, ["key4", "key3"], &qps).await?;
    server.stop().await?;
    check_stored(&server.bin, &server.data_dir(), &config.path, n, "v1beta1", "aesgcm:v1:key4")?;
    limited.notes += &format!("; afterwards storage inspect: all {} under key4", thousands(n as f64));
    Ok(vec![idle_row, unlimited, limited])
}

/// The GET row during a rotation to `keys[0]` (`keys` the file's keys, the first writes) with the migration
/// flags `flags`; its target: p99 <= 2x `idle`'s.
async fn get_during_rotation(
    server: &mut ServerProcess,
    target: &Target,
    config: &KeyConfig,
    n: u64,
    idle: &Load,
    keys: [&str; 2],
    flags: &str,
) -> anyhow::Result<Row> {
    let rate = GET_CONNS as f64 / GET_PERIOD.as_secs_f64();
    eprintln!("bench: rotation: ShootState GET during a key rotation ({} -> {}, {flags})", keys[1], keys[0]);
    let load = BackgroundLoad::start(target, Some(server.child.id()), GET_CONNS, shootstate_gets(n));
    let write_key = format!("aesgcm:v1:{}", keys[0]);
    let during = rotate(target, server, config, &keys, &write_key, n).await;
    let load = load.finish().await;
    let during = during?;
    let name = format!("ShootState GET at {} GET/s during a key rotation ({flags})", thousands(rate));
    let mut row = load.row(&name, GET_CONNS, Goal::None, "");
    let p99_ratio = match (row.p99_v, pct_f(&idle.stats.samples, 0.99)) {
        (Some(d), i) if i > 0.0 => d / i,
        _ => bail!("no GET answered idle or during the rotation"),
    };
    let met = if p99_ratio <= 2.0 { "met" } else { "**missed**" };
    row.target = format!("p99 <= 2x idle: {met}");
    row.notes = format!(
        "p99 x{p99_ratio:.2} of idle's, p50 x{:.2}; during the rotation {} -> {} of {} objects ({:.1} s, {} \
         objects/s with this load); {}",
        pct_f(&load.stats.samples, 0.5) / pct_f(&idle.stats.samples, 0.5),
        keys[1],
        keys[0],
        thousands(n as f64),
        during.seconds,
        thousands(n as f64 / during.seconds),
        row.notes
    );
    Ok(row)
}

/// What a rotation took: the migrator's seconds, and from the file write to Succeeded and to Finished.
struct Rotated {
    seconds: f64,
    succeeded_after: Duration,
    finished_after: Duration,
    counts: String,
}

/// Writes the config with `names` (the first writes), waits for the key-rotation trigger's migration to succeed
/// and for the StorageState to show the rotation Finished with every value under `write_key`.
async fn rotate(
    target: &Target,
    server: &mut ServerProcess,
    config: &KeyConfig,
    names: &[&str],
    write_key: &str,
    n: u64,
) -> anyhow::Result<Rotated> {
    let before = shootstate_migrations(target).await?;
    let written = Instant::now();
    config.write(names)?;
    let (name, status) = wait_new_migration(target, server, &before).await?;
    let succeeded_after = written.elapsed();
    check_migrated(&status, n)?;
    let migration: Value =
        serde_json::from_slice(&target.call_ok(&Req::get(format!("{API}/storageversionmigrations/{name}"))).await?)?;
    if migration["metadata"]["annotations"]["migration.k8s.io/reason"] != ROTATION_REASON {
        bail!(
            "the migration {name} after the key change was not the key-rotation trigger's: {}",
            migration["metadata"]
        );
    }
    let state = wait_rotation(target, server, write_key, Some(n)).await?;
    Ok(Rotated {
        seconds: migrator_seconds(server, &name)?,
        succeeded_after,
        finished_after: written.elapsed(),
        counts: state["status"]["encryptionKeyCounts"].to_string(),
    })
}

/// Waits until the ShootStates' StorageState shows the rotation to `write_key` Finished (and, with `n`, exactly
/// `n` values counted, all under that key); returns the StorageState.
pub(super) async fn wait_rotation(
    target: &Target,
    server: &mut ServerProcess,
    write_key: &str,
    n: Option<u64>,
) -> anyhow::Result<Value> {
    let what = format!("the rotation to {write_key} Finished");
    wait_state(target, server, &what, |status| {
        if status["encryptionWriteKey"] != write_key {
            return None;
        }
        let counts = status["encryptionKeyCounts"].as_array().cloned().unwrap_or_default();
        match status["encryptionKeyRotation"].as_str() {
            Some("Incomplete") => Some(Err(anyhow::anyhow!("the rotation to {write_key} is Incomplete: {status}"))),
            Some("Finished") => match n {
                Some(n) if counts.len() != 1 || counts[0]["key"] != write_key || counts[0]["values"] != n => {
                    Some(Err(anyhow::anyhow!(
                        "the rotation to {write_key} Finished with encryptionKeyCounts {counts:?}, not all {n}"
                    )))
                }
                _ => Some(Ok(())),
            },
            _ => None,
        }
    })
    .await
}

/// Polls the ShootStates' StorageState until `done` says so from its status (or fails); returns the StorageState.
pub(super) async fn wait_state(
    target: &Target,
    server: &mut ServerProcess,
    what: &str,
    done: impl Fn(&Value) -> Option<anyhow::Result<()>>,
) -> anyhow::Result<Value> {
    let started = Instant::now();
    let mut conn = target.connect().await?;
    loop {
        // Not found until the storage-version trigger's first round has created it.
        let (code, body) = conn.call(&Req::get(format!("{API}/storagestates/{SHOOTSTATES}"))).await?;
        let state: Value = match code.as_u16() {
            404 => Value::Null,
            _ if code.is_success() => serde_json::from_slice(&body)?,
            _ => bail!("GET the StorageState of ShootStates: {code}: {}", String::from_utf8_lossy(&body)),
        };
        match done(&state["status"]) {
            Some(Ok(())) => return Ok(state),
            Some(Err(e)) => return Err(e),
            None => {}
        }
        if let Some(exit) = server.exited() {
            bail!("the server exited while waiting for {what} ({exit})");
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("the StorageState did not show {what} within 15 min: {}", state["status"]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The names of the StorageVersionMigrations of ShootStates.
pub(super) async fn shootstate_migrations(target: &Target) -> anyhow::Result<HashSet<String>> {
    let list: Value =
        serde_json::from_slice(&target.call_ok(&Req::get(format!("{API}/storageversionmigrations"))).await?)?;
    let items = list["items"].as_array().context("a list of storageversionmigrations without items")?;
    Ok(items
        .iter()
        .filter(|m| m["spec"]["resource"]["resource"] == "shootstates")
        .filter_map(|m| m["metadata"]["name"].as_str().map(String::from))
        .collect())
}

/// Waits for a StorageVersionMigration of ShootStates not in `before` to succeed; its name and status.
pub(super) async fn wait_new_migration(
    target: &Target,
    server: &mut ServerProcess,
    before: &HashSet<String>,
) -> anyhow::Result<(String, Value)> {
    let started = Instant::now();
    let mut conn = target.connect().await?;
    loop {
        let list: Value =
            serde_json::from_slice(&conn.call_ok(&Req::get(format!("{API}/storageversionmigrations"))).await?)?;
        let new = list["items"].as_array().into_iter().flatten().filter(|m| {
            m["spec"]["resource"]["resource"] == "shootstates"
                && m["metadata"]["name"].as_str().is_some_and(|name| !before.contains(name))
        });
        for m in new {
            let name = m["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let condition = |t: &str| {
                m["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
            };
            if condition("Failed") {
                bail!("the migration {name} failed: {}", m["status"]);
            }
            if condition("Succeeded") {
                return Ok((name, m["status"].clone()));
            }
        }
        if let Some(exit) = server.exited() {
            bail!("the server exited during the migration ({exit})");
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("no new migration of ShootStates succeeded within 15 min");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) fn check_migrated(status: &Value, n: u64) -> anyhow::Result<()> {
    if status["migratedObjects"] != n {
        bail!("the migration succeeded with migratedObjects {} instead of {n}", status["migratedObjects"]);
    }
    Ok(())
}

/// The migrator's own time from the migration's start to Succeeded: the `seconds` of its "migration ended" log line
/// (finer than the conditions' timestamps, which have whole seconds).
pub(super) fn migrator_seconds(server: &ServerProcess, migration: &str) -> anyhow::Result<f64> {
    let log = std::fs::read_to_string(server.dir.join("server.log"))?;
    let line = log
        .lines()
        .rfind(|l| l.contains("migration ended") && l.contains(migration))
        .with_context(|| format!("no \"migration ended\" line of {migration} in the server's log"))?;
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("seconds=")?.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .with_context(|| format!("no seconds in the log line {line:?}"))
}

/// `storage inspect` (the server stopped, the config to decrypt): exactly `n` ShootStates, all stored as `version`
/// under `encryption`.
fn check_stored(
    bin: &Path,
    data_dir: &Path,
    config: &Path,
    n: u64,
    version: &str,
    encryption: &str,
) -> anyhow::Result<()> {
    let inspect = Command::new(bin)
        .args(["storage", "inspect", "-o", "json", "--encryption-provider-config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data_dir)
        .output()?;
    if !inspect.status.success() {
        bail!("storage inspect: {}", String::from_utf8_lossy(&inspect.stderr));
    }
    let all: Value = serde_json::from_slice(&inspect.stdout).context("storage inspect -o json")?;
    let items = all["items"].as_array().context("storage inspect -o json has no items")?;
    let ours: Vec<&Value> =
        items.iter().filter(|e| e["key"].as_str().is_some_and(|k| k.starts_with(SHOOTSTATE_KEYS))).collect();
    let api_version = format!("core.gardener.cloud/{version}");
    let right = ours.iter().filter(|e| e["apiVersion"] == api_version && e["encryption"] == encryption).count();
    if right as u64 != n || ours.len() as u64 != n {
        bail!(
            "storage inspect: {right} of {} stored ShootStates are {version} under {encryption} (expected all {n})",
            ours.len()
        );
    }
    Ok(())
}

/// GETs (v1beta1) of the ShootStates numbered below `n`, in turn.
pub(super) fn shootstate_gets(n: u64) -> MakeReq {
    Arc::new(move |i| {
        let (ns, name) = shoot_state_id(i % n);
        Req::get(format!("{SHOOTSTATES_V1BETA1}/namespaces/{ns}/shootstates/{name}"))
    })
}

/// Load at a fixed rate ([`GET_PERIOD`] per connection) that runs until `finish` (for as long as something else
/// takes).
pub(super) struct BackgroundLoad {
    next: Arc<AtomicU64>,
    workers: Vec<tokio::task::JoinHandle<Stats>>,
    started: Instant,
    cpu0: CpuTicks,
    pid: Option<u32>,
}

impl BackgroundLoad {
    pub(super) fn start(target: &Target, pid: Option<u32>, conns: usize, make: MakeReq) -> BackgroundLoad {
        let next = Arc::new(AtomicU64::new(0));
        let cpu0 = CpuTicks::now(pid);
        let workers =
            (0..conns).map(|_| tokio::spawn(paced_worker(target.clone(), next.clone(), make.clone()))).collect();
        BackgroundLoad { next, workers, started: Instant::now(), cpu0, pid }
    }

    /// Closed-loop load instead: each connection sends its next request as soon as the last one is answered.
    pub(super) fn start_closed(target: &Target, pid: Option<u32>, conns: usize, make: MakeReq) -> BackgroundLoad {
        let next = Arc::new(AtomicU64::new(0));
        let cpu0 = CpuTicks::now(pid);
        let workers = (0..conns)
            .map(|_| tokio::spawn(worker(target.clone(), next.clone(), STOP_LOAD, None, make.clone(), None)))
            .collect();
        BackgroundLoad { next, workers, started: Instant::now(), cpu0, pid }
    }

    /// Stops the workers (their next request number is past their limit) and merges what they measured.
    pub(super) async fn finish(self) -> Load {
        self.next.store(STOP_LOAD, Ordering::Relaxed);
        let mut stats = Stats::default();
        for w in self.workers {
            match w.await {
                Ok(s) => stats.merge(s),
                Err(e) => stats.error(format!("worker: {e}"), None),
            }
        }
        let elapsed = self.started.elapsed();
        stats.samples.sort_unstable();
        Load { stats, elapsed, cpu: self.cpu0.usage_since(self.pid, elapsed) }
    }
}

/// One connection sending one request every [`GET_PERIOD`] until the request number reaches [`STOP_LOAD`]. A
/// request held up by the previous answer counts from when it was due, so that a slow answer also counts for the
/// requests it delayed (no coordinated omission); any other from when it was sent (not the timer's own lateness).
async fn paced_worker(target: Target, next: Arc<AtomicU64>, make: MakeReq) -> Stats {
    let mut stats = Stats::default();
    let mut conn: Option<LeanConn> = None;
    let mut tick = tokio::time::interval(GET_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut previous_answer: Option<tokio::time::Instant> = None;
    loop {
        let due = tick.tick().await;
        let sent = tokio::time::Instant::now();
        let start = if previous_answer.is_some_and(|a| a > due) { due } else { sent };
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= STOP_LOAD {
            break;
        }
        let c = match reuse_or_connect(&mut conn, &target).await {
            Ok(c) => c,
            Err(e) => {
                stats.error(format!("connect: {e:#}"), None);
                break;
            }
        };
        let answer = c.call(&make(i)).await;
        previous_answer = Some(tokio::time::Instant::now());
        if c.closed {
            conn = None;
        }
        match answer {
            Ok((status, _)) if status.is_success() => {
                stats.ok += 1;
                stats.samples.push(micros(start.elapsed()));
            }
            Ok((status, body)) => stats.refused(status, &body),
            Err(e) => {
                stats.error(format!("{e:#}"), None);
                conn = None;
            }
        }
    }
    stats
}

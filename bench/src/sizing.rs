//! The load group's sizing rows (BENCHMARKS.md, "Sizing the Deployment"): the memory of the server that the
//! unpaginated LIST rows filled with 10^4 ShootStates of 100 KiB (10^3 with --quick), step by step, with the
//! Deployment's defaults where the step allows: (a) right after the CREATEs; (b) restarted, idle; a paged LIST as
//! `kubectl get shootstates -A` makes it, (c) as JSON and (d) as a Table; a storage-version migration of the
//! ShootStates requested by the admin, (e) unthrottled and (f) at the default rate for at most
//! [`DEFAULT_RATE_FOR`] (the new binary only). VmRSS and VmHWM from `/proc/<pid>/status`: VmHWM is reset before a
//! step measured alone on a running server, and a restarted step's peak is its new process's. The steps run under
//! a [`Watchdog`] at [`SIZING_KILL_KIB`].

use super::*;
use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The watchdog's level during the sizing steps: far above every peak expected (a page of 500 objects, 50 MiB,
/// or a migration's chunk of 500), so that only a server gone wrong is killed.
const SIZING_KILL_KIB: u64 = 4 * 1024 * 1024;
/// kubectl's `--chunk-size` default.
const PAGE: u64 = 500;
const PAGED_TIMEOUT: Duration = Duration::from_secs(600);
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(900);
/// Step f stops watching the default-rate migration after this long (its label in [`STEPS`] says so).
const DEFAULT_RATE_FOR: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
const WATCHDOG_PERIOD: Duration = Duration::from_millis(50);
/// Without it the scheduler's trigger, whose first round this is (the server ran without a scheduler so far, so no
/// StorageState exists), would request a migration of every resource itself and supersede the admin's.
const NO_TRIGGER: &str = "--disable-trigger";
const UNTHROTTLED: [&str; 3] = ["--migration-adaptive=false", "--migration-qps", "0"];

/// The steps: what the rows say, and whether the baseline runs it.
const STEPS: [(&str, bool); 6] = [
    ("a: created (16 connections)", true),
    ("b: restarted (default flags, --disable-scheduler), idle before any request", true),
    ("c: paged LIST as `kubectl get shootstates -A -o json` (limit=500 and its continue tokens, JSON)", true),
    ("d: paged LIST as `kubectl get shootstates -A` (limit=500 and its continue tokens, Table)", true),
    (
        "e: restarted with the scheduler (--disable-trigger --migration-adaptive=false --migration-qps 0), a \
         storage-version migration of them requested by the admin, to Succeeded",
        true,
    ),
    (
        "f: restarted with the scheduler at the default rate (--disable-trigger), a storage-version migration \
         requested by the admin, at most 60 s",
        false,
    ),
];

/// One step's readings (KiB), or what the row says instead (`failed: ...`, `skipped: ...`).
pub(super) type Sizing = Vec<Result<Reading, String>>;

pub(super) struct Reading {
    /// VmRSS at the end of the step.
    rss: Option<u64>,
    /// The step's peak: VmHWM, or the watchdog's highest VmRSS when higher.
    hwm: Option<u64>,
    /// The VmRSS the growth is counted from, and what it was.
    base: Option<(u64, &'static str)>,
    took: Duration,
    detail: String,
}

/// Step a, read right after the CREATEs of `n` objects that took `took`: `empty` the VmRSS of the server when it
/// became ready, before them.
pub(super) fn sizing_created(pid: u32, empty: Option<u64>, took: Duration, n: u64) -> Result<Reading, String> {
    let bytes = n * big_shoot_state("garden", "s-000000").to_string().len() as u64;
    Ok(Reading {
        rss: rss_kib(pid),
        hwm: hwm_kib(pid),
        base: empty.map(|e| (e, "the empty server's VmRSS at /readyz")),
        took,
        detail: format!("{:.0} MiB of JSON created", bytes as f64 / (1024.0 * 1024.0)),
    })
}

/// Steps b to f on `server`, which step a found filled with `n` ShootStates; `new`: the new binary, which runs f.
pub(super) async fn sizing_steps(sizing: &mut Sizing, server: &mut ServerProcess, n: u64, new: bool) {
    let label = if new { "new" } else { "baseline" };
    let step = |i: usize| eprintln!("bench: load: {label}: sizing step {}", STEPS[i].0);
    step(1);
    let admin = match idle(server).await {
        Ok((reading, admin)) => {
            sizing.push(Ok(reading));
            admin
        }
        Err(e) => {
            sizing.push(Err(format!("failed: {e:#}")));
            return;
        }
    };
    for (i, accept, note) in [(2, JSON, ""), (3, TABLE, AFTER_C)] {
        step(i);
        sizing.push(paged(server, &admin, accept, n, note).await.map_err(|e| format!("failed: {e:#}")));
    }
    step(4);
    sizing.push(migration(server, n, &UNTHROTTLED, "bench-sizing-unthrottled", None).await);
    if new {
        step(5);
        sizing.push(migration(server, n, &[], "bench-sizing-default-rate", Some(DEFAULT_RATE_FOR)).await);
    }
}

/// Step b: restarted with the Deployment's flags and without the scheduler, as row 1's server ran.
async fn idle(server: &mut ServerProcess) -> anyhow::Result<(Reading, Target)> {
    let started = Instant::now();
    let admin = server.restart(&["--disable-scheduler"]).await?;
    let took = started.elapsed();
    // A fixed settle time, as the migration rows' before their idle reading: the start-up's tasks have ended.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = server.child.id();
    let reading = Reading {
        rss: Some(rss_kib(pid).context("no VmRSS")?),
        hwm: hwm_kib(pid),
        base: None,
        took,
        detail: "the time is the restart's (stop, start, /readyz); read 1 s after /readyz".into(),
    };
    Ok((reading, admin))
}

/// A page of a LIST (`items`) or of a Table (`rows`): its objects counted, none kept.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    metadata: PageMeta,
    items: Option<Vec<IgnoredAny>>,
    rows: Option<Vec<IgnoredAny>>,
}

#[derive(Deserialize, Default)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    next: String,
}

/// Step d runs on the process of step c.
const AFTER_C: &str =
    "; on step c's process: what c freed and the allocator kept is in VmRSS before, not in the growth";

/// Steps c and d: every page of [`PAGE`] ShootStates in all namespaces, in `accept`, on one connection as kubectl
/// does, with VmHWM reset before.
async fn paged(
    server: &mut ServerProcess,
    admin: &Target,
    accept: &'static str,
    n: u64,
    note: &str,
) -> anyhow::Result<Reading> {
    let pid = server.child.id();
    reset_hwm(pid).context("resetting VmHWM")?;
    let before = rss_kib(pid).context("no VmRSS")?;
    let watchdog = Watchdog::start(pid, SIZING_KILL_KIB);
    let started = Instant::now();
    let listed = tokio::time::timeout(PAGED_TIMEOUT, list_pages(admin, accept)).await;
    let took = started.elapsed();
    let watched = watchdog.finish().await;
    killed(server, &watched)?;
    let hwm = hwm_kib(pid).context("no VmHWM")?.max(watched.peak);
    let (pages, count, bytes) = listed.map_err(|_| anyhow!("not read to its end within {PAGED_TIMEOUT:?}"))??;
    if count != n {
        bail!("{count} objects in {pages} pages, not {n}");
    }
    let mib_read = bytes as f64 / (1024.0 * 1024.0);
    Ok(Reading {
        rss: rss_kib(pid),
        hwm: Some(hwm),
        base: Some((before, "VmRSS before")),
        took,
        detail: format!("{pages} pages, {} objects, {mib_read:.1} MiB read{note}", thousands(count as f64)),
    })
}

/// Pages, objects and bytes of a paged LIST of the ShootStates in all namespaces.
async fn list_pages(admin: &Target, accept: &'static str) -> anyhow::Result<(u64, u64, u64)> {
    let mut conn = admin.connect().await?;
    let (mut pages, mut count, mut bytes, mut next) = (0u64, 0u64, 0u64, String::new());
    loop {
        let mut path = format!("{SHOOTSTATES_V1BETA1}/shootstates?limit={PAGE}");
        if !next.is_empty() {
            path += &format!("&continue={}", query_escape(&next));
        }
        let body = conn.call_ok(&Req::get(path).accept(accept)).await.with_context(|| format!("page {}", pages + 1))?;
        let page: Page = serde_json::from_slice(&body).with_context(|| format!("page {}", pages + 1))?;
        pages += 1;
        bytes += body.len() as u64;
        count += page.items.or(page.rows).with_context(|| format!("page {pages} has no items or rows"))?.len() as u64;
        if page.metadata.next.is_empty() {
            return Ok((pages, count, bytes));
        }
        next = page.metadata.next;
    }
}

/// `s` as a URL query value: every byte but the unreserved ones percent-encoded.
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Steps e and f: restarted with the scheduler, without its trigger and with `flags`, the admin requests a
/// migration `name` of the ShootStates; its peak from the restart (the new process's VmHWM) to Succeeded, or to
/// `within` when given.
async fn migration(
    server: &mut ServerProcess,
    n: u64,
    flags: &[&str],
    name: &str,
    within: Option<Duration>,
) -> Result<Reading, String> {
    let mut args = vec![NO_TRIGGER];
    args.extend(flags);
    let reading = async {
        let target = server.restart(&args).await?;
        let pid = server.child.id();
        let watchdog = Watchdog::start(pid, SIZING_KILL_KIB);
        let ready = rss_kib(pid).context("no VmRSS")?;
        let started = Instant::now();
        let waited = migrate(&target, name, within).await;
        let took = started.elapsed();
        let watched = watchdog.finish().await;
        killed(server, &watched)?;
        if let Some(exit) = server.exited() {
            bail!("the server exited during the migration ({exit})");
        }
        let hwm = hwm_kib(pid).context("no VmHWM")?.max(watched.peak);
        let migrated = waited?;
        let detail = match migrated {
            Migrated::Succeeded(count) if count == n => {
                let own = migrator_seconds(server, name).map_or("?".into(), |s| format!("{s:.1}"));
                format!(
                    "Succeeded, {} objects ({} objects/s); the migrator's own time {own} s",
                    thousands(n as f64),
                    thousands(n as f64 / took.as_secs_f64())
                )
            }
            Migrated::Succeeded(count) => bail!("the migration succeeded with migratedObjects {count} instead of {n}"),
            Migrated::Running(count) => format!(
                "{} of {} objects migrated in {:.0} s (status.migratedObjects, saved every 2 s), then no longer watched",
                thousands(count as f64),
                thousands(n as f64),
                took.as_secs_f64()
            ),
        };
        Ok(Reading {
            rss: rss_kib(pid),
            hwm: Some(hwm),
            base: Some((ready, "VmRSS at /readyz after the restart")),
            took,
            detail: format!("peak since the restart; {detail}"),
        })
    };
    reading.await.map_err(|e: anyhow::Error| format!("failed: {e:#}"))
}

enum Migrated {
    /// Succeeded, with its migratedObjects.
    Succeeded(u64),
    /// Still running after `within`, with its migratedObjects so far.
    Running(u64),
}

/// Creates the StorageVersionMigration `name` of the ShootStates and polls it until it succeeds (or `within`).
async fn migrate(admin: &Target, name: &str, within: Option<Duration>) -> anyhow::Result<Migrated> {
    let svm = serde_json::json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name, "labels": {"migration.k8s.io/resource": "shootstates.core.gardener.cloud"}},
        "spec": {"resource": {"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"}},
    });
    let started = Instant::now();
    let mut conn = admin.connect().await?;
    conn.call_ok(&Req::post(format!("{API}/storageversionmigrations"), Bytes::from(svm.to_string()))).await?;
    loop {
        let body = conn.call_ok(&Req::get(format!("{API}/storageversionmigrations/{name}"))).await?;
        let svm: serde_json::Value = serde_json::from_slice(&body)?;
        let status = &svm["status"];
        let condition = |t: &str| {
            status["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
        };
        let migrated = status["migratedObjects"].as_u64().unwrap_or(0);
        if condition("Failed") {
            bail!("the migration failed: {status}");
        }
        if condition("Succeeded") {
            return Ok(Migrated::Succeeded(migrated));
        }
        if within.is_some_and(|w| started.elapsed() >= w) {
            return Ok(Migrated::Running(migrated));
        }
        if started.elapsed() > MIGRATION_TIMEOUT {
            bail!("the migration did not succeed within {MIGRATION_TIMEOUT:?}: {status}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// An error when the watchdog killed the server (then reaped, and marked stopped: not a death of its own).
fn killed(server: &mut ServerProcess, watched: &Watched) -> anyhow::Result<()> {
    let Some((after, rss)) = watched.killed else { return Ok(()) };
    server.stopped = true;
    let _ = server.child.wait();
    bail!("VmRSS {} after {:.1} s: killed by the bench above {}", mib(rss), after.as_secs_f64(), mib(SIZING_KILL_KIB))
}

/// The rows: each step of the new binary, and of the baseline after it when given.
pub(super) fn sizing_rows(n: u64, new: &Sizing, old: Option<&Sizing>) -> Vec<Row> {
    let size = format!("10^{} ShootStates of 100 KiB", n.ilog10());
    let mut rows = Vec::new();
    for (i, (step, baseline_too)) in STEPS.iter().enumerate() {
        let scenario = format!("sizing, {size}, step {step}");
        let letter = &step[..1];
        let mut row = sizing_row(&format!("{scenario}, new"), letter, new.get(i));
        // The Deployment's limit, which every peak must stay under (not step b's: it has none but the start-up's).
        if let Some(Ok(r)) = new.get(i).filter(|_| i != 1) {
            row.target = format!("VmHWM {}", Goal::MaxMib(1024.0).show(r.hwm.map(|k| k as f64 / 1024.0)));
        }
        match old {
            None => row.notes += "; baseline: skipped (no --baseline)",
            Some(_) if !baseline_too => row.notes += "; baseline: not run (its steps are a to e)",
            Some(_) => {}
        }
        rows.push(row);
        if let Some(old) = old.filter(|_| *baseline_too) {
            rows.push(sizing_row(&format!("{scenario}, baseline"), letter, old.get(i)));
        }
    }
    rows
}

fn sizing_row(scenario: &str, letter: &str, reading: Option<&Result<Reading, String>>) -> Row {
    let notes = match reading {
        Some(Ok(r)) => format!("step {letter}: {}", reading_notes(r)),
        Some(Err(e)) => e.replace('|', "\\|").replace('\n', " "),
        None => "not run (an earlier step or the LIST rows' setup failed)".into(),
    };
    Row { scenario: scenario.into(), notes, ..Row::default() }
}

fn reading_notes(r: &Reading) -> String {
    let or_unknown = |k: Option<u64>| k.map_or("?".into(), mib);
    let mut notes = format!("VmRSS {}, VmHWM {}", or_unknown(r.rss), or_unknown(r.hwm));
    if let (Some((base, what)), Some(hwm)) = (r.base, r.hwm) {
        notes += &format!("; +{} (VmHWM over {what}, {})", mib(hwm.saturating_sub(base)), mib(base));
    }
    notes += &format!("; {:.1} s; {}", r.took.as_secs_f64(), r.detail.replace('|', "\\|"));
    notes
}

/// Polls a server's VmRSS every [`WATCHDOG_PERIOD`] and kills it (SIGKILL) the moment it passes a level.
pub(super) struct Watchdog {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Watched>,
}

#[derive(Default)]
pub(super) struct Watched {
    /// The highest VmRSS seen (KiB).
    pub(super) peak: u64,
    /// When it was killed, and its VmRSS then.
    pub(super) killed: Option<(Duration, u64)>,
}

impl Watchdog {
    /// The caller must not reap the server (`try_wait`, `wait`) before [`Watchdog::finish`]: until then its pid
    /// cannot name another process.
    pub(super) fn start(pid: u32, kill_above_kib: u64) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut watched = Watched::default();
            let mut tick = tokio::time::interval(WATCHDOG_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let Some(rss) = rss_kib(pid) else { break }; // exited
                watched.peak = watched.peak.max(rss);
                if rss > kill_above_kib {
                    // SAFETY: kill(2) on our own child, not reaped yet (see `start`).
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    watched.killed = Some((started.elapsed(), rss));
                    eprintln!("bench: load: pid {pid} passed {} (VmRSS {}): killed", mib(kill_above_kib), mib(rss));
                    break;
                }
            }
            watched
        });
        Watchdog { stop, task }
    }

    pub(super) async fn finish(self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_are_escaped() {
        assert_eq!(query_escape("eyJ2Ijo+/x=="), "eyJ2Ijo%2B%2Fx%3D%3D");
        assert_eq!(query_escape("a-b_c.d~e"), "a-b_c.d~e");
    }

    #[test]
    fn pages_are_counted() {
        let page: Page = serde_json::from_str(r#"{"metadata": {"continue": "t"}, "items": [{"a": 1}, {}]}"#).unwrap();
        assert_eq!((page.metadata.next.as_str(), page.items.map(|i| i.len())), ("t", Some(2)));
        let last: Page = serde_json::from_str(r#"{"kind": "Table", "metadata": {}, "rows": [{}]}"#).unwrap();
        assert_eq!((last.metadata.next.as_str(), last.rows.map(|r| r.len())), ("", Some(1)));
    }
}

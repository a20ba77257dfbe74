//! The `load` group's overload rows (issue 53): `--max-requests-inflight` at work. A user the limit counts (the
//! token of [`super::overload`]) LISTs all the row's ShootStates, unpaginated, over 16 times as many connections as
//! the limit has seats, as client-go does ([`super::overload_client`]): each LIST is streamed and holds 10 of the 16
//! seats until the server has written its last byte, so one fits at a time and the others are answered 429.
//! Meanwhile the embedded scheduler migrates those ShootStates (its requests are never counted) and a
//! `system:masters` client (never counted either) GETs one of them over one connection, on a thread of its own at
//! the highest priority; its p99 is compared with idle. The same overload then runs against the same binary without
//! the limit (`--max-requests-inflight 0`) and against the baseline, which has no limit, to show what the limit
//! buys. The server runs on half the CPUs and the bench on the other half, as the admission rows place them, so
//! that the masters p99 measures the server's fairness, not the load generator taking its CPU; what other processes
//! took of the server's CPUs meanwhile is reported.

use super::*;
use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) const LIMIT: usize = 16;
pub(super) const OVERLOAD_CONNS: usize = 16 * LIMIT;
/// How long the migration may take to start, and to end after the overload.
const MIGRATION_START: Duration = Duration::from_secs(60);
const MIGRATION_END: Duration = Duration::from_secs(900);
/// The padding of each ShootState's secret data: about 4 KiB an object as listed.
const PAD_BYTES: usize = 3_700;

/// The server of a run: the new binary with the limit, without it, or the baseline (which has no limit flag).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Limit {
    On,
    Off,
    Baseline,
}

impl Limit {
    pub(super) fn label(self) -> String {
        match self {
            Limit::On => format!("new, --max-requests-inflight {LIMIT}"),
            Limit::Off => "new without the limit (--max-requests-inflight 0)".into(),
            Limit::Baseline => "baseline (no in-flight limit)".into(),
        }
    }

    fn args(self) -> Vec<String> {
        match self {
            Limit::On => vec!["--max-requests-inflight".into(), LIMIT.to_string()],
            Limit::Off => vec!["--max-requests-inflight".into(), "0".into()],
            Limit::Baseline => Vec::new(),
        }
    }
}

/// What one run measured.
pub(super) struct Run {
    pub(super) limit: Limit,
    /// One LIST's answer, read before the load.
    pub(super) list_bytes: u64,
    /// The masters GET before the migration and the overload.
    pub(super) idle: Load,
    pub(super) window: Window,
    /// The server's VmRSS before the overload and its VmHWM after it.
    pub(super) rss_before: Option<u64>,
    pub(super) hwm: Option<u64>,
    pub(super) migration: Result<Migration, String>,
}

/// The overload window.
pub(super) struct Window {
    pub(super) lists: ListLoad,
    pub(super) masters: Load,
    /// The most read-only seats in use in any second (the server's gauge; only where there is a limit).
    pub(super) seats: Option<Result<u64, String>>,
    pub(super) watched: Watched,
    /// The migration when the masters' window ended.
    pub(super) at_end: Result<Progress, String>,
    /// The server's CPUs while the masters client measured, idle and loaded (when the server has CPUs of its own).
    pub(super) server_cpu: [Option<CpuShare>; 2],
    /// Why the masters client's thread runs at its usual priority, when it does.
    pub(super) priority: Option<String>,
}

pub(super) struct Migration {
    pub(super) at_start: Progress,
    pub(super) at_end: Progress,
    pub(super) done: Progress,
    /// From the overload's start to the masters' window end, and from the migration's creation to Succeeded.
    pub(super) window: Duration,
    pub(super) took: Duration,
}

/// The overload on the new binary with and without the limit, and on `baseline` when given; one server each.
pub(super) async fn overload_rows(
    bin: &Path,
    baseline: Option<&Path>,
    tokens: &Path,
    quick: bool,
    duration: Duration,
) -> Vec<Row> {
    let n: u64 = if quick { 1_000 } else { 2_000 };
    let all = allowed_cpus();
    let cpus = split_cpus(all.clone());
    let placement = match &cpus {
        Some((server, bench)) => format!(
            "server on {} ({}), bench on {} ({})",
            cpu_list(server),
            workers(server.len()),
            cpu_list(bench),
            workers(bench.len())
        ),
        None => {
            let why = if all.is_empty() { "the CPU affinity mask could not be read" } else { "a single CPU" };
            eprintln!("bench: load: the overload runs with the server and the bench sharing the CPUs: {why}");
            format!("server and bench sharing {} ({why}: not pinned)", cpu_list(&all))
        }
    };
    let mut runs = vec![(Limit::On, bin), (Limit::Off, bin)];
    runs.extend(baseline.map(|old| (Limit::Baseline, old)));
    let mut results = Vec::new();
    for (limit, bin) in runs {
        let cpus = cpus.as_ref().map(|(s, b)| (s.as_slice(), b.as_slice()));
        let run = overload_run(bin, limit, tokens, n, duration, cpus).await;
        results.push((limit, run.map_err(|e| format!("{e:#}"))));
    }
    overload_table(n, &results, baseline.is_some(), &placement)
}

/// `load` on the bench's CPUs when given, else where it is.
async fn on_bench<F>(cpus: Option<&[usize]>, load: F) -> anyhow::Result<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    match cpus {
        Some(cpus) => on_cpus(cpus, load).await,
        None => Ok(load.await),
    }
}

async fn overload_run(
    bin: &Path,
    limit: Limit,
    tokens: &Path,
    n: u64,
    duration: Duration,
    cpus: Option<(&[usize], &[usize])>,
) -> anyhow::Result<Run> {
    let label = limit.label();
    let mut args = token_args(tokens);
    args.extend(limit.args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut server, admin) = ServerProcess::start_on(bin, &args, cpus.map(|c| c.0)).await?;
    let pid = server.child.id();
    if let Some((server_cpus, _)) = cpus {
        let allowed = cpus_allowed(pid);
        if allowed.as_deref() != Some(server_cpus) {
            bail!("the server may run on {allowed:?}, not only on {}", cpu_list(server_cpus));
        }
    }
    let bench_cpus = cpus.map(|c| c.1);
    let server_cpus = cpus.map(|c| c.0.to_vec());
    eprintln!("bench: load: overload, {label}: storing {n} ShootStates of about 4 KiB");
    let seed = run_load(&admin, None, 16, None, n, shoot_state_creates(0, &"x".repeat(PAD_BYTES))).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    // The storage-version trigger's own first round done, so that the migration below is the only one.
    wait_persisted(&admin, &mut server).await?;
    let token = Target::with_token(&server.kubeconfig(), TOKEN)?;
    let list = Req::get(format!("{SHOOTSTATES_V1BETA1}/shootstates"));
    let (count, list_bytes) = one_list(&token, &list).await.context("the token user's first LIST")?;
    if count != n {
        bail!("the token user's first LIST held {count} objects, not {n}");
    }
    let (ns, name) = shoot_state_id(0);
    let get = Req::get(format!("{SHOOTSTATES_V1BETA1}/namespaces/{ns}/shootstates/{name}"));
    let gets = move |req: Req| -> MakeReq { Arc::new(move |_| req.clone()) };

    eprintln!("bench: load: overload, {label}: system:masters GET idle (1 connection, {duration:?})");
    let (a, g) = (admin.clone(), gets(get.clone()));
    let cpus_of_server = server_cpus.clone();
    let idle = async move {
        let priority = raise_priority();
        let share = cpu_share_start(cpus_of_server, pid);
        let load = run_load(&a, Some(pid), 1, Some(duration), u64::MAX, g).await;
        let share = share.and_then(|s| s.finish(load.elapsed));
        (load, priority, share)
    };
    // The same client as during the overload: on a runtime of its own, its thread at the highest priority.
    let (idle, priority, idle_cpu) = on_bench(bench_cpus, idle).await?;

    let svm_name = format!("bench-load-shootstates-{n}");
    let svm = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": svm_name, "labels": {"migration.k8s.io/resource": "shootstates.core.gardener.cloud"}},
        "spec": {"resource": {"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"}},
    });
    let created = Instant::now();
    admin.call_ok(&Req::post(format!("{API}/storageversionmigrations"), Bytes::from(svm.to_string()))).await?;
    let at_start =
        wait_svm(&admin, &mut server, &svm_name, "Running", MIGRATION_START, |p| p.running || p.succeeded).await?;
    eprintln!(
        "bench: load: overload, {label}: {OVERLOAD_CONNS} connections of the token user LISTing and 1 of \
         system:masters GETting during the migration ({duration:?})"
    );
    let rss_before = rss_kib(pid);
    reset_hwm(pid).context("resetting VmHWM")?;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    // The masters client on a runtime of its own (a thread of its own on the bench's CPUs): its answers are read
    // when they arrive, not after the token user's connections, hundreds of them streaming, have had their turns.
    let (a, s) = (admin.clone(), svm_name.clone());
    let masters = async move {
        // From the instant the token user's connections, all made, start.
        let started = started_rx.await.unwrap_or_else(|_| Instant::now());
        let priority = raise_priority();
        let share = cpu_share_start(server_cpus, pid);
        let load = run_load(&a, Some(pid), 1, Some(duration), u64::MAX, gets(get)).await;
        let busy = share.and_then(|s| s.finish(load.elapsed));
        let at_end = svm_status(&a, &s).await.map(|s| progress(&s)).map_err(|e| format!("{e:#}"));
        (load, at_end, started.elapsed(), busy, priority)
    };
    let a = admin.clone();
    let tokens = async move {
        let stop = Arc::new(AtomicBool::new(false));
        let seats = (limit == Limit::On).then(|| seats_sampler(&a, stop.clone()));
        let watchdog = Watchdog::start(pid, SAFETY_KIB);
        let lists = token_lists(&token, Some(pid), OVERLOAD_CONNS, duration, &list, n, started_tx).await;
        stop.store(true, Ordering::Relaxed);
        let watched = watchdog.finish().await;
        let seats = match seats {
            Some(task) => Some(match task.await {
                Ok(Ok(peak)) => Ok(peak),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(e) => Err(e.to_string()),
            }),
            None => None,
        };
        (lists, seats, watched)
    };
    let (tokens, masters) = tokio::join!(on_bench(bench_cpus, tokens), on_bench(bench_cpus, masters));
    let ((lists, seats, watched), (masters, at_end, in_window, server_cpu, loaded_priority)) = (tokens?, masters?);
    let priority = priority.or(loaded_priority);
    let window = Window { lists, masters, seats, watched, at_end, server_cpu: [idle_cpu, server_cpu], priority };
    if let Some((after, rss)) = window.watched.killed {
        server.stopped = true; // the watchdog's kill, not a death of its own
        let _ = server.child.wait();
        let e = format!("the server was killed {:.1} s into the overload, VmRSS {}", after.as_secs_f64(), mib(rss));
        return Ok(Run { limit, list_bytes, idle, window, rss_before, hwm: None, migration: Err(e) });
    }
    let hwm = hwm_kib(pid);
    let done = wait_svm(&admin, &mut server, &svm_name, "Succeeded", MIGRATION_END, |p| p.succeeded).await;
    let took = created.elapsed();
    // A server that exited by itself has been reported by `wait_svm`.
    let _ = server.stop().await;
    let migration = match (&window.at_end, done) {
        (Ok(at_end), Ok(done)) => Ok(Migration { at_start, at_end: at_end.clone(), done, window: in_window, took }),
        (Err(e), _) => Err(e.clone()),
        (_, Err(e)) => Err(format!("{e:#}")),
    };
    Ok(Run { limit, list_bytes, idle, window, rss_before, hwm, migration })
}

/// Runs the calling thread, the masters client's, at the highest priority (nice -20): it takes a few percent of a
/// CPU, and its answers are then read as they arrive, not after the token user's thread (or another process) on the
/// bench's CPUs has used up its time slice. None, or why not.
fn raise_priority() -> Option<String> {
    // SAFETY: gettid has no preconditions; setpriority on a thread id (PRIO_PROCESS takes one on Linux) changes
    // only that thread.
    let tid = unsafe { libc::gettid() };
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -20) } != 0 {
        return Some(format!("at its usual priority (nice -20 refused: {})", std::io::Error::last_os_error()));
    }
    None
}

/// The server's CPUs over a time: how busy they were, and how much of it was the server (cores).
pub(super) struct CpuShare {
    pub(super) busy: f64,
    pub(super) server: f64,
}

/// Where a [`CpuShare`] starts: the server's CPUs, their idle ticks and the server's.
struct CpuShareStart {
    cpus: Vec<usize>,
    idle: u64,
    server: u64,
    pid: u32,
}

/// Nothing is measured without `cpus` (the server not pinned).
fn cpu_share_start(cpus: Option<Vec<usize>>, pid: u32) -> Option<CpuShareStart> {
    let cpus = cpus?;
    Some(CpuShareStart { idle: idle_ticks(&cpus)?, server: cpu_ticks(pid)?, cpus, pid })
}

impl CpuShareStart {
    /// Busy is what was not idle: a tickless kernel counts a CPU's idle time exactly, and its user and system
    /// time by sampling at its ticks, which misses short bursts.
    fn finish(&self, elapsed: Duration) -> Option<CpuShare> {
        let ticks = elapsed.as_secs_f64() * 100.0; // USER_HZ
        let idle = idle_ticks(&self.cpus)?.saturating_sub(self.idle) as f64 / ticks;
        Some(CpuShare {
            busy: (self.cpus.len() as f64 - idle).max(0.0),
            server: cpu_ticks(self.pid)?.saturating_sub(self.server) as f64 / ticks,
        })
    }
}

/// Idle and iowait ticks of `cpus` together, from `/proc/stat`.
fn idle_ticks(cpus: &[usize]) -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let mut idle = 0;
    for cpu in cpus {
        let name = format!("cpu{cpu}");
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let t: Vec<u64> = line.split_whitespace().skip(1).take(5).filter_map(|f| f.parse().ok()).collect();
        idle += t.get(3)? + t.get(4)?;
    }
    Some(idle)
}

/// What a StorageVersionMigration's status says.
#[derive(Clone)]
pub(super) struct Progress {
    pub(super) migrated: u64,
    pub(super) running: bool,
    pub(super) succeeded: bool,
    pub(super) failed: bool,
}

fn progress(status: &Value) -> Progress {
    let condition = |t: &str| {
        status["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
    };
    Progress {
        migrated: status["migratedObjects"].as_u64().unwrap_or(0),
        running: condition("Running"),
        succeeded: condition("Succeeded"),
        failed: condition("Failed"),
    }
}

async fn svm_status(target: &Target, name: &str) -> anyhow::Result<Value> {
    let svm: Value =
        serde_json::from_slice(&target.call_ok(&Req::get(format!("{API}/storageversionmigrations/{name}"))).await?)?;
    Ok(svm["status"].clone())
}

/// Polls the migration `name` until `done` says so of its status, for at most `limit`.
async fn wait_svm(
    target: &Target,
    server: &mut ServerProcess,
    name: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Progress) -> bool,
) -> anyhow::Result<Progress> {
    let started = Instant::now();
    loop {
        let status = svm_status(target, name).await?;
        let p = progress(&status);
        if p.failed {
            bail!("the migration {name} failed: {status}");
        }
        if done(&p) {
            return Ok(p);
        }
        if let Some(exit) = server.exited() {
            bail!("the server exited while waiting for the migration to be {what} ({exit})");
        }
        if started.elapsed() > limit {
            bail!("the migration {name} was not {what} within {limit:?}: {status}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Samples `apiserver_current_inflight_requests{request_kind="readOnly"}` (each second's peak of the seats in use)
/// as the admin until `stop`, and for a second and a bit more after it (the gauge shows the second before); the
/// highest value.
fn seats_sampler(admin: &Target, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<anyhow::Result<u64>> {
    let admin = admin.clone();
    tokio::spawn(async move {
        let mut conn = admin.connect().await?;
        let (mut peak, mut stopped) = (0u64, None::<Instant>);
        while stopped.is_none_or(|at| at.elapsed() < Duration::from_millis(1200)) {
            let text = conn.call_ok(&Req::get("/metrics".into()).accept("text/plain")).await?;
            let value = String::from_utf8_lossy(&text)
                .lines()
                .find(|l| {
                    l.starts_with("apiserver_current_inflight_requests{") && l.contains("request_kind=\"readOnly\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .ok_or_else(|| anyhow!("no apiserver_current_inflight_requests{{request_kind=\"readOnly\"}}"))?;
            peak = peak.max(value as u64);
            if stopped.is_none() && stop.load(Ordering::Relaxed) {
                stopped = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(peak)
    })
}

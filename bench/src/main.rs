//! `make bench`: a load generator of our own against a real migration-apiserver, over TLS with the
//! admin client certificate of its kubeconfig.
//!
//! Every worker owns one keep-alive HTTP/1.1 connection and reuses it for all its requests. The timed
//! loops speak HTTP/1.1 themselves on the tokio-rustls stream ([`LeanConn`]: one write per request,
//! reused buffers, no connection task), so that the client costs little CPU next to the server on
//! the same machine; setup calls and watch streams go through hyper's client `conn`. Latencies of
//! successful requests are recorded one by one and percentiles are read from the sorted samples. The admission
//! rows that carry targets give the server and the bench separate CPUs (`admission_group`).
//! Results are printed as a markdown table next to their targets; missing a target never fails the
//! run (see BENCHMARKS.md).

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

const API: &str = "/apis/migration.k8s.io/v1alpha1";
const JSON: &str = "application/json";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const MERGE_PATCH: &str = "application/merge-patch+json";
/// Limits for TCP connect and TLS handshake, and for one request with its answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(name = "bench", about = "Load generator for migration-apiserver; prints a markdown table")]
struct Args {
    /// migration-apiserver binary to start in a temporary directory on a free port, with --disable-scheduler
    /// (stopped at the end; idle memory is measured on a separate start with default flags).
    #[arg(long, required_unless_present = "url", conflicts_with = "url")]
    server: Option<PathBuf>,
    /// URL of an already running server, e.g. https://127.0.0.1:8443 (needs --kubeconfig). Run it with
    /// --disable-scheduler, or the scheduler runs and prunes the bench's StorageVersionMigrations. Only the core
    /// and admission scenarios run against it.
    #[arg(long, requires = "kubeconfig")]
    url: Option<String>,
    /// Admin kubeconfig of the running server (CA and client certificate).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Duration of each timed scenario: 10s, 500ms, 1m [default: 10s, 2s with --quick].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Connections for GET; LIST uses a quarter of them, CREATE and admission reviews twice as many.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Smoke run: short scenarios, 10^4 instead of 10^5 stored objects, migrations of 10^3 and 10^4 objects.
    #[arg(long)]
    quick: bool,
    /// Scenario groups to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "core,admission,encryption,migration,etcd")]
    only: Vec<Group>,
    /// etcd binary (v3.4+) for the etcd backend's rows, a path or a name looked up in PATH; the rows are skipped
    /// when there is none.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
}

/// Groups of scenarios (`--only`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// GET, LIST, CREATE, watch fan-out, server memory and the 10^5 store step, on the embedded store.
    Core,
    /// AdmissionReview throughput of /validate and /mutate (on a server of their own with --server).
    Admission,
    /// ShootState create and get with a 100 KiB body, aesgcm against identity (starts its own servers).
    Encryption,
    /// The migrator: 10^4 and 10^5 objects of another server (starts its own servers).
    Migration,
    /// GET, CREATE, LIST and watch fan-out on the etcd backend (starts etcd and a server on it).
    Etcd,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let n: f64 = s[..split].parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match &s[split..] {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("invalid duration {s:?} (use ms, s or m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Dropping `run` on Ctrl-C drops the server guard, which stops the server we started.
    let result = tokio::select! {
        r = run(args) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let duration = args.duration.unwrap_or(Duration::from_secs(if args.quick { 2 } else { 10 }));
    let bulk: u64 = if args.quick { 10_000 } else { 100_000 };
    let conns = args.connections.max(1);
    let on = |g: Group| args.only.contains(&g);
    let mut idle_rss = None;
    let (mut server, target) = match (&args.server, &args.url, &args.kubeconfig) {
        (Some(bin), _, _) => {
            if on(Group::Core) {
                // Idle memory of a server with default flags, scheduler included.
                let (idle, _) = ServerProcess::start(bin, &[]).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
                idle_rss = rss_kib(idle.child.id());
            }
            // The embedded scheduler would act on the bench's StorageVersionMigrations (run them against this
            // server, then delete all but --migration-history of them): measure the API alone.
            let (server, target) = ServerProcess::start(bin, &["--disable-scheduler"]).await?;
            (Some(server), target)
        }
        (None, Some(url), Some(kc)) => (None, Target::from_kubeconfig(kc, Some(url))?),
        _ => bail!("either --server or --url with --kubeconfig is required"),
    };
    let pid = server.as_ref().map(|s| s.child.id());
    // Unique names per run, so that runs against a long-lived --url server do not collide.
    let run =
        format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_micros() % 0xffff_ffff);
    let mut rows = Vec::new();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let loadavg = loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let started = Instant::now();

    let mut created = 0;
    if on(Group::Core) {
        let (core, n) = core_rows(&target, pid, conns, duration, &run, true).await;
        rows.extend(core);
        created = n;
    }
    if on(Group::Admission) {
        // On servers of their own, as in the webhook deployment form (the kinds are CRDs, stored by
        // kube-apiserver), not on the one the core rows filled with 10^5 objects (see BENCHMARKS.md).
        match &args.server {
            Some(bin) => rows.extend(admission_group(bin, conns * 2, duration, &run).await),
            None => rows.extend(admission_rows(target.clone(), pid, conns * 2, duration, run.clone()).await),
        }
    }
    if on(Group::Core) {
        rows.extend(store_rows(&target, server.as_mut(), conns * 2, bulk, idle_rss, created, &run).await);
    }
    drop(server);

    let bin = args.server.as_deref();
    let needs_server = |what: &str| eprintln!("bench: {what} skipped: it starts servers of its own (needs --server)");
    if on(Group::Encryption) {
        match bin {
            Some(bin) => rows.extend(encryption_rows(bin, conns, duration, &run).await),
            None => needs_server("encryption"),
        }
    }
    if on(Group::Migration) {
        match bin {
            Some(bin) => rows.extend(migration_rows(bin, args.quick).await),
            None => needs_server("migration"),
        }
    }
    if on(Group::Etcd) {
        match bin {
            Some(bin) => match find_program(&args.etcd) {
                Some(etcd) => {
                    let etcd_rows = etcd_rows(bin, &etcd, conns, duration, &run).await;
                    merge_pairs(&mut rows, etcd_rows, "the embedded store's");
                }
                None => eprintln!("bench: etcd skipped: no etcd binary {}", args.etcd.display()),
            },
            None => needs_server("etcd"),
        }
    }

    println!("| scenario | requests/s | p50 ms | p99 ms | target | notes |");
    println!("|---|---:|---:|---:|---|---|");
    for r in &rows {
        let cells = [&r.rps, &r.p50, &r.p99, &r.target].map(|c| if c.is_empty() { "-" } else { c.as_str() });
        println!("| {} | {} | {} |", r.scenario, cells.join(" | "), r.notes);
    }
    println!(
        "\n{}; load average before the run: {loadavg}; the run took {:.0} s",
        machine(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// GET, LIST (JSON, and Table when `table`), CREATE and watch fan-out against `target`; also returns how many
/// objects the CREATE step stored.
async fn core_rows(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    run: &str,
    table: bool,
) -> (Vec<Row>, u64) {
    let mut rows = Vec::new();
    // 1. GET of one object.
    eprintln!("bench: GET ({conns} connections, {duration:?})");
    let name = format!("get-{run}.bench.io");
    match target.call_ok(&Req::post(format!("{API}/storagestates"), storage_state(&format!("get-{run}")))).await {
        Ok(_) => {
            let get = Req::get(format!("{API}/storagestates/{name}"));
            let load = run_load(target, pid, conns, Some(duration), u64::MAX, Arc::new(move |_| get.clone())).await;
            rows.push(load.row("GET one object", conns, Goal::MinRps(20_000.0), ""));
        }
        Err(e) => rows.push(Row::failed("GET one object".into(), e)),
    }

    // 2. LIST of 1000 objects, as JSON and as Table; the svm collection holds exactly these.
    let list_conns = (conns / 4).max(1);
    eprintln!("bench: LIST ({list_conns} connections, {duration:?})");
    rows.extend(list_rows(target, pid, list_conns, duration, run, table).await);

    // 3. CREATE of new objects.
    let create_conns = conns * 2;
    eprintln!("bench: CREATE ({create_conns} connections, {duration:?})");
    let load = run_load(target, pid, create_conns, Some(duration), u64::MAX, new_states(format!("c-{run}"))).await;
    let created = load.stats.ok;
    rows.push(load.row("CREATE (new names)", create_conns, Goal::MinRps(5_000.0), ""));

    // 4. Watch fan-out.
    let (streams, updates) = (100, 200);
    eprintln!("bench: watch fan-out ({streams} streams, {updates} updates)");
    let watch = watch_fanout(target, run, streams, updates).await;
    rows.push(
        watch.unwrap_or_else(|e| Row::failed(format!("watch fan-out: {streams} streams x {updates} updates"), e)),
    );
    (rows, created)
}

/// Server memory: idle (measured before), then after storing `bulk` more objects.
async fn store_rows(
    target: &Target,
    server: Option<&mut ServerProcess>,
    conns: usize,
    bulk: u64,
    idle_rss: Option<u64>,
    created: u64,
    run: &str,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let pid = server.as_ref().map(|s| s.child.id());
    let bulk_label = format!("10^{}", bulk.ilog10());
    let notes = idle_rss.map_or("needs --server".into(), |k| {
        format!("VmRSS {}, default flags, 1 s after /readyz, empty store", mib(k))
    });
    let target_rss = Goal::MaxMib(30.0).show(idle_rss.map(|k| k as f64 / 1024.0));
    rows.push(Row { scenario: "server RSS idle".into(), target: target_rss, notes, ..Row::default() });
    eprintln!("bench: storing {bulk_label} objects ({conns} connections)");
    let load = run_load(target, pid, conns, None, bulk, new_states(format!("b-{run}"))).await;
    let took = format!("took {:.1} s", load.elapsed.as_secs_f64());
    let stored = load.stats.ok;
    rows.push(load.row(&format!("store {bulk_label} objects (CREATE)"), conns, Goal::None, &took));
    let total = 1 + 1000 + created + 1 + stored;
    let notes = match (server.and_then(ServerProcess::exited), pid.and_then(rss_kib)) {
        (Some(exit), _) => format!("the server exited during the run ({exit}); its log is on stderr"),
        (None, Some(kib)) => format!(
            "VmRSS {} with ~{} objects stored ({} of them by this step)",
            mib(kib),
            thousands(total as f64),
            thousands(stored as f64)
        ),
        (None, None) => "needs --server".into(),
    };
    rows.push(Row { scenario: format!("server RSS after {bulk_label} objects"), notes, ..Row::default() });
    rows
}

// Scenarios that need more than one load run.

async fn list_rows(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    run: &str,
    table: bool,
) -> Vec<Row> {
    let path = format!("{API}/storageversionmigrations");
    let fail = |e| vec![Row::failed("LIST 1000 objects".into(), e)];
    // Fill the collection up to exactly 1000 (a --url server may already hold some).
    let have = match target.call_ok(&Req::get(path.clone())).await {
        Ok(b) => {
            serde_json::from_slice::<Value>(&b).ok().and_then(|v| v["items"].as_array().map(Vec::len)).unwrap_or(0)
        }
        Err(e) => return fail(e),
    };
    let missing = 1000u64.saturating_sub(have as u64);
    let (p, r) = (path.clone(), run.to_string());
    let make: MakeReq = Arc::new(move |i| Req::post(p.clone(), migration(&format!("list-{r}-{i:04}"))));
    let seed = run_load(target, None, 32, None, missing, make).await;
    if seed.stats.errors > 0 {
        return fail(anyhow!("seeding {missing} objects: {}", seed.stats.error_summary()));
    }
    let mut rows = Vec::new();
    let forms = [("JSON", JSON, "items"), ("Table", TABLE, "rows")];
    for (label, accept, key) in forms.into_iter().take(if table { 2 } else { 1 }) {
        let req = Req::get(path.clone()).accept(accept);
        let probe = match target.call_ok(&req).await {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        let n = serde_json::from_slice::<Value>(&probe).ok().and_then(|v| v[key].as_array().map(Vec::len)).unwrap_or(0);
        let note = format!("{n} {key}, {:.0} KiB per response", probe.len() as f64 / 1024.0);
        let load = run_load(target, pid, conns, Some(duration), u64::MAX, Arc::new(move |_| req.clone())).await;
        rows.push(load.row(&format!("LIST 1000 objects as {label}"), conns, Goal::MinRps(200.0), &note));
    }
    rows
}

/// `streams` watches on one collection, then `updates` sequential merge patches of one object.
/// Latency = watcher's receipt of the event minus the arrival of the write's response.
async fn watch_fanout(target: &Target, run: &str, streams: usize, updates: usize) -> anyhow::Result<Row> {
    let coll = format!("{API}/storagestates");
    let obj = format!("{coll}/watched-{run}.bench.io");
    let created: Value = serde_json::from_slice(
        &target.call_ok(&Req::post(coll.clone(), storage_state(&format!("watched-{run}")))).await?,
    )?;
    let rv0 =
        created["metadata"]["resourceVersion"].as_str().context("created object has no resourceVersion")?.to_string();

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let mut watchers = tokio::task::JoinSet::new(); // dropping it (also on errors) ends the watches
    for _ in 0..streams {
        let mut conn = target.connect().await?;
        let watch = Req::get(format!("{coll}?watch=true&resourceVersion={rv0}"));
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, conn.send(&watch)).await.context("watch: no answer")??;
        if !resp.status().is_success() {
            bail!("watch answered {}", resp.status());
        }
        let tx = tx.clone();
        watchers.spawn(async move {
            let _conn = conn; // keeps the connection's request side alive
            let mut body = resp.into_body();
            let mut buf = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let now = Instant::now();
                let Some(data) = frame.data_ref() else { continue };
                buf.extend_from_slice(data);
                while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    let rv = serde_json::from_slice::<Value>(&line)
                        .ok()
                        .and_then(|v| v["object"]["metadata"]["resourceVersion"].as_str().map(String::from));
                    if let Some(rv) = rv {
                        let _ = tx.send((rv, now));
                    }
                }
            }
        });
    }
    drop(tx);
    let patch = |i: usize| Req::patch(obj.clone(), json!({"metadata": {"labels": {"bench": i.to_string()}}}));
    let rv_of = |b: &[u8]| {
        serde_json::from_slice::<Value>(b)
            .ok()
            .and_then(|v| v["metadata"]["resourceVersion"].as_str().map(String::from))
    };
    let mut writer = target.connect().await?;

    // Warm-up: one write that every watcher must see before measuring starts.
    let warm = rv_of(&writer.call_ok(&patch(0)).await?).context("patch response has no resourceVersion")?;
    let mut seen = 0;
    while seen < streams {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some((rv, _))) => seen += usize::from(rv == warm),
            _ => bail!("only {seen} of {streams} watchers saw the warm-up event"),
        }
    }

    // rv -> (request sent, response received)
    let mut written: HashMap<String, (Instant, Instant)> = HashMap::new();
    let mut errors = 0;
    for i in 1..=updates {
        let sent = Instant::now();
        match writer.call_ok(&patch(i)).await.map(|b| rv_of(&b)) {
            Ok(Some(rv)) => drop(written.insert(rv, (sent, Instant::now()))),
            _ => errors += 1,
        }
    }
    let write_us = sorted(written.values().map(|(s, r)| micros(r.saturating_duration_since(*s))));
    // Collect the deliveries (most are queued in the channel already) until complete or quiet for 5 s.
    let mut deliveries = Vec::with_capacity(streams * updates);
    while deliveries.len() < written.len() * streams {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some((rv, at))) => deliveries.extend(written.get(&rv).map(|&(s, r)| (s, r, at))),
            _ => break,
        }
    }
    drop(watchers);
    // An event may reach a watcher before the writer has read its response: that counts as 0.
    let lat_us = sorted(deliveries.iter().map(|&(_, r, at)| micros(at.saturating_duration_since(r))));
    let from_sent = sorted(deliveries.iter().map(|&(s, _, at)| micros(at.saturating_duration_since(s))));
    let early = deliveries.iter().filter(|&&(_, r, at)| at < r).count();
    let mut notes = format!(
        "{}/{} deliveries, {} of them before the write's response; PATCH p50 {} / p99 {} ms; \
         from the PATCH being sent: p50 {} / p99 {} ms",
        thousands(deliveries.len() as f64),
        thousands((written.len() * streams) as f64),
        thousands(early as f64),
        pct(&write_us, 0.5),
        pct(&write_us, 0.99),
        pct(&from_sent, 0.5),
        pct(&from_sent, 0.99),
    );
    if errors > 0 {
        notes += &format!("; {errors} failed writes");
    }
    let p99 = (!lat_us.is_empty()).then(|| pct_f(&lat_us, 0.99));
    Ok(Row {
        scenario: format!("watch fan-out: {streams} streams x {updates} updates"),
        rps: String::new(),
        p50: pct(&lat_us, 0.5),
        p99: pct(&lat_us, 0.99),
        target: Goal::MaxP99Ms(10.0).show(p99),
        notes,
        p99_v: p99,
        ..Row::default()
    })
}

// Admission webhooks (issue 3).

const ADMISSION_V1: &str = "admission.k8s.io/v1";

/// The admission rows on servers of their own, placed two ways. First (with 2 CPUs or more) the server on one half
/// of the CPUs and the bench on the other, as for a webhook pod with cores of its own on kube-apiserver's node: the
/// server's own latency, without the bench's threads preempting it. These rows are judged by the targets. Then both
/// free to run on every CPU, each row after its pair with the ratio and the targets' verdict marked as not judged:
/// on 2 cores the server's and the bench's busy threads preempt each other, and an answer waits while its thread
/// does (a 4 ms tick; see BENCHMARKS.md).
async fn admission_group(bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    let cpus = allowed_cpus();
    let Some((server_cpus, bench_cpus)) = split_cpus(cpus.clone()) else {
        let why = if cpus.is_empty() { "the CPU affinity mask could not be read" } else { "a single CPU" };
        eprintln!("bench: the admission rows run with the server and the bench sharing the CPUs only: {why}");
        return admission_on(bin, None, conns, duration, run).await;
    };
    let mut rows = admission_on(bin, Some((&server_cpus, &bench_cpus)), conns, duration, run).await;
    let mut shared = admission_on(bin, None, conns, duration, run).await;
    for row in &mut shared {
        // A row whose pair failed stays on its own, at the end, and is judged.
        if rows.iter().any(|r| r.scenario == row.scenario) {
            row.pair = Some(row.scenario.clone());
            if !row.target.is_empty() {
                row.target = format!("not judged: {}", row.target);
            }
        }
        row.scenario += ", server and bench sharing the CPUs";
    }
    merge_pairs(&mut rows, shared, "the separate CPUs'");
    rows
}

/// The admission rows against a new server. With `cpus` (the server's, the bench's), the server may only run on
/// the first (checked in its `/proc` status) and the load runs on a runtime of its own, on the second.
async fn admission_on(
    bin: &Path,
    cpus: Option<(&[usize], &[usize])>,
    conns: usize,
    duration: Duration,
    run: &str,
) -> Vec<Row> {
    let failed = |e: anyhow::Error| vec![Row::failed("AdmissionReview /validate and /mutate".into(), e)];
    let (server, target) = match ServerProcess::start_on(bin, &["--disable-scheduler"], cpus.map(|c| c.0)).await {
        Ok(started) => started,
        Err(e) => return failed(e),
    };
    let pid = server.child.id();
    let load = admission_rows(target, Some(pid), conns, duration, run.to_string());
    let (mut rows, placement) = match cpus {
        None => {
            let all = allowed_cpus();
            let placement = format!("server and bench sharing {}, {} each", cpu_list(&all), workers(all.len()));
            (load.await, placement)
        }
        Some((server_cpus, bench_cpus)) => {
            let allowed = cpus_allowed(pid);
            if allowed.as_deref() != Some(server_cpus) {
                return failed(anyhow!("the server may run on {allowed:?}, not only on {}", cpu_list(server_cpus)));
            }
            let rows = match on_cpus(bench_cpus, load).await {
                Ok(rows) => rows,
                Err(e) => return failed(e),
            };
            let placement = format!(
                "server on {} ({}), bench on {} ({})",
                cpu_list(server_cpus),
                workers(server_cpus.len()),
                cpu_list(bench_cpus),
                workers(bench_cpus.len())
            );
            (rows, placement)
        }
    };
    for row in &mut rows {
        row.notes += &format!("; {placement}");
    }
    rows
}

/// /validate with a StorageVersionMigration CREATE and /mutate with a StorageState CREATE (the kind that has a
/// default, so that the answer carries a patch), as kube-apiserver sends them for the CRD form. Every answer is
/// checked: its uid echoed, allowed, and no patch (/validate) or exactly the expected patch (/mutate). Then the
/// floor under them.
async fn admission_rows(target: Target, pid: Option<u32>, conns: usize, duration: Duration, run: String) -> Vec<Row> {
    let (target, run) = (&target, run.as_str());
    let mut rows = Vec::new();
    for mutate in [false, true] {
        let scenario = if mutate {
            "AdmissionReview /mutate (StorageState CREATE)"
        } else {
            "AdmissionReview /validate (StorageVersionMigration CREATE)"
        };
        eprintln!("bench: {scenario} ({conns} connections, {duration:?})");
        match admission_row(target, pid, conns, duration, run, mutate, scenario).await {
            Ok(row) => rows.push(row),
            Err(e) => rows.push(Row::failed(scenario.into(), e)),
        }
    }
    // The floor under any review: the same requests to a path that rejects the method without reading anything.
    let scenario = "floor: the same POST to /healthz (405, nothing decoded)";
    eprintln!("bench: {scenario} ({conns} connections, {duration:?})");
    let template = Arc::new(Template::new(&admission_review("uid-@N@", "CREATE", &admitted_migration("@N@"))));
    let r = run.to_string();
    let make: MakeReq =
        Arc::new(move |i| Req::post("/healthz".into(), template.render(&format!("{r}-{i:07}"))).expect(405));
    let load = run_load_checked(target, pid, conns, Some(duration), u64::MAX, make, None).await;
    let note = "TLS, HTTP and the bench client alone, per request: the ceiling for any webhook placed the same way";
    rows.push(load.row(scenario, conns, Goal::None, note));
    rows
}

async fn admission_row(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    run: &str,
    mutate: bool,
    scenario: &str,
) -> anyhow::Result<Row> {
    let path = if mutate { "/mutate" } else { "/validate" };
    let object = |n: &str| if mutate { admitted_storage_state(n) } else { admitted_migration(n) };
    let template = Arc::new(Template::new(&admission_review("uid-@N@", "CREATE", &object("@N@"))));
    let uid = |n: &str| format!("uid-{n}");

    // Probes, one of them an object that must be denied: a webhook that allows everything cannot score.
    let probe_n = format!("{run}-probe");
    let answer = target.call_ok(&Req::post(path.into(), template.render(&probe_n))).await?;
    let patch = if mutate {
        let patch = review_response(&answer, &uid(&probe_n))?["patch"].as_str().unwrap_or_default().to_string();
        let decoded = base64::engine::general_purpose::STANDARD.decode(&patch).context("the patch is not base64")?;
        let ops: json_patch::Patch = serde_json::from_slice(&decoded).context("the patch is not a JSON Patch")?;
        let mut patched = object(&probe_n);
        json_patch::patch(&mut patched, &ops).context("the patch does not apply to the object sent")?;
        if patched["status"]["persistedStorageVersionHashes"] != json!(["Unknown"]) {
            bail!(
                "the patch does not default status.persistedStorageVersionHashes: {}",
                String::from_utf8_lossy(&decoded)
            );
        }
        Some(patch)
    } else {
        None
    };
    check_review(&answer, &uid(&probe_n), patch.as_deref()).map_err(|e| anyhow!("probe: {e}"))?;
    let mut invalid = object(&format!("{run}-invalid"));
    invalid["spec"] = json!({});
    let denied = target
        .call_ok(&Req::post(path.into(), Template::new(&admission_review("uid-x", "CREATE", &invalid)).render("")))
        .await?;
    if !mutate && review_response(&denied, "uid-x")?["allowed"] != false {
        bail!("an object without spec.resource was not denied: {}", String::from_utf8_lossy(&denied));
    }

    let size = template.render(&format!("{run}-0000000")).len();
    let r = run.to_string();
    let (t, p) = (template.clone(), path.to_string());
    let make: MakeReq = Arc::new(move |i| Req::post(p.clone(), t.render(&format!("{r}-{i:07}"))));
    let r = run.to_string();
    let check: Check = Arc::new(move |i, body| check_review(body, &format!("uid-{r}-{i:07}"), patch.as_deref()));
    let load = run_load_checked(target, pid, conns, Some(duration), u64::MAX, make, Some(check)).await;
    let what = if mutate { "allowed, uid echoed, the expected JSON Patch" } else { "allowed, uid echoed, no patch" };
    let note = format!("{:.1} KiB per review; every answer checked: {what}", size as f64 / 1024.0);
    let mut row = load.row(scenario, conns, Goal::MinRps(30_000.0), &note);
    // The issue's second target is p99 <= 5 ms.
    row.target += &format!("; {}", Goal::MaxP99Ms(5.0).show(row.p99_v));
    Ok(row)
}

/// The `response` of an AdmissionReview answer to `uid`.
fn review_response(body: &[u8], uid: &str) -> anyhow::Result<Value> {
    let v: Value = serde_json::from_slice(body).context("the answer is not JSON")?;
    if v["apiVersion"] != ADMISSION_V1 || v["kind"] != "AdmissionReview" {
        bail!("not an {ADMISSION_V1} AdmissionReview: {v}");
    }
    if v["response"]["uid"] != uid {
        bail!("uid {uid} not echoed: {v}");
    }
    Ok(v["response"].clone())
}

/// An allowed answer to `uid`, with exactly `patch` (base64) or no patch at all. Read into borrowed fields (this
/// runs for every answer of the timed loop, on the cores the server uses); anything unexpected is reported with
/// the whole answer.
fn check_review(body: &[u8], uid: &str, patch: Option<&str>) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Review<'a> {
        #[serde(rename = "apiVersion", borrow)]
        api_version: Cow<'a, str>,
        #[serde(borrow)]
        kind: Cow<'a, str>,
        #[serde(borrow)]
        response: Response<'a>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Response<'a> {
        #[serde(borrow)]
        uid: Cow<'a, str>,
        allowed: bool,
        #[serde(default)]
        patch_type: Option<String>,
        #[serde(default)]
        patch: Option<String>,
    }
    let whole = || String::from_utf8_lossy(body).into_owned();
    let r: Review<'_> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview ({e}): {}", whole()))?;
    if r.api_version != ADMISSION_V1 || r.kind != "AdmissionReview" {
        return Err(format!("not an {ADMISSION_V1} AdmissionReview: {}", whole()));
    }
    let r = r.response;
    if r.uid != uid {
        return Err(format!("uid {uid} not echoed: {}", whole()));
    }
    if !r.allowed {
        return Err(format!("not allowed: {}", whole()));
    }
    match patch {
        None if r.patch.is_some() || r.patch_type.is_some() => {
            Err(format!("a patch in a validating answer: {}", whole()))
        }
        Some(p) if r.patch_type.as_deref() != Some("JSONPatch") || r.patch.as_deref() != Some(p) => {
            Err(format!("not the expected patch: {}", whole()))
        }
        _ => Ok(()),
    }
}

/// An AdmissionReview as kube-apiserver sends it to a webhook for a write of `object`.
fn admission_review(uid: &str, operation: &str, object: &Value) -> Value {
    let (group, version) = object["apiVersion"].as_str().unwrap_or_default().split_once('/').unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"],
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:storage-version-migrator",
                "uid": "5b0c8a52-1f4e-4a2b-9c61-0d7e3f5a9b21",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "storage-version-migrator"},
        },
    })
}

/// Metadata as kube-apiserver has filled it in by the time the webhooks see a CREATE.
fn admitted_meta(name: &str) -> Value {
    json!({
        "name": name,
        "uid": "0d1f3c5e-2b4a-4c6e-8f10-32547698badc",
        "generation": 1,
        "creationTimestamp": "2026-11-21T02:00:00Z",
        "labels": {"app.kubernetes.io/managed-by": "storage-version-migrator"},
        "managedFields": [{
            "manager": "storage-version-migrator", "operation": "Update", "apiVersion": "migration.k8s.io/v1alpha1",
            "time": "2026-11-21T02:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {}}}, "f:spec": {".": {}, "f:resource": {".": {}, "f:group": {}, "f:resource": {}}}},
        }],
    })
}

fn admitted_migration(n: &str) -> Value {
    json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": admitted_meta(&format!("deployments-{n}")),
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    })
}

fn admitted_storage_state(n: &str) -> Value {
    json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
        "metadata": admitted_meta(&format!("r{n}.bench.io")),
        "spec": {"resource": {"group": "bench.io", "resource": format!("r{n}")}},
    })
}

/// A JSON body with `@N@` placeholders, rendered per request without serializing it again.
struct Template(Vec<Bytes>);

impl Template {
    fn new(body: &Value) -> Template {
        Template(body.to_string().split("@N@").map(|p| Bytes::from(p.to_owned())).collect())
    }

    fn render(&self, n: &str) -> Bytes {
        let mut out = Vec::with_capacity(self.0.iter().map(Bytes::len).sum::<usize>() + self.0.len() * n.len());
        for (k, part) in self.0.iter().enumerate() {
            if k > 0 {
                out.extend_from_slice(n.as_bytes());
            }
            out.extend_from_slice(part);
        }
        Bytes::from(out)
    }
}

// ShootState with a 100 KiB body, encrypted at rest against identity (issue 3).

const SHOOTSTATES_V1BETA1: &str = "/apis/core.gardener.cloud/v1beta1";
const SHOOTSTATE_KEYS: &str = "/registry/core.gardener.cloud/shootstates/";
/// The most ShootStates one CREATE step writes (10^4 x 100 KiB = 1 GiB on disk).
const SHOOTSTATE_CREATE_LIMIT: u64 = 10_000;

/// CREATE and GET of 100 KiB ShootStates on a server without encryption (identity) and on one whose
/// EncryptionConfiguration has aesgcm as its first provider; afterwards `storage inspect` checks how the values
/// were stored.
async fn encryption_rows(bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-enc-{}", std::process::id()));
    let config = match encryption_config(&dir) {
        Ok(c) => c,
        Err(e) => return vec![Row::failed("ShootState 100 KiB, aesgcm".into(), e)],
    };
    let config_arg = config.to_string_lossy().into_owned();
    let mut creates = Vec::new();
    let mut gets = Vec::new();
    for (label, extra) in [("identity", vec![]), ("aesgcm", vec!["--encryption-provider-config", config_arg.as_str()])]
    {
        let (c, g) = (format!("ShootState CREATE 100 KiB, {label}"), format!("ShootState GET 100 KiB, {label}"));
        eprintln!("bench: ShootState 100 KiB, {label} ({conns} connections, {duration:?} each)");
        match shootstate_rows(bin, &extra, label, conns, duration, run).await {
            Ok((create, get)) => {
                creates.push(create);
                gets.push(get);
            }
            Err(e) => creates.push(Row::failed(format!("{c} / {g}"), e)),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    for rows in [&mut creates, &mut gets] {
        if let [identity, aesgcm] = &mut rows[..] {
            let ratio = ratio_note(aesgcm, identity, "identity's");
            aesgcm.notes = format!("{ratio}; {}", aesgcm.notes);
        }
    }
    creates.into_iter().chain(gets).collect()
}

/// A kube-apiserver EncryptionConfiguration for ShootStates: aesgcm with a fresh random key first, identity second.
fn encryption_config(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut key = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [shootstates.core.gardener.cloud]\n  providers:\n  - aesgcm:\n      keys:\n      \
         - name: key1\n        secret: {}\n  - identity: {{}}\n",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let path = dir.join("encryption-config.yaml");
    std::fs::write(&path, yaml)?;
    Ok(path)
}

async fn shootstate_rows(
    bin: &Path,
    extra: &[&str],
    label: &str,
    conns: usize,
    duration: Duration,
    run: &str,
) -> anyhow::Result<(Row, Row)> {
    // A short watch history: the ring would otherwise hold up to 10^5 events of 100 KiB in memory.
    let mut args = vec!["--disable-scheduler", "--watch-history", "1000"];
    args.extend_from_slice(extra);
    let (mut server, target) = ServerProcess::start(bin, &args).await?;
    let pid = Some(server.child.id());
    let ns = "bench";
    let coll = format!("{SHOOTSTATES_V1BETA1}/namespaces/{ns}/shootstates");
    let template = Arc::new(Template::new(&big_shoot_state(ns, "s-@N@")));
    let size = template.render(&format!("{run}-0000000")).len();

    let (t, c, r) = (template.clone(), coll.clone(), run.to_string());
    let make: MakeReq = Arc::new(move |i| Req::post(c.clone(), t.render(&format!("{r}-{i:07}"))));
    let load = run_load(&target, pid, conns, Some(duration), SHOOTSTATE_CREATE_LIMIT, make).await;
    let note = format!("{:.0} KiB per object", size as f64 / 1024.0);
    let mut create = load.row(&format!("ShootState CREATE 100 KiB, {label}"), conns, Goal::None, &note);
    let created = load.stats.ok;

    let name = format!("s-{run}-get");
    let body = target.call_ok(&Req::post(coll.clone(), template.render(&format!("{run}-get")))).await?;
    let stored: Value = serde_json::from_slice(&body)?;
    let get = Req::get(format!("{coll}/{name}"));
    let probe = target.call_ok(&get).await?;
    let read: Value = serde_json::from_slice(&probe)?;
    if read["spec"] != stored["spec"] {
        bail!("GET {name} does not return the spec that was written");
    }
    let load = run_load(&target, pid, conns, Some(duration), u64::MAX, Arc::new(move |_| get.clone())).await;
    let note = format!("{:.0} KiB per response", probe.len() as f64 / 1024.0);
    let get = load.row(&format!("ShootState GET 100 KiB, {label}"), conns, Goal::None, &note);

    // How the values were stored, read from the store file by `storage inspect` (the server must be stopped).
    server.stop().await?;
    let items = stored_shootstates(bin, &server.data_dir())?;
    let expected = if label == "identity" { "identity" } else { "aesgcm:v1:key1" };
    let matching = items.iter().filter(|e| e["encryption"] == expected).count();
    if matching != items.len() || items.len() as u64 != created + 1 {
        bail!(
            "storage inspect: {matching} of {} stored ShootStates are {expected}, {} were created",
            items.len(),
            created + 1
        );
    }
    create.notes += &format!("; storage inspect: all {} stored as {expected}", thousands(items.len() as f64));
    Ok((create, get))
}

/// What `storage inspect` reports of the stored ShootStates (key, encryption, apiVersion, ...) of a stopped server.
fn stored_shootstates(bin: &Path, data_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let inspect = Command::new(bin).args(["storage", "inspect", "-o", "json", "--data-dir"]).arg(data_dir).output()?;
    if !inspect.status.success() {
        bail!("storage inspect: {}", String::from_utf8_lossy(&inspect.stderr));
    }
    let all: Value = serde_json::from_slice(&inspect.stdout).context("storage inspect -o json")?;
    let items = all["items"].as_array().context("storage inspect -o json has no items")?;
    let ours = |e: &&Value| e["key"].as_str().is_some_and(|k| k.starts_with(SHOOTSTATE_KEYS));
    Ok(items.iter().filter(ours).cloned().collect())
}

/// A ShootState of about 100 KiB, mostly the certificates and keys of its `gardener` secrets, as real ones are.
fn big_shoot_state(ns: &str, name: &str) -> Value {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut random_b64 = |len: usize| {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let mut gardener = Vec::new();
    let mut object = Value::Null;
    for k in 0.. {
        object = json!({
            "apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
            "metadata": {"name": name, "namespace": ns, "labels": {"shoot.gardener.cloud/name": "bench"}},
            "spec": {
                "gardener": gardener,
                "extensions": [
                    {"kind": "Infrastructure", "purpose": "aws", "state": {"vpc": {"id": "vpc-0a1b2c3d", "cidr": "10.250.0.0/16"}}},
                    {"kind": "Worker", "state": {"machineDeployments": {"pool-a": {"replicas": 3}}}},
                ],
            },
        });
        if object.to_string().len() >= 100 * 1024 {
            break;
        }
        gardener.push(json!({
            "name": format!("secret-{k}"), "type": "secret",
            "labels": {"managed-by": "secrets-manager", "manager-identity": "gardenlet"},
            "data": {"ca.crt": random_b64(900), "ca.key": random_b64(1200)},
        }));
    }
    object
}

// The migrator (issue 4).

/// Migrations of 10^4 and 10^5 (--quick: 10^3 and 10^4) objects, each by a fresh migrating server.
async fn migration_rows(bin: &Path, quick: bool) -> Vec<Row> {
    let sizes: [u64; 2] = if quick { [1_000, 10_000] } else { [10_000, 100_000] };
    let mut rows = Vec::new();
    let mut peaks = Vec::new();
    for n in sizes {
        let scenario = format!("migrate 10^{} objects (--migration-qps 0)", n.ilog10());
        eprintln!("bench: {scenario}");
        match migrate(bin, n, &scenario).await {
            Ok((row, peak, growth)) => {
                rows.push(row);
                peaks.push((n, peak, growth));
            }
            Err(e) => rows.push(Row::failed(scenario, e)),
        }
    }
    if let [(n1, peak1, _), (n2, peak2, growth2)] = peaks[..] {
        let across = peak2.saturating_sub(peak1);
        let worst = across.max(growth2);
        rows.push(Row {
            scenario: format!("migrator peak RSS growth, 10^{} -> 10^{} objects", n1.ilog10(), n2.ilog10()),
            target: Goal::MaxMib(20.0).show(Some(worst as f64 / 1024.0)),
            notes: format!(
                "VmHWM {} -> {} (+{}); during the 10^{} migration alone +{}; the target judges the larger",
                mib(peak1),
                mib(peak2),
                mib(across),
                n2.ilog10(),
                mib(growth2)
            ),
            ..Row::default()
        });
    }
    rows
}

/// A target server holding `n` ShootStates stored as v1alpha1 and restarted with storage version v1beta1, and a
/// second server (the migrator, --kubeconfig to the target, scheduler without trigger, unlimited QPS) asked to
/// migrate them with a StorageVersionMigration. Returns the row, the migrator's peak RSS (VmHWM, KiB) and its
/// growth during the migration.
async fn migrate(bin: &Path, n: u64, scenario: &str) -> anyhow::Result<(Row, u64, u64)> {
    let namespaces = 10;
    let v1alpha1 = ["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1alpha1"];
    let (mut target_server, target) = ServerProcess::start(bin, &v1alpha1).await?;
    let make: MakeReq = Arc::new(move |i| {
        let (ns, name) = (format!("bench-{}", i % namespaces), format!("s-{i:06}"));
        let body = json!({"apiVersion": "core.gardener.cloud/v1alpha1", "kind": "ShootState",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"n": i}}]}});
        Req::post(
            format!("/apis/core.gardener.cloud/v1alpha1/namespaces/{ns}/shootstates"),
            Bytes::from(body.to_string()),
        )
    });
    let seed = run_load(&target, None, 64, None, n, make).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    let v1beta1 = ["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1beta1"];
    let target = target_server.restart(&v1beta1).await?;
    let kubeconfig = target_server.kubeconfig().to_string_lossy().into_owned();
    let migrator_args = ["--kubeconfig", kubeconfig.as_str(), "--disable-trigger", "--migration-qps", "0"];
    let (mut migrator_server, migrator) = ServerProcess::start(bin, &migrator_args).await?;
    let (mpid, tpid) = (migrator_server.child.id(), target_server.child.id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let hwm_before = hwm_kib(mpid).context("no VmHWM for the migrator")?;
    let requests_before = target_requests(&target).await?;

    let name = format!("bench-shootstates-{n}");
    let svm = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name, "labels": {"migration.k8s.io/resource": "shootstates.core.gardener.cloud"}},
        "spec": {"resource": {"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"}},
    });
    let cpu0 = (CpuTicks::now(Some(mpid)), cpu_ticks(tpid));
    let started = Instant::now();
    migrator.call_ok(&Req::post(format!("{API}/storageversionmigrations"), Bytes::from(svm.to_string()))).await?;
    let mut conn = migrator.connect().await?;
    let status = loop {
        let svm: Value =
            serde_json::from_slice(&conn.call_ok(&Req::get(format!("{API}/storageversionmigrations/{name}"))).await?)?;
        let condition = |t: &str| {
            svm["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
                .cloned()
        };
        if let Some(failed) = condition("Failed") {
            bail!("the migration failed: {failed}");
        }
        if condition("Succeeded").is_some() {
            break svm["status"].clone();
        }
        if let Some(exit) = migrator_server.exited().or_else(|| target_server.exited()) {
            bail!("a server exited during the migration ({exit})");
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("the migration did not finish within 15 min: {}", svm["status"]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    let cpu = cpu0
        .0
        .usage_since(Some(mpid), took)
        .replace("server", &format!("target {}, migrator", cores(cpu0.1, cpu_ticks(tpid), took)));
    let hwm = hwm_kib(mpid).context("no VmHWM for the migrator")?;
    let requests = target_requests(&target).await?;
    if status["migratedObjects"] != n {
        bail!("the migration succeeded with migratedObjects {} instead of {n}", status["migratedObjects"]);
    }
    drop(migrator_server);

    // Every object is stored in the new version now.
    target_server.stop().await?;
    let items = stored_shootstates(bin, &target_server.data_dir())?;
    let migrated = items.iter().filter(|e| e["apiVersion"] == "core.gardener.cloud/v1beta1").count() as u64;
    if migrated != n || items.len() as u64 != n {
        bail!("after the migration {migrated} of {} stored ShootStates are v1beta1 (expected all {n})", items.len());
    }

    let mut by_verb: BTreeMap<String, f64> = BTreeMap::new();
    for (verb, after) in &requests {
        let d = after - requests_before.get(verb).copied().unwrap_or(0.0);
        if d > 0.0 {
            by_verb.insert(verb.clone(), d);
        }
    }
    let total: f64 = by_verb.values().sum();
    if total < n as f64 {
        bail!("the target counted {total} ShootState requests (apiserver_request_total) for {n} migrated objects");
    }
    let verbs: Vec<String> = by_verb.iter().map(|(v, c)| format!("{} {v}", thousands(*c))).collect();
    let rate = n as f64 / took.as_secs_f64();
    let growth = hwm.saturating_sub(hwm_before);
    let notes = format!(
        "{} objects in {:.1} s; at the target {} requests ({}) = {:.3} per object; migrator VmHWM {}, +{} during the \
         migration; afterwards storage inspect: all {} stored as v1beta1; {cpu}",
        thousands(n as f64),
        took.as_secs_f64(),
        thousands(total),
        verbs.join(", "),
        total / n as f64,
        mib(hwm),
        mib(growth),
        thousands(n as f64),
    );
    let row = Row {
        scenario: scenario.to_string(),
        rps: thousands(rate),
        target: Goal::MinRps(2_000.0).show(Some(rate)),
        notes,
        rps_v: Some(rate),
        ..Row::default()
    };
    Ok((row, hwm, growth))
}

/// The target's request counters for ShootStates (`apiserver_request_total`), summed by verb.
async fn target_requests(target: &Target) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = target.call_ok(&Req::get("/metrics".into()).accept("text/plain")).await?;
    let mut by_verb = BTreeMap::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let Some(labels) = line.strip_prefix("apiserver_request_total{") else { continue };
        if !labels.contains("resource=\"shootstates\"") {
            continue;
        }
        let verb = labels.split("verb=\"").nth(1).and_then(|v| v.split('"').next()).unwrap_or("?").to_string();
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *by_verb.entry(verb).or_default() += value;
    }
    Ok(by_verb)
}

// The etcd backend (issue 6).

/// GET, LIST (JSON), CREATE and watch fan-out against a server on a fresh etcd, as rows paired with the embedded
/// store's. A write must show up in etcd first, so that a server that ignores --etcd-servers cannot pass for one
/// on etcd.
async fn etcd_rows(bin: &Path, etcd_bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    match etcd_rows_inner(bin, etcd_bin, conns, duration, run).await {
        Ok(rows) => rows,
        Err(e) => vec![Row::failed("etcd backend (GET, CREATE, LIST, watch)".into(), e)],
    }
}

async fn etcd_rows_inner(
    bin: &Path,
    etcd_bin: &Path,
    conns: usize,
    duration: Duration,
    run: &str,
) -> anyhow::Result<Vec<Row>> {
    let etcd = EtcdProcess::start(etcd_bin).await?;
    let prefix = format!("/bench-{run}");
    let url = format!("http://{}", etcd.client);
    let args = ["--disable-scheduler", "--etcd-servers", url.as_str(), "--etcd-prefix", prefix.as_str()];
    let (mut server, target) = ServerProcess::start(bin, &args).await?;
    let pid = Some(server.child.id());
    target.call_ok(&Req::post(format!("{API}/storagestates"), storage_state(&format!("etcd-probe-{run}")))).await?;
    let keys = etcd.count(&format!("{prefix}/")).await?;
    if keys == 0 {
        bail!(
            "the server does not keep its data in etcd (nothing under {prefix}/ after a create): this build of the \
             server ignores --etcd-servers"
        );
    }
    eprintln!("bench: etcd {} (pid {}), server on it", etcd.client, etcd.child.id());
    let (mut rows, created) = core_rows(&target, pid, conns, duration, run, false).await;
    if let Some(exit) = server.exited() {
        bail!("the server on etcd exited ({exit})");
    }
    let keys = etcd.count(&format!("{prefix}/")).await?;
    let etcd_kib = rss_kib(etcd.child.id());
    for row in &mut rows {
        row.pair = Some(row.scenario.clone());
        row.scenario += ", on etcd";
        // The targets are the embedded store's (issue 2); etcd's rows are there for the ratio.
        row.target.clear();
        if row.scenario.starts_with("CREATE") {
            row.notes += &format!(
                "; etcd holds {} keys under {prefix}/ ({} created by this step); etcd VmRSS {}",
                thousands(keys as f64),
                thousands(created as f64),
                etcd_kib.map_or("?".into(), mib)
            );
        }
    }
    Ok(rows)
}

/// Puts each row with a `pair` right after the row it pairs with, with the ratio of their figures (to `whose`) in
/// its notes.
fn merge_pairs(rows: &mut Vec<Row>, paired: Vec<Row>, whose: &str) {
    for mut row in paired {
        match row.pair.as_ref().and_then(|p| rows.iter().rposition(|r| &r.scenario == p)) {
            Some(i) => {
                let ratio = ratio_note(&row, &rows[i], whose);
                if !ratio.is_empty() {
                    row.notes = format!("{ratio}; {}", row.notes);
                }
                rows.insert(i + 1, row);
            }
            None => rows.push(row),
        }
    }
}

/// "requests/s x0.42 of <whose>, p99 x2.10": how `row` compares with `base`.
fn ratio_note(row: &Row, base: &Row, whose: &str) -> String {
    let mut parts = Vec::new();
    if let (Some(a), Some(b)) = (row.rps_v, base.rps_v) {
        if b > 0.0 {
            parts.push(format!("requests/s x{:.2} of {whose}", a / b));
        }
    }
    if let (Some(a), Some(b)) = (row.p99_v, base.p99_v) {
        if b > 0.0 {
            parts.push(format!("p99 x{:.2}", a / b));
        }
    }
    parts.join(", ")
}

/// etcd on free loopback ports with a temporary data directory; killed and removed on drop.
struct EtcdProcess {
    child: Child,
    dir: PathBuf,
    /// host:port of the client URL (plain HTTP).
    client: String,
}

impl EtcdProcess {
    async fn start(bin: &Path) -> anyhow::Result<EtcdProcess> {
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let dir =
            std::env::temp_dir().join(format!("migration-apiserver-bench-etcd-{}-{client_port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let client = format!("127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(bin)
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.join("data"))
            .args([
                "--listen-client-urls",
                &format!("http://{client}"),
                "--advertise-client-urls",
                &format!("http://{client}"),
            ])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bench={peer}"), "--initial-cluster-state", "new"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut etcd = EtcdProcess { child, dir, client };
        let started = Instant::now();
        loop {
            if let Some(status) = etcd.child.try_wait()? {
                let log = std::fs::read_to_string(etcd.dir.join("etcd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                bail!("etcd exited ({status}): {}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
            match http_plain(&etcd.client, Method::GET, "/health", None).await {
                Ok((s, body)) if s.is_success() && String::from_utf8_lossy(&body).contains("true") => return Ok(etcd),
                _ if started.elapsed() > Duration::from_secs(30) => bail!("etcd did not become healthy within 30 s"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The number of keys under `prefix` (through etcd's gRPC gateway).
    async fn count(&self, prefix: &str) -> anyhow::Result<u64> {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body = json!({"key": b64(prefix.as_bytes()), "range_end": b64(&end), "count_only": true});
        let (status, answer) = http_plain(&self.client, Method::POST, "/v3/kv/range", Some(body)).await?;
        if !status.is_success() {
            bail!("etcd range answered {status}: {}", String::from_utf8_lossy(&answer));
        }
        let v: Value = serde_json::from_slice(&answer)?;
        // int64 fields are strings in the gateway's JSON, and absent when 0.
        Ok(v["count"].as_str().and_then(|c| c.parse().ok()).unwrap_or(0))
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One plain-HTTP request on a new connection (etcd's gateway).
async fn http_plain(
    authority: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let tcp = TcpStream::connect(authority).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, authority)
        .header(CONTENT_TYPE, JSON)
        .body(Full::new(body))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

// Closed-loop load: `conns` workers, each with one keep-alive connection, take request numbers
// from a shared counter until the deadline passes or `limit` requests were issued.

type MakeReq = Arc<dyn Fn(u64) -> Req + Send + Sync>;

struct Load {
    stats: Stats,
    elapsed: Duration,
    cpu: String,
}

/// Checks the body of a successful response to request number `i`; an `Err` counts the request as failed.
type Check = Arc<dyn Fn(u64, &[u8]) -> Result<(), String> + Send + Sync>;

async fn run_load(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Option<Duration>,
    limit: u64,
    make: MakeReq,
) -> Load {
    run_load_checked(target, pid, conns, duration, limit, make, None).await
}

/// [`run_load`], with every successful answer checked by `check`.
async fn run_load_checked(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Option<Duration>,
    limit: u64,
    make: MakeReq,
    check: Option<Check>,
) -> Load {
    let next = Arc::new(AtomicU64::new(0));
    let cpu0 = CpuTicks::now(pid);
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (target, next, make, check) = (target.clone(), next.clone(), make.clone(), check.clone());
            tokio::spawn(async move { worker(target, next, limit, deadline, make, check).await })
        })
        .collect();
    let mut stats = Stats::default();
    for w in workers {
        match w.await {
            Ok(s) => stats.merge(s),
            Err(e) => stats.error(format!("worker: {e}"), None),
        }
    }
    let elapsed = start.elapsed();
    stats.samples.sort_unstable();
    Load { stats, elapsed, cpu: cpu0.usage_since(pid, elapsed) }
}

async fn worker(
    target: Target,
    next: Arc<AtomicU64>,
    limit: u64,
    deadline: Option<Instant>,
    make: MakeReq,
    check: Option<Check>,
) -> Stats {
    let mut stats = Stats::default();
    let mut conn: Option<LeanConn> = None;
    let mut failed_connects = 0;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match target.connect_lean().await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    stats.error(format!("connect: {e:#}"), None);
                    failed_connects += 1;
                    if failed_connects >= 5 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= limit {
            break;
        }
        let req = make(i);
        let t = Instant::now();
        let answer = c.call(&req).await;
        if c.closed {
            conn = None; // the server closes it after this answer (`Connection: close`)
        }
        match answer {
            Ok((status, body)) if status.is_success() || req.expect == Some(status.as_u16()) => {
                let took = micros(t.elapsed());
                match check.as_ref().map_or(Ok(()), |check| check(i, &body)) {
                    Ok(()) => {
                        stats.ok += 1;
                        stats.samples.push(took);
                    }
                    Err(e) => stats.error(format!("wrong answer: {e}"), Some(WRONG_ANSWER)),
                }
            }
            Ok((status, body)) => stats.error(
                format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])),
                Some(status.as_u16()),
            ),
            Err(e) => {
                stats.error(format!("{e:#}"), None);
                conn = None; // reconnect
            }
        }
    }
    stats
}

/// The `Stats::by_status` key of answers that had a success status but failed their check.
const WRONG_ANSWER: u16 = 1;

#[derive(Default)]
struct Stats {
    ok: u64,
    errors: u64,
    /// Errors by HTTP status; 0 = transport error, [`WRONG_ANSWER`] = a success status with a wrong body.
    by_status: BTreeMap<u16, u64>,
    first_error: Option<String>,
    samples: Vec<u32>,
}

impl Stats {
    fn error(&mut self, msg: String, status: Option<u16>) {
        self.errors += 1;
        *self.by_status.entry(status.unwrap_or(0)).or_default() += 1;
        self.first_error.get_or_insert(msg);
    }

    fn merge(&mut self, o: Stats) {
        (self.ok, self.errors) = (self.ok + o.ok, self.errors + o.errors);
        o.by_status.into_iter().for_each(|(k, v)| *self.by_status.entry(k).or_default() += v);
        self.first_error = self.first_error.take().or(o.first_error);
        self.samples.extend(o.samples);
    }

    fn error_summary(&self) -> String {
        let by: Vec<String> = self
            .by_status
            .iter()
            .map(|(s, n)| match *s {
                0 => format!("transport: {n}"),
                WRONG_ANSWER => format!("wrong answer: {n}"),
                s => format!("{s}: {n}"),
            })
            .collect();
        let first = self.first_error.as_deref().unwrap_or("").replace('|', "\\|").replace('\n', " ");
        format!("{} errors ({}; first: {first})", self.errors, by.join(", "))
    }
}

impl Load {
    fn row(&self, scenario: &str, conns: usize, goal: Goal, extra: &str) -> Row {
        let rps = self.stats.ok as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let mut notes = format!("{conns} conn, {} ok", thousands(self.stats.ok as f64));
        if self.stats.errors > 0 {
            notes += &format!(", {}", self.stats.error_summary());
        }
        for part in [extra, &self.cpu] {
            if !part.is_empty() {
                notes += &format!("; {part}");
            }
        }
        let s = &self.stats.samples;
        Row {
            scenario: scenario.to_string(),
            rps: thousands(rps),
            p50: pct(s, 0.5),
            p99: pct(s, 0.99),
            target: goal.show((!s.is_empty()).then(|| if let Goal::MaxP99Ms(_) = goal { pct_f(s, 0.99) } else { rps })),
            notes,
            rps_v: Some(rps),
            p99_v: (!s.is_empty()).then(|| pct_f(s, 0.99)),
            ..Row::default()
        }
    }
}

// Table helpers.

#[derive(Default)]
struct Row {
    scenario: String,
    rps: String,
    p50: String,
    p99: String,
    target: String,
    notes: String,
    /// Requests/s and p99 ms as numbers, for ratios between rows.
    rps_v: Option<f64>,
    p99_v: Option<f64>,
    /// The scenario of the row this one is paired with (printed right after it).
    pair: Option<String>,
}

impl Row {
    fn failed(scenario: String, e: anyhow::Error) -> Row {
        Row { scenario, notes: format!("failed: {e:#}"), ..Row::default() }
    }
}

enum Goal {
    MinRps(f64),
    MaxP99Ms(f64),
    MaxMib(f64),
    None,
}

impl Goal {
    /// The target, and whether `value` (requests/s, p99 ms or MiB) meets it.
    fn show(&self, value: Option<f64>) -> String {
        let (text, met) = match *self {
            Goal::MinRps(t) => (format!(">= {}/s", thousands(t)), value.map(|v| v >= t)),
            Goal::MaxP99Ms(t) => (format!("p99 <= {t} ms"), value.map(|v| v <= t)),
            Goal::MaxMib(t) => (format!("<= {t} MiB"), value.map(|v| v <= t)),
            Goal::None => return String::new(),
        };
        match met {
            Some(true) => format!("{text}: met"),
            Some(false) => format!("{text}: **missed**"),
            None => text,
        }
    }
}

fn sorted(samples: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = samples.collect();
    v.sort_unstable();
    v
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Nearest-rank percentile of sorted microsecond samples, in ms.
fn pct_f(sorted: &[u32], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).map_or(f64::NAN, |&us| us as f64 / 1000.0)
}

fn pct(sorted: &[u32], p: f64) -> String {
    if sorted.is_empty() {
        return String::new();
    }
    let ms = pct_f(sorted, p);
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// Objects.

/// Creates of new StorageStates named `<prefix>-<n>.bench.io`.
fn new_states(prefix: String) -> MakeReq {
    Arc::new(move |i| Req::post(format!("{API}/storagestates"), storage_state(&format!("{prefix}-{i}"))))
}

/// A StorageState must be named `<resource>.<group>`.
fn storage_state(resource: &str) -> Bytes {
    let body = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
        "metadata": {"name": format!("{resource}.bench.io")},
        "spec": {"resource": {"group": "bench.io", "resource": resource}},
    });
    Bytes::from(body.to_string())
}

fn migration(name: &str) -> Bytes {
    let body = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    });
    Bytes::from(body.to_string())
}

// HTTP over TLS: one hyper HTTP/1.1 connection per `Conn`, kept alive.

#[derive(Clone)]
struct Req {
    method: Method,
    path: String,
    body: Bytes,
    content_type: Option<&'static str>,
    accept: &'static str,
    /// A status other than 2xx that is this request's right answer.
    expect: Option<u16>,
}

impl Req {
    fn get(path: String) -> Req {
        Req { method: Method::GET, path, body: Bytes::new(), content_type: None, accept: JSON, expect: None }
    }
    fn post(path: String, body: Bytes) -> Req {
        Req { method: Method::POST, body, content_type: Some(JSON), ..Req::get(path) }
    }
    fn patch(path: String, body: Value) -> Req {
        Req {
            method: Method::PATCH,
            body: Bytes::from(body.to_string()),
            content_type: Some(MERGE_PATCH),
            ..Req::get(path)
        }
    }
    fn accept(self, accept: &'static str) -> Req {
        Req { accept, ..self }
    }
    fn expect(self, status: u16) -> Req {
        Req { expect: Some(status), ..self }
    }
}

#[derive(Clone)]
struct Target {
    tls: TlsConnector,
    server_name: ServerName<'static>,
    host: String,
    port: u16,
    authority: String,
}

impl Target {
    /// CA and client certificate from the kubeconfig; the server URL from it unless `url` is given.
    fn from_kubeconfig(path: &Path, url: Option<&str>) -> anyhow::Result<Target> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let field = |key: &str| {
            text.lines()
                .find_map(|l| {
                    l.trim().strip_prefix(key)?.strip_prefix(':').map(|v| v.trim().trim_matches('"').to_string())
                })
                .with_context(|| format!("{} has no {key}", path.display()))
        };
        let data = |key: &str| -> anyhow::Result<Vec<u8>> {
            base64::engine::general_purpose::STANDARD
                .decode(field(key)?)
                .with_context(|| format!("{key} is not base64"))
        };
        let url = match url {
            Some(u) => u.to_string(),
            None => field("server")?,
        };
        let rest = url.strip_prefix("https://").context("the server URL must be https://")?;
        let authority = rest.split('/').next().unwrap_or_default().to_string();
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !p.ends_with(']') => (h, p.parse().with_context(|| format!("bad port in {url}"))?),
            _ => (authority.as_str(), 443),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();

        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&data("certificate-authority-data")?) {
            roots.add(cert.map_err(|e| anyhow!("CA: {e:?}"))?)?;
        }
        let chain = CertificateDer::pem_slice_iter(&data("client-certificate-data")?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("client certificate: {e:?}"))?;
        let key = PrivateKeyDer::from_pem_slice(&data("client-key-data")?).map_err(|e| anyhow!("client key: {e:?}"))?;
        // The cipher suites in the order kube-apiserver's Go client offers them on hardware with AES instructions
        // (AES-128-GCM first), so that the server negotiates what it would with kube-apiserver.
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites.sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host.clone()).with_context(|| format!("bad host {host}"))?;
        Ok(Target { tls: TlsConnector::from(Arc::new(config)), server_name, host, port, authority })
    }

    async fn connect(&self) -> anyhow::Result<Conn> {
        let tls = self.connect_tls().await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(connection);
        Ok(Conn { sender, authority: self.authority.clone() })
    }

    /// A connection for the load workers' own HTTP/1.1 client.
    async fn connect_lean(&self) -> anyhow::Result<LeanConn> {
        Ok(LeanConn::new(self.connect_tls().await?, &self.authority))
    }

    async fn connect_tls(&self) -> anyhow::Result<TlsStream<TcpStream>> {
        // A server that cannot accept (out of file descriptors, stopped) must not hang the bench.
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .map_err(|_| anyhow!("timed out"))
            .and_then(|r| Ok(r?))
            .with_context(|| format!("connecting to {}", self.authority))?;
        tcp.set_nodelay(true)?;
        tokio::time::timeout(CONNECT_TIMEOUT, self.tls.connect(self.server_name.clone(), tcp))
            .await
            .map_err(|_| anyhow!("timed out"))
            .and_then(|r| Ok(r?))
            .context("TLS handshake")
    }

    /// One request on a fresh connection (setup steps).
    async fn call_ok(&self, req: &Req) -> anyhow::Result<Bytes> {
        self.connect().await?.call_ok(req).await
    }
}

struct Conn {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
}

impl Conn {
    async fn send(&mut self, req: &Req) -> anyhow::Result<Response<Incoming>> {
        let mut builder = Request::builder()
            .method(req.method.clone())
            .uri(&req.path)
            .header(HOST, &self.authority)
            .header(ACCEPT, req.accept);
        if let Some(ct) = req.content_type {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        let request = builder.body(Full::new(req.body.clone()))?;
        self.sender.ready().await?;
        Ok(self.sender.send_request(request).await?)
    }

    /// One request and its whole answer, within [`REQUEST_TIMEOUT`].
    async fn call(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        let call = async {
            let resp = self.send(req).await?;
            let status = resp.status();
            Ok((status, resp.into_body().collect().await?.to_bytes()))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| anyhow!("{} {}: no answer within {REQUEST_TIMEOUT:?}", req.method, req.path))?
    }

    async fn call_ok(&mut self, req: &Req) -> anyhow::Result<Bytes> {
        match self.call(req).await? {
            (s, body) if s.is_success() => Ok(body),
            (s, body) => bail!("{} {} answered {s}: {}", req.method, req.path, String::from_utf8_lossy(&body)),
        }
    }
}

// The load workers' HTTP/1.1 client, written on the TLS stream: hyper's client (a connection task fed
// through channels, a `Request` and header map built per call) costs tens of µs of CPU per request, taken
// from the server under test when both share the machine. Here a request is serialized into a reused
// buffer and written at once, and its answer read into another reused buffer and parsed in place.

/// Largest response head accepted (status line and headers), and largest chunk-size or trailer line.
const MAX_HEAD: usize = 64 * 1024;
const MAX_LINE: usize = 4096;
/// Room made in the read buffer before each read when the answer's size is not known yet: a whole TLS record.
const READ_ROOM: usize = 16 * 1024;

/// One keep-alive HTTP/1.1 connection of a load worker, one request at a time.
struct LeanConn {
    tls: TlsStream<TcpStream>,
    /// The Host header, `host: <authority>\r\n`.
    host: Vec<u8>,
    /// The request being written.
    out: Vec<u8>,
    /// Bytes read and not parsed yet.
    input: BytesMut,
    parser: ResponseParser,
    /// The server closes the connection after the last answer (`Connection: close`, or a body until EOF):
    /// the caller must not reuse it.
    closed: bool,
}

impl LeanConn {
    fn new(tls: TlsStream<TcpStream>, authority: &str) -> LeanConn {
        LeanConn {
            tls,
            host: format!("host: {authority}\r\n").into_bytes(),
            out: Vec::with_capacity(4096),
            input: BytesMut::with_capacity(READ_ROOM),
            parser: ResponseParser::default(),
            closed: false,
        }
    }

    /// One request and its whole answer, within [`REQUEST_TIMEOUT`] (as [`Conn::call`]). After an error the
    /// connection is in an unknown state and must be dropped.
    async fn call(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(req))
            .await
            .map_err(|_| anyhow!("{} {}: no answer within {REQUEST_TIMEOUT:?}", req.method, req.path))?
    }

    async fn exchange(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        anyhow::ensure!(!self.closed, "the server closed the connection");
        write_request(&mut self.out, &self.host, req);
        self.tls.write_all(&self.out).await?;
        self.tls.flush().await?;
        self.parser.start(req.method == Method::HEAD);
        loop {
            if let Some(answer) = self.parser.advance(&mut self.input)? {
                self.closed = answer.close;
                return Ok((answer.status, answer.body));
            }
            self.input.reserve(self.parser.missing(self.input.len()).max(READ_ROOM));
            if self.tls.read_buf(&mut self.input).await? == 0 {
                let answer = self.parser.at_eof(&mut self.input)?;
                self.closed = true;
                return Ok((answer.status, answer.body));
            }
        }
    }
}

/// Serializes `req` into `out` (cleared first): request line, the headers [`Conn::send`] sends through
/// hyper (Host, Accept, Content-Type when set) and the Content-Length of the body, then the body.
fn write_request(out: &mut Vec<u8>, host: &[u8], req: &Req) {
    use std::io::Write;
    debug_assert!(!req.path.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()), "{}", req.path);
    out.clear();
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    out.extend_from_slice(host);
    out.extend_from_slice(b"accept: ");
    out.extend_from_slice(req.accept.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(ct) = req.content_type {
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(ct.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !req.body.is_empty() || [Method::POST, Method::PUT, Method::PATCH].contains(&req.method) {
        let _ = write!(out, "content-length: {}\r\n", req.body.len());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&req.body);
}

/// A complete answer.
#[derive(Debug)]
struct Answer {
    status: hyper::StatusCode,
    body: Bytes,
    /// The server closes the connection after this answer.
    close: bool,
}

/// Incremental parser of the answers of one connection: fed by [`ResponseParser::advance`] with the bytes
/// read so far, it consumes what it has parsed and leaves what follows the answer (the next one) in place.
#[derive(Default)]
struct ResponseParser {
    stage: Stage,
    /// The request was a HEAD: no body whatever the headers say.
    head_request: bool,
    status: Option<hyper::StatusCode>,
    close: bool,
    /// The body of a chunked answer, put together (kept to reuse its memory).
    chunks: BytesMut,
}

#[derive(Default, Debug, PartialEq)]
enum Stage {
    #[default]
    Head,
    /// A body of this many bytes (`Content-Length`).
    Length(usize),
    /// A chunked body: expecting a chunk-size line.
    ChunkSize,
    /// This many bytes of the current chunk to go, then its CRLF.
    ChunkData(usize),
    ChunkEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
    /// A body until the server closes the connection.
    UntilEof,
}

impl ResponseParser {
    /// Expects the answer to a new request.
    fn start(&mut self, head_request: bool) {
        (self.stage, self.head_request, self.status, self.close) = (Stage::Head, head_request, None, false);
        self.chunks.clear();
    }

    /// Bytes still needed beyond the `buffered` ones when that is known (a body), else 0.
    fn missing(&self, buffered: usize) -> usize {
        match self.stage {
            Stage::Length(n) | Stage::ChunkData(n) => n.saturating_sub(buffered),
            _ => 0,
        }
    }

    fn answer(&mut self, body: Bytes) -> anyhow::Result<Answer> {
        let status = self.status.take().context("no status")?;
        self.stage = Stage::Head;
        Ok(Answer { status, body, close: self.close })
    }

    /// Parses from `buf`, consuming what it parsed: the complete answer, or `None` when more bytes are needed.
    fn advance(&mut self, buf: &mut BytesMut) -> anyhow::Result<Option<Answer>> {
        loop {
            match self.stage {
                Stage::Head => {
                    if !self.head(buf)? {
                        return Ok(None);
                    }
                }
                Stage::Length(n) => {
                    if buf.len() < n {
                        return Ok(None);
                    }
                    let body = buf.split_to(n).freeze();
                    return self.answer(body).map(Some);
                }
                Stage::ChunkSize => {
                    if !buf.first().is_none_or(u8::is_ascii_hexdigit) {
                        bail!("bad chunk size line {:?}", String::from_utf8_lossy(&buf[..buf.len().min(40)]));
                    }
                    match httparse::parse_chunk_size(buf) {
                        Ok(httparse::Status::Complete((used, size))) => {
                            buf.advance(used);
                            let size = usize::try_from(size).context("chunk too large")?;
                            self.stage = if size == 0 { Stage::Trailers } else { Stage::ChunkData(size) };
                        }
                        Ok(httparse::Status::Partial) if buf.len() < MAX_LINE => return Ok(None),
                        _ => bail!("bad chunk size line {:?}", String::from_utf8_lossy(&buf[..buf.len().min(40)])),
                    }
                }
                Stage::ChunkData(n) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = n.min(buf.len());
                    self.chunks.extend_from_slice(&buf[..take]);
                    buf.advance(take);
                    self.stage = if take == n { Stage::ChunkEnd } else { Stage::ChunkData(n - take) };
                }
                Stage::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    anyhow::ensure!(&buf[..2] == b"\r\n", "chunk data not followed by CRLF");
                    buf.advance(2);
                    self.stage = Stage::ChunkSize;
                }
                Stage::Trailers => {
                    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                        anyhow::ensure!(buf.len() < MAX_LINE, "trailer line too long");
                        return Ok(None);
                    };
                    let empty = nl == 0 || (nl == 1 && buf[0] == b'\r');
                    buf.advance(nl + 1);
                    if empty {
                        let body = self.chunks.split().freeze();
                        return self.answer(body).map(Some);
                    }
                }
                Stage::UntilEof => return Ok(None),
            }
        }
    }

    /// The connection reached EOF with `buf` left: completes an answer whose body ends there, else an error.
    fn at_eof(&mut self, buf: &mut BytesMut) -> anyhow::Result<Answer> {
        match self.stage {
            Stage::UntilEof => {
                let body = buf.split().freeze();
                self.answer(body)
            }
            Stage::Head if buf.is_empty() => bail!("the server closed the connection"),
            _ => bail!("the server closed the connection in the middle of an answer"),
        }
    }

    /// Parses the status line and headers when complete: consumes them and picks how the body is framed.
    /// Interim (1xx) answers are skipped.
    fn head(&mut self, buf: &mut BytesMut) -> anyhow::Result<bool> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let used = match resp.parse(buf) {
            Ok(httparse::Status::Complete(used)) => used,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(false),
            Ok(httparse::Status::Partial) => bail!("response head larger than {MAX_HEAD} bytes"),
            Err(e) => bail!("bad response head ({e}): {:?}", String::from_utf8_lossy(&buf[..buf.len().min(200)])),
        };
        let code = resp.code.context("no status code")?;
        let status = hyper::StatusCode::from_u16(code).with_context(|| format!("bad status {code}"))?;
        let (mut length, mut chunked, mut encoded, mut close, mut keep_alive) = (None, false, false, false, false);
        for h in resp.headers.iter() {
            let value = || std::str::from_utf8(h.value).unwrap_or("").split(',').map(str::trim);
            if h.name.eq_ignore_ascii_case("content-length") {
                let n: usize = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .with_context(|| format!("bad Content-Length {:?}", String::from_utf8_lossy(h.value)))?;
                anyhow::ensure!(length.is_none_or(|l| l == n), "conflicting Content-Length headers");
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                // The last coding applied says whether the body is chunked.
                encoded = true;
                chunked = value().next_back().is_some_and(|c| c.eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("connection") {
                close |= value().any(|t| t.eq_ignore_ascii_case("close"));
                keep_alive |= value().any(|t| t.eq_ignore_ascii_case("keep-alive"));
            }
        }
        let http10 = resp.version == Some(0);
        buf.advance(used);
        if status.is_informational() {
            anyhow::ensure!(status != hyper::StatusCode::SWITCHING_PROTOCOLS, "unexpected 101 Switching Protocols");
            return Ok(true); // the real answer follows
        }
        self.status = Some(status);
        self.close = close || (http10 && !keep_alive);
        self.stage = if self.head_request
            || status == hyper::StatusCode::NO_CONTENT
            || status == hyper::StatusCode::NOT_MODIFIED
        {
            Stage::Length(0)
        } else if chunked {
            Stage::ChunkSize
        } else if let (false, Some(n)) = (encoded, length) {
            Stage::Length(n)
        } else {
            self.close = true;
            Stage::UntilEof
        };
        Ok(true)
    }
}

// The server under test, when started by us: killed and its directory removed on drop.

struct ServerProcess {
    child: Child,
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// The CPUs it may run on, when not all.
    cpus: Option<Vec<usize>>,
    /// How the server ended, when it ended by itself.
    died: Option<String>,
    /// Stopped by us (`stop`), not died.
    stopped: bool,
}

impl ServerProcess {
    /// Starts `bin serve` in a new temporary directory on a free port and waits for /readyz.
    async fn start(bin: &Path, extra_args: &[&str]) -> anyhow::Result<(ServerProcess, Target)> {
        Self::start_on(bin, extra_args, None).await
    }

    /// [`ServerProcess::start`], with the server (and its restarts) on `cpus` only when given.
    async fn start_on(
        bin: &Path,
        extra_args: &[&str],
        cpus: Option<&[usize]>,
    ) -> anyhow::Result<(ServerProcess, Target)> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = Self::spawn(bin, &dir, port, extra_args, cpus)?;
        let cpus = cpus.map(<[usize]>::to_vec);
        let mut server = ServerProcess { child, bin: bin.to_path_buf(), dir, port, cpus, died: None, stopped: false };
        let target = server.wait_ready().await?;
        Ok((server, target))
    }

    fn spawn(bin: &Path, dir: &Path, port: u16, extra_args: &[&str], cpus: Option<&[usize]>) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("server.log"))?;
        let (data, certs) = (dir.join("data"), dir.join("certs"));
        let mut command = Command::new(bin);
        command
            .args(["serve", "--secure-port", &port.to_string(), "--bind-address", "127.0.0.1", "--data-dir"])
            .args([data.as_os_str(), "--cert-dir".as_ref(), certs.as_os_str()])
            .args(extra_args)
            // Its runtime sizes itself by the CPUs it may use, one worker thread each, as the admission rows' notes say.
            .env_remove("TOKIO_WORKER_THREADS")
            // A panic's backtrace lands in the log (kept when the server dies; see `Drop`).
            .env("RUST_BACKTRACE", std::env::var_os("RUST_BACKTRACE").unwrap_or("1".into()))
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null());
        let child = match cpus {
            None => command.spawn(),
            // A child starts with the CPU affinity of the thread that starts it: a thread of its own, pinned.
            Some(cpus) => std::thread::scope(|s| {
                s.spawn(|| pin_current_thread(cpus).and_then(|()| command.spawn()))
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the thread starting the server panicked")))
            }),
        }
        .with_context(|| format!("starting {}", bin.display()))?;
        let on = cpus.map_or(String::new(), |c| format!(" on {}", cpu_list(c)));
        eprintln!("bench: started {} {} (pid {}) on port {port}{on}", bin.display(), extra_args.join(" "), child.id());
        Ok(child)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<Target> {
        let kubeconfig = self.kubeconfig();
        let started = Instant::now();
        let mut last_err = anyhow!("not started");
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(exit) = self.exited() {
                bail!("the server exited ({exit})");
            }
            let ready = async {
                let target = Target::from_kubeconfig(&kubeconfig, None)?;
                target.call_ok(&Req::get("/readyz".into())).await?;
                Ok::<_, anyhow::Error>(target)
            };
            match ready.await {
                Ok(target) => return Ok(target),
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last_err.context("the server did not become ready within 60 s"))
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("certs/admin.kubeconfig")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Stops the server (SIGTERM, then SIGKILL after 20 s) and keeps its directory.
    async fn stop(&mut self) -> anyhow::Result<()> {
        if self.exited().is_some() {
            bail!("the server had exited by itself");
        }
        self.stopped = true;
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        // std has SIGKILL only; a graceful stop closes the store cleanly.
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Stops the server and starts it again on the same directory and port with `extra_args`.
    async fn restart(&mut self, extra_args: &[&str]) -> anyhow::Result<Target> {
        self.stop().await?;
        self.child = Self::spawn(&self.bin, &self.dir, self.port, extra_args, self.cpus.as_deref())?;
        self.stopped = false;
        self.wait_ready().await
    }

    /// If the server has exited: how, after printing the end of its log to stderr.
    fn exited(&mut self) -> Option<String> {
        if let Some(died) = &self.died {
            return Some(died.clone());
        }
        if self.stopped {
            return None;
        }
        let status = self.child.try_wait().ok()??;
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("bench: the server (pid {}) exited ({status}); the end of its log:", self.child.id());
        tail.iter().rev().for_each(|l| eprintln!("  {l}"));
        self.died = Some(status.to_string());
        Some(status.to_string())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // A server that died by itself keeps its whole log.
        if self.exited().is_some() {
            let kept = self.dir.with_extension("log");
            if std::fs::copy(self.dir.join("server.log"), &kept).is_ok() {
                eprintln!("bench: the log of the server that exited is kept in {}", kept.display());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `program` itself when it is a path, else the first file of that name in PATH.
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

// /proc readings.

fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident set size.
fn hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    proc_status(pid, field)?.trim_end_matches("kB").trim().parse().ok()
}

/// The value of `field` (with its colon) in `/proc/<pid>/status`, trimmed.
fn proc_status(pid: u32, field: &str) -> Option<String> {
    status_value(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, field).map(str::to_owned)
}

/// The value of `field` (with its colon) in the text of a `/proc/<pid>/status`, trimmed.
fn status_value<'s>(status: &'s str, field: &str) -> Option<&'s str> {
    status.lines().find_map(|l| l.strip_prefix(field)).map(str::trim)
}

/// Cores used between two `cpu_ticks` readings `elapsed` apart.
fn cores(before: Option<u64>, after: Option<u64>, elapsed: Duration) -> String {
    match (before, after) {
        (Some(a), Some(b)) => format!("{:.2}", b.saturating_sub(a) as f64 / (elapsed.as_secs_f64() * 100.0)),
        _ => "?".into(),
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Busy (not idle, not iowait) and stolen ticks of the whole machine: load from other processes, and from
/// other guests of the host when this is a VM.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let t: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    Some((t.iter().take(8).sum::<u64>() - t.get(3)? - t.get(4)?, *t.get(7)?))
}

/// CPU time of the server, of the bench, and busy/stolen time of the whole machine at one instant.
struct CpuTicks([Option<u64>; 4]);

impl CpuTicks {
    fn now(server: Option<u32>) -> CpuTicks {
        let machine = machine_ticks();
        CpuTicks([
            server.and_then(cpu_ticks),
            cpu_ticks(std::process::id()),
            machine.map(|m| m.0),
            machine.map(|m| m.1),
        ])
    }

    /// Cores used since `self`: `/proc` counts USER_HZ = 100 ticks per second.
    fn usage_since(&self, server: Option<u32>, elapsed: Duration) -> String {
        let now = CpuTicks::now(server);
        let c: Vec<String> = (0..4).map(|i| cores(self.0[i], now.0[i], elapsed)).collect();
        format!("CPU cores used: server {}, bench {}, whole machine {} (stolen {})", c[0], c[1], c[2], c[3])
    }
}

// CPU affinity, to give the server and the bench separate CPUs (admission rows).

/// The CPUs the calling thread may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a cpu_set_t is a plain bit array, valid all zero; the kernel writes at most the size it is given.
    let mut set = unsafe { std::mem::zeroed::<libc::cpu_set_t>() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: every index is below CPU_SETSIZE, the number of bits in the set.
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// Restricts the calling thread, and the threads and processes it starts from now on, to `cpus`.
fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as in `allowed_cpus`; indexes at or above CPU_SETSIZE are refused before CPU_SET.
    let mut set = unsafe { std::mem::zeroed::<libc::cpu_set_t>() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!("CPU {cpu} is beyond the affinity mask")));
        }
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `cpus` in two: the first half (rounded up) for the server, the rest for the bench; `None` below 2 CPUs.
fn split_cpus(mut cpus: Vec<usize>) -> Option<(Vec<usize>, Vec<usize>)> {
    if cpus.len() < 2 {
        return None;
    }
    let bench = cpus.split_off(cpus.len().div_ceil(2));
    Some((cpus, bench))
}

/// What a tokio runtime sized by default has on `cpus` CPUs.
fn workers(cpus: usize) -> String {
    format!("{cpus} worker thread{}", if cpus == 1 { "" } else { "s" })
}

fn cpu_list(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    format!("CPU{} {}", if cpus.len() == 1 { "" } else { "s" }, list.join(","))
}

/// Runs `load` to the end on a runtime of its own, with one worker thread per CPU of `cpus` and every thread
/// restricted to them.
async fn on_cpus<F>(cpus: &[usize], load: F) -> anyhow::Result<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let failed = Arc::new(std::sync::Mutex::new(None));
    let (pinned, failure) = (cpus.to_vec(), failed.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cpus.len())
        .enable_all()
        .on_thread_start(move || {
            if let Err(e) = pin_current_thread(&pinned) {
                failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e.to_string());
            }
        })
        .build()?;
    let handle = runtime.handle().clone();
    let runtime = ShutDownOnDrop(Some(runtime));
    let output = handle.spawn(load).await;
    drop(runtime);
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        bail!("restricting the bench to {}: {e}", cpu_list(cpus));
    }
    Ok(output?)
}

/// Shuts its runtime down without waiting when dropped: dropping a runtime inside another one panics, and Ctrl-C
/// drops the bench's future with the runtime of [`on_cpus`] in it.
struct ShutDownOnDrop(Option<tokio::runtime::Runtime>);

impl Drop for ShutDownOnDrop {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The CPUs process `pid` may run on, from `Cpus_allowed_list` in its `/proc` status.
fn cpus_allowed(pid: u32) -> Option<Vec<usize>> {
    parse_cpu_list(&proc_status(pid, "Cpus_allowed_list:")?)
}

/// A kernel CPU list: `0-2,5` is CPUs 0, 1, 2 and 5.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
        if last < first || last >= libc::CPU_SETSIZE as usize {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_string()));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: Option<u64> =
        meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().trim_end_matches("kB").trim().parse().ok());
    format!(
        "Machine: {} CPUs ({}), {:.1} GiB memory; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        model.unwrap_or_else(|| "unknown model".into()),
        mem_kib.unwrap_or(0) as f64 / (1024.0 * 1024.0),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(response: Value) -> Vec<u8> {
        json!({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "response": response}).to_string().into_bytes()
    }

    #[test]
    fn cpus_split_with_the_larger_half_for_the_server() {
        assert_eq!(split_cpus(vec![]), None);
        assert_eq!(split_cpus(vec![3]), None);
        assert_eq!(split_cpus(vec![0, 1]), Some((vec![0], vec![1])));
        assert_eq!(split_cpus(vec![0, 2, 5]), Some((vec![0, 2], vec![5])));
        assert_eq!(split_cpus(vec![0, 1, 2, 3]), Some((vec![0, 1], vec![2, 3])));
        assert_eq!(cpu_list(&[1]), "CPU 1");
        assert_eq!(cpu_list(&[0, 1]), "CPUs 0,1");
        assert_eq!((workers(1).as_str(), workers(2).as_str()), ("1 worker thread", "2 worker threads"));
        assert_eq!(parse_cpu_list("0-2,5\n"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        for bad in ["", "1-", "2-1", "a", "0,,1", "99999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_pinned_thread_and_what_it_starts_stay_on_its_cpus() {
        let allowed = allowed_cpus();
        assert!(!allowed.is_empty(), "no CPU in this thread's affinity mask");
        let last = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(&[last]).expect("pinning to an allowed CPU");
            assert_eq!(allowed_cpus(), vec![last]);
            // A thread started from here inherits the mask, and so does a process (the server, in the bench).
            assert_eq!(std::thread::spawn(allowed_cpus).join().unwrap(), vec![last]);
            let status = Command::new("cat").arg("/proc/self/status").output().expect("cat /proc/self/status");
            let status = String::from_utf8_lossy(&status.stdout).into_owned();
            let line = status_value(&status, "Cpus_allowed_list:").expect("Cpus_allowed_list");
            assert_eq!(parse_cpu_list(line), Some(vec![last]), "{line}");
        })
        .join()
        .unwrap();
        // Other threads keep theirs, as `/proc` says of the process (its main thread's mask).
        assert_eq!(cpus_allowed(std::process::id()), Some(allowed.clone()));
        assert_eq!(allowed_cpus(), allowed);
        assert!(pin_current_thread(&[libc::CPU_SETSIZE as usize]).is_err());
    }

    #[test]
    fn templates_fill_every_placeholder() {
        let t = Template::new(&admission_review("uid-@N@", "CREATE", &admitted_migration("@N@")));
        let v: Value = serde_json::from_slice(&t.render("r-0000042")).expect("JSON");
        assert_eq!(v["request"]["uid"], "uid-r-0000042");
        assert_eq!(v["request"]["name"], "deployments-r-0000042");
        assert_eq!(v["request"]["object"]["metadata"]["name"], "deployments-r-0000042");
        assert!(!String::from_utf8_lossy(&t.render("x")).contains("@N@"));
    }

    #[test]
    fn wrong_admission_answers_do_not_count() {
        let ok = answer(json!({"uid": "u1", "allowed": true}));
        assert_eq!(check_review(&ok, "u1", None), Ok(()));
        // Another request's uid, a denial, a patch from /validate, a missing or different patch from /mutate.
        assert!(check_review(&ok, "u2", None).is_err());
        assert!(check_review(&answer(json!({"uid": "u1", "allowed": false})), "u1", None).is_err());
        let patched = answer(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch", "patch": "W10="}));
        assert!(check_review(&patched, "u1", None).is_err());
        assert_eq!(check_review(&patched, "u1", Some("W10=")), Ok(()));
        assert!(check_review(&patched, "u1", Some("W3t9XQ==")).is_err());
        assert!(check_review(&ok, "u1", Some("W10=")).is_err());
        assert!(check_review(b"{}", "u1", None).is_err());
        assert!(check_review(b"not json", "u1", None).is_err());
        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true}}"#;
        assert!(check_review(v1beta1, "u1", None).is_err());
    }

    #[test]
    fn paired_rows_follow_their_pair_with_the_ratio() {
        let row = |name: &str, rps: f64, pair: Option<&str>| Row {
            scenario: name.into(),
            rps_v: Some(rps),
            pair: pair.map(String::from),
            ..Row::default()
        };
        let mut rows = vec![row("GET", 1000.0, None), row("LIST", 100.0, None), row("CREATE", 500.0, None)];
        merge_pairs(
            &mut rows,
            vec![row("GET, on etcd", 250.0, Some("GET")), row("CREATE, on etcd", 1000.0, Some("CREATE"))],
            "the embedded store's",
        );
        let names: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
        assert_eq!(names, ["GET", "GET, on etcd", "LIST", "CREATE", "CREATE, on etcd"]);
        assert!(rows[1].notes.starts_with("requests/s x0.25 of the embedded store's"), "{}", rows[1].notes);
        assert!(rows[4].notes.starts_with("requests/s x2.00"), "{}", rows[4].notes);
    }

    /// Feeds `pieces` to one connection's parser as successive reads; every answer completed, and what is left.
    fn parse_reads(pieces: &[&[u8]]) -> anyhow::Result<(Vec<Answer>, Vec<u8>)> {
        let (mut parser, mut buf, mut answers) = (ResponseParser::default(), BytesMut::new(), Vec::new());
        parser.start(false);
        for piece in pieces {
            buf.extend_from_slice(piece);
            while let Some(answer) = parser.advance(&mut buf)? {
                answers.push(answer);
                parser.start(false);
            }
        }
        Ok((answers, buf.to_vec()))
    }

    /// `wire` parsed as one read, split in two at every position, and in reads of 1 and 7 bytes: always the
    /// same answers, nothing left over.
    fn parse_every_way(wire: &[u8]) -> Vec<Answer> {
        let (whole, rest) = parse_reads(&[wire]).expect("parses");
        assert!(rest.is_empty(), "left over: {:?}", String::from_utf8_lossy(&rest));
        let same = |answers: Vec<Answer>, how: &str| {
            let show = |a: &[Answer]| a.iter().map(|a| (a.status, a.body.clone(), a.close)).collect::<Vec<_>>();
            assert_eq!(show(&answers), show(&whole), "{how}");
        };
        for at in 0..=wire.len() {
            let (answers, rest) = parse_reads(&[&wire[..at], &wire[at..]]).expect("parses");
            assert!(rest.is_empty());
            same(answers, &format!("split at {at}"));
        }
        for size in [1, 7] {
            let pieces: Vec<&[u8]> = wire.chunks(size).collect();
            let (answers, rest) = parse_reads(&pieces).expect("parses");
            assert!(rest.is_empty());
            same(answers, &format!("reads of {size} bytes"));
        }
        whole
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n\
        Transfer-Encoding: chunked\r\n\r\n\
        5;name=value\r\n{\"a\":\r\n\
        1C ; quoted=\"x;y\"\r\n \"bbbbbbbbbbbbbbbbbbbbbbbbb\"\r\n\
        1\r\n}\r\n\
        0;last\r\nX-Trailer: 1\r\nOther: two\r\n\r\n";

    #[test]
    fn content_length_answers() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\":\"bc\"}\n";
        let answers = parse_every_way(wire);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].status, hyper::StatusCode::OK);
        assert_eq!(&answers[0].body[..], b"{\"a\":\"bc\"}\n");
        assert!(!answers[0].close);
    }

    #[test]
    fn chunked_answers_with_extensions_and_trailers() {
        let answers = parse_every_way(CHUNKED);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].status, hyper::StatusCode::CREATED);
        assert_eq!(&answers[0].body[..], format!("{{\"a\": \"{}\"}}", "b".repeat(25)).as_bytes());
        assert!(!answers[0].close);
    }

    #[test]
    fn a_big_body_in_many_small_reads() {
        let body: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut wire = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        wire.extend_from_slice(&body);
        for size in [1, 100, 1500, 16 * 1024] {
            let pieces: Vec<&[u8]> = wire.chunks(size).collect();
            let (answers, rest) = parse_reads(&pieces).expect("parses");
            assert!(rest.is_empty());
            assert_eq!(answers.len(), 1);
            assert_eq!(answers[0].body, body);
        }
        // The same body sent in chunks of 1000 bytes.
        let mut wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for chunk in body.chunks(1000) {
            wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            wire.extend_from_slice(chunk);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        for size in [1, 999, 1000, 16 * 1024] {
            let pieces: Vec<&[u8]> = wire.chunks(size).collect();
            let (answers, rest) = parse_reads(&pieces).expect("parses");
            assert!(rest.is_empty());
            assert_eq!(answers.len(), 1);
            assert_eq!(answers[0].body, body);
        }
    }

    #[test]
    fn keep_alive_answers_back_to_back() {
        let mut wire = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec();
        wire.extend_from_slice(CHUNKED);
        wire.extend_from_slice(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        let answers = parse_every_way(&wire);
        let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
        assert_eq!(statuses, [200, 201, 404]);
        assert_eq!(&answers[0].body[..], b"ok");
        assert!(answers[1].body.starts_with(b"{\"a\": \"b"));
        assert!(answers[2].body.is_empty());
        // Two answers in one read, the start of a third one left for the next read.
        let (answers, rest) = parse_reads(&[&wire[..wire.len() - 5]]).expect("parses");
        assert_eq!(answers.len(), 2);
        assert_eq!(rest, &wire[wire.len() - 45..wire.len() - 5]);
    }

    #[test]
    fn answers_that_close_the_connection() {
        let closing = parse_every_way(
            b"HTTP/1.1 503 Service Unavailable\r\nConnection: keep-alive, Close\r\nContent-Length: 4\r\n\r\nbusy",
        );
        assert!(closing[0].close);
        assert_eq!(closing[0].status, hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert!(parse_every_way(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")[0].close);
        assert!(!parse_every_way(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")[0].close);
        // No framing: the body ends with the connection.
        let (mut parser, mut buf) =
            (ResponseParser::default(), BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\nuntil eof"[..]));
        parser.start(false);
        assert!(parser.advance(&mut buf).expect("parses").is_none());
        let answer = parser.at_eof(&mut buf).expect("complete at EOF");
        assert_eq!((&answer.body[..], answer.close), (&b"until eof"[..], true));
        // EOF in the middle of an answer is an error.
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"[..]);
        parser.start(false);
        assert!(parser.advance(&mut buf).expect("parses").is_none());
        assert!(parser.at_eof(&mut buf).is_err());
    }

    #[test]
    fn interim_bodiless_and_head_answers() {
        let wire = b"HTTP/1.1 100 Continue\r\n\r\n\
            HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n\
            HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx";
        let answers = parse_every_way(wire);
        assert_eq!(answers.iter().map(|a| (a.status.as_u16(), a.body.len())).collect::<Vec<_>>(), [(204, 0), (200, 1)]);
        let mut parser = ResponseParser::default();
        parser.start(true);
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 123\r\n\r\n"[..]);
        let answer = parser.advance(&mut buf).expect("parses").expect("complete");
        assert!(answer.body.is_empty() && buf.is_empty());
    }

    #[test]
    fn malformed_answers_are_errors() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"HTTP/9 200 OK\r\n\r\n",
            b"garbage\r\n\r\n",
        ] {
            assert!(parse_reads(&[wire]).is_err(), "{:?}", String::from_utf8_lossy(wire));
        }
    }

    #[test]
    fn requests_carry_their_headers_and_body() {
        let mut out = b"left over".to_vec();
        let host = b"host: 127.0.0.1:8443\r\n";
        write_request(&mut out, host, &Req::post("/validate?timeout=10s".into(), Bytes::from_static(b"{}")));
        assert_eq!(
            out,
            b"POST /validate?timeout=10s HTTP/1.1\r\nhost: 127.0.0.1:8443\r\naccept: application/json\r\n\
              content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        );
        write_request(&mut out, host, &Req::get("/api".into()).accept(TABLE));
        assert_eq!(out, format!("GET /api HTTP/1.1\r\nhost: 127.0.0.1:8443\r\naccept: {TABLE}\r\n\r\n").as_bytes());
    }

    #[test]
    fn big_shoot_state_is_about_100_kib() {
        let len = big_shoot_state("bench", "s-1").to_string().len();
        assert!((100 * 1024..110 * 1024).contains(&len), "{len}");
    }
}

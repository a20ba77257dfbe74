//! `make bench`: a load generator of our own against a real migration-apiserver, over TLS with the
//! admin client certificate of its kubeconfig.
//!
//! Every worker owns one keep-alive HTTP/1.1 connection (tokio-rustls + hyper's client `conn`) and
//! reuses it for all its requests. Latencies of successful requests are recorded one by one and
//! percentiles are read from the sorted samples. Results are printed as a markdown table next to
//! their targets; missing a target never fails the run (see BENCHMARKS.md).

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const API: &str = "/apis/migration.k8s.io/v1alpha1";
const JSON: &str = "application/json";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const MERGE_PATCH: &str = "application/merge-patch+json";

#[derive(Parser, Debug)]
#[command(name = "bench", about = "Load generator for migration-apiserver; prints a markdown table")]
struct Args {
    /// migration-apiserver binary to start in a temporary directory on a free port, with --disable-scheduler
    /// (stopped at the end; idle memory is measured on a separate start with default flags).
    #[arg(long, required_unless_present = "url", conflicts_with = "url")]
    server: Option<PathBuf>,
    /// URL of an already running server, e.g. https://127.0.0.1:8443 (needs --kubeconfig). Run it with
    /// --disable-scheduler, or the scheduler runs and prunes the bench's StorageVersionMigrations.
    #[arg(long, requires = "kubeconfig")]
    url: Option<String>,
    /// Admin kubeconfig of the running server (CA and client certificate).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Duration of each timed scenario: 10s, 500ms, 1m [default: 10s, 2s with --quick].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Connections for GET; LIST uses a quarter of them, CREATE twice as many.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Smoke run: short scenarios and 10^4 instead of 10^5 stored objects.
    #[arg(long)]
    quick: bool,
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
    let mut idle_rss = None;
    let (mut server, target) = match (&args.server, &args.url, &args.kubeconfig) {
        (Some(bin), _, _) => {
            // Idle memory of a server with default flags, scheduler included.
            let (idle, _) = ServerProcess::start(bin, &[]).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            idle_rss = rss_kib(idle.child.id());
            drop(idle);
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

    // 1. GET of one object.
    eprintln!("bench: GET ({conns} connections, {duration:?})");
    let name = format!("get-{run}.bench.io");
    target.call_ok(&Req::post(format!("{API}/storagestates"), storage_state(&format!("get-{run}")))).await?;
    let get = Req::get(format!("{API}/storagestates/{name}"));
    let load = run_load(&target, pid, conns, Some(duration), u64::MAX, Arc::new(move |_| get.clone())).await;
    rows.push(load.row("GET one object", conns, Goal::MinRps(20_000.0), ""));

    // 2. LIST of 1000 objects, as JSON and as Table; the svm collection holds exactly these.
    let list_conns = (conns / 4).max(1);
    eprintln!("bench: LIST ({list_conns} connections, {duration:?})");
    rows.extend(list_rows(&target, pid, list_conns, duration, &run).await);

    // 3. CREATE of new objects.
    let create_conns = conns * 2;
    eprintln!("bench: CREATE ({create_conns} connections, {duration:?})");
    let load = run_load(&target, pid, create_conns, Some(duration), u64::MAX, new_states(format!("c-{run}"))).await;
    let created = load.stats.ok;
    rows.push(load.row("CREATE (new names)", create_conns, Goal::MinRps(5_000.0), ""));

    // 4. Watch fan-out.
    let (streams, updates) = (100, 200);
    eprintln!("bench: watch fan-out ({streams} streams, {updates} updates)");
    let watch = watch_fanout(&target, &run, streams, updates).await;
    rows.push(
        watch.unwrap_or_else(|e| Row::failed(format!("watch fan-out: {streams} streams x {updates} updates"), e)),
    );

    // 5. Server memory: idle, then after storing `bulk` objects.
    let bulk_label = format!("10^{}", bulk.ilog10());
    let notes = idle_rss.map_or("needs --server".into(), |k| {
        format!("VmRSS {}, default flags, 1 s after /readyz, empty store", mib(k))
    });
    let target_rss = Goal::MaxMib(30.0).show(idle_rss.map(|k| k as f64 / 1024.0));
    rows.push(Row { scenario: "server RSS idle".into(), target: target_rss, notes, ..Row::default() });
    eprintln!("bench: storing {bulk_label} objects ({create_conns} connections)");
    let load = run_load(&target, pid, create_conns, None, bulk, new_states(format!("b-{run}"))).await;
    let took = format!("took {:.1} s", load.elapsed.as_secs_f64());
    let stored = load.stats.ok;
    rows.push(load.row(&format!("store {bulk_label} objects (CREATE)"), create_conns, Goal::None, &took));
    let total = 1 + 1000 + created + 1 + stored;
    let notes = match (server.as_mut().and_then(ServerProcess::exited), pid.and_then(rss_kib)) {
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
    drop(server);

    println!("| scenario | requests/s | p50 ms | p99 ms | target | notes |");
    println!("|---|---:|---:|---:|---|---|");
    for r in &rows {
        let cells = [&r.rps, &r.p50, &r.p99, &r.target].map(|c| if c.is_empty() { "-" } else { c.as_str() });
        println!("| {} | {} | {} |", r.scenario, cells.join(" | "), r.notes);
    }
    println!("\n{}; load average before the run: {loadavg}", machine());
    Ok(())
}

// Scenarios that need more than one load run.

async fn list_rows(target: &Target, pid: Option<u32>, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
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
    for (label, accept, key) in [("JSON", JSON, "items"), ("Table", TABLE, "rows")] {
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
        let resp = conn.send(&Req::get(format!("{coll}?watch=true&resourceVersion={rv0}"))).await?;
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
    })
}

// Closed-loop load: `conns` workers, each with one keep-alive connection, take request numbers
// from a shared counter until the deadline passes or `limit` requests were issued.

type MakeReq = Arc<dyn Fn(u64) -> Req + Send + Sync>;

struct Load {
    stats: Stats,
    elapsed: Duration,
    cpu: String,
}

async fn run_load(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Option<Duration>,
    limit: u64,
    make: MakeReq,
) -> Load {
    let next = Arc::new(AtomicU64::new(0));
    let cpu0 = CpuTicks::now(pid);
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (target, next, make) = (target.clone(), next.clone(), make.clone());
            tokio::spawn(async move { worker(target, next, limit, deadline, make).await })
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

async fn worker(target: Target, next: Arc<AtomicU64>, limit: u64, deadline: Option<Instant>, make: MakeReq) -> Stats {
    let mut stats = Stats::default();
    let mut conn: Option<Conn> = None;
    let mut failed_connects = 0;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match target.connect().await {
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
        match c.call(&req).await {
            Ok((status, _)) if status.is_success() => {
                stats.ok += 1;
                stats.samples.push(micros(t.elapsed()));
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

#[derive(Default)]
struct Stats {
    ok: u64,
    errors: u64,
    /// Errors by HTTP status; 0 = transport error.
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
            .map(|(s, n)| if *s == 0 { format!("transport: {n}") } else { format!("{s}: {n}") })
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
}

impl Req {
    fn get(path: String) -> Req {
        Req { method: Method::GET, path, body: Bytes::new(), content_type: None, accept: JSON }
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
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host.clone()).with_context(|| format!("bad host {host}"))?;
        Ok(Target { tls: TlsConnector::from(Arc::new(config)), server_name, host, port, authority })
    }

    async fn connect(&self) -> anyhow::Result<Conn> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.server_name.clone(), tcp).await.context("TLS handshake")?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(connection);
        Ok(Conn { sender, authority: self.authority.clone() })
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

    async fn call(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        let resp = self.send(req).await?;
        let status = resp.status();
        Ok((status, resp.into_body().collect().await?.to_bytes()))
    }

    async fn call_ok(&mut self, req: &Req) -> anyhow::Result<Bytes> {
        match self.call(req).await? {
            (s, body) if s.is_success() => Ok(body),
            (s, body) => bail!("{} {} answered {s}: {}", req.method, req.path, String::from_utf8_lossy(&body)),
        }
    }
}

// The server under test, when started by us: killed and its directory removed on drop.

struct ServerProcess {
    child: Child,
    dir: PathBuf,
}

impl ServerProcess {
    async fn start(bin: &Path, extra_args: &[&str]) -> anyhow::Result<(ServerProcess, Target)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::File::create(dir.join("server.log"))?;
        let (data, certs) = (dir.join("data"), dir.join("certs"));
        let child = Command::new(bin)
            .args(["serve", "--secure-port", &port.to_string(), "--bind-address", "127.0.0.1", "--data-dir"])
            .args([data.as_os_str(), "--cert-dir".as_ref(), certs.as_os_str()])
            .args(extra_args)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut server = ServerProcess { child, dir };
        eprintln!(
            "bench: started {} {} (pid {}) on port {port}",
            bin.display(),
            extra_args.join(" "),
            server.child.id()
        );
        let kubeconfig = server.dir.join("certs/admin.kubeconfig");
        let started = Instant::now();
        let mut last_err = anyhow!("not started");
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(exit) = server.exited() {
                bail!("the server exited ({exit})");
            }
            let ready = async {
                let target = Target::from_kubeconfig(&kubeconfig, None)?;
                target.call_ok(&Req::get("/readyz".into())).await?;
                Ok::<_, anyhow::Error>(target)
            };
            match ready.await {
                Ok(target) => return Ok((server, target)),
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last_err.context("the server did not become ready within 60 s"))
    }

    /// If the server has exited: how, after printing the end of its log to stderr.
    fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok()??;
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("bench: the server exited ({status}); the end of its log:");
        tail.iter().rev().for_each(|l| eprintln!("  {l}"));
        Some(status.to_string())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// /proc readings.

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()
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
        let c: Vec<String> = (0..4)
            .map(|i| match (self.0[i], now.0[i]) {
                (Some(a), Some(b)) => format!("{:.2}", b.saturating_sub(a) as f64 / (elapsed.as_secs_f64() * 100.0)),
                _ => "?".into(),
            })
            .collect();
        format!("CPU cores used: server {}, bench {}, whole machine {} (stolen {})", c[0], c[1], c[2], c[3])
    }
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

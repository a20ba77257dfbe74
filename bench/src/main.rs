//! `make bench`: a load generator of our own against a real migration-apiserver, over TLS with the
//! admin client certificate of its kubeconfig.
//!
//! Every worker owns one keep-alive HTTP/1.1 connection and reuses it for all its requests. The timed
//! loops speak HTTP/1.1 themselves on the tokio-rustls stream ([`LeanConn`]: one write per request,
//! reused buffers, no connection task), so that the client costs little CPU next to the server on
//! the same machine; setup calls and watch streams go through hyper's client `conn`. Latencies of
//! successful requests are recorded one by one and percentiles are read from the sorted samples. The admission
//! rows that carry targets and the load group's overload rows give the server and the bench separate CPUs
//! (`admission_group`, `overload_rows`).
//! Results are printed as a markdown table next to their targets; missing a target never fails the
//! run (see BENCHMARKS.md).

use anyhow::{anyhow, bail};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

// The server's own Go-style duration parser (a leaf module), so that `--duration` reads as the server's flags do.
#[path = "../../src/duration.rs"]
mod duration;
mod scenarios;
use scenarios::*;
mod admission;
use admission::*;
mod encryption;
use encryption::*;
mod audit;
use audit::*;
mod backup;
use backup::*;
mod migration;
use migration::*;
mod rotation;
use rotation::*;
mod kms;
use kms::*;
mod adaptive;
use adaptive::*;
mod faults;
use faults::*;
mod etcd;
use etcd::*;
mod scale;
use scale::*;
mod overload;
use overload::*;
mod overload_core;
use overload_core::*;
mod overload_client;
use overload_client::*;
mod overload_limit;
use overload_limit::*;
mod overload_table;
use overload_table::*;
mod sizing;
use sizing::*;
mod load;
use load::*;
mod table;
use table::*;
mod objects;
use objects::*;
mod http;
use http::*;
mod lean;
use lean::*;
mod process;
use process::*;
mod procfs;
use procfs::*;

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
    /// Duration of each timed scenario, as Go writes durations: 10s, 500ms, 1m30s [default: 10s, 2s with --quick].
    #[arg(long, value_parser = duration::parse_duration)]
    duration: Option<Duration>,
    /// Connections for GET; LIST uses a quarter of them, CREATE and admission reviews twice as many.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Smoke run: short scenarios, 10^4 instead of 10^5 stored objects, migrations of 10^3 and 10^4 objects, the
    /// scale rows at a tenth of their sizes (10^5 objects at most).
    #[arg(long)]
    quick: bool,
    /// Scenario groups to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "core,admission,encryption,audit,migration,rotation,adaptive,backup,scale,etcd"
    )]
    only: Vec<Group>,
    /// An extra argument for every migration-apiserver the bench starts, after the bench's own; repeatable, one
    /// argument each: --server-arg=--storage-cache-size=8Mi. A flag that a row sets itself (the Scale memory rows'
    /// --storage-cache-size and --watch-history-bytes) makes that row's server refuse to start.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true, requires = "server")]
    server_args: Vec<String>,
    /// etcd binary (v3.4+) for the etcd backend's rows, a path or a name looked up in PATH; the rows are skipped
    /// when there is none.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// The previous release's migration-apiserver binary, run side by side with --server's by the `load` group's rows
    /// that compare (on servers of their own); without it those rows are skipped.
    #[arg(long, value_name = "BIN", requires = "server")]
    baseline: Option<PathBuf>,
}

/// Groups of scenarios (`--only`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// GET, LIST, CREATE, watch fan-out, server memory and the 10^5 store step, on the embedded store.
    Core,
    /// AdmissionReview throughput of /validate and /mutate (on a server of their own with --server).
    Admission,
    /// ShootState create and get with a 100 KiB body, aesgcm against identity and KMS v2 against aesgcm (starts its own
    /// servers and the test KMS v2 plugin).
    Encryption,
    /// GET and CREATE with an audit policy writing to a file (Metadata, blocking and batch; RequestResponse)
    /// against no audit, a server of its own each (issue 37).
    Audit,
    /// The migrator: 10^4 and 10^5 objects of another server (starts its own servers).
    Migration,
    /// Key rotation (issue 31): a rotation of 10^5 ShootStates next to a storage-version migration of them, and GET
    /// idle and during a rotation, on one server of its own; then a rotation on a KMS v2 key_id change (issue 39).
    Rotation,
    /// The adaptive migration rate (issue 38): default flags against unthrottled, readers' GET during a
    /// migration (at 1,000 GET/s and saturating), and a stand-in target that turns slow and throttles.
    Adaptive,
    /// Snapshots of the embedded store (issue 40): one of 10^5 ShootStates of 2 KiB, readers' GET at 1,000 GET/s
    /// and writers' CREATE during snapshots against without (starts its own server).
    Backup,
    /// LIST page cost, migration and memory up to 10^6 objects (starts its own servers).
    Scale,
    /// Only the LIST page rows of the Scale group (one server grown to 10^6 objects, 10^5 with --quick).
    ScalePages,
    /// GET, CREATE, LIST and watch fan-out on the etcd backend (starts etcd and a server on it), each next to the
    /// embedded store's row of the same run (the core rows run for that).
    Etcd,
    /// Overload (issue 53), with --baseline next to the new binary: the server's memory for an unpaginated LIST of
    /// 10^4 ShootStates of 100 KiB, as JSON and as Table, and its peak for eight at once from a user the in-flight
    /// limits count (--max-requests-inflight 30; the baseline without a limit, killed above 1 GiB); unpaginated LISTs
    /// by that user over 16 times --max-requests-inflight connections during a migration, with the limit, without it
    /// and on the baseline; the memory steps of BENCHMARKS.md's sizing note on the filled server (created, restarted
    /// idle, paged LISTs as kubectl makes them, migrations); the core rows side by side, five pairs alternated. Not in
    /// the default --only: it needs
    /// --baseline for its comparisons and takes long (starts its own servers).
    Load,
    /// Only the overload rows of the Load group (hidden: for quick iterations on them).
    #[value(hide = true)]
    LoadOverload,
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
    set_server_args(args.server_args.clone());
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
    // The etcd rows are compared with these rows of the same run, so they run for the etcd group too.
    if on(Group::Core) || (on(Group::Etcd) && args.server.is_some()) {
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
    if on(Group::Audit) {
        match bin {
            Some(bin) => rows.extend(audit_rows(bin, conns, duration, &run).await),
            None => needs_server("audit"),
        }
    }
    if on(Group::Migration) {
        match bin {
            Some(bin) => rows.extend(migration_rows(bin, args.quick).await),
            None => needs_server("migration"),
        }
    }
    if on(Group::Rotation) {
        match bin {
            Some(bin) => rows.extend(rotation_rows(bin, args.quick, duration).await),
            None => needs_server("rotation"),
        }
    }
    if on(Group::Adaptive) {
        match bin {
            Some(bin) => rows.extend(adaptive_rows(bin, args.quick, duration).await),
            None => needs_server("adaptive"),
        }
    }
    if on(Group::Backup) {
        match bin {
            Some(bin) => rows.extend(backup_rows(bin, args.quick, duration).await),
            None => needs_server("backup"),
        }
    }
    if on(Group::Scale) || on(Group::ScalePages) {
        match bin {
            Some(bin) if on(Group::Scale) => rows.extend(scale_rows(bin, args.quick).await),
            Some(bin) => rows.extend(page_rows(bin, args.quick).await),
            None => needs_server("scale"),
        }
    }
    if on(Group::Etcd) {
        match bin {
            Some(bin) => match find_program(&args.etcd) {
                Some(etcd) => add_etcd_rows(&mut rows, bin, &etcd, conns, duration, &run, args.quick).await,
                None => eprintln!("bench: etcd skipped: no etcd binary {}", args.etcd.display()),
            },
            None => needs_server("etcd"),
        }
    }

    if on(Group::Load) || on(Group::LoadOverload) {
        let baseline = args.baseline.as_deref();
        match bin {
            Some(bin) if on(Group::Load) => rows.extend(load_rows(bin, baseline, args.quick, conns, duration).await),
            Some(bin) => rows.extend(load_overload_rows(bin, baseline, args.quick, duration).await),
            None => needs_server("load"),
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

#[cfg(test)]
#[path = "main_tests.rs"]
mod tests;

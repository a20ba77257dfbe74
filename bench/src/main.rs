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
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use serde_json::{json, Value};
    use std::process::Command;

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

//! GET and CREATE with auditing on (issue 37), next to the same rows without it, each on a server of its own.

use super::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One audit configuration: a label, the policy (None: no audit), `--audit-log-mode`, and the target of its rows
/// (their requests/s at least this fraction of no audit's).
struct AuditCase {
    label: &'static str,
    policy: Option<&'static str>,
    mode: &'static str,
    /// More flags of the log backend.
    flags: &'static [&'static str],
    /// Events each request writes under the policy (GETs and CREATEs alike).
    events: u64,
    goal: Option<f64>,
}

/// Every request at one level, RequestReceived not omitted: two events per request (RequestReceived,
/// ResponseComplete), the plainest policy and the most events.
const METADATA: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n";
const REQUEST_RESPONSE: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n";

/// The recommended policy the manifests ship (RequestReceived omitted: one event per request; GETs of StorageStates
/// at Metadata, their CREATEs at RequestResponse).
const RECOMMENDED: &str = include_str!("../../manifests/audit/policy.yaml");

const CASES: [AuditCase; 6] = [
    AuditCase { label: "no audit", policy: None, mode: "", flags: &[], events: 0, goal: None },
    // kube-apiserver's default mode for the log backend (--audit-log-mode=blocking): the request writes its events.
    AuditCase {
        label: "audit Metadata to a file",
        policy: Some(METADATA),
        mode: "blocking",
        flags: &[],
        events: 2,
        goal: Some(0.8),
    },
    AuditCase {
        label: "audit Metadata to a file, batch",
        policy: Some(METADATA),
        mode: "batch",
        flags: &[],
        events: 2,
        goal: None,
    },
    // Batches as the webhook backend's default (400 events, 30 s at most): one write(2) per batch, off the requests.
    AuditCase {
        label: "audit Metadata to a file, batch of 400",
        policy: Some(METADATA),
        mode: "batch",
        flags: &["--audit-log-batch-max-size", "400", "--audit-log-batch-buffer-size", "100000"],
        events: 2,
        goal: None,
    },
    AuditCase {
        label: "audit, the recommended policy (manifests/audit), to a file",
        policy: Some(RECOMMENDED),
        mode: "blocking",
        flags: &[],
        events: 1,
        goal: None,
    },
    AuditCase {
        label: "audit RequestResponse to a file",
        policy: Some(REQUEST_RESPONSE),
        mode: "blocking",
        flags: &[],
        events: 2,
        goal: None,
    },
];

pub(super) fn get_scenario(label: &str) -> String {
    format!("GET one object, {label}")
}

pub(super) fn create_scenario(label: &str) -> String {
    format!("CREATE (new names), {label}")
}

/// For each case, a fresh server (`--disable-scheduler`; with the policy and `--audit-log-path` in a temporary
/// directory, rotation at the default 100 MB) gets GETs of one StorageState (`conns` connections) and CREATEs of
/// new ones (2 x `conns`), `duration` each. Afterwards the server is stopped (batch mode writes its queue) and the
/// log's lines counted: at least two per request served, or the row says how many are missing.
pub(super) async fn audit_rows(bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    let (mut gets, mut creates) = (Vec::new(), Vec::new());
    for case in &CASES {
        eprintln!("bench: GET and CREATE, {} ({conns} and {} connections, {duration:?} each)", case.label, conns * 2);
        let (mut get, mut create) = match case_rows(bin, case, conns, duration, run).await {
            Ok(rows) => rows,
            Err(e) => (
                Row::failed(get_scenario(case.label), anyhow::anyhow!("{e:#}")),
                Row::failed(create_scenario(case.label), e),
            ),
        };
        if case.policy.is_some() {
            get.pair = Some(get_scenario(CASES[0].label));
            create.pair = Some(create_scenario(CASES[0].label));
            (get.pair_goal, create.pair_goal) = (case.goal, case.goal);
        }
        gets.push(get);
        creates.push(create);
    }
    // Each audited row after the unaudited one with its ratio, in the cases' order (merge_pairs inserts each right
    // after its pair, so the last goes first).
    let mut rows = Vec::new();
    for list in [gets, creates] {
        let (mut group, mut paired): (Vec<Row>, Vec<Row>) = list.into_iter().partition(|r| r.pair.is_none());
        paired.reverse();
        merge_pairs(&mut group, paired, "no audit's");
        rows.extend(group);
    }
    rows
}

async fn case_rows(
    bin: &Path,
    case: &AuditCase,
    conns: usize,
    duration: Duration,
    run: &str,
) -> anyhow::Result<(Row, Row)> {
    let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // The log next to the data by default; BENCH_AUDIT_LOG_DIR puts it on another filesystem (BENCHMARKS.md, item 12:
    // the store's fsyncs wait for the log's appended blocks when both share an ext4 filesystem).
    let log_dir = match std::env::var_os("BENCH_AUDIT_LOG_DIR") {
        Some(d) => std::path::PathBuf::from(d).join(format!("bench-audit-{}", std::process::id())),
        None => dir.join("log"),
    };
    let _ = std::fs::remove_dir_all(&log_dir);
    let policy = dir.join("policy.yaml");
    let (policy_arg, log_arg) =
        (policy.to_string_lossy().into_owned(), log_dir.join("audit.log").to_string_lossy().into_owned());
    let mut args = vec!["--disable-scheduler"];
    if let Some(text) = case.policy {
        std::fs::write(&policy, text)?;
        args.extend(["--audit-policy-file", &policy_arg, "--audit-log-path", &log_arg, "--audit-log-mode", case.mode]);
        args.extend_from_slice(case.flags);
    }
    let result = async {
        let (mut server, target) = ServerProcess::start(bin, &args).await?;
        let pid = Some(server.child.id());
        let name = format!("audit-{run}");
        target.call_ok(&Req::post(format!("{API}/storagestates"), storage_state(&name))).await?;
        let get = Req::get(format!("{API}/storagestates/{name}.bench.io"));
        let load = run_load(&target, pid, conns, Some(duration), u64::MAX, Arc::new(move |_| get.clone())).await;
        let mut get = load.row(&get_scenario(case.label), conns, Goal::None, "");
        let served = load.stats.ok;
        let create_conns = conns * 2;
        let load = run_load(&target, pid, create_conns, Some(duration), u64::MAX, new_states(format!("a-{run}"))).await;
        let mut create = load.row(&create_scenario(case.label), create_conns, Goal::None, "");
        let served = served + load.stats.ok;
        server.stop().await?;
        if case.policy.is_some() {
            let (lines, bytes) = count_lines(&log_dir)?;
            // The readiness probes, the setup CREATE and the requests served: `events` each.
            let stages = match case.events {
                2 => "2 each: RequestReceived, ResponseComplete",
                _ => "1 each: ResponseComplete",
            };
            let note = format!(
                "audit log ({} mode{}): {} events, {} for the {} requests of both rows ({stages})",
                case.mode,
                case.flags.iter().map(|f| format!(" {f}")).collect::<String>(),
                thousands(lines as f64),
                mib(bytes / 1024),
                thousands(served as f64)
            );
            let missing = (case.events * served).saturating_sub(lines);
            let note = match missing {
                0 => note,
                n => format!("{note}; **{} events missing** (dropped by a full batch queue?)", thousands(n as f64)),
            };
            for row in [&mut get, &mut create] {
                row.notes += &format!("; {note}");
            }
        }
        Ok::<_, anyhow::Error>((get, create))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&log_dir);
    result
}

/// Lines and bytes of every file in `dir` (the log and its rotated backups, uncompressed).
fn count_lines(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let (mut lines, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(dir)? {
        let data = std::fs::read(entry?.path())?;
        bytes += data.len() as u64;
        lines += data.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok((lines, bytes))
}

//! GET and CREATE with auditing on (issue 37), next to the same rows without it, each on a server of its own.

use super::*;
use std::path::{Path, PathBuf};
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
        flags: &[
            "--audit-log-batch-max-size",
            "400",
            "--audit-log-batch-max-wait",
            "30s",
            "--audit-log-batch-buffer-size",
            "100000",
        ],
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

/// The judged pair (no audit, Metadata to a file in blocking mode) first: both servers run side by side, and each
/// row is measured in two halves in the order no audit, audit, audit, no audit, so that the machine's drift during
/// the run (1.3x between runs of one binary) falls on both alike. Before each half the disk is synced (untimed), so
/// that no half pays for the page cache another left dirty. Then the other cases, each on a fresh server after the
/// other (`--disable-scheduler`; with the policy and `--audit-log-path` in a temporary directory): GETs of one
/// StorageState (`conns` connections) and CREATEs of new ones (2 x `conns`), `duration` each. Afterwards each
/// server is stopped (batch mode writes its queue) and its log's lines counted: at least the case's events per
/// request served, or the row says how many are missing.
pub(super) async fn audit_rows(bin: &Path, conns: usize, duration: Duration, run: &str) -> Vec<Row> {
    let (mut gets, mut creates) = (Vec::new(), Vec::new());
    eprintln!("bench: GET and CREATE, no audit and {} side by side ({duration:?} each, in halves)", CASES[1].label);
    match judged_rows(bin, conns, duration, run).await {
        Ok(rows) => {
            for (get, create) in rows {
                gets.push(get);
                creates.push(create);
            }
        }
        Err(e) => {
            for case in &CASES[..2] {
                gets.push(Row::failed(get_scenario(case.label), anyhow::anyhow!("{e:#}")));
                creates.push(Row::failed(create_scenario(case.label), anyhow::anyhow!("{e:#}")));
            }
        }
    }
    for (i, case) in CASES.iter().enumerate().skip(2) {
        eprintln!("bench: GET and CREATE, {} ({conns} and {} connections, {duration:?} each)", case.label, conns * 2);
        match case_rows(bin, i, conns, duration, run).await {
            Ok((get, create)) => {
                gets.push(get);
                creates.push(create);
            }
            Err(e) => {
                gets.push(Row::failed(get_scenario(case.label), anyhow::anyhow!("{e:#}")));
                creates.push(Row::failed(create_scenario(case.label), e));
            }
        }
    }
    for (case, (get, create)) in CASES.iter().zip(gets.iter_mut().zip(creates.iter_mut())).skip(1) {
        get.pair = Some(get_scenario(CASES[0].label));
        create.pair = Some(create_scenario(CASES[0].label));
        (get.pair_goal, create.pair_goal) = (case.goal, case.goal);
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

/// The rows of CASES[0] and CASES[1], measured side by side in halves (see [`audit_rows`]).
async fn judged_rows(bin: &Path, conns: usize, duration: Duration, run: &str) -> anyhow::Result<[(Row, Row); 2]> {
    let servers = [CaseServer::start(bin, 0, run).await?, CaseServer::start(bin, 1, run).await?];
    let (half, create_conns) = (duration / 2, conns * 2);
    let order = [0, 1, 1, 0];
    let mut gets: [Vec<Load>; 2] = Default::default();
    for &i in &order {
        settle_disk();
        gets[i].push(servers[i].gets(conns, half).await);
    }
    let mut creates: [Vec<Load>; 2] = Default::default();
    for (n, &i) in order.iter().enumerate() {
        settle_disk();
        creates[i].push(servers[i].creates(create_conns, half, format!("a-{run}-{n}")).await);
    }
    let mut rows = Vec::new();
    for ((server, gets), creates) in servers.into_iter().zip(gets).zip(creates) {
        let [get, create] = [gets, creates].map(|mut halves| {
            let second = halves.pop().expect("two halves");
            load::halves(halves.pop().expect("two halves"), second)
        });
        rows.push(server.finish(get, create, conns).await?);
    }
    let second = rows.pop().expect("two servers");
    Ok([rows.pop().expect("two servers"), second])
}

/// One case on a fresh server: GETs for `duration`, then CREATEs for as long.
async fn case_rows(bin: &Path, case: usize, conns: usize, duration: Duration, run: &str) -> anyhow::Result<(Row, Row)> {
    let server = CaseServer::start(bin, case, run).await?;
    let get = server.gets(conns, duration).await;
    let create = server.creates(conns * 2, duration, format!("a-{run}")).await;
    server.finish(get, create, conns).await
}

/// Writes out what the page cache holds dirty (the last half's log, the store's pages), so that the next half
/// starts from a clean disk.
fn settle_disk() {
    if let Err(e) = std::process::Command::new("sync").status() {
        eprintln!("bench: audit: sync: {e}");
    }
}

/// A server of one case, with its temporary directory (policy) and its log's directory.
struct CaseServer {
    case: &'static AuditCase,
    server: ServerProcess,
    target: Target,
    dir: PathBuf,
    log_dir: PathBuf,
    get: Req,
}

impl CaseServer {
    async fn start(bin: &Path, case: usize, run: &str) -> anyhow::Result<CaseServer> {
        let (index, case) = (case, &CASES[case]);
        let tag = format!("{}-{index}", std::process::id());
        let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-audit-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        // The log next to the data by default; BENCH_AUDIT_LOG_DIR puts it on another filesystem (BENCHMARKS.md, item
        // 12: the store's fsyncs wait for the log's appended blocks when both share an ext4 filesystem).
        let log_dir = match std::env::var_os("BENCH_AUDIT_LOG_DIR") {
            Some(d) => PathBuf::from(d).join(format!("bench-audit-{tag}")),
            None => dir.join("log"),
        };
        let _ = std::fs::remove_dir_all(&log_dir);
        let policy = dir.join("policy.yaml");
        let (policy_arg, log_arg) =
            (policy.to_string_lossy().into_owned(), log_dir.join("audit.log").to_string_lossy().into_owned());
        let mut args = vec!["--disable-scheduler"];
        if let Some(text) = case.policy {
            std::fs::write(&policy, text)?;
            args.extend([
                "--audit-policy-file",
                &policy_arg,
                "--audit-log-path",
                &log_arg,
                "--audit-log-mode",
                case.mode,
            ]);
            args.extend_from_slice(case.flags);
        }
        let (server, target) = ServerProcess::start(bin, &args).await?;
        let name = format!("audit-{run}");
        let get = Req::get(format!("{API}/storagestates/{name}.bench.io"));
        let this = CaseServer { case, server, target, dir, log_dir, get };
        this.target.call_ok(&Req::post(format!("{API}/storagestates"), storage_state(&name))).await?;
        Ok(this)
    }

    fn pid(&self) -> Option<u32> {
        Some(self.server.child.id())
    }

    async fn gets(&self, conns: usize, duration: Duration) -> Load {
        let get = self.get.clone();
        run_load(&self.target, self.pid(), conns, Some(duration), u64::MAX, Arc::new(move |_| get.clone())).await
    }

    async fn creates(&self, conns: usize, duration: Duration, names: String) -> Load {
        run_load(&self.target, self.pid(), conns, Some(duration), u64::MAX, new_states(names)).await
    }

    /// Stops the server and makes its two rows, the log's events counted in their notes.
    async fn finish(mut self, get: Load, create: Load, conns: usize) -> anyhow::Result<(Row, Row)> {
        let case = self.case;
        let mut get_row = get.row(&get_scenario(case.label), conns, Goal::None, "");
        let mut create_row = create.row(&create_scenario(case.label), conns * 2, Goal::None, "");
        let served = get.stats.ok + create.stats.ok;
        self.server.stop().await?;
        if case.policy.is_some() {
            let (lines, bytes) = count_lines(&self.log_dir)?;
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
            for row in [&mut get_row, &mut create_row] {
                row.notes += &format!("; {note}");
            }
        }
        Ok((get_row, create_row))
    }
}

impl Drop for CaseServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.log_dir);
    }
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

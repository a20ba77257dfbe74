//! The `load` group (issue 53): what the server does with more than it can take, next to the previous release
//! (`--baseline`). Unpaginated LISTs of 10^4 ShootStates of 100 KiB: the server's memory for one, and its peak for
//! eight at once from a user the in-flight limits count (the baseline, which has no limit, under a watchdog that kills
//! it above the Deployment's 1 GiB), and on the same server the steps that size the Deployment ([`super::sizing`]).
//! Then unpaginated LISTs by such a user over 16 times `--max-requests-inflight`
//! connections during a migration, with the limit, without it and on the baseline ([`super::overload_limit`]), and
//! the core rows side by side with the baseline, five pairs ([`super::overload_core`]). Every case on servers of its
//! own. `system:masters` (the bench's admin certificate) is never counted, so the limited user is a
//! static token (`--token-auth-file`, `--authorization-mode AlwaysAllow`).

use super::*;
use anyhow::{anyhow, bail, Context};
use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bench's user that is not `system:masters`: its token, and its line of `--token-auth-file`.
pub(super) const TOKEN: &str = "bench-load-token";
const TOKEN_LINE: &str = "bench-load-token,bench-load,uid-bench-load,\"bench\"\n";
/// kube-apiserver's answer above an in-flight limit (Go's `http.Error` appends the newline).
pub(super) const TOO_MANY: &[u8] = b"Too many requests, please try again later.\n";
const GIB_KIB: u64 = 1024 * 1024;
/// The Deployment's memory limit, which the eight LISTs must stay under, and at which the baseline is killed.
const DEPLOYMENT_KIB: u64 = GIB_KIB;
/// Above this the watchdog kills a server in every other case: no server may take the machine (24 GiB).
pub(super) const SAFETY_KIB: u64 = 8 * GIB_KIB;
/// One LIST read to its end; and the eight LISTs, their 429s retried, to their ends.
const LIST_TIMEOUT: Duration = Duration::from_secs(600);
const EIGHT_DEADLINE: Duration = Duration::from_secs(300);
const CONCURRENT_LISTS: usize = 8;
/// The read-only limit of the eight LISTs: each 10^4-object LIST takes 10 seats, so three fit at once.
const EIGHT_LIMIT: &str = "30";

/// The group's rows: the LIST rows of the new binary (and of `baseline`), the overload rows, and the core rows side
/// by side with `baseline`.
pub(super) async fn load_rows(
    bin: &Path,
    baseline: Option<&Path>,
    quick: bool,
    conns: usize,
    duration: Duration,
) -> Vec<Row> {
    let n: u64 = if quick { 1_000 } else { 10_000 };
    let (_dir, tokens) = match token_file() {
        Ok(t) => t,
        Err(e) => return vec![Row::failed("load group: the token file".into(), e)],
    };
    match baseline {
        Some(old) => eprintln!("bench: load: new {}, baseline {}", bin.display(), old.display()),
        None => eprintln!("bench: load: {} alone (no --baseline: the comparisons are skipped)", bin.display()),
    }
    // One binary's servers at a time, each stopped (and its store removed) before the next starts.
    let new = list_run(bin, &tokens, n, true).await;
    let old = match baseline {
        Some(old) => Some(list_run(old, &tokens, n, false).await),
        None => None,
    };
    let sizing = sizing_rows(n, &new.sizing, old.as_ref().map(|o| &o.sizing));
    let mut rows = list_rows(n, new, old);
    rows.extend(sizing);
    rows.extend(overload_rows(bin, baseline, &tokens, quick, duration).await);
    match baseline {
        Some(old) => rows.extend(side_by_side_rows(bin, old, conns, duration).await),
        None => rows.push(Row {
            scenario: "core rows side by side with the baseline".into(),
            notes: "skipped: needs --baseline".into(),
            ..Row::default()
        }),
    }
    rows
}

/// Only the overload rows of the group (`--only load-overload`, hidden: for quick iterations on them).
pub(super) async fn load_overload_rows(
    bin: &Path,
    baseline: Option<&Path>,
    quick: bool,
    duration: Duration,
) -> Vec<Row> {
    match token_file() {
        Ok((_dir, tokens)) => overload_rows(bin, baseline, &tokens, quick, duration).await,
        Err(e) => vec![Row::failed("load group: the token file".into(), e)],
    }
}

/// The `--token-auth-file` of [`TOKEN_LINE`], in a directory removed when the first value is dropped.
fn token_file() -> anyhow::Result<(OwnDir, PathBuf)> {
    let dir = OwnDir::new()?;
    let tokens = dir.0.join("tokens.csv");
    std::fs::write(&tokens, TOKEN_LINE)?;
    Ok((dir, tokens))
}

/// A directory of the group's own (the token file), removed on drop.
struct OwnDir(PathBuf);

impl OwnDir {
    fn new() -> std::io::Result<OwnDir> {
        let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(OwnDir(dir))
    }
}

impl Drop for OwnDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The server flags that let the token of [`TOKEN_LINE`] in: known to the baseline too.
pub(super) fn token_args(tokens: &Path) -> Vec<String> {
    let tokens = tokens.to_string_lossy().into_owned();
    ["--token-auth-file", &tokens, "--authorization-mode", "AlwaysAllow"].map(String::from).to_vec()
}

// The LIST rows.

/// The two forms of the unpaginated LIST: label, Accept, query, the array that holds the objects.
const FORMS: [(&str, &str, &str, &str); 2] =
    [("JSON", JSON, "", "items"), ("Table", TABLE, "?includeObject=Object", "rows")];

/// What one binary's server did: a LIST in each of [`FORMS`] alone, then eight at once (or why not); and the
/// sizing rows' steps on it ([`super::sizing`]).
struct ListRun {
    singles: Vec<Result<Single, String>>,
    /// The new binary's eight with its default limits (all eight fit in 400 seats), before those with [`EIGHT_LIMIT`].
    eight_default: Result<Eight, String>,
    eight: Result<Eight, String>,
    sizing: Sizing,
}

/// One LIST read whole, and the server's memory meanwhile (KiB).
struct Single {
    bytes: u64,
    took: Duration,
    rss_before: u64,
    peak: u64,
    rss_after: Option<u64>,
}

/// Eight LISTs at once, each retrying its 429s until it got the whole answer.
struct Eight {
    clients: Vec<Client>,
    took: Duration,
    rss_before: u64,
    watched: Watched,
    /// VmHWM at the end (none when the watchdog killed the server).
    hwm: Option<u64>,
    /// How the server ended during the LISTs, when it exited by itself.
    died: Option<String>,
    /// The watchdog's level (KiB).
    kill_above: u64,
}

/// One of the eight clients.
#[derive(Default)]
struct Client {
    /// The objects and bytes of the answer it got whole.
    whole: Option<(u64, u64)>,
    rejected: u64,
    /// 429s with `Retry-After: 1`, and with kube-apiserver's body.
    retry_after_1: u64,
    kube_body: u64,
    error: Option<String>,
}

/// Fills a server of `bin` with `n` ShootStates of 100 KiB, LISTs them whole in each form, then restarts it (the
/// new binary with `--max-requests-inflight 30`) and has the token user LIST them eight times at once; then the
/// sizing steps on the same server, when it was filled.
async fn list_run(bin: &Path, tokens: &Path, n: u64, new: bool) -> ListRun {
    let mut run = ListRun {
        singles: Vec::new(),
        eight_default: Err("not run".into()),
        eight: Err("not run".into()),
        sizing: Vec::new(),
    };
    let mut server = None;
    if let Err(e) = fill_and_list(&mut run, &mut server, bin, tokens, n, new).await {
        let e = format!("{e:#}");
        run.singles.resize_with(FORMS.len(), || Err(e.clone()));
        run.eight = Err(e);
    }
    if let Some(server) = server.as_mut().filter(|_| run.sizing.first().is_some_and(Result::is_ok)) {
        sizing_steps(&mut run.sizing, server, n, new).await;
    }
    run
}

async fn fill_and_list(
    run: &mut ListRun,
    slot: &mut Option<ServerProcess>,
    bin: &Path,
    tokens: &Path,
    n: u64,
    new: bool,
) -> anyhow::Result<()> {
    let label = if new { "new" } else { "baseline" };
    let mut args = vec!["--disable-scheduler".to_string()];
    args.extend(token_args(tokens));
    let (server, admin) = ServerProcess::start(bin, &refs(&args)).await?;
    let server = slot.insert(server);
    let pid = server.child.id();
    let empty = rss_kib(pid);
    eprintln!("bench: load: {label}: storing {n} ShootStates of 100 KiB (16 connections)");
    let started = Instant::now();
    let fill = run_load(&admin, None, 16, None, n, big_shoot_state_creates()).await;
    if fill.stats.ok != n {
        bail!("creating {n} ShootStates: {}", fill.stats.error_summary());
    }
    run.sizing.push(sizing_created(pid, empty, started.elapsed(), n));
    for (form, accept, query, key) in FORMS {
        eprintln!("bench: load: {label}: one unpaginated LIST as {form}");
        let req = Req::get(format!("{SHOOTSTATES_V1BETA1}/shootstates{query}")).accept(accept);
        let (single, killed) = single_list(&admin, pid, &req, key, n).await;
        run.singles.push(single.map_err(|e| format!("{e:#}")));
        if killed {
            server.stopped = true; // the watchdog's kill, not a death of its own
            let _ = server.child.wait();
            bail!("the server was killed above {} during the LIST as {form}", gib_or_mib(SAFETY_KIB));
        }
    }
    // A fresh process for the eight: memory the LISTs above freed but the allocator kept is not counted. The new
    // binary with its default limits first (all eight admitted at once), then with EIGHT_LIMIT (three at once).
    if new {
        run.eight_default = Ok(eight_on(server, &args, label, n, SAFETY_KIB).await?);
        args.extend(["--max-requests-inflight".into(), EIGHT_LIMIT.into()]);
    }
    let kill_above = if new { SAFETY_KIB } else { DEPLOYMENT_KIB };
    run.eight = Ok(eight_on(server, &args, label, n, kill_above).await?);
    Ok(())
}

/// `server` restarted with `args`, and the token user's eight LISTs on it, under a watchdog at `kill_above` KiB.
async fn eight_on(
    server: &mut ServerProcess,
    args: &[String],
    label: &str,
    n: u64,
    kill_above: u64,
) -> anyhow::Result<Eight> {
    server.restart(&refs(args)).await?;
    let token = Target::with_token(&server.kubeconfig(), TOKEN)?;
    eprintln!(
        "bench: load: {label}: {CONCURRENT_LISTS} unpaginated LISTs at once by the token user ({})",
        args.join(" ")
    );
    let (_, accept, query, key) = FORMS[0];
    let req = Req::get(format!("{SHOOTSTATES_V1BETA1}/shootstates{query}")).accept(accept);
    let mut eight = eight_lists(&token, server.child.id(), &req, key, n, kill_above).await?;
    if eight.watched.killed.is_some() {
        server.stopped = true;
        let _ = server.child.wait();
    } else {
        eight.died = server.exited();
    }
    Ok(eight)
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// CREATEs of ShootStates `s-<i>` of 100 KiB in namespace garden, each with certificates and keys of its own.
fn big_shoot_state_creates() -> MakeReq {
    let coll = format!("{SHOOTSTATES_V1BETA1}/namespaces/garden/shootstates");
    Arc::new(move |i| {
        let seed = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let body = big_shoot_state_seeded("garden", &format!("s-{i:06}"), seed);
        Req::post(coll.clone(), Bytes::from(body.to_string()))
    })
}

/// One LIST of `n` objects read whole by the admin, with the server's RSS before and its peak (VmHWM reset before);
/// and whether the watchdog killed the server.
async fn single_list(admin: &Target, pid: u32, req: &Req, key: &'static str, n: u64) -> (anyhow::Result<Single>, bool) {
    let watchdog = Watchdog::start(pid, SAFETY_KIB);
    let listed = single_list_watched(admin, pid, req, key, n).await;
    let watched = watchdog.finish().await;
    match watched.killed {
        Some((after, rss)) => {
            let e = anyhow!("VmRSS {} after {:.1} s: killed by the bench", mib(rss), after.as_secs_f64());
            (Err(e), true)
        }
        None => (listed.map(|s| Single { peak: s.peak.max(watched.peak), ..s }), false),
    }
}

async fn single_list_watched(admin: &Target, pid: u32, req: &Req, key: &'static str, n: u64) -> anyhow::Result<Single> {
    reset_hwm(pid).context("resetting VmHWM")?;
    let rss_before = rss_kib(pid).context("no VmRSS")?;
    let started = Instant::now();
    let listed = list_streamed(admin, req, key, LIST_TIMEOUT).await;
    let took = started.elapsed();
    let peak = hwm_kib(pid).context("no VmHWM")?;
    match listed? {
        Listed::Whole { count, bytes } if count == n => {
            Ok(Single { bytes, took, rss_before, peak, rss_after: rss_kib(pid) })
        }
        Listed::Whole { count, bytes } => bail!("the answer ({bytes} bytes) held {count} objects, not {n}"),
        Listed::Refused { status, body, .. } => bail!("answered {status}: {}", String::from_utf8_lossy(&body)),
    }
}

/// [`CONCURRENT_LISTS`] LISTs at once by `token`, each retrying a 429 after its Retry-After until
/// [`EIGHT_DEADLINE`]; the server's peak RSS meanwhile, under a watchdog that kills it above `kill_above` KiB.
async fn eight_lists(
    token: &Target,
    pid: u32,
    req: &Req,
    key: &'static str,
    n: u64,
    kill_above: u64,
) -> anyhow::Result<Eight> {
    reset_hwm(pid).context("resetting VmHWM")?;
    let rss_before = rss_kib(pid).context("no VmRSS")?;
    let watchdog = Watchdog::start(pid, kill_above);
    let started = Instant::now();
    let deadline = started + EIGHT_DEADLINE;
    let tasks: Vec<_> = (0..CONCURRENT_LISTS)
        .map(|_| {
            let (token, req) = (token.clone(), req.clone());
            tokio::spawn(async move { list_until_whole(&token, &req, key, n, deadline).await })
        })
        .collect();
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.unwrap_or_else(|e| Client { error: Some(format!("task: {e}")), ..Client::default() }));
    }
    let took = started.elapsed();
    let watched = watchdog.finish().await;
    let hwm = if watched.killed.is_some() { None } else { hwm_kib(pid) };
    Ok(Eight { clients, took, rss_before, watched, hwm, died: None, kill_above })
}

/// A client as client-go's: LISTs until it gets the whole answer, waiting out each 429's Retry-After.
async fn list_until_whole(target: &Target, req: &Req, key: &'static str, n: u64, deadline: Instant) -> Client {
    let mut client = Client::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            client.error = Some(format!("no whole answer within {EIGHT_DEADLINE:?}"));
            return client;
        }
        match list_streamed(target, req, key, left.min(LIST_TIMEOUT)).await {
            Ok(Listed::Whole { count, bytes }) => {
                if count != n {
                    client.error = Some(format!("the answer held {count} objects, not {n}"));
                }
                client.whole = Some((count, bytes));
                return client;
            }
            Ok(Listed::Refused { status, retry_after, body }) if status == hyper::StatusCode::TOO_MANY_REQUESTS => {
                client.rejected += 1;
                client.retry_after_1 += u64::from(retry_after.as_deref() == Some("1"));
                client.kube_body += u64::from(body[..] == *TOO_MANY);
                let wait = retry_after.and_then(|s| s.parse().ok()).unwrap_or(1);
                tokio::time::sleep(Duration::from_secs(wait).min(left)).await;
            }
            Ok(Listed::Refused { status, body, .. }) => {
                client.error = Some(format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])));
                return client;
            }
            Err(e) => {
                client.error = Some(format!("{e:#}"));
                return client;
            }
        }
    }
}

/// The answer to a LIST read to its end (here and by the overload's clients).
pub(super) enum Listed {
    /// A success: the objects in its array and its bytes.
    Whole {
        count: u64,
        bytes: u64,
    },
    Refused {
        status: hyper::StatusCode,
        retry_after: Option<String>,
        body: Bytes,
    },
}

/// One LIST on a connection of its own, its answer parsed as it arrives (never held whole: an answer of 1 GB, eight
/// at once, must not take the bench's memory) and the objects of its `key` array counted.
async fn list_streamed(target: &Target, req: &Req, key: &'static str, limit: Duration) -> anyhow::Result<Listed> {
    let read = async {
        let mut conn = target.connect().await?;
        let resp = conn.send(req).await?;
        let status = resp.status();
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string());
            let body = resp.into_body().collect().await?.to_bytes();
            return Ok(Listed::Refused { status, retry_after, body });
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let counter = tokio::task::spawn_blocking(move || count_array(rx, key));
        let mut body = resp.into_body();
        let (mut bytes, mut failed) = (0u64, None);
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    let Ok(data) = frame.into_data() else { continue };
                    bytes += data.len() as u64;
                    if tx.send(data).await.is_err() {
                        break; // the parser stopped at an error
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let counted = counter.await?;
        if let Some(e) = failed {
            bail!("the answer broke off after {bytes} bytes: {e}");
        }
        let count = counted.with_context(|| format!("the answer of {bytes} bytes"))?;
        Ok(Listed::Whole { count, bytes })
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| anyhow!("{} {}: not read whole within {limit:?}", req.method, req.path))?
}

/// Parses a list (`items`) or Table (`rows`) from its chunks and counts the elements of its `key` array, keeping
/// none of them.
pub(super) fn count_array(chunks: tokio::sync::mpsc::Receiver<Bytes>, key: &str) -> anyhow::Result<u64> {
    #[derive(Deserialize)]
    struct Shape {
        items: Option<Count>,
        rows: Option<Count>,
    }
    let reader = std::io::BufReader::with_capacity(64 * 1024, ChunkReader { chunks, chunk: Bytes::new() });
    let shape: Shape = serde_json::from_reader(reader).context("not JSON")?;
    let count = if key == "items" { shape.items } else { shape.rows };
    count.map(|c| c.0).with_context(|| format!("no {key}"))
}

/// The length of a JSON array, its elements skipped.
struct Count(u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
        struct Counter;
        impl<'de> Visitor<'de> for Counter {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }
        d.deserialize_seq(Counter)
    }
}

/// The chunks of an answer as a reader, for a parser on a blocking thread.
struct ChunkReader {
    chunks: tokio::sync::mpsc::Receiver<Bytes>,
    chunk: Bytes,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.chunk = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        Ok(n)
    }
}

// The LIST rows of the table.

fn list_rows(n: u64, new: ListRun, old: Option<ListRun>) -> Vec<Row> {
    let size = format!("10^{} ShootStates of 100 KiB", n.ilog10());
    let mut rows = Vec::new();
    for (k, (form, ..)) in FORMS.iter().enumerate() {
        let scenario = format!("unpaginated LIST of {size} as {form}: server RSS growth");
        let new_growth = new.singles.get(k).and_then(|s| s.as_ref().ok()).map(|s| s.peak.saturating_sub(s.rss_before));
        let mut row = single_row(&format!("{scenario}, new"), new.singles.get(k), None);
        row.target = Goal::MaxMib(256.0).show(new_growth.map(|g| g as f64 / 1024.0));
        if old.is_none() {
            row.notes += "; baseline: skipped (no --baseline)";
        }
        rows.push(row);
        if let Some(old) = &old {
            rows.push(single_row(&format!("{scenario}, baseline"), old.singles.get(k), new_growth));
        }
    }
    let scenario = format!("{CONCURRENT_LISTS} unpaginated LISTs of {size} at once by a token user: server peak RSS");
    rows.push(eight_row(&format!("{scenario}, new with the default limits"), &new.eight_default, true));
    let mut row = eight_row(&format!("{scenario}, new with --max-requests-inflight {EIGHT_LIMIT}"), &new.eight, true);
    if old.is_none() {
        row.notes += "; baseline: skipped (no --baseline)";
    }
    rows.push(row);
    if let Some(old) = &old {
        let scenario = format!("{scenario}, baseline (no in-flight limit; killed above 1 GiB)");
        rows.push(eight_row(&scenario, &old.eight, false));
    }
    rows
}

fn failed_row(scenario: &str, e: &str) -> Row {
    let e = e.replace('|', "\\|").replace('\n', " ");
    Row { scenario: scenario.into(), notes: format!("failed: {e}"), ..Row::default() }
}

/// `new_growth`: the new binary's, to compare the baseline's with.
fn single_row(scenario: &str, single: Option<&Result<Single, String>>, new_growth: Option<u64>) -> Row {
    let s = match single {
        Some(Ok(s)) => s,
        Some(Err(e)) => return failed_row(scenario, e),
        None => return failed_row(scenario, "not run"),
    };
    let growth = s.peak.saturating_sub(s.rss_before);
    let mut notes = format!(
        "+{}: VmRSS {} before, VmHWM {}, VmRSS {} after; answer {:.1} MiB read in {:.1} s",
        mib(growth),
        mib(s.rss_before),
        mib(s.peak),
        s.rss_after.map_or("?".into(), mib),
        s.bytes as f64 / (1024.0 * 1024.0),
        s.took.as_secs_f64()
    );
    if let Some(new) = new_growth.filter(|&g| g > 0) {
        notes += &format!("; x{:.1} the new binary's growth", growth as f64 / new as f64);
    }
    Row { scenario: scenario.into(), notes, ..Row::default() }
}

/// `judged`: the row of the new binary, which has the targets.
fn eight_row(scenario: &str, eight: &Result<Eight, String>, judged: bool) -> Row {
    let e = match eight {
        Ok(e) => e,
        Err(e) => return failed_row(scenario, e),
    };
    let whole = e.clients.iter().filter(|c| c.whole.is_some() && c.error.is_none()).count();
    let rejected: u64 = e.clients.iter().map(|c| c.rejected).sum();
    let retry_after_1: u64 = e.clients.iter().map(|c| c.retry_after_1).sum();
    let kube_body: u64 = e.clients.iter().map(|c| c.kube_body).sum();
    let errors: Vec<&str> = e.clients.iter().filter_map(|c| c.error.as_deref()).collect();
    let (peak, mut notes) = match e.watched.killed {
        Some((after, rss)) => (
            rss,
            format!(
                "over {} after {:.1} s (VmRSS {}, killed by the bench); VmRSS {} before",
                gib_or_mib(e.kill_above),
                after.as_secs_f64(),
                mib(rss),
                mib(e.rss_before)
            ),
        ),
        None => {
            let peak = e.hwm.unwrap_or(0).max(e.watched.peak);
            (peak, format!("VmHWM {}, VmRSS {} before", mib(peak), mib(e.rss_before)))
        }
    };
    notes += &format!("; {whole}/{CONCURRENT_LISTS} complete in {:.1} s", e.took.as_secs_f64());
    if let Some((count, bytes)) = e.clients.iter().find_map(|c| c.whole) {
        notes += &format!(" (each {} objects, {:.1} MiB)", thousands(count as f64), bytes as f64 / (1024.0 * 1024.0));
    }
    notes += &format!("; {rejected} 429s answered");
    if rejected > 0 {
        let all = |k: u64| if k == rejected { "all".to_string() } else { format!("{k} of them") };
        notes += &format!(
            " ({} with Retry-After: 1, {} with kube-apiserver's body), each retried after its Retry-After",
            all(retry_after_1),
            all(kube_body)
        );
    }
    if !errors.is_empty() {
        let how = if e.watched.killed.is_some() { "cut off by the kill" } else { "failed" };
        notes += &format!("; {} clients {how}, first: {}", errors.len(), errors[0].replace('|', "\\|"));
    }
    if let Some(died) = &e.died {
        notes += &format!("; the server exited by itself ({died}), its log is kept");
    }
    let target = if judged {
        let met = if whole == CONCURRENT_LISTS { "met" } else { "**missed**" };
        let memory = Goal::MaxMib(DEPLOYMENT_KIB as f64 / 1024.0).show(Some(peak as f64 / 1024.0));
        format!("{memory}; {CONCURRENT_LISTS}/{CONCURRENT_LISTS} complete: {met}")
    } else {
        String::new()
    };
    Row { scenario: scenario.into(), target, notes, ..Row::default() }
}

/// A size in KiB as whole GiB when it is one.
fn gib_or_mib(kib: u64) -> String {
    if kib.is_multiple_of(GIB_KIB) {
        format!("{} GiB", kib / GIB_KIB)
    } else {
        mib(kib)
    }
}

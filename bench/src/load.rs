//! Closed-loop load and its statistics.

use super::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// Closed-loop load: `conns` workers, each with one keep-alive connection, take request numbers
// from a shared counter until the deadline passes or `limit` requests were issued.

pub(super) type MakeReq = Arc<dyn Fn(u64) -> Req + Send + Sync>;

pub(super) struct Load {
    pub(super) stats: Stats,
    pub(super) elapsed: Duration,
    pub(super) cpu: String,
}

/// Checks the body of a successful response to request number `i`; an `Err` counts the request as failed.
pub(super) type Check = Arc<dyn Fn(u64, &[u8]) -> Result<(), String> + Send + Sync>;

pub(super) async fn run_load(
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
pub(super) async fn run_load_checked(
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

pub(super) async fn worker(
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
        let c = match reuse_or_connect(&mut conn, &target).await {
            Ok(c) => c,
            Err(e) => {
                stats.error(format!("connect: {e:#}"), None);
                failed_connects += 1;
                if failed_connects >= 5 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
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
            Ok((status, body)) => stats.refused(status, &body),
            Err(e) => {
                stats.error(format!("{e:#}"), None);
                conn = None; // reconnect
            }
        }
    }
    stats
}

/// The worker's connection: `conn` when it is open, else a new one (kept in `conn`).
pub(super) async fn reuse_or_connect<'a>(
    conn: &'a mut Option<LeanConn>,
    target: &Target,
) -> anyhow::Result<&'a mut LeanConn> {
    if conn.is_none() {
        *conn = Some(target.connect_lean().await?);
    }
    Ok(conn.as_mut().expect("connected above"))
}

/// The `Stats::by_status` key of answers that had a success status but failed their check.
pub(super) const WRONG_ANSWER: u16 = 1;

#[derive(Default)]
pub(super) struct Stats {
    pub(super) ok: u64,
    pub(super) errors: u64,
    /// Errors by HTTP status; 0 = transport error, [`WRONG_ANSWER`] = a success status with a wrong body.
    pub(super) by_status: BTreeMap<u16, u64>,
    pub(super) first_error: Option<String>,
    pub(super) samples: Vec<u32>,
}

impl Stats {
    pub(super) fn error(&mut self, msg: String, status: Option<u16>) {
        self.errors += 1;
        *self.by_status.entry(status.unwrap_or(0)).or_default() += 1;
        self.first_error.get_or_insert(msg);
    }

    /// An answer with a status that is not the one expected, with the start of its body.
    pub(super) fn refused(&mut self, status: hyper::StatusCode, body: &[u8]) {
        self.error(
            format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])),
            Some(status.as_u16()),
        );
    }

    pub(super) fn merge(&mut self, o: Stats) {
        (self.ok, self.errors) = (self.ok + o.ok, self.errors + o.errors);
        o.by_status.into_iter().for_each(|(k, v)| *self.by_status.entry(k).or_default() += v);
        self.first_error = self.first_error.take().or(o.first_error);
        self.samples.extend(o.samples);
    }

    pub(super) fn error_summary(&self) -> String {
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
    pub(super) fn row(&self, scenario: &str, conns: usize, goal: Goal, extra: &str) -> Row {
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

/// Two halves of one row measured apart, as one load: their requests over their time; the requests/s and CPU of
/// each.
pub(super) fn halves(first: Load, second: Load) -> Load {
    let rps = |l: &Load| thousands(l.stats.ok as f64 / l.elapsed.as_secs_f64().max(1e-9));
    let cpu = format!("first half: {}/s, {}; second half: {}/s, {}", rps(&first), first.cpu, rps(&second), second.cpu);
    let mut stats = first.stats;
    stats.merge(second.stats);
    Load { stats, elapsed: first.elapsed + second.elapsed, cpu }
}

//! Snapshots of the embedded store (issue 40): how long a snapshot of 10^5 ShootStates of 2 KiB takes, and what
//! snapshots taken back to back cost the server's readers (GET p99 at 1,000 GET/s) and writers (CREATE
//! throughput), each next to the same load without snapshots, on one server of its own.

use super::*;
use anyhow::bail;
use bytes::Bytes;
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The pad that makes each stored ShootState about 2 KiB (the rest of the object is about 250 bytes).
const PAD: usize = 1800;

/// The rows of the `backup` group, on `n` ShootStates (10^5; --quick: 10^4).
pub(super) async fn backup_rows(bin: &Path, quick: bool, duration: Duration) -> Vec<Row> {
    let n: u64 = if quick { 10_000 } else { 100_000 };
    match rows(bin, n, duration).await {
        Ok(rows) => rows,
        Err(e) => vec![Row::failed(snapshot_scenario(n), e)],
    }
}

fn snapshot_scenario(n: u64) -> String {
    format!("Snapshot of the embedded store, 10^{} ShootStates of 2 KiB", n.ilog10())
}

async fn rows(bin: &Path, n: u64, duration: Duration) -> anyhow::Result<Vec<Row>> {
    // Two kept: every snapshot of the run is as large as the store.
    let (mut server, target) = ServerProcess::start(bin, &["--disable-scheduler", "--snapshot-retention", "2"]).await?;
    let pid = Some(server.child.id());
    eprintln!("bench: backup: storing {n} ShootStates of 2 KiB");
    let seed = run_load(&target, None, 64, None, n, shoot_state_creates(0, &"x".repeat(PAD))).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    eprintln!("bench: backup: one snapshot");
    let (snapshot, took) = take_snapshot(&target).await?;
    let size = snapshot["size"].as_f64().unwrap_or(0.0);
    let snapshot_row = Row {
        scenario: snapshot_scenario(n),
        notes: format!(
            "{:.2} s, {:.0} MB, {:.0} MB/s; {} objects at revision {}",
            took.as_secs_f64(),
            size / 1e6,
            size / 1e6 / took.as_secs_f64().max(1e-9),
            snapshot["objects"],
            snapshot["revision"]
        ),
        ..Row::default()
    };
    let mut rows = vec![snapshot_row];
    rows.extend(reader_rows(&target, pid, n, duration).await?);
    rows.extend(writer_rows(&target, pid, duration).await?);
    server.stop().await?;
    Ok(rows)
}

/// `POST /storage/snapshots`: its answer and how long it took.
async fn take_snapshot(target: &Target) -> anyhow::Result<(Value, Duration)> {
    let start = Instant::now();
    let body = target.call_ok(&Req::post("/storage/snapshots".into(), Bytes::new())).await?;
    Ok((serde_json::from_slice(&body)?, start.elapsed()))
}

/// Snapshots taken back to back until `stop`: how many were written.
fn snapshots_until(target: &Target, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<anyhow::Result<u64>> {
    let target = target.clone();
    tokio::spawn(async move {
        let mut taken = 0;
        while !stop.load(Ordering::Relaxed) {
            take_snapshot(&target).await?;
            taken += 1;
        }
        Ok(taken)
    })
}

/// GET of the ShootStates at 1,000 GET/s for `duration`, idle, then while snapshots are taken back to back; the
/// second row's target: p99 <= 2x idle's.
async fn reader_rows(target: &Target, pid: Option<u32>, n: u64, duration: Duration) -> anyhow::Result<Vec<Row>> {
    let rate = thousands(GET_CONNS as f64 / GET_PERIOD.as_secs_f64());
    eprintln!("bench: backup: ShootState GET idle ({rate} GET/s, {duration:?})");
    let idle = BackgroundLoad::start(target, pid, GET_CONNS, shootstate_gets(n));
    tokio::time::sleep(duration).await;
    let idle = idle.finish().await;
    let idle_row = idle.row(&format!("ShootState GET at {rate} GET/s, no snapshot"), GET_CONNS, Goal::None, "");
    eprintln!("bench: backup: ShootState GET during snapshots ({duration:?})");
    let stop = Arc::new(AtomicBool::new(false));
    let load = BackgroundLoad::start(target, pid, GET_CONNS, shootstate_gets(n));
    let snapshots = snapshots_until(target, stop.clone());
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let taken = snapshots.await??;
    let load = load.finish().await;
    let mut row = load.row(&format!("ShootState GET at {rate} GET/s during snapshots"), GET_CONNS, Goal::None, "");
    let ratio = match (row.p99_v, pct_f(&idle.stats.samples, 0.99)) {
        (Some(d), i) if i > 0.0 => d / i,
        _ => bail!("no GET answered idle or during the snapshots"),
    };
    row.target = format!("p99 <= 2x no snapshot's: {}", if ratio <= 2.0 { "met" } else { "**missed**" });
    row.notes = format!("p99 x{ratio:.2} of no snapshot's; {taken} snapshots back to back; {}", row.notes);
    Ok(vec![idle_row, row])
}

/// CREATE of new StorageStates (closed loop, 32 connections) for `duration`, alone, and for as long while snapshots
/// are taken back to back; the second row's target: requests/s >= 0.8x alone. Each row is measured in two halves,
/// in the order alone, during, during, alone: every CREATE grows the store (and so each commit and snapshot), and
/// the order cancels that drift instead of charging it to the snapshots.
async fn writer_rows(target: &Target, pid: Option<u32>, duration: Duration) -> anyhow::Result<Vec<Row>> {
    let conns = 32;
    let half = duration / 2;
    eprintln!("bench: backup: CREATE alone, during snapshots, during, alone ({conns} connections, {half:?} each)");
    let alone_1 = run_load(target, pid, conns, Some(half), u64::MAX, new_states("backup-alone-1".into())).await;
    let (during_1, taken_1) = creates_during_snapshots(target, pid, conns, half, "backup-during-1").await?;
    let (during_2, taken_2) = creates_during_snapshots(target, pid, conns, half, "backup-during-2").await?;
    let alone_2 = run_load(target, pid, conns, Some(half), u64::MAX, new_states("backup-alone-2".into())).await;
    let alone_row = load::halves(alone_1, alone_2).row("CREATE (new names), no snapshot", conns, Goal::None, "");
    let mut row = load::halves(during_1, during_2).row("CREATE (new names) during snapshots", conns, Goal::None, "");
    let ratio = match (row.rps_v, alone_row.rps_v) {
        (Some(d), Some(a)) if a > 0.0 => d / a,
        _ => bail!("no CREATE answered alone or during the snapshots"),
    };
    row.target = format!("requests/s >= 0.8x no snapshot's: {}", if ratio >= 0.8 { "met" } else { "**missed**" });
    let taken = taken_1 + taken_2;
    row.notes = format!("x{ratio:.2} of no snapshot's requests/s; {taken} snapshots back to back; {}", row.notes);
    Ok(vec![alone_row, row])
}

/// CREATEs for `duration` while snapshots are taken back to back: the load and the snapshots taken.
async fn creates_during_snapshots(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    names: &str,
) -> anyhow::Result<(Load, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let snapshots = snapshots_until(target, stop.clone());
    let load = run_load(target, pid, conns, Some(duration), u64::MAX, new_states(names.into())).await;
    stop.store(true, Ordering::Relaxed);
    Ok((load, snapshots.await??))
}

//! The adaptive migration rate (issue 38), standalone: a storage-version migration of 10^5 ShootStates with
//! default flags against an unthrottled one, readers' GET p99 at a fixed 1,000 GET/s during a default migration,
//! and readers saturating the server (8 connections, closed loop) with and without one. The stand-in target's
//! phases are in [`super::faults`].

use super::*;
use anyhow::bail;
use std::path::Path;
use std::time::{Duration, Instant};

const SHOOTSTATES: &str = "shootstates.core.gardener.cloud";
/// Unthrottled: a fixed rate without a limit, as `--migration-qps 0` was before the rate adapted.
const UNTHROTTLED: [&str; 3] = ["--migration-adaptive=false", "--migration-qps", "0"];
/// Readers that saturate the server: 8 connections, each sending its next GET when the last one is answered.
const SATURATING_CONNS: usize = 8;
/// The saturating readers run during the migration for at most this long; a migration still running then finishes
/// without them (its rate under the load is in the row).
const SATURATED_FOR: Duration = Duration::from_secs(120);

/// The group's rows on one server with 10^5 ShootStates (--quick: 10^4).
pub(super) async fn adaptive_rows(bin: &Path, quick: bool, duration: Duration) -> Vec<Row> {
    let n: u64 = if quick { 10_000 } else { 100_000 };
    let mut rows = match standalone(bin, n, duration).await {
        Ok(rows) => rows,
        Err(e) => vec![Row::failed(format!("adaptive rate, 10^{} ShootStates standalone", n.ilog10()), e)],
    };
    rows.extend(phase_rows(bin, n).await);
    rows
}

/// `--storage-version` for ShootStates, then `extra`.
fn flags(version: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--storage-version".to_string(), format!("{SHOOTSTATES}={version}")];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Restarts the server with `args` (a new storage version) and waits for the storage-version trigger's migration
/// to succeed and the version to be recorded as persisted; the migrator's rate limit meanwhile and its seconds.
async fn migrate_with(
    server: &mut ServerProcess,
    target: &Target,
    args: &[String],
    n: u64,
) -> anyhow::Result<(Target, String, f64)> {
    let before = shootstate_migrations(target).await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let target = server.restart(&args).await?;
    let rates = RateSampler::start(&target);
    let (name, status) = wait_new_migration(&target, server, &before).await?;
    let rates = rates.finish().await;
    check_migrated(&status, n)?;
    let seconds = migrator_seconds(server, &name)?;
    wait_persisted(&target, server).await?;
    Ok((target, rates.summary(), seconds))
}

pub(super) async fn wait_persisted(target: &Target, server: &mut ServerProcess) -> anyhow::Result<()> {
    wait_state(target, server, "the storage version persisted", |status| {
        let current = status["currentStorageVersionHash"].as_str()?;
        (status["persistedStorageVersionHashes"] == serde_json::json!([current])).then_some(Ok(()))
    })
    .await
    .map(drop)
}

async fn standalone(bin: &Path, n: u64, duration: Duration) -> anyhow::Result<Vec<Row>> {
    let (mut server, target) = ServerProcess::start(bin, &refs(&flags("v1alpha1", &UNTHROTTLED))).await?;
    eprintln!("bench: adaptive: storing {n} ShootStates");
    let seed = run_load(&target, None, 64, None, n, shoot_state_creates(0, "")).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    wait_persisted(&target, &mut server).await?;
    let exp = n.ilog10();

    eprintln!("bench: adaptive: unthrottled migration of {n} ShootStates");
    let (target, _, free_s) = migrate_with(&mut server, &target, &flags("v1beta1", &UNTHROTTLED), n).await?;
    eprintln!("bench: adaptive: default-flags migration of {n} ShootStates");
    let (target, rates, default_s) = migrate_with(&mut server, &target, &flags("v1alpha1", &[]), n).await?;
    let (free, default) = (n as f64 / free_s, n as f64 / default_s);
    let ratio = default / free;
    let mut rows = vec![
        Row {
            scenario: format!("storage-version migration of 10^{exp} ShootStates, unthrottled (--migration-adaptive=false --migration-qps 0)"),
            rps: thousands(free),
            notes: format!("objects/s; {} objects in {free_s:.1} s (the migrator's start to Succeeded), no other load", thousands(n as f64)),
            rps_v: Some(free),
            ..Row::default()
        },
        Row {
            scenario: format!("storage-version migration of 10^{exp} ShootStates, default flags (adaptive, no ceiling)"),
            rps: thousands(default),
            target: format!("{}; aim x0.30", Goal::MinRatio(0.10).show(Some(ratio))),
            notes: format!(
                "objects/s x{ratio:.2} of the unthrottled one's; {} objects in {default_s:.1} s, no other load; the \
                 rate limit during it: {rates}",
                thousands(n as f64)
            ),
            rps_v: Some(default),
            ..Row::default()
        },
    ];
    let (target, paced) = paced_rows(&mut server, &target, n, duration).await?;
    rows.extend(paced);
    rows.extend(saturated_rows(&mut server, &target, n, duration).await?);
    server.stop().await?;
    Ok(rows)
}

/// GET at 1,000 GET/s idle, then during a default-flags migration (v1alpha1 -> v1beta1).
async fn paced_rows(
    server: &mut ServerProcess,
    target: &Target,
    n: u64,
    duration: Duration,
) -> anyhow::Result<(Target, Vec<Row>)> {
    let rate = thousands(GET_CONNS as f64 / GET_PERIOD.as_secs_f64());
    eprintln!("bench: adaptive: GET at {rate} GET/s idle ({duration:?})");
    let idle = BackgroundLoad::start(target, Some(server.child.id()), GET_CONNS, shootstate_gets(n));
    tokio::time::sleep(duration).await;
    let idle = idle.finish().await;
    let idle_row = idle.row(
        &format!("ShootState GET at {rate} GET/s, idle (10^{} stored)", n.ilog10()),
        GET_CONNS,
        Goal::None,
        "",
    );
    eprintln!("bench: adaptive: GET at {rate} GET/s during a default-flags migration");
    // The load starts as soon as the restarted server answers, before its migration has gone far.
    let before = shootstate_migrations(target).await?;
    let target = server.restart(&refs(&flags("v1beta1", &[]))).await?;
    let load = BackgroundLoad::start(&target, Some(server.child.id()), GET_CONNS, shootstate_gets(n));
    let rates = RateSampler::start(&target);
    let waited = wait_new_migration(&target, server, &before).await;
    let load = load.finish().await;
    let rates = rates.finish().await.summary();
    let (name, status) = waited?;
    check_migrated(&status, n)?;
    let seconds = migrator_seconds(server, &name)?;
    wait_persisted(&target, server).await?;
    let mut row = load.row(
        &format!("ShootState GET at {rate} GET/s during a default-flags migration"),
        GET_CONNS,
        Goal::None,
        "",
    );
    let idle_p99 = pct_f(&idle.stats.samples, 0.99);
    let ratio = row.p99_v.unwrap_or(f64::NAN) / idle_p99;
    row.target = format!("p99 <= 2x idle: {}", if ratio <= 2.0 { "met" } else { "**missed**" });
    row.notes = format!(
        "p99 x{ratio:.2} of idle's, p50 x{:.2}; the migration of {} objects took {seconds:.1} s ({} objects/s with \
         this load); the rate limit during it: {rates}; {}",
        pct_f(&load.stats.samples, 0.5) / pct_f(&idle.stats.samples, 0.5),
        thousands(n as f64),
        thousands(n as f64 / seconds),
        row.notes
    );
    Ok((target, vec![idle_row, row]))
}

/// 8 connections GET as fast as they can, without a migration, then during a default-flags migration (v1beta1 ->
/// v1alpha1; at most [`SATURATED_FOR`], then the migration finishes without them).
async fn saturated_rows(
    server: &mut ServerProcess,
    target: &Target,
    n: u64,
    duration: Duration,
) -> anyhow::Result<Vec<Row>> {
    eprintln!("bench: adaptive: saturating GET ({SATURATING_CONNS} connections) without a migration ({duration:?})");
    let alone = BackgroundLoad::start_closed(target, Some(server.child.id()), SATURATING_CONNS, shootstate_gets(n));
    tokio::time::sleep(duration).await;
    let alone = alone.finish().await;
    let alone_row =
        alone.row("ShootState GET, 8 connections as fast as they can, no migration", SATURATING_CONNS, Goal::None, "");
    eprintln!("bench: adaptive: saturating GET during a default-flags migration");
    let before = shootstate_migrations(target).await?;
    let args = flags("v1alpha1", &[]);
    let target = server.restart(&refs(&args)).await?;
    let started = Instant::now();
    let load = BackgroundLoad::start_closed(&target, Some(server.child.id()), SATURATING_CONNS, shootstate_gets(n));
    let rates = RateSampler::start(&target);
    let waited = tokio::time::timeout(SATURATED_FOR, wait_new_migration(&target, server, &before)).await;
    let load = load.finish().await;
    let rates = rates.finish().await.summary();
    let under_load = started.elapsed();
    let migrated_under_load = migrated_objects(&target).await.unwrap_or(0);
    let (name, status) = match waited {
        Ok(done) => done?,
        Err(_) => wait_new_migration(&target, server, &before).await?,
    };
    check_migrated(&status, n)?;
    let seconds = migrator_seconds(server, &name)?;
    wait_persisted(&target, server).await?;
    let mut row = load.row(
        "ShootState GET, 8 connections as fast as they can, during a default-flags migration",
        SATURATING_CONNS,
        Goal::None,
        "",
    );
    let ratio = row.rps_v.unwrap_or(f64::NAN) / alone_row.rps_v.unwrap_or(f64::NAN);
    row.target = format!("{}; the migration finishes", Goal::MinRatio(0.8).show(Some(ratio)));
    let finished = if under_load < SATURATED_FOR {
        format!(
            "the migration finished under the load: {} objects in {seconds:.1} s ({} objects/s)",
            thousands(n as f64),
            thousands(n as f64 / seconds)
        )
    } else {
        format!(
            "{} objects migrated in the load's {:.0} s ({} objects/s), then the rest without it: Succeeded, {} objects in {seconds:.1} s",
            thousands(migrated_under_load as f64),
            under_load.as_secs_f64(),
            thousands(migrated_under_load as f64 / under_load.as_secs_f64()),
            thousands(n as f64)
        )
    };
    row.notes = format!(
        "GET/s x{ratio:.2} of the readers' alone; {finished}; the rate limit under the load: {rates}; {}",
        row.notes
    );
    Ok(vec![alone_row, row])
}

/// The migratedObjects of the newest ShootState migration (its progress, saved every 2 s).
async fn migrated_objects(target: &Target) -> anyhow::Result<u64> {
    let list: serde_json::Value =
        serde_json::from_slice(&target.call_ok(&Req::get(format!("{API}/storageversionmigrations"))).await?)?;
    let newest = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["spec"]["resource"]["resource"] == "shootstates")
        .max_by_key(|m| m["metadata"]["creationTimestamp"].as_str().unwrap_or_default().to_string());
    Ok(newest.and_then(|m| m["status"]["migratedObjects"].as_u64()).unwrap_or(0))
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

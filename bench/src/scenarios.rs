//! Scenarios that need more than one load run: LIST sizes and watch fan-out.

use super::*;
use anyhow::{anyhow, bail, Context};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

// Scenarios that need more than one load run.

pub(super) async fn list_rows(
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
pub(super) async fn watch_fanout(target: &Target, run: &str, streams: usize, updates: usize) -> anyhow::Result<Row> {
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

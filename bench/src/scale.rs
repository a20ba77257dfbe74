//! Scale (issue 21): LIST pages, migration and memory as the store grows towards 10^6 objects.

use super::*;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Items per LIST page, and the writes between a first page and its continue page: the page whose
/// continue token fell behind writes.
pub(super) const PAGE: usize = 500;
pub(super) const WRITES_BEHIND: u64 = 3_000;
/// Connections that grow the store and write between the pages.
const WRITE_CONNS: usize = 64;
/// The lowered memory flags of the memory rows, in MiB: the target is computed from them.
const LOW_CACHE_MIB: u64 = 32;
const LOW_HISTORY_MIB: u64 = 16;
/// Padding that makes a small ShootState about 2 KiB of JSON as stored (with the metadata and managedFields the
/// server adds); the rows report the size measured.
const PAD_BYTES: usize = 1_440;

/// The Scale group: LIST page cost, migration and server memory at growing store sizes.
pub(super) async fn scale_rows(bin: &Path, quick: bool) -> Vec<Row> {
    let mut rows = page_rows(bin, quick).await;
    rows.extend(migration_scale_rows(bin, quick).await);
    rows.extend(memory_rows(bin, quick).await);
    rows
}

/// How many continue pages each size measures.
pub(super) fn page_reps(quick: bool) -> usize {
    if quick {
        5
    } else {
        20
    }
}

pub(super) fn page_scenario(n: u64) -> String {
    format!("LIST page after {} writes, 10^{} objects", thousands(WRITES_BEHIND as f64), n.ilog10())
}

/// One server on the embedded store, grown step by step by CREATEs, with the continue page measured at each size,
/// and a last row comparing the largest size with the smallest.
pub(super) async fn page_rows(bin: &Path, quick: bool) -> Vec<Row> {
    let sizes: [u64; 3] = if quick { [1_000, 10_000, 100_000] } else { [10_000, 100_000, 1_000_000] };
    let (first, last) = (sizes[0].ilog10(), sizes[2].ilog10());
    let summary = format!("LIST page time, 10^{first} -> 10^{last} objects");
    let (mut server, target) = match ServerProcess::start(bin, &["--disable-scheduler"]).await {
        Ok(s) => s,
        Err(e) => return vec![Row::failed(summary, e)],
    };
    let pid = Some(server.child.id());
    let mut rows = Vec::new();
    let mut stored = 0;
    for n in sizes {
        let scenario = page_scenario(n);
        eprintln!("bench: {scenario}");
        let row = page_row(&target, pid, stored, n, page_reps(quick)).await;
        // A size that failed leaves the store short of the next ones: the larger sizes are not measured.
        let failed = row.is_err();
        rows.push(row.unwrap_or_else(|e| Row::failed(scenario, e)));
        if let Some(exit) = server.exited() {
            rows.push(Row::failed(summary, anyhow!("the server exited ({exit})")));
            return rows;
        }
        if failed {
            break;
        }
        stored = n;
    }
    let p50 = |exp: u32| rows.iter().find(|r| r.scenario == page_scenario(10u64.pow(exp))).and_then(|r| r.p50_v);
    let (small, large) = (p50(first), p50(last));
    let ratio = small.zip(large).map(|(s, l)| l / s);
    let notes = small.zip(large).map_or("not measured: a size failed (above)".into(), |(s, l)| {
        format!("continue page p50 {l:.2} ms at 10^{last} / {s:.2} ms at 10^{first} = x{:.2}", l / s)
    });
    rows.push(Row { scenario: summary, target: Goal::MaxRatio(1.25).show(ratio), notes, ..Row::default() });
    rows
}

/// Grows the store from `stored` to `n` small ShootStates, then `reps` times: a first page of all namespaces'
/// ShootStates, [`WRITES_BEHIND`] merge-PATCHes of them, and the continue page of the first, timed.
pub(super) async fn page_row(
    target: &Target,
    pid: Option<u32>,
    stored: u64,
    n: u64,
    reps: usize,
) -> anyhow::Result<Row> {
    let grow = run_load(target, pid, WRITE_CONNS, None, n - stored, shoot_state_creates(stored, "")).await;
    if grow.stats.ok != n - stored {
        bail!("growing the store to {n} ShootStates: {}", grow.stats.error_summary());
    }
    let first_path = format!("{SHOOTSTATES_V1ALPHA1}/shootstates?limit={PAGE}");
    let (mut first_us, mut next_us) = (Vec::new(), Vec::new());
    for rep in 0..reps as u64 {
        // A fresh connection for each pair: the writes take a while, and the pages must not pay for a reconnect.
        let mut conn = target.connect().await?;
        let (took, token) = page(&mut conn, &first_path).await?;
        first_us.push(micros(took));
        let token = token.context("the first page has no continue token")?;
        let writes = run_load(target, None, WRITE_CONNS, None, WRITES_BEHIND, patches(n, rep)).await;
        if writes.stats.ok != WRITES_BEHIND {
            bail!("the writes between the pages: {}", writes.stats.error_summary());
        }
        let (took, _) = page(&mut conn, &format!("{first_path}&continue={}", query_escape(&token))).await?;
        next_us.push(micros(took));
    }
    let (first_us, next_us) = (sorted(first_us.into_iter()), sorted(next_us.into_iter()));
    let notes = format!(
        "{reps} continue pages of {PAGE} items (limit={PAGE}, all namespaces), each after {} merge-PATCHes \
         ({WRITE_CONNS} conn) since its first page; first page p50 {} / p99 {} ms; the store grown to {} \
         ShootStates ({} created in {:.1} s)",
        thousands(WRITES_BEHIND as f64),
        pct(&first_us, 0.5),
        pct(&first_us, 0.99),
        thousands(n as f64),
        thousands((n - stored) as f64),
        grow.elapsed.as_secs_f64(),
    );
    Ok(Row {
        scenario: page_scenario(n),
        p50: pct(&next_us, 0.5),
        p99: pct(&next_us, 0.99),
        notes,
        p50_v: Some(pct_f(&next_us, 0.5)),
        p99_v: Some(pct_f(&next_us, 0.99)),
        ..Row::default()
    })
}

/// [`page_row`] on a fresh server on the embedded store: the pair of etcd's page row when the Scale group did not
/// run.
pub(super) async fn fresh_page_row(bin: &Path, n: u64, reps: usize) -> Row {
    let row = async {
        let (server, target) = ServerProcess::start(bin, &["--disable-scheduler"]).await?;
        page_row(&target, Some(server.child.id()), 0, n, reps).await
    };
    row.await.unwrap_or_else(|e| Row::failed(page_scenario(n), e))
}

/// One LIST page: how long its answer took, and its continue token. Anything but a 200 with [`PAGE`] items fails
/// (a 410 means the token expired).
async fn page(conn: &mut Conn, path: &str) -> anyhow::Result<(Duration, Option<String>)> {
    let started = Instant::now();
    let (status, body) = conn.call(&Req::get(path.to_string())).await?;
    let took = started.elapsed();
    if status != hyper::StatusCode::OK {
        bail!("GET {path} answered {status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)]));
    }
    let list: Value = serde_json::from_slice(&body).with_context(|| format!("GET {path}"))?;
    let items = list["items"].as_array().map_or(0, Vec::len);
    if items != PAGE {
        bail!("GET {path} returned {items} items instead of {PAGE}");
    }
    Ok((took, list["metadata"]["continue"].as_str().filter(|t| !t.is_empty()).map(String::from)))
}

/// Merge-PATCHes of a label of the first `n` small ShootStates, spread over all of them and all namespaces (and so
/// over the keys before and after the page), each with a value of its own so that every one is a real write.
fn patches(n: u64, rep: u64) -> MakeReq {
    Arc::new(move |k| {
        // A prime stride, coprime to `n` (a power of 10): distinct objects until all `n` were written, scattered
        // over every namespace (an even stride of n / 3,000 would hit 3 of the 10).
        let (ns, name) = shoot_state_id((k * 7_919 + rep * WRITES_BEHIND) % n);
        let body = json!({"metadata": {"labels": {"bench-write": format!("{rep}-{k}")}}});
        Req::patch(format!("{SHOOTSTATES_V1ALPHA1}/namespaces/{ns}/shootstates/{name}"), body)
    })
}

/// `s` percent-encoded for a query string (continue tokens are base64, with `=` and maybe `+` and `/`).
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Migrations of 10^4 and 10^6 objects (--quick: 10^3 and 10^5) by [`migrate`], and the ratio of their rates.
async fn migration_scale_rows(bin: &Path, quick: bool) -> Vec<Row> {
    let sizes: [u64; 2] = if quick { [1_000, 100_000] } else { [10_000, 1_000_000] };
    let mut rows = Vec::new();
    for n in sizes {
        let scenario = format!("scale: migrate 10^{} objects (--migration-qps 0)", n.ilog10());
        eprintln!("bench: {scenario}");
        rows.push(migrate(bin, n, &scenario).await.map_or_else(|e| Row::failed(scenario, e), |(row, _, _)| row));
    }
    let (small, large) = (sizes[0].ilog10(), sizes[1].ilog10());
    let ratio = match &rows[..] {
        [s, l] => s.rps_v.zip(l.rps_v).map(|(s, l)| (s, l, l / s)),
        _ => None,
    };
    let notes = ratio.map_or("not measured: a migration failed (above)".into(), |(s, l, r)| {
        format!("{} objects/s at 10^{large} / {} objects/s at 10^{small} = x{r:.2}", thousands(l), thousands(s))
    });
    rows.push(Row {
        scenario: format!("migration rate, 10^{large} vs 10^{small} objects"),
        target: Goal::MinRatio(0.8).show(ratio.map(|(_, _, r)| r)),
        notes,
        ..Row::default()
    });
    rows
}

/// Server RSS holding 10^5 (--quick: 10^4) ShootStates of about 2 KiB, at default flags and with lowered memory
/// flags, each on a fresh server.
async fn memory_rows(bin: &Path, quick: bool) -> Vec<Row> {
    let n: u64 = if quick { 10_000 } else { 100_000 };
    let (cache, history) = (format!("{LOW_CACHE_MIB}Mi"), format!("{LOW_HISTORY_MIB}Mi"));
    let lowered = ["--storage-cache-size", cache.as_str(), "--watch-history-bytes", history.as_str()];
    let mut rows = Vec::new();
    for flags in [&[][..], &lowered[..]] {
        let label = if flags.is_empty() { "default flags".to_string() } else { flags.join(" ") };
        let scenario = format!("server RSS, 10^{} ShootStates of ~2 KiB, {label}", n.ilog10());
        eprintln!("bench: {scenario}");
        rows.push(memory_row(bin, n, flags, &scenario).await.unwrap_or_else(|e| Row::failed(scenario, e)));
    }
    rows
}

async fn memory_row(bin: &Path, n: u64, flags: &[&str], scenario: &str) -> anyhow::Result<Row> {
    let mut args = vec!["--disable-scheduler"];
    args.extend_from_slice(flags);
    let (mut server, target) = ServerProcess::start(bin, &args).await?;
    let pid = server.child.id();
    // The objects as stored: what each CREATE answers.
    let stored = Arc::new(AtomicU64::new(0));
    let sum = stored.clone();
    let check: Check = Arc::new(move |_, body| {
        sum.fetch_add(body.len() as u64, Ordering::Relaxed);
        Ok(())
    });
    let creates = shoot_state_creates(0, &"x".repeat(PAD_BYTES));
    let load = run_load_checked(&target, Some(pid), WRITE_CONNS, None, n, creates, Some(check)).await;
    if load.stats.ok != n {
        bail!("creating {n} ShootStates: {}", load.stats.error_summary());
    }
    // Let the write path's buffers and background work settle before reading.
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Some(exit) = server.exited() {
        bail!("the server exited ({exit})");
    }
    let rss = rss_kib(pid).context("no VmRSS for the server")?;
    let hwm = hwm_kib(pid).context("no VmHWM for the server")?;
    let stored_mib = stored.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0);
    let (limit, how) = if flags.is_empty() {
        ((2.0 * stored_mib + 40.0).round(), "2 x stored JSON + 40 MiB".to_string())
    } else {
        ((LOW_CACHE_MIB + LOW_HISTORY_MIB + 40) as f64, format!("{LOW_CACHE_MIB} + {LOW_HISTORY_MIB} + 40 MiB"))
    };
    let notes = format!(
        "VmRSS {} 3 s after the last create, VmHWM {}; stored JSON {stored_mib:.1} MiB ({} bytes per object, the \
         CREATE answers); {} created in {:.1} s ({WRITE_CONNS} conn); target {how}; --disable-scheduler",
        mib(rss),
        mib(hwm),
        thousands(stored.load(Ordering::Relaxed) as f64 / n as f64),
        thousands(n as f64),
        load.elapsed.as_secs_f64(),
    );
    Ok(Row {
        scenario: scenario.to_string(),
        target: Goal::MaxMib(limit).show(Some(rss as f64 / 1024.0)),
        notes,
        ..Row::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn continue_tokens_are_escaped_for_the_query() {
        assert_eq!(query_escape("eyJ2Ijo+/x=="), "eyJ2Ijo%2B%2Fx%3D%3D");
        assert_eq!(query_escape("a-b_c.d~9"), "a-b_c.d~9");
    }

    #[test]
    fn the_writes_between_pages_spread_over_the_store() {
        for n in [1_000, 10_000, 1_000_000] {
            let make = patches(n, 7);
            let paths: HashSet<String> = (0..WRITES_BEHIND).map(|k| make(k).path).collect();
            // Every write hits a stored object; with fewer objects than writes, every object.
            assert_eq!(paths.len() as u64, n.min(WRITES_BEHIND), "{n}");
            for ns in 0..10 {
                assert!(paths.iter().any(|p| p.contains(&format!("/bench-{ns}/"))), "{n}: bench-{ns}");
            }
        }
    }

    #[test]
    fn ratio_targets_are_judged_against_the_pair_of_the_same_run() {
        assert_eq!(Goal::MaxRatio(1.25).show(Some(1.3)), "within 25% (<= x1.25): **missed**");
        assert_eq!(Goal::MinRatio(0.8).show(Some(0.8)), ">= 80% (x0.80): met");
        let row = |name: &str, rps: f64, pair: Option<&str>| Row {
            scenario: name.into(),
            rps_v: Some(rps),
            pair: pair.map(String::from),
            pair_goal: pair.map(|_| 0.5),
            ..Row::default()
        };
        let mut rows = vec![row("GET", 1000.0, None), row("LIST", 100.0, None)];
        let etcd = vec![row("GET, on etcd", 400.0, Some("GET")), row("LIST, on etcd", 60.0, Some("LIST"))];
        merge_pairs(&mut rows, etcd, "the embedded store's");
        assert_eq!(rows[1].target, ">= 50% (x0.50): **missed**");
        assert_eq!(rows[3].target, ">= 50% (x0.50): met");
    }
}

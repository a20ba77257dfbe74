//! The `load` group's core rows side by side with the previous release (`--baseline`): five pairs alternated, each
//! run on a fresh server.

use super::*;
use std::path::Path;
use std::time::Duration;

const PAIRS: usize = 5;

// The core rows side by side with the baseline.

/// [`core_rows`] on a fresh server of each binary, alternated old, new, old, new, ... for [`PAIRS`] pairs: each row's
/// figures of both, and the ratio of their medians (target: the new binary at least 97% of the old one's).
pub(super) async fn side_by_side_rows(new: &Path, old: &Path, conns: usize, duration: Duration) -> Vec<Row> {
    // Per core row, in their order: its figures for old [0] and new [1].
    let mut figures: Vec<(String, [Vec<f64>; 2])> = Vec::new();
    let mut failures = Vec::new();
    for pair in 1..=PAIRS {
        for (k, (label, bin)) in [("old", old), ("new", new)].into_iter().enumerate() {
            eprintln!("bench: load: core rows, pair {pair}/{PAIRS}, {label} ({})", bin.display());
            let (server, target) = match ServerProcess::start(bin, &["--disable-scheduler"]).await {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("pair {pair} {label}: {e:#}"));
                    continue;
                }
            };
            let (rows, _) =
                core_rows(&target, Some(server.child.id()), conns, duration, &format!("p{pair}"), true).await;
            drop(server);
            for row in rows {
                // The watch row's figure is its p99 latency, the others' their requests/s.
                let value = if is_watch(&row.scenario) { row.p99_v } else { row.rps_v };
                if row.notes.contains(" errors (") || row.notes.starts_with("failed") {
                    failures.push(format!("pair {pair} {label}, {}: {}", row.scenario, row.notes));
                }
                let Some(value) = value else { continue };
                let at = match figures.iter().position(|(s, _)| *s == row.scenario) {
                    Some(at) => at,
                    None => {
                        figures.push((row.scenario.clone(), Default::default()));
                        figures.len() - 1
                    }
                };
                figures[at].1[k].push(value);
            }
        }
    }
    let mut rows: Vec<Row> = figures.iter().map(|(scenario, [old, new])| pair_row(scenario, old, new)).collect();
    if !failures.is_empty() {
        let first = failures[0].replace('|', "\\|").replace('\n', " ");
        let notes = format!("{} runs or rows failed or had errors; first: {first}", failures.len());
        rows.push(Row { scenario: "core rows side by side: failures".into(), notes, ..Row::default() });
    }
    rows
}

fn is_watch(scenario: &str) -> bool {
    scenario.starts_with("watch")
}

fn pair_row(scenario: &str, old: &[f64], new: &[f64]) -> Row {
    let watch = is_watch(scenario);
    let show = |v: &[f64]| {
        let list: Vec<String> = v.iter().map(|&x| if watch { format!("{x:.2}") } else { thousands(x) }).collect();
        match median(v) {
            None => format!("none of {PAIRS} runs"),
            Some(m) => {
                let m = if watch { format!("{m:.2}") } else { thousands(m) };
                format!("{} (median {m}; {} of {PAIRS} runs)", list.join(", "), v.len())
            }
        }
    };
    let ratio = match (median(old), median(new)) {
        (Some(o), Some(n)) if watch && n > 0.0 => Some(o / n),
        (Some(o), Some(n)) if !watch && o > 0.0 => Some(n / o),
        _ => None,
    };
    let what = if watch {
        "p99 ms, old / new of the medians (>= 0.97: the new binary's p99 at most ~3% longer)"
    } else {
        "requests/s, new / old of the medians"
    };
    let new_median = median(new);
    Row {
        scenario: format!("{scenario}: new against baseline, {PAIRS} pairs alternated"),
        rps: if watch { String::new() } else { new_median.map_or(String::new(), thousands) },
        p99: if watch { new_median.map_or(String::new(), |m| format!("{m:.2}")) } else { String::new() },
        target: Goal::MinRatio(0.97).show(ratio),
        notes: format!(
            "{what} x{}; old: {}; new: {}",
            ratio.map_or("?".into(), |r| format!("{r:.2}")),
            show(old),
            show(new)
        ),
        ..Row::default()
    }
}

pub(super) fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        l if l % 2 == 1 => Some(v[l / 2]),
        l => Some((v[l / 2 - 1] + v[l / 2]) / 2.0),
    }
}

//! The table rows of the overload runs ([`super::overload_limit`]): the token user's LISTs, the `system:masters`
//! GET and the migration, each measure's rows together (the limit, without it, the baseline).

use super::*;

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

fn ms(sorted: &[u32], p: f64) -> String {
    if sorted.is_empty() {
        "-".into()
    } else {
        pct(sorted, p)
    }
}

fn p99(sorted: &[u32]) -> Option<f64> {
    (!sorted.is_empty()).then(|| pct_f(sorted, 0.99))
}

/// "x0.42" of `a / b`, or "x?".
fn times(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("x{:.2}", a / b),
        _ => "x?".into(),
    }
}

fn lists_per_s(run: &Run) -> f64 {
    run.window.lists.samples.len() as f64 / run.window.lists.elapsed.as_secs_f64().max(1e-9)
}

pub(super) fn overload_table(
    n: u64,
    results: &[(Limit, Result<Run, String>)],
    with_baseline: bool,
    placement: &str,
) -> Vec<Row> {
    let limited = results.iter().find_map(|(l, r)| r.as_ref().ok().filter(|_| *l == Limit::On));
    let mut lists = Vec::new();
    let mut masters = Vec::new();
    let mut migrations = Vec::new();
    for (limit, run) in results {
        match run {
            Ok(run) => {
                let reference = limited.filter(|_| *limit != Limit::On);
                lists.push(list_row(n, run, reference, placement));
                masters.push(masters_row(run, reference, placement));
                migrations.push(migration_row(n, run));
            }
            Err(e) => {
                let e = e.replace('|', "\\|").replace('\n', " ");
                lists.push(Row {
                    scenario: format!("overload: {}", limit.label()),
                    notes: format!("failed: {e}"),
                    ..Row::default()
                });
            }
        }
    }
    if !with_baseline {
        lists.push(Row {
            scenario: format!("overload: {}", Limit::Baseline.label()),
            notes: "skipped: needs --baseline".into(),
            ..Row::default()
        });
    }
    lists.into_iter().chain(masters).chain(migrations).collect()
}

/// The token user's LISTs of one run; `limited`: the run with the limit, to compare with.
fn list_row(n: u64, run: &Run, limited: Option<&Run>, placement: &str) -> Row {
    let l = &run.window.lists;
    let answers = l.answers();
    let secs = l.elapsed.as_secs_f64().max(1e-9);
    let rps = lists_per_s(run);
    let all = |k: u64| if k == l.rejected { "all".to_string() } else { format!("{k} of them") };
    let mut notes = format!(
        "{:.1}% answered 429 ({} of {} answers, {}/s)",
        l.rejected as f64 * 100.0 / answers.max(1) as f64,
        thousands(l.rejected as f64),
        thousands(answers as f64),
        thousands(answers as f64 / secs),
    );
    if l.rejected > 0 {
        notes += &format!(
            ", {} with Retry-After: 1, {} with kube-apiserver's body, each waited out; at most {} 429s in a row on \
             one connection, {} times 11 (client-go returns the 429 to its caller after 10 retries)",
            all(l.retry_after_1),
            all(l.kube_body),
            l.longest_run,
            thousands(l.gave_up as f64),
        );
    }
    notes += &format!(
        "; {} LISTs whole on {} of the {OVERLOAD_CONNS} connections ({:.1} MiB each, all {} objects counted), \
         p50/p99 of these; lost (neither a whole LIST nor a 429): {}",
        thousands(l.samples.len() as f64),
        l.served_conns,
        run.list_bytes as f64 / (1024.0 * 1024.0),
        thousands(n as f64),
        l.lost
    );
    if let Some(first) = &l.first_lost {
        notes += &format!(" (first: {})", first.replace('|', "\\|").replace('\n', " "));
    }
    notes += &match &run.window.seats {
        Some(Ok(peak)) => format!("; at most {peak} of the {LIMIT} read-only seats in use in any second"),
        Some(Err(e)) => format!("; the seats in use: {e}"),
        None => "; no seats counted (no limit)".into(),
    };
    notes += &format!(
        "; at most {} LIST answer{} read at once by the bench (the server frees a LIST's seats once it has written \
         its last byte); server VmRSS {} before, VmHWM {}",
        l.streaming_peak,
        if l.streaming_peak == 1 { "" } else { "s" },
        run.rss_before.map_or("?".into(), mib),
        run.hwm.map_or("?".into(), mib),
    );
    notes += &format!(
        "; the LISTs begun in the {:.0} s window read to their ends after {:.1} s (requests/s: whole LISTs over that)",
        run.window.masters.elapsed.as_secs_f64(),
        l.elapsed.as_secs_f64()
    );
    if let Some(limited) = limited {
        notes += &format!(
            "; against the limit's run: LISTs/s {}, p99 {}",
            times(Some(rps), Some(lists_per_s(limited))),
            times(p99(&l.samples), p99(&limited.window.lists.samples))
        );
    }
    notes += &format!("; {}; {placement}", l.cpu);
    let target = match run.limit {
        Limit::On => {
            let checked = l.rejected > 0 && l.retry_after_1 == l.rejected && l.kube_body == l.rejected;
            format!(
                "429s sent, each with Retry-After: 1 and kube-apiserver's body: {}; nothing lost: {}",
                met(checked),
                met(l.lost == 0)
            )
        }
        _ => "reference, not judged".into(),
    };
    Row {
        scenario: format!(
            "unpaginated LIST of {} ShootStates of ~4 KiB by a token user, {OVERLOAD_CONNS} connections as client-go \
             (a 429 waits its Retry-After), during a migration: {}",
            thousands(n as f64),
            run.limit.label()
        ),
        rps: thousands(rps),
        p50: ms(&l.samples, 0.5),
        p99: ms(&l.samples, 0.99),
        target,
        notes,
        rps_v: Some(rps),
        p99_v: p99(&l.samples),
        ..Row::default()
    }
}

/// Other processes' use of the server's CPUs (cores) above which a masters row says its verdict was disturbed.
const DISTURBED_CORES: f64 = 0.05;

/// The masters GET of one run, loaded, against idle.
fn masters_row(run: &Run, limited: Option<&Run>, placement: &str) -> Row {
    let (idle, loaded) = (&run.idle, &run.window.masters);
    let idle_s = &idle.stats.samples;
    let ratio = p99(&loaded.stats.samples).zip(p99(idle_s)).map(|(l, i)| l / i);
    let mut row = loaded.row(
        &format!("GET one object as system:masters, 1 connection, during the overload: {}", run.limit.label()),
        1,
        Goal::None,
        "",
    );
    let mut notes = format!(
        "p99 x{} of idle's; idle (the same server, scheduler running, no load, {:.0} s): p50 {} ms, p99 {} ms, {}/s",
        ratio.map_or("?".into(), |r| format!("{r:.2}")),
        idle.elapsed.as_secs_f64(),
        ms(idle_s, 0.5),
        ms(idle_s, 0.99),
        thousands(idle.stats.ok as f64 / idle.elapsed.as_secs_f64().max(1e-9)),
    );
    if idle.stats.errors > 0 {
        notes += &format!(", idle {}", idle.stats.error_summary());
    }
    if let Some(limited) = limited {
        notes += &format!(
            "; p99 {} of the limit's run",
            times(p99(&loaded.stats.samples), p99(&limited.window.masters.stats.samples))
        );
    }
    // Other processes on the server's CPUs (this machine's other work) lengthen its answers, idle or loaded.
    let others = |share: &Option<CpuShare>| share.as_ref().map(|s| (s.busy - s.server).max(0.0));
    let [idle_cpu, loaded_cpu] = &run.window.server_cpu;
    let disturbed = [others(idle_cpu), others(loaded_cpu)].into_iter().flatten().any(|o| o > DISTURBED_CORES);
    for (when, share) in [("idle", idle_cpu), ("loaded", loaded_cpu)] {
        if let Some(s) = share {
            notes += &format!(
                "; the server's CPUs {when}: busy {:.2} cores, {:.2} of them the server's, {:.2} other processes'",
                s.busy,
                s.server,
                (s.busy - s.server).max(0.0)
            );
        }
    }
    let client = match &run.window.priority {
        None => "the client on a thread of its own at nice -20 on the bench's CPUs, idle and loaded".to_string(),
        Some(why) => format!("the client on a thread of its own on the bench's CPUs, {why}"),
    };
    row.notes = format!("{notes}; {client}; loaded: {}; {placement}", row.notes);
    row.target = match run.limit {
        Limit::On => format!(
            "p99 < 5x idle: {}{}",
            met(ratio.is_some_and(|r| r < 5.0) && loaded.stats.errors == 0),
            if disturbed { " (disturbed: other processes ran on the server's CPUs, see notes)" } else { "" }
        ),
        _ => "reference, not judged".into(),
    };
    row
}

fn migration_row(n: u64, run: &Run) -> Row {
    let scenario = format!(
        "storage-version migration of {} ShootStates by the embedded scheduler during the overload: {}",
        thousands(n as f64),
        run.limit.label()
    );
    let m = match &run.migration {
        Ok(m) => m,
        Err(e) => {
            let e = e.replace('|', "\\|").replace('\n', " ");
            return Row { scenario, notes: format!("failed: {e}"), ..Row::default() };
        }
    };
    let migrated = m.done.migrated == n;
    let rose = m.at_end.migrated > m.at_start.migrated || (m.at_end.succeeded && !m.at_start.succeeded);
    let mut notes = format!(
        "migratedObjects {} when the overload began, {} when the masters' window ended {:.1} s later (saved every \
         2 s){}; Succeeded {:.1} s after it was created, {} objects",
        thousands(m.at_start.migrated as f64),
        thousands(m.at_end.migrated as f64),
        m.window.as_secs_f64(),
        if m.at_end.succeeded { ", Succeeded by then" } else { "" },
        m.took.as_secs_f64(),
        thousands(m.done.migrated as f64),
    );
    if m.at_start.succeeded {
        notes += "; it had Succeeded before the overload began (too few objects to overlap)";
    }
    if !migrated {
        notes += &format!(" (expected {n})");
    }
    let target = match run.limit {
        Limit::On => format!("progresses during the overload and Succeeds: {}", met(rose && migrated)),
        _ => "reference, not judged".into(),
    };
    Row { scenario, target, notes, ..Row::default() }
}

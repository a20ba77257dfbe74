//! /proc readings and CPU affinity.

use anyhow::bail;
use std::sync::Arc;
use std::time::Duration;

// /proc readings.

pub(super) fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident set size.
pub(super) fn hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Resets the peak resident set size (VmHWM) of `pid` to its current one (`echo 5 > /proc/<pid>/clear_refs`).
pub(super) fn reset_hwm(pid: u32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

pub(super) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    proc_status(pid, field)?.trim_end_matches("kB").trim().parse().ok()
}

/// The value of `field` (with its colon) in `/proc/<pid>/status`, trimmed.
pub(super) fn proc_status(pid: u32, field: &str) -> Option<String> {
    status_value(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, field).map(str::to_owned)
}

/// The value of `field` (with its colon) in the text of a `/proc/<pid>/status`, trimmed.
pub(super) fn status_value<'s>(status: &'s str, field: &str) -> Option<&'s str> {
    status.lines().find_map(|l| l.strip_prefix(field)).map(str::trim)
}

/// Cores used between two `cpu_ticks` readings `elapsed` apart.
pub(super) fn cores(before: Option<u64>, after: Option<u64>, elapsed: Duration) -> String {
    match (before, after) {
        (Some(a), Some(b)) => format!("{:.2}", b.saturating_sub(a) as f64 / (elapsed.as_secs_f64() * 100.0)),
        _ => "?".into(),
    }
}

/// utime + stime of a process, in clock ticks.
pub(super) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Busy (not idle, not iowait) and stolen ticks of the whole machine: load from other processes, and from
/// other guests of the host when this is a VM.
pub(super) fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let t: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    Some((t.iter().take(8).sum::<u64>() - t.get(3)? - t.get(4)?, *t.get(7)?))
}

/// CPU time of the server, of the bench, and busy/stolen time of the whole machine at one instant.
pub(super) struct CpuTicks([Option<u64>; 4]);

impl CpuTicks {
    pub(super) fn now(server: Option<u32>) -> CpuTicks {
        let machine = machine_ticks();
        CpuTicks([
            server.and_then(cpu_ticks),
            cpu_ticks(std::process::id()),
            machine.map(|m| m.0),
            machine.map(|m| m.1),
        ])
    }

    /// Cores used since `self`: `/proc` counts USER_HZ = 100 ticks per second.
    pub(super) fn usage_since(&self, server: Option<u32>, elapsed: Duration) -> String {
        let now = CpuTicks::now(server);
        let c: Vec<String> = (0..4).map(|i| cores(self.0[i], now.0[i], elapsed)).collect();
        format!("CPU cores used: server {}, bench {}, whole machine {} (stolen {})", c[0], c[1], c[2], c[3])
    }
}

// CPU affinity, to give the server and the bench separate CPUs (admission rows, the load group's overload rows).

/// The CPUs the calling thread may run on, in order.
pub(super) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a cpu_set_t is a plain bit array, valid all zero; the kernel writes at most the size it is given.
    let mut set = unsafe { std::mem::zeroed::<libc::cpu_set_t>() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: every index is below CPU_SETSIZE, the number of bits in the set.
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// Restricts the calling thread, and the threads and processes it starts from now on, to `cpus`.
pub(super) fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as in `allowed_cpus`; indexes at or above CPU_SETSIZE are refused before CPU_SET.
    let mut set = unsafe { std::mem::zeroed::<libc::cpu_set_t>() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!("CPU {cpu} is beyond the affinity mask")));
        }
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `cpus` in two: the first half (rounded up) for the server, the rest for the bench; `None` below 2 CPUs.
pub(super) fn split_cpus(mut cpus: Vec<usize>) -> Option<(Vec<usize>, Vec<usize>)> {
    if cpus.len() < 2 {
        return None;
    }
    let bench = cpus.split_off(cpus.len().div_ceil(2));
    Some((cpus, bench))
}

/// What a tokio runtime sized by default has on `cpus` CPUs.
pub(super) fn workers(cpus: usize) -> String {
    format!("{cpus} worker thread{}", if cpus == 1 { "" } else { "s" })
}

pub(super) fn cpu_list(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    format!("CPU{} {}", if cpus.len() == 1 { "" } else { "s" }, list.join(","))
}

/// Runs `load` to the end on a runtime of its own, with one worker thread per CPU of `cpus` and every thread
/// restricted to them.
pub(super) async fn on_cpus<F>(cpus: &[usize], load: F) -> anyhow::Result<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let failed = Arc::new(std::sync::Mutex::new(None));
    let (pinned, failure) = (cpus.to_vec(), failed.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cpus.len())
        .enable_all()
        .on_thread_start(move || {
            if let Err(e) = pin_current_thread(&pinned) {
                failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e.to_string());
            }
        })
        .build()?;
    let handle = runtime.handle().clone();
    let runtime = ShutDownOnDrop(Some(runtime));
    let output = handle.spawn(load).await;
    drop(runtime);
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        bail!("restricting the bench to {}: {e}", cpu_list(cpus));
    }
    Ok(output?)
}

/// Shuts its runtime down without waiting when dropped: dropping a runtime inside another one panics, and Ctrl-C
/// drops the bench's future with the runtime of [`on_cpus`] in it.
pub(super) struct ShutDownOnDrop(Option<tokio::runtime::Runtime>);

impl Drop for ShutDownOnDrop {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The CPUs process `pid` may run on, from `Cpus_allowed_list` in its `/proc` status.
pub(super) fn cpus_allowed(pid: u32) -> Option<Vec<usize>> {
    parse_cpu_list(&proc_status(pid, "Cpus_allowed_list:")?)
}

/// A kernel CPU list: `0-2,5` is CPUs 0, 1, 2 and 5.
pub(super) fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
        if last < first || last >= libc::CPU_SETSIZE as usize {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

pub(super) fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_string()));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: Option<u64> =
        meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().trim_end_matches("kB").trim().parse().ok());
    format!(
        "Machine: {} CPUs ({}), {:.1} GiB memory; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        model.unwrap_or_else(|| "unknown model".into()),
        mem_kib.unwrap_or(0) as f64 / (1024.0 * 1024.0),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
    )
}

//! The results table.

use std::time::Duration;

// Table helpers.

#[derive(Default)]
pub(super) struct Row {
    pub(super) scenario: String,
    pub(super) rps: String,
    pub(super) p50: String,
    pub(super) p99: String,
    pub(super) target: String,
    pub(super) notes: String,
    /// Requests/s, p50 ms and p99 ms as numbers, for ratios between rows (p50 only where a ratio needs it).
    pub(super) rps_v: Option<f64>,
    pub(super) p50_v: Option<f64>,
    pub(super) p99_v: Option<f64>,
    /// The scenario of the row this one is paired with (printed right after it).
    pub(super) pair: Option<String>,
    /// The target of a paired row: its requests/s at least this fraction of its pair's.
    pub(super) pair_goal: Option<f64>,
}

impl Row {
    pub(super) fn failed(scenario: String, e: anyhow::Error) -> Row {
        Row { scenario, notes: format!("failed: {e:#}"), ..Row::default() }
    }
}

pub(super) enum Goal {
    MinRps(f64),
    MaxP99Ms(f64),
    MaxMib(f64),
    /// A ratio between two figures of the same run: at most, or at least, this.
    MaxRatio(f64),
    MinRatio(f64),
    None,
}

impl Goal {
    /// The target, and whether `value` (requests/s, p99 ms, MiB or a ratio) meets it.
    pub(super) fn show(&self, value: Option<f64>) -> String {
        let (text, met) = match *self {
            Goal::MinRps(t) => (format!(">= {}/s", thousands(t)), value.map(|v| v >= t)),
            Goal::MaxP99Ms(t) => (format!("p99 <= {t} ms"), value.map(|v| v <= t)),
            Goal::MaxMib(t) => (format!("<= {t} MiB"), value.map(|v| v <= t)),
            Goal::MaxRatio(t) => (format!("within {:.0}% (<= x{t:.2})", (t - 1.0) * 100.0), value.map(|v| v <= t)),
            Goal::MinRatio(t) => (format!(">= {:.0}% (x{t:.2})", t * 100.0), value.map(|v| v >= t)),
            Goal::None => return String::new(),
        };
        match met {
            Some(true) => format!("{text}: met"),
            Some(false) => format!("{text}: **missed**"),
            None => text,
        }
    }
}

pub(super) fn sorted(samples: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = samples.collect();
    v.sort_unstable();
    v
}

pub(super) fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Nearest-rank percentile of sorted microsecond samples, in ms.
pub(super) fn pct_f(sorted: &[u32], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).map_or(f64::NAN, |&us| us as f64 / 1000.0)
}

pub(super) fn pct(sorted: &[u32], p: f64) -> String {
    if sorted.is_empty() {
        return String::new();
    }
    let ms = pct_f(sorted, p);
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

pub(super) fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(super) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

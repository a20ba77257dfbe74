//! A cheap running histogram of request latencies, for feedback rather than for Prometheus: the HTTP layer counts
//! the latency of every request of the server's *other* clients (not the scheduler's in-process requests) into one,
//! and the migrator's adaptive rate ([`crate::scheduler::adaptive`]) counts its own requests to the target into
//! another; a reader takes a snapshot now and then and reads a percentile of what was counted since the previous one.
//!
//! `apiserver_request_duration_seconds` has the same data, but split by a dozen labels under a lock (reading it means
//! walking every series) and with kube-apiserver's coarse buckets (5 ms, then 25 ms): a GET that takes 0.3 ms idle
//! and 0.9 ms under load is in the first bucket either way. Here one observation is one relaxed atomic increment in
//! one of [`BUCKETS`] log-spaced buckets, four per octave (each about 19% wide) from 8 µs up to about 8 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets: four an octave from [`FIRST`], 20 octaves (8 µs .. 8.4 s); slower requests count in the last one.
pub const BUCKETS: usize = 80;
/// The upper bound of the first bucket, in microseconds.
const FIRST: f64 = 8.0;
const PER_OCTAVE: f64 = 4.0;

/// Latencies counted since the start (monotonic counters; read with [`LatencyHistogram::snapshot`]).
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { buckets: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

/// The bucket of a latency: the first whose upper bound is at least `d`.
fn bucket(d: Duration) -> usize {
    let micros = d.as_secs_f64() * 1e6;
    if micros <= FIRST {
        return 0;
    }
    // Less a hair, so that a bound that went through Duration's nanoseconds stays in its bucket.
    let i = ((micros / FIRST).log2() * PER_OCTAVE - 1e-3).ceil();
    (i as usize).min(BUCKETS - 1)
}

/// The upper bound of bucket `i`.
fn upper_bound(i: usize) -> Duration {
    Duration::from_secs_f64(FIRST * (i as f64 / PER_OCTAVE).exp2() / 1e6)
}

impl LatencyHistogram {
    pub fn observe(&self, d: Duration) {
        self.buckets[bucket(d)].fetch_add(1, Ordering::Relaxed);
    }

    /// Everything counted so far.
    pub fn snapshot(&self) -> Counts {
        Counts(std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)))
    }
}

/// Counts per bucket: a snapshot, or the difference of two ([`Counts::since`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts([u64; BUCKETS]);

impl Default for Counts {
    fn default() -> Self {
        Counts([0; BUCKETS])
    }
}

impl Counts {
    /// What was counted between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i].saturating_sub(earlier.0[i])))
    }

    /// Both counted together.
    pub fn add(&self, other: &Counts) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i].saturating_add(other.0[i])))
    }

    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The `q` quantile (0 < q <= 1), as the upper bound of its bucket (at most 19% high); None without any count.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.0.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(upper_bound(i));
            }
        }
        Some(upper_bound(BUCKETS - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_spaced_and_bounded() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_micros(8)), 0);
        assert_eq!(bucket(Duration::from_micros(16)), 4);
        assert_eq!(bucket(Duration::from_micros(17)), 5);
        assert_eq!(bucket(Duration::from_secs(3600)), BUCKETS - 1);
        for i in 0..BUCKETS {
            // A latency at a bucket's upper bound counts in that bucket.
            assert_eq!(bucket(upper_bound(i)), i, "{i}");
        }
    }

    #[test]
    fn quantiles_of_what_was_counted_since() {
        let h = LatencyHistogram::default();
        for _ in 0..50 {
            h.observe(Duration::from_micros(100));
        }
        let before = h.snapshot();
        for _ in 0..90 {
            h.observe(Duration::from_micros(300));
        }
        for _ in 0..10 {
            h.observe(Duration::from_millis(5));
        }
        let window = h.snapshot().since(&before);
        assert_eq!(window.count(), 100);
        let p50 = window.quantile(0.5).unwrap();
        assert!(p50 >= Duration::from_micros(300) && p50 < Duration::from_micros(360), "{p50:?}");
        let p90 = window.quantile(0.9).unwrap();
        assert!(p90 < Duration::from_micros(360), "{p90:?}");
        let p99 = window.quantile(0.99).unwrap();
        assert!(p99 >= Duration::from_millis(5) && p99 < Duration::from_micros(6000), "{p99:?}");
        assert_eq!(Counts::default().quantile(0.5), None);
    }
}

//! The migrator's global token bucket: `qps` tokens per second, at most `burst` saved up, one token per request to
//! the target (LISTs, writes and every retry), shared by all migrations.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket handing out reservations, like Go's `rate.Limiter.Wait`: a caller takes a token now, possibly
/// going into debt, and waits until the debt would have been paid off. Callers are served in arrival order and
/// over any interval `t` at most `burst + qps * t` requests start.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Tokens available at `at`; negative while reservations are outstanding.
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `qps` 0 (or not finite and positive) means unlimited; `burst` is at least 1.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            qps: if qps.is_finite() && qps > 0.0 { qps } else { 0.0 },
            burst,
            state: Mutex::new(Bucket { tokens: burst, at: Instant::now() }),
        }
    }

    pub fn unlimited(&self) -> bool {
        self.qps == 0.0
    }

    /// Takes one token at `now`; returns how long the caller must wait before sending its request.
    pub fn reserve_at(&self, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        let mut b = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Time never runs backwards for the bucket (callers may pass slightly older instants).
        let now = now.max(b.at);
        let elapsed = now.duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.qps).min(self.burst);
        b.at = now;
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve_at(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start times a limiter hands out for `n` callers arriving at `arrivals`.
    fn grants(l: &RateLimiter, arrivals: &[Instant]) -> Vec<Instant> {
        arrivals.iter().map(|a| *a + l.reserve_at(*a)).collect()
    }

    fn max_in_any_window(starts: &[Instant], qps: f64, burst: f64) -> f64 {
        let mut worst = f64::MIN;
        for i in 0..starts.len() {
            for j in i..starts.len() {
                let t = starts[j].duration_since(starts[i]).as_secs_f64();
                worst = worst.max((j - i + 1) as f64 - (burst + qps * t));
            }
        }
        worst
    }

    #[test]
    fn burst_then_steady_rate() {
        let l = RateLimiter::new(20.0, 5);
        let t0 = Instant::now();
        // 45 callers at once: 5 go now, the other 40 every 50 ms.
        let starts = grants(&l, &[t0; 45]);
        for s in &starts[..5] {
            assert_eq!(*s, t0);
        }
        for (k, s) in starts[5..].iter().enumerate() {
            let expected = Duration::from_secs_f64((k + 1) as f64 / 20.0);
            let got = s.duration_since(t0);
            assert!(got.abs_diff(expected) < Duration::from_micros(10), "{k}: {got:?} vs {expected:?}");
        }
        assert!(max_in_any_window(&starts, 20.0, 5.0) <= 1e-6);
    }

    #[test]
    fn idle_time_refills_up_to_burst_only() {
        let l = RateLimiter::new(10.0, 3);
        let t0 = Instant::now();
        assert_eq!(l.reserve_at(t0), Duration::ZERO);
        // An hour idle saves up 3 tokens, not 36,000.
        let t1 = t0 + Duration::from_secs(3600);
        let starts = grants(&l, &[t1; 5]);
        assert_eq!(starts[..3], [t1, t1, t1]);
        assert_eq!(starts[3].duration_since(t1), Duration::from_millis(100));
        assert_eq!(starts[4].duration_since(t1), Duration::from_millis(200));
    }

    #[test]
    fn random_arrivals_never_exceed_the_bound() {
        let l = RateLimiter::new(50.0, 4);
        let t0 = Instant::now();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut at = t0;
        let mut arrivals = Vec::new();
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            at += Duration::from_micros(x % 40_000);
            arrivals.push(at);
        }
        let starts = grants(&l, &arrivals);
        assert!(max_in_any_window(&starts, 50.0, 4.0) <= 1e-6);
        for (a, s) in arrivals.iter().zip(&starts) {
            assert!(s >= a);
        }
    }

    #[test]
    fn zero_qps_is_unlimited() {
        let l = RateLimiter::new(0.0, 1);
        assert!(l.unlimited());
        let t0 = Instant::now();
        assert!(grants(&l, &[t0; 1000]).iter().all(|s| *s == t0));
    }
}

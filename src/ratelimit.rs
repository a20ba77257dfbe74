//! The one token bucket: `qps` tokens per second, at most `burst` saved up. The migrator's, one token per request
//! to the target (LISTs, writes and every retry) shared by all migrations, whose adaptive rate moves `qps` while
//! requests wait and holds every request back while the target asked for a pause (Retry-After); and the audit
//! backends' batch throttle (client-go's token bucket), taken from their batch threads.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket. Waiters queue in arrival order (a fair async mutex) and the one at the head takes a token only
/// when one is really there at the moment it proceeds: a waiter that wakes late (a busy machine, a stalled process)
/// finds at most `burst` saved up, never the tokens of its whole wait. So over any interval `t`, at most
/// `burst + qps * t` requests proceed, however the process is scheduled.
#[derive(Debug)]
pub struct RateLimiter {
    burst: f64,
    queue: tokio::sync::Mutex<()>,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Tokens per second; 0 is unlimited.
    qps: f64,
    /// Tokens available at `at`.
    tokens: f64,
    at: Instant,
    /// No token before this instant.
    paused_until: Option<Instant>,
}

/// Rounding slack: after sleeping exactly the computed wait, a token counts as there.
const EPSILON: f64 = 1e-9;

impl RateLimiter {
    /// `qps` 0 (or not finite and positive) means unlimited; `burst` is at least 1.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            burst,
            queue: tokio::sync::Mutex::new(()),
            state: Mutex::new(Bucket { qps: valid(qps), tokens: burst, at: Instant::now(), paused_until: None }),
        }
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn unlimited(&self) -> bool {
        self.qps() == 0.0
    }

    pub fn qps(&self) -> f64 {
        self.bucket().qps
    }

    /// A new rate from `now` on: the tokens saved up so far were earned at the old one.
    pub fn set_qps_at(&self, qps: f64, now: Instant) {
        let mut b = self.bucket();
        let now = now.max(b.at);
        if b.qps > 0.0 {
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * b.qps).min(self.burst);
        }
        b.at = now;
        b.qps = valid(qps);
    }

    /// No token until `until` (a later pause extends it, an earlier one does not shorten it), and none saved up
    /// meanwhile: after a pause the requests resume at the rate, not in a burst.
    pub fn pause_until(&self, until: Instant) {
        let mut b = self.bucket();
        b.paused_until = Some(b.paused_until.map_or(until, |p| p.max(until)));
    }

    /// Takes a token at `now` if there is one (None), else says how long until there is.
    pub fn try_take_at(&self, now: Instant) -> Option<Duration> {
        let mut b = self.bucket();
        if let Some(until) = b.paused_until {
            if now < until {
                return Some(until - now);
            }
            b.paused_until = None;
            b.tokens = b.tokens.min(1.0);
            b.at = until.max(b.at);
        }
        if b.qps == 0.0 {
            return None;
        }
        // Time never runs backwards for the bucket (callers may pass slightly older instants).
        let now = now.max(b.at);
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * b.qps).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 - EPSILON {
            b.tokens = (b.tokens - 1.0).max(0.0);
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - b.tokens) / b.qps))
        }
    }

    /// Waits for a token on a thread of its own (the audit backends' batch thread), which is the only taker.
    pub fn acquire_blocking(&self) {
        while let Some(wait) = self.try_take_at(Instant::now()) {
            std::thread::sleep(wait);
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let free = {
            let b = self.bucket();
            b.qps == 0.0 && b.paused_until.is_none()
        };
        if free {
            return;
        }
        let _turn = self.queue.lock().await;
        while let Some(wait) = self.try_take_at(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
}

fn valid(qps: f64) -> f64 {
    if qps.is_finite() && qps > 0.0 {
        qps
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The times at which callers arriving at `arrivals` (sorted) get their tokens, served in order, each waking
    /// `late` after the wait it was told (a busy machine).
    fn grants_late(l: &RateLimiter, arrivals: &[Instant], late: Duration) -> Vec<Instant> {
        let mut out: Vec<Instant> = Vec::new();
        for a in arrivals {
            let mut t = out.last().map_or(*a, |prev| (*a).max(*prev));
            while let Some(wait) = l.try_take_at(t) {
                t += wait + late;
            }
            out.push(t);
        }
        out
    }

    fn grants(l: &RateLimiter, arrivals: &[Instant]) -> Vec<Instant> {
        grants_late(l, arrivals, Duration::ZERO)
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
        assert_eq!(l.try_take_at(t0), None);
        // An hour idle saves up 3 tokens, not 36,000.
        let t1 = t0 + Duration::from_secs(3600);
        let starts = grants(&l, &[t1; 5]);
        assert_eq!(starts[..3], [t1, t1, t1]);
        for (k, ms) in [(3, 100), (4, 200)] {
            let got = starts[k].duration_since(t1);
            assert!(got.abs_diff(Duration::from_millis(ms)) < Duration::from_micros(10), "{k}: {got:?}");
        }
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
    fn late_wakeups_never_release_more_than_a_burst() {
        let l = RateLimiter::new(20.0, 5);
        let t0 = Instant::now();
        // Every waiter wakes 120 ms late (2.4 tokens' worth): requests bunch up, but never beyond the bound.
        let starts = grants_late(&l, &[t0; 100], Duration::from_millis(120));
        assert!(max_in_any_window(&starts, 20.0, 5.0) <= 1e-6);
        // ... and the rate over the run is still about qps.
        let secs = starts[99].duration_since(t0).as_secs_f64();
        assert!(secs >= (100.0 - 5.0) / 20.0 - 1e-6, "{secs}");
    }

    #[test]
    fn a_new_rate_applies_from_its_instant() {
        let l = RateLimiter::new(10.0, 1);
        let t0 = Instant::now();
        assert_eq!(l.try_take_at(t0), None);
        // Half a token earned at 10/s, then 100/s: the other half takes 5 ms.
        let t1 = t0 + Duration::from_millis(50);
        l.set_qps_at(100.0, t1);
        let wait = l.try_take_at(t1).expect("half a token");
        assert!(wait.abs_diff(Duration::from_millis(5)) < Duration::from_micros(10), "{wait:?}");
        assert_eq!(l.qps(), 100.0);
    }

    #[test]
    fn a_pause_holds_every_token_then_resumes_without_a_burst() {
        let l = RateLimiter::new(100.0, 50);
        let t0 = Instant::now();
        l.pause_until(t0 + Duration::from_secs(2));
        // An earlier pause does not shorten it.
        l.pause_until(t0 + Duration::from_secs(1));
        assert_eq!(l.try_take_at(t0 + Duration::from_millis(500)), Some(Duration::from_millis(1500)));
        // Two seconds at 100/s with a burst of 50 would have saved 50 tokens; the pause saved none.
        let starts = grants(&l, &[t0 + Duration::from_secs(2); 3]);
        let after: Vec<_> = starts.iter().map(|s| s.duration_since(t0 + Duration::from_secs(2))).collect();
        assert!(after[0] < Duration::from_micros(10), "{after:?}");
        assert!(after[2].abs_diff(Duration::from_millis(20)) < Duration::from_micros(10), "{after:?}");
    }

    #[test]
    fn zero_qps_is_unlimited() {
        let l = RateLimiter::new(0.0, 1);
        assert!(l.unlimited());
        let t0 = Instant::now();
        assert!(grants(&l, &[t0; 1000]).iter().all(|s| *s == t0));
    }
}

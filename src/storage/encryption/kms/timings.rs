//! The intervals of a KMS v2 provider: kube-apiserver's (k8s.io/apiserver `pkg/server/options/encryptionconfig/
//! config.go`), or, for tests only, shorter ones from `MIGRATION_APISERVER_KMS_TEST_TIMINGS`, so that a test sees
//! a write expiry or a recovery in seconds instead of minutes. Production never sets it; a value that does not parse
//! is refused at start rather than ignored.

use std::time::Duration;

/// The environment variable of the test-only timings: `poll=1s,retry=200ms,write-ttl=5s,healthy-cache=1s,
/// failed-cache=1s` (any subset; Go durations).
pub const TEST_TIMINGS_ENV: &str = "MIGRATION_APISERVER_KMS_TEST_TIMINGS";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Status every minute while healthy (`kmsv2PluginHealthzPositiveInterval`).
    pub poll: Duration,
    /// Every 10 s after a failure, until one succeeds (`kmsv2PluginHealthzNegativeInterval`).
    pub retry: Duration,
    /// Writes go on this long after the last Status with a valid key_id (`kmsv2PluginWriteDEKSourceMaxTTL`).
    pub write_ttl: Duration,
    /// A health request within this long of the last successful probe gets its result (`kmsPluginHealthzPositiveTTL`).
    pub healthy_cache: Duration,
    /// ... and of the last failed one (`kmsPluginHealthzNegativeTTL`).
    pub failed_cache: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            poll: Duration::from_secs(60),
            retry: Duration::from_secs(10),
            write_ttl: Duration::from_secs(180),
            healthy_cache: Duration::from_secs(20),
            failed_cache: Duration::from_secs(3),
        }
    }
}

impl Timings {
    /// kube-apiserver's, or the test overrides of [`TEST_TIMINGS_ENV`].
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(TEST_TIMINGS_ENV) {
            Ok(v) => Self::parse(&v),
            Err(_) => Ok(Self::default()),
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        let mut t = Self::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) =
                item.split_once('=').ok_or_else(|| format!("{TEST_TIMINGS_ENV}: {item:?} is not name=duration"))?;
            let d = crate::duration::parse_duration(value)
                .map_err(|e| format!("{TEST_TIMINGS_ENV}: {name}: {e}"))
                .and_then(|d| match d.is_zero() {
                    true => Err(format!("{TEST_TIMINGS_ENV}: {name} must be positive")),
                    false => Ok(d),
                })?;
            match name {
                "poll" => t.poll = d,
                "retry" => t.retry = d,
                "write-ttl" => t.write_ttl = d,
                "healthy-cache" => t.healthy_cache = d,
                "failed-cache" => t.failed_cache = d,
                other => return Err(format!("{TEST_TIMINGS_ENV}: unknown timing {other:?}")),
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_and_bad_ones_are_refused() {
        let t = Timings::parse("poll=1s, write-ttl=5s").expect("parse");
        assert_eq!(t.poll, Duration::from_secs(1));
        assert_eq!(t.write_ttl, Duration::from_secs(5));
        assert_eq!(t.retry, Timings::default().retry);
        assert!(Timings::parse("poll").is_err());
        assert!(Timings::parse("poll=0s").is_err());
        assert!(Timings::parse("nap=1s").is_err());
    }
}

//! A bounded cache with per-entry expiry, for delegated authentication and authorization decisions
//! (kube-apiserver's webhook token authenticator and authorizer cache theirs for about 10 s too): moka's, with each
//! entry's time to live given when it is stored (allowed and denied decisions live for different times).

use moka::sync::Cache;
use moka::Expiry;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Entries expire `ttl` after insertion; at most `capacity` entries are kept, so a flood of distinct keys cannot
/// grow memory.
pub struct TtlCache<K, V> {
    entries: Cache<K, (V, Duration)>,
}

impl<K, V> std::fmt::Debug for TtlCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtlCache").finish_non_exhaustive()
    }
}

/// Each entry lives for the duration stored with it.
struct StoredTtl;

impl<K, V> Expiry<K, (V, Duration)> for StoredTtl {
    fn expire_after_create(&self, _: &K, value: &(V, Duration), _: Instant) -> Option<Duration> {
        Some(value.1)
    }
    fn expire_after_update(&self, _: &K, value: &(V, Duration), _: Instant, _: Option<Duration>) -> Option<Duration> {
        Some(value.1)
    }
}

impl<K, V> TtlCache<K, V>
where
    K: Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub fn new(capacity: usize) -> Self {
        TtlCache { entries: Cache::builder().max_capacity(capacity.max(1) as u64).expire_after(StoredTtl).build() }
    }

    /// The value of `key`, unless absent or expired.
    pub fn get(&self, key: &K) -> Option<V> {
        self.entries.get(key).map(|(v, _)| v)
    }

    /// Stores `value` for `ttl` (a zero ttl stores nothing).
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        if !ttl.is_zero() {
            self.entries.insert(key, (value, ttl));
        }
    }

    pub fn clear(&self) {
        self.entries.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_and_bound() {
        let cache = TtlCache::new(3);
        cache.insert(1, "a", Duration::from_secs(60));
        cache.insert(2, "b", Duration::from_nanos(1));
        cache.insert(4, "zero", Duration::ZERO);
        assert_eq!(cache.get(&1), Some("a"));
        // Expired entries are never returned, whenever they are evicted.
        let deadline = Instant::now() + Duration::from_secs(10);
        while cache.get(&2).is_some() {
            assert!(Instant::now() < deadline, "an entry outlived its time to live");
            std::thread::yield_now();
        }
        assert_eq!(cache.get(&4), None, "zero ttl is not stored");
        for k in 10..1000 {
            cache.insert(k, "x", Duration::from_secs(60));
        }
        cache.entries.run_pending_tasks();
        assert!(cache.entries.entry_count() <= 3, "{}", cache.entries.entry_count());
        // Replacing a value takes the new one.
        cache.insert(1, "a2", Duration::from_secs(60));
        assert_eq!(cache.get(&1), Some("a2"));
        cache.clear();
        cache.entries.run_pending_tasks();
        assert_eq!(cache.entries.entry_count(), 0);
    }
}

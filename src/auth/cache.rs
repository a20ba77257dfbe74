//! A small bounded cache with per-entry expiry, for delegated authentication and authorization decisions
//! (kube-apiserver's webhook token authenticator and authorizer cache theirs for about 10 s too).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Entries expire `ttl` after insertion; at most `capacity` entries are kept. When full, expired entries are dropped
/// first, then the entry closest to expiry, so a flood of distinct keys cannot grow memory.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    capacity: usize,
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        TtlCache { capacity: capacity.max(1), entries: Mutex::new(HashMap::new()) }
    }

    /// The value of `key`, unless absent or expired.
    pub fn get(&self, key: &K) -> Option<V> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(key) {
            Some((expires, value)) if *expires > Instant::now() => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` for `ttl` (a zero ttl stores nothing).
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= self.capacity {
                let oldest = entries.iter().min_by_key(|(_, (expires, _))| *expires).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    entries.remove(&k);
                }
            }
        }
        entries.insert(key, (now + ttl, value));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_and_bound() {
        let cache = TtlCache::new(3);
        cache.insert(1, "a", Duration::from_secs(60));
        cache.insert(2, "b", Duration::from_millis(1));
        cache.insert(3, "c", Duration::from_secs(30));
        cache.insert(4, "zero", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(cache.get(&1), Some("a"));
        assert_eq!(cache.get(&2), None, "expired");
        assert_eq!(cache.get(&4), None, "zero ttl is not stored");
        cache.insert(5, "d", Duration::from_secs(60));
        cache.insert(6, "e", Duration::from_secs(60));
        assert!(cache.len() <= 3);
        // The entry closest to expiry (3) made room.
        assert_eq!(cache.get(&3), None);
        assert_eq!((cache.get(&1), cache.get(&5), cache.get(&6)), (Some("a"), Some("d"), Some("e")));
        // Replacing an existing key never evicts another.
        cache.insert(1, "a2", Duration::from_secs(60));
        assert_eq!((cache.get(&1), cache.get(&5), cache.get(&6)), (Some("a2"), Some("d"), Some("e")));
        cache.clear();
        assert!(cache.is_empty());
    }
}

//! Read snapshots of the embedded store pinned for chunked lists, so that a continue page costs the same whatever
//! the store's size and however many writes happened since the first page.
//!
//! A redb read transaction is a consistent snapshot for as long as it lives. The first page of a chunked list
//! (one that has more to come) pins the table it read, under its revision; continue pages at that revision read
//! the same snapshot instead of rolling the current state back through the watch history (whose cost grows with
//! the writes since the first page, and which ends in 410 once they fall out of the history).
//!
//! Pinning has a price: pages that later commits free cannot be reused while a snapshot still sees them, so the
//! file grows by what is written meanwhile (as etcd keeps every revision until its next compaction). Snapshots are
//! therefore bounded: dropped an idle timeout after their last page (`--list-snapshot-timeout`, default
//! [`DEFAULT_IDLE`]; zero pins nothing), [`MAX_AGE`] after the first (etcd's default compaction interval, which bounds
//! kube-apiserver's continue tokens; longer only if the idle timeout is), and at most [`MAX_PINNED`] at once (the
//! least recently used goes). A continue token whose snapshot is gone falls back to the history, then to 410 with
//! an inconsistent continuation, as before.
//!
//! Each snapshot also remembers, for every page it served, how many keys under the page's prefix follow the
//! page's last key: the next page then knows its `remaining` (remainingItemCount) without counting the rest of
//! the collection. (The first page takes it from the per-prefix counts, `counts`.)

use super::Revision;
use redb::ReadOnlyTable;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a snapshot outlives its last page, by default.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);
/// How long a snapshot lives at most.
pub const MAX_AGE: Duration = Duration::from_secs(300);
/// How many snapshots may be pinned at once.
pub const MAX_PINNED: usize = 64;

/// The tables of one read transaction (which stays open, a snapshot, as long as they live).
pub struct Tables {
    pub objects: ReadOnlyTable<&'static str, &'static [u8]>,
    pub counts: ReadOnlyTable<&'static str, u64>,
}

/// One pinned snapshot.
struct Pinned {
    tables: Arc<Tables>,
    opened: Instant,
    used: Instant,
    /// (prefix, last key of a served page) -> keys under the prefix after it.
    remaining: HashMap<(String, String), u64>,
}

/// The snapshots pinned by chunked lists, by revision.
pub struct Snapshots {
    pinned: Mutex<HashMap<Revision, Pinned>>,
    idle: Duration,
    max_age: Duration,
}

/// A pinned snapshot handed to a continue page.
pub struct Snapshot {
    pub tables: Arc<Tables>,
    /// The keys under the page's prefix after its start position, when a page before it counted them.
    pub remaining_after_start: Option<u64>,
}

impl Snapshots {
    /// Snapshots kept `idle` after their last page (none at all when zero).
    pub fn new(idle: Duration) -> Self {
        Self { pinned: Mutex::default(), idle, max_age: MAX_AGE.max(idle) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Revision, Pinned>> {
        // Nothing under this lock panics; a poisoned map is still a valid map.
        self.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The snapshot at `revision` for a page of `prefix` after `start_after`, if it is still pinned.
    pub fn get(&self, revision: Revision, prefix: &str, start_after: Option<&str>) -> Option<Snapshot> {
        let mut pinned = self.lock();
        let now = Instant::now();
        let p = pinned.get_mut(&revision).filter(|p| self.live(p, now))?;
        p.used = now;
        let remaining_after_start =
            start_after.and_then(|s| p.remaining.get(&(prefix.to_owned(), s.to_owned())).copied());
        Some(Snapshot { tables: p.tables.clone(), remaining_after_start })
    }

    /// Pins `tables` (read at `revision`) after it served a page of `prefix` ending at `last_key` with `remaining`
    /// keys after it; a snapshot already pinned at `revision` is kept and only learns the count.
    pub fn pin(&self, revision: Revision, tables: &Arc<Tables>, prefix: &str, last_key: &str, remaining: u64) {
        if self.idle.is_zero() {
            return;
        }
        let mut pinned = self.lock();
        let now = Instant::now();
        pinned.retain(|_, p| self.live(p, now));
        if !pinned.contains_key(&revision) && pinned.len() >= MAX_PINNED {
            if let Some(oldest) = pinned.iter().min_by_key(|(_, p)| p.used).map(|(r, _)| *r) {
                pinned.remove(&oldest);
            }
        }
        let p = pinned.entry(revision).or_insert_with(|| Pinned {
            tables: tables.clone(),
            opened: now,
            used: now,
            remaining: HashMap::new(),
        });
        p.used = now;
        p.remaining.insert((prefix.to_owned(), last_key.to_owned()), remaining);
    }

    /// Drops the snapshots past their time (called after every write batch, so that an abandoned list stops
    /// holding pages back even when no list comes to prune it).
    pub fn prune(&self) {
        let mut pinned = self.lock();
        if !pinned.is_empty() {
            let now = Instant::now();
            pinned.retain(|_, p| self.live(p, now));
        }
    }

    /// Drops every snapshot (shutdown).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn live(&self, p: &Pinned, now: Instant) -> bool {
        now.duration_since(p.used) < self.idle && now.duration_since(p.opened) < self.max_age
    }
}

//! The etcd backend's read metrics: what answered each consistent read, the watch cache or etcd.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// `storage_cache_reads_total`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadLabels {
    /// `get` or `list`.
    operation: &'static str,
    /// `cache` (the watch cache answered) or `etcd` (not ready, lagging, or a read at an older revision).
    source: &'static str,
}

/// Reads by where they were answered; the four series' handles are kept so that counting looks nothing up.
pub(super) struct ReadCounters {
    family: Family<ReadLabels, Counter>,
    pub(super) get_cache: Counter,
    pub(super) get_etcd: Counter,
    pub(super) list_cache: Counter,
    pub(super) list_etcd: Counter,
}

impl ReadCounters {
    pub(super) fn new() -> Self {
        let family = Family::<ReadLabels, Counter>::default();
        let series = |operation, source| family.get_or_create(&ReadLabels { operation, source }).clone();
        let (get_cache, get_etcd) = (series("get", "cache"), series("get", "etcd"));
        let (list_cache, list_etcd) = (series("list", "cache"), series("list", "etcd"));
        Self { family, get_cache, get_etcd, list_cache, list_etcd }
    }

    /// Registers the family as `storage_cache_reads_total{operation, source}`.
    pub(super) fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "storage_cache_reads_total",
            "Consistent reads of the etcd backend by operation (get, list) and by what answered them (cache: the watch cache; etcd: not ready, lagging, or an older revision).",
            self.family.clone(),
        );
    }

    /// Both operations together.
    pub(super) fn totals(&self) -> CacheReads {
        CacheReads {
            cache: self.get_cache.get() + self.list_cache.get(),
            etcd: self.get_etcd.get() + self.list_etcd.get(),
        }
    }
}

/// Reads answered so far by the watch cache and by etcd (GETs and LISTs together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheReads {
    pub cache: u64,
    pub etcd: u64,
}

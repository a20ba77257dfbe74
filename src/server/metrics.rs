//! Prometheus metrics with kube-apiserver's request metric names, labels and HELP (k8s.io/apiserver
//! `pkg/endpoints/metrics/metrics.go`; component-base prefixes the HELP with the stability level), served in the
//! text format 0.0.4 ([`super::exposition`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A label value: mostly static text, so that counting a request allocates nothing.
pub type Label = Cow<'static, str>;

/// `apiserver_request_total`'s labels: the latency labels and the response code (last, as kube-apiserver's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabelSet {
    #[prometheus(flatten)]
    pub request: LatencyLabelSet,
    pub code: Label,
}

/// `apiserver_request_duration_seconds`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabelSet {
    pub verb: Label,
    /// `All` for a dry run, empty otherwise ([`dry_run_label`]).
    pub dry_run: Label,
    pub group: Label,
    pub version: Label,
    pub resource: Label,
    pub subresource: Label,
    pub scope: Label,
    pub component: Label,
}

/// `apiserver_request_terminations_total`'s labels: a request answered by the server in self-defense.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabelSet {
    pub verb: Label,
    pub group: Label,
    pub version: Label,
    pub resource: Label,
    pub subresource: Label,
    pub scope: Label,
    pub component: Label,
    pub code: Label,
}

/// `apiserver_current_inflight_requests`'s label: `readOnly` or `mutating`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestKindLabel {
    pub request_kind: &'static str,
}

fn latency_histogram() -> Histogram {
    // kube-apiserver's request latency buckets (seconds).
    Histogram::new([
        0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0,
        30.0, 45.0, 60.0,
    ])
}

pub struct Metrics {
    /// Tells the request handles of this instance from another's in the per-thread cache ([`Metrics::record`]).
    id: u64,
    pub registry: Mutex<Registry>,
    pub requests: Family<RequestLabelSet, Counter>,
    pub latency: Family<LatencyLabelSet, Histogram, fn() -> Histogram>,
    /// The latency of every request but watches and the scheduler's own, for the migrator's adaptive rate to read
    /// standalone (when this server is its target): how the server's other clients are served.
    pub clients: std::sync::Arc<super::latency::LatencyHistogram>,
    /// Requests rejected above an in-flight limit (429).
    pub terminations: Family<TerminationLabelSet, Counter>,
    /// The most seats of each in-flight limit in use during the last second.
    pub current_inflight: Family<RequestKindLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabelSet, Counter>::default();
        let latency = Family::<LatencyLabelSet, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "apiserver_request_total",
            "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
            latency.clone(),
        );
        let terminations = Family::<TerminationLabelSet, Counter>::default();
        registry.register(
            "apiserver_request_terminations_total",
            "[ALPHA] Number of requests which apiserver terminated in self-defense.",
            terminations.clone(),
        );
        let current_inflight = Family::<RequestKindLabel, Gauge>::default();
        registry.register(
            "apiserver_current_inflight_requests",
            "[STABLE] Maximal number of currently used inflight request limit of this apiserver per request kind in last second.",
            current_inflight.clone(),
        );
        // Both kinds from the start, as kube-apiserver's filter sets both every second.
        for request_kind in ["mutating", "readOnly"] {
            current_inflight.get_or_create(&RequestKindLabel { request_kind }).set(0);
        }
        static IDS: AtomicU64 = AtomicU64::new(0);
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        Metrics {
            id,
            registry: Mutex::new(registry),
            requests,
            latency,
            clients: Default::default(),
            terminations,
            current_inflight,
        }
    }

    /// Counts a request answered with `code` and, unless it is a watch (`elapsed` is `None`), observes its latency.
    ///
    /// Looking a series up in its `Family` hashes every label with SipHash under a lock that all the runtime's
    /// threads share, twice per request: 5% of a small request's time under load. Each thread keeps the handles it
    /// found instead (a handle shares the series' atomic count or histogram), keyed by the labels under a fast
    /// hash: the same series, counted without the shared lookup. The cache is bounded like the label space.
    pub fn record(&self, request: LatencyLabelSet, code: Label, elapsed: Option<Duration>) {
        type Handles = (Counter, Option<Histogram>);
        type Cache = HashMap<(u64, RequestLabelSet), Handles, foldhash::fast::RandomState>;
        const MAX_CACHED: usize = 4096;
        thread_local! {
            static CACHE: RefCell<Cache> = RefCell::default();
        }
        let observe = |(count, latency): &Handles| {
            count.inc();
            if let (Some(histogram), Some(elapsed)) = (latency, elapsed) {
                histogram.observe(elapsed.as_secs_f64());
            }
        };
        let key = (self.id, RequestLabelSet { request, code });
        let lookup = || -> Handles {
            let latency = elapsed.map(|_| self.latency.get_or_create(&key.1.request).clone());
            (self.requests.get_or_create(&key.1).clone(), latency)
        };
        let cached = CACHE.try_with(|cache| {
            let mut cache = cache.borrow_mut();
            if let Some(handles) = cache.get(&key) {
                return observe(handles);
            }
            let handles = lookup();
            observe(&handles);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
            cache.insert(key.clone(), handles);
        });
        // A thread that is exiting has no cache left.
        if cached.is_err() {
            observe(&lookup());
        }
    }

    /// Counts a request rejected with `code` in self-defense (`apiserver_request_terminations_total`).
    pub fn record_termination(&self, labels: TerminationLabelSet) {
        self.terminations.get_or_create(&labels).inc();
    }

    /// Every registered family in the text format 0.0.4.
    pub fn encode(&self) -> Result<String, super::exposition::ExpositionError> {
        let registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        super::exposition::encode(&registry)
    }
}

/// The `dry_run` label as kube-apiserver's `cleanDryRun`: the request's `dryRun` values, sorted, unique and joined
/// by commas (`All`, the only valid value), `invalid` when one is not valid, empty without any.
pub fn dry_run_label(query: Option<&str>) -> Label {
    let mut label = "";
    for (_, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()).filter(|(k, _)| k == "dryRun") {
        if value != "All" {
            return Label::Borrowed("invalid");
        }
        label = "All";
    }
    Label::Borrowed(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(verb: &'static str, resource: &str) -> LatencyLabelSet {
        LatencyLabelSet {
            verb: Label::Borrowed(verb),
            dry_run: Label::Borrowed(""),
            group: Label::Borrowed("migration.k8s.io"),
            version: Label::Borrowed("v1alpha1"),
            resource: Label::Owned(resource.to_string()),
            subresource: Label::Borrowed(""),
            scope: Label::Borrowed("cluster"),
            component: Label::Borrowed("apiserver"),
        }
    }

    /// The value of the first sample whose line starts with `prefix` and carries all of `labels`.
    fn value<'a>(text: &'a str, prefix: &str, labels: &[&str]) -> Option<&'a str> {
        let line = text.lines().find(|l| l.starts_with(prefix) && labels.iter().all(|label| l.contains(label)))?;
        line.rsplit(' ').next()
    }

    #[test]
    fn cached_handles_count_into_their_own_instance() {
        let (a, b) = (Metrics::new(), Metrics::new());
        let ms = Some(Duration::from_millis(3));
        for _ in 0..3 {
            a.record(labels("LIST", "storagestates"), Label::Borrowed("200"), ms);
        }
        b.record(labels("LIST", "storagestates"), Label::Borrowed("200"), ms);
        a.record(labels("LIST", "storagestates"), Label::Borrowed("404"), ms);
        a.record(labels("WATCH", "storagestates"), Label::Borrowed("200"), None);
        let (ta, tb) = (a.encode().expect("encode"), b.encode().expect("encode"));
        let (total, count) = ("apiserver_request_total{", "apiserver_request_duration_seconds_count{");
        let (list, watch) = ("verb=\"LIST\"", "verb=\"WATCH\"");
        assert_eq!(value(&ta, total, &[list, "code=\"200\""]), Some("3"), "{ta}");
        assert_eq!(value(&ta, total, &[list, "code=\"404\""]), Some("1"), "{ta}");
        assert_eq!(value(&tb, total, &[list, "code=\"200\""]), Some("1"), "{tb}");
        assert_eq!(value(&ta, count, &[list]), Some("4"), "{ta}");
        assert_eq!(value(&ta, total, &[watch]), Some("1"), "{ta}");
        assert_eq!(value(&ta, "apiserver_request_duration_seconds", &[watch]), None, "a watch has no latency: {ta}");
    }
}

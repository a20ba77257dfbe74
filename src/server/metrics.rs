//! Prometheus metrics in text format, with kube-apiserver's request metric names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::sync::Mutex;

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
    pub group: Label,
    pub version: Label,
    pub resource: Label,
    pub subresource: Label,
    pub scope: Label,
    pub component: Label,
}

fn latency_histogram() -> Histogram {
    // kube-apiserver's request latency buckets (seconds).
    Histogram::new([
        0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0,
        30.0, 45.0, 60.0,
    ])
}

pub struct Metrics {
    pub registry: Mutex<Registry>,
    pub requests: Family<RequestLabelSet, Counter>,
    pub latency: Family<LatencyLabelSet, Histogram, fn() -> Histogram>,
    pub inflight: Family<Vec<(String, String)>, Gauge>,
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
        let inflight = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, group, version, resource, scope, component, and HTTP response code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component",
            latency.clone(),
        );
        registry.register(
            "apiserver_current_inflight_requests",
            "Maximal number of currently used inflight request limit of this apiserver per request kind",
            inflight.clone(),
        );
        Metrics { registry: Mutex::new(registry), requests, latency, inflight }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(reg) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        }
        out
    }
}

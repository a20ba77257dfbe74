//! kube-apiserver's metrics of the KMS v2 provider (k8s.io/apiserver `.../envelope/metrics/metrics.go`) and the
//! transformation metrics of its values (`pkg/storage/value/metrics.go`): names, labels, HELP (`[ALPHA] `) and
//! buckets as upstream's. They are process-wide, as upstream's are; the server registers them once
//! ([`register`]) with its identity.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::Duration;

type FloatGauge = Gauge<f64, AtomicU64>;
type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyIdLabels {
    transformation_type: String,
    provider_name: String,
    key_id_hash: String,
    apiserver_id_hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusKeyIdLabels {
    provider_name: String,
    key_id_hash: String,
    apiserver_id_hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InvalidKeyIdLabels {
    provider_name: String,
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    provider_name: String,
    method_name: String,
    grpc_status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransformationLabels {
    resource: String,
    transformation_type: String,
    transformer_prefix: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransformationDurationLabels {
    transformation_type: String,
    transformer_prefix: String,
}

/// How many key_id label sets each family keeps: upstream's LRU of 100, whose eviction deletes the series.
const KEY_ID_SERIES: usize = 100;

struct Families {
    key_id_total: Family<KeyIdLabels, Counter>,
    key_id_last: Family<KeyIdLabels, FloatGauge>,
    status_key_id_last: Family<StatusKeyIdLabels, FloatGauge>,
    invalid_key_id: Family<InvalidKeyIdLabels, Counter>,
    cache_size: Family<ProviderLabels, Gauge>,
    operations: HistogramFamily<OperationLabels>,
    transformations: Family<TransformationLabels, Counter>,
    transformation_duration: HistogramFamily<TransformationDurationLabels>,
    cache_misses: Counter,
    /// The key_id label sets in use, least recently used first.
    key_id_sets: Mutex<Vec<KeyIdLabels>>,
    status_key_id_sets: Mutex<Vec<StatusKeyIdLabels>>,
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| Families {
    key_id_total: Family::default(),
    key_id_last: Family::default(),
    status_key_id_last: Family::default(),
    invalid_key_id: Family::default(),
    cache_size: Family::default(),
    operations: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 20))),
    transformations: Family::default(),
    transformation_duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(5e-6, 2.0, 25))),
    cache_misses: Counter::default(),
    key_id_sets: Mutex::new(Vec::new()),
    status_key_id_sets: Mutex::new(Vec::new()),
});

/// `sha256:<hex>` of the apiserver identity ([`set_apiserver_id_hash`]).
static APISERVER_ID_HASH: OnceLock<String> = OnceLock::new();

/// The identity of every key_id series (the first call wins: one process, one identity).
pub fn set_apiserver_id_hash(apiserver_id_hash: &str) {
    let _ = APISERVER_ID_HASH.set(apiserver_id_hash.to_string());
}

/// Registers the families in `registry`.
pub fn register(registry: &mut Registry) {
    let f = &*FAMILIES;
    registry.register(
        "apiserver_envelope_encryption_key_id_hash_total",
        "[ALPHA] Number of times a keyID is used split by transformation type, provider, and apiserver identity.",
        f.key_id_total.clone(),
    );
    registry.register(
        "apiserver_envelope_encryption_key_id_hash_last_timestamp_seconds",
        "[ALPHA] The last time in seconds when a keyID was used.",
        f.key_id_last.clone(),
    );
    registry.register(
        "apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds",
        "[ALPHA] The last time in seconds when a keyID was returned by the Status RPC call.",
        f.status_key_id_last.clone(),
    );
    registry.register(
        "apiserver_envelope_encryption_invalid_key_id_from_status_total",
        "[ALPHA] Number of times an invalid keyID is returned by the Status RPC call split by error.",
        f.invalid_key_id.clone(),
    );
    registry.register(
        "apiserver_envelope_encryption_dek_source_cache_size",
        "[ALPHA] Number of records in data encryption key (DEK) source cache. On a restart, this value is an approximation of the number of decrypt RPC calls the server will make to the KMS plugin.",
        f.cache_size.clone(),
    );
    registry.register(
        "apiserver_envelope_encryption_kms_operations_latency_seconds",
        "[ALPHA] KMS operation duration with gRPC error code status total.",
        f.operations.clone(),
    );
    registry.register(
        "apiserver_storage_transformation_operations_total",
        "[ALPHA] Total number of transformations. Successful transformation will have a status 'OK' and a varied status string when the transformation fails. The status, resource, and transformation_type fields can be used for alerting purposes. For example, you can monitor for encryption/decryption failures using the transformation_type (e.g., from_storage for decryption and to_storage for encryption). Additionally, these fields can be used to ensure that the correct transformers are applied to each resource.",
        f.transformations.clone(),
    );
    registry.register(
        "apiserver_storage_transformation_duration_seconds",
        "[ALPHA] Latencies in seconds of value transformation operations.",
        f.transformation_duration.clone(),
    );
    registry.register(
        "apiserver_storage_envelope_transformation_cache_misses_total",
        "[ALPHA] Total number of cache misses while accessing key decryption key(KEK).",
        f.cache_misses.clone(),
    );
}

fn apiserver_id_hash() -> String {
    APISERVER_ID_HASH.get().cloned().unwrap_or_default()
}

fn now_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// Marks `labels` as just used; the least recently used set beyond [`KEY_ID_SERIES`] is returned for deletion.
fn touch<L: Clone + PartialEq>(sets: &Mutex<Vec<L>>, labels: &L) -> Option<L> {
    let mut sets = sets.lock().unwrap_or_else(|p| p.into_inner());
    sets.retain(|l| l != labels);
    sets.push(labels.clone());
    (sets.len() > KEY_ID_SERIES).then(|| sets.remove(0))
}

/// A value was encrypted (`to_storage`) or decrypted (`from_storage`) under `key_id_hash`.
pub fn key_id_used(transformation_type: &str, provider: &str, key_id_hash: &str) {
    let labels = KeyIdLabels {
        transformation_type: transformation_type.to_string(),
        provider_name: provider.to_string(),
        key_id_hash: key_id_hash.to_string(),
        apiserver_id_hash: apiserver_id_hash(),
    };
    let f = &*FAMILIES;
    if let Some(evicted) = touch(&f.key_id_sets, &labels) {
        f.key_id_total.remove(&evicted);
        f.key_id_last.remove(&evicted);
    }
    f.key_id_total.get_or_create(&labels).inc();
    f.key_id_last.get_or_create(&labels).set(now_seconds());
}

/// Status returned a valid `key_id` (whatever its healthz and version).
pub fn key_id_from_status(provider: &str, key_id_hash: &str) {
    let labels = StatusKeyIdLabels {
        provider_name: provider.to_string(),
        key_id_hash: key_id_hash.to_string(),
        apiserver_id_hash: apiserver_id_hash(),
    };
    let f = &*FAMILIES;
    if let Some(evicted) = touch(&f.status_key_id_sets, &labels) {
        f.status_key_id_last.remove(&evicted);
    }
    f.status_key_id_last.get_or_create(&labels).set(now_seconds());
}

/// Status returned a key_id that fails validation (`empty`, `too_long`).
pub fn invalid_key_id_from_status(provider: &str, error: &str) {
    let labels = InvalidKeyIdLabels { provider_name: provider.to_string(), error: error.to_string() };
    FAMILIES.invalid_key_id.get_or_create(&labels).inc();
}

pub fn cache_size(provider: &str, size: usize) {
    let labels = ProviderLabels { provider_name: provider.to_string() };
    FAMILIES.cache_size.get_or_create(&labels).set(size as i64);
}

/// One gRPC call to the plugin: its full method name and Go's name of its status code.
pub fn kms_operation(provider: &str, method: &str, code: &str, elapsed: Duration) {
    let labels = OperationLabels {
        provider_name: provider.to_string(),
        method_name: method.to_string(),
        grpc_status_code: code.to_string(),
    };
    FAMILIES.operations.get_or_create(&labels).observe(elapsed.as_secs_f64());
}

/// One value transformed by the provider of `prefix` (`k8s:enc:kms:v2:<name>:`): `status` is `OK` or the failure's
/// gRPC code name (`Unknown` for errors that are not gRPC's), as upstream's `getErrorCode`.
pub fn transformation(resource: &str, transformation_type: &str, prefix: &str, status: &str, elapsed: Duration) {
    let labels = TransformationLabels {
        resource: resource.to_string(),
        transformation_type: transformation_type.to_string(),
        transformer_prefix: prefix.to_string(),
        status: status.to_string(),
    };
    let f = &*FAMILIES;
    f.transformations.get_or_create(&labels).inc();
    let labels = TransformationDurationLabels {
        transformation_type: transformation_type.to_string(),
        transformer_prefix: prefix.to_string(),
    };
    f.transformation_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
}

/// A read needed Decrypt: its DEK source was not cached.
pub fn cache_miss() {
    FAMILIES.cache_misses.inc();
}

//! The production backend: etcd v3 behind the same `Storage` trait as the embedded store.
//!
//! etcd's revision is the resourceVersion; creates and updates are transactions comparing create_revision /
//! mod_revision; watches are served from one etcd watch per replica with progress notifications as bookmarks. Keys
//! are `<--etcd-prefix>` + the registry's key without its `/registry` root, so the default prefix gives the same keys
//! as kube-apiserver's.
//!
//! Reads are served from a watch cache, as kube-apiserver's cacher serves them: the one watch ([`feed`]) keeps every
//! key under the prefix in memory ([`cache`]; memory grows with the stored objects, as kube-apiserver's does). A GET
//! or LIST without a revision is a consistent read: it takes etcd's current revision from one cheap linearizable
//! request, shared by the readers waiting for it ([`read_index`]), waits until the cache has reached that revision,
//! and answers from memory; so a read after any replica's acknowledged write sees it. Reads at an older revision
//! (continue pages, exact resourceVersions) go to etcd, whose MVCC serves them, unless the cache is exactly there;
//! reads while the cache is not ready, or lags more than [`CACHE_WAIT`], go to etcd too.

mod cache;
mod compactor;
mod feed;
mod metrics;
mod read_index;

use cache::{At, Cache};
use compactor::Compactor;
use feed::{orders_progress, Feed};
pub use metrics::CacheReads;
use metrics::ReadCounters;
use read_index::ReadIndex;
use std::path::PathBuf;
use std::time::Duration;

/// `serve` flags of the etcd backend (named as kube-apiserver's).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EtcdArgs {
    /// etcd v3 endpoints (comma-separated URLs, e.g. https://10.0.0.1:2379); selects the etcd backend instead of
    /// the embedded store.
    #[arg(long = "etcd-servers", id = "etcd_servers", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Prefix of every key this server writes in etcd.
    #[arg(long = "etcd-prefix", id = "etcd_prefix", default_value = "/registry")]
    pub prefix: String,
    /// CA bundle that verifies etcd's serving certificates.
    #[arg(long = "etcd-cafile", id = "etcd_cafile")]
    pub cafile: Option<PathBuf>,
    /// Client certificate presented to etcd (PEM).
    #[arg(long = "etcd-certfile", id = "etcd_certfile", requires = "etcd_keyfile")]
    pub certfile: Option<PathBuf>,
    /// Key of --etcd-certfile.
    #[arg(long = "etcd-keyfile", id = "etcd_keyfile", requires = "etcd_certfile")]
    pub keyfile: Option<PathBuf>,
    /// How often this server compacts etcd's history (as kube-apiserver's flag; 0 disables, for an etcd that
    /// others compact).
    #[arg(long = "etcd-compaction-interval", id = "etcd_compaction_interval", default_value = "5m", value_parser = crate::duration::parse_duration)]
    pub compaction_interval: Duration,
}

impl EtcdArgs {
    pub fn enabled(&self) -> bool {
        !self.servers.is_empty()
    }

    /// A client for the configured endpoints (TLS when a CA or client certificate is given). The client
    /// reconnects by itself; the first connection must succeed within the timeout.
    pub async fn connect(&self) -> anyhow::Result<etcd_client::Client> {
        use anyhow::Context;
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(5))
            .with_timeout(std::time::Duration::from_secs(30))
            .with_keep_alive(std::time::Duration::from_secs(10), std::time::Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if self.cafile.is_some() || self.certfile.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &self.cafile {
                let pem = std::fs::read(ca).with_context(|| format!("reading --etcd-cafile {}", ca.display()))?;
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            if let (Some(cert), Some(key)) = (&self.certfile, &self.keyfile) {
                let c = std::fs::read(cert).with_context(|| format!("reading --etcd-certfile {}", cert.display()))?;
                let k = std::fs::read(key).with_context(|| format!("reading --etcd-keyfile {}", key.display()))?;
                tls = tls.identity(etcd_client::Identity::from_pem(c, k));
            }
            opts = opts.with_tls(tls);
        }
        // Requests and watches on a member cut off from the cluster fail instead of stalling silently.
        let opts = opts.with_require_leader(true);
        etcd_client::Client::connect(&self.servers, Some(opts))
            .await
            .with_context(|| format!("connecting to etcd at {}", self.servers.join(",")))
    }
}

use super::{
    HistoryLimit, KeyValue, ListOptions, ListResult, Result, Revision, Storage, StorageError, WatchHub, WatchItem,
};
use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, KvClient, PutOptions, Txn, TxnOp, TxnOpResponse};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The root of the registry's keys; replaced by `--etcd-prefix` in etcd.
const REGISTRY_ROOT: &str = "/registry";
/// Keys per range request when a list asks for everything (responses stay far below gRPC's message limit).
const LIST_BATCH: i64 = 1000;
/// Largest gRPC message accepted from etcd (a page of big objects; etcd's own default response limit is 2 GiB).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;
/// How long a consistent read waits for the watch cache to reach etcd's revision before it reads etcd instead
/// (kube-apiserver's cacher waits up to 3 s too).
pub const CACHE_WAIT: Duration = Duration::from_secs(3);

pub struct EtcdOptions {
    /// Events kept in memory for watch resumption (like kube-apiserver's watch cache).
    pub history: HistoryLimit,
    /// Values larger than this are refused before they reach etcd.
    pub max_value_bytes: usize,
    /// How often etcd's history is compacted (zero: never, leave it to another compactor).
    pub compaction_interval: Duration,
}

/// The etcd backend. Writes go to etcd; reads are served from the watch cache (see the module doc); watches from
/// a [`WatchHub`] fed by the same etcd watch, which also turns etcd's progress notifications into bookmarks.
pub struct EtcdStorage {
    kv: KvClient,
    /// `--etcd-prefix` without a trailing slash.
    prefix: String,
    hub: Arc<WatchHub>,
    cache: Arc<Cache>,
    read_index: Arc<ReadIndex>,
    /// The newest etcd revision seen in any response or watch event.
    current: Arc<AtomicU64>,
    /// The newest compaction revision seen (etcd refuses reads and watches older than it).
    compacted: Arc<AtomicU64>,
    max_value_bytes: usize,
    /// How long a consistent read waits for the cache to reach etcd's revision.
    cache_wait: Duration,
    reads: ReadCounters,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for EtcdStorage {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The first key after `key`'s prefix range (etcd's "prefix end").
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn rev(r: i64) -> Revision {
    r.max(0) as Revision
}

/// An etcd error as the storage layer reports it: unreachable or timed-out etcd is `Unavailable` (503, retryable),
/// compacted history is `Expired`, an oversized request `TooLarge`.
fn storage_error(e: etcd_client::Error, size: usize) -> StorageError {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) => {
            let msg = s.message();
            if msg.contains("request is too large") || msg.contains("message length too large") {
                StorageError::TooLarge { size, limit: 0 }
            } else if msg.contains("required revision is a future revision") {
                StorageError::Unavailable(format!("Too large resource version: etcd: {msg}"))
            } else if msg.contains("required revision has been compacted") {
                StorageError::Expired { requested: 0, oldest: 0 }
            } else if matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    // Also "too many requests" and "database space exceeded": retryable, not the request's fault.
                    | tonic::Code::ResourceExhausted
            ) {
                StorageError::Unavailable(format!("etcd: {msg}"))
            } else {
                StorageError::Internal(format!("etcd: {msg}"))
            }
        }
        E::TransportError(_) | E::IoError(_) | E::EndpointError(_) => StorageError::Unavailable(format!("etcd: {e}")),
        other => StorageError::Internal(format!("etcd: {other}")),
    }
}

/// etcd's current revision from the cheapest linearizable request: a range read of the single key `key` (the
/// prefix itself, without the prefix option), O(log n) in etcd. A count-only prefix range would count every key.
async fn fetch_revision(mut kv: KvClient, key: String) -> Result<Revision> {
    let resp = kv.get(key, None).await.map_err(|e| storage_error(e, 0))?;
    Ok(resp.header().map_or(0, |h| rev(h.revision())))
}

impl EtcdStorage {
    /// Connects the backend: reads etcd's current revision, starts the watch feed (which fills the watch cache
    /// in the background; reads go to etcd until it is ready) and, with a non-zero `compaction_interval`, the
    /// compactor.
    pub async fn open(client: etcd_client::Client, prefix: &str, opts: EtcdOptions) -> Result<Arc<Self>> {
        let prefix = prefix.trim_end_matches('/').to_string();
        let kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE);
        let revision = fetch_revision(kv.clone(), prefix.clone()).await?;
        let version = match client.maintenance_client().status().await {
            Ok(status) => status.version().to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        let progress_ordered = orders_progress(&version);
        if !progress_ordered {
            tracing::warn!(
                version = %version,
                "etcd older than 3.4.31 / 3.5.13 may answer a requested progress notification before events it has \
                 queued (etcd-io/etcd#15220): consistent reads are served from the watch cache only when its events \
                 have caught up with etcd's revision, and read etcd otherwise"
            );
        }
        let hub = Arc::new(WatchHub::new(revision, opts.history));
        let cache = Arc::new(Cache::new());
        let current = Arc::new(AtomicU64::new(revision));
        let compacted = Arc::new(AtomicU64::new(0));
        let feed = Feed {
            kv: kv.clone(),
            watch: client.watch_client().max_decoding_message_size(MAX_MESSAGE),
            prefix: prefix.clone(),
            hub: hub.clone(),
            cache: cache.clone(),
            current: current.clone(),
            compacted: compacted.clone(),
            progress_ordered,
        };
        let mut tasks = vec![tokio::spawn(feed.run(revision))];
        let read_index = ReadIndex::new();
        let (ri_kv, ri_key) = (kv.clone(), prefix.clone());
        tasks.push(tokio::spawn(read_index.clone().run(move || fetch_revision(ri_kv.clone(), ri_key.clone()))));
        if !opts.compaction_interval.is_zero() {
            // kube-apiserver's key, outside every prefix: all servers on one etcd take turns compacting it.
            let compactor = Compactor { kv: kv.clone(), key: "compact_rev_key".into(), compacted: compacted.clone() };
            tasks.push(tokio::spawn(compactor.run(opts.compaction_interval)));
        }
        tracing::info!(prefix = %prefix, revision, "connected to etcd");
        Ok(Arc::new(Self {
            kv,
            prefix,
            hub,
            cache,
            read_index,
            current,
            compacted,
            max_value_bytes: opts.max_value_bytes,
            // Without ordered progress notifications nothing but events moves the cache: waiting is pointless when
            // etcd's revision moved through writes elsewhere, and events in flight have usually arrived by the
            // time etcd's revision has been read.
            cache_wait: if progress_ordered { CACHE_WAIT } else { Duration::ZERO },
            reads: ReadCounters::new(),
            tasks,
        }))
    }

    /// The watch hub (history ring and watchers).
    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
    }

    /// Whether the watch cache answers reads (filled, and not being rebuilt).
    pub fn cache_ready(&self) -> bool {
        self.cache.is_ready()
    }

    /// Reads answered by the watch cache and by etcd so far.
    pub fn cache_reads(&self) -> CacheReads {
        self.reads.totals()
    }

    /// Registers `storage_cache_reads_total{operation, source}` (reads answered by the watch cache or by etcd).
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.reads.register(registry);
    }

    fn etcd_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key.strip_prefix(REGISTRY_ROOT).unwrap_or(key))
    }

    fn seen(&self, header: Option<&etcd_client::ResponseHeader>) -> Revision {
        let r = header.map_or(0, |h| rev(h.revision()));
        self.current.fetch_max(r, Ordering::AcqRel);
        r
    }

    fn key_value(&self, kv: &etcd_client::KeyValue) -> KeyValue {
        to_key_value(&self.prefix, kv)
    }

    fn check_size(&self, value: &Bytes) -> Result<()> {
        if value.len() > self.max_value_bytes {
            return Err(StorageError::TooLarge { size: value.len(), limit: self.max_value_bytes });
        }
        Ok(())
    }

    /// Every key under the registry `prefix` as stored (possibly encrypted), for `storage inspect`: read from etcd
    /// itself, not the cache.
    pub async fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(self
            .list_etcd(prefix, ListOptions { start_after: None, limit: 0, revision: None, ..Default::default() })
            .await?
            .items)
    }

    /// The cache revision a consistent read may answer at: etcd's current revision (from a request that started
    /// after the read began), once the cache has reached it. `None` when the cache is not ready or does not get
    /// there within [`CACHE_WAIT`]: the read goes to etcd.
    async fn consistent_cache_revision(&self) -> Result<Option<Revision>> {
        if !self.cache.is_ready() {
            return Ok(None);
        }
        let target = self.read_index.revision().await?;
        self.current.fetch_max(target, Ordering::AcqRel);
        if self.cache.wait_for(target, self.cache_wait).await {
            return Ok(Some(target));
        }
        if self.cache.is_ready() {
            tracing::debug!(target, cache = self.cache.revision(), "watch cache lagging; reading etcd");
        }
        Ok(None)
    }

    /// Whether etcd still has the history after `revision` (not compacted past it): a range read of one key at
    /// `revision + 1`, which etcd refuses with "compacted" otherwise. Compactions by other replicas or an operator
    /// count too; nothing of the history is scanned.
    async fn history_after(&self, revision: Revision) -> Result<bool> {
        let opts = GetOptions::new().with_revision(revision as i64 + 1);
        match self.kv.clone().get(self.prefix.clone(), Some(opts)).await {
            Ok(resp) => {
                self.seen(resp.header());
                Ok(true)
            }
            Err(e) => match storage_error(e, 0) {
                StorageError::Expired { .. } => {
                    self.compacted.fetch_max(revision + 2, Ordering::AcqRel);
                    Ok(false)
                }
                other => Err(other),
            },
        }
    }

    /// `Expired` for a read at `requested` that etcd refused as compacted, with the oldest readable revision.
    async fn expired(&self, requested: Revision) -> StorageError {
        let oldest = self.compacted.load(Ordering::Acquire).max(requested + 1);
        StorageError::Expired { requested, oldest }
    }

    /// GET from etcd itself.
    async fn get_etcd(&self, key: &str) -> Result<Option<KeyValue>> {
        let resp = self.kv.clone().get(self.etcd_key(key), None).await.map_err(|e| storage_error(e, 0))?;
        self.seen(resp.header());
        Ok(resp.kvs().first().map(|kv| self.key_value(kv)))
    }

    /// LIST from etcd itself: at `opts.revision`, or linearizable at etcd's current revision.
    async fn list_etcd(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let range = self.etcd_key(prefix).into_bytes();
        let end = prefix_end(&range);
        let mut start = match &opts.start_after {
            Some(after) => {
                let mut k = self.etcd_key(after).into_bytes();
                k.push(0);
                k
            }
            None => range,
        };
        let mut revision = opts.revision.unwrap_or(0);
        let mut items = Vec::new();
        let mut kv = self.kv.clone();
        loop {
            let batch = if opts.limit == 0 { LIST_BATCH } else { (opts.limit - items.len()) as i64 };
            let mut get = GetOptions::new().with_range(end.clone()).with_limit(batch);
            if revision > 0 {
                get = get.with_revision(revision as i64);
            }
            let resp = match kv.get(start.clone(), Some(get)).await {
                Ok(resp) => resp,
                Err(e) => {
                    return Err(match storage_error(e, 0) {
                        StorageError::Expired { .. } => self.expired(revision).await,
                        other => other,
                    })
                }
            };
            let at = self.seen(resp.header());
            if revision == 0 {
                revision = at;
            }
            let kvs = resp.kvs();
            if let Some(last) = kvs.last() {
                start = last.key().to_vec();
                start.push(0);
            }
            items.extend(kvs.iter().map(|kv| self.key_value(kv)));
            if !resp.more() {
                return Ok(ListResult { items, revision, more: false, remaining: 0 });
            }
            if opts.limit > 0 && items.len() >= opts.limit {
                let remaining = (resp.count() as u64).saturating_sub(kvs.len() as u64);
                return Ok(ListResult { items, revision, more: true, remaining });
            }
        }
    }

    /// Why a compare failed: the key is gone, or it is at another revision.
    fn missed(&self, key: &str, found: Option<&etcd_client::KeyValue>) -> StorageError {
        match found {
            None => StorageError::NotFound { key: key.to_owned() },
            Some(kv) => StorageError::Conflict { key: key.to_owned(), current: rev(kv.mod_revision()) },
        }
    }
}

fn to_key_value(prefix: &str, kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: registry_key(prefix, kv.key()),
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: rev(kv.create_revision()),
        mod_revision: rev(kv.mod_revision()),
        stale: false,
    }
}

/// Whether the cache holds `key` (or the keys under it): the feed watches `<--etcd-prefix>/`, the registry's
/// `/registry/...` keys.
fn in_cache(key: &str) -> bool {
    key.strip_prefix(REGISTRY_ROOT).is_some_and(|rest| rest.starts_with('/'))
}

fn registry_key(prefix: &str, key: &[u8]) -> String {
    let k = String::from_utf8_lossy(key);
    match k.strip_prefix(prefix) {
        Some(rest) => format!("{REGISTRY_ROOT}{rest}"),
        None => k.into_owned(),
    }
}

#[async_trait]
impl Storage for EtcdStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        if !in_cache(key) {
            return self.get_etcd(key).await;
        }
        if let Some(target) = self.consistent_cache_revision().await? {
            if let Some(found) = self.cache.get(key, At::AtLeast(target)) {
                self.reads.get_cache.inc();
                return Ok(found);
            }
        }
        self.reads.get_etcd.inc();
        self.get_etcd(key).await
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        if !in_cache(prefix) {
            return self.list_etcd(prefix, opts).await;
        }
        let at = match opts.revision {
            None => self.consistent_cache_revision().await?.map(At::AtLeast),
            // A continue page or an exact resourceVersion: from the cache only if it is at exactly that revision
            // (nothing written since the first page), and etcd has not compacted it as far as we know (that read
            // is 410 Expired, as from etcd).
            Some(r) if r >= self.compacted.load(Ordering::Acquire) => Some(At::Exactly(r)),
            Some(_) => None,
        };
        if let Some(res) = at.and_then(|at| self.cache.list(prefix, &opts, at)) {
            self.reads.list_cache.inc();
            return Ok(res);
        }
        self.reads.list_etcd.inc();
        self.list_etcd(prefix, opts).await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        self.check_size(&value)?;
        let k = self.etcd_key(key);
        let txn = Txn::new().when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            k,
            value.to_vec(),
            None,
        )]);
        let resp = self.kv.clone().txn(txn).await.map_err(|e| storage_error(e, value.len()))?;
        let r = self.seen(resp.header());
        if !resp.succeeded() {
            return Err(StorageError::AlreadyExists { key: key.to_owned() });
        }
        Ok(KeyValue { key: key.to_owned(), value, create_revision: r, mod_revision: r, stale: false })
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        self.check_size(&value)?;
        let k = self.etcd_key(key);
        let txn = Txn::new()
            .when([Compare::mod_revision(k.clone(), CompareOp::Equal, expected as i64)])
            .and_then([TxnOp::put(k.clone(), value.to_vec(), Some(PutOptions::new().with_prev_key()))])
            .or_else([TxnOp::get(k, None)]);
        let resp = self.kv.clone().txn(txn).await.map_err(|e| storage_error(e, value.len()))?;
        let r = self.seen(resp.header());
        match (resp.succeeded(), resp.op_responses().into_iter().next()) {
            (true, Some(TxnOpResponse::Put(put))) => {
                let create_revision = put.prev_key().map_or(r, |p| rev(p.create_revision()));
                Ok(KeyValue { key: key.to_owned(), value, create_revision, mod_revision: r, stale: false })
            }
            (false, Some(TxnOpResponse::Get(get))) => Err(self.missed(key, get.kvs().first())),
            _ => Err(StorageError::Internal(format!("etcd: unexpected transaction response updating {key}"))),
        }
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        let k = self.etcd_key(key);
        let cmp = match expected {
            Some(e) => Compare::mod_revision(k.clone(), CompareOp::Equal, e as i64),
            None => Compare::create_revision(k.clone(), CompareOp::Greater, 0),
        };
        let txn = Txn::new()
            .when([cmp])
            .and_then([TxnOp::delete(k.clone(), Some(DeleteOptions::new().with_prev_key()))])
            .or_else([TxnOp::get(k, None)]);
        let resp = self.kv.clone().txn(txn).await.map_err(|e| storage_error(e, 0))?;
        let r = self.seen(resp.header());
        match (resp.succeeded(), resp.op_responses().into_iter().next()) {
            (true, Some(TxnOpResponse::Delete(del))) => match del.prev_kvs().first() {
                Some(prev) => Ok(KeyValue { mod_revision: r, ..self.key_value(prev) }),
                None => Err(StorageError::NotFound { key: key.to_owned() }),
            },
            (false, Some(TxnOpResponse::Get(get))) => Err(self.missed(key, get.kvs().first())),
            _ => Err(StorageError::Internal(format!("etcd: unexpected transaction response deleting {key}"))),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<mpsc::Receiver<WatchItem>> {
        // Events after `after` must still be in etcd's history, not only in ours: a compaction (ours, another
        // replica's, an operator's) expires older watches exactly as it expires older continue tokens.
        if after < self.current_revision() && !self.history_after(after).await? {
            let oldest = self.compacted.load(Ordering::Acquire).max(after + 2);
            return Err(StorageError::Expired { requested: after, oldest });
        }
        self.hub.watch(prefix, after)
    }

    fn progress_revision(&self) -> Revision {
        self.hub.progress_revision()
    }

    async fn sync_revision(&self) -> Revision {
        // Writes through other replicas, or outside our prefix, move etcd's revision without us seeing them.
        let _ = self.check_health().await;
        self.current_revision()
    }

    async fn check_health(&self) -> Result<()> {
        match tokio::time::timeout(Duration::from_secs(2), fetch_revision(self.kv.clone(), self.prefix.clone())).await {
            Ok(Ok(r)) => {
                self.current.fetch_max(r, Ordering::AcqRel);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StorageError::Unavailable("etcd did not answer in 2s".into())),
        }
    }

    fn current_revision(&self) -> Revision {
        self.current.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_holds_the_registry_keys() {
        assert!(in_cache("/registry/migration.k8s.io/storageversionmigrations/x"));
        assert!(in_cache("/registry/"));
        assert!(!in_cache("/registryx/a"));
        assert!(!in_cache("/registry"));
        assert!(!in_cache("/other/a"));
        assert_eq!(registry_key("/custom", b"/custom/core/x"), "/registry/core/x");
        assert_eq!(prefix_end(b"/registry/"), b"/registry0".to_vec());
    }
}

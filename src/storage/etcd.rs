//! The production backend: etcd v3 behind the same `Storage` trait as the embedded store.
//!
//! etcd's revision is the resourceVersion; creates and updates are transactions comparing create_revision /
//! mod_revision; paged lists read at the first page's revision; watches are etcd watches with progress
//! notifications as bookmarks. Keys are `<--etcd-prefix>` + the registry's key without its `/registry` root, so the
//! default prefix gives the same keys as kube-apiserver's.

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
    Event, EventKind, HistoryLimit, KeyValue, ListOptions, ListResult, Result, Revision, Storage, StorageError,
    WatchHub, WatchItem,
};
use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, EventType, GetOptions, KvClient, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchClient, WatchOptions,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The root of the registry's keys; replaced by `--etcd-prefix` in etcd.
const REGISTRY_ROOT: &str = "/registry";
/// Keys per range request when a list asks for everything (responses stay far below gRPC's message limit).
const LIST_BATCH: i64 = 1000;
/// Largest gRPC message accepted from etcd (a page of big objects; etcd's own default response limit is 2 GiB).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

pub struct EtcdOptions {
    /// Events kept in memory for watch resumption (like kube-apiserver's watch cache).
    pub history: HistoryLimit,
    /// Values larger than this are refused before they reach etcd.
    pub max_value_bytes: usize,
    /// How often etcd's history is compacted (zero: never, leave it to another compactor).
    pub compaction_interval: Duration,
}

/// The etcd backend. Reads and writes go to etcd; watches are served from one etcd watch on the whole prefix,
/// fanned out by a [`WatchHub`] (kube-apiserver's watch cache, in small), which also turns etcd's progress
/// notifications into bookmarks.
pub struct EtcdStorage {
    kv: KvClient,
    /// `--etcd-prefix` without a trailing slash.
    prefix: String,
    hub: Arc<WatchHub>,
    /// The newest etcd revision seen in any response or watch event.
    current: Arc<AtomicU64>,
    /// The newest compaction revision seen (etcd refuses reads and watches older than it).
    compacted: Arc<AtomicU64>,
    max_value_bytes: usize,
    feed: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdStorage {
    fn drop(&mut self) {
        self.feed.abort();
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

impl EtcdStorage {
    /// Connects the backend: reads etcd's current revision, starts the watch feed and, with a non-zero
    /// `compaction_interval`, the compactor.
    pub async fn open(client: etcd_client::Client, prefix: &str, opts: EtcdOptions) -> Result<Arc<Self>> {
        let prefix = prefix.trim_end_matches('/').to_string();
        let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE);
        let probe = kv
            .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix().with_count_only()))
            .await
            .map_err(|e| storage_error(e, 0))?;
        let revision = rev(probe.header().map_or(0, |h| h.revision()));
        let hub = Arc::new(WatchHub::new(revision, opts.history));
        let current = Arc::new(AtomicU64::new(revision));
        let compacted = Arc::new(AtomicU64::new(0));
        let watch_client = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        let feed = Feed {
            watch: watch_client.clone(),
            prefix: prefix.clone(),
            hub: hub.clone(),
            current: current.clone(),
            compacted: compacted.clone(),
        };
        let feed = tokio::spawn(feed.run(revision));
        if !opts.compaction_interval.is_zero() {
            // kube-apiserver's key, outside every prefix: all servers on one etcd take turns compacting it.
            let compactor = Compactor { kv: kv.clone(), key: "compact_rev_key".into(), compacted: compacted.clone() };
            // Stops with the feed's runtime; holding only clients, it needs no handle of its own.
            tokio::spawn(compactor.run(opts.compaction_interval));
        }
        tracing::info!(prefix = %prefix, revision, "connected to etcd");
        Ok(Arc::new(Self { kv, prefix, hub, current, compacted, max_value_bytes: opts.max_value_bytes, feed }))
    }

    /// The watch hub (history ring and watchers).
    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
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

    /// Every key under the registry `prefix` as stored (possibly encrypted), for `storage inspect`.
    pub async fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(self.list(prefix, ListOptions { start_after: None, limit: 0, revision: None }).await?.items)
    }

    /// Whether etcd still has the history after `revision` (not compacted past it): a count-only range read at
    /// `revision + 1`, which etcd refuses with "compacted" otherwise. Compactions by other replicas or an operator
    /// count too; nothing of the history is scanned.
    async fn history_after(&self, revision: Revision) -> Result<bool> {
        let opts = GetOptions::new().with_prefix().with_count_only().with_revision(revision as i64 + 1);
        match self.kv.clone().get(format!("{}/", self.prefix), Some(opts)).await {
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
        let resp = self.kv.clone().get(self.etcd_key(key), None).await.map_err(|e| storage_error(e, 0))?;
        self.seen(resp.header());
        Ok(resp.kvs().first().map(|kv| self.key_value(kv)))
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
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
        let mut kv = self.kv.clone();
        let probe = kv.get(format!("{}/", self.prefix), Some(GetOptions::new().with_prefix().with_count_only()));
        match tokio::time::timeout(Duration::from_secs(2), probe).await {
            Ok(Ok(resp)) => {
                self.seen(resp.header());
                Ok(())
            }
            Ok(Err(e)) => Err(storage_error(e, 0)),
            Err(_) => Err(StorageError::Unavailable("etcd did not answer in 2s".into())),
        }
    }

    fn current_revision(&self) -> Revision {
        self.current.load(Ordering::Acquire)
    }
}

impl EtcdStorage {
    /// Why a compare failed: the key is gone, or it is at another revision.
    fn missed(&self, key: &str, found: Option<&etcd_client::KeyValue>) -> StorageError {
        match found {
            None => StorageError::NotFound { key: key.to_owned() },
            Some(kv) => StorageError::Conflict { key: key.to_owned(), current: rev(kv.mod_revision()) },
        }
    }
}

/// The one etcd watch on the whole prefix that feeds the hub; it resumes after its last revision whenever the
/// stream breaks (etcd restarted, network), so watchers see no gap.
struct Feed {
    watch: WatchClient,
    prefix: String,
    hub: Arc<WatchHub>,
    current: Arc<AtomicU64>,
    compacted: Arc<AtomicU64>,
}

/// Why one etcd watch stream ended (the watch resumes from the last revision).
#[derive(Debug, thiserror::Error)]
enum WatchBroke {
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
    #[error("watch canceled: {0}")]
    Canceled(String),
}

impl Feed {
    async fn run(mut self, mut last: Revision) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.stream(&mut last, &mut backoff).await {
                Ok(()) => tracing::warn!(revision = last, "etcd watch stream ended; resuming"),
                Err(e) => tracing::warn!(revision = last, error = %e, "etcd watch failed; resuming"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// Follows one watch stream until it breaks, publishing its events and progress.
    async fn stream(&mut self, last: &mut Revision, backoff: &mut Duration) -> std::result::Result<(), WatchBroke> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(*last as i64 + 1)
            .with_prev_key()
            .with_progress_notify();
        let mut stream = self.watch.watch(format!("{}/", self.prefix), Some(opts)).await?;
        // Bookmarks need etcd's word that nothing is pending; ask for it when etcd's revision moved without events
        // of ours (writes elsewhere in etcd).
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let msg = tokio::select! {
                msg = stream.message() => msg,
                _ = tick.tick() => {
                    if self.current.load(Ordering::Acquire) > self.hub.progress_revision() {
                        stream.request_progress().await?;
                    }
                    continue;
                }
            };
            let Some(resp) = msg? else { return Ok(()) };
            *backoff = Duration::from_millis(100);
            if resp.canceled() {
                let c = rev(resp.compact_revision());
                if c == 0 {
                    return Err(WatchBroke::Canceled(resp.cancel_reason().to_string()));
                }
                // The events between `last` and the compaction are gone: watchers must re-list.
                tracing::warn!(
                    revision = *last,
                    compacted = c,
                    "etcd history compacted past the watch; watchers expire"
                );
                self.compacted.fetch_max(c, Ordering::AcqRel);
                *last = c - 1;
                self.hub.expire_all(*last);
                return Ok(());
            }
            let header = resp.header().map_or(0, |h| rev(h.revision()));
            let events: Vec<Event> = resp.events().iter().filter_map(|e| to_event(&self.prefix, e)).collect();
            if let Some(newest) = events.last().map(|e| e.revision) {
                *last = newest;
                self.current.fetch_max(newest, Ordering::AcqRel);
                self.hub.publish(events);
            } else if !resp.created() && header > *last {
                // A progress notification: every event up to `header` has been sent.
                *last = header;
                self.current.fetch_max(header, Ordering::AcqRel);
                self.hub.advance(header);
            }
        }
    }
}

fn to_event(prefix: &str, e: &etcd_client::Event) -> Option<Event> {
    let kv = e.kv()?;
    let prev = e.prev_kv().map(|p| to_key_value(prefix, p));
    let key = registry_key(prefix, kv.key());
    let revision = rev(kv.mod_revision());
    Some(match e.event_type() {
        EventType::Put if kv.version() == 1 => {
            Event { kind: EventKind::Created, revision, key, value: Bytes::copy_from_slice(kv.value()), prev: None }
        }
        EventType::Put => {
            Event { kind: EventKind::Updated, revision, key, value: Bytes::copy_from_slice(kv.value()), prev }
        }
        EventType::Delete => {
            let value = prev.as_ref().map(|p| p.value.clone()).unwrap_or_default();
            Event { kind: EventKind::Deleted, revision, key, value, prev }
        }
    })
}

/// Compacts etcd's history like kube-apiserver: every interval, one replica (the one whose transaction on the
/// shared compaction key wins) compacts to the revision recorded one interval earlier, so at least one interval
/// of history stays for watches and paged lists.
struct Compactor {
    kv: KvClient,
    key: String,
    compacted: Arc<AtomicU64>,
}

impl Compactor {
    async fn run(mut self, interval: Duration) {
        let (mut version, mut recorded) = (0i64, 0i64);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.round(version, recorded).await {
                Ok((v, r)) => (version, recorded) = (v, r),
                Err(e) => tracing::warn!(error = %e, "etcd compaction failed"),
            }
        }
    }

    /// One round: records the current revision if nobody else did since `version`; compacts to `recorded`.
    async fn round(&mut self, version: i64, recorded: i64) -> std::result::Result<(i64, i64), etcd_client::Error> {
        let txn = Txn::new()
            .when([Compare::version(self.key.clone(), CompareOp::Equal, version)])
            .and_then([TxnOp::put(self.key.clone(), Vec::<u8>::new(), None)])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let resp = self.kv.txn(txn).await?;
        let current = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            // Another replica compacts this round; follow its count.
            let theirs = match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().map_or(0, |kv| kv.version()),
                _ => 0,
            };
            return Ok((theirs, current));
        }
        if recorded > 0 {
            self.kv.compact(recorded, None).await?;
            self.compacted.fetch_max(rev(recorded), Ordering::AcqRel);
            tracing::info!(revision = recorded, "compacted etcd history");
        }
        Ok((version + 1, current))
    }
}

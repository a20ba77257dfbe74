//! The embedded backend: a redb file, one writer thread with group commit, and a watch hub.
//!
//! Layout: table `objects` maps a key to a 16-byte header (create_revision u64 LE, mod_revision u64 LE) followed by
//! the value; table `meta` holds the global `revision`; table `counts` the number of keys under each prefix
//! (`counts.rs`), written in the same transactions.
//!
//! Writes are queued to a dedicated writer thread. It takes one op, drains whatever else is queued (up to
//! [`MAX_BATCH`]), applies them all in one write transaction (a failed precondition consumes no revision), commits
//! durably, publishes the events to the hub, and only then replies: an acknowledged write has been fsynced.

use super::counts::{self, COUNTS};
use super::hub::{HistoryLimit, WatchHub};
use super::snapshots::{self, Snapshots, Tables};
use super::{Event, EventKind, KeyValue, ListOptions, ListResult, Result, Revision, Storage, StorageError, WatchItem};
use async_trait::async_trait;
use bytes::Bytes;
use redb::{
    AccessGuard, Database, Durability, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, Table,
    TableDefinition,
};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

pub(super) const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(super) const META_REVISION: &str = "revision";
const HEADER: usize = 16;

/// The most ops applied in one write transaction.
pub const MAX_BATCH: usize = 1000;
/// How many ops may wait for the writer.
const QUEUE: usize = 4096;
/// How long a consistent read waits for the writer to publish the revision it read at.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// What the in-memory history (watch replay, continue tokens whose snapshot is gone) keeps.
    pub history: HistoryLimit,
    /// The largest value accepted.
    pub max_value_bytes: usize,
    /// redb's page cache (its own default is 1 GiB, which a server holding a large store fills).
    pub cache_bytes: usize,
    /// How long a chunked list's snapshot is kept after its last page (see `snapshots`); zero pins none.
    pub list_snapshot_idle: Duration,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        // etcd's default request size limit.
        Self {
            history: HistoryLimit::default(),
            max_value_bytes: 1536 * 1024,
            cache_bytes: 128 << 20,
            list_snapshot_idle: snapshots::DEFAULT_IDLE,
        }
    }
}

pub struct EmbeddedStorage {
    db: Arc<Database>,
    hub: Arc<WatchHub>,
    /// The newest committed revision (set by the writer after each commit, before publishing).
    revision: Arc<AtomicU64>,
    ops: Option<mpsc::Sender<Op>>,
    writer: Option<std::thread::JoinHandle<()>>,
    opts: EmbeddedOptions,
    path: PathBuf,
    /// Snapshots pinned by chunked lists (shared with the writer, which prunes them).
    snapshots: Arc<Snapshots>,
}

enum OpKind {
    Create { key: String, value: Bytes },
    Update { key: String, value: Bytes, expected: Revision },
    Delete { key: String, expected: Option<Revision> },
}

struct Op {
    kind: OpKind,
    reply: oneshot::Sender<Result<KeyValue>>,
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> StorageError {
    StorageError::Unavailable(format!("redb: {e}"))
}

fn encode(create_revision: Revision, mod_revision: Revision, value: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER + value.len());
    buf.extend_from_slice(&create_revision.to_le_bytes());
    buf.extend_from_slice(&mod_revision.to_le_bytes());
    buf.extend_from_slice(value);
    buf
}

fn decode(key: &str, raw: &[u8]) -> Result<KeyValue> {
    let corrupt = || StorageError::Internal(format!("stored value of {key} is corrupt ({} bytes)", raw.len()));
    let create = raw.get(0..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).ok_or_else(corrupt)?;
    let modr = raw.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok()).ok_or_else(corrupt)?;
    Ok(KeyValue {
        key: key.to_owned(),
        value: Bytes::copy_from_slice(&raw[HEADER..]),
        create_revision: u64::from_le_bytes(create),
        mod_revision: u64::from_le_bytes(modr),
        stale: false,
    })
}

pub(super) fn read_revision(txn: &ReadTransaction) -> Result<Revision> {
    let meta = txn.open_table(META).map_err(unavailable)?;
    let rev = meta.get(META_REVISION).map_err(unavailable)?.map(|g| g.value());
    Ok(rev.unwrap_or(0))
}

impl EmbeddedStorage {
    /// Opens (creating if needed) the store in `dir` (file `store.redb`) and starts its writer thread.
    pub fn open(dir: &Path, opts: EmbeddedOptions) -> Result<Arc<Self>> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StorageError::Unavailable(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join("store.redb");
        let db = Database::builder().set_cache_size(opts.cache_bytes).create(&path).map_err(|e| match e {
            // redb locks the file (flock) for as long as it is open.
            redb::DatabaseError::DatabaseAlreadyOpen => StorageError::Unavailable(format!(
                "the data directory {} is in use by another process ({} is locked)",
                dir.display(),
                path.display()
            )),
            e => unavailable(format_args!("opening {}: {e}", path.display())),
        })?;

        let txn = db.begin_write().map_err(unavailable)?;
        let revision = {
            txn.open_table(OBJECTS).map_err(unavailable)?;
            let meta = txn.open_table(META).map_err(unavailable)?;
            let rev = meta.get(META_REVISION).map_err(unavailable)?.map(|g| g.value());
            rev.unwrap_or(0)
        };
        counts::build_if_missing(&txn, OBJECTS, META)?;
        txn.commit().map_err(unavailable)?;

        let db = Arc::new(db);
        let hub = Arc::new(WatchHub::new(revision, opts.history));
        let current = Arc::new(AtomicU64::new(revision));
        let (tx, rx) = mpsc::channel(QUEUE);
        let snapshots = Arc::new(Snapshots::new(opts.list_snapshot_idle));
        let writer = Writer {
            db: db.clone(),
            hub: hub.clone(),
            current: current.clone(),
            revision,
            snapshots: snapshots.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("storage-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StorageError::Internal(format!("starting the writer thread: {e}")))?;
        tracing::info!(path = %path.display(), revision, "opened embedded storage");
        Ok(Arc::new(Self { db, hub, revision: current, ops: Some(tx), writer: Some(handle), opts, path, snapshots }))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The watch hub (history ring and watchers).
    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
    }

    async fn submit(&self, kind: OpKind) -> Result<KeyValue> {
        let stopped = || StorageError::Unavailable("the storage writer has stopped".into());
        let ops = self.ops.as_ref().ok_or_else(stopped)?;
        let (reply, rx) = oneshot::channel();
        ops.send(Op { kind, reply }).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    fn check_size(&self, value: &Bytes) -> Result<()> {
        if value.len() > self.opts.max_value_bytes {
            return Err(StorageError::TooLarge { size: value.len(), limit: self.opts.max_value_bytes });
        }
        Ok(())
    }
}

impl Drop for EmbeddedStorage {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and exit; joining releases the file.
        self.snapshots.clear();
        self.ops.take();
        if let Some(handle) = self.writer.take() {
            if handle.join().is_err() {
                tracing::error!("the storage writer thread panicked");
            }
        }
    }
}

struct Writer {
    db: Arc<Database>,
    hub: Arc<WatchHub>,
    current: Arc<AtomicU64>,
    revision: Revision,
    snapshots: Arc<Snapshots>,
}

/// The outcome of one batch: a result per op, the events of the successful ones, and the new revision.
struct Applied {
    results: Vec<Result<KeyValue>>,
    events: Vec<Event>,
    revision: Revision,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        let mut batch: Vec<Op> = Vec::with_capacity(64);
        while let Some(op) = rx.blocking_recv() {
            batch.push(op);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            match self.apply(&batch) {
                Ok(applied) => {
                    if applied.revision != self.revision {
                        self.revision = applied.revision;
                        self.current.store(applied.revision, Ordering::Release);
                        self.hub.publish(applied.events);
                        // Writes are what a pinned snapshot costs (pages held back): drop the expired ones now.
                        self.snapshots.prune();
                    }
                    for (op, result) in batch.drain(..).zip(applied.results) {
                        let _ = op.reply.send(result);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, ops = batch.len(), "storage write batch failed");
                    for op in batch.drain(..) {
                        let _ = op.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Applies `ops` in one transaction and commits it durably (when anything changed).
    fn apply(&self, ops: &[Op]) -> Result<Applied> {
        let mut txn = self.db.begin_write().map_err(unavailable)?;
        txn.set_durability(Durability::Immediate).map_err(unavailable)?;
        let mut rev = self.revision;
        let mut results = Vec::with_capacity(ops.len());
        let mut events = Vec::new();
        {
            let mut objects = txn.open_table(OBJECTS).map_err(unavailable)?;
            let mut key_counts = txn.open_table(COUNTS).map_err(unavailable)?;
            for op in ops {
                let current =
                    objects.get(op.kind.key()).map_err(unavailable)?.map(|raw| decode(op.kind.key(), raw.value()));
                let current = match current.transpose() {
                    Ok(c) => c,
                    Err(e) => {
                        results.push(Err(e));
                        continue;
                    }
                };
                let result = apply_op(&mut objects, &mut key_counts, &op.kind, current, &mut rev, &mut events)?;
                results.push(result);
            }
            if rev != self.revision {
                let mut meta = txn.open_table(META).map_err(unavailable)?;
                meta.insert(META_REVISION, rev).map_err(unavailable)?;
            }
        }
        if rev == self.revision {
            txn.abort().map_err(unavailable)?;
        } else {
            txn.commit().map_err(unavailable)?;
        }
        Ok(Applied { results, events, revision: rev })
    }
}

/// One operation of a write transaction on `current` (the key's object, if any): its result, the store's revision
/// moved on and its event recorded when it changed something. An error of the store itself fails the whole batch.
fn apply_op(
    objects: &mut Table<&str, &[u8]>,
    key_counts: &mut Table<&str, u64>,
    kind: &OpKind,
    current: Option<KeyValue>,
    rev: &mut Revision,
    events: &mut Vec<Event>,
) -> Result<Result<KeyValue>> {
    Ok(match (kind, current) {
        (OpKind::Create { key, .. }, Some(_)) => Err(StorageError::AlreadyExists { key: key.clone() }),
        (OpKind::Create { key, value }, None) => {
            *rev += 1;
            objects.insert(key.as_str(), encode(*rev, *rev, value).as_slice()).map_err(unavailable)?;
            counts::add(key_counts, key, 1)?;
            events.push(Event {
                kind: EventKind::Created,
                revision: *rev,
                key: key.clone(),
                value: value.clone(),
                prev: None,
            });
            Ok(KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: *rev,
                mod_revision: *rev,
                stale: false,
            })
        }
        (OpKind::Update { key, .. } | OpKind::Delete { key, .. }, None) => {
            Err(StorageError::NotFound { key: key.clone() })
        }
        (OpKind::Update { key, expected, .. }, Some(prev)) if prev.mod_revision != *expected => {
            Err(StorageError::Conflict { key: key.clone(), current: prev.mod_revision })
        }
        (OpKind::Update { key, value, .. }, Some(prev)) => {
            *rev += 1;
            objects.insert(key.as_str(), encode(prev.create_revision, *rev, value).as_slice()).map_err(unavailable)?;
            let kv = KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: prev.create_revision,
                mod_revision: *rev,
                stale: false,
            };
            events.push(Event {
                kind: EventKind::Updated,
                revision: *rev,
                key: key.clone(),
                value: value.clone(),
                prev: Some(prev),
            });
            Ok(kv)
        }
        (OpKind::Delete { key, expected: Some(expected) }, Some(prev)) if prev.mod_revision != *expected => {
            Err(StorageError::Conflict { key: key.clone(), current: prev.mod_revision })
        }
        (OpKind::Delete { key, .. }, Some(prev)) => {
            *rev += 1;
            objects.remove(key.as_str()).map_err(unavailable)?;
            counts::add(key_counts, key, -1)?;
            let deleted = KeyValue { mod_revision: *rev, ..prev.clone() };
            events.push(Event {
                kind: EventKind::Deleted,
                revision: *rev,
                key: key.clone(),
                value: prev.value.clone(),
                prev: Some(prev),
            });
            Ok(deleted)
        }
    })
}

impl OpKind {
    fn key(&self) -> &str {
        match self {
            OpKind::Create { key, .. } | OpKind::Update { key, .. } | OpKind::Delete { key, .. } => key,
        }
    }
}

/// The value at the old revision of every key under the prefix changed since: `None` when it did not exist then.
type Overlay = BTreeMap<String, Option<KeyValue>>;

fn build_overlay(history: &[Arc<Event>]) -> Overlay {
    let mut overlay = Overlay::new();
    for ev in history {
        // The earliest change after the old revision carries the value at it.
        overlay.entry(ev.key.clone()).or_insert_with(|| ev.prev.clone());
    }
    overlay
}

/// A key and its raw value, as a range over `objects` yields them.
type StoredEntry = (AccessGuard<'static, &'static str>, AccessGuard<'static, &'static [u8]>);

/// Reads a page of keys under `prefix` from `objects`, with `overlay` (if any) replacing the values of the keys
/// it holds.
/// `known_remaining`, the number of keys under the prefix after `start_after` when a page before counted them,
/// spares counting the rest of the collection.
fn list_page(
    objects: &ReadOnlyTable<&'static str, &'static [u8]>,
    prefix: &str,
    start_after: Option<&str>,
    (limit, max_bytes): (usize, usize),
    overlay: &Overlay,
    known_remaining: Option<u64>,
) -> Result<(Vec<KeyValue>, u64)> {
    let lower = match start_after {
        Some(s) if s >= prefix => Bound::Excluded(s),
        _ => Bound::Included(prefix),
    };
    let mut db_iter = objects.range::<&str>((lower, Bound::Unbounded)).map_err(unavailable)?;
    // The next stored entry under the prefix whose key the overlay does not replace.
    let mut next_db = || -> Result<Option<StoredEntry>> {
        for entry in db_iter.by_ref() {
            let (k, v) = entry.map_err(unavailable)?;
            let key = k.value();
            if !key.starts_with(prefix) {
                return Ok(None);
            }
            if !overlay.contains_key(key) {
                return Ok(Some((k, v)));
            }
        }
        Ok(None)
    };
    let mut old = overlay
        .range::<str, _>((lower, Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(prefix))
        .filter_map(|(_, v)| v.as_ref())
        .peekable();

    let (mut items, mut bytes) = (Vec::new(), 0);
    let mut remaining = 0u64;
    let mut db_head = next_db()?;
    loop {
        let from_db = match (&db_head, old.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((k, _)), Some(kv)) => k.value() < kv.key.as_str(),
        };
        let full = (limit != 0 && items.len() >= limit) || (max_bytes != 0 && bytes >= max_bytes);
        if full && known_remaining.is_some() {
            break;
        }
        if from_db {
            if full {
                remaining += 1;
            } else if let Some((k, v)) = &db_head {
                let kv = decode(k.value(), v.value())?;
                bytes += kv.value.len();
                items.push(kv);
            }
            db_head = next_db()?;
        } else if let Some(kv) = old.next() {
            if full {
                remaining += 1;
            } else {
                bytes += kv.value.len();
                items.push(kv.clone());
            }
        }
    }
    let remaining = known_remaining.map_or(remaining, |known| known.saturating_sub(items.len() as u64));
    Ok((items, remaining))
}

#[async_trait]
impl Storage for EmbeddedStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let objects = txn.open_table(OBJECTS).map_err(unavailable)?;
        match objects.get(key).map_err(unavailable)? {
            Some(raw) => decode(key, raw.value()).map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let start_after = opts.start_after.as_deref();
        // A continue page whose first page pinned its snapshot reads that snapshot: no history to replay.
        let pinned = opts.revision.and_then(|r| self.snapshots.get(r, prefix, start_after).map(|s| (r, s)));
        // `exact`: the table is the store as of `revision` (not a later state with an overlay), so it may be pinned.
        let (tables, revision, overlay, known_remaining, exact) = match pinned {
            Some((r, snap)) => (snap.tables, r, Overlay::new(), snap.remaining_after_start, true),
            None => {
                let txn = self.db.begin_read().map_err(unavailable)?;
                let snapshot = read_revision(&txn)?;
                let (overlay, revision) = match opts.revision {
                    Some(r) if r < snapshot => {
                        // Every event up to the snapshot must be in the ring before it can be rolled back to `r`.
                        tokio::time::timeout(PUBLISH_TIMEOUT, self.hub.wait_published(snapshot)).await.map_err(
                            |_| StorageError::Unavailable(format!("revision {snapshot} was not published in time")),
                        )?;
                        let history = self.hub.history_between(r, snapshot, prefix)?;
                        (build_overlay(&history), r)
                    }
                    _ => (Overlay::new(), snapshot),
                };
                let tables = Tables {
                    objects: txn.open_table(OBJECTS).map_err(unavailable)?,
                    counts: txn.open_table(COUNTS).map_err(unavailable)?,
                };
                (Arc::new(tables), revision, overlay, None, revision == snapshot)
            }
        };
        // A first page read at `revision` knows how many keys it starts before from the counts of that snapshot.
        let from_start = start_after.is_none_or(|s| s < prefix);
        let known_remaining = match known_remaining {
            None if exact && from_start => counts::count(&tables.counts, prefix)?,
            known => known,
        };
        let pinned_tables = tables.clone();
        let (page_prefix, start, limits) = (prefix.to_owned(), opts.start_after.clone(), (opts.limit, opts.max_bytes));
        let (items, remaining) = tokio::task::spawn_blocking(move || {
            list_page(&pinned_tables.objects, &page_prefix, start.as_deref(), limits, &overlay, known_remaining)
        })
        .await
        .map_err(|e| StorageError::Internal(format!("list task failed: {e}")))??;
        // A page with more to come pins what it read, for the pages after it.
        if let (Some(last), true, true) = (items.last(), remaining > 0, exact) {
            self.snapshots.pin(revision, &tables, prefix, &last.key, remaining);
        }
        Ok(ListResult { items, revision, more: remaining > 0, remaining })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        self.check_size(&value)?;
        self.submit(OpKind::Create { key: key.to_owned(), value }).await
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        self.check_size(&value)?;
        self.submit(OpKind::Update { key: key.to_owned(), value, expected }).await
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        self.submit(OpKind::Delete { key: key.to_owned(), expected }).await
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<mpsc::Receiver<WatchItem>> {
        self.hub.watch(prefix, after)
    }

    fn progress_revision(&self) -> Revision {
        self.hub.progress_revision()
    }

    fn current_revision(&self) -> Revision {
        self.revision.load(Ordering::Acquire)
    }
}

impl EmbeddedStorage {
    /// Every stored key under `prefix`, with its revisions and its value exactly as stored (possibly encrypted),
    /// read from the store in `dir` without starting a writer: for offline tools (`storage inspect`), while the
    /// server is stopped. A store that was not shut down cleanly is repaired by redb first (as the server would do).
    pub fn scan(dir: &Path, prefix: &str) -> Result<Vec<KeyValue>> {
        Self::read_offline(dir, |txn| {
            let objects = match txn.open_table(OBJECTS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(unavailable(e)),
            };
            let mut out = Vec::new();
            for entry in objects.range::<&str>(prefix..).map_err(unavailable)? {
                let (k, v) = entry.map_err(unavailable)?;
                if !k.value().starts_with(prefix) {
                    break;
                }
                out.push(decode(k.value(), v.value())?);
            }
            Ok(out)
        })
    }

    /// `read` given one read transaction of the store in `dir`, opened without a writer (see [`Self::scan`]).
    pub(super) fn read_offline<T>(dir: &Path, read: impl FnOnce(ReadTransaction) -> Result<T>) -> Result<T> {
        let path = dir.join("store.redb");
        if !path.is_file() {
            return Err(StorageError::Unavailable(format!("no store at {}", path.display())));
        }
        let in_use =
            || StorageError::Unavailable(format!("{} is in use by a running server; stop it first", path.display()));
        match redb::ReadOnlyDatabase::open(&path) {
            Ok(db) => read(db.begin_read().map_err(unavailable)?),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(in_use()),
            Err(redb::DatabaseError::RepairAborted) => {
                // Not shut down cleanly: only a writable open repairs it (data is unchanged).
                let db = match Database::open(&path) {
                    Ok(db) => db,
                    Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(in_use()),
                    Err(e) => return Err(unavailable(format_args!("opening {}: {e}", path.display()))),
                };
                read(db.begin_read().map_err(unavailable)?)
            }
            Err(e) => Err(unavailable(format_args!("opening {}: {e}", path.display()))),
        }
    }

    /// One read transaction of the whole store: one revision, consistent across tables, that writers do not wait
    /// for (redb keeps the pages it reads until it ends). For online snapshots.
    pub(super) fn begin_read(&self) -> Result<ReadTransaction> {
        self.db.begin_read().map_err(unavailable)
    }
}

#[cfg(test)]
#[path = "embedded_tests.rs"]
mod tests;

//! The embedded backend: a redb file, one writer thread with group commit, and a watch hub.
//!
//! Layout: table `objects` maps a key to a 16-byte header (create_revision u64 LE, mod_revision u64 LE) followed by
//! the value; table `meta` holds the global `revision`.
//!
//! Writes are queued to a dedicated writer thread. It takes one op, drains whatever else is queued (up to
//! [`MAX_BATCH`]), applies them all in one write transaction (a failed precondition consumes no revision), commits
//! durably, publishes the events to the hub, and only then replies: an acknowledged write has been fsynced.

use super::hub::{WatchHub, DEFAULT_HISTORY};
use super::{Event, EventKind, KeyValue, ListOptions, ListResult, Result, Revision, Storage, StorageError, WatchItem};
use async_trait::async_trait;
use bytes::Bytes;
use redb::{
    AccessGuard, Database, Durability, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const HEADER: usize = 16;

/// The most ops applied in one write transaction.
pub const MAX_BATCH: usize = 1000;
/// How many ops may wait for the writer.
const QUEUE: usize = 4096;
/// How long a consistent read waits for the writer to publish the revision it read at.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// How many events the in-memory history (watch replay, consistent paged lists) keeps.
    pub history: usize,
    /// The largest value accepted.
    pub max_value_bytes: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        // etcd's default request size limit.
        Self { history: DEFAULT_HISTORY, max_value_bytes: 1536 * 1024 }
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

fn unavailable(e: impl std::fmt::Display) -> StorageError {
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

fn read_revision(txn: &ReadTransaction) -> Result<Revision> {
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
        let db = Database::create(&path).map_err(|e| unavailable(format_args!("opening {}: {e}", path.display())))?;

        let txn = db.begin_write().map_err(unavailable)?;
        let revision = {
            txn.open_table(OBJECTS).map_err(unavailable)?;
            let meta = txn.open_table(META).map_err(unavailable)?;
            let rev = meta.get(META_REVISION).map_err(unavailable)?.map(|g| g.value());
            rev.unwrap_or(0)
        };
        txn.commit().map_err(unavailable)?;

        let db = Arc::new(db);
        let hub = Arc::new(WatchHub::new(revision, opts.history));
        let current = Arc::new(AtomicU64::new(revision));
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = Writer { db: db.clone(), hub: hub.clone(), current: current.clone(), revision };
        let handle = std::thread::Builder::new()
            .name("storage-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StorageError::Internal(format!("starting the writer thread: {e}")))?;
        tracing::info!(path = %path.display(), revision, "opened embedded storage");
        Ok(Arc::new(Self { db, hub, revision: current, ops: Some(tx), writer: Some(handle), opts, path }))
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
                let result = match (&op.kind, current) {
                    (OpKind::Create { key, .. }, Some(_)) => Err(StorageError::AlreadyExists { key: key.clone() }),
                    (OpKind::Create { key, value }, None) => {
                        rev += 1;
                        objects.insert(key.as_str(), encode(rev, rev, value).as_slice()).map_err(unavailable)?;
                        events.push(Event {
                            kind: EventKind::Created,
                            revision: rev,
                            key: key.clone(),
                            value: value.clone(),
                            prev: None,
                        });
                        Ok(KeyValue {
                            key: key.clone(),
                            value: value.clone(),
                            create_revision: rev,
                            mod_revision: rev,
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
                        rev += 1;
                        objects
                            .insert(key.as_str(), encode(prev.create_revision, rev, value).as_slice())
                            .map_err(unavailable)?;
                        let kv = KeyValue {
                            key: key.clone(),
                            value: value.clone(),
                            create_revision: prev.create_revision,
                            mod_revision: rev,
                            stale: false,
                        };
                        events.push(Event {
                            kind: EventKind::Updated,
                            revision: rev,
                            key: key.clone(),
                            value: value.clone(),
                            prev: Some(prev),
                        });
                        Ok(kv)
                    }
                    (OpKind::Delete { key, expected: Some(expected) }, Some(prev))
                        if prev.mod_revision != *expected =>
                    {
                        Err(StorageError::Conflict { key: key.clone(), current: prev.mod_revision })
                    }
                    (OpKind::Delete { key, .. }, Some(prev)) => {
                        rev += 1;
                        objects.remove(key.as_str()).map_err(unavailable)?;
                        let deleted = KeyValue { mod_revision: rev, ..prev.clone() };
                        events.push(Event {
                            kind: EventKind::Deleted,
                            revision: rev,
                            key: key.clone(),
                            value: prev.value.clone(),
                            prev: Some(prev),
                        });
                        Ok(deleted)
                    }
                };
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
fn list_page(
    objects: &ReadOnlyTable<&'static str, &'static [u8]>,
    prefix: &str,
    start_after: Option<&str>,
    limit: usize,
    overlay: &Overlay,
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

    let mut items = Vec::new();
    let mut remaining = 0u64;
    let mut db_head = next_db()?;
    loop {
        let from_db = match (&db_head, old.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((k, _)), Some(kv)) => k.value() < kv.key.as_str(),
        };
        let full = limit != 0 && items.len() >= limit;
        if from_db {
            if full {
                remaining += 1;
            } else if let Some((k, v)) = &db_head {
                items.push(decode(k.value(), v.value())?);
            }
            db_head = next_db()?;
        } else if let Some(kv) = old.next() {
            if full {
                remaining += 1;
            } else {
                items.push(kv.clone());
            }
        }
    }
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
        let txn = self.db.begin_read().map_err(unavailable)?;
        let snapshot = read_revision(&txn)?;
        let (overlay, revision) = match opts.revision {
            Some(r) if r < snapshot => {
                // Every event up to the snapshot must be in the ring before it can be rolled back to `r`.
                tokio::time::timeout(PUBLISH_TIMEOUT, self.hub.wait_published(snapshot))
                    .await
                    .map_err(|_| StorageError::Unavailable(format!("revision {snapshot} was not published in time")))?;
                let history = self.hub.history_between(r, snapshot, prefix)?;
                (build_overlay(&history), r)
            }
            _ => (Overlay::new(), snapshot),
        };
        let objects = txn.open_table(OBJECTS).map_err(unavailable)?;
        let prefix = prefix.to_owned();
        let (items, remaining) = tokio::task::spawn_blocking(move || {
            list_page(&objects, &prefix, opts.start_after.as_deref(), opts.limit, &overlay)
        })
        .await
        .map_err(|e| StorageError::Internal(format!("list task failed: {e}")))??;
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
        let path = dir.join("store.redb");
        if !path.is_file() {
            return Err(StorageError::Unavailable(format!("no store at {}", path.display())));
        }
        let in_use =
            || StorageError::Unavailable(format!("{} is in use by a running server; stop it first", path.display()));
        let read = |txn: ReadTransaction| -> Result<Vec<KeyValue>> {
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
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn opts(history: usize) -> EmbeddedOptions {
        EmbeddedOptions { history, max_value_bytes: 1024 }
    }

    fn open(dir: &Path, history: usize) -> Arc<EmbeddedStorage> {
        EmbeddedStorage::open(dir, opts(history)).expect("open")
    }

    fn b(s: &str) -> Bytes {
        Bytes::from(s.to_owned())
    }

    fn page(start_after: Option<&str>, limit: usize, revision: Option<Revision>) -> ListOptions {
        ListOptions { start_after: start_after.map(str::to_owned), limit, revision }
    }

    fn keys(r: &ListResult) -> Vec<&str> {
        r.items.iter().map(|kv| kv.key.as_str()).collect()
    }

    async fn next_event(rx: &mut mpsc::Receiver<WatchItem>) -> Arc<Event> {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(WatchItem::Event(e))) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn create_get_update_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 100);
        assert_eq!(s.current_revision(), 0);
        assert_eq!(s.get("/a").await, Ok(None));

        let a = s.create("/a", b("1")).await.expect("create");
        assert_eq!((a.create_revision, a.mod_revision), (1, 1));
        assert_eq!(s.create("/a", b("x")).await, Err(StorageError::AlreadyExists { key: "/a".into() }));
        assert_eq!(s.get("/a").await, Ok(Some(a.clone())));

        let a2 = s.update("/a", b("2"), 1).await.expect("update");
        assert_eq!((a2.create_revision, a2.mod_revision, a2.value.clone()), (1, 2, b("2")));
        assert_eq!(s.update("/a", b("3"), 1).await, Err(StorageError::Conflict { key: "/a".into(), current: 2 }));
        assert_eq!(s.update("/nope", b("3"), 1).await, Err(StorageError::NotFound { key: "/nope".into() }));
        assert_eq!(s.delete("/a", Some(1)).await, Err(StorageError::Conflict { key: "/a".into(), current: 2 }));
        // Failed preconditions consume no revision.
        assert_eq!(s.current_revision(), 2);

        let big = Bytes::from(vec![0u8; 1025]);
        assert_eq!(s.create("/big", big).await, Err(StorageError::TooLarge { size: 1025, limit: 1024 }));

        let d = s.delete("/a", Some(2)).await.expect("delete");
        assert_eq!((d.create_revision, d.mod_revision, d.value.clone()), (1, 3, b("2")));
        assert_eq!(s.get("/a").await, Ok(None));
        assert_eq!(s.delete("/a", None).await, Err(StorageError::NotFound { key: "/a".into() }));

        let a = s.create("/a", b("again")).await.expect("recreate");
        assert_eq!((a.create_revision, a.mod_revision), (4, 4));
        let d = s.delete("/a", None).await.expect("unconditional delete");
        assert_eq!(d.mod_revision, 5);
        assert_eq!(s.current_revision(), 5);
        assert_eq!(s.progress_revision(), 5);
    }

    #[tokio::test]
    async fn revisions_continue_after_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = open(dir.path(), 100);
            s.create("/a", b("1")).await.expect("create");
            s.create("/b", b("1")).await.expect("create");
            s.update("/a", b("2"), 1).await.expect("update");
        }
        let s = open(dir.path(), 100);
        assert_eq!(s.current_revision(), 3);
        assert_eq!(s.progress_revision(), 3);
        let a = s.get("/a").await.expect("get").expect("present");
        assert_eq!((a.create_revision, a.mod_revision, a.value), (1, 3, b("2")));
        let c = s.create("/c", b("1")).await.expect("create");
        assert_eq!(c.mod_revision, 4);
        // History before the reopen is gone, but watching from the open revision works.
        assert!(matches!(s.watch("/", 2).await, Err(StorageError::Expired { requested: 2, oldest: 3 })));
        let mut rx = s.watch("/", 3).await.expect("watch");
        assert_eq!(next_event(&mut rx).await.revision, 4);
    }

    #[tokio::test]
    async fn list_paging() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 100);
        for k in ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e", "/q/a", "/o/z"] {
            s.create(k, b(k)).await.expect("create");
        }
        let all = s.list("/p/", page(None, 0, None)).await.expect("list");
        assert_eq!(keys(&all), ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"]);
        assert_eq!((all.revision, all.more, all.remaining), (7, false, 0));
        assert_eq!(all.items[2].value, b("/p/c"));

        let p1 = s.list("/p/", page(None, 2, None)).await.expect("list");
        assert_eq!(keys(&p1), ["/p/a", "/p/b"]);
        assert_eq!((p1.more, p1.remaining), (true, 3));
        let p2 = s.list("/p/", page(Some("/p/b"), 2, None)).await.expect("list");
        assert_eq!(keys(&p2), ["/p/c", "/p/d"]);
        assert_eq!((p2.more, p2.remaining), (true, 1));
        let p3 = s.list("/p/", page(Some("/p/d"), 2, None)).await.expect("list");
        assert_eq!(keys(&p3), ["/p/e"]);
        assert_eq!((p3.more, p3.remaining), (false, 0));
        let exact = s.list("/p/", page(None, 5, None)).await.expect("list");
        assert_eq!((exact.items.len(), exact.more), (5, false));

        // A continue key before the prefix starts at the prefix; one after it yields nothing.
        let before = s.list("/p/", page(Some("/a"), 0, None)).await.expect("list");
        assert_eq!(before.items.len(), 5);
        let after = s.list("/p/", page(Some("/z"), 0, None)).await.expect("list");
        assert!(after.items.is_empty() && !after.more);
        let none = s.list("/nothing/", page(None, 0, None)).await.expect("list");
        assert!(none.items.is_empty());
        let everything = s.list("", page(None, 0, None)).await.expect("list");
        assert_eq!(everything.items.len(), 7);
    }

    #[tokio::test]
    async fn consistent_list_at_old_revision() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 100);
        for k in ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"] {
            s.create(k, b("old")).await.expect("create");
        }
        s.create("/q/x", b("other")).await.expect("create");

        let p1 = s.list("/p/", page(None, 2, None)).await.expect("list");
        assert_eq!(keys(&p1), ["/p/a", "/p/b"]);
        assert_eq!((p1.revision, p1.remaining), (6, 3));

        s.update("/p/c", b("new"), 3).await.expect("update");
        s.delete("/p/d", None).await.expect("delete");
        s.create("/p/bb", b("new")).await.expect("create");
        s.create("/p/f", b("new")).await.expect("create");
        s.update("/p/a", b("new"), 1).await.expect("update");
        s.update("/p/e", b("new"), 5).await.expect("update");
        s.delete("/p/e", None).await.expect("delete");
        s.create("/p/e", b("newer")).await.expect("create");
        s.create("/q/y", b("other")).await.expect("create");

        let p2 = s.list("/p/", page(Some("/p/b"), 2, Some(p1.revision))).await.expect("list");
        assert_eq!(p2.revision, 6);
        assert_eq!(keys(&p2), ["/p/c", "/p/d"]);
        assert!(p2.items.iter().all(|kv| kv.value == b("old")));
        assert_eq!((p2.items[0].create_revision, p2.items[0].mod_revision), (3, 3));
        assert_eq!((p2.more, p2.remaining), (true, 1));
        let p3 = s.list("/p/", page(Some("/p/d"), 2, Some(6))).await.expect("list");
        assert_eq!(keys(&p3), ["/p/e"]);
        assert_eq!((p3.items[0].value.clone(), p3.items[0].mod_revision), (b("old"), 5));
        assert!(!p3.more);
        let whole = s.list("/p/", page(None, 0, Some(6))).await.expect("list");
        assert_eq!(keys(&whole), ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"]);

        let latest = s.list("/p/", page(None, 0, None)).await.expect("list");
        assert_eq!(latest.revision, 15);
        assert_eq!(keys(&latest), ["/p/a", "/p/b", "/p/bb", "/p/c", "/p/e", "/p/f"]);
        // A revision at or beyond the snapshot reads the latest.
        let same = s.list("/p/", page(None, 0, Some(15))).await.expect("list");
        assert_eq!(keys(&same), keys(&latest));
        // An intermediate revision: after the delete of d (8) and the create of bb (9).
        let mid = s.list("/p/", page(None, 0, Some(9))).await.expect("list");
        assert_eq!(keys(&mid), ["/p/a", "/p/b", "/p/bb", "/p/c", "/p/e"]);
        assert_eq!(mid.items[3].value, b("new"));
    }

    #[tokio::test]
    async fn expired_after_history_overflows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 10);
        for i in 0..30 {
            s.create(&format!("/k/{i:02}"), b("v")).await.expect("create");
        }
        assert_eq!(s.hub().compacted_revision(), 20);
        let err = s.list("/k/", page(None, 5, Some(5))).await.err();
        assert_eq!(err, Some(StorageError::Expired { requested: 5, oldest: 20 }));
        assert!(matches!(s.watch("/k/", 19).await, Err(StorageError::Expired { requested: 19, oldest: 20 })));
        let ok = s.list("/k/", page(None, 0, Some(25))).await.expect("list");
        assert_eq!((ok.items.len(), ok.revision), (25, 25));
        let mut rx = s.watch("/k/", 20).await.expect("watch");
        assert_eq!(next_event(&mut rx).await.revision, 21);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_replay_and_live_without_gaps() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 100_000);
        s.create("/w/first", b("v")).await.expect("create");
        s.create("/other/x", b("v")).await.expect("create");
        let mut from_start = s.watch("/w/", 0).await.expect("watch");

        let writers: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                tokio::spawn(async move {
                    for i in 0..100 {
                        let key = format!("/w/{t}/{i}");
                        let kv = s.create(&key, b("1")).await.expect("create");
                        s.update(&key, b("2"), kv.mod_revision).await.expect("update");
                    }
                })
            })
            .collect();
        // Start another watcher mid-way, from a revision that is partly replayed.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mid = s.progress_revision();
        let mut from_mid = s.watch("/w/", mid).await.expect("watch");
        for w in writers {
            w.await.expect("writer");
        }
        s.delete("/w/first", None).await.expect("delete");
        let end = s.current_revision();
        assert_eq!(end, 2 + 8 * 100 * 2 + 1);

        let mut expected = 1;
        while expected <= end {
            let e = next_event(&mut from_start).await;
            if expected == 2 {
                expected = 3; // "/other/x" is outside the prefix.
            }
            assert_eq!(e.revision, expected);
            expected += 1;
        }
        let mut expected = mid + 1;
        while expected <= end {
            assert_eq!(next_event(&mut from_mid).await.revision, expected);
            expected += 1;
        }
        let last = next_event(&mut s.watch("/w/first", end - 1).await.expect("watch")).await;
        assert_eq!(last.kind, EventKind::Deleted);
        assert_eq!(last.value, b("v"));
        assert_eq!(last.prev.as_ref().map(|p| p.mod_revision), Some(1));
        assert!(from_start.try_recv().is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watcher_that_never_reads_does_not_block_writers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 100);
        let mut stuck = s.watch("/", 0).await.expect("watch");
        let mut live = s.watch("/", 0).await.expect("watch");
        let reader = tokio::spawn(async move {
            let mut n = 0;
            while let Some(item) = live.recv().await {
                match item {
                    WatchItem::Event(_) => n += 1,
                    WatchItem::Error(e) => panic!("live watcher failed: {e}"),
                }
                if n == 3000 {
                    break;
                }
            }
            n
        });
        let writers: Vec<_> = (0..30)
            .map(|t| {
                let s = s.clone();
                tokio::spawn(async move {
                    for i in 0..100 {
                        s.create(&format!("/k/{t}/{i}"), b("v")).await.expect("create");
                    }
                })
            })
            .collect();
        let all = async {
            for w in writers {
                w.await.expect("writer");
            }
        };
        tokio::time::timeout(Duration::from_secs(60), all).await.expect("writers finished");
        assert_eq!(tokio::time::timeout(Duration::from_secs(10), reader).await.expect("reader").expect("join"), 3000);

        let mut events = 0;
        let mut error = None;
        while let Some(item) = stuck.recv().await {
            match item {
                WatchItem::Event(_) => events += 1,
                WatchItem::Error(e) => error = Some(e),
            }
        }
        assert_eq!(events, crate::storage::hub::DEFAULT_WATCH_BUFFER);
        assert!(matches!(error, Some(StorageError::Expired { .. })), "{error:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_gives_distinct_revisions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 100_000);
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let s = s.clone();
                tokio::spawn(async move {
                    let mut revs = Vec::new();
                    for i in 0..50 {
                        revs.push(s.create(&format!("/g/{t}/{i}"), b("v")).await.expect("create").mod_revision);
                    }
                    // Conflicting creates in the same batches fail without consuming revisions.
                    assert!(s.create(&format!("/g/{t}/0"), b("v")).await.is_err());
                    revs
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for t in tasks {
            for r in t.await.expect("task") {
                assert!(seen.insert(r), "revision {r} handed out twice");
            }
        }
        assert_eq!(seen.len(), 3200);
        assert_eq!(seen.iter().max(), Some(&3200));
        assert_eq!(s.current_revision(), 3200);
        let listed = s.list("/g/", page(None, 0, None)).await.expect("list");
        assert_eq!(listed.items.len(), 3200);
    }

    /// `cargo test --release --lib bench_creates -- --ignored --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn bench_creates() {
        const TASKS: usize = 64;
        const TOTAL: usize = 20_000;
        let base = std::env::var_os("BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let s = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let value = Bytes::from(vec![b'x'; 1024]);
        let start = std::time::Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (s, value) = (s.clone(), value.clone());
                tokio::spawn(async move {
                    for i in (t..TOTAL).step_by(TASKS) {
                        s.create(&format!("/registry/bench/ns/obj-{i}"), value.clone()).await.expect("create");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(s.current_revision(), TOTAL as u64);
        println!("{TOTAL} durable creates by {TASKS} tasks in {secs:.2}s: {:.0} creates/s", TOTAL as f64 / secs);
    }
}

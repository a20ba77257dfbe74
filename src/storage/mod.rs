//! The storage layer: a key/value store with one global, monotonically increasing revision (like etcd's).
//!
//! The registry above stores serialized objects under `/registry/<group>/<resource>/[<namespace>/]<name>` and uses
//! the revision of the last modification as the object's resourceVersion. Nothing here knows what an object is.

pub mod backup;
mod counts;
pub mod embedded;
pub mod encryption;
pub mod etcd;
mod hub;
pub mod inspect;
pub mod snapshots;

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;

pub use hub::{HistoryLimit, WatchHub};

/// A global revision. Every successful write (create, update, delete) takes the next one.
pub type Revision = u64;

/// One stored value with the revisions that created and last modified it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// The stored encoding is out of date (an older encryption key or provider, or unencrypted where encryption is
    /// configured): a no-op rewrite must write it again. Backends set it false; transformers set it.
    pub stale: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Updated,
    Deleted,
}

/// A change, as the watch stream and the history ring carry it.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: EventKind,
    /// The revision of this change (for a delete, the revision of the deletion itself).
    pub revision: Revision,
    pub key: String,
    /// The value after the change; for `Deleted` the last value before deletion (so watchers can send it).
    pub value: Bytes,
    /// The value before the change (`None` for `Created`).
    pub prev: Option<KeyValue>,
}

/// What a watcher receives.
#[derive(Clone, Debug)]
pub enum WatchItem {
    Event(Arc<Event>),
    /// The watch cannot go on (it fell too far behind, or the backend failed); the stream ends after this.
    Error(StorageError),
}

#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// Only keys strictly greater than this (the continue position).
    pub start_after: Option<String>,
    /// At most this many items; 0 means no limit.
    pub limit: usize,
    /// Read as of this revision (a consistent continuation); `None` means the latest.
    pub revision: Option<Revision>,
    /// Stop once the values read reach this many bytes (the item that reaches it included), as `limit` stops:
    /// `more` and `remaining` say what follows. 0 means no limit. A store that cannot tell may return more.
    pub max_bytes: usize,
}

pub struct ListResult {
    pub items: Vec<KeyValue>,
    /// The revision the list was read at.
    pub revision: Revision,
    /// True when more keys under the prefix follow the last returned item.
    pub more: bool,
    /// How many keys follow the returned page (when `more`).
    pub remaining: u64,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum StorageError {
    #[error("key {key} not found")]
    NotFound { key: String },
    #[error("key {key} already exists")]
    AlreadyExists { key: String },
    /// Compare-and-swap failed: the stored mod_revision is not the expected one.
    #[error("key {key} has been modified (now at revision {current})")]
    Conflict { key: String, current: Revision },
    /// The requested revision is older than the retained history (compacted).
    #[error("revision {requested} is too old; the oldest available is {oldest}")]
    Expired { requested: Revision, oldest: Revision },
    #[error("value of {size} bytes exceeds the storage limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Stored values that cannot be read back: they do not decrypt with the configured keys, or the layer above
    /// cannot decode them. Each names its key, so that it can be found and removed.
    #[error("{}", corrupt_message(.0))]
    Corrupt(Vec<CorruptValue>),
    #[error("storage error: {0}")]
    Internal(String),
}

/// One stored value that cannot be read back, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptValue {
    pub key: String,
    pub message: String,
}

impl StorageError {
    /// One corrupt value.
    pub fn corrupt(key: &str, message: impl Into<String>) -> Self {
        StorageError::Corrupt(vec![CorruptValue { key: key.to_string(), message: message.into() }])
    }
}

fn corrupt_message(values: &[CorruptValue]) -> String {
    let each: Vec<String> = values.iter().map(|v| format!("{}: {}", v.key, v.message)).collect();
    format!("stored values cannot be read: {}", each.join("; "))
}

pub type Result<T> = std::result::Result<T, StorageError>;

#[async_trait]
pub trait Storage: Send + Sync + 'static {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Keys under `prefix` in ascending key order.
    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult>;

    /// Creates `key`; `AlreadyExists` if present. Returns the stored value with its revisions.
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue>;

    /// Replaces `key` if its mod_revision is `expected` (`Conflict` otherwise, `NotFound` if absent).
    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue>;

    /// Deletes `key` (if `expected` is set, only at that mod_revision). Returns the deleted value, with
    /// `mod_revision` set to the revision of the deletion.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue>;

    /// Events under `prefix` with revision > `after`, in revision order, then live ones.
    /// `Expired` when `after` is older than the retained history.
    async fn watch(&self, prefix: &str, after: Revision) -> Result<tokio::sync::mpsc::Receiver<WatchItem>>;

    /// How many keys are under `prefix` now: what a LIST of it would return. The default reads one key and the
    /// count of those after it; a store that keeps counts answers from them.
    async fn count(&self, prefix: &str) -> Result<u64> {
        let page = self
            .list(prefix, ListOptions { start_after: None, limit: 1, revision: None, ..Default::default() })
            .await?;
        Ok(page.items.len() as u64 + if page.more { page.remaining } else { 0 })
    }

    /// The newest revision all of whose events have been handed to watchers: a safe bookmark.
    fn progress_revision(&self) -> Revision;

    /// The newest committed revision.
    fn current_revision(&self) -> Revision;

    /// The newest committed revision, asked of the backend where other processes write too (etcd).
    async fn sync_revision(&self) -> Revision {
        self.current_revision()
    }

    /// Whether the backend answers (readiness): the embedded store always does; etcd must answer a read.
    async fn check_health(&self) -> Result<()> {
        Ok(())
    }
}

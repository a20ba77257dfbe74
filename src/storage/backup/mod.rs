//! Backups of the embedded store: snapshot files of one revision, taken while serving or offline, listed, verified
//! and restored into a new data directory (`storage snapshot ...`, `serve --snapshot-interval`,
//! `POST /storage/snapshots`). Not to be confused with `super::snapshots`, the read snapshots pinned by chunked lists.
//!
//! A snapshot is written under a hidden temporary name in the snapshot directory, fsynced, renamed to its final name
//! and the directory fsynced: a process killed meanwhile leaves only the temporary file, which no listing shows and
//! which the next start of the server (or `storage snapshot save`) removes.

pub mod format;
mod gentle;
pub(crate) use gentle::at_low_priority;
mod restore;
mod service;

pub use restore::{restore, verify, Verified};
pub use service::{BackupMetrics, Backups};

use super::embedded::{read_revision, unavailable, EmbeddedStorage, OBJECTS};
use super::{Result, StorageError};
use chrono::{DateTime, Utc};
use format::{HashingWriter, Header, HEADER_LEN};
use redb::{ReadTransaction, ReadableTable};
use serde::Serialize;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Final names: `snapshot-<UTC time to the millisecond>-<revision>.snap`, so that names sort by time.
const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".snap";
/// Temporary names start with a dot (hidden from `ls`) and end in `.tmp` (never taken for a snapshot).
const TEMP_SUFFIX: &str = ".tmp";

/// A snapshot written.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// The file's name in the snapshot directory.
    pub name: String,
    #[serde(skip)]
    pub path: PathBuf,
    /// The store's revision the snapshot holds: every object as of it.
    pub revision: u64,
    /// Bytes of the file.
    pub size: u64,
    /// `sha256:<hex>`, the file's checksum (its trailer).
    pub checksum: String,
    pub objects: u64,
    /// When it was taken (RFC 3339).
    pub created: String,
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> StorageError {
    StorageError::Unavailable(format!("{what} {}: {e}", path.display()))
}

/// The snapshot directory's default: `<data-dir>/snapshots`.
pub fn default_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots")
}

/// The final name of a snapshot of `revision` taken at `at`.
fn file_name(at: DateTime<Utc>, revision: u64) -> String {
    format!("{PREFIX}{}-{revision}{SUFFIX}", at.format("%Y%m%dT%H%M%S%.3fZ"))
}

/// Whether `name` is a final snapshot name (what `ls` lists and retention counts).
fn is_snapshot_name(name: &str) -> bool {
    name.starts_with(PREFIX) && name.ends_with(SUFFIX)
}

/// Writes the store as `txn` reads it into a new snapshot in `dir`.
pub(crate) fn write_snapshot(txn: &ReadTransaction, dir: &Path, now: DateTime<Utc>) -> Result<SnapshotInfo> {
    std::fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
    let revision = read_revision(txn)?;
    let name = file_name(now, revision);
    let temp = dir.join(format!(".{name}{TEMP_SUFFIX}"));
    let path = dir.join(&name);
    let written = write_file(txn, &temp, revision, now);
    let (header, checksum) = match written {
        Ok(w) => w,
        Err(e) => {
            // A failed snapshot leaves nothing behind (a kill leaves the temporary file, removed at the next start).
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
    };
    std::fs::rename(&temp, &path).map_err(|e| io_error("renaming the snapshot to", &path, e))?;
    sync_dir(dir)?;
    Ok(SnapshotInfo {
        name,
        path,
        revision,
        size: header.file_len(),
        checksum: format!("sha256:{}", format::hex(&checksum)),
        objects: header.objects,
        created: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    })
}

/// The body streamed first (the header is written over its placeholder once count and length are known), then the
/// checksum; fsynced.
fn write_file(txn: &ReadTransaction, temp: &Path, revision: u64, now: DateTime<Utc>) -> Result<(Header, [u8; 32])> {
    let failed = |e: std::io::Error| io_error("writing", temp, e);
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(temp).map_err(failed)?;
    let mut out = BufWriter::with_capacity(1 << 20, gentle::WriteBehind::new(file));
    out.write_all(&[0u8; HEADER_LEN as usize]).map_err(failed)?;
    let mut body = HashingWriter::new(out);
    let mut objects = 0u64;
    match txn.open_table(OBJECTS) {
        Ok(table) => {
            for entry in table.iter().map_err(unavailable)? {
                let (k, v) = entry.map_err(unavailable)?;
                body.record(k.value(), v.value()).map_err(failed)?;
                objects += 1;
            }
        }
        // A store that was never written to has no table yet: an empty snapshot.
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(unavailable(e)),
    }
    let body_len = body.written;
    let (body_hash, mut out) = body.finish();
    let created_unix_ms = u64::try_from(now.timestamp_millis()).unwrap_or(0);
    let header = Header { revision, created_unix_ms, objects, body_len };
    let checksum = format::checksum(&header, body_hash);
    out.write_all(&checksum).map_err(failed)?;
    out.seek(SeekFrom::Start(0)).map_err(failed)?;
    out.write_all(&header.encode()).map_err(failed)?;
    let file = out.into_inner().map_err(|e| failed(e.into_error()))?.into_inner();
    file.sync_all().map_err(failed)?;
    Ok((header, checksum))
}

/// Makes a rename (or removal) in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error("syncing", dir, e))
}

/// A snapshot of the stopped store in `data_dir`, into `dir` (`storage snapshot save`). The store is opened read-only;
/// a running server holds its lock, which is an error naming it.
pub fn save_offline(data_dir: &Path, dir: &Path) -> Result<SnapshotInfo> {
    EmbeddedStorage::read_offline(data_dir, |txn| {
        remove_temporary(dir)?;
        write_snapshot(&txn, dir, Utc::now())
    })
}

/// One snapshot file in a directory, as `ls` shows it: its header, or why it is not a usable snapshot.
#[derive(Debug)]
pub struct Listed {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub header: std::result::Result<Header, String>,
}

/// The snapshots in `dir`, oldest first (an absent directory has none). Only final names: temporary files of
/// snapshots in progress, or interrupted, are not snapshots.
pub fn list(dir: &Path) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    for path in snapshot_paths(dir)? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let header = restore::read_header(&path).map(|(h, _)| h).map_err(|e| e.to_string());
        out.push(Listed { name, path, size, header });
    }
    Ok(out)
}

/// The final snapshot names in `dir`, sorted (oldest first).
fn snapshot_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("reading", dir, e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(is_snapshot_name))
        .map(|e| e.path())
        .collect();
    paths.sort();
    Ok(paths)
}

/// Removes the oldest snapshots in `dir` beyond the newest `keep`; the names removed. `keep` 0 keeps all.
pub fn prune(dir: &Path, keep: usize) -> Result<Vec<String>> {
    let paths = snapshot_paths(dir)?;
    if keep == 0 || paths.len() <= keep {
        return Ok(Vec::new());
    }
    let mut removed = Vec::new();
    for path in &paths[..paths.len() - keep] {
        std::fs::remove_file(path).map_err(|e| io_error("removing", path, e))?;
        removed.push(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    }
    sync_dir(dir)?;
    Ok(removed)
}

/// Removes the temporary files that interrupted snapshots left in `dir`. Only while no snapshot is being written
/// into it: at the server's start, or offline with the store's lock held.
pub fn remove_temporary(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!(".{PREFIX}")) && name.ends_with(TEMP_SUFFIX) {
            tracing::info!(file = %entry.path().display(), "removing an interrupted snapshot's temporary file");
            std::fs::remove_file(entry.path()).map_err(|e| io_error("removing", &entry.path(), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! `storage snapshot verify` and `restore`: a snapshot file read back record by record, its checksum checked, and
//! written into a new store that the server opens as it opens any other.

use super::format::{self, FormatError, Header, RecordReader, HEADER_LEN};
use super::sync_dir;
use crate::storage::counts;
use crate::storage::embedded::{unavailable, META, META_REVISION, OBJECTS};
use crate::storage::{Result, StorageError};
use redb::{Database, Durability};
use serde::Serialize;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// The database file's name in a data directory (as `EmbeddedStorage::open` names it).
const STORE_FILE: &str = "store.redb";

/// A snapshot that verified: what it holds.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    pub revision: u64,
    pub objects: u64,
    pub size: u64,
    /// `sha256:<hex>`.
    pub checksum: String,
    /// RFC 3339.
    pub created: String,
}

fn refused(path: &Path, e: FormatError) -> StorageError {
    StorageError::Internal(format!("{}: {e}", path.display()))
}

/// The header of the snapshot at `path`, checked against the file's length, and the file positioned after it.
pub(super) fn read_header(path: &Path) -> std::result::Result<(Header, BufReader<File>), FormatError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut bytes = Vec::with_capacity(HEADER_LEN as usize);
    (&mut reader).take(HEADER_LEN).read_to_end(&mut bytes)?;
    let header = format::parse_header(&bytes, len)?;
    Ok((header, reader))
}

fn verified(header: &Header, path: &Path) -> std::result::Result<Verified, FormatError> {
    let mut file = File::open(path)?;
    let mut trailer = [0u8; format::CHECKSUM_LEN as usize];
    std::io::Seek::seek(&mut file, std::io::SeekFrom::End(-(format::CHECKSUM_LEN as i64)))?;
    file.read_exact(&mut trailer)?;
    let created = i64::try_from(header.created_unix_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    Ok(Verified {
        revision: header.revision,
        objects: header.objects,
        size: header.file_len(),
        checksum: format!("sha256:{}", format::hex(&trailer)),
        created,
    })
}

/// Reads the whole snapshot at `path`: its header, every record (each well formed, in key order, none newer than the
/// snapshot's revision) and its checksum.
pub fn verify(path: &Path) -> Result<Verified> {
    let check = || -> std::result::Result<Verified, FormatError> {
        let (header, file) = read_header(path)?;
        let mut records = RecordReader::new(file, header);
        while records.next_record()?.is_some() {}
        verified(&header, path)
    };
    check().map_err(|e| refused(path, e))
}

/// Restores the snapshot at `path` into a new store in `data_dir`, which must be absent or empty. The store is
/// written under a temporary name and renamed only once every record is in and the checksum matched: a refused or
/// interrupted restore leaves no store behind.
pub fn restore(path: &Path, data_dir: &Path) -> Result<Verified> {
    let (header, file) = read_header(path).map_err(|e| refused(path, e))?;
    let created_dir = prepare_target(data_dir)?;
    let temp = data_dir.join(format!(".{STORE_FILE}.restoring"));
    match write_store(&temp, RecordReader::new(file, header), &header).map_err(|e| match e {
        Restore::Format(e) => refused(path, e),
        Restore::Store(e) => e,
    }) {
        Ok(()) => {
            let store = data_dir.join(STORE_FILE);
            std::fs::rename(&temp, &store)
                .map_err(|e| StorageError::Unavailable(format!("renaming to {}: {e}", store.display())))?;
            sync_dir(data_dir)?;
            verified(&header, path).map_err(|e| refused(path, e))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            if created_dir {
                let _ = std::fs::remove_dir(data_dir);
            }
            Err(e)
        }
    }
}

/// Makes sure `data_dir` exists and is empty; whether it was created here.
fn prepare_target(data_dir: &Path) -> Result<bool> {
    let failed = |e: std::io::Error| StorageError::Unavailable(format!("{}: {e}", data_dir.display()));
    match std::fs::read_dir(data_dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(false),
            Some(_) => Err(StorageError::Internal(format!(
                "the target directory {} is not empty: restore into a new or empty directory",
                data_dir.display()
            ))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(data_dir).map_err(failed)?;
            Ok(true)
        }
        Err(e) => Err(failed(e)),
    }
}

enum Restore {
    Format(FormatError),
    Store(StorageError),
}

/// The store's cache while it is restored, which also bounds the written pages it holds before writing them to the
/// file: redb's default (1 GiB) would let a restore hold as much of the store as that in memory, for no gain (the
/// records arrive in key order and are written once).
const RESTORE_CACHE_BYTES: usize = 32 << 20;

/// Every record into the objects table, the revision into meta, the per-prefix counts computed from them; one
/// durable transaction, committed only after the checksum matched.
fn write_store(
    temp: &Path,
    mut records: RecordReader<BufReader<File>>,
    header: &Header,
) -> std::result::Result<(), Restore> {
    let store = |e: StorageError| Restore::Store(e);
    let db = Database::builder()
        .set_cache_size(RESTORE_CACHE_BYTES)
        .create(temp)
        .map_err(|e| store(unavailable(format_args!("creating {}: {e}", temp.display()))))?;
    let mut txn = db.begin_write().map_err(|e| store(unavailable(e)))?;
    txn.set_durability(Durability::Immediate).map_err(|e| store(unavailable(e)))?;
    {
        let mut objects = txn.open_table(OBJECTS).map_err(|e| store(unavailable(e)))?;
        while let Some(record) = records.next_record().map_err(Restore::Format)? {
            objects.insert(record.key.as_str(), record.stored.as_slice()).map_err(|e| store(unavailable(e)))?;
        }
        let mut meta = txn.open_table(META).map_err(|e| store(unavailable(e)))?;
        meta.insert(META_REVISION, header.revision).map_err(|e| store(unavailable(e)))?;
    }
    counts::build_if_missing(&txn, OBJECTS, META).map_err(store)?;
    txn.commit().map_err(|e| store(unavailable(e)))?;
    Ok(())
}

//! The snapshot file format, version 1. Every integer is little-endian.
//!
//! ```text
//! header   magic "MASNAPv\0" (8) | format version u32 | revision u64 | created (unix ms) u64 | objects u64
//!          | body length u64
//! body     per object, in key order: key length u32 | key (UTF-8) | value length u32 | value as stored
//! trailer  checksum: SHA-256 of (header, SHA-256 of body) (32)
//! ```
//!
//! The checksum covers the header through the body's own hash so that a writer can stream the body first and
//! write the header (whose count and length it knows only then) last, in one pass over the store.
//!
//! A value "as stored" is the embedded store's own record: 16 bytes of create and mod revision, then the value
//! exactly as the layer above wrote it (encrypted when encryption at rest is on). The body length in the header
//! tells a truncated file from a corrupted one before the checksum is computed.

use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};

pub const MAGIC: &[u8; 8] = b"MASNAPv\0";
pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_LEN: u64 = 8 + 4 + 8 + 8 + 8 + 8;
pub const CHECKSUM_LEN: u64 = 32;
/// The per-object revisions ahead of each stored value (see `embedded.rs`).
const STORED_HEADER: usize = 16;
/// Keys are paths under `/registry/`; a longer one is a corrupted length, not a key.
const MAX_KEY: u32 = 64 * 1024;
/// Larger than any value the store accepts (`--max-object-bytes` is bounded by etcd's request size in practice).
const MAX_VALUE: u32 = 1 << 30;

/// What a snapshot file says of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub revision: u64,
    pub created_unix_ms: u64,
    pub objects: u64,
    pub body_len: u64,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN as usize);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        for n in [self.revision, self.created_unix_ms, self.objects, self.body_len] {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b
    }

    /// The whole file's expected length.
    pub fn file_len(&self) -> u64 {
        HEADER_LEN.saturating_add(self.body_len).saturating_add(CHECKSUM_LEN)
    }
}

/// Why a file is not a usable snapshot. The messages name what is wrong, for an operator choosing another file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a migration-apiserver snapshot (it does not start with the snapshot magic)")]
    NotASnapshot,
    #[error("snapshot format version {0} is not supported (this build reads version {FORMAT_VERSION})")]
    Version(u32),
    #[error("truncated snapshot: {actual} bytes, its header announces {expected}")]
    Truncated { actual: u64, expected: u64 },
    #[error("the snapshot is longer than its header announces ({actual} bytes, expected {expected})")]
    TrailingData { actual: u64, expected: u64 },
    #[error("checksum mismatch: the snapshot is corrupted (sha256 {actual}, recorded {recorded})")]
    Checksum { actual: String, recorded: String },
    #[error("corrupted snapshot: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Parses the header from the file's first bytes; `len` is the file's length.
pub fn parse_header(bytes: &[u8], len: u64) -> Result<Header, FormatError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(FormatError::NotASnapshot);
    }
    if (bytes.len() as u64) < HEADER_LEN {
        return Err(FormatError::Truncated { actual: len, expected: HEADER_LEN + CHECKSUM_LEN });
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    if version != FORMAT_VERSION {
        return Err(FormatError::Version(version));
    }
    let header =
        Header { revision: u64_at(12), created_unix_ms: u64_at(20), objects: u64_at(28), body_len: u64_at(36) };
    let expected = header.file_len();
    if len < expected {
        return Err(FormatError::Truncated { actual: len, expected });
    }
    if len > expected {
        return Err(FormatError::TrailingData { actual: len, expected });
    }
    Ok(header)
}

/// A writer of the body that hashes what it writes and counts it.
pub struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    pub written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self { inner, hasher: Sha256::new(), written: 0 }
    }

    /// One record.
    pub fn record(&mut self, key: &str, stored: &[u8]) -> io::Result<()> {
        let too_long = |what| io::Error::new(io::ErrorKind::InvalidData, format!("{what} of {key} too long"));
        let key_len = u32::try_from(key.len()).map_err(|_| too_long("key"))?;
        let value_len = u32::try_from(stored.len()).map_err(|_| too_long("value"))?;
        self.write_all(&key_len.to_le_bytes())?;
        self.write_all(key.as_bytes())?;
        self.write_all(&value_len.to_le_bytes())?;
        self.write_all(stored)
    }

    /// The hash so far and the inner writer.
    pub fn finish(self) -> ([u8; 32], W) {
        (self.hasher.finalize().into(), self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads the records of a snapshot whose header was parsed, checking each.
pub struct RecordReader<R: Read> {
    /// The body's hash so far.
    inner: R,
    hasher: Sha256,
    header: Header,
    read: u64,
    body_read: u64,
    last_key: Option<String>,
}

/// One object: its key and its value as stored (revisions and value).
pub struct Record {
    pub key: String,
    pub stored: Vec<u8>,
}

impl Record {
    /// The revision that last modified the object.
    pub fn mod_revision(&self) -> u64 {
        u64::from_le_bytes(self.stored[8..16].try_into().unwrap_or_default())
    }
}

impl<R: Read> RecordReader<R> {
    pub fn new(inner: R, header: Header) -> Self {
        Self { inner, hasher: Sha256::new(), header, read: 0, body_read: 0, last_key: None }
    }

    fn exact(&mut self, n: usize) -> Result<Vec<u8>, FormatError> {
        let mut buf = vec![0u8; n];
        self.inner.read_exact(&mut buf).map_err(|e| match e.kind() {
            // The length was checked against the header: a short read means the file changed while read.
            io::ErrorKind::UnexpectedEof => FormatError::Corrupt("the file ends inside a record".into()),
            _ => FormatError::Io(e),
        })?;
        self.hasher.update(&buf);
        self.body_read += n as u64;
        if self.body_read > self.header.body_len {
            return Err(FormatError::Corrupt("a record runs past the end of the body".into()));
        }
        Ok(buf)
    }

    fn len_field(&mut self, max: u32, what: &str) -> Result<usize, FormatError> {
        let b = self.exact(4)?;
        let n = u32::from_le_bytes(b[..4].try_into().unwrap_or_default());
        // Checked before anything is allocated for it: a corrupted length must not ask for gigabytes.
        let left = self.header.body_len - self.body_read;
        if n > max || u64::from(n) > left {
            return Err(FormatError::Corrupt(format!("{what} length {n} of record {} is impossible", self.read + 1)));
        }
        Ok(n as usize)
    }

    /// The next record, or `None` after the last (whose count and checksum are then checked).
    pub fn next_record(&mut self) -> Result<Option<Record>, FormatError> {
        if self.read == self.header.objects {
            self.finish()?;
            return Ok(None);
        }
        let key_len = self.len_field(MAX_KEY, "key")?;
        let key = String::from_utf8(self.exact(key_len)?)
            .map_err(|_| FormatError::Corrupt(format!("the key of record {} is not UTF-8", self.read + 1)))?;
        let value_len = self.len_field(MAX_VALUE, "value")?;
        if value_len < STORED_HEADER {
            return Err(FormatError::Corrupt(format!("the value of {key} has no revisions")));
        }
        let stored = self.exact(value_len)?;
        if self.last_key.as_deref().is_some_and(|last| last >= key.as_str()) {
            return Err(FormatError::Corrupt(format!("{key} is out of order")));
        }
        self.last_key = Some(key.clone());
        self.read += 1;
        let record = Record { key, stored };
        if record.mod_revision() > self.header.revision {
            return Err(FormatError::Corrupt(format!(
                "{} was modified at revision {}, after the snapshot's revision {}",
                record.key,
                record.mod_revision(),
                self.header.revision
            )));
        }
        Ok(Some(record))
    }

    /// After the last record: the body is used up and the checksum matches.
    fn finish(&mut self) -> Result<(), FormatError> {
        if self.body_read != self.header.body_len {
            return Err(FormatError::Corrupt(format!(
                "{} objects end at byte {} of a body of {}",
                self.header.objects, self.body_read, self.header.body_len
            )));
        }
        let mut recorded = [0u8; CHECKSUM_LEN as usize];
        self.inner.read_exact(&mut recorded)?;
        let actual = checksum(&self.header, std::mem::take(&mut self.hasher).finalize().into());
        if actual != recorded {
            return Err(FormatError::Checksum { actual: hex(&actual), recorded: hex(&recorded) });
        }
        Ok(())
    }
}

/// The file's checksum: over its header and its body's hash.
pub fn checksum(header: &Header, body_hash: [u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(header.encode());
    h.update(body_hash);
    h.finalize().into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

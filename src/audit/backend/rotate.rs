//! The audit log file, rotated as kube-apiserver rotates it (gopkg.in/natefinch/lumberjack.v2):
//!
//! - a write that would take the file past the max size first renames it to `<name>-<timestamp><ext>` (UTC,
//!   `2006-01-02T15-04-05.000`: `audit-2024-05-06T07-08-09.123.log` for `audit.log`) and starts a new file with
//!   the old one's mode (0600 for a file this server created);
//! - after a rotation (and at start), backups beyond the max count or older than the max age (by the time in
//!   their name) are removed, and the others gzipped to `<backup>.gz` when asked; this runs on a thread of its
//!   own, so that compressing a large file does not hold the writes.
//!
//! A max size of 0 never rotates (upstream opens the file plainly then).

use chrono::{NaiveDateTime, Utc};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::RwLock;

const BACKUP_TIME_FORMAT: &str = "%Y-%m-%dT%H-%M-%S%.3f";

pub struct RotatingFile {
    path: PathBuf,
    max_size: u64,
    /// The file lines are appended to. Every append (one line, or a batch's whole lines) is one `write(2)` of an
    /// `O_APPEND` file, which the kernel keeps whole and in order, so concurrent writers share this read lock only;
    /// rotation (and opening) takes it alone.
    file: RwLock<Option<File>>,
    /// The file's size as written so far: an append reserves its length here before it is written.
    size: AtomicU64,
    /// Wakes the cleaner (backups, age, compression); a full slot means a run is already due.
    cleaner: Option<SyncSender<()>>,
}

#[derive(Clone)]
struct Retention {
    path: PathBuf,
    max_backups: usize,
    max_age_days: u64,
    compress: bool,
}

impl RotatingFile {
    pub fn open(
        path: PathBuf,
        max_size: u64,
        max_backups: usize,
        max_age_days: u64,
        compress: bool,
    ) -> std::io::Result<RotatingFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        OpenOptions::new().create(true).append(true).read(true).mode(0o600).open(&path)?;
        let cleaner = (max_size > 0).then(|| {
            let retention = Retention { path: path.clone(), max_backups, max_age_days, compress };
            let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
            std::thread::Builder::new()
                .name("audit-log-cleaner".into())
                .spawn(move || woken.iter().for_each(|()| retention.run()))
                .map(|_| wake)
        });
        let cleaner = cleaner.transpose()?;
        if let Some(c) = &cleaner {
            let _ = c.try_send(());
        }
        Ok(RotatingFile { path, max_size, file: RwLock::new(None), size: AtomicU64::new(0), cleaner })
    }

    /// The max size (0: never rotated): a write of several lines stays within it, as one line must.
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// Appends `lines` (whole lines) in one write, after a rotation if they would take the file past its max size.
    pub fn append(&self, lines: &[u8]) -> std::io::Result<()> {
        let len = lines.len() as u64;
        if self.max_size > 0 && len > self.max_size {
            return Err(std::io::Error::other(format!(
                "write length {len} exceeds maximum file size {}",
                self.max_size
            )));
        }
        {
            let file = self.file.read().unwrap_or_else(|p| p.into_inner());
            if let Some(mut f) = file.as_ref() {
                if self.max_size == 0 || self.size.fetch_add(len, Ordering::Relaxed) + len <= self.max_size {
                    return f.write_all(lines);
                }
                // Past the max size: the append waits for the rotation below.
                self.size.fetch_sub(len, Ordering::Relaxed);
            }
        }
        let mut file = self.file.write().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            self.open_existing_or_new(&mut file, len)?;
        } else if self.max_size > 0 && self.size.load(Ordering::Relaxed) + len > self.max_size {
            // Checked again under the lock: a writer that had it first may have rotated already, and then the lines
            // fit without another rotation.
            self.rotate(&mut file)?;
        }
        let mut f = file.as_ref().ok_or_else(|| std::io::Error::other("audit log not open"))?;
        self.size.fetch_add(len, Ordering::Relaxed);
        f.write_all(lines)
    }

    fn open_existing_or_new(&self, file: &mut Option<File>, len: u64) -> std::io::Result<()> {
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.open_new(file),
            Err(e) => Err(e),
            Ok(meta) if self.max_size > 0 && meta.len() + len >= self.max_size => self.rotate(file),
            Ok(meta) => {
                *file = Some(OpenOptions::new().append(true).open(&self.path)?);
                self.size.store(meta.len(), Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn rotate(&self, file: &mut Option<File>) -> std::io::Result<()> {
        *file = None;
        self.open_new(file)?;
        if let Some(c) = &self.cleaner {
            let _ = c.try_send(());
        }
        Ok(())
    }

    /// Moves the current file (if any) to its backup name and starts an empty one with its mode.
    fn open_new(&self, file: &mut Option<File>) -> std::io::Result<()> {
        let mut mode = 0o600;
        if let Ok(meta) = std::fs::metadata(&self.path) {
            mode = meta.permissions().mode() & 0o7777;
            std::fs::rename(&self.path, backup_name(&self.path, Utc::now().naive_utc()))?;
        }
        // Appending, as every line is (see `file`); emptied as lumberjack's O_TRUNC would.
        let new = OpenOptions::new().create(true).append(true).mode(mode).open(&self.path)?;
        new.set_len(0)?;
        // The mode of a file that existed: kept even where the umask would narrow it.
        new.set_permissions(std::fs::Permissions::from_mode(mode))?;
        *file = Some(new);
        self.size.store(0, Ordering::Relaxed);
        Ok(())
    }
}

/// `<dir>/<prefix>-<time><ext>`, the extension being what follows the last dot of the file name.
fn backup_name(path: &Path, at: NaiveDateTime) -> PathBuf {
    let (prefix, ext) = prefix_and_ext(path);
    path.with_file_name(format!("{prefix}-{}{ext}", at.format(BACKUP_TIME_FORMAT)))
}

fn prefix_and_ext(path: &Path) -> (String, String) {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.rfind('.') {
        Some(i) => (name[..i].to_string(), name[i..].to_string()),
        None => (name, String::new()),
    }
}

impl Retention {
    /// lumberjack's `millRunOnce`: errors are logged, never fatal.
    fn run(&self) {
        if let Err(e) = self.clean() {
            tracing::warn!(error = %e, path = %self.path.display(), "audit log: cleaning old backups failed");
        }
    }

    fn clean(&self) -> std::io::Result<()> {
        if self.max_backups == 0 && self.max_age_days == 0 && !self.compress {
            return Ok(());
        }
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let (prefix, ext) = prefix_and_ext(&self.path);
        let mut backups: Vec<(NaiveDateTime, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let stamp = name
                .strip_prefix(&format!("{prefix}-"))
                .and_then(|rest| rest.strip_suffix(&format!("{ext}.gz")).or_else(|| rest.strip_suffix(&ext)));
            if let Some(at) = stamp.and_then(|s| NaiveDateTime::parse_from_str(s, BACKUP_TIME_FORMAT).ok()) {
                backups.push((at, entry.path()));
            }
        }
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        let mut remove = Vec::new();
        if self.max_backups > 0 {
            // A backup and its compressed copy (mid-compression) count as one.
            let mut kept = std::collections::BTreeSet::new();
            backups.retain(|(_, p)| {
                let key = p.to_string_lossy().trim_end_matches(".gz").to_string();
                kept.insert(key);
                if kept.len() > self.max_backups {
                    remove.push(p.clone());
                    false
                } else {
                    true
                }
            });
        }
        if self.max_age_days > 0 {
            let cutoff = Utc::now().naive_utc() - chrono::Duration::days(self.max_age_days as i64);
            backups.retain(|(at, p)| {
                let old = *at < cutoff;
                if old {
                    remove.push(p.clone());
                }
                !old
            });
        }
        for p in remove {
            std::fs::remove_file(&p)?;
        }
        if self.compress {
            for (_, p) in backups.iter().filter(|(_, p)| p.extension().is_none_or(|e| e != "gz")) {
                compress(p)?;
            }
        }
        Ok(())
    }
}

/// `<file>` to `<file>.gz` with the same mode, then the original removed.
fn compress(path: &Path) -> std::io::Result<()> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    let gz_path = PathBuf::from(format!("{}.gz", path.display()));
    let gz = OpenOptions::new().create(true).write(true).truncate(true).mode(mode).open(&gz_path)?;
    let mut encoder = flate2::write::GzEncoder::new(gz, flate2::Compression::default());
    std::io::copy(&mut File::open(path)?, &mut encoder)?;
    encoder.finish()?.sync_all()?;
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_names_are_lumberjacks() {
        let at = NaiveDateTime::parse_from_str("2024-05-06 07:08:09.123", "%Y-%m-%d %H:%M:%S%.3f").expect("time");
        assert_eq!(
            backup_name(Path::new("/var/log/audit.log"), at),
            Path::new("/var/log/audit-2024-05-06T07-08-09.123.log")
        );
        assert_eq!(backup_name(Path::new("audit"), at), Path::new("audit-2024-05-06T07-08-09.123"));
        assert_eq!(backup_name(Path::new("/l/a.b.json"), at), Path::new("/l/a.b-2024-05-06T07-08-09.123.json"));
    }

    #[test]
    fn rotates_past_the_max_size_and_keeps_the_newest_backups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let f = RotatingFile::open(path.clone(), 10, 1, 0, false).expect("open");
        for line in [b"12345\n", b"67890\n", b"abcde\n"] {
            f.append(line).expect("write");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(std::fs::read(&path).expect("current"), b"abcde\n");
        assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
        assert!(f.append(&[b'x'; 11]).is_err(), "a line longer than the max size");
    }

    /// Writers share the file with no lock of their own: every line arrives whole, none is lost, and the one rotation
    /// the lines call for happens once, with neither file past the max size.
    #[test]
    fn concurrent_writers_append_whole_lines_across_one_rotation() {
        const THREADS: usize = 4;
        const LINES: usize = 250;
        const MAX_SIZE: u64 = 60_000;
        let dir = tempfile::tempdir().expect("tempdir");
        // 4 x 250 lines of 100 bytes: 100,000 bytes, past the max size once.
        let f = RotatingFile::open(dir.path().join("audit.log"), MAX_SIZE, 0, 0, false).expect("open");
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let f = &f;
                s.spawn(move || {
                    for i in 0..LINES {
                        let line = format!("{:<99}\n", format!("thread {t} line {i:03} "));
                        f.append(line.as_bytes()).expect("write");
                    }
                });
            }
        });
        let files: Vec<PathBuf> =
            std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").path()).collect();
        assert_eq!(files.len(), 2, "the log and one backup: {files:?}");
        let mut seen = std::collections::BTreeSet::new();
        for path in &files {
            let data = String::from_utf8(std::fs::read(path).expect("read")).expect("utf-8");
            assert!(data.len() as u64 <= MAX_SIZE, "{} is {} bytes", path.display(), data.len());
            assert_eq!(std::fs::metadata(path).expect("meta").permissions().mode() & 0o777, 0o600);
            for line in data.lines() {
                assert!(line.len() == 99 && line.starts_with("thread "), "a torn line in {}: {line:?}", path.display());
                assert!(seen.insert(line.trim_end().to_string()), "written twice: {line:?}");
            }
        }
        assert_eq!(seen.len(), THREADS * LINES);
    }
}

//! The log backend (`--audit-log-*`, k8s.io/apiserver `plugin/pkg/audit/log`): one line per event, JSON or the
//! legacy text format, to standard output or to a file rotated as kube-apiserver's (lumberjack, see [`super::rotate`]).

use super::rotate::RotatingFile;
use super::{fills_object_ref, Backend, BackendError};
use crate::audit::event::Event;
use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line of text per event (`EventString`).
    Legacy,
    /// One `audit.k8s.io/v1` Event per line.
    Json,
}

#[derive(Clone, Debug)]
pub struct LogOptions {
    /// `-` for standard output.
    pub path: PathBuf,
    pub format: Format,
    /// Megabytes; 0: never rotated.
    pub max_size_mb: u64,
    pub max_backups: usize,
    pub max_age_days: u64,
    pub compress: bool,
}

enum Output {
    Stdout,
    File(RotatingFile),
}

pub struct LogBackend {
    /// Shared by every request's thread without a lock: each write holds whole lines and is appended on its own
    /// (standard output's own lock, or [`RotatingFile`]'s appends).
    out: Output,
    format: Format,
}

impl LogBackend {
    /// Opens the log as kube-apiserver does at start (`ensureLogFile`): its directory is made (0700) and the file
    /// created (0600) if missing, so that a path that cannot be written stops the start.
    pub fn open(options: &LogOptions) -> std::io::Result<LogBackend> {
        let out = match options.path.to_str() {
            Some("-") => Output::Stdout,
            _ => Output::File(RotatingFile::open(
                options.path.clone(),
                options.max_size_mb * 1024 * 1024,
                options.max_backups,
                options.max_age_days,
                options.compress,
            )?),
        };
        Ok(LogBackend { out, format: options.format })
    }

    /// Appends `event`'s line to `out`.
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        match self.format {
            Format::Legacy => out.extend_from_slice(event.to_legacy_line().as_bytes()),
            Format::Json => event.append_json_line(fills_object_ref(event), out).map_err(|e| e.to_string())?,
        }
        Ok(())
    }

    /// The most bytes one write may carry: [`MAX_WRITE`], and never past a rotated file's max size.
    fn write_limit(&self) -> usize {
        match &self.out {
            Output::File(f) if f.max_size() > 0 => MAX_WRITE.min(usize::try_from(f.max_size()).unwrap_or(usize::MAX)),
            _ => MAX_WRITE,
        }
    }

    /// Writes the first `len` bytes of `lines` (whole lines) in one write, and takes them out.
    fn write_first(&self, lines: &mut Vec<u8>, len: usize) -> Result<(), String> {
        let written = match &self.out {
            Output::Stdout => std::io::stdout().lock().write_all(&lines[..len]).map_err(|e| e.to_string()),
            Output::File(f) => f.append(&lines[..len]).map_err(|e| e.to_string()),
        };
        lines.drain(..len);
        written
    }
}

thread_local! {
    /// The lines each thread encodes its events into, kept from one event to the next: encoding allocates nothing
    /// once the buffer has grown to a write's size.
    static LINES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A buffer grown past this by a large event (a RequestResponse body) is given back rather than kept.
const KEPT_LINES_CAPACITY: usize = 256 << 10;

/// A batch's lines go out in writes of up to this many bytes: one `write(2)` for many events instead of one each
/// (a batch of 400 Metadata events is about 280 KiB, five writes). Each write holds whole lines.
const MAX_WRITE: usize = 64 << 10;

impl Backend for LogBackend {
    fn plugin(&self) -> &'static str {
        "log"
    }

    /// The events' lines in order, as few writes as [`MAX_WRITE`] allows (the blocking modes' one event: one write).
    fn process(&self, events: &[Event]) -> Result<(), BackendError> {
        let (mut lost, mut last_error) = (0, String::new());
        let limit = self.write_limit();
        LINES.with_borrow_mut(|lines| {
            lines.clear();
            // How many lines `lines` holds, not yet written.
            let mut pending = 0;
            for event in events {
                let start = lines.len();
                if let Err(e) = self.encode(event, lines) {
                    lines.truncate(start);
                    lost += 1;
                    last_error = e;
                    continue;
                }
                // This line would take the write past its limit: what came before goes first, on its own.
                if start > 0 && lines.len() > limit {
                    if let Err(e) = self.write_first(lines, start) {
                        lost += pending;
                        last_error = e;
                    }
                    pending = 0;
                }
                pending += 1;
            }
            if pending > 0 {
                if let Err(e) = self.write_first(lines, lines.len()) {
                    lost += pending;
                    last_error = e;
                }
            }
            if lines.capacity() > KEPT_LINES_CAPACITY {
                *lines = Vec::new();
            }
        });
        match lost {
            0 => Ok(()),
            _ => Err(BackendError { lost, error: last_error }),
        }
    }

    fn encoded_size(&self, event: &Event) -> usize {
        // Truncation measures the JSON encoding whatever the log's format, as upstream's truncate plugin does.
        event.to_json_line(fills_object_ref(event)).map_or(usize::MAX, |l| l.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::policy::Level;

    /// A batch goes out in writes of many lines: every event arrives once, whole and in order, across the rotation
    /// it calls for, and no write takes a file past the max size (which is below MAX_WRITE here).
    #[test]
    fn a_batch_is_written_in_whole_lines_in_order_across_a_rotation() {
        const MAX_SIZE: u64 = 60_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let file = RotatingFile::open(path.clone(), MAX_SIZE, 0, 0, false).expect("open");
        let log = LogBackend { out: Output::File(file), format: Format::Json };
        let events: Vec<Event> =
            (0..400).map(|i| Event::for_tests(Level::Metadata, &format!("id-{i:04}"), "/apis/x")).collect();
        let one = events[0].to_json_line(false).expect("encode").len() as u64;
        assert!(one * 400 > MAX_SIZE && one * 400 < 2 * MAX_SIZE, "one rotation expected for lines of {one} bytes");
        log.process(&events).expect("written");

        let mut files: Vec<PathBuf> =
            std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").path()).collect();
        assert_eq!(files.len(), 2, "the log and one backup: {files:?}");
        // The backup (audit-<time>.log) holds the first lines.
        files.sort_by_key(|p| *p == path);
        let mut ids = Vec::new();
        for f in &files {
            let data = std::fs::read_to_string(f).expect("read");
            assert!(data.len() as u64 <= MAX_SIZE, "{} is {} bytes", f.display(), data.len());
            assert!(data.ends_with('\n'));
            for line in data.lines() {
                let v: serde_json::Value = serde_json::from_str(line).expect("a whole JSON line");
                ids.push(v["auditID"].as_str().expect("auditID").to_string());
            }
        }
        let expected: Vec<String> = (0..400).map(|i| format!("id-{i:04}")).collect();
        assert_eq!(ids, expected);
    }
}

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
    /// Shared by every request's thread without a lock: each line is one write of its own (standard output's own
    /// lock, or [`RotatingFile`]'s appends).
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

    /// Encodes `event` into `line` (emptied first).
    fn encode(&self, event: &Event, line: &mut Vec<u8>) -> Result<(), String> {
        line.clear();
        match self.format {
            Format::Legacy => line.extend_from_slice(event.to_legacy_line().as_bytes()),
            Format::Json => event.append_json_line(fills_object_ref(event), line).map_err(|e| e.to_string())?,
        }
        Ok(())
    }

    fn write(&self, line: &[u8]) -> Result<(), String> {
        match &self.out {
            Output::Stdout => std::io::stdout().lock().write_all(line).map_err(|e| e.to_string()),
            Output::File(f) => f.write_line(line).map_err(|e| e.to_string()),
        }
    }
}

thread_local! {
    /// The line each thread encodes its events into, kept from one event to the next: encoding allocates nothing
    /// once the buffer has grown to a line's size.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A buffer grown past this by a large event (a RequestResponse body) is given back rather than kept.
const KEPT_LINE_CAPACITY: usize = 64 << 10;

impl Backend for LogBackend {
    fn plugin(&self) -> &'static str {
        "log"
    }

    fn process(&self, events: &[Event]) -> Result<(), BackendError> {
        let (mut lost, mut last_error) = (0, String::new());
        LINE.with_borrow_mut(|line| {
            for event in events {
                let written = self.encode(event, line).and_then(|()| self.write(line));
                if let Err(e) = written {
                    lost += 1;
                    last_error = e;
                }
            }
            if line.capacity() > KEPT_LINE_CAPACITY {
                *line = Vec::new();
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

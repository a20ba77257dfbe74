//! The log backend (`--audit-log-*`, k8s.io/apiserver `plugin/pkg/audit/log`): one line per event, JSON or the
//! legacy text format, to standard output or to a file rotated as kube-apiserver's (lumberjack, see [`super::rotate`]).

use super::rotate::RotatingFile;
use super::{fills_object_ref, Backend, BackendError};
use crate::audit::event::Event;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

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
    /// One writer at a time: lines must not interleave, and rotation renames the file under the writer.
    out: Mutex<Output>,
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
        Ok(LogBackend { out: Mutex::new(out), format: options.format })
    }

    fn line(&self, event: &Event) -> Result<Vec<u8>, String> {
        match self.format {
            Format::Legacy => Ok(event.to_legacy_line().into_bytes()),
            Format::Json => event.to_json_line(fills_object_ref(event)).map_err(|e| e.to_string()),
        }
    }
}

impl Backend for LogBackend {
    fn plugin(&self) -> &'static str {
        "log"
    }

    fn process(&self, events: &[Event]) -> Result<(), BackendError> {
        let (mut lost, mut last_error) = (0, String::new());
        // Encoded before the lock: in the blocking modes other requests' lines wait only for the writes.
        let lines: Vec<_> = events.iter().map(|e| self.line(e)).collect();
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        for line in lines {
            let written = line.and_then(|line| match &mut *out {
                Output::Stdout => std::io::stdout().lock().write_all(&line).map_err(|e| e.to_string()),
                Output::File(f) => f.write_line(&line).map_err(|e| e.to_string()),
            });
            if let Err(e) = written {
                lost += 1;
                last_error = e;
            }
        }
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

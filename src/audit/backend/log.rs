//! The log backend (`--audit-log-*`, k8s.io/apiserver `plugin/pkg/audit/log`): one line per event, JSON or the
//! legacy text format, to standard output or to a file rotated as kube-apiserver's (lumberjack, see [`super::rotate`]).

use super::rotate::RotatingFile;
use super::{fills_object_ref, Backend, BackendError};
use crate::audit::event::Event;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

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
    /// Written by one thread at a time, the group's writer: lines must not interleave, and rotation renames the
    /// file under the writer.
    out: Mutex<Output>,
    /// Lines waiting for the next write, from every request whose event came while one was being written.
    group: Mutex<Group>,
    /// A group was written: its requests go on, and one of the next lines' requests writes them.
    written: Condvar,
    format: Format,
}

/// Group writing: in the blocking modes each request's event must be written before the request goes on, as
/// upstream's log backend writes it (one write(2) per event, behind a mutex). Here a request that finds a write in
/// progress queues its line and waits; when the write ends, one waiting request writes every queued line at once.
/// Each event is still written before its request goes on, and lines stay whole; under concurrent requests, one
/// write(2) carries many of them (BENCHMARKS.md, "Audit").
/// Where the writer leaves a queued line's outcome.
type Outcome = Arc<OnceLock<Result<(), String>>>;

#[derive(Default)]
struct Group {
    lines: Vec<(Vec<u8>, Outcome)>,
    writing: bool,
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
        Ok(LogBackend {
            out: Mutex::new(out),
            group: Mutex::default(),
            written: Condvar::new(),
            format: options.format,
        })
    }

    fn line(&self, event: &Event) -> Result<Vec<u8>, String> {
        match self.format {
            Format::Legacy => Ok(event.to_legacy_line().into_bytes()),
            Format::Json => event.to_json_line(fills_object_ref(event)).map_err(|e| e.to_string()),
        }
    }

    /// One group's lines, in as few writes as the output allows; each line's outcome.
    fn write(&self, lines: &[(Vec<u8>, Outcome)]) -> Vec<Result<(), String>> {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *out {
            Output::Stdout => {
                let all: Vec<u8> = lines.iter().flat_map(|(l, _)| l.iter().copied()).collect();
                let written = std::io::stdout().lock().write_all(&all).map_err(|e| e.to_string());
                vec![written; lines.len()]
            }
            Output::File(f) => f.write_lines(&lines.iter().map(|(l, _)| l.as_slice()).collect::<Vec<_>>()),
        }
    }
}

impl Backend for LogBackend {
    fn plugin(&self) -> &'static str {
        "log"
    }

    fn process(&self, events: &[Event]) -> Result<(), BackendError> {
        let (mut lost, mut last_error) = (0, String::new());
        // Encoded before any lock: other requests' lines wait only for the writes.
        let mut lines = Vec::with_capacity(events.len());
        for event in events {
            match self.line(event) {
                Ok(line) => lines.push((line, Arc::new(OnceLock::new()))),
                Err(e) => {
                    lost += 1;
                    last_error = e;
                }
            }
        }
        let outcomes: Vec<_> = lines.iter().map(|(_, outcome)| outcome.clone()).collect();
        let mut group = self.group.lock().unwrap_or_else(|p| p.into_inner());
        group.lines.append(&mut lines);
        while !outcomes.iter().all(|o| o.get().is_some()) {
            if group.writing {
                group = self.written.wait(group).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            group.writing = true;
            let lines = std::mem::take(&mut group.lines);
            drop(group);
            let results = self.write(&lines);
            for ((_, outcome), result) in lines.iter().zip(results) {
                let _ = outcome.set(result);
            }
            group = self.group.lock().unwrap_or_else(|p| p.into_inner());
            group.writing = false;
            self.written.notify_all();
        }
        drop(group);
        for e in outcomes.iter().filter_map(|o| o.get().and_then(|r| r.as_ref().err())) {
            lost += 1;
            last_error = e.clone();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::policy::Level;

    /// Requests writing at once: every event is written whole, once, before its request goes on.
    #[test]
    fn concurrent_requests_each_get_their_line_written_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let options = LogOptions {
            path: path.clone(),
            format: Format::Json,
            max_size_mb: 0,
            max_backups: 0,
            max_age_days: 0,
            compress: false,
        };
        let log = Arc::new(LogBackend::open(&options).expect("open"));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (log, path) = (log.clone(), path.clone());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let id = format!("{t}-{i}");
                        log.process(&[Event::for_tests(Level::Metadata, &id, "/")]).expect("written");
                        let text = std::fs::read_to_string(&path).expect("read");
                        assert!(text.contains(&format!("\"auditID\":\"{id}\"")), "{id} written before return");
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().expect("thread"));
        let text = std::fs::read_to_string(&path).expect("read");
        let mut ids: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a whole JSON line")["auditID"].to_string())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 400);
        assert_eq!(text.lines().count(), 400);
    }
}

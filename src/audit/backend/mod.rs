//! Where events go: a [`Backend`] (the log file, the webhook) behind one of upstream's modes
//! (`--audit-<plugin>-mode`, k8s.io/apiserver `pkg/server/options/audit.go`):
//!
//! - **blocking**: the request's own thread writes its event; a failed write is counted and the request goes on.
//! - **blocking-strict**: the same, but a RequestReceived event that cannot be written fails the request (500).
//! - **batch** (upstream's `buffered` plugin): the event is handed to a bounded queue and the request goes on at
//!   once; a writer thread takes batches from it (up to the max size, or what came within the max wait), throttles
//!   them if asked, and writes them. A full queue drops the event and counts it (`plugin="buffered"`): a slow disk
//!   or webhook never slows requests. Events are encoded on the writer thread. The webhook's batches are started
//!   there and sent concurrently (upstream's AsyncDelegate), so that one batch's retries do not hold the next.
//!
//! Truncation (`--audit-<plugin>-truncate-*`, upstream's `truncate` plugin) runs right before the backend: an event
//! larger than the max event size loses its request and response objects, and is dropped if still too large.

pub mod log;
mod rotate;
pub mod webhook;

use super::event::Event;
use super::metrics::AuditMetrics;
use crate::ratelimit::RateLimiter;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The outcome of a batch started with [`Backend::start`].
pub type Done = Box<dyn FnOnce(Result<(), BackendError>) + Send>;

/// A destination of events. Shared by every request's thread in the blocking modes and by the batch writer (the log
/// appends whole lines in writes of their own, so that concurrent requests need no lock).
pub trait Backend: Send + Sync {
    /// The plugin name of `apiserver_audit_error_total{plugin}`: `log`, `webhook`.
    fn plugin(&self) -> &'static str;
    /// Stores `events` in order, waiting for the outcome. On error, how many of them were lost, and why.
    fn process(&self, events: &[Event]) -> Result<(), BackendError>;
    /// The encoded size of an event, as truncation measures it.
    fn encoded_size(&self, event: &Event) -> usize;
    /// Whether `process` waits on another server (the webhook, whose retries take over a minute): the blocking
    /// modes then wait off the async worker threads, so that other requests are still served meanwhile.
    fn remote(&self) -> bool {
        false
    }
    /// Batch mode's hand-over: starts storing `events` and may return before they are (the webhook sends each batch
    /// on its own task); `done` gets the outcome. By default, as the log, `process` at once.
    fn start(&self, events: Vec<Event>, done: Done) {
        done(self.process(&events));
    }
    /// At shutdown, after the last [`Backend::start`]: waits until `deadline` for what was started to be done.
    fn wait_started(&self, _deadline: Instant) {}
}

/// A create's or update's request object completes its objectRef (the others have no object with metadata), in
/// every backend's encoding.
fn fills_object_ref(event: &Event) -> bool {
    matches!(event.verb.as_str(), "create" | "update")
}

#[derive(Debug)]
pub struct BackendError {
    pub lost: usize,
    pub error: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Batch,
    Blocking,
    BlockingStrict,
}

#[derive(Clone, Debug)]
pub struct BatchConfig {
    pub buffer_size: usize,
    pub max_batch_size: usize,
    pub max_batch_wait: Duration,
    pub throttle: Option<(f32, usize)>,
}

#[derive(Clone, Copy, Debug)]
pub struct TruncateConfig {
    pub max_event_size: usize,
    pub max_batch_size: usize,
}

/// The request side of a backend in its mode.
pub enum Sink {
    Blocking {
        stage: Stage,
        strict: bool,
    },
    Batch {
        queue: SyncSender<Message>,
        writer: Mutex<Option<std::thread::JoinHandle<()>>>,
        /// Also the writer's: at shutdown, what it started is waited for.
        stage: Arc<Stage>,
    },
}

/// What the batch writer receives.
pub enum Message {
    Event(Box<Event>),
    /// Everything queued before is written; then the writer acknowledges and stops.
    Stop(std::sync::mpsc::Sender<()>),
}

/// A backend with its truncation, as the blocking modes and the batch writer call it.
pub struct Stage {
    backend: Box<dyn Backend>,
    truncate: Option<TruncateConfig>,
    metrics: Arc<AuditMetrics>,
}

impl Stage {
    /// Truncates, splits into batches of the max batch size, writes and waits; false when an event was lost.
    fn process(&self, events: Vec<Event>) -> bool {
        self.batches(events, |batch| self.write(&batch))
    }

    /// The blocking modes' one event: written as it is, copied only when truncation may change it.
    fn process_one(&self, event: &Event) -> bool {
        match self.truncate {
            None => self.write(std::slice::from_ref(event)),
            Some(_) => self.process(vec![event.clone()]),
        }
    }

    /// Writes and waits; a loss is counted.
    fn write(&self, events: &[Event]) -> bool {
        match self.backend.process(events) {
            Ok(()) => true,
            Err(e) => {
                self.metrics.plugin_error(self.backend.plugin(), e.lost, &e.error);
                false
            }
        }
    }

    /// Batch mode: truncates and splits as [`Stage::process`], then starts each batch (the outcome is counted when
    /// it comes; the webhook's does not come before the next batch is collected).
    fn start(&self, events: Vec<Event>) {
        self.batches(events, |batch| {
            let (metrics, plugin) = (self.metrics.clone(), self.backend.plugin());
            self.backend.start(
                batch,
                Box::new(move |outcome| {
                    if let Err(e) = outcome {
                        metrics.plugin_error(plugin, e.lost, &e.error);
                    }
                }),
            );
            true
        });
    }

    /// Truncation, then `write` per batch of at most the max batch size; false when an event was lost.
    fn batches(&self, events: Vec<Event>, mut write: impl FnMut(Vec<Event>) -> bool) -> bool {
        let Some(limits) = self.truncate else {
            return write(events);
        };
        let (mut ok, mut batch, mut batch_size, mut too_large) = (true, Vec::new(), 0, 0);
        for mut event in events {
            let mut size = self.backend.encoded_size(&event);
            if size > limits.max_event_size && event.level >= super::policy::Level::Request {
                event.request_object = None;
                event.response_object = None;
                event.annotations.insert("audit.k8s.io/truncated".into(), "true".into());
                size = self.backend.encoded_size(&event);
            }
            if size > limits.max_event_size {
                too_large += 1;
                continue;
            }
            if !batch.is_empty() && batch_size + size > limits.max_batch_size {
                ok &= write(std::mem::take(&mut batch));
                batch_size = 0;
            }
            batch_size += size;
            batch.push(event);
        }
        if !batch.is_empty() {
            ok &= write(batch);
        }
        if too_large > 0 {
            self.metrics.plugin_error("truncate", too_large, &"event is too large even after truncating");
        }
        ok
    }
}

impl Sink {
    pub fn new(
        backend: Box<dyn Backend>,
        mode: Mode,
        batch: BatchConfig,
        truncate: Option<TruncateConfig>,
        metrics: Arc<AuditMetrics>,
    ) -> Sink {
        let stage = Stage { backend, truncate, metrics };
        match mode {
            Mode::Blocking | Mode::BlockingStrict => Sink::Blocking { stage, strict: mode == Mode::BlockingStrict },
            Mode::Batch => {
                let (queue, rx) = std::sync::mpsc::sync_channel(batch.buffer_size.max(1));
                let stage = Arc::new(stage);
                let writer_stage = stage.clone();
                let writer = std::thread::Builder::new()
                    .name("audit-batch".into())
                    .spawn(move || run_batches(rx, &writer_stage, batch))
                    .expect("spawn the audit writer thread");
                Sink::Batch { queue, writer: Mutex::new(Some(writer)), stage }
            }
        }
    }

    /// Hands over one event; false only when blocking-strict could not store it.
    pub fn process(&self, event: &Event, metrics: &AuditMetrics) -> bool {
        match self {
            Sink::Blocking { stage, strict } => {
                let stored = match stage.backend.remote() {
                    true => off_the_async_workers(|| stage.process_one(event)),
                    false => stage.process_one(event),
                };
                stored || !strict
            }
            Sink::Batch { queue, .. } => {
                match queue.try_send(Message::Event(Box::new(event.clone()))) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => metrics.plugin_error("buffered", 1, &"audit buffer queue blocked"),
                    Err(TrySendError::Disconnected(_)) => {
                        metrics.plugin_error("buffered", 1, &"audit backend shut down")
                    }
                }
                true
            }
        }
    }

    /// At shutdown: the batch writer writes what is queued and stops, and what it started is waited for, all within
    /// `timeout`.
    pub fn shutdown(&self, timeout: Duration) {
        let Sink::Batch { queue, writer, stage } = self else { return };
        let deadline = Instant::now() + timeout;
        let (done, wait) = std::sync::mpsc::channel();
        if send_within(queue, Message::Stop(done), timeout).is_ok() && wait.recv_timeout(timeout).is_ok() {
            if let Some(w) = writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = w.join();
            }
            stage.backend.wait_started(deadline);
        }
    }
}

/// Runs `f`, which may wait long, without holding an async worker thread of a multi-threaded runtime (tokio moves
/// the worker's other tasks elsewhere meanwhile). Elsewhere (a plain thread, a single-threaded runtime) `f` just runs.
fn off_the_async_workers<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A bounded queue's send that gives up after `timeout` (a stuck writer must not hold the shutdown).
fn send_within<T>(queue: &SyncSender<T>, mut msg: T, timeout: Duration) -> Result<(), ()> {
    let deadline = Instant::now() + timeout;
    loop {
        match queue.try_send(msg) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return Err(()),
        }
    }
}

/// How long the batch writer pauses, while events flow, before it takes what came meanwhile: short enough that
/// the default buffer (10,000 events) holds what 100,000 events a second bring in the meantime.
const GATHER_PAUSE: Duration = Duration::from_millis(5);

/// The batch writer: collects up to `max_batch_size` events, or what arrives within `max_batch_wait` of the first
/// (with batches of one, the default for the log, each event is written as it comes), throttles, writes.
fn run_batches(rx: Receiver<Message>, stage: &Stage, config: BatchConfig) {
    let throttle =
        config.throttle.map(|(qps, burst)| RateLimiter::new(f64::from(qps), u32::try_from(burst).unwrap_or(u32::MAX)));
    loop {
        let mut batch = Vec::new();
        let mut stop = None;
        match rx.recv() {
            Ok(Message::Event(e)) => batch.push(*e),
            Ok(Message::Stop(done)) => stop = Some(done),
            Err(_) => return,
        }
        let deadline = Instant::now() + config.max_batch_wait;
        // Whether the last look at the queue came after a gathering pause that brought nothing.
        let mut quiet = false;
        while stop.is_none() && batch.len() < config.max_batch_size {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = match rx.try_recv() {
                Ok(msg) => Ok(msg),
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) if left.is_zero() => break,
                // Events are flowing: rather than be woken by each one (a futex wake on the request's thread and a
                // switch to this one, per event), this thread pauses and then takes what came meanwhile at once.
                Err(TryRecvError::Empty) if !quiet => {
                    std::thread::sleep(left.min(GATHER_PAUSE));
                    quiet = true;
                    continue;
                }
                // A pause brought nothing: the next event wakes this thread, as few come.
                Err(TryRecvError::Empty) => rx.recv_timeout(left),
            };
            match msg {
                Ok(Message::Event(e)) => batch.push(*e),
                Ok(Message::Stop(done)) => stop = Some(done),
                Err(_) => break,
            }
            quiet = false;
        }
        if !batch.is_empty() {
            if let Some(t) = &throttle {
                t.acquire_blocking();
            }
            stage.start(batch);
        }
        if let Some(done) = stop {
            // What was queued after the stop request is written too, then the writer ends.
            let rest: Vec<Event> = rx
                .try_iter()
                .filter_map(|m| match m {
                    Message::Event(e) => Some(*e),
                    Message::Stop(_) => None,
                })
                .collect();
            if !rest.is_empty() {
                stage.start(rest);
            }
            let _ = done.send(());
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counting(Arc<Mutex<Vec<usize>>>);

    impl Backend for Counting {
        fn plugin(&self) -> &'static str {
            "counting"
        }
        fn process(&self, events: &[Event]) -> Result<(), BackendError> {
            self.0.lock().expect("lock").push(events.len());
            Ok(())
        }
        fn encoded_size(&self, e: &Event) -> usize {
            e.request_object.as_ref().map_or(10, |o| 10 + o.bytes.len())
        }
    }

    fn event() -> Event {
        Event::for_tests(super::super::policy::Level::Request, "id", "/")
    }

    /// Batches fill up to the max size from what is queued, and a batch short of it is written once the max wait
    /// has passed (events that trickle in after a pause join it, in order).
    #[test]
    fn batches_fill_to_the_max_size_or_leave_after_the_max_wait() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stage = Stage { backend: Box::new(Counting(seen.clone())), truncate: None, metrics: Default::default() };
        let config = BatchConfig {
            buffer_size: 100,
            max_batch_size: 10,
            max_batch_wait: Duration::from_millis(300),
            throttle: None,
        };
        let (queue, rx) = std::sync::mpsc::sync_channel(100);
        for _ in 0..25 {
            queue.send(Message::Event(Box::new(event()))).expect("queued");
        }
        let writer = std::thread::spawn(move || run_batches(rx, &stage, config));
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().expect("lock").iter().sum::<usize>() < 25 {
            assert!(Instant::now() < deadline, "batches so far: {:?}", seen.lock().expect("lock"));
            std::thread::yield_now();
        }
        // The first two were full at once; the last waited for more until the max wait.
        assert_eq!(*seen.lock().expect("lock"), [10, 10, 5]);
        let started = Instant::now();
        for _ in 0..3 {
            queue.send(Message::Event(Box::new(event()))).expect("queued");
        }
        while seen.lock().expect("lock").len() < 4 {
            assert!(Instant::now() < deadline, "batches so far: {:?}", seen.lock().expect("lock"));
            std::thread::yield_now();
        }
        assert_eq!(seen.lock().expect("lock")[3], 3);
        // Written only once its max wait had passed (it starts when the writer takes the first of the three).
        assert!(started.elapsed() >= Duration::from_millis(300), "after {:?}", started.elapsed());
        let (done, acked) = std::sync::mpsc::channel();
        queue.send(Message::Stop(done)).expect("stop");
        acked.recv_timeout(Duration::from_secs(10)).expect("the writer stops");
        writer.join().expect("writer");
    }

    /// The batch throttle (client-go's token bucket, `--audit-*-batch-throttle-*`): with a burst of 1 at 20 a
    /// second, five batches of one take at least the four intervals between them.
    #[test]
    fn the_throttle_spaces_batches_at_its_rate() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stage = Stage { backend: Box::new(Counting(seen.clone())), truncate: None, metrics: Default::default() };
        let config = BatchConfig {
            buffer_size: 100,
            max_batch_size: 1,
            max_batch_wait: Duration::ZERO,
            throttle: Some((20.0, 1)),
        };
        let (queue, rx) = std::sync::mpsc::sync_channel(100);
        for _ in 0..5 {
            queue.send(Message::Event(Box::new(event()))).expect("queued");
        }
        let started = Instant::now();
        let writer = std::thread::spawn(move || run_batches(rx, &stage, config));
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().expect("lock").len() < 5 {
            assert!(Instant::now() < deadline, "batches so far: {:?}", seen.lock().expect("lock"));
            std::thread::yield_now();
        }
        assert_eq!(*seen.lock().expect("lock"), [1, 1, 1, 1, 1]);
        assert!(started.elapsed() >= Duration::from_millis(200), "after {:?}", started.elapsed());
        let (done, acked) = std::sync::mpsc::channel();
        queue.send(Message::Stop(done)).expect("stop");
        acked.recv_timeout(Duration::from_secs(10)).expect("the writer stops");
        writer.join().expect("writer");
    }

    /// truncate_test.go: a large event loses its objects and is annotated; batches are split at the max size.
    #[test]
    fn truncation_drops_objects_then_events_and_splits_batches() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let metrics = Arc::new(AuditMetrics::default());
        let stage = Stage {
            backend: Box::new(Counting(seen.clone())),
            truncate: Some(TruncateConfig { max_event_size: 50, max_batch_size: 25 }),
            metrics,
        };
        let mut big = event();
        big.request_object = Some(super::super::event::Payload {
            bytes: bytes::Bytes::from(vec![b'x'; 100]),
            yaml: false,
            omit_managed_fields: false,
        });
        assert!(stage.process(vec![event(), event(), big]));
        assert_eq!(*seen.lock().expect("lock"), [2, 1]);
    }
}

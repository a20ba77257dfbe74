//! etcd's current revision for consistent reads, one request shared by every reader that waits for it (as etcd
//! batches ReadIndex requests): under 32 concurrent GETs, about one etcd request per round trip instead of 32.
//!
//! A reader may only use a fetch that started after it arrived: a fetch already in flight may have read the
//! revision before a write the reader saw acknowledged, and answering from it would break linearizability. So a
//! reader that arrives while a fetch is in flight waits for the next one, which starts as soon as the current one
//! ends and serves every reader that arrived meanwhile.

use super::super::{Result, Revision, StorageError};
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, Notify};

#[derive(Default)]
struct State {
    /// Fetches started so far (the generation of the newest).
    started: u64,
    /// A fetch is in flight (or about to start).
    running: bool,
    /// A reader arrived after the running fetch started: another one follows it.
    wanted: bool,
    /// Readers that have asked for a revision so far: a test waits on it to know which fetch each one may use.
    #[cfg(test)]
    arrived: u64,
}

pub(super) struct ReadIndex {
    state: Mutex<State>,
    /// Wakes the fetch loop when a fetch is to start and none is running.
    start: Notify,
    /// The newest finished fetch: its generation and what etcd answered.
    done: watch::Sender<(u64, Result<Revision>)>,
}

impl ReadIndex {
    pub(super) fn new() -> Arc<Self> {
        let (done, _) = watch::channel((0, Ok(0)));
        Arc::new(Self { state: Mutex::new(State::default()), start: Notify::new(), done })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// etcd's revision as of a request that started after this call: every write acknowledged before the call is
    /// at or below it.
    pub(super) async fn revision(&self) -> Result<Revision> {
        let mut rx = self.done.subscribe();
        let target = {
            let mut st = self.lock();
            #[cfg(test)]
            {
                st.arrived += 1;
            }
            if st.running {
                st.wanted = true;
                st.started + 1
            } else {
                st.running = true;
                st.started += 1;
                self.start.notify_one();
                st.started
            }
        };
        let done = match rx.wait_for(|(generation, _)| *generation >= target).await {
            Ok(done) => done.1.clone(),
            Err(_) => Err(StorageError::Unavailable("etcd: the revision reader stopped".into())),
        };
        done
    }

    #[cfg(test)]
    fn arrived(&self) -> u64 {
        self.lock().arrived
    }

    /// Runs the fetches, one at a time, while readers want them (the backend's task; aborted with it).
    pub(super) async fn run<F, Fut>(self: Arc<Self>, mut fetch: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Revision>>,
    {
        loop {
            self.start.notified().await;
            loop {
                // The generation was counted before this fetch starts: every reader waiting for it arrived before.
                let generation = self.lock().started;
                let result = fetch().await;
                let _previous = self.done.send_replace((generation, result));
                let mut st = self.lock();
                if !st.wanted {
                    st.running = false;
                    break;
                }
                st.wanted = false;
                st.started += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    use tokio::sync::Semaphore;

    #[tokio::test]
    async fn concurrent_readers_share_fetches_that_started_after_they_arrived() {
        let ri = ReadIndex::new();
        // etcd's revision; each fetch takes a permit, so the test decides when it answers.
        let etcd = Arc::new(AtomicU64::new(100));
        let gate = Arc::new(Semaphore::new(0));
        let fetches = Arc::new(AtomicU64::new(0));
        let (e, g, f) = (etcd.clone(), gate.clone(), fetches.clone());
        let task = tokio::spawn(ri.clone().run(move || {
            let (e, g, f) = (e.clone(), g.clone(), f.clone());
            async move {
                // The revision is read when the request starts, as etcd reads it.
                f.fetch_add(1, Ordering::SeqCst);
                let r = e.load(Ordering::SeqCst);
                g.acquire().await.expect("gate").forget();
                Ok(r)
            }
        }));
        let first: Vec<_> = (0..16)
            .map(|_| {
                tokio::spawn({
                    let ri = ri.clone();
                    async move { ri.revision().await }
                })
            })
            .collect();
        // The first fetch is in flight (it read 100); a write is acknowledged at 101, then more readers come.
        while fetches.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        etcd.store(101, Ordering::SeqCst);
        let later: Vec<_> = (0..16)
            .map(|_| {
                tokio::spawn({
                    let ri = ri.clone();
                    async move { ri.revision().await }
                })
            })
            .collect();
        // Every reader has chosen the fetch it waits for before the first one answers.
        let deadline = Instant::now() + Duration::from_secs(10);
        while ri.arrived() < 32 {
            assert!(Instant::now() < deadline, "{} of 32 readers arrived in 10 s", ri.arrived());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        gate.add_permits(2);
        for r in later {
            assert_eq!(r.await.expect("join"), Ok(101), "a later reader must not use the fetch in flight");
        }
        for r in first {
            // Readers that came before the first fetch started got it; any that came after it got the second.
            assert!(matches!(r.await.expect("join"), Ok(100 | 101)));
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 2, "32 readers, two etcd requests");
        // Idle, then one reader: one fetch of its own.
        gate.add_permits(1);
        assert_eq!(ri.revision().await, Ok(101));
        assert_eq!(fetches.load(Ordering::SeqCst), 3);
        task.abort();
    }

    #[tokio::test]
    async fn errors_reach_the_readers_of_that_fetch() {
        let ri = ReadIndex::new();
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let task = tokio::spawn(ri.clone().run(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => Err(StorageError::Unavailable("etcd: down".into())),
                    _ => Ok(7),
                }
            }
        }));
        assert!(matches!(ri.revision().await, Err(StorageError::Unavailable(_))));
        assert_eq!(ri.revision().await, Ok(7));
        task.abort();
    }
}

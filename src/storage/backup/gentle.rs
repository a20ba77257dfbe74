//! What keeps a snapshot from slowing the requests served meanwhile (issue 40: readers' p99 <= 2x, writers >= 0.8x
//! during a snapshot). A snapshot reads and hashes the whole store and writes it out: at full speed it takes a core
//! and the disk's bandwidth, which the requests need.
//! - **CPU:** the snapshot runs on a thread of its own in Linux's idle scheduling class (`SCHED_IDLE`), so that it
//!   gets what the requests leave of the CPUs: all of them on an idle server, little on a busy one (it then takes
//!   longer). A request's thread that wakes takes the CPU from it at once; at nice 19 (tried first) it could wait
//!   for the end of the snapshot's time slice: writers kept a median x0.64 of their CREATEs during snapshots, x0.85
//!   in the idle classes (BENCHMARKS.md, "Backups (issue 40)"). Resting between chunks was tried as well: it halved
//!   a snapshot's speed and did not measurably help the requests.
//! - **Disk I/O:** the thread's own writes are in the idle I/O class (`ioprio_set`), which the block layer's
//!   schedulers (mq-deadline, bfq) serve after the store's; with no such scheduler it changes nothing.
//! - **Disk:** the file is written behind as it grows ([`WriteBehind`]): each 8 MiB are handed to the disk at once
//!   and waited for before the next are. Otherwise the whole file stays dirty in the page cache until the final
//!   fsync, and on ext4 (data=ordered) every commit of the store in the meantime, whose fsync forces a journal
//!   commit, waits for those blocks too.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};

/// Bytes written before they are handed to the disk.
const CHUNK: u64 = 8 << 20;

/// Runs `f` on a new thread in the idle CPU and I/O classes; its result.
pub fn at_low_priority<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
        lower_priority();
        f()
    })?;
    thread.join().map_err(|_| io::Error::other("the snapshot thread panicked"))
}

#[cfg(target_os = "linux")]
fn lower_priority() {
    // On Linux a thread has its own scheduling policy, nice value and I/O priority: each call below names this
    // thread's id, and changes this thread only. Lowering them needs no privilege; a failure (a seccomp profile
    // that forbids the call) only leaves the snapshot faster and the requests slower, so it is logged and ignored.
    // SAFETY: gettid, sched_setscheduler, setpriority and ioprio_set take plain integers and a param struct that
    // lives across the call.
    unsafe {
        let tid = libc::gettid();
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "snapshot: no idle scheduling class, nice 19");
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        }
        // linux/ioprio.h: IOPRIO_WHO_PROCESS, and the class in the value's top bits (IOPRIO_CLASS_SHIFT 13).
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        if libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid as libc::c_long, IOPRIO_CLASS_IDLE << 13) != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "snapshot: no idle I/O class");
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// A file written sequentially, handed to the disk every [`CHUNK`] bytes (Linux's `sync_file_range`: start writing
/// this chunk, wait for the one before), so that little is dirty when it is fsynced. Seeks pass through; the
/// write-behind follows the sequential writes only, and the final fsync covers everything.
pub struct WriteBehind {
    file: File,
    /// Bytes written at the end of the sequential stream.
    written: u64,
    /// Everything before this offset has been handed to the disk.
    started: u64,
    sequential: bool,
}

impl WriteBehind {
    pub fn new(file: File) -> Self {
        WriteBehind { file, written: 0, started: 0, sequential: true }
    }

    pub fn into_inner(self) -> File {
        self.file
    }

    fn behind(&mut self) {
        if !self.sequential || self.written - self.started < CHUNK {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let fd = self.file.as_raw_fd();
            let len = (self.written - self.started) as libc::off64_t;
            // SAFETY: plain integers on an open descriptor; a failure only means the final fsync does the work.
            unsafe {
                // Wait for the previous chunk, then start this one.
                if self.started >= CHUNK {
                    let previous = (self.started - CHUNK) as libc::off64_t;
                    libc::sync_file_range(
                        fd,
                        previous,
                        CHUNK as libc::off64_t,
                        libc::SYNC_FILE_RANGE_WAIT_BEFORE
                            | libc::SYNC_FILE_RANGE_WRITE
                            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                    );
                }
                libc::sync_file_range(fd, self.started as libc::off64_t, len, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
        self.started = self.written;
    }
}

impl Write for WriteBehind {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        if self.sequential {
            self.written += n as u64;
            self.behind();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for WriteBehind {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.sequential = false;
        self.file.seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn writes_what_it_is_given_in_order_and_seeks_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let mut w = WriteBehind::new(File::create(&path).expect("create"));
        let block = vec![7u8; (CHUNK / 3) as usize];
        for _ in 0..10 {
            w.write_all(&block).expect("write");
        }
        w.seek(SeekFrom::Start(0)).expect("seek");
        w.write_all(b"head").expect("write");
        w.into_inner().sync_all().expect("sync");
        let mut back = Vec::new();
        File::open(&path).expect("open").read_to_end(&mut back).expect("read");
        assert_eq!(back.len(), block.len() * 10);
        assert_eq!(&back[..4], b"head");
        assert!(back[4..].iter().all(|b| *b == 7));
    }

    #[test]
    fn the_low_priority_thread_returns_its_result() {
        assert_eq!(at_low_priority("test", || 6 * 7).expect("thread"), 42);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_low_priority_thread_is_in_the_idle_classes_and_its_caller_is_not() {
        // SAFETY: plain integers in and out, about the calling thread.
        let classes = || unsafe {
            let tid = libc::gettid();
            let io = libc::syscall(libc::SYS_ioprio_get, 1 as libc::c_long, tid as libc::c_long);
            (libc::sched_getscheduler(tid), io >> 13)
        };
        assert_eq!(at_low_priority("test", classes).expect("thread"), (libc::SCHED_IDLE, 3));
        let (policy, _) = classes();
        assert_ne!(policy, libc::SCHED_IDLE, "the caller's thread keeps its class");
    }
}

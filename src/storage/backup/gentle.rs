//! What keeps a snapshot from slowing the requests served meanwhile (issue 40: readers' p99 <= 2x, writers >= 0.8x
//! during a snapshot). A snapshot reads and hashes the whole store and writes it out: at full speed it takes a core
//! and the disk's bandwidth, which the requests need.
//! - **CPU:** the snapshot runs on a thread of its own at the lowest priority (nice 19), so that it gets what the
//!   requests leave of the CPUs: all of them on an idle server, little on a busy one (it then takes longer).
//! - **Disk:** the file is written behind as it grows ([`WriteBehind`]): each 8 MiB are handed to the disk at once
//!   and waited for before the next are. Otherwise the whole file stays dirty in the page cache until the final
//!   fsync, and on ext4 (data=ordered) every commit of the store in the meantime, whose fsync forces a journal
//!   commit, waits for those blocks too.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};

/// Bytes written before they are handed to the disk.
const CHUNK: u64 = 8 << 20;

/// Runs `f` on a new thread at the lowest CPU priority; its result.
pub fn at_low_priority<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
        lower_priority();
        f()
    })?;
    thread.join().map_err(|_| io::Error::other("the snapshot thread panicked"))
}

#[cfg(target_os = "linux")]
fn lower_priority() {
    // On Linux a thread has its own nice value: PRIO_PROCESS with the thread's id sets this thread's only.
    // SAFETY: gettid and setpriority take and return plain integers.
    let failed = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) != 0
    };
    if failed {
        tracing::debug!(error = %io::Error::last_os_error(), "snapshot: could not lower the thread's priority");
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
}

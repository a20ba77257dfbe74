//! A real etcd for tests: `/usr/bin/etcd` (or `$ETCD_BIN`) on free loopback ports with a temporary data directory,
//! healthy before `start` returns, killed on drop.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    /// Client URL, e.g. `http://127.0.0.1:23790`.
    pub endpoint: String,
    pub dir: PathBuf,
    client_port: u16,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

fn binary() -> PathBuf {
    if let Some(b) = std::env::var_os("ETCD_BIN") {
        return PathBuf::from(b);
    }
    for c in ["/usr/bin/etcd", "/usr/local/bin/etcd"] {
        if std::path::Path::new(c).exists() {
            return PathBuf::from(c);
        }
    }
    panic!("etcd not found: install etcd-server (Debian) or set ETCD_BIN");
}

impl Etcd {
    /// Starts a one-member cluster and waits (deadline 30 s) until `/health` says so.
    pub fn start() -> Etcd {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let (client_port, peer_port) = (super::free_port(), super::free_port());
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("log");
        let child = Command::new(binary())
            .args(["--name", "test", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}"), "--initial-cluster-state", "new"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let mut e = Etcd { endpoint: client, dir, client_port, child: Some(child), _tmp: tmp };
        e.wait_healthy(Duration::from_secs(30));
        e
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.client_port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n", self.client_port);
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.contains("\"health\":\"true\"")
    }

    /// Polls `/health` until etcd answers healthy.
    pub fn wait_healthy(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.healthy() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("etcd exited with {status}: {}", self.log());
                }
            }
            assert!(Instant::now() < deadline, "etcd not healthy in {within:?}: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill").arg(sig).arg(c.id().to_string()).status().expect("kill").success();
            assert!(ok, "kill {sig} etcd");
        }
    }

    /// Freezes etcd (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused etcd (SIGCONT) and waits until it is healthy again.
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.wait_healthy(Duration::from_secs(30));
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-CONT").arg(c.id().to_string()).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

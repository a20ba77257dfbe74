//! A real etcd (Debian's etcd-server, `/usr/bin/etcd`) for tests: a fresh data directory, free loopback ports,
//! polled for health with a deadline, killed on drop.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub endpoint: String,
    pub client_port: u16,
    peer_port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

/// The etcd binary: `$ETCD_BIN`, else `etcd` on the PATH (Debian installs it as /usr/bin/etcd).
pub fn etcd_bin() -> String {
    std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into())
}

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_with(&[])
    }

    /// With extra etcd flags (e.g. `--max-request-bytes`).
    pub fn start_with(extra: &[&str]) -> Etcd {
        let tmp = tempfile::tempdir().expect("tempdir");
        let client_port = super::free_port();
        let mut peer_port = super::free_port();
        while peer_port == client_port {
            peer_port = super::free_port();
        }
        let mut e = Etcd {
            endpoint: format!("http://127.0.0.1:{client_port}"),
            client_port,
            peer_port,
            dir: tmp.path().to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            _tmp: tmp,
        };
        e.spawn();
        e
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("etcd.log")).expect("log");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(etcd_bin())
            .arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&self.endpoint)
            .arg("--advertise-client-urls")
            .arg(&self.endpoint)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("test={peer}"))
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} (install Debian's etcd-server): {e}", etcd_bin()));
        self.child = Some(child);
        self.wait_healthy();
    }

    /// Polls `/health` until etcd reports healthy (deadline 30 s).
    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("etcd exited early with {status}: {}", self.log());
            }
            if self.healthy() {
                return;
            }
            if Instant::now() > deadline {
                panic!("etcd not healthy in 30s: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.client_port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        super::kill9_child(self.child.take());
    }

    /// Starts etcd again on the same data directory and ports.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill").arg(sig).arg(c.id().to_string()).status().expect("kill").success();
            assert!(ok, "kill {sig} etcd");
        }
    }

    /// Freezes etcd (SIGSTOP): connections stay open and nothing is answered, as with a partitioned member.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused etcd (SIGCONT) and waits until it is healthy again.
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.wait_healthy();
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint.as_str()], None).await.expect("etcd client")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill9();
    }
}

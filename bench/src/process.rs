//! The server under test, when started by the bench.

use super::*;
use anyhow::{anyhow, bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `--server-arg`: appended to the arguments of every server the bench starts.
static SERVER_ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Sets the `--server-arg` arguments, once, before any server starts.
pub(super) fn set_server_args(args: Vec<String>) {
    let _ = SERVER_ARGS.set(args);
}

fn server_args() -> &'static [String] {
    SERVER_ARGS.get().map_or(&[], Vec::as_slice)
}

// The server under test, when started by us: killed and its directory removed on drop.

pub(super) struct ServerProcess {
    pub(super) child: Child,
    pub(super) bin: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) port: u16,
    /// The CPUs it may run on, when not all.
    pub(super) cpus: Option<Vec<usize>>,
    /// How the server ended, when it ended by itself.
    pub(super) died: Option<String>,
    /// Stopped by us (`stop`), not died.
    pub(super) stopped: bool,
}

impl ServerProcess {
    /// Starts `bin serve` in a new temporary directory on a free port and waits for /readyz.
    pub(super) async fn start(bin: &Path, extra_args: &[&str]) -> anyhow::Result<(ServerProcess, Target)> {
        Self::start_on(bin, extra_args, None).await
    }

    /// [`ServerProcess::start`], with the server (and its restarts) on `cpus` only when given.
    pub(super) async fn start_on(
        bin: &Path,
        extra_args: &[&str],
        cpus: Option<&[usize]>,
    ) -> anyhow::Result<(ServerProcess, Target)> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("migration-apiserver-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = Self::spawn(bin, &dir, port, extra_args, cpus)?;
        let cpus = cpus.map(<[usize]>::to_vec);
        let mut server = ServerProcess { child, bin: bin.to_path_buf(), dir, port, cpus, died: None, stopped: false };
        let target = server.wait_ready().await?;
        Ok((server, target))
    }

    pub(super) fn spawn(
        bin: &Path,
        dir: &Path,
        port: u16,
        extra_args: &[&str],
        cpus: Option<&[usize]>,
    ) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("server.log"))?;
        let (data, certs) = (dir.join("data"), dir.join("certs"));
        let mut command = Command::new(bin);
        command
            .args(["serve", "--secure-port", &port.to_string(), "--bind-address", "127.0.0.1", "--data-dir"])
            .args([data.as_os_str(), "--cert-dir".as_ref(), certs.as_os_str()])
            .args(extra_args)
            .args(server_args())
            // Its runtime sizes itself by the CPUs it may use, one worker thread each, as the admission rows' notes say.
            .env_remove("TOKIO_WORKER_THREADS")
            // A panic's backtrace lands in the log (kept when the server dies; see `Drop`).
            .env("RUST_BACKTRACE", std::env::var_os("RUST_BACKTRACE").unwrap_or("1".into()))
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null());
        let child = match cpus {
            None => command.spawn(),
            // A child starts with the CPU affinity of the thread that starts it: a thread of its own, pinned.
            Some(cpus) => std::thread::scope(|s| {
                s.spawn(|| pin_current_thread(cpus).and_then(|()| command.spawn()))
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the thread starting the server panicked")))
            }),
        }
        .with_context(|| format!("starting {}", bin.display()))?;
        let on = cpus.map_or(String::new(), |c| format!(" on {}", cpu_list(c)));
        let args = extra_args.iter().copied().chain(server_args().iter().map(String::as_str)).collect::<Vec<_>>();
        eprintln!("bench: started {} {} (pid {}) on port {port}{on}", bin.display(), args.join(" "), child.id());
        Ok(child)
    }

    pub(super) async fn wait_ready(&mut self) -> anyhow::Result<Target> {
        let kubeconfig = self.kubeconfig();
        let started = Instant::now();
        let mut last_err = anyhow!("not started");
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(exit) = self.exited() {
                bail!("the server exited ({exit})");
            }
            let ready = async {
                let target = Target::from_kubeconfig(&kubeconfig, None)?;
                target.call_ok(&Req::get("/readyz".into())).await?;
                Ok::<_, anyhow::Error>(target)
            };
            match ready.await {
                Ok(target) => return Ok(target),
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last_err.context("the server did not become ready within 60 s"))
    }

    pub(super) fn kubeconfig(&self) -> PathBuf {
        self.dir.join("certs/admin.kubeconfig")
    }

    pub(super) fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Stops the server (SIGTERM, then SIGKILL after 20 s) and keeps its directory.
    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
        if self.exited().is_some() {
            bail!("the server had exited by itself");
        }
        self.stopped = true;
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        // std has SIGKILL only; a graceful stop closes the store cleanly.
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Stops the server and starts it again on the same directory and port with `extra_args`.
    pub(super) async fn restart(&mut self, extra_args: &[&str]) -> anyhow::Result<Target> {
        self.stop().await?;
        self.child = Self::spawn(&self.bin, &self.dir, self.port, extra_args, self.cpus.as_deref())?;
        self.stopped = false;
        self.wait_ready().await
    }

    /// If the server has exited: how, after printing the end of its log to stderr.
    pub(super) fn exited(&mut self) -> Option<String> {
        if let Some(died) = &self.died {
            return Some(died.clone());
        }
        if self.stopped {
            return None;
        }
        let status = self.child.try_wait().ok()??;
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("bench: the server (pid {}) exited ({status}); the end of its log:", self.child.id());
        tail.iter().rev().for_each(|l| eprintln!("  {l}"));
        self.died = Some(status.to_string());
        Some(status.to_string())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // A server that died by itself keeps its whole log, and every server does with BENCH_KEEP_LOGS set (to
        // read what it logged at RUST_LOG's levels during a run).
        if self.exited().is_some() || std::env::var_os("BENCH_KEEP_LOGS").is_some() {
            let kept = self.dir.with_extension("log");
            if std::fs::copy(self.dir.join("server.log"), &kept).is_ok() {
                eprintln!("bench: the log of the server that exited is kept in {}", kept.display());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `program` itself when it is a path, else the first file of that name in PATH.
pub(super) fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

//! Test harness: starts the real `migration-apiserver` binary over TLS on a free loopback port, with its own data
//! and certificate directories, and talks to it with the `kube` crate or real kubectl.
#![allow(dead_code)]

pub mod admission;
pub mod apiservers;
pub mod cluster;
pub mod crs;
pub mod deploy_kit;
pub mod etcd;
pub mod kms;
pub mod manifests;
pub mod objects;
pub mod oracle;
pub mod proxy;
pub mod requests;
pub mod secrets;
pub mod shootstates;
pub mod status;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_migration-apiserver");

pub struct Server {
    pub dir: PathBuf,
    pub port: u16,
    pub extra_args: Vec<String>,
    /// The etcd this server stores in (`--etcd-servers`), or none for the embedded store.
    pub etcd_endpoint: Option<String>,
    child: Option<Child>,
    /// An etcd of this server's own (the etcd backend chosen by `MIGRATION_APISERVER_TEST_BACKEND=etcd`); dropped
    /// after the server.
    own_etcd: Option<etcd::Etcd>,
    _tmp: Option<tempfile::TempDir>,
}

/// The backend the suites run on: `MIGRATION_APISERVER_TEST_BACKEND=etcd` runs every `Server::start` on an etcd
/// of its own (CI runs the conformance suite both ways); otherwise the embedded store.
pub fn etcd_backend_selected() -> bool {
    std::env::var("MIGRATION_APISERVER_TEST_BACKEND").is_ok_and(|b| b == "etcd")
}

/// The repository's root (the crate's manifest directory).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Server {
    /// Starts a server in a fresh temporary directory.
    pub fn start(extra: &[&str]) -> Server {
        if etcd_backend_selected() {
            let etcd = etcd::Etcd::start();
            let mut s = Server::prepare(extra, Some(etcd.endpoint.clone()));
            s.own_etcd = Some(etcd);
            s.spawn();
            return s;
        }
        let mut s = Server::prepare(extra, None);
        s.spawn();
        s
    }

    /// Starts a server storing in `etcd` (several servers on one etcd are replicas of one another).
    pub fn start_on_etcd(etcd: &etcd::Etcd, extra: &[&str]) -> Server {
        let mut s = Server::prepare(extra, Some(etcd.endpoint.clone()));
        s.spawn();
        s
    }

    fn prepare(extra: &[&str], etcd_endpoint: Option<String>) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        Server {
            dir: tmp.path().to_path_buf(),
            port: free_port(),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            etcd_endpoint,
            child: None,
            own_etcd: None,
            _tmp: Some(tmp),
        }
    }

    /// This server's etcd, when the backend is an etcd of its own.
    pub fn etcd(&mut self) -> Option<&mut etcd::Etcd> {
        self.own_etcd.as_mut()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.join("certs")
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.cert_dir().join("admin.kubeconfig")
    }
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("server.log")).expect("log");
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--secure-port")
            .arg(self.port.to_string())
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--cert-dir")
            .arg(self.cert_dir())
            .args(self.etcd_endpoint.iter().flat_map(|e| ["--etcd-servers", e.as_str()]))
            .args(&self.extra_args)
            .args(self.scheduler_default())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn server");
        self.child = Some(child);
        self.wait_ready();
    }

    /// The embedded scheduler runs only in tests that configure it (any scheduler flag); elsewhere it would add
    /// StorageStates and migrations of its own to what a test lists and watches.
    fn scheduler_default(&self) -> Option<&'static str> {
        let configured = self.extra_args.iter().any(|a| {
            a.starts_with("--discovery-interval")
                || a.starts_with("--kubeconfig")
                || a.starts_with("--disable-trigger")
                || a.starts_with("--migration-")
                || a == "--disable-scheduler"
        });
        (!configured).then_some("--disable-scheduler")
    }

    /// Polls /readyz until the server answers (deadline 30 s).
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("server exited early with {status}: {}", self.log());
                }
            }
            if self.kubeconfig().exists() {
                let out = self.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("server not ready in 30s: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Stops the server with SIGKILL (no chance to flush anything).
    pub fn kill9(&mut self) {
        kill9_child(self.child.take());
    }

    /// Stops the server gracefully (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            kill9_child(Some(c));
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits up to `timeout` for the server to exit (after a signal was sent to it); its exit status, or None when
    /// it still runs (or was not running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.as_mut()?.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes `value` under `key` straight into the embedded store of this (stopped) server, as corruption or an
    /// older writer would leave it.
    pub fn write_raw(&self, key: &str, value: &[u8]) {
        use migration_apiserver::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
        use migration_apiserver::storage::Storage;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let store = EmbeddedStorage::open(&self.data_dir(), EmbeddedOptions::default()).expect("open the store");
            store.create(key, bytes::Bytes::copy_from_slice(value)).await.expect("write");
        });
    }

    /// Stops the server; `namespace/name` -> stored apiVersion of every ShootState (`storage inspect`).
    pub fn stored_shootstate_versions(&mut self) -> std::collections::BTreeMap<String, String> {
        const PREFIX: &str = "/registry/core.gardener.cloud/shootstates/";
        self.stop();
        let v = self.storage_inspect(&["--prefix", PREFIX]);
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|e| {
                let key = e["key"].as_str().unwrap_or("");
                (key.trim_start_matches(PREFIX).to_string(), e["apiVersion"].as_str().unwrap_or("").to_string())
            })
            .collect()
    }

    /// `storage inspect <args> -o json` of this (stopped) server's embedded store; it must succeed; its answer.
    pub fn storage_inspect(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["storage", "inspect", "--data-dir"])
            .arg(self.data_dir())
            .args(args)
            .args(["-o", "json"])
            .output()
            .expect("run storage inspect");
        assert!(out.status.success(), "storage inspect: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("storage inspect JSON")
    }

    /// Starts the server again on the same directories and port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn restart_with(&mut self, extra: &[&str]) {
        self.stop();
        self.extra_args = extra.iter().map(|s| s.to_string()).collect();
        self.spawn();
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_with(&self.kubeconfig(), args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        kubectl_with(&self.kubeconfig(), args, Some(stdin))
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl with `stdin` as its input, that must succeed; returns stdout.
    pub fn kubectl_ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.kubectl_stdin(args, stdin);
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl that must succeed and print JSON (`-o json`); returns it.
    pub fn kubectl_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.kubectl_ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}\n{out}"))
    }

    pub async fn client(&self) -> kube::Client {
        kube::Client::try_from(self.client_config().await).expect("client")
    }

    /// A client that reports 429/503/504 as they come (kube's default client retries them up to 15 times).
    pub async fn client_without_retries(&self) -> kube::Client {
        let mut cfg = self.client_config().await;
        cfg.default_retry = false;
        kube::Client::try_from(cfg).expect("client")
    }

    async fn client_config(&self) -> kube::Config {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Stops a child process with SIGKILL, if there is one, and reaps it.
pub fn kill9_child(child: Option<Child>) {
    if let Some(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new("kubectl");
    // A private discovery cache per server: ports are reused across tests.
    let cache = kubeconfig.parent().map(|p| p.join("kube-cache")).unwrap_or_default();
    cmd.arg("--kubeconfig").arg(kubeconfig).arg("--cache-dir").arg(cache).args(args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("kubectl");
    if let Some(input) = stdin {
        use std::io::Write;
        let mut si = child.stdin.take().expect("stdin");
        si.write_all(input.as_bytes()).expect("write stdin");
    }
    child.wait_with_output().expect("kubectl output")
}

/// A migrating server whose target is `kubeconfig`, migrations requested by hand only.
pub fn migrating_server(kubeconfig: &Path, extra: &[&str]) -> Server {
    let kc = kubeconfig.to_str().expect("path");
    let mut args = vec!["--kubeconfig", kc, "--disable-trigger"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// A migrating server beside a real cluster: standalone (it keeps its migrations in its own store), migrating the
/// cluster's resources through `kubeconfig` (a fault proxy's in front of kube-apiserver), without its trigger and
/// without a leader election, so that several run beside each other on one cluster.
pub fn cluster_migrator(kubeconfig: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--leader-elect=false"];
    args.extend_from_slice(extra);
    migrating_server(kubeconfig, &args)
}

/// Requests a migration of the custom resource `cr`'s objects (as v2, its storage version) with kubectl, as an
/// administrator would; returns its name.
pub fn request_cr_migration(m: &Server, cr: &crs::Cr) -> String {
    let resource = cr.name();
    let manifest = format!(
        "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  generateName: {resource}-\n  labels:\n    migration.k8s.io/resource: {resource}\nspec:\n  resource:\n    group: {}\n    version: v2\n    resource: {}\n",
        cr.group, cr.plural
    );
    let out = m.kubectl_stdin(&["create", "-f", "-", "-o", "jsonpath={.metadata.name}"], &manifest);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Requests a migration of the ShootStates (core.gardener.cloud/v1beta1) with kubectl, as an administrator would;
/// returns its name.
pub fn request_shootstate_migration(m: &Server) -> String {
    let resource = "shootstates.core.gardener.cloud";
    let manifest = format!(
        "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  generateName: {resource}-\n  labels:\n    migration.k8s.io/resource: {resource}\nspec:\n  resource:\n    group: core.gardener.cloud\n    version: v1beta1\n    resource: shootstates\n"
    );
    let out = m.kubectl_stdin(&["create", "-f", "-", "-o", "jsonpath={.metadata.name}"], &manifest);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The name of the migration that `migration-apiserver migrate` reports it created (it must succeed):
/// `storageversionmigration.migration.k8s.io/<name> created`, as kubectl prints it.
pub fn created_migration(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .trim()
        .strip_prefix("storageversionmigration.migration.k8s.io/")
        .and_then(|l| l.strip_suffix(" created"))
        .unwrap_or_else(|| panic!("{stdout:?}"))
        .to_string()
}

/// Polls `f` until it returns Some or the deadline passes.
pub fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Polls the future `f` makes until it yields Some or the deadline passes.
pub async fn eventually_async<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the Python interpreter that has the `kubernetes` package (`make test` installs it into a venv and names it
/// in MIGRATION_APISERVER_TEST_PYTHON; else `python3`); it must succeed; returns stdout.
pub fn python(args: &[&str]) -> String {
    let interpreter = std::env::var("MIGRATION_APISERVER_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&interpreter).args(args).output().unwrap_or_else(|e| panic!("{interpreter}: {e}"));
    assert!(
        out.status.success(),
        "{interpreter} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `migration-apiserver translate <args>` with `stdin` as its input; its output, whatever the exit status.
pub fn translate_cli(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .arg("translate")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn translate");
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    child.wait_with_output().expect("output")
}

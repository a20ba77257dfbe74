//! A real cluster for the tests: etcd, kube-apiserver and kube-controller-manager of the release `make kube` built
//! (target/kube/v1.37.2), with this server registered by the deploy kit, started by `scripts/cluster.sh up` exactly
//! as `make cluster` starts it. The cluster's processes end with the test binary (`CLUSTER_OWNER_PID`), so one
//! cluster can be shared by every test of a binary ([`shared`]).

use super::{repo, BIN};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The release the cluster runs.
pub const KUBE_VERSION: &str = "v1.37.2";

/// Where `make kube` put the binaries: `$KUBE_BIN_DIR`, else target/kube/<version> of this repository.
pub fn kube_bin_dir() -> PathBuf {
    let dir = std::env::var_os("KUBE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/kube").join(KUBE_VERSION));
    assert!(
        dir.join("kube-apiserver").exists(),
        "no kube-apiserver in {}: run `make kube` (make test does) to build the real cluster's binaries",
        dir.display()
    );
    dir
}

/// A binary of the cluster's release (kubectl, etcdctl, ...).
pub fn kube_bin(name: &str) -> PathBuf {
    kube_bin_dir().join(name)
}

/// How a cluster is started: `scripts/cluster.sh`'s settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// kube-apiserver serves storagemigration.k8s.io (INTREE=on).
    pub in_tree: bool,
    /// FORM=crds: CRDs and webhooks in place of the APIServices.
    pub crds: bool,
    /// Whether this server runs (SERVER=off: the bare cluster).
    pub server: bool,
    pub server_args: Vec<String>,
    pub kube_apiserver_args: Vec<String>,
    pub kcm_args: Vec<String>,
    /// KUBE_ENCRYPTION_CONFIG_POLL: how often kube-apiserver checks its encryption config (a release: 1m).
    pub encryption_config_poll: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            in_tree: true,
            crds: false,
            server: true,
            server_args: Vec::new(),
            kube_apiserver_args: Vec::new(),
            kcm_args: Vec::new(),
            encryption_config_poll: None,
        }
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    pub options: Options,
    env: HashMap<String, String>,
    _tmp: tempfile::TempDir,
}

/// The cluster shared by the tests of one binary, started with default options on first use.
pub fn shared() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::up(Options::default()))
}

impl Cluster {
    /// Starts a cluster with `scripts/cluster.sh up` in a temporary directory; panics with the script's output
    /// when it fails.
    pub fn up(options: Options) -> Cluster {
        let tmp = tempfile::Builder::new().prefix("cluster-").tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("scripts/cluster.sh"))
            .arg("up")
            .env("CLUSTER_DIR", &dir)
            .env("KUBE_BIN_DIR", kube_bin_dir())
            .env("MIGRATION_APISERVER", BIN)
            .env("CLUSTER_OWNER_PID", std::process::id().to_string())
            .env("CLUSTER_REMOVE_DIR", "1")
            .env("INTREE", if options.in_tree { "on" } else { "off" })
            .env("FORM", if options.crds { "crds" } else { "aggregated" })
            .env("SERVER", if options.server { "on" } else { "off" })
            .env("SERVER_ARGS", options.server_args.join(" "))
            .env("KUBE_APISERVER_ARGS", options.kube_apiserver_args.join(" "))
            .env("KCM_ARGS", options.kcm_args.join(" "))
            .env("KUBE_ENCRYPTION_CONFIG_POLL", options.encryption_config_poll.clone().unwrap_or_default())
            .stdin(Stdio::null());
        let out = cmd.output().expect("run scripts/cluster.sh");
        assert!(
            out.status.success(),
            "scripts/cluster.sh up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(dir.join("cluster.env"))
            .expect("cluster.env")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Cluster { dir, options, env, _tmp: tmp }
    }

    fn port(&self, name: &str) -> u16 {
        self.env[name].parse().expect("port")
    }

    /// kube-apiserver's URL.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port("API_PORT"))
    }

    /// This server's URL (reached directly, not through kube-apiserver).
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port("SERVER_PORT"))
    }

    pub fn etcd_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port("ETCD_PORT"))
    }

    pub fn pki(&self, file: &str) -> PathBuf {
        self.dir.join("pki").join(file)
    }

    /// This server's certificate directory (its serving CA is `ca.crt` there).
    pub fn server_certs(&self) -> PathBuf {
        self.dir.join("migration-apiserver/certs")
    }

    /// The cluster administrator's kubeconfig (system:masters).
    pub fn admin(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The kubeconfig of `nobody`, a user with no rights.
    pub fn nobody(&self) -> PathBuf {
        self.dir.join("nobody.kubeconfig")
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("logs").join(format!("{name}.log"))).unwrap_or_default()
    }

    /// kubectl of the cluster's release, as `kubeconfig`'s user.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(kube_bin("kubectl"));
        cmd.arg("--kubeconfig").arg(kubeconfig).arg("--cache-dir").arg(self.dir.join("kube-cache")).args(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().expect("kubectl");
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// kubectl as the administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.admin(), args, None)
    }

    /// kubectl as the administrator, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        ok(args, self.kubectl(args))
    }

    /// kubectl as the administrator with `stdin`, which must succeed; its stdout.
    pub fn kubectl_ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        ok(args, self.kubectl_as(&self.admin(), args, Some(stdin)))
    }

    /// kubectl `-o json` as the administrator; its answer.
    pub fn kubectl_json(&self, args: &[&str]) -> Value {
        let out = self.kubectl_ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}\n{out}"))
    }

    /// etcdctl of the cluster's etcd, which must succeed; its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new(kube_bin("etcdctl"))
            .arg("--endpoints")
            .arg(self.etcd_endpoint())
            .args(args)
            .output()
            .expect("etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    }

    /// Stops one process of the cluster (`etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `migration-apiserver`): `scripts/cluster.sh stop`.
    pub fn stop(&self, name: &str) {
        self.script(&["stop", name]);
    }

    /// Starts one process again as it was started and waits until it serves: `scripts/cluster.sh restart`.
    pub fn restart(&self, name: &str) {
        self.script(&["restart", name]);
    }

    /// Starts one process again with `from` replaced by `to` in its arguments (a changed flag, as an upgrade or
    /// an operator changes it), and waits until it serves.
    pub fn restart_with(&self, name: &str, from: &str, to: &str) {
        self.restart_with_args(name, from, &[to]);
    }

    /// Starts one process again with the argument `from` replaced by `to` (none, one or several arguments), and
    /// waits until it serves.
    pub fn restart_with_args(&self, name: &str, from: &str, to: &[&str]) {
        let path = self.dir.join("cmds").join(name);
        let cmd = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        assert!(args.contains(&from.as_bytes()), "{name} was not started with {from}");
        let mut replaced = Vec::new();
        for a in args {
            let with: Vec<&[u8]> =
                if a == from.as_bytes() { to.iter().map(|t| t.as_bytes()).collect() } else { vec![a] };
            for w in with {
                replaced.extend_from_slice(w);
                replaced.push(0);
            }
        }
        std::fs::write(&path, replaced).expect("write the command line");
        self.restart(name);
    }

    fn script(&self, args: &[&str]) {
        let out = Command::new("bash")
            .arg(repo().join("scripts/cluster.sh"))
            .args(args)
            .env("CLUSTER_DIR", &self.dir)
            .env("KUBE_BIN_DIR", kube_bin_dir())
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/cluster.sh");
        assert!(
            out.status.success(),
            "scripts/cluster.sh {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The samples of `metric` on this server's /metrics (read directly, with the cluster administrator's
    /// certificate), sorted.
    pub fn server_metric_lines(&self, metric: &str) -> Vec<String> {
        let out = Command::new("curl")
            .args(["-sf", "--cacert"])
            .arg(self.server_certs().join("ca.crt"))
            .arg("--cert")
            .arg(self.pki("admin.crt"))
            .arg("--key")
            .arg(self.pki("admin.key"))
            .arg(format!("{}/metrics", self.server_url()))
            .output()
            .expect("curl");
        assert!(out.status.success(), "GET /metrics: {}", String::from_utf8_lossy(&out.stderr));
        let prefix = format!("{metric}{{");
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    /// `make deploy DRY_RUN=1` against this cluster as its administrator, with its kubectl: the objects it would
    /// apply, and what it said on stderr.
    pub fn render(&self, form: &str) -> (Vec<Value>, String) {
        super::deploy_kit::render(&self.admin(), Some(&kube_bin_dir()), form)
    }

    /// `make deploy` again, as `make cluster` ran it for this cluster's server (its certificates, its local port):
    /// the deploy kit reads the cluster and applies what it decides. Returns the kit's stderr.
    pub fn deploy(&self) -> String {
        let mut path = std::ffi::OsString::from(kube_bin_dir());
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let out = Command::new("bash")
            .arg(repo().join("scripts/deploy.sh"))
            .env("KUBECONFIG", self.admin())
            .env("CERT_DIR", self.server_certs())
            .env("FORM", if self.options.crds { "crds" } else { "aggregated" })
            .env("LOCAL_PORT", self.port("SERVER_PORT").to_string())
            .env("MIGRATION_APISERVER", BIN)
            .env("PATH", path)
            .env_remove("IN_TREE_GROUPS")
            .env_remove("OFFLINE")
            .env_remove("DRY_RUN")
            .stdin(Stdio::null())
            .output()
            .expect("deploy.sh");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "deploy.sh: {stderr}{}", String::from_utf8_lossy(&out.stdout));
        stderr
    }

    /// A `kube` client as the administrator, through kube-apiserver.
    pub async fn client(&self) -> kube::Client {
        client_of(&self.admin()).await
    }
}

/// A `kube` client of a kubeconfig.
pub async fn client_of(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    kube::Client::try_from(cfg).expect("client")
}

fn ok(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/cluster.sh"))
            .arg("down")
            .env("CLUSTER_DIR", &self.dir)
            .status();
    }
}

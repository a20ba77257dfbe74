//! The README's "Try it in a local cluster", run as written: its server block (`make cluster`) as the Makefile's
//! recipe runs it (scripts/cluster.sh with this build's binary), then its client block in bash at the top of a
//! directory laid out as the repository (`target/cluster`, `target/kube/v1.37.2`), `make cluster-down` included.

mod common;
use common::cluster::kube_bin_dir;
use common::{repo, BIN};
use std::process::{Command, Stdio};

/// The blocks of the walk-through marked `<!-- cluster: <role> -->`, in order.
fn blocks(role: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let marker = format!("<!-- cluster: {role} -->");
    readme
        .split(&marker)
        .skip(1)
        .map(|rest| {
            let block = rest.split("```sh\n").nth(1).expect("a sh block after the marker");
            block.split("```").next().expect("the block's end").to_string()
        })
        .collect()
}

#[test]
fn the_local_cluster_walkthrough_works_as_written() {
    let server = blocks("server");
    assert_eq!(server.len(), 1, "one server block");
    assert_eq!(server[0].lines().next().map(|l| l.split('#').next().unwrap_or("").trim()), Some("make cluster"));
    let client = blocks("client");
    assert_eq!(client.len(), 1, "one client block");

    // The repository as `make cluster` leaves it: target/kube/v1.37.2 (make kube) and target/cluster.
    let tmp = tempfile::tempdir().expect("tempdir");
    let top = tmp.path();
    std::fs::create_dir_all(top.join("target/kube")).expect("mkdir");
    std::os::unix::fs::symlink(kube_bin_dir(), top.join("target/kube/v1.37.2")).expect("symlink");
    std::fs::create_dir_all(top.join("scripts")).expect("mkdir");
    std::os::unix::fs::symlink(repo().join("scripts/cluster.sh"), top.join("scripts/cluster.sh")).expect("symlink");
    let cluster_dir = top.join("target/cluster");
    // `make cluster`: the Makefile's recipe, with this build's binary in place of the release build.
    let up = Command::new("bash")
        .arg(repo().join("scripts/cluster.sh"))
        .arg("up")
        .env("CLUSTER_DIR", &cluster_dir)
        .env("KUBE_BIN_DIR", top.join("target/kube/v1.37.2"))
        .env("MIGRATION_APISERVER", BIN)
        .env("CLUSTER_OWNER_PID", std::process::id().to_string())
        .stdin(Stdio::null())
        .output()
        .expect("scripts/cluster.sh up");
    let printed = String::from_utf8_lossy(&up.stdout).into_owned();
    assert!(up.status.success(), "{printed}{}", String::from_utf8_lossy(&up.stderr));
    assert!(printed.contains("admin.kubeconfig") && printed.contains("nobody.kubeconfig"), "{printed}");
    assert!(printed.contains("make cluster-down"), "{printed}");

    // The client block in bash at the top of the directory; `make cluster-down` runs the Makefile's recipe there.
    let makefile = "cluster-down:\n\tCLUSTER_DIR=$(abspath target/cluster) bash scripts/cluster.sh down\n";
    std::fs::write(top.join("Makefile"), makefile).expect("Makefile");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&client[0])
        .current_dir(top)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("Server Version: v1.37.2"), "{stdout}{stderr}");
    let apiservice = stdout.lines().find(|l| l.starts_with("v1alpha1.migration.k8s.io")).expect(&stdout);
    assert!(
        apiservice.contains("migration-apiserver/migration-apiserver") && apiservice.contains("True"),
        "{apiservice}"
    );
    assert!(stdout.lines().any(|l| l.starts_with("shootstates.core.gardener.cloud ")), "{stdout}{stderr}");
    assert!(
        stderr.contains("User \"nobody\" cannot list resource \"storagestates\" in API group \"migration.k8s.io\""),
        "{stderr}"
    );
    // make cluster-down stopped it: kube-apiserver's pid file is gone and nothing answers on its port.
    assert!(!cluster_dir.join("pids/kube-apiserver").exists(), "{stdout}{stderr}");
    let env = std::fs::read_to_string(cluster_dir.join("cluster.env")).expect("cluster.env");
    let port = env.lines().find_map(|l| l.strip_prefix("API_PORT=")).expect("API_PORT");
    assert!(std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(), "kube-apiserver still listens");
}

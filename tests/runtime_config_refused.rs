//! A `--runtime-config` that would break the server is refused at its start, before it creates its store. What
//! `make deploy` and the server decide next to what a cluster already runs is tests/cluster_install_guard.rs's,
//! against a real kube-apiserver; `storagemigration.k8s.io`, which kube-apiserver may serve itself, is
//! tests/cluster_intree.rs's and tests/storagemigration_safety.rs's.

mod common;
use common::BIN;

#[test]
fn runtime_config_that_would_break_the_server_is_refused_at_start() {
    for (flag, message) in [
        (
            "core.gardener.cloud/v1beta1=false",
            "--runtime-config: core.gardener.cloud is turned off for v1beta1 but not for v1alpha1: this server serves a group whole or not at all",
        ),
        (
            "migration.k8s.io/v1alpha1=false",
            "--runtime-config: migration.k8s.io cannot be turned off while the scheduler runs (it records its StorageStates and StorageVersionMigrations there); add --disable-scheduler",
        ),
        ("apps/v1=false", "--runtime-config: this server serves no apps/v1 (it serves "),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new(BIN)
            .args(["serve", "--secure-port", "0", "--runtime-config", flag, "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--cert-dir")
            .arg(dir.path().join("certs"))
            .output()
            .expect("serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(message), "{flag}: {stderr}");
        assert!(!dir.path().join("data").exists(), "{flag}: refused before the store is created");
    }
}

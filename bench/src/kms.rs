//! KMS v2 (issue 39): ShootState CREATE and GET under a KMS v2 provider, next to aesgcm in the same run (the
//! `encryption` group), and a key rotation of the ShootStates on a key_id change of the plugin (the `rotation`
//! group). The plugin is the binary's test plugin (`kms-test-plugin`), a process of its own on a unix socket, as a
//! production plugin would be.

use super::*;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The provider's name in the bench's configs.
const PROVIDER: &str = "bench";
/// Status polled every second instead of every minute: a rotation starts within a second of the plugin's new key_id
/// rather than within a minute (test-only timings; nothing else changes). The rotation row measures from the key_id
/// change anyway.
const TIMINGS: &str = "poll=1s";

/// The test KMS v2 plugin, a process of its own; killed on drop.
pub(super) struct PluginProcess {
    child: Child,
    pub(super) endpoint: String,
}

impl PluginProcess {
    /// Starts `bin kms-test-plugin` on a socket in `dir` with key_id `key-1`, and waits for its socket.
    pub(super) fn start(bin: &Path, dir: &Path) -> anyhow::Result<PluginProcess> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("kms.sock");
        let _ = std::fs::remove_file(&socket);
        let endpoint = format!("unix://{}", socket.display());
        let child = Command::new(bin)
            .args(["kms-test-plugin", "--listen", &endpoint, "--key-id", "key-1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the test KMS v2 plugin")?;
        let mut plugin = PluginProcess { child, endpoint };
        let started = Instant::now();
        while !socket.exists() {
            if let Some(status) = plugin.child.try_wait()? {
                bail!("the test KMS v2 plugin exited at start ({status})");
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("the test KMS v2 plugin did not listen on {} within 10 s", socket.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(plugin)
    }

    /// SIGUSR1: the plugin's key_id moves on (`key-1` -> `key-2`).
    pub(super) fn rotate(&self) -> anyhow::Result<()> {
        let status = Command::new("kill").args(["-USR1", &self.child.id().to_string()]).status()?;
        if !status.success() {
            bail!("kill -USR1 the test KMS v2 plugin: {status}");
        }
        Ok(())
    }

    /// The EncryptionConfiguration of ShootStates with this plugin as the only provider, written in `dir`.
    pub(super) fn config(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let yaml = format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
             - resources: [shootstates.core.gardener.cloud]\n  providers:\n  - kms:\n      apiVersion: v2\n      \
             name: {PROVIDER}\n      endpoint: {}\n",
            self.endpoint
        );
        let path = dir.join("kms-encryption-config.yaml");
        std::fs::write(&path, yaml)?;
        Ok(path)
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a KMS v2 value of the bench's provider is labelled by `storage inspect` (`encryption`).
pub(super) const KMS_LABEL: &str = "kms:v2:bench";

/// The StorageStates' write key of the bench's provider with `key_id`: `kms:v2:bench:sha256:<hex>`.
fn write_key(key_id: &str) -> String {
    use sha2::Digest;
    format!("{KMS_LABEL}:sha256:{:x}", sha2::Sha256::digest(key_id.as_bytes()))
}

/// A key rotation of `n` ShootStates when the plugin's key_id changes (key-1 -> key-2), on a server of its own with
/// the rotation rows' flags (`--migration-qps 0`); `aesgcm` is the aesgcm rotation row of the same run, for the
/// ratio. Afterwards `storage inspect` finds every value under key-2.
pub(super) async fn kms_rotation_row(bin: &Path, n: u64, dir: &Path, aesgcm: Option<&Row>) -> anyhow::Result<Row> {
    let scenario =
        format!("key rotation of 10^{} ShootStates on a KMS v2 key_id change (--migration-qps 0)", n.ilog10());
    let plugin = PluginProcess::start(bin, &dir.join("kms"))?;
    let config = plugin.config(dir)?;
    std::env::set_var("MIGRATION_APISERVER_KMS_TEST_TIMINGS", TIMINGS);
    let started = ServerProcess::start(
        bin,
        &["--encryption-provider-config", config.to_str().context("utf-8")?, "--migration-qps", "0"],
    )
    .await;
    std::env::remove_var("MIGRATION_APISERVER_KMS_TEST_TIMINGS");
    let (mut server, target) = started?;
    eprintln!("bench: rotation: storing {n} ShootStates under the KMS v2 provider's key-1");
    let seed = run_load(&target, None, 64, None, n, shoot_state_creates(0, "")).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    wait_rotation(&target, &mut server, &write_key("key-1"), None).await?;

    eprintln!("bench: rotation: key rotation of {n} ShootStates on the plugin's new key_id (key-1 -> key-2)");
    let before = shootstate_migrations(&target).await?;
    let rotated_at = Instant::now();
    plugin.rotate()?;
    let (name, status) = wait_new_migration(&target, &mut server, &before).await?;
    check_migrated(&status, n)?;
    let state = wait_rotation(&target, &mut server, &write_key("key-2"), Some(n)).await?;
    let finished_after = rotated_at.elapsed();
    let seconds = migrator_seconds(&server, &name)?;
    server.stop().await?;
    let items = stored_shootstates(bin, &server.data_dir())?;
    let key_id_hash = write_key("key-2").trim_start_matches(&format!("{KMS_LABEL}:")).to_string();
    let under_key_2 = items.iter().filter(|e| e["encryption"] == KMS_LABEL && e["keyIdHash"] == key_id_hash).count();
    if under_key_2 as u64 != n || items.len() as u64 != n {
        bail!("storage inspect: {under_key_2} of {} stored ShootStates under key-2, {n} expected", items.len());
    }
    let rate = n as f64 / seconds;
    let versus = match aesgcm.and_then(|r| r.rps_v) {
        Some(a) if a > 0.0 => format!("x{:.2} of the aesgcm rotation's; ", rate / a),
        _ => String::new(),
    };
    Ok(Row {
        scenario,
        rps: thousands(rate),
        notes: format!(
            "objects/s; {versus}the plugin's key_id changed while serving (SIGUSR1), the key-rotation trigger's \
             migration by the server's own scheduler: {} objects in {seconds:.1} s (the migrator's start to \
             Succeeded); from the key_id change (Status polled every second here, every minute by default): \
             StorageState Finished after {:.1} s with encryptionKeyCounts {}; afterwards storage inspect: all {} \
             under key-2",
            thousands(n as f64),
            finished_after.as_secs_f64(),
            state["status"]["encryptionKeyCounts"],
            thousands(n as f64),
        ),
        rps_v: Some(rate),
        ..Row::default()
    })
}

/// CREATE and GET of 100 KiB ShootStates under a KMS v2 provider (the plugin in `dir`), the rows' notes with their
/// ratios to `aesgcm`'s rows of the same run (target: >= 0.8x: once a seed is cached the plugin is off the path).
pub(super) async fn kms_shootstate_rows(
    bin: &Path,
    conns: usize,
    duration: Duration,
    run: &str,
    dir: &Path,
) -> anyhow::Result<(Row, Row)> {
    let plugin = PluginProcess::start(bin, &dir.join("kms"))?;
    let config = plugin.config(dir)?;
    let config = config.to_str().context("utf-8")?;
    eprintln!("bench: ShootState 100 KiB, kms v2 ({conns} connections, {duration:?} each)");
    shootstate_rows(bin, &["--encryption-provider-config", config], "kms v2", KMS_LABEL, conns, duration, run).await
}

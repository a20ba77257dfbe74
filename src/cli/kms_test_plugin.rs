//! `migration-apiserver kms-test-plugin` (hidden): the test KMS v2 plugin ([`crate::kms_test_plugin`]) from a shell,
//! for walk-throughs. SIGUSR1 rotates its key_id, SIGUSR2 toggles its Status healthz; it stops on SIGINT/SIGTERM.

use crate::kms_test_plugin::TestKmsPlugin;
use base64::Engine;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct KmsTestPluginArgs {
    /// Where to serve: `unix:///path/to/socket` or `unix:///@name` (Linux abstract socket).
    #[arg(long)]
    pub listen: String,
    /// The key_id at start.
    #[arg(long, default_value = "key-1")]
    pub key_id: String,
    /// The master secret (base64 of 32 bytes), created when the file does not exist: a restarted plugin with the
    /// same file decrypts what it encrypted before. Without it the secret is random and lives in memory only.
    #[arg(long)]
    pub master_key_file: Option<PathBuf>,
    /// Every call waits this long before it answers (Go duration, e.g. 500ms).
    #[arg(long, value_parser = crate::duration::parse_duration)]
    pub delay: Option<std::time::Duration>,
}

fn master_key(path: &std::path::Path) -> anyhow::Result<[u8; 32]> {
    let b64 = base64::engine::general_purpose::STANDARD;
    if path.exists() {
        let text = std::fs::read_to_string(path)?;
        let bytes = b64.decode(text.trim())?;
        return bytes.try_into().map_err(|_| anyhow::anyhow!("{}: the master key must be 32 bytes", path.display()));
    }
    let mut key = [0u8; 32];
    aes_gcm::aead::rand_core::RngCore::fill_bytes(&mut aes_gcm::aead::OsRng, &mut key);
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(f, "{}", b64.encode(key))?;
    Ok(key)
}

/// Runs the plugin until SIGINT or SIGTERM.
pub async fn kms_test_plugin(args: KmsTestPluginArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let master = args.master_key_file.as_deref().map(master_key).transpose()?;
    let plugin = TestKmsPlugin::start(&args.listen, &args.key_id, master)?;
    if let Some(d) = args.delay {
        plugin.set_delay(d);
    }
    let (mut rotate, mut toggle) = (signal(SignalKind::user_defined1())?, signal(SignalKind::user_defined2())?);
    let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    eprintln!("kms-test-plugin serving on {} with key_id {}", args.listen, plugin.key_id());
    loop {
        tokio::select! {
            _ = rotate.recv() => eprintln!("kms-test-plugin: key_id is now {}", plugin.rotate()),
            _ = toggle.recv() => {
                let next = if plugin.healthz() == "ok" { "unhealthy" } else { "ok" };
                plugin.set_healthz(next);
                eprintln!("kms-test-plugin: healthz is now {next}");
            }
            _ = int.recv() => break,
            _ = term.recv() => break,
        }
    }
    Ok(())
}

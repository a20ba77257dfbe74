//! The test KMS v2 plugin run in the test process, and encryption configs with a `kms` provider (tests/kms.rs,
//! tests/kms_rotation.rs). The servers inherit the shortened intervals of MIGRATION_APISERVER_KMS_TEST_TIMINGS
//! (test-only) from the test process.

use migration_apiserver::kms_test_plugin::TestKmsPlugin;
use std::path::{Path, PathBuf};

/// The same value in every test of a binary: the servers inherit it from the test process.
pub const TIMINGS: &str = "poll=300ms,retry=300ms,write-ttl=3s,healthy-cache=200ms,failed-cache=200ms";

/// The plugin runs on a runtime of its own, alive as long as the test.
pub struct Plugin {
    pub plugin: TestKmsPlugin,
    pub endpoint: String,
    _runtime: tokio::runtime::Runtime,
}

/// A plugin on an abstract socket named after `test`, with key_id `key-1`; `master`: its master secret (two
/// plugins with the same one decrypt each other's seeds, as two instances of one KMS do).
pub fn plugin_with(test: &str, master: Option<[u8; 32]>) -> Plugin {
    std::env::set_var(migration_apiserver::storage::encryption::kms::timings::TEST_TIMINGS_ENV, TIMINGS);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let endpoint = format!("unix:///@migration-apiserver-kms-{}-{test}", std::process::id());
    let plugin = runtime.block_on(async { TestKmsPlugin::start(&endpoint, "key-1", master) }).expect("plugin");
    Plugin { plugin, endpoint, _runtime: runtime }
}

pub fn plugin(test: &str) -> Plugin {
    plugin_with(test, None)
}

/// A `kms` provider named `p1` on `endpoint`.
pub fn kms_provider(endpoint: &str) -> String {
    format!("  - kms:\n      apiVersion: v2\n      name: p1\n      endpoint: {endpoint}\n      timeout: 1s\n")
}

/// An EncryptionConfiguration of ShootStates with `providers`.
pub fn config_yaml(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
         [\"shootstates.core.gardener.cloud\"]\n  providers:\n{providers}"
    )
}

/// Writes `content` to `path` by rename (what a reload must see whole).
pub fn write_config(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// `content` as `encryption.yaml` in a new temporary directory, which lives as long as the returned `TempDir`.
pub fn config_file(content: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("encryption.yaml");
    write_config(&path, content);
    (dir, path)
}

/// upstream's hash of a key_id, `sha256:<hex>`.
pub fn key_id_hash(key_id: &str) -> String {
    use sha2::Digest;
    format!("sha256:{:x}", sha2::Sha256::digest(key_id.as_bytes()))
}

/// The StorageStates' and the counts' name of `p1` writing with `key_id`.
pub fn p1_label(key_id: &str) -> String {
    format!("kms:v2:p1:{}", key_id_hash(key_id))
}

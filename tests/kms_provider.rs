//! The KMS v2 provider in-process against the test plugin over a real unix socket: one Encrypt per seed, reads
//! through the seed cache, key_id rotation from Status, the plugin down (cached reads go on, writes until the write
//! expiry, then upstream's error), unhealthy and slow plugins, and the `kms-providers` check's messages. The server
//! binary's behaviour on top of this is tests/kms.rs.

use bytes::Bytes;
use migration_apiserver::kms_test_plugin::TestKmsPlugin;
use migration_apiserver::storage::encryption::kms::timings::TEST_TIMINGS_ENV;
use migration_apiserver::storage::encryption::EncryptionConfig;
use std::time::{Duration, Instant};

/// Short timings so that expiry and recovery take seconds (the same value in every test of this binary).
const TIMINGS: &str = "poll=200ms,retry=200ms,write-ttl=2s,healthy-cache=100ms,failed-cache=100ms";

fn setup() {
    std::env::set_var(TEST_TIMINGS_ENV, TIMINGS);
}

/// An abstract socket name of its own per test (no files to clean up, no clash between tests).
fn endpoint(test: &str) -> String {
    format!("unix:///@migration-apiserver-test-{}-{test}", std::process::id())
}

fn config(endpoint: &str, timeout: &str) -> EncryptionConfig {
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  \
         providers:\n  - kms:\n      apiVersion: v2\n      name: p1\n      endpoint: {endpoint}\n      timeout: {timeout}\n"
    );
    EncryptionConfig::from_yaml(&yaml).expect("config")
}

const KEY: &str = "/registry/secrets/ns/a";

async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads `stored` as the server does: DEK source first, then the value.
async fn read(c: &EncryptionConfig, stored: &Bytes) -> Result<(Vec<u8>, bool), String> {
    c.prepare(KEY, stored).await.map_err(|e| e.to_string())?;
    c.decrypt(KEY, stored).map(|d| (d.value.to_vec(), d.stale)).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_encrypt_per_seed_and_reads_through_the_cache() {
    setup();
    let ep = endpoint("seed");
    let plugin = TestKmsPlugin::start(&ep, "key-1", None).expect("plugin");
    let c = config(&ep, "3s");
    c.start_kms().await;
    assert_eq!(c.check_kms().await, Ok(()));
    let stored: Vec<Bytes> = (0..10).map(|i| c.encrypt(KEY, format!("value {i}").as_bytes()).expect("write")).collect();
    assert_eq!(plugin.encrypt_calls(), 1, "one Encrypt for the seed, none per write");
    for (i, s) in stored.iter().enumerate() {
        assert!(s.starts_with(b"k8s:enc:kms:v2:p1:"));
        assert_eq!(read(&c, s).await.expect("read"), (format!("value {i}").into_bytes(), false));
    }
    assert_eq!(plugin.decrypt_calls(), 0, "the write seed is at hand");
    // A new config (a restart, a reload) has a new seed: the old values' seed is decrypted once, then cached.
    let again = config(&ep, "3s");
    again.start_kms().await;
    for s in &stored {
        assert!(!read(&again, s).await.expect("read").1, "same key_id, another seed: not stale");
    }
    assert_eq!(plugin.decrypt_calls(), 1);
    assert_eq!(plugin.encrypt_calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_id_from_status_is_a_new_seed_and_old_values_are_stale() {
    setup();
    let ep = endpoint("rotate");
    let plugin = TestKmsPlugin::start(&ep, "key-1", None).expect("plugin");
    let c = config(&ep, "3s");
    c.start_kms().await;
    let old = c.encrypt(KEY, b"old").expect("write");
    assert_eq!(plugin.rotate(), "key-2");
    eventually("the rotation", async || {
        let new = c.encrypt(KEY, b"new").ok()?;
        (!read(&c, &new).await.ok()?.1).then_some(()).filter(|_| plugin.encrypt_calls() == 2)
    })
    .await;
    // key-2's Encrypt was the only one: later polls with the same key_id only extend the expiry.
    eventually("the rotation", async || (read(&c, &old).await.ok()? == (b"old".to_vec(), true)).then_some(())).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(plugin.encrypt_calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_is_adopted_only_when_encrypt_returns_the_status_key_id() {
    setup();
    let ep = endpoint("mismatch");
    let plugin = TestKmsPlugin::start(&ep, "key-1", None).expect("plugin");
    let c = config(&ep, "1s");
    c.start_kms().await;
    let old = c.encrypt(KEY, b"old").expect("write");
    plugin.set_encrypt_key_id(Some("key-3"));
    plugin.set_key_id("key-2");
    let e = eventually("the failed rotation", async || c.check_kms().await.err()).await;
    assert!(e.starts_with("kms-provider-0: kmsv2 Provider p1 is not healthy, error: failed to rotate DEK uid="), "{e}");
    let (status_hash, encrypt_hash) = (sha256("key-2"), sha256("key-3"));
    assert!(e.contains(&format!("statusKeyIDHash=\"{status_hash}\", encryptKeyIDHash=\"{encrypt_hash}\"")), "{e}");
    // The old state stays, and is not extended: key-1 writes until its expiry, then nothing writes.
    assert_eq!(read(&c, &old).await.expect("read"), (b"old".to_vec(), false));
    let e = eventually("the expiry", async || c.encrypt(KEY, b"x").err()).await.to_string();
    assert!(e.contains(&format!("encryptedDEKSource with keyID hash \"{}\" expired at", sha256("key-1"))), "{e}");
    // A plugin that keeps the contract again: key-2 is adopted, key-1's values are stale.
    plugin.set_encrypt_key_id(None);
    let new = eventually("the rotation", async || c.encrypt(KEY, b"new").ok()).await;
    assert_eq!(read(&c, &new).await.expect("read"), (b"new".to_vec(), false));
    assert_eq!(read(&c, &old).await.expect("read"), (b"old".to_vec(), true));
}

fn sha256(s: &str) -> String {
    use sha2::Digest;
    format!("sha256:{:x}", sha2::Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_plugin_is_down_cached_reads_go_on_and_writes_until_the_expiry() {
    setup();
    let ep = endpoint("down");
    let plugin = TestKmsPlugin::start(&ep, "key-1", None).expect("plugin");
    let writer = config(&ep, "1s");
    writer.start_kms().await;
    let c = config(&ep, "1s");
    c.start_kms().await;
    let cached = c.encrypt(KEY, b"cached").expect("write");
    let uncached = writer.encrypt(KEY, b"other seed").expect("write");
    plugin.set_down(true);
    let down_at = Instant::now();
    assert_eq!(read(&c, &cached).await.expect("cached read"), (b"cached".to_vec(), false));
    let e = read(&c, &uncached).await.expect_err("needs Decrypt");
    assert_eq!(
        e,
        "storage error: failed to decrypt DEK, error: rpc error: code = Unavailable desc = the test KMS plugin is down"
    );
    let e = eventually("the write expiry", async || c.encrypt(KEY, b"late").err()).await.to_string();
    assert!(down_at.elapsed() >= Duration::from_millis(1500), "writes went on until the expiry");
    assert!(e.contains("encryptedDEKSource with keyID hash \"sha256:"), "{e}");
    assert!(e.contains("expired at") && e.contains("(current time is"), "{e}");
    let e = eventually("the health check", async || c.check_kms().await.err()).await;
    assert!(e.starts_with("kms-provider-0: "), "{e}");
    assert!(e.contains("rpc error: code = Unavailable desc = the test KMS plugin is down"), "{e}");
    // Back with the same key_id: the expiry is extended, no Encrypt.
    let encrypts = plugin.encrypt_calls();
    plugin.set_down(false);
    eventually("writes again", async || c.encrypt(KEY, b"again").ok()).await;
    assert_eq!(plugin.encrypt_calls(), encrypts);
    eventually("healthy again", async || c.check_kms().await.ok()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_messages_are_upstreams() {
    setup();
    let ep = endpoint("health");
    let plugin = TestKmsPlugin::start(&ep, "key-1", None).expect("plugin");
    let c = config(&ep, "1s");
    c.start_kms().await;
    plugin.set_healthz("not-ok");
    let e = eventually("unhealthy", async || c.check_kms().await.err()).await;
    assert_eq!(e, "kms-provider-0: kmsv2 Provider p1 is not healthy, error: got unexpected healthz status: not-ok");
    plugin.set_healthz("ok");
    eventually("healthy", async || c.check_kms().await.ok()).await;
    // An invalid key_id (empty) and a bad healthz together: Go's aggregate of both.
    plugin.set_key_id("");
    plugin.set_healthz("not-ok");
    let e = eventually("the invalid key_id", async || c.check_kms().await.err().filter(|e| e.contains("KeyID"))).await;
    assert_eq!(
        e,
        "kms-provider-0: kmsv2 Provider p1 is not healthy, error: [got unexpected healthz status: not-ok, got invalid \
         KMSv2 KeyID hash \"\": keyID is empty]"
    );
    plugin.set_key_id("key-1");
    plugin.set_healthz("ok");
    eventually("healthy", async || c.check_kms().await.ok()).await;
    // A bad healthz fails the check but does not stop writes.
    plugin.set_healthz("not-ok");
    eventually("unhealthy", async || c.check_kms().await.err()).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(c.encrypt(KEY, b"x").is_ok(), "Status with a valid key_id keeps extending the write expiry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waits_for_the_plugins_socket_within_its_timeout() {
    setup();
    let ep = endpoint("late");
    let c = config(&ep, "3s");
    let late = ep.clone();
    let plugin = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        TestKmsPlugin::start(&late, "key-1", None).expect("plugin")
    });
    let start = Instant::now();
    c.start_kms().await;
    assert!(start.elapsed() >= Duration::from_millis(400) && start.elapsed() < Duration::from_secs(3));
    assert!(c.encrypt(KEY, b"x").is_ok(), "the first Status and Encrypt waited for the socket");
    let plugin = plugin.await.expect("plugin");
    assert_eq!(plugin.encrypt_calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_plugin_costs_no_request_more_than_the_timeout() {
    setup();
    let ep = endpoint("slow");
    let plugin = TestKmsPlugin::start(&ep, "key-1", None).expect("plugin");
    plugin.set_delay(Duration::from_secs(5));
    let c = config(&ep, "300ms");
    let start = Instant::now();
    c.start_kms().await;
    assert!(start.elapsed() < Duration::from_secs(2), "start waited {:?}", start.elapsed());
    let e = c.encrypt(KEY, b"x").expect_err("no seed yet").to_string();
    assert!(e.contains("got unexpected nil transformer"), "{e}");
    let start = Instant::now();
    let e = c.check_kms().await.expect_err("slow");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(e.contains("code = DeadlineExceeded"), "{e}");
    plugin.set_delay(Duration::ZERO);
    eventually("the first seed", async || c.encrypt(KEY, b"x").ok()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_provider_is_a_kms_provider_entry_of_the_check_in_config_order() {
    setup();
    let (ep1, ep2) = (endpoint("two-1"), endpoint("two-2"));
    let (p1, p2) =
        (TestKmsPlugin::start(&ep1, "a-1", None).expect("p1"), TestKmsPlugin::start(&ep2, "b-1", None).expect("p2"));
    let kms = |name: &str, ep: &str| {
        format!("  - kms:\n      apiVersion: v2\n      name: {name}\n      endpoint: {ep}\n      timeout: 1s\n")
    };
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  \
         providers:\n{}- resources: [configmaps]\n  providers:\n{}",
        kms("first", &ep1),
        kms("second", &ep2)
    );
    let c = EncryptionConfig::from_yaml(&yaml).expect("config");
    c.start_kms().await;
    assert_eq!(c.check_kms().await, Ok(()));
    assert_eq!(c.kms_close_grace_period(), Duration::from_secs(4));
    p2.set_down(true);
    let e = eventually("provider 1 failing", async || c.check_kms().await.err()).await;
    assert!(e.starts_with("kms-provider-1: ") && !e.contains("kms-provider-0"), "{e}");
    p1.set_down(true);
    let e = eventually("both failing", async || c.check_kms().await.err().filter(|e| e.starts_with('['))).await;
    assert!(e.starts_with("[kms-provider-0: ") && e.contains(", kms-provider-1: "), "{e}");
}

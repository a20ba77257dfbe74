//! The test KMS v2 plugin: the second allowed stand-in (issue 39 part 4). It serves the KMS v2 API
//! (proto/kmsv2/api.proto, the server generated from the same file as the provider's client) on a unix socket and
//! keeps its keys in memory: the key-encryption key of a key_id is SHA-256 of a master secret and the key_id, so
//! that a restarted plugin with the same master secret (`--master-key-file`) still decrypts what it encrypted.
//!
//! It can rotate its key_id, go down (every call answers Unavailable), answer slowly, and report an unhealthy
//! Status. Tests drive it in-process through [`TestKmsPlugin`]; from a shell it runs as the hidden subcommand
//! `migration-apiserver kms-test-plugin` (SIGUSR1 rotates the key_id, SIGUSR2 toggles healthz). It is a subcommand
//! of the server's binary rather than a crate of its own so that the README walk-through and the tests need nothing
//! but the binary they already have, and the plugin shares the provider's generated code instead of a second copy.
//! It is not a KMS: the master secret sits in memory or in a file next to it.

use crate::storage::encryption::kms::client::SocketAddress;
use crate::storage::encryption::kms::proto::key_management_service_server::{
    KeyManagementService, KeyManagementServiceServer,
};
use crate::storage::encryption::kms::proto::{
    DecryptRequest, DecryptResponse, EncryptRequest, EncryptResponse, StatusRequest, StatusResponse,
};
use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::{Aead, KeyInit, OsRng};
use aes_gcm::Aes256Gcm;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

const NONCE: usize = 12;

/// What the plugin answers, changed while it runs.
struct PluginState {
    master: zeroize::Zeroizing<[u8; 32]>,
    key_id: Mutex<String>,
    /// When set, Encrypt answers with this key_id instead of Status's: a plugin breaking the KEP's contract.
    encrypt_key_id: Mutex<Option<String>>,
    healthz: Mutex<String>,
    delay: Mutex<Duration>,
    down: AtomicBool,
    status_calls: AtomicU64,
    encrypt_calls: AtomicU64,
    decrypt_calls: AtomicU64,
}

impl PluginState {
    fn kek(&self, key_id: &str) -> Aes256Gcm {
        let mut h = Sha256::new();
        h.update(b"migration-apiserver kms-test-plugin\0");
        h.update(self.master.as_slice());
        h.update(key_id.as_bytes());
        let key = zeroize::Zeroizing::new(<[u8; 32]>::from(h.finalize()));
        // A 32-byte key always fits AES-256.
        Aes256Gcm::new(key.as_slice().into())
    }

    /// The delay, then Unavailable when down.
    async fn answer(&self) -> Result<(), Status> {
        let delay = *self.delay.lock().unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match self.down.load(Ordering::SeqCst) {
            true => Err(Status::unavailable("the test KMS plugin is down")),
            false => Ok(()),
        }
    }

    fn key_id(&self) -> String {
        self.key_id.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct Service(Arc<PluginState>);

#[tonic::async_trait]
impl KeyManagementService for Service {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.0.status_calls.fetch_add(1, Ordering::SeqCst);
        self.0.answer().await?;
        let healthz = self.0.healthz.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(Response::new(StatusResponse { version: "v2".into(), healthz, key_id: self.0.key_id() }))
    }

    async fn encrypt(&self, req: Request<EncryptRequest>) -> Result<Response<EncryptResponse>, Status> {
        self.0.encrypt_calls.fetch_add(1, Ordering::SeqCst);
        self.0.answer().await?;
        let key_id = self.0.encrypt_key_id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let key_id = key_id.unwrap_or_else(|| self.0.key_id());
        let mut nonce = [0u8; NONCE];
        OsRng.try_fill_bytes(&mut nonce).map_err(|e| Status::internal(format!("no randomness: {e}")))?;
        let sealed = self
            .0
            .kek(&key_id)
            .encrypt((&nonce).into(), req.get_ref().plaintext.as_slice())
            .map_err(|_| Status::internal("encryption failed"))?;
        let ciphertext = [nonce.as_slice(), &sealed].concat();
        Ok(Response::new(EncryptResponse { ciphertext, key_id, annotations: Default::default() }))
    }

    async fn decrypt(&self, req: Request<DecryptRequest>) -> Result<Response<DecryptResponse>, Status> {
        self.0.decrypt_calls.fetch_add(1, Ordering::SeqCst);
        self.0.answer().await?;
        let r = req.get_ref();
        if r.ciphertext.len() < NONCE {
            return Err(Status::invalid_argument("ciphertext too short"));
        }
        let (nonce, sealed) = r.ciphertext.split_at(NONCE);
        let plaintext = self
            .0
            .kek(&r.key_id)
            .decrypt(nonce.into(), sealed)
            .map_err(|_| Status::invalid_argument(format!("cannot decrypt with key_id {:?}", r.key_id)))?;
        Ok(Response::new(DecryptResponse { plaintext }))
    }
}

/// The key_id after `key_id`: `key-1` -> `key-2`, `a` -> `a-2`. Never one used before, as the KEP asks.
pub fn next_key_id(key_id: &str) -> String {
    match key_id.rsplit_once('-').and_then(|(base, n)| n.parse::<u64>().ok().map(|n| (base, n))) {
        Some((base, n)) => format!("{base}-{}", n + 1),
        None => format!("{key_id}-2"),
    }
}

/// A running test plugin; dropping it stops the server and removes a socket file.
pub struct TestKmsPlugin {
    state: Arc<PluginState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    socket_file: Option<std::path::PathBuf>,
}

impl TestKmsPlugin {
    /// Serves on `endpoint` (`unix:///path` or `unix:///@name`) with `key_id`, and `master` as the master secret
    /// (random when `None`). Must be called within a tokio runtime.
    pub fn start(endpoint: &str, key_id: &str, master: Option<[u8; 32]>) -> std::io::Result<Self> {
        let address = SocketAddress::from_endpoint(endpoint).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("not a unix endpoint: {endpoint}"))
        })?;
        let master = master.unwrap_or_else(|| {
            let mut m = [0u8; 32];
            OsRng.fill_bytes(&mut m);
            m
        });
        let state = Arc::new(PluginState {
            master: zeroize::Zeroizing::new(master),
            key_id: Mutex::new(key_id.to_string()),
            encrypt_key_id: Mutex::new(None),
            healthz: Mutex::new("ok".into()),
            delay: Mutex::new(Duration::ZERO),
            down: AtomicBool::new(false),
            status_calls: AtomicU64::new(0),
            encrypt_calls: AtomicU64::new(0),
            decrypt_calls: AtomicU64::new(0),
        });
        let (listener, socket_file) = listen(&address)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let incoming =
            futures::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
        let service = KeyManagementServiceServer::new(Service(state.clone()));
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "test KMS plugin stopped");
            }
        });
        Ok(Self { state, shutdown: Some(tx), socket_file })
    }

    pub fn key_id(&self) -> String {
        self.state.key_id()
    }

    /// Status and Encrypt report `key_id` from now on.
    pub fn set_key_id(&self, key_id: &str) {
        *self.state.key_id.lock().unwrap_or_else(|p| p.into_inner()) = key_id.to_string();
    }

    /// Encrypt answers with `key_id` (`None`: the Status key_id, as a plugin must).
    pub fn set_encrypt_key_id(&self, key_id: Option<&str>) {
        *self.state.encrypt_key_id.lock().unwrap_or_else(|p| p.into_inner()) = key_id.map(String::from);
    }

    /// A new key_id ([`next_key_id`]); returns it.
    pub fn rotate(&self) -> String {
        let next = next_key_id(&self.key_id());
        self.set_key_id(&next);
        next
    }

    /// What Status reports as healthz (`ok` is healthy).
    pub fn set_healthz(&self, healthz: &str) {
        *self.state.healthz.lock().unwrap_or_else(|p| p.into_inner()) = healthz.to_string();
    }

    pub fn healthz(&self) -> String {
        self.state.healthz.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every call waits `delay` before it answers.
    pub fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }

    /// Down: every call answers Unavailable (after the delay).
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    pub fn status_calls(&self) -> u64 {
        self.state.status_calls.load(Ordering::SeqCst)
    }

    pub fn encrypt_calls(&self) -> u64 {
        self.state.encrypt_calls.load(Ordering::SeqCst)
    }

    pub fn decrypt_calls(&self) -> u64 {
        self.state.decrypt_calls.load(Ordering::SeqCst)
    }
}

impl Drop for TestKmsPlugin {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(f) = &self.socket_file {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// A listener on `address`; a stale socket file left by a killed plugin is replaced.
fn listen(address: &SocketAddress) -> std::io::Result<(tokio::net::UnixListener, Option<std::path::PathBuf>)> {
    match address {
        SocketAddress::Path(p) => {
            let path = std::path::PathBuf::from(p);
            if std::os::unix::net::UnixStream::connect(&path).is_err() {
                let _ = std::fs::remove_file(&path);
            }
            Ok((tokio::net::UnixListener::bind(&path)?, Some(path)))
        }
        SocketAddress::Abstract(name) => Ok((listen_abstract(name)?, None)),
    }
}

#[cfg(target_os = "linux")]
fn listen_abstract(name: &str) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(listener)
}

#[cfg(not(target_os = "linux"))]
fn listen_abstract(_: &str) -> std::io::Result<tokio::net::UnixListener> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "abstract unix sockets exist only on Linux"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_move_forward() {
        assert_eq!(next_key_id("key-1"), "key-2");
        assert_eq!(next_key_id("key-9"), "key-10");
        assert_eq!(next_key_id("a"), "a-2");
    }
}

//! The gRPC client of a KMS v2 plugin (k8s.io/apiserver `.../envelope/kmsv2/grpc_service.go`): `unix://` endpoints
//! only (`unix:///@name` is a Linux abstract socket), authority `localhost`, every call bounded by the provider's
//! timeout and waiting for the socket within it (WaitForReady), each with a fresh UUID. Errors read as Go's gRPC errors (`rpc error: code = Unavailable desc = …`),
//! since kube-apiserver's health checks and logs show them so.

use super::metrics;
use super::proto::key_management_service_client::KeyManagementServiceClient;
use super::proto::{DecryptRequest, EncryptRequest, EncryptResponse, StatusRequest, StatusResponse};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;
use tonic::transport::{Channel, Endpoint};

/// Where a plugin listens: a socket file, or a Linux abstract socket (`@name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketAddress {
    Path(String),
    Abstract(String),
}

impl SocketAddress {
    /// The address of a `unix://` endpoint (k8s.io/kms `pkg/util/util.go`): `unix:///@name` is abstract.
    pub fn from_endpoint(endpoint: &str) -> Option<Self> {
        let path = endpoint.strip_prefix("unix://")?;
        match path.strip_prefix("/@") {
            Some(name) if !name.is_empty() => Some(SocketAddress::Abstract(name.to_string())),
            _ if !path.is_empty() => Some(SocketAddress::Path(path.to_string())),
            _ => None,
        }
    }

    pub(crate) async fn connect(&self) -> std::io::Result<tokio::net::UnixStream> {
        match self {
            SocketAddress::Path(p) => tokio::net::UnixStream::connect(p).await,
            SocketAddress::Abstract(name) => connect_abstract(name),
        }
    }
}

#[cfg(target_os = "linux")]
fn connect_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    // Connecting to an abstract socket does not block: it either exists or is refused at once.
    let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    stream.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(stream)
}

#[cfg(not(target_os = "linux"))]
fn connect_abstract(_: &str) -> std::io::Result<tokio::net::UnixStream> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "abstract unix sockets exist only on Linux"))
}

/// A failed call, as Go's gRPC client prints it.
#[derive(Clone, Debug, thiserror::Error)]
#[error("rpc error: code = {code} desc = {message}")]
pub struct RpcError {
    /// Go's `codes.Code.String()`: `Unavailable`, `DeadlineExceeded`, ...
    pub code: &'static str,
    pub message: String,
}

impl RpcError {
    fn from_status(s: &tonic::Status) -> Self {
        RpcError { code: go_code_name(s.code()), message: s.message().to_string() }
    }

    fn deadline_exceeded() -> Self {
        RpcError { code: "DeadlineExceeded", message: "context deadline exceeded".into() }
    }
}

/// Go's names of the gRPC codes (tonic's Debug names differ for `OK`).
fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The client of one provider's plugin. The connection is made on first use (so that a config can be parsed outside
/// a runtime) and re-made by tonic when the plugin restarts.
pub struct KmsClient {
    provider: String,
    address: SocketAddress,
    timeout: Duration,
    channel: OnceCell<Channel>,
}

const STATUS: &str = "/v2.KeyManagementService/Status";
const ENCRYPT: &str = "/v2.KeyManagementService/Encrypt";
const DECRYPT: &str = "/v2.KeyManagementService/Decrypt";
/// How often a call waiting for the plugin's socket tries again.
const WAIT_FOR_READY_RETRY: Duration = Duration::from_millis(50);

impl KmsClient {
    pub fn new(provider: &str, address: SocketAddress, timeout: Duration) -> Self {
        Self { provider: provider.to_string(), address, timeout, channel: OnceCell::new() }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn client(&self) -> Result<KeyManagementServiceClient<Channel>, RpcError> {
        let channel = self
            .channel
            .get_or_try_init(|| async {
                let address = self.address.clone();
                let endpoint = Endpoint::from_static("http://localhost").connect_timeout(self.timeout);
                let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                    let address = address.clone();
                    async move { address.connect().await.map(hyper_util::rt::TokioIo::new) }
                });
                Ok::<_, RpcError>(endpoint.connect_with_connector_lazy(connector))
            })
            .await?;
        Ok(KeyManagementServiceClient::new(channel.clone()))
    }

    /// `attempt` bounded by the timeout, measured in `..._kms_operations_latency_seconds`. As Go's client with
    /// WaitForReady, a call waits for the plugin's socket until its deadline: an attempt that fails Unavailable
    /// while the socket does not accept connections (not yet created, plugin restarting) is retried. Unavailable
    /// from a plugin that is listening is its answer.
    async fn bounded<T, F>(&self, method: &'static str, mut attempt: impl FnMut() -> F) -> Result<T, RpcError>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = Instant::now();
        let wait_for_ready = async {
            loop {
                match attempt().await {
                    Err(s) if s.code() == tonic::Code::Unavailable && self.address.connect().await.is_err() => {
                        tokio::time::sleep(WAIT_FOR_READY_RETRY).await;
                    }
                    other => return other,
                }
            }
        };
        let result = match tokio::time::timeout(self.timeout, wait_for_ready).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            // tonic's own deadline (the grpc-timeout it sends) may fire first, as Cancelled: Go's client says
            // DeadlineExceeded for a call past its deadline, whichever side noticed.
            Ok(Err(s)) if s.code() == tonic::Code::Cancelled && start.elapsed() >= self.timeout => {
                Err(RpcError::deadline_exceeded())
            }
            Ok(Err(s)) => Err(RpcError::from_status(&s)),
            Err(_) => Err(RpcError::deadline_exceeded()),
        };
        let code = result.as_ref().err().map(|e| e.code).unwrap_or("OK");
        metrics::kms_operation(&self.provider, method, code, start.elapsed());
        result
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(self.timeout);
        r
    }

    pub async fn status(&self) -> Result<StatusResponse, RpcError> {
        let c = self.client().await?;
        self.bounded(STATUS, || {
            let (mut c, req) = (c.clone(), self.request(StatusRequest {}));
            async move { c.status(req).await }
        })
        .await
    }

    pub async fn encrypt(&self, plaintext: &[u8]) -> Result<EncryptResponse, RpcError> {
        let c = self.client().await?;
        let req = EncryptRequest { plaintext: plaintext.to_vec(), uid: uuid::Uuid::new_v4().to_string() };
        self.bounded(ENCRYPT, || {
            let (mut c, req) = (c.clone(), self.request(req.clone()));
            async move { c.encrypt(req).await }
        })
        .await
    }

    pub async fn decrypt(
        &self,
        ciphertext: &[u8],
        key_id: &str,
        annotations: &HashMap<String, Vec<u8>>,
    ) -> Result<Vec<u8>, RpcError> {
        let c = self.client().await?;
        let req = DecryptRequest {
            ciphertext: ciphertext.to_vec(),
            uid: uuid::Uuid::new_v4().to_string(),
            key_id: key_id.to_string(),
            annotations: annotations.clone(),
        };
        let response = self.bounded(DECRYPT, || {
            let (mut c, req) = (c.clone(), self.request(req.clone()));
            async move { c.decrypt(req).await }
        });
        response.await.map(|r| r.plaintext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_map_to_socket_addresses() {
        assert_eq!(
            SocketAddress::from_endpoint("unix:///tmp/kms.sock"),
            Some(SocketAddress::Path("/tmp/kms.sock".into()))
        );
        assert_eq!(SocketAddress::from_endpoint("unix:///@kms"), Some(SocketAddress::Abstract("kms".into())));
        assert_eq!(SocketAddress::from_endpoint("unix://"), None);
        assert_eq!(SocketAddress::from_endpoint("tcp://x"), None);
    }
}

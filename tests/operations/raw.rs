//! A raw HTTP/1.1 client over rustls, for what `kube::Client` and kubectl cannot show: a request whose body is
//! still being sent (or not sent yet), a watch stream that ends cleanly rather than being reset, a client
//! certificate rustls itself would refuse to load, and TLS 1.2.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub type Reader = BufReader<ReadHalf<TlsStream<TcpStream>>>;
pub type Writer = WriteHalf<TlsStream<TcpStream>>;

pub const TLS12: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];
pub const TLS13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// A connection to the server on `port`, trusting `ca` (PEM file), with the client certificate and key `client`
/// (PEM) if any, over the TLS `versions`; split so that a body can be sent while the answer is read.
pub async fn connect(
    port: u16,
    ca: &Path,
    client: Option<(&str, &str)>,
    versions: &[&'static SupportedProtocolVersion],
) -> (Reader, Writer) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots.add(cert.expect("CA certificate")).expect("trust the CA");
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(roots);
    let mut config = match client {
        // Not `with_client_auth_cert`: it parses the certificate with webpki, which refuses v1 certificates.
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>().expect("pem");
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
            let key = provider.key_provider.load_private_key(key).expect("load key");
            let certified = rustls::sign::CertifiedKey::new(chain, key);
            builder.with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("TLS handshake");
    let (r, w) = tokio::io::split(tls);
    (BufReader::new(r), w)
}

/// The admin identity of a server's certificate directory (CN admin, O system:masters): certificate and key PEM.
pub fn admin(cert_dir: &Path) -> (String, String) {
    let read = |f: &str| std::fs::read_to_string(cert_dir.join(f)).expect("admin certificate files");
    (read("admin.crt"), read("admin.key"))
}

pub async fn send(w: &mut Writer, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

/// A response's status line and headers (names lower-cased).
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

pub async fn read_head(r: &mut Reader) -> std::io::Result<Head> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        lines.push(line.to_string());
    }
    let status = lines.first().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok());
    let status = status.ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {lines:?}")))?;
    let headers = lines[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Head { status, headers })
}

/// The body of the response `head`, to its end: Content-Length bytes, or chunks up to the last (zero-size) one. A
/// connection that closes before that is an error: what a client sees of a reset watch.
pub async fn read_body(r: &mut Reader, head: &Head) -> std::io::Result<Vec<u8>> {
    if let Some(len) = head.header("content-length") {
        let mut body = vec![0; len.parse().map_err(std::io::Error::other)?];
        r.read_exact(&mut body).await?;
        return Ok(body);
    }
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        if r.read_line(&mut size).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let size = usize::from_str_radix(size.trim(), 16).map_err(std::io::Error::other)?;
        if size == 0 {
            // Trailers (none expected), then the empty line.
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).await? == 0 || line.trim_end().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size + 2, 0);
        r.read_exact(&mut body[start..]).await?;
        body.truncate(start + size);
    }
}

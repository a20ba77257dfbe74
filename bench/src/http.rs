//! HTTP over TLS with hyper, for setup calls and watch streams.

use super::*;
use anyhow::{anyhow, bail, Context};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

// HTTP over TLS: one hyper HTTP/1.1 connection per `Conn`, kept alive.

#[derive(Clone)]
pub(super) struct Req {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) body: Bytes,
    pub(super) content_type: Option<&'static str>,
    pub(super) accept: &'static str,
    /// A status other than 2xx that is this request's right answer.
    pub(super) expect: Option<u16>,
}

impl Req {
    pub(super) fn get(path: String) -> Req {
        Req { method: Method::GET, path, body: Bytes::new(), content_type: None, accept: JSON, expect: None }
    }
    pub(super) fn post(path: String, body: Bytes) -> Req {
        Req { method: Method::POST, body, content_type: Some(JSON), ..Req::get(path) }
    }
    pub(super) fn patch(path: String, body: Value) -> Req {
        Req {
            method: Method::PATCH,
            body: Bytes::from(body.to_string()),
            content_type: Some(MERGE_PATCH),
            ..Req::get(path)
        }
    }
    pub(super) fn accept(self, accept: &'static str) -> Req {
        Req { accept, ..self }
    }
    pub(super) fn expect(self, status: u16) -> Req {
        Req { expect: Some(status), ..self }
    }
}

#[derive(Clone)]
pub(super) struct Target {
    pub(super) tls: TlsConnector,
    pub(super) server_name: ServerName<'static>,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) authority: String,
    /// `Bearer <token>`: the Authorization header of a token user (who presents no client certificate).
    pub(super) authorization: Option<String>,
}

impl Target {
    /// CA and client certificate from the kubeconfig; the server URL from it unless `url` is given.
    pub(super) fn from_kubeconfig(path: &Path, url: Option<&str>) -> anyhow::Result<Target> {
        Self::from_kubeconfig_as(path, url, None)
    }

    /// The kubeconfig's CA and server, for the user of a `--token-auth-file` token: `Authorization: Bearer <token>`
    /// on every request and no client certificate (which the server would authenticate first).
    pub(super) fn with_token(path: &Path, token: &str) -> anyhow::Result<Target> {
        Self::from_kubeconfig_as(path, None, Some(token))
    }

    fn from_kubeconfig_as(path: &Path, url: Option<&str>, token: Option<&str>) -> anyhow::Result<Target> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let field = |key: &str| {
            text.lines()
                .find_map(|l| {
                    l.trim().strip_prefix(key)?.strip_prefix(':').map(|v| v.trim().trim_matches('"').to_string())
                })
                .with_context(|| format!("{} has no {key}", path.display()))
        };
        let data = |key: &str| -> anyhow::Result<Vec<u8>> {
            base64::engine::general_purpose::STANDARD
                .decode(field(key)?)
                .with_context(|| format!("{key} is not base64"))
        };
        let url = match url {
            Some(u) => u.to_string(),
            None => field("server")?,
        };
        let rest = url.strip_prefix("https://").context("the server URL must be https://")?;
        let authority = rest.split('/').next().unwrap_or_default().to_string();
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !p.ends_with(']') => (h, p.parse().with_context(|| format!("bad port in {url}"))?),
            _ => (authority.as_str(), 443),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();

        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&data("certificate-authority-data")?) {
            roots.add(cert.map_err(|e| anyhow!("CA: {e:?}"))?)?;
        }
        // The cipher suites in the order kube-apiserver's Go client offers them on hardware with AES instructions
        // (AES-128-GCM first), so that the server negotiates what it would with kube-apiserver.
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites.sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match token {
            Some(_) => builder.with_no_client_auth(),
            None => {
                let chain = CertificateDer::pem_slice_iter(&data("client-certificate-data")?)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| anyhow!("client certificate: {e:?}"))?;
                let key = PrivateKeyDer::from_pem_slice(&data("client-key-data")?)
                    .map_err(|e| anyhow!("client key: {e:?}"))?;
                builder.with_client_auth_cert(chain, key)?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host.clone()).with_context(|| format!("bad host {host}"))?;
        let authorization = token.map(|t| format!("Bearer {t}"));
        Ok(Target { tls: TlsConnector::from(Arc::new(config)), server_name, host, port, authority, authorization })
    }

    pub(super) async fn connect(&self) -> anyhow::Result<Conn> {
        let tls = self.connect_tls().await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(connection);
        Ok(Conn { sender, authority: self.authority.clone(), authorization: self.authorization.clone() })
    }

    /// A connection for the load workers' own HTTP/1.1 client.
    pub(super) async fn connect_lean(&self) -> anyhow::Result<LeanConn> {
        Ok(LeanConn::new(self.connect_tls().await?, &self.authority, self.authorization.as_deref()))
    }

    pub(super) async fn connect_tls(&self) -> anyhow::Result<TlsStream<TcpStream>> {
        // A server that cannot accept (out of file descriptors, stopped) must not hang the bench.
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .map_err(|_| anyhow!("timed out"))
            .and_then(|r| Ok(r?))
            .with_context(|| format!("connecting to {}", self.authority))?;
        tcp.set_nodelay(true)?;
        tokio::time::timeout(CONNECT_TIMEOUT, self.tls.connect(self.server_name.clone(), tcp))
            .await
            .map_err(|_| anyhow!("timed out"))
            .and_then(|r| Ok(r?))
            .context("TLS handshake")
    }

    /// One request on a fresh connection (setup steps).
    pub(super) async fn call_ok(&self, req: &Req) -> anyhow::Result<Bytes> {
        self.connect().await?.call_ok(req).await
    }
}

pub(super) struct Conn {
    pub(super) sender: SendRequest<Full<Bytes>>,
    pub(super) authority: String,
    pub(super) authorization: Option<String>,
}

impl Conn {
    pub(super) async fn send(&mut self, req: &Req) -> anyhow::Result<Response<Incoming>> {
        let mut builder = Request::builder()
            .method(req.method.clone())
            .uri(&req.path)
            .header(HOST, &self.authority)
            .header(ACCEPT, req.accept);
        if let Some(ct) = req.content_type {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        if let Some(authorization) = &self.authorization {
            builder = builder.header(AUTHORIZATION, authorization);
        }
        let request = builder.body(Full::new(req.body.clone()))?;
        self.sender.ready().await?;
        Ok(self.sender.send_request(request).await?)
    }

    /// One request and its whole answer, within [`REQUEST_TIMEOUT`].
    pub(super) async fn call(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        let call = async {
            let resp = self.send(req).await?;
            let status = resp.status();
            Ok((status, resp.into_body().collect().await?.to_bytes()))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| anyhow!("{} {}: no answer within {REQUEST_TIMEOUT:?}", req.method, req.path))?
    }

    pub(super) async fn call_ok(&mut self, req: &Req) -> anyhow::Result<Bytes> {
        match self.call(req).await? {
            (s, body) if s.is_success() => Ok(body),
            (s, body) => bail!("{} {} answered {s}: {}", req.method, req.path, String::from_utf8_lossy(&body)),
        }
    }
}

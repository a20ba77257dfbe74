//! The HTTPS accept loop: TLS (rustls) in front of an axum router, HTTP/1.1 and HTTP/2.
//!
//! axum's own `serve` cannot expose the TLS session, so connections are served with hyper-util
//! directly, and the client certificate chain (whose key the client proved to hold; the authenticator
//! verifies the chain per request) is attached to every request as a [`PeerCertificates`] extension
//! (plus the remote address as axum's `ConnectInfo<SocketAddr>`).
//!
//! Shutdown is kube-apiserver's: no new connections, in-flight requests finish (within a grace period), and
//! long-running responses, i.e. watches (marked [`LongRunning`]), end at once, cleanly, so that their clients re-list
//! and re-watch elsewhere instead of holding the shutdown for the whole grace period.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use bytes::Bytes;
use futures::FutureExt as _;
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::auth::authn::PeerCertificates;

/// A response extension: the body is a long-running stream (a watch) that ends when the server shuts down.
#[derive(Debug, Clone, Copy)]
pub struct LongRunning;

/// Tunables of [`serve_with_options`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long a client may take to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long in-flight connections may take to finish after shutdown was requested before
    /// they are aborted.
    pub shutdown_grace_period: Duration,
    /// How long an HTTP/1.1 client may take to send the request headers.
    pub header_read_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace_period: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` completes, then stops accepting and lets
/// in-flight connections finish (see [`ServeOptions::default`] for the timeouts).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    shutdown: impl Future<Output = ()>,
) {
    serve_with_options(listener, tls, app, shutdown, ServeOptions::default()).await
}

/// [`serve`] with explicit timeouts.
pub async fn serve_with_options(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).keep_alive(true).header_read_timeout(options.header_read_timeout);
    builder.http2().timer(TokioTimer::new());

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            // Reap finished connection tasks so that the set does not grow without bound.
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                log_join_error(joined);
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    connections.spawn(handle_connection(
                        stream,
                        remote,
                        acceptor.clone(),
                        builder.clone(),
                        app.clone(),
                        shutdown_rx.clone(),
                        options.handshake_timeout,
                    ));
                }
                Err(e) => {
                    // Per-connection errors (reset before accept, ...) are harmless; others such
                    // as EMFILE persist for a while, so back off instead of spinning.
                    tracing::debug!(error = %e, "accept failed");
                    if !is_connection_error(&e) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            },
        }
    }

    drop(listener);
    let in_flight = connections.len();
    tracing::info!(connections = in_flight, "shutting down: no longer accepting connections");
    let _ = shutdown_tx.send(true);
    let drained = tokio::time::timeout(options.shutdown_grace_period, async {
        while let Some(joined) = connections.join_next().await {
            log_join_error(joined);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(connections = connections.len(), "grace period over, aborting remaining connections");
        connections.shutdown().await;
    }
}

async fn handle_connection(
    stream: TcpStream,
    remote: SocketAddr,
    acceptor: TlsAcceptor,
    builder: auto::Builder<TokioExecutor>,
    app: axum::Router,
    mut shutdown: watch::Receiver<bool>,
    handshake_timeout: Duration,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%remote, error = %e, "cannot set TCP_NODELAY");
    }

    let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
    let tls_stream = tokio::select! {
        result = handshake => match result {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                log_handshake_failure(remote, &e);
                return;
            }
            Err(_) => {
                tracing::debug!(%remote, "TLS handshake timed out");
                return;
            }
        },
        _ = shutdown.wait_for(|stop| *stop) => return,
    };

    let peer = tls_stream
        .get_ref()
        .1
        .peer_certificates()
        .filter(|certs| !certs.is_empty())
        .map(|certs| PeerCertificates::new(certs.to_vec()));

    let stop = shutdown.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let extensions = req.extensions_mut();
        extensions.insert(ConnectInfo(remote));
        if let Some(peer) = &peer {
            extensions.insert(peer.clone());
        }
        let stop = stop.clone();
        app.clone().oneshot(req).map(|resp| resp.map(|resp| ending_at_shutdown(resp, stop)))
    });

    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls_stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(%remote, error = %e, "connection error");
            }
            return;
        }
        // Also taken when the sender is gone, i.e. the server stopped.
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    if let Err(e) = conn.await {
        tracing::debug!(%remote, error = %e, "connection error during shutdown");
    }
}

/// A refused client certificate is worth an operator's attention (its user gets nothing but a closed connection);
/// other handshake failures (scanners, clients giving up, plain HTTP) are not.
fn log_handshake_failure(remote: SocketAddr, e: &std::io::Error) {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(_)) => {
            tracing::warn!(%remote, error = %e, "TLS handshake failed: client certificate refused");
        }
        _ => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
    }
}

/// A [`LongRunning`] response's body ends when `stop` turns true: the client sees the stream end as it does when a
/// watch times out, not a reset connection. Other responses are untouched: they finish within the grace period.
fn ending_at_shutdown(resp: Response<Body>, stop: watch::Receiver<bool>) -> Response<Body> {
    if resp.extensions().get::<LongRunning>().is_none() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let stop = async move {
        // Also ends when the sender is gone, i.e. the server stopped.
        let mut stop = stop;
        let _ = stop.wait_for(|stop| *stop).await;
    };
    Response::from_parts(parts, Body::new(UntilShutdown { body, stop: Some(Box::pin(stop)) }))
}

struct UntilShutdown {
    body: Body,
    /// None once the shutdown came.
    stop: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl hyper::body::Body for UntilShutdown {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Some(stop) = self.stop.as_mut() else { return Poll::Ready(None) };
        if stop.as_mut().poll(cx).is_ready() {
            self.stop = None;
            return Poll::Ready(None);
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }
}

fn log_join_error(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        if e.is_panic() {
            tracing::error!(error = %e, "connection task panicked");
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;

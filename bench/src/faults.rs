//! The adaptive rate against a stand-in target (issue 38): a migrating server in cluster mode whose target is
//! another server behind a small HTTPS proxy of the bench's, which makes the target healthy, slow (a queue that
//! serves a fixed number of requests a second), throttling (429 with Retry-After above a rate) and healthy again,
//! a phase each. A row per phase: the writes that got through, the migrator's rate limit, the 429s.

use super::*;
use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy makes of the target.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Healthy,
    /// Serves `capacity` requests a second, in arrival order: more wait in its queue (latency rises).
    Slow {
        capacity: f64,
    },
    /// Answers 429 with `Retry-After: 1` to what comes above `capacity` a second (APF's way of saying so).
    Throttling {
        capacity: f64,
    },
}

struct ProxyState {
    mode: Mutex<Mode>,
    /// Slow: when the queue is free next. Throttling: the token bucket (tokens, at).
    next_free: Mutex<Instant>,
    bucket: Mutex<(f64, Instant)>,
    upstream: Target,
    writes: AtomicU64,
    throttled: AtomicU64,
}

struct FaultProxy {
    port: u16,
    state: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy in front of `target` (a server the bench started in `dir`), serving with its certificate: the
    /// target's admin kubeconfig with the proxy's port reaches the proxy.
    async fn start(dir: &Path, target: Target) -> anyhow::Result<FaultProxy> {
        let cert = std::fs::read(dir.join("certs/apiserver.crt"))?;
        let key = std::fs::read(dir.join("certs/apiserver.key"))?;
        let chain =
            CertificateDer::pem_slice_iter(&cert).collect::<Result<Vec<_>, _>>().map_err(|e| anyhow!("{e:?}"))?;
        let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| anyhow!("{e:?}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let now = Instant::now();
        let state = Arc::new(ProxyState {
            mode: Mutex::new(Mode::Healthy),
            next_free: Mutex::new(now),
            bucket: Mutex::new((0.0, now)),
            upstream: target,
            writes: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let _ = tcp.set_nodelay(true);
                let (acceptor, st) = (acceptor.clone(), st.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let upstream = Arc::new(tokio::sync::Mutex::new(None::<Conn>));
                    let service = hyper::service::service_fn(move |req| forward(st.clone(), upstream.clone(), req));
                    let io = hyper_util::rt::TokioIo::new(tls);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Ok(FaultProxy { port, state, task })
    }

    fn set(&self, mode: Mode) {
        let now = Instant::now();
        *self.state.next_free.lock().unwrap_or_else(|e| e.into_inner()) = now;
        *self.state.bucket.lock().unwrap_or_else(|e| e.into_inner()) = (0.0, now);
        *self.state.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    fn counts(&self) -> (u64, u64) {
        (self.state.writes.load(Ordering::Relaxed), self.state.throttled.load(Ordering::Relaxed))
    }
}

/// What the proxy does with one request: waits its turn (slow), refuses it (throttling), or forwards it.
async fn forward(
    st: Arc<ProxyState>,
    upstream: Arc<tokio::sync::Mutex<Option<Conn>>>,
    req: hyper::Request<Incoming>,
) -> anyhow::Result<hyper::Response<Full<Bytes>>> {
    let mode = *st.mode.lock().unwrap_or_else(|e| e.into_inner());
    match mode {
        Mode::Healthy => {}
        Mode::Slow { capacity } => {
            let wait = {
                let mut next = st.next_free.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                let slot = (*next).max(now);
                *next = slot + Duration::from_secs_f64(1.0 / capacity);
                slot - now
            };
            tokio::time::sleep(wait).await;
        }
        Mode::Throttling { capacity } => {
            let admitted = {
                let mut b = st.bucket.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                // A burst of a tenth of a second's capacity.
                b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * capacity).min(capacity / 10.0);
                b.1 = now;
                let ok = b.0 >= 1.0;
                if ok {
                    b.0 -= 1.0;
                }
                ok
            };
            if !admitted {
                st.throttled.fetch_add(1, Ordering::Relaxed);
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
                    "details": {"retryAfterSeconds": 1}, "code": 429});
                return Ok(hyper::Response::builder()
                    .status(429)
                    .header("content-type", "application/json")
                    .header("retry-after", "1")
                    .body(Full::new(Bytes::from(status.to_string())))?);
            }
        }
    }
    let is_write = req.method() == hyper::Method::PATCH;
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut conn = upstream.lock().await;
    if conn.is_none() {
        *conn = Some(st.upstream.connect().await?);
    }
    let c = conn.as_mut().context("connected above")?;
    let mut out = hyper::Request::builder().method(parts.method).uri(parts.uri).header("host", &c.authority);
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST {
            out = out.header(name, value);
        }
    }
    c.sender.ready().await?;
    let resp = match c.sender.send_request(out.body(Full::new(body))?).await {
        Ok(r) => r,
        Err(e) => {
            *conn = None;
            return Err(e.into());
        }
    };
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    if is_write && parts.status.is_success() {
        st.writes.fetch_add(1, Ordering::Relaxed);
    }
    Ok(hyper::Response::from_parts(parts, Full::new(body)))
}

/// The migrator's `migration_apiserver_migration_rate_limit`, polled every 250 ms until `finish`.
pub(super) struct RateSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<f64>>,
}

impl RateSampler {
    pub(super) fn start(migrator: &Target) -> RateSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (target, flag) = (migrator.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Ok(rate) = rate_limit(&target).await {
                    seen.push(rate);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            seen
        });
        RateSampler { stop, task }
    }

    pub(super) async fn finish(self) -> Rates {
        self.stop.store(true, Ordering::Relaxed);
        Rates(self.task.await.unwrap_or_default())
    }
}

/// The rate limits polled.
pub(super) struct Rates(Vec<f64>);

impl Rates {
    /// `median (min-max) requests/s`, of the second half when `settled` (the rate has found its level by then).
    pub(super) fn summary_of(&self, settled: bool) -> String {
        let from = if settled { self.0.len() / 2 } else { 0 };
        let mut v = self.0[from..].to_vec();
        if v.is_empty() {
            return "-".into();
        }
        v.sort_by(f64::total_cmp);
        format!(
            "median {} (min {}, max {}) requests/s",
            thousands(v[v.len() / 2]),
            thousands(v[0]),
            thousands(v[v.len() - 1])
        )
    }

    pub(super) fn summary(&self) -> String {
        self.summary_of(false)
    }

    fn median_settled(&self) -> Option<f64> {
        let mut v = self.0[self.0.len() / 2..].to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

async fn rate_limit(target: &Target) -> anyhow::Result<f64> {
    let text = target.call_ok(&Req::get("/metrics".into()).accept("text/plain")).await?;
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("migration_apiserver_migration_rate_limit ")?.trim().parse().ok())
        .context("no migration_apiserver_migration_rate_limit in /metrics")
}

/// The phases and how long each lasts.
const PHASES: [(&str, Mode); 4] = [
    ("healthy", Mode::Healthy),
    ("slow: the target serves 300 requests/s, more queue", Mode::Slow { capacity: 300.0 }),
    ("throttling: 429 with Retry-After: 1 above 150 requests/s", Mode::Throttling { capacity: 150.0 }),
    ("recovered", Mode::Healthy),
];

/// A row per phase of the stand-in target, 10^5 ShootStates (--quick: 10^4).
pub(super) async fn phase_rows(bin: &Path, n: u64) -> Vec<Row> {
    let phase = if n >= 100_000 { Duration::from_secs(10) } else { Duration::from_secs(3) };
    match phases(bin, n, phase).await {
        Ok(rows) => rows,
        Err(e) => vec![Row::failed("adaptive rate against the stand-in target".into(), e)],
    }
}

async fn phases(bin: &Path, n: u64, phase: Duration) -> anyhow::Result<Vec<Row>> {
    let v1alpha1 = ["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1alpha1"];
    let (mut target_server, target) = ServerProcess::start(bin, &v1alpha1).await?;
    eprintln!("bench: adaptive: stand-in target with {n} ShootStates");
    let seed = run_load(&target, None, 64, None, n, shoot_state_creates(0, "")).await;
    if seed.stats.ok != n {
        bail!("creating {n} ShootStates: {}", seed.stats.error_summary());
    }
    let v1beta1 = ["--disable-scheduler", "--storage-version", "shootstates.core.gardener.cloud=v1beta1"];
    let target = target_server.restart(&v1beta1).await?;
    let proxy = FaultProxy::start(&target_server.dir, target.clone()).await?;
    let kubeconfig = target_server.dir.join("proxy.kubeconfig");
    let text = std::fs::read_to_string(target_server.kubeconfig())?;
    std::fs::write(&kubeconfig, text.replace(&format!(":{}", target_server.port), &format!(":{}", proxy.port)))?;
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let (_migrator_server, migrator) =
        ServerProcess::start(bin, &["--kubeconfig", &kubeconfig, "--disable-trigger"]).await?;
    let svm = json!({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": "bench-phases", "labels": {"migration.k8s.io/resource": "shootstates.core.gardener.cloud"}},
        "spec": {"resource": {"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"}},
    });
    migrator.call_ok(&Req::post(format!("{API}/storageversionmigrations"), Bytes::from(svm.to_string()))).await?;
    let mut rows = Vec::new();
    for (name, mode) in PHASES {
        eprintln!("bench: adaptive: stand-in target {name} ({phase:?})");
        proxy.set(mode);
        let (writes0, throttled0) = proxy.counts();
        let started = Instant::now();
        let rates = RateSampler::start(&migrator);
        tokio::time::sleep(phase).await;
        let rates = rates.finish().await;
        let (writes, throttled) = proxy.counts();
        let secs = started.elapsed().as_secs_f64();
        let (writes, throttled) = (writes - writes0, throttled - throttled0);
        let follows = match mode {
            Mode::Slow { capacity } | Mode::Throttling { capacity } => {
                format!(
                    "; the settled rate limit is x{:.2} of the target's capacity",
                    rates.median_settled().unwrap_or(f64::NAN) / capacity
                )
            }
            Mode::Healthy => String::new(),
        };
        rows.push(Row {
            scenario: format!("stand-in target, {name}"),
            rps: thousands(writes as f64 / secs),
            notes: format!(
                "writes/s that got through in {secs:.0} s; the migrator's rate limit: {} (second half: {}){follows}; \
                 429s: {} ({:.1}% of the writes)",
                rates.summary(),
                rates.summary_of(true),
                thousands(throttled as f64),
                100.0 * throttled as f64 / (writes.max(1)) as f64
            ),
            rps_v: Some(writes as f64 / secs),
            ..Row::default()
        });
    }
    Ok(rows)
}

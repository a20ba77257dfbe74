//! The `serve` flags of authentication and authorization (named like k8s.io/apiserver's), and the assembly of TLS,
//! authenticator and authorizer from them, including the background reloads:
//!
//! | what | source | reload |
//! |---|---|---|
//! | serving certificate | `--tls-cert-file`/`--tls-private-key-file` or the generated pair | files checked every 2 s |
//! | client CA | `--client-ca-file`, else the ConfigMap's `client-ca-file` when delegating, else the generated CA | file checked every 2 s / ConfigMap watched |
//! | front proxy | `--requestheader-client-ca-file` + `--requestheader-*` flags, else the ConfigMap when delegating | file checked every 2 s / ConfigMap watched |
//! | bearer tokens | `--token-auth-file`, then TokenReview when delegating | - |
//! | authorization | SubjectAccessReview when delegating, else `system:masters` only (or `--authorization-mode=AlwaysAllow`) | - |
//!
//! Delegating means a cluster to ask: `--authentication-kubeconfig` / `--authorization-kubeconfig`, or the
//! in-cluster configuration when running in a pod.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use rustls::ServerConfig;
use sha2::{Digest, Sha256};

use super::authn::{Authenticator, StaticTokens};
use super::authz::{AuthorizationMode, Authorizer};
use super::delegated::{
    in_cluster, kube_config, review_client, watch_client, ConfigMapTrust, SubjectAccessReviewer,
    TokenReviewAuthenticator,
};
use super::tls::{crypto_provider, server_config_with, ReloadableCertResolver};
use super::trust::{CaBundle, ClientTrust, RequestHeaderConfig};
use super::{Error, Result};
use crate::duration::parse_duration;

/// How often certificate and CA files are checked for new content.
pub const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Longest watch of the authentication ConfigMap before it is renewed, and the retry delay after errors.
const CONFIGMAP_WATCH_TIMEOUT: Duration = Duration::from_secs(60);
const CONFIGMAP_RETRY: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum AuthorizationModeArg {
    /// SubjectAccessReview against the cluster (--authorization-kubeconfig or in-cluster); without a cluster, only
    /// system:masters is allowed.
    #[value(name = "Webhook")]
    Webhook,
    /// Every authenticated user may do everything (local experiments only).
    #[value(name = "AlwaysAllow")]
    AlwaysAllow,
}

#[derive(clap::Args, Debug, Clone)]
pub struct AuthArgs {
    /// CA bundle that x509 client certificates are verified against (CN user, O groups). Default: the
    /// client-ca-file of the kube-system/extension-apiserver-authentication ConfigMap when delegating, else the
    /// generated CA. Reloaded when the file changes.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Static bearer tokens, in kube-apiserver's CSV format: token,user,uid,"group1,group2".
    #[arg(long)]
    pub token_auth_file: Option<PathBuf>,
    /// Kubeconfig of the cluster that authenticates for us: TokenReview, and the extension-apiserver-authentication
    /// ConfigMap (client CA, front-proxy CA and headers). Default: in-cluster when running in a pod.
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// Do not read the extension-apiserver-authentication ConfigMap.
    #[arg(long)]
    pub authentication_skip_lookup: bool,
    /// Start even if the extension-apiserver-authentication ConfigMap cannot be read (keep trying in the background).
    #[arg(long)]
    pub authentication_tolerate_lookup_failure: bool,
    /// How long TokenReview answers (valid and invalid tokens) are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// Kubeconfig of the cluster that authorizes for us (SubjectAccessReview). Default: in-cluster when running in
    /// a pod.
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// Webhook: SubjectAccessReview (only system:masters without a cluster); AlwaysAllow: no authorization.
    #[arg(long, value_enum, default_value_t = AuthorizationModeArg::Webhook)]
    pub authorization_mode: AuthorizationModeArg,
    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long denied SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
    /// CA bundle of the front proxy's client certificates (kube-apiserver's --proxy-client-cert-file). Default: the
    /// ConfigMap's requestheader-client-ca-file when delegating. Reloaded when the file changes.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names allowed for front-proxy certificates (comma-separated; empty: any certificate of the CA). Used
    /// with --requestheader-client-ca-file.
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers holding the user name, first non-empty wins. Used with --requestheader-client-ca-file.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Headers holding the user's UID. Used with --requestheader-client-ca-file.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Uid")]
    pub requestheader_uid_headers: Vec<String>,
    /// Headers holding the groups (every line is one group). Used with --requestheader-client-ca-file.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Prefixes of headers holding extra attributes. Used with --requestheader-client-ca-file.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
}

/// The assembled TLS configuration, authenticator and authorizer, with their background reloads.
pub struct AuthStack {
    pub tls: Arc<ServerConfig>,
    pub authenticator: Arc<Authenticator>,
    pub authorizer: Arc<Authorizer>,
    pub trust: Arc<ClientTrust>,
    pub serving: Arc<ReloadableCertResolver>,
    /// File and ConfigMap watchers; they run until aborted.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for AuthStack {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Builds TLS, authentication and authorization from the flags and starts their reloads (see the module
/// documentation). `dev_client_ca` is the generated CA, the client CA of a standalone server.
pub async fn build(
    args: &AuthArgs,
    serving_cert: &Path,
    serving_key: &Path,
    dev_client_ca: &Path,
) -> Result<AuthStack> {
    let mut tasks = Vec::new();
    let serving = Arc::new(ReloadableCertResolver::load(serving_cert, serving_key, crypto_provider())?);
    {
        let serving = serving.clone();
        let paths = vec![serving_cert.to_path_buf(), serving_key.to_path_buf()];
        tasks.push(watch_files(paths, FILE_CHECK_INTERVAL, move || serving.reload()));
    }

    let trust = Arc::new(ClientTrust::new());
    let authn_config = match (&args.authentication_kubeconfig, in_cluster()) {
        (Some(path), _) => Some(kube_config(Some(path)).await?),
        (None, true) => Some(kube_config(None).await?),
        (None, false) => None,
    };
    let lookup = authn_config.is_some() && !args.authentication_skip_lookup;

    // The client CA: a flag, else the ConfigMap, else (standalone) the generated CA.
    let client_ca_file = match (&args.client_ca_file, lookup, authn_config.is_some()) {
        (Some(path), _, _) => Some(path.clone()),
        (None, false, false) => Some(dev_client_ca.to_path_buf()),
        _ => None,
    };
    if let Some(path) = client_ca_file {
        tasks.push(client_ca_from_file(&trust, path)?);
    }
    // The front proxy: a flag, else the ConfigMap.
    if let Some(path) = &args.requestheader_client_ca_file {
        tasks.push(front_proxy_from_file(&trust, args, path)?);
    }

    if let (Some(config), true) = (&authn_config, lookup) {
        tasks.extend(configmap_trust(&trust, args, config).await?);
    }

    let mut authenticator = Authenticator::new().with_trust(trust.clone());
    if let Some(path) = &args.token_auth_file {
        authenticator = authenticator.with_tokens(StaticTokens::from_file(path)?);
    }
    if let Some(config) = &authn_config {
        let reviewer =
            TokenReviewAuthenticator::new(review_client(config.clone())?, args.authentication_token_webhook_cache_ttl);
        authenticator = authenticator.with_token_review(Arc::new(reviewer));
    }

    let mode = authorization_mode(args).await?;
    let state = trust.current();
    tracing::info!(
        client_ca = state.client_ca.is_some(),
        front_proxy = state.request_header.is_some(),
        token_review = authn_config.is_some(),
        static_tokens = args.token_auth_file.is_some(),
        authorization = match &mode {
            AuthorizationMode::AlwaysAllow => "AlwaysAllow",
            AuthorizationMode::MastersOnly => "system:masters only",
            AuthorizationMode::Delegated(_) => "SubjectAccessReview",
        },
        "authentication and authorization"
    );
    let authorizer = Authorizer::with_cache_ttls(
        mode,
        args.authorization_webhook_cache_authorized_ttl,
        args.authorization_webhook_cache_unauthorized_ttl,
    );
    let tls = server_config_with(serving.clone(), Some(trust.clone()))?;
    Ok(AuthStack {
        tls,
        authenticator: Arc::new(authenticator),
        authorizer: Arc::new(authorizer),
        trust,
        serving,
        tasks,
    })
}

/// Trusts what the cluster's `extension-apiserver-authentication` ConfigMap says that no flag says (the client CA,
/// the front proxy), and follows it.
async fn configmap_trust(
    trust: &Arc<ClientTrust>,
    args: &AuthArgs,
    config: &kube::Config,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let client_ca = args.client_ca_file.is_none();
    let request_header = args.requestheader_client_ca_file.is_none();
    if !(client_ca || request_header) {
        return Ok(None);
    }
    let applier = Arc::new(ConfigMapTrust::new(trust.clone(), client_ca, request_header));
    match applier.load(&review_client(config.clone())?).await {
        Ok(_) => {}
        Err(e) if args.authentication_tolerate_lookup_failure => {
            tracing::warn!(error = %e, "starting without the cluster's client CA and front-proxy configuration")
        }
        Err(e) => return Err(e),
    }
    Ok(Some(applier.spawn_watch(watch_client(config.clone())?, CONFIGMAP_WATCH_TIMEOUT, CONFIGMAP_RETRY)))
}

/// Trusts the client CA in `path`, and again whenever the file changes.
fn client_ca_from_file(trust: &Arc<ClientTrust>, path: PathBuf) -> Result<tokio::task::JoinHandle<()>> {
    trust.set_client_ca(Some(CaBundle::from_file(&path)?));
    let t = trust.clone();
    let p = path.clone();
    Ok(watch_files(vec![path], FILE_CHECK_INTERVAL, move || {
        t.set_client_ca(Some(CaBundle::from_file(&p)?));
        tracing::info!(path = %p.display(), "reloaded client CA");
        Ok(())
    }))
}

/// Trusts the front proxy's CA in `path` (with the request header flags), and again whenever the file changes.
fn front_proxy_from_file(
    trust: &Arc<ClientTrust>,
    args: &AuthArgs,
    path: &Path,
) -> Result<tokio::task::JoinHandle<()>> {
    let load = {
        let args = args.clone();
        let path = path.to_path_buf();
        move || -> Result<RequestHeaderConfig> {
            RequestHeaderConfig::new(
                CaBundle::from_file(&path)?,
                &args.requestheader_allowed_names,
                &args.requestheader_username_headers,
                &args.requestheader_uid_headers,
                &args.requestheader_group_headers,
                &args.requestheader_extra_headers_prefix,
            )
            .map_err(|e| Error::file(&path, e.to_string()))
        }
    };
    trust.set_request_header(Some(load()?));
    let t = trust.clone();
    let p = path.to_path_buf();
    Ok(watch_files(vec![path.to_path_buf()], FILE_CHECK_INTERVAL, move || {
        t.set_request_header(Some(load()?));
        tracing::info!(path = %p.display(), "reloaded front-proxy CA");
        Ok(())
    }))
}

/// Who decides authorization: everyone allowed, SubjectAccessReviews to the cluster (its kubeconfig flag, else
/// in-cluster), or, standalone, system:masters only.
async fn authorization_mode(args: &AuthArgs) -> Result<AuthorizationMode> {
    let path = match (args.authorization_mode, &args.authorization_kubeconfig, in_cluster()) {
        (AuthorizationModeArg::AlwaysAllow, _, _) => return Ok(AuthorizationMode::AlwaysAllow),
        (AuthorizationModeArg::Webhook, None, false) => return Ok(AuthorizationMode::MastersOnly),
        (AuthorizationModeArg::Webhook, path, _) => path.as_deref(),
    };
    let reviewer = SubjectAccessReviewer::new(review_client(kube_config(path).await?)?);
    Ok(AuthorizationMode::Delegated(Arc::new(reviewer)))
}

/// Calls `reload` whenever the content of `paths` changes (checked every `interval`). A failed reload (e.g. a new
/// certificate whose key is not written yet) keeps the previous state and is retried on the next check.
pub fn watch_files<F>(paths: Vec<PathBuf>, interval: Duration, reload: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Result<()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut applied = fingerprint(&paths);
        let mut reported: Option<[u8; 32]> = None;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = fingerprint(&paths);
            if now == applied {
                continue;
            }
            match reload() {
                Ok(()) => {
                    applied = now;
                    reported = None;
                }
                Err(e) if reported != Some(now) => {
                    tracing::warn!(error = %e, "changed file not loaded; keeping the current one");
                    reported = Some(now);
                }
                Err(_) => {}
            }
        }
    })
}

/// SHA-256 over the files' contents (a missing file counts as empty but distinct).
fn fingerprint(paths: &[PathBuf]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for path in paths {
        match std::fs::read(path) {
            Ok(content) => {
                hasher.update([1]);
                hasher.update((content.len() as u64).to_be_bytes());
                hasher.update(&content);
            }
            Err(_) => hasher.update([0]),
        }
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn file_watch_reloads_on_content_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "one").expect("write");
        let calls = Arc::new(AtomicUsize::new(0));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let calls = calls.clone();
            let fail = fail.clone();
            watch_files(vec![path.clone()], Duration::from_millis(20), move || {
                calls.fetch_add(1, Ordering::SeqCst);
                if fail.load(Ordering::SeqCst) {
                    Err(Error::Invalid("not yet".into()))
                } else {
                    Ok(())
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "unchanged: no reload");
        std::fs::write(&path, "two").expect("write");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // A failing reload is retried until it succeeds.
        fail.store(true, Ordering::SeqCst);
        std::fs::write(&path, "three").expect("write");
        tokio::time::sleep(Duration::from_millis(150)).await;
        let failed = calls.load(Ordering::SeqCst);
        assert!(failed >= 3, "{failed}");
        fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let done = calls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(calls.load(Ordering::SeqCst), done, "succeeded: no more reloads");
        task.abort();
    }
}

//! Delegation to kube-apiserver, as every aggregated API server does it:
//!
//! - [`TokenReviewAuthenticator`]: bearer tokens through `authentication.k8s.io/v1` TokenReview, answers cached;
//! - [`SubjectAccessReviewer`]: authorization through `authorization.k8s.io/v1` SubjectAccessReview (cached by
//!   [`crate::auth::authz::Authorizer`]);
//! - [`ConfigMapTrust`]: the client CA and front-proxy configuration that kube-apiserver publishes in the
//!   `kube-system/extension-apiserver-authentication` ConfigMap, read at start and then watched, so a rotated CA
//!   applies without a restart.
//!
//! The server's ServiceAccount needs the `system:auth-delegator` ClusterRole (TokenReview, SubjectAccessReview) and
//! the `extension-apiserver-authentication-reader` Role in kube-system (the ConfigMap); see `manifests/rbac.yaml`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use sha2::{Digest, Sha256};

use super::authn::{TokenAuthenticator, UserInfo};
use super::authz::{AccessReviewer, Decision};
use super::cache::TtlCache;
use super::trust::{
    CaBundle, ClientTrust, RequestHeaderConfig, DEFAULT_EXTRA_HEADERS_PREFIX, DEFAULT_GROUP_HEADER, DEFAULT_UID_HEADER,
    DEFAULT_USERNAME_HEADER,
};
use super::{Error, Result};

pub const AUTHENTICATION_CONFIGMAP_NAMESPACE: &str = "kube-system";
pub const AUTHENTICATION_CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

/// How long one review may take before the request fails (kube-apiserver's webhook clients use 30 s; the aggregator
/// gives up on us after 60 s, so keep well below).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether this process runs in a pod (the in-cluster config is available).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() && std::env::var_os("KUBERNETES_SERVICE_PORT").is_some()
}

/// A client configuration from `kubeconfig`, or the in-cluster one without it.
pub async fn kube_config(kubeconfig: Option<&Path>) -> Result<kube::Config> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| Error::file(path, e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::file(path, e.to_string()))?
        }
        None => kube::Config::incluster().map_err(|e| Error::Invalid(format!("in-cluster configuration: {e}")))?,
    };
    Ok(config)
}

/// A client for short requests (reviews, GET): every response within [`REVIEW_TIMEOUT`].
pub fn review_client(mut config: kube::Config) -> Result<kube::Client> {
    config.read_timeout = Some(REVIEW_TIMEOUT);
    config.reset_reader_on_write = true;
    kube::Client::try_from(config).map_err(|error| Error::Kube { what: "kube client", error })
}

/// A client for watches (no read timeout; the watch loop bounds each watch itself).
pub fn watch_client(mut config: kube::Config) -> Result<kube::Client> {
    config.read_timeout = None;
    kube::Client::try_from(config).map_err(|error| Error::Kube { what: "kube client", error })
}

/// Bound of the token cache.
const TOKEN_CACHE_CAPACITY: usize = 10_000;

/// Bearer tokens through TokenReview. Answers, valid and invalid, are cached for `ttl`, keyed by the token's
/// SHA-256 (the token itself is never kept); failed reviews are not cached.
#[derive(Debug)]
pub struct TokenReviewAuthenticator {
    api: Api<TokenReview>,
    cache: TtlCache<[u8; 32], Option<UserInfo>>,
    ttl: Duration,
}

impl TokenReviewAuthenticator {
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        TokenReviewAuthenticator { api: Api::all(client), cache: TtlCache::new(TOKEN_CACHE_CAPACITY), ttl }
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for TokenReviewAuthenticator {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(user) = self.cache.get(&key) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| Error::Kube { what: "TokenReview", error })?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) if u.username.as_deref().is_some_and(|n| !n.is_empty()) => Some(UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>(),
            }),
            _ => {
                if let Some(e) = status.error.filter(|e| !e.is_empty()) {
                    tracing::debug!(error = %e, "token review: not authenticated");
                }
                None
            }
        };
        self.cache.insert(key, user.clone(), self.ttl);
        Ok(user)
    }
}

/// Authorization through SubjectAccessReview.
#[derive(Debug)]
pub struct SubjectAccessReviewer {
    api: Api<SubjectAccessReview>,
}

impl SubjectAccessReviewer {
    pub fn new(client: kube::Client) -> Self {
        SubjectAccessReviewer { api: Api::all(client) }
    }
}

#[async_trait::async_trait]
impl AccessReviewer for SubjectAccessReviewer {
    async fn review(&self, spec: &SubjectAccessReviewSpec) -> Result<Decision> {
        let review = SubjectAccessReview { spec: spec.clone(), ..Default::default() };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| Error::Kube { what: "SubjectAccessReview", error })?;
        let status = answer.status.unwrap_or_default();
        if let Some(e) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(error = %e, "SubjectAccessReview evaluation error");
        }
        let reason = status.reason.unwrap_or_default();
        Ok(match (status.allowed, status.denied.unwrap_or(false)) {
            (true, false) => Decision::Allow,
            _ => Decision::Deny { reason },
        })
    }
}

/// The parts of the extension-apiserver-authentication ConfigMap.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuthenticationConfig {
    pub client_ca: Option<String>,
    pub request_header_ca: Option<String>,
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefixes: Vec<String>,
}

impl AuthenticationConfig {
    /// Reads the ConfigMap's data; list values are JSON arrays in strings, as kube-apiserver writes them. Missing
    /// header lists get kube-apiserver's conventional names.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self> {
        let pem = |key: &str| data.get(key).filter(|v| !v.trim().is_empty()).cloned();
        let list = |key: &str, default: &str| -> Result<Vec<String>> {
            match data.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()) {
                None => Ok(if default.is_empty() { Vec::new() } else { vec![default.to_string()] }),
                Some(v) => serde_json::from_str(v)
                    .map_err(|e| Error::Invalid(format!("{key}: expected a JSON array of strings: {e}"))),
            }
        };
        Ok(AuthenticationConfig {
            client_ca: pem("client-ca-file"),
            request_header_ca: pem("requestheader-client-ca-file"),
            allowed_names: list("requestheader-allowed-names", "")?,
            username_headers: list("requestheader-username-headers", DEFAULT_USERNAME_HEADER)?,
            uid_headers: list("requestheader-uid-headers", DEFAULT_UID_HEADER)?,
            group_headers: list("requestheader-group-headers", DEFAULT_GROUP_HEADER)?,
            extra_headers_prefixes: list("requestheader-extra-headers-prefix", DEFAULT_EXTRA_HEADERS_PREFIX)?,
        })
    }
}

/// Applies the ConfigMap to a [`ClientTrust`]: the client CA and/or the front-proxy configuration, whichever is not
/// configured by a flag (flags take precedence, as in k8s.io/apiserver). Unchanged parts are left alone; a part
/// that does not parse keeps the previous trust.
#[derive(Debug)]
pub struct ConfigMapTrust {
    trust: Arc<ClientTrust>,
    client_ca: bool,
    request_header: bool,
    last: Mutex<Option<AuthenticationConfig>>,
}

impl ConfigMapTrust {
    pub fn new(trust: Arc<ClientTrust>, client_ca: bool, request_header: bool) -> Self {
        ConfigMapTrust { trust, client_ca, request_header, last: Mutex::new(None) }
    }

    /// Applies one version of the ConfigMap. Errors name the part that was not applied.
    pub fn apply(&self, cm: &ConfigMap) -> Result<()> {
        let config = AuthenticationConfig::from_data(&cm.data.clone().unwrap_or_default())?;
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = last.clone().unwrap_or_default();
        let first = last.is_none();
        let mut errors = Vec::new();
        if self.client_ca && (first || previous.client_ca != config.client_ca) {
            match config.client_ca.as_deref().map(|pem| CaBundle::from_pem(pem.as_bytes())).transpose() {
                Ok(bundle) => {
                    tracing::info!(present = bundle.is_some(), "client CA loaded from {AUTHENTICATION_CONFIGMAP_NAME}");
                    self.trust.set_client_ca(bundle);
                }
                Err(e) => errors.push(format!("client-ca-file: {e}")),
            }
        }
        let rh_changed = previous.request_header_ca != config.request_header_ca
            || previous.allowed_names != config.allowed_names
            || previous.username_headers != config.username_headers
            || previous.uid_headers != config.uid_headers
            || previous.group_headers != config.group_headers
            || previous.extra_headers_prefixes != config.extra_headers_prefixes;
        if self.request_header && (first || rh_changed) {
            let built = config
                .request_header_ca
                .as_deref()
                .map(|pem| {
                    RequestHeaderConfig::new(
                        CaBundle::from_pem(pem.as_bytes())?,
                        &config.allowed_names,
                        &config.username_headers,
                        &config.uid_headers,
                        &config.group_headers,
                        &config.extra_headers_prefixes,
                    )
                })
                .transpose();
            match built {
                Ok(rh) => {
                    tracing::info!(
                        present = rh.is_some(),
                        allowed_names = ?config.allowed_names,
                        "front-proxy (request header) configuration loaded from {AUTHENTICATION_CONFIGMAP_NAME}"
                    );
                    self.trust.set_request_header(rh);
                }
                Err(e) => errors.push(format!("requestheader-client-ca-file: {e}")),
            }
        }
        if errors.is_empty() {
            *last = Some(config);
            Ok(())
        } else {
            Err(Error::Invalid(errors.join("; ")))
        }
    }

    /// Reads the ConfigMap once.
    pub async fn load(&self, client: &kube::Client) -> Result<Option<String>> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), AUTHENTICATION_CONFIGMAP_NAMESPACE);
        let cm = api.get(AUTHENTICATION_CONFIGMAP_NAME).await.map_err(|e| {
            Error::Invalid(format!(
                "reading ConfigMap {AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP_NAME}: {e}"
            ))
        })?;
        self.apply(&cm).map_err(|e| {
            Error::Invalid(format!(
                "ConfigMap {AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP_NAME}: {e}"
            ))
        })?;
        Ok(cm.metadata.resource_version)
    }

    /// Keeps the trust in step with the ConfigMap: GET, then watch from its resourceVersion, again and again. A
    /// watch lasts at most `watch_timeout` (the server ends it; a silent connection is abandoned a little later);
    /// errors are retried every `retry`.
    pub fn spawn_watch(
        self: Arc<Self>,
        client: kube::Client,
        watch_timeout: Duration,
        retry: Duration,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), AUTHENTICATION_CONFIGMAP_NAMESPACE);
            let timeout_secs = watch_timeout.as_secs().clamp(1, 290) as u32;
            let params = WatchParams::default()
                .fields(&format!("metadata.name={AUTHENTICATION_CONFIGMAP_NAME}"))
                .timeout(timeout_secs);
            loop {
                let rv = match self.load(&client).await {
                    Ok(rv) => rv.unwrap_or_default(),
                    Err(e) => {
                        tracing::warn!(error = %e, "keeping the current client trust");
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                };
                let stream = match api.watch(&params, &rv).await {
                    Ok(stream) => stream,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot watch {AUTHENTICATION_CONFIGMAP_NAME}; polling");
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                };
                let mut stream = std::pin::pin!(stream);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(u64::from(timeout_secs) + 15);
                while let Ok(Some(event)) = tokio::time::timeout_at(deadline, stream.next()).await {
                    match event {
                        Ok(WatchEvent::Added(cm)) | Ok(WatchEvent::Modified(cm)) => {
                            if let Err(e) = self.apply(&cm) {
                                tracing::warn!(error = %e, "ConfigMap {AUTHENTICATION_CONFIGMAP_NAME}: keeping the current client trust");
                            }
                        }
                        Ok(WatchEvent::Deleted(_)) => {
                            tracing::warn!(
                                "ConfigMap {AUTHENTICATION_CONFIGMAP_NAME} deleted; keeping the current client trust"
                            );
                        }
                        Ok(WatchEvent::Bookmark(_)) => {}
                        Ok(WatchEvent::Error(e)) => {
                            tracing::debug!(error = %e, "watch of {AUTHENTICATION_CONFIGMAP_NAME} ended");
                            break;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "watch of {AUTHENTICATION_CONFIGMAP_NAME} failed");
                            tokio::time::sleep(retry).await;
                            break;
                        }
                    }
                }
                // Never a tight loop, even against a server that ends every watch at once.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::certs::{issue_client_cert, CertAuthority};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn configmap_format() {
        let c = AuthenticationConfig::from_data(&data(&[
            ("client-ca-file", "PEM1"),
            ("requestheader-client-ca-file", "PEM2"),
            ("requestheader-allowed-names", "[\"front-proxy-client\"]"),
            ("requestheader-username-headers", "[\"X-Remote-User\"]"),
            ("requestheader-group-headers", "[\"X-Remote-Group\"]"),
            ("requestheader-extra-headers-prefix", "[\"X-Remote-Extra-\"]"),
        ]))
        .expect("parse");
        assert_eq!(c.client_ca.as_deref(), Some("PEM1"));
        assert_eq!(c.request_header_ca.as_deref(), Some("PEM2"));
        assert_eq!(c.allowed_names, ["front-proxy-client"]);
        assert_eq!(c.uid_headers, ["X-Remote-Uid"], "default");
        let empty = AuthenticationConfig::from_data(&BTreeMap::new()).expect("parse");
        assert_eq!((empty.client_ca, empty.request_header_ca), (None, None));
        assert!(empty.allowed_names.is_empty());
        assert!(
            AuthenticationConfig::from_data(&data(&[("requestheader-allowed-names", "front-proxy-client")])).is_err()
        );
    }

    #[test]
    fn applies_only_its_parts_and_only_changes() {
        let client_ca = CertAuthority::generate("client-ca").expect("ca");
        let proxy_ca = CertAuthority::generate("front-proxy-ca").expect("ca");
        let proxy = vec![CertificateDer::from_pem_slice(
            issue_client_cert::<&str>(&proxy_ca, "front-proxy-client", &[]).expect("issue").0.as_bytes(),
        )
        .expect("pem")];
        let cm = |client: &str, rh: &str| ConfigMap {
            data: Some(data(&[
                ("client-ca-file", client),
                ("requestheader-client-ca-file", rh),
                ("requestheader-allowed-names", "[\"front-proxy-client\"]"),
            ])),
            ..Default::default()
        };
        let trust = Arc::new(ClientTrust::new());
        let applier = ConfigMapTrust::new(trust.clone(), false, true);
        applier.apply(&cm(client_ca.cert_pem(), proxy_ca.cert_pem())).expect("apply");
        let state = trust.current();
        assert!(state.client_ca.is_none(), "the client CA comes from a flag");
        assert!(trust.verify(&proxy).by_request_header_ca);
        // The same content again changes nothing (no new generation).
        applier.apply(&cm(client_ca.cert_pem(), proxy_ca.cert_pem())).expect("apply");
        assert_eq!(trust.current().generation, state.generation);
        // A broken CA keeps the previous trust.
        assert!(applier.apply(&cm(client_ca.cert_pem(), "garbage")).is_err());
        assert!(trust.verify(&proxy).by_request_header_ca);
        // A rotated CA replaces it.
        let rotated = CertAuthority::generate("front-proxy-ca-2").expect("ca");
        applier.apply(&cm(client_ca.cert_pem(), rotated.cert_pem())).expect("apply");
        assert!(!trust.verify(&proxy).by_request_header_ca);
    }
}

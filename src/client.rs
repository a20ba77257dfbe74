//! The clients of this server's own API that the scheduler and the server share: the in-process client, whose
//! requests carry the scheduler's identity as an extension no network client can set, and the reason of a client's
//! API error.

use crate::auth::authn::UserInfo;

/// The identity of the scheduler's requests to this server itself (in-process, so it cannot be forged over the
/// network: the authentication middleware trusts this extension only because no client can set extensions).
#[derive(Clone, Debug)]
pub struct InternalIdentity(pub UserInfo);

impl InternalIdentity {
    pub fn scheduler() -> Self {
        InternalIdentity(UserInfo {
            name: "system:migration-apiserver:scheduler".into(),
            uid: String::new(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            extra: Default::default(),
        })
    }
}

/// A Kubernetes client whose transport is this server's own router: the self-target, without TLS or sockets, and
/// through the full API layer (authentication, validation, admission of our own writes).
pub fn in_process_client(app: axum::Router) -> kube::Client {
    let identity = InternalIdentity::scheduler();
    let service = tower::ServiceBuilder::new()
        .map_request(move |mut req: axum::http::Request<kube::client::Body>| {
            req.extensions_mut().insert(identity.clone());
            req.map(axum::body::Body::new)
        })
        .service(app);
    kube::Client::new(service, "default")
}

/// The reason of a client's API error ([`crate::error::StatusReason::of_answer`]); `None` for errors without an answer.
pub fn api_reason(e: &kube::Error) -> Option<crate::error::StatusReason> {
    match e {
        kube::Error::Api(s) => crate::error::StatusReason::of_answer(&s.reason, s.code),
        _ => None,
    }
}

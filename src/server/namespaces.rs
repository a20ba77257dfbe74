//! What a standalone server does around its namespaces (the kind: `crate::api::namespace`), as kube-apiserver does
//! with the `NamespaceAutoProvision` admission plugin and its namespace controller:
//!
//! - a create in a namespace that does not exist creates the namespace first, so that kubectl's lookup of it
//!   (`GET /api/v1/namespaces/<ns>` after a namespaced object was not found) finds every namespace in use, and
//!   kubectl reports the object, not the namespace, as missing;
//! - deleting a namespace deletes what is in it, a few seconds later (kube-apiserver's namespace controller does it
//!   in the background while the namespace is Terminating; with no controller running, the server does it
//!   itself, and the namespace goes at once);
//! - namespaces holding objects stored before namespaces were served are created when namespaces are first asked
//!   for.
//!
//! Without the namespace kind (behind kube-apiserver's aggregator, where namespaces are kube-apiserver's) all of
//! this does nothing.

use super::AppState;
use crate::api::namespace::provisioned;
use crate::error::{ApiResult, StatusReason};
use crate::registry::{DeleteOptions, ListParams, Resource, WriteOptions};
use crate::storage::{ListOptions, StorageError};
use axum::http::{header, HeaderMap, Method};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

const VERSION: &str = "v1";

/// The namespace resource, when this server serves it.
fn served(st: &AppState) -> Option<&Arc<Resource>> {
    st.registry.resource("", VERSION, "namespaces")
}

/// Before a request reaches `res`: on a write that may create an object in `namespace` (POST; PUT and server-side
/// apply create what does not exist), the namespace is created if it does not exist, except on dry run, as
/// `NamespaceAutoProvision` does; before anything is done with the namespaces themselves, those in use are made to
/// exist (once).
pub(crate) async fn before(
    st: &AppState,
    res: &Arc<Resource>,
    method: &Method,
    headers: &HeaderMap,
    namespace: Option<&str>,
    dry_run: bool,
) -> ApiResult<()> {
    let Some(namespaces) = served(st) else { return Ok(()) };
    if Arc::ptr_eq(res, namespaces) {
        return st.namespaces_in_use.get_or_try_init(|| provision_in_use(st, namespaces)).await.map(|_| ());
    }
    let apply = || {
        let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        content_type.trim_start().to_ascii_lowercase().starts_with("application/apply-patch")
    };
    let may_create = method == Method::POST || method == Method::PUT || (method == Method::PATCH && apply());
    match namespace {
        Some(ns) if may_create && !dry_run => provision(namespaces, ns).await,
        _ => Ok(()),
    }
}

/// Creates namespace `name` unless it exists (a concurrent create of it is as good).
async fn provision(namespaces: &Resource, name: &str) -> ApiResult<()> {
    match namespaces.get(None, name, VERSION).await {
        Err(e) if e.reason == StatusReason::NotFound => {}
        other => return other.map(|_| ()),
    }
    match namespaces.create(None, VERSION, provisioned(name), &[], &WriteOptions::default()).await {
        Err(e) if e.reason != StatusReason::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Creates the namespace of every stored namespaced object that has none.
async fn provision_in_use(st: &AppState, namespaces: &Resource) -> ApiResult<()> {
    for res in st.registry.resources.iter().filter(|r| r.strategy.info().namespaced) {
        for ns in namespaces_under(st, &res.prefix(None)).await? {
            provision(namespaces, &ns).await?;
        }
    }
    Ok(())
}

/// The namespaces of the keys `<prefix><namespace>/<name>`, reading one key per namespace: after a key of namespace
/// `ns`, the next read starts after `<prefix><ns>0`, past every `<prefix><ns>/...` ('0' follows '/').
async fn namespaces_under(st: &AppState, prefix: &str) -> ApiResult<Vec<String>> {
    let mut found = Vec::new();
    let mut start_after = None;
    loop {
        let opts = ListOptions { start_after: start_after.take(), limit: 1, revision: None, ..Default::default() };
        let key = match st.registry.storage.list(prefix, opts).await {
            Ok(page) => page.items.into_iter().next().map(|kv| kv.key),
            // A value that cannot be read still names its namespace.
            Err(StorageError::Corrupt(values)) => values.into_iter().next().map(|v| v.key),
            Err(e) => return Err(e.into()),
        };
        let Some(ns) = key.as_deref().and_then(|k| k.strip_prefix(prefix)).and_then(|k| k.split_once('/')) else {
            return Ok(found);
        };
        start_after = Some(format!("{prefix}{}0", ns.0));
        found.push(ns.0.to_string());
    }
}

/// How long after a namespace goes its contents are deleted. kube-apiserver's namespace controller deletes them in
/// the background, after its own discovery and listing; `kubectl delete -f` of a file holding a namespace and what is
/// in it deletes the namespace first and then each object, which must still be there to be deleted without error.
const CONTENT_DELETION_DELAY: Duration = Duration::from_secs(5);

/// After a DELETE of namespaces (`deleted`: what the delete answered, one object or a list's items): what was in
/// each is deleted a little later, as kube-apiserver's namespace controller deletes it, unless the namespace exists
/// again by then (created anew, or by a create in it). Nothing on dry run.
pub(crate) fn deleted(st: &AppState, res: &Arc<Resource>, deleted: &[Value], opts: &DeleteOptions) {
    let Some(namespaces) = served(st) else { return };
    if opts.dry_run || !Arc::ptr_eq(res, namespaces) {
        return;
    }
    let contents: Vec<Arc<Resource>> = st
        .registry
        .resources
        .iter()
        .filter(|r| r.strategy.info().namespaced && !r.strategy.info().create_only)
        .cloned()
        .collect();
    for ns in deleted.iter().filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str)) {
        let (ns, namespaces, contents) = (ns.to_string(), namespaces.clone(), contents.clone());
        tokio::spawn(async move {
            tokio::time::sleep(CONTENT_DELETION_DELAY).await;
            if let Err(e) = delete_contents(&namespaces, &contents, &ns).await {
                tracing::warn!(namespace = %ns, error = %e, "deleting the contents of a deleted namespace");
            }
        });
    }
}

async fn delete_contents(namespaces: &Resource, contents: &[Arc<Resource>], ns: &str) -> ApiResult<()> {
    match namespaces.get(None, ns, VERSION).await {
        Err(e) if e.reason == StatusReason::NotFound => {}
        other => return other.map(|_| ()),
    }
    for r in contents {
        let version = r.strategy.storage_version().to_string();
        r.delete_collection(Some(ns), &version, &ListParams::default(), &DeleteOptions::default()).await?;
    }
    Ok(())
}

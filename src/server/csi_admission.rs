//! CSI migration admission webhooks for PersistentVolumes and PersistentVolumeClaims, on the API's own TLS server
//! (behind its authentication, like `/mutate` and `/validate`):
//!
//! - `POST /mutate-csi-migration` keeps the `pv.kubernetes.io/migrated-to` annotation as Kubernetes' PV controller
//!   does ([`crate::csi::annotations`]): set to the CSI driver when the object's in-tree plugin is migrated by the
//!   feature gates, removed when it is not. The JSON Patch touches only that annotation — never the volume source —
//!   and is empty when the annotation is already right, so a reinvocation changes nothing.
//! - `POST /validate-csi-migration` rejects a new PersistentVolume with the in-tree source of a migrated plugin when
//!   the cluster has no CSIDriver of that plugin's driver: volume operations would go to a driver that is not
//!   there. Without a cluster client (no `--kubeconfig`, not in a pod) the check is skipped with a warning; when the
//!   cluster cannot be asked, the PV is admitted with a warning (the check is advisory, not a safety net).
//!
//! Reviews are parsed and answered with the AdmissionReview handling of [`super::admission_review`].

use super::admission_review::{parse_review, review_body, AdmissionRequest, Answer};
use super::AppState;
use crate::csi::annotations::{self, MigrationAnnotation, ANN_MIGRATED_TO};
use crate::csi::gates::FeatureGates;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine;
use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long an installed CSIDriver is remembered (drivers are rarely uninstalled; PVs are created in bursts).
const DRIVER_CACHE_TTL: Duration = Duration::from_secs(30);
/// Time for one CSIDriver lookup, well inside the webhook's 10 s.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the cluster could not say whether a CSI driver is installed.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no answer from the cluster in {}s", .0.as_secs())]
    Timeout(Duration),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Whether a CSI driver is installed in the cluster.
#[async_trait::async_trait]
pub trait CsiDriverLookup: Send + Sync {
    /// Ok(true) when a CSIDriver named `name` exists.
    async fn installed(&self, name: &str) -> Result<bool, LookupError>;
}

/// A review admitted without a decision, and the warning that says why: a kind the webhook does not handle, or an
/// object it cannot read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unchecked(String);

/// How many installed CSIDrivers are remembered (a cluster has a handful).
const DRIVER_CACHE_CAPACITY: u64 = 1024;

/// CSIDriver objects (storage.k8s.io/v1) read through the cluster client, installed ones cached briefly.
pub struct ClusterCsiDrivers {
    client: kube::Client,
    installed: moka::sync::Cache<String, ()>,
}

impl ClusterCsiDrivers {
    pub fn new(client: kube::Client) -> Self {
        let installed =
            moka::sync::Cache::builder().max_capacity(DRIVER_CACHE_CAPACITY).time_to_live(DRIVER_CACHE_TTL).build();
        ClusterCsiDrivers { client, installed }
    }
}

#[async_trait::async_trait]
impl CsiDriverLookup for ClusterCsiDrivers {
    async fn installed(&self, name: &str) -> Result<bool, LookupError> {
        if self.installed.contains_key(name) {
            return Ok(true);
        }
        let api: kube::Api<k8s_openapi::api::storage::v1::CSIDriver> = kube::Api::all(self.client.clone());
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|_| LookupError::Timeout(LOOKUP_TIMEOUT))??
            .is_some();
        if found {
            self.installed.insert(name.to_string(), ());
        }
        Ok(found)
    }
}

/// The CSI migration configuration of the server: the feature gates and, in a cluster, the CSIDriver lookup.
#[derive(Default)]
pub struct CsiMigration {
    pub gates: FeatureGates,
    drivers: Option<Arc<dyn CsiDriverLookup>>,
}

impl CsiMigration {
    pub fn new(gates: FeatureGates, drivers: Option<Arc<dyn CsiDriverLookup>>) -> Self {
        CsiMigration { gates, drivers }
    }
}

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/mutate-csi-migration", post(mutate)).route("/validate-csi-migration", post(validate))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Volume,
    Claim,
}

/// A PV or PVC review, by `request.kind` (else `request.resource`); Err(warning) for anything else.
fn target(req: &AdmissionRequest) -> Result<Target, Unchecked> {
    let by_kind = req.kind.as_ref().filter(|k| !k.kind.is_empty()).map(|k| (k.group.as_str(), k.kind.as_str()));
    let by_resource =
        req.resource.as_ref().filter(|r| !r.resource.is_empty()).map(|r| (r.group.as_str(), r.resource.as_str()));
    match (by_kind, by_resource) {
        (Some(("", "PersistentVolume")), _) | (None, Some(("", "persistentvolumes"))) => Ok(Target::Volume),
        (Some(("", "PersistentVolumeClaim")), _) | (None, Some(("", "persistentvolumeclaims"))) => Ok(Target::Claim),
        (k, r) => Err(Unchecked(format!(
            "the CSI migration webhook of migration-apiserver handles PersistentVolumes and PersistentVolumeClaims, \
             not {}: admitted unchanged (check the rules of the webhook configuration)",
            k.or(r).map(|(g, n)| if g.is_empty() { n.to_string() } else { format!("{n}.{g}") }).unwrap_or_default()
        ))),
    }
}

/// The object of a CREATE or UPDATE of the main resource; None for what there is nothing to do about.
fn written_object(req: &AdmissionRequest) -> Option<&Value> {
    let main = req.sub_resource.is_empty();
    match req.operation.as_str() {
        "CREATE" | "UPDATE" if main => req.object.as_ref(),
        _ => None,
    }
}

fn string_map(v: Option<&Value>) -> Option<BTreeMap<String, String>> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
}

/// The JSON Patch that carries out `plan` on `object`: operations on `metadata.annotations` only.
pub fn annotation_patch(plan: MigrationAnnotation, object: &Value) -> Vec<Value> {
    let key = ANN_MIGRATED_TO.replace('~', "~0").replace('/', "~1");
    match plan {
        MigrationAnnotation::Unchanged => vec![],
        MigrationAnnotation::Remove => vec![json!({"op": "remove", "path": format!("/metadata/annotations/{key}")})],
        MigrationAnnotation::Set(driver) => {
            if object.pointer("/metadata/annotations").is_some_and(Value::is_object) {
                vec![json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": driver})]
            } else if object.get("metadata").is_some_and(Value::is_object) {
                vec![json!({"op": "add", "path": "/metadata/annotations", "value": {ANN_MIGRATED_TO: driver}})]
            } else {
                vec![json!({"op": "add", "path": "/metadata", "value": {"annotations": {ANN_MIGRATED_TO: driver}}})]
            }
        }
    }
}

fn decode_volume(object: &Value) -> Result<PersistentVolume, Unchecked> {
    serde_json::from_value(object.clone())
        .map_err(|e| Unchecked(format!("the PersistentVolume cannot be read ({e}): admitted unchanged")))
}

/// The mutating decision.
fn mutation(gates: &FeatureGates, req: &AdmissionRequest) -> Answer {
    let Some(object) = written_object(req) else { return Answer::allow(vec![]) };
    let plan = match target(req) {
        Err(warning) => return Answer::allow(vec![warning.to_string()]),
        Ok(Target::Claim) => {
            annotations::for_claim(string_map(object.pointer("/metadata/annotations")).as_ref(), gates)
        }
        Ok(Target::Volume) => match decode_volume(object) {
            Ok(pv) => annotations::for_volume(&pv, gates),
            Err(warning) => return Answer::allow(vec![warning.to_string()]),
        },
    };
    let ops = annotation_patch(plan, object);
    if ops.is_empty() {
        return Answer::allow(vec![]);
    }
    match serde_json::to_vec(&ops) {
        Ok(bytes) => Answer {
            allowed: true,
            patch: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            ..Default::default()
        },
        Err(e) => Answer::deny(&ApiError::internal(format!("encoding the patch: {e}"))),
    }
}

/// The validating decision.
async fn validation(csi: &CsiMigration, req: &AdmissionRequest) -> Answer {
    let object = match (req.operation.as_str(), written_object(req), target(req)) {
        ("CREATE", Some(o), Ok(Target::Volume)) => o,
        (_, _, Err(warning)) => return Answer::allow(vec![warning.to_string()]),
        _ => return Answer::allow(vec![]),
    };
    let pv = match decode_volume(object) {
        Ok(pv) => pv,
        Err(warning) => return Answer::allow(vec![warning.to_string()]),
    };
    let Ok(plugin) = crate::csi::in_tree_plugin_name_from_spec(Some(&pv), None) else {
        return Answer::allow(vec![]);
    };
    if !csi.gates.is_migration_enabled_for_plugin(plugin) {
        return Answer::allow(vec![]);
    }
    let (Ok(driver), Some(p)) =
        (crate::csi::csi_name_from_in_tree_name(plugin), crate::csi::plugin_by_in_tree_name(plugin))
    else {
        return Answer::allow(vec![]);
    };
    let Some(lookup) = &csi.drivers else {
        return Answer::allow(vec![format!(
            "CSIDriver {driver} (the migrated plugin {plugin}) was not checked: migration-apiserver has no cluster \
             client (--kubeconfig or the in-cluster config)"
        )]);
    };
    match lookup.installed(driver).await {
        Ok(true) => Answer::allow(vec![]),
        Ok(false) => {
            let name = pv.metadata.name.as_deref().unwrap_or(&req.name);
            let gate = p.feature_gate();
            Answer::deny(&ApiError::forbidden(format!(
                "PersistentVolume {name:?} uses the in-tree plugin {plugin}, which is migrated to CSI (feature gate \
                 {gate}), but its CSI driver {driver} is not installed: the cluster has no CSIDriver {driver:?}. \
                 Install the driver, or turn the migration off with --feature-gates={gate}=false"
            )))
        }
        Err(e) => {
            tracing::warn!(driver, error = %e, "CSIDriver lookup failed; PersistentVolume admitted");
            Answer::allow(vec![format!("CSIDriver {driver} could not be checked: {e}")])
        }
    }
}

fn answer(req: &AdmissionRequest, answer: Answer, webhook: &'static str) -> Response {
    tracing::debug!(
        uid = %req.uid,
        operation = %req.operation,
        name = %req.name,
        namespace = %req.namespace,
        webhook,
        allowed = answer.allowed,
        patched = answer.patch.is_some(),
        "csi migration admission review"
    );
    answer.into_response(&req.uid)
}

async fn mutate(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let raw = match review_body(req).await {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    match parse_review(&raw) {
        Ok(req) => answer(&req, mutation(&st.csi_migration.gates, &req), "mutate-csi-migration"),
        Err(e) => e.into_response(),
    }
}

async fn validate(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let raw = match review_body(req).await {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    match parse_review(&raw) {
        Ok(req) => {
            let a = validation(&st.csi_migration, &req).await;
            answer(&req, a, "validate-csi-migration")
        }
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Drivers(&'static [&'static str]);

    #[async_trait::async_trait]
    impl CsiDriverLookup for Drivers {
        async fn installed(&self, name: &str) -> Result<bool, LookupError> {
            Ok(self.0.contains(&name))
        }
    }

    /// The request of a review of `object`.
    fn request(object: Value) -> AdmissionRequest {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "operation": "CREATE", "object": object, "name": "pv1",
            "kind": {"group": "", "version": "v1", "kind": "PersistentVolume"},
        }});
        parse_review(&serde_json::to_vec(&review).unwrap()).unwrap()
    }

    fn gce_pv() -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
               "spec": {"gcePersistentDisk": {"pdName": "d"}}})
    }

    #[tokio::test]
    async fn csi_driver_check() {
        let gates: FeatureGates = "CSIMigrationGCE=true".parse().unwrap();
        let with = |d: &'static [&'static str]| CsiMigration::new(gates.clone(), Some(Arc::new(Drivers(d))));
        let a = validation(&with(&["pd.csi.storage.gke.io"]), &request(gce_pv())).await;
        assert!(a.allowed && a.warnings.is_empty());
        let a = validation(&with(&[]), &request(gce_pv())).await;
        assert!(!a.allowed);
        let status = a.status.unwrap();
        assert_eq!(status["code"], 403);
        let msg = status["message"].as_str().unwrap();
        assert!(msg.contains("kubernetes.io/gce-pd") && msg.contains("CSIMigrationGCE"), "{msg}");
        assert!(msg.contains("no CSIDriver \"pd.csi.storage.gke.io\""), "{msg}");
        // Gate off: nothing to check.
        let off = CsiMigration::new(FeatureGates::default(), Some(Arc::new(Drivers(&[]))));
        assert!(validation(&off, &request(gce_pv())).await.allowed);
        // No cluster: allowed with a warning.
        let a = validation(&CsiMigration::new(gates.clone(), None), &request(gce_pv())).await;
        assert!(a.allowed && a.warnings[0].contains("not checked"), "{:?}", a.warnings);
    }

    #[test]
    fn patches_touch_only_the_annotation() {
        let set = MigrationAnnotation::Set("d");
        assert_eq!(
            annotation_patch(set, &json!({"metadata": {"annotations": {"a": "b"}}})),
            [json!({"op": "add", "path": "/metadata/annotations/pv.kubernetes.io~1migrated-to", "value": "d"})]
        );
        assert_eq!(
            annotation_patch(set, &json!({"metadata": {"name": "x"}})),
            [json!({"op": "add", "path": "/metadata/annotations", "value": {"pv.kubernetes.io/migrated-to": "d"}})]
        );
        assert_eq!(
            annotation_patch(MigrationAnnotation::Remove, &json!({})),
            [json!({"op": "remove", "path": "/metadata/annotations/pv.kubernetes.io~1migrated-to"})]
        );
    }
}

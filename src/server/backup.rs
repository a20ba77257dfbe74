//! `POST /storage/snapshots`: a snapshot of the embedded store, on demand, while serving. A non-resource path,
//! authorized as `/metrics` is (verb `post`: system:masters standalone, a SubjectAccessReview when delegated).

use super::AppState;
use crate::error::{ApiError, StatusReason};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// 201 with the snapshot's name, revision, size and checksum (and objects, created), as `kubectl create --raw`
/// prints it.
pub(super) async fn take_snapshot(State(st): State<Arc<AppState>>) -> Response {
    let Some(backups) = st.backups.get() else {
        // On etcd the path exists but this method has nothing to act on: kube-apiserver answers a verb that a
        // storage does not implement (a POST where there is no Creater) with 405 MethodNotAllowed, not 501, which
        // has no StatusReason.
        return ApiError::new(
            StatusReason::MethodNotAllowed,
            "snapshots are taken of the embedded store only; this server stores in etcd: use etcd's own snapshots (etcdctl snapshot save)",
        )
        .into_response();
    };
    match backups.take("on-demand").await {
        Ok(info) => {
            // A line of JSON, ended as kube-apiserver's encoder ends its bodies: `kubectl create --raw` prints it as is.
            let mut body = serde_json::to_vec(&info).unwrap_or_default();
            body.push(b'\n');
            (StatusCode::CREATED, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => ApiError::internal(format!("the snapshot failed: {e}")).into_response(),
    }
}
